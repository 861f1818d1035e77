"""Tools the agent calls by tag: `<search> query </search>` is one, `<open> 2 </open>` another.

A tool is an object with

- `tag`: the tag the model writes (`[a-z][a-z0-9_]*`, not a protocol tag);
- `counts_as_search`: whether a call is a search: it counts in searches per episode, its
  documents count as retrieved (evidence recall, the `evidence` step reward, MCTS) and its
  step's action is "search";
- `instruction`: one sentence added to the agent's prompt, saying how to call it;
- `call(calls) -> results`: every call of one turn of the whole batch at once (a list of
  `ToolCall`), one `ToolResult` each, in order: the text the model reads inside
  `<information>` and the documents it shows;
- optionally `concurrent`: True when `call` may run in a thread beside the policy's
  decoding (it reads only its calls, and shares no model with the policy). Under
  `rollout.continuous` the engine then fetches one set of rows' results while the other
  rows decode; a tool without it is called between decoding runs.

The engine cuts a result to `max_info_tokens` like a search's documents. `rollout.tools`
names the tools beyond `search`: `open` (below) or your own by import path
(`mypkg.tools:Calculator`, a class called with no arguments, or a tool object).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from seekrl.agent.protocol import (
    ANSWER,
    INFORMATION,
    QUERY_SEPARATOR,
    SEARCH,
    THINK,
    PromptStyle,
    format_hits,
    normalise_text,
    query_sections,
    split_queries,
)
from seekrl.retrieval.base import Hit, RetrievalError, Retriever

TAG = re.compile(r"[a-z][a-z0-9_]*")
RESERVED = (THINK, ANSWER, INFORMATION)


@dataclass
class ToolCall:
    argument: str                  # the text between the tags, whitespace collapsed
    question: str                  # the episode's question
    seen: list[Hit] = field(default_factory=list)   # the documents shown so far, in order
    last: list[Hit] = field(default_factory=list)   # the latest search's documents
    # the episode's gold answers: for an environment that needs them (a simulated search
    # engine writes useful documents from them, retrieval/simulated.py); never shown as such
    answers: list[str] = field(default_factory=list)


@dataclass
class ToolResult:
    text: str                      # what the model reads inside <information>
    hits: list[Hit] = field(default_factory=list)   # the documents it shows
    # a search of several sub-queries (rollout.max_queries > 1): each sub-query and the
    # documents it found (`hits` is their concatenation, in order); empty otherwise
    sub_queries: list[str] = field(default_factory=list)
    sub_hits: list[list[Hit]] = field(default_factory=list)
    # ... and each sub-query's part of `text` (joined by newlines): a block over its token
    # budget is cut part by part, so one sub-query's documents cannot crowd out another's
    sections: list[str] = field(default_factory=list)


@runtime_checkable
class Tool(Protocol):
    tag: str
    counts_as_search: bool
    instruction: str

    def call(self, calls: list[ToolCall]) -> list[ToolResult]: ...


def search_instruction(max_queries: int) -> str:
    """The prompt's sentence on search beyond what the presets say: none for one query a
    turn, the `##` syntax for parallel sub-queries (SFT lays oracle episodes out with it)."""
    if max_queries <= 1:
        return ""
    return (f"To look up several independent facts at once, put up to {max_queries} queries in "
            f"one search, separated by {QUERY_SEPARATOR}: <search> first query "
            f"{QUERY_SEPARATOR} second query </search>.")


class SearchTool:
    """`<search> query </search>`: the top `k` documents of the retriever, all queries of a
    turn in one batched call. `snippet_words`: show only each document's first N words
    (the `open` tool shows one whole). `max_queries` > 1: a call may hold that many
    sub-queries separated by `##` (the engine refuses a turn `split_queries` finds
    malformed before it gets here); every sub-query of every call of the turn goes to the
    retriever in the same one call."""
    tag = SEARCH
    counts_as_search = True

    @property
    def concurrent(self) -> bool:
        # a simulated engine decodes with a model of its own, which may be the policy's
        return getattr(self.retriever, "search_with_context", None) is None

    def __init__(self, retriever: Retriever, k: int, style: PromptStyle | None = None,
                 snippet_words: int | None = None, max_queries: int = 1):
        self.retriever, self.k, self.style = retriever, k, style
        self.snippet_words = snippet_words
        self.max_queries = max_queries
        self.instruction = search_instruction(max_queries)

    def call(self, calls: list[ToolCall]) -> list[ToolResult]:
        split = []
        for c in calls:
            queries, problem = split_queries(c.argument, self.max_queries)
            if problem is not None:
                raise ValueError(f"search {c.argument!r}: {problem}")
            split.append(queries)
        flat = [q for qs in split for q in qs]
        simulated = getattr(self.retriever, "search_with_context", None)
        if simulated is not None:   # a simulated engine writes from the question and answer
            owners = [c for c, qs in zip(calls, split) for _ in qs]
            results = simulated(flat, self.k, [c.question for c in owners],
                                [c.answers[0] if c.answers else None for c in owners])
        else:
            results = self.retriever.search(flat, self.k)
        results = list(results)
        if len(results) != len(flat):   # a plugin's miscount: each query its own documents
            raise RetrievalError(f"the retriever {type(self.retriever).__name__} returned "
                                 f"{len(results)} result lists for {len(flat)} queries; "
                                 "expected one list a query, in order")
        found = iter(results)
        out = []
        for queries in split:
            hits = [list(next(found)) for _ in queries]
            sections = query_sections(queries, [[self._shown(h) for h in hs] for hs in hits],
                                      self.style)
            many = len(queries) > 1
            out.append(ToolResult("\n".join(sections), [h for hs in hits for h in hs],
                                  sub_queries=list(queries) if many else [],
                                  sub_hits=hits if many else [],
                                  sections=sections if many else []))
        return out

    def _shown(self, hit: Hit) -> Hit:
        return snippet(hit, self.snippet_words)


def snippet(hit: Hit, words: int | None) -> Hit:
    """`hit` as a search shows it with `snippet_words`: its first `words` words and " ...",
    the stored form cut alike (its served first line kept: wiki-18's quoted title)."""
    text = hit.text.split()
    if words is None or len(text) <= words:
        return hit
    cut = " ".join(text[:words]) + " ..."
    stored = None
    if hit.stored is not None:
        head, newline, _ = hit.stored.partition("\n")
        stored = f"{head}\n{cut}" if newline else cut
    return Hit(hit.doc_id, hit.title, cut, hit.score, stored=stored)


def tool_instructions(names: Sequence[str], *, max_queries: int = 1,
                      style: PromptStyle | None = None) -> str:
    """The prompt's sentences on the tools, as a rollout with search and `rollout.tools`
    `names` writes them (SFT lays its episodes out with the same)."""
    tools = make_tools(names, retriever=None, k=1, style=style)
    parts = [search_instruction(max_queries), *(t.instruction for t in tools.values())]
    return " ".join(p for p in parts if p)


class OpenTool:
    """`<open> 2 </open>`: one document this episode has been shown, in full: by its number
    in the latest search's results (`2`, `Doc 2`), its title or its id. Nothing is
    searched; a reference that matches no document shown gets a short notice."""
    tag = "open"
    counts_as_search = False
    concurrent = True   # reads the documents its calls carry, nothing else
    instruction = ("To read a document of the results in full, write its number or title "
                   "inside <open> and </open>.")

    def __init__(self, style: PromptStyle | None = None):
        self.style = style

    def call(self, calls: list[ToolCall]) -> list[ToolResult]:
        out = []
        for c in calls:
            hit = resolve_document(c.argument, c.seen, c.last)
            if hit is None:
                out.append(ToolResult(f"No document shown so far matches {c.argument!r}: "
                                      "open takes a number of the latest results, a title or "
                                      "an id."))
            else:
                out.append(ToolResult(format_hits([hit], self.style), [hit]))
        return out


_NUMBER = re.compile(r"(?:doc(?:ument)?\s*)?#?\s*(\d+)", re.I)


def resolve_document(reference: str, seen: Sequence[Hit], last: Sequence[Hit]) -> Hit | None:
    """The document `reference` names: a number of the latest results (1-based, `Doc 2`
    too), else an id or a title (case and spacing ignored) of any document shown, the
    latest first."""
    ref = reference.strip()
    m = _NUMBER.fullmatch(ref)
    if m is not None and 1 <= int(m.group(1)) <= len(last):
        return last[int(m.group(1)) - 1]
    # a number past the latest results may be an id or a title (wiki-18's ids are
    # numbers, and so are titles such as "1984")
    key = normalise_text(ref)
    for hit in reversed(seen):
        if hit.doc_id == ref or normalise_text(hit.title) == key:
            return hit
    return None


BUILT_IN = {"open": OpenTool}


def check_tool(tool: object, where: str) -> Tool:
    """`tool` has what the engine needs, and a tag it can use; a TypeError/ValueError naming
    `where` otherwise."""
    missing = [a for a in ("tag", "counts_as_search", "instruction", "call")
               if not hasattr(tool, a)]
    if missing:
        raise TypeError(f"{where}: a tool needs tag, counts_as_search, instruction and "
                        f"call(calls); {type(tool).__name__} lacks {', '.join(missing)}")
    tag = tool.tag
    if not isinstance(tag, str) or not TAG.fullmatch(tag) or tag in RESERVED:
        raise ValueError(f"{where}: tag {tag!r}: expected lower-case letters, digits and _ "
                         f"(starting with a letter), not one of {', '.join(RESERVED)}")
    return tool


def _named_tool(name: str, where: str, style: PromptStyle | None) -> Tool:
    if name in BUILT_IN:
        return check_tool(BUILT_IN[name](style), where)
    from seekrl.plugins import is_import_path, load

    if not is_import_path(name):
        raise ValueError(f"{where}: {name!r}: expected a built-in tool ({', '.join(BUILT_IN)}) "
                         "or an import path module:attribute")
    obj = load(where, name)
    if isinstance(obj, type):
        try:
            obj = obj()
        except Exception as err:   # a tool class is made with no arguments
            raise ValueError(f"{where}: {name}() failed: {type(err).__name__}: {err} "
                             "(a tool class is made with no arguments; give an instance "
                             "to configure one)") from None
    return check_tool(obj, where)


def check_tool_names(names: Sequence[str], key: str = "rollout.tools") -> None:
    """The tools setting at config time, before any model loads: each name a built-in or
    an importable tool, and no two tools with one tag (search's included); a ConfigError
    naming `key` (the config key, or a command's flag) otherwise."""
    from seekrl.errors import ConfigError

    try:
        make_tools(names, retriever=None, k=1, style=None, key=key)
    except (TypeError, ValueError) as err:
        raise ConfigError(str(err)) from None


def make_tools(names: Sequence[str], *, retriever: Retriever | None, k: int,
               style: PromptStyle | None, snippet_words: int | None = None,
               max_queries: int = 1, key: str = "rollout.tools") -> dict[str, Tool]:
    """The tools of an agent episode by tag: `search` (with a retriever), then `names` (the
    `rollout.tools` setting) in order."""
    tools: dict[str, Tool] = {}
    if retriever is not None:
        tools[SEARCH] = SearchTool(retriever, k, style, snippet_words, max_queries)
    for i, name in enumerate(names):
        where = f"{key}[{i}]"
        tool = _named_tool(name, where, style)
        if tool.tag in tools or tool.tag == SEARCH:
            raise ValueError(f"{where}: a second tool with tag {tool.tag!r}")
        tools[tool.tag] = tool
    return tools
