"""`seekrl demo`: the whole pipeline on the built-in synthetic world, on a laptop CPU.

world -> BM25 index -> oracle trajectories -> evaluate the untrained bundled policy ->
SFT warm-up -> evaluate -> RL (GRPO by default) -> evaluate -> report. Every evaluation is
greedy, on the same test questions, with the same rollout settings, so the three EM
figures in `summary.json` (`em_untrained`, `em_sft`, `em_rl`) compare like with like.

With `process` (`seekrl demo --process evidence`), a second RL run starts from the same SFT
checkpoint with a process-supervision method (`rl/methods.py`) and the same budget of
generated rollout tokens as the outcome run (so Monte-Carlo continuations and tree sharing
are paid for), is evaluated on the same questions, and the report gains its row
(`em_rl_process`). Both runs keep their training rollouts with each step's process reward
and value in the trajectory viewer (`rl*/rollouts/step-N/viewer.html`).

The defaults are chosen for a 2-core CPU and under half an hour where the CPU multiplies
bfloat16 natively (about 24 minutes; in float32 on AVX2 alone each model stage takes
1.4-2 times as long): short documents (the policy reads every retrieved token on every
update), two documents per search, 1-3 hop questions, and only the top `train_layers`
transformer blocks trained (backpropagation stops there, about twice as many updates per
minute as full fine-tuning). The SFT warm-up takes most of the time: 50 steps with the
lookup plan's tokens weighted and the hop counts drawn evenly, so that the plan follows
the question (a shorter one planned two lookups for every question, and no RL setting
tried moved that). The two stages' settings are YAML presets (src/seekrl/presets/demo/sft.yaml,
rl.yaml) under `DemoConfig`'s world and episodes; its `sft` / `rl` keys (and the CLI's
options) make every stage longer or bigger, `presets` reads a copy of them you edited.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.console import Console

from seekrl.agent.oracle import write_oracle_trajectories
from seekrl.data.qa import read_qa_jsonl
from seekrl.data.world import generate_world, write_world
from seekrl.eval.show import print_hits
from seekrl.recipes.pipeline import (
    DemoConfig,
    demo_dtype,
    demo_world,
    evaluate_greedy,
    rl_config,
    sft_config,
)
from seekrl.retrieval.index import build_index, load_index
from seekrl.runtime import peak_rss_mb


class _Clock:
    """Says where the demo is and roughly how long is left, from planned stage times
    corrected by what the stages took so far."""

    def __init__(self, console: Console, plan: dict[str, float]):
        self.console, self.plan = console, dict(plan)
        self.started = time.time()
        self.stage_started = self.started
        self.taken: dict[str, float] = {}
        self.peak_mb: dict[str, float | None] = {}   # the process's peak RSS after each stage
        self.i = 0

    def stage(self, key: str, what: str) -> None:
        now = time.time()
        if self.i:
            self.taken[list(self.plan)[self.i - 1]] = (now - self.stage_started) / 60
            self.peak_mb[list(self.plan)[self.i - 1]] = peak_rss_mb()
        self.stage_started = now
        self.i += 1
        left = sum(v for k, v in list(self.plan.items())[self.i - 1:])
        evals = [v for k, v in self.taken.items() if k.startswith("eval")]
        if evals:  # evaluations take about as long as the first one did
            left += sum(max(evals) - v for k, v in list(self.plan.items())[self.i - 1:]
                        if k.startswith("eval"))
        self.console.rule(f"[bold]stage {self.i}/{len(self.plan)}[/] {what}  [dim]"
                          f"({(now - self.started) / 60:.1f} min in, about {max(left, 0.1):.0f} "
                          "min left)[/]")

    def minutes(self) -> float:
        return round((time.time() - self.started) / 60, 2)


# what a demo run writes into its folder: a folder holding any of them holds a demo run,
# and `overwrite` removes them all before the new one starts
DEMO_OUTPUTS = ("demo_config.json", "world", "index", "oracle_train.jsonl",
                "test_questions.jsonl", "eval_untrained", "sft", "eval_sft", "rl", "eval_rl",
                "rl_process", "eval_rl_process", "report_evals.json", "report.html",
                "report_files", "summary.json")


def run_demo(out: str | Path = "runs/demo", cfg: DemoConfig | None = None, *,
             console: Console | None = None, overwrite: bool = False) -> dict:
    """The demo into `out`; a folder that holds a demo run already is refused unless
    `overwrite`, which removes the old run's files once the settings are checked."""
    from seekrl.eval.training_report import write_training_report
    from seekrl.models import resolve_model
    from seekrl.recipes.checkpoint import remove_outputs
    from seekrl.recipes.sft import run_sft

    cfg = cfg or DemoConfig()
    console = console or Console()
    out = Path(out)
    # the settings first: nothing is written or removed before they are checked
    world_cfg = demo_world(cfg)
    if cfg.process:
        from seekrl.rl.methods import NEEDS_PRM, PROCESS_METHODS, method_overrides
        if cfg.process not in PROCESS_METHODS:   # a bad name fails now
            method_overrides(cfg.process, group_size=2)
        if cfg.process in NEEDS_PRM:
            raise ValueError(f"--process {cfg.process}: needs a trained process reward model, "
                             "which the demo does not train: run `seekrl prorag` (the whole "
                             "pipeline) or `seekrl train --process prm reward.prm=DIR`")
    resolve_model(cfg.model)      # a path that is not there fails now, not after the world
    from seekrl.models import DTYPES, MIXED

    dtype = demo_dtype(cfg)
    if dtype not in DTYPES and dtype not in MIXED:
        raise ValueError(f"--dtype: expected auto, {', '.join([*DTYPES, *MIXED])}; got {cfg.dtype!r}")
    planned_sft, planned = _check_stages(cfg, out)   # every stage's settings, before the
    # old run goes. Planned stage minutes: the 3 seeds of 2026-11-27 on 2 CPU cores took
    # 0.1 / 1.0-1.2 / 5.5-5.9 (20 SFT steps) / 1.2-1.8 / 6.9-7.4 (3 steps) / 0.9-1.6, and
    # 50 SFT steps took 13.9-14.2 (2026-12-06; bench/RESULTS.md, "The demo")
    rl_minutes = (2.5 * planned.steps if planned.max_minutes is None
                  else planned.max_minutes + 2.0)
    # (a preset that counts epochs instead: about 20 steps' worth, as planned before)
    plan = {"world": 0.1, "eval_untrained": 1.2,
            "sft": 0.29 * (planned_sft.max_steps or 20), "eval_sft": 1.6,
            "rl": rl_minutes, "eval_rl": 1.6}
    if cfg.process:
        plan.update(rl_process=rl_minutes, eval_rl_process=1.6)
    if dtype not in MIXED:   # the plan above is bf16-mixed's; float32 on 2 AVX2-only cores
        # took 1.4-2.1x each model stage, 1.6x in all (bench/RESULTS.md, "The demo")
        plan = {k: v if k == "world" or (k.startswith("rl") and planned.max_minutes is not None)
                else round(1.6 * v, 2) for k, v in plan.items()}
    held = [name for name in DEMO_OUTPUTS if (out / name).exists()] if out.is_dir() else []
    if held and not overwrite:
        raise FileExistsError(f"--out: {out} already holds a demo run ({', '.join(held[:4])}"
                              f"{', ...' if len(held) > 4 else ''}); pass --overwrite to "
                              "replace it, or choose another --out")
    remove_outputs(out, held)
    out.mkdir(parents=True, exist_ok=True)
    (out / "demo_config.json").write_text(json.dumps(cfg.model_dump(mode="json"), indent=2))
    clock = _Clock(console, {**plan, "report": 0.2})
    if cfg.dtype == "auto":   # which one, and why: the two differ several-fold in time
        console.print(f"dtype auto -> {dtype}: this CPU "
                      + ("multiplies bfloat16 natively" if dtype == "bf16-mixed" else
                         "has no native bfloat16 multiply (bench/cpu_dtype.py measures it)"))

    clock.stage("world", "build the synthetic world, index it (BM25), write oracle episodes")
    world = generate_world(world_cfg)
    paths = write_world(world, out / "world")
    stats = world.stats()
    console.print(f"{stats['docs']} documents ({stats['distractor_docs']} distractors, "
                  f"{stats['doc_words_mean']} words on average); questions: "
                  + ", ".join(f"{s} {v['questions']}" for s, v in stats["splits"].items())
                  + f"; test hops {stats['splits']['test']['hops']}")
    index_dir = build_index(paths["corpus"], out / "index", "bm25", overwrite=True,
                            show_progress=False)
    index = load_index(index_dir)
    oracle_path = out / "oracle_train.jsonl"
    oracle_stats = write_oracle_trajectories(read_qa_jsonl(paths["train"]), index, oracle_path,
                                             k=cfg.rollout.topk)
    console.print(f"{oracle_stats.summary()} -> {oracle_path}")
    test = read_qa_jsonl(paths["test"])[:cfg.n_test]
    test_file = out / "test_questions.jsonl"
    from seekrl.data.qa import write_qa_jsonl
    write_qa_jsonl(test_file, test)
    recall = _show_retrieval(console, index, test, cfg)

    eval_kw = dict(index=index, test_file=test_file, episode=cfg.rollout, n=cfg.n_test,
                   dtype=dtype, console=console)
    clock.stage("eval_untrained", f"evaluate the untrained policy on {len(test)} test questions")
    untrained = evaluate_greedy(cfg.model, out / "eval_untrained", **eval_kw)

    sft_cfg = sft_config(cfg, oracle_path, out / "sft", index=str(index_dir))
    per_step = sft_cfg.batch_size * sft_cfg.grad_accum
    clock.stage("sft", f"SFT warm-up: {sft_cfg.max_steps} steps x {per_step} oracle episodes")
    sft = run_sft(sft_cfg, console=console, overwrite=True)

    clock.stage("eval_sft", "evaluate the SFT checkpoint on the same test questions")
    after_sft = evaluate_greedy(sft["final"], out / "eval_sft", **eval_kw)

    rl_kw = dict(model=sft["final"], train_file=paths["train"], index_dir=index_dir)
    rl_cfg = rl_config(cfg, out=out / "rl", **rl_kw)
    budget = f" or {rl_cfg.max_minutes:g} min" if rl_cfg.max_minutes is not None else ""
    clock.stage("rl", f"RL ({rl_cfg.algo.advantage}): {rl_cfg.questions_per_step} questions x "
                      f"{rl_cfg.group_size} rollouts per step, {rl_cfg.steps} steps{budget}")
    rl = _rl(rl_cfg, index, console)

    clock.stage("eval_rl", "evaluate the RL policy on the same test questions")
    after_rl = evaluate_greedy(rl["final"], out / "eval_rl", **eval_kw)

    rl_process = after_process = None
    if cfg.process:
        clock.stage("rl_process", f"RL with process supervision ({cfg.process}) from the same "
                                  f"SFT checkpoint, at the outcome run's {rl['rollout_tokens']} "
                                  "generated rollout tokens")
        from seekrl.rl.methods import method_overrides
        keys = method_overrides(cfg.process, group_size=rl_cfg.group_size,
                                baseline_advantage=rl_cfg.algo.advantage)
        rl_process = _rl(rl_config(cfg, out=out / "rl_process", keys=keys,
                                   budget_tokens=rl["rollout_tokens"], **rl_kw), index, console)
        clock.stage("eval_rl_process", "evaluate the process-supervised policy")
        after_process = evaluate_greedy(rl_process["final"], out / "eval_rl_process", **eval_kw)

    clock.stage("report", "write the report")
    summary = {
        "n_test": len(test), "k": cfg.rollout.topk, "docs": index.doc_count, "dtype": dtype,
        "em_untrained": untrained["em"], "em_sft": after_sft["em"], "em_rl": after_rl["em"],
        "f1_untrained": untrained["f1"], "f1_sft": after_sft["f1"], "f1_rl": after_rl["f1"],
        "valid_format_untrained": untrained["valid_format"],
        "valid_format_sft": after_sft["valid_format"], "valid_format_rl": after_rl["valid_format"],
        "searches_sft": after_sft["searches"], "searches_rl": after_rl["searches"],
        "sft_steps": sft["steps"], "sft_episodes": sft["steps"] * per_step,
        "rl_steps": rl["steps"], "rl_episodes": rl["steps"] * rl_cfg.questions_per_step
        * rl_cfg.group_size, "rl_stopped": rl.get("stopped"),
        "gold_recall_question_query": recall[0], "gold_recall_hop_query": recall[1],
        "oracle_incomplete": oracle_stats.incomplete,
        "rl_rollout_tokens": rl["rollout_tokens"],
        "stage_minutes": {k: round(v, 2) for k, v in clock.taken.items()},
        # peak RSS so far at the end of each stage: the stage where it rises set the peak
        "stage_peak_rss_mb": dict(clock.peak_mb),
        "minutes": clock.minutes(),
    }
    notes = [f"Test EM on the same {len(test)} questions: untrained {untrained['em']:.3f}, "
             f"after SFT {after_sft['em']:.3f}, after RL {after_rl['em']:.3f}.",
             f"SFT: {sft['steps']} steps on {summary['sft_episodes']} oracle episodes; RL: "
             f"{rl['steps']} steps of {rl_cfg.questions_per_step} x {rl_cfg.group_size} "
             f"rollouts ({rl_cfg.algo.advantage}, lr {rl_cfg.optim.lr:g})."]
    evals = {"untrained": "eval_untrained", "SFT": "eval_sft", "RL": "eval_rl"}
    logs = {"sft": out / "sft" / "metrics.jsonl", "rl": out / "rl" / "metrics.jsonl"}
    if rl_process is not None:
        label = f"RL + {cfg.process}"
        evals[label] = "eval_rl_process"
        logs["rl_process"] = out / "rl_process" / "metrics.jsonl"
        summary.update(process=cfg.process, em_rl_process=after_process["em"],
                       f1_rl_process=after_process["f1"],
                       valid_format_rl_process=after_process["valid_format"],
                       searches_rl_process=after_process["searches"],
                       rl_process_steps=rl_process["steps"],
                       rl_process_rollout_tokens=rl_process["rollout_tokens"])
        notes.append(f"{label}: {rl_process['steps']} steps from the same SFT checkpoint with "
                     f"{cfg.process} process supervision, stopped at the outcome run's budget of "
                     f"{rl['rollout_tokens']} generated rollout tokens "
                     f"({rl_process['rollout_tokens']} used); test EM "
                     f"{after_process['em']:.3f} against {after_rl['em']:.3f}. Each step's "
                     f"process reward is in {out / 'rl_process' / 'rollouts'}.")
    (out / "report_evals.json").write_text(json.dumps(evals))
    alerts = {name: out / name / "alerts.jsonl" for name in ("rl", "rl_process")
              if (out / name / "alerts.jsonl").is_file()}
    report = write_training_report(
        out / "report.html", logs=logs, evals={k: out / v for k, v in evals.items()},
        alerts=alerts or None, title="seekrl demo", notes=notes)
    summary["minutes"] = clock.minutes()
    summary["peak_rss_mb"] = peak_rss_mb()
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    console.rule("[bold]done")
    console.print(f"Test EM ({len(test)} questions, greedy): untrained "
                  f"[bold]{untrained['em']:.3f}[/] -> SFT [bold]{after_sft['em']:.3f}[/] -> RL "
                  f"[bold]{after_rl['em']:.3f}[/]   (valid format {untrained['valid_format']:.2f}"
                  f" -> {after_sft['valid_format']:.2f} -> {after_rl['valid_format']:.2f})")
    if after_process is not None:
        console.print(f"RL + {cfg.process} at equal rollout tokens: test EM "
                      f"[bold]{after_process['em']:.3f}[/] (searches {after_process['searches']:.2f}"
                      f" vs {after_rl['searches']:.2f})")
    console.print(f"report -> {report}\ntrajectories -> {out / 'eval_rl' / 'viewer.html'}\n"
                  f"summary -> {out / 'summary.json'} ({summary['minutes']} min)")
    return summary


