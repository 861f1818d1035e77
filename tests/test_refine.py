"""PRM-guided refinement: what RFT keeps, step-DPO's loss touches only the differing step,
and both recipes end in a checkpoint."""

from __future__ import annotations

import copy
import json
import math
import random
from dataclasses import replace

import pytest
import torch
from conftest import interrupt_at_call
from hypothesis import given, settings
from hypothesis import strategies as st

from seekrl.agent.trajectory import Trajectory
from seekrl.config import LabelConfig, RefineConfig
from seekrl.recipes.mcts import run_labelling, step_key
from seekrl.recipes.refine import keep_for_rft, run_refine, step_dpo_loss, step_logps, step_mask
from tests.test_mcts import OPTIONS, Dice, dice_engine, questions
from tests.test_rollout import Docs
from tests.test_sft import _same_weights


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
    # a bar per step count: the same bar for every count is the plain float
    counts = {len(t.steps) for t in episodes}
    assert len(counts) >= 2
    assert keep_for_rft(episodes, outcomes, low, min_outcome=1.0,
                        threshold=dict.fromkeys(counts, 0.5), max_per_question=2) \
        == (kept_low, why_low)
    # a bar over 0.9 for one count drops that count's right, valid episodes and no other
    longest = max(len(t.steps) for t in kept)
    bars = {n: 0.95 if n == longest else 0.5 for n in counts}
    kept_bar, why_bar = keep_for_rft(episodes, outcomes, scores, min_outcome=1.0,
                                     threshold=bars, max_per_question=2)
    # (a dropped episode frees its question's slot for another: kept_bar may hold more)
    assert all(len(t.steps) != longest for t in kept_bar)
    assert all(t in kept_bar for t in kept if len(t.steps) != longest)
    assert why_bar["low_step_score"] > 0
    assert len(kept_bar) + sum(why_bar.values()) == len(episodes)
    # the bar meets the episode's lowest step: at it is kept, just under it is dropped
    at_min = keep_for_rft(episodes, outcomes, low, min_outcome=1.0,
                          threshold=dict.fromkeys(counts, 0.1), max_per_question=2)[0]
    assert at_min == kept
    with pytest.raises(ValueError, match="no bar for episodes of"):
        keep_for_rft(episodes, outcomes, scores, min_outcome=1.0,
                     threshold={n: 0.5 for n in counts if n != longest}, max_per_question=2)
    # the same episode twice counts once; a question gives at most max_per_question
    doubled, why2 = keep_for_rft(kept + kept, [1.0] * 2 * len(kept), None, min_outcome=1.0,
                                 threshold=0.5, max_per_question=1)
    assert len(doubled) == len({t.example_id for t in kept})
    assert why2["duplicate"] + why2["question_full"] == 2 * len(kept) - len(doubled)


def test_step_dpo_touches_only_the_differing_step(tiny, episodes, monkeypatch):
    """Through the recipe's own `step_logps`: the DPO loss's gradient on every token's
    log-prob is zero outside the differing step (here step 1, so the steps before it are
    checked too) and non-zero on each of its generated tokens."""
    import seekrl.recipes.refine as refine

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


def _label_pairs(tok, out):
    """Sibling pairs of six questions (MCTS over the Dice policy) into `out`."""
    run_labelling(LabelConfig(data="unused", out=str(out),
                              search={"simulations": 8, "expansions": 4, "min_visits": 1,
                                      "min_gap": 0.1}, rollout={"max_turns": 3}),
                  backend=Dice(tok, OPTIONS), tokenizer=tok, retriever=Docs(),
                  questions=questions(6))


