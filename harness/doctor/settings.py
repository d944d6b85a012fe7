"""What a user declares once, where Python projects keep settings: a ``[tool.attention-doctor]``
table in ``pyproject.toml``.

    [tool.attention-doctor]                  # for every target
    mask = "keep"

    [tool.attention-doctor.targets."model.py:Attention"]
    causal = true
    positions = "relative"

The keys are the doctor's options (``harness.doctor.options``), written as in Python
(``mask_shape``) or as on the command line (``mask-shape``). A flag given on the command line
outranks the target's table, which outranks the table for every target. The nearest
``pyproject.toml`` from the working folder up is read; one that has no such table changes
nothing. Import-light: plain data and tomllib.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import tomllib

from harness.doctor.options import BY_NAME, Option
from harness.errors import UsageError, shorten

TABLE = "attention-doctor"
# Options that only make sense for one run, not as a project's setting.
PER_RUN = {"json", "report"}


@dataclass(frozen=True)
class Declared:
    """Options a pyproject.toml declares for a target, and the file and table they are in."""

    values: dict[str, object]
    where: str  # "pyproject.toml [tool.attention-doctor]"


def nearest_pyproject(start: Path) -> Path | None:
    """The first ``pyproject.toml`` in ``start`` or a folder above it."""
    for folder in (start, *start.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def _value(option: Option, value: object, where: str) -> object:
    """A TOML value checked as the option's flag would check it; a UsageError names it."""

    def wrong(expected: str) -> UsageError:
        return UsageError(f"{where}: {option.name} must be {expected}, not {shorten(repr(value))}")

    kind = option.kind
    if kind == "flag":
        if not isinstance(value, bool):
            raise wrong("true or false")
        return value
    if option.repeat:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise wrong('a list of "NAME=VALUE" strings')
        return list(value)
    if kind == "choice":
        if value not in option.choices:
            raise wrong("one of " + ", ".join(option.choices))
        return value
    if kind in ("int", "seed"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong("an integer")
        return value
    if kind in ("float", "scale"):
        if kind == "scale" and value == "none":
            return 1.0
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise wrong("a number" + (' or "none"' if kind == "scale" else ""))
        return float(value)
    if not isinstance(value, str):
        raise wrong("a string")
    return value


def _options(table: object, where: str) -> dict[str, object]:
    """The options of one table, by their Python names, each value checked."""
    if not isinstance(table, dict):
        raise UsageError(f"{where} is not a table")
    values = {}
    for key, value in table.items():
        if key == "targets":
            continue
        name = key.replace("-", "_")
        option = BY_NAME.get(name)
        if option is None or name in PER_RUN:
            known = ", ".join(o.name for o in BY_NAME.values() if o.name not in PER_RUN)
            raise UsageError(f"{where}: no option {shorten(repr(key))}; the options are {known}")
        values[name] = _value(option, value, where)
    return values


def declared(target: str, start: Path | None = None) -> Declared | None:
    """What the nearest pyproject.toml declares for ``target`` (its own table over the one for
    every target); None when it declares nothing."""
    path = nearest_pyproject(start or Path.cwd())
    if path is None:
        return None
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None
    table = document.get("tool", {}).get(TABLE)
    if table is None:
        return None
    where = f"{path} [tool.{TABLE}]"
    values = _options(table, where)
    targets = table.get("targets", {}) if isinstance(table, dict) else {}
    if not isinstance(targets, dict):
        raise UsageError(f"{where}: targets is not a table")
    if target in targets:
        where = f'{path} [tool.{TABLE}.targets."{target}"]'
        values |= _options(targets[target], where)
    return Declared(values, where) if values else None
