"""bench/probe_records.py: kept runs read probe by probe, every EM scored from the answers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import load_bench, write_archive

# q1, q2: 2-hop bridges; q3: a 3-hop bridge; q4: single-hop
QUESTIONS = [("q1", "Ann", "bridge", 2), ("q2", "Bo", "bridge", 2), ("q3", "Cy", "bridge", 3),
             ("q4", "Di", "single", 1)]


@pytest.fixture(scope="module")
def probe():
    return load_bench("probe_records")


@pytest.fixture()
def questions(tmp_path) -> Path:
    path = tmp_path / "questions.jsonl"
    path.write_text("".join(json.dumps({"id": i, "question": f"who is {i}?",
                                        "golden_answers": [gold],
                                        "metadata": {"type": kind, "hops": hops}}) + "\n"
                            for i, gold, kind, hops in QUESTIONS))
    return path


def _answers(right: set[str], searches: dict[str, int] | None = None) -> list[dict]:
    """Each question answered right (its gold) or wrong, with its searches (default 2)."""
    searches = searches or {}
    return [{"id": i, "answer": gold if i in right else "nobody",
             "searches": searches.get(i, 2), "planned": 2, "finish": "answer"}
            for i, gold, _, _ in QUESTIONS]


def _archive(path: Path, seed: int, evals: dict[str, list[dict]], *, method: str = "m",
             taken: int | None = None, per_question: dict | None = None) -> Path:
    """A run kept as `bench/records` keeps one: its result, and per evaluation its answers
    (the final one's per-question EM in the result, as the bench writes it)."""
    files: dict[str, object] = {"result.json": {"method": method, "seed": seed,
                                                "taken_step": taken,
                                                "per_question": per_question}}
    for label, answers in evals.items():
        folder = "start-eval-dev" if label == "start" else f"eval-{label}"
        files[f"{folder}/answers.json"] = answers
    return write_archive(path, files)


def _figures(line: str) -> dict[str, str]:
    return dict(re.findall(r"(\S+?)=(\S+)", line))


def _line(out: str, prefix: str) -> dict[str, str]:
    found = [ln for ln in out.splitlines() if ln.startswith(prefix)]
    assert len(found) == 1, (prefix, out)
    return _figures(found[0])


def test_probes_are_scored_from_the_answers_and_paired_by_seed(probe, questions, tmp_path,
                                                               capsys):
    start = _answers({"q1", "q4"})
    arm = [_archive(tmp_path / "a0.tar.gz", 0,
                    {"start": start, "step-3": _answers({"q1", "q2", "q4"}),
                     "final": _answers({"q1", "q2", "q3", "q4"})},
                    per_question={"q1": 1.0, "q2": 1.0, "q3": 1.0, "q4": 1.0}),
           # ended on its step-3 probe: that probe is its final evaluation
           _archive(tmp_path / "a1.tar.gz", 1,
                    {"start": start, "step-3": _answers({"q4"}, {"q1": 1, "q2": 1})},
                    taken=3, per_question={"q1": 0.0, "q2": 0.0, "q3": 0.0, "q4": 1.0})]
    base = [_archive(tmp_path / "b1.tar.gz", 1,   # given first: paired by seed, not order
                     {"start": start, "step-3": _answers({"q1"}), "final": _answers({"q1"})},
                     method="outcome"),
            _archive(tmp_path / "b0.tar.gz", 0,
                     {"start": start, "step-3": _answers({"q4"}), "final": _answers({"q4"})},
                     method="outcome")]
    probe.main(["--questions", str(questions), "--arm", "new", *map(str, arm),
                "--base", "old", *map(str, base), "--resamples", "200"])
    out = capsys.readouterr().out
    step3 = _line(out, "probe=step-3 paired_new_vs_old")
    # seed 0: q1, q2, q4 against q4 (+2 of 4); seed 1: q4 against q1 (0)
    assert step3["seeds_new_vs_old"] == "s0:+0.500/s1:+0.000"
    assert step3["wins_new_vs_old"] == "3" and step3["losses_new_vs_old"] == "1"
    final = _line(out, "probe=final paired_new_vs_old")
    # seed 1's final is its step-3 probe: q4 against q1
    assert final["seeds_new_vs_old"] == "s0:+0.750/s1:+0.000"
    assert _line(out, "probe=final paired_new_vs_start")["seeds_new_vs_start"] == \
        "s0:+0.500/s1:-0.250"
    assert _line(out, "probe=final seed=1")["em_new"] == "0.250"
    # the bridges at step 3, both seeds pooled: of six bridge answers, the 2-hop ones of
    # seed 1 made one search (fewer: 2 of 6, none right), seed 0's two searches (as many:
    # 2, both right), and the 3-hop ones two searches (fewer: 2, none right)
    bridges = _line(out, "bridges arm=new probe=step-3")
    assert bridges["h2_fewer_share"] == "0.33" and bridges["h2_fewer_em"] == "0.00"
    assert bridges["h2_as_many_share"] == "0.33" and bridges["h2_as_many_em"] == "1.00"
    assert bridges["h3_fewer_share"] == "0.33"
    kinds = _line(out, "kinds arm=new probe=step-3")
    assert kinds["bridge_em"] == "0.333" and kinds["single_em"] == "1.000"
    assert kinds["bridge_one_search"] == "0.33" and kinds["bridge_searches"] == "1.67"
    assert _line(out, "kinds arm=start")["bridge_em"] == "0.333"
    assert out.strip().splitlines()[-1].startswith("probe_records: new vs old at final +0.3750")


def test_a_record_that_does_not_fit_is_named(probe, questions, tmp_path):
    good = _archive(tmp_path / "good.tar.gz", 0, {"final": _answers({"q1"})})
    # the result's per-question EM is not what its answers score: other questions, or golds
    liar = _archive(tmp_path / "liar.tar.gz", 0, {"final": _answers({"q1"})},
                    per_question={"q1": 0.0, "q2": 0.0, "q3": 0.0, "q4": 0.0})
    with pytest.raises(SystemExit, match=r"liar.tar.gz: eval final kept an EM .* 'q1'"):
        probe.main(["--questions", str(questions), "--arm", "a", str(liar),
                    "--base", "b", str(good)])
    stranger = _archive(tmp_path / "stranger.tar.gz", 0,
                        {"final": [{"id": "q9", "answer": "x", "searches": 1}]})
    with pytest.raises(SystemExit, match="stranger.tar.gz: eval final answer 0 is question "
                                         "'q9', which --questions does not hold"):
        probe.main(["--questions", str(questions), "--arm", "a", str(stranger),
                    "--base", "b", str(good)])
    other = _archive(tmp_path / "other.tar.gz", 1, {"final": _answers(set())}, method="plan")
    with pytest.raises(SystemExit, match="a: its runs are of different methods"):
        probe.main(["--questions", str(questions), "--arm", "a", str(good), str(other),
                    "--base", "b", str(good)])
    with pytest.raises(SystemExit, match="share no evaluation of a common seed"):
        probe.main(["--questions", str(questions), "--arm", "a", str(good),
                    "--base", "b", str(other)])
    with pytest.raises(SystemExit, match="expected a kept run"):
        probe.main(["--questions", str(questions), "--arm", "a", str(tmp_path / "x.json"),
                    "--base", "b", str(good)])
