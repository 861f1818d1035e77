"""bench/pair_records.py: two arms kept in different folders, paired seed by seed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import load_bench, write_archive


@pytest.fixture(scope="module")
def pair():
    return load_bench("pair_records")


def _archive(path: Path, seed: int, per: dict[str, float] | None, start: dict | None = None,
             method: str = "m") -> Path:
    """A run kept as `bench/records` keeps one: its result and its start's per-question EM."""
    files = {"result.json": {"method": method, "seed": seed, "per_question": per}}
    if start is not None:
        files["start-eval-dev/per_question.json"] = start
    return write_archive(path, files)


def _figures(text: str) -> dict[str, str]:
    return dict(re.findall(r"(\S+?)=(\S+)", text))


def test_arms_pair_by_the_seed_their_results_name_not_by_order(pair, tmp_path, capsys):
    start = {"q1": 0.0, "q2": 1.0, "q3": 0.0, "q4": 0.0}
    arm = [_archive(tmp_path / "a0.tar.gz", 0, {"q1": 1.0, "q2": 1.0, "q3": 1.0, "q4": 0.0},
                    start),
           _archive(tmp_path / "a1.tar.gz", 1, {"q1": 1.0, "q2": 0.0, "q3": 0.0, "q4": 0.0})]
    base = tmp_path / "b1"   # a run folder, given before seed 0's result.json
    base.mkdir()
    (base / "result.json").write_text(json.dumps(
        {"seed": 1, "per_question": {"q1": 0.0, "q2": 0.0, "q3": 0.0, "q4": 0.0}}))
    (tmp_path / "b0.json").write_text(json.dumps(
        {"seed": 0, "per_question": {"q1": 1.0, "q2": 1.0, "q3": 0.0, "q4": 0.0}}))
    pair.main(["--arm", "new", *map(str, arm), "--base", "old", str(base),
               str(tmp_path / "b0.json"), "--resamples", "200"])
    out = capsys.readouterr().out
    got = _figures(out)
    # seed 0: +1 answer of 4; seed 1: +1 of 4
    assert got["paired_new_vs_old"] == "+0.2500"
    assert got["seeds_new_vs_old"] == "s0:+0.250/s1:+0.250"
    assert got["wins_new_vs_old"] == "2" and got["losses_new_vs_old"] == "0"
    # against the start kept in seed 0's archive: seed 0 +0.5 (q1, q3 gained, q2 kept),
    # seed 1 0 (q1 gained, q2 lost)
    assert got["seeds_new_vs_start"] == "s0:+0.500/s1:+0.000"
    assert got["seeds_old_vs_start"] == "s0:+0.250/s1:-0.250"
    assert out.strip().splitlines()[-1].startswith("pair_records: new vs old +0.2500")


def test_a_bad_record_is_named(pair, tmp_path):
    a = _archive(tmp_path / "a.tar.gz", 0, {"q1": 1.0})
    twice = _archive(tmp_path / "again.tar.gz", 0, {"q1": 0.0})
    other = _archive(tmp_path / "other.tar.gz", 0, {"q9": 0.0})
    (tmp_path / "old.json").write_text(json.dumps({"seed": 0, "em": 0.5}))
    with pytest.raises(SystemExit, match="a second run of new seed 0"):
        pair.main(["--arm", "new", str(a), str(twice), "--base", "old", str(other)])
    with pytest.raises(SystemExit, match="old.json: its result has no 'per_question'"):
        pair.main(["--arm", "new", str(a), "--base", "old", str(tmp_path / "old.json")])
    with pytest.raises(SystemExit, match="answered 1 and 1 questions, 0 of them the same"):
        pair.main(["--arm", "new", str(a), "--base", "old", str(other)])
    with pytest.raises(SystemExit, match="different names"):
        pair.main(["--arm", "x", str(a), "--base", "x", str(other)])
    with pytest.raises(SystemExit, match="no such run record"):
        pair.main(["--arm", "new", str(tmp_path / "missing.tar.gz"), "--base", "old", str(a)])
    unevaluated = _archive(tmp_path / "none.tar.gz", 1, None)
    with pytest.raises(SystemExit, match="none.tar.gz: its result has no 'per_question'"):
        pair.main(["--arm", "new", str(a), str(unevaluated), "--base", "old", str(other)])
    plan = _archive(tmp_path / "plan.tar.gz", 1, {"q1": 1.0}, method="plan")
    with pytest.raises(SystemExit, match="new: its runs are of different methods"):
        pair.main(["--arm", "new", str(a), str(plan), "--base", "old", str(other)])
    # arms that began from different policies: no one start to pair with, unless named
    here = _archive(tmp_path / "here.tar.gz", 0, {"q1": 1.0}, start={"q1": 0.0})
    there = _archive(tmp_path / "there.tar.gz", 0, {"q1": 0.0}, start={"q1": 1.0})
    with pytest.raises(SystemExit, match="kept different starts"):
        pair.main(["--arm", "new", str(here), "--base", "old", str(there)])
    (tmp_path / "start.json").write_text(json.dumps({"q1": 0.0}))
    pair.main(["--arm", "new", str(here), "--base", "old", str(there),
               "--start", str(tmp_path / "start.json"), "--resamples", "50"])
