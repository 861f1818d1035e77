"""Oracle trajectories: for each synthetic-world question, the ideal episode in the agent
protocol, searching the real index so the retrieved text is what the agent would see.

The oracle follows the question's hop chain (`metadata["chain"]`): one search per distinct
gold document, with the query an expert would write. When that query misses the gold
document it writes the failed search and a reformulation (the document's title), which
teaches recovery as well as the happy path. With `max_queries` > 1 (parallel sub-queries),
lookups that do not depend on each other (the entities of a comparison, the first hop of
each branch of a "same" question) go into one search turn of several `##`-separated
sub-queries, in waves: a lookup waits only for the lookups whose answers it names.

The first turn opens with a plan. `plan="count"` (the default) states how many lookups
the question takes ("To answer this I need 2 lookups. First I will look for ..."), so the
policy commits to a number before it reads anything; `plan="none"` names only the first
lookup, and whether to search again is decided after each document is read ("Next I
need ..." or "So the answer is ..."), for a policy whose planned number does not follow
the question (a short warm-up's may not). An episode is a list of turns:
`{"role": "assistant", "content": "<think>...</think>\\n<search>...</search>"}` and
`{"role": "information", "content": "<information>...</information>"}`, ending with the
assistant's `<answer>`; the SFT warm-up tokenises it with the policy's chat template.

A comparison's last turn sets the values side by side (`judge="values"`, the default:
"Comparing: A: 1949; B: 1984."). `judge="ordered"` then writes the decision out in two
small steps: the values in order ("From smallest to largest: 1949 < 1984.") and the end the
question asks for ("The question wants the smallest, 1949: A."); a "same" question's values
get "the same" or "different". It is for a policy that copies both values right and then
names either entity: each step then rests on tokens a few positions back.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from seekrl.agent.protocol import (
    ANSWER,
    INFORMATION,
    SEARCH,
    THINK,
    format_query_results,
    information_block,
    tag,
)
from seekrl.data.qa import QAExample, hop_chain
from seekrl.retrieval.base import Hit, Retriever


@dataclass
class OracleStats:
    questions: int = 0
    searches: int = 0
    reformulated: int = 0      # searches whose first query missed the gold document
    incomplete: int = 0        # episodes where some gold document was never retrieved

    def summary(self) -> str:
        return (f"{self.questions} oracle trajectories, {self.searches} searches, "
                f"{self.reformulated} reformulated, {self.incomplete} incomplete")


HOP_KEYS = ("subject", "answer", "doc_id", "query", "fact")   # and need or relation


def _check_chain(example: QAExample) -> None:
    """Each hop has what the oracle writes from (docs/own-data.md): a hand-written chain
    missing one had ended in a bare KeyError naming neither question nor hop."""
    for i, hop in enumerate(hop_chain(example)):
        missing = [k for k in HOP_KEYS if hop.get(k) in (None, "")]
        if not hop.get("need") and not hop.get("relation"):
            missing.append("need (or relation)")
        if missing:
            raise ValueError(f"question {example.id}: metadata.chain[{i}]: missing "
                             f"{', '.join(missing)} (a hop has subject, answer, doc_id, query, "
                             "fact and need: docs/own-data.md)")


def _search_steps(chain: list[dict]) -> list[list[dict]]:
    """Group consecutive hops told by the same document: one search serves them all."""
    steps: list[list[dict]] = []
    for hop in chain:
        if steps and steps[-1][-1]["doc_id"] == hop["doc_id"]:
            steps[-1].append(hop)
        else:
            steps.append([hop])
    return steps


def _want(hops: list[dict]) -> str:
    return hops[0].get("need") or f"the {hops[0]['relation'].replace('_', ' ')} of " \
        f"{hops[0]['subject']}"


def _waves(steps: list[list[dict]]) -> list[list[int]]:
    """The search steps in waves: a step goes one wave after the latest step whose answer
    its subject is (what it cannot search for before it is known); order kept within a
    wave."""
    depth: list[int] = []
    for i, hops in enumerate(steps):
        needs = [depth[j] for j in range(i)
                 if any(h["answer"] == hops[0]["subject"] for h in steps[j])]
        depth.append(1 + max(needs) if needs else 0)
    return [[i for i, d in enumerate(depth) if d == w] for w in range(max(depth, default=-1) + 1)]


PLANS = ("count", "none")


def check_plan(plan: str) -> None:
    if plan not in PLANS:
        raise ValueError(f"plan: expected one of {', '.join(PLANS)}, got {plan!r}")


JUDGES = ("values", "ordered")


def check_judge(judge: str) -> None:
    if judge not in JUDGES:
        raise ValueError(f"judge: expected one of {', '.join(JUDGES)}, got {judge!r}")


PLAN_LEAD = "To answer this I need "   # the `count` plan's words before its number


def _lead(steps: list[list[dict]], plan: str) -> str:
    """The first turn's opening: the number of lookups (`count`), or nothing (`none`)."""
    n = len(steps)
    return f"{PLAN_LEAD}{n} lookup{'s' * (n > 1)}. " if plan == "count" else ""


