"""The ProRAG pipeline against outcome-only RL and the best step-credit method, at equal
generated tokens, over several seeds; and PRM quality from MCTS labels against MC labels.
A long run; never in CI.

    .venv/bin/python bench/prorag.py --work-dir /tmp/seekrl-prorag --seeds 0,1,2 --n-test 200

Setting: the demo's synthetic world and SFT warm-up (built once, or `--sft DIR`; shared with
`bench/process_ablation.py`). The runs, in this order, so that a run cut short holds the
headline figures:
1. per seed, `prorag-sSEED`: `seekrl prorag` from the SFT checkpoint (MCTS labels -> PRM ->
   RFT -> RL with the PRM's step scores), test EM after each stage. Its compute is the
   generated tokens of all its stages: MCTS simulations, RFT sampling and RL rollouts. Then
   `outcome-sSEED`: outcome-only RL (`--baseline`) from the same SFT checkpoint, stopped at
   the pipeline's total generated tokens (`max_rollout_tokens`). Then `mc-sSEED`:
   Monte-Carlo labels on the same questions at about the same number of simulations, a PRM
   trained on them like the pipeline's, and both PRMs' quality (AUC, pair accuracy,
   first-error localisation) on the held-out questions of each label set.
2. per seed, `STEP-sSEED` (`--step-method`; tree by default, the best test EM of the
   step-credit ablation in bench/RESULTS.md): the pipeline's budget.
3. per seed, `prorag-beta0-sSEED` (unless `--skip-beta0`): the pipeline's RL stage again
   from its refined policy with the same config and seed, but beta = 0 (the PRM's step
   scores weigh nothing, leaving the group-normalised outcome advantage): what the step
   credit itself does, apart from the pipeline spending less of its budget on RL.

`--keep DIR` also writes each finished run's result to `DIR/RUN.json` and takes the runs
found there as done: on a CPU the whole benchmark is longer than one session's machine, and
the next machine goes on from the committed results (same SFT checkpoint, checked by digest).

`--pipeline DIR` takes the first seed's pipeline from a finished `seekrl prorag` run (the
demo-size default builds the same world and SFT checkpoint): its labels, PRM and policies are
reused and evaluated on the bench's questions, which saves its training time on a CPU.

Every policy is evaluated greedily on the same `--n-test` questions. Results are kept per run
(`WORK/runs/NAME/result.json`) and not recomputed. Prints `key=value` figures (mean and std
over seeds) and ends with a one-line summary holding `prorag_gain=` (the pipeline's test EM
minus outcome-only's, at equal generated tokens: paired per question over the seeds both ran,
with its interval, where the runs kept their answers; else the difference of the means).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/seekrl-prorag"))
    ap.add_argument("--sft", type=Path, default=None, help="SFT checkpoint (default: train one)")
    ap.add_argument("--stage", choices=("all", "report"), default="all")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--n-test", type=int, default=200)
    ap.add_argument("--baseline", default="grpo", help="the outcome estimator (the demo's)")
    ap.add_argument("--step-method", default="tree",
                    help="a step-credit method of rl/methods.py ('' to skip)")
    ap.add_argument("--label-questions", type=int, default=None, help="default: the pipeline's")
    ap.add_argument("--simulations", type=int, default=None, help="default: the pipeline's")
    ap.add_argument("--prm-steps", type=int, default=None, help="default: the pipeline's")
    ap.add_argument("--rl-steps", type=int, default=3, help="RL steps of the pipeline")
    ap.add_argument("--skip-mc", action="store_true", help="no MC-label PRM comparison")
    ap.add_argument("--skip-beta0", action="store_true",
                    help="no beta = 0 ablation of the pipeline's RL stage")
    ap.add_argument("--final-only", action="store_true",
                    help="with --pipeline: evaluate its SFT and final policies, not the refined one "
                         "(each evaluation of 200 questions is about 17 minutes on 2 CPU cores)")
    ap.add_argument("--pipeline", type=Path, default=None,
                    help="a finished `seekrl prorag` run on the same world and SFT checkpoint "
                         "(the demo-size default): the first seed reuses its labels, PRM and "
                         "policies and only evaluates them on the bench's test questions")
    ap.add_argument("--eval-batch", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--keep", type=Path, default=None,
                    help="a folder (e.g. bench/prorag_runs in the repo) that also holds each "
                         "finished run's result as RUN.json; runs found there are not redone, "
                         "so a benchmark longer than a machine's life goes on in the next one "
                         "(from the same SFT checkpoint: its weights' digest is checked)")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    started = time.time()
    if args.stage == "all":
        from learning import _setup

        from seekrl.recipes.pipeline import DemoConfig

        demo = DemoConfig(n_test=args.n_test)
        work = args.work_dir
        world_dir, index_dir, test_file, sft = _setup(work, demo, args.n_test, args.sft,
                                                      args.device)
        if args.keep is not None:
            _restore(work, args.keep, sft, _settings(args))
        # the headline first (each seed's pipeline and its outcome-only run at the same
        # budget, and the MC-label PRM beside the pipeline's while its labels are on this
        # machine), then the step-credit method: a run cut short holds the main figures
        budgets = {}
        for seed in seeds:
            budgets[seed] = _pipeline(seed, args, sft, world_dir, index_dir,
                                      test_file)["generated_tokens"]
            _keep(work, args.keep)
            _baseline_run("outcome", seed, budgets[seed], args, demo, sft, world_dir,
                          index_dir, test_file)
            _keep(work, args.keep)
            if not args.skip_mc:
                _mc_comparison(seed, args)
                _keep(work, args.keep)
        for seed in seeds if args.step_method else ():
            _baseline_run(args.step_method, seed, budgets[seed], args, demo, sft, world_dir,
                          index_dir, test_file)
            _keep(work, args.keep)
        for seed in seeds if not args.skip_beta0 else ():
            _beta0_run(seed, args, demo, index_dir, test_file)
            _keep(work, args.keep)
    _report(args.work_dir, started, args.step_method)


def _digest(model_dir: Path) -> str:
    """sha256 over a checkpoint's weight files: the runs of one benchmark share a start."""
    import hashlib

    h = hashlib.sha256()
    files = sorted(model_dir.glob("*.safetensors")) or sorted(model_dir.glob("*.bin"))
    if not files:
        raise SystemExit(f"{model_dir}: no weight files (*.safetensors, *.bin)")
    for f in files:
        with f.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 24), b""):
                h.update(block)
    return h.hexdigest()