def test_step_dpo_accumulates_grad_accum_parts_into_one_update(tiny, tmp_path):
    """batch_size 2 x grad_accum 2 is batch_size 4 in parts: the same pairs an update, the
    same updates (grad_accum was accepted and ignored: half the pairs an update)."""
    model, tok = tiny
    _label_pairs(tok, tmp_path / "labels")
    logs = []
    for batch, accum in ((4, 1), (2, 2), (2, 1)):
        out = tmp_path / f"dpo{batch}x{accum}"
        run_refine(RefineConfig(method="step_dpo", pairs=str(tmp_path / "labels"),
                                out=str(out), steps=4, batch_size=batch, grad_accum=accum,
                                beta=0.5, optim={"lr": 1e-3, "warmup_steps": 0,
                                                 "schedule": "constant"}),
                   model=copy.deepcopy(model), tokenizer=tok)
        logs.append([json.loads(line) for line in
                     (out / "metrics.jsonl").read_text().splitlines()])
    whole, parts, half = logs
    for a, b in zip(whole, parts):
        for key in ("loss", "margin", "accuracy", "grad_norm"):
            assert a[key] == pytest.approx(b[key], rel=1e-3, abs=1e-4), key
    assert [r["loss"] for r in half] != [r["loss"] for r in whole]


def test_step_dpo_recipe_moves_the_margin(tiny, tmp_path):
    model, tok = tiny
    _label_pairs(tok, tmp_path / "labels")
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
    from seekrl.recipes.labels import read_labels
    for p in read_labels([tmp_path / "labels"]).pairs:
        cut = p.better.steps[p.index].start
        assert p.better.token_ids[:cut] == p.worse.token_ids[:cut]
        assert step_key(p.better.steps[p.index]) != step_key(p.worse.steps[p.index])
    assert (tmp_path / "dpo" / "final" / "config.json").is_file()
    from seekrl.config import ConfigError
    with pytest.raises(ConfigError, match="already holds a run"):
        run_refine(cfg, model=copy.deepcopy(model), tokenizer=tok)
    # --overwrite with a bad input keeps the old run; a sound one leaves nothing stale
    stale = tmp_path / "dpo" / "rft_data.jsonl"
    stale.write_text("{}\n")
    with pytest.raises(FileNotFoundError, match="labels"):
        run_refine(cfg.model_copy(update={"pairs": [str(tmp_path / "nowhere")]}),
                   model=copy.deepcopy(model), tokenizer=tok, overwrite=True)
    assert stale.is_file() and (tmp_path / "dpo" / "final" / "config.json").is_file()
    run_refine(cfg.model_copy(update={"steps": 1}), model=copy.deepcopy(model), tokenizer=tok,
               overwrite=True)
    assert not stale.exists() and (tmp_path / "dpo" / "final" / "config.json").is_file()
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


def test_rft_quantile_bars_are_per_step_count_in_the_summary(tiny, tmp_path):
    model, tok = tiny

    class Spread:   # a stand-in PRM on a low scale, each step scored from its position
        def score_steps(self, trajs):
            return [[0.01 * (1 + (len(t.token_ids) + j) % 7) for j in range(len(t.steps))]
                    for t in trajs]

    cfg = RefineConfig(method="rft", out=str(tmp_path / "q"), samples=4, steps=0,
                       threshold_quantile=0.25, max_per_question=4, rollout={"max_turns": 3})
    result = run_refine(cfg, model=model, tokenizer=tok, backend=Dice(tok, OPTIONS),
                        retriever=Docs(), questions=questions(4), scorer=Spread())
    bars = result["threshold"]
    assert result["left_out"]["low_step_score"] > 0
    assert isinstance(bars, dict) and bars and all(k.isdigit() for k in bars)
    assert json.loads(json.dumps(result))["threshold"] == bars
    from seekrl.agent.trajectory import read_trajectories
    kept = read_trajectories(result["data"])
    assert kept and all(min(s.value for s in t.steps) >= bars[str(len(t.steps))] - 1e-6
                        for t in kept)


