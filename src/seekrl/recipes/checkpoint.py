"""Checkpoint I/O for every recipe: run folders (refused, replaced or resumed), a policy
saved so `load_policy` and any transformers code read it, atomic folder swaps, pruning
of old `step-N` folders, and flushing a folder to disk."""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Sequence
from pathlib import Path

from seekrl.errors import ConfigError

_TAG: tuple[int, str] | None = None


def process_tag() -> str:
    """This process's suffix for the folders a save writes or moves aside (`.tmpTAG`,
    `.oldTAG`): its PID and a random part. Leftovers of a killed save are told from this
    process's own by it, and a restart can get the dead process's PID (a container's
    entrypoint is PID 1 every time): by the PID alone its leftovers passed as ours."""
    global _TAG
    if _TAG is None or _TAG[0] != os.getpid():   # a forked child gets a tag of its own
        _TAG = (os.getpid(), f"{os.getpid()}-{secrets.token_hex(4)}")
    return _TAG[1]

RUN_MARKERS = ("metrics.jsonl", "checkpoints")      # a folder holding these holds a run
RUN_OUTPUTS = ("metrics.jsonl", "alerts.jsonl", "checkpoints", "final", "best", "eval",
               "rollouts", "config.yaml", "report.html", "report_files")


def check_run_dir(out: Path, *, resume: bool = False, overwrite: bool = False,
                  model: str | None = None, markers: Sequence[str] = RUN_MARKERS,
                  resumable: bool = True) -> None:
    """Refuse to write a new run over an old one, before anything slow happens.

    A run folder written into again would lose its metrics (truncated) and its config
    (replaced) without a word: that needs `overwrite` (or `resume`, which continues the
    run). Overwriting a run whose own files hold the model to start from is refused too.
    A folder whose attempt failed at start (no completed step, no checkpoint: see
    `held_markers`) holds no run, so its retry is not refused."""
    if resume or not out.exists():
        return
    held = held_markers(out, markers)
    if not held:
        return
    if not overwrite:
        raise ConfigError(f"out: {out} already holds a run ({', '.join(held)}); pass "
                          + ("--resume to continue it, " if resumable else "")
                          + "--overwrite to replace it, or choose another out")
    if model and Path(model).exists() and Path(model).resolve().is_relative_to(out.resolve()):
        raise ConfigError(f"model: {model} is inside out ({out}), which --overwrite would "
                          "delete; copy the model elsewhere or choose another out")


def held_markers(out: Path, markers: Sequence[str] = RUN_MARKERS) -> list[str]:
    """The `markers` in `out` that hold work: a folder with something in it, a file with
    something in it, and for a `metrics.jsonl` a record of a completed step (step >= 1;
    a line that does not parse counts too). What an attempt that failed at start leaves
    (its config.yaml, an empty metrics.jsonl or one with the step-0 evaluation only) holds
    none."""
    held = []
    for name in markers:
        path = out / name
        if path.is_dir():
            if any(path.iterdir()):
                held.append(name)
        elif path.is_file() and path.stat().st_size:
            if name != "metrics.jsonl" or completed_steps(path):
                held.append(name)
    return held


def completed_steps(metrics: Path) -> int:
    """The last step a metrics log records (0: none; an unreadable line counts as one)."""
    import json

    last = 0
    if not metrics.is_file():
        return 0
    for line in metrics.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            step = json.loads(line).get("step", 0)
            last = max(last, int(step))
        except (ValueError, TypeError, AttributeError):
            last = max(last, 1)
    return last


def claim_run_dir(out: Path, *, resume: bool = False, overwrite: bool = False,
                  outputs: Sequence[str] = RUN_OUTPUTS,
                  markers: Sequence[str] = RUN_MARKERS) -> None:
    """Make `out` ready for the run: with `overwrite`, the old run's files (`outputs`) go,
    where `out` holds a run (`markers`, as `check_run_dir` judged it): a folder that holds
    none keeps its `final/` or `eval/` (a model or data of the user's that `check_run_dir`
    did not look at). Call `check_run_dir` first, and this only once every input has been
    read and checked and the model has loaded, so a bad input never costs the old run; with
    `resume` nothing is touched. Without either, `out` holds no work (`check_run_dir`), but
    an attempt that failed at its start may have left alerts, which a new run would append
    to."""
    out.mkdir(parents=True, exist_ok=True)
    if resume:
        return
    old_run = overwrite and bool(held_markers(out, markers))
    remove_outputs(out, outputs if old_run else [n for n in outputs if n == "alerts.jsonl"])


