"""bench/process_ablation.py's report on recorded results: the figures it prints, the
summary line with process_gain, and the PNG (the runs themselves are a long job)."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import load_bench as load_bench_module

BENCH = Path(__file__).resolve().parent.parent / "bench" / "process_ablation.py"


def load_bench():
    return load_bench_module("process_ablation")


def test_set_flags_are_config_keys_given_once():
    parse_sets = load_bench().parse_sets
    assert parse_sets(["optim.lr=3e-5", "algo.kl_coef=0.1"]) == {"optim.lr": "3e-5",
                                                                 "algo.kl_coef": 0.1}
    with pytest.raises(SystemExit, match="^--set: optim.lr given twice$"):
        parse_sets(["optim.lr=3e-5", "steps=5", "optim.lr=1e-4"])
    with pytest.raises(SystemExit, match="^--set: override 'lr'"):
        parse_sets(["lr"])


def test_report_means_stds_and_process_gain(tmp_path, capsys):
    bench = load_bench()
    # gigpo's mean is higher, but process_gain is the named method's, not the best's
    ems = {"outcome": [0.20, 0.22, 0.24], "evidence": [0.30, 0.26, 0.28],
           "gigpo": [0.35, 0.29, 0.32]}
    for method, values in ems.items():
        for seed, em in enumerate(values):
            d = tmp_path / "runs" / f"{method}-s{seed}"
            d.mkdir(parents=True)
            (d / "result.json").write_text(json.dumps({
                "method": method, "seed": seed, "em": em, "searches": 1.5,
                "evidence_recall": 0.6, "steps": 3, "rollout_tokens": 1000,
                "budget_met": not (method == "gigpo" and seed == 1),
                "em_by_type": {"bridge": em / 2, "single": em}}))
    bench._report(tmp_path / "runs", time.time(), "evidence")
    out = capsys.readouterr().out.strip().splitlines()
    assert "rl_gain=+nan" in out[-1]   # the start not evaluated yet: no gain claimed
    sft = tmp_path / "runs" / "eval-sft-test"
    sft.mkdir()
    (sft / "metrics.json").write_text(json.dumps({"average": {"em": 0.25}}))
    bench._report(tmp_path / "runs", time.time(), "evidence")
    out = capsys.readouterr().out.strip().splitlines()
    assert "rl_gain=-0.0300" in out[-1]   # outcome-only 0.22 against the start's 0.25
    figures = dict(kv.split("=") for line in out[:-1] for kv in line.split() if "=" in kv)
    assert float(figures["em_outcome"]) == pytest.approx(0.22)
    assert float(figures["em_std_outcome"]) == pytest.approx(0.02)
    assert float(figures["em_evidence_bridge"]) == pytest.approx(0.14)
    assert out[-1].startswith("process_ablation: ") \
        and "process_gain=+0.0600 process_gain_ci=nan..nan (unpaired means)" in out[-1]
    assert "outcome 0.220±0.020 (3 seeds)" in out[-1]
    assert "best gigpo (exploratory)" in out[-1] and "1 runs outside 10% of the budget" \
        in out[-1]
    assert figures["budget_missed_gigpo"] == "1" and figures["budget_missed_evidence"] == "0"
    assert (tmp_path / "runs" / "process_ablation.png").stat().st_size > 1000
    # a fourth seed of the named arm alone is another draw, not a gain: the unpaired gain
    # is over the seeds both arms have (it had been +0.1100, over four seeds against three)
    d = tmp_path / "runs" / "evidence-s3"
    d.mkdir()
    (d / "result.json").write_text(json.dumps({
        "method": "evidence", "seed": 3, "em": 0.50, "searches": 1.5, "evidence_recall": 0.6,
        "steps": 3, "rollout_tokens": 1000, "budget_met": True}))
    bench._report(tmp_path / "runs", time.time(), "evidence")
    out = capsys.readouterr().out.strip().splitlines()
    assert "process_gain=+0.0600 process_gain_ci=nan..nan (unpaired means)" in out[-1]


def test_prorag_bench_report_and_prorag_gain(tmp_path, capsys):
    bench = load_bench_module("prorag", module="prorag_bench")
    for seed, (pipe, outcome) in enumerate([(0.30, 0.25), (0.28, 0.27), (0.32, 0.26)]):
        d = tmp_path / "runs" / f"prorag-s{seed}"
        d.mkdir(parents=True)
        (d / "result.json").write_text(json.dumps({
            "method": "prorag", "seed": seed, "em": pipe, "em_sft": 0.1, "em_refine": 0.2,
            "searches": 1.8, "generated_tokens": 5000, "em_by_type": {"bridge": pipe / 2},
            "prm_dev": {"auc": 0.7, "pair_accuracy": 0.6}}))
        d = tmp_path / "runs" / f"outcome-s{seed}"
        d.mkdir(parents=True)
        (d / "result.json").write_text(json.dumps({
            "method": "outcome", "seed": seed, "em": outcome, "searches": 1.2, "budget": 5000,
            "rollout_tokens": 4900, "em_by_type": {"bridge": 0.05}}))
        d = tmp_path / "runs" / f"mc-s{seed}"
        d.mkdir(parents=True)
        q = {"auc": 0.6, "pair_accuracy": 0.5, "first_error_accuracy": 0.4}
        (d / "result.json").write_text(json.dumps({
            "seed": seed, "quality": {k: q for k in ("mcts_on_mcts", "mcts_on_mc",
                                                    "mc_on_mcts", "mc_on_mc")}}))
    bench._report(tmp_path, time.time(), "evidence")
    out = capsys.readouterr().out.strip().splitlines()
    figures = dict(kv.split("=") for line in out[:-1] for kv in line.split() if "=" in kv)
    assert float(figures["em_prorag"]) == pytest.approx(0.30)
    assert float(figures["em_outcome"]) == pytest.approx(0.26)
    assert float(figures["prorag_em_refine"]) == pytest.approx(0.2)
    assert float(figures["prm_mc_on_mcts_auc"]) == pytest.approx(0.6)
    # results kept no per-question answers (those written before they did): the means
    assert out[-1].startswith("prorag: ") and "prorag_gain=+0.0400 (unpaired means)" in out[-1]
    assert not any(line.startswith("paired_") for line in out)
    # with them, the gain is the paired one over the seeds both ran (seed 2's outcome run
    # lacks its answers: left out and named)
    for seed in range(3):
        for name, answers in (("prorag", [1, 1, 1, 0]), ("outcome", [1, 0, 0, 0])):
            if (name, seed) == ("outcome", 2):
                continue
            path = tmp_path / "runs" / f"{name}-s{seed}" / "result.json"
            path.write_text(json.dumps(json.loads(path.read_text()) | {
                "per_question": {f"q{i}": float(a) for i, a in enumerate(answers)}}))
    bench._report(tmp_path, time.time(), "evidence")
    out = capsys.readouterr().out.strip().splitlines()
    figures = dict(kv.split("=") for line in out[:-1] for kv in line.split() if "=" in kv)
    assert float(figures["paired_prorag_vs_outcome"]) == pytest.approx(0.5)
    assert figures["wins_prorag_vs_outcome"] == "4" and figures["dropped_prorag_vs_outcome"] == "s2"
    assert "prorag_gain=+0.5000 (95% CI +0.000 to +1.000, paired; seeds 0,1, resampling seeds" \
        in out[-1]
    # a pipeline evaluated on other questions is refused for that pair, not paired on some
    path = tmp_path / "runs" / "prorag-s0" / "result.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"per_question": {"q0": 1.0}}))
    bench._report(tmp_path, time.time(), "evidence")
    out = capsys.readouterr().out.strip().splitlines()
    assert any(line.startswith("paired_prorag_vs_outcome=refused (") for line in out)
    assert "prorag_gain=+0.0400 (unpaired means)" in out[-1]


def test_prorag_bench_keeps_runs_across_machines_from_the_same_start(tmp_path, capsys):
    """--keep: finished runs are copied out and put back on the next machine; runs from
    another SFT checkpoint (by weight digest) or other settings are refused."""
    bench = load_bench_module("prorag", module="prorag_bench")
    sft = tmp_path / "sft"
    sft.mkdir()
    (sft / "model.safetensors").write_bytes(b"weights")
    settings = {"n_test": 200, "rl_steps": 3, "baseline": "grpo"}
    work, keep = tmp_path / "w", tmp_path / "keep"
    (work / "runs" / "prorag-s0").mkdir(parents=True)
    (work / "runs" / "prorag-s0" / "result.json").write_text('{"em": 0.2}')
    bench._restore(work, keep, sft, settings)
    bench._keep(work, keep)
    assert sorted(p.name for p in keep.iterdir()) == ["prorag-s0.json", "sft.json"]
    fresh = tmp_path / "w2"                                   # the next machine
    bench._restore(fresh, keep, sft, settings)
    assert json.loads((fresh / "runs" / "prorag-s0" / "result.json").read_text()) == {"em": 0.2}
    with pytest.raises(SystemExit, match="other settings .*rl_steps 3 here 2"):
        bench._restore(fresh, keep, sft, {**settings, "rl_steps": 2})
    (sft / "model.safetensors").write_bytes(b"other weights")
    with pytest.raises(SystemExit, match="another SFT checkpoint|not comparable"):
        bench._restore(fresh, keep, sft, settings)


def test_parallel_search_bench_report(tmp_path, capsys):
    bench = load_bench_module("parallel_search", module="parallel_bench")
    rows = {"sequential": {"comparison": (0.30, 3.0, 2.5), "bridge": (0.25, 3.2, 2.2)},
            "parallel": {"comparison": (0.40, 2.0, 2.6), "bridge": (0.20, 3.1, 2.1)}}
    for side, types in rows.items():
        d = tmp_path / side
        d.mkdir()
        by_type = {t: {"em": em, "turns": turns, "queries": q, "questions": 10}
                   for t, (em, turns, q) in types.items()}
        avg = {"em": 0.3, "valid_format": 0.9, "turns": 2.5, "queries": 2.4, "searches": 1.6,
               "generated_tokens": 90.0}
        (d / "result.json").write_text(json.dumps({"side": side, "average": avg,
                                                   "by_type": by_type}))
    bench._report(tmp_path, time.time())
    out = capsys.readouterr().out.strip().splitlines()
    figures = dict(kv.split("=") for line in out[:-1] for kv in line.split() if "=" in kv)
    assert float(figures["turns_parallel_comparison"]) == 2.0
    assert "turn_ratio_comparison=0.667" in out[-1] and "em_gain_comparison=+0.100" in out[-1]
    assert "bridge EM -0.050" in out[-1]


def test_simulated_search_bench_report(tmp_path, capsys):
    bench = load_bench_module("simulated_search", module="sim_bench")
    row = {"sim_answer_contained": 0.4, "sim_gold_title_hit": 0.2, "sim_empty": 0.1,
           "malformed": 0.3, "real_answer_contained": 0.7, "real_gold_title_hit": 0.8,
           "queries": 50}
    (tmp_path / "quality-smollm2-135m.json").write_text(json.dumps(
        {"simulator": "smollm2-135m", "useful": row, "noisy": dict(row, sim_answer_contained=0.05)}))
    # per-question answers: real right on q0-q2, simulated on q0 and q3, self on none; the
    # real seed-1 run is borrowed from another folder (`from`) and read there
    answers = {"real": [1, 1, 1, 0], "simulated": [1, 0, 0, 1], "self": [0, 0, 0, 0]}
    for mode, ems in {"real": [0.30, 0.32], "simulated": [0.20, 0.24], "self": [0.1, 0.1]}.items():
        for seed, em in enumerate(ems):
            d = tmp_path / "runs" / f"{mode}-s{seed}"
            d.mkdir(parents=True)
            result = {"mode": mode, "seed": seed, "em": em, "valid_format": 0.9,
                      "em_by_type": {"bridge": em / 2, "single": em}, "budget_met": seed == 0}
            per = {f"q{i}": float(a) for i, a in enumerate(answers[mode])}
            if mode == "real" and seed == 1:
                elsewhere = tmp_path / "decide" / "outcome-s1" / "eval-test"
                elsewhere.mkdir(parents=True)
                (elsewhere / "per_question.json").write_text(json.dumps(per))
                result["from"] = str(elsewhere.parent)
            else:
                result["per_question"] = per
            (d / "result.json").write_text(json.dumps(result))
    aside = tmp_path / "runs" / "simulated-s0-flat"   # kept under another name: not counted
    aside.mkdir()
    (aside / "result.json").write_text(json.dumps({"mode": "simulated", "seed": 0, "em": 0.9}))
    bench._report(tmp_path, time.time())
    out = capsys.readouterr().out.strip().splitlines()
    assert "quality_smollm2-135m_noisy: sim_answer_contained=0.050" in out[1]
    figures = dict(kv.split("=") for line in out[:-1] for kv in line.split() if "=" in kv)
    assert float(figures["em_real"]) == pytest.approx(0.31)
    assert float(figures["em_simulated_bridge"]) == pytest.approx(0.11)
    assert figures["budget_missed_seeds_self"] == "1"
    # simulated - real per question: 0, -1, -1, +1 on both seeds
    assert float(figures["paired_simulated_vs_real"]) == pytest.approx(-0.25)
    assert figures["wins_simulated_vs_real"] == "2" and figures["losses_simulated_vs_real"] == "4"
    assert float(figures["paired_self_vs_real"]) == pytest.approx(-0.75)
    # the summary's gains are the paired ones (real - simulated for the gap), not the
    # difference of the results' own means (0.31 - 0.22 = +0.09)
    lo, hi = (float(x) for x in figures["ci95_simulated_vs_real"].split(","))
    assert lo < hi and (lo, hi) != (-hi, -lo)   # a flip that forgot to swap would show
    assert f"sim_to_real_gap=+0.2500 (95% CI {-hi:+.3f} to {-lo:+.3f}, paired; seeds 0,1" \
        in out[-1] and "6 RL runs" in out[-1]
    assert "paired_real_vs_simulated" not in figures   # the summary's alone
    assert "self_gain=-0.7500 (95% CI -1.000 to -0.250, paired; seeds 0,1" in out[-1]
    # a simulated seed evaluated on other questions: its pair with real is refused, once
    # (not again for the summary's mirrored pair), and the gap falls back to the means
    short = tmp_path / "runs" / "simulated-s1" / "result.json"
    result = json.loads(short.read_text())
    short.write_text(json.dumps(result | {"per_question": {"q0": 1.0, "q1": 0.0}}))
    bench._report(tmp_path, time.time())
    out = capsys.readouterr().out.strip().splitlines()
    refusals = [line for line in out if "=refused" in line]
    assert [line.split("=")[0] for line in refusals] == ["paired_simulated_vs_real",
                                                         "paired_simulated_vs_self"]
    assert "sim_to_real_gap=+0.0900 (unpaired means)" in out[-1]
    short.write_text(json.dumps(result))
    for path in (tmp_path / "runs").glob("*/result.json"):   # no per-question records
        path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items()
                                    if k not in ("per_question", "from")}))
    bench._report(tmp_path, time.time())
    out = capsys.readouterr().out.strip().splitlines()
    assert "sim_to_real_gap=+0.0900 (unpaired means)" in out[-1]
    assert "self_gain=-0.2100 (unpaired means)" in out[-1]


def test_dev_file_holds_the_first_dev_questions_and_refuses_too_few(tmp_path):
    from seekrl.data.qa import QAExample, read_qa_jsonl, write_qa_jsonl

    bench = load_bench()
    world = tmp_path / "world"
    world.mkdir()
    write_qa_jsonl(world / "dev.jsonl", [QAExample(id=f"d{i}", question=f"q{i}?",
                                                   golden_answers=[f"a{i}"])
                                                   for i in range(5)])
    path = bench._dev_file(tmp_path, world, 3)
    assert [q.id for q in read_qa_jsonl(path)] == ["d0", "d1", "d2"]
    with pytest.raises(SystemExit, match="--n-test: the world has 5 dev questions"):
        bench._dev_file(tmp_path, world, 6)


def test_paired_gain_counts_discordant_answers_and_bootstraps_seeds_and_questions():
    bench = load_bench()
    qs = [f"q{i}" for i in range(10)]
    per_run = {("outcome", 0): {q: 0.0 for q in qs}, ("outcome", 1): {q: 1.0 for q in qs},
               ("recall", 0): {q: float(i < 3) for i, q in enumerate(qs)},   # 3 wins
               ("recall", 1): {q: float(i != 0) for i, q in enumerate(qs)},  # 1 loss
               ("recall", 2): {q: 1.0 for q in qs}}   # no outcome run for seed 2: left out
    paired = bench._paired(per_run, "recall", "outcome", None)
    assert paired["gain"] == pytest.approx((0.3 - 0.1) / 2)
    assert paired["by_seed"] == pytest.approx([0.3, -0.1])
    assert (paired["wins"], paired["losses"], paired["questions"]) == (3, 1, 10)
    assert (paired["seeds"], paired["dropped"]) == ([0, 1], [2])
    assert paired["lo"] < paired["gain"] < paired["hi"]
    assert bench._paired(per_run, "recall", "outcome", None) == paired   # seeded: repeatable
    line = bench.paired_line("recall", "outcome", paired)
    assert "seeds_recall_vs_outcome=s0:+0.300/s1:-0.100 dropped_recall_vs_outcome=s2 " in line
    # a record of other questions (a seed evaluated on 40, or on dev) is refused, not paired
    # on the overlap
    short = per_run | {("outcome", 1): {q: 1.0 for q in qs[:4]}}
    with pytest.raises(bench.QuestionMismatch, match="outcome seed 1 and recall seed 0 "
                                                     "answered 4 and 10 questions, 4 of them"):
        bench._paired(short, "recall", "outcome", None)
    # against the start: one evaluation shared by every seed; a constant gain has no spread
    start = {q: 0.0 for q in qs}
    per_run = {("outcome", s): {q: 0.5 for q in qs} for s in range(3)}
    paired = bench._paired(per_run, "outcome", "start", start)
    assert (paired["gain"], paired["lo"], paired["hi"]) == pytest.approx((0.5, 0.5, 0.5))
    assert bench._paired(per_run, "outcome", "start", None) is None
    assert bench._paired({("a", 0): None}, "a", "outcome", None) is None


def _stand_ins(bench, monkeypatch, work, trainer, evaluate, *, take: str):
    """`_run` with a stand-in trainer and final evaluation; the bench's arguments for it."""
    import argparse

    import seekrl.recipes.train as train_mod

    cfg = argparse.Namespace(ranker=None, model_dump=lambda mode: {})
    monkeypatch.setattr(bench, "_run_config", lambda *a: (cfg, {}, 0))
    monkeypatch.setattr(bench, "evaluate_as_trained", evaluate)
    monkeypatch.setattr(train_mod, "Trainer", trainer)
    return argparse.Namespace(work_dir=work, runs_dir="runs", budget_from=None,
                              final_on="test", device="cpu", overrides={}, take=take)


