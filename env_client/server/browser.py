"""One headless Chromium showing MiniWoB++ task pages, driven through Selenium.

Blocking code: the server calls every method from the browser's own worker thread (Selenium
drivers are not thread-safe). Screen pixels (the screenshot's size) map linearly onto the
160×210 MiniWoB task area; pointer actions outside the screen have no effect (Selenium would
raise on them) and are counted in the step's info.
"""

from __future__ import annotations

import base64
import io
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from env_client.commands import KeysOp, Op, PointerOp, ScrollOp, SleepOp, StepInfo, TypeOp
from env_client.config import EmbeddedEnvConfig
from env_client.server.dom_js import A11Y_JS, DEBUG_JS, NO_COVER_JS, PAGE_READY_JS
from env_client.server.orphans import browser_env

log = logging.getLogger(__name__)

TASK_W, TASK_H = 160, 210  # MiniWoB's task area, CSS pixels
_TASK_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
CHROME_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-extensions",
    "--mute-audio",
    "--hide-scrollbars",
    "--force-device-scale-factor=1",
    # The network service and the (disabled) GPU process inside the browser process: two
    # processes fewer per browser, 880 vs 951 MB PSS for 4 browsers on a MiniWoB page.
    "--enable-features=NetworkServiceInProcess2",
    "--in-process-gpu",
    # The viewport must hold the 160x210 task area; new headless takes ~140 px of the window.
    "--window-size=600,500",
)


class TaskError(ValueError):
    """A task payload the embedded environment cannot run."""


def task_page(task: str) -> Path:
    """The HTML file of a MiniWoB task shipped by the ``miniwob`` package."""
    import miniwob

    if not isinstance(task, str) or not _TASK_NAME.match(task):
        raise TaskError(f"task {task!r} is not a MiniWoB task name")
    path = Path(miniwob.__file__).parent / "html" / "miniwob" / f"{task}.html"
    if not path.is_file():
        raise TaskError(f"MiniWoB has no task {task!r}")
    return path


def field_dict(task: str, utterance: str) -> dict[str, str]:
    """MiniWoB's own field extraction (e.g. {'target': 'OK'}); {} where it has none."""
    from miniwob.fields import get_field_extractor

    try:
        return {str(k): str(v) for k, v in get_field_extractor(task)(utterance)}
    except Exception:  # tasks without an extractor, or utterances it does not match
        return {}


@dataclass
class RawObservation:
    png: bytes
    nodes: list[dict[str, Any]]
    meta: dict[str, Any]


