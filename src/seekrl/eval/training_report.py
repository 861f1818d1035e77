"""The HTML report of a training run: curves from its metrics logs, before/after eval table.

`seekrl report RUN_DIR` reads what training wrote there:

- `metrics.jsonl` — one JSON object per step (`seekrl.recipes.setup.MetricsLog`): `step` and
  float metrics (RL: reward, kl, clip_frac, time_* ..., `reward_by_type` a dict; SFT: loss,
  grad_norm, lr ...; eval lines add dev_em, dev_f1, dev_valid_format). Any key may be
  missing on any line, so every curve is drawn from the lines that have it;
- `alerts.jsonl` (optional) — what the run's health checks flagged (step, kind, severity,
  message);
- `eval/*/metrics.json` — eval runs of checkpoints (`seekrl.eval.evaluate`), each maybe with
  its `viewer.html`; or `report_evals.json` naming the eval folders to compare.

The page is one HTML file plus a sibling `<stem>_files/` folder of PNGs it refers to by
relative path, so the pair can be zipped or served from a CI artifact. Labels, notes and
alert messages are untrusted text and go through `html.escape`. The figures are drawn on
`matplotlib.figure.Figure` with the Agg canvas, never through pyplot, so making a report
neither switches the caller's backend nor leaves figures open.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from seekrl.data.jsonl import SkipReport, iter_jsonl
from seekrl.errors import DataError
from seekrl.eval.report import (
    METRICS_FILE,
    VIEWER_CSS,
    cell,
    check_metrics,
    config_line,
    escape_html,
    metric_columns,
    metrics_table_html,
)
from seekrl.rl import step_metrics as M

__all__ = ["comparison_table", "plot_curves", "read_metrics_log", "report_for_run", "time_stacks",
           "trend", "trend_rows", "write_training_report"]

LOG_FILE, ALERTS_FILE, EVALS_FILE, VIEWER_FILE = "metrics.jsonl", "alerts.jsonl", \
    "report_evals.json", "viewer.html"

# Above this many points a curve is drawn as a rolling mean over SMOOTH_POINTS-ths of the
# run, the raw values faint behind it: per-step RL rewards are too noisy to read otherwise.
SMOOTH_ABOVE, SMOOTH_POINTS = 50, 25


@dataclass(frozen=True)
class CurveGroup:
    """One figure: `panels` are (y label, keys sharing that y axis), drawn side by side."""

    name: str  # the PNG's file stem
    title: str
    panels: tuple[tuple[str, tuple[str, ...]], ...]


CURVE_GROUPS: tuple[CurveGroup, ...] = (
    CurveGroup("reward", "Reward and exact match", (("score", (M.REWARD, M.OUTCOME, M.EM)),)),
    CurveGroup("kl_entropy", "KL and entropy", (("KL", (M.KL,)), ("entropy", (M.ENTROPY,)))),
    CurveGroup("clipping", "Clip fraction and approximate KL",
               (("clip fraction", (M.CLIP_FRAC,)), ("approx. KL", (M.APPROX_KL,)))),
    CurveGroup("grad_norm", "Gradient norm", (("grad norm", (M.GRAD_NORM,)),)),
    CurveGroup("length_searches", "Response length and searches",
               (("tokens", (M.RESPONSE_LENGTH,)), ("searches / episode", (M.SEARCHES,)))),
    CurveGroup("valid_format", "Valid format",
               (("fraction", (M.VALID_FORMAT, M.DEV + M.VALID_FORMAT)),)),
    CurveGroup("signal", "Learning signal",
               (("groups with signal", (M.GROUPS_WITH_SIGNAL, M.GROUPS_SOLVED)),
                ("log p(correct): before, shift by the update",
                 (M.CORRECT_LOGP, M.CORRECT_LOGP_SHIFT)))),
    CurveGroup("loss", "SFT loss", (("loss", (M.LOSS,)),)),
    CurveGroup("dev", "Dev-set scores", (("score", (M.DEV + M.EM, M.DEV + M.F1)),)),
    CurveGroup("throughput", "Learning rate and throughput",
               (("learning rate", (M.LR,)),
                ("tokens / s", (M.TOKENS_PER_S, M.TRAIN_TOKENS_PER_S)))),
)
# Drawn by their own functions: reward_by_type is a dict per line, time_* keys are stacked;
# these are also the PNGs' stems.
REWARD_BY_TYPE, TIME_SPLIT, LOOKUPS = M.REWARD_BY_TYPE, "time_split", M.LOOKUPS_BY_KIND
# The whole step's seconds: not a phase to stack, what it has beyond the phases is "other".
TIME_TOTAL = M.TIME_STEP
_GROUP_ORDER = ("reward", "kl_entropy", "clipping", "grad_norm", "length_searches",
                "valid_format", REWARD_BY_TYPE, LOOKUPS, TIME_SPLIT, "signal", "loss", "dev",
                "throughput")

# The trend table: does a figure rise over the run? Each with its label, most telling first:
# the training reward says mostly which questions a step drew, so its slope over many steps
# (not its last value) is what says whether the run learns; the rest say why.
TRENDS = ((M.REWARD, "reward"), (M.EM, "rollout EM"), (M.DEV + M.EM, "dev EM"),
          (M.SEARCHES, "searches"), (M.VALID_FORMAT, "valid format"),
          (M.GROUPS_WITH_SIGNAL, "groups with signal"), (M.KL, "KL to the reference"),
          (M.CLIP_FRAC, "clip fraction"), (M.ENTROPY, "entropy"), (M.LOSS, "SFT loss"))
TREND_WINDOW = 10   # steps averaged at each end of a run (a third of a shorter run)

# Eval labels that name the start or the end of training, for ordering the table.
_FIRST_WORDS = {"before", "initial", "init", "base", "baseline", "untrained", "start", "pre"}
_LAST_WORDS = {"final", "after", "last", "end", "post"}


# ----------------------------------------------------------------------------- reading


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def read_metrics_log(path: str | Path, report: SkipReport | None = None) -> list[dict]:
    """The records of a metrics log, bad lines skipped (into `report`): a run killed while
    writing leaves a torn last line, and the report should still show the rest."""
    return [obj for _, obj in iter_jsonl(path, skip_bad=True, report=report)]


def _points(records: Sequence[dict], key: str) -> dict[float, float | None]:
    """Step -> the value of `key`, None where it is a number but not finite (NaN, inf).
    A resumed run logs some steps twice: the later line wins, as it is the one the run
    went on from."""
    by_step: dict[float, float | None] = {}
    for rec in records:
        step, value = _number(rec.get(M.STEP)), rec.get(key)
        if step is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        by_step[step] = _number(value)
    return by_step


def _series_and_gaps(records: Sequence[dict], key: str
                     ) -> tuple[list[float], list[float], list[float]]:
    """(steps, values) of `key`'s finite values, sorted by step (see `_points`), and the
    steps where it was logged as NaN or infinite: a line drawn through the finite values
    alone would hide them (a loss gone NaN), so the curves and the trend table name them."""
    by_step = _points(records, key)
    steps = sorted(s for s, v in by_step.items() if v is not None)
    gaps = sorted(s for s, v in by_step.items() if v is None)
    return steps, [by_step[s] for s in steps], gaps


def _series(records: Sequence[dict], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of `key`'s finite values, sorted by step."""
    return _series_and_gaps(records, key)[:2]


