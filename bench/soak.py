"""Soak and fuzz the real service: `cvae serve` on loopback under a long mixed load.

    python -m bench.soak                                   # make soak: ~2.5 min on 2 cores
    python -m bench.soak --seconds 60 --concurrency 64 --churn-seconds 20 --fuzz-examples 200
    python -m bench.soak --json soak.json                  # also write the figures

Trains a tiny checkpoint (synthetic digits, the `test` preset) in a temporary directory unless
--checkpoint-dir is given (it is copied: the soak writes new steps into its own copy), starts
`cvae serve` on a free 127.0.0.1 port and checks, in order:

1. soak: --concurrency keep-alive connections (bench/bench_service.py's load generator) send
   mixed valid `/sample` requests (digits, n, temperature, scale, pad, cols; half with a seed
   from a fixed set of 32) for --warmup then --seconds. Every request must be a 200 PNG of
   the size DESIGN.md gives; every seeded one byte-identical to the quiet-time reference
   fetched, one at a time, before the load. The server's VmRSS (/proc/PID/status) is sampled
   throughout; its growth from the end of the warm-up to the end must stay under --rss-limit-mb.
2. churn: the same load for --churn-seconds while a background thread keeps training the same
   run into the served directory with retention keep=2 (Orbax deletes the old steps, the
   served one included): no failed request, X-Checkpoint-Step never goes back on a connection
   and ends past the first step; seeded replies agree byte for byte per step, and with
   quiet-time references fetched after the load for the last step.
3. fuzz: schemathesis generates --fuzz-examples valid and as many invalid requests per
   operation of the OpenAPI schema (derandomized): no 5xx, no response off the schema.

Why a 503 "busy" is a failure here: the queue holds 256 requests and 40960 rows in flight;
a closed loop of 64 connections has at most 64 requests of at most 320 rows (n <= 32 for all
digits) in flight, so it can never fill either bound. Exit code 1 when any check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import shutil
import struct
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Callable

from bench.bench_service import (Reply, ServerProcess, cvae_serve_command, drive, free_port,
                                 quantile, server_process)

SEEDED_PATHS = 32
UNSEEDED_SHARE = 0.5


# ---- the tiny run --------------------------------------------------------------------------


def tiny_dataset(num_train: int = 64, num_test: int = 64, seed: int = 0):
    """Digit-like synthetic data: label d lights a band of rows 2d+4..2d+8 on faint noise."""
    import numpy as np

    from cvae.data import Dataset

    rng = np.random.default_rng(seed)

    def images(labels):
        out = rng.integers(0, 40, size=(len(labels), 28, 28), dtype=np.uint8)
        for i, digit in enumerate(labels):
            out[i, 2 * digit + 4:2 * digit + 8, 4:24] = rng.integers(200, 256, size=(4, 20))
        return out

    train = rng.integers(0, 10, num_train).astype(np.int32)
    test = rng.integers(0, 10, num_test).astype(np.int32)
    return Dataset(images(train), train, images(test), test, "mnist")


def train_tiny(directory: Path, epochs: int = 2):
    """The `test` preset for `epochs` epochs of 4 steps into `directory`; returns (config, data)."""
    from cvae import config as config_lib
    from cvae.callbacks import Checkpointer
    from cvae.loop import train_and_evaluate

    config, data = config_lib.test().replace(epochs=epochs), tiny_dataset()
    train_and_evaluate(config, data, directory, [Checkpointer()])
    return config, data


class CheckpointWriter(threading.Thread):
    """Keeps training `config` on `data` into `directory` (resuming its last step), an epoch
    (one new step) every `pause` s or so, with retention `keep` (older steps deleted), until
    `stop()`. `steps` lists the steps written."""

    def __init__(self, config, data, directory: Path, keep: int = 2, pause: float = 1.0):
        super().__init__(name="checkpoint-writer", daemon=True)
        self.config, self.data, self.directory = config, data, directory
        self.keep, self.pause = keep, pause
        self.steps: list[int] = []
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        from cvae.callbacks import Callback, Checkpointer
        from cvae.loop import train_and_evaluate

        writer = self

        class Pace(Callback):
            def on_epoch_end(self, run, metrics):
                writer.steps.append(run.step)
                if writer._halt.wait(writer.pause):
                    run.request_stop("soak over")

        try:
            train_and_evaluate(self.config.replace(epochs=100_000), self.data, self.directory,
                               [Checkpointer(keep=self.keep), Pace()])
        except BaseException as error:  # reported by the caller
            self.error = error

    def stop(self, timeout: float = 120.0) -> None:
        self._halt.set()
        self.join(timeout)


# ---- requests and their checks -------------------------------------------------------------


def random_query(rng: random.Random, seed: int | None) -> str:
    """A valid /sample path: small enough that 64 in flight never fill the queue (<= 320 rows)."""
    digit = rng.choice([None, *range(10)])
    n = rng.choice([1, 2, 4, 8] if digit is None else [1, 2, 4, 8, 16, 32])
    params: dict[str, object] = {"n": n}
    if digit is not None:
        params["digit"] = digit
    if rng.random() < 0.2:
        params["cols"] = rng.randint(1, n)
    params["temperature"] = rng.choice([0.25, 0.5, 1.0, 1.5, 2.0])
    params["scale"] = rng.choice([1, 1, 1, 2, 3])
    params["pad"] = rng.choice([0, 1, 2, 2, 4, 8])
    if seed is not None:
        params["seed"] = seed
    return "/sample?" + urllib.parse.urlencode(params)


def request_mix(seed: int = 0) -> tuple[list[str], Callable[[], str]]:
    """(the seeded paths, a function drawing the next path: a seeded one or a fresh unseeded)."""
    rng = random.Random(seed)
    seeded = [random_query(rng, rng.randrange(2**32)) for _ in range(SEEDED_PATHS)]

    def next_path() -> str:
        if rng.random() < UNSEEDED_SHARE:
            return random_query(rng, None)
        return rng.choice(seeded)

    return seeded, next_path


def expected_size(path: str) -> tuple[int, int]:
    """(width, height) of the PNG that DESIGN.md's layout gives for a /sample path."""
    from cvae.grid import grid_shape
    from cvae.sampling import grid_columns

    query = {k: v[0] for k, v in urllib.parse.parse_qs(urllib.parse.urlsplit(path).query).items()}
    digit = int(query["digit"]) if "digit" in query else None
    n = int(query.get("n", 16))
    cols = grid_columns(digit, n, int(query["cols"]) if "cols" in query else None)
    height, width = grid_shape(n * (1 if digit is not None else 10), cols,
                               int(query.get("scale", 1)), int(query.get("pad", 2)))
    return width, height


