"""The `seekrl` command end to end: world -> index -> search -> oracle, and bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from seekrl.cli import app

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A small world, its BM25 index, oracle episodes and the tiny model saved to disk: what
    the sft / train commands read (paths as strings)."""
    from conftest import build_lab

    from seekrl.agent.oracle import write_oracle_trajectories
    from seekrl.data.qa import read_qa_jsonl
    from seekrl.retrieval.index import load_index

    root = tmp_path_factory.mktemp("cli-lab")
    _, paths, index_dir, _ = build_lab(root)
    write_oracle_trajectories(read_qa_jsonl(paths["train"])[:8], load_index(index_dir),
                              root / "oracle.jsonl", k=2)
    return {"root": root, "world": paths["corpus"].parent, "index": index_dir,
            "train": paths["train"], "dev": paths["dev"], "model": root / "tiny",
            "oracle": root / "oracle.jsonl"}


# the smallest RL run of the tiny model (one question pair, two short turns)
SMALL_RL = ["questions_per_step=2", "group_size=2", "save_every=1", "rollout.max_turns=2",
            "rollout.max_new_tokens=6", "rollout.max_info_tokens=48", "rollout.topk=2",
            "algo.mini_batch_size=2", "algo.micro_batch_size=1", "optim.lr=1e-3"]


def finished_run(out: Path) -> dict[str, str]:
    """A run folder as a finished run leaves it (metrics of two steps, a checkpoint, the
    final model): {relative path: content} to compare with afterwards."""
    files = {"metrics.jsonl": '{"step": 1, "loss": 1.0}\n{"step": 2, "loss": 0.5}\n',
             "config.yaml": "out: old\n", "checkpoints/latest": "step-2",
             "final/model.safetensors": "weights"}
    for name, text in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    return files


def untouched(out: Path, files: dict[str, str]) -> bool:
    return all((out / name).is_file() and (out / name).read_text() == text
               for name, text in files.items())


def test_world_index_search_oracle(tmp_path):
    w = tmp_path / "world"
    r = run("world", "--out", w, "--seed", 1, "--entities", 200, "--train", 40, "--dev", 10,
            "--test", 10, "--difficulty", "hard")
    assert r.exit_code == 0, r.output
    assert "documents" in r.output
    assert json.loads((w / "world.json").read_text())["config"]["difficulty"] == "hard"

    r = run("index", "--corpus", w / "corpus.jsonl", "--out", tmp_path / "idx")
    assert r.exit_code == 0, r.output
    assert "indexed" in r.output

    title = json.loads((w / "corpus.jsonl").read_text().splitlines()[0])["contents"].split("\n")[0]
    r = run("search", "--index", tmp_path / "idx", "-k", 2, title)
    assert r.exit_code == 0, r.output
    assert title in r.output

    r = run("oracle", "--world", w, "--index", tmp_path / "idx", "--out", tmp_path / "o.jsonl",
            "--limit", 5)
    assert r.exit_code == 0, r.output
    assert len((tmp_path / "o.jsonl").read_text().splitlines()) == 5
    r = run("oracle", "--world", w, "--index", tmp_path / "idx", "--out", tmp_path / "n.jsonl",
            "--limit", 5, "--plan", "none")
    assert r.exit_code == 0, r.output
    assert "lookup" not in (tmp_path / "n.jsonl").read_text()
    # refused before the index loads (a dense one loads its encoder): no index here
    r = run("oracle", "--world", w, "--index", tmp_path / "no-idx", "--out",
            tmp_path / "x.jsonl", "--max-queries", 9)
    assert r.exit_code == 2 and "--max-queries: expected 1 to 8, got 9" in r.output, r.output
    r = run("oracle", "--world", w, "--index", tmp_path / "idx", "--out", tmp_path / "x.jsonl",
            "--plan", "steps")
    assert r.exit_code == 2 and "plan: expected one of count, none, got 'steps'" in r.output
    assert not (tmp_path / "x.jsonl").exists()
    r = run("oracle", "--world", w, "--index", tmp_path / "idx", "--out", tmp_path / "j.jsonl",
            "--judge", "ordered")
    assert r.exit_code == 0, r.output
    compared = [line for line in (tmp_path / "j.jsonl").read_text().splitlines()
                if "Comparing: " in line]
    assert compared and all(re.search(r"From smallest to largest: | are (the same|different)\.",
                                      line) for line in compared)
    r = run("oracle", "--world", w, "--index", tmp_path / "idx", "--out", tmp_path / "x.jsonl",
            "--judge", "sorted")
    assert r.exit_code == 2 and "judge: expected one of values, ordered, got 'sorted'" in r.output
    assert not (tmp_path / "x.jsonl").exists()

    # a second index into the same folder is refused, not silently replaced
    r = run("index", "--corpus", w / "corpus.jsonl", "--out", tmp_path / "idx")
    assert r.exit_code == 2 and "already holds an index" in r.output
    # in the command's own words (it said "pass overwrite=True (--overwrite)"), and in
    # Python's from Python
    assert "pass --overwrite to replace them" in " ".join(r.output.split())
    assert "overwrite=True" not in r.output
    from seekrl.retrieval.index import build_index

    with pytest.raises(FileExistsError) as err:
        build_index(w / "corpus.jsonl", tmp_path / "idx", "bm25")
    assert str(err.value) == f"{tmp_path / 'idx'} already holds an index; pass " \
        "overwrite=True to replace them"


def test_bad_inputs_exit_2_with_a_clear_message(tmp_path):
    r = run("world", "--out", tmp_path / "w", "--difficulty", "impossible")
    assert r.exit_code == 2 and "difficulty" in r.output
    r = run("world", "--out", tmp_path / "w", "--hop-mix", "2-0.5")
    assert r.exit_code == 2 and "--hop-mix: '2-0.5' is not HOPS:WEIGHT" in r.output
    r = run("world", "--out", tmp_path / "w", "--doc-words", "30")
    assert r.exit_code == 2 and "--doc-words: '30' is not LOW,HIGH" in r.output
    r = run("world", "--out", tmp_path / "w", "--doc-words", "30,12")
    assert r.exit_code == 2 and "--doc-words: expected (low, high) with 0 <= low < high" \
        in r.output
    for flags, said in ((["--hop-mix", "2:0.5,2:0.3"], "--hop-mix: 2 hops given twice"),
                        (["--hop-mix", "2:nan"], "--hop-mix: weights must be finite"),
                        (["--hop-mix", "2:inf,3:1"], "--hop-mix: weights must be finite"),
                        (["--distractors", "nan"], "--distractors: expected a finite mean >= 0"),
                        (["--distractors", "-1"], "--distractors: expected a finite mean >= 0"),
                        (["--train", "-5"], "--train: expected a number of questions >= 0")):
        r = run("world", "--out", tmp_path / "w", *flags)
        assert r.exit_code == 2 and said in r.output, (flags, r.output)
    assert not (tmp_path / "w").exists()

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "contents": "Tarrow\\nA city by the river."}\n{"id": "b"}\n')
    r = run("index", "--corpus", bad, "--out", tmp_path / "i1")
    assert r.exit_code == 2
    assert "bad.jsonl:2" in r.output and "contents" in r.output
    r = run("index", "--corpus", bad, "--out", tmp_path / "i2", "--skip-bad")
    assert r.exit_code == 0 and "skipped 1 bad lines" in r.output
    assert "line 2: " in r.output and "contents" in r.output   # and why

    r = run("search", "--index", tmp_path / "nowhere", "x")
    assert r.exit_code == 2 and "not a seekrl index" in r.output
    r = run("search", "x")
    assert r.exit_code == 2 and "--index" in r.output


