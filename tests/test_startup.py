"""A start in seconds: one block size of `decode` checked before the first answer, the others and
the other functions' later, with the same bits; compiled programs read from a cache, the one an
export carries included.

Costs, measured on the 2-core AVX2 EPYC: the block-check tests under 1 CPU-s; the sampler's
about 6; the service's about 8; the carried programs' about 40 (an export, its programs packed
by a process of their own, and a real server).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import time

import httpx
import numpy as np
from fastapi.testclient import TestClient

from cvae.export.compiled import COMPILED, unpack
from cvae.sampling.blocks import ROW_BY_ROW, Probe, block_check, check_remaining
from cvae.sampling.sampler import load_sampler
from servers import cvae_server

SIZES = (4, 8, 16, 32)


def probe(leaky: tuple[int, ...] = (), other_bits: tuple[int, ...] = ()) -> Probe:
    """A row's output is the row doubled, but in blocks of a `leaky` size its position leaks
    into its bits, and in blocks of an `other_bits` size every row is off by one ulp-ish."""
    def fn(variables, rows, labels):
        out = rows * np.float32(2)
        if len(rows) in leaky:
            out = out + np.arange(len(rows), dtype=np.float32)[:, None] * np.float32(1e-3)
        if len(rows) in other_bits:
            out = out + np.float32(1e-3)
        return out
    return Probe(fn, width=3, classes=10)


def test_the_first_size_that_passes_sets_the_bits_and_the_rest_are_checked_later():
    probes = [probe(leaky=(8,), other_bits=(32,))]
    quick = block_check(probes, {}, SIZES, first_only=True)
    assert (quick.kept, quick.dropped, quick.unchecked) == ((4,), (), (8, 16, 32))
    later = check_remaining(probes, {}, quick)
    assert (later.kept, later.dropped, later.unchecked) == ((4, 16), (8, 32), ())
    assert later.signature == quick.signature  # the bits (and so the ETags) do not move
    assert later == block_check(probes, {}, SIZES)  # as one pass over every size


def test_a_smallest_size_that_leaks_positions_gives_way_to_the_next():
    outcome = block_check([probe(leaky=(4,))], {}, SIZES, first_only=True)
    assert (outcome.kept, outcome.dropped, outcome.unchecked) == ((8,), (4,), (16, 32))


def test_a_size_that_rounds_rows_like_real_inputs_otherwise_is_dropped():
    """A size whose bits differ only for rows like the function's real inputs (here: rows with
    a negative value, as N(0, I) noise has), as the default's decode gave 1 row of noise in 12
    other bits in blocks of 256 than of 64 on a 2-core AMD EPYC, every uniform row the same:
    the three uniform test rows alone kept it. A function of images meets no such rows."""
    def fn(variables, rows, labels):
        out = rows * np.float32(2)
        if len(rows) == 16:
            negative = (rows < 0).any(axis=1, keepdims=True)
            out = np.where(negative, np.nextafter(out, np.float32(np.inf)), out)
        return out
    noise = block_check([Probe(fn, width=3, classes=10)], {}, SIZES)
    assert (noise.kept, noise.dropped) == ((4, 8, 32), (16,))
    images = block_check([Probe(fn, width=3, classes=10, pixels=True)], {}, SIZES)
    assert (images.kept, images.dropped) == (SIZES, ())
    assert noise.signature == images.signature  # the three test rows' bits, as before


def test_no_size_passing_decodes_row_by_row():
    outcome = block_check([probe(leaky=SIZES)], {}, SIZES)
    assert (outcome.kept, outcome.dropped) == (ROW_BY_ROW, SIZES)


def test_a_sampler_checked_at_one_size_draws_the_bits_of_one_checked_at_all(trained_run):
    """`cvae sample` and a starting server check one size; the bits are those of every size."""
    quick = load_sampler(trained_run.directory, check="first")
    full = load_sampler(trained_run.directory)
    assert len(quick.block_sizes) == 1 and quick.blocks_unchecked
    assert quick.drawing_signature == full.drawing_signature  # the fingerprint's part
    noise = np.random.default_rng(0).standard_normal((300, quick.noise_dim), np.float32)
    labels = np.arange(300, dtype=np.int32) % 10
    expected = full.decode(noise, labels)  # 256 + 64 rows, or however this CPU's sizes cut it
    np.testing.assert_array_equal(quick.decode(noise, labels).view(np.uint32),
                                  expected.view(np.uint32))
    assert quick.sample_png(None, 30, 5) == full.sample_png(None, 30, 5)
    # Codes and reading were left unchecked: each one's first call checks it, and gives what
    # `full` gives, as does the signature an ETag of a walk or a transfer covers.
    assert not quick.checked("codes") and not quick.checked("reading")
    images = trained_run.data.test_images[:5]
    labels5 = trained_run.data.test_labels[:5].astype(np.int32)
    for got, want in zip(quick.encode(images, labels5), full.encode(images, labels5)):
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    assert quick.checked("codes") and not quick.checked("reading")
    assert quick.signature("codes") == full.signature("codes") != b""
    np.testing.assert_array_equal(quick.classify(images).view(np.uint32),
                                  full.classify(images).view(np.uint32))
    quick.check_remaining_blocks()
    assert (quick.block_sizes, quick.dropped_blocks, quick.blocks_unchecked) == (
        full.block_sizes, full.dropped_blocks, ())
    assert quick.code_block_sizes == full.code_block_sizes
    assert quick.classify_block_sizes == full.classify_block_sizes
    assert quick.kernel_signature == full.kernel_signature
    np.testing.assert_array_equal(quick.decode(noise, labels).view(np.uint32),
                                  expected.view(np.uint32))


def test_a_service_answers_after_one_size_and_its_watcher_checks_the_rest(trained_run):
    from service.app import create_app

    full = load_sampler(trained_run.directory)
    with TestClient(create_app(trained_run.directory, poll_interval=3600)) as client:
        first = client.get("/sample", params={"digit": 7, "n": 4, "seed": 3})
        watcher = client.app.state.watcher
        deadline = time.monotonic() + 120
        while watcher.current.sampler.blocks_unchecked and time.monotonic() < deadline:
            time.sleep(0.05)
        sampler = watcher.current.sampler
        assert (sampler.block_sizes, sampler.blocks_unchecked) == (full.block_sizes, ())
        second = client.get("/sample", params={"digit": 7, "n": 4, "seed": 3})
        walk = {"digit": 7, "seed": 3, "steps": 4}
        walked = client.get("/interpolate", params=walk)
        # A walk runs the codes' functions, whose bits its ETag covers and /sample's does not.
        sampler.signature = lambda *groups: bytes(32)  # as if they rounded otherwise
        walked_elsewhere = client.get("/interpolate", params=walk)
        third = client.get("/sample", params={"digit": 7, "n": 4, "seed": 3})
    assert first.status_code == second.status_code == walked.status_code == 200
    assert first.content == second.content == full.sample_png(7, 4, 3)
    assert first.headers["etag"] == second.headers["etag"] == third.headers["etag"]
    assert walked.content == walked_elsewhere.content
    assert walked.headers["etag"] != walked_elsewhere.headers["etag"]


def test_an_export_carries_the_programs_a_start_compiles(exported, trained_run, tmp_path):
    """A server started on the export with an empty cache compiles nothing, and draws the bytes
    the sampler draws; the zip is in the manifest like every file. (The session's export of
    the `trained_run`, copied, and given its programs as `cvae export` gives them.)"""
    from cvae.export.compiled import carry
    from cvae.export.manifest import read_manifest, verify_folder

    folder = shutil.copytree(exported("standard"), tmp_path / "exported")
    manifest = carry(folder, read_manifest(folder))
    assert COMPILED in manifest["files"] and verify_folder(folder) == manifest
    cache = tmp_path / "cache"
    with cvae_server(folder, tmp_path / "server.log", "--compilation-cache",
                     str(cache)) as server:
        png = httpx.get(f"{server.url}/sample", params={"digit": 7, "n": 4, "seed": 3},
                        timeout=60).content
        line = re.search(r"loaded step \d+ in [\d.]+ s: (\d+) compiled programs read from "
                         r"(\S+), (\d+) compiled", server.log())
    assert line is not None, server.log()[-2000:]
    read, directory, compiled = int(line[1]), line[2], int(line[3])
    assert (read > 0, directory, compiled) == (True, str(cache), 0)
    assert hashlib.sha256(png).digest() == hashlib.sha256(
        load_sampler(trained_run.directory).sample_png(7, 4, 3)).digest()
    assert unpack(folder, cache) == 0  # every entry is there already: nothing copied again


def test_the_flag_wins_over_the_environment_and_off_turns_the_cache_off(monkeypatch):
    from cvae.sampling.compilation_cache import cache_directory

    monkeypatch.setenv("CVAE_COMPILATION_CACHE", "/somewhere")
    assert cache_directory("off") is None
    assert str(cache_directory(None)) == "/somewhere"
    assert str(cache_directory("/elsewhere")) == "/elsewhere"


def test_a_cache_that_cannot_be_written_is_a_warning_not_a_failed_start(trained_run, tmp_path):
    """As in a container whose user has no home: `cvae sample` still draws, compiling all."""
    import subprocess
    import sys

    out = tmp_path / "grid.png"
    result = subprocess.run(
        [sys.executable, "-m", "cvae.cli", "sample", "--checkpoint-dir",
         str(trained_run.directory), "--digit", "7", "--n", "4", "--seed", "3", "--out",
         str(out), "--compilation-cache", "/proc/no-such-cache"],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "compilation cache /proc/no-such-cache is not writable" in result.stderr
    assert out.read_bytes() == load_sampler(trained_run.directory).sample_png(7, 4, 3)
