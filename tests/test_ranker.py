"""Rankers over first-stage candidates (retrieval/ranker.py) and their training from the
agent's searches (recipes/ranker.py): labels from crafted rollouts, the listwise loss,
reranking, save / load, the CLI, and the ranker trained with the agent during RL."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from seekrl.agent.backends import Backend, Generated
from seekrl.agent.trajectory import Step, Trajectory
from seekrl.recipes.ranker import (
    label_candidates,
    qa_records,
    training_examples,
    trajectory_records,
)
from seekrl.retrieval.base import Hit
from seekrl.retrieval.ranker import (
    RankerUpdater,
    RerankingRetriever,
    listwise_loss,
    load_ranker,
    recall_at,
)


def hit(i: int, text: str = "", title: str | None = None) -> Hit:
    return Hit(f"d{i}", title if title is not None else f"T{i}", text or f"text {i}", 1.0 / (i + 1))


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory):
    """A 2-layer random BERT with the bundled MiniLM's tokenizer, saved as an encoder."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    from seekrl.retrieval.dense import bundled_encoder_path

    path = tmp_path_factory.mktemp("enc")
    tok = AutoTokenizer.from_pretrained(bundled_encoder_path())
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=2, intermediate_size=64,
                                 max_position_embeddings=128))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def traj(answer, gold_ids, steps, golden=("Paris",)) -> Trajectory:
    return Trajectory(example_id="q", group_id="g", question="Where?",
                      golden_answers=list(golden), token_ids=[], loss_mask=[], prompt_len=0,
                      steps=steps, answer=answer, gold_doc_ids=list(gold_ids))


# ---- labels from crafted rollouts
def test_known_gold_documents_label_every_candidate():
    rec = {"query": "q", "gold_ids": ["d1", "d3"], "answers": ["x"], "shown": ["d0"],
           "right": False}
    assert label_candidates(rec, [hit(0), hit(1), hit(2), hit(3)]) == [0, 1, 0, 1]


def test_without_gold_ids_shown_documents_of_right_episodes_holding_the_answer_are_positive():
    cands = [hit(0, "Paris is the capital"), hit(1, "nothing here"), hit(2, "Paris again")]
    right = {"query": "q", "gold_ids": [], "answers": ["Paris"], "shown": ["d0", "d1"],
             "right": True}
    # d2 holds the answer but was not shown: unknown, not a negative
    assert label_candidates(right, cands) == [1, 0, None]
    wrong = dict(right, right=False)    # a wrong episode's documents did not lead anywhere
    assert label_candidates(wrong, cands) == [0, 0, None]
    # the answer as whole words: "no" is not in "not", nor "1" in "1990"
    shown = [hit(0, "It was not finished until 1990."), hit(1, "The answer is no.")]
    for answer, labels in (("no", [0, 1]), ("1", [0, 0]), ("1990", [1, 0])):
        rec = dict(right, answers=[answer], shown=["d0", "d1"])
        assert label_candidates(rec, shown) == labels, answer


def test_trajectory_records_take_every_search_and_sub_query_with_the_episode_facts():
    steps = [Step(start=0, end=1, action="search", query="a ## b", hits=["d0", "d1", "d2"],
                  sub_queries=["a", "b"], sub_hits=[["d0"], ["d1", "d2"]]),
             Step(start=1, end=2, action="search", query="c", hits=["d3"]),
             Step(start=2, end=3, action="answer")]
    recs = trajectory_records([traj("Paris", ["d1"], steps)])
    assert [(r["query"], r["shown"], r["right"]) for r in recs] == [
        ("a", ["d0"], True), ("b", ["d1", "d2"], True), ("c", ["d3"], True)]
    assert all(r["gold_ids"] == ["d1"] for r in recs)
    assert trajectory_records([traj("Rome", [], steps[1:])])[0]["right"] is False


def test_qa_records_carry_each_hops_own_gold_document():
    from seekrl.data.qa import QAExample

    ex = QAExample(id="x", question="Who?", golden_answers=["Z"],
                   metadata={"gold_doc_ids": ["d1", "d2"], "chain": [
                       {"query": "A worked for", "doc_id": "d1"},
                       {"query": "B founded by", "doc_id": "d2"}]})
    recs = qa_records([ex], question_queries=True)
    assert [(r["query"], r.get("hop_gold")) for r in recs] == [
        ("A worked for", "d1"), ("B founded by", "d2"), ("Who?", None)]


def test_qa_records_check_the_chain_and_read_its_ids_as_text():
    from seekrl.data.qa import QAExample

    ex = QAExample(id="x", question="Who?", golden_answers=["Z"],
                   metadata={"gold_doc_ids": [7], "chain": [{"query": "A", "doc_id": 7}]})
    assert [(r["gold_ids"], r["hop_gold"]) for r in qa_records([ex])] == [(["7"], "7")]
    for chain, where in (("abc", "metadata.chain: expected a list"),
                         (["A"], r"metadata.chain\[0\]: expected an object"),
                         ([{"query": 5, "doc_id": "d"}], r"metadata.chain\[0\]\.query: expected"
                          " text, got int 5"),
                         ([{"query": "A", "doc_id": ["d"]}], r"metadata.chain\[0\]\.doc_id: "
                          "expected a document id")):
        bad = QAExample(id="q9", question="?", golden_answers=["Z"], metadata={"chain": chain})
        with pytest.raises(ValueError, match=f"question q9: {where}"):
            qa_records([bad])


