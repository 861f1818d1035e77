"""Data specs for the standard QA suite: `hf:` (offline, from a dataset saved to disk),
`flashrag:` (from a local FlashRAG-layout mirror), FlashRAG folders with a split, and the
supporting-fact titles real multi-hop data carries."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from seekrl.agent.trajectory import Step, Trajectory
from seekrl.data.benchmarks import BENCHMARKS, hop_class, parse_hf_spec, spec_name, supporting_titles
from seekrl.data.qa import QAExample, load_qa
from seekrl.errors import DataError
from seekrl.eval.evaluate import dataset_name, load_eval_data
from seekrl.rewards.process import ProcessContext, score_steps

needs_datasets = pytest.mark.skipif(importlib.util.find_spec("datasets") is None,
                                    reason="needs the `datasets` package (seekrl[hf])")

HOTPOT_ROW = {
    "id": "5a8b", "question": "Which band formed first, Kasabian or Muse?",
    "golden_answers": ["Muse"],
    "metadata": {"type": "comparison", "level": "hard",
                 "supporting_facts": {"title": ["Muse (band)", "Kasabian", "Muse (band)"],
                                      "sent_id": [0, 0, 1]},
                 "context": {"title": ["Muse (band)", "Kasabian", "Blur"],
                             "sentences": [["Muse are ..."], ["Kasabian are ..."], ["..."]]}},
}


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _rows(prefix: str, n: int) -> list[dict]:
    return [{"id": f"{prefix}{i}", "question": f"{prefix} question {i}?",
             "golden_answers": [f"a{i}"]} for i in range(n)]


def test_hf_spec_parsing() -> None:
    assert parse_hf_spec("hf:nq_open:validation") == ("nq_open", None, "validation")
    assert parse_hf_spec("hf:RUC-NLPIR/FlashRAG_datasets:hotpotqa:dev") == \
        ("RUC-NLPIR/FlashRAG_datasets", "hotpotqa", "dev")
    for bad in ("hf:nq_open", "hf:", "hf:a:b:c:d", "hf::dev"):
        with pytest.raises(DataError, match="hf:NAME:SPLIT"):
            parse_hf_spec(bad)


def test_suite_names_and_table_names() -> None:
    assert [b for b in BENCHMARKS] == ["nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa",
                                       "musique", "bamboogle"]
    assert [hop_class(n) for n in ("nq", "popqa", "2wiki", "MuSiQue", "bamboogle", "world")] == \
        ["single", "single", "multi", "multi", "multi", None]
    assert spec_name("flashrag:2wiki") == "2wikimultihopqa"
    assert spec_name("flashrag:nq+hotpotqa:train") == "nq+hotpotqa"
    assert spec_name("hf:RUC-NLPIR/FlashRAG_datasets:musique:dev") == "musique"
    assert spec_name("hf:/data/saved/popqa:test") == "popqa"
    assert dataset_name("flashrag:bamboogle") == "bamboogle"
    assert spec_name("data/nq.jsonl") is None


def test_supporting_titles_shapes() -> None:
    ex = QAExample.from_dict(HOTPOT_ROW)
    assert ex.metadata["supporting_titles"] == ["Muse (band)", "Kasabian"]   # once each
    assert "context" not in ex.metadata and ex.metadata["type"] == "comparison"
    given = QAExample.from_dict({"id": "q", "question": "?", "golden_answers": ["a"],
                                 "metadata": {"supporting_titles": "Paris"}})
    assert given.metadata["supporting_titles"] == ["Paris"]
    one_fact = QAExample.from_dict({"id": "q", "question": "?", "golden_answers": ["a"],
                                    "supporting_facts": {"title": "Paris", "sent_id": 0}})
    assert one_fact.metadata["supporting_titles"] == ["Paris"]   # not its letters
    # the original HotpotQA JSON: [[title, sentence], ...] at the top level
    raw = {"id": 1, "question": "q?", "golden_answers": ["x"],
           "supporting_facts": [["A", 0], ["B", 2]]}
    assert QAExample.from_dict(raw).metadata["supporting_titles"] == ["A", "B"]
    musique = {"paragraphs": [{"idx": 0, "title": "P", "is_supporting": False},
                              {"idx": 1, "title": "Q", "is_supporting": True},
                              {"idx": 2, "title": "R", "is_supporting": True}]}
    assert supporting_titles(musique) == ["Q", "R"]
    assert supporting_titles({"type": "bridge"}) == []
    # titles given already are kept as they are
    given = {**HOTPOT_ROW, "metadata": {"supporting_titles": ["Z"], "context": {"title": []}}}
    assert QAExample.from_dict(given).metadata == {"supporting_titles": ["Z"],
                                                   "context": {"title": []}}
    # null, as a parquet struct or HF dataset fills a key other rows have: none given, so
    # the supporting facts say (it was refused as not a list of titles)
    null = {"id": "q", "question": "?", "golden_answers": ["a"],
            "metadata": {"supporting_titles": None, "supporting_facts": [["A", 0], ["B", 1]]}}
    assert QAExample.from_dict(null).metadata["supporting_titles"] == ["A", "B"]
    bare = {"id": "q", "question": "?", "golden_answers": ["a"],
            "metadata": {"supporting_titles": None, "hops": 2}}
    assert QAExample.from_dict(bare).metadata == {"hops": 2}


def test_flashrag_folder_with_and_without_split(tmp_path: Path) -> None:
    folder = tmp_path / "hotpotqa"
    _write_jsonl(folder / "train.jsonl", _rows("t", 3))
    _write_jsonl(folder / "dev.jsonl", [HOTPOT_ROW, *_rows("d", 1)])
    assert [e.id for e in load_qa(folder)] == ["5a8b", "d0"]           # dev before train
    assert [e.id for e in load_qa(f"{folder}:train")] == ["t0", "t1", "t2"]
    assert [e.id for e in load_qa(folder, "train")] == ["t0", "t1", "t2"]
    with pytest.raises(FileNotFoundError, match="no test.jsonl"):
        load_qa(f"{folder}:test")
    # a split the folder lacks is said with what it has, not handed to `datasets`
    with pytest.raises(FileNotFoundError, match=r"no validation.jsonl.*\['dev.jsonl', 'train"):
        load_qa(folder, "validation")
    # a folder of one QA file under another name: that file, read by seekrl's reader
    other = tmp_path / "mine"
    _write_jsonl(other / "questions.jsonl", _rows("q", 2))
    assert [e.id for e in load_qa(other)] == ["q0", "q1"]
    (other / "questions.jsonl").write_text('{"id": "a", "question": "q", '
                                           '"golden_answers": ["x"]}\n{bad\n')
    with pytest.raises(DataError, match=r"questions.jsonl:2"):
        load_qa(other)
    _write_jsonl(other / "more.jsonl", _rows("m", 1))
    with pytest.raises(FileNotFoundError, match=r"2 QA files; it has \['more.jsonl', "
                                                r"'questions.jsonl'\]: name the file"):
        load_qa(other)
    assert dataset_name(f"{folder}:train") == "hotpotqa-train"   # not the reported split
    # a folder of saved splits (DatasetDict.save_to_disk) is read at its train split, and
    # named so (it was named as the set's reported split, and its scores went to the
    # multi-hop average)
    saved = tmp_path / "saved" / "hotpotqa"
    saved.mkdir(parents=True)
    (saved / "dataset_dict.json").write_text('{"splits": ["train", "validation"]}')
    assert dataset_name(saved) == "hotpotqa-train"
    assert load_qa(folder)[0].metadata["supporting_titles"] == ["Muse (band)", "Kasabian"]


def test_bare_benchmark_name_says_how_to_name_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="flashrag:musique"):
        load_qa("musique")


def test_flashrag_specs_from_a_local_mirror(tmp_path: Path, monkeypatch) -> None:
    mirror = tmp_path / "flashrag"
    _write_jsonl(mirror / "nq" / "train.jsonl", _rows("n", 2))
    _write_jsonl(mirror / "nq" / "test.jsonl", _rows("nt", 4))
    _write_jsonl(mirror / "hotpotqa" / "train.jsonl", _rows("h", 3))
    _write_jsonl(mirror / "hotpotqa" / "dev.jsonl", [HOTPOT_ROW])
    monkeypatch.setenv("SEEKRL_FLASHRAG_DIR", str(mirror))
    assert len(load_qa("flashrag:nq")) == 4                        # test: nq's eval split
    assert [e.id for e in load_qa("flashrag:hotpotqa")] == ["5a8b"]  # dev: hotpotqa's
    mix = load_qa("flashrag:nq+hotpotqa:train")                     # Search-R1's training mix
    assert [e.id for e in mix] == ["nq-n0", "nq-n1", "hotpotqa-h0", "hotpotqa-h1", "hotpotqa-h2"]
    assert {e.metadata["source"] for e in mix} == {"nq", "hotpotqa"}
    with pytest.raises(DataError, match="unknown benchmark 'squad'"):
        load_qa("flashrag:squad")
    with pytest.raises(FileNotFoundError, match="no popqa/ folder"):
        load_qa("flashrag:popqa")
    # a set named twice (an alias counts) would come twice under one id each time
    for spec, twice in (("flashrag:nq+nq", "'nq' and 'nq'"),
                        ("flashrag:hotpotqa+nq+HotpotQA", "'hotpotqa' and 'HotpotQA'")):
        with pytest.raises(DataError, match=f"names hotpotqa twice|names nq twice.*{twice}"):
            load_qa(spec)
    for spec in ("flashrag:nq+", "flashrag:+nq", "flashrag:nq::", "flashrag:nq:a:b"):
        with pytest.raises(DataError, match=r"expected flashrag:NAME\[\+NAME"):
            load_qa(spec)
    # a mirror without the split asked for names the folder and what it holds
    with pytest.raises(FileNotFoundError, match=r"nq has no dev.jsonl.*test.jsonl"):
        load_qa("flashrag:nq:dev")
    data = load_eval_data(["flashrag:nq", "flashrag:2wiki"][:1] + ["flashrag:hotpotqa"], limit=2)
    assert list(data) == ["nq", "hotpotqa"] and len(data["nq"]) == 2
    # several sets in one spec are evaluated apart, the limit a set's (they were one row,
    # named nq+hotpotqa, its limit taken from nq alone)
    data = load_eval_data(["flashrag:nq+hotpotqa"], limit=2)
    assert list(data) == ["nq", "hotpotqa"] and [len(v) for v in data.values()] == [2, 1]
    data = load_eval_data(["flashrag:nq+hotpotqa:train"])
    assert list(data) == ["nq-train", "hotpotqa-train"]


@needs_datasets
def test_hub_failures_are_one_line_data_errors(monkeypatch) -> None:
    """No network (or no such dataset / split): a DataError naming the dataset and the
    local mirror, not the datasets library's traceback."""
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'RUC-NLPIR/FlashRAG_datasets' on the Hub "
                              "(LocalEntryNotFoundError)")

    monkeypatch.delenv("SEEKRL_FLASHRAG_DIR", raising=False)
    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataError, match=r"FlashRAG_datasets:bamboogle: cannot load 'test' "
                                        r"\(ConnectionError: Couldn't reach.*SEEKRL_FLASHRAG_DIR"):
        load_qa("flashrag:bamboogle")

    def no_split(*args, **kwargs):
        raise ValueError('Unknown split "train". Should be one of [\'test\'].')

    monkeypatch.setattr(datasets, "load_dataset", no_split)
    with pytest.raises(DataError, match=r"someone/set: cannot load 'train' \(ValueError: "
                                        r"Unknown split"):
        load_qa("hf:someone/set:train")


