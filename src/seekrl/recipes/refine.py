"""PRM-guided refinement (ProRAG's stage 3): improve the SFT policy with what the process
reward model and the step labels know, before RL.

- `rft` (rejection-sampling fine-tuning): sample `samples` episodes per question from the
  policy, keep the right ones (outcome >= `min_outcome`) with a valid trace whose every step
  the PRM scores at or above `threshold` (without a PRM: the right, valid ones), at most
  `max_per_question` distinct episodes per question, and fine-tune on them with the SFT
  recipe (loss on policy tokens only). With `threshold_quantile` the bar is per step count:
  an episode's lowest step score against the q-quantile of the lowest step scores of the
  right episodes with as many steps (`quantile_threshold`). One bar over all step scores
  would drop long episodes for having more steps to fail on (uninformative scores keep
  (1 - q)^n of the n-step ones: 75 / 56 / 42% of 1 / 2 / 3 steps at q = 0.25), and RFT
  then taught fewer searches. A `teacher` (a path or hub id) samples instead of the policy
  being fine-tuned; when its tokenizer is not the policy's, the kept episodes are written
  as text turns (`sft.episode_record`), which SFT lays out with the learner's own tokens.
- `step_dpo`: DPO on sibling pairs from the labels (`pairs.jsonl`: a better and a worse step
  from the same prefix). The log-likelihood of an episode counts only the differing step's
  tokens; the reference is the starting policy, whose step log-probs are computed once
  before the first update, so no second model is held in memory.
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from seekrl.agent.trajectory import Trajectory, write_trajectories
from seekrl.models import collate
from seekrl.rl.forward import masked_logprobs


def keep_for_rft(trajs: Sequence[Trajectory], outcomes: Sequence[float],
                 step_scores: Sequence[Sequence[float]] | None, *, min_outcome: float,
                 threshold: float | Mapping[int, float], max_per_question: int
                 ) -> tuple[list[Trajectory], dict]:
    """The episodes RFT trains on, and why the others were left out. `threshold` is one bar
    for every step, or a bar per number of scored steps (`quantile_threshold`'s); either way
    an episode goes when its lowest step score falls below its bar, and one without scored
    steps has nothing below it."""
    kept: list[Trajectory] = []
    why = {"wrong": 0, "invalid_format": 0, "low_step_score": 0, "duplicate": 0,
           "question_full": 0}
    per_question: dict[str, set] = {}
    for i, (t, outcome) in enumerate(zip(trajs, outcomes)):
        if outcome < min_outcome:
            why["wrong"] += 1
            continue
        if not t.valid_format:
            why["invalid_format"] += 1
            continue
        if step_scores is not None and step_scores[i]:
            row = step_scores[i]
            if isinstance(threshold, Mapping):
                if len(row) not in threshold:
                    raise ValueError(f"threshold: no bar for episodes of {len(row)} scored "
                                     f"steps (bars for {sorted(threshold)})")
                bar = threshold[len(row)]
            else:
                bar = threshold
            if min(row) < bar:
                why["low_step_score"] += 1
                continue
        seen = per_question.setdefault(t.example_id, set())
        key = tuple(t.token_ids)
        if key in seen:
            why["duplicate"] += 1
            continue
        if len(seen) >= max_per_question:
            why["question_full"] += 1
            continue
        seen.add(key)
        kept.append(t)
    return kept, why


def quantile_threshold(outcomes: Sequence[float], step_scores: Sequence[Sequence[float]],
                       min_outcome: float, q: float,
                       trajs: Sequence[Trajectory] | None = None) -> dict[int, float]:
    """A bar per number of scored steps, for `keep_for_rft`: the q-quantile of the lowest
    step scores of the right episodes with that many steps. With `trajs`, of those the bar
    is applied to: episodes of a valid format, each distinct episode of a question once
    (invalid ones, which RFT drops anyway and whose steps score low, filled the bottom
    quantile and set the bar below every episode it was meant to filter).

    A PRM trained on soft Q labels scores on the policy's own success scale (a weak policy's
    steps all sit far below 0.5), so a fixed threshold can keep nothing; a quantile drops the
    right episodes holding the lowest-scored steps, whatever the scale. The episode's minimum
    is compared with minima of episodes as long as it: against one quantile of all step
    scores, an n-step episode has n chances to fall below, so even scores that say nothing
    keep fewer long episodes; within its stratum each step count keeps ~1 - q.

    A stratum too small for its own quantile to drop anyone (q * size < 1: the quantile is
    its smallest minimum) takes the q-quantile of all right episodes' minima instead, so
    the PRM still vetoes a clearly bad step there; that pooled bar leans against the
    longer step counts again, but only for those few episodes. Right episodes without
    scored steps have no minimum and no stratum; no right episode: no bars."""
    strata: dict[int, list[float]] = {}
    counted: set[tuple] = set()
    for i, (o, row) in enumerate(zip(outcomes, step_scores)):
        if trajs is not None:
            t = trajs[i]
            key = (t.example_id, tuple(t.token_ids))
            if not t.valid_format or key in counted:
                continue
            counted.add(key)
        if o >= min_outcome and len(row):
            strata.setdefault(len(row), []).append(min(row))

    def quantile(values: list[float]) -> float:
        values = sorted(values)
        return values[min(len(values) - 1, int(q * len(values)))]

    if not strata:
        return {}
    pooled = quantile([m for minima in strata.values() for m in minima])
    return {n: quantile(minima) if int(q * len(minima)) >= 1 else pooled
            for n, minima in sorted(strata.items())}


# ---------------------------------------------------------------------- step-level DPO
def step_mask(traj: Trajectory, index: int) -> list[int]:
    """1 on the generated tokens of step `index`, 0 elsewhere."""
    s = traj.steps[index]
    mask = [0] * len(traj.token_ids)
    for i in range(s.start, s.end):
        mask[i] = traj.loss_mask[i]
    return mask


def step_logps(model, trajs: Sequence[Trajectory], indices: Sequence[int], pad_id: int,
               device) -> torch.Tensor:
    """Summed log-prob of each episode's step `indices[i]` under `model` ([n])."""
    cut = [t.steps[i].end for t, i in zip(trajs, indices)]
    masks = [step_mask(t, i)[:c] for t, i, c in zip(trajs, indices, cut)]
    ids, attn, mask = collate([t.token_ids[:c] for t, c in zip(trajs, cut)], masks, pad_id,
                              device)
    grid = masked_logprobs(model, ids, attn, mask, share_prompts=False)["logprobs"]
    return (grid * mask).sum(-1)


