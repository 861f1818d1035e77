"""The `seekrl` command: one thin function per sub-command; the work lives in the library."""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from seekrl import config as schema  # the configs' types
from seekrl.errors import DataError, SeekrlError
from seekrl.retrieval.base import RetrievalError
from seekrl.rl.methods import NEEDS_PRM, PROCESS_METHODS

# what a command reports in one line (bad input, a missing file or resource), never a bug's
# traceback: every seekrl error derives from SeekrlError; OSError covers a folder where a
# file was meant (and back), a read-only or full disk: the path is in its message
ERRORS = (SeekrlError, OSError, ValueError)

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Train LLM search agents with RL and process supervision.")
console = Console()
err_console = Console(stderr=True, soft_wrap=True)
# the names `--process` takes (rl/methods.py), for the help texts
_PROCESS_METHODS = " | ".join(m for m in PROCESS_METHODS if m != "outcome")
_DEMO_METHODS = " | ".join(m for m in PROCESS_METHODS if m != "outcome" and m not in NEEDS_PRM)

# OpenMP's wait policy is read once, when torch first loads libgomp, so it is set here,
# before any command imports torch (a value set already wins). PASSIVE: an idle worker
# sleeps at once instead of spinning first. Two torch jobs sharing cores otherwise burn each
# other's time in spins: beside other work on 2 cores, the tiny model decoded 11 tokens/s
# with 2 spinning threads, 74 with 2 passive ones, 117 with 1 (bench/RESULTS.md, "Threads")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# `seekrl eval`'s episode options take their defaults from the `rollout:` section's type
# (the episode settings and the backend) and are checked by it (`_episode_options`)
_EPISODE = schema.RolloutSettings.model_fields

# the --print-config option of every command that reads a config
PrintConfig = Annotated[bool, typer.Option(
    help="print the resolved config (every key, defaults filled in) and stop")]

# the --threads option of every command that runs a model
Threads = Annotated[Optional[int], typer.Option(
    help="CPU threads torch uses (default: OMP_NUM_THREADS when set, else the cores other "
         "processes leave free, at least 1)", show_default=False)]


def _threads(threads: Optional[int]) -> None:
    """Set torch's threads for this run and say how many on one line of stderr, with a
    warning when the machine is busy (rank 0 alone speaks under torchrun)."""
    from seekrl.runtime import plan_threads, use_threads

    plan = plan_threads(threads)
    use_threads(plan)
    if os.environ.get("RANK", "0") == "0":
        err_console.print(plan.line, markup=False, highlight=False)


def _print_config(cfg) -> None:
    """The config as YAML, every key with its value and what it means: a starting point
    for a config file."""
    from seekrl.config import annotated_yaml

    print(annotated_yaml(cfg), end="")


def _fail(err: Exception) -> None:
    from rich.markup import escape

    # the message as text: a path such as `data[/old]` is no markup (a MarkupError, or
    # `data[old]` printed as `data`)
    err_console.print(f"[bold red]error:[/] {escape(str(err))}", highlight=False)
    for note in getattr(err, "__notes__", ()):     # e.g. how to resume a dense build
        err_console.print(f"  {note}", markup=False, highlight=False)
    raise typer.Exit(2)


def _refuse_to_replace(out: Path, what: str, names: tuple[str, ...] = (), *,
                      overwrite: bool) -> list[str]:
    """What of an earlier run `out` holds (the `names` in the folder, or the file itself);
    refused in one line unless `overwrite`."""
    if names:
        held = [n for n in names if (out / n).exists()] if out.is_dir() else []
    else:
        held = [out.name] if out.exists() else []
    if held and not overwrite:
        raise FileExistsError(f"--out: {out} already holds {what}"
                              + (f" ({', '.join(held)})" if names else "")
                              + "; pass --overwrite to replace it, or choose another --out")
    return held


@app.command()
def world(
    out: Annotated[Path, typer.Option(help="output folder")],
    seed: Annotated[int, typer.Option(help="random seed: same seed, same world")] = 0,
    difficulty: Annotated[str, typer.Option(help="easy | medium | hard")] = "medium",
    entities: Annotated[int, typer.Option(help="real entities over all splits")] = 1500,
    n_train: Annotated[int, typer.Option("--train", help="train questions")] = 2000,
    n_dev: Annotated[int, typer.Option("--dev", help="dev questions")] = 200,
    n_test: Annotated[int, typer.Option("--test", help="test questions")] = 200,
    distractors: Annotated[Optional[float], typer.Option(
        help="mean distractor docs per entity (default: by difficulty)")] = None,
    hop_mix: Annotated[Optional[str], typer.Option(
        help="chain lengths and weights, e.g. '2:0.5,3:0.3,4:0.2' (default: by difficulty)")] = None,
    comparison_share: Annotated[Optional[float], typer.Option(
        help="share of comparison questions (default: by difficulty)")] = None,
    doc_words: Annotated[Optional[str], typer.Option(
        help="words a document holds, LOW,HIGH (default 60,125; the demo's world: 12,30)")] = None,
    overwrite: Annotated[bool, typer.Option(help="replace a world already in out")] = False,
):
    """Generate the synthetic multi-hop world: corpus.jsonl and train/dev/test.jsonl."""
    from seekrl.data.world import WORLD_FILES, WorldConfig, generate_world, write_world

    try:
        _refuse_to_replace(out, "a world", WORLD_FILES, overwrite=overwrite)
        mix = None
        if hop_mix:
            mix = {}
            for part in hop_mix.split(","):
                hops, sep, weight = part.partition(":")
                try:
                    hops, weight = int(hops), float(weight)
                except ValueError:
                    raise ValueError(f"--hop-mix: {part!r} is not HOPS:WEIGHT (expected e.g. "
                                     "'2:0.5,3:0.3,4:0.2')") from None
                if hops in mix:
                    raise ValueError(f"--hop-mix: {hops} hops given twice ({hop_mix!r})")
                mix[hops] = weight
        words = {}
        if doc_words:
            low, _, high = doc_words.partition(",")
            try:
                words["doc_words"] = (int(low), int(high))
            except ValueError:
                raise ValueError(f"--doc-words: {doc_words!r} is not LOW,HIGH (expected e.g. "
                                 "'12,30')") from None
        try:
            cfg = WorldConfig(seed=seed, difficulty=difficulty, entities=entities,
                              n_train=n_train, n_dev=n_dev, n_test=n_test,
                              distractors=distractors, hop_mix=mix,
                              comparison_share=comparison_share, **words)
        except ValueError as err:   # the library names its keys: say the flags
            import re
            flags = {"n_train": "--train", "n_dev": "--dev", "n_test": "--test"}
            raise ValueError(re.sub(r"^(\w+):", lambda m: flags.get(
                m[1], "--" + m[1].replace("_", "-")) + ":", str(err))) from None
        if out.exists() and not out.is_dir():   # before the world is generated
            raise NotADirectoryError(f"--out: {out} is a file; a world is a folder")
        w = generate_world(cfg)
        paths = write_world(w, out)
    except ERRORS as err:
        _fail(err)
    stats = w.stats()
    console.print(f"world ({difficulty}, seed {seed}): {stats['docs']} documents "
                  f"({stats['distractor_docs']} distractors), "
                  + ", ".join(f"{s} {v['questions']}" for s, v in stats["splits"].items())
                  + f" questions -> {paths['corpus'].parent}")
    from seekrl.retrieval.index import MANIFEST, corpus_mismatch

    for folder in sorted(p for p in out.iterdir() if (p / MANIFEST).is_file()):
        try:
            why = corpus_mismatch(folder, paths["corpus"])
        except ERRORS:
            continue
        if why:   # an index kept in the world folder, built from the corpus just replaced
            err_console.print(f"[yellow]warning:[/] {why}", highlight=False)