@needs_datasets
def test_hf_spec_loads_a_dataset_saved_to_disk(tmp_path: Path) -> None:
    import datasets

    rows = {"id": ["a", "b"], "question": ["Who?", "Where?"],
            "answer": ["Ann", "Paris"], "type": ["bridge", "comparison"],
            "supporting_facts": [{"title": ["X", "Y"], "sent_id": [0, 1]},
                                 {"title": ["Z"], "sent_id": [3]}]}
    dd = datasets.DatasetDict({"validation": datasets.Dataset.from_dict(rows),
                               "train": datasets.Dataset.from_dict(rows)})
    dd.save_to_disk(str(tmp_path / "hotpot"))
    examples = load_qa(f"hf:{tmp_path / 'hotpot'}:validation")
    assert [e.golden_answers for e in examples] == [["Ann"], ["Paris"]]
    assert examples[0].metadata["supporting_titles"] == ["X", "Y"]
    assert examples[1].metadata["type"] == "comparison"
    with pytest.raises(DataError, match=r"no split 'test'; the saved dataset has \['train', "
                                        r"'validation'\]"):
        load_qa(f"hf:{tmp_path / 'hotpot'}:test")
    # one Dataset (no splits) is its own split
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "single"))
    assert len(load_qa(f"hf:{tmp_path / 'single'}:test")) == 2
    assert dataset_name(f"hf:{tmp_path / 'hotpot'}:validation") == "hotpot"


