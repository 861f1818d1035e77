"""A decoding backend shaped for a GPU's limit (`rollout.backend: static`).

`HFBackend` spends a GPU's decoding step on the host: it syncs every token, scans
stop strings in Python, grows and compacts its cache, and so can capture nothing in a CUDA
graph. This backend keeps every shape fixed and every per-token decision on the device:

- **one KV-cache row per episode for its whole life**: `[layers, rows, kv_heads, max_len + 1,
  head_dim]` allocated once, column i holding position i (no left padding, no compaction
  copies; the extra column is scratch for rows that write nothing real). An episode's next
  turn prefills only what was appended since into its own row;
- **a lean forward** for the Llama and Qwen2 families over the policy's own weight tensors
  (no copies where the dtypes agree: an optimizer step updates them in place), checked
  against HF's logits when built (`static_backend` falls back to `HFBackend` with a warning
  when they differ, or for another architecture);
- **decode attention** over each row's own length by an explicit mask, in plain matmuls (no
  SDPA dispatch, no per-shape kernel plans): a step's shapes depend only on the batch bucket
  and the cache-width bucket;
- **sampling** (HFBackend's exact rule and log-probs), **stop strings** by a token-level
  automaton (`stop_table`), per-row budgets and finished flags all on the device; the host
  reads the flags every `sync_every` steps;
- **CUDA graphs** per (batch, width, sampling mode) bucket, on CUDA only (`_CudaGraphs`); with
  graphs off the very same step runs eagerly (CPU, tests);
- **continuous batching** (`open`, `admit`, `run`, `release`): a row whose turn ended
  leaves the decoding batch while the others go on, and rejoins with its next turn's
  context prefilled into its row; a finished episode's row takes a waiting one.

`generate` follows `HFBackend` to the token when greedy (sampled, the same distribution
and log-probs, but this loop draws for every row of its bucket, stopped ones too, so the
two draw apart once a row stops): a row's result ends at its first stop string
(matched on the concatenation of each token's own decoded text, as HFBackend's tail scan
does) or stop id, both kept; the stopping token is not fed back, so a row's cache holds
everything but its last token.
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Sequence

import torch
import torch.nn.functional as F

from seekrl.agent.backends import Backend, Generated, HFBackend, Sampling, token_texts
from seekrl.agent.protocol import STOP_STRINGS

SUPPORTED = ("llama", "qwen2")
# rotary types whose frequencies do not depend on the sequence length (a table computed once
# holds); "dynamic" and "longrope" rescale with the length seen
_STATIC_ROPE = ("default", "linear", "llama3", "yarn")


# ---------------------------------------------------------------- stop strings as an automaton
class _Automaton:
    """Aho-Corasick over characters: state = the longest suffix of the text so far that is a
    prefix of some stop string; `walk` feeds a token's text and says DONE once a stop string
    has ended inside it."""

    def __init__(self, stops: Sequence[str]):
        self.goto: list[dict[str, int]] = [{}]
        hit = [False]
        for s in stops:
            node = 0
            for ch in s:
                if ch not in self.goto[node]:
                    self.goto.append({})
                    hit.append(False)
                    self.goto[node][ch] = len(self.goto) - 1
                node = self.goto[node][ch]
            hit[node] = True
        self.fail = [0] * len(self.goto)
        queue = list(self.goto[0].values())
        while queue:   # breadth first: a node's fallback is shallower, so already known
            node = queue.pop(0)
            for ch, child in self.goto[node].items():
                if node:
                    f = self.fail[node]
                    while f and ch not in self.goto[f]:
                        f = self.fail[f]
                    self.fail[child] = self.goto[f].get(ch, 0)
                hit[child] = hit[child] or hit[self.fail[child]]
                queue.append(child)
        self.hit = hit
        self.n = len(self.goto)
        self.done = self.n          # the absorbing state past the last real one
        self._step: dict[tuple[int, str], int] = {}

    def step(self, state: int, ch: str) -> int:
        key = (state, ch)
        out = self._step.get(key)
        if out is None:
            s = state
            while s and ch not in self.goto[s]:
                s = self.fail[s]
            out = self._step[key] = self.goto[s].get(ch, 0)
        return out

    def walk(self, state: int, text: str) -> int:
        for ch in text:
            state = self.step(state, ch)
            if self.hit[state]:
                return self.done
        return state


def stop_table(pieces: Sequence[str], stops: Sequence[str], stop_ids=(),
               vocab: int | None = None) -> torch.Tensor:
    """The stop automaton as a `[states + 1, vocab]` table of next states: row s, column t is
    the state after token t (text `pieces[t]`) from state s; the last state (DONE, its row
    all DONE) means a stop string ended inside the token or t is a stop id. A row stops at
    the first token whose text completes a stop string in the concatenated texts, as a
    substring search over them would find it.

    Only few (state, token) pairs differ from the start state's row: the tokens whose first
    character continues a partial match differently than from scratch (equal states after
    one character walk alike). Those are walked; the rest copy row 0."""
    vocab = len(pieces) if vocab is None else vocab
    ac = _Automaton(stops)
    states = ac.n + 1
    if any(s == "" for s in stops):    # an empty stop string is in every text
        return torch.full((states, vocab), ac.done, dtype=torch.long)
    known = min(len(pieces), vocab)
    row0 = [ac.walk(0, pieces[t]) for t in range(known)] + [0] * (vocab - known)
    table = torch.tensor(row0, dtype=torch.long).repeat(states, 1)
    empty = [t for t in range(known) if not pieces[t]] + list(range(known, vocab))
    if empty:   # no text: the state stays
        table[:, empty] = torch.arange(states)[:, None]
    by_first: dict[str, list[int]] = {}
    for t in range(known):
        if pieces[t]:
            by_first.setdefault(pieces[t][0], []).append(t)
    alphabet = {ch for s in stops for ch in s}
    rows, cols, vals = [], [], []
    for s in range(1, ac.n):
        for ch in alphabet:
            if ac.step(s, ch) == ac.step(0, ch):
                continue
            for t in by_first.get(ch, ()):
                rows.append(s)
                cols.append(t)
                vals.append(ac.walk(s, pieces[t]))
    if rows:
        table[rows, cols] = torch.tensor(vals, dtype=torch.long)
    table[ac.done] = ac.done
    ids = [i for i in stop_ids if 0 <= i < vocab]
    if ids:
        table[:, ids] = ac.done
    return table


def first_stop(table: torch.Tensor, tokens: Sequence[int]) -> int | None:
    """The index of the token at which `table` stops a row fed `tokens` (None: never)."""
    state, done = 0, table.shape[0] - 1
    for i, t in enumerate(tokens):
        state = int(table[state, t])
        if state == done:
            return i
    return None


# ---------------------------------------------------------------- the lean forward
class LeanMismatch(RuntimeError):
    """The lean forward's logits differ from HF's on the probe."""


def unsupported(model) -> str | None:
    """Why the lean forward cannot run `model` (None: it can)."""
    from seekrl.models import causal_lm, logit_transform, sliding_window

    lm = causal_lm(model)
    cfg = getattr(lm, "config", None)
    kind = getattr(cfg, "model_type", None)
    if kind not in SUPPORTED:
        return f"model type {kind!r} has no lean forward (it has: {', '.join(SUPPORTED)})"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act!r} (the lean forward has silu)"
    rope = getattr(lm.model.rotary_emb, "rope_type", "default")
    if rope not in _STATIC_ROPE:
        return f"rotary type {rope!r} rescales with the sequence length"
    if sliding_window(model) is not None:
        return "a sliding attention window (the lean forward attends to the whole row)"
    if logit_transform(model) is not None:
        return "its forward transforms the logits"
    if getattr(lm, "lm_head", None) is None:
        return "no lm_head"
    # adapters the merge into a weight would get wrong: peft's `.weight` of a wrapped
    # embedding is its base weight (the delta dropped), and DoRA rescales in its forward
    if hasattr(lm.model.embed_tokens, "base_layer"):
        return "a LoRA adapter on embed_tokens (the lean forward merges Linear layers' only)"
    if any(getattr(m, "lora_magnitude_vector", None) for m in model.modules()):
        return "DoRA adapters (the lean forward merges plain LoRA deltas)"
    return None


def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's RMSNorm, operation for operation (float32 inside, back to the input's dtype)."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor,
               scaling: float) -> torch.Tensor:
    """q `[b, S, H, D]` against a row's cache columns k, v `[b, KVH, W, D]` where `allowed`
    `[b, S, W]`; `[b, S, H * D]`. Query heads grouped over their key head (head h reads key
    head h // G, as HF's repeat_kv), so the cache is read once per group, never copied."""
    b, S, H, D = q.shape
    kvh, W = k.shape[1], k.shape[2]
    g = H // kvh
    q = q.view(b, S, kvh, g, D).permute(0, 2, 3, 1, 4).reshape(b, kvh, g * S, D)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scaling
    scores = scores.view(b, kvh, g, S, W).masked_fill(~allowed[:, None, None],
                                                      torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
    out = torch.matmul(probs.view(b, kvh, g * S, W), v)
    return out.view(b, kvh, g, S, D).permute(0, 3, 1, 2, 4).reshape(b, S, H * D)


def _linear_parts(module):
    """(the tensors a Linear's weight is made of, a function making it, the bias): the
    weight itself, or under peft's LoRA the base weight plus each active adapter's delta
    (merged here, so decoding runs one matmul)."""
    base = getattr(module, "base_layer", None)
    delta = getattr(module, "get_delta_weight", None)
    if base is None or delta is None:
        return (module.weight,), None, module.bias
    adapters = [] if getattr(module, "disable_adapters", False) or getattr(module, "merged", False) \
        else [a for a in module.active_adapters if a in getattr(module, "lora_A", {})]
    if not adapters:
        return (base.weight,), None, base.bias
    parts = (base.weight,) + tuple(p for a in adapters for p in
                                   (module.lora_A[a].weight, module.lora_B[a].weight))

    def make():
        w = base.weight.detach()
        for a in adapters:
            w = w + module.get_delta_weight(a).detach().to(w.dtype)
        return w
    return parts, make, base.bias


class LeanForward:
    """A Llama / Qwen2 forward in a dozen tensor operations a layer, on a fixed-shape cache.

    Weights: each slot holds the policy's own tensor where it is usable as it is (same dtype,
    no adapter): an optimizer step updates it in place, nothing to sync. Otherwise (a
    mixed-precision policy's bfloat16 products, a LoRA merge) the slot is its own tensor,
    refreshed in place by `sync` when its sources changed (tensor version counters), so
    captured CUDA graphs stay valid across RL steps. A source tensor replaced by another
    (`model.to`, a gathered shard) is taken as it comes, and `sync` says so."""

    def __init__(self, model, max_len: int):
        from seekrl.models import backbone, causal_lm

        lm = causal_lm(model)
        base = backbone(model)
        cfg = lm.config
        self.config = cfg
        self.n_layers = len(base.layers)
        attn = base.layers[0].self_attn
        self.head_dim = int(attn.head_dim)
        self.scaling = float(attn.scaling)
        self.heads = int(cfg.num_attention_heads)
        self.kv_heads = int(cfg.num_key_value_heads)
        self.eps = [(float(layer.input_layernorm.variance_epsilon),
                     float(layer.post_attention_layernorm.variance_epsilon))
                    for layer in base.layers]
        self.final_eps = float(base.norm.variance_epsilon)
        embed = base.embed_tokens.weight
        self.device = embed.device
        self.act = embed.dtype            # the residual stream's dtype (HF's hidden states)
        # a mixed-precision policy multiplies in its autocast dtype, weights float32
        self.mm = getattr(base, "_seekrl_autocast", None) or embed.dtype
        self.vocab = int(lm.lm_head.weight.shape[0])
        self._rotary = base.rotary_emb
        self.resize(max_len)
        self.w: dict[str, torch.Tensor | None] = {}
        self._keys: dict[str, tuple] = {}
        self._owned: set[str] = set()
        self.sync(model)

    def resize(self, max_len: int) -> None:
        """Rows of `max_len` positions: the rotary table for positions 0..max_len (the
        last one the scratch column's), computed once by HF's own rotary module."""
        self.max_len = max_len
        positions = torch.arange(max_len + 1, device=self.device)[None]
        with torch.no_grad():
            probe = torch.zeros((1, 1, 1), dtype=self.act, device=self.device)
            cos, sin = self._rotary(probe, positions)
        self.cos, self.sin = cos[0], sin[0]            # [max_len + 1, head_dim]
        self.cols = torch.arange(max_len + 1, device=self.device)

    # ---- weights
    def _sources(self, model):
        """(name, source tensors, maker or None, target dtype) for every weight slot."""
        from seekrl.models import backbone, causal_lm

        lm, base = causal_lm(model), backbone(model)
        out = [("embed", (base.embed_tokens.weight,), None, None),
               ("norm", (base.norm.weight,), None, None)]
        parts, make, _ = _linear_parts(lm.lm_head)
        out.append(("head", parts, make, self.mm))
        for n, layer in enumerate(base.layers):
            a, m = layer.self_attn, layer.mlp
            out += [(f"{n}.in", (layer.input_layernorm.weight,), None, None),
                    (f"{n}.post", (layer.post_attention_layernorm.weight,), None, None)]
            for name, mod in (("q", a.q_proj), ("k", a.k_proj), ("v", a.v_proj),
                              ("o", a.o_proj), ("gate", m.gate_proj), ("up", m.up_proj),
                              ("down", m.down_proj)):
                parts, make, bias = _linear_parts(mod)
                out.append((f"{n}.{name}", parts, make, self.mm))
                out.append((f"{n}.{name}.b", (bias,) if bias is not None else (), None,
                            self.mm))
        return out

    def sync(self, model, *, copy_owned: bool = True, force: bool = False) -> bool:
        """Bring every slot up to the policy's weights; True when a slot was rebound to a
        new tensor (captured graphs must then be dropped). `force`: refresh every own copy
        whatever the version counters say (an in-place write that does not bump them, as
        through `.data`, would otherwise go unseen)."""
        rebound = False
        with torch.no_grad():
            for name, parts, make, dtype in self._sources(model):
                if not parts:
                    self.w[name] = None
                    continue
                src = parts[0]
                direct = make is None and (dtype is None or src.dtype == dtype)
                held = self.w.get(name)
                key = tuple((p.data_ptr(), p._version) for p in parts)
                if direct:
                    if held is None or held.data_ptr() != src.data_ptr() \
                            or held.shape != src.shape or held.dtype != src.dtype:
                        rebound |= held is not None
                        self.w[name] = src.detach()   # the policy's own tensor: no copy
                        self._owned.discard(name)
                    continue
                if held is None or name not in self._owned or held.shape != src.shape:
                    rebound |= held is not None
                    # a new tensor either way: make() merges into one, .to casts a copy
                    self.w[name] = (make() if make is not None else src.detach()).to(dtype)
                    self._owned.add(name)
                elif copy_owned and (force or key != self._keys.get(name)):
                    held.copy_(make() if make is not None else src)   # in place: graphs hold
                self._keys[name] = key
        return rebound

    # ---- the forward
    def _run(self, ids, pos, kc, vc, write, attend) -> torch.Tensor:
        """The transformer on `ids` `[b, S]` at positions `pos` `[b, S]`; each layer's new
        keys and values go to `write(layer, k, v)`, its attention is `attend(layer, q)`."""
        w, mm = self.w, self.mm
        b, S = ids.shape
        x = F.embedding(ids, w["embed"])
        cos = self.cos[pos][:, :, None, :]
        sin = self.sin[pos][:, :, None, :]
        for n in range(self.n_layers):
            eps_in, eps_post = self.eps[n]
            h = _norm(x, w[f"{n}.in"], eps_in).to(mm)
            q = F.linear(h, w[f"{n}.q"], w[f"{n}.q.b"]).view(b, S, self.heads, self.head_dim)
            k = F.linear(h, w[f"{n}.k"], w[f"{n}.k.b"]).view(b, S, self.kv_heads, self.head_dim)
            v = F.linear(h, w[f"{n}.v"], w[f"{n}.v.b"]).view(b, S, self.kv_heads, self.head_dim)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            write(kc[n], vc[n], k.to(kc.dtype), v.to(vc.dtype))
            o = attend(kc[n], vc[n], q.to(kc.dtype)).to(mm)
            x = x + F.linear(o, w[f"{n}.o"], w[f"{n}.o.b"])
            h = _norm(x, w[f"{n}.post"], eps_post).to(mm)
            gate = F.linear(h, w[f"{n}.gate"], w[f"{n}.gate.b"])
            up = F.linear(h, w[f"{n}.up"], w[f"{n}.up.b"])
            x = x + F.linear(F.silu(gate) * up, w[f"{n}.down"], w[f"{n}.down.b"])
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        h = _norm(hidden, self.w["norm"], self.final_eps).to(self.mm)
        return F.linear(h, self.w["head"]).float()

    def prefill(self, ids, pos, lens, rows, kc, vc, width: int) -> torch.Tensor:
        """Rows `rows` `[b]` take tokens `ids` `[b, S]` (the first `lens[b]` real, the rest
        padding) at positions `pos`; their keys and values land in their own cache columns
        (padding in the scratch column); each token attends to its row's columns up to its
        own position. Returns the logits of each row's last real token, `[b, vocab]`."""
        b, S = ids.shape
        real = torch.arange(S, device=ids.device)[None, :] < lens[:, None]
        cols = torch.where(real, pos, self.max_len)
        allowed = self.cols[:width][None, None, :] <= pos[:, :, None]
        scaling = self.scaling

        def write(K, V, k, v):
            K[rows[:, None], :, cols] = k
            V[rows[:, None], :, cols] = v

        def attend(K, V, q):
            return _attention(q, K[rows, :, :width], V[rows, :, :width], allowed, scaling)

        x = self._run(ids, pos.clamp(max=self.max_len), kc, vc, write, attend)
        return self.logits(x[torch.arange(b, device=ids.device), lens - 1])

    def decode(self, ids, pos, kc, vc, width: int) -> torch.Tensor:
        """One token for each of the cache's first `b` rows (`ids`, `pos` `[b]`): written at
        column `pos`, attending to columns `<= pos` among the first `width`. `[b, vocab]`."""
        b = ids.shape[0]
        rows = torch.arange(b, device=ids.device)
        allowed = self.cols[:width][None, None, :] <= pos[:, None, None]
        scaling = self.scaling

        def write(K, V, k, v):
            K[rows, :, pos] = k[:, 0]
            V[rows, :, pos] = v[:, 0]

        def attend(K, V, q):   # a view of the first b rows: nothing copied
            return _attention(q, K[:b, :, :width], V[:b, :, :width], allowed, scaling)

        x = self._run(ids[:, None], pos[:, None], kc, vc, write, attend)
        return self.logits(x[:, 0])

    def new_cache(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (self.n_layers, rows, self.kv_heads, self.max_len + 1, self.head_dim)
        # zeros: a column no row has written is still finite under its (zero) weight
        return (torch.zeros(shape, dtype=self.mm, device=self.device),
                torch.zeros(shape, dtype=self.mm, device=self.device))

    @torch.no_grad()
    def check(self, model, tokens: Sequence[int]) -> float:
        """The largest logit difference from HF's forward on `tokens`: the first half
        prefilled, the rest decoded one at a time (both paths of the loop); raises
        `LeanMismatch` beyond the dtype's tolerance."""
        from seekrl.models import causal_lm

        tokens = list(tokens)[:self.max_len]
        ids = torch.tensor([tokens], device=self.device)
        ref = causal_lm(model)(input_ids=ids, use_cache=False).logits[0].float()
        n = len(tokens)
        kc, vc = self.new_cache(1)
        half = max(1, n // 2)
        got = [self.prefill(ids[:, :half], torch.arange(half, device=self.device)[None],
                            torch.tensor([half], device=self.device),
                            torch.zeros(1, dtype=torch.long, device=self.device), kc, vc, half)]
        full = torch.zeros(1, dtype=torch.long, device=self.device)
        for p in range(half, n):
            full[0] = p
            got.append(self.decode(ids[0, p:p + 1], full, kc, vc, p + 1))
        mine = torch.cat(got)
        want = ref[half - 1:]
        diff = float((mine - want).abs().max())
        scale = max(1.0, float(want.abs().max()))
        tol = (1e-3 if self.mm == torch.float32 else 5e-2) * scale
        if not diff <= tol:
            raise LeanMismatch(f"the lean forward's logits differ from HF's by {diff:.3g} "
                               f"(tolerance {tol:.3g})")
        return diff


# ---------------------------------------------------------------- sampling, capture-safe
def _sample(logits: torch.Tensor, mode: str, temperature: torch.Tensor, top_p: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`HFBackend._next_tokens` without a host sync: the same inverse-CDF draw (one uniform
    number a row), the same top-p cut and the same log-probability, the boolean-index write
    replaced by `masked_fill` (a boolean index asks the host how many)."""
    if mode == "greedy":
        return logits.argmax(-1), None
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if mode == "top_p":
        sorted_p, order = probs.sort(dim=-1, descending=True)
        drop = sorted_p.cumsum(-1) - sorted_p >= top_p
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p.masked_fill(drop, 0.0))
    cdf = probs.double().cumsum(-1)
    u = torch.rand((probs.shape[0], 1), dtype=torch.float64, device=probs.device)
    u = u.clamp(min=torch.finfo(torch.float64).tiny)
    picked = torch.searchsorted(cdf, u * cdf[:, -1:]).squeeze(-1).clamp(max=probs.shape[-1] - 1)
    logp = torch.log(probs.gather(-1, picked[:, None]).squeeze(-1).double() / cdf[:, -1]).float()
    return picked, logp


def _mode(sampling: Sampling) -> str:
    if sampling.greedy:
        return "greedy"
    return "top_p" if sampling.top_p < 1.0 else "sample"


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _common(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    for j in range(n):
        if a[j] != b[j]:
            return j
    return n


# ---------------------------------------------------------------- the backend
class StaticBackend(Backend):
    """See the module's docstring. `max_len`: the widest an episode gets (the engine's
    `max_total_tokens`): a row's turn stops there, as the engine would cut it (a context
    that does not fit at all widens every row, once). `sync_every`: steps between the
    host's reads of the finished flags (8 on CUDA, 1 elsewhere). `graphs`: capture CUDA
    graphs (default: on CUDA). `width_step`: the cache-width bucket. `probe_diff`: the
    largest logit difference from HF's at load. Build it with `static_backend`, which
    falls back to `HFBackend` where the lean forward does not hold."""

    def __init__(self, model, tokenizer, *, stop_strings: tuple[str, ...] = STOP_STRINGS,
                 max_len: int = 4096, sync_every: int | None = None,
                 graphs: bool | None = None, width_step: int | None = None,
                 prefill_tokens: int = 8192, check: bool = True):
        from seekrl.models import ModelError, check_positions, end_of_turn_ids, pad_id_of

        why = unsupported(model)
        if why is not None:
            raise ModelError(f"static backend: {why}")
        check_positions(model)
        if max_len < 2:
            raise ValueError(f"max_len: expected at least 2, got {max_len}")
        self.model = model
        self.tokenizer = tokenizer
        self.stop_strings = tuple(stop_strings)
        self.pad_id = pad_id_of(tokenizer)
        self.stop_ids = {self.pad_id} | end_of_turn_ids(tokenizer, model)
        self.max_len = int(max_len)
        self.lean = LeanForward(model, self.max_len)
        self._weights_version: int | None = None
        self.device = self.lean.device
        cuda = self.device.type == "cuda"
        if graphs and not cuda:
            raise ValueError("graphs: CUDA graphs need a CUDA device")
        self.sync_every = max(1, sync_every or (8 if cuda else 1))
        self.width_step = max(1, width_step or (256 if cuda else 64))
        self.prefill_tokens = max(1, prefill_tokens)
        self._graphs = _CudaGraphs() if cuda and graphs is not False else None
        self.probe_diff: float | None = None
        if check:
            probe = tokenizer.encode("The capital of Velmaria is Tarrow, a city of",
                                     add_special_tokens=False)[:12]
            probe = probe if len(probe) >= 2 else [1, 2, 3, 4]
            self.probe_diff = self.lean.check(model, probe)
        self._pieces: list[str] | None = None
        self._tables: dict[tuple[str, ...], torch.Tensor] = {}
        self._rows = 0          # cache rows allocated
        self._out_cap = 0       # tokens a turn may hold in the output buffers
        self._keys: list[Hashable | None] = []
        self._seen: list[list[int]] = []
        self._used: list[int] = []
        self._row_of: dict[Hashable, int] = {}
        self._tick = 0
        self._session: tuple[str, torch.Tensor] | None = None   # continuous: (mode, table)
        self._live: dict[int, list[int]] = {}   # continuous: decoding row -> its context
        self._top = 0           # continuous: the largest position a decoding row is at

    # ---- protocol
    def reset(self) -> None:
        """Forget cached episodes (and end a continuous session); the buffers (and
        captured graphs) stay for the next run."""
        self._session, self._live = None, {}
        self._row_of.clear()
        self._keys = [None] * self._rows
        self._seen = [[] for _ in range(self._rows)]

    def sync_weights(self, policy, version: int | None = None) -> None:
        """Decode with `policy`'s weights: its own tensors are read as they are (an
        optimizer step changed them in place); own copies (mixed precision, LoRA) are
        refreshed in place, so graphs captured before stay valid."""
        self.model = policy
        self.reset()   # the episodes' cached keys and values were the old weights'
        # a new version is copied whole: the version counters are a shortcut for calls
        # that name none, not a proof that the weights are unchanged
        force = version is not None and version != self._weights_version
        self._weights_version = version
        if self.lean.sync(policy, force=force) and self._graphs is not None:
            self._graphs.clear()

    def sleep(self) -> None:
        """Keeps the cache and graphs (allocated once, on purpose); forgets episodes."""
        self.reset()

    # ---- stop tables
    def _table(self, stops: tuple[str, ...]) -> torch.Tensor:
        table = self._tables.get(stops)
        if table is None:
            if self._pieces is None:   # each token's own text, as HFBackend._piece reads it
                n = min(len(self.tokenizer), self.lean.vocab)
                self._pieces = token_texts(self.tokenizer, range(n))
            table = stop_table(self._pieces, stops, self.stop_ids, vocab=self.lean.vocab)
            table = self._tables[stops] = table.to(self.device)
        return table

    # ---- buffers
    def _ensure(self, rows: int, new_tokens: int) -> None:
        """Room for `rows` rows and turns of `new_tokens` tokens (grown, never shrunk: a
        reallocation drops the captured graphs)."""
        grow_rows = rows > self._rows
        if not grow_rows and new_tokens <= self._out_cap:
            return
        dev = self.device
        if grow_rows:
            old = self._rows
            R = _pow2(rows)
            kc, vc = self.lean.new_cache(R)
            if old:
                kc[:, :old] = self.kc
                vc[:, :old] = self.vc
            self.kc, self.vc = kc, vc
            self._keys += [None] * (R - old)
            self._seen += [[] for _ in range(R - old)]
            self._used += [0] * (R - old)
            self._rows = R
            z = lambda dtype: torch.zeros(R, dtype=dtype, device=dev)   # noqa: E731
            self.tok_in, self.pos, self.n_out = z(torch.long), z(torch.long), z(torch.long)
            self.budget, self.state = z(torch.long), z(torch.long)
            self.fed, self.done = z(torch.bool), z(torch.bool)
            self.temperature = torch.ones((), dtype=torch.float32, device=dev)
            self.top_p = torch.ones((), dtype=torch.float32, device=dev)
        self._out_cap = max(self._out_cap, new_tokens)
        # one spare column: finished rows write their draws there
        self.out_tok = torch.zeros((self._rows, self._out_cap + 1), dtype=torch.long, device=dev)
        self.out_lp = torch.zeros((self._rows, self._out_cap + 1), dtype=torch.float32,
                                  device=dev)
        if self._graphs is not None:
            self._graphs.clear()

    def _widen(self, columns: int) -> None:
        """Rows of at least `columns` positions: the cache copied into wider rows once
        (the graphs recaptured), instead of refusing a context that does not fit."""
        old = self.max_len
        self.max_len = -(-columns // self.width_step) * self.width_step
        self.lean.resize(self.max_len)
        if self._rows:
            kc, vc = self.lean.new_cache(self._rows)
            kc[:, :, :, :old] = self.kc[:, :, :, :old]
            vc[:, :, :, :old] = self.vc[:, :, :, :old]
            self.kc, self.vc = kc, vc
        if self._graphs is not None:
            self._graphs.clear()

    def _bucket(self, n: int) -> int:
        return min(self._rows, _pow2(n))

    def _swap(self, a: int, b: int) -> None:
        """Exchange two rows: cache columns and what the host knows of them."""
        m = max(len(self._seen[a]), len(self._seen[b]))
        if m:
            for c in (self.kc, self.vc):
                c[:, [a, b], :, :m] = c[:, [b, a], :, :m]
        for lst in (self._keys, self._seen, self._used):
            lst[a], lst[b] = lst[b], lst[a]
        for r in (a, b):
            if self._keys[r] is not None:
                self._row_of[self._keys[r]] = r

    # ---- placing a call's contexts in rows
    def _place(self, contexts: list[list[int]], keys: list | None):
        """Each context's row (all below the batch bucket), the tokens its row already
        holds, and the fresh contexts equal to an earlier one (copied, not prefilled)."""
        self._tick += 1
        n = len(contexts)
        B = self._bucket(n)
        rows: list[int | None] = [None] * n
        starts = [0] * n
        if keys is not None:
            for i, k in enumerate(keys):
                r = self._row_of.get(k)
                if r is not None:   # its episode's row: keep what agrees, at least one token new
                    rows[i] = r
                    starts[i] = min(_common(self._seen[r], contexts[i]), len(contexts[i]) - 1)
        pinned = {r for r in rows if r is not None}
        # free rows: empty ones first (below the bucket first), then the least recently
        # used episode's (evicted); one past the bucket is swapped below it afterwards
        free = sorted((r for r in range(self._rows) if r not in pinned),
                      key=lambda r: (self._keys[r] is not None, r >= B, self._used[r], r))
        free_iter = iter(free)
        first_of: dict[tuple, int] = {}
        copies: list[tuple[int, int]] = []     # (context, the context it copies)
        for i in range(n):
            if rows[i] is not None:
                continue
            r = next(free_iter)
            if self._keys[r] is not None:      # another episode's row: it is evicted
                self._row_of.pop(self._keys[r], None)
            self._keys[r], self._seen[r] = None, []
            rows[i] = r
            src = first_of.setdefault(tuple(contexts[i]), i)
            if src != i:
                copies.append((i, src))
        taken = set(rows)
        spare = [r for r in range(B) if r not in taken]
        for i in range(n):   # rows past the bucket trade places with unused ones below it
            if rows[i] >= B:
                s = spare.pop()
                self._swap(rows[i], s)
                rows[i] = s
        for i, r in enumerate(rows):
            k = keys[i] if keys is not None else None
            self._keys[r] = k
            if k is not None:
                self._row_of[k] = r
            self._used[r] = self._tick
        return rows, starts, copies, B

    def _prefill(self, contexts, rows, starts, copies) -> torch.Tensor:
        """Every context's unseen tokens into its row, in chunks of similar length; the
        logits of each context's last token `[n, vocab]`."""
        dev = self.device
        skip = {i for i, _ in copies}
        items = sorted((i for i in range(len(contexts)) if i not in skip),
                       key=lambda i: len(contexts[i]) - starts[i])
        # similar lengths together (padding costs), within a token and attention budget
        chunks: list[list[int]] = []
        for i in items:
            n = len(contexts[i]) - starts[i]
            if chunks:
                c = chunks[-1]
                first = len(contexts[c[0]]) - starts[c[0]]
                width = max(len(contexts[j]) for j in c + [i])
                if n <= 1.25 * first + 16 and (len(c) + 1) * n <= self.prefill_tokens \
                        and (len(c) + 1) * n * width * self.lean.heads <= 1 << 28:
                    c.append(i)
                    continue
            chunks.append([i])
        out = torch.empty((len(contexts), self.lean.vocab), dtype=torch.float32, device=dev)
        for chunk in chunks:
            S = max(len(contexts[i]) - starts[i] for i in chunk)
            ids = torch.full((len(chunk), S), self.pad_id, dtype=torch.long)
            pos = torch.empty((len(chunk), S), dtype=torch.long)
            for b, i in enumerate(chunk):
                suffix = contexts[i][starts[i]:]
                ids[b, :len(suffix)] = torch.tensor(suffix, dtype=torch.long)
                pos[b] = torch.arange(starts[i], starts[i] + S)
            lens = torch.tensor([len(contexts[i]) - starts[i] for i in chunk])
            width = max(len(contexts[i]) for i in chunk)
            out[torch.tensor(chunk, device=dev)] = self.lean.prefill(
                ids.to(dev), pos.to(dev), lens.to(dev),
                torch.tensor([rows[i] for i in chunk], device=dev), self.kc, self.vc, width)
        for i, src in copies:   # an equal context: its row copies the prefilled one
            m = len(contexts[i])
            for c in (self.kc, self.vc):
                c[:, rows[i], :, :m].copy_(c[:, rows[src], :, :m])
            out[i] = out[src]
        return out

    # ---- one step, the same eager or captured
    def _advance(self, logits: torch.Tensor, B: int, mode: str, table: torch.Tensor) -> None:
        """Draw each row's next token from `logits` and record it (finished rows write to
        the spare column); update the stop automaton, budgets and finished flags; set the
        tokens the next forward feeds. No host sync."""
        tok, logp = _sample(logits, mode, self.temperature, self.top_p)
        done = self.done[:B]
        live = ~done
        n_out = self.n_out[:B]
        col = torch.where(live, n_out, self._out_cap)
        rows = torch.arange(B, device=logits.device)
        self.out_tok[rows, col] = tok
        if logp is not None:
            self.out_lp[rows, col] = logp
        n_out.add_(live.long())
        state = self.state[:B]
        nxt = table[state, tok]
        stop = live & ((nxt == table.shape[0] - 1) | (n_out >= self.budget[:B]))
        state.copy_(torch.where(live, nxt, state))
        done.logical_or_(stop)
        feed = live & ~stop
        self.fed[:B].copy_(feed)
        self.tok_in[:B].copy_(torch.where(feed, tok, self.pad_id))

    def _step(self, B: int, width: int, mode: str, table: torch.Tensor) -> None:
        """One decoding step for the cache's first B rows, attending to `width` columns."""
        logits = self.lean.decode(self.tok_in[:B], self.pos[:B], self.kc, self.vc, width)
        self.pos[:B].add_(self.fed[:B].long())
        self._advance(logits, B, mode, table)

    def graphs_state(self, prefix: str = "") -> str:
        """What decoded, for a bench's figures: `graphs=N graphs_failed=0|1` (N steps held
        captured; 1: a capture failed and the steps ran eagerly), `graphs=off` without CUDA
        graphs; each key after `prefix`. A figure after a failed capture is eager speed."""
        if self._graphs is None:
            return f"{prefix}graphs=off"
        return (f"{prefix}graphs={len(self._graphs._graphs)} "
                f"{prefix}graphs_failed={int(self._graphs.failed is not None)}")

    # ---- one turn
    @torch.no_grad()
    def generate(self, contexts: list[list[int]], max_new_tokens: int, sampling: Sampling,
                 keys: Sequence[Hashable] | None = None) -> list[Generated]:
        if self._session is not None:   # it would overwrite the session's decoding state
            raise RuntimeError("generate: a continuous session is open (reset ends it)")
        if not contexts or max_new_tokens <= 0:
            return [Generated() for _ in contexts]
        keys = list(keys) if keys is not None else None
        if keys is not None and len(set(keys)) != len(keys):
            raise ValueError("keys must be unique: one per episode")
        contexts = [list(c) for c in contexts]
        if min(map(len, contexts)) == 0:
            raise ValueError("a context must hold at least one token")
        longest = max(map(len, contexts))
        if longest >= self.max_len:   # rare (a self-search block's head past the budget)
            self._widen(longest + max_new_tokens)
        if self.lean.sync(self.model) and self._graphs is not None:   # weights replaced
            self._graphs.clear()
        n = len(contexts)
        self._ensure(n, max_new_tokens)
        table = self._table(self.stop_strings + tuple(sampling.stop))
        rows, starts, copies, B = self._place(contexts, keys)
        logits = self._prefill(contexts, rows, starts, copies)
        for i, r in enumerate(rows):
            self._seen[r] = contexts[i]
        # the decoding state of rows [0, B): rows of other episodes are finished from the
        # start (they write only past their own length, which their next prefill overwrites)
        in_call = dict(zip(rows, range(n)))
        budgets = [min(max_new_tokens, self.max_len - len(c)) for c in contexts]
        host = torch.tensor([[len(self._seen[r]), r not in in_call,
                              budgets[in_call[r]] if r in in_call else 0] for r in range(B)],
                            dtype=torch.long)
        dev = self.device
        host = host.to(dev)
        self.pos[:B].copy_(host[:, 0])
        self.done[:B].copy_(host[:, 1].bool())
        self.budget[:B].copy_(host[:, 2])
        for t in (self.n_out, self.state):
            t[:B].zero_()
        self.fed[:B].zero_()
        self.temperature.fill_(float(sampling.temperature))
        self.top_p.fill_(float(sampling.top_p))
        mode = _mode(sampling)
        first = torch.zeros((B, self.lean.vocab), dtype=torch.float32, device=dev)
        first[torch.tensor(rows, device=dev)] = logits
        self._advance(first, B, mode, table)
        del first, logits
        start = longest
        for step in range(max(budgets) - 1):
            if step % self.sync_every == 0 and bool(self.done[:B].all()):
                break
            width = min(self.max_len + 1, -(-(start + step + 1) // self.width_step)
                        * self.width_step)
            if self._graphs is None:
                self._step(B, width, mode, table)
            else:
                self._graphs.run((B, width, mode, id(table)),
                                 lambda w=width: self._step(B, w, mode, table))
        counts = self.n_out[:B].tolist()
        lengths = self.pos[:B].tolist()
        most = max(counts[r] for r in rows)
        toks = self.out_tok[:B, :most].tolist()
        lps = self.out_lp[:B, :most].tolist() if mode != "greedy" else None
        results = []
        for i, r in enumerate(rows):
            m = counts[r]
            new = toks[r][:m]
            results.append(Generated(new, None if lps is None else lps[r][:m]))
            self._seen[r] = (contexts[i] + new)[:lengths[r]]   # all but the unfed last token
        if keys is None:   # nothing to keep: the rows are free for the next call
            for r in rows:
                self._keys[r] = None
        return results

    # ---- continuous batching: rows join and leave the decoding batch one by one
    def open(self, capacity: int, max_new_tokens: int, sampling: Sampling) -> None:
        """Start a continuous session: up to `capacity` episodes hold rows at once, turns
        of at most `max_new_tokens`, one `sampling` (its stop strings) for every row.
        `admit` rows, `run` until some turns end, `release` finished episodes' rows;
        `reset` ends it (`generate` is refused meanwhile). Cached episodes are forgotten.

        Greedy turns are `generate`'s tokens. Sampled turns follow the same rule, but the
        random draws fall to rows in another order than turn-by-turn batches give them,
        so they differ from `generate`'s; for a fixed torch seed they are reproducible."""
        self.reset()
        if self.lean.sync(self.model) and self._graphs is not None:
            self._graphs.clear()
        self._ensure(capacity, max_new_tokens)
        self.done.fill_(True)   # no row decodes until admitted
        self.fed.zero_()
        self.tok_in.fill_(self.pad_id)
        self.temperature.fill_(float(sampling.temperature))
        self.top_p.fill_(float(sampling.top_p))
        self._session = (_mode(sampling), self._table(self.stop_strings + tuple(sampling.stop)))
        self._top = 0

    def admit(self, keys: Sequence[Hashable], contexts: Sequence[Sequence[int]],
              budgets: Sequence[int]) -> None:
        """Rows join the decoding batch, each for a turn of at most its budget: an
        episode's row keeps the tokens that agree with its context, a new key takes the
        lowest free row (keeping the decoding bucket small), and equal new contexts are
        prefilled once. All but a context's last token are prefilled here; the last is
        the row's first decoding step (its logits the prefill's up to rounding), so no
        other row's decoding state is touched."""
        if self._session is None:
            raise RuntimeError("admit: no continuous session (open one first)")
        keys, contexts = list(keys), [list(c) for c in contexts]
        if not contexts:
            return
        if len(set(keys)) != len(keys) or not len(keys) == len(contexts) == len(budgets):
            raise ValueError("admit: one unique key and one budget per context")
        if min(map(len, contexts)) == 0 or min(budgets) <= 0:
            raise ValueError("admit: a context needs a token and a turn a positive budget")
        longest = max(map(len, contexts))
        if longest >= self.max_len:
            self._widen(longest + self._out_cap)
        free = (r for r in range(self._rows) if self._keys[r] is None)
        rows, starts, copies, first_of = [], [], [], {}
        for i, (k, c) in enumerate(zip(keys, contexts)):
            r = self._row_of.get(k)
            if r is None:
                r = next(free, None)
                if r is None:
                    raise RuntimeError(f"admit: all {self._rows} rows are held; release some")
                self._keys[r], self._seen[r], self._row_of[k] = k, [], r
                starts.append(0)
                src = first_of.setdefault(tuple(c), i)
                if src != i:
                    copies.append((i, src))
            elif r in self._live:
                raise ValueError(f"admit: {k!r} is decoding already")
            else:
                starts.append(min(_common(self._seen[r], c), len(c) - 1))
            rows.append(r)
        todo = [i for i in range(len(contexts)) if len(contexts[i]) - 1 > starts[i]]
        if todo:
            at = {i: j for j, i in enumerate(todo)}
            self._prefill([contexts[i][:-1] for i in todo], [rows[i] for i in todo],
                          [starts[i] for i in todo],
                          [(at[i], at[s]) for i, s in copies if i in at])
        for r, c in zip(rows, contexts):
            self._live[r] = c
        host = torch.tensor([[len(c) - 1, c[-1], min(b, self._out_cap, self.max_len - len(c))]
                             for c, b in zip(contexts, budgets)], dtype=torch.long)
        host, idx = host.to(self.device), torch.tensor(rows, device=self.device)
        self.pos[idx], self.tok_in[idx], self.budget[idx] = host[:, 0], host[:, 1], host[:, 2]
        self.fed[idx], self.done[idx] = True, False
        self.n_out[idx], self.state[idx] = 0, 0
        self._top = max(self._top, longest - 1)

    @torch.no_grad()
    def run(self) -> list[tuple[Hashable, Generated]]:
        """Decode the admitted rows, reading their finished flags every `sync_every`
        steps, until some turns end: those rows' (key, turn), each turn as `generate`
        gives it. An ended row decodes no more (its cache, all but the last token, waits
        for its next admission); [] when no row decodes."""
        if not self._live:
            return []
        mode, table = self._session
        while True:
            B = _pow2(max(self._live) + 1)   # rows past the last decoding one stay out
            for s in range(self.sync_every):
                width = min(self.max_len + 1,
                            -(-(self._top + s + 1) // self.width_step) * self.width_step)
                if self._graphs is None:
                    self._step(B, width, mode, table)
                else:
                    self._graphs.run((B, width, mode, id(table)),
                                     lambda w=width, b=B: self._step(b, w, mode, table))
            done, counts, pos = torch.stack(
                (self.done[:B].long(), self.n_out[:B], self.pos[:B])).tolist()
            ended = [r for r in self._live if done[r]]
            self._top = max((pos[r] for r in self._live if not done[r]), default=0)
            if ended:
                break
        most = max(counts[r] for r in ended)
        idx = torch.tensor(ended, device=self.device)
        toks = self.out_tok[idx, :most].tolist()
        lps = self.out_lp[idx, :most].tolist() if mode != "greedy" else None
        out = []
        for j, r in enumerate(ended):
            new = toks[j][:counts[r]]
            self._seen[r] = (self._live.pop(r) + new)[:pos[r]]   # all but the unfed last token
            out.append((self._keys[r], Generated(new, None if lps is None
                                                 else lps[j][:counts[r]])))
        return out

    def release(self, key: Hashable) -> None:
        """Free `key`'s row for another episode (a decoding row stops at once)."""
        r = self._row_of.pop(key, None)
        if r is None:
            return
        if self._live.pop(r, None) is not None:
            self.done[r] = True
        self._keys[r], self._seen[r] = None, []


# ---------------------------------------------------------------- CUDA graphs (CUDA only)
class _CudaGraphs:
    """One captured decoding step per key (batch bucket, width bucket, sampling mode, stop
    table). A key met the first time runs eagerly on a side stream (lazy initialisations
    happen outside any capture); the second time it is captured, then replayed. All graphs
    share one memory pool (they never run at once). The step reads and writes only buffers
    that live as long as the graphs (cache, state, weights); `clear` when any is replaced.

    A capture that fails (a kernel or library that syncs or allocates outside the pool, an
    old driver) turns graphs off for this backend with one warning: every later step runs
    eagerly, the same tokens at eager speed, instead of a rollout that stops.

    While a step is captured, the default CUDA generator belongs to the capture (torch <
    2.12): work on another thread (a tool's) must not draw from it, or the draw fails."""

    def __init__(self):
        self._graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self._warm: set[tuple] = set()
        self._pool = None
        self.failed: str | None = None   # why capturing was given up, once it was

    def clear(self) -> None:
        self._graphs.clear()
        self._warm.clear()
        self._pool = None

    def run(self, key: tuple, step) -> None:
        if self.failed is not None:
            step()
            return
        graph = self._graphs.get(key)
        if graph is None:
            if key not in self._warm:
                self._warm.add(key)
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    step()
                torch.cuda.current_stream().wait_stream(side)
                return
            graph = torch.cuda.CUDAGraph()
            # the pool named up front: a failed capture's pool must be handed back by name
            pool = self._pool if self._pool is not None else torch.cuda.graph_pool_handle()
            stream = torch.cuda.current_stream()
            try:
                # thread_local: the rollout's tool thread may run a retriever or ranker on
                # the GPU while a step is captured; under the default (global) mode CUDA
                # refuses that thread's allocations and syncs for the length of the capture
                with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                    step()
            except RuntimeError as err:
                self._give_up(err, stream, pool)
                # a capture records kernels without running them, so the step's buffers are
                # as they were: the same step run eagerly makes up for it
                step()
                return
            self._pool = pool
            self._graphs[key] = graph
        graph.replay()

    def _give_up(self, err: BaseException, stream, pool) -> None:
        """Graphs off after a failed capture, with CUDA as it was before it: when
        cudaStreamEndCapture fails, torch.cuda.graph leaves its capture stream current, the
        allocator routing this thread's allocations to the pool, and (torch < 2.12) the
        default generator capturing."""
        while err.__context__ is not None:   # the step's own error, not capture_end's
            err = err.__context__
        self.failed = f"{type(err).__name__}: {err}".splitlines()[0]
        torch.cuda.set_stream(stream)
        device = torch.cuda.current_device()
        for hand_back in (torch._C._cuda_endAllocateToPool, torch._C._cuda_releasePool):
            try:
                hand_back(device, pool)
            except RuntimeError:   # capture_end got as far as this itself
                pass
        # before torch 2.12 the device's default generator stays in capture mode too, and
        # every later random draw on it fails ("Offset increment outside graph capture"):
        # it gets a clone of its state (the same seed and offset), which is not
        generator = torch.cuda.default_generators[device]
        try:
            generator.graphsafe_set_state(generator.clone_state())
        except (AttributeError, RuntimeError):   # a torch without graph-safe generators
            pass
        self.clear()
        torch.cuda.synchronize()
        warnings.warn(f"CUDA graph capture failed ({self.failed}); the static backend "
                      "decodes eagerly from here on", RuntimeWarning, stacklevel=3)


# ---------------------------------------------------------------- the factory's entry
def static_backend(model, tokenizer, *, stop_strings: tuple[str, ...] = STOP_STRINGS,
                   max_len: int = 4096, attention: str = "default", **options) -> Backend:
    """A `StaticBackend`, or (with a warning saying why) `HFBackend` where the lean forward
    does not run this model or its logits differ from HF's on the probe."""
    from seekrl.models import ModelError

    try:
        return StaticBackend(model, tokenizer, stop_strings=stop_strings, max_len=max_len,
                             **options)
    except (ModelError, LeanMismatch) as err:
        why = str(err)
    warnings.warn(f"{why}; decoding with seekrl's HF loop instead", stacklevel=2)
    return HFBackend(model, tokenizer, stop_strings=stop_strings, attention=attention)
