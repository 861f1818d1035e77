"""Data-parallel training (rl/distributed.py): two gloo processes on the tiny model take the
same update as one process on the same batch, and a whole two-process run trains, writes
its run folder once and resumes."""

from __future__ import annotations

import json
import math
import os
import socket
import time
from pathlib import Path

import pytest
import torch
from conftest import build_world_and_index
from hypothesis import given
from hypothesis import strategies as st

from seekrl.agent.trajectory import read_trajectories, write_trajectories
from seekrl.config import TrainConfig
from seekrl.data.qa import read_qa_jsonl
from seekrl.rewards.outcome import RewardParts
from seekrl.rl.distributed import Dist


@given(st.lists(st.integers(), max_size=40), st.integers(1, 6))
def test_shares_tile_the_items_in_rank_order(items, world):
    shares = [Dist(rank, world).share(items) for rank in range(world)]
    assert [x for s in shares for x in s] == items
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_one_process_is_the_identity():
    d = Dist()
    assert d.main and not d.active
    assert d.share([1, 2, 3]) == [1, 2, 3] and d.gather([4]) == [4]
    assert d.broadcast("x") == "x" and d.sum_values({"a": 1.0}) == {"a": 1.0}
    p = torch.nn.Parameter(torch.ones(2))
    p.grad = torch.full((2,), 3.0)
    d.sum_gradients([p])
    assert p.grad.tolist() == [3.0, 3.0]


