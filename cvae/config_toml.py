"""Configs as TOML files: what `cvae train --config FILE` reads and `--print-config` writes.

A file names any fields of `cvae.config.Config` (the flags' names with underscores) and,
optionally, `preset = "NAME"` to start from. The effective config is the preset's, then the
file's values, then the flags': `load_config`. The TOML is written by hand, one flat key per
field grouped under comments as `cvae train --help` groups the flags; floats are written with
`repr`, so a printed file parses back to the identical config, bit for bit. Standard library
only (`tomllib`), so a bad file fails in the first second, before JAX loads.

Synopsis:

    text = to_toml(presets.semi())              # what `--print-config` prints
    config = load_config(None, "semi.toml", {})  # == presets.semi()
"""

from __future__ import annotations

import inspect
import json
import tomllib
import typing
from pathlib import Path
from typing import Any

from cvae import presets
from cvae.cli_help import CONFIG_GROUPS
from cvae.config import HINTS, Config, coerce
from cvae.errors import ConfigError

PRESET_KEY = "preset"


def to_toml(config: Config, *, header: str = "") -> str:
    """Every field of `config` as TOML, in `CONFIG_GROUPS` order; `header` goes on top as
    comment lines."""
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    for group, names in CONFIG_GROUPS.items():
        lines += ["", f"# {group}"]
        lines += [f"{name} = {toml_value(getattr(config, name))}" for name in names]
    return "\n".join(lines).lstrip("\n") + "\n"


def toml_value(value: Any) -> str:
    """One flat field's value as TOML: str, bool, int, float (repr: exact) or a tuple of ints."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)  # TOML reads Python's float repr, inf and nan included
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string
    if isinstance(value, tuple):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def read_config_file(path: str | Path) -> tuple[str | None, dict[str, Any]]:
    """(the preset the file names or None, its fields as the config types them); a
    ConfigError naming the file and the key for a missing or malformed file, an unknown key or
    a value of the wrong type."""
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
    unknown = sorted(set(values) - set(HINTS))
    if unknown:
        raise ConfigError(f"{path}: unknown key {unknown[0]!r} (the keys are the fields of "
                          f"cvae.config.Config, and {PRESET_KEY!r})")
    return preset, {name: typed(name, value, path) for name, value in values.items()}


def typed(name: str, value: Any, path: str | Path) -> Any:
    """`value` as field `name`'s type, refused unless TOML wrote it as that type (an int is a
    float; nothing else is converted)."""
    hint = HINTS[name]
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
        raise ConfigError(f"{path}: {name}={value!r}: must be {kind}")
    return coerce(hint, value, name)


def load_config(preset: str | None, path: str | Path | None, flags: dict[str, Any]) -> Config:
    """The effective config: `preset` (or else the file's, or else the default), then the
    file's fields, then `flags` (already typed). A value the file sets out of range is a
    ConfigError naming the file; one the flags set, the flag's field alone."""
    named, values = read_config_file(path) if path is not None else (None, {})
    config = presets.get_preset(preset or named or "default").replace(**values)
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
        f"The {name} preset (cvae/presets.py), every field written out: `cvae train --config "
        f"configs/{name}.toml`\ntrains what `cvae train --preset {name}` trains. Written by "
        f"`make configs`; edit a copy.\n\n{about}"))


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
