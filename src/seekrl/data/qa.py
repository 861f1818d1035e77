"""`QAExample` and the QA file formats: FlashRAG JSONL, Search-R1 parquet, HF datasets.

- FlashRAG JSONL: one `{"id", "question", "golden_answers", "metadata"}` object per line.
- Search-R1 parquet (what verl trains on): `data_source`, `prompt` (chat messages with the
  question inside the instruction), `ability`, `reward_model` =
  `{"style": "rule", "ground_truth": {"target": [answers]}}`, `extra_info`.
- Hugging Face datasets, by hub name or local files (needs the `hf` extra).

`load_qa` picks the right reader from a path or name. Every reader validates with
`QAExample.from_dict`, so a bad record fails with the file, line (or row) and field.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import functools
import io
import json
import logging
import math
import os
import reprlib
import string
import tokenize
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seekrl.data.benchmarks import (
    FLASHRAG_HUB,
    flashrag_dir,
    hop_class,
    parse_flashrag_spec,
    parse_hf_spec,
    with_supporting_titles,
)
from seekrl.data.jsonl import DuplicateKey, SkipReport, iter_jsonl, reason_of, unique_keys
from seekrl.errors import DataError
from seekrl.runtime import hub_unreachable

__all__ = [
    "SEARCH_R1_INSTRUCTION",
    "QAExample",
    "SkipReport",
    "given_titles",
    "hop_chain",
    "in_file",
    "iter_qa_jsonl",
    "load_hf_qa",
    "load_qa",
    "read_qa_jsonl",
    "read_searchr1_parquet",
    "write_qa_jsonl",
    "write_searchr1_parquet",
]

log = logging.getLogger(__name__)


def hop_chain(example) -> list[dict[str, Any]]:
    """A question's `metadata.chain` (its hops: objects with `query` and `doc_id`, as
    `seekrl world` writes them), checked: a ValueError naming the question and the hop."""
    chain = example.metadata.get("chain") or []
    if not isinstance(chain, list):
        raise ValueError(f"question {example.id}: metadata.chain: expected a list of hops "
                         f"(objects with query and doc_id), got {type(chain).__name__}")
    for i, hop in enumerate(chain):
        if not isinstance(hop, dict):
            raise ValueError(f"question {example.id}: metadata.chain[{i}]: expected an object "
                             f"with query and doc_id, got {type(hop).__name__}")
        query, doc = hop.get("query"), hop.get("doc_id")
        if query is not None and not isinstance(query, str):
            raise ValueError(f"question {example.id}: metadata.chain[{i}].query: expected "
                             f"text, got {_describe(query)}")
        if doc is not None and (isinstance(doc, (bool, list, dict, float))):
            raise ValueError(f"question {example.id}: metadata.chain[{i}].doc_id: expected "
                             f"a document id (text or an integer), got {_describe(doc)}")
    return chain


@contextlib.contextmanager
def in_file(path: str | Path):
    """A question's own check failing while a file's questions are read (`hop_chain` names
    the question and the hop) as a DataError that also names the file."""
    try:
        yield
    except DataError:
        raise
    except ValueError as err:
        raise DataError(str(err), path=str(path)) from None


def given_titles(metadata: Mapping[str, Any]) -> list[str]:
    """`metadata.supporting_titles` as a list (one title given as text is that title, not
    its letters)."""
    titles = metadata.get("supporting_titles") or []
    return [titles] if isinstance(titles, str) else list(titles)


def _describe(value: Any) -> str:
    """`list [1, 2]`: the type and a short repr, for "expected X, got Y" messages."""
    return f"{type(value).__name__} {reprlib.repr(value)}"


def _answer_text(value: Any) -> str | None:
    """An answer as text: strings as they are, numbers (years, counts) spelled out."""
    if isinstance(value, str):
        return value
    if isinstance(value, float) and not math.isfinite(value):
        return None   # NaN, Infinity (JSON's extensions, a float column's missing value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))   # 1984.0 (a column with nulls read as floats) is 1984
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return None


_SAID: set[str | None] = set()


def _say_once(key: str | None, message: str) -> None:
    if key not in _SAID:
        _SAID.add(key)
        log.warning("%s", message)


def _nothing_left(answer: str) -> bool:
    """The answer is punctuation and spaces alone: the metrics' normalisation (SQuAD's,
    `rewards.metrics.normalize_answer`) leaves nothing of it, so an empty answer would match
    it. (A bare article, "A", also normalises to nothing, but is a real answer: a letter, a
    grade; it is kept.)"""
    return not "".join(ch for ch in answer if ch not in string.punctuation).split()


@dataclass
class QAExample:
    """One question. `metadata` may hold `gold_doc_ids` (per hop), `hops`, `type`."""

    id: str
    question: str
    golden_answers: list[str]
    metadata: dict[str, Any] = field(default_factory=dict)
    # the question's own prompt when the data carries one (a Search-R1 parquet's `prompt`
    # column, a `prompt` key): chat messages [{"role", "content"}]; used with `prompt: data`
    prompt: list[dict[str, str]] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {
            "id": self.id,
            "question": self.question,
            "golden_answers": list(self.golden_answers),
            "metadata": self.metadata,
        }
        if self.prompt is not None:
            out["prompt"] = [dict(m) for m in self.prompt]
        return out

    @classmethod
    def from_dict(
        cls, d: Mapping[str, Any], *, path: str | os.PathLike[str] | None = None,
        line: int | None = None,
    ) -> QAExample:
        """Validate a FlashRAG-style record; `path` / `line` only go into error messages.

        Lenient where real files differ harmlessly: an int `id` becomes a string, a single
        string `golden_answers` becomes a one-item list, numeric answers become text.
        Unknown top-level keys are kept in `metadata` rather than dropped.
        """
        where = {"path": os.fspath(path) if path is not None else None, "line": line}
        if not isinstance(d, Mapping):
            raise DataError(f"expected an object, got {_describe(d)}", **where)
        for name in ("id", "question", "golden_answers"):
            if name not in d:
                raise DataError("missing required field", field=name, **where)

        raw_id = d["id"]
        if isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)) or \
                (isinstance(raw_id, str) and not raw_id.strip()):
            raise DataError(f"expected a non-empty string or an integer, got {_describe(raw_id)}",
                            field="id", **where)

        question = d["question"]
        if not isinstance(question, str) or not question.strip():
            raise DataError(f"expected a non-empty string, got {_describe(question)}",
                            field="question", **where)

        raw_answers = d["golden_answers"]
        if isinstance(raw_answers, str):  # FlashRAG files sometimes hold a bare string
            raw_answers = [raw_answers]
        if not isinstance(raw_answers, (list, tuple)) or not raw_answers:
            raise DataError(f"expected a non-empty list of strings, got {_describe(raw_answers)}",
                            field="golden_answers", **where)
        answers = []
        for i, raw in enumerate(raw_answers):
            text = _answer_text(raw)
            if text is None:
                raise DataError(f"expected a string, got {_describe(raw)}",
                                field=f"golden_answers[{i}]", **where)
            answers.append(text)
        # an answer of punctuation alone normalises to nothing for scoring, so an empty
        # answer would match it: set aside where another answer remains (kept in metadata
        # as `unscored_answers`, and said once a file), refused where none does
        unscored = [a for a in answers if _nothing_left(a)]
        if unscored:
            if len(unscored) == len(answers):
                raise DataError(f"{answers[0]!r} is punctuation and spaces alone: normalised "
                                "for scoring it is empty, and an empty answer would match it",
                                field="golden_answers", **where)
            answers = [a for a in answers if not _nothing_left(a)]
            _say_once(where["path"], f"{where['path'] or 'data'}: golden answers of "
                      f"punctuation alone (first at line {where['line']}: {unscored[0]!r}) "
                      "are not scored (an empty answer would match them); each example "
                      "keeps them in metadata.unscored_answers")

        metadata = d.get("metadata")
        if metadata is None:
            metadata = {}
        if not isinstance(metadata, Mapping):
            raise DataError(f"expected an object or null, got {_describe(metadata)}",
                            field="metadata", **where)
        prompt = prompt_messages(d.get("prompt"), where)
        extras = {k: v for k, v in d.items()
                  if k not in ("id", "question", "golden_answers", "metadata", "prompt")}
        for k, v in extras.items():   # kept in metadata: one of two values would be lost
            if k in metadata and metadata[k] != v:
                raise DataError(f"given at the top level ({_describe(v)}) and in metadata "
                                f"({_describe(metadata[k])}); expected one value",
                                field=k, **where)
        metadata = {**extras, **metadata}
        hops = metadata.get("hops")
        if hops is None or (isinstance(hops, float) and math.isnan(hops)):
            metadata.pop("hops", None)   # a null cell (a float column's is NaN): not given
        elif isinstance(hops, float) and hops.is_integer() and hops >= 1:
            metadata["hops"] = int(hops)   # pandas writes an int column with gaps as floats
        elif isinstance(hops, bool) or not isinstance(hops, int) or hops < 1:
            # "2" had switched the hop bonus and the per-hop figures off for the question
            raise DataError(f"expected a hop count (an integer >= 1) or null, got "
                            f"{_describe(hops)}", field="metadata.hops", **where)
        if metadata.get("gold_doc_ids") is None:   # a struct column fills a missing key
            metadata.pop("gold_doc_ids", None)      # with null: none given
        else:
            metadata["gold_doc_ids"] = _doc_ids(metadata["gold_doc_ids"], where)
        if unscored:
            given = metadata.get("unscored_answers") or []
            if not isinstance(given, list) or not all(isinstance(a, str) for a in given):
                raise DataError(f"expected a list of strings, got {_describe(given)}",
                                field="metadata.unscored_answers", **where)
            metadata["unscored_answers"] = list(dict.fromkeys([*given, *unscored]))
        try:
            metadata = with_supporting_titles(metadata)
        except ValueError as err:
            field_name, _, why = str(err).partition(": ")
            raise DataError(why, field=f"metadata.{field_name}", **where) from None
        for name, text in (("id", str(raw_id)), ("question", question),
                           *((f"golden_answers[{i}]", a) for i, a in enumerate(answers))):
            _check_storable(text, name, where)
        return cls(id=str(raw_id), question=question, golden_answers=answers,
                   metadata=metadata, prompt=prompt)


def _check_storable(text: str, name: str, where: dict) -> None:
    """Refuse text UTF-8 cannot hold (a lone surrogate, from a JSON "\\ud800" escape): it
    would load, then fail where a trajectory or eval file is written, naming neither."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise DataError(f"character {err.start} is a lone surrogate "
                        f"({text[err.start]!a}), which UTF-8 cannot store", field=name,
                        **where) from None


