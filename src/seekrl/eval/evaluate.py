"""The evaluation harness: run a policy over QA files, score the episodes, write the run.

`evaluate(model, tokenizer, retriever, data, cfg, out_dir)` runs `RolloutEngine` per data
set (method `direct`, `rag` or `agent`, from `cfg.method`) and writes into `out_dir`:

- `trajectories.jsonl` — one `Trajectory` per episode, `outcome_reward` = EM of its answer;
- `episodes.jsonl` — the same episodes decoded into text segments (prompt, each generated
  turn, each `<information>` block) by `seekrl.eval.report.decode_segments`, so the viewer
  (`seekrl inspect`) needs no tokenizer and `trajectories.jsonl` stays token-level data for
  training tools;
- `metrics.json` — the config of the run plus `score_trajectories(...)`;
- `metrics.md` — the same as tables: a row per data set and the macro average, then the
  per-question-type breakdown.

Scoring is a pure function of the trajectories (`score_trajectories`), so it is tested on
hand-made episodes. Per question the metrics are the mean over its samples; per data set the
mean over questions; the average row is the macro mean over data sets (as in the Search-R1 /
FlashRAG tables). With K > 1 samples, pass@k uses the unbiased estimator of Chen et al.
(2021): 1 - C(n-c, k) / C(n, k) for c correct of n samples, averaged over questions.

For `rag`, the documents retrieved with the question go into the prompt and into no `Step`;
the rollout engine records them as `Trajectory.prompt_hits` / `prompt_hit_titles`, and
evidence recall counts them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Sequence
from math import comb
from pathlib import Path
from typing import Any

from seekrl.agent.backends import Backend, HFBackend
from seekrl.agent.rollout import RolloutConfig, RolloutEngine
from seekrl.agent.trajectory import Trajectory, write_trajectories
from seekrl.config import DATA_PROMPT, DEFAULT_BATCH_SIZE, EpisodeSettings
from seekrl.data.benchmarks import hop_averages, spec_name, split_name
from seekrl.data.qa import FOLDER_SPLITS, QAExample, folder_split, load_qa
from seekrl.errors import DataError
from seekrl.retrieval.base import RetrievalError, Retriever
from seekrl.rewards.metrics import cover_em, exact_match, f1_score, normalize_answer

__all__ = ["GENERIC_STEMS", "answer_scores", "dataset_name", "describe_retriever",
           "eval_rollout_config", "eval_settings", "evaluate", "load_eval_data",
           "pass_at_k", "protocol_record", "score_trajectories", "write_run", "yes_no"]

# the viewer a training run writes by itself (dev evaluations, each step's rollouts) shows
# at most this many episodes, a page of ~10 MB
AUTO_VIEWER_EPISODES = 1000
# File stems that say which split, not which data set: the folder names the data set.
GENERIC_STEMS = frozenset({"questions", "test", "dev", "train", "val", "validation", "data"})
# turns: model turns per episode; queries: retriever queries per episode (a search of
# several sub-queries counts each; otherwise as searches)
_METRIC_KEYS = ("em", "f1", "cover_em", "valid_format", "searches", "turns", "queries",
                "generated_tokens", "one_search")
# known only for some episodes: averaged over those (None where no episode has one)
# planned_lookups: what the first thought plans ("I need 2 lookups"), beside `searches`;
# answered_yes / answered_no / gold_yes: on yes/no questions, how often the agent says yes
# (no) and the gold says yes (a policy that answers one way whatever it read scores the
# gold's share of it); an answer that is neither counts in neither
_PARTIAL_KEYS = ("evidence_recall", "planned_lookups", "answered_yes", "answered_no",
                 "gold_yes")
_FOUND = "_evidence_complete_em"   # a question row's (episodes with every gold doc, their EM)


# ------------------------------------------------------------------------------ data files


def dataset_name(path: str | Path) -> str:
    """The name a data file gets in the tables.

    The file stem (`nq.jsonl` -> `nq`), except for split-like stems (`questions`, `test`,
    `dev`, `train`, ...), which name the folder instead: `data/hotpotqa/questions.jsonl` ->
    `hotpotqa`; a synthetic world (`world.json` beside the file) -> `world`; `hf:` and
    `flashrag:` specs -> the set's name (`flashrag:2wiki` -> `2wikimultihopqa`), a
    `FOLDER:SPLIT` -> the folder's name."""
    named = spec_name(os.fspath(path))
    if named:
        return named
    path = Path(path)
    folder, _, split = str(path).rpartition(":")
    if not path.exists() and folder and Path(folder).is_dir():    # FOLDER:SPLIT
        return split_name(Path(folder).name, split)
    # a suite set's name as `flashrag:` gives it (`2wiki` -> `2wikimultihopqa`), and named
    # apart when read from another split than the papers' (`hotpotqa/train.jsonl`)
    if path.is_dir():
        if (path / "dataset_dict.json").is_file():   # saved splits: `load_qa` reads train
            return split_name(path.name, "train")
        return split_name(path.name, folder_split(path))
    stem = path.stem.lower()
    if stem not in GENERIC_STEMS:
        return split_name(path.stem, None)
    if (path.parent / "world.json").is_file():
        return "world"
    folder = path.resolve().parent.name
    if not folder:
        return path.stem
    return split_name(folder, stem if stem in FOLDER_SPLITS else None)


