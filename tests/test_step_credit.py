"""Process supervision: token-level rewards, the step-level estimators against hand-computed
values, the process reward sources on crafted trajectories, prefix continuation and tree
rollouts on the tiny model."""

from __future__ import annotations

import pytest
import torch

from seekrl.agent.backends import Backend
from seekrl.agent.rollout import RolloutConfig, RolloutEngine, grow_trees
from seekrl.agent.trajectory import Step, Trajectory
from seekrl.config import AlgoConfig
from seekrl.data.qa import QAExample
from seekrl.models import tiny_policy
from seekrl.retrieval.base import Hit
from seekrl.rewards.process import (
    PROCESS_REWARDS,
    ProcessContext,
    group_has_signal,
    score_steps,
)
from seekrl.rl.advantages import (
    Rewards,
    anchor_states,
    compute_advantages,
    step_returns,
)

SEARCH = "<think> look </think>\n<search> q </search>"
ANSWER = "<think> done </think>\n<answer> a </answer>"


def ep(group: str, spec: list[tuple], *, prompt: int = 2, outcome: float = 0.0,
       sample: int = 0, gold=(), meta=None) -> Trajectory:
    """spec: (action, policy tokens, info tokens, query, hits[, text]) per step."""
    ids, mask, steps = [0] * prompt, [0] * prompt, []
    for action, n, info, query, hits, *text in spec:
        start = len(ids)
        ids += [1] * n
        mask += [1] * n
        s = Step(start=start, end=len(ids), action=action, query=query, hits=list(hits),
                 text=text[0] if text else (SEARCH if action == "search" else ANSWER))
        if info:
            s.info_start = len(ids)
            ids += [2] * info
            mask += [0] * info
            s.info_end = len(ids)
        steps.append(s)
    meta = dict(meta or {})
    origin = {k: meta.pop(k) for k in ("prompt_hits", "tree", "parent", "prefix_steps")
              if k in meta}   # fields of their own
    t = Trajectory(example_id=group, group_id=group, question="q", golden_answers=["a"],
                   token_ids=ids, loss_mask=mask, prompt_len=prompt, steps=steps,
                   outcome_reward=outcome, sample_index=sample, gold_doc_ids=list(gold),
                   metadata=meta, finish_reason="answer", **origin)
    t.check()
    return t


def search(n=2, info=2, query="q", hits=()):
    return ("search", n, info, query, hits)


def answer(n=1):
    return ("answer", n, 0, None, ())


# ---------------------------------------------------------------------- token-level rewards


def test_rewards_go_on_the_last_policy_token_and_each_steps_last_token():
    t = ep("g", [search(2, 3), answer(2)], prompt=3)
    r = Rewards([1.0], [[0.25, -0.5]]).token_level([t])[0]
    # prompt 0-2, search 3-4, info 5-7, answer 8-9
    expected = [0.0] * 10
    expected[4] = 0.25
    expected[9] = 1.0 - 0.5
    assert r.tolist() == pytest.approx(expected)
    assert Rewards([1.0], [[0.25, -0.5]]).totals() == [0.75]


def test_an_empty_step_hands_its_reward_to_the_policy_token_before_it():
    t = ep("g", [search(2, 2), answer(1)])
    t.steps.append(Step(start=len(t.token_ids), end=len(t.token_ids), action="invalid"))
    r = Rewards([0.0], [[0.0, 0.0, 2.0]]).token_level([t])[0]
    assert float(r.sum()) == 2.0 and r[len(t.token_ids) - 1] == 2.0


def test_step_reward_counts_must_match_the_steps():
    t = ep("g", [search(), answer()])
    with pytest.raises(ValueError, match="2 steps but 1 step rewards"):
        compute_advantages("dual_granularity", [t], Rewards([1.0], [[0.0]]))


# ---------------------------------------------------------------------- estimators


def test_dual_granularity_hand_computed():
    e1 = ep("g", [search(2, 2), answer(1)], outcome=1.0)
    e2 = ep("g", [answer(3)], outcome=0.0, sample=1)
    e3 = ep("h", [answer(2)], prompt=1, outcome=1.0)             # a singleton group
    rewards = Rewards([1.0, 0.0, 1.0], [[1.0, 0.0], [0.0], [0.5]])
    (a1, a2, a3), returns = compute_advantages("dual_granularity", [e1, e2, e3], rewards,
                                               AlgoConfig(beta=0.3))
    # outcome part: 1 - 0.5, 0 - 0.5, and 0 for the lone episode. Step scores per policy
    # token in group g: 1,1,0 | 0,0,0 -> mean 1/3, sample std sqrt(12/45)
    std = (12 / 45) ** 0.5
    z_hi, z_lo = (2 / 3) / std, (-1 / 3) / std
    assert a1.tolist() == pytest.approx([0, 0, 0.5 + 0.3 * z_hi, 0.5 + 0.3 * z_hi, 0, 0,
                                         0.5 + 0.3 * z_lo], abs=1e-5)
    assert a2.tolist() == pytest.approx([0, 0] + [-0.5 + 0.3 * z_lo] * 3, abs=1e-5)
    assert a3.tolist() == [0.0, 0.0, 0.0]     # lone, and its step scores do not vary
    assert torch.equal(returns[0], a1)