class MiniWoBBrowser:
    """A Chromium + chromedriver pair; one MiniWoB page at a time."""

    def __init__(self, cfg: EmbeddedEnvConfig, index: int) -> None:
        self.cfg = cfg
        self.index = index
        self.driver: Any = None
        self.task: str | None = None
        self.resets_since_load = 0
        self.pointer = (0.0, 0.0)  # page CSS px
        self.dead = False
        sw, sh = cfg.screen_width, cfg.screen_height
        self.sx, self.sy = sw / TASK_W, sh / TASK_H
        # One capture scale gives the exact screen size when the aspect ratio matches.
        self.uniform = round(TASK_W * self.sy) == sw and round(TASK_H * self.sx) == sh

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        t0 = time.monotonic()
        options = webdriver.ChromeOptions()
        for flag in CHROME_FLAGS:
            options.add_argument(flag)
        options.binary_location = self.cfg.chrome_binary
        # Owner recorded: a server killed before it can quit this browser has it swept later.
        service = Service(executable_path=self.cfg.chromedriver, env=browser_env())
        self.driver = webdriver.Chrome(service=service, options=options)
        self.driver.set_page_load_timeout(self.cfg.browser_start_timeout_s)
        self.driver.set_script_timeout(30)
        log.info("browser %d started in %.1f s", self.index, time.monotonic() - t0)

    def alive(self) -> bool:
        """Whether the browser still answers (a crashed one raises or hangs up)."""
        if self.driver is None or self.dead:
            return False
        try:
            return bool(self.driver.execute_script("return 1;"))
        except Exception:
            return False

    def kill(self) -> None:
        """Make the browser die under the session (fault injection): quit chromedriver and
        Chromium but keep the handle, as a crash would."""
        if self.driver is not None:
            self.driver.quit()

    def close(self) -> None:
        self.dead = True
        if self.driver is not None:
            try:
                self.driver.quit()
            except Exception as exc:  # already gone: nothing left to clean
                log.warning("browser %d quit: %s", self.index, exc)
            self.driver = None

    # --- episode -----------------------------------------------------------------------

    def reset(self, task: str, seed: Any) -> tuple[str, dict[str, str]]:
        """Start a fresh episode of ``task`` with ``seed``; returns (utterance, fields)."""
        page = task_page(task)
        if task != self.task or self.resets_since_load >= self.cfg.reload_every:
            self._load(page, task)
        self.resets_since_load += 1
        ms = self.cfg.episode_time_limit_s * 1000
        self.driver.execute_script(
            "core.endEpisode(0); Math.seedrandom(arguments[0]); core.setDataMode('train');"
            "core.EPISODE_MAX_TIME = arguments[1]; core.startEpisodeReal();"
            "if (core.cover_div) core.cover_div.style.display = 'none';",
            seed,
            ms,
        )
        self._wait(lambda: self.driver.execute_script("return WOB_TASK_READY;"), 5.0, "task ready")
        self.pointer = (0.0, 0.0)
        utterance = self.driver.execute_script("return core.getUtterance();")
        if isinstance(utterance, dict):  # a few tasks return {utterance, fields}
            fields = {str(k): str(v) for k, v in (utterance.get("fields") or {}).items()}
            return str(utterance.get("utterance", "")), fields
        utterance = str(utterance)
        return utterance, field_dict(task, utterance)

    def _load(self, page: Path, task: str) -> None:
        self.driver.get(page.as_uri())
        self._wait(lambda: self.driver.execute_script(PAGE_READY_JS), 10.0, f"{task} page load")
        self.driver.execute_script(NO_COVER_JS)
        self.task = task
        self.resets_since_load = 0

    @staticmethod
    def _wait(check: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}")
            time.sleep(0.02)

    def state(self) -> dict[str, Any]:
        """MiniWoB's episode state: done, raw_reward, reason."""
        return dict(
            self.driver.execute_script(
                "return {done: !!WOB_DONE_GLOBAL, raw_reward: WOB_RAW_REWARD_GLOBAL,"
                " reason: WOB_REWARD_REASON == null ? null : String(WOB_REWARD_REASON)};"
            )
        )

    # --- actions -----------------------------------------------------------------------

    def perform(self, ops: list[Op]) -> StepInfo:
        """Apply operations in order; stop acting once the episode has ended."""
        info = StepInfo()
        for i, op in enumerate(ops):
            if self.state()["done"]:
                info.ignored_after_done = len(ops) - i
                break
            self._apply(op, info)
        return info

    def _apply(self, op: Op, info: StepInfo) -> None:
        """Apply one operation; ``info.applied`` counts those that reached the page."""
        if isinstance(op, SleepOp):
            time.sleep(op.seconds)
            done = True
        elif isinstance(op, TypeOp):
            done = self._type(op.text)
        elif isinstance(op, KeysOp):
            done = self._keys(op, info)
        elif isinstance(op, PointerOp):
            done = self._pointer(op, info)
        elif isinstance(op, ScrollOp):
            done = self._scroll(op, info)
        else:  # pragma: no cover - the parser produces only the types above
            raise TypeError(f"unknown operation {op!r}")
        info.applied += int(done)

    def _page_xy(self, x: float | None, y: float | None) -> tuple[float, float] | None:
        """Screen pixels → page CSS pixels; None when outside the screen."""
        if x is None or y is None:
            return self.pointer
        if not (0 <= x < self.cfg.screen_width and 0 <= y < self.cfg.screen_height):
            return None
        return (x + 0.5) / self.sx, (y + 0.5) / self.sy

    def _chain(self) -> Any:
        from selenium.webdriver.common.action_chains import ActionChains

        return ActionChains(self.driver, duration=0)

    def _pointer(self, op: PointerOp, info: StepInfo) -> bool:
        from selenium.webdriver.common.actions.mouse_button import MouseButton

        target = self._page_xy(op.x, op.y)
        if target is None:
            info.out_of_bounds += 1
            return False
        button = {"left": MouseButton.LEFT, "middle": MouseButton.MIDDLE}.get(
            op.button, MouseButton.RIGHT
        )
        chain = self._chain()
        pointer = chain.w3c_actions.pointer_action
        if op.kind == "drag":
            pointer.move_to_location(int(self.pointer[0]), int(self.pointer[1]))
            pointer.pointer_down(button=button)
        pointer.move_to_location(int(target[0]), int(target[1]))
        if op.kind == "drag":
            pointer.pointer_up(button=button)
        elif op.kind == "click":
            for _ in range(op.clicks):
                pointer.click(button=button)
        chain.w3c_actions.perform()
        self.pointer = target
        return True

    def _type(self, text: str) -> bool:
        from selenium.webdriver.common.keys import Keys

        chain = self._chain()
        keys = chain.w3c_actions.key_action
        for ch in text:
            key = {"\n": Keys.ENTER, "\r": Keys.ENTER, "\t": Keys.TAB}.get(ch, ch)
            keys.key_down(key)
            keys.key_up(key)
        chain.perform()
        return True

    def _keys(self, op: KeysOp, info: StepInfo) -> bool:
        mapped = [selenium_key(k) for k in op.keys]
        unsupported = [k for k, m in zip(op.keys, mapped, strict=True) if m is None]
        if unsupported:  # valid pyautogui keys a browser has no use for (volumeup, …)
            info.unsupported_keys.extend(unsupported)
            return False
        chain = self._chain()
        keys = chain.w3c_actions.key_action
        for _ in range(op.presses):
            for m in mapped:
                keys.key_down(m)
            for m in reversed(mapped):
                keys.key_up(m)
        chain.perform()
        return True

    def _scroll(self, op: ScrollOp, info: StepInfo) -> bool:
        from selenium.webdriver.common.action_chains import ActionChains

        at = self._page_xy(op.x, op.y)
        if at is None:
            info.out_of_bounds += 1
            return False
        delta = op.clicks * self.cfg.scroll_px_per_click
        dx, dy = (delta, 0) if op.horizontal else (0, -delta)  # pyautogui: + scrolls up
        chain = ActionChains(self.driver)
        chain.w3c_actions.wheel_action.scroll(
            x=int(at[0]), y=int(at[1]), delta_x=int(dx), delta_y=int(dy), duration=0
        )
        chain.w3c_actions.perform()
        return True

    # --- observation -------------------------------------------------------------------

    def observe(self) -> RawObservation:
        """Screenshot (PNG at screen size) + accessibility nodes (screen px) + episode state."""
        found = self.driver.execute_script(A11Y_JS, TASK_W, TASK_H)
        nodes = [self._scaled(n) for n in found["nodes"]]
        return RawObservation(png=self._screenshot(), nodes=nodes, meta=found["meta"])

    def _screenshot(self) -> bytes:
        scale = self.sx if self.uniform else 1.0
        shot = self.driver.execute_cdp_cmd(
            "Page.captureScreenshot",
            {
                "format": "png",
                "clip": {"x": 0, "y": 0, "width": TASK_W, "height": TASK_H, "scale": scale},
            },
        )
        png = base64.b64decode(shot["data"])
        if self.uniform:
            return png
        from PIL import Image

        img = Image.open(io.BytesIO(png)).convert("RGB")
        img = img.resize((self.cfg.screen_width, self.cfg.screen_height), Image.Resampling.BILINEAR)
        buf = io.BytesIO()
        img.save(buf, format="PNG")
        return buf.getvalue()

    def _scaled(self, node: dict[str, Any]) -> dict[str, Any]:
        x, y, w, h = node["box"]
        node["box"] = [
            round(x * self.sx),
            round(y * self.sy),
            max(1, round(w * self.sx)),
            max(1, round(h * self.sy)),
        ]
        if node.get("hit") is not None:
            hx, hy = node["hit"]
            node["hit"] = [
                min(int(hx * self.sx), self.cfg.screen_width - 1),
                min(int(hy * self.sy), self.cfg.screen_height - 1),
            ]
        return node

    def ground_truth(self) -> dict[str, Any]:
        """Every shown element of the task area (screen px) plus utterance and state."""
        found = self.driver.execute_script(DEBUG_JS, TASK_W, TASK_H)
        found["elements"] = [self._scaled(e) for e in found["elements"]]
        return dict(found)


