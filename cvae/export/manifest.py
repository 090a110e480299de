"""The manifest of an exported folder: each file's sha256 and size, checked before use.

Standard library only, so `cvae serve` and `cvae sample` can refuse a damaged folder in the
first second, naming the file, before JAX loads.

Synopsis:

    write_manifest(folder, {"step": 8, ...})    # hashes every file in the folder
    manifest = verify_folder(folder)            # CheckpointError naming a file that differs
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from cvae.errors import CheckpointError

MANIFEST = "manifest.json"
FORMAT = "cvae-export"
FORMAT_VERSION = 1
FORMAT_KEYS = ("format", "format_version", "files")  # what `write_manifest` adds to its info


def is_export(path: str | Path) -> bool:
    """Whether `path` is an exported folder (it has a manifest), not a checkpoint directory."""
    return (Path(path) / MANIFEST).is_file()


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(folder: Path, info: dict) -> dict:
    """Hash every file in `folder` (but the manifest) into manifest.json, with `info` beside
    the list; returns what was written."""
    files = {path.name: {"sha256": sha256(path), "bytes": path.stat().st_size}
             for path in sorted(Path(folder).iterdir()) if path.is_file()
             and path.name != MANIFEST}
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, **info, "files": files}
    (Path(folder) / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def read_manifest(folder: str | Path) -> dict:
    path = Path(folder) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path}: not a readable manifest ({error})") from None
    if manifest.get("format") != FORMAT or not isinstance(manifest.get("files"), dict):
        raise CheckpointError(f"{path}: not a cvae export manifest (format "
                              f"{manifest.get('format')!r})")
    if manifest.get("format_version", 0) > FORMAT_VERSION:
        raise CheckpointError(f"{path}: format version {manifest['format_version']} is newer "
                              f"than this cvae reads ({FORMAT_VERSION}): upgrade cvae")
    return manifest


def verify_folder(folder: str | Path, names: tuple[str, ...] | None = None) -> dict:
    """The manifest, once every file it lists (or only `names`) is present with its sha256;
    else a CheckpointError naming the first file that is missing or differs."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    for name, entry in sorted(manifest["files"].items()):
        if names is not None and name not in names:
            continue
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"{path}: listed in {MANIFEST} but missing: export the "
                                  f"model again (cvae export)")
        if sha256(path) != entry.get("sha256"):
            raise CheckpointError(f"{path}: its sha256 does not match {MANIFEST} (the file "
                                  f"changed after export): export the model again")
    return manifest


def step_folders(directory: str | Path) -> list[int]:
    """The step numbers of a checkpoint directory's committed-or-not step folders, newest first
    (Orbax names a step being written non-numerically); [] when there is no directory."""
    try:
        return sorted((int(p.name) for p in Path(directory).iterdir()
                       if p.name.isdigit() and p.is_dir()), reverse=True)
    except OSError:
        return []
