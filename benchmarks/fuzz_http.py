"""Bounded fuzzing of every HTTP surface we serve: the environment server, the OpenAI endpoint
and the demo app.

    python benchmarks/fuzz_http.py --requests 400 --seed 0   # starts all three (see below)
    python benchmarks/fuzz_http.py --env-url http://127.0.0.1:8765 --no-openai --no-demo
    python benchmarks/fuzz_http.py --openai-url http://127.0.0.1:8000/policy --no-env --no-demo
    python benchmarks/fuzz_http.py --demo-url http://127.0.0.1:8000/demo --no-env --no-openai

A surface without a URL is started here: an embedded env server, a tiny policy on Ray Serve, and
the demo's FastAPI app under uvicorn in this process (no Ray, no models; its live episode runs
on the env server of this fuzz, none with ``--no-env``; its viewer reads a temporary runs folder
holding one fuzz run). Loopback only: a URL that is not 127.0.0.1/localhost is refused. Exactly
``--requests`` probes are drawn with a seeded RNG (same seed, same probes) and sent one at a
time; then it stops. Every probe is bad input: malformed JSON, wrong types, bodies over the
server's limit (with and without Content-Length), unknown ids, routes and methods,
Idempotency-Keys replayed with a different body, pyautogui commands that try to leave the
whitelist, run names and step ids that try to leave the runs folder (``..``, ``%2e%2e``,
encoded slashes), unknown episode commands, out-of-range temperatures. Each must be answered
4xx with a JSON error that names the problem (env and demo: ``{"ok": false, "error": …}``;
OpenAI: ``{"error": {"message": …}}``), never 5xx. Afterwards every server must still be
healthy: ``/healthz`` ok, the env session still observes and has executed no GUI action, no
file a hostile probe names exists, the policy still answers a real chat completion, the demo's
``/api/status`` answers, no probe started a demo episode and the live one is still ready and
unstepped.

A probe may carry a set-up request (e.g. the first use of an Idempotency-Key, a heartbeat that
keeps the fuzzed session alive); set-ups must succeed and are not counted. The last line is
``fuzz: requests=<n> 4xx=<n> 5xx=<n> other=<n> healthy=<yes|no>`` (other: 2xx/3xx, a 4xx
without a proper JSON error, or a transport error); the exit status is 1 unless 5xx=0,
other=0 and healthy=yes.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import io
import json
import random
import struct
import sys
import tempfile
import uuid
import zlib
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

# The checkout root goes first: benchmarks/ holds a script named env_client.py, which would
# otherwise shadow the env_client package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp
import yarl

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
TASK = {"id": "fuzz", "instruction": "fuzz", "env": "miniwob", "task": "click-test", "seed": 1}


@dataclass(frozen=True)
class Probe:
    """One HTTP request; ``path`` is relative to its target's base URL."""

    name: str  # what it tries (printed when the answer is wrong)
    method: str
    path: str
    body: bytes | None = None
    headers: tuple[tuple[str, str], ...] = ()
    chunked: bool = False  # stream the body without Content-Length
    setup: Probe | None = None  # sent first; must answer 2xx; not counted
    expect: int | None = None  # the status a named refusal must have (None: any 4xx)


@dataclass
class EnvTarget:
    """The environment server under fuzz; ``session_id``: a live session with an episode
    (None: only probes that need no session)."""

    max_body_bytes: int
    session_id: str | None = None
    fault_api: bool = False
    marker: str = "/tmp/fuzz-http-pwned"


@dataclass
class OpenAITarget:
    """The OpenAI-compatible endpoint under fuzz (``model``: the served model id)."""

    model: str
    max_body_bytes: int


@dataclass
class DemoTarget:
    """The demo app under fuzz (its base URL is the route prefix, e.g. ``…:8000/demo``);
    ``episode_id``: a live episode no probe may change (None: only probes that need none);
    ``run``/``sample_id``: a run folder and one of its steps (None: the viewer shows none);
    ``others``: the episodes it had before the fuzz; ``runs_dir``: its runs folder."""

    max_body_bytes: int
    max_instruction_chars: int = 2000
    episode_id: str | None = None
    run: str | None = None
    sample_id: str | None = None
    marker: str = "/tmp/fuzz-http-pwned"
    runs_dir: str | None = None
    others: frozenset[str] = frozenset()


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()


def _pick(rng: random.Random, options: list[Any]) -> Any:
    return options[rng.randrange(len(options))]


# Bodies that are not JSON objects at all (the same for every surface).
BAD_JSON = [
    b"{",
    b'{"session_id": ',
    b"[1, 2",
    b"\xff\xfe\x00garbage",
    b"{'single': 'quotes'}",
    b"nan",
    b"{" * 5000,  # unbalanced deep nesting
    b"[" * 100_000 + b"]" * 100_000,  # balanced, deep enough to exhaust a recursive parser
    b'{"a": 1}{"b": 2}',
    b"1" * 5000,  # an integer too long to convert
]
NOT_OBJECTS = [b"[]", b"[{}]", b'"text"', b"42", b"null", b"true", b"3.5"]


