"""Parallel sub-queries (rollout.max_queries > 1, ParallelSearch): the `##` syntax, one
batched retriever call per turn, the information block, malformed turns, the step rewards
(decomposition, redundancy per sub-query), the turn cost, and the oracle's waves."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seekrl.agent.backends import Backend
from seekrl.agent.oracle import _search_steps, _waves, oracle_episode
from seekrl.agent.protocol import QUERY_SEPARATOR, format_query_results, split_queries
from seekrl.agent.rollout import RolloutConfig, RolloutEngine
from seekrl.agent.trajectory import Step, Trajectory
from seekrl.config import ConfigError, build_config
from seekrl.data.qa import QAExample
from seekrl.models import tiny_policy
from seekrl.retrieval.base import Hit
from seekrl.rewards.outcome import episode_reward
from seekrl.rewards.process import ProcessContext, decomposition, redundancy

DOCS = {"tarrow": Hit("d-t", "Tarrow", "Tarrow has 40,000 people.", 2.0),
        "kelbaan": Hit("d-k", "Kelbaan", "Kelbaan has 90,000 people.", 2.0),
        "other": Hit("d-o", "Other", "Nothing here.", 1.0)}


@pytest.fixture(scope="module")
def tiny():
    return tiny_policy(seed=0)


class Docs:
    """Each query finds the document its first word names, then `other`; records calls."""

    def __init__(self):
        self.calls: list[list[str]] = []

    def search(self, queries, k):
        self.calls.append(list(queries))
        return [[DOCS.get(q.split()[0].lower(), DOCS["other"]), DOCS["other"]][:k]
                for q in queries]


class Script(Backend):
    def __init__(self, tok, turns):
        self.tok, self.turns, self.calls = tok, turns, 0

    def generate(self, contexts, max_new_tokens, sampling, keys=None):
        turn = self.turns[min(self.calls, len(self.turns) - 1)]
        self.calls += 1
        return [self.tok.encode(turn, add_special_tokens=False) for _ in contexts]


def _block(tok, t, i):
    s = t.steps[i]
    return tok.decode(t.token_ids[s.info_start:s.info_end])


# ---- the syntax
_query = st.text(st.characters(blacklist_characters="#", blacklist_categories=("Cs",)),
                 max_size=12).filter(lambda q: q.split())


@settings(max_examples=200, deadline=None)
@given(st.lists(_query, min_size=1, max_size=6), st.integers(1, 6))
def test_split_queries_round_trips_and_never_raises(queries, limit):
    text = f" {QUERY_SEPARATOR} ".join(queries)
    got, problem = split_queries(text, limit)
    if limit == 1:   # one query, the separator and all
        assert (got, problem) == ([" ".join(text.split())], None)
    elif len(queries) > limit:
        assert got == [] and f"at most {limit}" in problem
    else:
        assert problem is None and got == [" ".join(q.split()) for q in queries]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40) | st.text("ab #\n", max_size=20), st.integers(1, 8))
def test_split_queries_of_any_text_is_queries_or_a_reason(text, limit):
    got, problem = split_queries(text, limit)
    assert (problem is None) == bool(got)
    assert all(q and q == " ".join(q.split()) for q in got) and len(got) <= limit


@pytest.mark.parametrize("text, why", [("a ## ## b", "empty sub-query"), ("a ##", "empty sub-query"),
                                       ("## a", "empty sub-query"), ("a ## b ## c", "3 sub-queries"),
                                       ("  ", "empty search")])
def test_malformed_multi_query_texts_say_why(text, why):
    got, problem = split_queries(text, 2)
    assert got == [] and why in problem


def test_the_query_length_limit_holds_each_sub_query():
    """500 characters a query: with several sub-queries, each sub-query (as the server
    checks each query), not the turn's whole text."""
    from seekrl.agent.protocol import MAX_QUERY_CHARS, parse_action

    a, b = "a" * MAX_QUERY_CHARS, "b" * 300
    action = parse_action(f"<search> {a} ## {b} </search>", max_queries=2)
    assert action.kind == "search" and split_queries(action.text, 2) == ([a, b], None)
    assert parse_action(f"<search> {a} ## {b} </search>").kind == "invalid"   # one query
    action = parse_action(f"<search> {b} ## {a}c </search>", max_queries=2)
    assert split_queries(action.text, 2) == ([], "sub-query 2 longer than 500 characters")
    assert parse_action(f"<search> {a} ## {a} ## {a} </search>", max_queries=2).kind == "invalid"
    assert parse_action(f"<answer> {b} {b} </answer>", max_queries=3).kind == "invalid"


