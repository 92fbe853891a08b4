"""Live demo episodes: one environment session each, stepped on request (asyncio; no Ray).

A step is the rollout workers' step, shown instead of trained on: the policy's prompt in its
agent style (:func:`serve_apps.prompting.styles.make_style`), ``generate`` → parse → ``act``,
then the analyzer's judgment of the transition, built as the rollout worker builds it
(:func:`analyzer_request`), and the executed action as the analyzer pipeline records it
(:func:`workflows.common.episodes.executed_action_json`).

:class:`EpisodeManager` owns the episodes of every viewer: at most ``limit`` hold a session at
once (the environment's capacity; one more is refused with 429 before anything is allocated),
and each session is released when its episode ends, is stopped, its page stops polling
(``page_timeout_s``: the page was closed) or nobody controls it for ``idle_timeout_s``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import random
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal

from env_client.actions import Action, to_pixel
from env_client.client import EnvClient, Session
from env_client.errors import EnvError, EnvUnavailable
from serve_apps.prompting.styles import AgentStyle, Screen
from workflows.common.episodes import analyzer_request, executed_action_json
from workflows.demo.config import DemoSettings

log = logging.getLogger(__name__)
State = Literal["opening", "ready", "running", "paused", "done", "stopped", "failed"]
LIVE_STATES = ("opening", "ready", "running", "paused")


class DemoError(Exception):
    """A request the demo refuses; ``status`` is the HTTP status, the message names why."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Models:
    """Deployment handles: the policy's ``generate``, the analyzer's ``analyze`` (None: off)."""

    policy: Any
    analyzer: Any | None
    analyzer_reference: bool = False  # the analyzer reads the reference prompt (history shots)


def action_point(action: Action, size: tuple[int, int]) -> list[int] | None:
    """The screen pixel an action points at (what the page draws), or None."""
    if action.coordinate is None:
        return None
    return [to_pixel(action.coordinate[0], size[0]), to_pixel(action.coordinate[1], size[1])]


def _b64(png: bytes) -> str:
    return base64.b64encode(png).decode("ascii")


def _judgment(out: dict[str, Any]) -> dict[str, Any]:
    keys = ("consistency", "effectiveness", "guide", "avoid", "d", "v", "status", "reason")
    return {k: out.get(k) for k in keys}


