"""Retrieval at growing corpus sizes: build time, peak memory, index size, load time, QPS and
p99 latency for BM25 (through `seekrl serve`) and a dense HNSW index, with the growth curve
fitted and extrapolated to wiki-18's 21M passages.

    python bench/retrieval_scale.py --sizes 10000,100000,1000000 --work-dir /tmp/scale

Per size N:
- a synthetic corpus of N wiki-like passages (100 words each, as wiki-18's are, drawn from a
  Zipf-distributed vocabulary of 200k words less its 200 most frequent, the stand-in for
  stop words; with a title line), and 4,000 five-word queries taken from random passages;
- BM25: `build_index` in a fresh process (seconds and that process's peak RSS), the index
  folder's bytes, the seconds `load_index` takes, then `seekrl serve` on a loopback port
  driven by `--clients` closed-loop clients for `--seconds` (QPS, p99; the load generator of
  `bench/retrieval_server.py`, cache off, one query per request);
- dense: the index part only, with random unit vectors of `--dim` dimensions in place of an
  encoder's (encoding is the GPU's job, see the note in bench/RESULTS.md): seekrl's HNSW
  (M=32, efSearch=64) and IVF-PQ (4 sqrt(N) lists, 64-byte codes, nprobe 32) built in a
  fresh process (seconds, peak RSS, bytes), then `--clients` threads issuing one-query
  searches for `--seconds` (QPS, p99), and recall@10 against exact search on 200 queries.
  Queries are documents plus noise (`near_queries`), so each has a true nearest neighbour;
  uniformly random vectors have no cluster structure, the hardest case for both indexes.

Prints one `scale_docs=N ...` line per size, then `fit_METRIC=a*N^b` lines (least squares in
log-log over the sizes) with the value extrapolated to 21M, and a one-line summary last.
Sizes are built once under `--work-dir` and reused (`--rebuild` to redo).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing as mp
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

from seekrl.runtime import peak_rss_mb

sys.path.insert(0, str(Path(__file__).resolve().parent))

WIKI18 = 21_015_324       # passages in Search-R1 / FlashRAG's wiki-18 corpus
WORDS_PER_DOC = 100
VOCAB = 200_000
QUERIES = 4000


def _word_list(rng: np.random.Generator) -> list[str]:
    onsets = ["b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w",
              "z", "br", "ch", "st", "tr", "sh"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ou", "ea"]
    words: set[str] = set()
    while len(words) < VOCAB:
        n = int(rng.integers(1, 4))
        words.add("".join(onsets[rng.integers(len(onsets))] + vowels[rng.integers(len(vowels))]
                          for _ in range(n)) + ("" if rng.random() < 0.5 else "n"))
    return sorted(words)


def make_corpus(path: Path, n: int, seed: int = 0) -> list[str]:
    """N passages of WORDS_PER_DOC Zipf-drawn words; returns queries (5 words of a random
    passage each)."""
    rng = np.random.default_rng(seed)
    words = np.array(_word_list(rng), dtype=object)
    # Zipf over content words: the 200 most frequent ranks are left out, as the stop words
    # a BM25 tokenizer drops from real text are (else every query term would hit most
    # passages, which no real query against wiki-18 does)
    ranks = np.arange(1, VOCAB + 1, dtype=np.float64)
    p = np.where(ranks > 200, 1.0 / ranks, 0.0)
    p /= p.sum()
    queries: list[str] = []
    query_docs = set(rng.choice(n, size=min(QUERIES, n), replace=False).tolist())
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for start in range(0, n, 20_000):
            m = min(20_000, n - start)
            ids = rng.choice(VOCAB, size=(m, WORDS_PER_DOC), p=p)
            text = words[ids]
            lines = []
            for j in range(m):
                doc = start + j
                body = " ".join(text[j])
                lines.append(json.dumps({"id": str(doc), "contents":
                                         f"{text[j][0].capitalize()} {doc}\n{body}"}) + "\n")
                if doc in query_docs:
                    k = int(rng.integers(0, WORDS_PER_DOC - 5))
                    queries.append(" ".join(text[j][k:k + 5]))
            f.writelines(lines)
    tmp.rename(path)
    return queries


def corpus_files(work_dir: Path, n: int, rebuild: bool = False) -> tuple[Path, Path, list[str]]:
    """(folder, corpus.jsonl, queries) of size `n` under `work_dir`, made once and reused
    (the BM25 benchmarks share them)."""
    folder = work_dir / f"n{n}"
    folder.mkdir(parents=True, exist_ok=True)
    corpus, qfile = folder / "corpus.jsonl", folder / "queries.json"
    if rebuild or not corpus.is_file() or not qfile.is_file():
        qfile.write_text(json.dumps(make_corpus(corpus, n)))
    return folder, corpus, json.loads(qfile.read_text())


def _child(fn, args, queue) -> None:
    started = time.perf_counter()
    try:
        extra = fn(*args) or {}
    except BaseException as err:          # the parent must not wait forever
        queue.put({"error": f"{type(err).__name__}: {err}"})
        raise
    queue.put({"seconds": time.perf_counter() - started, "peak_rss_mb": peak_rss_mb(),
               **extra})


def in_fresh_process(fn, *args) -> dict:
    """Run fn(*args) in a spawned process: its seconds and its own peak RSS."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(fn, args, queue))
    proc.start()
    while True:            # a child killed outright (out of memory) puts nothing
        try:
            result = queue.get(timeout=5)
            break
        except Exception:
            if not proc.is_alive():
                raise RuntimeError(f"{fn.__name__}: the process died (exit code "
                                   f"{proc.exitcode})") from None
    proc.join()
    if "error" in result or proc.exitcode != 0:
        raise RuntimeError(f"{fn.__name__} failed: {result.get('error', proc.exitcode)}")
    return result


