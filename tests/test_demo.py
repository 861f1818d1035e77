"""`seekrl demo` end to end with a tiny saved model: every stage runs and the summary,
report and viewers are written (the real model's numbers are in the README)."""

from __future__ import annotations

import json

import pytest
import torch

from seekrl.demo import run_demo
from seekrl.models import tiny_policy
from seekrl.recipes.pipeline import PRESETS, DemoConfig, demo_world


@pytest.mark.parametrize("process", [None, "evidence"])
def test_demo_pipeline_writes_summary_report_and_viewers(tmp_path, process):
    torch.set_num_threads(1)
    model, tok = tiny_policy(seed=0)
    model.save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    cfg = DemoConfig(model=str(tmp_path / "tiny"), n_test=3,
                     rollout={"max_turns": 2, "max_new_tokens": 4}, sft_batch=2,
                     sft={"max_steps": 1, "train_layers": 1},
                     rl={"steps": 2, "max_minutes": 5, "questions_per_step": 2,
                         "group_size": 2, "train_layers": 1},
                     n_show=1, process=process)
    out = tmp_path / "demo"
    summary = run_demo(out, cfg)
    for key in ("em_untrained", "em_sft", "em_rl", "n_test", "rl_steps", "minutes",
                "peak_rss_mb"):
        assert key in summary, key
    assert summary["n_test"] == 3 and summary["rl_steps"] == 2
    assert json.loads((out / "summary.json").read_text())["em_rl"] == summary["em_rl"]
    html = (out / "report.html").read_text()
    for label in ("untrained", "SFT", "RL"):
        assert label in html
    for stage in ("eval_untrained", "eval_sft", "eval_rl"):
        assert (out / stage / "viewer.html").is_file()
        questions = [json.loads(x)["example_id"]
                     for x in (out / stage / "trajectories.jsonl").read_text().splitlines()]
        assert len(questions) == 3
    assert len(list((out / "rl").glob("metrics.jsonl"))) == 1
    # the training rollouts are kept with their step rewards, in the viewer too
    assert (out / "rl" / "rollouts" / "step-1" / "viewer.html").is_file()
    if process is None:
        assert "em_rl_process" not in summary
        return
    assert summary["process"] == "evidence" and "em_rl_process" in summary
    assert summary["rl_process_rollout_tokens"] > 0
    assert "RL + evidence" in html
    viewer = (out / "rl_process" / "rollouts" / "step-1" / "viewer.html").read_text()
    assert "process reward" in viewer and "evidence" in viewer
    steps = [s for line in (out / "rl_process" / "rollouts" / "step-1" / "trajectories.jsonl")
             .read_text().splitlines() for s in json.loads(line)["steps"]]
    assert steps and all(set(s["process_parts"]) == {"evidence", "redundancy"} for s in steps)


def test_demo_refuses_an_unknown_process_method_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="process method: expected one of"):
        run_demo(tmp_path / "d", DemoConfig(process="magic"))


@pytest.mark.parametrize("bad, message", [
    ({"rl": {"algo": {"advantage": "foo"}}}, "demo rl: algo.advantage"),
    ({"rl": {"group_size": 0}}, "demo rl: group_size"),
    ({"rl": {"questions_per_step": 0}}, "questions_per_step"),
    ({"rl": {"steps": 0}}, "demo rl: steps"), ({"sft": {"max_steps": 0}}, "demo sft: max_steps"),
    ({"sft": {"optim": {"lr": -1.0}}}, "optim.lr"), ({"rl": {"max_stepz": 3}}, "max_stepz"),
    ({"rollout": {"topk": 0}}, "rollout.topk"), ({"n_test": 0}, "n_test")])
def test_a_bad_setting_fails_before_the_old_run_is_removed(tmp_path, bad, message):
    """Every stage's settings are checked before `--overwrite` removes anything: the RL
    stage's were checked only ten minutes in, after the old run was gone."""
    out = tmp_path / "d"
    out.mkdir()
    (out / "summary.json").write_text("{}")   # an earlier run
    with pytest.raises(ValueError, match=message):
        run_demo(out, DemoConfig.model_validate(bad), overwrite=True)
    assert (out / "summary.json").read_text() == "{}"
    assert sorted(p.name for p in out.iterdir()) == ["summary.json"]


