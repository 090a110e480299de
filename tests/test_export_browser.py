"""The page's "draw in the browser" mode in real headless Chromium, against a real uvicorn on
loopback serving an exported folder: onnxruntime-web (the project's own copy, no CDN) runs
sample.onnx on noise the page drew, and for that noise every uint8 pixel is within 1 of the
service's; without WebAssembly, or without the runtime's files, the server draws the grid and
the page says so."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from cvae.sampling.grid import _to_uint8, grid_shape
from service.app import create_app
from service.routes import browser as browser_routes
from test_browser import browser_missing, headless_chromium, image_width, uvicorn_in_thread



def require_browser_and_runtime():
    if (reason := browser_missing()):
        pytest.skip(reason)
    if not (browser_routes.WEB_DIST / "ort.wasm.min.js").is_file():
        if shutil.which("npm") is None:
            pytest.skip("no npm: onnxruntime-web is not installed (make setup needs npm)")
        pytest.fail(f"{browser_routes.WEB_DIST} is missing: run make setup (npm ci)")


@pytest.fixture(scope="module")
def served(exported):
    """(url, app) of the app serving the mixture-prior export."""
    require_browser_and_runtime()
    app = create_app(exported("mixture"))
    with uvicorn_in_thread(app) as url:
        yield url, app


def where(driver) -> tuple[str, str]:
    element = driver.find_element("id", "where")
    return element.get_attribute("data-side") or "", element.text


def load_and_switch_to_browser(driver, url):
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(driver, 120)
    driver.get(f"{url}/")
    wait.until(lambda d: where(d)[0] == "server")  # the page's first grid, from the server
    driver.find_element("id", "in-browser").click()
    wait.until(lambda d: where(d)[0] in ("browser", "server-fallback-done"))
    return wait


def test_the_browser_draws_the_servers_pixels_for_the_same_noise(served):
    url, app = served
    with headless_chromium() as driver:
        load_and_switch_to_browser(driver, url)
        side, text = where(driver)
        assert side == "browser", text
        assert text.startswith("drawn in the browser (onnxruntime-web, WebAssembly) in ")
        assert text.endswith(" ms")
        last = driver.execute_script(
            "const l = window.browserSampling.last; return {noise: Array.from(l.noise), "
            "labels: Array.from(l.labels), pixels: Array.from(l.pixels), rows: l.rows, "
            "noiseDim: l.noiseDim, step: l.step};")
        width = image_width(driver)
    sampler = app.state.watcher.current.sampler
    rows, latent = last["rows"], sampler.noise_dim
    assert (rows, last["noiseDim"]) == (80, latent)  # all digits, n = 8 (the page's default)
    assert width == grid_shape(80, 8, scale=2)[1]
    assert last["step"] == str(app.state.watcher.current.step)
    noise = np.asarray(last["noise"], np.float32).reshape(rows, latent)
    labels = np.asarray(last["labels"], np.int32)
    assert np.array_equal(labels, np.repeat(np.arange(10), 8))
    assert abs(noise.mean()) < 0.2 and 0.8 < noise.std() < 1.2  # the page's N(0, 1) draws
    served_pixels = _to_uint8(sampler.decode(noise, labels)).astype(int)
    browser_pixels = np.asarray(last["pixels"], np.uint8).reshape(rows, 28, 28).astype(int)
    difference = np.abs(browser_pixels - served_pixels)
    print(f"browser vs server: max uint8 difference {difference.max()}, "
          f"{np.count_nonzero(difference)} of {difference.size} pixels differ")
    assert difference.max() <= 1


def test_without_webassembly_or_runtime_files_the_server_draws_and_says_so(served, monkeypatch):
    url, _ = served
    with headless_chromium() as driver:  # a browser without WebAssembly
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument",
                               {"source": "delete window.WebAssembly;"})
        load_and_switch_to_browser(driver, url)
        side, text = where(driver)
        assert side == "server-fallback-done"
        assert text.startswith("this browser has no WebAssembly: drawn by the server in ")
        assert "checkpoint step" in driver.find_element("id", "status").text
    monkeypatch.setattr(browser_routes, "WEB_DIST", browser_routes.WEB_DIST / "missing")
    with headless_chromium() as driver:  # a fresh profile: nothing cached
        load_and_switch_to_browser(driver, url)
        side, text = where(driver)
        assert side == "server-fallback-done"
        assert text.startswith("onnxruntime-web is not installed on this server")
        assert "drawn by the server in " in text
