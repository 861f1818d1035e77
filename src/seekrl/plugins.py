"""Your own parts by import path: `module.path:attribute` in a config.

A config key that takes a registered name (`algo.advantage`, a `reward.process` source) also
takes an import path, and `reward.fn` and `retriever` take nothing else:

    reward: {fn: mypkg.rewards:judge, process: {mypkg.steps:novelty: 0.5}}
    algo: {advantage: mypkg.credit:median_baseline}
    retriever: mypkg.search:MyRetriever

`load` imports the module and returns the attribute; every failure is one line that names
the config key and what went wrong: the module that did not import (and Python's reason),
the attribute it lacks, or an object of the wrong kind. The working directory is put on
`sys.path` first (as `python -m` does), so a module beside the config needs no install.

The registries (`rewards/process.py`, `rl/advantages.py`) register a path's object under
the path itself when it is first named, so every later lookup by that string (a resumed
run's config.yaml holds it) finds it. This module imports nothing of seekrl but its config
errors: the registries import it, never the other way round.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import re
import sys
from collections.abc import Callable
from typing import Any

from seekrl.config import ConfigError

_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def is_import_path(value: object) -> bool:
    """A config value meant as an import path (it has a colon and is no url); registered
    names never hold one."""
    return isinstance(value, str) and ":" in value and "://" not in value


def _one_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())}"


def _cwd_on_path() -> str:
    cwd = os.getcwd()
    here = {os.path.abspath(p or os.curdir) for p in sys.path}
    if cwd not in here:
        sys.path.insert(0, cwd)
    return cwd


def load(key: str, path: str) -> Any:
    """The object `module.path:attribute` names (the attribute may be dotted:
    `module:Class.method`); a `ConfigError` naming `key` if it cannot be had."""
    if not isinstance(path, str) or not _PATH.fullmatch(path):
        raise ConfigError(f"{key}: {path!r} is not an import path; expected module.path:attribute "
                          "(e.g. mypkg.rewards:judge)")
    module_name, _, attr = path.partition(":")
    cwd = _cwd_on_path()
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        missing = err.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            raise ConfigError(
                f"{key}: cannot import module {module_name!r} ({_one_line(err)}); its module must "
                f"be importable from the working directory ({cwd}) or installed") from None
        raise ConfigError(f"{key}: importing module {module_name!r} failed "
                          f"({_one_line(err)})") from None
    except Exception as err:   # the module's own code failed: a syntax error, a bad import
        raise ConfigError(f"{key}: importing module {module_name!r} failed "
                          f"({_one_line(err)})") from None
    obj: Any = module
    for i, part in enumerate(attr.split(".")):
        if not hasattr(obj, part):
            owner = module_name if i == 0 else f"{module_name}:{'.'.join(attr.split('.')[:i])}"
            close = difflib.get_close_matches(part, [n for n in dir(obj) if not n.startswith("_")],
                                              n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"{key}: {owner!r} has no attribute {part!r}{hint}")
        obj = getattr(obj, part)
    return obj


def _takes(fn: Callable, n_args: int) -> bool:
    """Whether `fn` can be called with `n_args` positional arguments (True when Python
    cannot tell, as for some builtins)."""
    try:
        inspect.signature(fn).bind(*([None] * n_args))
    except TypeError:
        return False
    except ValueError:
        return True
    return True


def load_function(key: str, path: str, *, args: tuple[int, ...], shape: str) -> Callable:
    """A function (any callable) by import path, which can be called with one of `args`
    positional arguments; `shape` describes it in errors: `f(trajectory) -> RewardParts`."""
    fn = load(key, path)
    if not callable(fn):
        raise ConfigError(f"{key}: {path} is a {type(fn).__name__}, not a function {shape}")
    if not any(_takes(fn, n) for n in args):
        raise ConfigError(f"{key}: {path} takes {_signature(fn)}; expected a function {shape}")
    return fn


def _signature(fn: Callable) -> str:
    """`(a, b=...)`: the parameters, without annotations."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return "(?)"
    params = [p.replace(annotation=p.empty) for p in sig.parameters.values()]
    return str(sig.replace(parameters=params, return_annotation=sig.empty))


def _has_search(obj: Any) -> bool:
    return callable(getattr(obj, "search", None))


RETRIEVER_SHAPE = "search(queries: list[str], k: int) -> list[list[Hit]]"


def _retriever_maker(key: str, path: str, index: str | None) -> tuple[Any, tuple | None]:
    """The object `path` names and the arguments to make a retriever of it (None: it is
    one already)."""
    obj = load(key, path)
    if inspect.ismodule(obj):
        raise ConfigError(f"{key}: {path} is a module, not a retriever (an object with "
                          f"{RETRIEVER_SHAPE}) nor a class or function that makes one")
    if not isinstance(obj, type) and _has_search(obj):
        if index:
            raise ConfigError(f"{key}: {path} is a retriever object already, so the index "
                              f"({index!r}) cannot be passed to it; name a class or a function "
                              "that makes one, or give no index")
        return obj, None
    if isinstance(obj, type) and not _has_search(obj):
        raise ConfigError(f"{key}: {path} is a class without a method {RETRIEVER_SHAPE}")
    if not callable(obj):
        raise ConfigError(f"{key}: {path} is a {type(obj).__name__}, not a retriever (an object "
                          f"with {RETRIEVER_SHAPE}) nor a class or function that makes one")
    call = (index,) if index else ()
    if not _takes(obj, len(call)):
        given = f"the index ({index!r})" if index else "no arguments (no index given)"
        raise ConfigError(f"{key}: {path} takes {_signature(obj)}, but it is called with {given}")
    return obj, call


def check_retriever(key: str, path: str, index: str | None = None) -> None:
    """What can be checked of a retriever by import path before it is made: that it
    imports and is a retriever, a class with `search`, or a function, which takes
    `index` when that is set and no arguments otherwise."""
    _retriever_maker(key, path, index)


def make_retriever(key: str, path: str, index: str | None = None) -> Any:
    """The retriever `path` names: an object with `search(queries, k)` as it is, or a class
    or function called with `index` (a str) when set, with no arguments otherwise."""
    obj, call = _retriever_maker(key, path, index)
    if call is None:
        return obj
    made = obj(*call)
    if not _has_search(made):
        raise ConfigError(f"{key}: {path}({', '.join(map(repr, call))}) made a "
                          f"{type(made).__name__}, which has no method {RETRIEVER_SHAPE}")
    return made
