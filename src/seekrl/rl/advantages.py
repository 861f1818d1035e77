"""Advantage estimators: pure functions from trajectories and rewards to token-level tensors.

Every estimator has the shape `f(trajectories, rewards, cfg, values=None) -> list[Tensor]`:
one float tensor per trajectory, aligned with `token_ids`, zero wherever `loss_mask` is 0
(prompt, retrieved documents), and registered by name (as in verl's `core_algos.py`), so a
recipe picks one from its config and process supervision can add its own next to these.

Outcome estimators give every policy token of a trajectory the same advantage:
- `grpo`: group-normalised reward, (r - mean_group) / (std_group + eps) (Shao et al., 2024);
- `dr_grpo`: r - mean_group, no std division (Liu et al., 2025; the "no length
  normalisation" half lives in the loss: opt in with `algo.loss_agg:
  seq-mean-token-sum-norm`; the default token-mean is DAPO's);
- `rloo`: r - mean of the *other* samples of the group (Ahmadian et al., 2024);
- `reinforce_pp`: batch-normalised reward, (r - mean_batch) / (std_batch + eps) (Hu, 2025).
`gae` is PPO's generalised advantage estimation over the policy tokens with a critic's
values; the retrieved tokens in between are skipped, not treated as time steps.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from seekrl.agent.trajectory import Trajectory


@dataclass
class AdvantageConfig:
    epsilon: float = 1e-6
    gamma: float = 1.0     # GAE discount per policy token
    lam: float = 1.0       # GAE lambda


Estimator = Callable[..., list[torch.Tensor]]
ESTIMATORS: dict[str, Estimator] = {}


def register(name: str) -> Callable[[Estimator], Estimator]:
    def wrap(fn: Estimator) -> Estimator:
        if name in ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ESTIMATORS[name] = fn
        return fn
    return wrap


def get_estimator(name: str) -> Estimator:
    if name not in ESTIMATORS:
        raise ValueError(f"advantage estimator: expected one of {', '.join(sorted(ESTIMATORS))}, "
                         f"got {name!r}")
    return ESTIMATORS[name]


def compute_advantages(name: str, trajectories: Sequence[Trajectory], rewards: Sequence[float],
                       cfg: AdvantageConfig | None = None, values=None) -> list[torch.Tensor]:
    if len(rewards) != len(trajectories):
        raise ValueError(f"rewards: expected one per trajectory ({len(trajectories)}), "
                         f"got {len(rewards)}")
    return get_estimator(name)(trajectories, list(map(float, rewards)), cfg or AdvantageConfig(),
                               values=values)


def _broadcast(trajectories: Sequence[Trajectory], scalars: Sequence[float]) -> list[torch.Tensor]:
    """Each trajectory's scalar on its policy tokens, zero elsewhere."""
    return [torch.tensor(t.loss_mask, dtype=torch.float32) * float(a)
            for t, a in zip(trajectories, scalars)]


def _groups(trajectories: Sequence[Trajectory]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(trajectories):
        groups[t.group_id].append(i)
    return groups


@register("grpo")
def grpo(trajectories, rewards, cfg, values=None) -> list[torch.Tensor]:
    scalars = [0.0] * len(rewards)
    for members in _groups(trajectories).values():
        r = torch.tensor([rewards[i] for i in members])
        for i, a in zip(members, _standardise(r, cfg.epsilon)):
            scalars[i] = float(a)
    return _broadcast(trajectories, scalars)


def _standardise(r: torch.Tensor, epsilon: float) -> torch.Tensor:
    """(r - mean) / (std + eps); all zeros when the rewards do not vary (or there is one),
    which says "no signal" instead of dividing 0 by a tiny epsilon or by 0."""
    if len(r) < 2:
        return torch.zeros_like(r)
    std = r.std(unbiased=True)
    if std == 0:
        return torch.zeros_like(r)
    return (r - r.mean()) / (std + epsilon)


@register("dr_grpo")
def dr_grpo(trajectories, rewards, cfg, values=None) -> list[torch.Tensor]:
    scalars = [0.0] * len(rewards)
    for members in _groups(trajectories).values():
        r = torch.tensor([rewards[i] for i in members])
        for i, a in zip(members, r - r.mean()):
            scalars[i] = float(a)
    return _broadcast(trajectories, scalars)


@register("rloo")
def rloo(trajectories, rewards, cfg, values=None) -> list[torch.Tensor]:
    scalars = [0.0] * len(rewards)
    for members in _groups(trajectories).values():
        n = len(members)
        if n < 2:
            continue
        total = sum(rewards[i] for i in members)
        for i in members:
            scalars[i] = rewards[i] - (total - rewards[i]) / (n - 1)
    return _broadcast(trajectories, scalars)


@register("reinforce_pp")
def reinforce_pp(trajectories, rewards, cfg, values=None) -> list[torch.Tensor]:
    return _broadcast(trajectories, _standardise(torch.tensor(rewards), cfg.epsilon).tolist())


@register("gae")
def gae(trajectories, rewards, cfg, values=None) -> list[torch.Tensor]:
    """GAE over policy tokens only; the reward arrives at the last policy token.

    `values`: one tensor per trajectory aligned with token_ids (the critic's V at each
    token). Returns advantages; the critic's targets are `advantages + values`."""
    if values is None:
        raise ValueError("gae needs the critic's values (a value head): pass values=")
    out = []
    for t, reward, v in zip(trajectories, rewards, values):
        mask = torch.tensor(t.loss_mask, dtype=torch.bool)
        positions = mask.nonzero().flatten()
        adv = torch.zeros(len(t.token_ids), dtype=torch.float32)
        if len(positions) == 0:
            out.append(adv)
            continue
        vals = v.detach().float()[positions]
        running = 0.0
        for j in range(len(positions) - 1, -1, -1):
            last = j == len(positions) - 1
            next_value = 0.0 if last else float(vals[j + 1])
            r = reward if last else 0.0
            delta = r + cfg.gamma * next_value - float(vals[j])
            running = delta + cfg.gamma * cfg.lam * running
            adv[positions[j]] = running
        out.append(adv)
    return out