def selenium_key(name: str) -> str | None:
    """A pyautogui key name → the WebDriver key; None if a browser has no such key."""
    from selenium.webdriver.common.keys import Keys

    if len(name) == 1:
        return name
    if name.startswith("f") and name[1:].isdigit() and 1 <= int(name[1:]) <= 12:
        return str(getattr(Keys, name.upper()))
    table = {
        "enter": Keys.ENTER,
        "return": Keys.ENTER,
        "tab": Keys.TAB,
        "backspace": Keys.BACKSPACE,
        "delete": Keys.DELETE,
        "del": Keys.DELETE,
        "esc": Keys.ESCAPE,
        "escape": Keys.ESCAPE,
        "space": Keys.SPACE,
        "up": Keys.ARROW_UP,
        "down": Keys.ARROW_DOWN,
        "left": Keys.ARROW_LEFT,
        "right": Keys.ARROW_RIGHT,
        "home": Keys.HOME,
        "end": Keys.END,
        "pageup": Keys.PAGE_UP,
        "pgup": Keys.PAGE_UP,
        "pagedown": Keys.PAGE_DOWN,
        "pgdn": Keys.PAGE_DOWN,
        "insert": Keys.INSERT,
        "shift": Keys.SHIFT,
        "shiftleft": Keys.SHIFT,
        "shiftright": Keys.SHIFT,
        "ctrl": Keys.CONTROL,
        "ctrlleft": Keys.CONTROL,
        "ctrlright": Keys.CONTROL,
        "alt": Keys.ALT,
        "altleft": Keys.ALT,
        "altright": Keys.ALT,
        "option": Keys.ALT,
        "win": Keys.META,
        "winleft": Keys.META,
        "winright": Keys.META,
        "command": Keys.META,
        "clear": Keys.CLEAR,
        "help": Keys.HELP,
        "pause": Keys.PAUSE,
    }
    key = table.get(name)
    return str(key) if key is not None else None
