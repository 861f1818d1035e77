"""Rollout throughput: seekrl's batched multi-turn engine against `model.generate` loops.

Same questions and token limits for every configuration: generated tokens per second of
the batched engine at each `--batches` size, against a sequential loop that runs one
episode at a time with plain `model.generate` (CPU) or a batched `model.generate` loop
over the same episodes, re-tokenising each row's text every turn (`--baseline batched`,
the fair one on a GPU); plus the no-grad forward throughput of the same model as the
compute ceiling, and on a GPU the share of the card's peak bf16 FLOP/s that decoding used.

    .venv/bin/python bench/rollout.py [--questions 32] [--max-new-tokens 48] [--max-turns 3]
    python bench/rollout.py --device cuda --dtype bfloat16 --questions 256 --batches 64,256 \
        --baseline batched --arch qwen2.5-1.5b

`--arch` builds a model of that architecture with random weights (speed depends on the
shapes, not the weights; the GPU machines have no network): the published Qwen2.5
0.5B / 1.5B / 3B shapes, with the bundled tokenizer's vocabulary (49,152 rows instead of
Qwen's 151,936, so the output layer is a third of theirs; the bundled tokenizer alone is
loaded, not the model's weights). `--backend static` runs the engine on the fixed-shape
backend (agent/static_backend.py) instead of seekrl's HF loop; `static-continuous` on that
backend with continuous batching (`rollout.continuous`: rows rejoin as their turns end).

`--baseline static-generate` compares the engine at its top batch with `model.generate`
over a static cache at the same batch (one shape, so on CUDA transformers compiles its
decoding step once, with CUDA graphs; eager on a CPU), re-tokenising each row every turn:
`static_generate_bN_tok_s=`, its warm-up (compilation) apart, and the summary's
`gpu_rollout_speedup=` (issue 57's target with `--backend static`: at least 2x).

Each engine run's seconds are split: `decode_s` (the decoding steps alone), `prefill_s`
(the backend's prefills) and `other_s` (retrieval, tokenising, the engine's own work), the
backend's calls timed with the device synchronised; `decode_tok_s` is tokens per decoding
second. The forward ceiling is one no-grad forward over 64 x 512 tokens or more on a GPU
(CUDA events, the best of 3), over 8 mean-length episodes on a CPU. Prints key=value lines;
the last line is the summary with speedup_bN (against the baseline; gpu_rollout_speedup
against static-generate), ceiling_frac_bN and decode_s_bN.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from seekrl.agent.backends import HFBackend
from seekrl.agent.protocol import STOP_STRINGS, build_prompt, information_block, invalid_block, parse_action
from seekrl.agent.rollout import RolloutConfig, RolloutEngine
from seekrl.data.world import generate_world, write_world
from seekrl.models import load_policy, load_tokenizer, mixed_precision, pad_id_of
from seekrl.retrieval.index import build_index, load_index
from seekrl.runtime import check_device

# published shapes (config.json of each model); vocabulary: the bundled tokenizer's
ARCHS = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2),
    "qwen2.5-3b": dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                       num_attention_heads=16, num_key_value_heads=2),
    # not published: the dry run of tools/gpu/run (the --arch code path in seconds on a CPU)
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),
}
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}   # dense, no sparsity


def build_arch(name: str, tok, dtype: torch.dtype, device: str):
    """A random-weight Qwen2 model of a published size, for speed only."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=len(tok), max_position_embeddings=32768, rope_theta=1e6,
                      tie_word_embeddings=True, use_sliding_window=False,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=pad_id_of(tok), **ARCHS[name])
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to(device=device, dtype=dtype).eval()
    model.generation_config.eos_token_id = tok.eos_token_id
    return model


def sequential(model, tok, retriever, questions, cfg: RolloutConfig) -> tuple[int, float]:
    """The naive loop: one episode at a time, `model.generate` per turn, re-encoding text."""
    generated = 0
    started = time.perf_counter()
    for q in questions:
        text = build_prompt(tok, q.question)
        for _ in range(cfg.max_turns):
            ids = tok(text, return_tensors="pt", add_special_tokens=False).input_ids.to(
                model.device)
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=cfg.max_new_tokens, stop_strings=list(STOP_STRINGS),
                                 tokenizer=tok, pad_token_id=tok.pad_token_id)
            new = out[0, ids.shape[1]:]
            generated += int(new.numel())
            turn = tok.decode(new, skip_special_tokens=True)
            text += turn
            action = parse_action(turn)
            if action.kind == "answer":
                break
            if action.kind == "search":
                text += information_block(retriever.search([action.text], cfg.topk)[0])
            else:
                text += invalid_block(action.text)
    return generated, time.perf_counter() - started


