"""Corpora: JSONL reading with located errors, the memory-mapped string array and doc store."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seekrl.data.jsonl import SkipReport
from seekrl.errors import DataError
from seekrl.retrieval.base import Hit, split_contents
from seekrl.retrieval.corpus import DocStore, StringArray, file_sha256, iter_corpus


def write_lines(path: Path, lines: list) -> Path:
    """Write JSONL: dicts are dumped, strings written as they are (for broken lines)."""
    with open(path, "w", encoding="utf-8") as f:
        f.writelines((line if isinstance(line, str) else json.dumps(line)) + "\n"
                     for line in lines)
    return path


# --------------------------------------------------------------------------- iter_corpus


def test_iter_corpus_contents_form(tmp_path):
    path = write_lines(tmp_path / "c.jsonl", [
        {"id": "d1", "contents": "Paris\nParis is the capital of France."},
        {"id": "d2", "contents": "no title, one line"},
    ])
    assert list(iter_corpus(path)) == [
        ("d1", "Paris\nParis is the capital of France."),
        ("d2", "no title, one line"),
    ]


def test_iter_corpus_title_text_form(tmp_path):
    path = write_lines(tmp_path / "c.jsonl", [
        {"id": "d1", "title": "Paris", "text": "Capital of France."},
        {"id": "d2", "text": "No title field."},
        {"id": "d3", "title": "", "text": "Empty title."},
        {"id": "d4", "title": 1984, "text": "A novel."},   # a number, as beside contents
        # several lines without a title: the first is no title (it was read as one)
        {"id": "d5", "text": "Para one.\nPara two."},
        {"id": "d6", "title": "Two\nlines", "text": "x"},   # a title is one line
        {"id": "d7", "title": "A\n B", "contents": "y"},
        {"id": "d8", "title": 1984.0, "text": "z"},   # as a float column writes it
        {"id": "d9", "title": 2.5, "contents": "w"},
    ])
    assert list(iter_corpus(path)) == [
        ("d1", "Paris\nCapital of France."),
        ("d2", "No title field."),
        ("d3", "Empty title."),
        ("d4", "1984\nA novel."),
        ("d5", "\nPara one.\nPara two."),
        ("d6", "Two lines\nx"),
        ("d7", "A B\ny"),
        ("d8", "1984\nz"),
        ("d9", "2.5\nw"),
    ]
    assert split_contents("\nPara one.\nPara two.") == ("", "Para one.\nPara two.")


def test_a_title_beside_the_contents_is_kept_as_its_first_line(tmp_path):
    path = write_lines(tmp_path / "c.jsonl", [
        {"id": "d1", "title": "Paris", "contents": "The capital of France."},
        {"id": "d2", "title": "Paris", "contents": "Paris\nThe capital of France."},
        {"id": "d3", "title": "", "contents": "Untitled."},
        {"id": "d4", "title": "Aaron", "contents": '"Aaron"\nA prophet.'},   # wiki-18's way
        {"id": "d5", "title": 1984, "contents": "A novel."},
    ])
    assert list(iter_corpus(path)) == [
        ("d1", "Paris\nThe capital of France."),
        ("d2", "Paris\nThe capital of France."),      # there already: not twice
        ("d3", "Untitled."),
        ("d4", '"Aaron"\nA prophet.'),
        ("d5", "1984\nA novel."),
    ]
    bad = write_lines(tmp_path / "b.jsonl", [{"id": "d1", "title": [3], "contents": "x"}])
    with pytest.raises(DataError, match="b.jsonl:1: field 'title': expected a string, got list"):
        list(iter_corpus(bad))
    for layout in ("contents", "text"):   # a NaN had become the title "nan"
        nan = write_lines(tmp_path / "n.jsonl", [{"id": "d1", "title": float("nan"), layout: "x"}])
        with pytest.raises(DataError, match="n.jsonl:1: field 'title': expected a string, "
                                            "got the number nan"):
            list(iter_corpus(nan))


def test_iter_corpus_int_ids_become_strings(tmp_path):
    path = write_lines(tmp_path / "c.jsonl", [{"id": 0, "contents": "a"}, {"id": 17, "contents": "b"}])
    assert list(iter_corpus(path)) == [("0", "a"), ("17", "b")]


def test_iter_corpus_skips_blank_lines_and_accepts_str_path(tmp_path):
    path = write_lines(tmp_path / "c.jsonl", [{"id": "a", "contents": "x"}, "", "   ",
                                              {"id": "b", "contents": "y"}])
    assert [doc_id for doc_id, _ in iter_corpus(str(path))] == ["a", "b"]


@pytest.mark.parametrize("bad, field, expected", [
    ({"contents": "no id"}, "id", "missing"),
    ({"id": "d", "title": "only a title"}, "contents", "missing"),
    ({"id": 1.5, "contents": "x"}, "id", "float"),
    ({"id": True, "contents": "x"}, "id", "bool"),
    ({"id": None, "contents": "x"}, "id", "NoneType"),
    ({"id": ["a"], "contents": "x"}, "id", "list"),
    ({"id": "d", "contents": 42}, "contents", "int"),
    ({"id": "d", "contents": None}, "contents", "NoneType"),
    ({"id": "d", "title": "T", "text": ["not", "a", "string"]}, "text", "list"),
    ({"id": "d", "title": ["T"], "text": "t"}, "title", "list"),   # the title named, not text
    ({"id": "", "contents": "x"}, "id", "blank"),          # a hit could not name it
    ({"id": " ", "contents": "x"}, "id", "blank"),
    ({"id": "d", "contents": ""}, "contents", "no text"),  # it can match no query
    ({"id": "d", "contents": " \n "}, "contents", "no text"),
    ({"id": "d", "text": ""}, "text", "no text"),
])
def test_iter_corpus_bad_fields_name_file_line_and_field(tmp_path, bad, field, expected):
    path = write_lines(tmp_path / "c.jsonl", [{"id": "ok", "contents": "fine"}, bad])
    with pytest.raises(DataError) as info:
        list(iter_corpus(path))
    err = info.value
    assert (err.path, err.line, err.field) == (str(path), 2, field)
    message = str(err)
    assert f"{path}:2" in message
    assert f"field '{field}'" in message
    assert expected in message


@pytest.mark.parametrize("bad, expected", [
    ('{"id": "d", "contents": ', "invalid JSON"),
    ('["a", "list"]', "expected a JSON object"),
    ("not json at all", "invalid JSON"),
])
def test_iter_corpus_bad_json_names_file_and_line(tmp_path, bad, expected):
    path = write_lines(tmp_path / "c.jsonl", [{"id": "a", "contents": "x"},
                                              {"id": "b", "contents": "y"}, bad])
    with pytest.raises(DataError) as info:
        list(iter_corpus(path))
    assert info.value.line == 3
    assert f"{path}:3" in str(info.value)
    assert expected in str(info.value)


def test_iter_corpus_is_lazy_errors_come_at_the_bad_line(tmp_path):
    path = write_lines(tmp_path / "c.jsonl", [{"id": "a", "contents": "x"}, "{broken"])
    docs = iter_corpus(path)
    assert next(docs) == ("a", "x")
    with pytest.raises(DataError):
        next(docs)


def test_iter_corpus_skip_bad_counts_every_kind_of_bad_line(tmp_path):
    path = write_lines(tmp_path / "c.jsonl", [
        {"id": "a", "contents": "x"},
        "{broken json",                      # line 2: JSON
        {"contents": "no id"},               # line 3: field id
        {"id": "b", "contents": "y"},
        {"id": "c", "contents": 7},          # line 5: field contents type
        "[1, 2]",                            # line 6: not an object
        {"id": "d", "title": "T", "text": "z"},
        '{"id": "e", "contents": "bad \\ud800 x"}',   # line 8: valid JSON, not UTF-8
    ])
    report = SkipReport()
    docs = list(iter_corpus(path, skip_bad=True, report=report))
    assert docs == [("a", "x"), ("b", "y"), ("d", "T\nz")]
    assert report.count == 5
    assert bool(report)
    assert [line for line, _ in report.skipped] == [2, 3, 5, 6, 8]
    reasons = dict(report.skipped)
    assert "invalid JSON" in reasons[2]
    assert "field 'id'" in reasons[3]
    assert "field 'contents'" in reasons[5]
    # reasons carry no "path:line:" prefix: the report already knows both
    assert not any(reason.startswith(str(path)) for reason in reasons.values())
    assert report.path == str(path)
    assert "field 'contents'" in reasons[8] and "surrogate" in reasons[8]
    summary = str(report)
    assert "skipped 5 bad line(s)" in summary and "line 3:" in summary


def test_iter_corpus_skip_bad_without_report_still_warns(tmp_path, caplog):
    """Nothing is dropped silently: without a report the skips reach the log."""
    path = write_lines(tmp_path / "c.jsonl", [{"id": "a", "contents": "x"}, {"contents": "no id"},
                                              "{broken"])
    with caplog.at_level(logging.WARNING):
        docs = list(iter_corpus(path, skip_bad=True))
    assert docs == [("a", "x")]
    assert "skipped 2 bad line(s)" in caplog.text
    assert "field 'id'" in caplog.text


def test_iter_corpus_skip_bad_clean_file_reports_nothing(tmp_path):
    path = write_lines(tmp_path / "c.jsonl", [{"id": "a", "contents": "x"}])
    report = SkipReport()
    assert list(iter_corpus(path, skip_bad=True, report=report)) == [("a", "x")]
    assert report.count == 0 and not report


def test_iter_corpus_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        list(iter_corpus(tmp_path / "nope.jsonl"))


# --------------------------------------------------------------------------- StringArray


@pytest.mark.parametrize("strings", [
    ["alpha", "beta", "gamma"],
    ["", "a", "", "", "b", ""],
    [""],
    ["Zürich", "東京", "emoji 🦜 and ß", "Ωμέγα", "\u200b zero width", "tab\there\nnewline"],
    [],
])
def test_string_array_round_trip(tmp_path, strings):
    n = StringArray.write(tmp_path, "s", iter(strings))  # any iterable, streamed
    assert n == len(strings)
    arr = StringArray(tmp_path, "s")
    assert len(arr) == len(strings)
    assert list(arr) == strings
    assert [arr[i] for i in range(len(strings))] == strings
    if strings:
        assert arr[-1] == strings[-1]


def test_string_array_empty_has_no_bytes_and_still_loads(tmp_path):
    StringArray.write(tmp_path, "s", [])
    assert (tmp_path / "s.bin").stat().st_size == 0
    arr = StringArray(tmp_path, "s")
    assert len(arr) == 0 and list(arr) == []
    with pytest.raises(IndexError):
        arr[0]


def test_string_array_all_empty_strings(tmp_path):
    """Only empty strings: a zero-byte .bin, which numpy cannot memory-map."""
    StringArray.write(tmp_path, "s", ["", "", ""])
    arr = StringArray(tmp_path, "s")
    assert list(arr) == ["", "", ""]


def test_string_array_index_errors(tmp_path):
    StringArray.write(tmp_path, "s", ["a", "b"])
    arr = StringArray(tmp_path, "s")
    assert arr[-2] == "a"
    for bad in (2, -3, 100):
        with pytest.raises(IndexError):
            arr[bad]


def test_string_array_offsets_are_utf8_bytes(tmp_path):
    StringArray.write(tmp_path, "s", ["é", "ab"])
    arr = StringArray(tmp_path, "s")
    assert list(arr.offsets) == [0, 2, 4]
    assert (tmp_path / "s.bin").read_bytes() == "éab".encode()


@settings(max_examples=60, deadline=None)
@given(strings=st.lists(st.text(), max_size=20))
def test_string_array_round_trip_any_text(tmp_path_factory, strings):
    directory = tmp_path_factory.mktemp("sa")
    StringArray.write(directory, "s", strings)
    arr = StringArray(directory, "s")
    assert len(arr) == len(strings)
    assert list(arr) == strings


# --------------------------------------------------------------------------- DocStore

DOCS = [
    ("doc-0", "Paris\nParis is the capital of France."),
    ("doc-1", "\"Ed Wood\"\nEdward Davis Wood Jr. was an American filmmaker."),
    ("doc-2", "a single line with no title"),
    ("doc-3", "Zürich\nDie größte Stadt der Schweiz 🇨🇭."),
    ("doc-4", "Empty text\n"),
]


def test_docstore_build_and_read_back(tmp_path):
    n = DocStore.build(tmp_path, iter(DOCS))
    assert n == len(DOCS)
    store = DocStore(tmp_path)
    assert len(store) == len(DOCS)
    assert list(store.ids) == [doc_id for doc_id, _ in DOCS]
    assert list(store.contents) == [contents for _, contents in DOCS]
    assert not (tmp_path / "doc_ids.tmp").exists()  # the scratch id file is gone


def test_docstore_hit_splits_title_and_text(tmp_path):
    DocStore.build(tmp_path, DOCS)
    store = DocStore(tmp_path)
    assert store.hit(0, 1.5) == Hit("doc-0", "Paris", "Paris is the capital of France.", 1.5)
    assert store.hit(1, 2) == Hit("doc-1", "Ed Wood",
                                  "Edward Davis Wood Jr. was an American filmmaker.", 2.0)
    assert isinstance(store.hit(1, 2).score, float)
    assert store.hit(2, 0.0) == Hit("doc-2", "", "a single line with no title", 0.0)
    assert store.hit(3, 0.0).title == "Zürich"
    assert store.hit(4, 0.0) == Hit("doc-4", "Empty text", "", 0.0)
    # Hit.contents gives back the corpus form when nothing needed stripping
    assert store.hit(0, 0).contents == DOCS[0][1]
    assert store.hit(2, 0).contents == DOCS[2][1]


def test_docstore_duplicate_ids_raise_naming_the_id(tmp_path):
    docs = [("a", "x"), ("dup-7", "y"), ("b", "z"), ("dup-7", "w")]
    with pytest.raises(DataError, match="duplicate document id 'dup-7'") as info:
        DocStore.build(tmp_path, docs)
    assert info.value.field == "id"
    assert "documents #2 and #4" in str(info.value)   # both, the first one too


def test_docstore_int_and_str_ids_collide(tmp_path):
    """iter_corpus turns 1 into "1", so {"id": 1} and {"id": "1"} are the same document."""
    path = write_lines(tmp_path / "c.jsonl", [{"id": 1, "contents": "x"},
                                              {"id": "1", "contents": "y"}])
    out = tmp_path / "store"
    out.mkdir()
    with pytest.raises(DataError, match="duplicate document id '1'"):
        DocStore.build(out, iter_corpus(path))


@pytest.mark.parametrize("bad_id", ["two\nlines", "\n", "trailing\n"])
def test_docstore_rejects_newline_in_id(tmp_path, bad_id):
    with pytest.raises(DataError, match="newline") as info:
        DocStore.build(tmp_path, [("fine", "x"), (bad_id, "y")])
    assert info.value.field == "id"


def test_docstore_ids_with_other_line_breaks_round_trip(tmp_path):
    """Only "\\n" is rejected; "\\r" and unicode line separators must not split ids."""
    ids = ["carriage\rreturn", "crlf-ish\r", "line\u2028sep", "nel\x85", "plain"]
    DocStore.build(tmp_path, [(doc_id, f"T\n{i}") for i, doc_id in enumerate(ids)])
    store = DocStore(tmp_path)
    assert len(store) == len(ids)
    assert list(store.ids) == ids
    assert [store.hit(i, 0).doc_id for i in range(len(ids))] == ids


def test_docstore_from_corpus_file(tmp_path):
    path = write_lines(tmp_path / "c.jsonl", [{"id": 5, "title": "T", "text": "body"},
                                              {"id": "x", "contents": "U\nmore"}])
    out = tmp_path / "store"
    out.mkdir()
    assert DocStore.build(out, iter_corpus(path)) == 2
    store = DocStore(out)
    assert [store.hit(i, 0) for i in range(2)] == [Hit("5", "T", "body", 0.0),
                                                   Hit("x", "U", "more", 0.0)]


def test_docstore_empty(tmp_path):
    assert DocStore.build(tmp_path, []) == 0
    assert len(DocStore(tmp_path)) == 0


# --------------------------------------------------------------------------- split_contents


@pytest.mark.parametrize("contents, expected", [
    ("Title\ntext", ("Title", "text")),
    ("no newline at all", ("", "no newline at all")),
    ("", ("", "")),
    ('"Ed Wood"\nEdward Davis Wood Jr.', ("Ed Wood", "Edward Davis Wood Jr.")),  # wiki-18
    ('"Title"\n"quoted text stays quoted"', ("Title", '"quoted text stays quoted"')),
    ("Title\nline one\nline two", ("Title", "line one\nline two")),  # only the first split
    ("\ntext without title", ("", "text without title")),
    ("Title only\n", ("Title only", "")),
    ("  Spaced title  \n  text  ", ("Spaced title", "text")),
    ('"Title"\n', ("Title", "")),
])
def test_split_contents(contents, expected):
    assert split_contents(contents) == expected


def test_hit_from_contents_round_trip():
    hit = Hit.from_contents("d", '"Ed Wood"\nAmerican filmmaker.', 3)
    assert hit == Hit("d", "Ed Wood", "American filmmaker.", 3.0)
    # served and reranked as the corpus holds it (Search-R1's server sends it so)
    assert hit.contents == '"Ed Wood"\nAmerican filmmaker.'
    assert Hit("d", "Ed Wood", "American filmmaker.", 3.0).contents == \
        "Ed Wood\nAmerican filmmaker."
    assert Hit.from_contents("d", "just text", 0).contents == "just text"
    assert Hit.from_contents("d", "T\ntext", 0).stored is None   # composed again: not kept


# --------------------------------------------------------------------------- file_sha256


def test_file_sha256_matches_hashlib(tmp_path):
    data = b"".join(bytes([i % 251]) * 97 for i in range(300))
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    expected = hashlib.sha256(data).hexdigest()
    assert file_sha256(path) == expected
    assert file_sha256(str(path), chunk=7) == expected  # chunking does not change the hash


def test_file_sha256_empty_file(tmp_path):
    path = tmp_path / "empty"
    path.write_bytes(b"")
    assert file_sha256(path) == hashlib.sha256(b"").hexdigest()
