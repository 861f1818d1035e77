"""The evaluation harness: pure scoring on hand-made episodes, then real runs (tiny model or a
scripted policy) in-process and against a running retrieval server, and the CLI."""

from __future__ import annotations

import json
import re
import socket
import threading
import time

import pytest
import torch
import uvicorn
from conftest import build_world_and_index
from typer.testing import CliRunner

from seekrl.agent.backends import Backend
from seekrl.agent.trajectory import Step, Trajectory, read_trajectories
from seekrl.cli import app
from seekrl.data.qa import QAExample, write_qa_jsonl
from seekrl.eval.evaluate import (
    dataset_name,
    eval_rollout_config,
    evaluate,
    load_eval_data,
    pass_at_k,
    score_trajectories,
)
from seekrl.eval.report import metrics_markdown, read_episodes
from seekrl.retrieval.client import RemoteRetriever
from seekrl.retrieval.index import load_index
from seekrl.retrieval.server import create_app

approx = pytest.approx


# --------------------------------------------------------------------- hand-made episodes


def make_traj(dataset: str, qid: str, sample: int, answer: str | None, golds: list[str], *,
              steps: list[tuple[str, list[str], int]] = (), gold_docs: list[str] = (),
              type_: str | None = None, finish: str = "answer") -> Trajectory:
    """A layout-valid trajectory: a 3-token prompt, then per step (action, hit ids, number
    of generated tokens) the turn's tokens and a 2-token information block."""
    ids, mask, out = [0, 0, 0], [0, 0, 0], []
    for action, hits, n in steps:
        start = len(ids)
        ids += [1] * n
        mask += [1] * n
        text = {"search": "<search> q </search>", "answer": f"<answer> {answer} </answer>"}
        step = Step(start=start, end=len(ids), action=action, hits=list(hits),
                    hit_titles=[h.upper() for h in hits], text=text.get(action, "no tags"))
        if action != "answer":
            step.info_start = len(ids)
            ids += [2, 2]
            mask += [0, 0]
            step.info_end = len(ids)
        out.append(step)
    t = Trajectory(example_id=qid, group_id=qid, question=f"question {qid}?",
                   golden_answers=golds, token_ids=ids, loss_mask=mask, prompt_len=3,
                   steps=out, answer=answer, finish_reason=finish, sample_index=sample,
                   dataset=dataset, metadata={"type": type_} if type_ else {},
                   gold_doc_ids=list(gold_docs))
    t.check()
    return t


def hand_made_run() -> list[Trajectory]:
    """Two data sets, two samples per question (numbers worked out in the test)."""
    return [
        # A / q1 (bridge, gold d1 d2, "Paris"): right after 2 searches; "Paris, France"
        make_traj("A", "q1", 0, "Paris", ["Paris"], gold_docs=["d1", "d2"], type_="bridge",
                  steps=[("search", ["d1", "d3"], 3), ("search", ["d2"], 3), ("answer", [], 4)]),
        make_traj("A", "q1", 1, "Paris, France", ["Paris"], gold_docs=["d1", "d2"],
                  type_="bridge", steps=[("search", ["d3", "d1"], 3), ("answer", [], 3)]),
        # A / q2 (comparison, gold d4, "yes"): an invalid turn then out of turns; "yes"
        make_traj("A", "q2", 0, None, ["yes"], gold_docs=["d4"], type_="comparison",
                  finish="max_turns", steps=[("invalid", [], 4), ("search", ["d5"], 4)]),
        make_traj("A", "q2", 1, "yes", ["yes"], gold_docs=["d4"], type_="comparison",
                  steps=[("answer", [], 4)]),
        # B: no gold documents, no types
        make_traj("B", "q3", 0, "42", ["42"], steps=[("answer", [], 5)]),
        make_traj("B", "q3", 1, "41", ["42"], steps=[("answer", [], 5)]),
        make_traj("B", "q4", 0, "red", ["blue"], steps=[("answer", [], 5)]),
        make_traj("B", "q4", 1, "red", ["blue"], steps=[("answer", [], 5)]),
    ]


