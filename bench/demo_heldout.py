"""The demo's RL against its SFT warm-up on more test questions than the demo scores.

`seekrl demo` scores its three stages on the first `n_test` (40) questions of its world's
test split, too few for a 3-answer gain to read as more than noise. This script takes the
folders that `seekrl demo --out` wrote, evaluates each one's SFT and RL checkpoints on the
first `--n` questions of the same split (200: all of it) with the demo's own episode
settings and dtype (greedy), and pairs them question by question:

    .venv/bin/python bench/demo_heldout.py /work/runs/demo3/s0 /work/runs/demo3/s1 \\
        /work/runs/demo3/s2 --records bench/records/demo-heldout

Each evaluation goes to RUN/eval_{sft,rl}_n{N}/ and is skipped when already there (a run
stopped midway resumes). Prints the paired RL - SFT gain over all N questions (95% interval
from a bootstrap over seeds, then questions), the same over the questions the demo did not
score (index >= its n_test), EM per stage and per question type, valid format and
searches, how often the first 40 answers agree with the demo's own evaluation, then a
one-line summary. `--records` keeps every answer of each seed's two stages
(`sN_answers.json.gz`: id, sample, answer, gold, type, hops, search turns, finish) and the
figures.

`--samples K` samples each question K times at the rollout's temperature instead (what the
RL objective moves: a question's EM is then the mean of its K samples, sampled pass@1, and
`pass@K` is reported beside it), into RUN/eval_{sft,rl}_n{N}_k{K}/, seeded by the run's
seed so that both stages of a seed draw from the same generator state.

`--against RUN...` pairs each run's SFT warm-up with the warm-up of the demo folder of the
same seed given there (another recipe's start on the same world: its test split must be
the same file), evaluated the same way into that folder:

    .venv/bin/python bench/demo_heldout.py new/s0 new/s1 new/s2 --against old/s0 old/s1 old/s2
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from process_ablation import _paired, _per_question, paired_line  # noqa: E402

STAGES = ("sft", "rl")
BEFORE = "before"   # the --against run's SFT warm-up, under the run's seed


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="folders `seekrl demo --out` wrote")
    ap.add_argument("--n", type=int, default=200, help="the first N test questions")
    ap.add_argument("--records", type=Path, default=None,
                    help="keep per-question answers and the figures here")
    ap.add_argument("--samples", type=int, default=0,
                    help="sample each question K times at the rollout temperature (0: greedy)")
    ap.add_argument("--against", nargs="+", type=Path, default=[],
                    help="demo folders of the same seeds: pair each run's SFT with theirs")
    ap.add_argument("--resamples", type=int, default=10_000)
    return ap


def demo_run(run: Path) -> dict:
    """What a demo folder holds that the evaluation needs, checked: its settings, dtype,
    seed, index, test split and the two checkpoints."""
    need = {"config": run / "demo_config.json", "summary": run / "summary.json",
            "index": run / "index", "test": run / "world" / "test.jsonl",
            "sft": run / "sft" / "final", "rl": run / "rl" / "final"}
    missing = [f"{k} ({p})" for k, p in need.items() if not p.exists()]
    if missing:
        raise SystemExit(f"{run}: not a finished `seekrl demo` folder; missing "
                         + ", ".join(missing))
    cfg = json.loads(need["config"].read_text())
    summary = json.loads(need["summary"].read_text())
    return {**need, "seed": cfg["seed"], "rollout": cfg["rollout"], "n_test": cfg["n_test"],
            "dtype": summary["dtype"]}


def evaluate(run: dict, stage: str, n: int, out: Path, samples: int = 0) -> Path:
    """The stage's checkpoint on the first `n` test questions, as the demo evaluates
    (greedy), or sampled `samples` times a question at the rollout's temperature."""
    from rich.console import Console

    from seekrl.config.schema import EpisodeSettings
    from seekrl.data.qa import read_qa_jsonl, write_qa_jsonl
    from seekrl.recipes.pipeline import evaluate_greedy
    from seekrl.retrieval.index import load_index

    done = out / "metrics.json"
    if done.is_file() and _answered(out) == n:
        return out
    questions = read_qa_jsonl(run["test"])[:n]
    if len(questions) < n:
        raise SystemExit(f"{run['test']}: {len(questions)} questions, fewer than --n {n}")
    out.mkdir(parents=True, exist_ok=True)
    test_file = out.parent / f"test_questions_n{n}.jsonl"
    write_qa_jsonl(test_file, questions)
    episode = EpisodeSettings(**run["rollout"])
    console = Console(stderr=True)
    if not samples:
        evaluate_greedy(str(run[stage]), out, index=load_index(run["index"]),
                        test_file=test_file, episode=episode, n=n, dtype=run["dtype"],
                        console=console)
        return out
    from seekrl.config import EvalConfig
    from seekrl.eval.evaluate import (
        eval_backend,
        eval_rollout_config,
        eval_settings,
        load_eval_data,
    )
    from seekrl.eval.evaluate import evaluate as run_episodes
    from seekrl.models import load_policy
    from seekrl.recipes.setup import set_seed

    set_seed(run["seed"])
    policy, tokenizer = load_policy(str(run[stage]), dtype=run["dtype"])
    policy.eval()
    play = eval_settings(EvalConfig(data=str(test_file), n=n, batch_size=min(n, 64)), episode)
    run_episodes(policy, tokenizer, load_index(run["index"]),
                 load_eval_data([test_file], limit=n),
                 eval_rollout_config(play, n_samples=samples, temperature=play.temperature),
                 out, backend=eval_backend(policy, tokenizer, play),
                 run_info={"model": str(run[stage]), "seed": run["seed"]}, console=console)
    return out


