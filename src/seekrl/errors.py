"""Errors that name where the bad input is."""

from __future__ import annotations


class SeekrlError(Exception):
    """The base of the errors seekrl raises for bad input or a missing resource (data,
    config, model, index): the command line prints their one-line message, no traceback.
    Each also keeps its older built-in base (ValueError / RuntimeError) for callers that
    catch that."""


class ConfigError(SeekrlError, ValueError):
    """A config file or override that does not fit the recipe's schema."""


class DataError(SeekrlError, ValueError):
    """Malformed input data: names the file, the line (1-based) and the field."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None,
                 field: str | None = None):
        self.path, self.line, self.field = path, line, field
        where = ""
        if path is not None:
            where = f"{path}"
            if line is not None:
                where += f":{line}"
            where += ": "
        if field is not None:
            where += f"field '{field}': "
        super().__init__(where + message)


class DeviceError(SeekrlError, RuntimeError):
    """A device torch cannot use here (cuda on a CPU build, a GPU index past the count)."""