def test_score_trajectories_matches_hand_computed_values():
    m = score_trajectories(hand_made_run())
    assert m["n_samples"] == 2 and m["pass_ks"] == [2]
    a, b, avg = m["datasets"]["A"], m["datasets"]["B"], m["average"]
    # A: q1 em (1+0)/2, f1 (1 + 2/3)/2 ("paris france" vs "paris": P 1/2, R 1), cover 1,
    #    searches (2+1)/2, tokens (10+6)/2, recall (1 + 1/2)/2, pass@2 1 (one of two right)
    #    q2 em 1/2, f1 1/2, cover 1/2, valid 1/2, searches 1/2, tokens 6, recall 0, pass@2 1
    #    turns: q1 (3+2)/2, q2 (2+1)/2; queries as searches (no sub-queries)
    assert a == approx({"questions": 2, "trajectories": 4, "em": 0.5, "f1": (5 / 6 + 0.5) / 2,
                        "cover_em": 0.75, "valid_format": 0.75, "searches": 1.0,
                        "turns": 2.0, "queries": 1.0,
                        "generated_tokens": 7.0, "evidence_recall": 0.375, "pass@2": 1.0,
                        "one_search": 0.5, "planned_lookups": None,
                        # q2, the one yes/no question: yes in one of its two samples
                        "answered_yes": 0.5, "gold_yes": 1.0, "yes_no_questions": 1,
                        "answered_no": 0.0,           # no sample said no (one said nothing)
                        # only q1's first sample found d1 and d2 (and was right)
                        "evidence_complete": 0.25, "em_evidence_complete": 1.0})
    # B: q3 one of two right, q4 none; no gold documents -> evidence recall None (n/a)
    assert b == approx({"questions": 2, "trajectories": 4, "em": 0.25, "f1": 0.25,
                        "cover_em": 0.25, "valid_format": 1.0, "searches": 0.0,
                        "turns": 1.0, "queries": 0.0, "generated_tokens": 5.0,
                        "evidence_recall": None, "pass@2": 0.5, "one_search": 0.0,
                        "planned_lookups": None, "answered_yes": None, "gold_yes": None,
                        "yes_no_questions": 0, "answered_no": None,
                        "evidence_complete": None, "em_evidence_complete": None})
    # macro average over the two data sets; evidence recall only where known
    assert avg == approx({"questions": 4, "trajectories": 8, "em": 0.375,
                          "f1": (2 / 3 + 0.25) / 2, "cover_em": 0.5, "valid_format": 0.875,
                          "searches": 0.5, "turns": 1.5, "queries": 0.5,
                          "generated_tokens": 6.0, "evidence_recall": 0.375,
                          "pass@2": 0.75, "one_search": 0.25,
                          "planned_lookups": None, "answered_yes": 0.5, "gold_yes": 1.0,
                          "yes_no_questions": 1, "answered_no": 0.0,
                          "evidence_complete": 0.25,
                          "em_evidence_complete": 1.0})
    # per type: only A has types; each type is one question here
    assert list(m["by_type"]) == ["A"]
    bridge, comparison = m["by_type"]["A"]["bridge"], m["by_type"]["A"]["comparison"]
    assert bridge["questions"] == 1 and bridge["em"] == 0.5 and bridge["f1"] == approx(5 / 6)
    assert bridge["evidence_recall"] == 0.75 and bridge["searches"] == 1.5
    assert comparison["valid_format"] == 0.5 and comparison["evidence_recall"] == 0.0
    json.dumps(m)  # metrics.json material


def test_yes_no_questions_show_how_often_the_agent_says_yes():
    """An agent that answers "no" to every yes/no question scores the golds' share of "no";
    `answered_yes` beside `gold_yes` shows it. Other questions are left out of both."""
    from seekrl.eval.evaluate import yes_no
    from seekrl.eval.report import metrics_markdown

    assert yes_no("Yes.", ["yes"]) == (1.0, 1.0, 0.0) and yes_no(" no", "yes") == (0.0, 1.0, 1.0)
    assert yes_no(None, ["No"]) == (0.0, 0.0, 0.0) and yes_no("yes", ["no", "No."]) == (1.0, 0.0, 0.0)
    assert yes_no("Paris", ["no"]) == (0.0, 0.0, 0.0)     # neither yes nor no
    assert yes_no("yes", ["Paris"]) is None and yes_no("yes", ["yes", "Paris"]) is None
    assert yes_no("yes", []) is None
    golds = ["no", "no", "yes", "no"]
    run = [make_traj("A", f"q{i}", 0, "no", [g], type_="comparison", steps=[("answer", [], 3)])
           for i, g in enumerate(golds)]
    run.append(make_traj("A", "q9", 0, "Paris", ["Paris"], type_="bridge",
                         steps=[("answer", [], 3)]))
    m = score_trajectories(run)
    a = m["datasets"]["A"]
    assert a["answered_yes"] == 0.0 and a["gold_yes"] == 0.25 and a["em"] == approx(4 / 5)
    assert a["answered_no"] == 1.0
    assert a["yes_no_questions"] == 4 and m["average"]["yes_no_questions"] == 4
    comparison = m["by_type"]["A"]["comparison"]
    assert comparison["em"] == 0.75 and comparison["gold_yes"] == 0.25
    assert m["by_type"]["A"]["bridge"]["answered_yes"] is None
    text = metrics_markdown(m)
    assert "| says yes | gold yes |" in text
    assert "says yes" not in metrics_markdown(score_trajectories(run[-1:]))


