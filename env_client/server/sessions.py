"""Sessions and the browser pool of the embedded server (asyncio side; one event loop).

- A *desktop* is one browser plus its worker thread; at most ``capacity`` exist.
- ``allocate`` binds an idle desktop to a session, or queues the caller (FIFO by session id)
  and starts a desktop in the background while there is room; callers poll (``pending``).
- Operations on a session run one at a time under its lock. Keyed operations are recorded:
  a repeated key waits for / replays the first answer instead of acting twice.
- Sessions without heartbeat for ``heartbeat_timeout_s`` are reclaimed; ended sessions answer
  410 with the reason, unknown ones 404. A released desktop returns to the pool once the
  operation still running on it (if any) has finished. Releasing is idempotent: releasing an
  ended session answers ok, so a retried release after a lost answer is not a failure.
- A waiter that stops polling is forgotten after ``waiter_ttl_s`` (kept well above the
  clients' poll intervals, so polling waiters keep their place).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from env_client.config import EmbeddedEnvConfig
from env_client.server.browser import MiniWoBBrowser
from env_client.server.orphans import kill_orphan_browsers

log = logging.getLogger(__name__)
T = TypeVar("T")
Answer = tuple[int, dict[str, Any]]  # (HTTP status, JSON body)
_ENDED_MEMORY = 4096


class SessionGone(Exception):
    """A session id that is unknown (404) or has ended (410)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def make_backend(cfg: EmbeddedEnvConfig, index: int) -> Any:
    """The configured backend object: a MiniWoB browser or a desktop (same duck type)."""
    if cfg.backend == "desktop":
        from env_client.desktop.backend import DesktopBackend

        return DesktopBackend(cfg.desktop, index)
    return MiniWoBBrowser(cfg, index)


class Desktop:
    """A backend object (browser or desktop) and the one thread allowed to drive it."""

    def __init__(self, browser: Any) -> None:
        self.browser = browser
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"browser-{browser.index}")

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def close(self) -> None:
        await self.run(self.browser.close)
        self._thread.shutdown(wait=False)


@dataclass
class EnvSession:
    session_id: str
    desktop: Desktop
    created: float = field(default_factory=time.monotonic)
    last_heartbeat: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Idempotency-Key -> (operation, body fingerprint, its running or finished answer)
    ops: OrderedDict[str, tuple[str, str, asyncio.Task[Answer]]] = field(
        default_factory=OrderedDict
    )
    task: str | None = None
    seed: Any = None
    instruction: str | None = None
    fields: dict[str, str] = field(default_factory=dict)
    control_done: bool = False  # DONE/FAIL received this episode
    episode_actions: int = 0
    total_actions: int = 0
    busy: bool = False
    ended: str | None = None

    def summary(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "session_id": self.session_id,
            "task": self.task,
            "seed": self.seed,
            "age_s": round(now - self.created, 3),
            "heartbeat_age_s": round(now - self.last_heartbeat, 3),
            "busy": self.busy,
            "episode_actions": self.episode_actions,
            "total_actions": self.total_actions,
        }