def step_dpo_loss(policy_better: torch.Tensor, policy_worse: torch.Tensor,
                  ref_better: torch.Tensor, ref_worse: torch.Tensor, beta: float
                  ) -> tuple[torch.Tensor, dict[str, float]]:
    """DPO on step log-likelihoods: -log sigmoid(beta * (margin_policy - margin_ref))."""
    logits = beta * ((policy_better - ref_better) - (policy_worse - ref_worse))
    loss = -torch.nn.functional.logsigmoid(logits).mean()
    return loss, {"accuracy": float((logits > 0).float().mean()),
                  "margin": float(logits.detach().mean() / max(beta, 1e-12))}


def train_step_dpo(model, tokenizer, pairs, *, steps: int, batch_size: int, beta: float,
                   optimizer, scheduler, device, seed: int, log=None, say=None,
                   max_grad_norm: float | None = 1.0, grad_accum: int = 1) -> dict[str, Any]:
    """Step-DPO updates of `model` on `pairs` (`prm.PairLabel`s); the reference log-probs
    are the model's own before the first update. An update takes batch_size x grad_accum
    pairs, `batch_size` a forward."""
    from seekrl.models import pad_id_of
    from seekrl.recipes.setup import clip_and_step, trainable_parameters

    pad_id = pad_id_of(tokenizer)
    model.eval()
    with torch.no_grad():
        ref_b, ref_w = [], []
        for b in range(0, len(pairs), batch_size):
            chunk = pairs[b:b + batch_size]
            ref_b.append(step_logps(model, [p.better for p in chunk], [p.index for p in chunk],
                                    pad_id, device))
            ref_w.append(step_logps(model, [p.worse for p in chunk], [p.index for p in chunk],
                                    pad_id, device))
        ref_b, ref_w = torch.cat(ref_b), torch.cat(ref_w)
    # the updates run in eval mode too (no dropout): at the first update the policy's step
    # log-probs equal the reference's, so the DPO logits start at exactly 0
    rng = random.Random(seed)
    last: dict[str, Any] = {}
    for step in range(1, steps + 1):
        t0 = time.time()
        pick = rng.sample(range(len(pairs)), min(batch_size * grad_accum, len(pairs)))
        optimizer.zero_grad(set_to_none=True)
        loss_sum, sums = 0.0, defaultdict(float)
        for c in range(0, len(pick), batch_size):   # each part's share of the update's mean
            part = pick[c:c + batch_size]
            chunk = [pairs[i] for i in part]
            idx = [p.index for p in chunk]
            pb = step_logps(model, [p.better for p in chunk], idx, pad_id, device)
            pw = step_logps(model, [p.worse for p in chunk], idx, pad_id, device)
            loss, stats = step_dpo_loss(pb, pw, ref_b[part], ref_w[part], beta)
            share = len(part) / len(pick)
            (loss * share).backward()
            loss_sum += float(loss.detach()) * share
            for k, v in stats.items():
                sums[k] += v * share
        norm = clip_and_step(trainable_parameters(model), optimizer, max_grad_norm)
        scheduler.step()
        last = {"step": step, "loss": round(loss_sum, 5),
                "grad_norm": round(float(norm), 4), **{k: round(v, 4) for k, v in sums.items()},
                "seconds": round(time.time() - t0, 2)}
        if log is not None:
            log.write(last)
        if say is not None and (step % 5 == 0 or step == steps):
            say(f"step-DPO {step}/{steps}  loss {last['loss']:.4f}  acc {last['accuracy']:.2f}")
    return last


