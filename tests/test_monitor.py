"""The training-health monitor on synthetic metric streams: a healthy noisy run is quiet, each
collapse pattern alerts at the step where its window crosses the threshold, once, and a
restored monitor carries on exactly as the original."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from seekrl.config import MonitorConfig
from seekrl.rl.monitor import KINDS, Alert, Monitor

WINDOW = 5  # the default; the expected steps below are worked out for it


def monitor(**overrides) -> Monitor:
    return Monitor(MonitorConfig(window=WINDOW, **overrides))


def feed(m: Monitor, stream: list[dict], first_step: int = 1) -> dict[int, list[tuple[str, str]]]:
    """Run the stream through the monitor; {step: [(kind, severity), ...]} for steps that alerted."""
    out = {}
    for step, metrics in enumerate(stream, start=first_step):
        alerts = m.update(step, metrics)
        assert all(isinstance(a, Alert) and a.step == step for a in alerts)
        if alerts:
            out[step] = [(a.kind, a.severity) for a in alerts]
    return out


def series(key: str, values: list) -> list[dict]:
    return [{key: v} for v in values]


def healthy_stream(n: int, seed: int = 0) -> list[dict]:
    """A run that learns slowly and is noisy, as a real one is: entropy drifts down a little,
    format and searches wobble, some steps have no correct answer, some miss a question type."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        by_type = {"single": rng.gauss(0.45 + 0.001 * i, 0.08), "multi": rng.gauss(0.3, 0.08)}
        if rng.random() < 0.2:
            del by_type["multi"]
        out.append({
            "step": i + 1, "reward": rng.random(), "kl": 0.01,   # keys the monitor does not read
            "grad_norm": rng.lognormvariate(0.0, 0.4) * (0 if rng.random() < 0.05 else 1),
            "entropy": max(0.0, rng.gauss(0.6 - 0.001 * i, 0.05)),
            "valid_format": min(1.0, max(0.0, rng.gauss(0.85, 0.06))),
            "correct_logp_shift": None if rng.random() < 0.1 else rng.gauss(0.003, 0.005),
            "searches": max(0.0, rng.gauss(2.0, 0.3)),
            "reward_by_type": by_type,
            # a step now and then where every group tied, by chance
            "groups_with_signal": 0.0 if rng.random() < 0.1 else rng.choice([0.375, 0.5, 0.625]),
            "groups_solved": 0.25,
        })
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_healthy_noisy_run_raises_nothing(seed):
    m = monitor()
    assert feed(m, healthy_stream(200, seed)) == {}
    assert m.healthy


def test_grad_norm_spike_warns_then_a_bigger_one_collapses():
    m = monitor()  # factor 10: warn above 10x the baseline, collapse above 20x
    stream = series("grad_norm", [1.0] * 10 + [15.0, 1.0, 25.0, 1.0])
    alerts = feed(m, stream)
    assert alerts == {11: [("grad_norm_explosion", "warn")], 13: [("grad_norm_explosion", "collapse")]}
    assert m.healthy  # the last step was back to normal


def test_grad_norm_spike_in_the_baseline_does_not_set_it():
    m = monitor()
    assert feed(m, series("grad_norm", [1.0, 1.0, 30.0, 1.0, 1.0, 1.1, 0.9])) == {}


def test_zero_grad_norms_are_not_observations():
    # tied groups at the start give zero norms; a baseline of 0 would call every later step an
    # explosion
    m = monitor()
    assert feed(m, series("grad_norm", [0.0] * 6 + [1.0] * 5 + [0.0, 1.2, 0.8])) == {}
    # nor does a zero end an explosion: the same explosion after it is not news
    m = monitor()
    alerts = feed(m, series("grad_norm", [1.0] * 6 + [50.0, 0.0, 50.0]))
    assert list(alerts) == [7] and not m.healthy


def test_entropy_collapse_warns_then_collapses():
    # baseline 0.5; warn below 0.2 x 0.5 = 0.1, collapse below 0.05 (means over 5 steps)
    m = monitor()
    stream = series("entropy", [0.5] * 10 + [0.08] * 5 + [0.01] * 5)
    m_alerts = {}
    for step, metrics in enumerate(stream, start=1):
        for a in m.update(step, metrics):
            m_alerts[step] = (a.kind, a.severity, a.message)
    assert sorted(m_alerts) == [15, 18]  # 0.08 after 5 steps; 0.038 after 3 more of 0.01
    assert m_alerts[15][:2] == ("entropy_collapse", "warn")
    assert m_alerts[15][2] == "entropy 0.08 is 16% of its baseline 0.5"
    assert m_alerts[18][:2] == ("entropy_collapse", "collapse")
    assert not m.healthy