def test_dual_granularity_normalises_each_source_over_the_steps_it_judges():
    """Tied outcomes, one search that found gold and one that did not: the searches get
    +/- their evidence term, and the answers, which evidence cannot judge, get nothing from
    it (normalised over every step, both answers got a negative term)."""
    e1 = ep("g", [search(2, 2, query="a", hits=["d1"]), answer(1)], outcome=1.0, gold=["d1"])
    e2 = ep("g", [search(2, 2, query="b", hits=["d9"]), answer(1)], outcome=1.0, sample=1,
            gold=["d1"])
    score_steps([e1, e2], {"evidence": 1.0})
    rewards = Rewards.from_trajectories([e1, e2], {"evidence": 1.0})
    assert rewards.sources == {"evidence": (1.0, [[1.0, None], [0.0, None]])}
    (a1, a2), _ = compute_advantages("dual_granularity", [e1, e2], rewards,
                                     AlgoConfig(beta=0.3))
    z = 0.5 / (1 / 3) ** 0.5   # evidence 1,1 | 0,0 over the four search tokens: std sqrt(1/3)
    assert a1.tolist() == pytest.approx([0, 0, 0.3 * z, 0.3 * z, 0, 0, 0.0], abs=1e-5)
    assert a2.tolist() == pytest.approx([0, 0, -0.3 * z, -0.3 * z, 0, 0, 0.0], abs=1e-5)
    # the summed step rewards alone (no sources) put the answers below the mean
    (b1, b2), _ = compute_advantages("dual_granularity", [e1, e2],
                                     Rewards.from_trajectories([e1, e2]))
    assert float(b1[-1]) < 0 and float(b2[-1]) < 0


def test_standardised_evidence_marks_an_extra_search_down_raw_evidence_does_not():
    """Tied outcomes on a bridge: e1 found the first gold, searched again and found nothing;
    e2 found the same gold and answered. Standardised over the group's searches, e1's second
    search is below the mean and gets a negative term, though stopping (e2) gets nothing;
    with process_norm none it gets 0 and the gold-finding searches +beta x 0.5."""
    e1 = ep("g", [search(2, 2, query="a", hits=["d1"]), search(2, 2, query="b", hits=["d9"]),
                  answer(1)], outcome=0.0, gold=["d1", "d2"])
    e2 = ep("g", [search(2, 2, query="a", hits=["d1"]), answer(1)], outcome=0.0, sample=1,
            gold=["d1", "d2"])
    score_steps([e1, e2], {"evidence": 1.0})
    rewards = Rewards.from_trajectories([e1, e2], {"evidence": 1.0})
    assert rewards.sources == {"evidence": (1.0, [[0.5, 0.0, None], [0.5, None]])}
    (g1, g2), _ = compute_advantages("dual_granularity", [e1, e2], rewards,
                                     AlgoConfig(beta=0.3))
    second = g1[6:8]   # prompt 2, search 2 + info 2, then the second search's tokens
    assert float(second.max()) < 0 and float(g2[-1]) == 0.0
    (r1, r2), _ = compute_advantages("dual_granularity", [e1, e2], rewards,
                                     AlgoConfig(beta=0.3, process_norm="none"))
    assert r1.tolist() == pytest.approx([0, 0, 0.15, 0.15, 0, 0, 0, 0, 0, 0, 0], abs=1e-6)
    assert r2.tolist() == pytest.approx([0, 0, 0.15, 0.15, 0, 0, 0], abs=1e-6)
    with pytest.raises(ValueError, match="process_norm"):
        AlgoConfig(process_norm="batch")


def test_raw_step_rewards_are_refused_where_they_would_push_every_token_up():
    from seekrl.config import ConfigError, TrainConfig
    from seekrl.recipes.train import check_config

    base = {"data": "q.jsonl", "algo": {"advantage": "dual_granularity", "process_norm": "none"}}
    check_config(TrainConfig(**base, reward={"process": {"evidence": 1.0, "redundancy": 0.2}}))
    with pytest.raises(ConfigError, match="algo.process_norm: none .* prm"):
        check_config(TrainConfig(**base, reward={"process": {"prm": 1.0}, "prm": "x"}))
    with pytest.raises(ConfigError, match="algo.process_norm: only dual_granularity"):
        check_config(TrainConfig(data="q.jsonl", algo={"advantage": "gigpo",
                                                       "process_norm": "none"}))


