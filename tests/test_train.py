"""The RL recipe on the tiny model: one step with every estimator, exact resume, atomic
checkpoints, dynamic sampling, and configs that name their bad keys."""

from __future__ import annotations

import copy
import json
import math
import re
import shutil

import pytest
import torch
from conftest import build_world_and_index
from hypothesis import given
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM

from seekrl.config import ConfigError, TrainConfig, build_config, load_config
from seekrl.data.qa import read_qa_jsonl
from seekrl.models import tiny_policy
from seekrl.recipes.environment import SearchEnvironment
from seekrl.recipes.train import Trainer
from seekrl.retrieval.index import load_index
from seekrl.rewards.outcome import RewardParts, episode_reward
from seekrl.rl.advantages import ESTIMATORS

TIMING = {"time_rollout", "time_scoring", "time_old_logprobs", "time_update", "time_step",
          "tokens_per_s", "train_tokens_per_s", "peak_rss_mb"}   # and memory (CPU)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    out = tmp_path_factory.mktemp("trainworld")
    _, paths, index_dir = build_world_and_index(out, seed=4, difficulty="medium", entities=200,
                                                n_train=16, n_dev=4, n_test=4)
    return {"paths": paths, "index": load_index(index_dir), "index_dir": index_dir,
            "train": read_qa_jsonl(paths["train"])}


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return tiny_policy(seed=3)


def parity_reward(t) -> RewardParts:
    """The tiny model never answers right; a reward that varies within every group keeps
    the advantages (and so the update) non-zero."""
    r = float(t.sample_index % 2) + 0.1 * (t.n_generated % 3)
    return RewardParts(total=r, outcome=r, format=0.0, penalty=0.0)


def make_cfg(tmp_path, **over) -> TrainConfig:
    base = {"data": "unused", "index": "unused", "out": str(tmp_path / "run"), "steps": 1,
            "questions_per_step": 2, "group_size": 2, "save_every": 1,
            "rollout": {"max_turns": 2, "max_new_tokens": 6, "max_info_tokens": 48, "topk": 2,
                        "batch_size": 8},
            "algo": {"mini_batch_size": 2, "micro_batch_size": 1, "epochs": 2, "kl_coef": 0.1,
                     "entropy_coef": 0.01},
            "optim": {"lr": 1e-3}}
    for key, value in over.items():
        node = base
        *parents, last = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return TrainConfig.model_validate(base)


def make_trainer(cfg, world, tiny, **kw):
    model, tok = tiny
    kw.setdefault("overwrite", not kw.get("resume"))   # tests reuse their folders
    return Trainer(cfg, model=copy.deepcopy(model), tokenizer=tok, retriever=world["index"],
                   questions=world["train"], reward_fn=kw.pop("reward_fn", parity_reward), **kw)


@pytest.mark.parametrize("estimator", sorted(ESTIMATORS))
def test_one_step_with_every_estimator(world, tiny, tmp_path, estimator):
    over = {"algo.advantage": estimator}
    if estimator == "tree_grpo":
        over.update({"rollout.tree": {"trees": 1, "branches": 1, "rounds": 1}})
    trainer = make_trainer(make_cfg(tmp_path, **over), world, tiny)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    record = trainer.step(1)
    assert record["episodes"] == 4
    for key in ("reward", "em", "valid_format", "searches", "response_length", "entropy",
                "clip_frac", "grad_norm", "kl", "pg_loss", *TIMING):
        assert key in record, key
        assert record[key] == record[key], f"{key} is nan"
    if estimator == "gae":
        assert "value_loss" in record and "explained_var" in record
    changed = sum(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    assert changed > 0


def test_one_update_per_batch_skips_the_old_logprob_pass(world, tiny, tmp_path):
    cfg = make_cfg(tmp_path, **{"algo.epochs": 1, "algo.mini_batch_size": 64,
                                "algo.kl_coef": 0.0})
    record = make_trainer(cfg, world, tiny).step(1)
    assert record["time_old_logprobs"] == 0.0
    assert record["clip_frac"] == 0.0 and record["ratio_mean"] == pytest.approx(1.0)


def test_sharing_prompt_passes_leaves_the_update_unchanged(world, tiny, tmp_path, monkeypatch):
    """Micro-batches regrouped so a group shares one prompt pass: the same step, up to
    float rounding (old log-probs, reference KL, two epochs of two mini-batches)."""
    from seekrl.rl import forward

    shared_calls = []
    real = forward.suffix_hidden
    monkeypatch.setattr(forward, "suffix_hidden",
                        lambda *a, **k: shared_calls.append(1) or real(*a, **k))
    params = []
    for share in (False, True):
        cfg = make_cfg(tmp_path / str(share), **{"algo.share_prompts": share,
                                                  "algo.micro_batch_size": 2,
                                                  "questions_per_step": 2, "group_size": 3,
                                                  "algo.mini_batch_size": 3})
        trainer = make_trainer(cfg, world, tiny)
        record = trainer.step(1)
        params.append(({n: p.detach().clone() for n, p in trainer.model.named_parameters()},
                       record))
    assert shared_calls  # the second run did share (the first never calls it)
    (a, ra), (b, rb) = params
    for n in a:
        torch.testing.assert_close(a[n], b[n], atol=1e-5, rtol=1e-4, msg=n)
    for key in ("pg_loss", "kl", "entropy", "clip_frac"):
        assert ra[key] == pytest.approx(rb[key], abs=1e-4), key


def test_token_budget_micro_batches_leave_the_update_unchanged(world, tiny, tmp_path,
                                                               monkeypatch):
    """`algo.micro_batch_tokens` cuts micro-batches by padded tokens instead of a fixed
    count of episodes: smaller forwards, the same step up to float rounding."""
    from seekrl.rl import sampling, update

    cuts_seen = []
    real = sampling.split_micro_batches
    monkeypatch.setattr(update, "split_micro_batches",
                        lambda *a, **k: cuts_seen.append(r := real(*a, **k)) or r)
    params = []
    for budget in (None, 200):
        cfg = make_cfg(tmp_path / str(budget), **{"algo.micro_batch_size": 6,
                                                   "algo.micro_batch_tokens": budget,
                                                   "questions_per_step": 2, "group_size": 3,
                                                   "algo.mini_batch_size": 6})
        trainer = make_trainer(cfg, world, tiny)
        record = trainer.step(1)
        params.append(({n: p.detach().clone() for n, p in trainer.model.named_parameters()},
                       record))
    assert max(len(c) for c in cuts_seen[-1:]) > 1      # the budget did split the batch
    (a, ra), (b, rb) = params
    for n in a:
        torch.testing.assert_close(a[n], b[n], atol=1e-5, rtol=1e-4, msg=n)
    for key in ("pg_loss", "entropy", "clip_frac"):
        assert ra[key] == pytest.approx(rb[key], abs=1e-4), key


def _update_batch(model, lengths=(3, 11, 6, 20)):
    """Episodes of unlike lengths (a 4-token prompt each), alternating advantages, and a
    reference near a sharp policy's log-probs (its entropy varies by token; k3 unclamped):
    (the runtime, the UpdateBatch)."""
    from seekrl.agent.trajectory import Trajectory
    from seekrl.models import collate
    from seekrl.rl.distributed import Dist, Replicated
    from seekrl.rl.update import UpdateBatch

    gen = torch.Generator().manual_seed(0)
    trajs, advs = [], []
    for n, trained in enumerate(lengths):
        ids = torch.randint(5, 200, (4 + trained,), generator=gen).tolist()
        trajs.append(Trajectory(f"q{n}", "g", "q?", ["x"], ids, [0] * 4 + [1] * trained, 4))
        advs.append(torch.full((trained,), 1.0 if n % 2 else -1.0))
    runtime = Replicated(model, None, Dist(), temperature=0.1, share_prompts=False)
    with torch.no_grad():
        ids, attn, mask = collate([t.token_ids for t in trajs], [t.loss_mask for t in trajs],
                                  0, "cpu")
        logp = runtime.forward(ids, attn, mask)["logprobs"]
    refs = [logp[n, :t.n_generated] + torch.rand(t.n_generated, generator=gen)
            for n, t in enumerate(trajs)]
    return runtime, UpdateBatch(trajs, advs, old_logps=None, ref_logps=refs, old_values=None,
                                returns=None, norm_length=64)


def _run_update(model, runtime, batch, **algo):
    import random

    from seekrl.config.schema import AlgoConfig
    from seekrl.rl.distributed import Dist
    from seekrl.rl.update import PolicyUpdate

    update = PolicyUpdate(AlgoConfig(**algo), runtime, Dist(), "cpu", 0, None,
                          optimizer_step=lambda: 1.0, correct=lambda t: False)
    record = update.run(batch, random.Random(0))
    model.zero_grad(set_to_none=True)
    return record


def test_logged_figures_are_token_means_whatever_the_split_and_aggregation(tiny):
    """Entropy, clip fraction, approx_kl and the KL to the reference are means over policy
    tokens: the micro-batch split and `algo.loss_agg` (which weight the loss) leave them
    alone. They had been summed with each micro-batch's loss weight (its episodes' share
    under seq-*), and the KL aggregated as the loss (Dr. GRPO's divides by the length)."""
    model, _ = tiny
    runtime, batch = _update_batch(model)
    records = {(agg, micro): _run_update(model, runtime, batch, loss_agg=agg,
                                         micro_batch_size=micro, mini_batch_size=4,
                                         epochs=1, kl_coef=0.1)
               for agg, micro in (("seq-mean-token-mean", 4), ("seq-mean-token-mean", 1),
                                  ("seq-mean-token-sum-norm", 4), ("token-mean", 2))}
    base = records["seq-mean-token-mean", 4]
    assert 0.05 < base["kl"] < 9 and base["entropy"] > 0
    for key in ("entropy", "clip_frac", "approx_kl", "ratio_mean", "kl"):
        for run, record in records.items():
            assert record[key] == pytest.approx(base[key], rel=1e-5), (key, run)


def test_entropy_as_a_figure_stays_out_of_the_graph(tiny, monkeypatch):
    """Without an entropy bonus the update reads the entropy detached: the same values,
    and no [tokens, vocabulary] tensor kept for a backward pass that never uses it."""
    from seekrl.models import collate
    from seekrl.rl import forward
    from seekrl.rl.forward import masked_logprobs

    model, _ = tiny
    runtime, batch = _update_batch(model)
    ids, attn, mask = collate([t.token_ids for t in batch.trajs],
                              [t.loss_mask for t in batch.trajs], 0, "cpu")
    graph = masked_logprobs(model, ids, attn, mask, entropy=True)
    figure = masked_logprobs(model, ids, attn, mask, entropy="detached")
    assert graph["entropy"].requires_grad and not figure["entropy"].requires_grad
    assert figure["logprobs"].requires_grad
    torch.testing.assert_close(figure["entropy"], graph["entropy"].detach())
    asked = []
    monkeypatch.setattr(forward, "masked_logprobs",
                        lambda *a, real=masked_logprobs, **kw: asked.append(kw["entropy"])
                        or real(*a, **kw))
    records = {}
    for coef, want in ((0.0, "detached"), (0.01, True)):
        asked.clear()
        records[coef] = _run_update(model, runtime, batch, entropy_coef=coef, epochs=1,
                                    mini_batch_size=4)
        assert asked and set(asked) == {want}
    assert records[0.0]["entropy"] == pytest.approx(records[0.01]["entropy"], rel=1e-5)


def test_a_batch_that_does_not_divide_is_cut_into_near_equal_mini_batches(tiny, monkeypatch):
    """5 episodes at mini_batch_size 4: two optimizer steps of 3 and 2 episodes, not 4 and a
    full step from 1; a batch that divides keeps its mini-batches."""
    from seekrl.rl import sampling, update

    model, _ = tiny
    runtime, batch = _update_batch(model, lengths=(3, 11, 6, 20, 5))
    sizes = []
    real = sampling.split_micro_batches
    monkeypatch.setattr(update, "split_micro_batches",
                        lambda lengths, *a: sizes.append(len(lengths)) or real(lengths, *a))
    # an empty batch makes no step and says so (max() of no norms had raised)
    empty = update.UpdateBatch([], [], None, None, None, None, norm_length=64)
    record = _run_update(model, runtime, empty, mini_batch_size=4)
    assert record["updates"] == 0 and record["grad_norm"] is None
    for mini, epochs in ((4, 1), (5, 2), (2, 1), (1, 1)):
        sizes.clear()
        record = _run_update(model, runtime, batch, mini_batch_size=mini, epochs=epochs)
        assert record["updates"] == len(sizes) == epochs * -(-5 // mini)
        assert sum(sizes) == 5 * epochs and max(sizes) - min(sizes) <= 1, (mini, sizes)
        assert max(sizes) <= mini


@given(st.lists(st.integers(1, 300), max_size=40), st.integers(1, 8),
       st.one_of(st.none(), st.integers(1, 1200)))
def test_split_micro_batches_properties(lengths, max_episodes, max_tokens):
    from seekrl.rl.sampling import split_micro_batches

    cuts = split_micro_batches(lengths, max_episodes, max_tokens)
    assert [p for c in cuts for p in c] == list(range(len(lengths)))   # all, once, in order
    for c in cuts:
        assert 1 <= len(c) <= max_episodes
        if max_tokens is not None and len(c) > 1:
            assert len(c) * max(lengths[p] for p in c) <= max_tokens
    if max_tokens is None:      # episodes only: as full as allowed
        assert all(len(c) == max_episodes for c in cuts[:-1])


def test_resume_continues_identically(world, tiny, tmp_path):
    full = make_trainer(make_cfg(tmp_path / "a", steps=2), world, tiny)
    full.train()
    straight = [json.loads(x) for x in (tmp_path / "a" / "run" / "metrics.jsonl")
                .read_text().splitlines()]

    first = make_trainer(make_cfg(tmp_path / "b", steps=2), world, tiny)
    assert first.train(until=1)["interrupted"]
    resumed = make_trainer(make_cfg(tmp_path / "b", steps=2), world, tiny, resume=True)
    assert resumed.state.step_done == 1
    # the clock goes on from the checkpoint's (max_minutes did restart at each resume)
    meta = json.loads((tmp_path / "b" / "run" / "checkpoints" / "step-1" / "trainer.json")
                      .read_text())
    assert meta["train_seconds"] > 0 and resumed.state.seconds_before == meta["train_seconds"]
    resumed.train()
    again = [json.loads(x) for x in (tmp_path / "b" / "run" / "metrics.jsonl")
             .read_text().splitlines()]
    assert [r["step"] for r in again] == [1, 2]
    for a, b in zip(straight, again):
        a = {k: v for k, v in a.items() if k not in TIMING}
        b = {k: v for k, v in b.items() if k not in TIMING}
        assert a == b


def test_a_killed_checkpoint_write_leaves_latest_intact(world, tiny, tmp_path):
    trainer = make_trainer(make_cfg(tmp_path, steps=2), world, tiny)
    trainer.train(until=1)
    ckpts = tmp_path / "run" / "checkpoints"
    assert (ckpts / "latest").read_text() == "step-1"
    # a write that died half-way: a temporary folder, never renamed, latest untouched
    broken = ckpts / ".step-2.tmp999"
    broken.mkdir()
    (broken / "policy.pt").write_bytes(b"\x00garbage")
    # ... and the leftovers of kills while replacing a folder: an old copy whose new one
    # is in place (goes), one whose new one never arrived (the only copy: stays)
    (ckpts / "step-1.old998").mkdir()
    (ckpts / "step-7.old998").mkdir()
    (ckpts / ".latest.tmp997").write_text("step-9")
    resumed = make_trainer(make_cfg(tmp_path, steps=2), world, tiny, resume=True)
    assert resumed.state.step_done == 1
    resumed.train()
    assert (ckpts / "latest").read_text() == "step-2"
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step-1", "step-2",
                                                       "step-7.old998"]


def test_a_resumed_log_keeps_its_steps_and_drops_a_torn_tail(tmp_path):
    """A kill (or a full disk) can cut the log's last line: resume dropped nothing and
    crashed on it; now it keeps the steps up to the checkpoint, whole lines only."""
    from seekrl.recipes.setup import keep_log_until

    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 1, "em": 0.1}\n{"step": 2, "dev_em": 0.2}\n\n'
                   '{"step": 3, "em": 0.3}\n{"step": 4, "e')
    keep_log_until(log, 2)
    assert log.read_text() == '{"step": 1, "em": 0.1}\n{"step": 2, "dev_em": 0.2}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]
    keep_log_until(tmp_path / "alerts.jsonl", 2)       # none written yet: nothing to do
    assert not (tmp_path / "alerts.jsonl").exists()


def test_a_checkpoints_subfolders_are_flushed_before_it_is_named(tmp_path, monkeypatch):
    """`fsync_dir` flushed the top level alone: a checkpoint's `ranker/` (weights, the
    updater's state) could be missing after a power cut under a `latest` naming it."""
    import builtins
    from pathlib import Path

    from seekrl.recipes import checkpoint

    (tmp_path / "ranker").mkdir()
    for name in ("model.safetensors", "ranker/model.safetensors", "ranker/updater.pt"):
        (tmp_path / name).write_bytes(b"x")
    flushed = []

    def recording(path, *args, **kw):
        flushed.append(Path(path).relative_to(tmp_path).as_posix())
        return builtins.open(path, *args, **kw)

    monkeypatch.setattr(checkpoint, "open", recording, raising=False)
    checkpoint.fsync_dir(tmp_path)
    assert sorted(flushed) == ["model.safetensors", "ranker/model.safetensors",
                               "ranker/updater.pt"]


def test_resume_without_a_checkpoint_says_so(world, tiny, tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        make_trainer(make_cfg(tmp_path), world, tiny, resume=True)


def one_flat_group_step(world, tiny, tmp_path, max_refills: int):
    """A dynamic-sampling trainer whose first question's group ties (reward 0 for all its
    episodes, the others by sample index), and its first step's record."""
    def first_group_flat(t):
        r = 0.0 if t.example_id == flat_id[0] else float(t.sample_index)
        return RewardParts(total=r, outcome=r, format=0.0, penalty=0.0)

    cfg = make_cfg(tmp_path, **{"algo.dynamic_sampling": True, "algo.max_refills": max_refills,
                                "algo.balance_types": False})
    trainer = make_trainer(cfg, world, tiny, reward_fn=first_group_flat)
    flat_id = [trainer.sample_questions(1, 2)[0].id]
    return trainer, trainer.step(1)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.5])
def test_a_reward_fn_given_from_python_is_checked_as_a_configured_one(world, tiny, tmp_path,
                                                                     bad):
    """`Trainer(reward_fn=...)` was used unchecked: one NaN made every advantage of its
    group NaN, prompt tokens included; a plain number failed somewhere inside."""
    def judge(t):
        return bad if bad == 0.5 else RewardParts(total=bad, outcome=bad, format=0.0,
                                                  penalty=0.0)

    trainer = make_trainer(make_cfg(tmp_path), world, tiny, reward_fn=judge)
    with pytest.raises((ValueError, TypeError), match=r"reward_fn judge returned "):
        trainer.step(1)


