"""The plan's number: the probability a policy puts on "I need 1 / 2 / 3 lookups" at the
first thought's digit, averaged by question kind, on an evaluation's own prompts.

    .venv/bin/python bench/plan_count.py --model RUN/final --episodes EVAL/episodes.jsonl \
        --questions test_questions.jsonl

One forward a question (float32, CPU). A policy that reads the hop count off the question
puts most of its mass on the right number for each kind; one that does not shows about the
training mix's marginal everywhere (bench/RESULTS.md, "the plan's number")."""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

from seekrl.agent.oracle import PLAN_LEAD
from seekrl.agent.protocol import THINK
from seekrl.data.jsonl import iter_jsonl

LEAD = f"<{THINK}> {PLAN_LEAD}"   # the oracle's first turn, up to the plan's digit


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a policy folder or the bundled default")
    ap.add_argument("--episodes", type=Path, required=True,
                    help="an evaluation's episodes.jsonl (its prompts are used as they are)")
    ap.add_argument("--questions", type=Path, required=True,
                    help="the QA JSONL of those questions (metadata type and hops)")
    args = ap.parse_args()

    meta = {}   # read before the model loads: a bad file fails in a second
    for n, q in iter_jsonl(args.questions):
        m = q.get("metadata") or {}
        if "type" not in m or "hops" not in m:
            raise SystemExit(f"{args.questions}:{n}: expected metadata.type and "
                             "metadata.hops (synthetic-world questions)")
        meta[q["id"]] = f"{m['type']}-{m['hops']}"
    import torch

    from seekrl.models import load_policy

    model, tok = load_policy(args.model, dtype="float32", device="cpu")
    model.eval()
    digits = [tok.encode(d, add_special_tokens=False) for d in "123"]
    if any(len(d) != 1 for d in digits):
        raise SystemExit(f"the tokenizer splits a digit: {digits}")
    digits = [d[0] for d in digits]
    mass: dict[str, torch.Tensor] = collections.defaultdict(lambda: torch.zeros(3))
    count: collections.Counter = collections.Counter()
    with torch.no_grad():
        for n, ep in iter_jsonl(args.episodes):
            kind = meta.get(ep.get("example_id"))
            if kind is None:
                raise SystemExit(f"{args.episodes}:{n}: example {ep.get('example_id')!r} "
                                 f"is not in {args.questions}")
            prompt = ep["segments"][0]["text"] + LEAD
            ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
            p = torch.softmax(model(ids).logits[0, -1].float(), -1)[digits]
            mass[kind] += p / p.sum()
            count[kind] += 1
    means = {kind: mass[kind] / count[kind] for kind in sorted(mass)}
    for kind, p in means.items():
        for i in range(3):
            print(f"p{i + 1}_{kind}={p[i]:.3f}")
        print(f"n_{kind}={count[kind]}")
    ones = [float(p[0]) for p in means.values()]
    spread = max(ones) - min(ones)
    print(f"plan_count: {sum(count.values())} questions, {len(mass)} kinds; "
          f"P(1 lookup) spread across kinds {spread:.3f}")


if __name__ == "__main__":
    main()