def test_dual_granularity_sums_the_normalised_sources_with_their_weights():
    e1 = ep("g", [search(1, 1, query="a", hits=["d1"]), search(1, 1, query="a", hits=["d1"]),
                  answer(1)], outcome=1.0, gold=["d1"])
    e2 = ep("g", [search(1, 1, query="b", hits=["d2"]), answer(1)], sample=1, gold=["d1"])
    weights = {"evidence": 1.0, "redundancy": 0.5}
    score_steps([e1, e2], weights)
    rewards = Rewards.from_trajectories([e1, e2], weights)
    adv, _ = compute_advantages("dual_granularity", [e1, e2], rewards, AlgoConfig(beta=1))
    ev = torch.tensor([1.0, 0.0, 0.0])      # the three searches
    red = torch.tensor([0.0, -1.0, 0.0])
    zev, zred = (ev - ev.mean()) / ev.std(), (red - red.mean()) / red.std()
    step = (zev + 0.5 * zred).tolist()
    # outcome part: 1 - 0.5 and 0 - 0.5; searches carry their z terms, answers none
    assert adv[0].tolist() == pytest.approx([0, 0, 0.5 + step[0], 0, 0.5 + step[1], 0, 0.5],
                                            abs=1e-5)
    assert adv[1].tolist() == pytest.approx([0, 0, -0.5 + step[2], 0, -0.5], abs=1e-5)
    with pytest.raises(ValueError, match="process source 'evidence'"):
        compute_advantages("dual_granularity", [e1, e2],
                           Rewards(rewards.outcome, rewards.steps,
                                   sources={"evidence": (1.0, [[1.0], [0.0, None]])}))


def test_gigpo_hand_computed_with_anchor_states_and_a_singleton_step_group():
    e1 = ep("g", [search(query="x", hits=["d1"]), answer()], outcome=1.0)
    e2 = ep("g", [search(query=" X ", hits=["d1"]), answer()], sample=1)
    e3 = ep("g", [answer(2)], sample=2)
    e4 = ep("g", [search(query="y", hits=["d2"]), answer()], sample=3)
    trajs = [e1, e2, e3, e4]
    assert anchor_states(e2, "queries") == [(), ("x",)]
    assert anchor_states(e4, "docs") == [(), ("d2",)]
    # another tool's calls keep their argument: after opening document 2 or 5 the agent
    # stands in different states (both were '<open>', one step group)
    opened = [ep("g", [("open", 2, 2, arg, ()), answer()]) for arg in ("2", " 5")]
    assert [anchor_states(e, "queries")[1] for e in opened] == [("<open> 2",), ("<open> 5",)]
    assert anchor_states(ep("g", [("invalid", 2, 2, None, ()), answer()]), "queries")[1] == \
        ("<invalid>",)
    assert step_returns(1.0, [0.0, 0.0], 0.5) == [0.5, 1.0]
    cfg = AlgoConfig(step_gamma=0.5, step_weight=1.0)
    estimate = compute_advantages("gigpo", trajs, [1.0, 0.0, 0.0, 0.0], cfg)
    advs, _ = estimate
    # episode: totals 1,0,0,0 -> mean 0.25. Step group () : returns 0.5,0,0,0 -> mean 0.125.
    # step group ("x",): 1, 0 -> mean 0.5. ("y",): alone -> 0.
    step0 = [0.75 + 0.375, -0.25 - 0.125, -0.25 - 0.125, -0.25 - 0.125]
    step1 = [0.75 + 0.5, -0.25 - 0.5, None, -0.25 + 0.0]
    for a, t, s0, s1 in zip(advs, trajs, step0, step1):
        assert a[t.steps[0].start:t.steps[0].end].tolist() == pytest.approx([s0] * 2)
        if s1 is not None:
            assert float(a[t.steps[1].start]) == pytest.approx(s1)
        assert torch.count_nonzero(a[torch.tensor(t.loss_mask) == 0]) == 0
    assert estimate.diagnostics["step_groups"] == 3


def test_gigpo_similarity_joins_near_identical_queries():
    e1 = ep("g", [search(query="birthplace of ilsa marrow"), answer()], outcome=1.0)
    e2 = ep("g", [search(query="birthplace of ilsa marow"), answer()], sample=1)
    exact = AlgoConfig(step_gamma=1.0)
    fuzzy = AlgoConfig(step_gamma=1.0, anchor_similarity=0.9)
    a_exact, _ = compute_advantages("gigpo", [e1, e2], [1.0, 0.0], exact)
    a_fuzzy, _ = compute_advantages("gigpo", [e1, e2], [1.0, 0.0], fuzzy)
    answer_pos = e1.steps[1].start
    assert float(a_exact[0][answer_pos]) == pytest.approx(0.5)      # its step group: alone
    assert float(a_fuzzy[0][answer_pos]) == pytest.approx(0.5 + 0.5)  # joined: 1 vs 0


