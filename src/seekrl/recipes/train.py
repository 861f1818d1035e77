"""The RL recipe: policy optimisation of a search agent with outcome and process (step)
rewards (the GRPO family, PPO, and the step-level estimators). `Trainer.step` is the
algorithm box: sample questions -> roll out `group_size` episodes each -> score them (outcome,
process rewards; dynamic sampling refills groups without signal) -> estimate token-level
advantages (`algo.advantage`) -> update (`algo.epochs` passes of mini-batches, rl/update.py)
-> log. The parts live elsewhere: the search environment (recipes/environment.py), the run's
counters and checkpoints (recipes/train_state.py), the checks made before anything loads
(recipes/train_checks.py), the step's figures (rl/step_metrics.py). Randomness is re-seeded
from (seed, step) at every step, so a resumed run samples the same questions and rollouts as
an uninterrupted one; under `torchrun` the processes share each step (rl/distributed.py)."""

from __future__ import annotations

import copy
import json
import random
import time
import warnings
from collections.abc import Callable, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from seekrl.agent.backends import Backend
from seekrl.agent.factory import make_backend
from seekrl.agent.rollout import RolloutConfig, RolloutEngine, grow_trees
from seekrl.agent.trajectory import Trajectory
from seekrl.config import TrainConfig, dump_config
from seekrl.data.qa import QAExample, load_qa
from seekrl.eval.evaluate import episode_progress, eval_policy, write_rollouts
from seekrl.models import pad_id_of
from seekrl.recipes.checkpoint import claim_run_dir, config_changes, save_policy
from seekrl.recipes.environment import SearchEnvironment
from seekrl.recipes.setup import (
    MetricsLog,
    NoLog,
    clip_and_step,
    enable_activation_checkpointing,
    make_optimizer,
    make_scheduler,
    prepare_trainable,
    set_seed,
    trainable_parameters,
)
from seekrl.recipes.train_checks import (
    bonus_coverage,
    check_config,
    check_start,
    learned_questions,
    plan_coverage,
)
from seekrl.recipes.train_state import (
    FINAL_EVAL,
    Checkpointer,
    RunState,
    logged_step,
    run_summary,
)
from seekrl.rewards.outcome import (
    RewardParts,
    checked_reward_fn,
    episode_reward,
    load_reward_fn,
)
from seekrl.rewards.process import ProcessContext, StepScorer, score_steps
from seekrl.rl.advantages import (
    Estimate,
    advantage_stats,
    answer_credit,
    answer_shares,
    batch_relative,
    broadcast,
    estimate_advantages,
    needs_values,
    no_positive_credit_for_invalid_turns,
)
from seekrl.rl.distributed import Dist, make_runtime, peak_memory, state_bytes
from seekrl.rl.forward import ValueHead, hidden_size, logprobs_in_chunks
from seekrl.rl.monitor import Monitor
from seekrl.rl.sampling import fill_with_signal, sample_questions, seeds
from seekrl.rl.step_batch import Rewards, StepBatch
from seekrl.rl.step_metrics import correct, dev_figures, episode_metrics, lookups_by_kind, step_line
from seekrl.rl.update import (
    PolicyUpdate,
    UpdateBatch,
    kl_rewards,
    likelihood_displacement,
    no_dropout_mode,
    sampler_logprobs,
)

__all__ = ["Trainer", "check_config"]

RewardFn = Callable[[Trajectory], RewardParts]


