"""What an RL step logs about its episodes, and the names of the step figures as constants
(the training-health monitor reads them by these; the producers here too)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from seekrl.agent.trajectory import Trajectory
from seekrl.rewards.metrics import exact_match
from seekrl.rewards.outcome import question_hops

# the episodes'
STEP = "step"
EPISODES = "episodes"   # only a step's record has it (a dev evaluation's line has not)
REWARD = "reward"
OUTCOME = "outcome"
EM = "em"
VALID_FORMAT = "valid_format"
SEARCHES = "searches"
TURNS = "turns"
RESPONSE_LENGTH = "response_length"
EVIDENCE_RECALL = "evidence_recall"
REWARD_BY_TYPE = "reward_by_type"
REWARD_BY_HOPS = "reward_by_hops"
REWARD_MULTIHOP = "reward_multihop"
LOOKUPS_BY_KIND = "lookups_by_kind"
GROUPS_WITH_SIGNAL = "groups_with_signal"
GROUPS_SOLVED = "groups_solved"
# the update's
KL = "kl"
ENTROPY = "entropy"
CLIP_FRAC = "clip_frac"
APPROX_KL = "approx_kl"
CORRECT_LOGP = "correct_logp"
GRAD_NORM = "grad_norm"
UPDATES = "updates"
CORRECT_LOGP_SHIFT = "correct_logp_shift"
ROLLOUT_LOGP_GAP = "rollout_logp_gap"   # the sampler's log-probs against the trainer's
LR = "lr"
ALERTS = "alerts"   # the monitor's alert kinds raised at the step
# time and compute: every phase's seconds are logged as time_<phase>, the whole step's too
TIME = "time_"
TIME_STEP = "time_step"
TIME_ROLLOUT = "time_rollout"
TIME_SCORING = "time_scoring"
TIME_OLD_LOGPROBS = "time_old_logprobs"
TIME_UPDATE = "time_update"
TIME_RANKER_SCORE = "time_ranker_score"
TIME_RANKER_UPDATE = "time_ranker_update"
TOKENS_PER_S = "tokens_per_s"
TRAIN_TOKENS_PER_S = "train_tokens_per_s"
ROLLOUT_TOKENS = "rollout_tokens"
ROLLOUT_TOKENS_TOTAL = "rollout_tokens_total"   # the run's so far, this step's included
PEAK_RSS_MB = "peak_rss_mb"
PEAK_GPU_MB = "peak_gpu_mb"
STATE_MB = "state_mb"   # the trained state's bytes: weights, gradients, optimizer
# SFT's step record (the report draws both trainers' logs)
LOSS = "loss"
# a dev evaluation's figures are logged under this prefix (dev_em, dev_searches, ...)
DEV = "dev_"
F1 = "f1"   # a dev evaluation's only


def correct(t: Trajectory) -> bool:
    """Exact match, whatever the reward's outcome metric (the logged `em` is EM)."""
    return bool(exact_match(t.answer, t.golden_answers))


def question_kind(t: Trajectory) -> str:
    """The question's type and hop count (`bridge-2`), as far as its metadata says."""
    kind = str(t.metadata.get("type", "-"))
    hops = t.metadata.get("hops")
    return f"{kind}-{hops}" if isinstance(hops, int) else kind


# Question types that are multi-hop in the common data sets (HotpotQA: bridge, comparison;
# 2WikiMultihopQA: compositional, inference, bridge_comparison), read as such where a
# question gives no hop count: their files carry the type, not the hops, and the monitor's
# search-collapse alerts read the multi-hop reward.
MULTIHOP_TYPES = frozenset({"bridge", "comparison", "compositional", "inference",
                            "bridge_comparison"})


def is_multihop(metadata: dict) -> bool:
    """A question of two hops or more: its `hops` where given (an integer), else its `type`
    (`MULTIHOP_TYPES`)."""
    hops = question_hops(metadata)
    if hops is not None:
        return hops >= 2
    return str(metadata.get("type", "")).lower() in MULTIHOP_TYPES


def _mean(values: Sequence[float], digits: int) -> float | None:
    return round(sum(values) / len(values), digits) if values else None