def test_stratified_grpo_hand_computed():
    trajs = [ep("g", [search(), answer()], sample=0), ep("g", [search(), answer()], sample=1),
             ep("g", [search(), search(), answer()], sample=2), ep("g", [answer()], sample=3)]
    advs, _ = compute_advantages("stratified_grpo", trajs, [1.0, 0.0, 1.0, 0.0],
                                 AlgoConfig(alpha=0.5))
    # group: 0.5, -0.5, 0.5, -0.5; strata by searches {1: [1, 0] -> +-0.5, 2: alone, 0: alone}
    assert [float(a[t.steps[0].start]) for a, t in zip(advs, trajs)] == \
        pytest.approx([0.5, -0.5, 0.25, -0.25])


def test_tree_grpo_hand_computed():
    trajs = [ep("g", [answer()], sample=i, meta={"tree": tree})
             for i, tree in enumerate([0, 0, 1, 1])]
    advs, _ = compute_advantages("tree_grpo", trajs, [1.0, 0.0, 0.0, 0.0])
    # group mean 0.25; tree 0 mean 0.5; tree 1 tied
    assert [float(a[2]) for a in advs] == pytest.approx([1.25, -0.75, -0.25, -0.25])


def test_gae_takes_step_rewards_on_their_tokens():
    t = ep("g", [search(2, 2), answer(1)], prompt=1)
    values = [torch.zeros(len(t.token_ids))]
    (a,), (ret,) = compute_advantages("gae", [t], Rewards([1.0], [[0.5, 0.0]]),
                                      AlgoConfig(whiten=False), values=values)
    # policy tokens 1, 2 | info 3, 4 | 5: gamma = lambda = 1, V = 0 -> reward-to-go
    assert a.tolist() == pytest.approx([0, 1.5, 1.5, 0, 0, 1.0])
    assert ret.tolist() == pytest.approx([0, 1.5, 1.5, 0, 0, 1.0])


def test_gae_whitens_with_algo_epsilon():
    t = ep("g", [search(2, 2), answer(1)], prompt=1)
    values = [torch.zeros(len(t.token_ids))]
    rewards = Rewards([1.0], [[0.5, 0.0]])
    (tight,), _ = compute_advantages("gae", [t], rewards, AlgoConfig(epsilon=1e-8),
                                     values=values)
    (loose,), _ = compute_advantages("gae", [t], rewards, AlgoConfig(epsilon=1.0),
                                     values=values)
    # advantages 1.5, 1.5, 1.0 on the policy tokens: centred, divided by std + epsilon
    assert loose.abs().sum() < tight.abs().sum() * 0.5


def test_tree_grpo_without_trees_is_dr_grpo():
    trajs = [ep("g", [answer()], sample=i) for i in range(4)]
    scores = [1.0, 0.0, 0.0, 0.0]
    tree, _ = compute_advantages("tree_grpo", trajs, scores)
    dr, _ = compute_advantages("dr_grpo", trajs, scores)
    assert [float(a[0]) for a in tree] == pytest.approx([float(a[0]) for a in dr])


def test_every_estimator_sees_step_rewards_through_the_total():
    """Outcome estimators score an episode by outcome + its step rewards."""
    e1, e2 = ep("g", [search(), answer()]), ep("g", [search(), answer()], sample=1)
    advs, _ = compute_advantages("dr_grpo", [e1, e2], Rewards([0.0, 0.0], [[1.0, 0.0],
                                                                          [0.0, 0.0]]))
    assert float(advs[0][2]) == pytest.approx(0.5) and float(advs[1][2]) == pytest.approx(-0.5)


# ---------------------------------------------------------------------- process rewards


def test_evidence_rewards_first_finds_of_gold_documents():
    t = ep("g", [search(hits=["d1", "d3"]), search(hits=["d1", "d4"]), search(hits=["d2"]),
                 answer()], gold=["d1", "d2"])
    lone = ep("h", [search(hits=["d1"]), answer()])              # gold unknown
    ctx = ProcessContext()
    # an answer has no retrieval to judge, nor has an episode without gold: None (not 0)
    assert PROCESS_REWARDS["evidence"]([t, lone], ctx) == [[0.5, 0.0, 0.5, None],
                                                             [None, None]]
    assert ctx.stats["evidence_no_gold"] == 1
    PROCESS_REWARDS["gold_found"]([t, lone], ctx)   # both sources read the same episodes:
    assert ctx.stats["evidence_no_gold"] == 1       # counted once (each had added them)
    rag = ep("r", [search(hits=["d1", "d2"]), answer()], gold=["d1", "d2"],
             meta={"prompt_hits": ["d2"]})                       # d2 was in the prompt
    assert PROCESS_REWARDS["evidence"]([rag], ctx) == [[0.5, None]]


