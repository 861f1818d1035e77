"""Parallel sub-queries (ParallelSearch) on the demo's world: the same SFT warm-up taught with
one query per search and with independent lookups searched together, each evaluated greedily
on the same test questions with the `max_queries` it was taught. A long run; never in CI.

    .venv/bin/python bench/parallel_search.py --work-dir /tmp/seekrl-parallel --max-queries 3

Each side is the demo's SFT recipe (its steps, batch, learning rate, top blocks) on oracle
episodes of the demo's world: `sequential` on the usual oracle (`seekrl oracle`), `parallel` on
the oracle with `--max-queries` (a comparison's lookups, and the first hop of each branch of a
"same" question, share one search turn). `--sft-sequential DIR` reuses a trained sequential
checkpoint of the same world (bench/process_ablation.py's `sft/final`). A side's result is kept
in `WORK/SIDE/result.json` and not run again. Prints `key=value` figures per side and question
type (EM, model turns, retriever queries and search turns per episode) and ends with a one-line
summary holding `turn_ratio_comparison=` (the parallel side's model turns on comparison
questions over the sequential side's) and `em_gain_comparison=`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

SIDES = ("sequential", "parallel")


def main() -> None:
    from learning import _world

    from seekrl.data.qa import read_qa_jsonl, write_qa_jsonl
    from seekrl.recipes.pipeline import DemoConfig

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/seekrl-parallel"))
    ap.add_argument("--max-queries", type=int, default=3,
                    help="sub-queries per search on the parallel side (3: a three-way comparison "
                         "in one turn)")
    ap.add_argument("--sft-sequential", type=Path, default=None,
                    help="a sequential SFT checkpoint of the same world (default: train one)")
    ap.add_argument("--sft-steps", type=int, default=None, help="default: the demo's")
    ap.add_argument("--max-new-tokens", type=int, default=160,
                    help="turn limit of both sides' evaluations (and SFT's check): the parallel "
                         "oracle's turns run to 144 tokens, past the demo's limit")
    ap.add_argument("--n-test", type=int, default=200)
    ap.add_argument("--eval-batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="float32", help="the evaluations' dtype")
    ap.add_argument("--sft-dtype", default="float32",
                    help="SFT's dtype (float32, as the learning benchmarks' shared start)")
    ap.add_argument("--report", action="store_true", help="only print what WORK holds")
    args = ap.parse_args()
    demo = DemoConfig(n_test=args.n_test, seed=args.seed,
                      rollout={"max_new_tokens": args.max_new_tokens},
                      sft={"max_steps": args.sft_steps} if args.sft_steps else {})
    started = time.time()
    if not args.report:
        world_dir, index_dir = _world(args.work_dir, demo)
        test = read_qa_jsonl(world_dir / "test.jsonl")[:args.n_test]
        test_file = args.work_dir / "test_questions.jsonl"
        write_qa_jsonl(test_file, test)
        for side in SIDES:
            _side(side, args, demo, world_dir, index_dir, test_file)
    _report(args.work_dir, started)


def _side(side: str, args, demo, world_dir: Path, index_dir: Path, test_file: Path) -> dict:
    from seekrl.agent.oracle import write_oracle_trajectories
    from seekrl.config import EvalConfig
    from seekrl.data.qa import read_qa_jsonl
    from seekrl.eval.evaluate import eval_policy
    from seekrl.models import load_policy
    from seekrl.recipes.pipeline import sft_config
    from seekrl.recipes.sft import run_sft
    from seekrl.retrieval.index import load_index

    out = args.work_dir / side
    done = out / "result.json"
    if done.is_file():
        print(f"{side}: already in {done}", flush=True)
        return json.loads(done.read_text())
    out.mkdir(parents=True, exist_ok=True)
    max_queries = args.max_queries if side == "parallel" else 1
    t0 = time.time()
    if side == "sequential" and args.sft_sequential:
        final = args.sft_sequential
    else:
        oracle = args.work_dir / "oracle_train.jsonl"     # the sequential one, from _world
        if side == "parallel":
            oracle = out / "oracle_train.jsonl"
            stats = write_oracle_trajectories(read_qa_jsonl(world_dir / "train.jsonl"),
                                              load_index(index_dir), oracle,
                                              k=demo.rollout.topk,
                                              max_queries=max_queries)
            print(f"parallel oracle: {stats.summary()}", flush=True)
        sft = run_sft(sft_config(demo, oracle, out / "sft", dtype=args.sft_dtype,
                                 rollout={"max_queries": max_queries}), overwrite=True)
        final = Path(sft["final"])
    sft_minutes = (time.time() - t0) / 60
    policy, tokenizer = load_policy(str(final), dtype=args.dtype)
    metrics = eval_policy(policy, tokenizer, load_index(index_dir),
                          EvalConfig(data=str(test_file), n=args.n_test,
                                     batch_size=args.eval_batch),
                          out / "eval-test",
                          episode=demo.rollout.model_copy(update={"max_queries": max_queries}))
    keys = ("em", "f1", "valid_format", "turns", "queries", "searches", "evidence_recall",
            "generated_tokens")
    result = {"side": side, "max_queries": max_queries, "sft": str(final),
              "average": {k: metrics["average"].get(k) for k in keys},
              "by_type": {t: {k: row.get(k) for k in (*keys, "questions")}
                          for t, row in next(iter(metrics["by_type"].values()), {}).items()},
              "sft_minutes": round(sft_minutes, 2),
              "minutes": round((time.time() - t0) / 60, 2), "n_test": args.n_test,
              "dtype": args.dtype, "sft_dtype": args.sft_dtype}
    done.write_text(json.dumps(result, indent=1))
    avg = result["average"]
    print(f"{side}: EM {avg['em']:.3f} turns {avg['turns']:.2f} queries {avg['queries']:.2f} "
          f"({result['minutes']:.1f} min)", flush=True)
    return result


def _report(work: Path, started: float) -> None:
    results = {s: json.loads((work / s / "result.json").read_text()) for s in SIDES
               if (work / s / "result.json").is_file()}
    if not results:
        raise SystemExit(f"no results under {work}: run the sides first")
    for side, r in results.items():
        a = r["average"]
        print(f"em_{side}={a['em']:.4f} valid_format_{side}={a['valid_format']:.3f} "
              f"turns_{side}={a['turns']:.2f} queries_{side}={a['queries']:.2f} "
              f"searches_{side}={a['searches']:.2f} "
              f"generated_tokens_{side}={a['generated_tokens']:.1f}")
        for t, row in sorted(r["by_type"].items()):
            print(f"em_{side}_{t}={row['em']:.4f} turns_{side}_{t}={row['turns']:.2f} "
                  f"queries_{side}_{t}={row['queries']:.2f} questions_{t}={row['questions']}")
    if len(results) < 2:
        print(f"parallel_search: only {', '.join(results)} so far")
        return
    seq, par = results["sequential"]["by_type"], results["parallel"]["by_type"]
    comp_s, comp_p = seq.get("comparison"), par.get("comparison")
    ratio = comp_p["turns"] / comp_s["turns"] if comp_s and comp_s["turns"] else float("nan")
    gain = comp_p["em"] - comp_s["em"] if comp_s and comp_p else float("nan")
    bridge = (par.get("bridge", {}).get("em", float("nan"))
              - seq.get("bridge", {}).get("em", float("nan")))
    print(f"parallel_search: comparison questions {comp_s['turns']:.2f} -> {comp_p['turns']:.2f} "
          f"model turns (turn_ratio_comparison={ratio:.3f}), EM {comp_s['em']:.3f} -> "
          f"{comp_p['em']:.3f} (em_gain_comparison={gain:+.3f}); bridge EM {bridge:+.3f}; "
          f"all EM {results['sequential']['average']['em']:.3f} -> "
          f"{results['parallel']['average']['em']:.3f} "
          f"({(time.time() - started) / 60:.0f} min this run)")


if __name__ == "__main__":
    main()
