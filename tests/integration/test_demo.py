"""The demo app end to end on real parts: Ray Serve (demo ingress composed with the policy and
analyzer apps), the embedded MiniWoB++ server it starts, and its page driven in real
headless Chromium (selenium + the Debian chromium/chromedriver the environment uses).

Checked: an episode started from the page plays live (steps appear with their screenshots,
action overlay and judgments), a second episode past the environment's capacity is refused
with 429 and allocates nothing, stop / page close / a page that stops polling each release the
session (the env server's own count goes back to 0), and the trajectory viewer shows a run's
step with its screenshot, or names a missing run.

Random tiny models by default (fast; the actions are mostly invalid). ``UPDATE_DOCS=1`` also
writes the page screenshots to docs/demo.png and docs/viewer.png (the README's), and
``DEMO_TEST_MODELS=warm`` plays the cached warm start instead (meaningful clicks).
"""

from __future__ import annotations

import base64
import json
import os
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit._demo_helpers import call, free_port, write_run
from workflows.demo.config import DemoConfig, load_demo_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

DOCS = Path(__file__).resolve().parents[2] / "docs"
TINY = [
    "policy.model_path=tiny:0",
    "policy.agent_style=toolcall",
    "policy.sampling.max_new_tokens=48",
    "analyzer.model_path=tiny:1",
    "analyzer.sampling.max_new_tokens=64",
    "demo.history_screens=2",
]
APP = "demo-test"
# Three steps for an expert; the policies here do not finish it in two, so it is still
# running when the test stops it.
TASK = "enter-text"


def _models() -> list[str]:
    return [] if os.environ.get("DEMO_TEST_MODELS") == "warm" else TINY


def _shot_path(name: str, tmp: Path) -> Path:
    return DOCS / name if os.environ.get("UPDATE_DOCS") == "1" else tmp / name


def _wait(pred: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.5)


def _env_live(env_url: str) -> int:
    with urllib.request.urlopen(f"{env_url}/healthz", timeout=10) as r:
        return int(json.loads(r.read())["live"])


