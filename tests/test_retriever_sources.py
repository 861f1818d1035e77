"""Every retriever source of every command that takes one, end to end through the CLI: an
index folder, a running `seekrl serve` (of an index, of an index with its own ranker, of a
simulated engine), your own retriever by import path (with and without --index, by module
or by file), and a ranker over each. The tiny random model, one question, a few tokens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from seekrl.cli import app

runner = CliRunner()
REPO = Path(__file__).resolve().parent.parent

# a retriever that takes no index (a module beside nothing: imported by file or from its folder)
OWN_RETRIEVER = '''
from seekrl.retrieval.base import Hit


class Fixed:
    """The same two documents for every query."""

    def search(self, queries, k):
        docs = [Hit("own-1", "Own", "an own document", 2.0), Hit("own-2", "Two", "another", 1.0)]
        return [docs[:k] for _ in queries]
'''


def run(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A small world, its BM25 index, the tiny model (policy and simulator), a tiny random
    encoder (a ranker) and an own retriever module, on disk."""
    from conftest import build_lab
    from transformers import AutoTokenizer, BertConfig, BertModel

    from seekrl.retrieval.dense import bundled_encoder_path

    root = tmp_path_factory.mktemp("sources")
    _, paths, index_dir, model_dir = build_lab(root)
    enc = root / "enc"
    tok = AutoTokenizer.from_pretrained(bundled_encoder_path())
    import torch

    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=2, intermediate_size=64,
                         max_position_embeddings=128)).save_pretrained(enc)
    tok.save_pretrained(enc)
    (root / "plug").mkdir()
    (root / "plug" / "ownret.py").write_text(OWN_RETRIEVER)
    return {"root": root, "index": index_dir, "model": model_dir, "test": paths["test"],
            "corpus": paths["corpus"], "encoder": enc, "plug": root / "plug" / "ownret.py"}


class Served:
    """`seekrl serve ARGS --port 0` in a child process on loopback; its url from the line it
    prints."""

    def __init__(self, *args):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "seekrl.cli", "serve", *map(str, args), "--port", "0",
             "--host", "127.0.0.1", "--log-level", "warning"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
        deadline = time.monotonic() + 120
        seen = []
        for line in self.proc.stdout:
            seen.append(line)
            if line.startswith("serving "):
                self.url = line.split(" on ")[1].split("/retrieve")[0]
                break
            assert time.monotonic() < deadline, "".join(seen)
        else:
            raise AssertionError("seekrl serve stopped: " + "".join(seen))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


class Servers:
    """The module's servers, each started when a test first asks for it: an index, the
    index behind a ranker, a simulator."""

    def __init__(self, lab):
        self.args = {"index": ["--index", lab["index"]],
                     "ranked": ["--index", lab["index"], "--ranker", lab["encoder"],
                                "--candidates", "4"],
                     "simulated": ["--simulate", lab["model"], "--sim-max-new-tokens", "12",
                                   "--sim-temperature", "0"]}
        self.running: dict[str, Served] = {}

    def __getitem__(self, name: str) -> str:
        if name not in self.running:
            self.running[name] = Served(*self.args[name])
        return self.running[name].url

    def close(self):
        for server in self.running.values():
            server.__exit__(None, None, None)


@pytest.fixture(scope="module")
def servers(lab):
    started = Servers(lab)
    yield started
    started.close()


def _eval(lab, out: Path, *source, method: str = "rag"):
    r = run("eval", "--model", lab["model"], "--data", lab["test"], "--out", out,
            "--method", method, "--limit", "1", "--max-new-tokens", "4", "--max-turns", "2",
            *source)
    assert r.exit_code == 0, r.output
    metrics = json.loads((out / "metrics.json").read_text())
    trajs = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    return metrics, trajs


# what each source is given on the command line (the url and plug-in ones filled in below)
SOURCES = ["index", "url", "url-ranked-by-server", "url-simulated", "own", "own-with-index",
           "own-by-file"]


def _source(name: str, lab, servers) -> list:
    served = {"url": "index", "url-ranked-by-server": "ranked", "url-simulated": "simulated"}
    if name in served:
        return ["--retriever-url", servers[served[name]]]
    return {"index": ["--index", lab["index"]],
            # a module by its name, from the folder it is in (the working directory)
            "own": ["--retriever", "ownret:Fixed"],
            # examples/my_parts.py's KeywordRetriever is made with --index's value
            "own-with-index": ["--retriever", "examples.my_parts:KeywordRetriever",
                               "--index", lab["corpus"]],
            "own-by-file": ["--retriever", f"{lab['plug']}:Fixed"]}[name]


@pytest.mark.parametrize("ranker", [False, True], ids=["alone", "ranker"])
@pytest.mark.parametrize("source", SOURCES)
def test_eval_runs_with_every_retriever_source(lab, servers, tmp_path, own_parts, monkeypatch,
                                               source, ranker):
    """`eval --retriever-url` and `--retriever` without `--index` always failed (the
    check for a missing retriever fired whenever --index was absent)."""
    # own_parts: the working directory is the repository (examples.my_parts imports from
    # it) and sys.path is restored; `own` imports ownret from its folder, `own-by-file` from
    # elsewhere
    if source == "own":
        monkeypatch.chdir(lab["plug"].parent)
    elif source == "own-by-file":
        monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "ownret", raising=False)
    extra = ["--ranker", lab["encoder"], "--candidates", "3"] if ranker else []
    metrics, trajs = _eval(lab, tmp_path / "run", *_source(source, lab, servers), *extra)
    assert metrics["datasets"]["world"]["questions"] == 1
    info = metrics["config"]["retriever"]
    if ranker:
        assert metrics["config"]["ranker"] == str(lab["encoder"])
        assert info["type"] == "RerankingRetriever"
    elif source.startswith("url"):
        assert info["type"] == "remote" and info["url"] == _source(source, lab, servers)[1]
        expected = {"url": "bm25", "url-ranked-by-server": "bm25"}.get(source)
        if expected:
            assert info["manifest"]["retriever"] == expected
        if source == "url-ranked-by-server":
            assert info["manifest"]["ranker"] == str(lab["encoder"])
        if source == "url-simulated":
            assert info["manifest"]["type"] == "simulated"
    elif source == "index":
        assert info["type"] == "index"
    else:
        assert info["type"] in ("Fixed", "KeywordRetriever")
    (t,) = trajs
    if source != "url-simulated":   # the random simulator may write no parsable document
        assert t["prompt_hits"], t    # rag retrieved with the question
    if source in ("own", "own-by-file"):
        assert set(t["prompt_hits"]) <= {"own-1", "own-2"}