@app.command()
def index(
    corpus: Annotated[Path, typer.Option(help="corpus JSONL: {id, contents} lines")],
    out: Annotated[Path, typer.Option(help="index folder to write")],
    retriever: Annotated[str, typer.Option(help="bm25 | dense | hybrid")] = "bm25",
    encoder: Annotated[Optional[str], typer.Option(
        help="dense encoder: name or path (default: bundled all-MiniLM-L6-v2)")] = None,
    index_type: Annotated[str, typer.Option(
        help="dense index: flat (exact) | hnsw (fast, ~flat's memory) | ivfpq (compressed, "
        "lower recall)")] = "flat",
    pooling: Annotated[Optional[str], typer.Option(
        help="dense: mean | cls | max | lasttoken (default: the encoder family's, e.g. mean "
        "for e5)")] = None,
    query_prefix: Annotated[Optional[str], typer.Option(
        help="dense: text before each query (default: the family's, 'query: ' for e5)")] = None,
    doc_prefix: Annotated[Optional[str], typer.Option(
        help="dense: text before each document (default: the family's, 'passage: ' for e5)")] = None,
    faiss: Annotated[Optional[Path], typer.Option(
        "--faiss", help="import this existing faiss index (Search-R1 / FlashRAG e5_Flat.index, "
        "built over CORPUS with --encoder) instead of encoding")] = None,
    copy_faiss: Annotated[bool, typer.Option(
        help="with --faiss: copy the file (default: hard link, else symlink)")] = False,
    resume: Annotated[bool, typer.Option(
        help="dense: continue a build that stopped, from the shards it saved")] = False,
    device: Annotated[str, typer.Option(help="dense: where the encoder runs, cpu | cuda")] = "cpu",
    overwrite: Annotated[bool, typer.Option(help="replace an existing index")] = False,
    skip_bad: Annotated[bool, typer.Option(help="skip malformed corpus lines, and report them")] = False,
    threads: Threads = None,
):
    """Index a corpus for retrieval and persist it with a manifest (or import a faiss index)."""
    from seekrl.retrieval.index import (
        OutputExists,
        build_index,
        import_faiss_index,
        read_manifest,
    )

    try:
        if retriever not in ("bm25", "dense", "hybrid"):
            raise ValueError(f"--retriever: expected bm25, dense or hybrid, got {retriever!r}")
        if retriever == "bm25" and faiss is None:   # the dense options would be dropped unsaid
            given = [flag for flag, value, default in (
                ("--encoder", encoder, None), ("--index-type", index_type, "flat"),
                ("--pooling", pooling, None), ("--query-prefix", query_prefix, None),
                ("--doc-prefix", doc_prefix, None), ("--device", device, "cpu"),
                ("--resume", resume, False), ("--threads", threads, None)) if value != default]
            if given:
                raise ValueError(f"{', '.join(given)}: dense options, and --retriever is bm25 "
                                 "(use --retriever dense or hybrid)")
        from seekrl.retrieval.dense import INDEX_TYPES

        if index_type not in INDEX_TYPES:   # before the corpus is stored
            raise ValueError(f"--index-type: expected {', '.join(INDEX_TYPES[:-1])} or "
                             f"{INDEX_TYPES[-1]}, got {index_type!r}")
        if faiss is None and copy_faiss:
            raise ValueError("--copy-faiss: copies the file --faiss imports, and no --faiss "
                             "is given")
        if faiss is not None:
            # an import encodes nothing: these would be dropped unsaid (hybrid as dense alone)
            given = [flag for flag, value, default in (
                ("--index-type", index_type, "flat"), ("--resume", resume, False),
                ("--device", device, "cpu")) if value != default]
            if retriever == "hybrid":
                given.insert(0, "--retriever hybrid")
            if given:
                raise ValueError(f"{', '.join(given)}: not used by --faiss, which imports a "
                                 "built dense index as it is (its type is the file's)")
            if encoder is None:
                raise RetrievalError("--faiss needs --encoder: the model the index was built "
                                     "with (e.g. intfloat/e5-base-v2)")
            if skip_bad:
                raise RetrievalError("--faiss cannot --skip-bad: a skipped corpus line would "
                                     "shift every later document off its vector")
            _threads(threads)
            path = import_faiss_index(corpus, faiss, out, encoder=encoder, pooling=pooling,
                                      query_prefix=query_prefix, doc_prefix=doc_prefix,
                                      copy=copy_faiss, overwrite=overwrite)
            retriever = "dense, imported"
        else:
            if retriever != "bm25":
                _threads(threads)
            path = build_index(corpus, out, retriever, encoder=encoder, index_type=index_type,
                               overwrite=overwrite, skip_bad=skip_bad, pooling=pooling,
                               query_prefix=query_prefix, doc_prefix=doc_prefix,
                               resume=resume, device=device)
    except OutputExists as err:   # the library's words are Python's (overwrite=True)
        _fail(FileExistsError(err.said("--overwrite")))
    except ERRORS as err:
        _fail(err)
    except KeyboardInterrupt as err:   # a dense build's note says where its shards are
        kept = getattr(err, "__notes__", None)
        _stopped("interrupted: " + (kept[-1] if kept else
                                    f"no index was written; {out} is as it was"))
    m = read_manifest(path)
    skipped = f", skipped {m['skipped_lines']} bad lines" if m["skipped_lines"] else ""
    console.print(f"indexed {m['doc_count']} documents ({retriever}) in "
                  f"{m['build_seconds']} s{skipped} -> {path}")
    for line, reason in m.get("skipped_examples", [])[:10]:   # and why
        console.print(f"  line {line}: {reason}", markup=False, highlight=False)
    if m["skipped_lines"] > 10:
        console.print(f"  ... {m['skipped_lines'] - 10} more (manifest.json lists the "
                      "first 20)", markup=False)


@app.command()
def search(
    query: Annotated[list[str], typer.Argument(help="one or more queries")],
    index: Annotated[Optional[Path], typer.Option(help="index folder")] = None,
    url: Annotated[Optional[str], typer.Option(help="a running retrieval server instead")] = None,
    k: Annotated[int, typer.Option("-k", "--topk", help="hits per query")] = 5,
):
    """Print the top-k documents for each query."""
    from seekrl.eval.show import print_hits

    try:
        if k < 1:
            raise ValueError(f"-k/--topk: expected at least 1, got {k}")
        if not all(q.strip() for q in query):
            raise ValueError("query: an empty query finds nothing; give some words")
        retriever = _retriever(index, url)
        results = retriever.search(query, k)
    except ERRORS as err:
        _fail(err)
    for q, hits in zip(query, results):
        print_hits(console, q, hits)


@app.command()
def serve(
    index: Annotated[Optional[Path], typer.Option(help="index folder")] = None,
    simulate: Annotated[Optional[str], typer.Option(
        help="instead of an index: a causal LM (HF id or path, smollm2-135m) that writes each "
             "query's documents (simulated search, ZeroSearch)")] = None,
    noise: Annotated[float, typer.Option(
        help="with --simulate: the share of queries answered with noisy documents")] = 0.0,
    words: Annotated[Optional[int], typer.Option(
        help="with --simulate: the length of a document the simulator is asked for "
             "(default 30)")] = None,
    sim_max_new_tokens: Annotated[Optional[int], typer.Option(
        help="with --simulate: tokens the simulator writes per query, all its documents "
             "(default 256)")] = None,
    sim_temperature: Annotated[Optional[float], typer.Option(
        help="with --simulate: its sampling temperature, 0 greedy (default 0.8)")] = None,
    ranker: Annotated[Optional[str], typer.Option(
        help="reorder the index's top --candidates with a ranker (`seekrl ranker train`'s "
             "final/, or minilm) and answer its best topk")] = None,
    candidates: Annotated[Optional[int], typer.Option(
        help="with --ranker: first-stage documents it orders (default 10)")] = None,
    host: Annotated[str, typer.Option(help="bind address (loopback by default)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port")] = 8000,
    device: Annotated[str, typer.Option(help="where a dense encoder runs: cpu | cuda")] = "cpu",
    faiss_gpu: Annotated[bool, typer.Option(
        help="search a flat / IVF dense index on the GPU too (needs faiss-gpu, --device cuda)")]
    = False,
    max_batch_size: Annotated[int, typer.Option(help="queries per micro-batch")] = 16,
    max_wait_ms: Annotated[float, typer.Option(help="how long a micro-batch waits to fill")] = 2.0,
    cache_size: Annotated[int, typer.Option(help="LRU cache entries; 0 disables")] = 10000,
    default_topk: Annotated[int, typer.Option(help="topk when a request gives none")] = 3,
    max_topk: Annotated[int, typer.Option(help="largest topk a request may ask for")] = 100,
    max_queries: Annotated[int, typer.Option(help="queries per request")] = 4096,
    max_query_chars: Annotated[int, typer.Option(help="characters per query")] = 4096,
    max_hits: Annotated[int, typer.Option(
        help="documents in one answer (queries x topk)")] = 65536,
    max_pending: Annotated[int, typer.Option(
        help="queries waiting for the retriever before a request is answered 503 (busy)")]
    = 65536,
    body_timeout_s: Annotated[float, typer.Option(
        help="seconds to receive a request's body before answering 408")] = 60.0,
    no_batching: Annotated[bool, typer.Option(
        "--no-batching", help="one retriever call per request")] = False,
    no_index_process: Annotated[bool, typer.Option(
        "--no-index-process",
        help="keep the index in the server process (default: a child process)")] = False,
    log_level: Annotated[str, typer.Option(help="uvicorn log level")] = "info",
    threads: Threads = None,
):
    """Serve an index (or a simulated search engine) over HTTP, wire-compatible with the
    Search-R1 retrieval server."""

    from seekrl.retrieval.server import run_server

    try:
        if simulate is not None and (given := ["--faiss-gpu"] * faiss_gpu
                                     + ["--no-index-process"] * no_index_process):
            # both act on an index; with a simulator they were ignored unsaid (said before
            # the device check, which would ask for --device cuda first)
            raise ValueError(f"{', '.join(given)}: settings of an index (--index); a simulated "
                             "engine has none")
        if faiss_gpu and not device.startswith("cuda"):
            raise ValueError("--faiss-gpu: the index goes to the GPU the encoder uses; give "
                             "--device cuda")
        if device != "cpu":
            from seekrl.runtime import check_device
            check_device(device)
        if (index is None) == (simulate is None):
            raise ValueError("serve: give --index (an index folder) or --simulate MODEL, one "
                             "of the two")
        _simulator_options({"words": words, "max_new_tokens": sim_max_new_tokens,
                            "temperature": sim_temperature})
        candidates = _ranker_candidates(ranker, candidates)
        _threads(threads)   # a dense encoder's, a ranker's or a simulator's
        make_decoder = None
        if simulate is not None:   # the simulator decodes with the rollout engine's loop
            from seekrl.agent.backends import text_decoder as make_decoder
        run_server(index, host=host, port=port, log_level=log_level, device=device,
                   faiss_gpu=faiss_gpu, simulate=simulate, noise=noise, ranker=ranker,
                   make_decoder=make_decoder, words=words, sim_max_new_tokens=sim_max_new_tokens,
                   sim_temperature=sim_temperature,
                   candidates=candidates, index_process=False if no_index_process else None,
                   batching=not no_batching,
                   max_batch_size=max_batch_size, max_wait_ms=max_wait_ms,
                   cache_size=cache_size, default_topk=default_topk, max_topk=max_topk,
                   max_queries=max_queries, max_query_chars=max_query_chars,
                   max_hits=max_hits, max_pending=max_pending,
                   body_timeout_s=body_timeout_s)
    except ERRORS as err:
        _fail(err)


