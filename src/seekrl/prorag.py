"""`seekrl prorag`: ProRAG's four stages with seekrl's own recipes, stage by stage.

data (the synthetic world at demo size, or your files) -> 1. SFT warm-up -> evaluate ->
2a. step labels by MCTS (`seekrl mcts`) -> 2b. process reward model (`seekrl prm train`) ->
3. PRM-guided refinement (`seekrl refine`: RFT or step-DPO) -> evaluate -> 4. RL with the
PRM's step scores in the dual-granularity advantage (beta = 0.3) -> evaluate -> report.

Every stage records its summary (minutes, generated tokens, its figures) in
`OUT/pipeline.json` when it finishes; `--resume` skips finished stages and refuses a changed
config. The report (`OUT/report.html`, `OUT/summary.json`) has test EM after each stage, the
PRM's held-out quality, and each stage's cost; the final policy's test episodes carry the
PRM's score on every step in the trajectory viewer (`OUT/eval_rl/viewer.html`).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable

from rich.console import Console

from seekrl.config import (
    ConfigError,
    LabelConfig,
    PRMConfig,
    ProragConfig,
    RefineConfig,
    SFTConfig,
    TrainConfig,
)
from seekrl.errors import DataError

STAGES = ("data", "sft", "eval_sft", "labels", "prm", "refine", "eval_refine", "rl", "eval_rl")


# keys each stage takes from the stage before it: a user's value would be overwritten, so
# it is refused with what to set instead (the PRM's backbone, `prm.model`, is the user's)
_FLOW_KEYS = {
    "labels": {"model": "the SFT policy; start from your own checkpoint with sft_model"},
    "prm": {"labels": "the labels stage's folder"},
    "refine": {"model": "the SFT policy; start from your own checkpoint with sft_model",
               "prm": "the PRM stage's model", "pairs": "the labels stage's folder",
               "method": "from refine_method: rft, step_dpo or none"},
    "rl": {"model": "the refined policy", "reward.prm": "the PRM stage's model"},
}


def input_paths(cfg: ProragConfig) -> dict[str, str]:
    """The files the stages read: the given ones, else where the pipeline writes them in
    `out` (the world, its index, the oracle episodes, the SFT model)."""
    out = Path(cfg.out)
    paths = {"sft_data": cfg.sft_data or str(out / "oracle_train.jsonl"),
             "train": cfg.train or str(out / "world" / "train.jsonl"),
             "test": cfg.test or str(out / "test_questions.jsonl"),
             "index": cfg.index or str(out / "index")}
    if cfg.sft_model:
        paths["sft_final"] = cfg.sft_model
    if cfg.refine_method == "none":
        paths["refined"] = paths.get("sft_final", str(out / "sft" / "final"))
    return paths


def stage_configs(cfg: ProragConfig, paths: dict[str, str]) -> dict[str, Any]:
    """Every stage's config: its preset (src/seekrl/presets/prorag/STAGE.yaml, or `presets`' copy)
    playing the pipeline's episodes, the pipeline's inputs and settings over it, the user's
    stage section over those; built at the start, each stage reading what the one before it
    writes (its `out`), so a bad key fails in seconds and a moved output folder is
    followed."""
    from seekrl.recipes.pipeline import PRESETS, stage_config

    out = Path(cfg.out)
    presets = Path(cfg.presets) if cfg.presets is not None else PRESETS / "prorag"

    def build(name: str, schema, keys: dict[str, Any], *, episode=cfg.rollout,
              own: bool = True):
        for key, why in _FLOW_KEYS.get(name, {}).items():
            section = getattr(cfg, name)
            head, _, sub = key.partition(".")
            if head in section and (not sub or (isinstance(section[head], dict)
                                                and sub in section[head])):
                raise ConfigError(f"{name}.{key}: the pipeline sets it ({why})")
        return stage_config(schema, presets / f"{name}.yaml", episode=episode, keys=keys,
                            own=getattr(cfg, name) if own else None, source=f"prorag {name}")

    layers = {"seed": cfg.seed, "train_layers": cfg.train_layers}
    stages: dict[str, Any] = {}
    stages["sft"] = build("sft", SFTConfig, {
        "model": cfg.model, "data": paths["sft_data"], "out": str(out / "sft"), **layers})
    sft_final = paths.get("sft_final", str(Path(stages["sft"].out) / "final"))
    stages["labels"] = build("labels", LabelConfig, {
        "model": sft_final, "data": paths["train"], "index": paths["index"],
        "out": str(out / "labels"), "seed": cfg.seed})
    stages["prm"] = build("prm", PRMConfig, {
        "model": sft_final, "labels": [stages["labels"].out], "out": str(out / "prm"),
        "seed": cfg.seed, "train_layers": min(4, cfg.train_layers or 4)}, episode=None)
    prm_final = str(Path(stages["prm"].out) / "final")
    refine = {"model": sft_final, "out": str(out / "refine"), "data": paths["train"],
              "method": "step_dpo" if cfg.refine_method == "step_dpo" else "rft",
              "index": paths["index"], "prm": prm_final, "pairs": [stages["labels"].out],
              **layers}
    stages["refine"] = build("refine", RefineConfig, refine)
    if cfg.refine_method != "none" and stages["refine"].steps == 0:
        raise ConfigError("refine.steps: 0 trains no refined policy (RFT's rejection-sampled "
                          "data alone), and the pipeline's RL starts from it: give steps >= 1, "
                          "refine_method=none to go from SFT to RL, or `seekrl refine` alone "
                          "for the data")
    refined = paths.get("refined", str(Path(stages["refine"].out) / "final"))
    rl = {"model": refined, "data": paths["train"], "index": paths["index"],
          "out": str(out / "rl"), **layers}
    stages["rl"] = build("rl", TrainConfig, {**rl, "reward.prm": prm_final})
    if "prm" not in stages["rl"].reward.process:   # the user's process without the PRM
        stages["rl"] = build("rl", TrainConfig, rl)
    from seekrl.recipes import mcts, refine, train
    for name, check in (("labels", mcts.check_config), ("refine", refine.check_config),
                        ("rl", train.check_config)):
        try:
            check(stages[name])
        except ConfigError as err:
            raise ConfigError(f"prorag {name}: {err}") from None
    return stages


# what a pipeline writes in its out folder
_OWNED = ("world", "index", "oracle_train.jsonl", "test_questions.jsonl", "sft", "eval_sft",
          "labels", "prm", "refine", "eval_refine", "rl", "eval_rl", "summary.json")


class _Pipeline:
    """The stage bookkeeping: `pipeline.json`, written atomically after every stage."""

    def __init__(self, cfg: ProragConfig, console: Console, resume: bool):
        self.out = Path(cfg.out)
        self.path = self.out / "pipeline.json"
        self.console = console
        saved = None
        if self.path.is_file():
            try:
                saved = json.loads(self.path.read_text())
            except (ValueError, UnicodeDecodeError) as e:
                raise DataError(f"not JSON ({e}); written by `seekrl prorag`: start again in "
                                "a new out=", path=str(self.path)) from None
            if not isinstance(saved, dict) or not isinstance(saved.get("config"), dict) \
                    or not isinstance(saved.get("stages"), dict):
                raise DataError('expected {"config": {...}, "stages": {...}} (written by '
                                "`seekrl prorag`): start again in a new out=",
                                path=str(self.path))
        if saved is not None and not resume:
            raise FileExistsError(f"{self.out} holds a pipeline run; continue it with --resume "
                                  "or choose another out=")
        if saved is None and not resume:
            # a new pipeline writes all of these, each stage over what is there: another
            # run's would be lost without a word (a run stopped before its first stage
            # ended has no pipeline.json either: --resume goes on with it)
            taken = [name for name in _OWNED if (self.out / name).is_file()
                     or ((self.out / name).is_dir() and any((self.out / name).iterdir()))]
            if taken:
                raise FileExistsError(f"{self.out} already holds {', '.join(taken)} and no "
                                      "pipeline.json: continue a pipeline stopped in its "
                                      "first stage with --resume, or choose another out=")
        mine = cfg.model_dump(mode="json")
        if saved is not None and saved["config"] != mine:
            differ = sorted(k for k in set(mine) | set(saved["config"])
                            if mine.get(k) != saved["config"].get(k))
            raise ConfigError(f"{self.path}: the run was started with another config (differ: "
                              f"{', '.join(differ)}); resume it with the same one")
        self.state = saved or {"config": mine, "stages": {}}
        self.out.mkdir(parents=True, exist_ok=True)

    def run(self, name: str, what: str, fn: Callable[[], dict]) -> dict:
        done = self.state["stages"].get(name)
        i = STAGES.index(name) + 1
        if done is not None:
            final = done.get("final")
            # a model folder the stage recorded and the next stages read: it must still be
            # there (a hub id, as sft_model may be, is no folder of this run's)
            if final and str(final).startswith(str(self.out)) and not Path(final).exists():
                raise FileNotFoundError(
                    f"{self.path}: stage {name} recorded its model at {final}, which is gone; "
                    "start again in a new out= (or restore the folder)")
            self.console.print(f"[dim]stage {i}/{len(STAGES)} {name}: done before, skipped[/]")
            return done
        self.console.rule(f"[bold]stage {i}/{len(STAGES)}[/] {what}")
        started = time.time()
        result = fn()
        if "final" in result and not result["final"]:   # recorded, it would stop every resume
            raise RuntimeError(f"stage {name} made no model (final: {result['final']!r}): "
                               "nothing for the next stage to start from")
        result["minutes"] = round((time.time() - started) / 60, 2)
        self.state["stages"][name] = result
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=1, default=str))
        os.replace(tmp, self.path)
        return result


def check_config(cfg: ProragConfig) -> tuple[dict[str, str], dict[str, Any]]:
    """The pipeline's own rules and every stage's config, built and checked without reading
    any file (what `--print-config` checks too): the input paths and the stage configs."""
    own = [cfg.train, cfg.test, cfg.index]
    if any(own) and not all(own):
        raise ConfigError("train, test and index go together (your own data), or none of them "
                          "(the synthetic world)")
    if all(own) and not (cfg.sft_data or cfg.sft_model):
        raise ConfigError("sft_data or sft_model: with your own data the warm-up needs episodes "
                          "to imitate (trajectory JSONL), or a checkpoint to start from")
    paths = input_paths(cfg)
    return paths, stage_configs(cfg, paths)


def run_prorag(cfg: ProragConfig, *, console: Console | None = None, resume: bool = False
               ) -> dict:
    from seekrl.recipes.pipeline import evaluate_greedy
    from seekrl.retrieval.open import open_retriever
    from seekrl.runtime import peak_rss_mb

    console = console or Console()
    world_paths, stages = check_config(cfg)      # every stage's keys checked now
    if cfg.train:       # questions of a `seekrl world` must meet that world's own index
        from seekrl.recipes.setup import check_world_index
        check_world_index(cfg.index, cfg.train, cfg.test)
    out = Path(cfg.out)
    pipe = _Pipeline(cfg, console, resume)

    data = pipe.run("data", "the data: synthetic world, BM25 index, oracle episodes"
                    if not cfg.train else "the data", lambda: _data(cfg, world_paths, console))
    retriever = open_retriever(data["index"])
    # greedy, the pipeline's episodes, in float32 whatever a stage trained in
    ev = dict(index=retriever, test_file=Path(data["test"]), episode=cfg.rollout,
              n=cfg.n_test, dtype="float32", console=console)

    def sft() -> dict:
        if cfg.sft_model:
            return {"final": cfg.sft_model, "skipped": True, "generated_tokens": 0}
        from seekrl.recipes.sft import run_sft
        # a stage stopped after a checkpoint (`sft.save_every`) goes on from it; one stopped
        # before any is redone (pipeline.json has already refused a changed config)
        partial = resume and _has_checkpoint(stages["sft"].out)
        s = run_sft(stages["sft"], console=console, resume=partial, overwrite=not partial)
        return {"final": s["final"], "steps": s["steps"], "loss": s["loss"],
                "generated_tokens": 0}

    sft_out = pipe.run("sft", "1. SFT warm-up", sft)
    if "sft" in cfg.evaluate:
        pipe.run("eval_sft", "evaluate the SFT policy",
                 lambda: evaluate_greedy(sft_out["final"], out / "eval_sft", **ev))

    def labels() -> dict:
        from seekrl.recipes.mcts import run_labelling
        # a fresh pipeline run never continues labels it finds (LabelWriter refuses them)
        partial = resume and (Path(stages["labels"].out) / "progress.json").is_file()
        result = run_labelling(stages["labels"].model_copy(update={"model": sft_out["final"]}),
                               console=console, resume=partial)
        if not result.get("pairs") and cfg.refine_method == "step_dpo":
            raise ConfigError(
                "refine_method=step_dpo trains on sibling pairs and the labels hold none; a "
                "resume keeps this run's settings, so start again in a new out= with more "
                "labels.search.simulations or a lower labels.search.min_gap / min_visits, or "
                "refine_method=rft")
        if not result.get("pairs"):
            console.print("[yellow]no sibling pair passed the rules: the PRM trains on "
                          "pointwise labels only (raise labels.search.simulations, or lower "
                          "min_visits / min_gap)[/]")
        return result

    lab = pipe.run("labels", f"2a. step labels ({stages['labels'].search.method}, "
                   f"{stages['labels'].search.simulations} simulations per question)", labels)

    def prm() -> dict:
        from seekrl.recipes.prm import train_prm
        # the SFT policy by default (ProRAG's choice); `prm.model` sets another backbone
        backbone = {} if "model" in cfg.prm else {"model": sft_out["final"]}
        partial = resume and _has_checkpoint(stages["prm"].out, "state.pt")   # prm.save_every
        return train_prm(stages["prm"].model_copy(update={**backbone, "labels": [lab["out"]]}),
                         console=console, resume=partial, overwrite=not partial)

    prm_out = pipe.run("prm", "2b. process reward model", prm)
    weak = prm_warning(prm_out.get("dev") or {})
    if weak:
        console.print(f"[yellow]{weak}[/]")

    def refine() -> dict:
        if cfg.refine_method == "none":
            return {"final": sft_out["final"], "skipped": True, "generated_tokens": 0}
        from seekrl.recipes.refine import RFT_SAMPLED, run_refine
        # RFT's samples, once all were drawn, are kept (and its fine-tuning's checkpoints)
        partial = resume and cfg.refine_method == "rft" and \
            (Path(stages["refine"].out) / RFT_SAMPLED).is_file()
        return run_refine(stages["refine"].model_copy(update={
            "model": sft_out["final"], "prm": prm_out["final"], "pairs": [lab["out"]]}),
            console=console, overwrite=not partial, resume=partial)

    ref = pipe.run("refine", f"3. PRM-guided refinement ({cfg.refine_method})", refine)
    if "refine" in cfg.evaluate:
        pipe.run("eval_refine", "evaluate the refined policy",
                 lambda: evaluate_greedy(ref["final"], out / "eval_refine", **ev))

    def rl() -> dict:
        from seekrl.recipes.train import Trainer
        rl_cfg = stages["rl"].model_copy(update={"model": ref["final"]})
        rl_cfg.reward = rl_cfg.reward.model_copy(update={"prm": prm_out["final"]})
        # an RL stage interrupted after a checkpoint goes on from it (pipeline.json has
        # already refused a changed config); otherwise its folder is the stage's own
        partial = resume and _has_checkpoint(rl_cfg.out)
        r = Trainer(rl_cfg, console=console, retriever=retriever, resume=partial,
                    overwrite=not partial).train()
        return {"final": r["final"], "steps": r["steps"], "generated_tokens": r["rollout_tokens"],
                "stopped": r.get("stopped")}

    rl_out = pipe.run("rl", "4. RL with PRM step scores (dual-granularity advantage)", rl)

    def eval_rl() -> dict:
        avg = evaluate_greedy(rl_out["final"], out / "eval_rl", **ev)
        _score_viewer(out / "eval_rl", prm_out["final"], device=stages["rl"].device)
        return avg

    if "rl" in cfg.evaluate:
        pipe.run("eval_rl", "evaluate the final policy; PRM scores into its viewer", eval_rl)
    summary = _report(cfg, pipe.state["stages"], console)
    summary["peak_rss_mb"] = peak_rss_mb()    # this process (a resumed run: since resuming)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def _has_checkpoint(out: str, needs: str | None = None) -> bool:
    """Whether a stage's folder holds a checkpoint it can go on from (`checkpoints/latest`
    naming a folder, with `needs` in it)."""
    from seekrl.recipes.checkpoint import latest_checkpoint

    found = latest_checkpoint(Path(out))
    return found is not None and found.is_dir() and (needs is None or (found / needs).is_file())


def _data(cfg: ProragConfig, paths: dict[str, str], console: Console) -> dict:
    if cfg.train:
        return {"train": cfg.train, "test": cfg.test, "index": cfg.index,
                "sft_data": cfg.sft_data}
    from seekrl.agent.oracle import write_oracle_trajectories
    from seekrl.data.qa import read_qa_jsonl, write_qa_jsonl
    from seekrl.data.world import generate_world, write_world
    from seekrl.recipes.pipeline import DemoConfig, demo_world
    from seekrl.retrieval.index import build_index, load_index

    out = Path(cfg.out)
    world = generate_world(demo_world(DemoConfig(seed=cfg.seed)))   # the demo's world
    written = write_world(world, out / "world")
    index_dir = build_index(written["corpus"], out / "index", "bm25", overwrite=True,
                            show_progress=False)
    # the oracle's own file: a given sft_data is the user's, read by SFT, never written over
    oracle = write_oracle_trajectories(read_qa_jsonl(written["train"]), load_index(index_dir),
                                       out / "oracle_train.jsonl", k=cfg.rollout.topk)
    write_qa_jsonl(paths["test"], read_qa_jsonl(written["test"])[:cfg.n_test])
    console.print(f"{world.stats()['docs']} documents; {oracle.summary()}")
    return {"train": str(written["train"]), "test": paths["test"], "index": str(index_dir),
            "sft_data": paths["sft_data"]}


def _score_viewer(run_dir: Path, prm_dir: str, *, device: str = "cpu") -> None:
    """The PRM's score of every step of the evaluated episodes, kept as `Step.value`, and
    the viewer drawn again with them."""
    from seekrl.agent.trajectory import read_trajectories, write_trajectories
    from seekrl.eval.report import write_viewer
    from seekrl.rewards.prm import load_scorer

    path = run_dir / "trajectories.jsonl"
    trajs = read_trajectories(path)
    scorer = load_scorer(prm_dir, device=device)
    for t, row in zip(trajs, scorer.score_steps(trajs)):
        for s, v in zip(t.steps, row):
            s.value = round(v, 4)
    write_trajectories(path, trajs)
    write_viewer(run_dir, tokenizer=scorer.tokenizer)


PRM_CHANCE_MARGIN = 0.05   # a held-out AUC within this of 0.5 is no better than chance


def prm_warning(dev: dict) -> str | None:
    """A sentence when the PRM's held-out figures do not show it ranks steps better than
    chance: its scores then add noise, not credit, to refinement's filter and to RL's step
    advantages (normalised, a near-constant score becomes unit-size noise)."""
    auc, n = dev.get("auc"), dev.get("points", 0)
    if auc is None and dev.get("pair_accuracy") is not None and dev.get("pairs"):
        acc = dev["pair_accuracy"]      # a pairwise PRM, or held-out steps of one class
        if acc < 0.5 + PRM_CHANCE_MARGIN:
            return (f"The PRM orders held-out sibling steps no better than chance (pair "
                    f"accuracy {acc:.3f} on {dev['pairs']}): its step scores add noise, not "
                    "credit; label more questions before trusting them.")
        return None
    if auc is None:
        return (f"The PRM's held-out AUC could not be measured ({n} held-out steps, "
                f"positive share {dev.get('positive_share')}): nothing shows its step scores "
                "carry credit; label more questions (labels.questions) before trusting them.")
    if auc < 0.5 + PRM_CHANCE_MARGIN:
        return (f"The PRM is no better than chance on held-out steps (AUC {auc:.3f} on {n}): "
                "its step scores add noise, not credit; label more questions "
                "(labels.questions, labels.search.simulations) or train it longer (prm.steps).")
    return None


def _report(cfg: ProragConfig, stages: dict, console: Console) -> dict:
    from seekrl.eval.training_report import write_training_report

    out = Path(cfg.out)
    # an evaluation's row holds the mean per episode: its cost is the total over the test
    # questions (greedy, and outside the training budget the benchmark compares)
    cost = {name: {"minutes": s.get("minutes"), "generated_tokens": round(
        (s.get("generated_tokens") or 0)
        * (s.get("trajectories", cfg.n_test) if name.startswith("eval_") else 1))}
        for name, s in stages.items()}
    def got(stage: str, key: str):   # None for a policy not evaluated (`evaluate`)
        return (stages.get(f"eval_{stage}") or {}).get(key)

    summary = {
        "n_test": cfg.n_test, "em_sft": got("sft", "em"), "em_refine": got("refine", "em"),
        "em_rl": got("rl", "em"), "f1_sft": got("sft", "f1"), "f1_refine": got("refine", "f1"),
        "f1_rl": got("rl", "f1"), "searches_sft": got("sft", "searches"),
        "searches_rl": got("rl", "searches"),
        "labels": {k: stages["labels"].get(k) for k in
                   ("questions", "simulations", "simulations_per_s", "pairs", "nodes",
                    "labelled_episodes", "generated_tokens", "rejected")},
        "prm_dev": stages["prm"].get("dev"), "prm_dev_at_start": stages["prm"].get("dev_at_start"),
        "prm_warning": prm_warning(stages["prm"].get("dev") or {}),
        "refine": {k: stages["refine"].get(k) for k in
                   ("method", "sampled", "kept", "left_out", "pairs", "generated_tokens")},
        "rl_steps": stages["rl"].get("steps"),
        "generated_tokens": {"labels": stages["labels"].get("generated_tokens", 0),
                             "refine": stages["refine"].get("generated_tokens", 0),
                             "rl": stages["rl"].get("generated_tokens", 0)},
        "stage_cost": cost,
        "minutes": round(sum(s.get("minutes") or 0 for s in stages.values()), 2),
    }
    summary["generated_tokens"]["total"] = sum(summary["generated_tokens"].values())
    dev = summary["prm_dev"] or {}
    ems = {name: "not evaluated" if summary[key] is None else f"{summary[key]:.3f}"
           for name, key in (("sft", "em_sft"), ("refine", "em_refine"), ("rl", "em_rl"))}
    notes = [f"Test EM on the same {cfg.n_test} questions: SFT {ems['sft']}, after "
             f"refinement {ems['refine']}, after PRM-supervised RL {ems['rl']}.",
             "PRM on held-out questions: " + ", ".join(f"{k} {v}" for k, v in dev.items()) + "."
             + (f" {prm_warning(dev)}" if prm_warning(dev) else ""),
             "Cost per stage (minutes, generated tokens): " + "; ".join(
                 f"{k} {v['minutes']} min, {v['generated_tokens']} tok" for k, v in cost.items())
             + "."]
    logs = {name: out / name / "metrics.jsonl" for name in ("sft", "prm", "refine", "rl")
            if (out / name / "metrics.jsonl").is_file()}
    if (out / "refine" / "sft" / "metrics.jsonl").is_file():
        logs["refine"] = out / "refine" / "sft" / "metrics.jsonl"
    evals = {label: out / name for label, name in (("SFT", "eval_sft"),
                                                   ("refined", "eval_refine"),
                                                   ("RL + PRM", "eval_rl"))
             if name in stages}
    report = write_training_report(out / "report.html", logs=logs, evals=evals,
                                   title="seekrl prorag", notes=notes)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    console.rule("[bold]done")
    console.print(f"Test EM ({cfg.n_test} questions): SFT [bold]{ems['sft']}[/] -> "
                  f"refined [bold]{ems['refine']}[/] -> RL + PRM "
                  f"[bold]{ems['rl']}[/]; PRM dev AUC {dev.get('auc')}, pair accuracy "
                  f"{dev.get('pair_accuracy')}\nreport -> {report}\nsummary -> "
                  f"{out / 'summary.json'} ({summary['minutes']} min)")
    return summary