def test_quantile_threshold_follows_the_prm_scale():
    from seekrl.recipes.refine import quantile_threshold

    one = [[0.05], [0.06], [0.07], [0.08]]                                 # minima .05-.08
    two = [[0.01, 0.09], [0.04, 0.02], [0.03, 0.08], [0.06, 0.04]]         # minima .01-.04
    three = [[0.07, 0.05, 0.09]]                                           # alone: minimum .05
    wrong = [[0.9], [0.9, 0.9]]
    scores = one + two + three + wrong + [[]]
    outcomes = [1.0] * (len(one) + len(two) + len(three)) + [0.0] * len(wrong) + [1.0]
    # each count's bar is a quantile of its own minima (index int(q * 4) = 1): the PRM's low
    # scale is followed, and the wrong episodes' 0.9s never count. The single 3-step episode
    # cannot hold a quantile of its own (q * 1 < 1) and takes the pooled minima's: index
    # int(0.25 * 9) = 2 of .01 .02 .03 .04 .05 .05 .06 .07 .08. The right episode without
    # scored steps has no minimum and no stratum.
    bars = quantile_threshold(outcomes, scores, 1.0, 0.25)
    assert bars == {1: 0.06, 2: 0.02, 3: 0.03}
    # q = 0 keeps every right episode: each bar is the lowest minimum it is compared with
    assert quantile_threshold(outcomes, scores, 1.0, 0.0) == {1: 0.01, 2: 0.01, 3: 0.01}
    assert quantile_threshold([0.0], [[0.1]], 1.0, 0.25) == {}
    kept, why = keep_for_rft([], [], [], min_outcome=1.0, threshold=bars, max_per_question=2)
    assert kept == [] and sum(why.values()) == 0


def test_the_quantile_bar_is_taken_over_the_episodes_it_filters():
    """Invalid right episodes (RFT drops them anyway; their steps score low) and repeats
    filled the bottom of a stratum: the bar fell below every valid episode and the PRM
    filtered nothing. Over valid, distinct episodes the q-quantile drops its share."""
    from seekrl.recipes.refine import quantile_threshold

    trajs = _answered(8)
    for t in trajs[:2]:
        t.finish_reason = "max_turns"        # right by its answer, not a valid format
    trajs.append(replace(trajs[2]))   # a repeat of the lowest valid one
    scores = [[0.05, 0.9], [0.06, 0.9]] + [[m, 0.9] for m in (0.2, 0.3, 0.5, 0.6, 0.7, 0.8)] \
        + [[0.2, 0.9]]
    outcomes = [1.0] * len(trajs)
    assert quantile_threshold(outcomes, scores, 1.0, 0.25) == {2: 0.2}   # what it was
    bars = quantile_threshold(outcomes, scores, 1.0, 0.25, trajs)
    assert bars == {2: 0.3}                  # index int(0.25 * 6) = 1 of .2 .3 .5 .6 .7 .8
    kept, why = keep_for_rft(trajs, outcomes, scores, min_outcome=1.0, threshold=bars,
                             max_per_question=2)
    assert len(kept) == 5 and why["low_step_score"] == 2 and why["invalid_format"] == 2

def _answered(n: int) -> list[Trajectory]:
    """`n` distinct right, well-formed episodes of distinct questions (the step scores come
    separately: `keep_for_rft` reads a row's length as the episode's step count)."""
    return [Trajectory(example_id=f"q{i}", group_id=f"q{i}", question="?", golden_answers=["a"],
                       token_ids=[i], loss_mask=[1], prompt_len=0, answer="a",
                       finish_reason="answer") for i in range(n)]


def _survival(steps: list[int], scores: list[list[float]], q: float) -> dict[int, float]:
    """The share of each step count's right episodes that the quantile filter keeps."""
    from seekrl.recipes.refine import quantile_threshold

    outcomes = [1.0] * len(scores)
    bars = quantile_threshold(outcomes, scores, 1.0, q)
    kept, _ = keep_for_rft(_answered(len(scores)), outcomes, scores, min_outcome=1.0,
                           threshold=bars, max_per_question=1)
    kept_ids = {t.example_id for t in kept}
    return {n: sum(f"q{i}" in kept_ids for i, k in enumerate(steps) if k == n)
            / steps.count(n) for n in sorted(set(steps))}


