# examples/my_parts.py: your own parts, named by import path in a config
# (configs/own_parts.yaml); from the repository root this is examples.my_parts.
from __future__ import annotations

import re
from collections import Counter, defaultdict

from seekrl.retrieval.base import Hit
from seekrl.retrieval.corpus import iter_corpus
from seekrl.rewards.outcome import RewardParts, episode_reward
from seekrl.rl.advantages import broadcast, group_scalars, register


def _words(text: str | None) -> set[str]:
    return set(re.findall(r"\w+", (text or "").lower()))


# reward.fn: one trajectory -> RewardParts (total is what the estimators see)
def judge(t) -> RewardParts:
    """F1 instead of exact match, the usual format reward, and 0.02 off per search."""
    parts = episode_reward(t, outcome="f1", format_reward=0.1, invalid_penalty=0.1)
    cost = 0.02 * t.n_searches
    return RewardParts(total=parts.total - cost, outcome=parts.outcome, format=parts.format,
                       penalty=parts.penalty + cost)


# reward.process: trajectories, ctx -> per trajectory, one value per step (None: n/a)
def novelty(trajectories, ctx) -> list[list[float | None]]:
    """A search earns the share of its query's words that no earlier query of the episode
    used; other steps are not judged."""
    out = []
    for t in trajectories:
        seen: set[str] = set()
        row: list[float | None] = []
        for s in t.steps:
            if s.action != "search":
                row.append(None)
                continue
            words = _words(s.query)
            row.append(len(words - seen) / len(words) if words else 0.0)
            seen |= words
        out.append(row)
    return out


# algo.advantage: (batch: StepBatch, cfg: AlgoConfig) -> (advantages, returns), each (B, T).
# Registered here so that its facts are known (register's keywords: needs_values,
# reads_token_rewards, needs_tree; none of them here). Unregistered, it would run with none.
@register("median_baseline")
def median_baseline(batch, cfg):
    """Each episode's score minus its group's median, on every policy token."""
    scalars = group_scalars(batch, batch.totals, lambda r: r - r.median())
    advantages = broadcast(batch, scalars)
    return advantages, advantages.clone()


# retriever: a class (or function) called with `index` when the config sets it, or an object
# with search(queries, k) -> list[list[Hit]]: one call for the whole batch of queries.
class KeywordRetriever:
    """Documents ranked by the words they share with the query, over a corpus JSONL
    (`{"id", "contents"}` lines, as `seekrl index` reads)."""

    def __init__(self, corpus: str):
        self.docs = dict(iter_corpus(corpus))
        self.postings: dict[str, list[str]] = defaultdict(list)
        for doc_id, contents in self.docs.items():
            for word in _words(contents):
                self.postings[word].append(doc_id)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        out = []
        for q in queries:
            counts = Counter(d for w in _words(q) for d in self.postings.get(w, ()))
            best = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
            out.append([Hit.from_contents(d, self.docs[d], float(n)) for d, n in best])
        return out


# rollout.tools: a tool the agent calls as <calc> 12 * 7 </calc> (seekrl/agent/tools.py):
# every call of a turn comes in one list; each gets the text shown inside <information>.
class Calculator:
    tag = "calc"
    counts_as_search = False       # not a search: no documents, not in searches per episode
    instruction = "To compute, write an arithmetic expression inside <calc> and </calc>."

    def call(self, calls):
        from seekrl.agent.tools import ToolResult

        return [ToolResult(_arithmetic(c.argument)) for c in calls]


def _arithmetic(expression: str) -> str:
    """+ - * / ( ) on numbers, nothing else (no names, no calls)."""
    import ast
    import operator

    ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.USub: operator.neg}

    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return ops[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in ops:
            return ops[type(node.op)](value(node.operand))
        raise ValueError("only numbers and + - * / ( )")

    try:
        result = value(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError) as err:
        return f"Cannot compute {expression!r}: {err}"
    return f"{expression} = {result:g}"
