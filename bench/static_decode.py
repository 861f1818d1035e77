"""Decoding throughput of the static backend (agent/static_backend.py) against HFBackend,
seekrl's decoding loop today, on one batch of random contexts.

    python bench/static_decode.py [--device cpu] [--model tiny] [--hidden 256] [--layers 4]
        [--batch 8] [--context 64] [--new 64] [--dtype float32] [--repeats 2]

    # on a GPU (issue 57's shape):
    python bench/static_decode.py --device cuda --model random-135m --dtype bfloat16 \
        --batch 256 --context 330 --new 128 --repeats 3

Both backends decode the same contexts greedily, with no stop strings (every row runs its
whole budget unless it draws an end-of-turn token), so their tokens must agree
(`same_tokens=`). Each is timed twice a repeat: a turn of `--new` tokens and one of a single
token (the prefill and the first draw); the difference over `new - 1` steps is one decoding
step (`*_decode_ms_per_step=`). The best repeat counts: on CUDA the first meets each
(batch, width) bucket eagerly and the second captures its graph. `--model tiny` is a random
Llama of `--hidden` / `--layers`, `random-135m` / `random-1.5b` random weights in
SmolLM2-135M's / Qwen2.5-1.5B's shape, all with the bundled tokenizer (no model weights
needed); `smollm2-135m` or a path loads real weights.

Figures (key=value): `hf_tokens_per_s`, `static_tokens_per_s` (new tokens over the whole
turn), the per-step milliseconds, `same_tokens`; the last line a one-line summary.
"""

from __future__ import annotations

import argparse
import random
import time

import torch

# random weights in a real model's shape (the bundled tokenizer's vocabulary): no model file
SHAPES = {"random-135m": ("llama", dict(hidden_size=576, intermediate_size=1536,
                                        num_hidden_layers=30, num_attention_heads=9,
                                        num_key_value_heads=3, tie_word_embeddings=True)),
          "random-1.5b": ("qwen2", dict(hidden_size=1536, intermediate_size=8960,
                                        num_hidden_layers=28, num_attention_heads=12,
                                        num_key_value_heads=2, tie_word_embeddings=True))}


def build(args):
    from seekrl.models import DEFAULT_MODEL, load_policy, load_tokenizer, tiny_policy

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(args.dtype)
    if args.model == "tiny":
        model, tok = tiny_policy(seed=0, hidden=args.hidden, layers=args.layers)
    elif args.model in SHAPES:
        from transformers import AutoConfig, AutoModelForCausalLM

        tok = load_tokenizer(DEFAULT_MODEL)
        kind, shape = SHAPES[args.model]
        config = AutoConfig.for_model(kind, vocab_size=len(tok), max_position_embeddings=8192,
                                      bos_token_id=tok.bos_token_id,
                                      eos_token_id=tok.eos_token_id,
                                      pad_token_id=tok.pad_token_id, **shape)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config)
    else:
        return load_policy(args.model, dtype=args.dtype, device=args.device)
    if dtype is None:
        raise SystemExit(f"--dtype: float32 or bfloat16 for {args.model}")
    return model.to(device=args.device, dtype=dtype).eval(), tok


def contexts(tok, args) -> list[list[int]]:
    rng = random.Random(0)
    special = set(tok.all_special_ids)
    ids = [i for i in range(len(tok)) if i not in special]
    lo, hi = int(args.context * 0.75), int(args.context * 1.25)
    return [[rng.choice(ids) for _ in range(rng.randint(lo, hi))] for _ in range(args.batch)]


def timed(backend, ctx, new, device) -> tuple[float, list]:
    from seekrl.agent.backends import Sampling

    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = backend.generate(ctx, new, Sampling(greedy=True))
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start, [list(x) for x in out]


def agreement(a: list, b: list) -> tuple[int, float]:
    """(rows whose tokens are equal, the mean share of each row's tokens before the two
    first differ)."""
    same, shares = 0, []
    for x, y in zip(a, b):
        x, y = list(x), list(y)
        same += x == y
        n = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
        shares.append(n / max(1, len(x), len(y)))
    return same, sum(shares) / max(1, len(shares))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()

    from seekrl.agent.backends import HFBackend
    from seekrl.agent.static_backend import StaticBackend
    from seekrl.runtime import check_device

    check_device(args.device)   # and SEEKRL_CUDNN_ATTENTION: HFBackend as seekrl runs it

    model, tok = build(args)
    ctx = contexts(tok, args)
    max_len = max(map(len, ctx)) + args.new + 1
    started = time.perf_counter()
    backends = {"hf": HFBackend(model, tok, stop_strings=()),
                "static": StaticBackend(model, tok, stop_strings=(), max_len=max_len)}
    print(f"device={args.device} model={args.model} dtype={args.dtype} batch={args.batch} "
          f"context={args.context} new={args.new} threads={torch.get_num_threads()} "
          f"static_build_s={time.perf_counter() - started:.2f} "
          f"static_probe_diff={backends['static'].probe_diff:.2e}")
    best: dict[str, tuple[float, float]] = {}
    tokens: dict[str, list] = {}
    for _ in range(args.repeats):
        for name, backend in backends.items():
            whole, out = timed(backend, ctx, args.new, args.device)
            first, _ = timed(backend, ctx, 1, args.device)
            tokens[name] = out
            if name not in best or whole < best[name][0]:
                best[name] = (whole, first)
    rates = {}
    for name, (whole, first) in best.items():
        n = sum(len(x) for x in tokens[name])
        rates[name] = n / whole
        step_ms = 1000 * (whole - first) / max(1, args.new - 1)
        print(f"{name}_tokens_per_s={rates[name]:.1f} {name}_turn_s={whole:.3f} "
              f"{name}_prefill_s={first:.3f} {name}_decode_ms_per_step={step_ms:.2f}")
    graphs = backends["static"].graphs_state()
    same = tokens["hf"] == tokens["static"]
    speedup = rates["static"] / rates["hf"]
    rows, prefix = agreement(tokens["hf"], tokens["static"])
    # in bfloat16, random weights' near-tied logits may be broken either way by two
    # attention kernels' rounding: how far the rows agree says more than one flag
    print(f"same_tokens={same} same_rows={rows}/{len(tokens['hf'])} prefix_agree={prefix:.3f}")
    print(f"summary: static_speedup={speedup:.2f} static_tokens_per_s={rates['static']:.1f} "
          f"hf_tokens_per_s={rates['hf']:.1f} same_tokens={same} device={args.device} "
          f"batch={args.batch} model={args.model} {graphs}")


if __name__ == "__main__":
    main()