def test_a_nan_gradient_norm_of_a_later_mini_batch_is_the_steps_figure(world, tiny, tmp_path,
                                                                      monkeypatch):
    """Four updates a step, the last one's norm NaN (its optimizer step skipped): the step
    recorded the largest finite norm (max() drops a NaN that is not first), so the monitor
    never saw the collapse it is built to stop on."""
    def step_with_nan():
        norms.append(0.5 if len(norms) < 3 else float("nan"))
        return norms[-1]

    cfg = make_cfg(tmp_path, **{"algo.mini_batch_size": 2})
    trainer = make_trainer(cfg, world, tiny)
    norms: list[float] = []
    monkeypatch.setattr(trainer.updater, "optimizer_step", step_with_nan)
    record = trainer.step(1)
    assert record["updates"] == 4 and math.isnan(record["grad_norm"])
    assert any(a.kind == "grad_norm_explosion" and a.severity == "collapse"
               for a in trainer.monitor.update(1, record))


def test_dynamic_sampling_drops_groups_without_signal(world, tiny, tmp_path):
    _, record = one_flat_group_step(world, tiny, tmp_path, max_refills=0)
    assert record["episodes_sampled"] == 4 and record["episodes"] == 2
    assert record["groups_with_signal"] == 0.5   # of the groups sampled, not of those kept


def test_the_rollout_viewer_says_dynamic_sampling_kept_some(world, tiny, tmp_path):
    """The saved rollouts under dynamic sampling are the kept groups: the page said nothing,
    and its EM read as the policy's."""
    def first_group_flat(t):
        r = 0.0 if t.example_id == flat_id[0] else float(t.sample_index)
        return RewardParts(total=r, outcome=r, format=0.0, penalty=0.0)

    cfg = make_cfg(tmp_path, **{"algo.dynamic_sampling": True, "algo.max_refills": 0,
                                "algo.balance_types": False, "log.save_rollouts": 1})
    trainer = make_trainer(cfg, world, tiny, reward_fn=first_group_flat)
    flat_id = [trainer.sample_questions(1, 2)[0].id]
    trainer.step(1)
    page = (tmp_path / "run" / "rollouts" / "step-1" / "viewer.html").read_text()
    assert "2 of the 4 episodes played (dynamic sampling keeps the groups whose rewards " \
        "vary)" in page


def test_a_steps_episode_figures_are_over_every_episode_it_played(world, tiny, tmp_path):
    """Dynamic sampling keeps the varied groups for the update; the step's reward, format
    and searches describe the policy, over every episode played. A step that kept none read
    as reward 0 and valid format 0 (the monitor warned of a format collapse); one that
    dropped a solved group read as a falling reward."""
    def solved_first(t):   # the first question's group all right, the other's varied
        r = 1.0 if t.example_id == first[0] else float(t.sample_index)
        return RewardParts(total=r, outcome=r, format=0.0, penalty=0.0)

    cfg = make_cfg(tmp_path, **{"algo.dynamic_sampling": True, "algo.max_refills": 0,
                                "algo.balance_types": False})
    trainer = make_trainer(cfg, world, tiny, reward_fn=solved_first)
    first = [trainer.sample_questions(1, 2)[0].id]
    record = trainer.step(1)
    assert record["episodes"] == 2 and record["episodes_sampled"] == 4
    assert record["reward"] == pytest.approx(0.75)     # (1 + 1 + 0 + 1) / 4, not 0.5
    # every draw's tokens (time_rollout is rounded to 10 ms: the kept half read as half)
    assert record["tokens_per_s"] * record["time_rollout"] == \
        pytest.approx(record["rollout_tokens"], rel=0.25)
    flat = make_trainer(make_cfg(tmp_path / "flat", **{"algo.dynamic_sampling": True,
                                                       "algo.max_refills": 0}), world, tiny,
                        reward_fn=lambda t: RewardParts(total=0.0, outcome=0.0, format=0.0,
                                                        penalty=0.0))
    skipped = flat.step(1)
    assert skipped["episodes"] == 0 and skipped["skipped_update"]
    assert skipped["turns"] > 0 and skipped["response_length"] > 0   # what was played


def test_dynamic_sampling_with_groups_of_one_is_refused():
    from seekrl.recipes.train import check_config

    with pytest.raises(ConfigError, match="dynamic_sampling with group_size: 1"):
        check_config(build_config(TrainConfig, {"data": "d", "index": "i", "group_size": 1,
                                                "algo": {"advantage": "reinforce_pp",
                                                         "dynamic_sampling": True}}))


def test_dynamic_sampling_refills_until_the_batch_is_full_not_every_group_varied(
        world, tiny, tmp_path):
    """The refill loop compared the kept episodes with all sampled so far (a target that
    grows with each refill), so it ran `max_refills` times whenever any group was flat,
    paying each draw's tokens: one refill that fills the batch is enough."""
    trainer, record = one_flat_group_step(world, tiny, tmp_path, max_refills=3)
    assert record["refills"] == 1 and record["episodes_sampled"] == 8
    assert record["episodes"] == 4
    assert trainer.state.questions_drawn == 4 and trainer.state.questions_planned == 2


def test_group_signal_counts_varied_groups_of_two_or_more():
    from types import SimpleNamespace

    from seekrl.agent.trajectory import Step
    from seekrl.rl.sampling import group_signal

    trajs = [SimpleNamespace(group_id=g, steps=[Step(0, 1, "answer")]) for g in "aabbbcdd"]
    parts = [RewardParts(total=r, outcome=r, format=0.0, penalty=0.0)
             for r in (1.0, 0.0, 0.5, 0.5, 0.5, 1.0, 1.0, 1.0)]
    # a varies, b ties, c is alone, d ties with every answer right (solved)
    assert group_signal(trajs, parts) == (1, 3, 1)
    assert group_signal(trajs[5:6], parts[5:6]) == (0, 0, 0)   # logged as None, not 0
    trajs[2].steps[0].process_reward = 0.5          # b's scores tie, its step rewards do not
    trajs[3].steps[0].process_reward = 0.0
    assert group_signal(trajs, parts) == (2, 3, 1)


def test_questions_are_balanced_over_types_and_reproducible(world, tiny, tmp_path):
    trainer = make_trainer(make_cfg(tmp_path, questions_per_step=6), world, tiny)
    picked = trainer.sample_questions(3, 6)
    assert [q.id for q in picked] == [q.id for q in trainer.sample_questions(3, 6)]
    types = [q.metadata["type"] for q in picked]
    present = {q.metadata["type"] for q in world["train"]}
    assert set(types) == present  # every type gets a turn before any gets a second


def test_episode_reward_parts():
    from seekrl.agent.trajectory import Step, Trajectory
    t = Trajectory("q", "q", "?", ["Paris"], [1, 2, 3], [0, 1, 1], 1,
                   steps=[Step(1, 2, "invalid"), Step(2, 3, "answer", answer="paris")],
                   answer="paris", finish_reason="answer")
    p = episode_reward(t, format_reward=0.2, invalid_penalty=0.1)
    assert (p.outcome, p.format, p.penalty) == (1.0, 0.0, pytest.approx(0.1))
    assert p.total == pytest.approx(0.9)
    t.steps[0].action = "search"
    # the format reward needs every turn to follow the protocol exactly, text included
    assert episode_reward(t, outcome="f1", format_reward=0.2).total == pytest.approx(1.0)
    t.steps[0].text = "<think> a </think>\n<search> q </search>"
    t.steps[1].text = "<answer> paris </answer>"
    assert episode_reward(t, outcome="f1", format_reward=0.2).total == pytest.approx(1.2)
    t.answer, t.finish_reason = None, "max_turns"
    assert episode_reward(t, max_turns_penalty=0.5).total == -0.5


def test_the_default_reward_ranks_a_broken_protocol_below_a_clean_one(tmp_path):
    """Bias 1 of the learning review: an episode whose turn broke the protocol (no tag, EOS),
    was corrected and then answered right scored 1.0 like a clean one."""
    from seekrl.agent.trajectory import Step, Trajectory
    clean = Trajectory("q", "q", "?", ["Paris"], [1, 2, 3], [0, 1, 1], 1,
                       steps=[Step(1, 2, "search", text="<think> a </think>\n<search> q </search>"),
                              Step(2, 3, "answer", text="<answer> paris </answer>",
                                   answer="paris")],
                       answer="paris", finish_reason="answer")
    broken = copy.deepcopy(clean)
    broken.steps[0] = Step(1, 2, "invalid", text="<think> a </think>", reason="no tag")
    wrong = copy.deepcopy(clean)
    wrong.answer = "rome"
    r = make_cfg(tmp_path).reward
    score = {name: episode_reward(t, outcome=r.outcome, format_reward=r.format_reward,
                                  invalid_penalty=r.invalid_penalty).total
             for name, t in (("clean", clean), ("broken", broken), ("wrong", wrong))}
    assert score["clean"] > score["broken"] > score["wrong"]
    # and the RL optimiser warms up by default, a YAML that sets only the lr included
    assert make_cfg(tmp_path).optim.warmup_steps == 3
    assert TrainConfig(data="x", index="y").optim.warmup_steps == 3


def test_invalid_turns_get_no_positive_advantage():
    from seekrl.agent.trajectory import Step, Trajectory
    from seekrl.rl.advantages import compute_advantages, no_positive_credit_for_invalid_turns
    right = Trajectory("q", "g", "?", ["a"], [0, 1, 1, 1, 1], [0, 1, 1, 1, 1], 1,
                       steps=[Step(1, 3, "invalid"), Step(3, 5, "answer")], outcome_reward=1.0,
                       finish_reason="answer")
    wrong = Trajectory("q", "g", "?", ["a"], [0, 1, 1, 1, 1], [0, 1, 1, 1, 1], 1,
                       steps=[Step(1, 3, "invalid"), Step(3, 5, "answer")], outcome_reward=0.0,
                       sample_index=1, finish_reason="answer")
    advs, _ = compute_advantages("dr_grpo", [right, wrong], [1.0, 0.0])
    capped, n = no_positive_credit_for_invalid_turns(advs, [right, wrong])
    assert advs[0].tolist() == [0, 0.5, 0.5, 0.5, 0.5]         # the estimator's own
    assert capped[0].tolist() == [0, 0.0, 0.0, 0.5, 0.5] and n == 2
    assert capped[1].tolist() == advs[1].tolist() == [0, -0.5, -0.5, -0.5, -0.5]


@pytest.mark.parametrize("override, key", [
    ("algo.cliplow=0.1", "algo.cliplow"),
    ("algo.clip_low=abc", "algo.clip_low"),
    ("algo.advantage=ppo2", "algo.advantage"),
    ("algo.loss_agg=mean", "algo.loss_agg"),
    ("steps=0", "steps"),
    ("rollout.temperature=-1", "rollout.temperature"),
    ("reward.outcome=bleu", "reward.outcome"),
    ("reward.process={evidnce: 1.0}", "reward.process.evidnce"),   # a typo, before a run
    ("optim=3", "optim"),
    ("reward.turn_cost=.inf", "reward.turn_cost"),        # no setting is unbounded by inf
    ("rollout.temperature=.nan", "rollout.temperature"),
    ("steps=true", "steps"),                              # a slip, not 1
    ("rollout.max_queries=true", "rollout.max_queries"),
    # one key of an optional section that is off would switch it all on
    ("ranker.lr=1e-4", "ranker.lr"),
    ("simulator.noise_end=0.7", "simulator.noise_end"),
    ("optim.betas=[1.5,0.999]", "optim.betas.0"),        # AdamW refused it after loading
    ("optim.betas=[0.9,-0.1]", "optim.betas.1"),
    ("reward.prm=runs/prm/final", "reward.prm"),          # nothing would read it
])
def test_bad_config_keys_and_values_name_the_key(override, key):
    """Types and ranges fail when the config is read; registry names (estimators, losses,
    rewards) when the recipe checks it, before anything loads."""
    from seekrl.recipes.train import check_config

    with pytest.raises(ConfigError) as err:
        check_config(build_config(TrainConfig, {"data": "d", "index": "i"}, [override]))
    assert f"{key}:" in str(err.value)


def test_vllm_in_training_is_refused_on_a_gpu_it_would_not_use(monkeypatch):
    """vLLM takes the first GPU it sees: `seekrl eval` refused device cuda:1 with it and
    `seekrl train` did not ask."""
    import torch

    from seekrl.recipes.train_checks import check_start

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    cfg = build_config(TrainConfig, {"data": "d", "index": "i", "device": "cuda:1",
                                     "rollout": {"backend": "vllm"}})
    with pytest.raises(ConfigError, match="rollout.backend vllm: .*first GPU"):
        check_start(cfg, scorer_given=False, resume=False, overwrite=False, processes=1,
                    main=True, model_given=False)


def test_sft_refuses_continuous_batching_it_would_not_use():
    from seekrl.config import SFTConfig

    with pytest.raises(ConfigError, match="rollout: continuous: batching by rows"):
        build_config(SFTConfig, {"data": "d"}, ["rollout.continuous=true"])


def test_a_section_given_in_part_keeps_the_recipes_own_defaults():
    """`optim.lr` alone, in a file or an override, changed RL's schedule from its constant
    to the section class's cosine (and labelling's temperature from 0.9 to 1.0): the keys
    left out now keep what the recipe sets; a key given still wins."""
    from seekrl.config import LabelConfig, SFTConfig

    for section in ({"optim": {"lr": 2e-6}}, {}):
        cfg = build_config(TrainConfig, {"data": "d", **section},
                           [] if section else ["optim.lr=2e-6"])
        assert (cfg.optim.lr, cfg.optim.schedule) == (2e-6, "constant")
    cosine = build_config(TrainConfig, {"data": "d", "optim": {"schedule": "cosine"}})
    assert (cosine.optim.lr, cosine.optim.schedule) == (1e-5, "cosine")
    assert build_config(SFTConfig, {"data": "d", "optim": {"lr": 1e-4}}).optim.warmup_steps == 5
    labels = build_config(LabelConfig, {"data": "d", "model": "m", "index": "i",
                                        "rollout": {"max_turns": 3}})
    assert (labels.rollout.max_turns, labels.rollout.temperature) == (3, 0.9)


def test_a_section_given_whole_on_the_command_line_keeps_the_files_other_keys():
    """`algo={advantage: rloo}` over a file setting `algo.micro_batch_size: 2` put it back to
    the default 8 unsaid (update memory x4); a mapping-valued key (`reward.process`) is
    still replaced, and a later whole section after one of its keys is refused."""
    data = {"data": "d", "algo": {"micro_batch_size": 2, "kl_coef": 0.0},
            "reward": {"process": {"evidence": 1.0}}}
    cfg = build_config(TrainConfig, data, ["algo={advantage: rloo}",
                                           "reward.process={recall: 0.5}"])
    assert (cfg.algo.advantage, cfg.algo.micro_batch_size) == ("rloo", 2)
    assert cfg.reward.process == {"recall": 0.5}
    with pytest.raises(ConfigError, match="ranker comes after ranker.lr"):
        build_config(TrainConfig, {"data": "d"},
                     ["ranker={model: a}", "ranker.lr=1", "ranker={model: b}"])


@pytest.mark.parametrize("override", ["rollout.vllm_sleep=true", "optim.betas=[true, 0.9]",
                                      "reward.process={evidence: yes}"])
def test_true_is_no_number_anywhere_in_a_setting(override):
    """A number under a Literal, in a tuple or as a mapping's value took true as 1."""
    with pytest.raises(ConfigError, match="expected a number, got True"):
        build_config(TrainConfig, {"data": "d"}, [override])
    from seekrl.config import SFTConfig

    with pytest.raises(ConfigError, match="max_new_tokens: expected a number"):
        build_config(SFTConfig, {"data": "d"}, ["max_new_tokens=true"])


@pytest.mark.parametrize("override, said", [
    ("out=runs/exp #2", "starts a YAML comment"),       # became runs/exp
    ("seed=010", "octal number"),                        # became 8
    ("steps=1:30", "base-60 number"),                    # became 90
    ("optim.lr=1:30.5", "base-60 number"),               # became 90.5
    # inside [...] or {...}, as a file's value is read
    ("optim={lr: 1e-4, lr: 2e-4}", "the key 'lr' is given twice"),   # became 2e-4
    ("reward.process={evidence: 010}", "octal"),         # became 8
    ("rollout.tools=[1:30]", "base 60"),                 # became [90]
])
def test_an_override_yaml_would_read_otherwise_than_written_is_refused(override, said):
    with pytest.raises(ConfigError, match=said):
        build_config(TrainConfig, {"data": "d"}, [override])
    assert build_config(TrainConfig, {"data": "d"}, ["out='runs/exp #2'", "seed=10"]).out \
        == "runs/exp #2"


def test_python_s_none_unquoted_is_null_in_an_override_and_a_file(tmp_path):
    """`reward.prm=None` had been the string "None" (a path, read later); quoted it stays
    a string, and plain YAML elsewhere is not changed."""
    import yaml

    from seekrl.config.loading import parse_override, read_config_file

    assert parse_override("reward.prm=None") == ("reward.prm", None)
    assert parse_override("out='None'") == ("out", "None")
    assert parse_override("out=Nonesuch") == ("out", "Nonesuch")
    assert build_config(TrainConfig, {"data": "d", "reward": {"prm": "x"}},
                        ["reward.prm=None"]).reward.prm is None
    f = tmp_path / "c.yaml"
    f.write_text("data: d\nreward: {prm: None}\nout: \"None\"\n")
    assert read_config_file(f) == {"data": "d", "reward": {"prm": None}, "out": "None"}
    assert yaml.safe_load("a: None") == {"a": "None"}
    # a saved config reads back as it was: the string "None" is written quoted
    from seekrl.config.loading import dump_config
    from seekrl.config.printing import annotated_yaml

    cfg = build_config(TrainConfig, {"data": "d", "out": "None", "index": None})
    dump_config(cfg, tmp_path / "saved.yaml")
    again = read_config_file(tmp_path / "saved.yaml")
    assert (again["out"], again["index"]) == ("None", None)
    assert build_config(TrainConfig, again) == cfg
    assert "out: 'None'" in annotated_yaml(cfg)


def test_a_key_given_twice_on_the_command_line_is_refused():
    with pytest.raises(ConfigError, match="steps is given twice"):
        build_config(TrainConfig, {"data": "d"}, ["steps=10", "steps=20"])
    with pytest.raises(ConfigError, match="optim.lr is given twice"):
        build_config(TrainConfig, {"data": "d"}, ["optim.lr=1e-4", "optim.lr=3e-4"])
    # inside a section given whole before it: the section's value was dropped unsaid
    with pytest.raises(ConfigError, match=r"optim.lr is given twice \(in optim too\)"):
        build_config(TrainConfig, {"data": "d"}, ["optim={lr: 2e-5}", "optim.lr=3e-5"])
    cfg = build_config(TrainConfig, {"data": "d"}, ["optim={lr: 2e-5}", "optim.warmup_steps=2"])
    assert (cfg.optim.lr, cfg.optim.warmup_steps) == (2e-5, 2)