def test_falling_correct_logp_alerts_once_and_again_after_recovery():
    # likelihood displacement: each update lowers the right episodes' log-prob; the check
    # reads the mean shift of the last 5 updates (warn below -0.01, collapse below -0.02)
    m = monitor()
    stream = series("correct_logp_shift",
                    [0.002] * 10 + [-0.05] * 10 + [0.002] * 10 + [-0.05] * 3)
    health = []
    alerts = {}
    for step, metrics in enumerate(stream, start=1):
        got = m.update(step, metrics)
        if got:
            alerts[step] = [(a.kind, a.severity) for a in got]
        health.append(m.healthy)
    # one falling update is not a trend (mean -0.0084); two are (-0.0188), three collapse
    assert alerts == {12: [("correct_logp_falling", "warn")], 13: [("correct_logp_falling", "collapse")],
                      32: [("correct_logp_falling", "warn")], 33: [("correct_logp_falling", "collapse")]}
    # unhealthy from the collapse until the mean is back above -0.02: step 23 (-0.0188, a
    # warn, already said); the signal has recovered at step 24, so step 32 alerts again
    first_healthy_again = next(i + 1 for i in range(12, len(health)) if health[i])
    assert first_healthy_again == 23
    assert health[11] and not health[12] and not health[32]


def test_a_rising_grad_norm_as_a_weak_policy_starts_succeeding_is_not_an_explosion():
    """More groups with signal step after step makes the gradient grow 17x over 30 steps: a
    baseline fixed at the first steps called that an explosion; the rolling one does not,
    and a spike on top of it still stands out."""
    norms = [0.05 * 1.1 ** i for i in range(30)]
    assert feed(monitor(), series("grad_norm", norms)) == {}
    assert feed(monitor(), series("grad_norm", norms + [norms[-1] * 30])) == {
        31: [("grad_norm_explosion", "collapse")]}


def test_no_signal_because_every_group_is_right_only_warns():
    m = monitor()  # no_signal_steps 3
    stream = [{"groups_with_signal": 0.0, "groups_solved": 1.0}] * 8
    assert feed(m, stream) == {3: [("no_signal", "warn")]}
    assert m.healthy
    # a mix of solved and failed ties is still a collapse at twice the steps
    m = monitor()
    stream = [{"groups_with_signal": 0.0, "groups_solved": 0.5}] * 6
    assert feed(m, stream) == {3: [("no_signal", "warn")], 6: [("no_signal", "collapse")]}
    assert not m.healthy


def test_valid_format_collapse():
    # baseline 0.9; warn more than 0.3 below, collapse more than 0.6 below
    m = monitor()
    alerts = feed(m, series("valid_format", [0.9] * 10 + [0.0] * 6))
    assert alerts == {12: [("valid_format_collapse", "warn")], 14: [("valid_format_collapse", "collapse")]}


def test_valid_format_near_zero_is_a_collapse_even_when_twice_the_drop_is_out_of_reach():
    m = monitor()
    alerts = feed(m, series("valid_format", [0.35] * 10 + [0.0] * 5))
    assert alerts == {15: [("valid_format_collapse", "collapse")]}


def test_an_untrained_policy_with_a_low_format_rate_is_not_a_collapse():
    m = monitor()
    assert feed(m, series("valid_format", [0.05, 0.0, 0.08] * 5 + [0.3, 0.6, 0.9] * 3)) == {}
    assert m.healthy


def test_one_question_type_falling_while_another_rises():
    m = monitor()  # warn: a type's reward more than 0.3 below its baseline; collapse: 0.6
    stream = [{"reward_by_type": {"single": 0.7, "multi": 0.7}}] * 10 \
        + [{"reward_by_type": {"single": 1.0, "multi": 0.0}}] * 8
    got = []
    for step, metrics in enumerate(stream, start=1):
        got += [(step, a.kind, a.severity, a.message) for a in m.update(step, metrics)]
    assert [g[:3] for g in got] == [(13, "type_reward_drop", "warn"), (15, "type_reward_drop", "collapse")]
    assert got[0][3].startswith("on 'multi' questions, reward 0.28 is 0.42 below its baseline 0.7")


def test_each_question_type_has_its_own_baseline_from_its_own_steps():
    m = monitor()
    stream = [{"reward_by_type": {"single": 0.5}}] * 6 \
        + [{"reward_by_type": {"single": 0.5, "late": 0.2}}, {"reward_by_type": {"single": 0.5}}] * 5 \
        + [{"reward_by_type": {"single": 0.5, "late": 0.9}}] * 3
    # "late" has a baseline of 0.2 from its own first 5 steps; rising is fine, not a drift
    assert feed(m, stream) == {}
    m2 = monitor()
    stream = [{"reward_by_type": {"late": None}}] * 3 + [{"reward_by_type": {"late": 0.8}}] * 5 \
        + [{"reward_by_type": {}}] * 3 + [{"reward_by_type": {"late": 0.0}}] * 2
    assert feed(m2, stream) == {13: [("type_reward_drop", "warn")]}  # mean 0.48 after two 0.0


def test_searches_collapsing_onto_one_then_none():
    # baseline 3 searches/episode; warn more than 50% off; collapse below a tenth (0.3)
    m = monitor()
    alerts = feed(m, series("searches", [3.0] * 10 + [1.0] * 5 + [0.0] * 5))
    assert alerts == {14: [("searches_drift", "warn")], 19: [("searches_drift", "collapse")]}