def test_the_block_numbers_documents_on_across_sub_queries():
    a, b = [DOCS["tarrow"], DOCS["other"]], [DOCS["kelbaan"]]
    assert format_query_results(["tarrow size", "kelbaan size"], [a, b]) == (
        "Query 1: tarrow size\nDoc 1 (Title: Tarrow) Tarrow has 40,000 people.\n"
        "Doc 2 (Title: Other) Nothing here.\n"
        "Query 2: kelbaan size\nDoc 3 (Title: Kelbaan) Kelbaan has 90,000 people.")
    assert format_query_results(["q"], [a]).startswith("Doc 1 (Title: Tarrow)")   # as before
    with pytest.raises(ValueError):
        format_query_results(["q"], [a, b])


def test_max_queries_is_checked_naming_the_key():
    with pytest.raises(ConfigError, match="max_queries"):
        build_config(RolloutConfig, {"max_queries": 0})
    with pytest.raises(ConfigError, match="max_queries"):
        build_config(RolloutConfig, {"max_queries": 9})


# ---- the engine
def test_a_multi_query_turn_is_one_retriever_call_for_the_whole_batch(tiny):
    _, tok = tiny
    backend = Script(tok, ["<think> both </think>\n<search> Tarrow size ## Kelbaan size </search>",
                           "<answer> Kelbaan </answer>"])
    docs = Docs()
    engine = RolloutEngine(backend, tok, docs, RolloutConfig(max_turns=3, topk=2, max_queries=2,
                                                             batch_size=3))
    trajs = engine.run([QAExample(str(i), "Which is larger, Tarrow or Kelbaan?", ["Kelbaan"],
                                  {"gold_doc_ids": ["d-t", "d-k"]}) for i in range(3)])
    assert docs.calls == [["Tarrow size", "Kelbaan size"] * 3]   # one call, every sub-query
    for t in trajs:
        prompt = tok.decode(t.token_ids[:t.prompt_len])
        assert "separated by ##" in prompt
        s = t.steps[0]
        assert s.action == "search" and s.query == "Tarrow size ## Kelbaan size"
        assert s.sub_queries == ["Tarrow size", "Kelbaan size"]
        assert s.sub_hits == [["d-t", "d-o"], ["d-k", "d-o"]] and s.hits == ["d-t", "d-o", "d-k", "d-o"]
        assert s.gold_hit is True and t.evidence_recall() == 1.0 and t.n_searches == 1
        assert "Query 2: Kelbaan size\nDoc 3 (Title: Kelbaan)" in _block(tok, t, 0)
        assert t.valid_format and len(t.steps) == 2
        t.check()
        # the steps survive the JSONL round trip
        assert Trajectory.from_dict(json.loads(json.dumps(t.to_dict()))).steps[0] == s


def test_a_malformed_multi_query_turn_is_corrected_and_not_searched(tiny):
    _, tok = tiny
    backend = Script(tok, ["<search> a ## b ## c </search>", "<search> a ## </search>",
                           "<answer> x </answer>"])
    docs = Docs()
    engine = RolloutEngine(backend, tok, docs, RolloutConfig(max_turns=4, max_queries=2))
    (t,) = engine.run([QAExample("a", "q?", ["x"])])
    assert docs.calls == []
    assert [s.action for s in t.steps] == ["invalid", "invalid", "answer"]
    assert "3 sub-queries; at most 2" in _block(tok, t, 0)
    assert "empty sub-query" in _block(tok, t, 1)
    assert not t.valid_format