@pytest.mark.parametrize("line, said", [
    ("seed: 0755", "'0755' would be read as the number 493 (YAML 1.1's octal)"),
    ("steps: 1:30", "'1:30' would be read as the number 90 (YAML 1.1's base 60)"),
    ("optim: {lr: 1:30.5}", "'1:30.5' would be read as a base-60 number"),
])
def test_a_file_value_yaml_would_read_otherwise_than_written_is_refused(tmp_path, line, said):
    from seekrl.config import load_config

    path = tmp_path / "c.yaml"
    path.write_text(f"data: d\n{line}\n")
    with pytest.raises(ConfigError, match=re.escape(f"{path}:2: ") + ".*" + re.escape(said)):
        load_config(TrainConfig, path)
    path.write_text("data: d\nseed: 755\nsteps: 130\noptim: {lr: 0.5}\n")
    assert (load_config(TrainConfig, path).seed, load_config(TrainConfig, path).steps) \
        == (755, 130)


def test_a_yaml_merge_key_reads_and_may_be_overridden(tmp_path):
    from seekrl.config import load_config
    from seekrl.config.loading import read_config_file

    path = tmp_path / "c.yaml"
    path.write_text("data: d\nx-base: &base {lr: 0.001, weight_decay: 0.1}\n"
                    "optim:\n  <<: *base\n  lr: 0.0003\n")
    tree = read_config_file(path)
    assert tree["optim"] == {"lr": 0.0003, "weight_decay": 0.1}
    with pytest.raises(ConfigError, match="x-base: unknown key"):   # read, then validated
        load_config(TrainConfig, path)


def test_an_unknown_key_of_an_optional_section_lists_the_known_ones():
    with pytest.raises(ConfigError, match="ranker.lrr: unknown key; expected one of "
                                          "batch_size, candidates, kind, lr"):
        build_config(TrainConfig, {"data": "d"}, ["ranker.model=x", "ranker.lrr=1"])


def test_an_optional_section_is_switched_on_by_its_model_or_by_itself():
    ranker = build_config(TrainConfig, {"data": "d"}, ["ranker.train=false", "ranker.model=null"])
    assert ranker.ranker.train is False and ranker.ranker.model is None
    assert build_config(TrainConfig, {"data": "d"}, ["ranker={}"]).ranker.train is True
    sim = build_config(TrainConfig, {"data": "d"}, ["simulator.noise_end=0.7",
                                                   "simulator.model=smollm2-135m"])
    assert sim.simulator.noise_end == 0.7
    # a section the config file switched on takes any of its keys
    on = build_config(TrainConfig, {"data": "d", "ranker": {"model": None}}, ["ranker.lr=1e-4"])
    assert on.ranker.lr == 1e-4
    with pytest.raises(ConfigError, match="give ranker.model=... too"):
        build_config(TrainConfig, {"data": "d", "ranker": None}, ["ranker.lr=1e-4"])
    data = {"data": "d", "rollout": {"topk": 2}}
    build_config(TrainConfig, data, ["rollout.topk=5"])
    assert data == {"data": "d", "rollout": {"topk": 2}}   # the caller's tree is left alone


def test_config_file_errors(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("data: d\nindex: i\nalgo:\n  epochs: [1\n")
    with pytest.raises(ConfigError, match=r"c.yaml:\d+: not valid YAML"):
        load_config(TrainConfig, path)
    # a key the schema refuses is named with its line in the file
    path.write_text("data: d\nsteps: 4\n\nstepz: 40\n")
    with pytest.raises(ConfigError, match=r"c.yaml:4: stepz: unknown key.*did you mean steps"):
        load_config(TrainConfig, path)
    path.write_text("data: d\nstepz: 40\noptim:\n  lr: -1\n")
    with pytest.raises(ConfigError, match=r"c.yaml: line 4: optim.lr: .*; line 2: stepz|"
                                          r"c.yaml: line 2: stepz.*; line 4: optim.lr"):
        load_config(TrainConfig, path)
    with pytest.raises(ConfigError, match=r": a folder; expected a YAML config file"):
        load_config(TrainConfig, tmp_path)
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(TrainConfig, path)
    path.write_text("false\n")   # not an empty file: no silent all-defaults
    with pytest.raises(ConfigError, match="mapping of keys at the top level, got bool"):
        load_config(TrainConfig, path)
    # a key given twice: YAML keeps the last silently (the first optim block's lr lost)
    path.write_text("data: d\noptim:\n  lr: 1.0e-4\nsteps: 3\noptim:\n  warmup_steps: 2\n")
    with pytest.raises(ConfigError, match=r"c.yaml:5: not valid YAML \(the key 'optim' is "
                                          r"given twice\)"):
        load_config(TrainConfig, path)
    path.write_text("algo: {epochs: 1, epochs: 2}\n")
    with pytest.raises(ConfigError, match="'epochs' is given twice"):
        load_config(TrainConfig, path)
    path.write_bytes(b"data: caf\xe9\n")
    with pytest.raises(ConfigError, match=r"c.yaml: not UTF-8 text"):
        load_config(TrainConfig, path)
    path.write_text("data: d\nindex: i\nsteps: 3\n")
    cfg = load_config(TrainConfig, path, ["optim.lr=1e-5", "algo.advantage=rloo"])
    assert (cfg.steps, cfg.optim.lr, cfg.algo.advantage) == (3, 1e-5, "rloo")
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(TrainConfig, tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="key.sub=value"):
        load_config(TrainConfig, path, ["steps"])
    # a bad value is blamed on where it came from: the command line, or the file
    with pytest.raises(ConfigError, match=r"^command line: algo.clip_low:"):
        load_config(TrainConfig, path, ["algo.clip_low=abc"])
    path.write_text("data: d\nindex: i\nsteps: 0\n")
    with pytest.raises(ConfigError, match=r"c.yaml:3: steps:"):
        load_config(TrainConfig, path, ["optim.lr=1e-5"])
    # both at once: each error by its own source (the command line's -1 had been laid on
    # the file's `optim:` line, and seed=x on the file without a line)
    path.write_text("data: d\nindex: i\nsteps: 0\noptim: {schedule: cosine}\n")
    with pytest.raises(ConfigError, match=r"c.yaml: line 3: steps: .*; command line: "
                                          r"optim.lr: .*\(got -1\)$"):
        load_config(TrainConfig, path, ["optim.lr=-1"])
    with pytest.raises(ConfigError, match=r"c.yaml: command line: seed: .*; line 3: steps:"):
        load_config(TrainConfig, path, ["seed=x"])
    # a section's own check, the file's key against the command line's: both named
    path.write_text("data: d\nindex: i\nrollout: {attention: eager}\n")
    with pytest.raises(ConfigError, match=r"c.yaml with the command line's rollout.backend: "
                                          r"rollout: "):
        load_config(TrainConfig, path, ["rollout.backend=vllm"])


def test_an_old_top_level_keys_error_names_it_as_written(tmp_path):
    """SFT's `topk` is read into rollout:; its error had named rollout.topk at the
    section's line (a key the user never wrote), and blamed the file for `topk=0` given on
    the command line. A check across keys names the file and the overrides together."""
    from seekrl.config import SFTConfig

    path = tmp_path / "sft.yaml"
    path.write_text("data: d\nrollout:\n  max_turns: 2\n# c\ntopk: 0\n")
    with pytest.raises(ConfigError, match=r"sft.yaml:5: topk: .*\(got 0\)"):
        load_config(SFTConfig, path)
    path.write_text("data: d\nrollout:\n  max_turns: 2\n")
    with pytest.raises(ConfigError, match=r"^command line: topk: "):
        load_config(SFTConfig, path, ["topk=0"])
    with pytest.raises(ConfigError, match=r"sft.yaml with the command line's type_weights: "
                                          r"\(top level\): type_weights weighs"):
        load_config(SFTConfig, path, ["type_weights={a: 1}"])


def test_train_evaluates_the_start_and_the_end_for_the_report(world, tiny, tmp_path):
    from seekrl.eval.training_report import report_for_run
    cfg = make_cfg(tmp_path, steps=2, save_every=0, eval={
        "data": str(world["paths"]["test"]), "n": 2, "every": 1, "max_turns": 1,
        "max_new_tokens": 4})
    summary = make_trainer(cfg, world, tiny).train()
    run = tmp_path / "run"
    assert sorted(p.name for p in (run / "eval").iterdir()) == ["final", "start", "step-1"]
    dev_steps = [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text()
                                        .splitlines()) if "dev_em" in r]
    assert dev_steps == [0, 1, 2]
    assert summary["dev"]["questions"] == 2
    # how many yes/no questions, what the policy said and the gold: the monitor's reading
    assert all(isinstance(r["dev_yes_no_questions"], int) and "dev_answered_yes" in r
               for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
               if "dev_em" in r)
    html = report_for_run(run).read_text()
    assert html.index("start") < html.index("step-1") < html.index("final")
    cfg = make_cfg(tmp_path / "b", steps=1, save_every=0, eval={
        "data": str(world["paths"]["test"]), "n": 2, "max_turns": 1, "max_new_tokens": 4,
        "at_start": False})
    make_trainer(cfg, world, tiny).train()
    assert [p.name for p in (tmp_path / "b" / "run" / "eval").iterdir()] == ["final"]
    # a run that stops (here: its token budget) right after a periodic evaluation does not
    # evaluate the same policy again as final
    cfg = make_cfg(tmp_path / "c", steps=5, save_every=0, max_rollout_tokens=1, eval={
        "data": str(world["paths"]["test"]), "n": 2, "every": 1, "max_turns": 1,
        "max_new_tokens": 4, "at_start": False})
    summary = make_trainer(cfg, world, tiny).train()
    run = tmp_path / "c" / "run"
    assert summary["steps"] == 1
    assert [p.name for p in (run / "eval").iterdir()] == ["step-1"]
    assert summary["dev_dir"] == str(run / "eval" / "step-1")
    dev_records = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
                   if "dev_em" in r]
    assert [r["step"] for r in dev_records] == [1]   # one evaluation of the final policy
    assert summary["dev"]["em"] == dev_records[0]["dev_em"] and summary["dev"]["questions"] == 2

    # the same, killed after its checkpoint (before the final save): resumed, the policy
    # that step's evaluation saw is not evaluated again, and a final evaluation a kill
    # left in the log (after the checkpoint) is dropped, then comes back once
    def dev_lines(run):
        return [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text()
                                       .splitlines()) if "dev_em" in r]

    for name, every in (("d", 1), ("e", 0)):
        cfg = make_cfg(tmp_path / name, steps=5, save_every=1, max_rollout_tokens=1, eval={
            "data": str(world["paths"]["test"]), "n": 2, "every": every, "max_turns": 1,
            "max_new_tokens": 4, "at_start": False})
        killed = make_trainer(cfg, world, tiny)

        def kill(*args):
            raise RuntimeError("killed before the final save")

        killed._finish = kill     # the budget stops it at step 1, after its checkpoint
        with pytest.raises(RuntimeError, match="killed"):
            killed.train()
        run = tmp_path / name / "run"
        if every == 0:
            with open(run / "metrics.jsonl", "a") as f:    # a final evaluation, then the kill
                f.write(json.dumps({"step": 1, "dev_em": 0.5}) + "\n")
            with open(run / "alerts.jsonl", "a") as f:     # with its alert, beside a step's
                for kind in ("constant_answer", "no_signal"):
                    f.write(json.dumps({"step": 1, "kind": kind, "severity": "warn",
                                        "message": f"planted {kind}"}) + "\n")
        summary = make_trainer(cfg, world, tiny, resume=True).train()
        assert dev_lines(run) == [1]
        if every == 0:   # the evaluation's alert goes (it would come back), the step's stays
            planted = [r["kind"] for r in map(json.loads, (run / "alerts.jsonl").read_text()
                                              .splitlines()) if "planted" in r["message"]]
            assert planted == ["no_signal"]
        assert (run / "eval" / "final").is_dir() == (every == 0)
        assert summary["dev_dir"] == str(run / "eval" / ("final" if every == 0 else "step-1"))


def test_greedy_evaluations_feed_the_monitor(world, tiny, tmp_path, monkeypatch):
    """Each evaluation's searches go to the monitor: a greedy fall to one search (which a
    sampled training signal may not show) is an alert in alerts.jsonl and on the console."""
    searches = iter([1.9, 1.7, 1.0])   # start, step 1, final

    def fake_eval(self, out_dir):
        return {"em": 0.1, "f1": 0.1, "valid_format": 1.0, "searches": next(searches),
                "questions": 2}

    monkeypatch.setattr(Trainer, "evaluate", fake_eval)
    lines = []
    console = type("C", (), {"print": lambda self, *a, **k: lines.append(" ".join(map(str, a)))})()
    cfg = make_cfg(tmp_path, steps=2, save_every=0,
                   eval={"data": str(world["paths"]["test"]), "every": 1})
    make_trainer(cfg, world, tiny, console=console).train()
    run = tmp_path / "run"
    alerts = [json.loads(x) for x in (run / "alerts.jsonl").read_text().splitlines()]
    assert [(a["step"], a["kind"]) for a in alerts if a["kind"].startswith("greedy")] == [
        (2, "greedy_search_collapse")]
    assert any("searches per question fell to 1.00 (1.90" in x for x in lines)
    dev = [r["dev_searches"] for r in map(json.loads, (run / "metrics.jsonl").read_text()
                                          .splitlines()) if "dev_searches" in r]
    assert dev == [1.9, 1.7, 1.0]


def test_keep_best_saves_the_policy_of_the_best_evaluation(world, tiny, tmp_path, monkeypatch):
    """eval.keep_best: RUN/best holds the policy whose evaluation scored highest (a tie keeps
    the earlier one; the start and the final evaluation are candidates too), with a copy of
    that evaluation; the summary names it. A resumed run keeps a best saved after its
    checkpoint (the redone step ties it), and one whose best folder is gone says so and
    saves the next."""
    ems = {"start": 0.2, "step-1": 0.5, "step-2": 0.5, "step-3": 0.1, "final": 0.4}

    def fake_eval(self, out_dir):
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "metrics.json").write_text(json.dumps({"em": ems[out_dir.name]}))
        return {"em": ems[out_dir.name], "f1": 0.1, "valid_format": 1.0, "searches": 1.5,
                "questions": 2}

    monkeypatch.setattr(Trainer, "evaluate", fake_eval)
    dev = {"data": str(world["paths"]["test"]), "every": 1, "keep_best": True}
    run = tmp_path / "a" / "run"
    summary = make_trainer(make_cfg(tmp_path / "a", steps=4, eval=dev), world, tiny).train()
    assert summary["best"] == {"step": 1, "em": 0.5, "evaluation": "step-1",
                               "eval_dir": str(run / "best" / "eval"), "dir": str(run / "best")}
    assert json.loads((run / "best" / "eval" / "metrics.json").read_text()) == {"em": 0.5}
    assert json.loads((tmp_path / "a" / "run" / "summary.json").read_text())["best"]["step"] == 1
    # the step-1 policy: the same as the final one of a run that stopped after one step
    one = make_trainer(make_cfg(tmp_path / "one", steps=1), world, tiny)
    one.train()
    saved = AutoModelForCausalLM.from_pretrained(run / "best")
    for (name, a), (_, b) in zip(saved.named_parameters(), one.model.named_parameters()):
        assert torch.equal(a, b.detach()), name
    # the final evaluation beats them all: the summary names it, not the step before
    ems["final"] = 0.9
    summary = make_trainer(make_cfg(tmp_path / "f", steps=2, eval=dev), world, tiny).train()
    assert (summary["best"]["step"], summary["best"]["evaluation"]) == (2, "final")
    ems["final"] = 0.4
    # killed after step 3 with its last checkpoint at step 2, the best saved at step 3:
    # resumed, step 3 is redone and ties the saved best, which stays as it was
    ems.update({"step-1": 0.3, "step-2": 0.3, "step-3": 0.5})
    cfg = make_cfg(tmp_path / "b", steps=4, save_every=2, eval=dev)
    make_trainer(cfg, world, tiny).train(until=3)
    run = tmp_path / "b" / "run"
    note = run / "best" / "best.json"
    assert json.loads(note.read_text())["step"] == 3
    saved_at = note.stat().st_mtime_ns
    # ... and killed between the two renames of a best being replaced: its old copy is put
    # back (it is the only one), a half-written new one removed
    (run / "best").rename(run / "best.old99999")
    (run / "best.tmp99998").mkdir()
    summary = make_trainer(cfg, world, tiny, resume=True).train()
    assert (summary["best"]["step"], summary["best"]["em"]) == (3, 0.5)
    assert note.stat().st_mtime_ns == saved_at
    assert sorted(p.name for p in run.glob("best*")) == ["best"]
    # the best folder deleted before a resume: said, and the next evaluation saved there
    cfg = make_cfg(tmp_path / "g", steps=4, save_every=2, eval=dev)
    make_trainer(cfg, world, tiny).train(until=2)
    shutil.rmtree(tmp_path / "g" / "run" / "best")
    lines = []
    console = type("C", (), {"print": lambda self, *a, **k: lines.append(" ".join(map(str, a)))})()
    summary = make_trainer(cfg, world, tiny, resume=True, console=console).train()
    assert any("the next evaluation's policy is saved there" in x for x in lines)
    assert (summary["best"]["step"], summary["best"]["em"]) == (3, 0.5)
    # the start can be the best: nothing after it scored higher
    ems.update({"start": 0.6})
    summary = make_trainer(make_cfg(tmp_path / "c", steps=1, eval=dev), world, tiny).train()
    assert (summary["best"]["step"], summary["best"]["em"]) == (0, 0.6)
    # without the option there is no best folder and no summary entry
    summary = make_trainer(make_cfg(tmp_path / "d", steps=1,
                                    eval={**dev, "keep_best": False}), world, tiny).train()
    assert "best" not in summary and not (tmp_path / "d" / "run" / "best").exists()
    with pytest.raises(ConfigError, match=r"eval\.keep_best: needs evaluations"):
        make_trainer(make_cfg(tmp_path / "e", eval={"keep_best": True}), world, tiny)


def test_stop_on_collapse_keeps_the_last_healthy_checkpoint(world, tiny, tmp_path):
    def tied(t):   # every group's rewards tie: no learning signal at all
        return RewardParts(total=0.0, outcome=0.0, format=0.0, penalty=0.0)

    over = {"steps": 5, "monitor.stop_on_collapse": True, "monitor.no_signal_steps": 1}
    trainer = make_trainer(make_cfg(tmp_path / "a", **over), world, tiny, reward_fn=tied)
    summary = trainer.train()
    run = tmp_path / "a" / "run"
    alerts = [json.loads(line) for line in (run / "alerts.jsonl").read_text().splitlines()]
    assert [(a["step"], a["kind"], a["severity"]) for a in alerts] == [
        (1, "no_signal", "warn"), (2, "no_signal", "collapse")]
    assert "no group's rewards varied for 2 steps" in summary["stopped"]
    assert trainer.state.healthy_checkpoint == "step-1"
    assert not (run / "checkpoints" / "step-2").exists()   # the collapsed step is not saved
    # final is the step-1 policy: the same as a run that stopped after one step
    one = make_trainer(make_cfg(tmp_path / "b", steps=1), world, tiny, reward_fn=tied)
    one.train()
    for (name, a), (_, b) in zip(trainer.model.named_parameters(), one.model.named_parameters()):
        assert torch.equal(a, b), name


