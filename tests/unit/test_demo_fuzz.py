"""The fuzzer's demo probes (``benchmarks/http_fuzz/demo_app.py``) against the real demo
FastAPI app, served on a loopback port (uvicorn in a thread) without Ray, Serve, models or an
environment: every answer is a named 4xx, no probe starts an episode or steps, stops or changes
the live one, and no file a probe names appears.

The live episode is a stand-in on no session (state ``ready``): a probe that stepped it would
fail it, one that stopped it would end it, and the health check would say so. The body limit
is 4096 bytes here, so the oversized probes stay small."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from benchmarks.http_fuzz.common import Probe, Tally, run_probes, send
from benchmarks.http_fuzz.demo_app import (
    DemoTarget,
    demo_error_named,
    demo_healthy,
    demo_probes,
    demo_target,
)
from benchmarks.http_fuzz.driver import draw
from env_client.client import EnvClient
from env_client.config import EnvClientConfig
from env_client.tasks.sources import make_task_source
from serve_apps.prompting.styles import make_style
from tests.unit._demo_helpers import serving, write_run
from workflows.demo.api import DemoService, build_api
from workflows.demo.config import load_demo_config
from workflows.demo.live import EpisodeManager, LiveEpisode, Models
from workflows.demo.viewer import RunIndex

pytestmark = pytest.mark.timeout(120)
LIMIT = 4096


@dataclasses.dataclass
class Demo:
    url: str
    manager: EpisodeManager
    live: LiveEpisode
    marker: Path


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    runs = tmp_path_factory.mktemp("runs")
    write_run(runs, "run-ok")
    overrides = [
        "env.server_url=http://127.0.0.1:9",
        f"demo.runs_dir={runs}",
        f"demo.max_body_bytes={LIMIT}",
    ]
    cfg = load_demo_config("embedded", overrides)
    client = EnvClient(EnvClientConfig(server_url="http://127.0.0.1:9"))  # never started
    style = make_style(cfg.policy.agent_style, cfg.demo.history_screens)
    models = Models(policy=None, analyzer=None)
    manager = EpisodeManager(client, cfg.demo, 2, style, models)
    live = LiveEpisode({"task": "click-test", "id": "fuzz"}, None, None, cfg.demo, style, models)
    live.state = "ready"
    manager.episodes[live.id] = live
    service = DemoService(cfg, make_task_source(cfg.task_source), manager, RunIndex(runs))
    marker = tmp_path_factory.mktemp("marker") / "fuzz-http-pwned-test"
    with serving(build_api(service)) as url:
        yield Demo(url, manager, live, marker)


async def _target(http: aiohttp.ClientSession, demo: Demo) -> DemoTarget:
    target = await demo_target(http, demo.url, LIMIT, str(demo.marker), episode=False)
    return dataclasses.replace(target, episode_id=demo.live.id)


def _assert_unchanged(demo: Demo) -> None:
    assert list(demo.manager.episodes) == [demo.live.id]
    assert demo.live.state == "ready" and demo.live.steps == [] and demo.live.temperature is None


def test_the_target_is_read_from_the_demo(demo: Demo) -> None:
    async def go() -> None:
        async with aiohttp.ClientSession() as http:
            target = await _target(http, demo)
            assert (target.run, target.sample_id) == ("run-ok", "g000000-e0-s0")
            assert target.max_instruction_chars == 2000
            assert target.others == {demo.live.id}

    asyncio.run(go())


def test_fuzz_probes_all_get_named_4xx_and_change_nothing(demo: Demo) -> None:
    async def go() -> None:
        async with aiohttp.ClientSession() as http:
            target = await _target(http, demo)
            tally = Tally()
            probes = draw(random.Random(9), 400, None, None, (demo.url, target))
            await run_probes(http, probes, tally)
            assert tally.counts["4xx"] == 400, tally.failures
            assert await demo_healthy(http, demo.url, target) == []

    asyncio.run(go())
    _assert_unchanged(demo)


@pytest.mark.parametrize(
    "maker",
    [m for m, _ in demo_probes(DemoTarget(LIMIT, run="run-ok"))],
    ids=lambda m: m.__name__,
)
def test_each_kind_of_probe_gets_named_4xx(demo: Demo, maker) -> None:
    async def go() -> None:
        async with aiohttp.ClientSession() as http:
            target = await _target(http, demo)
            rng = random.Random(maker.__name__)
            tally = Tally()
            probes = ((demo.url, maker(rng, target), demo_error_named) for _ in range(30))
            await run_probes(http, probes, tally)
            assert tally.counts["4xx"] == 30, tally.failures

    asyncio.run(go())
    _assert_unchanged(demo)


def test_probes_without_a_live_episode_or_a_run_get_named_4xx(demo: Demo) -> None:
    async def go() -> None:
        async with aiohttp.ClientSession() as http:
            target = DemoTarget(LIMIT, marker=str(demo.marker))
            tally = Tally()
            await run_probes(
                http, draw(random.Random(4), 150, None, None, (demo.url, target)), tally
            )
            assert tally.counts["4xx"] == 150, tally.failures

    asyncio.run(go())
    _assert_unchanged(demo)


def test_the_health_check_sees_a_changed_episode_and_a_named_file(demo: Demo) -> None:
    """What the fuzz would miss if the check were blind: a temperature set, a file created."""

    async def go() -> None:
        async with aiohttp.ClientSession() as http:
            target = await _target(http, demo)
            path = f"/api/episodes/{demo.live.id}/temperature"
            for value, problems in ((0.5, 1), (None, 0)):
                body = f'{{"temperature": {"null" if value is None else value}}}'.encode()
                status, _ = await send(http, demo.url, Probe("set", "PUT", path, body))
                assert status == 200
                assert len(await demo_healthy(http, demo.url, target)) == problems
            demo.marker.touch()
            try:
                (problem,) = await demo_healthy(http, demo.url, target)
                assert "files a probe named exist" in problem
            finally:
                demo.marker.unlink()

    asyncio.run(go())
    _assert_unchanged(demo)
