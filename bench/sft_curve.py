"""SFT curve: test EM against the SFT budget (optimizer steps on oracle episodes), on the
demo's synthetic world, to choose the shared start of the learning benchmarks.

    .venv/bin/python bench/sft_curve.py --work-dir /tmp/seekrl-sft-curve --budgets 20,50,100,200

Each budget is its own SFT run with the demo's recipe (its batch, learning rate, warm-up and
cosine decay to 10%, top `train_layers` blocks), so a point is what that budget buys, not a
mid-run checkpoint of a longer schedule. Every run's final policy is evaluated greedily on the
same `--n-test` test questions (200 by default) with the demo's rollout settings. A point is
kept in `WORK/sft-STEPS/point.json` as soon as it is done and not run again, so the curve can
be grown over several sessions (budgets run smallest first). Prints `key=value` figures per
budget (EM, F1, valid format, searches, EM per question type, minutes) and ends with a
one-line summary; draws `sft_curve.png`.

`--on dev` evaluates on the world's first `--n-test` dev questions instead (`point-dev.json`,
`eval-dev`; the report reads the points of the same set): a start is chosen there, and the
test questions judge the RL runs from it.

`--set KEY=VALUE` (repeatable, a YAML value) puts an SFT key on top of the demo's recipe, e.g.
a plan-weighted, type-balanced start: `--set plan_weight=5 --set balance_types=hops`. Such
points are kept apart (`WORK/sft-STEPS-plan_weight=5-balance_types=hops`), and the report
reads the points of the same settings (`sft_curve-SETTINGS.png`).

`--judge ordered` trains on oracle episodes whose comparisons write their decision out (the
values in order, then the end the question wants: `seekrl oracle --judge`), written once to
`WORK/oracle_train-judge=ordered.jsonl`; its longest answer turn needs `--max-new-tokens 160`
(the turn limit of SFT's layout and of the evaluation). Both are part of a point's settings.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    from seekrl.recipes.pipeline import DemoConfig

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/seekrl-sft-curve"))
    ap.add_argument("--budgets", default="20,50,100,200", help="SFT steps, comma-separated")
    ap.add_argument("--n-test", type=int, default=200)
    ap.add_argument("--on", choices=("test", "dev"), default="test",
                    help="the questions each point is evaluated on (dev: to choose a start)")
    ap.add_argument("--eval-batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", help="SFT's and the evaluation's (bf16-mixed: "
                    "float32 weights, bfloat16 products); a point records it")
    ap.add_argument("--report", action="store_true", help="only print what WORK holds")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an SFT key on top of the demo's recipe (a YAML value), e.g. "
                    "plan_weight=5 or balance_types=hops; repeatable")
    ap.add_argument("--judge", choices=("values", "ordered"), default="values",
                    help="the oracle's comparison judgement (ordered: the decision written out)")
    ap.add_argument("--max-new-tokens", type=int, default=None,
                    help="the turn limit of SFT's layout and the evaluation (default: the demo's)")
    args = ap.parse_args()
    args.sft_keys = _sft_keys(args.set)
    args.variant = _variant(args.judge, args.max_new_tokens)
    budgets = sorted(int(b) for b in args.budgets.split(",") if b.strip())
    demo = DemoConfig(n_test=args.n_test, seed=args.seed,
                      rollout={"max_new_tokens": args.max_new_tokens} if args.max_new_tokens else {})
    started = time.time()
    if not args.report:
        from learning import _world

        from seekrl.data.qa import read_qa_jsonl, write_qa_jsonl

        world_dir, index_dir = _world(args.work_dir, demo)
        test = read_qa_jsonl(world_dir / f"{args.on}.jsonl")[:args.n_test]
        if len(test) < args.n_test:
            raise SystemExit(f"--n-test: the world has {len(test)} {args.on} questions")
        test_file = args.work_dir / f"{args.on}_questions.jsonl"
        write_qa_jsonl(test_file, test)
        oracle = _oracle(args, demo, world_dir, index_dir)
        for steps in budgets:
            _point(steps, args, demo, index_dir, test_file, oracle)
    _report(args.work_dir, started, args.dtype, {**args.sft_keys, **args.variant}, args.on)


ORDERED_TURN_LIMIT = 160   # the written-out comparisons' longest turn is ~156 tokens


def _variant(judge: str, max_new_tokens: int | None) -> dict:
    """What besides SFT keys makes a point's settings: the oracle's judgement and the turn
    limit, each where it is not the default (today's folders and points otherwise)."""
    from seekrl.config import DEFAULT_MAX_NEW_TOKENS

    if judge == "ordered" and (max_new_tokens or DEFAULT_MAX_NEW_TOKENS) < ORDERED_TURN_LIMIT:
        raise SystemExit(f"--judge ordered: its comparisons' last turns run to ~156 tokens; "
                         f"give --max-new-tokens {ORDERED_TURN_LIMIT} (or more), or rollouts "
                         "would cut them")
    return {k: v for k, v in (("judge", None if judge == "values" else judge),
                              ("max_new_tokens", max_new_tokens)) if v}


def _oracle(args, demo, world_dir: Path, index_dir: Path) -> Path:
    """The oracle episodes SFT trains on: the world's (`_world` writes them) or, with another
    judgement, written here once."""
    if args.judge == "values":
        return args.work_dir / "oracle_train.jsonl"
    from seekrl.agent.oracle import write_oracle_trajectories
    from seekrl.data.qa import read_qa_jsonl
    from seekrl.retrieval.index import load_index

    out = args.work_dir / f"oracle_train-judge={args.judge}.jsonl"
    if not out.is_file():
        write_oracle_trajectories(read_qa_jsonl(world_dir / "train.jsonl"), load_index(index_dir),
                                  out, k=demo.rollout.topk, judge=args.judge)
    return out


def _sft_keys(pairs: list[str]) -> dict:
    import yaml

    keys = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise SystemExit(f"--set {pair}: expected KEY=VALUE")
        keys[key.strip()] = yaml.safe_load(value)
    return json.loads(json.dumps(keys))   # as point.json keeps them ({1: 2} -> {"1": 2})


def _tag(keys: dict) -> str:
    """The settings in a folder name: `-plan_weight=5-type_weights=1:2,2:1`."""
    def text(v) -> str:
        return json.dumps(v, separators=(",", ":")).strip('"{}[]').replace('"', "")
    return "".join(f"-{k}={text(v)}" for k, v in keys.items())


def _point(steps: int, args, demo, index_dir: Path, test_file: Path, oracle: Path) -> dict:
    from process_ablation import _evaluate

    from seekrl.recipes.pipeline import sft_config
    from seekrl.recipes.sft import run_sft

    out = args.work_dir / ((f"sft-{steps}" if args.dtype == "float32" else f"sft-{steps}-{args.dtype}")
                           + _tag({**args.sft_keys, **args.variant}))
    done = out / _point_name(args.on)
    if done.is_file():
        return json.loads(done.read_text())
    t0 = time.time()
    # a run killed before its point goes on from its last checkpoint (every 10 steps)
    resume = (out / "run" / "checkpoints" / "latest").is_file()
    cfg = sft_config(demo, oracle, out / "run", max_steps=steps,
                     device=args.device, dtype=args.dtype, save_every=10, keep_last=1,
                     **args.sft_keys)
    final = out / "run" / "final"
    reused = (final / "config.json").is_file()
    if reused:   # trained for the other question set's point, or killed before this one
        # was written: the same policy, evaluated here
        log = [json.loads(x) for x in (out / "run" / "metrics.jsonl").read_text().splitlines()]
        sft = {"final": str(final), "loss": next((r["loss"] for r in reversed(log)
                                                   if "loss" in r), None)}
    else:
        sft = run_sft(cfg, overwrite=not resume, resume=resume)
    sft_minutes = (time.time() - t0) / 60
    metrics = _evaluate(Path(sft["final"]), out / f"eval-{args.on}", index_dir, test_file,
                        demo, args)
    avg = metrics["average"]
    types = next(iter(metrics["by_type"].values()), {})
    by_type = {k: v["em"] for k, v in types.items()}
    point = {"steps": steps, "episodes": steps * cfg.batch_size * cfg.grad_accum, "em": avg["em"],
             "f1": avg["f1"], "valid_format": avg["valid_format"], "searches": avg["searches"],
             "evidence_recall": avg.get("evidence_recall"), "em_by_type": by_type,
             "final_loss": sft["loss"], "sft_minutes": round(sft_minutes, 2),
             "minutes": round((time.time() - t0) / 60, 2), "device": args.device,
             "dtype": args.dtype, "resumed": resume and not reused, "reused": reused,
             "n_test": args.n_test, "seed": demo.seed, "on": args.on,
             # the hop decision: searches a question per type (a start whose lookups
             # follow the question searches once for single-hop, twice for bridges)
             "searches_by_type": {k: v.get("searches") for k, v in types.items()},
             "planned_by_type": {k: v.get("planned_lookups") for k, v in types.items()}}
    if args.sft_keys or args.variant:   # older points, without the field, used the recipe
        point["settings"] = {**args.sft_keys, **args.variant}
    done.write_text(json.dumps(point, indent=1))
    print(f"sft {steps} steps: EM {avg['em']:.3f} valid {avg['valid_format']:.2f} searches "
          f"{avg['searches']:.2f} ({point['minutes']:.1f} min)", flush=True)
    return point


def _point_name(on: str) -> str:
    return "point.json" if on == "test" else f"point-{on}.json"


def _report(work: Path, started: float, dtype: str, keys: dict | None = None,
            on: str = "test") -> None:
    """The points of `dtype` (older points, without the field, were float32), of the SFT
    settings `keys` and evaluated on `on`."""
    points = sorted((p for p in (json.loads(f.read_text())
                                 for f in work.glob(f"sft-*/{_point_name(on)}"))
                     if p.get("dtype", "float32") == dtype
                     and p.get("settings", {}) == (keys or {})), key=lambda p: p["steps"])
    if not points:
        raise SystemExit(f"no {dtype} points under {work}: run some budgets first")
    for p in points:
        s = p["steps"]
        print(f"em_sft{s}={p['em']:.4f} f1_sft{s}={p['f1']:.4f} "
              f"valid_format_sft{s}={p['valid_format']:.3f} searches_sft{s}={p['searches']:.2f} "
              f"minutes_sft{s}={p['minutes']:.1f}")
        for t, em in sorted(p["em_by_type"].items()):
            print(f"em_sft{s}_{t}={em:.4f}")
        for name, key in (("searches", "searches_by_type"), ("planned", "planned_by_type")):
            for t, n in sorted((p.get(key) or {}).items()):
                if n is not None:
                    print(f"{name}_sft{s}_{t}={n:.2f}")
    plot = work / f"sft_curve{_tag(keys or {})}{'' if on == 'test' else '-' + on}.png"
    _plot(points, plot, on)
    print(f"plot={plot}")
    best = max(points, key=lambda p: p["em"])
    print("sft_curve: " + ", ".join(f"{p['steps']} steps EM {p['em']:.3f}" for p in points)
          + f" on {points[0]['n_test']} {on} questions; best {best['steps']} steps"
          + f" ({(time.time() - started) / 60:.0f} min this run)")


def _plot(points: list[dict], path: Path, on: str = "test") -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.5), dpi=100)
    ax = fig.add_subplot()
    xs = [p["steps"] for p in points]
    ax.plot(xs, [p["em"] for p in points], marker="o", label="EM")
    types = sorted({t for p in points for t in p["em_by_type"]})
    for t in types:
        ax.plot(xs, [p["em_by_type"].get(t, float("nan")) for p in points], marker=".",
                linestyle="--", label=f"EM {t}")
    ax.set_xscale("log")
    ax.set_xlabel("SFT steps (8 oracle episodes each)")
    ax.set_ylabel(f"{on} EM (greedy, {points[0]['n_test']} questions)")
    ax.set_title(f"seekrl: {on} EM against the SFT budget")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    main()
