"""Advantage estimators: pure functions from trajectories and token-level rewards to
token-level advantages and returns.

Rewards are token-level, as in verl's `core_algos.py`: an episode's score is its outcome
(outcome + format reward - penalties, placed on the last policy token) plus one process
reward per step (placed on that step's last token, `Step.end - 1`). `Rewards` keeps both
parts as plain data, so an estimator can read the token-level view (`token_level`) and, where
its formula needs it, the decomposition (the outcome alone, the per-step rewards).

Every estimator has the shape `f(trajectories, rewards, cfg, values=None) -> (advantages,
returns)`: one float tensor each per trajectory, aligned with `token_ids`, advantages zero
wherever `loss_mask` is 0 (prompt, retrieved documents). Whitening and returns live here,
not in the recipe. Estimators are registered by name with their facts (`facts(name)`: needs a critic's
values, reads per-token rewards, needs tree rollouts), which the recipes check configs by.

Outcome estimators (one advantage for every policy token of an episode, from the episode's
total score, outcome plus step rewards):
- `grpo`: group-normalised score, (r - mean_group) / (std_group + eps) (Shao et al., 2024);
- `dr_grpo`: r - mean_group, no std division (Liu et al., 2025; the "no length
  normalisation" half lives in the loss: `algo.loss_agg: seq-mean-token-sum-norm`);
- `rloo`: r - mean of the *other* samples of the group (Ahmadian et al., 2024);
- `reinforce_pp`: REINFORCE++ (Hu, 2025): the discounted return-to-go of the token rewards,
  whitened over all policy tokens of the batch (not one scalar per sequence, whose
  per-token mean is not zero when lengths differ).

Token-level / step-level estimators:
- `gae`: PPO's generalised advantage estimation over the policy tokens with a critic's
  values; step rewards arrive on their step's last token; the retrieved tokens in between
  are skipped, not treated as time steps; advantages whitened over the batch.
- `dual_granularity` (ProRAG): A_t = A_outcome + beta * z_t, where z_t is the process reward of
  the step holding token t, normalised over the policy tokens of the group's episodes.
- `gigpo` (GiGPO, Feng et al., 2025): episode-level group advantage + step_weight x a
  step-level advantage over the steps of a question's group that start from the same anchor
  state (the same queries so far, or the same retrieved documents), on discounted step
  returns; a step whose anchor nobody else shares gets 0.
- `stratified_grpo` (Zhu et al., 2025): the score normalised within strata of the group
  (episodes with the same number of searches), blended with the group-normalised score by
  alpha.
- `tree_grpo` (Tree-GRPO, Ji et al., 2025): for tree rollouts, the leaf's score normalised
  within its tree plus normalised over the question's whole forest.

On the bias verl RFC #7244 describes (normalising step rewards per turn index when the agent
decides when to stop compares a 1-search episode's answer turn with a 3-search episode's
second search): none of these estimators groups by turn index. `gigpo` groups by anchor
*state*, `dual_granularity` normalises over all policy tokens of the group together, and
`stratified_grpo` compares whole episodes with the same number of searches.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from difflib import SequenceMatcher

import torch

from seekrl.agent.protocol import normalise_text
from seekrl.agent.trajectory import Trajectory, group_indices
from seekrl.config import AlgoConfig

# The estimators read the algorithm config itself (`algo:`): gamma, lam, whiten, epsilon,
# std_norm, beta, step_weight, step_gamma, anchor, anchor_similarity, alpha, with one
# default each. `AdvantageConfig(beta=0.5)` builds one with the other keys at their defaults.
AdvantageConfig = AlgoConfig


@dataclass
class Estimate:
    """An estimator's result: per-episode advantages and returns (aligned with `token_ids`)
    and what it reports for the step's record. Unpacks as `(advantages, returns)`."""
    advantages: list[torch.Tensor]
    returns: list[torch.Tensor]
    diagnostics: dict[str, float] = field(default_factory=dict)

    def __iter__(self):
        return iter((self.advantages, self.returns))


