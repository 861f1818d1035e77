"""CPU threads: a default that leaves other processes' cores alone, the line a run starts
with, the warning on a busy machine, and `--threads` on every command that runs a model."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from seekrl import runtime
from seekrl.cli import app
from seekrl.runtime import ThreadPlan, plan_threads


@pytest.fixture
def machine(monkeypatch):
    """A 4-core machine whose busy cores and load average the test sets."""
    state = {"busy": 0.0, "load": 0.0}
    monkeypatch.setattr(runtime, "usable_cores", lambda: 4)
    monkeypatch.setattr(runtime, "busy_cores", lambda seconds=0.25: state["busy"])
    monkeypatch.setattr(runtime.os, "getloadavg", lambda: (state["load"], 0.0, 0.0))
    return state


def test_the_default_is_the_free_cores_at_least_one(machine):
    assert plan_threads(env={}).threads == 4
    machine.update(busy=1.2, load=1.5)       # one other job: one core fewer
    assert plan_threads(env={}).threads == 3
    machine.update(busy=4.0, load=6.0)       # every core taken: still one thread
    plan = plan_threads(env={})
    assert plan.threads == 1 and plan.source == "free cores"
    machine.update(busy=None, load=2.2)      # nothing to measure with: the load average
    assert plan_threads(env={}).threads == 2


def test_torchrun_processes_share_the_free_cores(machine):
    # the run's other process is busy too (starting): not counted as other work
    machine.update(busy=1.0, load=0.3)
    plan = plan_threads(env={"LOCAL_WORLD_SIZE": "2"})
    assert plan.threads == 2 and plan.busy == 0.0
    assert plan.line.startswith("threads: 2 per process, 2 processes of 4 cores")


def test_asked_for_threads_win_and_oversubscription_is_warned(machine):
    plan = plan_threads(3, env={"OMP_NUM_THREADS": "1"})
    assert (plan.threads, plan.source, plan.warning) == (3, "--threads", None)
    assert plan.line == "threads: 3 of 4 cores (--threads)"
    assert plan_threads(env={"OMP_NUM_THREADS": "2"}).threads == 2
    assert plan_threads(env={"OMP_NUM_THREADS": "junk"}).source == "free cores"
    machine.update(busy=3.0, load=3.1)
    plan = plan_threads(4, env={})
    assert plan.warning.startswith("4 threads on 1 free cores (other processes keep 3.0 "
                                   "cores busy, load average 3.10): they will wait")
    assert "; warning: 4 threads on 1 free cores" in plan.line and "\n" not in plan.line
    plan = plan_threads(env={})
    assert plan.threads == 1 and plan.warning.startswith("the machine is busy (other "
                                                         "processes keep 3.0 cores busy")
    with pytest.raises(ValueError, match="^--threads: expected at least 1, got 0$"):
        plan_threads(0)


def test_busy_cores_are_measured_from_proc_stat():
    busy = runtime.busy_cores(0.05)
    if Path("/proc/stat").is_file():   # Linux: a parser that fails must not pass as None
        assert busy is not None
    assert busy is None or 0.0 <= busy <= runtime.usable_cores() + 0.01


def test_busy_cores_under_a_cpu_quota_count_this_cgroup_not_the_host(tmp_path, monkeypatch):
    # a container that sees 16 cores with a quota of 2: the host's tenants keep the 16 busy
    # in /proc/stat; what takes this container's cores is its own cgroup's other CPU use
    (tmp_path / "cpu.max").write_text("200000 100000\n")
    stat = tmp_path / "cpu.stat"
    usage = {"usec": 5_000_000}
    stat.write_text("usage_usec 5000000\nuser_usec 4000000\n")
    monkeypatch.setattr(runtime, "CGROUP", str(tmp_path))
    monkeypatch.setattr(runtime.os, "sched_getaffinity", lambda pid: set(range(16)),
                        raising=False)
    monkeypatch.setattr(runtime, "_cpu_times", lambda cpus: pytest.fail("read /proc/stat"))
    clock = {"t": 100.0}
    monkeypatch.setattr(runtime.time, "monotonic", lambda: clock["t"])
    monkeypatch.setattr(runtime.time, "process_time", lambda: 7.0)

    def sleep(seconds):   # another process of the container uses 0.5 s of CPU in 0.5 s
        clock["t"] += seconds
        usage["usec"] += int(seconds * 1e6)
        stat.write_text(f"usage_usec {usage['usec']}\nuser_usec 4400000\n")

    monkeypatch.setattr(runtime.time, "sleep", sleep)
    assert runtime.usable_cores() == 2
    assert runtime.busy_cores(0.5) == 1.0
    plan = runtime.plan_threads(env={})
    assert (plan.cores, plan.busy, plan.threads) == (2, 1.0, 1)


def test_use_threads_sets_torch_and_survives_a_second_call():
    before = torch.get_num_threads()
    try:
        runtime.use_threads(ThreadPlan(1, 4, "--threads"))
        runtime.use_threads(ThreadPlan(2, 4, "--threads"))   # inter-op: set once, then skipped
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


# the commands that run torch; each takes --threads
MODEL_COMMANDS = [["train"], ["sft"], ["eval"], ["demo"], ["prorag"], ["refine"], ["mcts"],
                  ["prm", "train"], ["prm", "score"], ["prm", "eval"], ["simulator", "train"],
                  ["ranker", "train"], ["ranker", "eval"], ["serve"], ["index"]]


def test_every_command_that_runs_a_model_takes_threads():
    import typer.main

    group = typer.main.get_command(app)
    for path in MODEL_COMMANDS:
        cmd = group
        for name in path:
            cmd = cmd.commands[name]
        assert "threads" in {p.name for p in cmd.params}, path
        assert "threads" in inspect.signature(cmd.callback).parameters


def test_a_run_says_its_threads_and_bad_values_are_refused(tmp_path, monkeypatch):
    import json

    from seekrl.models import tiny_policy

    model, tok = tiny_policy()
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"id": "1", "question": "q?", "golden_answers": ["a"]}) + "\n")
    before = torch.get_num_threads()
    runner = CliRunner()
    try:
        r = runner.invoke(app, ["eval", "--model", str(tmp_path / "m"), "--data", str(q),
                                "--method", "direct", "--out", str(tmp_path / "e"),
                                "--max-new-tokens", "2", "--threads", "1"])
        assert r.exit_code == 0, r.output
        assert r.stderr.startswith("threads: 1 of ") and "(--threads)" in r.stderr
        assert "threads:" not in r.stdout
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    r = runner.invoke(app, ["eval", "--model", str(tmp_path / "m"), "--data", str(q),
                            "--method", "direct", "--out", str(tmp_path / "e2"),
                            "--threads", "0"])
    assert r.exit_code == 2 and "--threads: expected at least 1, got 0" in r.output
    assert not (tmp_path / "e2" / "metrics.json").exists()
    # a BM25 build runs no torch: --threads would be dropped unsaid
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "d1", "contents": "T\nsome text"}) + "\n")
    r = runner.invoke(app, ["index", "--corpus", str(corpus), "--out", str(tmp_path / "i"),
                            "--threads", "2"])
    assert r.exit_code == 2 and "--threads: dense options" in r.output
    # --print-config runs nothing: no threads line
    r = runner.invoke(app, ["sft", "data=x.jsonl", "--print-config", "--threads", "1"])
    assert r.exit_code == 0 and "threads:" not in r.output


def test_the_cli_sets_a_passive_openmp_wait_policy_before_torch_loads():
    """libgomp reads OMP_WAIT_POLICY once, when torch loads it: the CLI sets it on import,
    and importing the CLI imports no torch."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    code = ("import os, sys; import seekrl.cli; "
            "print(os.environ['OMP_WAIT_POLICY'], 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["PASSIVE", "False"]
    env["OMP_WAIT_POLICY"] = "ACTIVE"   # the user's own choice stays
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["ACTIVE", "False"]
