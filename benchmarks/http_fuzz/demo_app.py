"""Fuzzing the demo's FastAPI app: its probes (bad starts and temperatures, unknown episode
commands, run names and step ids that try to leave the runs folder), the target read from the
app before the fuzz (with a live episode no probe may change), the health check afterwards and
the app served here when no ``--demo-url`` is given."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

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
    png_bytes,
    send,
)
from benchmarks.http_fuzz.env_server import env_error_named, hostile_commands


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
    return pick(rng, [f"{rng.getrandbits(48):012x}", *odd]), False


def _demo_bad_json(rng: random.Random, t: DemoTarget) -> Probe:
    eid, _ = _episode(rng, t)
    method, path = pick(
        rng, [("POST", "/api/episodes"), ("PUT", f"/api/episodes/{eid}/temperature")]
    )
    body = pick(rng, BAD_JSON + NOT_OBJECTS)
    return Probe(f"{method} {path[:40]} with body {body[:20]!r}", method, path, body)


def _demo_start_types(rng: random.Random, t: DemoTarget) -> Probe:
    """Start bodies that are each invalid: none may allocate an episode."""
    task = str(TASK["task"])
    hostile = pick(rng, hostile_commands(t.marker)[:6])
    body = pick(
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
    return Probe(f"start {str(body)[:70]}", "POST", "/api/episodes", json_body(body))


def _demo_temperature(rng: random.Random, t: DemoTarget) -> Probe:
    eid, _ = _episode(rng, t)
    body = pick(
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
    return Probe(f"temperature {str(body)[:60]}", "PUT", path, json_body(body))


BAD_COMMANDS = [
    "STEP", "Run", "teleport", "shutdown", "delete", "reset", "temperature", "stop.json",
    "step%20", "%20stop", "stop%00", "stop%0a", "step%3Bstop", "run%3Fnow=1", "pause&stop",
    "%2e%2e", "..", "x" * 300, "%C3%A9",
]  # fmt: skip


def _demo_command(rng: random.Random, t: DemoTarget) -> Probe:
    """Unknown commands, valid ones on episodes that do not exist, and valid ones on the live
    episode with a query that fails validation (so the command must not run)."""
    eid, live = _episode(rng, t)
    command = pick(rng, BAD_COMMANDS + ([] if live else ["step", "run", "pause", "stop"]))
    if live and rng.random() < 0.3:
        command = pick(rng, ["step", "run", "stop"]) + pick(
            rng, ["?since=abc", "?since=1.5", "?since=", "?since=%00"]
        )
    shown = "<live>" if live else "<unknown>"
    return Probe(f"POST episode {shown} {command[:40]}", "POST", f"/api/episodes/{eid}/{command}")


def _demo_poll(rng: random.Random, t: DemoTarget) -> Probe:
    eid, live = _episode(rng, t)
    since = pick(rng, ["abc", "1.5", "1e3", "", "%00", "true", "-", "0x10"])
    query = f"?since={since}" if live or rng.random() < 0.5 else ""
    return Probe(f"poll episode {query or eid[:20]}", "GET", f"/api/episodes/{eid}{query}")


def _demo_unknown(rng: random.Random, t: DemoTarget) -> Probe:
    eid, _ = _episode(rng, t)
    run = _seg(t.run or "fuzz-run")
    method, path = pick(
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
    run = pick(rng, [f"no-such-run-{rng.randrange(99)}", *traversals(t.marker)])
    sample = _seg(t.sample_id or "g0-e0-s0")
    path = pick(
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
    bad = pick(rng, [f"g9-e9-s{rng.randrange(99)}", *traversals(t.marker)])
    query = pick(
        rng,
        ["version=abc", "version=1.5", "version=", "version=%00", "only=bogus", "only=",
         "only=..%2f..%2fetc%2fpasswd", "only=gate&version=x"],
    )  # fmt: skip
    options = [f"{base}?{query}", f"{base}/{bad}", f"{base}/{bad}/screenshots/0"]
    if t.sample_id:
        k = pick(rng, ["-1", "1000000", str(2**63), str(10**30), "abc", "1.5", "0x1", "%00"])
        options.append(f"{base}/{_seg(t.sample_id)}/screenshots/{k}")
    path = pick(rng, options)
    return Probe(f"steps {path[len(base) :][:60]}", "GET", path)


def _demo_huge(rng: random.Random, t: DemoTarget) -> Probe:
    """Bodies over the limit, even to routes that read none (refused before the app runs: a
    stop of the live episode would show in the health check)."""
    eid, _ = _episode(rng, t)
    method, path = pick(
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
    return oversized(rng, t.max_body_bytes, method, path, f"{method} {path[:40]}", expect=413)


def _demo_content_type(rng: random.Random, t: DemoTarget) -> Probe:
    """A valid body under a Content-Type that is not JSON: refused, not parsed anyway."""
    eid, _ = _episode(rng, t)
    method, path, body = pick(
        rng,
        [
            ("POST", "/api/episodes", {"task": TASK["task"], "seed": 1}),
            ("PUT", f"/api/episodes/{eid}/temperature", {"temperature": 0.5}),
        ],
    )
    kind = pick(
        rng,
        ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
         "application/xml", "image/png"],
    )  # fmt: skip
    headers = (("Content-Type", kind),)
    return Probe(f"{method} {path[:40]} as {kind}", method, path, json_body(body), headers)


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
    return choose(rng, demo_probes(target), target)


def demo_error_named(data: Any) -> bool:
    """The demo's error shape, ``{"ok": false, "error": "<what and why>"}`` (the env's)."""
    return env_error_named(data)


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
        body = json_body({"task": task, "split": split, "seed": TASK["seed"]})
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
        episode_id="fuzz-g0-e0", num_steps=1, action="{}", screenshots=[png_bytes()],
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