def nonfinite_steps(records: Sequence[dict], key: str) -> list[float]:
    """The steps whose `key` was logged as NaN or infinite (`_series_and_gaps`)."""
    return _series_and_gaps(records, key)[2]


def _step_list(steps: Sequence[float], most: int = 5) -> str:
    said = ", ".join(f"{s:g}" for s in steps[:most])
    return said + (f" and {len(steps) - most} more" if len(steps) > most else "")


def _type_keys(records: Sequence[dict]) -> list[str]:
    seen: dict[str, None] = {}
    for rec in records:
        by_type = rec.get(REWARD_BY_TYPE)
        if isinstance(by_type, dict):
            seen.update((str(k), None) for k, v in by_type.items() if _number(v) is not None)
    return list(seen)


def _last_per_step(records: Sequence[dict], key: str) -> list[dict]:
    """The records holding a dict under `key`, the last of each step: a step logged twice
    is read whole from its later line (a type that line lacks is not taken from the line
    it replaced)."""
    last: dict[Any, dict] = {}
    for rec in records:
        if isinstance(rec.get(key), dict):
            last[rec.get(M.STEP)] = rec
    return list(last.values())


def _type_series(records: Sequence[dict], type_name: str) -> tuple[list[float], list[float]]:
    flat = [{M.STEP: rec.get(M.STEP), "v": rec[REWARD_BY_TYPE].get(type_name)}
            for rec in _last_per_step(records, REWARD_BY_TYPE)]
    return _series(flat, "v")


def _nested_series(records: Sequence[dict], key: str, name: str, field: str
                   ) -> tuple[list[float], list[float]]:
    """(steps, values) of `record[key][name][field]`: a per-kind row of a step's dict."""
    flat = [{M.STEP: rec.get(M.STEP), "v": row.get(field) if isinstance(
                row := rec[key].get(name), dict) else None}
            for rec in _last_per_step(records, key)]
    return _series(flat, "v")