def _build_bm25(corpus: str, out: str) -> dict:
    from seekrl.retrieval.index import build_index

    build_index(corpus, out, "bm25", overwrite=True, show_progress=False)
    return {}


def _load_bm25(out: str) -> dict:
    from seekrl.retrieval.index import load_index

    t0 = time.perf_counter()
    index = load_index(out)
    index.search(["warm up"], 3)
    return {"load_s": time.perf_counter() - t0}


def _random_unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def _build_dense(kind: str, n: int, dim: int, out: str) -> dict:
    """seekrl's own index construction (`new_faiss_index`, trained on the first 100k
    vectors for ivfpq) over random unit vectors in chunks of 100k."""
    import faiss

    from seekrl.retrieval.dense import _train_and_add, new_faiss_index

    rng = np.random.default_rng(1)
    index = new_faiss_index(kind, dim, n)
    for start in range(0, n, 100_000):
        _train_and_add(index, [_random_unit(rng, min(100_000, n - start), dim)])
    faiss.write_index(index, out)
    return {}


def dir_mb(path: Path) -> float:
    if path.is_file():
        return path.stat().st_size / 2**20
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20


def bm25_service(index_dir: Path, queries: list[str], clients: int, seconds: float) -> dict:
    from retrieval_server import drive, serve

    with serve(index_dir, {"cache_size": 0}) as url:
        return asyncio.run(drive(url, queries, clients, seconds, warmup=2.0))


def dense_service(path: str, n: int, dim: int, clients: int, seconds: float) -> dict:
    """Closed-loop one-query searches from `clients` threads (faiss releases the GIL), and
    recall@10 against exact search (the same random vectors, regenerated)."""
    import faiss

    from seekrl.retrieval.dense import EF_SEARCH, NPROBE

    t0 = time.perf_counter()
    index = faiss.read_index(path)
    load_s = time.perf_counter() - t0
    if hasattr(index, "hnsw"):
        index.hnsw.efSearch = EF_SEARCH
    if hasattr(index, "nprobe"):
        index.nprobe = min(NPROBE, index.nlist)
    faiss.omp_set_num_threads(1)     # one thread per search: the clients are the parallelism
    docs = _regenerate(n, dim)
    queries = near_queries(docs, 2000)
    latencies: list[float] = []
    lock = threading.Lock()
    stop = time.perf_counter() + 1.0 + seconds
    window_open = time.perf_counter() + 1.0

    def client(i: int) -> None:
        j = i
        mine = []
        while True:
            sent = time.perf_counter()
            if sent >= stop:
                break
            index.search(queries[j % len(queries)][None, :], 10)
            done = time.perf_counter()
            if sent >= window_open and done <= stop:
                mine.append(done - sent)
            j += clients
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    faiss.omp_set_num_threads(os.cpu_count() or 1)
    recall1, recall = recall_at_10(index, docs, queries[:200])
    ms = np.array(latencies) * 1000
    return {"qps": len(latencies) / seconds, "p99_ms": float(np.percentile(ms, 99)),
            "p50_ms": float(np.percentile(ms, 50)), "load_s": load_s, "recall1": recall1,
            "recall10": recall}