def test_a_fresh_run_is_not_given_the_evaluation_an_earlier_policy_left_in_its_folder(
        tmp_path, monkeypatch):
    """Rerunning a method in its folder (result.json and checkpoints deleted) trains anew;
    the final evaluation cached there (metrics.json, per_question.json: the bench's, which
    the trainer's overwrite does not clear) was the earlier policy's and must not be read
    back as the new one's. A resumed run keeps it (the same policy, evaluated before a
    kill)."""


    bench = load_bench()
    out = tmp_path / "runs" / "outcome-s0"
    stale = out / "eval-test"
    stale.mkdir(parents=True)
    (stale / "metrics.json").write_text(json.dumps({"average": {"em": 0.99}}))
    (stale / "per_question.json").write_text(json.dumps({"q0": 1.0}))

    class FakeTrainer:
        def __init__(self, cfg, resume, overwrite):
            self.resume = resume
            # a resumed run: 30 minutes of training before this process
            self.state = SimpleNamespace(seconds_before=1800.0)

        def train(self):
            (out / "metrics.jsonl").write_text(json.dumps(
                {"step": 1, "episodes": 4, "rollout_tokens_total": 10, "searches": 1.0,
                 "reward": 0.5}) + "\n")
            return {"steps": 1, "rollout_tokens": 10, "final": str(out / "final"),
                    "minutes": 30.0}

    seen = []

    def evaluate(cfg, model_dir, final_dir, *rest):
        seen.append((final_dir / "metrics.json").is_file())
        final_dir.mkdir(parents=True, exist_ok=True)
        (final_dir / "trajectories.jsonl").write_text(json.dumps(
            {"example_id": "q0", "answer": "no", "golden_answers": ["yes"]}) + "\n")
        return {"average": {"em": 0.0, "f1": 0.0, "searches": 1.0, "evidence_recall": None,
                            "valid_format": 1.0}, "by_type": {}}

    args = _stand_ins(bench, monkeypatch, tmp_path, FakeTrainer, evaluate, take="final")
    result = bench._run("outcome", 0, None, args, None, None, None, None, None)
    assert seen == [False] and result["em"] == 0.0 and result["per_question"] == {"q0": 0.0}
    assert 30.0 <= result["minutes"] < 31   # every resume's training, then the evaluation
    assert json.loads((out / "result.json").read_text()) == json.loads(json.dumps(result))
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []
    # the step's figures kept for the curve, and the whole log beside the result
    import gzip

    assert result["train_reward"] == [0.5] and result["train_em"] == [None]
    assert result["metrics_log"] == "metrics.jsonl.gz"
    assert gzip.decompress((out / "metrics.jsonl.gz").read_bytes()) == \
        (out / "metrics.jsonl").read_bytes()


