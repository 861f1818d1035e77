"""Corpora: streaming JSONL reading and a memory-mapped document store.

A corpus file has one JSON object per line, `{"id", "contents"}` with
`contents = "Title\\ntext"` (Search-R1 / FlashRAG). wiki-18 has 21 million lines, so
nothing here holds the corpus as Python dicts: `iter_corpus` streams, and `DocStore`
keeps every document's bytes in one flat file read through `numpy.memmap`.
"""

from __future__ import annotations

import hashlib
import logging
import math
from array import array
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from seekrl.data.jsonl import SkipReport, iter_jsonl, reason_of
from seekrl.errors import DataError
from seekrl.retrieval.base import Hit, split_contents

log = logging.getLogger(__name__)


def iter_corpus(path: str | Path, *, skip_bad: bool = False,
                report: SkipReport | None = None) -> Iterator[tuple[str, str]]:
    """Yield `(doc_id, contents)` per line. Accepts `contents`, or `title` + `text`.

    With `skip_bad=True` bad lines (JSON or fields) go to `report`, or, when none is
    given, into a log warning at the end: nothing is dropped silently.
    """
    own_report = report is None
    if report is None:
        report = SkipReport(path=str(path))
    for line_no, obj in iter_jsonl(path, skip_bad=skip_bad, report=report):
        try:
            yield _doc_fields(obj, path, line_no)
        except DataError as err:
            if not skip_bad:
                raise
            report.add(line_no, reason_of(err))
    if own_report and report:
        log.warning("%s", report)


def _one_line(title: str | None) -> str | None:
    """A title's whitespace collapsed: the stored form ends the title at its first newline."""
    return " ".join(title.split()) if title else title


def _number_title(title, path, line_no: int):
    """A title written as a number, as text ("1984"; 1984.0 too, as answers read it); a
    NaN or infinite one refused (it had become the title "nan"); anything else as given."""
    if isinstance(title, bool) or not isinstance(title, (int, float)):
        return title
    if isinstance(title, float):
        if not math.isfinite(title):
            raise DataError(f"expected a string, got the number {title}", path=str(path),
                            line=line_no, field="title")
        if title.is_integer():
            return str(int(title))
    return str(title)


def _doc_fields(obj: dict, path: str | Path, line_no: int) -> tuple[str, str]:
    if "id" not in obj:
        raise DataError("missing; expected a document id", path=str(path), line=line_no,
                        field="id")
    doc_id = obj["id"]
    if not isinstance(doc_id, (str, int)) or isinstance(doc_id, bool):
        raise DataError(f"expected a string or integer, got {type(doc_id).__name__}",
                        path=str(path), line=line_no, field="id")
    if "contents" in obj:
        contents = obj["contents"]
        if not isinstance(contents, str):
            raise DataError(f"expected a string, got {type(contents).__name__}",
                            path=str(path), line=line_no, field="contents")
        title = _number_title(obj.get("title"), path, line_no)
        if title is not None and not isinstance(title, str):
            raise DataError(f"expected a string, got {type(title).__name__}",
                            path=str(path), line=line_no, field="title")
        title = _one_line(title)
        # a title beside the contents: the contents' first line is the title, so it goes
        # there unless it is there already, as split_contents reads it (wiki-18 quotes it)
        if title and split_contents(contents)[0].casefold() != \
                title.strip().strip('"').casefold():
            contents = f"{title}\n{contents}"
    elif "text" in obj:  # the other common layout: separate title and text fields
        title, text = _number_title(obj.get("title", ""), path, line_no), obj["text"]
        for name, value in (("title", title), ("text", text)):
            if not isinstance(value, str):
                raise DataError(f"expected a string, got {type(value).__name__}",
                                path=str(path), line=line_no, field=name)
        title = _one_line(title)
        # the stored form's first line is its title: a text of several lines without one
        # starts on the second (its first paragraph was read as the title)
        contents = f"{title}\n{text}" if title or "\n" in text else text
    else:
        raise DataError("missing; expected 'contents' (\"Title\\ntext\") or 'text'",
                        path=str(path), line=line_no, field="contents")
    if not str(doc_id).strip():   # a hit names its document by id
        raise DataError("blank; expected a document id a hit can name", path=str(path),
                        line=line_no, field="id")
    if not contents.strip():
        raise DataError("no text: a blank document can match no query (--skip-bad leaves "
                        "such lines out and counts them)", path=str(path), line=line_no,
                        field="contents" if "contents" in obj else "text")
    if "\n" in str(doc_id):   # the store keeps one id a line
        raise DataError(f"document id {str(doc_id)!r} contains a newline", path=str(path),
                        line=line_no, field="id")
    for name, value in (("id", str(doc_id)), ("contents", contents)):
        try:   # JSON can spell a lone surrogate ("\ud800"), which UTF-8 cannot store
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            raise DataError(f"not storable as UTF-8 ({err.reason} at character {err.start}; "
                            "a lone surrogate escape?)", path=str(path), line=line_no,
                            field=name) from None
    return str(doc_id), contents


