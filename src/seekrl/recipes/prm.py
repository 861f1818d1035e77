"""`seekrl prm train`, ProRAG's stage 2, second half: fit the process reward model
(rewards/prm.py: a causal LM with a scalar head read at each step's last token) on labels.

Training reads the label folders of `seekrl mcts` (recipes/mcts.py):
- pointwise: binary cross-entropy of sigmoid(score) against the soft label Q of every
  labelled step (a step shared by several labelled episodes, an MCTS node on many paths,
  counts once);
- pairwise: Bradley-Terry, -log sigmoid(s_better - s_worse), on sibling pairs.

Held-out questions (a stable hash of the question id, `dev_share`) give the quality
figures: AUC of the scores against Q >= `threshold`, pair accuracy, and first-error
localisation (on fully labelled episodes, the first step with Q below the threshold, or
none, against the first step the model scores below it; `first_error_baseline` is the
better of the two constant guesses, "no error" and "the first step").

The saved folder is a PRM folder (rewards/prm.py holds the model, its scorer and the
reader, `load_scorer`): a plain Hugging Face checkpoint of the backbone (LoRA merged) plus
`prm_head.pt` and `prm.json`.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from seekrl.agent.trajectory import Trajectory
from seekrl.errors import ConfigError, DataError
from seekrl.models import pad_id_of
from seekrl.recipes.labels import (
    LabelSet,
    PairLabel,
    PointLabel,
    check_label_tokenizer,
    labelling_policy,
    read_labels,
    split_labels,
)
from seekrl.rewards.prm import PRM_MARKER, PRMScorer, ProcessRewardModel, batch_scores


def save_prm(prm: ProcessRewardModel, tokenizer, path: str | Path, info: dict | None = None,
             state: dict | None = None) -> Path:
    """A PRM folder `rewards.prm.load_prm` reads; with `state`, also `state.pt` (what a resumed
    training run needs)."""
    from seekrl.recipes.checkpoint import save_policy

    def head_and_marker(folder: Path) -> None:   # inside the folder before it is moved in
        _write_head(prm, folder, info, state)
    return save_policy(prm.lm, tokenizer, path, before_rename=head_and_marker)


def _write_head(prm: ProcessRewardModel, folder: Path, info: dict | None,
                state: dict | None) -> None:
    """What a PRM folder holds beside its language model."""
    torch.save(prm.head.state_dict(), folder / "prm_head.pt")
    (folder / PRM_MARKER).write_text(json.dumps({"kind": "seekrl-prm", **(info or {})},
                                                indent=1))
    if state is not None:
        torch.save(state, folder / "state.pt")


# ---------------------------------------------------------------------- losses
def pointwise_loss(prm: ProcessRewardModel, points: Sequence[PointLabel], pad_id: int, device
                   ) -> torch.Tensor:
    """Binary cross-entropy of sigmoid(score) against the soft labels. Points on the same
    episode (an MCTS path's nodes) share one forward pass."""
    groups: dict[int, list[PointLabel]] = {}
    for p in points:
        groups.setdefault(id(p.traj), []).append(p)
    members = list(groups.values())
    logits = torch.cat(batch_scores(prm, [(g[0].traj, [p.index for p in g]) for g in members],
                                    pad_id, device))
    target = torch.tensor([p.label for g in members for p in g], dtype=logits.dtype,
                          device=logits.device)
    return nn.functional.binary_cross_entropy_with_logits(logits, target)


def pairwise_loss(prm: ProcessRewardModel, pairs: Sequence[PairLabel], pad_id: int, device
                  ) -> torch.Tensor:
    """Bradley-Terry: -log sigmoid(score(better) - score(worse))."""
    items = [(p.better, [p.index]) for p in pairs] + [(p.worse, [p.index]) for p in pairs]
    s = torch.cat(batch_scores(prm, items, pad_id, device))
    n = len(pairs)
    return -nn.functional.logsigmoid(s[:n] - s[n:]).mean()


# ---------------------------------------------------------------------- quality
def auc(scores: Sequence[float], positive: Sequence[bool]) -> float | None:
    """Area under the ROC curve (the probability a positive outranks a negative; ties
    half); None with only one class."""
    pos = [s for s, p in zip(scores, positive) if p]
    neg = [s for s, p in zip(scores, positive) if not p]
    if not pos or not neg:
        return None
    ranked = sorted([(s, 1) for s in pos] + [(s, 0) for s in neg])
    # rank-sum with average ranks for ties
    rank_sum, i = 0.0, 0
    while i < len(ranked):
        j = i
        while j < len(ranked) and ranked[j][0] == ranked[i][0]:
            j += 1
        avg = (i + j + 1) / 2
        rank_sum += avg * sum(flag for _, flag in ranked[i:j])
        i = j
    return (rank_sum - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg))


