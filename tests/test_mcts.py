"""Step labelling: the MCTS rules against hand-computed backups, the batched search with a
scripted stochastic policy (budget, invariants, determinism), MC labels, and the resumable,
atomic output folder."""

from __future__ import annotations

import json

import pytest
import torch

from seekrl.agent.backends import Backend
from seekrl.agent.rollout import RolloutConfig, RolloutEngine
from seekrl.agent.trajectory import Step, Trajectory
from seekrl.config import LabelConfig
from seekrl.data.qa import QAExample
from seekrl.recipes.labels import LabelWriter
from seekrl.recipes.mcts import (
    PairRules,
    Tree,
    grow_search_trees,
    mc_labels,
    run_labelling,
    step_key,
    tree_labels,
)
from tests.test_rollout import Docs


def episode(actions: list[tuple[str, str]], qid: str = "q") -> Trajectory:
    """A hand-made episode: ("search", query) / ("answer", text) steps (or another tool's
    ("open", argument)), 3 tokens each, an environment block of 2 tokens after every step
    but an answer."""
    ids, mask, steps = [0, 0], [0, 0], []
    answer = None
    for kind, text in actions:
        start = len(ids)
        ids += [1, 1, 1]
        mask += [1, 1, 1]
        step = Step(start, len(ids), kind, text=f"<{kind}> {text} </{kind}>")
        if kind != "answer":
            step.query = text
            step.info_start = len(ids)
            ids += [2, 2]
            mask += [0, 0]
            step.info_end = len(ids)
        else:
            step.answer = answer = text
        steps.append(step)
    return Trajectory(qid, qid, "question?", ["x"], ids, mask, 2, steps, answer=answer,
                      finish_reason="answer" if answer is not None else "max_turns")


def score(t: Trajectory) -> float:
    return 1.0 if t.answer == "x" else 0.0


def test_expansion_backup_and_puct_by_hand():
    tree = Tree(QAExample("q", "question?", ["x"]), episode([]), c_puct=1.0, gamma=0.5)
    root = tree.nodes[0]
    conts = [episode([("search", "a"), ("answer", "x")]),     # reward 1 after 2 steps
             episode([("search", "A "), ("answer", "y")]),    # same query (case, spaces): 0
             episode([("search", "b"), ("answer", "x")]),     # 1
             episode([("answer", "z")])]                      # terminal at once: 0
    tree.expand(root, conts, score)
    a, b, z = (tree.nodes[i] for i in root.children)
    assert [n.key for n in (a, b, z)] == ["search:a", "search:b", "answer:z"]
    # backups: a node at depth j of an episode of L steps gets reward * gamma ** (L - j)
    assert (a.visits, a.value_sum) == (2, 0.5) and a.q == 0.25
    assert (b.visits, b.value_sum) == (1, 0.5)
    assert (z.visits, z.value_sum, z.terminal, z.reward) == (1, 0.0, True, 0.0)
    assert (root.visits, root.value_sum) == (4, 0.5)
    # PUCT, uniform prior 1/3, sqrt(N_root) = 2: a 0.25 + 2/9, b 0.5 + 1/3, z 0 + 1/3
    assert tree.puct(root, a) == pytest.approx(0.25 + 2 / 9)
    assert tree.puct(root, b) == pytest.approx(0.5 + 1 / 3)
    assert tree.select() is b
    # b is expanded from its own episode's prefix; the terminal z backs up without tokens
    tree.expand(b, [episode([("search", "b"), ("search", "c"), ("answer", "x")])], score)
    (c,) = (tree.nodes[i] for i in b.children)
    assert c.depth == 2 and c.visits == 1 and c.value_sum == 0.5
    assert b.visits == 2 and b.value_sum == pytest.approx(0.5 + 0.25)
    assert root.visits == 5 and root.value_sum == pytest.approx(0.5 + 0.125)
    tree.backup(z, 0.0, z.depth)
    assert z.visits == 2 and root.visits == 6
    assert [n.id for n in tree.path(c)] == [b.id, c.id]


