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
    on first use (seen: 60 GB of an 80 GB H100, leaving the policy to run out of memory).
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


class BM25Retriever(StoreRetriever):
    """Okapi BM25 (bm25s 'lucene' variant). `search` is batch-first: one call per turn."""

    name = "bm25"

    def __init__(self, model, store: DocStore, stemmer=None):
        self.model = model
        self.store = store
        self.stemmer = stemmer

    @classmethod
    def build(cls, store: DocStore, out: str | Path, *, k1: float = 0.9, b: float = 0.4,
              chunk: int = 100_000, show_progress: bool = True) -> "BM25Retriever":
        from rich.progress import Progress

        stemmer = _stemmer()
        tokens: list[list[str]] = []
        # tokenise in chunks so peak memory is the token lists, not a second copy of the text
        with Progress(disable=not show_progress, transient=True) as progress:
            task = progress.add_task("tokenising documents", total=len(store))
            for start in range(0, len(store), chunk):
                texts = [store.contents[i]
                         for i in range(start, min(start + chunk, len(store)))]
                tokens.extend(_tokenize(texts, stemmer, show_progress=False))
                progress.advance(task, len(texts))
        if not any(tokens):
            raise RetrievalError("the corpus has no indexable words (all documents are empty "
                                 "or stop words)")
        model = _bm25s().BM25(k1=k1, b=b)
        # bm25s's own bars ("BM25S Create Vocab", ...) would interleave with seekrl's output
        model.index(tokens, show_progress=False)
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
        # n_threads=0: score in this thread; bm25s builds a thread pool per call otherwise
        rows, scores = self.model.retrieve([tokens[i] for i in todo], k=k, show_progress=False,
                                           n_threads=0, backend_selection="numpy")
        for i, r, s in zip(todo, np.asarray(rows), np.asarray(scores)):
            out[i] = [(int(row), float(score)) for row, score in zip(r, s) if score > 0]
        return out