def _ranker_candidates(ranker: str | None, candidates: int | None) -> int:
    """--candidates checked against --ranker: the number of first-stage documents the ranker
    orders (10 when not given); refused without a ranker, where nothing would read it."""
    if candidates is None:
        return 10
    if ranker is None:
        raise RetrievalError(f"--candidates {candidates}: the first-stage documents a --ranker "
                             "orders; give --ranker too, or leave --candidates out")
    if candidates < 1:
        raise RetrievalError(f"--candidates: expected at least 1, got {candidates}")
    return candidates


def _simulator_options(values: dict) -> None:
    """`seekrl serve`'s simulator options checked by the ranges of training's `simulator:`
    section (`SimulatorSettings`), a bad one refused naming its option; None: not given."""
    from pydantic import ValidationError

    from seekrl.config import SimulatorSettings

    flags = {"words": "--words", "max_new_tokens": "--sim-max-new-tokens",
             "temperature": "--sim-temperature"}
    for key, value in values.items():
        if value is not None:
            try:
                SimulatorSettings.model_validate({key: value})
            except ValidationError as err:
                raise ValueError(f"{flags[key]}: {err.errors()[0]['msg']} (got {value!r})") \
                    from None


@app.command()
def oracle(
    world_dir: Annotated[Path, typer.Option("--world", help="world folder (seekrl world)")],
    index: Annotated[Path, typer.Option(help="index of the world's corpus")],
    out: Annotated[Path, typer.Option(help="trajectory JSONL to write")],
    split: Annotated[str, typer.Option(help="train | dev | test")] = "train",
    k: Annotated[int, typer.Option("-k", "--topk", help="documents per search")] = 3,
    limit: Annotated[Optional[int], typer.Option(help="only the first N questions")] = None,
    max_queries: Annotated[int, typer.Option(
        help="sub-queries per search turn: above 1, independent lookups are searched together "
             "(q1 ## q2), for training with rollout.max_queries")] = 1,
    plan: Annotated[str, typer.Option(
        help="the first turn's plan: count (\"To answer this I need N lookups.\") or none "
             "(only the first lookup; whether to search again is decided after reading)")
    ] = "count",
    judge: Annotated[str, typer.Option(
        help="a comparison's last turn: values (side by side) or ordered (also the values "
             "in order and the end the question wants, then the answer)")] = "values",
    overwrite: Annotated[bool, typer.Option(help="replace an existing out file")] = False,
):
    """Write oracle trajectories (the ideal search episodes) for the SFT warm-up."""
    from seekrl.agent.oracle import check_judge, check_plan, write_oracle_trajectories
    from seekrl.data.qa import read_qa_jsonl
    from seekrl.retrieval.index import check_index_corpus, load_index

    try:
        check_plan(plan)   # before anything is read
        check_judge(judge)
        if split not in ("train", "dev", "test"):
            raise ValueError(f"--split: expected train, dev or test, got {split!r}")
        if limit is not None and limit < 1:
            raise ValueError(f"--limit: expected at least 1, got {limit}")
        if k < 1:
            raise ValueError(f"-k/--topk: expected at least 1, got {k}")
        if not 1 <= max_queries <= 8:
            raise ValueError(f"--max-queries: expected 1 to 8, got {max_queries}")
        if out.is_dir():
            raise IsADirectoryError(f"--out: {out} is a folder; oracle episodes are one JSONL "
                                    "file")
        if not out.parent.is_dir():
            raise FileNotFoundError(f"--out: no folder {out.parent} to write {out.name} in")
        _refuse_to_replace(out, "oracle episodes", overwrite=overwrite)
        split_file = world_dir / f"{split}.jsonl"
        if not split_file.is_file():
            raise FileNotFoundError(f"--world: {world_dir} has no {split}.jsonl (a `seekrl "
                                    "world` folder)")
        examples = read_qa_jsonl(split_file)[:limit]
        if not examples:
            raise ValueError(f"{split_file}: no questions")
        if (world_dir / "corpus.jsonl").is_file():   # the index must be this world's
            check_index_corpus(index, world_dir / "corpus.jsonl")
        retriever = load_index(index)
        stats = write_oracle_trajectories(examples, retriever, out, k=k, max_queries=max_queries,
                                          plan=plan, judge=judge)
    except ERRORS as err:
        _fail(err)
    console.print(f"{stats.summary()} -> {out}")


@app.command()
def demo(
    out: Annotated[Path, typer.Option(help="run folder")] = Path("runs/demo"),
    seed: Annotated[int, typer.Option(help="world and training seed")] = 0,
    difficulty: Annotated[str, typer.Option(help="easy | medium | hard")] = "medium",
    model: Annotated[str, typer.Option(help="policy: HF id or path, or the bundled default")]
    = "smollm2-135m",
    eval_questions: Annotated[int, typer.Option(help="test questions (the same at every stage)")] = 40,
    sft_steps: Annotated[Optional[int], typer.Option(
        help="SFT optimizer steps (default: the preset's)")] = None,
    sft_batch: Annotated[Optional[int], typer.Option(
        help="oracle episodes per SFT step (default: the preset's)")] = None,
    rl_steps: Annotated[Optional[int], typer.Option(
        help="RL steps (default: the preset's)")] = None,
    rl_minutes: Annotated[Optional[float], typer.Option(
        help="also stop RL after the step that passes this many minutes")] = None,
    advantage: Annotated[Optional[str], typer.Option(
        help="grpo | dr_grpo | rloo | reinforce_pp | gae (default: the preset's)")] = None,
    process: Annotated[Optional[str], typer.Option(
        help=f"also run RL with this process-supervision method ({_DEMO_METHODS}) from "
             "the same SFT checkpoint at the same rollout-token budget, and compare")] = None,
    questions_per_step: Annotated[Optional[int], typer.Option(
        help="RL questions per step (default: the preset's)")] = None,
    group_size: Annotated[Optional[int], typer.Option(
        help="RL rollouts per question, G (default: the preset's)")] = None,
    train_layers: Annotated[Optional[int], typer.Option(
        help="train the top N transformer blocks, 0: all of them (default: the presets')")] = None,
    dtype: Annotated[str, typer.Option(
        help="auto (bf16-mixed where the CPU multiplies bfloat16 natively, else float32) | "
             "float32 | bf16-mixed")] = "auto",
    presets: Annotated[Optional[Path], typer.Option(
        help="a folder with your copies of src/seekrl/presets/demo/sft.yaml and rl.yaml (the SFT and RL "
             "stages' settings), edited")] = None,
    overwrite: Annotated[bool, typer.Option(help="replace a demo run already in out")] = False,
    threads: Threads = None,
):
    """The whole pipeline on the built-in synthetic world, on CPU: world, index, untrained
    eval, SFT warm-up, eval, RL, eval, report (about 24 minutes on 2 cores that multiply
    bfloat16 natively; longer in float32 on AVX2-only cores)."""
    from seekrl.config import ConfigError, build_config
    from seekrl.demo import run_demo
    from seekrl.recipes.pipeline import DemoConfig

    # the options given: keys over the stages' presets (src/seekrl/presets/demo/sft.yaml, rl.yaml)
    sft: dict = {} if sft_steps is None else {"max_steps": sft_steps}
    rl: dict = {key: value for key, value in (
        ("steps", rl_steps), ("max_minutes", rl_minutes), ("questions_per_step",
        questions_per_step), ("group_size", group_size)) if value is not None}
    if advantage is not None:
        rl["algo"] = {"advantage": advantage}
    if train_layers is not None:
        sft["train_layers"] = rl["train_layers"] = train_layers or None
    # the option each key came from; a stage's key is the option's only if it was given
    # (else it is its preset's)
    stage_keys = {"demo sft": (sft, {"max_steps": "--sft-steps",
                                     "train_layers": "--train-layers"}),
                  "demo rl": (rl, {"steps": "--rl-steps", "max_minutes": "--rl-minutes",
                                   "questions_per_step": "--questions-per-step",
                                   "group_size": "--group-size",
                                   "algo.advantage": "--advantage",
                                   "train_layers": "--train-layers"})}
    given = {"options": {"n_test": "--eval-questions", "sft_batch": "--sft-batch",
                         "seed": "--seed", "difficulty": "--difficulty", "model": "--model",
                         "process": "--process", "dtype": "--dtype", "presets": "--presets"},
             **{source: {k: o for k, o in keys.items() if k.split(".")[0] in stage}
                for source, (stage, keys) in stage_keys.items()}}
    try:
        if train_layers is not None and train_layers < 0:
            raise ValueError(f"--train-layers: expected 0 (every block) or more, got "
                             f"{train_layers}")
        cfg = build_config(DemoConfig, {
            "seed": seed, "difficulty": difficulty, "model": model, "n_test": eval_questions,
            "process": process, "dtype": dtype, "presets": presets, "sft_batch": sft_batch,
            "sft": sft, "rl": rl}, source="options")
        _threads(threads)
        run_demo(out, cfg, console=console, overwrite=overwrite)
    except ConfigError as err:
        _fail(ConfigError(_name_options(str(err), given)))
    except ERRORS as err:
        _fail(err)
    except KeyboardInterrupt:   # where it stopped and how to start again, not "Aborted!"
        _stopped(f"interrupted: {out} holds a partial demo run; start again with: "
                 f"seekrl demo --out {out} --overwrite")