def test_uninformative_step_scores_keep_every_step_count_alike():
    """Issue 27: with step scores that say nothing (iid uniform), the quantile filter keeps
    ~1 - q of the right episodes whatever their number of steps. One quantile over all step
    scores kept (1 - q)^n of the n-step ones (here 0.74 / 0.58 / 0.41 of 1 / 2 / 3 steps at
    q = 0.25), and RFT taught fewer searches."""
    rng = random.Random(27)
    steps = [n for n in (1, 2, 3) for _ in range(2000)]
    rng.shuffle(steps)
    scores = [[rng.random() for _ in range(n)] for n in steps]
    for n, share in _survival(steps, scores, 0.25).items():
        assert share == pytest.approx(0.75, abs=0.03), n


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), q=st.sampled_from([0.1, 0.25, 0.5]),
       sizes=st.lists(st.integers(10, 120), min_size=2, max_size=4),
       skew=st.sampled_from([1.0, 3.0]))
def test_each_step_count_keeps_its_own_share(seed, q, sizes, skew):
    """Whatever the score scale (a skewed `u ** skew` too) and the stratum sizes, a stratum
    of k right episodes whose quantile can drop one (q * k >= 1) loses exactly its
    int(q * k) lowest minima: survival 1 - int(q * k) / k, for short and long alike."""
    rng = random.Random(seed)
    steps = [n for n, k in enumerate(sizes, start=1) for _ in range(k)]
    rng.shuffle(steps)
    scores = [[rng.random() ** skew for _ in range(n)] for n in steps]
    survival = _survival(steps, scores, q)
    for n, k in enumerate(sizes, start=1):
        if int(q * k) >= 1:
            assert survival[n] == pytest.approx(1 - int(q * k) / k), (n, k)


WRONG = [["<search> Ilsa Marrow born </search>", "<answer> Paris </answer>"],
         ["<answer> Paris </answer>"], ["<answer> Velmaria </answer>"]]


def test_rejection_sampling_says_what_it_kept_and_warns_with_a_hint(tiny, tmp_path):
    """A policy that never answers right: the counts (right, valid, kept, questions) are
    said and returned, and a warning names the cause and what to do, not a bare 0 kept."""
    from rich.console import Console

    model, tok = tiny
    console = Console(record=True, width=400)
    cfg = RefineConfig(method="rft", out=str(tmp_path / "none"), samples=2, steps=0,
                       rollout={"max_turns": 3})
    result = run_refine(cfg, model=model, tokenizer=tok, backend=Dice(tok, WRONG),
                        retriever=Docs(), questions=questions(3), console=console)
    said = " ".join(console.export_text().split())
    assert (result["sampled"], result["right"], result["kept"], result["questions"],
            result["questions_kept"]) == (6, 0, 0, 3, 0) and result["valid"] == 6
    assert "6 episodes sampled on 3 questions (2 each" in said
    assert "0 right, 6 valid, 0 right and valid, 0 kept for 0 of 3 questions" in said
    assert result["warning"].startswith("no episode was kept: the policy answered none of 6 "
                                        "episodes right. First learn the protocol on the "
                                        "synthetic world (`seekrl sft`")
    assert "samples, now 2" in result["warning"] and "teacher=PATH" in result["warning"]
    assert "warning: no episode was kept" in said and "train on it with" not in said
    # most questions kept: no warning; the next command is said
    console = Console(record=True, width=400)
    ok = run_refine(cfg.model_copy(update={"out": str(tmp_path / "ok"), "samples": 8}),
                    model=model, tokenizer=tok, backend=Dice(tok, OPTIONS), retriever=Docs(),
                    questions=questions(3), console=console)
    assert ok["warning"] is None and ok["questions_kept"] >= 2
    assert f"train on it with: seekrl sft data={ok['data']}" in console.export_text()


def test_rft_warning_names_the_likely_cause():
    from seekrl.recipes.refine import rft_warning

    base = dict(questions=10, sampled=40, samples=4, temperature=0.9)
    none = {"low_step_score": 0}
    assert rft_warning(questions_kept=5, right=9, right_valid=9, why=none, **base) is None
    assert "its 3 right answers all broke the protocol" in rft_warning(
        questions_kept=0, right=3, right_valid=0, why=none, **base)
    assert "only 2 of 10 questions have a kept episode: the PRM's step bar left out 6 of 8" \
        in rft_warning(questions_kept=2, right=8, right_valid=8, why={"low_step_score": 6},
                       **base)
    assert "4 of 40 episodes were right" in rft_warning(
        questions_kept=3, right=4, right_valid=4, why=none, **base)


