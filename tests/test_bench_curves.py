"""bench/learning_curves.py on fabricated run folders and on the kept records, and the
process ablation's summary line (the gains, their intervals and best_em)."""

from __future__ import annotations

import gzip
import json
import re
import time
from pathlib import Path

import pytest
from conftest import load_bench as load_bench_module
from conftest import write_archive

BENCH = Path(__file__).resolve().parent.parent / "bench"
RECORDS = BENCH / "records"


def load(name: str):
    return load_bench_module(name, register=True)


def step_log(steps: int, every: int = 0, per_step: int = 100, health: bool = False) -> list[dict]:
    """A trainer's metrics.jsonl: a step record per step (with `health`, the figures of the
    curves' second row; step 2 without a KL), a dev line every `every` steps and at the
    last step."""
    lines = []
    for s in range(1, steps + 1):
        lines.append({"step": s, "episodes": 32, "reward": 0.1 * s, "em": 0.05 * s,
                      "searches": 2.0 - 0.1 * s,
                      "rollout_tokens": per_step, "rollout_tokens_total": per_step * s})
        if health:
            lines[-1].update(groups_with_signal=0.5, clip_frac=0.001 * s, entropy=0.05,
                             **({} if s == 2 else {"kl": 0.002 * s}))
        if every and (s % every == 0 or s == steps):
            lines.append({"step": s, "dev_em": 0.3 + 0.01 * s, "dev_f1": 0.4,
                          "dev_searches": 2.0 - 0.2 * s})
    return lines