def _regenerate(n: int, dim: int) -> np.ndarray:
    """The document vectors `_build_dense` indexed (same seed, same chunks)."""
    rng = np.random.default_rng(1)
    return np.concatenate([_random_unit(rng, min(100_000, n - start), dim)
                           for start in range(0, n, 100_000)])


def near_queries(docs: np.ndarray, count: int, noise: float = 0.02) -> np.ndarray:
    """Queries with a true nearest neighbour, as real ones have: random documents plus
    Gaussian noise (cosine ~0.93 with their source at 384 dimensions). Uniform random
    queries would not do: in high dimensions every random vector is about equally far
    from all documents, so "the nearest ten" is noise and any index's recall near zero."""
    rng = np.random.default_rng(2)
    picked = docs[rng.choice(len(docs), size=count, replace=len(docs) < count)]
    q = picked + noise * rng.standard_normal(picked.shape, dtype=np.float32)
    return np.ascontiguousarray(q / np.linalg.norm(q, axis=1, keepdims=True), dtype=np.float32)


def recall_at_10(index, docs: np.ndarray, queries: np.ndarray) -> tuple[float, float]:
    """(recall@1, recall@10): how often the index's first hit is the exact nearest document,
    and the share of the exact top 10 it returns. With random vectors only the first is a
    real neighbour (a query's source document); the other nine are the tail of 1M random
    similarities, so recall@10 understates an index on real embeddings and @1 is the
    figure to read."""
    import faiss

    exact = faiss.IndexFlatIP(docs.shape[1])
    exact.add(docs)
    _, truth = exact.search(queries, 10)
    _, got = index.search(queries, 10)
    at1 = float(np.mean([a[0] == b[0] for a, b in zip(truth, got)]))
    return at1, float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(truth, got)]))


def recall_only(args) -> None:
    """Recall@10 of the dense indexes a previous run left under --work-dir (no rebuild)."""
    import faiss

    from seekrl.retrieval.dense import EF_SEARCH, NPROBE

    for n in sorted(int(x) for x in args.sizes.split(",")):
        docs = _regenerate(n, args.dim)
        queries = near_queries(docs, 200)
        row = {"scale_docs": n}
        for kind in ("hnsw", "ivfpq"):
            path = args.work_dir / f"n{n}" / f"{kind}{args.dim}.faiss"
            if not path.is_file():
                continue
            index = faiss.read_index(str(path))
            if hasattr(index, "hnsw"):
                index.hnsw.efSearch = EF_SEARCH
            if hasattr(index, "nprobe"):
                index.nprobe = min(NPROBE, index.nlist)
            at1, at10 = recall_at_10(index, docs, queries)
            row[f"{kind}_recall1"] = round(at1, 3)
            row[f"{kind}_recall10"] = round(at10, 3)
        print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    print("retrieval_scale recall: near queries (noise 0.02) against the indexes in "
          f"{args.work_dir}")