def test_eval_agent_with_a_server_alone(lab, servers, tmp_path):
    """The reported command: `seekrl eval --retriever-url URL` with the default agent."""
    metrics, _ = _eval(lab, tmp_path / "agent", "--retriever-url", servers["index"],
                       method="agent")
    assert metrics["config"]["rollout"]["method"] == "agent"
    assert metrics["config"]["retriever"]["type"] == "remote"


def test_eval_without_any_retriever_is_refused_but_direct_needs_none(lab, tmp_path):
    for method in ("agent", "rag"):
        r = run("eval", "--model", lab["model"], "--data", lab["test"], "--out", tmp_path / "x",
                "--method", method)
        text = " ".join(r.output.split())
        assert r.exit_code == 2 and f"method {method!r} needs --index DIR, --retriever-url " \
            "URL or --retriever MODULE:ATTR" in text, r.output
    r = run("eval", "--model", lab["model"], "--data", lab["test"], "--out", tmp_path / "x",
            "--ranker", lab["encoder"], "--method", "direct", "--limit", "1")
    assert r.exit_code == 2 and "--ranker: method 'direct' answers without searching" \
        in r.output

    r = run("eval", "--model", lab["model"], "--data", lab["test"], "--out", tmp_path / "x",
            "--index", lab["index"], "--retriever-url", "http://127.0.0.1:9")
    assert r.exit_code == 2 and "not both" in r.output


def test_eval_and_serve_refuse_option_clashes_before_reading_anything(lab, tmp_path):
    """Options that cannot go together are refused before the data is read (a file that is
    not there would otherwise be the error), and --candidates without --ranker is refused
    where it was ignored."""
    missing = tmp_path / "no-such-questions.jsonl"
    for flags, said in ((["--index", lab["index"], "--retriever-url", "http://127.0.0.1:9"],
                         "give one of --index DIR or --retriever-url URL, not both"),
                        (["--retriever", "x:y", "--retriever-url", "http://127.0.0.1:9"],
                         "give one of --retriever MODULE:ATTR or --retriever-url URL, not both"),
                        (["--index", lab["index"], "--candidates", "5"],
                         "--candidates 5: the first-stage documents a --ranker orders")):
        r = run("eval", "--model", lab["model"], "--data", missing, "--out", tmp_path / "x",
                *flags)
        text = " ".join(r.output.split())
        assert r.exit_code == 2 and said in text, r.output
    r = run("eval", "--model", lab["model"], "--data", missing, "--out", tmp_path / "x",
            "--index", lab["index"], "--ranker", lab["encoder"], "--candidates", "0")
    assert r.exit_code == 2 and "--candidates: expected at least 1, got 0" in r.output
    r = run("serve", "--index", lab["index"], "--candidates", "5", "--port", "9")
    text = " ".join(r.output.split())
    assert r.exit_code == 2 and "give --ranker too" in text, r.output


@pytest.mark.parametrize("source", ["index", "url", "url-ranked-by-server", "url-simulated"])
def test_search_with_every_source(lab, servers, source):
    served = {"url": "index", "url-ranked-by-server": "ranked", "url-simulated": "simulated"}
    flags = ["--index", lab["index"]] if source == "index" else \
        ["--url", servers[served[source]]]
    r = run("search", *flags, "-k", "2", "who founded it")
    assert r.exit_code == 0, r.output
    assert "who founded it" in r.output


def test_ranker_eval_over_the_index_with_a_ranker(lab):
    r = run("ranker", "eval", "--index", lab["index"], "--data", lab["test"], "--ranker",
            lab["encoder"], "--candidates", "4", "--topk", "2")
    assert r.exit_code == 0, r.output
    assert "recall@2 first_stage=" in r.output and f"recall@2 {lab['encoder']}=" in \
        r.output.replace("\n", "")


@pytest.mark.parametrize("source", ["url", "own-by-file"])
def test_train_steps_with_a_served_index_or_an_own_retriever(lab, servers, tmp_path, own_parts,
                                                             source):
    """The config's `index` takes a server's url, `retriever` a plug-in by file path (from
    another working directory): one RL step of the tiny model with each."""
    keys = {"url": [f"index={servers['index']}"],
            "own-by-file": [f"retriever={lab['plug']}:Fixed"]}[source]
    out = tmp_path / "rl"
    r = run("train", f"data={lab['test']}", f"model={lab['model']}", f"out={out}", "steps=1",
            "questions_per_step=2", "group_size=2", "rollout.max_turns=2",
            "rollout.max_new_tokens=4", "rollout.max_info_tokens=32", "rollout.topk=2",
            "algo.mini_batch_size=2", "algo.micro_batch_size=1", "eval.at_start=false",
            "--threads", "1", *keys)
    assert r.exit_code == 0, r.output
    assert (out / "final" / "config.json").is_file()
    assert "threads: 1 of " in r.output
