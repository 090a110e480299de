"""Prometheus metrics of one app, in its own registry (several apps may share a process).

`MetricsMiddleware` is a plain ASGI middleware (cheaper than `BaseHTTPMiddleware`): it counts
every response by route and status and times it. The route label is the matched route's path
template, or "other", so arbitrary URLs cannot grow the label set.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 10240)


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("cvae_http_requests", "HTTP responses by route and status.",
                                ["route", "status"], registry=self.registry)
        self.latency = Histogram("cvae_http_request_duration_seconds",
                                 "Time from request to the end of the response, by route.",
                                 ["route"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.batch_requests = Histogram("cvae_batch_requests", "Requests per decode call.",
                                        buckets=BATCH_BUCKETS, registry=self.registry)
        self.batch_rows = Histogram("cvae_batch_rows", "Latent rows per decode call.",
                                    buckets=BATCH_BUCKETS, registry=self.registry)
        self.queue_depth = Gauge("cvae_queue_depth", "Requests waiting for a decode.",
                                 registry=self.registry)
        self.checkpoint_step = Gauge("cvae_checkpoint_step",
                                     "Step of the checkpoint being served (-1: none).",
                                     registry=self.registry)
        self.checkpoint_loads = Counter("cvae_checkpoint_loads",
                                        "Checkpoint load attempts by outcome.", ["outcome"],
                                        registry=self.registry)
        self.rejected = Counter("cvae_rejected_requests",
                                "Requests refused with 503 because the queue was full.",
                                registry=self.registry)
        self.checkpoint_step.set(-1)

    def observe_batch(self, jobs: int, rows: int) -> None:
        self.batch_requests.observe(jobs)
        self.batch_rows.observe(rows)


class MetricsMiddleware:
    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status = [500]

        async def send_wrapper(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            label = getattr(route, "path", "other")
            self.metrics.requests.labels(label, str(status[0])).inc()
            self.metrics.latency.labels(label).observe(time.perf_counter() - started)
