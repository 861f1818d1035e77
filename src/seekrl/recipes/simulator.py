"""`seekrl simulator train`: fine-tune a causal LM to play the search engine (ZeroSearch's
simulation tuning), from real interactions.

The interactions are queries with the episode's question and gold answer: the searches of
logged episodes (`trajectories`: an evaluation's `trajectories.jsonl`, an RL run's rollouts)
and, for questions of the synthetic world, the hop queries of their chains (`data`). Each
query is searched in the real `index`; its top-k documents are the target, written as the
simulator writes them (`Doc i (Title: T) text`), and the prompt is the *useful* one when they
hold a gold document (by id, else by supporting title) or the gold answer, the *noisy* one
otherwise: the simulator learns what a real engine returns for both kinds. The examples go
through the SFT recipe as token records (the prompt masked, the documents trained).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from seekrl.agent.protocol import holds_phrase, normalise_text
from seekrl.config import SimulatorTrainConfig
from seekrl.retrieval.simulated import (
    NOISY,
    SIMULATOR_FILE,
    USEFUL,
    simulator_input,
    simulator_prompt,
    simulator_target,
)


def interactions(cfg: SimulatorTrainConfig) -> list[dict[str, Any]]:
    """(query, question, answers, gold ids, gold titles) records from the configured
    sources, duplicates (same query and question) once, in a seeded order."""
    from seekrl.agent.trajectory import read_trajectories
    from seekrl.data.qa import given_titles, hop_chain, in_file, load_qa

    out: dict[tuple[str, str], dict[str, Any]] = {}

    def add(query: str, question: str, answers, gold_ids, titles) -> None:
        query = " ".join(str(query).split())
        if query:
            out.setdefault((query.lower(), question), {
                "query": query, "question": question, "answers": list(answers),
                "gold_ids": list(gold_ids), "gold_titles": list(titles)})

    for path in cfg.trajectories:
        for t in read_trajectories(path, tokens=False):
            titles = given_titles(t.metadata)
            for s in t.steps:
                if s.action == "search" and s.query:
                    for q in s.sub_queries or [s.query]:
                        add(q, t.question, t.golden_answers, t.gold_doc_ids, titles)
    for path in cfg.data:
        with in_file(path):
            for ex in load_qa(path, "train"):   # a FlashRAG folder: its train split
                gold = ex.metadata.get("gold_doc_ids") or []
                titles = given_titles(ex.metadata)
                for hop in hop_chain(ex):
                    if hop.get("query"):   # a hop without one is not a search to simulate
                        add(hop["query"], ex.question, ex.golden_answers, gold, titles)
                if cfg.question_queries:
                    add(ex.question, ex.question, ex.golden_answers, gold, titles)
    from seekrl.recipes.setup import sample_queries

    return sample_queries(list(out.values()), cfg.seed, cfg.limit)


def label(record: dict[str, Any], hits) -> str:
    """useful when the documents hold a gold document (by id, else by title) or a gold
    answer; noisy otherwise."""
    norm = normalise_text
    if record["gold_ids"] and {h.doc_id for h in hits} & set(record["gold_ids"]):
        return USEFUL
    if record["gold_titles"] and {norm(h.title) for h in hits} & {norm(x) for x in
                                                                  record["gold_titles"]}:
        return USEFUL
    text = " ".join(norm(h.text) for h in hits)
    return USEFUL if any(holds_phrase(text, norm(a)) for a in record["answers"]) else NOISY


def examples(records: Sequence[dict[str, Any]], retriever, tokenizer, k: int, words: int
             ) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Token records for the SFT recipe and the label counts."""
    hits_per = retriever.search([r["query"] for r in records], k)
    rows, counts = [], {USEFUL: 0, NOISY: 0, "no_documents": 0}
    for r, hits in zip(records, hits_per):
        if not hits:
            counts["no_documents"] += 1
            continue
        kind = label(r, hits)
        counts[kind] += 1
        answer = r["answers"][0] if r["answers"] and kind == USEFUL else None
        prompt = simulator_prompt(r["query"], k, kind=kind, question=r["question"],
                                  answer=answer, words=words)
        ids = tokenizer.encode(simulator_input(tokenizer, prompt), add_special_tokens=False)
        target = tokenizer.encode(simulator_target(hits), add_special_tokens=False)
        if tokenizer.eos_token_id is not None:
            target.append(tokenizer.eos_token_id)   # the simulator learns to stop
        rows.append({"token_ids": ids + target, "loss_mask": [0] * len(ids) + [1] * len(target),
                     "kind": kind, "query": r["query"]})
    return rows, counts