def episode_answers(eval_dir: Path) -> list[dict]:
    """Every episode of an evaluation as a small row (the records keep these, not the
    token ids): id, sample, answer, gold, type, hops, search turns, finish."""
    rows = []
    with open(eval_dir / "trajectories.jsonl", encoding="utf-8") as f:
        for line in f:
            t = json.loads(line)
            meta = t.get("metadata") or {}
            rows.append({"id": t["example_id"], "sample": t.get("sample_index", 0),
                         "answer": t.get("answer"), "gold": t["golden_answers"],
                         "type": meta.get("type"), "hops": meta.get("hops"),
                         "searches": sum(s.get("action") == "search" for s in t["steps"]),
                         "finish": t.get("finish_reason")})
    return rows


def _answered(eval_dir: Path) -> int | None:
    per = _per_question(eval_dir)
    return None if per is None else len(per)


def _types(test: Path, n: int) -> dict[str, str]:
    from seekrl.data.qa import read_qa_jsonl

    return {q.id: (q.metadata or {}).get("type", "?") for q in read_qa_jsonl(test)[:n]}


def _against(runs: list[dict], others: list[Path]) -> dict[int, tuple[dict, Path]]:
    """{seed: (the --against demo folder of that seed, its path)}, each checked to hold a
    finished warm-up on the same test split, played the same way, as the run of its seed."""
    if not others:
        return {}
    by_seed: dict[int, tuple[dict, Path]] = {}
    for folder in others:
        other = demo_run(folder)
        if other["seed"] in by_seed:
            raise SystemExit(f"--against: seed {other['seed']} twice ({by_seed[other['seed']][1]}"
                             f", {folder}): one demo folder a seed")
        by_seed[other["seed"]] = (other, folder)
    seeds = {r["seed"] for r in runs}
    if set(by_seed) != seeds:
        raise SystemExit(f"--against: seeds {sorted(by_seed)}, the runs' are {sorted(seeds)}: "
                         "one folder for each run's seed")
    for run in runs:
        other, folder = by_seed[run["seed"]]
        if run["test"].read_bytes() != other["test"].read_bytes():
            raise SystemExit(f"--against: {other['test']} differs from {run['test']}: the two "
                             "warm-ups would be scored on different questions")
        if other["rollout"] != run["rollout"] or other["dtype"] != run["dtype"]:
            raise SystemExit(f"--against: {folder} plays its episodes with other settings "
                             f"(rollout or dtype) than the run of seed {run['seed']}")
    return by_seed


