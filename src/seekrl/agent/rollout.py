"""The batched multi-turn rollout engine.

All active episodes generate their next turn together; all search queries of that turn go
to the retriever in one batched call; each episode then gets its `<information>` block (or
a correction after an invalid action) and goes on. Finished episodes leave the batch and
waiting ones take their place, so the batch stays full. With `continuous` (a backend with
rows, the static one) an episode rejoins the decoding batch as soon as its own turn is
taken, not at the next turn boundary. The result is one `Trajectory` per episode with the
token ids, the loss mask and one `Step` per model turn.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch
from pydantic import BaseModel, Field

from seekrl.agent.backends import Backend, Generated, Sampling
from seekrl.agent.protocol import (
    INFORMATION,
    PROMPTS,
    PromptStyle,
    build_prompt,
    format_hits,
    invalid_block,
    parse_action,
    plain_answer,
    prompt_style,
    split_queries,
)
from seekrl.agent.tools import ToolCall, make_tools
from seekrl.agent.trajectory import Step, Trajectory
from seekrl.config import DATA_PROMPT, EpisodeSettings, build_config
from seekrl.data.qa import QAExample
from seekrl.retrieval.base import Hit, Retriever


def _run_jobs(jobs: list[tuple[Any, list[ToolCall]]]) -> list[list]:
    """Each tool's results for its calls, in order. An error raised inside a tool goes on
    up (a broken tool must not train on made-up results) with a note naming the tool and
    the call's argument, which its own message may not (a plug-in's)."""
    out = []
    for tool, tool_calls in jobs:
        try:
            out.append(tool.call(tool_calls))
        except Exception as err:
            args = ", ".join(repr(c.argument[:60]) for c in tool_calls[:3])
            err.add_note(f"raised by the tool <{tool.tag}> ({type(tool).__name__}.call) on "
                         f"{len(tool_calls)} call(s): {args}"
                         + (", ..." if len(tool_calls) > 3 else ""))
            raise
    return out


class RolloutConfig(EpisodeSettings):
    """The engine's settings: the episode settings of a `rollout:` section (the same names,
    defaults and ranges: `seekrl.config.EpisodeSettings`) and one run's choices."""
    n_samples: int = Field(1, ge=1)  # rollouts per question (the GRPO group size)
    greedy: bool = False
    seed: int = 0

    @classmethod
    def of(cls, section: BaseModel | None = None, **run: Any) -> RolloutConfig:
        """The engine's settings from a config section: the episode settings it holds (all
        of a `rollout:` section's, the limits an `eval:` section sets, those it leaves null
        left out; None: the defaults) with `run` on top (`seed`, `n_samples`, `greedy`,
        settings the section lacks). A bad value is a `ConfigError` that names the
        setting."""
        own = {k: getattr(section, k) for k in EpisodeSettings.model_fields
               if k in getattr(type(section), "model_fields", {})
               and getattr(section, k) is not None}
        return build_config(cls, {**own, **run}, source="rollout settings")


def environment_ids(tokenizer, text: str) -> list[int]:
    """Tokens of text the environment inserts (documents, corrections) read as plain text:
    a corpus line holding "<|im_end|>" would otherwise put a real end-of-turn token in the
    policy's context. Rollouts and SFT's information blocks encode with this alike."""
    return tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)


def information_ids(encode: Callable[[str], list[int]], body: str, max_tokens: int,
                    sections: Sequence[str] = ()) -> list[int]:
    """An `<information>` block as the policy sees it: head, body and tail tokenised apart
    (so the body's tokens do not depend on the tags) and the body cut so the whole block
    fits `max_tokens`. The SFT warm-up tokenises oracle episodes with this too, so a
    trained policy reads exactly what it will read in a rollout.

    `sections`: the body's parts, one per sub-query (`body` is them joined by newlines).
    A body of several that does not fit is cut part by part: a part shorter than an equal
    share keeps all of it, and what it leaves goes to the longer ones, each cut to the
    same length; so the first sub-query's long documents do not push a later sub-query's
    out of the block unseen. A body that fits is tokenised whole, as one query's is."""
    return _information(encode, body, max_tokens, sections)[0]