@pytest.fixture(scope="module")
def demo(ray_cluster: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    from ray import serve
    from ray.serve.context import _get_global_client

    from workflows.demo.app import delete_demo, deploy_demo

    runs = tmp_path_factory.mktemp("runs")
    cfg: DemoConfig = load_demo_config(
        "embedded",
        [
            *_models(),
            "env.embedded.capacity=1",
            "env.embedded.prewarm=1",
            f"demo.name={APP}",
            f"demo.route_prefix=/{APP}",
            "demo.max_steps=40",
            "demo.page_timeout_s=4",
            f"demo.runs_dir={runs}",
        ],
    )
    serve.start(http_options={"host": "127.0.0.1", "port": free_port()})
    port = _get_global_client().http_config.port  # an earlier test's Serve keeps its port
    cfg = deploy_demo(cfg)
    url = f"http://127.0.0.1:{port}/{APP}/"
    status, body = call("GET", url + "api/status")
    assert status == 200, body
    try:
        yield {"url": url, "env_url": body["env_url"], "runs": runs}
    finally:
        delete_demo(cfg)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1280,1000", "--force-device-scale-factor=1"):  # fmt: skip
        options.add_argument(flag)
    options.binary_location = os.environ.get("MINIWOB_CHROME_BINARY", "/usr/bin/chromium")
    service = Service(os.environ.get("MINIWOB_CHROMEDRIVER", "/usr/bin/chromedriver"))
    driver = webdriver.Chrome(service=service, options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _js(driver: Any, script: str) -> Any:
    return driver.execute_script(script)


def _step_cards(driver: Any) -> list[dict]:
    """The step cards on the page: screenshot loaded, judgment shown, action drawn."""
    return _js(
        driver,
        """return [...document.querySelectorAll('#steps .step')].map(c => ({
            shot: c.querySelector('img.shot').naturalWidth,
            judged: !!c.querySelector('.judgment'),
            overlay: !!c.querySelector('svg'),
            response: c.querySelector('.response').textContent}));""",
    )


def test_page_plays_an_episode_live_and_releases_its_session(
    demo: dict, browser: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    url, env_url = demo["url"], demo["env_url"]
    browser.get(url)
    _wait(
        lambda: _js(browser, "return document.getElementById('task').options.length"), 60, "tasks"
    )
    Select(browser.find_element(By.ID, "task")).select_by_visible_text(TASK)
    browser.find_element(By.ID, "start").click()
    status = browser.find_element(By.ID, "status")
    _wait(lambda: "ready" in status.text, 90, "the episode to open")
    assert _env_live(env_url) == 1
    # One episode more than the environment holds: refused, nothing allocated.
    code, body = call("POST", url + "api/episodes", {"task": "click-test"})
    assert code == 429 and "episode slots are in use" in body["error"], body
    assert _env_live(env_url) == 1

    browser.find_element(By.ID, "run").click()
    _wait(lambda: len(_step_cards(browser)) >= 2, 120, "two steps on the page")
    cards = _step_cards(browser)
    assert all(c["shot"] == 160 and c["judged"] and c["overlay"] for c in cards), cards
    assert "weight version 0" in status.text
    if "running" in status.text:  # the warm start may have finished the task by now
        browser.find_element(By.ID, "stop").click()
        _wait(lambda: " stopped " in status.text or " done " in status.text, 60, "the stop")
    _wait(lambda: _js(browser, "return document.getElementById('steps').children.length") >= 2,
          10, "the steps to stay on the page")  # fmt: skip
    browser.save_screenshot(str(_shot_path("demo.png", tmp_path)))
    _wait(lambda: _env_live(env_url) == 0, 20, "the session to be released")
    code, body = call("GET", url + "api/status")
    assert body["live"] == 0


def test_closing_the_page_or_going_silent_releases_the_session(demo: dict, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    url, env_url = demo["url"], demo["env_url"]
    browser.get(url)
    _wait(
        lambda: _js(browser, "return document.getElementById('task').options.length"), 60, "tasks"
    )
    browser.find_element(By.ID, "start").click()
    _wait(lambda: _env_live(env_url) == 1, 90, "an episode from the page")
    browser.get("about:blank")  # page closed: its beacon stops the episode
    _wait(lambda: _env_live(env_url) == 0, 20, "release on page close")

    # A client that starts an episode and never polls again: reaped after page_timeout_s.
    typed = "Click the button named Submit."  # a typed instruction replaces the task's
    body = {"task": "click-test", "seed": 3, "instruction": typed}
    code, episode = call("POST", url + "api/episodes", body)
    assert code == 201 and episode["instruction"] == typed, episode
    assert _env_live(env_url) == 1
    _wait(lambda: _env_live(env_url) == 0, 30, "release after the page timeout")
    code, seen = call("GET", url + f"api/episodes/{episode['id']}")
    assert seen["state"] == "stopped" and "stopped polling" in seen["end_reason"]


def test_viewer_shows_a_run_step_with_its_screenshot(
    demo: dict, browser: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    url = demo["url"]
    # A real screen of the environment, as the job's step samples hold them.
    code, episode = call("POST", url + "api/episodes", {"task": "click-test", "seed": 5})
    assert code == 201, episode
    call("POST", url + f"api/episodes/{episode['id']}/stop")
    screen = base64.b64decode(episode["screen"])
    write_run(demo["runs"], "embedded-run", screenshots=[screen])

    browser.get(url + "#viewer?run=embedded-run")
    detail = browser.find_element(By.ID, "vdetail")
    _wait(lambda: _js(browser, "return document.querySelectorAll('#vsteps tr').length") == 4,
          30, "the run's steps")  # fmt: skip
    Select(browser.find_element(By.ID, "only-sel")).select_by_value("gate")
    _wait(lambda: _js(browser, "return document.querySelectorAll('#vsteps tr').length") == 1,
          30, "the gate filter")  # fmt: skip
    shot = "return (document.querySelector('#vdetail .shotbox img') || {}).naturalWidth || 0"
    assert _wait(lambda: _js(browser, shot), 30, "the step's screenshot") == 160
    assert "g000000-e1-s0" in detail.text and "gate fired" in detail.text
    assert "0.75 over 2 tokens" in detail.text and "click 1" in detail.text
    browser.save_screenshot(str(_shot_path("viewer.png", tmp_path)))

    browser.get(url + "#viewer?run=no-such-run")
    message = browser.find_element(By.ID, "vmessage")
    _wait(lambda: "no run folder 'no-such-run'" in message.text, 30, "the missing-run message")