def test_a_teacher_samples_and_another_tokenizer_gets_text_turns(tiny, tmp_path):
    """teacher= samples in place of the policy being fine-tuned. With the policy's tokenizer
    its episodes are kept as token ids; with another, as text turns that SFT lays out with
    the learner's tokens (here the same text, so the played tokens come back), and the
    refinement fine-tunes the policy on them."""
    from seekrl.agent.trajectory import read_trajectories
    from seekrl.recipes.sft import load_sft_examples

    model, tok = tiny
    other = copy.deepcopy(tok)
    other.add_tokens(["<only-the-teacher-has-this>"])
    cfg = RefineConfig(method="rft", out=str(tmp_path / "same"), samples=4, steps=0,
                       teacher="(given)", rollout={"max_turns": 3})
    same = run_refine(cfg, tokenizer=tok, teacher=(model, tok), backend=Dice(tok, OPTIONS),
                      retriever=Docs(), questions=questions(4))
    assert same["data_form"] == "token ids" and same["kept"] > 0
    assert len(read_trajectories(same["data"])) == same["kept"]

    text = run_refine(cfg.model_copy(update={"out": str(tmp_path / "text")}), tokenizer=tok,
                      teacher=(model, other), backend=Dice(other, OPTIONS), retriever=Docs(),
                      questions=questions(4))
    assert text["data_form"] == "text turns" and text["kept"] > 0
    records = [json.loads(line) for line in open(text["data"])]
    assert all(set(r) == {"id", "question", "golden_answers", "turns"} for r in records)
    assert records[0]["turns"][-1]["content"] == "<answer> Tarrow </answer>"
    examples, _ = load_sft_examples(text["data"], tok)
    played = {tuple(t.token_ids) for t in read_trajectories(tmp_path / "text" / "samples.jsonl")}
    assert len(examples) == text["kept"] and all(tuple(e.token_ids) in played for e in examples)

    tuned = run_refine(cfg.model_copy(update={"out": str(tmp_path / "tuned"), "steps": 1,
                                              "batch_size": 2}),
                       model=copy.deepcopy(model), tokenizer=tok, teacher=(model, other),
                       backend=Dice(other, OPTIONS), retriever=Docs(), questions=questions(4))
    assert tuned["final"].endswith("final") and tuned["data_form"] == "text turns"


def test_a_teachers_prm_run_resumes_past_its_sampling(tiny, tmp_path, monkeypatch):
    """A PRM shares the teacher's tokenizer (it scores the teacher's episodes). Resumed
    past the sampling, the teacher is not loaded, and the PRM was checked against the
    learner's other tokenizer: every such resume was refused."""
    import seekrl.recipes.sft as sft_module
    from seekrl.recipes.setup import Interrupted

    model, tok = tiny
    other = copy.deepcopy(tok)
    other.add_tokens(["<only-the-teacher-has-this>"])

    class Scorer:   # scores every step 1.0; reads the teacher's tokens
        tokenizer = other

        def score_steps(self, trajs):
            return [[1.0] * len(t.steps) for t in trajs]

    cfg = RefineConfig(method="rft", out=str(tmp_path / "r"), samples=4, steps=3, batch_size=2,
                       save_every=1, teacher="(given)", prm="(given)", rollout={"max_turns": 3},
                       optim={"lr": 1e-3, "warmup_steps": 1})

    def refine(**kw):
        return run_refine(cfg, model=copy.deepcopy(model), tokenizer=tok, teacher=(model, other),
                          scorer=Scorer(), backend=Dice(other, OPTIONS), retriever=Docs(),
                          questions=questions(4), **kw)

    restore = interrupt_at_call(monkeypatch, sft_module, "sft_loss", 2)   # in step 2
    with pytest.raises(Interrupted):
        refine()
    restore()
    done = refine(resume=True)
    assert done["final"].endswith("final") and done["data_form"] == "text turns"