def test_train_process_option_sets_the_methods_keys(tmp_path, monkeypatch):
    import seekrl.recipes.train

    seen = {}

    class FakeTrainer:
        def __init__(self, cfg, **kw):
            seen["cfg"] = cfg

        def train(self):
            return {"final": "nowhere"}

    monkeypatch.setattr(seekrl.recipes.train, "Trainer", FakeTrainer)
    r = run("train", "--process", "evidence", "data=q.jsonl", "index=idx", "algo.beta=0.5")
    assert r.exit_code == 0, r.output
    cfg = seen["cfg"]
    assert cfg.algo.advantage == "dual_granularity" and cfg.algo.beta == 0.5
    assert cfg.reward.process == {"evidence": 1.0, "redundancy": 0.2}
    r = run("train", "--process", "tree", "data=q.jsonl", "index=idx", "group_size=6")
    assert r.exit_code == 0, r.output
    assert seen["cfg"].rollout.tree.trees == 3 and seen["cfg"].algo.advantage == "tree_grpo"
    r = run("train", "--process", "prm", "data=q.jsonl", "index=idx", "reward.prm=runs/prm")
    assert r.exit_code == 0, r.output
    assert seen["cfg"].reward.process == {"prm": 1.0} and seen["cfg"].reward.prm == "runs/prm"
    assert seen["cfg"].algo.advantage == "dual_granularity"
    r = run("train", "--process", "magic", "data=q.jsonl")
    assert r.exit_code == 2 and "process method: expected one of" in r.output
    r = run("train", "--process", "tree", "data=q.jsonl", "group_size=3")
    assert r.exit_code == 2 and "group_size must be even" in r.output


def test_an_unknown_config_key_says_which_was_meant(tmp_path):
    """The list of keys alone left the reader to spot `temprature` among 40 names."""
    from seekrl.config import ConfigError, TrainConfig, build_config, load_config

    for override, hint in (("rollout.temprature=0.7", "(did you mean temperature?)"),
                           ("stpes=3", "(did you mean steps?)"),
                           ("algo.clip_lo=0.1", "(did you mean clip_low?)"),
                           ("warmup_steps=5", "(did you mean optim.warmup_steps?)")):
        with pytest.raises(ConfigError) as err:
            build_config(TrainConfig, {"data": "q.jsonl"}, [override])
        text = str(err.value)
        assert f"{override.split('=')[0]}: unknown key; expected one of " in text, text
        assert text.endswith(hint) and "\n" not in text, text
    with pytest.raises(ConfigError) as err:   # nothing alike: the list alone
        build_config(TrainConfig, {"data": "q.jsonl"}, ["zzz=1"])
    assert "did you mean" not in str(err.value)
    config = tmp_path / "rl.yaml"   # a file's key too, and through the command
    config.write_text("data: q.jsonl\noptim:\n  lrr: 1.0e-5\n")
    with pytest.raises(ConfigError, match=r"optim\.lrr: unknown key; .* \(did you mean lr\?\)$"):
        load_config(TrainConfig, config, [])
    r = run("mcts", "data=x.jsonl", "search.simulatons=3")
    assert r.exit_code == 2 and "(did you mean simulations?)" in r.output, r.output


def test_a_refused_value_is_named_once_even_where_the_message_holds_it():
    """pydantic's bound (`greater than 0`) is not the value: `optim.lr=0` says what it got;
    a seekrl check that says it already is not repeated."""
    from seekrl.config import ConfigError, TrainConfig, build_config

    with pytest.raises(ConfigError, match=r"optim\.lr: Input should be greater than 0 \(got 0\)$"):
        build_config(TrainConfig, {"data": "q.jsonl"}, ["optim.lr=0"])
    with pytest.raises(ConfigError) as err:
        build_config(TrainConfig, {"data": "q.jsonl"}, ["dtype=float64"])
    assert str(err.value).count("float64") == 1, err.value


@pytest.mark.parametrize("command, schema, keys", [
    (["refine"], "RefineConfig", ["method=rft", "data=q.jsonl"]),
    (["mcts"], "LabelConfig", ["data=q.jsonl", "search.simulations=8"]),
    (["prm", "train"], "PRMConfig", ["labels=[runs/labels]"]),
    (["prorag"], "ProragConfig", ["out=runs/p"]),
    (["simulator", "train"], "SimulatorTrainConfig", ["index=data/index", "data=[q.jsonl]"]),
    (["ranker", "train"], "RankerTrainConfig", ["index=data/index", "data=[q.jsonl]"]),
])
def test_every_config_command_prints_its_config(command, schema, keys):
    """refine had no --print-config (sft and train did): every command that reads a config
    prints it resolved, as YAML that loads back to the same config, and runs nothing."""
    import yaml

    import seekrl.config as config_module

    cls = getattr(config_module, schema)
    r = run(*command, "--print-config", *keys)
    assert r.exit_code == 0, r.output
    assert cls.model_validate(yaml.safe_load(r.stdout)) == \
        config_module.load_config(cls, None, keys)
    assert "threads:" not in r.output   # nothing ran
    r = run(*command, "--print-config", *keys, "nosuch=1")
    assert r.exit_code == 2 and "nosuch: unknown key" in r.output


def test_refine_print_config_refuses_what_refine_would():
    r = run("refine", "--print-config", "method=step_dpo", "teacher=runs/t")
    assert r.exit_code == 2 and "teacher: only rft samples episodes" in r.output, r.output


@pytest.mark.parametrize("key, said", [
    ("rl.stepz=10", "prorag rl: stepz: unknown key"),          # a stage's key, in its preset
    ("labels.search.simulations=-3", "prorag labels: search.simulations"),
    ("train=x.jsonl", "train, test and index go together"),
])
def test_prorag_print_config_refuses_what_a_run_would(key, said):
    r = run("prorag", "--print-config", key)
    assert r.exit_code == 2 and said in r.output, r.output


@pytest.mark.parametrize("keys", [["data=q.jsonl", "out="], ["data=q.jsonl", "model="],
                                  ["data= "]])
def test_an_empty_path_is_refused(keys):
    # `out=` would write into the current folder, `model=` load nothing: slips, not settings
    r = run("train", "--print-config", *keys)
    key = keys[-1]
    assert r.exit_code == 2 and f"{key.split('=')[0]}: expected a path or name, got an " \
        "empty string" in r.output, r.output


@pytest.mark.parametrize("command", [["sft", "data=q.jsonl"], ["train", "data=q.jsonl"],
                                     ["prm", "train", "labels=[l]"], ["simulator", "train"],
                                     ["refine"], ["ranker", "train", "index=i", "data=[q]"]])
def test_resume_and_overwrite_together_are_refused_before_anything(command):
    r = run(*command, "--resume", "--overwrite", "--print-config")
    assert r.exit_code == 2 and "give one of --resume" in r.output, r.output


def test_process_supervision_commands_fail_fast_with_one_line(tmp_path):
    r = run("mcts", "data=" + str(tmp_path / "missing.jsonl"), f"out={tmp_path / 'labels'}")
    assert r.exit_code == 2 and "missing.jsonl" in r.output
    assert not (tmp_path / "labels").exists()          # nothing written before the check
    r = run("mcts", "data=x.jsonl", "search.simulatons=3")
    assert r.exit_code == 2 and "search.simulatons: unknown key" in r.output
    r = run("prm", "train", f"labels={tmp_path / 'nowhere'}", f"out={tmp_path / 'prm'}")
    assert r.exit_code == 2 and "no labels.jsonl" in r.output
    r = run("prm", "score", "--prm", tmp_path, "--trajectories", tmp_path / "t.jsonl",
            "--out", tmp_path / "s.jsonl")
    assert r.exit_code == 2
    r = run("refine", "method=step_dpo", f"out={tmp_path / 'r'}")
    assert r.exit_code == 2 and "pairs" in r.output
    r = run("prorag", f"out={tmp_path / 'p'}", "train=t.jsonl")
    assert r.exit_code == 2 and "train, test and index go together" in r.output


