"""For the people and machines that run the service: `GET /healthz` (alive), `GET /readyz` (the
model this worker serves), `GET /metrics` (Prometheus) and the page at `/`."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from service.checkpoints import CheckpointWatcher
from service.metrics import CONTENT_TYPE
from service.responses import NotReady, Ready, config_summary, error

STATIC_DIR = Path(__file__).parent.parent / "static"
INDEX_HTML = (STATIC_DIR / "index.html").read_text()

router = APIRouter()


@router.get("/healthz", responses={200: {"content": {"application/json": {"schema": {
    "type": "object", "properties": {"status": {"const": "ok"}}, "required": ["status"]}}}}})
async def healthz():
    """The process is alive (says nothing about the model)."""
    return {"status": "ok"}


@router.get("/readyz", response_model=None,
            responses={200: {"model": Ready}, 503: {"model": NotReady}})
async def readyz(request: Request):
    """200 once a checkpoint is loaded and compiled: the step this worker serves; else 503."""
    watcher: CheckpointWatcher = request.app.state.watcher
    loaded = watcher.current
    if loaded is None:
        return error(503, watcher.note, status="not ready",
                     checkpoint_dir=str(watcher.directory), pid=os.getpid())
    return {"status": "ready", "step": loaded.step, "chosen_by": str(watcher.step),
            "pid": os.getpid(), "checkpoint_dir": str(watcher.directory),
            "fingerprint": loaded.fingerprint,
            "config": config_summary(loaded), "note": watcher.note,
            "loaded_at": loaded.loaded_at}


@router.get("/metrics", response_class=Response, responses={200: {
    "description": "Prometheus text exposition format, summed over the machine's workers",
    "content": {"text/plain": {"schema": {"type": "string"}}}}})
async def prometheus_metrics(request: Request):
    """Prometheus text format: requests by status, latency, batch sizes, checkpoint steps."""
    exposition = request.app.state.metrics.exposition
    return Response(await asyncio.to_thread(exposition), media_type=CONTENT_TYPE)


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
async def index():
    return HTMLResponse(INDEX_HTML)
