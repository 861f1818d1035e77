"""Your own parts from a config file (docs/extending.md): `reward.fn`, `retriever`,
`reward.process` sources and `algo.advantage` by import path, the docs' example module
(examples/my_parts.py) run through the config path, and errors that name the key."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import build_world_and_index
from typer.testing import CliRunner

from seekrl.config import ConfigError, LabelConfig, TrainConfig, build_config, load_config, merged

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "own_parts.yaml"
PARTS = "examples.my_parts"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    out = tmp_path_factory.mktemp("partsworld")
    _, paths, _ = build_world_and_index(out, seed=4, difficulty="medium", entities=200,
                                        n_train=16, n_dev=4, n_test=4)
    return paths


def small(tmp_path, world) -> dict:
    """The example config with the test world and tiny settings under it."""
    return merged(yaml.safe_load(CONFIG.read_text()), {
        "data": str(world["train"]), "index": str(world["corpus"]), "out": str(tmp_path / "run"),
        "steps": 1, "questions_per_step": 2, "group_size": 2, "save_every": 1,
        "rollout": {"max_turns": 2, "max_new_tokens": 6, "max_info_tokens": 48, "topk": 2,
                    "batch_size": 8},
        "algo": {"mini_batch_size": 2, "micro_batch_size": 1, "epochs": 1},
        "eval": {"at_start": False}, "optim": {"lr": 1e-3}})


def test_the_readme_example_parts_train_a_step(own_parts, world, tmp_path):
    """configs/own_parts.yaml is the docs', and its parts, named by import path only,
    make the run: the retriever, the episode reward, a process source and the estimator."""
    from seekrl.models import tiny_policy
    from seekrl.recipes.train import Trainer, check_config
    from seekrl.rewards.process import PROCESS_REWARDS
    from seekrl.rl.advantages import ESTIMATORS, facts

    page = (ROOT / "docs" / "extending.md").read_text()
    assert f"```yaml\n{CONFIG.read_text()}```" in page
    assert f"```python\n{(ROOT / 'examples' / 'my_parts.py').read_text()}```" in page
    torch.set_num_threads(1)
    model, tok = tiny_policy(seed=3)
    cfg = build_config(TrainConfig, small(tmp_path, world))
    trainer = Trainer(cfg, model=model, tokenizer=tok, overwrite=True)
    parts = sys.modules[PARTS]
    assert isinstance(trainer.retriever, parts.KeywordRetriever)
    assert trainer.retriever.search([trainer.questions[0].question], 2)[0]   # it finds some
    assert facts(f"{PARTS}:median_baseline") == facts("median_baseline")   # its own facts

    record = trainer.step(1)
    assert record["episodes"] == 4
    assert f"process_{PARTS}:novelty" in record
    trajs = trainer.rollout(trainer.sample_questions(1, 2), seed=1)
    assert [trainer.reward_fn(t) for t in trajs] == [parts.judge(t) for t in trajs]

    # a resumed run (a fresh process) re-imports them from the run's config.yaml
    saved = load_config(TrainConfig, tmp_path / "run" / "config.yaml")
    assert saved.retriever == f"{PARTS}:KeywordRetriever"
    assert saved.reward.process == {f"{PARTS}:novelty": 0.5}
    del ESTIMATORS[f"{PARTS}:median_baseline"], PROCESS_REWARDS[f"{PARTS}:novelty"]
    check_config(saved)
    assert f"{PARTS}:median_baseline" in ESTIMATORS and f"{PARTS}:novelty" in PROCESS_REWARDS


def test_a_reward_fn_that_returns_the_wrong_type_names_the_key(own_parts, tmp_path,
                                                               monkeypatch):
    from seekrl.rewards.outcome import load_reward_fn

    (tmp_path / "badparts.py").write_text("def score(t):\n    return 1.0\n")
    monkeypatch.chdir(tmp_path)
    reward = load_reward_fn("badparts:score")
    with pytest.raises(TypeError, match=r"reward.fn: badparts:score returned a float; "
                                        r"expected RewardParts"):
        reward(None)


@pytest.mark.parametrize("override, message", [
    ("reward.fn=nosuch.rewards:judge",
     "reward.fn: cannot import module 'nosuch.rewards' (ModuleNotFoundError: No module named "
     "'nosuch'); its module must be importable from the working directory"),
    ("reward.fn=judge", "reward.fn: 'judge' is not an import path; expected module.path:attribute"),
    (f"reward.fn={PARTS}:judg", f"reward.fn: '{PARTS}' has no attribute 'judg' (did you mean judge?)"),
    (f"reward.fn={PARTS}:re", f"reward.fn: {PARTS}:re is a module, not a function f(trajectory)"),
    (f"reward.fn={PARTS}:novelty", f"reward.fn: {PARTS}:novelty takes (trajectories, ctx); "
                                   "expected a function f(trajectory) -> RewardParts"),
    (f"reward.process={{{PARTS}:nope: 1.0}}",
     f"reward.process.{PARTS}:nope: '{PARTS}' has no attribute 'nope'"),
    (f"reward.process={{{PARTS}:judge: 1.0}}",
     f"reward.process.{PARTS}:judge: {PARTS}:judge takes (t); expected a function "
     "f(trajectories, ctx)"),
    (f"algo.advantage={PARTS}:judge",
     f"algo.advantage: {PARTS}:judge takes (t); expected a function f(batch: StepBatch, cfg)"),
    ("algo.advantage=median_baseline", "algo.advantage: expected one of"),   # a name: as before
    (f"retriever={PARTS}:RewardParts",
     f"retriever: {PARTS}:RewardParts is a class without a method search(queries"),
    (f"retriever={PARTS}:re", f"retriever: {PARTS}:re is a module, not a retriever"),
    ("index=null", f"retriever: {PARTS}:KeywordRetriever takes (corpus), but it is called with "
                   "no arguments (no index given)"),
])
def test_bad_import_paths_fail_at_config_time_naming_the_key(own_parts, override, message):
    from seekrl.recipes.train import check_config

    base = {"data": "d", "index": "i", "retriever": f"{PARTS}:KeywordRetriever"}
    with pytest.raises(ConfigError) as err:
        check_config(build_config(TrainConfig, base, [override]))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_module_that_fails_on_import_says_why(own_parts, tmp_path, monkeypatch):
    """The working directory is on sys.path for import paths; a module found there whose
    own imports fail is told apart from a module that is not there."""
    from seekrl.plugins import load

    (tmp_path / "badparts.py").write_text("import not_installed_pkg\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"^retriever: importing module 'badparts' failed "
                                          r"\(ModuleNotFoundError: No module named "
                                          r"'not_installed_pkg'\)$"):
        load("retriever", "badparts:Thing")


def test_a_module_that_exits_on_import_is_a_named_error_not_the_end_of_the_run(
        tmp_path, monkeypatch):
    """A script with argparse at the top calls sys.exit when imported: SystemExit had ended
    the run with the script's usage line, no key named, and (as a file) had left the
    half-imported module behind for the next load to misread."""
    import sys

    from seekrl.plugins import load

    (tmp_path / "exitplug.py").write_text("import sys\nsys.exit('usage: exitplug.py ARGS')\n"
                                          "def f(t, ctx):\n    return [0.0]\n")
    monkeypatch.chdir(tmp_path)
    for path, what in (("exitplug:f", "module 'exitplug'"),
                       ("exitplug.py:f", str(tmp_path / "exitplug.py"))):
        with pytest.raises(ConfigError) as err:
            load("reward.fn", path)
        assert str(err.value).startswith(f"reward.fn: importing {what} failed (it called "
                                         "sys.exit('usage: exitplug.py ARGS') when imported")
        assert "exitplug" not in sys.modules


def test_label_and_refine_take_a_retriever_by_import_path(own_parts, world):
    from seekrl.recipes.mcts import check_config
    from seekrl.recipes.setup import open_index

    cfg = build_config(LabelConfig, {"data": "d", "retriever": f"{PARTS}:KeywordRetriever",
                                     "index": str(world["corpus"])})
    check_config(cfg)
    title = world["corpus"].read_text().split("\n", 1)[0]
    hits = open_index(cfg.index, "labelling", cfg.retriever).search([title], 1)
    assert len(hits) == 1 and len(hits[0]) == 1
    with pytest.raises(ConfigError, match="^retriever: .* takes \\(corpus\\)"):
        check_config(build_config(LabelConfig, {"data": "d",
                                                "retriever": f"{PARTS}:KeywordRetriever"}))


def test_the_cli_checks_import_paths_before_any_model_loads(own_parts, world, tmp_path):
    from seekrl.cli import app

    runner = CliRunner()
    r = runner.invoke(app, ["train", "--config", str(CONFIG), "--print-config"])
    assert r.exit_code == 0, r.output
    assert yaml.safe_load(r.output)["reward"]["fn"] == f"{PARTS}:judge"
    r = runner.invoke(app, ["train", "--config", str(CONFIG), "--print-config",
                            f"algo.advantage={PARTS}:nope"])
    assert r.exit_code == 2 and f"algo.advantage: '{PARTS}' has no attribute 'nope'" in r.output
    q = tmp_path / "q.jsonl"
    q.write_text('{"id": "1", "question": "q?", "golden_answers": ["a"]}\n')
    r = runner.invoke(app, ["eval", "--data", str(q), "--out", str(tmp_path / "e"),
                            "--retriever", f"{PARTS}:KeywordRetriever"])
    assert r.exit_code == 2 and "--retriever: " in r.output and "takes (corpus)" in r.output
    assert "Traceback" not in r.output


def test_a_retriever_object_or_factory(own_parts, tmp_path, monkeypatch):
    """An object with search() is used as it is (an index cannot be passed to it); what a
    factory makes must have search()."""
    from seekrl.plugins import make_retriever

    (tmp_path / "badparts.py").write_text(
        "class Empty:\n    def search(self, queries, k):\n        return [[] for _ in queries]\n"
        "\n\nshared = Empty()\n\n\ndef make():\n    return 3\n")
    monkeypatch.chdir(tmp_path)
    retriever = make_retriever("retriever", "badparts:shared")
    assert retriever.search(["q"], 2) == [[]]
    assert type(make_retriever("retriever", "badparts:Empty")).__name__ == "Empty"
    with pytest.raises(ConfigError, match=r"^retriever: badparts:shared is a retriever object "
                                          r"already, so the index \('idx'\) cannot be passed"):
        make_retriever("retriever", "badparts:shared", "idx")
    with pytest.raises(ConfigError, match=r"^retriever: badparts:make\(\) made a int, which has "
                                          r"no method search\(queries"):
        make_retriever("retriever", "badparts:make")


@pytest.fixture
def forget_modules():
    """The names of modules a test imports from its own files, forgotten after it."""
    names: list[str] = []
    yield names
    for name in names:
        sys.modules.pop(name, None)


def test_a_part_by_file_path_loads_from_any_working_directory(own_parts, tmp_path,
                                                              monkeypatch, forget_modules):
    """A module name resolves only from the working directory; `path/to/file.py:attr`
    works from anywhere (absolute, or relative to the working directory), and the file's
    sibling modules import as when it runs as a script."""
    from seekrl.plugins import load, make_retriever

    parts = tmp_path / "project" / "parts"
    parts.mkdir(parents=True)
    (parts / "helper_words.py").write_text("WORDS = ['a', 'b']\n")
    (parts / "filepart.py").write_text(
        "from helper_words import WORDS\n\n\nclass Listed:\n"
        "    def search(self, queries, k):\n        return [[] for _ in queries]\n\n\n"
        "def judge(t):\n    return len(WORDS)\n")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    forget_modules += ["filepart", "helper_words"]
    with pytest.raises(ConfigError, match=r"^reward\.fn: cannot import module 'filepart' .*or "
                                          r"give the file: path/to/file\.py:attribute$"):
        load("reward.fn", "filepart:judge")   # by module name: not from here
    judge = load("reward.fn", f"{parts / 'filepart.py'}:judge")
    assert judge(None) == 2
    monkeypatch.chdir(tmp_path)
    assert load("reward.fn", "project/parts/filepart.py:judge") is judge   # the same module
    assert make_retriever("retriever", "project/parts/filepart.py:Listed").search(["q"], 1) \
        == [[]]
    with pytest.raises(ConfigError, match=r"'project/parts/filepart.py' has no attribute "
                                          r"'judeg' \(did you mean judge\?\)"):
        load("reward.fn", "project/parts/filepart.py:judeg")


@pytest.mark.parametrize("text, path, message", [
    (None, "nowhere/parts.py:judge", r"^reward\.fn: no file .*nowhere/parts\.py \(from "
                                     r"'nowhere/parts\.py', relative to the working directory"),
    ("x = 1\n", "my-parts.py:x", r"^reward\.fn: .*my-parts\.py: 'my-parts' is no Python module "
                                 r"name .*rename the file$"),
    ("import not_installed_pkg\n", "broken.py:x",
     r"^reward\.fn: importing .*broken\.py failed \(ModuleNotFoundError: No module named "
     r"'not_installed_pkg' at .*broken\.py:1\)$"),
    # the user's line, not only the error's name
    ("x = 1\ny = undefined_name\n", "broken2.py:x",
     r"^reward\.fn: importing .*broken2\.py failed \(NameError: .* at .*broken2\.py:2\)$"),
    # a module that is not imported yet but would be by that name (as peft is by LoRA)
    ("x = 1\n", "tabnanny.py:x", r"^reward\.fn: .*tabnanny\.py: 'tabnanny' is the name of "
                                  r"another module \(.*tabnanny\.py\), which importing this "
                                  r"file would replace; rename the file$"),
    ("x = 1\n", "json.py:x", r"^reward\.fn: .*json\.py: a module named 'json' is imported "
                             r"already \(from .*\); rename the file$"),
    (None, "judge", r"^reward\.fn: 'judge' is not an import path; expected module\.path:"
                    r"attribute .* or path/to/file\.py:attribute$"),
])
def test_a_bad_file_path_says_what_is_wrong(own_parts, tmp_path, monkeypatch, text, path,
                                            message):
    import json  # noqa: F401  (imported: a file of that name is refused)

    from seekrl.plugins import load

    monkeypatch.chdir(tmp_path)
    if text is not None:
        (tmp_path / path.split(":")[0]).write_text(text)
    with pytest.raises(ConfigError, match=message):
        load("reward.fn", path)
    assert "broken" not in sys.modules   # a failed import leaves nothing half-made behind


def test_a_file_named_by_path_and_by_module_is_one_module(tmp_path, monkeypatch):
    """`pkg/rewards.py:f` and `pkg.rewards:f` ran the file twice, under two names, with
    two sets of globals."""
    from seekrl.plugins import load

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "plugpkg").mkdir()
    (tmp_path / "plugpkg" / "__init__.py").write_text("")
    (tmp_path / "plugpkg" / "plugrewards.py").write_text(
        "RUNS = []\nRUNS.append(1)\ndef f(t):\n    return 0.0\n")
    try:
        by_file = load("reward.fn", "plugpkg/plugrewards.py:f")
        by_module = load("reward.fn", "plugpkg.plugrewards:f")
        assert by_file is by_module
        assert sys.modules["plugrewards"].RUNS == [1]
    finally:
        for name in ("plugrewards", "plugpkg", "plugpkg.plugrewards"):
            sys.modules.pop(name, None)