def test_prm_score_and_eval_on_files(tmp_path):
    import copy

    from seekrl.config import LabelConfig
    from seekrl.models import tiny_policy
    from seekrl.recipes.mcts import run_labelling
    from seekrl.recipes.prm import save_prm
    from seekrl.rewards.prm import ProcessRewardModel
    from tests.test_mcts import OPTIONS, Dice, questions
    from tests.test_rollout import Docs

    model, tok = tiny_policy(seed=0)
    run_labelling(LabelConfig(data="unused", out=str(tmp_path / "labels"),
                              search={"simulations": 6, "expansions": 3, "min_visits": 1,
                                      "min_gap": 0.01}, rollout={"max_turns": 3}),
                  backend=Dice(tok, OPTIONS), tokenizer=tok, retriever=Docs(),
                  questions=questions(6))
    save_prm(ProcessRewardModel(copy.deepcopy(model)), tok, tmp_path / "prm", {"dev_share": 0.5})
    r = run("prm", "score", "--prm", tmp_path / "prm", "--trajectories",
            tmp_path / "labels" / "labels.jsonl", "--out", tmp_path / "scored.jsonl")
    assert r.exit_code == 0, r.output
    scored = [json.loads(x) for x in (tmp_path / "scored.jsonl").read_text().splitlines()]
    assert scored and all(s["value"] == 0.5 for t in scored for s in t["steps"])  # zero head
    # a bad episode is named by file, line and field; ids past the vocabulary by episode
    lines = (tmp_path / "labels" / "labels.jsonl").read_text().splitlines()
    bad = json.loads(lines[1])
    bad["steps"][0]["end"] = len(bad["token_ids"]) + 5
    (tmp_path / "bad.jsonl").write_text("\n".join([lines[0], json.dumps(bad)]) + "\n")
    r = run("prm", "score", "--prm", tmp_path / "prm", "--trajectories", tmp_path / "bad.jsonl",
            "--out", tmp_path / "x.jsonl")
    assert r.exit_code == 2 and "bad.jsonl:2: field 'steps'" in r.output, r.output
    # an existing out (here the input itself) is kept unless --overwrite
    before = (tmp_path / "labels" / "labels.jsonl").read_text()
    r = run("prm", "score", "--prm", tmp_path / "prm", "--trajectories",
            tmp_path / "labels" / "labels.jsonl", "--out", tmp_path / "labels" / "labels.jsonl")
    assert r.exit_code == 2 and "already holds a file" in r.output and "--overwrite" in r.output
    assert (tmp_path / "labels" / "labels.jsonl").read_text() == before
    r = run("prm", "score", "--prm", tmp_path / "prm", "--trajectories",
            tmp_path / "labels" / "labels.jsonl", "--out", tmp_path / "scored.jsonl",
            "--overwrite")
    assert r.exit_code == 0, r.output
    alien = json.loads(lines[0])
    alien["token_ids"][0] = 10**6
    (tmp_path / "alien.jsonl").write_text(json.dumps(alien) + "\n")
    r = run("prm", "score", "--prm", tmp_path / "prm", "--trajectories",
            tmp_path / "alien.jsonl", "--out", tmp_path / "x.jsonl")
    assert r.exit_code == 2 and "alien.jsonl: field 'token_ids'" in r.output and \
        "another tokenizer" in r.output, r.output
    r = run("prm", "eval", "--prm", tmp_path / "prm", "--labels", tmp_path / "labels",
            "--split", "all")
    assert r.exit_code == 0, r.output
    figures = json.loads(r.stdout)   # the threads line goes to stderr
    assert figures["split"] == "all" and figures["pair_accuracy"] == 0.5   # all ties
    # without --threshold, the one the PRM was trained with (its prm.json); 0.5 had been
    # taken whatever the training's, so its figures differed from prm.json's unsaid
    info = json.loads((tmp_path / "prm" / "prm.json").read_text())
    (tmp_path / "prm" / "prm.json").write_text(json.dumps({**info, "threshold": 0.7}))
    for extra, used in (([], 0.7), (["--threshold", "0.4"], 0.4)):
        r = run("prm", "eval", "--prm", tmp_path / "prm", "--labels", tmp_path / "labels",
                "--split", "all", *extra)
        assert r.exit_code == 0 and json.loads(r.stdout)["threshold"] == used, r.output
    (tmp_path / "prm" / "prm.json").write_text(json.dumps(info))
    # a batch size below 1 scored nothing and wrote the input back; a threshold outside
    # (0, 1) put every step in one class (auc null, no error); a damaged prm.json was a
    # bare JSONDecodeError without its file
    r = run("prm", "score", "--prm", tmp_path / "prm", "--trajectories",
            tmp_path / "labels" / "labels.jsonl", "--out", tmp_path / "neg.jsonl",
            "--batch-size", "-1")
    assert r.exit_code == 2 and "--batch-size: expected" in r.output
    assert not (tmp_path / "neg.jsonl").exists()
    for threshold in ("2", "nan", "0"):
        r = run("prm", "eval", "--prm", tmp_path / "prm", "--labels", tmp_path / "labels",
                "--threshold", threshold)
        assert r.exit_code == 2 and "--threshold: expected" in r.output, r.output
    info = json.loads((tmp_path / "prm" / "prm.json").read_text())
    (tmp_path / "prm" / "prm.json").write_text(json.dumps({**info, "dev_share": 0}))
    r = run("prm", "eval", "--prm", tmp_path / "prm", "--labels", tmp_path / "labels")
    assert r.exit_code == 2 and "held out no questions" in " ".join(r.output.split())
    (tmp_path / "prm" / "prm.json").write_text("{broken")
    r = run("prm", "eval", "--prm", tmp_path / "prm", "--labels", tmp_path / "labels")
    assert r.exit_code == 2 and "prm.json: not valid JSON" in " ".join(r.output.split())


def test_sft_and_train_name_a_missing_data_file_before_loading_a_model(tmp_path, monkeypatch):
    import seekrl.models

    def no_model(*a, **k):
        raise AssertionError("a model was loaded before the data was checked")

    monkeypatch.setattr(seekrl.models, "load_policy", no_model)
    r = run("sft", f"data={tmp_path / 'missing.jsonl'}", f"out={tmp_path / 's'}")
    assert r.exit_code == 2 and "data: " in r.output and "missing.jsonl" in r.output
    r = run("train", f"data={tmp_path / 'missing.jsonl'}", f"out={tmp_path / 't'}",
            f"index={tmp_path}")
    assert r.exit_code == 2 and "data: " in r.output and "missing.jsonl" in r.output


