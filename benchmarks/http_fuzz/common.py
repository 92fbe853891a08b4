"""What every fuzzed surface shares: the probe, the bodies that are not JSON objects, the
loopback check, and sending, judging and counting the probes (:func:`run_probes`)."""

from __future__ import annotations

import io
import json
import random
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aiohttp
import yarl

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
TASK = {"id": "fuzz", "instruction": "fuzz", "env": "miniwob", "task": "click-test", "seed": 1}
T = TypeVar("T")  # a surface's target (EnvTarget, OpenAITarget, DemoTarget)


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


def json_body(value: Any) -> bytes:
    return json.dumps(value).encode()


def pick(rng: random.Random, options: list[Any]) -> Any:
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


def choose(
    rng: random.Random, makers: list[tuple[Callable[[random.Random, T], Probe], float]], target: T
) -> Probe:
    """A probe of one of ``makers`` (probe maker, weight), drawn by weight."""
    maker = rng.choices([m for m, _ in makers], weights=[w for _, w in makers])[0]
    return maker(rng, target)


def oversized(
    rng: random.Random, limit: int, method: str, path: str, to: str, expect: int | None = None
) -> Probe:
    """A body over ``limit`` (by 1 to ``limit`` bytes), with Content-Length or chunked; ``to``
    names the route in the probe's name."""
    size = limit + 1 + rng.randrange(limit)
    body = json_body({"pad": "x" * size})
    chunked = rng.random() < 0.5
    how = "chunked" if chunked else "with Content-Length"
    name = f"{len(body)} bytes {how} to {to}"
    return Probe(name, method, path, body, chunked=chunked, expect=expect)


def png_bytes(size: tuple[int, int] = (8, 8)) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, (10, 20, 30)).save(buf, "PNG")
    return buf.getvalue()


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


def check_loopback(url: str) -> str:
    host = urlsplit(url).hostname
    if host not in LOOPBACK:
        raise SystemExit(f"fuzz_http only talks to loopback servers, not {host!r}")
    return url.rstrip("/")
