"""Reading a config: a YAML file, `key.sub=value` overrides on top, validated by a schema.

A bad input is a `ConfigError` that names its source (the file and line, or the command
line) and the key: `algo.clip_lo: unknown key; expected one of ... (did you mean clip_low?)`.
Nothing is silently dropped: a key given twice, a value YAML would cut or read as octal,
a key that would replace one set before it, or one that would switch a section on unsaid.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, get_args

import yaml
from pydantic import BaseModel, ValidationError

from seekrl.errors import ConfigError

C = TypeVar("C", bound=BaseModel)


# ---------------------------------------------------------------------- dotted keys
# The one home of `a.b.c` keys over nested config trees (overrides, method keys, a stage's
# settings, the labeller's record of them).


def set_dotted(tree: dict, dotted: str, value: Any) -> None:
    """`tree[a][b] = value` for "a.b", in place; a missing (or null) section is created."""
    keys = dotted.split(".")
    node = tree
    for k in keys[:-1]:
        if node.get(k) is None:
            node[k] = {}
        if not isinstance(node[k], dict):
            raise ConfigError(f"{dotted}: {k!r} is a value, not a section")
        node = node[k]
    node[keys[-1]] = value


def with_keys(tree: dict, keys: dict[str, Any] | list[tuple[str, Any]],
              schema: type[BaseModel] | None = None,
              where: str = "override") -> dict:
    """A copy of `tree` with the dotted `keys` set in order (the original is left alone).
    A key that would replace one set before it (`ranker={}` after `ranker.lr`) is refused;
    with `schema`, so is one that would switch an optional section on by the way
    (`_check_switches`). `where` names the keys' source in those errors."""
    out = copy.deepcopy(tree)
    given: list[list[str]] = []
    values: list[Any] = []
    for dotted, value in (keys.items() if isinstance(keys, dict) else keys):
        parts = dotted.split(".")
        under = next((k for k in given if len(k) > len(parts) and k[:len(parts)] == parts),
                     None)
        if under is not None:
            raise ConfigError(f"{where}: {dotted} comes after {'.'.join(under)}, which it "
                              f"would replace; give {dotted} first")
        if parts in given:   # the last would win unsaid
            raise ConfigError(f"{where}: {dotted} is given twice; give it once")
        for k, earlier in zip(given, values):   # `optim={lr: 2} optim.lr=3`: 2 was dropped
            if len(k) < len(parts) and k == parts[:len(k)] and \
                    _holds(earlier, parts[len(k):]):
                raise ConfigError(f"{where}: {dotted} is given twice (in {'.'.join(k)} "
                                  "too); give it once")
        if isinstance(value, dict) and schema is not None and _is_section(schema, parts):
            # a section given whole keeps the file's other keys of it (`algo={advantage:
            # rloo}` does not reset the file's micro_batch_size), as a file's partial
            # section keeps the recipe's defaults; a mapping-valued key (reward.process)
            # is replaced
            here = _get_dotted(out, parts)
            if isinstance(here, dict):
                value = merged(here, value, schema, parts)
        set_dotted(out, dotted, value)
        given.append(parts)
        values.append(value)
    if schema is not None:
        _check_switches(schema, tree, given, where)
    return out


def _holds(value: Any, parts: list[str]) -> bool:
    """`value` (a mapping given whole) has the key path `parts`."""
    for part in parts:
        if not isinstance(value, dict) or part not in value:
            return False
        value = value[part]
    return True


def _get_dotted(tree: dict, parts: list[str]) -> Any:
    node: Any = tree
    for part in parts:
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _child(node: Any, part: str) -> tuple[Any, type[BaseModel] | None]:
    """The field `part` of the config class `node`, and the section class under it: the
    field's model class, or for a pipeline's stage section (a mapping of one stage's keys,
    named in the class's `stage_schemas`) that stage's config class; None for a value."""
    field = getattr(node, "model_fields", {}).get(part)
    if field is None:
        return None, None
    stage = getattr(node, "stage_schemas", {}).get(part)
    return field, stage if stage is not None else _section_class(field.annotation)


def _is_section(schema: type[BaseModel], parts: list[str]) -> bool:
    """The dotted key names a section of the schema (a model, or a pipeline's stage), not a
    mapping-valued key."""
    node: Any = schema
    for part in parts:
        field, node = _child(node, part)
        if field is None:
            return False
    return node is not None


