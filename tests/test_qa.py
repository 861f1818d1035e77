"""QA data: FlashRAG JSONL, Search-R1 parquet, HF loading, dispatch, and bad input."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seekrl.data.jsonl import SkipReport, iter_jsonl
from seekrl.data.qa import (
    SEARCH_R1_INSTRUCTION,
    QAExample,
    _answers_from_value,
    load_hf_qa,
    load_qa,
    read_qa_jsonl,
    read_searchr1_parquet,
    write_qa_jsonl,
    write_searchr1_parquet,
)
from seekrl.errors import DataError

HAVE_DATASETS = importlib.util.find_spec("datasets") is not None

EXAMPLES = [
    QAExample("q1", "Who wrote Hamlet?", ["William Shakespeare", "Shakespeare"]),
    QAExample("q2", "Où est la tour Eiffel ?", ["Paris"],
              {"type": "bridge", "gold_doc_ids": ["d1", "d2"], "hops": 2, "nested": {"x": [1]}}),
    QAExample("3", "In what year did it end", ["1945"], {"level": None}),
]


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


GOOD = json.dumps({"id": "ok", "question": "Q?", "golden_answers": ["A"]})
GOOD2 = json.dumps({"id": "ok2", "question": "Q2?", "golden_answers": ["B"]})


# ------------------------------------------------------------------------------- from_dict

def test_from_dict_is_lenient_where_files_differ_harmlessly() -> None:
    ex = QAExample.from_dict({"id": 7, "question": "Q?", "golden_answers": "A",
                              "extra": 1, "metadata": {"type": "bridge"}})
    assert ex == QAExample("7", "Q?", ["A"], {"extra": 1, "type": "bridge"})
    assert QAExample.from_dict({"id": "x", "question": "Q", "golden_answers": [1984]}
                               ).golden_answers == ["1984"]
    assert QAExample.from_dict(ex.to_dict()) == ex


@pytest.mark.parametrize(
    ("record", "field"),
    [
        ({"id": "x", "golden_answers": ["A"]}, "question"),
        ({"id": "x", "question": "Q"}, "golden_answers"),
        ({"question": "Q", "golden_answers": ["A"]}, "id"),
        ({"id": "x", "question": 3, "golden_answers": ["A"]}, "question"),
        ({"id": "x", "question": "  ", "golden_answers": ["A"]}, "question"),
        ({"id": "x", "question": "Q", "golden_answers": []}, "golden_answers"),
        ({"id": "x", "question": "Q", "golden_answers": {"a": 1}}, "golden_answers"),
        ({"id": "x", "question": "Q", "golden_answers": ["A", None]}, "golden_answers[1]"),
        ({"id": True, "question": "Q", "golden_answers": ["A"]}, "id"),
        ({"id": "x", "question": "Q", "golden_answers": ["A"], "metadata": [1]}, "metadata"),
        ({"id": " ", "question": "Q", "golden_answers": ["A"]}, "id"),
        # JSON's NaN / Infinity (Python writes them for a float NaN) are no answers
        ({"id": "x", "question": "Q", "golden_answers": [float("nan")]}, "golden_answers[0]"),
        ({"id": "x", "question": "Q", "golden_answers": ["A", float("inf")]},
         "golden_answers[1]"),
        # a lone surrogate (a "\\ud800" escape) loads, then fails the first write
        ({"id": "x", "question": "Q\ud800?", "golden_answers": ["A"]}, "question"),
        ({"id": "x", "question": "Q", "golden_answers": ["A", "\udfff"]}, "golden_answers[1]"),
        ({"id": "\ud800", "question": "Q", "golden_answers": ["A"]}, "id"),
        # supporting titles are titles: not letters, not numbers, not dropped
        ({"id": "x", "question": "Q", "golden_answers": ["A"],
          "metadata": {"supporting_titles": [1, None]}}, "metadata.supporting_titles"),
        ({"id": "x", "question": "Q", "golden_answers": ["A"],
          "supporting_facts": [["A", 0], [1, 0]]}, "metadata.supporting_facts[1][0]"),
        ({"id": "x", "question": "Q", "golden_answers": ["A"],
          "supporting_facts": {"title": ["A", None]}}, "metadata.supporting_facts.title[1]"),
    ],
)
def test_from_dict_names_path_line_and_field(record: dict, field: str) -> None:
    with pytest.raises(DataError) as info:
        QAExample.from_dict(record, path="data/nq.jsonl", line=12)
    err = info.value
    assert (err.path, err.line, err.field) == ("data/nq.jsonl", 12, field)
    assert str(err).startswith(f"data/nq.jsonl:12: field '{field}': ")


# ----------------------------------------------------------------------------------- JSONL

def test_jsonl_round_trip(tmp_path: Path) -> None:
    path = write_qa_jsonl(tmp_path / "sub" / "qa.jsonl", EXAMPLES)
    assert read_qa_jsonl(path) == EXAMPLES
    assert "Où est" in path.read_text(encoding="utf-8")  # UTF-8, not \u escapes
    assert [p.name for p in path.parent.iterdir()] == ["qa.jsonl"]  # no temp file left


def test_golden_answers_as_string_and_blank_lines(tmp_path: Path) -> None:
    path = _write_lines(tmp_path / "qa.jsonl", [
        "", json.dumps({"id": 1, "question": "Q?", "golden_answers": "A"}), "   ", GOOD, ""])
    assert read_qa_jsonl(path) == [QAExample("1", "Q?", ["A"]), QAExample("ok", "Q?", ["A"])]


@pytest.mark.parametrize(
    ("bad_line", "field", "words"),
    [
        ('{"id": "x", "question": "Q"', None, "invalid JSON"),
        ('["not", "an", "object"]', None, "expected a JSON object"),
        ('{"id": "x", "golden_answers": ["A"]}', "question", "missing"),
        ('{"id": "x", "question": "Q", "golden_answers": 5}', "golden_answers", "expected"),
        # plain json.loads keeps the second value: the first answer was lost unsaid
        ('{"id": "x", "question": "Q", "golden_answers": ["a"], "golden_answers": ["b"]}',
         None, "key 'golden_answers' given twice"),
        ('{"id": "x", "question": "Q", "golden_answers": ["a"], "metadata": '
         '{"hops": 1, "hops": 2}}', None, "key 'hops' given twice"),
    ],
)
def test_malformed_line_names_file_line_and_field(
    tmp_path: Path, bad_line: str, field: str | None, words: str,
) -> None:
    path = _write_lines(tmp_path / "qa.jsonl", [GOOD, "", bad_line, GOOD])
    with pytest.raises(DataError) as info:
        read_qa_jsonl(path)
    message = str(info.value)
    assert message.startswith(f"{path}:3: ")  # blank lines still count as lines
    assert words in message
    assert info.value.field == field
    if field:
        assert f"field '{field}'" in message


def test_invalid_utf8_is_blamed_on_its_line(tmp_path: Path) -> None:
    path = tmp_path / "qa.jsonl"
    path.write_bytes(GOOD.encode() + b"\n" + b'{"id": "\xff"}\n')
    with pytest.raises(DataError, match=r"qa\.jsonl:2: not valid UTF-8"):
        read_qa_jsonl(path)


def test_byte_order_mark_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "qa.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD.encode() + b"\n")
    assert read_qa_jsonl(path) == [QAExample("ok", "Q?", ["A"])]


def test_skip_bad_counts_and_reports(tmp_path: Path) -> None:
    path = _write_lines(tmp_path / "qa.jsonl", [
        GOOD, "{oops", "", '{"id": "x"}', "[1]", GOOD2,
        '{"id": "y", "question": "Q", "golden_answers": [null]}'])
    report = SkipReport()
    examples = read_qa_jsonl(path, skip_bad=True, report=report)
    assert len(examples) == 2
    assert report.count == 4
    assert [line for line, _ in report.skipped] == [2, 4, 5, 7]
    assert "missing required field" in report.skipped[1][1]
    text = str(report)
    assert f"skipped 4 bad line(s) in {path}" in text and "line 7:" in text


def test_a_duplicate_id_is_refused_naming_both_rows(tmp_path: Path) -> None:
    """A question's id names its GRPO group, its labels and its evaluation row: two
    questions under one id (FlashRAG numbers each split's ids from 0, so two datasets
    concatenated share them) would be mixed. Refused, or skipped and reported."""
    other = json.dumps({"id": "ok", "question": "Another?", "golden_answers": ["B"]})
    path = _write_lines(tmp_path / "qa.jsonl", [GOOD, GOOD2, other])
    with pytest.raises(DataError, match=r"qa.jsonl:3: field 'id': duplicate id 'ok' \(row 1 "
                                        r"has it too\)"):
        read_qa_jsonl(path)
    report = SkipReport()
    assert [e.id for e in read_qa_jsonl(path, skip_bad=True, report=report)] == ["ok", "ok2"]
    assert [n for n, _ in report.skipped] == [3]
    array = tmp_path / "array.json"
    array.write_text(json.dumps([json.loads(GOOD), json.loads(other)]), encoding="utf-8")
    with pytest.raises(DataError, match="duplicate id 'ok'"):
        load_qa(array)


def test_skip_report_caps_reasons(tmp_path: Path) -> None:
    path = _write_lines(tmp_path / "qa.jsonl", ["junk"] * 30)
    report = SkipReport(max_kept=5)
    assert read_qa_jsonl(path, skip_bad=True, report=report) == []
    assert report.count == 30 and len(report.skipped) == 5
    assert "and 25 more" in str(report)


def test_skip_bad_without_report_logs_a_warning(tmp_path: Path, caplog) -> None:
    path = _write_lines(tmp_path / "qa.jsonl", [GOOD, "junk"])
    with caplog.at_level(logging.WARNING, logger="seekrl"):
        assert len(read_qa_jsonl(path, skip_bad=True)) == 1
    assert "skipped 1 bad line(s)" in caplog.text


def test_iter_jsonl_streams(tmp_path: Path) -> None:
    path = _write_lines(tmp_path / "c.jsonl", ['{"a": 1}', "", '{"a": 2}', "junk"])
    rows = iter_jsonl(path)
    assert next(rows) == (1, {"a": 1})  # nothing past line 1 has been parsed yet
    assert next(rows) == (3, {"a": 2})
    with pytest.raises(DataError, match=r"c\.jsonl:4: invalid JSON"):
        next(rows)


# ----------------------------------------------------------------------- Search-R1 parquet

def _without_prompts(examples):
    """A Search-R1 parquet carries each question's prompt; the JSONL examples do not."""
    return [dataclasses.replace(ex, prompt=None) for ex in examples]