def test_a_tool_call_is_its_own_child_not_an_invalid_turn():
    """Opening document 1 and document 7 are two actions: they were one child keyed
    'invalid:' (with an invalid turn of no reason), Q averaged over both."""
    tree = Tree(QAExample("q", "question?", ["x"]), episode([]), c_puct=1.0, gamma=0.5)
    root = tree.nodes[0]
    tree.expand(root, [episode([("open", "1"), ("answer", "x")]),
                       episode([("open", " 1"), ("answer", "y")]),
                       episode([("open", "7"), ("answer", "y")])], score)
    one, seven = (tree.nodes[i] for i in root.children)
    assert (one.key, seven.key) == ("open:1", "open:7")
    assert (one.visits, one.value_sum, seven.visits, seven.value_sum) == (2, 0.5, 1, 0.0)
    invalid = Step(0, 1, "invalid", reason="")
    assert step_key(invalid) == "invalid:" != step_key(Step(0, 1, "open", query=""))


def test_tree_labels_pairs_follow_the_rules():
    tree = Tree(QAExample("q", "question?", ["x"]), episode([]), gamma=1.0)
    root = tree.nodes[0]
    tree.expand(root, [episode([("search", "a"), ("answer", "x")]),
                       episode([("search", "a"), ("answer", "x")]),
                       episode([("search", "b"), ("answer", "y")]),
                       episode([("search", "b"), ("answer", "y")]),
                       episode([("answer", "z")])], score)
    labels = tree_labels([tree], PairRules(min_visits=2, min_gap=0.5))
    # a (Q 1, N 2) vs b (Q 0, N 2) is a pair; z has one visit
    assert len(labels.pairs) == 1
    pair = labels.pairs[0]
    assert pair["q_better"] == 1.0 and pair["q_worse"] == 0.0 and pair["depth"] == 0
    assert pair["better"]["steps"][0]["query"] == "a" and pair["worse"]["steps"][0]["query"] == "b"
    assert pair["better"]["steps"][0]["value"] == 1.0 and pair["better"]["steps"][1]["value"] is None
    assert labels.rejected == {"few_visits": 2}
    assert len(labels.nodes) == 4 and labels.nodes[0]["N"] == 5
    assert [n["path"] for n in labels.nodes] == [[], ["search:a"], ["search:b"], ["answer:z"]]
    # one labelled episode per leaf, its path labelled with the nodes' Q and N
    assert len(labels.labels) == 3
    first = Trajectory.from_dict(labels.labels[0])
    assert first.steps[0].value == 1.0 and first.metadata["visits"][0] == 2
    # a better step that repeats an earlier query is refused
    tree2 = Tree(QAExample("q", "question?", ["x"]), episode([]), gamma=1.0)
    tree2.expand(tree2.nodes[0], [episode([("search", "a"), ("search", "a"), ("answer", "x")])] * 2
                 + [episode([("search", "a"), ("search", "c"), ("answer", "y")])] * 2, score)
    a2 = tree2.nodes[tree2.nodes[0].children[0]]
    tree2.expand(a2, [episode([("search", "a"), ("search", "a"), ("answer", "x")])] * 2
                 + [episode([("search", "a"), ("search", "c"), ("answer", "y")])] * 2, score)
    assert tree_labels([tree2], PairRules(min_visits=2, min_gap=0.5)).rejected == \
        {"better_repeats_query": 1}


def test_pairs_are_judged_on_the_gap_as_written():
    """Two siblings whose Q values differ by float noise (the same rewards backed up in
    another order) paired with a written gap of 0.0, which the label reader refuses (the
    whole folder failed to read); a gap of exactly min_gap was lost to 0.7 - 0.2 =
    0.49999999999999994."""
    from seekrl.recipes.mcts import _gap_pairs

    assert 0.735087375 > 0.7350873749999999
    assert not _gap_pairs(0.735087375, 0.7350873749999999, 0.0)
    assert _gap_pairs(0.7, 0.2, 0.5) and not _gap_pairs(0.7, 0.21, 0.5)
    assert not _gap_pairs(0.2, 0.7, 0.0)


