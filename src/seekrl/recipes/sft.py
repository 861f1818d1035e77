"""The SFT warm-up recipe: teach the protocol by imitating whole search episodes.

Reads trajectory JSONL in either form:
- oracle episodes (`seekrl oracle`): `{"question", "turns": [{"role": "assistant" |
  "information", "content"}], "oracle_complete"}`, tokenised here exactly as the rollout
  engine would build the episode (chat-template prompt, each `<information>` block's head,
  body and tail tokenised apart and cut to `max_info_tokens`, no EOS after `</answer>`);
- `Trajectory` records (`token_ids`, `loss_mask`), e.g. filtered rollouts, used as they are.

The loss is the mean negative log-likelihood over policy tokens only: the prompt and the
retrieved documents are context, never targets; with `plan_weight` the tokens of the first
thought's lookup plan ("I need 2 lookups") weigh that much in a weighted mean, and with
`balance_types` each epoch draws the question types in equal (or given) shares. Then, top
to bottom: load, (LoRA), AdamW with warm-up and cosine decay, gradient accumulation, dev EM
through the evaluation harness every `eval.every` steps, checkpoints, and `RUN_DIR/final`,
which `seekrl eval --model` loads like any Hugging Face model.
"""

from __future__ import annotations

import math
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from seekrl.agent.oracle import PLAN_LEAD
from seekrl.agent.protocol import (
    ANSWER,
    INFORMATION,
    PROMPTS,
    SEARCH,
    build_prompt,
    format_hits,
    parse_action,
    prompt_style,
    query_sections,
    split_queries,
    step_format_problem,
)
from seekrl.agent.rollout import environment_ids, information_ids
from seekrl.config import DATA_PROMPT, DEFAULT_MAX_INFO_TOKENS, SFTConfig, dump_config
from seekrl.data.jsonl import iter_jsonl
from seekrl.data.qa import prompt_messages
from seekrl.errors import ConfigError, DataError
from seekrl.eval.evaluate import eval_policy
from seekrl.models import collate, pad_id_of
from seekrl.recipes.checkpoint import (
    check_run_dir,
    claim_run_dir,
    config_changes,
    latest_checkpoint,
    save_policy,
    write_checkpoint,
    write_policy,
)
from seekrl.recipes.setup import (
    Interrupted,
    MetricsLog,
    check_eval_data,
    check_eval_index,
    clip_and_step,
    make_optimizer,
    make_scheduler,
    prepare_trainable,
    resume_training,
    set_seed,
    trainable_parameters,
    training_state,
)
from seekrl.retrieval.base import Hit
from seekrl.rl.forward import masked_logprobs
from seekrl.runtime import peak_rss_mb, trim_heap


@dataclass
class SFTExample:
    token_ids: list[int]
    loss_mask: list[int]
    source: str                    # "file:line", for error messages and the log
    metadata: dict | None = None   # the record's (question type, hops), for balance_types
    plan: tuple[int, int] | None = None   # [start, end) tokens of the lookup plan

    @cached_property
    def longest_turn(self) -> int:
        """The longest run of policy tokens: the episode's longest turn, in tokens."""
        longest = run = 0
        for m in self.loss_mask:
            run = run + 1 if m else 0
            longest = max(longest, run)
        return longest


def episode_limit_warning(examples: list[SFTExample], max_turns: int,
                          max_total_tokens: int) -> str | None:
    """A sentence when some episodes run past what a rollout plays: more policy turns than
    `max_turns` (the rollout stops before the answer) or more tokens than
    `max_total_tokens` (it drops the block that would pass them and ends); None when every
    episode fits. The policy learns endings its rollouts never reach."""
    def turns(e: SFTExample) -> int:
        return sum(1 for i, m in enumerate(e.loss_mask) if m and (i == 0 or not e.loss_mask[i - 1]))

    many = [e.source for e in examples if turns(e) > max_turns]
    long = [e.source for e in examples if len(e.token_ids) > max_total_tokens]
    if not many and not long:
        return None
    parts = []
    if many:
        parts.append(f"{len(many)} hold more than rollout.max_turns {max_turns} turns "
                     f"(first {many[0]})")
    if long:
        parts.append(f"{len(long)} run past rollout.max_total_tokens {max_total_tokens} "
                     f"(first {long[0]})")
    return (f"of {len(examples)} episodes, " + "; ".join(parts) + ": rollouts stop such "
            "episodes before their answer, so the policy learns endings it will not reach. "
            "Raise those limits (here and in RL) or leave such episodes out.")


def turn_limit_warning(examples: list[SFTExample], limit: int) -> str | None:
    """A sentence when some episodes hold a turn longer than `limit` tokens (the turn limit
    of the rollouts the policy will play): a policy that learns such turns is cut mid-turn
    by rollouts, and a cut turn is an invalid one. None when every turn fits."""
    over = [(e.longest_turn, e.source) for e in examples if e.longest_turn > limit]
    if not over:
        return None
    longest, where = max(over)
    return (f"{len(over)} of {len(examples)} episodes ({len(over) / len(examples):.0%}) hold "
            f"a turn longer than the turn limit of {limit} tokens (longest {longest} tokens, "
            f"{where}): rollouts cut such turns, so a policy that learns them writes invalid "
            f"ones. Raise the limit (rollout.max_new_tokens, here and in RL) or "
            f"shorten those turns.")


# the number and noun of the oracle's `count` plan ("To answer this I need 2 lookups"):
# the words that vary with the question; the lead is the same in every episode. The same
# pattern `Trajectory.planned_lookups` reads.
PLAN_PATTERN = re.compile(re.escape(PLAN_LEAD) + r"(\d+ lookups?)")


