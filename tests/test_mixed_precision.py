"""dtype: bf16-mixed: float32 weights, bfloat16 matrix products under autocast, float32
logits; hooks, so copies compute with their own weights and nothing leaks."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch

from seekrl.models import ModelError, backbone, load_policy, mixed_precision, tiny_policy


def _ids(n: int = 2, t: int = 12) -> torch.Tensor:
    return torch.randint(5, 500, (n, t), generator=torch.Generator().manual_seed(0))


def test_matmuls_run_in_bfloat16_and_logits_come_back_in_float32():
    model, _ = tiny_policy(seed=1)
    with torch.no_grad():
        plain = model(input_ids=_ids()).logits
    mixed_precision(model)
    seen = []
    proj = backbone(model).layers[0].self_attn.q_proj
    handle = proj.register_forward_hook(lambda m, a, out: seen.append(out.dtype))
    with torch.no_grad():
        logits = model(input_ids=_ids()).logits
    handle.remove()
    assert seen == [torch.bfloat16]
    assert logits.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert not torch.equal(logits, plain)   # it did change the arithmetic
    torch.testing.assert_close(logits, plain, atol=0.05, rtol=0.05)
    assert not torch.is_autocast_enabled("cpu")   # nothing left open


def test_a_deep_copy_computes_with_its_own_weights():
    model, _ = tiny_policy(seed=1)
    mixed_precision(model)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(0.5)
        a, b = model(input_ids=_ids()).logits, twin(input_ids=_ids()).logits
    assert not torch.allclose(a, b)
    assert b.dtype == torch.float32


def test_applying_it_twice_adds_no_second_hook():
    model, _ = tiny_policy(seed=1)
    mixed_precision(model)
    hooks = len(backbone(model)._forward_pre_hooks)
    mixed_precision(model)
    assert len(backbone(model)._forward_pre_hooks) == hooks == 1


def test_autocast_is_closed_when_the_forward_raises():
    model, _ = tiny_policy(seed=1)
    mixed_precision(model)
    with pytest.raises(IndexError):
        backbone(model)(input_ids=torch.full((1, 3), 10**7))   # outside the vocabulary
    assert not torch.is_autocast_enabled("cpu")
    assert backbone(model)._seekrl_autocast_open == []


def test_training_keeps_float32_weights_and_small_updates():
    """The optimizer updates float32 weights: a step too small for bfloat16 to resolve
    still moves them (pure bfloat16 weights would round it away)."""
    model, _ = tiny_policy(seed=1)
    mixed_precision(model)
    w = backbone(model).layers[0].mlp.up_proj.weight
    before = w.detach().clone()
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    out = model(input_ids=_ids()).logits
    out.logsumexp(-1).mean().backward()
    assert w.grad is not None and w.grad.dtype == torch.float32
    opt.step()
    moved = w.detach() != before
    assert moved.any()
    assert (before.bfloat16().float() == (w.detach().bfloat16().float())).float().mean() > 0.9


def test_load_policy_names_the_mixed_dtype_when_refusing_another():
    with pytest.raises(ModelError, match="bf16-mixed"):
        load_policy("smollm2-135m", dtype="bf16-mixd")


def test_the_rollout_keeps_a_mixed_policys_kv_cache_in_bfloat16_with_the_same_tokens():
    """Autocast's attention reads keys and values in bfloat16 whatever they are stored in,
    so storing the keys in bfloat16 (not the rotary embedding's float32) shrinks the cache
    and changes no greedy token, across turns on top of the kept cache."""
    from seekrl.agent.backends import HFBackend, Sampling

    model, tok = tiny_policy(seed=3)
    mixed_precision(model)
    ctx = [[int(t) for t in row] for row in _ids(4, 10)]
    runs = {}
    for store in (True, False):
        backend = HFBackend(model, tok)
        if not store:
            backend._store_dtype = lambda: None
        with torch.no_grad():
            first = backend.generate(ctx, 12, Sampling(greedy=True), keys=[0, 1, 2, 3])
            nxt = [c + list(g) + [7, 8, 9] for c, g in zip(ctx, first)]
            second = backend.generate(nxt, 12, Sampling(greedy=True), keys=[0, 1, 2, 3])
        layer = backend._kept.cache.layers[0]
        # the values come out of autocast's projection in bfloat16 either way; the keys
        # out of the float32 rotary embedding
        assert layer.values.dtype == torch.bfloat16
        assert layer.keys.dtype == (torch.bfloat16 if store else torch.float32)
        runs[store] = [list(g) for g in first + second]
    assert runs[True] == runs[False] and all(runs[True])


def test_a_float32_policys_kv_cache_stays_float32():
    from seekrl.agent.backends import HFBackend

    model, tok = tiny_policy(seed=3)
    assert HFBackend(model, tok)._store_dtype() is None


def test_cast_weights_gives_the_same_logits_bit_for_bit_and_puts_the_weights_back():
    """Autocast multiplies in bfloat16 whether it casts a float32 weight itself or finds
    one cast already: the logits are the same bits, and the float32 parameters (the
    optimizer's) are back in place on the way out, also when the forward raises."""
    from seekrl.models import cast_weights, causal_lm

    model, _ = tiny_policy(seed=1)
    mixed_precision(model)
    params = {n: p for n, p in model.named_parameters()}
    with torch.no_grad():
        plain = model(input_ids=_ids()).logits
        with cast_weights(model):
            q = backbone(model).layers[0].self_attn.q_proj
            assert q.weight.dtype == torch.bfloat16
            cast = model(input_ids=_ids()).logits
        assert torch.equal(plain, cast)
        with pytest.raises(IndexError), cast_weights(model):
            backbone(model)(input_ids=torch.full((1, 3), 10**7))
    assert {n: p for n, p in model.named_parameters()} == params
    assert all(p.dtype == torch.float32 for p in model.parameters())
    lm = causal_lm(model)
    assert lm.get_output_embeddings().weight is lm.get_input_embeddings().weight   # still tied


def test_cast_weights_leaves_a_tied_embedding_in_float32():
    from seekrl.models import cast_weights, causal_lm

    model, _ = tiny_policy(seed=1)
    mixed_precision(model)
    lm = causal_lm(model)
    assert lm.get_output_embeddings().weight is lm.get_input_embeddings().weight
    with cast_weights(model):
        assert lm.get_output_embeddings().weight.dtype == torch.bfloat16
        assert lm.get_input_embeddings().weight.dtype == torch.float32


def test_cast_weights_is_a_no_op_for_a_float32_policy():
    from seekrl.models import cast_weights

    model, _ = tiny_policy(seed=1)
    before = {n: p for n, p in model.named_parameters()}
    with cast_weights(model):
        assert {n: p for n, p in model.named_parameters()} == before


def test_a_mixed_policy_samples_the_same_tokens_and_logprobs_with_cast_weights():
    """The backend casts a mixed policy's weights once a turn: the sampled tokens and
    their behaviour log-probabilities equal those of autocast casting on every step."""
    import seekrl.models as models
    from seekrl.agent.backends import HFBackend, Sampling

    model, tok = tiny_policy(seed=3)
    mixed_precision(model)
    ctx = [[int(t) for t in row] for row in _ids(4, 10)]
    runs = {}
    real = models.cast_weights
    for cast in (True, False):
        if not cast:
            models.cast_weights = lambda m: contextlib.nullcontext(m)
        try:
            torch.manual_seed(0)
            backend = HFBackend(model, tok)
            out = backend.generate(ctx, 12, Sampling(temperature=1.0), keys=[0, 1, 2, 3])
            nxt = [c + list(g) + [7, 8, 9] for c, g in zip(ctx, out)]
            out += backend.generate(nxt, 12, Sampling(temperature=1.0), keys=[0, 1, 2, 3])
        finally:
            models.cast_weights = real
        runs[cast] = [(list(g), g.logprobs) for g in out]
    assert runs[True] == runs[False]
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_a_half_precision_the_cpu_cannot_multiply_natively_is_warned_about(monkeypatch,
                                                                          tmp_path):
    """On a CPU without AVX-512 BF16/AMX a bfloat16 product takes torch's scalar fallback
    (808 s for an SFT step that float32 takes in 55): loading a policy so is warned about,
    by name of the dtype, and not where the CPU has it, on float32, or on an accelerator."""
    import warnings

    import seekrl.models as models
    from seekrl.recipes.pipeline import DemoConfig, demo_dtype

    monkeypatch.setattr(models, "cpu_multiplies_bf16", lambda: False)
    for dtype in ("bf16-mixed", "bfloat16", "bf16"):
        msg = models.slow_half_precision(dtype, "cpu")
        assert msg.startswith(f"dtype {dtype} on this CPU") and "no native bfloat16" in msg
    for dtype in ("float16", "fp16"):
        assert "float16 products" in models.slow_half_precision(dtype, "cpu")
    assert models.slow_half_precision("float32", "cpu") is None
    assert models.slow_half_precision("fp32", "cpu") is None
    assert models.slow_half_precision("bf16-mixed", "cuda:0") is None
    assert demo_dtype(DemoConfig(dtype="auto")) == "float32"
    missing = str(tmp_path / "no-such-model")   # a path: refused at once, no hub asked
    with pytest.warns(UserWarning, match="dtype bf16-mixed on this CPU .* no native bfloat16 multiply"):
        with pytest.raises(ModelError):   # warned before anything is loaded
            load_policy(missing, dtype="bf16-mixed")
    monkeypatch.setattr(models, "cpu_multiplies_bf16", lambda: True)
    for dtype in ("bf16-mixed", "bfloat16", "bf16", "fp32"):
        assert models.slow_half_precision(dtype, "cpu") is None
    assert models.slow_half_precision("float16", "cpu") is not None   # no native fp16 check
    assert demo_dtype(DemoConfig(dtype="auto")) == "bf16-mixed"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ModelError):
            load_policy(missing, dtype="bf16-mixed")


def test_the_cpu_dtype_bench_prints_its_figures_and_a_summary():
    """bench/cpu_dtype.py's product timings (tiny, no model): key=value lines, the summary
    last, and the native flag it reports is the one `dtype: auto` uses."""
    import subprocess
    import sys
    from pathlib import Path

    import seekrl.models as models

    bench = Path(__file__).resolve().parent.parent / "bench" / "cpu_dtype.py"
    got = subprocess.run([sys.executable, str(bench), "--skip-model", "--tokens", "4",
                          "--repeats", "1"], capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    lines = got.stdout.strip().splitlines()
    figures = dict(kv.split("=", 1) for line in lines for kv in line.split() if "=" in kv)
    for key in ("matmul_fp32_ms", "matmul_bf16_ms", "matmul_fp16_ms", "bf16_vs_fp32_matmul"):
        assert float(figures[key]) > 0
    assert lines[-1].startswith("cpu_dtype: bf16_vs_fp32_matmul=")
    assert figures["native_bf16"] == str(models.cpu_multiplies_bf16())
