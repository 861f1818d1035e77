"""The training report: curves from metrics logs, the before/after table, run discovery."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from seekrl.agent.trajectory import Trajectory
from seekrl.eval import training_report
from seekrl.eval.evaluate import score_trajectories
from seekrl.eval.training_report import (
    comparison_table,
    plot_curves,
    report_for_run,
    time_stacks,
    write_training_report,
)

EVIL_LABEL = "<b>x</b>"


def eval_metrics(correct: list[bool], types: list[str]) -> dict:
    """metrics.json as `evaluate` writes it, from one-step trajectories: question i is
    answered right when correct[i], and has metadata type types[i]."""
    trajs = [Trajectory(example_id=f"q{i}", group_id=f"q{i}", question=f"question {i}?",
                        golden_answers=["paris"], token_ids=[1, 2, 3], loss_mask=[0, 1, 1],
                        prompt_len=1, answer="paris" if ok else "rome", finish_reason="answer",
                        dataset="nq", metadata={"type": t})
             for i, (ok, t) in enumerate(zip(correct, types))]
    return {"config": {"model": "tiny", "rollout": {"method": "agent"}},
            **score_trajectories(trajs)}


def write_eval(folder: Path, metrics: dict, viewer: bool = False) -> Path:
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps(metrics), encoding="utf-8")
    if viewer:
        (folder / "viewer.html").write_text("<html>episodes</html>", encoding="utf-8")
    return folder


def rl_log(n: int = 6) -> list[dict]:
    """RL lines with keys missing here and there, an eval line, and a non-numeric value."""
    lines = []
    for step in range(1, n + 1):
        line = {"step": step, "reward": 0.1 * step, "em": 0.05 * step, "kl": 0.01 * step,
                "entropy": 1.0 - 0.05 * step, "grad_norm": 1.5, "response_length": 100 + step,
                "searches": 1.2, "valid_format": 0.9, "time_rollout": 3.0, "time_update": 1.0,
                "time_step": 5.0,
                "reward_by_type": {"bridge": 0.1 * step, "comparison": 0.2},
                "note": "text is ignored"}
        if step % 2:
            line.pop("kl")
            line["time_scoring"] = 0.5
        lines.append(line)
    lines.append({"step": n, "dev_em": 0.4, "dev_f1": 0.5, "dev_valid_format": 0.95})
    return lines


def write_log(path: Path, lines: list[dict], torn_tail: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(line) + "\n" for line in lines)
    path.write_text(text + ('{"step": 99, "rew' if torn_tail else ""), encoding="utf-8")
    return path


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "rl-run"
    write_log(run / "metrics.jsonl", rl_log(), torn_tail=True)
    (run / "alerts.jsonl").write_text(json.dumps(
        {"step": 3, "kind": "kl_spike", "severity": "warn",
         "message": "KL <jumped> to 0.5"}) + "\n", encoding="utf-8")
    types = ["bridge", "bridge", "comparison", "comparison"]
    write_eval(run / "eval" / "final", eval_metrics([True, True, True, False], types),
               viewer=True)
    write_eval(run / "eval" / "before", eval_metrics([True, False, False, False], types))
    return run


def img_sources(page: str) -> list[str]:
    return [unquote(src) for src in re.findall(r'<img src="([^"]+)"', page)]


def test_plot_curves_skips_groups_without_data(tmp_path: Path):
    written = plot_curves({"rl": rl_log()}, tmp_path / "plots")
    names = [p.stem for p in written]
    assert names == ["reward", "kl_entropy", "grad_norm", "length_searches", "valid_format",
                     "reward_by_type", "time_split", "dev"]
    assert all(p.is_file() and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written)

    sft = [{"step": s, "loss": 2.0 / s, "lr": 1e-4, "tokens_per_s": 900.0} for s in range(1, 4)]
    names = [p.stem for p in plot_curves({"sft": sft}, tmp_path / "sft")]
    assert names == ["loss", "throughput"]
    assert plot_curves({"empty": [], "text": [{"step": 1, "note": "x"}]}, tmp_path / "none") == []


def test_plot_curves_overlays_logs_and_smooths_long_runs(tmp_path: Path):
    long = [{"step": s, "reward": (s % 7) / 7, "grad_norm": 1.0} for s in range(200)]
    sft = [{"step": s, "grad_norm": 2.0, "loss": 1.0} for s in range(5)]
    written = plot_curves({"sft": sft, "rl": long}, tmp_path)
    assert [p.stem for p in written] == ["reward", "grad_norm", "loss"]


def test_a_value_gone_nan_is_marked_on_its_curve_and_named_in_the_trends(tmp_path: Path,
                                                                           monkeypatch):
    """A finite-only line ran straight over a step whose loss or KL was NaN: the curve
    looked healthy. The steps are drawn as dotted lines and said in the trend table."""
    from matplotlib.axes import Axes

    from seekrl.recipes.setup import MetricsLog

    log = MetricsLog(tmp_path / "metrics.jsonl")   # what a run writes, read back
    for s in range(1, 13):
        bad = s in (4, 9)
        log.write({"step": s, "reward": float("nan") if bad else 0.1 * s,
                   "kl": float("inf") if s == 9 else 0.01, "grad_norm": 1.0})
    log.write({"step": 12, "grad_norm": float("nan")})   # a resumed step: the later line wins
    log.close()
    records = training_report.read_metrics_log(tmp_path / "metrics.jsonl")
    assert training_report.nonfinite_steps(records, "reward") == [4, 9]
    assert training_report.nonfinite_steps(records, "kl") == [9]
    assert training_report.nonfinite_steps(records, "grad_norm") == [12]
    assert 4 not in training_report._series(records, "reward")[0]
    drawn = []
    real = Axes.vlines
    monkeypatch.setattr(Axes, "vlines", lambda ax, x, *a, **k: drawn.append(
        (list(x), k.get("label"))) or real(ax, x, *a, **k))
    plot_curves({"rl": records}, tmp_path / "plots")
    assert ([4, 9], "reward: NaN/inf at step 4, 9") in drawn
    assert ([12], "grad_norm: NaN/inf at step 12") in drawn
    rows = {row[0]: row for row in training_report.trend_rows(records)}
    assert rows["reward"][4].endswith("; NaN/inf at step 4, 9")
    assert rows["KL to the reference"][4].endswith("NaN/inf at step 9")
    # too few finite points for a trend, yet named
    (few,) = training_report.trend_rows([{"step": 1, "reward": float("nan")},
                                         {"step": 2, "reward": 1.0}])
    assert few[0] == "reward" and few[4] == "NaN/inf at step 1"


def test_lookups_by_kind_are_drawn_from_training_and_dev_lines(tmp_path: Path):
    """Made and planned lookups per kind (training lines), searches per type (dev lines):
    one figure of two panels; a log with neither has none, and a row without a number
    is skipped, not drawn as zero."""
    log = [{"step": s, "lookups_by_kind": {"bridge-2": {"made": 2.0 - 0.1 * s, "planned": 2.0},
                                           "single-1": {"made": 1.0, "planned": None}}}
           for s in range(1, 5)]
    log.append({"step": 4, "dev_by_type": {"bridge": {"searches": 1.8}, "single": {"searches": None}}})
    written = plot_curves({"rl": log}, tmp_path / "both")
    assert [p.stem for p in written] == ["lookups_by_kind"]
    from seekrl.eval.training_report import _nested_keys, _nested_series
    assert _nested_keys(log, "lookups_by_kind") == ["bridge-2", "single-1"]
    assert _nested_series(log, "lookups_by_kind", "single-1", "planned") == ([], [])
    assert _nested_series(log, "dev_by_type", "bridge", "searches") == ([4.0], [1.8])
    # a step logged twice is read from its later line whole: a kind or type that line
    # lacks is not taken from the line it replaced; a row that is no dict is skipped
    from seekrl.eval.training_report import _type_series
    redone = [{"step": 5, "reward_by_type": {"bridge": 0.9}, "lookups_by_kind": {"x": {"made": 3.0}}},
              {"step": 5, "reward_by_type": {"comparison": 0.2}, "lookups_by_kind": {"x": 2}},
              {"step": 6, "reward_by_type": {"bridge": 0.5}}]
    assert _type_series(redone, "bridge") == ([6.0], [0.5])
    assert _type_series(redone, "comparison") == ([5.0], [0.2])
    assert _nested_series(redone, "lookups_by_kind", "x", "made") == ([], [])
    dev_only = plot_curves({"rl": log[-1:]}, tmp_path / "dev")
    assert [p.stem for p in dev_only] == ["lookups_by_kind"]
    assert plot_curves({"rl": [{"step": 1, "lookups_by_kind": {}}]}, tmp_path / "none") == []


def test_time_stacks_phases_and_other():
    labels, steps, stacks = time_stacks(rl_log(2))
    assert labels == ["rollout", "update", "scoring", "other"]  # time_step is the total
    assert steps == [1.0, 2.0]
    assert stacks == [[3.0, 3.0], [1.0, 1.0], [0.5, 0.0], [0.5, 1.0]]
    assert time_stacks([{"step": 1, "loss": 1.0}]) is None
    # the ranker's scoring is inside the rollouts: not stacked beside them (a 16 s step
    # stacked to 20 s, and "other" hid the overlap at 0)
    labels, _, stacks = time_stacks([{"step": 1, "time_rollout": 10, "time_scoring": 1,
                                      "time_ranker_score": 4, "time_update": 4.5,
                                      "time_step": 16}])
    assert "ranker_score" not in labels and sum(s[0] for s in stacks) == 16


def test_comparison_table_rows_deltas_and_types():
    types = ["bridge", "bridge", "comparison", "comparison"]
    header, rows = comparison_table({
        "untrained": eval_metrics([True, False, False, False], types),
        "RL": eval_metrics([True, True, True, False], types)})
    assert header[:3] == ["run", "questions", "EM"]
    assert header[-2:] == ["EM bridge", "EM comparison"]
    assert [r[0] for r in rows] == ["untrained", "RL"]
    em = header.index("EM")
    assert rows[0][em] == "0.250" and rows[1][em] == "0.750 (+0.500)"
    assert rows[1][header.index("questions")] == "4"  # a count gets no delta
    assert rows[1][-2:] == ["1.000 (+0.500)", "0.500 (+0.500)"]
    assert rows[1][header.index("evidence recall")] == "n/a"


def test_comparison_table_shows_the_yes_no_columns_the_runs_have():
    """The before/after table takes its optional columns from the runs, as a run's own
    metrics.md does (it was asked with no rows: 'says yes' never showed)."""
    def yes_no_run(answer: str) -> dict:
        trajs = [Trajectory(example_id=f"q{i}", group_id=f"q{i}", question=f"same city {i}?",
                            golden_answers=[gold], token_ids=[1, 2, 3], loss_mask=[0, 1, 1],
                            prompt_len=1, answer=answer, finish_reason="answer", dataset="nq",
                            metadata={"type": "comparison"})
                 for i, gold in enumerate(["yes", "no", "no"])]
        return {"config": {}, **score_trajectories(trajs)}

    header, rows = comparison_table({"start": yes_no_run("no"), "RL": yes_no_run("yes")})
    assert header[header.index("says yes") + 1] == "gold yes"
    assert rows[0][header.index("says yes")] == "0.000"
    assert rows[1][header.index("says yes")] == "1.000 (+1.000)"
    plain, _ = comparison_table({"a": eval_metrics([True], ["bridge"])})
    assert "says yes" not in plain


def test_comparison_table_compares_like_with_like():
    """Averages over other data sets, or over another number of samples, were shown with
    a difference against the first run; runs that all sample K say EM is a mean of K."""
    types = ["bridge", "bridge"]
    a, b = eval_metrics([True, False], types), eval_metrics([True, True], types)
    other = {**b, "datasets": {**b["datasets"], "hotpotqa": b["datasets"]["nq"]}}
    header, rows = comparison_table({"a": a, "b": other})
    em = header.index("EM")
    assert rows[1][0].endswith("(other data sets or samples: no difference shown)")
    assert "(" not in rows[1][em]
    # the same set, other questions (100 against 3,000 of nq): no difference either
    more = {**b, "datasets": {"nq": {**b["datasets"]["nq"], "questions": 3000}}}
    header, rows = comparison_table({"a": a, "b": more})
    assert rows[1][0].endswith("(other data sets or samples: no difference shown)")
    header, rows = comparison_table({"a": a, "b": b})
    assert rows[1][em].endswith(")")   # like with like: the difference is shown
    sampled = {label: {**m, "n_samples": 4} for label, m in (("a", a), ("b", b))}
    header, rows = comparison_table(sampled)
    assert "EM (mean of 4)" in header and rows[1][header.index("EM (mean of 4)")].endswith(")")

def test_a_cut_off_alert_line_is_said_on_the_page(run_dir: Path):
    """A dying run's last alert (often its collapse) is the line a kill cuts: it was left
    out with a warning on stderr only, and the page counted the rest as all."""
    with open(run_dir / "alerts.jsonl", "a", encoding="utf-8") as f:
        f.write('{"step": 4, "severity": "collapse", "mess')
    page = report_for_run(run_dir).read_text(encoding="utf-8")
    assert "Alerts (1)" in page and "alerts.jsonl:" in page and "line 2:" in page


def test_report_for_run(run_dir: Path):
    out = report_for_run(run_dir)
    assert out == run_dir / "report.html"
    page = out.read_text(encoding="utf-8")
    sources = img_sources(page)
    assert sources and all((out.parent / s).is_file() for s in sources)
    assert all(s.startswith("report_files/") for s in sources)
    # eval order: "before" first, "final" last, whatever the directory order
    assert page.index(">before<") < page.index(">final<")
    assert "0.250" in page and "0.750 (+0.500)" in page
    assert 'href="eval/final/viewer.html"' in page
    assert "KL &lt;jumped&gt; to 0.5" in page and "<jumped>" not in page
    assert "skipped 1 bad line" in page  # the torn last line is reported, not fatal
    assert "seekrl training report: rl-run" in page
    # the trend table: rl_log's reward and KL rise a step, entropy falls, searches are level
    trends = page[page.index("<h2>Trends</h2>"):page.index("<h2>Training curves</h2>")]
    assert "<th>reward</th><td>0.15</td><td>0.55</td><td>+0.1 ± " in trends
    assert re.search(r"<th>entropy</th>(<td>[^<]*</td>){3}<td>falling</td>", trends)
    assert re.search(r"<th>searches</th>(<td>[^<]*</td>){3}<td>level</td>", trends)
    assert re.search(r"<th>KL to the reference</th>(<td>[^<]*</td>){3}<td>rising</td>"
                     r"<td>3 \(1 at each end\)</td>", trends)   # logged at even steps only
    assert "dev EM" not in trends   # one dev line: no trend


def test_trend_reads_a_run_s_course():
    trend, rows = training_report.trend, training_report.trend_rows
    t = trend(list(range(1, 31)), [0.5 + 0.01 * s for s in range(1, 31)])
    assert (t["window"], t["points"]) == (10, 30)
    assert t["first"] == pytest.approx(0.555) and t["last"] == pytest.approx(0.755)
    assert t["slope"] == pytest.approx(0.01) and t["slope_ci"] == pytest.approx(0, abs=1e-12)
    noisy = trend(list(range(1, 21)), [float(s % 2) for s in range(1, 21)])
    assert abs(noisy["slope"]) < noisy["slope_ci"]   # alternating: no trend to read
    assert trend([1, 2], [0.0, 1.0]) is None and trend([3, 3, 3], [1.0, 2.0, 3.0])["slope"] == 0
    # a figure that wanders (neighbours alike) gets a wider interval than the plain one;
    # one whose residuals alternate keeps the plain one
    xs = list(range(1, 41))

    def plain(ys):
        mx, my = sum(xs) / 40, sum(ys) / 40
        sxx = sum((x - mx) ** 2 for x in xs)
        b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
        ss = sum((y - my - b * (x - mx)) ** 2 for x, y in zip(xs, ys))
        return 1.96 * math.sqrt(ss / 38 / sxx)
    wander = [math.sin(x / 4) for x in xs]
    w = trend(xs, wander)
    assert w["autocorr"] > 0.8 and w["slope_ci"] > 3 * plain(wander)
    assert w["slope_ci"] == pytest.approx(plain(wander) * math.sqrt(
        (1 + min(w["autocorr"], 0.95)) / (1 - min(w["autocorr"], 0.95))))
    alternate = [0.01 * x + (-1) ** x for x in xs]
    a = trend(xs, alternate)
    assert a["autocorr"] < 0 and a["slope_ci"] == pytest.approx(plain(alternate))
    # the order the points come in does not matter: neighbours are neighbours in steps
    shuffled = trend(xs[::-1], wander[::-1])
    assert shuffled["slope_ci"] == pytest.approx(w["slope_ci"])
    # a resumed step logged twice counts once (the later line), a bool is not a number
    records = [{"step": s, "reward": float(s)} for s in (1, 2, 3, 3)] + \
        [{"step": 4, "reward": True}, {"step": 5, "reward": 5.0}]
    (row,) = rows(records)
    assert row[0] == "reward" and row[4] == "rising" and row[5] == "4 (1 at each end)"
    assert rows([{"step": 1, "loss": 2.0}]) == []


def test_write_training_report_escapes_and_links(tmp_path: Path, run_dir: Path):
    out = tmp_path / "site" / "my report.html"
    write_training_report(out, logs={EVIL_LABEL: run_dir / "metrics.jsonl"},
                          evals={EVIL_LABEL: run_dir / "eval" / "before",
                                 "after": run_dir / "eval" / "final"},
                          alerts=run_dir / "alerts.jsonl", title="T <i>", notes=["a < b & c"])
    page = out.read_text(encoding="utf-8")
    assert EVIL_LABEL not in page and "&lt;b&gt;x&lt;/b&gt;" in page
    assert "<p class=\"notes\">a &lt; b &amp; c</p>" in page and "T &lt;i&gt;" in page
    sources = img_sources(page)
    assert sources and all((out.parent / s).resolve().is_file() for s in sources)
    assert (tmp_path / "site" / "my report_files").is_dir()
    href = re.search(r'<a href="([^"]+)">episodes</a>', page).group(1)
    assert (out.parent / unquote(href)).resolve() == (run_dir / "eval" / "final" / "viewer.html")
    assert page.count("no viewer") == 1  # "before" has none


def test_write_training_report_missing_inputs(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        write_training_report(tmp_path / "r.html", logs={"rl": tmp_path / "nope.jsonl"})
    (tmp_path / "empty-eval").mkdir()
    with pytest.raises(FileNotFoundError, match="empty-eval"):
        write_training_report(tmp_path / "r.html", evals={"x": tmp_path / "empty-eval"})


def test_report_for_run_discovers_subruns_and_step_order(tmp_path: Path):
    demo = tmp_path / "demo"
    sft = [{"step": s, "loss": 1.0 / s, "dev_em": 0.1} for s in range(1, 4)]
    write_log(demo / "rl" / "metrics.jsonl", rl_log(3))
    write_log(demo / "sft" / "metrics.jsonl", sft)
    types = ["bridge", "comparison"]
    for name, correct in [("step-20", [True, True]), ("final", [True, True]),
                          ("step-10", [True, False]), ("initial", [False, False])]:
        write_eval(demo / "eval" / name, eval_metrics(correct, types))
    page = report_for_run(demo, tmp_path / "out.html").read_text(encoding="utf-8")
    order = [page.index(f"<th>{n}</th>") for n in ("initial", "step-10", "step-20", "final")]
    assert order == sorted(order)
    assert page.index("<th>sft</th>") < page.index("<th>rl</th>")  # the logs table
    assert {Path(s).stem for s in img_sources(page)} >= {"loss", "reward", "dev"}


def test_report_evals_json_overrides_discovery(tmp_path: Path, run_dir: Path, monkeypatch):
    monkeypatch.setattr(training_report, "plot_curves", lambda logs, out_dir: [])  # not tested here
    # the four questions of the run's own evaluations (other questions are not compared)
    write_eval(tmp_path / "elsewhere" / "sft-eval",
               eval_metrics([True, False, False, True], ["a", "b", "a", "b"]))
    (run_dir / "report_evals.json").write_text(json.dumps(
        {"SFT": "../elsewhere/sft-eval", "RL": "eval/final"}), encoding="utf-8")
    page = report_for_run(run_dir).read_text(encoding="utf-8")
    assert "<th>SFT</th>" in page and "<th>RL</th>" in page
    assert "<th>before</th>" not in page
    assert page.index("<th>SFT</th>") < page.index("<th>RL</th>")


def test_report_for_run_nothing_to_report(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path))):
        report_for_run(tmp_path)
    with pytest.raises(FileNotFoundError, match="no such run folder"):
        report_for_run(tmp_path / "missing")