def test_take_best_judges_the_policy_of_the_best_dev_evaluation(tmp_path, monkeypatch):
    """--take best: the test questions score the run's best/ policy (not final/), on dev
    its own evaluation is read back, and the result names the step taken; without dev
    evaluations to choose from it is refused."""


    bench = load_bench()
    out = tmp_path / "runs" / "outcome-s0"

    class FakeTrainer:
        def __init__(self, cfg, resume, overwrite):
            self.state = SimpleNamespace(seconds_before=0.0)

        def train(self):
            out.mkdir(parents=True, exist_ok=True)
            (out / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in (
                {"step": 0, "dev_em": 0.3},
                {"step": 1, "episodes": 4, "rollout_tokens_total": 10, "reward": 0.5, "searches": 2},
                {"step": 1, "dev_em": 0.4},
                {"step": 2, "episodes": 4, "rollout_tokens_total": 20, "reward": 0.5, "searches": 2},
                {"step": 2, "dev_em": 0.2})) + "\n")
            step1 = out / "eval" / "step-1"
            step1.mkdir(parents=True, exist_ok=True)
            (step1 / "metrics.json").write_text(json.dumps({"average": {
                "em": 0.4, "f1": 0.4, "searches": 2.0, "evidence_recall": None,
                "valid_format": 1.0}, "by_type": {"dev": {"single": {
                    "em": 0.5, "searches": 1.0, "one_search": 1.0, "planned_lookups": 1.0}}}}))
            return {"steps": 2, "rollout_tokens": 20, "final": str(out / "final"),
                    "minutes": 1.0, "dev_dir": str(out / "eval" / "final"),
                    "best": {"step": 1, "em": 0.4, "eval_dir": str(step1),
                             "dir": str(out / "best")}}

    judged = []

    def evaluate(cfg, model_dir, final_dir, *rest):
        judged.append(model_dir)
        final_dir.mkdir(parents=True, exist_ok=True)
        return {"average": {"em": 0.5, "f1": 0.5, "searches": 2.0, "evidence_recall": None,
                            "valid_format": 1.0}, "by_type": {}}

    args = _stand_ins(bench, monkeypatch, tmp_path, FakeTrainer, evaluate, take="best")
    result = bench._run("outcome", 0, None, args, None, None, None, None, None)
    assert judged == [out / "best"] and result["em"] == 0.5
    assert (result["taken"], result["taken_step"]) == ("best", 1)
    assert result["curve"] == [(0, 0.3), (10, 0.4), (20, 0.2)]
    (out / "result.json").unlink()
    args.final_on = "dev"   # read back: the trainer evaluated that policy on dev already
    result = bench._run("outcome", 0, None, args, None, None, None, None, None)
    assert judged == [out / "best"] and result["em"] == 0.4
    assert result["hops_by_type"] == {"single": {"searches": 1.0, "one_search": 1.0,
                                                 "planned_lookups": 1.0}}
    # the report's per-type hop figures: the mean over the runs that kept them
    old = {"em_by_type": {"single": 0.2}}
    other = {"hops_by_type": {"single": {"searches": 2.0, "one_search": 0.0,
                                         "planned_lookups": None}}}
    assert bench._hops([result, old, other]) == {"single": {
        "searches": 1.5, "one_search": 0.5, "planned_lookups": 1.0}}
    from learning_curves import read_run  # the final point drawn at the step taken
    assert read_run(out).final == (1, 10, 0.4)
    args.take = "final"   # a kept result judged another way is not read back as this one
    with pytest.raises(SystemExit, match="judged by its best policy, not --take final's"):
        bench._run("outcome", 0, None, args, None, None, None, None, None)
    (out / "result.json").unlink()
    args.take = "best"
    FakeTrainer.train = lambda self: {"steps": 2, "rollout_tokens": 20,
                                      "final": str(out / "final")}
    with pytest.raises(SystemExit, match="the run saved no best policy"):
        bench._run("outcome", 0, None, args, None, None, None, None, None)


def test_per_question_em_from_trajectories_is_kept_and_bad_lines_are_named(tmp_path):
    bench = load_bench()
    d = tmp_path / "eval-test"
    d.mkdir()
    rows = [{"example_id": "q1", "answer": "Paris", "golden_answers": ["paris"]},
            {"example_id": "q2", "answer": "Rome", "golden_answers": ["Oslo"]},
            {"example_id": "q2", "answer": "Oslo", "golden_answers": ["Oslo"]}]
    (d / "trajectories.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert bench._per_question(d) == {"q1": 1.0, "q2": 0.5}
    (d / "trajectories.jsonl").unlink()   # kept: read back without the trajectories
    assert bench._per_question(d) == {"q1": 1.0, "q2": 0.5}
    assert bench._per_question(tmp_path / "absent") is None
    # trajectories written after the kept answers (an evaluation run again): read anew
    os.utime(d / "per_question.json", (1, 1))
    (d / "trajectories.jsonl").write_text(json.dumps(rows[0] | {"answer": "Rome"}) + "\n")
    assert bench._per_question(d) == {"q1": 0.0}
    # several datasets: their ids may repeat, so each question is dataset/id
    both = tmp_path / "both"
    both.mkdir()
    (both / "trajectories.jsonl").write_text("\n".join(json.dumps(r) for r in (
        rows[0] | {"dataset": "nq", "example_id": "test_0"},
        rows[1] | {"dataset": "hotpotqa", "example_id": "test_0"})) + "\n")
    assert bench._per_question(both) == {"nq/test_0": 1.0, "hotpotqa/test_0": 0.0}
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "trajectories.jsonl").write_text(json.dumps(rows[0]) + "\n{\"answer\": 1}\n")
    with pytest.raises(SystemExit, match=r"trajectories.jsonl:2: expected a trajectory"):
        bench._per_question(bad)
    # one sample a question (metrics.json): a question answered twice is a file written twice
    twice = tmp_path / "twice"
    twice.mkdir()
    (twice / "metrics.json").write_text(json.dumps({"n_samples": 1}))
    (twice / "trajectories.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(SystemExit, match=r"1 questions \(e.g. 'q2'\) answered more often than "
                                         r"the evaluation's 1 sample"):
        bench._per_question(twice)
    (twice / "metrics.json").write_text(json.dumps({"n_samples": 2}))
    assert bench._per_question(twice) == {"q1": 1.0, "q2": 0.5}


def test_report_prints_the_paired_comparison_from_kept_per_question_records(tmp_path, capsys):
    bench = load_bench()
    runs = tmp_path / "runs"
    qs = [f"q{i}" for i in range(20)]
    for method, right in {"outcome": 4, "recall": 8}.items():
        for seed in range(2):
            d = runs / f"{method}-s{seed}"
            d.mkdir(parents=True)
            per = {q: float(i < right + seed) for i, q in enumerate(qs)}
            (d / "result.json").write_text(json.dumps({
                "method": method, "seed": seed, "em": sum(per.values()) / 20, "searches": 2,
                "evidence_recall": 0.7, "steps": 10, "rollout_tokens": 1000,
                "em_by_type": {"bridge": 0.1}, "per_question": per}))
    (runs / "eval-sft-test").mkdir()
    (runs / "eval-sft-test" / "metrics.json").write_text(json.dumps({"average": {"em": 0.25}}))
    (runs / "eval-sft-test" / "per_question.json").write_text(
        json.dumps({q: float(i < 5) for i, q in enumerate(qs)}))
    bench._report(runs, time.time(), "recall")
    out = capsys.readouterr().out.strip().splitlines()
    figures = dict(kv.split("=") for line in out[:-1] for kv in line.split() if "=" in kv)
    assert float(figures["paired_recall_vs_outcome"]) == pytest.approx(0.2)
    assert figures["wins_recall_vs_outcome"] == "8" and figures["losses_recall_vs_outcome"] == "0"
    assert figures["seeds_recall_vs_start"] == "s0:+0.150/s1:+0.200"
    lo, hi = (float(x) for x in figures["ci95_recall_vs_outcome"].split(","))
    assert lo < 0.2 < hi
    # beside the bootstrap, the seeds alone by Student's t (two seeds: 1 df, t = 12.706)
    gains = [float(g.split(":")[1]) for g in figures["seeds_recall_vs_outcome"].split("/")]
    half = 12.706 * abs(gains[0] - gains[1]) / 2 ** 0.5 / 2 ** 0.5
    seed_lo, seed_hi = (float(x) for x in figures["seed_ci95_recall_vs_outcome"].split(","))
    assert (seed_lo, seed_hi) == pytest.approx((0.2 - half, 0.2 + half), abs=1e-3)
    assert (f"process_gain=+0.2000 process_gain_ci={lo:+.4f}..{hi:+.4f} (paired; seeds 0,1, "
            "resampling seeds and questions; 2 seeds barely measure the seeds' spread; over "
            f"the seeds alone (t, 1 df) {seed_lo:+.4f}..{seed_hi:+.4f})") in out[-1]