def test_search_collapse_onto_one_search_while_multi_hop_rewards_fall():
    """The pattern measured on outcome-only dr_grpo (searches 1.58 -> 0.98, bridge questions
    0.084 -> 0.011): a 38% drift, under searches_drift's 50%, flagged by its own check."""
    stream = [{"searches": s, "reward_multihop": r}
              for s, r in [(1.58, 0.3)] * 5 + [(0.98, 0.1)] * 10]
    m = monitor()
    assert feed(m, stream) == {8: [("search_collapse", "warn")],
                               9: [("search_collapse", "collapse")]}
    assert not m.healthy


def test_fewer_searches_with_multi_hop_rewards_holding_warns_but_is_no_collapse():
    stream = [{"searches": s, "reward_multihop": r}
              for s, r in [(1.6, 0.3)] * 5 + [(1.0, 0.32)] * 10]
    m = monitor()
    got = []
    for step, metrics in enumerate(stream, start=1):
        got += [(step, a.kind, a.severity, a.message) for a in m.update(step, metrics)]
    # the last-5 mean reaches 1.24 at step 8
    assert [g[:3] for g in got] == [(8, "search_collapse", "warn")]
    assert "first step 1.60" in got[0][3] and "greedily" in got[0][3]
    assert m.healthy


def test_search_collapse_needs_multi_hop_questions_and_a_full_window():
    # single-hop data (no reward_multihop): searching once is right, nothing to say
    m = monitor()
    assert feed(m, series("searches", [1.6] + [1.0] * 14)) == {}
    # a start already at one search has nothing to fall from
    m = monitor()
    assert feed(m, [{"searches": 1.1, "reward_multihop": 0.2}] * 15) == {}


# Training searches and multi-hop reward per step of the three outcome-only GRPO runs of
# bench/prorag.py (2026-11-24, bench/RESULTS.md "ProRAG pipeline"): greedy test searches
# ended at ~1.0 and bridge EM at 0.003 in all three; the sampled multi-hop reward held.
OUTCOME_RUNS = {
    0: [(1.5, 0.05), (1.62, 0.167), (1.59, 0.1), (1.66, 0.05), (1.47, 0.0), (1.56, 0.3),
        (1.44, 0.208), (1.53, 0.083)],
    1: [(1.78, 0.05), (1.53, 0.042), (1.25, 0.042), (1.31, 0.125), (1.25, 0.15), (1.09, 0.0),
        (1.09, 0.15), (1.12, 0.458), (1.03, 0.083), (1.03, 0.083)],
    2: [(1.62, 0.15), (1.41, 0.0), (1.09, 0.083), (1.03, 0.167), (1.0, 0.25), (1.0, 0.0),
        (1.0, 0.45), (1.0, 0.208), (0.97, 0.15), (1.0, 0.15), (0.97, 0.15)],
}


def test_the_recorded_outcome_only_search_collapses_are_flagged():
    """Seeds 1 and 2 fell to one search within the first steps, before a 5-step median
    baseline existed (the old rule said nothing); seed 0 kept searching in training (its
    greedy collapse is invisible to a training signal) and stays quiet."""
    first = {}
    for seed, run in OUTCOME_RUNS.items():
        m = monitor()
        alerts = feed(m, [{"searches": s, "reward_multihop": r} for s, r in run])
        first[seed] = min(alerts, default=None)
        assert all(kinds == [("search_collapse", "warn")] for kinds in alerts.values())
        assert m.healthy
    assert first == {0: None, 1: 7, 2: 5}


def test_the_recorded_greedy_collapse_of_outcome_seed_0_is_flagged_by_the_evaluations():
    """Outcome seed 0 kept searching when sampled (its training stream raises nothing) and
    collapsed greedily: 1.86 searches per question at SFT, 1.05 after training (200 test
    questions, bench/RESULTS.md 2026-11-24). The evaluations say so."""
    m = monitor()
    assert m.update_eval(0, {"searches": 1.86, "em": 0.255}) == []   # nothing to compare yet
    assert feed(m, [{"searches": s, "reward_multihop": r} for s, r in OUTCOME_RUNS[0]]) == {}
    alerts = m.update_eval(8, {"searches": 1.05, "em": 0.26})
    assert [(a.step, a.kind, a.severity) for a in alerts] == [
        (8, "greedy_search_collapse", "warn")]
    assert "fell to 1.05 (1.86 at the first evaluation)" in alerts[0].message
    assert m.healthy                                   # a warning, never a stop
    assert m.update_eval(9, {"searches": 1.0}) == []   # alerted once
    assert m.update_eval(10, {"searches": 1.9}) == []  # recovered: re-armed
    assert len(m.update_eval(11, {"searches": 1.1})) == 1