# --- environment server -----------------------------------------------------------------------


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
    op, method, path = _pick(
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
    body = _pick(rng, BAD_JSON + NOT_OBJECTS)
    return Probe(f"{op} with body {body[:20]!r}", method, path, body)


def _env_allocate_types(rng: random.Random, t: EnvTarget) -> Probe:
    body = _pick(
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
    return Probe(f"allocate {str(body)[:60]}", "POST", "/v1/sessions", _json(body))


def _env_unknown(rng: random.Random, t: EnvTarget) -> Probe:
    sid = f"/v1/sessions/sess-unknown-{rng.getrandbits(64):x}"
    method, path, body = _pick(
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
    data = None if body is None else _json(body)
    return Probe(f"{method} {path.replace(sid, '<unknown>')}", method, path, data)


def _huge(rng: random.Random, limit: int) -> tuple[bytes, bool]:
    size = limit + 1 + rng.randrange(limit)
    filler = {"pad": "x" * size}
    return _json(filler), rng.random() < 0.5


def _env_huge(rng: random.Random, t: EnvTarget) -> Probe:
    base, _ = _sid_path(t, rng)
    method, path = _pick(
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
    body, chunked = _huge(rng, t.max_body_bytes)
    how = "chunked" if chunked else "with Content-Length"
    return Probe(f"{len(body)} bytes {how} to {method} {path}", method, path, body, chunked=chunked)


def _env_faults(rng: random.Random, t: EnvTarget) -> Probe:
    body = _pick(
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
    return Probe(f"faults {str(body)[:60]}", "POST", "/v1/faults", _json(body))


def gui(command: Any) -> dict[str, Any]:
    return {"kind": "gui", "type": "pyautogui", "payload": {"command": command}}


def _env_hostile(rng: random.Random, t: EnvTarget) -> Probe:
    assert t.session_id
    command = _pick(rng, hostile_commands(t.marker))
    body = {"action": gui(command), "pause": 0}
    key = f"step-{uuid.UUID(int=rng.getrandbits(128))}"
    path = f"/v1/sessions/{t.session_id}/step"
    return Probe(
        f"step command {command[:50]!r}", "POST", path, _json(body), (("Idempotency-Key", key),)
    )


def _env_step_types(rng: random.Random, t: EnvTarget) -> Probe:
    assert t.session_id
    body = _pick(
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
    return Probe(f"step {str(body)[:70]}", "POST", path, _json(body))


def _env_reset_types(rng: random.Random, t: EnvTarget) -> Probe:
    assert t.session_id
    payload = _pick(
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
    return Probe(f"reset {str(body)[:70]}", "POST", path, _json(body))


def _env_replay(rng: random.Random, t: EnvTarget) -> Probe:
    """The first use of a key (a harmless WAIT) succeeds; its replay with another body or for
    another operation must be refused, not answered with the first result."""
    assert t.session_id
    base = f"/v1/sessions/{t.session_id}"
    key = (("Idempotency-Key", f"step-{uuid.UUID(int=rng.getrandbits(128))}"),)
    first = {"action": {"kind": "control", "type": "WAIT", "payload": {}}, "pause": 0}
    setup = Probe("first use of the key", "POST", f"{base}/step", _json(first), key)
    other = _pick(
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
    return Probe(name, method, path, _json(body), key, setup=setup)


def _env_bad_key(rng: random.Random, t: EnvTarget) -> Probe:
    base, _ = _sid_path(t, rng)
    key = _pick(rng, ["k" * 5000, "", " ", "step-\u00e9"])
    body = {"action": {"kind": "control", "type": "WAIT"}, "pause": 0}
    headers = (("Idempotency-Key", key),)
    name = f"Idempotency-Key of {len(key)} characters"
    return Probe(name, "POST", f"{base}/step", _json(body), headers)


def _env_session_bad_body(rng: random.Random, t: EnvTarget) -> Probe:
    """Bad bodies on the live session's control calls: refused, and the session stays."""
    assert t.session_id
    base = f"/v1/sessions/{t.session_id}"
    method, path = _pick(rng, [("DELETE", base), ("POST", f"{base}/heartbeat")])
    body = _pick(rng, NOT_OBJECTS + BAD_JSON[:4])
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
    makers = env_probes(target)
    maker = rng.choices([m for m, _ in makers], weights=[w for _, w in makers])[0]
    return maker(rng, target)


def env_error_named(data: Any) -> bool:
    return (
        isinstance(data, dict)
        and data.get("ok") is False
        and isinstance(data.get("error"), str)
        and len(data["error"].strip()) > 3
    )


# --- OpenAI endpoint --------------------------------------------------------------------------


def _png(size: tuple[int, int] = (8, 8)) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, (10, 20, 30)).save(buf, "PNG")
    return buf.getvalue()


def _png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` (a decompression bomb's header)."""
    raw = bytearray(_png((1, 1)))
    ihdr = struct.pack(">II", width, height) + bytes(raw[24:29])
    raw[16:29] = ihdr
    raw[29:33] = struct.pack(">I", zlib.crc32(b"IHDR" + ihdr) & 0xFFFFFFFF)
    return bytes(raw)


def _data_url(raw: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(raw).decode()}"


def _chat(model: str, **over: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **over}


def _image_message(url: Any) -> dict[str, Any]:
    return {
        "role": "user",
        "content": [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": url}],
    }


def _oai_bad_json(rng: random.Random, t: OpenAITarget) -> Probe:
    body = _pick(rng, BAD_JSON + NOT_OBJECTS)
    return Probe(f"chat with body {body[:20]!r}", "POST", "/v1/chat/completions", body)


def _oai_types(rng: random.Random, t: OpenAITarget) -> Probe:
    m = t.model
    body = _pick(
        rng,
        [
            {"messages": [{"role": "user", "content": "hi"}]},
            {"model": m},
            {"model": 5, "messages": [{"role": "user", "content": "hi"}]},
            {"model": m, "messages": "hi"},
            {"model": m, "messages": []},
            {"model": m, "messages": [None]},
            {"model": m, "messages": [{"role": "robot", "content": "hi"}]},
            {"model": m, "messages": [{"content": "hi"}]},
            {"model": m, "messages": [{"role": "user", "content": 5}]},
            {"model": m, "messages": [{"role": "user", "content": [{"type": "video"}]}]},
            {"model": m, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
            _chat(m, temperature="hot"),
            _chat(m, temperature=-1),
            _chat(m, temperature=5),
            _chat(m, temperature=float("nan")),
            _chat(m, top_p=0),
            _chat(m, top_p=2),
            _chat(m, max_tokens=0),
            _chat(m, max_tokens=-5),
            _chat(m, max_tokens="many"),
            _chat(m, max_tokens=10**12),
            _chat(m, max_completion_tokens=10**30),
            _chat(m, seed=-1),
            _chat(m, seed=2**70),
            _chat(m, seed=1.5),
            _chat(m, n=3),
            _chat(m, n=0),
            _chat(m, stream="maybe"),
            _chat(m, logprobs="x"),
            _chat(m, top_logprobs=50),
            _chat(m, top_logprobs=3),
            _chat(m, stop=["\n"]),
            _chat(m, stop=5),
            _chat(m, tools=[{"type": "function"}]),
        ],
    )
    return Probe(f"chat {str(body)[:80]}", "POST", "/v1/chat/completions", _json(body))


def _oai_images(rng: random.Random, t: OpenAITarget) -> Probe:
    url = _pick(
        rng,
        [
            {"url": "http://127.0.0.1:1/a.png"},
            {"url": "file:///etc/passwd"},
            "https://example.com/x.png",
            {"url": "data:image/png;base64,@@@@"},
            {"url": "data:image/png;base64," + "A" * 7},
            {"url": _data_url(b"definitely not an image")},
            {"url": _data_url(_png()[:40])},  # a truncated PNG
            {"url": _data_url(_png_claiming(100_000, 100_000))},
            {"url": _data_url(_png_claiming(1, 10_000_000))},
            {"url": _data_url(_png_claiming(0, 0))},
            {"url": _data_url(_png(), "text/html")},
            {"url": 5},
            {},
            None,
        ],
    )
    body = {"model": t.model, "messages": [_image_message(url)], "max_tokens": 2}
    shown = str(url)[:60]
    return Probe(f"chat image {shown}", "POST", "/v1/chat/completions", _json(body))


def _oai_unknown(rng: random.Random, t: OpenAITarget) -> Probe:
    method, path, body = _pick(
        rng,
        [
            ("POST", "/v1/chat/completions", _chat(f"no-such-model-{rng.randrange(99)}")),
            ("GET", f"/v1/models/no-such-model-{rng.randrange(99)}", None),
            ("GET", "/v1/chat/completions", None),
            ("PUT", "/v1/models", {}),
            ("POST", "/v1/completions", {"model": t.model, "prompt": "hi"}),
            ("POST", "/v1/embeddings", {"model": t.model, "input": "hi"}),
            ("GET", "/v1/nothing-here", None),
            ("DELETE", "/v1/weights", None),
        ],
    )
    data = None if body is None else _json(body)
    return Probe(f"{method} {path}", method, path, data)


def _oai_huge(rng: random.Random, t: OpenAITarget) -> Probe:
    body, chunked = _huge(rng, t.max_body_bytes)
    how = "chunked" if chunked else "with Content-Length"
    return Probe(
        f"{len(body)} bytes {how} to chat", "POST", "/v1/chat/completions", body, chunked=chunked
    )


def openai_probe(rng: random.Random, target: OpenAITarget) -> Probe:
    makers = [(_oai_bad_json, 2.0), (_oai_types, 4.0), (_oai_images, 2.0), (_oai_unknown, 1.5),
              (_oai_huge, 0.7)]  # fmt: skip
    maker = rng.choices([m for m, _ in makers], weights=[w for _, w in makers])[0]
    return maker(rng, target)


def openai_error_named(data: Any) -> bool:
    err = data.get("error") if isinstance(data, dict) else None
    return isinstance(err, dict) and isinstance(err.get("message"), str) and len(err["message"]) > 3


# --- demo app ---------------------------------------------------------------------------------


def _seg(value: str) -> str:
    """``value`` as one URL path segment (paths are sent as written, see :func:`send`)."""
    return quote(value, safe="")


def traversals(marker: str) -> list[str]:
    """Path segments, as sent (already URL-encoded), that try to leave the runs folder or to
    name a file outside it; a decoded ``/`` splits the segment, so the route must not match."""
    return [
        "..",
        "%2e%2e",
        "%2E%2E",
        ".%2e",
        "..%2f..%2fetc%2fpasswd",
        "%2e%2e%2f%2e%2e%2f%2e%2e%2fetc%2fpasswd",
        "..%5c..%5cwindows%5cwin.ini",
        "%252e%252e%252fetc%252fpasswd",  # encoded twice
        "..%c0%af..%c0%afetc%c0%afpasswd",  # overlong UTF-8 slashes
        "....%2f%2f....%2f%2fetc%2fpasswd",
        "%2fetc%2fpasswd",
        _seg(marker),
        "..%2f" * 8 + _seg(marker.lstrip("/")),
        "%00",
        "run%00.parquet",
        "%0a",
        "~root",
        ".hidden",
        "-rf",
        "%C3%A9" * 40,
        "x" * 300,
    ]


def _episode(rng: random.Random, t: DemoTarget) -> tuple[str, bool]:
    """(episode id as a path segment, live): the fuzzed episode or one the demo never had."""
    if t.episode_id and rng.random() < 0.6:
        return t.episode_id, True
    odd = ["..", "%2e%2e", "%00", "null", "-1", "%C3%A9", "x" * 300, "abc%20123"]
    return _pick(rng, [f"{rng.getrandbits(48):012x}", *odd]), False


def _demo_bad_json(rng: random.Random, t: DemoTarget) -> Probe:
    eid, _ = _episode(rng, t)
    method, path = _pick(
        rng, [("POST", "/api/episodes"), ("PUT", f"/api/episodes/{eid}/temperature")]
    )
    body = _pick(rng, BAD_JSON + NOT_OBJECTS)
    return Probe(f"{method} {path[:40]} with body {body[:20]!r}", method, path, body)


def _demo_start_types(rng: random.Random, t: DemoTarget) -> Probe:
    """Start bodies that are each invalid: none may allocate an episode."""
    task = str(TASK["task"])
    hostile = _pick(rng, hostile_commands(t.marker)[:6])
    body = _pick(
        rng,
        [
            {},
            {"task": None},
            {"task": 5},
            {"task": ""},
            {"task": [task]},
            {"task": {"$ne": None}},
            {"task": "x" * 201},
            {"task": "no-such-task"},
            {"task": "../../etc/passwd"},
            {"task": task + "\x00"},
            {"task": task.upper()},
            {"task": task, "split": None},
            {"task": task, "split": 5},
            {"task": task, "split": ""},
            {"task": task, "split": "../../etc"},
            {"task": task, "split": "no-such-split"},
            {"task": task, "seed": -1},
            {"task": task, "seed": 2**31},
            {"task": task, "seed": 10**120},
            {"task": task, "seed": 1.5},
            {"task": task, "seed": 1.0},
            {"task": task, "seed": True},
            {"task": task, "seed": "1"},
            {"task": task, "seed": [1]},
            {"task": task, "temperature": -0.01},
            {"task": task, "temperature": 10.01},
            {"task": task, "temperature": float("nan")},
            {"task": task, "temperature": float("inf")},
            {"task": task, "temperature": "0.5"},
            {"task": task, "temperature": True},
            {"task": task, "temperature": [0.5]},
            {"task": task, "instruction": 5},
            {"task": task, "instruction": ["click"]},
            {"task": task, "instruction": "y" * (t.max_instruction_chars + 1)},
            {"task": task, "colour": 1},
            {"task": task, "session_id": "sess-fuzz"},
            {"task": task, "env_url": "http://127.0.0.1:1"},
            {"task": "no-such-task", "instruction": hostile},
        ],
    )
    return Probe(f"start {str(body)[:70]}", "POST", "/api/episodes", _json(body))


def _demo_temperature(rng: random.Random, t: DemoTarget) -> Probe:
    eid, _ = _episode(rng, t)
    body = _pick(
        rng,
        [
            {"temperature": -1},
            {"temperature": 10.01},
            {"temperature": 1e6},
            {"temperature": float("nan")},
            {"temperature": float("inf")},
            {"temperature": float("-inf")},
            {"temperature": "hot"},
            {"temperature": "0.5"},
            {"temperature": True},
            {"temperature": [0.5]},
            {"temperature": {"value": 1}},
            {"temperature": 0.5, "extra": 1},
            {"temp": 0.5},
        ],
    )
    path = f"/api/episodes/{eid}/temperature"
    return Probe(f"temperature {str(body)[:60]}", "PUT", path, _json(body))


BAD_COMMANDS = [
    "STEP", "Run", "teleport", "shutdown", "delete", "reset", "temperature", "stop.json",
    "step%20", "%20stop", "stop%00", "stop%0a", "step%3Bstop", "run%3Fnow=1", "pause&stop",
    "%2e%2e", "..", "x" * 300, "%C3%A9",
]  # fmt: skip


def _demo_command(rng: random.Random, t: DemoTarget) -> Probe:
    """Unknown commands, valid ones on episodes that do not exist, and valid ones on the live
    episode with a query that fails validation (so the command must not run)."""
    eid, live = _episode(rng, t)
    command = _pick(rng, BAD_COMMANDS + ([] if live else ["step", "run", "pause", "stop"]))
    if live and rng.random() < 0.3:
        command = _pick(rng, ["step", "run", "stop"]) + _pick(
            rng, ["?since=abc", "?since=1.5", "?since=", "?since=%00"]
        )
    shown = "<live>" if live else "<unknown>"
    return Probe(f"POST episode {shown} {command[:40]}", "POST", f"/api/episodes/{eid}/{command}")


def _demo_poll(rng: random.Random, t: DemoTarget) -> Probe:
    eid, live = _episode(rng, t)
    since = _pick(rng, ["abc", "1.5", "1e3", "", "%00", "true", "-", "0x10"])
    query = f"?since={since}" if live or rng.random() < 0.5 else ""
    return Probe(f"poll episode {query or eid[:20]}", "GET", f"/api/episodes/{eid}{query}")


def _demo_unknown(rng: random.Random, t: DemoTarget) -> Probe:
    eid, _ = _episode(rng, t)
    run = _seg(t.run or "fuzz-run")
    method, path = _pick(
        rng,
        [
            ("GET", "/api/nothing-here"),
            ("GET", "/api"),
            ("GET", "/api/episodes"),
            ("DELETE", f"/api/episodes/{eid}"),
            ("PATCH", f"/api/episodes/{eid}/temperature"),
            ("GET", f"/api/episodes/{eid}/stop"),
            ("GET", f"/api/episodes/{eid}/steps/0"),
            ("PUT", "/api/status"),
            ("POST", "/api/info"),
            ("DELETE", "/api/runs"),
            ("POST", f"/api/runs/{run}/steps"),
            ("OPTIONS", "/api/status"),
            ("TRACE", "/api/info"),
            ("GET", "/page.html"),
            ("GET", "/.env"),
            ("GET", "/api/../../etc/passwd"),
            ("GET", "/%2e%2e/%2e%2e/etc/passwd"),
            ("GET", "/static/..%2f..%2fworkflows%2fdemo%2fapi.py"),
        ],
    )
    return Probe(f"{method} {path[:60]}", method, path)


def _demo_runs(rng: random.Random, t: DemoTarget) -> Probe:
    """Runs that do not exist or try to leave the runs folder."""
    run = _pick(rng, [f"no-such-run-{rng.randrange(99)}", *traversals(t.marker)])
    sample = _seg(t.sample_id or "g0-e0-s0")
    path = _pick(
        rng,
        [
            f"/api/runs/{run}/steps",
            f"/api/runs/{run}/steps?only=failures&version=0",
            f"/api/runs/{run}/steps/{sample}",
            f"/api/runs/{run}/steps/{sample}/screenshots/0",
        ],
    )
    return Probe(f"run {run[:50]}", "GET", path)


def _demo_run_steps(rng: random.Random, t: DemoTarget) -> Probe:
    """The existing run: bad selections, steps that do not exist or try to leave the folder,
    screenshots past the step's."""
    assert t.run
    base = f"/api/runs/{_seg(t.run)}/steps"
    bad = _pick(rng, [f"g9-e9-s{rng.randrange(99)}", *traversals(t.marker)])
    query = _pick(
        rng,
        ["version=abc", "version=1.5", "version=", "version=%00", "only=bogus", "only=",
         "only=..%2f..%2fetc%2fpasswd", "only=gate&version=x"],
    )  # fmt: skip
    options = [f"{base}?{query}", f"{base}/{bad}", f"{base}/{bad}/screenshots/0"]
    if t.sample_id:
        k = _pick(rng, ["-1", "1000000", str(2**63), str(10**30), "abc", "1.5", "0x1", "%00"])
        options.append(f"{base}/{_seg(t.sample_id)}/screenshots/{k}")
    path = _pick(rng, options)
    return Probe(f"steps {path[len(base) :][:60]}", "GET", path)


def _demo_huge(rng: random.Random, t: DemoTarget) -> Probe:
    """Bodies over the limit, even to routes that read none (refused before the app runs: a
    stop of the live episode would show in the health check)."""
    eid, _ = _episode(rng, t)
    method, path = _pick(
        rng,
        [
            ("POST", "/api/episodes"),
            ("PUT", f"/api/episodes/{eid}/temperature"),
            ("POST", f"/api/episodes/{eid}/stop"),
            ("POST", f"/api/episodes/{eid}/teleport"),
            ("GET", "/api/status"),
            ("POST", "/api/nothing-here"),
        ],
    )
    body, chunked = _huge(rng, t.max_body_bytes)
    how = "chunked" if chunked else "with Content-Length"
    name = f"{len(body)} bytes {how} to {method} {path[:40]}"
    return Probe(name, method, path, body, chunked=chunked, expect=413)


def _demo_content_type(rng: random.Random, t: DemoTarget) -> Probe:
    """A valid body under a Content-Type that is not JSON: refused, not parsed anyway."""
    eid, _ = _episode(rng, t)
    method, path, body = _pick(
        rng,
        [
            ("POST", "/api/episodes", {"task": TASK["task"], "seed": 1}),
            ("PUT", f"/api/episodes/{eid}/temperature", {"temperature": 0.5}),
        ],
    )
    kind = _pick(
        rng,
        ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
         "application/xml", "image/png"],
    )  # fmt: skip
    headers = (("Content-Type", kind),)
    return Probe(f"{method} {path[:40]} as {kind}", method, path, _json(body), headers)


def demo_probes(
    target: DemoTarget,
) -> list[tuple[Callable[[random.Random, DemoTarget], Probe], float]]:
    """(probe maker, weight) for this target."""
    makers: list[tuple[Callable[[random.Random, DemoTarget], Probe], float]] = [
        (_demo_bad_json, 2.0),
        (_demo_start_types, 3.0),
        (_demo_temperature, 1.5),
        (_demo_command, 2.0),
        (_demo_poll, 1.0),
        (_demo_unknown, 1.5),
        (_demo_runs, 2.0),
        (_demo_huge, 1.0),
        (_demo_content_type, 0.7),
    ]
    if target.run:
        makers.append((_demo_run_steps, 1.5))
    return makers


def demo_probe(rng: random.Random, target: DemoTarget) -> Probe:
    makers = demo_probes(target)
    maker = rng.choices([m for m, _ in makers], weights=[w for _, w in makers])[0]
    return maker(rng, target)


def demo_error_named(data: Any) -> bool:
    """The demo's error shape, ``{"ok": false, "error": "<what and why>"}`` (the env's)."""
    return env_error_named(data)


# --- sending and judging ----------------------------------------------------------------------


@dataclass
class Tally:
    counts: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)

    def line(self, healthy: bool) -> str:
        c = self.counts
        return (
            f"fuzz: requests={sum(c.values())} 4xx={c['4xx']} 5xx={c['5xx']} "
            f"other={c['other']} healthy={'yes' if healthy else 'no'}"
        )


async def _chunks(body: bytes, size: int = 64 * 1024) -> AsyncIterator[bytes]:
    for i in range(0, len(body), size):
        yield body[i : i + size]


async def send(
    http: aiohttp.ClientSession, base: str, probe: Probe, timeout_s: float = 60.0
) -> tuple[int, Any]:
    """(status, parsed JSON or the raw text); status 0 for a transport error. The path is sent
    as written (``..`` and ``%2e%2e`` reach the server as they are) and redirects are answers,
    not followed."""
    headers = dict(probe.headers)
    if probe.body is not None:
        headers.setdefault("Content-Type", "application/json")
    data: Any = _chunks(probe.body) if probe.chunked and probe.body else probe.body
    url = yarl.URL(base + probe.path, encoded=True)
    try:
        async with http.request(
            probe.method, url, data=data, headers=headers, allow_redirects=False,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as resp:  # fmt: skip
            raw = await resp.read()
            status = resp.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        return 0, f"{type(exc).__name__}: {exc}"
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw[:300].decode("utf-8", "replace")


def judge(status: int, data: Any, named: Callable[[Any], bool]) -> str:
    """'4xx' (a 4xx with a JSON error naming the problem), '5xx' or 'other'."""
    if 500 <= status < 600:
        return "5xx"
    if 400 <= status < 500 and named(data):
        return "4xx"
    return "other"


async def run_probes(
    http: aiohttp.ClientSession,
    probes: Iterator[tuple[str, Probe, Callable[[Any], bool]]],
    tally: Tally,
    verbose: bool = False,
) -> None:
    """Send each (base URL, probe, error check); count and record what went wrong."""
    for base, probe, named in probes:
        if probe.setup is not None:
            status, data = await send(http, base, probe.setup)
            if not 200 <= status < 300:
                tally.failures.append(f"set-up of {probe.name}: {status} {str(data)[:200]}")
        status, data = await send(http, base, probe)
        verdict = judge(status, data, named)
        if verdict == "4xx" and probe.expect not in (None, status):
            verdict = "other"  # refused, but not as this probe must be (e.g. 413 unparsed)
        tally.counts[verdict] += 1
        if verdict != "4xx":
            tally.failures.append(f"{verdict} {status} for {probe.name}: {str(data)[:300]}")
        elif verbose:
            print(f"  {status} {probe.name}: {str(data)[:120]}", flush=True)


def draw(
    rng: random.Random,
    n: int,
    env: tuple[str, EnvTarget] | None,
    openai: tuple[str, OpenAITarget] | None,
    demo: tuple[str, DemoTarget] | None = None,
) -> Iterator[tuple[str, Probe, Callable[[Any], bool]]]:
    """``n`` probes over the given targets, alternating at random (seeded)."""
    targets: list[tuple[str, Any]] = [t for t in (env, openai, demo) if t is not None]
    for _ in range(n):
        base, target = targets[rng.randrange(len(targets))]
        if isinstance(target, EnvTarget):
            yield base, env_probe(rng, target), env_error_named
        elif isinstance(target, OpenAITarget):
            yield base, openai_probe(rng, target), openai_error_named
        else:
            yield base, demo_probe(rng, target), demo_error_named


# --- the servers: start, keep alive, check ----------------------------------------------------


def check_loopback(url: str) -> str:
    host = urlsplit(url).hostname
    if host not in LOOPBACK:
        raise SystemExit(f"fuzz_http only talks to loopback servers, not {host!r}")
    return url.rstrip("/")


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


async def openai_healthy(http: aiohttp.ClientSession, url: str, target: OpenAITarget) -> list[str]:
    problems = []
    status, _ = await send(http, url, Probe("healthz", "GET", "/healthz"))
    if status != 200:
        problems.append(f"OpenAI /healthz answered {status}")
    body = _json(_chat(target.model, max_tokens=2, temperature=0))
    status, data = await send(http, url, Probe("chat", "POST", "/v1/chat/completions", body))
    if status != 200 or not isinstance(data, dict) or "choices" not in data:
        problems.append(f"a valid chat completion failed: {status} {str(data)[:200]}")
    return problems


async def demo_target(
    http: aiohttp.ClientSession,
    url: str,
    max_body_bytes: int,
    marker: str,
    episode: bool,
) -> DemoTarget:
    """The demo under fuzz as it answers now: its instruction limit and runs folder, a run and
    a step its viewer shows, the episodes it already has and (``episode``) a live episode
    started here on the env fuzz's task, which no probe may step, stop or change (none when
    the demo cannot start one: the probes that need it are left out)."""
    status, info = await send(http, url, Probe("info", "GET", "/api/info"))
    assert status == 200, f"demo /api/info answered {status}: {str(info)[:300]}"
    target = DemoTarget(max_body_bytes, info["max_instruction_chars"], marker=marker)
    target.runs_dir = info["runs_dir"]
    _, runs = await send(http, url, Probe("runs", "GET", "/api/runs"))
    for run in runs["runs"][:3]:
        path = f"/api/runs/{_seg(run['name'])}/steps"
        _, sel = await send(http, url, Probe("steps", "GET", path))
        if isinstance(sel, dict) and sel.get("steps"):
            target.run, target.sample_id = run["name"], sel["steps"][0]["sample_id"]
            break
    if episode:
        tasks = info["tasks"]
        split = "train" if "train" in tasks else next(iter(tasks))
        task = TASK["task"] if TASK["task"] in tasks[split] else tasks[split][0]
        body = _json({"task": task, "split": split, "seed": TASK["seed"]})
        probe = Probe("start", "POST", "/api/episodes", body)
        status, data = await send(http, url, probe, timeout_s=180)
        if status == 201:
            target.episode_id = data["id"]
        else:  # e.g. every desktop taken: the fuzz goes on without live-episode probes
            print(
                f"demo: no live episode; its start answered {status}: {str(data)[:200]}", flush=True
            )
    # Read last, so that a failed start's own (ended) episode is not taken for a probe's.
    _, live = await send(http, url, Probe("status", "GET", "/api/status"))
    target.others = frozenset(e["id"] for e in live["episodes"]) - {target.episode_id}
    return target


async def demo_healthy(http: aiohttp.ClientSession, url: str, target: DemoTarget) -> list[str]:
    """Problems with the demo after the fuzz ([] = healthy): /api/status answers, no probe
    started an episode or stepped, stopped or changed the live one, no file a probe names
    exists."""
    problems = []
    status, data = await send(http, url, Probe("status", "GET", "/api/status"))
    if status != 200 or not isinstance(data, dict) or "episodes" not in data:
        problems.append(f"demo /api/status answered {status}: {str(data)[:200]}")
    else:
        known = target.others | {target.episode_id}
        started = [e for e in data["episodes"] if e["id"] not in known]
        if started:
            problems.append(f"probes started demo episodes: {str(started)[:200]}")
    if target.episode_id:
        path = f"/api/episodes/{target.episode_id}"
        status, data = await send(http, url, Probe("poll", "GET", path))
        view = data if isinstance(data, dict) else {}
        if status != 200 or view.get("state") != "ready" or view.get("num_steps") != 0:
            problems.append(f"the fuzzed demo episode changed: {status} {str(data)[:200]}")
        if view.get("temperature") is not None:
            problems.append(f"a probe set the fuzzed episode's temperature: {view['temperature']}")
    name = Path(target.marker).name
    runs = Path(target.runs_dir) if target.runs_dir else None
    created = [Path(target.marker)] if Path(target.marker).exists() else []
    if runs is not None and runs.is_dir():
        created += list(runs.rglob(f"*{name}*"))
    if created:
        problems.append(f"files a probe named exist: {[str(p) for p in created[:5]]}")
    return problems


def write_fuzz_run(runs_dir: Path) -> None:
    """A run folder holding one real step sample (every field zero or empty but its ids and
    one screenshot), so that probes reach the viewer's look-up of steps and screenshots."""
    import pyarrow as pa

    from train_loops.schema import STEP_SAMPLE_SCHEMA, write_parquet

    def empty(kind: pa.DataType) -> Any:
        if pa.types.is_list(kind):
            return []
        return "" if pa.types.is_string(kind) else 0.0 if pa.types.is_floating(kind) else 0

    row = {f.name: empty(f.type) for f in STEP_SAMPLE_SCHEMA}
    row.update(
        sample_id="fuzz-g0-e0-s0", task_id=TASK["task"], group_id="fuzz-g0",
        episode_id="fuzz-g0-e0", num_steps=1, action="{}", screenshots=[_png()],
    )  # fmt: skip
    write_parquet([row], runs_dir / "fuzz-run" / "trajectories" / "taken" / "fuzz-g0.parquet")


@contextlib.asynccontextmanager
async def started_demo(
    args: argparse.Namespace, env_url: str | None
) -> AsyncIterator[tuple[str, int, bool]]:
    """(base URL, max_body_bytes, whether to start a live episode) of the given demo, or of
    the demo's FastAPI app served here: uvicorn in this event loop, no Ray and no models (an
    episode that stepped would fail), episodes on ``env_url`` (None: a closed port, so no
    live episode), trajectories from a temporary runs folder holding one fuzz run."""
    if args.demo_url:
        yield check_loopback(args.demo_url), args.demo_max_body_bytes, True
        return
    import uvicorn

    from env_client.client import EnvClient
    from env_client.tasks.sources import make_task_source
    from serve_apps.prompting.styles import make_style
    from workflows.demo.api import DemoService, build_api
    from workflows.demo.config import load_demo_config
    from workflows.demo.live import EpisodeManager, Models
    from workflows.demo.viewer import RunIndex

    with tempfile.TemporaryDirectory(prefix="fuzz-demo-runs-") as runs:
        write_fuzz_run(Path(runs))
        overrides = [
            f"env.server_url={env_url or 'http://127.0.0.1:9'}", f"demo.runs_dir={runs}",
            "demo.page_timeout_s=3600", "demo.idle_timeout_s=3600",
        ]  # fmt: skip
        cfg = load_demo_config("embedded", overrides)
        client = EnvClient(cfg.env.model_copy(update={"allocate_deadline_s": 60.0}))
        await client.start()
        style = make_style(cfg.policy.agent_style, cfg.demo.history_screens)
        models = Models(policy=None, analyzer=None)
        manager = EpisodeManager(client, cfg.demo, cfg.episode_limit, style, models)
        source = make_task_source(cfg.task_source)
        service = DemoService(cfg, source, manager, RunIndex(cfg.runs_path), client.url)
        config = uvicorn.Config(
            build_api(service), host="127.0.0.1", port=0, log_level="warning", lifespan="off"
        )
        server = uvicorn.Server(config)
        serving = asyncio.ensure_future(server.serve())
        try:
            while not server.started:
                if serving.done():
                    serving.result()
                    raise RuntimeError("the demo app did not start")
                await asyncio.sleep(0.02)
            url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
            print(f"demo app {url} (runs {runs})", flush=True)
            yield url, cfg.demo.max_body_bytes, env_url is not None
        finally:
            server.should_exit = True
            await serving
            await manager.close()
            await client.close()


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


@contextlib.contextmanager
def started_policy(args: argparse.Namespace) -> Iterator[tuple[str, str, int]]:
    """(base URL, model id, max_body_bytes) of the given endpoint or of a tiny policy app."""
    if args.openai_url:
        yield check_loopback(args.openai_url), args.model, args.openai_max_body_bytes
        return
    import socket

    from ray import serve
    from ray.serve.context import _get_global_client

    from serve_apps.config import PolicyAppConfig, SamplingConfig, WeightSyncConfig
    from serve_apps.policy import deploy_policy
    from workflows.common.ray_cluster import RayClusterConfig, init_ray, shutdown_ray
    from workflows.common.tiny_models import tiny_checkpoint

    path = tiny_checkpoint("policy")
    init_ray(RayClusterConfig(num_cpus=2, object_store_memory_mb=256))
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        port = _get_global_client().http_config.port
        cfg = PolicyAppConfig(
            model_path=str(path), name="fuzz-policy", route_prefix="/fuzz-policy",
            num_cpus=0.5, sampling=SamplingConfig(max_new_tokens=4), max_prompt_tokens=1024,
            weights=WeightSyncConfig(enabled=False, registry_name=f"fuzz-{uuid.uuid4().hex[:6]}"),
            max_body_bytes=1 << 20,
        )  # fmt: skip
        deploy_policy(cfg)
        print(f"policy app http://127.0.0.1:{port}{cfg.route_prefix}", flush=True)
        yield f"http://127.0.0.1:{port}{cfg.route_prefix}", cfg.name, cfg.max_body_bytes
    finally:
        shutdown_ray()


async def fuzz(
    args: argparse.Namespace,
    env: tuple[str, int, bool] | None,
    policy: tuple[str, str, int] | None,
) -> tuple[Tally, list[str], bool]:
    """Send the probes, then check health: (counts, health problems, healthy)."""
    rng = random.Random(args.seed)
    tally = Tally()
    marker = str(Path(tempfile.gettempdir()) / f"fuzz-http-pwned-{uuid.uuid4().hex[:8]}")
    async with contextlib.AsyncExitStack() as stack:
        http = await stack.enter_async_context(aiohttp.ClientSession())
        env_t = oai_t = demo_t = None
        if env:
            sid = await env_session(http, env[0])
            env_t = (env[0], EnvTarget(env[1], sid, fault_api=env[2], marker=marker))
        if policy:
            oai_t = (policy[0], OpenAITarget(policy[1], policy[2]))
        if not args.no_demo:
            demo = started_demo(args, env[0] if env else None)
            url, limit, episode = await stack.enter_async_context(demo)
            demo_t = (url, await demo_target(http, url, limit, marker, episode))
            if demo_t[1].episode_id:
                print(f"demo episode {demo_t[1].episode_id} (never stepped)", flush=True)
            elif not episode:
                print("demo: no live episode (no env server)", flush=True)
        probes = draw(rng, args.requests, env_t, oai_t, demo_t)
        await run_probes(http, _with_heartbeats(probes, env_t, demo_t), tally, args.verbose)
        problems = []
        if env_t:
            problems += await env_healthy(http, *env_t)
            await send(http, env_t[0], Probe("release", "DELETE", f"/v1/sessions/{sid}"))
        if oai_t:
            problems += await openai_healthy(http, *oai_t)
        if demo_t:
            problems += await demo_healthy(http, *demo_t)
            if demo_t[1].episode_id:
                stop = f"/api/episodes/{demo_t[1].episode_id}/stop"
                await send(http, demo_t[0], Probe("stop", "POST", stop))
    healthy = not problems and not any(f.startswith("set-up") for f in tally.failures)
    return tally, problems, healthy


def _with_heartbeats(
    probes: Iterator[tuple[str, Probe, Callable[[Any], bool]]],
    env_t: tuple[str, EnvTarget] | None,
    demo_t: tuple[str, DemoTarget] | None = None,
) -> Iterator[tuple[str, Probe, Callable[[Any], bool]]]:
    """Every 25th env probe carries a heartbeat as set-up, so the session outlives the fuzz;
    every 10th demo probe a pause of the live episode (harmless on a ready episode; it restarts
    the demo's page and idle timers, so the episode outlives the fuzz too)."""
    for i, (base, probe, named) in enumerate(probes):
        if env_t and base == env_t[0] and probe.setup is None and i % 25 == 0:
            beat = Probe("heartbeat", "POST", f"/v1/sessions/{env_t[1].session_id}/heartbeat")
            probe = dataclasses.replace(probe, setup=beat)
        live = demo_t[1].episode_id if demo_t else None
        if demo_t and live and base == demo_t[0] and probe.setup is None and i % 10 == 0:
            pause = Probe("pause", "POST", f"/api/episodes/{live}/pause")
            probe = dataclasses.replace(probe, setup=pause)
        yield base, probe, named


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--requests", type=int, default=400, help="Probes to send (default 400).")
    p.add_argument("--seed", type=int, default=0, help="RNG seed of the probes.")
    p.add_argument("--env-url", help="A running env server (default: start one here).")
    p.add_argument("--env-max-body-bytes", type=int, default=1 << 20, help="Its body limit.")
    p.add_argument("--no-env", action="store_true", help="Skip the env server.")
    p.add_argument("--openai-url", help="A running OpenAI base (…/<prefix>, without /v1).")
    p.add_argument("--model", default="policy", help="Model id served at --openai-url.")
    p.add_argument("--openai-max-body-bytes", type=int, default=64 << 20, help="Its limit.")
    p.add_argument("--no-openai", action="store_true", help="Skip the OpenAI endpoint.")
    p.add_argument(
        "--demo-url",
        help="A running demo app with its route prefix (http://127.0.0.1:8000/demo); default: "
        "serve the demo's FastAPI app here (no Ray, no models; its live episode on the env "
        "server of this fuzz, none with --no-env).",
    )
    p.add_argument("--demo-max-body-bytes", type=int, default=64 << 10, help="Its limit.")
    p.add_argument("--no-demo", action="store_true", help="Skip the demo app.")
    p.add_argument("--verbose", action="store_true", help="Print every answer.")
    args = p.parse_args(argv)
    if args.no_env and args.no_openai and args.no_demo:
        p.error("nothing to fuzz: --no-env, --no-openai and --no-demo")
    if args.requests < 1:
        p.error("--requests must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with contextlib.ExitStack() as stack:
        env = None if args.no_env else stack.enter_context(started_env(args))
        policy = None if args.no_openai else stack.enter_context(started_policy(args))
        tally, problems, healthy = asyncio.run(fuzz(args, env, policy))
    # Printed once the servers are down, so Ray's log lines cannot follow the summary.
    for line in tally.failures + problems:
        print(f"  FAIL {line}", flush=True)
    print(tally.line(healthy), flush=True)
    clean = tally.counts["5xx"] == 0 and tally.counts["other"] == 0
    return 0 if healthy and clean else 1


if __name__ == "__main__":
    sys.exit(main())