def test_a_report_on_uneven_seeds_ranks_the_named_arms_on_the_seeds_both_have(tmp_path, capsys):
    """Mid-series (recall_cost on seeds 0 and 1, outcome-only on seed 0): best_em compares
    the arms on seed 0 alone, and the paired gain names the seed it left out."""
    bench = load_bench()
    runs = tmp_path / "runs"
    qs = [f"q{i}" for i in range(10)]
    for method, seed, right in (("outcome", 0, 6), ("recall_cost", 0, 5), ("recall_cost", 1, 9)):
        d = runs / f"{method}-s{seed}"
        d.mkdir(parents=True)
        per = {q: float(i < right) for i, q in enumerate(qs)}
        (d / "result.json").write_text(json.dumps({
            "method": method, "seed": seed, "em": right / 10, "searches": 2,
            "evidence_recall": 0.7, "steps": 10, "rollout_tokens": 1000,
            "em_by_type": {"bridge": 0.1}, "per_question": per}))
    bench._report(runs, time.time(), "recall_cost")
    last = capsys.readouterr().out.strip().splitlines()[-1]
    # recall_cost's two-seed mean (0.70) is above outcome-only's 0.60; on seed 0 it is below
    assert "best_em=0.6000 (outcome, on seed 0, which both arms have)" in last
    assert ("process_gain=-0.1000 process_gain_ci=-0.3000..+0.0000 (paired; seed 0, "
            "resampling questions only; the interval holds 0; seed 1 without the other arm "
            "left out)") in last
    assert bench._named_means({"a": [{"seed": 0, "em": 0.5}], "b": [{"seed": 0, "em": 0.4}]},
                              ("a", "b")) == ({"a": 0.5, "b": 0.4}, None)


def test_a_seed_that_began_from_a_rebuilt_start_is_paired_with_that_start(tmp_path, capsys):
    """eval-sft-test-outcome-s1 (the start that run began from, rebuilt on another machine a
    few answers apart): that run's gain over the start is read against it, seed 0's
    against the shared one, with and without the set-aside questions."""
    bench = load_bench()
    runs = tmp_path / "runs"
    qs = [f"q{i}" for i in range(10)]

    def evaluation(name: str, right: set[int]) -> None:
        d = runs / name
        d.mkdir(parents=True)
        per = {q: float(i in right) for i, q in enumerate(qs)}
        (d / "metrics.json").write_text(json.dumps({"average": {"em": len(right) / 10}}))
        (d / "per_question.json").write_text(json.dumps(per))

    for seed, right in ((0, {0, 1, 2, 3, 4, 5}), (1, {0, 1, 2, 3, 4, 5, 6})):
        d = runs / f"outcome-s{seed}"
        d.mkdir(parents=True)
        (d / "result.json").write_text(json.dumps({
            "method": "outcome", "seed": seed, "em": len(right) / 10, "searches": 2,
            "evidence_recall": 0.7, "steps": 10, "rollout_tokens": 1000,
            "em_by_type": {"bridge": 0.1}, "per_question": {q: float(i in right)
                                                            for i, q in enumerate(qs)}}))
    evaluation("eval-sft-test", {0, 1, 2, 3, 4})         # seed 0: +0.1
    evaluation("eval-sft-test-outcome-s1", {0, 1, 2, 3, 4, 5})   # seed 1: +0.1 (not +0.2)
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(
        {"id": q, "question": "?", "golden_answers": ["yes" if q == "q9" else "x"]}) + "\n"
        for q in qs))
    bench._report(runs, time.time(), "recall_cost",
                  set_aside=bench._yes_no_ids(tmp_path / "q.jsonl"))
    out = capsys.readouterr().out.strip().splitlines()
    figures = dict(kv.split("=", 1) for line in out[:-1] for kv in line.split() if "=" in kv)
    assert figures["seeds_outcome_vs_start"] == "s0:+0.100/s1:+0.100"
    assert figures["seeds_outcome_without_yes_no_vs_start"] == "s0:+0.111/s1:+0.111"
    assert "rl_gain=+0.1000" in out[-1]
    assert "outcome s1 paired with the start they began from" in out[-1]
    # without the shared start: seed 1 still pairs with its own, seed 0 is left out
    (runs / "eval-sft-test" / "per_question.json").unlink()
    bench._report(runs, time.time(), "recall_cost")
    out = capsys.readouterr().out.strip().splitlines()
    figures = dict(kv.split("=", 1) for line in out[:-1] for kv in line.split() if "=" in kv)
    assert figures["seeds_outcome_vs_start"] == "s1:+0.100"
    assert "rl_gain=+0.1000" in out[-1] and "seed 0 without the other arm left out" in out[-1]
    assert "outcome s1 paired with the start they began from" in out[-1]


@pytest.mark.parametrize("layout", ["eval-start", "eval/start"])
def test_runs_are_paired_with_the_start_their_step_0_answers_show(tmp_path, capsys, layout):
    """A run's start is known by its step-0 dev answers (eval-start in kept records, a run's
    own eval/start, which was not read): a run that began where
    a run with its own start evaluation began shares that evaluation; arms of one seed that
    began apart are named, with the gain each made over its own start; runs paired with the
    shared start from two starts, a run that took step 0, and a seed one arm lacks are said."""
    bench = load_bench()
    runs = tmp_path / "runs"
    qs = [f"q{i}" for i in range(10)]

    def folder(path: Path, per: dict, em: float | None = None) -> None:
        path.mkdir(parents=True)
        (path / "per_question.json").write_text(json.dumps(per))
        if em is not None:
            (path / "metrics.json").write_text(json.dumps({"average": {"em": em}}))

    began = {"A": {"d0": 1.0, "d1": 0.0}, "B": {"d0": 1.0, "d1": 1.0}, "C": {"d0": 0.0, "d1": 0.0}}
    folder(runs / "eval-sft-test", {q: float(i < 5) for i, q in enumerate(qs)}, 0.5)   # A
    folder(runs / "eval-sft-test-outcome-s1", {q: float(i < 6) for i, q in enumerate(qs)}, 0.6)
    for method, seed, start, right, taken in (
            ("outcome", 0, "A", 6, 40), ("recall_cost", 0, "A", 7, 40),
            ("outcome", 1, "B", 7, 40), ("recall_cost", 1, "A", 7, 40),
            ("outcome", 2, "B", 7, 40), ("recall_cost", 2, "B", 8, 40),
            ("outcome", 3, "C", 6, 0)):
        d = runs / f"{method}-s{seed}"
        per = {q: float(i < right) for i, q in enumerate(qs)}
        folder(d / layout, began[start])
        (d / "result.json").write_text(json.dumps({
            "method": method, "seed": seed, "em": right / 10, "searches": 2,
            "evidence_recall": 0.7, "steps": 10, "rollout_tokens": 1000, "em_by_type": {},
            "per_question": per, "taken": "best", "taken_step": taken,
            "evaluated_on": "test"}))
    bench._report(runs, time.time(), "recall_cost")
    out = capsys.readouterr().out.strip().splitlines()
    figures = dict(kv.split("=", 1) for line in out[:-1] for kv in line.split() if "=" in kv)
    # seed 2 began where outcome s1 did: +0.1 over that start, not +0.2 over the shared one
    assert figures["seeds_outcome_vs_start"] == "s0:+0.100/s1:+0.100/s2:+0.100/s3:+0.100"
    assert any(line.startswith("start_of_recall_cost_s2=") and "(the start outcome s1 began "
               "from" in line for line in out)
    assert figures["seeds_recall_cost_vs_outcome"] == "s0:+0.100/s1:+0.000/s2:+0.100"
    assert figures["dropped_recall_cost_vs_outcome"] == "s3"
    assert figures["starts_differ_recall_cost_vs_outcome"] == "s1"
    assert figures["paired_recall_cost_vs_outcome_over_own_starts"] == "+0.1000"
    last = out[-1]
    assert "process_gain=+0.0667" in last and "seed 3 without the other arm left out" in last
    assert "recall_cost and outcome began from different starts on seed 1 (each over its own " \
        "start: +0.1000" in last
    assert ("runs paired with eval-sft-test began from 2 starts (their step-0 dev answers "
            "differ: outcome s0, outcome s3, recall_cost s0, recall_cost s1)") in last
    assert "outcome s3 took the start itself (step 0)" in last
    assert "no per-question answers" not in last
    assert "judged with different" not in last
    result = json.loads((runs / "outcome-s3" / "result.json").read_text())
    (runs / "outcome-s3" / "result.json").write_text(json.dumps({**result, "taken": "final"}))
    bench._report(runs, time.time(), "recall_cost")
    assert "runs judged with different taken: best, final" in \
        capsys.readouterr().out.strip().splitlines()[-1]