def _doc_ids(raw: Any, where: dict) -> list[str]:
    """`metadata.gold_doc_ids` as a list of ids: one id given alone is one id (never its
    letters), integer ids become text as the corpus's do."""
    if isinstance(raw, (str, int)) and not isinstance(raw, bool):
        raw = [raw]
    if isinstance(raw, tuple):
        raw = list(raw)
    if not isinstance(raw, list) or not all(
            isinstance(x, (str, int)) and not isinstance(x, bool) for x in raw):
        raise DataError(f"expected a list of document ids (strings or integers), got "
                        f"{_describe(raw)}", field="metadata.gold_doc_ids", **where)
    return [str(x) for x in raw]


def prompt_messages(raw: Any, where: dict) -> list[dict[str, str]] | None:
    """A record's own prompt as chat messages: a string is one user message; a list must
    hold {"role": str, "content": str} objects and end with a user message."""
    if raw is None:
        return None
    if isinstance(raw, str):
        raw = [{"role": "user", "content": raw}]
    if isinstance(raw, tuple):
        raw = list(raw)
    if not isinstance(raw, list) or not raw:
        raise DataError(f"expected a string or a non-empty list of chat messages, got "
                        f"{_describe(raw)}", field="prompt", **where)
    messages = []
    for i, m in enumerate(raw):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) \
                or not isinstance(m.get("content"), str):
            raise DataError(f"expected {{'role': str, 'content': str}}, got {_describe(m)}",
                            field=f"prompt[{i}]", **where)
        messages.append({"role": m["role"], "content": m["content"]})
    if messages[-1]["role"] != "user":
        raise DataError(f"expected the last message to be the user's, got role "
                        f"{messages[-1]['role']!r}", field=f"prompt[{len(messages) - 1}]",
                        **where)
    return messages


