"""The embedded environment server's HTTP application (ENV_PROTOCOL.md over MiniWoB++).

Protocol routes: ``POST /v1/sessions`` (allocate), ``POST /v1/sessions/{id}/{reset,step,
observe,evaluate,heartbeat}``, ``DELETE /v1/sessions/{id}``. Embedded-only extras:

- ``GET /v1/sessions``: live sessions, pool state (tests, ops).
- ``GET /v1/sessions/{id}/debug``: ground truth of the current episode (MiniWoB utterance and
  fields, every shown element with id/classes/text/value/box/click point in screen pixels),
  for scripted solvers and the oracle annotator. Production servers do not have it.
- ``/v1/faults`` (GET/POST/DELETE, only with ``fault_api``): armed fault rules.
- ``GET /healthz``.

The reset answer carries ``"instruction"`` (MiniWoB writes the instruction at reset).

Bad input of any kind is a 4xx envelope naming the problem, never a 5xx: bodies longer than
``max_body_bytes`` get 413 before they are read, a body that is not a JSON object 400, an
unknown session 404, an Idempotency-Key reused with a different body 422 (as the IETF
idempotency-key draft says). Releasing is idempotent (an ended session's release answers ok).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import re
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from env_client.a11y import to_xml
from env_client.commands import CommandError, parse_command
from env_client.config import EmbeddedEnvConfig, FaultRule
from env_client.desktop.setup import SetupError
from env_client.server.browser import RawObservation, TaskError, task_page
from env_client.server.faults import FaultBook
from env_client.server.sessions import Answer, EnvSession, SessionGone, SessionManager
from env_client.tasks.sources import TaskFileError

log = logging.getLogger(__name__)
MANAGER_KEY = web.AppKey("manager", SessionManager)
BODY_LIMIT_KEY = web.AppKey("max_body_bytes", int)
# Session ids travel in URL paths: a slash or a space would make them unreachable.
_SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,199}")
_IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,200}")


class BadRequest(ValueError):
    """The caller's fault: answered 400 with the message."""


def _error(message: str, status: int) -> web.Response:
    return web.json_response({"ok": False, "error": message}, status=status)


def _too_large(limit: int) -> web.Response:
    return _error(f"request body exceeds the limit of {limit} bytes (max_body_bytes)", 413)


@web.middleware
async def envelope(request: web.Request, handler: Callable[..., Awaitable[Any]]) -> Any:
    """Every answer is an envelope; errors become {"ok": false, "error": …} with a status."""
    limit = request.app[BODY_LIMIT_KEY]
    if (request.content_length or 0) > limit:  # refused before a byte of it is read
        return _too_large(limit)
    try:
        return await handler(request)
    except SessionGone as exc:
        return _error(str(exc), exc.status)
    except (BadRequest, TaskError, CommandError, TaskFileError) as exc:
        return _error(str(exc), 400)
    except SetupError as exc:  # the task's setup cannot run on this desktop: not retried
        return _error(str(exc), 422)
    except web.HTTPRequestEntityTooLarge:  # chunked bodies: aiohttp counts while reading
        return _too_large(limit)
    except web.HTTPNotFound:
        return _error(f"no route {request.method} {request.path}", 404)
    except web.HTTPMethodNotAllowed as exc:
        allowed = ", ".join(sorted(exc.allowed_methods))
        return _error(f"{request.method} not allowed on {request.path} (allowed: {allowed})", 405)
    except web.HTTPException as exc:
        return _error(exc.reason or exc.text or "error", exc.status)
    except Exception as exc:
        log.exception("%s %s failed", request.method, request.path)
        return _error(f"internal error: {type(exc).__name__}: {exc}", 500)


async def _body(request: web.Request) -> dict[str, Any]:
    """The JSON object of the body ({} when empty); BadRequest for anything else."""
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: absurdly deep nesting
        raise BadRequest(f"body is not JSON: {type(exc).__name__}: {exc}"[:300]) from None
    if not isinstance(body, dict):
        raise BadRequest(f"body must be a JSON object, got {type(body).__name__}")
    return body


def _key_of(request: web.Request) -> str | None:
    """The Idempotency-Key header, if sent: 1..200 visible ASCII characters (keys are kept per
    session, so an unbounded one would be a way to fill memory)."""
    key = request.headers.get("Idempotency-Key")
    if key is not None and not _IDEMPOTENCY_KEY.fullmatch(key):
        raise BadRequest(
            f"Idempotency-Key must be 1..200 visible ASCII characters, got {len(key)} characters"
        )
    return key


