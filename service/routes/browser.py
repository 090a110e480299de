"""The page's "draw in the browser" mode: ONNX Runtime Web and the served model's sample.onnx.

`GET /browser/sampling.js` is the mode's script (service/static/browser-sampling.js),
`GET /browser/ort/{file}` the few files of the pinned `onnxruntime-web` package that it loads,
from service/web/node_modules (installed by `make setup` with npm: never a CDN; 404 without
them, and the page then draws on the server and says why), and `GET /browser/sample.onnx` the
served model's `sample(noise, label) -> images`: the exported folder's own file, or for a
checkpoint directory the same conversion `cvae export` makes, done on first request and kept
for the step served.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import FileResponse, Response

from cvae.export.manifest import is_export
from service.dependencies import ServedModel

STATIC_DIR = Path(__file__).parent.parent / "static"
WEB_DIST = Path(__file__).parent.parent / "web" / "node_modules" / "onnxruntime-web" / "dist"
# The wasm-only build and the runtime it loads; every other file of the package stays unserved.
ORT_FILES = {"ort.wasm.min.js": "text/javascript",
             "ort-wasm-simd-threaded.mjs": "text/javascript",
             "ort-wasm-simd-threaded.wasm": "application/wasm"}
ONNX_MEDIA_TYPE = "application/octet-stream"

router = APIRouter(prefix="/browser", include_in_schema=False)
_converted: dict[str, bytes] = {}  # fingerprint -> sample.onnx of a served checkpoint
_converting = threading.Lock()


@router.get("/sampling.js")
async def sampling_script():
    return FileResponse(STATIC_DIR / "browser-sampling.js", media_type="text/javascript",
                        headers={"Cache-Control": "no-cache"})


@router.get("/ort/{name}")
async def onnxruntime_web(name: str):
    """One file of onnxruntime-web (pinned in service/web/package.json)."""
    path = WEB_DIST / name
    if name not in ORT_FILES or not path.is_file():
        raise HTTPException(404, f"{name}: onnxruntime-web is not installed here (make setup "
                                 f"installs it with npm)" if name in ORT_FILES else
                            f"{name}: not a file of onnxruntime-web that is served")
    return FileResponse(path, media_type=ORT_FILES[name],
                        headers={"Cache-Control": "public, max-age=86400"})


@router.get("/sample.onnx")
async def sample_onnx(request: Request, loaded: ServedModel):
    """The served model's sample.onnx; X-Checkpoint-Step, X-Noise-Dim (the width of its noise)
    and X-Latent-Dim (of a code) say what it is."""
    headers = {"X-Checkpoint-Step": str(loaded.step), "Cache-Control": "no-cache",
               "X-Noise-Dim": str(loaded.sampler.noise_dim),
               "X-Latent-Dim": str(loaded.sampler.code_dim)}
    directory = request.app.state.watcher.directory
    if is_export(directory):  # its files were checked against the manifest at start-up
        return FileResponse(directory / "sample.onnx", media_type=ONNX_MEDIA_TYPE,
                            headers=headers)
    return Response(await asyncio.to_thread(converted, loaded), media_type=ONNX_MEDIA_TYPE,
                    headers=headers)


def converted(loaded) -> bytes:
    """sample.onnx of a served checkpoint, converted once per weights (seconds)."""
    with _converting:
        if loaded.fingerprint not in _converted:
            from cvae.export.functions import onnx_functions
            from cvae.export.onnx_files import convert

            portable = next(p for p in onnx_functions(loaded.sampler) if p.name == "sample")
            _converted.clear()  # only the step served now
            _converted[loaded.fingerprint] = convert(portable).SerializeToString()
        return _converted[loaded.fingerprint]
