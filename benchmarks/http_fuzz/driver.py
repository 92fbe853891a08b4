"""One fuzz over the surfaces: :func:`draw` picks the seeded probes across the targets, the
live env session and demo episode are kept alive between them, and :func:`fuzz` sends them all
and checks every server's health afterwards."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import random
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.http_fuzz.common import Probe, Tally, run_probes, send
from benchmarks.http_fuzz.demo_app import (
    DemoTarget,
    demo_error_named,
    demo_healthy,
    demo_probe,
    demo_target,
    started_demo,
)
from benchmarks.http_fuzz.env_server import (
    EnvTarget,
    env_error_named,
    env_healthy,
    env_probe,
    env_session,
)
from benchmarks.http_fuzz.openai_endpoint import (
    OpenAITarget,
    openai_error_named,
    openai_healthy,
    openai_probe,
)


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