# ---------------------------------------------------------------------------- FlashRAG JSONL

def _valid_rows(rows: Iterable[tuple[int, Callable[[], QAExample]]], *, skip_bad: bool,
                report: SkipReport | None, path: str | None,
                source: str | None = None, array: bool = False) -> Iterator[QAExample]:
    """The examples `rows` build ((row number, builder) pairs). A row whose builder raises
    DataError is an error, or with `skip_bad` left out and recorded in `report`. So is a
    row whose id an earlier row has: a question's id names its GRPO group, its labels and
    its evaluation row, so two questions under one id would be mixed (`source`: the file,
    for that error; `array`: rows are a JSON array's items, named `file[index]` as the
    other errors of such a file are, not by a line)."""
    if report is not None and report.path is None:   # a report of the caller's, unnamed
        report.path = path or source
    own = report if report is not None else SkipReport(path=path)
    first: dict[str, int] = {}
    for row_no, build in rows:
        try:
            example = build()
            if example.id in first:
                earlier = (f"item [{first[example.id] - 1}]" if array
                           else f"row {first[example.id]}")
                where = ({"path": f"{source or path}[{row_no - 1}]"} if array
                         else {"path": source or path, "line": row_no})
                raise DataError(
                    f"duplicate id {example.id!r} ({earlier} has it too): ids "
                    "must be unique within a file (mixing datasets: prefix each one's ids, "
                    "as flashrag:nq+hotpotqa does)", field="id", **where)
            first[example.id] = row_no
            yield example
        except DataError as err:
            if not skip_bad:
                raise
            own.add(row_no, reason_of(err))
    _finish_skips(own, report)


def _finish_skips(report: SkipReport, caller_report: SkipReport | None) -> None:
    # The caller prints its own report; without one, a skip must still not go unnoticed.
    if caller_report is None and report:
        log.warning("%s", report)


def read_qa_jsonl(
    path: str | os.PathLike[str], *, skip_bad: bool = False, report: SkipReport | None = None,
) -> list[QAExample]:
    """Read a FlashRAG JSONL file.

    A malformed line (bad JSON, missing field, wrong type) raises `DataError` naming the
    file, 1-based line and field. With `skip_bad=True` it is skipped instead and recorded in
    `report` (pass a `SkipReport` to print it); blank lines are always ignored.
    """
    return list(iter_qa_jsonl(path, skip_bad=skip_bad, report=report))


def iter_qa_jsonl(
    path: str | os.PathLike[str], *, skip_bad: bool = False, report: SkipReport | None = None,
) -> Iterator[QAExample]:
    """Stream `QAExample`s from FlashRAG JSONL (same rules as `read_qa_jsonl`)."""
    own = report if report is not None else SkipReport()
    # one report for both kinds of bad line (not JSON; not a record), warned about once
    yield from _valid_rows(((n, functools.partial(QAExample.from_dict, obj, path=path, line=n))
                            for n, obj in iter_jsonl(path, skip_bad=skip_bad, report=own)),
                           skip_bad=skip_bad, report=own, path=None, source=str(path))
    _finish_skips(own, report)