def train_simulator(cfg: SimulatorTrainConfig, *, console: Console | None = None,
                    overwrite: bool = False, resume: bool = False) -> dict[str, Any]:
    """Build the examples, then SFT `cfg.model` on them; the summary holds `final`.
    `resume` goes on with a stopped run from its latest checkpoint (`save_every`), on the
    same examples (built again, and checked against the checkpoint's)."""
    from seekrl.config import ConfigError, SFTConfig
    from seekrl.models import load_tokenizer
    from seekrl.recipes.checkpoint import check_run_dir, latest_checkpoint
    from seekrl.recipes.setup import open_index
    from seekrl.recipes.sft import check_resume_settings, run_sft

    if resume and overwrite:
        raise ConfigError("give one of --resume (continue the run in out) or --overwrite "
                          "(replace it), not both")
    out = Path(cfg.out)
    data = out / "simulator_examples.jsonl"
    sft_cfg = SFTConfig(model=cfg.model, data=str(data), out=str(out / "sft"), seed=cfg.seed,
                        max_steps=cfg.steps, batch_size=cfg.batch_size,
                        grad_accum=cfg.grad_accum, max_len=cfg.max_len, dtype=cfg.dtype,
                        device=cfg.device, train_layers=cfg.train_layers,
                        save_every=cfg.save_every, optim=cfg.optim.model_dump())
    # before the queries are searched and the examples file written over: a run there needs
    # one of the two, and a resume its checkpoint and its settings
    check_run_dir(out / "sft", resume=resume, overwrite=overwrite, model=cfg.model)
    if resume:
        if latest_checkpoint(out / "sft") is None:
            raise ConfigError(f"--resume: {out / 'sft'} has no checkpoint (checkpoints/latest; "
                              f"one every save_every steps)")
        check_resume_settings(out / "sft", sft_cfg)
    console = console or Console()
    records = interactions(cfg)
    retriever = open_index(cfg.index, "the simulator learns the real engine's documents")
    tokenizer = load_tokenizer(cfg.model)
    rows, counts = examples(records, retriever, tokenizer, cfg.topk, cfg.words)
    if not rows:
        raise ValueError(f"index: {cfg.index} found no documents for any of the "
                         f"{len(records)} queries")
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if resume and data.is_file() and data.read_text(encoding="utf-8") != text:
        raise ConfigError(f"--resume: the examples built now differ from the stopped run's "
                          f"({data}: other queries, index or settings); resume with its "
                          "settings and index, or start a new run in another out")
    out.mkdir(parents=True, exist_ok=True)
    data.write_text(text, encoding="utf-8")
    console.print(f"{len(rows)} simulator examples ({counts[USEFUL]} useful, {counts[NOISY]} "
                  f"noisy, {counts['no_documents']} queries without documents) -> {data}")
    sft = run_sft(sft_cfg, console=console, overwrite=overwrite, resume=resume)
    # the prompt it learned, checked against the one RL or `seekrl serve` gives it
    (Path(sft["final"]) / SIMULATOR_FILE).write_text(json.dumps(
        {"topk": cfg.topk, "words": cfg.words}, indent=1))
    summary = {"final": sft["final"], "examples": len(rows), **counts,
               "steps": sft["steps"], "loss": sft.get("loss")}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