def plan_span(decode: Callable[[list[int]], str], token_ids: Sequence[int],
              loss_mask: Sequence[int]) -> tuple[int, int] | None:
    """[start, end) positions of the tokens that state the lookup plan ("2 lookups") in the
    episode's first policy turn, found in its decoded text and mapped back to tokens by the
    decoded length of each prefix: every token that holds a character of the plan. None
    when the first turn states no plan (`--plan none`, an episode the policy wrote)."""
    start = next((i for i, m in enumerate(loss_mask) if m), None)
    if start is None:
        return None
    stop = start
    while stop < len(loss_mask) and loss_mask[stop]:
        stop += 1
    turn = list(token_ids[start:stop])
    found = PLAN_PATTERN.search(decode(turn))
    if found is None:
        return None
    a, b = found.span(1)
    first = None
    for k in range(1, len(turn) + 1):   # the plan opens the turn: a few prefixes suffice
        n = len(decode(turn[:k]))
        if first is None and n > a:
            first = k - 1
        if n >= b:
            return start + first, start + k
    return None


def question_group(metadata: dict | None, by: str) -> str:
    """The label `balance_types` draws by: the question's `type` (single, bridge,
    comparison), its `hops` ("1", "2", "3") or both (`kind`, "bridge-2", as the RL logs
    name question kinds); "-" where the metadata does not say."""
    meta = metadata if isinstance(metadata, dict) else {}
    kind = str(meta.get("type", "-"))
    hops = meta.get("hops")
    hops = hops if isinstance(hops, int) and not isinstance(hops, bool) else None
    if by == "type":
        return kind
    if by == "hops":
        return "-" if hops is None else str(hops)
    return kind if hops is None else f"{kind}-{hops}"


def group_quotas(sizes: dict[str, int], total: int,
                 weights: dict[str, float] | None = None) -> dict[str, int]:
    """Episodes per group in a draw of `total`: shares by `weights` (equal when None),
    rounded by largest remainder so they sum to `total` (ties to the first label)."""
    shares = {g: float(weights[g]) if weights is not None else 1.0 for g in sorted(sizes)}
    norm = sum(shares.values())
    exact = {g: total * w / norm for g, w in shares.items()}
    quotas = {g: int(x) for g, x in exact.items()}
    by_remainder = sorted(exact, key=lambda g: (-(exact[g] - quotas[g]), g))
    for g in by_remainder[:total - sum(quotas.values())]:
        quotas[g] += 1
    return quotas


def balanced_draw(examples: list[SFTExample], by: str, weights: dict[str, float] | None,
                  rng: random.Random) -> list[SFTExample]:
    """One epoch's episodes (as many as there are), each group its quota (`group_quotas`):
    a group drawn without replacement, its whole pool again each time its quota passes its
    size, so a small group repeats and a large one is subsampled (other episodes each
    epoch). Uses nothing but `rng`, so a resumed run draws what a straight one would."""
    groups: dict[str, list[SFTExample]] = {}
    for e in examples:
        groups.setdefault(question_group(e.metadata, by), []).append(e)
    quotas = group_quotas({g: len(v) for g, v in groups.items()}, len(examples), weights)
    order: list[SFTExample] = []
    for g in sorted(groups):
        pool = groups[g]
        whole, rest = divmod(quotas[g], len(pool))
        for _ in range(whole):
            order += rng.sample(pool, len(pool))
        order += rng.sample(pool, rest)
    return order


def check_balance(examples: list[SFTExample], by: str,
                  weights: dict[str, float] | None) -> dict[str, int]:
    """The data's group sizes, after refusing weights that name groups the data lacks or
    leave out groups it has (a weight of 0 leaves a group out on purpose)."""
    sizes: dict[str, int] = {}
    for e in examples:
        hops = (e.metadata or {}).get("hops")
        if by != "type" and hops is not None and (not isinstance(hops, int)
                                                   or isinstance(hops, bool)):
            # "2" would join the unlabelled "-" group and be drawn with the wrong share
            raise DataError(f"expected an integer hop count, got {hops!r}", path=e.source,
                            field="metadata.hops")
        g = question_group(e.metadata, by)
        sizes[g] = sizes.get(g, 0) + 1
    if weights is not None:
        unknown = sorted(set(weights) - set(sizes))
        missing = sorted(set(sizes) - set(weights))
        if unknown or missing:
            raise ConfigError(
                f"type_weights: the episodes' {by} groups are {', '.join(sorted(sizes))}"
                + (f"; no episode is {', '.join(unknown)}" if unknown else "")
                + (f"; no weight for {', '.join(missing)} (0 leaves a group out)"
                   if missing else ""))
        if not any(weights[g] > 0 for g in sizes):
            raise ConfigError("type_weights: every weight is 0")
    return sizes


