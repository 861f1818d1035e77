"""How an agent reads the synthetic world's comparison questions, from evaluations already
run: whether it lists the values it compares right (its last thought's "Comparing: A: 1949;
B: 1984", against the question's `metadata.judgement`) and whether its answer follows them.

Two kinds: *ordering* questions (which is oldest, newest, largest: the answer is one of 2-3
names, chance 1/options) and *same* questions (were A and B born in the same city: yes or
no). An agent that lists every value right and still answers at chance does not compare;
one that says yes (or no) to every same question scores the golds' share of that answer.

    .venv/bin/python bench/answer_reading.py --questions W/world/dev.jsonl \\
        W/long200w/recall_cost-s0/eval          # a run's probes; or records' eval-* folders

Each EVAL is an evaluation folder (metrics.json beside episodes.jsonl or episodes.jsonl.gz)
or a folder of them (`eval/step-N`, `eval-*`), read in step order; each question's first
sample is read (a greedy probe has one), its answer parsed and scored as the evaluation
does. Prints `key=value` figures per evaluation (`n/a` where it has no question of a
kind), the last line a summary; `--out FILE` writes them as JSON.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
from pathlib import Path

from seekrl.agent.protocol import parse_action
from seekrl.eval.evaluate import yes_no
from seekrl.rewards.metrics import exact_match, normalize_answer

ORDERING = frozenset({"birth_year", "founded_year", "release_year", "population"})
_LISTED = re.compile(r"Comparing:\s*(.*?)\.\s*So the answer", re.S)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("evals", nargs="+", type=Path, help="evaluation folders, or folders of them")
    ap.add_argument("--questions", required=True, action="append", type=Path,
                    help="the world's question file(s) the evaluations asked (repeatable)")
    ap.add_argument("--out", type=Path, default=None, help="the figures as JSON")
    return ap


def _step(folder: Path) -> tuple[int, str]:
    m = re.search(r"step-(\d+)$", folder.name)
    return (int(m.group(1)) if m else (-1 if folder.name.endswith("start") else 1 << 30),
            folder.name)


def eval_folders(paths: list[Path]) -> list[Path]:
    """The evaluation folders under `paths`, each path's in step order (start first); one
    folder named twice is refused."""
    out = []
    for path in paths:
        if (path / "metrics.json").is_file():
            out.append(path)
            continue
        found = [d for d in path.iterdir() if d.is_dir() and (d / "metrics.json").is_file()] \
            if path.is_dir() else []
        if not found:
            raise SystemExit(f"{path}: no evaluation here (a folder with metrics.json, or "
                             "folders of them)")
        out += sorted(found, key=_step)
    seen = [f.resolve() for f in out]
    twice = next((f for i, f in enumerate(seen) if f in seen[:i]), None)
    if twice is not None:
        raise SystemExit(f"{twice}: given twice")
    return out


def names(folders: list[Path]) -> list[str]:
    """Each folder by its path below the folder above them all: `eval/step-5` for one
    run's probes, `A/eval/step-5` and `B/eval/step-5` for two runs'."""
    full = [f.resolve() for f in folders]
    above = Path(os.path.commonpath([f.parent for f in full])).parent
    return [str(f.relative_to(above)) for f in full]


def read_episodes(folder: Path) -> list[dict]:
    for name, opener in (("episodes.jsonl", open), ("episodes.jsonl.gz", gzip.open)):
        path = folder / name
        if path.is_file():
            with opener(path, "rt") as f:
                rows = []
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise SystemExit(f"{path}:{n}: not a JSON episode ({e})") from None
                return rows
    raise SystemExit(f"{folder}: no episodes.jsonl(.gz): the evaluation kept no episodes")


def read_questions(paths: list[Path]) -> dict[str, dict]:
    out = {}
    for path in paths:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                q = json.loads(line)
                out[q["id"]] = q
            except (json.JSONDecodeError, KeyError, TypeError):
                raise SystemExit(f"{path}:{n}: expected a question with an id") from None
    return out


def last_thought(episode: dict) -> str:
    turns = [s["text"] for s in episode.get("segments", []) if s.get("kind") == "generated"]
    return turns[-1] if turns else ""


def _answer(text: str) -> str | None:
    action = parse_action(text)
    return action.text if action.kind == "answer" else None


def reading(episodes: list[dict], questions: dict[str, dict]) -> dict[str, float | int | None]:
    """The figures of one evaluation, from each question's first sample."""
    kinds = {"ordering": [], "same": []}
    for ep in episodes:
        if ep.get("sample_index", 0) != 0:
            continue
        q = questions.get(ep["example_id"])
        if q is None:
            raise SystemExit(f"question {ep['example_id']!r} is in no --questions file")
        meta = q.get("metadata") or {}
        if meta.get("type") != "comparison" or not meta.get("chain"):
            continue
        kind = "ordering" if meta["chain"][0].get("relation") in ORDERING else "same"
        text = last_thought(ep)
        listed = _LISTED.search(text)
        said = _answer(text)
        golds = q["golden_answers"]   # a bare string is one answer to both scorers
        yn = yes_no(said, golds)
        kinds[kind].append({
            "em": exact_match(said, golds), "chance": 1 / int(meta.get("options") or 2),
            "listed_right": float(listed is not None and "judgement" in meta
                                  and normalize_answer(listed.group(1))
                                  == normalize_answer(meta["judgement"])),
            "says_yes": yn[0] if yn else None, "gold_yes": yn[1] if yn else None})

    def mean(rows, key):
        vals = [r[key] for r in rows if r[key] is not None]
        return round(sum(vals) / len(vals), 3) if vals else None

    out: dict[str, float | int | None] = {}
    for kind, rows in kinds.items():
        out[kind] = len(rows)
        out[f"{kind}_em"] = mean(rows, "em")
        out[f"{kind}_listed_right"] = mean(rows, "listed_right")
        right = [r for r in rows if r["listed_right"]]
        out[f"{kind}_em_listed_right"] = mean(right, "em")
    out["ordering_chance"] = mean(kinds["ordering"], "chance")
    out["same_says_yes"] = mean(kinds["same"], "says_yes")
    out["same_gold_yes"] = mean(kinds["same"], "gold_yes")
    return out


def _show(value) -> str:
    return "n/a" if value is None else str(value)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    questions = read_questions(args.questions)
    figures = {}
    folders = eval_folders(args.evals)
    for folder, name in zip(folders, names(folders)):
        row = reading(read_episodes(folder), questions)
        figures[name] = row
        print(f"eval={name} " + " ".join(f"{k}={_show(v)}" for k, v in row.items()))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(figures, indent=1))

    def short(name, r):
        if not r["ordering"] and not r["same"]:
            return f"{name} no comparison questions"
        return (f"{name} ordering {_show(r['ordering_em'])} (chance "
                f"{_show(r['ordering_chance'])}, listed right "
                f"{_show(r['ordering_listed_right'])}), same {_show(r['same_em'])} (says yes "
                f"{_show(r['same_says_yes'])}, gold {_show(r['same_gold_yes'])})")
    print(f"answer_reading ({len(figures)} evaluations): "
          + "; ".join(short(n, r) for n, r in figures.items()))


if __name__ == "__main__":
    main()
