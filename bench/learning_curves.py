"""Learning curves of RL runs: EM at each evaluation against RL steps and against generated
rollout tokens, one line per seed of each arm, and the training reward per step.

    .venv/bin/python bench/learning_curves.py bench/records/decide bench/records/dev \\
        --out /tmp/learning_curves.png

Each argument is a run folder or a folder of them (`bench/process_ablation.py`'s runs
folder, whose `--stage report` draws `learning_curves.png` beside `process_ablation.png`),
or a run kept as one archive (`bench/records/demo-dev/*/*.tar.gz`, with its start's dev
evaluation beside it).
A run is read from what it kept: its `result.json` (the bench's record: final EM, steps,
rollout tokens, `train_reward`, the dev `curve` of (tokens, EM)) and its step log
(`metrics.jsonl.gz` or `metrics.jsonl`), which, where kept, gives every step's reward and
tokens and every dev evaluation's step; a folder holding only a log and its `config.yaml`
(a run kept before it finished) is drawn from those. A runs folder's SFT start
(`eval-sft-test/`, `eval-sft-dev/`) is each seed's point at step 0 on those questions.

Drawn: dev EM at each periodic evaluation (solid, dots), the final evaluation (a star on
test, a diamond on dev, joined by a dotted line to the start's EM on the same questions), one
colour per arm and one line style per seed; the reward of every step, thin per seed and
thick the arm's mean. A second row says why a curve did or did not rise, per step from the
step log: the share of groups whose rewards vary (the signal a group-relative advantage
has), the KL to the start and the clip fraction (how far the updates move the policy), and
the policy's entropy (how much its rollouts explore). Prints each run's `trend_...=` lines
(those figures' and the rollouts' EM, reward and searches: the mean over the first and the
last ten steps and the slope a step with its 95% interval, as `seekrl report`'s trend
table), `runs=`, `arms=`,
`evaluations=` and `plot=`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from seekrl.eval.training_report import trend
from seekrl.rl import step_metrics as M

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pack_run import ARCHIVES, KeptRun  # noqa: E402

# a result.json's per-step lists are named TRAIN + the step figure's name
TRAIN = "train_"

RESULT, LOGS, CONFIG = "result.json", ("metrics.jsonl.gz", "metrics.jsonl"), "config.yaml"
PARTIAL = "-partial"   # the folder suffix of a run kept while it was still going
SEED_STYLES = ("-", "--", ":", "-.")
# the second row: why a curve moved, (metric, axis label, panel title)
HEALTH = ((M.GROUPS_WITH_SIGNAL, "groups whose rewards vary", "signal: share of groups with signal"),
          (M.KL, "KL to the start (a token)", "how far the policy moved from the start"),
          (M.CLIP_FRAC, "clip fraction", "the clip: only several updates a step move it"),
          (M.ENTROPY, "entropy (a token)", "exploration: the policy's entropy"))
# the figures whose trend over a run `trends` prints: the rollouts' EM and reward, and HEALTH's
TRENDS = (M.EM, M.REWARD, M.SEARCHES, *(key for key, _, _ in HEALTH))
# the final evaluation's marker by its questions: a dev final and a test final are not one
# scale (tuning is read on dev, the claim on test)
FINAL_MARKERS = {"test": "*", "dev": "D"}


@dataclass
class Run:
    """What one run's records say about its learning: per step its reward and cumulative
    rollout tokens, its dev evaluations (step or tokens may be unknown in an old record)
    and its final evaluation."""

    arm: str
    seed: int | None
    steps: list[int] = field(default_factory=list)
    reward: list[float | None] = field(default_factory=list)
    searches: list[float | None] = field(default_factory=list)   # a question's, per step
    tokens: list[int | None] = field(default_factory=list)   # cumulative, after each step
    dev: list[tuple[int | None, int | None, float]] = field(default_factory=list)
    final: tuple[int | None, int | None, float] | None = None
    final_on: str = "test"
    start: dict[str, float] = field(default_factory=dict)   # questions -> the start's EM
    dev_searches: list[tuple[int, float]] = field(default_factory=list)   # (step, searches)
    # per step, from the step log: TRENDS' figures (None where a step did not log one)
    per_step: dict[str, list[float | None]] = field(default_factory=dict)
    start_searches: float | None = None   # the start's on dev, when evaluated there
    partial: bool = False   # kept before it finished (a `RUN-partial` folder)

    def points(self, key: str) -> list[tuple[int, float]]:
        """(step, value) for the steps whose log holds a number for `key`."""
        return [(s, v) for s, v in zip(self.steps, self.per_step.get(key, ()))
                if isinstance(v, (int, float))]


# what a kept archive (`bench/records`) holds of its start: the start's dev evaluation
START_IN_ARCHIVE = "start-eval-dev/metrics.json"


def _read_log(kept: KeptRun) -> list[dict] | None:
    for name in LOGS:
        text = kept.text(name)
        if text is not None:   # a run killed while writing leaves a torn last line
            return [r for r in map(_loads, text.splitlines()) if r is not None]
    return None


def _loads(line: str) -> dict | None:
    try:
        r = json.loads(line)
    except json.JSONDecodeError:
        return None
    return r if isinstance(r, dict) else None


def _seed_of(kept: KeptRun, result: dict) -> int | None:
    if isinstance(result.get("seed"), int):
        return result["seed"]
    config = kept.text(CONFIG)
    if config is not None:
        import yaml

        seed = (yaml.safe_load(config) or {}).get("seed")
        if isinstance(seed, int):
            return seed
    found = re.search(r"-s(\d+)(?:-|$)", kept.name)
    return int(found.group(1)) if found else None


def _arm_of(kept: KeptRun, result: dict, seed: int | None) -> str:
    """The method where the folder (or archive) is named METHOD-sSEED, else its name without
    the seed: a run kept under another name (`noplan-outcome-s0`) is another setting. A
    run kept before it finished (`outcome-s1-partial`) is its arm's: the same setting. An
    archive whose name holds no seed (`records.tar.gz`) is its method's."""
    name = kept.name.removesuffix(PARTIAL)
    method = result.get("method") or result.get("mode")
    if method and name == f"{method}-s{seed}":
        return method
    if method and kept.packed and not re.search(r"-s\d+(?:-|$)", name):
        return method
    return re.sub(rf"-s{seed}(?=-|$)", "", name) if seed is not None else name


