"""BM25 over a `DocStore`, with bm25s (sparse matrices, memory-mapped on load)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from seekrl.retrieval.base import RetrievalError
from seekrl.retrieval.corpus import DocStore, StoreRetriever

STOPWORDS = "en"


def _bm25s():
    """bm25s, imported so that it cannot take the GPU: when JAX is installed, importing bm25s
    imports JAX and runs a top-k with it, and JAX's default is to claim 75% of a GPU's memory
    on first use, leaving the policy to run out of memory.
    seekrl selects the top k with numpy, so JAX only needs to not preallocate."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import bm25s

    return bm25s


def _stemmer():
    """English Snowball stemming when PyStemmer is installed (it is a dependency)."""
    try:
        import Stemmer
    except ImportError:  # pragma: no cover - PyStemmer ships wheels for our platforms
        return None
    return Stemmer.Stemmer("english")


def _tokenize(texts: list[str], stemmer, show_progress: bool = False) -> list[list[str]]:
    return _bm25s().tokenize(texts, stopwords=STOPWORDS, stemmer=stemmer, return_ids=False,
                             show_progress=show_progress)


def _score_matrix(store: DocStore, stemmer, *, k1: float, b: float, chunk: int,
                  advance=lambda n: None) -> tuple[dict, dict[str, int]]:
    """bm25s's eager index of `store` (the "lucene" variant: idf = ln(1 + (N - df + 0.5) /
    (df + 0.5)), tf / (tf + k1 (1 - b + b |d| / avgdl)), float32 scores in a matrix of
    documents x terms stored by column) and its vocabulary, "" last, as `BM25.index` makes
    them.

    Documents are tokenised `chunk` at a time and kept only as each document's distinct
    term ids (int32) and counts: 6 bytes per (document, term) pair instead of a Python
    string per token. The columns are then filled chunk by chunk through per-term write
    cursors (a counting sort), so the pairs are never sorted as a whole. A chunk's token
    lists and its scoring temporaries (about 60 bytes a pair) are the working memory, so
    chunks are small: 10k passages of 100 words are about 1M pairs."""
    vocab: dict[str, int] = {}
    terms, counts, per_doc, lengths = [], [], [], []
    for start in range(0, len(store), chunk):
        texts = [store.contents[i] for i in range(start, min(start + chunk, len(store)))]
        tokens = _tokenize(texts, stemmer)
        del texts
        ids_of = [np.fromiter((vocab.setdefault(t, len(vocab)) for t in doc), np.int32,
                              count=len(doc)) for doc in tokens]
        lengths.append(np.fromiter(map(len, tokens), np.int64, count=len(tokens)))
        del tokens
        parts = [np.unique(ids, return_counts=True) for ids in ids_of]
        del ids_of
        terms.append(np.concatenate([u for u, _ in parts]) if parts
                     else np.zeros(0, np.int32))
        tf = np.concatenate([c for _, c in parts]) if parts else np.zeros(0, np.int64)
        counts.append(tf.astype(np.uint16 if tf.size == 0 or tf.max() < 2 ** 16 else np.int32))
        per_doc.append(np.fromiter((len(u) for u, _ in parts), np.int64, count=len(parts)))
        del parts
        advance(len(lengths[-1]))
    if not vocab:
        raise RetrievalError("the corpus has no indexable words (all documents are empty "
                             "or stop words)")
    n_docs, n_vocab = len(store), len(vocab)
    doc_len = np.concatenate(lengths)
    avg_len = doc_len.mean()
    df = np.zeros(n_vocab, np.int64)
    for t in terms:
        df += np.bincount(t, minlength=n_vocab)
    idf = np.log(1 + (n_docs - df + 0.5) / (df + 0.5)).astype(np.float32)
    indptr = np.zeros(n_vocab + 1, np.int64)
    np.cumsum(df, out=indptr[1:])
    nnz = int(indptr[-1])
    data = np.empty(nnz, np.float32)
    indices = np.empty(nnz, np.int32)
    cursor = indptr[:-1].copy()
    first_doc = 0
    for t, c, n_of in zip(terms, counts, per_doc):
        docs = np.repeat(np.arange(first_doc, first_doc + len(n_of), dtype=np.int32), n_of)
        first_doc += len(n_of)
        if not len(t):   # a chunk of empty documents
            continue
        norm = k1 * ((1 - b) + b * doc_len[docs] / avg_len)
        tf = c.astype(np.float64)
        score = (idf[t] * (tf / (norm + tf))).astype(np.float32)
        order = np.argsort(t, kind="stable")     # by term, each term's documents ascending
        t_sorted = t[order]
        run_start = np.flatnonzero(np.r_[True, t_sorted[1:] != t_sorted[:-1]])
        run_len = np.diff(np.r_[run_start, len(t_sorted)])
        rank = np.arange(len(t_sorted)) - np.repeat(run_start, run_len)
        at = cursor[t_sorted] + rank
        data[at], indices[at] = score[order], docs[order]
        cursor[t_sorted[run_start]] += run_len
    vocab[""] = n_vocab    # bm25s's empty token: scores no document
    return {"data": data, "indices": indices, "indptr": indptr, "num_docs": n_docs}, vocab


