"""The RL recipe's own checks of its config: registry names and the rules between keys,
made before anything slow happens (a model load, an index) by the trainer and by
`seekrl train --print-config`. Types and ranges are the schema's (`TrainConfig`)."""

from __future__ import annotations

import warnings
from pathlib import Path

from seekrl.config import TrainConfig
from seekrl.errors import ConfigError
from seekrl.recipes.checkpoint import check_run_dir, held_markers
from seekrl.recipes.setup import check_eval_data, check_eval_index, check_name, check_world_index
from seekrl.rewards.outcome import load_reward_fn, question_hops

# the built-in estimators whose baseline is the question's group
_GROUP_RELATIVE = frozenset({"grpo", "dr_grpo", "rloo", "dual_granularity", "gigpo",
                             "stratified_grpo"})


def check_old_logprobs(cfg: TrainConfig, facts) -> None:
    """algo.old_logprobs: rollout stands in for the trainer's forward pass only where the
    sampler's numbers mean the same and the pass is not needed anyway."""
    algo = cfg.algo
    if algo.old_logprobs != "rollout":
        return
    if cfg.rollout.top_p < 1:
        raise ConfigError(
            f"algo.old_logprobs: rollout: the sampler's log-probs are of the top-p truncated "
            f"distribution (rollout.top_p {cfg.rollout.top_p}), not the policy's; set top_p "
            "1 or use recompute")
    if facts.needs_values or (algo.kl_coef > 0 and algo.kl_in_reward):
        raise ConfigError(
            "algo.old_logprobs: rollout saves a forward pass that this run makes anyway (the "
            f"{'critic' if facts.needs_values else 'KL reward'} needs it); use recompute")
    if algo.tis_cap:
        raise ConfigError("algo.old_logprobs: rollout makes the trainer's ratio to the "
                          "sampler 1 by construction, so algo.tis_cap corrects nothing; "
                          "turn one off")