class SessionManager:
    """Owns every desktop and session of the server."""

    def __init__(self, cfg: EmbeddedEnvConfig) -> None:
        self.cfg = cfg
        self.sessions: dict[str, EnvSession] = {}
        self.ended: OrderedDict[str, str] = OrderedDict()
        self.idle: list[Desktop] = []
        self.desktops: set[Desktop] = set()
        self.starting = 0
        self.waiters: OrderedDict[str, float] = OrderedDict()
        self.last_start_error: str | None = None
        self._browser_ids = iter(range(1 << 30))
        self._background: set[asyncio.Task[Any]] = set()

    # --- pool --------------------------------------------------------------------------

    @property
    def total(self) -> int:
        return len(self.desktops) + self.starting

    async def prewarm(self) -> None:
        """Start ``cfg.prewarm`` browsers one after the other (they share the CPU)."""
        for _ in range(self.cfg.prewarm):
            self.starting += 1
            await self._start_desktop()
        if self.cfg.prewarm and not self.idle:
            raise RuntimeError(f"no browser could start: {self.last_start_error}")

    async def _start_desktop(self) -> None:
        """Start one browser (``starting`` already counts it) and park it idle."""
        browser = make_backend(self.cfg, next(self._browser_ids))
        desktop = Desktop(browser)
        try:
            await asyncio.wait_for(desktop.run(browser.start), self.cfg.browser_start_timeout_s)
        except Exception as exc:
            self.last_start_error = f"{type(exc).__name__}: {exc}"[:500]
            log.error("browser %d failed to start: %s", browser.index, self.last_start_error)
            self._spawn(desktop.close())
            return
        finally:
            self.starting -= 1
        self.last_start_error = None
        self.desktops.add(desktop)
        self.idle.append(desktop)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _recycle(self, desktop: Desktop, session: EnvSession) -> None:
        """Give a desktop back once the session's running operation (if any) is over."""
        async with session.lock:
            # A desktop backend is never reused: its processes, display and folder go with the
            # session (a fresh one starts in well under a second).
            if desktop.browser.dead or not getattr(desktop.browser, "reusable", True):
                # Forgotten only once closed: a shutdown that cancels this close still finds
                # the desktop in `desktops` and closes it (else its processes would outlive us).
                await desktop.close()
                self.desktops.discard(desktop)
            else:
                self.idle.append(desktop)

    # --- allocation --------------------------------------------------------------------

    def allocate(self, session_id: str | None) -> EnvSession | float:
        """The session, or the seconds after which the caller should ask again."""
        sid = session_id or f"sess-{uuid.uuid4()}"
        if sid in self.sessions:  # a repeated allocate (lost answer): same session
            return self.sessions[sid]
        now = time.monotonic()
        self._prune_waiters(now)
        self.waiters[sid] = now  # an update keeps the caller's place in the queue
        position = list(self.waiters).index(sid)
        if position < len(self.idle):
            del self.waiters[sid]
            return self._bind(sid, self.idle.pop(0))
        wanted = len(self.waiters) - len(self.idle) - self.starting
        if wanted > 0 and self.total < self.cfg.capacity:
            self.starting += 1
            self._spawn(self._start_desktop())
        return self.cfg.allocate_retry_after_s

    def _prune_waiters(self, now: float) -> None:
        stale = [s for s, t in self.waiters.items() if now - t > self.cfg.waiter_ttl_s]
        for s in stale:
            del self.waiters[s]

    def _bind(self, sid: str, desktop: Desktop) -> EnvSession:
        self.ended.pop(sid, None)
        session = EnvSession(session_id=sid, desktop=desktop)
        self.sessions[sid] = session
        log.info("session %s allocated (%d live)", sid, len(self.sessions))
        return session

    def get(self, sid: str) -> EnvSession:
        session = self.sessions.get(sid)
        if session is not None:
            return session
        if sid in self.ended:
            raise SessionGone(410, f"session {sid} has ended: {self.ended[sid]}")
        raise SessionGone(404, f"no session {sid}")

    def release(self, sid: str, reason: str) -> bool:
        """End a session; its desktop returns to the pool when its current operation ends."""
        session = self.sessions.pop(sid, None)
        if session is None:
            return False
        session.ended = reason
        self._remember_ended(sid, reason)
        self._spawn(self._recycle(session.desktop, session))
        log.info("session %s ended: %s (%d live)", sid, reason, len(self.sessions))
        return True

    def _remember_ended(self, sid: str, reason: str) -> None:
        self.ended[sid] = reason
        while len(self.ended) > _ENDED_MEMORY:
            self.ended.popitem(last=False)

    def release_by_client(self, sid: str) -> None:
        """A client's release: idempotent. A live session ends; one that already ended (an
        earlier release whose answer was lost, a reclaim, a crash) or a waiter that gives up
        is fine too; only an id this server never saw raises 404."""
        if self.release(sid, "released by the client"):
            return
        if self.waiters.pop(sid, None) is not None:
            self._remember_ended(sid, "released while waiting")  # a retry answers ok too
            return
        if sid not in self.ended:
            raise SessionGone(404, f"no session {sid}")

    def heartbeat(self, sid: str) -> None:
        self.get(sid).last_heartbeat = time.monotonic()

    async def reap_forever(self) -> None:
        """Reclaim sessions whose heartbeats stopped; once a minute (and at once), kill the
        browsers of servers that died without closing them (``orphans``)."""
        last_sweep = -math.inf
        while True:
            now = time.monotonic()
            if now - last_sweep >= 60.0:
                last_sweep = now
                await asyncio.to_thread(kill_orphan_browsers)
            await asyncio.sleep(self.cfg.reclaim_interval_s)
            now = time.monotonic()
            for s in list(self.sessions.values()):
                silent = now - s.last_heartbeat
                if silent > self.cfg.heartbeat_timeout_s:
                    self.release(s.session_id, f"reclaimed: no heartbeat for {silent:.1f} s")
            self._prune_waiters(now)

    # --- operations --------------------------------------------------------------------

    async def run(
        self,
        session: EnvSession,
        op: str,
        key: str | None,
        fingerprint: str,
        work: Callable[[], Awaitable[Answer]],
    ) -> Answer:
        """Run ``work`` under the session lock; replay or wait for a known Idempotency-Key.

        A key names one request: reusing it for another operation (400) or with another body
        (422) is refused rather than answered with the first request's result."""
        if key is None or not self.cfg.idempotency:
            return await self._locked(session, work)
        known = session.ops.get(key)
        if known is None:
            task = asyncio.ensure_future(self._locked(session, work))
            session.ops[key] = (op, fingerprint, task)
            self._trim_ops(session)
        else:
            known_op, known_print, task = known
            if known_op != op:
                return 400, _error(f"Idempotency-Key {key!r} was used for {known_op}, not {op}")
            if known_print != fingerprint:
                return 422, _error(
                    f"Idempotency-Key {key!r} was used for a {op} with a different body; "
                    "a retry must repeat the same request (use a new key for a new one)"
                )
        done, _ = await asyncio.wait({task}, timeout=self.cfg.long_op_wait_s)
        if not done:  # still running: the client repeats the same request later
            return 200, {
                "ok": True,
                "pending": True,
                "operation_id": key,
                "retry_after_seconds": 1.0,
            }
        return task.result()

    def _trim_ops(self, session: EnvSession) -> None:
        while len(session.ops) > self.cfg.idempotency_cache:
            oldest = next(iter(session.ops))
            if not session.ops[oldest][2].done():
                break
            session.ops.popitem(last=False)

    async def _locked(self, session: EnvSession, work: Callable[[], Awaitable[Answer]]) -> Answer:
        async with session.lock:
            if session.ended:
                return 410, _error(f"session {session.session_id} has ended: {session.ended}")
            session.busy = True
            try:
                return await work()
            finally:
                session.busy = False

    def lose(self, sid: str, reason: str) -> None:
        """The desktop of a session is gone (injected fault or crash)."""
        self.release(sid, f"lost: {reason}")

    # --- shutdown ----------------------------------------------------------------------

    async def close(self) -> None:
        for sid in list(self.sessions):
            self.release(sid, "server shutting down")
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        desktops, self.desktops, self.idle = list(self.desktops), set(), []
        await asyncio.gather(*(d.close() for d in desktops), return_exceptions=True)

    def status(self) -> dict[str, Any]:
        return {
            "count": len(self.sessions),
            "sessions": [s.summary() for s in self.sessions.values()],
            "capacity": self.cfg.capacity,
            "browsers": {
                "idle": len(self.idle),
                "bound": len(self.desktops) - len(self.idle),
                "starting": self.starting,
            },
            "waiting": len(self.waiters),
            "last_start_error": self.last_start_error,
        }


def _error(message: str) -> dict[str, Any]:
    return {"ok": False, "error": message}