def test_single_sample_has_no_pass_at_k_and_explicit_ks_work():
    run = [t for t in hand_made_run() if t.sample_index == 0]
    m = score_trajectories(run)
    assert m["n_samples"] == 1 and m["pass_ks"] == []
    assert not any(k.startswith("pass@") for k in m["average"])
    assert m["datasets"]["A"]["em"] == 0.5 and m["datasets"]["B"]["em"] == 0.5
    # pass@1 is the mean EM over samples
    m2 = score_trajectories(hand_made_run(), pass_ks=[1, 2])
    for name in ("A", "B"):
        assert m2["datasets"][name]["pass@1"] == approx(m2["datasets"][name]["em"])
    with pytest.raises(ValueError, match="pass@3 needs at least 3 samples"):
        score_trajectories(hand_made_run(), pass_ks=[3])


def test_untyped_questions_are_kept_in_the_type_breakdown():
    run = [make_traj("A", "q1", 0, "x", ["x"], type_="bridge", steps=[("answer", [], 1)]),
           make_traj("A", "q2", 0, "y", ["x"], steps=[("answer", [], 1)])]
    types = score_trajectories(run)["by_type"]["A"]
    assert types["bridge"]["em"] == 1.0 and types["(no type)"]["em"] == 0.0
    # a type spelt "(no type)" shares the row with the untyped, not replaced by them
    run.append(make_traj("A", "q3", 0, "z", ["z"], type_="(no type)", steps=[("answer", [], 1)]))
    types = score_trajectories(run)["by_type"]["A"]
    assert types["(no type)"]["questions"] == 2 and types["(no type)"]["em"] == 0.5


def test_dev_figures_keep_each_data_sets_types():
    """Two dev sets with one type name (hotpotqa's and 2wiki's comparisons): a row each;
    the second had written over the first in the log and the monitor."""
    from seekrl.rl.step_metrics import dev_figures

    run = [make_traj("A", "q1", 0, "x", ["x"], type_="comparison", steps=[("answer", [], 1)]),
           make_traj("A", "q2", 0, "x", ["x"], type_="comparison", steps=[("answer", [], 1)]),
           make_traj("B", "q1", 0, "y", ["x"], type_="comparison", steps=[("answer", [], 1)])]
    rows = dev_figures(score_trajectories(run))["by_type"]
    assert rows["A/comparison"]["em"] == 1.0 and rows["A/comparison"]["questions"] == 2
    assert rows["B/comparison"]["em"] == 0.0 and set(rows) == {"A/comparison", "B/comparison"}
    one = dev_figures(score_trajectories(run[:2]))["by_type"]
    assert set(one) == {"comparison"}   # one data set: the type's own name, as before


def test_repeated_question_ids_are_an_error_not_extra_samples(tiny, tmp_path):
    run = [make_traj("A", "q1", 0, "x", ["x"]), make_traj("A", "q1", 0, "y", ["y"])]
    with pytest.raises(ValueError, match="two trajectories for question 'q1', sample 0"):
        score_trajectories(run)
    model, tokenizer = tiny
    data = {"nq": [QAExample("a", "one?", ["1"]), QAExample("a", "two?", ["2"])]}
    with pytest.raises(ValueError, match=r"nq: field 'id': question id 'a' appears more"):
        evaluate(model, tokenizer, None, data, eval_rollout_config(method="direct"), tmp_path,
                 progress=False)


def test_pass_at_k_unbiased_estimator():
    assert pass_at_k(5, 2, 1) == approx(0.4)
    assert pass_at_k(5, 2, 2) == approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 3, 3) == 1.0                  # fewer than k wrong: always a hit
    assert pass_at_k(1, 1, 1) == 1.0
    for bad in [(2, 3, 1), (2, 1, 3), (2, 1, 0)]:
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def test_evidence_recall_counts_rag_prompt_hits():
    t = make_traj("A", "q", 0, "x", ["x"], gold_docs=["d1", "d2"], steps=[("answer", [], 1)])
    assert t.evidence_recall() == 0.0
    t.prompt_hits = ["d2", "d9"]
    assert t.evidence_recall() == 0.5
    assert make_traj("A", "q", 0, "x", ["x"], steps=[]).evidence_recall() is None


