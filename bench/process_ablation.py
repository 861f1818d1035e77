"""Process-supervision ablation: outcome-only RL against step-level credit methods, from one
SFT checkpoint, at equal compute, over several seeds. A long run; never in CI.

    .venv/bin/python bench/process_ablation.py --work-dir /tmp/seekrl-process \\
        --methods outcome,evidence,gigpo,mc_value,stratified,tree --seeds 0,1,2 --steps 15

Setting: the demo's synthetic world (medium, `DemoConfig`), its SFT warm-up (built once, or
`--sft DIR`), then per seed one RL run per method (`rl/methods.py`). The outcome run (the
baseline estimator, `--baseline`, dr_grpo by default) goes first with `--steps` steps; its
number of generated rollout tokens is the budget every other method of that seed gets
(`max_rollout_tokens`: Monte-Carlo continuations count, a tree's shared prefixes count once;
its last step plays only the questions the budget has left, at most 10 x --steps steps; a run
outside 10% of the budget is flagged `budget_met: false`). Every run's
final policy is evaluated greedily on the same `--n-test` test questions (200 by default: at
40, 3 vs 9 right is noise); with `--eval-every N`, also every N steps on them (a curve).

Each run keeps `WORK/runs/METHOD-sSEED/result.json` once it is done and is not run again,
so a run can be split: `--stage sft` once, then one process per method or seed (in
parallel on a GPU), then `--stage report`. `--stage keep --keep-to bench/records` copies
the runs folder's small records there (results, configs, gzipped step logs, each
evaluation's figures and per-question EM; a run still going as `RUN-partial`), which the
report reads as it reads the runs themselves. Prints `key=value` figures (test EM mean and
std over seeds per method and per question type, searches per episode, evidence recall,
steps and rollout tokens), draws `process_ablation.png` and `learning_curves.png` (EM at
each evaluation against steps and rollout tokens, each seed's line, and the training
reward: `bench/learning_curves.py`), and ends with a one-line summary holding
`process_gain=` (the named process method's test EM minus outcome-only's: the process arm
named before the test runs, as the best of several noisy means is biased up), `rl_gain=`
(outcome-only's test EM minus the shared SFT start's; nan before the start is evaluated),
their 95% intervals `process_gain_ci=LOW..HIGH` and `rl_gain_ci=LOW..HIGH`, and `best_em=`
(the better named arm's mean test EM, outcome-only or the named method, and which). A gain
is paired per question over the seeds both arms ran, with those seeds and the interval
below, where the runs kept per-question answers, else the difference of the means,
labelled `(unpaired means)`, its interval `nan..nan`. One seed's std is nan (the std is
over seeds, n - 1).

The runs answer the same test questions, so the comparisons are also made pair by pair:
every run keeps its per-question EM (`per_question` in result.json, `per_question.json` of
an evaluation), and for every method against outcome-only (the named one first) and
against the start, the report prints the paired gain (`paired_A_vs_B=`: the mean over questions of
A's EM minus B's, averaged over the seeds both ran), its 95% interval from a bootstrap that
resamples seeds and then questions (`ci95_A_vs_B=lo,hi`), the seeds' own gains, and the
discordant answers summed over seeds (`wins_A_vs_B`: right under A and wrong under B;
`losses_A_vs_B`: the reverse). An interval that holds 0 is no claim.
`--methods prm --prm DIR` runs ProRAG's RL stage with a trained process reward model (a
`seekrl prm train` folder) at the same rollout budget; the tokens its labels took to generate
are counted beside the rollouts (`label_tokens`) and flag the run when the sum leaves the
budget by more than 10% (MCTS labels for a PRM that ranks steps above chance cost several
outcome-only runs' worth of tokens).
`--budget-from OTHER` and `--against OTHER` compare a setting (e.g. outcome-only with a ranker,
`--set ranker.model=...`) with another runs folder's at each seed's same budget, method by
method (`paired_outcome_vs_outcome@OTHER=`).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from learning_curves import TRAIN  # noqa: E402

from seekrl.rl import step_metrics as M  # noqa: E402

DEFAULT_METHODS = "outcome,evidence,gigpo,mc_value,stratified,tree"


def build_parser() -> argparse.ArgumentParser:
    """The bench's options (another bench running these runs parses its settings with it,
    so every option has its default)."""
    from seekrl.rl.methods import PROCESS_METHODS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/seekrl-process"))
    ap.add_argument("--sft", type=Path, default=None, help="SFT checkpoint (default: train one)")
    ap.add_argument("--stage", choices=("all", "sft", "rl", "report", "keep"), default="all",
                    help="keep: copy the runs folder's small records (finished runs and those "
                         "still going, as RUN-partial) into --keep-to, for the report there")
    ap.add_argument("--keep-to", type=Path, default=None, metavar="DIR",
                    help="--stage keep: where the records go (DIR/RUNS_DIR, e.g. bench/records)")
    ap.add_argument("--methods", default=None,
                    help=f"comma-separated, from: {', '.join(PROCESS_METHODS)} (default: "
                         f"{DEFAULT_METHODS}; with a budget given, outcome runs only if named)")
    ap.add_argument("--named", default="evidence",
                    help="the process method named before the runs: process_gain is its test "
                         "EM minus outcome-only's, paired per question (the best of several "
                         "noisy means is biased up)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--baseline", default="dr_grpo", help="the outcome estimator")
    ap.add_argument("--steps", type=int, default=15, help="steps of the outcome run")
    ap.add_argument("--budget", type=int, default=None,
                    help="generated rollout tokens for every method, instead of the outcome "
                         "run's (which then runs only if --methods names it): a budget "
                         "measured before, to add a method to a setting without running "
                         "outcome-only again")
    ap.add_argument("--budget-by", default="outcome", metavar="METHOD",
                    help="the method whose run of --steps sets each seed's token budget (it "
                         "runs first; the others stop at its tokens): a costlier method's, so "
                         "that every run makes at least --steps steps' updates and episodes")
    ap.add_argument("--budget-from", type=Path, default=None,
                    help="a runs folder whose outcome-sSEED/result.json gives each seed's "
                         "budget (its rollout tokens): a setting compared with another's "
                         "outcome-only runs, e.g. outcome-only with a ranker against without")
    ap.add_argument("--eval-every", type=int, default=0,
                    help="steps between evaluations on the world's dev questions (a curve to "
                         "tune on; the test questions are evaluated once, at the end)")
    ap.add_argument("--take", choices=("final", "best"), default="final",
                    help="the policy each run is judged by: its last, or the one whose dev "
                         "evaluation (--eval-every, the start included) scored highest "
                         "(eval.keep_best: early stopping chosen on dev, judged on test; "
                         "with --final-on dev the EM reported is the one it was chosen by, "
                         "optimistic: for tuning only)")
    ap.add_argument("--n-test", type=int, default=200)
    ap.add_argument("--n-dev", type=int, default=None,
                    help="the dev questions each --eval-every probe plays (default: --n-test; "
                         "with --final-on dev the final evaluation plays --n-test)")
    ap.add_argument("--rl-world-seed", type=int, default=None, metavar="SEED",
                    help="RL's questions and index from another world of the demo's settings "
                         "(this seed; built once under WORK/rl-world-sSEED): entities the SFT "
                         "start never saw, where its oracle episodes taught the training "
                         "split's answers by heart. Evaluations stay on WORK's world")
    ap.add_argument("--questions-per-step", type=int, default=None, help="default: the demo's")
    ap.add_argument("--group-size", type=int, default=None, help="default: the demo's")
    ap.add_argument("--lr", type=float, default=None, help="default: the demo's RL lr")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a train-config override for every run (repeatable), e.g. "
                         "rollout.temperature=0.7 algo.kl_coef=0.05; method keys win over it")
    ap.add_argument("--set-for", action="append", default=[], metavar="METHOD:KEY=VALUE",
                    help="a train-config override for one method's runs (repeatable), over "
                         "--set and the method's keys: arms that differ in more than their "
                         "reward, e.g. hops:algo.kl_coef=1.0 beside outcome without the anchor")
    ap.add_argument("--runs-dir", default="runs",
                    help="folder under WORK for this setting's runs, SFT evaluation and plot "
                         "(one world and SFT, several settings side by side)")
    ap.add_argument("--final-on", choices=("test", "dev"), default="test",
                    help="where each run's final policy is evaluated: dev while tuning "
                         "(the test questions are for the settings chosen, once)")
    ap.add_argument("--against", default=None, metavar="RUNS_DIR",
                    help="report: also compare each method pair by pair with the same method "
                         "of another runs folder under WORK (another setting of the same start "
                         "and questions: e.g. a ranker's runs against decide)")
    ap.add_argument("--set-aside-yes-no", type=Path, default=None, metavar="QUESTIONS",
                    help="report: also give process_gain and rl_gain without the questions of "
                         "this file (the ones the runs were tested on) whose gold answers are "
                         "yes or no: a policy that flips one constant answer for another moves "
                         "EM there without comparing anything")
    ap.add_argument("--prm", type=Path, default=None,
                    help="the `prm` method's process reward model (a `seekrl prm train` "
                         "folder); the generated tokens of its labels count toward the run's "
                         "compute (`label_tokens`), so a run whose labels and rollouts exceed "
                         "the budget by more than 10%% is flagged")
    ap.add_argument("--max-new-tokens", type=int, default=None,
                    help="the turn limit of rollouts and evaluations (default: the demo's; "
                         "64 before 2026-11-27, e.g. the decide runs)")
    ap.add_argument("--eval-batch", type=int, default=64)
    ap.add_argument("--skip-sft-eval", action="store_true",
                    help="do not evaluate the SFT checkpoint on the test questions")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32",
                    help="the RL runs' and every evaluation's dtype (bf16-mixed: float32 weights, "
                         "bfloat16 products; 0.72x the float32 step on an AVX-512 BF16 CPU)")
    return ap


def main() -> None:
    from seekrl.recipes.pipeline import DemoConfig
    from seekrl.rl.methods import PROCESS_METHODS

    args = build_parser().parse_args()
    methods = [m.strip() for m in (args.methods or DEFAULT_METHODS).split(",") if m.strip()]
    for m in methods:
        if m not in PROCESS_METHODS:
            raise SystemExit(f"--methods: unknown method {m!r}; expected {', '.join(PROCESS_METHODS)}")
    from seekrl.rl.methods import NEEDS_PRM

    if any(m in NEEDS_PRM for m in methods) and args.prm is None:
        raise SystemExit("--methods prm: needs --prm DIR (a `seekrl prm train` folder)")
    if args.prm is not None:
        args.label_tokens = _label_tokens(args.prm)   # a bad folder fails before any run
    if args.budget is not None and args.budget_from is not None:
        raise SystemExit("--budget and --budget-from: give one")
    if args.budget_by not in PROCESS_METHODS:
        raise SystemExit(f"--budget-by: unknown method {args.budget_by!r}")
    # read before any run: a wrong path fails now, not after the runs have trained
    set_aside = _yes_no_ids(args.set_aside_yes_no) if args.set_aside_yes_no else None
    if args.stage == "keep":
        if args.keep_to is None:
            raise SystemExit("--stage keep: needs --keep-to DIR (e.g. bench/records)")
        _keep(args.work_dir / args.runs_dir, args.keep_to / args.runs_dir)
        return
    if args.take == "best" and not args.eval_every:
        raise SystemExit("--take best: needs --eval-every N (the dev evaluations to choose from)")
    if args.n_dev and args.final_on == "dev" and args.n_dev != args.n_test:
        raise SystemExit(f"--n-dev {args.n_dev} with --final-on dev: the final evaluation "
                         f"reads the trainer's, so both play --n-test {args.n_test} questions")
    if args.budget is not None or args.budget_from is not None:
        if args.budget is not None and args.budget < 1:
            raise SystemExit(f"--budget: expected a positive number of tokens, got {args.budget}")
        if args.methods is None:   # the budget is given: outcome-only runs only when named
            methods = [m for m in methods if m != "outcome"]
    elif args.budget_by not in methods:
        methods.insert(0, args.budget_by)   # it sets the budget
    methods.sort(key=lambda m: m != args.budget_by)
    seeds = [int(s) for s in args.seeds.split(",")]
    args.overrides = parse_sets(args.set)
    args.method_sets = parse_sets_for(args.set_for, methods)

    from learning import _setup

    demo = DemoConfig(
        n_test=args.n_test,
        rollout={"max_new_tokens": args.max_new_tokens} if args.max_new_tokens else {},
        rl={k: v for k, v in (("questions_per_step", args.questions_per_step),
                              ("group_size", args.group_size)) if v})
    work = args.work_dir
    started = time.time()
    if args.stage != "report":
        world_dir, index_dir, test_file, sft = _setup(work, demo, args.n_test, args.sft,
                                                      args.device)
        if args.final_on == "dev":   # every final evaluation, the runs' and the SFT start's
            test_file = _dev_file(work, world_dir, args.n_test)
        if args.stage in ("all", "rl"):
            for seed in seeds:
                budget = args.budget if args.budget_from is None \
                    else _budget_of(args.budget_from, seed)
                for method in methods:
                    result = _run(method, seed, budget, args, demo, sft, world_dir, index_dir,
                                  test_file)
                    if method == args.budget_by and budget is None:
                        budget = result["rollout_tokens"]
        if not args.skip_sft_eval:   # the reference line: the starting point of every run,
            # under the runs' ranker and episode settings (a --set ranker.model=... is the
            # runs' retrieval from their first step, not part of what RL gained)
            start_cfg = _run_config("outcome", seeds[0], None, args, demo, sft, world_dir,
                                    index_dir, work / args.runs_dir / "outcome-s0")[0]
            start = evaluate_as_trained(start_cfg, sft,
                                        work / args.runs_dir / f"eval-sft-{args.final_on}",
                                        index_dir, test_file, demo, args)
            print(f"em_sft={start['average']['em']:.4f}", flush=True)
    if args.stage in ("all", "report"):
        _report(work / args.runs_dir, started, args.named, args.final_on,
                against=work / args.against if args.against else None,
                set_aside=set_aside)


def _hops(results: list[dict]) -> dict[str, dict[str, float]]:
    """Each question type's hop figures (searches, one_search, planned_lookups), the
    mean over the runs that kept them (results before 2026-11-28 did not)."""
    out: dict[str, dict[str, float]] = {}
    kept = [r["hops_by_type"] for r in results if r.get("hops_by_type")]
    for t in sorted({t for h in kept for t in h}):
        figures = {}
        for f in (M.SEARCHES, "one_search", "planned_lookups"):
            values = [h[t][f] for h in kept if isinstance((h.get(t) or {}).get(f), (int, float))]
            if values:
                figures[f] = sum(values) / len(values)
        if figures:
            out[t] = figures
    return out


def parse_sets(texts: list[str]) -> dict:
    """`--set KEY=VALUE` arguments as dotted config keys (a bad one stops the bench)."""
    from seekrl.config import parse_override

    try:
        pairs = [parse_override(text) for text in texts]
    except ValueError as e:
        raise SystemExit(f"--set: {e}") from None
    twice = sorted({k for k, _ in pairs if sum(k == j for j, _ in pairs) > 1})
    if twice:   # the last would win unsaid
        raise SystemExit(f"--set: {', '.join(twice)} given twice")
    return dict(pairs)


def parse_sets_for(texts: list[str], methods: list[str]) -> dict[str, dict]:
    """`--set-for METHOD:KEY=VALUE` arguments: {method: its dotted config keys}."""
    given: dict[str, list[str]] = {}
    for text in texts:
        method, sep, rest = text.partition(":")
        if not sep or not method or "=" not in rest:
            raise SystemExit(f"--set-for {text!r}: expected METHOD:KEY=VALUE, "
                             "e.g. hops:algo.kl_coef=1.0")
        if method not in methods:
            raise SystemExit(f"--set-for {text!r}: {method!r} is not among the methods "
                             f"run ({', '.join(methods)})")
        given.setdefault(method, []).append(rest)
    try:
        return {m: parse_sets(sets) for m, sets in given.items()}
    except SystemExit as e:
        raise SystemExit(str(e).replace("--set:", "--set-for:", 1)) from None


def _label_tokens(prm: Path) -> int:
    """The generated tokens that made a PRM's labels: the `generated_tokens` of every label
    folder it was trained on (their `progress.json`). `prm` is a `seekrl prm train` folder
    or its `final/` (whose prm.json names the label folders, as its config.yaml does)."""
    from seekrl.rewards.prm import PRM_MARKER, prm_folder

    try:
        marker = prm_folder(prm) / PRM_MARKER
    except FileNotFoundError as err:
        raise SystemExit(f"--prm: {err}") from None
    labels = json.loads(marker.read_text()).get("labels")
    if not labels:
        raise SystemExit(f"--prm: {marker} names no label folders (field 'labels'), so the "
                         "labels' generated tokens cannot be counted")
    total = 0
    for folder in labels:
        progress = Path(folder) / "progress.json"
        if not progress.is_file():
            raise SystemExit(f"--prm: the PRM's labels {folder} (from {marker}) have no "
                             "progress.json, so their generated tokens cannot be counted (a "
                             "relative path is read from this directory)")
        stats = json.loads(progress.read_text()).get("stats") or {}
        if "generated_tokens" not in stats:
            raise SystemExit(f"--prm: {progress}: field stats.generated_tokens is missing")
        total += int(stats["generated_tokens"])
    return total


# keys a run compared with another folder's at the same budget may differ in by nature
_OWN_KEYS = ("out", "steps", "max_rollout_tokens", "save_every", "keep_last")
# keys whose default became None ("the saved model's own") with the value they had before:
# a run written then, at that value, trained as one at None does now (a saved ranker's own
# max_len and temperature were used whatever the key said; a fresh one's are these)
_NOW_NONE = {"ranker.max_len": 128, "ranker.temperature": 0.05}


def _differing(mine: dict, theirs: dict, defaults: dict, free=()) -> list[str]:
    """The flat config keys two runs differ in, leaving out `free` keys (and those below
    them), a key one run lacks (added to seekrl since) where the other has it at its
    default, and a `_NOW_NONE` key at None in one and at its former default in the other."""
    missing = object()

    def differs(k: str) -> bool:
        a, b = mine.get(k, missing), theirs.get(k, missing)
        if a == b or any(k == f or k.startswith(f + ".") for f in free):
            return False
        if k in _NOW_NONE and {a, b} <= {None, _NOW_NONE[k]}:
            return False
        return not any(x is missing and y == defaults.get(k, missing)
                       for x, y in ((a, b), (b, a)))

    return sorted(k for k in set(mine) | set(theirs) if differs(k))


def same_setting(cfg, other: Path, named=(), flag: str = "--budget-from") -> None:
    """Refuse a run compared with `other`'s (a result.json) whose config differs in a key
    that is neither named (`--set`, the method's keys) nor the run's own (out, steps, the
    budget): e.g. a turn limit whose default moved between the two snapshots."""
    if not other.is_file():
        return   # _budget_of says it is missing
    theirs = json.loads(other.read_text()).get("config")
    if not theirs:
        # a result from before configs were kept: nothing to compare, and said
        print(f"{flag}: {other} keeps no config; its settings are not compared with this "
              "run's", file=sys.stderr)
        return
    from seekrl.config import flat_keys

    mine, theirs = flat_keys(cfg.model_dump(mode="json")), flat_keys(theirs)
    # a key added to seekrl since their run, at its default here, changes nothing
    defaults = flat_keys(type(cfg).model_validate({"data": cfg.data}).model_dump(mode="json"))
    free = [*_OWN_KEYS, *named]
    for key in named:   # a section they had empty (ranker: null, process: {}) is named whole
        parts = key.split(".")
        free += [p for p in (".".join(parts[:i]) for i in range(1, len(parts)))
                 if p in theirs and theirs[p] in (None, {})]

    differ = _differing(mine, theirs, defaults, free)
    if differ:
        shown = ", ".join(f"{k}: {mine.get(k)!r} here, {theirs.get(k)!r} there"
                          for k in differ[:6])
        raise SystemExit(f"{flag}: {other} trained with other settings ({shown}"
                         f"{', ...' if len(differ) > 6 else ''}); set them (--set KEY=VALUE, "
                         "--max-new-tokens) or name them")


def _budget_of(runs: Path, seed: int) -> int:
    """The generated rollout tokens of `runs`' outcome-only run of `seed`."""
    path = runs / f"outcome-s{seed}" / "result.json"
    if not path.is_file():
        raise SystemExit(f"--budget-from: {path} is missing (run that outcome seed first)")
    try:
        return int(json.loads(path.read_text())["rollout_tokens"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise SystemExit(f"--budget-from: {path}: expected a result with rollout_tokens "
                         f"({e})") from None


def _dev_file(work: Path, world_dir: Path, n: int) -> Path:
    """The world's first `n` dev questions in a file (the periodic evaluation's questions)."""
    from seekrl.data.qa import read_qa_jsonl, write_qa_jsonl

    dev = read_qa_jsonl(world_dir / "dev.jsonl")[:n]
    if len(dev) < n:
        raise SystemExit(f"--n-test: the world has {len(dev)} dev questions")
    path = work / "dev_questions.jsonl"
    write_qa_jsonl(path, dev)
    return path


def _run_config(method: str, seed: int, budget: int | None, args, demo, sft: Path,
                world_dir: Path, index_dir: Path, out: Path):
    """A run's config (the demo's RL settings, the bench's, `--set`, the method's keys),
    the method's keys, and the label tokens its budget is charged."""
    from seekrl.config import TrainConfig, with_keys
    from seekrl.recipes.pipeline import rl_config
    from seekrl.rl.methods import NEEDS_PRM, method_overrides

    # the demo's RL stage (src/seekrl/presets/demo/rl.yaml) with the bench's settings, then `--set`
    rl = {**demo.rl, "steps": args.steps, "device": args.device, "dtype": args.dtype,
          "save_every": 1, "keep_last": 1,   # a killed run resumes from its last step
          "log": {"save_rollouts": 0}, "algo": {"advantage": args.baseline}}
    if args.lr:
        rl["optim"] = {"lr": args.lr}
    train_file, rollout_index = world_dir / "train.jsonl", index_dir
    if args.rl_world_seed is not None:
        from learning import _rl_world

        rl_world, rollout_index = _rl_world(args.work_dir, demo, args.rl_world_seed)
        train_file = rl_world / "train.jsonl"
    if args.eval_every:
        rl["eval"] = {"data": str(world_dir / "dev.jsonl"), "n": args.n_dev or args.n_test,
                      "every": args.eval_every, "keep_best": args.take == "best",
                      # the start is a candidate for the best (else its own evaluation,
                      # eval-sft-*, is the report's reference line)
                      "at_start": args.take == "best",
                      "max_turns": demo.rollout.max_turns,
                      "max_new_tokens": demo.rollout.max_new_tokens,
                      "batch_size": args.eval_batch}
        if rollout_index != index_dir:   # the probes search their own world
            rl["eval"]["index"] = str(index_dir)
    run_cfg = demo.model_copy(update={
        "seed": seed, "rl": with_keys(rl, args.overrides, TrainConfig, where="--set")})
    kw = dict(model=str(sft), train_file=train_file, index_dir=rollout_index, out=out)
    base = rl_config(run_cfg, **kw)
    keys = method_overrides(method, group_size=base.group_size, baseline_advantage=args.baseline)
    keys.update(getattr(args, "method_sets", {}).get(method, {}))
    label_tokens = 0
    if method in NEEDS_PRM:
        keys["reward.prm"] = str(args.prm)
        label_tokens = args.label_tokens
    cfg = rl_config(run_cfg, keys=keys, budget_tokens=budget, **kw)
    return cfg, keys, label_tokens


def _run(method: str, seed: int, budget: int | None, args, demo, sft: Path, world_dir: Path,
         index_dir: Path, test_file: Path) -> dict:
    from seekrl.recipes.train import Trainer

    out = args.work_dir / args.runs_dir / f"{method}-s{seed}"
    done = out / "result.json"
    if done.is_file():
        result = json.loads(done.read_text())
        if result.get("taken", "final") != args.take:
            raise SystemExit(f"{done}: judged by its {result.get('taken', 'final')} policy, "
                             f"not --take {args.take}'s: another runs folder, or delete it")
        print(f"{method} seed {seed}: already in {done}", flush=True)
        return result
    cfg, keys, label_tokens = _run_config(method, seed, budget, args, demo, sft, world_dir,
                                          index_dir, out)
    if args.budget_from is not None:   # the same setting as theirs but what is named
        same_setting(cfg, args.budget_from / f"outcome-s{seed}" / "result.json",
                     named={*args.overrides, *keys})
    resume = (out / "checkpoints" / "latest").is_file()
    if resume:
        print(f"{method} seed {seed}: resuming {out}", flush=True)
    else:   # a fresh run: an evaluation left in its folder is an earlier policy's (the
        # trainer's overwrite clears its own outputs, not the bench's cached evaluation)
        shutil.rmtree(out / f"eval-{args.final_on}", ignore_errors=True)
    started = time.time()
    trainer = Trainer(cfg, resume=resume, overwrite=not resume)
    trained_before = trainer.state.seconds_before   # a resumed run's training until now
    summary = trainer.train()
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if M.EPISODES in r]
    tokens_at = {r[M.STEP]: r[M.ROLLOUT_TOKENS_TOTAL] for r in steps}
    dev_em = M.DEV + M.EM
    curve = [(0 if r[M.STEP] == 0 else tokens_at.get(r[M.STEP]), r[dev_em])
             for r in records if dev_em in r]
    dev_dir, policy = summary.get("dev_dir"), Path(summary["final"])
    best = summary.get("best") if args.take == "best" else None
    if args.take == "best" and best is None:
        raise SystemExit(f"{out}: --take best, but the run saved no best policy "
                         "(summary.json has no best: were its evaluations on?)")
    if best is not None:   # the best dev evaluation's policy, and that evaluation
        dev_dir, policy = best["eval_dir"], Path(best["dir"])
    final_dir = out / f"eval-{args.final_on}"
    if args.final_on == "dev" and dev_dir and (Path(dev_dir) / "metrics.json").is_file():
        # the trainer's own evaluation: the same dev questions, greedy, same settings
        final_dir = Path(dev_dir)
        final = json.loads((final_dir / "metrics.json").read_text())
    else:
        check_trained_ranker(cfg, policy)
        final = evaluate_as_trained(cfg, policy, final_dir, index_dir, test_file, demo, args)
    avg = final["average"]
    types = next(iter(final["by_type"].values()), {})
    by_type = {k: v["em"] for k, v in types.items()}
    result = {"method": method, "seed": seed, "steps": summary["steps"],
              "rollout_tokens": summary["rollout_tokens"], "budget": budget,
              "budget_met": summary.get("budget_met", True) and (
                  budget is None or label_tokens + summary["rollout_tokens"] <= 1.1 * budget),
              "label_tokens": label_tokens,
              "em": avg["em"], "f1": avg["f1"], "searches": avg["searches"],
              "evidence_recall": avg["evidence_recall"], "valid_format": avg["valid_format"],
              "em_by_type": by_type, "curve": curve,
              # the hop decision per type: searches a question, the share answered after
              # one search, and the lookups the first thought planned
              "hops_by_type": {k: {f: v.get(f) for f in (M.SEARCHES, "one_search",
                                                          "planned_lookups")}
                               for k, v in types.items()},
              "per_question": _per_question(final_dir),
              TRAIN + M.SEARCHES: [r[M.SEARCHES] for r in steps],
              TRAIN + M.REWARD: [r[M.REWARD] for r in steps],
              # the health of every step, to read the curve after the fact (the whole log,
              # dev lines included, is kept beside as metrics.jsonl.gz)
              **{TRAIN + k: [r.get(k) for r in steps] for k in STEP_CURVES},
              "metrics_log": _keep_log(out),
              "alerts": sorted({a for r in steps for a in r.get(M.ALERTS, [])}),
              # the ranker's scoring and updates: time the policy-token budget does not count
              "ranker_minutes": round(sum(r.get(M.TIME_RANKER_SCORE, 0.0)
                                          + r.get(M.TIME_RANKER_UPDATE, 0.0)
                                          for r in steps) / 60, 2) if cfg.ranker else None,
              # the training before a resume (the trainer's clock), then all of this process
              "minutes": round((trained_before + time.time() - started) / 60, 2),
              "device": args.device,
              "evaluated_on": args.final_on,
              "overrides": {**args.overrides, **getattr(args, "method_sets", {}).get(method, {})},
              "taken": args.take, "taken_step": summary["steps"] if best is None
              else best["step"],
              "config": cfg.model_dump(mode="json")}
    tmp = done.with_name(f".{done.name}.tmp{os.getpid()}")   # whole or not at all: a
    tmp.write_text(json.dumps(result, indent=1))                # rerun reads it back
    os.replace(tmp, done)
    print(f"{method} seed {seed}: EM {avg['em']:.3f} searches {avg['searches']:.2f} in "
          f"{summary['steps']} steps, {summary['rollout_tokens']} rollout tokens "
          f"({result['minutes']:.1f} min)"
          + (f", the policy of step {best['step']} (best on dev)" if best else ""), flush=True)
    return result


# per-step figures a result keeps as lists (TRAIN + name): reward and EM, the signal, the
# update's health (KL to the sampler, approx_kl, always; to the reference, kl, with one)
# and the hop decision
STEP_CURVES = (M.EM, M.VALID_FORMAT, M.GROUPS_WITH_SIGNAL, M.GROUPS_SOLVED, M.UPDATES,
               M.CLIP_FRAC, M.APPROX_KL, M.KL, M.ENTROPY, M.GRAD_NORM, M.LOOKUPS_BY_KIND,
               M.ROLLOUT_TOKENS)


def _gzip(src: Path, dst: Path) -> None:
    """`src` gzipped to `dst`, the same bytes for the same file (no time stamp), so a record
    kept again unchanged is no change to commit."""
    import gzip

    with open(src, "rb") as f, open(dst, "wb") as raw, \
            gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as out:
        shutil.copyfileobj(f, out)


def _keep_log(out: Path, to: Path | None = None) -> str:
    """The run's whole metrics.jsonl, gzipped into `to` (default: beside its result.json,
    kept in the records with it); returns its name."""
    _gzip(out / "metrics.jsonl", (to or out) / "metrics.jsonl.gz")
    return "metrics.jsonl.gz"


def _keep(runs: Path, to: Path) -> None:
    """A runs folder's records, small, in the layout the report reads: each run's
    result.json, config and gzipped step log, and each evaluation's figures, per-question
    EM and gzipped episodes (each answer with the turns that led to it, ~30 KB for 100
    questions: what a failure analysis reads again), `eval/step-N` as `eval-step-N`, the
    final one as `eval-test` or `eval-dev`; the start's evaluations (`eval-sft-*`)
    likewise. A run without its result yet (still going, or killed) goes to `RUN-partial`,
    which its finished records replace. Checkpoints and token-level trajectories stay
    behind: a machine can lose them, these records it cannot."""
    if not runs.is_dir():
        raise SystemExit(f"--stage keep: {runs} is not a runs folder")

    def evaluation(src: Path, dst: Path) -> bool:
        if not (src / "metrics.json").is_file():
            return False
        per = _per_question(src)
        if per is not None and (dst / "per_question.json").is_file() \
                and json.loads((dst / "per_question.json").read_text()) != per:
            # a start evaluation kept from another machine (a start rebuilt a few answers
            # apart): the runs paired with it would be paired with another start
            raise SystemExit(f"--stage keep: {dst} holds other answers than {src}; keep this "
                             "one under another name (eval-sft-test-METHOD-sSEED for the "
                             "start a run began from)")
        dst.mkdir(parents=True, exist_ok=True)
        shutil.copy(src / "metrics.json", dst / "metrics.json")
        if per is not None:
            (dst / "per_question.json").write_text(json.dumps(per, indent=0, sort_keys=True))
        if (src / "episodes.jsonl").is_file():
            _gzip(src / "episodes.jsonl", dst / "episodes.jsonl.gz")
        return True

    kept = []
    for src in sorted(runs.iterdir()):
        if src.is_dir() and src.name.startswith("eval-") and evaluation(src, to / src.name):
            kept.append(src.name)
        if not (src.is_dir() and (src / "metrics.jsonl").is_file()):
            continue
        done = (src / "result.json").is_file()
        dst = to / (src.name if done else f"{src.name}-partial")
        shutil.rmtree(dst, ignore_errors=True)
        dst.mkdir(parents=True)
        if done:
            shutil.copy(src / "result.json", dst / "result.json")
            shutil.rmtree(to / f"{src.name}-partial", ignore_errors=True)
        if (src / "config.yaml").is_file():
            shutil.copy(src / "config.yaml", dst / "config.yaml")
        _keep_log(src, dst)
        probes = sorted((d for d in (src / "eval").glob("*") if d.is_dir()),
                        key=lambda d: (len(d.name), d.name)) if (src / "eval").is_dir() else []
        got = [d.name for d in probes if evaluation(d, dst / f"eval-{d.name}")]
        got += [d.name for d in sorted(src.glob("eval-*")) if evaluation(d, dst / d.name)]
        steps = torn = 0   # a run killed mid-write can leave its last line torn: kept as is
        for line in (src / "metrics.jsonl").read_text().splitlines():
            try:
                steps += line.strip() != "" and M.EPISODES in json.loads(line)
            except json.JSONDecodeError:
                torn += 1
        kept.append(f"{dst.name} ({steps} steps" + (f", {torn} unreadable log lines" if torn
                                                    else "")
                    + f"; {', '.join(got) or 'no evaluations'})")
    if not kept:
        raise SystemExit(f"--stage keep: no runs or evaluations under {runs}")
    for k in kept:
        print(f"kept={to}/{k}")
    print(f"keep: {len(kept)} records from {runs} in {to}")


def _evaluate(model_dir: Path, out: Path, index_dir: Path, test_file: Path, demo, args,
              ranker=None, **episode) -> dict:
    """Greedy agent evaluation on the test questions with the demo's settings; cached.
    `ranker` (a run's `RankerSettings`): the index searched through the ranker the policy
    was trained with: the one the run trained (`final/ranker`), else the configured one.
    `episode`: the run's own episode settings (max_queries, tools, prompt, ...) over the
    demo's, so a policy trained to search several sub-queries a turn is evaluated allowed
    to."""
    from seekrl.config import EvalConfig
    from seekrl.eval.evaluate import eval_policy
    from seekrl.models import load_policy
    from seekrl.retrieval.index import load_index

    if (out / "metrics.json").is_file():
        return json.loads((out / "metrics.json").read_text())
    policy, tokenizer = load_policy(str(model_dir), device=args.device,
                                    dtype=getattr(args, "dtype", "float32"))
    retriever = load_index(index_dir)
    run_info = None
    if ranker is not None:
        from seekrl.retrieval.ranker import load_ranker, ranked_retriever

        trained = model_dir / "ranker"
        spec = str(trained) if trained.is_dir() else ranker.model
        retriever = ranked_retriever(retriever, load_ranker(
            spec, kind=None if trained.is_dir() else ranker.kind, device=args.device,
            max_len=ranker.max_len, temperature=ranker.temperature, first=retriever),
            ranker.candidates)
        run_info = {"ranker": spec, "candidates": ranker.candidates}
    return eval_policy(policy, tokenizer, retriever,
                       EvalConfig(data=str(test_file), n=args.n_test, batch_size=args.eval_batch),
                       out, episode=demo.rollout.model_copy(update=episode), run_info=run_info)


def evaluate_as_trained(cfg, model_dir: Path, out: Path, index_dir: Path, test_file: Path,
                        demo, args) -> dict:
    """`_evaluate` with a run's ranker and episode settings (`cfg`, its TrainConfig): what
    every trained policy and the start they are compared with are evaluated under."""
    r = cfg.rollout
    return _evaluate(model_dir, out, index_dir, test_file, demo, args, ranker=cfg.ranker,
                     max_queries=r.max_queries, tools=r.tools, snippet_words=r.snippet_words,
                     prompt=r.prompt)


def check_trained_ranker(cfg, final: Path) -> None:
    """A run that trained its ranker is evaluated through the ranker it ended with
    (`final/ranker`): refuse a final policy without one rather than fall back, as
    `_evaluate` does for a fixed ranker, to the start ranker."""
    if cfg.ranker is not None and cfg.ranker.train and not (final / "ranker").is_dir():
        raise SystemExit(f"{final}: trained with ranker.train but holds no ranker/; "
                         f"evaluating through the start ranker ({cfg.ranker.model}) would "
                         "not be the one the policy ended with")


def _per_question(eval_dir: Path) -> dict[str, float] | None:
    """{example id: EM} of an evaluation (the mean over its samples), kept as the folder's
    `per_question.json` (a few kilobytes, unlike its trajectories); read from there when
    the trajectories are gone or older, None when neither is there. An evaluation of
    several datasets keys each question `dataset/id` (their ids may repeat: FlashRAG's
    `test_0` is in every set)."""
    kept = eval_dir / "per_question.json"
    trajectories = eval_dir / "trajectories.jsonl"
    if kept.is_file() and not (trajectories.is_file()
                               and trajectories.stat().st_mtime > kept.stat().st_mtime):
        return json.loads(kept.read_text())
    if not trajectories.is_file():
        return None
    from seekrl.rewards.metrics import exact_match

    ems: dict[tuple[str, str], list[float]] = {}
    for n, line in enumerate(trajectories.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            t = json.loads(line)
            ems.setdefault((t.get("dataset") or "", t["example_id"]), []).append(
                exact_match(t.get("answer"), t["golden_answers"]))
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise SystemExit(f"{trajectories}:{n}: expected a trajectory with example_id, "
                             f"answer and golden_answers ({e})") from None
    metrics = eval_dir / "metrics.json"
    samples = json.loads(metrics.read_text()).get("n_samples") if metrics.is_file() else None
    over = [q for (_, q), v in ems.items() if samples is not None and len(v) > samples]
    if over:   # a file appended to twice: its mean would pass for one evaluation
        raise SystemExit(f"{trajectories}: {len(over)} questions (e.g. {over[0]!r}) answered "
                         f"more often than the evaluation's {samples} sample(s) a question")
    several = len({d for d, _ in ems}) > 1
    per = {(f"{d}/{q}" if several else q): sum(v) / len(v) for (d, q), v in ems.items()}
    kept.write_text(json.dumps(per, indent=0, sort_keys=True))
    return per


def _mean_std(values: list[float]) -> tuple[float, float]:
    """The mean and the sample standard deviation (n - 1); nan where it is not defined
    (no values, or one: one seed has no spread to show, not a spread of 0)."""
    if not values:
        return float("nan"), float("nan")
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 \
        else float("nan")


def _results(runs: Path) -> list[dict]:
    """This bench's results under `runs`: `METHOD-sSEED/result.json`. Another bench's in the
    same folder (bench/simulated_search.py writes `runs/MODE-sSEED` with a `mode`) are not
    its; a run kept aside under another name (`noplan-outcome-s0`) is another setting, not
    a second seed 0, and is named on stderr as left out."""
    out = []
    for path in sorted(runs.glob("*/result.json")):
        r = json.loads(path.read_text())
        if "method" not in r:
            continue
        if "seed" not in r:
            print(f"left out: {path} (records no seed)", file=sys.stderr)
            continue
        if path.parent.name != f"{r['method']}-s{r['seed']}":
            print(f"left out: {path} (method {r['method']}, seed {r['seed']}, kept under "
                  f"another name than {r['method']}-s{r['seed']})", file=sys.stderr)
            continue
        out.append(r)
    return out


def _per_run(runs: Path, results: list[dict], on: str, tag: str = "") -> dict:
    """{(method + tag, seed): {question: EM}} of the runs' final evaluations."""
    return {(r["method"] + tag, r["seed"]): r.get("per_question")
            or _per_question(runs / f"{r['method']}-s{r['seed']}" / f"eval-{on}")
            for r in results}


def _yes_no_ids(path: Path) -> set[str]:
    """The keys, in a per-question record, of a question file's questions whose gold answers
    are all yes or no: each id, and `DATASET/id` as an evaluation of several files keys it."""
    from seekrl.data.qa import load_qa
    from seekrl.eval.evaluate import dataset_name, yes_no

    if not path.is_file():
        raise SystemExit(f"--set-aside-yes-no: {path} is not a question file")
    ids = {q.id for q in load_qa(path) if yes_no(None, q.golden_answers) is not None}
    return ids | {f"{dataset_name(path)}/{i}" for i in ids}


def _without(per: dict | None, keys: set[str]) -> dict | None:
    """A per-question record without the questions `keys`."""
    if per is None:
        return None
    return {q: em for q, em in per.items() if q not in keys}


def _report(runs: Path, started: float, named: str, on: str = "test",
            against: Path | None = None, set_aside: set[str] | None = None) -> None:
    """The table, plots and paired gains of the runs under `runs`; with `set_aside` (question
    ids), the two named gains also without those questions."""
    results = _results(runs)
    if not results:
        raise SystemExit(f"no results under {runs}: run the methods first")
    sft = runs / f"eval-sft-{on}" / "metrics.json"
    if not sft.is_file() and on == "test":
        sft = runs.parent / "eval-sft" / "metrics.json"   # the layout before --runs-dir
    sft_em = json.loads(sft.read_text())["average"]["em"] if sft.is_file() else None
    by_method: dict[str, list[dict]] = {}
    for r in results:
        by_method.setdefault(r["method"], []).append(r)
    order = sorted(by_method, key=lambda m: (m != "outcome", m))
    rows = {}
    for m in order:
        rs = by_method[m]
        em, em_sd = _mean_std([r["em"] for r in rs])
        types = sorted({t for r in rs for t in r.get("em_by_type") or {}})
        rows[m] = {"em": em, "em_sd": em_sd, "seeds": len(rs),
                   "searches": _mean_std([r["searches"] for r in rs])[0],
                   "recall": _mean_std([r["evidence_recall"] for r in rs
                                        if r.get("evidence_recall") is not None])[0],
                   "steps": _mean_std([r["steps"] for r in rs])[0],
                   "tokens": _mean_std([r["rollout_tokens"] for r in rs])[0],
                   "budget_missed": sum(not r.get("budget_met", True) for r in rs),
                   "label_tokens": _mean_std([r.get("label_tokens", 0) for r in rs])[0],
                   # a type's mean over the runs that had questions of it
                   "types": {t: _mean_std([r["em_by_type"][t] for r in rs
                                           if t in (r.get("em_by_type") or {})])
                             for t in types}}
        row = rows[m]
        print(f"em_{m}={row['em']:.4f} em_std_{m}={row['em_sd']:.4f} seeds_{m}={row['seeds']} "
              f"searches_{m}={row['searches']:.2f} evidence_recall_{m}={row['recall']:.3f} "
              f"steps_{m}={row['steps']:.1f} rollout_tokens_{m}={row['tokens']:.0f} "
              f"budget_missed_{m}={row['budget_missed']}"
              + (f" label_tokens_{m}={row['label_tokens']:.0f}" if row["label_tokens"] else ""))
        for t, (mean, sd) in row["types"].items():
            print(f"em_{m}_{t}={mean:.4f} em_std_{m}_{t}={sd:.4f}")
        for t, figures in _hops(rs).items():
            print(" ".join(f"{f}_{m}_{t}={v:.3f}" for f, v in figures.items()))
    if sft_em is not None:
        print(f"em_sft={sft_em:.4f}")
    _plot(rows, by_method, sft_em, runs / "process_ablation.png")
    print(f"plot={runs / 'process_ablation.png'}")
    from learning_curves import plot as plot_curves
    from learning_curves import runs_in

    # the same runs as the table, each seed's curve from its step log or result
    curves = plot_curves(runs_in(runs, [f"{r['method']}-s{r['seed']}" for r in results]),
                         runs / "learning_curves.png")
    print(f"curves={curves}")
    outcome = rows.get("outcome", {}).get("em")
    process = {m: r["em"] for m, r in rows.items() if m != "outcome"}
    best = max(process, key=process.get) if process else None
    missed = sum(r["budget_missed"] for r in rows.values())
    notes = _judged_alike(results)
    notes += [f"{r['method']} s{r['seed']} took the start itself (step 0)"
              for r in results if r.get("taken_step") == 0]
    start = _per_question(runs / f"eval-sft-{on}")
    # a run that began from the start rebuilt elsewhere (float32 sums in another order move
    # a few answers) is paired with that start's own evaluation, eval-sft-ON-METHOD-sSEED
    start_of = {}
    for d in sorted(runs.glob(f"eval-sft-{on}-*-s*")):
        method, _, seed = d.name.removeprefix(f"eval-sft-{on}-").rpartition("-s")
        if seed.isdigit() and (per := _per_question(d)):
            start_of[(method, int(seed))] = per
            print(f"start_of_{method}_s{seed}={d}")
    began = _began_from(runs, results)
    for run, other in _same_start(began, start_of).items():
        start_of[run] = start_of[other]
        print(f"start_of_{run[0]}_s{run[1]}={runs}/eval-sft-{on}-{other[0]}-s{other[1]} (the "
              f"start {other[0]} s{other[1]} began from: the same answers at step 0)")
    shared_groups = {began[k] for k in began if k not in start_of and began[k] is not None}
    if start is not None and len(shared_groups) > 1:
        differ = sorted(f"{m} s{s}" for (m, s), g in began.items()
                        if g is not None and (m, s) not in start_of)
        notes.append(f"runs paired with eval-sft-{on} began from {len(shared_groups)} starts "
                     f"(their step-0 dev answers differ: {', '.join(differ)}); keep each "
                     f"one's start evaluation as eval-sft-{on}-METHOD-sSEED")
    if start_of:   # with or without the shared start (a seed without either is left out)
        start = {None: start, **start_of}
    per_run = _per_run(runs, results, on)
    if unanswered := sorted(f"{m} s{s}" for (m, s), per in per_run.items() if not per):
        notes.append(f"no per-question answers kept for {', '.join(unanswered)} (unpaired)")
    # the named method first (its interval goes into the summary line), then every other
    # method against outcome-only, then each against the start
    pairs = [(m, "outcome") for m in sorted(rows, key=lambda m: m != named)
             if m != "outcome"] if "outcome" in rows else []
    pairs += [(m, "start") for m in order] if start else []
    tag = ""
    if against is not None:
        if not against.is_dir():
            raise SystemExit(f"--against: {against} is not a runs folder")
        tag = f"@{against.name}"
        theirs = _results(against)
        _say_differences(results, theirs, tag)
        per_run.update(_per_run(against, theirs, on, tag))
        pairs += [(m, m + tag) for m in order]
        their_em = {m: statistics.mean(r["em"] for r in theirs if r["method"] == m)
                    for m in {r["method"] for r in theirs}}
    found, refused = {}, {}
    for a, b in pairs:
        try:
            paired = _paired(per_run, a, b, start)
        except QuestionMismatch as e:   # this pair only: the others still stand
            print(f"paired_{a}_vs_{b}=refused ({e})")
            refused[(a, b)] = str(e)
            continue
        if paired is None:
            print(f"paired_{a}_vs_{b}=nan (no seed has both arms' per-question answers)")
            continue
        found[(a, b)] = paired
        print(paired_line(a, b, paired))
        if b != "start" and start:
            notes += _other_starts(per_run, a, b, paired["seeds"], began, start)
    nan = float("nan")
    # the arms named before the runs: outcome-only and the named process method (the best
    # of all the arms' means is biased up, and is only shown as exploratory); their means
    # over the seeds both have, which the unpaired gain takes too (an arm's extra seed is
    # another draw, not a gain)
    named_em, common = _named_means(by_method, ("outcome", named))
    gain = _gain("process_gain", found.get((named, "outcome")),
                 named_em[named] - named_em["outcome"]
                 if named in named_em and "outcome" in named_em else nan,
                 refused.get((named, "outcome")))
    rl_gain = _gain("rl_gain", found.get(("outcome", "start")),
                    outcome - sft_em if outcome is not None and sft_em is not None else nan,
                    refused.get(("outcome", "start")))
    top = max(named_em, key=named_em.get) if named_em else None
    best_em = (f"best_em={named_em[top]:.4f} ({top}"
               + (f", on seed{'s' * (len(common) > 1)} {','.join(map(str, common))}, which "
                  "both arms have" if common else "")
               + ")") if top else "best_em=nan"
    versus = "".join(
        "; " + _gain(f"{m}_vs_{m}{tag}", found.get((m, m + tag)),
                     rows[m]["em"] - their_em[m], refused.get((m, m + tag)))
        for m in order if m in their_em) if tag else ""
    if set_aside is not None:
        kept = {k: _without(v, set_aside) for k, v in per_run.items()}
        start_kept = ({k: _without(v, set_aside) for k, v in start.items()}
                      if _by_seed(start) else _without(start, set_aside))
        some = next((p for p in per_run.values() if p),
                    (start.get(None) if _by_seed(start) else start) or {})
        aside = len(some) - len(_without(some, set_aside))
        print(f"set_aside_yes_no={aside}" + ("" if aside else
              " (none of the runs' questions: is it the file they were tested on?)"))
        parts = []
        for key, (a, b) in (("process_gain", (named, "outcome")), ("rl_gain", ("outcome", "start"))):
            try:
                paired = _paired(kept, a, b, start_kept)
            except QuestionMismatch as e:
                print(f"paired_{a}_without_yes_no_vs_{b}=refused ({e})")
                paired = None
            else:
                print(paired_line(f"{a}_without_yes_no", b, paired) if paired is not None
                      else f"paired_{a}_without_yes_no_vs_{b}=nan (no seed has both arms' "
                      "per-question answers)")
            parts.append(_gain(f"{key}_without_yes_no", paired, float("nan")).split(" (")[0])
        versus += (f"; without the yes/no questions ({len(some) - aside} left): "
                   + " ".join(parts))
    print("process_ablation: " + ", ".join(
              f"{m} {r['em']:.3f}" + (f"±{r['em_sd']:.3f} ({r['seeds']} seeds)"
                                      if r["seeds"] > 1 else " (1 seed)")
              for m, r in rows.items())
          + f", {on} EM; best {best} (exploratory); named {named}; {gain}; {rl_gain}; "
          + f"{best_em}{versus}"
          + (f"; {missed} runs outside 10% of the budget" if missed else "")
          + "".join(f"; {n}" for n in notes)
          + ("; " + ", ".join(f"{m} s{s}" for m, s in sorted(start_of))
             + " paired with the start they began from" if start_of else "")
          + f" ({(time.time() - started) / 60:.0f} min this run)")


def _named_means(by_method: dict[str, list[dict]], arms: tuple[str, ...]
                 ) -> tuple[dict[str, float], list[int] | None]:
    """Each named arm's mean EM, over the seeds every named arm has run when their seed sets
    differ (the common seeds, else None): an arm with an extra seed would otherwise be
    ranked on other draws than the arm it is compared with."""
    seeds = {m: {r["seed"] for r in by_method[m]} for m in arms if m in by_method}
    common = sorted(set.intersection(*seeds.values())) if seeds else []
    uneven = len({frozenset(v) for v in seeds.values()}) > 1
    if uneven and common:
        return ({m: statistics.mean(r["em"] for r in by_method[m] if r["seed"] in common)
                 for m in seeds}, common)
    return {m: statistics.mean(r["em"] for r in by_method[m]) for m in seeds}, None


def _gain(name: str, paired: dict | None, unpaired: float, refused: str | None = None) -> str:
    """A gain for this bench's summary line as `NAME=GAIN NAME_ci=LOW..HIGH (how)`: the
    paired one (the seeds both arms have, its 95% interval) where both kept per-question
    answers, else the difference of the means, with no interval (nan..nan); `refused`
    when their per-question records answered different questions (no number stands in)."""
    if refused is not None:
        return f"{name}=refused {name}_ci=nan..nan (paired records differ: {refused})"
    if paired is None:
        return (f"{name}={unpaired:+.4f} {name}_ci=nan..nan"
                + (" (unpaired means)" if unpaired == unpaired else ""))
    return (f"{name}={paired['gain']:+.4f} {name}_ci={paired['lo']:+.4f}..{paired['hi']:+.4f} "
            f"({_how(paired)})")


def _how(paired: dict) -> str:
    seeds = paired["seeds"]
    over = ("questions only" if len(seeds) == 1 else "seeds and questions"
            + (f"; {len(seeds)} seeds barely measure the seeds' spread" if len(seeds) < 3
               else "")
            + (f"; over the seeds alone (t, {len(seeds) - 1} df) "
               f"{paired['seed_lo']:+.4f}..{paired['seed_hi']:+.4f}"
               if len(seeds) > 1 and "seed_lo" in paired else ""))
    dropped = paired.get("dropped") or []
    return (f"paired; seed{'s' * (len(seeds) > 1)} {','.join(map(str, seeds))}, "
            f"resampling {over}"
            + ("; the interval holds 0" if paired["lo"] <= 0 <= paired["hi"] else "")
            + (f"; seed{'s' * (len(dropped) > 1)} {','.join(map(str, dropped))} without "
               "the other arm left out" if dropped else ""))


def _began_from(runs: Path, results: list[dict]) -> dict[tuple[str, int], str | None]:
    """Each run's start, as its step-0 dev answers (`eval-start/per_question.json` in kept
    records, `eval/start/` in a run's own folder; in a canonical text): runs with the same
    text began from the same policy. None for a run that kept no start evaluation."""
    out = {}
    for r in results:
        run = runs / f"{r['method']}-s{r['seed']}"
        per = _per_question(run / "eval-start") or _per_question(run / "eval" / "start")
        out[(r["method"], r["seed"])] = json.dumps(per, sort_keys=True) if per else None
    return out


def _same_start(began: dict, start_of: dict) -> dict:
    """{run: the run whose start evaluation it shares} for each run without an
    `eval-sft-ON-METHOD-sSEED` of its own that began where a run with one began (both arms
    of a seed trained on the machine that rebuilt the start)."""
    out = {}
    for run, began_at in began.items():
        if run in start_of or began_at is None:
            continue
        shared = next((o for o in sorted(start_of) if began.get(o) == began_at), None)
        if shared is not None:
            out[run] = shared
    return out


def _other_starts(per_run: dict, a: str, b: str, seeds: list[int], began: dict,
                  start: dict) -> list[str]:
    """Where a seed's two arms began from different starts (rebuilt elsewhere, a few answers
    apart), a note with the gain of each arm over its own start, differenced: the start's
    part taken out of the arm against arm comparison (the paired line stays as named)."""
    apart = [s for s in seeds if None not in (began.get((a, s)), began.get((b, s)))
             and began[(a, s)] != began[(b, s)]]
    if not apart:
        return []
    own = functools.partial(_start_for, start)
    if any(own(m, s) is None for s in seeds for m in (a, b)):
        return [f"{a} and {b} began from different starts on seed{'s' * (len(apart) > 1)} "
                f"{','.join(map(str, apart))}"]
    over = {(m, s): {q: em - own(m, s)[q] for q, em in per_run[(m, s)].items()}
            for s in seeds for m in (a, b)}
    try:
        net = _paired(over, a, b, None)
    except (QuestionMismatch, KeyError):
        net = None
    tail = (f" (each over its own start: {net['gain']:+.4f}, 95% {net['lo']:+.4f}.."
            f"{net['hi']:+.4f})" if net else "")
    print(f"starts_differ_{a}_vs_{b}=" + ",".join(f"s{s}" for s in apart)
          + (f" paired_{a}_vs_{b}_over_own_starts={net['gain']:+.4f}" if net else ""))
    return [f"{a} and {b} began from different starts on seed{'s' * (len(apart) > 1)} "
            f"{','.join(map(str, apart))}{tail}"]


def _judged_alike(results: list[dict]) -> list[str]:
    """A note for each way the runs' final policies were judged that is not the same for
    all of them (the policy taken, the questions evaluated on): a mixed table compares
    other things than the methods."""
    notes = []
    for key in ("taken", "evaluated_on"):
        values = {str(r.get(key)) for r in results if key in r}
        if len(values) > 1:
            notes.append(f"runs judged with different {key}: {', '.join(sorted(values))}")
    return notes


def _headline(paired: dict | None, unpaired: float) -> str:
    """A gain for the other benches' summary lines (prorag.py, simulated_search.py): the
    paired one with its interval in words, else the difference of the means."""
    if paired is None:
        return f"{unpaired:+.4f}" + (" (unpaired means)" if unpaired == unpaired else "")
    return (f"{paired['gain']:+.4f} (95% CI {paired['lo']:+.3f} to {paired['hi']:+.3f}, "
            f"{_how(paired)})")


def _say_differences(mine: list[dict], theirs: list[dict], tag: str) -> None:
    """What a comparison with another runs folder (`--against`) compares, seed by seed:
    the config keys the two runs differ in beyond a run's own (`settings_...=`), and their
    rollout tokens (`budget_ratio_...=`, flagged outside 10%)."""
    other = {(r["method"], r["seed"]): r for r in theirs}
    from seekrl.config import TrainConfig, flat_keys

    for r in mine:
        o = other.get((r["method"], r["seed"]))
        if o is None:
            continue
        name = f"{r['method']}_s{r['seed']}_vs{tag}"
        if r.get("config") and o.get("config"):
            a, b = flat_keys(r["config"]), flat_keys(o["config"])
            try:   # today's defaults, for keys one of the two runs predates
                defaults = flat_keys(TrainConfig.model_validate(
                    {"data": r["config"]["data"]}).model_dump(mode="json"))
            except Exception:   # noqa: BLE001 - a config from another era: no defaults
                defaults = {}
            differ = _differing(a, b, defaults, _OWN_KEYS)
            # files and folders: the same run elsewhere differs in these alone
            paths = [k for k in differ if all(isinstance(v, str) and "/" in v
                                              for v in (a.get(k), b.get(k)))]
            print(f"settings_{name}="
                  + (",".join(k for k in differ if k not in paths) or "same")
                  + (f" paths_{name}={','.join(paths)}" if paths else ""))
        else:
            print(f"settings_{name}=unknown (a run kept no config)")
        if r.get("rollout_tokens") and o.get("rollout_tokens"):
            ratio = r["rollout_tokens"] / o["rollout_tokens"]
            print(f"budget_ratio_{name}={ratio:.3f}"
                  + (" outside_10%=1" if abs(ratio - 1) > 0.1 else ""))


class QuestionMismatch(ValueError):
    """Two per-question records to pair answered different questions."""


def paired_line(a: str, b: str, paired: dict) -> str:
    """One `_paired` comparison as the key=value line the reports print: each seed's gain
    labelled by its seed, and the seeds of `a` left out for want of `b`'s."""
    by_seed = "/".join(f"s{s}:{g:+.3f}" for s, g in zip(paired["seeds"], paired["by_seed"]))
    dropped = ",".join(f"s{s}" for s in paired.get("dropped") or [])
    return (f"paired_{a}_vs_{b}={paired['gain']:+.4f} "
            f"ci95_{a}_vs_{b}={paired['lo']:+.4f},{paired['hi']:+.4f} "
            + (f"seed_ci95_{a}_vs_{b}={paired['seed_lo']:+.4f},{paired['seed_hi']:+.4f} "
               if len(paired["seeds"]) > 1 and "seed_lo" in paired else "")
            + f"seeds_{a}_vs_{b}={by_seed} "
            + (f"dropped_{a}_vs_{b}={dropped} " if dropped else "")
            + f"wins_{a}_vs_{b}={paired['wins']} losses_{a}_vs_{b}={paired['losses']} "
            f"questions_{a}_vs_{b}={paired['questions']}")


def _by_seed(start: dict | None) -> bool:
    """Whether `start` holds a start per run ({None: the shared one, (method, seed): a
    run's own}) rather than one evaluation's {question: EM}."""
    return bool(start) and None in start


def _start_for(start: dict | None, method: str, seed: int) -> dict | None:
    """The start a run is paired with: its own where `start` holds one per run, else the
    shared one."""
    return (start.get((method, seed)) or start.get(None)) if _by_seed(start) else start


class _TQuantiles(dict):
    """Student's t 0.975 quantile by degrees of freedom (tabled to 10, then a series)."""

    def __missing__(self, df: int) -> float:
        z = 1.959964
        return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


_T975 = _TQuantiles({1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365,
                     8: 2.306, 9: 2.262, 10: 2.228})


def _paired(per_run: dict, a: str, b: str, start: dict | None, resamples: int = 10_000,
            seed: int = 0) -> dict | None:
    """Method `a` against method `b` (or "start": the one SFT evaluation, the same for every
    seed) on the questions and seeds both answered: the mean paired EM gain, a 95% interval
    from a two-level bootstrap (seeds with replacement, then questions with replacement,
    `resamples` times), each seed's gain, and the discordant answers summed over seeds.
    With one seed the interval is over questions only. `seeds` are the seeds used,
    `dropped` the seeds one arm has answers for and the other has not. None when no seed has both
    per-question records; every record paired must answer the same questions
    (QuestionMismatch otherwise: a gain over some of them is another comparison). `start`
    may hold a start per run (`{None: shared, (method, seed): its own}`)."""
    import numpy as np

    seeds = sorted(s for (m, s), per in per_run.items()
                   if m == a and per and (_start_for(start, a, s) if b == "start"
                                          else per_run.get((b, s))))
    if not seeds:
        return None
    dropped = sorted({s for (m, s), per in per_run.items()
                      if (m == a or (m == b and b != "start")) and per} - set(seeds))
    other = {s: _start_for(start, a, s) if b == "start" else per_run[(b, s)] for s in seeds}
    first = f"{a} seed {seeds[0]}"
    questions = sorted(per_run[(a, seeds[0])])
    for s in seeds:
        for name, per in ((f"{a} seed {s}", per_run[(a, s)]),
                          ("the start" if b == "start" else f"{b} seed {s}", other[s])):
            if set(per) != set(questions):
                raise QuestionMismatch(
                    f"{name} and {first} answered {len(per)} and {len(questions)} questions, "
                    f"{len(set(per) & set(questions))} of them the same: pair evaluations of "
                    "the same questions")
    diff = np.array([[per_run[(a, s)][q] - other[s][q] for q in questions] for s in seeds])
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, len(seeds), size=(resamples, len(seeds)))
    cols = rng.integers(0, len(questions), size=(resamples, len(questions)))
    boot = np.array([diff[r][:, c].mean() for r, c in zip(rows, cols)])
    lo, hi = np.percentile(boot, [2.5, 97.5])
    by_seed = diff.mean(axis=1)
    # the seeds alone, by Student's t: a bootstrap over n seeds shrinks their variance by
    # (n - 1) / n and takes few distinct draws (10 for 3 seeds), so with few seeds this
    # interval, wider, says how much the seeds themselves could move the gain
    half = (_T975[len(seeds) - 1] * float(by_seed.std(ddof=1)) / len(seeds) ** 0.5
            if len(seeds) > 1 else float("nan"))
    return {"gain": float(diff.mean()), "lo": float(lo), "hi": float(hi),
            "seed_lo": float(by_seed.mean()) - half, "seed_hi": float(by_seed.mean()) + half,
            "by_seed": [float(d) for d in by_seed], "seeds": seeds,
            "dropped": dropped,
            "wins": int((diff > 0).sum()), "losses": int((diff < 0).sum()),
            "questions": len(questions)}


def _bar(sd: float) -> float:
    """An error bar: none for one seed (its std is nan; the seeds' dots are drawn)."""
    return 0.0 if sd != sd else sd


def _plot(rows: dict, by_method: dict, sft_em: float | None, path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 3.8), dpi=100)
    ax1, ax2, ax3 = fig.subplots(1, 3)
    names = list(rows)
    x = range(len(names))
    ax1.bar(x, [rows[m]["em"] for m in names], yerr=[_bar(rows[m]["em_sd"]) for m in names],
            color="#7aa6d6", capsize=4)
    for i, m in enumerate(names):
        ax1.scatter([i] * len(by_method[m]), [r["em"] for r in by_method[m]], color="k", s=10,
                    zorder=3)
    if sft_em is not None:
        ax1.axhline(sft_em, color="grey", ls="--", lw=1, label=f"SFT {sft_em:.3f}")
        ax1.legend(fontsize=8)
    ax1.set_xticks(list(x), names, rotation=30, fontsize=8)
    ax1.set_ylabel("test EM (greedy), mean ± std")
    ax1.set_title("equal rollout tokens", fontsize=10)
    types = sorted({t for r in rows.values() for t in r["types"]})
    width = 0.8 / max(1, len(names))
    for j, m in enumerate(names):
        ax2.bar([i + j * width for i in range(len(types))],
                [rows[m]["types"].get(t, (0, 0))[0] for t in types], width=width, label=m,
                yerr=[_bar(rows[m]["types"].get(t, (0, 0))[1]) for t in types], capsize=2)
    ax2.set_xticks([i + 0.4 - width / 2 for i in range(len(types))], types, fontsize=8)
    ax2.set_title("test EM by question type", fontsize=10)
    ax2.legend(fontsize=7)
    ax3.bar(x, [rows[m]["searches"] for m in names], color="#9ccf9c")
    ax3.set_xticks(list(x), names, rotation=30, fontsize=8)
    ax3.set_title("searches per test episode", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    main()
