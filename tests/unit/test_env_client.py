"""The session client's reliability rules, against a scripted protocol server over real HTTP.

The stub below is not what is tested: it plays a master/node that answers 5xx, pending,
4xx or slowly on cue, so each protocol rule of the client (ENV_PROTOCOL.md) is checked
quickly and exactly. The real embedded server is exercised in tests/integration.
"""

from __future__ import annotations

import asyncio
import base64
import io
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from PIL import Image

from env_client.actions import Action
from env_client.client import EnvClient
from env_client.config import EnvClientConfig, RetryConfig, TimeoutsConfig
from env_client.errors import EnvError, EnvUnavailable, ProtocolError, SessionLost

pytestmark = pytest.mark.timeout(60)


def _png() -> str:
    buf = io.BytesIO()
    Image.new("RGB", (160, 210), (0, 0, 255)).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


PNG = _png()
OBS = {"modalities": {"screenshot": PNG, "accessibility_tree": None, "terminal": None}}


@dataclass
class Req:
    op: str
    method: str
    path: str
    headers: dict[str, str]
    body: Any


Answer = tuple  # (status, body) or (status, body, delay_s)


class Stub:
    """A protocol server whose answers are scripted per operation (FIFO, then a default)."""

    def __init__(self, idempotency: int = 1, node_url: str | None = None) -> None:
        self.idempotency = idempotency
        self.node_url = node_url
        self.requests: list[Req] = []
        self.scripts: dict[str, list[Answer | Callable[[Req], Answer]]] = defaultdict(list)
        self.url = ""

    def script(self, op: str, *answers: Answer | Callable[[Req], Answer]) -> None:
        self.scripts[op].extend(answers)

    def ops(self, op: str) -> list[Req]:
        return [r for r in self.requests if r.op == op]

    def _default(self, req: Req) -> Answer:
        if req.op == "allocate":
            entry = {
                "session_id": req.body["session_id"],
                "node_url": self.node_url or self.url,
                "protocol_capabilities": {"operation_idempotency": self.idempotency},
            }
            return 200, {"ok": True, "sessions": [entry]}
        return 200, {
            "reset": {"ok": True, "observation": OBS, "instruction": "Click."},
            "step": {"ok": True, "observation": OBS, "reward": 0.0, "done": False, "info": {}},
            "observe": {"ok": True, "observation": OBS},
            "evaluate": {"ok": True, "score": 1.0},
        }.get(req.op, {"ok": True})

    async def handle(self, request: web.Request) -> web.Response:
        parts = request.path.strip("/").split("/")
        if request.method == "DELETE":
            op = "release"
        elif len(parts) == 2:
            op = "allocate" if request.method == "POST" else "list"
        else:
            op = parts[3]
        body = await request.json() if request.can_read_body else None
        req = Req(op, request.method, request.path, dict(request.headers), body)
        self.requests.append(req)
        script = self.scripts[op]
        answer = script.pop(0) if script else self._default
        if callable(answer):
            answer = answer(req)
        status, payload, *delay = answer
        if delay:
            await asyncio.sleep(delay[0])
        return web.json_response(payload, status=status)

    async def __aenter__(self) -> Stub:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._runner.cleanup()


def _cfg(url: str, **over: Any) -> EnvClientConfig:
    return EnvClientConfig(
        server_url=url,
        heartbeat_interval_s=over.pop("heartbeat_interval_s", 30.0),
        allocate_deadline_s=over.pop("allocate_deadline_s", 10.0),
        retry=RetryConfig(backoff_base_s=0.01, backoff_cap_s=0.05, max_tries=over.pop("tries", 5)),
        timeouts=TimeoutsConfig(**over),
    )


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_step_retried_on_gateway_errors_with_the_same_key():
    async def go() -> None:
        async with Stub() as stub, EnvClient(_cfg(stub.url)) as client:
            stub.script("step", (503, {"ok": False, "error": "busy"}), (502, "gateway"))
            async with client.session() as s:
                await s.reset({"task": "t"})
                res = await s.step({"kind": "control", "type": "WAIT", "payload": {}})
            assert res.observation.size == (160, 210)
            keys = {r.headers.get("Idempotency-Key") for r in stub.ops("step")}
            assert len(stub.ops("step")) == 3 and len(keys) == 1
            assert next(iter(keys)).startswith("step-")  # type: ignore[union-attr]
            reset_key = stub.ops("reset")[0].headers["Idempotency-Key"]
            assert reset_key.startswith("reset-") and reset_key not in keys

    run(go())