class PerQuestion(Backend):
    """Each episode its own first turn, picked by a word of its question; an answer once a
    block was shown."""

    def __init__(self, tok, first: dict[str, str]):
        self.tok, self.first = tok, first

    def generate(self, contexts, max_new_tokens, sampling, keys=None):
        out = []
        for c in contexts:
            text = self.tok.decode(c)
            turn = "<answer> x </answer>" if "</information>" in text.rsplit("assistant", 1)[-1] \
                else next(v for k, v in self.first.items() if k in text)
            out.append(self.tok.encode(turn, add_special_tokens=False))
        return out


def test_each_episodes_sub_queries_get_their_own_documents_from_the_one_call(tiny):
    """Different episodes ask different sub-queries in the same turn: the one batched call
    holds them all, in order, and each step gets back the hits of its own."""
    _, tok = tiny
    backend = PerQuestion(tok, {"Zeta": "<search> Tarrow a ## Other b </search>",
                                "Omega": "<search> Kelbaan c </search>"})
    docs = Docs()
    engine = RolloutEngine(backend, tok, docs, RolloutConfig(max_turns=3, topk=1, max_queries=2))
    first, second = engine.run([QAExample("z", "Which is larger, Zeta or Eta?", ["x"]),
                                QAExample("o", "Where is Omega?", ["x"])])
    assert docs.calls == [["Tarrow a", "Other b", "Kelbaan c"]]
    assert first.steps[0].sub_hits == [["d-t"], ["d-o"]] and first.steps[0].hits == ["d-t", "d-o"]
    assert second.steps[0].sub_queries == [] and second.steps[0].hits == ["d-k"]
    assert "Kelbaan" not in _block(tok, first, 0) and "Tarrow" not in _block(tok, second, 0)


@pytest.mark.parametrize("bad, said", [("a ## ## b", "empty sub-query"),
                                       ("a ## b ##", "empty sub-query"),
                                       ("a ## b ## c", "3 sub-queries; at most 2")])
def test_a_malformed_turn_beside_a_valid_one_is_corrected_and_only_the_valid_searched(
        tiny, bad, said):
    _, tok = tiny
    backend = PerQuestion(tok, {"Zeta": f"<search> {bad} </search>",
                                "Omega": "<search> Kelbaan c ## Tarrow d </search>"})
    docs = Docs()
    engine = RolloutEngine(backend, tok, docs, RolloutConfig(max_turns=3, topk=1, max_queries=2))
    broken, fine = engine.run([QAExample("z", "Which is larger, Zeta or Eta?", ["x"]),
                               QAExample("o", "Where is Omega?", ["x"])])
    assert docs.calls == [["Kelbaan c", "Tarrow d"]]
    s = broken.steps[0]
    assert s.action == "invalid" and s.query is None and s.hits == [] and broken.n_searches == 0
    assert said in _block(tok, broken, 0)
    assert fine.steps[0].action == "search" and fine.steps[0].sub_hits == [["d-k"], ["d-t"]]


def test_with_one_query_a_separator_is_just_text(tiny):
    _, tok = tiny
    backend = Script(tok, ["<search> Tarrow ## Kelbaan </search>", "<answer> x </answer>"])
    docs = Docs()
    engine = RolloutEngine(backend, tok, docs, RolloutConfig(max_turns=3))
    (t,) = engine.run([QAExample("a", "q?", ["x"])])
    assert docs.calls == [["Tarrow ## Kelbaan"]]
    assert t.steps[0].sub_queries == [] and "Query 1" not in _block(tok, t, 0)
    assert "separated by ##" not in tok.decode(t.token_ids[:t.prompt_len])


# ---- rewards
def _traj(steps, gold=("d-t", "d-k")):
    return Trajectory("q", "q", "q?", ["x"], [0] * 10, [0] * 10, 10, steps=steps,
                      gold_doc_ids=list(gold))


