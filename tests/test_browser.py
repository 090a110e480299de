"""The page at `/` in headless Chromium: pick a digit, draw, see a grid of the right size; draw
a digit on the canvas and see it in all ten digits. Also the API pages `/docs` and `/redoc`.

The browser resolves no host name but loopback addresses, as on a machine without internet: a
page that needs a CDN stays blank here."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path

import pytest

from cvae.sampling.grid import grid_shape
from service.app import create_app
from servers import uvicorn_in_thread

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
def headless_chromium():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="cvae-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console, for tests
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-quic", "--no-first-run",
                 "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
                 "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


# The window the page is laid out for: a laptop screen.
VIEWPORT = {"width": 1280, "height": 800}


def set_viewport(driver) -> None:
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {**VIEWPORT, "deviceScaleFactor": 1, "mobile": False})


def unloaded_images_shown(driver) -> list[str]:
    """The visible <img> elements without a loaded picture (a broken-image placeholder)."""
    return driver.execute_script("""
        return [...document.images].filter((img) => {
            const box = img.getBoundingClientRect();
            const shown = box.width > 0 && box.height > 0
                && getComputedStyle(img).visibility !== "hidden";
            return shown && !(img.complete && img.naturalWidth > 0);
        }).map((img) => img.id || img.alt);""")


def assert_in_view_without_scrolling(driver, image_id: str) -> None:
    box = driver.execute_script(
        "return document.getElementById(arguments[0]).getBoundingClientRect().toJSON();",
        image_id)
    assert driver.execute_script("return [window.scrollX, window.scrollY];") == [0, 0]
    assert box["width"] > 0 and box["height"] > 0, box
    assert 0 <= box["left"] and box["right"] <= VIEWPORT["width"], box
    assert 0 <= box["top"] and box["bottom"] <= VIEWPORT["height"], box


def image_width(driver, image_id: str = "grid") -> int:
    return driver.execute_script(
        "const img = document.getElementById(arguments[0]);"
        "return img.complete ? img.naturalWidth : 0;", image_id)


@pytest.fixture(scope="module")
def browser(trained_run):
    """(driver, url): headless Chromium, and the app on a free loopback port; one per module."""
    if (reason := browser_missing()):
        pytest.skip(reason)
    with uvicorn_in_thread(create_app(trained_run.directory)) as url, \
            headless_chromium() as driver:
        yield driver, url


def open_page(browser):
    """Loads `/` afresh in a 1280x800 window; returns the driver and a 60 s waiter."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver, url = browser
    set_viewport(driver)
    driver.get(f"{url}/")
    return driver, WebDriverWait(driver, 60)


def test_page_draws_the_chosen_digit_grid(browser, trained_run):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver, wait = open_page(browser)
    # On load the page draws all digits: 10 rows, n = 8 columns, scale 2.
    all_digits_width = grid_shape(80, 8, scale=2)[1]
    wait.until(lambda d: image_width(d) == all_digits_width)

    Select(driver.find_element(By.ID, "digit")).select_by_value("3")
    n_field = driver.find_element(By.ID, "n")
    n_field.clear()
    n_field.send_keys("12")
    driver.find_element(By.ID, "generate").click()
    # ceil(sqrt(12)) = 4 columns (the grid drawn on picking the digit, with n = 8, has 3)
    one_digit_width = grid_shape(12, 4, scale=2)[1]
    wait.until(lambda d: image_width(d) == one_digit_width)
    wait.until(lambda d: "checkpoint step" in d.find_element(By.ID, "status").text)
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


def grid_tiles_with_ink(driver, image_id: str, count: int, scale: int, pad: int = 2) -> int:
    """How many of the first `count` tiles of the grid image `image_id` hold any light pixel
    (read back through a canvas in the page)."""
    return driver.execute_script("""
        const [id, count, size, pad] = arguments;
        const img = document.getElementById(id);
        const canvas = document.createElement("canvas");
        canvas.width = img.naturalWidth; canvas.height = img.naturalHeight;
        const context = canvas.getContext("2d");
        context.drawImage(img, 0, 0);
        let inked = 0;
        for (let i = 0; i < count; i++) {
            const data = context.getImageData(pad + i * (size + pad), pad, size, size).data;
            let light = false;
            for (let p = 0; p < data.length; p += 4) if (data[p] > 128) { light = true; break; }
            if (light) inked++;
        }
        return inked;""", image_id, count, 28 * scale, pad)


