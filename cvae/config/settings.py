"""What every section and every component's options are made of: frozen dataclasses whose
fields are `setting`s, each with its one-sentence doc and, where it has one, its range.

The doc becomes the flag's help, the range its check (`check_ranges`), and the field's type
(a `Literal` for a choice, int, float, bool, str or a tuple of ints) how a flag, a JSON value
or a TOML value is read (`coerce`). Standard library only: `cvae train --help` and a bad value
answer before anything heavy loads.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from typing import Any, Literal

from cvae.errors import ConfigError


def setting(default: Any, doc: str, *, low: float | None = None, high: float | None = None,
            open_low: bool = False, open_high: bool = False) -> Any:
    """A field with its doc and its range [low, high] (each end open where said; None: no
    bound). A tuple's range bounds each of its items, and it needs at least one."""
    bounds = {"low": low, "high": high, "open_low": open_low, "open_high": open_high}
    return dataclasses.field(default=default, metadata={"doc": doc, **bounds})


@dataclasses.dataclass(frozen=True)
class NoOptions:
    """The options of a component that has none."""


@functools.cache
def hints(cls: type) -> dict[str, Any]:
    """Field name -> resolved type of dataclass `cls`."""
    return typing.get_type_hints(cls)


def choices(hint: Any) -> tuple[str, ...] | None:
    """The allowed values of a `Literal` type; None for any other type."""
    return typing.get_args(hint) if typing.get_origin(hint) is Literal else None


def doc(cls: type, name: str) -> str:
    """The one-sentence doc of field `name` of `cls`."""
    return next(f.metadata["doc"] for f in dataclasses.fields(cls) if f.name == name)


def check_ranges(values: Any, where: str) -> None:
    """ConfigError naming `where`.FIELD for the first field out of its choices or range."""
    for field in dataclasses.fields(values):
        value, hint = getattr(values, field.name), hints(type(values))[field.name]
        name = f"{where}.{field.name}"
        allowed = choices(hint)
        if allowed is not None and value not in allowed:
            raise ConfigError(f"{name}={value!r}: allowed {', '.join(allowed)}")
        items = value if isinstance(value, tuple) else (value,)
        if isinstance(value, tuple) and not value:
            raise ConfigError(f"{name}=(): needs one or more values")
        meta = field.metadata
        for item in items:
            if isinstance(item, bool) or not isinstance(item, (int, float)):
                continue
            if isinstance(item, float) and math.isnan(item) or not _within(item, meta):
                raise ConfigError(f"{name}={value!r}: must be {describe_range(meta)}")


def _within(value: float, meta) -> bool:
    low, high = meta.get("low"), meta.get("high")
    if low is not None and (value < low or meta["open_low"] and value == low):
        return False
    return high is None or not (value > high or meta["open_high"] and value == high)


def describe_range(meta) -> str:
    """A field's range as an error message words it: '>= 1', 'in (0, 10]'."""
    low, high = meta.get("low"), meta.get("high")
    if high is None:
        return f"{'>' if meta['open_low'] else '>='} {low:g}"
    left, right = "(" if meta["open_low"] else "[", ")" if meta["open_high"] else "]"
    return f"in {left}{low:g}, {high:g}{right}"


def coerce(hint: Any, value: Any, name: str) -> Any:
    """A JSON, TOML or command-line value as the field's type (a tuple of ints from a list or
    from "512,256"; a bool from true/false words); ConfigError naming the field otherwise."""
    try:
        if typing.get_origin(hint) is tuple:
            if isinstance(value, str):
                value = [v for v in value.replace(",", " ").split() if v]
            return tuple(_whole(v) for v in value)
        if hint is bool:
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError(value)
            return bool(value)
        if hint is int:
            return _whole(value)
        if hint is float:
            return float(value)
        return str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}={value!r}: not a valid {type_name(hint)}") from None


def _whole(value: Any) -> int:
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(value)
    return int(value)


def type_name(hint: Any) -> str:
    """How a message names a field's type."""
    if typing.get_origin(hint) is tuple:
        return "list of integers"
    return getattr(hint, "__name__", "string" if choices(hint) else str(hint))


def read(cls: type, values: dict[str, Any], where: str) -> Any:
    """An instance of dataclass `cls` from `values` (missing keys: defaults); ConfigError
    naming `where`.KEY for an unknown key or a value of the wrong type."""
    known = hints(cls)
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: unknown setting (known: "
                          f"{', '.join(known) or 'none'})")
    return cls(**{name: coerce(known[name], value, f"{where}.{name}")
                  for name, value in values.items()})


def as_dict(values: Any) -> dict[str, Any]:
    """A dataclass's fields as JSON-ready values (tuples as lists)."""
    return {f.name: _jsonable(getattr(values, f.name)) for f in dataclasses.fields(values)}


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
