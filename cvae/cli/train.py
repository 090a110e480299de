"""`cvae train`'s flags and the config they give: a preset, then a `--config` TOML file, then one
flag per setting, grouped as the config nests them (a section, a component's options), with the
setting's doc as its help. Nothing is written twice: the flags, their groups and their help
all come from `cvae.config`'s sections and the registered components' options.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import textwrap
import typing
from collections.abc import Collection

from cvae.cli.types import bounded
from cvae.config import components, flat, presets
from cvae.config import toml as config_toml
from cvae.config.sections import Config
from cvae.config.settings import choices, coerce
from cvae.data.specs import check_config

LIKELIHOOD_OPTIONS = "likelihood.options."
PRINTED_HEADER = ("Every field of a cvae train config (docs/configuration.md). Train it with\n"
                  "cvae train --config THIS_FILE; flags given beside --config override it.")


def add_train_flags(train: argparse.ArgumentParser, shown: Config | None) -> None:
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
    if shown is not None:
        add_config_flags(train, shown)
    add_distributed_flags(train.add_argument_group("processes"))


def add_config_flags(parser: argparse.ArgumentParser, shown: Config) -> dict:
    """One flag per setting, by its flat name (`cvae.config.flat`), in a group per section and
    per component's options, as the config nests them; its help the setting's doc and
    `shown`'s value (the --preset given). Returns the groups by title."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    current = shown.leaves()
    leaves = flat.all_leaves(Config)  # once: each call builds a config and walks the registry
    order = list(leaves)
    for name, path in sorted(flat.flat_names(Config).items(),
                             key=lambda item: order.index(item[1])):
        leaf = leaves[path]
        title = _group_title(leaf)
        if title not in groups:
            groups[title] = parser.add_argument_group(title, _group_description(leaf))
        add_config_flag(groups[title], name, leaf, default=current.get(path, _own_default(leaf)))
    return groups


def _group_title(leaf: flat.Leaf) -> str:
    section = leaf.path.split(".")[0]
    if not leaf.components:
        return section
    return f"{section} options ({', '.join(leaf.components)})"


def _group_description(leaf: flat.Leaf) -> str | None:
    if leaf.components:
        return (f"Options of the {leaf.path.split('.')[0]} {' or '.join(leaf.components)} "
                f"only.")
    return textwrap.fill(inspect.getdoc(leaf.owner).split(": ", 1)[-1].replace("\n", " "), 96)


def _own_default(leaf: flat.Leaf):
    """A component option's default where the shown config names another component."""
    field = next(f for f in dataclasses.fields(leaf.owner) if f.name == leaf.field)
    return field.default


def add_config_flag(group, name: str, leaf: flat.Leaf, *, default) -> None:
    flag = "--" + name.replace("_", "-")
    shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
    kind = leaf.path.split(".")[0]
    if leaf.field == "name" and kind in components.KINDS:
        listed = components.names(kind)
        about = {"model": "The model family", "prior": "The prior p(z|y)",
                 "likelihood": "The likelihood p(x|z,y)"}[kind]
        group.add_argument(flag, choices=listed, default=None, metavar=kind.upper(),
                           help=f"{about}: {_component_lines(kind)} (default {shown})")
        return
    hint = leaf.hint
    help_text = f"{leaf.doc} (default {shown})"
    if hint is bool:
        group.add_argument(flag, action=argparse.BooleanOptionalAction, default=None,
                           help=help_text)
    elif choices(hint):
        group.add_argument(flag, choices=choices(hint), default=None, help=help_text)
    else:
        metavar = ("N,N,..." if typing.get_origin(hint) is tuple else
                   {int: "N", float: "X"}.get(hint, name.upper()))
        group.add_argument(flag, default=None, metavar=metavar, help=help_text)


def _component_lines(kind: str) -> str:
    """Each registered component of `kind` and the first sentence of its doc."""
    return "; ".join(f"{name} ({_first_sentence(components.component(kind, name))})"
                     for name in components.names(kind))


def _first_sentence(cls: type) -> str:
    text = " ".join((inspect.getdoc(cls) or "").split())
    return text.split(". ")[0].split(": ")[0].rstrip(".")


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


def given_paths(args: argparse.Namespace) -> set[str]:
    """The settings the flags and the --config file set, by path."""
    given = {path for name, path in flat.flat_names(Config).items()
             if getattr(args, name, None) is not None}
    if args.config is not None:
        given |= set(config_toml.read_config_file(args.config)[1])
    return given


def config_from_args(args: argparse.Namespace, *, held: Collection[str] = ()) -> Config:
    """The preset's config, then the --config file's settings, then the flags given (a
    component's option is refused unless the config names that component), but for the
    settings in `held` (paths: `likelihood_options_held`)."""
    config = config_toml.load_config(args.preset, args.config, flag_values(args, held))
    check_config(config)
    return config


def flag_values(args: argparse.Namespace, held: Collection[str] = ()) -> dict[str, typing.Any]:
    """The settings the flags give, typed, by flat name; those at the paths in `held` left out."""
    leaves = flat.all_leaves(Config)
    changes = {}
    for name, path in flat.flat_names(Config).items():
        value = getattr(args, name, None)
        if value is not None and path not in held:
            changes[name] = coerce(str if leaves[path].field == "name" else leaves[path].hint,
                                   value, name)
    return changes


def likelihood_options_held(args: argparse.Namespace) -> dict[str, typing.Any]:
    """The likelihood's options that flags set while no flag or file names the likelihood, by
    path, typed: where the likelihood is chosen from the data (`cvae.training.choices`) they go
    to the one chosen, and are refused, saying so, where it has no such option."""
    if components.LIKELIHOOD_NAME in given_paths(args):
        return {}
    paths = flat.flat_names(Config)
    return {paths[name]: value for name, value in flag_values(args).items()
            if paths[name].startswith(LIKELIHOOD_OPTIONS)}


def check_held_options(config: Config, held: dict[str, typing.Any]) -> None:
    """ConfigError now, before any data is read, for a held option out of its range under the
    likelihood that has it (a wrong name or kind was refused by the parser already)."""
    for path, value in held.items():
        owner = components.option_owners("likelihood", path.rsplit(".", 1)[1])[0]
        config.updated({components.LIKELIHOOD_NAME: owner, path: value}).validate()


def help_preset(argv: list[str]) -> str:
    """The preset `cvae train --preset NAME --help` shows, read before the parser is built (an
    unknown name shows the default; the parser then refuses it)."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--preset")
    name = early.parse_known_args(argv)[0].preset
    return name if name in presets.PRESETS else "default"
