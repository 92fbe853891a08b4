"""Fuzzing the environment server: its probes (bad bodies, unknown sessions, hostile pyautogui
commands, replayed Idempotency-Keys), the fuzzed session, the health check afterwards and the
embedded server started when no ``--env-url`` is given."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.http_fuzz.common import (
    BAD_JSON,
    NOT_OBJECTS,
    TASK,
    Probe,
    check_loopback,
    choose,
    json_body,
    oversized,
    pick,
    send,
)


@dataclass
class EnvTarget:
    """The environment server under fuzz; ``session_id``: a live session with an episode
    (None: only probes that need no session)."""

    max_body_bytes: int
    session_id: str | None = None
    fault_api: bool = False
    marker: str = "/tmp/fuzz-http-pwned"


def hostile_commands(marker: str) -> list[str]:
    """pyautogui command strings that try to run code beyond the whitelist."""
    return [
        f"__import__('os').system('touch {marker}')",
        f"import os; os.system('touch {marker}')",
        f"exec(\"open('{marker}', 'w')\")",
        f"eval(\"__import__('os').system('touch {marker}')\")",
        f"pyautogui.write(open('{marker}', 'w').name)",
        f"pyautogui.click(__import__('pathlib').Path('{marker}').touch(), 1)",
        "pyautogui.click(*[1, 2])",
        "pyautogui.click(**{'x': 1, 'y': 2})",
        "pyautogui.__class__.__base__.__subclasses__()",
        "pyautogui.screenshot()",
        "pyautogui.click(1, 2).__globals__",
        "import pyautogui as os; os.system('id')",
        "from os import system; system('id')",
        "pyautogui.click(x=[c for c in ().__class__.__bases__[0].__subclasses__()], y=1)",
        "lambda: 1",
        "pyautogui.click(1, 1)\x00; import os",
        "pyautogui.write('a' * 10**9)",
        "pyautogui.click(1e308 * 10, 1)",
        "pyautogui.press(['a'] * 100000)",
        "time.sleep(10**6)",
        "pyautogui.moveTo(1, 2); " * 500,
        "pyautogui.hotkey(" + "'a', " * 5000 + ")",
        "(" * 500 + ")" * 500,
        "pyautogui.click(" + "-" * 100000 + "1, 1)",
        "getattr(pyautogui, 'click')(1, 1)",
        "pyautogui.click(1, 1) if True else None",
        "with open('/etc/passwd') as f: pass",
        "x = pyautogui.click(1, 1)",
    ]


def _sid_path(target: EnvTarget, rng: random.Random) -> tuple[str, bool]:
    """(session path, live): the fuzzed session or an id the server never saw."""
    if target.session_id and rng.random() < 0.7:
        return f"/v1/sessions/{target.session_id}", True
    return f"/v1/sessions/sess-unknown-{rng.getrandbits(64):x}", False


def _env_bad_json(rng: random.Random, t: EnvTarget) -> Probe:
    base, _ = _sid_path(t, rng)
    op, method, path = pick(
        rng,
        [
            ("allocate", "POST", "/v1/sessions"),
            ("step", "POST", f"{base}/step"),
            ("reset", "POST", f"{base}/reset"),
            ("observe", "POST", f"{base}/observe"),
            ("evaluate", "POST", f"{base}/evaluate"),
            ("heartbeat", "POST", f"{base}/heartbeat"),
            ("release", "DELETE", base),
        ],
    )
    body = pick(rng, BAD_JSON + NOT_OBJECTS)
    return Probe(f"{op} with body {body[:20]!r}", method, path, body)


def _env_allocate_types(rng: random.Random, t: EnvTarget) -> Probe:
    body = pick(
        rng,
        [
            {"session_id": 5},
            {"session_id": ["sess-a"]},
            {"session_id": ""},
            {"session_id": "a/b"},
            {"session_id": "../../etc/passwd"},
            {"session_id": "sess a"},
            {"session_id": "sess-a\n"},
            {"session_id": "x" * 300},
            {"session_id": "sess-\u00e9\u0000"},
            {"session_id": {"$ne": None}},
            {"runtime": 5, "session_id": f"sess-{uuid.UUID(int=rng.getrandbits(128))}"},
            {"runtime": "", "session_id": f"sess-{uuid.UUID(int=rng.getrandbits(128))}"},
            {"runtime": ["osworld"]},
        ],
    )
    return Probe(f"allocate {str(body)[:60]}", "POST", "/v1/sessions", json_body(body))


def _env_unknown(rng: random.Random, t: EnvTarget) -> Probe:
    sid = f"/v1/sessions/sess-unknown-{rng.getrandbits(64):x}"
    method, path, body = pick(
        rng,
        [
            ("POST", f"{sid}/step", {"action": {"kind": "control", "type": "WAIT"}}),
            ("POST", f"{sid}/reset", {"task_payload": TASK}),
            ("POST", f"{sid}/observe", {}),
            ("POST", f"{sid}/evaluate", {}),
            ("POST", f"{sid}/heartbeat", {}),
            ("DELETE", sid, None),
            ("GET", f"{sid}/debug", None),
            ("POST", f"{sid}/teleport", {}),
            ("GET", "/v1/nothing-here", None),
            ("PUT", "/v1/sessions", {}),
            ("PATCH", f"{sid}/step", {}),
            ("GET", f"{sid}/step", None),
            ("POST", "/healthz", {}),
        ],
    )
    data = None if body is None else json_body(body)
    return Probe(f"{method} {path.replace(sid, '<unknown>')}", method, path, data)


def _env_huge(rng: random.Random, t: EnvTarget) -> Probe:
    base, _ = _sid_path(t, rng)
    method, path = pick(
        rng,
        [
            ("POST", "/v1/sessions"),
            ("POST", f"{base}/step"),
            ("POST", f"{base}/reset"),
            ("POST", f"{base}/heartbeat"),
            ("DELETE", base),
            ("POST", "/v1/faults"),
        ],
    )
    return oversized(rng, t.max_body_bytes, method, path, f"{method} {path}")


def _env_faults(rng: random.Random, t: EnvTarget) -> Probe:
    body = pick(
        rng,
        [
            {"rules": 5},
            {"rules": None},
            {"rules": "http_503"},
            {"rules": {"op": "step"}},
            {"rules": [5]},
            {"rules": [{"op": "teleport", "kind": "http_503"}]},
            {"rules": [{"op": "step", "kind": "http_999"}]},
            {"rules": [{"op": "step", "kind": "delay", "delay_s": -1}]},
            {"rules": [{"op": "step", "kind": "http_503", "times": 0}]},
            {"rules": [{"op": "step", "kind": "http_503", "phase": "during"}]},
            {"rules": [{"op": "step", "kind": "http_503", "surprise": 1}]},
        ],
    )
    return Probe(f"faults {str(body)[:60]}", "POST", "/v1/faults", json_body(body))


def gui(command: Any) -> dict[str, Any]:
    return {"kind": "gui", "type": "pyautogui", "payload": {"command": command}}


def _env_hostile(rng: random.Random, t: EnvTarget) -> Probe:
    assert t.session_id
    command = pick(rng, hostile_commands(t.marker))
    body = {"action": gui(command), "pause": 0}
    key = f"step-{uuid.UUID(int=rng.getrandbits(128))}"
    path = f"/v1/sessions/{t.session_id}/step"
    return Probe(
        f"step command {command[:50]!r}", "POST", path, json_body(body), (("Idempotency-Key", key),)
    )


def _env_step_types(rng: random.Random, t: EnvTarget) -> Probe:
    assert t.session_id
    body = pick(
        rng,
        [
            {},
            {"action": None},
            {"action": []},
            {"action": "pyautogui.click(1, 1)"},
            {"action": {"kind": "shell", "type": "bash", "payload": {"command": "id"}}},
            {"action": {"kind": "control", "type": "REBOOT"}},
            {"action": {"kind": "control", "type": ["DONE"]}},
            {"action": {"kind": "gui", "type": "xdotool", "payload": {"command": "click 1"}}},
            {"action": {"kind": "gui", "type": "pyautogui", "payload": {}}},
            {"action": {"kind": "gui", "type": "pyautogui", "payload": "pyautogui.click(1,1)"}},
            {"action": gui(5)},
            {"action": gui(["pyautogui.click(1, 1)"])},
            {"action": gui(None)},
            {"action": gui("")},
            {"action": {"kind": "control", "type": "WAIT"}, "pause": -1},
            {"action": {"kind": "control", "type": "WAIT"}, "pause": "1"},
            {"action": {"kind": "control", "type": "WAIT"}, "pause": True},
            {"action": {"kind": "control", "type": "WAIT"}, "pause": None},
            {"action": {"kind": "control", "type": "WAIT"}, "pause": [1]},
            {"action": {"kind": "control", "type": "WAIT"}, "pause": float("nan")},
            {"action": {"kind": "control", "type": "WAIT"}, "pause": float("-inf")},
        ],
    )
    path = f"/v1/sessions/{t.session_id}/step"
    return Probe(f"step {str(body)[:70]}", "POST", path, json_body(body))


def _env_reset_types(rng: random.Random, t: EnvTarget) -> Probe:
    assert t.session_id
    payload = pick(
        rng,
        [
            None,
            [],
            "click-test",
            5,
            {},
            {"task": 5},
            {"task": None},
            {"task": "no-such-task"},
            {"task": "../../../etc/passwd"},
            {"task": "click-test\x00"},
            {"task": "CLICK-TEST"},
            {"task": "x" * 1000},
            {"env": "osworld", "task": "click-test"},
            {"env": None, "task": "click-test"},
            {"task": "click-test", "seed": True},
            {"task": "click-test", "seed": 1.5},
            {"task": "click-test", "seed": [1]},
            {"task": "click-test", "seed": {"a": 1}},
            {"task": "click-test", "seed": "s" * 101},
            {"task": "click-test", "seed": 10**120},
        ],
    )
    body = {"task_payload": payload} if rng.random() < 0.9 else {"task": "click-test"}
    path = f"/v1/sessions/{t.session_id}/reset"
    return Probe(f"reset {str(body)[:70]}", "POST", path, json_body(body))


def _env_replay(rng: random.Random, t: EnvTarget) -> Probe:
    """The first use of a key (a harmless WAIT) succeeds; its replay with another body or for
    another operation must be refused, not answered with the first result."""
    assert t.session_id
    base = f"/v1/sessions/{t.session_id}"
    key = (("Idempotency-Key", f"step-{uuid.UUID(int=rng.getrandbits(128))}"),)
    first = {"action": {"kind": "control", "type": "WAIT", "payload": {}}, "pause": 0}
    setup = Probe("first use of the key", "POST", f"{base}/step", json_body(first), key)
    other = pick(
        rng,
        [
            ("POST", f"{base}/step", {**first, "pause": 0.01}),
            ("POST", f"{base}/step", {"action": gui("pyautogui.click(5, 5)"), "pause": 0}),
            ("POST", f"{base}/step", {"action": gui(f"open('{t.marker}', 'w')")}),
            ("POST", f"{base}/observe", {}),
            ("POST", f"{base}/evaluate", {}),
            ("POST", f"{base}/reset", {"task_payload": TASK}),
        ],
    )
    method, path, body = other
    name = f"key replayed: {path.rsplit('/', 1)[-1]} {str(body)[:50]}"
    return Probe(name, method, path, json_body(body), key, setup=setup)


def _env_bad_key(rng: random.Random, t: EnvTarget) -> Probe:
    base, _ = _sid_path(t, rng)
    key = pick(rng, ["k" * 5000, "", " ", "step-\u00e9"])
    body = {"action": {"kind": "control", "type": "WAIT"}, "pause": 0}
    headers = (("Idempotency-Key", key),)
    name = f"Idempotency-Key of {len(key)} characters"
    return Probe(name, "POST", f"{base}/step", json_body(body), headers)


def _env_session_bad_body(rng: random.Random, t: EnvTarget) -> Probe:
    """Bad bodies on the live session's control calls: refused, and the session stays."""
    assert t.session_id
    base = f"/v1/sessions/{t.session_id}"
    method, path = pick(rng, [("DELETE", base), ("POST", f"{base}/heartbeat")])
    body = pick(rng, NOT_OBJECTS + BAD_JSON[:4])
    return Probe(f"{method} {path.rsplit('/', 1)[-1]} body {body[:20]!r}", method, path, body)