def file_sha256(path: str | Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


class StringArray:
    """An immutable on-disk array of strings: `<name>.bin` (UTF-8) + `<name>.offsets.npy`."""

    def __init__(self, directory: str | Path, name: str):
        directory = Path(directory)
        self.offsets = np.load(directory / f"{name}.offsets.npy", mmap_mode="r")
        bin_path = directory / f"{name}.bin"
        # numpy cannot memory-map an empty file; an empty corpus stores no bytes.
        self._data = (np.memmap(bin_path, dtype=np.uint8, mode="r")
                      if bin_path.stat().st_size else np.zeros(0, dtype=np.uint8))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> str:
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        start, end = int(self.offsets[i]), int(self.offsets[i + 1])
        return bytes(self._data[start:end]).decode("utf-8")

    def __iter__(self) -> Iterator[str]:
        for i in range(len(self)):
            yield self[i]

    @staticmethod
    def write(directory: str | Path, name: str, strings: Iterable[str]) -> int:
        """Stream `strings` to disk; returns how many were written."""
        directory = Path(directory)
        offsets = array("q", [0])   # 8 bytes a string (a list of ints: ~40; 21M wiki docs)
        with open(directory / f"{name}.bin", "wb") as f:
            for s in strings:
                b = s.encode("utf-8")
                f.write(b)
                offsets.append(offsets[-1] + len(b))
        np.save(directory / f"{name}.offsets.npy", np.frombuffer(offsets, dtype=np.int64))
        return len(offsets) - 1


class DocStore:
    """Documents by row number: ids and contents, memory-mapped from an index folder."""

    def __init__(self, directory: str | Path):
        self.ids = StringArray(directory, "doc_ids")
        self.contents = StringArray(directory, "doc_contents")

    def __len__(self) -> int:
        return len(self.ids)

    def hit(self, row: int, score: float) -> Hit:
        return Hit.from_contents(self.ids[row], self.contents[row], score)

    def rows_of(self, doc_ids: Sequence[str]) -> list[int]:
        """The row of each document id (a KeyError naming an id the store does not hold).
        The first call sorts a hash of every id (8 bytes a document; a pass over the ids,
        seconds for a million); later calls look up by binary search and check the id."""
        if getattr(self, "_hash_order", None) is None:
            hashes = np.fromiter((hash(i) for i in self.ids), dtype=np.int64, count=len(self))
            self._hash_order = np.argsort(hashes, kind="stable")
            self._hashes = hashes[self._hash_order]
        rows = []
        for doc_id in doc_ids:
            h = hash(doc_id)
            lo = int(np.searchsorted(self._hashes, h, side="left"))
            hi = int(np.searchsorted(self._hashes, h, side="right"))
            row = next((int(r) for r in self._hash_order[lo:hi] if self.ids[int(r)] == doc_id),
                       None)
            if row is None:
                raise KeyError(f"document id {doc_id!r} is not in the index")
            rows.append(row)
        return rows

    @staticmethod
    def build(directory: str | Path, docs: Iterable[tuple[str, str]]) -> int:
        """Write ids and contents in one pass over `docs`; duplicate ids are an error."""
        directory = Path(directory)
        id_tmp = directory / "doc_ids.tmp"
        # 8-byte id hashes in a typed array, not a set of strings (or a list of ints): 21M
        # wiki ids would cost gigabytes that way, 170 MB this way.
        id_hashes = array("q")

        def contents_stream() -> Iterator[str]:
            # newline="\n" both ways: an id holding "\r" must not split into two lines
            with open(id_tmp, "w", encoding="utf-8", newline="\n") as ids_out:
                for doc_id, contents in docs:
                    if "\n" in doc_id:
                        raise DataError(f"document id {doc_id!r} contains a newline",
                                        field="id")
                    id_hashes.append(hash(doc_id))
                    ids_out.write(doc_id + "\n")
                    yield contents

        n = StringArray.write(directory, "doc_contents", contents_stream())
        hashes = np.frombuffer(id_hashes, dtype=np.int64).copy()
        del id_hashes[:]  # free it now: wiki-18 has 21M of them
        if len(np.unique(hashes)) != len(hashes):
            _raise_duplicate(id_tmp)
        with open(id_tmp, encoding="utf-8", newline="\n") as f:
            StringArray.write(directory, "doc_ids", (line.rstrip("\n") for line in f))
        id_tmp.unlink()
        return n


def _raise_duplicate(id_file: Path) -> None:
    """Second pass, only on the error path: find and name a duplicated id."""
    seen: dict[str, int] = {}
    with open(id_file, encoding="utf-8", newline="\n") as f:
        for row, line in enumerate(f):
            doc_id = line.rstrip("\n")
            if doc_id in seen:
                raise DataError(f"duplicate document id '{doc_id}' (documents #{seen[doc_id]} "
                                f"and #{row + 1}, counting the documents read, not lines); "
                                "ids must be unique", field="id")
            seen[doc_id] = row + 1


class StoreRetriever:
    """What the index retrievers share: they rank rows of a `DocStore` (`_rank`), and this
    turns rows into `Hit`s and handles the edge cases of `k` and empty batches."""

    store: DocStore

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        return [[self.store.hit(row, score) for row, score in ranked]
                for ranked in self.search_rows(queries, k)]

    def search_rows(self, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
        """(row, score) per query, best first."""
        if not queries:
            return []
        k = min(k, len(self.store))
        if k <= 0:
            return [[] for _ in queries]
        return self._rank(list(queries), k)

    def _rank(self, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
        raise NotImplementedError
