"""Where one decoding step's time goes: seekrl's loop under each attention kernel, HF's own
cache loop, and a profile of the kernels.

    python bench/decode_step.py --device cuda --dtype bfloat16 [--arch qwen2.5-1.5b]
        [--batch 256] [--context 330] [--steps 32]

Why: on an H100 (2026-11-27, bench/RESULTS.md "Rollout engine") seekrl's engine and a
batched `model.generate` both decoded at ~1.3% of the forward ceiling, and a step cost about
the same at batch 64 and 256 and at 135M and 1.5B parameters: a fixed cost per step, not
compute or bandwidth. The host sat ~1 ms per layer inside `scaled_dot_product_attention`.
This bench separates the candidates, each on the same left-padded batch of random contexts
(lengths context +- 25%, no row stops early):

- `seekrl`: `HFBackend.generate` as the engine runs it (default SDPA dispatch);
- `sdpa_math` / `sdpa_efficient` / `sdpa_flash` / `sdpa_cudnn`: the same with PyTorch's
  SDPA dispatch held to one backend (`torch.nn.attention.sdpa_kernel`); a backend that
  refuses these inputs prints `error`;
- `eager`: the model's attention in plain matmuls (`set_attn_implementation("eager")`);
- `even`: every context the same length (no padding in the mask);
- `hf_loop`: a bare loop of `model(...)` with transformers' `DynamicCache` (no seekrl code);
- `hf_nomask`: the same on equal-length contexts with no attention mask at all (what
  building and applying the mask costs);
- `hf_static`: transformers' `generate` with a static cache, which on a GPU compiles the
  decoding forward (`torch.compile`, CUDA graphs: the host's per-step cost gone); timed
  step by step inside one call after `--static-warmup` steps (compilation and graph
  capture happen there; `static_compile_s=` is what they took). On CPU it runs uncompiled
  (the dry run's path). Not a setting of the engine: the ceiling a graph-captured loop
  reaches, to say whether that rewrite is worth it against the attention settings;
- `hf_cb`: transformers' continuous batching (`model.generate_batch`, paged attention, CUDA
  graphs on a GPU), its per-token timestamps giving the step time after the warm-up steps:
  the other engine the issue names; a transformers without it prints `error`;
- `seekrl_warm`: `seekrl` again on the very contexts `seekrl` ran first (every shape seen
  before): what a step costs once whatever a kernel builds per shape is cached.

Fresh shapes (the default; `--no-fresh-shapes` turns it off): each variant's contexts are
every row's context made `k * (steps + 4)` tokens longer for the k-th variant (0 for the
first), so no variant meets a key length an earlier one compiled or planned for. Why: on an
H200 (2026-11-28) the default dispatch went to cuDNN's attention, and a variant run after it
on the same contexts reused what cuDNN had built for each length: `sdpa_cudnn` measured
22.9 ms a step there against the first run's 90.9, while the rollout bench under
`sdpa_cudnn`, meeting new lengths as a rollout does, ran no faster than the default. A
decoding step adds one key column, and a rollout meets new lengths (and batch sizes) all the
time, so the cold figure is the one a rollout pays. The longer contexts cost the later
variants a little more attention reading (at most ~400 tokens more at 12 variants).

Per variant: `decode_ms_VARIANT=` (one step, the prefill subtracted: T(steps+1) - T(1)) and
the tokens/s that gives. Then a profile of `--profile-steps` steps of `seekrl`: host and
device milliseconds per step (`profile_host_ms_per_step`, `profile_device_ms_per_step`) and
the top operators by device (CPU run: host) time. The summary names the fastest variant and
its speedup over `seekrl`.
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from seekrl.agent.backends import HFBackend, Sampling
from seekrl.models import ATTENTION, SDPA_BACKENDS, attention_variant, load_policy, pad_id_of

ATTN_BACKENDS = SDPA_BACKENDS
REMEDIES = ATTENTION   # the variants that are a setting: rollout.attention / eval --attention


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def contexts_for(tok, batch: int, context: int, even: bool, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    avoid = {pad_id_of(tok), tok.eos_token_id, tok.bos_token_id}
    hi = min(len(tok), 20000)

    def one(n: int) -> list[int]:
        return [t for t in (rng.randrange(100, hi) for _ in range(n + 8)) if t not in avoid][:n]

    lengths = [context] * batch if even else [
        max(4, int(context * rng.uniform(0.75, 1.25))) for _ in range(batch)]
    return [one(n) for n in lengths]


def longer(contexts: list[list[int]], extra: int, tok, seed: int) -> list[list[int]]:
    """Every context with `extra` more tokens in front (random, as the contexts are)."""
    if extra <= 0:
        return contexts
    more = contexts_for(tok, len(contexts), extra, even=True, seed=seed)
    return [m + c for m, c in zip(more, contexts)]


def left_padded(contexts, pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids, attention mask) of `contexts` left-padded to the longest."""
    width = max(map(len, contexts))
    ids = torch.tensor([[pad] * (width - len(c)) + c for c in contexts], device=device)
    mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts],
                        device=device)
    return ids, mask


