"""Checks of a real `cvae serve` under load: soak, checkpoint churn and schema fuzzing.

The test modules (tests/test_service_soak.py, tests/test_service_fuzz.py) run them briefly;
`make soak` runs the same tests for longer (CVAE_SOAK_SECONDS, CVAE_CHURN_SECONDS,
CVAE_FUZZ_EXAMPLES). What each phase checks:

1. soak: keep-alive connections (tests/loadgen.py) send mixed valid `/sample` requests (digits,
   n, temperature, scale, pad, cols; half with a seed from a fixed set of 32). Every request
   must be a 200 PNG of the size the layout gives; every seeded one byte-identical to the
   quiet-time reference fetched, one at a time, before the load. The resident memory of the
   server's processes is sampled throughout; its growth after the warm-up must stay bounded.
2. churn: the same load while a background thread keeps training the same run into the served
   directory with retention keep=2 (Orbax deletes the old steps, the served one included): no
   failed request, X-Checkpoint-Step never goes back on a connection and ends past the first
   step; seeded replies agree byte for byte per step, and with quiet-time references fetched
   after the load for the last step.
3. fuzz: schemathesis generates valid and invalid requests per operation of the OpenAPI schema
   (derandomized): no 5xx, no response off the schema. `POST /transfer`'s bodies are real PNG
   and JPEG pictures of random sizes and pixels (`upload_images`), so valid uploads are tried.

Why a 503 "busy" is a failure here: the service holds 40960 rows waiting or decoding per
worker; a closed loop of 64 connections has at most 64 requests of at most 320 rows (n <= 32
for all digits) in flight, so it can never fill that bound.
"""

from __future__ import annotations

import asyncio
import collections
import random
import struct
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Callable

from loadgen import Reply, drive, quantile
from servers import ServerProcess, children

SEEDED_PATHS = 32
UNSEEDED_SHARE = 0.5


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
        from cvae.training.callbacks import Callback, Checkpointer
        from cvae.training.loop import train_and_evaluate

        writer = self

        class Pace(Callback):
            def on_epoch_end(self, run, metrics):
                writer.steps.append(run.step)
                if writer._halt.wait(writer.pause):
                    run.request_stop("soak over")

        try:
            train_and_evaluate(self.config.replace(epochs=100_000), self.data, self.directory,
                               callbacks=[Checkpointer(keep=self.keep), Pace()])
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
    """(width, height) of the PNG that the make_grid layout gives for a /sample path."""
    from cvae.sampling.grid import grid_shape
    from cvae.sampling.grid import grid_columns

    query = {k: v[0] for k, v in urllib.parse.parse_qs(urllib.parse.urlsplit(path).query).items()}
    digit = int(query["digit"]) if "digit" in query else None
    n = int(query.get("n", 16))
    cols = grid_columns(digit, n, int(query["cols"]) if "cols" in query else None)
    height, width = grid_shape(n * (1 if digit is not None else 10), cols,
                               scale=int(query.get("scale", 1)), pad=int(query.get("pad", 2)))
    return width, height


def walk_size(path: str) -> tuple[int, int]:
    """(width, height) of the PNG for an /interpolate path (service/app.py's layout)."""
    from cvae.sampling.grid import grid_shape

    query = {k: v[0] for k, v in urllib.parse.parse_qs(urllib.parse.urlsplit(path).query).items()}
    if query.get("walk", "latent") == "latent":
        steps = int(query.get("steps", 10))
        tiles, cols = steps * (1 if "digit" in query else 10), steps
    else:
        tiles, cols = int(query.get("n", 1)) * 10, 10
    height, width = grid_shape(tiles, int(query.get("cols", cols)), scale=int(query.get("scale",
                                                                                        1)),
                               pad=int(query.get("pad", 2)))
    return width, height


def transfer_size(path: str) -> tuple[int, int]:
    """(width, height) of the PNG for a /transfer path (service/app.py's layout)."""
    from cvae.sampling.grid import grid_shape

    query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
    first = {k: v[0] for k, v in query.items()}
    show_input = first.get("show_input", "").lower() in ("true", "1", "on", "yes")
    row = len(query.get("digits", range(10))) + show_input
    height, width = grid_shape(row * max(1, int(first.get("samples", 0))),
                               int(first.get("cols", row)), scale=int(first.get("scale", 1)),
                               pad=int(first.get("pad", 2)))
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
        # Per TCP connection: (load run, generator connection, reconnection serial). Workers
        # (and replicas) move to a new step each on their own, so only a connection, which
        # stays with one worker, must never see its step go back.
        self.last_step: dict[tuple[int, int, int], int] = {}
        self.run = 0
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
        connection = (self.run, reply.connection, reply.serial)
        if step < self.last_step.get(connection, step):
            self.fail("step_went_back", f"connection {connection}: step "
                      f"{self.last_step[connection]} then {step}")
        self.last_step[connection] = step
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
    """Resident set size of process `pid` and its children (the server's workers), in KiB
    (VmRSS in /proc/PID/status)."""
    total = 0
    for process in (pid, *children(pid)):
        with open(f"/proc/{process}/status") as status:
            total += next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    return total


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
            except (OSError, StopIteration):
                return  # the process is gone

    def stop(self) -> None:
        self._halt.set()
        self.join(5)