def test_greedy_searches_need_multi_hop_training_questions_and_a_fall():
    m = monitor()   # single-hop training data: one search is right
    feed(m, series("searches", [1.6] * 6))
    assert m.update_eval(0, {"searches": 1.9}) == [] and m.update_eval(6, {"searches": 1.0}) == []
    m = monitor()
    feed(m, [{"searches": 1.6, "reward_multihop": 0.2}] * 6)
    m.update_eval(0, {"searches": 1.2})
    assert m.update_eval(6, {"searches": 1.0}) == []   # 0.2 below the start: not a fall
    assert m.update_eval(7, {"em": 0.3}) == []         # no searches reported: nothing read
    state = json.loads(json.dumps(m.state_dict()))
    again = monitor()
    again.load_state_dict(state)
    assert again.state_dict() == m.state_dict()
    assert len(again.update_eval(8, {"searches": 0.8})) == 1   # 1.2 -> 0.8: the first's kept


def test_a_constant_yes_no_answer_in_the_evaluations_warns():
    """The long200w run's dev probes (bench/RESULTS.md, 2026-12-02): "no" to all 9 yes/no
    questions at the start (3 of them yes), "yes" to all 9 from step 5. Each constant warns
    once, the swap to the other too, a mixed answer re-arms it; too few questions, golds of
    one answer or the check set to 0 say nothing, and the state survives a resume."""
    m = monitor()
    start = m.update_eval(0, {"searches": 2.06, "answered_yes": 0.0, "gold_yes": 1 / 3,
                              "yes_no_questions": 9})
    assert [(a.kind, a.severity) for a in start] == [("constant_answer", "warn")]
    assert "answered no to all 9 yes/no questions (gold yes 0.33)" in start[0].message
    assert "share of 'no' (0.67)" in start[0].message
    assert m.healthy
    flipped = {"searches": 2.1, "answered_yes": 1.0, "gold_yes": 1 / 3, "yes_no_questions": 9}
    swap = m.update_eval(5, flipped)
    assert len(swap) == 1 and "answered yes to all 9" in swap[0].message
    assert "where it answered no to all before" in swap[0].message
    assert "share of 'yes' (0.33)" in swap[0].message
    assert m.update_eval(6, flipped) == []          # still the same constant: alerted once
    state = json.loads(json.dumps(m.state_dict()))
    again = monitor()
    again.load_state_dict(state)
    assert again.update_eval(10, flipped) == []
    assert again.update_eval(15, {**flipped, "answered_yes": 5 / 9}) == []   # compares: re-armed
    back = again.update_eval(20, flipped)
    assert len(back) == 1 and "answered yes to all 9" in back[0].message
    assert "before" not in back[0].message   # after a mixed answer: not a swap
    never_yes = {**flipped, "answered_yes": 0.0}
    for quiet in ({**flipped, "yes_no_questions": 7}, {**flipped, "gold_yes": 0.9},
                  {"searches": 2.0}, {**flipped, "answered_yes": None},
                  # never yes, but not always no either (names, no answer): not constant
                  {**never_yes, "answered_no": 0.0}, {**never_yes, "answered_no": 0.5}):
        assert monitor().update_eval(0, quiet) == [], quiet
    off = Monitor(MonitorConfig(constant_answer_min=0))
    assert off.update_eval(0, flipped) == []
    older = monitor()   # a checkpoint from before this check
    older.load_state_dict({k: v for k, v in m.state_dict().items() if k != "constant_answer"})
    assert len(older.update_eval(0, flipped)) == 1
    assert len(monitor().update_eval(0, {**never_yes, "answered_no": 1.0})) == 1


def test_searching_more_only_warns():
    m = monitor()
    got = []
    for step, metrics in enumerate(series("searches", [2.0] * 10 + [8.0] * 20), start=1):
        got += [(step, a.severity, a.message) for a in m.update(step, metrics)]
    assert [g[:2] for g in got] == [(11, "warn")]  # mean 3.2 at once: 60% above
    assert "above its baseline 2" in got[0][2]
    assert m.healthy


def test_a_smaller_threshold_collapses_on_twice_the_drift():
    m = monitor(searches_drift=0.2)  # warn below 2.4 (mean), collapse below 1.8
    alerts = feed(m, series("searches", [3.0] * 10 + [1.0] * 5))
    assert alerts == {12: [("searches_drift", "warn")], 14: [("searches_drift", "collapse")]}


def test_near_zero_baselines_never_divide_by_zero():
    m = monitor()
    stream = [{"entropy": 0.0, "searches": 0.0, "grad_norm": 1e-12}] * 5 \
        + [{"entropy": 0.0, "searches": 3.0, "grad_norm": 1.0}]
    alerts = []
    for step, metrics in enumerate(stream, start=1):
        alerts += m.update(step, metrics)
    # entropy and searches have nothing to fall from; a norm from 1e-12 to 1 is an explosion
    assert [(a.step, a.kind, a.severity) for a in alerts] == [(6, "grad_norm_explosion", "collapse")]
    assert alerts[0].message == "grad norm 1 is far above its baseline 1e-12"