def test_evidence_by_title_when_ids_are_unknown() -> None:
    def traj(hit_titles: list[list[str]]) -> Trajectory:
        steps, pos = [], 10
        for titles in hit_titles:
            steps.append(Step(start=pos, end=pos + 2, action="search", query="q",
                              hits=[f"id{i}" for i in range(len(titles))], hit_titles=titles))
            pos += 2
        steps.append(Step(start=pos, end=pos + 2, action="answer", answer="x"))
        pos += 2
        return Trajectory(example_id="e", group_id="g", question="q?", golden_answers=["x"],
                          token_ids=[0] * pos, loss_mask=[0] * 10 + [1] * (pos - 10),
                          prompt_len=10, steps=steps,
                          metadata={"supporting_titles": ["Muse (band)", "Kasabian"]})

    t = traj([["muse (band)", "Blur"], ["Muse (band)", "Kasabian"]])
    assert t.evidence_recall() == 1.0
    assert traj([["Blur"]]).evidence_recall() == 0.0
    score_steps([t], {"evidence": 1.0}, ProcessContext())
    assert [s.process_parts["evidence"] for s in t.steps] == [0.5, 0.5, None]   # the answer is not judged
    # no gold of either kind: unknown, not zero
    t.metadata = {}
    assert t.evidence_recall() is None