# ---------------------------------------------------------------------- rewards as data


@dataclass
class Rewards:
    """Each episode's outcome and each step's process reward; `tokens`, when given, one
    tensor per episode of rewards on single tokens (the KL penalty of `algo.kl_in_reward`),
    added to the token-level view and to the totals. `sources`, when given, the process
    reward's parts before they were summed: name -> (weight, one value per step of each
    episode, None where the source does not apply), for the estimators that normalise each
    source over the steps it judges (`dual_granularity`)."""
    outcome: list[float]
    steps: list[list[float]]
    tokens: list[torch.Tensor] | None = None
    sources: dict[str, tuple[float, list[list[float | None]]]] | None = None

    def __post_init__(self) -> None:
        if len(self.outcome) != len(self.steps):
            raise ValueError(f"rewards: {len(self.outcome)} outcomes but {len(self.steps)} "
                             "step lists")

    @classmethod
    def outcome_only(cls, trajectories: Sequence[Trajectory], outcome: Sequence[float]
                     ) -> "Rewards":
        return cls([float(r) for r in outcome], [[0.0] * len(t.steps) for t in trajectories])

    @classmethod
    def from_trajectories(cls, trajectories: Sequence[Trajectory],
                          weights: Mapping[str, float] | None = None) -> "Rewards":
        """`outcome_reward` and each step's `process_reward` (None counts as 0); with the
        process sources' `weights` (`reward.process`), each source's part from
        `Step.process_parts` as `sources`."""
        sources = None
        if weights:
            sources = {name: (float(w), [[s.process_parts.get(name) for s in t.steps]
                                         for t in trajectories])
                       for name, w in weights.items()}
        return cls([float(t.outcome_reward or 0.0) for t in trajectories],
                   [[float(s.process_reward or 0.0) for s in t.steps] for t in trajectories],
                   sources=sources)

    def totals(self) -> list[float]:
        extra = [float(x.sum()) for x in self.tokens] if self.tokens is not None \
            else [0.0] * len(self.outcome)
        return [o + sum(s) + e for o, s, e in zip(self.outcome, self.steps, extra)]

    def token_level(self, trajectories: Sequence[Trajectory]) -> list[torch.Tensor]:
        """One tensor per trajectory: the outcome on its last policy token, each step's
        reward on that step's last token."""
        out = []
        for t, outcome, steps in zip(trajectories, self.outcome, self.steps):
            r = torch.zeros(len(t.token_ids), dtype=torch.float32)
            last = last_policy_token(t)
            if last is not None:
                r[last] += outcome
                for step, value in zip(t.steps, steps):
                    r[step_reward_position(t, step)] += value
            out.append(r)
        if self.tokens is not None:
            out = [r + x[:len(r)].to(r.dtype) for r, x in zip(out, self.tokens)]
        return out


def last_policy_token(t: Trajectory) -> int | None:
    for i in range(len(t.loss_mask) - 1, -1, -1):
        if t.loss_mask[i]:
            return i
    return None


def step_reward_position(t: Trajectory, step) -> int:
    """Where a step's reward goes: its last token. A step without tokens (only in data
    written before turns kept their end-of-turn token) hands it to the nearest policy token
    before it, else after it, so no reward is lost."""
    if step.end > step.start:
        return step.end - 1
    for i in range(min(step.start, len(t.loss_mask)) - 1, -1, -1):
        if t.loss_mask[i]:
            return i
    last = last_policy_token(t)
    return last if last is not None else 0


# ---------------------------------------------------------------------- registry

Estimator = Callable[..., tuple[list[torch.Tensor], list[torch.Tensor]]]
ESTIMATORS: dict[str, Estimator] = {}


@dataclass(frozen=True)
class EstimatorFacts:
    """What a recipe must know about an estimator before it runs one."""
    needs_values: bool = False        # a critic (a value head trained next to the policy)
    reads_token_rewards: bool = False  # per-token rewards (a KL penalty in the reward) count
    needs_tree: bool = False          # tree rollouts (`Trajectory.tree` on every episode)