def merged(base: dict, top: dict, schema: type[BaseModel] | None = None,
           at: list[str] | None = None) -> dict:
    """`top`'s keys over a copy of `base`, section by section. With `schema` (the tree's
    type; `at`, where the two dicts sit in it) only its sections merge: a mapping-valued
    key such as reward.process is replaced whole, as an override replaces it."""
    out = copy.deepcopy(base)
    for k, v in top.items():
        path = [*(at or []), k]
        section = schema is None or _is_section(schema, path)
        out[k] = merged(out[k], v, schema, path) \
            if section and isinstance(v, dict) and isinstance(out.get(k), dict) \
            else copy.deepcopy(v)
    return out


def flat_keys(tree: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1} (an empty section stays a key of its own)."""
    out: dict = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            out.update(flat_keys(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def parse_override(text: str) -> tuple[str, Any]:
    """`a.b=value` -> ("a.b", value parsed as a YAML scalar: 1e-5, true, [a, b], null)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r}: expected key.sub=value")
    if re.search(r"(^|\s)#", raw) and not re.match(r"""\s*["'\[{]""", raw):
        # YAML would read the rest as a comment: `out=runs/exp #2` became runs/exp
        raise ConfigError(f"override {text!r}: ' #' starts a YAML comment, which would cut "
                          f"the value; quote it: {key}='\"{raw.strip()}\"'")
    if re.fullmatch(r"\s*[-+]?0[0-9_]+\s*", raw):
        raise ConfigError(f"override {text!r}: a leading 0 makes YAML read an octal number "
                          f"({yaml.safe_load(raw)}); write it without")
    if re.fullmatch(r"\s*[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?\s*", raw):
        raise ConfigError(f"override {text!r}: YAML reads this as a base-60 number "
                          f"({yaml.safe_load(raw)}); quote it")
    try:   # the file's loader: a key twice, octal or base 60 inside [...] / {...} refused
        value = yaml.load(raw, Loader=_UniqueKeyLoader) if raw.strip() else ""
    except yaml.constructor.ConstructorError as err:
        raise ConfigError(f"override {text!r}: {err.problem}") from None
    except yaml.YAMLError:
        value = raw
    # YAML reads 1e-5 as a string; pydantic turns it into the float the field wants.
    return key, value


def _describe(schema: type[BaseModel], err: dict) -> str:
    loc = ".".join(str(p) for p in err["loc"])
    if err["type"] == "extra_forbidden":
        node: Any = schema
        for part in err["loc"][:-1]:
            field = getattr(node, "model_fields", {}).get(part)
            node = _section_class(field.annotation) if field is not None else None
        known = sorted(getattr(node, "model_fields", {}) or [])
        hint = _did_you_mean(schema, [str(p) for p in err["loc"]], known)
        return f"{loc}: unknown key; expected one of {', '.join(known)}" + \
            (f" (did you mean {hint}?)" if hint else "")
    if err["type"] == "missing":
        return f"{loc}: required key is missing"
    got = err.get("input")
    msg = err["msg"].removeprefix("Value error, ")
    last = str(err["loc"][-1]) if err["loc"] else ""
    if last and msg.startswith(last) and msg[len(last):len(last) + 1] in (" ", ":"):
        text = loc[:len(loc) - len(last)] + msg   # a check's message that names its key
    else:
        text = f"{loc or '(top level)'}: {msg}"
    # said once: seekrl's own checks say what they got; pydantic's messages never do
    # ("greater than 0" holds a 0 that is not the value)
    if isinstance(got, dict) or re.search(r"\bgot\b", msg):
        return text
    return f"{text} (got {got!r})"