def _next_turns(live: list[int], new_rows, texts: list[str], tok, retriever,
                cfg: RolloutConfig) -> tuple[list[int], int]:
    """A batched turn's rows appended to their episodes' texts, with the documents of a
    search or the note of an invalid turn: the rows still going and the tokens generated."""
    pad = pad_id_of(tok)
    still, generated = [], 0
    for i, row in zip(live, new_rows):
        generated += int((row != pad).sum())
        turn = tok.decode(row, skip_special_tokens=True)
        texts[i] += turn
        action = parse_action(turn)
        if action.kind == "answer":
            continue
        if action.kind == "search":
            texts[i] += information_block(retriever.search([action.text], cfg.topk)[0])
        else:
            texts[i] += invalid_block(action.text)
        still.append(i)
    return still, generated


def batched_generate(model, tok, retriever, questions, cfg: RolloutConfig, batch: int
                     ) -> tuple[int, float]:
    """The common GPU loop: `batch` episodes at a time, one left-padded `model.generate` call
    per turn over every unfinished row, each row's text re-tokenised every turn, no KV
    cache kept between turns."""
    device = next(model.parameters()).device
    generated = 0
    tok.padding_side = "left"
    _sync(device)
    started = time.perf_counter()
    for start in range(0, len(questions), batch):
        texts = [build_prompt(tok, q.question) for q in questions[start:start + batch]]
        live = list(range(len(texts)))
        for _ in range(cfg.max_turns):
            if not live:
                break
            enc = tok([texts[i] for i in live], return_tensors="pt", padding=True,
                      add_special_tokens=False).to(device)
            out = model.generate(**enc, do_sample=False, max_new_tokens=cfg.max_new_tokens,
                                 stop_strings=list(STOP_STRINGS), tokenizer=tok,
                                 pad_token_id=pad_id_of(tok))
            new_rows = out[:, enc.input_ids.shape[1]:]
            live, n = _next_turns(live, new_rows, texts, tok, retriever, cfg)
            generated += n
    _sync(device)
    return generated, time.perf_counter() - started


