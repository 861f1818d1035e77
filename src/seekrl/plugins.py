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
A module name resolves only from there; a file path works from anywhere:

    retriever: /home/me/project/search.py:MyRetriever     # or relative to the working dir

The file is imported under its own name (`search`), with its folder on `sys.path` (as
`python search.py` would have it), so that its sibling modules import as they do when it runs.

A `Registry` holds the functions of one kind by name (the outcome rewards, the process
sources, the advantage estimators); those that take import paths register a path's object
under the path itself when it is first named, so every later lookup by that string (a
resumed run's config.yaml holds it) finds it. This module imports nothing of seekrl but its
config errors: the registries import it, never the other way round.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from seekrl.errors import ConfigError

_ATTR = r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*"
_PATH = re.compile(rf"{_ATTR}:{_ATTR}")
# a file instead of a module: anything ending in .py, then the attribute (the last colon
# splits them, so a Windows drive letter stays with the file)
_FILE_PATH = re.compile(rf"(?P<file>.+\.py):(?P<attr>{_ATTR})")
EXPECTED = ("expected module.path:attribute (e.g. mypkg.rewards:judge, importable from the "
            "working directory or installed) or path/to/file.py:attribute")


def is_import_path(value: object) -> bool:
    """A config value meant as an import path (it has a colon and is no url); registered
    names never hold one."""
    return isinstance(value, str) and ":" in value and "://" not in value


def _one_line(err: BaseException) -> str:
    if isinstance(err, SystemExit):   # argparse at the top of a script, say
        return f"it called sys.exit({' '.join(str(err).split())!r}) when imported"
    return f"{type(err).__name__}: {' '.join(str(err).split())}"


def _failed_at(err: BaseException) -> str:
    """Where the user's code raised: the last frame of its traceback outside the import
    machinery (` at FILE:LINE`), so the message points into their file."""
    import traceback

    frames = [f for f in traceback.extract_tb(err.__traceback__)
              if "importlib" not in f.filename and f.filename != __file__]
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""


def _loaded_from(path: Path) -> ModuleType | None:
    """A module already imported from the file `path`, under whatever name: a file named
    both as `pkg/rewards.py:f` and `pkg.rewards:f` is the one module, run once."""
    for module in list(sys.modules.values()):
        where = getattr(module, "__file__", None)
        if where:
            try:
                if Path(where).resolve() == path:
                    return module
            except OSError:
                continue
    return None


def _cwd_on_path() -> str:
    cwd = os.getcwd()
    here = {os.path.abspath(p or os.curdir) for p in sys.path}
    if cwd not in here:
        sys.path.insert(0, cwd)
    return cwd


def load(key: str, path: str) -> Any:
    """The object `module.path:attribute` or `path/to/file.py:attribute` names (the
    attribute may be dotted: `module:Class.method`); a `ConfigError` naming `key` if it
    cannot be had."""
    as_file = _FILE_PATH.fullmatch(path) if isinstance(path, str) else None
    as_module = isinstance(path, str) and _PATH.fullmatch(path)
    if as_file is None and not as_module:
        raise ConfigError(f"{key}: {path!r} is not an import path; {EXPECTED}")
    cwd = _cwd_on_path()
    if as_file is not None and as_module and not os.path.isfile(os.path.expanduser(as_file["file"])):
        as_file = None   # `pkg.py:f` with no such file: the module `py` of package `pkg`
    if as_file is not None:
        module_name, attr = as_file["file"], as_file["attr"]
        module = _import_file(key, module_name, cwd)
    else:
        module_name, _, attr = path.partition(":")
        module = _import_module(key, module_name, cwd)
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


def _import_module(key: str, module_name: str, cwd: str) -> ModuleType:
    try:
        if module_name not in sys.modules:   # the file, if it was imported by its path
            spec = importlib.util.find_spec(module_name)
            origin = getattr(spec, "origin", None)
            if origin and os.path.isfile(origin):
                same = _loaded_from(Path(origin).resolve())
                if same is not None:
                    return same
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        missing = err.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            raise ConfigError(
                f"{key}: cannot import module {module_name!r} ({_one_line(err)}); its module must "
                f"be importable from the working directory ({cwd}) or installed, or give the "
                "file: path/to/file.py:attribute") from None
        raise ConfigError(f"{key}: importing module {module_name!r} failed "
                          f"({_one_line(err)})") from None
    except (Exception, SystemExit) as err:   # the module's own code failed: a syntax error,
        # a bad import, a sys.exit (which would end the whole run unnamed)
        raise ConfigError(f"{key}: importing module {module_name!r} failed "
                          f"({_one_line(err)}{_failed_at(err)})") from None


def _import_file(key: str, file: str, cwd: str) -> ModuleType:
    """The module in `file` (relative to `cwd`), imported under its file's name: a run that
    names the same file twice (a config and its resume) gets the same module, and what it
    defines pickles by that name."""
    path = Path(file).expanduser()
    path = (path if path.is_absolute() else Path(cwd) / path).resolve()
    if not path.is_file():
        raise ConfigError(f"{key}: no file {path} (from {file!r}, relative to the working "
                          f"directory {cwd})")
    name = path.stem
    if not name.isidentifier():
        raise ConfigError(f"{key}: {path}: {name!r} is no Python module name (letters, digits "
                          "and _, not starting with a digit); rename the file")
    same = _loaded_from(path)
    if same is not None:
        return same
    loaded = sys.modules.get(name)
    if loaded is not None:
        where = getattr(loaded, "__file__", None)
        raise ConfigError(f"{key}: {path}: a module named {name!r} is imported already "
                          f"(from {where or 'built in'}); rename the file")
    # nor one importable by that name and not imported yet (`peft.py` would stand in for
    # the library when LoRA imports it later)
    # (searched past the file's own folder, which may be the working directory first on
    # sys.path: from there the file would shadow the module for every later import)
    import importlib.machinery

    elsewhere = [p for p in sys.path if Path(os.path.abspath(p or os.curdir)) != path.parent]
    try:
        other = importlib.machinery.PathFinder.find_spec(name, elsewhere)
    except (ImportError, ValueError):
        other = None
    if other is None and name in sys.builtin_module_names:
        other = importlib.machinery.ModuleSpec(name, None)
    origin = getattr(other, "origin", None)
    if other is not None and (origin is None or Path(origin).resolve() != path):
        raise ConfigError(f"{key}: {path}: {name!r} is the name of another module "
                          f"({origin or 'built in'}), which importing this file would "
                          "replace; rename the file")
    folder = str(path.parent)
    if folder not in {os.path.abspath(p or os.curdir) for p in sys.path}:
        sys.path.insert(0, folder)   # its sibling modules import as when it runs as a script
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{key}: {path} cannot be imported as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as err:   # the file's own code failed (as above)
        del sys.modules[name]
        raise ConfigError(f"{key}: importing {path} failed ({_one_line(err)}"
                          f"{_failed_at(err)})") from None
    return module


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


class Registry(dict):
    """Functions of one kind by name (`what` says which kind in errors). `add` registers one
    under a name, once; `lookup` finds one by name or, when `shape` is given, by import path
    (imported, checked to take one of `args` positional arguments, registered under the path
    itself, and `on_path(path, fn)` told); an unknown name is refused naming the known ones.
    `key` is the config key a path is named under, for errors (`{name}` is filled in)."""

    def __init__(self, what: str, *, key: str = "", shape: str | None = None,
                 args: tuple[int, ...] = (), on_path: Callable[[str, Any], None] | None = None):
        super().__init__()
        self.what, self.key, self.shape, self.args, self.on_path = what, key, shape, args, on_path

    def add(self, name: str, fn: Any) -> Any:
        if name in self:
            raise ValueError(f"{self.what} {name!r} is already registered")
        self[name] = fn
        return fn

    def add_path(self, path: str, key: str | None = None) -> Any:
        """The function an import path names, registered under the path; `key` names the
        config key in errors (default: this registry's)."""
        if self.shape is None:
            raise ValueError(f"{self.what}: takes registered names only, not import paths")
        fn = load_function(key or self.key.format(name=path), path, args=self.args,
                           shape=self.shape)
        self[path] = fn
        if self.on_path is not None:
            self.on_path(path, fn)
        return fn

    def lookup(self, name: str, key: str | None = None) -> Any:
        """The function `name` names: a registered name, or an import path where this
        registry takes them (registered when first named). Unknown: a `ConfigError` naming
        `key` when given (a config's), else a ValueError naming the kind."""
        if name not in self and self.shape is not None and is_import_path(name):
            self.add_path(name, key)
        if name not in self:
            error = ConfigError if key else ValueError
            raise error(f"{key or self.what}: expected one of {', '.join(sorted(self))}, "
                        f"got {name!r}")
        return self[name]


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
