"""PRM-guided refinement: what RFT keeps, step-DPO's loss touches only the differing step,
and both recipes end in a checkpoint."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import replace

import pytest
import torch

from seekrl.config import LabelConfig, RefineConfig
from seekrl.rl.mcts import run_labelling, step_key
from seekrl.rl.refine import keep_for_rft, run_refine, step_dpo_loss, step_logps, step_mask
from tests.test_mcts import OPTIONS, Dice, dice_engine, questions
from tests.test_rollout import Docs


@pytest.fixture(scope="module")
def episodes(tiny):
    _, tok = tiny
    return dice_engine(tok, seed=5).run(questions(16))


def test_keep_for_rft_rules(episodes):
    outcomes = [1.0 if t.answer == "Tarrow" else 0.0 for t in episodes]
    scores = [[0.9] * len(t.steps) for t in episodes]
    kept, why = keep_for_rft(episodes, outcomes, scores, min_outcome=1.0, threshold=0.5,
                             max_per_question=2)
    assert all(t.answer == "Tarrow" and t.valid_format for t in kept)
    assert why["wrong"] == sum(o < 1 for o in outcomes)
    assert len(kept) + sum(why.values()) == len(episodes)
    low = [[0.9] * (len(t.steps) - 1) + [0.1] for t in episodes]   # the last step scored low
    kept_low, why_low = keep_for_rft(episodes, outcomes, low, min_outcome=1.0, threshold=0.5,
                                     max_per_question=2)
    assert kept_low == [] and why_low["low_step_score"] == len(kept)
    # the same episode twice counts once; a question gives at most max_per_question
    doubled, why2 = keep_for_rft(kept + kept, [1.0] * 2 * len(kept), None, min_outcome=1.0,
                                 threshold=0.5, max_per_question=1)
    assert len(doubled) == len({t.example_id for t in kept})
    assert why2["duplicate"] + why2["question_full"] == 2 * len(kept) - len(doubled)


def test_step_dpo_touches_only_the_differing_step(tiny, episodes, monkeypatch):
    """Through the recipe's own `step_logps`: the DPO loss's gradient on every token's
    log-prob is zero outside the differing step (here step 1, so the steps before it are
    checked too) and non-zero on each of its generated tokens."""
    import seekrl.rl.refine as refine

    model, tok = tiny
    two = [t for t in episodes if len(t.steps) >= 2][:2]
    assert len(two) == 2
    better, worse = two
    idx = [0, 0]
    grids = []
    real = refine.masked_logprobs

    def leaf_grid(*args, **kwargs):   # the per-token log-probs as a leaf we can read back
        out = real(*args, **kwargs)
        grids.append(out["logprobs"].detach().requires_grad_(True))
        return {**out, "logprobs": grids[-1]}

    monkeypatch.setattr(refine, "masked_logprobs", leaf_grid)
    pb = step_logps(model, [better], [1], tok.pad_token_id, "cpu")
    pw = step_logps(model, [worse], [1], tok.pad_token_id, "cpu")
    loss, _ = step_dpo_loss(pb, pw, torch.zeros(1), torch.zeros(1), beta=0.5)
    loss.backward()
    for traj, grid in zip((better, worse), grids):
        s = traj.steps[1]
        touched = set(torch.nonzero(grid.grad[0]).flatten().tolist())
        assert touched == {i for i in range(s.start, s.end) if traj.loss_mask[i]}
        assert touched and min(touched) > traj.steps[0].end - 1   # step 0 untouched
    monkeypatch.undo()
    assert sum(step_mask(better, 0)) == better.steps[0].end - better.steps[0].start
    # the episode after the step does not change its step log-likelihood
    cut = better.steps[0].end
    other_tail = replace(better, token_ids=better.token_ids[:cut] + [5, 6, 7] * 4,
                         loss_mask=better.loss_mask[:cut] + [1] * 12)
    a = step_logps(model, [better, worse], idx, tok.pad_token_id, "cpu")
    b = step_logps(model, [other_tail, worse], idx, tok.pad_token_id, "cpu")
    assert torch.allclose(a, b, atol=1e-5)
    # and the loss is the textbook one at a known point
    loss, stats = step_dpo_loss(torch.tensor([2.0]), torch.tensor([0.0]), torch.tensor([1.0]),
                                torch.tensor([0.0]), beta=1.0)
    assert float(loss) == pytest.approx(-torch.nn.functional.logsigmoid(torch.tensor(1.0)).item())
    assert stats["accuracy"] == 1.0


def test_step_dpo_recipe_moves_the_margin(tiny, tmp_path):
    model, tok = tiny
    run_labelling(LabelConfig(data="unused", out=str(tmp_path / "labels"),
                              search={"simulations": 8, "expansions": 4, "min_visits": 1,
                                      "min_gap": 0.1}, rollout={"max_turns": 3}),
                  backend=Dice(tok, OPTIONS), tokenizer=tok, retriever=Docs(),
                  questions=questions(6))
    cfg = RefineConfig(method="step_dpo", pairs=str(tmp_path / "labels"),
                       out=str(tmp_path / "dpo"), steps=6, batch_size=4, beta=0.5,
                       optim={"lr": 1e-3, "warmup_steps": 0, "schedule": "constant"})
    result = run_refine(cfg, model=copy.deepcopy(model), tokenizer=tok)
    assert result["pairs"] > 0 and result["margin"] > 0
    # the reference is the starting policy: at the first update the DPO logits are 0
    first = json.loads((tmp_path / "dpo" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-4)
    assert first["margin"] == pytest.approx(0.0, abs=1e-4)
    # better and worse share every token before the differing step
    from seekrl.rl.prm import read_labels
    for p in read_labels([tmp_path / "labels"]).pairs:
        cut = p.better.steps[p.index].start
        assert p.better.token_ids[:cut] == p.worse.token_ids[:cut]
        assert step_key(p.better.steps[p.index]) != step_key(p.worse.steps[p.index])
    assert (tmp_path / "dpo" / "final" / "config.json").is_file()
    from seekrl.config import ConfigError
    with pytest.raises(ConfigError, match="already holds a run"):
        run_refine(cfg, model=copy.deepcopy(model), tokenizer=tok)
    run_refine(cfg.model_copy(update={"steps": 1}), model=copy.deepcopy(model), tokenizer=tok,
               overwrite=True)
    with pytest.raises(ValueError, match="pairs"):
        run_refine(RefineConfig(method="step_dpo", out=str(tmp_path / "x")), model=model,
                   tokenizer=tok)


def test_rft_recipe_filters_and_finetunes(tiny, tmp_path):
    model, tok = tiny

    class Half:   # a stand-in PRM: every step 0.9, except searches for Noise
        def score_steps(self, trajs):
            return [[0.1 if s.query == "Noise" else 0.9 for s in t.steps] for t in trajs]

    cfg = RefineConfig(method="rft", out=str(tmp_path / "rft"), samples=4, steps=2,
                       batch_size=2, rollout={"max_turns": 3})
    result = run_refine(cfg, model=copy.deepcopy(model), tokenizer=tok,
                        backend=Dice(tok, OPTIONS), retriever=Docs(), questions=questions(4),
                        scorer=Half())
    assert result["sampled"] == 16 and result["kept"] > 0 and result["generated_tokens"] > 0
    from seekrl.agent.trajectory import read_trajectories
    kept = read_trajectories(tmp_path / "rft" / "rft_data.jsonl")
    assert all(t.answer == "Tarrow" and all(s.query != "Noise" for s in t.steps) for t in kept)
    assert (tmp_path / "rft" / "sft" / "final" / "config.json").is_file()
    assert result["final"].endswith("final")


def test_rft_with_zero_steps_writes_rejection_sampled_sft_data_only(tiny, tmp_path):
    model, tok = tiny
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = RefineConfig(method="rft", out=str(tmp_path / "rs"), samples=4, steps=0,
                       rollout={"max_turns": 3})
    result = run_refine(cfg, model=model, tokenizer=tok, backend=Dice(tok, OPTIONS),
                        retriever=Docs(), questions=questions(4))
    from seekrl.agent.trajectory import read_trajectories
    kept = read_trajectories(result["data"])
    assert result["final"] is None and len(kept) == result["kept"] > 0
    assert all(t.answer == "Tarrow" and t.valid_format for t in kept)   # right, well-formed
    assert not (tmp_path / "rs" / "sft").exists()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match="step_dpo needs at least 1 step"):
        RefineConfig(method="step_dpo", steps=0)


def test_quantile_threshold_follows_the_prm_scale():
    from seekrl.rl.refine import quantile_threshold

    outcomes = [1.0, 1.0, 0.0, 1.0]
    scores = [[0.03, 0.04], [0.05], [0.9, 0.9], [0.02, 0.06]]
    # the right episodes' steps: 0.02 0.03 0.04 0.05 0.06; the wrong one's 0.9 never counts
    assert quantile_threshold(outcomes, scores, 1.0, 0.25, default=0.5) == 0.03
    assert quantile_threshold(outcomes, scores, 1.0, 0.0, default=0.5) == 0.02
    assert quantile_threshold([0.0], [[0.1]], 1.0, 0.25, default=0.5) == 0.5
    kept, why = keep_for_rft([], [], [], min_outcome=1.0, threshold=0.03, max_per_question=2)
    assert kept == [] and sum(why.values()) == 0
