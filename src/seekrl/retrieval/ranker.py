"""Rankers over first-stage candidates, and the retriever that shows their top k.

A first-stage retriever (BM25, dense, a server) returns `candidates` documents per query; a
ranker scores each (query, document) pair and the `RerankingRetriever` shows the best k. The
same `Retriever.search` interface, so rollouts, evaluation and `seekrl serve` use it
unchanged. Two kinds, both plain transformers models, so they can be trained (with the agent,
from its rollouts: `recipes/ranker.py`):

- `bi`: a sentence encoder (by default the bundled all-MiniLM-L6-v2), query and document
  encoded apart, mean-pooled and normalised; the score is their cosine over a temperature.
  It ranks sensibly before any training.
- `cross`: a cross-encoder (`AutoModelForSequenceClassification`, one label) reading the
  query and the document together: stronger once trained, but a head started from an
  encoder without one ranks at random until it is (the loader says so).

A trained ranker is a folder: the model, its tokenizer and `ranker.json` (kind, length,
temperature, the model it started from).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from pathlib import Path

import torch

from seekrl.retrieval.base import Hit, RetrievalError, Retriever

RANKER_KINDS = ("bi", "cross")
RANKER_FILE = "ranker.json"


class Ranker:
    """Scores (query, document) pairs; `kind` is `bi` or `cross` (see the module)."""

    def __init__(self, model, tokenizer, kind: str, *, max_len: int = 128,
                 temperature: float = 0.05, base: str = "", device: str = "cpu"):
        if kind not in RANKER_KINDS:
            raise ValueError(f"ranker kind: expected one of {', '.join(RANKER_KINDS)}, "
                             f"got {kind!r}")
        self.model, self.tokenizer, self.kind = model.to(device), tokenizer, kind
        self.max_len, self.temperature, self.base, self.device = \
            max_len, temperature, base, device
        self.model.eval()

    # ------------------------------------------------------------------ scoring
    def logits(self, queries: Sequence[str], docs: Sequence[Sequence[str]]) -> list[torch.Tensor]:
        """One score tensor per query over its documents, with gradients when the model is
        in train mode (the training loop's entry)."""
        if len(queries) != len(docs):
            raise ValueError(f"ranker: {len(queries)} queries but {len(docs)} document lists")
        sizes = [len(d) for d in docs]
        if self.kind == "cross":
            pairs_q = [q for q, ds in zip(queries, docs) for _ in ds]
            pairs_d = [d for ds in docs for d in ds]
            if not pairs_q:
                return [torch.zeros(0) for _ in queries]
            enc = self._tok(pairs_q, pairs_d)
            flat = self.model(**enc).logits[:, 0].float()
        else:
            flat_docs = [d for ds in docs for d in ds]
            if not flat_docs:
                return [torch.zeros(0) for _ in queries]
            q = self._embed(list(queries))
            d = self._embed(flat_docs)
            owner = torch.repeat_interleave(torch.arange(len(queries), device=q.device),
                                            torch.tensor(sizes, device=q.device))
            flat = (q[owner] * d).sum(-1) / self.temperature
        return list(torch.split(flat, sizes))

    @torch.no_grad()
    def score(self, queries: Sequence[str], docs: Sequence[Sequence[str]], *,
              batch_size: int = 64) -> list[list[float]]:
        """Scores without gradients, `batch_size` queries at a time."""
        was = self.model.training
        self.model.eval()
        out: list[list[float]] = []
        try:
            for lo in range(0, len(queries), batch_size):
                out += [s.tolist() for s in self.logits(queries[lo:lo + batch_size],
                                                        docs[lo:lo + batch_size])]
        finally:
            self.model.train(was)
        return out

    def _tok(self, texts, pairs=None):
        enc = self.tokenizer(list(texts), list(pairs) if pairs is not None else None,
                             truncation=True, max_length=self.max_len, padding=True,
                             return_tensors="pt")
        return {k: v.to(self.device) for k, v in enc.items()}

    def _embed(self, texts: list[str]) -> torch.Tensor:
        enc = self._tok(texts)
        hidden = self.model(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
        return torch.nn.functional.normalize(pooled.float(), dim=-1)

    # ------------------------------------------------------------------ files
    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        (path / RANKER_FILE).write_text(json.dumps({
            "kind": self.kind, "max_len": self.max_len, "temperature": self.temperature,
            "base": self.base}, indent=1))
        return path


def load_ranker(spec: str | None = None, *, kind: str | None = None, device: str = "cpu",
                max_len: int = 128, temperature: float = 0.05) -> Ranker:
    """A ranker from a folder `Ranker.save` wrote (its kind and settings recorded), or a
    fresh one from any encoder: None / `minilm` is the bundled all-MiniLM-L6-v2, else an HF
    id or path; `kind` defaults to `bi` for a fresh one."""
    from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer

    from seekrl.retrieval.dense import resolve_encoder
    from seekrl.runtime import check_device, quiet_transformers

    check_device(device)
    quiet_transformers()
    saved = Path(spec) / RANKER_FILE if spec else None
    if saved is not None and saved.is_file():
        meta = json.loads(saved.read_text())
        if kind is not None and kind != meta["kind"]:
            raise RetrievalError(f"ranker {spec}: it is a {meta['kind']!r} ranker, asked for "
                                 f"{kind!r}")
        kind, max_len, temperature = meta["kind"], meta["max_len"], meta["temperature"]
        base = meta.get("base", "")
    else:
        kind = kind or "bi"
        base = spec or "all-MiniLM-L6-v2"
    if kind not in RANKER_KINDS:
        raise RetrievalError(f"ranker kind: expected one of {', '.join(RANKER_KINDS)}, "
                             f"got {kind!r}")
    path = resolve_encoder(spec)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        if kind == "cross":
            model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)
        else:
            model = AutoModel.from_pretrained(path)
    except OSError as err:
        first = str(err).splitlines()[0][:160] if str(err) else type(err).__name__
        raise RetrievalError(f"ranker {spec!r} cannot be loaded ({first})") from None
    return Ranker(model, tokenizer, kind, max_len=max_len, temperature=temperature,
                  base=base, device=device)


class RerankingRetriever:
    """`first`'s top `candidates` per query, reordered by `ranker`, the best k shown; a
    hit's score becomes the ranker's. With `keep_candidates`, each query's candidates stay in
    `last` (the query, its spaces collapsed -> candidates) until `forget`, for training the
    ranker on what it was shown."""

    def __init__(self, first: Retriever, ranker: Ranker, candidates: int = 10, *,
                 keep_candidates: bool = False):
        if candidates < 1:
            raise ValueError(f"candidates: expected at least 1, got {candidates}")
        self.first, self.ranker, self.candidates = first, ranker, candidates
        self.keep_candidates = keep_candidates
        self.last: dict[str, list[Hit]] = {}

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        pools = self.first.search(queries, max(k, self.candidates))
        scores = self.ranker.score(queries, [[h.contents for h in pool] for pool in pools])
        out = []
        for q, pool, s in zip(queries, pools, scores):
            if self.keep_candidates:   # keyed by the query with its spaces collapsed
                self.last[" ".join(q.split())] = pool
            order = sorted(range(len(pool)), key=lambda i: -s[i])[:k]
            out.append([Hit(pool[i].doc_id, pool[i].title, pool[i].text, float(s[i]))
                        for i in order])
        return out

    def forget(self) -> None:
        self.last = {}


def recall_at(retriever: Retriever, queries: Sequence[str],
              gold: Sequence[str | Collection[str]], k: int, *, batch_size: int = 64) -> float:
    """The share of queries whose top k hold their gold document: one id, or several (any
    of them counts)."""
    if len(queries) != len(gold):
        raise ValueError(f"recall_at: {len(queries)} queries but {len(gold)} gold ids")
    if not queries:
        raise ValueError("recall_at: no queries")
    found = 0
    for lo in range(0, len(queries), batch_size):
        hits = retriever.search(list(queries[lo:lo + batch_size]), k)
        for g, hs in zip(gold[lo:lo + batch_size], hits):
            wanted = {g} if isinstance(g, str) else set(g)
            found += bool(wanted & {h.doc_id for h in hs})
    return found / len(queries)
