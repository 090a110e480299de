"""The page at `/` in headless Chromium: pick a digit, draw, see a grid of the right size."""

from __future__ import annotations

import contextlib
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest
import uvicorn

from cvae.grid import grid_shape
from service.app import create_app

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")


def browser_missing() -> str | None:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        return (f"no browser to drive: {', '.join(missing)} missing "
                f"(apt-get install chromium chromium-driver; .ci/run does)")
    return None


@contextlib.contextmanager
def uvicorn_in_thread(app):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


@contextlib.contextmanager
def headless_chromium():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="cvae-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-quic", "--no-first-run",
                 "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def image_width(driver) -> int:
    return driver.execute_script(
        "const img = document.getElementById('grid');"
        "return img.complete ? img.naturalWidth : 0;")


def test_page_draws_the_chosen_digit_grid(trained_run):
    if (reason := browser_missing()):
        pytest.skip(reason)
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    with uvicorn_in_thread(create_app(trained_run.directory)) as url, \
            headless_chromium() as driver:
        driver.get(f"{url}/")
        wait = WebDriverWait(driver, 60)
        # On load the page draws all digits: 10 rows, n = 16 columns, scale 2.
        all_digits_width = grid_shape(160, 16, scale=2)[1]
        wait.until(lambda d: image_width(d) == all_digits_width)

        Select(driver.find_element(By.ID, "digit")).select_by_value("3")
        n_field = driver.find_element(By.ID, "n")
        n_field.clear()
        n_field.send_keys("9")
        driver.find_element(By.ID, "generate").click()
        one_digit_width = grid_shape(9, 3, scale=2)[1]  # ceil(sqrt(9)) = 3 columns
        wait.until(lambda d: image_width(d) == one_digit_width)
        status = driver.find_element(By.ID, "status").text
        assert f"checkpoint step {max(trained_run.steps)}" in status

        seed_before = driver.find_element(By.ID, "seed").get_attribute("value")
        source_before = driver.find_element(By.ID, "grid").get_attribute("src")
        driver.find_element(By.ID, "new-seed").click()
        wait.until(lambda d: d.find_element(By.ID, "grid").get_attribute("src") != source_before)
        seed_after = driver.find_element(By.ID, "seed").get_attribute("value")
        assert seed_after != seed_before
        wait.until(lambda d: f"seed {seed_after}," in d.find_element(By.ID, "status").text)
        assert image_width(driver) == one_digit_width