def test_logged_searches_without_gold_ids_are_told_apart_by_their_episode(tmp_path,
                                                                         tiny_encoder):
    """The same query in a wrong episode and then a right one: the right one's labels are
    kept (the first copy alone was kept, all negative, so nothing was learnt)."""
    from seekrl.agent.trajectory import write_trajectories
    from seekrl.config import RankerTrainConfig
    from seekrl.recipes.ranker import train_ranker
    from seekrl.retrieval.index import build_index

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "contents": text}) + "\n"
                              for i, text in enumerate(["France capital Paris city",
                                                        "France capital wine region",
                                                        "Germany capital Berlin"])))
    index = build_index(corpus, tmp_path / "index", "bm25", show_progress=False)

    def episode(answer):
        return traj(answer, [], [Step(start=0, end=1, action="search",
                                      query="France capital", hits=["d0", "d1"])])

    logged = tmp_path / "logged.jsonl"
    write_trajectories(logged, [episode("Lyon"), episode("Paris")])
    summary = train_ranker(RankerTrainConfig(model=tiny_encoder, index=str(index),
                                             trajectories=[str(logged)], candidates=3,
                                             steps=1, out=str(tmp_path / "r")))
    assert summary["examples"] == 1 and summary["queries"] == 2


def test_examples_need_a_positive_and_a_negative_and_leave_unknowns_out():
    recs = [{"query": "q1", "gold_ids": ["d1"], "answers": [], "shown": [], "right": None},
            {"query": "q2", "gold_ids": ["d9"], "answers": [], "shown": [], "right": None},
            {"query": "q3", "gold_ids": [], "answers": ["Paris"], "shown": ["d0", "d1"],
             "right": True}]
    pools = [[hit(0), hit(1)], [hit(0), hit(1)], [hit(0, "Paris"), hit(1), hit(2)]]
    ex = training_examples(recs, pools)
    assert [(q, y) for q, _, y in ex] == [("q1", [0, 1]), ("q3", [1, 0])]
    assert len(ex[1][1]) == 2   # d2 was not shown: left out


def test_listwise_loss_is_minus_the_log_of_the_positives_share():
    s = torch.tensor([1.0, 2.0, 0.5])
    loss = listwise_loss([s], [[1, 0, 1]])
    p = torch.softmax(s, 0)
    assert float(loss) == pytest.approx(-math.log(float(p[0] + p[2])), rel=1e-6)


# ---- reranking
class Fixed:
    """A first stage that returns the same ordered candidates for every query."""

    def __init__(self, n: int):
        self.calls = []
        self.n = n

    def search(self, queries, k):
        self.calls.append(k)
        return [[hit(i, f"doc {i}") for i in range(min(k, self.n))] for _ in queries]


class ByIndex:
    """A ranker that prefers documents with a higher number."""

    def score(self, queries, docs, **_):
        return [[float(d.split()[-1]) for d in ds] for ds in docs]


def test_the_reranker_asks_for_candidates_and_shows_the_rankers_best_k():
    first = Fixed(8)
    rr = RerankingRetriever(first, ByIndex(), candidates=6, keep_candidates=True)
    (hits,) = rr.search(["q"], 2)
    assert first.calls == [6]
    assert [h.doc_id for h in hits] == ["d5", "d4"] and hits[0].score == 5.0
    assert [h.doc_id for h in rr.last["q"]] == [f"d{i}" for i in range(6)]
    rr.search(["q"], 7)          # k above the candidates: k documents are asked for
    assert first.calls[-1] == 7
    assert recall_at(rr, ["a", "b"], ["d5", "d0"], 1) == 0.5
    calls = len(first.calls)
    assert rr.search(["q", "r"], 0) == rr.search(["q", "r"], -1) == [[], []]
    assert len(first.calls) == calls          # nothing asked of the first stage
    with pytest.raises(ValueError, match="candidates"):
        RerankingRetriever(first, ByIndex(), candidates=0)


@pytest.mark.parametrize("kind", ["bi", "cross"])
def test_a_ranker_learns_a_toy_preference_and_saves_and_loads(tmp_path, tiny_encoder, kind):
    torch.manual_seed(0)
    ranker = load_ranker(tiny_encoder, kind=kind)
    docs = ["apple orchard", "river stone", "blue sky"]
    examples = [(f"question {i}", docs, [1, 0, 0]) for i in range(4)]
    before = ranker.score(["question 9"], [docs])[0]
    upd = RankerUpdater(ranker, lr=3e-3)
    first = upd.update(examples, 1, 4)["ranker_loss"]
    last = upd.update(examples, 30, 4)["ranker_loss"]
    assert last < first
    after = ranker.score(["question 9"], [docs])[0]
    assert max(range(3), key=after.__getitem__) == 0 and after != before
    assert not ranker.model.training
    ranker.save(tmp_path / "r")
    again = load_ranker(str(tmp_path / "r"))
    assert again.kind == kind
    assert again.score(["question 9"], [docs])[0] == pytest.approx(after, abs=1e-5)
    with pytest.raises(Exception, match="asked for"):
        load_ranker(str(tmp_path / "r"), kind="cross" if kind == "bi" else "bi")
    # its length and temperature are part of what it learned: the same are fine, others refused
    assert load_ranker(str(tmp_path / "r"), max_len=128, temperature=0.05).max_len == 128
    with pytest.raises(Exception, match="trained with max_len 128, asked for 64"):
        load_ranker(str(tmp_path / "r"), max_len=64)
    with pytest.raises(Exception, match="trained with temperature 0.05, asked for 0.1"):
        load_ranker(str(tmp_path / "r"), temperature=0.1)
    # a damaged settings file is named with what is wrong (a bare KeyError / JSON error)
    from seekrl.retrieval.base import RetrievalError
    from seekrl.retrieval.ranker import RANKER_FILE

    meta_file = tmp_path / "r" / RANKER_FILE
    good = meta_file.read_text()
    for text, message in (("{", "not valid JSON"), ("[1]", "expected a JSON object, got list"),
                          (json.dumps({k: v for k, v in json.loads(good).items()
                                       if k != "max_len"}), "missing field 'max_len'")):
        meta_file.write_text(text)
        with pytest.raises(RetrievalError, match=message) as info:
            load_ranker(str(tmp_path / "r"))
        assert str(meta_file) in str(info.value)
    meta_file.write_text(good)
    # a ranker trained at another length loads at it through the configs' defaults
    from seekrl.config import RankerSettings, RankerTrainConfig

    ranker.max_len = 64
    ranker.save(tmp_path / "r64")
    for rk in (RankerSettings(), RankerTrainConfig(index="i", data=["d"])):
        assert load_ranker(str(tmp_path / "r64"), max_len=rk.max_len,
                           temperature=rk.temperature).max_len == 64