def check_config(cfg: TrainConfig, *, scorer_given: bool = False) -> None:
    """The RL recipe's registry names and cross-key rules, checked before anything slow
    happens (the trainer, and `seekrl train --print-config`, call it). Schema types and
    ranges are `TrainConfig`'s own. `scorer_given`: a PRM object is passed in
    (`Trainer(prm_scorer=...)`), so `reward.prm` need not name one. Your own parts by
    import path (`reward.fn`, `retriever`, a `reward.process` source, `algo.advantage`) are
    imported here and checked for their kind (seekrl/plugins.py); sources and estimators
    are registered under their path."""
    from seekrl.plugins import check_retriever
    from seekrl.rewards.outcome import OUTCOMES
    from seekrl.rewards.process import PROCESS_REWARDS
    from seekrl.rl.advantages import ESTIMATORS, FACTS
    from seekrl.rl.loss import AGGREGATIONS, POLICY_LOSSES

    algo = cfg.algo
    _check_log_packages(cfg.log)
    if cfg.monitor.stop_on_collapse and not cfg.monitor.enabled:
        raise ConfigError("monitor.stop_on_collapse: the monitor is off (monitor.enabled: "
                          "false), so no collapse is ever seen; turn it on or leave this out")
    if cfg.rollout.tools:
        from seekrl.agent.tools import check_tool_names
        check_tool_names(cfg.rollout.tools)
    # the registries take your own parts by import path too (imported and registered here)
    for name in cfg.reward.process:
        PROCESS_REWARDS.lookup(name, f"reward.process.{name}")
    ESTIMATORS.lookup(algo.advantage, "algo.advantage")
    POLICY_LOSSES.lookup(algo.policy_loss, "algo.policy_loss")
    if cfg.retriever:
        check_retriever("retriever", cfg.retriever, cfg.index)
    if cfg.reward.fn:
        load_reward_fn(cfg.reward.fn)
        if bonuses := _bonuses(cfg.reward):
            warnings.warn(f"{' and '.join(bonuses)} set with reward.fn: the function replaces "
                          "the built-in reward, bonuses included, so they add nothing "
                          "(add them in the function)", stacklevel=2)
    else:
        OUTCOMES.lookup(cfg.reward.outcome, "reward.outcome")
        if cfg.reward.recall_bonus and (finds := sorted(
                n for n in ("evidence", "gold_found") if cfg.reward.process.get(n))):
            # the searches' finds, summed over an episode, are its recall again (evidence)
            # or a count of the searches that found gold (gold_found)
            warnings.warn(
                f"reward.recall_bonus {cfg.reward.recall_bonus} with reward.process "
                f"{' and '.join(finds)}: both pay for the gold documents the searches find "
                "(the bonus for the episode's recall, the step reward for each search that "
                "finds one), so a found document counts twice; keep one unless that is "
                "meant", stacklevel=2)
    check_name("algo.loss_agg", algo.loss_agg, AGGREGATIONS)
    facts = FACTS[algo.advantage]
    if algo.kl_coef > 0 and not algo.kl_in_reward and algo.kl_estimator == "k1":
        raise ConfigError(
            "algo.kl_estimator: k1 as a loss term has zero expected gradient (grad of log p - "
            "log q is grad log p), so it regularises nothing; use k3, or k1 with "
            "algo.kl_in_reward: true")
    if algo.kl_coef > 0 and algo.kl_in_reward and not facts.reads_token_rewards:
        readers = sorted(n for n, f in FACTS.items() if f.reads_token_rewards)
        raise ConfigError(
            f"algo.kl_in_reward: the per-token KL reward is read by {' and '.join(readers)} "
            f"only; algo.advantage is {algo.advantage!r} (use the KL loss term there: "
            "kl_in_reward: false)")
    check_old_logprobs(cfg, facts)
    if algo.answer_credit:
        from seekrl.rl.advantages import ANSWER_CREDIT_ESTIMATORS
        if algo.advantage not in ANSWER_CREDIT_ESTIMATORS:
            raise ConfigError(
                f"algo.answer_credit: it splits an estimator that gives each episode one "
                f"advantage from its group ({', '.join(ANSWER_CREDIT_ESTIMATORS)}); "
                f"algo.advantage is {algo.advantage!r}")
        if cfg.reward.process:
            raise ConfigError(
                "algo.answer_credit: the step rewards (reward.process: "
                f"{', '.join(sorted(cfg.reward.process))}) have their own tokens; it splits "
                "the episode's reward alone, so leave reward.process empty")
    turns = cfg.rollout.max_turns
    if not cfg.reward.fn and turns > 1 and cfg.reward.turn_cost * (turns - 1) >= 1:
        # a right answer earns at most 1 more than a wrong one (both valid): past this,
        # answering at once (wrong) ranks at or above answering right after every turn,
        # and the group's advantages teach the policy not to search
        warnings.warn(
            f"reward.turn_cost: {cfg.reward.turn_cost} a turn makes a right answer after "
            f"{turns} turns (rollout.max_turns) score no more than a wrong answer given at "
            f"once (the outcome adds at most 1); below {1 / (turns - 1):.3g} it does not",
            stacklevel=2)
    if algo.process_norm != "group":
        if algo.advantage != "dual_granularity":
            raise ConfigError(f"algo.process_norm: only dual_granularity reads it; "
                              f"algo.advantage is {algo.advantage!r}")
        every = sorted(set(cfg.reward.process) & {"prm", "mc_value"})
        if every:
            raise ConfigError(f"algo.process_norm: none adds each source's raw value, but "
                              f"{', '.join(every)} score every step in [0, 1]: added raw they "
                              "push every token of every episode up, with no contrast; keep "
                              "group for them")
    if cfg.reward.prm and "prm" not in cfg.reward.process:
        raise ConfigError("reward.prm: nothing reads it without a prm step reward (add "
                          "reward.process.prm, or --process prm, or leave reward.prm out)")
    if "prm" in cfg.reward.process and not cfg.reward.prm and not scorer_given:
        raise ConfigError("reward.process.prm: no process reward model given (set "
                          "reward.prm to a `seekrl prm train` folder, e.g. RUN/final)")
    # step rewards this estimator would add into the episode's score, where only
    # dual_granularity (their named methods' estimator) normalises them across the group
    summed = {
        "prm": "a PRM scores every step in [0, 1], and this estimator adds the step rewards "
               "into the episode's (a right answer at once 1.7, a wrong one after seven "
               "searches 4.9 at 0.6 a step): more turns, more reward",
        "mc_value": "its step rewards are the Monte-Carlo value's gains, which add up to the "
                    "episode's score less the group's mean; this estimator adds them to the "
                    "outcome, counting it twice"}
    for name in sorted(set(cfg.reward.process) & set(summed)):
        if algo.advantage != "dual_granularity":
            raise ConfigError(f"reward.process.{name} with algo.advantage "
                              f"{algo.advantage!r}: {summed[name]}. dual_granularity "
                              f"(`--process {name}`) normalises each step's value across "
                              "the group instead")
    tree = cfg.rollout.tree
    if tree is not None:
        if tree.leaves != cfg.group_size:
            raise ConfigError(f"rollout.tree: {tree.trees} trees x (1 + {tree.branches} "
                              f"branches x {tree.rounds} rounds) make {tree.leaves} episodes per "
                              f"question, but group_size is {cfg.group_size}; set group_size="
                              f"{tree.leaves}")
        if cfg.rollout.method != "agent":
            raise ConfigError("rollout.tree: tree rollouts branch at search steps; they need "
                              "rollout.method: agent")
    if (algo.llds_coef > 0 and algo.epochs == 1
            and algo.mini_batch_size >= cfg.questions_per_step * cfg.group_size):
        raise ConfigError(
            "algo.llds_coef: LLDS compares each token's log-prob with the sampling policy's, "
            "which with one update per batch (epochs 1, mini_batch_size >= questions_per_step "
            "x group_size) has not moved yet: the term would always be 0; use several "
            "mini-batches (a smaller algo.mini_batch_size) or epochs")
    if cfg.group_size == 1 and tree is None and algo.advantage in _GROUP_RELATIVE:
        raise ConfigError(
            f"group_size: 1 with algo.advantage {algo.advantage}: it compares each episode "
            "with the others of its question's group, and a group of one has none, so every "
            "advantage is 0 and nothing is learned; set group_size >= 2 (4-8 is usual), or "
            "use an estimator that needs no group (gae with a critic, reinforce_pp)")
    if cfg.group_size == 1 and tree is None and algo.dynamic_sampling:
        raise ConfigError(
            "algo.dynamic_sampling with group_size: 1: it keeps the groups whose rewards "
            "vary, and a group of one never varies, so every step would play its refills and "
            "skip its update; set group_size >= 2 or dynamic_sampling: false")
    if facts.needs_tree and tree is None:
        raise ConfigError(f"algo.advantage: {algo.advantage} needs tree rollouts (rollout.tree)")
    if cfg.ranker is not None:
        if cfg.simulator is not None or cfg.rollout.self_search:
            raise ConfigError("ranker: it orders a real retriever's candidates; simulated "
                              "search and self-search have none")
        if cfg.rollout.method == "direct":
            raise ConfigError("ranker: rollout.method direct does not search")
    # simulated search and self-search stand in for the agent's retriever; set where nothing
    # would ask them, they are refused rather than loaded and ignored
    if cfg.simulator is not None and cfg.rollout.self_search:
        raise ConfigError("simulator: rollout.self_search has the policy write its own "
                          "documents, so the simulator would never be asked; set one of them")
    if cfg.simulator is not None and cfg.rollout.method == "direct":
        raise ConfigError("simulator: rollout.method direct does not search")
    if cfg.rollout.self_search and cfg.rollout.method != "agent":
        raise ConfigError(f"rollout.self_search: the policy writes the documents of its own "
                          f"search turns; rollout.method is {cfg.rollout.method!r} (set "
                          "rollout.method: agent)")
    if cfg.rollout.self_search and cfg.rollout.max_queries > 1:
        raise ConfigError("rollout.self_search: the policy writes one information block a "
                          "search, not one per sub-query; rollout.max_queries "
                          f"{cfg.rollout.max_queries} would offer ## it cannot answer (set 1)")
    if cfg.rollout.self_search and cfg.rollout.tools:
        raise ConfigError(f"rollout.self_search: rollout.tools {cfg.rollout.tools} act on "
                          "retrieved documents (open one, ...), and self-search retrieves "
                          "none (the policy writes them); set one of the two")
    if "decomposition" in cfg.reward.process and cfg.rollout.max_queries < 2:
        raise ConfigError("reward.process.decomposition: it scores searches of several "
                          "sub-queries by the gold documents they find, but "
                          "rollout.max_queries is 1: no search holds several")