def _settings(args) -> dict:
    """What must be the same for runs to be compared (kept runs included)."""
    return {"n_test": args.n_test, "rl_steps": args.rl_steps, "baseline": args.baseline,
            "label_questions": args.label_questions, "simulations": args.simulations,
            "prm_steps": args.prm_steps}


def _restore(work: Path, keep: Path, sft: Path, settings: dict) -> None:
    """Put the runs kept in `keep` (RUN.json) back under `work/runs/RUN/result.json`, where
    the runners find them and do not redo them; refuse when they started from another SFT
    checkpoint than `sft`, or with other settings."""
    digest = _digest(sft)
    mark = keep / "sft.json"
    if mark.is_file():
        kept = json.loads(mark.read_text())
        if kept.get("sha256") != digest:
            raise SystemExit(
                f"--keep {keep}: its runs started from an SFT checkpoint with weights "
                f"sha256 {str(kept.get('sha256'))[:16]}..., but {sft} has {digest[:16]}...: "
                f"they are not comparable with new runs; pass that checkpoint with --sft, or "
                f"another --keep folder")
        differ = sorted(k for k, v in settings.items()
                        if k in kept.get("settings", {}) and kept["settings"][k] != v)
        if differ:
            raise SystemExit(f"--keep {keep}: its runs used other settings ("
                             + ", ".join(f"{k} {kept['settings'][k]} here {settings[k]}"
                                         for k in differ) + "); use them, or another --keep")
    else:
        keep.mkdir(parents=True, exist_ok=True)
        mark.write_text(json.dumps({"sha256": digest, "sft": str(sft), "settings": settings},
                                   indent=1) + "\n")
    for path in sorted(keep.glob("*.json")):
        if path.name == "sft.json":
            continue
        target = work / "runs" / path.stem / "result.json"
        if not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(path.read_text())
            print(f"{path.stem}: kept in {path}", flush=True)