def oracle_episode(example: QAExample, retriever: Retriever, *, k: int = 3,
                   stats: OracleStats | None = None, max_queries: int = 1,
                   plan: str = "count", judge: str = "values") -> dict:
    """The ideal episode for one question whose metadata carries a hop `chain`; with
    `max_queries` > 1, independent lookups share a search turn; `plan` and `judge` as in
    the module."""
    check_plan(plan)
    check_judge(judge)
    chain = example.metadata.get("chain")
    if not chain:
        raise ValueError(f"question {example.id}: metadata has no 'chain'; the oracle follows "
                         "a hop chain (the synthetic world's questions carry one; for your own, "
                         "write metadata.chain as docs/own-data.md shows)")
    _check_chain(example)
    stats = stats if stats is not None else OracleStats()
    stats.questions += 1
    steps = _search_steps(chain)
    if max_queries > 1:
        return _parallel_episode(example, retriever, steps, k, stats, max_queries, plan, judge)
    turns: list[dict] = []
    complete = True
    lead = _lead(steps, plan) + f"First I will look for {_want(steps[0])}."
    for i, hops in enumerate(steps):
        gold = hops[0]["doc_id"]
        query = hops[0]["query"]
        hits = retriever.search([query], k)[0]
        stats.searches += 1
        think = lead
        if not _found(hits, gold):
            # Write the miss too: the policy should learn to reformulate, not give up.
            turns.append(_search_turn(think, query))
            turns.append(_info_turn(hits))
            # Only what is known so far: the subject's name, never the answer.
            query = hops[0]["subject"]
            think = (f"These documents do not give {_want(hops)}. "
                     f"I will search for {query} alone.")
            hits = retriever.search([query], k)[0]
            stats.searches += 1
            stats.reformulated += 1
            complete &= _found(hits, gold)
        turns.append(_search_turn(think, query))
        turns.append(_info_turn(hits))
        facts = " ".join(h["fact"] for h in hops)
        if i + 1 < len(steps):
            lead = f"The document says: {facts} Next I need {_want(steps[i + 1])}."
        else:
            lead = f"The document says: {facts}"
    return _episode(example, turns, lead, complete, stats, judge)


def _parallel_episode(example: QAExample, retriever: Retriever, steps: list[list[dict]],
                      k: int, stats: OracleStats, max_queries: int, plan: str,
                      judge: str) -> dict:
    """`oracle_episode` with independent lookups searched together (see the module)."""
    chunks = [wave[i:i + max_queries] for wave in _waves(steps)
              for i in range(0, len(wave), max_queries)]
    turns: list[dict] = []
    complete = True
    lead = _lead(steps, plan) + _plan(steps, chunks[0], first=True)
    facts: list[str] = []
    for c, chunk in enumerate(chunks):
        queries = [steps[i][0]["query"] for i in chunk]
        hits = retriever.search(queries, k)
        stats.searches += len(queries)
        turns.append(_search_turn(lead, " ## ".join(queries)))
        turns.append(_info_turn_many(queries, hits))
        missed = [i for i, found in zip(chunk, hits) if not _found(found, steps[i][0]["doc_id"])]
        if missed:
            # the misses again, each by its subject's name alone (never the answer)
            retry = [steps[i][0]["subject"] for i in missed]
            think = (f"These documents do not give {' or '.join(_want(steps[i]) for i in missed)}. "
                     f"I will search for {' and '.join(retry)} alone.")
            again = retriever.search(retry, k)
            stats.searches += len(retry)
            stats.reformulated += len(retry)
            complete &= all(_found(h, steps[i][0]["doc_id"]) for i, h in zip(missed, again))
            turns.append(_search_turn(think, " ## ".join(retry)))
            turns.append(_info_turn_many(retry, again))
        facts = [h["fact"] for i in chunk for h in steps[i]]
        lead = f"The documents say: {' '.join(facts)}"
        if c + 1 < len(chunks):
            lead += " " + _plan(steps, chunks[c + 1])
    return _episode(example, turns, lead, complete, stats, judge)


def _episode(example: QAExample, turns: list[dict], lead: str, complete: bool,
             stats: OracleStats, judge: str = "values") -> dict:
    """The episode's record: its turns, then the answer after the last `lead`."""
    turns.append(_answer_turn(example, lead, judge))
    if not complete:
        stats.incomplete += 1
    return {"id": example.id, "question": example.question,
            "golden_answers": example.golden_answers, "metadata": example.metadata,
            "turns": turns, "oracle_complete": complete}