def test_parquet_round_trip(tmp_path: Path) -> None:
    path = write_searchr1_parquet(tmp_path / "train.parquet", EXAMPLES)
    back = read_searchr1_parquet(path)
    # the file's own prompt comes back with each question (`prompt: data` plays it)
    assert _without_prompts(back) == EXAMPLES
    assert back[0].prompt == [{"role": "user", "content": SEARCH_R1_INSTRUCTION.format(
        question="Who wrote Hamlet?")}]
    # an example's own prompt is written as it is (it became the default instruction)
    own = [{"role": "system", "content": "SYS"}, {"role": "user", "content": "custom: Hamlet?"}]
    again = write_searchr1_parquet(tmp_path / "again.parquet",
                                   [dataclasses.replace(back[0], prompt=own), *back[1:]])
    reread = read_searchr1_parquet(again)
    assert reread[0].prompt == own and reread[1:] == back[1:]


def test_parquet_has_search_r1_shape(tmp_path: Path) -> None:
    path = write_searchr1_parquet(tmp_path / "t.parquet", EXAMPLES, data_source="hotpotqa",
                                  split="test")
    table = pq.read_table(path)
    assert table.column_names == ["data_source", "prompt", "ability", "reward_model",
                                  "extra_info"]
    first, third = table.to_pylist()[0], table.to_pylist()[2]
    assert first["data_source"] == "hotpotqa"
    assert first["ability"] == "fact-reasoning"
    assert first["reward_model"] == {
        "style": "rule", "ground_truth": {"target": ["William Shakespeare", "Shakespeare"]}}
    assert first["prompt"] == [{
        "role": "user", "content": SEARCH_R1_INSTRUCTION.format(question="Who wrote Hamlet?")}]
    assert first["prompt"][0]["content"].startswith("Answer the given question. You must")
    assert first["prompt"][0]["content"].endswith("Question: Who wrote Hamlet?\n")
    # Search-R1 ends the prompt's question with "?"; the raw question stays in extra_info.
    assert third["prompt"][0]["content"].endswith("Question: In what year did it end?\n")
    assert third["extra_info"]["question"] == "In what year did it end"
    assert (third["extra_info"]["split"], third["extra_info"]["index"]) == ("test", 2)