def test_gold_found_credits_each_hop_alike():
    bridge = ep("g", [search(hits=["d1", "d3"]), search(hits=["d1", "d4"]), search(hits=["d2"]),
                      answer()], gold=["d1", "d2", "d5"])
    single = ep("h", [search(hits=["d9"]), answer()], gold=["d9"])
    lone = ep("k", [search(hits=["d1"]), answer()])              # gold unknown
    rows = PROCESS_REWARDS["gold_found"]([bridge, single, lone], ProcessContext())
    assert rows == [[1.0, 0.0, 1.0, None], [1.0, None], [None, None]]
    # evidence gives the same two finds 1/3 each against the single hop's 1
    assert PROCESS_REWARDS["evidence"]([bridge, single], ProcessContext()) == [
        [pytest.approx(1 / 3), 0.0, pytest.approx(1 / 3), None], [1.0, None]]


def test_evidence_falls_back_to_supporting_titles():
    t = ep("g", [search(hits=["x1"]), search(hits=["x2", "x3"]), answer()],
           meta={"supporting_titles": ["Ed Wood", "Scott Derrickson"]})
    t.steps[0].hit_titles = ["ed  wood"]
    t.steps[1].hit_titles = ["Ed Wood", "Scott Derrickson"]
    assert PROCESS_REWARDS["evidence"]([t], ProcessContext()) == [[0.5, 0.5, None]]
    # one title given as text is that title, not its letters (every search scored 0)
    one = ep("g", [search(hits=["x1"]), answer()], meta={"supporting_titles": "Ed Wood"})
    one.steps[0].hit_titles = ["Ed Wood"]
    assert PROCESS_REWARDS["evidence"]([one], ProcessContext()) == [[1.0, None]]


def test_documents_an_llm_wrote_earn_no_credit_by_title():
    """A simulated engine (its prompt holds the question) or the policy in self-search can
    write a document titled with a supporting title: no evidence, recall or decomposition
    credit, by title as by id."""
    from seekrl.retrieval.simulated import document_id

    sim = [document_id("Ed Wood", "x"), document_id("Scott Derrickson", "y")]
    t = ep("g", [search(hits=sim[:1]), search(hits=[sim[1], "x3"]), answer()],
           meta={"supporting_titles": ["Ed Wood", "Scott Derrickson"]})
    t.steps[0].hit_titles = ["Ed Wood"]
    t.steps[1].hit_titles = ["Scott Derrickson", "Scott Derrickson"]   # x3: a real one
    assert PROCESS_REWARDS["evidence"]([t], ProcessContext()) == [[0.0, 0.5, None]]
    assert t.evidence_recall() == 0.5
    t.steps[1].sub_queries, t.steps[1].sub_hits = ["a", "b"], [[sim[1]], ["x3"]]
    assert PROCESS_REWARDS["decomposition"]([t], ProcessContext()) == [[None, 0.5, None]]


def test_redundancy_penalises_repeated_queries_and_documents():
    t = ep("g", [search(query="a", hits=["d1", "d2"]), search(query="b", hits=["d2", "d3"]),
                 search(query=" A ", hits=["d1", "d2"]), answer()])
    assert PROCESS_REWARDS["redundancy"]([t], ProcessContext()) == [[0.0, -0.5, -1.0, None]]


def test_step_format_checks_the_tag_sequence():
    t = ep("g", [("search", 2, 2, "q", (), "<think> a </think> <search> q </search>"),
                 ("search", 2, 2, "q", (), "stray <search> q </search>"),
                 ("invalid", 2, 2, None, (), "<think> nothing </think>"),
                 ("answer", 1, 0, None, (), "<think> x <search> y </think><answer> a </answer>"),
                 ("answer", 1, 0, None, (), "<answer> a </answer>")])
    assert PROCESS_REWARDS["step_format"]([t], ProcessContext()) == [[0, -1, -1, -1, 0]]
    assert not t.valid_format      # the episode-level format uses the same check
    good = ep("h", [search(), answer()])
    assert good.valid_format


