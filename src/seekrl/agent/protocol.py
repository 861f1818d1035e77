"""The agent protocol (Search-R1 compatible): tags, prompts and the action parser.

    <think> reasoning </think>
    <search> a query </search>
    <information> Doc 1 (Title: ...) text ... </information>   <- written by the environment
    <answer> final answer </answer>

Generation stops at `</search>`, `</answer>` or EOS. `parse_action` maps any text the model
writes to exactly one action and never raises. Whatever the model writes inside its own
`<information>` tags is removed before parsing: only the environment supplies documents.

Parallel sub-queries (`rollout.max_queries` > 1, as in ParallelSearch): one search turn may
carry up to that many independent queries separated by `##`,

    <search> population of Tarrow ## population of Kelbaan </search>

all run in the same batched retriever call; the `<information>` block then shows each
sub-query's documents under a `Query i: ...` line, numbered on from one sub-query to the
next (`split_queries`, `format_query_results`). With `max_queries` 1 (the default) a `##`
is just part of the one query.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from seekrl.config import DATA_PROMPT, prompt_template
from seekrl.data.qa import SEARCH_R1_INSTRUCTION
from seekrl.retrieval.base import Hit

THINK, SEARCH, INFORMATION, ANSWER = "think", "search", "information", "answer"
STOP_STRINGS = (f"</{SEARCH}>", f"</{ANSWER}>")
MAX_QUERY_CHARS = 500
QUERY_SEPARATOR = "##"      # between the sub-queries of one search turn (max_queries > 1)


AGENT_INSTRUCTION = (
    "Answer the question below. The facts you need are in a document collection that you "
    "can search; do not rely on memory. Each turn, first reason briefly inside <think> and "
    "</think>. To look something up, write a short query inside <search> and </search>: the "
    "top documents come back inside <information> and </information>. Search one fact at a "
    "time, as often as you need. When you know the answer, give it inside <answer> and "
    "</answer> in a few words, for example <answer> Tarrow </answer>."
)
RAG_INSTRUCTION = (
    "Answer the question using the documents below. Reason briefly inside <think> and "
    "</think>, then give the answer inside <answer> and </answer> in a few words."
)
DIRECT_INSTRUCTION = (
    "Answer the question. Reason briefly inside <think> and </think>, then give the answer "
    "inside <answer> and </answer> in a few words."
)
INVALID_MESSAGE = ("That was not a valid action ({reason}). Write <search> query </search> "
                   "to search, or <answer> text </answer> to answer.")


# Search-R1's correction after a turn with neither tag (search_r1/llm_agent/generation.py)
SEARCH_R1_INVALID = ("\nMy previous action is invalid. If I want to search, I should put the "
                     "query between <search> and </search>. If I want to give the final answer, "
                     "I should put the answer between <answer> and </answer>. Let me try "
                     "again.\n")


@dataclass(frozen=True)
class PromptStyle:
    """How the environment speaks to the agent: the instruction (a template holding one
    `{question}`), each document's line in an `<information>` block (`{i}`, `{title}`,
    `{text}`), and the text after an invalid turn (`{reason}` optional). The `prompt`
    setting picks one (`prompt_style`); the tags and the parser are the same for all."""
    name: str
    instruction: str
    doc: str = "Doc {i} (Title: {title}) {text}"
    invalid: str = "\n\n<information>" + INVALID_MESSAGE + "</information>\n\n"
    question_mark: bool = False    # end the question with "?" as Search-R1's data scripts do
    # a document's title and text as Search-R1's client splits the served contents: the
    # first line as it is (wiki-18's quotes kept), the other lines after it
    stored_lines: bool = False
    # the block's body as Search-R1 writes it: its document lines stripped (a document
    # ending in whitespace ends the body without it), and nothing where nothing was found
    strip_body: bool = False
    no_hits: str = "No documents matched the query."

    def doc_line(self, i: int, hit: Hit, *, text: bool = True) -> str:
        """Document `i`'s line (`text=False`: the line up to its text)."""
        if self.stored_lines:
            title, _, body = hit.contents.partition("\n")
        else:
            title, body = hit.title, hit.text
        return self.doc.format(i=i, title=title, text=body if text else "")

    def user(self, question: str, tools: str = "") -> str:
        """The agent's user message; `tools`: sentences on the tools beyond search, put
        where the template says `{tools}`, else after the instruction."""
        question = question.strip()
        if self.question_mark and not question.endswith("?"):
            question += "?"
        text = self.instruction
        if "{tools}" in text:
            text = text.replace("{tools}", f" {tools}" if tools else "")
        elif tools:
            text = f"{text.rstrip()}\n\n{tools}\n"
        return text.replace("{question}", question)