# ---------------------------------------------------------------------- the recipe
# a folder holding these holds a refinement; --overwrite removes the outputs
REFINE_MARKERS = ("metrics.jsonl", "final", "sft", "samples.jsonl", "rft_data.jsonl")
# written once RFT's samples and its data are complete: what a resumed run goes on from
RFT_SAMPLED = "rft_sampled.json"
REFINE_OUTPUTS = (*REFINE_MARKERS, RFT_SAMPLED, RFT_SAMPLED + ".tmp", "config.yaml")
# what a resumed refinement may run with otherwise: the rest decides what is sampled and kept
REFINE_RESUME_MAY_CHANGE = ("out", "device", "save_every")


def check_config(cfg) -> None:
    """The refinement recipe's registry names and cross-key rules (`RefineConfig`)."""
    from seekrl.errors import ConfigError
    from seekrl.recipes.setup import check_episode_recipe

    check_episode_recipe(cfg, "refine")
    if cfg.teacher and cfg.method != "rft":
        raise ConfigError(f"teacher: only rft samples episodes; {cfg.method} trains on the "
                          "pairs as they are (leave teacher out)")


def same_tokenizer(a, b) -> bool:
    """Token ids (and the chat template that laid out the prompt) mean the same under both."""
    from seekrl.models import tokenizer_fingerprint

    return a is b or (tokenizer_fingerprint(a) == tokenizer_fingerprint(b)
                      and getattr(a, "chat_template", None) == getattr(b, "chat_template", None))


def check_text_turns(r) -> None:
    """Episodes written as text turns are laid out again by SFT: only what its reader
    rebuilds exactly (searches of one query, documents in seekrl's style, no other tool)."""
    from seekrl.agent.protocol import PROMPTS, prompt_style
    from seekrl.errors import ConfigError

    why = ("rollout.max_queries > 1" if r.max_queries > 1 else
           f"rollout.tools {r.tools}" if r.tools else
           f"rollout.prompt {r.prompt} (documents in another style than seekrl's)"
           if prompt_style(r.prompt).doc != PROMPTS["seekrl"].doc else None)
    if why:
        raise ConfigError(f"teacher: its tokenizer is not model's, so its episodes would be "
                          f"written as text turns for SFT to lay out again, which {why} does "
                          "not allow; use a teacher that shares model's tokenizer")


