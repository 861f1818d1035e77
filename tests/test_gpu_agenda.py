"""tools/gpu/run's stages at tiny size on the CPU (`--dry-run`), so that the GPU agenda
(tools/gpu/AGENDA.md) runs the day a GPU is lent: each stage exits 0 and records its
key=value lines in summary.txt."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "tools" / "gpu" / "run"


def run(tmp_path: Path, *stages: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    env.pop("OUT", None)
    for stage in stages:
        r = subprocess.run([sys.executable, str(RUN), stage, "--dry-run", "--out",
                            str(tmp_path / "out"), "--state", str(tmp_path / "state")],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, (stage, r.stdout[-3000:], r.stderr[-3000:])
    return (tmp_path / "out" / "summary.txt").read_text()


def test_unknown_stage_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, str(RUN), "nonsense", "--dry-run", "--out",
                        str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.strip() == (
        "run: unknown stage 'nonsense' (see tools/gpu/AGENDA.md)")


def test_smoke_dry_run(tmp_path):
    summary = run(tmp_path, "smoke")
    assert "stage=smoke dry_run=1 rc=0" in summary
    assert "greedy_same_episodes=4/4" in (tmp_path / "out" / "smoke.log").read_text() or \
        "3 passed" in (tmp_path / "out" / "smoke.log").read_text()


@pytest.mark.slow
def test_speed_dry_run(tmp_path):
    summary = run(tmp_path, "speed")
    for stage in ("speed-rollout", "speed-arch", "speed-decode", "speed-train"):
        assert f"stage={stage} dry_run=1 rc=0" in summary
    assert "speedup_b2=" in summary and "agent_step=" in summary
    assert "decode_ms_seekrl=" in summary and "best=" in summary
    log = (tmp_path / "out" / "speed-decode.log").read_text()
    assert "decode_ms_hf_loop=" in log and "profile_host_ms_per_step=" in log
    assert "decode_ms_hf_static=" in log and "static_compile_s=" in log
    assert "decode_ms_hf_cb=" in log and "decode_ms_hf_cb=error" not in log
    assert "decode_ms_seekrl_warm=" in log and "warm_gain_ms=" in summary
    # speed-remedy reran the rollout bench under the two best settings, default first
    assert "stage=speed-remedy-default dry_run=1 rc=0" in summary
    picks = re.search(r"^stage=speed-decode .*? remedies=(\S+)", summary, re.M).group(1)
    for pick in [p for p in picks.split(",") if p != "default"][:2]:
        assert f"stage=speed-remedy-{pick} dry_run=1 rc=0" in summary


def test_speed_remedy_needs_speed_decode_first(tmp_path):
    r = subprocess.run([sys.executable, str(RUN), "speed-remedy", "--dry-run", "--out",
                        str(tmp_path / "out"), "--state", str(tmp_path / "state")], cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=str(ROOT / "src")), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1 and "run speed-decode first" in r.stderr


@pytest.mark.slow
def test_learn_dry_run(tmp_path):
    summary = run(tmp_path, "learn-sft", "learn-outcome-s0", "learn-evidence-s0",
                  "learn-report")
    assert "process_gain=" in summary
    runs = tmp_path / "out" / "learn" / "runs"
    assert (runs / "outcome-s0" / "result.json").is_file()
    assert (runs / "evidence-s0" / "result.json").is_file()
    assert (tmp_path / "out" / "process_ablation.png").is_file()


def test_a_continuous_batching_start_that_fails_leaves_the_models_attention_as_it_was(
        monkeypatch):
    """transformers switches the model to paged attention when its continuous batching
    starts and back only when it stops; a start or graph warm-up that raises would leave
    it paged, and the profile after it (and the stage) would fail."""
    import importlib.util

    from seekrl.models import tiny_policy

    spec = importlib.util.spec_from_file_location("decode_step", ROOT / "bench" / "decode_step.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    model, tok = tiny_policy()

    def failing_start(**kw):
        model.set_attn_implementation("eager")   # stands in for paged|sdpa
        raise RuntimeError("graph capture failed")

    monkeypatch.setattr(model, "generate_batch", failing_start)
    with pytest.raises(RuntimeError, match="graph capture failed"):
        bench.hf_cb_ms(model, tok, [[1, 2, 3]], steps=2, warmup=1)
    assert model.config._attn_implementation == "sdpa"


def test_fresh_shapes_give_each_variant_key_lengths_of_its_own():
    """decode_step's variants meet key lengths no earlier one met: a kernel that builds
    something per length (cuDNN's attention) is timed cold, as a rollout meets it."""
    import importlib.util

    from seekrl.models import load_tokenizer

    spec = importlib.util.spec_from_file_location("decode_step", ROOT / "bench" / "decode_step.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    tok = load_tokenizer()
    steps = 5
    base = bench.contexts_for(tok, 6, 30, even=False)
    seen: set[int] = set()
    for k in range(4):
        ctx = bench.longer(base, k * (steps + 4), tok, seed=k)
        assert [c[len(c) - len(b):] for c, b in zip(ctx, base)] == base   # the rows kept
        width = max(map(len, ctx))
        # the lengths a run of steps + 1 (after its warm-up of 2) attends over
        lengths = set(range(width, width + steps + 3))
        assert not lengths & seen
        seen |= lengths
    assert bench.longer(base, 0, tok, seed=0) is base