def test_from_env_single_process_leaves_the_device(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert Dist.from_env("cpu") == (Dist(), "cpu")


def test_from_env_refuses_a_fixed_gpu_with_several_processes(monkeypatch):
    from seekrl.errors import DeviceError

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(DeviceError, match="no RANK"):
        Dist.from_env("cpu")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(DeviceError, match="cuda:LOCAL_RANK"):
        Dist.from_env("cuda:1")
    with pytest.raises(DeviceError, match="cpu \\(gloo\\) or cuda"):
        Dist.from_env("mps")



_GATHER_AND_EXIT = """
from seekrl.rl.distributed import Dist
d, _ = Dist.from_env("cpu")
for _ in range(3):
    d.gather([1, 2, 3])
"""


def test_processes_that_gather_and_exit_at_once_exit_cleanly(tmp_path):
    """A process whose last collective comes just before its end used to abort at exit
    ("terminate called without an active exception": gloo's worker took the GIL during
    interpreter finalization) in about 4 runs of 10; `Dist.from_env` now leaves at exit
    through a pause that lets the worker finish. Four launches of two processes: a
    regression shows with probability about 0.87 (0 aborts in 30 launches with the pause)."""
    import subprocess
    import sys

    env_base = {k: v for k, v in os.environ.items()
                if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env_base.update(OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", WORLD_SIZE="2")
    for launch in range(4):
        port = str(_free_port())
        procs = [subprocess.Popen([sys.executable, "-c", _GATHER_AND_EXIT],
                                  env={**env_base, "MASTER_PORT": port, "RANK": str(r),
                                       "LOCAL_RANK": str(r)},
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(2)]
        try:
            outs = [p.communicate(timeout=120)[0] for p in procs]
        finally:
            for p in procs:
                p.kill()
        for r, (p, out) in enumerate(zip(procs, outs)):
            assert p.returncode == 0 and "terminate called" not in out, \
                f"launch {launch}, rank {r}: exit {p.returncode}\n{out[-2000:]}"


def test_transformer_blocks_are_the_no_split_classes_or_refused():
    from seekrl.config import ConfigError
    from seekrl.models import tiny_policy
    from seekrl.rl.distributed import transformer_blocks

    model, _ = tiny_policy(seed=0, layers=3)
    blocks = transformer_blocks(model)
    assert [type(b).__name__ for b in blocks] == ["LlamaDecoderLayer"] * 3
    with pytest.raises(ConfigError, match="cannot find the transformer blocks of Sequential"):
        transformer_blocks(torch.nn.Sequential(torch.nn.Linear(2, 2)))


def test_shard_fsdp_in_one_process_says_there_is_nothing_to_shard(world_dir, tmp_path):
    lines = []
    console = type("C", (), {"print": lambda self, *a, **k: lines.append(" ".join(map(str, a)))})()
    trainer = _trainer(_cfg(tmp_path / "one", shard="fsdp"), world_dir, dist=Dist(),
                       overwrite=True, console=console)
    from seekrl.rl.distributed import Replicated
    assert isinstance(trainer.runtime, Replicated)
    assert any("one training process, nothing to shard" in x for x in lines)


# ---------------------------------------------------------------- two processes


def parity_reward(t) -> RewardParts:
    r = float(t.sample_index % 2) + 0.1 * (t.n_generated % 3)
    return RewardParts(total=r, outcome=r, format=0.0, penalty=0.0)


def _cfg(out: Path, **over) -> TrainConfig:
    base = {"data": "unused", "index": "unused", "out": str(out), "steps": 1, "seed": 5,
            "questions_per_step": 2, "group_size": 4, "save_every": 1,
            "rollout": {"max_turns": 2, "max_new_tokens": 6, "max_info_tokens": 48, "topk": 2,
                        "batch_size": 8},
            # credit_invalid_turns: the tiny model's turns are nearly all invalid, and with
            # their positive advantages capped most weights get a near-zero gradient, whose
            # sign AdamW's first step follows (see the tolerance below)
            "algo": {"mini_batch_size": 4, "micro_batch_size": 1, "epochs": 2, "kl_coef": 0.1,
                     "entropy_coef": 0.01, "credit_invalid_turns": True},
            "optim": {"lr": 1e-3, "warmup_steps": 0}}   # the full lr: a visible update
    base.update(over)
    return TrainConfig.model_validate(base)


def _policy(arch: str):
    """The tiny Llama (tied embeddings), or a tiny Qwen2 with its own LM head (as
    Qwen2.5-3B and larger have): under FSDP the LM head is then a weight of its own."""
    from seekrl.models import load_tokenizer, tiny_policy

    if arch == "llama":
        return tiny_policy(seed=3)
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = load_tokenizer()
    config = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, tie_word_embeddings=False,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    torch.manual_seed(3)
    return Qwen2ForCausalLM(config).eval(), tok


def _trainer(cfg: TrainConfig, world_dir: Path, dist: Dist | None = None, arch: str = "llama",
             bf16: bool = False, **kw):
    from seekrl.recipes.train import Trainer
    from seekrl.retrieval.index import load_index

    torch.set_num_threads(1)
    model, tok = _policy(arch)
    if bf16:
        model = model.to(torch.bfloat16)
    return Trainer(cfg, model=model, tokenizer=tok, retriever=load_index(world_dir / "index"),
                   questions=read_qa_jsonl(world_dir / "train.jsonl"), reward_fn=parity_reward,
                   dist=dist, **kw)


def _trainable(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()
            if p.requires_grad}


def _worker(rank: int, job: str, world_dir: str, work: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2",
                      RANK=str(rank), LOCAL_RANK=str(rank))
    work_dir = Path(work)
    if job == "grads":
        import torch.distributed as dist

        dist.init_process_group("gloo")
        d = Dist(rank, 2)
        params = [torch.nn.Parameter(torch.zeros(3)) for _ in range(3)]
        params[0].grad = torch.full((3,), float(rank + 1))         # both ranks: 1 + 2
        if rank == 1:
            params[1].grad = torch.tensor([1.0, 2.0, 3.0])         # one rank only
        d.sum_gradients(params)                                     # params[2]: none anywhere
        torch.save({"grads": [None if p.grad is None else p.grad.tolist() for p in params],
                    "gathered": d.gather([rank, rank]), "summed": d.sum_values({f"r{rank}": 1.0,
                                                                                "all": 2.0}),
                    "broadcast": d.broadcast(f"from {rank}")}, work_dir / f"rank{rank}.pt")
    elif job.startswith("update"):   # update, or update:fsdp
        over = json.loads((work_dir / "cfg.json").read_text())
        arch = over.pop("_arch", "llama")
        trainer = _trainer(_cfg(work_dir / "dp-run", **over), Path(world_dir), overwrite=True,
                           arch=arch)
        batch = read_trajectories(work_dir / "batch.jsonl")
        record = trainer.learn(batch)
        record.pop("correct_logps", None)
        state = trainer.state_bytes()
        with trainer.full_weights():
            params = _trainable(trainer)
        torch.save({"params": params, "record": record, "state": state,
                    "sharded": type(trainer.runtime).__name__ == "Sharded"}, work_dir / f"rank{rank}.pt")
    elif job == "steps":   # a short run of the settings in cfg.json, bf16 if asked
        over = json.loads((work_dir / "cfg.json").read_text())
        bf16 = over.pop("_bf16", False)
        cfg = _cfg(work_dir / "steps", **over)
        trainer = _trainer(cfg, Path(world_dir), overwrite=True, bf16=bf16)
        records = [trainer.step(step) for step in range(1, cfg.steps + 1)]
        # the Python API outside a step: rollout and score gather the weights themselves
        # (sharded, a bare rollout met DTensor weights), each rank its own number of
        # questions; a step after it must still agree across ranks
        mine = trainer.rollout(trainer.sample_questions(99, 1 + rank), seed=5 + rank)
        trainer.score(mine)
        records.append(trainer.step(cfg.steps + 1))
        torch.save({"records": records, "played": len(mine)}, work_dir / f"rank{rank}.pt")
    elif job == "unstepped":   # a sharded checkpoint of an optimizer that never stepped
        over = {"shard": "fsdp", "steps": 2, "save_every": 1,
                "algo": {"dynamic_sampling": True, "max_refills": 0},
                "optim": {"lr": 1e-3, "warmup_steps": 3}}   # an lr that moves step by step
        first = _trainer(_cfg(work_dir / "run", **over), Path(world_dir), overwrite=True)
        first.reward_fn = lambda t: RewardParts(total=0.0, outcome=0.0, format=0.0, penalty=0.0)
        first.train(until=1)
        resumed = _trainer(_cfg(work_dir / "run", **over), Path(world_dir), resume=True)
        torch.save({"state": len(resumed.optimizer.state), "step": resumed.state.step_done,
                    "lr": resumed.optimizer.param_groups[0]["lr"],
                    "lr_stopped": first.optimizer.param_groups[0]["lr"]},
                   work_dir / f"rank{rank}.pt")
    else:   # a 3-step run stopped after step 2 and resumed; and 3 steps straight
        over = json.loads((work_dir / "cfg.json").read_text())
        cfg = _cfg(work_dir / "run", steps=3, **over)
        summary = _trainer(cfg, Path(world_dir), overwrite=True).train(until=2)
        resumed = _trainer(_cfg(work_dir / "run", steps=3, **over), Path(world_dir),
                           resume=True)
        more = resumed.train()
        straight = _trainer(_cfg(work_dir / "straight", steps=3, **over), Path(world_dir),
                            overwrite=True)
        straight.train()
        with resumed.full_weights(), straight.full_weights():
            params, straight_params = _trainable(resumed), _trainable(straight)
        torch.save({"params": params, "straight": straight_params,
                    "summary": summary, "more": more}, work_dir / f"rank{rank}.pt")
    import torch.distributed as dist
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(job: str, world_dir: Path, work: Path, timeout: float = 240.0) -> list[dict]:
    """Two gloo processes on loopback; they are killed if they outlive `timeout`."""
    import torch.multiprocessing as mp

    ctx = mp.start_processes(_worker, args=(job, str(world_dir), str(work), _free_port()),
                             nprocs=2, join=False, start_method="spawn")
    deadline = time.time() + timeout
    while not ctx.join(timeout=2):
        if time.time() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"two-process {job} did not finish in {timeout:.0f} s")
    return [torch.load(work / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.fixture(scope="module")
def world_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dpworld")
    build_world_and_index(out, seed=4, difficulty="medium", entities=200, n_train=16,
                          n_dev=4, n_test=4)
    return out


def test_gradients_are_summed_and_none_stays_none(tmp_path):
    ranks = _spawn("grads", Path("unused"), tmp_path, timeout=120.0)
    for got in ranks:
        assert got["grads"] == [[3.0, 3.0, 3.0], [1.0, 2.0, 3.0], None]
        assert got["gathered"] == [0, 0, 1, 1]
        assert got["summed"] == {"r0": 1.0, "r1": 1.0, "all": 4.0}
        assert got["broadcast"] == "from 0"


# sharded: micro-batches of 3 out of mini-batches of 8 give the ranks 2 and 1 (a pass of
# weight 0 evens them); the critic's head joins the shards; the reference is a sharded copy
_SHARDED = {"shard": "fsdp",
            "algo": {"mini_batch_size": 8, "micro_batch_size": 3, "epochs": 2, "kl_coef": 0.1,
                     "entropy_coef": 0.01, "advantage": "gae", "value_lr": 1e-3,
                     "credit_invalid_turns": True}}
# and a Qwen2 with its own LM head, under activation checkpointing (one pass, recomputed
# in the backward pass, gathering the blocks again)
_UNTIED = {**_SHARDED, "_arch": "qwen2", "gradient_checkpointing": True}


@pytest.mark.parametrize("over", [{}, _SHARDED, _UNTIED],
                         ids=["replicated", "fsdp", "fsdp-untied-head-checkpointed"])
def test_two_processes_take_the_update_of_one_on_the_same_batch(world_dir, tmp_path, over):
    settings = {k: v for k, v in over.items() if k != "_arch"}
    one = _trainer(_cfg(tmp_path / "one", **{**settings, "shard": "none"}), world_dir,
                   dist=Dist(), overwrite=True, arch=over.get("_arch", "llama"))
    trajs = one.rollout(one.sample_questions(1, 2), seed=11)
    one.score(trajs)
    assert len(trajs) == 8 and len({t.outcome_reward for t in trajs}) > 1
    write_trajectories(tmp_path / "batch.jsonl", trajs)
    (tmp_path / "cfg.json").write_text(json.dumps(over))
    before = _trainable(one)
    record = one.learn(read_trajectories(tmp_path / "batch.jsonl"))
    after = _trainable(one)

    ranks = _spawn("update", world_dir, tmp_path)
    assert [got["sharded"] for got in ranks] == [bool(over)] * 2
    if over:   # each rank keeps half of the training state (weights, moments, reference)
        assert ranks[0]["state"] == pytest.approx(one.state_bytes() / 2, rel=0.02)
    moved = max(float((after[n] - before[n]).abs().max()) for n in after)
    assert moved > 1e-4   # the update did something
    for got in ranks:
        assert got["params"].keys() == after.keys()
        worst = max(float((got["params"][n] - after[n]).abs().max()) for n in after)
        # AdamW's first step moves a weight by about lr x sign(gradient): a near-zero
        # gradient summed in another order can move it by a few % of lr (1.6e-5 and 3.5e-5
        # seen at lr 1e-3 on an AVX-512 CPU, 5.2e-5 on an AVX2 one, whose kernels sum in
        # another order), where a lost or doubled micro-batch flips signs: about 2 x lr
        assert worst < max(1e-5 * max(1.0, moved * 100), 0.1 * 1e-3), worst
    # the two ranks hold the very same weights: they took the same optimizer steps
    for n in after:
        assert torch.equal(ranks[0]["params"][n], ranks[1]["params"][n])
    for key in ("pg_loss", "clip_frac", "entropy", "kl", "grad_norm"):
        assert ranks[0]["record"][key] == pytest.approx(record[key], rel=1e-4, abs=1e-6), key


@pytest.mark.parametrize("shard", ["none", "fsdp"])
def test_a_two_process_run_writes_once_and_resumes(world_dir, tmp_path, shard):
    over = {"shard": shard}
    if shard == "fsdp":   # and evaluations: rank 0 alone runs them on the gathered weights
        over["eval"] = {"data": str(world_dir / "dev.jsonl"), "n": 2, "every": 1,
                        "max_turns": 2, "max_new_tokens": 6}
    (tmp_path / "cfg.json").write_text(json.dumps(over))
    ranks = _spawn("run", world_dir, tmp_path, timeout=400.0)
    run = tmp_path / "run"
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if "episodes" in r] == [1, 2, 3]   # once per step
    assert all(r["episodes"] == 8 for r in steps if "episodes" in r)  # both shares gathered
    assert all(r["peak_rss_mb"] > 100 for r in steps if "episodes" in r)   # the larger rank's
    assert (run / "final" / "config.json").is_file()
    last = sorted(p for p in (run / "checkpoints").glob("step-*"))[-1]
    assert last.name == "step-3"
    # sharded: a shard file per rank and no whole copy of the weights
    shards = sorted(p.name for p in (last / "shards").glob("*.distcp"))
    assert shards == ([] if shard == "none" else ["__0_0.distcp", "__1_0.distcp"])
    assert (last / "policy.pt").is_file() == (shard == "none")
    if shard == "fsdp":
        assert [r["step"] for r in steps if "dev_em" in r] == [0, 1, 2, 3]
        with pytest.raises(ValueError, match="sharded checkpoint; resume it with shard: fsdp"):
            _trainer(_cfg(run, steps=4), world_dir, dist=Dist(), resume=True)
        # the final policy gathered from the shards is the trained one, as a plain model
        from transformers import AutoModelForCausalLM
        final = dict(AutoModelForCausalLM.from_pretrained(run / "final").named_parameters())
        for name, value in ranks[0]["params"].items():
            assert torch.equal(final[name], value), name
    assert ranks[0]["summary"] == ranks[1]["summary"] == {"steps": 2, "interrupted": True}
    assert ranks[0]["more"]["steps"] == ranks[1]["more"]["steps"] == 3
    assert ranks[0]["more"]["final"] == ranks[1]["more"]["final"]
    # the ranks hold the same weights, and resuming changed nothing: 2 + 1 steps = 3 steps
    for name, value in ranks[0]["params"].items():
        assert torch.equal(value, ranks[1]["params"][name]), name
        assert torch.allclose(value, ranks[0]["straight"][name], atol=1e-6), name


@pytest.mark.parametrize("shard", ["none", "fsdp"])
def test_seekrl_train_under_torchrun(world_dir, tmp_path, shard):
    """The launch the README gives: `torchrun --standalone --nproc_per_node 2 -m seekrl.cli
    train ...`, on CPU (gloo), one line of output per step from rank 0 only; both ranks
    exit cleanly (0), the sharded run too."""
    import subprocess
    import sys

    from seekrl.models import tiny_policy

    model, tok = tiny_policy(seed=3)
    model.save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--standalone", "--nproc_per_node", "2", "-m", "seekrl.cli", "train",
           f"model={tmp_path / 'tiny'}", f"data={world_dir / 'train.jsonl'}",
           f"index={world_dir / 'index'}", f"out={tmp_path / 'run'}", "steps=2",
           "questions_per_step=2", "group_size=2", "rollout.max_turns=2",
           "rollout.max_new_tokens=6", "rollout.max_info_tokens=48", "eval.data=",
           "algo.mini_batch_size=4", "algo.micro_batch_size=1", "device=cpu", f"shard={shard}"]
    if shard == "fsdp":   # LoRA adapters sharded with their frozen base; saved merged
        # (the tiny model earns no reward: the entropy bonus is what moves the adapters)
        cmd += ["lora.enabled=true", "lora.r=4", "algo.kl_coef=0.05", "optim.lr=1e-3",
                "algo.entropy_coef=0.01"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("step 1/2") == 1 and r.stdout.count("final model ->") == 1, r.stdout
    steps = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps if "episodes" in s] == [1, 2]
    assert (tmp_path / "run" / "final" / "config.json").is_file()
    if shard == "fsdp":   # a plain model, the adapters merged, that moved from the start
        from transformers import AutoModelForCausalLM
        final = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final")
        assert not any("lora" in n for n, _ in final.named_parameters())
        start = dict(model.named_parameters())
        assert any(not torch.equal(p, start[n]) for n, p in final.named_parameters())


@pytest.mark.parametrize("over", [
    # one question for two ranks: rank 1 plays nothing, and so runs no block forward while
    # rank 0 plays; the first backward must not prefetch what one rank ran and not the other
    {"questions_per_step": 1, "group_size": 4, "steps": 2, "save_every": 0,
     "algo": {"mini_batch_size": 4, "micro_batch_size": 1, "epochs": 1, "kl_coef": 0.0}},
    # bfloat16 weights beside the float32 critic's head (a shard group of its own)
    {"_bf16": True, "dtype": "bfloat16", "steps": 1, "save_every": 0,
     "algo": {"advantage": "gae", "mini_batch_size": 4, "micro_batch_size": 2,
              "kl_coef": 0.0}},
], ids=["rank-without-questions", "bf16-with-critic"])
def test_sharded_steps_that_once_hung_or_failed(world_dir, tmp_path, over):
    (tmp_path / "cfg.json").write_text(json.dumps({"shard": "fsdp", **over}))
    ranks = _spawn("steps", world_dir, tmp_path, timeout=180.0)
    for rank, got in enumerate(ranks):
        assert len(got["records"]) == over["steps"] + 1
        assert got["played"] == (1 + rank) * over.get("group_size", 4)
        assert all(math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0 for r in got["records"])
    assert ranks[0]["records"][-1]["grad_norm"] == ranks[1]["records"][-1]["grad_norm"]


def test_a_sharded_checkpoint_before_any_optimizer_step_resumes_without_one(world_dir,
                                                                           tmp_path):
    """Every group tied, dynamic sampling keeps none: no update, yet a checkpoint. Reading
    the optimizer's state for it would give the optimizer a step at lr 0 (which counts in
    AdamW's bias correction); it is saved without one, and resumes without one."""
    ranks = _spawn("unstepped", world_dir, tmp_path, timeout=180.0)
    optim = torch.load(tmp_path / "run" / "checkpoints" / "step-1" / "optim.pt",
                       weights_only=False)
    assert optim["sharded_optimizer"] is False
    assert [got["state"] for got in ranks] == [0, 0]
    assert [got["step"] for got in ranks] == [1, 1]
    # the warm-up's lr where the stopped run left it (the optimizer's own groups, never
    # saved here, had kept its first step's lr)
    assert all(got["lr"] == got["lr_stopped"] > 0 for got in ranks)
