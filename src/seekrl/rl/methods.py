"""Named process-supervision methods: the config keys each one sets on top of a run.

`seekrl demo --process NAME` and `bench/process_ablation.py` pick from these, so the demo and
the benchmark mean the same thing by a name. Every method is plain `TrainConfig` keys
(`algo.advantage`, `reward.process`, `rollout.tree`, ...): a YAML config can say the same.

- `outcome`: the baseline, outcome reward only (the run's own estimator).
- `evidence`: ProRAG's dual-granularity advantage over rule-based step rewards: +share of
  the gold documents a search found first (information gain) and -0.2 x redundancy
  (repeated queries and documents), as StepSearch rewards them, with beta = 0.3.
- `evidence_raw`: `evidence` with the step rewards added as they are (`algo.process_norm:
  none`) instead of standardised over the group's searches, where a search that finds
  nothing falls below the mean and is marked down while stopping is not. Raw, with beta 0.3,
  a search that finds the gold of a single-hop question adds +0.3 a token, each hop of a
  2-hop bridge +0.15 (the share), a fully repeated query at most -0.06, beside an outcome
  advantage of about +-0.5 (Dr. GRPO's centred EM): a nudge, never negative for trying.
- `evidence_step`: `evidence` with `gold_found` in place of the information-gain share: each
  search that finds a new gold document earns 1 whatever the episode's number of hops (the
  share gives each hop of a 3-hop bridge 1/3, below a single-hop search's 1).
- `gigpo`: GiGPO's step groups on anchor states (the queries so far), outcome reward only.
- `gigpo_evidence`: GiGPO with the evidence and redundancy step rewards in the step returns.
- `mc_value`: dual-granularity over Monte-Carlo progress (2 continuations per step prefix by
  the current policy); its continuations count as rollout compute.
- `stratified`: Stratified GRPO, strata by number of searches, alpha = 0.5.
- `recall`: the outcome run's estimator on the outcome reward plus 0.5 x the episode's
  evidence recall (`reward.recall_bonus`): process supervision at the episode's granularity.
  Within a group that all answered wrong it still ranks the episode that made every hop
  above the one that answered after the first search, and it never marks a search down
  (a second search on a single-hop question costs nothing), where the step estimators'
  normalisation over the batch's searches can.
- `recall_cost`: `recall` with a cost of 0.1 a model turn (`reward.turn_cost`): a search
  that finds a missing gold document earns its share of 0.5 less 0.1 (a bridge's second hop
  +0.15, each hop of a 3-hop bridge +0.07), one that finds nothing new costs 0.1, so a
  single-hop question pays for stopping at one search while a bridge still pays for its
  hops, right or wrong.
- `hops`: the outcome run's estimator on the outcome reward plus 0.5 x how well the
  episode's number of lookups fits its question's hop count (`reward.hop_bonus`,
  `rewards.outcome.hop_match`): the hop decision gets a signal from both sides, whatever
  the searches found (one search on a single-hop question 0.5, two 0; one on a 2-hop
  bridge 0.25, two 0.5), where the outcome reward gives a bridge's hop credit only when
  the answer comes out right and `recall` only when the hop finds its document.
- `plan`: the outcome run's estimator on the outcome reward plus 0.5 x how well the
  episode's number of lookups keeps the plan its first thought states (`reward.plan_bonus`,
  `rewards.outcome.plan_match`): where the warm-up plans by the question, answering a
  bridge after one lookup of a two-lookup plan costs, while a single-hop question planned
  at one lookup is paid for stopping. It needs no hop count from the data, only a policy
  that states its plan.
- `answer`: the outcome reward's advantage on the answer's own tokens alone
  (`algo.answer_credit`): the tokens after the answer turn's `<answer>` tag learn what to
  answer, and nothing teaches the searches or the choice to stop (they move only through
  the weights they share with the answer), where the outcome on every token moves them.
  The estimator's own advantage is split (`rl.advantages.answer_shares`): the answer's
  tokens get all of it, the others the part the rest of the reward makes, at its scale.
- `hops_answer`: `hops` with the outcome on the answer alone: the hop-count bonus's part
  of the advantage is then the only signal on the searches and the choice to stop, and
  the outcome only on what the answer says.
- `prm`: ProRAG's RL stage on its own: dual-granularity over a trained process reward
  model's step scores (`reward.prm`: a `seekrl prm train` folder, which this method needs;
  `seekrl demo` trains none, so it does not offer it: `seekrl prorag` runs the whole pipeline).
- `tree`: Tree-GRPO-style tree rollouts (group_size / 2 trees, one branch each) with the
  tree-relative advantage.
"""

from __future__ import annotations

from typing import Any

EVIDENCE = {"evidence": 1.0, "redundancy": 0.2}

PROCESS_METHODS: dict[str, dict[str, Any]] = {
    "outcome": {},
    "evidence": {"algo.advantage": "dual_granularity", "reward.process": EVIDENCE},
    "evidence_raw": {"algo.advantage": "dual_granularity", "reward.process": EVIDENCE,
                     "algo.process_norm": "none"},
    "evidence_step": {"algo.advantage": "dual_granularity",
                      "reward.process": {"gold_found": 1.0, "redundancy": 0.2}},
    "gigpo": {"algo.advantage": "gigpo"},
    "gigpo_evidence": {"algo.advantage": "gigpo", "reward.process": EVIDENCE},
    "mc_value": {"algo.advantage": "dual_granularity", "reward.process": {"mc_value": 1.0},
                 "reward.mc_samples": 2},
    "stratified": {"algo.advantage": "stratified_grpo"},
    "tree": {"algo.advantage": "tree_grpo"},
    "recall": {"reward.recall_bonus": 0.5},
    "recall_cost": {"reward.recall_bonus": 0.5, "reward.turn_cost": 0.1},
    "hops": {"reward.hop_bonus": 0.5},
    "plan": {"reward.plan_bonus": 0.5},
    "answer": {"algo.answer_credit": True},
    "hops_answer": {"reward.hop_bonus": 0.5, "algo.answer_credit": True},
    "prm": {"algo.advantage": "dual_granularity", "reward.process": {"prm": 1.0}},
}
# methods that need an input the name does not give (a trained PRM: `reward.prm`)
NEEDS_PRM = frozenset({"prm"})


def method_overrides(name: str, *, group_size: int, baseline_advantage: str = "dr_grpo"
                     ) -> dict[str, Any]:
    """Dotted config keys for method `name`. The episode-level part of a step estimator
    follows the baseline: std-normalised when the baseline is GRPO, centred otherwise, so a
    comparison changes one thing."""
    if name not in PROCESS_METHODS:
        raise ValueError(f"process method: expected one of {', '.join(PROCESS_METHODS)}, "
                         f"got {name!r}")
    keys = dict(PROCESS_METHODS[name])
    if "algo.advantage" not in keys:   # outcome, recall(_cost): the baseline's own estimator
        return {"algo.advantage": baseline_advantage, **keys}
    keys["algo.std_norm"] = baseline_advantage == "grpo"
    if name == "tree":
        if group_size % 2:
            raise ValueError(f"process method tree: group_size must be even (2 leaves per "
                             f"tree), got {group_size}")
        keys["rollout.tree"] = {"trees": group_size // 2, "branches": 1, "rounds": 1}
    return keys
