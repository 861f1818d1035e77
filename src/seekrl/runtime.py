"""What this machine and its libraries offer, below every room: the devices torch can use,
the attention kernels a device runs, the C allocator's settings, and quieting third-party
progress bars. The config, the model and the retrieval code all need these, so they live
under all three."""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from typing import Literal, get_args

from seekrl.errors import DeviceError

__all__ = ["ATTENTION", "CUDA_ONLY_ATTENTION", "CUDNN_ATTENTION_ENV", "Attention", "ThreadPlan",
           "attention_refusal", "busy_cores", "check_device", "cudnn_attention_wanted",
           "device_problem", "fix_mmap_threshold", "hub_unreachable", "peak_rss_mb",
           "plan_threads", "quiet_transformers", "trim_heap", "usable_cores",
           "use_cudnn_attention", "use_threads"]


def device_problem(device: str) -> str | None:
    """Why `device` cannot be used here, in one line, or None when it can: cpu, cuda,
    cuda:N, mps."""
    import torch

    kind, colon, index = device.partition(":")
    if kind == "cpu" and not index:
        return None
    if kind == "cuda":
        if not torch.cuda.is_available():
            if torch.version.cuda is None:
                return (f"device {device!r}: this torch ({torch.__version__}) is a CPU build; "
                        "install a CUDA build first (`make setup-gpu`, see the README's GPU "
                        "section)")
            return (f"device {device!r}: torch has CUDA {torch.version.cuda} but sees no GPU "
                    "(check nvidia-smi and CUDA_VISIBLE_DEVICES)")
        if colon and (not index.isdigit() or int(index) >= torch.cuda.device_count()):
            return (f"device {device!r}: expected cuda or cuda:N with N below "
                    f"{torch.cuda.device_count()} (the GPUs torch sees)")
        return None
    if kind == "mps" and not index:
        return None if torch.backends.mps.is_available() else \
            f"device {device!r}: MPS is not available on this machine"
    return f"device: expected cpu, cuda, cuda:N or mps, got {device!r}"


def check_device(device: str) -> None:
    """A DeviceError in one line for a device that cannot be used (before anything loads).
    On CUDA it also applies SEEKRL_CUDNN_ATTENTION (`use_cudnn_attention`): every model
    seekrl puts on a GPU is checked here first."""
    problem = device_problem(device)
    if problem:
        raise DeviceError(problem)
    use_cudnn_attention(device)


CUDNN_ATTENTION_ENV = "SEEKRL_CUDNN_ATTENTION"


def cudnn_attention_wanted(setting: str | None, capability: tuple[int, int] | None
                           ) -> bool | None:
    """Whether PyTorch's SDPA may use cuDNN's attention, from SEEKRL_CUDNN_ATTENTION's
    `setting` and the GPU's compute capability: `on` (1) or `off` (0) everywhere; `auto`
    (unset) off on Hopper (9.x), else torch's own choice (None). Why off on Hopper: torch
    dispatches attention to cuDNN there, which builds a plan per new key length; rollouts and
    training batches keep meeting new lengths, and an H200 decoding step took 91 ms so
    against 32 ms with the efficient kernel and 30 ms eager (bench/RESULTS.md, "Rollout
    engine")."""
    value = (setting or "auto").strip().lower()
    if value in ("1", "on", "true", "yes"):
        return True
    if value in ("0", "off", "false", "no"):
        return False
    if value != "auto":
        raise DeviceError(f"{CUDNN_ATTENTION_ENV}: expected auto, on or off, got {setting!r}")
    return False if capability is not None and capability[0] == 9 else None


def use_cudnn_attention(device: str) -> bool | None:
    """Apply SEEKRL_CUDNN_ATTENTION to this process (rollouts, training and evaluation
    alike; `rollout.attention: sdpa_cudnn` still holds a decoding loop to cuDNN). Returns
    whether SDPA may use cuDNN now; None off CUDA."""
    if not device.startswith("cuda"):
        return None
    import torch

    setting = os.environ.get(CUDNN_ATTENTION_ENV)
    capability = None
    if (setting or "auto").strip().lower() == "auto":
        index = device.partition(":")[2]
        capability = torch.cuda.get_device_capability(int(index) if index else None)
    wanted = cudnn_attention_wanted(setting, capability)
    if wanted is not None:
        torch.backends.cuda.enable_cudnn_sdp(wanted)
    return torch.backends.cuda.cudnn_sdp_enabled()