def test_4xx_is_not_retried_and_names_session_operation_and_message():
    async def go() -> None:
        async with Stub() as stub, EnvClient(_cfg(stub.url)) as client:
            stub.script("step", (400, {"ok": False, "error": "calling 'eval' is not allowed"}))
            async with client.session() as s:
                with pytest.raises(EnvError) as err:
                    await s.step({"kind": "gui", "type": "pyautogui", "payload": {"command": "x"}})
            assert len(stub.ops("step")) == 1
            e = err.value
            assert (e.session_id, e.operation, e.status) == (s.session_id, "step", 400)
            assert s.session_id in str(e) and "step" in str(e) and "'eval'" in str(e)

    run(go())


@pytest.mark.parametrize("status", [404, 410])
def test_gone_sessions_raise_session_lost(status):
    async def go() -> None:
        async with Stub() as stub, EnvClient(_cfg(stub.url)) as client:
            stub.script("observe", (status, {"ok": False, "error": "session ended: reclaimed"}))
            async with client.session() as s:
                with pytest.raises(SessionLost, match="reclaimed"):
                    await s.observe()

    run(go())


def test_without_idempotency_a_step_is_never_replayed_but_observe_is():
    async def go() -> None:
        async with Stub(idempotency=0) as stub, EnvClient(_cfg(stub.url)) as client:
            stub.script("step", (503, {"ok": False, "error": "busy"}))
            stub.script("observe", (503, {"ok": False, "error": "busy"}))
            async with client.session() as s:
                with pytest.raises(EnvUnavailable, match="not retried"):
                    await s.step({"kind": "control", "type": "WAIT", "payload": {}})
                assert (await s.observe()).has_screenshot
            assert len(stub.ops("step")) == 1 and len(stub.ops("observe")) == 2
            assert all("Idempotency-Key" not in r.headers for r in stub.requests)

    run(go())


def test_pending_operation_is_repeated_with_the_same_key_until_answered():
    def pending(req: Req) -> Answer:
        key = req.headers["Idempotency-Key"]
        return 200, {"ok": True, "pending": True, "operation_id": key, "retry_after_seconds": 0.05}

    async def go() -> None:
        async with Stub() as stub, EnvClient(_cfg(stub.url)) as client:
            stub.script("step", pending, pending)
            async with client.session() as s:
                res = await s.step({"kind": "control", "type": "WAIT", "payload": {}})
            assert res.observation.has_screenshot
            assert len({r.headers["Idempotency-Key"] for r in stub.ops("step")}) == 1
            assert len(stub.ops("step")) == 3

    run(go())


def test_pending_answer_for_another_operation_is_a_protocol_error():
    async def go() -> None:
        async with Stub() as stub, EnvClient(_cfg(stub.url)) as client:
            stub.script("step", (200, {"ok": True, "pending": True, "operation_id": "step-other"}))
            async with client.session() as s:
                with pytest.raises(ProtocolError, match="step-other"):
                    await s.step({"kind": "control", "type": "WAIT", "payload": {}})

    run(go())


def test_retries_stop_after_max_tries():
    async def go() -> None:
        async with Stub() as stub, EnvClient(_cfg(stub.url, tries=3)) as client:
            async with client.session() as s:
                stub.script("evaluate", *[(504, {"ok": False, "error": "slow"})] * 5)
                with pytest.raises(EnvUnavailable, match="gave up after 3 tries"):
                    await s.evaluate()
            assert len(stub.ops("evaluate")) == 3

    run(go())


def test_timeouts_are_retried_with_the_same_key():
    async def go() -> None:
        async with Stub() as stub, EnvClient(_cfg(stub.url, step_s=0.3)) as client:
            slow = (200, {"ok": True, "observation": OBS, "reward": 0, "done": False}, 1.0)
            stub.script("step", slow)
            async with client.session() as s:
                await s.step({"kind": "control", "type": "WAIT", "payload": {}})
            steps = stub.ops("step")
            assert len(steps) == 2
            assert steps[0].headers["Idempotency-Key"] == steps[1].headers["Idempotency-Key"]

    run(go())


def test_allocate_polls_while_pending():
    async def go() -> None:
        async with Stub() as stub, EnvClient(_cfg(stub.url)) as client:
            wait = (200, {"ok": True, "pending": True, "retry_after_seconds": 0.05})
            stub.script("allocate", wait, (503, {"ok": False, "error": "master busy"}), wait)
            async with client.session() as s:
                pass
            bodies = [r.body for r in stub.ops("allocate")]
            assert len(bodies) == 4
            assert all(b == {"runtime": "osworld", "session_id": s.session_id} for b in bodies)
            assert [r.path for r in stub.ops("release")] == [f"/v1/sessions/{s.session_id}"]

    run(go())


def test_allocate_deadline_gives_up_and_cancels_the_request():
    async def go() -> None:
        cfg = _cfg("", allocate_deadline_s=0.3)
        async with Stub() as stub:
            cfg.server_url = stub.url
            stub.script(
                "allocate", *[(200, {"ok": True, "pending": True, "retry_after_seconds": 0.1})] * 9
            )
            async with EnvClient(cfg) as client:
                with pytest.raises(EnvUnavailable, match="no desktop free"):
                    await client.allocate()
            sid = stub.ops("allocate")[0].body["session_id"]
            assert [r.path for r in stub.ops("release")] == [f"/v1/sessions/{sid}"]

    run(go())