def _keep(work: Path, keep: Path | None) -> None:
    """Copy every finished run's result.json into `keep` as RUN.json."""
    if keep is None:
        return
    keep.mkdir(parents=True, exist_ok=True)
    for path in sorted(work.glob("runs/*/result.json")):
        target = keep / f"{path.parent.name}.json"
        if not target.is_file() or target.read_text() != path.read_text():
            tmp = target.with_suffix(".tmp")
            tmp.write_text(path.read_text())
            tmp.replace(target)


def _pipeline_dir(args, seed: int) -> Path:
    if args.pipeline is not None and seed == int(json.loads(
            (args.pipeline / "pipeline.json").read_text())["config"]["seed"]):
        return args.pipeline
    return args.work_dir / "runs" / f"prorag-s{seed}"


def _pipeline(seed: int, args, sft: Path, world_dir: Path, index_dir: Path, test_file: Path
              ) -> dict:
    from seekrl.config import ProragConfig
    from seekrl.prorag import run_prorag

    done = args.work_dir / "runs" / f"prorag-s{seed}" / "result.json"
    if done.is_file():
        return json.loads(done.read_text())
    done.parent.mkdir(parents=True, exist_ok=True)
    if _pipeline_dir(args, seed) != done.parent:
        return _reuse_pipeline(seed, args, index_dir, test_file, done)
    out = done.parent
    t0 = time.time()
    labels: dict = {"device": args.device}
    if args.label_questions:
        labels["questions"] = args.label_questions
    if args.simulations:
        labels["search"] = {"simulations": args.simulations}
    prm = {"device": args.device} | ({"steps": args.prm_steps} if args.prm_steps else {})
    # the SFT checkpoint is every seed's and greedy evaluation is deterministic: once is enough
    sft_em = _sft_em(args.work_dir)
    cfg = ProragConfig(out=str(out), seed=seed, sft_model=str(sft),
                       train=str(world_dir / "train.jsonl"), test=str(test_file),
                       index=str(index_dir), n_test=args.n_test, labels=labels, prm=prm,
                       refine={"device": args.device},
                       rl={"steps": args.rl_steps, "device": args.device},
                       evaluate=["refine", "rl"] if sft_em is not None else
                       ["sft", "refine", "rl"])
    s = run_prorag(cfg, resume=(out / "pipeline.json").is_file())
    if s["em_sft"] is None:
        s["em_sft"] = sft_em
    result = {"method": "prorag", "seed": seed, "em_sft": s["em_sft"], "em_refine": s["em_refine"],
              "em": s["em_rl"], "f1": s["f1_rl"], "searches": s["searches_rl"],
              "generated_tokens": s["generated_tokens"]["total"],
              "tokens_by_stage": s["generated_tokens"], "prm_dev": s["prm_dev"],
              "labels": s["labels"], "refine": s["refine"],
              "em_by_type": _by_type(out / "eval_rl"),
              "per_question": _per_question(out / "eval_rl"),   # the paired report's
              "minutes": round((time.time() - t0) / 60, 2), "device": args.device}
    done.write_text(json.dumps(result, indent=1))
    print(f"prorag seed {seed}: EM sft {s['em_sft']:.3f} -> refine {s['em_refine']:.3f} -> rl "
          f"{s['em_rl']:.3f}, {result['generated_tokens']} generated tokens", flush=True)
    return result


def _sft_em(work: Path) -> float | None:
    """The SFT checkpoint's test EM from a pipeline result already in `work`, if any."""
    for path in sorted(work.glob("runs/prorag-s*/result.json")):
        em = json.loads(path.read_text()).get("em_sft")
        if em is not None:
            return em
    return None