def episode_metrics(trajs: Sequence[Trajectory], parts: Sequence[Any], *,
                    process: Sequence[str] = (), self_search: bool = False,
                    sub_queries: bool = False) -> dict[str, Any]:
    """The step record's figures about its episodes (`parts`: their `RewardParts`):
    reward, EM, format, searches, per question type and hop count, the process sources'
    means (`process`: their names), and per question kind the lookups the policy planned
    in its first thought and the ones it made."""
    n = max(1, len(trajs))
    by_type: dict[str, list[float]] = defaultdict(list)
    by_hops: dict[str, list[float]] = defaultdict(list)
    for t, p in zip(trajs, parts):
        by_type[str(t.metadata.get("type", "-"))].append(p.total)
        if isinstance(t.metadata.get("hops"), int):
            by_hops[str(t.metadata["hops"])].append(p.total)
    multihop = [p.total for t, p in zip(trajs, parts) if is_multihop(t.metadata)]
    recalls = [r for r in (t.evidence_recall() for t in trajs) if r is not None]
    steps = [s for t in trajs for s in t.steps]
    out: dict[str, Any] = {}
    if self_search:   # the blocks it wrote: decoded, counted, not trained
        out["self_info_length"] = round(sum(s.info_generated for s in steps) / n, 1)
    if process and steps:
        out["process_reward"] = round(sum(s.process_reward or 0.0 for s in steps) / len(steps), 4)
        for name in process:   # over the steps the source judged
            vals = [v for s in steps if (v := s.process_parts.get(name)) is not None]
            out[f"process_{name}"] = _mean(vals, 4)
            # and by the kind of step: a source that judges searches and answers alike (a
            # PRM) but scores one kind higher pushes the policy toward it once the scores
            # are normalised over all steps (a near-chance PRM that prefers answers teaches
            # "stop searching")
            by_action: dict[str, list[float]] = defaultdict(list)
            for s in steps:
                if (v := s.process_parts.get(name)) is not None:
                    by_action[s.action].append(v)
            if by_action:
                out[f"process_{name}_by_action"] = {
                    a: round(sum(v) / len(v), 4) for a, v in sorted(by_action.items())}
    out.update({
        REWARD_BY_HOPS: {k: round(sum(v) / len(v), 4) for k, v in sorted(by_hops.items())},
        REWARD_MULTIHOP: _mean(multihop, 4),
        EVIDENCE_RECALL: _mean(recalls, 4),
        REWARD: round(sum(p.total for p in parts) / n, 4),
        OUTCOME: round(sum(p.outcome for p in parts) / n, 4),
        EM: round(sum(correct(t) for t in trajs) / n, 4),
        VALID_FORMAT: round(sum(t.valid_format for t in trajs) / n, 4),
        SEARCHES: round(sum(t.n_searches for t in trajs) / n, 3),
        # model turns (what reward.turn_cost charges) and, with sub-queries, the retriever
        # queries they carried (as the evaluation counts them)
        TURNS: round(sum(len(t.steps) for t in trajs) / n, 3),
        **({"queries": round(sum(t.n_queries for t in trajs) / n, 3)} if sub_queries else {}),
        RESPONSE_LENGTH: round(sum(t.n_generated for t in trajs) / n, 1),
        "finished_answer": round(sum(t.finish_reason == "answer" for t in trajs) / n, 4),
        REWARD_BY_TYPE: {k: round(sum(v) / len(v), 4) for k, v in sorted(by_type.items())},
    })
    return out


def lookups_by_kind(trajs: Sequence[Trajectory]) -> dict[str, dict[str, float | None]]:
    """Per question kind: `planned`, the mean number of lookups the first thought plans
    (over the `n_planned` episodes that state one), `made`, the searches made, `one`, the
    share of episodes that made exactly one, `em`, and `n`, the episodes. Whether the hop decision
    follows the question shows here: a single-hop question should plan and make one."""
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        groups[question_kind(t)].append(t)
    out = {}
    for kind, ts in sorted(groups.items()):
        plans = [p for t in ts if (p := t.planned_lookups) is not None]
        out[kind] = {"planned": _mean(plans, 3),
                     "made": _mean([t.n_searches for t in ts], 3),
                     "one": _mean([float(t.n_searches == 1) for t in ts], 3),
                     "em": _mean([float(correct(t)) for t in ts], 3), "n": len(ts),
                     "n_planned": len(plans)}
    return out


def dev_figures(metrics: dict[str, Any]) -> dict[str, Any]:
    """What a dev evaluation adds to the log (as `dev_<name>`): the greedy average's EM, F1,
    format, searches, the share of episodes that made exactly one search and the lookups
    planned; on yes/no questions how often it says yes and the gold does, and how many;
    per question type EM, searches, one-search share and plan; with sampled episodes,
    pass@1 (`sampled_em`) and pass@K."""
    avg = metrics["average"]
    out = {k: avg.get(k) for k in ("em", "f1", "valid_format", "searches", "questions",
                                   "one_search", "planned_lookups", "answered_yes", "answered_no",
                                   "gold_yes", "yes_no_questions")}
    sets = metrics.get("by_type", {})
    # a dev set of several data sets (hotpotqa+2wiki both have comparisons): one row per
    # set and type, where one set's row had written over another's
    by_type = {f"{name}/{t}" if len(sets) > 1 else t:
               {k: row.get(k) for k in ("em", "searches", "one_search", "planned_lookups",
                                        "questions")}
               for name, rows in sets.items() for t, row in rows.items()}
    if by_type:
        out["by_type"] = by_type
    sampled = metrics.get("sampled")
    if sampled:
        out["sampled_em"] = sampled.get("em")
        out.update({k: v for k, v in sampled.items() if k.startswith("pass@")})
    return out


def step_line(r: dict, total: int, elapsed: float) -> str:
    """A step's console line."""
    def f(key, fmt="{:.3f}"):
        v = r.get(key)
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)
    left = elapsed / max(1, r[STEP]) * (total - r[STEP]) / 60
    return (f"step {r[STEP]}/{total}  reward {f(REWARD)}  EM {f(EM)}  "
            f"valid {f(VALID_FORMAT, '{:.2f}')}  searches {f(SEARCHES, '{:.2f}')}  "
            f"kl {f(KL, '{:.4f}')}  ent {f(ENTROPY, '{:.3f}')}  clip {f(CLIP_FRAC)}  "
            f"grad {f(GRAD_NORM, '{:.2f}')}  [{f(TIME_STEP, '{:.0f}')} s/step, "
            f"~{left:.1f} min left]{lookups_line(r.get(LOOKUPS_BY_KIND))}")


def lookups_line(by_kind: Any) -> str:
    """The step line's tail: per question kind the lookups made, and planned where the
    first thought states a plan (`bridge-2 1.8/2.0`), so the hop decision is seen per kind."""
    if not isinstance(by_kind, dict) or not by_kind:
        return ""
    def cell(kind: str, row: dict) -> str:
        made, planned = row.get("made"), row.get("planned")
        if made is None:
            return ""
        return f"{kind} {made:.1f}" + (f"/{planned:.1f}" if planned is not None else "")
    cells = [c for kind, row in sorted(by_kind.items()) if isinstance(row, dict)
             and (c := cell(kind, row))]
    return f"\n  lookups made/planned: {'  '.join(cells)}" if cells else ""
