"""The playground page in a real browser (headless Chromium driven by selenium).

It needs Debian's `chromium` and `chromium-driver` (`apt-get install chromium chromium-driver`;
`.ci/run` installs them where it can). Without them the test is skipped, saying so.
Set PLAYGROUND_SCREENSHOT=path to keep a screenshot of the page after the exchange.
"""
from __future__ import annotations

import os
import shutil

import httpx
import pytest

from tests.conftest import LoopProcess, make_config

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
DRIVER = shutil.which("chromedriver")
KEY = "playground-test-key"

pytestmark = pytest.mark.skipif(not (CHROMIUM and DRIVER),
                                reason="needs a browser: apt-get install chromium chromium-driver (.ci/run does)")


@pytest.fixture(scope="module")
def gateway(tiny_model, tmp_path_factory):
    cfg = make_config(tmp_path_factory.mktemp("playground"))
    engine = LoopProcess(cfg, "serve")
    gw = LoopProcess(cfg, "gateway", env={"CLAWR1_API_KEY": KEY})
    try:
        engine.wait_http(f"{cfg.engine_url}/health")
        gw.wait_http(f"{cfg.gateway_url}/health")
        yield cfg.gateway_url
    finally:
        gw.stop()
        engine.stop()


@pytest.fixture
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1200,800"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def test_chat_stream_and_feedback_in_a_real_browser(gateway, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{gateway}/playground")  # no key: the same auth as the API
    assert "missing or wrong API key" in browser.page_source

    streams_before = metric(gateway, 'clawr1_gateway_request_seconds_count{stream="true"}')
    browser.get(f"{gateway}/playground?key={KEY}")
    wait = WebDriverWait(browser, 60)
    browser.find_element(By.ID, "prompt").send_keys("What is 2 km plus 3 km?")
    browser.find_element(By.ID, "send").click()
    badge = wait.until(ready.visibility_of_element_located((By.CSS_SELECTOR, ".msg.assistant .version")))
    assert badge.text.startswith("weights clawr1-v")  # the weight version that produced the reply
    reply = browser.find_element(By.CSS_SELECTOR, ".msg.assistant .text").text
    assert reply.strip()
    assert metric(gateway, 'clawr1_gateway_request_seconds_count{stream="true"}') == streams_before + 1

    browser.find_element(By.CSS_SELECTOR, ".correction").send_keys("Please put the answer in <ans> tags.")
    browser.find_element(By.CSS_SELECTOR, ".thumbs-down").click()
    sent = wait.until(ready.text_to_be_present_in_element((By.CSS_SELECTOR, ".sent"), "feedback sent"))
    assert sent
    status = httpx.get(f"{gateway}/v1/status", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert status["feedback"] == 1 and metric(gateway, "clawr1_gateway_feedback_total") == 1
    wait.until(lambda d: d.find_element(By.ID, "feedback").text == "1")  # the side panel shows it too
    if os.environ.get("PLAYGROUND_SCREENSHOT"):
        browser.save_screenshot(os.environ["PLAYGROUND_SCREENSHOT"])