def test_simulated_bench_borrows_real_runs_only_when_trained_the_same_way(tmp_path):
    bench = load_bench_module("simulated_search", module="sim_bench")

    from seekrl.config import TrainConfig

    def cfg(temperature: float, out: str = "here"):
        return TrainConfig(data="t.jsonl", out=out, seed=1,
                           rollout={"temperature": temperature})

    theirs = cfg(0.7, out="elsewhere").model_dump(mode="json")
    theirs["rollout"].pop("attention")   # a key added since they ran, at its default here
    run = tmp_path / "decide" / "outcome-s1"
    run.mkdir(parents=True)
    (run / "result.json").write_text(json.dumps({
        "seed": 1, "em": 0.31, "searches": 2.0, "valid_format": 0.9, "steps": 10,
        "em_by_type": {"bridge": 0.2}, "rollout_tokens": 4000, "config": theirs}))
    done = tmp_path / "runs" / "real-s1" / "result.json"
    with pytest.raises(SystemExit, match=r"--real-from: .* other settings \(rollout\.temperature: "
                                         r"1\.0 here, 0\.7 there\)"):
        bench._borrowed(run, cfg(1.0), done, 200)
    assert not done.exists()
    with pytest.raises(SystemExit, match="evaluated on 3 test questions; .* first 200 test"):
        (run / "result.json").write_text(json.dumps({
            **json.loads((run / "result.json").read_text()),
            "per_question": {f"test-{i}": 1.0 for i in range(3)}}))
        bench._borrowed(run, cfg(0.7), done, 200)
    with pytest.raises(SystemExit, match=r"evaluated on \? dev questions"):
        (run / "result.json").write_text(json.dumps({
            **{k: v for k, v in json.loads((run / "result.json").read_text()).items()
               if k != "per_question"}, "evaluated_on": "dev"}))
        bench._borrowed(run, cfg(0.7), done, 200)
    (run / "result.json").write_text(json.dumps({
        **json.loads((run / "result.json").read_text()), "evaluated_on": "test",
        "per_question": {f"test-{i}": 1.0 for i in range(200)}}))
    assert not done.exists()
    got = bench._borrowed(run, cfg(0.7), done, 200)
    assert got["mode"] == "real" and got["em"] == 0.31 and got["from"] == str(run)
    # the paired report reads the borrowed run's answers from the result itself, so a
    # real arm borrowed from bench/records/ (result.json only) still pairs
    assert got["per_question"] == {f"test-{i}": 1.0 for i in range(200)}
    assert json.loads(done.read_text()) == got
    with pytest.raises(SystemExit, match="outcome-s2/result.json is missing"):
        bench._borrowed(tmp_path / "decide" / "outcome-s2", cfg(0.7), done, 200)


def test_budget_from_reads_each_seeds_outcome_tokens_and_names_what_is_missing(tmp_path):
    bench = load_bench()
    (tmp_path / "outcome-s1").mkdir()
    (tmp_path / "outcome-s1" / "result.json").write_text(json.dumps({"rollout_tokens": 46457}))
    assert bench._budget_of(tmp_path, 1) == 46457
    with pytest.raises(SystemExit, match="outcome-s2/result.json is missing"):
        bench._budget_of(tmp_path, 2)
    (tmp_path / "outcome-s3").mkdir()
    (tmp_path / "outcome-s3" / "result.json").write_text("{}")
    with pytest.raises(SystemExit, match="expected a result with rollout_tokens"):
        bench._budget_of(tmp_path, 3)


def test_prm_method_counts_the_tokens_of_every_label_folder_its_prm_was_trained_on(tmp_path):
    bench = load_bench()
    prm = tmp_path / "prm"
    (prm / "final").mkdir(parents=True)
    with pytest.raises(SystemExit, match="not a process reward model folder"):
        bench._label_tokens(prm)
    folders = []
    for name, tokens in (("a", 1200), ("b", 34)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "progress.json").write_text(json.dumps(
            {"stats": {"generated_tokens": tokens, "questions": 3}}))
        folders.append(str(tmp_path / name))
    marker = prm / "final" / "prm.json"
    marker.write_text(json.dumps({"kind": "seekrl-prm", "labels": folders}))
    assert bench._label_tokens(prm) == 1234 == bench._label_tokens(prm / "final")
    marker.write_text(json.dumps({"kind": "seekrl-prm"}))
    with pytest.raises(SystemExit, match="names no label folders"):
        bench._label_tokens(prm)
    marker.write_text(json.dumps({"kind": "seekrl-prm", "labels": [str(tmp_path / "none")]}))
    with pytest.raises(SystemExit, match="no progress.json"):
        bench._label_tokens(prm)
    (tmp_path / "a" / "progress.json").write_text(json.dumps({"done": []}))
    marker.write_text(json.dumps({"kind": "seekrl-prm", "labels": [str(tmp_path / "a")]}))
    with pytest.raises(SystemExit, match="stats.generated_tokens is missing"):
        bench._label_tokens(prm)


def test_report_against_another_setting_pairs_each_method_with_its_namesake(tmp_path, capsys):
    bench = load_bench()
    qs = [f"q{i}" for i in range(10)]
    for folder, right in {"ranker": 6, "decide": 4}.items():
        for seed in range(2):
            d = tmp_path / folder / f"outcome-s{seed}"
            d.mkdir(parents=True)
            per = {q: float(i < right) for i, q in enumerate(qs)}
            (d / "result.json").write_text(json.dumps({
                "method": "outcome", "seed": seed, "em": right / 10, "searches": 2,
                "evidence_recall": 0.7, "steps": 10, "rollout_tokens": 1000,
                "em_by_type": {"bridge": 0.1}, "per_question": per}))
    bench._report(tmp_path / "ranker", time.time(), "recall", against=tmp_path / "decide")
    out = capsys.readouterr().out.strip().splitlines()
    figures = dict(kv.split("=") for line in out[:-1] for kv in line.split() if "=" in kv)
    assert float(figures["paired_outcome_vs_outcome@decide"]) == pytest.approx(0.2)
    assert figures["wins_outcome_vs_outcome@decide"] == "4"
    # what the two folders' runs differ in is printed; kept no config here
    assert figures["settings_outcome_s0_vs@decide"] == "unknown"
    assert figures["budget_ratio_outcome_s1_vs@decide"] == "1.000"
    assert "outcome_vs_outcome@decide=+0.2000 outcome_vs_outcome@decide_ci=" in out[-1]
    for seed, extra in enumerate([{"ranker": {"model": "r"}}, {"optim": {"lr": 2}}]):
        mine_path, theirs_path = (tmp_path / f / f"outcome-s{seed}" / "result.json"
                                  for f in ("ranker", "decide"))
        mine, theirs = (json.loads(p.read_text()) for p in (mine_path, theirs_path))
        # the same run elsewhere: its paths differ, and are told apart
        mine["config"] = {"out": "a", "steps": 10, "optim": {"lr": 1}, "model": "/a/sft"} | extra
        theirs["config"] = {"out": "b", "steps": 9, "optim": {"lr": 1}, "model": "/b/sft"}
        mine["rollout_tokens"] = 1200 if seed == 0 else 1050
        mine_path.write_text(json.dumps(mine))
        theirs_path.write_text(json.dumps(theirs))
    bench._report(tmp_path / "ranker", time.time(), "recall", against=tmp_path / "decide")
    out = capsys.readouterr().out.strip().splitlines()
    assert "settings_outcome_s0_vs@decide=ranker.model paths_outcome_s0_vs@decide=model" in out
    assert "settings_outcome_s1_vs@decide=optim.lr paths_outcome_s1_vs@decide=model" in out
    assert "budget_ratio_outcome_s0_vs@decide=1.200 outside_10%=1" in out
    assert "budget_ratio_outcome_s1_vs@decide=1.050" in out
    # without per-question answers the comparison is the means', and says so
    for path in tmp_path.glob("*/outcome-s*/result.json"):
        r = json.loads(path.read_text())
        path.write_text(json.dumps({k: v for k, v in r.items() if k != "per_question"}))
    bench._report(tmp_path / "ranker", time.time(), "recall", against=tmp_path / "decide")
    out = capsys.readouterr().out.strip().splitlines()
    assert "outcome_vs_outcome@decide=+0.2000 outcome_vs_outcome@decide_ci=nan..nan " \
        "(unpaired means)" in out[-1]
    assert "paired_outcome_vs_outcome@decide=nan (no seed has both" in " ".join(out)
    # records of other questions: the pair is refused, and no difference of means stands in
    bench._paired = lambda *a, **k: (_ for _ in ()).throw(bench.QuestionMismatch("other ids"))
    bench._report(tmp_path / "ranker", time.time(), "recall", against=tmp_path / "decide")
    out = capsys.readouterr().out.strip().splitlines()
    assert "outcome_vs_outcome@decide=refused" in out[-1] and "+0.2000" not in out[-1]
    with pytest.raises(SystemExit, match="is not a runs folder"):
        bench._report(tmp_path / "ranker", time.time(), "recall", against=tmp_path / "nope")