def _fingerprint(body: dict[str, Any]) -> str:
    """What a replayed Idempotency-Key must repeat: the body, independent of key order."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _score(meta: dict[str, Any]) -> float:
    """MiniWoB's raw reward (-1..1) of a finished episode as success in [0, 1]."""
    if not meta.get("done"):
        return 0.0
    return min(1.0, max(0.0, float(meta.get("raw_reward") or 0.0)))


class EnvServer:
    """Routes → session manager and browsers."""

    def __init__(self, cfg: EmbeddedEnvConfig) -> None:
        self.cfg = cfg
        self.mgr = SessionManager(cfg)
        self.faults = FaultBook(cfg.faults)

    def build(self) -> web.Application:
        app = web.Application(middlewares=[envelope], client_max_size=self.cfg.max_body_bytes)
        app[MANAGER_KEY] = self.mgr
        app[BODY_LIMIT_KEY] = self.cfg.max_body_bytes
        r = app.router
        r.add_post("/v1/sessions", self.allocate)
        r.add_get("/v1/sessions", self.list_sessions)
        r.add_delete("/v1/sessions/{sid}", self.release)
        r.add_post("/v1/sessions/{sid}/heartbeat", self.heartbeat)
        r.add_post("/v1/sessions/{sid}/reset", self._data("reset", self._reset))
        r.add_post("/v1/sessions/{sid}/step", self._data("step", self._step))
        r.add_post("/v1/sessions/{sid}/observe", self._data("observe", self._observe))
        r.add_post("/v1/sessions/{sid}/evaluate", self._data("evaluate", self._evaluate))
        r.add_get("/v1/sessions/{sid}/debug", self.debug)
        r.add_get("/healthz", self.health)
        if self.cfg.fault_api:
            r.add_get("/v1/faults", self.list_faults)
            r.add_post("/v1/faults", self.add_faults)
            r.add_delete("/v1/faults", self.clear_faults)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        self._reaper = asyncio.ensure_future(self.mgr.reap_forever())

    async def _on_cleanup(self, app: web.Application) -> None:
        self._reaper.cancel()
        await self.mgr.close()

    # --- faults ------------------------------------------------------------------------

    async def _fault(self, op: str, sid: str | None, phase: str, key: str | None) -> Any:
        """The injected answer for this request, or None to carry on."""
        rule = self.faults.take(op, sid, phase)
        if rule is None:
            return None
        log.info("fault %s %s %s (session %s)", rule.kind, phase, op, sid)
        if rule.kind == "delay":
            await asyncio.sleep(rule.delay_s)
            return None
        if rule.kind == "kill_browser":
            session = self.mgr.sessions.get(sid or "")
            if session is not None:
                await session.desktop.run(session.desktop.browser.kill)
            return None
        if rule.kind == "lose_session":
            if sid:
                self.mgr.lose(sid, f"injected fault {phase} {op}")
            return _error(f"session {sid} lost (injected fault {phase} {op})", 410)
        if rule.kind == "pending":
            return web.json_response(
                {"ok": True, "pending": True, "operation_id": key, "retry_after_seconds": 0.2}
            )
        status = int(rule.kind.removeprefix("http_"))
        return _error(f"injected fault: HTTP {status} {phase} {op}", status)

    # --- control plane -----------------------------------------------------------------

    async def allocate(self, request: web.Request) -> web.Response:
        body = await _body(request)
        sid = body.get("session_id")
        if sid is not None and (not isinstance(sid, str) or not _SESSION_ID.fullmatch(sid)):
            raise BadRequest(
                "session_id must be 1..200 characters of letters, digits and ._:- "
                f"(starting with a letter or digit), got {str(sid)[:60]!r}"
            )
        runtime = body.get("runtime")
        if runtime is not None and (not isinstance(runtime, str) or not runtime):
            raise BadRequest(f"runtime must be a non-empty string, got {str(runtime)[:60]!r}")
        if (early := await self._fault("allocate", sid, "before", None)) is not None:
            return early
        got = self.mgr.allocate(sid)
        if isinstance(got, float):
            if self.mgr.last_start_error and not self.mgr.starting and not self.mgr.idle:
                return _error(f"no desktop could start: {self.mgr.last_start_error}", 503)
            answer: dict[str, Any] = {"ok": True, "pending": True, "retry_after_seconds": got}
        else:
            node = f"{request.scheme}://{request.host}"
            caps = {"operation_idempotency": 1 if self.cfg.idempotency else 0}
            answer = {
                "ok": True,
                "sessions": [
                    {"session_id": got.session_id, "node_url": node, "protocol_capabilities": caps}
                ],
            }
        if (late := await self._fault("allocate", sid, "after", None)) is not None:
            return late
        return web.json_response(answer)

    async def heartbeat(self, request: web.Request) -> web.Response:
        sid = request.match_info["sid"]
        await _body(request)  # {} or empty; anything else is the caller's mistake
        if (early := await self._fault("heartbeat", sid, "before", None)) is not None:
            return early
        self.mgr.heartbeat(sid)
        if (late := await self._fault("heartbeat", sid, "after", None)) is not None:
            return late  # the heartbeat counted; its answer is lost
        return web.json_response({"ok": True})

    async def release(self, request: web.Request) -> web.Response:
        sid = request.match_info["sid"]
        await _body(request)
        if (early := await self._fault("release", sid, "before", None)) is not None:
            return early
        self.mgr.release_by_client(sid)  # idempotent; 404 only for ids never seen
        if (late := await self._fault("release", sid, "after", None)) is not None:
            return late  # released; the retry that follows must answer ok
        return web.json_response({"ok": True})

    async def list_sessions(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True, **self.mgr.status()})

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "live": len(self.mgr.sessions)})

    async def list_faults(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "rules": self.faults.snapshot()})

    async def add_faults(self, request: web.Request) -> web.Response:
        body = await _body(request)
        if not isinstance(body.get("rules", []), list):
            raise BadRequest(f"rules must be a list of fault rules, got {body['rules']!r}"[:200])
        try:
            rules = [FaultRule.model_validate(r) for r in body.get("rules", [])]
        except ValidationError as exc:
            raise BadRequest(f"bad fault rule: {exc}") from None
        return web.json_response({"ok": True, "ids": self.faults.add(rules)})

    async def clear_faults(self, request: web.Request) -> web.Response:
        self.faults.clear()
        return web.json_response({"ok": True})

    # --- data plane --------------------------------------------------------------------

    def _data(
        self, op: str, work: Callable[[EnvSession, dict[str, Any]], Awaitable[Answer]]
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            sid = request.match_info["sid"]
            key = _key_of(request)
            body = await _body(request)
            if (early := await self._fault(op, sid, "before", key)) is not None:
                return early
            session = self.mgr.get(sid)
            status, answer = await self.mgr.run(
                session, op, key, _fingerprint(body), lambda: work(session, body)
            )
            if (late := await self._fault(op, sid, "after", key)) is not None:
                return late
            return web.json_response(answer, status=status)

        return handle

    async def _browser(self, session: EnvSession, fn: Callable[..., Any], *args: Any) -> Any:
        """Run browser code; a browser that stopped answering loses its session (410)."""
        try:
            return await session.desktop.run(fn, *args)
        except (TaskError, CommandError, TaskFileError, SetupError):
            raise
        except Exception as exc:
            browser = session.desktop.browser
            if await session.desktop.run(browser.alive):
                raise
            browser.dead = True
            self.mgr.lose(session.session_id, f"desktop crashed: {type(exc).__name__}")
            raise SessionGone(410, f"session {session.session_id} lost: the browser died") from exc

    def _obs(self, raw: RawObservation) -> dict[str, Any]:
        if "accessibility_tree" in raw.meta:  # a desktop's own tree (OSWorld's, or ours)
            tree = raw.meta["accessibility_tree"]
        else:
            tree = to_xml(raw.nodes, self.cfg.screen_width, self.cfg.screen_height)
        return {
            "modalities": {
                "screenshot": base64.b64encode(raw.png).decode("ascii"),
                "accessibility_tree": tree,
                "terminal": None,
            }
        }

    async def _reset(self, session: EnvSession, body: dict[str, Any]) -> Answer:
        task, seed = _task_of(body.get("task_payload"), self.cfg.backend)
        browser = session.desktop.browser
        utterance, fields = await self._browser(session, browser.reset, task, seed)
        name = task if isinstance(task, str) else str(task.get("id"))
        session.task, session.seed, session.instruction = name, seed, utterance
        session.fields, session.control_done, session.episode_actions = fields, False, 0
        raw = await self._browser(session, browser.observe)
        return 200, {
            "ok": True,
            "observation": self._obs(raw),
            "instruction": utterance,
            "info": {"task": name, "seed": seed},
        }

    async def _step(self, session: EnvSession, body: dict[str, Any]) -> Answer:
        if session.task is None:
            raise BadRequest(f"session {session.session_id} has no episode: reset it first")
        ops, control = _action_of(body.get("action"), self.cfg.backend)
        pause = _pause_of(body.get("pause", 0.0), self.cfg.max_pause_s)
        info: dict[str, Any] = {}
        note = getattr(session.desktop.browser, "note_control", None)
        if control is not None and note is not None:  # OSWorld scores a final FAIL
            await session.desktop.run(note, control)
        if control in ("DONE", "FAIL"):
            session.control_done = True
            info["control"] = control
        elif control == "WAIT":
            info["control"] = control
        elif session.control_done:
            info["ignored_after_done"] = len(ops)
        else:
            done = await self._browser(session, session.desktop.browser.perform, ops)
            session.episode_actions += done.applied
            session.total_actions += done.applied
            info.update(done.as_dict())
        if pause + self.cfg.step_delay_s > 0:
            await asyncio.sleep(pause + self.cfg.step_delay_s)
        raw = await self._browser(session, session.desktop.browser.observe)
        finished = session.control_done or bool(raw.meta.get("done"))
        return 200, {
            "ok": True,
            "observation": self._obs(raw),
            "reward": _score(raw.meta) if finished else 0.0,
            "done": finished,
            "info": info,
        }

    async def _observe(self, session: EnvSession, body: dict[str, Any]) -> Answer:
        if session.task is None:
            raise BadRequest(f"session {session.session_id} has no episode: reset it first")
        raw = await self._browser(session, session.desktop.browser.observe)
        return 200, {"ok": True, "observation": self._obs(raw)}

    async def _evaluate(self, session: EnvSession, body: dict[str, Any]) -> Answer:
        if session.task is None:
            raise BadRequest(f"session {session.session_id} has no episode: reset it first")
        meta = await self._browser(session, session.desktop.browser.state)
        return 200, {"ok": True, "score": _score(meta)}

    async def debug(self, request: web.Request) -> web.Response:
        session = self.mgr.get(request.match_info["sid"])

        async def work() -> Answer:
            truth: dict[str, Any] = {"elements": [], "utterance": None, "meta": None}
            if session.task is not None:
                truth = await self._browser(session, session.desktop.browser.ground_truth)
            return 200, {
                "ok": True,
                "session_id": session.session_id,
                "task": session.task,
                "seed": session.seed,
                "instruction": session.instruction,
                "fields": session.fields,
                "screen": [self.cfg.screen_width, self.cfg.screen_height],
                "episode_actions": session.episode_actions,
                "total_actions": session.total_actions,
                "control_done": session.control_done,
                "score": _score(truth["meta"] or {}),
                **truth,
            }

        status, answer = await self.mgr.run(session, "debug", None, "", work)
        return web.json_response(answer, status=status)


def _task_of(payload: Any, backend: str = "miniwob") -> tuple[Any, Any]:
    """(MiniWoB task, seed) of a task payload; a missing seed draws one. The desktop backend
    takes the whole OSWorld task (validated here: TaskFileError names the field)."""
    if not isinstance(payload, dict):
        raise BadRequest("task_payload must be a JSON object")
    if backend == "desktop":
        from env_client.desktop.tasks import check_task

        return check_task(payload), None
    env = payload.get("env", "miniwob")
    if env != "miniwob":
        raise BadRequest(f"this server runs MiniWoB tasks (env 'miniwob'), not env={env!r}")
    task = payload.get("task")
    if not isinstance(task, str):
        raise BadRequest(f"task_payload.task must name a MiniWoB task, got {task!r}")
    task_page(task)  # TaskError (400) for names MiniWoB does not ship
    seed = payload.get("seed")
    if seed is None:
        seed = secrets.randbelow(2**31)
    if isinstance(seed, bool) or not isinstance(seed, int | str) or len(str(seed)) > 100:
        raise BadRequest(f"seed must be an integer or a short string, got {seed!r}")
    return task, seed


def _action_of(action: Any, backend: str = "miniwob") -> tuple[list[Any], str | None]:
    """(GUI operations, control type) of an ACTION dict. The desktop backend also takes
    OSWorld computer_13 actions (mapped onto the same whitelisted operations)."""
    if backend == "desktop":
        from env_client.desktop.computer13 import action_ops

        return action_ops(action)
    if not isinstance(action, dict):
        raise BadRequest("action must be a JSON object")
    kind, typ = action.get("kind"), action.get("type")
    payload = action.get("payload") or {}
    if kind == "control":
        if typ not in ("DONE", "FAIL", "WAIT"):
            raise BadRequest(f"control action type must be DONE, FAIL or WAIT, got {typ!r}")
        return [], typ
    if kind == "gui":
        if typ != "pyautogui":
            raise BadRequest(f"gui action type must be 'pyautogui', got {typ!r}")
        if not isinstance(payload, dict) or "command" not in payload:
            raise BadRequest("gui action needs payload.command")
        return parse_command(payload["command"]), None
    raise BadRequest(f"action kind must be 'gui' or 'control', got {kind!r}")


def _pause_of(pause: Any, cap: float) -> float:
    if isinstance(pause, bool) or not isinstance(pause, int | float) or not pause >= 0:
        raise BadRequest(f"pause must be a non-negative number of seconds, got {pause!r}")
    return min(float(pause), cap)