def rft_warning(*, questions: int, questions_kept: int, sampled: int, right: int,
                right_valid: int, why: Mapping[str, int], samples: int, temperature: float
                ) -> str | None:
    """What to do when rejection sampling kept an episode for fewer than half of the
    questions (None otherwise): the likely cause, read from the counts, and the remedies."""
    if questions_kept * 2 >= questions:
        return None
    head = ("no episode was kept" if questions_kept == 0 else
            f"only {questions_kept} of {questions} questions have a kept episode")
    if right == 0:
        cause = f"the policy answered none of {sampled} episodes right"
    elif right_valid == 0:
        cause = f"its {right} right answers all broke the protocol (invalid format)"
    elif why.get("low_step_score", 0) * 2 >= right_valid:
        cause = (f"the PRM's step bar left out {why['low_step_score']} of {right_valid} right, "
                 "valid episodes (lower threshold or set threshold_quantile)")
    else:
        cause = f"{right} of {sampled} episodes were right"
    return (f"{head}: {cause}. First learn the protocol on the synthetic world (`seekrl sft` "
            f"on the world's oracle data) and sample with that policy (model=RUN/final, or "
            f"teacher=RUN/final to fine-tune another), sample more per question (samples, "
            f"now {samples}), raise rollout.temperature (now {temperature}), or sample with a "
            "stronger teacher policy (teacher=PATH or hub id). See docs/trajectory-format.md")


def _rft_sample(cfg, out: Path, *, sampler, sampler_tokenizer, retriever, backend, questions,
                scorer, teacher, as_text: bool, say) -> tuple[dict, Path]:
    """RFT's sampling and filter: the episodes drawn (`samples.jsonl`), those kept as SFT
    data (`rft_data.jsonl`, text turns when `as_text`), and the summary of what was kept
    and why the rest was not."""
    from seekrl.agent.backends import HFBackend
    from seekrl.agent.rollout import RolloutConfig, RolloutEngine
    from seekrl.rewards.outcome import get_outcome

    r = cfg.rollout
    backend = backend or HFBackend(sampler.eval(), sampler_tokenizer, attention=r.attention)
    engine = RolloutEngine(backend, sampler_tokenizer, retriever,
                           RolloutConfig.of(r, seed=cfg.seed, n_samples=cfg.samples))
    trajs = engine.run(questions, dataset="rft")
    outcome = get_outcome(cfg.reward)
    outcomes = [outcome(t.answer, t.golden_answers) for t in trajs]
    step_scores = scorer.score_steps(trajs) if scorer is not None else None
    if step_scores is not None:
        for t, row in zip(trajs, step_scores):
            for s, v in zip(t.steps, row):
                s.value = float(v)
    threshold: float | dict[int, float] = cfg.threshold
    if step_scores is not None and cfg.threshold_quantile is not None:
        threshold = quantile_threshold(outcomes, step_scores, cfg.min_outcome,
                                       cfg.threshold_quantile, trajs)
    kept, why = keep_for_rft(trajs, outcomes, step_scores, min_outcome=cfg.min_outcome,
                             threshold=threshold, max_per_question=cfg.max_per_question)
    generated = sum(t.n_decoded for t in trajs)   # self-search blocks too: decoded
    write_trajectories(out / "samples.jsonl", trajs)
    data = out / "rft_data.jsonl"
    if as_text:
        import json

        own_prompt = {q.id: q.prompt for q in questions}

        def decode(ids):
            return sampler_tokenizer.decode(ids, skip_special_tokens=False)
        from seekrl.recipes.sft import episode_record
        with open(data, "w", encoding="utf-8") as f:
            for t in kept:
                f.write(json.dumps(episode_record(t, decode, own_prompt.get(t.example_id)),
                                   ensure_ascii=False) + "\n")
    else:
        write_trajectories(data, kept)
    n_right = sum(o >= cfg.min_outcome for o in outcomes)
    n_valid = sum(t.valid_format for t in trajs)
    n_right_valid = sum(o >= cfg.min_outcome and t.valid_format for t, o in zip(trajs, outcomes))
    questions_kept = len({t.example_id for t in kept})
    if step_scores is None:
        shown, bar = None, ""
    elif isinstance(threshold, dict):   # JSON keys are strings: the step counts as text
        shown = {str(n): round(v, 6) for n, v in threshold.items()}
        right_by_steps: dict[int, int] = {}
        for o, row in zip(outcomes, step_scores):
            if o >= cfg.min_outcome and len(row):
                right_by_steps[len(row)] = right_by_steps.get(len(row), 0) + 1
        bar = " (step threshold by step count: " + ", ".join(
            f"{n}: {v:.3g} ({right_by_steps[n]} right)" for n, v in threshold.items()) + ")"
    else:
        shown, bar = round(threshold, 6), f" (step threshold {threshold:.3g})"
    say(f"RFT: {len(trajs)} episodes sampled on {len(questions)} questions "
        f"({cfg.samples} each, {generated} tokens"
        + (f", by the teacher {cfg.teacher or '(given)'}" if teacher is not None else "")
        + f"): {n_right} right, {n_valid} valid, {n_right_valid} right and valid, "
        f"{len(kept)} kept for {questions_kept} of {len(questions)} questions{bar}; left out: "
        + ", ".join(f"{k} {v}" for k, v in why.items()))
    warning = rft_warning(questions=len(questions), questions_kept=questions_kept,
                          sampled=len(trajs), right=n_right, right_valid=n_right_valid,
                          why=why, samples=cfg.samples, temperature=r.temperature)
    if warning:
        say(f"[yellow]warning:[/] {warning}")
    # threshold: None without a PRM, the fixed bar, or {steps: bar} from threshold_quantile
    summary = {"method": "rft", "sampled": len(trajs), "right": n_right, "valid": n_valid,
               "right_valid": n_right_valid, "kept": len(kept), "left_out": why,
               "questions": len(questions), "questions_kept": questions_kept,
               "right_share": round(n_right / max(len(trajs), 1), 4),
               "generated_tokens": generated, "prm": cfg.prm or None, "threshold": shown,
               "teacher": (cfg.teacher or "(given)") if teacher is not None else None,
               "data_form": "text turns" if as_text else "token ids", "warning": warning}
    if as_text:
        say(f"the teacher's tokenizer is not {cfg.model}'s: {data} holds the kept episodes as "
            "text turns, which SFT lays out with the learner's own tokens")
    return summary, data


