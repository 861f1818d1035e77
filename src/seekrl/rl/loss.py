"""Policy-gradient losses as pure tensor functions with explicit masks.

All inputs are `[batch, seq]` tensors aligned with the trajectories' `token_ids` (the log
probability of token t given tokens < t), and `mask` is the loss mask: 1 only on tokens the
policy generated. Every quantity is multiplied by the mask before it is reduced, so the
prompt and the retrieved documents contribute nothing and get exactly zero gradient.
"""

from __future__ import annotations

import torch

from seekrl.plugins import Registry

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                "seq-mean-token-sum-norm")


LOG_RATIO_CLAMP = 20.0   # verl's bound on a log-ratio before exp


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean",
              norm_length: int | None = None) -> torch.Tensor:
    """Reduce per-token values to a scalar.

    token-mean: over all policy tokens of the batch (DAPO); seq-mean-token-mean: per
    sequence then over sequences (GRPO's original); seq-mean-token-sum: sum per sequence;
    seq-mean-token-sum-norm: sum per sequence divided by a constant length (Dr. GRPO, so a
    long wrong answer is not penalised less per token than a short one)."""
    mask = mask.to(values.dtype)
    masked = values * mask
    if mode == "token-mean":
        return masked.sum() / mask.sum().clamp(min=1.0)
    per_seq_sum = masked.sum(-1)
    if mode == "seq-mean-token-mean":
        return (per_seq_sum / mask.sum(-1).clamp(min=1.0)).mean()
    if mode == "seq-mean-token-sum":
        return per_seq_sum.mean()
    if mode == "seq-mean-token-sum-norm":
        length = norm_length if norm_length is not None else values.shape[-1]
        return per_seq_sum.mean() / length
    raise ValueError(f"loss aggregation: expected one of {', '.join(AGGREGATIONS)}, got {mode!r}")


def policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, *, clip_low: float = 0.2, clip_high: float = 0.28,
                clip_c: float | None = 3.0, agg: str = "token-mean",
                norm_length: int | None = None, token_weights: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate with separate low / high ranges (clip-higher, DAPO) and dual
    clipping (Ye et al., 2020): for a negative advantage the clipped surrogate
    max(-A r, -A clip(r)) grows without bound in the ratio (A = -1, r = 50: 50), so it is
    capped at -A * clip_c (3 by default, as in verl). That only matters once the policy has
    moved away from the one that sampled: several epochs or mini-batches per batch.

    `token_weights` (no gradient) scale each token's surrogate: truncated importance sampling
    between the rollout engine and the trainer (`tis_weights`).

    Returns the loss and its diagnostics: clip fraction, dual-clip fraction, approximate KL
    to the old policy (k3), and the mean ratio, all over policy tokens."""
    if clip_c is not None and clip_c <= 1.0:
        raise ValueError(f"clip_c: expected a value > 1 (or None), got {clip_c}")
    # masked first: no inf * 0 at padding; clamped as verl does, so a token whose
    # probability moved by more than e^20 gives a finite ratio (exp overflowed to inf, and
    # the clipped branch's zero gradient times inf made the micro-batch's gradient NaN)
    log_ratio = ((logprobs - old_logprobs) * mask).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    dual = torch.zeros_like(per_token, dtype=torch.bool)
    if clip_c is not None:
        cap = -advantages * clip_c
        dual = (advantages < 0) & (per_token > cap)
        per_token = torch.where(dual, cap, per_token)
    if token_weights is not None:
        per_token = per_token * token_weights.detach()
    loss = aggregate(per_token, mask, agg, norm_length)
    with torch.no_grad():
        m = mask.to(ratio.dtype)
        n = m.sum().clamp(min=1.0)
        stats = {
            "clip_frac": float(((clipped > unclipped).to(m.dtype) * m).sum() / n),
            "dual_clip_frac": float((dual.to(m.dtype) * m).sum() / n),
            "approx_kl": float((((ratio - 1) - log_ratio) * m).sum() / n),
            "ratio_mean": float((ratio * m).sum() / n),
        }
    return loss, stats


# policy losses by name (`algo.policy_loss`), as the advantage estimators are: each takes
# (logprobs, old_logprobs, advantages, mask) and the update's keywords (clip_low,
# clip_high, clip_c, agg, norm_length, token_weights) and returns (loss, figures)
POLICY_LOSSES: Registry = Registry("policy loss", key="algo.policy_loss")
POLICY_LOSSES.add("ppo_clip", policy_loss)


def tis_weights(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor,
                cap: float) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated importance sampling (Yao et al., 2025): the rollout engine sampled from
    pi_rollout, the trainer's own log-probs of the same policy give pi_old, and the two
    differ numerically (another kernel, another precision, vLLM). Weighting each token's
    policy gradient by min(pi_old / pi_rollout, cap) corrects for the gap; the cap bounds
    the variance. Returns the weights (1 off the mask) and their mean and clipped share."""
    if cap <= 0:
        raise ValueError(f"tis_cap: expected a positive cap, got {cap}")
    with torch.no_grad():
        raw = torch.exp((old_logprobs - rollout_logprobs) * mask)
        weights = torch.where(mask.bool(), raw.clamp(max=cap), torch.ones_like(raw))
        m = mask.to(raw.dtype)
        n = m.sum().clamp(min=1.0)
        stats = {"tis_weight": float((weights * m).sum() / n),
                 "tis_clip_frac": float(((raw > cap).to(m.dtype) * m).sum() / n)}
    return weights, stats