def episode_tokens(tokenizer, record: dict, *,
                   max_info_tokens: int = DEFAULT_MAX_INFO_TOKENS, where: str = "",
                   prompt: str = "seekrl", max_queries: int = 1, tools: Sequence[str] = (),
                   snippet_words: int | None = None) -> tuple[list[int], list[int]]:
    """(token_ids, loss_mask) of one oracle episode, laid out as a rollout with the same
    `prompt`, `max_queries`, `tools` and `snippet_words` settings would lay it out: its
    instruction with the tools', and the documents of each information turn in its style,
    cut to their snippets (from the turn's `hits`; a turn without them is used as written,
    which only `seekrl`'s document lines match)."""
    from seekrl.agent.tools import make_tools, tool_instructions

    style = prompt_style(prompt)
    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    question = record.get("question")
    turns = record.get("turns")
    if not isinstance(question, str) or not question.strip():
        raise DataError("expected a non-empty string", path=where, field="question")
    if not isinstance(turns, list) or not turns:
        raise DataError("expected a non-empty list of turns", path=where, field="turns")
    messages = None
    if prompt == DATA_PROMPT:
        messages = prompt_messages(record.get("prompt"), {"path": where})
        if messages is None:
            raise DataError(f"no prompt: {DATA_PROMPT!r} takes each episode's own prompt",
                            path=where, field="prompt")
    ids = encode(build_prompt(tokenizer, question, "agent", style=style, messages=messages,
                              tools=tool_instructions(tools, max_queries=max_queries,
                                                      style=style)))
    mask = [0] * len(ids)
    head, tail = f"<{INFORMATION}>", f"</{INFORMATION}>"
    # the actions a rollout with these tools parses; the episode's order, as rollouts play
    # it: each tool turn answered by one information turn, the answer last
    tags = (SEARCH, *make_tools(tools, retriever=None, k=1, style=style))
    searched: list[str] | None = None   # the open tool turn's sub-queries (search) or []
    for i, turn in enumerate(turns):
        role = turn.get("role") if isinstance(turn, dict) else None
        content = turn.get("content") if isinstance(turn, dict) else None
        if not isinstance(content, str):
            raise DataError("expected a string", path=where, field=f"turns[{i}].content")
        if role == "assistant":
            # a policy taught a malformed turn plays it: refused here, not learnt
            problem = step_format_problem(content)
            action = parse_action(content, tags, max_queries)
            if problem is None and action.kind == "invalid":
                problem = action.text
            if problem is None and action.kind == SEARCH:
                searched, problem = split_queries(action.text, max_queries)
            if problem is not None:
                raise DataError(f"not a protocol turn ({problem}): expected an optional "
                                "<think> ... </think>, then one <search> query </search> or "
                                "<answer> text </answer>", path=where,
                                field=f"turns[{i}].content")
            if i and turns[i - 1].get("role") == "assistant":
                raise DataError("a tool turn without the information turn a rollout puts "
                                "after it", path=where, field=f"turns[{i - 1}]")
            if action.kind == ANSWER and i != len(turns) - 1:
                raise DataError("an answer ends the episode, and turns follow it",
                                path=where, field=f"turns[{i}].content")
            if action.kind not in (SEARCH, ANSWER):
                searched = []
            new = encode(content)
            ids += new
            mask += [1] * len(new)
        elif role == "information":
            if searched is None:
                raise DataError("an information turn comes only after a search or tool "
                                "turn", path=where, field=f"turns[{i}]")
            body = content.strip()
            if body.startswith(head) and body.endswith(tail):
                body = body[len(head):-len(tail)]
            sections: list[str] = []
            if turn.get("queries") is not None:   # a search of several sub-queries
                n = len(turn["queries"]) if isinstance(turn["queries"], list) else 0
                if n > max_queries:   # the policy would learn turns its rollouts refuse
                    raise DataError(
                        f"a search of {n} sub-queries, but max_queries is {max_queries}: "
                        f"write the oracle with --max-queries {max_queries} or train with "
                        f"max_queries: {n} (rollouts refuse more than max_queries)",
                        path=where, field=f"turns[{i}].queries")
                if n != len(searched):
                    raise DataError(f"{n} sub-queries, and the search before it holds "
                                    f"{len(searched)}", path=where,
                                    field=f"turns[{i}].queries")
                # headed by the queries as the rollout reads them from the search turn
                sections = _many_results({**turn, "queries": searched}, style,
                                         f"{where} turns[{i}]", snippet_words)
                body = "\n".join(sections)
            elif turn.get("hits") is not None:
                if len(searched) > 1:   # one flat list: a rollout heads and cuts each query's
                    raise DataError(f"a search of {len(searched)} sub-queries needs an "
                                    "information turn with `queries` (each query's hits), "
                                    "as rollouts lay it out; this one has one `hits` list",
                                    path=where, field=f"turns[{i}].hits")
                body = format_hits(_turn_hits(turn["hits"], f"{where} turns[{i}].hits",
                                              snippet_words), style)
            elif style.doc != PROMPTS["seekrl"].doc or snippet_words is not None:
                how = f"in the {style.name} style" if snippet_words is None else \
                    f"with snippet_words {snippet_words}"
                raise DataError(f"an information turn without its documents (`hits`) cannot "
                                f"be laid out {how}; write the oracle file again (seekrl "
                                "oracle)" + (" or use prompt: seekrl" if snippet_words is None
                                             else ""), path=where, field=f"turns[{i}]")
            # per query, as rollouts cut it: a block of n sub-queries may be n times as long
            # (a block given as text too: a played episode's, `episode_record`)
            new = information_ids(lambda text: environment_ids(tokenizer, text), body,
                                  max_info_tokens * max(1, len(searched)), sections)
            ids += new
            mask += [0] * len(new)
            searched = None
        else:
            raise DataError(f"expected 'assistant' or 'information', got {role!r}", path=where,
                            field=f"turns[{i}].role")
    if not isinstance(turns[-1], dict) or turns[-1].get("role") != "assistant":
        raise DataError("an episode must end with the assistant's turn", path=where,
                        field="turns")
    if f"<{ANSWER}>" not in turns[-1]["content"]:
        raise DataError("an episode must end with an <answer> turn", path=where,
                        field=f"turns[{len(turns) - 1}].content")
    return ids, mask