def _search_r1_style_table(*, with_question_column: bool, with_id: bool) -> pa.Table:
    """Rows as Search-R1's nq_search.py writes them (datasets.map keeps source columns)."""
    rows = []
    for i, (q, answers) in enumerate([("who got the first nobel prize in physics?",
                                       ["Wilhelm Conrad Röntgen"]),
                                      ("when is the next deadpool movie being released?",
                                       ["May 18, 2018"])]):
        row = {
            "data_source": "nq",
            "prompt": [{"role": "user", "content": SEARCH_R1_INSTRUCTION.format(question=q)}],
            "ability": "fact-reasoning",
            "reward_model": {"style": "rule", "ground_truth": {"target": answers}},
            "extra_info": {"split": "train", "index": i},
        }
        if with_id:
            row["id"] = f"train_{i}"
        if with_question_column:
            row["question"] = q
            row["golden_answers"] = answers
        rows.append(row)
    return pa.Table.from_pylist(rows)


@pytest.mark.parametrize("with_question_column", [True, False])
def test_reads_third_party_search_r1_parquet(tmp_path: Path, with_question_column: bool) -> None:
    path = tmp_path / "nq.parquet"
    pq.write_table(_search_r1_style_table(with_question_column=with_question_column,
                                          with_id=with_question_column), path)
    first, second = read_searchr1_parquet(path)
    # The question comes from the column or, failing that, from after "Question: ".
    assert first.question == "who got the first nobel prize in physics?"
    assert second.golden_answers == ["May 18, 2018"]
    assert first.metadata["data_source"] == "nq"
    assert second.id == ("train_1" if with_question_column else "nq-train-1")


