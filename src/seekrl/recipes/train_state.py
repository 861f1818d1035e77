"""An RL run's state on disk and in memory: its counters (`RunState`: steps done, tokens
and questions spent, the last healthy checkpoint and evaluation) and its checkpoints.
`RUN_DIR/checkpoints/step-N` holds the trainable weights (the runtime writes them: whole, or
each rank its shards), the optimizer's and the schedule's state, the random state, the
search environment's (a co-trained ranker) and the counters (`trainer.json`). A checkpoint
is written under a temporary name and renamed, and `checkpoints/latest` names the newest
complete one, so a killed run never leaves a corrupt latest checkpoint and `--resume`
continues where the run stopped."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from seekrl.errors import ConfigError
from seekrl.recipes.checkpoint import (
    drop_later_steps,
    fsync_dir,
    point_latest,
    process_tag,
    prune_steps,
    recover_replaced,
    replace_dir,
    save_policy,
    sync_run_logs,
)
from seekrl.recipes.setup import keep_log_until, rng_state, set_rng_state, units_within_budget
from seekrl.rl.monitor import EVAL_KINDS

BEST, BEST_JSON = "best", "best.json"   # RUN/best: the policy of the best evaluation

# what trainer.json must hold for a resume
TRAINER_KEYS = ("step", "monitor", "rollout_tokens", "questions_drawn", "questions_planned")


@dataclass
class RunState:
    """An RL run's counters: what a checkpoint saves besides the weights and optimizer, and
    what the budgets and the summary read."""
    step_done: int = 0
    rollout_tokens: int = 0         # generated rollout tokens so far (the compute)
    questions_drawn: int = 0        # questions played so far (refills included)
    # the questions steps planned (first draws): a budget's rate is tokens per planned
    # question, its refills included, so the last step's refills are paid for too
    questions_planned: int = 0
    healthy_checkpoint: str | None = None
    seconds_before: float = 0.0     # training seconds before this process (a resumed run's)
    last_dev: tuple[int, dict[str, Any], Path] | None = None   # step, figures, folder
    best_dev: tuple[int, float] | None = None   # step and EM of the best evaluation (keep_best)
    stopped_reason: str | None = None   # a collapse stopped the run
    stopped_budget: str | None = None   # a time or token budget stopped it

    def to_meta(self, train_seconds: float) -> dict[str, Any]:
        """The counters as trainer.json holds them (the monitor's and the environment's
        state are the trainer's to add)."""
        last = self.last_dev
        return {"healthy_checkpoint": self.healthy_checkpoint,
                "rollout_tokens": self.rollout_tokens, "questions_drawn": self.questions_drawn,
                "questions_planned": self.questions_planned, "train_seconds": train_seconds,
                "last_dev": None if last is None else [last[0], last[1], str(last[2])],
                "best_dev": None if self.best_dev is None else list(self.best_dev),
                "stopped_budget": self.stopped_budget}

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> RunState:
        last = meta.get("last_dev")   # the evaluation the checkpoint's step had
        best = meta.get("best_dev")   # absent in a checkpoint written before keep_best
        return cls(step_done=meta["step"], rollout_tokens=int(meta.get("rollout_tokens", 0)),
                   questions_drawn=int(meta.get("questions_drawn", 0)),
                   questions_planned=int(meta["questions_planned"]),
                   healthy_checkpoint=meta.get("healthy_checkpoint"),
                   seconds_before=float(meta.get("train_seconds", 0.0)),
                   last_dev=None if last is None else
                   (int(last[0]), dict(last[1]), Path(last[2])),
                   best_dev=None if best is None else (int(best[0]), float(best[1])),
                   stopped_budget=meta.get("stopped_budget"))

    def improves(self, step: int, em: float) -> bool:
        """Whether an evaluation's EM beats every earlier one (the first evaluation always
        does; a tie keeps the earlier policy); if so it becomes the best."""
        if self.best_dev is not None and em <= self.best_dev[1]:
            return False
        self.best_dev = (step, em)
        return True

    def progress(self, steps: int, budget: int | None) -> float:
        """Where the next step sits in the run, 0 to 1: 0 at its first step and 1 at its
        last (steps done over steps - 1, so a schedule reaches its end value on a step that
        is played), or the token budget's share spent if larger (a run a budget ends early
        still goes through the simulator's noise curriculum)."""
        return min(max(self.step_done / max(steps - 1, 1), self.budget_share(budget)), 1.0)

    def budget_share(self, budget: int | None) -> float:
        """The share of the rollout-token budget spent (0 without a budget)."""
        return self.rollout_tokens / budget if budget else 0.0

    def questions_for_budget(self, budget: int | None, per_step: int) -> int:
        """`per_step`, or, with a token budget, the questions the rest of it pays for at the
        tokens per question so far (0: spent): a run's compute then lands within half a
        question of the budget, not half a step (a Monte-Carlo step can cost more than the
        whole budget)."""
        if budget is None:
            return per_step
        return units_within_budget(budget, self.rollout_tokens, self.questions_planned,
                                   per_step)


class Checkpointer:
    """Saves and loads a run's training state under `folder` (RUN_DIR/checkpoints): what
    `runtime`, `optimizer`, `scheduler` and the search environment `env` hold, the random
    state and the run's counters; keeps the newest `keep_last` (and the one named in `keep`
    when saving)."""

    def __init__(self, folder: Path, dist, keep_last: int | None, *, runtime, optimizer,
                 scheduler, env, device: str):
        self.folder, self.dist, self.keep_last = folder, dist, keep_last
        self.runtime, self.optimizer, self.scheduler = runtime, optimizer, scheduler
        self.env, self.device = env, device

    def latest(self) -> str | None:
        """The newest complete checkpoint's name (step-N), None before the first."""
        pointer = self.folder / "latest"
        return pointer.read_text().strip() if pointer.is_file() else None

    def save(self, step: int, meta: dict[str, Any], keep: set) -> Path:
        """step-N with `meta` as its trainer.json. With several processes the runtime writes
        the weights (rank 0 the whole ones; sharded, every rank its shards of the weights
        and optimizer state), rank 0 the rest, and the others wait until it is on disk."""
        target = self.folder / f"step-{step}"
        tmp = self.dist.broadcast(self.folder / f".step-{step}.tmp{process_tag()}")
        if self.dist.main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self.dist.barrier()
        state = self.runtime.save(tmp, self.optimizer)
        if self.dist.main:
            torch.save({**state, "scheduler": self.scheduler.state_dict(), "rng": rng_state()},
                       tmp / "optim.pt")
            self.env.save(tmp)
            (tmp / "trainer.json").write_text(json.dumps({"step": step, **meta}))
            if (tmp / "shards").is_dir():
                fsync_dir(tmp / "shards", files=False)   # dcp flushed the files themselves
            fsync_dir(tmp)
            replace_dir(tmp, target)
            fsync_dir(self.folder, files=False)     # the checkpoint's rename is on disk
            sync_run_logs(self.folder.parent)
            point_latest(self.folder, target)
            drop_later_steps(self.folder, step)
            prune_steps(self.folder, self.keep_last, keep={*keep, target.name})
        self.dist.barrier()
        return target

    def save_best(self, tokenizer, step: int, em: float, evaluation: Path,
                  with_ranker=None) -> Path:
        """RUN/best: the policy as it is now, a plain checkpoint (`save_policy`; with a
        trained ranker, `with_ranker(folder)` adds it as final/ has it), replaced whole.
        best.json names its step and EM, and a copy of the `evaluation` folder's figures and
        episodes (`best/eval`) keeps what chose it even if that step is redone after a
        resume."""
        best = self.folder.parent / BEST
        plain = self.runtime.gathered_policy()   # sharded: the full weights, on rank 0
        if self.dist.main:
            note = json.dumps({"step": step, "em": em, "evaluation": evaluation.name,
                               "eval_dir": str(best / "eval")})

            def extras(tmp: Path) -> None:
                (tmp / "eval").mkdir()
                for name in ("metrics.json", "trajectories.jsonl"):
                    if (evaluation / name).is_file():
                        shutil.copyfile(evaluation / name, tmp / "eval" / name)
                if with_ranker is not None:
                    with_ranker(tmp)
                (tmp / BEST_JSON).write_text(note)

            save_policy(plain, tokenizer, best, before_rename=extras)
        self.dist.barrier()
        return best

    def best_note(self) -> dict[str, Any] | None:
        """What RUN/best holds (best.json and its folder), None before a best is saved."""
        note = self.folder.parent / BEST / BEST_JSON
        if not note.is_file():
            return None
        return {**json.loads(note.read_text()), "dir": str(note.parent)}

    def load(self, path: Path) -> dict[str, Any]:
        """Everything `save` wrote back into place; returns its trainer.json (checked for
        the counters a resume reads before anything is loaded)."""
        self.env.check_checkpoint(path)
        meta = json.loads((path / "trainer.json").read_text())
        missing = [k for k in TRAINER_KEYS if k not in meta]
        if missing:
            raise ConfigError(f"--resume: {path / 'trainer.json'} lacks {', '.join(missing)} "
                              "(written by an older seekrl); start the run again with "
                              "--overwrite")
        state = torch.load(path / "optim.pt", map_location=self.device, weights_only=False)
        self.runtime.load(path, self.optimizer, state)
        self.scheduler.load_state_dict(state["scheduler"])
        # the schedule's lr into the groups: loading a scheduler does not set it, and a
        # sharded checkpoint of an optimizer that never stepped holds no groups to load
        for group, lr in zip(self.optimizer.param_groups, self.scheduler.get_last_lr()):
            group["lr"] = lr
        set_rng_state(state["rng"])
        self.env.load(path)
        return meta

    def resume(self, monitor, *, steps: int, say) -> RunState:
        """The latest checkpoint loaded into place (that there is one was checked before
        anything loaded), the monitor's and the environment's state with it, and the log
        lines of the steps after it dropped (rank 0); returns the run's counters."""
        path = self.folder / self.latest()
        meta = self.load(path)
        state = RunState.from_meta(meta)
        if self.dist.main:   # a kill while the best was being replaced: its old copy back
            recover_replaced(self.folder.parent / BEST)
        self.dist.barrier()   # every rank then reads the same best (they all save it)
        note = self.best_note()
        if note is not None:   # saved after the checkpoint, it is the record to beat: it
            # is a policy that scored that (a redone step that scores the same keeps it)
            state.best_dev = (int(note["step"]), float(note["em"]))
        elif state.best_dev is not None:   # the folder is gone: the next evaluation saves
            say(f"no {self.folder.parent / BEST} (the best policy of steps up to "
                f"{state.best_dev[0]}, EM {state.best_dev[1]:.3f}): the next evaluation's "
                "policy is saved there, and later better ones")
            state.best_dev = None
        self.env.load_state_dict(meta.get("simulator_stats", {}))
        monitor.load_state_dict(meta["monitor"])
        done = state.step_done
        say(f"resuming from {path}: {done} of {steps} steps done, "
            + (f"continuing with step {done + 1} of {steps}" if done < steps
               else "saving and evaluating the final model"))
        if self.dist.main:
            drop_redone_lines(self.folder.parent, state)
        return state

    def resume_hint(self, command: str, *, done: int, steps: int, save_every: int) -> str:
        """What to tell a user whose run was interrupted (Ctrl-C) after `done` of `steps`
        steps, and how to go on (`command`: how the run was started, without --resume or
        --overwrite)."""
        where = (f"during step {done + 1} of {steps}" if done < steps else
                 f"after its last step ({steps}), before the final model was saved")
        name = self.latest()
        if name is not None:
            return (f"interrupted {where}; the latest checkpoint is {self.folder / name} "
                    f"(step {name.removeprefix('step-')}); continue from it with: "
                    f"{command} --resume")
        if done:
            return (f"interrupted {where}, before the first checkpoint (save_every "
                    f"{save_every}): nothing to resume; start again with: {command} --overwrite")
        return f"interrupted {where}: nothing to resume; start again with: {command}"


# the key that marks the final evaluation's lines in metrics.jsonl and alerts.jsonl
FINAL_EVAL = "eval"


def drop_redone_lines(out: Path, state: RunState) -> None:
    """On resume: the metrics and alert lines of the steps after the checkpoint go (they are
    about to be redone, and their lines come back), and so do a dev line and its alerts at
    the checkpoint's step that the checkpoint does not know of (the final evaluation of a
    run killed after it, which comes back too). A line marked as the final evaluation's
    goes wherever it is: after a collapse it was logged under the restored step, which the
    checkpoint may know of from its periodic evaluation, and the finish is redone."""
    step, last = state.step_done, state.last_dev
    unknown = last is None or last[0] != step

    def final(record: dict) -> bool:
        return record.get(FINAL_EVAL) == "final"

    def unknown_dev(record: dict) -> bool:
        return final(record) or unknown and record.get("step") == step and \
            any(k.startswith("dev_") for k in record)

    def unknown_eval_alert(record: dict) -> bool:
        return final(record) or unknown and record.get("step") == step and \
            record.get("kind") in EVAL_KINDS

    keep_log_until(out / "metrics.jsonl", step, unknown_dev)
    keep_log_until(out / "alerts.jsonl", step, unknown_eval_alert)


def logged_step(path: Path, step: int) -> dict[str, Any]:
    """The training record of `step` in a metrics log ({} where it has none): the last
    line of that step without dev figures."""
    found: dict[str, Any] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and record.get("step") == step and \
                    not any(k.startswith("dev_") for k in record):
                found = record
    return found


def run_summary(state: RunState, *, final: Path, last: dict[str, Any], minutes: float,
                budget: int | None, simulator_tokens: int | None) -> dict[str, Any]:
    """What summary.json says of a finished run (its dev figures are the trainer's to
    add). Equal compute means within 10% of a token budget: `budget_met` says whether."""
    summary = {"steps": state.step_done, "final": str(final), "stopped": state.stopped_reason,
               "last": last, "rollout_tokens": state.rollout_tokens,
               "budget": state.stopped_budget, "minutes": minutes}
    if simulator_tokens is not None:   # the simulator's compute, outside the budget
        summary["simulator_tokens"] = simulator_tokens
    if budget is not None:
        ratio = state.rollout_tokens / budget
        summary.update(budget_ratio=round(ratio, 4), budget_met=abs(ratio - 1) <= 0.1)
    return summary