def _reuse_pipeline(seed: int, args, index_dir: Path, test_file: Path, done: Path) -> dict:
    """A finished pipeline's policies evaluated on the bench's test questions."""
    from process_ablation import _evaluate

    from seekrl.recipes.pipeline import DemoConfig

    t0 = time.time()
    stages = json.loads((args.pipeline / "pipeline.json").read_text())["stages"]
    demo = DemoConfig(n_test=args.n_test)
    names = ("sft", "rl") if args.final_only else ("sft", "refine", "rl")
    evals = {name: _evaluate(Path(stages[name]["final"]), done.parent / f"eval-{name}",
                             index_dir, test_file, demo, args) for name in names}
    tokens = {k: stages[k].get("generated_tokens", 0) for k in ("labels", "refine", "rl")}
    avg = evals["rl"]["average"]
    result = {"method": "prorag", "seed": seed, "reused": str(args.pipeline),
              "em_sft": evals["sft"]["average"]["em"],
              "em_refine": evals["refine"]["average"]["em"] if "refine" in evals else None,
              "em": avg["em"], "f1": avg["f1"],
              "searches": avg["searches"], "generated_tokens": sum(tokens.values()),
              "tokens_by_stage": tokens, "prm_dev": stages["prm"].get("dev") or {},
              "labels": {k: stages["labels"].get(k) for k in ("simulations", "pairs")},
              "refine": {k: stages["refine"].get(k) for k in ("sampled", "kept")},
              "em_by_type": _by_type(done.parent / "eval-rl"),
              "per_question": _per_question(done.parent / "eval-rl"),
              "minutes": round((time.time() - t0) / 60, 2), "device": args.device}
    done.write_text(json.dumps(result, indent=1))
    print(f"prorag seed {seed} (reused {args.pipeline}): EM sft {result['em_sft']:.3f} -> "
          f"refine {result['em_refine']} -> rl {result['em']:.3f}, "
          f"{result['generated_tokens']} generated tokens", flush=True)
    return result


def _per_question(eval_dir: Path) -> dict[str, float] | None:
    """{example id: EM} of an evaluation, for the paired report (process_ablation's)."""
    from process_ablation import _per_question as per_question

    return per_question(eval_dir)


def _by_type(run_dir: Path) -> dict:
    metrics = json.loads((run_dir / "metrics.json").read_text())
    return {k: v["em"] for k, v in next(iter(metrics["by_type"].values()), {}).items()}


def _baseline_run(method: str, seed: int, budget: int, args, demo, sft, world_dir, index_dir,
                  test_file) -> dict:
    """An RL run of `rl/methods.py` at `budget` generated tokens (process_ablation's runner)."""
    from process_ablation import _run, build_parser

    ns = build_parser().parse_args([
        "--work-dir", str(args.work_dir), "--baseline", args.baseline,
        "--steps", str(max(1, args.rl_steps)), "--n-test", str(args.n_test),
        "--eval-batch", str(args.eval_batch), "--device", args.device])
    ns.overrides, ns.label_tokens = {}, 0
    return _run(method, seed, budget, ns, demo, sft, world_dir, index_dir, test_file)


def _beta0_run(seed: int, args, demo, index_dir: Path, test_file: Path) -> dict:
    """The pipeline's RL stage with beta = 0, from the same refined policy, config and seed
    (its first batch of rollouts is the pipeline's own); evaluated like the others."""
    from process_ablation import _evaluate

    from seekrl.config import TrainConfig, load_config
    from seekrl.recipes.train import Trainer
    from seekrl.rl import step_metrics as M

    out = args.work_dir / "runs" / f"prorag-beta0-s{seed}"
    done = out / "result.json"
    if done.is_file():
        print(f"prorag-beta0 seed {seed}: already in {done}", flush=True)
        return json.loads(done.read_text())
    pipe = _pipeline_dir(args, seed)
    state = pipe / "pipeline.json"
    stages = json.loads(state.read_text())["stages"] if state.is_file() else {}
    if not all((stages.get(k) or {}).get("final") for k in ("refine", "prm", "rl")):
        print(f"prorag-beta0 seed {seed}: skipped, the pipeline's refined policy and PRM are "
              f"not in {pipe} (it ran on another machine); delete its kept result to run it "
              f"again", flush=True)
        return {}
    t0 = time.time()
    cfg = load_config(TrainConfig, pipe / "rl" / "config.yaml", [
        f"out={out}", "algo.beta=0", f"model={stages['refine']['final']}",
        f"reward.prm={stages['prm']['final']}", f"device={args.device}"])
    shutil.rmtree(out / "eval-test", ignore_errors=True)   # an earlier policy's, if any
    summary = Trainer(cfg, overwrite=True).train()
    # the bench's own arguments carry what the evaluation reads (n_test, eval_batch, device)
    final = _evaluate(Path(summary["final"]), out / "eval-test", index_dir, test_file, demo,
                      args)
    avg = final["average"]
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    before = stages["labels"].get("generated_tokens", 0) + stages["refine"].get(
        "generated_tokens", 0)
    result = {"method": "prorag_beta0", "seed": seed, "steps": summary["steps"],
              "rollout_tokens": summary["rollout_tokens"],
              "generated_tokens": before + summary["rollout_tokens"],
              "budget": before + stages["rl"].get("generated_tokens", 0),
              "em": avg["em"], "f1": avg["f1"], "searches": avg["searches"],
              "evidence_recall": avg["evidence_recall"], "valid_format": avg["valid_format"],
              "em_by_type": _by_type(out / "eval-test"),
              "per_question": _per_question(out / "eval-test"),
              "train_searches": [r[M.SEARCHES] for r in steps if M.EPISODES in r],
              "minutes": round((time.time() - t0) / 60, 2), "device": args.device}
    done.write_text(json.dumps(result, indent=1))
    print(f"prorag-beta0 seed {seed}: EM {result['em']:.3f}, searches {result['searches']:.2f}",
          flush=True)
    return result