def load_eval_data(paths: Sequence[str | Path], *, limit: int | None = None,
                   skipped: list | None = None, sources: dict[str, str] | None = None
                   ) -> OrderedDict[str, list[QAExample]]:
    """{dataset name: examples} for the given files, in order; the first `limit` questions
    of each. Two files with the same name get `-2`, `-3`, ... suffixes. With a `skipped`
    list, malformed lines are skipped instead of refused and one `SkipReport` per file
    that had any is appended to it. A `sources` dict is filled with each set's file (a
    merged Search-R1 parquet gives several sets, `flashrag:a+b` one set a name)."""
    if limit is not None and limit < 1:
        raise ValueError(f"limit: expected a positive integer, got {limit}")
    data: OrderedDict[str, list[QAExample]] = OrderedDict()

    def add(base: str, examples: list[QAExample]) -> None:
        name, n = base, 1
        while name in data:
            n += 1
            name = f"{base}-{n}"
        data[name] = examples[:limit] if limit is not None else examples
        if sources is not None:
            sources[name] = str(path)

    for path in _one_set_each(paths):
        if skipped is None:
            examples = load_qa(path)
        else:
            from seekrl.data.jsonl import SkipReport

            report = SkipReport(path=str(path))
            examples = load_qa(path, skip_bad=True, report=report)
            if report:
                skipped.append(report)
        if not examples:
            raise DataError("no questions in the file", path=str(path))
        in_file = list(dict.fromkeys(str((ex.metadata or {}).get("data_source", ""))
                                     for ex in examples))
        if str(path).endswith(".parquet") and len(in_file) > 1 and all(in_file):
            # Search-R1's merged test file: a table row per data set, as its papers give
            for source in in_file:
                add(source, [ex for ex in examples
                             if str(ex.metadata.get("data_source")) == source])
        else:
            add(dataset_name(path), examples)
    return data


def _one_set_each(paths: Sequence[str | Path]) -> list[str | Path]:
    """`flashrag:nq+hotpotqa[:SPLIT]` as one spec a set: scored together, they were one row
    (a micro mean, no hop class), and a limit took its questions from the first set."""
    from seekrl.data.benchmarks import parse_flashrag_spec

    out: list[str | Path] = []
    for path in paths:
        text = os.fspath(path)
        if text.startswith("flashrag:") and "+" in text.split(":")[1]:
            entries, split = parse_flashrag_spec(text)
            out += [f"flashrag:{e.name}" + (f":{split}" if split else "") for e in entries]
        else:
            out.append(path)
    return out


# --------------------------------------------------------------------------------- scoring


