"""Prometheus metrics of one app, summed over all worker processes of a machine.

Under `cvae serve` several worker processes answer on one port, and a scrape of `/metrics`
reaches only one of them. prometheus-client's multiprocess mode solves that: when
`PROMETHEUS_MULTIPROC_DIR` is set (the server sets it, and empties it, before starting the
workers), every process writes its values to memory-mapped files there, and `exposition()`
reads all of them with a `MultiProcessCollector`. Counters and histograms are summed over
processes, dead ones included (their counts happened); the gauges keep one series per live
process (`pid` label) and the server deletes a dead worker's gauges (`mark_process_dead`).
Without the variable (tests, a single in-process app) each app keeps its own registry.

`MetricsMiddleware` is a plain ASGI middleware (cheaper than `BaseHTTPMiddleware`): it counts
every response by route and status and times it. The route label is the matched route's path
template, or "other", so arbitrary URLs cannot grow the label set.
"""

from __future__ import annotations

import os
import time

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram,
                               generate_latest, multiprocess)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
LATENCY_BUCKETS = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 10240)
CONTENT_TYPE = CONTENT_TYPE_LATEST


def multiprocess_dir() -> str | None:
    return os.environ.get(MULTIPROC_ENV)


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        self.requests = Counter("cvae_http_requests", "HTTP responses by route and status.",
                                ["route", "status"], registry=registry)
        self.latency = Histogram("cvae_http_request_duration_seconds",
                                 "Time from request to the end of the response, by route.",
                                 ["route"], buckets=LATENCY_BUCKETS, registry=registry)
        self.batch_requests = Histogram("cvae_batch_requests", "Requests per decode call.",
                                        buckets=BATCH_BUCKETS, registry=registry)
        self.batch_rows = Histogram("cvae_batch_rows", "Latent rows per decode call.",
                                    buckets=BATCH_BUCKETS, registry=registry)
        self.queue_depth = Gauge("cvae_queue_rows", "Latent rows waiting for a decode, per "
                                 "process, as of its latest batch.", registry=registry,
                                 multiprocess_mode="liveall")
        self.checkpoint_step = Gauge("cvae_checkpoint_step",
                                     "Step of the checkpoint each process serves (-1: none).",
                                     registry=registry, multiprocess_mode="liveall")
        self.checkpoint_loads = Counter("cvae_checkpoint_loads",
                                        "Checkpoint load attempts by outcome.", ["outcome"],
                                        registry=registry)
        self.rejected = Counter("cvae_rejected_requests",
                                "Requests refused with 503 because the queue was full.",
                                registry=registry)
        self.checkpoint_step.set(-1)
        self._responses: dict[tuple[str, int], tuple] = {}  # labelled children, looked up once

    def observe_batch(self, requests: int, rows: int, rows_waiting: int) -> None:
        self.batch_requests.observe(requests)
        self.batch_rows.observe(rows)
        self.queue_depth.set(rows_waiting)

    def observe_load(self, outcome: str, step: int) -> None:
        self.checkpoint_loads.labels(outcome).inc()
        if outcome == "loaded":
            self.checkpoint_step.set(step)

    def observe_response(self, route: str, status: int, seconds: float) -> None:
        children = self._responses.get((route, status))
        if children is None:
            children = (self.requests.labels(route, str(status)), self.latency.labels(route))
            self._responses[route, status] = children
        children[0].inc()
        children[1].observe(seconds)

    def exposition(self) -> bytes:
        """The text format: all processes' values in multiprocess mode, else this app's."""
        directory = multiprocess_dir()
        if directory is None:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=directory)
        return generate_latest(registry)


class MetricsMiddleware:
    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status = 500

        async def send_wrapper(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = getattr(scope.get("route"), "path", "other")
            self.metrics.observe_response(route, status, time.perf_counter() - started)