def test_model_names_are_checked_before_the_hub_is_asked(tmp_path, monkeypatch):
    from seekrl import runtime
    from seekrl.models import ModelError, resolve_model

    monkeypatch.setattr(runtime, "_HUB", {"answer": None})   # a hub in reach: ids pass on

    with pytest.raises(ModelError, match="did you mean smollm2-135m"):
        resolve_model("smolm2-135m")
    with pytest.raises(ModelError, match="does not exist"):
        resolve_model(str(tmp_path / "no-such-checkpoint"))
    with pytest.raises(ModelError, match="does not exist"):
        resolve_model("./runs/sft/fianl")
    assert resolve_model("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert resolve_model("gpt2") == "gpt2"
    assert resolve_model(str(tmp_path)) == str(tmp_path)
    # a folder named like the bundled alias: the alias is loaded, and said so
    (tmp_path / "smollm2").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("seekrl.models.bundled_checkpoint", lambda: Path("/bundled"))
    with pytest.warns(UserWarning, match=r"write ./smollm2 to load it"):
        assert resolve_model("smollm2") == "/bundled"
    assert resolve_model("./smollm2") == "./smollm2"


def test_every_seekrl_error_has_one_base_the_cli_catches():
    from seekrl.cli import ERRORS
    from seekrl.config import ConfigError
    from seekrl.errors import DataError, SeekrlError
    from seekrl.models import ModelError
    from seekrl.retrieval.base import RetrievalError

    for cls in (DataError, ConfigError, ModelError, RetrievalError):
        assert issubclass(cls, SeekrlError)
    assert SeekrlError in ERRORS
    # the older built-in bases stay, for callers that catch those
    assert issubclass(DataError, ValueError) and issubclass(RetrievalError, RuntimeError)


def test_example_configs_are_the_docs_and_validate(tmp_path):
    """configs/*.yaml are the documentation's examples (docs/training.md, docs/extending.md),
    word for word, and each loads as its recipe's config; --print-config shows every key
    resolved."""
    import re
    from pathlib import Path

    import yaml

    from seekrl.config import SFTConfig, TrainConfig, load_config

    root = Path(__file__).resolve().parents[1]
    docs = "\n".join(p.read_text() for p in [root / "README.md",
                                               *sorted((root / "docs").rglob("*.md"))])
    blocks = dict((name, body) for body, name in re.findall(
        r"```yaml\n(# (\S+\.yaml)\n.*?)```", docs, re.S))
    files = sorted((root / "configs").glob("*.yaml"))
    assert {f.name for f in files} == set(blocks) == {"sft.yaml", "rl.yaml", "own_parts.yaml",
                                                      "sft-plan.yaml", "rl-long.yaml"}
    for f in files:
        assert f.read_text() == blocks[f.name], f"{f.name} differs from the docs'"
        schema = SFTConfig if f.name.startswith("sft") else TrainConfig
        load_config(schema, f, [])
    r = runner.invoke(app, ["train", "--config", str(root / "configs" / "rl.yaml"),
                            "--print-config", "algo.advantage=rloo"])
    assert r.exit_code == 0, r.output
    printed = yaml.safe_load(r.output)
    assert printed["algo"]["advantage"] == "rloo" and printed["algo"]["clip_ratio_c"] == 3.0
    assert printed["model"] == "runs/sft/final"
    # every key with what it means (the schema's own comments), and it loads back as it was
    lines = r.output.splitlines()
    assert "save_every: 5  # checkpoint every N steps (0: final only)" in lines
    assert "  clip_ratio_c: 3.0  # dual clip: cap -A x c on negative A" in lines
    assert any(ln.startswith("  snippet_words: null  # a search shows") for ln in lines)
    cfg = load_config(TrainConfig, root / "configs" / "rl.yaml", ["algo.advantage=rloo"])
    assert TrainConfig.model_validate(printed) == cfg
    for schema in (SFTConfig, TrainConfig):   # comments never break the YAML
        from seekrl.config import annotated_yaml
        base = schema.model_validate({"data": "d.jsonl"})
        assert schema.model_validate(yaml.safe_load(annotated_yaml(base))) == base
    # --print-config runs the recipe's own check: a name the trainer would refuse is refused
    r = runner.invoke(app, ["train", "--config", str(root / "configs" / "rl.yaml"),
                            "--print-config", "algo.advantage=ppo2"])
    assert r.exit_code == 2 and "algo.advantage: expected one of" in r.output, r.output


def test_the_eval_options_are_the_episode_settings():
    """`seekrl eval`'s episode options take the episode settings' defaults (they once said
    96 vs 128), as the engine does, and an `eval:` section plays the run's own settings
    unless it sets a limit apart."""
    import inspect

    from seekrl.agent.rollout import RolloutConfig
    from seekrl.cli import eval_
    from seekrl.config import EvalConfig, RolloutSettings
    from seekrl.eval.evaluate import eval_settings

    engine, settings = RolloutConfig(), RolloutSettings()
    cli = {k: p.default for k, p in inspect.signature(eval_).parameters.items()}
    for key in ("method", "prompt", "topk", "max_queries", "max_turns", "max_new_tokens",
                "max_total_tokens", "batch_size", "attention"):
        assert getattr(engine, key) == getattr(settings, key) == cli[key], key
    assert cli["backend"] == settings.backend
    run = RolloutSettings(max_turns=6, max_new_tokens=200, batch_size=8, method="rag")
    assert eval_settings(EvalConfig(), run).model_dump(
        include={"max_turns", "max_new_tokens", "batch_size", "method"}) == \
        {"max_turns": 6, "max_new_tokens": 200, "batch_size": 8, "method": "agent"}
    assert eval_settings(EvalConfig(batch_size=64), run).batch_size == 64


def test_a_cuda_index_is_checked_even_when_empty(monkeypatch):
    """'cuda:' passed the check (an empty index skipped it) and failed later in torch."""
    import torch

    from seekrl.runtime import device_problem

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert device_problem("cuda") is None and device_problem("cuda:1") is None
    for bad in ("cuda:", "cuda:2", "cuda:x", "cuda:-1"):
        assert "expected cuda or cuda:N with N below 2" in device_problem(bad), bad


@pytest.mark.skipif(__import__("torch").cuda.is_available(),
                    reason="checks a machine without CUDA")
def test_asking_for_cuda_without_it_fails_in_one_line(tmp_path):
    from seekrl.config import ConfigError, TrainConfig, build_config
    from seekrl.errors import DeviceError
    from seekrl.runtime import check_device, device_problem

    assert device_problem("cpu") is None
    assert "expected cpu, cuda, cuda:N or mps, got 'tpu'" in device_problem("tpu")
    with pytest.raises(DeviceError, match="is a CPU build; install a CUDA build"):
        check_device("cuda:0")
    with pytest.raises(ConfigError) as err:
        build_config(TrainConfig, {"data": "q.jsonl"}, ["device=cuda"], "overrides")
    assert "device 'cuda': this torch" in str(err.value) and "device: device" not in str(err.value)
    with pytest.raises(ConfigError) as err:   # the key and the value said once each
        build_config(TrainConfig, {"data": "q.jsonl"}, ["device=cdua"], "overrides")
    assert str(err.value).count("device") == 1 and str(err.value).count("'cdua'") == 1
    q = tmp_path / "q.jsonl"
    q.write_text('{"id": "1", "question": "q?", "golden_answers": ["a"]}\n')
    for args in (["eval", "--data", q, "--out", tmp_path / "e", "--method", "direct",
                  "--device", "cuda"],
                 ["serve", "--index", tmp_path, "--device", "cuda"],
                 ["train", f"data={q}", "device=cuda", f"out={tmp_path / 'r'}"]):
        r = runner.invoke(app, [str(a) for a in args])
        assert r.exit_code == 2, (args, r.output)
        assert "CPU build" in r.output and "Traceback" not in r.output
        assert len([x for x in r.output.splitlines() if x.strip()]) <= 2, r.output


def test_eval_refuses_several_greedy_samples(tmp_path):
    q = tmp_path / "q.jsonl"
    q.write_text('{"id": "1", "question": "q?", "golden_answers": ["a"]}\n')
    r = run("eval", "--data", q, "--out", tmp_path / "e", "--method", "direct",
            "--n-samples", "4", "--temperature", "0")
    assert r.exit_code == 2 and "pass@K would be pass@1" in r.output, r.output
    assert not (tmp_path / "e").exists()


def test_bad_numbers_are_named_by_their_flag(tmp_path):
    """The library's key names (`n_samples`, `limit`, `n_train`) were shown for options
    typed as --n-samples, --limit and --train."""
    q = tmp_path / "q.jsonl"
    q.write_text('{"id": "1", "question": "q?", "golden_answers": ["a"]}\n')
    for args, said in ((["eval", "--data", q, "--out", tmp_path / "e", "--method", "direct",
                         "--n-samples", "0"], "error: --n-samples: expected at least 1"),
                       (["eval", "--data", q, "--out", tmp_path / "e", "--method", "direct",
                         "--limit", "-1"], "error: --limit: expected at least 1"),
                       (["world", "--out", tmp_path / "w", "--train", "-5"],
                        "error: --train: expected a number of questions"),
                       (["world", "--out", tmp_path / "w", "--comparison-share", "2"],
                        "error: --comparison-share: expected")):
        r = run(*args)
        assert r.exit_code == 2 and said in r.output, (args, r.output)


def test_eval_direct_refuses_a_retriever_it_would_not_use(tmp_path):
    """`direct` never searches: --index and --ranker were loaded and then unused."""
    q = tmp_path / "q.jsonl"
    q.write_text('{"id": "1", "question": "q?", "golden_answers": ["a"]}\n')
    r = run("eval", "--data", q, "--out", tmp_path / "e", "--method", "direct",
            "--index", tmp_path, "--ranker", tmp_path)
    assert r.exit_code == 2 and "--index, --ranker: method 'direct' answers without " \
        "searching" in " ".join(r.output.split()), r.output
    assert not (tmp_path / "e").exists()
    # nor does it read the agent's prompt, tools or sub-queries (they were ignored unsaid)
    r = run("eval", "--data", q, "--out", tmp_path / "e", "--method", "direct",
            "--prompt", "search_r1", "--tool", "open", "--max-queries", "3")
    assert r.exit_code == 2 and "--prompt, --tool, --max-queries: method 'direct' answers " \
        "without searching" in " ".join(r.output.split()), r.output


def test_eval_refuses_its_settings_before_reading_the_data_or_the_index(tmp_path):
    """A bad --dtype, --backend or --out was refused only after the questions, the index
    and the ranker had loaded: here none of those exists, and the setting is named."""
    missing = tmp_path / "missing.jsonl"
    (tmp_path / "afile").write_text("x")
    for extra, said in ((["--dtype", "bogus"], "--dtype: expected one of"),
                        (["--backend", "vllm", "--device", "cpu"], "--backend:"),
                        (["--out", tmp_path / "afile"], "a file; expected a folder")):
        args = ["eval", "--data", missing, "--index", tmp_path / "no-index",
                "--out", tmp_path / "e", *extra]
        r = run(*args)
        assert r.exit_code == 2 and said in " ".join(r.output.split()), (extra, r.output)


def test_serve_refuses_a_log_level_before_loading_the_index(tmp_path, monkeypatch):
    import seekrl.retrieval.index

    monkeypatch.setattr(seekrl.retrieval.index, "load_index",
                        lambda *a, **k: pytest.fail("the index was loaded"))
    r = run("serve", "--index", tmp_path, "--log-level", "bogus")
    assert r.exit_code == 2 and "log level: expected one of" in r.output \
        and "'bogus'" in r.output, r.output


def test_serve_faiss_gpu_needs_a_cuda_device(tmp_path):
    r = run("serve", "--index", tmp_path, "--faiss-gpu")
    assert r.exit_code == 2 and "--device cuda" in r.output


def _child_peak(queue) -> None:
    from seekrl.runtime import peak_rss_mb

    queue.put(peak_rss_mb())


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="needs Linux /proc")
def test_peak_rss_is_the_process_own_not_its_parents():
    """A spawned child of a large parent reports its own peak, not the parent's (getrusage's
    ru_maxrss carries the parent's over exec: step records and benchmark children read it)."""
    import multiprocessing as mp

    import numpy as np

    from seekrl.runtime import peak_rss_mb

    ballast = np.ones(600 * 2**20 // 8)    # 600 MB touched in this process
    assert peak_rss_mb() > 600
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_peak, args=(queue,))
    child.start()
    got = queue.get(timeout=120)
    child.join()
    del ballast
    assert 0 < got < 300, got


