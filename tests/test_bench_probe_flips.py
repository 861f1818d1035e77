"""bench/probe_flips.py: which answers a run's probes change against its start."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import load_bench

RECORDS = Path(__file__).resolve().parent.parent / "bench" / "records"


@pytest.fixture(scope="module")
def flips():
    return load_bench("probe_flips", register=True)


def _eval(folder: Path, per: dict[str, float]) -> Path:
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps({"average": {}}))
    (folder / "per_question.json").write_text(json.dumps(per))
    return folder


def _questions(path: Path, types: dict[str, str], golds: dict[str, list[str]] | None = None
               ) -> Path:
    path.write_text("".join(json.dumps({"id": q, "question": "?",
                                        "golden_answers": (golds or {}).get(q, ["a"]),
                                        "metadata": {"type": t}}) + "\n"
                            for q, t in types.items()))
    return path


def test_gains_and_losses_are_counted_by_type_against_the_start(flips, tmp_path, capsys):
    types = {"b1": "bridge", "b2": "bridge", "s1": "single", "c1": "comparison"}
    run = tmp_path / "run"
    _eval(run / "eval-start", {"b1": 1.0, "b2": 0.0, "s1": 1.0, "c1": 0.0})
    _eval(run / "eval-step-5", {"b1": 0.0, "b2": 1.0, "s1": 1.0, "c1": 0.0})
    _eval(run / "eval-step-10", {"b1": 0.0, "b2": 0.0, "s1": 0.0, "c1": 0.0})
    _eval(run / "eval-final", {"b1": 1.0, "b2": 0.0, "s1": 1.0, "c1": 0.0})
    _eval(run / "eval-test", {"t1": 1.0})   # the test run is not a probe: left out
    qs = _questions(tmp_path / "dev.jsonl", types)
    out = tmp_path / "flips.json"
    flips.main(["--questions", str(qs), str(run), "--out", str(out)])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "reference=run/eval-start em=0.500 questions=4"
    # step order: 5 before 10, the final last
    assert [line.split(":")[0] for line in lines[1:4]] == \
        ["run/eval-step-5", "run/eval-step-10", "run/eval-final"]
    step5 = dict(re.findall(r"(\w+)=(\S+)", lines[1]))
    assert (step5["gained"], step5["lost"]) == ("1", "1")
    assert (step5["gained_bridge"], step5["lost_bridge"]) == ("1", "1")
    step10 = dict(re.findall(r"(\w+)=(\S+)", lines[2]))
    assert (step10["em"], step10["gained"], step10["lost_bridge"], step10["lost_single"]) == \
        ("0.000", "0", "1", "1")
    got = json.loads(out.read_text())
    assert got["by_type"]["bridge"] == {"questions": 2, "gained": 1, "lost": 2,
                                        "right_once": 2, "right_always": 0}
    assert got["by_type"]["single"]["right_always"] == 0 and got["right_once"] == 3
    assert got["by_type"]["comparison"] == {"questions": 1, "gained": 0, "lost": 0,
                                            "right_once": 0, "right_always": 0}
    assert lines[-1].startswith("probe_flips: 3 evaluations of 4 questions")
    assert "1 of 3 lose more than they gain" in lines[-1]


def test_another_reference_and_bad_input(flips, tmp_path, capsys):
    a = _eval(tmp_path / "a", {"q1": 1.0, "q2": 0.0})
    b = _eval(tmp_path / "b", {"q1": 1.0, "q2": 1.0})
    flips.main([str(a), str(b), "--against", str(b)])   # no question file: one type, all
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split()[0].endswith("/b") and "lost_all=1" in lines[1]
    with pytest.raises(SystemExit, match="at least two"):
        flips.main([str(a)])
    other = _eval(tmp_path / "other", {"x": 1.0})
    with pytest.raises(SystemExit, match="in the reference, not in every evaluation"):
        flips.main([str(a), str(other)])
    qs = _questions(tmp_path / "qs.jsonl", {"q1": "bridge"})
    with pytest.raises(SystemExit, match="question q2: not in the --questions"):
        flips.main(["--questions", str(qs), str(a), str(b)])
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "metrics.json").write_text("{}")
    with pytest.raises(SystemExit, match="neither per_question.json nor trajectories"):
        flips.main([str(a), str(tmp_path / "bare")])


def test_two_runs_test_evaluations_named_are_compared(flips, tmp_path, capsys):
    """A test evaluation is left out of a run folder's probes, but kept when named."""
    a = _eval(tmp_path / "a" / "eval-test", {"q1": 1.0, "q2": 0.0, "q3": 0.0})
    b = _eval(tmp_path / "b" / "eval-test", {"q1": 0.0, "q2": 1.0, "q3": 1.0})
    flips.main([str(b), "--against", str(a)])
    lines = capsys.readouterr().out.strip().splitlines()
    assert "a/eval-test em=0.333" in lines[0]
    row = dict(re.findall(r"(\w+)=(\S+)", lines[1]))
    assert (row["em"], row["gained"], row["lost"]) == ("0.667", "2", "1")


def test_the_kept_long_run_reads(flips, capsys):
    """recall_cost seed 0 of long200w: every probe loses more than it gains."""
    run = RECORDS / "long200w" / "recall_cost-s0"
    flips.main([str(run)])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "10 evaluations of 100 questions" in last
    assert "10 of 10 lose more than they gain" in last
    assert "right at least once 73, every time 36" in last


def test_yes_no_questions_set_aside(flips, tmp_path, capsys):
    """A swap of one constant answer for the other flips every yes/no question at once."""
    a = _eval(tmp_path / "run" / "eval-start", {"y1": 0.0, "n1": 1.0, "b1": 0.0})
    _eval(tmp_path / "run" / "eval-step-5", {"y1": 1.0, "n1": 0.0, "b1": 1.0})
    qs = _questions(tmp_path / "qs.jsonl", {"y1": "comparison", "n1": "comparison",
                                            "b1": "bridge"},
                    golds={"y1": ["Yes"], "n1": ["no"]})
    flips.main(["--questions", str(qs), str(a.parent), "--set-aside-yes-no"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "set_aside_yes_no=2"
    assert "questions=1" in lines[1] and "gained=1 lost=0" in lines[2]
    with pytest.raises(SystemExit, match="from --questions"):
        flips.main([str(a.parent), "--set-aside-yes-no"])
