"""A PRM's scoring pass, as an RL step with `reward.process.prm` runs it, side by side in one
process: float32 (the scorer's dtype before 2026-11-27, whatever the run's) against
bf16-mixed (autocast, weights cast once a call: what a `dtype: bf16-mixed` run now gets), at
the scorer's batch size and at a whole step's batch.

    .venv/bin/python bench/prm_scoring.py --prm runs/prm/final --labels runs/labels \\
        --questions 8 --per-question 4 --rounds 3

The episodes are the label folder's (MCTS paths: the same protocol, prompts and lengths as
a training step's rollouts), `--per-question` of each of `--questions` questions, as a step
of 8 questions x 4 rollouts hands them to the scorer. The settings run in turn, each round
in a new order, so a noisy machine slows them alike. Prints `key=value` figures: seconds a
scoring pass (median of the rounds) per setting, their ratio to float32 at batch 8, and the
largest change of a step's probability against float32; the last line is a one-line summary.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

SETTINGS = (("float32", 8), ("bf16-mixed", 8), ("bf16-mixed", 32))


def main() -> None:
    import torch

    from seekrl.recipes.labels import read_labels
    from seekrl.rewards.prm import PRMScorer, load_scorer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prm", type=Path, required=True, help="a `seekrl prm train` folder")
    ap.add_argument("--labels", type=Path, required=True, help="a `seekrl mcts` label folder")
    ap.add_argument("--questions", type=int, default=8)
    ap.add_argument("--per-question", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    by_question: dict[str, list] = {}
    for ep in read_labels([args.labels]).episodes:
        if ep.steps:
            by_question.setdefault(ep.example_id, []).append(ep)
    groups = [eps[:args.per_question] for eps in by_question.values()
              if len(eps) >= args.per_question][:args.questions]
    if len(groups) < args.questions:
        raise SystemExit(f"--labels: only {len(groups)} questions with {args.per_question} "
                         "labelled episodes")
    episodes = [ep for g in groups for ep in g]
    tokens = sum(len(ep.token_ids) for ep in episodes)
    steps = sum(len(ep.steps) for ep in episodes)
    print(f"episodes={len(episodes)} steps={steps} tokens={tokens}", flush=True)

    loaded = {dtype: load_scorer(args.prm, dtype=dtype) for dtype in {d for d, _ in SETTINGS}}
    scorers = {(dtype, batch): PRMScorer(loaded[dtype].prm, loaded[dtype].tokenizer,
                                         batch_size=batch) for dtype, batch in SETTINGS}
    times: dict[tuple[str, int], list[float]] = {s: [] for s in SETTINGS}
    scores: dict[tuple[str, int], list[list[float]]] = {}
    for s in SETTINGS:                  # a warm-up pass each, not timed
        scores[s] = scorers[s].score_steps(episodes)
    for r in range(args.rounds):
        for s in SETTINGS[r % len(SETTINGS):] + SETTINGS[:r % len(SETTINGS)]:
            t0 = time.perf_counter()
            scorers[s].score_steps(episodes)
            times[s].append(time.perf_counter() - t0)

    base = SETTINGS[0]
    med = {s: statistics.median(v) for s, v in times.items()}
    for s in SETTINGS:
        key = f"{s[0].replace('-', '_')}_b{s[1]}"
        drift = max(abs(a - b) for ra, rb in zip(scores[s], scores[base]) for a, b in zip(ra, rb))
        print(f"{key}_s={med[s]:.2f} {key}_ratio={med[s] / med[base]:.3f} "
              f"{key}_tokens_per_s={tokens / med[s]:.0f} {key}_max_prob_change={drift:.4f}",
              flush=True)
    best = min(SETTINGS[1:], key=med.get)
    print(f"prm scoring of {len(episodes)} episodes ({tokens} tokens): float32 b8 "
          f"{med[base]:.1f}s, bf16-mixed b8 {med[SETTINGS[1]]:.1f}s, b32 {med[SETTINGS[2]]:.1f}s; "
          f"best {best[0]} b{best[1]} = {med[best] / med[base]:.2f}x float32")


if __name__ == "__main__":
    main()