@pytest.mark.parametrize("args, said", [
    (["--eval-questions", "0"], "error: --eval-questions: Input should be greater than or "
                                "equal to 1 (got 0)"),
    (["--sft-steps", "0"], "error: --sft-steps: Input should be greater than or equal to 1"),
    (["--sft-batch", "0"], "error: --sft-batch: Input should be"),
    (["--rl-steps", "0", "--group-size", "0"], "error: --rl-steps: Input should be greater "
     "than or equal to 1 (got 0); --group-size: Input should be"),
    (["--rl-minutes", "0"], "error: --rl-minutes: Input should be greater than 0"),
    (["--advantage", "foo"], "error: --advantage: expected one of"),
    (["--train-layers", "-2"], "error: --train-layers: expected 0 (every block) or more, got -2"),
])
def test_the_demo_names_the_option_a_bad_value_came_from(tmp_path, args, said):
    """`seekrl demo`'s errors named the stage's keys (`n_test`, `demo rl: steps`), which the
    user never typed; and `--train-layers -2` said ">= 1" where 0 is allowed."""
    from typer.testing import CliRunner

    from seekrl.cli import app

    r = CliRunner().invoke(app, ["demo", "--out", str(tmp_path / "d"), *args])
    text = " ".join(r.output.split())
    assert r.exit_code == 2 and said in text, r.output
    assert not (tmp_path / "d").exists()


def test_only_the_errors_of_keys_an_option_set_are_retold():
    """A message of its own holding "; " (an unknown key's list) stays one error, and text
    naming no option's key comes back as it was."""
    from seekrl.cli import _name_options

    names = {"demo rl": {"steps": "--rl-steps"}}
    unknown = "demo rl: stepz: unknown key; expected one of a, b (did you mean steps?)"
    assert _name_options(unknown, names) == unknown
    assert _name_options("demo rl: steps: Input should be >= 1 (got 0); " + unknown[9:],
                         names) == "--rl-steps: Input should be >= 1 (got 0); " + unknown
    assert _name_options("demo sft: max_steps: bad", names) == "demo sft: max_steps: bad"


def test_a_presets_bad_key_keeps_its_stage_name(tmp_path):
    """Only keys an option set are retold as the option: a bad value in the user's preset
    copy is still named by its stage and key."""
    from typer.testing import CliRunner

    from seekrl.cli import app

    presets = tmp_path / "p"
    presets.mkdir()
    for name in ("sft.yaml", "rl.yaml"):
        (presets / name).write_text((PRESETS / "demo" / name).read_text())
    rl = presets / "rl.yaml"
    rl.write_text(rl.read_text().replace("steps: 3 ", "steps: 0 "))
    r = CliRunner().invoke(app, ["demo", "--out", str(tmp_path / "d"), "--presets", str(presets)])
    bare = "".join(r.output.split())   # a long path may be wrapped anywhere
    assert r.exit_code == 2 and f"error:demorl(preset{rl}):steps:Input" in bare, r.output
    r = CliRunner().invoke(app, ["demo", "--out", str(tmp_path / "d"), "--presets", str(presets),
                                 "--rl-steps", "-1"])   # the option's value over the copy's
    text = " ".join(r.output.split())
    assert r.exit_code == 2 and "error: --rl-steps: Input should be greater than or equal to " \
        "1 (got -1)" in text, r.output


@pytest.mark.parametrize("max_queries,judge", [(1, "values"), (3, "values"), (1, "ordered")])
def test_every_oracle_turn_of_the_demo_world_fits_the_demo_turn_limit(tmp_path, max_queries,
                                                                      judge):
    """A turn the SFT data teaches but the rollouts' limit cuts is an invalid turn the policy
    was trained to write (2026-11-27: 23% of comparison answers ran past a 64-token limit).
    The demo's limit holds every sequential oracle turn of its world, with the bundled
    tokenizer; 160 (the parallel bench's limit, and `bench/sft_curve.py --judge ordered`'s)
    holds the parallel oracle's and the written-out comparisons'."""
    from seekrl.agent.oracle import write_oracle_trajectories
    from seekrl.data.qa import read_qa_jsonl
    from seekrl.data.world import generate_world, write_world
    from seekrl.models import load_tokenizer
    from seekrl.recipes.sft import load_sft_examples
    from seekrl.retrieval.index import build_index, load_index

    demo = DemoConfig()
    world = generate_world(demo_world(demo))
    paths = write_world(world, tmp_path / "world")
    index = load_index(build_index(paths["corpus"], tmp_path / "index", "bm25",
                                   show_progress=False))
    oracle = tmp_path / "oracle.jsonl"
    write_oracle_trajectories(read_qa_jsonl(paths["train"]), index, oracle,
                              k=demo.rollout.topk, max_queries=max_queries, judge=judge)
    examples, _ = load_sft_examples(oracle, load_tokenizer(demo.model),
                                    max_info_tokens=demo.rollout.max_info_tokens,
                                    only_complete=False, max_queries=max_queries)
    longest = max(e.longest_turn for e in examples)
    limit = demo.rollout.max_new_tokens if (max_queries, judge) == (1, "values") else 160
    print(f"max_queries={max_queries} judge={judge} episodes={len(examples)} longest_turn={longest} "
          f"limit={limit}")
    assert longest <= limit
