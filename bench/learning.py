"""Learning benchmark: test EM against RL steps for GRPO, Dr. GRPO and PPO (GAE), from one
SFT checkpoint, on the demo's synthetic world. A long run (hours on a CPU); never in CI.

    .venv/bin/python bench/learning.py --work-dir /tmp/seekrl-learning --steps 60 --eval-every 10

The first run builds the world and index like `seekrl demo` (same `DemoConfig`) and trains
the SFT checkpoint (or pass `--sft DIR`); every estimator then starts from that checkpoint
with the same seed, questions per step, group size, temperature and learning rate, and is
evaluated greedily on the same test questions every `--eval-every` steps.

Each estimator's curve is kept in `WORK/rl-NAME/curve.json` as soon as it finishes, and an
estimator whose curve is already there (for the same steps) is not run again, so a run can
be split: `--stage sft` once, then one process per estimator (`--estimators gae`, in
parallel on a GPU, say), then `--stage plot`. Prints `key=value` figures (EM per estimator
and step), draws `learning.png` from every curve in WORK, and ends with a one-line summary.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    from seekrl.data.qa import read_qa_jsonl, write_qa_jsonl
    from seekrl.recipes.pipeline import DemoConfig

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/seekrl-learning"))
    ap.add_argument("--sft", type=Path, default=None, help="SFT checkpoint (default: train one)")
    ap.add_argument("--stage", choices=("all", "sft", "rl", "plot"), default="all",
                    help="all (default) | sft: world, index and SFT only | rl: the estimators "
                         "only (no plot) | plot: draw what WORK holds")
    ap.add_argument("--estimators", default="grpo,dr_grpo,gae")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--n-test", type=int, default=100)
    ap.add_argument("--lr", type=float, default=None, help="default: the demo's RL lr")
    ap.add_argument("--kl-coef", type=float, default=None, help="default: the demo's")
    ap.add_argument("--format-reward", type=float, default=0.0,
                    help="reward added for a valid protocol trace")
    ap.add_argument("--max-turns-penalty", type=float, default=0.0,
                    help="subtracted when an episode runs out of turns or tokens")
    ap.add_argument("--tag", default="", help="suffix of the run folders (rl-NAME-TAG), to "
                    "compare settings of one estimator")
    ap.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    ap.add_argument("--gpu-fraction", type=float, default=None,
                    help="cap this process's share of GPU memory (for estimators run in "
                         "parallel on one GPU: the caching allocator then frees its cache "
                         "instead of starving the others)")
    args = ap.parse_args()
    if args.gpu_fraction:
        import torch

        torch.cuda.set_per_process_memory_fraction(args.gpu_fraction)

    demo = DemoConfig(n_test=args.n_test)
    work = args.work_dir
    started = time.time()
    if args.stage != "plot":
        world_dir, index_dir = _world(work, demo)
        test_file = work / "test_questions.jsonl"
        write_qa_jsonl(test_file, read_qa_jsonl(world_dir / "test.jsonl")[:args.n_test])
        sft = args.sft or _sft(work, demo, index_dir, args.device)
        print(f"sft_checkpoint={sft}", flush=True)
        if args.stage in ("all", "rl"):
            for name in args.estimators.split(","):
                _run_estimator(name, args, demo, sft, world_dir, index_dir, test_file)
    if args.stage in ("all", "plot"):
        curves = {p.parent.name.removeprefix("rl-"): json.loads(p.read_text())
                  for p in sorted(work.glob("rl-*/curve.json"))}
        if not curves:
            raise SystemExit(f"no curves under {work}: run the estimators first")
        for name, c in curves.items():
            for step, em in c["points"]:
                print(f"em_{name}_step{step}={em:.4f}")
            print(f"minutes_{name}={c['minutes']:.1f}")
        _plot(curves, work / "learning.png")
        print(f"plot={work / 'learning.png'}")
        print("learning: " + ", ".join(
            f"{n} EM {c['points'][0][1]:.3f}->{c['points'][-1][1]:.3f} "
            f"(best {max(em for _, em in c['points']):.3f})" for n, c in curves.items())
            + f" over {max(c['steps'] for c in curves.values())} steps"
            + f" ({(time.time() - started) / 60:.0f} min this run)")


def _run_estimator(name, args, demo, sft: Path, world_dir: Path, index_dir: Path,
                   test_file: Path) -> None:
    from seekrl.recipes.pipeline import rl_config
    from seekrl.recipes.train import Trainer
    from seekrl.rl import step_metrics as M

    out = args.work_dir / (f"rl-{name}-{args.tag}" if args.tag else f"rl-{name}")
    done = out / "curve.json"
    if done.is_file() and json.loads(done.read_text())["steps"] == args.steps:
        print(f"{name}: curve already in {done}", flush=True)
        return
    t0 = time.time()
    # the demo's RL stage (src/seekrl/presets/demo/rl.yaml) with this estimator, its steps and figures
    cfg = rl_config(demo, model=sft, train_file=world_dir / "train.jsonl", index_dir=index_dir,
                    out=out, keys={
                        "steps": args.steps, "device": args.device, "algo.advantage": name,
                        **({} if args.kl_coef is None else {"algo.kl_coef": args.kl_coef}),
                        **({"optim.lr": args.lr} if args.lr else {}),
                        "reward.format_reward": args.format_reward,
                        "reward.max_turns_penalty": args.max_turns_penalty,
                        "log.save_rollouts": 0,
                        "eval": {"data": str(test_file), "n": args.n_test,
                                 "every": args.eval_every,
                                 "at_start": False}})   # evaluated below, as step 0
    trainer = Trainer(cfg, overwrite=True)
    start_em = trainer.evaluate(out / "eval" / "step-0")["em"]
    print(f"em_{name}_step0={start_em:.4f}", flush=True)
    trainer.train()
    dev_em = M.DEV + M.EM
    points = [(0, start_em)] + [
        (r[M.STEP], r[dev_em]) for r in map(json.loads, (out / "metrics.jsonl")
                                            .read_text().splitlines()) if dev_em in r]
    done.write_text(json.dumps({"steps": args.steps, "points": points, "lr": cfg.optim.lr,
                                "kl_coef": cfg.algo.kl_coef, "device": args.device,
                                "format_reward": cfg.reward.format_reward,
                                "max_turns_penalty": cfg.reward.max_turns_penalty,
                                "minutes": (time.time() - t0) / 60}))
    print(f"{name}: EM {points[0][1]:.3f}->{points[-1][1]:.3f} in {args.steps} steps "
          f"({(time.time() - t0) / 60:.1f} min)", flush=True)


def _world(work: Path, demo) -> tuple[Path, Path]:
    from seekrl.agent.oracle import write_oracle_trajectories
    from seekrl.data.qa import read_qa_jsonl
    from seekrl.data.world import generate_world, write_world
    from seekrl.recipes.pipeline import demo_world
    from seekrl.retrieval.index import build_index, load_index

    world_dir, index_dir = work / "world", work / "index"
    if not (index_dir / "manifest.json").is_file():
        world = generate_world(demo_world(demo))
        paths = write_world(world, world_dir)
        build_index(paths["corpus"], index_dir, "bm25", overwrite=True, show_progress=False)
        write_oracle_trajectories(read_qa_jsonl(paths["train"]), load_index(index_dir),
                                  work / "oracle_train.jsonl", k=demo.rollout.topk)
    return world_dir, index_dir


def _rl_world(work: Path, demo, seed: int) -> tuple[Path, Path]:
    """Another world of the demo's settings, seed `seed`, and its BM25 index, built once
    under `work`/rl-world-sSEED: questions about entities the demo's world lacks."""
    from seekrl.data.world import generate_world, write_world
    from seekrl.recipes.pipeline import demo_world
    from seekrl.retrieval.index import build_index

    if seed == demo.seed:
        raise SystemExit(f"--rl-world-seed {seed}: the evaluations' own world; give another seed")
    folder = work / f"rl-world-s{seed}"
    world_dir, index_dir = folder / "world", folder / "index"
    if not (index_dir / "manifest.json").is_file():
        paths = write_world(generate_world(demo_world(demo.model_copy(update={"seed": seed}))),
                            world_dir)
        build_index(paths["corpus"], index_dir, "bm25", overwrite=True, show_progress=False)
    return world_dir, index_dir


