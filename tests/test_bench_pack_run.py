"""bench/pack_run.py: a run packed as the records keep it, and read back by the benches
that read records (probe_records, pair_records, learning_curves)."""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path

import pytest
from conftest import load_bench

from seekrl.agent.trajectory import Step, Trajectory, write_trajectories

GOLDS = {"q1": "Ann", "q2": "Bo"}


def _episode(qid: str, answer: str, searches: int, sample: int = 0,
             reward: float | None = None, metadata: dict | None = None,
             group: str | None = None) -> Trajectory:
    """A layout-valid episode: `searches` search turns (a 2-token block after each), then
    the answer; its first thought plans two lookups."""
    ids, mask, steps = [0, 0, 0], [0, 0, 0], []
    for i in range(searches + 1):
        start = len(ids)
        ids += [1, 1]
        mask += [1, 1]
        plan = "To answer this I need 2 lookups. " if i == 0 else ""
        if i < searches:
            step = Step(start=start, end=len(ids), action="search",
                        text=plan + "<search> q </search>", process_reward=0.5)
            step.info_start = len(ids)
            ids += [2, 2]
            mask += [0, 0]
            step.info_end = len(ids)
        else:
            step = Step(start=start, end=len(ids), action="answer",
                        text=plan + f"<answer> {answer} </answer>")
        steps.append(step)
    t = Trajectory(example_id=qid, group_id=group or qid, question=f"who is {qid}?",
                   golden_answers=[GOLDS.get(qid, "Ann")], token_ids=ids, loss_mask=mask, prompt_len=3,
                   steps=steps, answer=answer, finish_reason="answer", sample_index=sample,
                   outcome_reward=reward, outcome_part=reward, metadata=metadata or {})
    t.check()
    return t


def _evaluation(folder: Path, episodes: list[Trajectory], per: dict | None = None) -> Path:
    folder.mkdir(parents=True)
    write_trajectories(folder / "trajectories.jsonl", episodes)
    (folder / "metrics.json").write_text(json.dumps({"average": {"em": 0.5, "searches": 1.5}}))
    if per is not None:
        (folder / "per_question.json").write_text(json.dumps(per))
    return folder


def _run(root: Path, seed: int, right_at_end: bool) -> Path:
    run = root / f"hops-s{seed}"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(f"seed: {seed}\n")
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
        {"step": 1, "episodes": 4, "reward": 0.5, "searches": 1.5, "rollout_tokens_total": 40},
        {"step": 2, "episodes": 4, "reward": 0.7, "searches": 1.0, "rollout_tokens_total": 80},
        {"step": 2, "dev_em": 0.5, "dev_searches": 1.5})))
    final = {"q1": 1.0, "q2": float(right_at_end)}
    (run / "result.json").write_text(json.dumps({
        "method": "hops", "seed": seed, "steps": 2, "rollout_tokens": 80, "em": 0.75,
        "evaluated_on": "dev", "taken": "final", "taken_step": 2, "per_question": final}))
    _evaluation(run / "eval" / "step-2",
                [_episode("q1", "Ann", 2), _episode("q2", "Bo" if right_at_end else "X", 1)],
                per=final)
    # a training question (not among the evaluated ones): its kind is packed with it
    kind = {"type": "bridge", "hops": 2}
    # and a refill drew it again: a second group, both right with two searches
    _evaluation(run / "rollouts" / "step-1",
                [_episode("t1", "Ann", 2, 0, 1.0, kind, "t1@1"),
                 _episode("t1", "Cy", 1, 1, 0.0, kind, "t1@1"),
                 _episode("t1", "Ann", 2, 2, 1.0, kind, "t1@2"),
                 _episode("t1", "Ann", 2, 3, 1.0, kind, "t1@2")])
    return run