def test_after_a_collapse_the_final_evaluation_is_of_the_restored_step(world, tiny, tmp_path,
                                                                        monkeypatch):
    """The run stops on a collapse at step 2 and its final policy is step 1's checkpoint:
    that evaluation is logged, and kept as the best, under step 1 (it named step 2, the
    collapsed policy that was not evaluated)."""
    def tied(t):
        return RewardParts(total=0.0, outcome=0.0, format=0.0, penalty=0.0)

    def fake_eval(self, out_dir):
        out_dir.mkdir(parents=True, exist_ok=True)
        return {"em": 0.5 if out_dir.name == "final" else 0.1, "f1": 0.1,
                "valid_format": 1.0, "searches": 1.5, "questions": 2}

    monkeypatch.setattr(Trainer, "evaluate", fake_eval)
    dev = {"data": str(world["paths"]["test"]), "keep_best": True, "at_start": False}
    over = {"steps": 5, "monitor.stop_on_collapse": True, "monitor.no_signal_steps": 1}
    trainer = make_trainer(make_cfg(tmp_path, eval=dev, **over), world, tiny, reward_fn=tied)
    summary = trainer.train()
    assert trainer.state.healthy_checkpoint == "step-1" and trainer.state.step_done == 2
    assert summary["best"]["step"] == 1 and summary["best"]["evaluation"] == "final"
    log = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "dev_em" in r] == [1]


def test_a_collapsed_run_resumed_logs_its_final_evaluation_once(world, tiny, tmp_path,
                                                               monkeypatch):
    """Collapse at step 6, the last healthy checkpoint step 4 (evaluated at 4 and 5): the
    final evaluation is logged under step 4, which the checkpoint knows of from its periodic
    evaluation. A resume from step 4 (a kill in the finish) kept that line and its alerts
    and logged them again."""
    def tied(t):
        return RewardParts(total=0.0, outcome=0.0, format=0.0, penalty=0.0)

    def fake_eval(self, out_dir):
        out_dir.mkdir(parents=True, exist_ok=True)
        # the policy says "no" to every yes/no question, and "yes" at the final evaluation:
        # the swap raises an alert there
        yes = float(out_dir.name == "final")
        return {"em": 0.0, "f1": 0.0, "valid_format": 1.0, "searches": 0.0, "questions": 40,
                "answered_yes": yes, "answered_no": 1.0 - yes, "gold_yes": 0.6,
                "yes_no_questions": 40}

    monkeypatch.setattr(Trainer, "evaluate", fake_eval)
    dev = {"data": str(world["paths"]["test"]), "every": 1, "at_start": False}
    cfg = make_cfg(tmp_path, eval=dev, steps=6, save_every=2,
                   **{"monitor.stop_on_collapse": True, "monitor.no_signal_steps": 3})
    run = tmp_path / "run"

    def lines(name):
        return [json.loads(x) for x in (run / name).read_text().splitlines()]

    first = make_trainer(cfg, world, tiny, reward_fn=tied).train()
    dev_lines = [(r["step"], r.get("eval")) for r in lines("metrics.jsonl") if "dev_em" in r]
    assert dev_lines == [(1, None), (2, None), (3, None), (4, None), (5, None), (4, "final")]
    alerts = lines("alerts.jsonl")
    assert any(a.get("eval") == "final" for a in alerts)   # the final's own alerts, marked
    resumed = make_trainer(cfg, world, tiny, reward_fn=tied, resume=True)
    assert resumed.state.step_done == 4
    second = resumed.train()
    assert [(r["step"], r.get("eval")) for r in lines("metrics.jsonl") if "dev_em" in r] \
        == dev_lines
    assert lines("alerts.jsonl") == alerts
    assert second["last"]["step"] == first["last"]["step"] == 6


@pytest.mark.parametrize("backend, key", [("torch.utils.tensorboard", "log.tensorboard"),
                                          ("wandb", "log.wandb")])
def test_logging_backend_missing_names_the_config_key(backend, key, tmp_path, monkeypatch):
    import sys

    from seekrl.recipes.setup import MetricsLog
    monkeypatch.setitem(sys.modules, backend, None)   # import then raises ImportError
    flag = key.split(".")[1]
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        MetricsLog(tmp_path / "metrics.jsonl", **{flag: True})


def test_a_resumed_log_tells_tensorboard_and_wandb_where_it_goes_on(tmp_path, monkeypatch):
    """A resume redoes the steps after its checkpoint: TensorBoard purges its events of them
    (a new event file beside the old one held them twice), W&B goes on in the same run."""
    import sys
    import types

    from seekrl.recipes.setup import MetricsLog

    made = []

    class Writer:
        def __init__(self, log_dir, purge_step=None):
            made.append(("tb", purge_step))

        def add_scalar(self, *a):
            pass

        def close(self):
            pass

    class Run:
        def __init__(self, id):
            self.id = id

        def log(self, scalars, step=None):
            made.append(("log", scalars.get("step"), step))

        def finish(self):
            pass

    def init(project, config, dir, id=None, resume=None):
        made.append(("wandb", id, resume))
        return Run(id or "run-1")

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard",
                        types.SimpleNamespace(SummaryWriter=Writer))
    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    path = tmp_path / "metrics.jsonl"
    MetricsLog(path, tensorboard=True, wandb=True).close()
    MetricsLog(path, tensorboard=True, wandb=True, resume=True, resume_step=7).close()
    assert made == [("tb", None), ("wandb", None, None), ("tb", 8), ("wandb", "run-1", "allow")]
    assert (tmp_path / "wandb_id").read_text() == "run-1\n"
    # a line below the last step logged (a collapse-stopped run's final evaluation, under
    # its restored step) goes at the last step, which W&B keeps; its own step is a field
    made.clear()
    log = MetricsLog(path, wandb=True, resume=True)
    for record in ({"step": 5, "reward": 0.1}, {"step": 6, "reward": 0.0},
                   {"step": 4, "eval": "final", "dev_em": 0.3}):
        log.write(record)
    log.close()
    assert [m for m in made if m[0] == "log"] == [("log", 5, 5), ("log", 6, 6), ("log", 4, 6)]


# ---------------------------------------------------------------------- process supervision


def test_a_step_with_step_rewards_fills_the_steps_and_logs_them(world, tiny, tmp_path):
    cfg = make_cfg(tmp_path, **{"algo.advantage": "dual_granularity", "log.save_rollouts": 1,
                                "reward.process": {"evidence": 1.0, "step_format": 0.5}})
    trainer = make_trainer(cfg, world, tiny)
    record = trainer.step(1)
    for key in ("process_reward", "process_evidence", "process_step_format", "adv_abs",
                "rollout_tokens", "rollout_tokens_total", "evidence_recall", "reward_by_hops"):
        assert key in record, key
    assert record["rollout_tokens"] > 0
    assert record["process_step_format"] < 0     # the random tiny model breaks the protocol
    # the step's episodes are kept, with their step rewards, and the viewer shows them
    from seekrl.agent.trajectory import read_trajectories

    saved = tmp_path / "run" / "rollouts" / "step-1"
    trajs = read_trajectories(saved / "trajectories.jsonl")
    assert trajs and all(s.process_parts.keys() == {"evidence", "step_format"}
                         for t in trajs for s in t.steps)
    assert "process reward" in (saved / "viewer.html").read_text()


def test_a_prm_object_stands_in_for_reward_prm(world, tiny, tmp_path):
    """`Trainer(prm_scorer=...)` needs no `reward.prm` folder (the README's way to pass one);
    without either, the config is refused before anything loads."""
    from seekrl.recipes.train import check_config

    class ByAction:                # a PRM with a prior on the kind of step, nothing else
        def score_steps(self, trajectories):
            return [[SCORE[s.action] for s in t.steps] for t in trajectories]

    SCORE = {"search": 0.25, "answer": 0.75, "invalid": 0.5}
    cfg = make_cfg(tmp_path, **{"algo.advantage": "dual_granularity",
                                "reward.process": {"prm": 1.0}})
    with pytest.raises(ConfigError, match="reward.process.prm: no process reward model"):
        check_config(cfg)
    trainer = make_trainer(cfg, world, tiny, prm_scorer=ByAction())
    record = trainer.step(1)
    # the step's mean, and the mean by kind of step (whichever kinds the tiny model wrote)
    by_action = record["process_prm_by_action"]
    assert by_action and by_action == {a: SCORE[a] for a in by_action}
    assert min(by_action.values()) <= record["process_prm"] <= max(by_action.values())
    # crafted: two searches, a turn the source did not judge, and an answer
    from seekrl.agent.trajectory import Step, Trajectory
    from seekrl.rewards.outcome import RewardParts

    steps = [Step(1, 2, "search"), Step(2, 3, "search"), Step(3, 4, "invalid"),
             Step(4, 5, "answer", answer="x")]
    for step, v in zip(steps, (0.1, 0.3, None, 0.8)):
        step.process_parts = {} if v is None else {"prm": v}
    t = Trajectory("q", "q", "?", ["x"], [1, 2, 3, 4, 5], [0, 1, 1, 1, 1], 1, steps=steps,
                   answer="x", finish_reason="answer")
    from seekrl.rl.step_metrics import episode_metrics

    record = episode_metrics([t], [RewardParts(1.0, 1.0, 0.0, 0.0)], process=["prm"])
    assert record["process_prm"] == pytest.approx(0.4)
    assert record["process_prm_by_action"] == {"answer": 0.8, "search": 0.2}


def test_the_multihop_reward_reads_the_type_where_no_hop_count_is_given():
    """HotpotQA's and 2Wiki's files give a question's type, not its hops: the multi-hop
    reward (and with it the monitor's search-collapse alerts) had been None on them."""
    from seekrl.agent.trajectory import Trajectory
    from seekrl.rewards.outcome import RewardParts
    from seekrl.rl.step_metrics import episode_metrics, is_multihop

    def episode(reward, **metadata):
        t = Trajectory("q", "q", "?", ["x"], [1, 2], [0, 1], 1, metadata=metadata)
        return t, RewardParts(reward, reward, 0.0, 0.0)

    assert is_multihop({"type": "bridge"}) and is_multihop({"type": "Comparison"})
    assert is_multihop({"type": "bridge_comparison"}) and is_multihop({"hops": 3})
    assert not is_multihop({"type": "single"}) and not is_multihop({})
    assert not is_multihop({"type": "bridge", "hops": 1})   # a hop count given wins
    assert not is_multihop({"hops": True, "type": "single"})
    hotpot = [episode(1.0, type="bridge"), episode(0.0, type="comparison"),
              episode(1.0, type="single")]
    record = episode_metrics(*map(list, zip(*hotpot)))
    assert record["reward_multihop"] == 0.5 and record["reward_by_hops"] == {}
    world = [episode(1.0, type="bridge", hops=2), episode(0.0, type="single", hops=1)]
    assert episode_metrics(*map(list, zip(*world)))["reward_multihop"] == 1.0
    nq = [episode(1.0), episode(0.0, type="single")]
    assert episode_metrics(*map(list, zip(*nq)))["reward_multihop"] is None


def test_mc_value_counts_its_continuations_as_rollout_compute(world, tiny, tmp_path):
    cfg = make_cfg(tmp_path, **{"algo.advantage": "dual_granularity",
                                "reward.process": {"mc_value": 1.0}, "reward.mc_samples": 2,
                                "algo.epochs": 1, "algo.kl_coef": 0.0})
    trainer = make_trainer(cfg, world, tiny)
    record = trainer.step(1)
    assert record["process_mc_continuations"] > 0 and record["process_mc_tokens"] > 0
    assert record["rollout_tokens"] > record["process_mc_tokens"]


def test_tree_rollouts_count_shared_prefixes_once(world, tiny, tmp_path):
    cfg = make_cfg(tmp_path, **{"algo.advantage": "tree_grpo", "group_size": 4,
                                "rollout.tree": {"trees": 2, "branches": 1, "rounds": 1},
                                "algo.epochs": 1, "algo.kl_coef": 0.0,
                                "algo.mini_batch_size": 8})
    trainer = make_trainer(cfg, world, tiny)
    trajs = trainer.rollout(trainer.sample_questions(1, 2), seed=1)
    assert len(trajs) == 8 and len({t.group_id for t in trajs}) == 2
    record = trainer.step(1)
    assert record["episodes"] == 8
    assert record["rollout_tokens"] <= record["response_length"] * 8


def test_rollout_token_budget_stops_the_run(world, tiny, tmp_path):
    cfg = make_cfg(tmp_path, steps=5, max_rollout_tokens=1, save_every=0)
    summary = make_trainer(cfg, world, tiny).train()
    assert summary["steps"] == 1 and "rollout budget" in summary["budget"]
    assert summary["budget_met"] is False and summary["budget_ratio"] > 1.1   # flagged


def test_a_run_resumed_after_its_budget_stopped_it_trains_no_further(world, tiny, tmp_path):
    """Killed while it saved or evaluated its final policy, a budget-stopped run resumed
    finishes from its last checkpoint: no extra step (the budget overshot, final replaced)."""
    cfg = make_cfg(tmp_path, steps=5, max_rollout_tokens=1, save_every=1)
    first = make_trainer(cfg, world, tiny).train()
    weights = {k: v.clone() for k, v in
               load_policy_state(tmp_path / "run" / "final").items()}
    resumed = make_trainer(cfg, world, tiny, resume=True)
    assert resumed.state.step_done == 1
    summary = resumed.train()
    assert summary["steps"] == 1 and "rollout budget" in summary["budget"]
    assert summary["rollout_tokens"] == first["rollout_tokens"]
    # the last step's record, as the straight run reported it (it was {})
    assert summary["last"] == json.loads(json.dumps(first["last"]))
    records = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in records if '"episodes"' in x] == [1]
    for k, v in load_policy_state(tmp_path / "run" / "final").items():
        assert torch.equal(v, weights[k]), k
    # a budget spent on the run's last step: no budget stop to report, resumed or not
    last = make_cfg(tmp_path / "last", steps=1, max_rollout_tokens=1, save_every=1)
    assert make_trainer(last, world, tiny).train()["budget"] is None
    assert make_trainer(last, world, tiny, resume=True).train()["budget"] is None


def test_a_run_resumed_after_its_time_budget_stopped_it_trains_no_further(world, tiny,
                                                                          tmp_path):
    """The time budget's stop is kept with the checkpoint: a run killed in its final save
    or evaluation resumes to its finish (it played one step more); a raised max_minutes
    goes on training."""
    cfg = make_cfg(tmp_path, steps=3, max_minutes=1e-6, save_every=1)
    first = make_trainer(cfg, world, tiny).train()
    assert first["steps"] == 1 and "time budget" in first["budget"]
    resumed = make_trainer(cfg, world, tiny, resume=True)
    summary = resumed.train()
    assert summary["steps"] == 1 and "time budget" in summary["budget"]
    records = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in records if '"episodes"' in x] == [1]
    longer = make_cfg(tmp_path, steps=3, max_minutes=600, save_every=1)
    summary = make_trainer(longer, world, tiny, resume=True).train()
    assert summary["steps"] == 3 and summary["budget"] is None


def load_policy_state(folder):
    from safetensors.torch import load_file

    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}


def test_the_last_budgeted_step_plays_only_the_questions_the_budget_pays_for(world, tiny,
                                                                             tmp_path):
    """A step of 4 questions, a budget of about 1.5 steps: the second step plays about two
    questions instead of stopping half a step short or running half a step over."""
    probe = make_trainer(make_cfg(tmp_path / "probe", steps=1, questions_per_step=4,
                                  save_every=0, **{"algo.epochs": 1}), world, tiny)
    probe.train()
    budget = int(probe.state.rollout_tokens * 1.5)
    cfg = make_cfg(tmp_path, steps=5, questions_per_step=4, max_rollout_tokens=budget,
                   save_every=0, **{"algo.epochs": 1})
    trainer = make_trainer(cfg, world, tiny)
    summary = trainer.train()
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text()
               .splitlines() if '"episodes"' in x]
    assert [r["episodes"] for r in records][:2] == [8, 4]    # 4 x 2 rollouts, then 2 x 2
    assert summary["steps"] == 2 and trainer.state.questions_drawn == 6
    assert abs(summary["budget_ratio"] - 1) <= 0.1 and summary["budget_met"] is True


def test_resume_continues_identically_with_step_rewards(world, tiny, tmp_path):
    over = {"steps": 2, "algo.advantage": "gigpo",
            "reward.process": {"evidence": 1.0, "redundancy": 0.1}}
    full = make_trainer(make_cfg(tmp_path / "a", **over), world, tiny)
    full.train()
    first = make_trainer(make_cfg(tmp_path / "b", **over), world, tiny)
    first.train(until=1)
    resumed = make_trainer(make_cfg(tmp_path / "b", **over), world, tiny, resume=True)
    resumed.train()
    logs = [[json.loads(x) for x in (tmp_path / d / "run" / "metrics.jsonl").read_text()
             .splitlines()] for d in ("a", "b")]
    assert [r["step"] for r in logs[1]] == [1, 2]
    for a, b in zip(*logs):
        assert {k: v for k, v in a.items() if k not in TIMING} == \
            {k: v for k, v in b.items() if k not in TIMING}


@pytest.mark.parametrize("override,message", [
    ({"reward.process": {"prm": 1.0}}, "reward.process.prm: no process reward model"),
    ({"rollout.tree": {"trees": 2, "branches": 1, "rounds": 1}}, "set group_size=4"),
    ({"algo.advantage": "tree_grpo"}, "tree_grpo needs tree rollouts"),
])
def test_step_settings_fail_before_the_model_loads(override, message, tmp_path, monkeypatch):
    import seekrl.models

    monkeypatch.setattr(seekrl.models, "load_policy",
                        lambda *a, **k: pytest.fail("loaded a model before checking the config"))
    with pytest.raises(ConfigError, match=message):
        Trainer(make_cfg(tmp_path, **override))


def test_gigpo_groups_with_tied_scores_still_carry_signal():
    """Discounted step returns differ with the number of steps even where scores tie."""
    from seekrl.agent.trajectory import Step, Trajectory
    from seekrl.config import AlgoConfig
    from seekrl.rl.advantages import compute_advantages
    from seekrl.rl.sampling import group_signal

    def t(n_steps: int, sample: int) -> Trajectory:
        steps = [Step(1 + 2 * i, 2 + 2 * i, "search" if i < n_steps - 1 else "answer",
                      query=f"q{i}", info_start=2 + 2 * i, info_end=3 + 2 * i)
                 for i in range(n_steps)]
        n = 1 + 2 * n_steps
        return Trajectory("q", "g", "?", ["a"], [0] * n, [0] + [1, 0] * n_steps, 1,
                          steps=steps, outcome_reward=1.0, sample_index=sample)

    trajs = [t(1, 0), t(3, 1)]
    parts = [RewardParts(total=1.0, outcome=1.0, format=0.0, penalty=0.0)] * 2
    def advantages(name, cfg=None):
        return compute_advantages(name, trajs, [1.0, 1.0], cfg).advantages

    assert group_signal(trajs, parts, advantages("dr_grpo")) == (0, 1, 1)
    assert group_signal(trajs, parts, advantages("gigpo", AlgoConfig(step_gamma=0.9))) \
        == (1, 1, 0)