def _read_qa_json_array(
    path: Path, *, skip_bad: bool = False, report: SkipReport | None = None,
) -> list[QAExample]:
    """A `.json` file holding one array of records (some exports do that instead of JSONL)."""
    try:
        items = json.loads(path.read_text(encoding="utf-8-sig"),
                           object_pairs_hook=unique_keys)
    except DuplicateKey as e:
        raise DataError(str(e), path=str(path)) from None
    except (ValueError, RecursionError) as e:   # undecodable, invalid, a 4,300-digit number
        raise DataError(f"not a valid JSON array ({e})", path=str(path)) from None
    if not isinstance(items, list):
        raise DataError(f"expected a JSON array of records, got {type(items).__name__}",
                        path=str(path))
    # items have no line numbers: the array index goes into the path, and a skipped item
    # is reported by its 1-based number, like a line
    return list(_valid_rows(((i + 1, functools.partial(QAExample.from_dict, item,
                                                       path=f"{path}[{i}]"))
                             for i, item in enumerate(items)),
                            skip_bad=skip_bad, report=report, path=str(path), array=True))


def _atomic_target(path: str | os.PathLike[str]) -> tuple[Path, Path]:
    # Write beside the target, then rename: a crash never leaves half a dataset behind.
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    return final, final.with_name(f".{final.name}.tmp-{os.getpid()}")


def _to_json(example: QAExample, value: Any) -> str:
    """json.dumps, but a non-serialisable metadata value fails naming the example (a lone
    surrogate in metadata or a prompt too: it would fail later, in the file's encoding)."""
    try:
        text = json.dumps(value, ensure_ascii=False)
        text.encode("utf-8")
        return text
    except (TypeError, ValueError) as e:   # UnicodeEncodeError is a ValueError
        raise DataError(f"example {example.id!r}: not JSON-serialisable ({e})",
                        field="metadata") from None


def write_qa_jsonl(path: str | os.PathLike[str], examples: Iterable[QAExample]) -> Path:
    """Write FlashRAG JSONL (UTF-8, one object per line); returns the path."""
    final, tmp = _atomic_target(path)
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(_to_json(ex, ex.to_dict()) + "\n" for ex in examples)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return final


# ---------------------------------------------------------------------- Search-R1 parquet

# Search-R1's `make_prefix(template_type="base")` (scripts/data_process/nq_search.py), so
# files written here prompt exactly as the released Search-R1 checkpoints were trained.
SEARCH_R1_INSTRUCTION = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new "
    "information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between "
    "<information> and </information>. "
    "You can search as many times as your want. "
    "If you find no further external knowledge needed, you can directly provide the answer "
    "inside <answer> and </answer>, without detailed illustrations. "
    "For example, <answer> Beijing </answer>. Question: {question}\n"
)
_QUESTION_MARKER = "Question: "
_SEARCHR1_COLUMNS = ("data_source", "prompt", "ability", "reward_model", "extra_info")


def _searchr1_schema():
    import pyarrow as pa

    # Explicit, so an empty file still has the right columns and no type is guessed.
    return pa.schema([
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("ability", pa.string()),
        ("reward_model", pa.struct([
            ("style", pa.string()),
            ("ground_truth", pa.struct([("target", pa.list_(pa.string()))])),
        ])),
        ("extra_info", pa.struct([
            ("split", pa.string()),
            ("index", pa.int64()),
            ("id", pa.string()),
            ("question", pa.string()),
            ("metadata", pa.string()),  # JSON: metadata has no fixed schema
        ])),
    ])


def _searchr1_prompt_question(question: str) -> str:
    # As nq_search.py does: strip, and end with "?" (only in the prompt; the raw question
    # is kept in extra_info).
    question = question.strip()
    return question if question.endswith("?") else question + "?"


def write_searchr1_parquet(
    path: str | os.PathLike[str],
    examples: Iterable[QAExample],
    data_source: str = "seekrl",
    *,
    split: str = "train",
    instruction: str = SEARCH_R1_INSTRUCTION,
) -> Path:
    """Write Search-R1 / verl training parquet; returns the path.

    `instruction` is a template with a `{question}` slot (default: Search-R1's own), for
    examples without a prompt of their own; one that has it (`QAExample.prompt`, e.g. read
    from another Search-R1 file) keeps it. `extra_info` also carries the raw question, id
    and metadata (JSON) so the file reads back to the same `QAExample`s.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for index, ex in enumerate(examples):
        rows.append({
            "data_source": data_source,
            "prompt": [{"role": m["role"], "content": m["content"]} for m in ex.prompt]
            if ex.prompt else [{"role": "user", "content": instruction.format(
                question=_searchr1_prompt_question(ex.question))}],
            "ability": "fact-reasoning",
            "reward_model": {"style": "rule",
                             "ground_truth": {"target": list(ex.golden_answers)}},
            "extra_info": {"split": split, "index": index, "id": ex.id,
                           "question": ex.question, "metadata": _to_json(ex, ex.metadata)},
        })
    table = pa.Table.from_pylist(rows, schema=_searchr1_schema())
    final, tmp = _atomic_target(path)
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return final


def _question_from_prompt(prompt: Any) -> str | None:
    """The text after the last "Question: " in the last user message (Search-R1's prompt
    layout; a few-shot template's example questions come before the real one)."""
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, list):
        messages = prompt
    else:
        return None
    for message in reversed(messages):
        if not isinstance(message, Mapping) or message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str) and _QUESTION_MARKER in content:
            return content.rsplit(_QUESTION_MARKER, 1)[1].strip()
        return None
    return None


