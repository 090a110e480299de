"""`cvae export`'s flags and command, and the check `cvae serve` and `cvae sample` make of an
exported folder before anything loads. Standard library only at import (cvae/cli.py loads it
for every command)."""

from __future__ import annotations

import sys
from pathlib import Path

from cvae.cli.types import add_compilation_cache_flag, add_step_flag, add_truncation_flag
from cvae.export.manifest import step_folders


def add_export_flags(export) -> None:
    """The flags of `cvae export`; its parser (description, examples) comes from cvae/cli.py."""
    export.add_argument("--checkpoint-dir", default="checkpoints",
                        help="the run to export (default checkpoints)")
    export.add_argument("--out", required=True, metavar="DIR",
                        help="the folder to write; it must be empty or new unless --force")
    export.add_argument("--force", action="store_true",
                        help="replace the exported files in a non-empty --out (other files "
                             "there are left alone)")
    add_step_flag(export)
    add_truncation_flag(export)
    add_compilation_cache_flag(export)
    export.add_argument("--no-compiled-programs", dest="compiled_programs",
                        action="store_false",
                        help="leave out compiled-programs.zip: the programs a server's start "
                             "compiles on this kind of machine, which it then reads instead "
                             "(a few MB; packing them costs one start, seconds to minutes)")


def cmd_export(args) -> int:
    from cvae.export.compiled import use_cache
    from cvae.export.run import export_checkpoint

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    try:
        use_cache(args.checkpoint_dir, args.compilation_cache)
        manifest = export_checkpoint(args.checkpoint_dir, args.out, force=args.force,
                                     truncation=args.truncation, step=args.step, log=log,
                                     compiled_programs=args.compiled_programs)
    except AssertionError as error:  # an artefact disagrees with the sampler: nothing written
        print(f"cvae export: error: verification failed, nothing written: {error}",
              file=sys.stderr)
        return 1
    total = sum(entry["bytes"] for entry in manifest["files"].values())
    onnx = manifest["verification"]["onnx"]
    print(f"exported step {manifest['step']} of {args.checkpoint_dir} to {args.out} "
          f"({len(manifest['files']) + 1} files, {total / 1e6:.1f} MB); StableHLO bit-identical, "
          f"ONNX Runtime within {onnx['sample_max_abs']:.1g} "
          f"({onnx['sample_max_uint8']} in uint8)")
    return 0


def check_exported(path: str | Path) -> None:
    """For `cvae serve`/`cvae sample`: an exported folder whose files do not match its
    manifest is refused now (CheckpointError naming the file); a checkpoint directory
    passes."""
    from cvae.export.manifest import is_export, verify_folder

    if is_export(path):
        verify_folder(path)


def check_step(path: str | Path, step) -> None:
    """For `cvae serve --step N`: a step the directory (or exported folder) does not hold is
    refused before any worker starts (StepNotFound, listing the steps there)."""
    from cvae.errors import StepNotFound
    from cvae.export.manifest import is_export, read_manifest

    if not isinstance(step, int):
        return
    steps = [int(read_manifest(path)["step"])] if is_export(path) else step_folders(path)
    if step not in steps:
        raise StepNotFound(path, step, steps)