def test_saved_rollouts_keep_a_question_drawn_twice(world, tiny, tmp_path):
    cfg = make_cfg(tmp_path, **{"log.save_rollouts": 1})
    trainer = make_trainer(cfg, world, tiny)
    trajs = trainer.rollout(trainer.sample_questions(1, 1), seed=1) \
        + trainer.rollout(trainer.sample_questions(1, 1), seed=2)   # the same question twice
    trainer._save_rollouts(1, trajs)
    from seekrl.agent.trajectory import read_trajectories

    saved = read_trajectories(tmp_path / "run" / "rollouts" / "step-1" / "trajectories.jsonl")
    assert len(saved) == 4 and sorted(t.sample_index for t in saved) == [0, 1, 2, 3]


def test_a_skipped_update_still_advances_the_schedule(world, tiny, tmp_path):
    """Dynamic sampling that finds no group with signal skips the update; step k must still
    get step k's learning rate (a cosine schedule over 4 steps)."""
    flat = lambda t: RewardParts(total=0.0, outcome=0.0, format=0.0, penalty=0.0)  # noqa: E731
    cfg = make_cfg(tmp_path, **{"algo.dynamic_sampling": True, "algo.max_refills": 0,
                                "steps": 4, "optim": {"lr": 1e-3, "schedule": "cosine",
                                                      "warmup_steps": 0}})
    trainer = make_trainer(cfg, world, tiny, reward_fn=flat)
    lrs = [trainer.step(s)["lr"] for s in (1, 2)]
    reference = make_trainer(cfg, world, tiny)   # the same schedule, with updates
    expected = [reference.step(s)["lr"] for s in (1, 2)]
    assert trainer.scheduler.last_epoch == 2
    assert lrs == pytest.approx(expected) and lrs[0] > lrs[1]


def test_the_logged_lr_is_the_one_the_step_applied(world, tiny, tmp_path):
    """A cosine schedule without warm-up applies the full rate at step 1 (it was logged one
    step late: the rate of step 2)."""
    cfg = make_cfg(tmp_path, **{"steps": 4, "optim": {"lr": 1e-3, "schedule": "cosine",
                                                      "warmup_steps": 0, "min_lr_ratio": 0.1}})
    trainer = make_trainer(cfg, world, tiny)
    first = trainer.optimizer.param_groups[0]["lr"]
    assert trainer.step(1)["lr"] == pytest.approx(first) == pytest.approx(1e-3)
    assert trainer.step(2)["lr"] < first


def test_a_cosine_schedule_follows_the_token_budget_when_it_ends_the_run_first():
    """The decay reads the budget's share when it leads the steps' share, so a run its
    budget stops early still ends at its floor; without a budget, nothing changes."""
    from seekrl.config import OptimConfig
    from seekrl.recipes.setup import make_scheduler

    cfg = OptimConfig(lr=1.0, schedule="cosine", warmup_steps=0, min_lr_ratio=0.1)
    spent = [0.0]

    def rates(share):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        sched = make_scheduler(opt, cfg, 100, budget_share=share)
        out = [opt.param_groups[0]["lr"]]
        for s in (0.25, 0.5, 1.0):
            spent[0] = s
            opt.step()
            sched.step()
            out.append(opt.param_groups[0]["lr"])
        return out

    followed = rates(lambda: spent[0])
    assert followed[0] == pytest.approx(1.0)
    assert followed[2] == pytest.approx(0.1 + 0.9 * 0.5)   # half the budget: half-way down
    assert followed[3] == pytest.approx(0.1)               # budget spent: the floor
    by_steps = rates(None)   # three of 100 steps: still near the peak
    assert by_steps[3] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.03)))
    assert rates(lambda: 0.0) == pytest.approx(by_steps)   # a budget behind the steps: no change
    # with warm-up, the decay starts at warm-up's end: 2 steps of warm-up, then the peak
    warm = OptimConfig(lr=1.0, schedule="cosine", warmup_steps=2, min_lr_ratio=0.0)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = make_scheduler(opt, warm, 100, budget_share=lambda: spent[0])
    seen = []
    for k in range(1, 7):   # a budget that 6 equal steps spend
        spent[0] = k / 6
        opt.step()
        sched.step()
        seen.append(opt.param_groups[0]["lr"])
    # step k+1's rate: warm-up (2 steps), then progress (k - 2) / 4 of the cosine
    expected = [1.0] + [0.5 * (1 + math.cos(math.pi * (k - 2) / 4)) for k in range(2, 7)]
    assert seen == pytest.approx(expected)


def test_the_trainer_decays_its_learning_rate_by_the_budget_spent(world, tiny, tmp_path):
    cfg = make_cfg(tmp_path, **{"steps": 100, "max_rollout_tokens": 1,
                                "optim": {"lr": 1e-3, "schedule": "cosine", "warmup_steps": 0,
                                          "min_lr_ratio": 0.1}})
    trainer = make_trainer(cfg, world, tiny)
    assert trainer.step(1)["lr"] == pytest.approx(1e-3)
    assert trainer.state.budget_share(cfg.max_rollout_tokens) >= 1.0
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(1e-4)   # the next step's


def test_the_update_runs_in_the_mode_of_the_old_logprobs(world, tiny, tmp_path, monkeypatch):
    """With LoRA dropout 0.5, old log-probs in eval mode and new ones in train mode made the
    first ratio of an update far from 1; in one mode it is exactly 1."""
    from seekrl.rl.loss import POLICY_LOSSES

    ratios = []
    real = POLICY_LOSSES["ppo_clip"]
    monkeypatch.setitem(POLICY_LOSSES, "ppo_clip",
                        lambda *a, **k: (lambda out: ratios.append(out[1]["ratio_mean"]) or out)(
                            real(*a, **k)))
    cfg = make_cfg(tmp_path, **{"lora": {"enabled": True, "r": 4, "dropout": 0.5},
                                "algo.kl_coef": 0.0, "algo.epochs": 1,
                                "algo.mini_batch_size": 2, "algo.micro_batch_size": 2})
    trainer = make_trainer(cfg, world, tiny)
    with torch.no_grad():   # LoRA's B starts at zero, where dropout changes nothing
        for name, p in trainer.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5)
    trainer.step(1)
    assert ratios[0] == pytest.approx(1.0, abs=1e-5)


def test_kl_in_reward_puts_the_penalty_into_the_returns(world, tiny, tmp_path, monkeypatch):
    from seekrl.recipes import train as train_mod

    seen = []
    real = train_mod.estimate_advantages
    monkeypatch.setattr(train_mod, "estimate_advantages",
                        lambda name, batch, *a, **k: seen.append(
                            (batch.trajectories, batch.rewards)) or real(name, batch, *a, **k))
    cfg = make_cfg(tmp_path, **{"algo.advantage": "reinforce_pp", "algo.kl_in_reward": True,
                                "algo.kl_estimator": "k1", "algo.kl_coef": 0.5})
    trainer = make_trainer(cfg, world, tiny)
    trainer.step(1)                       # the policy moves away from the reference
    record = trainer.step(2)
    trajs, rewards = seen[-1]
    assert rewards.tokens is not None and record["kl"] != 0.0
    assert any(float(x.abs().sum()) > 0 for x in rewards.tokens)
    for t, x in zip(trajs, rewards.tokens):   # only on the policy's own tokens
        assert float(x[torch.tensor(t.loss_mask) == 0].abs().sum()) == 0


@pytest.mark.parametrize("over, calls", [
    ({}, 1),                                   # the signal check's advantages are the update's
    ({"algo.advantage": "gae"}, 1),            # a critic: only the update computes them
    ({"algo.dynamic_sampling": True}, 2),      # the batch was filtered: computed again
])
def test_advantages_are_computed_once_per_step(world, tiny, tmp_path, monkeypatch, over, calls):
    from seekrl.recipes import train as train_mod

    seen = []
    real = train_mod.estimate_advantages
    monkeypatch.setattr(train_mod, "estimate_advantages",
                        lambda *a, **k: seen.append(1) or real(*a, **k))
    trainer = make_trainer(make_cfg(tmp_path, **over), world, tiny)
    record = trainer.step(1)
    assert len(seen) == calls + record["refills"]
    assert record["groups_with_signal"] is not None


def test_a_step_with_llds_logs_what_it_regularised(world, tiny, tmp_path):
    cfg = make_cfg(tmp_path, **{"algo.llds_coef": 1.0, "algo.epochs": 3,   # 2 mini-batches x 3 epochs
                                "optim": {"lr": 1e-2}})   # moved for sure, on any CPU
    record = make_trainer(cfg, world, tiny).step(1)
    # the first mini-batch meets the rollout's own log-probs (nothing fell); the later ones
    # meet a moved policy, where some tokens fell and were regularised
    assert record["llds"] > 0.0 and 0.0 < record["llds_frac"] <= 1.0


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_correct_logp_shift_measures_the_same_episodes_after_the_update(world, tiny, tmp_path,
                                                                         sign):
    """Pushing the right episodes up raises their log-prob, pushing them down lowers it
    (likelihood displacement); with no update in between the shift is exactly 0."""
    cfg = make_cfg(tmp_path, **{"algo.kl_coef": 0.0, "algo.entropy_coef": 0.0,
                                "algo.epochs": 1, "algo.mini_batch_size": 4,
                                "algo.micro_batch_size": 4, "optim": {"lr": 3e-3}})
    trainer = make_trainer(cfg, world, tiny)
    trajs = trainer.rollout(trainer.sample_questions(1, 2), seed=1)
    for t in trajs[:2]:   # the tiny model never answers right: make two of them right
        t.answer = t.golden_answers[0]
    old, _ = trainer.batch_logprobs(trajs)
    assert trainer._displacement(trajs, old, {})["correct_logp_shift"] == 0.0
    adv = [torch.tensor(t.loss_mask, dtype=torch.float32) * (sign if i < 2 else 0.0)
           for i, t in enumerate(trajs)]
    update = trainer._update(trajs, adv, old, None, None, None)
    shift = trainer._displacement(trajs, old, update["correct_logps"])["correct_logp_shift"]
    assert shift * sign > 0


def test_the_likelihood_before_the_update_is_read_before_the_first_optimizer_step(
        world, tiny, tmp_path):
    """With the sampler's log-probs as the old ones, the right episodes' likelihood before
    the update is read in the update's own passes: only those of its first mini-batch, at
    the policy that sampled them (a later mini-batch's were read after a step, a baseline
    already moved)."""
    cfg = make_cfg(tmp_path, **{"algo.kl_coef": 0.0, "algo.entropy_coef": 0.0,
                                "algo.epochs": 1, "algo.mini_batch_size": 2,
                                "algo.micro_batch_size": 2, "optim": {"lr": 3e-2}})
    trainer = make_trainer(cfg, world, tiny)
    trajs = trainer.rollout(trainer.sample_questions(1, 2), seed=1)
    for t in trajs:
        t.answer = t.golden_answers[0]
    old, _ = trainer.batch_logprobs(trajs)
    before = {i: lp[torch.tensor(t.loss_mask, dtype=torch.bool)].mean().item()
              for i, (lp, t) in enumerate(zip(old, trajs))}
    adv = [torch.tensor(t.loss_mask, dtype=torch.float32) for t in trajs]
    update = trainer._update(trajs, adv, None, None, None, None, from_sampler=True)
    read = update["correct_logps"]
    assert len(read) == 2                     # the first mini-batch of two
    for i, value in read.items():
        assert value == pytest.approx(before[i], abs=1e-5)

@pytest.mark.parametrize("cap", [0, 1, 3])
def test_displacement_measures_at_most_monitor_displacement_episodes(world, tiny, tmp_path,
                                                                      cap, monkeypatch):
    """The after-update forward takes at most `monitor.displacement_episodes` of the right
    episodes, the first ones in batch order (0: none, and no shift; the log-prob before
    the update, which costs nothing, is still reported)."""
    cfg = make_cfg(tmp_path, **{"monitor.displacement_episodes": cap})
    trainer = make_trainer(cfg, world, tiny)
    trajs = trainer.rollout(trainer.sample_questions(1, 2), seed=1)
    for t in trajs:   # all four right
        t.answer = t.golden_answers[0]
    old, _ = trainer.batch_logprobs(trajs)
    seen = []
    real = trainer.batch_logprobs
    monkeypatch.setattr(trainer, "batch_logprobs",
                        lambda ts, **kw: (seen.append(list(ts)), real(ts, **kw))[1])
    out = trainer._displacement(trajs, old, {})
    if cap == 0:
        assert seen == [] and out["correct_logp_shift"] is None
    else:
        assert seen == [trajs[:min(cap, len(trajs))]] and out["correct_logp_shift"] == 0.0
    assert out["correct_logp"] < 0


@pytest.mark.parametrize("agg", ["seq-mean-token-sum-norm", "seq-mean-token-mean"])
def test_entropy_bonus_is_aggregated_like_the_policy_loss(world, tiny, tmp_path, agg):
    from seekrl.models import collate
    from seekrl.rl.forward import masked_logprobs
    from seekrl.rl.loss import aggregate
    from seekrl.rl.update import Probe as _Probe
    from seekrl.rl.update import UpdateBatch as _UpdateBatch

    cfg = make_cfg(tmp_path, **{"algo.kl_coef": 0.0, "algo.entropy_coef": 0.0,
                                "algo.loss_agg": agg})
    trainer = make_trainer(cfg, world, tiny)
    trajs = trainer.rollout(trainer.sample_questions(1, 2), seed=1)
    first = trajs[0].loss_mask.index(1)   # rows with different numbers of policy tokens
    trajs[0].loss_mask[first:first + 4] = [0] * 4
    trajs[0].rollout_logprobs = None   # no longer one per policy token
    adv = [torch.tensor(t.loss_mask, dtype=torch.float32) for t in trajs]
    micro, norm = [0, 1, 2], 50

    def loss(coef: float) -> float:
        trainer.cfg.algo.entropy_coef = coef
        with torch.no_grad():
            batch = _UpdateBatch(trajs, adv, None, None, None, None, norm_length=norm)
            return float(trainer.updater.micro_loss(batch, micro, _Probe())[0])

    ids, attn, mask = collate([trajs[i].token_ids for i in micro],
                              [trajs[i].loss_mask for i in micro], trainer.pad_id)
    with torch.no_grad():
        ent = masked_logprobs(trainer.model, ids, attn, mask, entropy=True)["entropy"]
    expected = -0.5 * float(aggregate(ent, mask, agg, norm))
    assert loss(0.5) - loss(0.0) == pytest.approx(expected, rel=1e-4, abs=1e-6)


def test_an_existing_run_is_refused_replaced_or_resumed_with_its_differences(world, tiny,
                                                                             tmp_path):
    """Writing a new run into an old one's folder truncated its metrics and replaced its
    config without a word: refused unless --overwrite; --resume says what changed and
    drops the alerts of the steps it redoes, like their metric lines."""
    from rich.console import Console

    cfg = make_cfg(tmp_path, steps=2)
    make_trainer(cfg, world, tiny).train(until=1)
    run = tmp_path / "run"
    with pytest.raises(ConfigError, match="already holds a run.*--resume.*--overwrite"):
        make_trainer(cfg, world, tiny, overwrite=False)
    assert (run / "metrics.jsonl").read_text()     # untouched
    (run / "alerts.jsonl").write_text(json.dumps({"step": 1, "kind": "x"}) + "\n"
                                      + json.dumps({"step": 2, "kind": "y"}) + "\n")
    console = Console(record=True, width=200)
    resumed = make_trainer(make_cfg(tmp_path, steps=3), world, tiny, resume=True,
                           console=console)
    assert "steps: 2 -> 3" in console.export_text()
    assert [json.loads(x)["step"] for x in (run / "alerts.jsonl").read_text().splitlines()] \
        == [1]
    assert resumed.state.step_done == 1
    # a rate the checkpoint's optimizer state would put back: refused, not said and ignored
    lower = make_cfg(tmp_path, steps=2)
    lower = lower.model_copy(update={"optim": lower.optim.model_copy(update={"lr": 1e-7})})
    with pytest.raises(ConfigError, match=r"--resume: optim\.lr: .* -> 1e-07 \(old -> new\): "
                                          "the checkpoint's optimizer state holds the old"):
        make_trainer(lower, world, tiny, resume=True)
    # a setting the checkpoint's weights depend on: refused (its weights had been loaded
    # onto another base, or rescaled by another LoRA alpha, with a warning)
    other = make_cfg(tmp_path, steps=2).model_copy(update={"model": "another/base"})
    with pytest.raises(ConfigError, match=r"--resume: model: .* -> 'another/base' \(old -> "
                                          r"new\): the checkpoint's weights were trained"):
        make_trainer(other, world, tiny, resume=True)
    from seekrl.recipes.checkpoint import refuse_weight_changes
    for line in ("lora.alpha: 32.0 -> 128.0", "lora: None -> {'r': 8}", "train_layers: 4 -> 8",
                 "algo.advantage: 'grpo' -> 'gae'"):
        with pytest.raises(ConfigError, match="the checkpoint's weights were trained"):
            refuse_weight_changes([line], run / "config.yaml")
    refuse_weight_changes(["steps: 2 -> 3", "model_revision: 'a' -> 'b'", "algo.kl_coef: 0 -> 1",
                           "lora_targets: 1 -> 2"], run / "config.yaml")
    # the co-trained ranker's optimizer state holds its rate the same way
    from seekrl.recipes.checkpoint import refuse_optimizer_changes
    with pytest.raises(ConfigError, match=r"ranker\.lr: 1e-05 -> 2e-05 \(old -> new\)"):
        refuse_optimizer_changes(["ranker.lr: 1e-05 -> 2e-05"], run / "config.yaml",
                                 ranker_trains=True)
    refuse_optimizer_changes(["ranker.candidates: 20 -> 30"], run / "config.yaml",
                             ranker_trains=True)
    # a ranker that does not train has no optimizer state to put the old rate back
    refuse_optimizer_changes(["ranker.lr: 1e-05 -> 2e-05"], run / "config.yaml")
    fresh = make_trainer(cfg, world, tiny, overwrite=True)
    assert fresh.state.step_done == 0 and not (run / "checkpoints").exists()
    assert not (run / "alerts.jsonl").exists()
    # an attempt that failed at its start (its step-0 evaluation logged, an alert raised)
    # holds no run, and a new one there does not append to its alerts
    (run / "metrics.jsonl").write_text(json.dumps({"step": 0, "dev_em": 0.1}) + "\n")
    (run / "alerts.jsonl").write_text(json.dumps({"step": 0, "kind": "constant_answer"}) + "\n")
    make_trainer(cfg, world, tiny, overwrite=False)
    assert not (run / "alerts.jsonl").exists() and (run / "metrics.jsonl").read_text() == ""


