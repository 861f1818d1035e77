"""Rankers over first-stage candidates, and the retriever that shows their top k.

A first-stage retriever (BM25, dense, a server) returns `candidates` documents per query; a
ranker scores each (query, document) pair and the `RerankingRetriever` shows the best k. The
same `Retriever.search` interface, so rollouts, evaluation and `seekrl serve` use it
unchanged. Three kinds, all plain transformers models, so they can be trained (with the
agent, from its rollouts: `recipes/ranker.py`):

- `bi`: a sentence encoder (by default the bundled all-MiniLM-L6-v2), query and document
  encoded apart, mean-pooled and normalised; the score is their cosine over a temperature.
  It ranks sensibly before any training.
- `cross`: a cross-encoder (`AutoModelForSequenceClassification`, one label) reading the
  query and the document together: stronger once trained, but a head started from an
  encoder without one ranks at random until it is (the loader says so).
- `query` (`QueryEncoder`): a dense or hybrid index's own query encoder, fine-tuned while
  the document vectors stay the ones the index holds (nothing is re-encoded). It reorders
  nothing: the `QueryEncoderRetriever` searches the whole index with its queries, and its
  training scores a query against the stored vectors of its candidates.

A trained ranker is a folder: the model, its tokenizer and `ranker.json` (kind, length,
temperature, the model it started from). `RankerUpdater` trains one with a listwise loss on
(query, candidates, labels) examples; where the labels come from (logged searches, hop
queries) is the recipe's part.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import time
from collections.abc import Collection, Sequence
from pathlib import Path

import numpy as np
import torch

from seekrl.retrieval.base import Hit, RetrievalError, Retriever, json_object

RANKER_KINDS = ("bi", "cross", "query")
RANKER_FILE = "ranker.json"
DEFAULT_MAX_LEN = 128          # a fresh ranker's tokens per text
DEFAULT_TEMPERATURE = 0.05     # a fresh bi-encoder's cosine is divided by this


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
        """One score tensor per query over its documents (texts or `Hit`s), with gradients
        when the model is in train mode (the training loop's entry)."""
        if len(queries) != len(docs):
            raise ValueError(f"ranker: {len(queries)} queries but {len(docs)} document lists")
        docs = [[d.contents if isinstance(d, Hit) else d for d in ds] for ds in docs]
        if self.kind != "cross":
            return self._dual(queries, docs, self._embed, self._embed)
        pairs_q = [q for q, ds in zip(queries, docs) for _ in ds]
        pairs_d = [d for ds in docs for d in ds]
        if not pairs_q:
            return [torch.zeros(0) for _ in queries]
        flat = self.model(**self._tok(pairs_q, pairs_d)).logits[:, 0].float()
        return list(torch.split(flat, [len(d) for d in docs]))

    def _dual(self, queries, docs, embed_queries, embed_docs) -> list[torch.Tensor]:
        """Each query's vector against its documents' vectors, over the temperature."""
        sizes = [len(d) for d in docs]
        flat_docs = [d for ds in docs for d in ds]
        if not flat_docs:
            return [torch.zeros(0) for _ in queries]
        q = embed_queries(list(queries))
        d = embed_docs(flat_docs)
        owner = torch.repeat_interleave(torch.arange(len(queries), device=q.device),
                                        torch.tensor(sizes, device=q.device))
        return list(torch.split((q[owner] * d).sum(-1) / self.temperature, sizes))

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
                max_len: int | None = None, temperature: float | None = None,
                first=None) -> Ranker:
    """A ranker from a folder `Ranker.save` wrote (its kind and settings recorded), or a
    fresh one from any encoder: None / `minilm` is the bundled all-MiniLM-L6-v2, else an HF
    id or path; `kind` defaults to `bi` for a fresh one. A fresh `query` ranker starts from
    the query encoder of `first` (the dense or hybrid index it will search) unless `spec`
    names another encoder. `max_len` and `temperature` (None: a saved ranker's own, or
    128 and 0.05 for a fresh one) are part of what a ranker learned: a saved one asked for
    others is refused."""
    from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer

    from seekrl.retrieval.dense import resolve_encoder
    from seekrl.runtime import check_device, quiet_transformers

    check_device(device)
    quiet_transformers()
    saved = Path(spec) / RANKER_FILE if spec else None
    meta: dict = {}
    if saved is not None and saved.is_file():
        meta = json_object(saved, ("kind", "max_len", "temperature"))
        if kind is not None and kind != meta["kind"]:
            raise RetrievalError(f"ranker {spec}: it is a {meta['kind']!r} ranker, asked for "
                                 f"{kind!r}")
        for name, asked in (("max_len", max_len), ("temperature", temperature)):
            if asked is not None and asked != meta[name]:
                raise RetrievalError(f"ranker {spec}: it was trained with {name} "
                                     f"{meta[name]}, asked for {asked} (leave {name} unset "
                                     "to use the ranker's own)")
        kind, max_len, temperature = meta["kind"], meta["max_len"], meta["temperature"]
        base = meta.get("base", "")
    else:
        if spec and (Path(spec) / "ranker" / RANKER_FILE).is_file():
            # a trained run's policy folder (final/, best/, step-N/): its ranker is inside
            raise RetrievalError(f"ranker {spec}: a run's folder, not a ranker; its trained "
                                 f"ranker is {Path(spec) / 'ranker'}")
        kind = kind or "bi"
        base = spec or "all-MiniLM-L6-v2"
        max_len = DEFAULT_MAX_LEN if max_len is None else max_len
        temperature = DEFAULT_TEMPERATURE if temperature is None else temperature
    if kind not in RANKER_KINDS:
        raise RetrievalError(f"ranker kind: expected one of {', '.join(RANKER_KINDS)}, "
                             f"got {kind!r}")
    if kind == "query":
        return _load_query_encoder(spec, meta, first, device=device, max_len=max_len,
                                   temperature=temperature)
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


