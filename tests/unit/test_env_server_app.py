"""The embedded env server's protocol edges and input handling, in-process and without Chromium.

The aiohttp app runs on a loopback port with no browser started (``prewarm=0`` and a Chromium
path that does not exist, so nothing here could start one); sessions that need a desktop get a
stand-in with no browser behind it, enough for the control plane (heartbeat, release). What a
browser does is tested against the real server in tests/integration/test_env_server.py.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from benchmarks.http_fuzz.common import Tally, run_probes
from benchmarks.http_fuzz.driver import draw
from benchmarks.http_fuzz.env_server import EnvTarget, hostile_commands
from env_client.commands import CommandError, parse_command
from env_client.config import EmbeddedEnvConfig
from env_client.server.app import EnvServer
from env_client.server.sessions import EnvSession, SessionGone, SessionManager

pytestmark = pytest.mark.timeout(60)


def _cfg(**over: Any) -> EmbeddedEnvConfig:
    base = {"prewarm": 0, "capacity": 1, "fault_api": True, "max_body_bytes": 4096,
            "chrome_binary": "/nonexistent/chromium", "reclaim_interval_s": 0.1}  # fmt: skip
    return EmbeddedEnvConfig(**{**base, **over})


@asynccontextmanager
async def served(cfg: EmbeddedEnvConfig) -> AsyncIterator[tuple[EnvServer, str]]:
    env = EnvServer(cfg)
    server = TestServer(env.build(), host="127.0.0.1")
    await server.start_server()
    try:
        yield env, str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


def _bind_standin(mgr: SessionManager, sid: str) -> EnvSession:
    """A live session on a desktop with no browser: the control plane never touches one."""
    desktop: Any = SimpleNamespace(browser=SimpleNamespace(dead=False))
    return mgr._bind(sid, desktop)


async def _call(method: str, url: str, **kw: Any) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.request(method, url, **kw) as r:
        return r.status, await r.json()


# --- (A) protocol edges ----------------------------------------------------------------------


def test_waiter_ttl_default_outlasts_two_slow_client_polls():
    assert EmbeddedEnvConfig().waiter_ttl_s >= 2 * 10.5


def test_a_waiter_silent_for_15_s_keeps_its_place_in_the_queue():
    """The authors' client polls up to ~10.5 s apart; the old 10 s TTL dropped such a waiter
    and let a later caller take the desktop it was queued for."""
    mgr = SessionManager(_cfg())
    mgr.starting = mgr.cfg.capacity  # the pool is full and starting: nothing is launched
    assert isinstance(mgr.allocate("sess-first"), float)
    mgr.waiters["sess-first"] -= 15.0  # its last poll was 15 s ago
    assert isinstance(mgr.allocate("sess-second"), float)  # (prunes stale waiters)
    assert list(mgr.waiters) == ["sess-first", "sess-second"]
    mgr.idle.append(SimpleNamespace())  # type: ignore[arg-type]  # a desktop frees up
    assert isinstance(mgr.allocate("sess-second"), float)  # still behind the first
    assert isinstance(mgr.allocate("sess-first"), EnvSession)
    mgr.waiters["sess-second"] -= mgr.cfg.waiter_ttl_s + 1  # truly gone quiet: forgotten
    mgr._prune_waiters(time.monotonic())
    assert "sess-second" not in mgr.waiters


def test_release_is_idempotent_and_unknown_ids_stay_404():
    async def go() -> None:
        async with served(_cfg()) as (env, url):
            _bind_standin(env.mgr, "sess-a")
            for _ in range(2):  # the second is a retry after a lost answer
                assert await _call("DELETE", f"{url}/v1/sessions/sess-a") == (200, {"ok": True})
            status, body = await _call("DELETE", f"{url}/v1/sessions/sess-never")
            assert status == 404 and "no session sess-never" in body["error"]
            status, body = await _call("POST", f"{url}/v1/sessions/sess-a/heartbeat", json={})
            assert status == 410 and "released by the client" in body["error"]

    asyncio.run(go())


def test_a_waiter_that_gives_up_can_release_twice():
    mgr = SessionManager(_cfg())
    mgr.starting = mgr.cfg.capacity
    mgr.allocate("sess-w")
    mgr.release_by_client("sess-w")
    mgr.release_by_client("sess-w")
    assert "sess-w" not in mgr.waiters
    with pytest.raises(SessionGone) as err:
        mgr.release_by_client("sess-other")
    assert err.value.status == 404


@pytest.mark.parametrize("op", ["release", "heartbeat"])
def test_after_faults_on_control_calls_act_then_lose_the_answer(op):
    async def go() -> None:
        rule = {"op": op, "kind": "http_503", "phase": "after"}
        async with served(_cfg()) as (env, url):
            session = _bind_standin(env.mgr, "sess-f")
            session.last_heartbeat -= 50.0
            assert (await _call("POST", f"{url}/v1/faults", json={"rules": [rule]}))[0] == 200
            if op == "release":
                status, body = await _call("DELETE", f"{url}/v1/sessions/sess-f")
                assert status == 503 and "after release" in body["error"]
                assert "sess-f" not in env.mgr.sessions  # it was released all the same
                assert (await _call("DELETE", f"{url}/v1/sessions/sess-f"))[0] == 200
            else:
                status, body = await _call("POST", f"{url}/v1/sessions/sess-f/heartbeat", json={})
                assert status == 503 and "after heartbeat" in body["error"]
                assert time.monotonic() - session.last_heartbeat < 5.0  # it counted all the same
            assert (await _call("GET", f"{url}/v1/faults"))[1]["rules"][0]["fired"] == 1

    asyncio.run(go())


# --- (B) bad input -----------------------------------------------------------------------------


def test_a_replayed_key_with_another_body_is_422_not_the_first_answer():
    async def go() -> None:
        mgr = SessionManager(_cfg())
        session = _bind_standin(mgr, "sess-k")
        calls = []

        async def work() -> tuple[int, dict[str, Any]]:
            calls.append(1)
            return 200, {"ok": True, "n": len(calls)}

        assert await mgr.run(session, "step", "k1", "body-a", work) == (200, {"ok": True, "n": 1})
        assert await mgr.run(session, "step", "k1", "body-a", work) == (200, {"ok": True, "n": 1})
        status, answer = await mgr.run(session, "step", "k1", "body-b", work)
        assert status == 422 and "different body" in answer["error"] and len(calls) == 1
        status, answer = await mgr.run(session, "observe", "k1", "body-a", work)
        assert status == 400 and "was used for step" in answer["error"]

    asyncio.run(go())


def test_the_fuzzers_hostile_commands_never_parse():
    for command in hostile_commands("/tmp/x"):
        with pytest.raises(CommandError):
            parse_command(command)


@pytest.mark.parametrize("chunked", [False, True])
def test_bodies_over_the_limit_are_413_with_a_json_error(chunked):
    async def go() -> None:
        async with served(_cfg()) as (_, url):
            body = b'{"pad": "' + b"x" * 5000 + b'"}'

            async def stream() -> AsyncIterator[bytes]:
                yield body

            data: Any = stream() if chunked else body
            status, answer = await _call("POST", f"{url}/v1/sessions", data=data)
            assert status == 413 and "limit of 4096 bytes" in answer["error"]

    asyncio.run(go())


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"rules": 5}, "rules must be a list"),
        ({"rules": None}, "rules must be a list"),
        ({"rules": [5]}, "bad fault rule"),
    ],
)
def test_bad_fault_rules_are_400(body, message):
    async def go() -> None:
        async with served(_cfg()) as (_, url):
            status, answer = await _call("POST", f"{url}/v1/faults", json=body)
            assert status == 400 and message in answer["error"]

    asyncio.run(go())


def test_fuzz_probes_without_a_session_all_get_named_4xx_and_nothing_starts():
    async def go() -> None:
        async with served(_cfg()) as (env, url), aiohttp.ClientSession() as http:
            target = EnvTarget(max_body_bytes=4096, session_id=None, fault_api=True)
            tally = Tally()
            await run_probes(http, draw(random.Random(7), 150, (url, target), None), tally)
            assert tally.counts["4xx"] == 150, tally.failures
            assert env.mgr.total == 0 and not env.mgr.sessions and not env.mgr.waiters
            assert (await _call("GET", f"{url}/healthz")) == (200, {"ok": True, "live": 0})

    asyncio.run(go())


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "RecursionError"),  # answered 500 before
        (b'{"session_id": "a/b"}', "session_id must be"),  # allocated an unreachable id
        (b'{"session_id": "sess a"}', "session_id must be"),
        (b'{"session_id": "sess-a\\n"}', "session_id must be"),  # "$" would let it through
        (b'{"runtime": 5}', "runtime must be"),
        (b'{"runtime": ""}', "runtime must be"),
        (b"[]", "must be a JSON object, got list"),
    ],
)
def test_bad_allocate_bodies_are_400_and_allocate_nothing(body, message):
    async def go() -> None:
        async with served(_cfg(max_body_bytes=1 << 20)) as (env, url):
            status, answer = await _call("POST", f"{url}/v1/sessions", data=body)
            assert status == 400 and message in answer["error"]
            assert not env.mgr.waiters and env.mgr.total == 0

    asyncio.run(go())


@pytest.mark.parametrize("body", [b"null", b"42", b"{", b"[]"])
def test_a_release_or_heartbeat_with_a_bad_body_is_400_and_changes_nothing(body):
    """A DELETE with body ``null`` used to release the session (its body was never read)."""

    async def go() -> None:
        async with served(_cfg()) as (env, url):
            session = _bind_standin(env.mgr, "sess-b")
            session.last_heartbeat -= 50.0
            for method, path in (("DELETE", ""), ("POST", "/heartbeat")):
                status, answer = await _call(method, f"{url}/v1/sessions/sess-b{path}", data=body)
                assert status == 400 and "body" in answer["error"]
            assert "sess-b" in env.mgr.sessions
            assert time.monotonic() - session.last_heartbeat > 40.0

    asyncio.run(go())


@pytest.mark.parametrize("key", ["k" * 201, " ", "step-\u00e9"])
def test_malformed_idempotency_keys_are_400(key):
    async def go() -> None:
        async with served(_cfg()) as (env, url):
            _bind_standin(env.mgr, "sess-i")
            headers = {"Idempotency-Key": key}
            status, answer = await _call(
                "POST", f"{url}/v1/sessions/sess-i/observe", json={}, headers=headers
            )
            assert status == 400 and "Idempotency-Key must be" in answer["error"]

    asyncio.run(go())