def _check_stages(cfg: DemoConfig, out: Path):
    """The SFT and RL stages' settings as those stages will build them (their presets'
    keys, schema ranges and the trainer's cross-key rules), so that a bad number fails
    before anything is written or an old run removed, not ten minutes in; returns the SFT
    and RL stages' configs (their steps and budget plan the demo's time)."""
    from seekrl.config import ConfigError
    from seekrl.recipes.train import check_config

    def check(rl, name: str) -> None:   # the trainer's own rules, named by stage
        try:
            check_config(rl)
        except ConfigError as err:
            raise ConfigError(f"demo {name}: {err}") from None

    try:
        sft = sft_config(cfg, out / "oracle_train.jsonl", out / "sft", index=str(out / "index"))
        kw = dict(model=cfg.model, train_file=out / "world" / "train.jsonl",
                  index_dir=out / "index")
        rl = rl_config(cfg, out=out / "rl", **kw)
        check(rl, "rl")
        if cfg.process:
            from seekrl.rl.methods import method_overrides
            keys = method_overrides(cfg.process, group_size=rl.group_size,
                                    baseline_advantage=rl.algo.advantage)
            check(rl_config(cfg, out=out / "rl_process", keys=keys, **kw), "rl_process")
    except ConfigError:
        raise
    except ValueError as err:   # pydantic's ValidationError: its first line names the key
        raise ConfigError(f"demo settings: {err}") from None
    return sft, rl