def _search(queries, hits):
    many = len(queries) > 1
    return Step(0, 0, "search", query=" ## ".join(queries),
                hits=[h for hs in hits for h in hs],
                sub_queries=list(queries) if many else [], sub_hits=hits if many else [])


def test_decomposition_rewards_sub_queries_that_find_distinct_new_gold():
    """The share of a turn's sub-queries that can each be given a gold document of its own
    (a maximum matching) among the gold not found before the turn."""
    ctx = ProcessContext()
    answer = Step(0, 0, "answer", answer="x")

    def score(*steps):
        return decomposition([_traj([*steps, answer])], ctx)[0][len(steps) - 1]

    assert score(_search(["t", "k"], [["d-t", "d-o"], ["d-k"]])) == 1.0
    # k's list holds d-t too: each sub-query still has a gold document of its own
    assert score(_search(["t", "k"], [["d-t"], ["d-t", "d-k"]])) == 1.0
    assert score(_search(["t", "t2"], [["d-t"], ["d-t"]])) == 0.5   # one gold, two asked
    assert score(_search(["t", "x"], [["d-t"], ["d-o"]])) == 0.5
    # a repeat of an earlier search finds nothing new: only k counts
    assert score(_search(["t"], [["d-t"]]), _search(["t", "k"], [["d-t"], ["d-k"]])) == 0.5
    rows = decomposition([_traj([_search(["t"], [["d-t"]]), answer])], ctx)
    assert rows == [[None, None]]                                    # one query: not judged
    assert decomposition([_traj([_search(["t", "k"], [["d-t"], ["d-k"]])], gold=())],
                         ctx) == [[None]]   # gold unknown


def test_decomposition_by_titles_when_only_supporting_titles_are_known():
    s = _search(["t", "k"], [["1", "2"], ["3"]])
    s.hit_titles = ["Tarrow", "Other", "Kelbaan"]
    t = _traj([s], gold=())
    t.metadata = {"supporting_titles": ["tarrow", "KELBAAN"]}
    assert decomposition([t], ProcessContext()) == [[1.0]]


def test_redundancy_judges_each_sub_query_against_everything_before_it():
    first = _search(["t"], [["d-t"]])
    repeat = _search(["T", "k"], [["d-t"], ["d-k", "d-t"]])   # T repeats; k half seen
    (row,) = redundancy([_traj([first, repeat])], ProcessContext())
    assert row == [0.0, (-1.0 + -0.5) / 2]


def test_turn_cost_counts_model_turns_not_sub_queries():
    answer = Step(0, 0, "answer", answer="x")
    together = _traj([_search(["t", "k"], [["d-t"], ["d-k"]]), answer])
    apart = _traj([_search(["t"], [["d-t"]]), _search(["k"], [["d-k"]]), answer])
    for t in (together, apart):
        t.answer, t.finish_reason = "x", "answer"
    assert episode_reward(together, turn_cost=0.05).total == pytest.approx(1.0 - 0.10)
    assert episode_reward(apart, turn_cost=0.05).total == pytest.approx(1.0 - 0.15)
    assert episode_reward(together).total == 1.0


def test_the_trainer_charges_reward_turn_cost(tmp_path, tiny):
    from seekrl.config import TrainConfig
    from seekrl.recipes.train import Trainer

    model, tok = tiny
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"id": "q", "question": "q?", "golden_answers": ["x"]}) + "\n")
    cfg = TrainConfig(data=str(data), out=str(tmp_path / "run"), rollout={"method": "direct"},
                      reward={"turn_cost": 0.05})
    trainer = Trainer(cfg, model=model, tokenizer=tok)
    apart = _traj([_search(["t"], [["d-t"]]), _search(["k"], [["d-k"]]),
                   Step(0, 0, "answer", answer="x")])
    apart.answer, apart.finish_reason = "x", "answer"
    assert trainer.reward_fn(apart).total == pytest.approx(episode_reward(apart).total - 0.15)