class BM25Retriever(StoreRetriever):
    """Okapi BM25 (bm25s 'lucene' variant). `search` is batch-first: one call per turn."""

    name = "bm25"

    def __init__(self, model, store: DocStore, stemmer=None):
        self.model = model
        self.store = store
        self.stemmer = stemmer

    @classmethod
    def build(cls, store: DocStore, out: str | Path, *, k1: float = 0.9, b: float = 0.4,
              chunk: int = 10_000, show_progress: bool = True) -> "BM25Retriever":
        """Index `store` with Lucene's BM25 (bm25s's default variant) and save it in bm25s's
        format (`load` memory-maps it). The score matrix is built here in one streaming pass
        rather than by `bm25s.BM25.index`, which needs every document's token list in
        Python at once (gigabytes at a million passages); a test checks the two give the same
        index."""
        from rich.progress import Progress

        stemmer = _stemmer()
        with Progress(disable=not show_progress, transient=True) as progress:
            task = progress.add_task("tokenising documents", total=len(store))
            scores, vocab = _score_matrix(store, stemmer, k1=k1, b=b, chunk=chunk,
                                          advance=lambda n: progress.advance(task, n))
        model = _bm25s().BM25(k1=k1, b=b)
        model.scores, model.vocab_dict = scores, vocab
        model.unique_token_ids_set = set(vocab.values())
        model.nonoccurrence_array = None    # the Lucene variant has none
        model.save(str(out))
        return cls(model, store, stemmer)

    @classmethod
    def load(cls, directory: str | Path, store: DocStore) -> "BM25Retriever":
        model = _bm25s().BM25.load(str(directory), mmap=True)
        return cls(model, store, _stemmer())

    def _rank(self, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
        """Documents with no query term are left out (a score of 0 says nothing)."""
        tokens = _tokenize(queries, self.stemmer)
        known = self.model.vocab_dict
        tokens = [[t for t in q if t in known] for q in tokens]
        out: list[list[tuple[int, float]]] = [[] for _ in queries]
        todo = [i for i, q in enumerate(tokens) if q]
        if not todo:
            return out
        for i in todo:
            scores = self.model.get_scores(tokens[i])
            out[i] = [(int(row), float(scores[row])) for row in _top(scores, k)]
        return out


def _top(scores: np.ndarray, k: int) -> np.ndarray:
    """The rows of the `k` best positive scores, best first, ties in row order: the same
    order for every k (bm25s's top-k leaves tied rows in any order, so a search at k was not
    the first k of a deeper one, which rankers and fusion ask for)."""
    rows = np.flatnonzero(scores > 0)
    if len(rows) > k:
        cut = len(rows) - k
        rows = rows[scores[rows] >= np.partition(scores[rows], cut)[cut]]
    return rows[np.lexsort((rows, -scores[rows]))][:k]

