"""Sharded (`shard: fsdp`, PyTorch FSDP2) against replicated (`shard: none`) data-parallel RL
training: the same run, the same seed, launched the way the README gives
(`torchrun --standalone --nproc_per_node N -m seekrl.cli train ...`), once per side.

The run: the bundled SmolLM2-135M (full fine-tuning, float32 on CPU; `--dtype bfloat16` on
GPUs), the demo's synthetic world (medium, 1-3 hops) with a BM25 index, `--questions` x G=4
episodes per step of <= 3 turns of <= `--max-new-tokens` tokens, one optimizer step per
RL step (micro-batches of 4), AdamW, a frozen reference for a KL term of 0.01 (so the
reference is sharded too), no checkpoints, no evaluation, `--steps` steps. One thread per
process on CPU (`OMP_NUM_THREADS=1`). The sides alternate which runs first over repeats.

Read from each run's `metrics.jsonl` (every figure the largest over the ranks):
- `peak_rss_mb`: the process's peak resident memory (CPU), `peak_gpu_mb` (CUDA): what
  sharding buys. Per process, replicated holds the weights, their gradient and AdamW's two
  moments (16 bytes per parameter in float32); sharded holds 1/N of each, plus the full
  weights while it plays (gathered for the rollouts and log-probs, freed after).
- `time_step` (the whole step), `time_update` (forward / backward / optimizer over the batch):
  what sharding costs (the all-gathers and reduce-scatters of every block).
- The final policies of both sides: `max_weight_diff`. The sharded update skips prompt
  sharing (same function, other float rounding), so sampled episodes may part after the
  first update; on the first step both sides play the same episodes (`same_first_batch`).
  `--unshared` adds a third side, replicated without prompt sharing, to tell the time the
  sharded update loses to that from what its collectives cost.

    .venv/bin/python bench/shard.py [--nproc 2] [--steps 3] [--questions 4] [--repeats 1]
        [--device cpu|cuda] [--dtype float32] [--max-new-tokens 32] [--unshared]

Prints key=value lines; the last one is the summary with `rss_ratio` (fsdp / none, CPU) or
`gpu_mem_ratio` (CUDA), and `update_time_ratio` (fsdp / none).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from seekrl.data.world import WorldConfig, generate_world, write_world
from seekrl.retrieval.index import build_index
from seekrl.rl import step_metrics as M

SIDES = ("none", "fsdp")
# the replicated run without prompt sharing, which a sharded update does without (--unshared)
UNSHARED = "none-unshared"


def build_world(work: Path) -> tuple[Path, Path]:
    world = generate_world(WorldConfig(seed=0, difficulty="medium", doc_words=(12, 30),
                                       hop_mix={1: 0.3, 2: 0.45, 3: 0.25}))
    paths = write_world(world, work / "world")
    index = build_index(paths["corpus"], work / "index", show_progress=False)
    return Path(paths["train"]), Path(index)


def run_side(args, side: str, data: Path, index: Path, out: Path) -> dict:
    shard = "none" if side == UNSHARED else side
    torchrun = Path(sys.executable).with_name("torchrun")
    n = args.questions * 4
    cmd = [str(torchrun), "--standalone", "--nproc_per_node", str(args.nproc),
           "-m", "seekrl.cli", "train", "model=smollm2-135m", f"data={data}",
           f"index={index}", f"out={out}", f"steps={args.steps}", "seed=0",
           f"questions_per_step={args.questions}", "group_size=4", "save_every=0",
           "eval.data=", f"device={args.device}", f"dtype={args.dtype}", f"shard={shard}",
           "rollout.max_turns=3", f"rollout.max_new_tokens={args.max_new_tokens}",
           "rollout.topk=2", "rollout.max_info_tokens=128", f"rollout.batch_size={n}",
           "algo.advantage=grpo", "algo.epochs=1", f"algo.mini_batch_size={n}",
           "algo.micro_batch_size=4", "algo.kl_coef=0.01", "optim.lr=1e-6",
           "optim.schedule=constant", "optim.warmup_steps=0", "log.save_rollouts=1"]
    if side == UNSHARED:
        cmd.append("algo.share_prompts=false")
    env = dict(os.environ)
    if args.device == "cpu":
        env.update(OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_=str(1 << 20))
    started = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    if r.returncode != 0:
        raise SystemExit(f"shard={shard}: torchrun exited {r.returncode}\n"
                         f"{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if M.EPISODES in s]
    first = out / "rollouts" / "step-1" / "trajectories.jsonl"
    rollouts = [json.loads(x) for x in first.read_text().splitlines()] if first.is_file() \
        else []

    def total(key):
        return sum(s.get(key, 0.0) for s in steps)
    return {"wall": wall, "time_step": total(M.TIME_STEP), "time_update": total(M.TIME_UPDATE),
            "peak_rss_mb": max(s[M.PEAK_RSS_MB] for s in steps),
            "peak_gpu_mb": max((s.get(M.PEAK_GPU_MB, 0.0) for s in steps), default=0.0),
            "state_mb": steps[-1][M.STATE_MB],
            "reward": [s[M.REWARD] for s in steps],
            "first_batch": [x.get("token_ids") for x in rollouts],
            "final": out / "final"}


def max_weight_diff(a: Path, b: Path) -> float:
    from transformers import AutoModelForCausalLM

    wa = dict(AutoModelForCausalLM.from_pretrained(a).named_parameters())
    wb = dict(AutoModelForCausalLM.from_pretrained(b).named_parameters())
    with torch.no_grad():
        return max(float((wa[n] - wb[n]).abs().max()) for n in wa)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--questions", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--unshared", action="store_true",
                    help="a third side: replicated without prompt sharing")
    args = ap.parse_args()
    sides = SIDES + ((UNSHARED,) if args.unshared else ())
    if args.questions % args.nproc:
        raise SystemExit("--questions must be a multiple of --nproc (whole groups per rank)")
    print(f"machine={platform.machine()} cpus={os.cpu_count()} torch={torch.__version__} "
          f"device={args.device} nproc={args.nproc}")
    work = Path(tempfile.mkdtemp(prefix="seekrl-shard-"))
    data, index = build_world(work)
    runs: dict[str, list[dict]] = {s: [] for s in sides}
    for rep in range(args.repeats):
        for side in (sides if rep % 2 == 0 else sides[::-1]):
            got = run_side(args, side, data, index, work / f"{side}-{rep}")
            runs[side].append(got)
            print(f"{side}_rep{rep}_time_step={got['time_step']:.1f} "
                  f"{side}_rep{rep}_time_update={got['time_update']:.1f} "
                  f"{side}_rep{rep}_peak_rss_mb={got['peak_rss_mb']:.0f} "
                  f"{side}_rep{rep}_peak_gpu_mb={got['peak_gpu_mb']:.0f} "
                  f"{side}_rep{rep}_state_mb={got['state_mb']:.0f} "
                  f"{side}_rep{rep}_wall={got['wall']:.1f}", flush=True)

    def med(side, key):
        return statistics.median(r[key] for r in runs[side])
    for side in sides:
        print(f"{side}_peak_rss_mb={med(side, 'peak_rss_mb'):.0f} "
              f"{side}_peak_gpu_mb={med(side, 'peak_gpu_mb'):.0f} "
              f"{side}_state_mb={med(side, 'state_mb'):.0f} "
              f"{side}_time_step={med(side, 'time_step'):.1f} "
              f"{side}_time_update={med(side, 'time_update'):.1f} "
              f"{side}_reward={runs[side][0]['reward']}")
    none, fsdp = runs["none"][0], runs["fsdp"][0]
    same_first = bool(none["first_batch"]) and none["first_batch"] == fsdp["first_batch"]
    diff = max_weight_diff(none["final"], fsdp["final"])
    rss_ratio = med("fsdp", "peak_rss_mb") / med("none", "peak_rss_mb")
    update_ratio = med("fsdp", "time_update") / max(med("none", "time_update"), 1e-9)
    step_ratio = med("fsdp", "time_step") / max(med("none", "time_step"), 1e-9)
    print(f"same_first_batch={same_first} max_weight_diff={diff:.3g}")
    if args.unshared:   # how much of the sharded update's time is the lost prompt sharing
        print(f"unshared_update_time_ratio="
              f"{med(UNSHARED, 'time_update') / max(med('none', 'time_update'), 1e-9):.3f} "
              f"fsdp_vs_unshared_update_time_ratio="
              f"{med('fsdp', 'time_update') / max(med(UNSHARED, 'time_update'), 1e-9):.3f}")
    state_ratio = med("fsdp", "state_mb") / med("none", "state_mb")
    memory = f"state_ratio={state_ratio:.3f} rss_ratio={rss_ratio:.3f}"
    if args.device == "cuda":
        memory = (f"gpu_mem_ratio={med('fsdp', 'peak_gpu_mb') / med('none', 'peak_gpu_mb'):.3f}"
                  f" {memory}")
    print(f"{memory} update_time_ratio={update_ratio:.3f} step_time_ratio={step_ratio:.3f} "
          f"same_first_batch={same_first} max_weight_diff={diff:.3g} nproc={args.nproc} "
          f"device={args.device} steps={args.steps}")


if __name__ == "__main__":
    main()