def test_nan_grad_norm_is_an_immediate_collapse_once():
    m = monitor()
    got = []
    for step, g in enumerate([math.nan, math.nan, 1.0, 1.0, math.inf], start=1):
        got.append((m.update(step, {"grad_norm": g}), m.healthy))
    assert [(a.kind, a.severity) for a in got[0][0]] == [("grad_norm_explosion", "collapse")]
    assert "nan" in got[0][0][0].message
    assert got[1] == ([], False)   # still collapsed: no repeat
    assert got[2] == ([], True)    # a finite norm: recovered
    assert [(a.step, a.severity) for a in got[4][0]] == [(5, "collapse")]
    # the non-finite values are not in the baseline and the state is plain JSON
    json.dumps(m.state_dict(), allow_nan=False)
    assert feed(m, series("grad_norm", [1.0] * 5), first_step=6) == {}


def test_missing_values_skip_their_checks_and_do_not_count():
    m = monitor()
    assert m.update(1, {}) == []
    assert m.update(2, {"grad_norm": None, "entropy": None, "correct_logp": None, "valid_format": None,
                        "searches": None, "reward_by_type": None}) == []
    assert m.update(3, {"entropy": math.nan, "reward_by_type": {"x": math.nan}}) == []
    # entropy reported on every other step only: its baseline is its first 5 values, the means
    # its last 5 values, however many steps apart
    stream = [{"entropy": 0.5} if i % 2 else {"searches": 2.0} for i in range(1, 20)] \
        + [{"entropy": 0.02}] * 5
    alerts = feed(m, stream, first_step=4)  # 0.116 after four 0.02s (steps 23-26), 0.02 after five
    assert alerts == {27: [("entropy_collapse", "collapse")]}
    assert m.state_dict()["signals"]["entropy"]["first"] == [0.5] * WINDOW


def test_no_signal_warns_then_collapses_and_recovers():
    m = monitor()  # no_signal_steps 3: warn on the 3rd tied step in a row, collapse on the 6th
    stream = series("groups_with_signal", [0.5, 0.25, 0.5] + [0.0] * 7 + [0.25] + [0.0] * 3)
    got, messages = {}, {}
    for step, metrics in enumerate(stream, start=1):
        alerts = m.update(step, metrics)
        got[step] = ([(a.kind, a.severity) for a in alerts], m.healthy)
        messages[step] = " ".join(a.message for a in alerts)
    assert {s: a for s, (a, _) in got.items() if a} == {
        6: [("no_signal", "warn")], 9: [("no_signal", "collapse")],
        # one varied step after seven without: some signal, too little (low_signal's)
        11: [("low_signal", "warn")], 14: [("no_signal", "warn")]}
    assert [s for s, (_, healthy) in got.items() if not healthy] == [9, 10]
    assert "for 3 steps in a row" in messages[6] and "for 6 steps" in messages[9]


def test_no_signal_needs_no_baseline_and_missing_steps_do_not_count():
    m = monitor(no_signal_steps=2)
    stream = series("groups_with_signal", [0.0, None, 0.0, 0.0, 0.0])
    assert feed(m, stream) == {3: [("no_signal", "warn")], 5: [("no_signal", "collapse")]}
    assert monitor().update(1, {"groups_with_signal": 0.0}) == []
    m = monitor(no_signal_steps=1)
    (alert,) = m.update(1, {"groups_with_signal": 0})
    assert alert.severity == "warn" and "for 1 step in a row" in alert.message


def test_low_signal_warns_when_few_groups_vary_and_says_which_way_they_tie():
    """A window whose groups mostly tie (some vary) warns, once, naming whether the ties
    are right answers (questions the policy knows) or wrong ones; it passes again when the
    share recovers, and a window without any signal is no_signal's, not this."""
    m = monitor()   # low_signal 0.2 over the 5-step window
    stream = [{"groups_with_signal": g, "groups_solved": 0.75}
              for g in [0.5] * 5 + [0.125] * 5 + [0.5] * 3 + [0.125] * 5]
    got = []
    for step, metrics in enumerate(stream, start=1):
        got += [(step, a.kind, a.severity, a.message) for a in m.update(step, metrics)]
        assert m.healthy
    # step 9's window holds one 0.5: mean 0.2, not below; step 10's is all 0.125; it passes
    # at step 11 and warns again once the window is low again (step 18)
    assert [(s, k, sev) for s, k, sev, _ in got] == [(10, "low_signal", "warn"),
                                                       (18, "low_signal", "warn")]
    msg = got[0][3]
    assert msg.startswith("only 12% of groups had rewards that varied over the last 5 steps "
                          "(a group-relative advantage learns from those alone); 75% of "
                          "groups answered right every time"), msg
    assert "rollout.temperature" in msg and "dynamic_sampling" in msg
    wrong = monitor()
    stream = [{"groups_with_signal": 0.125, "groups_solved": 0.0}] * 5
    (alert,), = feed_alerts(wrong, stream)
    assert "88% of groups tied below a right answer" in alert.message
    # many groups: a small share is not printed as 0%
    (alert,), = feed_alerts(monitor(), [{"groups_with_signal": 0.004}] * 5)
    assert alert.message.startswith("only 0.4% of groups")
    # no signal at all is the other check's; 0 turns the check off
    assert feed(monitor(no_signal_steps=10), series("groups_with_signal", [0.0] * 8)) == {}
    assert feed(monitor(low_signal=0), [{"groups_with_signal": 0.125}] * 8) == {}