def _plan(steps: list[list[dict]], chunk: list[int], first: bool = False) -> str:
    wants = [_want(steps[i]) for i in chunk]
    if len(wants) == 1:
        return f"{'First I will look for' if first else 'Next I need'} {wants[0]}."
    return (f"{'First' if first else 'Next'} I need {', '.join(wants[:-1])} and {wants[-1]}, "
            "which do not depend on each other: I will search for them together.")


def _answer_turn(example: QAExample, lead: str, judge: str = "values") -> dict:
    """The last turn: what the last document says, the judgement (a comparison's values side
    by side; with `judge="ordered"` the decision written out too), the answer. Its opening
    stays the one every turn after a document has: a comparison whose last turn opened at
    the judgement instead looks, to a briefly trained policy, like a bridge's, which it then
    answers with the last value read."""
    judgement = example.metadata.get("judgement")
    answer = example.golden_answers[0]
    final = lead
    if judgement:
        final += f" Comparing: {judgement}."
        if judge == "ordered":
            final += " " + _decision(example, judgement)
    final += f" So the answer is {answer}."
    return {"role": "assistant", "content": f"{tag(THINK, final)}\n{tag(ANSWER, answer)}"}


def _decision(example: QAExample, judgement: str) -> str:
    """A comparison's decision in small steps: numbers in order, then the end the question
    wants and whose it is; a "same" question's two values the same or different."""
    pairs = [part.rpartition(": ") for part in judgement.split("; ")]
    if any(not sep for _, sep, _ in pairs) or len(pairs) < 2:
        raise ValueError(f"question {example.id}: judgement {judgement!r}: expected "
                         "'name: value' pairs separated by '; '")
    names = [name for name, _, _ in pairs]
    values = [value for _, _, value in pairs]
    answer = example.golden_answers[0]
    if answer in ("yes", "no"):   # a "same" question
        return f"{values[0]} and {values[1]} are {'the same' if answer == 'yes' else 'different'}."
    try:
        numbers = [int(v.replace(",", "")) for v in values]
    except ValueError:
        raise ValueError(f"question {example.id}: judgement {judgement!r}: expected numbers "
                         "to compare") from None
    if answer not in names:
        raise ValueError(f"question {example.id}: answer {answer!r} is none of the judgement's "
                         f"names ({', '.join(names)})")
    won = numbers[names.index(answer)]
    end = "smallest" if won == min(numbers) else "largest"
    ordered = " < ".join(values[i] for i in sorted(range(len(values)), key=numbers.__getitem__))
    return (f"From smallest to largest: {ordered}. The question wants the {end}, "
            f"{values[names.index(answer)]}: {answer}.")


def _found(hits: list[Hit], gold: str) -> bool:
    return any(h.doc_id == gold for h in hits)


def _search_turn(think: str, query: str) -> dict:
    return {"role": "assistant", "content": f"{tag(THINK, think)}\n{tag(SEARCH, query)}"}


def _info_turn(hits: list[Hit]) -> dict:
    # the documents themselves too, so SFT can lay them out in any prompt style
    return {"role": "information", "content": information_block(hits).strip("\n"),
            "hits": [_hit_record(h) for h in hits]}


def _info_turn_many(queries: list[str], hits: list[list[Hit]]) -> dict:
    """The information turn of a search of one or several sub-queries."""
    if len(queries) == 1:
        return _info_turn(hits[0])
    body = format_query_results(queries, hits)
    return {"role": "information", "content": f"<{INFORMATION}>{body}</{INFORMATION}>",
            "queries": list(queries),
            "hits": [[_hit_record(h) for h in found] for found in hits]}


def _hit_record(h: Hit) -> dict:
    """A document of an information turn; `contents` where the corpus stores it otherwise
    than title and text compose (a prompt style that reads the served lines needs it)."""
    record = {"id": h.doc_id, "title": h.title, "text": h.text}
    if h.stored is not None:
        record["contents"] = h.stored
    return record


def write_oracle_trajectories(examples: Iterable[QAExample], retriever: Retriever,
                              out: str | Path, *, k: int = 3, max_queries: int = 1,
                              plan: str = "count", judge: str = "values") -> OracleStats:
    """Write the oracle episodes of `examples` to `out`: into a temporary file renamed over
    `out` at the end, so a run that fails half-way never costs an older file."""
    check_plan(plan)
    check_judge(judge)
    stats = OracleStats()
    out = Path(out)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for ex in examples:
                f.write(json.dumps(oracle_episode(ex, retriever, k=k, stats=stats,
                                                  max_queries=max_queries, plan=plan,
                                                  judge=judge),
                                   ensure_ascii=False) + "\n")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return stats
