"""The agent's prompt as a setting: presets (seekrl, search_r1), each question's own prompt
(`data`), templates given inline or in a file; what the engine, SFT and the evaluation's
fingerprint make of each."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seekrl.agent.backends import Backend
from seekrl.agent.protocol import PROMPTS, SEARCH_R1_INVALID, prompt_style
from seekrl.agent.rollout import RolloutConfig, RolloutEngine
from seekrl.config import ConfigError, SFTConfig, TrainConfig, build_config
from seekrl.data.qa import QAExample
from seekrl.errors import DataError
from seekrl.eval.evaluate import protocol_record
from seekrl.models import tiny_policy
from seekrl.recipes.sft import episode_tokens
from seekrl.retrieval.base import Hit

# Search-R1's make_prefix(template_type="base"), typed out here from its data scripts
SEARCH_R1_TEXT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first "
    "every time you get new information. After reasoning, if you find you lack some "
    "knowledge, you can call a search engine by <search> query </search> and it will return "
    "the top searched results between <information> and </information>. You can search as "
    "many times as your want. If you find no further external knowledge needed, you can "
    "directly provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>. Question: {q}\n")


@pytest.fixture(scope="module")
def tiny():
    return tiny_policy(seed=0)


class Docs:
    docs = [Hit("d1", "Tarrow", "Tarrow is a city.", 2.0), Hit("d2", "Ilsa", "Ilsa was born.", 1.0)]

    def search(self, queries, k):
        return [self.docs[:k] for _ in queries]


class Script(Backend):
    """Plays the same turns for every episode: the i-th call returns turns[i]; keeps the
    contexts it was given."""

    def __init__(self, tok, turns):
        self.tok, self.turns, self.seen, self.calls = tok, turns, [], 0

    def generate(self, contexts, max_new_tokens, sampling, keys=None):
        self.seen.append([self.tok.decode(c) for c in contexts])
        turn = self.turns[min(self.calls, len(self.turns) - 1)]
        self.calls += 1
        return [self.tok.encode(turn, add_special_tokens=False) for _ in contexts]


def _play(tok, prompt, examples, turns):
    backend = Script(tok, turns)
    engine = RolloutEngine(backend, tok, Docs(), RolloutConfig(max_turns=3, topk=2, prompt=prompt))
    return engine.run(examples), backend


def test_search_r1_prompt_documents_and_correction_are_search_r1s(tiny):
    _, tok = tiny
    (t,), backend = _play(tok, "search_r1", [QAExample("a", "who was born in Tarrow", ["Ilsa"])],
                          ["I am not sure", "<search> born </search>", "<answer> Ilsa </answer>"])
    prompt = tok.decode(t.token_ids[:t.prompt_len])
    assert prompt == tok.apply_chat_template(
        [{"role": "user", "content": SEARCH_R1_TEXT.format(q="who was born in Tarrow?")}],
        tokenize=False, add_generation_prompt=True)
    first, second = t.steps[0], t.steps[1]
    correction = tok.decode(t.token_ids[first.info_start:first.info_end])
    assert correction == SEARCH_R1_INVALID
    block = tok.decode(t.token_ids[second.info_start:second.info_end])
    assert block == ("\n\n<information>Doc 1(Title: Tarrow) Tarrow is a city.\n"
                     "Doc 2(Title: Ilsa) Ilsa was born.</information>\n\n")
    assert t.answer == "Ilsa"


def test_search_r1_documents_keep_the_served_first_line_as_its_client_does():
    """Search-R1's client takes a document's first line as its title as served: wiki-18's
    quoted titles keep their quotes there, and the other lines are its text."""
    from seekrl.agent.protocol import format_hits
    from seekrl.agent.rollout import shown_hits
    from seekrl.retrieval.base import Hit

    wiki = Hit.from_contents("1", '"Abraham Lincoln"\nAbraham Lincoln was a lawyer.\nHe led.', 1)
    assert format_hits([wiki], PROMPTS["search_r1"]) == \
        'Doc 1(Title: "Abraham Lincoln") Abraham Lincoln was a lawyer.\nHe led.'
    assert format_hits([wiki]) == \
        "Doc 1 (Title: Abraham Lincoln) Abraham Lincoln was a lawyer.\nHe led."   # seekrl's
    full = format_hits([wiki, wiki], PROMPTS["search_r1"])
    assert shown_hits([wiki, wiki], full, full.split("\n")[0], PROMPTS["search_r1"]) == \
        [True, False]


def test_the_default_prompt_is_unchanged(tiny):
    _, tok = tiny
    (t,), _ = _play(tok, "seekrl", [QAExample("a", "who?", ["x"])], ["<search> q </search>",
                                                                    "<answer> x </answer>"])
    s = t.steps[0]
    assert tok.decode(t.token_ids[s.info_start:s.info_end]).startswith(
        "\n\n<information>Doc 1 (Title: Tarrow) Tarrow is a city.\nDoc 2 (Title: Ilsa)")
    assert PROMPTS["seekrl"].user("  who? ").endswith("\n\nQuestion: who?")


def test_data_prompt_plays_each_questions_own_messages(tiny):
    _, tok = tiny
    own = [{"role": "system", "content": "You search."},
           {"role": "user", "content": "Find it: who?"}]
    (t,), _ = _play(tok, "data", [QAExample("a", "who?", ["x"], prompt=own)],
                    ["<answer> x </answer>"])
    assert tok.decode(t.token_ids[:t.prompt_len]) == tok.apply_chat_template(
        own, tokenize=False, add_generation_prompt=True)
    with pytest.raises(ValueError, match=r"1 of 2 questions carry none \(first: 'b'\)"):
        _play(tok, "data", [QAExample("a", "who?", ["x"], prompt=own),
                            QAExample("b", "what?", ["y"])], ["<answer> x </answer>"])


def test_a_template_inline_or_in_a_file(tiny, tmp_path):
    _, tok = tiny
    (t,), _ = _play(tok, "Q => {question} <=", [QAExample("a", "who?", ["x"])],
                    ["<answer> x </answer>"])
    assert "Q => who? <=" in tok.decode(t.token_ids[:t.prompt_len])
    path = tmp_path / "p.txt"
    path.write_text("Use <search>. {question}\n", encoding="utf-8")
    assert prompt_style(f"file:{path}").user("who?") == "Use <search>. who?\n"
    # braces of the user's own text are kept as they are
    assert prompt_style('Tools: {"name": "search"} {question}').user("q") == \
        'Tools: {"name": "search"} q'


@pytest.mark.parametrize("value, why", [
    ("no slot here", "holding {question} exactly once"),
    ("{question} and {question}", "holding {question} exactly once"),
    ("file:/nonexistent/prompt.txt", "cannot read the prompt file"),
])
def test_bad_prompt_settings_name_the_key(value, why):
    with pytest.raises(ConfigError, match=r"rollout\.prompt") as err:
        build_config(TrainConfig, {"model": "m", "data": "d", "rollout": {"prompt": value}})
    assert why in str(err.value)
    with pytest.raises(ConfigError, match="prompt"):
        build_config(SFTConfig, {"data": "d", "prompt": value})


def test_the_fingerprint_follows_the_prompt(tiny):
    _, tok = tiny
    seekrl = protocol_record(RolloutConfig(), tok)
    r1 = protocol_record(RolloutConfig(prompt="search_r1"), tok)
    assert seekrl["instruction_sha256"] != r1["instruction_sha256"]
    assert "layout_sha256" not in seekrl and "layout_sha256" in r1
    data = {"d": [QAExample("a", "q", ["x"], prompt=[{"role": "user", "content": "A q"}])]}
    other = {"d": [QAExample("a", "q", ["x"], prompt=[{"role": "user", "content": "B q"}])]}
    own = protocol_record(RolloutConfig(prompt="data"), tok, data)
    assert own["instruction_sha256"] is None
    assert own["data_prompts_sha256"] != \
        protocol_record(RolloutConfig(prompt="data"), tok, other)["data_prompts_sha256"]


def test_search_r1_blocks_read_as_search_r1_writes_them():
    """Search-R1 strips its block's body and writes nothing where nothing was found:
    a last document ending in whitespace (wiki-18's stored contents) and a title-only
    document left a space before </information>, and an empty search read "No documents
    matched the query."; seekrl's own style is unchanged."""
    from seekrl.agent.protocol import format_hits

    r1 = PROMPTS["search_r1"]
    hits = [Hit.from_contents("a", '"A"\nalpha text', 1.0),
            Hit.from_contents("b", '"B"\nbeta text ', 1.0)]
    assert format_hits(hits, r1) == 'Doc 1(Title: "A") alpha text\nDoc 2(Title: "B") beta text'
    assert format_hits([Hit.from_contents("x", '"X"', 1.0)], r1) == 'Doc 1(Title: "X")'
    assert format_hits([], r1) == ""
    assert format_hits([], PROMPTS["seekrl"]) == "No documents matched the query."


def test_the_fingerprint_reads_named_chat_templates():
    """A tokenizer with several named templates (Hermes-2-Pro, Command-R) holds a dict:
    hashing it as text failed every evaluation once its episodes were played."""
    from types import SimpleNamespace

    named = SimpleNamespace(chat_template={"default": "x", "tool_use": "y"})
    other = SimpleNamespace(chat_template={"default": "x", "tool_use": "z"})
    a = protocol_record(RolloutConfig(), named)["chat_template_sha256"]
    assert a and a != protocol_record(RolloutConfig(), other)["chat_template_sha256"]


def _oracle(with_hits=True, prompt=None):
    info = {"role": "information", "content": "<information>Doc 1 (Title: Tarrow) Tarrow is a "
                                              "city.</information>"}
    if with_hits:
        info["hits"] = [{"id": "d1", "title": "Tarrow", "text": "Tarrow is a city."}]
    rec = {"question": "where?", "turns": [
        {"role": "assistant", "content": "<search> Tarrow </search>"}, info,
        {"role": "assistant", "content": "<answer> Tarrow </answer>"}]}
    if prompt is not None:
        rec["prompt"] = prompt
    return rec


def test_sft_lays_oracle_episodes_out_as_the_rollout_would(tiny):
    _, tok = tiny
    seekrl_ids, _ = episode_tokens(tok, _oracle())
    # an old oracle file (no hits) reads as before in seekrl's style
    assert episode_tokens(tok, _oracle(with_hits=False))[0] == seekrl_ids
    ids, mask = episode_tokens(tok, _oracle(), prompt="search_r1")
    text = tok.decode(ids)
    assert SEARCH_R1_TEXT.format(q="where?") in text
    assert "<information>Doc 1(Title: Tarrow) Tarrow is a city.</information>" in text
    trained = tok.decode([i for i, m in zip(ids, mask) if m])
    assert trained == "<search> Tarrow </search><answer> Tarrow </answer>"
    with pytest.raises(DataError, match="without its documents"):
        episode_tokens(tok, _oracle(with_hits=False), prompt="search_r1", where="o.jsonl:3")
    with pytest.raises(DataError, match=r"o\.jsonl:3.*prompt"):
        episode_tokens(tok, _oracle(), prompt="data", where="o.jsonl:3")
    own = [{"role": "user", "content": "Q: where?"}]
    ids, _ = episode_tokens(tok, _oracle(prompt=own), prompt="data")
    assert tok.decode(ids).startswith(tok.apply_chat_template(own, tokenize=False,
                                                              add_generation_prompt=True))


def test_a_records_prompt_is_read_and_written_back():
    ex = QAExample.from_dict({"id": 1, "question": "q", "golden_answers": ["a"],
                              "prompt": "Answer: q"})
    assert ex.prompt == [{"role": "user", "content": "Answer: q"}]
    assert "prompt" not in ex.metadata
    assert QAExample.from_dict(ex.to_dict()) == ex
    assert "prompt" not in QAExample("1", "q", ["a"]).to_dict()
    with pytest.raises(DataError, match=r"x\.jsonl:7: field 'prompt\[1\]'"):
        QAExample.from_dict({"id": 1, "question": "q", "golden_answers": ["a"],
                             "prompt": [{"role": "user", "content": "q"}, {"role": "user"}]},
                            path="x.jsonl", line=7)
    with pytest.raises(DataError, match="the last message to be the user's"):
        QAExample.from_dict({"id": 1, "question": "q", "golden_answers": ["a"],
                             "prompt": [{"role": "user", "content": "q"},
                                        {"role": "assistant", "content": "a"}]})


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.sampled_from(["role", "content", "x"]), inner,
                                       max_size=3), max_leaves=8)


@settings(max_examples=200, deadline=None)
@given(_json)
def test_any_prompt_value_reads_or_fails_with_a_data_error(value):
    record = {"id": "1", "question": "q", "golden_answers": ["a"], "prompt": value}
    try:
        ex = QAExample.from_dict(record, path="f.jsonl", line=2)
    except DataError as err:
        assert "f.jsonl:2" in str(err) and "prompt" in str(err)
        return
    assert ex.prompt is None or (ex.prompt[-1]["role"] == "user" and all(
        isinstance(m["content"], str) for m in ex.prompt))
    json.dumps(ex.to_dict())