class Trainer:
    """Builds the components from a `TrainConfig` and runs the steps. `model`, `tokenizer`,
    `retriever`, `questions` and `reward_fn` override what the config names (tests pass
    the tiny model and a small world). `state` holds the run's counters (a checkpoint
    restores them)."""

    def __init__(self, cfg: TrainConfig, *, model=None, tokenizer=None, retriever=None,
                 questions: Sequence[QAExample] | None = None, reward_fn: RewardFn | None = None,
                 prm_scorer: StepScorer | None = None, console=None, resume: bool = False,
                 overwrite: bool = False, dist: Dist | None = None):
        self.cfg = cfg
        self.out = Path(cfg.out)
        # one process, or one of several (torchrun): see rl/distributed.py
        self.dist, self.device = (dist, cfg.device) if dist is not None \
            else Dist.from_env(cfg.device)
        self.console = console if self.dist.main else None
        # the config, the inputs it names and the run folder, before anything slow loads
        check_start(cfg, scorer_given=prm_scorer is not None, resume=resume,
                    overwrite=overwrite, processes=self.dist.world, main=self.dist.main,
                    model_given=model is not None)
        try:   # a folder, or flashrag:NAME: its train split
            self.questions = list(questions) if questions is not None \
                else load_qa(cfg.data, "train")
        except FileNotFoundError as err:
            raise FileNotFoundError(f"data: {err}") from None
        if not self.questions:
            raise ValueError(f"data: {cfg.data} has no questions")
        if self.dist.main and not resume and (
                learned := learned_questions(cfg.model, self.questions)):   # once, not per resume
            warnings.warn(learned, stacklevel=2)
        if self.dist.main and (uncovered := bonus_coverage(cfg.reward, self.questions,
                                                           custom=reward_fn is not None)):
            warnings.warn(uncovered, stacklevel=2)
        self.env = SearchEnvironment(cfg, retriever, dist=self.dist, device=self.device)
        if prm_scorer is None and "prm" in cfg.reward.process:
            from seekrl.rewards.prm import load_scorer
            prm_scorer = load_scorer(cfg.reward.prm, device=self.device, dtype=cfg.dtype)
        self.prm_scorer = prm_scorer
        if reward_fn is None and cfg.reward.fn:
            reward_fn = load_reward_fn(cfg.reward.fn)
        elif reward_fn is not None:   # given from Python: the same checks as reward.fn's
            reward_fn = checked_reward_fn(reward_fn, f"reward_fn "
                                          f"{getattr(reward_fn, '__name__', type(reward_fn).__name__)}")
        r = cfg.reward
        if reward_fn is not None and cfg.algo.answer_credit:
            # the split reads `outcome` as the answer's own part of `total`: a function
            # that fills it with something else (EM beside a judge's total, for logging)
            # teaches every other token from the difference
            warnings.warn("algo.answer_credit with a reward function: its RewardParts.outcome "
                          "goes to the answer's tokens and total - outcome to every other "
                          "token, so outcome must be the answer's own part of total",
                          stacklevel=2)
        self._custom_reward = reward_fn is not None
        self._plan_checked = False   # plan_coverage: said once, at the first step with episodes
        self.reward_fn = reward_fn or partial(
            episode_reward, outcome=r.outcome, format_reward=r.format_reward,
            invalid_penalty=r.invalid_penalty, max_turns_penalty=r.max_turns_penalty,
            turn_cost=r.turn_cost, recall_bonus=r.recall_bonus, hop_bonus=r.hop_bonus,
            plan_bonus=r.plan_bonus)
        self.monitor = Monitor(cfg.monitor)
        self.state = RunState()
        self._started: float | None = None   # train()'s clock, less the seconds before
        self._backend: Backend | None = None   # built on first use (see _generation_backend)
        self._build_policy(model, tokenizer)
        if self.dist.main:   # every input loaded: the run folder is claimed now (rank 0's)
            claim_run_dir(self.out, resume=resume, overwrite=overwrite)
            if not resume:
                dump_config(cfg, self.out / "config.yaml")
            elif changed := config_changes(self.out / "config.yaml", cfg):
                self._say("[yellow]--resume with settings that differ from the run's "
                          "config.yaml[/]: " + "; ".join(changed))
        self.checkpoints = Checkpointer(
            self.out / "checkpoints", self.dist, cfg.keep_last, runtime=self.runtime,
            optimizer=self.optimizer, scheduler=self.scheduler, env=self.env, device=self.device)
        if resume:
            self.state = self.checkpoints.resume(self.monitor, steps=cfg.steps, say=self._say)
        self.log = MetricsLog(self.out / "metrics.jsonl", tensorboard=cfg.log.tensorboard,
                              wandb=cfg.log.wandb, wandb_project=cfg.log.wandb_project,
                              config=cfg.model_dump(mode="json"), resume=resume,
                              resume_step=self.state.step_done) \
            if self.dist.main else NoLog()

    def _build_policy(self, model, tokenizer) -> None:
        """The policy (its trainable part), the frozen reference, the critic's head, the
        runtime that holds them across the processes, and their optimizer and schedule."""
        from seekrl.models import load_policy

        cfg = self.cfg
        set_seed(cfg.seed)
        if model is None:
            model, tokenizer = load_policy(cfg.model, dtype=cfg.dtype, device=self.device)
        self.tokenizer, self.pad_id = tokenizer, pad_id_of(tokenizer)
        if self.prm_scorer is not None:
            from seekrl.rewards.prm import check_scorer_tokenizer
            check_scorer_tokenizer(self.prm_scorer, tokenizer,
                                   f"reward.prm {cfg.reward.prm or '(given)'}")
        # The frozen reference for the KL term: with LoRA, the same weights with the
        # adapters switched off; with full fine-tuning, a frozen copy of the start.
        self.ref_model = None
        if cfg.algo.kl_coef > 0 and not cfg.lora.enabled:
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        self.model = prepare_trainable(model, cfg.train_layers, cfg.lora)
        if cfg.gradient_checkpointing:
            enable_activation_checkpointing(self.model)
        self.value_head = ValueHead(hidden_size(self.model)).to(self.device) \
            if needs_values(cfg.algo.advantage) else None
        # rank 0's weights everywhere, frozen ones and the reference's too (a model passed in
        # may differ by rank)
        self.dist.broadcast_parameters([p for m in (self.model, self.value_head, self.ref_model)
                                        if m is not None for p in m.parameters()])
        # how the weights live across the processes (rl/distributed.py): whole in each, or,
        # shard: fsdp, the policy (with the critic's head) and the frozen reference sharded
        # over them; the optimizer then holds this rank's shards
        runtime = partial(make_runtime, dist=self.dist, shard=cfg.shard == "fsdp",
                          pad_id=self.pad_id, temperature=cfg.rollout.temperature,
                          share_prompts=cfg.algo.share_prompts)
        self.runtime = runtime(self.model, self.value_head)
        self.ref_runtime = runtime(self.ref_model, None) if self.ref_model is not None else None
        if cfg.shard == "fsdp" and not self.dist.active:
            self._say("shard fsdp: one training process, nothing to shard (launch several "
                      "with torchrun)")
        extra = [] if self.value_head is None else [
            {"params": list(self.value_head.parameters()),
             "lr": cfg.algo.value_lr or cfg.optim.lr * 10}]
        self.optimizer = make_optimizer(trainable_parameters(self.model), cfg.optim,
                                        extra_groups=extra)
        self.scheduler = make_scheduler(  # the decay follows a token budget's share if ahead
            self.optimizer, cfg.optim, cfg.steps,
            budget_share=lambda: self.state.budget_share(cfg.max_rollout_tokens))
        self.updates = 0   # optimizer steps taken by this object (the vLLM sync's version)
        self.updater = PolicyUpdate(cfg.algo, self.runtime, self.dist, self.device, self.pad_id,
                                    self.value_head, self._optimizer_step, correct)

    # ------------------------------------------------------------------ the step
    def step(self, step: int, n_questions: int | None = None) -> dict[str, Any]:
        """One step on `n_questions` questions (default `questions_per_step`; fewer on the
        last step of a run with a rollout-token budget): sample, roll out and score them
        (`_draw`), estimate the advantages and update (`learn`); returns the step's record,
        which `train` logs."""
        algo = self.cfg.algo
        set_seed(seeds.step(self.cfg.seed, step))
        t0 = time.time()
        if self.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats(self.device)
        draws = _Draws(ranked_before=self.env.ranker_seconds())
        # sample questions, roll out their groups and score them (`_draw`); with dynamic
        # sampling, draw again until the groups with signal fill the batch
        n_questions = n_questions or self.cfg.questions_per_step
        trajs, parts, n_sampled, refills, signal, estimate = fill_with_signal(
            lambda k: self._draw(step, n_questions, k, draws), self._signal_estimate,
            n_questions, dynamic=algo.dynamic_sampling, max_refills=algo.max_refills)
        record = self._rollout_record(step, trajs, parts, draws, n_sampled, refills, signal)
        if trajs:
            record.update(self.learn(trajs, estimate=estimate))
        else:   # dynamic sampling found no group with signal: nothing to learn
            record.update(skipped_update=True, lr=self.optimizer.param_groups[0]["lr"])
            # the schedule still counts the step, so step k has the lr of step k whatever
            # was skipped before it (torch warns when no optimizer step came first)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                self.scheduler.step()
        record.update(time_step=round(time.time() - t0, 2),
                      **peak_memory(self.dist, self.device, self.state_bytes()))
        return record

    def _draw(self, step: int, n_questions: int, draw: int, draws: _Draws):
        """Draw `draw` of the step: its questions played and scored, each rank its share,
        all ranks getting the whole batch; its time, process figures and generated tokens
        go into `draws`."""
        t = time.time()
        questions = self.sample_questions(step, n_questions, draw=draw)
        self.state.questions_drawn += len(questions)
        self.state.questions_planned += len(questions) if draw == 0 else 0
        # each rank draws its own random numbers (rank 0's are one process's)
        seed = seeds.rank(seeds.draw(seeds.step(self.cfg.seed, step), draw), self.dist.rank)
        with self.full_weights():   # sharded: rollouts on the gathered weights
            trajs = self.rollout(self.dist.share(questions), seed=seed)
            draws.rollout_s += time.time() - t
            t = time.time()
            stats: dict[str, float] = {}
            parts = self.score(trajs, seed=seed, stats=stats)
        trajs, parts = self.dist.gather(trajs), self.dist.gather(parts)
        for k, v in self.dist.sum_values(stats).items():
            draws.process_stats[k] = draws.process_stats.get(k, 0.0) + v
        draws.fresh_tokens += sum(x.n_decoded - x.prefix_tokens
                                  for x in trajs)   # shared tree prefixes count once
        draws.played += trajs
        draws.played_parts += parts
        draws.scoring_s += time.time() - t
        return trajs, parts

    def _rollout_record(self, step, trajs, parts, draws: _Draws, n_sampled: int,
                        refills: int, signal) -> dict[str, Any]:
        """The step record's part about its episodes, compute and search; the episodes
        saved when due; the update announced."""
        # with several processes: the slowest rank's rollout time (the others waited for it
        # in the gather, which counts as scoring), so tokens_per_s is the whole group's rate
        t_rollout = max(self.dist.gather([draws.rollout_s]))
        if self.dist.main and not self._plan_checked and draws.played:
            self._plan_checked = True
            if unplanned := plan_coverage(self.cfg.reward, draws.played, step,
                                          custom=self._custom_reward):
                warnings.warn(unplanned, stacklevel=2)
        step_tokens = draws.fresh_tokens + int(draws.process_stats.get("mc_tokens", 0))
        self.state.rollout_tokens += step_tokens
        # over every episode played (dynamic sampling keeps only varied groups: an empty or
        # solved-less batch read as zero reward and no valid format, and the monitor with it)
        record = episode_metrics(draws.played, draws.played_parts,
                                 process=list(self.cfg.reward.process),
                                 self_search=self.cfg.rollout.self_search,
                                 sub_queries=self.cfg.rollout.max_queries > 1)
        varied, multi, solved = signal
        record.update(step=step, episodes=len(trajs), episodes_sampled=n_sampled,
                      refills=refills, lookups_by_kind=lookups_by_kind(draws.played),
                      rollout_tokens=step_tokens, rollout_tokens_total=self.state.rollout_tokens,
                      **{f"process_{k}": round(v, 4)
                         for k, v in sorted(draws.process_stats.items())},
                      groups_with_signal=round(varied / multi, 4) if multi else None,
                      groups_solved=round(solved / multi, 4) if multi else None,
                      time_rollout=round(t_rollout, 2),
                      time_scoring=round(draws.scoring_s + draws.rollout_s - t_rollout, 3),
                      # every draw's decoding (blocks it wrote too), a tree prefix once
                      tokens_per_s=round(draws.fresh_tokens / max(t_rollout, 1e-9), 1))
        every = self.cfg.log.save_rollouts
        if self.dist.main and every and step % every == 0 and trajs:
            self._save_rollouts(step, trajs, played=len(draws.played))
        # the ranker learns from every search played: its labels are gold documents and
        # right answers, not the group variance that dynamic sampling keeps
        record.update(self.env.after_rollouts(draws.played, draws.ranked_before))
        if trajs:
            if self._backend is not None:
                self._backend.sleep()   # the update gets the engine's memory (vllm_sleep)
            algo = self.cfg.algo
            self._say(f"  step {step}: {len(trajs)} episodes in {t_rollout:.0f} s, updating "
                      f"({algo.epochs * -(-len(trajs) // algo.mini_batch_size)} optimizer "
                      "steps)")
        return record

    # ------------------------------------------------------------------ 1. questions
    def sample_questions(self, step: int, n: int, draw: int = 0) -> list[QAExample]:
        """`n` questions for this step, the same for the same (seed, step, draw)."""
        return sample_questions(self.questions, n, random.Random(f"{self.cfg.seed}/{step}/{draw}"),
                                balance_types=self.cfg.algo.balance_types)

    def _questions_for_budget(self) -> int:
        return self.state.questions_for_budget(self.cfg.max_rollout_tokens,
                                               self.cfg.questions_per_step)

    # ------------------------------------------------------------------ 2. rollouts
    def rollout(self, questions: Sequence[QAExample], seed: int) -> list[Trajectory]:
        """The episodes of `questions` (`group_size` each, or the configured trees)
        played by the current policy. With `shard: fsdp` every rank calls it (its own
        questions, any number): it gathers the full weights first."""
        tree = self.cfg.rollout.tree
        with self.full_weights():
            if tree is None:
                with self._progress(len(questions) * self.cfg.group_size) as tick:
                    trajs = self.engine(seed).run(questions, dataset="train", on_finish=tick)
            else:
                trajs = grow_trees(self.engine(seed, n_samples=tree.trees), questions,
                                   tree.branches, tree.rounds, seed)
        for t in trajs:  # group ids unique per draw, even if a question comes back
            t.group_id = f"{t.example_id}@{seed}"
        return trajs

    def engine(self, seed: int, n_samples: int | None = None) -> RolloutEngine:
        cfg = RolloutConfig.of(self.cfg.rollout, seed=seed,
                               n_samples=n_samples or self.cfg.group_size)
        self.model.eval()
        return RolloutEngine(self._generation_backend(), self.tokenizer,
                             self.env.for_rollouts(seed, self.run_progress()), cfg)

    def _generation_backend(self) -> Backend:
        """The run's one backend (built on first use): seekrl's own decoding loop on the
        policy, or the colocated vLLM engine, told to use the policy's weights of this step
        (vLLM pushes them once per step, before its first rollout)."""
        if self._backend is None:
            from seekrl.models import resolve_model

            r = self.cfg.rollout
            self._backend = make_backend(
                r.backend, self.tokenizer, model=self.model,
                model_name=resolve_model(self.cfg.model) if r.backend == "vllm" else None,
                dtype=self.cfg.dtype, seed=self.cfg.seed, gpu_memory=r.vllm_gpu_memory,
                max_model_len=r.max_total_tokens, sleep_level=r.vllm_sleep,
                attention=r.attention)
        self._backend.sync_weights(self.model, self.updates)
        return self._backend

    @property
    def retriever(self):
        """What rollouts search without a simulator (evaluations too, unless `eval.index`
        gives them their own: `env.eval_retriever`)."""
        return self.env.retriever

    def run_progress(self) -> float:
        """The share of the run behind it, 0 to 1 (what the noise curriculum follows)."""
        return self.state.progress(self.cfg.steps, self.cfg.max_rollout_tokens)

    @contextmanager
    def _progress(self, total: int):
        """A bar over a draw's episodes on the console (the first step of a run otherwise
        prints nothing for minutes); yields what to call as each one finishes."""
        from rich.console import Console

        if not isinstance(self.console, Console) or not total:   # a bar needs rich's
            yield lambda t: None
            return
        bar = episode_progress(self.console, total)
        task = bar.add_task(f"step {self.state.step_done + 1} rollouts", total=total, em="-")
        right = [0, 0]

        def tick(t: Trajectory) -> None:
            right[0] += correct(t)
            right[1] += 1
            bar.update(task, advance=1, em=f"{right[0] / right[1]:.3f}")

        with bar:
            yield tick

    # ------------------------------------------------------------------ 3. scoring
    def score(self, trajs: Sequence[Trajectory], seed: int = 0,
              stats: dict[str, float] | None = None) -> list[RewardParts]:
        """Outcome of every episode (`outcome_reward`), then the process rewards of every
        step (`Step.process_reward` and `process_parts`). Sharded, every rank calls it:
        Monte-Carlo step rewards play continuations on the gathered weights."""
        parts = [self.reward_fn(t) for t in trajs]
        for t, p in zip(trajs, parts):
            t.outcome_reward, t.outcome_part = p.total, p.outcome
        weights = self.cfg.reward.process
        if weights:
            ctx = ProcessContext(
                continue_episodes=lambda prefixes, n: self.engine(
                    seeds.continuations(seed)).continue_from(
                    prefixes, n, seed=seeds.continuations(seed)),
                episode_score=lambda t: self.reward_fn(t).total, scorer=self.prm_scorer,
                mc_samples=self.cfg.reward.mc_samples)
            with self.full_weights():
                score_steps(trajs, weights, ctx)
            if stats is not None:
                for k, v in ctx.stats.items():
                    stats[k] = stats.get(k, 0.0) + v
        return parts

    def full_weights(self, reference: bool = False):
        """Context: the policy's (or the frozen reference's) full weights on every rank when
        they are sharded (a collective: every rank enters); nothing otherwise."""
        runtime = self.ref_runtime if reference else self.runtime
        return runtime.full() if runtime is not None else nullcontext()

    # ------------------------------------------------------------------ 4. advantages
    def estimate(self, trajs: Sequence[Trajectory], *, values=None, token_rewards=None
                 ) -> tuple[Estimate, int | None]:
        """The run's advantages of a batch, as the update uses them: the estimator on the
        batch's step batch (outcome and step rewards, each process source's part, per-token
        rewards: a KL penalty in the reward; the critic's values), then, unless
        `algo.credit_invalid_turns`, no positive credit for invalid turns. With
        `algo.answer_credit` the estimator's advantage is split into the parts the reward's
        outcome (`outcome_part`, kept at scoring) and the rest of `outcome_reward` make
        (`answer_shares`), and the outcome's goes to the answer's tokens alone.
        Returns the estimate and how many tokens the cap changed (None when it is off)."""
        algo = self.cfg.algo
        rewards = Rewards.from_trajectories(trajs, self.cfg.reward.process)
        rewards.tokens = token_rewards
        batch = StepBatch.build(trajs, rewards, values=values)
        if algo.answer_credit:   # check_config: a group-scalar estimator, no step rewards
            outcome, rest = answer_shares(algo.advantage, batch,
                                          [self._outcome_part(t) for t in trajs], algo)
            advantages, reached = answer_credit(
                batch.unpad(broadcast(batch, outcome)), batch.unpad(broadcast(batch, rest)),
                trajs, self.tokenizer.decode)
            policy = sum(sum(t.loss_mask) for t in trajs)
            est = Estimate(advantages, [a.clone() for a in advantages], {
                "answer_token_share": round(reached / policy, 4) if policy else 0.0})
        else:
            est = estimate_advantages(algo.advantage, batch, algo)
        capped = None
        if not algo.credit_invalid_turns:
            est.advantages, capped = no_positive_credit_for_invalid_turns(est.advantages, trajs)
        return est, capped

    def _outcome_part(self, t: Trajectory) -> float:
        """The outcome's part of an episode's reward: the one kept at scoring, else (an
        episode scored elsewhere, e.g. read from a file) the reward function's again."""
        return t.outcome_part if t.outcome_part is not None else self.reward_fn(t).outcome

    def _signal_estimate(self, trajs):
        """The advantages the signal check reads, computed once for the draw: None when the
        estimator needs a critic or its advantages are relative to the whole batch (a tied
        group gets non-zero ones there): the scores decide then."""
        name = self.cfg.algo.advantage
        if not trajs or needs_values(name) or batch_relative(name):
            return None
        return self.estimate(trajs)

    # ------------------------------------------------------------------ 5. update
    def learn(self, trajs: Sequence[Trajectory], estimate=None) -> dict[str, Any]:
        """Steps 4-6 on a scored batch (every rank holds the same one): log-probs,
        advantages (`estimate`'s, the signal check's of this very batch, when given and
        nothing else enters them) and the updates, then the learning-rate schedule's step.
        Returns the step record's part about the update."""
        algo = self.cfg.algo
        if algo.tis_cap and any(t.rollout_logprobs is None for t in trajs):
            # decided on the whole batch, the same on every rank, before any update
            raise ValueError("algo.tis_cap: some rollouts carry no behaviour log-probs "
                             "(greedy decoding, or a backend that reports none); turn "
                             "tis_cap off")
        record: dict[str, Any] = {}
        t2 = time.time()
        one_update = algo.epochs == 1 and algo.mini_batch_size >= len(trajs)
        kl_reward = algo.kl_coef > 0 and algo.kl_in_reward
        old_logps, old_values = (None, None)
        if algo.old_logprobs == "rollout" and not one_update:   # no pass (checked at start)
            old_logps = sampler_logprobs(trajs)
            if old_logps is None:
                warnings.warn("algo.old_logprobs: rollout: some episodes of this batch carry "
                              "no sampler log-probs (the backend reported none for a turn); "
                              "this step recomputes them", stacklevel=2)
        sampled = old_logps is not None
        if not sampled and (not one_update or self.value_head is not None or kl_reward):
            old_logps, old_values = self._shared_logprobs(trajs)
        ref_logps = None
        if algo.kl_coef > 0:
            ref_logps, _ = self._shared_logprobs(trajs, reference=True)
        t_old = time.time() - t2

        token_rewards = None
        if kl_reward:   # -kl_coef x KL on every policy token, read by the estimator
            token_rewards, record["kl"] = kl_rewards(trajs, old_logps, ref_logps, algo)
            ref_logps = None   # and no KL loss term
        if estimate is None or kl_reward or self.value_head is not None:
            estimate = self.estimate(trajs, values=old_values, token_rewards=token_rewards)
        estimate, capped = estimate
        if capped is not None:
            record["adv_invalid_capped"] = capped
        advantages, returns = estimate
        record.update(advantage_stats(advantages, trajs))
        record.update(estimate.diagnostics)
        if self.value_head is None:
            returns = None   # only a critic has targets

        t3 = time.time()
        update = self._update(trajs, advantages, old_logps, ref_logps, old_values, returns,
                              from_sampler=sampled)
        t_update = time.time() - t3
        lr = self.optimizer.param_groups[0]["lr"]   # the rate this step's updates applied
        self.scheduler.step()
        trained = sum(len(t.token_ids) for t in trajs) * algo.epochs
        # the displacement compares the trainer with itself: its first-pass numbers when
        # `old` is the sampler's
        record.update(self._displacement(trajs, None if sampled else old_logps,
                                         update.pop("correct_logps")))
        record.update(update)
        record.update(lr=lr, time_old_logprobs=round(t_old, 2),
                      time_update=round(t_update, 2),
                      train_tokens_per_s=round(trained / max(t_update + t_old, 1e-9), 1))
        return record

    @torch.no_grad()
    def batch_logprobs(self, trajs: Sequence[Trajectory], *, reference: bool = False
                       ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        """Per-trajectory log-probs of the policy tokens (and the critic's values), in
        chunks of `algo.logprob_chunk` episodes (and `algo.micro_batch_tokens` padded
        tokens); `reference` uses the frozen reference."""
        if reference:
            model = self.ref_model if self.ref_model is not None else self.model
            ctx = self.model.disable_adapter() if self.ref_model is None else nullcontext()
        else:
            model, ctx = self.model, nullcontext()
        algo = self.cfg.algo
        with self.full_weights(reference=reference and self.ref_model is not None), ctx:
            # share_prompts as the update computes them (sharded: no sharing), so the first
            # ratio is 1 to the last bit
            return logprobs_in_chunks(
                model, trajs, self.pad_id, self.device, temperature=self.cfg.rollout.temperature,
                chunk=algo.logprob_chunk, max_tokens=algo.micro_batch_tokens,
                value_head=None if reference else self.value_head,
                share_prompts=self.runtime.share_prompts)

    def _shared_logprobs(self, trajs: Sequence[Trajectory], *, reference: bool = False):
        """`batch_logprobs` of the whole batch, each rank computing a share."""
        logps, values = self.batch_logprobs(self.dist.share(trajs), reference=reference)
        return self.dist.gather(logps), (self.dist.gather(values) if values is not None
                                         else None)

    def _update(self, trajs, advantages, old_logps, ref_logps, old_values, returns, *,
                from_sampler: bool = False) -> dict[str, Any]:
        """`algo.epochs` passes of mini-batch updates (rl/update.py)."""
        cfg = self.cfg
        no_dropout_mode(self.model)   # as for the old log-probs
        batch = UpdateBatch(trajs, advantages, old_logps, ref_logps, old_values, returns,
                            # seq-mean-token-sum-norm's constant: the most policy tokens
                            # an episode can have
                            norm_length=cfg.rollout.max_turns * cfg.rollout.max_new_tokens,
                            old_from_sampler=from_sampler)
        return self.updater.run(batch, random.Random(f"{cfg.seed}/update/{self.state.step_done}"))

    def _displacement(self, trajs, old_logps, during_update: dict[int, float]
                      ) -> dict[str, float | None]:
        return likelihood_displacement(
            trajs, old_logps, during_update, correct,
            lambda part: self.batch_logprobs(part)[0], self.cfg.monitor.displacement_episodes)

    def _optimizer_step(self) -> float:
        self.updates += 1
        params = trainable_parameters(self.model, self.value_head)
        self.runtime.reduce_gradients(params)
        return clip_and_step(params, self.optimizer, self.cfg.optim.max_grad_norm)

    def state_bytes(self) -> int:
        """Bytes of the training state this process holds (shards: their local part)."""
        return state_bytes((self.model, self.value_head, self.ref_model), self.optimizer)

    # ------------------------------------------------------------------ 6. log
    def _save_rollouts(self, step: int, trajs: Sequence[Trajectory],
                       played: int | None = None) -> None:
        """RUN_DIR/rollouts/step-N: the step's episodes with their step rewards and values,
        and the trajectory viewer over them. Under dynamic sampling they are the groups the
        update kept, and the page says of how many played (its figures are theirs)."""
        r = self.cfg.rollout
        kept = {"kept": {"episodes": len(trajs), "played": played,
                         "why": "dynamic sampling keeps the groups whose rewards vary"}} \
            if self.cfg.algo.dynamic_sampling and played is not None else {}
        write_rollouts(self.out / "rollouts" / f"step-{step}", trajs, self.tokenizer, {
            "model": self.cfg.model, "step": step, "advantage": self.cfg.algo.advantage,
            "process": dict(self.cfg.reward.process),
            "rollout": {"method": r.method, "n_samples": self.cfg.group_size, "topk": r.topk,
                        "max_turns": r.max_turns, "max_new_tokens": r.max_new_tokens,
                        "temperature": r.temperature}, **kept})

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, step: int) -> Path:
        seconds = round(time.time() - self._started, 3) if self._started is not None \
            else self.state.seconds_before
        meta = {"monitor": self.monitor.state_dict(), "simulator_stats": self.env.state_dict(),
                **self.state.to_meta(train_seconds=seconds)}
        return self.checkpoints.save(step, meta, keep={self.state.healthy_checkpoint})

    def load_checkpoint(self, path: Path) -> dict:
        return self.checkpoints.load(path)

    # ------------------------------------------------------------------ the run
    def close(self) -> None:
        """Close the metrics log (and TensorBoard / W&B). `train` does this when it returns;
        call it (or use the trainer in a `with` block) for a trainer built and not trained, or
        stepped by hand with `step`."""
        self.log.close()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def train(self, until: int | None = None) -> dict[str, Any]:
        """Run the remaining steps, then save and evaluate the final policy. `until` stops
        after that step instead, as if the run were killed there (after its checkpoint)."""
        try:
            return self._train(until)
        except BaseException:
            self.close()   # what the log holds stays on disk; the file is not left open
            raise

    def _train(self, until: int | None) -> dict[str, Any]:
        cfg, state = self.cfg, self.state
        # a resumed run's clock goes on from its checkpoint's (max_minutes, the summary)
        started = self._started = time.time() - state.seconds_before
        # a resume that goes straight to the finish (killed in the final save or
        # evaluation) reports its last step's record as logged, as a straight run does
        last: dict[str, Any] = logged_step(self.out / "metrics.jsonl", state.step_done) \
            if state.step_done else {}
        if cfg.eval.data and cfg.eval.at_start and state.step_done == 0:
            self._dev_eval("start", 0, " before training")
        if 0 < state.step_done < cfg.steps:
            # resumed after a budget stopped it (killed while saving or evaluating the final
            # policy): the loop would play another step before its check. The clock is read
            # only where the checkpoint says time stopped it (a raised max_minutes goes on).
            state.stopped_budget = self._budget_spent(
                state.seconds_before if state.stopped_budget else None)
            if state.stopped_budget:
                self._say(f"{state.stopped_budget} already used up at step {state.step_done}")
                return self._finish(started, last)
        for step in range(state.step_done + 1, cfg.steps + 1):
            # rank 0's record (its timings) on every rank: the monitor, and so the decision
            # to stop, must be the same everywhere; at least one question: the stop below
            # comes after a step, so a budget left here pays for one
            last = self.dist.broadcast(self.step(step, max(1, self._questions_for_budget())))
            state.step_done = step
            if self._after_step(step, last, started):
                break
            if until is not None and step >= until and step < cfg.steps:
                self.log.close()
                return {"steps": step, "interrupted": True}
        return self._finish(started, last)

    def _after_step(self, step: int, record: dict[str, Any], started: float) -> bool:
        """Log the step, check its health, evaluate and checkpoint when due; whether the run
        stops here (a collapse with stop_on_collapse, or a time or token budget spent)."""
        cfg, state = self.cfg, self.state
        alerts = self.monitor.update(step, record)
        record["alerts"] = [a.kind for a in alerts]
        self.log.write(record)
        self._say(step_line(record, cfg.steps, time.time() - started))
        self._report(alerts)
        if not self.monitor.healthy and cfg.monitor.stop_on_collapse:
            state.stopped_reason = "; ".join(a.message for a in alerts) or "collapse"
            self._say(f"[bold red]stopping[/]: training collapsed at step {step}; the last "
                      f"healthy checkpoint is {state.healthy_checkpoint or 'the start'}")
            return True
        # the evaluation before the checkpoint: the monitor saved with it has seen it
        if cfg.eval.data and cfg.eval.every and step % cfg.eval.every == 0 and step != cfg.steps:
            self._dev_eval(f"step-{step}", step, "")
        out_of = self.dist.broadcast(self._budget_spent(time.time() - started))  # rank 0's clock
        if step >= cfg.steps:
            out_of = None
        # decided before the checkpoint, which keeps it: a run killed after this step (in
        # its final save or evaluation) resumes to its finish, not to another step
        state.stopped_budget = out_of
        if cfg.save_every and step % cfg.save_every == 0:
            if self.monitor.healthy:
                state.healthy_checkpoint = f"step-{step}"
            self.save_checkpoint(step)
        if not out_of:
            return False
        self._say(f"{out_of} used up after step {step}")
        if cfg.save_every and step % cfg.save_every != 0:
            self.save_checkpoint(step)  # so --resume can go on from here
        return True

    def _budget_spent(self, seconds: float | None) -> str | None:
        """The budget this run has used up, if any (`seconds` None: the clock not read)."""
        cfg = self.cfg
        # the question nearest the token budget: the last step plays only the questions
        # the budget has left, and the run stops once they round to none
        if cfg.max_rollout_tokens is not None and self._questions_for_budget() == 0:
            return f"rollout budget of {cfg.max_rollout_tokens} tokens"
        if cfg.max_minutes is not None and seconds is not None and seconds > cfg.max_minutes * 60:
            return f"time budget of {cfg.max_minutes} min"
        return None

    def _finish(self, started: float, last: dict[str, Any]) -> dict[str, Any]:
        """The final policy (the last healthy one after a collapse) saved and evaluated;
        the run's summary."""
        cfg, state, main = self.cfg, self.state, self.dist.main   # rank 0 writes
        final_step = state.step_done   # the step whose policy is the final one
        if state.stopped_reason and state.healthy_checkpoint:
            self.load_checkpoint(self.checkpoints.folder / state.healthy_checkpoint)
            final_step = int(state.healthy_checkpoint[len("step-"):])
        elif state.stopped_reason:
            self._say("no healthy checkpoint was saved: the final policy is the collapsed one")
        final = self.out / "final"
        plain = self.runtime.gathered_policy()   # sharded: the full weights, on rank 0
        if main:   # with the ranker the final policy was trained with, in the same rename
            save_policy(plain, self.tokenizer, final, before_rename=self._trained_ranker())
        del plain
        summary = run_summary(
            state, final=final, last=last, minutes=round((time.time() - started) / 60, 2),
            budget=cfg.max_rollout_tokens, simulator_tokens=None if self.env.simulator is None
            else self.env.simulator_totals.get("tokens", 0))
        if summary.get("budget_met") is False:
            self._say(f"[yellow]rollout budget missed[/]: {state.rollout_tokens} generated "
                      f"tokens, {state.budget_share(cfg.max_rollout_tokens):.2f} x the budget "
                      f"of {cfg.max_rollout_tokens} (equal compute is within 10%)")
        if cfg.eval.data:
            if state.last_dev is not None and state.last_dev[0] == final_step:
                # the run stopped (a budget, the clock) right after a periodic evaluation:
                # the final policy is the one just evaluated, greedily; not again
                summary["dev"], summary["dev_dir"] = state.last_dev[1], str(state.last_dev[2])
            else:
                # logged and kept as best under that step, not the collapsed one's
                summary["dev"] = self._dev_eval("final", final_step, "")
                summary["dev_dir"] = str(self.out / "eval" / "final")
        if cfg.eval.keep_best:   # after the final evaluation, which may be the best
            summary["best"] = self.checkpoints.best_note()
        self.log.close()
        if main:
            (self.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        self.dist.barrier()   # the final policy is on disk when any rank returns
        return summary

    def _trained_ranker(self):
        """What adds the ranker trained with the policy to a saved policy's folder (None
        without one)."""
        if self.env.ranker_updater is None:
            return None
        return lambda tmp: self.retriever.ranker.save(tmp / "ranker")

    def interrupted(self, command: str) -> str:
        """What to tell a user whose run was interrupted (Ctrl-C): where it stopped and the
        command that goes on from there (`command`: how the run was started, without
        --resume or --overwrite)."""
        return self.checkpoints.resume_hint(command, done=self.state.step_done,
                                            steps=self.cfg.steps, save_every=self.cfg.save_every)

    def _say(self, text: str) -> None:
        if self.console is not None:
            self.console.print(text)

    def _report(self, alerts: list, tag: dict[str, str] | None = None) -> None:
        """Alerts into `alerts.jsonl` (rank 0) and onto the console (`tag`: keys added to
        each line)."""
        if alerts and self.dist.main:
            with open(self.out / "alerts.jsonl", "a", encoding="utf-8") as f:
                for a in alerts:
                    f.write(json.dumps({**a.to_dict(), **(tag or {})}) + "\n")
        for a in alerts:
            self._say(f"  [bold {'red' if a.severity == 'collapse' else 'yellow'}]"
                      f"{a.severity}[/]: {a.message}")

    def _dev_eval(self, name: str, step: int, label: str) -> dict[str, Any]:
        # rank 0's numbers on every rank: the monitor must be the same everywhere
        dev = self.dist.broadcast(self.evaluate(self.out / "eval" / name))
        self.state.last_dev = (step, dev, self.out / "eval" / name)
        # the final evaluation's lines are marked: a resume redoes the finish (after a
        # collapse, at the restored step, which its checkpoint may hold), and drops them
        tag = {FINAL_EVAL: "final"} if name == "final" else {}
        self.log.write({"step": step, **{f"dev_{k}": v for k, v in dev.items()}, **tag})
        self._say(f"  dev EM {dev['em']:.3f}{label}")
        self._report(self.monitor.update_eval(step, dev), tag)
        if self.cfg.eval.keep_best and self.state.improves(step, dev["em"]):
            best = self.checkpoints.save_best(self.tokenizer, step, dev["em"],
                                              self.out / "eval" / name, self._trained_ranker())
            self._say(f"  the best so far: saved to {best}")
        return dev

    def evaluate(self, out_dir: Path) -> dict[str, Any]:
        """Rank 0 evaluates the policy on `eval.data`; the others return {} (with sharded
        weights they take part in gathering them first) and `train` hands them rank 0's."""
        with self.full_weights():
            if not self.dist.main:
                return {}
            own = self._generation_backend() if self.cfg.rollout.backend == "static" else None
            metrics = eval_policy(self.model, self.tokenizer, self.env.eval_retriever, self.cfg.eval,
                                  out_dir, episode=self.cfg.rollout, backend=own)
        return dev_figures(metrics)


@dataclass
class _Draws:
    """What a step's draws add up to: rollout and scoring seconds, the process rewards'
    figures, and the tokens generated (shared tree prefixes once)."""
    rollout_s: float = 0.0
    scoring_s: float = 0.0
    process_stats: dict[str, float] = field(default_factory=dict)
    fresh_tokens: int = 0
    # every episode the step played, and its reward parts: the step's episode figures
    # describe the policy, not the groups dynamic sampling kept for the update
    played: list = field(default_factory=list)
    played_parts: list = field(default_factory=list)
    ranked_before: float | None = None   # the ranker's scoring seconds before the step