def _information(encode: Callable[[str], list[int]], body: str, max_tokens: int,
                 sections: Sequence[str] = ()) -> tuple[list[int], bool]:
    """`information_ids`, and whether the body was cut."""
    head = encode(f"\n\n<{INFORMATION}>")
    tail = encode(f"</{INFORMATION}>\n\n")
    room = max(1, max_tokens - len(head) - len(tail))
    whole = encode(body)
    if len(whole) <= room or len(sections) < 2:
        return head + whole[:room] + tail, len(whole) > room
    newline = encode("\n")
    parts = [encode(section) for section in sections]
    left = max(len(parts), room - len(newline) * (len(parts) - 1))
    # water-filling: the largest length L with sum(min(len(p), L)) <= left
    cap, rest = left, sorted(map(len, parts))
    for i, n in enumerate(rest):
        even = left // (len(rest) - i)
        if n > even:
            cap = even
            break
        left -= n
    cut: list[int] = []
    for i, part in enumerate(parts):
        cut += (newline if i else []) + part[:max(1, cap)]
    return head + cut[:room] + tail, True


def shown_hits(hits: Sequence[Hit], full: str, shown: str, style: PromptStyle | None,
               same: Callable[[str], str] = lambda text: text) -> list[bool]:
    """Which of a search block's documents (numbered from 1 across the block) the policy
    got to read when the block was cut: those whose `Doc i (Title: ...)` line still
    starts a line of `shown` (the decoded body as cut; not anywhere in it: a sub-query's
    own `Query i:` line could spell one). A document whose line starts no line of `full`
    either (a tool that lays its results out another way) is counted as shown, as before
    any cut. `same`: the text as the tokenizer gives it back (`decode(encode(text))`: a
    tokenizer may normalise a title's characters or spaces), applied to the lines and to
    `full` alike."""
    style = style or PROMPTS["seekrl"]
    full, shown = "\n" + same(full), "\n" + shown
    out = []
    for i, h in enumerate(hits, 1):
        line = "\n" + same(style.doc_line(i, h, text=False).rstrip())
        out.append(line not in full or line in shown)
    return out


def require_own_prompts(examples: Sequence[QAExample], source: str = "") -> None:
    """`prompt: data` plays each question with its own prompt: every one must carry one."""
    missing = [ex.id for ex in examples if ex.prompt is None]
    if missing:
        raise ValueError(
            f"prompt: {DATA_PROMPT!r} plays each question with its own prompt, but "
            f"{len(missing)} of {len(examples)} questions{' of ' + source if source else ''} "
            f"carry none (first: {missing[0]!r}); give the data a prompt column or key, or "
            f"name a prompt (seekrl, search_r1, file:PATH, a template)")


class _Episode:
    def __init__(self, traj: Trajectory, gold: set[str]):
        self.traj = traj
        self.gold = gold
        self.turns = 0
        self.done = False
        self.seen: list[Hit] = []   # the documents its tools have shown, in order
        self.last: list[Hit] = []   # ... and its latest search's


def _gold_of(ex: QAExample) -> list[str]:
    ids = ex.metadata.get("gold_doc_ids") or []
    return list(dict.fromkeys(ids))


def _one_each(backend, outs, n: int):
    """A backend's generations, checked to be one per context given: a backend returning
    fewer left episodes unadvanced (or an IndexError), and zip would hide it."""
    outs = list(outs)
    if len(outs) != n:
        raise RuntimeError(f"backend {type(backend).__name__}.generate returned {len(outs)} "
                           f"generations for {n} contexts; expected one per context")
    return outs