def test_a_packed_run_reads_back_in_every_bench_that_reads_records(tmp_path, capsys):
    pack = load_bench("pack_run")
    start = _evaluation(tmp_path / "eval-sft-dev", [_episode("q1", "Ann", 2),
                                                    _episode("q2", "X", 2)],
                        per={"q1": 1.0, "q2": 0.0})
    # one seed of two arms: the first answers both questions at the end, the second one
    archives = [tmp_path / "records" / arm / "hops-s0.tar.gz" for arm in ("a", "b")]
    for arm, out in zip("ab", archives):
        pack.main([str(_run(tmp_path / arm, 0, right_at_end=arm == "a")), str(start),
                   str(out)])
    assert "packed=" in capsys.readouterr().out
    with tarfile.open(archives[0]) as tar:
        names = set(tar.getnames())
        answers = json.load(tar.extractfile("eval-step-2/answers.json"))
        rollouts = json.load(tar.extractfile("rollouts-step-1/answers.json"))
    assert {"config.yaml", "metrics.jsonl", "result.json", "eval-step-2/per_question.json",
            "start-eval-dev/per_question.json", "start-eval-dev/answers.json"} <= names
    assert answers[0] == {"id": "q1", "answer": "Ann", "searches": 2, "planned": 2,
                          "finish": "answer"}
    assert rollouts[1] == {"id": "t1", "answer": "Cy", "searches": 1, "planned": 2,
                           "finish": "answer", "sample": 1, "group": "t1@1",
                           "type": "bridge", "hops": 2,
                           "reward": 0.0, "outcome": 0.0,
                           "steps": [["search", 0.5], ["answer", None]]}
    # the run ended on its step-2 probe: that is its final evaluation
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps({"id": q, "question": f"who is {q}?",
                                             "golden_answers": [g],
                                             "metadata": {"type": "bridge", "hops": 2}}) + "\n"
                                 for q, g in GOLDS.items()))
    load_bench("probe_records").main(["--questions", str(questions), "--arm", "a",
                                      str(archives[0]), "--base", "b", str(archives[1]),
                                      "--resamples", "50"])
    out = capsys.readouterr().out
    assert "paired_a_vs_b=+0.5000" in out and "paired_a_vs_start=+0.5000" in out
    assert re.search(r"probe_records: a vs b at final \+0\.5000", out)
    # the training step's first group of t1 (a 2-hop bridge): two searches right (reward
    # 1), one wrong (0): the reward told two searches +0.5 and one -0.5; its second group
    # (a refill's, both right) told nothing. Pooled as one group, they had read +0.25 and
    # -0.75
    push = dict(re.findall(r"(\S+?)=(\S+)", next(
        ln for ln in out.splitlines() if ln.startswith("push arm=a"))))
    assert push["h2_as_many_adv"] == "+0.167" and push["h2_fewer_adv"] == "-0.500"
    assert push["h2_as_many_share"] == "0.75" and push["steps"] == "1-1"
    assert not any(k.startswith("c") for k in push)   # no comparison was drawn
    load_bench("pair_records").main(["--arm", "a", str(archives[0]), "--base", "b",
                                     str(archives[1]), "--resamples", "50"])
    assert "paired_a_vs_b=+0.5000" in capsys.readouterr().out
    runs = load_bench("learning_curves", register=True).read_runs(archives)
    assert [(r.arm, r.seed, r.steps, r.start) for r in runs] == \
        [("hops", 0, [1, 2], {"dev": 0.5})] * 2


def test_what_cannot_be_packed_is_named(tmp_path):
    pack = load_bench("pack_run")
    start = _evaluation(tmp_path / "start", [_episode("q1", "Ann", 1)])
    run = _run(tmp_path / "runs", 0, right_at_end=True)
    with pytest.raises(SystemExit, match="name the archive"):
        pack.main([str(run), str(start), str(tmp_path / "x.zip")])
    (run / "result.json").unlink()
    with pytest.raises(SystemExit, match="no result.json"):
        pack.main([str(run), str(start), str(tmp_path / "x.tar.gz")])
    with pytest.raises(SystemExit, match="not an evaluation"):
        pack.main([str(_run(tmp_path / "more", 1, True)), str(tmp_path),
                   str(tmp_path / "x.tar.gz")])