def env_probes(
    target: EnvTarget,
) -> list[tuple[Callable[[random.Random, EnvTarget], Probe], float]]:
    """(probe maker, weight) for this target."""
    makers: list[tuple[Callable[[random.Random, EnvTarget], Probe], float]] = [
        (_env_bad_json, 3.0),
        (_env_allocate_types, 2.0),
        (_env_unknown, 2.0),
        (_env_huge, 1.0),
        (_env_bad_key, 0.5),
    ]
    if target.fault_api:
        makers.append((_env_faults, 1.0))
    if target.session_id:
        makers += [
            (_env_hostile, 3.0),
            (_env_step_types, 2.0),
            (_env_reset_types, 2.0),
            (_env_replay, 1.5),
            (_env_session_bad_body, 1.0),
        ]
    return makers


def env_probe(rng: random.Random, target: EnvTarget) -> Probe:
    return choose(rng, env_probes(target), target)


def env_error_named(data: Any) -> bool:
    return (
        isinstance(data, dict)
        and data.get("ok") is False
        and isinstance(data.get("error"), str)
        and len(data["error"].strip()) > 3
    )


async def env_session(http: aiohttp.ClientSession, url: str) -> str:
    """A session with a fresh click-test episode (the fuzzed one)."""
    sid = f"sess-fuzz-{uuid.uuid4().hex[:12]}"
    for _ in range(240):
        async with http.post(f"{url}/v1/sessions", json={"session_id": sid}) as r:
            data = await r.json()
        if not data.get("pending"):
            break
        await asyncio.sleep(float(data.get("retry_after_seconds", 0.5)))
    assert data.get("sessions"), f"allocate failed: {data}"
    async with http.post(f"{url}/v1/sessions/{sid}/reset", json={"task_payload": TASK}) as r:
        assert r.status == 200, await r.text()
    return sid


