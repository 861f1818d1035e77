"""Where an RL run's signal would come from, measured before the run: a policy samples K
episodes of each question at each rollout temperature, and a group of G of them (the
first G samples) carries signal when its rewards differ. A group-relative advantage learns
from those groups alone, so their share says how much a step of G rollouts a question can
teach on these questions: a start that has learned the questions (its warm-up trained on
them) or a sharp policy at a low temperature ties its groups.

    .venv/bin/python bench/group_signal.py --model RUN/final --data W/world/dev.jsonl \\
        --index W/index --limit 48 --temperatures 0.7,1.0 --samples 8 --groups 4,8

Prints `key=value` figures per temperature and group size (the share of groups with
signal, by question type too; pass@1 and pass@G; the valid-format rate), the last line a
summary; writes each question's sampled outcome rewards and the figures to
OUT/signal.json. The episodes play the demo's settings (2 documents a search, 128-token
turns, 4 turns) unless told otherwise. The reward here is the outcome (EM), the group
signal of outcome-only RL; a process reward varies in more groups.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="the policy: a checkpoint folder or hub id")
    ap.add_argument("--data", required=True, help="the questions (a QA JSONL file)")
    ap.add_argument("--index", required=True, type=Path, help="the index they search")
    ap.add_argument("--limit", type=int, default=48, help="the first N questions")
    ap.add_argument("--temperatures", default="0.7,1.0")
    ap.add_argument("--samples", type=int, default=8, help="episodes a question (K)")
    ap.add_argument("--groups", default="4,8", help="group sizes to score (each <= K)")
    ap.add_argument("--topk", type=int, default=None, help="default: the demo's (2)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: the demo's (128)")
    ap.add_argument("--max-turns", type=int, default=None, help="default: the demo's (4)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=Path("runs/group_signal"))
    return ap


def group_figures(rewards: dict[str, list[float]], types: dict[str, str],
                  size: int) -> dict[str, float]:
    """For groups of each question's first `size` rewards (in sample order): the share of
    groups whose rewards differ (`signal`, and `signal_TYPE` per question type), the mean
    reward of one sample (`pass@1`), the share of questions with a reward > 0 among the
    group (`pass@G`) and the shares tied all right (reward 1) and tied below it."""
    groups = {q: r[:size] for q, r in rewards.items()}
    short = [q for q, r in groups.items() if len(r) < size]
    if short:
        raise ValueError(f"groups of {size}: question {short[0]!r} has {len(groups[short[0]])} "
                         "samples; sample at least as many (--samples)")
    if not groups:
        raise ValueError("no questions")
    varied = {q: len(set(r)) > 1 for q, r in groups.items()}
    n = len(groups)
    out = {"signal": sum(varied.values()) / n,
           "tied_right": sum(not varied[q] and r[0] >= 1 for q, r in groups.items()) / n,
           "tied_below": sum(not varied[q] and r[0] < 1 for q, r in groups.items()) / n,
           "pass@1": sum(sum(r) / size for r in groups.values()) / n,
           f"pass@{size}": sum(max(r) > 0 for r in groups.values()) / n}
    by_type: dict[str, list[bool]] = defaultdict(list)
    for q, v in varied.items():
        by_type[types.get(q) or "unknown"].append(v)
    for t, vs in sorted(by_type.items()):
        out[f"signal_{t}"] = sum(vs) / len(vs)
    return out


def main() -> None:
    args = build_parser().parse_args()
    temperatures = [float(t) for t in args.temperatures.split(",") if t.strip()]
    sizes = sorted({int(g) for g in args.groups.split(",") if g.strip()})
    if not temperatures or any(t <= 0 for t in temperatures):
        raise SystemExit(f"--temperatures: expected temperatures above 0 (sampling), got "
                         f"{args.temperatures!r}")
    if not sizes or sizes[0] < 2 or sizes[-1] > args.samples:
        raise SystemExit(f"--groups: expected sizes from 2 to --samples {args.samples}, got "
                         f"{args.groups!r}")
    from seekrl.eval.evaluate import eval_rollout_config, evaluate, load_eval_data
    from seekrl.models import load_policy
    from seekrl.recipes.pipeline import DemoConfig
    from seekrl.recipes.setup import check_world_index
    from seekrl.retrieval.index import load_index

    check_world_index(str(args.index), args.data)
    episode = DemoConfig().rollout.model_copy(update={
        k: v for k, v in (("topk", args.topk), ("max_new_tokens", args.max_new_tokens),
                          ("max_turns", args.max_turns)) if v is not None}
        | {"batch_size": args.batch_size})
    data = load_eval_data([args.data], limit=args.limit)
    retriever = load_index(args.index)
    policy, tokenizer = load_policy(args.model, dtype=args.dtype, device=args.device)
    record: dict = {"model": args.model, "data": args.data, "index": str(args.index),
                    "questions": sum(len(v) for v in data.values()), "samples": args.samples,
                    "runs": {}}
    summary = []
    for t in temperatures:
        cfg = eval_rollout_config(episode, n_samples=args.samples, temperature=t,
                                  seed=args.seed)
        got: list = []
        t0 = time.time()
        metrics = evaluate(policy, tokenizer, retriever, data, cfg, args.out / f"t{t:g}",
                           progress=False, on_finish=got.append)
        seconds = time.time() - t0
        rewards: dict[str, list[float]] = defaultdict(list)
        types: dict[str, str] = {}
        for tr in sorted(got, key=lambda x: (x.example_id, x.sample_index)):
            rewards[tr.example_id].append(float(tr.outcome_reward or 0.0))
            types[tr.example_id] = (tr.metadata or {}).get("type")
        run = {"valid_format": metrics["average"]["valid_format"], "seconds": round(seconds, 1),
               "groups": {}, "per_question": {q: {"type": types[q], "outcome_rewards": r}
                                              for q, r in rewards.items()}}
        print(f"t{t:g}_valid_format={run['valid_format']:.3f}")
        print(f"t{t:g}_seconds={seconds:.1f}")
        for g in sizes:
            figures = group_figures(rewards, types, g)
            run["groups"][str(g)] = figures
            for k, v in figures.items():
                print(f"t{t:g}_g{g}_{k}={v:.3f}")
            summary.append(f"T{t:g} g{g} {figures['signal']:.2f}")
        record["runs"][f"{t:g}"] = run
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "signal.json").write_text(json.dumps(record, indent=1))
    print(f"records={args.out / 'signal.json'}")
    print(f"group_signal ({record['questions']} questions, share of groups whose rewards "
          "vary): " + ", ".join(summary))


if __name__ == "__main__":
    main()
