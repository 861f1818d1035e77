"""One RL run's small records packed into one `.tar.gz`, the form `bench/records/demo-dev`
keeps a run in: what `bench/pair_records.py`, `bench/probe_records.py` and
`bench/learning_curves.py` read back.

    .venv/bin/python bench/pack_run.py W/steps9kl1/hops-s0 W/plan/eval-sft-dev \\
        bench/records/demo-dev/hopskl1/hops-kl1-s0.tar.gz

Kept: the run's `config.yaml`, step log and `result.json`; for each of its evaluations
(`eval/step-N` and `eval/final` as `eval-step-N` and `eval-final`; those beside it, as
`eval-test` of a run tested once or an older run's `eval-dev`, as they are) and for the
start's evaluation (the second argument, as `start-eval-dev`), its `metrics.json`, its
`per_question.json` where it kept one, and `answers.json`: each episode's question id,
answer, searches, the lookups its first thought planned and how it finished. Where the run
kept its steps' episodes (`log.save_rollouts`), each step's go in as
`rollouts-step-N/answers.json`, the same fields with the episode's sample and group, its
question's kind and hops, its rewards (total, the answer's part) and each turn's action and process
reward. Token ids, documents and checkpoints stay behind.
Prints the archive and its size. `KeptRun` reads a run back, packed or as its folder.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import re
import tarfile
from pathlib import Path

ARCHIVES = (".tar.gz", ".tgz")


class KeptRun:
    """A kept run's files by name: those of the archive it was packed into, or of its
    folder (read on demand); `text` reads a `.gz` file decompressed."""

    def __init__(self, path: Path):
        self.path = path
        self.packed = path.name.endswith(ARCHIVES)
        self.name = (path.name.removesuffix(".tar.gz").removesuffix(".tgz") if self.packed
                     else path.name)
        self.members: dict[str, bytes] | None = None
        if self.packed:
            if not path.is_file():
                raise SystemExit(f"{path}: no such archive")
            with tarfile.open(path) as tar:
                self.members = {m.name.removeprefix("./"): tar.extractfile(m).read()
                                for m in tar.getmembers() if m.isfile()}

    def names(self, suffix: str = "") -> list[str]:
        """Every file it holds (a folder's, relative to it) whose name ends with suffix."""
        if self.members is not None:
            return [n for n in self.members if n.endswith(suffix)]
        return [str(p.relative_to(self.path)) for p in sorted(self.path.rglob(f"*{suffix}"))
                if p.is_file()]

    def read(self, name: str) -> bytes | None:
        if self.members is not None:
            return self.members.get(name)
        path = self.path / name
        return path.read_bytes() if path.is_file() else None

    def text(self, name: str) -> str | None:
        data = self.read(name)
        if data is None:
            return None
        return (gzip.decompress(data) if name.endswith(".gz") else data).decode("utf-8")

    def json(self, name: str):
        data = self.read(name)
        return None if data is None else json.loads(data)


def _answers(folder: Path, *, training: bool = False) -> bytes:
    """An evaluation's (or a training step's) episodes, compact."""
    from seekrl.agent.trajectory import iter_trajectories

    path = folder / "trajectories.jsonl"
    if not path.is_file():
        raise SystemExit(f"{folder}: no trajectories.jsonl to take the answers from")
    rows = []
    for t in iter_trajectories(path, tokens=False):
        row = {"id": t.example_id, "answer": t.answer, "searches": t.n_searches,
               "planned": t.planned_lookups, "finish": t.finish_reason}
        if training:
            # a training question is not among the evaluated ones: its kind goes with it
            # the group: a question a refill drew twice in one step is two groups
            row.update(sample=t.sample_index, group=t.group_id, type=t.metadata.get("type"),
                       hops=t.metadata.get("hops"), reward=t.outcome_reward,
                       outcome=t.outcome_part,
                       steps=[[s.action, s.process_reward] for s in t.steps])
        rows.append(row)
    return json.dumps(rows, separators=(",", ":")).encode()


def _evaluations(run: Path) -> list[tuple[str, Path]]:
    """The run's probes (`eval/step-N`, `eval/final`) in step order, then the evaluations
    beside it (`eval-test`: the final policy's on the test questions; `eval-dev` in an
    older layout, its final one)."""
    folder = run / "eval"
    found = [d for d in folder.iterdir() if d.is_dir()] if folder.is_dir() else []
    probes = [(f"eval-{d.name}", d) for d in sorted(found, key=lambda d: (len(d.name), d.name))]
    beside = [(d.name, d) for d in sorted(run.glob("eval-*"))
              if d.is_dir() and (d / "metrics.json").is_file()]
    return probes + beside


def pack(run: Path, start: Path, out: Path) -> Path:
    for name in ("config.yaml", "metrics.jsonl", "result.json"):
        if not (run / name).is_file():
            raise SystemExit(f"{run}: no {name} (pack a finished run)")
    if not (start / "metrics.json").is_file():
        raise SystemExit(f"{start}: not an evaluation (no metrics.json)")
    rollouts = sorted(((int(m.group(1)), d) for d in (run / "rollouts").glob("step-*")
                       if (m := re.fullmatch(r"step-(\d+)", d.name)) and d.is_dir()),
                      key=lambda x: x[0]) if (run / "rollouts").is_dir() else []
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w:gz") as tar:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        for name in ("config.yaml", "metrics.jsonl", "result.json"):
            add(name, (run / name).read_bytes())
        for tag, folder in _evaluations(run) + [("start-eval-dev", start)]:
            for name in ("metrics.json", "per_question.json"):
                if (folder / name).is_file():
                    add(f"{tag}/{name}", (folder / name).read_bytes())
            add(f"{tag}/answers.json", _answers(folder))
        for step, folder in rollouts:
            add(f"rollouts-step-{step}/answers.json", _answers(folder, training=True))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="the run's folder")
    ap.add_argument("start", type=Path, help="the start's dev evaluation (eval-sft-dev)")
    ap.add_argument("out", type=Path, help="the archive to write (.tar.gz)")
    args = ap.parse_args(argv)
    if not args.out.name.endswith(".tar.gz"):
        raise SystemExit(f"{args.out}: name the archive NAME-sSEED.tar.gz")
    out = pack(args.run, args.start, args.out)
    print(f"packed={out} bytes={out.stat().st_size}")


if __name__ == "__main__":
    main()