def test_overwrite_checks_every_input_before_it_deletes_the_old_run(lab, tmp_path):
    """`--overwrite` with a bad input (a corrupt data line, a typo in eval.data, a wandb that
    is not installed, an index that is not there) fails naming it, and the finished run in
    out is still all there."""
    lines = lab["oracle"].read_text().splitlines()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines[:3] + ['{"question": "q?", "turns": 7}'] + lines[3:]) + "\n")
    out = tmp_path / "R"
    old = finished_run(out)
    r = run("sft", f"data={bad}", f"out={out}", f"model={lab['model']}", "max_steps=1",
            "--overwrite")
    assert r.exit_code == 2 and "bad.jsonl:4" in r.output and "turns" in r.output, r.output
    assert untouched(out, old)
    def replaced(keys: list[str], wrong: str) -> list[str]:   # a key is given once
        name = wrong.partition("=")[0]
        return [k for k in keys if k.partition("=")[0] != name] + [wrong]

    sft_keys = [f"data={lab['oracle']}", f"out={out}", f"model={lab['model']}",
                f"index={lab['index']}", f"eval.data={lab['dev']}"]
    for key in ("eval.data", "index"):
        wrong = {"eval.data": f"eval.data={tmp_path / 'dev.jsnol'}",
                 "index": f"index={tmp_path / 'no-index'}"}[key]
        r = run("sft", *replaced(sft_keys, wrong), "--overwrite")
        assert r.exit_code == 2 and wrong.partition("=")[2] in r.output, (key, r.output)
        assert untouched(out, old)
    common = [f"data={lab['train']}", f"index={lab['index']}", f"out={out}",
              f"model={lab['model']}", *SMALL_RL]
    for wrong, named in ((f"eval.data={tmp_path / 'dev.jsnol'}", "eval.data: "),
                         ("log.wandb=true", "log.wandb: "),
                         (f"data={tmp_path / 'train.jsnol'}", "train.jsnol"),
                         ("train_layers=99", "train_layers: ")):
        r = run("train", *replaced(common, wrong), "--overwrite")
        assert r.exit_code == 2 and named in r.output, (wrong, r.output)
        assert untouched(out, old), wrong
    # and a sound command does replace it
    r = run("sft", f"data={lab['oracle']}", f"out={out}", f"model={lab['model']}",
            "max_steps=1", "batch_size=2", "--overwrite")
    assert r.exit_code == 0, r.output
    assert not (out / "checkpoints").exists() and (out / "final" / "config.json").is_file()


def test_a_run_that_fails_at_start_does_not_block_its_retry(lab, tmp_path, monkeypatch):
    """A typo in eval.data, or log.wandb without wandb, is named before the model loads and
    leaves no folder; what an attempt that stopped before its first step left (a config,
    an empty metrics log, the step-0 evaluation) is not a run: the retry goes ahead, and
    --resume says why there is nothing to resume."""
    import seekrl.models
    from seekrl.config import ConfigError
    from seekrl.recipes.checkpoint import check_run_dir

    out = tmp_path / "R"
    common = ["train", f"data={lab['train']}", f"index={lab['index']}", f"out={out}",
              f"model={lab['model']}", *SMALL_RL]
    real_load = seekrl.models.load_policy

    def no_model(*a, **k):
        raise AssertionError("a model was loaded before the config was checked")

    monkeypatch.setattr(seekrl.models, "load_policy", no_model)
    r = run(*common, f"eval.data={tmp_path / 'dev.jsnol'}")
    assert r.exit_code == 2 and "eval.data: " in r.output and "dev.jsnol" in r.output, r.output
    r = run(*common, "log.wandb=true")
    assert r.exit_code == 2 and "log.wandb: needs the wandb package" in r.output, r.output
    r = run("sft", f"data={lab['oracle']}", f"out={tmp_path / 'S'}", f"model={lab['model']}",
            f"index={lab['index']}", f"eval.data={tmp_path / 'dev.jsnol'}")
    assert r.exit_code == 2 and "eval.data: " in r.output, r.output
    assert not out.exists() and not (tmp_path / "S").exists()
    monkeypatch.setattr(seekrl.models, "load_policy", real_load)

    # what a failed start leaves behind holds no run ...
    out.mkdir()
    (out / "config.yaml").write_text("out: R\n")
    (out / "metrics.jsonl").write_text("")
    check_run_dir(out)
    (out / "metrics.jsonl").write_text('{"step": 0, "dev_em": 0.0}\n')
    (out / "checkpoints").mkdir()
    check_run_dir(out)
    r = run(*common, "--resume")
    assert r.exit_code == 2 and "no checkpoint yet" in r.output \
        and "without --resume" in r.output, r.output
    # ... a completed step does
    (out / "metrics.jsonl").write_text('{"step": 1, "reward": 0.0}\n')
    with pytest.raises(ConfigError, match="already holds a run"):
        check_run_dir(out)
    r = run(*common, "--resume")
    assert r.exit_code == 2 and "before its first checkpoint" in r.output \
        and "--overwrite" in r.output, r.output


