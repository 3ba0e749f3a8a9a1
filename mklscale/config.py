"""Reading and checking TOML configs (pipelines, clusters): tomllib only, unknown keys are errors.

A table is checked against a schema ``{key: Field(types, default)}``; the result is a plain dict
with every key present (defaults filled in). Errors name the file, the table, the key, what was
expected and what was given, so the user can fix the file without reading code.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mklscale.errors import ConfigError

REQUIRED = object()


@dataclasses.dataclass(frozen=True)
class Field:
    """One key of a table: allowed Python types (as tomllib returns them), default, optional check.

    ``check(value)`` returns an error text (what is wrong and what to give) or None.
    """

    types: tuple[type, ...]
    default: Any = REQUIRED
    check: Callable[[Any], str | None] | None = None


def read_toml(path: str | os.PathLike, what: str) -> dict:
    """Parse a TOML file; a missing file or a syntax error is a ConfigError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{what} file {path} does not exist; give the path of a .toml file")
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{what} file {path} is not valid TOML: {exc}; fix the syntax at that line "
                          "(strings need quotes, tables [brackets] must close)") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{what} file {path} is not UTF-8 text; save it as UTF-8 TOML") from None
    except OSError as exc:
        raise ConfigError(f"{what} file {path} cannot be read ({exc.strerror}); check its permissions") from None


def check_table(table: Any, schema: dict[str, Field], where: str) -> dict:
    """Validate one table against ``schema`` and fill defaults; ``where`` names it in messages."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table, got {type_name(table)}")
    unknown = sorted(set(table) - set(schema))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; remove or rename them (allowed keys "
                          f"are {', '.join(sorted(schema))})")
    out = {}
    for key, field in schema.items():
        if key not in table:
            if field.default is REQUIRED:
                raise ConfigError(f"{where}: missing required key {key!r}; add {key} = ... to that table")
            out[key] = field.default
            continue
        out[key] = check_value(table[key], field, f"{where}.{key}")
    return out


def check_value(value: Any, field: Field, where: str) -> Any:
    """Type-check one value (an int is accepted where a float is expected; a bool never is a number)."""
    types = field.types
    if float in types and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if isinstance(value, bool) and bool not in types or not isinstance(value, types):
        expected = " or ".join(t.__name__ for t in types)
        raise ConfigError(f"{where} must be {expected}, got {type_name(value)} {value!r}; {type_hint(types, value)}")
    if field.check is not None:
        problem = field.check(value)
        if problem:
            raise ConfigError(f"{where}: {problem}")
    return value


def type_hint(types: tuple[type, ...], value: Any) -> str:
    """What to write instead of a value of the wrong type (for messages)."""
    wanted = " or ".join(type_name(t()) if t in (dict, list, str, bool, int, float) else t.__name__ for t in types)
    if isinstance(value, str) and not {str} & set(types):
        return f"write {wanted} without quotes (TOML quotes only strings)"
    return f"give {wanted} there"


def type_name(value: Any) -> str:
    """The TOML-ish name of a Python value's type, for messages."""
    return {dict: "a table", list: "an array", str: "a string", bool: "a boolean", int: "an integer",
            float: "a float"}.get(type(value), type(value).__name__)


def one_of(*choices: str) -> Callable[[Any], str | None]:
    return lambda v: None if v in choices else f"must be one of {', '.join(map(repr, choices))}, got {v!r}"


def positive(v) -> str | None:
    return None if v > 0 else f"must be > 0, got {v!r}"


def fraction(v) -> str | None:
    return None if 0 < v < 1 else f"must be strictly between 0 and 1, got {v!r}"