def test_em_when_every_gold_document_was_found_splits_search_from_reading_failures():
    """`em_evidence_complete` is the EM of the episodes that retrieved every gold document,
    pooled over episodes (a question's samples count one by one); `evidence_complete` the
    share of such episodes. An agent that finds the documents and answers wrong shows a low
    first figure; one that never finds them a low second one."""
    found_right = make_traj("A", "q1", 0, "x", ["x"], gold_docs=["d1", "d2"],
                            steps=[("search", ["d1"], 2), ("search", ["d2"], 2),
                                   ("answer", [], 2)], type_="bridge")
    found_wrong = make_traj("A", "q1", 1, "y", ["x"], gold_docs=["d1", "d2"],
                            steps=[("search", ["d1", "d2"], 2), ("answer", [], 2)],
                            type_="bridge")
    missed_right = make_traj("A", "q2", 0, "z", ["z"], gold_docs=["d3"],
                             steps=[("search", ["d9"], 2), ("answer", [], 2)], type_="single")
    missed_wrong = make_traj("A", "q2", 1, "w", ["z"], gold_docs=["d3"],
                             steps=[("answer", [], 2)], type_="single")
    third = make_traj("A", "q3", 0, "v", ["v"], gold_docs=["d4"],
                      steps=[("search", ["d4"], 2), ("answer", [], 2)], type_="single")
    m = score_trajectories([found_right, found_wrong, missed_right, missed_wrong, third],
                           pass_ks=[1])
    row = m["datasets"]["A"]
    # 3 of the 5 episodes found every gold document, 2 of them right: pooled EM 2 / 3, not
    # the mean of the questions' own rates (0.5 and 1.0); per question 1 / 0 / 1 found them
    assert row["em_evidence_complete"] == pytest.approx(2 / 3)
    assert row["evidence_complete"] == pytest.approx(2 / 3)
    types = m["by_type"]["A"]
    assert types["bridge"]["em_evidence_complete"] == pytest.approx(0.5)
    assert types["single"]["em_evidence_complete"] == pytest.approx(1.0)
    assert m["average"]["em_evidence_complete"] == pytest.approx(2 / 3)
    assert not any(k.startswith("_") for k in (*row, *m["average"], *types["single"]))
    # no episode found them all, or no gold documents known: None, shown as n/a
    none = score_trajectories([missed_wrong])["datasets"]["A"]
    assert none["em_evidence_complete"] is None and none["evidence_complete"] == 0.0
    unknown = score_trajectories([make_traj("B", "q", 0, "x", ["x"],
                                            steps=[("answer", [], 1)])])["datasets"]["B"]
    assert unknown["em_evidence_complete"] is None and unknown["evidence_complete"] is None
    assert "EM, all gold found" in metrics_markdown({**m, "config": {"model": "m"}})


def test_metrics_markdown_tables():
    md = metrics_markdown({**score_trajectories(hand_made_run()),
                           "config": {"model": "m", "rollout": {"method": "agent"}}})
    lines = md.splitlines()
    header = next(line for line in lines if line.startswith("| dataset | questions"))
    assert "EM (mean of 2)" in header and "pass@2" in header and "evidence recall" in header
    row_a = next(line for line in lines if line.startswith("| A |"))
    assert "| 0.500 |" in row_a and "| 0.375 |" in row_a
    row_b = next(line for line in lines if line.startswith("| B |"))
    assert "n/a" in row_b
    assert any(line.startswith("| **average** | 4 | 0.375") for line in lines)
    assert "## By question type" in md and "| A | bridge |" in md
    assert "model `m`" in md


def test_a_metrics_file_with_null_sections_renders_as_an_empty_one():
    """`check_metrics` lets `datasets: null` and `pass_ks: null` through (JSON writers
    give null for nothing); the tables had crashed on them with a raw AttributeError."""
    from seekrl.eval.report import metrics_table_html
    from seekrl.eval.training_report import comparison_table

    m = {**score_trajectories(hand_made_run()), "config": {"model": "m"}}
    empty = {**m, "datasets": None, "pass_ks": None}
    assert metrics_markdown(empty).startswith("# Evaluation")
    assert "<table" in metrics_table_html(empty)
    header, rows = comparison_table({"sft": empty, "rl": m})
    assert "pass@2" in header and [r[0].split()[0] for r in rows] == ["sft", "rl"]