async def env_healthy(http: aiohttp.ClientSession, url: str, target: EnvTarget) -> list[str]:
    """Problems with the env server after the fuzz ([] = healthy)."""
    problems = []
    status, _ = await send(http, url, Probe("healthz", "GET", "/healthz"))
    if status != 200:
        problems.append(f"env /healthz answered {status}")
    if target.session_id:
        base = f"/v1/sessions/{target.session_id}"
        status, data = await send(http, url, Probe("observe", "POST", f"{base}/observe", b"{}"))
        if status != 200 or not data["observation"]["modalities"]["screenshot"]:
            problems.append(f"the fuzzed session no longer observes: {status} {str(data)[:200]}")
        status, data = await send(http, url, Probe("debug", "GET", f"{base}/debug"))
        if status != 200 or data.get("total_actions") != 0:
            problems.append(f"GUI actions were executed: {str(data)[:200]}")
    if Path(target.marker).exists():
        problems.append(f"a hostile command created {target.marker}")
    return problems


async def _has_fault_api(url: str) -> bool:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/v1/faults") as r:
        return r.status == 200


@contextlib.contextmanager
def started_env(args: argparse.Namespace) -> Iterator[tuple[str, int, bool]]:
    """(url, max_body_bytes, fault_api) of the given env server or of one started here."""
    if args.env_url:
        url = check_loopback(args.env_url)
        yield url, args.env_max_body_bytes, asyncio.run(_has_fault_api(url))
        return
    from env_client.config import EmbeddedEnvConfig
    from env_client.server import start_embedded_server

    # One session for the env fuzz, one for the live episode of a demo served here.
    capacity = 1 if args.no_demo or args.demo_url else 2
    cfg = EmbeddedEnvConfig(capacity=capacity, prewarm=capacity, fault_api=True)
    with start_embedded_server(cfg) as server:
        print(f"env server {server.url} (log {server.log_path})", flush=True)
        yield server.url, cfg.max_body_bytes, True