def _searchr1_record(row: dict[str, Any], row_no: int, path: str, *,
                     prefix_source: bool = False) -> dict[str, Any]:
    """A Search-R1 row (ours or third-party) -> a FlashRAG-style record for `from_dict`."""
    def bad(field_name: str, message: str) -> DataError:
        return DataError(message, path=path, line=row_no, field=field_name)

    extra = row.get("extra_info") or {}
    if not isinstance(extra, Mapping):
        raise bad("extra_info", f"expected a struct, got {_describe(extra)}")

    # Golden answers: reward_model.ground_truth.target, or a FlashRAG column left beside it.
    reward_model = row.get("reward_model")
    if isinstance(reward_model, Mapping):
        ground_truth = reward_model.get("ground_truth")
        if not isinstance(ground_truth, Mapping) or "target" not in ground_truth:
            raise bad("reward_model.ground_truth.target",
                      f"expected {{'target': [answers]}}, got {_describe(ground_truth)}")
        answers = ground_truth["target"]
    elif reward_model is None and row.get("golden_answers") is not None:
        answers = row["golden_answers"]
    else:
        raise bad("reward_model", "expected {'style': 'rule', 'ground_truth': {'target': [...]}}"
                  f", got {_describe(reward_model)}")

    # Question: ours keep it raw in extra_info; Search-R1's own files keep a `question`
    # column (datasets.map keeps source columns); else parse the prompt.
    question = extra.get("question") or row.get("question") or _question_from_prompt(
        row.get("prompt"))
    if question is None:
        raise bad("prompt", f"no question: expected extra_info.question, a question column or "
                  f"a user message containing {_QUESTION_MARKER!r}")

    data_source = row.get("data_source") or "searchr1"
    example_id = extra.get("id") or row.get("id")
    if prefix_source and not extra.get("id") and example_id is not None \
            and not str(example_id).startswith(f"{data_source}-"):
        # a file of several data sets keeps each set's own ids, which restart in every
        # one (Search-R1's merged nq+hotpotqa files: `train_0` twice)
        example_id = f"{data_source}-{example_id}"
    if example_id is None:
        # Third-party rows are identified by (data_source, split, index), as verl does.
        index = extra.get("index")
        index = row_no - 1 if index is None else index
        example_id = f"{data_source}-{extra.get('split') or 'data'}-{index}"

    inner = extra.get("metadata")
    if isinstance(inner, str):  # written by seekrl
        try:
            metadata = json.loads(inner)
        except (ValueError, RecursionError) as e:
            raise bad("extra_info.metadata", f"invalid JSON ({e})") from None
        metadata = {} if metadata is None else metadata
        if not isinstance(metadata, dict):
            raise bad("extra_info.metadata",
                      f"expected a JSON object, got {_describe(metadata)}")
    elif isinstance(inner, Mapping):  # a struct, as other tools write it
        metadata = dict(inner)
        metadata.setdefault("data_source", data_source)
    elif inner is not None:
        raise bad("extra_info.metadata", f"expected an object or its JSON text, got "
                  f"{_describe(inner)}")
    else:  # a `metadata` column: a struct, JSON text, or any other value kept whole
        metadata = _metadata_column(row.get("metadata"))
        metadata.setdefault("data_source", data_source)
    # any other column (a FlashRAG file's `type`, `hops`, `gold_doc_ids`) goes to
    # `from_dict` as a top-level key, which keeps it in metadata; a null cell is not given
    known = {*_SEARCHR1_COLUMNS, "id", "question", "golden_answers", "metadata"}
    extras = {k: v for k, v in row.items() if k not in known and v is not None
              and not (isinstance(v, float) and math.isnan(v))}
    return {**extras, "id": example_id, "question": question, "golden_answers": answers,
            "metadata": metadata, "prompt": row.get("prompt")}


def read_searchr1_parquet(path: str | os.PathLike[str], *, skip_bad: bool = False,
                          report: SkipReport | None = None) -> list[QAExample]:
    """Read a Search-R1 parquet file (written here or by Search-R1's scripts).

    Questions come from `extra_info.question`, a `question` column, or the prompt after
    "Question: "; golden answers from `reward_model.ground_truth.target`. Errors name the
    file, the 1-based row and the field; with `skip_bad=True` a bad row is skipped and
    recorded in `report` instead (a file that is not parquet is still an error).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    path_str = os.fspath(path)
    try:
        parquet = pq.ParquetFile(path_str)
    except pa.ArrowInvalid as e:  # not parquet, or truncated
        raise DataError(f"not a readable parquet file ({e})", path=path_str) from None
    names = set(parquet.schema_arrow.names)
    if "reward_model" not in names and "golden_answers" not in names:
        raise DataError(f"no answers: expected a 'reward_model' column (Search-R1) or "
                        f"'golden_answers'; columns are {sorted(names)}", path=path_str)
    # every column but pandas' index (`__index_level_0__`): none is dropped unread
    wanted = [c for c in parquet.schema_arrow.names if not c.startswith("__")]
    several = "id" in names and "data_source" in names and len(
        parquet.read(columns=["data_source"]).column("data_source").unique()) > 1

    def example(row: dict, row_no: int) -> QAExample:
        return QAExample.from_dict(_searchr1_record(row, row_no, path_str,
                                                    prefix_source=several),
                                   path=path_str, line=row_no)

    # Batches keep memory flat on big training files.
    rows = (row for batch in parquet.iter_batches(columns=wanted) for row in batch.to_pylist())
    return list(_valid_rows(((n, lambda r=row, n=n: example(r, n))
                             for n, row in enumerate(rows, start=1)),
                            skip_bad=skip_bad, report=report, path=path_str))


# -------------------------------------------------------------------- Hugging Face datasets

_DEFAULT_ANSWER_FIELDS = ("golden_answers", "answers", "answer", "possible_answers")
_DEFAULT_METADATA_FIELDS = ("type", "level", "hops", "supporting_facts", "paragraphs")
_HF_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


def _python_list(text: str) -> list | None:
    """The items of a list of string and number literals as Python (a list) or numpy (an
    array: no commas, `['Paris' 'France']`) print it, pandas' text of a list column in a
    CSV; None for anything else. Each literal is read alone: adjacent strings are two
    answers (Python's own parser would join them into one)."""
    skip = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER}
    try:
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(text).readline)
                  if t.type not in skip]
    except (tokenize.TokenError, SyntaxError):
        return None
    if len(tokens) < 2 or tokens[0].string != "[" or tokens[-1].string != "]":
        return None
    items = []
    for t in tokens[1:-1]:
        if t.type in (tokenize.STRING, tokenize.NUMBER):
            try:
                items.append(ast.literal_eval(t.string))
            except (ValueError, SyntaxError):
                return None
        elif t.string != ",":
            return None
    return items