class Dice(Backend):
    """A scripted stochastic policy: each turn one of a few scripted replies, drawn with
    torch's generator (so the engine's seed fixes the draws)."""

    def __init__(self, tokenizer, options: list[list[str]]):
        self.tok, self.options = tokenizer, options

    def generate(self, contexts, max_new_tokens, sampling, keys=None):
        out = []
        for ctx in contexts:
            turn = self.tok.decode(ctx).split("Question:")[-1].count("<information>")
            opts = self.options[min(turn, len(self.options) - 1)]
            pick = opts[int(torch.randint(len(opts), (1,)))]
            out.append(self.tok.encode(pick, add_special_tokens=False)[:max_new_tokens])
        return out


OPTIONS = [["<search> Ilsa Marrow born </search>", "<search> Noise </search>",
            "<answer> Tarrow </answer>", "<answer> Paris </answer>"],
           ["<answer> Tarrow </answer>", "<answer> Paris </answer>",
            "<search> Velmaria </search>"],
           ["<answer> Tarrow </answer>", "<answer> Velmaria </answer>"]]


def questions(n: int) -> list[QAExample]:
    return [QAExample(f"q{i}", f"Where was person {i} born?", ["Tarrow"],
                      {"gold_doc_ids": ["d-ilsa"]}) for i in range(n)]


def dice_engine(tok, seed: int = 0) -> RolloutEngine:
    return RolloutEngine(Dice(tok, OPTIONS), tok, Docs(), RolloutConfig(max_turns=3, seed=seed))


def f1ish(t: Trajectory) -> float:
    return 1.0 if t.answer == "Tarrow" else 0.0


def test_batched_search_budget_invariants_and_determinism(tiny):
    _, tok = tiny
    trees, stats = grow_search_trees(dice_engine(tok), questions(3), f1ish, simulations=10,
                                     expansions=4, seed=1)
    assert stats.simulations == 30 and stats.rollouts <= 30 and stats.generated_tokens > 0
    for tree in trees:
        root = tree.nodes[0]
        assert tree.simulations == 10 and root.visits == 10     # every simulation reaches it
        for node in tree.nodes:
            if node.expanded and not node.terminal:
                below = sum(tree.nodes[c].visits for c in node.children)
                # every visit after the rollouts that created the node went on to a child
                assert node.visits == below if node is root else \
                    1 <= node.visits - below <= 4
            assert 0.0 <= node.q <= 1.0
            keys = [tree.nodes[c].key for c in node.children]
            assert len(keys) == len(set(keys))                  # de-duplicated siblings
            for c in node.children:
                child = tree.nodes[c]
                assert child.depth == node.depth + 1
                # the child's episode starts with its parent's path
                assert [step_key(s) for s in child.traj.steps[:node.depth]] == \
                    [step_key(s) for s in node.traj.steps[:node.depth]]
        assert max(n.depth for n in tree.nodes) >= 2             # the search went deeper
    # all expansions of a round go to the engine in one call: rounds < expansions made
    assert stats.rounds < sum(sum(n.expanded for n in t.nodes) for t in trees)
    again, _ = grow_search_trees(dice_engine(tok), questions(3), f1ish, simulations=10,
                                 expansions=4, seed=1)
    assert [[(n.key, n.visits, n.value_sum) for n in t.nodes] for t in trees] == \
        [[(n.key, n.visits, n.value_sum) for n in t.nodes] for t in again]


