"""Sampling rules of a training step: the step's questions, micro-batches by episodes and
tokens, whether a group carries a learning signal (DAPO's dynamic sampling keeps only
those), whole groups of a batch, and the run's random streams."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from seekrl.agent.trajectory import group_indices
from seekrl.rewards.process import group_has_signal


def split_micro_batches(lengths: Sequence[int], max_episodes: int,
                        max_tokens: int | None = None) -> list[list[int]]:
    """Consecutive positions of `lengths` (episode lengths, in the order given) cut into
    micro-batches of at most `max_episodes` episodes and, when `max_tokens` is set, at most
    that many padded tokens (episodes x the longest): a micro-batch's activations grow
    with that product. An episode longer than `max_tokens` gets a micro-batch alone."""
    out: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for pos, n in enumerate(lengths):
        wider = max(longest, n)
        if current and (len(current) >= max_episodes
                        or (max_tokens is not None and wider * (len(current) + 1) > max_tokens)):
            out.append(current)
            current, wider = [], n
        current.append(pos)
        longest = wider
    if current:
        out.append(current)
    return out


def informative(trajs, parts, members: list[int], advantages=None) -> bool:
    """Whether a group teaches something. With the step's advantages (an estimator that
    needs no critic, computed once on the whole batch): whether any of the group's policy
    tokens has a non-zero one (a step estimator can have signal where the scores tie:
    GiGPO's discounted step returns, a step reward that differs). Otherwise: whether the
    episodes' scores (outcome + step rewards) or their step rewards differ."""
    if advantages is not None:
        return any(bool((advantages[j].abs() > 1e-9).any()) for j in members)
    totals = [parts[j].total + sum(s.process_reward or 0.0 for s in trajs[j].steps)
              for j in members]
    return group_has_signal([trajs[j] for j in members], totals)


def group_signal(trajs, parts, advantages=None) -> tuple[int, int, int]:
    """(informative groups, groups of two or more episodes, tied groups whose every episode
    was right): a group-relative advantage is zero for every member of a tied group, and
    undefined for a lone episode. A tied group of right answers is a solved question, not a
    broken policy; the monitor tells the two apart."""
    groups = [m for m in group_indices(trajs).values() if len(m) > 1]
    varied = [informative(trajs, parts, m, advantages) for m in groups]
    solved = sum(1 for m, v in zip(groups, varied)
                 if not v and all(parts[i].outcome >= 1.0 for i in m))
    return sum(varied), len(groups), solved


def keep_varied(trajs, parts, advantages=None):
    """The episodes (and their reward parts) of the groups that teach something."""
    keep = sorted(i for members in group_indices(trajs).values()
                  if informative(trajs, parts, members, advantages) for i in members)
    return [trajs[i] for i in keep], [parts[i] for i in keep]


def whole_groups(trajs, n_groups: int) -> list[int]:
    """Indices of at most `n_groups` whole groups, in order."""
    seen: list[str] = []
    for t in trajs:
        if t.group_id not in seen:
            seen.append(t.group_id)
    wanted = set(seen[:n_groups])
    return [i for i, t in enumerate(trajs) if t.group_id in wanted]


def fill_with_signal(draw: Callable[[int], tuple[list, list]],
                     signal_estimate: Callable[[list], Any], n_groups: int, *,
                     dynamic: bool, max_refills: int):
    """A step's batch: `draw(0)`'s episodes and their reward parts and, with `dynamic`
    sampling (DAPO), only the groups with signal, refilled by `draw(1)`, `draw(2)`, ...
    until they fill the first draw's size (at most `max_refills`), cut to whole groups.
    `signal_estimate(episodes)` gives the advantages the signal check reads (None: the
    scores decide). Returns (episodes, parts, episodes sampled, refills, the signal counts
    (varied, multi, solved) of every group sampled before any filter, the estimate of the
    batch when it is the first draw unchanged, else None)."""
    trajs, parts = draw(0)
    n_sampled, refills = len(trajs), 0
    wanted = len(trajs)   # the batch the refills fill (a fixed target: n_sampled grows)
    estimate = signal_estimate(trajs)
    signal = group_signal(trajs, parts, estimate and estimate[0].advantages)
    if not dynamic:
        return trajs, parts, n_sampled, refills, signal, estimate
    trajs, parts = keep_varied(trajs, parts, estimate and estimate[0].advantages)
    while len(trajs) < wanted and refills < max_refills:
        refills += 1
        more_t, more_p = draw(refills)
        n_sampled += len(more_t)
        more = signal_estimate(more_t)
        more_a = more and more[0].advantages
        signal = tuple(a + b for a, b in zip(signal, group_signal(more_t, more_p, more_a)))
        more_t, more_p = keep_varied(more_t, more_p, more_a)
        trajs, parts = trajs + more_t, parts + more_p
    keep = whole_groups(trajs, n_groups)
    # the batch is not the one the advantages were computed on: the update computes them
    # again (an estimator that whitens over the batch gives other numbers)
    return [trajs[i] for i in keep], [parts[i] for i in keep], n_sampled, refills, signal, None


def sample_questions(questions: Sequence[Any], n: int, rng: random.Random, *,
                     balance_types: bool = False) -> list[Any]:
    """`n` of `questions` (all of them when fewer), drawn with `rng`. With `balance_types`,
    round-robin over `metadata["type"]` (each type's pool shuffled), so that one type cannot
    crowd out the others; otherwise the data's own mix."""
    if not balance_types:
        return rng.sample(list(questions), min(n, len(questions)))
    by_type: dict[str, list[Any]] = defaultdict(list)
    for ex in questions:
        by_type[str(ex.metadata.get("type", "-"))].append(ex)
    pools = [rng.sample(v, len(v)) for _, v in sorted(by_type.items())]
    rng.shuffle(pools)
    picked: list[Any] = []
    i = 0
    while len(picked) < min(n, len(questions)):
        pool = pools[i % len(pools)]
        if pool:
            picked.append(pool.pop())
        i += 1
    return picked


class seeds:
    """Every random stream of a run, from its seed: steps, draws (dynamic sampling's
    refills), ranks and Monte-Carlo continuations get seeds apart by large primes. They
    can meet far apart (step k's refill 1 seeds as step k + 7919's first draw; rank 1 of
    run seed s as rank 0 of seed s + 1), which leaves the streams of one step distinct and
    costs nothing in practice: the questions are drawn from their own string seeds."""

    @staticmethod
    def step(run_seed: int, step: int) -> int:
        return run_seed * 1_000_003 + step

    @staticmethod
    def draw(step_seed: int, draw: int) -> int:
        return step_seed + 7919 * draw

    @staticmethod
    def rank(draw_seed: int, rank: int) -> int:
        return draw_seed + 1_000_003 * rank

    @staticmethod
    def continuations(seed: int) -> int:
        return seed + 104_729