def remove_outputs(out: Path, names: Sequence[str]) -> None:
    """Delete the named files and folders of `out` (those that exist)."""
    for name in names:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def config_changes(saved: Path, cfg, *, recorded_only: bool = False) -> list[str]:
    """`key: old -> new` for every setting that differs from the run's saved config.yaml;
    with `recorded_only`, keys the file does not hold (added since it was saved) are not
    counted."""
    import yaml

    if not saved.is_file():
        return []
    old = yaml.safe_load(saved.read_text()) or {}
    new = cfg.model_dump(mode="json")
    out: list[str] = []

    def walk(a, b, prefix: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) if recorded_only else set(a) | set(b), key=str):
                walk(a.get(k), b.get(k), f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix[:-1]}: {a!r} -> {b!r}")
    walk(old, new, "")
    return out


def resume_refusals(saved: Path, cfg, may_change: Sequence[str]) -> list[str]:
    """`config_changes`' lines for the keys a resume may not change: those outside
    `may_change` (a key, or a section and everything under it)."""
    return [c for c in config_changes(saved, cfg)
            if not any(c.split(":", 1)[0] == k or c.startswith(k + ".") for k in may_change)]


# settings a checkpoint's optimizer state carries (its param groups, the schedule's base
# rates): changed on --resume, loading that state would put the old values back unsaid
OPTIMIZER_STATE_KEYS = ("optim.lr", "optim.weight_decay", "optim.betas", "head_lr_factor",
                        "algo.value_lr", "ranker.lr")   # the co-trained ranker's AdamW too


def refuse_optimizer_changes(changed: Sequence[str], saved: Path, *,
                             ranker_trains: bool = False) -> None:
    """Refuse `--resume` with a changed setting the optimizer's saved state would override
    (`changed`: `config_changes`' lines); `ranker.lr` only where a ranker trains (no
    ranker optimizer state is read otherwise)."""
    keys = OPTIMIZER_STATE_KEYS if ranker_trains else \
        tuple(k for k in OPTIMIZER_STATE_KEYS if k != "ranker.lr")
    bad = [c for c in changed if c.split(":", 1)[0] in keys]
    if bad:
        raise ConfigError(f"--resume: {'; '.join(bad)} (old -> new): the checkpoint's "
                          "optimizer state holds the old values and would keep them; resume "
                          f"with the run's ({saved}), or start a new run from a checkpoint's "
                          "weights in another out")


# settings an RL checkpoint's weights were trained under: the base they sit on, which
# parameters train and what a LoRA's scale means, and whether a critic (value head) exists
WEIGHT_KEYS = ("model", "lora", "train_layers", "algo.advantage")


def refuse_weight_changes(changed: Sequence[str], saved: Path) -> None:
    """Refuse `--resume` with a changed setting the checkpoint's weights depend on
    (`changed`: `config_changes`' lines): its adapters or top blocks loaded onto another
    base, or rescaled by another `lora.alpha`, would be neither the old run nor a new one."""
    bad = [c for c in changed if any(c.split(":", 1)[0] == k or c.startswith(k + ".")
                                     for k in WEIGHT_KEYS)]
    if bad:
        raise ConfigError(f"--resume: {'; '.join(bad)} (old -> new): the checkpoint's weights "
                          "were trained with the old values; resume with the run's "
                          f"({saved}), or start a new run in another out (model: a "
                          "checkpoint's final/ to go on from its weights)")


def save_policy(model, tokenizer, path: str | Path, *, before_rename=None) -> Path:
    """A plain HF checkpoint (LoRA merged into a copy of the weights) that `load_policy`,
    `seekrl eval --model` and any transformers code can load; written to a temporary folder
    and renamed, so a killed run never leaves half a model under `path`. `before_rename`
    (folder -> None) adds files to the temporary folder first."""
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp{process_tag()}")
    shutil.rmtree(tmp, ignore_errors=True)
    write_policy(model, tokenizer, tmp)
    if before_rename is not None:
        before_rename(tmp)
    # on disk before the rename, as a checkpoint's are: a power cut could otherwise leave
    # `final/` (or `best/`) in place with files that were never written
    fsync_dir(tmp)
    replace_dir(tmp, path)
    fsync_dir(path.parent, files=False)
    return path