def dense_part(first):
    """The `DenseRetriever` inside a first stage (a dense or hybrid index, loaded), or a
    RetrievalError saying why a query encoder cannot work with it."""
    from seekrl.retrieval.dense import DenseRetriever

    inner = getattr(first, "retriever", first)          # a LocalIndex holds its retriever
    dense = getattr(inner, "dense", inner)              # a hybrid its dense half
    if not isinstance(dense, DenseRetriever):
        raise RetrievalError(
            "ranker kind query: it fine-tunes a dense index's query encoder over the vectors "
            f"the index holds, so the first stage must be a dense or hybrid index folder; got "
            f"{getattr(inner, 'name', type(inner).__name__)!r}")
    return dense


def _load_query_encoder(spec: str | None, meta: dict, first, *, device: str, max_len: int,
                        temperature: float) -> "QueryEncoder":
    from seekrl.retrieval.dense import load_encoder

    if meta:            # a trained query encoder: its folder is a sentence-transformers model
        model = load_encoder(spec, device)
        return QueryEncoder(model, max_len=max_len, temperature=temperature,
                            base=meta.get("base", ""), device=device,
                            query_prefix=meta.get("query_prefix", ""),
                            normalize=meta.get("normalize", True))
    if first is None:
        raise RetrievalError("ranker kind query: a fresh query encoder starts from the dense "
                             "index it searches; give the index (or a trained query encoder's "
                             "folder)")
    dense = dense_part(first)
    model = load_encoder(spec, device) if spec else copy.deepcopy(dense.encoder)
    return QueryEncoder(model, max_len=max_len, temperature=temperature,
                        base=spec or "the index's encoder", device=device,
                        query_prefix=dense.query_prefix, normalize=dense.normalize)