def _dev_steps(result: dict, n: int) -> list[int | None]:
    """The steps of an old record's n dev evaluations (its curve kept only their tokens):
    every `eval.every` steps, the last at the run's last step."""
    every = ((result.get("config") or {}).get("eval") or {}).get("every")
    steps = result.get("steps")
    if not every or not isinstance(steps, int):
        return [None] * n
    return [min(i * every, steps) for i in range(1, n + 1)]


def read_run(folder: Path) -> Run | None:
    """The run kept in `folder` (or in a kept archive), or None when it holds neither a
    result nor a step log. An archive's start is the dev evaluation it kept beside the run."""
    kept = KeptRun(folder)
    text = kept.text(RESULT)
    result = json.loads(text) if text is not None else {}
    log = _read_log(kept)
    if not result and log is None:
        return None
    seed = _seed_of(kept, result)
    run = Run(arm=_arm_of(kept, result, seed), seed=seed,
              final_on=result.get("evaluated_on", "test"),
              partial=kept.name.endswith(PARTIAL))
    start = kept.text(START_IN_ARCHIVE) if kept.packed else None
    if start is not None:
        average = json.loads(start).get("average") or {}
        if isinstance(average.get("em"), (int, float)):
            run.start = {"dev": float(average["em"])}
        if isinstance(average.get(M.SEARCHES), (int, float)):
            run.start_searches = float(average[M.SEARCHES])
    if log is not None:
        by_step = {r[M.STEP]: r for r in log if M.EPISODES in r}   # a resumed step: the later
        run.steps = sorted(by_step)
        run.reward = [by_step[s].get(M.REWARD) for s in run.steps]
        run.searches = [by_step[s].get(M.SEARCHES) for s in run.steps]
        run.tokens = [by_step[s].get(M.ROLLOUT_TOKENS_TOTAL) for s in run.steps]
        run.per_step = {key: [by_step[s].get(key) for s in run.steps] for key in TRENDS}
        tokens_at = dict(zip(run.steps, run.tokens))
        dev_em = M.DEV + M.EM
        # an evaluation at step 0 (eval.at_start) is the start's, before any token
        run.dev = [(r[M.STEP], 0 if r[M.STEP] == 0 else tokens_at.get(r[M.STEP]), r[dev_em])
                   for r in log if dev_em in r]
        run.dev_searches = [(r[M.STEP], r[M.DEV + M.SEARCHES]) for r in log
                            if M.DEV + M.SEARCHES in r]
    elif result:
        run.reward = list(result.get(TRAIN + M.REWARD) or [])
        run.steps = list(range(1, len(run.reward) + 1))
        run.searches = list(result.get(TRAIN + M.SEARCHES) or [None] * len(run.steps))
        per_step = result.get(TRAIN + M.ROLLOUT_TOKENS)
        if per_step and None not in per_step:
            total = 0
            for t in per_step:
                total += t
                run.tokens.append(total)
        else:
            run.tokens = [None] * len(run.steps)
        curve = result.get("curve") or []
        run.dev = [(s, t, em) for s, (t, em) in zip(_dev_steps(result, len(curve)), curve)]
    if isinstance(result.get("em"), (int, float)):
        step, tokens = result.get("steps"), result.get("rollout_tokens")
        if result.get("taken") == "best":   # judged by its best dev evaluation's policy
            step = result.get("taken_step")
            tokens = 0 if step == 0 else dict(zip(run.steps, run.tokens)).get(step)
        run.final = (step, tokens, float(result["em"]))
    return run


