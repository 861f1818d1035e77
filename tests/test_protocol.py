"""The action parser: exactly one action for any text, never raises, distrusts the model's
own <information> blocks."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from seekrl.agent.protocol import (
    MAX_QUERY_CHARS,
    build_prompt,
    information_block,
    invalid_block,
    parse_action,
    plain_answer,
    step_format_problem,
    user_message,
)
from seekrl.retrieval.base import Hit


def test_search_and_answer():
    a = parse_action("<think> need the founder </think>\n<search> founder of Kelbaan Records </search>")
    assert (a.kind, a.text) == ("search", "founder of Kelbaan Records")
    a = parse_action("<think> done </think> <answer>  Tarrow \n</answer>")
    assert (a.kind, a.text) == ("answer", "Tarrow")


def test_first_closed_action_wins():
    assert parse_action("<search> a </search> <answer> b </answer>").kind == "search"
    assert parse_action("<answer> b </answer> <search> a </search>").kind == "answer"


def test_invalid_actions_have_reasons():
    assert parse_action("I think it is Paris.").text == "no <search> or <answer> tag"
    assert parse_action("<search> unclosed").text == "unclosed tag"
    assert parse_action("<answer>   </answer>").text == "empty answer"
    assert parse_action("<search></search>").text == "empty search"
    long = parse_action(f"<search> {'x' * (MAX_QUERY_CHARS + 1)} </search>")
    assert long.kind == "invalid" and "longer" in long.text
    assert parse_action(None).kind == "invalid"


def test_the_models_own_information_is_never_tool_output():
    # The model fakes a retrieval result containing an answer tag: it must not count.
    text = "<information> Doc 1 <answer> fake </answer> </information> <search> real query </search>"
    a = parse_action(text)
    assert (a.kind, a.text) == ("search", "real query")
    # An unclosed fake block swallows everything after it.
    assert parse_action("<information> <answer> fake </answer>").kind == "invalid"


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_parser_never_raises_on_any_text(text):
    a = parse_action(text)
    assert a.kind in ("search", "answer", "invalid")
    if a.kind != "invalid":
        assert a.text and a.text == " ".join(a.text.split())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["<search>", "</search>", "<answer>", "</answer>",
                                 "<information>", "</information>", "<think>", "</think>",
                                 " q ", "x", "\n"]), max_size=12))
def test_parser_on_tag_soup(parts):
    text = "".join(parts)
    a = parse_action(text)
    assert a.kind in ("search", "answer", "invalid")
    if a.kind != "invalid":
        assert f"<{a.kind}>" in text


def test_environment_blocks():
    hits = [Hit("d1", "Tarrow", "Tarrow is a city.", 1.0), Hit("d2", "Velmaria", "A country.", 0.5)]
    block = information_block(hits)
    assert block == ("\n\n<information>Doc 1 (Title: Tarrow) Tarrow is a city.\n"
                     "Doc 2 (Title: Velmaria) A country.</information>\n\n")
    assert "No documents" in information_block([])
    assert "not a valid action (unclosed tag)" in invalid_block("unclosed tag")


def test_prompts_for_each_method():
    class Tok:
        chat_template = None

    assert "<search>" in user_message("Q?", "agent")
    assert "Doc 1 (Title: T)" in user_message("Q?", "rag", [Hit("d", "T", "x", 1.0)])
    assert "<search>" not in user_message("Q?", "direct")
    assert build_prompt(Tok(), "Where?").endswith("Question: Where?\n\n")


def test_plain_answer_drops_reasoning_and_tags():
    assert plain_answer("<think> hmm </think> Paris, France.") == "Paris, France."
    assert plain_answer("<information> fake </information> Tarrow") == "Tarrow"
    assert plain_answer("<think> never closed") == ""


def test_a_well_formed_turn_is_one_action_with_no_stray_tag_of_any_kind():
    assert step_format_problem("<think> a </think> <search> q </search>") is None
    assert step_format_problem("<open> 2 </open>") is None
    assert step_format_problem("x <search> q </search>") == "text outside the tags"
    assert step_format_problem("<answer>  </answer>") == "empty answer"
    assert step_format_problem("I do not know") == "no complete <search> or <answer>"
    nested = "a protocol tag inside another"
    assert step_format_problem("<think> <search> 1 </think> <search> q </search>") == nested
    # a tool's own tag inside its call or the reasoning, as with <search> (it had passed)
    assert step_format_problem("<open> 2 <open> 3 </open>") == nested
    assert step_format_problem("<think> maybe <open> </think> <open> 3 </open>") == nested