def test_the_bundled_encoder_ranks_the_matching_document_first_before_training():
    ranker = load_ranker("minilm")
    scores = ranker.score(["who founded the studio"],
                          [["The weather was mild.", "The studio was founded by Ann Lee."]])[0]
    assert scores[1] > scores[0]
    assert ranker.kind == "bi"


def test_a_runs_folder_as_a_ranker_names_the_ranker_inside(tmp_path):
    from seekrl.retrieval.base import RetrievalError
    from seekrl.retrieval.ranker import RANKER_FILE

    (tmp_path / "final" / "ranker").mkdir(parents=True)
    (tmp_path / "final" / "ranker" / RANKER_FILE).write_text("{}")
    with pytest.raises(RetrievalError, match=r"a run's folder, not a ranker; its trained "
                                             r"ranker is .*final/ranker"):
        load_ranker(str(tmp_path / "final"))


def test_ranker_updater_state_round_trips(tiny_encoder):
    ranker = load_ranker(tiny_encoder)
    upd = RankerUpdater(ranker, lr=1e-3, seed=1)
    upd.update([("q", ["a", "b"], [1, 0])], 2, 1)
    state = upd.state_dict()
    other = RankerUpdater(load_ranker(tiny_encoder), lr=1e-3)
    other.load_state_dict(state)
    assert other.updates == 2 and other.rng.getstate() == upd.rng.getstate()


# ---- the recipe and the CLI
def test_seekrl_ranker_train_and_eval_run_from_the_cli(tmp_path, tiny_encoder):
    from conftest import build_lab
    from typer.testing import CliRunner

    from seekrl.cli import app

    _, paths, index_dir, _ = build_lab(tmp_path)
    result = CliRunner().invoke(app, [
        "ranker", "train", f"model={tiny_encoder}", f"index={index_dir}",
        f"data=[{paths['train']}]", f"eval_data=[{paths['dev']}]", f"out={tmp_path / 'rk'}",
        "steps=3", "candidates=5", "topk=2"])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "rk" / "summary.json").read_text())
    assert summary["examples"] > 0 and set(summary["recall"]) == {"first_stage", "before",
                                                                  "after"}
    assert all(0 <= v <= 1 for v in summary["recall"].values())
    again = CliRunner().invoke(app, ["ranker", "train", f"model={tiny_encoder}",
                                     f"index={index_dir}", f"data=[{paths['train']}]",
                                     f"out={tmp_path / 'rk'}", "steps=1"])
    assert again.exit_code != 0 and "--overwrite" in again.output
    from seekrl.agent.trajectory import write_trajectories
    from seekrl.data.qa import read_qa_jsonl

    dev = read_qa_jsonl(paths["dev"])[0]
    logged = tmp_path / "logged.jsonl"
    write_trajectories(logged, [traj("x", dev.metadata["gold_doc_ids"], [
        Step(start=0, end=1, action="search", query=dev.metadata["chain"][0]["query"],
             hits=[])])])
    result = CliRunner().invoke(app, ["ranker", "eval", "--index", str(index_dir), "--data",
                                      str(paths["dev"]), "--trajectories", str(logged),
                                      "--ranker", summary["final"], "--candidates", "5",
                                      "--topk", "2"])
    assert result.exit_code == 0, result.output
    assert "recall@2 first_stage=" in result.output and f"recall@2 {summary['final']}=" \
        in result.output
    assert "gold_hit@2 first_stage=1.0000 (1 logged searches)" in result.output
    nothing = CliRunner().invoke(app, ["ranker", "eval", "--index", str(index_dir)])
    assert nothing.exit_code != 0 and "--trajectories" in nothing.output
    for k, said in (("0", "--topk: expected at least 1, got 0"),   # recall@k of nothing,
                    ("6", "--topk: expected 1 to --candidates (5), got 6")):   # or of more
        bad = CliRunner().invoke(app, ["ranker", "eval", "--index", str(index_dir), "--data",
                                       str(paths["dev"]), "--ranker", summary["final"],
                                       "--candidates", "5", "--topk", k])
        assert bad.exit_code != 0 and said in " ".join(bad.output.split()), bad.output
    # the first stage alone has no candidates to stay within (--topk 20 had been refused
    # against a default of 10), and --candidates without a ranker would be read by nothing
    alone = CliRunner().invoke(app, ["ranker", "eval", "--index", str(index_dir), "--data",
                                     str(paths["dev"]), "--topk", "20"])
    assert alone.exit_code == 0 and "recall@20 first_stage=" in alone.output, alone.output
    unread = CliRunner().invoke(app, ["ranker", "eval", "--index", str(index_dir), "--data",
                                      str(paths["dev"]), "--candidates", "5"])
    assert unread.exit_code != 0 and "give --ranker too" in " ".join(unread.output.split())


def test_bad_ranker_settings_name_the_key(tmp_path):
    from pydantic import ValidationError

    from seekrl.config import RankerTrainConfig, TrainConfig

    with pytest.raises(ValidationError, match="kind"):
        RankerTrainConfig(index="x", kind="listwise")
    with pytest.raises(ValidationError, match="candidates"):
        TrainConfig(data="d", ranker={"candidates": 0})


def test_a_ranker_with_nothing_to_learn_from_says_so(tmp_path, tiny_encoder):
    from conftest import build_world_and_index

    from seekrl.config import RankerTrainConfig
    from seekrl.recipes.ranker import train_ranker

    _, paths, index_dir = build_world_and_index(tmp_path / "w", seed=4, entities=200,
                                                n_train=4, n_dev=2, n_test=2)
    with pytest.raises(ValueError, match="no source of search queries"):
        RankerTrainConfig(model=tiny_encoder, index=str(index_dir), out=str(tmp_path / "r"))
    plain = tmp_path / "plain.jsonl"   # questions without the world's hop queries
    plain.write_text(json.dumps({"id": "q", "question": "q?", "golden_answers": ["a"]}) + "\n")
    with pytest.raises(ValueError, match="no search queries found .* question_queries: true"):
        train_ranker(RankerTrainConfig(model=tiny_encoder, index=str(index_dir),
                                       data=[str(plain)], out=str(tmp_path / "r")))
    # one candidate per query: never a positive and a negative together
    with pytest.raises(ValueError, match="nothing to learn from"):
        train_ranker(RankerTrainConfig(model=tiny_encoder, index=str(index_dir),
                                       data=[str(paths["train"])], candidates=1,
                                       out=str(tmp_path / "r")))