def _resumable_rft(out: Path, cfg) -> dict | None:
    """What `--resume` goes on from in `out`: the summary of RFT's finished sampling (its
    samples and data are kept), or None when the stopped run had not finished sampling (it
    samples again). Refused: a folder without a refinement, step-DPO (it keeps no
    checkpoints), and other settings than the stopped run's."""
    from seekrl.config import ConfigError
    from seekrl.recipes.checkpoint import config_changes

    if cfg.method != "rft":
        raise ConfigError("--resume: step_dpo keeps no checkpoints (its updates take "
                          "minutes); start it again with --overwrite")
    saved = out / "config.yaml"
    if not saved.is_file():
        raise ConfigError(f"--resume: {out} holds no refinement (no config.yaml)")
    marker = out / RFT_SAMPLED
    if not marker.is_file():   # sampled again from a clean folder: any setting will do
        return None
    # a key added since the run was saved is not a change
    refused = [c for c in config_changes(saved, cfg, recorded_only=True)
               if c.split(":", 1)[0].split(".")[0] not in REFINE_RESUME_MAY_CHANGE]
    if refused:
        raise ConfigError(f"--resume: the refinement in {out} ran with other settings: "
                          + "; ".join(refused) + f" (old -> new); resume with its settings "
                          f"({saved}), or start a new one in another out")
    if not (out / "rft_data.jsonl").is_file():
        raise ConfigError(f"--resume: {out} has its samples' record ({marker}) but no "
                          "rft_data.jsonl; start again with --overwrite")
    from seekrl.retrieval.base import RetrievalError, json_object
    try:
        done = json_object(marker, ("sampled", "kept"))
    except RetrievalError as err:   # written whole by the run: damaged since
        raise ConfigError(f"--resume: {err}; start again with --overwrite") from None
    bad = [k for k in ("sampled", "kept") if not (isinstance(done[k], int)
                                                  and not isinstance(done[k], bool)
                                                  and done[k] >= 0)]
    if bad:   # a null "kept" had read as "kept no episode": the policy returned unchanged
        raise ConfigError(f"--resume: {marker}: {', '.join(bad)}: expected a count of "
                          f"episodes, got {', '.join(repr(done[k]) for k in bad)}; start "
                          "again with --overwrite")
    return done


