"""Advantage estimators: pure tensor functions from a step batch to token-level advantages
and returns, registered by name with their facts (the shape of verl's `core_algos.py`).

Rewards are token-level: an episode's outcome (outcome + format reward - penalties) sits on
its last policy token, each step's process reward on that step's last token (`Step.end - 1`).
A `StepBatch` (`rl/step_batch.py`) is built once per step from the trajectories and their
`Rewards`: padded (B, T) token rewards, loss mask and step index per token, (B, S) step
rewards and each process source's values with the steps it applies to, group ids, a critic's
values.

Every estimator has the shape `f(batch: StepBatch, cfg: AlgoConfig) -> (advantages, returns)`
or `(advantages, returns, diagnostics)`: (B, T) float tensors, advantages zero wherever
`loss_mask` is 0 (prompt, retrieved documents, padding), and a dict of figures for the step's
record. Whitening and returns live here, not in the recipe. Estimators are registered by name
with their facts (`facts(name)`: needs a critic's values, reads per-token rewards, needs tree
rollouts), which the recipes check configs by; a config may also name one by import path
(`mypkg.credit:median_baseline`, `add_estimator_path`), registered under the path when first
named. `estimate_advantages(name, batch, cfg)` runs
one and returns an `Estimate`, one 1-D tensor per episode aligned with its `token_ids`;
`compute_advantages(name, trajectories, rewards, cfg, values=)` builds the batch first.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from difflib import SequenceMatcher

import torch

from seekrl.agent.protocol import ANSWER, blank_own_information
from seekrl.agent.trajectory import Trajectory
from seekrl.config import AlgoConfig
from seekrl.plugins import Registry
from seekrl.rl.step_batch import (  # noqa: F401  (Rewards and its helpers are imported from here)
    Rewards,
    StepBatch,
    StepSource,
    anchor_states,
    as_rewards,
    last_policy_token,
    step_reward_position,
)


@dataclass
class Estimate:
    """An estimator's result: per-episode advantages and returns (aligned with `token_ids`)
    and what it reports for the step's record. Unpacks as `(advantages, returns)`."""
    advantages: list[torch.Tensor]
    returns: list[torch.Tensor]
    diagnostics: dict[str, float] = field(default_factory=dict)

    def __iter__(self):
        return iter((self.advantages, self.returns))


# ---------------------------------------------------------------------- registry

# f(batch, cfg) -> (advantages, returns[, diagnostics]), each (B, T)
Estimator = Callable[..., tuple]
ESTIMATOR_SHAPE = "f(batch: StepBatch, cfg) -> (advantages, returns[, diagnostics])"


@dataclass(frozen=True)
class EstimatorFacts:
    """What a recipe must know about an estimator before it runs one."""
    needs_values: bool = False        # a critic (a value head trained next to the policy)
    reads_token_rewards: bool = False  # per-token rewards (a KL penalty in the reward) count
    needs_tree: bool = False          # tree rollouts (`Trajectory.tree` on every episode)
    # its advantages are relative to the whole batch (whitened over it), so a group whose
    # episodes tie still gets non-zero ones: the scores, not the advantages, say if it varies
    batch_relative: bool = False


FACTS: dict[str, EstimatorFacts] = {}


def _facts_of_path(path: str, fn: Estimator) -> None:
    """An estimator named by import path has the facts it was registered with
    (`@register(name, needs_values=...)` in its module, run on import); a function never
    registered has none (no critic, no per-token rewards, no tree)."""
    known = next((n for n, f in ESTIMATORS.items() if f is fn and n != path), None)
    FACTS[path] = FACTS[known] if known is not None else EstimatorFacts()


ESTIMATORS: Registry = Registry("advantage estimator", key="algo.advantage",
                                shape=ESTIMATOR_SHAPE, args=(2,), on_path=_facts_of_path)


def register(name: str, *, needs_values: bool = False, reads_token_rewards: bool = False,
             needs_tree: bool = False, batch_relative: bool = False
             ) -> Callable[[Estimator], Estimator]:
    """Registers `fn(batch: StepBatch, cfg) -> (advantages, returns[, diagnostics])` under
    `name` with its facts."""
    def wrap(fn: Estimator) -> Estimator:
        ESTIMATORS.add(name, fn)
        FACTS[name] = EstimatorFacts(needs_values, reads_token_rewards, needs_tree,
                                     batch_relative)
        return fn
    return wrap


