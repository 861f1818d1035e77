"""Two arms' kept runs read probe by probe: at each dev probe both arms kept (`step-3`,
`step-6`, ..., `final`), each seed's EM, the arms paired seed by seed and each against the
start (the process bench's two-level bootstrap, as `bench/pair_records.py` pairs the final
evaluation), what each question kind did (EM, searches, the share answered after at most one
search, the lookups the policy planned), and the bridges split by the searches they made
against the hops they need; and, where a run kept its training steps' episodes
(`bench/pack_run.py` packs them), what the training reward told each search count.

    .venv/bin/python bench/probe_records.py \\
        --questions bench/records/demo-dev/dev-questions.jsonl \\
        --arm hops_kl bench/records/demo-dev/hopskl9/hops-kl-s*.tar.gz \\
        --base outcome bench/records/demo-dev/steps9/records.tar.gz \\
                       bench/records/demo-dev/steps9-seeds/outcome-s*.tar.gz

A run is a kept archive (or the folder it unpacks to): its `result.json` names its seed
and method; each evaluation `eval-LABEL/` keeps `answers.json` (each question's answer,
searches and planned lookups) and its `metrics.json`, the final one its `per_question.json`
too (a run that ended on a probe's step kept that probe as its final: `final` is the
evaluation its `result.json` reports), and `start-eval-dev/` is the start's. A probe keeps
no per-question EM, so every EM here is scored again from the answers against `--questions`
(the evaluated questions with their golds and kinds); where an evaluation kept its
per-question EM, the two must agree.
Prints key=value lines, the last a summary.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pack_run import ARCHIVES, KeptRun  # noqa: E402
from pair_records import common_start  # noqa: E402
from process_ablation import QuestionMismatch, _paired, paired_line  # noqa: E402

START = "start"
TEST = "test"   # a run's evaluation on the test questions (eval-test), not a dev probe
EVAL = re.compile(r"eval-(.+)/(answers|per_question)\.json")
ROLLOUTS = re.compile(r"rollouts-step-(\d+)/answers\.json")


def _label_order(label: str) -> tuple[int, int]:
    """step-N in order of N, then final (an older archive's eval-dev is its final), then
    test."""
    m = re.fullmatch(r"step-(\d+)", label)
    return (0, int(m.group(1))) if m else (2, 0) if label == TEST else (1, 0)


def _members(path: Path) -> dict[str, bytes]:
    """The JSON files of a kept run, by their name inside it."""
    if not path.is_dir() and not (path.name.endswith(ARCHIVES) and path.is_file()):
        raise SystemExit(f"{path}: expected a kept run (a .tar.gz, or the folder it unpacks to)")
    kept = KeptRun(path)
    return {name: kept.read(name) for name in kept.names(".json")}


class Run:
    """One kept run: its seed and method, and per evaluation its answers and, where kept,
    its per-question EM."""

    def __init__(self, path: Path):
        files = _members(path)
        self.path = path
        if "result.json" not in files:
            raise SystemExit(f"{path}: it holds no result.json")
        result = json.loads(files["result.json"])
        if result.get("seed") is None:
            raise SystemExit(f"{path}: its result.json names no seed")
        self.seed, self.method = int(result["seed"]), result.get("method")
        self.answers: dict[str, list[dict]] = {}
        self.kept_em: dict[str, dict[str, float]] = {}
        self.rollouts: dict[int, list[dict]] = {}   # training step: its episodes, if kept
        for name, data in files.items():
            if m := ROLLOUTS.fullmatch(name):
                self.rollouts[int(m.group(1))] = json.loads(data)
                continue
            if name.startswith("start-eval-dev/"):
                label = START
            elif m := EVAL.fullmatch(name):
                label = "final" if m.group(1) == "dev" else m.group(1)
            else:
                continue
            obj = json.loads(data)
            if name.endswith("answers.json"):
                self.answers[label] = obj
            elif name.endswith("per_question.json"):
                self.kept_em[label] = obj
        # the run's reported evaluation: its own eval-final, else the probe it took (a run
        # ending on a probe's step is not evaluated twice), checked against its result (a
        # run judged by its best probe reports that probe's answers, not its last policy's)
        if result.get("taken", "final") == "final":
            taken = result.get("taken_step")
            if "final" not in self.answers and f"step-{taken}" in self.answers:
                self.answers["final"] = self.answers[f"step-{taken}"]
            if "final" in self.answers and result.get("per_question") is not None:
                self.kept_em["final"] = result["per_question"]


def read_questions(path: Path) -> dict[str, dict]:
    """{id: {golds, type, hops}} from a QA JSONL file."""
    from seekrl.data.qa import read_qa_jsonl

    return {q.id: {"golds": list(q.golden_answers), "type": q.metadata.get("type", "-"),
                   "hops": q.metadata.get("hops")} for q in read_qa_jsonl(path)}


def scored(run: Run, label: str, questions: dict[str, dict]) -> list[dict]:
    """An evaluation's answers with each one's EM, kind and hops; checked against the EM
    the evaluation kept, if it kept one."""
    from seekrl.rewards.metrics import exact_match

    rows = []
    for n, a in enumerate(run.answers[label]):
        q = questions.get(a.get("id"))
        if q is None:
            raise SystemExit(f"{run.path}: eval {label} answer {n} is question "
                             f"{a.get('id')!r}, which --questions does not hold")
        rows.append({**a, "em": exact_match(a.get("answer"), q["golds"]), "type": q["type"],
                     "hops": q["hops"]})
    kept = run.kept_em.get(label)
    if kept is not None:
        ours = per_question(rows)
        wrong = sorted(k for k in set(kept) | set(ours) if kept.get(k) != ours.get(k))
        if wrong:
            raise SystemExit(f"{run.path}: eval {label} kept an EM the answers do not give "
                             f"for {len(wrong)} question(s), e.g. {wrong[0]!r} (kept "
                             f"{kept.get(wrong[0])}, scored {ours.get(wrong[0])}): are these "
                             "the questions it was evaluated on?")
    return rows


def per_question(rows: list[dict]) -> dict[str, float]:
    ems: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        ems[r["id"]].append(r["em"])
    return {k: sum(v) / len(v) for k, v in ems.items()}


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def kinds_line(name: str, label: str, evaluations: list[list[dict]]) -> str:
    """What each question kind did in these evaluations (one a seed), over all their
    answers: EM, searches, the share answered after at most one search, planned lookups."""
    rows = [r for ev in evaluations for r in ev]
    parts = [f"kinds arm={name} probe={label} seeds={len(evaluations)}"]
    for kind in sorted({r["type"] for r in rows}):
        of = [r for r in rows if r["type"] == kind]
        planned = _mean([r["planned"] for r in of if r.get("planned") is not None])
        parts.append(f"{kind}_em={_mean([r['em'] for r in of]):.3f} "
                     f"{kind}_searches={_mean([r['searches'] for r in of]):.2f} "
                     f"{kind}_one_search={_mean([float(r['searches'] <= 1) for r in of]):.2f}"
                     + (f" {kind}_planned={planned:.2f}" if planned is not None else ""))
    parts.append(f"answered={_mean([float(r.get('finish') == 'answer') for r in rows]):.3f}")
    return " ".join(parts)


def bridges_line(name: str, label: str, evaluations: list[list[dict]]) -> str:
    """The bridges by their searches against their hops (fewer, as many, more): each cell's
    share of the bridges and its EM, over all the evaluations' answers."""
    rows = [r for ev in evaluations for r in ev if r["type"] == "bridge" and r["hops"]]
    cells: dict[tuple[int, str], list[float]] = defaultdict(list)
    for r in rows:
        n, h = r["searches"], int(r["hops"])
        cells[(h, "fewer" if n < h else "as_many" if n == h else "more")].append(r["em"])
    parts = [f"bridges arm={name} probe={label} seeds={len(evaluations)}"]
    for (h, how), ems in sorted(cells.items()):
        parts.append(f"h{h}_{how}_share={len(ems) / len(rows):.2f} "
                     f"h{h}_{how}_em={_mean(ems):.2f}")
    return " ".join(parts)


def _cell(kind: str, hops, searches: int) -> str | None:
    """Where an episode's lookups stand against its question's hops: `h2_fewer`, ... for a
    bridge or a single-hop question, `c2_fewer`, ... for a comparison (its hops: the
    documents both sides need)."""
    if not hops:
        return None
    h = int(hops)
    return f"{'c' if kind == 'comparison' else 'h'}{h}_" + (
        "fewer" if searches < h else "as_many" if searches == h else "more")


def push_line(name: str, runs: list[Run], questions: dict[str, dict]) -> str | None:
    """What the training reward told each search count, from the steps' kept episodes: per
    cell (a question's searches against its hops, comparisons apart) the episodes' share
    and their mean reward less their group's mean (the group-relative advantage's sign and
    size before the spread's scaling), pooled over steps and seeds. None when no
    run kept its steps' episodes (`log.save_rollouts`)."""
    cells: dict[str, list[float]] = defaultdict(list)
    steps = set()
    for run in runs:
        for step, episodes in run.rollouts.items():
            steps.add(step)
            # the step's groups: by the group packed with each episode (a question a
            # refill drew twice in one step is two groups), else by question (records
            # packed before the group was, which pool such a question's two)
            groups: dict[str, list[dict]] = defaultdict(list)
            for e in episodes:
                groups[e.get("group") or e["id"]].append(e)
            for qid, group in groups.items():
                rewards = [e.get("reward") for e in group]
                # the kind packed with a training episode, else the evaluated question's
                q = {"type": group[0]["type"], "hops": group[0].get("hops")} \
                    if group[0].get("type") is not None else questions.get(qid)
                if q is None or len(group) < 2 or None in rewards:
                    continue
                mean = sum(rewards) / len(rewards)
                for e, r in zip(group, rewards):
                    cell = _cell(q["type"], q["hops"], e["searches"])
                    if cell is not None:
                        cells[cell].append(r - mean)
    if not cells:
        return None
    total = sum(len(v) for v in cells.values())
    return (f"push arm={name} seeds={sum(bool(r.rollouts) for r in runs)} "
            f"steps={min(steps)}-{max(steps)} episodes={total} "
            + " ".join(f"{c}_share={len(v) / total:.2f} {c}_adv={_mean(v):+.3f}"
                       for c, v in sorted(cells.items())))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", type=Path, required=True,
                    help="the evaluated questions (QA JSONL with golds and metadata.type/hops)")
    ap.add_argument("--arm", nargs="+", required=True, metavar=("NAME", "RUN"),
                    help="the arm's name, then its kept runs (one a seed)")
    ap.add_argument("--base", nargs="+", required=True, metavar=("NAME", "RUN"),
                    help="the arm it is compared with: its name, then its kept runs")
    ap.add_argument("--test-questions", type=Path, default=None,
                    help="the test questions, to read a run's evaluation on them (eval-test: "
                         "a run tested once); without it that evaluation is left out, and said")
    ap.add_argument("--resamples", type=int, default=10_000)
    args = ap.parse_args(argv)
    questions = read_questions(args.questions)
    test_questions = read_questions(args.test_questions) if args.test_questions else None

    arms: dict[str, dict[int, Run]] = {}
    for name, *paths in (args.arm, args.base):
        if not paths:
            raise SystemExit(f"{name}: name its runs after it")
        if name in arms or name == START:
            raise SystemExit(f"{name}: give the two arms different names, neither 'start'")
        arms[name] = {}
        for path in map(Path, paths):
            run = Run(path)
            if run.seed in arms[name]:
                raise SystemExit(f"{path}: a second run of {name} seed {run.seed}")
            first = next(iter(arms[name].values()), run)
            if run.method != first.method:
                raise SystemExit(f"{name}: its runs are of different methods ({run.method!r} "
                                 f"in {path}, {first.method!r} in {first.path}): one arm is "
                                 "one method")
            arms[name][run.seed] = run
    arm, base = arms
    runs = [r for by_seed in arms.values() for r in by_seed.values()]
    kept = {r.path: per_question(scored(r, START, questions)) for r in runs
            if START in r.answers}
    start = common_start(kept)
    start_run = next((r for r in runs if START in r.answers), None)

    labels = sorted({label for r in runs for label in r.answers if label != START},
                    key=_label_order)
    if TEST in labels and test_questions is None:
        labels.remove(TEST)
        print(f"probe={TEST} left out: the runs kept an evaluation on the test questions; "
              "give --test-questions to read it")
    summary = None
    if start_run is not None:
        ev = [scored(start_run, START, questions)]
        print(kinds_line(START, "start", ev))
        print(bridges_line(START, "start", ev))
    for label in labels:
        asked = test_questions if label == TEST else questions
        evals = {name: {s: scored(r, label, asked) for s, r in by_seed.items()
                        if label in r.answers} for name, by_seed in arms.items()}
        per_run = {(name, s): per_question(ev) for name, by in evals.items()
                   for s, ev in by.items()}
        for s in sorted({s for by in evals.values() for s in by}):
            print(f"probe={label} seed={s} "
                  + " ".join(f"em_{name}={_mean(list(per_run[(name, s)].values())):.3f}"
                             for name in arms if (name, s) in per_run))
        try:
            for a, b in ((arm, base), (arm, START), (base, START)):
                if b == START and (start is None or label == TEST):
                    continue   # the start kept is its dev evaluation
                paired = _paired(per_run, a, b, start, args.resamples)
                if paired is not None:
                    print(f"probe={label} " + paired_line(a, b, paired))
                    if (a, b) == (arm, base):
                        summary = (label, paired)
        except QuestionMismatch as err:
            raise SystemExit(f"probe {label}: {err}") from None
        for name, by in evals.items():
            if by:
                print(kinds_line(name, label, list(by.values())))
                print(bridges_line(name, label, list(by.values())))
    for name, by_seed in arms.items():
        line = push_line(name, list(by_seed.values()), questions)
        if line is not None:
            print(line)
    if summary is None:
        raise SystemExit(f"{arm} and {base} share no evaluation of a common seed")
    label, p = summary
    print(f"probe_records: {arm} vs {base} at {label} {p['gain']:+.4f} "
          f"(95% {p['lo']:+.4f}..{p['hi']:+.4f}), seeds {','.join(map(str, p['seeds']))}, "
          f"probes {','.join(labels)}, {p['questions']} questions"
          + ("" if start is not None else "; no start kept"))


if __name__ == "__main__":
    main()
