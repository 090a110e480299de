"""The compiled programs an exported folder carries (`compiled-programs.zip`), for the machine
it was exported on: a server started on that kind of machine reads them from its compilation
cache (cvae/sampling/compilation_cache.py) instead of compiling them.

`pack` starts a fresh Python process on the finished folder, with JAX's cache pointed at an
empty directory, and lets it do what a server's start does (load, check every block size,
warm up): the cache then holds exactly the programs a start needs, compiled with this
environment's XLA flags, and the zip holds them. `unpack` copies the entries a cache lacks into
it, each under a temporary name and renamed, so a process reading the cache never sees half an
entry. The zip is listed in the manifest like every file, so a damaged one is refused with the
rest of the folder; on a machine whose CPU lacks a feature they were compiled for, XLA refuses
the entries and compiles the programs itself.

Synopsis:

    manifest = carry(folder, manifest)  # cvae export: compiled-programs.zip, in the manifest
    use_cache(folder, None)            # cvae serve/sample: cache on, the entries it lacks
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from cvae.export.manifest import FORMAT_KEYS, is_export, write_manifest
from cvae.sampling.compilation_cache import CACHE_SETTINGS, JAX_ENV, cache_directory, enable

COMPILED = "compiled-programs.zip"
ENTRY_SUFFIX = "-cache"  # how JAX names a cache entry's file
ACCESS_SUFFIX = "-atime"  # the last use JAX's LRU cache keeps beside each entry


def pack(folder: Path) -> Path:
    """Write `folder`/compiled-programs.zip: the programs a start of the exported `folder`
    compiles here (a process of its own, minutes on a slow machine for a large model)."""
    with tempfile.TemporaryDirectory(prefix="cvae-compiled-") as cache:
        env = {**os.environ, JAX_ENV: cache,
               **{name: str(value) for name, value in CACHE_SETTINGS.items()}}
        subprocess.run([sys.executable, "-m", "cvae.export.compiled", str(folder)], env=env,
                       check=True, stdout=subprocess.DEVNULL)
        path = folder / COMPILED
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:  # entries are compressed
            for entry in sorted(Path(cache).glob(f"*{ENTRY_SUFFIX}")):
                archive.write(entry, entry.name)
    return path


def carry(folder: Path, manifest: dict) -> dict:
    """`pack` into a finished export `folder`, and its manifest written again to list the zip;
    returns the new manifest."""
    pack(folder)
    return write_manifest(folder, {key: value for key, value in manifest.items()
                                   if key not in FORMAT_KEYS})


def unpack(folder: Path, cache: Path) -> int:
    """Copy the entries of `folder`'s compiled-programs.zip that `cache` lacks; returns how many
    (0 for a folder without one)."""
    path = Path(folder) / COMPILED
    if not path.is_file():
        return 0
    copied = 0
    with zipfile.ZipFile(path) as archive:
        for name in archive.namelist():
            target = cache / Path(name).name
            if not name.endswith(ENTRY_SUFFIX) or target.exists():
                continue
            partial = cache / f".{target.name}.{os.getpid()}.partial"
            partial.write_bytes(archive.read(name))
            access = cache / (target.name.removesuffix(ENTRY_SUFFIX) + ACCESS_SUFFIX)
            access.write_bytes(time.time_ns().to_bytes(8, "little"))  # for JAX's LRU order
            os.replace(partial, target)
            copied += 1
    return copied


def use_cache(path: str | Path, choice: str | None) -> Path | None:
    """Turn on the compilation cache for a process about to load `path` (`--compilation-cache`
    `choice`: cvae/sampling/compilation_cache.py), seeded with the programs it carries when
    `path` is an exported folder; returns the cache directory (None: off)."""
    directory = enable(cache_directory(choice))
    if directory is not None and is_export(path):
        unpack(Path(path), directory)
    return directory


def main(folder: str) -> None:
    """A server's start on `folder`, for `pack`: every program it compiles goes to the cache."""
    from cvae.export.load import open_sampler

    open_sampler(folder).warm_up()


if __name__ == "__main__":
    main(sys.argv[1])