def feed_alerts(m: Monitor, stream: list[dict]) -> list[list[Alert]]:
    """The alerts of the steps that raised any."""
    return [a for a in (m.update(step, x) for step, x in enumerate(stream, start=1)) if a]


def load_run(name: str) -> list[dict]:
    """Per-step metrics of a real run (bench/learning.py on an H100, 2026-11-22; the keys
    the monitor reads)."""
    path = Path(__file__).parent / "data" / f"monitor_h100_{name}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_recorded_grpo_collapse_is_flagged_before_the_format_collapse():
    """GRPO from the SFT checkpoint: from step 4 no group had signal (every rollout ran out
    of turns without answering); the format collapse's window crosses its threshold at step 7."""
    run = load_run("grpo")
    assert [r["groups_with_signal"] for r in run[3:]] == [0.0] * (len(run) - 3)
    m = monitor()
    alerts = {}
    for r in run:
        for a in m.update(r["step"], r):
            alerts.setdefault(a.kind, []).append((a.step, a.severity))
    assert alerts["no_signal"] == [(6, "warn"), (9, "collapse")]
    assert alerts["valid_format_collapse"] == [(7, "warn"), (8, "collapse")]
    assert not m.healthy


def test_the_recorded_dr_grpo_run_that_learned_is_not_called_a_collapse():
    m = monitor()
    kinds = [(a.kind, a.severity) for r in load_run("dr_grpo") for a in m.update(r["step"], r)]
    assert all(severity == "warn" for _, severity in kinds)
    assert ("searches_drift", "warn") in kinds   # it settled on one search per episode
    assert m.healthy


def test_disabled_monitor_is_silent_and_healthy():
    m = monitor(enabled=False)
    stream = series("grad_norm", [math.nan, 1.0, 1e9]) + series("entropy", [1.0] * 10 + [0.0] * 10)
    assert feed(m, stream) == {}
    assert m.healthy


def collapsing_stream(n: int) -> list[dict]:
    """A noisy run in which, from step 31, the policy stops searching, formats break and the
    multi-hop questions fail; step 41's gradient is nan."""
    out = healthy_stream(n, seed=3)
    for i, metrics in enumerate(out):
        if i >= 30:
            metrics["searches"] *= 0.3
            metrics["valid_format"] = max(0.0, metrics["valid_format"] - 0.01 * (i - 30))
            if "multi" in metrics["reward_by_type"]:
                metrics["reward_by_type"]["multi"] = -0.2
    out[40]["grad_norm"] = math.nan
    for metrics in out[50:60]:
        metrics["groups_with_signal"] = 0.0
    return out


def test_state_dict_round_trip_continues_identically():
    stream = collapsing_stream(80)
    reference = monitor()
    expected = feed(reference, stream)
    assert expected, "the scenario should raise alerts on both sides of the cut"
    assert any(s <= 36 for s in expected) and any(s > 41 for s in expected)
    assert ("no_signal", "warn") in expected[52] and ("no_signal", "collapse") in expected[55]

    for cut in (3, 36, 41, 53, 70):   # before any baseline, mid-warn, right after the nan,
        # inside the steps without signal, late
        first = monitor()
        before = feed(first, stream[:cut])
        state = json.loads(json.dumps(first.state_dict(), allow_nan=False))
        second = monitor()
        second.load_state_dict(state)
        assert second.state_dict() == first.state_dict()
        assert second.healthy == first.healthy
        after = feed(second, stream[cut:], first_step=cut + 1)
        assert {**before, **after} == expected
        assert second.state_dict() == reference.state_dict()


def test_alert_to_dict_is_json():
    a = Alert(step=3, kind="entropy_collapse", severity="warn", message="entropy 0.04 is 8% of ...")
    assert a.to_dict() == {"step": 3, "kind": "entropy_collapse", "severity": "warn",
                           "message": "entropy 0.04 is 8% of ..."}
    json.dumps(a.to_dict())
    assert a.kind in KINDS


def kinds(**made: tuple[float, float | None]) -> dict:
    """A step's lookups_by_kind: kind -> (made, planned)."""
    return {"lookups_by_kind": {k.replace("_", "-"): {"made": m, "planned": p, "n": 4}
                                for k, (m, p) in made.items()}}


