"""The policy update of one RL step: `algo.epochs` passes over the batch in shuffled
mini-batches of `algo.mini_batch_size` episodes, each split into micro-batches whose
gradients add up to the mini-batch's, one optimizer step per mini-batch (as verl's actor
and CleanRL's `ppo.py`). The loss of a micro-batch is composed here: PPO-clip (`rl/loss.py`)
with truncated importance sampling against the rollout's log-probs, an entropy bonus, the
LLDS term, a KL term to the frozen reference and the critic's loss.

The recipe hands in what it owns (the runtime that runs forward passes across processes,
the optimizer step); nothing here reads a config file or a run folder."""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from seekrl.agent.trajectory import Trajectory
from seekrl.models import collate
from seekrl.rl.loss import (
    POLICY_LOSSES,
    aggregate,
    kl_penalty,
    llds_penalty,
    tis_weights,
    value_loss,
)
from seekrl.rl.sampling import split_micro_batches

# the figures that are the loss's own terms, aggregated as the loss is (`algo.loss_agg`):
# a micro-batch's value counts by its share of the mini-batch's loss; every other figure is
# a mean over policy tokens (entropy, clip fractions, approx_kl, kl, ...), so it reads the
# same whatever the micro-batches and mini-batches
LOSS_TERMS = frozenset({"pg_loss", "value_loss", "llds"})
TOKENS = "tokens/"   # token_sums' key of a figure's policy tokens


@dataclass
class UpdateBatch:
    """What the update reads of a step's batch, per episode (log-probs, values and returns
    are None when the run has none)."""
    trajs: Sequence[Trajectory]
    advantages: list[torch.Tensor]
    old_logps: list[torch.Tensor] | None
    ref_logps: list[torch.Tensor] | None
    old_values: list[torch.Tensor] | None
    returns: list[torch.Tensor] | None
    norm_length: int
    old_from_sampler: bool = False   # old_logps are the sampler's (algo.old_logprobs: rollout)


@dataclass
class Probe:
    """What the monitor reads of the update's passes: each right episode's mean log-prob
    at its first pass, and the largest trainer / rollout log-prob gap of a policy token."""
    correct_logps: dict[int, float] = field(default_factory=dict)
    gap_max: float = 0.0
    stepped: bool = False   # an optimizer step was made: the policy is no longer the sampler's


