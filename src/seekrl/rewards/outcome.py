"""Outcome rewards: one number per finished episode, from its answer and its trace.

`reward = outcome(answer, golden) + format_reward * valid - invalid_penalty * n_invalid
- max_turns_penalty * (ran out of turns or tokens) - turn_cost * n_turns
+ recall_bonus * (share of gold documents found) + hop_bonus * (searches near the hop
count) + plan_bonus * (searches near the episode's own planned lookups)`
(`episode_reward`). Outcome functions are registered by name (`em`, `f1`, `cover_em`),
so a recipe picks one from its config and later rewards (rubrics, evidence) register next
to them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from seekrl.agent.trajectory import Trajectory
from seekrl.plugins import Registry
from seekrl.rewards.metrics import cover_em, exact_match, f1_score

OutcomeFn = Callable[[str | None, Sequence[str]], float]
OUTCOMES: Registry = Registry("outcome reward")   # by name only (`reward.fn` takes a path)
OUTCOMES.update({
    "em": lambda answer, golden: float(exact_match(answer, golden)),
    "f1": lambda answer, golden: float(f1_score(answer, golden)),
    "cover_em": lambda answer, golden: float(cover_em(answer, golden)),
})


def register_outcome(name: str, fn: OutcomeFn) -> OutcomeFn:
    return OUTCOMES.add(name, fn)


def get_outcome(name: str) -> OutcomeFn:
    return OUTCOMES.lookup(name)


@dataclass(frozen=True)
class RewardParts:
    total: float
    outcome: float
    format: float
    penalty: float
    evidence: float = 0.0   # the recall bonus (`reward.recall_bonus`) in `total`
    hops: float = 0.0       # the hop bonus (`reward.hop_bonus`) in `total`
    plan: float = 0.0       # the plan bonus (`reward.plan_bonus`) in `total`


def question_hops(metadata: dict) -> int | None:
    """A question's hop count (`metadata.hops`) where it is a positive integer, else None."""
    hops = metadata.get("hops")
    if not isinstance(hops, int) or isinstance(hops, bool) or hops < 1:
        return None
    return hops


def hop_match(t: Trajectory) -> float | None:
    """How well the episode's number of lookups fits its question's hop count
    (`metadata.hops`): 1 - |lookups - hops| / hops, at least 0; None where the hops are
    unknown. One search on a single-hop question is 1, two are 0; one on a 2-hop bridge
    0.5, two 1. A lookup is a retriever query (`n_queries`): a search of two sub-queries
    (`rollout.max_queries` > 1) looks up both entities of a comparison at once."""
    hops = question_hops(t.metadata)
    return None if hops is None else _lookups_fit(t.n_queries, hops)


def _lookups_fit(made: int, target: int) -> float:
    """1 - |made - target| / target, at least 0; for a target of 0: 1 with none made."""
    if target == 0:
        return float(made == 0)
    return max(0.0, 1.0 - abs(made - target) / target)


def plan_match(t: Trajectory) -> float | None:
    """How well the episode's number of lookups keeps the plan its first thought states
    ("To answer this I need 2 lookups": `Trajectory.planned_lookups`): 1 - |lookups -
    planned| / planned, at least 0 (a plan of 0 lookups: 1 with none made, else 0); None
    where it states no plan. Unlike `hop_match` it needs no hop count from the data: it
    pays a policy that plans by the question for doing what it planned, so answering a
    bridge after its first lookup costs where the plan said two. It pays keeping a plan,
    not the right one (one lookup planned on a bridge and kept earns it all), and a search
    retried after a miss is a lookup past the plan, as the oracle's own retries are."""
    planned = t.planned_lookups
    return None if planned is None else _lookups_fit(t.n_queries, planned)


def episode_reward(t: Trajectory, *, outcome: str = "em", format_reward: float = 0.0,
                   invalid_penalty: float = 0.0, max_turns_penalty: float = 0.0,
                   turn_cost: float = 0.0, recall_bonus: float = 0.0,
                   hop_bonus: float = 0.0, plan_bonus: float = 0.0) -> RewardParts:
    """An episode's reward: the outcome, `format_reward` for a valid protocol trace, minus
    the penalties; plus `recall_bonus` x the share of the gold documents its searches found
    (`Trajectory.evidence_recall`; nothing where the gold documents are unknown). The bonus
    separates the episodes of a group that all answered wrong: on a bridge question the one
    that made the second hop and found the second document ranks above the one that
    answered after the first, where outcome alone gives them all the same reward. Plus
    `hop_bonus` x `hop_match`: how well its number of lookups fits the question's hops,
    a signal for the hop decision from both sides (a single-hop question's second search
    costs it, a bridge's missing hop costs it too, whatever the searches found). Plus
    `plan_bonus` x `plan_match`: the same from the episode's own stated plan."""
    out = get_outcome(outcome)(t.answer, t.golden_answers)
    fmt = format_reward if t.valid_format else 0.0
    n_invalid = sum(s.action == "invalid" for s in t.steps)
    ran_out = t.finish_reason in ("max_turns", "length") and t.answer is None
    penalty = invalid_penalty * n_invalid + (max_turns_penalty if ran_out else 0.0)
    if turn_cost:
        penalty += turn_cost * len(t.steps)
    recall = t.evidence_recall() if recall_bonus else None
    evidence = recall_bonus * recall if recall is not None else 0.0
    match = hop_match(t) if hop_bonus else None
    hop = hop_bonus * match if match is not None else 0.0
    kept = plan_match(t) if plan_bonus else None
    plan = plan_bonus * kept if kept is not None else 0.0
    return RewardParts(total=out + fmt + evidence + hop + plan - penalty, outcome=out,
                       format=fmt, penalty=penalty, evidence=evidence, hops=hop, plan=plan)


REWARD_FN_SHAPE = "f(trajectory) -> RewardParts(total, outcome, format, penalty)"


def load_reward_fn(path: str, key: str = "reward.fn") -> Callable[[Trajectory], RewardParts]:
    """The episode reward an import path names (`reward.fn: mypkg.rewards:judge`): the
    contract of `Trainer(reward_fn=...)`, one `RewardParts` per finished episode (it
    replaces the outcome, format reward and penalties of `reward:`). What it returns is
    checked on every call: a wrong type fails naming the key."""
    from seekrl.plugins import load_function

    return checked_reward_fn(load_function(key, path, args=(1,), shape=REWARD_FN_SHAPE),
                             f"{key}: {path}")


def checked_reward_fn(fn: Callable[[Trajectory], RewardParts], name: str
                      ) -> Callable[[Trajectory], RewardParts]:
    """`fn` with what it returns checked on every call: a `RewardParts` of finite total and
    outcome, else an error naming `name` (one NaN made the advantages of its whole group,
    prompt tokens too, NaN)."""
    def reward(t: Trajectory) -> RewardParts:
        parts = fn(t)
        if not isinstance(parts, RewardParts):
            raise TypeError(f"{name} returned a {type(parts).__name__}; expected "
                            f"RewardParts(total, outcome, format, penalty) "
                            "(seekrl.rewards.outcome)")
        if not all(math.isfinite(float(x)) for x in (parts.total, parts.outcome)):
            raise ValueError(f"{name} returned total {parts.total!r}, outcome "
                             f"{parts.outcome!r} for {t.example_id}; expected finite numbers")
        return parts

    reward.__wrapped__ = fn
    return reward
