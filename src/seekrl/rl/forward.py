"""The model-facing half of training: batches of episodes in, per-token log-probs out.

The language-model head is applied only at the positions that are trained (the policy's
own tokens), never to the whole `[batch, seq, vocab]` grid: with a 49k vocabulary and
episodes of a thousand tokens, of which a tenth are the policy's, that is the difference
between a few hundred megabytes and several gigabytes per micro-batch.

Every returned tensor is `[batch, seq]` and aligned with `token_ids`: position t holds the
quantity for token t (predicted from the hidden state at t - 1), zero where `mask` is 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


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


def _causal_lm(model) -> nn.Module:
    """The transformers causal LM under a peft wrapper (or the model itself)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def hidden_states(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The last hidden layer, [batch, seq, hidden], without the LM head."""
    lm = _causal_lm(model)
    backbone = getattr(lm, lm.base_model_prefix)
    return backbone(input_ids=input_ids, attention_mask=attention_mask,
                    use_cache=False).last_hidden_state


def masked_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    mask: torch.Tensor, *, temperature: float = 1.0, entropy: bool = False,
                    value_head: nn.Module | None = None) -> dict[str, torch.Tensor]:
    """{"logprobs": ..., "entropy": ... (if asked), "values": ... (with a value head)}.

    `values` come from the value head on the *detached* hidden states: the critic shares
    the policy's features but its loss never moves the policy."""
    h = hidden_states(model, input_ids, attention_mask)
    sel = mask[:, 1:].bool()                       # token t is predicted at t - 1
    picked = h[:, :-1][sel]                        # [n_policy_tokens, hidden]
    logits = _causal_lm(model).get_output_embeddings()(picked).float()
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