def png_size(body: bytes) -> tuple[int, int] | None:
    if body[:8] != b"\x89PNG\r\n\x1a\n" or body[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", body[16:24])


class Tally:
    """Checks every reply as it arrives; keeps counts, examples of failures and the seeded
    bodies seen per (path, step)."""

    def __init__(self, references: dict[str, tuple[int, bytes]]):
        self.references = references  # path -> (step, body) fetched at a quiet time
        self.seen: dict[tuple[str, int], bytes] = {}  # first body per (seeded path, step)
        self.count = collections.Counter()
        self.failures: list[str] = []
        self.latencies: list[float] = []
        self.steps = collections.Counter()
        self.last_step: dict[int, int] = {}
        self._sizes: dict[str, tuple[int, int]] = {}

    def fail(self, kind: str, message: str) -> None:
        self.count[kind] += 1
        if len(self.failures) < 20:
            self.failures.append(f"{kind}: {message}")

    def __call__(self, reply: Reply) -> None:
        self.count["requests"] += 1
        if reply.status != 200:
            body = reply.body[:200].decode("utf-8", "replace")
            return self.fail("errors", f"{reply.path} -> {reply.error or reply.status} {body}")
        self.count["ok"] += 1
        self.latencies.append(reply.seconds)
        step = int(reply.headers.get("x-checkpoint-step", -1))
        self.steps[step] += 1
        if step < self.last_step.get(reply.connection, step):
            self.fail("step_went_back", f"connection {reply.connection}: step "
                      f"{self.last_step[reply.connection]} then {step}")
        self.last_step[reply.connection] = step
        if reply.path not in self._sizes:
            self._sizes[reply.path] = expected_size(reply.path)
        if png_size(reply.body) != self._sizes[reply.path]:
            self.fail("bad_png", f"{reply.path}: {png_size(reply.body)}, "
                      f"expected {self._sizes[reply.path]}")
        if "x-seed" not in reply.headers:
            self.fail("no_x_seed", reply.path)
        if "seed=" in reply.path:
            self.count["seeded"] += 1
            first = self.seen.setdefault((reply.path, step), reply.body)
            reference = self.references.get(reply.path)
            if reference is not None and reference[0] == step and reference[1] != reply.body:
                self.fail("seeded_differs_from_reference", f"{reply.path} at step {step}")
            elif first != reply.body:
                self.fail("seeded_differs_between_replies", f"{reply.path} at step {step}")

    def summary(self, elapsed: float) -> dict:
        self.latencies.sort()
        return {"requests": self.count["requests"], "ok": self.count["ok"],
                "errors": self.count["requests"] - self.count["ok"],
                "seeded_checked": self.count["seeded"],
                "problems": {k: v for k, v in self.count.items()
                             if k not in ("requests", "ok", "seeded")},
                "failure_examples": self.failures[:10],
                "rps": round(self.count["ok"] / elapsed, 1) if elapsed else 0.0,
                "p50_ms": round(quantile(self.latencies, 0.5) * 1000, 1),
                "p99_ms": round(quantile(self.latencies, 0.99) * 1000, 1),
                "max_ms": round(self.latencies[-1] * 1000, 1) if self.latencies else None,
                "steps_served": dict(sorted(self.steps.items()))}


async def quiet_references(port: int, paths: list[str]) -> dict[str, tuple[int, bytes]]:
    """Each path fetched alone, one after the other: path -> (step, body)."""
    replies: list[Reply] = []
    for path in paths:
        await drive(port, path, 1, 60.0, 1, replies.append)
    bad = [r for r in replies if r.status != 200]
    if bad:
        raise RuntimeError(f"reference request failed: {bad[0].path} -> {bad[0].status} "
                           f"{bad[0].error or bad[0].body[:200]!r}")
    return {r.path: (int(r.headers["x-checkpoint-step"]), r.body) for r in replies}


# ---- memory --------------------------------------------------------------------------------


def rss_kb(pid: int) -> int:
    """Resident set size of process `pid` (VmRSS in /proc/PID/status), in KiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")


class RssSampler(threading.Thread):
    """Samples `rss_kb(pid)` every `interval` s into `samples` [(seconds since start, KiB)]."""

    def __init__(self, pid: int, interval: float = 0.5):
        super().__init__(name="rss-sampler", daemon=True)
        self.pid, self.interval = pid, interval
        self.samples: list[tuple[float, int]] = []
        self._halt = threading.Event()
        self._t0 = time.monotonic()

    def sample(self) -> int:
        kb = rss_kb(self.pid)
        self.samples.append((round(time.monotonic() - self._t0, 2), kb))
        return kb

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            try:
                self.sample()
            except (OSError, RuntimeError):
                return  # the process is gone

    def stop(self) -> None:
        self._halt.set()
        self.join(5)


# ---- the phases ----------------------------------------------------------------------------


def run_load(server: ServerProcess, seconds: float, concurrency: int, tally: Tally,
             next_path: Callable[[], str], max_requests: int = 1_000_000) -> float:
    """Mixed load for `seconds` (at most `max_requests`); returns the elapsed seconds."""
    return asyncio.run(drive(server.port, next_path, concurrency, seconds, max_requests, tally))


def soak(server: ServerProcess, seconds: float, concurrency: int, warmup: float = 5.0,
         seed: int = 0, max_requests: int = 1_000_000) -> dict:
    """Phase 1 (module docstring): the figures, with RSS in MiB."""
    seeded, next_path = request_mix(seed)
    references = asyncio.run(quiet_references(server.port, seeded))
    sampler = RssSampler(server.pid)
    rss_start = sampler.sample()
    sampler.start()
    try:
        warm = Tally(references)
        run_load(server, warmup, concurrency, warm, next_path, max_requests)
        rss_warm = sampler.sample()
        tally = Tally(references)
        elapsed = run_load(server, seconds, concurrency, tally, next_path, max_requests)
        rss_end = sampler.sample()
    finally:
        sampler.stop()
    report = {"phase": "soak", "seconds": round(elapsed, 1), "concurrency": concurrency,
              "warmup": {"seconds": warmup, **{k: v for k, v in warm.summary(warmup).items()
                                               if k in ("requests", "errors", "problems",
                                                        "failure_examples")}},
              **tally.summary(elapsed),
              "rss_mb": {"start": mb(rss_start), "after_warmup": mb(rss_warm),
                         "end": mb(rss_end), "max": mb(max(kb for _, kb in sampler.samples)),
                         "growth_after_warmup": mb(rss_end - rss_warm),
                         "samples": len(sampler.samples)}}
    return report


def churn(server: ServerProcess, config, data, directory: Path, seconds: float,
          concurrency: int, seed: int = 1, keep: int = 2, pause: float = 1.0,
          max_requests: int = 1_000_000) -> dict:
    """Phase 2 (module docstring): the load while `CheckpointWriter` writes into `directory`
    (`config`, `data`: the run that wrote it). Runs `seconds`, longer (up to 3x) while no newer
    step has been served yet."""
    seeded, next_path = request_mix(seed)
    before = asyncio.run(quiet_references(server.port, seeded[:1]))
    first_step = next(iter(before.values()))[0]
    tally = Tally({})
    writer = CheckpointWriter(config, data, directory, keep=keep, pause=pause)
    writer.start()
    started = time.perf_counter()
    try:
        # In 2 s rounds: at least `seconds`, and on (up to 3x) until a newer step was served.
        while True:
            run_load(server, 2.0, concurrency, tally, next_path, max_requests)
            elapsed = time.perf_counter() - started
            moved = any(step > first_step for step in tally.steps)
            if elapsed >= seconds and (moved or elapsed >= 3 * seconds):
                break
    finally:
        writer.stop()
    if writer.error is not None:
        raise RuntimeError(f"the checkpoint writer failed: {writer.error!r}")
    # The load goes on (up to 10 s) until the server picked up the newest step written, so the
    # seeded bodies served under load at that step can be compared with a quiet fetch below.
    newest = max(int(p.name) for p in directory.iterdir() if p.name.isdigit())
    settle_until = time.perf_counter() + 10.0
    while newest not in tally.steps and time.perf_counter() < settle_until:
        run_load(server, 1.0, concurrency, tally, next_path, max_requests)
    elapsed = time.perf_counter() - started
    # The last step the server saw, fetched at a quiet time: compare with what the load got.
    last_step = max(tally.steps) if tally.steps else first_step
    after = asyncio.run(quiet_references(server.port, seeded))
    checked = 0
    for path, (step, body) in after.items():
        seen = tally.seen.get((path, step))
        if seen is not None:
            checked += 1
            if seen != body:
                tally.fail("seeded_differs_from_reference", f"{path} at step {step}")
    remaining = sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())
    return {"phase": "churn", "seconds": round(elapsed, 1), "concurrency": concurrency,
            **tally.summary(elapsed), "first_step": first_step, "last_step_served": last_step,
            "steps_written": writer.steps, "steps_left_on_disk": remaining,
            "seeded_compared_with_final_reference": checked}


def fuzz(url: str, max_examples: int = 50, seed: int = 0) -> dict:
    """Phase 3 (module docstring): schemathesis cases from the live server's OpenAPI schema,
    positive and negative, every check it has; failures are collected, not raised."""
    import requests
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis.errors import Unsatisfiable
    from schemathesis.core.failures import FailureGroup
    from schemathesis.specs.openapi.checks import positive_data_acceptance

    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    count = collections.Counter()
    failures: list[str] = []
    session = requests.Session()
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            @hypothesis_seed(seed)
            @settings(max_examples=max_examples, derandomize=True, deadline=None, database=None,
                      phases=[Phase.explicit, Phase.generate],
                      suppress_health_check=list(HealthCheck))
            @given(operation.as_strategy(generation_mode=mode))
            def one(case):
                count["cases"] += 1
                response = case.call(base_url=url, session=session, timeout=60)
                count[f"HTTP {response.status_code}"] += 1
                try:
                    # Every check but "valid data is accepted", done by `_accepted` instead.
                    case.validate_response(response, excluded_checks=[positive_data_acceptance])
                    if mode is schemathesis.GenerationMode.POSITIVE:
                        _accepted(operation.path, case.query or {}, response)
                except (AssertionError, FailureGroup) as error:
                    count["failures"] += 1
                    if len(failures) < 10:
                        failures.append(f"{operation.label} {mode.value}: "
                                        f"{str(error).strip()[:1500]}")

            try:
                one()
            except Unsatisfiable:  # no parameters, so no invalid request to make
                count["operations_without_negative_cases"] += 1
            except Exception as error:  # generation itself failed: report, do not hide
                count["failures"] += 1
                failures.append(f"{operation.label} {mode.value}: {error!r}"[:1500])
    session.close()
    return {"phase": "fuzz", "max_examples": max_examples, "cases": count.pop("cases", 0),
            "failures": count.pop("failures", 0),
            "operations_without_negative_cases": count.pop("operations_without_negative_cases", 0),
            "statuses": dict(sorted(count.items())),
            "failure_examples": failures}


def _accepted(path: str, query: dict, response) -> None:
    """Schema-valid requests get 200, except a /sample grid over the service's pixel bound
    (MAX_PIXELS), which OpenAPI cannot express: that one must be the documented 422."""
    if response.status_code == 200:
        return
    if path == "/sample" and response.status_code == 422:
        from service.app import MAX_PIXELS

        width, height = expected_size("/sample?" + urllib.parse.urlencode(query))
        message = response.json().get("message", "")
        if width * height > MAX_PIXELS and message.startswith("n, cols, scale, pad: the grid"):
            return
    raise AssertionError(f"schema-valid GET {path}?{urllib.parse.urlencode(query)} got "
                         f"{response.status_code}: {response.text[:300]}")


def problems(report: dict, rss_limit_mb: float) -> list[str]:
    """What failed, one line each (empty: all good)."""
    out = []
    for phase in ("soak", "churn"):
        part = report.get(phase)
        if not part:
            continue
        if part["errors"] or part["problems"]:
            out.append(f"{phase}: {part['errors']} failed requests, {part['problems']}; "
                       f"{part['failure_examples'][:3]}")
        if phase == "soak" and part["warmup"]["errors"]:
            out.append(f"soak warm-up: {part['warmup']['errors']} failed requests: "
                       f"{part['warmup']['failure_examples'][:3]}")
        if not part["ok"]:
            out.append(f"{phase}: no request served")
    if report.get("soak") and report["soak"]["rss_mb"]["growth_after_warmup"] > rss_limit_mb:
        out.append(f"soak: RSS grew {report['soak']['rss_mb']['growth_after_warmup']} MB after "
                   f"the warm-up (limit {rss_limit_mb})")
    if report.get("churn") and not report["churn"]["last_step_served"] > \
            report["churn"]["first_step"]:
        out.append(f"churn: the served step never moved past {report['churn']['first_step']}")
    if report.get("fuzz") and report["fuzz"]["failures"]:
        out.append(f"fuzz: {report['fuzz']['failures']} failing cases: "
                   f"{report['fuzz']['failure_examples'][:2]}")
    return out


def mb(kb: int) -> float:
    return round(kb / 1024, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="soak length after warm-up")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds before RSS baseline")
    parser.add_argument("--churn-seconds", type=float, default=20.0,
                        help="load while checkpoints change (0: skip)")
    parser.add_argument("--fuzz-examples", type=int, default=200,
                        help="schemathesis examples per operation and mode (0: skip)")
    parser.add_argument("--rss-limit-mb", type=float, default=150.0)
    parser.add_argument("--max-requests", type=int, default=1_000_000, help="per phase")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-dir", help="copy this run instead of training a tiny one")
    parser.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="cvae-soak-") as work:
        work = Path(work)
        directory = work / "checkpoints"
        started = time.monotonic()
        if args.checkpoint_dir:
            shutil.copytree(args.checkpoint_dir, directory)
            from cvae.checkpoint import load_checkpoint
            config = load_checkpoint(directory).config
            data = tiny_dataset() if args.churn_seconds else None
        else:
            config, data = train_tiny(directory)
        print(f"checkpoint ready in {time.monotonic() - started:.0f} s", flush=True)
        report: dict = {"concurrency": args.concurrency}
        port = free_port()
        with server_process(cvae_serve_command(directory, port), port,
                            work / "server.log") as server:
            report["soak"] = soak(server, args.seconds, args.concurrency, args.warmup, args.seed,
                                  args.max_requests)
            print(json.dumps(report["soak"]), flush=True)
            if args.churn_seconds:
                report["churn"] = churn(server, config, data, directory, args.churn_seconds,
                                        args.concurrency, seed=args.seed + 1,
                                        max_requests=args.max_requests)
                print(json.dumps(report["churn"]), flush=True)
            if args.fuzz_examples:
                report["fuzz"] = fuzz(server.url, args.fuzz_examples, args.seed)
                print(json.dumps(report["fuzz"]), flush=True)
            log = server.log()
        report["server_log_tracebacks"] = log.count("Traceback")
    found = problems(report, args.rss_limit_mb)
    if report["server_log_tracebacks"]:
        found.append(f"the server logged {report['server_log_tracebacks']} tracebacks")
    report["problems"] = found
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    print("\n".join(["FAILED:", *found]) if found else "all checks passed")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