def episode_record(traj, decode, prompt: list[dict] | None = None) -> dict:
    """A played episode (a `Trajectory`) in the text form `episode_tokens` reads, so that a
    policy with another tokenizer can learn it: each turn's text, and each block the
    environment inserted as the player read it (decoded with its tokenizer `decode`), which
    the learner's own tokens lay out again, cut to its `max_info_tokens`. The question's own
    `prompt` goes with it (`prompt: data`). Search and answer turns only: another tool's
    block is not an information block."""
    turns: list[dict] = []
    for i, step in enumerate(traj.steps):
        if step.action not in ("search", "answer"):
            raise ValueError(f"episode {traj.example_id}: turn {i} is a {step.action!r} turn; "
                             "only search and answer turns convert to text turns")
        turns.append({"role": "assistant", "content": step.text})
        after = traj.steps[i + 1].start if i + 1 < len(traj.steps) else len(traj.token_ids)
        if step.end < after:
            turns.append({"role": "information",
                          "content": decode(traj.token_ids[step.end:after]).strip("\n")})
    record = {"id": traj.example_id, "question": traj.question,
              "golden_answers": list(traj.golden_answers), "turns": turns}
    if prompt is not None:
        record["prompt"] = prompt
    return record


def _many_results(turn: dict, style, where: str, snippet_words: int | None = None
                  ) -> list[str]:
    """The block of an oracle search turn of several sub-queries, one part per query
    (`query_sections`, as a rollout's block): `queries` and, per query, its documents in
    `hits`."""
    queries, hits = turn["queries"], turn.get("hits")
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise DataError("expected a list of strings", path=where, field="queries")
    if not isinstance(hits, list) or len(hits) != len(queries):
        raise DataError(f"expected one list of documents per query ({len(queries)})",
                        path=where, field="hits")
    return query_sections(queries, [_turn_hits(h, f"{where}.hits[{j}]", snippet_words)
                                    for j, h in enumerate(hits)], style)


def _turn_hits(raw, where: str, snippet_words: int | None = None) -> list[Hit]:
    """An oracle turn's documents as a rollout shows them (`snippet_words`; the stored
    form where the oracle kept it)."""
    from seekrl.agent.tools import snippet

    if not isinstance(raw, list):
        raise DataError("expected a list of documents", path=where)
    hits = []
    for j, h in enumerate(raw):
        if not isinstance(h, dict) or not all(isinstance(h.get(k), str)
                                              for k in ("id", "title", "text")):
            raise DataError("expected {'id': str, 'title': str, 'text': str}", path=where,
                            field=f"[{j}]")
        stored = h.get("contents")
        if stored is not None and not isinstance(stored, str):
            raise DataError(f"expected a string, got {type(stored).__name__}", path=where,
                            field=f"[{j}].contents")
        hit = Hit(doc_id=h["id"], title=h["title"], text=h["text"], score=0.0, stored=stored)
        hits.append(snippet(hit, snippet_words))
    return hits


def check_token_ids(examples: list[SFTExample], n_embeddings: int) -> None:
    """Every id within the model's embedding table (which may be larger than the tokenizer's
    vocabulary, Qwen2.5's padded rows: a sampled id can land there); one past it would fail
    inside the forward pass."""
    for e in examples:
        if e.token_ids and max(e.token_ids) >= n_embeddings:
            raise DataError(f"token id {max(e.token_ids)} is past the model's embedding "
                            f"table ({n_embeddings} rows): written with another model's "
                            "tokenizer?", path=e.source, field="token_ids")