def _name_options(text: str, options: dict[str, dict[str, str]]) -> str:
    """A config error about keys a command's options set, retold with the options' names:
    `demo rl: steps: ... (got -1)` -> `--rl-steps: ... (got -1)`. `options` maps an error's
    source (its prefix) to {key: option}; keys the options did not set keep their source."""
    source, sep, rest = text.partition(": ")
    names = options.get(source.split(" (preset ")[0])   # a user's preset copy: the same keys
    if not sep or names is None:
        return text
    items: list[list[str]] = []   # [key, message] per error; "; expected ..." goes on one
    for part in rest.split("; "):
        key, colon, msg = part.partition(": ")
        if items and (not colon or " " in key):
            items[-1][1] += "; " + part
        else:
            items.append([key, msg] if colon else ["", part])
    if not any(key in names for key, _ in items):
        return text
    return "; ".join(f"{names[key]}: {msg}" if key in names else
                     f"{source}: {key}: {msg}" if key else f"{source}: {msg}"
                     for key, msg in items)


@app.command()
def table(
    runs: Annotated[list[Path], typer.Argument(help="run folders written by `seekrl eval`")],
    metric: Annotated[str, typer.Option(help="em | f1 | cover_em | searches | ...")] = "em",
    label: Annotated[Optional[list[str]], typer.Option(
        help="a row name per run, in order (default: method · model)")] = None,
):
    """Compare evaluation runs in the Search-R1 / FlashRAG layout: a row per run, a column
    per data set, single-hop / multi-hop / overall averages."""
    import json

    from seekrl.eval.report import METRICS_FILE, check_metrics, run_label, suite_table, unique_labels

    try:
        if label and len(label) != len(runs):
            raise ValueError(f"--label: {len(label)} labels for {len(runs)} runs")
        rows = []
        for i, run in enumerate(runs):
            path = run / METRICS_FILE
            if not path.is_file():
                raise FileNotFoundError(f"{run}: no {METRICS_FILE} (not a `seekrl eval` run)")
            try:
                metrics = json.loads(path.read_text(encoding="utf-8"))
            except ValueError as e:
                raise DataError(f"not JSON ({e})", path=str(path)) from None
            check_metrics(metrics, path)
            rows.append((label[i] if label else run_label(metrics, run.name), metrics))
        if not label:
            names = unique_labels([r[0] for r in rows], [run.name for run in runs])
            rows = [(n, m) for n, (_, m) in zip(names, rows)]
        known = {k for _, m in rows for d in (m.get("datasets") or {}).values()
                 if isinstance(d, dict) for k in d}
        if known and metric not in known:
            raise ValueError(f"--metric: no run has {metric!r}; the runs have "
                             f"{', '.join(sorted(known))}")
    except ERRORS as err:
        _fail(err)
    console.print(suite_table(rows, key=metric), markup=False, highlight=False, soft_wrap=True)


