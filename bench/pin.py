"""A refactor's pin: every training recipe on the tiny random model with fixed seeds, every
number it logs and a checksum of every weight it trains, written to one JSON file. Run it
before and after a change that must not move a number, then compare the two files:

    .venv/bin/python bench/pin.py --out /tmp/pin-before.json
    ... change the code ...
    .venv/bin/python bench/pin.py --out /tmp/pin-after.json --compare /tmp/pin-before.json

What it runs (one thread, CPU, float32; about two minutes):
- `Trainer`, two steps of 2 questions x G=2 on a seed-4 medium world, with each registered
  advantage estimator (tree rollouts for tree_grpo), each named process method, dynamic
  sampling, KL in the reward, a critic, and a budgeted run; the reward is the tests' parity
  reward (the tiny model never answers right), so every update moves the weights.
- `seekrl prorag`'s tiny pipeline: SFT, MCTS labels, PRM, RFT refinement and PRM-rewarded
  RL, each stage's summary and weights.

Prints `key=value` lines (a run's name and its number of pinned figures), the last line a
summary: `pinned=N runs=M` and, with --compare, `moved=K` (figures that differ, exactly).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import io
import json
import math
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from conftest import build_world_and_index  # noqa: E402

import seekrl  # noqa: E402
from seekrl.config import TrainConfig, flat_keys, with_keys  # noqa: E402
from seekrl.data.qa import read_qa_jsonl  # noqa: E402
from seekrl.models import tiny_policy  # noqa: E402
from seekrl.retrieval.index import load_index  # noqa: E402
from seekrl.rewards.outcome import RewardParts  # noqa: E402

# wall-clock and memory figures: not behaviour
UNPINNED = ("time", "tokens_per_s", "peak_", "rss", "elapsed", "seconds", "minutes", "_s",
            "stage_cost")


def parity_reward(t) -> RewardParts:
    r = float(t.sample_index % 2) + 0.1 * (t.n_generated % 3)
    return RewardParts(total=r, outcome=r, format=0.0, penalty=0.0)


def weights_digest(model) -> dict[str, float]:
    total = sq = 0.0
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        x = p.detach().double()
        total += float(x.sum())
        sq += float((x * x).sum())
        h.update(name.encode())
        h.update(p.detach().float().contiguous().numpy().tobytes())
    return {"sum": total, "sumsq": sq, "sha": h.hexdigest()[:16]}


def pinned(record, prefix="") -> dict:
    """The record's figures that are behaviour, flattened to dotted keys."""
    out = {}
    if isinstance(record, dict):
        for k, v in record.items():
            if any(u in str(k) for u in UNPINNED):
                continue
            out.update(pinned(v, f"{prefix}{k}."))
    elif isinstance(record, (list, tuple)):
        for i, v in enumerate(record):
            out.update(pinned(v, f"{prefix}{i}."))
    elif isinstance(record, (int, float, str, bool)) or record is None:
        out[prefix.rstrip(".")] = record
    return out