def load_sft_examples(path: str | Path, tokenizer, *,
                      max_info_tokens: int = DEFAULT_MAX_INFO_TOKENS, max_len: int = 2048,
                      only_complete: bool = True, limit: int | None = None,
                      prompt: str = "seekrl", max_queries: int = 1, plans: bool = False,
                      tools: Sequence[str] = (), snippet_words: int | None = None
                      ) -> tuple[list[SFTExample], dict[str, int]]:
    """The usable episodes of a file, and counts of what was left out and why. Oracle
    episodes are laid out with the rollout settings given (`episode_tokens`); trajectories keep
    the tokens they were played with. `plans`: find each episode's lookup plan
    (`plan_span`), for `plan_weight`."""
    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, clean_up_tokenization_spaces=False)

    examples: list[SFTExample] = []
    skipped = {"incomplete": 0, "truncated": 0}
    for line_no, rec in iter_jsonl(path):
        where = f"{path}:{line_no}"
        complete = rec.get("oracle_complete", True)
        if not isinstance(complete, bool):   # "false" would be trained on as complete
            raise DataError(f"expected true or false, got {complete!r}", path=str(path),
                            line=line_no, field="oracle_complete")
        meta = rec.get("metadata")
        if meta is not None and not isinstance(meta, dict):   # it decides balance_types' draw
            raise DataError(f"expected an object or null, got {type(meta).__name__}",
                            path=str(path), line=line_no, field="metadata")
        if "turns" in rec and "token_ids" in rec:   # two versions of one episode
            raise DataError("both 'turns' (an episode's text) and 'token_ids' (its tokens): "
                            "give one of the two", path=str(path), line=line_no,
                            field="token_ids")
        if "turns" in rec:
            if only_complete and not complete:
                skipped["incomplete"] += 1
                continue
            ids, mask = episode_tokens(tokenizer, rec, max_info_tokens=max_info_tokens,
                                       where=where, prompt=prompt, max_queries=max_queries,
                                       tools=tools, snippet_words=snippet_words)
        elif "token_ids" in rec and "loss_mask" in rec:
            ids, mask = rec["token_ids"], rec["loss_mask"]
            # ids past 2**63 and masks of 1.0 had passed, then failed in `data_digests`
            # with a traceback naming no line
            if not isinstance(ids, list) or not all(
                    type(x) is int and 0 <= x < 2 ** 63 for x in ids):
                raise DataError("expected a list of token ids (integers >= 0)",
                                path=str(path), line=line_no, field="token_ids")
            if not isinstance(mask, list) or not all(type(x) is int and x in (0, 1)
                                                     for x in mask):
                raise DataError("expected a list of 0s and 1s", path=str(path), line=line_no,
                                field="loss_mask")
            ids, mask = list(ids), list(mask)
            if len(ids) != len(mask):
                raise DataError("token_ids and loss_mask differ in length", path=str(path),
                                line=line_no, field="loss_mask")
            if mask and mask[0]:   # it would count in the loss's mean with a log-prob of 0
                raise DataError("expected 0 first: the first token has nothing before it "
                                "to be predicted from", path=str(path), line=line_no,
                                field="loss_mask")
        else:
            raise DataError("expected an oracle episode ('turns') or a trajectory "
                            "('token_ids' and 'loss_mask')", path=str(path), line=line_no)
        first = next((i for i, m in enumerate(mask) if m), None)
        if len(ids) > max_len:
            skipped["truncated"] += 1
            ids, mask = ids[:max_len], mask[:max_len]
        if first is None:
            raise DataError("no policy tokens to train on", path=str(path), line=line_no,
                            field="loss_mask")
        if first >= max_len:   # the prompt alone fills max_len
            raise DataError(f"no policy tokens within max_len ({max_len} tokens): the first "
                            f"is token {first}; raise max_len", path=str(path), line=line_no,
                            field="loss_mask")
        examples.append(SFTExample(ids, mask, where, meta,
                                   plan_span(decode, ids, mask) if plans else None))
        if limit is not None and len(examples) >= limit:
            break
    if not examples:
        left = (f": {skipped['incomplete']} left out as incomplete (oracle_complete false; "
                "only_complete: false trains on them)" if skipped["incomplete"] else "")
        raise DataError(f"no usable episodes{left}", path=str(path))
    return examples, skipped


def batches(examples: list[SFTExample], batch_size: int, rng: random.Random, *,
            draw: Callable[[random.Random], list[SFTExample]] | None = None
            ) -> list[list[SFTExample]]:
    """One epoch of micro-batches: shuffled, but episodes of similar length share a batch
    (sorted within windows of 16 batches), so little compute goes into padding. `draw`:
    the epoch's episodes (`balanced_draw`) instead of each episode once."""
    order = examples[:] if draw is None else draw(rng)
    rng.shuffle(order)
    window = batch_size * 16
    out = []
    for w in range(0, len(order), window):
        chunk = sorted(order[w:w + window], key=lambda e: len(e.token_ids))
        out += [chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size)]
    rng.shuffle(out)
    return out


def sft_loss(model, micro: list[SFTExample], pad_id: int, device, *,
             plan_weight: float = 1.0, parts: dict[str, float] | None = None
             ) -> tuple[torch.Tensor, float]:
    """Summed NLL over the batch's policy tokens, and how many there were; with
    `plan_weight` != 1 each plan token's NLL counts `plan_weight` times, and the count is
    the summed weight (`loss_weight`), so that the step's loss is a weighted mean. `parts`
    (a dict) gathers the plan tokens' own NLL and count."""
    ids, attn, mask = collate([e.token_ids for e in micro], [e.loss_mask for e in micro],
                              pad_id, device)
    logp = masked_logprobs(model, ids, attn, mask)["logprobs"]
    if plan_weight == 1.0 and parts is None:   # today's loss, operation for operation
        return -(logp * mask).sum(), int(mask.sum())
    plan = torch.zeros_like(mask)
    for row, e in enumerate(micro):
        if e.plan is not None:
            plan[row, e.plan[0]:e.plan[1]] = 1.0
    plan = plan * mask
    if parts is not None:
        parts["plan_nll"] = parts.get("plan_nll", 0.0) + float(-(logp * plan).sum().detach())
        parts["plan_tokens"] = parts.get("plan_tokens", 0.0) + float(plan.sum())
    if plan_weight == 1.0:
        return -(logp * mask).sum(), int(mask.sum())
    weight = mask + (plan_weight - 1.0) * plan
    return -(logp * weight).sum(), float(weight.sum())


def loss_weight(examples: Sequence[SFTExample], plan_weight: float = 1.0) -> float | int:
    """The summed token weight of `examples` (the token count when `plan_weight` is 1): the
    step's loss divides its summed weighted NLL by it."""
    tokens = sum(sum(e.loss_mask) for e in examples)
    if plan_weight == 1.0:
        return tokens
    plan = sum(sum(e.loss_mask[e.plan[0]:e.plan[1]]) for e in examples if e.plan is not None)
    return tokens + (plan_weight - 1.0) * plan


# The settings a resumed run may change: where and how often it saves and logs, how it is
# evaluated, the device it runs on, and the data file's path (its episodes are checked
# against the checkpoint's digest). Any other key changes what is trained, so the run
# would end neither where the stopped one was going nor where a new one would: refused.
# `rollout` is how the dev evaluation plays, except the keys that lay out the episodes.
RESUME_MAY_CHANGE = ("out", "data", "device", "index", "eval", "rollout", "save_every",
                     "keep_last", "log_every")