@app.command("eval")
def eval_(
    data: Annotated[list[str], typer.Option(
        "--data", help="QA data (--data a b, or repeat): a FlashRAG JSONL or Search-R1 parquet "
        "file, a FlashRAG folder[:SPLIT], hf:NAME[:CONFIG]:SPLIT, or flashrag:NAME[:SPLIT] "
        "(nq, triviaqa, popqa, hotpotqa, 2wiki, musique, bamboogle)")],
    out: Annotated[Path, typer.Option(help="run folder to write")],
    more_data: Annotated[Optional[list[str]], typer.Argument(
        help="more QA data, so that `--data a.jsonl b.jsonl` works", show_default=False)] = None,
    model: Annotated[str, typer.Option(help="HF id or path, or the bundled smollm2-135m")] = "smollm2-135m",
    index: Annotated[Optional[Path], typer.Option(help="index folder (in-process retrieval)")] = None,
    retriever_url: Annotated[Optional[str], typer.Option(help="a running `seekrl serve` instead")] = None,
    own_retriever: Annotated[Optional[str], typer.Option(
        "--retriever", help="your own retriever by import path, e.g. mypkg.search:MyRetriever "
        "(a class or function, called with --index's value when given)")] = None,
    method: Annotated[str, typer.Option(help="agent | rag | direct")] = _EPISODE["method"].default,
    prompt: Annotated[str, typer.Option(
        help="the agent's prompt: seekrl | search_r1 (Search-R1's template, document lines and "
        "correction) | data (each question's own, e.g. a Search-R1 parquet's prompt column) | "
        "file:PATH | a template holding {question}")] = _EPISODE["prompt"].default,
    limit: Annotated[Optional[int], typer.Option(help="only the first N questions per file")] = None,
    n_samples: Annotated[int, typer.Option(help="samples per question (K); pass@K when K > 1")] = 1,
    topk: Annotated[int, typer.Option(help="documents per search")] = _EPISODE["topk"].default,
    max_queries: Annotated[int, typer.Option(
        help="sub-queries one search may carry, separated by ## (rollout.max_queries)")
    ] = _EPISODE["max_queries"].default,
    tool: Annotated[Optional[list[str]], typer.Option(
        help="a tool beyond search (rollout.tools): open, or an import path; repeatable")] = None,
    ranker: Annotated[Optional[str], typer.Option(
        help="reorder the retriever's top --candidates with a ranker (`seekrl ranker train`'s "
             "final/, or minilm)")] = None,
    candidates: Annotated[Optional[int], typer.Option(
        help="with --ranker: first-stage documents it orders (default 10)")] = None,
    max_turns: Annotated[int, typer.Option(
        help="model turns per episode")] = _EPISODE["max_turns"].default,
    max_new_tokens: Annotated[int, typer.Option(
        help="generated tokens per turn")] = _EPISODE["max_new_tokens"].default,
    max_total_tokens: Annotated[int, typer.Option(
        help="token budget of an episode")] = _EPISODE["max_total_tokens"].default,
    batch_size: Annotated[int, typer.Option(
        help="episodes generating together")] = _EPISODE["batch_size"].default,
    temperature: Annotated[Optional[float], typer.Option(
        help="0 = greedy; default: greedy for K = 1, 1.0 for K > 1")] = None,
    seed: Annotated[int, typer.Option(help="sampling seed")] = 0,
    dtype: Annotated[str, typer.Option(help="float32 | bfloat16 | float16 | bf16-mixed")] = "float32",
    device: Annotated[str, typer.Option(help="cpu | cuda | cuda:N")] = "cpu",
    skip_bad: Annotated[bool, typer.Option(help="skip malformed question lines, and report them")] = False,
    backend: Annotated[str, typer.Option(
        help="hf (seekrl's decoding loop) | static (its fixed-shape loop for GPUs: CUDA "
             "graphs; hf where its lean forward does not run the model) | vllm (needs vllm, a "
             "GPU machine)")
    ] = _EPISODE["backend"].default,
    attention: Annotated[str, typer.Option(
        help="hf: how decoding computes attention (rollout.attention): default | eager | "
             "sdpa_math | sdpa_efficient | sdpa_flash | sdpa_cudnn")
    ] = _EPISODE["attention"].default,
    overwrite: Annotated[bool, typer.Option(
        help="replace an evaluation already in out (its viewer.html too)")] = False,
    threads: Threads = None,
):
    """Evaluate a policy (agent, rag or direct) on QA files: trajectories and metrics."""
    from seekrl.eval.evaluate import eval_rollout_config, evaluate, load_eval_data
    from seekrl.eval.report import EVAL_RUN_FILES
    from seekrl.models import load_policy
    from seekrl.recipes.checkpoint import remove_outputs

    files = [*data, *(more_data or [])]
    try:
        _refuse_to_replace(out, "an evaluation", EVAL_RUN_FILES, overwrite=overwrite)
        if limit is not None and limit < 1:   # named by the flag, not the library's key
            raise ValueError(f"--limit: expected at least 1, got {limit}")
        if n_samples < 1:
            raise ValueError(f"--n-samples: expected at least 1 episode a question, got "
                             f"{n_samples}")
        settings = _episode_options({
            "method": method, "prompt": prompt, "tools": list(tool or []),
            "max_queries": max_queries, "topk": topk, "max_turns": max_turns,
            "max_new_tokens": max_new_tokens, "max_total_tokens": max_total_tokens,
            "batch_size": batch_size, "backend": backend, "attention": attention})
        if n_samples > 1 and temperature == 0:
            raise ValueError(f"--n-samples {n_samples} with --temperature 0: greedy samples "
                             "are one sample repeated, so pass@K would be pass@1; sample at "
                             "a temperature above 0, or --n-samples 1")
        cfg = eval_rollout_config(settings, n_samples=n_samples, temperature=temperature,
                                  seed=seed)
        if cfg.tools:   # each tool importable, before the model loads
            from seekrl.agent.tools import check_tool_names
            check_tool_names(cfg.tools, key="--tool")
        # the options that cannot go together, before any file is read
        if index is not None and retriever_url is not None:
            raise RetrievalError("give one of --index DIR or --retriever-url URL, not both")
        if own_retriever is not None and retriever_url is not None:
            raise RetrievalError("give one of --retriever MODULE:ATTR or --retriever-url "
                                 "URL, not both")
        if method == "direct":   # it never searches: these would be loaded and unused
            given = [flag for flag, value in (
                ("--index", index), ("--retriever-url", retriever_url),
                ("--retriever", own_retriever), ("--ranker", ranker)) if value is not None]
            # nor does it read the agent's prompt or tools: its instruction is its own
            given += [flag for flag, unused in (
                ("--prompt", prompt != _EPISODE["prompt"].default), ("--tool", bool(tool)),
                ("--max-queries", max_queries != _EPISODE["max_queries"].default)) if unused]
            if given:
                raise RetrievalError(f"{', '.join(given)}: method 'direct' answers without "
                                     "searching, from its own instruction (use agent or rag "
                                     "to search)")
        candidates = _ranker_candidates(ranker, candidates)
        # the settings a later stage would refuse, before the data, index and model load
        from seekrl.agent.factory import backend_refusal, make_backend
        from seekrl.models import DTYPES, MIXED
        from seekrl.runtime import check_device

        why = backend_refusal(backend, "eval", device=device)
        if why:
            raise ValueError(f"--backend: {why}")
        why = schema.attention_refusal(attention, device)
        if why:
            raise ValueError(f"--attention: {why}")
        check_device(device)
        if dtype not in DTYPES and dtype not in MIXED:
            raise ValueError(f"--dtype: expected one of {', '.join([*DTYPES, *MIXED])}, "
                             f"got {dtype!r}")
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {out}: a file; expected a folder for the results")
        _threads(threads)
        skipped: list | None = [] if skip_bad else None
        sources: dict[str, str] = {}
        examples = load_eval_data(files, limit=limit, skipped=skipped, sources=sources)
        if prompt == "data" and method == "agent":   # before the model loads
            from seekrl.agent.rollout import require_own_prompts
            for name, questions in examples.items():
                require_own_prompts(questions, name)
        for report in skipped or []:
            console.print(str(report), markup=False, highlight=False)
        retriever = None
        if own_retriever is not None:
            from seekrl.plugins import make_retriever

            retriever = make_retriever("--retriever", own_retriever,
                                       None if index is None else str(index))
        elif index is not None or retriever_url is not None:
            retriever = _retriever(index, retriever_url)
        if index is not None:             # questions of a world, searched in its own index
            from seekrl.recipes.setup import check_world_index
            check_world_index(str(index), *files)
        if retriever is None and method != "direct":   # any of the three sources will do
            raise RetrievalError(f"method {method!r} needs --index DIR, --retriever-url URL or "
                                 "--retriever MODULE:ATTR")
        if ranker is not None:
            from seekrl.retrieval.ranker import load_ranker, ranked_retriever

            if retriever is None:
                raise RetrievalError("--ranker orders a retriever's candidates: give --index, "
                                     "--retriever-url or --retriever")
            retriever = ranked_retriever(
                retriever, load_ranker(ranker, device=device, first=retriever), candidates)
        generator = None
        if backend == "vllm":
            from seekrl.models import load_tokenizer, resolve_model

            policy, tokenizer = None, load_tokenizer(resolve_model(model))
            generator = make_backend("vllm", tokenizer, model_name=resolve_model(model),
                                     dtype=dtype, seed=seed, max_model_len=max_total_tokens)
        else:
            policy, tokenizer = load_policy(model, dtype=dtype, device=device)
            # static: rows as long as an episode may get
            generator = make_backend(backend, tokenizer, model=policy, attention=attention,
                                     max_model_len=max_total_tokens)
        run_info = {"model": model, "data": sources,
                    "ranker": ranker, "candidates": candidates if ranker else None,
                    "limit": limit, "dtype": dtype, "device": device, "backend": backend,
                    "attention": attention}
        # the old run goes once the new one's episodes are done (a failure or Ctrl-C
        # before leaves it whole)
        replace = (lambda: remove_outputs(out, EVAL_RUN_FILES)) \
            if overwrite and out.is_dir() else None
        metrics = evaluate(policy, tokenizer, retriever, examples, cfg, out, run_info=run_info,
                           console=console, backend=generator, before_write=replace)
    except ERRORS as err:
        _fail(err)
    except KeyboardInterrupt:   # the episodes are written only once all are played
        _stopped(f"interrupted: {out} gets its results only once every episode is played "
                 "(an old run there stays until then); the same command evaluates again")
    from seekrl.eval.report import metrics_markdown

    # plain text: data set names and model ids are not rich markup
    console.print(metrics_markdown(metrics), markup=False, highlight=False, soft_wrap=True)
    console.print(f"-> {out} (trajectories.jsonl, metrics.json, metrics.md); "
                  f"view with `seekrl inspect {out}`")


@app.command("inspect")
def inspect_(
    run_dir: Annotated[Path, typer.Argument(help="run folder written by `seekrl eval`")],
    out: Annotated[Optional[Path], typer.Option(help="HTML file (default RUN_DIR/viewer.html)")] = None,
    model: Annotated[Optional[str], typer.Option(
        help="tokenizer to decode episodes when the run has no episodes.jsonl")] = None,
    limit: Annotated[Optional[int], typer.Option(help="only the first N episodes")] = None,
):
    """Write a self-contained HTML viewer of a run: metrics, then every episode turn by turn."""
    from seekrl.eval.report import write_viewer
    from seekrl.models import load_tokenizer

    try:
        if limit is not None and limit < 1:
            raise ValueError(f"--limit: expected at least 1, got {limit}")
        tokenizer = load_tokenizer(model) if model else None
        path = write_viewer(run_dir, out, tokenizer=tokenizer, max_episodes=limit)
    except ERRORS as err:
        _fail(err)
    console.print(f"viewer -> {path}")


def _one_of(resume: bool, overwrite: bool) -> None:
    """--resume and --overwrite contradict each other: refused before anything is read (and
    by --print-config, which runs nothing)."""
    from seekrl.config import ConfigError

    if resume and overwrite:
        raise ConfigError("give one of --resume (continue the run in out) or --overwrite "
                          "(replace it), not both")


def _command_line(words: list[str], config: Optional[Path], overrides: Optional[list[str]],
                  *tail: str) -> str:
    """How a run was started, as a shell line, for the message after an interrupt."""
    import shlex

    return shlex.join([*words, *(["--config", str(config)] if config else []),
                       *(overrides or []), *tail])


def _resumable(err: KeyboardInterrupt, cfg, command: str, *, resume: bool,
               overwrite: bool) -> None:
    """Ctrl-C in a recipe that checkpoints: where it stopped and the command that goes on,
    on one line that is not wrapped (it is copied from), then exit 130."""
    from seekrl.recipes.setup import Interrupted

    _stopped(err.message(command) if isinstance(err, Interrupted) else
             "interrupted before the first step; start again with: " + command
             + (" --resume" if resume else " --overwrite" if overwrite else ""))