def _fake_run(tmp_path: Path, name: str, method: str, em: dict[str, float]) -> Path:
    from seekrl.data.benchmarks import hop_averages

    run = tmp_path / name
    run.mkdir()
    datasets = {d: {"questions": 10, "em": v, "f1": v + 0.05} for d, v in em.items()}
    metrics = {"config": {"model": "/ckpt/policy-7b", "rollout": {"method": method}},
               "datasets": datasets,
               "average": {"em": sum(em.values()) / len(em)},
               "hops": hop_averages(datasets)}
    (run / "metrics.json").write_text(json.dumps(metrics))
    return run


def test_search_r1_layout_averages_single_and_multi_hop(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from seekrl.cli import app
    from seekrl.data.benchmarks import hop_averages
    from seekrl.eval.evaluate import score_trajectories
    from seekrl.eval.report import metrics_markdown, suite_table

    rows = {"hotpotqa": {"em": 0.2, "f1": 0.3}, "nq": {"em": 0.4, "f1": 0.5},
            "popqa": {"em": 0.3, "f1": 0.4}, "world": {"em": 0.9, "f1": 0.9}}
    hops = hop_averages(rows)
    assert list(hops) == ["single", "multi"]
    assert hops["single"]["em"] == pytest.approx(0.35) and hops["single"]["datasets"] == 2
    assert hops["multi"] == {"datasets": 1, "em": 0.2, "f1": 0.3}
    assert hop_averages({"world": {"em": 1.0}}) == {}

    agent = _fake_run(tmp_path, "agent", "agent", {"nq": 0.4, "hotpotqa": 0.2, "bamboogle": 0.1})
    rag = _fake_run(tmp_path, "rag", "rag", {"nq": 0.3, "hotpotqa": 0.25})
    table = suite_table([("agent", json.loads((agent / "metrics.json").read_text())),
                         ("rag", json.loads((rag / "metrics.json").read_text()))])
    header, _, first, second, _, note = table.splitlines()
    # the suite's order, whatever order the runs list their sets in
    assert header.startswith("| | nq | hotpotqa | bamboogle | single-hop avg.")
    assert first == "| agent | 0.400 | 0.200 | 0.100 | 0.400 | 0.150 | 0.233 |"
    # rag has no bamboogle: its averages (over two sets, against agent's three) do not
    # compare, and say so
    assert second == "| rag | 0.300 | 0.250 | n/a | n/a | n/a | n/a |"
    assert note.startswith("averages: n/a for a run that lacks")

    r = CliRunner().invoke(app, ["table", str(agent), str(rag), "--metric", "f1"])
    assert r.exit_code == 0, r.output
    assert "| agent · policy-7b | 0.450 | 0.250 | 0.150 |" in r.output
    assert "| rag · policy-7b | 0.350 | 0.300 | n/a |" in r.output
    r = CliRunner().invoke(app, ["table", str(tmp_path)])
    assert r.exit_code == 2 and "no metrics.json" in r.output

    # an evaluation over suite sets carries the averages and prints the layout
    t = Trajectory(example_id="q", group_id="q", question="q?", golden_answers=["x"],
                   token_ids=[0, 1], loss_mask=[0, 1], prompt_len=1,
                   steps=[Step(start=1, end=2, action="answer", answer="x")], answer="x",
                   finish_reason="answer", dataset="musique")
    scored = score_trajectories([t])
    assert scored["hops"]["multi"]["em"] == 1.0
    assert "## Search-R1 / FlashRAG layout" in metrics_markdown(scored)


def test_standard_recipe_at_toy_scale(hotpotqa_dir: Path, tmp_path: Path, tiny,
                                      monkeypatch) -> None:
    """The README's standard-benchmark recipe on the shared HotpotQA sample: a FlashRAG
    mirror, a Search-R1-style faiss index imported without re-encoding, agent and rag
    evaluations over `flashrag:hotpotqa`, compared with `seekrl table`."""
    import shutil

    import faiss
    from typer.testing import CliRunner

    from seekrl.cli import app
    from seekrl.retrieval.corpus import iter_corpus
    from seekrl.retrieval.dense import load_encoder

    mirror = tmp_path / "flashrag" / "hotpotqa"
    mirror.mkdir(parents=True)
    shutil.copy(hotpotqa_dir / "questions.jsonl", mirror / "dev.jsonl")
    monkeypatch.setenv("SEEKRL_FLASHRAG_DIR", str(tmp_path / "flashrag"))
    # the index as Search-R1 ships one: vectors of the corpus lines, in order, in a flat file
    texts = [c for _, c in iter_corpus(hotpotqa_dir / "corpus.jsonl")]
    vectors = load_encoder(None).encode(texts, batch_size=64, normalize_embeddings=True)
    flat = faiss.IndexFlatIP(vectors.shape[1])
    flat.add(vectors)
    faiss.write_index(flat, str(tmp_path / "e5_Flat.index"))
    model, tok = tiny
    model.save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")

    runner = CliRunner()

    def run(*args) -> str:
        r = runner.invoke(app, [str(a) for a in args], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        return r.output

    run("index", "--corpus", hotpotqa_dir / "corpus.jsonl", "--out", tmp_path / "wiki",
        "--faiss", tmp_path / "e5_Flat.index", "--encoder", "all-MiniLM-L6-v2")
    for method in ("agent", "rag"):
        run("eval", "--model", tmp_path / "tiny", "--data", "flashrag:hotpotqa", "--index",
            tmp_path / "wiki", "--limit", 3, "--max-turns", 2, "--max-new-tokens", 8,
            "--method", method, "--out", tmp_path / f"eval-{method}")
    metrics = json.loads((tmp_path / "eval-rag" / "metrics.json").read_text())
    assert list(metrics["datasets"]) == ["hotpotqa"] and metrics["datasets"]["hotpotqa"][
        "questions"] == 3
    assert metrics["hops"]["multi"]["datasets"] == 1
    assert metrics["datasets"]["hotpotqa"]["evidence_recall"] is not None   # rag retrieved
    assert metrics["config"]["protocol"]["instruction_sha256"]
    out = run("table", tmp_path / "eval-agent", tmp_path / "eval-rag")
    assert "| | hotpotqa | single-hop avg. | multi-hop avg. | avg. |" in out
    assert "| agent · tiny |" in out and "| rag · tiny |" in out


@needs_datasets
def test_skip_bad_rows_of_an_hf_dataset_are_reported_not_fatal(tmp_path: Path) -> None:
    import datasets

    from seekrl.data.jsonl import SkipReport

    rows = {"id": ["a", "b", "c"], "question": ["Who?", "", "Where?"],
            "answer": ["Ann", "Bo", "Paris"]}
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "d"))
    with pytest.raises(DataError, match="field 'question'"):
        load_qa(f"hf:{tmp_path / 'd'}:test")
    report = SkipReport()
    kept = load_qa(f"hf:{tmp_path / 'd'}:test", skip_bad=True, report=report)
    assert [e.id for e in kept] == ["a", "c"] and report.count == 1
    assert report.skipped[0][0] == 2 and "question" in report.skipped[0][1]


