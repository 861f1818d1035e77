"""The retrieval contract every retriever (local index or remote server) follows."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from seekrl.errors import SeekrlError


@dataclass(frozen=True)
class Hit:
    """One retrieved document. `score` is higher-is-better within one query's list."""

    doc_id: str
    title: str
    text: str
    score: float
    # the stored contents where title and text do not compose them again (wiki-18's quoted
    # titles, surrounding whitespace): served as stored, as Search-R1's server does
    stored: str | None = field(default=None, compare=False, repr=False)

    @property
    def contents(self) -> str:
        """The Search-R1 / FlashRAG corpus form: `"Title\\ntext"`, as the corpus holds it."""
        if self.stored is not None:
            return self.stored
        return f"{self.title}\n{self.text}" if self.title else self.text

    @classmethod
    def from_contents(cls, doc_id: str, contents: str, score: float) -> "Hit":
        title, text = split_contents(contents)
        composed = f"{title}\n{text}" if title else text
        return cls(doc_id=doc_id, title=title, text=text, score=float(score),
                   stored=None if composed == contents else contents)

    def to_dict(self) -> dict:
        d = asdict(self)
        del d["stored"]   # a trajectory's hits keep the fields the agent read
        return d


_SIMULATED_ID = re.compile(r"sim-[0-9a-f]{12}")


def simulated_id(doc_id: str) -> bool:
    """A document an LLM wrote (a simulated search engine's, or the policy's own in
    self-search: `retrieval.simulated.document_id`), not one of the corpus: it earns no
    evidence credit, by id or by title."""
    return _SIMULATED_ID.fullmatch(doc_id) is not None


def json_object(file: Path, fields: Sequence[str]) -> dict:
    """The JSON object a seekrl file holds (an index manifest, a ranker's settings) with
    `fields` present, or a RetrievalError naming the file and what is wrong."""
    try:
        obj = json.loads(file.read_text())
    except (ValueError, UnicodeDecodeError) as err:   # JSONDecodeError is a ValueError
        raise RetrievalError(f"{file}: not valid JSON ({err})") from err
    if not isinstance(obj, dict):
        raise RetrievalError(f"{file}: expected a JSON object, got {type(obj).__name__}")
    for key in fields:
        if key not in obj:
            raise RetrievalError(f"{file}: missing field '{key}'")
    return obj


def split_contents(contents: str) -> tuple[str, str]:
    """Split `"Title\\ntext"` into (title, text); a single line is all text, no title."""
    title, sep, text = contents.partition("\n")
    if not sep:
        return "", contents
    return title.strip().strip('"'), text.strip()


@runtime_checkable
class Retriever(Protocol):
    """Batch-first: one call per agent turn for the whole batch of queries."""

    def search(self, queries: list[str], k: int) -> list[list[Hit]]: ...


class RetrievalError(SeekrlError, RuntimeError):
    """A retriever could not answer (bad index, unreachable server, bad request)."""