def check_start(cfg: TrainConfig, *, scorer_given: bool, resume: bool, overwrite: bool,
                processes: int, main: bool, model_given: bool) -> None:
    """What a run checks before anything slow loads (a model, an index): the config
    (`check_config`), the data and the PRM it reads, a backend that can run here, and a run
    folder that fits the request (a fresh one, one to replace, or a checkpoint to resume)."""
    from seekrl.agent.factory import backend_refusal

    check_config(cfg, scorer_given=scorer_given)
    check_world_index(cfg.index, cfg.data)
    check_eval_index(cfg.index, cfg.data, cfg.eval)
    check_eval_data(cfg.eval)   # read now, not at the first evaluation after training
    if "prm" in cfg.reward.process and not scorer_given:
        from seekrl.rewards.prm import prm_folder
        try:
            prm_folder(cfg.reward.prm)
        except FileNotFoundError as err:
            raise ConfigError(f"reward.prm: {err}") from None
    out = Path(cfg.out)
    # a GPU other than the first is refused, as seekrl eval does (vllm takes the first it
    # sees); a CPU policy pushes its weights to the engine wherever that runs
    why = backend_refusal(cfg.rollout.backend, "train", processes=processes,
                          device=cfg.device if cfg.device.startswith("cuda") else None)
    if why:
        raise ConfigError(f"rollout.backend {cfg.rollout.backend}: {why}")
    if cfg.rollout.backend == "vllm":
        from seekrl.agent.vllm_backend import import_vllm
        import_vllm()
    if cfg.ranker is not None and cfg.ranker.train and processes > 1:
        raise ConfigError("ranker.train: the ranker trains in one process; with several "
                          "processes give a trained ranker and ranker.train: false")
    if resume and overwrite:   # as SFT and the PRM refuse it: which one was meant?
        raise ConfigError("--resume and --overwrite: continue the run or replace it, not both")
    if resume and not (out / "checkpoints" / "latest").is_file():
        raise FileNotFoundError(
            f"--resume: {out} has no checkpoint yet (no checkpoints/latest); "
            + (f"it stopped before its first checkpoint (save_every {cfg.save_every}): start "
               "it again with --overwrite" if held_markers(out)
               else "start the run again without --resume"))
    if resume:   # before a model loads, on every process (none goes on alone)
        from seekrl.recipes.checkpoint import (
            config_changes,
            refuse_optimizer_changes,
            refuse_weight_changes,
        )
        changed = config_changes(out / "config.yaml", cfg)
        refuse_weight_changes(changed, out / "config.yaml")
        refuse_optimizer_changes(changed, out / "config.yaml",
                                 ranker_trains=cfg.ranker is not None and cfg.ranker.train)
    if main:   # the run folder is rank 0's
        check_run_dir(out, resume=resume, overwrite=overwrite,
                      model=None if model_given else cfg.model)