def seekrl_decode(backend: HFBackend, contexts, new_tokens: int) -> float:
    """Seconds for `new_tokens` tokens of every row through the engine's loop."""
    device = backend.device
    _sync(device)
    started = time.perf_counter()
    out = backend.generate(contexts, new_tokens, Sampling(greedy=True))
    _sync(device)
    seconds = time.perf_counter() - started
    if min(len(g) for g in out) != new_tokens:
        raise RuntimeError("a row stopped early: the per-step figure would mix batch sizes")
    return seconds


def hf_loop_decode(model, tok, contexts, new_tokens: int, mask_given: bool = True) -> float:
    """Seconds for a bare greedy loop of model(...) calls with transformers' DynamicCache;
    `mask_given=False` (equal-length contexts only) passes no attention mask at all."""
    from transformers import DynamicCache

    from seekrl.models import cache_kwarg

    kw = cache_kwarg(model)
    device = next(model.parameters()).device
    ids, mask = left_padded(contexts, pad_id_of(tok), device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    _sync(device)
    started = time.perf_counter()
    with torch.no_grad():
        cache = DynamicCache()
        out = model(input_ids=ids, attention_mask=mask if mask_given else None,
                    position_ids=positions, use_cache=True, logits_to_keep=1, **{kw: cache})
        nxt = positions[:, -1:] + 1
        for _ in range(new_tokens - 1):
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            mask = torch.cat([mask, torch.ones_like(token)], dim=1)
            out = model(input_ids=token, attention_mask=mask if mask_given else None,
                        position_ids=nxt, use_cache=True, logits_to_keep=1, **{kw: cache})
            nxt = nxt + 1
    _sync(device)
    return time.perf_counter() - started


def hf_static_ms(model, tok, contexts, steps: int, warmup: int) -> tuple[float, float]:
    """(ms per decoding step, seconds of the first `warmup` steps) of one greedy
    `model.generate(cache_implementation="static")` call; every step is timed by a logits
    processor that syncs the device, so the figure holds the same one sync a step as the
    engine's loop."""
    from transformers import LogitsProcessor, LogitsProcessorList

    device = next(model.parameters()).device
    pad = pad_id_of(tok)
    ids, mask = left_padded(contexts, pad, device)
    width = ids.shape[1]
    stamps: list[float] = []

    class Clock(LogitsProcessor):
        def __call__(self, input_ids, scores):
            _sync(device)
            stamps.append(time.perf_counter())
            return scores

    n = warmup + steps + 1
    _sync(device)
    started = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, cache_implementation="static", pad_token_id=pad,
                             logits_processor=LogitsProcessorList([Clock()]))
    if out.shape[1] - width != n or len(stamps) != n:
        raise RuntimeError(f"hf_static: {out.shape[1] - width} tokens, {len(stamps)} stamps; "
                           f"expected {n}")
    timed = stamps[warmup:]
    return 1000 * (timed[-1] - timed[0]) / (len(timed) - 1), stamps[warmup] - started


