"""Two arms paired from their kept records: each seed's final per-question EM against the
other arm's run of the same seed, and each against the start, with the process bench's
two-level bootstrap (seeds, then questions; `bench/process_ablation.py`'s report pairs
the methods of one runs folder, this pairs arms kept in different folders).

    .venv/bin/python bench/pair_records.py \\
        --arm hops_kl bench/records/demo-dev/hopskl9/hops-kl-s*.tar.gz \\
        --base outcome bench/records/demo-dev/steps9/records.tar.gz \\
                       bench/records/demo-dev/steps9-seeds/outcome-s*.tar.gz

Each run is a kept archive (`.tar.gz` holding its `result.json`, and its start's
`start-eval-dev/per_question.json`), a run folder or a `result.json`; its seed is the
one its result names, and the arms are paired seed by seed; an arm's runs are of one
method. The start is `--start` (an evaluation folder or its `per_question.json`), else the
one the archives kept, which must be the same in all of them. Prints the
process bench's `paired_...=` lines (the arm against the base, each against the start),
the last line a summary.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pack_run import ARCHIVES, KeptRun  # noqa: E402
from process_ablation import QuestionMismatch, _paired, paired_line  # noqa: E402

START_IN_ARCHIVE = "start-eval-dev/per_question.json"


def read_run(path: Path) -> tuple[dict, dict | None]:
    """A kept run's result and its start's per-question EM (None where it kept none)."""
    if path.is_dir():
        path = path / "result.json"
    if not path.is_file():
        raise SystemExit(f"{path}: no such run record (a .tar.gz, a run folder or a "
                         "result.json)")
    if path.name.endswith(ARCHIVES):
        kept = KeptRun(path)
        result, start = kept.json("result.json"), kept.json(START_IN_ARCHIVE)
        if result is None:
            raise SystemExit(f"{path}: the archive holds no result.json")
    else:
        result, start = json.loads(path.read_text()), None
    for key in ("seed", "per_question"):
        if result.get(key) is None:
            raise SystemExit(f"{path}: its result has no {key!r} (a run kept before "
                             "per-question EM was, or one whose evaluation kept none)")
    return result, start


def read_start(path: Path) -> dict:
    path = path / "per_question.json" if path.is_dir() else path
    if not path.is_file():
        raise SystemExit(f"--start {path}: no per_question.json there")
    return json.loads(path.read_text())


def common_start(kept: dict) -> dict | None:
    """The start's per-question EM that every run kept ({run: its start}), None if none
    kept one; runs that kept different starts began from different policies."""
    if not kept:
        return None
    first, start = next(iter(kept.items()))
    other = next((run for run, s in kept.items() if s != start), None)
    if other is not None:
        raise SystemExit(f"{first} and {other} kept different starts: the arms began "
                         "from different policies (name the one to pair with: --start)")
    return start


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arm", nargs="+", required=True, metavar=("NAME", "RUN"),
                    help="the arm's name, then its runs (one a seed)")
    ap.add_argument("--base", nargs="+", required=True, metavar=("NAME", "RUN"),
                    help="the arm it is compared with: its name, then its runs")
    ap.add_argument("--start", type=Path, default=None,
                    help="the start's evaluation (default: the one the archives kept)")
    ap.add_argument("--resamples", type=int, default=10_000)
    args = ap.parse_args(argv)
    per_run, start = {}, read_start(args.start) if args.start else None
    names, kept = [], {}   # the start each archive kept, by the run that kept it
    for name, *runs in (args.arm, args.base):
        if not runs:
            raise SystemExit(f"{name}: name its runs after it")
        if name in names or name == "start":
            raise SystemExit(f"{name}: give the two arms different names, neither 'start'")
        names.append(name)
        methods = {}
        for run in map(Path, runs):
            result, kept_start = read_run(run)
            if (name, result["seed"]) in per_run:
                raise SystemExit(f"{run}: a second run of {name} seed {result['seed']}")
            methods.setdefault(result.get("method"), run)
            if len(methods) > 1:
                raise SystemExit(f"{name}: its runs are of different methods ("
                                 + ", ".join(f"{m!r} in {r}" for m, r in methods.items())
                                 + "): one arm is one method")
            per_run[(name, result["seed"])] = result["per_question"]
            if kept_start is not None:
                kept[run] = kept_start
    if start is None:
        start = common_start(kept)
    arm, base = names
    try:
        pairs = [(a, b, _paired(per_run, a, b, start, args.resamples))
                 for a, b in ((arm, base), (arm, "start"), (base, "start"))
                 if b != "start" or start is not None]
    except QuestionMismatch as err:
        raise SystemExit(str(err)) from None
    for a, b, paired in pairs:
        if paired is not None:
            print(paired_line(a, b, paired))
    main_pair = pairs[0][2]
    if main_pair is None:
        raise SystemExit(f"{arm} and {base} have no seed in common")
    print(f"pair_records: {arm} vs {base} {main_pair['gain']:+.4f} "
          f"(95% {main_pair['lo']:+.4f}..{main_pair['hi']:+.4f}), seeds "
          f"{','.join(map(str, main_pair['seeds']))}, {main_pair['questions']} questions"
          + ("" if start is not None else "; no start kept"))


if __name__ == "__main__":
    main()