def _start_searches(runs_dir: Path) -> float | None:
    """The SFT start's searches a question on the dev questions, if it was evaluated there."""
    path = runs_dir / "eval-sft-dev" / "metrics.json"
    if path.is_file():
        value = (json.loads(path.read_text()).get("average") or {}).get(M.SEARCHES)
        return float(value) if isinstance(value, (int, float)) else None
    return None


def _start(runs_dir: Path) -> dict[str, float]:
    """The SFT start's EM per question set it was evaluated on, from a runs folder."""
    out = {}
    for on, path in (("test", runs_dir.parent / "eval-sft" / "metrics.json"),   # old layout
                     ("test", runs_dir / "eval-sft-test" / "metrics.json"),
                     ("dev", runs_dir / "eval-sft-dev" / "metrics.json")):
        if path.is_file():
            em = (json.loads(path.read_text()).get("average") or {}).get("em")
            if isinstance(em, (int, float)):
                out[on] = float(em)
    return out


def runs_in(runs_dir: Path, names: list[str] | None = None) -> list[Run]:
    """The runs in a runs folder (only the subfolders `names`, when given), each with the
    folder's SFT start."""
    start, searches = _start(runs_dir), _start_searches(runs_dir)
    folders = [runs_dir / n for n in names] if names is not None \
        else sorted(d for d in runs_dir.iterdir() if d.is_dir())
    found = [r for r in map(read_run, folders) if r is not None]
    for r in found:
        r.start, r.start_searches = start, searches
    return found