def test_ranker_train_measures_held_out_questions_without_a_chain(tmp_path, tiny_encoder):
    """eval_data of questions with gold ids but no hop chain (a benchmark's dev set) is
    measured as `ranker eval` measures it (it was dropped without a word); eval data with
    no gold at all is refused; an eval_trajectories error names that field."""
    from conftest import build_world_and_index

    from seekrl.config import RankerTrainConfig
    from seekrl.data.qa import read_qa_jsonl
    from seekrl.recipes.ranker import train_ranker

    _, paths, index_dir = build_world_and_index(tmp_path / "w", seed=4, entities=200,
                                                n_train=6, n_dev=3, n_test=2)
    flat = tmp_path / "flat.jsonl"
    flat.write_text("".join(json.dumps({"id": q.id, "question": q.question,
                                        "golden_answers": q.golden_answers,
                                        "metadata": {"gold_doc_ids":
                                                     q.metadata["gold_doc_ids"]}}) + "\n"
                            for q in read_qa_jsonl(paths["dev"])))
    cfg = dict(model=tiny_encoder, index=str(index_dir), data=[str(paths["train"])],
               candidates=5, topk=2, steps=1)
    summary = train_ranker(RankerTrainConfig(**cfg, eval_data=[str(flat)],
                                             out=str(tmp_path / "a")))
    assert set(summary["question_recall"]) == {"first_stage", "before", "after"}
    assert summary["held_out_questions"] == 3 and summary["recall"] == {}
    bare = tmp_path / "bare.jsonl"
    bare.write_text(json.dumps({"id": "b", "question": "b?", "golden_answers": ["x"]}) + "\n")
    with pytest.raises(ValueError, match="eval_data: no question with gold documents"):
        train_ranker(RankerTrainConfig(**cfg, eval_data=[str(bare)], out=str(tmp_path / "b")))
    from seekrl.agent.trajectory import write_trajectories
    logged = tmp_path / "logged.jsonl"
    write_trajectories(logged, [traj("x", [], [Step(start=0, end=1, action="search",
                                                    query="who", hits=[])])])
    with pytest.raises(ValueError, match="^eval_trajectories: no searches"):
        train_ranker(RankerTrainConfig(**cfg, eval_trajectories=[str(logged)],
                                       out=str(tmp_path / "c")))


