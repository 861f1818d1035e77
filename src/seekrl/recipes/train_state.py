"""An RL run's checkpoints: `RUN_DIR/checkpoints/step-N` holds the trainable weights (the
runtime writes them: whole, or each rank its shards), the optimizer's and the schedule's
state, the random state, the search environment's (a co-trained ranker) and the trainer's
counters (`trainer.json`). A checkpoint is written under a temporary name and renamed, and
`checkpoints/latest` names the newest complete one, so a killed run never leaves a corrupt
latest checkpoint and `--resume` continues where the run stopped."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from seekrl.errors import ConfigError
from seekrl.recipes.checkpoint import (
    drop_later_steps,
    fsync_dir,
    point_latest,
    prune_steps,
    replace_dir,
)
from seekrl.recipes.setup import rng_state, set_rng_state

# what trainer.json must hold for a resume
TRAINER_KEYS = ("step", "monitor", "rollout_tokens", "questions_drawn", "questions_planned")


class Checkpointer:
    """Saves and loads a run's training state under `folder` (RUN_DIR/checkpoints),
    keeping the newest `keep_last` (and the one named in `keep` when saving)."""

    def __init__(self, folder: Path, dist, keep_last: int | None):
        self.folder, self.dist, self.keep_last = folder, dist, keep_last

    def latest(self) -> str | None:
        """The newest complete checkpoint's name (step-N), None before the first."""
        pointer = self.folder / "latest"
        return pointer.read_text().strip() if pointer.is_file() else None

    def save(self, step: int, *, runtime, optimizer, scheduler, env, meta: dict[str, Any],
             keep: set) -> Path:
        """step-N with `meta` as its trainer.json. With several processes the runtime writes
        the weights (rank 0 the whole ones; sharded, every rank its shards of the weights
        and optimizer state), rank 0 the rest, and the others wait until it is on disk."""
        target = self.folder / f"step-{step}"
        tmp = self.dist.broadcast(self.folder / f".step-{step}.tmp{os.getpid()}")
        if self.dist.main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self.dist.barrier()
        state = runtime.save(tmp, optimizer)
        if self.dist.main:
            torch.save({**state, "scheduler": scheduler.state_dict(), "rng": rng_state()},
                       tmp / "optim.pt")
            env.save(tmp)
            (tmp / "trainer.json").write_text(json.dumps({"step": step, **meta}))
            if (tmp / "shards").is_dir():
                fsync_dir(tmp / "shards", files=False)   # dcp flushed the files themselves
            fsync_dir(tmp)
            replace_dir(tmp, target)
            fsync_dir(self.folder, files=False)     # the checkpoint's rename is on disk
            point_latest(self.folder, target)
            drop_later_steps(self.folder, step)
            prune_steps(self.folder, self.keep_last, keep={*keep, target.name})
        self.dist.barrier()
        return target

    def load(self, path: Path, *, runtime, optimizer, scheduler, env, device: str
             ) -> dict[str, Any]:
        """Everything `save` wrote back into place; returns its trainer.json (checked for
        the counters a resume reads before anything is loaded)."""
        env.check_checkpoint(path)
        meta = json.loads((path / "trainer.json").read_text())
        missing = [k for k in TRAINER_KEYS if k not in meta]
        if missing:
            raise ConfigError(f"--resume: {path / 'trainer.json'} lacks {', '.join(missing)} "
                              "(written by an older seekrl); start the run again with "
                              "--overwrite")
        state = torch.load(path / "optim.pt", map_location=device, weights_only=False)
        runtime.load(path, optimizer, state)
        scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"])
        env.load(path)
        return meta

    def resume_hint(self, where: str, command: str, *, done: int, save_every: int) -> str:
        """What to tell a user whose run stopped `where` (Ctrl-C) and how to go on
        (`command`: how the run was started, without --resume or --overwrite)."""
        name = self.latest()
        if name is not None:
            return (f"interrupted {where}; the latest checkpoint is {self.folder / name} "
                    f"(step {name.removeprefix('step-')}); continue from it with: "
                    f"{command} --resume")
        if done:
            return (f"interrupted {where}, before the first checkpoint (save_every "
                    f"{save_every}): nothing to resume; start again with: {command} --overwrite")
        return f"interrupted {where}: nothing to resume; start again with: {command}"

