"""BM25 query time in-process: seekrl's top-k (the rows with a positive score, ranked with
ties in row order) against bm25s's own `retrieve` (an argpartition over every document's
score), on the synthetic Zipf corpora of `bench/retrieval_scale.py`.

    python bench/bm25_query.py --sizes 10000,100000 --work-dir /tmp/seekrl-scale

Per size N (the corpus and its BM25 index are built once under --work-dir, shared with
retrieval_scale.py): --queries five-word queries, one search call per query, at k = 3 and
k = 50, each path timed on the same queries in the same process; both must give the same
scores in the same order (ties aside), and seekrl's first 3 must be the first 3 of its 50.
Prints `bm25q_docs=N ...` per size and a one-line summary last.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from retrieval_scale import _build_bm25, corpus_files, in_fresh_process  # noqa: E402


def bm25s_rows(index, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
    """The former path: bm25s's retrieve for one query at a time."""
    from seekrl.retrieval.bm25 import _tokenize

    known = index.model.vocab_dict
    out = []
    for q in queries:
        tokens = [t for t in _tokenize([q], index.stemmer)[0] if t in known]
        if not tokens:
            out.append([])
            continue
        rows, scores = index.model.retrieve([tokens], k=min(k, len(index.store)),
                                            show_progress=False, n_threads=0,
                                            backend_selection="numpy")
        out.append([(int(r), float(s)) for r, s in zip(np.asarray(rows)[0],
                                                       np.asarray(scores)[0]) if s > 0])
    return out


def timed(fn, *args) -> tuple[float, list]:
    t0 = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/seekrl-scale"))
    ap.add_argument("--queries", type=int, default=200)
    args = ap.parse_args()
    from seekrl.retrieval.index import load_index

    speedups = []
    for n in sorted(int(s) for s in args.sizes.split(",")):
        folder, corpus, queries = corpus_files(args.work_dir, n)
        queries = queries[:args.queries]
        index_dir = folder / "bm25-index"
        if not (index_dir / "manifest.json").is_file():
            in_fresh_process(_build_bm25, str(corpus), str(index_dir))
        index = load_index(index_dir).retriever     # the BM25Retriever itself
        index.search_rows(queries[:2], 3)          # warm the memory maps
        bm25s_rows(index, queries[:2], 3)
        row = {"bm25q_docs": n, "queries": len(queries)}
        for k in (3, 50):
            old_s, old = timed(bm25s_rows, index, queries, k)
            new_s, new = timed(index.search_rows, queries, k)
            same = sum([round(s, 4) for _, s in a] == [round(s, 4) for _, s in b]
                       for a, b in zip(old, new))
            row.update({f"bm25s_ms_k{k}": round(1000 * old_s / len(queries), 2),
                        f"seekrl_ms_k{k}": round(1000 * new_s / len(queries), 2),
                        f"speedup_k{k}": round(old_s / new_s, 1),
                        f"same_scores_k{k}": f"{same}/{len(queries)}"})
            if k == 50:
                short = index.search_rows(queries, 3)
                row["prefix_stable"] = all(a == b[:3] for a, b in zip(short, new))
        speedups.append((n, row["speedup_k3"]))
        print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    print("summary: " + " ".join(f"bm25_query_speedup_{n}={s}x" for n, s in speedups))


if __name__ == "__main__":
    main()