def add_estimator_path(path: str, key: str = "algo.advantage") -> Estimator:
    """The estimator an import path names (`algo.advantage: mypkg.credit:median_baseline`),
    imported and registered under the path itself, with the facts it was registered with."""
    return ESTIMATORS.add_path(path, key)


def get_estimator(name: str) -> Estimator:
    """An estimator by registered name, or by import path (`pkg.mod:func`, registered when
    first named)."""
    return ESTIMATORS.lookup(name)


def facts(name: str) -> EstimatorFacts:
    get_estimator(name)
    return FACTS[name]


def needs_values(name: str) -> bool:
    """Whether the estimator needs a critic (a value head trained next to the policy)."""
    return facts(name).needs_values


def batch_relative(name: str) -> bool:
    """Whether the estimator's advantages are relative to the whole batch (see
    EstimatorFacts): a group's own tie does not show in them."""
    return facts(name).batch_relative


def estimate_advantages(name: str, batch: StepBatch, cfg: AlgoConfig | None = None
                        ) -> Estimate:
    """The estimator `name` on a step batch, its (B, T) results cut back to one tensor per
    episode."""
    fn, cfg = get_estimator(name), cfg or AlgoConfig()
    out = fn(batch, cfg)
    advantages, returns, diagnostics = (*out, {}) if len(out) == 2 else out
    for what, x in (("advantages", advantages), ("returns", returns)):
        if tuple(x.shape) != batch.shape:
            raise ValueError(f"advantage estimator {name!r}: {what} of shape "
                             f"{tuple(x.shape)}, expected the batch's {batch.shape}")
    return Estimate(batch.unpad(advantages), batch.unpad(returns), dict(diagnostics))


def compute_advantages(name: str, trajectories: Sequence[Trajectory],
                       rewards: Rewards | Sequence[float], cfg: AlgoConfig | None = None,
                       values=None) -> Estimate:
    """`rewards`: a `Rewards`, or one outcome per trajectory (no step rewards). `values`: a
    critic's, one tensor per trajectory aligned with `token_ids`."""
    return estimate_advantages(name, StepBatch.build(trajectories, rewards, values), cfg)


# ---------------------------------------------------------------------- tensor helpers


def _tied(r: torch.Tensor) -> bool:
    """Whether the values do not vary (or there are fewer than two). Asked of the values
    themselves: in float32 the mean of equal values is often not exactly each of them (eight
    0.1s: mean - 0.1 = 7.5e-9), so `std == 0` and `r - mean` miss a real tie and give every
    member a tiny advantage of one sign (GRPO: -0.0074 on each of eight 0.1s)."""
    return len(r) < 2 or bool(r.max() == r.min())


def _standardise(r: torch.Tensor, epsilon: float) -> torch.Tensor:
    """(r - mean) / (std + eps); all zeros when the values do not vary (or there is one),
    which says "no signal" instead of dividing 0 by a tiny epsilon or by 0."""
    if _tied(r):
        return torch.zeros_like(r)
    return (r - r.mean()) / (r.std(unbiased=True) + epsilon)


def _centre(r: torch.Tensor, epsilon: float, std_norm: bool) -> torch.Tensor:
    if std_norm:
        return _standardise(r, epsilon)
    return torch.zeros_like(r) if _tied(r) else r - r.mean()


def group_scalars(batch: StepBatch, scores: torch.Tensor, fn) -> torch.Tensor:
    """(B,) float32: fn(a group's scores, float32) -> their advantages, group by group."""
    out = torch.zeros(len(scores), dtype=torch.float32)
    for idx in batch.groups:
        out[idx] = fn(scores[idx].to(torch.float32))
    return out


def broadcast(batch: StepBatch, scalars: torch.Tensor) -> torch.Tensor:
    """(B, T): each episode's scalar on its policy tokens, zero elsewhere."""
    return batch.loss_mask * scalars[:, None]


def _policy_columns(mask: torch.Tensor) -> list[int]:
    """The columns where some row has a policy token, last first (a backward recurrence over
    the policy tokens leaves its state as it is on the others)."""
    return mask.any(dim=0).nonzero().flatten().flip(0).tolist()