def write_gz(path: Path, lines: list[dict], torn: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write("".join(json.dumps(x) + "\n" for x in lines) + ('{"step": 9' if torn else ""))


def test_runs_are_read_from_their_step_log_their_result_or_a_partial_log(tmp_path):
    curves = load("learning_curves")
    runs = tmp_path / "runs"
    # a run of today's bench: its result and its whole step log, dev every 2 steps
    new = runs / "outcome-s0"
    write_gz(new / "metrics.jsonl.gz", step_log(5, every=2, health=True), torn=True)
    (new / "result.json").write_text(json.dumps({
        "method": "outcome", "seed": 0, "steps": 5, "rollout_tokens": 500, "em": 0.4,
        "evaluated_on": "test", "curve": [[200, 0.32], [400, 0.34], [500, 0.35]],
        "train_reward": [0.0] * 5}))
    # an older record: no log, the dev curve as (tokens, EM), its steps from eval.every
    old = runs / "recall-s1"
    old.mkdir(parents=True)
    (old / "result.json").write_text(json.dumps({
        "method": "recall", "seed": 1, "steps": 11, "rollout_tokens": 1100, "em": 0.3,
        "evaluated_on": "dev", "curve": [[500, 0.3], [1000, 0.31], [1100, 0.33]],
        "train_reward": [0.2] * 11, "train_searches": [1.5] * 11,
        "config": {"eval": {"every": 5}}}))
    # a run kept before it finished: its log and config, under a name of its own
    partial = runs / "upd4-outcome-s2-partial"
    write_gz(partial / "metrics.jsonl.gz", step_log(3))
    (partial / "config.yaml").write_text("seed: 2\nsteps: 10\n")
    (runs / "eval-sft-test").mkdir()
    (runs / "eval-sft-test" / "metrics.json").write_text(json.dumps({"average": {"em": 0.25}}))
    (runs / "eval-sft-dev").mkdir()
    (runs / "eval-sft-dev" / "metrics.json").write_text(
        json.dumps({"average": {"em": 0.3, "searches": 2.1}}))
    # the same, still going, of the outcome arm: its seed, not an arm of its own
    going = runs / "outcome-s1-partial"
    write_gz(going / "metrics.jsonl.gz", step_log(2))
    (going / "config.yaml").write_text("seed: 1\nsteps: 10\n")
    (runs / "notes").mkdir()   # neither a result nor a log: not a run

    read = curves.read_runs([runs])
    assert sorted((r.arm, r.seed, r.partial) for r in read) == [
        ("outcome", 0, False), ("outcome", 1, True), ("recall", 1, False),
        ("upd4-outcome", 2, True)]
    got = {r.arm: r for r in read if r.seed != 1 or r.arm != "outcome"}
    r = got["outcome"]
    assert (r.seed, r.steps, r.tokens) == (0, [1, 2, 3, 4, 5], [100, 200, 300, 400, 500])
    assert r.reward == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])   # the log's, not the result's
    assert r.dev == [(2, 200, pytest.approx(0.32)), (4, 400, pytest.approx(0.34)),
                     (5, 500, pytest.approx(0.35))]
    assert r.final == (5, 500, 0.4) and r.start == {"test": 0.25, "dev": 0.3}
    # the hop decision: searches per step in training and on the dev probe, and the start's
    assert r.searches == pytest.approx([1.9, 1.8, 1.7, 1.6, 1.5])
    assert r.dev_searches == [(2, pytest.approx(1.6)), (4, pytest.approx(1.2)),
                              (5, pytest.approx(1.0))]
    assert r.start_searches == 2.1
    # why it moved: each step's signal, KL, clip and entropy, None where a step lacks one
    assert r.per_step["groups_with_signal"] == [0.5] * 5
    assert r.per_step["kl"] == [pytest.approx(0.002), None, pytest.approx(0.006),
                              pytest.approx(0.008), pytest.approx(0.01)]
    assert r.per_step["clip_frac"][-1] == pytest.approx(0.005)
    r = got["recall"]
    assert [(s, t) for s, t, _ in r.dev] == [(5, 500), (10, 1000), (11, 1100)]
    assert r.steps == list(range(1, 12)) and r.tokens == [None] * 11 and r.final_on == "dev"
    assert r.per_step == {}   # an old record kept no step log
    assert r.searches == [1.5] * 11 and r.dev_searches == []
    r = got["upd4-outcome"]
    assert (r.seed, r.steps, r.final, r.dev) == (2, [1, 2, 3], None, [])

    # the trend lines: the first and last steps' means and the slope, here exact (a line)
    lines = curves.trends(got["outcome"])
    assert any(x.startswith("trend_outcome_s0_reward=0.1..0.5 slope=+0.1±")   # 1-step ends
               for x in lines)
    assert any(x.startswith("trend_outcome_s0_kl=") for x in lines)   # 4 steps logged one
    assert curves.trend([1, 2], [0.1, 0.2]) is None
    t = curves.trend(list(range(1, 21)), [float(i % 2) for i in range(1, 21)])
    assert (t["first"], t["last"]) == (0.5, 0.5) and abs(t["slope"]) < t["slope_ci"]
    png = curves.plot(read, tmp_path / "out" / "curves.png")   # a run still going too
    assert png.stat().st_size > 10_000
    # two folders of runs: the same method in two settings is told apart by its folder
    other = tmp_path / "other"
    (other / "outcome-s0").mkdir(parents=True)
    (other / "outcome-s0" / "result.json").write_text(
        (new / "result.json").read_text())
    arms = {r.arm for r in curves.read_runs([runs, other])}
    assert {"runs/outcome", "other/outcome"} <= arms
    with pytest.raises(SystemExit, match="no such folder"):
        curves.read_runs([tmp_path / "nope"])


def test_the_kept_records_are_drawn(tmp_path):
    curves = load("learning_curves")
    partial = curves.read_runs([RECORDS / "dev" / "upd4-outcome-s0-partial"])
    assert [(r.arm, r.seed, r.steps) for r in partial] == \
        [("upd4-outcome", 0, [1, 2, 3, 4, 5])] and partial[0].partial
    assert partial[0].tokens[-1] > partial[0].tokens[0] > 0
    decide = curves.read_runs([RECORDS / "decide"])
    seeds = {}
    for r in decide:
        seeds.setdefault(r.arm, set()).add(r.seed)
        assert r.final is not None and r.start["test"] == pytest.approx(0.355)
    assert seeds == {m: {0, 1, 2} for m in ("outcome", "recall", "evidence", "prm")}
    dev = {r.arm: r for r in curves.read_runs([RECORDS / "dev"])}
    assert [s for s, _, _ in dev["evidence_raw"].dev] == [5, 10, 11]
    assert curves.plot(decide + partial, tmp_path / "c.png").stat().st_size > 10_000