def test_the_step_records_count_turns_and_sub_queries(tmp_path, tiny):
    """What reward.turn_cost charges (model turns) and what the retriever was asked
    (queries) are in each step's record, beside the searches."""
    from seekrl.config import TrainConfig
    from seekrl.recipes.train import Trainer

    model, tok = tiny
    cfg = TrainConfig(data="(in memory)", out=str(tmp_path / "run"), questions_per_step=1,
                      group_size=2, save_every=0,
                      rollout={"max_turns": 3, "max_queries": 2, "topk": 2},
                      reward={"turn_cost": 0.05})
    trainer = Trainer(cfg, model=model, tokenizer=tok, retriever=Docs(),
                      questions=[QAExample("q", "Which is larger?", ["Kelbaan"])])
    script = Script(tok, ["<search> Tarrow size ## Kelbaan size </search>",
                          "<answer> Kelbaan </answer>"])
    trainer._generation_backend = lambda: script
    record = trainer.step(1)
    assert (record["searches"], record["turns"], record["queries"]) == (1.0, 2.0, 2.0)
    trainer.log.close()


def test_a_turn_cost_that_outweighs_the_outcome_is_warned_about():
    """From 1 / (max_turns - 1) a turn, a right answer after every turn scores no more
    than a wrong one given at once: the group's advantages would teach the policy not to
    search. Said when the config is checked; below the bound, nothing."""
    import warnings

    from seekrl.config import TrainConfig
    from seekrl.recipes.train import check_config

    def check(cost):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_config(TrainConfig(data="d", index="i", rollout={"max_turns": 4},
                                     reward={"turn_cost": cost}))
        return [str(w.message) for w in caught if "turn_cost" in str(w.message)]

    assert check(0.35) and "below 0.333 it does not" in check(0.35)[0]
    assert check(0.33) == [] and check(0.05) == [] and check(0.0) == []
    # past it: 1 + 0.1 - 4 x 0.35 = -0.3 < 0 + 0.1 - 0.35 = -0.25
    right = _traj([_search(["t"], [["d-t"]])] * 3 + [Step(0, 0, "answer", answer="x")])
    wrong = _traj([Step(0, 0, "answer", answer="y")])
    for t in (right, wrong):
        t.answer, t.finish_reason = t.steps[-1].answer, "answer"
    assert episode_reward(right, turn_cost=0.35).total < \
        episode_reward(wrong, turn_cost=0.35).total


# ---- the oracle
class WorldDocs:
    def __init__(self, miss=()):
        self.miss, self.calls = set(miss), []

    def search(self, queries, k):
        self.calls.append(list(queries))
        return [[Hit("x", "X", "x", 0.0) if q in self.miss else Hit(f"d-{q.split()[0]}", q, q, 1.0)]
                for q in queries]


def _hop(subject, answer, doc, query=None):
    return {"subject": subject, "relation": "size", "answer": answer, "doc_id": doc,
            "query": query or f"{subject} size", "fact": f"{subject}: {answer}."}


def test_oracle_waves_follow_what_each_lookup_needs():
    compare = [_hop("A", "1", "d-A"), _hop("B", "2", "d-B"), _hop("C", "3", "d-C")]
    assert _waves(_search_steps(compare)) == [[0, 1, 2]]
    bridge = [_hop("A", "B", "d-A"), _hop("B", "C", "d-B")]
    assert _waves(_search_steps(bridge)) == [[0], [1]]
    same = [_hop("A", "X", "d-A"), _hop("X", "Z", "d-X"), _hop("B", "Y", "d-B"),
            _hop("Y", "Z", "d-Y")]
    assert _waves(_search_steps(same)) == [[0, 2], [1, 3]]


