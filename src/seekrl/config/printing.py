"""The config as `--print-config` prints it: YAML with each key's note beside it."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel

from seekrl.config.loading import ConfigDumper


def field_notes() -> dict[tuple[str, str], str]:
    """(class, field) -> the comment written beside the field in schema.py (on its line
    and the comment lines under it), else the comment block just above it: the one place
    a key is described, which `--print-config` prints beside the key."""
    import ast
    import io
    import tokenize

    from seekrl.config import schema

    src = Path(schema.__file__).read_text(encoding="utf-8")
    lines = src.splitlines()
    comments = {t.start[0]: (t.start[1], t.string.lstrip("#").strip())
                for t in tokenize.generate_tokens(io.StringIO(src).readline)
                if t.type == tokenize.COMMENT}

    def alone(n: int) -> bool:   # a line holding only a comment
        return n in comments and lines[n - 1].lstrip().startswith("#")

    notes = {}
    for node in ast.parse(src).body:
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                continue
            col = item.col_offset
            text = [comments[n][1] for n in range(item.lineno, item.end_lineno + 1)
                    if n in comments and not alone(n)]
            n = item.end_lineno + 1
            while text and alone(n) and comments[n][0] > col:   # its note's next lines
                text.append(comments[n][1])
                n += 1
            if not text:
                n = item.lineno - 1
                while alone(n) and comments[n][0] == col:
                    text.insert(0, comments[n][1])
                    n -= 1
            if text:
                notes[(node.name, item.target.id)] = " ".join(text)
    return notes


def annotated_yaml(cfg: BaseModel) -> str:
    """The config as YAML, every key with its value and, where the schema has one, its
    note as a comment; it loads back to the same config."""
    notes = field_notes()
    out: list[str] = []

    def note(model: BaseModel, name: str) -> str:
        for klass in type(model).__mro__:
            if (klass.__name__, name) in notes:
                return f"  # {notes[(klass.__name__, name)]}"
        return ""

    def walk(model: BaseModel, pad: str) -> None:
        values = model.model_dump(mode="json")
        for name in type(model).model_fields:
            value = getattr(model, name)
            if isinstance(value, BaseModel):
                out.append(f"{pad}{name}:{note(model, name)}")
                walk(value, pad + "  ")
                continue
            text = yaml.dump(values[name], Dumper=ConfigDumper, default_flow_style=True,
                             width=10**9, sort_keys=False).strip()
            text = text.removesuffix("\n...").removesuffix("...").strip()
            out.append(f"{pad}{name}: {text}{note(model, name)}")

    walk(cfg, "")
    return "\n".join(out) + "\n"
