"""Hybrid retrieval: BM25 and dense lists fused by reciprocal rank (Cormack et al., 2009)."""

from __future__ import annotations

from seekrl.retrieval.base import Hit
from seekrl.retrieval.bm25 import BM25Retriever
from seekrl.retrieval.corpus import DocStore
from seekrl.retrieval.dense import DenseRetriever


def reciprocal_rank_fusion(rankings: list[list[int]], k: int, c: float = 60.0
                           ) -> list[tuple[int, float]]:
    """Fuse ranked lists of rows: score(d) = sum over lists of 1 / (c + rank), rank from 1.

    Ties break by first appearance, so the fusion is deterministic.
    """
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, row in enumerate(ranking, 1):
            scores[row] = scores.get(row, 0.0) + 1.0 / (c + rank)
    return sorted(scores.items(), key=lambda kv: -kv[1])[:k]


class HybridRetriever:
    name = "hybrid"

    def __init__(self, bm25: BM25Retriever, dense: DenseRetriever, store: DocStore, *,
                 depth: int = 50, c: float = 60.0):
        self.bm25, self.dense, self.store = bm25, dense, store
        self.depth, self.c = depth, c

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if k <= 0:     # as the single retrievers answer (a negative slice would cut one)
            return [[] for _ in queries]
        depth = max(k, self.depth)
        sparse = self.bm25.search_rows(queries, depth)
        dense = self.dense.search_rows(queries, depth)
        return [[self.store.hit(row, score) for row, score in
                 reciprocal_rank_fusion([[r for r, _ in s], [r for r, _ in d]], k, self.c)]
                for s, d in zip(sparse, dense)]
