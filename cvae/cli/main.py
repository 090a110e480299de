"""The `cvae` console script: data, train, launch, sample, eval, serve, export.

Every config field is a `cvae train` flag (underscores become dashes), with the field's doc as
its help, so `cvae train --help` is the full list of settings. User mistakes end as one line on
stderr and a non-zero exit code; only genuine bugs show a traceback. Only the standard library
and `cvae.config`/`cvae.limits`/`cvae.errors` load before a command runs, so `--help` and user
errors answer at once.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import socket
import sys
import typing
from pathlib import Path

from cvae import limits
from cvae.cli import help as cli_help
from cvae.config import flat, presets
from cvae.config.components import with_options
from cvae.config import toml as config_toml
from cvae.config.sections import Config
from cvae.cli.train import (PRINTED_HEADER, add_train_flags, config_from_args, given_paths,
                            check_held_options, help_preset, likelihood_options_held)
from cvae.cli.types import (add_compilation_cache_flag, add_step_flag, add_truncation_flag,
                             bounded)
from cvae.cli.data import add_data_flags, cmd_data
from cvae.errors import USER_ERRORS, weights_mismatch
from cvae.cli import stops
from cvae.cli.export import add_export_flags, check_exported, check_step, cmd_export
from cvae.cli.sample import add_sample_flags, cmd_sample

EXIT_USER_ERROR = 2
# The project's own loggers say what they do at INFO (e.g. which checkpoint step is served);
# everything else (JAX, Orbax, ...) only from WARNING up.
OWN_LOGGERS = ("cvae", "service")


def add_command(commands, name: str, **extra) -> argparse.ArgumentParser:
    """Subcommand `name`, its description and examples from cvae/cli_help.py."""
    summary, description, examples = cli_help.COMMANDS[name]
    return commands.add_parser(name, help=summary, description=description,
                               epilog="examples:\n" + examples,
                               formatter_class=argparse.RawDescriptionHelpFormatter, **extra)


def build_parser(help_preset: str = "default", *, config_flags: bool = True
                 ) -> argparse.ArgumentParser:
    """The `cvae` parser; `cvae train --help` shows `help_preset`'s values as the defaults.
    Without `config_flags`, `cvae train` has no setting flags: listing them imports every
    registered component (and so JAX), which the other commands' help need not wait for."""
    parser = argparse.ArgumentParser(prog="cvae", description=cli_help.DESCRIPTION,
                                     epilog=cli_help.EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_data_command(commands)
    add_train_command(commands, presets.get_preset(help_preset) if config_flags else None)
    add_launch_command(commands)
    add_sample_flags(add_command(commands, "sample"))
    add_eval_command(commands)
    add_serve_command(commands)
    add_export_flags(add_command(commands, "export"))
    return parser


def add_data_command(commands) -> None:
    add_data_flags(add_command(commands, "data"))


def add_train_command(commands, shown: Config | None) -> None:
    train = add_command(commands, "train", usage="cvae train [--preset NAME] [--config "
                        "FILE.toml] [--print-config] [--FLAG VALUE ...]")
    add_train_flags(train, shown)


def add_launch_command(commands) -> None:
    launch = add_command(
        commands, "launch",
        usage="cvae launch --local-processes N [--grace-seconds S] -- <cvae train flags>")
    launch.add_argument("--local-processes", type=bounded(int, 1, 1024), required=True,
                        metavar="N", help="processes to start on this machine")
    launch.add_argument("--grace-seconds", type=bounded(float, 0, 3600), default=10.0,
                        metavar="SECONDS",
                        help="when one process fails, seconds the others get to stop after "
                             "SIGTERM before SIGKILL (default 10)")
    launch.add_argument("train_flags", nargs=argparse.REMAINDER,
                        help="flags for each `cvae train` (after --)")


def add_eval_command(commands) -> None:
    evaluate = add_command(commands, "eval")
    evaluate.add_argument("--checkpoint-dir", default="checkpoints",
                          help="the run to evaluate (default checkpoints)")
    add_step_flag(evaluate)
    evaluate.add_argument("--data-dir", default="data",
                          help="where the test set's IDX files are (default data)")
    evaluate.add_argument("--json", metavar="FILE",
                          help="also write every figure as JSON (reports go beside it)")
    evaluate.add_argument("--iwae-k", type=bounded(int, 0, 100000), default=None,
                          help="importance samples for -log p(x|y) (default 1000; 0 = skip)")
    evaluate.add_argument("--iwae-k-marginal", type=bounded(int, 0, 100000), default=None,
                          help="samples for each other label in -log p(x), and for every label in "
                               "a --labels N model's generative classifier (default 10; 0 = "
                               "skip)")
    evaluate.add_argument("--iwae-chunk", type=bounded(int, 1, 100000), default=None,
                          help="importance samples evaluated at once (memory; default 100)")
    evaluate.add_argument("--test-limit", type=bounded(int, 0), default=None,
                          help="evaluate the first N test examples (default all)")
    evaluate.add_argument("--iwae-limit", type=bounded(int, 0), default=None,
                          help="the IWAE bounds on the first N of those only (default all)")
    evaluate.add_argument("--samples-per-digit", type=bounded(int, 2, 10000), default=None,
                          help="generated images per label, on average, for the fidelity "
                               "scores (default 500, or as many in all as the reference half "
                               "of a smaller test set holds; split as the test labels are)")
    evaluate.add_argument("--balanced-samples", action="store_true", default=None,
                          help="exactly --samples-per-digit of every label, whatever the test "
                               "labels' mix")
    evaluate.add_argument("--seed", type=bounded(int, 0, limits.MAX_SEED), default=None,
                          help="binarisation, importance samples and generated samples (default 0)")
    evaluate.add_argument("--pixel-sharpness", type=bounded(float, 0, 10, low_open=True),
                          metavar="S", help="render samples, reconstructions and reports at "
                          "sharpness S, not the checkpoint's own (its config's pixel_sharpness)")
    add_truncation_flag(evaluate)
    evaluate.add_argument("--no-fidelity", dest="fidelity", action="store_false", default=None,
                          help="skip the classifier-based sample scores")
    evaluate.add_argument("--classifier-dir", help="classifier cache (default DATA_DIR/classifier)")
    evaluate.add_argument("--report-dir", help="where the report PNGs go (default: beside --json)")
    evaluate.add_argument("--baseline-dir", metavar="DIR",
                          help="also score the samples of the checkpoint in DIR (e.g. a "
                               "`--preset seed` run) in the same run, and their FD ratio")


def add_serve_command(commands) -> None:
    from service.logs import LOG_FORMATS  # the standard library only: --help stays quick

    serve = add_command(commands, "serve")
    serve.add_argument("--checkpoint-dir", default="checkpoints",
                       help="the run to serve, newer checkpoints picked up, or a folder of "
                            "`cvae export` (default checkpoints)")
    add_step_flag(serve, served=True)
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to bind (default 127.0.0.1, this machine only)")
    serve.add_argument("--port", type=bounded(int, 0, 65535), default=8000,
                       help="TCP port (default 8000)")
    serve.add_argument("--workers", type=workers_count, default=1,
                       help="worker processes on the port, or `auto` for one per core "
                            "(default 1); each loads and compiles the model before it serves")
    serve.add_argument("--read-timeout", type=bounded(float, 0.1, 3600), default=10.0,
                       help="seconds a client has to send a whole request (default 10)")
    serve.add_argument("--write-timeout", type=bounded(float, 0.1, 3600), default=30.0,
                       help="seconds a client may stop reading a response before it is cut "
                            "off (default 30)")
    serve.add_argument("--poll-interval", type=bounded(float, 0.1, 3600), default=2.0,
                       help="seconds between looks for a newer checkpoint (default 2)")
    add_truncation_flag(serve)
    add_compilation_cache_flag(serve)
    serve.add_argument("--cache-max-age", type=bounded(int, 0, 31536000), default=600,
                       help="seconds browsers and CDNs may keep a seeded picture before "
                            "revalidating its ETag (default 600)")
    serve.add_argument("--no-access-log", dest="access_log", action="store_false",
                       help="do not log every request (for load tests)")
    serve.add_argument("--log-format", choices=LOG_FORMATS, default="text",
                       help="text: gunicorn's usual lines; json: one JSON object per line, "
                            "with a request id also returned as X-Request-ID (default text)")


def register_own_dataset(args) -> None:
    """A dataset of one's own, named by --dataset or the --config file, is registered from its
    manifest in --data-dir before the config that names it is validated."""
    from cvae.data.prepared import register_prepared

    name = args.dataset
    if name is None and args.config is not None:
        name = config_toml.read_config_file(args.config)[1].get("data.dataset")
    if name is not None:
        register_prepared(args.data_dir, name)


def measured_on(args) -> Config:
    """The preset the run starts from: the one its settings were measured with."""
    named = config_toml.read_config_file(args.config)[0] if args.config else None
    return presets.get_preset(args.preset or named or "default")


def chosen_from_data(args, config: Config, data, *, held: dict):
    """`config` with the settings nobody gave chosen from `data` (`cvae.training.choices`),
    and `held` (the likelihood's options from flags) given to the likelihood it ends with, and
    the choices; none when the run trains on its preset's own dataset."""
    from cvae.training.choices import Choices, choose

    if data is None:
        return config, Choices({}, ())
    from cvae.data.profile import profile

    from cvae.training.start import stored_config

    given = given_paths(args)
    if args.preset not in (None, "default"):  # a preset is measured as a whole
        given |= set(flat.all_leaves(Config))
    resumed = None if args.fresh else stored_config(args.checkpoint_dir)
    choices = choose(config, profile(data.train_images, data.train_labels), given=given,
                     resumed=resumed, held=held)
    return config.updated(choices.changes).validate(), choices


def cmd_train(args) -> int:
    from cvae.data.load import load_dataset

    # Cheap checks first, so a mistake fails in the first second, before JAX even loads.
    register_own_dataset(args)
    held = likelihood_options_held(args)  # for the likelihood chosen below
    config = config_from_args(args, held=held)
    check_held_options(config, held)
    data = None
    if config.data.dataset != measured_on(args).data.dataset:  # settings to choose from it
        data = load_dataset(args.data_dir, config.data.dataset, config.data.source, test=False)
    elif held:
        config = with_options(config, "likelihood", held, decided="its preset's")
    from cvae.training import processes as process_group
    from cvae.training import run_lock

    # Joined before anything runs on JAX's backend (choosing from the data measures the
    # machine's speed there), as JAX requires; --print-config only prints.
    processes = None if args.print_config else process_group.initialize(
        args.coordinator_address, args.num_processes, args.process_id,
        heartbeat_timeout=args.heartbeat_timeout)
    config, choices = chosen_from_data(args, config, data, held=held)
    if args.print_config:
        print(config_toml.to_toml(config, header="\n".join(
            [PRINTED_HEADER, *([""] + choices.describe(config.data.dataset).splitlines()
                               if choices.reasons else [])])), end="")
        return 0
    if choices.reasons:
        print(choices.describe(config.data.dataset), flush=True)
    # Training never opens the test files: selection uses the validation split
    # (cvae/data/splits.py). Loaded before the checkpoint dir is made, so data that is refused
    # (too large, or not what the model was trained on) leaves no empty run behind.
    if data is None:
        data = load_dataset(args.data_dir, config.data.dataset, config.data.source, test=False)
    checkpoint_dir = Path(args.checkpoint_dir)
    with stops.deferred():  # a signal during start-up waits for the probe file to be gone
        ensure_writable(checkpoint_dir)
    # A second run on the same directory is refused while this one trains.
    with run_lock.held(checkpoint_dir) if processes.is_writer else contextlib.nullcontext():
        run = train(args, config, data, checkpoint_dir=checkpoint_dir, processes=processes,
                    choices=choices)
    if not processes.is_writer:
        return run.exit_code
    if run.stop_reason:
        resume = (f"; resume with the same command (checkpoints in {checkpoint_dir})"
                  if run.exit_code == 0 else "")
        print(f"stopped at step {run.step}: {run.stop_reason}{resume}", file=sys.stderr)
        return run.exit_code
    if run.start_step >= run.total_steps:
        print(f"nothing to do: {checkpoint_dir} is already at step {run.step} of "
              f"{run.total_steps}; raise --epochs to train longer or pass --fresh to start over")
        return 0
    print(f"trained to step {run.step}; checkpoints and samples in {checkpoint_dir}")
    return 0


def train(args, config, data, *, checkpoint_dir: Path, processes, choices):
    """The run itself, once its directory is held; the `Run` it ends with."""
    import jax

    from cvae.training.callbacks import default_callbacks
    from cvae.training.loop import train_and_evaluate

    jax.config.update("jax_debug_nans", args.debug_nans)
    jax.config.update("jax_disable_jit", args.disable_jit)
    callbacks = default_callbacks(config, progress=not args.no_progress,
                                  writer=processes.is_writer, command=args.command_line,
                                  choices=choices.reasons)
    try:
        return train_and_evaluate(config, data, checkpoint_dir, callbacks=callbacks,
                                  fresh=args.fresh, init_from=args.init_from)
    except Exception as error:
        if processes.count == 1:
            raise
        exit_without_waiting(processes, error, checkpoint_dir)


def exit_without_waiting(processes, error: Exception, checkpoint_dir: Path) -> typing.NoReturn:
    """One of N processes failed: say so in one line and leave at once.

    A normal exit would wait at JAX's shutdown barrier for processes that may be gone, and
    meanwhile keep the others waiting in a collective; leaving makes their next collective fail
    too, so every process stops within the heartbeat timeout.
    """
    from cvae.training.launch import EXIT_PEER_FAILED

    first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    if isinstance(error, USER_ERRORS):
        message, code = first_line, EXIT_USER_ERROR
    else:
        message, code = (f"{first_line} (another process has probably stopped: see its "
                         f"output); rerun the same command to resume from the last checkpoint "
                         f"in {checkpoint_dir}"), EXIT_PEER_FAILED
    print(f"cvae train: error: {processes.describe()}: {message}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(code)


def ensure_writable(directory: Path) -> None:
    """Fail in the first second, not at the first save an epoch later."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        # Named per process: all processes of a multi-process run probe the same directory.
        probe = directory / f".write-test-{socket.gethostname()}-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise PermissionError(f"checkpoint dir {directory} is not writable: "
                              f"{error.strerror or error}") from None


def cmd_eval(args) -> int:
    from cvae.evaluation.run import EvalOptions, run_eval

    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(EvalOptions)
             if getattr(args, f.name, None) is not None}
    run_eval(args.checkpoint_dir, args.data_dir, EvalOptions(**given), json_path=args.json,
             baseline_dir=args.baseline_dir, step=args.step)
    return 0


def workers_count(text: str) -> int | str:
    """argparse type for --workers: a count in 1..64, or `auto`."""
    return text if text == "auto" else bounded(int, 1, 64)(text)


def cmd_serve(args) -> int:
    from cvae.sampling.compilation_cache import OFF, cache_directory
    from service.logs import configure_logging
    from service.server import lazy_app, serve

    check_exported(args.checkpoint_dir)
    check_step(args.checkpoint_dir, args.step)
    configure_logging(args.log_format)
    app = lazy_app("service.app:create_app", args.checkpoint_dir,
                   poll_interval=args.poll_interval, cache_max_age=args.cache_max_age,
                   request_ids=args.log_format == "json", truncation=args.truncation,
                   step=args.step,
                   compilation_cache=str(cache_directory(args.compilation_cache) or OFF))
    serve(app, args.host, args.port, workers=args.workers, read_timeout=args.read_timeout,
          write_timeout=args.write_timeout, access_log=args.access_log,
          log_format=args.log_format)
    return 0


def cmd_launch(args) -> int:
    from cvae.training.launch import launch

    return launch(args.local_processes, args.train_flags, grace=args.grace_seconds)


COMMANDS = {"data": cmd_data, "train": cmd_train, "launch": cmd_launch, "sample": cmd_sample,
            "eval": cmd_eval, "serve": cmd_serve, "export": cmd_export}


@stops.guarded  # SIGINT/SIGTERM at any moment of train, serve and launch (cvae/cli/stops.py)
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(help_preset(argv), config_flags="train" in argv[:1]).parse_args(argv)
    args.command_line = ["cvae", *argv]
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for name in OWN_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO)
    try:
        return COMMANDS[args.command](args)
    except USER_ERRORS as error:
        print(f"cvae {args.command}: error: {error}", file=sys.stderr)
        return EXIT_USER_ERROR
    except Exception as error:
        mismatch = weights_mismatch(error)
        if mismatch is None:
            raise
        print(f"cvae {args.command}: error: {mismatch}", file=sys.stderr)
        return EXIT_USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