@dataclass
class PolicyUpdate:
    """The update's parts: `algo` (the config's algorithm section), `runtime` (forward
    passes and micro-batch assignment across processes, `rl/distributed.py`), `dist`,
    the critic's `value_head` (None without one), `optimizer_step` (reduce, clip, step;
    returns the gradient norm) and `correct` (whether an episode's answer is right)."""
    algo: Any
    runtime: Any
    dist: Any
    device: str
    pad_id: int
    value_head: torch.nn.Module | None
    optimizer_step: Callable[[], float]
    correct: Callable[[Trajectory], bool]

    def run(self, batch: UpdateBatch, order_rng: random.Random) -> dict[str, Any]:
        """Every pass over `batch`; the figures averaged over mini-batches (the gradient
        norm: the largest), and `correct_logps` for the displacement diagnostic."""
        algo, trajs = self.algo, batch.trajs
        stats: dict[str, list[float]] = defaultdict(list)       # one value per mini-batch
        mini_stats: dict[str, float] = defaultdict(float)
        # the other figures are token means: summed over their policy tokens, divided once
        token_sums: dict[str, float] = defaultdict(float)
        probe = Probe()
        turn = 0   # micro-batches go to the ranks in turn (all to this one in one process)
        scale = self.runtime.loss_scale
        for _ in range(algo.epochs):
            order = list(range(len(trajs)))
            order_rng.shuffle(order)
            # as many optimizer steps as mini-batches of `mini_batch_size` cover the batch,
            # of near-equal sizes: a batch that does not divide (dynamic sampling's, cut to
            # whole groups) would otherwise end on a full step from a few episodes
            parts = -(-len(order) // algo.mini_batch_size)
            bounds = [round(p * len(order) / parts) for p in range(parts + 1)] if parts \
                else []   # an empty batch: no mini-batch, as before
            for lo, hi in zip(bounds, bounds[1:]):
                mini = order[lo:hi]
                if algo.share_prompts:  # a group's episodes in one micro-batch share a
                    # prompt pass; the mini-batch (and so the gradient) stays the same
                    rank = {g: n for n, g in reversed(list(enumerate(
                        trajs[i].group_id for i in mini)))}
                    mini.sort(key=lambda i: rank[trajs[i].group_id])
                mini_tokens = sum(trajs[i].n_generated for i in mini)
                cuts = split_micro_batches([len(trajs[i].token_ids) for i in mini],
                                           algo.micro_batch_size, algo.micro_batch_tokens)
                # this rank's micro-batches; sharded, passes of weight 0 (not `live`) too,
                # so that every rank runs as many as the busiest
                for positions, live in self.runtime.assign(cuts, turn):
                    micro = [mini[p] for p in positions]
                    # each micro-batch's share of the mini-batch's loss, so that the
                    # accumulated gradient equals that of one mini-batch forward
                    tokens = sum(trajs[i].n_generated for i in micro)
                    weight = tokens / max(1, mini_tokens) if algo.loss_agg == "token-mean" \
                        else len(micro) / len(mini)
                    loss, s = self.micro_loss(batch, micro, probe if live else Probe())
                    (loss * (weight * scale if live else 0.0)).backward()
                    for k, v in s.items() if live else ():
                        if k in LOSS_TERMS:   # each one's share, as in the loss
                            mini_stats[k] += v * weight
                        elif tokens:   # a figure a micro-batch lacks is not a 0 there
                            token_sums[k] += v * tokens
                            token_sums[TOKENS + k] += tokens
                turn += len(cuts)
                for k, v in self.dist.sum_values(mini_stats).items():
                    stats[k].append(v)
                mini_stats.clear()
                stats["grad_norm"].append(self.optimizer_step())
                probe.stepped = True
        out: dict[str, Any] = {k: round(sum(v) / len(v), 5) for k, v in stats.items()}
        sums = self.dist.sum_values(token_sums)
        out.update({k: round(v / sums[TOKENS + k], 5) for k, v in sums.items()
                    if not k.startswith(TOKENS)})
        # a non-finite norm skipped its optimizer step: the step's figure says so (max()
        # drops a NaN that is not first, and the monitor then saw a healthy norm)
        norms = stats["grad_norm"]
        out["grad_norm"] = float("nan") if not all(math.isfinite(g) for g in norms) \
            else round(max(norms), 4) if norms else None   # an empty batch: no step
        out["updates"] = len(stats["grad_norm"])   # optimizer steps this batch made
        out["correct_logps"] = {i: lp for part in self.dist.gather([probe.correct_logps])
                                for i, lp in part.items()}
        if "rollout_logp_gap" in out:
            out["rollout_logp_gap_max"] = round(max(self.dist.gather([probe.gap_max])), 5)
        return out

    def micro_loss(self, batch: UpdateBatch, micro: list[int], probe: Probe
                   ) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss of the episodes `micro` of `batch` (and its figures); `probe` collects
        what the monitor reads of the first pass."""
        algo, dev = self.algo, self.device
        trajs, norm_length = batch.trajs, batch.norm_length
        part = [trajs[i] for i in micro]
        ids, attn, mask = collate([t.token_ids for t in part], [t.loss_mask for t in part],
                                  self.pad_id, dev)
        out = self.runtime.forward(ids, attn, mask,
                                   entropy=True if algo.entropy_coef > 0 else "detached")
        logp = out["logprobs"]

        def grid(rows: list[torch.Tensor] | None) -> torch.Tensor | None:
            if rows is None:
                return None
            g = torch.zeros_like(logp)
            for r, i in enumerate(micro):
                g[r, :len(rows[i])] = rows[i].to(dev)
            return g

        adv = grid(batch.advantages)
        old = grid(batch.old_logps) if batch.old_logps is not None else logp.detach()
        # the rollout / training mismatch: the backend's log-probs of the tokens it sampled
        # against the trainer's of the same policy
        behaviour = rollout_grid(part, mask)
        weights, mismatch = None, {}
        # with the sampler's numbers as `old` the gap is the trainer's before its first
        # optimizer step (later passes would add the update's own move)
        if behaviour is not None and not (batch.old_from_sampler and probe.stepped):
            with torch.no_grad():
                trainer = logp.detach() if batch.old_from_sampler else old
                gap = ((trainer - behaviour) * mask).abs()
                mismatch["rollout_logp_gap"] = float(gap.sum() / mask.sum().clamp(min=1))
                probe.gap_max = max(probe.gap_max, float(gap.max()))
            if algo.tis_cap:
                weights, tis = tis_weights(old, behaviour, mask, algo.tis_cap)
                mismatch.update(tis)
        loss_fn = POLICY_LOSSES.lookup(algo.policy_loss, "algo.policy_loss")
        loss, s = loss_fn(logp, old, adv, mask, clip_low=algo.clip_low,
                              clip_high=algo.clip_high, clip_c=algo.clip_ratio_c,
                              agg=algo.loss_agg, norm_length=norm_length,
                              token_weights=weights)
        s.update(mismatch)
        s["entropy"] = float(aggregate(out["entropy"].detach(), mask, "token-mean"))  # to read
        s["pg_loss"] = float(loss.detach())
        if algo.entropy_coef > 0:   # aggregated like the policy loss it is added to
            loss = loss - algo.entropy_coef * aggregate(out["entropy"], mask, algo.loss_agg,
                                                        norm_length)
        if algo.llds_coef > 0:
            llds, llds_stats = llds_penalty(logp, old, adv, mask, action_grid(part, logp),
                                            gate=algo.llds_gate, agg=algo.loss_agg,
                                            norm_length=norm_length)
            s.update(llds_stats)
            loss = loss + algo.llds_coef * llds
        if batch.ref_logps is not None:
            per_token = kl_penalty(logp, grid(batch.ref_logps), algo.kl_estimator)
            kl = aggregate(per_token, mask, algo.loss_agg, norm_length)
            # logged per token whatever the loss's aggregation (as `kl_in_reward` logs it)
            s["kl"] = float(aggregate(per_token.detach(), mask, "token-mean"))
            loss = loss + algo.kl_coef * kl
        if self.value_head is not None:
            returns = grid(batch.returns)
            vl = value_loss(out["values"], grid(batch.old_values), returns, mask,
                            clip=algo.value_clip, agg=algo.loss_agg, norm_length=norm_length)
            s["value_loss"] = float(vl.detach())
            s["explained_var"] = explained_variance(out["values"], returns, mask)
            loss = loss + algo.value_coef * vl
        # for the monitor: the right episodes before the update, so only until the first
        # optimizer step (a later mini-batch's first pass already meets a moved policy)
        with torch.no_grad():
            for r, i in enumerate(micro if not probe.stepped else ()):
                if self.correct(trajs[i]) and i not in probe.correct_logps:
                    n = mask[r].sum().clamp(min=1)
                    probe.correct_logps[i] = float((logp[r] * mask[r]).sum() / n)
        return loss, s


def likelihood_displacement(trajs: Sequence[Trajectory], old_logps, during_update: dict[int, float],
                            correct: Callable[[Trajectory], bool],
                            logprobs_of: Callable[[list[Trajectory]], list[torch.Tensor]],
                            max_episodes: int) -> dict[str, float | None]:
    """How the update moved the likelihood of the episodes it was shown as right:
    `correct_logp`, their mean per-token log-prob before the update (under the policy that
    sampled them), and `correct_logp_shift`, after minus before on the same episodes
    (`logprobs_of` scores them again, at most `max_episodes`: each costs a forward pass). A
    falling likelihood of the positives while the policy learns from them is likelihood
    displacement (Deng et al., 2025), which precedes GRPO's collapse on tool use; comparing
    fresh samples from step to step would measure little more than the policy's entropy."""
    right = [i for i, t in enumerate(trajs) if correct(t) and t.n_generated]
    if not right:
        return {"correct_logp": None, "correct_logp_shift": None}

    def mean_logp(lp, t) -> float:
        return lp[torch.tensor(t.loss_mask, dtype=torch.bool)].mean().item()

    before = {i: mean_logp(old_logps[i], trajs[i]) for i in right} \
        if old_logps is not None else during_update
    measured = [i for i in right if i in before]
    if not measured:
        return {"correct_logp": None, "correct_logp_shift": None}
    out = {"correct_logp": round(sum(before[i] for i in measured) / len(measured), 4),
           "correct_logp_shift": None}
    picked = measured[:max_episodes]
    if picked:
        after = logprobs_of([trajs[i] for i in picked])
        shift = [mean_logp(lp, trajs[i]) - before[i] for i, lp in zip(picked, after)]
        out["correct_logp_shift"] = round(sum(shift) / len(shift), 5)
    return out


def action_grid(part: Sequence[Trajectory], like: torch.Tensor) -> torch.Tensor:
    """Which step (model turn) each token of the micro-batch belongs to, laid out like
    `like` ([rows, seq]); -1 outside every step."""
    out = torch.full(like.shape, -1, dtype=torch.long, device=like.device)
    for r, t in enumerate(part):
        for k, step in enumerate(t.steps):
            out[r, step.start:step.end] = k
    return out


def rollout_grid(part: Sequence[Trajectory], mask: torch.Tensor) -> torch.Tensor | None:
    """The episodes' behaviour log-probs laid out like the trainer's ([rows, seq], at each
    policy token's position); None when any episode has none. `mask` is the batch's loss
    mask, whose 1s are the episodes' policy tokens row by row, in order."""
    if any(t.rollout_logprobs is None for t in part):
        return None
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    out[mask.bool()] = torch.tensor([x for t in part for x in t.rollout_logprobs],
                                    dtype=torch.float32, device=mask.device)
    return out


def sampler_logprobs(trajs: Sequence[Trajectory]) -> list[torch.Tensor] | None:
    """The episodes' behaviour log-probs laid out as `logprobs_in_chunks` lays out the
    trainer's (one tensor per episode over its tokens, 0 off the policy tokens): the
    old log-probs of algo.old_logprobs: rollout. None when an episode has none (a backend
    that reports none for some turn)."""
    if any(t.rollout_logprobs is None for t in trajs):
        return None
    out = []
    for t in trajs:
        lp = torch.zeros(len(t.token_ids), dtype=torch.float32)
        lp[torch.tensor(t.loss_mask, dtype=torch.bool)] = torch.tensor(
            t.rollout_logprobs, dtype=torch.float32)
        out.append(lp)
    return out


def explained_variance(values, returns, mask) -> float:
    m = mask.bool()
    v, r = values[m].detach(), returns[m]
    var = r.var() if r.numel() > 1 else torch.tensor(0.0)
    if var == 0:
        return 0.0
    return float(1 - (r - v).var() / var)


def no_dropout_mode(model) -> None:
    """Eval mode; but train mode with every dropout off when activation checkpointing is on
    (transformers checkpoints only while training). Without dropout the first ratio of an
    update is 1 and the clip does not act on noise. Attention layers read their own rate
    while training (Llama's and Qwen2's `attention_dropout`, GPT-2's dropout module's `p`
    handed to SDPA), so those rates are set to 0 on the policy: RL never wants them."""
    from seekrl.models import backbone

    try:
        checkpointing = bool(getattr(backbone(model), "gradient_checkpointing", False))
    except AttributeError:
        checkpointing = False
    if not checkpointing:
        model.eval()
        return
    model.train()
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.eval()
            module.p = 0.0
        elif isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


def kl_rewards(trajs, logps, ref_logps, algo) -> tuple[list[torch.Tensor], float]:
    """-kl_coef x KL(policy || reference) per policy token (the estimator named by
    `algo.kl_estimator`; k1 is the usual one here), and the mean KL per policy token."""
    out, total, n = [], 0.0, 0
    for t, lp, ref in zip(trajs, logps, ref_logps):
        m = torch.tensor(t.loss_mask, dtype=torch.float32)
        kl = kl_penalty(lp.float(), ref.float(), algo.kl_estimator) * m
        out.append(-algo.kl_coef * kl)
        total, n = total + float(kl.sum()), n + int(m.sum())
    return out, round(total / max(n, 1), 5)