def test_a_run_kept_as_one_archive_reads_as_its_folder_with_its_start(tmp_path):
    curves = load("learning_curves")
    folder = tmp_path / "hops-kl-s2"
    (folder / "eval-final").mkdir(parents=True)
    result = {"method": "hops", "seed": 2, "steps": 5, "rollout_tokens": 500, "em": 0.5,
              "evaluated_on": "dev", "train_reward": [0.0] * 5}
    (folder / "result.json").write_text(json.dumps(result))
    (folder / "metrics.jsonl").write_text(
        "".join(json.dumps(x) + "\n" for x in step_log(5, every=2, health=True)))
    start = {"average": {"em": 0.46, "searches": 2.15}}

    files = {"result.json": json.dumps(result),
             "metrics.jsonl": (folder / "metrics.jsonl").read_text(),
             "start-eval-dev/metrics.json": json.dumps(start)}
    kept = write_archive(tmp_path / "hops-kl-s2.tar.gz", files)
    # named without its seed (one run's archive in a folder of its own): its method's
    plain = write_archive(tmp_path / "records.tar.gz", files)
    from_folder, = curves.read_runs([folder])
    from_archive, other = curves.read_runs([kept, plain])
    assert (from_archive.arm, from_archive.seed, other.arm) == ("hops-kl", 2, "hops")
    for key in ("steps", "reward", "tokens", "dev", "final", "per_step", "dev_searches"):
        assert getattr(from_archive, key) == getattr(from_folder, key), key
    assert from_archive.start == {"dev": 0.46} and from_archive.start_searches == 2.15
    assert curves.plot([from_archive, other], tmp_path / "c.png").stat().st_size > 10_000
    with pytest.raises(SystemExit, match="neither a result.json nor a step log"):
        curves.read_runs([write_archive(tmp_path / "empty.tar.gz", {"config.yaml": "seed: 0"})])
    # the records kept one archive a run: every nine-step arm's seeds, from the start
    nine = sorted((RECORDS / "demo-dev").glob("*9/*.tar.gz"))
    by_arm: dict[str, set] = {}
    for r in curves.read_runs(nine):
        by_arm.setdefault(r.arm, set()).add(r.seed)
        assert r.start["dev"] == pytest.approx(0.46) and r.final is not None
    assert by_arm["hops"] == by_arm["answer"] == by_arm["hops-kl"] == {0, 1, 2}


def test_summary_line_holds_the_gains_their_intervals_and_best_em(tmp_path, capsys):
    bench = load("process_ablation")
    runs = tmp_path / "runs"
    qs = [f"q{i}" for i in range(20)]
    # gigpo is best on the mean, but the named arms are outcome-only and recall
    for method, right in {"outcome": 6, "recall": 9, "gigpo": 12}.items():
        for seed in range(3):
            d = runs / f"{method}-s{seed}"
            d.mkdir(parents=True)
            per = {q: float(i < right + seed) for i, q in enumerate(qs)}
            (d / "result.json").write_text(json.dumps({
                "method": method, "seed": seed, "em": sum(per.values()) / 20, "searches": 2,
                "evidence_recall": 0.7, "steps": 4, "rollout_tokens": 400,
                "em_by_type": {"bridge": 0.1}, "per_question": per, "evaluated_on": "test",
                "train_reward": [0.1, 0.2, 0.3, 0.2]}))
            write_gz(d / "metrics.jsonl.gz", step_log(4, every=2))
    (runs / "eval-sft-test").mkdir()
    (runs / "eval-sft-test" / "metrics.json").write_text(json.dumps({"average": {"em": 0.25}}))
    (runs / "eval-sft-test" / "per_question.json").write_text(
        json.dumps({q: float(i < 5) for i, q in enumerate(qs)}))
    bench._report(runs, time.time(), "recall")
    out = capsys.readouterr().out.strip().splitlines()
    keys = dict(re.findall(r"(\w+)=(\S+)", out[-1]))
    # outcome-only answers 6, 7, 8 of 20 against the start's 5; recall 3 more than outcome
    assert float(keys["rl_gain"]) == pytest.approx(0.1)
    assert float(keys["process_gain"]) == pytest.approx(0.15)
    for name, gain in (("rl_gain", 0.1), ("process_gain", 0.15)):
        lo, hi = (float(x) for x in keys[f"{name}_ci"].split(".."))
        assert lo <= gain <= hi
    assert float(keys["best_em"]) == pytest.approx(0.5) and "best_em=0.5000 (recall)" in out[-1]
    assert "best gigpo (exploratory)" in out[-1]
    assert f"curves={runs / 'learning_curves.png'}" in out
    assert (runs / "learning_curves.png").stat().st_size > 10_000