def hf_cb_ms(model, tok, contexts, steps: int, warmup: int) -> float:
    """ms per decoding step of transformers' continuous batching (`generate_batch`), every
    request held to the same length: the median over requests of the time between their
    token `warmup` and their last, over the steps between."""
    import inspect
    import math
    import statistics

    from transformers import GenerationConfig

    n = warmup + steps + 1
    # a paged cache just big enough (left alone it takes ~90% of free memory: 14 GB of a CPU
    # machine's for the tiny model), pages of 256 tokens
    sizes = {"num_blocks": len(contexts) * math.ceil((max(map(len, contexts)) + n) / 256) + 4,
             "max_batch_tokens": max(256, sum(map(len, contexts)))}
    cfg = GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False,
                           eos_token_id=-1, pad_token_id=pad_id_of(tok))
    params = inspect.signature(model.generate_batch).parameters
    extra = {}
    if "continuous_batching_config" in params:
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        # pages of 256 tokens: `page_size` since transformers 5.18 or so, `block_size`
        # before (5.17, the device machine's, has only that)
        page = "page_size" if "page_size" in ContinuousBatchingConfig.__dataclass_fields__ \
            else "block_size"
        extra["continuous_batching_config"] = ContinuousBatchingConfig(**{page: 256}, **sizes)
    else:   # older transformers read them from the generation config
        for key, value in sizes.items():
            setattr(cfg, key, value)
    if next(model.parameters()).device.type != "cuda" and "warmup" in params:
        extra["warmup"] = False   # graph pre-capture: 15 s of nothing on a CPU
    before = model.config._attn_implementation
    try:
        with torch.no_grad():
            out = model.generate_batch(inputs=contexts, generation_config=cfg,
                                       record_timestamps=True, **extra)
    finally:   # a start or graph warm-up that fails leaves the model on paged attention
        if model.config._attn_implementation != before:
            model.set_attn_implementation(before)
    per = []
    for o in out.values():
        stamps = o.timestamps or []
        if o.error or len(stamps) != n:
            raise RuntimeError(f"hf_cb: a request ended with {len(stamps)} of {n} tokens "
                               f"({o.error or 'no error'})")
        per.append((stamps[-1] - stamps[warmup]) / steps)
    if len(per) != len(contexts):
        raise RuntimeError(f"hf_cb: {len(per)} of {len(contexts)} requests came back")
    return 1000 * statistics.median(per)


def per_step_ms(run, steps: int) -> float:
    """One decoding step in ms: T(steps + 1) - T(1), each after a warm-up call."""
    run(2)
    short = run(1)
    long = run(steps + 1)
    return 1000 * (long - short) / steps


