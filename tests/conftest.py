"""Shared fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parent


def _shared_dir() -> Path | None:
    """`shared/` beside the repo (/work/shared for the checkout /work/main; in CI the clone's
    sibling), or inside it."""
    repo = _TESTS.parent
    for candidate in (repo.parent / "shared", repo / "shared"):
        if candidate.is_dir():
            return candidate
    return None


@pytest.fixture
def own_parts(monkeypatch):
    """Run from the repository root (import paths such as `examples.my_parts:...` are
    relative to it), and leave the registries, sys.path and sys.modules as they were:
    importing examples/my_parts.py registers its estimator and process source under their
    bare names (`median_baseline`), which would otherwise leak into every later test."""
    import sys

    from seekrl.rewards import process
    from seekrl.rl import advantages

    monkeypatch.chdir(_TESTS.parent)
    monkeypatch.setattr(sys, "path", list(sys.path))
    saved = [(d, dict(d)) for d in (advantages.ESTIMATORS, advantages.FACTS,
                                    process.PROCESS_REWARDS)]
    modules = set(sys.modules)
    yield
    for d, before in saved:
        d.clear()
        d.update(before)
    for name in set(sys.modules) - modules:
        if name.split(".")[0] in ("examples", "badparts"):
            del sys.modules[name]


def load_bench(name: str, *, module: str | None = None, register: bool = False):
    """bench/NAME.py as a module (the benches are scripts, not a package): named `module`
    (default NAME), and put in sys.modules with `register` (where its dataclasses look their
    annotations up)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(module or name,
                                                  _TESTS.parent / "bench" / f"{name}.py")
    loaded = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[module or name] = loaded
    spec.loader.exec_module(loaded)
    return loaded


def write_archive(path: Path, files: dict[str, object]) -> Path:
    """A `.tar.gz` as `bench/records` keeps a run: each name's text, or its object as JSON."""
    import io
    import json
    import tarfile

    with tarfile.open(path, "w:gz") as tar:
        for name, obj in files.items():
            data = (obj if isinstance(obj, str) else json.dumps(obj)).encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture(scope="module")
def tiny():
    """The tiny random model with the bundled tokenizer (one per test module)."""
    from seekrl.models import tiny_policy
    return tiny_policy(seed=0)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    found = _shared_dir()
    if found is None:
        pytest.skip(f"no shared/ data folder beside the repo (looked next to {_TESTS.parent})")
    return found


@pytest.fixture(scope="session")
def hotpotqa_dir(shared_dir: Path) -> Path:
    """The 30-question HotpotQA sample with its corpus (shared/data/hotpotqa)."""
    path = shared_dir / "data" / "hotpotqa"
    if not (path / "questions.jsonl").is_file():
        pytest.skip(f"HotpotQA sample not found: expected {path / 'questions.jsonl'}")
    return path


def build_world_and_index(out: Path, **world_kw):
    """A small synthetic world written to `out` and its BM25 index: (world, paths, index dir)."""
    from seekrl.data.world import generate_world, write_world
    from seekrl.retrieval.index import build_index

    world = generate_world(**world_kw)
    paths = write_world(world, out)
    return world, paths, build_index(paths["corpus"], out / "index", "bm25", show_progress=False)


def build_lab(root: Path):
    """What the CLI and GPU tests read from disk: a seed-4 world (16 train questions), its
    BM25 index and the tiny model saved under `root / "tiny"`: (world, paths, index dir,
    model dir)."""
    from seekrl.models import tiny_policy

    world, paths, index_dir = build_world_and_index(root / "world", seed=4, entities=200,
                                                    n_train=16, n_dev=4, n_test=4)
    model, tok = tiny_policy(seed=0)
    model.save_pretrained(root / "tiny")
    tok.save_pretrained(root / "tiny")
    return world, paths, index_dir, root / "tiny"


def interrupt_at_call(monkeypatch, module, name: str, n: int):
    """`module.name` raising KeyboardInterrupt (a Ctrl-C) at its `n`-th call; returns what
    puts the real one back."""
    real, calls = getattr(module, name), []

    def stopping(*a, **k):
        calls.append(1)
        if len(calls) == n:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(module, name, stopping)
    return lambda: monkeypatch.setattr(module, name, real)
