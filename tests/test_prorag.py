"""`seekrl prorag` end to end with a tiny saved model: every stage runs and records itself,
the report and the PRM-scored viewer are written, resume skips finished stages, and bad
stage keys fail before any work (the real model's numbers are in the README)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from seekrl.config import ConfigError, ProragConfig
from seekrl.models import tiny_policy
from seekrl.prorag import STAGES, run_prorag


def tiny_config(tmp_path, **kw) -> ProragConfig:
    model, tok = tiny_policy(seed=0)
    model.save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    return ProragConfig(
        out=str(tmp_path / "p"), model=str(tmp_path / "tiny"), n_test=3, max_turns=2,
        max_new_tokens=4, train_layers=1,
        sft={"max_steps": 1, "batch_size": 2},
        labels={"questions": 2, "search": {"simulations": 3, "expansions": 3}},
        prm={"steps": 1, "batch_size": 2, "dev_share": 0.5},
        refine={"questions": 2, "samples": 2, "steps": 1},
        rl={"steps": 1, "questions_per_step": 2, "group_size": 2}, **kw)


def test_pipeline_runs_every_stage_and_resumes(tmp_path):
    torch.set_num_threads(1)
    cfg = tiny_config(tmp_path)
    summary = run_prorag(cfg)
    out = tmp_path / "p"
    state = json.loads((out / "pipeline.json").read_text())
    assert list(state["stages"]) == list(STAGES)
    for key in ("em_sft", "em_refine", "em_rl", "prm_dev", "generated_tokens", "stage_cost"):
        assert key in summary, key
    assert summary["labels"]["simulations"] == 6 and summary["generated_tokens"]["labels"] > 0
    assert summary["generated_tokens"]["total"] == sum(
        v for k, v in summary["generated_tokens"].items() if k != "total")
    assert (out / "labels" / "labels.jsonl").is_file() and (out / "prm" / "final" / "prm.json").is_file()
    html = (out / "report.html").read_text()
    for label in ("SFT", "refined", "RL + PRM"):
        assert label in html
    # the final policy's test episodes carry the PRM's score on every step
    steps = [s for line in (out / "eval_rl" / "trajectories.jsonl").read_text().splitlines()
             for s in json.loads(line)["steps"]]
    assert steps and all(0 < s["value"] < 1 for s in steps)
    # RL's rewards came from the PRM
    rl_steps = [s for line in (out / "rl" / "rollouts" / "step-1" / "trajectories.jsonl")
                .read_text().splitlines() for s in json.loads(line)["steps"]]
    assert rl_steps and all(set(s["process_parts"]) == {"prm"} for s in rl_steps)

    with pytest.raises(FileExistsError, match="--resume"):
        run_prorag(cfg)
    stamp = {p: p.stat().st_mtime_ns for p in (out / "sft" / "final" / "config.json",
                                               out / "labels" / "labels.jsonl",
                                               out / "prm" / "final" / "prm_head.pt",
                                               out / "rl" / "final" / "config.json")}
    again = run_prorag(cfg, resume=True)       # every stage is skipped: nothing rewritten
    assert again["em_rl"] == summary["em_rl"]
    assert all(p.stat().st_mtime_ns == t for p, t in stamp.items())
    # a run killed during refinement's fine-tuning: the finished stages are kept, RFT goes
    # on from its samples (not drawn again), RL and the evaluations run again
    samples = out / "refine" / "samples.jsonl"
    drawn = samples.stat().st_mtime_ns
    for name in ("refine", "eval_refine", "rl", "eval_rl"):
        del state["stages"][name]
    (out / "pipeline.json").write_text(json.dumps(state))
    run_prorag(cfg, resume=True)
    redone = json.loads((out / "pipeline.json").read_text())["stages"]
    assert list(redone) == list(STAGES)
    assert samples.stat().st_mtime_ns == drawn
    assert (out / "sft" / "final" / "config.json").stat().st_mtime_ns == \
        stamp[out / "sft" / "final" / "config.json"]
    assert (out / "rl" / "final" / "config.json").stat().st_mtime_ns > \
        stamp[out / "rl" / "final" / "config.json"]
    with pytest.raises(ConfigError, match="differ: n_test"):
        run_prorag(cfg.model_copy(update={"n_test": 2}), resume=True)


def test_bad_stage_keys_fail_before_any_work(tmp_path):
    with pytest.raises(ConfigError, match="prorag labels: search.simulatons: unknown key"):
        run_prorag(ProragConfig(out=str(tmp_path / "x"), labels={"search": {"simulatons": 3}}))
    # registry names are the recipes' to check, and still fail before any work
    with pytest.raises(ConfigError, match="prorag rl: algo.advantage: expected one of"):
        run_prorag(ProragConfig(out=str(tmp_path / "x"), rl={"algo": {"advantage": "ppo2"}}))
    with pytest.raises(ConfigError, match="prorag labels: reward: expected one of"):
        run_prorag(ProragConfig(out=str(tmp_path / "x"), labels={"reward": "bleu"}))
    with pytest.raises(ConfigError, match="train, test and index go together"):
        run_prorag(ProragConfig(out=str(tmp_path / "x"), train="t.jsonl"))
    # a key the pipeline fills from the stage before would be overwritten: refused
    for section, keys, name in (("labels", {"model": "m"}, "labels.model"),
                                ("refine", {"prm": "p"}, "refine.prm"),
                                ("rl", {"reward": {"prm": "p"}}, "rl.reward.prm"),
                                ("prm", {"labels": ["l"]}, "prm.labels"),
                                ("refine", {"method": "step_dpo"}, "refine.method")):
        with pytest.raises(ConfigError, match=f"{name}: the pipeline sets it"):
            run_prorag(ProragConfig(out=str(tmp_path / "x"), **{section: keys}))
    # no refined policy for RL to start from: refused before any work, not recorded done
    with pytest.raises(ConfigError, match="refine.steps: 0 trains no refined policy"):
        run_prorag(ProragConfig(out=str(tmp_path / "x"), refine={"steps": 0}))
    assert not (tmp_path / "x").exists()


def test_a_new_pipeline_refuses_an_out_holding_another_runs_stages(tmp_path):
    """Without pipeline.json each stage was written over what out held (an SFT run, a
    world and its index), with no --overwrite to ask for it."""
    (tmp_path / "x" / "sft").mkdir(parents=True)
    (tmp_path / "x" / "sft" / "metrics.jsonl").write_text("{}\n")
    (tmp_path / "x" / "index").mkdir()
    (tmp_path / "x" / "index" / "manifest.json").write_text("{}")
    with pytest.raises(FileExistsError, match="already holds index, sft and no pipeline.json"):
        run_prorag(ProragConfig(out=str(tmp_path / "x")))
    assert (tmp_path / "x" / "sft" / "metrics.jsonl").read_text() == "{}\n"


def test_a_stage_without_a_model_or_pairs_is_not_recorded_done(tmp_path, monkeypatch):
    """A stage that made no model would be skipped on every resume with the same crash
    after it; step-DPO with labels holding no pair is refused at the labels, saying that a
    resume keeps the settings. The user's sft_data is never written over by the oracle's
    episodes."""
    import seekrl.recipes.mcts as mcts
    import seekrl.recipes.sft as sft

    mine = tmp_path / "mine.jsonl"
    mine.write_text("my episodes\n")
    cfg = ProragConfig(out=str(tmp_path / "p"), sft_data=str(mine), evaluate=[],
                       refine_method="step_dpo")
    monkeypatch.setattr(sft, "run_sft", lambda *a, **k: {"final": None, "steps": 0,
                                                         "loss": None})
    with pytest.raises(RuntimeError, match="stage sft made no model"):
        run_prorag(cfg)
    state = json.loads((tmp_path / "p" / "pipeline.json").read_text())
    assert list(state["stages"]) == ["data"]
    assert mine.read_text() == "my episodes\n"
    assert (tmp_path / "p" / "oracle_train.jsonl").stat().st_size > 0
    assert state["stages"]["data"]["sft_data"] == str(mine)

    seen = {}

    def fake_sft(c, **k):
        seen["data"] = c.data
        return {"final": str(tmp_path / "sft-final"), "steps": 1, "loss": 1.0}

    monkeypatch.setattr(sft, "run_sft", fake_sft)
    monkeypatch.setattr(mcts, "run_labelling", lambda c, **k: {"out": c.out, "pairs": 0,
                                                               "resume": k["resume"]})
    with pytest.raises(ConfigError, match="step_dpo trains on sibling pairs.*new out="):
        run_prorag(cfg, resume=True)
    assert seen["data"] == str(mine)
    assert "labels" not in json.loads((tmp_path / "p" / "pipeline.json").read_text())["stages"]

    # a recorded model of this run's that is gone stops the resume naming it
    state = json.loads((tmp_path / "p" / "pipeline.json").read_text())
    state["stages"]["sft"] = {"final": str(tmp_path / "p" / "sft" / "final")}
    (tmp_path / "p" / "pipeline.json").write_text(json.dumps(state))
    with pytest.raises(FileNotFoundError, match="stage sft recorded its model at .* gone"):
        run_prorag(cfg, resume=True)

    (tmp_path / "p" / "pipeline.json").write_text('{"config": ')   # cut short
    from seekrl.errors import DataError
    with pytest.raises(DataError, match="pipeline.json.*not JSON"):
        run_prorag(cfg, resume=True)


def test_a_stopped_sft_or_prm_stage_goes_on_from_its_checkpoint(tmp_path, monkeypatch):
    """--resume continues an SFT or PRM stage from the checkpoint it left (a long SFT stage
    on a GPU was started over); a stage stopped before any checkpoint is redone."""
    import seekrl.recipes.mcts as mcts
    import seekrl.recipes.prm as prm
    import seekrl.recipes.sft as sft
    from seekrl.recipes import refine

    calls: list[tuple[str, bool, bool]] = []
    stop = {"sft": 1, "prm": 2}     # how many times each stage is stopped before it finishes

    def stage(name: str, needs: str | None = None):
        def run(c, **k):
            calls.append((name, k["resume"], k["overwrite"]))
            if stop[name]:
                stop[name] -= 1
                ck = Path(c.out) / "checkpoints" / f"step-{len(calls)}"
                ck.mkdir(parents=True)
                if needs and stop[name] == 0:     # the PRM's first stop left no state.pt
                    (ck / needs).write_text("state")
                (Path(c.out) / "checkpoints" / "latest").write_text(ck.name)
                raise RuntimeError(f"{name} stopped")
            final = Path(c.out) / "final"
            final.mkdir(parents=True)
            return {"final": str(final), "steps": 2, "loss": 1.0}
        return run

    monkeypatch.setattr(sft, "run_sft", stage("sft"))
    monkeypatch.setattr(prm, "train_prm", stage("prm", needs="state.pt"))
    monkeypatch.setattr(mcts, "run_labelling", lambda c, **k: {"out": c.out, "pairs": 3})
    monkeypatch.setattr(refine, "run_refine", lambda c, **k: (_ for _ in ()).throw(
        RuntimeError("refine stopped")))
    cfg = ProragConfig(out=str(tmp_path / "p"), evaluate=[])
    with pytest.raises(RuntimeError, match="sft stopped"):
        run_prorag(cfg)
    for stopped in ("prm stopped", "prm stopped", "refine stopped"):
        with pytest.raises(RuntimeError, match=stopped):
            run_prorag(cfg, resume=True)
    assert calls == [("sft", False, True),    # a fresh run: the stage's own folder
                     ("sft", True, False),    # resumed from its checkpoint
                     ("prm", False, True),
                     ("prm", False, True),    # its checkpoint had no state.pt: redone
                     ("prm", True, False)]


def test_the_prm_backbone_is_the_users_choice(tmp_path):
    from seekrl.prorag import stage_configs

    paths = {"sft_data": "d.jsonl", "train": "t.jsonl", "test": "q.jsonl", "index": "i"}
    default = stage_configs(ProragConfig(out=str(tmp_path)), paths)
    assert default["prm"].model == str(tmp_path / "sft" / "final")   # the SFT policy
    chosen = stage_configs(ProragConfig(out=str(tmp_path), prm={"model": "org/other-lm"}), paths)
    assert chosen["prm"].model == "org/other-lm"
    assert chosen["rl"].save_every == 1     # a stopped RL stage resumes from its checkpoint


def test_only_the_asked_for_policies_are_evaluated(tmp_path):
    torch.set_num_threads(1)
    summary = run_prorag(tiny_config(tmp_path, evaluate=["rl"]))
    out = tmp_path / "p"
    stages = json.loads((out / "pipeline.json").read_text())["stages"]
    assert "eval_sft" not in stages and "eval_refine" not in stages and "eval_rl" in stages
    assert summary["em_sft"] is None and summary["em_refine"] is None
    assert summary["em_rl"] is not None
    assert not (out / "eval_sft").exists()
    html = (out / "report.html").read_text()
    assert "not evaluated" in html and "RL + PRM" in html


def test_a_prm_no_better_than_chance_is_called_out():
    from seekrl.prorag import prm_warning

    assert "no better than chance" in prm_warning({"auc": 0.49, "points": 20})
    assert "could not be measured" in prm_warning({"auc": None, "points": 3,
                                                   "positive_share": 0.0})
    assert prm_warning({"auc": 0.71, "points": 40}) is None
    assert prm_warning({"auc": None, "pairs": 30, "pair_accuracy": 0.8}) is None
    assert "no better than chance" in prm_warning({"auc": None, "pairs": 9,
                                                   "pair_accuracy": 0.5})


def test_step_dpo_in_the_pipeline_accumulates_as_set():
    """Step-DPO honours grad_accum, so the pipeline passes the preset's 2 pairs a forward x
    4 and a user's grad_accum as given; it had folded the preset into 8 pairs a forward, so
    that refine.grad_accum: 2 made 16 pairs an update."""
    from seekrl.prorag import input_paths, stage_configs

    cfg = ProragConfig(out="p", refine_method="step_dpo")
    refine = stage_configs(cfg, input_paths(cfg))["refine"]
    assert (refine.batch_size, refine.grad_accum) == (2, 4)
    cfg = ProragConfig(out="p", refine_method="step_dpo", refine={"grad_accum": 2})
    refine = stage_configs(cfg, input_paths(cfg))["refine"]
    assert (refine.batch_size, refine.grad_accum) == (2, 2)