# ---- the phases ----------------------------------------------------------------------------


def run_load(server: ServerProcess, seconds: float, concurrency: int, tally: Tally,
             next_path: Callable[[], str], max_requests: int = 1_000_000) -> float:
    """Mixed load for `seconds` (at most `max_requests`); returns the elapsed seconds."""
    tally.run += 1  # new connections
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

    for media_type, strategy in upload_images().items():
        schemathesis.openapi.media_type(media_type, strategy)
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    count = collections.Counter()
    by_operation = collections.Counter()
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
                by_operation[f"{operation.label} {mode.value} HTTP {response.status_code}"] += 1
                try:
                    # Every check but "valid data is accepted", done by `_accepted` instead.
                    case.validate_response(response, excluded_checks=[positive_data_acceptance])
                    if mode is schemathesis.GenerationMode.POSITIVE:
                        _accepted(operation.path, case.query or {}, case.body, response)
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
            "by_operation": dict(sorted(by_operation.items())),
            "failure_examples": failures}


def upload_images() -> dict:
    """Hypothesis strategies of real PNG and JPEG bytes: 1-64 px a side (often 28x28), random
    grey pixels (some blank), for `POST /transfer`'s body."""
    import io

    from hypothesis import strategies as st
    from PIL import Image

    @st.composite
    def picture(draw, fmt: str):
        width, height = (draw(st.one_of(st.just(28), st.integers(1, 64))) for _ in range(2))
        level = draw(st.integers(0, 255))
        pixels = draw(st.one_of(st.just(bytes([level]) * (width * height)),
                                st.binary(min_size=width * height, max_size=width * height)))
        buffer = io.BytesIO()
        Image.frombytes("L", (width, height), pixels).save(buffer, fmt)
        return buffer.getvalue()

    return {"image/png": picture("PNG"), "image/jpeg": picture("JPEG")}


def _accepted(path: str, query: dict, body, response) -> None:
    """Schema-valid requests get 200, except what OpenAPI cannot express, which must get the
    documented 422: a /sample or /interpolate grid over the service's pixel bound (MAX_PIXELS),
    and a /transfer or /classify upload that is blank, or not 28x28 with prepare=none; a
    `label` that names none of the served model's classes, or comes beside `digit`, and a
    `digit` or `digits` past them (the schema bounds a class index by every model's limit,
    `MAX_CLASSES`: the classes are the model's, not the schema's); and /classify's documented
    409 when the served model has no classifier."""
    if response.status_code == 200:
        return
    if response.status_code == 422 and (_refused_label(query, response.json()["detail"][0])
                                        or _past_the_classes(response.json()["detail"][0])):
        return
    if path == "/classify" and response.status_code == 409:
        if response.json()["detail"][0]["type"] == "no_classifier":
            return  # the served model was trained with every label: it has no q(y|x)
    if path in ("/transfer", "/classify") and response.status_code == 422:
        if _refused_upload(body, query, response.json()["detail"][0]["type"]):
            return
    if response.status_code == 422:
        from service.responses import MAX_PIXELS

        size = {"/sample": expected_size, "/interpolate": walk_size,
                "/transfer": transfer_size}[path]
        width, height = size(f"{path}?{urllib.parse.urlencode(query, doseq=True)}")
        message = response.json().get("message", "")
        if width * height > MAX_PIXELS and ", cols, scale, pad: the grid" in message:
            return
    raise AssertionError(f"schema-valid {path}?{urllib.parse.urlencode(query)} got "
                         f"{response.status_code}: {response.text[:300]}")


def _refused_label(query: dict, problem: dict) -> bool:
    """Whether the 422 `problem` is `label`'s, and `cvae.data.class_names` refuses it too for
    the served classes (`problem`'s own list), or it came beside `digit`."""
    from cvae.data.class_names import UnknownLabel, label_index

    if problem.get("type") != "unknown_class" or "label" not in query:
        return False
    if query.get("digit") is not None:
        return True
    try:
        label_index(problem["ctx"]["classes"], query["label"])
    except UnknownLabel:
        return True
    return False


def _past_the_classes(problem: dict) -> bool:
    """Whether the 422 `problem` is `service.params.check_labels`': a `digit` or `digits` the
    schema allows that indexes no class of the served model (its `le`, the last class)."""
    if problem.get("type") != "less_than_equal" or problem.get("loc") not in (
            ["query", "digit"], ["query", "digits"]):
        return False
    given = problem["input"] if isinstance(problem["input"], list) else [problem["input"]]
    return any(int(value) > problem["ctx"]["le"] for value in given)


def _refused_upload(body: bytes, query: dict, kind: str) -> bool:
    """Whether `cvae.data.digit_image` refuses `body` for the reason `kind` the service gave."""
    from cvae.data import digit_image
    expected = {"no_digit": digit_image.NoDigit, "wrong_size": digit_image.WrongSize}
    try:
        digit_image.prepare_digit(body, query.get("prepare", "mnist"))
    except digit_image.ImageInputError as error:
        return isinstance(error, expected.get(kind, ()))
    return False


def mb(kb: int) -> float:
    return round(kb / 1024, 1)