def main() -> None:
    args = build_parser().parse_args()
    started = time.time()
    runs = [demo_run(r) for r in args.runs]
    seeds = [r["seed"] for r in runs]
    if len(set(seeds)) != len(seeds):
        raise SystemExit(f"the runs' seeds repeat ({seeds}): one demo folder a seed")
    against = _against(runs, args.against)
    per_run: dict[tuple[str, int], dict[str, float]] = {}
    fresh_run: dict[tuple[str, int], dict[str, float]] = {}
    agree = agree_of = 0
    by_type: dict[tuple[str, str], list[float]] = {}
    averages: dict[tuple[str, str], list[float]] = {}
    answers: dict[int, dict[str, list[dict]]] = {}
    for run, folder in zip(runs, args.runs):
        types = _types(run["test"], args.n)
        order = list(types)
        seen = set(order[:run["n_test"]])
        plays = [(stage, run, folder) for stage in STAGES]
        if run["seed"] in against:
            plays.append((BEFORE, *against[run["seed"]]))
        for stage, of, where in plays:
            t0 = time.time()
            name = (f"eval_{'sft' if stage == BEFORE else stage}_n{args.n}"
                    + (f"_k{args.samples}" if args.samples else ""))
            out = evaluate(of, "sft" if stage == BEFORE else stage, args.n, where / name,
                           args.samples)
            per = _per_question(out)
            avg = json.loads((out / "metrics.json").read_text())["average"]
            if args.samples:
                avg = {**avg, "pass_at_k": avg[f"pass@{args.samples}"]}
            for key in ("valid_format", "searches") + (("pass_at_k",) if args.samples else ()):
                averages.setdefault((stage, key), []).append(avg[key])
            print(f"seed={run['seed']} stage={stage} em={sum(per.values()) / len(per):.4f} "
                  f"valid_format={avg['valid_format']:.3f} searches={avg['searches']:.2f} "
                  f"questions={len(per)} seconds={time.time() - t0:.0f}", flush=True)
            per_run[(stage, run["seed"])] = per
            answers.setdefault(run["seed"], {})[
                f"{BEFORE}_{name}" if stage == BEFORE else name] = episode_answers(out)
            fresh_run[(stage, run["seed"])] = {q: v for q, v in per.items() if q not in seen}
            for q, v in per.items():
                by_type.setdefault((stage, types[q]), []).append(v)
            demo = _per_question(folder / f"eval_{stage}")   # the demo's own 40
            if demo and not args.samples and stage != BEFORE:
                agree += sum(demo[q] == per[q] for q in demo if q in per)
                agree_of += sum(q in per for q in demo)
    figures: dict[str, object] = {}
    stages = STAGES + ((BEFORE,) if against else ())
    for stage in stages:
        ems = [sum(per_run[(stage, s)].values()) / len(per_run[(stage, s)]) for s in seeds]
        figures[f"em_{stage}"] = round(sum(ems) / len(ems), 4)
        figures[f"em_{stage}_by_seed"] = "/".join(f"{e:.3f}" for e in ems)
    for (stage, key), values in averages.items():
        figures[f"{key}_{stage}"] = round(sum(values) / len(values), 4)
    for (stage, kind), values in sorted(by_type.items()):
        figures[f"em_{stage}_{kind}"] = round(sum(values) / len(values), 4)
        if stage == STAGES[0]:
            figures[f"n_{kind}"] = len(values)
    paired = _paired(per_run, "rl", "sft", None, resamples=args.resamples)
    fresh = _paired(fresh_run, "rl", "sft", None, resamples=args.resamples)
    warmup = _paired(per_run, "sft", BEFORE, None, resamples=args.resamples) if against else None
    for k, v in figures.items():
        print(f"{k}={v}")
    print(paired_line("rl", "sft", paired))
    if warmup:
        print(paired_line("sft", BEFORE, warmup))
    if fresh:   # None when --n leaves no question the demo did not score
        print(paired_line("rl", "sft", fresh).replace("_rl_vs_sft", "_rl_vs_sft_unscored"))
    print(f"demo_answers_agree={agree}/{agree_of}")
    if args.records:
        args.records.mkdir(parents=True, exist_ok=True)
        tag = f"_k{args.samples}" if args.samples else ""
        for seed, stages in answers.items():
            with gzip.open(args.records / f"s{seed}{tag}_answers.json.gz", "wt") as f:
                json.dump(stages, f)
        (args.records / "figures.json").write_text(json.dumps(
            {"runs": [str(r) for r in args.runs], "n": args.n, "samples": args.samples,
             **figures,
             "paired": paired, "paired_unscored": fresh,
             **({"against": [str(r) for r in args.against], "paired_sft_vs_before": warmup}
                if against else {}),
             "demo_answers_agree": [agree, agree_of]}, indent=1) + "\n")
    print(f"demo_rl_gain={paired['gain']:+.4f} demo_rl_gain_ci={paired['lo']:+.4f}.."
          f"{paired['hi']:+.4f} "
          + (f"unscored_gain={fresh['gain']:+.4f} unscored_ci={fresh['lo']:+.4f}.."
             f"{fresh['hi']:+.4f} " if fresh else "")
          + (f"warmup_gain={warmup['gain']:+.4f} warmup_gain_ci={warmup['lo']:+.4f}.."
             f"{warmup['hi']:+.4f} em_sft_before={figures[f'em_{BEFORE}']} " if warmup else "")
          + f"em_sft={figures['em_sft']} "
          f"em_rl={figures['em_rl']} seeds={len(seeds)} questions={args.n} "
          f"samples={args.samples or 'greedy'} "
          f"minutes={(time.time() - started) / 60:.1f}")


if __name__ == "__main__":
    main()
