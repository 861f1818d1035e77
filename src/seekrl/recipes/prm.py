"""The process reward model (ProRAG's stage 2, second half): a causal LM with a scalar head
that scores a step from (question, steps so far, the new step), read at the step's last
token (`Step.end - 1`). The model is causal, so the score of a step never sees what came
after it, and one forward pass over a whole episode scores all its steps at once (ProRAG
calls the model once per step).

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

The saved folder is a plain Hugging Face checkpoint of the backbone (LoRA merged) plus
`prm_head.pt` and `prm.json`; `load_scorer(path)` gives the object the `prm` process
reward calls (`score_steps(trajectories) -> probabilities per step`).
"""

from __future__ import annotations

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
from seekrl.models import cast_weights, pad_id_of
from seekrl.recipes.labels import (
    LabelSet,
    PairLabel,
    PointLabel,
    check_label_tokenizer,
    labelling_policy,
    read_labels,
    split_labels,
)
from seekrl.rl.forward import collate, hidden_states, shared_prompts, suffix_hidden

PRM_MARKER = "prm.json"


class ProcessRewardModel(nn.Module):
    """A causal LM's backbone and a linear head on its last hidden state."""

    def __init__(self, lm: nn.Module, head: nn.Linear | None = None):
        super().__init__()
        self.lm = lm
        self.head = head if head is not None else nn.Linear(lm.config.hidden_size, 1)
        if head is None:   # zero scores at the start: the labels decide where they go
            nn.init.zeros_(self.head.weight)
            nn.init.zeros_(self.head.bias)

    def step_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    rows: torch.Tensor, positions: torch.Tensor,
                    policy_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Scores (logits) at `(rows[i], positions[i])`, one per requested step end. With
        `policy_mask` (1 on generated tokens), rows that share their prompt (a question's
        rollouts) run it once and reuse its KV cache, as the policy's forward does."""
        shared = shared_prompts(input_ids, attention_mask, policy_mask) \
            if policy_mask is not None else None
        h = suffix_hidden(self.lm, input_ids, attention_mask, *shared) if shared else None
        if h is None:
            h = hidden_states(self.lm, input_ids, attention_mask)
            return self.head(h[rows, positions].float()).squeeze(-1)
        cuts = torch.tensor(shared[0], dtype=torch.long, device=positions.device)
        return self.head(h[rows, positions - cuts[rows]].float()).squeeze(-1)


def step_end(traj: Trajectory, index: int) -> int:
    """The token the head reads for step `index`: its last generated token."""
    s = traj.steps[index]
    # an empty turn (nothing generated) is read where its context ends
    return s.end - 1 if s.end > s.start else max(s.start - 1, 0)


def batch_scores(prm: ProcessRewardModel, items: Sequence[tuple[Trajectory, list[int]]],
                 pad_id: int, device) -> list[torch.Tensor]:
    """For each (trajectory, step indices), the logits of those steps, in one forward pass
    (each episode cut after the last step asked for)."""
    ends = [[step_end(t, i) for i in idx] for t, idx in items]
    cut = [max(e) + 1 if e else 1 for e in ends]
    ids, attn, policy = collate([t.token_ids[:c] for (t, _), c in zip(items, cut)],
                                [t.loss_mask[:c] for (t, _), c in zip(items, cut)], pad_id, device)
    rows = torch.tensor([r for r, e in enumerate(ends) for _ in e], dtype=torch.long,
                        device=ids.device)
    pos = torch.tensor([p for e in ends for p in e], dtype=torch.long, device=ids.device)
    flat = prm.step_logits(ids, attn, rows, pos, policy) if len(pos) \
        else torch.zeros(0, device=ids.device)
    out, i = [], 0
    for e in ends:
        out.append(flat[i:i + len(e)])
        i += len(e)
    return out


class PRMScorer:
    """`score_steps(trajectories)`: the probability that each step leads to a right answer
    (sigmoid of the head), batched; what `reward.process.prm` calls."""

    def __init__(self, prm: ProcessRewardModel, tokenizer, *, device: str = "cpu",
                 batch_size: int = 8):
        self.prm, self.tokenizer, self.device, self.batch_size = prm, tokenizer, device, batch_size
        self.pad_id = pad_id_of(tokenizer)

    def logits(self, trajectories: Sequence[Trajectory]) -> list[list[float]]:
        return self._rows(trajectories, probabilities=False)

    def score_steps(self, trajectories: Sequence[Trajectory]) -> list[list[float]]:
        return self._rows(trajectories, probabilities=True)

    @torch.no_grad()
    def _rows(self, trajectories: Sequence[Trajectory], *, probabilities: bool
              ) -> list[list[float]]:
        vocab = self.prm.lm.get_input_embeddings().num_embeddings
        for t in trajectories:
            if t.token_ids and max(t.token_ids) >= vocab:
                raise DataError(f"episode {t.example_id!r} holds token id {max(t.token_ids)}, "
                                f"past the PRM's {vocab} embeddings: it was written with "
                                "another tokenizer", field="token_ids")
        was = self.prm.training
        self.prm.eval()
        out: list[list[float]] = [[] for _ in trajectories]
        order = sorted(range(len(trajectories)), key=lambda i: len(trajectories[i].token_ids))
        try:
            with cast_weights(self.prm.lm):   # bf16-mixed: weights cast once a call
                for b in range(0, len(order), self.batch_size):
                    chunk = [i for i in order[b:b + self.batch_size] if trajectories[i].steps]
                    if not chunk:
                        continue
                    scores = batch_scores(self.prm, [(trajectories[i],
                                                      list(range(len(trajectories[i].steps))))
                                                     for i in chunk], self.pad_id, self.device)
                    for i, s in zip(chunk, scores):
                        out[i] = (torch.sigmoid(s) if probabilities else s).tolist()
        finally:
            self.prm.train(was)
        return out


