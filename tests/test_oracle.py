"""Oracle trajectories: the ideal episode, searched against the real index."""

from __future__ import annotations

import json
import re

import pytest
from conftest import build_world_and_index
from hypothesis import given
from hypothesis import strategies as st

from seekrl.agent.oracle import oracle_episode, write_oracle_trajectories
from seekrl.data.qa import QAExample
from seekrl.retrieval.base import Hit
from seekrl.retrieval.index import load_index


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    world, _, index_dir = build_world_and_index(
        tmp_path_factory.mktemp("world"), seed=5, difficulty="medium", entities=300,
        n_train=120, n_dev=20, n_test=20)
    return world, load_index(index_dir)


def test_episode_shape_and_answer(setup):
    world, index = setup
    for ex in world.splits["train"][:60]:
        ep = oracle_episode(ex, index, k=3)
        turns = ep["turns"]
        roles = [t["role"] for t in turns]
        # assistant / information alternate, and the assistant has the last word
        assert roles[::2] == ["assistant"] * len(roles[::2])
        assert roles[1::2] == ["information"] * len(roles[1::2])
        assert roles[-1] == "assistant"
        for t in turns[:-1:2]:
            assert re.fullmatch(r"<think> .+ </think>\n<search> .+ </search>", t["content"],
                                re.S), t["content"]
        for t in turns[1::2]:
            assert t["content"].startswith("<information>Doc 1 (Title: ")
            assert t["content"].endswith("</information>")
        final = turns[-1]["content"]
        assert final.endswith(f"<answer> {ex.golden_answers[0]} </answer>")
        # at least one search per distinct gold document
        assert len(turns) // 2 >= len(set(ex.metadata["gold_doc_ids"]))


def test_oracle_finds_the_gold_documents_and_never_leaks_the_answer(setup):
    world, index = setup
    episodes = [oracle_episode(ex, index, k=3) for ex in world.splits["train"]]
    complete = sum(ep["oracle_complete"] for ep in episodes) / len(episodes)
    assert complete > 0.9
    for ep in episodes:
        if ep["metadata"]["type"] != "bridge":
            continue
        answer = ep["golden_answers"][0]
        queries = [re.search(r"<search> (.+) </search>", t["content"]).group(1)
                   for t in ep["turns"] if t["role"] == "assistant" and "<search>" in t["content"]]
        assert all(answer not in q for q in queries), (ep["question"], queries)


def test_a_missed_search_is_reformulated():
    """A retriever that misses on the expert query: the oracle keeps the miss and retries."""
    gold = Hit("d1", "Ilsa Marrow", "Ilsa Marrow was born in Tarrow.", 1.0)
    other = Hit("d2", "Ilsa Merrow", "Ilsa Merrow was a painter.", 1.0)

    class Picky:
        def search(self, queries, k):
            return [[gold] if q == "Ilsa Marrow" else [other] for q in queries]

    ex = QAExample("q", "Where was Ilsa Marrow born?", ["Tarrow"], {"type": "single", "chain": [{
        "subject": "Ilsa Marrow", "relation": "born_in", "answer": "Tarrow", "doc_id": "d1",
        "stated_in": "subject", "query": "Ilsa Marrow born", "need": "the city where she was born",
        "fact": "Ilsa Marrow was born in Tarrow."}]})
    ep = oracle_episode(ex, Picky())
    searches = [t["content"] for t in ep["turns"] if "<search>" in t["content"]]
    assert searches[0].endswith("<search> Ilsa Marrow born </search>")
    assert searches[1].endswith("<search> Ilsa Marrow </search>")
    assert ep["oracle_complete"]