def _mc_comparison(seed: int, args) -> dict:
    """MC labels on the pipeline's questions at about its simulation count, a PRM on them,
    and both PRMs on both label sets' held-out questions."""
    from seekrl.config import LabelConfig, PRMConfig, load_config
    from seekrl.recipes.labels import read_labels, split_labels
    from seekrl.recipes.mcts import run_labelling
    from seekrl.recipes.prm import prm_metrics, train_prm
    from seekrl.rewards.prm import load_scorer

    out = args.work_dir / "runs" / f"mc-s{seed}"
    done = out / "result.json"
    if done.is_file():
        return json.loads(done.read_text())
    pipe = _pipeline_dir(args, seed)
    if not (pipe / "prm" / "final").is_dir():
        # a pipeline kept from an earlier machine (--keep) left its result, not its labels
        print(f"mc seed {seed}: skipped, the pipeline's labels and PRM are not in {pipe} "
              f"(it ran on another machine); delete its kept result to run it again",
              flush=True)
        return {}
    mcts_cfg = json.loads((pipe / "pipeline.json").read_text())
    mcts_tokens = mcts_cfg["stages"]["labels"].get("generated_tokens")
    # the pipeline's own labelling and PRM settings, with MC labels instead: 4 episodes + 2
    # continuations per intermediate step (~1.5 of them), stopped at the MCTS labels'
    # generated tokens (at equal simulations MC labels cost 35-41% more tokens), in chunks
    # of 4 questions so the budget is met closely
    labels = run_labelling(load_config(LabelConfig, pipe / "labels" / "config.yaml", [
        f"out={out / 'labels'}", "search.method=mc", "search.samples=4",
        "search.mc_samples=2", "search.trees_per_batch=4"]
        + ([f"search.max_tokens={mcts_tokens}"] if mcts_tokens else [])),
        resume=(out / "labels" / "progress.json").is_file())
    prm = train_prm(load_config(PRMConfig, pipe / "prm" / "config.yaml", [
        f"labels={out / 'labels'}", f"out={out / 'prm'}"]), overwrite=True)
    sets = {"mcts": split_labels(read_labels([pipe / "labels"]), 0.2)[1],
            "mc": split_labels(read_labels([out / "labels"]), 0.2)[1]}
    scorers = {"mcts": load_scorer(pipe / "prm" / "final", device=args.device),
               "mc": load_scorer(prm["final"], device=args.device)}
    cross = {f"{p}_on_{d}": prm_metrics(scorers[p], sets[d]) for p in scorers for d in sets}
    result = {"seed": seed, "mc_labels": {k: labels.get(k) for k in
                                          ("simulations", "generated_tokens", "pairs")},
              "mcts_labels": mcts_cfg["stages"]["labels"].get("simulations"),
              "mcts_tokens": mcts_tokens, "quality": cross}
    done.write_text(json.dumps(result, indent=1))
    return result


