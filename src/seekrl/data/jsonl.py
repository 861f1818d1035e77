"""Streaming JSON Lines reading with errors that name the file and line.

Shared by the QA readers and the retrieval corpus reader: corpora run to millions of lines,
so `iter_jsonl` reads one line at a time and never holds the file in memory.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from seekrl.errors import DataError

__all__ = ["DuplicateKey", "SkipReport", "iter_jsonl", "unique_keys"]

log = logging.getLogger(__name__)


@dataclass
class SkipReport:
    """What a `skip_bad=True` read left out: how many lines and (the first few) why.

    Pass one in to see it afterwards; `str(report)` is a printable summary.
    """

    path: str | None = None
    count: int = 0
    skipped: list[tuple[int, str]] = field(default_factory=list)
    max_kept: int = 20  # keep the first reasons only, so a broken big file stays cheap

    def add(self, line: int, reason: str) -> None:
        self.count += 1
        if len(self.skipped) < self.max_kept:
            self.skipped.append((line, reason))

    def __bool__(self) -> bool:  # "if report:" reads as "was anything skipped?"
        return self.count > 0

    def __str__(self) -> str:
        where = f" in {self.path}" if self.path else ""
        if not self.count:
            return f"skipped no lines{where}"
        lines = [f"skipped {self.count} bad line(s){where}:"]
        lines += [f"  line {line}: {reason}" for line, reason in self.skipped]
        if self.count > len(self.skipped):
            lines.append(f"  ... and {self.count - len(self.skipped)} more")
        return "\n".join(lines)


def reason_of(error: DataError) -> str:
    """The error's message without its "path:line: " prefix (the report already has both)."""
    prefix = f"{error.path}:{error.line}: " if error.line is not None else f"{error.path}: "
    return str(error).removeprefix(prefix)


class DuplicateKey(ValueError):
    """A JSON object names one key twice (raised by `unique_keys`)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"key {key!r} given twice in one object; expected each once")


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's pairs -> a dict, refusing a key given twice (plain `json.loads` keeps
    the last value and the first is lost without a word)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return out


def _parse_line(raw: bytes, path: str, line_no: int) -> dict[str, Any] | None:
    """One raw line -> its JSON object, None for a blank line; DataError otherwise."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"not valid UTF-8 ({e.reason} at byte {e.start})",
                        path=path, line=line_no) from None
    if line_no == 1:
        text = text.removeprefix("\ufeff")  # a byte-order mark some editors write
    if not text.strip():
        return None
    try:
        obj = json.loads(text, object_pairs_hook=unique_keys)
    except DuplicateKey as e:
        raise DataError(str(e), path=path, line=line_no) from None
    except json.JSONDecodeError as e:
        raise DataError(f"invalid JSON ({e.msg} at column {e.colno}); "
                        "expected one JSON object per line", path=path, line=line_no) from None
    except ValueError as e:   # an integer past Python's 4,300-digit limit: no decode error
        raise DataError(f"invalid JSON ({e}); expected one JSON object per line",
                        path=path, line=line_no) from None
    except RecursionError:
        raise DataError("JSON nested too deeply", path=path, line=line_no) from None
    if not isinstance(obj, dict):
        raise DataError(f"expected a JSON object, got {type(obj).__name__}",
                        path=path, line=line_no)
    return obj


def iter_jsonl(
    path: str | os.PathLike[str],
    *,
    skip_bad: bool = False,
    report: SkipReport | None = None,
    max_bytes: int | None = None,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield `(line_no, obj)` for each JSON object line of `path`; line numbers are 1-based.

    Blank lines are ignored. A line that is not UTF-8, not JSON or not an object raises
    `DataError` naming file and line; with `skip_bad=True` it is skipped and recorded in
    `report` (or, when no report is given, summarised in a log warning at the end).
    `max_bytes` reads only the file's first bytes (what a writer recorded as complete).
    """
    path_str = os.fspath(path)
    own_report = report is None
    if report is None:
        report = SkipReport(path=path_str)
    elif report.path is None:
        report.path = path_str
    # Binary mode: lines split on b"\n" only, and a bad byte is blamed on its own line.
    with open(path_str, "rb") as f:
        read = 0
        for line_no, raw in enumerate(f, start=1):
            read += len(raw)
            if max_bytes is not None and read > max_bytes:
                break      # a line that ends past the limit was not complete at it
            try:
                obj = _parse_line(raw, path_str, line_no)
            except DataError as e:
                if not skip_bad:
                    raise
                report.add(line_no, reason_of(e))
                continue
            if obj is not None:
                yield line_no, obj
    if own_report and report:
        log.warning("%s", report)