def static_generate(model, tok, retriever, questions, cfg: RolloutConfig, batch: int
                    ) -> tuple[int, float, float, bool]:
    """transformers' fastest plain loop: `batch` episodes at a time, one left-padded
    `model.generate` call per turn over a static cache, every row's text re-tokenised each
    turn. On CUDA `generate` compiles its decoding step (torch.compile, "reduce-overhead":
    CUDA graphs); on a CPU it runs eagerly. One shape throughout, so it compiles once: the
    cache is allocated once for `batch` rows of the longest context a turn can reach and
    reset before each call, and finished episodes keep their rows as one-token stand-ins
    that a stopping criterion ends at their first token. Returns (tokens, seconds, warm-up
    seconds, compiled); the warm-up (one short call at the shape: compilation and graph
    capture) is timed apart."""
    from transformers import StaticCache, StoppingCriteria, StoppingCriteriaList

    from seekrl.models import cache_kwarg

    device = next(model.parameters()).device
    pad = pad_id_of(tok)
    compiled = device.type == "cuda"
    tok.padding_side = "left"
    prompts = [build_prompt(tok, q.question) for q in questions]
    longest = max(len(tok.encode(p, add_special_tokens=False)) for p in prompts)
    # a turn's context: the prompt, then per turn its tokens and a block (documents or the
    # correction) of at most max_info_tokens and the tags; a longer one ends its episode
    cap = longest + cfg.max_turns * (cfg.max_new_tokens + cfg.max_info_tokens + 32)
    cap = min(cap, cfg.max_total_tokens) + cfg.max_new_tokens
    cache = StaticCache(config=model.config, max_cache_len=cap)
    idle: list[bool] = []

    class Idle(StoppingCriteria):   # the stand-in rows end at once
        def __call__(self, input_ids, scores, **kwargs):
            return torch.tensor(idle, dtype=torch.bool, device=input_ids.device)

    def call(texts: list[str], new: int):
        cache.reset()
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        with torch.no_grad():
            out = model.generate(**enc, do_sample=False, max_new_tokens=new,
                                 stop_strings=list(STOP_STRINGS), tokenizer=tok,
                                 pad_token_id=pad, disable_compile=not compiled,
                                 stopping_criteria=StoppingCriteriaList([Idle()]),
                                 **{cache_kwarg(model): cache})
        return out[:, enc.input_ids.shape[1]:]

    filler = tok.decode(tok.encode(" a", add_special_tokens=False)[:1])
    _sync(device)
    started = time.perf_counter()
    idle[:] = [False] * batch
    call([prompts[0]] * batch, 3)   # compiles the decoding step (CUDA), captures its graph
    _sync(device)
    warm = time.perf_counter() - started
    generated = 0
    started = time.perf_counter()
    for start in range(0, len(questions), batch):
        texts = prompts[start:start + batch]
        live = list(range(len(texts)))
        for _ in range(cfg.max_turns):
            live = [i for i in live
                    if len(tok.encode(texts[i], add_special_tokens=False)) + cfg.max_new_tokens
                    <= cap]
            if not live:
                break
            rows = [texts[i] for i in live] + [filler] * (batch - len(live))
            idle[:] = [False] * len(live) + [True] * (batch - len(live))
            new_rows = call(rows, cfg.max_new_tokens)[:len(live)]
            live, n = _next_turns(live, new_rows, texts, tok, retriever, cfg)
            generated += n
    _sync(device)
    return generated, time.perf_counter() - started, warm, compiled


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def forward_ceiling(model, lengths: list[int], batch: int | None = None,
                    seq: int | None = None) -> tuple[float, str]:
    """Tokens/s of a no-grad forward pass over full sequences (the compute ceiling) and how
    it was measured. On a GPU: at least 64 sequences of at least 512 tokens (a smaller batch
    leaves the card idle and understates the ceiling), timed with CUDA events, the best of
    3 after a warm-up; on a CPU 8 sequences of the mean episode length, by the wall clock."""
    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    mean = int(sum(lengths) / len(lengths))
    batch = batch or (64 if cuda else 8)
    seq = seq or (max(512, mean) if cuda else mean)
    ids = torch.randint(100, 20000, (batch, seq), device=device)
    with torch.no_grad():
        model(input_ids=ids, logits_to_keep=1)  # warm-up
        _sync(device)
        best = float("inf")
        for _ in range(3 if cuda else 2):
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                    enable_timing=True)
                start.record()
                model(input_ids=ids, logits_to_keep=1)
                end.record()
                end.synchronize()
                seconds = start.elapsed_time(end) / 1000
            else:
                started = time.perf_counter()
                model(input_ids=ids, logits_to_keep=1)
                seconds = time.perf_counter() - started
            best = min(best, seconds)
    how = f"batch {batch} x {seq} tokens, {'CUDA events' if cuda else 'wall clock'}, best"
    return batch * seq / best, how


class PhaseClock:
    """Times a backend's calls on the host clock, the device synchronised at each edge:
    `generate` (prefill and decoding; `admit` and `run` under continuous batching) and
    `_prefill` inside them; decoding is the difference.
    What an engine run spends outside `generate` (retrieval, tokenising) is the rest."""

    def __init__(self, backend, device):
        self.device = device
        self.generate_s = self.prefill_s = 0.0
        for name in ("generate", "admit", "run"):   # continuous batching: admit and run
            if hasattr(backend, name):
                self._wrap(backend, name, "generate_s")
        if hasattr(backend, "_prefill"):
            self._wrap(backend, "_prefill", "prefill_s")

    def _wrap(self, backend, name: str, field: str) -> None:
        inner = getattr(backend, name)

        def timed(*args, **kwargs):
            _sync(self.device)
            started = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                _sync(self.device)
                setattr(self, field, getattr(self, field) + time.perf_counter() - started)

        setattr(backend, name, timed)

    @property
    def decode_s(self) -> float:
        return self.generate_s - self.prefill_s


BACKENDS = ("hf", "static", "static-continuous")


def make_engine_backend(kind: str, model, tok, cfg: RolloutConfig):
    """seekrl's HF loop, or the static backend itself: where its lean forward refuses the
    model or its logits differ from HF's, the run fails (the trainer's factory would fall
    back to the HF loop, and a figure labelled static would be the HF loop's)."""
    if kind.startswith("static"):
        from seekrl.agent.static_backend import StaticBackend

        return StaticBackend(model, tok, max_len=cfg.max_total_tokens)
    return HFBackend(model, tok)