KL_CLAMP = 10.0


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k3"
               ) -> torch.Tensor:
    """Per-token KL(policy || reference) estimates (Schulman's k1 and k3).

    k1 = log p - log q: unbiased as a *value*, so it belongs in the reward (it is what
    `algo.kl_in_reward` subtracts). As a loss term it regularises nothing: its gradient is
    grad log p, whose expectation under the sampling policy is zero.
    k3 = q/p - 1 - log(q/p), with q/p = exp(log q - log p): always >= 0, lower variance. Its
    gradient is (1 - q/p) grad log p, which pushes log p down where the policy puts more
    mass than the reference (q/p < 1) and up where less: a real pull towards the reference
    (in expectation the gradient of KL(q || p), the reverse KL, as analysed by Tang & Munos
    2025). Both are clamped to [-10, 10], so one token whose probability collapsed cannot
    dominate the batch: k3 as verl's `low_var_kl`; k1 here only (verl's is unclamped), which
    matters for `kl_in_reward` alone."""
    diff = logprobs - ref_logprobs
    if kind == "k1":
        return diff.clamp(-KL_CLAMP, KL_CLAMP)
    if kind == "k3":   # the exponent clamped first, as verl's low_var_kl: exp(94) is inf in
        # float32, and the output clamp's zero gradient times inf is NaN
        diff = diff.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return (torch.exp(-diff) - 1 + diff).clamp(-KL_CLAMP, KL_CLAMP)
    raise ValueError(f"kl estimator: expected 'k1' or 'k3', got {kind!r}")


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
               mask: torch.Tensor, *, clip: float | None = 0.2, agg: str = "token-mean",
               norm_length: int | None = None) -> torch.Tensor:
    """The critic's loss on policy tokens only: 0.5 * max of clipped / unclipped squared
    error (PPO's value clipping; `clip=None` turns it off)."""
    err = (values - returns) ** 2
    if clip is not None:
        clipped = old_values + torch.clamp(values - old_values, -clip, clip)
        err = torch.maximum(err, (clipped - returns) ** 2)
    return 0.5 * aggregate(err, mask, agg, norm_length)


def llds_penalty(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                 mask: torch.Tensor, actions: torch.Tensor, *, gate: str = "action",
                 agg: str = "token-mean", norm_length: int | None = None
                 ) -> tuple[torch.Tensor, dict[str, float]]:
    """LLDS, the likelihood-preserving term against lazy likelihood displacement (Deng et
    al., 2025): on actions the update should not make less likely (a non-negative
    advantage) whose likelihood has fallen below the sampling policy's, each token whose
    log-prob fell pays what it lost, max(0, log pi_old - log pi). Tokens whose log-prob
    rose, and actions whose likelihood did not fall, get no gradient from it.

    `actions` ([batch, seq], long): which action (model turn) each policy token belongs to;
    `gate`: `action`, an action's own likelihood decides (the paper's best), or `response`,
    the whole episode's. The old log-probs are the sampling policy's: the term is zero
    until an update has moved the policy (several mini-batches or epochs per batch).
    Returns the aggregated term and the share of policy tokens it regularised."""
    if gate not in ("action", "response"):
        raise ValueError(f"llds gate: expected action or response, got {gate!r}")
    mask = mask.to(logprobs.dtype)
    drop = ((old_logprobs - logprobs) * mask).detach()   # > 0 where a token lost likelihood
    if gate == "response":
        fell = drop.sum(-1, keepdim=True) > 0
    else:   # an action's summed drop, read back on each of its tokens
        groups = (actions.clamp(min=0) + 1) * (actions >= 0)   # 0: no action
        width = int(groups.max()) + 1 if groups.numel() else 1
        per_action = torch.zeros(drop.shape[0], width, dtype=drop.dtype, device=drop.device)
        per_action.scatter_add_(1, groups, drop)
        fell = (per_action.gather(1, groups) > 0) & (groups > 0)
    chosen = mask * (fell & (advantages >= 0) & (drop > 0)).to(mask.dtype)
    term = torch.relu(old_logprobs - logprobs) * chosen
    loss = aggregate(term, mask, agg, norm_length)
    share = float(chosen.sum() / mask.sum().clamp(min=1.0))
    return loss, {"llds": float(loss.detach()), "llds_frac": share}
