"""The process reward model: it reads each step at its last token, batched scoring equals
scoring one prefix at a time, its losses fall on a fixed batch, the quality figures, and the
train -> save -> load -> score round trip on labels from the MCTS."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from seekrl.agent.trajectory import Trajectory
from seekrl.config import LabelConfig, PRMConfig
from seekrl.rl.mcts import run_labelling
from seekrl.rl.prm import (
    LabelSet,
    PairLabel,
    PointLabel,
    PRMScorer,
    ProcessRewardModel,
    auc,
    load_scorer,
    pairwise_loss,
    pointwise_loss,
    prm_metrics,
    read_labels,
    train_prm,
)
from tests.test_mcts import OPTIONS, Dice, dice_engine, questions
from tests.test_rollout import Docs


@pytest.fixture(scope="module")
def episodes(tiny):
    _, tok = tiny
    trajs = [t for t in dice_engine(tok, seed=3).run(questions(8)) if len(t.steps) >= 2]
    assert len(trajs) >= 2      # the seed is fixed: this holds, or the engine changed
    return trajs


def random_prm(model, seed: int = 0) -> ProcessRewardModel:
    prm = ProcessRewardModel(copy.deepcopy(model))
    torch.manual_seed(seed)
    torch.nn.init.normal_(prm.head.weight, std=1.0)
    return prm.eval()


def test_head_reads_the_step_end_token(tiny, episodes):
    model, tok = tiny
    scorer = PRMScorer(random_prm(model), tok)
    t = episodes[0]
    base = scorer.logits([t])[0]
    s0 = t.steps[0]
    after = replace(t, token_ids=list(t.token_ids))
    after.token_ids[s0.end] = (after.token_ids[s0.end] + 7) % len(tok)   # first token after it
    moved = scorer.logits([after])[0]
    assert moved[0] == pytest.approx(base[0], abs=1e-6)      # step 0 never sees what follows
    at_end = replace(t, token_ids=list(t.token_ids))
    at_end.token_ids[s0.end - 1] = (at_end.token_ids[s0.end - 1] + 7) % len(tok)
    assert abs(scorer.logits([at_end])[0][0] - base[0]) > 1e-6  # its own last token counts


def test_batched_scores_equal_one_prefix_at_a_time(tiny, episodes):
    model, tok = tiny
    scorer = PRMScorer(random_prm(model), tok, batch_size=3)
    together = scorer.logits(episodes)
    for t, row in zip(episodes, together):
        assert len(row) == len(t.steps)
        for i, s in enumerate(t.steps):
            prefix = replace(t, token_ids=t.token_ids[:s.end], loss_mask=t.loss_mask[:s.end],
                             steps=t.steps[:i + 1])
            assert scorer.logits([prefix])[0][i] == pytest.approx(row[i], abs=1e-4)


def test_losses_fall_on_a_fixed_batch(tiny, episodes):
    model, tok = tiny
    prm = ProcessRewardModel(copy.deepcopy(model)).train()
    pad = tok.pad_token_id
    points = [PointLabel(t, i, float(i % 2)) for t in episodes for i in range(len(t.steps))]
    pairs = [PairLabel(episodes[0], episodes[1], 0, 1.0)]
    opt = torch.optim.Adam(prm.parameters(), lr=1e-2)
    first = None
    for _ in range(15):
        loss = pointwise_loss(prm, points, pad, "cpu") + pairwise_loss(prm, pairs, pad, "cpu")
        first = float(loss.detach()) if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss.detach()) < 0.7 * first


def test_auc_and_quality_figures(tiny, episodes):
    assert auc([0.1, 0.4, 0.35, 0.8], [False, False, True, True]) == 0.75
    assert auc([0.5, 0.5], [True, False]) == 0.5 and auc([1.0], [True]) is None
    model, tok = tiny

    class Fixed:   # scores: 0.9 on step 0, 0.2 later
        def score_steps(self, trajs):
            return [[0.9] + [0.2] * (len(t.steps) - 1) for t in trajs]

        def logits(self, trajs):
            return self.score_steps(trajs)

    labelled = []
    for t in episodes[:2]:
        t = Trajectory.from_dict(t.to_dict())
        for i, s in enumerate(t.steps):
            s.value = 1.0 if i == 0 else 0.0
        labelled.append(t)
    labels = LabelSet([PointLabel(t, i, t.steps[i].value) for t in labelled
                       for i in range(len(t.steps))], [], labelled)
    m = prm_metrics(Fixed(), labels)
    assert m["auc"] == 1.0 and m["first_error_accuracy"] == 1.0
    assert m["first_error_baseline"] == 0.0      # truth: the second step, in both episodes


def test_train_save_load_score_on_mcts_labels(tiny, tmp_path):
    model, tok = tiny
    summary = run_labelling(
        LabelConfig(data="unused", out=str(tmp_path / "labels"),
                    search={"simulations": 6, "expansions": 3, "min_visits": 1, "min_gap": 0.01},
                    rollout={"max_turns": 3}),
        backend=Dice(tok, OPTIONS), tokenizer=tok, retriever=Docs(), questions=questions(6))
    assert summary["pairs"] > 0
    labels = read_labels([tmp_path / "labels"])
    # MCTS nodes shared by several labelled paths count once
    node_count = sum(1 for _ in open(tmp_path / "labels" / "nodes.jsonl"))
    assert 0 < len(labels.points) <= node_count - 6
    cfg = PRMConfig(labels=str(tmp_path / "labels"), out=str(tmp_path / "prm"), steps=3,
                    batch_size=4, dev_share=0.3)
    result = train_prm(cfg, model=copy.deepcopy(model), tokenizer=tok)
    assert result["train_points"] > 0 and set(result["dev"]) >= {"points", "pairs"}
    scorer = load_scorer(result["final"])
    trajs = [t for t in labels.episodes[:3]]
    scores = scorer.score_steps(trajs)
    assert [len(r) for r in scores] == [len(t.steps) for t in trajs]
    assert all(0.0 < v < 1.0 for r in scores for v in r)
    with pytest.raises(FileNotFoundError, match="not a process reward model"):
        load_scorer(tmp_path / "labels")


def test_loading_and_saving_print_no_third_party_progress_bars(tiny, tmp_path, capfd):
    from seekrl.models import load_policy
    from seekrl.rl.common import save_policy

    model, tok = tiny
    save_policy(model, tok, tmp_path / "m")
    load_policy(str(tmp_path / "m"))
    save_policy(model, tok, tmp_path / "m")
    captured = capfd.readouterr()
    assert "Loading weights" not in captured.err + captured.out
    assert "Writing model shards" not in captured.err + captured.out


def test_rollouts_of_one_question_share_the_prompt_pass(tiny, monkeypatch):
    from seekrl.agent.rollout import RolloutConfig, RolloutEngine
    from seekrl.rl import prm as prm_module

    model, tok = tiny
    engine = RolloutEngine(Dice(tok, OPTIONS), tok, Docs(), RolloutConfig(max_turns=3,
                                                                          n_samples=3, seed=2))
    group = engine.run(questions(2))               # 2 questions x 3 rollouts
    scorer = PRMScorer(random_prm(model), tok, batch_size=6)
    calls = []
    real = prm_module.suffix_hidden
    monkeypatch.setattr(prm_module, "suffix_hidden",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    together = scorer.logits(group)
    assert calls                                   # the shared-prompt path ran
    for t, row in zip(group, together):
        alone = scorer.logits([t])[0]
        assert row == pytest.approx(alone, abs=1e-4)