def _check_log_packages(log) -> None:
    """`log.tensorboard` / `log.wandb` need their packages: checked before a model loads."""
    import importlib.util

    for key, package in (("tensorboard", "tensorboard"), ("wandb", "wandb")):
        if getattr(log, key) and importlib.util.find_spec(package) is None:
            raise ConfigError(f"log.{key}: needs the {package} package (pip install "
                              f"{package}), which is not installed; install it or set "
                              f"log.{key}=false")


def _bonuses(reward) -> list[str]:
    return [f"reward.{k}" for k in ("recall_bonus", "hop_bonus", "plan_bonus")
            if getattr(reward, k)]


def bonus_coverage(reward, questions, *, custom: bool = False) -> str | None:
    """A warning when a reward bonus cannot act on some of the training questions:
    `hop_bonus` needs an integer `metadata.hops`, `recall_bonus` the gold documents
    (`metadata.gold_doc_ids` or `supporting_titles`); an episode of a question without
    them earns the outcome alone, and a method named for the bonus (`hops`, `recall`)
    then trains outcome-only without saying so. `custom`: a reward function given to the
    trainer replaces the built-in reward, bonuses included. None when every bonus set
    can act (`reward.fn` is `check_config`'s to warn about). `plan_bonus` reads the
    policy's own stated plan, not the data, so the questions cannot tell whether it acts:
    the step log's `lookups_by_kind` (`n_planned`) shows it."""
    if reward.fn:
        return None
    if custom:
        bonuses = _bonuses(reward)
        return (f"{' and '.join(bonuses)} set with a reward function of your own "
                "(Trainer(reward_fn=...)): it replaces the built-in reward, bonuses included, "
                "so they add nothing") if bonuses else None
    needs = {"hop_bonus": ("an integer metadata.hops", lambda m: question_hops(m) is not None),
             "recall_bonus": ("gold documents (metadata.gold_doc_ids or supporting_titles)",
                              lambda m: bool(m.get("gold_doc_ids") or m.get("supporting_titles")))}
    notes = []
    for key, (what, has) in needs.items():
        if not getattr(reward, key):
            continue
        lacking = [q.id for q in questions if not has(q.metadata)]
        if len(lacking) == len(questions):
            notes.append(f"reward.{key} {getattr(reward, key)}: no training question has "
                         f"{what}, so no episode earns the bonus (outcome only)")
        elif lacking:
            notes.append(f"reward.{key} {getattr(reward, key)}: {len(lacking)} of "
                         f"{len(questions)} training questions (e.g. {lacking[0]!r}) lack "
                         f"{what}; their episodes earn no bonus")
    return "; ".join(notes) or None


