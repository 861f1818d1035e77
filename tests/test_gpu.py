"""On a GPU (`pytest -m gpu`, or `tools/gpu/run smoke`): seekrl's paths on CUDA. Skipped
without CUDA, except under `tools/gpu/run --dry-run` (SEEKRL_GPU_DRY=1), which runs them on
the CPU so that the agenda's code cannot rot."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

pytestmark = pytest.mark.gpu

if torch.cuda.is_available():
    DEVICE = "cuda"
elif os.environ.get("SEEKRL_GPU_DRY") == "1":
    DEVICE = "cpu"
else:
    DEVICE = None
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs CUDA (tools/gpu/AGENDA.md)")]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A small world, its BM25 index and the tiny model saved to disk."""
    from conftest import build_lab

    root = tmp_path_factory.mktemp("gpu-lab")
    world, paths, index_dir, _ = build_lab(root)
    return {"root": root, "world": world, "index": index_dir, "train": paths["train"],
            "model": root / "tiny"}


def _rollout(model, tok, index_dir, questions):
    from seekrl.agent.backends import HFBackend
    from seekrl.agent.rollout import RolloutConfig, RolloutEngine
    from seekrl.retrieval.index import load_index

    cfg = RolloutConfig(max_turns=2, max_new_tokens=12, greedy=True, batch_size=4)
    return RolloutEngine(HFBackend(model, tok), tok, load_index(index_dir), cfg).run(questions)


def test_greedy_rollout_on_the_device_gives_the_cpus_tokens(lab):
    from seekrl.models import tiny_policy

    questions = lab["world"].splits["test"][:4]
    model, tok = tiny_policy(seed=0)
    on_cpu = _rollout(model, tok, lab["index"], questions)
    on_dev = _rollout(model.to(DEVICE), tok, lab["index"], questions)
    same = sum(a.token_ids == b.token_ids for a, b in zip(on_cpu, on_dev))
    print(f"device={DEVICE} greedy_same_episodes={same}/{len(on_cpu)}")
    assert same == len(on_cpu)


def test_bf16_forward_backward_is_finite():
    from seekrl.models import tiny_policy

    model, tok = tiny_policy(seed=0)
    model = model.to(device=DEVICE, dtype=torch.bfloat16).train()
    ids = torch.tensor([tok.encode("Where was Ilsa Marrow born? <search> Ilsa")], device=DEVICE)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert math.isfinite(loss.item()) and grads
    assert all(torch.isfinite(g.float()).all() for g in grads)


def test_one_train_step_in_bfloat16_end_to_end(lab, tmp_path):
    """`seekrl train --device DEVICE dtype=bfloat16`, one step; the rollout/trainer log-prob
    gap (the same tokens scored by the sampler and by the update's forward) is printed and
    bounded: bf16 rounding, not a different distribution."""
    from typer.testing import CliRunner

    from seekrl.cli import app

    out = tmp_path / "run"
    args = ["train", f"data={lab['train']}", f"index={lab['index']}", f"out={out}",
            f"model={lab['model']}", f"device={DEVICE}", "dtype=bfloat16", "steps=1",
            "questions_per_step=2", "group_size=2", "rollout.max_turns=2",
            "rollout.max_new_tokens=6", "rollout.max_info_tokens=48", "rollout.topk=2",
            "algo.mini_batch_size=2", "algo.micro_batch_size=1", "optim.lr=1e-3", "--overwrite"]
    r = CliRunner().invoke(app, args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "episodes" in s]
    assert len(steps) == 1 and math.isfinite(steps[0]["pg_loss"])
    gap = steps[0].get("rollout_logp_gap")
    print(f"device={DEVICE} pg_loss={steps[0]['pg_loss']:.4f} rollout_logp_gap={gap}")
    if gap is not None:
        assert gap < 0.5
    assert (out / "final" / "config.json").is_file()


def _encoder_folder(root) -> str:
    """The bundled MiniLM when installed (the GPU machine has it only when `tools/gpu/prepare
    --with-encoder` carried it), else a 2-layer random BERT with the policy's tokenizer."""
    try:
        from seekrl.retrieval.dense import bundled_encoder_path

        return str(bundled_encoder_path())
    except Exception:
        from transformers import BertConfig, BertModel

        from seekrl.models import DEFAULT_MODEL, load_tokenizer

        tok = load_tokenizer(DEFAULT_MODEL)
        torch.manual_seed(0)
        BertModel(BertConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2,
                             num_attention_heads=4, intermediate_size=128,
                             max_position_embeddings=256)).save_pretrained(root)
        tok.save_pretrained(root)
        return str(root)