def test_budget_from_refuses_a_run_whose_unnamed_settings_differ(tmp_path):
    """A setting compared with another folder's outcome runs (`--budget-from`) may differ in
    what it names (--set, a whole section they lacked), in the run's own keys and in keys
    added since at their default; anything else (a turn-limit default that moved) stops it."""
    from seekrl.config import TrainConfig

    bench = load_bench()
    base = {"data": "t.jsonl", "index": "idx", "out": "runs/outcome-s0",
            "rollout": {"max_new_tokens": 64, "temperature": 0.7}}
    theirs = TrainConfig.model_validate(base).model_dump(mode="json")
    theirs["rollout"].pop("attention")   # a key seekrl did not have yet when they ran
    other = tmp_path / "result.json"
    other.write_text(json.dumps({"rollout_tokens": 100, "config": theirs}))
    ranked = {**base, "out": "runs-ranker/outcome-s0", "max_rollout_tokens": 100,
              "steps": 100, "ranker": {"model": "r/final", "train": True}}
    named = {"ranker.model": "r/final", "ranker.train": True}
    bench.same_setting(TrainConfig.model_validate(ranked), other, named)   # passes
    moved = {**ranked, "rollout": {"max_new_tokens": 128, "temperature": 0.7}}
    with pytest.raises(SystemExit, match=r"rollout\.max_new_tokens: 128 here, 64 there"):
        bench.same_setting(TrainConfig.model_validate(moved), other, named)
    bench.same_setting(TrainConfig.model_validate(moved), other,
                       {**named, "rollout.max_new_tokens": 128})   # named: compared on purpose
    changed = {**ranked, "rollout": {**base["rollout"], "attention": "eager"}}
    with pytest.raises(SystemExit, match="rollout.attention"):
        bench.same_setting(TrainConfig.model_validate(changed), other, named)
    with pytest.raises(SystemExit, match="ranker"):   # a section they lacked, not named
        bench.same_setting(TrainConfig.model_validate(ranked), other, {})
    # a ranker run written when ranker.max_len / temperature defaulted to 128 / 0.05 (they
    # are None now: a saved ranker's own) trained as one at None does
    before = TrainConfig.model_validate(ranked).model_dump(mode="json")
    before["ranker"].update(max_len=128, temperature=0.05)
    older = tmp_path / "ranker-result.json"
    older.write_text(json.dumps({"rollout_tokens": 100, "config": before}))
    bench.same_setting(TrainConfig.model_validate(ranked), older, {})
    before["ranker"]["max_len"] = 64   # not the old default: a real difference
    older.write_text(json.dumps({"rollout_tokens": 100, "config": before}))
    with pytest.raises(SystemExit, match="ranker.max_len: None here, 64 there"):
        bench.same_setting(TrainConfig.model_validate(ranked), older, {})


def test_budget_from_says_when_the_other_run_keeps_no_config(tmp_path, capsys):
    from seekrl.config import TrainConfig

    bench = load_bench()
    other = tmp_path / "result.json"
    other.write_text(json.dumps({"rollout_tokens": 100}))   # written before configs were kept
    bench.same_setting(TrainConfig.model_validate({"data": "t.jsonl", "index": "i"}), other)
    assert f"--budget-from: {other} keeps no config; its settings are not compared" \
        in capsys.readouterr().err


def test_a_set_key_does_not_switch_a_section_on_or_get_replaced():
    from seekrl.config import ConfigError, TrainConfig, with_keys

    tree = {"data": "d", "rollout": {"topk": 3}}
    with pytest.raises(ConfigError, match="--set: ranker.lr: `ranker` is off"):
        with_keys(tree, {"ranker.lr": 1e-4}, TrainConfig, where="--set")
    with pytest.raises(ConfigError, match="--set: simulator.noise_end: `simulator` is off"):
        with_keys(tree, {"simulator.noise_end": 0.3}, TrainConfig, where="--set")
    with pytest.raises(ConfigError, match="rollout comes after rollout.topk, which it would "
                                          "replace"):
        with_keys(tree, {"rollout.topk": 5, "rollout": {}})
    out = with_keys(tree, {"ranker": {}, "ranker.lr": 1e-4}, TrainConfig)
    assert out["ranker"] == {"lr": 1e-4} and tree == {"data": "d", "rollout": {"topk": 3}}


def test_final_evaluation_searches_through_the_runs_ranker_with_its_episode_settings(
        tmp_path, monkeypatch):
    """A run trained with a ranker is evaluated through it (the trained one the run saved in
    final/ranker, else the configured one), and with its own episode settings (a policy
    trained to write several sub-queries a turn is allowed to at evaluation)."""
    import argparse

    import seekrl.eval.evaluate as evaluate
    import seekrl.models as models
    import seekrl.retrieval.index as index
    import seekrl.retrieval.ranker as ranker_mod
    from seekrl.config import RankerSettings
    from seekrl.recipes.pipeline import DemoConfig

    bench = load_bench()
    seen = {}
    monkeypatch.setattr(models, "load_policy", lambda *a, **k: ("policy", "tok"))
    monkeypatch.setattr(index, "load_index", lambda path: "bm25")
    monkeypatch.setattr(ranker_mod, "load_ranker",
                        lambda spec, **k: argparse.Namespace(kind="bi", spec=spec))

    def fake_eval(policy, tok, retriever, cfg, out, **kw):
        seen.update(retriever=retriever, **kw)
        return {"average": {}}

    monkeypatch.setattr(evaluate, "eval_policy", fake_eval)
    args = argparse.Namespace(device="cpu", dtype="float32", n_test=5, eval_batch=4)
    model = tmp_path / "final"
    model.mkdir()
    settings = RankerSettings(model="start/ranker", candidates=7)
    bench._evaluate(model, tmp_path / "e1", tmp_path, tmp_path / "t.jsonl", DemoConfig(), args,
                    ranker=settings, max_queries=3)
    assert seen["retriever"].ranker.spec == "start/ranker" and seen["retriever"].candidates == 7
    assert seen["episode"].max_queries == 3 and seen["run_info"]["ranker"] == "start/ranker"
    assert seen["episode"].topk == DemoConfig().rollout.topk   # the rest: the demo's
    (model / "ranker").mkdir()   # the run trained its ranker: that one is searched through
    bench._evaluate(model, tmp_path / "e2", tmp_path, tmp_path / "t.jsonl", DemoConfig(), args,
                    ranker=settings)
    assert seen["retriever"].ranker.spec == str(model / "ranker")
    bench._evaluate(model, tmp_path / "e3", tmp_path, tmp_path / "t.jsonl", DemoConfig(), args)
    assert seen["retriever"] == "bm25" and seen["run_info"] is None
    # a run's config carries both: what every trained policy (and the start) is evaluated with
    from seekrl.config import TrainConfig

    run = TrainConfig(data="t.jsonl", ranker={"model": "start/ranker", "candidates": 9},
                      rollout={"max_queries": 2, "snippet_words": 30})
    bench.evaluate_as_trained(run, tmp_path / "sft", tmp_path / "e4", tmp_path,
                              tmp_path / "t.jsonl", DemoConfig(), args)
    assert seen["retriever"].ranker.spec == "start/ranker" and seen["retriever"].candidates == 9
    assert seen["episode"].max_queries == 2 and seen["episode"].snippet_words == 30


def test_the_start_is_configured_as_the_runs_are(tmp_path):
    """The SFT start's reference evaluation takes the runs' `--set` settings (a ranker, the
    sub-queries a turn), so RL's gain is not the ranker's."""
    import argparse

    from seekrl.recipes.pipeline import DemoConfig

    bench = load_bench()
    (tmp_path / "train.jsonl").write_text("")
    args = argparse.Namespace(baseline="dr_grpo", lr=None, steps=10, device="cpu",
                              dtype="float32", eval_every=0, n_test=5, eval_batch=4,
                              overrides={"ranker.model": "r", "rollout.max_queries": 3},
                              prm=None, label_tokens=0, rl_world_seed=None)
    cfg, keys, label_tokens = bench._run_config("outcome", 0, None, args, DemoConfig(),
                                                tmp_path / "sft", tmp_path, tmp_path,
                                                tmp_path / "runs" / "outcome-s0")
    assert cfg.ranker.model == "r" and cfg.rollout.max_queries == 3 and label_tokens == 0


def test_rl_world_seed_trains_on_another_worlds_questions_and_probes_the_runs_own(
        tmp_path, monkeypatch):
    """--rl-world-seed: the rollouts play that world's training questions over its index
    (built once), the dev probes stay on WORK's world and index; the evaluations' own seed
    is refused."""
    from seekrl.recipes.pipeline import DemoConfig

    bench = load_bench()
    built = []

    def fake_world(cfg, **kw):
        built.append(cfg.seed)
        return "world"

    def fake_write(world, out):
        out.mkdir(parents=True)
        (out / "corpus.jsonl").write_text("")
        return {"corpus": out / "corpus.jsonl"}

    def fake_index(corpus, out, *a, **k):
        out.mkdir(parents=True)
        (out / "manifest.json").write_text("{}")

    monkeypatch.setattr("seekrl.data.world.generate_world", fake_world)
    monkeypatch.setattr("seekrl.data.world.write_world", fake_write)
    monkeypatch.setattr("seekrl.retrieval.index.build_index", fake_index)
    work = tmp_path / "work"
    world_dir, index_dir = work / "world", work / "index"
    args = bench.build_parser().parse_args(["--work-dir", str(work), "--eval-every", "5",
                                            "--rl-world-seed", "7"])
    args.overrides, args.label_tokens = {}, 0

    def config():
        cfg, _, _ = bench._run_config("outcome", 0, None, args, DemoConfig(), tmp_path / "sft",
                                      world_dir, index_dir, work / "runs" / "outcome-s0")
        return cfg

    cfg = config()
    other = work / "rl-world-s7"
    assert (cfg.data, cfg.index) == (str(other / "world" / "train.jsonl"), str(other / "index"))
    assert (cfg.eval.data, cfg.eval.index) == (str(world_dir / "dev.jsonl"), str(index_dir))
    config()
    assert built == [7]                        # the other world is built once
    args.rl_world_seed = None
    cfg = config()
    assert (cfg.data, cfg.index, cfg.eval.index) == (str(world_dir / "train.jsonl"),
                                                     str(index_dir), None)
    args.rl_world_seed = 0
    with pytest.raises(SystemExit, match="the evaluations' own world"):
        config()


def test_the_report_leaves_out_another_benchs_results_in_its_folder(tmp_path, capsys):
    """bench/simulated_search.py writes runs/MODE-sSEED (a `mode`, no `method`) in the same
    default folder: the report reads only its own (it stopped at a KeyError)."""
    bench = load_bench()
    for name, result in (("outcome-s0", {"method": "outcome", "seed": 0, "em": 0.3}),
                         ("self-s0", {"mode": "self", "seed": 0, "em": 0.4})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "result.json").write_text(json.dumps(result))
    assert [r.get("method") for r in bench._results(tmp_path)] == ["outcome"]