def _nested_keys(records: Sequence[dict], key: str) -> list[str]:
    seen: dict[str, None] = {}
    for rec in records:
        if isinstance(rec.get(key), dict):
            seen.update((str(k), None) for k, v in rec[key].items() if isinstance(v, dict))
    return sorted(seen)


def _time_keys(records: Sequence[dict]) -> list[str]:
    seen: dict[str, None] = {}
    for rec in records:
        seen.update((k, None) for k, v in rec.items()
                    if k.startswith(M.TIME) and k != TIME_TOTAL and _number(v) is not None)
    return list(seen)


# ----------------------------------------------------------------------------- plotting


def _rolling_mean(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over up to `window` points (fewer at the start, so no point is lost)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def _draw(ax, steps: list[float], values: list[float], label: str, **style) -> str:
    """One line (a smoothed one over its faint raw values when long); its colour."""
    n = len(values)
    if n > SMOOTH_ABOVE:
        raw = ax.plot(steps, values, linewidth=0.8, alpha=0.3, **style)[0]
        style["color"] = raw.get_color()
        ax.plot(steps, _rolling_mean(values, max(2, n // SMOOTH_POINTS)), linewidth=1.5,
                label=label, **style)
        return style["color"]
    # few points (or a sparse key such as dev_em): show each one
    return ax.plot(steps, values, marker="o", markersize=3, linewidth=1.2, label=label,
                   **style)[0].get_color()


def _figure(n_panels: int):
    from matplotlib.figure import Figure

    return Figure(figsize=(6.0 if n_panels == 1 else 5.0 * n_panels, 3.5), dpi=100,
                  layout="constrained")


def _finish(ax, ylabel: str, title: str | None = None) -> None:
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def _save(fig, path: Path) -> Path:
    fig.savefig(path)
    return path


def _plot_group(group: CurveGroup, logs: Mapping[str, Sequence[dict]], path: Path) -> Path | None:
    panels = []
    for ylabel, keys in group.panels:
        lines = []
        for log_name, records in logs.items():
            for key in keys:
                steps, values, bad = _series_and_gaps(records, key)
                if steps or bad:
                    lines.append((f"{log_name}: {key}" if len(logs) > 1 else key, steps, values,
                                  bad))
        if lines:
            panels.append((ylabel, lines))
    if not panels:
        return None
    fig = _figure(len(panels))
    fig.suptitle(group.title)
    for ax, (ylabel, lines) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
        for label, steps, values, bad in lines:
            color = _draw(ax, steps, values, label) if steps else None
            if bad:   # a dotted line across the panel at each step the value was not finite
                ax.vlines(bad, 0, 1, transform=ax.get_xaxis_transform(), linestyles=":",
                          colors=color or "red", linewidth=1.2,
                          label=f"{label}: NaN/inf at step {_step_list(bad, 3)}")
        _finish(ax, ylabel)
    return _save(fig, path)


def _plot_reward_by_type(logs: Mapping[str, Sequence[dict]], path: Path) -> Path | None:
    lines = []
    for log_name, records in logs.items():
        for type_name in _type_keys(records):
            steps, values = _type_series(records, type_name)
            if steps:
                lines.append((f"{log_name}: {type_name}" if len(logs) > 1 else type_name,
                              steps, values))
    if not lines:
        return None
    fig = _figure(1)
    ax = fig.add_subplot()
    for label, steps, values in lines:
        _draw(ax, steps, values, label)
    _finish(ax, "reward", "Reward by question type")
    return _save(fig, path)


def _plot_lookups(logs: Mapping[str, Sequence[dict]], path: Path) -> Path | None:
    """Lookups per episode by question kind: in training (made, solid; planned in the first
    thought, dashed, same colour) and in the greedy dev evaluations by type. Whether the
    hop decision follows the question is read here, not from the mean searches."""
    panels = []
    for ylabel, key, fields in (("lookups (training): made, planned --", M.LOOKUPS_BY_KIND,
                                 ("made", "planned")),
                                ("lookups (greedy dev)", M.DEV + "by_type", ("searches",))):
        lines = []
        for log_name, records in logs.items():
            for kind in _nested_keys(records, key):
                label = f"{log_name}: {kind}" if len(logs) > 1 else kind
                series = [_nested_series(records, key, kind, f) for f in fields]
                if series[0][0]:
                    lines.append((label, series))
        if lines:
            panels.append((ylabel, lines))
    if not panels:
        return None
    fig = _figure(len(panels))
    fig.suptitle("Lookups by question kind")
    for ax, (ylabel, lines) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
        for label, series in lines:
            color = _draw(ax, *series[0], label)
            for steps, values in series[1:]:
                if steps:
                    _draw(ax, steps, values, "_", color=color, linestyle="--")
        _finish(ax, ylabel)
    return _save(fig, path)


def time_stacks(records: Sequence[dict]) -> tuple[list[str], list[float], list[list[float]]] | None:
    """(phase labels, steps, one list of seconds per phase) of a log, or None without time_*
    keys: the phases in first-logged order, a phase missing from a line counted as 0, and
    "other" last (what `time_step` has beyond the phases) where `time_step` is logged."""
    # the ranker's scoring time is spent inside the rollouts (environment.py): stacked
    # beside them it counted twice
    keys = [k for k in _time_keys(records) if k != M.TIME_RANKER_SCORE]
    rows = [rec for rec in records if _number(rec.get(M.STEP)) is not None
            and any(_number(rec.get(k)) is not None for k in keys)]
    if not keys or not rows:
        return None
    by_step = {_number(rec[M.STEP]): rec for rec in rows}  # the later line wins
    steps = sorted(by_step)
    stacks = [[_number(by_step[s].get(k)) or 0.0 for s in steps] for k in keys]
    labels = [k.removeprefix(M.TIME) for k in keys]
    totals = [_number(by_step[s].get(TIME_TOTAL)) for s in steps]
    if any(t is not None for t in totals):
        phases = [sum(col) for col in zip(*stacks)]
        stacks.append([max(0.0, t - p) if t is not None else 0.0 for t, p in zip(totals, phases)])
        labels.append("other")
    return labels, steps, stacks


def _plot_time_split(logs: Mapping[str, Sequence[dict]], path: Path) -> Path | None:
    """Seconds per step stacked by phase (`time_stacks`): one panel per log, as the phases
    of two runs do not add up to anything together."""
    panels = [(log_name, *stack) for log_name, records in logs.items()
              if (stack := time_stacks(records)) is not None]
    if not panels:
        return None
    fig = _figure(len(panels))
    fig.suptitle("Time per step")
    for ax, (log_name, labels, steps, stacks) in zip(
            fig.subplots(1, len(panels), squeeze=False)[0], panels):
        if len(steps) > 1:
            ax.stackplot(steps, *stacks, labels=labels, alpha=0.85)
        else:  # a stack plot of one step is invisible
            bottom = 0.0
            for label, stack in zip(labels, stacks):
                ax.bar(steps, stack, bottom=bottom, label=label)
                bottom += stack[0]
        _finish(ax, "seconds", log_name if len(panels) > 1 else None)
    return _save(fig, path)


def trend(steps: Sequence[float], values: Sequence[float]) -> dict[str, float] | None:
    """A figure's course over a run: its mean over the first and the last `TREND_WINDOW`
    points (a third of a shorter run), and its least-squares slope a step with a 95%
    interval (half-width, normal); None below 3 points. Successive points of one run share
    a policy, so the interval is widened by the residuals' lag-1 autocorrelation `rho`
    where it is positive (the AR(1) variance factor (1 + rho) / (1 - rho), rho at most
    0.95); a figure whose points are each a fresh draw (a step's reward) keeps the plain
    interval. It is for reading, not a test: with few points rho itself is rough."""
    n = len(values)
    if n < 3 or len(steps) != n:
        return None
    mx, my = sum(steps) / n, sum(values) / n
    sxx = sum((x - mx) ** 2 for x in steps)
    slope = sum((x - mx) * (y - my) for x, y in zip(steps, values)) / sxx if sxx else 0.0
    res = [y - my - slope * (x - mx) for x, y in zip(steps, values)]
    ss = sum(r * r for r in res)
    # points in step order: the autocorrelation is of neighbours in time
    ordered = [r for _, r in sorted(zip(steps, res), key=lambda p: p[0])]
    rho = (sum(a * b for a, b in zip(ordered, ordered[1:])) / ss) if ss > 0 else 0.0
    widen = min(max(rho, 0.0), 0.95)
    ci = (1.96 * math.sqrt(ss / (n - 2) / sxx * (1 + widen) / (1 - widen))
          if sxx else 0.0)
    w = min(TREND_WINDOW, max(1, n // 3))
    return {"first": sum(values[:w]) / w, "last": sum(values[-w:]) / w, "slope": slope,
            "slope_ci": ci, "autocorr": rho, "points": n, "window": w}


def trend_rows(records: Sequence[dict]) -> list[list[str]]:
    """The trend table of one log: per figure it logged at 3 steps or more, its first and
    last windows' means, its slope a step with the interval, and how it reads (rising or
    falling where the interval leaves out zero, level where it does not)."""
    rows = []
    for key, label in TRENDS:
        steps, values, bad = _series_and_gaps(records, key)
        t = trend(steps, values)
        said = f"NaN/inf at step {_step_list(bad)}" if bad else ""
        if t is None:
            if bad:   # too few finite points for a trend: the non-finite ones still say
                rows.append([label, "-", "-", "-", said, f"{len(steps)}"])
            continue
        reads = ("rising" if t["slope"] - t["slope_ci"] > 0 else
                 "falling" if t["slope"] + t["slope_ci"] < 0 else "level")
        rows.append([label, f"{t['first']:.4g}", f"{t['last']:.4g}",
                     f"{t['slope']:+.2g} ± {t['slope_ci']:.2g}",
                     f"{reads}; {said}" if said else reads,
                     f"{t['points']} ({t['window']} at each end)"])
    return rows


def _trends_html(records: Mapping[str, list[dict]]) -> str:
    parts = []
    for name, recs in records.items():
        rows = trend_rows(recs)
        if rows:
            parts.append((f"<h3>{escape_html(name)}</h3>" if len(records) > 1 else "")
                         + _table_html(["figure", "first steps", "last steps",
                                        "slope a step (95%)", "reads", "steps"], rows))
    if not parts:
        return ""
    return ("<h2>Trends</h2>" + "".join(parts)
            + '<p class="note">A step\'s reward mostly says which questions it drew: read '
            "whether the run learns from the slope over many steps, and why from the rest "
            "(groups with signal: what a group-relative advantage can learn from; KL and the "
            "clip fraction: how far the updates move the policy; entropy: how much the "
            "rollouts explore). The interval is widened where successive steps are "
            "correlated, and is still for reading, not a test.</p>")


def plot_curves(logs: Mapping[str, Sequence[dict]], out_dir: str | Path) -> list[Path]:
    """One PNG per metric group that has data in some log (`logs`: name -> records), the
    logs overlaid with their names in the legend; returns the paths written, in the
    report's order."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    groups = {g.name: g for g in CURVE_GROUPS}
    written = []
    for name in _GROUP_ORDER:
        path = out_dir / f"{name}.png"
        if name == REWARD_BY_TYPE:
            done = _plot_reward_by_type(logs, path)
        elif name == TIME_SPLIT:
            done = _plot_time_split(logs, path)
        elif name == LOOKUPS:
            done = _plot_lookups(logs, path)
        else:
            done = _plot_group(groups[name], logs, path)
        if done is not None:
            written.append(done)
    return written


# --------------------------------------------------------------------------- the table


def _summary_row(metrics: dict) -> dict:
    """The row an eval run is compared by: the macro average over its data sets."""
    if metrics.get("average"):
        return metrics["average"]
    datasets = metrics.get("datasets") or {}
    return next(iter(datasets.values())) if len(datasets) == 1 else {}


def _with_delta(value: Any, first: Any, fmt: str) -> str:
    text = cell({"v": value}, "v", fmt)
    if _number(value) is None or _number(first) is None or fmt == "{:d}":
        return text
    return f"{text} ({fmt.replace('{:', '{:+', 1).format(value - first)})"


def comparison_table(evals: Mapping[str, dict]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) comparing eval runs (`evals`: label -> metrics.json contents), one row
    per label in order: the averaged metrics, then EM per question type where the runs have
    `by_type`; every row after the first shows its difference to the first, "0.420 (+0.170)"."""
    pass_ks = sorted({int(k) for m in evals.values() for k in m.get("pass_ks") or []})
    # the runs' rows decide the optional columns (the plan, yes/no answers), as in a run's
    # own metrics.md: with none given they never showed
    samples = {m.get("n_samples") or 1 for m in evals.values()}
    columns = metric_columns({"pass_ks": pass_ks,
                              # "EM (mean of K)" where every run sampled K
                              "n_samples": samples.pop() if len(samples) == 1 else 1,
                              "datasets": {label: _summary_row(m) for label, m in evals.items()},
                              "by_type": {label: types for label, m in evals.items()
                                          for types in (m.get("by_type") or {}).values()}})
    type_keys: dict[tuple[str, str], None] = {}
    for m in evals.values():
        for dataset, types in (m.get("by_type") or {}).items():
            type_keys.update(((dataset, t), None) for t in types)
    one_dataset = len({d for d, _ in type_keys}) == 1
    header = ["run", *(label for _, label, _ in columns),
              *(f"EM {t}" if one_dataset else f"EM {d}/{t}" for d, t in type_keys)]

    def values(m: dict) -> list[Any]:
        row = _summary_row(m)
        by_type = m.get("by_type") or {}
        return [*(row.get(key) for key, _, _ in columns),
                *((by_type.get(d) or {}).get(t, {}).get("em") for d, t in type_keys)]

    def measured_on(m: dict) -> tuple:
        # the questions each set held too: 100 and 3,000 questions of nq are unlike
        sets = m.get("datasets") or {}
        return (tuple(sorted((name, (row or {}).get("questions")) for name, row in sets.items())),
                m.get("n_samples") or 1)

    formats = [fmt for _, _, fmt in columns] + ["{:.3f}"] * len(type_keys)
    rows, first, basis = [], None, None
    for label, m in evals.items():
        vals = values(m)
        if first is None:
            first, basis = vals, measured_on(m)
            rows.append([label, *(cell({"v": v}, "v", f) for v, f in zip(vals, formats))])
        elif measured_on(m) != basis:
            # averages over other data sets or another number of samples: a difference
            # would compare unlike things (suite_table refuses the same)
            rows.append([f"{label} (other data sets or samples: no difference shown)",
                         *(cell({"v": v}, "v", f) for v, f in zip(vals, formats))])
        else:
            rows.append([label, *(_with_delta(v, f0, f) for v, f0, f in zip(vals, first, formats))])
    return header, rows


# ---------------------------------------------------------------------------- the page


def _read_eval(path: Path) -> tuple[Path, dict]:
    """(folder, metrics) of an eval run given as its folder or its metrics.json."""
    file = path if path.is_file() else path / METRICS_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{path}: no {METRICS_FILE} (is it an eval run folder?)")
    try:
        metrics = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise DataError(f"not valid JSON ({err.msg})", path=str(file), line=err.lineno) from None
    return file.parent, check_metrics(metrics, file)


def _relative(target: Path, base: Path) -> str:
    """`target` as seen from `base`, for showing; absolute where no relative path exists."""
    try:
        return os.path.relpath(target, base)
    except ValueError:  # Windows, another drive
        return str(target.resolve())


def _href(target: Path, base: Path) -> str:
    """A link from a page in `base` to `target`: relative, so the folder can move."""
    try:
        return quote(Path(os.path.relpath(target, base)).as_posix())
    except ValueError:  # Windows, another drive: no relative path exists
        return target.resolve().as_uri()


def _table_html(header: Sequence[str], rows: Sequence[Sequence[str]],
                extra: tuple[str, Sequence[str]] | None = None) -> str:
    """A table of text cells (escaped here), the first column as row headers; `extra` is a
    last column of ready HTML."""
    head = "".join(f"<th>{escape_html(h)}</th>" for h in header)
    if extra is not None:
        head += f"<th>{escape_html(extra[0])}</th>"
    body = []
    for i, row in enumerate(rows):
        cells = f"<th>{escape_html(row[0])}</th>" + "".join(f"<td>{escape_html(c)}</td>" for c in row[1:])
        if extra is not None:
            cells += f"<td>{extra[1][i]}</td>"
        body.append(f"<tr>{cells}</tr>")
    return (f'<table class="metrics"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table>')


def _logs_html(logs: Mapping[str, Path], records: Mapping[str, list[dict]],
               skipped: Mapping[str, SkipReport], base: Path) -> str:
    """Per log: its file, lines, steps, and the last value of the headline metrics."""
    headline = [(M.REWARD, "last reward"), (M.EM, "last EM"), (M.LOSS, "last loss"),
                (M.DEV + M.EM, "last dev EM")]
    shown = [(k, label) for k, label in headline
             if any(_series(recs, k)[0] for recs in records.values())]
    rows = []
    for name, recs in records.items():
        steps = sorted({s for r in recs if (s := _number(r.get(M.STEP))) is not None})
        span = f"{steps[0]:g} to {steps[-1]:g}" if steps else "none"
        row = [name, _relative(logs[name], base), str(len(recs)), span]
        row += [cell({"v": (_series(recs, k)[1] or [None])[-1]}, "v", "{:.4g}") for k, _ in shown]
        rows.append(row)
    parts = [_table_html(["log", "file", "records", "steps", *(label for _, label in shown)], rows)]
    for name, report in skipped.items():
        if report:
            parts.append(f'<p class="note">{escape_html(name)}: {escape_html(str(report))}</p>')
    return "".join(parts)


def _alerts_html(alerts: list[tuple[str, dict]], several_sources: bool) -> str:
    if not alerts:
        return '<p class="note">No alerts.</p>'
    header = (["run"] if several_sources else []) + ["step", "severity", "kind", "message"]
    rows = []
    for source, a in alerts:
        severity = str(a.get("severity", ""))
        cls = re.sub(r"[^a-z]", "", severity.lower())  # a class name from untrusted text
        cells = ([f"<td>{escape_html(source)}</td>"] if several_sources else []) + [
            f"<td>{escape_html(a.get('step', ''))}</td>",
            f'<td class="sev sev-{cls}">{escape_html(severity)}</td>',
            f"<td>{escape_html(a.get('kind', ''))}</td>",
            f'<td class="msg">{escape_html(a.get("message", ""))}</td>']
        rows.append(f"<tr>{''.join(cells)}</tr>")
    head = "".join(f"<th>{escape_html(h)}</th>" for h in header)
    return (f'<table class="metrics alerts"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


_REPORT_CSS = """
figure.curve{display:inline-block;margin:6px 10px 10px 0;vertical-align:top}
figure.curve img{max-width:100%;border:1px solid #d8dee6}
figure.curve figcaption{font-size:12.5px;color:#555}
table.alerts td{text-align:left}table.alerts td.msg{white-space:pre-wrap}
td.sev-collapse,td.sev-error,td.sev-critical{color:#c62828;font-weight:700}
td.sev-warn,td.sev-warning{color:#a36b00;font-weight:700}
p.notes{max-width:60em}
"""


def write_training_report(out: str | Path, *, logs: Mapping[str, str | Path] | None = None,
                          evals: Mapping[str, str | Path] | None = None,
                          alerts: str | Path | Mapping[str, str | Path] | None = None,
                          title: str = "seekrl training report",
                          notes: Sequence[str] = ()) -> Path:
    """Write the report page `out` and its figures in `<out stem>_files/`; returns `out`.

    `logs`: label -> metrics.jsonl; `evals`: label -> eval run folder (or its
    metrics.json), compared in the given order against the first; `alerts`: an
    alerts.jsonl, or label -> alerts.jsonl for several runs; `notes`: paragraphs of text
    shown under the title. Missing files raise FileNotFoundError naming them."""
    out = Path(out)
    logs = {name: Path(p) for name, p in (logs or {}).items()}
    eval_paths = {name: Path(p) for name, p in (evals or {}).items()}
    alert_paths: dict[str, Path] = {}
    if isinstance(alerts, Mapping):
        alert_paths = {name: Path(p) for name, p in alerts.items()}
    elif alerts is not None:
        alert_paths = {"": Path(alerts)}
    for path in (*logs.values(), *alert_paths.values()):
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file")
    loaded = {name: _read_eval(p) for name, p in eval_paths.items()}
    skipped = {name: SkipReport() for name in logs}
    records = {name: read_metrics_log(p, skipped[name]) for name, p in logs.items()}

    out.parent.mkdir(parents=True, exist_ok=True)
    files_dir = out.parent / f"{out.stem}_files"
    parts = [f"<header><h1>{escape_html(title)}</h1></header><main>"]
    parts += [f'<p class="notes">{escape_html(note)}</p>' for note in notes]

    if loaded:
        header, rows = comparison_table({name: m for name, (_, m) in loaded.items()})
        links = []
        for folder, _ in loaded.values():
            viewer = folder / VIEWER_FILE
            links.append(f'<a href="{escape_html(_href(viewer, out.parent))}">episodes</a>'
                         if viewer.is_file() else '<span class="note">no viewer</span>')
        parts.append("<h2>Before and after</h2>" + _table_html(header, rows, ("viewer", links)))
        if len(loaded) > 1:
            parts.append(f'<p class="note">Differences in brackets are against '
                         f'{escape_html(next(iter(loaded)))}.</p>')

    if alert_paths:
        # a cut-off line (a dying run's last alert, often its collapse) is said on the page
        torn = {source: SkipReport(path=str(p)) for source, p in alert_paths.items()}
        alert_list = [(source, a) for source, p in alert_paths.items()
                      for _, a in iter_jsonl(p, skip_bad=True, report=torn[source])]
        parts.append(f"<h2>Alerts ({len(alert_list)})</h2>"
                     + _alerts_html(alert_list, len(alert_paths) > 1)
                     + "".join(f'<p class="note">{escape_html(str(r))}</p>'
                               for r in torn.values() if r))

    if records:   # whether the run learns first, then the curves that show how
        parts.append(_trends_html(records))
        parts.append("<h2>Training curves</h2>" + _logs_html(logs, records, skipped, out.parent))
        pngs = plot_curves(records, files_dir)
        titles = {g.name: g.title for g in CURVE_GROUPS}
        titles.update({REWARD_BY_TYPE: "Reward by question type", TIME_SPLIT: "Time per step",
                       LOOKUPS: "Lookups by question kind"})
        for png in pngs:
            caption = titles.get(png.stem, png.stem)
            parts.append(f'<figure class="curve"><img src="{escape_html(_href(png, out.parent))}" '
                         f'alt="{escape_html(caption)}"><figcaption>{escape_html(caption)}</figcaption></figure>')
        if not pngs:
            parts.append('<p class="note">The logs hold no numeric metrics to plot.</p>')
        else:
            parts.append(f'<p class="note">Curves of more than {SMOOTH_ABOVE} points show a '
                         f'rolling mean over 1/{SMOOTH_POINTS} of the points, the raw values '
                         f'faint behind it.</p>')

    if loaded:
        parts.append("<h2>Eval runs</h2>")
        for name, (folder, metrics) in loaded.items():
            cfg = metrics.get("config") or {}
            cfg_line = f'<p class="note">{escape_html(config_line(cfg))}</p>' if cfg else ""
            where = escape_html(_relative(folder, out.parent))
            parts.append(f"<details><summary>{escape_html(name)} · <code>{where}</code>"
                         f"</summary>{cfg_line}{metrics_table_html(metrics)}</details>")
    parts.append("</main>")
    page = ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width\"><title>{escape_html(title)}"
            f"</title><style>{VIEWER_CSS}{_REPORT_CSS}</style></head><body>{''.join(parts)}"
            f"</body></html>\n")
    out.write_text(page, encoding="utf-8")
    return out


# ------------------------------------------------------------------------ run discovery


def _order_key(name: str) -> tuple[int, float, str]:
    """Eval and sub-run names in training order: before/initial/untrained first, then SFT,
    then the rest by the step number in the name (step-10 < step-20), final/after last."""
    words = set(re.split(r"[^a-z0-9]+", name.lower()))
    number = re.search(r"\d+", name)
    step = float(number.group()) if number else math.inf
    if words & _FIRST_WORDS:
        rank = 0
    elif words & _LAST_WORDS:
        rank = 3
    elif "sft" in words:
        rank = 1
    else:
        rank = 2
    return rank, step, name


def _listed_evals(run_dir: Path) -> dict[str, Path]:
    file = run_dir / EVALS_FILE
    try:
        listed = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise DataError(f"not valid JSON ({err.msg})", path=str(file), line=err.lineno) from None
    if not isinstance(listed, dict) or not all(isinstance(v, str) for v in listed.values()):
        raise DataError("expected a JSON object of label -> eval folder (relative path)",
                        path=str(file))
    return {label: run_dir / rel for label, rel in listed.items()}


def report_for_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Find what RUN_DIR holds and write its report (default RUN_DIR/report.html).

    Logs: RUN_DIR/metrics.jsonl (labelled by the folder's name), then the metrics.jsonl of
    each direct subfolder (a pipeline's sft/ and rl/), labelled by the subfolder. Alerts:
    the alerts.jsonl beside any of those logs. Evals: those RUN_DIR/report_evals.json
    lists, in its order, else RUN_DIR/eval/*/metrics.json in training order (see
    `_order_key`). FileNotFoundError when there is neither a log nor an eval run."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such run folder")
    name = run_dir.resolve().name
    log_dirs = {name: run_dir} if (run_dir / LOG_FILE).is_file() else {}
    subruns = [d for d in run_dir.iterdir() if d.is_dir() and (d / LOG_FILE).is_file()]
    for d in sorted(subruns, key=lambda d: _order_key(d.name)):
        log_dirs.setdefault(d.name, d)
    logs = {label: d / LOG_FILE for label, d in log_dirs.items()}
    alerts = {label: d / ALERTS_FILE for label, d in log_dirs.items()
              if (d / ALERTS_FILE).is_file()}
    if (run_dir / EVALS_FILE).is_file():
        evals = _listed_evals(run_dir)
    else:
        found = list((run_dir / "eval").glob(f"*/{METRICS_FILE}"))
        evals = {d.parent.name: d.parent for d in sorted(found, key=lambda d: _order_key(d.parent.name))}
    if not logs and not evals:
        hint = f" ({run_dir} looks like an eval run: see `seekrl inspect`)" \
            if (run_dir / METRICS_FILE).is_file() else ""
        raise FileNotFoundError(f"{run_dir}: nothing to report: no {LOG_FILE} in it or its "
                                f"subfolders, no eval/*/{METRICS_FILE}, no {EVALS_FILE}{hint}")
    return write_training_report(out if out is not None else run_dir / "report.html", logs=logs,
                                 evals=evals, alerts=alerts or None,
                                 title=f"seekrl training report: {name}")