def test_the_question_is_read_after_the_prompts_last_question_marker(tmp_path: Path) -> None:
    """A few-shot template shows example questions before the real one: the text after
    the first "Question: " was an example's."""
    few_shot = ("Question: What is 2+2?\nAnswer: 4\n\nQuestion: Who wrote Hamlet?\n")
    path = tmp_path / "fs.parquet"
    pq.write_table(pa.Table.from_pylist([{
        "data_source": "nq", "prompt": [{"role": "user", "content": few_shot}],
        "reward_model": {"style": "rule", "ground_truth": {"target": ["Shakespeare"]}},
        "extra_info": {"split": "test", "index": 0}}]), path)
    assert read_searchr1_parquet(path)[0].question == "Who wrote Hamlet?"


def test_a_merged_search_r1_file_keeps_each_data_sets_questions_apart(tmp_path: Path) -> None:
    """Search-R1's merged training file (nq + hotpotqa) keeps each set's `id` column, whose
    ids restart in every set: read as they were, `train_0` came twice and the file was
    refused. With several data sets each id takes its set's name; one set keeps its own."""
    nq = _search_r1_style_table(with_question_column=True, with_id=True)
    hotpot = nq.set_column(nq.schema.get_field_index("data_source"), "data_source",
                           pa.array(["hotpotqa"] * nq.num_rows))
    path = tmp_path / "train.parquet"
    pq.write_table(pa.concat_tables([nq, hotpot]), path)
    ids = [ex.id for ex in read_searchr1_parquet(path)]
    assert ids == ["nq-train_0", "nq-train_1", "hotpotqa-train_0", "hotpotqa-train_1"]
    pq.write_table(nq, path)
    assert [ex.id for ex in read_searchr1_parquet(path)] == ["train_0", "train_1"]

def test_parquet_errors_name_file_row_and_field(tmp_path: Path) -> None:
    no_answers = tmp_path / "no_answers.parquet"
    pq.write_table(pa.table({"prompt": ["Question: q?"]}), no_answers)
    with pytest.raises(DataError, match=r"no_answers\.parquet: no answers"):
        read_searchr1_parquet(no_answers)

    bad_target = tmp_path / "bad_target.parquet"
    pq.write_table(pa.Table.from_pylist([
        {"prompt": "Question: q1?", "reward_model": {"style": "rule",
                                                    "ground_truth": {"target": ["a"]}}},
        {"prompt": "Question: q2?", "reward_model": {"style": "rule",
                                                    "ground_truth": {"target": []}}},
    ]), bad_target)
    with pytest.raises(DataError) as info:
        read_searchr1_parquet(bad_target)
    assert (info.value.line, info.value.field) == (2, "golden_answers")
    report = SkipReport()       # --skip-bad: the bad row is left out and said, not fatal
    kept = load_qa(bad_target, skip_bad=True, report=report)
    assert [e.question for e in kept] == ["q1?"] and report.count == 1
    assert report.skipped[0][0] == 2 and "golden_answers" in report.skipped[0][1]
    assert report.path == str(bad_target) and str(bad_target) in str(report)   # named

    not_parquet = _write_lines(tmp_path / "x.parquet", ["hello"])
    with pytest.raises(DataError, match="not a readable parquet file"):
        read_searchr1_parquet(not_parquet)


def test_empty_parquet_keeps_its_columns(tmp_path: Path) -> None:
    path = write_searchr1_parquet(tmp_path / "empty.parquet", [])
    assert pq.read_table(path).num_rows == 0
    assert read_searchr1_parquet(path) == []


# ------------------------------------------------------------------------ the real sample

def test_reads_the_hotpotqa_sample(hotpotqa_dir: Path, tmp_path: Path) -> None:
    examples = read_qa_jsonl(hotpotqa_dir / "questions.jsonl")
    assert len(examples) == 30
    assert len({ex.id for ex in examples}) == 30
    assert all(ex.question.strip() and ex.golden_answers for ex in examples)
    assert examples[0].golden_answers == ["yes"]
    assert examples[0].metadata["gold_doc_ids"]
    # Both formats carry every field through.
    parquet = write_searchr1_parquet(tmp_path / "h.parquet", examples, data_source="hotpotqa")
    assert _without_prompts(read_searchr1_parquet(parquet)) == examples
    assert load_qa(hotpotqa_dir / "questions.jsonl") == examples


# -------------------------------------------------------------------------------- load_qa

def test_load_qa_dispatches_by_extension(tmp_path: Path) -> None:
    write_qa_jsonl(tmp_path / "a.jsonl", EXAMPLES)
    write_searchr1_parquet(tmp_path / "a.parquet", EXAMPLES)
    (tmp_path / "lines.json").write_text((tmp_path / "a.jsonl").read_text(encoding="utf-8"),
                                         encoding="utf-8")
    (tmp_path / "array.json").write_text(
        json.dumps([ex.to_dict() for ex in EXAMPLES], indent=1), encoding="utf-8")
    for name in ("a.jsonl", "a.parquet", "lines.json", "array.json"):
        assert _without_prompts(load_qa(tmp_path / name)) == EXAMPLES, name
    # A FlashRAG-style folder: <dir>/<split>.jsonl
    write_qa_jsonl(tmp_path / "nq" / "dev.jsonl", EXAMPLES[:1])
    assert load_qa(tmp_path / "nq", split="dev") == EXAMPLES[:1]
    with pytest.raises(FileNotFoundError):
        load_qa(tmp_path / "missing.jsonl")