def write_policy(model, tokenizer, folder: Path) -> None:
    """The policy as a plain HF checkpoint in `folder` (LoRA merged into a copy of the
    weights), written in place: callers write into a temporary folder and rename it."""
    from seekrl.runtime import quiet_transformers

    quiet_transformers()
    to_save = model
    if hasattr(model, "merge_and_unload"):
        import copy
        to_save = copy.deepcopy(model).merge_and_unload()
    to_save.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def write_checkpoint(folder: Path, step: int, write, keep_last: int) -> Path:
    """`folder/step-N`, whole or not at all: `write(tmp)` fills `.step-N.tmpTAG`, which is
    flushed to disk, renamed into place (the rename flushed too), and only then named by
    `latest`; older step folders beyond `keep_last` go, and so do later ones (a killed
    run's, renamed but never named by `latest`: this run redoes those steps). A kill at
    any moment leaves `latest` naming a complete checkpoint, and what the killed save left
    is removed by the next save (`prune_steps`)."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"step-{step}"
    tmp = folder / f".step-{step}.tmp{process_tag()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    write(tmp)
    fsync_dir(tmp)
    replace_dir(tmp, target)
    fsync_dir(folder, files=False)
    sync_run_logs(folder.parent)
    point_latest(folder, target)
    drop_later_steps(folder, step)
    prune_steps(folder, keep_last, keep={target.name})
    return target


def drop_later_steps(folder: Path, step: int) -> None:
    """Remove `step-M` folders past `step`: a killed run's, renamed into place but never
    named by `latest`; the resumed run redoes those steps (kept, they would count among the
    newest and prune the checkpoint just written)."""
    for p in folder.glob("step-*"):
        number = p.name[len("step-"):]
        if p.is_dir() and number.isdigit() and int(number) > step:
            shutil.rmtree(p, ignore_errors=True)


def prune_steps(folder: Path, keep_last: int, keep: set[str | None] = frozenset()) -> None:
    """Delete all but the newest `keep_last` of the `step-N` folders in `folder` (and those
    named in `keep`); folders of other names are left alone."""
    done = sorted((p for p in folder.glob("step-*")
                   if p.is_dir() and p.name[len("step-"):].isdigit()),
                  key=lambda p: int(p.name[len("step-"):]))
    for p in done[:-keep_last]:
        if p.name not in keep:
            shutil.rmtree(p, ignore_errors=True)
    # what a kill during an earlier save left: a half-written `.step-N.tmpTAG` (never
    # named by `latest`), and a replaced `step-N.oldTAG` whose new `step-N` is in place
    # (without it, the old one is the only copy: kept)
    mine = process_tag()
    for p in folder.glob(".step-*.tmp*"):
        if p.is_dir() and p.name.rpartition(".tmp")[2] != mine:
            shutil.rmtree(p, ignore_errors=True)
    for p in folder.glob("step-*.old*"):
        name, _, pid = p.name.rpartition(".old")
        if p.is_dir() and pid != mine and (folder / name).is_dir():
            shutil.rmtree(p, ignore_errors=True)
    for p in folder.glob(".latest.tmp*"):
        if p.is_file() and p.name.rpartition(".tmp")[2] != mine:
            p.unlink(missing_ok=True)


def replace_dir(tmp: Path, target: Path) -> None:
    """Move a finished folder into place; an older one at `target` goes only after."""
    old = None
    if target.exists():
        old = target.with_name(target.name + f".old{process_tag()}")
        target.rename(old)
    tmp.rename(target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def recover_replaced(target: Path) -> None:
    """What a kill inside `replace_dir` (or `save_policy`) left beside `target`: the old
    copy renamed aside is put back when `target` is missing (it is then the only copy) and
    removed when `target` is in place; a half-written temporary folder is removed."""
    mine = process_tag()
    olds = sorted((p for p in target.parent.glob(target.name + ".old*")
                   if p.is_dir() and p.name.rpartition(".old")[2] != mine),
                  key=lambda p: p.stat().st_mtime_ns)
    if olds and not target.exists():
        olds.pop().rename(target)   # the newest aside
    for p in olds:
        shutil.rmtree(p, ignore_errors=True)
    for p in target.parent.glob(target.name + ".tmp*"):
        if p.is_dir() and p.name.rpartition(".tmp")[2] != mine:
            shutil.rmtree(p, ignore_errors=True)


def point_latest(folder: Path, target: Path) -> None:
    """Make `folder/latest` name `target` (a step-N folder in it): written under a temporary
    name, flushed, then renamed over, so `latest` always names a complete checkpoint."""
    pointer = folder / f".latest.tmp{process_tag()}"
    with open(pointer, "w", encoding="utf-8") as fh:
        fh.write(target.name)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(pointer, folder / "latest")
    fsync_dir(folder, files=False)     # and so is the pointer's rename


def latest_checkpoint(out: Path) -> Path | None:
    """The checkpoint `out/checkpoints/latest` names, None when there is none."""
    pointer = out / "checkpoints" / "latest"
    return out / "checkpoints" / pointer.read_text().strip() if pointer.is_file() else None


def sync_run_logs(out: Path) -> None:
    """Flush a run's step logs to disk before a checkpoint is named `latest`: their lines are
    flushed to the OS at every write, not to the disk, and a resume keeps the lines up to the
    checkpoint's step and redoes only the later ones, so a power cut after the checkpoint
    would leave a hole in the curve that no resume fills."""
    for name in ("metrics.jsonl", "alerts.jsonl"):
        path = out / name
        if path.is_file():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())


def fsync_dir(path: Path, *, files: bool = True) -> None:
    """Flush a folder's files (with `files`, its subfolders' too: a checkpoint's `ranker/`)
    and then the folder itself, whose entries (a new name, a rename) are data of their own:
    without it a power cut can leave `latest` naming a checkpoint whose rename was never
    written, or whose ranker was."""
    if files:
        for f in path.iterdir():
            if f.is_symlink():
                continue
            if f.is_dir():
                fsync_dir(f)
            elif f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