def test_mc_value_progress_from_prefix_continuations():
    e1 = ep("g", [search(), search(), answer()], outcome=1.0)
    e2 = ep("g", [answer()], sample=1, outcome=0.0)
    calls = []

    def cont(prefixes, n):
        calls.append([(t is e1, k) for t, k in prefixes])
        out = []
        for _t, k in prefixes:
            scores = [1.0, 0.0] if k == 1 else [1.0, 1.0]
            group = []
            for s in scores[:n]:
                c = ep("g", [search(), search(), answer()], outcome=s)
                group.append(c)
            out.append(group)
        return out

    ctx = ProcessContext(continue_episodes=cont, episode_score=lambda t: t.outcome_reward,
                         mc_samples=2)
    rewards = PROCESS_REWARDS["mc_value"]([e1, e2], ctx)
    assert calls == [[(True, 1), (True, 2)]]          # one batched call, every prefix
    # V0 = group mean 0.5; V1 = 0.5; V2 = 1; V3 = own score 1; e2: V1 = 0
    assert rewards == [[0.0, 0.5, 0.0], [-0.5]]
    assert [s.value for s in e1.steps] == [0.5, 1.0, 1.0]
    # continuations generate 5 policy tokens each, of which the prefix had 2 (k=1) or 4 (k=2)
    assert ctx.stats["mc_tokens"] == 2 * (5 - 2) + 2 * (5 - 4)
    assert sum(rewards[0]) == pytest.approx(1.0 - 0.5)   # telescopes to score - V0


def test_score_steps_weights_and_keeps_the_parts():
    t = ep("g", [search(query="a", hits=["d1"]), search(query="a", hits=["d1"]), answer()],
           gold=["d1"])
    score_steps([t], {"evidence": 2.0, "redundancy": 0.5})
    assert [s.process_parts for s in t.steps] == [
        {"evidence": 1.0, "redundancy": 0.0}, {"evidence": 0.0, "redundancy": -1.0},
        {"evidence": None, "redundancy": None}]
    assert [s.process_reward for s in t.steps] == [2.0, -0.5, 0.0]
    with pytest.raises(ValueError, match="process reward: expected one of .*, got 'bogus'"):
        score_steps([t], {"bogus": 1.0})
    with pytest.raises(ValueError, match="scorer"):
        score_steps([t], {"prm": 1.0})


def test_prm_slot_calls_the_scorer_batch_first():
    class Scorer:
        def __init__(self):
            self.calls = 0

        def score_steps(self, trajectories):
            self.calls += 1
            return [[0.1 * (i + 1) for i in range(len(t.steps))] for t in trajectories]

    scorer = Scorer()
    trajs = [ep("g", [search(), answer()]), ep("g", [answer()], sample=1)]
    score_steps(trajs, {"prm": 1.0}, ProcessContext(scorer=scorer))
    assert scorer.calls == 1
    assert [s.value for s in trajs[0].steps] == pytest.approx([0.1, 0.2])


def test_a_group_has_signal_when_scores_or_step_rewards_vary():
    a, b = ep("g", [search(), answer()]), ep("g", [search(), answer()], sample=1)
    assert not group_has_signal([a, b], [0.0, 0.0])
    assert group_has_signal([a, b], [1.0, 0.0])
    score_steps([a, b], {"step_format": 1.0})
    assert not group_has_signal([a, b], [0.0, 0.0])    # every step well-formed: all 0
    a.steps[0].process_reward = 0.5
    assert group_has_signal([a, b], [0.0, 0.0])


# ---------------------------------------------------------------------- prefix continuation


class Docs:
    docs = [Hit("d1", "Tarrow", "Tarrow is a city.", 2.0), Hit("d2", "Ilsa", "Ilsa was born.", 1.0)]

    def search(self, queries, k):
        return [self.docs[:k] for _ in queries]


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return tiny_policy(seed=5)


def questions(n=3):
    return [QAExample(f"q{i}", f"Question number {i}?", ["x"], {"gold_doc_ids": ["d1"]})
            for i in range(n)]


def test_greedy_continuation_reproduces_the_full_greedy_rollout(tiny):
    from seekrl.agent.backends import HFBackend

    model, tok = tiny
    cfg = RolloutConfig(max_turns=3, max_new_tokens=8, max_info_tokens=24, greedy=True,
                        batch_size=8)
    engine = RolloutEngine(HFBackend(model, tok), tok, Docs(), cfg)
    full = engine.run(questions())
    prefixes = [(t, k) for t in full for k in range(len(t.steps))
                if k == 0 or t.steps[k - 1].action != "answer"]
    assert any(k >= 2 for _, k in prefixes)
    conts = engine.continue_from(prefixes, 1)
    for (t, k), (c,) in zip(prefixes, conts):
        assert c.token_ids == t.token_ids, (t.example_id, k)
        assert c.loss_mask == t.loss_mask
        assert [s.action for s in c.steps] == [s.action for s in t.steps]
        assert [(s.start, s.end) for s in c.steps] == [(s.start, s.end) for s in t.steps]
        assert c.finish_reason == t.finish_reason and c.prefix_steps == k
        c.check()
    with pytest.raises(ValueError, match="cannot continue after step"):
        engine.continue_from([(full[0], len(full[0].steps) + 1)], 1)