def test_heartbeats_continue_during_a_slow_step():
    async def go() -> None:
        async with Stub() as stub, EnvClient(_cfg(stub.url, heartbeat_interval_s=0.1)) as client:
            slow = (200, {"ok": True, "observation": OBS, "reward": 0, "done": False}, 0.8)
            stub.script("step", slow)
            async with client.session() as s:
                await s.step({"kind": "control", "type": "WAIT", "payload": {}})
            beats = stub.ops("heartbeat")
            assert len(beats) >= 4
            assert all(b.headers["X-Cluster-Heartbeat-Mode"] == "independent-v1" for b in beats)
            assert all(b.path == f"/v1/sessions/{s.session_id}/heartbeat" for b in beats)

    run(go())


def test_release_on_error_and_on_cancellation():
    async def go() -> None:
        async with Stub() as stub, EnvClient(_cfg(stub.url)) as client:
            with pytest.raises(RuntimeError, match="boom"):
                async with client.session():
                    raise RuntimeError("boom")
            assert len(stub.ops("release")) == 1

            stub.script("step", (200, {"ok": True, "observation": OBS}, 1.5))
            started = asyncio.Event()

            async def episode() -> None:
                async with client.session() as s:
                    started.set()
                    await s.step({"kind": "control", "type": "WAIT", "payload": {}})

            task = asyncio.ensure_future(episode())
            await started.wait()
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert len(stub.ops("release")) == 2

    run(go())


def test_data_plane_goes_to_node_url_control_plane_to_master():
    async def go() -> None:
        async with Stub() as node, Stub() as master:
            master.node_url = node.url
            cfg = _cfg(master.url, heartbeat_interval_s=0.05)
            async with EnvClient(cfg) as client, client.session() as s:
                await s.reset({"task": "t"})
                await s.step({"kind": "control", "type": "DONE", "payload": {}})
                await s.evaluate()
                await asyncio.sleep(0.2)
            assert {r.op for r in master.requests} == {"allocate", "heartbeat", "release"}
            assert {r.op for r in node.requests} == {"reset", "step", "evaluate"}

    run(go())


def test_observation_without_screenshot_is_completed_by_observe():
    async def go() -> None:
        async with Stub() as stub, EnvClient(_cfg(stub.url)) as client:
            bare = {"modalities": {"screenshot": None}}
            stub.script("step", (200, {"ok": True, "observation": bare, "done": False}))
            async with client.session() as s:
                res = await s.step({"kind": "control", "type": "WAIT", "payload": {}})
            assert res.observation.size == (160, 210)
            assert len(stub.ops("observe")) == 1

    run(go())


def test_instruction_from_server_else_from_task_payload():
    async def go() -> None:
        async with Stub() as stub, EnvClient(_cfg(stub.url)) as client:
            stub.script("reset", (200, {"ok": True, "observation": OBS}))
            async with client.session() as s:
                first = await s.reset({"instruction": "Open the file."})
                second = await s.reset({"instruction": "generic"})
            assert first.instruction == "Open the file." and second.instruction == "Click."

    run(go())


def test_invalid_actions_are_not_sent_and_wait_sets_the_pause():
    async def go() -> None:
        async with Stub() as stub, EnvClient(_cfg(stub.url)) as client:
            async with client.session() as s:
                obs = await s.reset({"task": "t"})
                res = await s.act(Action(name="invalid", reason="no tool call"))
                assert not res.executed and res.observation is obs
                await s.act(Action(name="wait", time=2.5))
                await s.act(Action(name="left_click", coordinate=(999, 0)))
            steps = stub.ops("step")
            assert len(steps) == 2
            assert steps[0].body == {"action": {"kind": "control", "type": "WAIT", "payload": {}},
                                     "pause": 2.5}  # fmt: skip
            assert steps[1].body["action"]["payload"]["command"] == "pyautogui.click(159, 0)"

    run(go())


def test_out_of_range_score_is_a_protocol_error():
    async def go() -> None:
        async with Stub() as stub, EnvClient(_cfg(stub.url)) as client:
            stub.script("evaluate", (200, {"ok": True, "score": 1.5}))
            async with client.session() as s:
                with pytest.raises(ProtocolError, match=r"1\.5"):
                    await s.evaluate()

    run(go())


def test_client_refuses_a_second_event_loop():
    client = EnvClient(_cfg("http://127.0.0.1:9"))

    async def start() -> None:
        await client.start()

    async def use() -> None:
        with pytest.raises(RuntimeError, match="event loop"):
            await client.list_sessions()

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(start())
        asyncio.run(use())
    finally:
        loop.run_until_complete(client.close())
        loop.close()