# the episodes' token layout: changed, the data digest refused it as "other episodes"
RESUME_MUST_KEEP = ("rollout.prompt", "rollout.max_info_tokens", "rollout.max_queries",
                    "rollout.tools", "rollout.snippet_words")


def _may_change(key: str) -> bool:
    def under(prefixes) -> bool:
        return any(key == p or key.startswith(p + ".") for p in prefixes)
    return under(RESUME_MAY_CHANGE) and not under(RESUME_MUST_KEEP)


# keys added since a run may have been saved: absent from its config.yaml, at their
# default they train as that run did, so its checkpoints still resume
_ADDED_AT_DEFAULT = ("plan_weight: None -> 1.0",)


def check_resume_settings(out: Path, cfg: SFTConfig) -> None:
    """Refuse `--resume` with settings that differ from the run's config.yaml, naming each
    key (those in `RESUME_MAY_CHANGE` may differ: the resume says so)."""
    refused = [c for c in config_changes(out / "config.yaml", cfg)
               if not _may_change(c.split(":", 1)[0]) and c not in _ADDED_AT_DEFAULT]
    if refused:
        raise ConfigError(f"--resume: the run in {out} was trained with other settings: "
                          + "; ".join(refused) + f" (old -> new). Resume with the run's "
                          f"settings ({out / 'config.yaml'}), or start a new run in another "
                          f"out; only {', '.join(RESUME_MAY_CHANGE)} may change on resume "
                          f"(not {', '.join(RESUME_MUST_KEEP)})")


def episodes_digest(examples: list[SFTExample]) -> str:
    """A digest of the episodes' tokens and loss masks, in order: a resumed run's batches
    are indices into them, so they must be the checkpoint's own."""
    import hashlib
    from array import array

    h = hashlib.sha256()
    for e in examples:
        h.update(array("q", e.token_ids).tobytes())
        h.update(array("b", e.loss_mask).tobytes())
        h.update(b"|")
    return h.hexdigest()[:16]


def groups_digest(examples: list[SFTExample], by: str) -> str:
    """A digest of each episode's `balance_types` group, in order: the balanced draw picks
    episodes by it, so a file of the same tokens with other type labels draws others."""
    import hashlib

    h = hashlib.sha256()
    for e in examples:
        h.update(question_group(e.metadata, by).encode())
        h.update(b"|")
    return h.hexdigest()[:16]


def data_digests(examples: list[SFTExample], balance_types: str | None) -> dict[str, str]:
    """What a checkpoint's sft.json records of the episodes (`check_resume_data`)."""
    out = {"digest": episodes_digest(examples)}
    if balance_types is not None:
        out["groups"] = groups_digest(examples, balance_types)
    return out


def check_resume_data(checkpoint: Path, examples: list[SFTExample], data: str,
                      balance_types: str | None = None) -> None:
    """Refuse to resume on other episodes than the checkpoint was trained on (a changed
    data file, or one laid out otherwise, or, drawn by `balance_types`, labelled otherwise);
    checkpoints without the record (or without its groups) pass."""
    import json

    record = checkpoint / "sft.json"
    if not record.is_file():
        return
    saved = json.loads(record.read_text())
    now = data_digests(examples, balance_types)
    if saved.get("episodes") != len(examples) or saved.get("digest") != now["digest"]:
        raise ConfigError(f"data: {data} holds other episodes than the run in {checkpoint} "
                          f"was trained on ({len(examples)} episodes, digest {now['digest']}; "
                          f"the checkpoint's: {saved.get('episodes')}, {saved.get('digest')}); "
                          "resume with the run's data, or start a new run in another out")
    if saved.get("groups") is not None and saved["groups"] != now.get("groups"):
        raise ConfigError(f"data: the episodes of {data} are the checkpoint's, but their "
                          f"{balance_types} labels (metadata) differ from those the run in "
                          f"{checkpoint} drew its batches by; resume with the run's data, or "
                          "start a new run in another out")


def _save_state(out: Path, step: int, model, tokenizer, optimizer, scheduler, rng,
                queue, index: dict[int, int], keep_last: int, digest: dict[str, str]) -> Path:
    """checkpoints/step-N, written whole or not at all (`write_checkpoint`): the policy
    (loadable as it is), in state.pt what a resumed run needs to go on exactly (the trained
    weights, the optimizer and schedule, the random states, the epoch's remaining batches),
    and in sft.json the digest of the episodes those batches index."""
    import json

    def write(tmp: Path) -> None:
        write_policy(model, tokenizer, tmp)
        torch.save(training_state(model, step, optimizer, scheduler, batches_rng=rng.getstate(),
                                  queue=[[index[id(e)] for e in mb] for mb in queue]),
                   tmp / "state.pt")
        (tmp / "sft.json").write_text(json.dumps({"step": step, "episodes": len(index),
                                                  **digest}))

    return write_checkpoint(out / "checkpoints", step, write, keep_last)