def test_a_json_file_of_one_object_is_said_to_be_one(tmp_path: Path) -> None:
    path = tmp_path / "squad.json"
    for text in (json.dumps({"version": "1", "data": [json.loads(GOOD)]}),
                 json.dumps({"version": "1", "data": [json.loads(GOOD)]}, indent=2)):
        path.write_text(text, encoding="utf-8")
        with pytest.raises(DataError, match=r"squad\.json: one JSON object with keys "
                                            r"\['data', 'version'\].*questions in 'data'"):
            load_qa(path)
    path.write_text(GOOD + "\n", encoding="utf-8")    # one question: JSONL of one line
    assert len(load_qa(path)) == 1


def test_load_qa_json_array_errors_name_the_item(tmp_path: Path) -> None:
    path = tmp_path / "array.json"
    path.write_text(json.dumps([json.loads(GOOD), {"id": "x"}]), encoding="utf-8")
    with pytest.raises(DataError, match=r"array\.json\[1\]: field 'question'"):
        load_qa(path)


def test_a_json_arrays_duplicates_name_the_item(tmp_path: Path) -> None:
    """A duplicate id in a `.json` array is named by its item, as the array's other errors
    are (it had read `array.json:3`: the item's 1-based number as a line); a key given
    twice in an item is refused, not read as its last value."""
    path = tmp_path / "array.json"
    first, second = json.loads(GOOD), json.loads(GOOD2)
    path.write_text("[\n" + ",\n".join(json.dumps(x) for x in (first, second, first)) + "\n]",
                    encoding="utf-8")
    with pytest.raises(DataError, match=r"array\.json\[2\]: field 'id': duplicate id "
                                        r"'ok' \(item \[0\] has it too\)"):
        load_qa(path)
    path.write_text('[{"id": "a", "question": "Q?", "golden_answers": ["x"], '
                    '"golden_answers": ["y"]}]', encoding="utf-8")
    with pytest.raises(DataError, match=r"array\.json: key 'golden_answers' given twice"):
        load_qa(path)


def test_load_qa_json_array_skips_name_the_item_number(tmp_path: Path, caplog) -> None:
    path = tmp_path / "array.json"
    path.write_text(json.dumps([json.loads(GOOD), {"id": "x"}, json.loads(GOOD2)]),
                    encoding="utf-8")
    report = SkipReport()
    assert len(load_qa(path, skip_bad=True, report=report)) == 2
    assert report.path == str(path)
    assert [n for n, _ in report.skipped] == [2] and "question" in report.skipped[0][1]
    with caplog.at_level(logging.WARNING, logger="seekrl"):   # no report: a warning
        assert len(load_qa(path, skip_bad=True)) == 2
    assert "skipped 1 bad line(s)" in caplog.text and "array.json" in caplog.text


@pytest.mark.skipif(HAVE_DATASETS, reason="checks the message shown without `datasets`")
def test_hf_without_datasets_says_how_to_install() -> None:
    with pytest.raises(ImportError, match=r"seekrl\[hf\]"):
        load_qa("RUC-NLPIR/FlashRAG_datasets", split="dev", config="hotpotqa")


def test_answer_shapes_of_common_hf_datasets() -> None:
    assert _answers_from_value(["a", "b"]) == ["a", "b"]  # nq_open
    assert _answers_from_value("Paris") == ["Paris"]  # hotpot_qa
    assert _answers_from_value({"text": ["x", "x", "y"], "answer_start": [0, 0, 3]}) == [
        "x", "y"]  # squad
    assert _answers_from_value({"value": "Sun", "aliases": ["Sun", "Sol"],
                                "normalized_value": "sun"}) == ["Sun", "Sol"]  # trivia_qa
    assert _answers_from_value('["Kiev", "Kyiv"]') == ["Kiev", "Kyiv"]  # PopQA
    assert _answers_from_value(1984) == ["1984"]
    # a year from a column with nulls arrives as a float: still 1984, not "1984.0" (which
    # normalises to "19840" and never matches); a real fraction is kept
    assert _answers_from_value(1984.0) == ["1984"]
    assert _answers_from_value(2.5) == ["2.5"]
    with pytest.raises(ValueError):
        _answers_from_value({"start": 3})
    # a list column that pandas saved to CSV: Python's text, not JSON
    assert _answers_from_value("['Paris', \"Paris, France\"]") == ["Paris", "Paris, France"]
    assert _answers_from_value("[not a list]") == ["[not a list]"]
    # numpy's text of an array (a parquet list column through pandas): no commas, and
    # adjacent strings are two answers, not one joined
    assert _answers_from_value("['Paris' 'France']") == ["Paris", "France"]
    assert _answers_from_value("['a'\n 'b']") == ["a", "b"]
    assert _answers_from_value("[None]") == ["[None]"]