def test_the_parallel_oracle_searches_independent_lookups_together_and_recovers():
    ex = QAExample("q1", "Which is larger, A, B or C?", ["C"],
                   {"chain": [_hop("A", "1", "d-A"), _hop("B", "2", "d-B"), _hop("C", "3", "d-C")],
                    "judgement": "A: 1; B: 2; C: 3"})
    docs = WorldDocs(miss={"B size"})
    ep = oracle_episode(ex, docs, k=1, max_queries=2)
    searches = [t["content"] for t in ep["turns"] if t["role"] == "assistant"][:-1]
    assert [s.split("<search>")[1].split("</search>")[0].strip() for s in searches] == [
        "A size ## B size", "B", "C size"]
    assert docs.calls == [["A size", "B size"], ["B"], ["C size"]]
    info = [t for t in ep["turns"] if t["role"] == "information"]
    assert info[0]["queries"] == ["A size", "B size"] and len(info[0]["hits"]) == 2
    assert "queries" not in info[1]   # one query: the usual turn
    assert ep["oracle_complete"] and ep["turns"][-1]["content"].endswith("<answer> C </answer>")
    # one query per turn: the sequential oracle, unchanged
    seq = oracle_episode(ex, WorldDocs(), k=1)
    assert sum(t["role"] == "information" for t in seq["turns"]) == 3


def _comparison() -> QAExample:
    return QAExample("q1", "Which is larger, Tarrow or Kelbaan?", ["Kelbaan"],
                     {"chain": [_hop("Tarrow", "40,000", "d-t"),
                                _hop("Kelbaan", "90,000", "d-k")], "judgement": "x"})


def test_sft_lays_out_a_multi_query_oracle_turn_as_the_engine_does(tiny):
    from seekrl.recipes.sft import episode_tokens

    _, tok = tiny
    ex = _comparison()
    ep = oracle_episode(ex, Docs(), k=2, max_queries=2)
    ids, mask = episode_tokens(tok, ep, max_queries=2)
    text = tok.decode(ids)
    assert "Query 1: Tarrow size\nDoc 1 (Title: Tarrow)" in text
    assert "Query 2: Kelbaan size\nDoc 3 (Title: Kelbaan)" in text
    bad = dict(ep, turns=[dict(t, hits=t["hits"][:1]) if t.get("queries") else t
                          for t in ep["turns"]])
    from seekrl.errors import DataError
    with pytest.raises(DataError, match="one list of documents per query"):
        episode_tokens(tok, bad, max_queries=2)
    # an oracle written for more sub-queries than the run allows is refused, naming the
    # turn: the policy would learn turns its rollouts refuse (or, at 1, search "a ## b")
    with pytest.raises(DataError, match=r"turns\[\d+\]\.queries.*2 sub-queries, but "
                                        r"max_queries is 1"):
        episode_tokens(tok, ep)
    # a multi-query search's documents as one flat `hits` list (a hand-made file) were laid
    # out without the query headings and per-query cut a rollout gives them
    flat = dict(ep, turns=[{k: v for k, v in t.items() if k != "queries"}
                           | {"hits": [h for hs in t["hits"] for h in hs]}
                           if t.get("queries") else t for t in ep["turns"]])
    with pytest.raises(DataError, match=r"turns\[\d+\]\.hits.*2 sub-queries needs an "
                                        r"information turn with `queries`"):
        episode_tokens(tok, flat, max_queries=2)


def test_the_information_budget_is_per_sub_query(tiny):
    _, tok = tiny
    backend = Script(tok, ["<search> Tarrow size ## Kelbaan size </search>", "<answer> x </answer>"])
    budget = 40
    one = RolloutEngine(Script(tok, backend.turns), tok, Docs(),
                        RolloutConfig(max_turns=3, topk=2, max_info_tokens=budget))
    two = RolloutEngine(backend, tok, Docs(), RolloutConfig(max_turns=3, topk=2, max_queries=2,
                                                            max_info_tokens=budget))
    (a,) = one.run([QAExample("a", "q?", ["x"])])
    (b,) = two.run([QAExample("a", "q?", ["x"])])
    size = lambda t: t.steps[0].info_end - t.steps[0].info_start   # noqa: E731
    assert size(a) == budget and budget < size(b) <= 2 * budget