def train_runs(root: Path) -> dict[str, dict]:
    from seekrl.rl.advantages import ESTIMATORS
    from seekrl.rl.methods import NEEDS_PRM, PROCESS_METHODS, method_overrides

    _, paths, index_dir = build_world_and_index(root / "world", seed=4, difficulty="medium",
                                                entities=200, n_train=16, n_dev=4, n_test=4)
    index, train = load_index(index_dir), read_qa_jsonl(paths["train"])
    model, tok = tiny_policy(seed=3)
    variants: dict[str, dict] = {}
    for name in sorted(ESTIMATORS):
        over = {"algo.advantage": name}
        if name == "tree_grpo":
            over["rollout.tree"] = {"trees": 1, "branches": 1, "rounds": 1}
        variants[f"estimator-{name}"] = over
    for name in sorted(set(PROCESS_METHODS) - NEEDS_PRM):   # prm: the prorag section's
        variants[f"method-{name}"] = method_overrides(name, group_size=2)
    variants["dynamic-sampling"] = {"algo.dynamic_sampling": True}
    variants["kl-in-reward"] = {"algo.advantage": "reinforce_pp", "algo.kl_in_reward": True}
    variants["critic-gae"] = {"algo.advantage": "gae"}
    variants["budget"] = {"steps": 4, "max_rollout_tokens": 60}
    variants["one-update"] = {"algo.epochs": 1, "algo.mini_batch_size": 4}
    base = {"data": "unused", "index": "unused", "steps": 2, "questions_per_step": 2,
            "group_size": 2, "save_every": 1, "seed": 7,
            "rollout": {"max_turns": 2, "max_new_tokens": 6, "max_info_tokens": 48,
                        "topk": 2, "batch_size": 8},
            "algo": {"mini_batch_size": 2, "micro_batch_size": 1, "epochs": 2,
                     "kl_coef": 0.1, "entropy_coef": 0.01},
            "optim": {"lr": 1e-3}}
    out = {}
    for name, over in variants.items():
        tree = with_keys(base, {"out": str(root / name), **over})
        try:
            cfg = TrainConfig.model_validate(tree)
        except Exception as e:   # a variant this version cannot express: pinned as such
            out[name] = {"config_error": str(e).splitlines()[0]}
            continue
        trainer = seekrl.Trainer(cfg, model=copy.deepcopy(model), tokenizer=tok,
                                 retriever=index, questions=train, reward_fn=parity_reward,
                                 overwrite=True, console=None)
        with contextlib.redirect_stdout(io.StringIO()):
            summary = trainer.train()
        records = [json.loads(line) for line in
                   (root / name / "metrics.jsonl").read_text().splitlines()]
        out[name] = {"records": pinned(records), "summary": pinned(summary),
                     "weights": weights_digest(trainer.model)}
    return out


def prorag_run(root: Path) -> dict:
    from seekrl.config import ProragConfig
    from seekrl.models import load_policy
    from seekrl.prorag import run_prorag

    model, tok = tiny_policy(seed=0)
    model.save_pretrained(root / "tiny")
    tok.save_pretrained(root / "tiny")
    cfg = ProragConfig(
        out=str(root / "p"), model=str(root / "tiny"), n_test=3, max_turns=2,
        max_new_tokens=4, train_layers=1,
        sft={"max_steps": 2, "batch_size": 2},
        labels={"questions": 2, "search": {"simulations": 3, "expansions": 3}},
        prm={"steps": 2, "batch_size": 2, "dev_share": 0.5},
        refine={"questions": 2, "samples": 2, "steps": 2},
        rl={"steps": 2, "questions_per_step": 2, "group_size": 2})
    with contextlib.redirect_stdout(io.StringIO()):
        summary = run_prorag(cfg)
    out = {"summary": pinned(summary)}
    for stage in ("sft", "refine", "rl"):
        m, _ = load_policy(str(root / "p" / stage / "final"))
        out[f"weights_{stage}"] = weights_digest(m)
    head = torch.load(root / "p" / "prm" / "final" / "prm_head.pt", weights_only=True)
    out["prm_head"] = {k: float(v.double().sum()) for k, v in sorted(head.items())}
    out["labels"] = hashlib.sha256(
        (root / "p" / "labels" / "labels.jsonl").read_bytes()).hexdigest()[:16]
    return out


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--compare", help="an earlier pin's JSON: print each figure that moved")
    ap.add_argument("--only", default="", help="comma-separated run names (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    only = {s for s in args.only.split(",") if s}
    with tempfile.TemporaryDirectory() as tmp:
        runs = train_runs(Path(tmp))
        runs["prorag"] = prorag_run(Path(tmp))
        runs = json.loads(json.dumps(runs).replace(tmp, "<tmp>"))   # paths: not behaviour
    if only:
        runs = {k: v for k, v in runs.items() if k in only}
    Path(args.out).write_text(json.dumps(runs, indent=1, sort_keys=True))
    figures = flat_keys(runs)
    for name, run in runs.items():
        print(f"run={name} figures={len(flat_keys(run))}")
    line = f"pinned={len(figures)} runs={len(runs)}"
    if args.compare:
        before = flat_keys(json.loads(Path(args.compare).read_text()))
        moved = sorted(k for k in set(before) | set(figures)
                       if not same(before.get(k), figures.get(k)))
        for k in moved[:50]:
            print(f"moved {k}: {before.get(k)!r} -> {figures.get(k)!r}")
        line += f" moved={len(moved)}"
    print(line)


if __name__ == "__main__":
    main()