def test_index_encoder_on_the_device_agrees_with_the_cpu(tmp_path):
    """The encoder a dense index build uses (`build_encoder`: fp16 on a GPU) gives the CPU's
    float32 vectors up to rounding, and the same scores up to fp16's rounding."""
    import numpy as np

    from seekrl.retrieval.dense import build_encoder

    folder = _encoder_folder(tmp_path / "enc")
    docs = [f"Ilsa Marrow was born in Tarrow in {1900 + i}; she studied {w}." for i, w in
            enumerate(["law", "music", "physics", "botany", "history", "chess", "medicine"])]
    on_cpu = build_encoder(folder, "cpu").encode(docs, normalize_embeddings=True)
    encoder = build_encoder(folder, DEVICE)
    dtype = next(encoder.parameters()).dtype
    on_dev = encoder.encode(docs, normalize_embeddings=True, convert_to_numpy=True)
    on_dev = np.asarray(on_dev, dtype=np.float32)
    cosine = (on_cpu * on_dev).sum(-1) / (np.linalg.norm(on_cpu, axis=-1)
                                           * np.linalg.norm(on_dev, axis=-1))
    print(f"device={DEVICE} encoder_dtype={dtype} min_cosine_vs_cpu={cosine.min():.5f}")
    if DEVICE == "cuda":
        assert dtype == torch.float16
    assert cosine.min() > 0.995
    # Scores, not an exact ranking: this random encoder puts these near-identical sentences
    # within 1.4e-3 of each other (CPU 0.99862-0.99907 against the first), and fp16 moved each
    # by up to 4e-4 on an H200 (2026-11-28), which reordered them: an argsort compared noise.
    cpu_s, dev_s = on_cpu @ on_cpu[0], on_dev @ on_dev[0]
    assert np.abs(cpu_s - dev_s).max() < 2e-3, (cpu_s, dev_s)
    assert int(np.argmax(dev_s)) == 0   # a document is its own best match


def test_each_attention_setting_computes_the_same_distribution():
    """`rollout.attention` on the device: each variant the kernels accept gives the default's
    next-token log-probs on a left-padded batch, up to bf16 rounding, and decodes through the
    engine (its masks and growing cache); a variant a kernel refuses says so and is named in
    the log (efficient / cudnn on a CPU)."""
    from seekrl.agent.backends import HFBackend, Sampling
    from seekrl.config import ATTENTION
    from seekrl.models import attention_variant, pad_id_of, tiny_policy

    model, tok = tiny_policy(seed=0)
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    model = model.to(DEVICE, dtype).eval()
    contexts = [tok.encode("a short one"), tok.encode("a much longer context than that " * 3)]
    width = max(map(len, contexts))
    ids = torch.tensor([[pad_id_of(tok)] * (width - len(c)) + c for c in contexts],
                       device=DEVICE)
    mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts],
                        device=DEVICE)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)

    def logprobs(name):
        with torch.no_grad(), attention_variant(model, name):
            out = model(input_ids=ids, attention_mask=mask, position_ids=positions)
        return out.logits[:, -1].float().log_softmax(-1)

    base = logprobs("default")
    ran = []
    for name in ATTENTION[1:]:
        try:
            diff = (logprobs(name) - base).abs().max().item()
            tokens = HFBackend(model, tok, attention=name).generate(
                contexts, 4, Sampling(greedy=True))
        except (RuntimeError, ValueError) as err:   # a kernel not here, or refusing these inputs
            print(f"attention_{name}=refused ({str(err).splitlines()[0][:80]})")
            continue
        print(f"attention_{name}_max_logprob_diff={diff:.4f} tokens={list(map(len, tokens))}")
        assert diff < (0.1 if dtype == torch.bfloat16 else 1e-4), name
        ran.append(name)
    assert "eager" in ran and "sdpa_math" in ran
    assert model.config._attn_implementation == "sdpa"   # every variant undone