def backend_line(backend) -> str:
    """What decoded: the backend's class, and the static backend's load-check difference
    from HF's logits (relative to the largest logit)."""
    diff = getattr(backend, "probe_diff", None)
    return (f"engine_backend={type(backend).__name__}"
            + (f" probe_diff={diff:.2e}" if diff is not None else ""))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--questions", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32",
                   choices=("float32", "bfloat16", "float16", "bf16-mixed"),
                   help="bf16-mixed also times the top batch with autocast casting every "
                        "weight on every decoding step (the engine casts them once a turn): "
                        "cast_speedup_bN")
    p.add_argument("--arch", default="", choices=("", *ARCHS),
                   help="random weights of this architecture (default: the bundled model)")
    p.add_argument("--attention", default="default",
                   help="run every side under this attention variant (bench/decode_step.py: "
                        "default, eager, sdpa_math, sdpa_efficient, sdpa_flash, sdpa_cudnn)")
    p.add_argument("--baseline", default="sequential",
                   choices=("sequential", "batched", "static-generate", "none"),
                   help="static-generate: `generate` with a static cache (compiled, CUDA "
                        "graphs on CUDA) at the top batch, gpu_rollout_speedup; none: only "
                        "the engine (with bf16-mixed, its cast comparison)")
    p.add_argument("--backend", default="hf",
                   help="the engine's decoding backend: hf (seekrl's HF loop), static, or "
                        "static-continuous (with rollout.continuous); several, comma-"
                        "separated, are run side by side on the same questions (with "
                        "--baseline none), each against the first: ratio_NAME_bN=")
    args = p.parse_args()
    args.backends = args.backend.split(",")
    bad = [b for b in args.backends if b not in BACKENDS]
    if bad or (len(args.backends) > 1 and args.baseline != "none"):
        p.error(f"--backend: one of {', '.join(BACKENDS)}, or several with --baseline none; "
                f"got {args.backend!r}")
    check_device(args.device)   # and SEEKRL_CUDNN_ATTENTION, as every seekrl command
    dtype = torch.bfloat16 if args.dtype == "bf16-mixed" else getattr(torch, args.dtype)

    work = Path(tempfile.mkdtemp(prefix="seekrl-bench-rollout-"))
    world = generate_world(seed=0, entities=300, n_train=10, n_dev=10, n_test=args.questions)
    paths = write_world(world, work)
    retriever = load_index(build_index(paths["corpus"], work / "index", show_progress=False))
    questions = world.splits["test"][: args.questions]
    if args.arch:   # random weights: the bundled tokenizer alone, not the model's weights
        tok = load_tokenizer()
        model = build_arch(args.arch, tok, torch.float32 if args.dtype == "bf16-mixed"
                           else dtype, args.device)
        if args.dtype == "bf16-mixed":
            mixed_precision(model)
    else:
        model, tok = load_policy(dtype=args.dtype, device=args.device)
    from seekrl.models import attention_variant

    with attention_variant(model, args.attention):
        run(args, model, tok, retriever, questions, dtype)


def run(args, model, tok, retriever, questions, dtype) -> None:
    params = sum(p.numel() for p in model.parameters())
    gpu = torch.cuda.get_device_name() if args.device.startswith("cuda") else ""
    print(f"questions={len(questions)} max_new_tokens={args.max_new_tokens} "
          f"max_turns={args.max_turns} threads={torch.get_num_threads()} "
          f"model={args.arch or 'smollm2-135m'} params={params} dtype={args.dtype} "
          f"device={args.device} gpu={gpu.replace(' ', '_') or '-'} attention={args.attention} "
          f"backend={args.backend} cudnn_sdp={int(torch.backends.cuda.cudnn_sdp_enabled())}")

    if len(args.backends) > 1:
        side_by_side(args, model, tok, retriever, questions, gpu)
        return
    results, phases, lengths = engine_rates(args, args.backend, model, tok, retriever,
                                            questions, gpu)
    _summary(args, model, tok, retriever, questions, gpu, params, results, phases, lengths)