class RolloutEngine:
    """Runs episodes for a policy backend against a retriever, with a `RolloutConfig` (or a
    config's `rollout:` section, `RolloutSettings`, as one sample per question, seed 0)."""

    def __init__(self, backend: Backend, tokenizer, retriever: Retriever | None,
                 cfg: EpisodeSettings | None = None):
        if not isinstance(backend, Backend):
            raise TypeError(f"backend: expected a seekrl.agent.backends.Backend (generate, "
                            f"reset, sync_weights, sleep), got {type(backend).__name__}")
        self.backend = backend
        self.tokenizer = tokenizer
        self.retriever = retriever
        # a config's `rollout:` section plays as it is (one sample, seed 0)
        self.cfg = cfg if isinstance(cfg, RolloutConfig) else RolloutConfig.of(cfg)
        self.style = prompt_style(self.cfg.prompt)
        # the agent's tools by tag: search (with a retriever), then rollout.tools
        self.tools = make_tools(self.cfg.tools, retriever=retriever, k=self.cfg.topk,
                                style=self.style, snippet_words=self.cfg.snippet_words,
                                max_queries=self.cfg.max_queries) \
            if self.cfg.method == "agent" else {}
        self._tool_text = " ".join(t.instruction for t in self.tools.values() if t.instruction)
        # the documents the tools showed since the last `run`, by id, when a tool reads
        # them (continuations get theirs back); `run` starts afresh, so it stays one step's
        self._shown: dict[str, Hit] = {}
        self._keep_shown = any(not t.counts_as_search for t in self.tools.values())
        policy = getattr(backend, "model", None)
        if isinstance(policy, torch.nn.Module):   # an episode must fit a sliding window
            from seekrl.models import check_window

            check_window(policy, self.cfg.max_total_tokens)
        # the tokens a backend ends a turn on (kept in the ids, left out of the text)
        self._end_ids = set(getattr(backend, "stop_ids", None) or ()) | {
            i for i in (getattr(tokenizer, "eos_token_id", None),
                        getattr(tokenizer, "pad_token_id", None)) if i is not None}
        if self.cfg.method != "direct" and retriever is None and not (
                self.cfg.self_search and self.cfg.method == "agent"):
            raise ValueError(f"method {self.cfg.method!r} needs a retriever")

    # ---- token helpers
    def _encode(self, text: str) -> list[int]:
        """What the environment writes (documents, messages) as plain text: a special
        token's name inside a document is not that token (`environment_ids`)."""
        return environment_ids(self.tokenizer, text)

    def information_ids(self, hits: Sequence[Hit]) -> list[int]:
        """The `<information>` block as tokens, its documents cut to `max_info_tokens`."""
        return information_ids(self._encode, format_hits(hits, self.style),
                               self.cfg.max_info_tokens)

    def _document_ids(self, hits: Sequence[Hit], budget: int) -> list[int]:
        ids = self._encode(format_hits(hits, self.style))
        if len(ids) <= budget:
            return ids
        ids = ids[:max(1, budget)]
        # not inside a character: its first bytes alone decode to U+FFFD, which the
        # prompt's text would then hold
        while len(ids) > 1 and self.tokenizer.decode(ids).endswith("\ufffd"):
            ids = ids[:-1]
        return ids

    # ---- the loop
    def run(self, examples: Sequence[QAExample], *, dataset: str = "",
            on_finish: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
        torch.manual_seed(self.cfg.seed)
        self._shown = {}
        episodes = [_Episode(t, set(t.gold_doc_ids))
                    for t in self.prompt_episodes(examples, self.cfg.n_samples, dataset=dataset)]
        return self._play(episodes, on_finish)

    def prompt_episodes(self, examples: Sequence[QAExample], n_samples: int = 1, *,
                        dataset: str = "") -> list[Trajectory]:
        """`n_samples` not yet started episodes per question: the prompt and nothing else
        (`continue_from((t, 0), n)` plays them; MCTS roots are such episodes)."""
        cfg = self.cfg
        prompts, prompt_hits = self._prompts(examples)
        out: list[Trajectory] = []
        for ex, prompt_ids, hits in zip(examples, prompts, prompt_hits):
            meta = {k: v for k, v in ex.metadata.items() if k != "chain"}
            rag = cfg.method == "rag"   # the documents in the prompt count as retrieved
            for s in range(n_samples):
                out.append(Trajectory(example_id=ex.id, group_id=ex.id, question=ex.question,
                                      golden_answers=list(ex.golden_answers),
                                      token_ids=list(prompt_ids), loss_mask=[0] * len(prompt_ids),
                                      prompt_len=len(prompt_ids), sample_index=s,
                                      dataset=dataset, metadata=dict(meta),
                                      gold_doc_ids=_gold_of(ex), rollout_logprobs=[],
                                      prompt_hits=[h.doc_id for h in hits] if rag else None,
                                      prompt_hit_titles=[h.title for h in hits] if rag
                                      else None))
        return out

    def continue_from(self, prefixes: Sequence[tuple[Trajectory, int]], n_samples: int = 1,
                      *, seed: int | None = None) -> list[list[Trajectory]]:
        """Resume many partial episodes at once: for each `(trajectory, k)`, `n_samples`
        continuations of its first `k` steps (with the environment's block after step k),
        played to the end with this engine's settings. Returns one list per prefix.

        A continuation is a new `Trajectory` holding the prefix's tokens and steps (copied,
        process fields cleared) and what was generated after them; its `prefix_steps` is `k`
        and its `prefix_tokens` the tokens the policy decoded for the prefix (`n_decoded`'s
        share), so a caller can count only the tokens generated now. Continuations of one
        prefix have equal contexts and the backend prefills them once; greedy continuation
        of a greedy episode's prefix reproduces that episode. `k = 0` starts again from the
        prompt; step k must have an environment block after it (the episode went on from
        it)."""
        torch.manual_seed(self.cfg.seed if seed is None else seed)
        episodes: list[_Episode] = []
        for t, k in prefixes:
            if not 0 <= k <= len(t.steps):
                raise ValueError(f"continue_from: episode {t.example_id!r} has {len(t.steps)} "
                                 f"steps; cannot continue after step {k}")
            if k and t.steps[k - 1].info_end is None:
                raise ValueError(f"continue_from: step {k} of {t.example_id!r} ended the episode "
                                 f"({t.steps[k - 1].action}, no environment block after it); "
                                 "nothing follows it")
            cut = t.steps[k - 1].info_end if k else t.prompt_len
            for j in range(n_samples):
                steps = [replace(s, hits=list(s.hits), hit_titles=list(s.hit_titles),
                                 process_reward=None, process_parts={}, value=None)
                         for s in t.steps[:k]]
                policy_tokens = sum(t.loss_mask[:cut])
                decoded = policy_tokens + sum(s.info_generated for s in t.steps[:k])
                traj = replace(t, token_ids=list(t.token_ids[:cut]),
                               loss_mask=list(t.loss_mask[:cut]), steps=steps, answer=None,
                               finish_reason="", outcome_reward=None, outcome_part=None,
                               sample_index=j, metadata=copy.deepcopy(t.metadata),
                               prefix_steps=k, prefix_tokens=decoded,
                               gold_doc_ids=list(t.gold_doc_ids),
                               rollout_logprobs=None if t.rollout_logprobs is None
                               else list(t.rollout_logprobs[:policy_tokens]))
                e = _Episode(traj, set(traj.gold_doc_ids))
                e.turns = k
                self._restore_shown(e)
                episodes.append(e)
        self._play(episodes)
        return [[e.traj for e in episodes[i * n_samples:(i + 1) * n_samples]]
                for i in range(len(prefixes))]

    def _play(self, episodes: list[_Episode],
              on_finish: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
        cfg = self.cfg
        sampling = Sampling(greedy=cfg.greedy, temperature=cfg.temperature, top_p=cfg.top_p,
                            stop=tuple(f"</{tag}>" for tag in self.tools if tag != "search"))
        # self-search decodes its blocks with `generate`, which a session's rows would lose
        if cfg.continuous and not cfg.self_search and callable(
                getattr(self.backend, "admit", None)):
            return self._play_continuous(episodes, sampling, on_finish)
        try:
            return self._play_batches(episodes, sampling, on_finish)
        finally:   # cached episodes go even when a turn raised: their keys are ids, reused
            self.backend.reset()

    def _play_batches(self, episodes: list[_Episode], sampling: Sampling,
                      on_finish: Callable[[Trajectory], None] | None) -> list[Trajectory]:
        cfg = self.cfg
        waiting = list(range(len(episodes)))[::-1]
        active: list[int] = []
        while waiting or active:
            while waiting and len(active) < cfg.batch_size:
                active.append(waiting.pop())
            batch = [episodes[i] for i in active]
            rooms = [self._room(e) for e in batch]
            for e, room in zip(batch, rooms):
                if room <= 0:
                    self._finish(e, "length")
            go = [(e, room) for e, room in zip(batch, rooms) if room > 0]
            if go:
                outs = _one_each(self.backend, self.backend.generate(
                    [e.traj.token_ids for e, _ in go], max(room for _, room in go), sampling,
                    keys=[id(e) for e, _ in go]), len(go))
                # each row keeps only what fits its own length budget
                self._take_turn([e for e, _ in go],
                                [Generated(new, getattr(new, "logprobs", None)).cut(room)
                                 for (_, room), new in zip(go, outs)])
            for e in batch:
                if e.done and on_finish is not None:
                    on_finish(e.traj)
            active = [i for i in active if not episodes[i].done]
        return [e.traj for e in episodes]

    def _play_continuous(self, episodes: list[_Episode], sampling: Sampling,
                         on_finish: Callable[[Trajectory], None] | None) -> list[Trajectory]:
        """`_play` on a backend's rows (`open`, `admit`, `run`, `release`): an episode whose
        turn ended takes it (tool calls batched with the others that ended with it) and
        rejoins the decoding rows at once, without waiting for the slowest row of a
        turn; a finished episode's row goes to the next waiting one.

        Where every tool may run beside the decoding (`concurrent`), the tool calls of the
        rows that ended at one `run` go to a worker thread while the next `run` decodes
        the other rows; those rows rejoin right after it (rows without a call, finished
        ones included, go on at once). The point where they rejoin does not depend on how
        long the tools took, so a run is as reproducible as without the thread."""
        cfg, backend = self.cfg, self.backend
        waiting = episodes[::-1]
        ready: list[_Episode] = []   # between turns: their rows held, next context complete
        decoding: dict[int, tuple[_Episode, int]] = {}   # key -> (episode, its turn's room)
        fetching: list[tuple[list[_Episode], dict, Any]] = []   # rows whose tools run
        backend.open(max(1, min(cfg.batch_size, len(episodes))), cfg.max_new_tokens, sampling)
        worker = None
        if all(getattr(tool, "concurrent", False) for tool in self.tools.values()):
            from concurrent.futures import ThreadPoolExecutor

            worker = ThreadPoolExecutor(1, thread_name_prefix="seekrl-tools")

        def leave(e: _Episode) -> None:   # a finished episode's row goes to the next one
            backend.release(id(e))
            if on_finish is not None:
                on_finish(e.traj)

        def rejoin(batch: list[_Episode]) -> None:
            for e in batch:
                if e.done:
                    leave(e)
                else:
                    ready.append(e)

        try:
            while True:
                go = []
                held = sum(len(b) for b, *_ in fetching)
                while ready or (waiting and len(decoding) + len(go) + held < cfg.batch_size):
                    e = ready.pop() if ready else waiting.pop()
                    room = self._room(e)
                    if room > 0:
                        go.append((e, room))
                        continue
                    self._finish(e, "length")
                    leave(e)
                if go:
                    backend.admit([id(e) for e, _ in go], [e.traj.token_ids for e, _ in go],
                                  [room for _, room in go])
                    decoding.update((id(e), (e, room)) for e, room in go)
                if not decoding and not fetching:
                    break
                ended = backend.run()
                for batch, calls, future in fetching:   # fetched while it ran
                    self._apply_tools(batch, calls, future.result(), [])
                    rejoin(batch)
                fetching = []
                rows = [decoding.pop(key) for key, _ in ended]
                batch = [e for e, _ in rows]
                outs = [new.cut(room) for (_, room), (_, new) in zip(rows, ended)]
                if worker is None or not batch:
                    self._take_turn(batch, outs)
                    rejoin(batch)
                    continue
                calls, self_search = self._record_turns(batch, outs)
                # only rows with tool calls wait for the thread: a finished row's slot and
                # a row that answered, erred or searched itself go on before the next run
                pending = {id(e) for called in calls.values() for e, _ in called}
                now = [e for e in batch if id(e) not in pending]
                self._apply_tools(now, {}, [], self_search)
                rejoin(now)
                later = [e for e in batch if id(e) in pending]
                if later:
                    fetching.append((later, calls,
                                     worker.submit(_run_jobs, self._tool_jobs(calls))))
        finally:
            if worker is not None:
                worker.shutdown(wait=True, cancel_futures=True)
            backend.reset()   # ends the session, frees the cached episodes
        return [e.traj for e in episodes]

    def _room(self, e: _Episode) -> int:
        """The tokens an episode's next turn may generate: the turn limit, or what is left
        of its length budget."""
        return min(self.cfg.max_new_tokens, self.cfg.max_total_tokens - len(e.traj.token_ids))

    def _prompts(self, examples: Sequence[QAExample]
                 ) -> tuple[list[list[int]], list[Sequence[Hit]]]:
        cfg = self.cfg
        own = cfg.prompt == DATA_PROMPT and cfg.method == "agent"
        if own:
            require_own_prompts(examples)
        hits_per: list[Sequence[Hit]] = [()] * len(examples)
        if cfg.method == "rag":  # one retrieval with the question, before the only turn
            questions = [ex.question for ex in examples]
            simulated = getattr(self.retriever, "search_with_context", None)
            if simulated is not None:   # a simulated engine writes from the question and
                # answer, as it does for the agent's searches (`SearchTool`)
                hits_per = simulated(questions, cfg.topk, questions,
                                     [ex.golden_answers[0] if ex.golden_answers else None
                                      for ex in examples])
            else:
                hits_per = self.retriever.search(questions, cfg.topk)
        prompts, shown_per = [], []
        for ex, hits in zip(examples, hits_per):
            documents = None
            if cfg.method == "rag":  # the same token budget as an <information> block
                full = format_hits(hits, self.style)
                ids = self._document_ids(hits, cfg.max_info_tokens)
                documents = self.tokenizer.decode(ids)
                if len(ids) < len(self._encode(full)):   # cut: credit what is shown, as a search
                    read = shown_hits(hits, full, documents, self.style, self._round_trip)
                    hits = [h for h, ok in zip(hits, read) if ok]
            shown_per.append(hits)
            text = build_prompt(self.tokenizer, ex.question, cfg.method, documents=documents,
                                style=self.style, messages=ex.prompt if own else None,
                                tools=self._tool_text)
            if documents and any(s in documents for s in self.tokenizer.all_special_tokens):
                # a document naming a special token: its text stays text, the template's
                # own tokens around it are the template's (encoded whole, "<|im_end|>" in a
                # document was a real end of turn)
                before, _, after = text.partition(documents)
                prompts.append(self.tokenizer.encode(before, add_special_tokens=False)
                               + self._encode(documents)
                               + self.tokenizer.encode(after, add_special_tokens=False))
            else:
                prompts.append(self.tokenizer.encode(text, add_special_tokens=False))
        return prompts, shown_per

    def _take_turn(self, batch: list[_Episode], outs: list[Generated]) -> None:
        """Record each episode's turn, call the tools its actions named (each tool once
        for the batch) and append what they returned."""
        calls, self_search = self._record_turns(batch, outs)
        jobs = self._tool_jobs(calls)
        self._apply_tools(batch, calls, _run_jobs(jobs), self_search)

    def _record_turns(self, batch: list[_Episode], outs: list[Generated]
                      ) -> tuple[dict[str, list[tuple[_Episode, Step]]], list[tuple[_Episode, Step]]]:
        """Append each episode's generated turn and its `Step`; an answer or the last turn
        ends the episode. The tool calls to make (by tag) and the self-search blocks to
        write."""
        cfg = self.cfg
        calls: dict[str, list[tuple[_Episode, Step]]] = {}
        self_search: list[tuple[_Episode, Step]] = []   # SSRL: the policy writes the block
        for e, new in zip(batch, outs):
            t = e.traj
            e.turns += 1
            start = len(t.token_ids)
            t.token_ids.extend(new)
            t.loss_mask.extend([1] * len(new))
            if t.rollout_logprobs is not None:   # one turn without them: none for the episode
                if new.logprobs is None or len(new.logprobs) != len(new):
                    t.rollout_logprobs = None
                else:
                    t.rollout_logprobs.extend(new.logprobs)
            # A turn that ends on the end-of-turn token keeps it, trained (mask 1): a turn of
            # nothing but EOS is then still a step with a token to carry its credit, and the
            # policy learns not to end a turn without acting. The text leaves it out.
            body = new[:-1] if new and new[-1] in self._end_ids else new
            text = self.tokenizer.decode(body, skip_special_tokens=False)
            action = parse_action(text, tuple(self.tools) or ("search",), cfg.max_queries)
            searched = action.kind == "search"
            if cfg.method != "agent" and searched:
                action = type(action)("invalid", "no search in this mode")
            elif action.kind == "search" and cfg.max_queries > 1:
                problem = split_queries(action.text, cfg.max_queries)[1]
                if problem is not None:   # a malformed multi-query turn: corrected, not run
                    action = type(action)("invalid", problem)
            tool = self.tools.get(action.kind)
            if cfg.self_search and action.kind == "search":
                tool = _SELF_SEARCH
            kind = "search" if tool is not None and tool.counts_as_search else action.kind
            step = Step(start=start, end=len(t.token_ids), action=kind, text=text)
            t.steps.append(step)
            if action.kind == "answer":
                step.answer = t.answer = action.text
                self._finish(e, "answer")
                continue
            last_turn = cfg.method != "agent" or e.turns >= cfg.max_turns
            if tool is not None:
                step.query = action.text
                # on the last allowed turn nothing would show the result to the policy:
                # such a call is not run, and a search so earns no evidence credit
                if not last_turn:
                    if tool is _SELF_SEARCH:
                        self_search.append((e, step))
                    else:
                        calls.setdefault(action.kind, []).append((e, step))
            else:
                step.reason = action.text
                if cfg.method != "agent" and not searched:
                    # One-turn methods: an untagged reply still is the model's answer (as
                    # FlashRAG scores direct / rag generation); the format stays invalid.
                    # A search asked for is no answer: its query would be scored as one.
                    t.answer = plain_answer(text) or None
            if last_turn:
                self._finish(e, "max_turns")
        return calls, self_search

    def _tool_jobs(self, calls: dict[str, list[tuple[_Episode, Step]]]
                   ) -> list[tuple[Any, list[ToolCall]]]:
        """Each tool with its batch of calls, built from the episodes as they stand (a
        job reads nothing of them after this, so it may run beside the decoding)."""
        return [(self.tools[tag], [ToolCall(s.query or "", e.traj.question, list(e.seen),
                                            list(e.last), list(e.traj.golden_answers))
                                   for e, s in pending])
                for tag, pending in calls.items()]

    def _apply_tools(self, batch: list[_Episode], calls: dict[str, list[tuple[_Episode, Step]]],
                     results_per_tool: list[list], self_search: list[tuple[_Episode, Step]]
                     ) -> None:
        """Append each tool result's `<information>` block (with its evidence credit), the
        self-search blocks, and the correction after an invalid action."""
        cfg = self.cfg
        for (tag, pending), results in zip(calls.items(), results_per_tool):
            tool = self.tools[tag]
            if len(results) != len(pending):
                raise RuntimeError(f"tool {tag!r} returned {len(results)} results for "
                                   f"{len(pending)} calls")
            for (e, step), result in zip(pending, results):
                # the budget is per query: a turn of n sub-queries may show n times as much
                ids, cut = _information(self._encode, result.text,
                                        cfg.max_info_tokens * max(1, len(result.sub_queries)),
                                        result.sections)
                # documents count as retrieved only when the policy gets to read them: a
                # block that does not fit ends the episode and credits nothing
                if not self._append_env(e, step, ids):
                    continue
                read = self._read(result, ids) if cut and tool.counts_as_search else None
                hits = result.hits if read is None else \
                    [h for h, ok in zip(result.hits, read) if ok]
                e.seen.extend(hits)
                if self._keep_shown:   # every document of the block, for its numbering
                    self._shown.update((h.doc_id, h) for h in result.hits)
                if tool.counts_as_search:
                    e.last = list(result.hits)   # numbered as the block numbers them
                    step.hits = [h.doc_id for h in hits]
                    step.hit_titles = [h.title for h in hits]
                    step.gold_hit = bool(e.gold & set(step.hits)) if e.gold else None
                    step.sub_queries = list(result.sub_queries)
                    if read is None:
                        step.sub_hits = [[h.doc_id for h in hs] for hs in result.sub_hits]
                    else:   # by position: a document can be in two sub-queries' lists
                        step.block_hits = [h.doc_id for h in result.hits]
                        marks = iter(read)
                        step.sub_hits = [[h.doc_id for h in hs if next(marks)]
                                         for hs in result.sub_hits]
        if self_search:
            self._write_own_information(self_search)
        for e in batch:
            step = e.traj.steps[-1]
            if not e.done and step.action == "invalid":
                self._append_env(e, step, self._encode(invalid_block(step.reason or "", self.style)))

    def _write_own_information(self, pending: list[tuple[_Episode, Step]]) -> None:
        """Self-search (SSRL): the environment opens `<information>`, the policy writes the
        documents it expects (up to `max_info_tokens` in all, stopping at the closing tag)
        and the environment closes the block. Every token of the block has loss mask 0,
        as SSRL's released scripts mask it: the policy is trained on when and what to search
        and on answering, not on reproducing documents (which would teach it to trust its
        own inventions as evidence); its documents are parsed into the step's hits (ids
        `sim-...`, no corpus document, so no evidence credit). The tokens it decoded are
        the step's `info_generated`: compute a rollout-token budget counts."""
        from seekrl.retrieval.simulated import document_id, parse_documents

        cfg = self.cfg
        head = self._encode(f"\n\n<{INFORMATION}>")
        close = f"</{INFORMATION}>"
        tail = self._encode(f"{close}\n\n")
        budget = max(1, cfg.max_info_tokens - len(head) - len(tail))
        sampling = Sampling(greedy=cfg.greedy, temperature=cfg.temperature, top_p=cfg.top_p,
                            stop=(close,))
        outs = _one_each(self.backend, self.backend.generate(
            [e.traj.token_ids + head for e, _ in pending], budget, sampling,
            keys=[id(e) for e, _ in pending]), len(pending))
        for (e, step), new in zip(pending, outs):
            step.info_generated = len(new)   # decoded, whatever of it the block keeps
            body = list(new[:budget])
            while body and body[-1] in self._end_ids:   # an EOS does not end the block
                body.pop()
            text = self.tokenizer.decode(body, skip_special_tokens=False)
            if close in text:   # the policy closed it: keep its documents, the close is ours
                text = text[:text.index(close)]
                body = self._encode(text)
            if not self._append_env(e, step, head + body + tail):
                continue
            docs, _ = parse_documents(text, cfg.topk)
            step.hits = [document_id(t, x) for t, x in docs]
            step.hit_titles = [t for t, _ in docs]
            step.gold_hit = bool(e.gold & set(step.hits)) if e.gold else None

    def _restore_shown(self, e: _Episode) -> None:
        """A continuation's tools see the documents its copied steps were shown (those this
        engine showed: a tool that reads documents, `open`, finds no others)."""
        for s in e.traj.steps:
            if s.action == "search" and s.info_end is not None:
                # numbered as its block numbered them, cut documents too; seen: those shown
                block = s.block_hits if s.block_hits is not None else s.hits
                e.last = [self._shown[i] for i in block if i in self._shown]
                e.seen.extend(self._shown[i] for i in s.hits if i in self._shown)

    def _read(self, result, ids: list[int]) -> list[bool]:
        """Which of a search result's documents the block `ids`, cut to its budget, shows:
        a cut document earns no evidence credit and is not among the documents seen
        (`shown_hits`)."""
        head = len(self._encode(f"\n\n<{INFORMATION}>"))
        tail = len(self._encode(f"</{INFORMATION}>\n\n"))
        shown = self.tokenizer.decode(ids[head:len(ids) - tail], skip_special_tokens=False)
        return shown_hits(result.hits, result.text, shown, self.style, self._round_trip)

    def _round_trip(self, text: str) -> str:
        """`text` as the tokenizer gives it back (it may normalise characters or spaces)."""
        return self.tokenizer.decode(self._encode(text), skip_special_tokens=False)

    def _append_env(self, e: _Episode, step: Step, ids: list[int]) -> bool:
        """Append the environment's block after `step`; False (and the episode ends) when
        it does not fit the episode's token budget."""
        t = e.traj
        if len(t.token_ids) + len(ids) >= self.cfg.max_total_tokens:
            self._finish(e, "length")
            return False
        step.info_start = len(t.token_ids)
        t.token_ids.extend(ids)
        t.loss_mask.extend([0] * len(ids))
        step.info_end = len(t.token_ids)
        return True

    def _finish(self, e: _Episode, reason: str) -> None:
        e.done = True
        e.traj.finish_reason = reason


class _SelfSearch:
    """The tool of self-search: a search the policy answers itself (no retriever)."""
    tag = "search"
    counts_as_search = True


_SELF_SEARCH = _SelfSearch()


def grow_trees(engine: RolloutEngine, examples: Sequence[QAExample], branches: int, rounds: int,
               seed: int) -> list[Trajectory]:
    """Tree rollouts (Tree-GRPO style). `engine.cfg.n_samples` chains per question are the
    trees' first leaves; then, `rounds` times, each tree grows `branches` leaves, each the
    continuation of one of the tree's leaves cut after a step chosen at random among the
    tree's step boundaries (a search or invalid turn the episode went on from; the prompt
    when there is none). A leaf names its `tree`, the `parent` leaf it branched from and its
    `prefix_steps`; its shared prefix's tokens were generated once (`prefix_tokens`) but
    are trained in every leaf, so a prefix gets the summed
    credit of its leaves."""
    rng = random.Random(f"tree/{seed}")
    chains = engine.run(examples, dataset="train")
    leaves: dict[str, list[list[Trajectory]]] = {}
    for t in chains:
        t.tree, t.parent = t.sample_index, None
        leaves.setdefault(t.example_id, []).append([t])
    next_index = {ex_id: len(trees) for ex_id, trees in leaves.items()}
    for r in range(rounds):
        prefixes, owners = [], []
        for trees in leaves.values():
            for tree in trees:
                nodes = [(leaf, k) for leaf in tree for k in range(1, len(leaf.steps))
                         if k > leaf.prefix_steps]
                for _ in range(branches):
                    leaf, k = rng.choice(nodes) if nodes else (tree[0], 0)
                    prefixes.append((leaf, k))
                    owners.append(tree)
        grown = engine.continue_from(prefixes, 1, seed=seed + 500_009 * (r + 1))
        for (parent, _), tree, (child,) in zip(prefixes, owners, grown):
            child.tree, child.parent = parent.tree, parent.sample_index
            child.sample_index = next_index[child.example_id]
            next_index[child.example_id] += 1
            tree.append(child)
    return [leaf for trees in leaves.values() for tree in trees for leaf in tree]