def test_mc_labels_same_format(tiny):
    _, tok = tiny
    labels, stats = mc_labels(dice_engine(tok), questions(2), f1ish, samples=4, mc_samples=3,
                              rules=PairRules(min_visits=1, min_gap=0.3), seed=0)
    assert len(labels.labels) == 8 and stats.generated_tokens > 0
    for record in labels.labels:
        t = Trajectory.from_dict(record)
        assert t.metadata["label"] == "mc"
        assert t.steps[-1].value == f1ish(t)                       # the last step: own reward
        assert all(s.value is not None and 0 <= s.value <= 1 for s in t.steps)
    assert labels.pairs
    for pair in labels.pairs:
        assert pair["depth"] == 0 and pair["gap"] >= 0.3
        assert pair["better"]["steps"][0]["value"] - pair["worse"]["steps"][0]["value"] >= 0.3
    # nodes in the MCTS format: episodes doing the same thing share a node whose Q is the
    # sample-weighted mean of their estimates, and each labelled step points at its node
    nodes = {(n["example_id"], n["node"]): n for n in labels.nodes}
    assert {n["depth"] for n in labels.nodes} >= {0, 1, 2}
    per_node: dict = {}
    for record in labels.labels:
        t = Trajectory.from_dict(record)
        for k, (s, nid) in enumerate(zip(t.steps, t.metadata["node_ids"])):
            node = nodes[(t.example_id, nid)]
            assert node["depth"] == k + 1 and node["Q"] == s.value
            assert node["path"][-1] == step_key(s)
            per_node.setdefault((t.example_id, nid), []).append(t)
        assert t.metadata["visits"] == [nodes[(t.example_id, i)]["N"]
                                        for i in t.metadata["node_ids"]]
    shared = [k for k, ts in per_node.items() if len(ts) > 1]
    assert shared, "the seed gives episodes that share a first step"
    for key in shared:
        assert nodes[key]["N"] >= 2
    for n in labels.nodes:
        if n["parent"] is not None:
            assert n["node"] in nodes[(n["example_id"], n["parent"])]["children"]


def test_run_labelling_resumes_and_drops_a_half_written_chunk(tiny, tmp_path):
    model, tok = tiny
    kw = dict(model=model, tokenizer=tok, retriever=Docs(), questions=questions(3))

    def cfg(out, n):
        return LabelConfig(data="unused", out=str(out), questions=n,
                           search={"simulations": 4, "expansions": 2, "trees_per_batch": 1},
                           rollout={"max_turns": 2, "max_new_tokens": 6, "temperature": 0.9})

    full = run_labelling(cfg(tmp_path / "full", 3), **kw)
    assert full["questions"] == 3 and full["simulations"] == 12 and full["simulations_per_s"] > 0
    run_labelling(cfg(tmp_path / "part", 2), **kw)
    # a killed run left half a chunk behind: it is cut off on resume
    with open(tmp_path / "part" / "labels.jsonl", "a") as f:
        f.write('{"half": ')
    with pytest.raises(FileExistsError, match="resume"):
        run_labelling(cfg(tmp_path / "part", 3), **kw)
    resumed = run_labelling(cfg(tmp_path / "part", 3), resume=True, **kw)
    assert resumed["questions"] == 3
    for name in ("nodes.jsonl", "labels.jsonl", "pairs.jsonl"):
        assert (tmp_path / "part" / name).read_text() == (tmp_path / "full" / name).read_text()
    with pytest.raises(ValueError, match="differ: search.simulations"):
        LabelWriter(tmp_path / "part", resume=True,
                    settings={**json.loads((tmp_path / "part" / "progress.json").read_text())
                              ["settings"], "search.simulations": 99})
    # a label file shorter than recorded is refused, never padded (nodes.jsonl always has
    # lines: every tree has a root)
    assert json.loads((tmp_path / "part" / "progress.json").read_text())["bytes"]["nodes.jsonl"]
    (tmp_path / "part" / "nodes.jsonl").write_text("")
    with pytest.raises(ValueError, match="were recorded"):
        run_labelling(cfg(tmp_path / "part", 3), resume=True, **kw)
    # a missing one too: truncate() would have made it that many zero bytes
    (tmp_path / "part" / "nodes.jsonl").unlink()
    with pytest.raises(ValueError, match="missing file, but .* bytes were recorded"):
        run_labelling(cfg(tmp_path / "part", 3), resume=True, **kw)
    assert not (tmp_path / "part" / "nodes.jsonl").exists()