def profile(backend: HFBackend, contexts, steps: int, top: int) -> list[str]:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    device = backend.device
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda"
                                           else [])
    backend.generate(contexts, 2, Sampling(greedy=True))   # warm-up
    with torch_profile(activities=activities) as prof:
        seekrl_decode(backend, contexts, steps + 1)
    events = prof.key_averages()
    on_device = device.type == "cuda"

    def device_us(e) -> float:
        return getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)

    host_us = sum(e.self_cpu_time_total for e in events)
    dev_us = sum(device_us(e) for e in events) if on_device else 0.0
    lines = [f"profile_host_ms_per_step={host_us / 1000 / (steps + 1):.2f} "
             f"profile_device_ms_per_step={dev_us / 1000 / (steps + 1):.2f}"]
    key = device_us if on_device else (lambda e: e.self_cpu_time_total)
    for rank, e in enumerate(sorted(events, key=key, reverse=True)[:top]):
        lines.append(f"profile_top{rank}={e.key.replace(' ', '_')[:70]} "
                     f"ms_per_step={key(e) / 1000 / (steps + 1):.3f} calls={e.count}")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--arch", default="", help="random weights of this architecture "
                   "(bench/rollout.py's ARCHS; default: the bundled model)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--context", type=int, default=330,
                   help="mean context length (the engine's mean episode length was 330)")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--profile-steps", type=int, default=8)
    p.add_argument("--top", type=int, default=10)
    p.add_argument("--variants", default="seekrl,sdpa_math,sdpa_efficient,sdpa_flash,"
                   "sdpa_cudnn,eager,even,hf_loop,hf_nomask,hf_static,hf_cb,seekrl_warm")
    p.add_argument("--fresh-shapes", action=argparse.BooleanOptionalAction, default=True,
                   help="each variant on key lengths no earlier variant met (see above)")
    p.add_argument("--static-warmup", type=int, default=8,
                   help="hf_static, hf_cb: steps left untimed (compilation, graph capture)")
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    model, tok = load_policy(dtype=args.dtype, device=args.device)
    if args.arch:
        from rollout import build_arch  # bench/ is on the path: this script's folder

        model = build_arch(args.arch, tok, dtype, args.device)
    model.eval()
    device = next(model.parameters()).device
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "-"
    params = sum(x.numel() for x in model.parameters())
    print(f"model={args.arch or 'smollm2-135m'} params={params} dtype={args.dtype} "
          f"device={device.type} gpu={gpu.replace(' ', '_')} batch={args.batch} "
          f"context={args.context} steps={args.steps} torch={torch.__version__} "
          f"attn={model.config._attn_implementation}")
    order = getattr(torch._C, "_get_sdp_priority_order", None)
    if order is not None:   # the order PyTorch tries SDPA backends in
        try:
            from torch.nn.attention import SDPBackend

            names = {int(getattr(SDPBackend, n)): n.lower() for n in dir(SDPBackend)
                     if n.isupper() and isinstance(getattr(SDPBackend, n), SDPBackend)}
            print("sdp_priority_order=" + ",".join(names.get(int(x), str(int(x)))
                                                   for x in order()))
        except Exception:   # a private API: its form may change
            pass
    backend = HFBackend(model, tok, stop_strings=())
    backend.stop_ids = set()    # every row decodes every step: one batch size throughout
    ragged = contexts_for(tok, args.batch, args.context, even=False)
    even_base = contexts_for(tok, args.batch, args.context, even=True)

    results: dict[str, float] = {}
    ran_on: dict[str, list[list[int]]] = {}
    variants = [v for v in args.variants.split(",") if v]
    window = args.steps + 4 if args.fresh_shapes else 0   # key lengths one variant meets
    first_ragged = ragged
    print(f"fresh_shapes={int(args.fresh_shapes)} extra_tokens_per_variant={window}")
    for k, variant in enumerate(variants):
        if variant.startswith("sdpa_") and variant[5:] not in ATTN_BACKENDS:
            raise SystemExit(f"decode_step: unknown variant {variant!r}")
        ragged = longer(first_ragged, k * window, tok, seed=1000 + k)
        even = longer(even_base, k * window, tok, seed=2000 + k)
        try:
            if variant == "seekrl_warm":
                if "seekrl" not in ran_on:
                    raise SystemExit("decode_step: seekrl_warm repeats seekrl: list seekrl "
                                     "before it")
                ms = per_step_ms(lambda n, c=ran_on["seekrl"]: seekrl_decode(backend, c, n),
                                 args.steps)
            elif variant == "hf_loop":
                ms = per_step_ms(lambda n, c=ragged: hf_loop_decode(model, tok, c, n), args.steps)
            elif variant == "hf_static":
                ms, warm_s = hf_static_ms(model, tok, ragged, args.steps, args.static_warmup)
                print(f"static_compile_s={warm_s:.1f}")
            elif variant == "hf_cb":
                ms = hf_cb_ms(model, tok, ragged, args.steps, args.static_warmup)
            elif variant == "hf_nomask":
                ms = per_step_ms(lambda n, c=even: hf_loop_decode(model, tok, c, n, mask_given=False),
                                 args.steps)
            elif variant in ("seekrl", "even", "eager") or variant.startswith("sdpa_"):
                ctx = even if variant == "even" else ragged
                ran_on[variant] = ctx   # seekrl's: what seekrl_warm repeats
                name = variant if variant in REMEDIES else "default"
                with attention_variant(model, name):
                    ms = per_step_ms(lambda n, c=ctx: seekrl_decode(backend, c, n), args.steps)
            else:
                raise SystemExit(f"decode_step: unknown variant {variant!r}")
        except SystemExit:
            raise
        except Exception as err:   # a kernel that refuses these inputs: say so, go on
            print(f"decode_ms_{variant}=error ({type(err).__name__}: "
                  f"{str(err).splitlines()[0][:120] if str(err) else ''})")
            continue
        results[variant] = ms
        print(f"decode_ms_{variant}={ms:.2f} tok_s_{variant}={args.batch * 1000 / ms:.0f}")
    if args.profile_steps > 0:
        try:   # on lengths of its own too: the profile shows what a cold step spends
            fresh = longer(first_ragged, len(variants) * window, tok, seed=3000)
            for line in profile(backend, fresh, args.profile_steps, args.top):
                print(line)
        except Exception as err:   # the figures above stand without the profile
            print(f"profile=error ({type(err).__name__}: {str(err).splitlines()[0][:120]})")
    if not results:
        raise SystemExit("decode_step: no variant ran")
    best = min(results, key=results.get)
    base = results.get("seekrl")
    speedup = f" speedup_best={base / results[best]:.2f}" if base else ""
    # the fastest variant that is a setting (not `even` / `hf_*`, which are diagnoses)
    remedies = {("default" if v == "seekrl" else v): ms for v, ms in results.items()
                if v == "seekrl" or v in REMEDIES}
    ranked = sorted(remedies, key=remedies.get)
    remedy = ranked[0] if ranked else "-"
    warm = results.get("seekrl_warm")
    cached = (f" warm_gain_ms={base - warm:.2f}" if base is not None and warm is not None
              else "")
    print(f"summary: decode_ms_seekrl={base if base is None else round(base, 2)} "
          f"best={best} best_ms={results[best]:.2f}{speedup} remedy={remedy} "
          f"remedies={','.join(ranked) or '-'}{cached} batch={args.batch} "
          f"device={device.type}")


if __name__ == "__main__":
    main()
