"""The standard QA suite of the agentic-search papers, and data specs that name it.

Search-R1, ProRAG, StepSearch and most of their successors report EM on seven sets, in the
FlashRAG collection's names and splits: three single-hop (NQ, TriviaQA, PopQA) and four
multi-hop (HotpotQA, 2WikiMultiHopQA, MuSiQue, Bamboogle), on `test` where the set has one
and `dev` otherwise. Search-R1 trains on NQ + HotpotQA `train`.

A data spec (`--data`, `data:` in a config) is one of:

- a file (`.jsonl` / `.json` FlashRAG lines, `.parquet` Search-R1 rows), or a FlashRAG
  dataset folder (`nq/` holding `test.jsonl`, ...), optionally `FOLDER:SPLIT`;
- `hf:NAME[:CONFIG]:SPLIT`: `datasets.load_dataset(NAME, CONFIG, split=SPLIT)`, where NAME
  may also be a folder written by `Dataset.save_to_disk` (loaded offline);
- `flashrag:NAME[+NAME...][:SPLIT]`: sets of the standard suite by name (`nq`, `2wiki`, ...);
  `flashrag:nq+hotpotqa:train` is Search-R1's training mix. They load from the folder in
  `$SEEKRL_FLASHRAG_DIR` (FlashRAG's layout, `NAME/SPLIT.jsonl`) when it is set, else from
  the hub (`RUC-NLPIR/FlashRAG_datasets`).

Supporting facts become `metadata["supporting_titles"]` (HotpotQA and 2Wiki
`supporting_facts`, MuSiQue `paragraphs[].is_supporting`), so evidence recall and the
`evidence` step reward work on real data by title. The distractor passages those records
carry (`context`, `paragraphs`) are dropped once the titles are taken: seekrl retrieves from
a corpus, and every trajectory copies its question's metadata.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seekrl.errors import DataError

__all__ = ["BENCHMARKS", "FLASHRAG_HUB", "Benchmark", "benchmark", "flashrag_dir",
           "hop_averages", "hop_class", "parse_hf_spec", "spec_name", "supporting_titles"]

FLASHRAG_HUB = "RUC-NLPIR/FlashRAG_datasets"
FLASHRAG_DIR_ENV = "SEEKRL_FLASHRAG_DIR"


@dataclass(frozen=True)
class Benchmark:
    name: str          # FlashRAG's config / folder name
    eval_split: str    # the split the papers report
    hops: str          # "single" | "multi"


BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in (
    Benchmark("nq", "test", "single"),
    Benchmark("triviaqa", "test", "single"),
    Benchmark("popqa", "test", "single"),
    Benchmark("hotpotqa", "dev", "multi"),
    Benchmark("2wikimultihopqa", "dev", "multi"),
    Benchmark("musique", "dev", "multi"),
    Benchmark("bamboogle", "test", "multi"),
)}
_ALIASES = {"2wiki": "2wikimultihopqa", "2wikimqa": "2wikimultihopqa", "trivia_qa": "triviaqa",
            "natural_questions": "nq", "hotpot_qa": "hotpotqa", "nq_open": "nq"}


def benchmark(name: str) -> Benchmark:
    """The suite entry for a name or alias (case-insensitive); a DataError listing the names
    otherwise."""
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in BENCHMARKS:
        raise DataError(f"unknown benchmark {name!r}; expected one of "
                        f"{', '.join(BENCHMARKS)} (or 2wiki)", field="flashrag")
    return BENCHMARKS[key]


def hop_class(dataset: str) -> str | None:
    """"single" / "multi" for a data set of the standard suite (by its table name), else None."""
    key = _ALIASES.get(dataset.lower(), dataset.lower())
    entry = BENCHMARKS.get(key)
    return entry.hops if entry else None


def hop_averages(datasets: dict[str, dict], keys: Sequence[str] = ("em", "f1")
                 ) -> dict[str, dict]:
    """Macro means over the single-hop and the multi-hop sets of the standard suite (NQ,
    TriviaQA, PopQA | HotpotQA, 2Wiki, MuSiQue, Bamboogle), as the Search-R1 tables average
    them; {} when no data set belongs to the suite."""
    classes: dict[str, list[dict]] = {}
    for name, row in datasets.items():
        hop = hop_class(name)
        if hop is not None:
            classes.setdefault(hop, []).append(row)

    def mean(values: list) -> float | None:
        vals = [v for v in values if v is not None]
        return sum(vals) / len(vals) if vals else None

    return {hop: {"datasets": len(rows), **{k: mean([r.get(k) for r in rows]) for k in keys}}
            for hop, rows in sorted(classes.items(), key=lambda kv: kv[0] != "single")}


def flashrag_dir() -> Path | None:
    value = os.environ.get(FLASHRAG_DIR_ENV)
    return Path(value) if value else None


def parse_hf_spec(spec: str) -> tuple[str, str | None, str]:
    """`hf:NAME[:CONFIG]:SPLIT` -> (NAME, CONFIG or None, SPLIT)."""
    body = spec[len("hf:"):] if spec.startswith("hf:") else spec
    parts = body.split(":")
    if len(parts) == 2 and all(parts):
        return parts[0], None, parts[1]
    if len(parts) == 3 and parts[0] and parts[2]:
        return parts[0], parts[1] or None, parts[2]
    raise DataError(f"expected hf:NAME:SPLIT or hf:NAME:CONFIG:SPLIT "
                    f"(e.g. hf:{FLASHRAG_HUB}:hotpotqa:dev), got {spec!r}", field="data")


def parse_flashrag_spec(spec: str) -> tuple[list[Benchmark], str | None]:
    """`flashrag:NAME[+NAME...][:SPLIT]` -> (suite entries, SPLIT or None = each one's
    evaluation split)."""
    body = spec[len("flashrag:"):]
    names, _, split = body.partition(":")
    parts = [n.strip() for n in names.split("+")]
    if not any(parts) or not all(parts) or ":" in split:
        raise DataError(f"expected flashrag:NAME[+NAME...][:SPLIT] with NAME from "
                        f"{', '.join(BENCHMARKS)} and SPLIT a split's name, got {spec!r}",
                        field="data")
    entries = [benchmark(n) for n in parts]
    seen: dict[str, str] = {}
    for given, entry in zip(parts, entries):
        if entry.name in seen:   # its questions twice, under one id each time
            raise DataError(f"{spec!r} names {entry.name} twice ({seen[entry.name]!r} and "
                            f"{given!r})", field="data")
        seen[entry.name] = given
    return entries, split.strip() or None


def spec_name(spec: str) -> str | None:
    """The table name of a `hf:` / `flashrag:` spec (None for paths): the FlashRAG set's
    name, or the hub config, or the dataset's last path part; see `split_name`."""
    if spec.startswith("flashrag:"):
        entries, split = parse_flashrag_spec(spec)
        return split_name("+".join(e.name for e in entries), split)
    if spec.startswith("hf:"):
        name, config, split = parse_hf_spec(spec)
        return split_name(config or Path(name.rstrip("/")).name, split)
    return None