def side_by_side(args, model, tok, retriever, questions, gpu: str) -> None:
    """Each backend of --backend on the same questions and batches, one after the other in
    this process; each one's tokens/s against the first's (`ratio_NAME_bN=`), and whether
    their greedy tokens agree (`same_tokens_NAME=`)."""
    rates, tokens = {}, {}
    for name in args.backends:
        rates[name], _, _ = engine_rates(args, name, model, tok, retriever, questions, gpu,
                                         keep=tokens.setdefault(name, {}))
    first = args.backends[0]
    ratios = [f"ratio_{name}_b{b}={rates[name][b] / rates[first][b]:.2f}"
              for name in args.backends[1:] for b in rates[name]]
    same = [f"same_tokens_{name}={int(tokens[name] == tokens[first])}"
            for name in args.backends[1:]]
    print("summary: " + " ".join(ratios + same) + " "
          + " ".join(f"{name}_b{b}={r:.1f}tok/s" for name in args.backends
                     for b, r in rates[name].items()) + f" against={first}")


def engine_rates(args, kind: str, model, tok, retriever, questions, gpu: str,
                 keep: dict | None = None):
    """The engine on `kind`'s backend at each batch of --batches: tokens/s, the decoding
    phase's seconds and tokens by batch, the last batch's episode lengths (`keep`: each
    batch's episodes' tokens, by batch)."""
    results, phases, lengths = {}, {}, []
    for b in [int(x) for x in args.batches.split(",")]:
        cfg = RolloutConfig(max_turns=args.max_turns, max_new_tokens=args.max_new_tokens,
                            batch_size=b, greedy=True,
                            continuous=kind == "static-continuous")
        backend = make_engine_backend(kind, model, tok, cfg)
        if not results:   # the first batch's: every batch builds the same kind
            print(f"{kind}: {backend_line(backend)}")
        tag = f"{kind.replace('-', '_')}_" if len(args.backends) > 1 else ""
        clock = PhaseClock(backend, args.device)
        engine = RolloutEngine(backend, tok, retriever, cfg)
        if gpu:
            torch.cuda.reset_peak_memory_stats()
        _sync(args.device)
        started = time.perf_counter()
        trajs = engine.run(questions)
        _sync(args.device)
        seconds = time.perf_counter() - started
        if gpu:
            print(f"batched_b{b}_peak_gpu_mb={torch.cuda.max_memory_allocated() / 2**20:.0f}")
        tokens = sum(t.n_generated for t in trajs)
        lengths = [len(t.token_ids) for t in trajs]
        if keep is not None:
            keep[b] = [t.token_ids for t in trajs]
        results[b] = tokens / seconds
        phases[b] = (clock.decode_s, tokens)
        n = f"{tag}batched_b{b}"
        graphs = getattr(backend, "graphs_state", None)   # the static backend's: captured?
        print(f"{n}_tokens={tokens} {n}_seconds={seconds:.1f} {n}_tok_s={results[b]:.1f}"
              + (f" {graphs(f'{n}_')}" if graphs else ""))
        print(f"{n}_decode_s={clock.decode_s:.2f} {n}_prefill_s={clock.prefill_s:.2f} "
              f"{n}_other_s={seconds - clock.generate_s:.2f} "
              f"{n}_decode_tok_s={tokens / max(clock.decode_s, 1e-9):.1f} "
              f"(decode: the backend's decoding steps alone; other: retrieval, tokenising)")
    return results, phases, lengths


def _summary(args, model, tok, retriever, questions, gpu, params, results, phases,
             lengths) -> None:
    top = max(results)
    decode_s, top_tokens = phases[top]
    decode_part = (f" decode_s_b{top}={decode_s:.2f}"
                   f" decode_tok_s_b{top}={top_tokens / max(decode_s, 1e-9):.1f}")
    cast_line = ""
    if args.dtype == "bf16-mixed":
        cast_line = " " + cast_ab(model, tok, retriever, questions, args, top)
    if args.baseline == "none":   # on a GPU the ceiling still (a second at 64 x 512)
        ceiling_part = ""
        if gpu:
            ceiling, how = forward_ceiling(model, lengths)
            print(f"forward_ceiling_tok_s={ceiling:.1f} (no-grad forward, {how})")
            ceiling_part = f" ceiling_frac_b{top}={results[top] / ceiling:.3f}"
        print("summary: " + " ".join(f"b{b}={r:.1f}tok/s" for b, r in results.items())
              + decode_part + ceiling_part + cast_line)
        return
    cfg = RolloutConfig(max_turns=args.max_turns, max_new_tokens=args.max_new_tokens)
    if args.baseline == "static-generate":
        static_generate_line(args, model, tok, retriever, questions, cfg, results, lengths,
                             decode_part + cast_line)
        return
    if args.baseline == "batched":
        tokens, seconds = batched_generate(model, tok, retriever, questions, cfg, top)
    else:
        tokens, seconds = sequential(model, tok, retriever, questions, cfg)
    seq_rate = tokens / seconds
    name = "generate_b%d" % top if args.baseline == "batched" else "sequential"
    print(f"{name}_tokens={tokens} {name}_seconds={seconds:.1f} {name}_tok_s={seq_rate:.1f}")
    ceiling, how = forward_ceiling(model, lengths)
    print(f"forward_ceiling_tok_s={ceiling:.1f} (no-grad forward, {how}; mean episode "
          f"length {sum(lengths) / len(lengths):.0f})")
    extra = ""
    peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in gpu), None)
    if peak is not None:   # decoding's FLOP/s (2 x parameters per token) against the card's
        frac = results[top] * 2 * params / (peak * 1e12)
        print(f"decode_flops_frac_b{top}={frac:.5f} (of {peak:.0f} bf16 TFLOP/s)")
        extra = f" decode_flops_frac_b{top}={frac:.5f}"
    print(f"summary: speedup_b{top}={results[top] / seq_rate:.2f} "
          f"ceiling_frac_b{top}={results[top] / ceiling:.3f}{extra} "
          + " ".join(f"b{b}={r:.1f}tok/s" for b, r in results.items())
          + f" {name}={seq_rate:.1f}tok/s" + decode_part + cast_line)