def _recipe(words: list[str], kind, config: Optional[Path], overrides: Optional[list[str]],
            run, *, print_config: bool, threads: Optional[int], resume: bool = False,
            overwrite: bool = False, check=None, tail: tuple[str, ...] = (),
            on_interrupt=_resumable):
    """The body the recipe commands share: --resume with --overwrite refused, `kind` loaded
    from the config file and the overrides, then either printed (--print-config, after
    `check`: the keys the recipe would refuse) or run (`run(cfg)`, its summary returned)
    with the thread count. An error ends in one line; Ctrl-C in `on_interrupt(err, cfg,
    command, resume=, overwrite=)`, which says how to go on. Returns None after
    --print-config."""
    command = _command_line(words, config, overrides, *tail)
    cfg = None
    try:
        _one_of(resume, overwrite)
        cfg = _load(kind, config, overrides)
        if print_config:
            if check is not None:
                check(cfg)
            _print_config(cfg)
            return None
        _threads(threads)
        return run(cfg)
    except ERRORS as err:
        _fail(err)
    except KeyboardInterrupt as err:
        on_interrupt(err, cfg, command, resume=resume, overwrite=overwrite)


@app.command()
def sft(
    config: Annotated[Optional[Path], typer.Option(help="YAML config (keys: see seekrl.config.SFTConfig)")]
    = None,
    overrides: Annotated[Optional[list[str]], typer.Argument(
        help="key.sub=value overrides, e.g. optim.lr=1e-4 max_steps=20", show_default=False)] = None,
    overwrite: Annotated[bool, typer.Option(help="replace a run already in out")] = False,
    resume: Annotated[bool, typer.Option(
        help="continue the run in out from its latest checkpoint (save_every)")] = False,
    print_config: PrintConfig = False,
    threads: Threads = None,
):
    """Supervised warm-up on trajectory JSONL (oracle episodes): loss on policy tokens only."""
    from seekrl.recipes.sft import run_sft

    summary = _recipe(["seekrl", "sft"], schema.SFTConfig, config, overrides,
                      lambda cfg: run_sft(cfg, console=console, overwrite=overwrite,
                                          resume=resume),
                      print_config=print_config, threads=threads, resume=resume,
                      overwrite=overwrite)
    if summary is None:
        return
    console.print(f"final model -> {summary['final']} (load it with `seekrl eval --model "
                  f"{summary['final']}`)")


@app.command()
def train(
    config: Annotated[Optional[Path], typer.Option(help="YAML config (keys: see seekrl.config.TrainConfig)")]
    = None,
    overrides: Annotated[Optional[list[str]], typer.Argument(
        help="key.sub=value overrides, e.g. algo.advantage=rloo steps=50", show_default=False)] = None,
    resume: Annotated[bool, typer.Option(help="continue from the run's latest checkpoint")] = False,
    overwrite: Annotated[bool, typer.Option(help="replace a run already in out")] = False,
    print_config: PrintConfig = False,
    process: Annotated[Optional[str], typer.Option(
        help=f"a process-supervision method: {_PROCESS_METHODS} (its keys replace the "
             "config file's; key=value overrides win; prm needs reward.prm=DIR)")] = None,
    threads: Threads = None,
):
    """RL from outcome and process (step) rewards: GRPO, Dr. GRPO, RLOO, REINFORCE++, PPO, and
    the step-level estimators (dual_granularity, gigpo, stratified_grpo, tree_grpo)."""
    from seekrl.config import TrainConfig, build_config, load_config, read_config_file, with_keys
    from seekrl.recipes.train import Trainer, check_config

    command = _command_line(["seekrl", "train"], config,
                            [*(["--process", process] if process else []), *(overrides or [])])
    out = console
    trainer = None
    try:
        _one_of(resume, overwrite)
        if process is not None:
            from seekrl.rl.methods import method_overrides

            base = load_config(TrainConfig, config, overrides or [])
            keys = method_overrides(process, group_size=base.group_size,
                                    baseline_advantage=base.algo.advantage)
            # the method's keys over the file's, the command line's over both
            tree = with_keys(read_config_file(config) if config else {}, keys, TrainConfig,
                             where=f"--process {process}")
            cfg = build_config(TrainConfig, tree, overrides or [],
                               source=str(config) if config else "overrides")
        else:
            cfg = load_config(TrainConfig, config, overrides or [])
        # under torchrun every process runs this command; rank 0 speaks for them all
        out = console if os.environ.get("RANK", "0") == "0" else Console(quiet=True)
        if print_config:
            check_config(cfg)   # the keys the trainer would refuse, refused here too
            if out is console:
                _print_config(cfg)
            return
        _threads(threads)
        trainer = Trainer(cfg, console=out, resume=resume, overwrite=overwrite)
        summary = trainer.train()
    except ERRORS as err:
        _fail(err)
    except KeyboardInterrupt:
        out.print("")
        if trainer is None:   # while starting: what it wrote holds no run
            flags = " --resume" if resume else " --overwrite" if overwrite else ""
            out.print(f"interrupted before the first step; start again with: {command}{flags}",
                      markup=False, highlight=False, soft_wrap=True)
        else:   # one line, not wrapped: the command is copied from it
            out.print(trainer.interrupted(command), markup=False, highlight=False,
                      soft_wrap=True)
        raise typer.Exit(130) from None
    if summary.get("stopped"):
        out.print(f"[bold red]stopped early[/]: {summary['stopped']}")
    out.print(f"final model -> {summary['final']}; report: `seekrl report {cfg.out}`")


def _load(kind, config: Optional[Path], overrides: Optional[list[str]]):
    from seekrl.config import load_config
    return load_config(kind, config, overrides or [])


def _episode_options(values: dict):
    """`seekrl eval`'s episode options as the `rollout:` section's type (`RolloutSettings`:
    the episode settings and the backend), with its ranges and rules (attention is the hf
    loop's); a bad value is refused naming its option, as a config names its key."""
    import re

    from seekrl.config import ConfigError, RolloutSettings, build_config

    try:
        return build_config(RolloutSettings, values, source="options")
    except ConfigError as err:
        def option(m: re.Match) -> str:
            return m[1] + "--" + {"tools": "tool"}.get(m[2], m[2].replace("_", "-")) + ":"
        text = str(err).removeprefix("options: ").replace("(top level): ", "")
        raise ConfigError(re.sub(r"(^|; )(\w+):", option, text)) from None


@app.command()
def mcts(
    config: Annotated[Optional[Path], typer.Option(help="YAML config (keys: see seekrl.config.LabelConfig)")]
    = None,
    overrides: Annotated[Optional[list[str]], typer.Argument(
        help="key.sub=value overrides, e.g. data=train.jsonl search.simulations=32 "
             "search.method=mc", show_default=False)] = None,
    resume: Annotated[bool, typer.Option(help="continue a labelling run in the same out folder")] = False,
    print_config: PrintConfig = False,
    threads: Threads = None,
):
    """Step labels for a process reward model: MCTS over search steps (or Monte-Carlo
    rollouts with search.method=mc) -> OUT/nodes.jsonl, labels.jsonl, pairs.jsonl."""
    from seekrl.recipes.mcts import check_config, run_labelling

    def interrupted(err, cfg, command, **flags):
        _stopped(f"interrupted: {cfg.out if cfg else 'out'} keeps the questions labelled so "
                 f"far; continue with: {command}")

    summary = _recipe(["seekrl", "mcts"], schema.LabelConfig, config, overrides,
                      lambda cfg: run_labelling(cfg, console=console, resume=resume),
                      print_config=print_config, threads=threads, check=check_config,
                      tail=("--resume",), on_interrupt=interrupted)
    if summary is None:
        return
    console.print(f"{summary['questions']} questions, {summary['simulations']:.0f} simulations "
                  f"({summary['simulations_per_s']} per s), {summary['generated_tokens']:.0f} "
                  f"generated tokens, {summary['pairs']:.0f} pairs -> {summary['out']}")


simulator_app = typer.Typer(no_args_is_help=True,
                            help="Simulated search (ZeroSearch): train a simulator.")
app.add_typer(simulator_app, name="simulator")