def run_refine(cfg, *, model=None, tokenizer=None, retriever=None, backend=None,
               questions=None, scorer=None, teacher=None, console=None,
               overwrite: bool = False, resume: bool = False) -> dict[str, Any]:
    """`seekrl refine`: RFT or step-DPO from `cfg.model`; returns the summary with `final`,
    the refined checkpoint. `teacher` (a (model, tokenizer) pair) overrides `cfg.teacher`,
    the policy RFT samples with. An `out` that holds a refinement is refused unless
    `overwrite`; `resume` goes on with a stopped RFT run: its samples once they were all
    drawn, and its fine-tuning from the latest checkpoint (`save_every` of the SFT recipe)."""
    from seekrl.config import ConfigError, SFTConfig, dump_config
    from seekrl.models import load_policy, load_tokenizer
    from seekrl.recipes.checkpoint import (
        check_run_dir,
        claim_run_dir,
        fsync_dir,
        latest_checkpoint,
        save_policy,
    )
    from seekrl.recipes.setup import (
        MetricsLog,
        check_world_index,
        make_optimizer,
        make_scheduler,
        open_index,
        prepare_trainable,
        set_seed,
        trainable_parameters,
    )

    check_config(cfg)
    started = time.time()
    out = Path(cfg.out)
    if resume and overwrite:
        raise ConfigError("give one of --resume (continue the refinement in out) or "
                          "--overwrite (replace it), not both")
    check_run_dir(out, overwrite=overwrite, resume=resume,
                  model=cfg.model if model is None else None, markers=REFINE_MARKERS,
                  resumable=cfg.method == "rft")
    sampled = _resumable_rft(out, cfg) if resume else None
    say = console.print if console is not None else (lambda *a, **k: None)
    pairs = None
    if cfg.method == "step_dpo":
        from seekrl.recipes.labels import read_labels
        if not cfg.pairs:
            raise ValueError("pairs: step_dpo trains on sibling pairs; give the label folders "
                             "(`seekrl mcts` output)")
        pairs = read_labels(cfg.pairs).pairs
        if not pairs:
            raise ValueError(f"pairs: no sibling pairs in {', '.join(cfg.pairs)} (lower "
                             "search.min_gap / min_visits, or label more questions)")
    elif questions is None and not cfg.data:
        raise ValueError("data: rft samples episodes on questions; give a QA file")
    if cfg.method == "rft" and retriever is None:     # a missing index before a model loads
        retriever = open_index(cfg.index, "RFT samples search episodes", cfg.retriever)
        check_world_index(cfg.index, cfg.data)
    if cfg.method == "rft":                            # and the questions
        from seekrl.data.qa import load_qa
        try:
            questions = list(questions) if questions is not None else load_qa(cfg.data, "train")
        except FileNotFoundError as err:
            raise FileNotFoundError(f"data: {err}") from None
        if cfg.questions is not None:
            questions = questions[:cfg.questions]
        if not questions:
            raise ValueError(f"data: {cfg.data} has no questions")
        if scorer is None and cfg.prm and sampled is None:   # resumed: the scores are kept
            from seekrl.rewards.prm import load_scorer
            scorer = load_scorer(cfg.prm, device=cfg.device, dtype=cfg.dtype)
    set_seed(cfg.seed)
    if sampled is not None:   # the samples are drawn: no teacher needed
        teacher = None
    elif teacher is None and cfg.teacher and cfg.method == "rft":
        teacher = load_policy(cfg.teacher, dtype=cfg.dtype, device=cfg.device)
    if model is None and (teacher is not None or sampled is not None) and cfg.steps == 0:
        # nothing is fine-tuned: model's tokenizer alone says how the data is written
        tokenizer = tokenizer if tokenizer is not None else load_tokenizer(cfg.model)
    elif model is None:
        model, tokenizer = load_policy(cfg.model, dtype=cfg.dtype, device=cfg.device)
    sampler, sampler_tokenizer = teacher if teacher is not None else (model, tokenizer)
    # a teacher's token ids mean nothing to a policy with another tokenizer: text turns
    as_text = teacher is not None and not same_tokenizer(sampler_tokenizer, tokenizer)
    if as_text:
        check_text_turns(cfg.rollout)
    from seekrl.recipes.labels import check_label_tokenizer
    from seekrl.rewards.prm import check_scorer_tokenizer
    if pairs is not None:      # step-DPO trains on the pairs' token ids as they are
        check_label_tokenizer(cfg.pairs, tokenizer, f"model {cfg.model}")
    if scorer is not None and sampled is None:   # it reads the sampled episodes' token ids
        # (a resume past the sampling scores nothing: its teacher, whose tokenizer the PRM
        # shares, is not loaded, and the learner's may differ)
        check_scorer_tokenizer(scorer, sampler_tokenizer, f"prm {cfg.prm or '(given)'}")

    if cfg.method == "step_dpo":
        model = prepare_trainable(model, cfg.train_layers, cfg.lora)
        optimizer = make_optimizer(trainable_parameters(model), cfg.optim)
        scheduler = make_scheduler(optimizer, cfg.optim, cfg.steps)
    # every input read and the model loaded: only now do the old run's files go
    # a resume before the sampling finished samples again, from a clean folder
    fresh = not resume or sampled is None
    if resume and fresh:
        say(f"--resume: the refinement in {out} had not finished sampling; it samples again")
    claim_run_dir(out, overwrite=overwrite or resume, resume=not fresh, outputs=REFINE_OUTPUTS,
                  markers=REFINE_MARKERS)
    if fresh:
        dump_config(cfg, out / "config.yaml")
    if cfg.method == "step_dpo":
        log = MetricsLog(out / "metrics.jsonl")
        say(f"step-DPO on {len(pairs)} sibling pairs, beta {cfg.beta}, {cfg.steps} steps")
        last = train_step_dpo(model, tokenizer, pairs, steps=cfg.steps,
                              batch_size=cfg.batch_size, beta=cfg.beta, optimizer=optimizer,
                              scheduler=scheduler, device=cfg.device, seed=cfg.seed, log=log,
                              say=say, max_grad_norm=cfg.optim.max_grad_norm,
                              grad_accum=cfg.grad_accum)
        log.close()
        final = save_policy(model, tokenizer, out / "final")
        return {"method": "step_dpo", "final": str(final), "pairs": len(pairs), **last,
                "generated_tokens": 0, "minutes": round((time.time() - started) / 60, 2)}

    # RFT: sample, filter, fine-tune
    import json

    r = cfg.rollout
    if sampled is None:
        summary, data = _rft_sample(cfg, out, sampler=sampler,
                                    sampler_tokenizer=sampler_tokenizer, retriever=retriever,
                                    backend=backend, questions=questions, scorer=scorer,
                                    teacher=teacher, as_text=as_text, say=say)
        # last, once both files are on disk: its presence says they are whole
        marker, tmp = out / RFT_SAMPLED, out / (RFT_SAMPLED + ".tmp")
        tmp.write_text(json.dumps(summary))
        fsync_dir(out)
        tmp.replace(marker)
        fsync_dir(out, files=False)
    else:
        data, summary = out / "rft_data.jsonl", sampled
        say(f"--resume: the {summary['sampled']} episodes sampled before the stop are kept "
            f"({out / 'samples.jsonl'}), {summary['kept']} of them as the data ({data})")

    if cfg.steps == 0:      # rejection sampling only: the data, no fine-tuning
        say(f"rejection-sampled SFT data -> {data}"
            + (f"; train on it with: seekrl sft data={data} model={cfg.model}"
               if summary["kept"] else ""))
        return {**summary, "final": None, "data": str(data),
                "minutes": round((time.time() - started) / 60, 2)}
    if not summary["kept"]:
        say("[yellow]RFT kept no episode: the policy is returned unchanged[/]")
        final = save_policy(model, tokenizer, out / "final")
        return {**summary, "final": str(final), "minutes": round((time.time() - started) / 60, 2)}
    sft_cfg = SFTConfig(model=cfg.model, data=str(data), out=str(out / "sft"), index=cfg.index,
                        seed=cfg.seed, max_steps=cfg.steps, batch_size=cfg.batch_size,
                        grad_accum=cfg.grad_accum, rollout=r.episode_settings(),
                        train_layers=cfg.train_layers, lora=cfg.lora, optim=cfg.optim,
                        dtype=cfg.dtype, device=cfg.device, log_every=5,
                        save_every=cfg.save_every)
    from seekrl.recipes.sft import run_sft
    partial = sampled is not None and latest_checkpoint(out / "sft") is not None
    sft = run_sft(sft_cfg, console=console, model=model, tokenizer=tokenizer,
                  overwrite=not partial, resume=partial)
    return {**summary, "final": sft["final"], "loss": sft["loss"],
            "minutes": round((time.time() - started) / 60, 2)}