def save_prm(prm: ProcessRewardModel, tokenizer, path: str | Path, info: dict | None = None,
             state: dict | None = None) -> Path:
    """A PRM folder `load_prm` reads; with `state`, also `state.pt` (what a resumed
    training run needs)."""
    from seekrl.recipes.checkpoint import save_policy

    def head_and_marker(folder: Path) -> None:   # inside the folder before it is moved in
        torch.save(prm.head.state_dict(), folder / "prm_head.pt")
        (folder / PRM_MARKER).write_text(json.dumps({"kind": "seekrl-prm", **(info or {})},
                                                    indent=1))
        if state is not None:
            torch.save(state, folder / "state.pt")
    return save_policy(prm.lm, tokenizer, path, before_rename=head_and_marker)


def prm_folder(path: str | Path) -> Path:
    """The folder holding a PRM: `path` itself, or the `final/` of a `seekrl prm train` run
    folder. FileNotFoundError when it holds neither."""
    path = Path(path)
    if not (path / PRM_MARKER).is_file() and (path / "final" / PRM_MARKER).is_file():
        return path / "final"
    if not (path / PRM_MARKER).is_file():
        raise FileNotFoundError(f"{path}: not a process reward model folder (no {PRM_MARKER}; "
                                "`seekrl prm train` writes one in its out/final)")
    return path


def load_prm(path: str | Path, *, dtype: str = "float32", device: str = "cpu"
             ) -> tuple[ProcessRewardModel, Any]:
    from seekrl.models import load_policy

    path = prm_folder(path)
    lm, tokenizer = load_policy(str(path), dtype=dtype, device=device)
    head = nn.Linear(lm.config.hidden_size, 1)
    head.load_state_dict(torch.load(path / "prm_head.pt", map_location=device))
    return ProcessRewardModel(lm, head.to(device)).eval(), tokenizer


def load_scorer(path: str | Path, *, device: str = "cpu", batch_size: int = 8,
                dtype: str = "float32") -> PRMScorer:
    """The PRM at `path` as a scorer; `dtype` as a policy's (`bf16-mixed`: the forward under
    autocast, with the weights cast once per scoring call)."""
    prm, tokenizer = load_prm(path, device=device, dtype=dtype)
    return PRMScorer(prm, tokenizer, device=device, batch_size=batch_size)


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


# ---------------------------------------------------------------------- the recipe
def _save_checkpoint(prm: ProcessRewardModel, tokenizer, folder: Path, step: int,
                     keep_last: int, info: dict, state: dict) -> None:
    """`folder/step-N`, a PRM `load_scorer` reads, with the training state in state.pt;
    then `latest` names it and only the newest `keep_last` stay."""
    from seekrl.recipes.checkpoint import point_latest, prune_steps

    target = save_prm(prm, tokenizer, folder / f"step-{step}", info, state=state)
    point_latest(folder, target)
    prune_steps(folder, keep_last)


def check_scorer_tokenizer(scorer: Any, tokenizer, who: str) -> None:
    """A PRM reads the policy's token ids as they are: refuse one whose tokenizer differs
    (a scorer without a tokenizer of its own, such as a test's, passes)."""
    from seekrl.models import tokenizer_fingerprint

    theirs = getattr(scorer, "tokenizer", None)
    if theirs is None or theirs is tokenizer or not hasattr(theirs, "get_vocab"):
        return
    if tokenizer_fingerprint(theirs) != tokenizer_fingerprint(tokenizer):
        raise ConfigError(f"{who}: the PRM has another tokenizer than the policy; train it "
                          "on a backbone that shares the policy's tokenizer")


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
    if checkpoint is not None:
        state = resume_training(checkpoint, prm, optimizer, scheduler, out=out, cfg=cfg,
                                total_steps=cfg.steps, say=say)
        rng.setstate(state["sampler_rng"])
        done = int(state["step"])
    # the labels read, the model loaded and built (train_layers, lora): now the old run goes
    claim_run_dir(out, overwrite=overwrite, resume=resume)
    dump_config(cfg, out / "config.yaml")
    log = MetricsLog(out / "metrics.jsonl", resume=resume)
    say(f"PRM on {len(train.points)} labelled steps and {len(train.pairs)} pairs "
        f"({len(dev.points)} / {len(dev.pairs)} held out), loss {cfg.loss}, {cfg.steps} steps")
    notes = label_warnings(cfg.loss, train, dev)
    for note in notes:
        say(f"[yellow]warning:[/] {note}")
    start_metrics = prm_metrics(scorer, dev, cfg.threshold) \
        if cfg.eval_at_start and not done else {}
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
                                  "dev_share": cfg.dev_share,
                                  **({"dev": dev_now} if dev_now else {})},
                                 training_state(prm, step, optimizer, scheduler,
                                                sampler_rng=rng.getstate()))
            done = step
    except KeyboardInterrupt:
        log.close()
        raise Interrupted(done, latest_checkpoint(out), cfg.save_every) from None
    metrics = prm_metrics(scorer, dev, cfg.threshold)
    if dev.points and metrics.get("auc") is None:
        notes.append(f"dev AUC undefined: all {len(dev.points)} held-out step labels are on one "
                     f"side of the threshold {cfg.threshold}")
        say(f"[yellow]warning:[/] {notes[-1]}")
    log.write({"step": cfg.steps, **{f"dev_{k}": v for k, v in metrics.items()}})
    log.close()
    final = save_prm(prm, tokenizer, out / "final", {"init": cfg.model, "loss": cfg.loss,
                                                     "labels": [str(x) for x in cfg.labels],
                                                     "dev_share": cfg.dev_share, "dev": metrics})
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