def _mc_folder(tok, out) -> None:
    """Monte-Carlo labels of three questions into `out` (pairs included)."""
    run_labelling(LabelConfig(data="unused", out=str(out),
                              search={"method": "mc", "samples": 4, "mc_samples": 2,
                                      "min_visits": 1, "min_gap": 0.3},
                              rollout={"max_turns": 3}),
                  backend=Dice(tok, OPTIONS), tokenizer=tok, retriever=Docs(),
                  questions=questions(3))


def test_a_label_folder_changed_since_is_refused_by_the_reader(tiny, tmp_path):
    """A recorded label file that is gone (its labels would vanish unsaid) and a progress
    file that is not one are DataErrors naming the file."""
    from seekrl.errors import DataError
    from seekrl.recipes.labels import read_labels

    _, tok = tiny
    _mc_folder(tok, tmp_path / "mc")
    folder = tmp_path / "mc"
    assert read_labels([folder]).pairs
    pairs = (folder / "pairs.jsonl").read_bytes()
    (folder / "pairs.jsonl").unlink()
    with pytest.raises(DataError, match="pairs.jsonl: missing, but .* bytes were recorded"):
        read_labels([folder])
    (folder / "pairs.jsonl").write_bytes(pairs)
    progress = (folder / "progress.json").read_text()
    (folder / "progress.json").write_text(progress[: len(progress) // 2])
    with pytest.raises(DataError, match="progress.json.*not JSON"):
        read_labels([folder])
    with pytest.raises(DataError, match="progress.json.*not JSON"):
        LabelWriter(folder, resume=True)


def test_labelling_stops_at_a_token_budget_for_either_method(tiny, tmp_path):
    """MC and MCTS labels compared at equal generated tokens: the run stops within half a
    question's tokens of `search.max_tokens`, and says so."""
    _, tok = tiny
    kw = dict(backend=Dice(tok, OPTIONS), tokenizer=tok, retriever=Docs(),
              questions=questions(8))
    search = {"method": "mc", "samples": 2, "mc_samples": 2, "trees_per_batch": 2}
    full = run_labelling(LabelConfig(data="unused", out=str(tmp_path / "full"), search=search,
                                     rollout={"max_turns": 3}), **kw)
    per_question = full["generated_tokens"] / 8
    budget = int(full["generated_tokens"] * 0.45)
    for method, extra in (("mc", {}), ("mcts", {"simulations": 4, "expansions": 2})):
        out = run_labelling(LabelConfig(
            data="unused", out=str(tmp_path / method), rollout={"max_turns": 3},
            search={**search, "method": method, **extra, "max_tokens": budget}), **kw)
        assert 0 < out["questions"] < 8 and "token budget" in out["budget"]
        # stopped stays stopped on resume: no question more, the budget still named
        again = run_labelling(LabelConfig(
            data="unused", out=str(tmp_path / method), rollout={"max_turns": 3},
            search={**search, "method": method, **extra, "max_tokens": budget}),
            resume=True, **kw)
        assert again["questions"] == out["questions"] and again["budget"] == out["budget"]
        if method == "mc":   # the same episodes as the full run, so the same rate
            assert abs(out["generated_tokens"] - budget) <= per_question / 2 + 1
    assert full["budget"] is None


def test_mc_labelling_folder_reads_like_mcts_labels(tiny, tmp_path):
    """`seekrl mcts search.method=mc` writes the same three files; a step shared by several
    episodes is one labelled point, as an MCTS node on several paths is."""
    from seekrl.recipes.labels import read_labels

    _, tok = tiny
    _mc_folder(tok, tmp_path / "mc")
    nodes = [json.loads(x) for x in (tmp_path / "mc" / "nodes.jsonl").read_text().splitlines()]
    labels = read_labels([tmp_path / "mc"])
    assert len(labels.episodes) == 12
    assert len(labels.points) == sum(1 for n in nodes if n["parent"] is not None)
    assert len(labels.points) < sum(len(t.steps) for t in labels.episodes)