def test_a_kept_run_reads_alike_packed_and_unpacked(tmp_path):
    """KeptRun, the one reader of kept runs: an archive and the folder it unpacks to hold
    the same files, and a gzipped step log reads as its text."""
    import gzip

    pack = load_bench("pack_run")
    start = _evaluation(tmp_path / "start", [_episode("q1", "Ann", 1)])
    run = _run(tmp_path / "runs", 3, right_at_end=True)
    (run / "metrics.jsonl.gz").write_bytes(gzip.compress((run / "metrics.jsonl").read_bytes()))
    archive = pack.pack(run, start, tmp_path / "hops-s3.tar.gz")
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    packed, folder = pack.KeptRun(archive), pack.KeptRun(tmp_path / "unpacked")
    assert packed.packed and not folder.packed and packed.name == "hops-s3"
    assert sorted(packed.names(".json")) == sorted(folder.names(".json"))
    assert "rollouts-step-1/answers.json" in packed.names(".json")
    for name in packed.names():
        assert packed.read(name) == folder.read(name)
    assert packed.json("result.json")["seed"] == 3 and packed.json("absent.json") is None
    assert packed.text("nothing.gz") is None
    # a run folder itself: its gzipped log read decompressed, files below it by their path
    as_run = pack.KeptRun(run)
    assert as_run.text("metrics.jsonl.gz") == (run / "metrics.jsonl").read_text()
    assert "eval/step-2/metrics.json" in as_run.names(".json")
    with pytest.raises(SystemExit, match="no such archive"):
        pack.KeptRun(tmp_path / "missing.tar.gz")


def test_the_push_puts_comparisons_in_cells_of_their_own():
    """A comparison's searches stand against its hops in `c` cells, beside the bridges' and
    single-hop questions' `h` cells; a question without hops is in none."""
    probe = load_bench("probe_records")

    class Kept:
        rollouts = {1: [
            {"id": "c", "searches": 3, "reward": 0.0, "type": "comparison", "hops": 2},
            {"id": "c", "searches": 2, "reward": 1.0, "type": "comparison", "hops": 2},
            {"id": "b", "searches": 1, "reward": 0.0, "type": "bridge", "hops": 2},
            {"id": "b", "searches": 2, "reward": 0.0, "type": "bridge", "hops": 2},
            {"id": "x", "searches": 1, "reward": 1.0, "type": "single", "hops": None},
            {"id": "x", "searches": 2, "reward": 0.0, "type": "single", "hops": None}]}

    line = probe.push_line("a", [Kept()], {})
    push = dict(re.findall(r"(\S+?)=(\S+)", line))
    assert push["c2_more_adv"] == "-0.500" and push["c2_as_many_adv"] == "+0.500"
    assert push["h2_fewer_adv"] == "+0.000" and push["episodes"] == "4"
    assert push["c2_more_share"] == "0.25" and not any(k.startswith("h1") for k in push)


def test_a_run_tested_once_keeps_its_test_answers_and_they_are_read_with_their_questions(
        tmp_path, capsys):
    """A long run's final policy is evaluated on the test questions (`eval-test` beside the
    run): packed as it is, left out by probe_records (and said) without the test
    questions, paired on them with."""
    pack = load_bench("pack_run")
    probe = load_bench("probe_records")
    start = _evaluation(tmp_path / "start", [_episode("q1", "Ann", 2), _episode("q2", "X", 2)],
                        per={"q1": 1.0, "q2": 0.0})
    archives = []
    for arm, right in (("a", True), ("b", False)):
        run = _run(tmp_path / arm, 0, right_at_end=True)
        _evaluation(run / "eval-test", [_episode("t1", "Ann" if right else "No", 1)],
                    per={"t1": float(right)})
        archives.append(pack.pack(run, start, tmp_path / "records" / arm / "hops-s0.tar.gz"))
    with tarfile.open(archives[0]) as tar:
        assert {"eval-test/answers.json", "eval-test/per_question.json",
                "eval-step-2/answers.json"} <= set(tar.getnames())
    qa = {"q1": "Ann", "q2": "Bo"}
    dev, test = tmp_path / "dev.jsonl", tmp_path / "test.jsonl"
    for path, golds in ((dev, qa), (test, {"t1": "Ann"})):
        path.write_text("".join(json.dumps({"id": q, "question": q, "golden_answers": [g],
                                            "metadata": {"type": "bridge", "hops": 2}}) + "\n"
                                for q, g in golds.items()))
    argv = ["--questions", str(dev), "--arm", "a", str(archives[0]), "--base", "b",
            str(archives[1]), "--resamples", "20"]
    probe.main(argv)
    out = capsys.readouterr().out
    assert "probe=test left out" in out and "at final +0.0000" in out
    probe.main(argv + ["--test-questions", str(test)])
    out = capsys.readouterr().out
    assert "probe=test paired_a_vs_b=+1.0000" in out and "probe=test paired_a_vs_start" not in out
    assert re.search(r"probe_records: a vs b at test \+1\.0000", out)
