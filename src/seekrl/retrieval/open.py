"""One string names a retriever in configs: an index folder or a retrieval server's url."""

from __future__ import annotations

from seekrl.retrieval.base import Retriever


def open_retriever(spec: str) -> Retriever:
    """`http://host:port` -> `RemoteRetriever`; anything else -> the index folder there."""
    if spec.startswith(("http://", "https://")):
        from seekrl.retrieval.client import RemoteRetriever
        return RemoteRetriever(spec)
    from seekrl.retrieval.index import load_index
    return load_index(spec)