def test_drawing_a_digit_shows_it_in_all_ten_digits(browser, trained_run):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    driver, wait = open_page(browser)
    canvas = driver.find_element(By.ID, "canvas")
    # A 7 in one stroke (offsets from the canvas centre); releasing it sends the transfer.
    ActionChains(driver).move_to_element_with_offset(canvas, -50, -90).click_and_hold() \
        .move_by_offset(40, 0).move_by_offset(50, 0).move_by_offset(-30, 60) \
        .move_by_offset(-30, 60).move_by_offset(-20, 50).release().perform()
    # The prepared input, then the ten digits: one row of 11 tiles at scale 2.
    height, width = grid_shape(11, 11, scale=2)
    wait.until(lambda d: image_width(d, "transfer-grid") == width)
    assert driver.execute_script(
        "return document.getElementById('transfer-grid').naturalHeight") == height
    assert grid_tiles_with_ink(driver, "transfer-grid", 11, scale=2) == 11
    assert_in_view_without_scrolling(driver, "transfer-grid")
    status = driver.find_element(By.ID, "transfer-status").text
    assert status.startswith("read as ") and f"step {max(trained_run.steps)}" in status
    # Beside it, the model's own reading: trained with every label, it reads by Bayes' rule.
    wait.until(lambda d: "the model reads" in d.find_element(By.ID, "reading").text)

    # Undo leaves a blank pad; Transfer then says so, from the server's message.
    driver.find_element(By.ID, "undo").click()
    driver.find_element(By.ID, "transfer").click()
    wait.until(lambda d: "blank" in d.find_element(By.ID, "transfer-status").text)
    assert "error" in driver.find_element(By.ID, "transfer-status").get_attribute("class")


def test_no_image_is_shown_without_its_picture(browser):
    """No broken-image placeholder: before the first grid arrives, before any transfer, and
    after a transfer the server refused."""
    from selenium.webdriver.common.by import By

    driver, wait = open_page(browser)
    assert unloaded_images_shown(driver) == []
    wait.until(lambda d: image_width(d) > 0)
    assert unloaded_images_shown(driver) == []
    assert not driver.find_element(By.ID, "transfer-grid").is_displayed()
    driver.find_element(By.ID, "transfer").click()  # a blank pad: refused, said in words
    wait.until(lambda d: "blank" in d.find_element(By.ID, "transfer-status").text)
    assert unloaded_images_shown(driver) == []


def test_a_few_label_model_shows_its_reading_beside_the_transfer(few_label_run):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    if (reason := browser_missing()):
        pytest.skip(reason)
    with uvicorn_in_thread(create_app(few_label_run.directory)) as url, \
            headless_chromium() as driver:
        set_viewport(driver)
        driver.get(f"{url}/")
        wait = WebDriverWait(driver, 60)
        # Four posterior draws: the tallest result, under the tallest panel (the reading's bars).
        Select(driver.find_element(By.ID, "samples")).select_by_value("4")
        canvas = driver.find_element(By.ID, "canvas")
        ActionChains(driver).move_to_element_with_offset(canvas, -90, -20).click_and_hold() \
            .move_by_offset(90, 0).move_by_offset(90, 0).release().perform()
        wait.until(lambda d: d.find_element(By.ID, "reading").text.startswith("the model reads"))
        bars = driver.find_elements(By.CSS_SELECTOR, "#reading .bar")
        assert len(bars) == 10
        top = driver.find_element(By.CSS_SELECTOR, "#reading .bar.top").text.split()[0]
        assert driver.find_element(By.ID, "reading").text.startswith(f"the model reads {top} (")
        wait.until(lambda d: d.find_element(By.ID, "transfer-status").text.startswith("read as"))
        status = driver.find_element(By.ID, "transfer-status").text
        assert status.startswith(f"read as {top},")  # /transfer read it with q(y|x) too
        wait.until(lambda d: image_width(d, "transfer-grid") == grid_shape(44, 11, scale=2)[1])
        assert_in_view_without_scrolling(driver, "transfer-grid")


def resources_loaded(driver) -> list[str]:
    return driver.execute_script(
        "return performance.getEntriesByType('resource').map((entry) => entry.name);")


@pytest.mark.parametrize("page, rendered", [
    # Swagger UI: the title, and the operations listed
    ("/docs", "return [...document.querySelectorAll('.swagger-ui .info .title, "
              ".opblock-summary-path')].map((e) => e.textContent).join(' ');"),
    # ReDoc: its rendered API title and operations
    ("/redoc", "const content = document.querySelector('.api-content');"
               "return content ? content.textContent : '';"),
])
def test_api_pages_render_offline_and_fetch_nothing_elsewhere(browser, page, rendered):
    """Each page renders with no host reachable but this one, loads only this service's files,
    and its Content-Security-Policy refuses the rest (ReDoc's logo from its maker's CDN), so
    nothing would leave the service on a machine with internet either."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver, url = browser
    driver.get_log("browser")  # drop what earlier pages logged
    driver.get(url + page)
    text = WebDriverWait(driver, 60).until(
        lambda d: (found := d.execute_script(rendered)) and "/transfer" in found and found)
    assert "cvae sampling service" in text and "/sample" in text
    console = [entry["message"] for entry in driver.get_log("browser")
               if entry["level"] == "SEVERE"]
    refused = [line for line in console if "Content Security Policy" in line
               and "has been blocked" in line]
    elsewhere = [name for name in resources_loaded(driver) if not name.startswith(url + "/")]
    assert all(any(name in line for line in refused) for name in elsewhere), (elsewhere, console)
    assert [line for line in console if line not in refused] == []