def static_generate_line(args, model, tok, retriever, questions, cfg, results, lengths,
                         tail: str) -> None:
    """The engine's tokens/s at its top batch against `static_generate` at the same batch:
    `gpu_rollout_speedup=` (issue 57's target: the static backend at least 2x generate
    with a static cache and CUDA graphs); the summary line."""
    top = max(results)
    tokens, seconds, warm, compiled = static_generate(model, tok, retriever, questions, cfg,
                                                      top)
    rate = tokens / seconds
    print(f"static_generate_b{top}_tokens={tokens} static_generate_b{top}_seconds={seconds:.1f} "
          f"static_generate_b{top}_tok_s={rate:.1f} static_generate_warmup_s={warm:.1f} "
          f"static_generate_compiled={int(compiled)} (transformers' generate, static cache; "
          f"compiled with CUDA graphs on CUDA, the warm-up apart)")
    ceiling, how = forward_ceiling(model, lengths)
    print(f"forward_ceiling_tok_s={ceiling:.1f} (no-grad forward, {how})")
    print(f"summary: gpu_rollout_speedup={results[top] / rate:.2f} backend={args.backend} "
          f"static_generate_compiled={int(compiled)} b{top}={results[top]:.1f}tok/s "
          f"static_generate_b{top}={rate:.1f}tok/s ceiling_frac_b{top}="
          f"{results[top] / ceiling:.3f}" + tail)


def cast_ab(model, tok, retriever, questions, args, batch: int, rounds: int = 2) -> str:
    """The engine at `batch` with the weights cast once a turn (`models.cast_weights`)
    against autocast casting them on every forward pass, alternated `rounds` times (the
    order flipped each round); seconds summed per side. The greedy episodes must match."""
    import contextlib

    import seekrl.models as models

    real = models.cast_weights
    cfg = RolloutConfig(max_turns=args.max_turns, max_new_tokens=args.max_new_tokens,
                        batch_size=batch, greedy=True)
    seconds = {"cast": 0.0, "autocast": 0.0}
    tokens: dict[str, list] = {}
    try:
        for r in range(rounds):
            for side in (("cast", "autocast") if r % 2 == 0 else ("autocast", "cast")):
                models.cast_weights = real if side == "cast" else \
                    (lambda m: contextlib.nullcontext(m))
                engine = RolloutEngine(HFBackend(model, tok), tok, retriever, cfg)
                started = time.perf_counter()
                trajs = engine.run(questions)
                seconds[side] += time.perf_counter() - started
                tokens[side] = [t.token_ids for t in trajs]
    finally:
        models.cast_weights = real
    same = tokens["cast"] == tokens["autocast"]
    ratio = seconds["autocast"] / seconds["cast"]
    print(f"cast_b{batch}_seconds={seconds['cast']:.1f} autocast_b{batch}_seconds="
          f"{seconds['autocast']:.1f} cast_speedup_b{batch}={ratio:.2f} same_tokens={same}")
    return f"cast_speedup_b{batch}={ratio:.2f} same_tokens={same}"


if __name__ == "__main__":
    main()