@simulator_app.command("train")
def simulator_train(
    config: Annotated[Optional[Path], typer.Option(
        help="YAML config (keys: see seekrl.config.SimulatorTrainConfig)")] = None,
    overrides: Annotated[Optional[list[str]], typer.Argument(
        help="key.sub=value overrides, e.g. index=data/index 'data=[data/world/train.jsonl]' "
             "out=runs/simulator steps=100", show_default=False)] = None,
    overwrite: Annotated[bool, typer.Option(help="replace a simulator already in out")] = False,
    resume: Annotated[bool, typer.Option(
        help="go on with the stopped run in out from its latest checkpoint (save_every)")]
    = False,
    print_config: PrintConfig = False,
    threads: Threads = None,
):
    """Fine-tune a simulator on the real index's documents for logged queries."""
    from seekrl.recipes.simulator import train_simulator

    summary = _recipe(["seekrl", "simulator", "train"], schema.SimulatorTrainConfig, config,
                      overrides, lambda cfg: train_simulator(cfg, console=console,
                                                             overwrite=overwrite, resume=resume),
                      print_config=print_config, threads=threads, resume=resume,
                      overwrite=overwrite)
    if summary is None:
        return
    console.print(f"simulator -> {summary['final']} (in RL: simulator.model={summary['final']}; "
                  f"served: seekrl serve --simulate {summary['final']})")


ranker_app = typer.Typer(no_args_is_help=True, help="A ranker over first-stage candidates "
                         "(CoSearch): train, measure recall@k.")
app.add_typer(ranker_app, name="ranker")


@ranker_app.command("train")
def ranker_train(
    config: Annotated[Optional[Path], typer.Option(
        help="YAML config (keys: see seekrl.config.RankerTrainConfig)")] = None,
    overrides: Annotated[Optional[list[str]], typer.Argument(
        help="key.sub=value overrides, e.g. index=data/index 'data=[data/world/train.jsonl]' "
             "'eval_data=[data/world/dev.jsonl]' out=runs/ranker", show_default=False)] = None,
    overwrite: Annotated[bool, typer.Option(help="replace a ranker already in out")] = False,
    resume: Annotated[bool, typer.Option(
        help="continue a stopped training in out from its latest checkpoint")] = False,
    print_config: PrintConfig = False,
    threads: Threads = None,
):
    """Train a ranker on logged searches and synthetic-world hop queries; recall@k before and
    after on held-out questions."""
    from seekrl.recipes.ranker import train_ranker

    summary = _recipe(["seekrl", "ranker", "train"], schema.RankerTrainConfig, config,
                      overrides, lambda cfg: train_ranker(cfg, console=console,
                                                          overwrite=overwrite, resume=resume),
                      print_config=print_config, threads=threads, resume=resume,
                      overwrite=overwrite)
    if summary is None:
        return
    console.print(f"ranker -> {summary['final']} (in RL: ranker.model={summary['final']}; "
                  f"evaluation: seekrl eval --ranker {summary['final']}; served: seekrl serve "
                  f"--index INDEX --ranker {summary['final']})")


@ranker_app.command("eval")
def ranker_eval(
    index: Annotated[Path, typer.Option(help="the first stage: an index folder")],
    data: Annotated[Optional[list[str]], typer.Option(
        "--data", help="QA files with known gold documents: a synthetic world's questions are "
        "asked hop by hop (metadata.chain), others as they are (metadata.gold_doc_ids, else "
        "metadata.supporting_titles)")] = None,
    trajectories: Annotated[Optional[list[str]], typer.Option(
        help="logged episodes (an evaluation's trajectories.jsonl) whose searches are asked: "
             "the share whose top k hold a gold document of their question")] = None,
    ranker: Annotated[Optional[list[str]], typer.Option(
        help="rankers to compare with the first stage (a folder, or minilm); repeatable")]
    = None,
    candidates: Annotated[Optional[int], typer.Option(
        help="first-stage documents a ranker orders (with --ranker; default 10)")] = None,
    topk: Annotated[int, typer.Option(help="k of recall@k")] = schema.DEFAULT_TOPK,
    device: Annotated[str, typer.Option(help="cpu | cuda | cuda:N")] = "cpu",
    threads: Threads = None,
):
    """recall@k of each hop's gold document (--data of a synthetic world), of each question's
    gold documents (--data with gold_doc_ids or supporting_titles) and the gold hit rate of
    logged searches (--trajectories): the first stage alone, then with each ranker."""
    from seekrl.agent.trajectory import read_trajectories
    from seekrl.data.qa import in_file, load_qa
    from seekrl.recipes.ranker import (
        gold_hit_rate,
        hop_recall,
        qa_records,
        question_recall,
        question_records,
        trajectory_records,
    )
    from seekrl.retrieval.index import load_index
    from seekrl.retrieval.ranker import load_ranker, ranked_retriever

    try:
        # a ranker orders the first stage's candidates: its top k are among them; the
        # first stage alone has no such bound
        candidates = _ranker_candidates(ranker[0] if ranker else None, candidates)
        if topk < 1:
            raise ValueError(f"--topk: expected at least 1, got {topk}")
        if ranker and topk > candidates:
            raise ValueError(f"--topk: expected 1 to --candidates ({candidates}), got {topk}")
        if not data and not trajectories:
            raise ValueError("ranker eval: give --data QA files, --trajectories, or both")
        questions, hops = [], []
        for path in data or []:
            with in_file(path):
                these = load_qa(path)
                hops += [r for r in qa_records(these) if r.get("hop_gold")]
            questions += these
        asked = question_records(questions)
        logged = [r for path in trajectories or []
                  for r in trajectory_records(read_trajectories(path, tokens=False))]
        if data and not hops and not asked:
            raise ValueError(f"--data: no question with gold documents in {', '.join(data)} "
                             "(recall@k reads each question's metadata.chain, as `seekrl "
                             "world` writes it, else its metadata.gold_doc_ids or "
                             "metadata.supporting_titles)")
        if trajectories and not any(r["gold_ids"] for r in logged):
            raise ValueError(f"--trajectories: no logged search with gold documents in "
                             f"{', '.join(map(str, trajectories))}")
        _threads(threads)
        left = sum(1 for ex in questions if not ex.metadata.get("chain")) - len(asked)
        if left:   # said, not dropped unsaid
            console.print(f"{left} questions without gold documents (no chain, gold_doc_ids "
                          "or supporting_titles) left out", markup=False, highlight=False)
        first = load_index(index)
        for name in [None, *(ranker or [])]:
            rr = first if name is None else \
                ranked_retriever(first, load_ranker(name, device=device, first=first), candidates)
            label = name or "first_stage"
            if hops:
                console.print(f"recall@{topk} {label}={hop_recall(rr, hops, topk):.4f} ("
                              f"{len(hops)} hop queries)",
                              markup=False, highlight=False, soft_wrap=True)
            if asked:   # the share of each question's gold documents in its own top k
                by = "gold ids" if all(r["gold_ids"] for r in asked) else \
                    "supporting titles" if not any(r["gold_ids"] for r in asked) else \
                    "gold ids or supporting titles"
                console.print(f"question_recall@{topk} {label}="
                              f"{question_recall(rr, asked, topk):.4f} ({len(asked)} questions "
                              f"searched as they are, by {by})",
                              markup=False, highlight=False, soft_wrap=True)
            if logged:
                console.print(f"gold_hit@{topk} {label}={gold_hit_rate(rr, logged, topk):.4f} "
                              f"({sum(bool(r['gold_ids']) for r in logged)} logged searches)",
                              markup=False, highlight=False, soft_wrap=True)
    except ERRORS as err:
        _fail(err)


prm_app = typer.Typer(no_args_is_help=True, help="The process reward model: train, score, eval.")
app.add_typer(prm_app, name="prm")


