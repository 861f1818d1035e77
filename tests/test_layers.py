"""The import graph points down (DESIGN.md, "Rooms"): each module of seekrl imports only
from its own floor or the floors below it, with function-local imports counted too;
`retrieval/` imports nothing of seekrl but `data/`, `models.py`, `errors.py` and
`runtime.py` (a server or a retriever takes plain values, never a config); `config/` holds
types and ranges and imports no registry (only `errors.py` and `runtime.py`); `rl/` never
imports `eval/` or `recipes/`; nothing imports `cli.py`; and no two rooms import each other,
however long the way round."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "seekrl"

# from the bottom up; a package's modules share its floor
FLOORS = [["errors"], ["runtime", "data"], ["models"], ["retrieval"], ["config", "plugins"],
          ["agent"], ["rewards"], ["eval", "rl"], ["recipes"], ["demo", "prorag"], ["cli"],
          ["__init__", "__main__"]]
FLOOR = {room: i for i, rooms in enumerate(FLOORS) for room in rooms}
NEVER = {("rl", "eval"), ("rl", "recipes")}
# rooms that may import only these (besides themselves)
ONLY = {"retrieval": {"data", "models", "errors", "runtime"}, "config": {"errors", "runtime"}}


def _room(module: str) -> str:
    return module.split(".")[1] if module.count(".") else "__init__"


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] if node.module != "seekrl" else \
                [f"seekrl.{a.name}" for a in node.names   # submodules, not package attributes
                 if (SRC / a.name).is_dir() or (SRC / f"{a.name}.py").is_file()]
            out += [(node.lineno, n) for n in names if n.startswith("seekrl.")]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("seekrl.")]
    return out


def _arrows() -> list[tuple[Path, int, str, str, str]]:
    """(file, line, source room, target room, imported module) for every import of another
    room."""
    out = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        source = _room(".".join(rel.parts))
        assert source in FLOOR, f"{path}: not on a floor; add its room to FLOORS (and README's Layout)"
        for line, target in _imports(path):
            room = _room(target)
            if room != source:
                out.append((path, line, source, room, target))
    return out


def test_every_import_points_down():
    wrong = [f"{path.relative_to(SRC.parent)}:{line} imports {target}"
             for path, line, source, room, target in _arrows()
             if room == "cli" or (source, room) in NEVER or FLOOR[room] > FLOOR[source]
             or (source in ONLY and room not in ONLY[source])]
    assert not wrong, "imports that point up or out of bounds:\n" + "\n".join(wrong)


def test_no_two_rooms_import_each_other():
    """Rooms on one floor may import each other's modules, but never both ways: a circle of
    rooms (a -> b -> ... -> a) is one room in two places."""
    edges: dict[str, set[str]] = {}
    for _, _, source, room, _ in _arrows():
        edges.setdefault(source, set()).add(room)

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            room = todo.pop()
            if room == goal:
                return True
            if room not in seen:
                seen.add(room)
                todo += edges.get(room, ())
        return False

    circles = sorted(f"{a} -> {b} -> ... -> {a}" for a, targets in edges.items()
                     for b in targets if reaches(b, a))
    assert not circles, "rooms in a circle:\n" + "\n".join(circles)


def test_config_error_lives_with_the_other_errors():
    import seekrl.config
    import seekrl.errors

    assert seekrl.config.ConfigError is seekrl.errors.ConfigError   # old imports still work
    assert issubclass(seekrl.errors.ConfigError, (seekrl.errors.SeekrlError, ValueError))


def test_the_attention_kernels_are_named_once():
    """The model code reads the attention names and their device rule from runtime.py (so
    it need not import the config); the schema's `rollout.attention` takes the same."""
    from seekrl import config, runtime

    assert config.ATTENTION == runtime.ATTENTION
    assert config.CUDA_ONLY_ATTENTION == runtime.CUDA_ONLY_ATTENTION
    for name in runtime.ATTENTION:
        for device in ("cpu", "cuda", "mps"):
            assert config.attention_refusal(name, device) == \
                runtime.attention_refusal(name, device)