def test_a_metadata_column_is_never_dropped() -> None:
    from seekrl.data.qa import _metadata_column

    assert _metadata_column({"type": "bridge"}) == {"type": "bridge"}
    assert _metadata_column('{"type": "bridge"}') == {"type": "bridge"}   # CSV: JSON text
    assert _metadata_column(None) == {}
    assert _metadata_column("free text") == {"metadata": "free text"}
    assert _metadata_column([1, 2]) == {"metadata": [1, 2]}


@pytest.mark.parametrize("answer", ["", "  ", ".", "--", "?!"])
def test_a_golden_answer_that_normalises_to_nothing_is_not_scored(answer, caplog) -> None:
    """Scoring drops punctuation and articles (SQuAD's normalisation): such a gold would be
    matched by an empty answer, a reward for writing nothing. Beside another answer it is
    set aside (kept in metadata, said in the log); alone, the example is refused."""
    from seekrl.rewards.metrics import normalize_answer

    assert normalize_answer(answer) == ""
    with pytest.raises(DataError, match=r"q.jsonl:3: field 'golden_answers'"):
        QAExample.from_dict({"id": "x", "question": "Q?", "golden_answers": [answer]},
                            path="q.jsonl", line=3)
    ex = QAExample.from_dict({"id": "x", "question": "Q?", "golden_answers": ["ok", answer]},
                             path=f"q{answer!r}.jsonl", line=4)
    assert ex.golden_answers == ["ok"] and ex.metadata["unscored_answers"] == [answer]
    assert "line 4" in caplog.text and "not scored" in caplog.text
    # a bare article also normalises to nothing, but is a real answer (a letter, a grade)
    assert QAExample.from_dict({"id": "x", "question": "Q?", "golden_answers": ["A"]})


def test_unscored_answers_given_in_metadata_are_kept_beside_the_set_aside_ones() -> None:
    ex = QAExample.from_dict({"id": "x", "question": "Q?", "golden_answers": ["ok", "."],
                              "metadata": {"unscored_answers": ["mine"]}})
    assert ex.metadata["unscored_answers"] == ["mine", "."]
    with pytest.raises(DataError, match="field 'metadata.unscored_answers': expected a list"):
        QAExample.from_dict({"id": "x", "question": "Q?", "golden_answers": ["ok", "."],
                             "metadata": {"unscored_answers": "mine"}})


def test_a_key_at_the_top_level_and_in_metadata_must_agree() -> None:
    with pytest.raises(DataError, match=r"q.jsonl:2: field 'hops': given at the top level "
                                        r"\(int 2\) and in metadata \(int 3\)"):
        QAExample.from_dict({"id": 1, "question": "Q?", "golden_answers": ["a"], "hops": 2,
                             "metadata": {"hops": 3}}, path="q.jsonl", line=2)
    ex = QAExample.from_dict({"id": 1, "question": "Q?", "golden_answers": ["a"], "hops": 2,
                              "metadata": {"hops": 2, "note": "x"}})
    assert ex.metadata == {"hops": 2, "note": "x"}


@pytest.mark.parametrize("given, kept", [
    ("doc_17", ["doc_17"]), (17, ["17"]), (["d1", 2], ["d1", "2"]), (("d1",), ["d1"]), ([], []),
])
def test_gold_doc_ids_become_a_list_of_ids(given, kept) -> None:
    ex = QAExample.from_dict({"id": 1, "question": "Q?", "golden_answers": ["a"],
                              "metadata": {"gold_doc_ids": given}})
    assert ex.metadata["gold_doc_ids"] == kept


def test_gold_doc_ids_of_null_are_none_given() -> None:
    # a struct column (pyarrow, datasets) fills a key a row lacks with null
    ex = QAExample.from_dict({"id": 1, "question": "Q?", "golden_answers": ["a"],
                              "metadata": {"type": "single", "gold_doc_ids": None}})
    assert ex.metadata == {"type": "single"}


@pytest.mark.parametrize("given", [[["d1"], ["d2"]], {"d1": 1}, [True], 1.5])
def test_gold_doc_ids_of_another_shape_are_refused(given) -> None:
    with pytest.raises(DataError, match=r"q.jsonl:5: field 'metadata.gold_doc_ids': expected "
                                        "a list of document ids"):
        QAExample.from_dict({"id": 1, "question": "Q?", "golden_answers": ["a"],
                             "metadata": {"gold_doc_ids": given}}, path="q.jsonl", line=5)


