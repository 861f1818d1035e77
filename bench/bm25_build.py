"""BM25 index build: seekrl's streaming score matrix against bm25s's own `BM25.index`, side
by side on the same synthetic corpus, each build in a fresh process.

    python bench/bm25_build.py --sizes 100000,1000000 --work-dir /tmp/seekrl-scale

Per size N (the corpus of `bench/retrieval_scale.py`: N wiki-like passages of 100 words,
reused from --work-dir when it is there):
- `bm25s`: what `BM25Retriever.build` did before: every document's token list in Python
  (bm25s.tokenize in chunks of 100k), then `bm25s.BM25.index` and `save`;
- `seekrl`: `BM25Retriever.build` (`_score_matrix`: chunked tokenising, int32 term ids and
  counts per document, the columns filled chunk by chunk);
each in a spawned process: seconds and that process's own peak RSS (VmHWM). Then both
indexes answer the same 200 queries (top 10) and must agree: `same_results` is the share
of queries whose ranked document ids are identical.

Prints one line per size and side, `ratio` lines per size, and a one-line summary last.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from retrieval_scale import corpus_files, in_fresh_process  # noqa: E402


def _store(corpus: str, folder: str):
    from seekrl.retrieval.corpus import DocStore
    from seekrl.retrieval.index import _store as write_store

    folder_path = Path(folder)
    if not (folder_path / "done").is_file():
        folder_path.mkdir(parents=True, exist_ok=True)
        write_store(folder_path, Path(corpus), False)
        (folder_path / "done").write_text("1")
    return DocStore(folder_path)


def build_bm25s(corpus: str, store_dir: str, out: str) -> dict:
    """The former build: all token lists, then bm25s's index."""
    from seekrl.retrieval.bm25 import _bm25s, _stemmer, _tokenize

    store = _store(corpus, store_dir)
    started = time.perf_counter()
    stemmer, tokens = _stemmer(), []
    for start in range(0, len(store), 100_000):
        tokens.extend(_tokenize([store.contents[i] for i in
                                 range(start, min(start + 100_000, len(store)))], stemmer))
    model = _bm25s().BM25(k1=0.9, b=0.4)
    model.index(tokens, show_progress=False)
    model.save(out)
    return {"build_s": time.perf_counter() - started}


def build_seekrl(corpus: str, store_dir: str, out: str) -> dict:
    from seekrl.retrieval.bm25 import BM25Retriever

    store = _store(corpus, store_dir)
    started = time.perf_counter()
    BM25Retriever.build(store, out, show_progress=False)
    return {"build_s": time.perf_counter() - started}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100000,1000000")
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/seekrl-scale"))
    args = ap.parse_args()
    started = time.time()
    summary = []
    for n in sorted(int(s) for s in args.sizes.split(",")):
        folder, corpus, queries = corpus_files(args.work_dir, n)
        queries = queries[:200]
        store_dir = str(folder / "store")
        in_fresh_process(_prepare, str(corpus), store_dir)   # once, outside the timings
        got = {}
        for side, fn in (("bm25s", build_bm25s), ("seekrl", build_seekrl)):
            out = str(folder / f"bm25-{side}")
            got[side] = in_fresh_process(fn, str(corpus), store_dir, out)
            got[side]["ranked"] = in_fresh_process(_ranked, out, store_dir, queries)["ranked"]
            print(f"docs={n} side={side} build_s={got[side]['build_s']:.1f} "
                  f"peak_rss_mb={got[side]['peak_rss_mb']:.0f}", flush=True)
        same = sum(a == b for a, b in zip(got["bm25s"]["ranked"], got["seekrl"]["ranked"]))
        time_ratio = got["seekrl"]["build_s"] / got["bm25s"]["build_s"]
        peak_ratio = got["seekrl"]["peak_rss_mb"] / got["bm25s"]["peak_rss_mb"]
        print(f"docs={n} build_time_ratio={time_ratio:.3f} peak_ratio={peak_ratio:.3f} "
              f"same_results={same / len(queries):.3f}", flush=True)
        summary.append(f"{n}: peak {got['bm25s']['peak_rss_mb']:.0f} -> "
                       f"{got['seekrl']['peak_rss_mb']:.0f} MB ({peak_ratio:.2f}x), time "
                       f"{time_ratio:.2f}x, same results {same}/{len(queries)}")
    print(f"bm25_build: {'; '.join(summary)} ({(time.time() - started) / 60:.1f} min)")


def _prepare(corpus: str, store_dir: str) -> dict:
    _store(corpus, store_dir)
    return {}


def _ranked(index_dir: str, store_dir: str, queries: list[str]) -> dict:
    """Each query's top 10 document rows from the index in `index_dir`."""
    from seekrl.retrieval.bm25 import BM25Retriever
    from seekrl.retrieval.corpus import DocStore

    retriever = BM25Retriever.load(index_dir, DocStore(Path(store_dir)))
    return {"ranked": [[row for row, _ in ranked] for ranked in retriever._rank(queries, 10)]}


if __name__ == "__main__":
    main()