def _setup(work: Path, demo, n_test: int, sft: Path | None, device: str
           ) -> tuple[Path, Path, Path, Path]:
    """The demo's world, its first `n_test` test questions in a file, and the SFT
    checkpoint (trained once, or `sft`): (world dir, index dir, test file, SFT dir)."""
    from seekrl.data.qa import read_qa_jsonl, write_qa_jsonl

    world_dir, index_dir = _world(work, demo)
    test_file = work / "test_questions.jsonl"
    test = read_qa_jsonl(world_dir / "test.jsonl")[:n_test]
    if len(test) < n_test:
        raise SystemExit(f"--n-test: the world has {len(test)} test questions")
    write_qa_jsonl(test_file, test)
    sft = sft or _sft(work, demo, index_dir, device)
    print(f"sft_checkpoint={sft}", flush=True)
    return world_dir, index_dir, test_file, sft


def _sft(work: Path, demo, index_dir: Path, device: str) -> Path:
    from seekrl.recipes.pipeline import sft_config
    from seekrl.recipes.sft import run_sft

    final = work / "sft" / "final"
    if not (final / "config.json").is_file():
        run_sft(sft_config(demo, work / "oracle_train.jsonl", work / "sft", device=device),
                overwrite=True)   # a run killed before `final` is redone
    return final


def _plot(curves: dict[str, dict], path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.5), dpi=100)
    ax = fig.add_subplot()
    for name, c in curves.items():
        ax.plot([s for s, _ in c["points"]], [e for _, e in c["points"]], marker="o", label=name)
    ax.set_xlabel("RL step")
    ax.set_ylabel("test EM (greedy)")
    ax.set_title("seekrl: test EM from the SFT checkpoint")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    main()