def run_sft(cfg: SFTConfig, *, console=None, model=None, tokenizer=None,
            overwrite: bool = False, resume: bool = False) -> dict[str, Any]:
    """Train, evaluate, save; returns a summary (steps, loss, dev EM, paths, minutes).
    `model` / `tokenizer` override `cfg.model` (tests pass the tiny model). An `out` that
    holds a run already is refused unless `overwrite`; `resume` continues it from its
    latest checkpoint (`save_every`), on the same batches as an uninterrupted run. Ctrl-C
    raises `Interrupted`, which says where the run stopped."""
    from seekrl.models import load_policy, load_tokenizer

    started = time.time()
    if not Path(cfg.data).is_file():     # before a model is loaded: fail in seconds
        raise FileNotFoundError(f"data: {cfg.data}: no such file (trajectory JSONL: oracle "
                                "episodes or Trajectory records)")
    out = Path(cfg.out)
    if resume and overwrite:
        raise ConfigError("give one of --resume (continue the run in out) or --overwrite "
                          "(replace it), not both")
    checkpoint = latest_checkpoint(out) if resume else None
    if resume and checkpoint is None:
        raise ConfigError(f"--resume: {out} has no SFT checkpoint (checkpoints/latest); "
                          "checkpoints are written every save_every steps")
    check_run_dir(out, overwrite=overwrite, resume=resume,
                  model=cfg.model if model is None else None)
    if checkpoint is not None:   # before anything slow: a changed setting fails in seconds
        check_resume_settings(out, cfg)
    if cfg.eval.keep_best:
        raise ConfigError("eval.keep_best: an RL run's option (seekrl train); supervised "
                          "fine-tuning keeps its final policy, and its dev evaluations "
                          "(eval.every) say which step to take")
    check_eval_data(cfg.eval)
    check_eval_index(cfg.index, None, cfg.eval)
    if cfg.rollout.tools and cfg.eval.data:   # the dev evaluations play them: checked now,
        # not after training
        from seekrl.agent.tools import check_tool_names
        check_tool_names(cfg.rollout.tools)
    retriever = _eval_retriever(cfg)
    set_seed(cfg.seed)
    if model is None:   # the data is read with the tokenizer alone: bad lines fail fast
        tokenizer = load_tokenizer(cfg.model)
    episode = cfg.rollout
    examples, skipped = load_sft_examples(cfg.data, tokenizer,
                                          max_info_tokens=episode.max_info_tokens,
                                          max_len=cfg.max_len, only_complete=cfg.only_complete,
                                          limit=cfg.limit, prompt=episode.prompt,
                                          max_queries=episode.max_queries,
                                          plans=cfg.plan_weight != 1.0, tools=episode.tools,
                                          snippet_words=episode.snippet_words)
    planned = sum(e.plan is not None for e in examples)
    if cfg.plan_weight != 1.0 and not planned:
        raise ConfigError(f"plan_weight: {cfg.plan_weight}, but no episode of {cfg.data} "
                          f"states a lookup plan ({PLAN_LEAD!r}N lookups, as `seekrl oracle` "
                          "writes with --plan count): there is nothing to weigh")
    draw = None
    if cfg.balance_types is not None:
        sizes = check_balance(examples, cfg.balance_types, cfg.type_weights)
        quotas = group_quotas(sizes, len(examples), cfg.type_weights)

        def draw(r: random.Random) -> list[SFTExample]:
            return balanced_draw(examples, cfg.balance_types, cfg.type_weights, r)
    digest = data_digests(examples, cfg.balance_types)
    if checkpoint is not None:
        check_resume_data(checkpoint, examples, cfg.data, cfg.balance_types)
    if model is None:
        model, tokenizer = load_policy(cfg.model, dtype=cfg.dtype, device=cfg.device)
    check_token_ids(examples, model.get_input_embeddings().num_embeddings)
    model = prepare_trainable(model, cfg.train_layers, cfg.lora)
    model.train()
    # the epochs' micro-batches (`batches`: each epoch's last one partial) in steps of
    # grad_accum, rounded up once over all of them: a floor of n / (batch_size x grad_accum)
    # left episodes of every epoch unseen (1 of 9 at 8), and a step count rounded up per
    # epoch took the spare micro-batches from the next epoch's shuffle (4 passes for 3)
    micro = math.ceil(len(examples) / cfg.batch_size)
    total_steps = cfg.max_steps or max(1, math.ceil(round(micro * cfg.epochs, 9)
                                                    / cfg.grad_accum))
    optimizer = make_optimizer(trainable_parameters(model), cfg.optim)
    scheduler = make_scheduler(optimizer, cfg.optim, total_steps)
    say = console.print if console is not None else (lambda *a, **k: None)
    rng = random.Random(cfg.seed)
    queue: list[list[SFTExample]] = []
    done = 0
    if checkpoint is not None:
        state = resume_training(checkpoint, model, optimizer, scheduler, out=out, cfg=cfg,
                                total_steps=total_steps, say=say)
        rng.setstate(state["batches_rng"])
        cuda = state.get("cuda_rng")   # where checkpoints before rng_state's own kept them
        if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        queue = [[examples[i] for i in mb] for mb in state["queue"]]
        done = int(state["step"])
    # every input read and the model built: only now may the old run go
    claim_run_dir(out, overwrite=overwrite, resume=resume)
    dump_config(cfg, out / "config.yaml")
    log = MetricsLog(out / "metrics.jsonl", resume=resume)
    pad_id = pad_id_of(tokenizer)
    turn_limit = cfg.rollout.max_new_tokens
    too_long = turn_limit_warning(examples, turn_limit)
    if too_long:
        say(f"[yellow]warning:[/] {too_long}")
    past = episode_limit_warning(examples, cfg.rollout.max_turns, cfg.rollout.max_total_tokens)
    if past:
        say(f"[yellow]warning:[/] {past}")
    say(f"SFT on {len(examples)} episodes ({skipped['incomplete']} incomplete skipped, "
        f"{skipped['truncated']} cut to {cfg.max_len} tokens): {total_steps} steps of "
        f"{cfg.batch_size} x {cfg.grad_accum} episodes")
    if cfg.plan_weight != 1.0:
        say(f"plan_weight {cfg.plan_weight}: the lookup plan found in {planned} of "
            f"{len(examples)} episodes")
    if draw is not None:
        say(f"balance_types {cfg.balance_types}: an epoch draws "
            + ", ".join(f"{g} {quotas[g]} (of {sizes[g]})" for g in sorted(sizes)))
    index = {id(e): i for i, e in enumerate(examples)}
    last: dict[str, Any] = {}
    dev: dict[str, Any] = {}
    if cfg.eval.data and cfg.eval.at_start and done == 0:   # the policy before training
        start = _dev_eval(model, tokenizer, retriever, cfg, out / "eval" / "start")
        log.write({"step": 0, **{f"dev_{k}": v for k, v in start.items()}})
        say(f"dev EM at the start {start['em']:.3f} on {start['questions']} questions")
    try:
        for step in range(done + 1, total_steps + 1):
            t0 = time.time()
            micro_batches = []
            for _ in range(cfg.grad_accum):
                if not queue:
                    queue = batches(examples, cfg.batch_size, rng, draw=draw)
                micro_batches.append(queue.pop())
            n_tokens = sum(sum(e.loss_mask) for mb in micro_batches for e in mb)
            # the weighted mean's denominator (n_tokens itself when plan_weight is 1)
            weight = loss_weight([e for mb in micro_batches for e in mb], cfg.plan_weight)
            parts: dict[str, float] | None = {} if cfg.plan_weight != 1.0 else None
            total_nll = 0.0
            for micro in micro_batches:
                nll, _ = sft_loss(model, micro, pad_id, cfg.device,
                                  plan_weight=cfg.plan_weight, parts=parts)
                (nll / weight).backward()
                total_nll += float(nll.detach())
            grad_norm = round(clip_and_step(trainable_parameters(model), optimizer,
                                            cfg.optim.max_grad_norm), 4)
            lr = optimizer.param_groups[0]["lr"]   # the rate this step applied
            scheduler.step()
            trim_heap()
            seconds = time.time() - t0
            tokens = sum(len(e.token_ids) for mb in micro_batches for e in mb)
            last = {"step": step, "loss": round(total_nll / weight, 5), "grad_norm": grad_norm,
                    "lr": lr, "policy_tokens": n_tokens,
                    "longest": max(len(e.token_ids) for mb in micro_batches for e in mb),
                    "tokens_per_s": round(tokens / seconds, 1), "seconds": round(seconds, 2)}
            if parts is not None:   # the plan's own NLL, and every token's unweighted
                plan_nll = parts["plan_nll"]
                last["plan_loss"] = round(plan_nll / max(parts["plan_tokens"], 1.0), 5)
                last["token_loss"] = round((total_nll - (cfg.plan_weight - 1.0) * plan_nll)
                                           / n_tokens, 5)
            rss = peak_rss_mb()   # the process's peak so far: which step raised it, and by what
            if rss is not None:
                last["peak_rss_mb"] = rss
            if cfg.eval.data and cfg.eval.every and step % cfg.eval.every == 0 \
                    and step != total_steps:
                dev = _dev_eval(model, tokenizer, retriever, cfg, out / "eval" / f"step-{step}")
                last.update({f"dev_{k}": v for k, v in dev.items()})
            log.write(last)
            if step % cfg.log_every == 0 or step == total_steps:
                say(f"step {step}/{total_steps}  loss {last['loss']:.4f}  grad {grad_norm:.2f}  "
                    f"lr {last['lr']:.2e}  {last['tokens_per_s']:.0f} tok/s"
                    + (f"  dev EM {dev['em']:.3f}" if "dev_em" in last else "")
                    + f"  [{(time.time() - started) / 60:.1f} min]")
            if cfg.save_every and step % cfg.save_every == 0 and step != total_steps:
                _save_state(out, step, model, tokenizer, optimizer, scheduler, rng, queue,
                            index, cfg.keep_last, digest)
            done = step
    except KeyboardInterrupt:
        log.close()
        raise Interrupted(done, latest_checkpoint(out), cfg.save_every, total_steps) from None
    final = save_policy(model, tokenizer, out / "final")
    if cfg.eval.data:
        dev = _dev_eval(model, tokenizer, retriever, cfg, out / "eval" / "final")
        log.write({"step": total_steps, **{f"dev_{k}": v for k, v in dev.items()}})
        say(f"dev EM {dev['em']:.3f} on {dev['questions']} questions (valid format "
            f"{dev['valid_format']:.2f})")
    log.close()
    return {"steps": total_steps, "episodes": len(examples), "skipped": skipped,
            "turn_limit": turn_limit,
            "turns_over_limit": sum(e.longest_turn > turn_limit for e in examples),
            "longest_turn": max(e.longest_turn for e in examples),
            "loss": last.get("loss"), "dev": dev, "final": str(final),
            "minutes": round((time.time() - started) / 60, 2)}


def _eval_retriever(cfg: SFTConfig):
    if not cfg.eval.data:
        return None
    from seekrl.recipes.setup import open_index
    return open_index(cfg.eval.index or cfg.index,
                      "eval.data is set: the dev evaluation searches")


def _dev_eval(model, tokenizer, retriever, cfg: SFTConfig, out_dir: Path) -> dict[str, Any]:
    from seekrl.rl.step_metrics import dev_figures  # as RL logs its dev evaluations

    return dev_figures(eval_policy(model, tokenizer, retriever, cfg.eval, out_dir,
                                   episode=cfg.rollout))