PROMPTS = {
    "seekrl": PromptStyle("seekrl", f"{AGENT_INSTRUCTION}{{tools}}\n\nQuestion: {{question}}"),
    # token for token the prompt the released Search-R1 checkpoints were trained with
    # (make_prefix(template_type="base") through the model's chat template), its document
    # lines and its correction text
    "search_r1": PromptStyle("search_r1", SEARCH_R1_INSTRUCTION.replace(
                                 " Question: {question}", "{tools} Question: {question}"),
                             doc="Doc {i}(Title: {title}) {text}", invalid=SEARCH_R1_INVALID,
                             question_mark=True, stored_lines=True, strip_body=True,
                             no_hits=""),
}


def prompt_style(spec: str | None) -> PromptStyle:
    """The style a `prompt` setting names (`seekrl.config.prompt_template` says which
    settings there are): a preset, `data` (each question's own prompt; documents and
    corrections as `seekrl`'s), or an instruction template (given or in a file) with
    `seekrl`'s documents and corrections."""
    spec = spec or "seekrl"
    if spec in PROMPTS:
        return PROMPTS[spec]
    template = prompt_template(spec)
    if template is None:   # DATA_PROMPT
        return replace(PROMPTS["seekrl"], name=DATA_PROMPT)
    return PromptStyle(spec if spec.startswith("file:") else "custom", template)


def tag(name: str, body: str) -> str:
    return f"<{name}> {body.strip()} </{name}>"


def format_hits(hits: Sequence[Hit], style: PromptStyle | None = None, *,
                first: int = 1) -> str:
    """Documents as the policy reads them, one per line (`Doc i (Title: ...) text` in
    seekrl's style, numbered from `first`), or the style's `no_hits` when the search found
    nothing (a short notice; nothing in Search-R1's)."""
    style = style or PROMPTS["seekrl"]
    if not hits:
        return style.no_hits
    body = "\n".join(style.doc_line(i, h) for i, h in enumerate(hits, first))
    return body.strip() if style.strip_body else body


def format_query_results(queries: Sequence[str], hits: Sequence[Sequence[Hit]],
                         style: PromptStyle | None = None) -> str:
    """The documents of one search turn: for one query, `format_hits`; for several
    sub-queries, each one's documents under a `Query i: ...` line, numbered on across the
    turn (so `Doc 3` names one document of the block, as the `open` tool reads it)."""
    return "\n".join(query_sections(queries, hits, style))


def query_sections(queries: Sequence[str], hits: Sequence[Sequence[Hit]],
                   style: PromptStyle | None = None) -> list[str]:
    """`format_query_results`'s parts, one per sub-query (its `Query i:` line and its
    documents; the one query's documents alone), which the block joins with newlines: a
    block over its token budget is cut section by section (`information_ids`)."""
    if len(queries) != len(hits):
        raise ValueError(f"{len(queries)} queries but {len(hits)} result lists")
    if len(queries) == 1:
        return [format_hits(hits[0], style)]
    parts, first = [], 1
    for i, (query, found) in enumerate(zip(queries, hits), 1):
        parts.append(f"Query {i}: {query}\n{format_hits(found, style, first=first)}")
        first += len(found)
    return parts