def test_training_reads_the_train_split_of_a_folder(tmp_path: Path, monkeypatch) -> None:
    folder = tmp_path / "nq"
    _write_jsonl(folder / "train.jsonl", _rows("t", 2))
    _write_jsonl(folder / "test.jsonl", _rows("e", 3))
    assert [e.id for e in load_qa(folder, "train")] == ["t0", "t1"]
    monkeypatch.setenv("SEEKRL_FLASHRAG_DIR", str(tmp_path))
    assert [e.id for e in load_qa("flashrag:nq", "train")] == ["t0", "t1"]
    assert [e.id for e in load_qa("flashrag:nq:test", "train")] == ["e0", "e1", "e2"]  # named
    # a split other than the one the papers report is named apart in the tables
    assert dataset_name("flashrag:nq:train") == "nq-train"
    assert dataset_name("flashrag:nq:test") == dataset_name("flashrag:nq") == "nq"
    assert dataset_name(f"{folder}:train") == "nq-train" and dataset_name(f"{folder}:test") == "nq"


def test_the_suite_tables_header_and_separator_have_as_many_cells_with_no_sets():
    from seekrl.eval.report import suite_table

    for datasets in ({}, {"nq": {"em": 0.5}}):
        header, separator, *_ = suite_table([("run", {"datasets": datasets})]).splitlines()
        assert header.count("|") == separator.count("|"), (header, separator)


