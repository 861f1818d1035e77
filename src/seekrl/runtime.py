"""What this machine and its libraries offer, below every room: the devices torch can use,
the C allocator's settings, and quieting third-party progress bars. The retrieval and model
code both need these, so they live under both (retrieval/ may not import models.py)."""

from __future__ import annotations

import functools

from seekrl.errors import DeviceError

__all__ = ["check_device", "device_problem", "fix_mmap_threshold", "hub_unreachable",
           "peak_rss_mb", "quiet_transformers", "trim_heap"]


def device_problem(device: str) -> str | None:
    """Why `device` cannot be used here, in one line, or None when it can: cpu, cuda,
    cuda:N, mps."""
    import torch

    kind, _, index = device.partition(":")
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
        if index and (not index.isdigit() or int(index) >= torch.cuda.device_count()):
            return (f"device {device!r}: expected cuda or cuda:N with N below "
                    f"{torch.cuda.device_count()} (the GPUs torch sees)")
        return None
    if kind == "mps" and not index:
        return None if torch.backends.mps.is_available() else \
            f"device {device!r}: MPS is not available on this machine"
    return f"device: expected cpu, cuda, cuda:N or mps, got {device!r}"


def check_device(device: str) -> None:
    """A DeviceError in one line for a device that cannot be used (before anything loads)."""
    problem = device_problem(device)
    if problem:
        raise DeviceError(problem)


def peak_rss_mb() -> float | None:
    """This process's own peak resident memory so far, in MB; None where neither source
    exists (Windows).

    On Linux it is VmHWM from /proc/self/status: the high-water mark of this process's own
    memory. `getrusage`'s ru_maxrss is not that: it survives `exec`, so a process started
    by a large parent (multiprocessing's spawn, a benchmark's subprocess) reports at least
    the parent's peak (a do-nothing child of a 3 GB parent said 3,099 MB; VmHWM said 27).
    Elsewhere ru_maxrss is used (macOS reports bytes, Linux KiB)."""
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
    paid for in page faults. Off unless asked: on a bf16-mixed evaluation 131072 saved 19% of
    the peak and cost 1.48x the time, 8388608 saved nothing (bench/RESULTS.md, "Evaluation
    memory"); a memory-tight machine may still want the first. Once per process; a no-op off
    glibc. True when a threshold was fixed."""
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
    climbs step after step past what is alive: SFT at the demo's settings peaked at 3.7 GB
    after its first step (its longest batch) and 5.8 GB after 20; trimmed after every step,
    5.0 GB, at 6% more time (bench/RESULTS.md, "The demo"). The rest of the climb happens
    within a step; SEEKRL_MALLOC=131072 stops it (3.7 GB) at 1.6x the time. Skipped when
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
