"""Which answers a run's probes change: each evaluation's per-question EM against the first's
(a run's start), counted by question type, and how many questions are right at least once
and every time over all of them.

    .venv/bin/python bench/probe_flips.py --questions W/world/dev.jsonl \\
        bench/records/long200w/recall_cost-s0          # its eval-start, eval-step-N, eval-final

A greedy probe's EM is one draw: many questions sit on a near-tie that any update resolves
either way. A run that learns gains more than it loses, probe after probe, in the types it
is rewarded on; one that drifts flips answers both ways, and one that loses what the start
knew loses more at every probe. This reads that from the records without rerunning anything.

Each EVAL is an evaluation folder (with `per_question.json`, or the trajectories it is
computed from) or a folder of them (a run's `eval/` or its kept `eval-*` folders), read in
step order, start first; the first evaluation is the reference unless `--against` names
one. A test evaluation (`eval-test`) is not a probe and is left out of a run's folder.
`--questions` gives each question's type (`metadata.type` of the world's question file);
without it every question is of one type, `all`. `--set-aside-yes-no` leaves out the
questions whose golds are all yes or no (a policy that swaps one constant answer for the
other flips all of them at once, which says nothing about what it learned). Prints `key=value` figures per
evaluation, the totals, the last line a summary; `--out FILE` writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from answer_reading import eval_folders, names, read_questions  # noqa: E402
from process_ablation import _per_question  # noqa: E402

from seekrl.eval.evaluate import yes_no  # noqa: E402

ALL = "all"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("evals", nargs="+", type=Path, help="evaluation folders, or folders of them")
    ap.add_argument("--questions", action="append", type=Path, default=[],
                    help="the question file(s) the evaluations asked, for the types (repeatable)")
    ap.add_argument("--against", type=Path, default=None,
                    help="the reference evaluation (default: the first)")
    ap.add_argument("--set-aside-yes-no", action="store_true",
                    help="leave out the questions whose gold answers are all yes or no "
                         "(read from --questions)")
    ap.add_argument("--out", type=Path, default=None, help="the figures as JSON")
    return ap


def probes(paths: list[Path]) -> list[Path]:
    """The evaluation folders under `paths`. A run folder's test evaluation is left out (its
    probes are dev); one named itself, as when two runs' tests are compared, is kept."""
    named = {p.resolve() for p in paths if (p / "metrics.json").is_file()}
    return [f for f in eval_folders(paths)
            if f.name not in ("eval-test", "test") or f.resolve() in named]


def per_question(folder: Path) -> dict[str, float]:
    found = _per_question(folder)
    if found is None:
        raise SystemExit(f"{folder}: neither per_question.json nor trajectories.jsonl")
    return found


def _question(questions: dict[str, dict], qid: str) -> dict:
    q = questions.get(qid.rsplit("/", 1)[-1])   # a several-dataset key is dataset/id
    if q is None:
        raise SystemExit(f"question {qid}: not in the --questions file(s)")
    return q


def _type(questions: dict[str, dict], qid: str) -> str:
    if not questions:
        return ALL
    return str((_question(questions, qid).get("metadata") or {}).get("type") or ALL)


def flips(reference: dict[str, float], runs: list[dict[str, float]],
          types: dict[str, str]) -> dict:
    """Per evaluation of `runs`: its EM, and the questions it answers right where the
    reference did not (gained) and wrong where the reference was right (lost), by type;
    over the reference and all of them, how many are right at least once and every time.
    An EM between 0 and 1 (several samples) counts by its sign against the reference."""
    missing = [q for r in runs for q in reference if q not in r]
    if missing:
        raise SystemExit(f"question {missing[0]}: in the reference, not in every evaluation "
                         "(evaluations of other questions)")
    rows = []
    for r in runs:
        row: dict = {"em": sum(r[q] for q in reference) / len(reference)}
        gained = Counter(types[q] for q in reference if r[q] > reference[q])
        lost = Counter(types[q] for q in reference if r[q] < reference[q])
        row["gained"], row["lost"] = sum(gained.values()), sum(lost.values())
        row["gained_by_type"], row["lost_by_type"] = dict(gained), dict(lost)
        rows.append(row)
    every = [reference, *runs]
    once = Counter(types[q] for q in reference if any(e[q] > 0 for e in every))
    always = Counter(types[q] for q in reference if all(e[q] >= 1 for e in every))
    size = Counter(types[q] for q in reference)
    total = {t: (sum(r["gained_by_type"].get(t, 0) for r in rows),
                 sum(r["lost_by_type"].get(t, 0) for r in rows)) for t in sorted(size)}
    return {"questions": len(reference), "evaluations": rows, "by_type": {
        t: {"questions": size[t], "gained": total[t][0], "lost": total[t][1],
            "right_once": once[t], "right_always": always[t]} for t in sorted(size)},
        "right_once": sum(once.values()), "right_always": sum(always.values())}


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.set_aside_yes_no and not args.questions:
        raise SystemExit("--set-aside-yes-no reads the golds from --questions: give the file")
    folders = probes(args.evals)
    if args.against is not None:
        folders = [args.against, *[f for f in folders if f.resolve() != args.against.resolve()]]
    if len(folders) < 2:
        raise SystemExit("give at least two evaluations: the reference and one to compare")
    labels = names(folders)
    reference, *runs = (per_question(f) for f in folders)
    questions = read_questions(args.questions) if args.questions else {}
    types = {q: _type(questions, q) for q in reference}
    if args.set_aside_yes_no:
        aside = {q for q in reference if yes_no(
            None, _question(questions, q).get("golden_answers") or []) is not None}
        print(f"set_aside_yes_no={len(aside)}")
        reference = {q: v for q, v in reference.items() if q not in aside}
        runs = [{q: v for q, v in r.items() if q not in aside} for r in runs]
    out = flips(reference, runs, types)
    out["reference"], out["labels"] = labels[0], labels[1:]
    print(f"reference={labels[0]} em={sum(reference.values()) / len(reference):.3f} "
          f"questions={out['questions']}")
    for label, row in zip(labels[1:], out["evaluations"]):
        kinds = " ".join(f"gained_{t}={row['gained_by_type'].get(t, 0)} "
                         f"lost_{t}={row['lost_by_type'].get(t, 0)}" for t in out["by_type"])
        print(f"{label}: em={row['em']:.3f} gained={row['gained']} lost={row['lost']} {kinds}")
    for t, f in out["by_type"].items():
        print(f"total_{t}: questions={f['questions']} gained={f['gained']} lost={f['lost']} "
              f"right_once={f['right_once']} right_always={f['right_always']}")
    rows = out["evaluations"]
    more_lost = sum(r["lost"] > r["gained"] for r in rows)
    if args.out is not None:
        args.out.write_text(json.dumps(out, indent=1, sort_keys=True))
    print(f"probe_flips: {len(rows)} evaluations of {out['questions']} questions against "
          f"{labels[0]}: gained {min(r['gained'] for r in rows)}-{max(r['gained'] for r in rows)}, "
          f"lost {min(r['lost'] for r in rows)}-{max(r['lost'] for r in rows)} each; "
          f"{more_lost} of {len(rows)} lose more than they gain; right at least once "
          f"{out['right_once']}, every time {out['right_always']}")


if __name__ == "__main__":
    main()