def read_runs(paths: list[Path]) -> list[Run]:
    """Every run under `paths` (run folders, folders of them, or kept archives), arms
    prefixed with their folder's name when several folders of runs are given (the same
    method in two settings); an archive's arm is its name without the seed, or its
    method."""
    runs = []
    for path in paths:
        if path.name.endswith(ARCHIVES) and path.is_file():   # a kept run, with its start
            one = read_run(path)
            if one is None:
                raise SystemExit(f"{path}: the archive holds neither a result.json nor a "
                                 "step log")
            runs.append(one)
            continue
        if not path.is_dir():
            raise SystemExit(f"{path}: no such folder or kept run (.tar.gz)")
        one = read_run(path)
        if one is not None:   # a single run: its runs folder's start, if it has one
            one.start, one.start_searches = _start(path.parent), _start_searches(path.parent)
            runs.append(one)
            continue
        found = runs_in(path)
        if len(paths) > 1:
            for r in found:
                r.arm = f"{path.name}/{r.arm}"
        runs += found
    return runs


def trends(run: Run) -> list[str]:
    """`trend_ARM_sSEED_FIGURE=FIRST..LAST slope=S±CI` lines for a run's step log (the
    training report's trend: the means over the first and last ten steps, or a third of a
    shorter run, and the slope a step with its 95% interval)."""
    lines = []
    for key in TRENDS:
        points = run.points(key)
        t = trend(*zip(*points)) if points else None
        if t is not None:
            lines.append(f"trend_{run.arm}_s{run.seed}_{key}={t['first']:.4g}..{t['last']:.4g} "
                         f"slope={t['slope']:+.2g}±{t['slope_ci']:.2g}")
    return lines