def test_a_parquet_metadata_column_of_any_shape_is_read_or_refused(tmp_path: Path) -> None:
    target = {"style": "rule", "ground_truth": {"target": ["a"]}}

    def read(rows):
        path = tmp_path / "m.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
        return read_searchr1_parquet(path)

    # a `metadata` column as JSON text, or a value of another kind (kept whole)
    text, number = read([{"prompt": "Question: q?", "reward_model": target,
                          "metadata": '{"hops": 2}'},
                         {"prompt": "Question: r?", "reward_model": target,
                          "metadata": '5'}])
    assert text.metadata == {"hops": 2, "data_source": "searchr1"}
    assert number.metadata == {"metadata": "5", "data_source": "searchr1"}
    # extra_info.metadata as a struct (other tools write it so): kept, not dropped
    (ex,) = read([{"prompt": "Question: q?", "reward_model": target,
                   "extra_info": {"metadata": {"hops": 2, "gold_doc_ids": "d1"}}}])
    assert ex.metadata == {"hops": 2, "gold_doc_ids": ["d1"], "data_source": "searchr1"}
    for bad, said in (('[1, 2]', "expected a JSON object, got list"),
                      (7, "expected an object or its JSON text, got int")):
        with pytest.raises(DataError, match=rf"m.parquet:1: field 'extra_info.metadata': {said}"):
            read([{"prompt": "Question: q?", "reward_model": target,
                   "extra_info": {"metadata": bad}}])


def test_a_parquets_other_columns_are_kept_in_metadata(tmp_path: Path) -> None:
    """A FlashRAG file saved as parquet carries `type`, `hops` and `gold_doc_ids` as
    columns: they are read (type balancing, evidence recall and `recall` need them), a
    null cell is not given, pandas' index column is left out, and a column that says
    otherwise than the metadata is refused."""
    path = tmp_path / "f.parquet"
    table = pa.Table.from_pylist([
        {"id": "a", "question": "Q1?", "golden_answers": ["x"], "type": "bridge", "hops": 2,
         "gold_doc_ids": ["d1", "d2"], "__index_level_0__": 0},
        {"id": "b", "question": "Q2?", "golden_answers": ["y"], "type": None, "hops": 1,
         "gold_doc_ids": ["d3"], "__index_level_0__": 1}])
    pq.write_table(table, path)
    first, second = read_searchr1_parquet(path)
    assert first.metadata == {"type": "bridge", "hops": 2, "gold_doc_ids": ["d1", "d2"],
                              "data_source": "searchr1"}
    assert second.metadata == {"hops": 1, "gold_doc_ids": ["d3"], "data_source": "searchr1"}
    pq.write_table(pa.Table.from_pylist([
        {"id": "a", "question": "Q1?", "golden_answers": ["x"], "hops": 2,
         "metadata": '{"hops": 3}'}]), path)
    with pytest.raises(DataError, match=r"f.parquet:1: field 'hops': given at the top level"):
        read_searchr1_parquet(path)


def test_a_hop_count_is_an_integer_or_not_given(tmp_path: Path) -> None:
    """`hops` drives the hop bonus, hop-balanced SFT and the per-hop figures: "2" had
    switched them off for the question unsaid; a float column's 2.0 is read as 2 and its
    NaN (pandas' null) as not given, where NaN had been kept and written as JSON's NaN."""
    def hops(value):
        return QAExample.from_dict({"id": "a", "question": "q", "golden_answers": ["x"],
                                    "metadata": {"hops": value}}).metadata.get("hops", "-")

    assert [hops(v) for v in (2, 2.0, None, float("nan"))] == [2, 2, "-", "-"]
    for bad in ("2", 2.5, 0, True, [2]):
        with pytest.raises(DataError, match=r"field 'metadata.hops': expected a hop count"):
            hops(bad)
    path = tmp_path / "h.parquet"
    pq.write_table(pa.Table.from_pylist([
        {"id": "a", "question": "Q1?", "golden_answers": ["x"], "hops": 2.0},
        {"id": "b", "question": "Q2?", "golden_answers": ["y"], "hops": float("nan")}]), path)
    first, second = read_searchr1_parquet(path)
    assert first.metadata["hops"] == 2 and "hops" not in second.metadata
    write_qa_jsonl(tmp_path / "h.jsonl", [first, second])
    assert "NaN" not in (tmp_path / "h.jsonl").read_text()


def test_a_lone_surrogate_in_metadata_or_a_prompt_fails_naming_the_example(tmp_path: Path
                                                                            ) -> None:
    """Read from JSON escapes, it had passed, then broken both writers with a bare
    UnicodeEncodeError naming neither the example nor the field."""
    ex = QAExample.from_dict({"id": "b", "question": "q", "golden_answers": ["a"],
                              "type": "\ud800"})
    for write in (write_qa_jsonl, write_searchr1_parquet):
        with pytest.raises(DataError, match=r"example 'b': not JSON-serialisable .*surrogate"):
            write(tmp_path / "out.data", [ex])


