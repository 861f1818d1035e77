"""bench/group_signal.py: the share of groups whose rewards vary, from each question's
sampled rewards, and the whole bench at toy size with the tiny random model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import build_world_and_index
from conftest import load_bench as load_bench_module

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench" / "group_signal.py"


def load_bench():
    return load_bench_module("group_signal")


def test_group_figures_count_the_groups_whose_rewards_differ():
    bench = load_bench()
    rewards = {"a": [1, 1, 1, 0], "b": [0, 1, 0, 0], "c": [0, 0, 0, 0], "d": [1, 1, 1, 1],
               "e": [0.5, 0.5, 0.5, 0.5]}   # tied at a partial reward (F1): below a right one
    types = {"a": "single", "b": "bridge", "c": "bridge", "d": "single"}
    four = bench.group_figures(rewards, types, 4)
    assert four["signal"] == pytest.approx(2 / 5)
    assert (four["tied_right"], four["tied_below"]) == (pytest.approx(1 / 5), pytest.approx(2 / 5))
    assert four["signal_single"] == 0.5 and four["signal_bridge"] == 0.5
    assert four["signal_unknown"] == 0.0
    assert four["pass@1"] == pytest.approx((0.75 + 0.25 + 0 + 1 + 0.5) / 5)
    assert four["pass@4"] == pytest.approx(4 / 5)
    two = bench.group_figures(rewards, types, 2)   # the first two samples: only b differs
    assert two["signal"] == pytest.approx(1 / 5) and two["pass@2"] == pytest.approx(4 / 5)
    with pytest.raises(ValueError, match="question 'a' has 4 samples"):
        bench.group_figures(rewards, types, 5)


def test_the_bench_runs_at_toy_size_and_keeps_each_questions_rewards(tmp_path):
    from seekrl.models import tiny_policy

    _, paths, index = build_world_and_index(tmp_path / "w", seed=4, entities=200, n_train=4,
                                            n_dev=3, n_test=3)
    model, tok = tiny_policy(seed=0)
    model.save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    r = subprocess.run([sys.executable, str(BENCH), "--model", str(tmp_path / "tiny"),
                        "--data", str(paths["dev"]), "--index", str(index), "--limit", "3",
                        "--temperatures", "1.0", "--samples", "2", "--groups", "2",
                        "--max-new-tokens", "4", "--max-turns", "1", "--out", str(out)],
                       capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    figures = dict(x.split("=", 1) for x in lines[:-1] if "=" in x)
    assert 0.0 <= float(figures["t1_g2_signal"]) <= 1.0 and "t1_g2_pass@2" in figures
    assert lines[-1].startswith("group_signal (3 questions") and "T1 g2" in lines[-1]
    record = json.loads((out / "signal.json").read_text())
    run = record["runs"]["1"]
    assert sorted(run["per_question"]) == ["dev-0", "dev-1", "dev-2"]
    assert all(len(q["outcome_rewards"]) == 2 for q in run["per_question"].values())
    assert run["groups"]["2"]["signal"] == pytest.approx(float(figures["t1_g2_signal"]),
                                                         abs=1e-3)
    bad = subprocess.run([sys.executable, str(BENCH), "--model", "m", "--data", "d",
                          "--index", "i", "--groups", "9"], capture_output=True, text=True,
                         cwd=ROOT)
    assert bad.returncode != 0 and "--groups: expected sizes from 2 to --samples 8" in bad.stderr
