"""Generation backends: turn a batch of token contexts into one model turn each.

A backend (`Backend`) does three things for the rollout engine and the trainer:
- `generate(contexts, max_new_tokens, sampling, keys)`: the new tokens of one turn per
  context, stopping each row at `</search>`, `</answer>` or EOS; a row may come back as a
  `Generated` list that also holds each token's behaviour log-probability. `keys` name
  the episodes: a backend may keep an episode's KV cache between its turns and then only
  has to prefill what was appended since (the `<information>` block);
- `reset()`: forget cached episodes (the engine calls it when a rollout ends);
- `sync_weights(policy, version)`: make generation use the policy's current weights (the
  trainer calls it before every rollout; a no-op where the backend runs the policy itself);
- `sleep()`: free the engine's memory while the trainer updates (vLLM's sleep mode).
`HFBackend` (seekrl's own decoding loop) and `agent/vllm_backend.VLLMBackend` implement it.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from seekrl.agent.protocol import STOP_STRINGS


@dataclass(frozen=True)
class Sampling:
    greedy: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()     # stop strings beyond the backend's own (a tool's closing tag)


class Generated(list):
    """One turn's new token ids (a plain list of ints) and `logprobs`: the log-probability
    of each under the distribution it was sampled from (temperature and top-p applied), as
    the rollout engine computed it, or None where the backend reports none (greedy decoding,
    scripted backends). The trainer compares them with its own log-probabilities of the same
    tokens (the rollout / training mismatch) and can correct for the gap."""

    def __init__(self, tokens=(), logprobs: list[float] | None = None):
        super().__init__(tokens)
        self.logprobs = logprobs

    def cut(self, n: int) -> "Generated":
        return Generated(self[:n], None if self.logprobs is None else self.logprobs[:n])


class Backend:
    """What a generation backend offers (see the module's docstring); `reset`,
    `sync_weights` and `sleep` do nothing unless a backend needs them. A backend may also
    offer rows for continuous batching (`open`, `admit`, `run`, `release`, as
    `StaticBackend` does): the engine plays on them under `rollout.continuous`."""

    def generate(self, contexts: list[list[int]], max_new_tokens: int, sampling: Sampling,
                 keys: Sequence[Hashable] | None = None) -> list[list[int]]:
        raise NotImplementedError

    def reset(self) -> None:
        """Forget cached episodes."""

    def sync_weights(self, policy, version: int | None = None) -> None:
        """Generate with `policy`'s current weights from now on (waking a sleeping engine)."""

    def sleep(self) -> None:
        """Free generation memory until the next `sync_weights` (the trainer calls it before
        each update)."""



class _Batch:
    """KV cache rows kept between turns: which episode each row holds, the tokens it has
    seen, its attention mask over the cache columns, and its next position id."""

    def __init__(self, cache, keys: list, seen: list[list[int]], mask: torch.Tensor,
                 next_pos: torch.Tensor):
        self.cache, self.keys, self.seen, self.mask, self.next_pos = \
            cache, keys, seen, mask, next_pos

    def select(self, rows: list[int], *, room: int = 0, extra: int = 0) -> "_Batch":
        """A new batch of the given rows, then `extra` empty rows (masked zero columns, no
        tokens yet), using this batch up (see `split`). With `room`, each layer's copy is
        made with that many spare columns, so the next `room` positions are written in
        place (one allocation for a whole turn's prefill and decoding, instead of a copy
        now and another when the cache first grows)."""
        return self.split([(rows, room, extra)])[0]

    def split(self, picks: Sequence[tuple[list[int], int, int]]) -> list["_Batch"]:
        """Several selections at once, each (rows, room, extra) as in `select`, that use
        this batch up: layer by layer, its keys and values are copied into every pick and
        then freed, so the cache never exists twice whole (one layer does). Copying all of
        it first and dropping it after held two caches at once: the peak of a greedy
        evaluation was 2 x its KV cache plus the weights."""
        dev = self.mask.device
        idxs = [torch.tensor(rows, dtype=torch.long, device=dev) for rows, _, _ in picks]
        source = _layers(self.cache)
        out_layers = [[copy.copy(layer) for layer in source] for _ in picks]
        for n, layer in enumerate(source):
            if getattr(layer, "is_initialized", True) and layer.keys is not None \
                    and layer.keys.numel():
                for name, buf_name in (("keys", "_buf_k"), ("values", "_buf_v")):
                    t = getattr(layer, name)
                    _, h, cols, d = t.shape
                    for (rows, room, extra), idx, layers in zip(picks, idxs, out_layers):
                        buf = t.new_empty((len(rows) + extra, h, cols + room, d))
                        buf[:len(rows), :, :cols] = t.index_select(0, idx)
                        buf[len(rows):, :, :cols].zero_()   # never attended, but finite
                        setattr(layers[n], name, buf[:, :, :cols])
                        setattr(layers[n], buf_name, buf if room else None)
                layer.keys = layer.values = None   # this layer is copied: free it now
            else:
                for layers in out_layers:
                    _drop_spare(layers[n])
            _drop_spare(layer)
        counts: dict[int, int] = {}
        for rows, _, _ in picks:
            for r in rows:
                counts[r] = counts.get(r, 0) + 1
        out = []
        for (rows, _, extra), idx, layers in zip(picks, idxs, out_layers):
            cache = copy.copy(self.cache)
            cache.layers = layers
            mask, next_pos = self.mask[idx], self.next_pos[idx]
            if extra:
                mask = torch.cat([mask, mask.new_zeros((extra, mask.shape[1]))])
                next_pos = torch.cat([next_pos, next_pos.new_zeros(extra)])
            # a row picked more than once gets its own list of tokens
            seen = [self.seen[r] if counts[r] == 1 else list(self.seen[r]) for r in rows]
            out.append(_Batch(cache, [self.keys[r] for r in rows] + [None] * extra,
                              seen + [[] for _ in range(extra)], mask, next_pos))
        return out


@functools.cache
def _growing_layer_class():
    """A DynamicLayer that grows into spare capacity instead of concatenating.

    transformers' DynamicLayer does `torch.cat([keys, new])` on every decode step, copying
    the whole cache each time: with 30 episodes of 700 tokens that is ~1 GB per step on
    CPU. This one keeps a buffer with room to spare and writes new positions in place.
    `spare` is the room added when a buffer is (re)allocated: the backend sets it to the
    turn's token budget, so one allocation at prefill holds the whole turn's decoding.

    `store` is the dtype keys and values are kept in (None: as they come). Under a
    bf16-mixed policy the backend sets bfloat16: the values come out of autocast's
    projection in bfloat16 but the keys out of the rotary embedding in float32 (its cos/sin
    are float32); autocast's attention casts them to bfloat16 before it reads them, so
    keeping them in bfloat16 changes no number and cuts the cache by a third (35 -> 23 KB
    a token for the 135M model; float32 throughout is 46)."""
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        _buf_k: torch.Tensor | None = None
        _buf_v: torch.Tensor | None = None
        spare: int = 64
        store: torch.dtype | None = None

        def update(self, key_states, value_states, *args, **kwargs):
            if self.store is not None:
                key_states, value_states = key_states.to(self.store), value_states.to(self.store)
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            cur = self.keys.shape[-2] if self.keys.numel() else 0
            need = cur + key_states.shape[-2]
            buf = self._buf_k
            fits = (buf is not None and self.keys.numel() and buf.shape[-2] >= need
                    and buf.shape[:2] == key_states.shape[:2]
                    and self.keys.data_ptr() == buf.data_ptr())
            if not fits:  # first use, or the rows / columns were changed from outside
                b, h, _, d = key_states.shape
                room = need + max(1, self.spare)   # columns past `need` are never read
                self._buf_k = key_states.new_empty((b, h, room, d))
                self._buf_v = value_states.new_empty((b, h, room, d))
                if cur:
                    self._buf_k[:, :, :cur] = self.keys
                    self._buf_v[:, :, :cur] = self.values
            self._buf_k[:, :, cur:need] = key_states
            self._buf_v[:, :, cur:need] = value_states
            self.keys = self._buf_k[:, :, :need]
            self.values = self._buf_v[:, :, :need]
            return self.keys, self.values

    return GrowingLayer


def _drop_spare(layer) -> None:
    """Forget a layer's spare-capacity buffer once its keys / values were replaced from
    outside. A shallow copy of the layer (or a layer whose rows were merged, extended or
    trimmed) would otherwise keep the old batch's whole buffer alive: parked row sets and
    the cache kept between turns would each hold a stale full-size buffer, and memory would
    grow with every turn."""
    if getattr(layer, "_buf_k", None) is not None:
        layer._buf_k = None
        layer._buf_v = None


def _new_cache():
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.layer_class_to_replicate = _growing_layer_class()
    return cache


def _layers(cache):
    layers = getattr(cache, "layers", None)
    if layers is None:  # pragma: no cover - guards a transformers internals change
        raise RuntimeError("this transformers version's DynamicCache has no .layers; "
                           "run the rollout with prefix caching off (keys=None)")
    return layers


def _compact(parts: list[_Batch], room: int = 0) -> _Batch:
    """Stack row sets into one batch holding only the columns each row attends to.

    Every row's attended columns are gathered, in order, to the right end of a cache as
    wide as the longest row; shorter rows get masked columns on the left. Column order
    is free (a row's positions live in its rotary keys and `next_pos`, and masked columns
    weigh exactly zero), so this is the same cache without the holes: columns left by
    rows that stopped early in a turn, left padding of prefill chunks, and rows of
    different ages. Padding narrower row sets on the right instead kept every row
    starting at column 0, so the width grew with each turn of every episode that ever
    shared the batch (1656 columns for 1006 tokens at most, 96 questions at batch 32),
    and decoding, which reads the whole cache per token, slowed down with it.

    `room` spare columns are allocated with it (see `_Batch.select`); each row set's
    buffers are freed layer by layer as the new cache is filled, so the two never both
    exist whole."""
    counts = [p.mask.sum(dim=1) for p in parts]
    width = max(int(c.max()) if len(c) else 0 for c in counts)
    index, masks = [], []
    for p, c in zip(parts, counts):
        rows, cols = p.mask.shape
        order = torch.sort(p.mask, dim=1, stable=True).indices  # unattended first, in order
        if cols >= width:
            idx = order[:, cols - width:]
        else:  # a narrower row set: point the extra columns at column 0 (masked)
            idx = torch.cat([order.new_zeros((rows, width - cols)), order], dim=1)
        index.append(idx)
        masks.append((torch.arange(width, device=p.mask.device)[None, :]
                      >= (width - c)[:, None]).to(p.mask.dtype))
    total = sum(len(c) for c in counts)
    layers = [_layers(p.cache) for p in parts]
    for n, out_layer in enumerate(layers[0]):
        bufs = []
        for name in ("keys", "values"):
            first = getattr(out_layer, name)
            _, h, _, d = first.shape
            buf = first.new_empty((total, h, width + room, d))
            r = 0
            for part_layers, idx in zip(layers, index):
                src = getattr(part_layers[n], name)
                b = src.shape[0]
                if src.shape[2]:
                    buf[r:r + b, :, :width] = torch.gather(
                        src, 2, idx[:, None, :, None].expand(b, h, width, d))
                else:  # never attended, but must be finite (0 x NaN is NaN)
                    buf[r:r + b, :, :width].zero_()
                r += b
            bufs.append(buf)
        for part_layers in layers:   # free the row sets' copies of this layer now
            part_layers[n].keys = part_layers[n].values = None
            _drop_spare(part_layers[n])
        out_layer.keys, out_layer.values = bufs[0][:, :, :width], bufs[1][:, :, :width]
        if room:
            out_layer._buf_k, out_layer._buf_v = bufs
    return _Batch(parts[0].cache, [k for p in parts for k in p.keys],
                  [s for p in parts for s in p.seen], torch.cat(masks),
                  torch.cat([p.next_pos for p in parts]))


def token_texts(tokenizer, ids) -> list[str]:
    """Each token's text as it reads inside a text, which stop strings are matched on:
    decoded after an ordinary token, since tokenizers that mark a word's start (Llama 2's
    and Mistral's "\u2581") drop its space when the token is decoded alone, and the pieces
    joined would read "</ search>" as "</search>"."""
    ids = list(ids)
    lead = tokenizer.encode("a", add_special_tokens=False)
    alone = tokenizer.batch_decode([[i] for i in ids])
    if not lead:
        return alone
    head = tokenizer.decode(lead[-1:])
    after = tokenizer.batch_decode([[lead[-1], i] for i in ids])
    # where decoding after it changes more than the token's own text, its own text
    return [a[len(head):] if a.startswith(head) else b for a, b in zip(after, alone)]


class HFBackend(Backend):
    """Batched generation for a Hugging Face causal LM, with its own decoding loop.

    Why not `model.generate`: its stop-string criterion rebuilds a vocabulary table on every
    call (about 2 s here), it keeps finished rows in the batch, it samples with
    `torch.multinomial` (slow over a 49k vocabulary on CPU) and it cannot keep an episode's
    cache from one turn to the next. This loop prefills only what each row has not seen
    (left-padded within the chunk, keeping only the last position's logits), decodes with
    the KV cache, and parks rows as they stop so the rest decode in a smaller batch.

    A row's result ends at its first stop string or EOS, both kept (an EOS ends the turn,
    not the episode: the environment's block follows it). The stopping token is never fed
    back, so an episode's cache holds everything but its last token, which the next turn's
    prefill adds."""

    def __init__(self, model, tokenizer, *, stop_strings: tuple[str, ...] = STOP_STRINGS,
                 attention: str = "default"):
        from seekrl.models import (
            ATTENTION,
            cache_kwarg,
            check_positions,
            end_of_turn_ids,
            pad_id_of,
        )

        if attention not in ATTENTION:
            raise ValueError(f"attention: expected one of {', '.join(ATTENTION)}, "
                             f"got {attention!r}")
        check_positions(model)   # the cache between turns relies on explicit position ids
        self.model = model
        self.attention = attention   # how decoding computes attention (models.ATTENTION)
        self._cache_kw = cache_kwarg(model)
        self.tokenizer = tokenizer
        self.stop_strings = tuple(stop_strings)
        self._tail = max((len(x) for x in self.stop_strings), default=0) + 8
        self.pad_id = pad_id_of(tokenizer)
        # padding, EOS, the model's generation EOS ids and the chat template's end-of-turn
        # token (when it is not EOS, a turn would otherwise run to max_new_tokens)
        self.stop_ids = {self.pad_id} | end_of_turn_ids(tokenizer, model)
        self._pieces: dict[int, str] = {}
        self._kept: _Batch | None = None   # rows cached between calls (keys given)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _store_dtype(self) -> torch.dtype | None:
        """The KV cache's dtype: the autocast dtype of a mixed-precision policy (see
        `_growing_layer_class`), else the model's own."""
        from seekrl.models import backbone

        return getattr(backbone(self.model), "_seekrl_autocast", None)

    def reset(self) -> None:
        """Forget cached episodes (the engine calls this when a rollout ends)."""
        self._kept = None

    def sync_weights(self, policy, version: int | None = None) -> None:
        """The policy's weights changed in place: episodes cached under the old ones go."""
        self.reset()

    def _piece(self, token: int) -> str:
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._pieces[token] = token_texts(self.tokenizer, [token])[0]
        return piece

    def _next_tokens(self, logits: torch.Tensor, sampling: Sampling
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(the next token of each row, its log-probability under the distribution it was
        drawn from; None when greedy)."""
        if sampling.greedy:
            return logits.argmax(-1), None
        probs = torch.softmax(logits.float() / sampling.temperature, dim=-1)
        if sampling.top_p < 1.0:
            sorted_p, order = probs.sort(dim=-1, descending=True)
            # a token goes once the mass before it reaches top_p (HF's warper and vLLM: at
            # 0.5 over [0.5, 0.25, 0.25] only the first token is left)
            drop = sorted_p.cumsum(-1) - sorted_p >= sampling.top_p
            sorted_p[drop] = 0.0
            probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
        # inverse-CDF sampling: one uniform number per row, where torch.multinomial and the
        # exponential race both draw vocabulary-many random numbers (slow on a CPU)
        cdf = probs.double().cumsum(-1)
        u = torch.rand((probs.shape[0], 1), dtype=torch.float64, device=probs.device)
        # rand is in [0, 1): at 0 the left-side search below picks token 0 whatever its
        # probability (-inf log-prob); the smallest positive double changes nothing else
        u = u.clamp(min=torch.finfo(torch.float64).tiny)
        picked = torch.searchsorted(cdf, u * cdf[:, -1:]).squeeze(-1)
        picked = picked.clamp(max=probs.shape[-1] - 1)
        logp = torch.log(probs.gather(-1, picked[:, None]).squeeze(-1).double()
                         / cdf[:, -1]).float()
        return picked, logp

    # ---- prefill
    def _prefill(self, contexts: list[list[int]], keys: list | None, spare: int):
        """Bring every context into one cache batch: reuse each episode's cache where it
        holds a prefix of the context and prefill only the rest, leaving `spare` columns for
        the turn's decoding. Returns the batch (row i holds context i) and the logits of
        each row's last position."""
        old = self._kept if keys is not None else None
        self._kept = None
        by_key = {k: r for r, k in enumerate(old.keys)} if old is not None else {}
        entries = []  # (context index, row in the old batch or None, tokens already cached)
        # Contexts to prefill from scratch that are equal (a question's G rollouts on their
        # first turn) are prefilled once; the copies take that row's cache.
        first_of: dict[tuple, int] = {}
        same_as = list(range(len(contexts)))
        for i, ctx in enumerate(contexts):
            r = by_key.get(keys[i]) if keys is not None else None
            if r is not None and len(old.seen[r]) < len(ctx) and ctx[:len(old.seen[r])] == old.seen[r]:
                entries.append((i, r, len(old.seen[r])))
                continue
            same_as[i] = first_of.setdefault(tuple(ctx), i)
            if same_as[i] == i:
                entries.append((i, None, 0))
        # Prefill in groups of similar length: one long context must not pad every other
        # row of the batch to its length (prefill cost grows with the padded width).
        entries.sort(key=lambda e: len(contexts[e[0]]) - e[2])
        groups: list[list[tuple]] = []
        for e in entries:
            n = len(contexts[e[0]]) - e[2]
            if groups and n <= 1.25 * (len(contexts[groups[-1][0][0]]) - groups[-1][0][2]) + 16:
                groups[-1].append(e)
            else:
                groups.append([e])
        # Every group's rows are copied out of the old cache, layer by layer (with room for
        # their chunk), and the old cache freed as they are, before any forward pass runs.
        prepared = self._group_batches(old, groups, contexts)
        del old
        parts, logits, order = [], [], []
        for group, batch in zip(groups, prepared):
            batch, last, rows = self._prefill_group(batch, group, contexts, keys)
            parts.append(batch)
            logits.append(last)
            order += rows
        del prepared
        # Rows back in context order, so that sampling does not depend on the grouping.
        where = {i: b for b, i in enumerate(order)}
        perm = [where[same_as[i]] for i in range(len(contexts))]
        identity = perm == list(range(len(perm)))
        batch = _compact(parts, room=spare if identity else 0)
        del parts
        if not identity:   # the copy that reorders takes the turn's room instead
            batch = batch.select(perm, room=spare)
            batch.keys = [keys[i] if keys else None for i in range(len(contexts))]
        return batch, torch.cat(logits)[torch.tensor(perm, device=self.device)]

    @staticmethod
    def _rows_of(group: list[tuple]) -> list[tuple]:
        """A group's entries, the rows with a cache to reuse first."""
        return [e for e in group if e[1] is not None] + [e for e in group if e[1] is None]

    def _group_batches(self, old: _Batch | None, groups: list[list[tuple]], contexts
                       ) -> list[_Batch]:
        """The caches the groups' prefills start from: each group's reused rows copied out
        of the old cache (which this uses up), then empty rows for its fresh contexts, with
        room for the chunk (the turn's decoding happens in the compacted cache, which gets
        its own room)."""
        picks, which = [], []
        for g, group in enumerate(groups):
            rows = self._rows_of(group)
            reused = [r for _, r, _ in rows if r is not None]
            if reused:
                width = max(len(contexts[i]) - seen for i, _, seen in rows)
                picks.append((reused, width, len(rows) - len(reused)))
                which.append(g)
        copied = dict(zip(which, old.split(picks))) if picks else {}
        dev = self.device
        return [copied[g] if g in copied else _Batch(
                    _new_cache(), [], [], torch.zeros((len(group), 0), dtype=torch.long,
                                                      device=dev),
                    torch.zeros(len(group), dtype=torch.long, device=dev))
                for g, group in enumerate(groups)]

    def _prefill_group(self, batch: _Batch, group: list[tuple], contexts, keys):
        dev = self.device
        rows = self._rows_of(group)
        suffixes = [contexts[i][seen:] for i, _, seen in rows]
        width = max(len(x) for x in suffixes)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        chunk_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for row, suf in enumerate(suffixes):  # left-pad within the chunk
            ids[row, width - len(suf):] = torch.tensor(suf, dtype=torch.long)
            chunk_mask[row, width - len(suf):] = 1
        ids, chunk_mask = ids.to(dev), chunk_mask.to(dev)
        positions = batch.next_pos[:, None] + (chunk_mask.cumsum(-1) - 1).clamp(min=0)
        mask = torch.cat([batch.mask, chunk_mask], dim=1)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                         use_cache=True, logits_to_keep=1, **{self._cache_kw: batch.cache})
        batch = _Batch(batch.cache, [keys[i] if keys else None for i, _, _ in rows],
                       [list(contexts[i]) for i, _, _ in rows], mask,
                       batch.next_pos + chunk_mask.sum(-1))
        return batch, out.logits[:, -1, :], [i for i, _, _ in rows]

    # ---- one turn
    @torch.no_grad()
    def generate(self, contexts: list[list[int]], max_new_tokens: int, sampling: Sampling,
                 keys: Sequence[Hashable] | None = None) -> list[Generated]:
        if not contexts or max_new_tokens <= 0:
            return [Generated() for _ in contexts]
        from seekrl.models import attention_variant, cast_weights

        # a mixed-precision policy's weights cast once a turn; attention as configured
        with cast_weights(self.model), attention_variant(self.model, self.attention):
            return self._generate(contexts, max_new_tokens, sampling, keys)

    def _generate(self, contexts: list[list[int]], max_new_tokens: int, sampling: Sampling,
                  keys: Sequence[Hashable] | None) -> list[Generated]:
        keys = list(keys) if keys is not None else None
        if keys is not None and len(set(keys)) != len(keys):
            raise ValueError("keys must be unique: one per episode")
        from seekrl.models import check_window

        # the episode's whole budget is checked once by the rollout engine; here what the
        # caller gives (`max_new_tokens` is the batch's largest, not each row's, budget)
        check_window(self.model, max(map(len, contexts)))
        layer_class = _growing_layer_class()
        layer_class.spare = max_new_tokens
        layer_class.store = self._store_dtype()
        batch, logits = self._prefill(contexts, keys, spare=max_new_tokens)
        results = [Generated(logprobs=None if sampling.greedy else []) for _ in contexts]
        tails = [""] * len(contexts)
        stops = self.stop_strings + tuple(sampling.stop)
        tail = max(self._tail, max((len(x) for x in sampling.stop), default=0) + 8)
        rows = list(range(len(contexts)))    # batch row -> context index
        parked: list[_Batch] = []
        dev = self.device
        alive = [True] * len(rows)
        for step in range(max_new_tokens):
            picked, logps = self._next_tokens(logits, sampling)
            tokens = picked.tolist()
            logps = logps.tolist() if logps is not None else None
            for b, (i, tok) in enumerate(zip(rows, tokens)):
                if not alive[b]:
                    continue
                results[i].append(tok)
                if logps is not None:
                    results[i].logprobs.append(logps[b])
                if tok in self.stop_ids:  # kept: the turn's last token, and trained
                    alive[b] = False
                    continue
                if not stops:   # EOS alone ends a row (a simulator's decoder)
                    continue
                # looked for before the text is cut to the tail: a stop completed by a token
                # carrying more than the tail's slack after it was cut off unseen
                text = tails[i] + self._piece(tok)
                tails[i] = text[-tail:]
                if any(s in text for s in stops):
                    alive[b] = False
            if not any(alive) or step == max_new_tokens - 1:
                parked.append(batch)
                break
            idle = [b for b, a in enumerate(alive) if not a]
            # Drop stopped rows in bunches: every drop copies the whole KV cache, so doing
            # it for each row that stops costs more than carrying a few idle rows a while.
            if len(idle) >= max(1, len(rows) // 4):
                keep = [b for b, a in enumerate(alive) if a]
                if keys is not None:  # keep the stopped rows' cache for their next turn
                    stopped, batch = batch.split([(idle, 0, 0),
                                                  (keep, max_new_tokens - step, 0)])
                    parked.append(stopped)
                else:
                    batch = batch.select(keep, room=max_new_tokens - step)
                tokens = [tokens[b] for b in keep]
                rows = [rows[b] for b in keep]
                alive = [True] * len(rows)
            live = torch.tensor(alive, dtype=torch.long, device=dev)
            for b in range(len(rows)):  # the token fed now becomes part of what the row saw
                if alive[b]:
                    batch.seen[b].append(tokens[b])
                else:
                    tokens[b] = self.pad_id  # an idle row's input: masked, never attended
            batch.mask = torch.cat([batch.mask, live[:, None]], dim=1)
            out = self.model(input_ids=torch.tensor(tokens, device=dev)[:, None],
                             attention_mask=batch.mask, position_ids=batch.next_pos[:, None],
                             use_cache=True, logits_to_keep=1, **{self._cache_kw: batch.cache})
            batch.next_pos = batch.next_pos + live
            logits = out.logits[:, -1, :]
        if keys is not None:
            self._kept = _compact(parked)
        return results


# ---- the decoding loop as text in, text out (a simulated retriever's engine)
class TextDecoder:
    """`HFBackend` as a function from texts to replies: `decoder(texts, max_new_tokens,
    temperature)` tokenises each text as it is (its chat template already applied), decodes
    until EOS or `max_new_tokens` (no stop strings; temperature 0: greedy) and returns the
    replies without special tokens. The simulated retriever takes one (`retrieval/` cannot
    import this layer; the trainer and `seekrl serve` hand it in)."""

    name = "seekrl"

    def __init__(self, model, tokenizer):
        self.backend = HFBackend(model, tokenizer, stop_strings=())
        self.tokenizer = tokenizer
        self.last_tokens = 0   # the tokens the last call decoded, all replies together
        self.last_cut: list[bool] = []   # each reply of the last call stopped by the limit

    def __call__(self, texts: list[str], max_new_tokens: int, temperature: float
                 ) -> list[str]:
        tok = self.tokenizer
        contexts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
        sampling = Sampling(greedy=temperature <= 0, temperature=max(temperature, 1e-6))
        out = self.backend.generate(contexts, max_new_tokens, sampling)
        self.last_tokens = sum(len(x) for x in out)
        # a reply that ended keeps its end token; one without it ran out of tokens
        self.last_cut = [not (x and x[-1] in self.backend.stop_ids) for x in out]
        return tok.batch_decode([list(x) for x in out], skip_special_tokens=True)


def generation_processors(config) -> str | None:
    """What in a model's generation_config `model.generate` applies and seekrl's loop does
    not (a repetition penalty, n-gram blocking, suppressed or banned tokens, a minimum
    length), as a sentence; None when nothing."""
    if config is None:
        return None
    checks = (("repetition_penalty", lambda v: v not in (None, 1.0)),
              ("no_repeat_ngram_size", bool), ("encoder_no_repeat_ngram_size", bool),
              ("bad_words_ids", bool), ("suppress_tokens", bool),
              ("begin_suppress_tokens", bool), ("min_new_tokens", bool), ("min_length", bool))
    found = [k for k, bad in checks if bad(getattr(config, k, None))]
    return f"its generation_config sets {', '.join(found)}" if found else None


def text_decoder(model, tokenizer) -> TextDecoder | None:
    """seekrl's loop as a simulator's decoder, or None (with a warning) where it would not
    decode as `model.generate` does: a model whose positions it cannot set (ALiBi), or a
    generation_config with logits processors it does not apply."""
    import warnings

    from seekrl.models import ModelError

    why = generation_processors(getattr(model, "generation_config", None))
    if why is None:
        try:
            return TextDecoder(model, tokenizer)
        except ModelError as err:
            why = str(err)
    warnings.warn(f"simulator: decoding with model.generate ({why})", stacklevel=2)
    return None