def test_sampled_continuations_share_the_prefix_exactly(tiny):
    from seekrl.agent.backends import HFBackend

    model, tok = tiny
    cfg = RolloutConfig(max_turns=3, max_new_tokens=8, max_info_tokens=24, batch_size=16,
                        seed=3)
    engine = RolloutEngine(HFBackend(model, tok), tok, Docs(), cfg)
    (t,) = engine.run(questions(1))
    assert len(t.steps) >= 2
    cut = t.steps[0].info_end or t.steps[0].end
    (group,) = engine.continue_from([(t, 1)], 4, seed=11)
    assert len(group) == 4
    for c in group:
        assert c.token_ids[:cut] == t.token_ids[:cut] and c.steps[0].text == t.steps[0].text
        assert c.prefix_tokens == sum(t.loss_mask[:cut])
        assert c.steps[0].process_reward is None and c.outcome_reward is None
        c.check()
    assert len({tuple(c.token_ids) for c in group}) > 1     # they do differ after the prefix


def test_tree_rollouts_share_prefixes_and_name_their_tree(tiny):
    from seekrl.agent.backends import HFBackend

    model, tok = tiny
    cfg = RolloutConfig(max_turns=3, max_new_tokens=8, max_info_tokens=24, batch_size=16,
                        n_samples=2, seed=1)
    engine = RolloutEngine(HFBackend(model, tok), tok, Docs(), cfg)
    leaves = grow_trees(engine, questions(2), branches=2, rounds=1, seed=4)
    assert len(leaves) == 2 * 2 * (1 + 2)
    by_q = {}
    for t in leaves:
        by_q.setdefault(t.example_id, []).append(t)
        t.check()
    for group in by_q.values():
        assert sorted(t.sample_index for t in group) == list(range(6))
        assert sorted(t.tree for t in group) == [0, 0, 0, 1, 1, 1]
        for t in group:
            parent_index = t.parent
            if parent_index is None:
                continue
            parent = next(p for p in group if p.sample_index == parent_index)
            k = t.prefix_steps
            cut = (parent.steps[k - 1].info_end or parent.steps[k - 1].end) if k \
                else parent.prompt_len
            assert t.token_ids[:cut] == parent.token_ids[:cut]
            assert t.tree == parent.tree


def test_a_turn_ending_on_eos_keeps_it_as_a_trained_token(tiny):
    """A turn of nothing but EOS is still a step with one policy token to carry credit."""
    model, tok = tiny

    class EosThenAnswer(Backend):
        def __init__(self):
            self.turn = 0

        def generate(self, contexts, max_new_tokens, sampling, keys=None):
            self.turn += 1
            if self.turn == 1:
                return [[tok.eos_token_id] for _ in contexts]
            return [tok.encode("<answer> x </answer>", add_special_tokens=False)
                    for _ in contexts]

    engine = RolloutEngine(EosThenAnswer(), tok, Docs(), RolloutConfig(max_turns=3))
    (t,) = engine.run(questions(1))
    first = t.steps[0]
    assert first.action == "invalid" and first.end - first.start == 1
    assert t.token_ids[first.start] == tok.eos_token_id and t.loss_mask[first.start] == 1
    assert first.text == ""     # the text leaves the EOS out
    assert t.answer == "x"


def test_documents_that_do_not_fit_are_not_credited(tiny):
    """A search whose block would overflow max_total_tokens ends the episode; its documents
    were never shown, so the step records none (and evidence gives it nothing)."""
    model, tok = tiny

    class SearchOnce(Backend):
        def generate(self, contexts, max_new_tokens, sampling, keys=None):
            return [tok.encode("<search> Tarrow </search>", add_special_tokens=False)
                    for _ in contexts]

    probe = RolloutEngine(SearchOnce(), tok, Docs(), RolloutConfig(max_turns=3))
    (t,) = probe.run(questions(1))
    room = t.steps[0].end + 5          # the search fits, its block does not
    engine = RolloutEngine(SearchOnce(), tok, Docs(),
                           RolloutConfig(max_turns=3, max_total_tokens=room))
    (t,) = engine.run(questions(1))
    assert t.finish_reason == "length" and len(t.steps) == 1
    assert t.steps[0].hits == [] and t.steps[0].gold_hit is None
    assert PROCESS_REWARDS["evidence"]([t], ProcessContext()) == [[0.0]]


def test_continuing_after_a_step_nothing_followed_is_refused(tiny):
    t = ep("g", [search(2, 2), ("search", 2, 0, "q", ())])     # last-turn search: no block
    model, tok = tiny
    engine = RolloutEngine(Backend(), tok, Docs(), RolloutConfig())
    with pytest.raises(ValueError, match="ended the episode"):
        engine.continue_from([(t, 2)], 1)