FACTS: dict[str, EstimatorFacts] = {}


def register(name: str, *, needs_values: bool = False, reads_token_rewards: bool = False,
             needs_tree: bool = False) -> Callable[[Estimator], Estimator]:
    def wrap(fn: Estimator) -> Estimator:
        if name in ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ESTIMATORS[name] = fn
        FACTS[name] = EstimatorFacts(needs_values, reads_token_rewards, needs_tree)
        return fn
    return wrap


def get_estimator(name: str) -> Estimator:
    if name not in ESTIMATORS:
        raise ValueError(f"advantage estimator: expected one of {', '.join(sorted(ESTIMATORS))}, "
                         f"got {name!r}")
    return ESTIMATORS[name]


def facts(name: str) -> EstimatorFacts:
    get_estimator(name)
    return FACTS[name]


def needs_values(name: str) -> bool:
    """Whether the estimator needs a critic (a value head trained next to the policy)."""
    return facts(name).needs_values


def compute_advantages(name: str, trajectories: Sequence[Trajectory],
                       rewards: Rewards | Sequence[float], cfg: AlgoConfig | None = None,
                       values=None) -> Estimate:
    """`rewards`: a `Rewards`, or one outcome per trajectory (no step rewards)."""
    if not isinstance(rewards, Rewards):
        rewards = list(rewards)
        if len(rewards) != len(trajectories):
            raise ValueError(f"rewards: expected one per trajectory ({len(trajectories)}), "
                             f"got {len(rewards)}")
        rewards = Rewards.outcome_only(trajectories, rewards)
    if len(rewards.outcome) != len(trajectories):
        raise ValueError(f"rewards: expected one per trajectory ({len(trajectories)}), "
                         f"got {len(rewards.outcome)}")
    for t, steps in zip(trajectories, rewards.steps):
        if len(steps) != len(t.steps):
            raise ValueError(f"rewards: episode {t.example_id!r} has {len(t.steps)} steps but "
                             f"{len(steps)} step rewards")
    for source, (_, rows) in (rewards.sources or {}).items():
        if len(rows) != len(trajectories) or any(len(r) != len(t.steps)
                                                 for r, t in zip(rows, trajectories)):
            raise ValueError(f"rewards: process source {source!r} does not have one value per "
                             "step of every episode")
    out = get_estimator(name)(trajectories, rewards, cfg or AlgoConfig(), values=values)
    return out if isinstance(out, Estimate) else Estimate(*out)


# ---------------------------------------------------------------------- helpers


def _masks(trajectories: Sequence[Trajectory]) -> list[torch.Tensor]:
    return [torch.tensor(t.loss_mask, dtype=torch.float32) for t in trajectories]


def _broadcast(trajectories: Sequence[Trajectory], scalars: Sequence[float]) -> list[torch.Tensor]:
    """Each trajectory's scalar on its policy tokens, zero elsewhere."""
    return [m * float(a) for m, a in zip(_masks(trajectories), scalars)]


def _per_step(t: Trajectory, values: Sequence[float | None]) -> torch.Tensor:
    """Each step's value on that step's tokens (zero outside the steps, and for None)."""
    out = torch.zeros(len(t.token_ids), dtype=torch.float32)
    for step, v in zip(t.steps, values):
        if v is None:
            continue
        if step.end > step.start:
            out[step.start:step.end] = float(v)
        else:   # a step without tokens (old data): its nearest policy token carries it
            out[step_reward_position(t, step)] += float(v)
    return out * torch.tensor(t.loss_mask, dtype=torch.float32)


def _applies(t: Trajectory, values: Sequence[float | None]) -> torch.Tensor:
    """Boolean per token: a policy token of a step whose value is not None (where
    `_per_step` puts the value)."""
    return _per_step(t, [None if v is None else 1.0 for v in values]) > 0