def _answers_from_value(value: Any) -> list[str]:
    """Answer lists from the shapes HF QA datasets use.

    list of str (nq_open), str (hotpot_qa), dict with "text" (squad), "value" + "aliases"
    (trivia_qa), or a list in a string: JSON (PopQA's possible_answers) or a Python list's
    text (a list column saved to CSV by pandas).
    """
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("[") and text.endswith("]"):
            try:
                decoded = json.loads(text)
            except json.JSONDecodeError:
                decoded = None
            if decoded is None:   # a list's text as pandas writes it: "['Paris', 'France']"
                decoded = _python_list(text)
            if isinstance(decoded, list):
                return _answers_from_value(decoded)
        return [value]
    if isinstance(value, Mapping):
        if "value" in value or "aliases" in value:
            found = _answers_from_value(value.get("value") or []) + \
                _answers_from_value(value.get("aliases") or [])
        elif "text" in value:
            found = _answers_from_value(value["text"])
        else:
            raise ValueError(f"expected a dict with 'text', 'value' or 'aliases', "
                             f"got keys {sorted(value)}")
        return list(dict.fromkeys(found))  # aliases repeat the value; keep order
    if isinstance(value, (list, tuple)):
        return list(dict.fromkeys(a for item in value for a in _answers_from_value(item)))
    text = _answer_text(value)
    if text is None:
        raise ValueError(f"expected answers as str, list or dict, got {_describe(value)}")
    return [text]


