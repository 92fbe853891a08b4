"""Async client of the environment session protocol (../shared/ENV_PROTOCOL.md).

    async with EnvClient(EnvClientConfig(server_url=url)) as client:
        async with client.session() as s:          # allocate (polls while pending) … release
            obs = await s.reset(task_payload)        # Observation (PNG, a11y tree, instruction)
            res = await s.step(action_dict, pause=0.5)
            score = await s.evaluate()

One :class:`EnvClient` per event loop: it owns the loop's connection pool (aiohttp), which all
its sessions share. A session heartbeats in its own task (independent of slow steps) and is
released whenever its ``async with`` block ends: normally, on error, or on cancellation.

Reliability (the protocol's rules): when the server advertises ``operation_idempotency >= 1``
every data-plane call carries an ``Idempotency-Key`` that its retries reuse; otherwise only
observe (and heartbeat) are retried, never a step. 502/503/504 and transport errors/timeouts
are retried with exponential backoff (jittered) up to ``max_tries`` and the recovery deadline;
other answers ≥ 400 raise :class:`EnvError` at once (404/410 as :class:`SessionLost`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import aiohttp

from env_client.actions import Action, to_protocol
from env_client.config import EnvClientConfig
from env_client.errors import EnvError, EnvUnavailable, ProtocolError, SessionLost
from env_client.observation import Observation, StepResult, decode_observation

if TYPE_CHECKING:
    from env_client.server.launcher import EmbeddedServer

log = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({502, 503, 504})
HEARTBEAT_HEADER = {"X-Cluster-Heartbeat-Mode": "independent-v1"}


class _Transient(Exception):
    """One failed attempt that may be retried (5xx gateway answers, transport, timeouts)."""


class EnvClient:
    """Connection pool + retry engine; hands out :class:`Session` objects."""

    def __init__(self, cfg: EnvClientConfig | None = None) -> None:
        self.cfg = cfg or EnvClientConfig()
        self._url = self.cfg.server_url.rstrip("/") if self.cfg.server_url else None
        self._http: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._embedded: EmbeddedServer | None = None
        self._live: set[Session] = set()
        self._background: set[asyncio.Task[Any]] = set()

    @property
    def embedded_server(self) -> EmbeddedServer | None:
        """The embedded server this client started (server_url None), else None."""
        return self._embedded

    @property
    def url(self) -> str:
        if self._url is None:
            raise RuntimeError("EnvClient not started (use `async with EnvClient(cfg)`)")
        return self._url

    async def __aenter__(self) -> EnvClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Open the pool; with no server_url, start the embedded server first."""
        if self._http is not None:
            return
        if self._url is None:
            from env_client.server.launcher import start_embedded_server

            self._embedded = await asyncio.to_thread(
                start_embedded_server,
                self.cfg.embedded,
                timeout_s=self.cfg.embedded_start_timeout_s,
            )
            self._url = self._embedded.url
        self._loop = asyncio.get_running_loop()
        connector = aiohttp.TCPConnector(limit=self.cfg.max_connections, limit_per_host=0)
        self._http = aiohttp.ClientSession(connector=connector)

    async def close(self) -> None:
        """Release live sessions, wait for pending releases, close the pool (and server)."""
        for s in list(self._live):
            self._spawn(s.release())
        if self._background:
            await asyncio.wait(list(self._background), timeout=self.cfg.timeouts.release_s)
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self._embedded is not None:
            await asyncio.to_thread(self._embedded.stop)
            self._embedded = None
            self._url = None

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    # --- sessions ----------------------------------------------------------------------

    @asynccontextmanager
    async def session(self) -> AsyncIterator[Session]:
        """Allocate a session for the block; release it however the block ends."""
        s = await self.allocate()
        try:
            yield s
        finally:
            # Shielded: a cancelled rollout must still hand its desktop back. If cancelled
            # again meanwhile, the release finishes in the background (close() waits for it).
            await asyncio.shield(self._spawn(s.release()))

    async def allocate(self) -> Session:
        """A new session; polls while the service answers pending, up to allocate_deadline_s."""
        sid = f"sess-{uuid.uuid4()}"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cfg.allocate_deadline_s
        body = {"runtime": self.cfg.runtime, "session_id": sid}
        try:
            while True:
                data = await self._call(
                    "allocate", "POST", f"{self.url}/v1/sessions", body=body, retry=True,
                    timeout=self.cfg.timeouts.allocate_s, deadline=deadline,
                )  # fmt: skip
                if not data.get("pending"):
                    return self._session_from(data, sid)
                wait = self._poll_delay(data)
                if loop.time() + wait > deadline:
                    raise EnvUnavailable(
                        f"no desktop free within {self.cfg.allocate_deadline_s:g} s",
                        operation="allocate",
                    )
                await asyncio.sleep(wait)
        except BaseException:
            # The service may have allocated on a request whose answer we never saw.
            self._spawn(self._release_id(sid))
            raise

    def _session_from(self, data: dict[str, Any], sid: str) -> Session:
        entries = data.get("sessions")
        if not isinstance(entries, list) or not entries or not isinstance(entries[0], dict):
            raise ProtocolError(f"allocate answer without sessions: {data}", operation="allocate")
        entry = entries[0]
        session_id = str(entry.get("session_id") or sid)
        node = entry.get("node_url") or self.url
        caps = entry.get("protocol_capabilities") or {}
        s = Session(self, session_id, str(node).rstrip("/"), caps)
        self._live.add(s)
        s.start_heartbeats()
        return s

    async def _release_id(self, sid: str) -> None:
        with contextlib.suppress(EnvError):  # never allocated, or already gone
            await self._call(
                "release", "DELETE", f"{self.url}/v1/sessions/{sid}", session_id=sid, retry=True,
                timeout=self.cfg.timeouts.release_s, max_tries=3,
            )  # fmt: skip

    async def list_sessions(self) -> dict[str, Any]:
        """The service's live sessions (embedded server and ops; not in the core protocol)."""
        return await self._call(
            "list", "GET", f"{self.url}/v1/sessions", retry=True,
            timeout=self.cfg.timeouts.observe_s,
        )  # fmt: skip

    # --- the retry engine --------------------------------------------------------------

    def _poll_delay(self, data: dict[str, Any]) -> float:
        try:
            wait = float(data.get("retry_after_seconds", 1.0))
        except (TypeError, ValueError):
            wait = 1.0
        return min(max(wait, 0.05), self.cfg.retry.max_poll_interval_s)

    def _backoff(self, attempt: int) -> float:
        r = self.cfg.retry
        delay = min(r.backoff_cap_s, r.backoff_base_s * 2 ** (attempt - 1))
        return delay * random.uniform(0.5, 1.0)  # jitter spreads synchronized retries

    async def _call(
        self,
        op: str,
        method: str,
        url: str,
        *,
        body: dict[str, Any] | None = None,
        session_id: str | None = None,
        retry: bool,
        key: str | None = None,
        timeout: float,
        deadline: float | None = None,
        max_tries: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """One protocol call with retries, pending polls and typed errors."""
        if self._http is None:
            raise RuntimeError("EnvClient not started (use `async with EnvClient(cfg)`)")
        if asyncio.get_running_loop() is not self._loop:
            raise RuntimeError(
                "an EnvClient serves the event loop it started in; make one per loop"
            )
        loop = asyncio.get_running_loop()
        recovery = loop.time() + self.cfg.retry.recovery_deadline_s
        deadline = recovery if deadline is None else min(deadline, recovery)
        tries = max_tries or self.cfg.retry.max_tries
        hdrs = dict(headers or {})
        if key is not None:
            hdrs["Idempotency-Key"] = key
        attempt = 0
        while True:
            attempt += 1
            try:
                status, data = await self._send(method, url, body, hdrs, timeout)
                answer = self._judge(op, session_id, key, status, data)
            except _Transient as exc:
                if not retry:
                    raise EnvUnavailable(
                        f"{exc} (not retried: the server offers no idempotency for {op})",
                        session_id=session_id, operation=op,
                    ) from None  # fmt: skip
                wait = self._backoff(attempt)
                if attempt >= tries or loop.time() + wait > deadline:
                    raise EnvUnavailable(
                        f"{exc} (gave up after {attempt} tries)",
                        session_id=session_id,
                        operation=op,
                    ) from None
                log.info("%s %s: %s; retry %d in %.2f s", op, session_id or "", exc, attempt, wait)
                await asyncio.sleep(wait)
                continue
            if answer is None:  # pending: repeat the same request with the same key
                wait = self._poll_delay(data)
                if loop.time() + wait > deadline:
                    raise EnvUnavailable(
                        "operation still pending at the recovery deadline",
                        session_id=session_id, operation=op,
                    )  # fmt: skip
                await asyncio.sleep(wait)
                attempt -= 1  # polling a running operation is not a failed try
                continue
            return answer

    async def _send(
        self, method: str, url: str, body: Any, headers: dict[str, str], timeout: float
    ) -> tuple[int, dict[str, Any]]:
        assert self._http is not None
        try:
            async with self._http.request(
                method, url, json=body, headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as resp:  # fmt: skip
                raw = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise _Transient(what) from exc
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            data = {"ok": False, "error": raw[:300].decode("utf-8", "replace")}
        if not isinstance(data, dict):
            data = {"ok": False, "error": f"answer is not a JSON object: {str(data)[:200]}"}
        return status, data

    def _judge(
        self, op: str, sid: str | None, key: str | None, status: int, data: dict[str, Any]
    ) -> dict[str, Any] | None:
        """The answer if final; None if pending; raises typed errors / _Transient."""
        message = str(data.get("error") or data)[:1000]
        if status in RETRYABLE_STATUS:
            raise _Transient(f"HTTP {status}: {message}")
        if status in (404, 410) and sid is not None:
            raise SessionLost(message, session_id=sid, operation=op, status=status)
        if status >= 400 or data.get("ok") is not True:
            raise EnvError(message, session_id=sid, operation=op, status=status)
        if data.get("pending") and op != "allocate":
            op_id = data.get("operation_id")
            if key is None and op not in ("observe", "heartbeat", "list"):
                raise ProtocolError(
                    "pending answer to a call sent without Idempotency-Key",
                    session_id=sid, operation=op,
                )  # fmt: skip
            if op_id is not None and op_id != key:
                raise ProtocolError(
                    f"pending answer for operation {op_id!r}, sent {key!r}",
                    session_id=sid, operation=op,
                )  # fmt: skip
            return None
        return data


class Session:
    """One allocated desktop. Use through ``EnvClient.session()``."""

    def __init__(
        self, client: EnvClient, session_id: str, node_url: str, capabilities: dict[str, Any]
    ) -> None:
        self.client = client
        self.session_id = session_id
        self.node_url = node_url
        self.capabilities = capabilities
        try:
            self.idempotent = int(capabilities.get("operation_idempotency", 0)) >= 1
        except (TypeError, ValueError):
            self.idempotent = False
        self.last_observation: Observation | None = None
        self.lost: SessionLost | None = None
        self._heartbeats: asyncio.Task[None] | None = None
        self._released = False

    def __repr__(self) -> str:
        return f"Session({self.session_id!r}, node={self.node_url!r})"

    # --- data plane --------------------------------------------------------------------

    async def reset(self, task_payload: dict[str, Any]) -> Observation:
        """Start an episode. ``Observation.instruction``: the server's (MiniWoB) or the task's."""
        data = await self._data("reset", {"task_payload": task_payload}, self._t.reset_s)
        instruction = data.get("instruction")
        if not isinstance(instruction, str) and isinstance(task_payload, dict):
            instruction = task_payload.get("instruction")
        obs = decode_observation(data.get("observation"), instruction)
        return await self._keep(obs)

    async def step(self, action: dict[str, Any], pause: float = 0.0) -> StepResult:
        """Send one ACTION dict; ``pause``: seconds the desktop settles before its screenshot."""
        data = await self._data("step", {"action": action, "pause": pause}, self._t.step_s)
        obs = await self._keep(decode_observation(data.get("observation")))
        try:
            reward = float(data.get("reward") or 0.0)
        except (TypeError, ValueError):
            reward = 0.0
        info = data.get("info")
        return StepResult(
            obs, reward, bool(data.get("done")), info if isinstance(info, dict) else {}
        )

    async def act(self, action: Action, pause: float = 0.0) -> StepResult:
        """Send a typed action (pixels from the last screenshot's size). An invalid action is
        not sent: it is a step with no effect (``executed=False``) on the last observation."""
        last = self.last_observation
        if last is None:
            raise RuntimeError(f"{self}: reset before acting")
        wire = to_protocol(action, *last.size)
        if wire is None:
            return StepResult(last, 0.0, False, {"invalid": action.reason}, executed=False)
        if action.name == "wait":
            pause = max(pause, action.time or 0.0)
        return await self.step(wire, pause=pause)

    async def observe(self) -> Observation:
        data = await self._data("observe", {}, self._t.observe_s)
        obs = decode_observation(data.get("observation"))
        self.last_observation = obs
        return obs

    async def evaluate(self) -> float:
        """The episode's score in [0, 1]."""
        data = await self._data("evaluate", {}, self._t.evaluate_s)
        score = data.get("score")
        if isinstance(score, bool) or not isinstance(score, int | float) or not 0 <= score <= 1:
            raise ProtocolError(
                f"score {score!r} is not in [0, 1]", session_id=self.session_id,
                operation="evaluate",
            )  # fmt: skip
        return float(score)

    async def ground_truth(self) -> dict[str, Any]:
        """The embedded server's view of the episode (utterance, fields, elements). Embedded
        server only: production services answer 404 (raised as SessionLost/EnvError)."""
        return await self.client._call(
            "debug", "GET", f"{self.node_url}/v1/sessions/{self.session_id}/debug",
            session_id=self.session_id, retry=True, timeout=self._t.debug_s,
        )  # fmt: skip

    @property
    def _t(self) -> Any:
        return self.client.cfg.timeouts

    async def _data(self, op: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        if self._released:
            raise SessionLost("session was released", session_id=self.session_id, operation=op)
        key = f"{op}-{uuid.uuid4().hex}" if self.idempotent else None
        return await self.client._call(
            op, "POST", f"{self.node_url}/v1/sessions/{self.session_id}/{op}", body=body,
            session_id=self.session_id, retry=self.idempotent or op == "observe", key=key,
            timeout=timeout,
        )  # fmt: skip

    async def _keep(self, obs: Observation) -> Observation:
        """Remember the observation; one without screenshot is completed by an observe."""
        if not obs.has_screenshot:
            fresh = await self.observe()
            obs.screenshot = fresh.screenshot
            obs.accessibility_tree = obs.accessibility_tree or fresh.accessibility_tree
        self.last_observation = obs
        return obs

    # --- control plane -----------------------------------------------------------------

    def start_heartbeats(self) -> None:
        self._heartbeats = asyncio.ensure_future(self._heartbeat_loop())

    async def _heartbeat_loop(self) -> None:
        interval = self.client.cfg.heartbeat_interval_s
        while True:
            await asyncio.sleep(interval)
            try:
                await self.heartbeat(deadline_s=interval)
            except SessionLost as exc:
                self.lost = exc
                log.warning("%s: heartbeat says the session is gone: %s", self, exc)
                return
            except EnvError as exc:
                log.warning("%s: heartbeat failed: %s", self, exc)

    async def heartbeat(self, deadline_s: float | None = None) -> None:
        loop = asyncio.get_running_loop()
        await self.client._call(
            "heartbeat", "POST", f"{self.client.url}/v1/sessions/{self.session_id}/heartbeat",
            body={}, session_id=self.session_id, retry=True, timeout=self._t.heartbeat_s,
            deadline=loop.time() + (deadline_s or self._t.heartbeat_s), max_tries=3,
            headers=HEARTBEAT_HEADER,
        )  # fmt: skip

    async def release(self) -> None:
        """Hand the desktop back (idempotent; never raises)."""
        if self._released:
            return
        self._released = True
        self.client._live.discard(self)
        if self._heartbeats is not None:
            self._heartbeats.cancel()
        loop = asyncio.get_running_loop()
        try:
            await self.client._call(
                "release", "DELETE", f"{self.client.url}/v1/sessions/{self.session_id}",
                session_id=self.session_id, retry=True, timeout=self._t.release_s,
                deadline=loop.time() + self._t.release_s,
            )  # fmt: skip
        except SessionLost:
            pass  # already reclaimed or lost: nothing to give back
        except Exception as exc:  # a release failure must not mask the caller's own error
            log.warning("%s: release failed: %s", self, exc)