# What a resumed PRM run may change: where it writes and logs, its device, and what its
# dev figures count (the training labels, `labels` and `dev_share`, are checked by their
# digest). Anything else changes how it trains (the sampled batches, the loss, the
# schedule's length), so the run would end neither where the stopped one was going nor
# where a new one would.
RESUME_MAY_CHANGE = ("out", "labels", "dev_share", "device", "threshold", "eval_every",
                     "eval_at_start", "log_every", "save_every", "keep_last")


def check_resume_settings(out: Path, cfg) -> None:
    """Refuse `--resume` with training settings other than the run's config.yaml (which
    the resume would then overwrite, leaving no record of the mixed run)."""
    from seekrl.recipes.checkpoint import resume_refusals

    refused = resume_refusals(out / "config.yaml", cfg, RESUME_MAY_CHANGE)
    if refused:
        raise ConfigError(f"--resume: the PRM in {out} was trained with other settings: "
                          + "; ".join(refused) + f" (old -> new). Resume with the run's "
                          f"settings ({out / 'config.yaml'}), or start a new run in another "
                          f"out; only {', '.join(RESUME_MAY_CHANGE)} may change on resume")


def first_below(values: Sequence[float], threshold: float) -> int | None:
    return next((i for i, v in enumerate(values) if v < threshold), None)


def _scores_at(scorer, items: Sequence[tuple[Trajectory, int]]) -> list[float]:
    """The scorer's probability at each (episode, step), each distinct episode scored once."""
    unique: dict[int, Trajectory] = {id(t): t for t, _ in items}
    order = list(unique)
    rows = dict(zip(order, scorer.score_steps([unique[k] for k in order])))
    return [rows[id(t)][i] for t, i in items]


def prm_metrics(scorer: PRMScorer, labels: LabelSet, threshold: float = 0.5) -> dict[str, Any]:
    """AUC, pair accuracy and first-error localisation accuracy of `scorer` on `labels`."""
    out: dict[str, Any] = {"points": len(labels.points), "pairs": len(labels.pairs)}
    if labels.points:
        scores = _scores_at(scorer, [(p.traj, p.index) for p in labels.points])
        out["auc"] = auc(scores, [p.label >= threshold for p in labels.points])
        out["positive_share"] = round(sum(p.label >= threshold for p in labels.points)
                                      / len(labels.points), 4)
    if labels.pairs:
        better = _scores_at(scorer, [(p.better, p.index) for p in labels.pairs])
        worse = _scores_at(scorer, [(p.worse, p.index) for p in labels.pairs])
        # a tie is half right (a constant scorer is at 0.5, not 0)
        out["pair_accuracy"] = sum(1.0 if b > w else 0.5 if b == w else 0.0
                                   for b, w in zip(better, worse)) / len(labels.pairs)
    full = [e for e in labels.episodes if e.steps and all(s.value is not None for s in e.steps)]
    if full:
        probs = scorer.score_steps(full)
        hits = [first_below([s.value for s in e.steps], threshold) == first_below(p, threshold)
                for e, p in zip(full, probs)]
        out["first_error_accuracy"] = sum(hits) / len(hits)
        out["first_error_episodes"] = len(full)
        # what a constant guess scores, "no error" or "the first step": the bar to clear
        truth = [first_below([s.value for s in e.steps], threshold) for e in full]
        out["first_error_baseline"] = max(sum(t is None for t in truth),
                                          sum(t == 0 for t in truth)) / len(full)
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()}