def test_a_kind_whose_lookups_move_warns_while_the_mean_searches_hold():
    """The trade the mean hides: bridges drop a hop while single-hop questions stop
    over-hopping (the 50-step start's dev runs, bench/RESULTS.md 2026-11-28)."""
    m = monitor()
    steady = [kinds(bridge_3=(2.8, 2.9), single_1=(2.0, 2.0))] * WINDOW
    moving = [kinds(bridge_3=(1.2, 1.1), single_1=(1.0, 1.0))] * WINDOW
    for metrics in steady + moving:
        metrics["searches"] = 2.0   # the mean held (more bridges than single-hop drawn)
    alerts = [a for step in feed_alerts(m, steady + moving) for a in step]
    assert sorted(a.kind for a in alerts) == ["hop_drift", "hop_drift"]
    by = {a.message.split("'")[1]: a for a in alerts}
    assert all(a.severity == "warn" for a in alerts) and m.healthy
    # the window's mean (2.8 x 3 + 1.2 x 2) / 5 = 2.16 is the first more than 0.5 below 2.8
    assert by["bridge-3"].step == WINDOW + 2
    assert "'bridge-3' questions make 2.16 lookups" in by["bridge-3"].message
    assert "hops skipped" in by["bridge-3"].message
    assert "plans 2.18" in by["bridge-3"].message   # the planned mean over the same window
    assert "needs one" in by["single-1"].message
    assert feed(m, moving) == {}                     # alerted once


def test_hop_drift_is_per_kind_and_can_be_turned_off():
    m = monitor()
    stream = [kinds(single_1=(1.0, 1.0))] * 6 + [kinds(single_1=(1.0, 1.0), bridge_2=(2.0, 2.0))] * 6
    assert feed(m, stream) == {}   # a kind seen late gets its own baseline
    rising = [kinds(single_1=(1.9, 1.0))] * WINDOW
    alerts = feed_alerts(m, rising)
    assert len(alerts) == 1 and "over-hopping" in alerts[0][0].message
    unplanned = feed_alerts(monitor(), [kinds(single_1=(1.0, None))] * 5 + [kinds(single_1=(2.0, None))] * 5)
    assert len(unplanned) == 1 and "plans" not in unplanned[0][0].message
    off = monitor(hop_drift=0)
    assert feed(off, [kinds(bridge_2=(2.0, 2.0))] * 5 + [kinds(bridge_2=(1.0, 1.0))] * 5) == {}
    assert feed(monitor(), [{"lookups_by_kind": None}, {"lookups_by_kind": {"x": {"made": None}}}]) == {}


def test_hop_drift_weighs_each_step_by_its_episodes():
    """A kind drawn once in a step (one episode of three lookups) moves the pooled mean by
    one episode's worth, not a whole step's: no alert where the per-step means would
    (1.8 against 1.0); many episodes moving do alert; the counts survive a resume."""
    def step(made: float, n: int) -> dict:
        return {"lookups_by_kind": {"single-1": {"made": made, "planned": 1.0, "n": n}}}

    calm = [step(1.0, 8)] * WINDOW
    lone = [step(1.0, 8)] * 3 + [step(3.0, 1)] * 2
    assert feed(monitor(), calm + lone) == {}
    m = monitor()
    feed(m, calm)
    again = monitor()
    again.load_state_dict(m.state_dict())
    assert again.hops["single-1"].first_n == [8.0] * WINDOW
    assert feed(again, lone, first_step=WINDOW + 1) == {}
    alerts = feed_alerts(again, [step(3.0, 8)] * 2)
    assert len(alerts) == 1 and "over-hopping" in alerts[0][0].message
    old = m.state_dict()   # a checkpoint written before the counts: each step weighs one
    for s in old["hops"].values():
        del s["first_n"], s["last_n"]
    older = monitor()
    older.load_state_dict(old)
    assert older.hops["single-1"].baseline == 1.0
    assert feed_alerts(older, [step(3.0, 1)] * 2)   # per-step means again: 1.8


def test_greedy_hops_per_type_against_the_first_evaluation():
    m = monitor()
    def ev(bridge: float, single: float) -> dict:
        return {"by_type": {"bridge": {"searches": bridge, "planned_lookups": bridge},
                            "single": {"searches": single, "planned_lookups": single}}}
    assert m.update_eval(0, ev(2.4, 1.0)) == []
    assert m.update_eval(5, ev(2.1, 1.0)) == []    # 0.3: inside
    alerts = m.update_eval(10, ev(1.4, 1.0))
    assert [(a.kind, a.severity) for a in alerts] == [("greedy_hop_drift", "warn")]
    assert "greedy evaluation: 'bridge' questions make 1.40 lookups" in alerts[0].message
    assert "2.40 at the first evaluation" in alerts[0].message
    assert m.update_eval(15, ev(1.3, 1.0)) == []   # once
    state = json.loads(json.dumps(m.state_dict()))
    again = monitor()
    again.load_state_dict(state)
    assert again.state_dict() == m.state_dict()
    assert again.update_eval(20, ev(2.4, 1.0)) == []   # recovered: re-armed
    assert len(again.update_eval(25, ev(1.2, 1.0))) == 1
    older = monitor()   # a checkpoint from before these checks
    older.load_state_dict({k: v for k, v in m.state_dict().items()
                           if k not in ("hops", "plans", "greedy_hops")})
    assert older.update_eval(0, ev(1.3, 1.0)) == []