def test_a_number_past_pythons_digit_limit_is_a_bad_line_not_a_crash(tmp_path: Path) -> None:
    big = '{"id": "b", "question": "q", "golden_answers": ["x"], "n": 1' + "1" * 5000 + "}"
    path = tmp_path / "big.jsonl"
    path.write_text('{"id": "a", "question": "q", "golden_answers": ["x"]}\n' + big + "\n")
    with pytest.raises(DataError, match=r"big.jsonl:2: invalid JSON \(Exceeds the limit"):
        read_qa_jsonl(path)
    assert [e.id for e in read_qa_jsonl(path, skip_bad=True)] == ["a"]
    array = tmp_path / "big.json"
    array.write_text("[" + big + "]")
    with pytest.raises(DataError, match="big.json: not a valid JSON array"):
        load_qa(array)


@given(st.text(max_size=12))
def test_what_the_check_refuses_normalises_to_nothing(answer) -> None:
    from seekrl.data.qa import _nothing_left
    from seekrl.rewards.metrics import normalize_answer

    if _nothing_left(answer):
        assert normalize_answer(answer) == ""


@pytest.mark.skipif(not HAVE_DATASETS, reason="needs the `datasets` package (seekrl[hf])")
def test_load_hf_qa_from_local_files(tmp_path: Path) -> None:
    rows = [{"question": "Q1?", "answer": {"value": "A", "aliases": ["A", "a1"]},
             "type": "bridge"},
            {"question": "Q2?", "answer": {"value": "B", "aliases": []}, "type": "comparison"}]
    path = tmp_path / "trivia.jsonl"
    _write_lines(path, [json.dumps(r) for r in rows])
    examples = load_hf_qa(str(path), "validation")
    assert examples == [QAExample("validation-0", "Q1?", ["A", "a1"], {"type": "bridge"}),
                        QAExample("validation-1", "Q2?", ["B"], {"type": "comparison"})]
    assert load_hf_qa("json", "train", data_files=str(path))[1].golden_answers == ["B"]
    with pytest.raises(DataError, match="no question column"):
        load_hf_qa(str(path), question_field="query")


@pytest.mark.skipif(not HAVE_DATASETS, reason="needs the `datasets` package (seekrl[hf])")
def test_load_hf_qa_reads_a_csv_that_pandas_wrote(tmp_path: Path) -> None:
    """A list column saved by pandas is Python's text; a metadata column is JSON text, or
    anything else (kept whole, not dropped)."""
    path = tmp_path / "qa.csv"
    path.write_text('id,question,answers,metadata\n'
                    '1,Q1?,"[\'Kiev\', \'Kyiv\']","{""type"": ""bridge""}"\n'
                    '2,Q2?,Paris,just a note\n')
    one, two = load_hf_qa(str(path), "train")
    assert one.golden_answers == ["Kiev", "Kyiv"] and one.metadata["type"] == "bridge"
    assert two.golden_answers == ["Paris"] and two.metadata["metadata"] == "just a note"


# --------------------------------------------------------------------------- junk in, DataError out

_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8,
)
_RECORDS = st.dictionaries(
    st.sampled_from(["id", "question", "golden_answers", "metadata", "other"]), _JSON_VALUES,
).map(json.dumps)
_LINES = st.lists(st.one_of(st.text(max_size=40), _RECORDS), max_size=6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=_LINES, raw=st.binary(max_size=60))
def test_junk_only_ever_raises_data_error(tmp_path_factory, lines: list[str],
                                          raw: bytes) -> None:
    path = tmp_path_factory.getbasetemp() / "junk.jsonl"
    for content in ("\n".join(lines).encode("utf-8"), raw):
        path.write_bytes(content)
        try:
            read_qa_jsonl(path)
        except DataError:
            pass
        report = SkipReport()
        examples = read_qa_jsonl(path, skip_bad=True, report=report)
        nonblank = sum(1 for line in content.split(b"\n") if line.strip())
        assert len(examples) + report.count <= nonblank


def test_a_hub_dataset_fails_at_once_when_the_hub_is_out_of_reach(monkeypatch):
    """Offline, a hub dataset comes from the local cache or fails in a second (it spent
    ~27 s in retries before the same error)."""
    import time

    from seekrl import runtime
    from seekrl.data.qa import load_hf_qa
    from seekrl.errors import DataError

    pytest.importorskip("datasets")
    monkeypatch.setattr(runtime, "_HUB", {"answer": "example.invalid cannot be reached"})
    started = time.time()
    with pytest.raises(DataError, match="someorg/no-such-dataset"):
        load_hf_qa("someorg/no-such-dataset", split="test")
    assert time.time() - started < 10


@pytest.mark.parametrize("name, hint", [("x.jsnol", "did you mean x.jsonl?"),
                                        ("x.parqet", "did you mean x.parquet?"),
                                        ("x.csv", "end in .jsonl, .json or .parquet")])
def test_a_mistyped_file_is_not_taken_for_a_hub_dataset(tmp_path: Path, name, hint) -> None:
    with pytest.raises(FileNotFoundError, match="no such QA file") as err:
        load_qa(tmp_path / name)
    assert hint in str(err.value)
    # a missing name in a folder that is here is a file too, whatever its suffix
    with pytest.raises(FileNotFoundError, match="no such QA file"):
        load_qa(tmp_path / "questions.v2")
