"""`cvae train`'s flags and the config they give: a preset, then a `--config` TOML file, then one
flag per config field, grouped by concern (`cli_help.CONFIG_GROUPS`) with the field's doc as its
help. Standard library and the config modules only, so `--help` and a bad value answer at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing

from cvae import cli_help, config_toml, presets
from cvae import config as config_lib
from cvae.cli_types import bounded

PRINTED_HEADER = ("Every field of a cvae train config (docs/configuration.md). Train it with\n"
                  "cvae train --config THIS_FILE; flags given beside --config override it.")


def add_train_flags(train: argparse.ArgumentParser, shown: config_lib.Config) -> None:
    """`cvae train`'s flags: where the config comes from, the run's folders and switches, then
    one flag per config field in its group, `shown`'s values as the defaults."""
    train.add_argument("--preset", choices=tuple(presets.PRESETS),
                       help="the config the file and the flags below change (default: the "
                            "--config file's preset, else default); with --help, the defaults "
                            "shown are its values")
    train.add_argument("--config", metavar="FILE.toml",
                       help="config fields from a TOML file (docs/configuration.md); flags "
                            "given beside it override its values")
    train.add_argument("--print-config", action="store_true",
                       help="print the effective config as TOML and exit (a file for --config)")
    train.add_argument("--checkpoint-dir", default="checkpoints",
                       help="where checkpoints, metrics and grids go; resumes from the latest "
                            "checkpoint there (default checkpoints)")
    train.add_argument("--data-dir", default="data", help="where the IDX files are (default data)")
    train.add_argument("--fresh", action="store_true",
                       help="start over: move the previous run aside to replaced-<time>/")
    train.add_argument("--init-from", metavar="DIR", help="start from another run's weights")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.add_argument("--debug-nans", action="store_true", help="jax_debug_nans: fail at the op")
    train.add_argument("--disable-jit", action="store_true", help="run eagerly (slow; debugging)")
    add_distributed_flags(add_config_flags(train, shown)["devices and processes"])


def add_config_flags(parser: argparse.ArgumentParser, shown: config_lib.Config) -> dict:
    """One flag per config field in its group (`cli_help.CONFIG_GROUPS`), its help the field's
    doc and `shown`'s value (the --preset given); choices come from its Literal type. Returns
    the groups by title."""
    groups = {}
    for title, names in cli_help.CONFIG_GROUPS.items():
        groups[title] = parser.add_argument_group(title)
        for name in names:
            add_config_flag(groups[title], name, getattr(shown, name))
    return groups


def add_config_flag(group, name: str, default) -> None:
    flag = config_lib.flag(name)
    hint = config_lib.HINTS[name]
    shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
    help_text = f"{config_lib.field_doc(name)} (default {shown})"
    if hint is bool:
        group.add_argument(flag, action=argparse.BooleanOptionalAction, default=None,
                           help=help_text)
    elif name in config_lib.CHOICES:
        group.add_argument(flag, choices=config_lib.CHOICES[name], default=None, help=help_text)
    else:
        metavar = ("N,N,..." if typing.get_origin(hint) is tuple else
                   {int: "N", float: "X"}.get(hint, name.upper()))
        group.add_argument(flag, default=None, metavar=metavar, help=help_text)


def add_distributed_flags(group) -> None:
    """Into the devices group: JAX's distributed runtime."""
    from cvae.training.launch import DEFAULT_HEARTBEAT_TIMEOUT  # no JAX: --help stays quick

    group.description = ("--coordinator-address, --num-processes and --process-id join "
                         "processes in JAX's distributed\nruntime; omit all three under SLURM, "
                         "Open MPI's mpirun or a Kubernetes indexed Job, where JAX\ndetects "
                         "them.")
    group.add_argument("--coordinator-address", metavar="HOST:PORT",
                       help="process 0's address and a free port, the same for every process")
    group.add_argument("--num-processes", type=bounded(int, 1, 65536), metavar="N",
                       help="how many processes train together (1 = no distributed runtime)")
    group.add_argument("--process-id", type=bounded(int, 0, 65535), metavar="I",
                       help="this process's index, 0..N-1; process 0 writes logs and pictures")
    group.add_argument("--heartbeat-timeout", type=bounded(int, 1, 3600),
                       default=DEFAULT_HEARTBEAT_TIMEOUT, metavar="SECONDS",
                       help="a process silent this long counts as dead and every other process "
                            f"stops (default {DEFAULT_HEARTBEAT_TIMEOUT})")


def config_from_args(args: argparse.Namespace) -> config_lib.Config:
    """The preset's config, then the --config file's fields, then the flags given."""
    changes = {}
    for field in dataclasses.fields(config_lib.Config):
        value = getattr(args, field.name, None)
        if value is not None:
            changes[field.name] = config_lib.coerce(config_lib.HINTS[field.name], value,
                                                    field.name)
    return config_toml.load_config(args.preset, args.config, changes)


def help_preset(argv: list[str]) -> str:
    """The preset `cvae train --preset NAME --help` shows, read before the parser is built (an
    unknown name shows the default; the parser then refuses it)."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--preset")
    name = early.parse_known_args(argv)[0].preset
    return name if name in presets.PRESETS else "default"
