"""Evaluation on the static backend (`rollout.backend: static`, `seekrl eval --backend
static`): eval_policy and the CLI choose it from the episode settings, and greedy episodes
give the HF loop's exact tokens and answers on the tiny model."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import build_world_and_index
from typer.testing import CliRunner

from seekrl.agent.backends import HFBackend
from seekrl.agent.static_backend import StaticBackend
from seekrl.agent.trajectory import read_trajectories
from seekrl.cli import app
from seekrl.config import EvalConfig, RolloutSettings
from seekrl.eval import evaluate as evaluate_mod
from seekrl.eval.evaluate import eval_backend_kind, eval_policy, eval_settings
from seekrl.retrieval.index import load_index


@pytest.fixture(scope="module")
def world_index(tmp_path_factory):
    _, paths, index_dir = build_world_and_index(
        tmp_path_factory.mktemp("evalworld"), seed=3, difficulty="easy", entities=200,
        n_train=10, n_dev=10, n_test=12)
    return paths, index_dir


@pytest.fixture(scope="module")
def sharp():
    """The tiny random model with its matrices scaled up: replies that differ from question
    to question (the plain tiny model writes newlines whatever it is asked), so answers
    compared are answers."""
    from seekrl.models import tiny_policy

    torch.set_num_threads(1)
    model, tok = tiny_policy(seed=3)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4)
    return model, tok


def _episodes(run) -> list[tuple]:
    return [(t.example_id, t.sample_index, t.token_ids, t.answer, t.finish_reason)
            for t in read_trajectories(run / "trajectories.jsonl")]


def test_the_evaluation_backend_follows_the_rollout_section():
    assert eval_backend_kind(None) == "hf"
    assert eval_backend_kind(RolloutSettings(backend="static")) == "static"
    assert eval_backend_kind(RolloutSettings(backend="vllm")) == "hf"   # no second engine
    # the HF loop caps an inherited rollout batch; the static backend keeps the run's rows
    assert eval_settings(EvalConfig(), RolloutSettings(batch_size=256)).batch_size == 32
    assert eval_settings(EvalConfig(), RolloutSettings(batch_size=256, backend="static")
                         ).batch_size == 256


def test_eval_policy_on_the_static_backend_gives_the_hf_loops_answers(world_index, sharp,
                                                                      tmp_path, monkeypatch):
    """eval_policy with `rollout.backend: static` decodes on a StaticBackend (one, for the
    greedy and the sampled runs) and writes the HF loop's greedy episodes: tokens, answers,
    finish reasons and metrics."""
    paths, index_dir = world_index
    model, tok = sharp
    torch.set_num_threads(1)
    built = []
    real = evaluate_mod.eval_backend

    def spy(*args, **kw):
        built.append(real(*args, **kw))
        return built[-1]

    monkeypatch.setattr(evaluate_mod, "eval_backend", spy)
    cfg = EvalConfig(data=str(paths["test"]), n=4, samples=2)
    limits = dict(max_turns=3, max_new_tokens=12, max_total_tokens=512, batch_size=3)
    runs = {}
    for kind in ("hf", "static"):
        m = eval_policy(model, tok, load_index(index_dir), cfg, tmp_path / kind,
                        episode=RolloutSettings(backend=kind, **limits))
        runs[kind] = m
    assert [type(b) for b in built] == [HFBackend, StaticBackend]
    assert _episodes(tmp_path / "static") == _episodes(tmp_path / "hf")
    assert {k: v for k, v in runs["static"].items() if k not in ("config", "seconds", "sampled")
            } == {k: v for k, v in runs["hf"].items()
                  if k not in ("config", "seconds", "sampled")}
    # sampled on the same backend (its draws follow its own rows' order, not the HF loop's)
    sampled = read_trajectories(tmp_path / "static" / "sampled" / "trajectories.jsonl")
    assert sorted(t.sample_index for t in sampled) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert sum(len(t.steps) for t in read_trajectories(tmp_path / "hf" / "trajectories.jsonl")
               ) > 4   # several turns
    # a backend handed in is used as it is (a trainer's own)
    mine = StaticBackend(model, tok, max_len=512)
    built.clear()
    eval_policy(model, tok, load_index(index_dir), EvalConfig(data=str(paths["test"]), n=4),
                tmp_path / "given", episode=RolloutSettings(**limits), backend=mine)
    assert built == []
    assert _episodes(tmp_path / "given") == _episodes(tmp_path / "hf")


def test_cli_eval_backend_static_gives_the_hf_loops_run(world_index, sharp, tmp_path):
    paths, index_dir = world_index
    model, tok = sharp
    model_dir = tmp_path / "tiny-model"
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    runner = CliRunner()
    # agent: multi-turn episodes; direct: the reply is the answer (the random model's text)
    for method in ("agent", "direct"):
        for kind in ("hf", "static"):
            # direct searches nothing: no index (it is refused as unused)
            where = ["--index", str(index_dir)] if method == "agent" else []
            r = runner.invoke(app, ["eval", "--model", str(model_dir), "--data",
                                    str(paths["test"]), *where, "--out",
                                    str(tmp_path / kind / method), "--limit", "3",
                                    "--max-new-tokens", "10", "--max-turns", "2",
                                    "--max-total-tokens", "512", "--backend", kind,
                                    "--method", method], catch_exceptions=False)
            assert r.exit_code == 0, r.output
        assert _episodes(tmp_path / "static" / method) == _episodes(tmp_path / "hf" / method)
    answers = [e[3] for e in _episodes(tmp_path / "static" / "direct")]
    assert all(answers) and len(set(answers)) == 3   # answers compared, one per question
    tmp_path = tmp_path / "static"
    m = json.loads((tmp_path / "agent" / "metrics.json").read_text())
    assert m["config"]["backend"] == "static"
    # static chooses its own attention, as the config says for rollout.backend
    r = runner.invoke(app, ["eval", "--model", str(model_dir), "--data", str(paths["test"]),
                            "--method", "direct", "--attention", "eager", "--backend", "static",
                            "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "--attention: 'eager' sets seekrl's decoding loop" in r.output


def test_a_trainers_dev_evaluation_reuses_its_static_backend(tmp_path, monkeypatch):
    """One static backend a run: its evaluations decode on the rollouts' rows (a second
    backend would allocate a second cache of rows x max_total_tokens)."""
    import copy

    from seekrl.agent import static_backend as sb
    from seekrl.config import TrainConfig
    from seekrl.data.qa import read_qa_jsonl
    from seekrl.models import tiny_policy
    from seekrl.recipes.train import Trainer
    from seekrl.rewards.outcome import RewardParts

    _, paths, index_dir = build_world_and_index(tmp_path / "w", seed=4, difficulty="easy",
                                                entities=200, n_train=8, n_dev=4, n_test=4)
    built = []
    real_init = sb.StaticBackend.__init__

    def counted(self, *a, **kw):
        built.append(self)
        real_init(self, *a, **kw)

    monkeypatch.setattr(sb.StaticBackend, "__init__", counted)
    cfg = TrainConfig.model_validate({
        "data": "unused", "index": "unused", "out": str(tmp_path / "run"), "steps": 1,
        "questions_per_step": 2, "group_size": 2, "save_every": 0,
        "rollout": {"max_turns": 2, "max_new_tokens": 6, "max_info_tokens": 48, "topk": 2,
                    "batch_size": 8, "backend": "static"},
        "algo": {"mini_batch_size": 4, "micro_batch_size": 2},
        "eval": {"data": str(paths["dev"]), "n": 2, "every": 1, "max_turns": 1,
                 "max_new_tokens": 4}})
    model, tok = tiny_policy(seed=3)

    def parity(t):
        r = float(t.sample_index % 2)
        return RewardParts(total=r, outcome=r, format=0.0, penalty=0.0)

    summary = Trainer(cfg, model=copy.deepcopy(model), tokenizer=tok,
                      retriever=load_index(index_dir), questions=read_qa_jsonl(paths["train"]),
                      reward_fn=parity, overwrite=True).train()
    assert summary["dev"]["questions"] == 2
    assert len(built) == 1   # the start's evaluation, the step's rollouts and the final one


def test_the_static_backend_samples_with_the_weights_of_the_last_update(tmp_path):
    """Two RL steps on the static backend at a rate that moves the tiny policy a lot: the
    second step's rollouts were sampled by the updated weights (their log-probs equal the
    trainer's to rounding), so the backend's view of the weights follows the update
    without being rebuilt."""
    import copy

    from seekrl.config import TrainConfig
    from seekrl.data.qa import read_qa_jsonl
    from seekrl.models import tiny_policy
    from seekrl.recipes.train import Trainer
    from seekrl.rewards.outcome import RewardParts

    _, paths, index_dir = build_world_and_index(tmp_path / "w", seed=4, difficulty="easy",
                                                entities=200, n_train=8, n_dev=4, n_test=4)
    cfg = TrainConfig.model_validate({
        "data": "unused", "index": "unused", "out": str(tmp_path / "run"), "steps": 2,
        "questions_per_step": 2, "group_size": 2, "save_every": 0,
        "rollout": {"max_turns": 2, "max_new_tokens": 6, "max_info_tokens": 48, "topk": 2,
                    "batch_size": 8, "backend": "static", "temperature": 1.0},
        "algo": {"mini_batch_size": 4, "micro_batch_size": 2},
        "optim": {"lr": 1e-2, "warmup_steps": 0}})
    model, tok = tiny_policy(seed=3)
    policy = copy.deepcopy(model)

    def parity(t):
        r = float(t.sample_index % 2)
        return RewardParts(total=r, outcome=r, format=0.0, penalty=0.0)

    Trainer(cfg, model=policy, tokenizer=tok, retriever=load_index(index_dir),
            questions=read_qa_jsonl(paths["train"]), reward_fn=parity, overwrite=True).train()
    moved = max(float((a.detach() - b.detach()).abs().max())
                for a, b in zip(policy.parameters(), model.parameters()))
    assert moved > 1e-3   # the update moved the weights well past any rounding
    steps = [r for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
             if "episodes" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["rollout_logp_gap"] < 1e-4 for r in steps), [r["rollout_logp_gap"] for r in steps]
