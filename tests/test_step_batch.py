"""The step batch the estimators read: where rewards sit, the step of each token, padding;
the vectorised recurrences against per-episode loops; estimators registered from outside."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seekrl.agent.trajectory import Step, Trajectory
from seekrl.config import AlgoConfig
from seekrl.rl.advantages import (
    ESTIMATORS,
    FACTS,
    compute_advantages,
    discounted_step_returns,
    estimate_advantages,
    gae_advantages,
    register,
    returns_to_go,
    step_returns,
)
from seekrl.rl.step_batch import Rewards, StepBatch


def episode(group: str, spec: list[tuple[str, int, int]], *, prompt: int = 2,
            tree: int | None = None) -> Trajectory:
    """spec: (action, policy tokens, retrieved tokens after it) per step."""
    ids, mask, steps = [0] * prompt, [0] * prompt, []
    for action, n, info in spec:
        steps.append(Step(start=len(ids), end=len(ids) + n, action=action,
                          query="q" if action == "search" else None))
        ids += [1] * n + [2] * info
        mask += [1] * n + [0] * info
    return Trajectory(example_id=group, group_id=group, question="q", golden_answers=["a"],
                      token_ids=ids, loss_mask=mask, prompt_len=prompt, steps=steps, tree=tree)


def ragged() -> list[Trajectory]:
    return [episode("g", [("search", 2, 3), ("answer", 2, 0)], prompt=3),   # 10 tokens
            episode("h", [("answer", 3, 0)]),                                # 5 tokens
            episode("g", [("search", 1, 2), ("search", 1, 2), ("answer", 1, 0)], prompt=1),
            episode("h", [], prompt=4)]                                      # no policy token


def test_the_batch_puts_rewards_on_their_tokens_and_numbers_steps_and_groups():
    trajs = ragged()
    tokens = [torch.zeros(len(t.token_ids)) for t in trajs]
    tokens[1][3] = -0.25
    rewards = Rewards([1.0, 0.5, 0.0, 2.0], [[0.25, -0.5], [0.125], [1.0, 0.0, 3.0], []],
                      tokens=tokens, sources={"s": (0.5, [[1.0, None], [None], [0.0, 1.0, None],
                                                          []])})
    b = StepBatch.build(trajs, rewards, values=[torch.ones(len(t.token_ids)) for t in trajs])
    assert b.shape == (4, 10) and b.lengths.tolist() == [10, 5, 8, 4]
    expected = torch.zeros(4, 10)
    expected[0, 4], expected[0, 9] = 0.25, 1.0 - 0.5        # search's last token; answer's
    expected[1, 3], expected[1, 4] = -0.25, 0.5 + 0.125     # a token reward; the outcome
    expected[2, 1], expected[2, 4], expected[2, 7] = 1.0, 0.0, 3.0
    assert torch.equal(b.token_rewards, expected)           # row 3: no policy token, nothing
    assert b.step_index[0].tolist() == [-1, -1, -1, 0, 0, -1, -1, -1, 1, 1]
    assert b.step_index[2].tolist() == [-1, 0, -1, -1, 1, -1, -1, 2, -1, -1]
    assert b.step_index[3].tolist() == [-1] * 10
    assert b.step_mask.tolist() == [[True, True, False], [True, False, False],
                                    [True, True, True], [False, False, False]]
    assert b.step_reward_position[2].tolist() == [1, 4, 7]
    assert b.step_rewards[2].tolist() == [1.0, 0.0, 3.0] and b.step_rewards.dtype == torch.float64
    assert b.sources["s"].weight == 0.5
    assert b.sources["s"].applies.tolist() == [[True, False, False], [False, False, False],
                                               [True, True, False], [False, False, False]]
    assert b.group_index.tolist() == [0, 1, 0, 1]
    assert [g.tolist() for g in b.groups] == [[0, 2], [1, 3]]
    assert b.n_searches.tolist() == [1, 0, 2, 0]
    assert b.totals.tolist() == [0.75, 0.375, 4.0, 2.0]
    # padding: no policy token, no reward, no value, no step
    for row, n in enumerate(b.lengths.tolist()):
        for x in (b.loss_mask, b.token_rewards, b.values):
            assert not x[row, n:].any()
        assert (b.step_index[row, n:] == -1).all()
    assert [len(x) for x in b.unpad(b.token_rewards)] == [10, 5, 8, 4]
    assert [x.tolist() for x in rewards.token_level(trajs)] == \
        [x.tolist() for x in b.unpad(expected)]


def test_per_step_spreads_step_values_on_their_policy_tokens_and_skips_none():
    t = episode("g", [("search", 2, 2), ("answer", 1, 0)])
    t.steps.insert(1, Step(start=6, end=6, action="invalid"))   # no tokens (old data)
    b = StepBatch.build([t], Rewards([0.0], [[0.0, 0.0, 0.0]]))
    values = torch.tensor([[1.5, 2.0, -1.0]], dtype=torch.float64)
    # the empty step hands its value to the policy token before it
    assert b.per_step(values).tolist() == [[0, 0, 1.5, 3.5, 0, 0, -1.0]]
    present = torch.tensor([[True, False, True]])
    assert b.per_step(values, present).tolist() == [[0, 0, 1.5, 1.5, 0, 0, -1.0]]
    assert b.applies(torch.tensor([[False, True, True]])).tolist() == \
        [[False, False, False, True, False, False, True]]


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_every_estimator_is_exactly_zero_off_policy_tokens_and_on_padding(name):
    trajs = ragged()
    g = torch.Generator().manual_seed(0)
    rewards = Rewards([1.0, 0.0, 0.5, 1.0], [[0.5, 0.0], [0.25], [0.0, 1.0, 0.0], []])
    b = StepBatch.build(trajs, rewards,
                        values=[torch.rand(len(t.token_ids), generator=g) for t in trajs])
    out = ESTIMATORS[name](b, AlgoConfig())
    advantages, returns = out[0], out[1]
    assert advantages.shape == returns.shape == b.shape
    assert advantages.dtype == torch.float32
    assert (advantages[b.loss_mask == 0] == 0).all()       # prompt, retrieved tokens, padding
    for row, n in enumerate(b.lengths.tolist()):
        assert (returns[row, n:] == 0).all()
    est = estimate_advantages(name, b, AlgoConfig())
    assert [len(a) for a in est.advantages] == [len(t.token_ids) for t in trajs]


# ---------------------------------------------------------------------- recurrences


def reference_returns_to_go(rewards: list[float], mask: list[bool], gamma: float) -> list[float]:
    """One episode, token by token, skipping non-policy tokens (seekrl's loop before the
    step batch)."""
    out, running = [0.0] * len(rewards), 0.0
    for i in range(len(rewards) - 1, -1, -1):
        if mask[i]:
            running = float(rewards[i]) + gamma * running
            out[i] = running
    return out


def reference_gae(rewards, values, mask, gamma: float, lam: float) -> list[float]:
    positions = [i for i, m in enumerate(mask) if m]
    out, running = [0.0] * len(rewards), 0.0
    for j in range(len(positions) - 1, -1, -1):
        p = positions[j]
        next_value = float(values[positions[j + 1]]) if j + 1 < len(positions) else 0.0
        delta = float(rewards[p]) + gamma * next_value - float(values[p])
        running = delta + gamma * lam * running
        out[p] = running
    return out


finite = st.floats(-10, 10, allow_nan=False, width=32)
token = st.tuples(finite, finite, st.booleans())   # reward, value, a policy token
batches = st.lists(st.lists(token, max_size=12), min_size=1, max_size=5)
unit = st.floats(0, 1, allow_nan=False)


def padded(rows, column, dtype=torch.float32):
    out = torch.zeros(len(rows), max(len(r) for r in rows), dtype=dtype)
    for b, r in enumerate(rows):
        out[b, :len(r)] = torch.tensor([x[column] for x in r], dtype=dtype)
    return out


@settings(max_examples=150, deadline=None)
@given(batches, unit, unit)
def test_vectorised_returns_and_gae_equal_per_episode_loops(rows, gamma, lam):
    rewards, values = padded(rows, 0), padded(rows, 1)
    mask = padded(rows, 2, torch.bool)   # padding: not a policy token
    rtg = returns_to_go(rewards, mask, gamma)
    gae = gae_advantages(rewards, values, mask, gamma, lam)
    for b, r in enumerate(rows):
        n = len(r)
        r_b, v_b, m_b = rewards[b, :n].tolist(), values[b, :n].tolist(), mask[b, :n].tolist()
        # bitwise: the same float64 sums, rounded to float32 once
        assert torch.equal(rtg[b, :n], torch.tensor(reference_returns_to_go(r_b, m_b, gamma),
                                                     dtype=torch.float32))
        assert torch.equal(gae[b, :n], torch.tensor(reference_gae(r_b, v_b, m_b, gamma, lam),
                                                    dtype=torch.float32))
        assert not rtg[b, n:].any() and not gae[b, n:].any()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(finite, st.lists(finite, max_size=5)), min_size=1, max_size=5), unit)
def test_vectorised_step_returns_equal_the_per_episode_form(episodes, gamma):
    trajs = [episode(f"g{i}", [("search", 1, 1)] * len(steps)) for i, (_, steps) in
             enumerate(episodes)]
    b = StepBatch.build(trajs, Rewards([o for o, _ in episodes], [s for _, s in episodes]))
    got = discounted_step_returns(b, gamma)
    for row, (outcome, steps) in enumerate(episodes):
        assert got[row, :len(steps)].tolist() == step_returns(outcome, steps, gamma)
        assert not got[row, len(steps):].any()


# ---------------------------------------------------------------------- registered estimators


@pytest.fixture
def scratch_registry():
    names = []
    yield names
    for name in names:
        ESTIMATORS.pop(name, None)
        FACTS.pop(name, None)


def test_estimators_registered_from_outside(scratch_registry):
    trajs = ragged()
    scratch_registry += ["test_batch_form", "test_bad_shape"]

    @register("test_batch_form")
    def batch_form(batch, cfg):   # the outcome on every policy token, reported
        adv = batch.loss_mask * batch.outcome.to(torch.float32)[:, None]
        return adv, adv.clone(), {"rows": batch.shape[0]}

    @register("test_bad_shape")
    def bad_shape(batch, cfg):
        return torch.zeros(1), torch.zeros(1)

    outcome = [1.0, 2.0, 3.0, 4.0]
    est = compute_advantages("test_batch_form", trajs, outcome)
    assert est.diagnostics == {"rows": 4}
    assert [a.tolist() for a in est.advantages] == \
        [[o * m for m in t.loss_mask] for t, o in zip(trajs, outcome)]
    with pytest.raises(ValueError, match="advantage estimator 'test_batch_form' is already"):
        register("test_batch_form")(batch_form)
    with pytest.raises(ValueError, match="'test_bad_shape': advantages of shape"):
        compute_advantages("test_bad_shape", trajs, outcome)


def test_values_must_match_the_tokens():
    trajs = ragged()
    with pytest.raises(ValueError, match="values: expected one per trajectory"):
        StepBatch.build(trajs, [0.0] * 4, values=[torch.zeros(10)])
    with pytest.raises(ValueError, match="values: episode 'h' has 5 tokens but 4 values"):
        StepBatch.build(trajs, [0.0] * 4,
                        values=[torch.zeros(len(t.token_ids) - (i == 1))
                                for i, t in enumerate(trajs)])


def test_an_empty_first_steps_reward_goes_to_the_nearest_policy_token_after_it():
    """A step without tokens and no policy token before it (old data) had its reward put
    on the episode's last token: another step's, whose per-step figures then dropped it."""
    from seekrl.agent.trajectory import Step, Trajectory
    from seekrl.rl.step_batch import step_reward_position

    t = Trajectory("q", "g", "?", ["a"], list(range(9)), [0, 0, 1, 1, 1, 0, 0, 1, 1], 2,
                   steps=[Step(2, 2, "invalid"), Step(2, 5, "search", text="<search> q </search>"),
                          Step(7, 9, "answer", text="<answer> a </answer>", answer="a")],
                   answer="a", finish_reason="answer")
    assert [step_reward_position(t, s) for s in t.steps] == [2, 4, 8]