def answer_scores(prediction: str | None, golden_answers: Sequence[str]) -> dict[str, float]:
    return {"em": exact_match(prediction, golden_answers),
            "f1": f1_score(prediction, golden_answers),
            "cover_em": cover_em(prediction, golden_answers)}


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): the chance that k of the n samples, drawn without
    replacement, hold at least one of the c correct ones."""
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: expected 0 <= c <= n, got n={n}, c={c}")
    if k < 1 or k > n:
        raise ValueError(f"pass_at_k: expected 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def yes_no(prediction: str | None, golden_answers: Sequence[str]
           ) -> tuple[float, float, float] | None:
    """(the prediction says yes, the gold does, the prediction says no) as 1.0/0.0 on a
    question whose golden answers are all yes or no; None on any other question."""
    golds = {normalize_answer(g) for g in ([golden_answers] if isinstance(golden_answers, str)
                                           else golden_answers)}
    if not golds or not golds <= {"yes", "no"}:
        return None
    said = normalize_answer(prediction) if prediction is not None else ""
    return float(said == "yes"), float("yes" in golds), float(said == "no")


def _trajectory_scores(t: Trajectory) -> dict[str, Any]:
    scores: dict[str, Any] = answer_scores(t.answer, t.golden_answers)
    yn = yes_no(t.answer, t.golden_answers)
    scores.update(valid_format=float(t.valid_format), searches=float(t.n_searches),
                  turns=float(len(t.steps)),
                  queries=float(t.n_queries),
                  generated_tokens=float(t.n_generated), one_search=float(t.n_searches == 1),
                  evidence_recall=t.evidence_recall(), planned_lookups=t.planned_lookups,
                  answered_yes=None if yn is None else yn[0],
                  gold_yes=None if yn is None else yn[1],
                  answered_no=None if yn is None else yn[2])
    return scores


def _mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _question_row(trajs: list[Trajectory], pass_ks: Sequence[int]) -> dict[str, Any]:
    """One question: each metric the mean over its samples; pass@k over them."""
    per = [_trajectory_scores(t) for t in trajs]
    row = {key: _mean(s[key] for s in per) for key in _METRIC_KEYS}
    for key in _PARTIAL_KEYS:
        row[key] = _mean(s[key] for s in per)
    # search failure or reading failure: how often every gold document was retrieved, and
    # the EM of those episodes (pooled over episodes by `_aggregate`)
    found = [s["em"] for s in per if s["evidence_recall"] == 1.0]
    row["evidence_complete"] = _mean(None if s["evidence_recall"] is None
                                     else float(s["evidence_recall"] == 1.0) for s in per)
    row[_FOUND] = (len(found), sum(found))
    correct = sum(s["em"] == 1.0 for s in per)
    for k in pass_ks:
        row[f"pass@{k}"] = pass_at_k(len(per), correct, k)
    return row


def _aggregate(question_rows: list[dict[str, Any]], n_trajectories: int,
               pass_ks: Sequence[int]) -> dict[str, Any]:
    row: dict[str, Any] = {"questions": len(question_rows), "trajectories": n_trajectories}
    for key in (*_METRIC_KEYS, *_PARTIAL_KEYS, "evidence_complete",
                *(f"pass@{k}" for k in pass_ks)):
        row[key] = _mean(q[key] for q in question_rows)
    n_found = sum(q[_FOUND][0] for q in question_rows)
    row["em_evidence_complete"] = (sum(q[_FOUND][1] for q in question_rows) / n_found
                                   if n_found else None)
    row["yes_no_questions"] = sum(q["answered_yes"] is not None for q in question_rows)
    return row


def score_trajectories(trajectories: Sequence[Trajectory], *,
                       pass_ks: Sequence[int] | None = None) -> dict[str, Any]:
    """The metrics of a run, from its trajectories alone (pure).

    Groups by `Trajectory.dataset`, then by `example_id` (the samples of one question).
    Returns `{"n_samples", "pass_ks", "datasets": {name: row}, "average": row,
    "by_type": {name: {type: row}}}`; a row holds `questions`, `trajectories`, `em`, `f1`,
    `cover_em`, `valid_format`, `searches`, `generated_tokens`, `evidence_recall` (None
    where no gold documents are known), `evidence_complete` (the share of episodes that
    retrieved every gold document) and `em_evidence_complete` (the EM of those episodes,
    pooled: low means the agent finds the documents and still answers wrong, a reading
    failure; None where no episode found them all), on questions whose gold answers are all
    yes or no `answered_yes` and `gold_yes` (how often the agent and the gold say yes; None
    where there are none) with `yes_no_questions` (how many), and `pass@k` for each k in
    `pass_ks` (default: K, the most samples any question has, when K > 1). `average` is
    the macro mean of the data set rows (`questions`, `trajectories` and
    `yes_no_questions` summed); `by_type` only lists data sets with `metadata["type"]`.
    """
    groups: OrderedDict[str, OrderedDict[str, list[Trajectory]]] = OrderedDict()
    seen: set[tuple[str, str, int]] = set()
    for t in trajectories:
        key = (t.dataset, t.example_id, t.sample_index)
        if key in seen:  # two questions with one id would pass for samples of one question
            raise ValueError(f"dataset {t.dataset!r}: two trajectories for question "
                             f"{t.example_id!r}, sample {t.sample_index}")
        seen.add(key)
        groups.setdefault(t.dataset, OrderedDict()).setdefault(t.example_id, []).append(t)
    n_samples = max((len(g) for qs in groups.values() for g in qs.values()), default=1)
    if pass_ks is None:
        pass_ks = [n_samples] if n_samples > 1 else []
    pass_ks = sorted({int(k) for k in pass_ks})
    for name, questions in groups.items():
        fewest = min(len(g) for g in questions.values())
        if pass_ks and fewest < pass_ks[-1]:
            raise ValueError(f"dataset {name!r}: pass@{pass_ks[-1]} needs at least "
                             f"{pass_ks[-1]} samples per question, some have {fewest}")

    datasets: OrderedDict[str, dict] = OrderedDict()
    by_type: OrderedDict[str, dict] = OrderedDict()
    for name, questions in groups.items():
        rows = {qid: _question_row(g, pass_ks) for qid, g in questions.items()}
        datasets[name] = _aggregate(list(rows.values()), sum(map(len, questions.values())),
                                    pass_ks)
        types: OrderedDict[str, list[str]] = OrderedDict()
        for qid, g in questions.items():
            meta = g[0].metadata if isinstance(g[0].metadata, dict) else {}
            if meta.get("type") is not None:
                types.setdefault(str(meta["type"]), []).append(qid)
        if types:
            untyped = [qid for qid in questions if qid not in {q for v in types.values()
                                                               for q in v}]
            if untyped:  # never drop questions silently from the breakdown (nor those
                # whose type is spelt "(no type)")
                types.setdefault("(no type)", []).extend(untyped)
            by_type[name] = OrderedDict(
                (type_name, _aggregate([rows[q] for q in qids],
                                       sum(len(questions[q]) for q in qids), pass_ks))
                for type_name, qids in sorted(types.items()))

    average: dict[str, Any] = {}
    if datasets:
        rows = list(datasets.values())
        average = {"questions": sum(r["questions"] for r in rows),
                   "trajectories": sum(r["trajectories"] for r in rows),
                   "yes_no_questions": sum(r["yes_no_questions"] for r in rows)}
        for key in (*_METRIC_KEYS, *_PARTIAL_KEYS, "evidence_complete",
                    "em_evidence_complete", *(f"pass@{k}" for k in pass_ks)):
            average[key] = _mean(r[key] for r in rows)
    out = {"n_samples": n_samples, "pass_ks": list(pass_ks), "datasets": dict(datasets),
           "average": average, "by_type": {k: dict(v) for k, v in by_type.items()}}
    hops = hop_averages(datasets, (*_METRIC_KEYS, "evidence_recall"))
    if hops:
        out["hops"] = hops
    return out


def protocol_record(cfg: RolloutConfig, tokenizer,
                    data: dict[str, list[QAExample]] | None = None) -> dict[str, Any]:
    """What makes two evaluations comparable beyond the rollout settings: fingerprints of the
    instruction the model sees (with `prompt: data`, of the questions' own prompts), of the
    documents' and corrections' layout when not seekrl's, and of the chat template."""
    import hashlib
    import json

    from seekrl.agent.protocol import PROMPTS, prompt_style, user_message

    def digest(text) -> str | None:
        if text and not isinstance(text, str):   # named templates: {"default": ..., ...}
            text = json.dumps(text, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16] if text else None

    style = prompt_style(cfg.prompt)
    out = {"instruction_sha256": digest(user_message("{question}", cfg.method, style=style)),
           "chat_template_sha256": digest(getattr(tokenizer, "chat_template", None))}
    if cfg.prompt == DATA_PROMPT and cfg.method == "agent":
        out["instruction_sha256"] = None
        out["data_prompts_sha256"] = digest(json.dumps(
            [ex.prompt for examples in (data or {}).values() for ex in examples]))
    if style.doc != PROMPTS["seekrl"].doc or style.invalid != PROMPTS["seekrl"].invalid:
        out["layout_sha256"] = digest(style.doc + "\x00" + style.invalid)
    return out


# ------------------------------------------------------------------------------- running


def eval_rollout_config(section=None, *, n_samples: int = 1,
                        temperature: float | None = None, **kw: Any) -> RolloutConfig:
    """The engine's settings for an evaluation (`RolloutConfig.of(section, **kw)`: episode
    settings, such as `eval_settings` gives or `seekrl eval`'s options make, or the
    defaults) with the eval defaults for decoding: greedy for one sample, sampling at
    T = 1.0 for K > 1; `temperature=0` forces greedy."""
    if temperature is None:
        temperature = 0.0 if n_samples == 1 else 1.0
    if temperature < 0:
        raise ValueError(f"temperature: expected >= 0 (0 = greedy), got {temperature}")
    greedy = temperature == 0
    return RolloutConfig.of(section, **kw, n_samples=n_samples, greedy=greedy,
                            temperature=1.0 if greedy else temperature)


def eval_backend_kind(episode: EpisodeSettings | None) -> str:
    """The decoding backend an evaluation of `episode` (a `rollout:` section) runs on: the
    section's own where it is seekrl's (hf, static); hf for vllm (an evaluation plays the
    policy in this process, not a second engine)."""
    kind = getattr(episode, "backend", "hf")
    return kind if kind in ("hf", "static") else "hf"


def eval_backend(model, tokenizer, episode: EpisodeSettings | None) -> Backend:
    """The backend `eval_policy` builds for `episode`'s settings (`eval_backend_kind`):
    HFBackend with the section's attention, or the static backend with rows of
    `max_total_tokens` (HFBackend, with a warning, where its lean forward does not run
    the model)."""
    from seekrl.agent.factory import make_backend

    settings = episode if episode is not None else EpisodeSettings()
    return make_backend(eval_backend_kind(episode), tokenizer, model=model,
                        attention=settings.attention, max_model_len=settings.max_total_tokens)


def eval_settings(cfg, episode: EpisodeSettings | None = None) -> EpisodeSettings:
    """The episode settings an evaluation plays: the run's (`episode`, its `rollout:`
    section; None: the defaults) as an agent that searches the real index (a run that
    trains on self-search or another method is measured as a searching agent), with the
    limits the `eval:` section `cfg` sets on top."""
    limits = {k: v for k in ("max_turns", "max_new_tokens", "batch_size")
              if (v := getattr(cfg, k, None)) is not None}
    play = (episode if episode is not None else EpisodeSettings()).episode_settings()
    if "batch_size" not in limits and eval_backend_kind(episode) == "hf":
        # the HF loop: a rollout batch sized for vLLM (hundreds) would not fit there; the
        # static backend keeps the run's batch (its rows are the training rollout's)
        limits["batch_size"] = min(play.batch_size, DEFAULT_BATCH_SIZE)
    return play.model_copy(update={"method": "agent", "self_search": False, **limits})


def describe_retriever(retriever: Retriever | None) -> dict[str, Any] | None:
    """What metrics.json records of the retriever: the index manifest or the server url."""
    if retriever is None:
        return None
    manifest = getattr(retriever, "manifest", None)
    if isinstance(manifest, dict):
        return {"type": "index", "path": str(getattr(retriever, "path", "")),
                "manifest": manifest}
    url = getattr(retriever, "base_url", None)
    if url is not None:
        info: dict[str, Any] = {"type": "remote", "url": url}
        health = getattr(retriever, "health", None)
        if callable(health):
            try:  # the server's manifest says which index answered
                info["manifest"] = health().get("manifest")
            except (RetrievalError, AttributeError) as err:
                info["manifest_error"] = str(err)
        return info
    return {"type": type(retriever).__name__}


def episode_progress(console, total: int):
    """A progress bar over `total` episodes: done / total, the EM so far, time left."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("EM {task.fields[em]}"), TimeElapsedColumn(),
                    TimeRemainingColumn(), console=console, transient=False)


def evaluate(model, tokenizer, retriever: Retriever | None,
             data: dict[str, list[QAExample]], cfg: RolloutConfig,
             out_dir: str | Path, *, backend: Backend | None = None,
             run_info: dict[str, Any] | None = None, progress: bool = True,
             console=None, on_finish: Callable[[Trajectory], None] | None = None,
             before_write: Callable[[], None] | None = None) -> dict[str, Any]:
    """Run `cfg.method` over every data set, score, write the run folder; returns metrics.
    `before_write` runs once the episodes are done, before the folder is written (`seekrl
    eval --overwrite` removes the old run there: a failed or stopped evaluation leaves it).

    `backend` defaults to `HFBackend(model, tokenizer)` (pass one to evaluate another
    generator). `run_info` (model name, data files, limit, dtype, ...) goes into
    `metrics.json["config"]` next to the rollout config and the retriever's description."""
    if not data:
        raise ValueError("data: expected at least one data set")
    for name, examples in data.items():
        repeated = [i for i, n in Counter(ex.id for ex in examples).items() if n > 1]
        if repeated:
            dup = repeated[0]
            raise DataError(f"question id {dup!r} appears more than once; ids must be unique "
                            "(samples of a question are grouped by id)", path=name, field="id")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    backend = backend if backend is not None else HFBackend(model, tokenizer)
    engine = RolloutEngine(backend, tokenizer, retriever, cfg)
    started = time.time()
    trajectories: list[Trajectory] = []
    seconds: dict[str, float] = {}
    total = sum(len(v) for v in data.values()) * cfg.n_samples
    bar = episode_progress(console, total) if progress else None
    done, correct = 0, 0.0

    def finished(t: Trajectory) -> None:
        nonlocal done, correct
        done += 1
        correct += exact_match(t.answer, t.golden_answers)
        if bar is not None:
            bar.update(task, advance=1, em=f"{correct / done:.3f}")
        if on_finish is not None:
            on_finish(t)

    if bar is not None:
        bar.start()
        task = bar.add_task("eval", total=total, em="-")
    try:
        for name, examples in data.items():
            if bar is not None:
                bar.update(task, description=f"{cfg.method} · {name}")
            t0 = time.time()
            trajs = engine.run(examples, dataset=name, on_finish=finished)
            seconds[name] = round(time.time() - t0, 2)
            for t in trajs:
                t.outcome_reward = exact_match(t.answer, t.golden_answers)
            trajectories.extend(trajs)
    finally:
        if bar is not None:
            bar.stop()

    config = {"seekrl_version": _version(), **(run_info or {}),
              "rollout": cfg.model_dump(mode="json"), "protocol": protocol_record(cfg, tokenizer, data),
              "retriever": describe_retriever(retriever),
              "datasets": {name: len(v) for name, v in data.items()}}
    metrics = {"config": config, **score_trajectories(trajectories),
               "seconds": {"total": round(time.time() - started, 2), "datasets": seconds}}
    if before_write is not None:
        before_write()
    write_run(out, trajectories, metrics, tokenizer)
    return metrics


def eval_policy(model, tokenizer, retriever, cfg, out_dir: str | Path, *,
                episode: EpisodeSettings | None = None, console=None,
                run_info: dict | None = None, limit: int | None = None,
                backend: Backend | None = None) -> dict[str, Any]:
    """Greedy agent evaluation on the first `cfg.n` questions of `cfg.data` (`cfg`: an
    `EvalConfig`, the `eval:` section of the SFT and RL configs), as the recipes run it
    during and after training; writes the run folder (tables, trajectories, viewer) and
    returns the average metrics row. The policy plays the run's `episode` settings (its
    `rollout:` section: prompt, tools, limits, attention; `eval_settings`). With
    `cfg.samples` K > 0, the same questions are also sampled K times at the episodes'
    temperature into `out_dir/sampled`, and the returned metrics hold that run's average
    as `sampled` (pass@1 = its `em`, and `pass@K`). The episodes decode on `backend` (a
    trainer hands in its own static backend: its rows and graphs are reused, not allocated
    twice), else on the one `episode.backend` names (`eval_backend`)."""
    from seekrl.eval.report import METRICS_FILE, write_viewer

    play = eval_settings(cfg, episode)
    data = load_eval_data([cfg.data], limit=limit or cfg.n)
    was_training = model.training
    model.eval()
    if backend is None:
        backend = eval_backend(model, tokenizer, episode)
    try:
        metrics = evaluate(model, tokenizer, retriever, data, eval_rollout_config(play),
                           out_dir, backend=backend, run_info=run_info,
                           progress=console is not None, console=console)
        samples = getattr(cfg, "samples", 0)
        if samples:
            # the folder is complete (metrics.json) only once the sampled run is in too
            (Path(out_dir) / METRICS_FILE).unlink(missing_ok=True)
            sampled_cfg = eval_rollout_config(play, n_samples=samples,
                                              temperature=play.temperature)
            sampled = evaluate(model, tokenizer, retriever, data, sampled_cfg,
                               Path(out_dir) / "sampled", backend=backend,
                               run_info=run_info, progress=console is not None,
                               console=console)
            metrics["sampled"] = sampled["average"]
            write_metrics(Path(out_dir), metrics)   # the summary beside the greedy figures
    finally:
        model.train(was_training)
    # written at every dev evaluation: capped so that a large dev set does not leave a page
    # a browser cannot open (`seekrl inspect RUN_DIR` renders them all)
    write_viewer(out_dir, tokenizer=tokenizer, max_episodes=AUTO_VIEWER_EPISODES)
    return metrics


def write_run(out_dir: str | Path, trajectories: Sequence[Trajectory], metrics: dict,
              tokenizer=None) -> None:
    """trajectories.jsonl, episodes.jsonl (when a tokenizer is given), metrics.json/.md."""
    from seekrl.eval.report import (
        EPISODES_FILE,
        METRICS_FILE,
        TRAJECTORIES_FILE,
        decode_segments,
        metrics_markdown,
    )

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # an old run's metrics.json goes first: written over in place, a kill would leave it,
    # saying the folder is complete, beside half the new trajectories
    (out / METRICS_FILE).unlink(missing_ok=True)
    # and its episodes: without a tokenizer none are written, and the viewer would show
    # the old run's turns beside the new answers
    (out / EPISODES_FILE).unlink(missing_ok=True)
    write_trajectories(out / TRAJECTORIES_FILE, trajectories)
    if tokenizer is not None:
        records = ({"dataset": t.dataset, "example_id": t.example_id,
                    "sample_index": t.sample_index, "segments": decode_segments(t, tokenizer)}
                   for t in trajectories)
        with open(out / EPISODES_FILE, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    (out / "metrics.md").write_text(metrics_markdown(metrics), encoding="utf-8")
    write_metrics(out, metrics)


def write_metrics(out: Path, metrics: dict) -> None:
    """OUT/metrics.json, written last and whole (beside, then renamed): a folder with it is
    a finished evaluation, which callers reuse rather than play again."""
    from seekrl.eval.report import METRICS_FILE

    tmp = out / f".{METRICS_FILE}.tmp{os.getpid()}"
    tmp.write_text(json.dumps(metrics, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, out / METRICS_FILE)


def write_rollouts(out_dir: str | Path, trajectories: Sequence[Trajectory], tokenizer,
                   config: dict[str, Any]) -> None:
    """A training step's episodes as an evaluation run (trajectories, metrics over them,
    `config` beside), with the trajectory viewer. A refill can bring a question back within
    a step: each question's episodes are numbered afresh so that every one keeps its own row
    (the group id stays in the trajectory)."""
    from seekrl.eval.report import write_viewer

    seen: dict[str, int] = defaultdict(int)
    blocks: dict[str, dict[int, int]] = {}   # each question's current draw: old -> new number
    drawn = []
    for t in trajectories:
        block = blocks.get(t.example_id)
        if block is None or t.sample_index in block:   # a question's next draw begins
            block = blocks[t.example_id] = {}
        block[t.sample_index] = seen[t.example_id]
        seen[t.example_id] += 1
        drawn.append(block)
    # a tree rollout's `tree` and `parent` name numbers of its own draw: renumbered with it
    renumbered = [dataclasses.replace(
        t, sample_index=block[t.sample_index],
        tree=block.get(t.tree, t.tree) if t.tree is not None else None,
        parent=block.get(t.parent, t.parent) if t.parent is not None else None)
        for t, block in zip(trajectories, drawn)]
    # pass@G at the group size: a question drawn twice has 2G episodes, and pass@2G (the
    # default, the most any question has) refused every question with G
    fewest = min(seen.values(), default=1)
    scores = score_trajectories(renumbered, pass_ks=[fewest] if fewest > 1 else [])
    write_run(out_dir, renumbered, {"config": config, **scores}, tokenizer)
    write_viewer(out_dir, max_episodes=AUTO_VIEWER_EPISODES)


def _version() -> str:
    from seekrl import __version__

    return __version__