class QueryEncoder(Ranker):
    """Kind `query`: a sentence-transformers query encoder scored against the vectors a dense
    index already holds for its documents (see the module). `bind` attaches the index."""

    def __init__(self, model, *, max_len: int = 128, temperature: float = 0.05, base: str = "",
                 device: str = "cpu", query_prefix: str = "", normalize: bool = True):
        self.model, self.tokenizer, self.kind = model.to(device), None, "query"
        self.max_len, self.temperature, self.base, self.device = \
            max_len, temperature, base, device
        self.query_prefix, self.normalize = query_prefix, normalize
        self.model.max_seq_length = max_len
        self.model.eval()
        self.dense = None

    def bind(self, first) -> None:
        """Score against `first`'s stored vectors (a dense or hybrid index)."""
        from seekrl.retrieval.dense import embedding_dim

        dense = dense_part(first)
        if embedding_dim(self.model) != dense.index.d:
            raise RetrievalError(f"ranker kind query: the encoder gives {embedding_dim(self.model)}"
                                 f"-dimensional vectors but the index holds {dense.index.d}-"
                                 "dimensional ones: start from the index's own encoder")
        _direct_map(dense.index)
        self.dense = dense

    def embed(self, queries: Sequence[str]) -> torch.Tensor:
        """The queries' vectors as the index's encoder makes them (prefix, pooling,
        normalisation), with gradients in train mode."""
        # sentence-transformers 6 renamed `tokenize` to `preprocess` (the old name warns)
        prepare = getattr(self.model, "preprocess", None) or self.model.tokenize
        features = prepare([self.query_prefix + q for q in queries])
        features = {k: v.to(self.device) if torch.is_tensor(v) else v
                    for k, v in features.items()}
        emb = self.model(features)["sentence_embedding"].float()
        return torch.nn.functional.normalize(emb, dim=-1) if self.normalize else emb

    def vectors(self, hits: Sequence[Hit]) -> torch.Tensor:
        """The index's stored vectors of these documents (by id)."""
        if self.dense is None:
            raise RetrievalError("ranker kind query: not bound to an index (QueryEncoder.bind)")
        rows = np.asarray(self.dense.store.rows_of([h.doc_id for h in hits]), dtype=np.int64)
        return torch.from_numpy(np.asarray(self.dense.index.reconstruct_batch(rows),
                                           dtype=np.float32)).to(self.device)

    def logits(self, queries: Sequence[str], docs: Sequence[Sequence[Hit]]) -> list[torch.Tensor]:
        if len(queries) != len(docs):
            raise ValueError(f"ranker: {len(queries)} queries but {len(docs)} document lists")
        if any(not isinstance(d, Hit) for ds in docs for d in ds):
            raise TypeError("ranker kind query scores indexed documents: give Hits, not texts")
        return self._dual(queries, docs, self.embed, self.vectors)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save(str(path))
        (path / RANKER_FILE).write_text(json.dumps({
            "kind": "query", "max_len": self.max_len, "temperature": self.temperature,
            "base": self.base, "query_prefix": self.query_prefix,
            "normalize": self.normalize}, indent=1))
        return path


def _direct_map(index) -> None:
    """An IVF index (`ivfpq`) gives its stored vectors by row only with a direct map
    (`vectors` read them; IVF-PQ's are its codes decoded): built once here, one pass over
    the lists, instead of a raw faiss error in the first training step."""
    import faiss

    try:
        ivf = faiss.extract_index_ivf(index)
    except RuntimeError:      # not IVF: flat and HNSW read rows as they are
        return
    if ivf is not None and ivf.direct_map.type == faiss.DirectMap.NoMap:
        ivf.make_direct_map()


class QueryEncoderRetriever:
    """`first` (a dense or hybrid index) searched with `ranker`'s queries over the whole
    index, not only over candidates; the top `candidates` of each query stay in `last` with
    `keep_candidates` (the hard negatives its training scores), like `RerankingRetriever`."""

    def __init__(self, first, ranker: QueryEncoder, candidates: int = 10, *,
                 keep_candidates: bool = False):
        if candidates < 1:
            raise ValueError(f"candidates: expected at least 1, got {candidates}")
        self.first, self.candidates, self.keep_candidates = first, candidates, keep_candidates
        self.last: dict[str, list[Hit]] = {}
        self.seconds = 0.0   # in its searches (the query encoder's and the index's), all told
        self.ranker = ranker

    @property
    def ranker(self) -> QueryEncoder:
        return self._ranker

    @ranker.setter
    def ranker(self, ranker: QueryEncoder) -> None:
        """Bind a (new) query encoder: the index's retriever again, with its queries."""
        from seekrl.retrieval.dense import DenseRetriever
        from seekrl.retrieval.hybrid import HybridRetriever

        ranker.bind(self.first)
        dense = ranker.dense
        ef = dense.index.hnsw.efSearch if hasattr(dense.index, "hnsw") else None
        mine = DenseRetriever(ranker.model, dense.index, dense.store, ef_search=ef,
                              query_prefix=ranker.query_prefix, normalize=ranker.normalize)
        inner = getattr(self.first, "retriever", self.first)
        if isinstance(inner, HybridRetriever):
            mine = HybridRetriever(inner.bm25, mine, inner.store, depth=inner.depth, c=inner.c)
        self._ranker, self._search = ranker, mine

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if k <= 0:          # pool[:k] of a negative k kept all but the last hits
            return [[] for _ in queries]
        t0 = time.perf_counter()
        pools = self._search.search(list(queries), max(k, self.candidates))
        self.seconds += time.perf_counter() - t0
        if self.keep_candidates:
            for q, pool in zip(queries, pools):
                self.last[" ".join(q.split())] = pool
        return [pool[:k] for pool in pools]

    def forget(self) -> None:
        self.last = {}