def plan_coverage(reward, trajs, step: int, *, custom: bool = False) -> str | None:
    """A warning when `reward.plan_bonus` is set and no episode of a step states a plan (the
    first thought's "I need N lookups", `Trajectory.planned_lookups`): none earns the bonus,
    and the run trains on the outcome alone without saying so. The questions cannot tell
    this before the run (`bonus_coverage`); the policy's first episodes do. None otherwise,
    and with a reward of the user's own (`reward.fn`, `custom`), which has no such bonus."""
    if not reward.plan_bonus or reward.fn or custom or not trajs:
        return None
    if any(t.planned_lookups is not None for t in trajs):
        return None
    from seekrl.agent.oracle import PLAN_LEAD

    return (f"reward.plan_bonus {reward.plan_bonus}: none of step {step}'s {len(trajs)} "
            f"episodes states a plan in its first thought ({PLAN_LEAD!r}N lookups), so none "
            "earns the bonus (outcome only); a policy warmed up on seekrl's SFT data "
            "(seekrl sft) states one")


def learned_questions(model: str, questions, *, limit: int = 128 << 20) -> str | None:
    """A warning when most of RL's `questions` are in the data the starting checkpoint was
    fine-tuned on, for half a pass over it or more: `model` an SFT run's `final/` or one of
    its `checkpoints/step-N`, whose run's config.yaml names its `data` (a JSONL of episodes
    with a `question` key; its first `limit` bytes are read, a check and not a second load,
    and the rest estimated from the file's size), its `limit` and its length (`max_steps` x
    `batch_size` x `grad_accum` episodes, or `epochs`). Such a start has learned those
    answers: RL on them rewards recall, not what carries over to unseen questions. None
    when it cannot tell."""
    import json

    from seekrl.config.loading import build_config, read_config_file
    from seekrl.config.schema import SFTConfig
    from seekrl.errors import ConfigError

    folder = Path(model)
    run = folder.parent.parent if folder.parent.name == "checkpoints" else folder.parent
    config = run / "config.yaml"
    if not folder.is_dir() or not config.is_file():
        return None
    try:
        tree = read_config_file(config)
        if not set(tree) <= set(SFTConfig.model_fields):   # an RL or refine run's config
            return None
        # read here, not trained: a run saved with device cuda:1 reads on any host
        sft = build_config(SFTConfig, {**tree, "device": "cpu"}, source=str(config))
        data = Path(sft.data)
        size = data.stat().st_size
    except (ConfigError, OSError):
        return None
    per_step = sft.batch_size * sft.grad_accum
    steps, epochs, cap = sft.max_steps, sft.epochs, sft.limit

    def norm(text: str) -> str:
        return " ".join(text.split()).lower()

    seen: set[str] = set()
    records = read = 0
    try:
        with open(data, "rb") as f:
            for raw in f:
                read += len(raw)
                if read > limit or (cap is not None and records >= cap):
                    break
                try:
                    record = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(record, dict) and isinstance(record.get("question"), str):
                    seen.add(norm(record["question"]))
                    records += 1
    except OSError:
        return None
    if read > limit and records:   # the unread part as the read part
        records = round(records * size / (read - len(raw)))
        if cap is not None:
            records = min(records, cap)
    asked = {norm(q.question) for q in questions}
    both = len(asked & seen)
    passes = (steps * per_step / records if steps else epochs) if records else 0.0
    if not asked or both < 0.5 * len(asked) or passes < 0.5:
        return None
    return (f"{both} of {len(asked)} training questions are in {data}, which the start "
            f"{model} was fine-tuned on for {passes:.1f} passes ({config}): it has learned "
            "their answers, so RL on them rewards recall more than the searching that carries "
            "over to unseen questions; train RL on other questions (another split; on the "
            "synthetic world, another world's with its own index)")