def test_world_oracle_and_eval_refuse_to_replace_without_overwrite(lab, tmp_path):
    """A second `world`, `oracle` or `eval` into the same out is refused in one line naming
    the folder and --overwrite; with --overwrite the old evaluation's viewer goes too."""
    w = tmp_path / "w"
    args = ["world", "--out", w, "--seed", 1, "--entities", 200, "--train", 10, "--dev", 4,
            "--test", 4]
    assert run(*args).exit_code == 0
    before = (w / "corpus.jsonl").read_text()
    r = run(*args[:4], 2, *args[5:])
    assert r.exit_code == 2 and f"{w} already holds a world" in r.output \
        and "--overwrite" in r.output, r.output
    assert (w / "corpus.jsonl").read_text() == before
    r = run(*args[:4], 2, *args[5:], "--overwrite")
    assert r.exit_code == 0 and (w / "corpus.jsonl").read_text() != before

    o = tmp_path / "o.jsonl"
    oracle = ["oracle", "--world", lab["world"], "--index", lab["index"], "--out", o,
              "--limit", 2]
    assert run(*oracle).exit_code == 0
    r = run(*oracle[:-1], 3)
    assert r.exit_code == 2 and f"{o} already holds oracle episodes" in r.output, r.output
    assert len(o.read_text().splitlines()) == 2
    assert run(*oracle[:-1], 3, "--overwrite").exit_code == 0
    assert len(o.read_text().splitlines()) == 3

    e = tmp_path / "e"
    ev = ["eval", "--data", lab["dev"], "--out", e, "--model", lab["model"], "--method",
          "direct", "--max-new-tokens", 4, "--limit"]
    assert run(*ev, 4).exit_code == 0
    assert run("inspect", e).exit_code == 0 and (e / "viewer.html").is_file()
    r = run(*ev, 2)
    assert r.exit_code == 2 and f"{e} already holds an evaluation" in r.output \
        and "--overwrite" in r.output, r.output
    assert json.loads((e / "metrics.json").read_text())["average"]["questions"] == 4
    # an evaluation that fails once its episodes are played leaves the old run whole
    import seekrl.eval.evaluate as evaluate_module

    def boom(trajectories):
        raise ValueError("scoring failed")

    real = evaluate_module.score_trajectories
    evaluate_module.score_trajectories = boom
    try:
        r = run(*ev, 2, "--overwrite")
    finally:
        evaluate_module.score_trajectories = real
    assert r.exit_code == 2 and "scoring failed" in r.output, r.output
    assert json.loads((e / "metrics.json").read_text())["average"]["questions"] == 4
    assert (e / "viewer.html").is_file()
    r = run(*ev, 2, "--overwrite")
    assert r.exit_code == 0, r.output
    assert json.loads((e / "metrics.json").read_text())["average"]["questions"] == 2
    assert not (e / "viewer.html").exists()      # the old run's viewer does not stay


def test_demo_refuses_an_old_run_and_overwrite_removes_it_after_the_checks(tmp_path,
                                                                          monkeypatch):
    import seekrl.demo

    out = tmp_path / "demo"
    (out / "rl_process").mkdir(parents=True)
    (out / "summary.json").write_text("{}")
    r = run("demo", "--out", out, "--model", tmp_path)
    assert r.exit_code == 2 and f"{out} already holds a demo run" in r.output \
        and "--overwrite" in r.output, r.output
    r = run("demo", "--out", out, "--model", tmp_path, "--process", "magic", "--overwrite")
    assert r.exit_code == 2 and "process method" in r.output
    r = run("demo", "--out", out, "--model", tmp_path, "--process", "prm", "--overwrite")
    assert r.exit_code == 2 and "needs a trained process reward model" in r.output \
        and "seekrl prorag" in r.output, r.output
    assert (out / "summary.json").is_file() and (out / "rl_process").is_dir()

    class Stop(Exception):
        pass

    def stop(*a, **k):
        raise Stop

    monkeypatch.setattr(seekrl.demo, "generate_world", stop)
    with pytest.raises(Stop):
        run("demo", "--out", out, "--model", tmp_path, "--overwrite")
    assert sorted(p.name for p in out.iterdir()) == ["demo_config.json"]


def test_an_index_of_another_corpus_than_the_worlds_is_refused(lab, tmp_path, monkeypatch):
    """A world regenerated after its index was built: oracle, eval and train refuse the
    stale index, naming both paths, the differing sha256 and the rebuild command; the
    world command warns about an index kept in its folder."""
    import seekrl.models

    w = tmp_path / "w"
    args = ["world", "--out", w, "--seed", 1, "--entities", 200, "--train", 10, "--dev", 4,
            "--test", 4]
    assert run(*args).exit_code == 0
    for idx in (w / "index", tmp_path / "idx"):
        assert run("index", "--corpus", w / "corpus.jsonl", "--out", idx).exit_code == 0
    r = run(*args[:4], 2, *args[5:], "--overwrite")
    assert r.exit_code == 0 and "warning:" in r.output and f"{w / 'index'}" in r.output \
        and "another corpus" in r.output, r.output

    def refused(r):
        text = " ".join(r.output.split())   # rich may wrap a long line
        return (r.exit_code == 2 and f"index {tmp_path / 'idx'} was built from another "
                f"corpus than {w / 'corpus.jsonl'}" in text and "corpus_sha256" in text
                and f"seekrl index --corpus {w / 'corpus.jsonl'} --out {tmp_path / 'idx'} "
                "--overwrite" in text)

    r = run("oracle", "--world", w, "--index", tmp_path / "idx", "--out", tmp_path / "o.jsonl")
    assert refused(r), r.output
    assert not (tmp_path / "o.jsonl").exists()

    def no_model(*a, **k):
        raise AssertionError("a model was loaded before the index was checked")

    monkeypatch.setattr(seekrl.models, "load_policy", no_model)
    r = run("eval", "--data", w / "test.jsonl", "--out", tmp_path / "e", "--index",
            tmp_path / "idx", "--model", lab["model"])
    assert refused(r), r.output
    r = run("train", f"data={w / 'train.jsonl'}", f"index={tmp_path / 'idx'}",
            f"out={tmp_path / 'rl'}", f"model={lab['model']}")
    assert refused(r), r.output
    # rebuilt, it is accepted
    assert run("index", "--corpus", w / "corpus.jsonl", "--out", tmp_path / "idx",
               "--overwrite").exit_code == 0
    r = run("oracle", "--world", w, "--index", tmp_path / "idx", "--out", tmp_path / "o.jsonl")
    assert r.exit_code == 0, r.output


def test_an_interrupted_train_says_where_it_stopped_and_how_to_resume(lab, tmp_path,
                                                                      monkeypatch):
    """Ctrl-C in a step: exit 130 with the step it stopped at and the command that goes on
    (plain before any checkpoint, --resume after one); --resume says where it continues."""
    from seekrl.recipes.train import Trainer

    out = tmp_path / "rl"
    args = ["train", f"data={lab['train']}", f"index={lab['index']}", f"out={out}",
            f"model={lab['model']}", *SMALL_RL, "steps=2"]
    command = "seekrl train " + " ".join(args[1:])
    real_step = Trainer.step

    def interrupt_at(n):
        def step(self, step, *a, **k):
            if step == n:
                raise KeyboardInterrupt
            return real_step(self, step, *a, **k)
        return step

    monkeypatch.setattr(Trainer, "step", interrupt_at(1))
    r = run(*args)
    text = " ".join(r.output.split())
    assert r.exit_code == 130, r.output
    assert "interrupted during step 1 of 2: nothing to resume; start again with: " \
        f"{command}" in text and "--resume" not in text, r.output
    monkeypatch.setattr(Trainer, "step", interrupt_at(2))
    r = run(*args)             # the same command again: the first attempt blocks nothing
    text = " ".join(r.output.split())
    assert r.exit_code == 130, r.output
    assert f"interrupted during step 2 of 2; the latest checkpoint is " \
        f"{out / 'checkpoints' / 'step-1'} (step 1); continue from it with: {command} " \
        "--resume" in text, r.output
    monkeypatch.setattr(Trainer, "step", real_step)
    r = run(*args, "--resume")
    assert r.exit_code == 0, r.output
    assert "".join(f"resuming from {out / 'checkpoints' / 'step-1'}: 1 of 2 steps done, "
                   "continuing with step 2 of 2".split()) in "".join(r.output.split()), r.output
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] \
        == [1, 2]


@pytest.mark.parametrize("command", ["sft", "prm"])
def test_an_interrupted_sft_or_prm_run_gives_the_command_that_goes_on(tmp_path, monkeypatch,
                                                                      command):
    """Ctrl-C in `seekrl sft` / `seekrl prm train`: exit 130 and, on one line, where it
    stopped and the same command with --resume (or, before any checkpoint, how to restart)."""
    import seekrl.recipes.prm as prm_module
    import seekrl.recipes.sft as sft_module
    from seekrl.recipes.setup import Interrupted

    ckpt = tmp_path / "o" / "checkpoints" / "step-2"
    module, name, args = ((sft_module, "run_sft", ["sft", f"data={tmp_path / 'd.jsonl'}"])
                          if command == "sft" else
                          (prm_module, "train_prm", ["prm", "train", f"labels={tmp_path}"]))
    args = [*args, f"out={tmp_path / 'o'}"]
    for raised, said in [(Interrupted(2, ckpt, 1), f"interrupted after step 2; the latest "
                          f"checkpoint is {ckpt}; continue from it with: seekrl "
                          f"{' '.join(args)} --resume"),
                         (Interrupted(0, None, 0), "interrupted before the first step, with "
                          f"no checkpoint (save_every is 0); start again with: seekrl "
                          f"{' '.join(args)} --overwrite")]:
        def stop(*a, _raised=raised, **k):
            raise _raised
        monkeypatch.setattr(module, name, stop)
        r = run(*args)
        assert r.exit_code == 130, r.output
        assert said in r.output, r.output