def returns_to_go(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float
                  ) -> torch.Tensor:
    """(B, T) float32: the discounted sum of the token rewards from each policy token on,
    over the policy tokens only (`mask`, bool); zero elsewhere. Summed in float64."""
    B, T = token_rewards.shape
    rewards = token_rewards.to(torch.float64)
    out = torch.zeros(B, T, dtype=torch.float64)
    running = torch.zeros(B, dtype=torch.float64)
    for t in _policy_columns(mask):
        m = mask[:, t]
        running = torch.where(m, rewards[:, t] + gamma * running, running)
        out[:, t] = torch.where(m, running, 0.0)
    return out.to(torch.float32)


def gae_advantages(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                   gamma: float, lam: float) -> torch.Tensor:
    """(B, T) float32: generalised advantage estimation over the policy tokens (`mask`,
    bool), the others skipped: the running advantage and the next policy token's value carry
    across them, and the value after an episode's last policy token is 0. Summed in float64."""
    B, T = token_rewards.shape
    rewards, values = token_rewards.to(torch.float64), values.to(torch.float64)
    out = torch.zeros(B, T, dtype=torch.float64)
    running = torch.zeros(B, dtype=torch.float64)
    next_value = torch.zeros(B, dtype=torch.float64)
    decay = gamma * lam
    for t in _policy_columns(mask):
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = torch.where(m, delta + decay * running, running)
        next_value = torch.where(m, values[:, t], next_value)
        out[:, t] = torch.where(m, running, 0.0)
    return out.to(torch.float32)


def whiten(x: torch.Tensor, mask: torch.Tensor, epsilon: float = 1e-8) -> torch.Tensor:
    """Zero mean, unit variance over the masked entries (bool) of the batch; zero elsewhere,
    and zero everywhere when the masked entries do not vary (every return 0 early in
    training: 0 / (0 + eps) was NaN at epsilon 0, and float32 rounding of the mean gave a
    uniform non-zero value at 1e-8)."""
    flat = x[mask]
    if _tied(flat):
        return torch.zeros_like(x)
    mean, std = flat.mean(), flat.std()
    return torch.where(mask, (x - mean) / (std + epsilon), torch.zeros_like(x))


def _scalar_result(batch: StepBatch, scalars: torch.Tensor):
    adv = broadcast(batch, scalars)
    return adv, adv.clone()


# ---------------------------------------------------------------------- outcome estimators


@register("grpo")
def grpo(batch: StepBatch, cfg: AlgoConfig):
    return _scalar_result(batch, group_scalars(batch, batch.totals,
                                               lambda r: _standardise(r, cfg.epsilon)))


@register("dr_grpo")
def dr_grpo(batch: StepBatch, cfg: AlgoConfig):
    return _scalar_result(batch, group_scalars(
        batch, batch.totals, lambda r: _centre(r, cfg.epsilon, std_norm=False)))