def test_a_collapse_after_a_fall_back_to_warn_alerts_again():
    """warn, collapse, back to warn (not passed), collapse again: the second collapse was
    silent (judged against the worst since the check last passed), and a run stopped on it
    with no alert line."""
    m = Monitor(MonitorConfig(window=2))
    got = feed(m, series("valid_format", [0.9, 0.9, 0.1, 0.1, 0.6, 0.6, 0.1, 0.1]))
    severities = [(step, sev) for step, alerts in got.items() for kind, sev in alerts
                  if kind == "valid_format_collapse"]
    assert [sev for _, sev in severities].count("collapse") == 2, got
    assert not m.healthy


def test_steps_too_easy_to_teach_do_not_count_towards_a_no_signal_collapse():
    """Five all-right steps (a warn: too easy) and one tie that was not all right made a
    collapse of "6 steps" with no_signal_steps 3, stopping a run that had one mixed step."""
    m = monitor(no_signal_steps=3)
    stream = [{"groups_with_signal": 0.0, "groups_solved": 1.0}] * 5 + \
        [{"groups_with_signal": 0.0, "groups_solved": 0.9}]
    got = feed(m, stream)
    assert all(sev != "collapse" for alerts in got.values() for _, sev in alerts), got
    assert m.healthy
    # six ties not solved are a collapse, as before
    m = monitor(no_signal_steps=3)
    got = feed(m, [{"groups_with_signal": 0.0, "groups_solved": 0.5}] * 6)
    assert got[6] == [("no_signal", "collapse")] and not m.healthy
    state = m.state_dict()   # the count of ties not solved resumes
    again = monitor(no_signal_steps=3)
    again.load_state_dict(state)
    assert again.unsolved_run == 6


def test_an_all_right_step_neither_breaks_nor_joins_a_run_of_unsolved_ties():
    """The "too easy" warning counts the all-right steps in a row, not the tied steps
    before them; one all-right step inside unsolved ties pauses their count (ten unsolved
    ties of eleven were healthy when it reset the count); the count resumes."""
    tie, easy = ({"groups_with_signal": 0.0, "groups_solved": x} for x in (0.0, 1.0))
    m = monitor(no_signal_steps=3)
    messages = {a.step: a.message for step, x in enumerate([tie, tie] + [easy] * 3, 1)
                for a in m.update(step, x)}
    assert list(messages) == [5] and "right for 3 steps in a row" in messages[5]
    m = monitor(no_signal_steps=3)
    got = feed(m, [tie] * 5 + [easy] + [tie] * 5)
    assert got[7] == [("no_signal", "collapse")] and not m.healthy
    m = monitor(no_signal_steps=3)
    feed(m, [easy] * 2)
    again = monitor(no_signal_steps=3)
    again.load_state_dict(m.state_dict())
    (alert,) = again.update(3, easy)
    assert alert.severity == "warn" and "right for 3 steps in a row" in alert.message
    # a varied step ends every run
    assert feed(monitor(no_signal_steps=3), [tie] * 2 + [{"groups_with_signal": 0.5}]
                + [tie] * 2 + [easy]) == {}


def test_the_plan_in_hop_drift_weighs_the_episodes_that_state_one():
    """`planned` is a mean over the episodes that state a plan (`n_planned`), so the pooled
    plan weighs those: 10 episodes of which one planned 3, then 2 that planned 1, is a plan
    of 1.67, not 2.67 (each weighed by all its step's episodes)."""
    def step(made: float, planned: float | None, n: int, n_planned: int) -> dict:
        return {"lookups_by_kind": {"bridge-2": {"made": made, "planned": planned, "n": n,
                                                 "n_planned": n_planned}}}
    m = Monitor(MonitorConfig(window=2))
    stream = [step(2.0, 3.0, 10, 1), step(2.0, 1.0, 2, 2), step(1.0, 1.0, 4, 1),
              step(1.0, None, 4, 0)]
    alerts = [a for s, x in enumerate(stream, 1) for a in m.update(s, x)]
    (drift,) = [a for a in alerts if a.kind == "hop_drift"]
    assert "plans 1.00" in drift.message, drift.message   # the last two steps' one plan
    m = Monitor(MonitorConfig(window=2))
    feed(m, stream[:2])
    assert m.plans["bridge-2"].recent == pytest.approx(5 / 3, abs=1e-9)


def test_stop_on_collapse_needs_the_monitor_on():
    from seekrl.config import ConfigError, TrainConfig
    from seekrl.recipes.train_checks import check_config

    with pytest.raises(ConfigError, match="monitor.stop_on_collapse: the monitor is off"):
        check_config(TrainConfig(data="d", index="i",
                                 monitor={"enabled": False, "stop_on_collapse": True}))
    check_config(TrainConfig(data="d", index="i", monitor={"enabled": False}))