def test_dataset_names(tmp_path):
    for rel, expected in [("nq.jsonl", "nq"), ("hotpotqa/questions.jsonl", "hotpotqa"),
                          ("musique/dev.jsonl", "musique"), ("w1/test.jsonl", "world"),
                          ("w2/test.parquet", "w2"),
                          # another split than the papers' is named apart, as
                          # flashrag:hotpotqa:train is; aliases as flashrag: names them
                          ("h/hotpotqa/train.jsonl", "hotpotqa-train"),
                          ("n/nq/dev.jsonl", "nq-dev"), ("2wiki.jsonl", "2wikimultihopqa")]:
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
        if rel.startswith("w1/"):
            (path.parent / "world.json").write_text("{}")
        assert dataset_name(path) == expected, rel
    # a folder is named by the split it is read from (nq holds only train here)
    assert dataset_name(tmp_path / "n" / "nq") == "nq-dev"
    (tmp_path / "t" / "nq").mkdir(parents=True)
    (tmp_path / "t" / "nq" / "train.jsonl").touch()
    assert dataset_name(tmp_path / "t" / "nq") == "nq-train"


def test_load_eval_data_limits_and_keeps_same_named_files_apart(tmp_path):
    exs = [QAExample(f"q{i}", f"question {i}?", [f"a{i}"]) for i in range(5)]
    for folder in ("x", "y"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "world.json").write_text("{}")
        write_qa_jsonl(tmp_path / folder / "test.jsonl", exs)
    data = load_eval_data([tmp_path / "x" / "test.jsonl", tmp_path / "y" / "test.jsonl"],
                          limit=2)
    assert list(data) == ["world", "world-2"]
    assert [ex.id for ex in data["world"]] == ["q0", "q1"]
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_eval_data([tmp_path / "nope.jsonl"])


def test_load_eval_data_skips_bad_lines_only_when_asked_and_says_why(tmp_path):
    from seekrl.errors import DataError

    path = tmp_path / "test.jsonl"
    path.write_text('{"id": "a", "question": "q?", "golden_answers": ["x"]}\n{broken\n'
                    '{"id": "b", "question": "r?"}\n'
                    '{"id": "c", "question": "s?", "golden_answers": ["y"]}\n')
    with pytest.raises(DataError, match="test.jsonl:2"):
        load_eval_data([path])
    skipped: list = []
    data = load_eval_data([path], skipped=skipped)
    assert [ex.id for ex in next(iter(data.values()))] == ["a", "c"]
    (report,) = skipped
    assert report.count == 2 and [line for line, _ in report.skipped] == [2, 3]
    assert "golden_answers" in str(report)


def test_eval_rollout_config_defaults_to_greedy_for_one_sample():
    assert eval_rollout_config().greedy
    cfg = eval_rollout_config(n_samples=4)
    assert not cfg.greedy and cfg.temperature == 1.0
    assert eval_rollout_config(n_samples=4, temperature=0).greedy
    assert eval_rollout_config(temperature=0.7).temperature == 0.7
    with pytest.raises(ValueError, match="temperature"):
        eval_rollout_config(temperature=-1)
    with pytest.raises(ValueError, match="method"):
        eval_rollout_config(method="oracle")


# ------------------------------------------------------------------------- real runs


class ScriptedBackend(Backend):
    """A stand-in policy that follows the protocol, so every run searches: agent: search the
    question, then the top title, then answer with the top title; rag: answer with the first
    title in the prompt; direct: answer "unknown"."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def generate(self, contexts, max_new_tokens, sampling, keys=None):
        outs = []
        for ctx in contexts:
            text = self.tokenizer.decode(ctx)
            prompt, _, episode = text.partition("<|im_start|>assistant")
            question = re.findall(r"Question: (.*?)<\|im_end\|>", prompt)[-1]
            if "Doc 1 (Title:" in prompt:                             # rag
                reply = f"<answer> {re.search(r'Title: ([^)]*)', prompt).group(1)} </answer>"
            elif "<search>" not in prompt:                            # direct
                reply = "<think> no documents </think> <answer> unknown </answer>"
            else:
                titles = re.findall(r"Doc 1 \(Title: ([^)]*)\)", episode)
                turn = episode.count("</information>")
                if turn == 0:
                    reply = f"<think> look it up </think>\n<search> {question} </search>"
                elif turn == 1:
                    reply = f"<think> follow the lead </think>\n<search> {titles[-1]} </search>"
                else:
                    reply = f"<answer> {titles[-1]} </answer>"
            outs.append(self.tokenizer.encode(reply, add_special_tokens=False)[:max_new_tokens])
        return outs


@pytest.fixture(scope="module")
def world_index(tmp_path_factory):
    _, paths, index_dir = build_world_and_index(
        tmp_path_factory.mktemp("evalworld"), seed=3, difficulty="easy", entities=200,
        n_train=10, n_dev=10, n_test=12)
    return paths, index_dir


@pytest.fixture(scope="module")
def tiny():
    from seekrl.models import tiny_policy

    torch.set_num_threads(1)
    return tiny_policy()


class LoopbackServer:
    """`seekrl serve`'s app on a free loopback port, in a background thread."""

    def __init__(self, index):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        app_ = create_app(index, manifest=index.manifest)
        self.server = uvicorn.Server(uvicorn.Config(app_, log_level="warning",
                                                    access_log=False))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start within 20 s"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


