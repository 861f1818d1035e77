"""Build, persist and load a retrieval index: `seekrl index` and `seekrl search`.

An index folder holds `manifest.json` (corpus path and hash, retriever, encoder, doc
count), the memory-mapped document store, and `bm25/` and/or `dense/`. Building writes
into a temporary sibling folder and renames it at the end, so a killed build never leaves
a half-written index that loads.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import warnings
from collections.abc import Iterable
from pathlib import Path

from seekrl import __version__
from seekrl.data.jsonl import SkipReport
from seekrl.errors import DataError
from seekrl.retrieval.base import Hit, RetrievalError, json_object
from seekrl.retrieval.bm25 import BM25Retriever
from seekrl.retrieval.corpus import DocStore, file_sha256, iter_corpus
from seekrl.retrieval.dense import (
    DEFAULT_ENCODER,
    SHARD_DOCS,
    DenseRetriever,
    embedding_dim,
    encoder_settings,
    load_encoder,
    pooling_of,
    read_faiss,
    write_encoder_meta,
)
from seekrl.retrieval.hybrid import HybridRetriever
from seekrl.runtime import check_device

RETRIEVERS = ("bm25", "dense", "hybrid")
MANIFEST = "manifest.json"
FORMAT_VERSION = 1


class LocalIndex:
    """An index loaded in-process; implements the `Retriever` protocol."""

    def __init__(self, path: Path, manifest: dict, store: DocStore, retriever):
        self.path, self.manifest, self.store, self.retriever = path, manifest, store, retriever

    @property
    def doc_count(self) -> int:
        return len(self.store)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if isinstance(queries, str):
            raise TypeError("search() takes a list of queries (batch-first), not one string")
        return self.retriever.search(list(queries), int(k))

    def __repr__(self) -> str:
        return (f"LocalIndex({str(self.path)!r}, retriever={self.manifest['retriever']!r}, "
                f"docs={self.doc_count})")


def build_index(corpus: str | Path, out: str | Path, retriever: str = "bm25", *,
                encoder: str | None = None, index_type: str = "flat", overwrite: bool = False,
                skip_bad: bool = False, show_progress: bool = True, batch_size: int = 128,
                pooling: str | None = None, query_prefix: str | None = None,
                doc_prefix: str | None = None, resume: bool = False,
                shard_size: int | None = None, device: str = "cpu") -> Path:
    """Index a JSONL corpus (`{"id", "contents"}` lines) into folder `out`. The dense
    encoder's pooling and prefixes default to its family's conventions
    (`dense.encoder_conventions`).

    Dense vectors are saved shard by shard in `OUT.building/dense-shards/` while they are
    encoded. A dense build that fails or is killed keeps that folder; `resume=True`
    (`seekrl index --resume`) builds again reading the saved shards instead of encoding
    them, provided the corpus and the encoder settings are the same (else a RetrievalError
    naming what changed)."""
    if retriever not in RETRIEVERS:
        raise ValueError(f"retriever: expected one of {', '.join(RETRIEVERS)}, got {retriever!r}")
    corpus = _checked_paths(corpus, out, overwrite)
    dense = retriever in ("dense", "hybrid")
    if dense:
        check_device(device)       # before hours of corpus work, not after
    # the settings in effect, not as given: `--pooling mean` for an e5 encoder (its
    # default) or a relative path to the same folder resume alike
    name = encoder or DEFAULT_ENCODER
    plan = {"corpus_sha256": file_sha256(corpus), "retriever": retriever, "device": device,
            "encoder": str(Path(name).resolve()) if Path(name).exists() else name,
            "index_type": index_type,
            **encoder_settings(name, pooling=pooling, query_prefix=query_prefix,
                               doc_prefix=doc_prefix),
            "shard_size": shard_size or SHARD_DOCS, "skip_bad": skip_bad}

    def fill(tmp: Path) -> dict:
        started = time.time()
        n, report = _store(tmp, corpus, skip_bad)
        store = DocStore(tmp)
        if retriever in ("bm25", "hybrid"):
            BM25Retriever.build(store, tmp / "bm25", show_progress=show_progress)
        if dense:
            # a local encoder by its absolute path: a relative one was resolved against the
            # folder the index was later loaded from
            DenseRetriever.build(store, tmp / "dense", encoder=plan["encoder"] if encoder else None,
                                 index_type=index_type,
                                 batch_size=batch_size, show_progress=show_progress,
                                 pooling=pooling, query_prefix=query_prefix,
                                 doc_prefix=doc_prefix, device=device,
                                 shards=tmp / SHARDS, shard_size=plan["shard_size"])
            shutil.rmtree(tmp / SHARDS)
        (tmp / PLAN).unlink(missing_ok=True)
        return _manifest(retriever, corpus, n, report, started, sha=plan["corpus_sha256"],
                         encoder=plan["encoder"] if retriever != "bm25" else None,
                         index_type=index_type if retriever != "bm25" else None)

    return _write_atomically(Path(out), fill, plan=plan if dense else None, resume=resume)


SHARDS = "dense-shards"     # in OUT.building: the dense vectors encoded so far
PLAN = "build.json"         # in OUT.building: what the saved shards were made from


def import_faiss_index(corpus: str | Path, faiss_file: str | Path, out: str | Path, *,
                       encoder: str, pooling: str | None = None,
                       query_prefix: str | None = None, doc_prefix: str | None = None,
                       normalize: bool = True, copy: bool = False,
                       overwrite: bool = False) -> Path:
    """A seekrl dense index from an existing Search-R1 / FlashRAG one, without re-encoding:
    the corpus JSONL (row i = vector i), the faiss index file (`e5_Flat.index`) and the
    encoder that made it (`intfloat/e5-base-v2`, loaded offline: a local folder or the HF
    cache). The faiss file is hard-linked into `out` where the filesystem allows, else
    symlinked (wiki-18's flat index is 60+ GB); `copy=True` copies it. Refused, in one line
    naming the numbers: a vector count other than the corpus's document count, a dimension
    other than the encoder's, an encoder that is not available offline. There is no
    `skip_bad` here: a skipped corpus line would shift every later document off its vector."""
    faiss_file = Path(faiss_file)
    corpus = _checked_paths(corpus, out, overwrite, faiss_file)
    if not faiss_file.is_file():
        raise FileNotFoundError(f"faiss index file not found: {faiss_file}")
    settings = encoder_settings(encoder, pooling=pooling, query_prefix=query_prefix,
                                doc_prefix=doc_prefix, normalize=normalize)
    try:
        index = read_faiss(faiss_file)
    except RuntimeError as err:
        raise RetrievalError(f"{faiss_file}: not a faiss index "
                             f"({str(err).splitlines()[0][:160] if str(err) else err!r})") from None
    vectors, dim, kind = index.ntotal, index.d, type(index).__name__
    mapped = _own_ids(index)
    if mapped is not None:
        raise RetrievalError(f"{faiss_file}: a {kind} maps vectors to its own ids ({mapped}); "
                             "seekrl needs vector i = corpus line i (an index without an id "
                             "map, filled with add)")
    if index.metric_type != 0:     # faiss.METRIC_INNER_PRODUCT
        raise RetrievalError(f"{faiss_file}: the index ranks by L2 distance (metric "
                             f"{index.metric_type}); seekrl expects inner product (scores "
                             "where higher is better, as Search-R1's e5 index has)")
    metric = "inner_product"
    del index
    model = load_encoder(encoder, pooling=settings["pooling"], local_only=True)
    settings["pooling"] = pooling_of(model)
    if embedding_dim(model) != dim:
        raise RetrievalError(f"{faiss_file}: the index holds {dim}-dimensional vectors but "
                             f"the encoder {encoder!r} gives {embedding_dim(model)}-dimensional "
                             "ones; give the encoder the index was built with")
    del model

    def fill(tmp: Path) -> dict:
        started = time.time()
        n, report = _store(tmp, corpus, skip_bad=False)
        if n != vectors:
            raise RetrievalError(f"{faiss_file} holds {vectors} vectors but {corpus} has {n} "
                                 "documents; the corpus must be the one the index was built "
                                 "from, line i = vector i")
        dense = tmp / "dense"
        dense.mkdir()
        _place(faiss_file, dense / "index.faiss", copy)
        write_encoder_meta(dense, encoder=encoder, dim=dim, index_type=kind, metric=metric,
                           imported_from=str(faiss_file.resolve()), **settings)
        return _manifest("dense", corpus, n, report, started, encoder=encoder,
                         index_type=kind, imported_from=str(faiss_file.resolve()))

    return _write_atomically(Path(out), fill)


def _own_ids(index) -> str | None:
    """Where a faiss index answers with ids other than its row numbers: an id map (also
    under a pre-transform), or an IVF index filled with `add_with_ids` (its inverted lists
    hold the ids; read once, 8 bytes a vector). None when ids are rows."""
    import faiss
    import numpy as np

    while True:
        name = type(index).__name__
        if name.startswith("IndexIDMap"):
            return name
        if name != "IndexPreTransform":
            break
        index = faiss.downcast_index(index.index)
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is None:
        return None
    lists, seen = ivf.invlists, np.zeros(ivf.ntotal, dtype=bool)
    for number in range(lists.nlist):
        size = lists.list_size(number)
        if not size:
            continue
        pointer = lists.get_ids(number)
        try:
            ids = faiss.rev_swig_ptr(pointer, size)
            if ids.min() < 0 or ids.max() >= ivf.ntotal:
                return f"an id {int(ids.max() if ids.max() >= ivf.ntotal else ids.min())} " \
                       f"of {ivf.ntotal} vectors"
            seen[ids] = True
        finally:
            lists.release_ids(number, pointer)
    return None if seen.all() else f"ids 0..{ivf.ntotal - 1} not each once"


def _place(source: Path, target: Path, copy: bool) -> None:
    if copy:
        shutil.copyfile(source, target)
        return
    try:
        os.link(source, target)
    except OSError:      # another filesystem (or no hard links): point at it instead
        target.symlink_to(source.resolve())


def _checked_paths(corpus: str | Path, out: str | Path, overwrite: bool,
                   *inputs: Path) -> Path:
    """The corpus, once `out` is known to be writable: refused when it holds files (unless
    `overwrite`), is a link, or holds an input (the corpus, `inputs`) the build would
    delete when it replaces the folder."""
    corpus, out = Path(corpus), Path(out)
    if not corpus.is_file():
        raise FileNotFoundError(f"corpus file not found: {corpus}")
    for source in (corpus, *inputs):
        if out.exists() and source.resolve().is_relative_to(out.resolve()):
            raise FileExistsError(f"{out} holds {source}, an input: the build replaces the "
                                  "whole folder; give another --out")
    if out.is_symlink():    # the build's folder replaces `out`; a link cannot be replaced so
        raise FileExistsError(f"{out} is a symbolic link; give the path it points to "
                              f"({out.resolve()}) or a new folder")
    empty = out.is_dir() and not os.path.ismount(out) and \
        not any(out.iterdir())     # replaced by the build's folder at the end
    if out.exists() and not overwrite and not empty:
        raise OutputExists(out, "an index" if (out / MANIFEST).is_file() else "files")
    return corpus


class OutputExists(FileExistsError):
    """`out` holds an index (or other files) and the build was not told to replace them.
    The message speaks Python (`overwrite=True`); `seekrl index` words it for its own
    caller with `said("--overwrite")`."""

    def __init__(self, out: Path, what: str):
        self.out, self.what = out, what
        super().__init__(self.said("overwrite=True"))

    def said(self, how: str) -> str:
        return f"{self.out} already holds {self.what}; pass {how} to replace them"


def _write_atomically(out: Path, fill, *, plan: dict | None = None,
                      resume: bool = False) -> Path:
    """Run `fill(tmp)` in a sibling folder, write its manifest, and rename it to `out`: a
    failed build (bad line, Ctrl-C) never leaves half an index at `out`. With a `plan`
    (a dense build) the folder survives a failure once it holds encoded shards, and
    `resume` reuses it when the plan is the same."""
    tmp = out.with_name(out.name + ".building")
    if resume and plan is not None and (tmp / PLAN).is_file():
        _check_plan(tmp / PLAN, plan)
    else:
        if resume and plan is None:
            raise ValueError("resume: only dense and hybrid builds save progress to resume")
        if resume:   # said, not silent: a mistyped --out resumes nothing and encodes it all
            warnings.warn(f"resume: nothing saved to resume at {tmp}; building from the "
                          "start", stacklevel=3)
        shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True, exist_ok=True)
    if plan is not None:
        (tmp / PLAN).write_text(json.dumps(plan, indent=2))
    try:
        manifest = fill(tmp)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
    except BaseException as err:
        done = len(list((tmp / SHARDS).glob("[0-9][0-9][0-9][0-9][0-9].npy"))) \
            if plan is not None else 0
        if done:
            hint = (f"{tmp} keeps the {done} dense shard(s) encoded so far; build again "
                    "with --resume (resume=True) to continue from there")
            err.add_note(hint)   # shown with the traceback, and by `seekrl index` on one line
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():   # swapped by renames: a kill while the old one is deleted (seconds
        # for gigabytes) left neither index at `out`; it is removed once the new one is there
        old = out.with_name(out.name + ".replaced")
        shutil.rmtree(old, ignore_errors=True)
        out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old)
    else:
        tmp.rename(out)
    return out


def _check_plan(saved: Path, plan: dict) -> None:
    old = json.loads(saved.read_text())
    changed = [f"{k}: {old.get(k)!r} -> {plan[k]!r}" for k in plan if old.get(k) != plan[k]]
    if changed:
        raise RetrievalError(f"--resume: the saved shards in {saved.parent} were made with "
                             f"other settings ({'; '.join(changed)}); build without --resume "
                             "to start over")


def _store(tmp: Path, corpus: Path, skip_bad: bool) -> tuple[int, SkipReport]:
    report = SkipReport()
    try:
        n = DocStore.build(tmp, iter_corpus(corpus, skip_bad=skip_bad, report=report))
    except DataError as err:
        if err.path is not None:
            raise
        # the store's own checks (a duplicate id) know the document, not the file
        raise DataError(str(err).removeprefix(f"field '{err.field}': "), path=str(corpus),
                        field=err.field) from None
    if n == 0:
        raise RetrievalError(f"{corpus}: no documents to index")
    return n, report


def _manifest(retriever: str, corpus: Path, n: int, report: SkipReport, started: float,
              sha: str | None = None, **extra) -> dict:
    return {
        "format": FORMAT_VERSION,
        "retriever": retriever,
        "corpus": str(corpus.resolve()),
        "corpus_sha256": sha or file_sha256(corpus),
        "doc_count": n,
        "skipped_lines": report.count,
        "skipped_examples": [[line, reason] for line, reason in report.skipped],
        **extra,
        "seekrl_version": __version__,
        "build_seconds": round(time.time() - started, 2),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def index_documents(docs: Iterable[dict | tuple[str, str]], retriever: str = "bm25", *,
                    encoder: str | None = None, device: str = "cpu") -> LocalIndex:
    """An index over documents given in memory, for a notebook or a test: `{"id",
    "contents"}` dicts (contents = title, newline, text) or `(id, contents)` pairs. It lives
    in a temporary folder that is removed when the index object is garbage-collected."""
    import tempfile
    import weakref

    folder = Path(tempfile.mkdtemp(prefix="seekrl-index-"))
    try:
        corpus = folder / "corpus.jsonl"
        with open(corpus, "w", encoding="utf-8") as f:
            for n, d in enumerate(docs, start=1):
                doc_id, contents = (d["id"], d["contents"]) if isinstance(d, dict) else d
                if not isinstance(doc_id, str) or not isinstance(contents, str):
                    raise DataError(f"document {n}: expected a string id and contents, got "
                                    f"{type(doc_id).__name__} / {type(contents).__name__}")
                f.write(json.dumps({"id": doc_id, "contents": contents}) + "\n")
        build_index(corpus, folder / "index", retriever, encoder=encoder, show_progress=False)
        index = load_index(folder / "index", device=device)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    weakref.finalize(index, shutil.rmtree, folder, True)
    return index


def read_manifest(path: str | Path) -> dict:
    path = Path(path)
    file = path / MANIFEST
    if not file.is_file():
        raise RetrievalError(f"{path}: not a seekrl index (no {MANIFEST}); "
                             "build one with `seekrl index`")
    manifest = json_object(file, ("format", "retriever", "doc_count"))
    if manifest["format"] != FORMAT_VERSION:
        raise RetrievalError(f"{file}: index format {manifest['format']} is not supported "
                             f"(expected {FORMAT_VERSION}); rebuild the index")
    return manifest


def corpus_mismatch(index: str | Path, corpus: str | Path) -> str | None:
    """Why the index at `index` was not built from the file `corpus` (its manifest records
    another sha256 than the file's), with the command that rebuilds it; None when it was
    (or the manifest records no sha256)."""
    manifest = read_manifest(index)
    built = manifest.get("corpus_sha256")
    if not built:
        return None
    have = file_sha256(corpus)
    if have == built:
        return None
    kind = manifest.get("retriever", "bm25")
    options = "" if kind == "bm25" else f" --retriever {kind}" + (
        f" --encoder {manifest['encoder']}" if manifest.get("encoder") else "")
    return (f"index {index} was built from another corpus than {corpus}: the manifest's "
            f"corpus_sha256 is {built[:12]}... (built from {manifest.get('corpus', '?')}), the "
            f"file's is {have[:12]}... (the world regenerated since?); rebuild the index: "
            f"seekrl index --corpus {corpus} --out {index}{options} --overwrite")


def check_index_corpus(index: str | Path, corpus: str | Path) -> None:
    """Refuse an index that was not built from `corpus` (`corpus_mismatch`)."""
    why = corpus_mismatch(index, corpus)
    if why:
        raise RetrievalError(why)


STORE_FILES = ("doc_ids.bin", "doc_ids.offsets.npy", "doc_contents.bin",
               "doc_contents.offsets.npy")
RETRIEVER_FILES = {"bm25": ("bm25/params.index.json", "bm25/vocab.index.json",
                            "bm25/data.csc.index.npy", "bm25/indices.csc.index.npy",
                            "bm25/indptr.csc.index.npy"),
                   "dense": ("dense/encoder.json", "dense/index.faiss")}


def _check_files(path: Path, kind: str) -> None:
    """Every file the manifest's retriever needs, named in one line when some are missing
    (a copy cut short, or a manifest that says dense over BM25 files)."""
    parts = ("bm25", "dense") if kind == "hybrid" else (kind,)
    needed = STORE_FILES + tuple(f for part in parts for f in RETRIEVER_FILES[part])
    missing = [f for f in needed if not (path / f).is_file()]
    if missing:
        raise RetrievalError(f"{path}: the manifest says a {kind} index but "
                             f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
                             "missing; rebuild the index (`seekrl index`)")


def load_index(path: str | Path, *, device: str = "cpu", faiss_gpu: bool = False) -> LocalIndex:
    """Load an index folder; the documents and BM25 matrices are memory-mapped.
    `faiss_gpu`: search a flat / IVF dense index on the GPU (`device` cuda, faiss-gpu)."""
    path = Path(path)
    manifest = read_manifest(path)
    kind = manifest["retriever"]
    if kind not in RETRIEVERS:
        raise RetrievalError(f"{path / MANIFEST}: field 'retriever': expected one of "
                             f"{', '.join(RETRIEVERS)}, got {kind!r}")
    _check_files(path, kind)
    try:
        store = DocStore(path)
        if len(store) != manifest["doc_count"]:
            raise RetrievalError(f"{path}: manifest says {manifest['doc_count']} documents, "
                                 f"the store has {len(store)}; rebuild the index")
        if kind == "bm25":
            retriever = BM25Retriever.load(path / "bm25", store)
        elif kind == "dense":
            retriever = DenseRetriever.load(path / "dense", store, device=device,
                                            faiss_gpu=faiss_gpu)
        else:
            retriever = HybridRetriever(BM25Retriever.load(path / "bm25", store),
                                        DenseRetriever.load(path / "dense", store,
                                                            device=device, faiss_gpu=faiss_gpu),
                                        store)
    except (OSError, ValueError, KeyError, RuntimeError, EOFError) as err:
        if isinstance(err, RetrievalError):
            raise
        first = str(err).splitlines()[0][:200] if str(err) else ""
        raise RetrievalError(f"{path}: the {kind} index is damaged ({type(err).__name__}: "
                             f"{first}); rebuild it (`seekrl index`)") from err
    return LocalIndex(path, manifest, store, retriever)