def labels_digest(labels: LabelSet) -> str:
    """A short hash of the labels a run samples from, in their order: what a resume must
    find again."""
    h = hashlib.sha256()
    for p in labels.points:
        h.update(json.dumps([p.traj.example_id, p.traj.token_ids, p.index, p.label]).encode())
    h.update(b"|")
    for p in labels.pairs:
        h.update(json.dumps([p.better.example_id, p.better.token_ids, p.worse.token_ids,
                             p.index, p.gap]).encode())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------- the recipe
def _save_checkpoint(prm: ProcessRewardModel, tokenizer, folder: Path, step: int,
                     keep_last: int, info: dict, state: dict) -> None:
    """`folder/step-N`, a PRM `load_scorer` reads, with the training state in state.pt,
    written whole or not at all and flushed to disk before `latest` names it; only the
    newest `keep_last` stay (`write_checkpoint`, as SFT's)."""
    from seekrl.recipes.checkpoint import write_checkpoint, write_policy

    def write(tmp: Path) -> None:
        write_policy(prm.lm, tokenizer, tmp)
        _write_head(prm, tmp, info, state)

    write_checkpoint(folder, step, write, keep_last)


def train_prm(cfg, *, model=None, tokenizer=None, console=None, overwrite: bool = False,
              resume: bool = False) -> dict[str, Any]:
    """`seekrl prm train`: fit the PRM on the label folders; save `out/final`; return the
    summary with the dev metrics. An `out` that holds a PRM run is refused unless
    `overwrite`; `resume` continues it from its latest checkpoint (`save_every`), drawing
    the same labels as an uninterrupted run. Ctrl-C raises `Interrupted` (recipes/setup.py),
    which says where the run stopped."""
    from seekrl.config import dump_config
    from seekrl.models import load_policy, load_tokenizer
    from seekrl.recipes.checkpoint import check_run_dir, claim_run_dir, latest_checkpoint
    from seekrl.recipes.setup import (
        Interrupted,
        MetricsLog,
        clip_and_step,
        make_optimizer,
        make_scheduler,
        prepare_trainable,
        resume_training,
        set_seed,
        trainable_parameters,
        training_state,
    )

    started = time.time()
    labels = read_labels(cfg.labels)              # bad labels fail before a model loads
    train, dev = split_labels(labels, cfg.dev_share)
    use_points = cfg.loss in ("pointwise", "both") and train.points
    use_pairs = cfg.loss in ("pairwise", "both") and train.pairs
    if not use_points and not use_pairs:
        raise DataError(f"no training labels for loss {cfg.loss!r}: {len(train.points)} "
                        f"labelled steps, {len(train.pairs)} pairs outside the dev split",
                        path=", ".join(map(str, cfg.labels)))
    if cfg.model is None and model is None:
        cfg = cfg.model_copy(update={"model": labelling_policy(cfg.labels)})
    out = Path(cfg.out)
    if resume and overwrite:
        raise ConfigError("give one of --resume (continue the run in out) or --overwrite "
                          "(replace it), not both")
    checkpoint = latest_checkpoint(out) if resume else None
    if resume and (checkpoint is None or not (checkpoint / "state.pt").is_file()):
        raise ConfigError(f"--resume: {out} has no PRM checkpoint to continue from "
                          "(checkpoints/latest with its state.pt); checkpoints are written "
                          "every save_every steps")
    if checkpoint is not None:
        check_resume_settings(out, cfg)
    check_run_dir(out, overwrite=overwrite, resume=resume,
                  model=cfg.model if model is None else None,
                  markers=("metrics.jsonl", "final", "checkpoints"))
    # the tokenizer before the weights: a backbone that cannot read the labels fails fast
    check_label_tokenizer(cfg.labels, tokenizer if model is not None
                          else load_tokenizer(cfg.model), f"model {cfg.model or '(given)'}")
    set_seed(cfg.seed)
    if model is None:
        model, tokenizer = load_policy(cfg.model, dtype=cfg.dtype, device=cfg.device)
    lm = prepare_trainable(model, cfg.train_layers, cfg.lora)
    prm = ProcessRewardModel(lm).to(cfg.device)
    prm.train()
    optimizer = make_optimizer(trainable_parameters(lm), cfg.optim, extra_groups=[
        {"params": list(prm.head.parameters()), "lr": cfg.optim.lr * cfg.head_lr_factor}])
    scheduler = make_scheduler(optimizer, cfg.optim, cfg.steps)
    pad_id = pad_id_of(tokenizer)
    scorer = PRMScorer(prm, tokenizer, device=cfg.device, batch_size=cfg.batch_size)
    say = console.print if console is not None else (lambda *a, **k: None)
    rng = random.Random(cfg.seed)
    done = 0
    resumed_start: dict = {}
    digest = labels_digest(train)
    if checkpoint is not None:
        # read before the resume loads anything or cuts the log back
        saved = json.loads((checkpoint / PRM_MARKER).read_text()).get("labels_digest")
        if saved is not None and saved != digest:
            # the sampler draws from this list: other labels (a labels folder that grew
            # with `seekrl mcts --resume`, another dev_share) would go on another run
            raise ConfigError(f"labels: {', '.join(map(str, cfg.labels))} hold other training "
                              f"labels than the run in {checkpoint} was trained on "
                              f"({len(train.points)} steps and {len(train.pairs)} pairs now, "
                              f"digest {digest}; the checkpoint's: {saved}); resume with "
                              "the run's labels, or start a new run in another out")
        state = resume_training(checkpoint, prm, optimizer, scheduler, out=out, cfg=cfg,
                                total_steps=cfg.steps, say=say)
        rng.setstate(state["sampler_rng"])
        done = int(state["step"])
        resumed_start = state.get("dev_at_start", {})   # measured before the stop
    # the labels read, the model loaded and built (train_layers, lora): now the old run goes
    claim_run_dir(out, overwrite=overwrite, resume=resume,
                  markers=("metrics.jsonl", "final", "checkpoints"))
    dump_config(cfg, out / "config.yaml")
    log = MetricsLog(out / "metrics.jsonl", resume=resume)
    say(f"PRM on {len(train.points)} labelled steps and {len(train.pairs)} pairs "
        f"({len(dev.points)} / {len(dev.pairs)} held out), loss {cfg.loss}, {cfg.steps} steps")
    notes = label_warnings(cfg.loss, train, dev)
    for note in notes:
        say(f"[yellow]warning:[/] {note}")
    start_metrics = prm_metrics(scorer, dev, cfg.threshold) \
        if cfg.eval_at_start and not done else resumed_start
    losses = [(name, fn, data) for name, fn, data, on in (
        ("pointwise_loss", pointwise_loss, train.points, use_points),
        ("pairwise_loss", pairwise_loss, train.pairs, use_pairs)) if on]
    params = trainable_parameters(lm) + list(prm.head.parameters())
    last: dict[str, Any] = {}
    try:
        for step in range(done + 1, cfg.steps + 1):
            t0 = time.time()
            loss = torch.zeros((), device=cfg.device)
            rec: dict[str, Any] = {"step": step}
            for name, loss_fn, data in losses:
                part = loss_fn(prm, rng.sample(data, min(cfg.batch_size, len(data))), pad_id,
                               cfg.device)
                loss = loss + part
                rec[name] = round(float(part.detach()), 5)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            rec["grad_norm"] = round(clip_and_step(params, optimizer, cfg.optim.max_grad_norm),
                                     4)
            scheduler.step()
            rec["loss"] = round(float(loss.detach()), 5)
            rec["seconds"] = round(time.time() - t0, 2)
            if cfg.eval_every and step % cfg.eval_every == 0 and step != cfg.steps:
                rec.update({f"dev_{k}": v
                            for k, v in prm_metrics(scorer, dev, cfg.threshold).items()})
            log.write(rec)
            last = rec
            if step % cfg.log_every == 0 or step == cfg.steps:
                say(f"step {step}/{cfg.steps}  loss {rec['loss']:.4f}  [{rec['seconds']:.1f}s]")
            if cfg.save_every and step % cfg.save_every == 0 and step != cfg.steps:
                # a checkpoint is a PRM folder like final/: it names its labels (so its label
                # tokens can be counted) and carries its held-out figures when this step had them
                dev_now = {k[4:]: v for k, v in rec.items() if k.startswith("dev_")}
                _save_checkpoint(prm, tokenizer, out / "checkpoints", step, cfg.keep_last,
                                 {"init": cfg.model, "loss": cfg.loss, "step": step,
                                  "labels": [str(x) for x in cfg.labels],
                                  "dev_share": cfg.dev_share, "threshold": cfg.threshold,
                                  "labels_digest": digest,
                                  **({"dev": dev_now} if dev_now else {})},
                                 training_state(prm, step, optimizer, scheduler,
                                                sampler_rng=rng.getstate(),
                                                dev_at_start=start_metrics))
            done = step
    except KeyboardInterrupt:
        log.close()
        raise Interrupted(done, latest_checkpoint(out), cfg.save_every, cfg.steps) from None
    metrics = prm_metrics(scorer, dev, cfg.threshold)
    if dev.points and metrics.get("auc") is None:
        notes.append(f"dev AUC undefined: all {len(dev.points)} held-out step labels are on one "
                     f"side of the threshold {cfg.threshold}")
        say(f"[yellow]warning:[/] {notes[-1]}")
    log.write({"step": cfg.steps, **{f"dev_{k}": v for k, v in metrics.items()}})
    log.close()
    final = save_prm(prm, tokenizer, out / "final", {"init": cfg.model, "loss": cfg.loss,
                                                     "labels": [str(x) for x in cfg.labels],
                                                     "dev_share": cfg.dev_share,
                                                     "threshold": cfg.threshold, "dev": metrics})
    say("dev: " + ", ".join(f"{k} {v}" for k, v in metrics.items()))
    return {"final": str(final), "steps": cfg.steps, "loss": last.get("loss"),
            "dev": metrics, "dev_at_start": start_metrics,
            "train_points": len(train.points), "train_pairs": len(train.pairs),
            "warnings": notes, "minutes": round((time.time() - started) / 60, 2)}


def label_warnings(loss: str, train: LabelSet, dev: LabelSet) -> list[str]:
    """What the labels leave out that a user would not guess from the loss asked for: a
    half of `both` with nothing to train on, and a dev split with nothing to measure."""
    notes = []
    if loss == "both" and not train.pairs:
        notes.append("no sibling pairs outside the dev split: training on the pointwise loss "
                     "only (MCTS labels with search.min_visits / min_gap met give pairs)")
    if loss == "both" and not train.points:
        notes.append("no labelled steps outside the dev split: training on the pairwise loss only")
    if not dev.points and not dev.pairs:
        notes.append("the dev split holds no labels: no held-out AUC or pair accuracy (raise "
                     "dev_share, or label more questions)")
    elif not dev.points:
        notes.append("the dev split holds no labelled steps: no held-out AUC")
    return notes