def split_queries(body: str, max_queries: int) -> tuple[list[str], str | None]:
    """The sub-queries of a search's text (`QUERY_SEPARATOR` between them, whitespace
    collapsed), and None; or ([], why) when the turn is not a valid search: an empty
    sub-query (`a ## ## b`, a trailing `##`) or more than `max_queries`. With
    `max_queries` 1 the whole text is the one query, `##` and all."""
    text = " ".join(str(body).split())
    if not text:
        return [], "empty search"
    if max_queries <= 1:
        return [text], None
    queries = [" ".join(q.split()) for q in text.split(QUERY_SEPARATOR)]
    if any(not q for q in queries):
        return [], f"an empty sub-query (write {QUERY_SEPARATOR} only between queries)"
    if len(queries) > max_queries:
        return [], f"{len(queries)} sub-queries; at most {max_queries} in one search"
    long = next((i for i, q in enumerate(queries, 1) if len(q) > MAX_QUERY_CHARS), None)
    if long is not None:
        return [], f"sub-query {long} longer than {MAX_QUERY_CHARS} characters"
    return queries, None


def information_block(hits: Sequence[Hit], style: PromptStyle | None = None) -> str:
    """The environment's turn after a search: the block and the blank lines around it."""
    return f"\n\n<{INFORMATION}>{format_hits(hits, style)}</{INFORMATION}>\n\n"


def invalid_block(reason: str, style: PromptStyle | None = None) -> str:
    """The environment's turn after an invalid action: a short correction, then go on."""
    return (style or PROMPTS["seekrl"]).invalid.replace("{reason}", reason)


def user_message(question: str, method: str = "agent", hits: Sequence[Hit] = (),
                 documents: str | None = None, style: PromptStyle | None = None,
                 tools: str = "") -> str:
    """`documents` (for rag) overrides `hits` with text already formatted, e.g. cut to a
    token budget. `style` sets the agent's instruction (and `tools` the sentences on its
    tools beyond search); rag and direct keep their own."""
    if method == "agent":
        return (style or PROMPTS["seekrl"]).user(question, tools)
    question = question.strip()
    if method == "rag":
        docs = documents if documents is not None else format_hits(hits, style)
        return f"{RAG_INSTRUCTION}\n\n{docs}\n\nQuestion: {question}"
    if method == "direct":
        return f"{DIRECT_INSTRUCTION}\n\nQuestion: {question}"
    raise ValueError(f"method: expected agent, rag or direct, got {method!r}")


def build_prompt(tokenizer, question: str, method: str = "agent",
                 hits: Sequence[Hit] = (), documents: str | None = None, *,
                 style: PromptStyle | None = None,
                 messages: Sequence[dict] | None = None, tools: str = "") -> str:
    """The prompt text through the model's chat template (plain text if it has none).
    `messages`: the question's own chat messages (`prompt: data`), used as they are."""
    if messages is None:
        messages = [{"role": "user", "content": user_message(question, method, hits,
                                                             documents, style, tools)}]
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(list(messages), tokenize=False,
                                             add_generation_prompt=True)
    return "\n\n".join(m["content"] for m in messages) + "\n\n"


@dataclass(frozen=True)
class Action:
    kind: str                # "search" | "answer" | "invalid"
    text: str = ""           # the query, the answer, or why the action is invalid

    @property
    def is_valid(self) -> bool:
        return self.kind != "invalid"


_OWN_INFORMATION = re.compile(rf"<{INFORMATION}>.*?(</{INFORMATION}>|$)", re.S)
_ACTION = re.compile(rf"<({SEARCH}|{ANSWER})>(.*?)</\1>", re.S)
_ACTIONS: dict[tuple[str, ...], re.Pattern] = {(SEARCH,): _ACTION}


def _action_pattern(tools: tuple[str, ...]) -> re.Pattern:
    if tools not in _ACTIONS:
        _ACTIONS[tools] = re.compile(
            rf"<({'|'.join(map(re.escape, (*tools, ANSWER)))})>(.*?)</\1>", re.S)
    return _ACTIONS[tools]


def strip_own_information(text: str) -> str:
    """Drop `<information>` blocks the model wrote itself (closed or not)."""
    return _OWN_INFORMATION.sub(" ", text)


def blank_own_information(text: str) -> str:
    """`strip_own_information` keeping every other character where it was: each block
    becomes as many spaces, so a position found in the result is one in `text`."""
    return _OWN_INFORMATION.sub(lambda m: " " * len(m.group()), text)


