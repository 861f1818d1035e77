"""Simulated search on the demo's world: how a simulator's documents compare with the real
index's, and what agents trained on real, simulated and self search do with the real one.
A long run; never in CI.

    .venv/bin/python bench/simulated_search.py --work-dir /tmp/seekrl-sim --stage quality
    .venv/bin/python bench/simulated_search.py --work-dir /tmp/seekrl-sim --stage rl \\
        --sft /tmp/seekrl-process/sft/final --seeds 0,1,2 --steps 10

`quality`: the dev questions' hop queries (`--n-queries`), searched in the real BM25 index
and written by each simulator (the bundled model as it is; `--simulator DIR` a trained one,
e.g. from `seekrl simulator train`) under the useful prompt (with the question and gold
answer) and the noisy one: the share of queries with a document titled as the hop's gold
document, with the gold answer in a document, and with no parsable document.

`rl`: from one SFT checkpoint, per seed, RL with the demo's settings searching the real
index (`real`), a simulator (`simulated`, the noise curriculum 0 -> 0.5) and the policy itself
(`self`), every run evaluated greedily with the real index on the same test questions. The
`real` run's generated rollout tokens are the budget of the other two (the simulator's own
tokens are the environment's and are not counted). Results go to `WORK/...json` and are not
run again; the last line holds `sim_to_real_gap=` (real minus simulated test EM) and
`self_gain=` (self minus real): paired per question over the seeds both ran (the seeds and
the interval given), or the difference of the means where a run kept no per-question
answers, labelled so.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

MODES = ("real", "simulated", "self")


def main() -> None:
    from seekrl.recipes.pipeline import DemoConfig

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/seekrl-sim"))
    ap.add_argument("--stage", choices=("quality", "rl", "report"), default="quality")
    ap.add_argument("--simulator", action="append", default=[],
                    help="a simulator to measure beside the bundled model (repeatable)")
    ap.add_argument("--n-queries", type=int, default=200)
    ap.add_argument("--sft", type=Path, default=None, help="rl: the SFT checkpoint to start from")
    ap.add_argument("--sim-model", default="smollm2-135m", help="rl: the simulated runs' simulator")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--modes", default=",".join(MODES),
                    help="rl: which of real,simulated,self to run (real always sets the budget: "
                         "it runs, or is borrowed, whenever another mode does)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--n-test", type=int, default=200)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max-new-tokens", type=int, default=None,
                    help="rl: the turn limit of rollouts and evaluations (default: the demo's; "
                         "64 for the decide runs `--real-from` borrows)")
    ap.add_argument("--engine", choices=("seekrl", "generate"), default="seekrl",
                    help="quality: the simulator's decoding loop (seekrl's, or model.generate)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="rl: a train-config override for every run (repeatable), e.g. "
                         "rollout.temperature=0.7 optim.lr=1e-5 (the settings of the process "
                         "comparison); the modes' own keys win over it")
    ap.add_argument("--real-from", type=Path, default=None,
                    help="rl: a process_ablation runs folder whose outcome-sSEED runs are this "
                         "bench's real runs (the same start, settings and test questions: the "
                         "configs are compared, and a run that differs is refused)")
    args = ap.parse_args()
    from learning import _world
    from process_ablation import parse_sets

    args.overrides = parse_sets(args.set)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - set(MODES):
        raise SystemExit(f"--modes: expected a comma-separated subset of {','.join(MODES)}, "
                         f"got {args.modes!r}")

    demo = DemoConfig(
        n_test=args.n_test,
        rollout={"max_new_tokens": args.max_new_tokens} if args.max_new_tokens else {})
    started = time.time()
    if args.stage != "report":
        world_dir, index_dir = _world(args.work_dir, demo)
        if args.stage == "quality":
            for name in ["smollm2-135m", *args.simulator]:
                _quality(name, args, demo, world_dir, index_dir)
        else:
            if args.sft is None:
                raise SystemExit("--stage rl needs --sft (the shared SFT checkpoint)")
            for seed in [int(s) for s in args.seeds.split(",")]:
                budget = None
                for mode in MODES:
                    if mode != "real" and mode not in modes:
                        continue
                    r = _rl(mode, seed, budget, args, demo, world_dir, index_dir)
                    if mode == "real":
                        budget = r["rollout_tokens"]
    _report(args.work_dir, started)


def _quality(name: str, args, demo, world_dir: Path, index_dir: Path) -> dict:
    from seekrl.data.qa import read_qa_jsonl
    from seekrl.retrieval.base import split_contents
    from seekrl.retrieval.corpus import iter_corpus
    from seekrl.retrieval.index import load_index
    from seekrl.retrieval.simulated import SimulatedRetriever, simulator_quality

    key = name.replace("/", "_") + ("" if args.engine == "seekrl" else f"-{args.engine}")
    done = args.work_dir / f"quality-{key}.json"
    if done.is_file():   # kept, unless measured with another engine (before `engine`: generate)
        kept = json.loads(done.read_text())
        if kept.get("engine", "generate") == args.engine:
            return kept
    t0 = time.time()
    hops = [(ex, hop) for ex in read_qa_jsonl(world_dir / "dev.jsonl")
            for hop in ex.metadata.get("chain") or []][:args.n_queries]
    titles = {doc_id: split_contents(contents)[0]
              for doc_id, contents in iter_corpus(world_dir / "corpus.jsonl")}
    real = load_index(index_dir)
    queries = [hop["query"] for _, hop in hops]
    real_hits = real.search(queries, demo.rollout.topk)
    gold_titles = [[titles[hop["doc_id"]]] for _, hop in hops]
    answers = [[hop["answer"]] for _, hop in hops]
    from seekrl.agent.backends import text_decoder

    sim = SimulatedRetriever.from_pretrained(
        name, dtype=args.dtype, max_new_tokens=160, temperature=0.0, batch_size=16,
        make_decoder=text_decoder if args.engine == "seekrl" else None)
    result = {"simulator": name, "engine": sim.engine, "queries": len(hops)}
    for kind, noise in (("useful", 0.0), ("noisy", 1.0)):
        sim.set_noise(noise)
        sim.stats.clear()
        got = sim.search_with_context(queries, demo.rollout.topk, [ex.question for ex, _ in hops],
                                      [hop["answer"] for _, hop in hops])
        q = simulator_quality(got, real_hits, gold_titles, answers)
        result[kind] = {**q, "malformed": sim.stats["malformed"] / max(1, len(hops))}
    result["minutes"] = round((time.time() - t0) / 60, 2)
    done.write_text(json.dumps(result, indent=1))
    print(f"quality {name}: useful answer_contained {result['useful']['sim_answer_contained']:.3f}"
          f" (real {result['useful']['real_answer_contained']:.3f}), noisy "
          f"{result['noisy']['sim_answer_contained']:.3f} ({result['minutes']:.1f} min)",
          flush=True)
    return result


def _rl(mode: str, seed: int, budget: int | None, args, demo, world_dir: Path,
        index_dir: Path) -> dict:
    from process_ablation import _per_question, evaluate_as_trained

    from seekrl.config import TrainConfig, with_keys
    from seekrl.data.qa import read_qa_jsonl, write_qa_jsonl
    from seekrl.recipes.pipeline import rl_config
    from seekrl.recipes.train import Trainer

    out = args.work_dir / "runs" / f"{mode}-s{seed}"
    done = out / "result.json"
    if done.is_file():
        return json.loads(done.read_text())
    t0 = time.time()
    test_file = args.work_dir / "test_questions.jsonl"
    if not test_file.is_file():
        write_qa_jsonl(test_file, read_qa_jsonl(world_dir / "test.jsonl")[:args.n_test])
    # the demo's RL stage (src/seekrl/presets/demo/rl.yaml) with the bench's settings, `--set`, the mode
    overrides = getattr(args, "overrides", {})
    rl = {"steps": args.steps, "dtype": args.dtype, "save_every": 1, "keep_last": 1,
          "log": {"save_rollouts": 0}, "algo": {"advantage": "dr_grpo"}}
    run = demo.model_copy(update={"seed": seed, "rl": with_keys(rl, overrides, TrainConfig,
                                                                where="--set")})
    mode_keys = {"simulated": {"simulator": {"model": args.sim_model, "noise_start": 0.0,
                                             "noise_end": 0.5}},
                 "self": {"rollout.self_search": True}}.get(mode, {})
    cfg = rl_config(run, model=str(args.sft), train_file=world_dir / "train.jsonl",
                    index_dir=index_dir, out=out, keys=mode_keys, budget_tokens=budget)
    if mode == "real" and getattr(args, "real_from", None) is not None:
        return _borrowed(args.real_from / f"outcome-s{seed}", cfg, done, args.n_test)
    resume = (out / "checkpoints" / "latest").is_file()
    if not resume:   # an evaluation left in the folder is an earlier policy's
        shutil.rmtree(out / "eval-test", ignore_errors=True)
    summary = Trainer(cfg, resume=resume, overwrite=not resume).train()
    # under the run's own ranker and episode settings, as the borrowed real run was
    final = evaluate_as_trained(cfg, Path(summary["final"]), out / "eval-test", index_dir,
                                test_file, demo,
                                argparse.Namespace(n_test=args.n_test, eval_batch=64,
                                                   device="cpu", dtype=args.dtype))
    avg = final["average"]
    by_type = {k: v["em"] for k, v in next(iter(final["by_type"].values()), {}).items()}
    result = {"mode": mode, "seed": seed, "em": avg["em"], "searches": avg["searches"],
              "valid_format": avg["valid_format"], "em_by_type": by_type,
              "steps": summary["steps"], "rollout_tokens": summary["rollout_tokens"],
              "simulator_tokens": summary.get("simulator_tokens"),   # outside the budget
              "budget": budget, "budget_met": summary.get("budget_met", True),
              "overrides": overrides, "minutes": round((time.time() - t0) / 60, 2),
              # what the paired report needs and what `same_setting` compares, kept in the
              # result so a finished run survives its folder (bench/records/)
              "per_question": _per_question(out / "eval-test"),
              "config": cfg.model_dump(mode="json")}
    done.write_text(json.dumps(result, indent=1))
    print(f"{mode} seed {seed}: EM {avg['em']:.3f} searches {avg['searches']:.2f}", flush=True)
    return result


def _borrowed(run: Path, cfg, done: Path, n_test: int) -> dict:
    """The real-search run of a seed taken from a process_ablation outcome-only run, when
    that run trained with this config (`process_ablation.same_setting`: every key but the
    run's own folder and length, which its token budget set) and was evaluated on the same
    test questions; kept as this bench's result."""
    path = run / "result.json"
    if not path.is_file():
        raise SystemExit(f"--real-from: {path} is missing (run that outcome seed first)")
    from process_ablation import same_setting

    theirs = json.loads(path.read_text())
    if not theirs.get("config"):
        raise SystemExit(f"--real-from: {path} keeps no config to compare with this run's")
    on, asked = theirs.get("evaluated_on", "test"), theirs.get("per_question")
    if on != "test" or (asked is not None and len(asked) != n_test):
        raise SystemExit(f"--real-from: {path} was evaluated on "
                         f"{len(asked) if asked is not None else '?'} {on} questions; this "
                         f"bench compares on the first {n_test} test questions (--n-test)")
    # every key the same but the run's own (out, ...) and keys added since at their default
    same_setting(cfg, path, flag="--real-from")
    result = {"mode": "real", "seed": theirs["seed"], "em": theirs["em"],
              "searches": theirs["searches"], "valid_format": theirs["valid_format"],
              "em_by_type": theirs["em_by_type"], "steps": theirs["steps"],
              "rollout_tokens": theirs["rollout_tokens"], "budget": None,
              "budget_met": theirs.get("budget_met", True), "from": str(run),
              "minutes": theirs.get("minutes"), "per_question": asked}
    done.parent.mkdir(parents=True, exist_ok=True)
    done.write_text(json.dumps(result, indent=1))
    print(f"real seed {theirs['seed']}: EM {result['em']:.3f} (from {run})", flush=True)
    return result


def _report(work: Path, started: float) -> None:
    for path in sorted(work.glob("quality-*.json")):
        q = json.loads(path.read_text())
        for kind in ("useful", "noisy"):
            row = q[kind]
            print(f"quality_{q['simulator'].replace('/', '_')}_{kind}: "
                  f"sim_answer_contained={row['sim_answer_contained']:.3f} "
                  f"sim_gold_title_hit={row['sim_gold_title_hit']:.3f} "
                  f"sim_empty={row['sim_empty']:.3f} malformed={row['malformed']:.3f} "
                  f"real_answer_contained={row['real_answer_contained']:.3f} "
                  f"real_gold_title_hit={row['real_gold_title_hit']:.3f} queries={row['queries']}")
    # only MODE-sSEED folders: a work folder shared with process_ablation has others, and a
    # run kept aside under another name (simulated-s0-flat) is not one of this bench's
    runs = [r for r, p in ((json.loads(p.read_text()), p)
                           for p in sorted(work.glob("runs/*/result.json")))
            if r.get("mode") in MODES and p.parent.name == f"{r['mode']}-s{r.get('seed')}"]
    ems: dict[str, list[float]] = {}
    by_mode: dict[str, list[dict]] = {}
    for r in runs:
        ems.setdefault(r["mode"], []).append(r["em"])
        by_mode.setdefault(r["mode"], []).append(r)
    for mode, values in ems.items():
        sd = statistics.stdev(values) if len(values) > 1 else float("nan")   # n - 1
        rows = by_mode[mode]
        types = sorted({t for r in rows for t in r.get("em_by_type") or {}})
        extra = "".join(
            f" {name}_{mode}={statistics.mean(r[key] for r in rows):.{digits}f}"
            for key, name, digits in (("valid_format", "valid", 3), ("searches", "searches", 3),
                                      ("rollout_tokens", "tokens", 0),
                                      ("simulator_tokens", "simulator_tokens", 0))
            if all(r.get(key) is not None for r in rows))
        extra += "".join(   # a type's mean over the runs that had questions of it
            f" em_{mode}_{t}="
            f"{statistics.mean(r['em_by_type'][t] for r in rows if t in r['em_by_type']):.3f}"
            for t in types if all(r.get("em_by_type") for r in rows))
        missed = [r["seed"] for r in rows if r.get("budget_met") is False]
        print(f"em_{mode}={statistics.mean(values):.4f} em_std_{mode}={sd:.4f} "
              f"seeds_{mode}={len(values)}{extra}"
              + (f" budget_missed_seeds_{mode}={','.join(map(str, missed))}" if missed else ""))
    found = _report_paired(work, runs)
    from process_ablation import _headline

    def _gain(a: str, b: str) -> str:   # paired over the seeds both have, else the means
        return _headline(found.get((a, b)), statistics.mean(ems[a]) - statistics.mean(ems[b])
                         if ems.get(a) and ems.get(b) else float("nan"))

    # the gap is real - simulated (what simulated training costs); self_gain is self - real
    print(f"simulated_search: {len(list(work.glob('quality-*.json')))} simulators measured, "
          f"{len(runs)} RL runs; sim_to_real_gap={_gain('real', 'simulated')} "
          f"self_gain={_gain('self', 'real')} "
          f"({(time.time() - started) / 60:.0f} min this run)")


def _report_paired(work: Path, runs: list[dict]) -> dict:
    """Each mode against each other on the same test questions, seed by seed (the paired
    bootstrap of process_ablation, over seeds, then questions); a borrowed real run's
    answers are read where it ran (`from`)."""
    from process_ablation import QuestionMismatch, _paired, _per_question, paired_line

    per_run = {}
    for r in runs:
        folder = Path(r["from"]) if r.get("from") else work / "runs" / f"{r['mode']}-s{r['seed']}"
        per_run[(r["mode"], r["seed"])] = r.get("per_question") or _per_question(
            folder / "eval-test")
    found = {}
    # the last pair is the sim-to-real gap's sign (real - simulated), for the summary only
    for a, b in (("simulated", "real"), ("self", "real"), ("simulated", "self"),
                 ("real", "simulated")):
        shown = (a, b) != ("real", "simulated")   # its mirror already printed the pair
        try:
            paired = _paired(per_run, a, b, None)
        except QuestionMismatch as e:
            if shown:
                print(f"paired_{a}_vs_{b}=refused ({e})")
            continue
        if paired is not None:
            found[(a, b)] = paired
            if shown:
                print(paired_line(a, b, paired))
    return found


if __name__ == "__main__":
    main()