LONG = {"tarrow": Hit("d-t", "Tarrow", "Tarrow has 40,000 people. " + "It lies by the sea. " * 20,
                      2.0),
        "kelbaan": Hit("d-k", "Kelbaan", "Kelbaan has 90,000 people. " + "Its hills are green. "
                       * 20, 2.0),
        "other": DOCS["other"]}


class LongDocs(Docs):
    """As `Docs`, with first documents far longer than a block's budget."""

    def search(self, queries, k):
        self.calls.append(list(queries))
        return [[LONG.get(q.split()[0].lower(), LONG["other"]), LONG["other"]][:k]
                for q in queries]


def test_a_cut_block_keeps_every_sub_query_and_credits_only_the_documents_it_shows(tiny):
    """A block over its budget is cut sub-query by sub-query: the first sub-query's long
    document no longer pushes the second sub-query out of the block unseen. A document
    cut away (its `Doc i` line gone) is not credited: not among the step's hits, the
    evidence, or the documents seen; the ones shown still are."""
    _, tok = tiny
    budget = 60
    engine = RolloutEngine(Script(tok, ["<search> Tarrow size ## Kelbaan size </search>",
                                        "<answer> Kelbaan </answer>"]), tok, LongDocs(),
                           RolloutConfig(max_turns=3, topk=2, max_queries=2,
                                         max_info_tokens=budget))
    (t,) = engine.run([QAExample("a", "Which is larger?", ["Kelbaan"],
                                 {"gold_doc_ids": ["d-t", "d-k", "d-o"]})])
    s = t.steps[0]
    block = _block(tok, t, 0)
    assert s.info_end - s.info_start <= 2 * budget
    assert "Query 1: Tarrow size\nDoc 1 (Title: Tarrow)" in block
    assert "Query 2: Kelbaan size\nDoc 3 (Title: Kelbaan)" in block   # its share kept
    assert "Doc 2 (Title: Other)" not in block and "Doc 4" not in block
    assert s.hits == ["d-t", "d-k"] and s.sub_hits == [["d-t"], ["d-k"]]
    assert t.evidence_recall() == pytest.approx(2 / 3)   # d-o was found, never shown
    # one query: the same rule (its second document cut away, not credited)
    one = RolloutEngine(Script(tok, ["<search> Tarrow size </search>", "<answer> x </answer>"]),
                        tok, LongDocs(), RolloutConfig(max_turns=3, topk=2,
                                                       max_info_tokens=budget))
    (u,) = one.run([QAExample("b", "q?", ["x"], {"gold_doc_ids": ["d-t", "d-o"]})])
    assert u.steps[0].hits == ["d-t"] and u.evidence_recall() == 0.5
    # a block that fits is laid out and credited whole, as before
    fits = RolloutEngine(Script(tok, ["<search> Tarrow size ## Kelbaan size </search>",
                                      "<answer> x </answer>"]), tok, Docs(),
                         RolloutConfig(max_turns=3, topk=2, max_queries=2))
    (w,) = fits.run([QAExample("c", "q?", ["x"])])
    assert w.steps[0].hits == ["d-t", "d-o", "d-k", "d-o"]


def test_sft_cuts_a_long_multi_query_block_as_the_engine_does(tiny):
    from seekrl.recipes.sft import episode_tokens

    _, tok = tiny
    ex = _comparison()
    ep = oracle_episode(ex, LongDocs(), k=2, max_queries=2)
    ids, _ = episode_tokens(tok, ep, max_info_tokens=60, max_queries=2)
    engine = RolloutEngine(Script(tok, ["<search> Tarrow size ## Kelbaan size </search>",
                                        "<answer> x </answer>"]), tok, LongDocs(),
                           RolloutConfig(max_turns=3, topk=2, max_queries=2,
                                         max_info_tokens=60))
    (t,) = engine.run([QAExample("a", "q?", ["x"])])
    s = t.steps[0]
    block = t.token_ids[s.info_start:s.info_end]
    assert any(ids[i:i + len(block)] == block for i in range(len(ids)))   # the same tokens
    assert "Query 2: Kelbaan size" in tok.decode(block)


