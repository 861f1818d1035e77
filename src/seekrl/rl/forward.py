"""The model-facing half of training: batches of episodes in, per-token log-probs out.

The language-model head is applied only at the positions that are trained (the policy's
own tokens), never to the whole `[batch, seq, vocab]` grid: with a 49k vocabulary and
episodes of a thousand tokens, of which a tenth are the policy's, that is the difference
between a few hundred megabytes and several gigabytes per micro-batch.

Every returned tensor is `[batch, seq]` and aligned with `token_ids`: position t holds the
quantity for token t (predicted from the hidden state at t - 1), zero where `mask` is 0.

The G rollouts of a question start with the same prompt. When rows of a batch share their
prompt, the prompt runs through the model once and its KV cache is repeated for each row
(`share_prompts`, on by default): the same function of the weights, with gradients summed
back into the one prompt pass, for a fraction of the work (single-turn episodes are mostly
prompt).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from seekrl.models import (
    backbone,
    cache_kwarg,
    causal_lm,
    check_positions,
    check_window,
    logit_transform,
    output_cache,
)


def collate(token_ids: Sequence[Sequence[int]], masks: Sequence[Sequence[int]], pad_id: int,
            device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (input_ids, attention_mask, loss_mask), each [batch, longest]."""
    width = max(len(t) for t in token_ids)
    ids = torch.full((len(token_ids), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(token_ids), width), dtype=torch.long)
    loss = torch.zeros((len(token_ids), width), dtype=torch.float32)
    for row, (t, m) in enumerate(zip(token_ids, masks)):
        ids[row, :len(t)] = torch.tensor(t, dtype=torch.long)
        attn[row, :len(t)] = 1
        loss[row, :len(m)] = torch.tensor(m, dtype=torch.float32)
    return ids.to(device), attn.to(device), loss.to(device)