def test_static_decode_says_how_far_two_backends_tokens_agree():
    from conftest import load_bench

    agreement = load_bench("static_decode").agreement
    assert agreement([[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 9, 6]]) == (1, pytest.approx(2 / 3))
    assert agreement([[1, 2], [7]], [[1, 2, 5], [8]]) == (0, pytest.approx((2 / 3 + 0) / 2))
    assert agreement([], []) == (0, 0.0)


def test_rollout_bench_runs_backends_side_by_side(capsys, monkeypatch):
    """bench/rollout.py --backend hf,static: both on the same questions in one process,
    the static one's tokens/s against the HF loop's and whether their greedy tokens agree;
    several backends want --baseline none."""
    import sys

    from conftest import load_bench

    bench = load_bench("rollout")
    argv = ["rollout.py", "--arch", "tiny", "--backend", "hf,static", "--baseline", "none",
            "--batches", "2", "--questions", "2", "--max-new-tokens", "4", "--max-turns", "2"]
    monkeypatch.setattr(sys, "argv", argv)
    bench.main()
    out = capsys.readouterr().out
    summary = out.strip().splitlines()[-1]
    assert summary.startswith("summary: ratio_static_b2=") and "same_tokens_static=1" in summary
    assert "hf_b2=" in summary and "static_b2=" in summary and summary.endswith("against=hf")
    assert "static: engine_backend=StaticBackend" in out and "static_batched_b2_tok_s=" in out
    assert "static_batched_b2_graphs=off" in out             # on CPU: said, not assumed
    monkeypatch.setattr(sys, "argv", [*argv[:-8], "--baseline", "sequential"])
    with pytest.raises(SystemExit):
        bench.main()