# How seekrl's decoding loop computes attention (models.attention_variant): the model's
# own choice, plain matmuls, or PyTorch's SDPA held to one backend
Attention = Literal["default", "eager", "sdpa_math", "sdpa_efficient", "sdpa_flash",
                    "sdpa_cudnn"]
ATTENTION: tuple[str, ...] = get_args(Attention)
CUDA_ONLY_ATTENTION = ("sdpa_efficient", "sdpa_cudnn")   # PyTorch has them on CUDA only


def attention_refusal(name: str, device: str) -> str | None:
    """Why the `name` attention setting cannot run on `device` (cpu, cuda, cuda:1, mps), or
    None: said when a config loads, not at the first decoding step minutes later."""
    if name in CUDA_ONLY_ATTENTION and not device.startswith("cuda"):
        return (f"{name} is a CUDA kernel and the device is {device}: use default, eager, "
                "sdpa_math or sdpa_flash there")
    return None


def peak_rss_mb() -> float | None:
    """This process's own peak resident memory so far, in MB; None where neither source
    exists (Windows).

    On Linux it is VmHWM from /proc/self/status: the high-water mark of this process's own
    memory. `getrusage`'s ru_maxrss is not that: it survives `exec`, so a process started
    by a large parent (multiprocessing's spawn, a benchmark's subprocess) reports at least
    the parent's peak. Elsewhere ru_maxrss is used (macOS reports bytes, Linux KiB)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 2 ** 10, 1)   # kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
        import sys
    except ImportError:   # pragma: no cover - not on this platform
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (2 ** 20 if sys.platform == "darwin" else 2 ** 10), 1)


@functools.cache
def fix_mmap_threshold() -> bool:
    """With SEEKRL_MALLOC=<bytes>, keep glibc's malloc from raising its mmap threshold. By
    default each large block it frees raises the threshold to that block's size (up to 32
    MiB), so later tensors of that size come from the heap, whose free space fragments: the
    resident set grows past what is alive. Fixed (mallopt M_MMAP_THRESHOLD, which also turns
    the adjustment off), every larger block is its own mapping, returned when freed, and
    paid for in page faults. Off unless asked: a small threshold trades time for a lower peak
    (bench/RESULTS.md, "Evaluation memory"), which only a memory-tight machine wants. Once
    per process; a no-op off glibc. True when a threshold was fixed."""
    import os
    import sys

    setting = os.environ.get("SEEKRL_MALLOC", "").strip()
    if setting and setting != "default" and not setting.isdigit():
        raise ValueError(f"SEEKRL_MALLOC: expected 'default' or a threshold in bytes, "
                         f"got {setting!r}")
    done = False
    if sys.platform.startswith("linux") and setting.isdigit():
        try:
            done = bool(_libc().mallopt(-3, int(setting)))  # M_MMAP_THRESHOLD
        except (OSError, AttributeError):   # musl, or no mallopt
            done = False
    return done


def trim_heap() -> bool:
    """Hand the heap's free pages back to the system (glibc's `malloc_trim(0)`), between the
    steps of a training loop. The varying shapes of episode batches leave the heap's free
    space in pieces that the next step cannot always reuse, so without it the resident set
    climbs step after step past what is alive; trimming between steps stops most of that
    climb for little time. What still happens within a step only a fixed mmap threshold
    stops (SEEKRL_MALLOC, `fix_mmap_threshold`), at a larger cost in time. Skipped when
    SEEKRL_MALLOC=default; a no-op off glibc. True when memory was handed back."""
    import os
    import sys

    if not sys.platform.startswith("linux") or \
            os.environ.get("SEEKRL_MALLOC", "").strip() == "default":
        return False
    try:
        return bool(_libc().malloc_trim(0))
    except (OSError, AttributeError):   # musl, or no malloc_trim
        return False


@functools.cache
def _libc():
    import ctypes

    return ctypes.CDLL("libc.so.6")


def quiet_transformers() -> None:
    """transformers' own progress bars ("Loading weights", "Writing model shards") would
    interleave with seekrl's stage output in every recipe; seekrl reports its own progress."""
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()