def _report(work: Path, started: float, step_method: str) -> None:
    from process_ablation import _mean_std

    runs = [json.loads(p.read_text()) for p in sorted(work.glob("runs/*/result.json"))]
    pipes = [r for r in runs if r.get("method") == "prorag"]
    if not pipes:
        raise SystemExit(f"no pipeline results under {work}/runs")
    by = {"prorag": pipes}
    for r in runs:
        if r.get("method") in ("outcome", "prorag_beta0", step_method) and \
                r.get("budget") is not None:
            by.setdefault(r["method"], []).append(r)
    rows = {}
    for name, rs in by.items():
        em, sd = _mean_std([r["em"] for r in rs])
        tokens = _mean_std([r.get("generated_tokens", r.get("rollout_tokens", 0)) for r in rs])[0]
        rows[name] = (em, sd, len(rs))
        print(f"em_{name}={em:.4f} em_std_{name}={sd:.4f} seeds_{name}={len(rs)} "
              f"searches_{name}={_mean_std([r['searches'] for r in rs])[0]:.2f} "
              f"generated_tokens_{name}={tokens:.0f}")
        types = sorted({t for r in rs for t in r.get("em_by_type", {})})
        for t in types:
            m, s = _mean_std([r["em_by_type"].get(t, 0.0) for r in rs])
            print(f"em_{name}_{t}={m:.4f} em_std_{name}_{t}={s:.4f}")
    for stage in ("em_sft", "em_refine"):
        values = [r[stage] for r in pipes if r.get(stage) is not None]
        if values:
            m, s = _mean_std(values)
            print(f"prorag_{stage}={m:.4f} prorag_{stage}_std={s:.4f}")
    for key in ("auc", "pair_accuracy", "first_error_accuracy", "first_error_baseline"):
        vals = [r["prm_dev"].get(key) for r in pipes if r["prm_dev"].get(key) is not None]
        if vals:
            print(f"prm_mcts_dev_{key}={_mean_std(vals)[0]:.4f}")
    mc = [json.loads(p.read_text()) for p in sorted(work.glob("runs/mc-s*/result.json"))]
    for pair in ("mcts_on_mcts", "mcts_on_mc", "mc_on_mcts", "mc_on_mc"):
        for key in ("auc", "pair_accuracy", "first_error_accuracy"):
            vals = [r["quality"][pair].get(key) for r in mc
                    if r["quality"][pair].get(key) is not None]
            if vals:
                print(f"prm_{pair}_{key}={_mean_std(vals)[0]:.4f}")
    if "prorag_beta0" in by:
        # paired by seed: the same refined policy, config and seed, beta 0.3 against 0
        pairs = [(p, b) for b in by["prorag_beta0"] for p in pipes if p["seed"] == b["seed"]]
        for key in ("em", "searches"):
            m, s = _mean_std([p[key] - b[key] for p, b in pairs])
            print(f"step_credit_effect_{key}={m:+.4f} step_credit_effect_{key}_std={s:.4f} "
                  f"step_credit_pairs={len(pairs)}")
    found = _report_paired(by, step_method)
    from process_ablation import _headline

    outcome = rows.get("outcome", (float("nan"),))[0]
    gain = _headline(found.get(("prorag", "outcome")), rows["prorag"][0] - outcome)
    print("prorag: " + ", ".join(f"{k} {v[0]:.3f}±{v[1]:.3f} ({v[2]} seeds)" if v[2] > 1
                                 else f"{k} {v[0]:.3f} ({v[2]} seed)" for k, v in rows.items())
          + f" (test EM at equal generated tokens); prorag_gain={gain}"
          + f" ({(time.time() - started) / 60:.0f} min this run)")


def _report_paired(by: dict[str, list[dict]], step_method: str) -> dict:
    """The pipeline against each other method on the same test questions, seed by seed
    (process_ablation's paired bootstrap), where the runs kept their per-question answers
    (results written before they did are reported by their means alone)."""
    from process_ablation import QuestionMismatch, _paired, paired_line

    per_run = {(name, r["seed"]): r.get("per_question") for name, rs in by.items() for r in rs}
    found = {}
    for other in ("outcome", step_method, "prorag_beta0"):
        if other not in by or other == "prorag":
            continue
        try:
            paired = _paired(per_run, "prorag", other, None)
        except QuestionMismatch as e:
            print(f"paired_prorag_vs_{other}=refused ({e})")
            continue
        if paired is not None:
            found[("prorag", other)] = paired
            print(paired_line("prorag", other, paired))
    return found


if __name__ == "__main__":
    main()
