"""The import graph points down: each module of seekrl imports only from its own floor or
the floors below it (README, "Layout"), with function-local imports counted too; `rl/`
never imports `eval/` or `recipes/`, and nothing imports `cli.py`."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "seekrl"

# from the bottom up; a package's modules share its floor
FLOORS = [["errors"], ["runtime", "data"], ["retrieval", "config", "plugins", "models"],
          ["agent"], ["rewards"], ["eval", "rl"], ["recipes"], ["demo", "prorag"], ["cli"],
          ["__init__", "__main__"]]
FLOOR = {room: i for i, rooms in enumerate(FLOORS) for room in rooms}
NEVER = {("rl", "eval"), ("rl", "recipes")}


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


def test_every_import_points_down():
    wrong = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        source = _room(".".join(rel.parts))
        assert source in FLOOR, f"{path}: not on a floor; add its room to FLOORS and the README"
        for line, target in _imports(path):
            room = _room(target)
            if room == source:
                continue
            if room == "cli" or (source, room) in NEVER or FLOOR[room] > FLOOR[source]:
                wrong.append(f"{path.relative_to(SRC.parent)}:{line} imports {target}")
    assert not wrong, "imports that point up:\n" + "\n".join(wrong)


def test_config_error_lives_with_the_other_errors():
    import seekrl.config
    import seekrl.errors

    assert seekrl.config.ConfigError is seekrl.errors.ConfigError   # old imports still work
    assert issubclass(seekrl.errors.ConfigError, (seekrl.errors.SeekrlError, ValueError))