def test_a_checkpoint_is_flushed_with_its_folder_and_the_latest_pointer(world, tiny, tmp_path,
                                                                        monkeypatch):
    import os
    import stat

    synced = []
    real = os.fsync

    def spy(fd):
        st = os.fstat(fd)
        synced.append(("dir" if stat.S_ISDIR(st.st_mode) else "file", st.st_ino))
        return real(fd)

    trainer = make_trainer(make_cfg(tmp_path, steps=1), world, tiny)
    trainer.log.write({"step": 1, "reward": 0.5})
    (tmp_path / "run" / "alerts.jsonl").write_text('{"step": 1, "kind": "x"}\n')
    monkeypatch.setattr(os, "fsync", spy)
    trainer.save_checkpoint(1)
    ckpts = tmp_path / "run" / "checkpoints"
    assert ("dir", os.stat(ckpts).st_ino) in synced          # the renames are on disk
    latest = synced.index(("file", os.stat(ckpts / "latest").st_ino))   # the pointer's content
    assert ("file", os.stat(ckpts / "step-1" / "policy.pt").st_ino) in synced
    # the step logs are on disk before a checkpoint is named: a resume keeps their lines up
    # to its step and redoes only the later ones, so a lost line would be a hole for good
    for log in ("metrics.jsonl", "alerts.jsonl"):
        inode = os.stat(tmp_path / "run" / log).st_ino
        assert ("file", inode) in synced[:latest], log


def test_a_recipe_checkpoint_flushes_the_run_s_logs_before_naming_it(tmp_path, monkeypatch):
    import os

    from seekrl.recipes.checkpoint import write_checkpoint

    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    order = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: order.append(
        os.readlink(f"/proc/self/fd/{fd}")) or real(fd))
    write_checkpoint(out / "checkpoints", 1, lambda tmp: (tmp / "w.pt").write_text("w"), 2)
    latest = next(i for i, path in enumerate(order) if ".latest.tmp" in path)
    assert str(out / "metrics.jsonl") in order[:latest]


def test_overwrite_deletes_the_old_run_only_once_the_new_one_has_loaded(world, tiny, tmp_path):
    """A bad data path with --overwrite must not cost the old run; and a run that would
    delete the model it starts from is refused."""
    cfg = make_cfg(tmp_path, steps=1)
    make_trainer(cfg, world, tiny).train()
    run = tmp_path / "run"
    bad = cfg.model_copy(update={"data": str(tmp_path / "missing.jsonl")})
    model, tok = tiny
    with pytest.raises(FileNotFoundError, match="data"):
        Trainer(bad, model=model, tokenizer=tok, retriever=world["index"], overwrite=True)
    assert (run / "metrics.jsonl").is_file() and (run / "final").exists()
    inside = cfg.model_copy(update={"model": str(run / "final")})
    with pytest.raises(ConfigError, match="inside out"):
        Trainer(inside, retriever=world["index"], questions=world["train"], overwrite=True)
    assert (run / "final").exists()


def test_overwrite_into_a_folder_that_holds_no_run_keeps_its_files(tmp_path):
    """--overwrite deleted every run-output name in out whether or not a run was there:
    a user's own `final/` model (the start model, which the "inside out" guard checks only
    where a run is found) and `eval/` data went."""
    from seekrl.recipes.checkpoint import check_run_dir, claim_run_dir

    out = tmp_path / "mine"
    (out / "final").mkdir(parents=True)
    (out / "final" / "model.safetensors").write_bytes(b"weights")
    (out / "eval").mkdir()
    (out / "eval" / "questions.jsonl").write_text("{}\n")
    (out / "alerts.jsonl").write_text('{"step": 0}\n')
    check_run_dir(out, overwrite=True, model=str(out / "final"))
    claim_run_dir(out, overwrite=True)
    assert (out / "final" / "model.safetensors").is_file()
    assert (out / "eval" / "questions.jsonl").is_file()
    assert not (out / "alerts.jsonl").exists()     # an attempt's leftovers still go
    (out / "metrics.jsonl").write_text('{"step": 1}\n')   # now a run: replaced whole
    claim_run_dir(out, overwrite=True)
    assert not (out / "final").exists() and not (out / "metrics.jsonl").exists()


def test_activation_checkpointing_keeps_train_mode_with_dropout_off(tiny):
    from seekrl.rl.update import no_dropout_mode as _no_dropout_mode

    model = copy.deepcopy(tiny[0])
    _no_dropout_mode(model)
    assert not model.training
    model.gradient_checkpointing_enable()
    model.model.layers[0].mlp.add_module("drop", torch.nn.Dropout(0.5))
    _no_dropout_mode(model)
    assert model.training and not model.model.layers[0].mlp.drop.training


def test_activation_checkpointing_turns_the_attention_layers_own_dropout_off(tiny):
    """A Llama whose config sets attention_dropout: in train mode its attention reads that
    rate itself (no Dropout module to put in eval mode), so two passes over the same
    tokens differed and an update's first ratio was noise."""
    from seekrl.rl.update import no_dropout_mode as _no_dropout_mode

    model = copy.deepcopy(tiny[0])
    model.gradient_checkpointing_enable()
    attention = [m for m in model.modules() if hasattr(m, "attention_dropout")]
    assert attention   # the tiny Llama's attention layers: the test means something
    for m in attention:
        m.attention_dropout = 0.5
    ids = torch.arange(3, 19)[None]
    _no_dropout_mode(model)
    assert model.training
    with torch.no_grad():
        a, b = model(input_ids=ids).logits, model(input_ids=ids).logits
    assert torch.equal(a, b)


def test_gradient_checkpointing_gives_the_same_update(world, tiny, tmp_path):
    """`gradient_checkpointing: true` recomputes activations; the step it takes is the same."""
    from seekrl.agent.trajectory import read_trajectories, write_trajectories

    plain = make_trainer(make_cfg(tmp_path / "a", **{"algo.kl_coef": 0.0}), world, tiny)
    trajs = plain.rollout(plain.sample_questions(1, 2), seed=3)
    plain.score(trajs)
    write_trajectories(tmp_path / "batch.jsonl", trajs)
    checked = make_trainer(make_cfg(tmp_path / "b", gradient_checkpointing=True,
                                    **{"algo.kl_coef": 0.0}), world, tiny)
    from seekrl.models import backbone

    assert backbone(checked.model).gradient_checkpointing   # on: the test means something
    assert not getattr(backbone(plain.model), "gradient_checkpointing", False)
    a, b = plain.learn(trajs), checked.learn(read_trajectories(tmp_path / "batch.jsonl"))
    assert a["pg_loss"] == pytest.approx(b["pg_loss"], abs=1e-6)
    assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    for (n, p), q in zip(plain.model.named_parameters(), checked.model.parameters()):
        assert torch.allclose(p, q, atol=1e-6), n


def test_rollout_training_gap_is_logged_and_tis_corrects_it(world, tiny, tmp_path):
    """seekrl's own backend samples from the trainer's distribution: the logged gap is
    rounding. A backend whose log-probs are off by one nat (as a mismatched engine's could
    be) gets every token's gradient weighted by the capped ratio."""
    from seekrl.agent.trajectory import read_trajectories, write_trajectories

    over = {"algo.kl_coef": 0.0, "algo.entropy_coef": 0.0, "algo.epochs": 1,
            "algo.mini_batch_size": 8, "rollout.temperature": 0.8}
    plain = make_trainer(make_cfg(tmp_path / "a", **over), world, tiny)
    trajs = plain.rollout(plain.sample_questions(1, 2), seed=5)
    plain.score(trajs)
    assert all(t.rollout_logprobs is not None for t in trajs)
    write_trajectories(tmp_path / "batch.jsonl", trajs)
    a = plain.learn(trajs)
    assert a["rollout_logp_gap"] < 1e-4 and a["rollout_logp_gap_max"] < 1e-3
    assert "tis_weight" not in a

    off = read_trajectories(tmp_path / "batch.jsonl")
    for t in off:   # the engine thought every token one nat less likely: ratio e > cap 2
        t.rollout_logprobs = [x - 1.0 for x in t.rollout_logprobs]
    tis = make_trainer(make_cfg(tmp_path / "b", **over, **{"algo.tis_cap": 2.0}), world, tiny)
    b = tis.learn(off)
    assert b["rollout_logp_gap"] == pytest.approx(1.0, abs=1e-3)
    assert b["tis_clip_frac"] == 1.0 and b["tis_weight"] == pytest.approx(2.0)
    assert b["grad_norm"] == pytest.approx(2 * a["grad_norm"], rel=1e-3)

    for t in off:
        t.rollout_logprobs = None
    with pytest.raises(ValueError, match="no behaviour log-probs"):
        tis.learn(off)


def test_old_logprobs_from_the_sampler_skip_the_pass_and_match_the_recomputed(
        world, tiny, tmp_path, monkeypatch):
    """algo.old_logprobs: rollout: a step of several updates takes the PPO ratio's
    denominator from the episodes' sampler log-probs instead of a forward pass, and ends
    where the recomputed one does (the two differ by rounding); where the sampler's numbers
    mean something else, or the pass is made anyway, it is refused at start."""
    from seekrl.agent.trajectory import read_trajectories, write_trajectories

    over = {"algo.kl_coef": 0.0, "algo.entropy_coef": 0.0, "algo.epochs": 1,
            "algo.mini_batch_size": 2, "rollout.temperature": 0.8}
    plain = make_trainer(make_cfg(tmp_path / "a", **over), world, tiny)
    trajs = plain.rollout(plain.sample_questions(1, 2), seed=5)
    plain.score(trajs)
    write_trajectories(tmp_path / "batch.jsonl", trajs)
    passes = []
    real = Trainer._shared_logprobs
    monkeypatch.setattr(Trainer, "_shared_logprobs",
                        lambda self, *a, **k: passes.append(1) or real(self, *a, **k))
    a = plain.learn(trajs)
    assert passes == [1] and a["updates"] == 2
    own = make_trainer(make_cfg(tmp_path / "b", **over, **{"algo.old_logprobs": "rollout"}),
                       world, tiny)
    b = own.learn(read_trajectories(tmp_path / "batch.jsonl"))
    assert passes == [1] and b["updates"] == 2   # no pass of its own
    assert b["pg_loss"] == pytest.approx(a["pg_loss"], abs=1e-5)
    for (n, p), q in zip(plain.model.named_parameters(), own.model.parameters()):
        assert torch.allclose(p, q, atol=1e-5), n
    # the gap is still measured: the trainer's numbers before its first optimizer step
    # against the sampler's (here the engine is made one nat off)
    assert b["rollout_logp_gap"] < 1e-4
    off = read_trajectories(tmp_path / "batch.jsonl")
    for t in off:
        t.rollout_logprobs = [x - 1.0 for x in t.rollout_logprobs]
    shifted = make_trainer(make_cfg(tmp_path / "s", **over, **{"algo.old_logprobs": "rollout"}),
                           world, tiny)
    assert shifted.learn(off)["rollout_logp_gap"] == pytest.approx(1.0, abs=1e-3)
    # a batch in which an episode has none (a backend that reported none for a turn) is
    # recomputed, and said
    off = read_trajectories(tmp_path / "batch.jsonl")
    off[0].rollout_logprobs = None
    with pytest.warns(UserWarning, match="this step recomputes them"):
        own.learn(off)
    assert passes == [1, 1]
    for key, value, why in (("rollout.top_p", 0.9, "top-p truncated"),
                            ("algo.advantage", "gae", "the critic"),
                            ("algo.tis_cap", 2.0, "corrects nothing")):
        with pytest.raises(ConfigError, match=why):
            make_trainer(make_cfg(tmp_path / "c", **over, **{"algo.old_logprobs": "rollout",
                                                             key: value}), world, tiny)


def test_gradient_checkpointing_leaves_frozen_blocks_out_of_the_backward(world, tiny, tmp_path):
    """With only the top block trained, nothing below it needs a gradient: checkpointing
    must not make the embeddings' output require one (transformers does, for its reentrant
    kind), or the backward pass would run through every frozen block."""
    trainer = make_trainer(make_cfg(tmp_path, gradient_checkpointing=True, train_layers=1),
                           world, tiny)
    seen = []
    emb = trainer.model.get_input_embeddings()
    handle = emb.register_forward_hook(lambda m, i, o: seen.append(o.requires_grad))
    trainer.model.train()
    trainer.model(input_ids=torch.tensor([[1, 2, 3]]))
    handle.remove()
    assert seen == [False]


def test_prune_steps_keeps_the_newest_and_the_named(tmp_path):
    """The checkpoint pruning of RL and PRM runs: the newest `keep_last` step-N folders,
    plus the named ones (the last healthy checkpoint), stay; other names are not touched."""
    from seekrl.recipes.checkpoint import prune_steps

    for n in (1, 2, 3, 10, 11):
        (tmp_path / f"step-{n}").mkdir()
    (tmp_path / "step-notes").mkdir()
    (tmp_path / "step-12").write_text("a file, not a checkpoint")
    prune_steps(tmp_path, 2, keep={"step-2", None})
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-10", "step-11", "step-12", "step-2", "step-notes"]   # 11 after 10: by number


def test_a_restart_under_the_dead_runs_pid_still_recovers_its_leftovers(tmp_path):
    """A save killed between moving `best` aside and moving the new one in leaves
    `best.old<tag>`; a restart under the same PID (a container's PID 1) had taken the
    dead process's leftovers for its own: `best` was not put back, a half-written
    `.step-N.tmp` never removed, and a `step-N.old` beside its new copy kept."""
    import os

    from seekrl.recipes.checkpoint import process_tag, prune_steps, recover_replaced

    pid = os.getpid()
    dead = f"{pid}"   # a save by an earlier process of this PID (names before the tag)
    (tmp_path / f"best.old{dead}").mkdir()
    (tmp_path / f"best.old{dead}" / "weights").write_text("the best policy")
    recover_replaced(tmp_path / "best")
    assert (tmp_path / "best" / "weights").read_text() == "the best policy"
    for name in (f".step-3.tmp{dead}", f".step-4.tmp{pid}-0a1b2c3d", "step-2", f"step-2.old{dead}",
                 f".step-5.tmp{process_tag()}"):
        (tmp_path / name).mkdir()
    prune_steps(tmp_path, 5)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f".step-5.tmp{process_tag()}", "best", "step-2"]   # this process's own save is kept
    assert process_tag().startswith(f"{pid}-") and process_tag() == process_tag()


def test_a_step_under_bf16_mixed_updates_float32_weights(world, tiny, tmp_path):
    """dtype: bf16-mixed through the whole step (rollout, update, displacement): the
    weights stay float32 and move, the loss and the rollout/trainer gap are finite."""
    from seekrl.models import mixed_precision

    model, tok = tiny
    mixed = mixed_precision(copy.deepcopy(model))
    trainer = make_trainer(make_cfg(tmp_path), world, (mixed, tok))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    record = trainer.step(1)
    assert math.isfinite(record["pg_loss"]) and math.isfinite(record["grad_norm"])
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    assert not torch.is_autocast_enabled("cpu")


def test_the_recall_bonus_separates_a_group_that_all_answered_wrong(world, tiny, tmp_path):
    """Outcome alone gives every wrong episode of a bridge group the same reward, so the one
    that made the second hop gets no more credit than the one that answered after the first;
    `reward.recall_bonus` (the `recall` method) ranks it above, and never marks a search
    down: a second search on a single-hop question earns as much as stopping."""
    from seekrl.agent.trajectory import Step, Trajectory
    from seekrl.rl.advantages import compute_advantages
    from seekrl.rl.methods import method_overrides

    def episode(hits: list[list[str]], gold: list[str]) -> Trajectory:
        n = len(hits) + 1
        steps = [Step(i, i + 1, "search", text="<think> a </think>\n<search> q </search>",
                      hits=h) for i, h in enumerate(hits, start=1)]
        steps.append(Step(n, n + 1, "answer", text="<answer> rome </answer>", answer="rome"))
        return Trajectory("q", "g", "?", ["Paris"], list(range(n + 1)), [0] + [1] * n, 1,
                          steps=steps, answer="rome", finish_reason="answer",
                          gold_doc_ids=gold)

    one_hop = episode([["d1", "x"]], ["d1", "d2"])
    two_hops = episode([["d1", "x"], ["d2", "y"]], ["d1", "d2"])
    plain = [episode_reward(t, format_reward=0.1) for t in (one_hop, two_hops)]
    assert plain[0].total == plain[1].total == pytest.approx(0.1)   # no signal at all
    bonus = [episode_reward(t, format_reward=0.1, recall_bonus=0.5) for t in (one_hop, two_hops)]
    assert [p.evidence for p in bonus] == [pytest.approx(0.25), pytest.approx(0.5)]
    assert [p.total for p in bonus] == [pytest.approx(0.35), pytest.approx(0.6)]
    assert bonus[0].outcome == bonus[1].outcome == 0.0
    # in a group, the second hop now carries a positive advantage and stopping a negative one
    adv, _ = compute_advantages("dr_grpo", [one_hop, two_hops], [p.total for p in bonus])
    assert adv[0][1] < 0 < adv[1][1]
    # a single-hop question: the second search costs nothing; unknown gold: no bonus
    single = [episode([["d1"]], ["d1"]), episode([["d1"], ["z"]], ["d1"])]
    assert {episode_reward(t, recall_bonus=0.5).evidence for t in single} == {0.5}
    assert episode_reward(episode([["d1"]], []), recall_bonus=0.5).evidence == 0.0
    # the named method sets it on the baseline's own estimator, and the trainer uses it
    keys = method_overrides("recall", group_size=2, baseline_advantage="dr_grpo")
    assert keys == {"algo.advantage": "dr_grpo", "reward.recall_bonus": 0.5}
    trainer = make_trainer(make_cfg(tmp_path, **keys), world, tiny, reward_fn=None)
    assert trainer.reward_fn(two_hops) == bonus[1]
    # recall_cost: each model turn costs 0.1, so a single-hop question pays for stopping at
    # one search, while a bridge's second hop still pays (its share 0.25 less 0.1), even
    # when the answer is wrong
    keys = method_overrides("recall_cost", group_size=2, baseline_advantage="dr_grpo")
    assert keys == {"algo.advantage": "dr_grpo", "reward.recall_bonus": 0.5,
                    "reward.turn_cost": 0.1}

    def cost(t):
        return episode_reward(t, recall_bonus=0.5, turn_cost=0.1).total

    assert cost(single[0]) - cost(single[1]) == pytest.approx(0.1)
    assert cost(two_hops) - cost(one_hop) == pytest.approx(0.15)


