"""bench/answer_reading.py: how an evaluation's comparison answers follow the values the
agent listed, on a small synthetic world's questions with episodes written in the oracle's
last-turn layout."""

from __future__ import annotations

import gzip
import json

import pytest
from conftest import load_bench as load_bench_module


def load_bench():
    return load_bench_module("answer_reading")


@pytest.fixture(scope="module")
def questions(tmp_path_factory):
    from seekrl.agent.oracle import _answer_turn
    from seekrl.data.world import generate_world, write_world

    world = generate_world(seed=3, entities=300, n_train=4, n_dev=200, n_test=4)
    paths = write_world(world, tmp_path_factory.mktemp("world"))
    rows = [json.loads(line) for line in paths["dev"].read_text().splitlines()]
    comparisons = [q for q in world.splits["dev"] if q.metadata["type"] == "comparison"]
    # the oracle's own last turn, so the bench reads the layout SFT teaches
    last = {q.id: _answer_turn(q, "The document says: x.")["content"]
            for q in comparisons}
    return paths["dev"], {r["id"]: r for r in rows}, last


def episode(qid: str, text: str, sample: int = 0) -> dict:
    return {"dataset": "world", "example_id": qid, "sample_index": sample, "segments": [
        {"kind": "prompt", "text": "..."}, {"kind": "generated", "text": "<think> a </think>"},
        {"kind": "information", "text": "<information>...</information>"},
        {"kind": "generated", "text": text}]}


def test_the_oracle_reads_as_listing_right_and_answering_right(questions):
    bench = load_bench()
    _, qs, last = questions
    ordering = [q for q in last if qs[q]["metadata"]["chain"][0]["relation"] in bench.ORDERING]
    same = [q for q in last if q not in ordering]
    assert ordering and same, "the world should hold both kinds of comparison"
    eps = [episode(q, text) for q, text in last.items()]
    other = next(q for q in qs if qs[q]["metadata"]["type"] != "comparison")
    eps.append(episode(other, "<think> bridge </think> <answer> x </answer>"))
    eps.append(episode(ordering[0], "<answer> wrong </answer>", sample=1))   # not greedy
    r = bench.reading(eps, qs)
    assert (r["ordering"], r["same"]) == (len(ordering), len(same))
    assert r["ordering_em"] == r["ordering_listed_right"] == r["ordering_em_listed_right"] == 1.0
    assert r["same_em"] == r["same_listed_right"] == 1.0
    gold_yes = sum(qs[q]["golden_answers"][0] == "yes" for q in same) / len(same)
    assert r["same_says_yes"] == r["same_gold_yes"] == pytest.approx(gold_yes, abs=1e-3)
    chance = sum(1 / qs[q]["metadata"]["options"] for q in ordering) / len(ordering)
    assert r["ordering_chance"] == pytest.approx(chance, abs=1e-3)


def test_a_constant_answer_and_a_wrong_pick_show(questions):
    """Values listed right and the other name answered; "yes" to every same question."""
    bench = load_bench()
    _, qs, last = questions
    eps = []
    for q, text in last.items():
        meta, gold = qs[q]["metadata"], qs[q]["golden_answers"][0]
        if meta["chain"][0]["relation"] in bench.ORDERING:
            names = [p.rpartition(": ")[0] for p in meta["judgement"].split("; ")]
            wrong = next(n for n in names if n != gold)
            eps.append(episode(q, text.replace(f"is {gold}.", f"is {wrong}.")
                               .replace(f"<answer> {gold} </answer>", f"<answer> {wrong} </answer>")))
        else:
            eps.append(episode(q, f"<think> Comparing: {meta['judgement']}. So the answer is yes."
                                  " </think>\n<answer> yes </answer>"))
    r = bench.reading(eps, qs)
    assert r["ordering_listed_right"] == 1.0 and r["ordering_em"] == 0.0
    assert r["ordering_em_listed_right"] == 0.0
    assert r["same_says_yes"] == 1.0 and r["same_em"] == pytest.approx(r["same_gold_yes"], abs=1e-3)
    # scored as the evaluation scores: "Yes!" is yes, a gold given as one string is one
    same = next(q for q in last if qs[q]["metadata"]["chain"][0]["relation"] not in bench.ORDERING)
    one = {same: {**qs[same], "golden_answers": "yes"}}
    r = bench.reading([episode(same, "<answer> Yes! </answer>")], one)
    assert (r["same_says_yes"], r["same_gold_yes"], r["same_em"]) == (1.0, 1.0, 1.0)
    assert r["ordering"] == 0 and r["ordering_em"] is None


def test_the_command_reads_kept_records_in_step_order(questions, tmp_path, capsys):
    bench = load_bench()
    path, qs, last = questions
    run = tmp_path / "run"
    for name, answer in (("eval-step-10", True), ("eval-start", False), ("eval-step-5", True)):
        d = run / name
        d.mkdir(parents=True)
        (d / "metrics.json").write_text("{}")
        lines = [json.dumps(episode(q, t if answer else "<answer> no </answer>")) + "\n"
                 for q, t in last.items()]
        (d / "episodes.jsonl.gz").write_bytes(gzip.compress("".join(lines).encode()))
    bench.main([str(run), "--questions", str(path), "--out", str(tmp_path / "f.json")])
    out = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[0] for line in out[:-1]] == [
        "eval=run/eval-start", "eval=run/eval-step-5", "eval=run/eval-step-10"]
    assert out[-1].startswith("answer_reading (3 evaluations): run/eval-start ordering 0.0")
    assert json.loads((tmp_path / "f.json").read_text())["run/eval-step-5"]["same_em"] == 1.0
    # two runs' probes of the same names stay apart; one folder twice is refused
    import shutil
    shutil.copytree(run, tmp_path / "run2")
    bench.main([str(run), str(tmp_path / "run2"), "--questions", str(path),
                "--out", str(tmp_path / "g.json")])
    both = json.loads((tmp_path / "g.json").read_text())
    assert len(both) == 6 and f"{tmp_path.name}/run2/eval-step-5" in both
    with pytest.raises(SystemExit, match="given twice"):
        bench.main([str(run), str(run / "eval-start"), "--questions", str(path)])
    capsys.readouterr()
    other = next(q for q in qs if qs[q]["metadata"]["type"] != "comparison")
    (run / "eval-start" / "episodes.jsonl.gz").write_bytes(gzip.compress(
        (json.dumps(episode(other, "<answer> x </answer>")) + "\n").encode()))
    bench.main([str(run / "eval-start"), "--questions", str(path)])
    out = capsys.readouterr().out.strip().splitlines()
    assert "ordering_em=n/a" in out[0] and out[-1].endswith("no comparison questions")
    with pytest.raises(SystemExit, match="no evaluation here"):
        bench.main([str(tmp_path / "f.json"), "--questions", str(path)])
    (run / "eval-step-5" / "episodes.jsonl.gz").unlink()
    with pytest.raises(SystemExit, match="kept no episodes"):
        bench.main([str(run / "eval-step-5"), "--questions", str(path)])
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"id": "elsewhere", "golden_answers": ["a"]}) + "\n")
    with pytest.raises(SystemExit, match="in no --questions file"):
        bench.main([str(run / "eval-start"), "--questions", str(other)])