def fit(sizes: list[int], values: list[float]) -> tuple[float, float]:
    """y = a * N^b by least squares in log-log."""
    x, y = np.log(np.array(sizes, float)), np.log(np.array(values, float))
    b, loga = np.polyfit(x, y, 1)
    return math.exp(loga), b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/seekrl-scale"))
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--dim", type=int, default=384, help="dense vector size (MiniLM: 384)")
    ap.add_argument("--skip-dense", action="store_true")
    ap.add_argument("--rebuild", action="store_true")
    ap.add_argument("--recall-only", action="store_true",
                    help="only recall@10 of the dense indexes already under --work-dir")
    args = ap.parse_args()
    if args.recall_only:
        recall_only(args)
        return
    sizes = sorted(int(s) for s in args.sizes.split(","))
    args.work_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    rows: list[dict] = []
    for n in sizes:
        t0 = time.perf_counter()
        folder, corpus, queries = corpus_files(args.work_dir, n, args.rebuild)
        row: dict = {"scale_docs": n, "corpus_mb": round(dir_mb(corpus), 1),
                     "corpus_gen_s": round(time.perf_counter() - t0, 1)}
        index_dir = folder / "bm25-index"
        built = in_fresh_process(_build_bm25, str(corpus), str(index_dir))
        loaded = in_fresh_process(_load_bm25, str(index_dir))
        served = bm25_service(index_dir, queries, args.clients, args.seconds)
        row.update(bm25_build_s=round(built["seconds"], 1),
                   bm25_build_peak_rss_mb=round(built["peak_rss_mb"]),
                   bm25_index_mb=round(dir_mb(index_dir), 1),
                   bm25_load_s=round(loaded["load_s"], 2),
                   bm25_serve_rss_mb=round(loaded["peak_rss_mb"]),
                   bm25_qps=round(served["qps"], 1), bm25_p99_ms=round(served["p99_ms"], 1),
                   bm25_errors=served["errors"])
        for kind in ([] if args.skip_dense else ["hnsw", "ivfpq"]):
            path = folder / f"{kind}{args.dim}.faiss"
            built = in_fresh_process(_build_dense, kind, n, args.dim, str(path))
            searched = dense_service(str(path), n, args.dim, args.clients, args.seconds)
            row.update({f"{kind}_build_s": round(built["seconds"], 1),
                        f"{kind}_build_peak_rss_mb": round(built["peak_rss_mb"]),
                        f"{kind}_index_mb": round(dir_mb(path), 1),
                        f"{kind}_load_s": round(searched["load_s"], 2),
                        f"{kind}_qps": round(searched["qps"], 1),
                        f"{kind}_p99_ms": round(searched["p99_ms"], 2),
                        f"{kind}_recall1": round(searched["recall1"], 3),
                        f"{kind}_recall10": round(searched["recall10"], 3)})
        rows.append(row)
        print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)

    extrapolated: dict[str, float] = {}
    if len(rows) >= 2:
        for key in rows[0]:
            if key in ("scale_docs", "bm25_errors", "corpus_gen_s") or "recall" in key:
                continue
            values = [r[key] for r in rows]
            if any(not isinstance(v, (int, float)) or v <= 0 for v in values):
                continue
            a, b = fit(sizes, values)
            extrapolated[key] = a * WIKI18 ** b
            print(f"fit_{key}={a:.4g}*N^{b:.3f} at_21M={extrapolated[key]:.4g}")
    last = rows[-1]
    summary = (f"retrieval_scale: sizes {','.join(str(s) for s in sizes)}; at {sizes[-1]} docs "
               f"BM25 build {last['bm25_build_s']} s, {last['bm25_build_peak_rss_mb']} MB peak, "
               f"load {last['bm25_load_s']} s, {last['bm25_qps']} QPS p99 {last['bm25_p99_ms']} ms")
    for kind in ("hnsw", "ivfpq"):
        if f"{kind}_qps" in last:
            summary += (f"; {kind} build {last[f'{kind}_build_s']} s, "
                        f"{last[f'{kind}_index_mb']} MB, {last[f'{kind}_qps']} QPS, "
                        f"recall@1 {last[f'{kind}_recall1']}")
    if extrapolated:
        summary += (f"; extrapolated to 21M: BM25 build "
                    f"{extrapolated.get('bm25_build_s', float('nan')) / 60:.0f} min, "
                    f"{extrapolated.get('bm25_build_peak_rss_mb', float('nan')) / 1024:.1f} GB "
                    f"peak, load {extrapolated.get('bm25_load_s', float('nan')):.1f} s")
    print(summary + f" ({(time.time() - started) / 60:.1f} min)")


if __name__ == "__main__":
    main()