def test_teacher_is_for_rft_and_text_turns_need_what_sft_rebuilds(tiny):
    from seekrl.config import ConfigError
    from seekrl.recipes.refine import check_config, check_text_turns

    with pytest.raises(ConfigError, match="teacher: only rft samples"):
        check_config(RefineConfig(method="step_dpo", teacher="t", pairs=["x"]))
    for rollout, named in [({"max_queries": 2}, "rollout.max_queries > 1"),
                           ({"prompt": "search_r1"}, "rollout.prompt search_r1")]:
        with pytest.raises(ConfigError, match=named):
            check_text_turns(RefineConfig(rollout=rollout).rollout)


def test_rft_checks_its_index_and_questions_before_loading_the_prm(tmp_path, monkeypatch):
    import seekrl.rewards.prm as prm

    monkeypatch.setattr(prm, "load_scorer", lambda *a, **k: pytest.fail("the PRM loaded"))
    with pytest.raises(ValueError, match="index: RFT samples search episodes"):
        run_refine(RefineConfig(data="q.jsonl", prm=str(tmp_path / "prm"),
                                out=str(tmp_path / "r")))


def test_refine_command_samples_with_a_teacher_and_says_why_nothing_was_kept(tmp_path):
    """`seekrl refine method=rft steps=0 teacher=DIR`: the teacher loads by path, samples,
    and a random policy's empty harvest ends in a warning with what to do (exit 0: the
    sampling itself worked)."""
    from conftest import build_lab
    from typer.testing import CliRunner

    from seekrl.cli import app

    _, paths, index_dir, tiny_dir = build_lab(tmp_path)
    r = CliRunner().invoke(app, [
        "refine", "method=rft", "steps=0", f"model={tiny_dir}", f"teacher={tiny_dir}",
        f"data={paths['train']}", f"index={index_dir}", "questions=2", "samples=1",
        "rollout.max_turns=2", "rollout.max_new_tokens=8", f"out={tmp_path / 'rs'}"])
    said = " ".join(r.output.split())
    assert r.exit_code == 0, r.output
    assert "2 episodes sampled on 2 questions (1 each" in said and f"by the teacher {tiny_dir}" \
        in said
    assert "warning: no episode was kept: the policy answered none of 2 episodes right" in said
    assert (tmp_path / "rs" / "rft_data.jsonl").read_text() == ""