def test_the_hop_bonus_pays_for_the_question_s_hop_count_from_both_sides(world, tiny, tmp_path):
    """`reward.hop_bonus` (the `hops` method): a single-hop question's second search costs
    the bonus, a bridge's missing hop costs it too, whether or not the searches found
    anything; unknown hops give none; the trainer reads it from the config."""
    from hypothesis import given
    from hypothesis import strategies as st

    from seekrl.agent.trajectory import Step, Trajectory
    from seekrl.rewards.outcome import hop_match
    from seekrl.rl.methods import method_overrides

    def episode(searches: int, hops) -> Trajectory:
        n = searches + 1
        steps = [Step(i, i + 1, "search", text="<search> q </search>", hits=["x"],
                      info_start=i + 1, info_end=i + 1) for i in range(1, n)]
        steps.append(Step(n, n + 1, "answer", text="<answer> rome </answer>", answer="rome"))
        return Trajectory("q", "g", "?", ["Paris"], list(range(n + 1)), [0] + [1] * n, 1,
                          steps=steps, answer="rome", finish_reason="answer",
                          metadata={} if hops is None else {"hops": hops})

    # a search on the last allowed turn is not run: it looks nothing up (it was paid as
    # a hop, and an episode out of turns outranked one that answered)
    out_of_turns = episode(1, 2)
    out_of_turns.steps[-1] = Step(2, 3, "search", text="<search> q </search>")
    out_of_turns.finish_reason, out_of_turns.answer = "max_turns", None
    assert (out_of_turns.n_searches, hop_match(out_of_turns)) == (2, 0.5)

    assert [hop_match(episode(k, 1)) for k in (0, 1, 2, 3)] == [0.0, 1.0, 0.0, 0.0]
    assert [hop_match(episode(k, 2)) for k in (1, 2, 3, 4)] == [0.5, 1.0, 0.5, 0.0]
    assert hop_match(episode(2, 3)) == pytest.approx(2 / 3)
    assert hop_match(episode(1, None)) is None and hop_match(episode(1, "2")) is None
    assert hop_match(episode(1, True)) is None and hop_match(episode(1, 0)) is None
    both = episode(1, 2)   # one search of two sub-queries: both lookups of a comparison
    both.steps[0].sub_queries = ["a", "b"]
    assert (both.n_searches, hop_match(both)) == (1, 1.0)
    parts = episode_reward(episode(2, 2), format_reward=0.1, hop_bonus=0.5)
    assert (parts.hops, parts.total, parts.outcome) == (0.5, pytest.approx(0.6), 0.0)
    assert episode_reward(episode(2, 1), hop_bonus=0.5).total == 0.0   # over-hopped
    assert episode_reward(episode(2, None), hop_bonus=0.5).hops == 0.0
    assert episode_reward(episode(2, 2)).hops == 0.0   # off by default

    @given(st.integers(0, 8), st.integers(1, 4))
    def bounded_and_best_at_the_hops(searches, hops):
        m = hop_match(episode(searches, hops))
        assert 0.0 <= m <= 1.0 and (m == 1.0) == (searches == hops)

    bounded_and_best_at_the_hops()
    keys = method_overrides("hops", group_size=2, baseline_advantage="dr_grpo")
    assert keys == {"algo.advantage": "dr_grpo", "reward.hop_bonus": 0.5}
    trainer = make_trainer(make_cfg(tmp_path, **keys), world, tiny, reward_fn=None)
    assert trainer.reward_fn(episode(1, 2)).hops == 0.25


def test_answer_credit_lays_the_outcome_on_the_answer_and_the_rest_everywhere(world, tiny,
                                                                                tmp_path):
    """`algo.answer_credit` (the `answer` and `hops_answer` methods): the estimator's group
    advantage, split into the outcome's part, which reaches only the tokens after the answer
    turn's `<answer>` tag, and the rest's (the hop bonus), on every policy token: the
    searches and the choice to stop learn from the bonus alone, at its own scale within the
    whole; the answer gets the whole; retrieved tokens stay at 0."""
    from seekrl.agent.trajectory import Step, Trajectory
    from seekrl.recipes.train import check_config
    from seekrl.rl.advantages import answer_span
    from seekrl.rl.methods import method_overrides

    tok = tiny[1]

    def enc(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False)

    def episode(searches: int, answer: str, index: int) -> Trajectory:
        ids, mask, steps = enc("question"), [], []
        mask = [0] * len(ids)
        for _ in range(searches):
            turn, info = enc("<think> look </think><search> q </search>"), enc(" docs ")
            steps.append(Step(len(ids), len(ids) + len(turn), "search", query="q",
                              text="<think> look </think><search> q </search>",
                              info_start=len(ids) + len(turn),
                              info_end=len(ids) + len(turn) + len(info)))
            ids, mask = ids + turn + info, mask + [1] * len(turn) + [0] * len(info)
        text = f"<think> so </think><answer> {answer} </answer>"
        turn = enc(text)
        steps.append(Step(len(ids), len(ids) + len(turn), "answer", text=text, answer=answer))
        return Trajectory("q", "g", "?", ["paris"], ids + turn, mask + [1] * len(turn),
                          len(enc("question")), steps=steps, answer=answer,
                          finish_reason="answer", sample_index=index, metadata={"hops": 2})

    group = [episode(1, "paris", 0), episode(2, "rome", 1), episode(2, "paris", 2),
             episode(1, "rome", 3)]
    span = answer_span(group[0], tok.decode)
    answer_turn = group[0].steps[-1]
    assert span[1] == answer_turn.end and span[0] > answer_turn.start
    assert tok.decode(group[0].token_ids[span[0]:span[1]]).strip() == "paris </answer>"
    assert "<answer>" in tok.decode(group[0].token_ids[answer_turn.start:span[0]])
    no_tag = episode(1, "paris", 0)
    no_tag.steps[-1].action = "search"
    assert answer_span(no_tag, tok.decode) is None

    def advantages(method: str):
        keys = method_overrides(method, group_size=4, baseline_advantage="grpo")
        trainer = make_trainer(make_cfg(tmp_path, group_size=4, **keys), world, tiny,
                               reward_fn=None)
        trainer.score(group)
        est, _ = trainer.estimate(group)
        return est

    def on(t, a, where):   # the advantages on one kind of token, as a set
        spans = {"answer": [answer_span(t, tok.decode)],
                 "searches": [(s.start, s.end) for s in t.steps if s.action == "search"],
                 "retrieved": [(s.info_start, s.info_end) for s in t.steps
                               if s.info_start is not None]}[where]
        return {round(float(x), 3) for lo, hi in spans for x in a[lo:hi]}

    alone = advantages("answer")
    assert alone.diagnostics["answer_token_share"] > 0
    for t, a in zip(group, alone.advantages):
        assert on(t, a, "searches") == {0.0} and on(t, a, "retrieved") == {0.0}
        assert on(t, a, "answer") == {0.866 if t.answer == "paris" else -0.866}
        assert a[t.steps[-1].start] == 0.0   # the turn's thought, before the tag
    # scores 1.35, 0.6, 1.6, 0.35 (outcome + format 0.1 + hops 0.25 or 0.5): both parts over
    # the scores' deviation 0.595, the hop bonus's -+0.125 stays a quarter of the outcome's
    both = advantages("hops_answer")
    plain = advantages("hops")   # the same scores, the whole advantage on every token
    hop = {1: -0.21, 2: 0.21}
    for t, a, whole in zip(group, both.advantages, plain.advantages):
        assert on(t, a, "searches") == {hop[t.n_searches]} and on(t, a, "retrieved") == {0.0}
        assert on(t, a, "answer") == {round(hop[t.n_searches] + (0.84 if t.answer == "paris"
                                                                 else -0.84), 3)}
        assert on(t, a, "answer") == on(t, whole, "searches") == on(t, whole, "answer")
    for over in ({"algo.advantage": "gigpo"}, {"reward.process": {"evidence": 1.0}}):
        with pytest.raises(ConfigError, match="algo.answer_credit"):
            check_config(make_cfg(tmp_path, **{"algo.answer_credit": True, **over}))

    # a reward function's own parts: its outcome, kept at scoring, on the answer; the rest
    # (a bonus for two searches) everywhere. Scores 1, 0.5, 1.5, 0 (deviation 0.645)
    def custom(t):
        right = float(t.answer == "paris")
        return RewardParts(total=right + 0.5 * (t.n_searches == 2), outcome=right,
                           format=0.0, penalty=0.0)

    def with_custom(split: bool):
        cfg = make_cfg(tmp_path, group_size=4, **{"algo.advantage": "grpo",
                                                 "algo.answer_credit": split})
        if split:   # said: the split needs outcome to be the answer's part of total
            with pytest.warns(UserWarning, match="answer's own part of total"):
                trainer = make_trainer(cfg, world, tiny, reward_fn=custom)
        else:
            trainer = make_trainer(cfg, world, tiny, reward_fn=custom)
        trainer.score(group)

        def scored_again(t):   # the split reads the parts kept at scoring
            raise AssertionError("the reward function ran again after scoring")

        trainer.reward_fn = scored_again
        return trainer.estimate(group)[0]

    split, whole_custom = with_custom(True), with_custom(False)
    assert [t.outcome_part for t in group] == [1.0, 0.0, 1.0, 0.0]
    for t, a, whole in zip(group, split.advantages, whole_custom.advantages):
        assert on(t, a, "searches") == {0.387 if t.n_searches == 2 else -0.387}
        assert on(t, a, "answer") == on(t, whole, "answer") == on(t, whole, "searches")
        assert on(t, a, "retrieved") == {0.0}

    # a right and a wrong episode of equal turns and hops: their rests (format 0.1 + hops
    # 0.5 - 3 turns x 0.2) come out 0 and -1.1e-16 in float64, a difference float32 keeps
    # and that is not one: the searches get exactly nothing
    pair = [episode(2, "paris", 0), episode(2, "rome", 1)]
    trainer = make_trainer(make_cfg(tmp_path, group_size=2, **{
        **method_overrides("hops_answer", group_size=2, baseline_advantage="grpo"),
        "algo.epsilon": 0.0, "reward.turn_cost": 0.2}), world, tiny, reward_fn=None)
    trainer.score(pair)
    est, _ = trainer.estimate(pair)
    assert all(float(x) == 0.0 for t, a in zip(pair, est.advantages)
               for s in t.steps if s.action == "search" for x in a[s.start:s.end])

    # the tag `parse_action` reads: not one inside the model's own <information> block
    own = episode(1, "paris", 0)
    turn = own.steps[-1]
    text = "<information> <answer> junk </information><answer> paris </answer>"
    own.token_ids[turn.start:] = enc(text)
    own.loss_mask[turn.start:] = [1] * (len(own.token_ids) - turn.start)
    turn.end, turn.text = len(own.token_ids), text
    lo, hi = answer_span(own, tok.decode)
    assert tok.decode(own.token_ids[lo:hi]).strip() == "paris </answer>"


def test_the_plan_bonus_pays_for_keeping_the_episode_s_own_plan(world, tiny, tmp_path):
    """`reward.plan_bonus` (the `plan` method): the lookups the first thought plans are the
    target, not the data's hop count; a bridge answered after one lookup of a two-lookup
    plan earns half, a single-hop question planned at one lookup earns all of it for
    stopping; an episode that states no plan earns none; the trainer reads it."""
    from hypothesis import given
    from hypothesis import strategies as st

    from seekrl.agent.oracle import PLAN_LEAD
    from seekrl.agent.trajectory import Step, Trajectory
    from seekrl.rewards.outcome import plan_match
    from seekrl.rl.methods import method_overrides

    def episode(searches: int, planned, hops=None) -> Trajectory:
        lead = "" if planned is None else f"{PLAN_LEAD}{planned} lookups. "
        n = searches + 1
        steps = [Step(i, i + 1, "search", text=(f"<think> {lead}</think> " if i == 1 else "")
                      + "<search> q </search>", hits=["x"], info_start=i + 1, info_end=i + 1)
                 for i in range(1, n)]
        steps.append(Step(n, n + 1, "answer", text=("" if searches else f"<think> {lead}</think> ")
                          + "<answer> rome </answer>", answer="rome"))
        return Trajectory("q", "g", "?", ["Paris"], list(range(n + 1)), [0] + [1] * n, 1,
                          steps=steps, answer="rome", finish_reason="answer",
                          metadata={} if hops is None else {"hops": hops})

    assert episode(2, 2).planned_lookups == 2 and episode(0, 1).planned_lookups == 1
    # a number past int()'s digit limit is no plan (it had raised ValueError in scoring)
    assert episode(1, "9" * 5000).planned_lookups is None
    assert [plan_match(episode(k, 1)) for k in (0, 1, 2, 3)] == [0.0, 1.0, 0.0, 0.0]
    assert [plan_match(episode(k, 2)) for k in (1, 2, 3, 4)] == [0.5, 1.0, 0.5, 0.0]
    assert [plan_match(episode(k, 0)) for k in (0, 1)] == [1.0, 0.0]
    assert plan_match(episode(2, None, hops=2)) is None   # no plan: the hops don't stand in
    # the plan, not the question's hops, is the target
    assert plan_match(episode(1, 1, hops=2)) == 1.0
    both = episode(1, 2)   # one search of two sub-queries is two lookups
    both.steps[0].sub_queries = ["a", "b"]
    assert plan_match(both) == 1.0
    parts = episode_reward(episode(1, 2), format_reward=0.1, plan_bonus=0.5)
    assert (parts.plan, parts.total, parts.hops) == (0.25, pytest.approx(0.35), 0.0)
    assert episode_reward(episode(2, 2, hops=2), plan_bonus=0.5, hop_bonus=0.5).total == 1.0
    assert episode_reward(episode(2, None), plan_bonus=0.5).plan == 0.0
    assert episode_reward(episode(2, 2)).plan == 0.0   # off by default

    @given(st.integers(0, 8), st.integers(1, 4))
    def bounded_and_best_at_the_plan(searches, planned):
        m = plan_match(episode(searches, planned))
        assert 0.0 <= m <= 1.0 and (m == 1.0) == (searches == planned)

    bounded_and_best_at_the_plan()
    keys = method_overrides("plan", group_size=2, baseline_advantage="dr_grpo")
    assert keys == {"algo.advantage": "dr_grpo", "reward.plan_bonus": 0.5}
    trainer = make_trainer(make_cfg(tmp_path, **keys), world, tiny, reward_fn=None)
    assert trainer.reward_fn(episode(1, 2)).plan == 0.25


def test_a_bonus_that_cannot_act_is_warned_about(world, tiny, tmp_path, monkeypatch):
    """`hops` on questions without an integer `metadata.hops` (or `recall` without gold
    documents) would train outcome-only without saying so: the trainer warns, counting the
    questions; with the data's hops, nothing. A reward function of your own (reward.fn or
    Trainer(reward_fn=)) replaces the bonuses: warned too."""
    import dataclasses
    import warnings as w

    from seekrl.recipes.train_checks import bonus_coverage, check_config

    questions = world["train"]
    assert all(isinstance(q.metadata.get("hops"), int) for q in questions)
    hops, recall = (make_cfg(tmp_path, **{f"reward.{k}": 0.5})
                    for k in ("hop_bonus", "recall_bonus"))
    assert bonus_coverage(hops.reward, questions) is None
    assert bonus_coverage(recall.reward, questions) is None
    bare = [dataclasses.replace(q, metadata={}) for q in questions]
    half = bare[:3] + [dataclasses.replace(q, metadata={**q.metadata, "hops": "2"})
                       for q in questions[3:5]] + questions[5:]
    assert "no training question has an integer metadata.hops" in bonus_coverage(hops.reward,
                                                                                  bare)
    why = bonus_coverage(hops.reward, half)
    assert f"5 of {len(half)} training questions (e.g. {half[0].id!r}) lack" in why
    assert "gold documents" in bonus_coverage(recall.reward, bare)
    assert bonus_coverage(make_cfg(tmp_path).reward, bare) is None       # no bonus set
    assert "reward.hop_bonus set with a reward function of your own" in bonus_coverage(
        hops.reward, questions, custom=True)
    assert bonus_coverage(make_cfg(tmp_path).reward, questions, custom=True) is None
    with pytest.warns(UserWarning, match="no training question has an integer"):
        Trainer(hops, model=copy.deepcopy(tiny[0]), tokenizer=tiny[1],
                retriever=world["index"], questions=bare, overwrite=True).close()
    with w.catch_warnings(record=True) as caught:
        w.simplefilter("always")
        Trainer(hops, model=copy.deepcopy(tiny[0]), tokenizer=tiny[1],
                retriever=world["index"], questions=questions, overwrite=True).close()
    assert not [str(c.message) for c in caught if str(c.message).startswith("reward.")]
    monkeypatch.setattr("seekrl.recipes.train_checks.load_reward_fn", lambda path: None)
    with pytest.warns(UserWarning, match="reward.hop_bonus set with reward.fn"):
        check_config(make_cfg(tmp_path, **{"reward.hop_bonus": 0.5, "reward.fn": "m:f"}))


@pytest.mark.parametrize("process", ["evidence", "gold_found"])
def test_the_recall_bonus_stacked_on_evidence_step_rewards_is_warned_about(tmp_path, process):
    """Each search's gold finds, summed over an episode, are its recall: with both, a
    found document is paid twice."""
    import warnings as w

    from seekrl.recipes.train_checks import check_config

    both = make_cfg(tmp_path, **{"reward.recall_bonus": 0.5, "algo.advantage": "dual_granularity",
                                 f"reward.process.{process}": 1.0})
    with pytest.warns(UserWarning, match=f"recall_bonus 0.5 with reward.process {process}: both "
                                         "pay for the gold documents"):
        check_config(both)
    for alone in ({"reward.recall_bonus": 0.5},
                  {"algo.advantage": "dual_granularity", f"reward.process.{process}": 1.0},
                  {"reward.recall_bonus": 0.5, "algo.advantage": "dual_granularity",
                   f"reward.process.{process}": 0.0, "reward.process.redundancy": 0.2}):
        with w.catch_warnings(record=True) as caught:
            w.simplefilter("always")
            check_config(make_cfg(tmp_path, **alone))
        assert not [c for c in caught if "counts twice" in str(c.message)]


def test_a_plan_bonus_no_episode_can_earn_is_warned_about_once(world, tiny, tmp_path):
    """`plan_bonus` reads the plan the policy states, which the questions cannot show
    before the run: a policy that states none (a model never warmed up on seekrl's data)
    trained on the outcome alone without saying so. The first step's episodes tell."""
    import types
    import warnings as w

    from seekrl.recipes.train_checks import plan_coverage

    cfg = make_cfg(tmp_path, **{"reward.plan_bonus": 0.5})
    plain, planned = (types.SimpleNamespace(planned_lookups=p) for p in (None, 2))
    why = plan_coverage(cfg.reward, [plain, plain], 1)
    assert "reward.plan_bonus 0.5: none of step 1's 2 episodes states a plan" in why
    assert "'To answer this I need 'N lookups" in why
    assert plan_coverage(cfg.reward, [plain, planned], 1) is None      # one states it
    assert plan_coverage(cfg.reward, [plain], 1, custom=True) is None  # a reward of your own
    assert plan_coverage(make_cfg(tmp_path).reward, [plain], 1) is None   # no bonus set
    trainer = make_trainer(cfg, world, tiny, reward_fn=None)   # a random model plans nothing
    with pytest.warns(UserWarning, match="none of step 1's .* episodes states a plan"):
        trainer.step(1)
    with w.catch_warnings(record=True) as caught:
        w.simplefilter("always")
        trainer.step(2)                            # said once, not every step
    assert not [c for c in caught if "plan_bonus" in str(c.message)]
    trainer.close()


def test_a_trainer_closes_its_log_when_closed_or_when_training_fails(world, tiny, tmp_path,
                                                                     monkeypatch):
    """A trainer built and never trained (or stepped by hand) closes its metrics log with
    `close()` or a `with` block; a run that raises closes it too, keeping what it wrote."""
    with make_trainer(make_cfg(tmp_path / "a"), world, tiny) as trainer:
        trainer.step(1)
        assert not trainer.log._file.closed
    assert trainer.log._file.closed
    trainer.close()   # twice is fine
    boom = make_trainer(make_cfg(tmp_path / "b", steps=3), world, tiny)
    real, calls = boom.step, []

    def step(n, *a, **k):
        calls.append(n)
        if n == 2:
            raise RuntimeError("out of memory")
        return real(n, *a, **k)

    monkeypatch.setattr(boom, "step", step)
    with pytest.raises(RuntimeError, match="out of memory"):
        boom.train()
    assert calls == [1, 2] and boom.log._file.closed
    steps = [json.loads(line)["step"] for line in (boom.out / "metrics.jsonl").open()]
    assert 1 in steps


