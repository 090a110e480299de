"""The API's interactive pages, served whole from this service: `/docs` (Swagger UI) and
`/redoc` (ReDoc), with their scripts and styles under `/docs/assets/`.

FastAPI's own pages load Swagger UI and ReDoc from a CDN, so without internet they are blank.
The package `fastapi-offline` ships both (its `static/` folder); these routes serve those files
and write the two pages with FastAPI's `get_swagger_ui_html` and `get_redoc_html` pointing at
them (`create_app` turns FastAPI's CDN pages off). Nothing on either page leaves the service:
their Content-Security-Policy lets the browser load only from it (ReDoc's side menu would fetch
its maker's logo from their CDN; the browser refuses, and the logo hides itself).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse

from service.responses import error

ASSETS_DIR = Path(importlib.util.find_spec("fastapi_offline").origin).parent / "static"
ASSETS_URL = "/docs/assets"
ASSET_TYPES = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "redoc.standalone.js": "text/javascript; charset=utf-8",
    "favicon.png": "image/png",
}

# Inline scripts and styles: both pages are written with them; blob: for Swagger UI's pictures
# of PNG responses and ReDoc's search worker; data: for the icons inside their stylesheets.
CONTENT_SECURITY_POLICY = ("default-src 'self'; script-src 'self' 'unsafe-inline'; "
                           "style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
                           "font-src 'self' data:; worker-src 'self' blob:")

router = APIRouter()


def _urls(request: Request) -> tuple[str, str]:
    """(the OpenAPI schema's URL, the assets' URL), under the app's root path if it has one."""
    root = request.scope.get("root_path", "").rstrip("/")
    return root + request.app.openapi_url, root + ASSETS_URL


@router.get("/docs", include_in_schema=False)
async def swagger_ui(request: Request) -> HTMLResponse:
    openapi_url, assets = _urls(request)
    page = get_swagger_ui_html(
        openapi_url=openapi_url, title=f"{request.app.title} - Swagger UI",
        swagger_js_url=f"{assets}/swagger-ui-bundle.js",
        swagger_css_url=f"{assets}/swagger-ui.css",
        swagger_favicon_url=f"{assets}/favicon.png", oauth2_redirect_url=None,
        # No badge from the online validator (swagger.io): the page stays on this service.
        swagger_ui_parameters={"validatorUrl": None})
    page.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    return page


@router.get("/redoc", include_in_schema=False)
async def redoc(request: Request) -> HTMLResponse:
    openapi_url, assets = _urls(request)
    page = get_redoc_html(
        openapi_url=openapi_url, title=f"{request.app.title} - ReDoc",
        redoc_js_url=f"{assets}/redoc.standalone.js", redoc_favicon_url=f"{assets}/favicon.png",
        with_google_fonts=False)
    page.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    return page


@router.get(ASSETS_URL + "/{name}", include_in_schema=False)
async def asset(name: str):
    """One of the pages' files; any other name is 404 (no path from the client reaches the
    file system)."""
    if name not in ASSET_TYPES:
        return error(404, f"no asset {name!r}; the pages use {', '.join(ASSET_TYPES)}")
    return FileResponse(ASSETS_DIR / name, media_type=ASSET_TYPES[name])