class LiveEpisode:
    """One episode on one session; ``step``/``run``/``pause``/``stop`` from the page."""

    def __init__(
        self,
        task: dict[str, Any],
        typed_instruction: str | None,
        temperature: float | None,
        settings: DemoSettings,
        style: AgentStyle,
        models: Models,
    ) -> None:
        self.id = uuid.uuid4().hex[:12]
        self.task = task
        self.typed_instruction = typed_instruction
        self.temperature = temperature
        self.settings, self.style, self.models = settings, style, models
        self.state: State = "opening"
        self.phase = ""  # what the current step is doing: generating, acting, judging
        self.instruction = ""
        self.screens: list[Screen] = []
        self.history: list[str] = []
        self.responses: list[str] = []
        self.steps: list[dict[str, Any]] = []
        self.score: float | None = None
        self.error: str | None = None
        self.end_reason: str | None = None
        self.weight_version: int | None = None
        self.session: Session | None = None
        self._task: asyncio.Task[None] | None = None
        self._pause_requested = False
        now = time.monotonic()
        self.last_seen = now  # the page's last poll
        self.last_control = now  # the last start/step/run/pause

    # ---- lifecycle ---------------------------------------------------------------------------

    async def open(self, client: EnvClient) -> None:
        """Allocate a session and reset it on the task; the first screen is then viewable."""
        self.session = await client.allocate()
        obs = await self.session.reset(self.task)
        # A typed instruction replaces the task's (its page stays the environment's screen).
        self.instruction = self.typed_instruction or obs.instruction or ""
        self.screens = [Screen(obs.screenshot or b"", obs.accessibility_tree)]
        self.state = "ready"

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    @property
    def busy(self) -> bool:
        return self._task is not None and not self._task.done()

    def step(self) -> None:
        self._control()
        if self.busy:
            raise DemoError("a step is already in progress (pause first to step by hand)", 409)
        self.state = "paused"
        self._task = asyncio.ensure_future(self._guarded(self._one_step()))

    def run(self) -> None:
        self._control()
        if self.busy:
            raise DemoError("the episode is already running", 409)
        self._pause_requested = False
        self.state = "running"
        self._task = asyncio.ensure_future(self._guarded(self._run_loop()))

    def pause(self) -> None:
        self._control()
        self._pause_requested = True  # the run loop stops after the step in flight
        if self.state == "running":
            self.state = "paused"

    def set_temperature(self, temperature: float | None) -> None:
        self._control()
        self.temperature = temperature

    async def stop(self, reason: str, state: State = "stopped") -> None:
        """End the episode now (a step in flight is cancelled) and release its session."""
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self.live:
            self.state = state
            self.end_reason = reason
        self.phase = ""
        await self._release()

    async def _release(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            await asyncio.shield(session.release())  # never raises; shielded from cancel

    def _control(self) -> None:
        if not self.live or self.state == "opening":
            raise DemoError(f"episode {self.id} is {self.state}; start a new one", 409)
        self.last_control = time.monotonic()

    async def _guarded(self, work: Any) -> None:
        """Run a step or the run loop; a failure ends the episode with its message shown."""
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # environment or model failure: shown on the page
            log.warning("demo episode %s failed: %r", self.id, exc)
            self.error = f"{type(exc).__name__}: {exc}"
            await self.stop("error", state="failed")

    async def _run_loop(self) -> None:
        while self.live and not self._pause_requested:
            await self._one_step()
        if self.state == "running":
            self.state = "paused"

    # ---- one step ----------------------------------------------------------------------------

    async def _one_step(self) -> None:
        assert self.session is not None
        shown, gen = await self._generate()
        before = self.screens[-1]
        action = self.style.parse(gen["text"], before)
        self.phase = "acting"
        t0 = time.perf_counter()
        result = await self.session.act(action, pause=self.settings.pause_s)
        t_env = time.perf_counter() - t0
        after = Screen(result.observation.screenshot or b"", result.observation.accessibility_tree)
        executed = executed_action_json(action, result)
        t0 = time.perf_counter()
        judgment = await self._judge(shown, before, after, gen["text"], executed)
        record = {
            "index": len(self.steps),
            "screenshot": _b64(before.png),
            "size": list(before.size),
            "response": gen["text"],
            "action": action.model_dump(exclude_none=True, exclude={"thought"}),
            "point": action_point(action, before.size),
            "executed": json.loads(executed),
            "executed_ok": result.executed,
            "judgment": judgment,
            "weight_version": gen["weight_version"],
            "reward": result.reward,
            "t_generate_s": round(gen["t_s"], 3),
            "t_env_s": round(t_env, 3),
            "t_analyze_s": round(time.perf_counter() - t0, 3),
        }
        self.history.append(self.style.summarize(gen["text"], before))
        self.responses.append(gen["text"])
        self.screens.append(after)
        self.steps.append(record)
        self.phase = ""
        if result.done or action.name == "terminate":
            await self._finish("the environment says the episode is over")
        elif len(self.steps) >= self.settings.max_steps:
            await self._finish(f"step limit ({self.settings.max_steps}) reached")

    async def _generate(self) -> tuple[list[bytes], dict[str, Any]]:
        self.phase = "generating"
        messages, shown = self.style.prompt(self.instruction, self.screens, self.history)
        request: dict[str, Any] = {"messages": messages, "images": shown}
        if self.temperature is not None:
            request["temperature"] = self.temperature
        t0 = time.perf_counter()
        gen = await self.models.policy.generate.remote(request)
        self.weight_version = int(gen["weight_version"])
        return shown, {**gen, "t_s": time.perf_counter() - t0}

    async def _judge(
        self, shown: list[bytes], before: Screen, after: Screen, response: str, executed: str
    ) -> dict[str, Any] | None:
        if self.models.analyzer is None:
            return None
        self.phase = "judging"
        transition = analyzer_request(
            self.style, self.instruction, self.history, self.responses, shown, before, after,
            response, executed, self.models.analyzer_reference,
        )  # fmt: skip
        try:
            out = await self.models.analyzer.analyze.remote(transition)
        except Exception as exc:  # a failed judgment is shown, the episode goes on
            return {"status": "request_error", "reason": str(exc)[:300], "d": 0, "v": 0.5}
        return _judgment(out)

    async def _finish(self, reason: str) -> None:
        assert self.session is not None
        self.score = await self.session.evaluate()
        self.state, self.end_reason, self.phase = "done", reason, ""
        await self._release()

    # ---- what the page sees ------------------------------------------------------------------

    def view(self, since: int = 0) -> dict[str, Any]:
        """The episode for the page: its state and the steps from ``since`` on."""
        screen = self.screens[-1] if self.screens else None
        return {
            "id": self.id,
            "state": self.state,
            "phase": self.phase,
            "task": self.task.get("task"),
            "task_id": self.task.get("id"),
            "instruction": self.instruction,
            "temperature": self.temperature,
            "num_steps": len(self.steps),
            "steps": self.steps[since:],
            "screen": _b64(screen.png) if screen is not None else None,
            "score": self.score,
            "end_reason": self.end_reason,
            "error": self.error,
            "weight_version": self.weight_version,
        }


class EpisodeManager:
    """Every viewer's episodes: the session limit, look-up, and the reaper of abandoned ones."""

    def __init__(
        self,
        client: EnvClient,
        settings: DemoSettings,
        limit: int,
        style: AgentStyle,
        models: Models,
    ) -> None:
        self.client, self.settings, self.limit = client, settings, limit
        self.style, self.models = style, models
        self.episodes: OrderedDict[str, LiveEpisode] = OrderedDict()
        self._reaper: asyncio.Task[None] | None = None

    def live_count(self) -> int:
        return sum(e.live for e in self.episodes.values())

    async def start(
        self, task: dict[str, Any], instruction: str | None, temperature: float | None
    ) -> LiveEpisode:
        """A new episode on a fresh session; 429 when every session is taken."""
        self._ensure_reaper()
        if self.live_count() >= self.limit:
            raise DemoError(
                f"all {self.limit} episode slots are in use (the environment holds {self.limit} "
                "sessions at once); stop an episode or wait for one to end",
                429,
            )
        ep = LiveEpisode(task, instruction, temperature, self.settings, self.style, self.models)
        self.episodes[ep.id] = ep  # counted from now on: no race past the limit
        try:
            await ep.open(self.client)
        except BaseException as exc:
            await ep.stop("start failed", state="failed")
            ep.error = str(exc)
            if isinstance(exc, EnvUnavailable):
                raise DemoError(f"no environment desktop is free: {exc}", 503) from exc
            if isinstance(exc, EnvError):
                raise DemoError(f"the environment refused the episode: {exc}", 502) from exc
            raise
        self._forget_old()
        return ep

    def get(self, episode_id: str) -> LiveEpisode:
        ep = self.episodes.get(episode_id)
        if ep is None:
            raise DemoError(
                f"no episode {episode_id[:40]!r} (ended long ago or never started)", 404
            )
        ep.last_seen = time.monotonic()
        return ep

    def _forget_old(self) -> None:
        ended = [k for k, e in self.episodes.items() if not e.live]
        for key in ended[: max(0, len(ended) - self.settings.keep_finished)]:
            del self.episodes[key]

    def _ensure_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.ensure_future(self._reap_forever())

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.settings.page_timeout_s / 4))
            await self.reap()

    async def reap(self) -> None:
        """Stop the episodes whose page is gone or that nobody controls any more."""
        now = time.monotonic()
        for ep in list(self.episodes.values()):
            if not ep.live or ep.state == "opening":
                continue
            if now - ep.last_seen > self.settings.page_timeout_s:
                await ep.stop(f"the page stopped polling for {self.settings.page_timeout_s:g} s")
            elif now - ep.last_control > self.settings.idle_timeout_s:
                await ep.stop(f"idle for {self.settings.idle_timeout_s:g} s")

    async def close(self) -> None:
        """Stop every episode (sessions released) and the reaper."""
        if self._reaper is not None:
            self._reaper.cancel()
        await asyncio.gather(
            *(e.stop("the demo app shut down") for e in self.episodes.values() if e.live),
            return_exceptions=True,
        )


def draw_seed() -> int:
    """A fresh task instance number when the page gives none."""
    return random.randrange(1_000_000)