def test_a_question_without_a_chain_is_refused_naming_it_and_where_chains_are_written():
    with pytest.raises(ValueError, match=r"question q1: metadata has no 'chain'.*docs/own-data"):
        oracle_episode(QAExample("q1", "Who?", ["x"], {}), None)
    # a hand-written hop without what the oracle writes from is named, not a KeyError
    hop = {"subject": "A", "doc_id": "d1", "query": "A born", "need": "n", "answer": "B"}
    with pytest.raises(ValueError, match=r"question q2: metadata.chain\[0\]: missing fact "):
        oracle_episode(QAExample("q2", "Who?", ["x"], {"chain": [hop]}), None)
    hop = {**hop, "fact": "A was born in B."}
    del hop["need"]
    with pytest.raises(ValueError, match=r"chain\[0\]: missing need \(or relation\)"):
        oracle_episode(QAExample("q3", "Who?", ["x"], {"chain": [hop]}), None)
    with pytest.raises(ValueError, match=r"chain\[0\]: expected an object"):
        oracle_episode(QAExample("q4", "Who?", ["x"], {"chain": ["A born"]}), None)


def test_write_oracle_trajectories(tmp_path, setup):
    world, index = setup
    stats = write_oracle_trajectories(world.splits["dev"], index, tmp_path / "o.jsonl")
    lines = (tmp_path / "o.jsonl").read_text().splitlines()
    assert len(lines) == stats.questions == 20
    assert json.loads(lines[0])["id"] == world.splits["dev"][0].id
    assert "20 oracle trajectories" in stats.summary()


@pytest.mark.parametrize("max_queries", [1, 3])
def test_the_plan_without_a_count_changes_only_the_first_thought(setup, max_queries):
    """`plan="none"` drops "To answer this I need N lookups." from the first turn and
    nothing else: the same searches, documents, later thoughts and answer."""
    world, index = setup
    for ex in world.splits["train"][:40]:
        counted = oracle_episode(ex, index, k=3, max_queries=max_queries)
        bare = oracle_episode(ex, index, k=3, max_queries=max_queries, plan="none")
        first = counted["turns"][0]["content"]
        n = re.match(r"<think> To answer this I need (\d) lookups?\. ", first)
        assert n and 1 <= int(n.group(1)) <= len(ex.metadata["chain"]), first
        assert bare["turns"][0]["content"] == "<think> " + first[n.end():]
        assert "lookup" not in bare["turns"][0]["content"]
        assert bare["turns"][1:] == counted["turns"][1:]
        assert {k: v for k, v in bare.items() if k != "turns"} == \
            {k: v for k, v in counted.items() if k != "turns"}


@pytest.mark.parametrize("key,bad,choices", [("plan", "steps", "count, none"),
                                             ("judge", "sorted", "values, ordered")])
def test_an_unknown_plan_or_judge_is_refused_by_name(setup, tmp_path, key, bad, choices):
    world, index = setup
    with pytest.raises(ValueError, match=rf"{key}: expected one of {choices}, got '{bad}'"):
        oracle_episode(world.splits["train"][0], index, **{key: bad})
    with pytest.raises(ValueError, match=f"{key}: expected"):
        write_oracle_trajectories(world.splits["dev"], index, tmp_path / "o.jsonl", **{key: ""})
    assert not (tmp_path / "o.jsonl").exists()


def test_a_comparison_answer_reads_the_document_then_compares(setup):
    """Every turn after a document opens with what it says; a comparison's answer turn then
    gives the judgement (the values side by side) before the answer. An answer turn that
    opened at the judgement taught the policy to answer comparisons like bridges."""
    world, index = setup
    comparisons = [ex for ex in world.splits["train"]
                   if ex.metadata.get("type") == "comparison"][:10]
    assert comparisons
    for ex in comparisons:
        for max_queries in (1, 3):
            final = oracle_episode(ex, index, k=3, max_queries=max_queries)["turns"][-1]
            think = final["content"].split("</think>")[0]
            assert think.startswith(("<think> The document says: ",
                                     "<think> The documents say: ")), think
            assert think.endswith(f" Comparing: {ex.metadata['judgement']}. So the answer "
                                  f"is {ex.golden_answers[0]}. "), think


