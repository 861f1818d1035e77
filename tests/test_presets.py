"""The demo's and ProRAG's stage settings are YAML presets (src/seekrl/presets/demo and
prorag) over
one episode-settings type; `seekrl train --process` sets a method's keys as typed values.
Each resolves to the config the code built before the presets moved out of it:
data/presets_before.json holds those configs, dumped from commit 028ff9e (the scenarios:
defaults, the command line's options, a process method, the tests' tiny runs, step-DPO,
your own data)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from seekrl.config import (
    ConfigError,
    EvalConfig,
    LabelConfig,
    PRMConfig,
    ProragConfig,
    RefineConfig,
    SFTConfig,
    TrainConfig,
    build_config,
    load_config,
)
from seekrl.eval.evaluate import eval_rollout_config, eval_settings
from seekrl.recipes.pipeline import PRESETS, DemoConfig, demo_world, rl_config, sft_config
from seekrl.rl.methods import method_overrides

ROOT = Path(__file__).resolve().parents[1]
BEFORE = json.loads((Path(__file__).parent / "data" / "presets_before.json").read_text())
EVAL_LIMITS = {"max_turns", "max_new_tokens", "batch_size"}


def same_run(schema, before: dict, now) -> None:
    """`now` is the config `before` was. The `eval:` limits that were the section's own
    defaults (4 turns, 128 tokens, 32 episodes) are now the run's episode settings: what an
    evaluation plays is compared. SFT's five episode keys are now its `rollout:` section, of
    which the new config holds every key: those five are compared."""
    old = schema.model_validate(before)    # SFT's old top-level keys read into rollout:
    if old.eval.data is not None:
        assert eval_settings(old.eval, old.rollout) == eval_settings(now.eval, now.rollout)
    exclude = {"eval": EVAL_LIMITS}
    if schema is SFTConfig:
        exclude["rollout"] = True
        kept = {k for k in ("topk", "prompt", "max_info_tokens", "max_queries",
                            "max_new_tokens") if k in before or k == "max_new_tokens"}
        assert now.rollout.model_dump(include=kept) == old.rollout.model_dump(include=kept)
    assert now.model_dump(exclude=exclude) == old.model_dump(exclude=exclude)


def same_eval(before: dict, episode, n: int) -> None:
    from seekrl.agent.rollout import RolloutConfig

    now = eval_rollout_config(eval_settings(
        EvalConfig(data=before["eval"]["data"], n=n, batch_size=min(n, 64)), episode))
    assert now == RolloutConfig.model_validate(before["rollout"])
    assert before["eval"]["n"] == n


def demo_configs(d: DemoConfig, out: Path, budget: int) -> dict:
    sft = sft_config(d, out / "oracle_train.jsonl", out / "sft", index=str(out / "index"))
    kw = dict(model=str(out / "sft" / "final"), train_file=out / "world" / "train.jsonl",
              index_dir=out / "index")
    rl = rl_config(d, out=out / "rl", **kw)
    found = {"sft": sft, "rl": rl}
    if d.process:
        keys = method_overrides(d.process, group_size=rl.group_size,
                                baseline_advantage=rl.algo.advantage)
        found["rl_process"] = rl_config(d, out=out / "rl_process", keys=keys,
                                        budget_tokens=budget, **kw)
    return found


def check_demo(name: str, d: DemoConfig, out: Path = Path("runs/demo"), budget: int = 777):
    before = BEFORE[name]
    found = demo_configs(d, out, budget)
    same_run(SFTConfig, before["sft"], found["sft"])
    for stage in ("rl", "rl_process"):
        assert (stage in found) == (stage in before)
        if stage in before:
            same_run(TrainConfig, before[stage], found[stage])
    same_eval({"eval": before["eval_eval"], "rollout": before["eval_rollout"]}, d.rollout,
              d.n_test)
    assert d.rollout.topk == before["oracle_k"]
    world = demo_world(d)
    assert [world.seed, world.difficulty, list(world.doc_words)] == \
        [before["world"][k] for k in ("seed", "difficulty", "doc_words")]
    assert {str(k): v for k, v in world.hop_mix.items()} == before["world"]["hop_mix"]


def test_the_demo_presets_resolve_to_the_configs_built_in_code_before():
    check_demo("demo", DemoConfig())
    check_demo("demo_evidence", DemoConfig(process="evidence"))
    # tests/test_demo.py's tiny run
    check_demo("demo_test", DemoConfig(
        model="runs/tiny", n_test=3, rollout={"max_turns": 2, "max_new_tokens": 4},
        sft_batch=2, sft={"max_steps": 1, "train_layers": 1}, n_show=1, process="evidence",
        rl={"steps": 2, "max_minutes": 5, "questions_per_step": 2, "group_size": 2,
            "train_layers": 1}))


@pytest.mark.parametrize("episodes, batch, accum", [
    (8, 2, 4), (3, 1, 3), (7, 1, 7), (9, 1, 9), (10, 2, 5), (1, 1, 1), (2, 2, 1), (6, 2, 3)])
def test_sft_batch_is_the_episodes_of_a_step_exactly(episodes, batch, accum):
    """A step is the episodes asked for, in micro-batches of at most the preset's
    batch_size (2: its memory bound; 3 episodes were one micro-batch of 3)."""
    sft = sft_config(DemoConfig(sft_batch=episodes), "d", "o")
    assert (sft.batch_size, sft.grad_accum) == (batch, accum)
    assert sft.batch_size * sft.grad_accum == episodes


def test_the_demo_options_set_the_keys_they_set_before(monkeypatch):
    """`seekrl demo`'s options, as the CLI turns them into the demo's settings."""
    import seekrl.demo
    from seekrl.cli import app

    seen = {}
    monkeypatch.setattr(seekrl.demo, "run_demo", lambda out, cfg, **kw: seen.update(cfg=cfg))
    r = CliRunner().invoke(app, [
        "demo", "--out", "runs/demo2", "--seed", "3", "--difficulty", "hard", "--model",
        "runs/m", "--eval-questions", "10", "--sft-steps", "7", "--sft-batch", "3",
        "--rl-steps", "4", "--rl-minutes", "9.5", "--advantage", "rloo", "--process", "tree",
        "--questions-per-step", "6", "--group-size", "6", "--train-layers", "0",
        "--dtype", "bf16-mixed", "--threads", "1"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    check_demo("demo_cli", seen["cfg"], out=Path("runs/demo2"), budget=123)
    # the defaults: the presets' own settings
    r = CliRunner().invoke(app, ["demo", "--dtype", "float32", "--threads", "1"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    check_demo("demo", seen["cfg"])


def prorag_paths(cfg: ProragConfig) -> dict[str, str]:
    from seekrl.prorag import input_paths

    return input_paths(cfg)


TINY_PRORAG = dict(model="runs/tiny", n_test=3, max_turns=2, max_new_tokens=4, train_layers=1,
                   sft={"max_steps": 2, "batch_size": 2},
                   labels={"questions": 2, "search": {"simulations": 3, "expansions": 3}},
                   prm={"steps": 2, "batch_size": 2, "dev_share": 0.5},
                   refine={"questions": 2, "samples": 2, "steps": 2},
                   rl={"steps": 2, "questions_per_step": 2, "group_size": 2})


@pytest.mark.parametrize("name, kw", [
    ("prorag", {}),
    ("prorag_tiny", dict(out="runs/p", **TINY_PRORAG)),     # bench/pin.py's, the tests'
    ("prorag_step_dpo", dict(out="runs/p2", seed=5, refine_method="step_dpo",
                             train_layers=None, k=3, max_info_tokens=300,
                             rl={"algo": {"beta": 0.5}, "optim": {"lr": 1e-5}},
                             labels={"reward": "em"})),
    ("prorag_none", dict(out="runs/p3", refine_method="none", sft_model="org/m",
                         train="t.jsonl", test="q.jsonl", index="idx",
                         prm={"model": "org/other"})),
])
def test_the_prorag_presets_resolve_to_the_configs_built_in_code_before(name, kw):
    from seekrl.prorag import stage_configs

    before = BEFORE[name]
    cfg = ProragConfig(**kw)
    stages = stage_configs(cfg, prorag_paths(cfg))
    for stage, schema in (("sft", SFTConfig), ("labels", LabelConfig), ("prm", PRMConfig),
                          ("refine", RefineConfig), ("rl", TrainConfig)):
        if schema in (SFTConfig, TrainConfig):
            same_run(schema, before[stage], stages[stage])
        else:
            assert stages[stage] == schema.model_validate(before[stage]), stage
    same_eval({"eval": before["eval_eval"], "rollout": before["eval_rollout"]}, cfg.rollout,
              cfg.n_test)
    assert cfg.rollout.topk == before["oracle_k"]


@pytest.mark.parametrize("name, config, process, overrides", [
    ("train_process_evidence", "configs/rl.yaml", "evidence", ["steps=5"]),
    ("train_process_tree", "configs/rl.yaml", "tree",
     ["group_size=6", "reward.process.evidence=0.5"]),
    ("train_process_recall", None, "recall", ["data=d.jsonl", "algo.advantage=rloo"]),
])
def test_train_process_sets_the_methods_keys_as_before(name, config, process, overrides,
                                                       monkeypatch):
    """`--process` sets the method's keys between the file's and the command line's, as
    typed values (they went through YAML strings before)."""
    from seekrl.cli import app

    monkeypatch.chdir(ROOT)
    args = ["train", *(["--config", config] if config else []), "--process", process,
            "--print-config", *overrides]
    r = CliRunner().invoke(app, args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    same_run(TrainConfig, BEFORE[name], TrainConfig.model_validate(yaml.safe_load(r.stdout)))


def test_every_preset_is_a_config_of_its_stage():
    """A preset is keys of its stage's config: each loads (with the inputs a pipeline
    gives it) as that command would load your copy."""
    need = {"sft": (SFTConfig, ["data=d"]), "rl": (TrainConfig, ["data=d"]),
            "labels": (LabelConfig, ["data=d"]), "prm": (PRMConfig, ["labels=[l]"]),
            "refine": (RefineConfig, [])}
    files = sorted((PRESETS / "demo").glob("*.yaml")) + sorted((PRESETS / "prorag").glob("*.yaml"))
    assert [f.relative_to(PRESETS).as_posix() for f in files] == [
        "demo/rl.yaml", "demo/sft.yaml", "prorag/labels.yaml", "prorag/prm.yaml",
        "prorag/refine.yaml", "prorag/rl.yaml", "prorag/sft.yaml"]
    for path in files:
        schema, keys = need[path.stem]
        load_config(schema, path, keys)


def test_a_stages_own_keys_merge_sections_and_replace_mappings():
    """A stage's keys go over its preset as a config file's over the recipe's: sections
    merge, a mapping such as reward.process is replaced (prorag's RL could not drop the
    PRM: {"evidence": 1} came out as {"prm": 1, "evidence": 1}); without the PRM among
    the step rewards the pipeline gives RL no PRM to load."""
    from seekrl.prorag import stage_configs

    cfg = ProragConfig(rl={"reward": {"process": {"evidence": 1.0}}, "algo": {"beta": 0.5}})
    rl = stage_configs(cfg, prorag_paths(cfg))["rl"]
    assert rl.reward.process == {"evidence": 1.0} and rl.reward.prm is None
    assert (rl.algo.beta, rl.algo.advantage, rl.algo.mini_batch_size) == \
        (0.5, "dual_granularity", 32)                   # the preset's other algo keys kept
    plain = stage_configs(ProragConfig(), prorag_paths(ProragConfig()))["rl"]
    assert plain.reward.process == {"prm": 1.0} and plain.reward.prm.endswith("prm/final")
    # an override of a whole section does the same in seekrl train
    train = build_config(TrainConfig, {"data": "d", "reward": {"process": {"prm": 1.0}}},
                         ["reward={process: {evidence: 1.0}}"])
    assert train.reward.process == {"evidence": 1.0}


def test_a_copy_of_the_presets_is_read_and_its_bad_key_named(tmp_path):
    import shutil

    for stage in ("sft", "rl"):
        shutil.copy(PRESETS / "demo" / f"{stage}.yaml", tmp_path / f"{stage}.yaml")
    rl_yaml = tmp_path / "rl.yaml"
    rl_yaml.write_text(rl_yaml.read_text().replace("group_size: 4", "group_size: 2"))
    rl = rl_config(DemoConfig(presets=tmp_path), model="m", train_file="t", index_dir="i",
                   out="o")
    assert rl.group_size == 2 and rl.algo.mini_batch_size == 16   # one update a step
    # a copy that sets its own mini-batch keeps it (the demo wrote one update a step over it)
    rl_yaml.write_text(rl_yaml.read_text().replace("algo:\n", "algo:\n  mini_batch_size: 8\n"))
    assert rl_config(DemoConfig(presets=tmp_path), model="m", train_file="t", index_dir="i",
                     out="o").algo.mini_batch_size == 8
    (tmp_path / "sft.yaml").write_text("max_stepz: 3\n")
    with pytest.raises(ConfigError,   # a user's copy is named
                       match=r"demo sft \(preset .*sft\.yaml\): max_stepz: unknown key.*max_steps"):
        sft_config(DemoConfig(presets=tmp_path), "d", "o")
    (tmp_path / "sft.yaml").write_text("max_steps: 3\nmax_steps: 4\n")
    with pytest.raises(ConfigError, match="sft.yaml.*given twice"):
        sft_config(DemoConfig(presets=tmp_path), "d", "o")


def test_the_old_top_level_episode_keys_are_read_into_rollout():
    """SFT's topk / prompt / max_info_tokens / max_queries / max_new_tokens and ProRAG's k /
    max_turns / max_new_tokens / max_info_tokens were keys of their own: users' files and
    `max_queries=3` on the command line keep working; both places at once is refused."""
    sft = build_config(SFTConfig, {"data": "d", "topk": 2, "max_new_tokens": None},
                       ["max_queries=3", "prompt=search_r1"])
    assert (sft.rollout.topk, sft.rollout.max_queries, sft.rollout.prompt,
            sft.rollout.max_new_tokens) == (2, 3, "search_r1", 128)
    p = ProragConfig(k=3, max_turns=2)
    assert (p.rollout.topk, p.rollout.max_turns, p.rollout.max_info_tokens) == (3, 2, 256)
    with pytest.raises(ConfigError, match="max_queries: the same setting as rollout.max_queries"):
        build_config(SFTConfig, {"data": "d", "max_queries": 2, "rollout": {"max_queries": 3}})
    # a null other than max_new_tokens' is the section's to check (it was dropped unsaid)
    with pytest.raises(ConfigError, match="topk"):
        build_config(SFTConfig, {"data": "d"}, ["topk=null"])
    with pytest.raises(ConfigError, match="config: k: Input should be a valid integer"):
        build_config(ProragConfig, {"k": None})


def test_a_pipelines_stage_section_on_the_command_line_is_a_section_of_that_stage():
    """`rl={...}` had replaced the file's `rl:` keys (steps and algo dropped unsaid), and
    `rl.ranker.lr=...` had switched a co-trained ranker on with its defaults, where `seekrl
    train ranker.lr=...` is refused; the demo's stage sections alike."""
    data = {"rl": {"steps": 7, "algo": {"beta": 0.5}}}
    cfg = build_config(ProragConfig, data, ["rl={optim: {lr: 1e-6}}", "sft.max_steps=5"])
    assert cfg.rl == {"steps": 7, "algo": {"beta": 0.5}, "optim": {"lr": "1e-6"}}
    assert cfg.sft == {"max_steps": 5}
    for key, switch in (("rl.ranker.lr=1e-4", "rl.ranker.model"),
                        ("rl.simulator.noise_end=0.9", "rl.simulator.model")):
        with pytest.raises(ConfigError, match=rf"`{switch[:-6]}` is off in the config.*"
                                              rf"give {switch}=\.\.\."):
            build_config(ProragConfig, data, [key])
    on = build_config(ProragConfig, data, ["rl.ranker.model=minilm", "rl.ranker.lr=1e-4"])
    assert on.rl["ranker"] == {"model": "minilm", "lr": "1e-4"}
    # a mapping-valued key inside a stage is still replaced whole (reward.process)
    process = build_config(ProragConfig, {"rl": {"reward": {"process": {"prm": 1.0}}}},
                           ["rl.reward.process={evidence: 1.0}"])
    assert process.rl["reward"]["process"] == {"evidence": 1.0}
    demo = build_config(DemoConfig, {"rl": {"steps": 2, "algo": {"kl_coef": 0.1}}},
                        ["rl={algo: {advantage: rloo}}"])
    assert demo.rl == {"steps": 2, "algo": {"kl_coef": 0.1, "advantage": "rloo"}}