def _rl(rl_cfg, index, console) -> dict:
    """One RL run from the SFT checkpoint with the demo's settings."""
    from seekrl.recipes.train import Trainer

    return Trainer(rl_cfg, console=console, retriever=index, overwrite=True).train()


def _show_retrieval(console: Console, index, test, cfg: DemoConfig) -> tuple[float, float]:
    """Print what BM25 finds for a few questions; return gold recall@k over the split for
    the question as the query and for each hop's own query (k: the episodes' topk)."""
    k = cfg.rollout.topk
    for ex in test[:cfg.n_show]:
        gold = set(ex.metadata["gold_doc_ids"])
        console.print(f"\n[bold magenta]Q[/] ({ex.metadata['hops']} hops, {ex.metadata['type']}): "
                      f"{ex.question}  [dim]gold answer: {ex.golden_answers[0]}[/]")
        for query in (ex.question, ex.metadata["chain"][0]["query"]):
            print_hits(console, query, index.search([query], k)[0], gold=gold)
    question_hits = index.search([ex.question for ex in test], k)
    hop_queries = [hop for ex in test for hop in ex.metadata["chain"]]
    hop_hits = index.search([hop["query"] for hop in hop_queries], k)
    recall_q = sum(len(set(ex.metadata["gold_doc_ids"]) & {h.doc_id for h in hits})
                   / len(set(ex.metadata["gold_doc_ids"]))
                   for ex, hits in zip(test, question_hits)) / len(test)
    recall_hop = sum(any(h.doc_id == hop["doc_id"] for h in hits)
                     for hop, hits in zip(hop_queries, hop_hits)) / len(hop_queries)
    console.print(f"gold-document recall@{k}: {recall_q:.2f} searching the question as "
                  f"written, {recall_hop:.2f} searching one hop at a time")
    return round(recall_q, 3), round(recall_hop, 3)