def plot(runs: list[Run], path: Path) -> Path:
    """EM against steps, EM against rollout tokens, training reward against steps, and
    searches a question against steps (in training, and greedy on the dev probe); below
    them the HEALTH figures against steps."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    arms = sorted({r.arm for r in runs}, key=lambda a: (not a.endswith("outcome"), a))
    colour = {a: f"C{i % 10}" for i, a in enumerate(arms)}
    seeds = sorted({r.seed for r in runs if r.seed is not None})
    style = {s: SEED_STYLES[i % len(SEED_STYLES)] for i, s in enumerate(seeds)}
    fig = Figure(figsize=(20, 8.4), dpi=100, layout="constrained")
    (by_step, by_tokens, rewards, searches), health = fig.subplots(2, 4)
    for r in runs:
        c, ls = colour[r.arm], style.get(r.seed, "-")
        for ax, x in ((by_step, 0), (by_tokens, 1)):
            dev = [(p[x], p[2]) for p in r.dev if p[x] is not None]
            if "dev" in r.start and dev and dev[0][0] != 0:
                dev.insert(0, (0, r.start["dev"]))
            if dev:
                ax.plot(*zip(*dev), color=c, ls=ls, marker="o", markersize=3, lw=1.2)
            if r.final is not None and r.final[x] is not None:
                line = [(r.final[x], r.final[2])]
                if r.final_on in r.start:
                    line.insert(0, (0, r.start[r.final_on]))
                ax.plot(*zip(*line), color=c, ls=":", lw=0.8)
                ax.plot([r.final[x]], [r.final[2]], color=c, ls="none", markersize=8,
                        marker=FINAL_MARKERS.get(r.final_on, "s"))
        points = [(s, v) for s, v in zip(r.steps, r.reward) if v is not None]
        if points:
            rewards.plot(*zip(*points), color=c, ls=ls, lw=0.8, alpha=0.6)
        # the hop decision: a policy that stops after one search shows here first
        points = [(s, v) for s, v in zip(r.steps, r.searches) if v is not None]
        if points:
            searches.plot(*zip(*points), color=c, ls=ls, lw=0.8, alpha=0.6)
        dev = list(r.dev_searches)
        if r.start_searches is not None and dev and dev[0][0] != 0:
            dev.insert(0, (0, r.start_searches))
        if dev:
            searches.plot(*zip(*dev), color=c, ls=ls, marker="o", markersize=4, lw=1.6)
        for ax, (key, _, _) in zip(health, HEALTH):
            points = r.points(key)
            if points:
                ax.plot(*zip(*points), color=c, ls=ls, lw=0.8, alpha=0.8)
    # an arm's mean over its seeds, step by step: one step's reward is mostly which
    # questions it drew, and the seeds draw differently
    for arm in arms:
        per_step: dict[int, list[float]] = {}
        for r in runs:
            if r.arm == arm:
                for s, v in zip(r.steps, r.reward):
                    if v is not None:
                        per_step.setdefault(s, []).append(v)
        if sum(r.arm == arm for r in runs) > 1 and per_step:
            xs = sorted(per_step)
            rewards.plot(xs, [sum(per_step[s]) / len(per_step[s]) for s in xs],
                         color=colour[arm], lw=2.2)
    for ax in (by_step, by_tokens):
        ax.set_ylabel("EM (greedy)")
        ax.grid(True, alpha=0.3)
        if not ax.lines:
            ax.text(0.5, 0.5, "no evaluation kept", ha="center", va="center",
                    transform=ax.transAxes, color="grey")
    for ax in (by_step, rewards, searches):
        ax.set_xlabel("RL step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    by_tokens.set_xlabel("generated rollout tokens")
    by_step.set_title("EM: dev every N steps (dots), final (star: test, diamond: dev); "
                      "step 0: the start", fontsize=8.5)
    by_tokens.set_title("the same against rollout tokens", fontsize=9)
    rewards.set_ylabel("training reward (the step's draw)")
    rewards.set_title("thin: each seed; thick: the arm's mean over seeds", fontsize=9)
    rewards.grid(True, alpha=0.3)
    searches.set_ylabel("searches a question")
    searches.set_title("thin: in training; dots: greedy on dev (step 0: the start)", fontsize=9)
    searches.grid(True, alpha=0.3)
    for ax, (_, label, title) in zip(health, HEALTH):
        ax.set_xlabel("RL step")
        ax.set_ylabel(label)
        ax.set_title(title, fontsize=9)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
        if not ax.lines:   # an old record, or a run without a reference model (KL)
            ax.text(0.5, 0.5, "not in the step logs", ha="center", va="center",
                    transform=ax.transAxes, color="grey")
    handles = [Line2D([], [], color=colour[a], lw=2, label=a) for a in arms]
    handles += [Line2D([], [], color="k", ls=style[s], label=f"seed {s}") for s in seeds]
    rewards.legend(handles=handles, fontsize=7, ncol=2)
    going = [f"{r.arm} seed {r.seed} (step {r.steps[-1] if r.steps else 0})"
             for r in runs if r.partial]
    fig.suptitle("seekrl: learning curves, one line per seed"
                 + ("; still going: " + ", ".join(going) if going else ""), fontsize=11)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    _palette(path)
    return path


def _palette(path: Path) -> None:
    """The PNG in 64 colours (a third of the bytes, the same lines): kept records travel
    with every GPU call, under a size limit (tools/gpu/prepare)."""
    from PIL import Image  # matplotlib's own dependency

    with Image.open(path) as im:
        small = im.convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path,
                    help="run folders, folders of runs, or kept runs (.tar.gz)")
    ap.add_argument("--out", type=Path, default=None,
                    help="the PNG (default: learning_curves.png in the first folder, or "
                         "beside the first archive)")
    args = ap.parse_args()
    runs = read_runs(args.folders)
    if not runs:
        raise SystemExit(f"no runs under {', '.join(map(str, args.folders))}")
    first = args.folders[0]
    out = plot(runs, args.out or (first.parent if first.is_file() else first)
               / "learning_curves.png")
    for r in runs:
        for line in trends(r):
            print(line)
    print(f"runs={len(runs)} arms={len({r.arm for r in runs})} "
          f"evaluations={sum(len(r.dev) + (r.final is not None) for r in runs)}")
    print(f"plot={out}")


if __name__ == "__main__":
    main()