def _metadata_column(value: Any) -> dict[str, Any]:
    """A `metadata` column as the example's metadata: a struct as it is, an object's JSON
    text (a CSV's, or a parquet written with `metadata` as a string) decoded; any other value
    kept whole under `metadata["metadata"]` (never dropped)."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, str):
        with contextlib.suppress(json.JSONDecodeError):
            decoded = json.loads(value)
            if isinstance(decoded, dict):
                return decoded
    return {"metadata": value}


def _import_datasets():
    try:
        import datasets
    except ImportError:
        raise ImportError("loading Hugging Face datasets needs the `datasets` package "
                          "(`make setup` installs it): pip install datasets") from None
    return datasets


@contextlib.contextmanager
def _offline_if_unreachable(datasets, *, hub: bool):
    """Offline mode for one hub load when the hub is out of reach (`runtime.hub_unreachable`):
    the dataset comes from the local cache or fails at once, instead of after ~30 s of
    retries."""
    if not hub or hub_unreachable() is None:
        yield
        return
    before = datasets.config.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE = before


def load_hf_qa(
    name: str,
    split: str = "train",
    *,
    config: str | None = None,
    question_field: str = "question",
    answers_field: str | None = None,
    id_field: str = "id",
    metadata_fields: Iterable[str] = _DEFAULT_METADATA_FIELDS,
    data_files: Any = None,
    skip_bad: bool = False,
    report: SkipReport | None = None,
    **load_kwargs: Any,
) -> list[QAExample]:
    """Load QA examples with `datasets.load_dataset`.

    `name` is a hub id (e.g. "RUC-NLPIR/FlashRAG_datasets" with `config="hotpotqa"`), a
    builder name with `data_files` (e.g. "json"), a local directory, or a local .json /
    .jsonl / .parquet / .csv file. `answers_field=None` tries golden_answers, answers,
    answer, possible_answers in turn. Rows without an `id_field` get `"{split}-{row}"`.
    A `metadata` column is kept, plus any of `metadata_fields` present.
    """
    datasets = _import_datasets()
    builder = name
    local = Path(name)
    if data_files is None and local.is_file():
        if local.suffix.lower() not in _HF_BUILDERS:
            raise DataError(f"unknown file type {local.suffix!r}; expected one of "
                            f"{sorted(_HF_BUILDERS)}", path=name)
        builder, data_files = _HF_BUILDERS[local.suffix.lower()], {split: str(local)}
    if data_files is None and _saved_to_disk(local):
        dataset = _load_saved(datasets, local, split)
    else:
        try:
            with _offline_if_unreachable(datasets, hub=data_files is None and not local.exists()):
                dataset = datasets.load_dataset(builder, config, split=split,
                                                data_files=data_files, **load_kwargs)
        except (OSError, ValueError) as err:    # no network, no such dataset / split
            first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            hint = ("; offline, FlashRAG sets read $SEEKRL_FLASHRAG_DIR (a local mirror)"
                    if isinstance(err, OSError) else "")
            raise DataError(f"cannot load {split!r} ({type(err).__name__}: {first}){hint}",
                            path=name if config is None else f"{name}:{config}") from None

    source = f"{name}[{split}]"  # where errors point: dataset and split, then the row
    columns = list(dataset.column_names)
    if question_field not in columns:
        raise DataError(f"no question column; columns are {columns}", path=source,
                        field=question_field)
    if answers_field is None:
        answers_field = next((c for c in _DEFAULT_ANSWER_FIELDS if c in columns), None)
        if answers_field is None:
            raise DataError(f"no answers column: tried {list(_DEFAULT_ANSWER_FIELDS)}; "
                            f"columns are {columns}; pass answers_field=", path=source)
    elif answers_field not in columns:
        raise DataError(f"no such column; columns are {columns}", path=source,
                        field=answers_field)
    keep = [c for c in metadata_fields if c in columns]

    def example(row: dict, row_no: int) -> QAExample:
        try:
            answers = _answers_from_value(row[answers_field])
        except ValueError as e:
            raise DataError(str(e), path=source, line=row_no, field=answers_field) from None
        metadata = _metadata_column(row.get("metadata"))
        metadata.update({c: row[c] for c in keep})
        row_id = row.get(id_field)
        record = {
            "id": row_id if row_id not in (None, "") else f"{split}-{row_no - 1}",
            "question": row[question_field],
            "golden_answers": answers,
            "metadata": metadata,
        }
        return QAExample.from_dict(record, path=source, line=row_no)

    return list(_valid_rows(((n, lambda r=row, n=n: example(r, n))
                             for n, row in enumerate(dataset, start=1)),
                            skip_bad=skip_bad, report=report, path=source))


def _saved_to_disk(path: Path) -> bool:
    """A folder written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk`."""
    return path.is_dir() and any((path / f).is_file() for f in
                                 ("dataset_dict.json", "state.json", "dataset_info.json"))


def _load_saved(datasets, path: Path, split: str):
    saved = datasets.load_from_disk(str(path))
    if isinstance(saved, datasets.DatasetDict):
        if split not in saved:
            raise DataError(f"no split {split!r}; the saved dataset has {sorted(saved)}",
                            path=str(path))
        return saved[split]
    return saved   # a single Dataset: it is the split


# ----------------------------------------------------------------------------- dispatch

_SPLIT_FILE_SUFFIXES = (".jsonl", ".json", ".parquet")


def load_qa(path_or_name: str | os.PathLike[str], split: str | None = None,
            **kw: Any) -> list[QAExample]:
    """Load QA examples from a file, a FlashRAG-style folder or a Hugging Face dataset.

    - `.jsonl` / `.json` -> FlashRAG (`read_qa_jsonl`; a `.json` holding an array also works)
    - `.parquet` -> Search-R1 (`read_searchr1_parquet`)
    - a folder with `{split}.jsonl|.json|.parquet` inside (FlashRAG's layout) -> that file;
      `FOLDER:SPLIT` says which, and without a split the first of test, dev, validation,
      val, train that is there
    - `hf:NAME[:CONFIG]:SPLIT` -> `load_hf_qa(NAME, SPLIT, config=CONFIG)`
    - `flashrag:NAME[+NAME...][:SPLIT]` -> the standard suite (`seekrl.data.benchmarks`)
    - anything else -> `load_hf_qa(path_or_name, split or "train", **kw)`

    `kw` goes to the chosen reader (e.g. `skip_bad=True` for JSONL, `config=` for HF).
    A path with one of the suffixes above that does not exist raises FileNotFoundError.
    """
    spec = os.fspath(path_or_name)
    if spec.startswith("hf:"):
        name, config, hf_split = parse_hf_spec(spec)
        return load_hf_qa(name, hf_split, config=config, **kw)
    if spec.startswith("flashrag:"):
        return _load_flashrag(spec, split, **kw)
    path = Path(spec)
    folder, _, named = spec.rpartition(":")
    if not path.exists() and folder and Path(folder).is_dir():      # FOLDER:SPLIT
        path = _split_file(Path(folder), named)
        if path is None:
            raise FileNotFoundError(f"{folder}: no {named}.jsonl, {named}.json or "
                                    f"{named}.parquet inside")
    elif path.is_dir() and not _saved_to_disk(path):
        # FlashRAG's layout; a folder of other files (CSV) goes to `datasets` (below)
        picked = split if split is not None else folder_split(path)
        path = (_split_file(path, picked) if picked is not None else None) or \
            _only_qa_file(path, split)
    suffix = path.suffix.lower()
    if suffix in _SPLIT_FILE_SUFFIXES and not path.is_file():
        raise FileNotFoundError(f"{path}: no such QA file")
    if suffix == ".jsonl":
        return read_qa_jsonl(path, **kw)
    if suffix == ".json":
        if _starts_with_bracket(path):
            return _read_qa_json_array(path, **kw)
        try:
            return read_qa_jsonl(path, **kw)
        except DataError:   # only then: is the file one object rather than JSONL?
            _refuse_one_object(path)
            raise
    if suffix == ".parquet":
        return read_searchr1_parquet(path, **kw)
    if not path.exists() and suffix and _meant_as_file(path, suffix):
        close = difflib.get_close_matches(suffix, _SPLIT_FILE_SUFFIXES, n=1, cutoff=0.6)
        raise FileNotFoundError(
            f"{spec}: no such QA file; QA files end in .jsonl, .json or .parquet"
            + (f" (did you mean {path.with_suffix(close[0]).name}?)" if close else ""))
    if not path.exists() and hop_class(spec) is not None:
        raise FileNotFoundError(f"{spec}: no such file or folder; for the FlashRAG set write "
                                f"flashrag:{spec}, for a hub dataset hf:NAME[:CONFIG]:SPLIT")
    return load_hf_qa(spec, split or "train", **kw)


def _only_qa_file(folder: Path, split: str | None) -> Path:
    """A folder without a file of the split: its one QA file when no split was named, read
    by seekrl's readers (their errors name the file and line; `datasets`' do not); the
    folder itself when it holds no QA file; otherwise a FileNotFoundError listing them."""
    files = sorted(p for p in folder.iterdir()
                   if p.is_file() and p.suffix.lower() in _SPLIT_FILE_SUFFIXES)
    if not files:
        return folder
    if split is None and len(files) == 1:
        return files[0]
    wanted = f"no {split}.jsonl, {split}.json or {split}.parquet" if split is not None else \
        f"no {', '.join(FOLDER_SPLITS)} file and {len(files)} QA files"
    raise FileNotFoundError(f"{folder}: {wanted}; it has {[p.name for p in files][:8]}: name "
                            "the file, or FOLDER:SPLIT for FOLDER/SPLIT.jsonl")


def _meant_as_file(path: Path, suffix: str) -> bool:
    """A spec that names a missing file rather than a hub dataset: its suffix is close to a
    QA file's (`.jsnol`) or a text format's, or its folder is here."""
    if difflib.get_close_matches(suffix, _SPLIT_FILE_SUFFIXES, n=1, cutoff=0.6):
        return True
    if suffix in (".csv", ".tsv", ".txt", ".gz", ".arrow"):
        return True
    return str(path.parent) not in ("", ".") and path.parent.is_dir()


FOLDER_SPLITS = ("test", "dev", "validation", "val", "train")   # a folder's, in this order


def folder_split(folder: str | Path) -> str | None:
    """The split a FlashRAG-style folder is read from when none is named: the first of
    `FOLDER_SPLITS` it has a file of (None: none)."""
    return next((s for s in FOLDER_SPLITS if _split_file(Path(folder), s) is not None), None)


def _split_file(folder: Path, split: str) -> Path | None:
    """`FOLDER/SPLIT.jsonl` (or .json, .parquet), as FlashRAG lays a data set out."""
    return next((folder / f"{split}{x}" for x in _SPLIT_FILE_SUFFIXES
                 if (folder / f"{split}{x}").is_file()), None)


def _load_flashrag(spec: str, split: str | None, **kw: Any) -> list[QAExample]:
    """The suite's sets from `$SEEKRL_FLASHRAG_DIR` (offline) or the hub; with several sets
    the ids get a `NAME-` prefix and `metadata["source"]` says which set a question is from."""
    entries, named = parse_flashrag_spec(spec)
    split = named or split
    local = flashrag_dir()
    out: list[QAExample] = []
    for entry in entries:
        which = split or entry.eval_split
        if local is not None:
            folder = local / entry.name
            if not folder.is_dir():
                raise FileNotFoundError(f"{spec}: $SEEKRL_FLASHRAG_DIR is {local} but it has "
                                        f"no {entry.name}/ folder")
            if not _saved_to_disk(folder) and _split_file(folder, which) is None:
                raise FileNotFoundError(
                    f"{spec}: {folder} has no {which}.jsonl, {which}.json or {which}.parquet "
                    f"(split {which!r}); it has "
                    f"{sorted(p.name for p in folder.iterdir())[:8] or 'nothing'}")
            examples = load_qa(folder, which, **kw)
        else:
            examples = load_hf_qa(FLASHRAG_HUB, which, config=entry.name, **kw)
        if len(entries) > 1:
            for ex in examples:
                ex.id = f"{entry.name}-{ex.id}"
                ex.metadata.setdefault("source", entry.name)
        out.extend(examples)
    return out


def _refuse_one_object(path: Path, max_bytes: int = 1 << 28) -> None:
    """A .json file that is one object (`{"data": [...]}`, SQuAD's `{"version", "data"}`)
    rather than JSONL or an array: said as such, with its keys, instead of an error about
    line 1's missing `id`."""
    if path.stat().st_size > max_bytes:
        return
    try:
        whole = json.loads(path.read_text(encoding="utf-8-sig"))
    except (ValueError, UnicodeDecodeError):
        return   # JSONL (several values) or broken: the JSONL reader names the line
    if isinstance(whole, dict) and "question" not in whole:
        lists = [k for k, v in whole.items() if isinstance(v, list)]
        hint = (f"; the questions in {lists[0]!r}? write them out as JSONL or an array"
                if lists else "")
        raise DataError(f"one JSON object with keys {sorted(whole)[:8]}: expected a JSON "
                        f"array of questions or JSONL (one question object a line){hint}",
                        path=str(path))


def _starts_with_bracket(path: Path) -> bool:
    """Whether the first non-blank character is "[" (a JSON array rather than JSONL)."""
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(4096), b""):
            stripped = chunk.lstrip().removeprefix(b"\xef\xbb\xbf").lstrip()
            if stripped:
                return stripped.startswith(b"[")
    return False