def hidden_states(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The last hidden layer, [batch, seq, hidden], without the LM head."""
    return backbone(model)(input_ids=input_ids, attention_mask=attention_mask,
                            use_cache=False).last_hidden_state


def shared_prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor, mask: torch.Tensor
                   ) -> tuple[list[int], list[int]] | None:
    """(cut, prompt index) per row when some rows share a prompt, else None. Rows are
    right-padded, as `collate` makes them.

    A row's prompt is everything before the hidden state that predicts its first policy
    token (`cut` tokens); rows with equal prompts get the same index. None when no two rows
    share one or a row has no prompt to share (then there is nothing to save)."""
    lengths = attention_mask.sum(-1).tolist()
    first = torch.where(mask.bool().any(-1), mask.bool().float().argmax(-1),
                        attention_mask.sum(-1)).tolist()
    cuts, index, seen = [], [], {}
    ids = input_ids.tolist()
    for row, (p, n) in enumerate(zip(first, lengths)):
        cut = min(p, n) - 1                        # the suffix starts at token p - 1
        if cut <= 0:
            return None
        cuts.append(cut)
        index.append(seen.setdefault(tuple(ids[row][:cut]), len(seen)))
    return (cuts, index) if len(seen) < len(cuts) else None


def suffix_hidden(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   cuts: list[int], index: list[int]) -> torch.Tensor | None:
    """Hidden states of each row from its cut on, [batch, longest suffix, hidden], with each
    distinct prompt run once (right-padded) and its KV cache repeated for the rows that
    share it. Position ids are explicit: a suffix continues at its own prompt's length.
    None when the model returned no cache (activation checkpointing turns it off)."""
    dev = input_ids.device
    check_positions(model)
    body = backbone(model)
    if body.training and getattr(body, "gradient_checkpointing", False):
        return None   # HF models return no cache then: skip the prompt pass, not waste it
    lengths = attention_mask.sum(-1).tolist()
    prompt_of = {u: r for r, u in reversed(list(enumerate(index)))}   # first row per prompt
    n_prompts = len(prompt_of)
    width = max(cuts)
    p_ids = input_ids.new_zeros((n_prompts, width))
    p_mask = attention_mask.new_zeros((n_prompts, width))
    for u in range(n_prompts):
        r = prompt_of[u]
        p_ids[u, :cuts[r]] = input_ids[r, :cuts[r]]
        p_mask[u, :cuts[r]] = 1
    cache = output_cache(body(   # the model's own kind of cache
        input_ids=p_ids, attention_mask=p_mask, use_cache=True,
        position_ids=torch.arange(width, device=dev)[None].expand(n_prompts, -1)))
    if cache is None:
        return None
    cache.reorder_cache(torch.tensor(index, dtype=torch.long, device=dev))   # a row per episode

    s_width = max(n - c for n, c in zip(lengths, cuts))
    s_ids = input_ids.new_zeros((len(cuts), s_width))
    s_mask = attention_mask.new_zeros((len(cuts), s_width))
    for r, (n, c) in enumerate(zip(lengths, cuts)):
        s_ids[r, :n - c] = input_ids[r, c:n]
        s_mask[r, :n - c] = 1
    positions = torch.tensor(cuts, device=dev)[:, None] + torch.arange(s_width, device=dev)
    full_mask = torch.cat([p_mask[torch.tensor(index, device=dev)], s_mask], dim=1)
    return body(input_ids=s_ids, attention_mask=full_mask, position_ids=positions,
                use_cache=True, **{cache_kwarg(body): cache}).last_hidden_state


def masked_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    mask: torch.Tensor, *, temperature: float = 1.0, entropy: bool = False,
                    value_head: nn.Module | None = None,
                    share_prompts: bool = True) -> dict[str, torch.Tensor]:
    """{"logprobs": ..., "entropy": ... (if asked), "values": ... (with a value head)}.

    `values` come from the value head on the *detached* hidden states: the critic shares
    the policy's features but its loss never moves the policy."""
    check_window(model, input_ids.shape[1])
    sel = mask[:, 1:].bool()                       # token t is predicted at t - 1
    shared = shared_prompts(input_ids, attention_mask, mask) if share_prompts else None
    h = suffix_hidden(model, input_ids, attention_mask, *shared) if shared else None
    if h is None:
        picked = hidden_states(model, input_ids, attention_mask)[:, :-1][sel]
    else:  # the same rows and positions, read from the suffix pass (row-major order kept)
        cuts = shared[0]
        s_sel = torch.zeros(h.shape[:2], dtype=torch.bool, device=h.device)
        for r, c in enumerate(cuts):
            part = sel[r, c:c + h.shape[1]]
            s_sel[r, :part.shape[0]] = part
        picked = h[s_sel]                          # [n_policy_tokens, hidden]
    logits = causal_lm(model).get_output_embeddings()(picked).float()
    transform = logit_transform(model)   # soft-capping / logit scale, as the sampler saw
    if transform is not None:
        logits = transform(logits)
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    targets = input_ids[:, 1:][sel]
    out = {"logprobs": _scatter(sel, logp_all.gather(-1, targets[:, None]).squeeze(-1))}
    if entropy:
        out["entropy"] = _scatter(sel, -(logp_all.exp() * logp_all).sum(-1))
    if value_head is not None:
        out["values"] = _scatter(sel, value_head(picked.detach().float()).squeeze(-1))
    return out


def _scatter(sel: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Per-token values back into a [batch, seq] grid, with a zero column for position 0."""
    grid = torch.zeros(sel.shape, dtype=values.dtype, device=values.device)
    grid = grid.masked_scatter(sel, values)
    return torch.cat([grid.new_zeros((sel.shape[0], 1)), grid], dim=1)


class ValueHead(nn.Module):
    """PPO's critic: a small MLP on the policy's last hidden state."""

    def __init__(self, hidden_size: int, width: int = 256):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(hidden_size, width), nn.Tanh(), nn.Linear(width, 1))
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.net(h)


def hidden_size(model) -> int:
    """The width of the model's last hidden state (what a value head reads)."""
    config = getattr(model, "config", None)
    for name in ("hidden_size", "n_embd", "d_model"):
        if config is not None and hasattr(config, name):
            return int(getattr(config, name))
    raise ValueError("cannot tell the model's hidden size for the value head")
