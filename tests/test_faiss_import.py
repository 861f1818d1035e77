"""Importing a Search-R1 / FlashRAG dense index (corpus JSONL + faiss file + encoder name)
without re-encoding, and the encoder conventions a dense index records."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from seekrl.retrieval.base import RetrievalError
from seekrl.retrieval.dense import bundled_encoder_path, encoder_conventions, encoder_settings, load_encoder
from seekrl.retrieval.index import import_faiss_index, load_index, read_manifest
from seekrl.retrieval.server import ServerConfig, create_app

faiss = pytest.importorskip("faiss")

DOCS = [(f"wiki-{i}", f"{title}\n{text}") for i, (title, text) in enumerate([
    ("Paris", "Paris is the capital and largest city of France."),
    ("Kasabian", "Kasabian are an English rock band formed in Leicester in 1997."),
    ("Muse (band)", "Muse are an English rock band from Teignmouth, Devon, formed in 1994."),
    ("Photosynthesis", "Photosynthesis turns light energy into chemical energy in plants."),
    ("Mount Everest", "Mount Everest is Earth's highest mountain above sea level."),
    ("Python", "Python is a high-level general-purpose programming language."),
])]


def write_corpus(path: Path, docs=DOCS) -> Path:
    path.write_text("".join(json.dumps({"id": i, "contents": c}) + "\n" for i, c in docs))
    return path


def write_faiss(path: Path, vectors: np.ndarray) -> Path:
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    faiss.write_index(index, str(path))
    return path


@pytest.fixture(scope="module")
def encoder():
    return load_encoder(None)


def encode(model, texts: list[str]) -> np.ndarray:
    return model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)


def test_conventions_by_family() -> None:
    assert encoder_conventions("intfloat/e5-base-v2") == \
        {"query_prefix": "query: ", "doc_prefix": "passage: ", "pooling": "mean"}
    assert encoder_conventions("intfloat/multilingual-e5-large")["query_prefix"] == "query: "
    assert encoder_conventions("BAAI/bge-large-en-v1.5")["pooling"] == "cls"
    assert encoder_conventions("BAAI/bge-large-en-v1.5")["query_prefix"].startswith("Represent")
    assert encoder_conventions("BAAI/bge-m3") == \
        {"query_prefix": "", "doc_prefix": "", "pooling": "cls"}
    assert encoder_conventions(None)["pooling"] == "mean"            # the bundled MiniLM
    assert encoder_conventions("my-org/custom-encoder") == {}
    # given values win over the family's
    assert encoder_settings("intfloat/e5-base-v2", query_prefix="")["query_prefix"] == ""
    with pytest.raises(ValueError, match="pooling: expected one of"):
        encoder_settings("x", pooling="average")


def test_imported_index_searches_and_serves_like_the_original(tmp_path, encoder) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    vectors = encode(encoder, [c for _, c in DOCS])
    flat = write_faiss(tmp_path / "e5_Flat.index", vectors)
    out = import_faiss_index(corpus, flat, tmp_path / "index", encoder=bundled_encoder_path())

    manifest = read_manifest(out)
    assert manifest["retriever"] == "dense" and manifest["doc_count"] == len(DOCS)
    assert manifest["index_type"] == "IndexFlatIP"
    assert manifest["imported_from"] == str(flat.resolve())
    meta = json.loads((out / "dense" / "encoder.json").read_text())
    assert meta["dim"] == 384 and meta["metric"] == "inner_product" and meta["pooling"] == "mean"
    assert os.stat(out / "dense" / "index.faiss").st_ino == os.stat(flat).st_ino  # hard link

    index = load_index(out)
    hits = index.search(["Which band was formed in Leicester?", "highest mountain"], 2)
    assert hits[0][0].doc_id == "wiki-1" and hits[0][0].title == "Kasabian"
    assert hits[1][0].doc_id == "wiki-4"
    # a query equal to a document finds it with cosine ~1: the query side is encoded the
    # way the stored vectors were
    exact = index.search([DOCS[3][1]], 1)[0][0]
    assert exact.doc_id == "wiki-3" and exact.score == pytest.approx(1.0, abs=1e-4)

    app = create_app(index, manifest=manifest, config=ServerConfig())
    with TestClient(app) as client:
        r = client.post("/retrieve", json={"queries": ["capital of France"], "topk": 1,
                                           "return_scores": True})
        assert r.status_code == 200
        assert r.json()["result"][0][0]["document"]["id"] == "wiki-0"


def test_recorded_pooling_and_prefix_are_applied_to_queries(tmp_path) -> None:
    cls_model = load_encoder(None, pooling="cls")
    docs = [c for _, c in DOCS]
    vectors = encode(cls_model, ["passage: " + d for d in docs])
    assert not np.allclose(vectors, encode(load_encoder(None), ["passage: " + d for d in docs]))
    out = import_faiss_index(write_corpus(tmp_path / "c.jsonl"),
                             write_faiss(tmp_path / "f.index", vectors), tmp_path / "index",
                             encoder=bundled_encoder_path(), pooling="cls",
                             query_prefix="passage: ", doc_prefix="passage: ", copy=True)
    assert os.stat(out / "dense" / "index.faiss").st_ino != os.stat(tmp_path / "f.index").st_ino
    hit = load_index(out).search([docs[5]], 1)[0][0]
    assert hit.doc_id == "wiki-5" and hit.score == pytest.approx(1.0, abs=1e-4)


def test_import_refuses_mismatches_in_one_line(tmp_path, encoder) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    vectors = encode(encoder, [c for _, c in DOCS])
    short = write_faiss(tmp_path / "short.index", vectors[:-1])
    with pytest.raises(RetrievalError, match=r"holds 5 vectors but .*corpus.jsonl has 6 "
                                             r"documents"):
        import_faiss_index(corpus, short, tmp_path / "a", encoder=bundled_encoder_path())
    assert not (tmp_path / "a").exists() and not (tmp_path / "a.building").exists()

    wide = write_faiss(tmp_path / "wide.index", np.random.default_rng(0).normal(size=(6, 768)))
    with pytest.raises(RetrievalError, match=r"768-dimensional vectors but the encoder .* gives "
                                             r"384-dimensional"):
        import_faiss_index(corpus, wide, tmp_path / "b", encoder=bundled_encoder_path())

    not_faiss = tmp_path / "junk.index"
    not_faiss.write_bytes(b"not an index at all")
    with pytest.raises(RetrievalError, match="not a faiss index"):
        import_faiss_index(corpus, not_faiss, tmp_path / "c", encoder=bundled_encoder_path())

    flat = write_faiss(tmp_path / "ok.index", vectors)
    with pytest.raises(RetrievalError, match="cannot be loaded offline"):
        import_faiss_index(corpus, flat, tmp_path / "d",
                           encoder="seekrl-test/no-such-encoder-anywhere")
    with pytest.raises(FileNotFoundError, match="faiss index file not found"):
        import_faiss_index(corpus, tmp_path / "missing.index", tmp_path / "e",
                           encoder=bundled_encoder_path())


def test_cli_imports_with_faiss_option(tmp_path, encoder) -> None:
    from typer.testing import CliRunner

    from seekrl.cli import app

    corpus = write_corpus(tmp_path / "corpus.jsonl")
    flat = write_faiss(tmp_path / "e5_Flat.index", encode(encoder, [c for _, c in DOCS]))
    runner = CliRunner()
    r = runner.invoke(app, ["index", "--corpus", str(corpus), "--out", str(tmp_path / "i"),
                            "--faiss", str(flat)])
    assert r.exit_code == 2 and "--faiss needs --encoder" in r.output
    r = runner.invoke(app, ["index", "--corpus", str(corpus), "--out", str(tmp_path / "i"),
                            "--faiss", str(flat), "--encoder", bundled_encoder_path()])
    assert r.exit_code == 0, r.output
    assert "indexed 6 documents (dense, imported)" in r.output


def test_index_types_and_their_recall(tmp_path) -> None:
    from seekrl.retrieval.dense import _train_and_add, new_faiss_index
    from seekrl.retrieval.index import build_index

    rng = np.random.default_rng(0)
    n, dim = 3000, 32
    vectors = rng.standard_normal((n, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    exact = new_faiss_index("flat", dim, n)
    exact.add(vectors)
    queries = vectors[:100] + 0.05 * rng.standard_normal((100, dim)).astype(np.float32)
    _, truth = exact.search(queries, 10)
    for kind, floor in (("hnsw", 0.9), ("ivfpq", 0.3)):
        index = new_faiss_index(kind, dim, n)
        _train_and_add(index, [vectors[:1000], vectors[1000:]])
        assert index.ntotal == n
        if kind == "hnsw":
            index.hnsw.efSearch = 64
        _, got = index.search(queries, 10)
        recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(truth, got)])
        assert recall >= floor, (kind, recall)
        assert got[:, 0].tolist().count(-1) == 0
    with pytest.raises(RetrievalError, match="ivfpq needs at least 256 documents"):
        build_index(write_corpus(tmp_path / "c.jsonl"), tmp_path / "i", "dense",
                    index_type="ivfpq", show_progress=False)
    with pytest.raises(ValueError, match="index_type: expected one of flat, hnsw, ivfpq"):
        build_index(write_corpus(tmp_path / "c.jsonl"), tmp_path / "i", "dense",
                    index_type="pq", show_progress=False)


def test_dense_build_resumes_from_saved_shards(tmp_path, monkeypatch) -> None:
    import seekrl.retrieval.dense as dense_mod
    from seekrl.retrieval.index import build_index

    model = load_encoder(None)
    real_encode = model.encode
    calls: list[int] = []
    fail_at = {"call": 3}

    def encode(texts, **kw):
        calls.append(len(texts))
        if len(calls) == fail_at["call"]:
            raise KeyboardInterrupt       # the build killed while encoding the third shard
        return real_encode(texts, **kw)

    model.encode = encode
    monkeypatch.setattr(dense_mod, "load_encoder", lambda *a, **k: model)
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    out = tmp_path / "index"
    with pytest.raises(KeyboardInterrupt) as info:
        build_index(corpus, out, "dense", shard_size=2, show_progress=False)
    assert "--resume" in info.value.__notes__[0]
    shards = sorted(p.name for p in (tmp_path / "index.building" / "dense-shards").iterdir())
    assert shards == ["00000.npy", "00001.npy"] and not out.exists()

    with pytest.raises(RetrievalError, match=r"other settings \(index_type: 'flat' -> 'hnsw'\)"):
        build_index(corpus, out, "dense", shard_size=2, index_type="hnsw", resume=True,
                    show_progress=False)
    calls.clear()
    fail_at["call"] = 0
    # settings compared as in effect: the encoder's own (empty) prefixes, given, are the same
    build_index(corpus, out, "dense", shard_size=2, resume=True, show_progress=False,
                query_prefix="", doc_prefix="")
    assert calls == [2]                          # only the third shard was encoded again
    assert not (tmp_path / "index.building").exists()
    assert not (out / "dense-shards").exists() and not (out / "build.json").exists()
    resumed = load_index(out)

    clean = build_index(corpus, tmp_path / "clean", "dense", show_progress=False)
    queries = ["rock band from Devon", "programming language", "capital of France"]
    for a, b in zip(resumed.search(queries, 3), load_index(clean).search(queries, 3)):
        assert [h.doc_id for h in a] == [h.doc_id for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)
    with pytest.raises(ValueError, match="only dense and hybrid builds"):
        build_index(corpus, tmp_path / "b", "bm25", resume=True, show_progress=False)
    with pytest.warns(UserWarning, match="nothing saved to resume at .*fresh.building"):
        build_index(corpus, tmp_path / "fresh", "dense", resume=True, show_progress=False)
    assert load_index(tmp_path / "fresh").doc_count == len(DOCS)


def test_import_refuses_l2_and_id_mapped_indexes(tmp_path, encoder) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    vectors = encode(encoder, [c for _, c in DOCS])
    l2 = faiss.IndexFlatL2(vectors.shape[1])
    l2.add(vectors)
    faiss.write_index(l2, str(tmp_path / "l2.index"))
    with pytest.raises(RetrievalError, match="ranks by L2 distance"):
        import_faiss_index(corpus, tmp_path / "l2.index", tmp_path / "a",
                           encoder=bundled_encoder_path())
    mapped = faiss.IndexIDMap(faiss.IndexFlatIP(vectors.shape[1]))
    mapped.add_with_ids(vectors, np.arange(100, 100 + len(vectors)))
    faiss.write_index(mapped, str(tmp_path / "map.index"))
    with pytest.raises(RetrievalError, match="maps vectors to its own ids"):
        import_faiss_index(corpus, tmp_path / "map.index", tmp_path / "b",
                           encoder=bundled_encoder_path())
    # the same ids hidden deeper: under a pre-transform, or in an IVF index's lists
    wrapped = faiss.IndexPreTransform(faiss.NormalizationTransform(vectors.shape[1]), mapped)
    faiss.write_index(wrapped, str(tmp_path / "wrapped.index"))
    quantiser = faiss.IndexFlatIP(vectors.shape[1])
    ivf = faiss.IndexIVFFlat(quantiser, vectors.shape[1], 2, faiss.METRIC_INNER_PRODUCT)
    ivf.train(vectors)
    ivf.add_with_ids(vectors, np.arange(100, 100 + len(vectors)))
    faiss.write_index(ivf, str(tmp_path / "ivf-ids.index"))
    for name in ("wrapped", "ivf-ids"):
        with pytest.raises(RetrievalError, match="maps vectors to its own ids"):
            import_faiss_index(corpus, tmp_path / f"{name}.index", tmp_path / "c",
                               encoder=bundled_encoder_path())
    rows = faiss.IndexIVFFlat(quantiser, vectors.shape[1], 2, faiss.METRIC_INNER_PRODUCT)
    rows.train(vectors)
    rows.add(vectors)              # ids are rows: imported
    faiss.write_index(rows, str(tmp_path / "ivf.index"))
    import_faiss_index(corpus, tmp_path / "ivf.index", tmp_path / "d",
                       encoder=bundled_encoder_path())


def test_ivfpq_trains_on_a_sample_of_every_shard(tmp_path) -> None:
    from seekrl.retrieval.dense import _sample_shards

    sizes = [50, 50, 30]
    for number, size in enumerate(sizes):     # shard k's vectors all hold the value k
        np.save(tmp_path / f"{number:05d}.npy", np.full((size, 4), number, dtype=np.float32))
    sample = _sample_shards(tmp_path, len(sizes), sum(sizes), 60)
    assert sample.shape == (60, 4) and sample.dtype == np.float32
    assert set(np.unique(sample[:, 0]).tolist()) == {0.0, 1.0, 2.0}   # from all of them
    assert len(_sample_shards(tmp_path, len(sizes), sum(sizes), 10_000)) == sum(sizes)


def test_a_flat_index_is_memory_mapped_not_read_whole(tmp_path, monkeypatch):
    """`IO_FLAG_MMAP` maps IVF lists alone: a flat index read with it comes into memory
    whole (wiki-18's e5 index: 60 GB). Flat codes map with `IO_FLAG_MMAP_IFC`, tried first;
    an index it cannot read falls back to the plain read."""
    from seekrl.retrieval.dense import read_faiss

    if not hasattr(faiss, "IO_FLAG_MMAP_IFC"):
        pytest.skip("this faiss has no IO_FLAG_MMAP_IFC")
    vectors = np.eye(4, 8, dtype=np.float32)
    path = write_faiss(tmp_path / "flat.index", vectors)
    flags, real = [], faiss.read_index

    def recording(name, flag=0):
        flags.append(flag)
        return real(name, flag)

    monkeypatch.setattr(faiss, "read_index", recording)
    index = read_faiss(path)
    assert flags == [faiss.IO_FLAG_MMAP_IFC]
    assert index.search(vectors[2:3], 1)[1][0][0] == 2

    def ifc_refused(name, flag=0):
        flags.append(flag)
        if flag == faiss.IO_FLAG_MMAP_IFC:
            raise RuntimeError("cannot map")
        return real(name, flag)

    flags.clear()
    monkeypatch.setattr(faiss, "read_index", ifc_refused)
    assert read_faiss(path).ntotal == 4 and flags == [faiss.IO_FLAG_MMAP_IFC, faiss.IO_FLAG_MMAP]
