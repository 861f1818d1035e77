"""What each dtype costs on this CPU: a matrix product of the bundled model's MLP shape and
one forward/backward of the bundled SmolLM2-135M, in float32, bf16-mixed (float32 weights,
bfloat16 products under autocast: seekrl's `dtype: bf16-mixed`) and, for the product,
float16. Whether `dtype: auto` would pick bf16-mixed here (`models.cpu_multiplies_bf16`,
oneDNN's view of AVX-512 BF16 / AMX) is printed beside the times it rests on.

    .venv/bin/python bench/cpu_dtype.py [--tokens 512] [--repeats 3] [--skip-model]

Prints key=value lines; the last line is the summary: `bf16_vs_fp32_matmul=` and
`bf16_vs_fp32_step=` (bf16's seconds / float32's: above 1 is slower), and `native_bf16=`.
Sides alternate which runs first; medians of `--repeats`.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def _median_seconds(fn, repeats: int) -> float:
    fn()   # warm-up: the first call allocates and picks kernels
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    from seekrl.models import cpu_multiplies_bf16, load_policy, mixed_precision

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=512, help="rows of the product / the step's tokens")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--skip-model", action="store_true", help="only the matrix products")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    native = cpu_multiplies_bf16()
    capability = torch.backends.cpu.get_cpu_capability()
    print(f"cpu_capability={capability} native_bf16={native} threads={torch.get_num_threads()} "
          f"torch={torch.__version__}")

    # the bundled model's MLP up-projection: hidden 576 -> 1536
    gen = torch.Generator().manual_seed(0)
    a32 = torch.randn(args.tokens, 576, generator=gen)
    b32 = torch.randn(576, 1536, generator=gen)
    flops = 2 * args.tokens * 576 * 1536
    seconds = {}
    for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        a, b = a32.to(dt), b32.to(dt)
        seconds[name] = _median_seconds(lambda a=a, b=b: a @ b, args.repeats)
        print(f"matmul_{name}_ms={seconds[name] * 1e3:.2f} "
              f"matmul_{name}_gflops={flops / seconds[name] / 1e9:.1f}")
    matmul_ratio = seconds["bf16"] / seconds["fp32"]
    step_ratio = None
    if not args.skip_model:
        ids = torch.randint(5, 40000, (1, args.tokens), generator=gen)
        steps = {}
        models = {}
        for side in ("fp32", "bf16-mixed"):
            model, _ = load_policy(dtype="float32")
            if side == "bf16-mixed":
                mixed_precision(model)
            model.train()
            models[side] = model

        def step(model):
            model.zero_grad(set_to_none=True)
            model(input_ids=ids).logits.float().mean().backward()

        order = list(models)
        per_side: dict[str, list[float]] = {s: [] for s in order}
        for side in order:
            step(models[side])   # warm-up
        for r in range(args.repeats):
            for side in (order if r % 2 == 0 else order[::-1]):
                t0 = time.perf_counter()
                step(models[side])
                per_side[side].append(time.perf_counter() - t0)
        for side, times in per_side.items():
            steps[side] = statistics.median(times)
            print(f"step_{side.replace('-', '_')}_s={steps[side]:.3f} "
                  f"step_{side.replace('-', '_')}_tokens_per_s={args.tokens / steps[side]:.1f}")
        step_ratio = steps["bf16-mixed"] / steps["fp32"]
    print(f"cpu_dtype: bf16_vs_fp32_matmul={matmul_ratio:.2f} "
          + (f"bf16_vs_fp32_step={step_ratio:.2f} " if step_ratio is not None else "")
          + f"native_bf16={native} cpu={capability} (seconds ratio: above 1, bfloat16 is slower)")


if __name__ == "__main__":
    main()