@pytest.mark.parametrize("estimator", ["dual_granularity", "gigpo", "gae"])
def test_retrieved_tokens_get_zero_gradient_with_step_rewards(estimator):
    """Step-level advantages differ token by token; the prompt and the retrieved documents
    still get exactly zero gradient through the trainer's forward and loss."""
    from seekrl.models import backbone, collate
    from seekrl.rl.forward import masked_logprobs
    from seekrl.rl.loss import policy_loss

    model, _ = tiny_policy(seed=2)
    g = torch.Generator().manual_seed(0)
    trajs = [ep("g", [search(3, 4, query="a", hits=["d1"]), search(2, 3, query="b"), answer(2)],
                prompt=5, outcome=1.0, gold=["d1"]),
             ep("g", [search(2, 4, query="a", hits=["d2"]), answer(3)], prompt=5, sample=1,
                gold=["d1"])]
    for t in trajs:
        t.token_ids = torch.randint(5, 500, (len(t.token_ids),), generator=g).tolist()
    score_steps(trajs, {"evidence": 1.0, "redundancy": 0.5})
    values = [torch.rand(len(t.token_ids), generator=g) for t in trajs]
    advs, _ = compute_advantages(estimator, trajs, Rewards.from_trajectories(trajs),
                                 values=values)
    assert any(len(set(a[torch.tensor(t.loss_mask) == 1].tolist())) > 1
               for a, t in zip(advs, trajs))     # the advantage varies within an episode
    ids, attn, mask = collate([t.token_ids for t in trajs], [t.loss_mask for t in trajs], 0)
    grid = torch.zeros(ids.shape)
    for r, a in enumerate(advs):
        grid[r, :len(a)] = a
    # advantages off the policy tokens made non-zero: only the mask can keep them from training
    grid = grid + (1 - mask) * 3.0
    finals = []

    def keep(_module, _inputs, output):
        output.retain_grad()
        finals.append(output)

    handle = backbone(model).norm.register_forward_hook(keep)
    try:
        lp = masked_logprobs(model, ids, attn, mask, share_prompts=False)["logprobs"]
    finally:
        handle.remove()
    loss, _ = policy_loss(lp, lp.detach(), grid, mask)
    loss.backward()
    hidden = finals[-1]
    trained = torch.zeros(hidden.shape[:2], dtype=torch.bool)
    trained[:, :-1] = mask[:, 1:].bool() & attn[:, :-1].bool()   # position t predicts t + 1
    assert torch.count_nonzero(hidden.grad[~trained]) == 0
    assert torch.count_nonzero(hidden.grad[trained]) > 0


def test_a_prm_with_an_estimator_that_sums_step_rewards_is_refused():
    """A PRM scores every step in [0, 1]; summed into the episode's reward (GRPO, RLOO,
    GiGPO...) more turns earn more. dual_granularity normalises per step instead."""
    from seekrl.config import ConfigError, TrainConfig
    from seekrl.recipes.train import check_config

    for advantage in ("grpo", "dr_grpo", "gigpo"):
        cfg = TrainConfig(data="q.jsonl", algo={"advantage": advantage},
                          reward={"process": {"prm": 1.0}, "prm": "x"})
        with pytest.raises(ConfigError, match="more turns, more reward"):
            check_config(cfg)
    check_config(TrainConfig(data="q.jsonl", algo={"advantage": "dual_granularity"},
                             reward={"process": {"prm": 1.0}, "prm": "x"}))


def test_mc_value_with_an_estimator_that_sums_step_rewards_is_refused():
    """mc_value's step rewards telescope to the episode's score less the group's mean:
    summed into the outcome (dr_grpo gave 1.0 where the outcome alone gives 0.5), the
    outcome counts twice; its named method uses dual_granularity."""
    from seekrl.config import ConfigError, TrainConfig
    from seekrl.recipes.train import check_config

    for advantage in ("grpo", "dr_grpo", "gigpo", "gae", "stratified_grpo"):
        cfg = TrainConfig(data="q.jsonl", algo={"advantage": advantage},
                          reward={"process": {"mc_value": 1.0}})
        with pytest.raises(ConfigError, match="counting it twice"):
            check_config(cfg)
    check_config(TrainConfig(data="q.jsonl", algo={"advantage": "dual_granularity"},
                             reward={"process": {"mc_value": 1.0}}))


def test_a_process_source_giving_nan_is_refused_naming_it():
    from seekrl.rewards.process import score_steps

    def nan_source(trajectories, ctx):
        return [[float("nan")] * len(t.steps) for t in trajectories]

    PROCESS_REWARDS["nan_for_test"] = nan_source
    try:
        t = ep("g", [search(hits=["d1"]), answer()], gold=["d1"])
        with pytest.raises(ValueError, match="'nan_for_test' gave step 0 .* expected a finite"):
            score_steps([t], {"nan_for_test": 1.0})
    finally:
        del PROCESS_REWARDS["nan_for_test"]
