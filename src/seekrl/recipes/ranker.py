"""`seekrl ranker train` and the ranker trained with the agent: labels from searches, a
listwise loss, recall@k before and after.

1. Queries: the searches of logged episodes (an evaluation's `trajectories.jsonl`, an RL
   run's rollouts) with what each episode knew (its gold document ids, its answers, whether
   it ended right, which documents it was shown), and the hop queries of synthetic-world
   questions (`data`), whose gold documents are known.
2. Candidates: the first stage's top `candidates` for each query.
3. Labels (`label_candidates`): where the question's gold documents are known, a candidate is
   positive when it is one of them and negative otherwise; where they are not, a document
   the episode was shown is positive when the episode ended right and the document holds a
   gold answer, negative otherwise, and the candidates it was not shown are left out.
4. Loss: listwise, the log of the positives' share of the softmax over the query's
   candidates; queries with no positive or no negative teach nothing and are skipped
   (`RankerUpdater` beside the ranker, retrieval/ranker.py).
5. recall@k of the first stage alone, the ranker before and after, on the hop queries of
   held-out questions (`eval_data`).

During RL (`ranker:` in a train config) the same labels and loss run after every step on the
step's own searches, with the candidates the ranker was given (CoSearch trains its ranker
with the agent; seekrl's version alternates the two updates).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from seekrl.agent.protocol import holds_phrase, normalise_text
from seekrl.config import RankerTrainConfig
from seekrl.data.qa import given_titles, hop_chain, in_file
from seekrl.errors import ConfigError
from seekrl.recipes.checkpoint import (
    latest_checkpoint,
    process_tag,
    remove_outputs,
    replace_dir,
)
from seekrl.recipes.setup import Interrupted, rng_state, set_rng_state
from seekrl.retrieval.base import Hit
from seekrl.retrieval.ranker import RankerUpdater, load_ranker, ranked_retriever, recall_at
from seekrl.rewards.metrics import exact_match


def trajectory_records(trajectories: Iterable) -> list[dict[str, Any]]:
    """One record per (sub-)query of every search: query, gold ids, answers, the documents
    shown for it, and whether the episode ended right (EM of its answer)."""
    out = []
    for t in trajectories:
        right = t.answer is not None and exact_match(t.answer, t.golden_answers) > 0
        for s in t.steps:
            if s.action != "search" or not s.query:
                continue
            pairs = list(zip(s.sub_queries, s.sub_hits)) if s.sub_queries else [(s.query, s.hits)]
            for q, shown in pairs:
                out.append({"query": " ".join(q.split()), "gold_ids": list(t.gold_doc_ids),
                            "answers": list(t.golden_answers), "shown": list(shown),
                            "right": right})
    return [r for r in out if r["query"]]


def qa_records(examples: Iterable, *, question_queries: bool = False) -> list[dict[str, Any]]:
    """The hop queries of synthetic-world questions (and the questions themselves), each with
    the question's gold ids and the hop's own gold document (`hop_gold`, for recall@k)."""
    out = []
    for ex in examples:
        gold = [str(i) for i in ex.metadata.get("gold_doc_ids") or []]
        for hop in hop_chain(ex):
            if hop.get("query"):
                doc = hop.get("doc_id")
                out.append({"query": hop["query"], "gold_ids": gold,
                            "answers": list(ex.golden_answers), "shown": [], "right": None,
                            "hop_gold": None if doc is None else str(doc)})
        if question_queries:
            out.append({"query": ex.question, "gold_ids": list(gold),
                        "answers": list(ex.golden_answers), "shown": [], "right": None})
    return out


def question_records(examples: Iterable) -> list[dict[str, Any]]:
    """The questions with known gold documents but no hop chain (a benchmark's, your own),
    each the query of itself: its gold document ids (`metadata.gold_doc_ids`), else its
    supporting passages' titles (`metadata.supporting_titles`: HotpotQA, 2Wiki, MuSiQue).
    Questions with a `chain` are asked hop by hop (`qa_records`)."""
    out = []
    for ex in examples:
        if ex.metadata.get("chain"):
            continue
        ids = [str(i) for i in ex.metadata.get("gold_doc_ids") or []]
        keys = {normalise_text(str(t)) for t in given_titles(ex.metadata)} - {""}
        if ids or keys:
            out.append({"query": ex.question, "gold_ids": list(dict.fromkeys(ids)),
                        "gold_titles": [] if ids else sorted(keys)})
    return out


def question_recall(retriever, records: Sequence[dict[str, Any]], k: int, *,
                    batch_size: int = 64) -> float:
    """For `question_records`: the mean share of each question's gold documents in the top
    k of the question itself (by id, or by title where only titles are known)."""
    if not records:
        raise ValueError("question_recall: no questions with gold documents")
    total = 0.0
    for lo in range(0, len(records), batch_size):
        rows = records[lo:lo + batch_size]
        for r, hits in zip(rows, retriever.search([r["query"] for r in rows], k)):
            if r["gold_ids"]:
                gold, got = set(r["gold_ids"]), {h.doc_id for h in hits}
            else:
                gold, got = set(r["gold_titles"]), {normalise_text(h.title) for h in hits}
            total += len(gold & got) / len(gold)
    return total / len(records)


def label_candidates(record: dict[str, Any], candidates: Sequence[Hit]) -> list[int | None]:
    """1 positive, 0 negative, None unknown, per candidate (see the module's step 3)."""
    if record["gold_ids"]:
        gold = set(record["gold_ids"])
        return [int(h.doc_id in gold) for h in candidates]
    shown = set(record["shown"])
    answers = [normalise_text(a) for a in record["answers"] if normalise_text(a)]
    out: list[int | None] = []
    for h in candidates:
        if h.doc_id not in shown:
            out.append(None)
        else:
            text = normalise_text(h.contents)
            # as whole words: "no" is not in "not", nor "1" in "1990"
            out.append(int(bool(record["right"]) and any(holds_phrase(text, a) for a in answers)))
    return out


def training_examples(records: Sequence[dict[str, Any]], pools: Sequence[Sequence[Hit]]
                      ) -> list[tuple[str, list[Hit], list[int]]]:
    """(query, candidates, labels) for the queries with a positive and a negative;
    unknown candidates left out. A ranker reads a candidate's text, a query encoder its
    stored vector (by id)."""
    out = []
    for r, pool in zip(records, pools):
        labels = label_candidates(r, pool)
        kept = [(h, y) for h, y in zip(pool, labels) if y is not None]
        ys = [y for _, y in kept]
        if 1 in ys and 0 in ys:
            out.append((r["query"], [d for d, _ in kept], ys))
    return out


def hop_recall(retriever, records: Sequence[dict[str, Any]], k: int) -> float:
    """recall@k of each hop query's own gold document."""
    rows = [r for r in records if r.get("hop_gold")]
    if not rows:
        raise ValueError("eval_data: no hop queries with a gold document (synthetic-world "
                         "questions carry them in metadata.chain)")
    return recall_at(retriever, [r["query"] for r in rows], [r["hop_gold"] for r in rows], k)


def gold_hit_rate(retriever, records: Sequence[dict[str, Any]], k: int,
                  field: str = "trajectories") -> float:
    """For logged searches (`trajectory_records`) of questions with known gold documents:
    the share of queries whose top k hold at least one of them; `field` names where the
    searches came from in an error."""
    rows = [r for r in records if r["gold_ids"]]
    if not rows:
        raise ValueError(f"{field}: no searches of questions with known gold documents")
    return recall_at(retriever, [r["query"] for r in rows], [r["gold_ids"] for r in rows], k)


# the settings a resumed ranker training may change: where it writes, how long it trains
# and how often it saves, the device; any other changes its examples, its model or what
# its before/after figures measure
RESUME_MAY_CHANGE = ("out", "steps", "save_every", "device")


def check_ranker_run(out: Path, cfg: RankerTrainConfig, *, overwrite: bool,
                     resume: bool) -> Path | None:
    """Refuse what would lose work or mix two trainings, before anything slow: a finished
    one in `out` (its summary.json, or a final/ of its own) unless `overwrite`, a stopped
    one (a checkpoint, no summary) unless `overwrite` or `resume`, and a resume without a
    checkpoint or with changed settings. Returns the checkpoint a resume goes on from."""
    from seekrl.recipes.checkpoint import recover_replaced, resume_refusals

    if resume and overwrite:
        raise ConfigError("give one of --resume (continue the training in out) or "
                          "--overwrite (replace it), not both")
    recover_replaced(out / "final")   # what a kill while final/ was being swapped left
    finished = (out / "summary.json").is_file()
    checkpoint = None if finished else latest_checkpoint(out)
    if not overwrite and (finished or (checkpoint is None and (out / "final").exists())):
        raise FileExistsError(f"out: {out} already holds a trained ranker (final/); pass "
                              "--overwrite or choose another out")
    if not resume:
        if checkpoint is not None and not overwrite:
            raise FileExistsError(f"out: {out} holds a stopped ranker training "
                                  f"({checkpoint.name}); pass --resume to continue it, "
                                  "--overwrite to replace it, or choose another out")
        return None
    if checkpoint is None:
        raise ConfigError(f"--resume: {out} has no ranker checkpoint (checkpoints/latest); "
                          "one is written every save_every steps")
    if not (out / "config.yaml").is_file():   # nothing to check the settings against
        raise ConfigError(f"--resume: {out} has no config.yaml, the settings its checkpoints "
                          "were trained with; start a new training (--overwrite)")
    refused = resume_refusals(out / "config.yaml", cfg, RESUME_MAY_CHANGE)
    if refused:
        raise ConfigError(f"--resume: the ranker in {out} was trained with other settings: "
                          + "; ".join(refused) + f" (old -> new); resume with the run's "
                          f"({out / 'config.yaml'}), or start a new one in another out; only "
                          f"{', '.join(RESUME_MAY_CHANGE)} may change on resume")
    return checkpoint


def train_ranker(cfg: RankerTrainConfig, *, console: Console | None = None,
                 overwrite: bool = False, resume: bool = False) -> dict[str, Any]:
    """Build the examples, train, measure recall@k before and after; the summary holds
    `final` (the ranker's folder). Every `save_every` steps, and at the last, a checkpoint
    (the ranker, its optimizer and sampler, the random states, the figures so far) lets
    `resume` go on where a stopped training was, drawing what a straight one would; Ctrl-C
    raises `Interrupted`, which names it. With `overwrite` an old ranker in `out` stays
    until the new final/ replaces it; summary.json, written last, marks the training
    finished."""
    from seekrl.agent.trajectory import read_trajectories
    from seekrl.data.qa import load_qa
    from seekrl.recipes.setup import open_index, sample_queries

    console = console or Console()
    out = Path(cfg.out)
    final = out / "final"
    checkpoint = check_ranker_run(out, cfg, overwrite=overwrite, resume=resume)
    state = None
    if checkpoint is not None:
        state = torch.load(checkpoint / "state.pt", map_location="cpu", weights_only=False)
        if state["step"] > cfg.steps:
            raise ConfigError(f"steps: {cfg.steps}, and {checkpoint} has done {state['step']}; "
                              "resume with at least as many")
    started = time.time()
    first = open_index(cfg.index, "the ranker orders its candidates")
    records: list[dict[str, Any]] = []
    for path in cfg.trajectories:
        records += trajectory_records(read_trajectories(path, tokens=False))
    for path in cfg.data:
        # a FlashRAG folder gives its train split (its first file found was test's)
        with in_file(path):
            records += qa_records(load_qa(path, "train"), question_queries=cfg.question_queries)
    seen, unique = set(), []
    for r in records:   # one record per (query, gold set): the first wins
        # without gold ids a record's labels come from its own episode (what it was
        # shown, whether it ended right), so those tell records apart too
        key = (r["query"].lower(), tuple(r["gold_ids"])) if r["gold_ids"] else \
            (r["query"].lower(), (), tuple(r["answers"]), tuple(r["shown"]), r["right"])
        if key not in seen:
            seen.add(key)
            unique.append(r)
    unique = sample_queries(unique, cfg.seed, cfg.limit)
    pools = first.search([r["query"] for r in unique], cfg.candidates)
    examples = training_examples(unique, pools)
    if not examples:
        raise ValueError(f"no query of {len(unique)} has both a positive and a negative among "
                         f"its {cfg.candidates} candidates: nothing to learn from")
    console.print(f"{len(examples)} ranking examples from {len(unique)} queries "
                  f"({cfg.candidates} candidates each)")
    torch.manual_seed(cfg.seed)
    if checkpoint is None:
        ranker = load_ranker(cfg.model, kind=cfg.kind, device=cfg.device, max_len=cfg.max_len,
                             temperature=cfg.temperature, first=first)
    else:
        ranker = load_ranker(str(checkpoint / "ranker"), device=cfg.device, first=first)
        if ranker.kind == "query":   # a trained one loads unbound (a fresh one binds to `first`)
            ranker.bind(first)
    held_questions, held = [], []
    for path in cfg.eval_data:
        with in_file(path):
            questions = load_qa(path, "dev")
            held += [r for r in qa_records(questions) if r.get("hop_gold")]
        held_questions += questions
    asked = question_records(held_questions)   # questions without a chain, as ranker eval
    if cfg.eval_data and not held and not asked:
        raise ValueError(f"eval_data: no question with gold documents in "
                         f"{', '.join(map(str, cfg.eval_data))} (recall@k reads each "
                         "question's metadata.chain, as `seekrl world` writes it, else its "
                         "metadata.gold_doc_ids or metadata.supporting_titles)")
    logged = [r for path in cfg.eval_trajectories
              for r in trajectory_records(read_trajectories(path, tokens=False))]
    recall: dict[str, float] = {}
    question: dict[str, float] = {}
    hit: dict[str, float] = {}

    def measure(when: str, retriever) -> None:
        if held:
            recall[when] = hop_recall(retriever, held, cfg.topk)
        if asked:
            question[when] = question_recall(retriever, asked, cfg.topk)
        if logged:
            hit[when] = gold_hit_rate(retriever, logged, cfg.topk, "eval_trajectories")
        parts = ([f"recall@{cfg.topk} of {len(held)} held-out hop queries "
                  f"{recall[when]:.3f}"] if held else []) + \
                ([f"question recall@{cfg.topk} of {len(asked)} held-out questions "
                  f"{question[when]:.3f}"] if asked else []) + \
                ([f"gold hit@{cfg.topk} of {len(logged)} held-out logged searches "
                  f"{hit[when]:.3f}"] if logged else [])
        if parts:
            console.print(f"{when}: " + ", ".join(parts))

    updater = RankerUpdater(ranker, cfg.lr, seed=cfg.seed)
    done = 0
    try:   # Ctrl-C from here on names the checkpoint to go on from, if there is one
        if state is None:
            claim_ranker_dir(out, cfg, overwrite)
            measure("first_stage", first)
            measure("before", ranked_retriever(first, ranker, cfg.candidates))
            log, pending = [], []
        else:
            updater.load_state_dict(state["updater"])
            set_rng_state(state["rng"])
            done, log, pending = state["step"], state["log"], state["pending"]
            for figures, saved in ((recall, state["recall"]), (question, state["question"]),
                                   (hit, state["hit"])):
                figures.update(saved)   # the start's, measured once
            console.print(f"resuming from {checkpoint}: {done} of {cfg.steps} steps done")
        while done < cfg.steps:
            # blocks end at each tenth step (a logged loss, the mean over its ten) and each
            # checkpoint; the sampler draws step by step, so the blocks change no draw
            n = min(10 - done % 10, cfg.steps - done,
                    cfg.save_every - done % cfg.save_every if cfg.save_every else cfg.steps)
            stats = updater.update(examples, n, cfg.batch_size)
            pending.append((stats["ranker_loss"], n))
            done += n
            if done % 10 == 0 or done == cfg.steps:
                loss = sum(v * k for v, k in pending) / sum(k for _, k in pending)
                log.append({"step": done, "ranker_loss": round(loss, 5),
                            "ranker_examples": stats["ranker_examples"]})
                pending = []
                console.print(f"step {done}/{cfg.steps}: loss {loss:.4f}")
            if cfg.save_every and (done % cfg.save_every == 0 or done == cfg.steps):
                # the last too: a stop while "after" is measured costs no training
                save_ranker_checkpoint(out / "checkpoints", done, ranker, {
                    "step": done, "updater": updater.state_dict(), "rng": rng_state(),
                    "log": log, "pending": pending, "recall": recall, "question": question,
                    "hit": hit})
        measure("after", ranked_retriever(first, ranker, cfg.candidates))
        # whole or not at all, and the old one (--overwrite) kept until then
        tmp = final.with_name(f"final.tmp{process_tag()}")
        replace_dir(ranker.save(tmp), final)
        summary = {"final": str(final), "kind": ranker.kind, "examples": len(examples),
                   "queries": len(unique), "candidates": cfg.candidates, "k": cfg.topk,
                   "recall": recall, "question_recall": question, "gold_hit": hit,
                   "held_out_queries": len(held), "held_out_questions": len(asked),
                   "held_out_searches": len(logged), "log": log,
                   "minutes": round((time.time() - started) / 60, 2),
                   "config": cfg.model_dump(mode="json")}
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
    except KeyboardInterrupt:
        raise Interrupted(done, latest_checkpoint(out), cfg.save_every, cfg.steps,
                          saves_last=True) from None
    return summary


def claim_ranker_dir(out: Path, cfg: RankerTrainConfig, overwrite: bool) -> None:
    """`out` ready for a new training, once its inputs are read and its model loaded (a bad
    input never costs the old ranker): with `overwrite` the old one's files go. Its config
    is kept for a resume to check against."""
    from seekrl.config import dump_config

    out.mkdir(parents=True, exist_ok=True)
    if overwrite:   # final/ goes when the new one replaces it
        remove_outputs(out, ("checkpoints", "summary.json", "config.yaml"))
    dump_config(cfg, out / "config.yaml")


def save_ranker_checkpoint(folder: Path, step: int, ranker, state: dict) -> None:
    """`folder/step-N`: the ranker as `final/` holds it (`ranker/`) and what a resume needs
    (`state.pt`), written whole or not at all and named by `latest` only then; the newest
    alone is kept (`write_checkpoint`), after the training too, as SFT's are."""
    from seekrl.recipes.checkpoint import write_checkpoint

    def write(tmp: Path) -> None:
        ranker.save(tmp / "ranker")
        torch.save(state, tmp / "state.pt")

    write_checkpoint(folder, step, write, keep_last=1)
