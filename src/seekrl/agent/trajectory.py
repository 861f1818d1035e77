"""`Trajectory` and `Step`: one episode as plain data, from rollout to loss.

Token layout: `token_ids = prompt + (generated turn + environment block) * n`. `loss_mask`
is 1 exactly on the tokens the policy generated; each `Step` is one model turn and its
`[start, end)` span covers that turn's generated tokens, so the steps tile the generated
region and everything else (prompt, `<information>` blocks) is 0.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from seekrl.agent.protocol import normalise_text, step_format_problem
from seekrl.data.jsonl import iter_jsonl
from seekrl.data.qa import given_titles
from seekrl.errors import DataError
from seekrl.retrieval.base import simulated_id


@dataclass
class Step:
    start: int                       # first generated token of the turn (into token_ids)
    end: int                         # one past its last generated token
    action: str                      # "search" | "answer" | "invalid" | another tool's name
    text: str = ""                   # the turn's generated text
    query: str | None = None
    answer: str | None = None
    reason: str | None = None        # why the action was invalid
    hits: list[str] = field(default_factory=list)          # retrieved doc ids
    hit_titles: list[str] = field(default_factory=list)
    gold_hit: bool | None = None     # a gold document retrieved (None: gold unknown)
    # a search of several sub-queries (rollout.max_queries > 1): each sub-query and the ids
    # it retrieved (`query` is the turn's whole text, `hits` the concatenation); else empty
    sub_queries: list[str] = field(default_factory=list)
    sub_hits: list[list[str]] = field(default_factory=list)
    # a block cut to its token budget: every document it held, in its numbering (`hits`
    # are then the ones the policy got to read, the only ones credited); None: not cut
    block_hits: list[str] | None = None
    info_start: int | None = None    # the environment block after it: [info_start, info_end)
    info_end: int | None = None
    # self-search: the tokens the policy decoded to write that block (loss mask 0, but
    # generated: they count toward a rollout-token budget); 0 when the environment wrote it
    info_generated: int = 0
    process_reward: float | None = None   # filled by process supervision: the weighted sum
    # each source's reward (None: the source does not apply to this step)
    process_parts: dict[str, float | None] = field(default_factory=dict)
    value: float | None = None            # filled by an MC estimate / critic / PRM

    @property
    def well_formed(self) -> bool:
        """The turn follows the protocol exactly (see `protocol.step_format_problem`)."""
        return self.action != "invalid" and step_format_problem(self.text) is None


@dataclass
class Trajectory:
    example_id: str
    group_id: str
    question: str
    golden_answers: list[str]
    token_ids: list[int]
    loss_mask: list[int]
    prompt_len: int
    steps: list[Step] = field(default_factory=list)
    answer: str | None = None
    finish_reason: str = ""          # answer | max_turns | length
    outcome_reward: float | None = None
    # the part of `outcome_reward` that is the answer's own (`RewardParts.outcome`), filled
    # with it at scoring: `algo.answer_credit` lays it on the answer's tokens alone
    outcome_part: float | None = None
    sample_index: int = 0            # which of the group's samples
    dataset: str = ""
    metadata: dict = field(default_factory=dict)
    gold_doc_ids: list[str] = field(default_factory=list)
    # the log-probability of each policy token (the loss_mask == 1 positions, in order) under
    # the distribution the rollout backend sampled it from; None when a turn had none
    # (greedy decoding, a scripted backend)
    rollout_logprobs: list[float] | None = None
    # where the episode came from, set by the rollout engine
    prompt_hits: list[str] | None = None        # rag: the documents retrieved with the question
    prompt_hit_titles: list[str] | None = None  # ... and their titles
    prefix_steps: int = 0        # a continuation: the steps copied from the episode it grew from
    prefix_tokens: int = 0       # ... and the tokens the policy decoded for them (before, once)
    tree: int | None = None      # tree rollouts: the tree of the group it grew in
    parent: int | None = None    # ... and the leaf it branched from (None: the tree's first)

    @property
    def n_searches(self) -> int:
        return sum(s.action == "search" for s in self.steps)

    @property
    def planned_lookups(self) -> int | None:
        """The lookups the first thought plans ("To answer this I need 2 lookups", the
        oracle's `count` plan); None when it states no number."""
        from seekrl.agent.oracle import PLAN_LEAD  # the oracle builds on this module

        if not self.steps:
            return None
        found = re.search(re.escape(PLAN_LEAD) + r"(\d{1,4}) lookup", self.steps[0].text)
        return int(found.group(1)) if found else None

    @property
    def n_queries(self) -> int:
        """The retriever queries its searches made (a search of sub-queries, each): a
        search the environment answered with its block. One on the last allowed turn is
        not run (the episode ends there), and looks nothing up."""
        return sum(max(1, len(s.sub_queries)) for s in self.steps
                   if s.action == "search" and s.info_end is not None)

    @property
    def n_generated(self) -> int:
        """The policy's trained tokens (loss mask 1)."""
        return sum(self.loss_mask)

    @property
    def n_decoded(self) -> int:
        """Every token the policy decoded: its turns, and with self-search the information
        blocks it wrote (not trained); what a rollout-token budget counts."""
        return self.n_generated + sum(s.info_generated for s in self.steps)

    @property
    def valid_format(self) -> bool:
        """Ended with an answer, and every turn followed the protocol exactly."""
        return self.finish_reason == "answer" and all(s.well_formed for s in self.steps)

    def evidence_keys(self) -> tuple[set[str], list[set[str]], set[str]]:
        """(gold, what each step retrieved, what the retrieval with the question found, for
        `rag`) as comparable keys: document ids where the gold ids are known (the synthetic
        world, `gold_doc_ids`), else normalised titles against `metadata["supporting_titles"]`
        (HotpotQA, 2Wiki and MuSiQue name their supporting passages by title). Gold is empty
        when neither is known."""
        if self.gold_doc_ids:
            return (set(self.gold_doc_ids), [set(s.hits) for s in self.steps],
                    set(self.prompt_hits or []))
        titles = given_titles(self.metadata)
        if not titles:
            return set(), [set() for _ in self.steps], set()
        return ({normalise_text(x) for x in titles},
                [{k for k in title_keys(s.hits, s.hit_titles) if k is not None}
                 for s in self.steps],
                {k for k in title_keys(self.prompt_hits or [], self.prompt_hit_titles or [])
                 if k is not None})

    def evidence_recall(self) -> float | None:
        """Share of the gold documents retrieved at some point of the episode: by its
        searches, and for `rag` by the retrieval with the question. None when the gold
        documents are unknown (see `evidence_keys`)."""
        gold, steps, prompt = self.evidence_keys()
        if not gold:
            return None
        seen = prompt.union(*steps)
        return len(gold & seen) / len(gold)

    def check(self) -> None:
        """The layout invariants; raises AssertionError naming the broken one."""
        n = len(self.token_ids)
        assert len(self.loss_mask) == n, "loss_mask and token_ids differ in length"
        assert all(m == 0 for m in self.loss_mask[: self.prompt_len]), "prompt tokens trained"
        covered = [0] * n
        pos = self.prompt_len
        for s in self.steps:
            assert s.start >= pos and s.end >= s.start, f"step spans out of order at {s.start}"
            for i in range(s.start, s.end):
                covered[i] = 1
            pos = s.end
        assert covered == list(self.loss_mask), "steps do not tile the generated tokens"
        assert self.rollout_logprobs is None or len(self.rollout_logprobs) == sum(covered), \
            "rollout_logprobs and the policy tokens differ in number"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Trajectory":
        d = dict(d)
        d["steps"] = [Step(**s) for s in d.get("steps", [])]
        return cls(**d)


def title_keys(hits: Sequence[str], titles: Sequence[str]) -> list[str | None]:
    """Each hit's normalised title, to compare with supporting titles; None for a document
    an LLM wrote (simulated search, self-search), whose title names what it was asked to
    write, not evidence it found."""
    return [None if simulated_id(h) else normalise_text(t) for h, t in zip(hits, titles)]


def group_indices(trajectories: Sequence[Trajectory]) -> dict[str, list[int]]:
    """group_id -> indices of its episodes (the rollouts of one question), in order."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(trajectories):
        groups[t.group_id].append(i)
    return groups


def write_trajectories(path: str | Path, trajectories: Iterable[Trajectory]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for t in trajectories:
            f.write(json.dumps(t.to_dict(), ensure_ascii=False) + "\n")


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x   # not nan


def _strings(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(v, str) for v in x)


def _index(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def checked_trajectory(obj: Any, path: str | Path, line: int, field: str = "", *,
                       labels: bool = False, tokens: bool = True) -> Trajectory:
    """One trajectory record checked field by field: a bad one raises `DataError` naming
    the file, line and field (never a traceback from deep in a forward pass, nor a string
    read as a list of characters). `labels=True` also checks each step's `value` is a
    label in [0, 1] or null (a label file's episodes). `tokens=False` leaves the token
    layout unchecked, for readers of the searches alone (the ranker's and the simulator's
    training data: logs from elsewhere may carry no tokens)."""
    at = f"{field}." if field else ""
    if not isinstance(obj, dict):
        raise DataError(f"expected a trajectory object, got {type(obj).__name__}",
                        path=str(path), line=line, field=field or None)
    steps = obj.get("steps", [])
    if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
        raise DataError("expected a list of step objects", path=str(path), line=line,
                        field=at + "steps")
    try:
        t = Trajectory.from_dict(obj)
    except (TypeError, ValueError) as err:
        raise DataError(f"not a trajectory ({err})", path=str(path), line=line,
                        field=field or None) from None

    def bad(what: str, name: str) -> DataError:
        return DataError(what, path=str(path), line=line, field=at + name)

    for name in ("example_id", "group_id", "question", "dataset", "finish_reason"):
        if not isinstance(getattr(t, name), str):
            raise bad(f"expected a string, got {getattr(t, name)!r}", name)
    if t.answer is not None and not isinstance(t.answer, str):
        raise bad(f"expected a string or null, got {t.answer!r}", "answer")
    for name in ("golden_answers", "gold_doc_ids"):
        if not _strings(getattr(t, name)):
            raise bad(f"expected a list of strings, got {getattr(t, name)!r:.80}", name)
    for name in ("prompt_hits", "prompt_hit_titles"):
        if getattr(t, name) is not None and not _strings(getattr(t, name)):
            raise bad("expected a list of strings or null", name)
    if tokens:
        if not isinstance(t.token_ids, list) or not all(
                _index(x) and x >= 0 for x in t.token_ids):
            raise bad("expected a list of token ids (integers >= 0)", "token_ids")
        if not isinstance(t.loss_mask, list) or not all(
                x in (0, 1) and not isinstance(x, bool) for x in t.loss_mask):
            raise bad("expected a list of 0s and 1s", "loss_mask")
        if t.rollout_logprobs is not None and not (isinstance(t.rollout_logprobs, list)
                                                   and all(map(is_number, t.rollout_logprobs))):
            raise bad("expected a list of numbers or null", "rollout_logprobs")
        if not isinstance(t.prompt_len, int) or not 0 <= t.prompt_len <= len(t.token_ids):
            raise bad(f"expected 0..{len(t.token_ids)}, got {t.prompt_len!r}", "prompt_len")
    for name in ("outcome_reward", "outcome_part"):
        if getattr(t, name) is not None and not is_number(getattr(t, name)):
            raise bad(f"expected a number or null, got {getattr(t, name)!r}", name)
    if not (_index(t.sample_index) and t.sample_index >= 0):
        raise bad(f"expected an integer >= 0, got {t.sample_index!r:.80}", "sample_index")
    if not isinstance(t.metadata, dict):
        raise bad(f"expected an object, got {type(t.metadata).__name__}", "metadata")
    titles = t.metadata.get("supporting_titles")   # the ranker's and simulator's gold titles
    if titles is not None and not (isinstance(titles, str) or _strings(titles)):
        raise bad(f"expected a list of titles (strings), one title or null, got "
                  f"{titles!r:.80}", "metadata.supporting_titles")
    for i, s in enumerate(t.steps):
        if tokens and not (isinstance(s.start, int) and isinstance(s.end, int)
                           and t.prompt_len <= s.start <= s.end <= len(t.token_ids)):
            raise bad(f"step {i}: span [{s.start!r}, {s.end!r}) is not a span of the "
                      f"{len(t.token_ids)} tokens after the prompt", "steps")
        if tokens and (s.info_start is not None or s.info_end is not None):
            # the environment's block sits after the step and before the next one
            # (`continue_from` cuts an episode at info_end: a wrong one cut mid-turn)
            after = t.steps[i + 1].start if i + 1 < len(t.steps) else len(t.token_ids)
            after = after if isinstance(after, int) else len(t.token_ids)
            if not (_index(s.info_start) and _index(s.info_end) and isinstance(s.end, int)
                    and s.end <= s.info_start <= s.info_end <= after):
                raise bad(f"step {i}: information block [{s.info_start!r}, {s.info_end!r}) is "
                          f"not between the step's end ({s.end!r}) and the next step's start "
                          f"({after})", "steps.info_start")
        if not isinstance(s.action, str) or not s.action:   # a tool's name is one too
            raise bad(f"step {i}: expected search, answer, invalid or a tool's name, got "
                      f"{s.action!r}", "steps.action")
        for name in ("text", "query", "answer", "reason"):
            v = getattr(s, name)
            if not (isinstance(v, str) or (v is None and name != "text")):
                raise bad(f"step {i}: expected a string, got {v!r:.80}", f"steps.{name}")
        for name in ("hits", "hit_titles", "sub_queries"):
            if not _strings(getattr(s, name)):
                raise bad(f"step {i}: expected a list of strings, got "
                          f"{getattr(s, name)!r:.80}", f"steps.{name}")
        if s.block_hits is not None and not _strings(s.block_hits):
            raise bad(f"step {i}: expected a list of strings or null", "steps.block_hits")
        if not (isinstance(s.sub_hits, list) and all(map(_strings, s.sub_hits))):
            raise bad(f"step {i}: expected a list of lists of strings", "steps.sub_hits")
        for name in ("process_reward", "value"):
            v = getattr(s, name)
            if v is not None and not is_number(v):
                raise bad(f"step {i}: expected a number or null, got {v!r:.80}", f"steps.{name}")
        if not (isinstance(s.process_parts, dict) and all(
                isinstance(k, str) and (v is None or is_number(v))
                for k, v in s.process_parts.items())):
            raise bad(f"step {i}: expected an object of numbers or nulls, got "
                      f"{s.process_parts!r:.80}", "steps.process_parts")
        if labels and s.value is not None and not (is_number(s.value) and 0.0 <= s.value <= 1.0):
            raise bad(f"step {i}: expected a label in [0, 1] or null, got {s.value!r}",
                      "steps.value")
    if tokens:
        try:
            t.check()
        except (AssertionError, TypeError) as err:
            raise bad(f"the steps do not match the token layout ({err})", "steps") from None
    node_ids = t.metadata.get("node_ids")
    if node_ids is not None and (not isinstance(node_ids, list)
                                 or len(node_ids) != len(t.steps) or not all(
                                     n is None or isinstance(n, (int, str)) for n in node_ids)):
        raise bad(f"expected a list of {len(t.steps)} node ids (one per step)",
                  "metadata.node_ids")
    return t


def iter_trajectories(path: str | Path, *, tokens: bool = True) -> Iterator[Trajectory]:
    """The trajectories of a JSONL file, each checked (`checked_trajectory`; `tokens=False`:
    not their token layout)."""
    for line_no, obj in iter_jsonl(path):
        yield checked_trajectory(obj, path, line_no, tokens=tokens)


def read_trajectories(path: str | Path, *, tokens: bool = True) -> list[Trajectory]:
    return list(iter_trajectories(path, tokens=tokens))