def test_simulated_bench_refuses_an_unknown_mode_before_building_anything(tmp_path):
    import subprocess
    import sys

    got = subprocess.run([sys.executable, str(BENCH.parent / "simulated_search.py"),
                          "--work-dir", str(tmp_path / "w"), "--stage", "rl",
                          "--modes", "self,sim"], capture_output=True, text=True)
    assert got.returncode != 0
    assert "--modes: expected a comma-separated subset of real,simulated,self, got 'self,sim'" \
        in got.stderr
    assert not (tmp_path / "w").exists()


def test_a_run_that_trained_its_ranker_is_not_evaluated_through_the_start_one(tmp_path):
    from seekrl.config import TrainConfig

    bench = load_bench()
    final = tmp_path / "final"
    final.mkdir()
    trained = TrainConfig(data="t.jsonl", ranker={"model": "start/ranker", "train": True})
    with pytest.raises(SystemExit, match=r"final: trained with ranker.train but holds no "
                                         r"ranker/; .*start ranker \(start/ranker\)"):
        bench.check_trained_ranker(trained, final)
    bench.check_trained_ranker(TrainConfig(data="t.jsonl", ranker={"model": "start/ranker",
                                                                   "train": False}), final)
    bench.check_trained_ranker(TrainConfig(data="t.jsonl"), final)
    (final / "ranker").mkdir()
    bench.check_trained_ranker(trained, final)


def test_one_seed_shows_no_spread_and_an_interval_over_questions_only(tmp_path, capsys):
    bench = load_bench()
    runs = tmp_path / "runs"
    qs = [f"q{i}" for i in range(10)]
    for method, right in {"outcome": 3, "recall": 6}.items():
        d = runs / f"{method}-s0"
        d.mkdir(parents=True)
        (d / "result.json").write_text(json.dumps({
            "method": method, "seed": 0, "em": right / 10, "searches": 2,
            "evidence_recall": None, "steps": 10, "rollout_tokens": 1000,
            "em_by_type": {"bridge": 0.1} if method == "outcome" else {"single": 0.5},
            "per_question": {q: float(i < right) for i, q in enumerate(qs)}}))
    # another setting kept aside under another name: not a second seed 0 of outcome
    aside = runs / "noplan-outcome-s0"
    aside.mkdir()
    (aside / "result.json").write_text(json.dumps({"method": "outcome", "seed": 0, "em": 0.9}))
    (runs / "odd").mkdir()
    (runs / "odd" / "result.json").write_text(json.dumps({"method": "outcome", "em": 0.9}))
    # a start evaluated on other questions: that pair is refused, the rest still reported
    (runs / "eval-sft-test").mkdir()
    (runs / "eval-sft-test" / "per_question.json").write_text(
        json.dumps({q: 0.0 for q in qs[:5]}))
    # a seed without per-question answers pairs with nothing, and says so
    d = runs / "evidence-s0"
    d.mkdir()
    (d / "result.json").write_text(json.dumps({
        "method": "evidence", "seed": 0, "em": 0.5, "searches": 2, "evidence_recall": 0.5,
        "steps": 10, "rollout_tokens": 1000, "em_by_type": {}}))
    bench._report(runs, time.time(), "recall")
    captured = capsys.readouterr()
    out = captured.out.strip().splitlines()
    assert "left out: " in captured.err and "noplan-outcome-s0/result.json (method outcome, " \
        "seed 0, kept under another name than outcome-s0)" in captured.err
    assert "odd/result.json (records no seed)" in captured.err
    assert "paired_outcome_vs_start=refused (the start and outcome seed 0 answered 5 and 10 " \
        "questions, 5 of them the same: pair evaluations of the same questions)" in out
    figures = dict(kv.split("=") for line in out[:-1] for kv in line.split() if "=" in kv)
    assert figures["em_std_outcome"] == "nan" and float(figures["em_outcome"]) == 0.3
    assert figures["evidence_recall_recall"] == "nan"   # none recorded: not a recall of 0
    assert float(figures["em_recall_single"]) == 0.5 and "em_recall_bridge" not in figures
    assert "paired_evidence_vs_outcome=nan (no seed has both arms' per-question answers)" in out
    assert "no per-question answers kept for evidence s0 (unpaired)" in out[-1]
    assert "outcome 0.300 (1 seed)" in out[-1]
    assert "process_gain=+0.3000 process_gain_ci=" in out[-1] and \
        "paired; seed 0, resampling questions only" in out[-1]
    # the refused pair stays refused in the summary line: no unpaired number stands in
    assert "rl_gain=refused rl_gain_ci=nan..nan (paired records differ: the start and " \
        "outcome seed 0 answered 5 and 10" in out[-1]


@pytest.mark.parametrize("argv, why", [
    (["--take", "best"], "--take best: needs --eval-every"),
    (["--final-on", "dev", "--n-test", "100", "--n-dev", "50"], "both play --n-test 100"),
    (["--stage", "keep"], "--stage keep: needs --keep-to DIR"),
])
def test_bench_refuses_settings_that_cannot_hold_before_any_work(tmp_path, monkeypatch, argv,
                                                                 why):
    import sys

    bench = load_bench()
    monkeypatch.setattr(sys, "argv", ["process_ablation.py", "--work-dir", str(tmp_path),
                                      *argv])
    with pytest.raises(SystemExit, match=why):
        bench.main()
    assert not any(tmp_path.iterdir())   # nothing built


def test_the_method_that_sets_the_budget_runs_its_steps_and_the_others_spend_it(tmp_path):
    """--budget-by METHOD: that method's run makes --steps steps and its tokens are each
    seed's budget; a budgeted run is capped by the budget (within 10x its steps), so a
    cheaper method makes more steps for the same tokens. Parsed with the bench's own
    parser, the settings another bench passes (bench/prorag.py) have every default."""
    from seekrl.recipes.pipeline import DemoConfig

    bench = load_bench()
    (tmp_path / "train.jsonl").write_text("")
    args = bench.build_parser().parse_args(["--steps", "10", "--budget-by", "recall"])
    args.overrides, args.label_tokens = {}, 0

    def config(budget):
        cfg, _, _ = bench._run_config("outcome", 0, budget, args, DemoConfig(),
                                      tmp_path / "sft", tmp_path, tmp_path,
                                      tmp_path / "runs" / "outcome-s0")
        return cfg.steps, cfg.max_rollout_tokens

    assert config(None) == (10, None) and config(5000) == (100, 5000)
    args = bench.build_parser().parse_args([])
    assert (args.budget_by, args.take, args.n_dev) == ("outcome", "final", None)


def test_set_for_gives_one_methods_runs_their_own_keys_over_set_and_the_methods(tmp_path):
    """--set-for METHOD:KEY=VALUE: arms that differ in more than their reward (the anchor on
    the process arm alone); the others keep --set's; a method not run or a malformed one
    is refused."""
    from seekrl.recipes.pipeline import DemoConfig

    bench = load_bench()
    (tmp_path / "train.jsonl").write_text("")
    args = bench.build_parser().parse_args([
        "--steps", "4", "--set", "algo.kl_coef=0.1", "--set", "algo.mini_batch_size=8",
        "--set-for", "hops:algo.kl_coef=1.0", "--set-for", "hops:reward.hop_bonus=0.25"])
    args.overrides, args.label_tokens = bench.parse_sets(args.set), 0
    args.method_sets = bench.parse_sets_for(args.set_for, ["hops", "outcome"])

    def config(method):
        cfg, keys, _ = bench._run_config(method, 0, None, args, DemoConfig(),
                                         tmp_path / "sft", tmp_path, tmp_path,
                                         tmp_path / "runs" / f"{method}-s0")
        return cfg

    hops, outcome = config("hops"), config("outcome")
    assert (hops.algo.kl_coef, hops.reward.hop_bonus, hops.algo.mini_batch_size) == \
        (1.0, 0.25, 8)
    assert (outcome.algo.kl_coef, outcome.reward.hop_bonus, outcome.algo.mini_batch_size) == \
        (0.1, 0.0, 8)
    for given, why in ((["recall:algo.kl_coef=1"], "'recall' is not among the methods run"),
                       (["hops=algo.kl_coef"], "expected METHOD:KEY=VALUE"),
                       (["hops:algo.kl_coef"], "expected METHOD:KEY=VALUE"),
                       (["hops:x=1", "hops:x=2"], "--set-for: x given twice")):
        with pytest.raises(SystemExit, match=why):
            bench.parse_sets_for(given, ["hops", "outcome"])
    with pytest.raises(Exception, match="kl_cof"):   # a key no config has
        args.method_sets = {"hops": {"algo.kl_cof": "1.0"}}
        config("hops")


def test_budget_by_runs_that_method_first_and_gives_its_tokens_to_the_others(tmp_path,
                                                                            monkeypatch):
    import sys

    bench = load_bench()
    import learning

    calls = []

    def fake_run(method, seed, budget, *rest):
        calls.append((method, seed, budget))
        return {"rollout_tokens": 1000 + seed}

    monkeypatch.setattr(learning, "_setup", lambda *a: (tmp_path, tmp_path, tmp_path / "t",
                                                        tmp_path / "sft"))
    monkeypatch.setattr(bench, "_run", fake_run)
    monkeypatch.setattr(sys, "argv", ["process_ablation.py", "--work-dir", str(tmp_path),
                                      "--stage", "rl", "--skip-sft-eval", "--seeds", "0,1",
                                      "--methods", "outcome,recall", "--budget-by", "recall"])
    bench.main()
    assert calls == [("recall", 0, None), ("outcome", 0, 1000),
                     ("recall", 1, None), ("outcome", 1, 1001)]