def _leave_one_out(r: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(r) if _tied(r) else r - (r.sum() - r) / (len(r) - 1)


@register("rloo")
def rloo(batch: StepBatch, cfg: AlgoConfig):
    return _scalar_result(batch, group_scalars(batch, batch.totals, _leave_one_out))


@register("reinforce_pp", reads_token_rewards=True, batch_relative=True)
def reinforce_pp(batch: StepBatch, cfg: AlgoConfig):
    returns = returns_to_go(batch.token_rewards, batch.policy, cfg.gamma)
    return whiten(returns, batch.policy, cfg.epsilon), returns


# ---------------------------------------------------------------------- token / step estimators


@register("gae", needs_values=True, reads_token_rewards=True)
def gae(batch: StepBatch, cfg: AlgoConfig):
    """GAE over policy tokens only, on the critic's values (`batch.values`, V at each token).
    Returns = advantages + values (the critic's targets, before whitening)."""
    if batch.values is None:
        raise ValueError("gae needs the critic's values (a value head): pass values=")
    adv = gae_advantages(batch.token_rewards, batch.values, batch.policy, cfg.gamma, cfg.lam)
    returns = adv + batch.values * batch.loss_mask
    return (whiten(adv, batch.policy, cfg.epsilon) if cfg.whiten else adv), returns


def normalised_over(per_token: torch.Tensor, applies: torch.Tensor, epsilon: float
                    ) -> torch.Tensor | None:
    """Step values on policy tokens (rows of a group), standardised over the tokens where
    they apply (`applies`; the others get 0); None when fewer than two such tokens or no
    spread."""
    flat = per_token[applies]
    if _tied(flat):
        return None
    mean, std = flat.mean(), flat.std()
    return torch.where(applies, (per_token - mean) / (std + epsilon), torch.zeros_like(per_token))


@register("dual_granularity")
def dual_granularity(batch: StepBatch, cfg: AlgoConfig):
    """ProRAG's dual-granularity advantage. The outcome part is the group-relative outcome
    (`std_norm` chooses GRPO's or Dr. GRPO's form); the process part gives each policy token
    its step's reward, normalised over the policy tokens of the group's episodes (token-
    weighted, so a long step counts as much as its tokens), times beta. seekrl differs from
    ProRAG's code in normalising per group rather than per batch, so that questions of
    different difficulty do not set each other's scale.

    With the rewards' process sources (the trainer passes them), each source is normalised on
    its own over the steps it judges (a None step is left out of its mean and std and gets 0
    from it), and the normalised sources are summed with their weights. ProRAG's PRM scores
    every step, so with one source of weight 1 this is the formula above; `evidence`, which
    judges only searches, would otherwise hand every answer step a negative term whenever a
    search found gold.

    `process_norm: none` adds each source's raw value instead (weight x value x beta on the
    step's own tokens, 0 where it does not apply; StepSearch also rewards steps raw, though
    inside PPO's returns). Why: standardised over a group's searches, a bridge episode's
    second search that found nothing sits below the mean and is marked down, while the
    episode that answered after one search gets nothing there, so the process part itself
    teaches fewer searches; raw, a search that finds nothing costs nothing (and a repeated
    one what `redundancy` says)."""
    out = broadcast(batch, group_scalars(batch, batch.outcome,
                                         lambda r: _centre(r, cfg.epsilon, cfg.std_norm)))
    sources = list(batch.sources.values()) or [StepSource(1.0, batch.step_rewards,
                                                          batch.step_mask)]
    parts = [(s.weight, batch.per_step(s.values, s.applies), batch.applies(s.applies))
             for s in sources]
    for idx in batch.groups:
        for weight, per_token, applies in parts:
            if cfg.process_norm == "none":
                z = torch.where(applies[idx], per_token[idx], torch.zeros_like(per_token[idx]))
            else:
                z = normalised_over(per_token[idx], applies[idx], cfg.epsilon)
            if z is not None:
                out[idx] = out[idx] + cfg.beta * weight * z
    return out, out.clone()


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
    """G_k = sum_{j >= k} gamma^(j-k) r_j, with the outcome arriving on the last step (one
    episode; `discounted_step_returns` is the batch's)."""
    out, running = [0.0] * len(steps), 0.0
    for k in range(len(steps) - 1, -1, -1):
        running = steps[k] + (outcome if k == len(steps) - 1 else 0.0) + gamma * running
        out[k] = running
    return out


def discounted_step_returns(batch: StepBatch, gamma: float) -> torch.Tensor:
    """(B, S) float64: `step_returns` of every episode, zero on padding."""
    B, S = batch.step_rewards.shape
    last = batch.step_mask.sum(dim=1) - 1
    out = torch.zeros(B, S, dtype=torch.float64)
    running = torch.zeros(B, dtype=torch.float64)
    for k in range(S - 1, -1, -1):
        m = batch.step_mask[:, k]
        arrived = torch.where(last == k, batch.outcome, 0.0)
        running = torch.where(m, batch.step_rewards[:, k] + arrived + gamma * running, running)
        out[:, k] = torch.where(m, running, 0.0)
    return out


def gigpo_step_groups(batch: StepBatch, members: Sequence[int], returns: torch.Tensor,
                      cfg: AlgoConfig) -> list[list[tuple[int, int, float]]]:
    """GiGPO's step groups within one question's group: the steps taken from the same
    anchor state (the queries issued so far, or the documents seen so far), each as
    (episode, step index, discounted step return; `returns`, B x S)."""
    anchors = batch.anchor_states(cfg.anchor)
    entries = []   # (episode, step index, anchor, return)
    for i in members:
        rets = returns[i].tolist()
        for k, anchor in enumerate(anchors[i]):
            entries.append((i, k, anchor, rets[k]))
    clusters: dict[int, list[int]] = defaultdict(list)
    for e, c in enumerate(_cluster([a for _, _, a, _ in entries], cfg.anchor_similarity)):
        clusters[c].append(e)
    return [[(entries[e][0], entries[e][1], entries[e][3]) for e in group]
            for group in clusters.values()]


def gigpo_step_advantages(step_group: Sequence[tuple[int, int, float]], cfg: AlgoConfig
                          ) -> torch.Tensor:
    """Each step's return against its step group's mean (/ std with `std_norm`); a step
    alone in its group gets 0."""
    g = torch.tensor([ret for _, _, ret in step_group])
    return _centre(g, cfg.epsilon, cfg.std_norm)


@register("gigpo")
def gigpo(batch: StepBatch, cfg: AlgoConfig):
    """GiGPO for search agents: A = A_episode + step_weight x A_step. Episode level: the
    group-relative total score. Step level: within a question's group, the steps taken from
    the same anchor state form a step group (`gigpo_step_groups`), and each step's
    discounted return is compared with its step group's (`gigpo_step_advantages`). The
    anchor is the environment's state, the queries issued so far (or the documents seen so
    far with `anchor: docs`), not the policy's text, which never repeats exactly. Every first
    step shares the empty state, so step groups always exist."""
    if cfg.anchor not in ("queries", "docs"):
        raise ValueError(f"anchor: expected queries or docs, got {cfg.anchor!r}")
    episode = group_scalars(batch, batch.totals,
                            lambda r: _centre(r, cfg.epsilon, cfg.std_norm))
    returns = discounted_step_returns(batch, cfg.step_gamma)
    step_adv = torch.zeros(batch.step_rewards.shape, dtype=torch.float32)
    sizes: list[int] = []
    for idx in batch.groups:
        for step_group in gigpo_step_groups(batch, idx.tolist(), returns, cfg):
            sizes.append(len(step_group))
            episodes, steps = zip(*[(i, k) for i, k, _ in step_group])
            step_adv[list(episodes), list(steps)] = gigpo_step_advantages(step_group, cfg)
    out = broadcast(batch, episode) + cfg.step_weight * batch.per_step(step_adv)
    diagnostics = {}
    if sizes:
        diagnostics = {"step_groups": len(sizes),
                       "step_group_size": round(sum(sizes) / len(sizes), 3),
                       "step_groups_shared": round(sum(s > 1 for s in sizes) / len(sizes), 4)}
    return out, out.clone(), diagnostics


def _within_and_group(batch: StepBatch, cfg: AlgoConfig, parts_of: Sequence, combine):
    """For each question's group: its scores centred over the group and within the parts
    that `parts_of` names (one key per episode; a part of one gets 0 there), joined per
    episode by `combine(within, group)`."""
    scalars = torch.zeros(len(batch.totals), dtype=torch.float32)
    for idx in batch.groups:
        r = batch.totals[idx].to(torch.float32)
        group = _centre(r, cfg.epsilon, cfg.std_norm)
        parts: dict[object, list[int]] = defaultdict(list)
        for pos, i in enumerate(idx.tolist()):
            parts[parts_of[i]].append(pos)
        within = torch.zeros_like(r)
        for positions in parts.values():
            p = torch.tensor(positions)
            within[p] = _centre(r[p], cfg.epsilon, cfg.std_norm)
        scalars[idx] = combine(within, group)
    return _scalar_result(batch, scalars)


@register("stratified_grpo")
def stratified_grpo(batch: StepBatch, cfg: AlgoConfig):
    """Stratified advantage normalisation: within each question's group, episodes with the
    same number of searches form a stratum and are centred among themselves, divided by the
    stratum's std with `algo.std_norm` (the paper's form; off by default, as for the group
    part: Dr. GRPO's centring) (a stratum of one gets 0 from this part); blended with the
    group-normalised score as alpha * A_stratum + (1 - alpha) * A_group."""
    return _within_and_group(batch, cfg, batch.n_searches.tolist(),
                             lambda w, g: cfg.alpha * w + (1 - cfg.alpha) * g)


@register("tree_grpo", needs_tree=True)
def tree_grpo(batch: StepBatch, cfg: AlgoConfig):
    """Tree-relative advantage for tree rollouts (`rollout.tree`): each leaf's score is
    centred within its tree (`Trajectory.tree`) and over the whole group, each divided by
    its std with `algo.std_norm` (off by default, as for `dr_grpo`), and the two are added.
    Leaves share their ancestors' tokens, so a shared prefix collects the sum of its
    leaves' advantages in the gradient: that is the implicit step-level credit. Without
    tree metadata every episode is its own tree (its within part 0) and this is `dr_grpo`
    (`grpo` with `algo.std_norm: true`)."""
    trees = [str(tree) if tree is not None else f"#{i}" for i, tree in enumerate(batch.tree_ids)]
    return _within_and_group(batch, cfg, trees, lambda w, g: w + g)

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


# the estimators `algo.answer_credit` splits: one scalar per episode from its group alone,
# linear in the scores, so the outcome's part and the rest's can be laid on different tokens
ANSWER_CREDIT_ESTIMATORS = ("grpo", "dr_grpo", "rloo")
ANSWER_TAG = f"<{ANSWER}>"


def answer_span(t: Trajectory, decode: Callable[[list[int]], str]) -> tuple[int, int] | None:
    """[start, end) into `t.token_ids`: the tokens of the episode's answer after its
    `<answer>` tag (the answer, the closing tag and whatever ends the turn), found by
    decoding prefixes of the answer turn (`decode`: the tokenizer's). The tag is the one
    `parse_action` reads: the first outside the model's own `<information>` blocks. The
    token that completes the tag is left out, so the choice of answering over searching is
    not in the span. None: the episode has no answer turn, or its text holds no tag."""
    step = next((s for s in reversed(t.steps) if s.action == "answer" and s.end > s.start),
                None)
    if step is None:
        return None
    ids = list(t.token_ids[step.start:step.end])
    at = blank_own_information(decode(ids)).find(ANSWER_TAG)
    if at < 0:
        return None
    after = at + len(ANSWER_TAG)
    # the first prefix whose text holds the whole tag: a prefix's text grows with it (but
    # for a character split across tokens, which moves the boundary by a token at most)
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(decode(ids[:mid])) >= after:
            hi = mid
        else:
            lo = mid + 1
    return (step.start + lo, step.end) if lo < len(ids) else None


def answer_shares(name: str, batch: StepBatch, outcome: Sequence[float], cfg: AlgoConfig
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) float32 each: the parts of every episode's group advantage (`name`, one of
    `ANSWER_CREDIT_ESTIMATORS`, on the whole reward, `batch.totals`) that its outcome and the
    rest of its reward make. These estimators are linear in the scores but for `grpo`'s
    division by the group's deviation, which both parts share, so the two add up to the
    estimator's own advantage and each keeps its scale in it (a 0.1 format reward stays
    small beside a right answer). A part that ties within its group, and a group whose
    scores tie, get 0."""
    o_all = torch.as_tensor(list(outcome), dtype=torch.float64)
    # rounded: (out + format - penalty) - out differs between a right and a wrong episode
    # in the last bit, which is not a difference in the rest
    rest_all = (batch.totals - o_all).mul(1e12).round().div(1e12)
    centre = _leave_one_out if name == "rloo" else \
        (lambda r: _centre(r, cfg.epsilon, std_norm=False))

    def scale(total: torch.Tensor) -> torch.Tensor:   # 0: the group's scores tie
        if _tied(total):
            return torch.zeros_like(total)
        if name != "grpo":
            return torch.ones_like(total)
        return (total.std(unbiased=True) + cfg.epsilon).expand_as(total)

    scales = group_scalars(batch, batch.totals, scale)
    # where the whole ties the parts may not (a right answer's outcome against a wrong one's
    # bonus): nothing then, as the estimator gives
    return tuple(torch.where(scales > 0, group_scalars(batch, part, centre) / scales, 0.0)
                 for part in (o_all, rest_all))


def answer_credit(outcome: Sequence[torch.Tensor], rest: Sequence[torch.Tensor],
                  trajectories: Sequence[Trajectory], decode: Callable[[list[int]], str]
                  ) -> tuple[list[torch.Tensor], int]:
    """`algo.answer_credit`: each episode's advantages are the rest of its reward's
    (`rest`: bonuses, format, penalties; every policy token) plus its outcome's (`outcome`)
    on its answer span alone (`answer_span`). Returns them and how many tokens the outcome
    reached."""
    out, reached = [], 0
    for a_outcome, a_rest, t in zip(outcome, rest, trajectories):
        a = a_rest.clone()
        span = answer_span(t, decode)
        if span is not None:
            a[span[0]:span[1]] += a_outcome[span[0]:span[1]]
            reached += int(sum(t.loss_mask[span[0]:span[1]]))
        out.append(a)
    return out, reached


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