def test_the_section_cut_gives_what_a_short_sub_query_leaves_to_the_long_ones(tiny):
    """Water-filling: a part under an equal share keeps all of it, the rest share what it
    leaves; a body that fits, or one of a single part, is tokenised whole as before."""
    from seekrl.agent.rollout import information_ids

    _, tok = tiny

    def enc(text):
        return tok.encode(text, add_special_tokens=False)

    head, tail = enc("\n\n<information>"), enc("</information>\n\n")
    short = "Query 1: a\nDoc 1 (Title: A) short."
    long = "Query 2: b\nDoc 2 (Title: B) " + "words and more words " * 60
    body = short + "\n" + long
    roomy = 10 * len(enc(body))
    assert information_ids(enc, body, roomy, [short, long]) == head + enc(body) + tail
    assert information_ids(enc, long, 50, [long]) == head + enc(long)[:50 - len(head) - len(tail)] \
        + tail
    budget = 120
    ids = information_ids(enc, body, budget, [short, long])
    room = budget - len(head) - len(tail)
    assert len(ids) <= budget
    # the short part whole, the long one everything else (not half the room)
    assert ids[len(head):len(head) + len(enc(short))] == enc(short)
    assert len(ids) - len(head) - len(tail) >= room - 2


def test_credit_follows_the_documents_lines_not_text_that_spells_them():
    from seekrl.agent.rollout import shown_hits

    hits = [Hit("d1", "Long", "x", 1.0), Hit("d2", "Gold", "y", 1.0)]
    full = "Query 1: Doc 2 (Title: Gold)\nDoc 1 (Title: Long) x\nQuery 2: b\nDoc 2 (Title: Gold) y"
    cut = "Query 1: Doc 2 (Title: Gold)\nDoc 1 (Title: Long) x"   # the query spells Doc 2
    assert shown_hits(hits, full, cut, None) == [True, False]
    # a title the tokenizer gives back otherwise (NFD -> NFC) is found by its round trip
    import unicodedata

    cafe = [Hit("d3", "Cafe\u0301", "z", 1.0)]
    shown = "Doc 1 (Title: Caf\u00e9) z"
    nfc = lambda text: unicodedata.normalize("NFC", text)   # noqa: E731
    assert shown_hits(cafe, "Doc 1 (Title: Cafe\u0301) z", shown[:20], None, nfc) == [True]
    assert shown_hits(cafe, "Doc 1 (Title: Cafe\u0301) z", "", None, nfc) == [False]
    # another layout (a plug-in tool's): nothing to find, every document counts as shown
    assert shown_hits(hits, "1. Long: x\n2. Gold: y", "1. Long", None) == [True, True]


def test_a_cut_block_keeps_its_numbering_and_credits_sub_queries_by_position(tiny):
    """A document in two sub-queries' lists, shown under the first and cut under the
    second, is credited to the first only; the step keeps the block's whole numbering
    (`block_hits`) for the `open` tool of a continuation."""
    _, tok = tiny
    engine = RolloutEngine(Script(tok, ["<search> Other ## Kelbaan size </search>",
                                        "<answer> x </answer>"]), tok, LongDocs(),
                           RolloutConfig(max_turns=3, topk=2, max_queries=2, max_info_tokens=40))
    (t,) = engine.run([QAExample("a", "q?", ["x"], {"gold_doc_ids": ["d-k", "d-o"]})])
    s = t.steps[0]
    assert s.block_hits == ["d-o", "d-o", "d-k", "d-o"]
    assert s.sub_hits[0] == ["d-o", "d-o"] and "d-o" not in s.sub_hits[1]
    assert s.hits == [h for hs in s.sub_hits for h in hs]
    assert Trajectory.from_dict(json.loads(json.dumps(t.to_dict()))).steps[0] == s