def _comparable(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k not in ("config", "seconds")}


@pytest.mark.parametrize("method", ["rag", "agent"])
def test_in_process_and_server_retrieval_give_the_same_run(world_index, tiny, tmp_path,
                                                           method):
    paths, index_dir = world_index
    model, tokenizer = tiny
    index = load_index(index_dir)
    data = load_eval_data([paths["test"]], limit=6)
    cfg = eval_rollout_config(method=method, max_new_tokens=40, max_turns=4, batch_size=4)
    # rag: the tiny random model answers; agent: a scripted policy, so that episodes search
    backend = ScriptedBackend(tokenizer) if method == "agent" else None
    local = evaluate(model, tokenizer, index, data, cfg, tmp_path / "local", backend=backend,
                     progress=False)
    with LoopbackServer(index) as server, RemoteRetriever(server.url, retries=0) as remote:
        served = evaluate(model, tokenizer, remote, data, cfg, tmp_path / "remote",
                          backend=backend, progress=False)
    assert _comparable(local) == _comparable(served)
    t_local = read_trajectories(tmp_path / "local" / "trajectories.jsonl")
    t_remote = read_trajectories(tmp_path / "remote" / "trajectories.jsonl")
    assert [t.to_dict() for t in t_local] == [t.to_dict() for t in t_remote]
    assert local["config"]["retriever"]["type"] == "index"
    from seekrl.retrieval.server import public_manifest
    assert served["config"]["retriever"] == {"type": "remote", "url": server.url,
                                             "manifest": public_manifest(index.manifest)}
    row = local["datasets"]["world"]
    assert row["questions"] == 6 and row["evidence_recall"] > 0  # retrieval really happened
    if method == "agent":
        assert row["searches"] == 2.0 and row["valid_format"] == 1.0
        assert all(len(t.steps) == 3 and t.steps[0].hits for t in t_local)
    else:
        # top 3 in the prompt; one question's third document is cut away by the
        # max_info_tokens budget (its Doc line gone), so it is not recorded as retrieved
        assert [len(t.prompt_hits or []) for t in t_local] == [3, 3, 3, 3, 2, 3]
        assert all(len(t.prompt_hit_titles) == len(t.prompt_hits) for t in t_local)


def test_evaluate_writes_the_run_folder(world_index, tiny, tmp_path):
    paths, index_dir = world_index
    model, tokenizer = tiny
    hotpot = tmp_path / "hotpotqa" / "questions.jsonl"
    hotpot.parent.mkdir()
    exs = load_eval_data([paths["test"]], limit=3)["world"]
    write_qa_jsonl(hotpot, [QAExample(e.id, e.question, e.golden_answers) for e in exs])
    data = load_eval_data([paths["test"], hotpot], limit=3)
    assert list(data) == ["world", "hotpotqa"]
    finished = []
    cfg = eval_rollout_config(method="agent", n_samples=2, max_new_tokens=40, seed=1)
    m = evaluate(model, tokenizer, load_index(index_dir), data, cfg, tmp_path / "run",
                 backend=ScriptedBackend(tokenizer), progress=True,
                 run_info={"model": "scripted", "limit": 3}, on_finish=finished.append)
    run = tmp_path / "run"
    assert {p.name for p in run.iterdir()} == {"trajectories.jsonl", "episodes.jsonl",
                                              "metrics.json", "metrics.md"}
    assert len(finished) == 12  # 2 files x 3 questions x 2 samples
    assert json.loads((run / "metrics.json").read_text()) == m
    assert m["config"]["model"] == "scripted" and m["config"]["rollout"]["n_samples"] == 2
    assert m["config"]["datasets"] == {"world": 3, "hotpotqa": 3}
    assert m["pass_ks"] == [2] and "pass@2" in m["average"]
    assert m["datasets"]["hotpotqa"]["evidence_recall"] is None  # no gold ids in that file
    assert m["datasets"]["world"]["evidence_recall"] is not None
    trajs = read_trajectories(run / "trajectories.jsonl")
    assert len(trajs) == 12
    for t in trajs:
        t.check()
        assert t.outcome_reward == (1.0 if t.answer and t.answer.lower() in
                                    [g.lower() for g in t.golden_answers] else 0.0)
    episodes = read_episodes(run / "episodes.jsonl")
    assert len(episodes) == 12
    t = trajs[0]
    segments = next(iter(episodes.values()))
    assert sum(s["tokens"] for s in segments) == len(t.token_ids)
    assert [s["kind"] for s in segments] == ["prompt", "generated", "information",
                                             "generated", "information", "generated"]
    assert [s["trained"] for s in segments] == [False, True, False, True, False, True]
    assert "Question: " in segments[0]["text"] and "<search>" in segments[1]["text"]
    assert segments[2]["text"].strip().startswith("<information>Doc 1 (Title: ")
    md = (run / "metrics.md").read_text()
    assert "| world |" in md and "| hotpotqa |" in md and "**average**" in md


