"""Tools beyond <search>: the built-in `open`, snippets, your own tool by import path, and
how the engine batches, credits and formats their calls."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seekrl.agent.backends import Backend
from seekrl.agent.protocol import parse_action
from seekrl.agent.rollout import RolloutConfig, RolloutEngine
from seekrl.agent.tools import ToolResult, check_tool, resolve_document
from seekrl.config import ConfigError, TrainConfig, build_config
from seekrl.data.qa import QAExample
from seekrl.models import tiny_policy
from seekrl.retrieval.base import Hit

LONG = "Ilsa Marrow was born in Tarrow in 1950 and later moved to the coast where she wrote."
DOCS = [Hit("d-t", "Tarrow", "Tarrow is a city in Velmaria.", 2.0),
        Hit("d-i", "Ilsa Marrow", LONG, 1.0)]


@pytest.fixture(scope="module")
def tiny():
    return tiny_policy(seed=0)


class Docs:
    def __init__(self):
        self.calls = 0

    def search(self, queries, k):
        self.calls += 1
        return [DOCS[:k] for _ in queries]


class Script(Backend):
    """Every episode plays the same turns, one per call."""

    def __init__(self, tok, turns):
        self.tok, self.turns, self.calls, self.contexts = tok, turns, 0, []

    def generate(self, contexts, max_new_tokens, sampling, keys=None):
        self.contexts.append([self.tok.decode(c) for c in contexts])
        turn = self.turns[min(self.calls, len(self.turns) - 1)]
        self.calls += 1
        return [self.tok.encode(turn, add_special_tokens=False) for _ in contexts]


def _block(tok, t, i):
    s = t.steps[i]
    return tok.decode(t.token_ids[s.info_start:s.info_end])


def test_open_shows_a_shown_document_in_full(tiny):
    _, tok = tiny
    backend = Script(tok, ["<think> look </think>\n<search> Ilsa </search>",
                           "<think> read it </think>\n<open> 2 </open>",
                           "<answer> Tarrow </answer>"])
    engine = RolloutEngine(backend, tok, Docs(), RolloutConfig(max_turns=4, topk=2,
                                                               tools=["open"], snippet_words=4))
    (t,) = engine.run([QAExample("a", "Where was Ilsa born?", ["Tarrow"],
                                 {"gold_doc_ids": ["d-i"]})])
    prompt = tok.decode(t.token_ids[:t.prompt_len])
    assert "inside <open> and </open>" in prompt and prompt.index("<open>") < prompt.index(
        "Question: Where was Ilsa born?")
    assert [s.action for s in t.steps] == ["search", "open", "answer"]
    # the search shows snippets; open shows document 2 whole
    assert "Doc 2 (Title: Ilsa Marrow) Ilsa Marrow was born ..." in _block(tok, t, 0)
    assert _block(tok, t, 1) == f"\n\n<information>Doc 1 (Title: Ilsa Marrow) {LONG}" \
                                "</information>\n\n"
    # an open is no search: one search per episode, its documents credited, open's not
    assert t.n_searches == 1 and t.steps[0].hits == ["d-t", "d-i"] and t.steps[1].hits == []
    assert t.steps[1].query == "2" and t.valid_format and t.evidence_recall() == 1.0
    t.check()


@pytest.mark.parametrize("ref, want", [("2", "d-i"), ("Doc 1", "d-t"), ("doc #2", "d-i"),
                                       ("ilsa  MARROW", "d-i"), ("d-t", "d-t"), ("3", None),
                                       ("0", None), ("Nowhere", None)])
def test_open_resolves_numbers_titles_and_ids(ref, want):
    hit = resolve_document(ref, seen=DOCS, last=DOCS)
    assert (hit.doc_id if hit else None) == want


def test_open_finds_a_number_past_the_results_as_an_id_or_a_title():
    """wiki-18's ids are numbers, and titles can be ("1984"): a number that is no result
    number is looked up as an id or a title (it gave nothing)."""
    from seekrl.retrieval.base import Hit

    novel, year = Hit("1984", "Nineteen Eighty-Four", "a novel", 1.0), \
        Hit("77", "1984", "a year", 1.0)
    seen = [novel, year]
    assert resolve_document("1984", seen, last=[year]).doc_id == "77"   # its title
    assert resolve_document("2", seen, last=[year]) is None
    assert resolve_document("77", seen, last=[novel]).doc_id == "77"    # its id
    assert resolve_document("1", seen, last=[year]).doc_id == "77"      # a result number


def test_open_of_nothing_shown_says_so_and_the_episode_goes_on(tiny):
    _, tok = tiny
    backend = Script(tok, ["<open> 1 </open>", "<answer> x </answer>"])
    engine = RolloutEngine(backend, tok, Docs(), RolloutConfig(max_turns=3, tools=["open"]))
    (t,) = engine.run([QAExample("a", "q?", ["x"])])
    assert "No document shown so far matches '1'" in _block(tok, t, 0)
    assert [s.action for s in t.steps] == ["open", "answer"] and t.answer == "x"


def test_your_own_tool_by_import_path_is_called_once_per_turn(tiny, monkeypatch, own_parts):
    import sys

    _, tok = tiny
    backend = Script(tok, ["<calc> (3 + 4) * 6 </calc>", "<calc> 1/0 </calc>",
                           "<answer> 42 </answer>"])
    engine = RolloutEngine(backend, tok, Docs(), RolloutConfig(
        max_turns=4, tools=["examples.my_parts:Calculator"], batch_size=3))
    parts = sys.modules["examples.my_parts"]
    seen = []
    real = parts.Calculator.call
    monkeypatch.setattr(parts.Calculator, "call",
                        lambda self, calls: seen.append(len(calls)) or real(self, calls))
    trajs = engine.run([QAExample(str(i), f"q{i}?", ["42"]) for i in range(3)])
    assert seen == [3, 3]   # every call of a turn in one list
    for t in trajs:
        assert _block(tok, t, 0) == "\n\n<information>(3 + 4) * 6 = 42</information>\n\n"
        assert "Cannot compute '1/0'" in _block(tok, t, 1)
        assert t.n_searches == 0 and t.valid_format and t.answer == "42"


def test_a_tool_that_raises_is_named_in_the_error(tiny, monkeypatch, own_parts):
    """A plug-in tool's exception stops the batch (no episode trains on a result that was
    never made), with a note naming the tool and its arguments: its message alone had not
    said which tool, and the CLI prints the notes under the one-line error."""
    import importlib

    _, tok = tiny
    parts = importlib.import_module("examples.my_parts")

    def broken(self, calls):
        raise ValueError("the calculator's service is down")

    monkeypatch.setattr(parts.Calculator, "call", broken)
    engine = RolloutEngine(Script(tok, ["<calc> 2 + 2 </calc>", "<answer> 4 </answer>"]), tok,
                           Docs(), RolloutConfig(max_turns=3, batch_size=2,
                                                 tools=["examples.my_parts:Calculator"]))
    with pytest.raises(ValueError, match="service is down") as err:
        engine.run([QAExample(str(i), f"q{i}?", ["4"]) for i in range(2)])
    assert err.value.__notes__ == ["raised by the tool <calc> (Calculator.call) on 2 call(s): "
                                   "'2 + 2', '2 + 2'"]


def test_a_continuation_can_open_what_its_prefix_was_shown(tiny):
    _, tok = tiny
    backend = Script(tok, ["<search> Ilsa </search>", "<answer> x </answer>"])
    engine = RolloutEngine(backend, tok, Docs(), RolloutConfig(max_turns=3, topk=2,
                                                               tools=["open"]))
    (t,) = engine.run([QAExample("a", "q?", ["x"])])
    backend.turns, backend.calls = ["<open> Tarrow </open>", "<answer> x </answer>"], 0
    ((c,),) = engine.continue_from([(t, 1)])
    assert [s.action for s in c.steps] == ["search", "open", "answer"]
    assert "Tarrow is a city in Velmaria." in _block(tok, c, 1)


def test_the_last_turns_call_is_not_run(tiny):
    _, tok = tiny
    backend = Script(tok, ["<search> a </search>", "<open> 1 </open>"])
    retriever = Docs()
    engine = RolloutEngine(backend, tok, retriever, RolloutConfig(max_turns=2, tools=["open"]))
    (t,) = engine.run([QAExample("a", "q?", ["x"])])
    assert t.finish_reason == "max_turns" and t.steps[-1].info_start is None


class Bad:
    tag = "think"
    counts_as_search = False
    instruction = ""

    def call(self, calls):
        return [ToolResult("") for _ in calls]


def test_a_tool_must_have_a_usable_tag_and_its_parts():
    with pytest.raises(ValueError, match="tag 'think'"):
        check_tool(Bad(), "rollout.tools[0]")
    with pytest.raises(TypeError, match="lacks tag, counts_as_search, instruction"):
        check_tool(object(), "rollout.tools[0]")


@pytest.mark.parametrize("tools, message", [
    (["nope"], "rollout.tools[0]: 'nope': expected a built-in tool (open) or an import path"),
    (["open", "open"], "rollout.tools[1]: a second tool with tag 'open'"),
    (["examples.my_parts:judge"], "rollout.tools[0]: a tool needs tag"),
    (["examples.my_parts:Nope"], "rollout.tools[0]"),
])
def test_bad_tools_fail_at_config_time_naming_the_key(tools, message, own_parts):
    from seekrl.recipes.train import check_config

    cfg = build_config(TrainConfig, {"data": "d", "index": "i", "rollout": {"tools": tools}})
    with pytest.raises(ConfigError, match="rollout.tools") as err:
        check_config(cfg)
    assert message in str(err.value)


def test_a_tool_class_that_cannot_be_made_is_named_with_its_error(own_parts):
    from seekrl.agent.tools import check_tool_names

    # a class whose __init__ needs an argument (a retriever here, not a tool at all)
    with pytest.raises(ConfigError, match=r"^rollout.tools\[0\]: examples.my_parts:"
                       r"KeywordRetriever\(\) failed: TypeError: .*corpus"):
        check_tool_names(["examples.my_parts:KeywordRetriever"])
    with pytest.raises(ConfigError, match=r"^--tool\[1\]: a second tool with tag 'open'"):
        check_tool_names(["open", "open"], key="--tool")


def test_every_recipe_that_plays_episodes_refuses_a_bad_tool_before_its_model(tmp_path,
                                                                               own_parts):
    from seekrl.config import LabelConfig, RefineConfig, SFTConfig
    from seekrl.recipes.mcts import run_labelling
    from seekrl.recipes.refine import run_refine
    from seekrl.recipes.sft import run_sft

    bad = {"tools": ["examples.my_parts:judge"]}    # a function, not a tool
    with pytest.raises(ConfigError, match=r"rollout.tools\[0\]: a tool needs tag"):
        run_refine(RefineConfig(out=str(tmp_path / "r"), rollout=bad), retriever=object(),
                   questions=[])
    with pytest.raises(ConfigError, match=r"rollout.tools\[0\]: a tool needs tag"):
        run_labelling(LabelConfig(out=str(tmp_path / "m"), data="q.jsonl", rollout=bad),
                      questions=[])
    (tmp_path / "dev.jsonl").write_text('{"id": 1, "question": "q?", "golden_answers": ["a"]}\n')
    (tmp_path / "sft.jsonl").write_text("")
    with pytest.raises(ConfigError, match=r"rollout.tools\[0\]: a tool needs tag"):
        run_sft(SFTConfig(data=str(tmp_path / "sft.jsonl"), out=str(tmp_path / "s"),
                          index=str(tmp_path), rollout=bad,
                          eval={"data": str(tmp_path / "dev.jsonl"), "every": 1}))
    assert not (tmp_path / "r").exists() and not (tmp_path / "m").exists()


def test_eval_names_its_tool_flag(own_parts, tmp_path):
    from typer.testing import CliRunner

    from seekrl.cli import app

    (tmp_path / "q.jsonl").write_text('{"id": 1, "question": "q?", "golden_answers": ["a"]}\n')
    r = CliRunner().invoke(app, ["eval", "--data", str(tmp_path / "q.jsonl"), "--out",
                                 str(tmp_path / "e"), "--tool", "examples.my_parts:judge"])
    assert r.exit_code == 2 and "--tool[0]: a tool needs tag" in r.output, r.output


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["<open>", "</open>", "<search>", "</search>", "<answer>",
                                 "</answer>", "<calc>", "</calc>", "<think>", " 2 ", "x"]),
                max_size=8))
def test_the_parser_takes_any_tool_tag_and_never_raises(parts):
    text = "".join(parts)
    action = parse_action(text, ("search", "open"))
    assert action.kind in ("search", "open", "answer", "invalid")
    if action.kind != "invalid":
        assert f"</{action.kind}>" in text
    # calc is not a tool here: its tags alone are no action
    if all(p in ("<calc>", "</calc>", " 2 ", "x") for p in parts):
        assert action.kind == "invalid"


def test_the_engine_asks_the_backend_to_stop_at_each_tools_closing_tag(tiny, own_parts):
    _, tok = tiny
    seen = []

    class Spy(Script):
        def generate(self, contexts, max_new_tokens, sampling, keys=None):
            seen.append(sampling.stop)
            return super().generate(contexts, max_new_tokens, sampling, keys)

    engine = RolloutEngine(Spy(tok, ["<answer> x </answer>"]), tok, Docs(),
                           RolloutConfig(tools=["open", "examples.my_parts:Calculator"]))
    engine.run([QAExample("a", "q?", ["x"])])
    assert seen == [("</open>", "</calc>")]
    plain = RolloutEngine(Spy(tok, ["<answer> x </answer>"]), tok, Docs(), RolloutConfig())
    plain.run([QAExample("a", "q?", ["x"])])
    assert seen[-1] == ()


@pytest.mark.parametrize("extra", [-1, 1])
def test_a_retriever_that_miscounts_its_result_lists_is_named(extra):
    """A plugin retriever returning one list too few raised a bare StopIteration through
    the rollout; one too many had its last list dropped unsaid."""
    from seekrl.agent.tools import SearchTool, ToolCall
    from seekrl.retrieval.base import RetrievalError

    class Miscounts:
        def search(self, queries, k):
            return [DOCS[:k] for _ in range(len(queries) + extra)]

    tool = SearchTool(Miscounts(), k=2)
    calls = [ToolCall("Tarrow", "q?", answers=["a"]), ToolCall("Ilsa", "q?", answers=["a"])]
    with pytest.raises(RetrievalError, match=r"Miscounts returned (1|3) result lists for 2 "
                                              "queries"):
        tool.call(calls)
    assert [r.hits for r in SearchTool(Docs(), k=1).call(calls)] == [DOCS[:1], DOCS[:1]]