def _key_paths(schema: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every key of a schema, sections' keys by their path: ("optim", "lr")."""
    out = []
    for name, field in schema.model_fields.items():
        out.append((*prefix, name))
        section = _section_class(field.annotation)
        if section is not None:
            out += _key_paths(section, (*prefix, name))
    return out


def _did_you_mean(schema: type[BaseModel], loc: list[str], siblings: list[str]) -> str | None:
    """The key an unknown one was likely meant to be: a close spelling beside it
    (`ranker.lrr` -> lr), else the same name in another section (`lr` -> optim.lr), else a
    close spelling of the whole path."""
    import difflib

    name = loc[-1]
    close = difflib.get_close_matches(name, siblings, n=1, cutoff=0.75)
    if close:
        return close[0]
    paths = _key_paths(schema)
    elsewhere = [".".join(p) for p in paths if p[-1] == name and list(p) != loc]
    if elsewhere:
        return " or ".join(elsewhere[:3])
    close = difflib.get_close_matches(".".join(loc), [".".join(p) for p in paths], n=1,
                                      cutoff=0.8)
    return close[0] if close else None


def _section_class(annotation) -> type[BaseModel] | None:
    """The model class of a section's annotation (`RankerSettings | None` -> RankerSettings)."""
    for t in (annotation, *get_args(annotation)):
        if isinstance(t, type) and issubclass(t, BaseModel):
            return t
    return None


def _check_switches(schema: type[BaseModel], data: dict, given: list[list[str]],
                    where: str = "command line") -> None:
    """A key given on the command line under a section that is off (null or absent) in the
    config, such as `ranker.lr=1e-4`, would switch the whole section on with its defaults
    for the sake of one setting. A section whose class names a `switch` key (the simulator's
    and the ranker's model) is switched on only by that key or by the section itself."""
    for key in given:
        node, here = schema, data
        for depth, part in enumerate(key[:-1]):
            field, section = _child(node, part)
            if section is None:
                break
            here = here.get(part) if isinstance(here, dict) else None
            switch = getattr(section, "switch", None)
            if here is None and switch and field.default is None:
                name = ".".join(key[:depth + 1])
                if [*key[:depth + 1], switch] not in given and key[:depth + 1] not in given:
                    raise ConfigError(
                        f"{where}: {'.'.join(key)}: `{name}` is off in the config, and "
                        f"one of its keys does not switch it on; give {name}.{switch}=... "
                        f"too (or {name}={{}} for its defaults)")
                break
            node = section


def build_config(schema: type[C], data: dict | None, overrides: list[str] = (),
                 source: str = "config",
                 key_lines: Callable[[], dict[tuple, int]] | None = None) -> C:
    """`key_lines`: gives the file line of each key path of `data` (`_key_lines`), asked
    only when the config is refused, so that the error names its line."""
    pairs = [parse_override(text) for text in overrides]
    given = [key.split(".") for key, _ in pairs]   # the keys set on the command line
    tree = with_keys(data or {}, pairs, schema, where="command line")
    try:
        return schema.model_validate(tree)
    except ValidationError as err:
        errors = [{**e, "loc": _as_written(schema, tree, e["loc"])} for e in err.errors()]
        lines = [_describe(schema, e) for e in errors]

        def overridden(loc) -> bool:   # the failing key, or a key above it, was given
            path = [str(part) for part in loc]
            return bool(path) and any(path[:len(k)] == k for k in given)

        def across(loc) -> bool:   # a check of a section (or the top) with a key given in it
            path = [str(part) for part in loc]
            return not path or any(len(k) > len(path) and k[:len(path)] == path
                                   for k in given)

        if given and all(overridden(e["loc"]) for e in errors):
            source = "command line"    # not the file's fault
        elif given and any(across(e["loc"]) and not overridden(e["loc"]) for e in errors):
            # a check across keys may fail on the file's keys or the command line's: both
            # are named
            source = f"{source} with the command line's {', '.join(k for k, _ in pairs)}"
        elif key_lines is not None:
            where = key_lines()
            found = [None if overridden(e["loc"]) else _line_of(e["loc"], where)
                     for e in errors]
            mine = [overridden(e["loc"]) for e in errors]
            if len(found) == 1 and found[0] is not None:
                source = f"{source}:{found[0]}"
            else:   # each error by its own source: a file line, or the command line
                lines = [("command line: " if cli else f"line {n}: " if n is not None else "")
                         + text for n, cli, text in zip(found, mine, lines)]
        elif given:
            lines = [("command line: " if overridden(e["loc"]) else "") + text
                     for e, text in zip(errors, lines)]
        raise ConfigError(f"{source}: " + "; ".join(lines)) from None


def _as_written(schema: type[BaseModel], tree: dict, loc: tuple) -> tuple:
    """An error's key path as the config gave it: an old top-level key read into rollout:
    (`topk: 0` fails as rollout.topk) is named by its own name, so that the error shows
    the key written and its line, and is laid on the command line when given there."""
    if len(loc) >= 2 and loc[0] == "rollout" and isinstance(tree, dict):
        for old, new in getattr(schema, "moved_keys", {}).items():
            if loc[1] == new and old in tree:
                return (old, *loc[2:])
    return loc


def _line_of(loc: tuple, key_lines: dict[tuple, int]) -> int | None:
    """The line of the deepest key of `loc` the file gives (a missing key: its section's)."""
    path = tuple(str(part) for part in loc)
    for n in range(len(path), 0, -1):
        if path[:n] in key_lines:
            return key_lines[path[:n]]
    return None


def _key_lines(text: str) -> dict[tuple, int]:
    """Each key path of a YAML text's mappings and the line it is on (1-based)."""
    out: dict[tuple, int] = {}

    def walk(node, prefix: tuple) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value in node.value:
                if isinstance(key_node, yaml.ScalarNode):
                    path = (*prefix, key_node.value)
                    out.setdefault(path, key_node.start_mark.line + 1)
                    walk(value, path)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, (*prefix, str(i)))

    try:
        walk(yaml.compose(text, Loader=yaml.SafeLoader), ())
    except yaml.YAMLError:
        pass
    return out


