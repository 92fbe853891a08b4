"""The desktop backend object: one desktop per session, shaped like ``MiniWoBBrowser``.

The session manager drives it from one worker thread, exactly as it drives a browser::

    backend = DesktopBackend(cfg, index)   # cfg: DesktopConfig
    backend.start()                        # local: Xvfb + WM + in-desktop server; remote: check
    instruction, fields = backend.reset(task_payload, seed)   # revert + setup steps
    info = backend.perform(ops)            # whitelisted operations → /execute
    raw = backend.observe()                # RawObservation(png, nodes, meta)
    backend.note_control("DONE")           # the agent's control answer (FAIL matters)
    backend.state()                        # {"done": True, "raw_reward": score}: the evaluator
    backend.close()                        # every process and the session folder gone

Local desktops and remote OSWorld machines differ only in ``start``/``revert``/``close``; every
operation, observation, setup step and getter goes through :class:`VMClient`.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from env_client.a11y import parse_tree
from env_client.desktop.config import DesktopConfig
from env_client.desktop.evaluate import Evaluation, evaluate
from env_client.desktop.local import LocalDesktop
from env_client.desktop.program import DesktopOp, render_program
from env_client.desktop.setup import Context, run_steps
from env_client.desktop.tasks import check_task
from env_client.desktop.vmclient import DesktopApiError, VMClient
from env_client.server.browser import RawObservation

log = logging.getLogger(__name__)
BUILTIN_ROOT = Path(__file__).resolve().parents[1] / "tasks" / "desktop"


class StepResult:
    """What happened to one step's operations (``as_dict`` goes into the step's info)."""

    def __init__(self, answer: dict[str, Any], sent: int) -> None:
        try:
            self.info = json.loads(answer.get("output") or "")
        except ValueError:  # an OSWorld machine prints nothing: everything was applied
            self.info = None
        if not isinstance(self.info, dict):
            self.info = {"applied": sent}
        self.applied = int(self.info.get("applied", sent))

    def as_dict(self) -> dict[str, Any]:
        return dict(self.info)


class _UrlPool:
    """Which remote machines are in use: one session per machine (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._taken: set[str] = set()

    def take(self, urls: list[str]) -> str:
        with self._lock:
            for url in urls:
                if url not in self._taken:
                    self._taken.add(url)
                    return url
        raise DesktopApiError("/", 0, f"all {len(urls)} remote desktops are in use")

    def give_back(self, url: str) -> None:
        with self._lock:
            self._taken.discard(url)


REMOTE_POOL = _UrlPool()


class DesktopBackend:
    """One desktop: local (``cfg.kind == "local"``) or an OSWorld machine (``"remote"``).

    Not reusable: the session manager closes it on release (its processes, display and
    folder go), and starts a fresh one for the next session (well under a second)."""

    reusable = False

    def __init__(self, cfg: DesktopConfig, index: int) -> None:
        self.cfg = cfg
        self.index = index
        self.dead = False
        self.local: LocalDesktop | None = None
        self.client: VMClient | None = None
        self.task: dict[str, Any] | None = None
        self.last_control: str | None = None
        self.evaluation: Evaluation | None = None
        self.cache_dir = Path(tempfile.mkdtemp(prefix=f"csd-eval-{index}-"))
        roots = [BUILTIN_ROOT, *(Path(r).expanduser() for r in cfg.task_files_roots)]
        self.files_roots = roots
        self.remote_url: str | None = None

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        t0 = time.monotonic()
        if self.cfg.kind == "local":
            self.local = LocalDesktop(self.cfg, self.index)
            self.local.start()
            assert self.local.url is not None
            self.client = VMClient(self.local.url, self.cfg.request_timeout_s, self.local.token)
        else:
            self.remote_url = REMOTE_POOL.take(self.cfg.remote_urls)
            self.client = VMClient(self.remote_url, self.cfg.request_timeout_s)
        self.client.screen_size()  # reachable and answering
        log.info("desktop %d started in %.1f s", self.index, time.monotonic() - t0)

    def alive(self) -> bool:
        if self.dead or self.client is None:
            return False
        if self.local is not None and not self.local.alive():
            return False
        try:
            self.client.screen_size()
            return True
        except DesktopApiError:
            return False

    def kill(self) -> None:
        """Make the desktop die under its session (fault injection): kill its X server."""
        if self.local is not None and self.local.xvfb is not None:
            self.local.xvfb.kill()

    def close(self) -> None:
        self.dead = True
        if self.local is not None:
            self.local.close()
        if self.remote_url is not None:
            REMOTE_POOL.give_back(self.remote_url)
            self.remote_url = None
        shutil.rmtree(self.cache_dir, ignore_errors=True)

    def _ctx(self) -> Context:
        assert self.client is not None
        return Context(self.client, self.files_roots, self.cache_dir, self.cfg.window_wait_s)

    # --- episode -----------------------------------------------------------------------

    def reset(self, task: Any, seed: Any = None) -> tuple[str, dict[str, str]]:
        """Fresh state, then the task's setup steps; (instruction, {}) like the browser.
        TaskFileError for a bad payload, SetupError for a step that fails."""
        checked = check_task(task)
        self.task, self.last_control, self.evaluation = None, None, None
        if self.local is not None:
            self.local.begin_episode()
        shutil.rmtree(self.cache_dir, ignore_errors=True)
        self.cache_dir.mkdir(parents=True)
        run_steps(self._ctx(), checked.get("config", []))
        self.task = checked
        return str(checked["instruction"]), {}

    def perform(self, ops: list[DesktopOp]) -> StepResult:
        assert self.client is not None
        self.evaluation = None
        if self.local is not None:
            self.local.used = True  # the next reset reverts, even without an episode before
        if not ops:
            return StepResult({}, 0)
        answer = self.client.perform(render_program(ops))
        if self.cfg.settle_s:
            time.sleep(self.cfg.settle_s)  # let the apps repaint before the screenshot
        return StepResult(answer, len(ops))

    def note_control(self, control: str) -> None:
        """The agent's DONE/FAIL/WAIT (OSWorld scores infeasible tasks by a final FAIL)."""
        if control in ("DONE", "FAIL"):
            self.last_control = control

    def observe(self) -> RawObservation:
        assert self.client is not None
        png = self.client.screenshot()
        tree = self.client.accessibility() if self.cfg.accessibility else None
        nodes = [_node_dict(n) for n in parse_tree(tree)]
        screen = [self.cfg.screen_width, self.cfg.screen_height]
        meta = {"done": False, "accessibility_tree": tree, "screen": screen}
        return RawObservation(png=png, nodes=nodes, meta=meta)

    def state(self) -> dict[str, Any]:
        """The episode's score by the task's evaluator (run once per episode state)."""
        if self.task is None:
            return {"done": False, "raw_reward": 0.0, "reason": "no task"}
        if self.evaluation is None:
            self.evaluation = evaluate(self._ctx(), self.task, self.last_control)
        ev = self.evaluation
        return {"done": True, "raw_reward": ev.score, "reason": "; ".join(ev.notes)}

    def ground_truth(self) -> dict[str, Any]:
        raw = self.observe()
        return {
            "elements": raw.nodes,
            "utterance": self.task["instruction"] if self.task else None,
            "meta": {"done": False, "task": self.task["id"] if self.task else None},
        }


def _node_dict(node: Any) -> dict[str, Any]:
    out = {"role": node.role, "name": node.name, "box": list(node.box), "focused": node.focused}
    if node.value is not None:
        out["value"] = node.value
    if node.checked is not None:
        out["checked"] = node.checked
    if node.disabled:
        out["disabled"] = True
    return out