def test_cli_eval_then_inspect(world_index, tiny, tmp_path):
    paths, index_dir = world_index
    model, tokenizer = tiny
    model_dir = tmp_path / "tiny-model"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    runner = CliRunner()
    run = tmp_path / "run"
    # --data takes several files after it; direct needs no retriever
    r = runner.invoke(app, ["eval", "--model", str(model_dir), "--data", str(paths["test"]),
                            str(paths["dev"]), "--method", "direct", "--out", str(run),
                            "--limit", "2", "--max-new-tokens", "8"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    m = json.loads((run / "metrics.json").read_text())
    assert list(m["datasets"]) == ["world", "world-2"]
    assert m["config"]["rollout"]["method"] == "direct" and m["config"]["retriever"] is None
    assert m["config"]["data"] == {"world": str(paths["test"]), "world-2": str(paths["dev"])}
    assert "| world |" in r.output

    r = runner.invoke(app, ["eval", "--model", str(model_dir), "--data", str(paths["test"]),
                            "--index", str(index_dir), "--method", "rag", "--out",
                            str(tmp_path / "rag"), "--limit", "2", "--max-new-tokens", "8",
                            "--n-samples", "2", "--seed", "3", "--attention", "eager"],
                      catch_exceptions=False)
    assert r.exit_code == 0, r.output
    m = json.loads((tmp_path / "rag" / "metrics.json").read_text())
    assert m["config"]["rollout"]["greedy"] is False and "pass@2" in m["average"]
    assert m["config"]["attention"] == "eager"
    assert m["config"]["retriever"]["manifest"]["retriever"] == "bm25"

    r = runner.invoke(app, ["inspect", str(tmp_path / "rag")], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    page = (tmp_path / "rag" / "viewer.html").read_text()
    first_question = load_eval_data([paths["test"]])["world"][0].question
    assert first_question.replace("'", "&#x27;") in page

    # bad input: exit 2 and a message that names the problem
    r = runner.invoke(app, ["eval", "--model", str(model_dir), "--data", str(paths["test"]),
                            "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "--index" in r.output and "--retriever-url" in r.output
    r = runner.invoke(app, ["eval", "--model", str(model_dir), "--data",
                            str(tmp_path / "missing.jsonl"), "--method", "direct",
                            "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "missing.jsonl" in r.output
    r = runner.invoke(app, ["eval", "--model", str(model_dir), "--data", str(paths["test"]),
                            "--method", "direct", "--attention", "flash2",
                            "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "--attention: Input should be 'default'" in r.output
    # the options are the episode settings' type: its ranges and rules, named by option
    r = runner.invoke(app, ["eval", "--model", str(model_dir), "--data", str(paths["test"]),
                            "--method", "direct", "--max-turns", "0", "--attention", "eager",
                            "--backend", "vllm", "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "--max-turns: Input should be greater than or equal to 1" \
        in r.output, r.output
    r = runner.invoke(app, ["eval", "--model", str(model_dir), "--data", str(paths["test"]),
                            "--method", "direct", "--attention", "eager", "--backend", "vllm",
                            "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "--attention: 'eager' sets seekrl's decoding loop" in r.output
    r = runner.invoke(app, ["eval", "--model", str(model_dir), "--data", str(paths["test"]),
                            "--method", "direct", "--attention", "sdpa_efficient",
                            "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "--attention: sdpa_efficient is a CUDA kernel" in r.output
    r = runner.invoke(app, ["inspect", str(tmp_path / "nothing-here")])
    assert r.exit_code == 2 and "trajectories" in r.output


@pytest.mark.slow
def test_real_model_agent_eval_on_two_questions(world_index, tmp_path):
    """The bundled SmolLM2-135M, greedy, 2 questions, short limits: the run completes and
    every number is in range (an untrained 135M model mostly fails the format)."""
    from seekrl.models import load_policy

    torch.set_num_threads(2)
    paths, index_dir = world_index
    model, tokenizer = load_policy()
    data = load_eval_data([paths["test"]], limit=2)
    cfg = eval_rollout_config(method="agent", max_new_tokens=32, max_turns=2)
    m = evaluate(model, tokenizer, load_index(index_dir), data, cfg, tmp_path, progress=False)
    row = m["datasets"]["world"]
    assert row["questions"] == 2
    for key in ("em", "f1", "cover_em", "valid_format", "evidence_recall"):
        assert 0.0 <= row[key] <= 1.0
    assert 0 < row["generated_tokens"] <= 2 * 32
    trajs = read_trajectories(tmp_path / "trajectories.jsonl")
    assert all(t.steps and t.finish_reason in ("answer", "max_turns", "length") for t in trajs)


def test_table_rows_of_an_sft_and_an_rl_run_are_told_apart():
    """Both models are `.../final`: the row names carry the run folder (they read
    'agent · final' twice), and labels that still repeat get the eval folder's name."""
    from seekrl.eval.report import run_label, unique_labels

    def metrics(model):
        return {"config": {"model": model, "rollout": {"method": "agent"}}}

    sft, rl = metrics("runs/sft/final"), metrics("runs/rl/final/")
    assert run_label(sft, "x") == "agent · sft/final"
    assert run_label(rl, "x") == "agent · rl/final"
    assert run_label(metrics("runs/rl/checkpoints/step-40"), "x") == "agent · checkpoints/step-40"
    assert run_label(metrics("Qwen/Qwen2.5-3B-Instruct"), "x") == "agent · Qwen2.5-3B-Instruct"
    assert run_label({}, "eval-1") == "eval-1"
    assert unique_labels(["a", "b", "a"], ["e1", "e2", "e3"]) == ["a (e1)", "b", "a (e3)"]


def test_the_metrics_table_shows_the_hop_decision_where_the_policy_plans():
    from seekrl.eval.report import metrics_markdown

    run = hand_made_run()
    assert "planned lookups" not in metrics_markdown(score_trajectories(run))
    run[0].steps[0].text = "<think> To answer this I need 2 lookups. </think>"
    m = score_trajectories(run)
    assert m["datasets"]["A"]["planned_lookups"] == 2.0   # over the one episode that plans
    text = metrics_markdown(m)
    assert "| one search | planned lookups |" in text


def test_an_evaluation_written_again_is_not_complete_until_it_is(tmp_path, monkeypatch):
    """An evaluation folder written over in place (a resumed run's eval/step-N) kept the
    old metrics.json, which says the folder is complete, while its trajectories were being
    rewritten: a kill there left the old figures beside half the new episodes."""
    import seekrl.eval.evaluate as evaluate_module
    from seekrl.eval.evaluate import write_run

    out = tmp_path / "eval"
    out.mkdir()
    (out / "metrics.json").write_text('{"average": {"em": 0.9}}')

    def killed(path, trajs):
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluate_module, "write_trajectories", killed)
    with pytest.raises(KeyboardInterrupt):
        write_run(out, [], {"average": {"em": 0.1}})
    assert not (out / "metrics.json").exists()


def test_a_merged_search_r1_parquet_is_scored_a_data_set_a_row(tmp_path):
    """Search-R1's merged test file holds every set, each row its `data_source`: it was one
    dataset (a micro mean over all, no hop averages, a limit from its first set)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    target = {"style": "rule", "ground_truth": {"target": ["a"]}}
    rows = [{"data_source": source, "prompt": [{"role": "user", "content": f"Question: {q}?"}],
             "reward_model": target, "extra_info": {"split": "test", "index": i}}
            for i, (source, q) in enumerate([("nq", "n1"), ("nq", "n2"), ("hotpotqa", "h1"),
                                             ("nq", "n3"), ("hotpotqa", "h2")])]
    path = tmp_path / "test.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    data = load_eval_data([path], limit=2)
    assert list(data) == ["nq", "hotpotqa"]
    assert [[e.question for e in v] for v in data.values()] == [["n1?", "n2?"], ["h1?", "h2?"]]
    # each set's file, as metrics.json records it (a zip of sets and files had given
    # hotpotqa the next file's name and left the next file's set out)
    other = tmp_path / "q.jsonl"
    other.write_text('{"id": "1", "question": "q?", "golden_answers": ["a"]}\n')
    sources: dict[str, str] = {}
    load_eval_data([path, other], sources=sources)
    assert sources == {"nq": str(path), "hotpotqa": str(path), "q": str(other)}