def _stopped(message: str) -> None:
    """Ctrl-C: `message` (where it stopped, how to go on) on a line of its own that is not
    wrapped, then exit 130."""
    console.print("")
    console.print(message, markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(130) from None


@prm_app.command("train")
def prm_train(
    config: Annotated[Optional[Path], typer.Option(help="YAML config (keys: see seekrl.config.PRMConfig)")]
    = None,
    overrides: Annotated[Optional[list[str]], typer.Argument(
        help="key.sub=value overrides, e.g. labels=runs/labels model=runs/sft/final loss=pairwise",
        show_default=False)] = None,
    overwrite: Annotated[bool, typer.Option(help="replace a PRM already in out")] = False,
    resume: Annotated[bool, typer.Option(
        help="continue the run in out from its latest checkpoint (save_every)")] = False,
    print_config: PrintConfig = False,
    threads: Threads = None,
):
    """Train a PRM (LM + scalar head at each step's last token) on label folders."""
    from seekrl.recipes.prm import train_prm

    summary = _recipe(["seekrl", "prm", "train"], schema.PRMConfig, config, overrides,
                      lambda cfg: train_prm(cfg, console=console, overwrite=overwrite,
                                            resume=resume),
                      print_config=print_config, threads=threads, resume=resume,
                      overwrite=overwrite)
    if summary is None:
        return
    console.print(f"PRM -> {summary['final']} (use it in RL: reward.process.prm=1.0 "
                  f"reward.prm={summary['final']})")


@prm_app.command("score")
def prm_score(
    prm: Annotated[Path, typer.Option(help="a `seekrl prm train` folder (its final/)")],
    trajectories: Annotated[Path, typer.Option(
        help="trajectory JSONL (e.g. an eval run's trajectories.jsonl)")],
    out: Annotated[Path, typer.Option(
        help="where the scored trajectories go (each step's value = PRM score)")],
    batch_size: Annotated[int, typer.Option(help="episodes per forward pass")] = 8,
    device: Annotated[str, typer.Option(help="cpu | cuda")] = "cpu",
    dtype: Annotated[str, typer.Option(
        help="float32 | bfloat16 | float16 | bf16-mixed (the PRM's forward)")] = "float32",
    threads: Threads = None,
    overwrite: Annotated[bool, typer.Option(
        help="replace an existing out file (out may be the trajectories file itself)")] = False,
):
    """Score every step of a trajectory file with a PRM (one forward pass per episode batch)."""
    from seekrl.agent.trajectory import write_trajectories
    from seekrl.recipes.labels import read_episodes
    from seekrl.rewards.prm import load_scorer

    try:
        if batch_size < 1:   # before the model loads
            raise ValueError(f"--batch-size: expected episodes per forward pass, at least 1; "
                             f"got {batch_size}")
        # an existing file (the labels or an evaluation's trajectories given twice) was
        # written over without a word
        _refuse_to_replace(out, "a file", overwrite=overwrite)
        trajs = read_episodes(trajectories)
        _threads(threads)
        scorer = load_scorer(prm, device=device, batch_size=batch_size, dtype=dtype)
        try:
            scores = scorer.score_steps(trajs)
        except DataError as err:     # name the file the bad episode came from
            raise (DataError(str(err), path=str(trajectories)) if err.path is None else err) \
                from None
        for t, row in zip(trajs, scores):
            for s, v in zip(t.steps, row):
                s.value = round(v, 6)
        write_trajectories(out, trajs)
    except ERRORS as err:
        _fail(err)
    steps = [s.value for t in trajs for s in t.steps]
    mean = sum(steps) / len(steps) if steps else float("nan")
    console.print(f"{len(trajs)} episodes, {len(steps)} steps scored (mean {mean:.3f}) -> {out}")


@prm_app.command("eval")
def prm_eval(
    prm: Annotated[Path, typer.Option(help="a `seekrl prm train` folder (its final/)")],
    labels: Annotated[list[Path], typer.Option(help="label folder(s) from `seekrl mcts`")],
    threshold: Annotated[Optional[float], typer.Option(
        help="Q at or above it is a good step (default: the one the PRM was trained with, "
             "in its prm.json; 0.5)")] = None,
    split: Annotated[str, typer.Option(
        help="dev: only the questions the PRM held out in training (its prm.json dev_share); "
             "all: every label (in-sample for labels it was trained on)")] = "dev",
    device: Annotated[str, typer.Option(help="cpu | cuda")] = "cpu",
    dtype: Annotated[str, typer.Option(
        help="float32 | bfloat16 | float16 | bf16-mixed (the PRM's forward)")] = "float32",
    threads: Threads = None,
):
    """PRM quality on labelled trees: AUC, pair accuracy, first-error localisation."""
    import json

    from seekrl.recipes.labels import read_labels, split_labels
    from seekrl.recipes.prm import prm_metrics
    from seekrl.retrieval.base import json_object
    from seekrl.rewards.prm import PRM_MARKER, load_scorer, prm_folder

    try:
        if split not in ("dev", "all"):
            raise ValueError(f"--split: expected dev or all, got {split!r}")
        if threshold is not None and not 0 < threshold < 1:   # as prm train's: outside it
            # every step is one class
            raise ValueError(f"--threshold: expected a Q value between 0 and 1 (exclusive), "
                             f"got {threshold}")
        data = read_labels(labels)
        prm = prm_folder(prm)
        info = json_object(prm / PRM_MARKER, ())
        if threshold is None:   # the training's, so its prm.json figures are comparable
            threshold = float(info.get("threshold", 0.5))
        if split == "dev":
            share = float(info.get("dev_share", 0.1))
            if share == 0:   # every figure would be over no label, unsaid
                raise ValueError(f"--split dev: the PRM in {prm} held out no questions "
                                 "(dev_share 0); use --split all (in-sample) or labels it "
                                 "was not trained on")
            data = split_labels(data, share)[1]
        _threads(threads)
        metrics = prm_metrics(load_scorer(prm, device=device, dtype=dtype), data, threshold)
    except ERRORS as err:
        _fail(err)
    console.print(json.dumps({"split": split, "threshold": threshold, **metrics}, indent=1))


@app.command()
def refine(
    config: Annotated[Optional[Path], typer.Option(help="YAML config (keys: see seekrl.config.RefineConfig)")]
    = None,
    overrides: Annotated[Optional[list[str]], typer.Argument(
        help="key.sub=value overrides, e.g. method=rft prm=runs/prm/final data=train.jsonl",
        show_default=False)] = None,
    overwrite: Annotated[bool, typer.Option(help="replace a refinement already in out")] = False,
    resume: Annotated[bool, typer.Option(
        help="rft: go on with the stopped refinement in out (its samples, once all were "
             "drawn, and its fine-tuning from the latest checkpoint)")] = False,
    print_config: PrintConfig = False,
    threads: Threads = None,
):
    """PRM-guided refinement: RFT (keep right episodes whose every step the PRM accepts) or
    step-level DPO on sibling pairs."""
    from seekrl.recipes.refine import RFT_SAMPLED, check_config, run_refine
    from seekrl.recipes.setup import Interrupted

    def interrupted(err, cfg, command, **flags):
        if cfg is not None and (Path(cfg.out) / RFT_SAMPLED).is_file():   # samples drawn
            ckpt = err.checkpoint if isinstance(err, Interrupted) else None
            _stopped(f"interrupted; {cfg.out} keeps RFT's sampled episodes"
                     + (f" and the fine-tuning's checkpoint {ckpt}" if ckpt else "")
                     + f"; continue with: {command} --resume")
        _resumable(err, cfg, command, **flags)

    summary = _recipe(["seekrl", "refine"], schema.RefineConfig, config, overrides,
                      lambda cfg: run_refine(cfg, console=console, overwrite=overwrite,
                                             resume=resume),
                      print_config=print_config, threads=threads, resume=resume,
                      overwrite=overwrite, check=check_config, on_interrupt=interrupted)
    if summary is None:
        return
    if summary.get("final"):
        console.print(f"refined policy -> {summary['final']}")


@app.command()
def prorag(
    config: Annotated[Optional[Path], typer.Option(help="YAML config (keys: see seekrl.config.ProragConfig)")]
    = None,
    overrides: Annotated[Optional[list[str]], typer.Argument(
        help="key.sub=value overrides, e.g. out=runs/p labels.search.simulations=32 rl.steps=10",
        show_default=False)] = None,
    resume: Annotated[bool, typer.Option(help="skip the stages a run in the same out finished")] = False,
    print_config: PrintConfig = False,
    threads: Threads = None,
):
    """ProRAG end to end: SFT -> MCTS labels -> PRM -> refinement -> PRM-supervised RL, with
    the evaluation after each stage (default: the synthetic world at demo size, on a CPU)."""
    from seekrl.prorag import check_config, run_prorag

    def interrupted(err, cfg, command, **flags):
        _stopped(f"interrupted: {cfg.out if cfg else 'out'} keeps the stages it finished; "
                 f"continue with: {command}")

    _recipe(["seekrl", "prorag"], schema.ProragConfig, config, overrides,
            lambda cfg: run_prorag(cfg, console=console, resume=resume),
            print_config=print_config, threads=threads, check=check_config,
            tail=("--resume",), on_interrupt=interrupted)


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="a training run folder (or the demo's)")],
    out: Annotated[Optional[Path], typer.Option(help="HTML file (default RUN_DIR/report.html)")] = None,
):
    """Training curves (PNG), before/after evaluation tables and viewer links in one HTML page."""
    from seekrl.eval.training_report import report_for_run

    try:
        path = report_for_run(run_dir, out)
    except ERRORS as err:
        _fail(err)
    console.print(f"report -> {path}")


def _retriever(index: Path | None, url: str | None):
    if (index is None) == (url is None):
        raise RetrievalError("give exactly one of --index DIR or --url URL")
    if url is not None:
        from seekrl.retrieval.client import RemoteRetriever

        return RemoteRetriever(url)
    from seekrl.retrieval.index import load_index

    return load_index(index)


def _one_line_summaries(typer_app: typer.Typer) -> None:
    """Each command's summary in a command list is its docstring's first paragraph on one
    line: typer joins the lines on the command's own page but not in the list, where a
    wrapped docstring broke mid-sentence."""
    for info in typer_app.registered_commands:
        doc = info.callback.__doc__ if info.callback is not None else None
        if info.short_help is None and info.help is None and doc:
            info.short_help = " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())
    for group in typer_app.registered_groups:
        _one_line_summaries(group.typer_instance)


_one_line_summaries(app)

if __name__ == "__main__":
    app()