class _UniqueKeyLoader(yaml.SafeLoader):
    """`yaml.safe_load`'s loader, refusing a key given twice in one mapping (YAML keeps the
    last one silently: a second `optim:` block would drop the first's keys unsaid)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":   # `<<: *base`: its keys may be
                continue                                      # overridden, on purpose
            key = self.construct_object(key_node, deep=deep)
            try:
                twice = key in seen
                seen.add(key)
            except TypeError:   # an unhashable key: the base class says what is wrong
                continue
            if twice:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark,
                    f"the key {key!r} is given twice", key_node.start_mark)
        return super().construct_mapping(node, deep)

    def construct_yaml_int(self, node):
        # YAML 1.1 reads `0755` as octal 493 and `1:30` as base 60 (90); the overrides
        # refuse the first, and a file must not take either silently
        text = str(self.construct_scalar(node)).replace("_", "")
        if ":" in text or re.fullmatch(r"[-+]?0[0-7]+", text):
            raise yaml.constructor.ConstructorError(
                None, None, f"{text!r} would be read as the number "
                f"{super().construct_yaml_int(node)} (YAML 1.1's "
                + ("base 60); quote it" if ":" in text else
                   "octal); write it without the leading 0, or quote it"), node.start_mark)
        return super().construct_yaml_int(node)

    def construct_yaml_float(self, node):
        text = str(self.construct_scalar(node))
        if ":" in text:
            raise yaml.constructor.ConstructorError(
                None, None, f"{text!r} would be read as a base-60 number "
                f"({super().construct_yaml_float(node)}); quote it", node.start_mark)
        return super().construct_yaml_float(node)


_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _UniqueKeyLoader.construct_yaml_int)
_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:float",
                                 _UniqueKeyLoader.construct_yaml_float)
# Python's `None`, unquoted, is null as `null` and `~` are: `reward.prm=None` had been the
# path "None" (quoted, 'None' stays a string). PyYAML copies the resolver lists per class,
# so yaml.safe_load is untouched.
_UniqueKeyLoader.add_implicit_resolver("tag:yaml.org,2002:null", re.compile(r"^None$"), ["N"])


def read_config_file(path: str | Path) -> dict:
    """A YAML config file as a tree of keys, unvalidated: UTF-8, valid YAML, no key given
    twice, a mapping at the top (an empty file: {}). A config a recipe reads, or a preset
    (src/seekrl/presets/demo, src/seekrl/presets/prorag) a pipeline builds a stage's config from."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: a folder; expected a YAML config file")
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") \
            from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{mark.line + 1}:" if mark is not None else ""
        raise ConfigError(f"{path}:{where} not valid YAML ({getattr(err, 'problem', err)})") \
            from None
    if data is None:   # an empty file: every default
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of keys at the top level, "
                          f"got {type(data).__name__}")
    return data


def load_config(schema: type[C], path: str | Path | None, overrides: list[str] = ()) -> C:
    """Read a YAML file (or nothing) into `schema`, with `key.sub=value` overrides on top."""
    if path is None:
        return build_config(schema, {}, overrides, "overrides")
    data = read_config_file(path)
    return build_config(schema, data, overrides, str(Path(path)),
                        key_lines=lambda: _key_lines(Path(path).read_text(encoding="utf-8")))


class ConfigDumper(yaml.SafeDumper):
    """`yaml.safe_dump`'s dumper, quoting the string "None", which `_UniqueKeyLoader` reads
    as null: a saved config reads back as it was."""


def _represent_str(dumper: yaml.SafeDumper, text: str):
    return dumper.represent_scalar("tag:yaml.org,2002:str", text,
                                   style="'" if text == "None" else None)


ConfigDumper.add_representer(str, _represent_str)


def dump_config(cfg: BaseModel, path: str | Path) -> None:
    Path(path).write_text(yaml.dump(cfg.model_dump(mode="json"), Dumper=ConfigDumper,
                                    sort_keys=False))