@pytest.mark.parametrize("command", ["mcts", "prorag"])
def test_an_interrupted_labelling_or_prorag_run_gives_the_command_that_goes_on(
        tmp_path, monkeypatch, command):
    """Both resume (--resume), but Ctrl-C had ended them with a bare exit 130."""
    import seekrl.prorag as prorag_module
    import seekrl.recipes.mcts as mcts_module

    module, name = (mcts_module, "run_labelling") if command == "mcts" else \
        (prorag_module, "run_prorag")

    def stop(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(module, name, stop)
    if command == "prorag":
        monkeypatch.setattr(prorag_module, "check_config", lambda cfg: None)
    args = [command, f"out={tmp_path / 'o'}"] + ([f"data={tmp_path / 'q.jsonl'}"]
                                                 if command == "mcts" else [])
    r = run(*args)
    assert r.exit_code == 130, r.output
    text = " ".join(r.output.split())
    assert f"interrupted: {tmp_path / 'o'} keeps" in text
    assert f"continue with: seekrl {' '.join(args)} --resume" in text, text


def test_an_interrupted_ranker_training_gives_the_command_that_goes_on(tmp_path,
                                                                       monkeypatch):
    """`seekrl ranker train` on Ctrl-C: exit 130 and one line, the checkpoint and the
    command with --resume once one was written, else the command to start again; not
    click's bare 'Aborted!'."""
    import shlex

    import seekrl.recipes.ranker as ranker_module
    from seekrl.recipes.setup import Interrupted

    checkpoint = tmp_path / "r" / "checkpoints" / "step-50"
    for raised, flags, said in (
            (Interrupted(60, checkpoint, 50), [], f"interrupted after step 60; the latest "
             f"checkpoint is {checkpoint}; continue from it with: {{}} --resume"),
            (KeyboardInterrupt(), ["--overwrite"], "interrupted before the first step; start "
             "again with: {} --overwrite")):
        def stop(*a, raised=raised, **k):
            raise raised
        monkeypatch.setattr(ranker_module, "train_ranker", stop)
        args = ["ranker", "train", f"index={tmp_path / 'idx'}",
                f"data=[{tmp_path / 'q.jsonl'}]", f"out={tmp_path / 'r'}"]
        r = run(*args, *flags)
        assert r.exit_code == 130, r.output
        assert said.format(shlex.join(["seekrl", *args])) in " ".join(r.output.split()), \
            r.output
        assert "Aborted" not in r.output


def test_an_interrupted_index_build_says_what_it_kept(tmp_path, monkeypatch):
    """`seekrl index` on Ctrl-C: exit 130 and one line, the shards a dense build kept and
    --resume when it kept some, else that the index folder is as it was; not 'Aborted!'."""
    import seekrl.retrieval.index as index_module

    note = f"{tmp_path / 'idx.building'} keeps the 3 dense shard(s) encoded so far; build " \
        "again with --resume (resume=True) to continue from there"

    def stop(*a, **k):
        err = KeyboardInterrupt()
        if a[2] == "dense":   # build_index(corpus, out, retriever, ...)
            err.add_note(note)
        raise err
    monkeypatch.setattr(index_module, "build_index", stop)
    (tmp_path / "c.jsonl").write_text('{"id": "a", "contents": "x"}\n')
    for retriever, said in (("dense", f"interrupted: {note}"),
                            ("bm25", f"interrupted: no index was written; {tmp_path / 'idx'} "
                                     "is as it was")):
        r = run("index", "--corpus", str(tmp_path / "c.jsonl"), "--out", str(tmp_path / "idx"),
                "--retriever", retriever)
        assert r.exit_code == 130, r.output
        assert said in " ".join(r.output.split()), r.output
        assert "Aborted" not in r.output and "Traceback" not in r.output


def test_bad_input_of_world_oracle_table_search_is_one_line_not_a_traceback(lab, tmp_path):
    """A path holding rich markup, a file where a folder was meant (and back), nonsense
    numbers for oracle and a metrics file that is not one: each a one-line error, exit 2."""
    def refused(args, *needles):
        r = run(*args)
        assert r.exit_code == 2, (args, r.output)
        text = " ".join(r.output.split())   # the console wraps long lines
        assert "Traceback" not in text, text
        for needle in needles:
            assert needle in text, (needle, text)
        return text

    # markup in a path: printed as written (was a MarkupError, or `data[old]` shown as `data`)
    refused(["search", "--index", tmp_path / "data[/old]", "q"], "data[/old]")
    refused(["search", "--index", tmp_path / "data[old]", "q"], "data[old]")
    afile = tmp_path / "afile"
    afile.write_text("x")
    refused(["world", "--out", afile, "--entities", "60", "--train", "4", "--dev", "2",
             "--test", "2"], "is a file")
    refused(["index", "--corpus", Path(lab["world"]) / "corpus.jsonl", "--out", afile,
             "--overwrite"], "afile")
    w, i = lab["world"], lab["index"]
    out = tmp_path / "o.jsonl"
    refused(["oracle", "--world", w, "--index", i, "--out", out, "--limit", "-2"],
            "--limit: expected at least 1")
    refused(["oracle", "--world", w, "--index", i, "--out", out, "-k", "0"],
            "-k/--topk: expected at least 1")
    refused(["oracle", "--world", w, "--index", i, "--out", out, "--split", "foo"],
            "--split: expected train, dev or test")
    refused(["oracle", "--world", w, "--index", i, "--out", tmp_path, "--overwrite"],
            "is a folder")
    refused(["oracle", "--world", w, "--index", i, "--out", tmp_path / "nodir" / "o.jsonl"],
            "no folder")
    assert not out.exists()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.json").write_text("[1, 2]")
    refused(["table", run_dir], "metrics.json", "expected an object of metrics")
    (run_dir / "metrics.json").write_text("{bad")
    refused(["table", run_dir], "metrics.json", "not JSON")
    for shape, field in (({"datasets": None, "average": []}, "field 'average'"),
                         ({"datasets": {"nq": 0.5}}, "field 'datasets.nq'"),
                         ({"by_type": {"nq": {"bridge": [1]}}}, "field 'by_type.nq.bridge'")):
        (run_dir / "metrics.json").write_text(json.dumps(shape))
        refused(["table", run_dir], "metrics.json", field, "expected an object")
        trained = tmp_path / "trained"       # a training run whose evaluation is damaged
        (trained / "eval" / "final").mkdir(parents=True, exist_ok=True)
        (trained / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward": 0.5}) + "\n")
        (trained / "eval" / "final" / "metrics.json").write_text(json.dumps(shape))
        refused(["report", trained], "metrics.json", field)
    (run_dir / "metrics.json").write_text(json.dumps(
        {"datasets": {"nq": {"em": 0.5, "f1": 0.6}}, "average": {"em": 0.5}}))
    refused(["table", run_dir, "--metric", "nosuch"], "no run has 'nosuch'", "em, f1")
    r = run("table", run_dir)
    assert r.exit_code == 0 and "0.500" in r.output


def test_ranker_eval_with_nothing_to_measure_is_refused(lab, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    no_chain = tmp_path / "q.jsonl"
    no_chain.write_text(json.dumps({"id": "q1", "question": "who?", "golden_answers": ["x"]})
                        + "\n")
    for flag, path, needle in (("--data", no_chain, "no question with gold documents"),
                               ("--trajectories", empty, "no logged search")):
        r = run("ranker", "eval", "--index", lab["index"], flag, path)
        assert r.exit_code == 2 and needle in " ".join(r.output.split()), r.output


def test_ranker_eval_reads_gold_doc_ids_or_supporting_titles_without_a_chain(lab, tmp_path):
    """Only a synthetic world's hop chains were measured; a benchmark's or one's own
    questions name their gold documents by id or their supporting passages by title."""
    from seekrl.data.qa import load_qa, read_qa_jsonl
    from seekrl.recipes.ranker import question_recall, question_records
    from seekrl.retrieval.index import load_index

    index = load_index(lab["index"])
    questions = read_qa_jsonl(lab["dev"])
    by_id, by_title = tmp_path / "ids.jsonl", tmp_path / "titles.jsonl"
    corpus = {json.loads(x)["id"]: json.loads(x)["contents"].split("\n")[0]
              for x in (Path(lab["world"]) / "corpus.jsonl").read_text().splitlines()}
    rows_id, rows_title = [], []
    for q in questions:
        gold = q.metadata["gold_doc_ids"]
        rows_id.append({"id": q.id, "question": q.question, "golden_answers": q.golden_answers,
                        "metadata": {"gold_doc_ids": gold}})
        rows_title.append({"id": q.id, "question": q.question,
                           "golden_answers": q.golden_answers,
                           "metadata": {"supporting_titles": [corpus[d] for d in gold]}})
    rows_id.append({"id": "unknown", "question": "who?", "golden_answers": ["x"]})
    by_id.write_text("".join(json.dumps(r) + "\n" for r in rows_id))
    by_title.write_text("".join(json.dumps(r) + "\n" for r in rows_title))
    # by hand: the share of each question's gold documents in its own top 3
    expected = 0.0
    for q, hits in zip(questions, index.search([q.question for q in questions], 3)):
        gold = set(q.metadata["gold_doc_ids"])
        expected += len(gold & {h.doc_id for h in hits}) / len(gold)
    expected /= len(questions)
    for path, by in ((by_id, "gold ids"), (by_title, "supporting titles")):
        records = question_records(load_qa(str(path)))
        assert len(records) == len(questions)
        assert question_recall(index, records, 3) == pytest.approx(expected)
        r = run("ranker", "eval", "--index", lab["index"], "--data", path, "--topk", "3")
        assert r.exit_code == 0, r.output
        text = " ".join(r.output.split())
        assert f"question_recall@3 first_stage={expected:.4f} ({len(questions)} questions " \
            f"searched as they are, by {by})" in text, r.output
        assert "recall@3 first_stage" not in text.replace("question_recall@3", "")
    r = run("ranker", "eval", "--index", lab["index"], "--data", by_id, "--topk", "3")
    assert "1 questions without gold documents (no chain, gold_doc_ids or supporting_titles) " \
        "left out" in " ".join(r.output.split())


def test_search_and_inspect_refuse_numbers_below_one(lab, tmp_path):
    for args, needle in ((("search", "--index", lab["index"], "-k", "0", "q"), "-k/--topk"),
                         (("search", "--index", lab["index"], " "), "empty query"),
                         (("inspect", tmp_path, "--limit", "-2"), "--limit: expected")):
        r = run(*args)
        assert r.exit_code == 2 and needle in " ".join(r.output.split()), (args, r.output)


def test_ctrl_c_in_the_demo_says_how_to_start_again(tmp_path, monkeypatch):
    import seekrl.demo

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(seekrl.demo, "run_demo", interrupted)
    r = runner.invoke(app, ["demo", "--out", str(tmp_path / "d")])
    assert r.exit_code == 130
    assert "--overwrite" in " ".join(r.output.split()) and "Aborted" not in r.output


def test_index_refuses_dense_options_with_bm25_and_a_bad_index_type_first(lab, tmp_path):
    """Dense-only flags with --retriever bm25 were dropped unsaid; --index-type was checked
    only after the whole corpus was stored."""
    from seekrl.retrieval.dense import INDEX_TYPES

    corpus = Path(lab["world"]) / "corpus.jsonl"
    for extra, needle in ((["--encoder", "x"], "--encoder: dense options"),
                          (["--device", "cuda", "--pooling", "cls"], "--pooling, --device"),
                          (["--retriever", "dense", "--index-type", "ivf"],
                           "--index-type: expected flat, hnsw or ivfpq"),
                          (["--retriever", "bm52"], "--retriever: expected bm25")):
        r = run("index", "--corpus", corpus, "--out", tmp_path / "i", *extra)
        assert r.exit_code == 2 and needle in " ".join(r.output.split()), (extra, r.output)
    assert not (tmp_path / "i").exists()
    assert INDEX_TYPES == ("flat", "hnsw", "ivfpq")   # the names the CLI checks


def test_index_refuses_what_a_faiss_import_would_drop(lab, tmp_path):
    """An import encodes nothing: --retriever hybrid had built a dense index alone, and
    --index-type, --resume and --device were dropped; --copy-faiss without --faiss built a
    BM25 index as if it were not given."""
    corpus = Path(lab["world"]) / "corpus.jsonl"
    faiss_file = tmp_path / "e5.index"
    faiss_file.write_bytes(b"")
    base = ["--encoder", "e5", "--faiss", faiss_file]
    for extra, needle in (([*base, "--retriever", "hybrid"], "--retriever hybrid: not used"),
                          ([*base, "--index-type", "hnsw", "--resume"],
                           "--index-type, --resume: not used by --faiss"),
                          ([*base, "--device", "cuda"], "--device: not used by --faiss"),
                          (["--copy-faiss"], "--copy-faiss: copies the file --faiss")):
        r = run("index", "--corpus", corpus, "--out", tmp_path / "i", *extra)
        assert r.exit_code == 2 and needle in " ".join(r.output.split()), (extra, r.output)
    assert not (tmp_path / "i").exists()


def test_what_the_documented_commands_write_is_ignored_by_git_and_no_source_is():
    """The README's commands write data/ and runs/ into the repository; git ignores them,
    but never a tracked file (tests/data/, src/seekrl/data/, bench/records/**/runs/)."""
    import shutil
    import subprocess

    root = Path(__file__).resolve().parents[1]
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")

    def git(*args):
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)

    written = ["data/world/corpus.jsonl", "data/index/manifest.json", "data/oracle.jsonl",
               "runs/demo/report.html", "runs/own/rl/final/config.json",
               "wiki/wiki-18.jsonl", "wiki-e5/manifest.json"]
    r = git("check-ignore", "--no-index", *written)
    assert sorted(r.stdout.split()) == sorted(written), r.stdout + r.stderr
    source = ["src/seekrl/data/qa.py", "src/seekrl/data/new_reader.py", "tests/data/x.jsonl",
              "bench/records/f32-sim/runs/real-s0/result.json"]
    assert git("check-ignore", "--no-index", *source).stdout == ""
    assert git("ls-files", "-ci", "--exclude-standard").stdout == ""   # no tracked file


def test_world_flags_build_the_demos_world(tmp_path):
    """configs/sft-plan.yaml and rl-long.yaml were measured on the demo's world: the flags
    docs/training.md gives build it file for file (here at a small size)."""
    from seekrl.data.world import generate_world, write_world
    from seekrl.recipes.pipeline import DemoConfig, demo_world

    want = demo_world(DemoConfig(seed=1))
    want.entities, want.n_train, want.n_dev, want.n_test = 200, 30, 10, 10
    write_world(generate_world(want), tmp_path / "demo")
    r = run("world", "--out", tmp_path / "cli", "--seed", 1, "--entities", 200, "--train", 30,
            "--dev", 10, "--test", 10, "--doc-words", "12,30", "--hop-mix", "1:0.3,2:0.45,3:0.25")
    assert r.exit_code == 0, r.output
    names = sorted(p.name for p in (tmp_path / "demo").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "cli").iterdir())
    for name in names:
        assert (tmp_path / "cli" / name).read_bytes() == (tmp_path / "demo" / name).read_bytes()


def test_command_lists_show_each_summary_on_one_line(monkeypatch):
    """A wrapped docstring's first paragraph reads as one sentence in the command lists
    (typer kept its line breaks there: 'wire-compatible with the' / 'Search-R1 ...')."""
    import inspect

    from seekrl import cli

    monkeypatch.setenv("COLUMNS", "400")
    groups = [([], cli.app)] + [([g.name], g.typer_instance) for g in cli.app.registered_groups]
    for prefix, group in groups:
        listing = runner.invoke(app, prefix + ["--help"], terminal_width=400).output
        for info in group.registered_commands:
            first = inspect.cleandoc(info.callback.__doc__).split("\n\n")[0]
            summary = " ".join(first.split())
            assert summary in " ".join(listing.split("│")), (prefix, info.callback.__name__)