def test_dtype_is_checked_when_the_config_loads():
    """`dtype=float8` passed --print-config and failed only in load_policy, minutes later."""
    from seekrl.config import DTYPE_NAMES, SFTConfig
    from seekrl.models import DTYPES, MIXED

    assert set(DTYPE_NAMES) == set(DTYPES) | set(MIXED)
    for cls, extra in ((TrainConfig, {"data": "t.jsonl"}), (SFTConfig, {"data": "d.jsonl"})):
        with pytest.raises(ValueError, match="(?s)dtype.*expected one of float32"):
            cls(dtype="float8", **extra)
        assert cls(dtype="bf16-mixed", **extra).dtype == "bf16-mixed"


def test_resume_and_overwrite_together_are_refused(tmp_path):
    """As SFT and the PRM refuse them: with a checkpoint present `overwrite` was ignored
    unsaid."""
    from seekrl.recipes.train import Trainer

    cfg = TrainConfig(data=str(tmp_path / "t.jsonl"), out=str(tmp_path / "run"))
    with pytest.raises(ConfigError, match="--resume and --overwrite"):
        Trainer(cfg, resume=True, overwrite=True)


def test_a_group_of_one_is_refused_where_the_estimator_needs_a_group(world, tiny, tmp_path):
    from seekrl.recipes.train import check_config

    for name in ("grpo", "dr_grpo", "rloo", "gigpo"):
        with pytest.raises(ConfigError, match="group_size: 1 with algo.advantage"):
            check_config(make_cfg(tmp_path, group_size=1, **{"algo.advantage": name}))
    # estimators with a baseline of their own take single episodes
    for name in ("gae", "reinforce_pp"):
        check_config(make_cfg(tmp_path, group_size=1, **{"algo.advantage": name,
                                                         "algo.kl_in_reward": name == "gae"}))


def test_the_step_logs_its_updates_and_lookups_by_question_kind(world, tiny, tmp_path):
    """`updates` counts the optimizer steps (epochs x mini-batches); lookups_by_kind says,
    per question kind, the searches made and planned, so the hop decision can be read."""
    cfg = make_cfg(tmp_path, **{"algo.mini_batch_size": 2, "algo.epochs": 2})
    record = make_trainer(cfg, world, tiny).step(1)
    assert record["updates"] == 2 * (2 * 2 // 2)
    kinds = record["lookups_by_kind"]
    assert sum(k["n"] for k in kinds.values()) == record["episodes"]
    for row in kinds.values():
        assert set(row) == {"planned", "made", "one", "em", "n", "n_planned"}
        assert 0 <= row["one"] <= 1


def test_planned_lookups_are_read_from_the_first_thought():
    from seekrl.agent.trajectory import Step, Trajectory
    from seekrl.rl.step_metrics import lookups_by_kind

    def episode(text, searches, hops):
        steps = [Step(1, 2, "search", text=text)] + \
            [Step(2, 3, "search") for _ in range(searches - 1)] + [Step(3, 4, "answer")]
        return Trajectory("q", "q", "?", ["x"], [1, 2, 3, 4], [0, 1, 1, 1], 1, steps=steps,
                          metadata={"type": "bridge", "hops": hops})

    planned = episode("<think> To answer this I need 2 lookups. First ...", 2, 2)
    unplanned = episode("<think> Let me search.", 1, 2)
    assert planned.planned_lookups == 2 and unplanned.planned_lookups is None
    row = lookups_by_kind([planned, unplanned])["bridge-2"]
    assert row == {"planned": 2.0, "made": 1.5, "one": 0.5, "em": 0.0, "n": 2,
                   "n_planned": 1}


def test_the_step_line_shows_lookups_by_kind():
    from seekrl.rl.step_metrics import lookups_line, step_line

    rows = {"single-1": {"made": 1.0, "planned": None}, "bridge-2": {"made": 1.75, "planned": 2.0},
            "comparison-2": {"made": None, "planned": 2.0}}
    assert lookups_line(rows) == "\n  lookups made/planned: bridge-2 1.8/2.0  single-1 1.0"
    assert lookups_line({}) == lookups_line(None) == lookups_line({"x": {"made": None}}) == ""
    line = step_line({"step": 2, "lookups_by_kind": rows}, 4, 10.0)
    assert line.splitlines()[0].startswith("step 2/4") and "bridge-2 1.8/2.0" in line


def test_a_dev_evaluation_can_also_sample_for_pass_at_k(world, tiny, tmp_path):
    cfg = make_cfg(tmp_path, steps=1, save_every=0, **{"rollout.temperature": 1.0}, eval={
        "data": str(world["paths"]["test"]), "n": 2, "at_start": False, "max_turns": 1,
        "max_new_tokens": 4, "samples": 2})
    summary = make_trainer(cfg, world, tiny).train()
    dev = summary["dev"]
    assert {"sampled_em", "pass@2", "one_search", "planned_lookups", "by_type"} <= set(dev)
    assert 0 <= dev["sampled_em"] <= dev["pass@2"] <= 1
    assert (tmp_path / "run" / "eval" / "final" / "sampled" / "metrics.json").is_file()
    # the evaluation's own metrics.json holds the sampled summary too (it was written before)
    written = json.loads((tmp_path / "run" / "eval" / "final" / "metrics.json").read_text())
    assert set(written["sampled"]) >= {"em", "pass@2"}
    logged = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any("dev_pass@2" in r for r in logged)


def test_a_step_says_what_it_does_before_it_ends(world, tiny, tmp_path):
    """A first step of minutes printed nothing until it ended: the rollouts show a bar, and
    the update is announced with its number of optimizer steps."""
    import io

    from rich.console import Console

    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=120)
    cfg = make_cfg(tmp_path, **{"algo.mini_batch_size": 2, "algo.epochs": 2})
    make_trainer(cfg, world, tiny, console=console).train()
    text = out.getvalue()
    assert "step 1 rollouts" in text
    assert "step 1: 4 episodes in" in text and "(4 optimizer steps)" in text


def test_the_policy_loss_is_chosen_by_name(world, tiny, tmp_path, monkeypatch):
    from seekrl.recipes.train import check_config
    from seekrl.rl.loss import POLICY_LOSSES, policy_loss

    assert POLICY_LOSSES["ppo_clip"] is policy_loss
    with pytest.raises(ConfigError, match="algo.policy_loss: expected one of ppo_clip"):
        check_config(make_cfg(tmp_path, **{"algo.policy_loss": "nosuch"}))
    seen = []

    def mine(*a, **k):
        seen.append(1)
        return policy_loss(*a, **k)

    monkeypatch.setitem(POLICY_LOSSES, "mine", mine)
    make_trainer(make_cfg(tmp_path, **{"algo.policy_loss": "mine"}), world, tiny).step(1)
    assert seen   # every micro-batch's loss came from the named function


def test_a_save_after_a_killed_runs_later_steps_keeps_itself(world, tiny, tmp_path):
    """A killed run can leave step-M renamed into place but never named by latest; the
    resumed run's next save must not count it among the newest and prune itself."""
    cfg = make_cfg(tmp_path, save_every=1, keep_last=1)
    trainer = make_trainer(cfg, world, tiny)
    ckpt = tmp_path / "run" / "checkpoints"
    trainer.save_checkpoint(1)
    (ckpt / "step-5").mkdir()   # the killed run's, past latest
    trainer.save_checkpoint(2)
    assert sorted(p.name for p in ckpt.glob("step-*")) == ["step-2"]
    assert (ckpt / "latest").read_text().strip() == "step-2"


def test_a_checkpoint_without_the_counters_a_resume_reads_is_refused(world, tiny, tmp_path):
    cfg = make_cfg(tmp_path, steps=2, save_every=1)
    make_trainer(cfg, world, tiny).train(until=1)
    meta_path = tmp_path / "run" / "checkpoints" / "step-1" / "trainer.json"
    meta = json.loads(meta_path.read_text())
    del meta["questions_planned"]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match="trainer.json lacks questions_planned"):
        make_trainer(cfg, world, tiny, resume=True)


def test_eval_index_evaluates_on_another_corpus_than_the_rollouts(world, tiny, tmp_path,
                                                                   monkeypatch):
    """Rollouts search the run's index; with `eval.index`, the evaluations search that one
    (dev questions of another world), and the world check pairs each file with its index."""
    from seekrl.data.world import world_corpus
    from seekrl.recipes.train_checks import check_start
    from seekrl.retrieval.base import RetrievalError

    _, other, other_index = build_world_and_index(tmp_path / "other", seed=5, entities=200,
                                                  n_train=4, n_dev=4, n_test=4)
    ev = {"data": str(other["dev"]), "n": 2, "max_turns": 1, "max_new_tokens": 4}
    checks = dict(scorer_given=False, resume=False, overwrite=True, processes=1, main=True,
                  model_given=True)
    # the run's index serves its training questions' world, not the dev questions'
    mixed = make_cfg(tmp_path / "a", index=str(world["index_dir"]),
                     data=str(world["paths"]["train"]), eval=ev)
    with pytest.raises(RetrievalError, match=r"^eval.data .* holds another world's questions "
                       r"than data .*: set eval.index to an index built from .*other"):
        check_start(mixed, **checks)
    # eval.index of the wrong world, and eval.index with nothing to evaluate
    with pytest.raises(RetrievalError, match=r"^eval.index: index .* another corpus"):
        check_start(make_cfg(tmp_path / "w", eval={**ev, "index": str(world["index_dir"])}),
                    **checks)
    with pytest.raises(ConfigError, match=r"^eval.index: nothing searches it without "
                                          r"eval.data"):
        check_start(make_cfg(tmp_path / "n", eval={"index": str(other_index)}), **checks)
    paired = make_cfg(tmp_path / "b", index=str(world["index_dir"]),
                      data=str(world["paths"]["train"]), eval={**ev, "index": str(other_index)})
    check_start(paired, **checks)
    # and the other way round: the training questions meet the run's index
    with pytest.raises(RetrievalError, match=r"^index .* another corpus"):
        check_start(make_cfg(tmp_path / "c", index=str(other_index),
                             data=str(world["paths"]["train"]),
                             eval={**ev, "index": str(other_index)}), **checks)

    trainer = make_trainer(paired, world, tiny)
    assert trainer.env.retriever is world["index"]
    first = json.loads(world_corpus(str(other["dev"])).read_text().splitlines()[0])
    title = first["contents"].split("\n", 1)[0]
    hit = trainer.env.eval_retriever.search([title], 1)[0][0]
    assert hit.contents == first["contents"]        # the other world's document
    assert all(h.contents != first["contents"] for h in world["index"].search([title], 5)[0])
    import seekrl.recipes.train as train_module

    searched = []

    def spy(model, tok, retriever, *a, **k):
        searched.append(retriever)
        return real(model, tok, retriever, *a, **k)

    real = train_module.eval_policy
    monkeypatch.setattr(train_module, "eval_policy", spy)
    summary = trainer.train()
    assert summary["dev"]["questions"] == 2
    assert searched and all(r is trainer.env.eval_retriever for r in searched)   # start, final


def test_a_query_ranker_shared_with_eval_index_stays_bound_to_the_rollouts_index(
        world, tmp_path, monkeypatch):
    """A query encoder binds to the index it searches, and its training reads the bound
    index's vectors: with `eval.index` the evaluations get their own retriever around the
    same ranker, and the rollouts' binding is the one left, at the start and after a resume
    loads the saved ranker. Only the main process opens eval.index."""
    from types import SimpleNamespace

    import seekrl.recipes.environment as environment
    import seekrl.retrieval.ranker as ranker_module

    class Encoder:
        bound = None

        def bind(self, first):
            self.bound = first

    class Ranked:   # binds as QueryEncoderRetriever does, whenever its ranker is set
        def __init__(self, first, ranker, candidates=10, *, keep_candidates=False):
            self.first = first
            self.ranker = ranker

        @property
        def ranker(self):
            return self._ranker

        @ranker.setter
        def ranker(self, ranker):
            ranker.bind(self.first)
            self._ranker = ranker

    class Updater:
        def __init__(self, *a, **k):
            pass

        def load_state_dict(self, state):
            pass

    monkeypatch.setattr(ranker_module, "load_ranker", lambda *a, **k: Encoder())
    monkeypatch.setattr(ranker_module, "ranked_retriever", Ranked)
    monkeypatch.setattr(ranker_module, "RankerUpdater", Updater)
    monkeypatch.setattr(environment, "open_index", lambda index, what, retriever=None:
                        f"opened {index}")
    cfg = make_cfg(tmp_path, ranker={"model": "m", "kind": "query"},
                   eval={"data": str(world["paths"]["dev"]), "index": "E"})
    env = SearchEnvironment(cfg, "rollouts' index", dist=SimpleNamespace(main=True),
                            device="cpu")
    assert env.eval_retriever.first == "opened E"
    assert env.eval_retriever.ranker is env.retriever.ranker
    assert env.retriever.ranker.bound == "rollouts' index"
    (tmp_path / "ck" / "ranker").mkdir(parents=True)
    torch.save({}, tmp_path / "ck" / "ranker" / "updater.pt")
    env.load(tmp_path / "ck")
    assert env.eval_retriever.ranker is env.retriever.ranker
    assert env.retriever.ranker.bound == "rollouts' index"
    other = SearchEnvironment(cfg, "rollouts' index", dist=SimpleNamespace(main=False),
                              device="cpu")
    assert other.eval_retriever is None and other.retriever.ranker.bound == "rollouts' index"
    other.load(tmp_path / "ck")


def test_a_start_trained_on_the_rl_questions_is_warned_about(world, tiny, tmp_path):
    """RL from a checkpoint of an SFT run whose data holds episodes of most of RL's questions,
    trained for half a pass or more: a warning at the start naming both, before anything
    trains, and not again on a resume. Other questions, a short warm-up, a model that is
    not an SFT run's (an RL or refine run's final/, a hub id): no warning."""
    import warnings as w

    from seekrl.config import RefineConfig, SFTConfig, dump_config
    from seekrl.recipes.train_checks import learned_questions

    questions = world["train"]
    run = tmp_path / "sft"
    (run / "final").mkdir(parents=True)
    (run / "checkpoints" / "step-2").mkdir(parents=True)
    episodes = run / "episodes.jsonl"
    episodes.write_text("".join(json.dumps({"question": "  " + q.question.upper(), "turns": []})
                                + "\n" for q in questions[:12]) + "not json\n")

    def sft(**keys):   # the run's config as `seekrl sft` writes it: 2 x 2 episodes a step
        dump_config(SFTConfig(data=str(episodes), batch_size=2, grad_accum=2, **keys),
                    run / "config.yaml")

    final = str(run / "final")
    sft(max_steps=3)   # 12 episodes of 12: one pass
    why = learned_questions(final, questions)
    assert why.startswith(f"12 of {len(questions)} training questions are in {episodes}, "
                          f"which the start {final} was fine-tuned on for 1.0 passes")
    assert "train RL on other questions" in why
    assert learned_questions(str(run / "checkpoints" / "step-2"), questions) is not None
    assert learned_questions(final, questions[12:]) is None      # none of them
    sft(max_steps=1)   # a short warm-up over the same questions has not learned them
    assert learned_questions(final, questions) is None            # 4 of 12: 0.33 passes
    sft(max_steps=None, epochs=2)
    assert "for 2.0 passes" in learned_questions(final, questions)
    sft(max_steps=3, limit=4)   # trained on its first 4 episodes only: 3 passes over them,
    assert learned_questions(final, questions) is None            # 4 of 16 questions
    # a file read in part: the rest is estimated from its size (about 13 records, not the
    # 4 read), so 3 steps x 4 over it are about one pass, not three
    sft(max_steps=3)
    part = learned_questions(final, questions[:4], limit=len(episodes.read_bytes()) // 3)
    passes = float(re.search(r"for ([\d.]+) passes", part).group(1))
    assert 0.8 <= passes <= 1.3, part
    assert learned_questions(str(run), questions) is None          # no config beside it
    assert learned_questions("smollm2-135m", questions) is None
    for other in (make_cfg(tmp_path / "x", data=str(episodes)),
                  RefineConfig(data=str(episodes), method="step_dpo")):
        dump_config(other, run / "config.yaml")                   # an RL or refine run's
        assert learned_questions(final, questions) is None
    sft(max_steps=3)
    # a run saved on a GPU machine reads on this one too
    (run / "config.yaml").write_text((run / "config.yaml").read_text()
                                     .replace("device: cpu", "device: cuda:7"))
    assert "device: cuda:7" in (run / "config.yaml").read_text()
    assert learned_questions(final, questions) is not None
    cfg = make_cfg(tmp_path / "rl", model=final)
    with pytest.warns(UserWarning, match="training questions are in"):
        make_trainer(cfg, world, tiny).train()
    for resume, folder in ((True, "rl"), (False, "rl2")):
        with w.catch_warnings(record=True) as caught:
            w.simplefilter("always")
            make_trainer(make_cfg(tmp_path / folder, model=final if resume else "smollm2-135m",
                                  steps=2), world, tiny, resume=resume)
        assert not [c for c in caught if "training questions are in" in str(c.message)]


@pytest.mark.parametrize("train_layers, adapted", [(None, {0, 1, 2}), (1, {2}), (2, {1, 2})])
def test_lora_adapters_go_in_the_top_train_layers_blocks(train_layers, adapted):
    """`train_layers` with LoRA: adapters in the top blocks only (peft over every block
    froze the model again and undid `train_layers`), and only adapters train."""
    from seekrl.config.schema import LoRAConfig
    from seekrl.recipes.setup import prepare_trainable

    model = prepare_trainable(tiny_policy(layers=3)[0], train_layers,
                              LoRAConfig(enabled=True, r=2))
    trained = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in n for n in trained)
    assert {int(re.search(r"layers\.(\d+)\.", n).group(1)) for n in trained} == adapted
    with pytest.raises(ValueError, match=r"train_layers: expected 1..3"):
        prepare_trainable(tiny_policy(layers=3)[0], 4, LoRAConfig(enabled=True))


def test_train_layers_trains_the_final_norm_of_every_family():
    """The top blocks "and the final norm": only a module named `norm` was found, so
    GPT-2's `ln_f` stayed frozen."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from seekrl.models import tiny_policy
    from seekrl.recipes.setup import train_top_layers

    gpt2 = train_top_layers(GPT2LMHeadModel(GPT2Config(
        vocab_size=50, n_positions=16, n_embd=32, n_layer=3, n_head=2)), 1)
    assert all(p.requires_grad for p in gpt2.transformer.ln_f.parameters())
    assert all(p.requires_grad for p in gpt2.transformer.h[2].parameters())
    assert not any(p.requires_grad for p in gpt2.transformer.h[0].parameters())
    llama = train_top_layers(copy.deepcopy(tiny_policy(seed=0)[0]), 1)
    assert llama.model.norm.weight.requires_grad
    assert not llama.model.embed_tokens.weight.requires_grad