def test_a_stopped_rft_run_resumes_from_its_samples_and_its_checkpoint(tiny, tmp_path,
                                                                        monkeypatch):
    """Ctrl-C in RFT's fine-tuning, then --resume (the folder moved meanwhile): the samples
    are not drawn again and the fine-tuning goes on from its checkpoint, ending on a straight
    run's weights; a stop before the sampling finished samples again, with any settings;
    other settings once the samples are drawn, and step-DPO, are refused."""
    import shutil

    import seekrl.recipes.sft as sft_module
    from seekrl.config import ConfigError
    from seekrl.recipes.setup import Interrupted

    model, tok = tiny

    def cfg(out, **keys):
        return RefineConfig(**{"method": "rft", "out": str(tmp_path / out), "samples": 4,
                               "steps": 4, "batch_size": 2, "save_every": 1,
                               "rollout": {"max_turns": 3},
                               "optim": {"lr": 1e-3, "warmup_steps": 1}, **keys})

    def refine(out, backend=None, config=None, **kw):
        return run_refine(config or cfg(out), model=copy.deepcopy(model), tokenizer=tok,
                          backend=backend or Dice(tok, OPTIONS), retriever=Docs(),
                          questions=questions(4), **kw)

    straight = refine("a")
    assert straight["kept"] >= 4
    real, calls = sft_module.sft_loss, []

    def stop_in_step_3(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(sft_module, "sft_loss", stop_in_step_3)
    with pytest.raises(Interrupted):
        refine("b")
    monkeypatch.setattr(sft_module, "sft_loss", real)
    shutil.move(tmp_path / "b", tmp_path / "moved")   # its data is read where it is now
    samples = (tmp_path / "moved" / "samples.jsonl").read_bytes()
    with pytest.raises(ConfigError, match="already holds a run"):
        refine("moved")

    class NoSampling(Dice):   # a resumed run must not draw its samples again
        def generate(self, *a, **k):
            raise AssertionError("sampled again")

    resumed = refine("moved", backend=NoSampling(tok, OPTIONS), resume=True)
    assert (tmp_path / "moved" / "samples.jsonl").read_bytes() == samples
    assert {k: v for k, v in resumed.items() if k not in ("minutes", "final", "loss")} == \
        {k: v for k, v in straight.items() if k not in ("minutes", "final", "loss")}
    _same_weights(straight["final"], resumed["final"])

    with pytest.raises(ConfigError, match=r"ran with other settings: samples: 4 -> 2"):
        refine("moved", config=cfg("moved", samples=2), resume=True)
    with pytest.raises(ConfigError, match="not both"):
        refine("moved", resume=True, overwrite=True)
    with pytest.raises(ConfigError, match="step_dpo keeps no checkpoints"):
        run_refine(RefineConfig(method="step_dpo", out=str(tmp_path / "moved")), model=model,
                   tokenizer=tok, resume=True)
    with pytest.raises(ConfigError, match="holds no refinement"):
        refine("c", resume=True)
    marker = tmp_path / "moved" / "rft_sampled.json"
    whole = marker.read_text()
    for damaged, why in (("{", "not valid JSON"), ('{"kept": 1}', "missing field 'sampled'"),
                         ('{"sampled": 8, "kept": null}', "kept: expected a count of episodes, "
                          "got None")):
        marker.write_text(damaged)
        with pytest.raises(ConfigError, match=f"--resume: .*rft_sampled.json: {why}"):
            refine("moved", resume=True)
    marker.write_text(whole)
    # stopped before its sampling finished: no record of the samples, so it samples again
    # from a clean folder, and a changed setting is taken
    (tmp_path / "moved" / "rft_sampled.json").unlink()

    def stop_at_once(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(sft_module, "sft_loss", stop_at_once)
    with pytest.raises(Interrupted):
        refine("moved", config=cfg("moved", samples=2), resume=True)
    assert json.loads((tmp_path / "moved" / "rft_sampled.json").read_text())["sampled"] == 8
    assert not (tmp_path / "moved" / "sft" / "checkpoints").exists()   # the old one went


def test_ctrl_c_in_refine_says_how_to_go_on(tmp_path, monkeypatch):
    """Interrupted is a KeyboardInterrupt: it printed a traceback. Once the samples are
    drawn the way on is --resume, with or without a checkpoint of the fine-tuning."""
    from typer.testing import CliRunner

    import seekrl.recipes.refine as refine_module
    from seekrl.cli import app
    from seekrl.recipes.setup import Interrupted

    out = tmp_path / "r"

    def stopped(cfg, **kw):
        out.mkdir()
        (out / "rft_sampled.json").write_text("{}")
        raise Interrupted(2, out / "sft" / "checkpoints" / "step-2", 1)

    monkeypatch.setattr(refine_module, "run_refine", stopped)
    r = CliRunner().invoke(app, ["refine", f"out={out}", "data=q.jsonl"])
    text = " ".join(r.output.split())
    assert r.exit_code == 130 and f"interrupted; {out} keeps RFT's sampled episodes and the " \
        f"fine-tuning's checkpoint {out}/sft/checkpoints/step-2; continue with: seekrl " \
        f"refine out={out} data=q.jsonl --resume" in text, r.output

    def early(cfg, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(refine_module, "run_refine", early)
    r = CliRunner().invoke(app, ["refine", f"out={tmp_path / 'e'}", "data=q.jsonl"])
    assert r.exit_code == 130 and "interrupted before the first step" in r.output