def test_keep_copies_finished_and_running_runs_small_and_the_report_reads_them(tmp_path, capsys,
                                                                             monkeypatch):
    bench = load_bench()
    runs, to = tmp_path / "work" / "long", tmp_path / "records" / "long"
    qs = [f"q{i}" for i in range(4)]

    def evaluation(d: Path, right: int) -> None:
        d.mkdir(parents=True)
        (d / "metrics.json").write_text(json.dumps({"average": {"em": right / 4}}))
        (d / "trajectories.jsonl").write_text("".join(json.dumps(
            {"example_id": q, "answer": "a" if i < right else "b", "golden_answers": ["a"]})
            + "\n" for i, q in enumerate(qs)))
        (d / "episodes.jsonl").write_text(f"episodes of {right}\n")

    def run(name: str, steps: int) -> Path:
        d = runs / name
        d.mkdir(parents=True)
        (d / "config.yaml").write_text("seed: 0\n")
        (d / "metrics.jsonl").write_text("".join(
            json.dumps({"step": s, "episodes": 32}) + "\n" + json.dumps({"step": s, "dev/em": 0.4})
            + "\n" for s in range(1, steps + 1)))
        (d / "checkpoints").mkdir()
        (d / "checkpoints" / "latest").write_text("step-2")
        evaluation(d / "eval" / "start", 1)
        evaluation(d / "eval" / "step-2", 2)
        return d

    done = run("outcome-s0", 2)
    evaluation(done / "eval-test", 3)
    (done / "result.json").write_text(json.dumps({
        "method": "outcome", "seed": 0, "em": 0.75, "searches": 2, "evidence_recall": 0.7,
        "steps": 2, "rollout_tokens": 1000, "em_by_type": {}, "per_question":
        {q: float(i < 3) for i, q in enumerate(qs)}}))
    going = run("recall_cost-s0", 1)
    with open(going / "metrics.jsonl", "a") as f:   # killed mid-write
        f.write('{"step": 2, "epis')
    evaluation(runs / "eval-sft-test", 1)

    bench._keep(runs, to)
    out = capsys.readouterr().out
    assert "recall_cost-s0-partial (1 steps, 1 unreadable log lines; start, step-2)" in out
    assert "outcome-s0 (2 steps; start, step-2, eval-test)" in out
    kept = to / "outcome-s0"
    assert sorted(p.name for p in kept.iterdir()) == [
        "config.yaml", "eval-start", "eval-step-2", "eval-test", "metrics.jsonl.gz", "result.json"]
    assert json.loads((kept / "eval-step-2" / "per_question.json").read_text()) == {
        "q0": 1.0, "q1": 1.0, "q2": 0.0, "q3": 0.0}
    assert sorted(p.name for p in (kept / "eval-test").iterdir()) == [
        "episodes.jsonl.gz", "metrics.json", "per_question.json"]   # no trajectories
    import gzip
    assert gzip.decompress((kept / "metrics.jsonl.gz").read_bytes()) == \
        (done / "metrics.jsonl").read_bytes()
    assert gzip.decompress((kept / "eval-test" / "episodes.jsonl.gz").read_bytes()) == \
        b"episodes of 3\n"
    before = {p: p.read_bytes() for p in to.rglob("*.gz")}
    later = time.time() + 100
    monkeypatch.setattr(time, "time", lambda: later)   # a gzip time stamp would differ
    assert (to / "recall_cost-s0-partial" / "eval-step-2" / "metrics.json").is_file()
    assert not (to / "recall_cost-s0").exists()
    assert (to / "eval-sft-test" / "per_question.json").is_file()

    # the running one finishes: its records replace the partial ones
    (going / "result.json").write_text(json.dumps({
        "method": "recall_cost", "seed": 0, "em": 1.0, "searches": 2, "evidence_recall": 0.9,
        "steps": 1, "rollout_tokens": 1000, "em_by_type": {}, "per_question":
        {q: 1.0 for q in qs}}))
    bench._keep(runs, to)
    assert all(p.read_bytes() == b for p, b in before.items() if p.exists())   # no new bytes
    assert (to / "recall_cost-s0" / "result.json").is_file()
    assert not (to / "recall_cost-s0-partial").exists()
    capsys.readouterr()
    bench._report(to, time.time(), "recall_cost")
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert "process_gain=+0.2500" in summary and "rl_gain=+0.5000" in summary
    # q3 set aside (a yes/no question, say): recall_cost's one win over outcome-only was it
    bench._report(to, time.time(), "recall_cost", set_aside={"q3"})
    out = capsys.readouterr().out.strip().splitlines()
    assert "process_gain=+0.2500" in out[-1]
    assert ("without the yes/no questions (3 left): process_gain_without_yes_no=+0.0000 "
            "process_gain_without_yes_no_ci=+0.0000..+0.0000 rl_gain_without_yes_no=+0.6667 "
            "rl_gain_without_yes_no_ci=") in out[-1]
    assert any(line.startswith("paired_outcome_without_yes_no_vs_start=+0.6667") for line in out)
    assert "set_aside_yes_no=1" in out
    bench._report(to, time.time(), "recall_cost", set_aside={"elsewhere"})
    assert "set_aside_yes_no=0 (none of the runs' questions" in capsys.readouterr().out
    questions = tmp_path / "mine.jsonl"   # data set "mine", as an evaluation names the file
    questions.write_text("".join(json.dumps({"id": q, "question": f"{q}?", "golden_answers": g})
                                 + "\n" for q, g in (("q0", ["a"]), ("q3", ["Yes", "no"]),
                                                     ("q9", ["yes", "Paris"]))))
    assert bench._yes_no_ids(questions) == {"q3", "mine/q3"}   # and as a multi-file record keys it
    # a key is matched whole: another data set's q3 stays
    assert bench._without({"mine/q3": 1.0, "nq/q3": 0.0, "q1": 1.0}, bench._yes_no_ids(questions)) \
        == {"nq/q3": 0.0, "q1": 1.0}
    with pytest.raises(SystemExit, match="is not a question file"):
        bench._yes_no_ids(tmp_path / "nowhere.jsonl")
    # another machine's start under the shared name: refused, not mixed into the records
    other = tmp_path / "elsewhere" / "long"
    shutil.rmtree(runs / "eval-sft-test")
    shutil.copytree(runs / "outcome-s0", other / "outcome-s0")
    evaluation(other / "eval-sft-test", 2)
    with pytest.raises(SystemExit, match=r"eval-sft-test holds other answers than .*"
                                         r"eval-sft-test-METHOD-sSEED"):
        bench._keep(other, to)
    assert json.loads((to / "eval-sft-test" / "per_question.json").read_text())["q1"] == 0.0

    with pytest.raises(SystemExit, match="is not a runs folder"):
        bench._keep(tmp_path / "nowhere", to)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="no runs or evaluations"):
        bench._keep(tmp_path / "empty", to)


@pytest.mark.parametrize("script, runs, must", [
    ("long_runs.sh", "long200w", {"--rl-world-seed 1", "--set rollout.temperature=1.0"}),
    ("long_runs_demo.sh", "longdemo", {"--set-for hops:algo.kl_coef=1.0", "--steps 50",
                                       "--set algo.mini_batch_size=8", "--take best"}),
])
def test_the_long_runs_script_runs_the_settings_results_names(script, runs, must):
    """bench/long_runs*.sh parse, and their runs carry every setting of the command that
    bench/RESULTS.md names for their series (its first line of options onward)."""
    import re
    import subprocess

    root = Path(__file__).resolve().parent.parent
    script = root / "bench" / script
    subprocess.run(["bash", "-n", str(script)], check=True)
    results = (root / "bench" / "RESULTS.md").read_text()
    end = results.index(f"--runs-dir {runs}\n") + len(f"--runs-dir {runs}")
    named = results[results.rindex("process_ablation.py", 0, end):end]

    def options(text: str) -> set[str]:
        text = text.replace("\\\n", " ")
        return {f"{k} {v}" for k, v in re.findall(r"(--[a-z-]+) ([^\s\\-][^\s\\]*)", text)
                if k not in ("--work-dir", "--sft", "--seeds")}

    want = options(named)
    assert must | {f"--runs-dir {runs}"} <= want
    assert want <= options(script.read_text())


@pytest.mark.parametrize("script, runs, process", [
    ("long_runs.sh", "long200w", "recall_cost"),
    ("long_runs_demo.sh", "longdemo", "hops"),
])
def test_the_long_runs_script_runs_a_kept_seed_s_outcome_arm_alone(tmp_path, script, runs,
                                                                   process):
    """A machine that lost its runs folder but keeps a seed's process run in bench/records
    runs that seed's outcome arm alone, at the kept run's rollout tokens; a seed with no
    kept process run runs both arms."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    kept = root / "bench" / "records" / runs
    seeds = sorted(int(p.parent.name.rpartition("-s")[2])
                   for p in kept.glob(f"{process}-s*/result.json"))
    assert seeds, f"no kept {process} run under {kept}"
    missing = next(s for s in range(10) if s not in seeds)
    log = tmp_path / "calls"
    stub = tmp_path / "python"   # runs `-c` snippets, records every bench call
    stub.write_text(f'#!/bin/bash\nif [ "$1" = -c ]; then exec {sys.executable} "$@"; fi\n'
                    f'echo "$*" >> {log}\n')
    stub.chmod(0o755)
    subprocess.run(["bash", str(root / "bench" / script), str(tmp_path / "work")], check=True,
                   env={**os.environ, "PYTHON": str(stub), "SNAP": str(root),
                        "SEEDS": f"{seeds[0]} {missing}"})
    calls = [c for c in log.read_text().splitlines() if "process_ablation.py" in c]
    assert len(calls) == 2
    budget = json.loads((kept / f"{process}-s{seeds[0]}" / "result.json").read_text())
    assert f"--seeds {seeds[0]} " in calls[0] and "--methods outcome " in calls[0]
    assert f"--budget {budget['rollout_tokens']}" in calls[0]
    assert f"--seeds {missing} " in calls[1] and f"--methods {process},outcome" in calls[1]
    assert "--budget " not in calls[1]
