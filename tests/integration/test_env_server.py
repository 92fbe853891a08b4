"""The embedded environment server end to end: real server process, real headless Chromium,
real HTTP, driven by the real client.

One server (capacity 2, short heartbeat timeout, fault API on) serves the whole module; each
test leaves it with no live session (checked after every test).
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from env_client.actions import parse_response, render_response
from env_client.client import EnvClient, Session
from env_client.config import EmbeddedEnvConfig, EnvClientConfig, RetryConfig, TimeoutsConfig
from env_client.errors import EnvError, SessionLost
from env_client.scripted import click, play, solve, wrong
from env_client.server import EmbeddedServer, start_embedded_server
from env_client.tasks import load_task_list, load_tasks

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

HEARTBEAT_TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedServer]:
    cfg = EmbeddedEnvConfig(
        capacity=2,
        prewarm=2,
        heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
        reclaim_interval_s=0.2,
        allocate_retry_after_s=0.2,
        fault_api=True,
    )
    with start_embedded_server(cfg, timeout_s=120) as srv:
        yield srv
    assert not srv.alive()


def _cfg(url: str, **timeouts: float) -> EnvClientConfig:
    return EnvClientConfig(
        server_url=url,
        heartbeat_interval_s=timeouts.pop("heartbeat_interval_s", 0.4),
        allocate_deadline_s=30,
        retry=RetryConfig(backoff_base_s=0.05, backoff_cap_s=0.5, max_tries=8),
        timeouts=TimeoutsConfig(**timeouts),
    )


def run(coro: Any, timeout: float = 90) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def _http(method: str, url: str, **kw: Any) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.request(method, url, **kw) as resp:
        return resp.status, await resp.json()


async def arm(server: EmbeddedServer, *rules: dict[str, Any]) -> None:
    status, body = await _http("POST", f"{server.url}/v1/faults", json={"rules": list(rules)})
    assert status == 200, body


async def fired(server: EmbeddedServer) -> list[int]:
    return [r["fired"] for r in (await _http("GET", f"{server.url}/v1/faults"))[1]["rules"]]


async def live_count(server: EmbeddedServer) -> int:
    return int((await _http("GET", f"{server.url}/v1/sessions"))[1]["count"])


async def until_no_sessions(server: EmbeddedServer, within_s: float = 5.0) -> float:
    t0 = time.monotonic()
    while await live_count(server):
        assert time.monotonic() - t0 < within_s, "sessions still live"
        await asyncio.sleep(0.05)
    return time.monotonic() - t0


@pytest.fixture(autouse=True)
def clean_server(server: EmbeddedServer) -> Iterator[None]:
    run(_http("DELETE", f"{server.url}/v1/faults"))
    yield
    run(until_no_sessions(server))  # every test hands its sessions back


def gui(command: str) -> dict[str, Any]:
    return {"kind": "gui", "type": "pyautogui", "payload": {"command": command}}


def control(kind: str) -> dict[str, Any]:
    return {"kind": "control", "type": kind, "payload": {}}


def payload(task: str, seed: int) -> dict[str, Any]:
    return {"id": f"miniwob/{task}/{seed}", "instruction": "generic", "env": "miniwob",
            "task": task, "seed": seed}  # fmt: skip


async def _episode(s: Session, task: str, seed: int, planner: Any) -> tuple[float, list[Any]]:
    """Reset, plan from ground truth, act through the policy text path, evaluate."""
    await s.reset(payload(task, seed))
    plan = planner(await s.ground_truth())
    actions = [parse_response(render_response(a)) for a in plan]  # as a policy would emit them
    assert actions == plan
    results = await play(s, actions)
    return await s.evaluate(), results


# --- tasks ---------------------------------------------------------------------------------


@pytest.mark.parametrize("task", sorted(load_task_list().tasks))
def test_scripted_solution_scores_one_and_wrong_sequence_zero(server, task):
    seeds = [p["seed"] for p in load_tasks("eval") if p["task"] == task][:2]

    async def go() -> None:
        async with EnvClient(_cfg(server.url)) as client, client.session() as s:
            for seed in seeds:
                score, results = await _episode(s, task, seed, solve)
                assert score == 1.0, (task, seed)
                assert results[-1].done and results[-1].reward == 1.0
                score, _ = await _episode(s, task, seed, wrong)
                assert score == 0.0, (task, seed)

    run(go())


def test_observation_screenshot_tree_and_instruction(server):
    async def go() -> None:
        async with EnvClient(_cfg(server.url)) as client, client.session() as s:
            obs = await s.reset(payload("click-button", 7))
            truth = await s.ground_truth()
            assert obs.instruction == truth["utterance"] == truth["instruction"]
            assert obs.instruction.startswith('Click on the "')
            assert obs.size == (160, 210) and obs.image.size == (160, 210)
            assert len(set(obs.image.getdata())) > 4  # a rendered page, not a blank frame
            target = truth["fields"]["target"]
            buttons = [n for n in obs.elements if n.role == "button" and n.name == target]
            assert buttons, obs.accessibility_tree
            x, y, w, h = buttons[0].box
            hit = next(e["hit"] for e in truth["elements"] if e.get("text") == target)
            assert x <= hit[0] < x + w and y <= hit[1] < y + h
            assert any(n.role == "text" and n.name == obs.instruction for n in obs.elements)

    run(go())


def test_hostile_commands_get_400_nothing_runs_and_session_stays_usable(server, tmp_path):
    marker = tmp_path / "pwned"
    hostile = [
        f"__import__('os').system('touch {marker}')",
        f"import os; os.system('touch {marker}')",
        f"exec(\"open('{marker}', 'w')\")",
        f"pyautogui.write(open('{marker}', 'w').name)",
        f"pyautogui.click(__import__('pathlib').Path('{marker}').touch(), 1)",
        "pyautogui.screenshot()",
    ]

    async def go() -> None:
        async with EnvClient(_cfg(server.url)) as client, client.session() as s:
            await s.reset(payload("click-test", 3))
            for command in hostile:
                with pytest.raises(EnvError) as err:
                    await s.step(gui(command))
                assert err.value.status == 400, err.value
            truth = await s.ground_truth()
            assert truth["episode_actions"] == 0
            score, _ = await _episode(s, "click-test", 3, solve)
            assert score == 1.0

    run(go())
    assert not marker.exists()


def test_bad_requests_are_4xx_naming_the_problem(server):
    async def go() -> None:
        async with EnvClient(_cfg(server.url)) as client, client.session() as s:
            with pytest.raises(EnvError, match="reset it first"):
                await s.step(gui("pyautogui.click(1, 1)"))
            with pytest.raises(EnvError, match="no task 'no-such-task'"):
                await s.reset(payload("no-such-task", 1))
            with pytest.raises(EnvError, match="not env='osworld'"):
                await s.reset({"env": "osworld", "task": "click-test"})
            await s.reset(payload("click-test", 1))
            with pytest.raises(EnvError, match="DONE, FAIL or WAIT"):
                await s.step(control("EXPLODE"))
            with pytest.raises(EnvError, match="pause"):
                await s.step(control("WAIT"), pause=-1)

    run(go())


def test_every_whitelisted_operation_runs_in_the_browser(server):
    async def go() -> None:
        async with EnvClient(_cfg(server.url)) as client, client.session() as s:
            await s.reset(payload("enter-text", 8))
            truth = await s.ground_truth()
            x, y = next(e for e in truth["elements"] if e["id"] == "tt")["hit"]
            commands = [
                f"pyautogui.moveTo({x}, {y})",
                "pyautogui.click()",  # at the pointer
                "pyautogui.write('hello world')",
                "pyautogui.hotkey('ctrl', 'a'); pyautogui.press('backspace')",
                "pyautogui.typewrite(['H', 'i']); pyautogui.press('left', presses=2)",
                "pyautogui.write('>')",
                f"pyautogui.doubleClick({x}, {y}); pyautogui.tripleClick({x}, {y})",
                # (a middle click into the field would paste the selection, as on Linux)
                f"pyautogui.rightClick({x}, {y}); pyautogui.middleClick(5, 5)",
                f"pyautogui.scroll(-3, x={x}, y={y}); pyautogui.hscroll(2)",
                f"pyautogui.dragTo({x + 5}, {y}, duration=0.2)",
                "import time; time.sleep(0.1)",
                "pyautogui.press('volumeup')",  # a real key a browser has no use for
            ]
            infos = [(await s.step(gui(c))).info for c in commands]
            assert infos[-1]["unsupported_keys"] == ["volumeup"]
            value, actions = await _typed_value(s)
            assert (value, actions) == (">Hi", 17)

    run(go())


def test_control_actions_and_out_of_screen_clicks(server):
    async def go() -> None:
        async with EnvClient(_cfg(server.url)) as client, client.session() as s:
            await s.reset(payload("click-test", 2))
            res = await s.step(gui("pyautogui.click(500, 500)"))
            assert res.info["out_of_bounds"] == 1 and not res.done
            t0 = time.monotonic()
            res = await s.step(control("WAIT"), pause=0.4)
            assert time.monotonic() - t0 >= 0.4 and not res.done
            res = await s.step(control("DONE"))
            assert res.done and res.reward == 0.0
            plan = solve(await s.ground_truth())
            res = await s.act(plan[0])  # too late: the policy already said DONE
            assert res.info["ignored_after_done"] == 1
            assert await s.evaluate() == 0.0

    run(go())


def test_client_started_embedded_server_with_larger_screen_and_slow_steps():
    """server_url=None: the client starts its own server (here with a non-native screen, so
    screenshots are resized and clicks scaled, and a slow-desktop step delay) and stops it."""
    embedded = EmbeddedEnvConfig(
        capacity=1, prewarm=1, screen_width=320, screen_height=300, step_delay_s=0.3
    )
    cfg = _cfg("unused").model_copy(update={"server_url": None, "embedded": embedded})

    async def go() -> int:
        async with EnvClient(cfg) as client, client.session() as s:
            assert client.embedded_server is not None
            for task in ("click-dialog-2", "click-checkboxes", "enter-text"):
                t0 = time.monotonic()
                score, results = await _episode(s, task, 11, solve)
                assert score == 1.0, task
                assert time.monotonic() - t0 >= 0.3 * len(results)
                assert results[0].observation.size == (320, 300)
                assert (await s.ground_truth())["screen"] == [320, 300]
            return client.embedded_server.pid

    pid = run(go())
    with pytest.raises(ProcessLookupError):  # the server and its browsers are gone
        os.killpg(pid, 0)


# --- pool, heartbeats, release -------------------------------------------------------------


def test_capacity_limit_answers_pending_then_allocates(server):
    async def go() -> None:
        async with EnvClient(_cfg(server.url)) as client:
            a, b = await client.allocate(), await client.allocate()
            third = asyncio.ensure_future(client.allocate())
            t0 = time.monotonic()
            while (await client.list_sessions())["waiting"] != 1:
                assert time.monotonic() - t0 < 5
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)  # several pending polls while full
            assert not third.done()
            state = await client.list_sessions()
            assert state["count"] == 2 and state["browsers"]["starting"] == 0
            await a.release()
            c = await asyncio.wait_for(third, 10)
            state = await client.list_sessions()
            assert {x["session_id"] for x in state["sessions"]} == {b.session_id, c.session_id}
            assert state["browsers"]["idle"] + state["browsers"]["bound"] <= 2
            await c.reset(payload("click-test", 1))  # the recycled desktop works
            await b.release()
            await c.release()

    run(go())


def test_sessions_without_heartbeat_are_reclaimed(server):
    async def go() -> None:
        async with (
            EnvClient(_cfg(server.url, heartbeat_interval_s=60)) as silent,
            EnvClient(_cfg(server.url, heartbeat_interval_s=0.3)) as beating,
        ):
            quiet, alive = await silent.allocate(), await beating.allocate()
            await quiet.reset(payload("click-test", 1))
            await asyncio.sleep(HEARTBEAT_TIMEOUT_S + 1.0)
            live = {x["session_id"] for x in (await beating.list_sessions())["sessions"]}
            assert live == {alive.session_id}
            with pytest.raises(SessionLost, match="no heartbeat"):
                await quiet.observe()
            await alive.reset(payload("click-test", 1))
            await alive.release()

    run(go())


def test_session_released_after_cancelling_a_client_mid_step(server):
    async def go() -> None:
        async with EnvClient(_cfg(server.url)) as client:
            in_step = asyncio.Event()

            async def episode() -> None:
                async with client.session() as s:
                    await s.reset(payload("click-test", 1))
                    await arm(server, {"op": "step", "kind": "delay", "delay_s": 3.0,
                                       "session_id": s.session_id})  # fmt: skip
                    in_step.set()
                    await s.step(control("WAIT"))

            task = asyncio.ensure_future(episode())
            await in_step.wait()
            await asyncio.sleep(0.3)
            assert await live_count(server) == 1
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await until_no_sessions(server, within_s=2.0) < 2.0  # not after the slow step

            with pytest.raises(ZeroDivisionError):
                async with client.session() as s:
                    await s.reset(payload("click-test", 1))
                    _ = 1 / 0
            assert await live_count(server) == 0

    run(go())


# --- injected faults: recovery without duplicated actions ----------------------------------


async def _typed_value(s: Session) -> tuple[str, int]:
    truth = await s.ground_truth()
    field = next(e for e in truth["elements"] if e["id"] == "tt")
    return field["value"], truth["episode_actions"]


@pytest.mark.parametrize(
    "rule",
    [
        {"kind": "http_503", "phase": "after", "times": 2},
        {"kind": "http_502", "phase": "before", "times": 2},
        {"kind": "delay", "phase": "after", "delay_s": 1.5},
        {"kind": "delay", "phase": "before", "delay_s": 1.5},
        {"kind": "pending", "phase": "after", "times": 2},
    ],
    ids=["503-after", "502-before", "timeout-after", "timeout-before", "pending-after"],
)
def test_step_faults_are_recovered_without_duplicate_actions(server, rule):
    async def go() -> None:
        async with EnvClient(_cfg(server.url, step_s=0.6)) as client, client.session() as s:
            await s.reset(payload("enter-text", 4))
            truth = await s.ground_truth()
            await s.act(click(truth, next(e for e in truth["elements"] if e["id"] == "tt"), "."))
            await arm(server, {"op": "step", "session_id": s.session_id, **rule})
            await s.step(gui("pyautogui.write('abc')"))
            assert await _typed_value(s) == ("abc", 2)  # typed once, not "abcabc"
            assert (await fired(server))[0] >= 1

    run(go())


def test_idempotent_replay_returns_the_first_answer(server):
    async def go() -> None:
        async with EnvClient(_cfg(server.url)) as client, client.session() as s:
            await s.reset(payload("enter-text", 4))
            url = f"{s.node_url}/v1/sessions/{s.session_id}/step"
            body = {"action": gui("pyautogui.write('xy')"), "pause": 0}
            headers = {"Idempotency-Key": "step-fixed-key"}
            first = await _http("POST", url, json=body, headers=headers)
            second = await _http("POST", url, json=body, headers=headers)
            assert first == second and first[0] == 200
            assert (await s.ground_truth())["episode_actions"] == 1
            other = await _http("POST", url.replace("/step", "/observe"), json={}, headers=headers)
            assert other[0] == 400 and "was used for step" in other[1]["error"]

    run(go())


def test_allocate_and_observe_faults_are_retried(server):
    async def go() -> None:
        await arm(
            server,
            {"op": "allocate", "kind": "http_503", "times": 2},
            {"op": "observe", "kind": "http_504", "times": 1},
            {"op": "heartbeat", "kind": "http_503", "times": 2},
        )
        async with EnvClient(_cfg(server.url, heartbeat_interval_s=0.2)) as client:
            async with client.session() as s:
                await s.reset(payload("click-test", 1))
                assert (await s.observe()).has_screenshot
                await asyncio.sleep(1.0)
            assert await fired(server) == [2, 1, 2]

    run(go())


def test_lost_session_raises_session_lost_and_a_fresh_session_works(server):
    async def go() -> None:
        async with EnvClient(_cfg(server.url)) as client:
            async with client.session() as s:
                await s.reset(payload("click-test", 5))
                await arm(
                    server, {"op": "step", "kind": "lose_session", "session_id": s.session_id}
                )
                with pytest.raises(SessionLost) as err:
                    await s.step(gui("pyautogui.click(1, 1)"))
                assert err.value.status == 410 and s.session_id in str(err.value)
                assert await live_count(server) == 0
            async with client.session() as fresh:
                score, _ = await _episode(fresh, "click-test", 5, solve)
                assert score == 1.0

    run(go())


def test_crashed_browser_loses_its_session_and_is_replaced(server):
    async def go() -> None:
        async with EnvClient(_cfg(server.url)) as client:
            async with client.session() as s:
                await s.reset(payload("click-test", 6))
                await arm(
                    server, {"op": "step", "kind": "kill_browser", "session_id": s.session_id}
                )
                with pytest.raises(SessionLost, match="browser died"):
                    await s.step(gui("pyautogui.click(1, 1)"))
            for seed in (6, 7):  # both desktops of the pool work again (one is new)
                async with client.session() as a, client.session() as b:
                    for fresh in (a, b):
                        score, _ = await _episode(fresh, "click-test", seed, solve)
                        assert score == 1.0
            state = await client.list_sessions()
            assert state["browsers"]["idle"] + state["browsers"]["bound"] <= 2

    run(go())


def test_server_cli_help():
    out = subprocess.run(
        [sys.executable, "-m", "env_client.server", "--help"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert "--capacity" in out.stdout and "--step-delay-s" in out.stdout


# --- protocol edges found with the authors' client; bad input --------------------------------


def test_release_whose_answer_is_lost_is_retried_to_ok(server, caplog):
    """An "after" fault on release: the session ends but the answer is lost; the retried
    release must answer ok (it answered 410 before, and the client logged a failure)."""

    async def go() -> None:
        async with EnvClient(_cfg(server.url)) as client:
            async with client.session() as s:
                await arm(
                    server,
                    {"op": "release", "kind": "http_503", "phase": "after",
                     "session_id": s.session_id},
                    {"op": "heartbeat", "kind": "http_503", "phase": "after",
                     "session_id": s.session_id},
                )  # fmt: skip
                await s.heartbeat()  # the lost heartbeat answer is retried too
            assert await fired(server) == [1, 1]
            assert await live_count(server) == 0
            url = f"{server.url}/v1/sessions/{s.session_id}"
            assert await _http("DELETE", url) == (200, {"ok": True})  # once more: still ok

    with caplog.at_level("WARNING", logger="env_client.client"):
        run(go())
    assert "release failed" not in caplog.text


def test_fuzz_probes_on_a_live_session_get_named_4xx_and_change_nothing(server):
    from benchmarks.http_fuzz.common import Tally, run_probes
    from benchmarks.http_fuzz.driver import draw
    from benchmarks.http_fuzz.env_server import EnvTarget, env_healthy, env_session

    async def go() -> None:
        async with aiohttp.ClientSession() as http:
            sid = await env_session(http, server.url)

            async def beat() -> None:
                while True:
                    await http.post(f"{server.url}/v1/sessions/{sid}/heartbeat", json={})
                    await asyncio.sleep(0.3)

            beating = asyncio.ensure_future(beat())
            try:
                target = EnvTarget(max_body_bytes=1 << 20, session_id=sid, fault_api=True,
                                   marker=str(server.log_path.parent / "pwned"))  # fmt: skip
                tally = Tally()
                await run_probes(
                    http, draw(random.Random(3), 80, (server.url, target), None), tally
                )
                assert tally.counts["4xx"] == 80, tally.failures
                assert await env_healthy(http, server.url, target) == []
            finally:
                beating.cancel()
                await _http("DELETE", f"{server.url}/v1/sessions/{sid}")

    run(go())
