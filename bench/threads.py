"""Decoding speed by torch threads and OpenMP wait policy: greedy decoding of the tiny random
model (or the bundled SmolLM2-135M) in a fresh process per setting, 1 and 2 threads, each
with libgomp's default wait policy (spin a while, then sleep) and OMP_WAIT_POLICY=PASSIVE
(sleep at once). The policy is read when torch loads libgomp, hence a process per setting.

    .venv/bin/python bench/threads.py [--model tiny|smollm2-135m] [--seconds 2]
                                      [--threads 1,2] [--policies default,passive]
                                      [--batch 8] [--beside]

With --beside, another torch process multiplies matrices on every core meanwhile (two jobs
on the same cores, where spinning workers stall each other). Prints key=value lines:
`cores=`, `load_avg_1m=` (what else ran: the figures are of this machine as it was), then
`tok_s_t{N}_{policy}=` per setting; the last line is the summary.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

POLICIES = ("default", "passive")


def child(model_name: str, threads: int, seconds: float, batch: int) -> None:
    """Decode for `seconds` after a warm-up; print {"tok_s": ...} (tokens of all rows)."""
    import torch

    torch.set_num_threads(threads)
    from seekrl.models import load_policy, tiny_policy

    model, tok = tiny_policy(hidden=256, layers=4) if model_name == "tiny" else \
        load_policy(model_name)
    model.eval()
    ids = torch.tensor([tok("Who founded the company that makes the car?").input_ids] * batch)
    with torch.inference_mode():
        def decode(steps: int | None, until: float | None) -> int:
            out = model(ids, use_cache=True)
            past, nxt, n = out.past_key_values, out.logits[:, -1:].argmax(-1), 0
            while (steps is None or n < steps) and (until is None or time.perf_counter() < until):
                out = model(nxt, past_key_values=past, use_cache=True)
                past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
                n += 1
            return n

        decode(4, None)   # warm-up: kernels picked, buffers allocated
        t0 = time.perf_counter()
        n = decode(None, t0 + seconds)
        elapsed = time.perf_counter() - t0
    print(json.dumps({"tok_s": n * batch / elapsed, "steps": n}), flush=True)


def _busy_process() -> subprocess.Popen:
    code = ("import torch\nx = torch.randn(512, 512)\nwhile True:\n    x = torch.tanh(x @ x)")
    return subprocess.Popen([sys.executable, "-c", code], env={
        k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="tiny (random, 4 layers) or a policy name")
    ap.add_argument("--seconds", type=float, default=2.0, help="decoding time per setting")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--policies", default=",".join(POLICIES),
                    help="wait policies to measure: default, passive")
    ap.add_argument("--batch", type=int, default=8, help="sequences decoded together")
    ap.add_argument("--beside", action="store_true",
                    help="run a busy torch process on every core meanwhile")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        child(args.model, args.child, args.seconds, args.batch)
        return
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    print(f"cores={cores} load_avg_1m={os.getloadavg()[0]:.2f} model={args.model} "
          f"batch={args.batch} seconds={args.seconds} beside={args.beside}", flush=True)
    busy = _busy_process() if args.beside else None
    figures: dict[str, float] = {}
    try:
        for threads in (int(t) for t in args.threads.split(",")):
            for policy in args.policies.split(","):
                env = {k: v for k, v in os.environ.items()
                       if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
                if policy == "passive":
                    env["OMP_WAIT_POLICY"] = "PASSIVE"
                done = subprocess.run(
                    [sys.executable, __file__, "--child", str(threads), "--model", args.model,
                     "--seconds", str(args.seconds), "--batch", str(args.batch)],
                    env=env, capture_output=True, text=True, check=True)
                tok_s = json.loads(done.stdout.strip().splitlines()[-1])["tok_s"]
                figures[f"t{threads}_{policy}"] = tok_s
                print(f"tok_s_t{threads}_{policy}={tok_s:.1f}", flush=True)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    best = max(figures, key=figures.get)
    ratios = " ".join(
        f"passive_vs_default_t{t}={figures[f't{t}_passive'] / figures[f't{t}_default']:.2f}"
        for t in sorted({k.split('_')[0][1:] for k in figures}, key=int)
        if f"t{t}_passive" in figures and f"t{t}_default" in figures)
    print(f"summary: best={best} ({figures[best]:.1f} tok/s) {ratios} "
          f"load_avg_1m={os.getloadavg()[0]:.2f} beside={args.beside}")


if __name__ == "__main__":
    main()