def _standardise(r: torch.Tensor, epsilon: float) -> torch.Tensor:
    """(r - mean) / (std + eps); all zeros when the values do not vary (or there is one),
    which says "no signal" instead of dividing 0 by a tiny epsilon or by 0."""
    if len(r) < 2:
        return torch.zeros_like(r)
    std = r.std(unbiased=True)
    if std == 0:
        return torch.zeros_like(r)
    return (r - r.mean()) / (std + epsilon)


def _centre(r: torch.Tensor, epsilon: float, std_norm: bool) -> torch.Tensor:
    if std_norm:
        return _standardise(r, epsilon)
    return r - r.mean() if len(r) > 1 else torch.zeros_like(r)


def _group_scalars(trajectories, scores: Sequence[float], fn) -> list[float]:
    """fn(tensor of a group's scores) -> tensor of advantages, applied group by group."""
    out = [0.0] * len(scores)
    for members in group_indices(trajectories).values():
        adv = fn(torch.tensor([float(scores[i]) for i in members]))
        for i, a in zip(members, adv):
            out[i] = float(a)
    return out


def _scalar_result(trajectories, scalars) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    adv = _broadcast(trajectories, scalars)
    return adv, [a.clone() for a in adv]


def _returns_to_go(t: Trajectory, rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """Discounted sum of the token rewards from each policy token on (policy tokens only)."""
    out = torch.zeros(len(t.token_ids), dtype=torch.float32)
    running = 0.0
    for i in range(len(t.token_ids) - 1, -1, -1):
        if t.loss_mask[i]:
            running = float(rewards[i]) + gamma * running
            out[i] = running
    return out


def _whiten(tensors: list[torch.Tensor], trajectories, epsilon: float = 1e-8
            ) -> list[torch.Tensor]:
    """Zero mean, unit variance over all policy tokens of the batch."""
    masks = [torch.tensor(t.loss_mask, dtype=torch.bool) for t in trajectories]
    flat = torch.cat([a[m] for a, m in zip(tensors, masks)]) if tensors else torch.zeros(0)
    if flat.numel() < 2:
        return [torch.zeros_like(a) for a in tensors]
    mean, std = flat.mean(), flat.std()
    return [torch.where(m, (a - mean) / (std + epsilon), torch.zeros_like(a))
            for a, m in zip(tensors, masks)]


# ---------------------------------------------------------------------- outcome estimators


@register("grpo")
def grpo(trajectories, rewards: Rewards, cfg: AlgoConfig, values=None):
    scalars = _group_scalars(trajectories, rewards.totals(),
                             lambda r: _standardise(r, cfg.epsilon))
    return _scalar_result(trajectories, scalars)


@register("dr_grpo")
def dr_grpo(trajectories, rewards: Rewards, cfg: AlgoConfig, values=None):
    scalars = _group_scalars(trajectories, rewards.totals(),
                             lambda r: _centre(r, cfg.epsilon, std_norm=False))
    return _scalar_result(trajectories, scalars)


@register("rloo")
def rloo(trajectories, rewards: Rewards, cfg: AlgoConfig, values=None):
    def leave_one_out(r: torch.Tensor) -> torch.Tensor:
        n = len(r)
        return torch.zeros_like(r) if n < 2 else r - (r.sum() - r) / (n - 1)
    return _scalar_result(trajectories, _group_scalars(trajectories, rewards.totals(),
                                                       leave_one_out))


@register("reinforce_pp", reads_token_rewards=True)
def reinforce_pp(trajectories, rewards: Rewards, cfg: AlgoConfig, values=None):
    token_rewards = rewards.token_level(trajectories)
    returns = [_returns_to_go(t, r, cfg.gamma) for t, r in zip(trajectories, token_rewards)]
    return _whiten(returns, trajectories, cfg.epsilon), returns


# ---------------------------------------------------------------------- token / step estimators


@register("gae", needs_values=True, reads_token_rewards=True)
def gae(trajectories, rewards: Rewards, cfg: AlgoConfig, values=None):
    """GAE over policy tokens only. `values`: one tensor per trajectory aligned with
    token_ids (the critic's V at each token). Returns = advantages + values (the critic's
    targets, before whitening)."""
    if values is None:
        raise ValueError("gae needs the critic's values (a value head): pass values=")
    advs, rets = [], []
    for t, r, v in zip(trajectories, rewards.token_level(trajectories), values):
        positions = torch.tensor(t.loss_mask, dtype=torch.bool).nonzero().flatten().tolist()
        adv = torch.zeros(len(t.token_ids), dtype=torch.float32)
        vals = v.detach().float().cpu()
        running = 0.0
        for j in range(len(positions) - 1, -1, -1):
            p = positions[j]
            next_value = float(vals[positions[j + 1]]) if j + 1 < len(positions) else 0.0
            delta = float(r[p]) + cfg.gamma * next_value - float(vals[p])
            running = delta + cfg.gamma * cfg.lam * running
            adv[p] = running
        advs.append(adv)
        rets.append(adv + vals * torch.tensor(t.loss_mask, dtype=torch.float32))
    return (_whiten(advs, trajectories) if cfg.whiten else advs), rets


def _normalised_over(trajectories, members: list[int], values: Sequence[Sequence],
                     epsilon: float) -> list[torch.Tensor] | None:
    """Each member's step values on its policy tokens, standardised over the tokens of the
    group's steps that have a value (None: the step is not judged, and gets 0); None when
    fewer than two such tokens or no spread."""
    per_token = [_per_step(trajectories[i], values[i]) for i in members]
    masks = [_applies(trajectories[i], values[i]) for i in members]
    flat = torch.cat([x[m] for x, m in zip(per_token, masks)])
    if flat.numel() < 2 or flat.std() == 0:
        return None
    mean, std = flat.mean(), flat.std()
    return [torch.where(m, (x - mean) / (std + epsilon), torch.zeros_like(x))
            for x, m in zip(per_token, masks)]


@register("dual_granularity")
def dual_granularity(trajectories, rewards: Rewards, cfg: AlgoConfig, values=None):
    """ProRAG's dual-granularity advantage. The outcome part is the group-relative outcome
    (`std_norm` chooses GRPO's or Dr. GRPO's form); the process part gives each policy token
    its step's reward, normalised over the policy tokens of the group's episodes (token-
    weighted, so a long step counts as much as its tokens), times beta. seekrl differs from
    ProRAG's code in normalising per group rather than per batch, so that questions of
    different difficulty do not set each other's scale.

    With `rewards.sources` (the trainer passes them), each source is normalised on its own
    over the steps it judges (a None step is left out of its mean and std and gets 0 from
    it), and the normalised sources are summed with their weights. ProRAG's PRM scores every
    step, so with one source of weight 1 this is the formula above; `evidence`, which judges
    only searches, would otherwise hand every answer step a negative term whenever a search
    found gold."""
    outcome = _group_scalars(trajectories, rewards.outcome,
                             lambda r: _centre(r, cfg.epsilon, cfg.std_norm))
    out = _broadcast(trajectories, outcome)
    parts = list(rewards.sources.values()) if rewards.sources else [(1.0, rewards.steps)]
    for members in group_indices(trajectories).values():
        for weight, step_values in parts:
            z = _normalised_over(trajectories, members, step_values, cfg.epsilon)
            if z is None:
                continue
            for i, zi in zip(members, z):
                out[i] = out[i] + cfg.beta * weight * zi
    return out, [a.clone() for a in out]


def anchor_states(t: Trajectory, kind: str) -> list[tuple]:
    """The state before each step: the queries so far (in order; invalid turns count as a
    turn), or the set of documents retrieved so far."""
    states, queries, docs = [], [], set(t.prompt_hits or [])
    for s in t.steps:
        states.append(tuple(queries) if kind == "queries" else tuple(sorted(docs)))
        queries.append(normalise_text(s.query) if s.action == "search" else f"<{s.action}>")
        docs.update(s.hits)
    return states


def _cluster(keys: list[tuple], similarity: float | None) -> list[int]:
    """A cluster id per key: equal keys share one; with `similarity`, keys of equal length
    whose joined text matches at least that well join the first such cluster."""
    ids, reps = [], []
    for key in keys:
        found = None
        for c, rep in enumerate(reps):
            if rep == key or (similarity is not None and len(rep) == len(key) and
                              SequenceMatcher(None, " | ".join(rep), " | ".join(key)).ratio()
                              >= similarity):
                found = c
                break
        if found is None:
            reps.append(key)
            found = len(reps) - 1
        ids.append(found)
    return ids


def step_returns(outcome: float, steps: Sequence[float], gamma: float) -> list[float]:
    """G_k = sum_{j >= k} gamma^(j-k) r_j, with the outcome arriving on the last step."""
    out, running = [0.0] * len(steps), 0.0
    for k in range(len(steps) - 1, -1, -1):
        running = steps[k] + (outcome if k == len(steps) - 1 else 0.0) + gamma * running
        out[k] = running
    return out


def gigpo_step_groups(trajectories, members: Sequence[int], rewards: Rewards, cfg: AlgoConfig
                      ) -> list[list[tuple[int, int, float]]]:
    """GiGPO's step groups within one question's group: the steps taken from the same
    anchor state (the queries issued so far, or the documents seen so far), each as
    (episode, step index, discounted step return)."""
    entries = []   # (trajectory index, step index, anchor, return)
    for i in members:
        rets = step_returns(rewards.outcome[i], rewards.steps[i], cfg.step_gamma)
        for k, anchor in enumerate(anchor_states(trajectories[i], cfg.anchor)):
            entries.append((i, k, anchor, rets[k]))
    clusters: dict[int, list[int]] = defaultdict(list)
    for e, c in enumerate(_cluster([a for _, _, a, _ in entries], cfg.anchor_similarity)):
        clusters[c].append(e)
    return [[(entries[e][0], entries[e][1], entries[e][3]) for e in group]
            for group in clusters.values()]


def gigpo_step_advantages(step_group: Sequence[tuple[int, int, float]], cfg: AlgoConfig
                          ) -> list[float]:
    """Each step's return against its step group's mean (/ std with `std_norm`); a step
    alone in its group gets 0."""
    g = torch.tensor([ret for _, _, ret in step_group])
    return [float(a) for a in _centre(g, cfg.epsilon, cfg.std_norm)]


@register("gigpo")
def gigpo(trajectories, rewards: Rewards, cfg: AlgoConfig, values=None) -> Estimate:
    """GiGPO for search agents: A = A_episode + step_weight x A_step. Episode level: the
    group-relative total score. Step level: within a question's group, the steps taken from
    the same anchor state form a step group (`gigpo_step_groups`), and each step's
    discounted return is compared with its step group's (`gigpo_step_advantages`). The
    anchor is the environment's state, the queries issued so far (or the documents seen so
    far with `anchor: docs`), not the policy's text, which never repeats exactly. Every first
    step shares the empty state, so step groups always exist."""
    if cfg.anchor not in ("queries", "docs"):
        raise ValueError(f"anchor: expected queries or docs, got {cfg.anchor!r}")
    episode = _group_scalars(trajectories, rewards.totals(),
                             lambda r: _centre(r, cfg.epsilon, cfg.std_norm))
    out = _broadcast(trajectories, episode)
    sizes: list[int] = []
    for members in group_indices(trajectories).values():
        step_adv = {i: [0.0] * len(trajectories[i].steps) for i in members}
        for step_group in gigpo_step_groups(trajectories, members, rewards, cfg):
            sizes.append(len(step_group))
            for (i, k, _), a in zip(step_group, gigpo_step_advantages(step_group, cfg)):
                step_adv[i][k] = a
        for i in members:
            out[i] = out[i] + cfg.step_weight * _per_step(trajectories[i], step_adv[i])
    diagnostics = {}
    if sizes:
        diagnostics = {"step_groups": len(sizes),
                       "step_group_size": round(sum(sizes) / len(sizes), 3),
                       "step_groups_shared": round(sum(s > 1 for s in sizes) / len(sizes), 4)}
    return Estimate(out, [a.clone() for a in out], diagnostics)


def _within_and_group(trajectories, rewards: Rewards, cfg: AlgoConfig, part_of, combine
                      ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """For each question's group: its scores centred over the group and within the parts
    that `part_of(trajectory)` names (a part of one gets 0 there), joined per episode by
    `combine(within, group)`."""
    totals = rewards.totals()
    scalars = [0.0] * len(totals)
    for members in group_indices(trajectories).values():
        r = torch.tensor([totals[i] for i in members])
        group = _centre(r, cfg.epsilon, cfg.std_norm)
        parts: dict[object, list[int]] = defaultdict(list)
        for pos, i in enumerate(members):
            parts[part_of(trajectories[i], i)].append(pos)
        within = torch.zeros_like(r)
        for positions in parts.values():
            idx = torch.tensor(positions)
            within[idx] = _centre(r[idx], cfg.epsilon, cfg.std_norm)
        for pos, i in enumerate(members):
            scalars[i] = float(combine(within[pos], group[pos]))
    return _scalar_result(trajectories, scalars)


@register("stratified_grpo")
def stratified_grpo(trajectories, rewards: Rewards, cfg: AlgoConfig, values=None):
    """Stratified advantage normalisation: within each question's group, episodes with the
    same number of searches form a stratum and are normalised among themselves (a stratum of
    one gets 0 from this part); blended with the group-normalised score as
    alpha * A_stratum + (1 - alpha) * A_group."""
    return _within_and_group(trajectories, rewards, cfg, lambda t, i: t.n_searches,
                             lambda w, g: cfg.alpha * w + (1 - cfg.alpha) * g)


@register("tree_grpo", needs_tree=True)
def tree_grpo(trajectories, rewards: Rewards, cfg: AlgoConfig, values=None):
    """Tree-relative advantage for tree rollouts (`rollout.tree`): each leaf's score is
    normalised within its tree (`Trajectory.tree`) and over the whole group, and the two
    are added. Leaves share their ancestors' tokens, so a shared prefix collects the sum of
    its leaves' advantages in the gradient: that is the implicit step-level credit. Without
    tree metadata every episode is its own tree and this is GRPO."""
    return _within_and_group(trajectories, rewards, cfg,
                             lambda t, i: str(t.tree) if t.tree is not None else f"#{i}",
                             lambda w, g: w + g)


def no_positive_credit_for_invalid_turns(advantages: Sequence[torch.Tensor],
                                        trajectories: Sequence[Trajectory]
                                        ) -> tuple[list[torch.Tensor], int]:
    """Caps the advantage of every invalid turn's tokens at 0 (`algo.credit_invalid_turns:
    false`): a right episode's success does not teach the turn that broke the protocol,
    while a wrong episode's blame still reaches it. Returns the advantages and how many
    policy tokens were capped."""
    out, capped = [], 0
    for a, t in zip(advantages, trajectories):
        a = a.clone()
        for s in t.steps:
            if s.action == "invalid" and s.end > s.start:
                span = a[s.start:s.end]
                capped += int((span > 0).sum())
                a[s.start:s.end] = span.clamp(max=0.0)
        out.append(a)
    return out, capped


def advantage_stats(advantages: Sequence[torch.Tensor], trajectories) -> dict[str, float]:
    """Mean |advantage| over policy tokens, and the share of policy tokens whose advantage
    differs from their episode's first policy token (0 for outcome estimators)."""
    total, n, varied = 0.0, 0, 0
    for a, t in zip(advantages, trajectories):
        m = torch.tensor(t.loss_mask, dtype=torch.bool)
        vals = a[m]
        if vals.numel() == 0:
            continue
        total += float(vals.abs().sum())
        n += vals.numel()
        varied += int((vals != vals[0]).sum())
    return {"adv_abs": round(total / n, 5) if n else 0.0,
            "adv_token_varied": round(varied / n, 4) if n else 0.0}