def parse_action(text: str, tools: Sequence[str] = (SEARCH,), max_queries: int = 1) -> Action:
    """Exactly one action for any text: the first complete tag of a tool (`tools`, by
    default search alone) or of the answer wins, as generation stops at the first closing
    tag. The action's kind is the tag. A body may hold `MAX_QUERY_CHARS`; a search of up
    to `max_queries` sub-queries that many times over (`split_queries` then holds each
    sub-query to the limit)."""
    if not isinstance(text, str):
        return Action("invalid", "no text")
    tools = tuple(tools)
    clean = strip_own_information(text)
    match = _action_pattern(tools).search(clean)
    if match is None:
        if any(f"<{name}>" in clean for name in (*tools, ANSWER)):
            return Action("invalid", "unclosed tag")
        names = [f"<{name}>" for name in (*tools, ANSWER)]
        return Action("invalid", f"no {', '.join(names[:-1])} or {names[-1]} tag")
    kind, body = match.group(1), " ".join(match.group(2).split())
    if not body:
        return Action("invalid", f"empty {kind}")
    limit = MAX_QUERY_CHARS
    if kind == SEARCH and max_queries > 1:
        limit = (MAX_QUERY_CHARS + len(f" {QUERY_SEPARATOR} ")) * max_queries
    if len(body) > limit:
        what = "query" if kind == SEARCH else f"{kind} argument"
        return Action("invalid", f"{what} longer than {limit} characters")
    return Action(kind, body)


_PROTOCOL_TAG = re.compile(rf"</?({THINK}|{SEARCH}|{ANSWER}|{INFORMATION})>")
_WELL_FORMED = re.compile(
    rf"\s*(?:<{THINK}>(?P<think>.*?)</{THINK}>\s*)?"
    rf"<(?P<kind>(?!{THINK}>|{INFORMATION}>)[a-z][a-z0-9_]*)>(?P<body>.*?)</(?P=kind)>\s*", re.S)
_ANY_ACTION = re.compile(rf"<((?!{THINK}>|{INFORMATION}>)[a-z][a-z0-9_]*)>(.*?)</\1>", re.S)


def step_format_problem(text: str) -> str | None:
    """None when a turn follows the protocol exactly: an optional `<think>` block, then one
    action tag (`<search>`, `<answer>`, another tool's) with a non-empty body, nothing
    outside the tags but whitespace, and no protocol tag inside another. Otherwise a short
    reason. This is stricter than `parse_action`, which finds an action in any text: a turn
    can act and still be sloppy (text before `<think>`, a second `<search>` inside the
    reasoning). Which tags are actions is the parser's call: a step it found no action in
    is not well formed whatever this says."""
    if not isinstance(text, str):
        return "no text"
    m = _WELL_FORMED.fullmatch(text)
    if m is None:
        if not _ANY_ACTION.search(text):
            return "no complete <search> or <answer>"
        return "text outside the tags"
    # a tool's own tag inside its call (or the reasoning) is as stray as a nested <search>
    own = re.compile(rf"</?{re.escape(m.group('kind'))}>")
    if any(tag.search(part) for tag in (_PROTOCOL_TAG, own)
           for part in (m.group("think") or "", m.group("body"))):
        return "a protocol tag inside another"
    if not m.group("body").strip():
        return f"empty {m.group('kind')}"
    return None


def normalise_text(text: str | None) -> str:
    """Lower case, whitespace collapsed: how two queries (or titles) are compared."""
    return " ".join(str(text or "").lower().split())


def holds_phrase(text: str, phrase: str) -> bool:
    """`phrase` in `text` as whole words ("no" is not in "not", nor "1" in "1990"); both
    normalised by the caller (`normalise_text`)."""
    return bool(phrase) and re.search(rf"(?<!\w){re.escape(phrase)}(?!\w)", text) is not None


_THINK_BLOCK = re.compile(rf"<{THINK}>.*?(</{THINK}>|$)", re.S)
_ANY_TAG = re.compile(r"</?[a-z]+>")


def plain_answer(text: str) -> str:
    """The reply without reasoning and tags: what a one-turn method takes as its answer
    when the model did not use <answer> tags."""
    text = _ANY_TAG.sub(" ", _THINK_BLOCK.sub(" ", strip_own_information(text)))
    return " ".join(text.split())
