"""Process rewards: one number per step (model turn), batch-first, registered by name.

A source is `f(trajectories, ctx) -> list[list[float | None]]`: for each trajectory, one
reward per step, or None where the source does not apply to that step (evidence and
redundancy judge searches only: an answer step has no retrieval to judge). A config may name a
source of its own by import path (`reward.process: {mypkg.steps:novelty: 0.5}`: imported
and registered under the path, `add_process_path`). `score_steps` runs
the sources a config names with their weights, keeps each source's value on the step
(`Step.process_parts`, None kept) and their weighted sum (`Step.process_reward`, None
counting 0); the step batch the estimators read (`rl/step_batch.py`) places that sum on the
step's last token.
An estimator that normalises step scores (`dual_granularity`) normalises each source over
the steps it applies to, so a step the source cannot judge is neither rewarded nor punished
by it (normalised over every step, the zeros of answer steps would sit below the mean of
gold-finding searches and every answer would be pushed down).

The sources:
- `evidence`: information gain of a search, the share of the episode's gold documents that
  this step retrieved for the first time (documents already in the prompt or found by an
  earlier step earn nothing); None for other steps. Gold comes from `gold_doc_ids` (the
  synthetic world's hop chain, any data that has them), else from
  `metadata["supporting_titles"]` matched against the retrieved titles (HotpotQA, 2Wiki,
  MuSiQue supporting facts); an episode without gold gets None on every step, counted in
  `ctx.stats["evidence_no_gold"]`. Like StepSearch's
  information-gain reward, against known gold rather than a similarity to it.
- `gold_found`: 1 for a search that retrieved a gold document the episode had not seen
  before, else 0; None for other steps and episodes without known gold. `evidence` divides
  by the episode's number of gold documents, so each hop of a 3-hop bridge that finds its
  document earns 1/3 where a single-hop search earns 1: normalised over a batch's searches,
  the hops of multi-hop episodes then sit below the mean even when every one found its
  document. `gold_found` credits each successful hop alike.
- `redundancy`: over-search penalty, -1 for a query the episode already issued (case and
  whitespace aside), else minus the share of the step's documents it had already seen; None
  for other steps. A search of several sub-queries scores the mean over its sub-queries,
  each judged against everything before it (the turn's earlier sub-queries included).
- `decomposition`: for a search of several sub-queries (`rollout.max_queries` > 1), the
  share of its sub-queries that can each be given a gold document of its own among the
  gold not found before the turn (a maximum matching: two sub-queries that found the same
  one document count once; a sub-query whose list also holds another's gold still counts;
  a repeat of an earlier search earns nothing). ParallelSearch's decomposition quality:
  independent lookups, one gold fact each. None for one-query searches, other steps and
  episodes without known gold.
- `step_format`: -1 for a turn that does not follow the protocol exactly
  (`protocol.step_format_problem`), else 0.
- `mc_value`: Monte-Carlo progress ("rewarding progress", Setlur et al., 2024). From the
  prefix ending after step t, `ctx.mc_samples` continuations by the current policy; V(t) is
  their mean episode score, and the step's reward is V(t) - V(t-1). V before the first step
  is the mean score of the question's group (its rollouts are samples from the empty
  prefix: no extra cost), V after the last step is the episode's own score, so the rewards
  of an episode add up to its score minus the group mean. `Step.value` keeps V(t). The
  continuations' generated tokens are counted in `ctx.stats["mc_tokens"]` (compute is
  compared at equal generated tokens).
- `prm`: a learned process reward model: `ctx.scorer.score_steps(trajectories)` returns
  the scores (the ProRAG pipeline trains one).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from seekrl.agent.protocol import normalise_text
from seekrl.agent.trajectory import Trajectory, group_indices, title_keys
from seekrl.plugins import Registry


class StepScorer(Protocol):
    def score_steps(self, trajectories: Sequence[Trajectory]) -> list[list[float]]: ...


# continue_episodes(prefixes, n) -> for each (trajectory, n_steps) prefix, n continuations
ContinueFn = Callable[[Sequence[tuple[Trajectory, int]], int], list[list[Trajectory]]]


@dataclass
class ProcessContext:
    """What a source may need beyond the trajectories."""
    continue_episodes: ContinueFn | None = None   # mc_value: the rollout engine's continuation
    episode_score: Callable[[Trajectory], float] | None = None   # mc_value: score of an episode
    scorer: StepScorer | None = None               # prm
    mc_samples: int = 4
    stats: dict[str, float] = field(default_factory=lambda: defaultdict(float))


ProcessFn = Callable[[Sequence[Trajectory], ProcessContext], list[list[float | None]]]
PROCESS_SHAPE = "f(trajectories, ctx) -> list[list[float | None]] (one value per step, None: n/a)"
PROCESS_REWARDS: Registry = Registry("process reward", key="reward.process.{name}",
                                     shape=PROCESS_SHAPE, args=(2,))


def register_process(name: str) -> Callable[[ProcessFn], ProcessFn]:
    def wrap(fn: ProcessFn) -> ProcessFn:
        return PROCESS_REWARDS.add(name, fn)
    return wrap


def add_process_path(path: str, key: str | None = None) -> ProcessFn:
    """The source an import path names (`reward.process: {mypkg.steps:novelty: 0.5}`),
    imported and registered under the path itself; `key` names the config key in errors."""
    return PROCESS_REWARDS.add_path(path, key)


def get_process(name: str) -> ProcessFn:
    """A source by registered name, or by import path (`pkg.mod:func`, registered when
    first named)."""
    return PROCESS_REWARDS.lookup(name)


def score_steps(trajectories: Sequence[Trajectory], weights: Mapping[str, float],
                ctx: ProcessContext | None = None) -> None:
    """Fill `process_parts` and `process_reward` of every step from the weighted sources.
    With no sources, steps keep `process_reward = None`. A source's None (does not apply)
    is kept in `process_parts` and adds nothing to `process_reward`."""
    if not weights:
        return
    sources = {name: get_process(name) for name in weights}   # an unknown name: before any work
    ctx = ctx or ProcessContext()
    for t in trajectories:
        for s in t.steps:
            s.process_parts = {}
            s.process_reward = 0.0
    for name, weight in weights.items():
        values = sources[name](trajectories, ctx)
        if len(values) != len(trajectories):
            raise ValueError(f"process reward {name!r} returned {len(values)} lists for "
                             f"{len(trajectories)} trajectories")
        for t, row in zip(trajectories, values):
            if len(row) != len(t.steps):
                raise ValueError(f"process reward {name!r} returned {len(row)} values for an "
                                 f"episode of {len(t.steps)} steps ({t.example_id})")
            for i, (s, v) in enumerate(zip(t.steps, row)):
                if v is not None and not math.isfinite(float(v)):   # one NaN: its group's
                    # every advantage NaN (a group-relative estimator reads the whole group)
                    raise ValueError(f"process reward {name!r} gave step {i} of "
                                     f"{t.example_id} the value {v!r}; expected a finite "
                                     "number or None")
                s.process_parts[name] = None if v is None else float(v)
                if v is not None:
                    s.process_reward += float(weight) * float(v)


def _gold_finds(trajectories: Sequence[Trajectory], ctx: ProcessContext, value
                ) -> list[list[float | None]]:
    """`value(new, n_gold)` for each search (`new`: the gold documents it found first),
    None for other steps and, on every step, for an episode whose gold is unknown."""
    out: list[list[float | None]] = []
    no_gold = 0
    for t in trajectories:
        gold, step_keys, seen = t.evidence_keys()   # by document id, else by title
        if not gold:
            no_gold += 1
            out.append([None] * len(t.steps))
            continue
        row: list[float | None] = []
        for s, hits in zip(t.steps, step_keys):
            row.append(value(len((gold & hits) - seen), len(gold)) if s.action == "search"
                       else None)
            seen = seen | hits
        out.append(row)
    # the episodes, once: evidence and gold_found both read them (each call had added them)
    ctx.stats["evidence_no_gold"] = max(ctx.stats["evidence_no_gold"], no_gold)
    return out


@register_process("evidence")
def evidence(trajectories: Sequence[Trajectory], ctx: ProcessContext
             ) -> list[list[float | None]]:
    return _gold_finds(trajectories, ctx, lambda new, n_gold: new / n_gold)


@register_process("gold_found")
def gold_found(trajectories: Sequence[Trajectory], ctx: ProcessContext
               ) -> list[list[float | None]]:
    return _gold_finds(trajectories, ctx, lambda new, n_gold: float(new > 0))


@register_process("redundancy")
def redundancy(trajectories: Sequence[Trajectory], ctx: ProcessContext
               ) -> list[list[float | None]]:
    out: list[list[float | None]] = []
    for t in trajectories:
        queries: set[str] = set()
        seen = set(t.prompt_hits or [])
        row: list[float | None] = []
        for s in t.steps:
            if s.action != "search":
                row.append(None)
                continue
            parts = list(zip(s.sub_queries, s.sub_hits)) or [(s.query, s.hits)]
            scores = []
            for query, hits in parts:
                q = normalise_text(query)
                if q in queries:
                    scores.append(-1.0)
                elif hits:
                    scores.append(-sum(h in seen for h in hits) / len(hits))
                else:
                    scores.append(0.0)
                queries.add(q)
                seen.update(hits)
            row.append(sum(scores) / len(scores))
        out.append(row)
    return out


@register_process("decomposition")
def decomposition(trajectories: Sequence[Trajectory], ctx: ProcessContext
                  ) -> list[list[float | None]]:
    out: list[list[float | None]] = []
    for t in trajectories:
        gold, step_keys, seen = t.evidence_keys()   # by document id, else by title
        row: list[float | None] = []
        for s, keys in zip(t.steps, step_keys):
            if s.action != "search" or len(s.sub_queries) < 2 or not gold:
                row.append(None)
            else:
                if t.gold_doc_ids:
                    found = [set(hits) for hits in s.sub_hits]
                else:   # gold by title: the turn's titles, in order, cut at each sub-query
                    titles = iter(title_keys(s.hits, s.hit_titles))
                    found = [{next(titles) for _ in hits} - {None} for hits in s.sub_hits]
                # what each sub-query found of the gold not found before this turn (a
                # repeat of an earlier search earns nothing), and how many sub-queries can
                # each be given a gold document of its own (one found by two counts once)
                new = [f & gold - seen for f in found]
                row.append(_matched(new) / len(new))
            seen = seen | keys
        out.append(row)
    return out


def _matched(options: Sequence[set[str]]) -> int:
    """The size of a maximum matching of items to distinct keys, item i taking one of
    `options[i]` (augmenting paths; a few sub-queries and gold documents)."""
    owner: dict[str, int] = {}

    def place(i: int, tried: set[str]) -> bool:
        for key in sorted(options[i] - tried):
            tried.add(key)
            if key not in owner or place(owner[key], tried):
                owner[key] = i
                return True
        return False

    return sum(place(i, set()) for i in range(len(options)))


@register_process("step_format")
def step_format(trajectories: Sequence[Trajectory], ctx: ProcessContext) -> list[list[float]]:
    return [[0.0 if s.well_formed else -1.0 for s in t.steps] for t in trajectories]


@register_process("mc_value")
def mc_value(trajectories: Sequence[Trajectory], ctx: ProcessContext) -> list[list[float]]:
    if ctx.continue_episodes is None or ctx.episode_score is None:
        raise ValueError("reward.process.mc_value needs the rollout engine to continue episodes "
                         "(ProcessContext.continue_episodes and episode_score)")
    scores = [float(ctx.episode_score(t)) for t in trajectories]
    v_start = {g: sum(scores[i] for i in m) / len(m)
               for g, m in group_indices(trajectories).items()}
    # every prefix that ends after a step the episode went on from
    prefixes = [(t, k) for t in trajectories for k in range(1, len(t.steps))]
    values: dict[tuple[int, int], float] = {}
    if prefixes:
        conts = ctx.continue_episodes(prefixes, ctx.mc_samples)
        for (t, k), group in zip(prefixes, conts):
            if not group:
                raise ValueError("mc_value: the rollout engine returned no continuation")
            values[(id(t), k)] = sum(float(ctx.episode_score(c)) for c in group) / len(group)
            before = sum(t.loss_mask[:t.steps[k - 1].end]) \
                + sum(s.info_generated for s in t.steps[:k])   # self-search blocks it wrote
            ctx.stats["mc_tokens"] += sum(c.n_decoded - before for c in group)
            ctx.stats["mc_continuations"] += len(group)
    out = []
    for t, score in zip(trajectories, scores):
        v_prev, row = v_start[t.group_id], []
        for k, s in enumerate(t.steps, start=1):
            v = score if k == len(t.steps) else values[(id(t), k)]
            s.value = v
            row.append(v - v_prev)
            v_prev = v
        out.append(row)
    return out


@register_process("prm")
def prm(trajectories: Sequence[Trajectory], ctx: ProcessContext) -> list[list[float]]:
    if ctx.scorer is None:
        raise ValueError("reward.process.prm needs a process reward model: pass a scorer with "
                         "score_steps(trajectories) (Trainer(prm_scorer=...))")
    scores = ctx.scorer.score_steps(trajectories)
    for t, row in zip(trajectories, scores):
        for s, v in zip(t.steps, row):
            s.value = float(v)
    return [[float(v) for v in row] for row in scores]


def group_has_signal(trajectories: Sequence[Trajectory], totals: Sequence[float]) -> bool:
    """Informative for learning when the episodes' scores differ, or any two step rewards
    in the group differ (a step-level estimator still has something to compare)."""
    if len(set(totals)) > 1:
        return True
    steps = {s.process_reward for t in trajectories for s in t.steps
             if s.process_reward is not None}
    return len(steps) > 1