def test_an_ordered_judgement_writes_the_comparison_out_and_changes_nothing_else(setup):
    """`judge="ordered"` adds the decision after the values: numbers in order and the end
    the question wants (whose value is the answer's), or whether a "same" question's two
    values are the same (yes) or different (no). Every other turn, and every question that
    compares nothing, stays as it was."""
    world, index = setup
    seen = {"compare": 0, "same": 0}
    for ex in world.splits["train"]:
        for max_queries in (1, 3):
            plain = oracle_episode(ex, index, k=3, max_queries=max_queries)
            ordered = oracle_episode(ex, index, k=3, max_queries=max_queries, judge="ordered")
            assert ordered["turns"][:-1] == plain["turns"][:-1]
            judgement = ex.metadata.get("judgement")
            if not judgement:
                assert ordered == plain
                continue
            base = f" Comparing: {judgement}. "
            head, _, tail = ordered["turns"][-1]["content"].partition(base)
            assert plain["turns"][-1]["content"].startswith(head + base), tail
            decision, _, rest = tail.partition(" So the answer is ")
            answer = ex.golden_answers[0]
            assert rest.startswith(f"{answer}. </think>")
            values = [part.rpartition(": ")[2] for part in judgement.split("; ")]
            if answer in ("yes", "no"):
                seen["same"] += 1
                assert decision == (f"{values[0]} and {values[1]} are "
                                    f"{'the same' if answer == 'yes' else 'different'}.")
                assert (values[0] == values[1]) == (answer == "yes")
                continue
            seen["compare"] += 1
            m = re.fullmatch(r"From smallest to largest: (.+)\. The question wants the "
                             r"(smallest|largest), (.+): (.+)\.", decision)
            assert m, decision
            ordered_values = m.group(1).split(" < ")
            numbers = [int(v.replace(",", "")) for v in ordered_values]
            assert sorted(ordered_values) == sorted(values) and numbers == sorted(numbers)
            assert m.group(3) == (ordered_values[0] if m.group(2) == "smallest"
                                  else ordered_values[-1])
            assert m.group(4) == answer
            names = [part.rpartition(": ")[0] for part in judgement.split("; ")]
            assert values[names.index(answer)] == m.group(3)
    assert seen["compare"] and seen["same"], seen


@given(st.lists(st.integers(1, 10**7), min_size=2, max_size=3, unique=True), st.booleans(),
       st.booleans())
def test_the_ordered_decision_names_the_winner_of_any_values(numbers, larger, commas):
    """For any distinct values (with or without thousands separators), the decision lists
    them in order and wants the end whose value the answer has."""
    from seekrl.agent.oracle import _decision

    names = [f"Entity {'ABC'[i]}" for i in range(len(numbers))]
    shown = [f"{n:,}" if commas else str(n) for n in numbers]
    winner = names[numbers.index(max(numbers) if larger else min(numbers))]
    ex = QAExample(id="q", question="?", golden_answers=[winner], metadata={})
    text = _decision(ex, "; ".join(f"{a}: {v}" for a, v in zip(names, shown)))
    order = sorted(range(len(numbers)), key=numbers.__getitem__)
    end = "largest" if larger else "smallest"
    assert text == (f"From smallest to largest: {' < '.join(shown[i] for i in order)}. "
                    f"The question wants the {end}, {shown[names.index(winner)]}: {winner}.")


def test_a_judgement_the_ordered_decision_cannot_read_is_refused_naming_the_question():
    from seekrl.agent.oracle import _decision

    ex = QAExample(id="q7", question="?", golden_answers=["C"], metadata={})
    with pytest.raises(ValueError, match=r"question q7: answer 'C' is none of"):
        _decision(ex, "A: 1900; B: 1950")
    with pytest.raises(ValueError, match=r"question q7: judgement 'A 1900; B 1950': expected"):
        _decision(ex, "A 1900; B 1950")
    with pytest.raises(ValueError, match=r"question q7: .*expected numbers"):
        _decision(ex, "A: old; C: new")
