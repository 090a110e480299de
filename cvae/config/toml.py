"""Configs as TOML files: what `cvae train --config FILE` reads and `--print-config` writes.

A file holds a table per section of `cvae.config.sections.Config` (`[data]`, `[model]` with its
`name` and a `[model.options]` table, ...), each with any of its settings, and optionally
`preset = "NAME"` at the top to start from. A flat file of earlier versions (one key per
setting, no tables) still reads, through `cvae.config.flat`'s translation table. The effective
config is the preset's, then the file's values, then the flags': `load_config`. The TOML is
written by hand from the config's own nesting, each setting with its doc as a comment above
it; floats are written with `repr`, so a printed file parses back to the identical config,
bit for bit. Standard library and the config package only (`tomllib`).

Synopsis:

    text = to_toml(presets.semi())              # what `--print-config` prints
    config = load_config(None, "semi.toml", {})  # == presets.semi()
"""

from __future__ import annotations

import inspect
import json
import textwrap
import tomllib
import typing
from pathlib import Path
from typing import Any

from cvae.config import components, flat, presets
from cvae.config.sections import Config
from cvae.config.settings import coerce
from cvae.errors import ConfigError

PRESET_KEY = "preset"


def to_toml(config: Config, *, header: str = "") -> str:
    """Every setting of `config` as TOML, a table per section (and per component's options),
    each setting under its doc; `header` goes on top as comment lines."""
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    leaves = flat.all_leaves(Config)
    for table, values in _tables(config.to_dict()):
        lines += ["", f"[{table}]"]
        for name, value in values.items():
            leaf = leaves.get(f"{table}.{name}")
            if leaf is not None and leaf.doc:
                lines += [f"# {line}" for line in textwrap.wrap(leaf.doc, 96)]
            lines.append(f"{name} = {toml_value(value)}")
    return "\n".join(lines).lstrip("\n") + "\n"


def _tables(nested: dict[str, Any], prefix: str = ""):
    """(table name, its plain values) for each table of a nested dict, parents first."""
    plain = {k: v for k, v in nested.items() if not isinstance(v, dict)}
    if prefix:
        yield prefix, plain
    for key, value in nested.items():
        if isinstance(value, dict):
            yield from _tables(value, f"{prefix}.{key}" if prefix else key)


def toml_value(value: Any) -> str:
    """One setting's value as TOML: str, bool, int, float (repr: exact) or a list of ints."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)  # TOML reads Python's float repr, inf and nan included
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def read_config_file(path: str | Path) -> tuple[str | None, dict[str, Any]]:
    """(the preset the file names or None, its settings by path, typed); a ConfigError
    naming the file and the key for a missing or malformed file, an unknown key or a value of
    the wrong type."""
    try:
        values = tomllib.loads(Path(path).read_text())
    except OSError as error:
        raise ConfigError(f"{path}: cannot read the config file ({error.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path}: not valid TOML ({error})") from None
    preset = values.pop(PRESET_KEY, None)
    if preset is not None and preset not in presets.PRESETS:
        raise ConfigError(f"{path}: {PRESET_KEY}={preset!r}: allowed "
                          f"{', '.join(presets.PRESETS)}")
    if flat.is_nested(values):
        settings = flat.leaves(values)
    else:
        unknown = sorted(set(values) - set(flat.LEGACY))
        if unknown:
            raise ConfigError(f"{path}: unknown key {unknown[0]!r} (a flat file's keys are "
                              f"the settings' flat names, and {PRESET_KEY!r})")
        preset_config = presets.get_preset(preset or "default")
        settings = flat.translate(values, {kind: getattr(preset_config, kind).name
                                           for kind in components.KINDS}, stored=False)
    leaves = flat.all_leaves(Config)
    for where in settings:
        if where not in leaves:
            raise ConfigError(f"{path}: unknown key {where!r}")
    return preset, {where: typed(leaves[where], value, path) for where, value in
                    settings.items()}


def typed(leaf: flat.Leaf, value: Any, path: str | Path) -> Any:
    """`value` as the setting's type, refused unless TOML wrote it as that type (an int is a
    float; nothing else is converted)."""
    if isinstance(value, tuple):  # a TOML array, as `flat.leaves` gives it
        value = list(value)
    hint = leaf.hint
    if leaf.field == "name" and hasattr(leaf.owner, "KIND"):
        hint = str
    if typing.get_origin(hint) is tuple:
        fits = isinstance(value, list) and all(
            isinstance(item, int) and not isinstance(item, bool) for item in value)
    elif hint is bool:
        fits = isinstance(value, bool)
    elif hint is int:
        fits = isinstance(value, int) and not isinstance(value, bool)
    elif hint is float:
        fits = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:
        fits = isinstance(value, str)
    if not fits:
        kind = "a list of integers" if typing.get_origin(hint) is tuple else (
            {bool: "true or false", int: "an integer", float: "a number"}.get(hint, "a string"))
        raise ConfigError(f"{path}: {leaf.path}={value!r}: must be {kind}")
    return coerce(hint, value, leaf.path)


def load_config(preset: str | None, path: str | Path | None, flags: dict[str, Any]) -> Config:
    """The effective config: `preset` (or else the file's, or else the default), then the
    file's fields, then `flags` (already typed). A value the file sets out of range is a
    ConfigError naming the file; one the flags set, the flag's field alone."""
    named, values = read_config_file(path) if path is not None else (None, {})
    config = presets.get_preset(preset or named or "default").updated(values)
    if path is not None:
        try:
            config.validate()
        except ConfigError as error:
            raise ConfigError(f"{path}: {error}") from None
    return config.replace(**flags).validate()


def preset_file(name: str) -> str:
    """configs/NAME.toml: preset `name` as a file, its docstring on top."""
    about = inspect.cleandoc(presets.PRESETS[name].__doc__ or "")
    return to_toml(presets.get_preset(name), header=(
        f"The {name} preset (cvae/config/presets.py), every setting written out: `cvae train "
        f"--config configs/{name}.toml`\ntrains what `cvae train --preset {name}` trains. "
        f"Written by `make configs`; edit a copy.\n\n{about}"))


def write_preset_files(folder: str | Path) -> list[Path]:
    """Every preset as `folder`/NAME.toml (`make configs`); returns the paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{name}.toml" for name in presets.PRESETS]
    for name, path in zip(presets.PRESETS, paths):
        path.write_text(preset_file(name))
    return paths


if __name__ == "__main__":
    import sys

    for written in write_preset_files(sys.argv[1] if len(sys.argv) > 1 else "configs"):
        print(f"wrote {written}")
