"""The training-health monitor: warns when an RL run shows a known collapse pattern.

The trainer calls `Monitor.update(step, metrics)` once per optimizer step. Each signal's
baseline is the median of its first `window` observed values (the policy before RL has moved
it much; a median, so one odd early step does not set it); its checks start once the baseline
exists and compare the mean of its last `window` observed values with it (one noisy step is
not a trend). The checks, for GRPO / PPO on a search agent:

- grad_norm_explosion: the latest gradient norm is above `grad_norm_factor` x baseline.
  Explosions are single-step spikes, so the latest value is compared, not a mean, and the
  baseline rolls: the median of the previous `4 x window` norms. A fixed baseline from the
  first steps false-alarms on a healthy run whose weak policy starts succeeding (more groups
  with signal, so a larger gradient, step after step); a spike still stands out against
  the steps just before it. A nan / inf
  norm is a collapse at once, before any baseline: the update itself is broken. A zero norm
  (every group's rewards tied: no advantage, no update) says nothing about the gradient's
  scale and is not an observation, or a run that starts with tied groups would get a
  baseline of 0 and call any later step an explosion.
- entropy_collapse: the mean per-token entropy of the policy falls below
  `entropy_floor_ratio` x baseline. A near-deterministic policy samples the same episode
  for every member of a group, the group's advantages are zero and exploration stops
  (entropy collapse; Cui et al., 2025).
- correct_logp_falling: the update lowered the likelihood of the very episodes it was shown
  as right: `correct_logp_shift` (per-token log-prob of the batch's right episodes after
  the update minus before) averages below -`correct_logp_drop` over the last `window`
  updates. The negative gradient of the wrong responses, which share most tokens with the
  right ones, pushes the right ones down too: lazy likelihood displacement (Deng et al.,
  2025), which precedes GRPO's collapse on Search-R1-style tool use. It needs no baseline:
  a healthy update raises the positives' likelihood.
- valid_format_collapse: the fraction of episodes with a valid protocol trace falls more than
  `valid_format_drop` (absolute) below baseline. Malformed tags end episodes early, every
  reward becomes the format penalty, and the group has nothing left to compare.
- type_reward_drop: one question type's mean reward falls more than `type_reward_drop`
  (absolute) below that type's own baseline, even while the mean reward holds: the policy is
  trading one type (say multi-hop) for another instead of improving on both. Each type has
  its own baseline, from the first `window` steps on which it appeared.
- searches_drift: the mean number of searches per episode moves more than `searches_drift`
  (relative) from baseline. Falling is the reported pattern: the policy answers after one
  search, or from its own memory, and stops using the tool. Rising may be the policy learning
  the tool or a search loop, so it is worth a look, never a stop (it only warns).
- search_collapse: on data with multi-hop questions (`reward_multihop`: hops >= 2, or where
  no hop count is given a multi-hop type such as HotpotQA's bridge and comparison), searches
  per episode fall towards one: the mean of the last `window` steps is at most `search_floor`
  and `searches_drop` (absolute) below the *first* step's value, the policy before any
  update. This is the credit-assignment failure of outcome-only RL on multi-hop search: the
  policy learns to search once and guess, which holds the mean reward (single-hop and
  comparison questions gain) while the bridge questions it can no longer answer go to zero.
  Its baseline is the first step, not the median of the first `window`: the fall can
  happen within the first few steps, by which time a median baseline has already moved most
  of the way; and a relative `searches_drift` threshold misses it when the start is low
  (1.6 -> 1.0 is 38%). It warns even while the sampled multi-hop reward holds: comparison
  questions can gain while the bridge questions are lost, so the training reward cannot be
  what decides. It is a collapse once the
  multi-hop reward has also fallen more than `multihop_drop` below its baseline and to
  less than half of it.
- greedy_search_collapse: the same fall, read from the greedy evaluations on `eval.data`
  (`Monitor.update_eval`, at every `eval.every` steps and at the end): the searches per
  question of the latest evaluation are at most `search_floor` and `searches_drop` below
  those of the first evaluation (the policy before training, with `eval.at_start`), on a
  run whose training questions include multi-hop ones. A policy can collapse greedily and
  not when sampled (sampling keeps a second search that the greedy policy no longer
  makes), which no training signal shows. It only warns: an evaluation is a few dozen
  questions.
- no_signal: for `no_signal_steps` steps in a row no group's rewards varied
  (`groups_with_signal` is 0): every group-relative advantage is zero and the outcome reward
  teaches nothing. It is where the other collapses end (every rollout invalid) and where a
  run starts that is too hard for its policy. It needs no baseline, so it fires even when
  the collapse began inside the baseline window; twice as many steps in a row is a
  collapse. When every tied group answered right (`groups_solved` is 1) the policy is not
  broken, the questions are too easy for it: that only warns, and such steps do not count
  towards the collapse.
- constant_answer: a greedy evaluation (`Monitor.update_eval`) gave every one of its
  yes/no questions (at least `constant_answer_min` of them) the same answer while the
  golds hold both, at least a fifth each: the policy does not compare, and its EM on them
  is the golds' share of that answer, which RL can move by swapping one constant for the
  other: a swap alerts again. It only warns.
- hop_drift: one question kind's lookups (`lookups_by_kind`: `single-1`, `bridge-3`, ...)
  move more than `hop_drift` lookups an episode from that kind's own baseline, the median of
  its first `window` appearances, over its last `window` appearances. The run's mean
  searches hide it: bridges dropping a hop while single-hop questions stop over-hopping
  leaves the mean where it was, and that trade is the hop decision moving for one kind of
  question rather than following the question. The message gives the lookups the first
  thought plans beside the ones made. It only warns.
- greedy_hop_drift: the same per question type, read from the greedy evaluations
  (`by_type`'s searches) against the first evaluation with that type. It only warns.
- low_signal: some groups vary, but over a window of steps their share averages below
  `low_signal`: the run learns from a few questions a step. Mostly all-right groups mean
  questions the policy already answers (a warm-up that trained on them teaches their
  answers), mostly all-wrong ones questions out of its reach; a sharp policy sampled at a
  low temperature ties its groups either way. It only warns.

Severity is "warn" past the threshold and "collapse" twice past it: grad norm above
2 x factor x baseline, entropy below ratio / 2 x baseline, a log-prob, format or type-reward
drop more than twice the allowed drop. Where twice the drop is out of reach (a drop of 0.3
twice over from a baseline of 0.5), falling to almost nothing is a collapse too: a
valid-format rate below 0.1, searches below a tenth of the baseline.

A signal whose baseline is (near) zero has nothing to fall from: entropy and searches are
not checked then, so nothing divides by a zero baseline (a grad norm's message says "far
above" instead of a ratio).

Each alert kind (each question type, for type_reward_drop) alerts once, and again only after
its signal recovered (a check that finds nothing) or when its severity rises; a missing value
leaves it as it was. `healthy` is False while any signal is at "collapse": from the update
whose alert said so until that signal's check passes again. Other non-finite values than the
gradient norm (a nan entropy comes with a nan gradient) are treated as missing.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from seekrl.config import MonitorConfig
from seekrl.rl import step_metrics as M

KINDS = ("grad_norm_explosion", "entropy_collapse", "correct_logp_falling", "valid_format_collapse",
         "type_reward_drop", "searches_drift", "search_collapse", "greedy_search_collapse",
         "no_signal", "low_signal", "constant_answer", "hop_drift", "greedy_hop_drift")
# raised by `update_eval` (a greedy dev evaluation), not by a training step
EVAL_KINDS = frozenset({"greedy_search_collapse", "constant_answer", "greedy_hop_drift"})
SEVERITIES = (None, "warn", "collapse")   # in increasing order
NEAR_ZERO = 1e-8          # a baseline at or below this has nothing to fall from
FORMAT_FLOOR = 0.1        # a valid-format rate below this is a collapse
SEARCHES_FLOOR = 0.1      # searches below this fraction of the baseline are a collapse


@dataclass
class Alert:
    step: int
    kind: str        # one of KINDS
    severity: str    # "warn" | "collapse"
    message: str     # one sentence with the numbers

    def to_dict(self) -> dict:
        return asdict(self)


ROLLING = 4   # the grad norm's baseline: the median of the previous ROLLING x window norms


class _Signal:
    """One metric's history: its first `window` values (the baseline), its last `window`
    values (the recent value), its last `ROLLING x window` values (a rolling baseline), and
    where its check stands."""

    def __init__(self, window: int):
        self.window = window
        self.first: list[float] = []
        self.last: deque[float] = deque(maxlen=window)
        self.rolling: deque[float] = deque(maxlen=ROLLING * window)
        self.level: str | None = None     # the latest check's severity

    def observe(self, value: float) -> None:
        if len(self.first) < self.window:
            self.first.append(value)
        self.last.append(value)
        self.rolling.append(value)

    @property
    def baseline(self) -> float | None:
        return statistics.median(self.first) if len(self.first) == self.window else None

    @property
    def recent(self) -> float:
        return sum(self.last) / len(self.last)

    def judge(self, severity: str | None) -> bool:
        """Record a check's outcome; True when it is worth an alert: more severe than the
        last check's (a collapse after a fall back to warn alerts again; it was silent,
        judged against the worst since the check last passed)."""
        before, self.level = self.level, severity
        return SEVERITIES.index(severity) > SEVERITIES.index(before)

    def state_dict(self) -> dict:
        return {"first": list(self.first), "last": list(self.last),
                "rolling": list(self.rolling), "level": self.level}

    @classmethod
    def from_state(cls, state: dict, window: int) -> _Signal:
        s = cls(window)
        s.first = [float(v) for v in state["first"]][:window]
        s.last.extend(float(v) for v in state["last"])
        s.rolling.extend(float(v) for v in state.get("rolling", state["last"]))
        s.level = state["level"]
        return s


class _Pooled(_Signal):
    """A `_Signal` of per-step means over different numbers of episodes (a question kind
    drawn once one step, twelve times the next): the baseline and the recent value are the
    means over the episodes of their steps, so one step's lone episode weighs as one
    episode, not as a whole step."""

    def __init__(self, window: int):
        super().__init__(window)
        self.first_n: list[float] = []
        self.last_n: deque[float] = deque(maxlen=window)

    def observe(self, value: float, n: float = 1.0) -> None:
        if len(self.first) < self.window:
            self.first_n.append(n)
        self.last_n.append(n)
        super().observe(value)

    @staticmethod
    def _pool(values, counts) -> float:   # every count is positive (observe's callers)
        return sum(v * n for v, n in zip(values, counts)) / sum(counts)

    @property
    def baseline(self) -> float | None:
        return self._pool(self.first, self.first_n) if len(self.first) == self.window else None

    @property
    def recent(self) -> float:
        return self._pool(self.last, self.last_n)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "first_n": list(self.first_n),
                "last_n": list(self.last_n)}

    @classmethod
    def from_state(cls, state: dict, window: int) -> _Pooled:
        s = super().from_state(state, window)
        # checkpoints written before the counts: every step weighs one
        s.first_n = [float(n) for n in state.get("first_n", [1.0] * len(s.first))][:window]
        s.last_n.extend(float(n) for n in state.get("last_n", [1.0] * len(s.last)))
        return s


def _value(x: Any) -> float | None:
    """A metric as a float; None when it is missing or not a number."""
    if x is None or isinstance(x, bool):
        return None
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def _pct(share: float) -> str:
    """A share as a percentage, a small one not rounded to 0%."""
    return f"{share:.0%}" if share >= 0.01 else f"{share:.1%}"


def _finite(x: Any) -> float | None:
    v = _value(x)
    return v if v is not None and math.isfinite(v) else None


def _severity(warn: bool, collapse: bool) -> str | None:
    return "collapse" if collapse else "warn" if warn else None


# Each check: (recent or latest value, baseline, cfg) -> (severity or None, message).
def check_grad_norm(latest: float, baseline: float, cfg: MonitorConfig) -> tuple[str | None, str]:
    limit = cfg.grad_norm_factor * baseline
    severity = _severity(latest > limit, latest > 2 * limit)
    times = f"{latest / baseline:.0f}x" if baseline > NEAR_ZERO else "far above"
    return severity, f"grad norm {latest:.3g} is {times} its baseline {baseline:.3g}"


def check_entropy(recent: float, baseline: float, cfg: MonitorConfig) -> tuple[str | None, str]:
    if baseline <= NEAR_ZERO:
        return None, ""
    ratio = cfg.entropy_floor_ratio
    severity = _severity(recent < ratio * baseline, recent < ratio / 2 * baseline)
    return severity, f"entropy {recent:.3g} is {recent / baseline:.0%} of its baseline {baseline:.3g}"


def check_correct_logp(recent_shift: float, cfg: MonitorConfig) -> tuple[str | None, str]:
    drop = -recent_shift
    severity = _severity(drop > cfg.correct_logp_drop, drop > 2 * cfg.correct_logp_drop)
    return severity, (f"the updates lowered the log-prob of the episodes they were shown as "
                      f"right by {drop:.3g} nats/token each (mean of the last "
                      f"{cfg.window}): likelihood displacement")


def check_valid_format(recent: float, baseline: float, cfg: MonitorConfig) -> tuple[str | None, str]:
    drop = baseline - recent
    warn = drop > cfg.valid_format_drop
    severity = _severity(warn, warn and (drop > 2 * cfg.valid_format_drop or recent < FORMAT_FLOOR))
    return severity, f"valid-format rate {recent:.2f} is {drop:.2f} below its baseline {baseline:.2f}"


def check_type_reward(recent: float, baseline: float, cfg: MonitorConfig) -> tuple[str | None, str]:
    drop = baseline - recent
    severity = _severity(drop > cfg.type_reward_drop, drop > 2 * cfg.type_reward_drop)
    return severity, f"reward {recent:.3g} is {drop:.2f} below its baseline {baseline:.3g}"


def check_searches(recent: float, baseline: float, cfg: MonitorConfig) -> tuple[str | None, str]:
    if baseline <= NEAR_ZERO:
        return None, ""
    change = (recent - baseline) / baseline
    warn = abs(change) > cfg.searches_drift
    falling_far = recent < baseline * max(1 - 2 * cfg.searches_drift, SEARCHES_FLOOR)
    severity = _severity(warn, warn and falling_far)
    direction = "below" if change < 0 else "above"
    return severity, (f"searches per episode {recent:.3g} is {abs(change):.0%} {direction} its "
                      f"baseline {baseline:.3g}")


def check_search_collapse(searches: float, searches_start: float, multihop: float,
                          multihop_base: float | None, cfg: MonitorConfig
                          ) -> tuple[str | None, str]:
    fell_to_one = searches <= cfg.search_floor and searches_start - searches >= cfg.searches_drop
    fell = multihop_base is not None and multihop_base - multihop > cfg.multihop_drop
    severity = _severity(fell_to_one, fell_to_one and fell and multihop < multihop_base / 2)
    head = (f"searches per episode fell to {searches:.2f} (first step {searches_start:.2f}) "
            f"while the multi-hop reward ")
    base = "" if multihop_base is None else f" (baseline {multihop_base:.3g})"
    if fell:
        return severity, (head + f"fell to {multihop:.3g}{base}: the policy is learning to "
                          f"search once and guess")
    return severity, (head + f"is {multihop:.3g}{base}: outcome-only RL on multi-hop questions "
                      f"often learns to search once and guess, which sampled rewards hide; "
                      f"check the bridge questions' EM greedily (seekrl eval)")


def check_greedy_searches(searches: float, searches_start: float, cfg: MonitorConfig
                          ) -> tuple[str | None, str]:
    fell = searches <= cfg.search_floor and searches_start - searches >= cfg.searches_drop
    return _severity(fell, False), (
        f"greedy evaluation: searches per question fell to {searches:.2f} ({searches_start:.2f} "
        f"at the first evaluation) on a run with multi-hop questions: the policy may have "
        f"learnt to search once and guess; compare the bridge questions' EM")


def check_hops(kind: str, recent: float, baseline: float, planned: float | None,
               cfg: MonitorConfig, *, greedy: bool = False) -> tuple[str | None, str]:
    change = recent - baseline
    if not cfg.hop_drift or abs(change) <= cfg.hop_drift:
        return None, ""
    plan = f" (its first thought plans {planned:.2f})" if planned is not None else ""
    single = kind.split("-")[0] == "single" or kind.endswith("-1")
    if change < 0 and not single:
        why = "hops skipped: a multi-hop answer found without its later documents is a guess"
    elif change > 0 and single:
        why = "over-hopping: the extra lookups follow the first answer to another entity"
    elif single:
        why = "fewer extra lookups (a single-hop question needs one); check that the bridges keep theirs"
    else:
        why = "the hop decision moved for this kind of question"
    where = "greedy evaluation: " if greedy else ""
    start = "the first evaluation" if greedy else "its baseline"
    return "warn", (f"{where}{kind!r} questions make {recent:.2f} lookups{plan} against "
                    f"{baseline:.2f} at {start}: {why}")


_CHECKS = ((M.ENTROPY, "entropy_collapse", check_entropy),
           (M.VALID_FORMAT, "valid_format_collapse", check_valid_format),
           (M.SEARCHES, "searches_drift", check_searches))


class Monitor:
    """Feed it each step's metrics; it returns the alerts that step raised."""

    SIGNALS = (M.GRAD_NORM, M.ENTROPY, M.CORRECT_LOGP_SHIFT, M.VALID_FORMAT, M.SEARCHES,
               M.REWARD_MULTIHOP)

    def __init__(self, cfg: MonitorConfig):
        self.cfg = cfg
        self.signals = {name: _Signal(cfg.window) for name in self.SIGNALS}
        self.types: dict[str, _Signal] = {}   # question type -> its reward signal
        self.no_signal = _Signal(cfg.window)  # only its alert state; the run is counted here
        self.search_collapse = _Signal(cfg.window)   # only its alert state
        self.greedy_searches = _Signal(cfg.window)   # evaluations: first = the first one's
        self.no_signal_run = 0                # steps in a row without a varied group
        self.unsolved_run = 0                 # ... of which not every group was right
        self.easy_run = 0                     # steps in a row with every group right
        self.low_signal = _Signal(cfg.window)  # groups_with_signal, for low_signal
        self.solved = _Signal(cfg.window)      # groups_solved, for low_signal's message
        self.constant_answer = _Signal(cfg.window)   # only its alert state (evaluations)
        self.constant_said: str | None = None        # the constant answer last alerted
        self.hops: dict[str, _Pooled] = {}           # question kind -> lookups made
        self.plans: dict[str, _Pooled] = {}          # question kind -> lookups planned
        self.greedy_hops: dict[str, _Signal] = {}    # evaluations: question type -> searches

    @property
    def healthy(self) -> bool:
        return all(s.level != "collapse"
                   for s in (*self.signals.values(), *self.types.values(), self.no_signal,
                             self.search_collapse))

    def update(self, step: int, metrics: dict) -> list[Alert]:
        if not self.cfg.enabled:
            return []
        grad_norm = self.signals[M.GRAD_NORM]
        verdicts = [(grad_norm, "grad_norm_explosion", self._check_grad_norm(metrics.get(M.GRAD_NORM)))]
        shift = self.signals[M.CORRECT_LOGP_SHIFT]
        value = _finite(metrics.get(M.CORRECT_LOGP_SHIFT))
        if value is not None:
            shift.observe(value)
            verdicts.append((shift, "correct_logp_falling",
                             check_correct_logp(shift.recent, self.cfg)
                             if len(shift.last) == self.cfg.window else None))
        for name, kind, check in _CHECKS:
            value = _finite(metrics.get(name))
            if value is not None:
                verdicts.append((self.signals[name], kind, self._observe(self.signals[name], value, check)))
        for qtype, raw in sorted((metrics.get(M.REWARD_BY_TYPE) or {}).items()):
            value = _finite(raw)
            if value is None:
                continue
            signal = self.types.setdefault(str(qtype), _Signal(self.cfg.window))
            verdict = self._observe(signal, value, check_type_reward)
            if verdict is not None:
                verdict = (verdict[0], f"on {qtype!r} questions, {verdict[1]}")
            verdicts.append((signal, "type_reward_drop", verdict))
        verdicts.extend(self._check_hops(metrics.get(M.LOOKUPS_BY_KIND)))
        verdicts.append((self.search_collapse, "search_collapse",
                         self._check_search_collapse(_finite(metrics.get(M.SEARCHES)),
                                                     _finite(metrics.get(M.REWARD_MULTIHOP)))))
        verdicts.append((self.no_signal, "no_signal",
                         self._check_no_signal(_finite(metrics.get(M.GROUPS_WITH_SIGNAL)),
                                               _finite(metrics.get(M.GROUPS_SOLVED)))))
        verdicts.append((self.low_signal, "low_signal",
                         self._check_low_signal(_finite(metrics.get(M.GROUPS_WITH_SIGNAL)),
                                                _finite(metrics.get(M.GROUPS_SOLVED)))))
        alerts = []
        for signal, kind, verdict in verdicts:
            if verdict is None:   # nothing to compare with yet: the signal stays as it was
                continue
            severity, message = verdict
            if signal.judge(severity):
                alerts.append(Alert(step, kind, severity, message))
        return alerts

    def update_eval(self, step: int, metrics: dict) -> list[Alert]:
        """Feed it each greedy evaluation's metrics (`searches` per question; `answered_yes`,
        `gold_yes` and `yes_no_questions`); it returns the alerts it raised
        (greedy_search_collapse, constant_answer)."""
        if not self.cfg.enabled:
            return []
        alerts = self._check_constant_answer(step, metrics)
        for qtype, row in sorted((metrics.get("by_type") or {}).items()):
            value = _finite((row or {}).get(M.SEARCHES))
            if value is None:
                continue
            signal = self.greedy_hops.setdefault(str(qtype), _Signal(self.cfg.window))
            signal.observe(value)
            if len(signal.rolling) < 2:
                continue
            severity, message = check_hops(str(qtype), value, signal.first[0],
                                           _finite(row.get("planned_lookups")), self.cfg,
                                           greedy=True)
            if signal.judge(severity):
                alerts.append(Alert(step, "greedy_hop_drift", severity, message))
        searches = _finite(metrics.get(M.SEARCHES))
        if searches is None:
            return alerts
        signal = self.greedy_searches
        signal.observe(searches)
        if len(signal.rolling) < 2 or not self.signals[M.REWARD_MULTIHOP].rolling:
            return alerts   # nothing to compare with, or no multi-hop question in training
        severity, message = check_greedy_searches(searches, signal.first[0], self.cfg)
        if signal.judge(severity):
            alerts.append(Alert(step, "greedy_search_collapse", severity, message))
        return alerts

    def _check_constant_answer(self, step: int, metrics: dict) -> list[Alert]:
        said, gold = _finite(metrics.get("answered_yes")), _finite(metrics.get("gold_yes"))
        n = metrics.get("yes_no_questions") or 0
        if not self.cfg.constant_answer_min or said is None or gold is None \
                or n < self.cfg.constant_answer_min:
            return []
        said_no = _finite(metrics.get("answered_no"))
        # never saying yes is answering no only if it said no (not a name, not nothing);
        # metrics without `answered_no` (older records) are read as before
        constant = (said == 1.0 or (said == 0.0 and said_no in (None, 1.0))) \
            and 0.2 <= gold <= 0.8
        answer = "yes" if said == 1.0 else "no"
        swapped = constant and self.constant_said not in (None, answer)
        message = (f"greedy evaluation: the policy answered {answer} to all {n} yes/no questions "
                   f"(gold yes {gold:.2f})"
                   + (f", where it answered {self.constant_said} to all before" if swapped else "")
                   + f": it does not compare, and its EM there is the golds' share of {answer!r} "
                   f"({gold if answer == 'yes' else 1 - gold:.2f}); RL moves it by swapping one "
                   "constant answer for the other")
        if swapped:   # the other constant: worth an alert of its own
            self.constant_answer.judge(None)
        severity = _severity(constant, False)
        alert = self.constant_answer.judge(severity)
        self.constant_said = answer if constant else None
        return [Alert(step, "constant_answer", severity, message)] if alert else []

    def _observe(self, signal: _Signal, value: float, check) -> tuple[str | None, str] | None:
        signal.observe(value)
        baseline = signal.baseline
        return None if baseline is None else check(signal.recent, baseline, self.cfg)

    def _check_grad_norm(self, raw: Any) -> tuple[str | None, str] | None:
        signal, value = self.signals[M.GRAD_NORM], _value(raw)
        if value is None:
            return None
        if not math.isfinite(value):
            return "collapse", f"grad norm is {value}: the update is not finite"
        if value <= 0:   # zero: no update happened, which says nothing about the scale
            return None  # (nor that an explosion ended: the alert stands)
        previous = list(signal.rolling)
        signal.observe(value)
        if len(previous) < self.cfg.window:
            return None, ""   # finite, and no explosion (which also ends a nan's collapse)
        return check_grad_norm(value, statistics.median(previous), self.cfg)

    def _check_search_collapse(self, searches: float | None, multihop: float | None
                               ) -> tuple[str | None, str] | None:
        """Reads the searches signal (observed by its own check this step) and observes the
        multi-hop reward; checks once a full window of searches is in."""
        if multihop is None:
            return None
        mh = self.signals[M.REWARD_MULTIHOP]
        mh.observe(multihop)
        sr = self.signals[M.SEARCHES]
        if searches is None or len(sr.last) < self.cfg.window:
            return None
        return check_search_collapse(sr.recent, sr.first[0], mh.recent, mh.baseline, self.cfg)

    def _check_hops(self, by_kind: Any) -> list[tuple[_Signal, str, tuple | None]]:
        """One verdict per question kind seen this step (`lookups_by_kind`'s rows)."""
        verdicts = []
        for kind, row in sorted((by_kind if isinstance(by_kind, dict) else {}).items()):
            made = _finite((row or {}).get("made"))
            if made is None:
                continue
            n = _finite(row.get("n"))
            n = n if n is not None and n > 0 else 1.0   # rows without a count weigh one
            planned = _finite(row.get("planned"))
            # the plan is a mean over the episodes that state one (logs before
            # `n_planned`: weighed by all of them)
            n_planned = _finite(row.get("n_planned"))
            if planned is not None and n_planned != 0:
                self.plans.setdefault(str(kind), _Pooled(self.cfg.window)).observe(
                    planned, n if n_planned is None else n_planned)
            signal = self.hops.setdefault(str(kind), _Pooled(self.cfg.window))
            signal.observe(made, n)
            plans = self.plans.get(str(kind))
            verdict = None if signal.baseline is None else check_hops(
                str(kind), signal.recent, signal.baseline,
                plans.recent if plans and plans.last else None, self.cfg)
            verdicts.append((signal, "hop_drift", verdict))
        return verdicts

    def _check_no_signal(self, share: float | None, solved: float | None
                         ) -> tuple[str | None, str] | None:
        if share is None:
            return None
        all_right = solved is not None and solved >= 1.0
        self.no_signal_run = self.no_signal_run + 1 if share <= 0 else 0
        # a collapse is ties the policy did not solve: steps too easy to teach only warn,
        # and neither count towards it nor break it
        self.unsolved_run = 0 if share > 0 else self.unsolved_run + (not all_right)
        self.easy_run = self.easy_run + 1 if all_right and share <= 0 else 0
        n, steps = self.no_signal_run, self.cfg.no_signal_steps
        if all_right:   # every group all right: too easy
            n = self.easy_run
            s = "s" if n != 1 else ""
            return _severity(n >= steps, False), (
                f"every group answered right for {n} step{s} in a row: the questions are too "
                "easy for the policy and teach it nothing (harder data, or dynamic sampling)")
        s = "s" if n != 1 else ""
        return _severity(n >= steps, self.unsolved_run >= 2 * steps), (
            f"no group's rewards varied for {n} step{s} in a row: every group-relative "
            "advantage is zero and the outcome reward teaches nothing")

    def _check_low_signal(self, share: float | None, solved: float | None
                          ) -> tuple[str | None, str] | None:
        if share is None or not self.cfg.low_signal:
            return None
        self.low_signal.observe(share)
        if solved is not None:
            self.solved.observe(solved)
        w = self.cfg.window
        if len(self.low_signal.last) < w or share <= 0:   # a step without any: no_signal's
            return None
        mean = self.low_signal.recent
        if mean >= self.cfg.low_signal:
            return None, ""
        tied = 1 - mean
        right = self.solved.recent if len(self.solved.last) == w else None
        if right is not None and right >= tied / 2:
            why = (f"{_pct(right)} of groups answered right every time: questions the policy "
                   "already answers (did its warm-up train on them?)")
        elif right is not None:
            why = (f"{_pct(tied - right)} of groups tied below a right answer: questions out "
                   "of its reach")
        else:
            why = f"{_pct(tied)} of groups tied"
        return "warn", (
            f"only {_pct(mean)} of groups had rewards that varied over the last {w} steps "
            f"(a group-relative advantage learns from those alone); {why}. Train on "
            "questions it gets right sometimes, raise rollout.temperature or group_size, or "
            "algo.dynamic_sampling: true")

    def state_dict(self) -> dict:
        return {"signals": {name: s.state_dict() for name, s in self.signals.items()},
                "types": {t: s.state_dict() for t, s in self.types.items()},
                "no_signal": {**self.no_signal.state_dict(), "run": self.no_signal_run,
                              "unsolved": self.unsolved_run, "easy": self.easy_run},
                "low_signal": self.low_signal.state_dict(), "solved": self.solved.state_dict(),
                "search_collapse": self.search_collapse.state_dict(),
                "constant_answer": {**self.constant_answer.state_dict(),
                                    "said": self.constant_said},
                "greedy_searches": self.greedy_searches.state_dict(),
                **{name: {k: s.state_dict() for k, s in getattr(self, name).items()}
                   for name in ("hops", "plans", "greedy_hops")}}

    def load_state_dict(self, state: dict) -> None:
        window = self.cfg.window
        self.signals = {name: _Signal.from_state(state["signals"][name], window)
                        if name in state.get("signals", {}) else _Signal(window)
                        for name in self.SIGNALS}
        self.types = {t: _Signal.from_state(s, window) for t, s in state.get("types", {}).items()}
        saved = state.get("no_signal")   # absent in checkpoints written before this check
        self.no_signal = _Signal.from_state(saved, window) if saved else _Signal(window)
        self.no_signal_run = int(saved["run"]) if saved else 0
        self.unsolved_run = int(saved.get("unsolved", saved["run"])) if saved else 0
        self.easy_run = int(saved.get("easy", 0)) if saved else 0
        for name in ("low_signal", "solved", "constant_answer"):   # absent in older checkpoints
            saved = state.get(name)
            setattr(self, name, _Signal.from_state(saved, window) if saved else _Signal(window))
        self.constant_said = (state.get("constant_answer") or {}).get("said")
        saved = state.get("search_collapse")
        self.search_collapse = _Signal.from_state(saved, window) if saved else _Signal(window)
        saved = state.get("greedy_searches")
        self.greedy_searches = _Signal.from_state(saved, window) if saved else _Signal(window)
        for name, kind in (("hops", _Pooled), ("plans", _Pooled), ("greedy_hops", _Signal)):
            setattr(self, name, {k: kind.from_state(s, window)   # absent in older checkpoints
                                 for k, s in (state.get(name) or {}).items()})