_HUB: dict[str, str | None] = {}


def hub_unreachable(timeout: float = 1.5) -> str | None:
    """Why the Hugging Face hub cannot be reached from here, in a few words, or None when
    it can: offline mode set (`HF_HUB_OFFLINE`), or no TCP connection to the hub's host
    ($HF_ENDPOINT, by default huggingface.co) within `timeout` seconds. Asked once per
    process, so that a hub id fails in a second where the hub libraries would spend 30-50 s
    in retries before saying the same."""
    import os

    if "answer" not in _HUB:
        _HUB["answer"] = _probe_hub(os.environ, timeout)
    return _HUB["answer"]


def _probe_hub(env, timeout: float) -> str | None:
    import socket
    from urllib.parse import urlparse

    if env.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    url = urlparse(env.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as err:
        return f"{host} cannot be reached ({err.strerror or type(err).__name__})"
    return None


# ---------------------------------------------------------------- CPU threads

CGROUP = "/sys/fs/cgroup"   # cgroup v2's mount, where a container's CPU quota is read


def _affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):   # not Linux
        return os.cpu_count() or 1


def _quota_cores() -> int | None:
    """The cgroup v2 CPU quota (`cpu.max`) in whole cores, rounded up; None without one."""
    try:
        with open(os.path.join(CGROUP, "cpu.max")) as f:
            quota, period = f.read().split()[:2]
        return None if quota == "max" else max(1, -(-int(quota) // int(period)))
    except (OSError, ValueError):
        return None


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (a container's or taskset's
    cpuset), capped by a cgroup v2 CPU quota (`cpu.max`), at least 1."""
    quota = _quota_cores()
    return max(1, min(_affinity(), quota) if quota is not None else _affinity())


def _cpu_times(cpus: set[int] | None) -> tuple[int, int] | None:
    """(busy, total) jiffies so far over `cpus` (None: every CPU), from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            lines = [line.split() for line in f if line.startswith("cpu")]
    except OSError:
        return None
    busy = total = 0
    for name, *fields in lines:
        if name == "cpu" or (cpus is not None and int(name[3:]) not in cpus):
            continue
        ticks = [int(v) for v in fields[:8]]   # user nice system idle iowait irq softirq steal
        total += sum(ticks)
        busy += sum(ticks) - ticks[3] - ticks[4]
    return (busy, total) if total else None


def _cgroup_usage() -> float | None:
    """CPU seconds this cgroup's processes have used (cgroup v2 `cpu.stat`)."""
    try:
        with open(os.path.join(CGROUP, "cpu.stat")) as f:
            for line in f:
                key, value = line.split()[:2]
                if key == "usage_usec":
                    return int(value) / 1e6
    except (OSError, ValueError):
        pass
    return None


def busy_cores(seconds: float = 0.25) -> float | None:
    """How many of this process's cores other processes keep busy right now: the share of
    CPU time not idle over `seconds` (this process sleeps meanwhile), times the cores. None
    where /proc/stat is missing (not Linux). Measured, not the load average, whose minute of
    memory still counts a job that has just ended.

    Under a CPU quota smaller than the cores the container sees, /proc/stat counts the
    host's other tenants on all of them (16 busy cores against a quota of 2 would leave no
    core free); there the cores taken are this cgroup's other CPU use over the same time."""
    quota = _quota_cores()
    if quota is not None and quota < _affinity():
        used, own, start = _cgroup_usage(), time.process_time(), time.monotonic()
        if used is not None:
            time.sleep(seconds)
            after, elapsed = _cgroup_usage(), time.monotonic() - start
            if after is not None and elapsed > 0:
                others = (after - used) - (time.process_time() - own)
                return round(min(float(quota), max(0.0, others / elapsed)), 2)
    try:
        cpus: set[int] | None = set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = None
    before = _cpu_times(cpus)
    if before is None:
        return None
    time.sleep(seconds)
    after = _cpu_times(cpus)
    if after is None or after[1] <= before[1]:
        return None
    share = (after[0] - before[0]) / (after[1] - before[1])
    return round(share * (len(cpus) if cpus else (os.cpu_count() or 1)), 2)


@dataclass
class ThreadPlan:
    """How many threads torch uses in this run, and why."""
    threads: int
    cores: int                  # cores this process may use
    source: str                 # --threads | OMP_NUM_THREADS | free cores
    busy: float | None = None   # cores other processes kept busy at the start (measured)
    load: float | None = None   # the 1-minute load average
    processes: int = 1          # processes of this run on this machine (torchrun)

    @property
    def free(self) -> int:
        """Cores no other process keeps busy (the load average where busy is unmeasured)."""
        taken = self.busy if self.busy is not None else (self.load or 0.0)
        return max(0, self.cores - round(taken))

    @property
    def line(self) -> str:
        """What the run says at its start, on one line: the threads, why, and a warning
        when the machine is busy."""
        per = f" per process, {self.processes} processes" if self.processes > 1 else ""
        why = {"--threads": "--threads", "OMP_NUM_THREADS": "OMP_NUM_THREADS"}.get(
            self.source, "the free cores; --threads N to choose")
        text = f"threads: {self.threads}{per} of {self.cores} cores ({why})"
        return text + (f"; warning: {self.warning}" if self.warning else "")

    @property
    def warning(self) -> str | None:
        """A busy machine, or more threads than free cores: threads of two jobs that share
        a core wait for each other, which can cost several times the run's time."""
        seen = ", ".join(x for x in (
            f"other processes keep {self.busy:.1f} cores busy" if self.busy is not None
            else "", f"load average {self.load:.2f}" if self.load is not None else "") if x)
        wanted = self.threads * self.processes
        if wanted > max(self.free, 1):
            return (f"{wanted} threads on {self.free} free cores ({seen}): they will wait for "
                    "each other; fewer --threads, or one job at a time")
        if self.free < self.cores:
            return f"the machine is busy ({seen}): slower than alone"
        return None


def plan_threads(requested: int | None = None, *, env=None) -> ThreadPlan:
    """The threads a run uses: `requested` (--threads) if given, else OMP_NUM_THREADS when
    set, else the cores other processes do not keep busy right now, shared by this run's
    processes on the machine (torchrun's LOCAL_WORLD_SIZE), at least 1: a machine already
    busy degrades the default instead of oversubscribing its cores."""
    env = os.environ if env is None else env
    cores = usable_cores()
    processes = max(1, int(env.get("LOCAL_WORLD_SIZE", "1") or 1))
    try:
        load: float | None = round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        load = None
    omp = env.get("OMP_NUM_THREADS", "").strip()
    if requested is not None:
        if requested < 1:
            raise ValueError(f"--threads: expected at least 1, got {requested}")
        plan = ThreadPlan(requested, cores, "--threads", load=load, processes=processes)
    elif omp.isdigit() and int(omp) > 0:
        plan = ThreadPlan(int(omp), cores, "OMP_NUM_THREADS", load=load, processes=processes)
    else:
        plan = ThreadPlan(0, cores, "free cores", load=load, processes=processes)
    # measured for the default (a job started seconds ago is barely in the load average);
    # for a given number only to warn, so only when the load average hints at other work
    if plan.source == "free cores" or (load or 0.0) >= 0.5:
        busy = busy_cores()
        # this run's other processes start with this one (and are busy importing): theirs
        # is no other work
        plan.busy = None if busy is None else max(0.0, round(busy - (processes - 1), 2))
    if plan.source == "free cores":
        plan.threads = max(1, plan.free // processes)
    return plan


def use_threads(plan: ThreadPlan) -> None:
    """Set torch's intra-op threads (and its inter-op pool, when that can still be set).

    OpenMP's wait policy is set too, before torch is first imported (libgomp reads it once,
    when torch loads it; once torch is in, it changes nothing): PASSIVE, unless
    OMP_WAIT_POLICY is set already. By default an idle OpenMP worker spins for a while
    before it sleeps, so two torch jobs sharing cores burn each other's time in spins
    (decoding fell to 1 token/s beside one other torch process); passive workers sleep at
    once, at a small cost alone (bench/threads.py measures both)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    torch.set_num_threads(plan.threads)
    try:   # only before any inter-op work starts, and once per process
        torch.set_num_interop_threads(plan.threads)
    except RuntimeError:
        pass