def test_a_stopped_ranker_training_resumes_to_what_a_straight_one_trains(tmp_path,
                                                                        tiny_encoder,
                                                                        monkeypatch):
    """Ctrl-C after step 15 of 25 (a checkpoint every 5): `resume` ends with the weights,
    the logged losses and the before/after figures of a run that never stopped and saved
    nothing (the checkpoint blocks change no draw, dropout's included), keeping the last
    step's checkpoint alone; a later --overwrite keeps that ranker until a new one
    replaces it."""
    from conftest import build_world_and_index, interrupt_at_call

    from seekrl.config import RankerTrainConfig
    from seekrl.recipes.ranker import train_ranker
    from seekrl.recipes.setup import Interrupted
    from seekrl.retrieval.ranker import RankerUpdater

    _, paths, index_dir = build_world_and_index(tmp_path / "w", seed=4, entities=200,
                                                n_train=8, n_dev=3, n_test=2)
    cfg = dict(model=tiny_encoder, index=str(index_dir), data=[str(paths["train"])],
               eval_data=[str(paths["dev"])], candidates=5, topk=2, steps=25, batch_size=4,
               lr=1e-3)
    straight = train_ranker(RankerTrainConfig(**cfg, save_every=0, out=str(tmp_path / "a")))
    stopped = RankerTrainConfig(**cfg, save_every=5, out=str(tmp_path / "b"))
    put_back = interrupt_at_call(monkeypatch, RankerUpdater, "update", 4)   # blocks of 5
    with pytest.raises(Interrupted) as err:
        train_ranker(stopped)
    assert err.value.done == 15 and err.value.checkpoint == tmp_path / "b/checkpoints/step-15"
    put_back()
    with pytest.raises(FileExistsError, match="stopped ranker training .* --resume"):
        train_ranker(stopped)
    resumed = train_ranker(stopped, resume=True)
    # the losses are block means, rounded: a 10-step block cut at 15 may differ in the last place
    assert [r["step"] for r in resumed["log"]] == [r["step"] for r in straight["log"]] == \
        [10, 20, 25]
    assert [r["ranker_loss"] for r in resumed["log"]] == pytest.approx(
        [r["ranker_loss"] for r in straight["log"]], abs=2e-5)
    assert resumed["recall"] == straight["recall"]
    from safetensors.torch import load_file
    a, b = (load_file(tmp_path / run / "final" / "model.safetensors") for run in ("a", "b"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (tmp_path / "b/checkpoints/latest").read_text() == "step-25"   # the last, kept
    assert [p.name for p in (tmp_path / "b/checkpoints").iterdir() if p.is_dir()] == ["step-25"]
    with pytest.raises(FileExistsError, match="already holds a trained ranker"):
        train_ranker(stopped, resume=True)
    # --overwrite keeps the old ranker until the new one replaces it
    interrupt_at_call(monkeypatch, RankerUpdater, "update", 1)
    with pytest.raises(Interrupted):
        train_ranker(stopped, overwrite=True)
    monkeypatch.undo()
    kept = load_file(tmp_path / "b" / "final" / "model.safetensors")
    assert all(torch.equal(kept[k], b[k]) for k in b)
    assert not (tmp_path / "b" / "summary.json").exists()
    with pytest.raises(FileExistsError, match="already holds a trained ranker"):
        train_ranker(stopped)


def test_a_ranker_resume_refuses_what_would_mix_two_trainings(tmp_path, tiny_encoder,
                                                              monkeypatch):
    """Resume needs a checkpoint and the run's config.yaml; a changed setting that shapes
    the training (lr, data) is named and refused, fewer steps than done too; more steps are
    taken; a stop after the last step's checkpoint finishes on resume; --overwrite starts
    over."""
    from conftest import build_world_and_index, interrupt_at_call

    from seekrl.config import ConfigError, RankerTrainConfig
    from seekrl.recipes.ranker import train_ranker
    from seekrl.recipes.setup import Interrupted
    from seekrl.retrieval.ranker import RankerUpdater

    _, paths, index_dir = build_world_and_index(tmp_path / "w", seed=4, entities=200,
                                                n_train=6, n_dev=2, n_test=2)
    cfg = dict(model=tiny_encoder, index=str(index_dir), data=[str(paths["train"])],
               candidates=5, topk=2, batch_size=4, save_every=10, out=str(tmp_path / "r"))
    with pytest.raises(ConfigError, match="has no ranker checkpoint"):
        train_ranker(RankerTrainConfig(**cfg, steps=30), resume=True)
    interrupt_at_call(monkeypatch, RankerUpdater, "update", 3)
    with pytest.raises(Interrupted):
        train_ranker(RankerTrainConfig(**cfg, steps=30))   # stopped after step 20
    monkeypatch.undo()
    for changed, said in ((dict(lr=1e-3), "lr: 2e-05 -> 0.001"),
                          (dict(data=[str(paths["dev"])]), "data: ")):
        with pytest.raises(ConfigError, match=f"other settings: {said}"):
            train_ranker(RankerTrainConfig(**{**cfg, **changed}, steps=30), resume=True)
    with pytest.raises(ConfigError, match="steps: 10, and .* has done 20"):
        train_ranker(RankerTrainConfig(**cfg, steps=10), resume=True)
    (tmp_path / "r" / "config.yaml").rename(tmp_path / "config.yaml")
    with pytest.raises(ConfigError, match="has no config.yaml"):
        train_ranker(RankerTrainConfig(**cfg, steps=30), resume=True)
    (tmp_path / "config.yaml").rename(tmp_path / "r" / "config.yaml")
    # stopped while "after" is measured: the checkpoint of the last step finishes it
    import seekrl.recipes.ranker as ranker_module
    interrupt_at_call(monkeypatch, ranker_module, "ranked_retriever", 1)
    with pytest.raises(Interrupted) as err:
        train_ranker(RankerTrainConfig(**cfg, steps=40), resume=True)
    monkeypatch.undo()
    assert err.value.done == 40 and err.value.checkpoint.name == "step-40"
    longer = train_ranker(RankerTrainConfig(**cfg, steps=40), resume=True)
    assert [r["step"] for r in longer["log"]] == [10, 20, 30, 40]
    again = train_ranker(RankerTrainConfig(**cfg, steps=10), overwrite=True)
    assert [r["step"] for r in again["log"]] == [10]


# ---- trained with the agent
def _rl_config(tmp_path, paths, index_dir, encoder, out="run", **ranker):
    from seekrl.config import TrainConfig

    return TrainConfig(data=str(paths["train"]), index=str(index_dir), out=str(tmp_path / out),
                       steps=2, questions_per_step=2, group_size=2, save_every=1,
                       rollout={"max_turns": 2, "max_new_tokens": 32},
                       ranker={"model": encoder, "candidates": 5, "lr": 1e-3, **ranker})


def test_the_ranker_trains_with_the_agent_and_resumes_where_it_stopped(tmp_path, tiny,
                                                                       tiny_encoder):
    """The rollouts search through the ranker; each step it learns from the step's searches
    (a crafted search policy: the tiny model's own rarely searches); a run stopped after
    step 1 and resumed ends with the same ranker as one that ran through."""
    from conftest import build_world_and_index

    _, paths, index_dir = build_world_and_index(tmp_path / "w", seed=4, entities=200,
                                                n_train=8, n_dev=2, n_test=2)
    finals = _through_and_resumed(tmp_path, tiny, RerankingRetriever, lambda name: _rl_config(
        tmp_path, paths, index_dir, tiny_encoder, out=name))
    docs = [["a founded b", "c worked for d", "e was established in 1901"]]
    through = finals["through"].score(["b founded by"], docs)[0]
    assert finals["resumed"].score(["b founded by"], docs)[0] == pytest.approx(through, abs=1e-5)
    fresh = load_ranker(tiny_encoder).score(["b founded by"], docs)[0]
    assert fresh != pytest.approx(through, abs=1e-4)   # it did learn


def test_the_ranker_learns_each_step_from_the_candidates_it_gave_labelled_by_gold(
        tmp_path, tiny, tiny_encoder):
    """What the ranker trained with the agent learns from: each search's whole candidate
    pool (the `candidates` first-stage documents, not only the top k shown), labelled 1
    where the document is a gold one of the episode's question; the update lowers the
    listwise loss on exactly those examples."""
    from conftest import build_world_and_index

    from seekrl.recipes.train import Trainer

    _, paths, index_dir = build_world_and_index(tmp_path / "w", seed=4, entities=200,
                                                n_train=8, n_dev=2, n_test=2)
    model, tok = tiny
    cfg = _rl_config(tmp_path, paths, index_dir, tiny_encoder, out="spy")
    trainer = Trainer(cfg, model=copy_model(model), tokenizer=tok)
    _force_searches(trainer)
    gold = {q.metadata["chain"][0]["query"]: set(q.metadata["gold_doc_ids"])
            for q in trainer.questions}
    ranker, real_update, got = trainer.retriever.ranker, trainer.env.ranker_updater.update, []

    def loss(examples):
        scores = ranker.score([q for q, _, _ in examples], [p for _, p, _ in examples])
        return float(listwise_loss([torch.tensor(x) for x in scores],
                                   [y for _, _, y in examples]))

    def spy(examples, *a, **k):
        got.extend(examples)
        before = loss(examples)
        out = real_update(examples, *a, **k)
        got.append(("losses", before, loss(examples)))
        return out

    trainer.env.ranker_updater.update = spy
    trainer.step(1)
    *examples, (_, before, after) = got
    assert examples
    for query, pool, labels in examples:
        assert len(pool) == cfg.ranker.candidates > cfg.rollout.topk
        assert labels == [int(h.doc_id in gold[query]) for h in pool] and 0 < sum(labels)
    assert after < before


def test_the_ranker_learns_from_every_search_played_under_dynamic_sampling(tmp_path, tiny,
                                                                          tiny_encoder):
    """Dynamic sampling keeps the groups whose rewards vary; the ranker's labels are gold
    documents, so it learns from every group's searches (here every group ties: it had
    learnt from none)."""
    from conftest import build_world_and_index

    from seekrl.recipes.train import Trainer

    _, paths, index_dir = build_world_and_index(tmp_path / "w", seed=4, entities=200,
                                                n_train=8, n_dev=2, n_test=2)
    model, tok = tiny
    cfg = _rl_config(tmp_path, paths, index_dir, tiny_encoder, out="ds")
    cfg = cfg.model_copy(update={"algo": cfg.algo.model_copy(
        update={"dynamic_sampling": True, "max_refills": 0})})
    trainer = Trainer(cfg, model=copy_model(model), tokenizer=tok)
    _force_searches(trainer)   # every episode answers "x": every group ties
    got = []
    real_update = trainer.env.ranker_updater.update
    trainer.env.ranker_updater.update = lambda ex, *a, **k: got.extend(ex) or \
        real_update(ex, *a, **k)
    record = trainer.step(1)
    assert record["episodes"] == 0 and record["episodes_sampled"] == 4
    assert len(got) == 4   # every episode's search (one each), a gold document in its pool


def _through_and_resumed(tmp_path, tiny, retriever_type, config) -> dict:
    """Train with the ranker twice, straight through and stopped after step 1 then resumed
    (every step with searches the ranker learns from); the final rankers by run."""
    from pathlib import Path
    from unittest import mock

    import seekrl.recipes.checkpoint as checkpoint
    from seekrl.config import ConfigError
    from seekrl.recipes.train import Trainer

    model, tok = tiny
    finals = {}
    for name, until in (("through", None), ("resumed", 1)):
        cfg = config(name)
        trainer = Trainer(cfg, model=copy_model(model), tokenizer=tok)
        assert isinstance(trainer.retriever, retriever_type)
        searches = _force_searches(trainer)
        if until:
            trainer.train(until=until)
            trainer = Trainer(cfg, model=copy_model(model), tokenizer=tok, resume=True)
            _force_searches(trainer)
        renamed = {}
        real_replace = checkpoint.replace_dir

        def replace_dir(tmp, target, renamed=renamed, real_replace=real_replace):
            if Path(target).name == "final":   # what final/ holds as it appears
                renamed["ranker"] = (Path(tmp) / "ranker" / "ranker.json").is_file()
            return real_replace(tmp, target)

        with mock.patch.object(checkpoint, "replace_dir", replace_dir):
            summary = trainer.train()
        # the trained ranker is in the folder before it is renamed into place
        assert renamed == {"ranker": True}
        assert trainer.retriever.seconds > 0   # the ranker's scoring time was counted
        records = [json.loads(x) for x in
                   (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        assert all(r["ranker_examples"] > 0 for r in records if "episodes" in r), records
        assert records[-1]["ranker_updates"] == 2 * cfg.ranker.updates_per_step
        # the ranker's own time, which the policy-token budget does not count, is logged
        # (rounded to 10 ms: a tiny ranker's step may round to 0)
        assert all(r["time_ranker_score"] >= 0 and r["time_ranker_update"] >= 0
                   for r in records if "episodes" in r), records
        finals[name] = load_ranker(summary["final"] + "/ranker")
        if until:   # a checkpoint without its ranker is refused, not resumed from the start one
            ckpt = tmp_path / name / "no-ranker"
            ckpt.mkdir()
            with pytest.raises(ConfigError, match=r"no-ranker holds no ranker/"):
                trainer.load_checkpoint(ckpt)
        assert searches
    return finals


def copy_model(model):
    import copy
    return copy.deepcopy(model)


def _force_searches(trainer):
    """Every first turn of the tiny policy becomes a search (its own random text rarely is),
    so the ranker has searches to learn from; the turns' tokens are trained as usual."""
    seen: list[str] = []
    hops = {q.question: q.metadata["chain"][0]["query"] for q in trainer.questions}
    backend = _ScriptedBackend(trainer.tokenizer, seen, hops)
    trainer._generation_backend = lambda: backend
    return seen


class _ScriptedBackend(Backend):
    def __init__(self, tokenizer, seen, hops):
        self.tok, self.seen, self.hops = tokenizer, seen, hops

    def generate(self, contexts, max_new_tokens, sampling, keys=None):
        out = []
        for c in contexts:
            text = self.tok.decode(c)
            query = next(h for q, h in self.hops.items() if q in text)
            searched = "</information>" in text.rsplit("assistant", 1)[-1]   # this episode's
            turn = "<answer> x </answer>" if searched \
                else f"<search> {query} </search>"
            self.seen.append(turn)
            ids = self.tok.encode(turn, add_special_tokens=False)
            out.append(Generated(ids, None if sampling.greedy else [-1.0] * len(ids)))
        return out


def test_a_ranker_in_rl_needs_a_real_retriever(tmp_path):
    from seekrl.config import ConfigError, TrainConfig
    from seekrl.recipes.train import check_config

    for other in ({"rollout": {"self_search": True}}, {"simulator": {}}):
        with pytest.raises(ConfigError, match="ranker: it orders a real retriever's"):
            check_config(TrainConfig(data="d", index="i", ranker={}, **other))
    check_config(TrainConfig(data="d", index="i", ranker={"candidates": 2},
                             rollout={"topk": 3}))   # the first stage gives max(k, candidates)


def test_the_server_answers_the_rankers_order_and_refuses_a_ranker_without_an_index():
    from fastapi.testclient import TestClient

    from seekrl.retrieval.base import RetrievalError
    from seekrl.retrieval.server import create_app, run_server

    app = create_app(RerankingRetriever(Fixed(8), ByIndex(), candidates=5),
                     manifest={"type": "bm25", "ranker": "by-index"})
    r = TestClient(app).post("/retrieve", json={"queries": ["q"], "topk": 2,
                                                "return_scores": True})
    assert r.status_code == 200
    assert [h["document"]["id"] for h in r.json()["result"][0]] == ["d4", "d3"]
    with pytest.raises(RetrievalError, match="simulated engine"):
        run_server(None, simulate="smollm2-135m", ranker="minilm")
    with pytest.raises(RetrievalError, match="--candidates"):
        run_server("idx", ranker="minilm", candidates=0)


# ---- kind query: the dense index's own query encoder, fine-tuned over its stored vectors
@pytest.fixture(scope="module")
def dense_lab(tmp_path_factory, tiny_encoder):
    """A small world with a dense index (the tiny encoder) and a BM25 index of it."""
    from conftest import build_world_and_index

    from seekrl.retrieval.index import build_index

    root = tmp_path_factory.mktemp("dense")
    _, paths, bm25 = build_world_and_index(root / "w", seed=4, entities=200, n_train=8,
                                           n_dev=4, n_test=2)
    dense = build_index(paths["corpus"], root / "dense", "dense", encoder=tiny_encoder,
                        show_progress=False)
    return paths, dense, bm25


def test_the_store_finds_each_documents_row_and_names_a_missing_id(dense_lab):
    from seekrl.retrieval.index import load_index

    _, dense, _ = dense_lab
    store = load_index(dense).store
    ids = [store.ids[r] for r in (5, 0, len(store) - 1, 5)]
    assert store.rows_of(ids) == [5, 0, len(store) - 1, 5]
    with pytest.raises(KeyError, match="'nope'"):
        store.rows_of(["nope"])


def test_a_query_encoder_learns_over_the_stored_vectors_and_saves_and_loads(tmp_path,
                                                                            dense_lab):
    """Before training it searches exactly like the index; trained towards its sixth
    candidate it puts that document first among them and higher in the whole index; the
    index's vectors and its own encoder are untouched; saved and loaded, it scores the
    same."""
    from seekrl.retrieval.index import load_index
    from seekrl.retrieval.ranker import QueryEncoderRetriever, dense_part, ranked_retriever

    _, dense_dir, _ = dense_lab
    index = load_index(dense_dir)
    dense = dense_part(index)
    stored = dense.index.reconstruct_batch(np.arange(4, dtype=np.int64)).copy()
    encoder_before = [p.detach().clone() for p in dense.encoder.parameters()]
    torch.manual_seed(0)
    qe = load_ranker(kind="query", first=index)
    rr = ranked_retriever(index, qe, candidates=6, keep_candidates=True)
    assert isinstance(rr, QueryEncoderRetriever)
    query = "who founded the old mill"
    assert [h.doc_id for h in rr.search([query], 5)[0]] == \
        [h.doc_id for h in index.search([query], 5)[0]]
    assert rr.search([query], -1) == rr.search([query], 0) == [[]]
    pool = rr.last[query]
    assert len(pool) == 6
    target = pool[-1]                # the sixth: teach the encoder to put it first
    labels = [int(h.doc_id == target.doc_id) for h in pool]
    upd = RankerUpdater(qe, lr=5e-3)
    first = upd.update([(query, pool, labels)], 1, 1)["ranker_loss"]
    last = upd.update([(query, pool, labels)], 40, 1)["ranker_loss"]
    assert last < first
    scores = qe.score([query], [pool])[0]
    assert max(range(6), key=scores.__getitem__) == 5      # first among its candidates
    ranked = [h.doc_id for h in rr.search([query], 50)[0]]  # and higher in the whole index
    assert ranked.index(target.doc_id) < 5
    assert np.array_equal(dense.index.reconstruct_batch(np.arange(4, dtype=np.int64)), stored)
    assert all(torch.equal(a, b) for a, b in zip(encoder_before, dense.encoder.parameters()))
    with pytest.raises(TypeError, match="Hits"):
        qe.logits([query], [["a text"]])
    qe.save(tmp_path / "qe")
    again = load_ranker(str(tmp_path / "qe"))
    assert again.kind == "query"
    again.bind(index)
    assert again.score([query], [pool])[0] == pytest.approx(qe.score([query], [pool])[0],
                                                            abs=1e-4)


def test_a_query_encoder_reads_the_stored_vectors_of_an_ivf_index(dense_lab):
    """An IVF index (what `--index-type ivfpq` builds) gives rows only with a direct map:
    the first training step failed with a raw faiss error."""
    import faiss

    from seekrl.retrieval.index import load_index
    from seekrl.retrieval.ranker import dense_part

    _, dense_dir, _ = dense_lab
    index = load_index(dense_dir)
    dense = dense_part(index)
    stored = dense.index.reconstruct_n(0, dense.index.ntotal)
    ivf = faiss.IndexIVFFlat(faiss.IndexFlatIP(stored.shape[1]), stored.shape[1], 4,
                             faiss.METRIC_INNER_PRODUCT)
    ivf.train(stored)
    ivf.add(stored)
    dense.index = ivf
    qe = load_ranker(kind="query", first=index)
    qe.bind(index)
    hits = [Hit(index.store.ids[r], "", "", 0.0) for r in (3, 0, 7)]
    assert np.allclose(qe.vectors(hits).numpy(), stored[[3, 0, 7]])

def test_a_query_encoder_needs_a_dense_index(dense_lab):
    from seekrl.retrieval.base import RetrievalError
    from seekrl.retrieval.index import load_index

    _, _, bm25 = dense_lab
    with pytest.raises(RetrievalError, match="dense or hybrid index"):
        load_ranker(kind="query", first=load_index(bm25))
    with pytest.raises(RetrievalError, match="give the index"):
        load_ranker(kind="query")


def test_seekrl_ranker_train_fine_tunes_a_query_encoder_from_the_cli(tmp_path, dense_lab):
    from typer.testing import CliRunner

    from seekrl.cli import app

    paths, dense_dir, _ = dense_lab
    result = CliRunner().invoke(app, [
        "ranker", "train", "kind=query", f"index={dense_dir}", f"data=[{paths['train']}]",
        f"eval_data=[{paths['dev']}]", f"out={tmp_path / 'qe'}", "steps=3", "candidates=5",
        "topk=2", "lr=1e-3"])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "qe" / "summary.json").read_text())
    assert summary["kind"] == "query"
    # untrained, the query encoder is the index's own: it searches exactly like the index
    assert summary["recall"]["before"] == summary["recall"]["first_stage"]
    result = CliRunner().invoke(app, ["ranker", "eval", "--index", str(dense_dir), "--data",
                                      str(paths["dev"]), "--ranker", summary["final"],
                                      "--topk", "2"])
    assert result.exit_code == 0, result.output
    assert f"recall@2 {summary['final']}=" in result.output


def test_a_stopped_query_encoder_training_resumes_from_the_cli(tmp_path, dense_lab,
                                                               monkeypatch):
    """A query encoder loaded from a checkpoint is bound to the index again (it loads
    unbound): resumed with --resume after a Ctrl-C, it ends as a straight run does."""
    from conftest import interrupt_at_call
    from typer.testing import CliRunner

    from seekrl.cli import app
    from seekrl.retrieval.ranker import RankerUpdater

    paths, dense_dir, _ = dense_lab
    args = ["ranker", "train", "kind=query", f"index={dense_dir}", f"data=[{paths['train']}]",
            f"eval_data=[{paths['dev']}]", "steps=6", "save_every=3", "candidates=5",
            "topk=2", "lr=1e-3", "batch_size=4"]
    straight = CliRunner().invoke(app, [*args, f"out={tmp_path / 'a'}"])
    assert straight.exit_code == 0, straight.output
    interrupt_at_call(monkeypatch, RankerUpdater, "update", 2)
    stopped = CliRunner().invoke(app, [*args, f"out={tmp_path / 'b'}"])
    assert stopped.exit_code == 130 and "after step 3" in stopped.output, stopped.output
    monkeypatch.undo()
    resumed = CliRunner().invoke(app, [*args, f"out={tmp_path / 'b'}", "--resume"])
    assert resumed.exit_code == 0 and "resuming from" in resumed.output, resumed.output
    a, b = (json.loads((tmp_path / run / "summary.json").read_text()) for run in "ab")
    assert a["recall"] == b["recall"] and [r["step"] for r in b["log"]] == [6]
    assert b["log"][0]["ranker_loss"] == pytest.approx(a["log"][0]["ranker_loss"], abs=2e-5)


def test_a_query_encoder_trains_with_the_agent_and_resumes_where_it_stopped(tmp_path, tiny,
                                                                            dense_lab):
    from seekrl.retrieval.ranker import QueryEncoderRetriever

    paths, dense_dir, _ = dense_lab
    finals = _through_and_resumed(tmp_path, tiny, QueryEncoderRetriever, lambda name: _rl_config(
        tmp_path, paths, dense_dir, None, out=name, kind="query"))
    from seekrl.retrieval.index import load_index

    index = load_index(dense_dir)
    pool = index.search(["b founded by"], 5)
    for r in finals.values():
        r.bind(index)
    through = finals["through"].score(["b founded by"], pool)[0]
    assert finals["resumed"].score(["b founded by"], pool)[0] == pytest.approx(through, abs=1e-5)
    fresh = load_ranker(kind="query", first=index)
    fresh.bind(index)
    assert fresh.score(["b founded by"], pool)[0] != pytest.approx(through, abs=1e-4)


def test_the_best_policy_keeps_the_ranker_it_was_trained_with(tmp_path, tiny, tiny_encoder,
                                                             monkeypatch):
    """eval.keep_best with a co-trained ranker: RUN/best holds the ranker as it was when
    that policy was evaluated, as final/ holds the final one (a policy is evaluated
    through the ranker it learned with)."""
    from conftest import build_world_and_index

    from seekrl.recipes.train import Trainer

    _, paths, index_dir = build_world_and_index(tmp_path / "w", seed=4, entities=200,
                                                n_train=8, n_dev=2, n_test=2)
    ems = iter([0.1, 0.5, 0.2])   # start, step 1, final: the best is step 1's

    def fake_eval(self, out_dir):
        return {"em": next(ems), "f1": 0.0, "valid_format": 1.0, "searches": 1.0,
                "questions": 2}

    monkeypatch.setattr(Trainer, "evaluate", fake_eval)
    cfg = _rl_config(tmp_path, paths, index_dir, tiny_encoder, out="best")
    cfg = type(cfg).model_validate({**cfg.model_dump(), "eval": {
        "data": str(paths["test"]), "every": 1, "keep_best": True}})
    model, tok = tiny
    trainer = Trainer(cfg, model=copy_model(model), tokenizer=tok)
    _force_searches(trainer)
    summary = trainer.train()
    assert summary["best"]["step"] == 1
    best = tmp_path / "best" / "best"
    assert (best / "ranker").is_dir() and (tmp_path / "best" / "final" / "ranker").is_dir()
    docs = [["a founded b", "c worked for d", "e was established in 1901"]]
    after_one = load_ranker(str(best / "ranker")).score(["b founded by"], docs)[0]
    final = load_ranker(str(tmp_path / "best" / "final" / "ranker")).score(["b founded by"],
                                                                           docs)[0]
    assert after_one != pytest.approx(final, abs=1e-6)   # step 2 trained it further
