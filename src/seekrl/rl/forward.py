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

import torch
from torch import nn

from seekrl.models import (
    backbone,
    causal_lm,
    check_window,
    collate,
    hidden_states,
    logit_transform,
    shared_prompts,
    suffix_hidden,
)


def masked_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    mask: torch.Tensor, *, temperature: float = 1.0,
                    entropy: bool | str = False, value_head: nn.Module | None = None,
                    share_prompts: bool = True) -> dict[str, torch.Tensor]:
    """{"logprobs": ..., "entropy": ... (if asked), "values": ... (with a value head)}.
    `entropy="detached"` gives the entropy as a figure, outside autograd: one in the graph
    keeps a [tokens, vocabulary] tensor alive until the backward pass, for nothing when
    no entropy bonus is trained.

    `values` come from the value head on the *detached* hidden states: the critic shares
    the policy's features but its loss never moves the policy."""
    check_window(model, input_ids.shape[1])
    sel = mask[:, 1:].bool()                       # token t is predicted at t - 1
    # under activation checkpointing a training pass cannot share (no cache): the old
    # log-probs, taken in eval mode, then read every row whole too, so that the first
    # PPO ratio is 1 to the last bit
    share_prompts = share_prompts and not getattr(backbone(model), "gradient_checkpointing", False)
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
        with torch.set_grad_enabled(torch.is_grad_enabled() and entropy != "detached"):
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


@torch.no_grad()
def logprobs_in_chunks(model, trajs, pad_id: int, device: str, *, temperature: float,
                       chunk: int, max_tokens: int | None = None,
                       value_head: nn.Module | None = None, share_prompts: bool = False
                       ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """Per-trajectory log-probs of the policy tokens (and the value head's values, when
    given), in chunks of `chunk` episodes and at most `max_tokens` padded tokens."""
    from seekrl.rl.sampling import split_micro_batches

    logps: list[torch.Tensor] = []
    values: list[torch.Tensor] | None = [] if value_head is not None else None
    model.eval()
    for positions in split_micro_batches([len(t.token_ids) for t in trajs], chunk, max_tokens):
        part = [trajs[p] for p in positions]
        ids, attn, mask = collate([t.token_ids for t in part], [t.loss_mask for t in part],
                                  pad_id, device)
        out = masked_logprobs(model, ids, attn, mask, temperature=temperature,
                              value_head=value_head, share_prompts=share_prompts)
        for row, t in enumerate(part):
            logps.append(out["logprobs"][row, :len(t.token_ids)].cpu())
            if values is not None:
                values.append(out["values"][row, :len(t.token_ids)].cpu())
    return logps, values