def split_name(name: str, split: str | None) -> str:
    """A suite set read from another split than the one the papers report is named apart
    (`hotpotqa-train`), so its scores never pass for the reported ones in the tables and
    the hop averages; other names stay as they are."""
    entry = BENCHMARKS.get(_ALIASES.get(name.lower(), name.lower()))
    if entry is None:
        return name
    if split is None or split == entry.eval_split:
        return entry.name
    return f"{entry.name}-{split}"


def _titles_from_facts(facts: Any) -> list[str]:
    """HotpotQA / 2Wiki supporting facts: `{"title": [...], "sent_id": [...]}` (the HF and
    FlashRAG shape) or `[[title, sentence], ...]` (the original JSON). A title that is not
    text raises ValueError naming where it is (the caller adds the file and line)."""
    if isinstance(facts, Mapping):
        titles = facts.get("title") or []
        if isinstance(titles, str):   # one fact: one title, not its letters
            titles = [titles]
        if not isinstance(titles, (list, tuple)):
            raise ValueError(f"supporting_facts.title: expected a list of titles, got "
                             f"{type(titles).__name__}")
        where = "supporting_facts.title[{}]"
    elif isinstance(facts, (list, tuple)):
        titles = [f[0] if isinstance(f, (list, tuple)) and f else f for f in facts]
        where = "supporting_facts[{}][0]"
    else:
        return []
    for i, title in enumerate(titles):
        if not isinstance(title, str):
            raise ValueError(f"{where.format(i)}: expected a title (a string), got "
                             f"{type(title).__name__} {title!r:.60}")
    return list(titles)


def supporting_titles(metadata: Mapping[str, Any]) -> list[str]:
    """The titles of a question's supporting passages, in order, each once ([] if none)."""
    titles = _titles_from_facts(metadata.get("supporting_facts"))
    paragraphs = metadata.get("paragraphs")
    if not titles and isinstance(paragraphs, (list, tuple)):   # MuSiQue
        titles = [p["title"] for p in paragraphs if isinstance(p, Mapping)
                  and p.get("is_supporting") and isinstance(p.get("title"), str)]
    return list(dict.fromkeys(titles))


def with_supporting_titles(metadata: dict[str, Any]) -> dict[str, Any]:
    """`metadata` with `supporting_titles` filled from the record's supporting facts and the
    distractor passages (`context`, `paragraphs`) dropped once their titles are taken."""
    if "supporting_titles" in metadata and metadata["supporting_titles"] is None:
        # a parquet struct or an HF dataset fills a key some rows lack with null: none given
        metadata = {k: v for k, v in metadata.items() if k != "supporting_titles"}
    if "supporting_titles" in metadata:   # one title given as text is one title, not letters
        given = metadata["supporting_titles"]
        if isinstance(given, str):
            return {**metadata, "supporting_titles": [given]}
        if not isinstance(given, (list, tuple)) or not all(isinstance(t, str) for t in given):
            raise ValueError(f"supporting_titles: expected a list of titles (strings), got "
                             f"{type(given).__name__} {given!r:.60}")
        return metadata
    titles = supporting_titles(metadata)
    if not titles:
        return metadata
    out = {k: v for k, v in metadata.items() if k not in ("context", "paragraphs")}
    out["supporting_titles"] = titles
    return out