def ranked_retriever(first, ranker: Ranker, candidates: int = 10, *,
                     keep_candidates: bool = False):
    """The retriever a ranker of any kind gives: a `RerankingRetriever` over `first`'s
    candidates, or, for a query encoder, `first` searched with its queries."""
    cls = QueryEncoderRetriever if ranker.kind == "query" else RerankingRetriever
    return cls(first, ranker, candidates, keep_candidates=keep_candidates)


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
        self.seconds = 0.0   # in the ranker's scoring, all told (the first stage's not counted)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if k <= 0:          # order[:k] of a negative k kept all but the last candidates
            return [[] for _ in queries]
        pools = self.first.search(queries, max(k, self.candidates))
        t0 = time.perf_counter()
        scores = self.ranker.score(queries, [[h.contents for h in pool] for pool in pools])
        self.seconds += time.perf_counter() - t0
        out = []
        for q, pool, s in zip(queries, pools, scores):
            if self.keep_candidates:   # keyed by the query with its spaces collapsed
                self.last[" ".join(q.split())] = pool
            order = sorted(range(len(pool)), key=lambda i: -s[i])[:k]
            out.append([dataclasses.replace(pool[i], score=float(s[i])) for i in order])
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


# ---------------------------------------------------------------------- training
def listwise_loss(scores: Sequence[torch.Tensor], labels: Sequence[Sequence[int]]
                  ) -> torch.Tensor:
    """Mean over queries of -log(sum of the positives' softmax probability)."""
    losses = []
    for s, y in zip(scores, labels):
        pos = torch.tensor(y, dtype=torch.bool, device=s.device)
        losses.append(torch.logsumexp(s, 0) - torch.logsumexp(s[pos], 0))
    return torch.stack(losses).mean()


class RankerUpdater:
    """AdamW steps of a ranker on training examples; the ranker stays in eval mode between
    updates (dropout only while it learns)."""

    def __init__(self, ranker: Ranker, lr: float, *, seed: int = 0):
        self.ranker = ranker
        self.optimizer = torch.optim.AdamW(
            [p for p in ranker.model.parameters() if p.requires_grad], lr=lr)
        self.rng = random.Random(seed)
        self.updates = 0

    def update(self, examples: Sequence[tuple[str, list[str], list[int]]], steps: int,
               batch_size: int) -> dict[str, float]:
        if not examples:
            return {"ranker_loss": float("nan"), "ranker_examples": 0}
        model = self.ranker.model
        model.train()
        losses = []
        try:
            for _ in range(steps):
                batch = self.rng.sample(list(examples), min(batch_size, len(examples)))
                scores = self.ranker.logits([q for q, _, _ in batch], [d for _, d, _ in batch])
                loss = listwise_loss(scores, [y for _, _, y in batch])
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                self.optimizer.step()
                losses.append(float(loss.detach()))
                self.updates += 1
        finally:
            model.eval()
        return {"ranker_loss": round(sum(losses) / len(losses), 5),
                "ranker_examples": len(examples)}

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "updates": self.updates,
                "rng": self.rng.getstate()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = state["updates"]
        self.rng.setstate(state["rng"])
