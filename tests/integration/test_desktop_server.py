"""The session protocol against ``python -m env_client.server --backend desktop``: the real
server process, real local desktops, real HTTP, the real client.

Skips until the server has the ``desktop`` backend switch (see the issue-14 integration notes)
and where the desktop's programs are not installed (``bash scripts/setup_desktop.sh``).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from env_client.client import EnvClient
from env_client.config import EmbeddedEnvConfig, EnvClientConfig, RetryConfig
from env_client.desktop.config import DesktopConfig
from env_client.desktop.experts import builtin_tasks, expert_steps
from env_client.desktop.local import missing_binaries
from env_client.errors import EnvError
from env_client.observation import png_size
from env_client.server import EmbeddedServer, start_embedded_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

if "backend" not in EmbeddedEnvConfig.model_fields:
    pytest.skip("the server has no --backend switch yet", allow_module_level=True)
_missing = missing_binaries(DesktopConfig()) + [
    a for a in ("xterm", "mousepad", "soffice") if shutil.which(a) is None
]
if _missing:
    pytest.skip(f"desktop programs not installed ({_missing}): run scripts/setup_desktop.sh",
                allow_module_level=True)  # fmt: skip


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[EmbeddedServer, Path]]:
    # Not under pytest's tmp_path: a root server's desktop user must be able to enter the root.
    root = Path(tempfile.mkdtemp(prefix="csd-test-desktops-"))
    root.chmod(0o711)
    cfg = EmbeddedEnvConfig(
        backend="desktop",
        desktop=DesktopConfig(root=str(root)),
        capacity=2,
        prewarm=1,
        allocate_retry_after_s=0.2,
    )
    try:
        with start_embedded_server(cfg, timeout_s=60) as srv:
            yield srv, root
        assert not srv.alive()
        assert not [p for p in root.iterdir() if p.name.startswith("desk-")]  # folders gone
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _client(url: str) -> EnvClient:
    cfg = EnvClientConfig(
        server_url=url, allocate_deadline_s=60,
        retry=RetryConfig(backoff_base_s=0.05, backoff_cap_s=0.5, max_tries=4),
    )  # fmt: skip
    return EnvClient(cfg)


def _task(tid: str) -> dict[str, Any]:
    return next(t for t in builtin_tasks("train") + builtin_tasks("eval") if t["task"] == tid)


async def _episode(client: EnvClient, tid: str, steps: list[dict[str, Any]]) -> float:
    async with client.session() as s:
        obs = await s.reset(_task(tid))
        assert png_size(obs.screenshot or b"") == (1024, 768)
        for step in steps:
            await s.step(step["action"], pause=float(step.get("pause", 0.0)))
        return await s.evaluate()


def _desk_folders(root: Path) -> list[Path]:
    return [p for p in root.iterdir() if p.name.startswith("desk-")]


def test_expert_episodes_on_two_concurrent_sessions(server: tuple[EmbeddedServer, Path]) -> None:
    srv, root = server
    experts = expert_steps()

    async def main() -> list[float]:
        async with _client(srv.url) as client:
            return await asyncio.gather(
                _episode(client, "calc-sum", experts["calc-sum"]),
                _episode(client, "te-delete-first-line", experts["te-delete-first-line"]),
            )

    assert asyncio.run(main()) == [1.0, 1.0]
    # Released sessions take their desktops with them (prewarmed spares may remain); the
    # release is answered first, the desktop closed right after.
    deadline = time.monotonic() + 15
    while len(_desk_folders(root)) > 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(_desk_folders(root)) <= 1, _desk_folders(root)


def test_wrong_answers_and_bad_input_are_clear_errors(server: tuple[EmbeddedServer, Path]) -> None:
    srv, _ = server

    async def main() -> None:
        async with _client(srv.url) as client, client.session() as s:
            bad = {**_task("os-make-folder"), "config": [{"type": "teleport"}]}
            with pytest.raises(EnvError, match=r"HTTP 400.*field 'config\[0\]\.type'"):
                await s.reset(bad)
            failing = {**_task("os-make-folder"),
                       "config": [{"type": "execute", "parameters": {"command": "exit 4", "shell": True}}]}  # fmt: skip
            with pytest.raises(EnvError, match=r"HTTP 422.*exit status 4"):
                await s.reset(failing)
            await s.reset(_task("os-make-folder"))
            hostile = {"kind": "gui", "type": "pyautogui",
                       "payload": {"command": "import os; os.system('touch /tmp/pwned')"}}  # fmt: skip
            with pytest.raises(EnvError, match="HTTP 400"):
                await s.step(hostile)
            with pytest.raises(EnvError, match=r"HTTP 400.*LAUNCH"):
                await s.step({"kind": "gui", "type": "LAUNCH", "payload": {}})
            res = await s.step({"kind": "gui", "type": "TYPING", "payload": {"text": "ls"}})
            assert res.info.get("applied") == 1
            await s.step({"kind": "control", "type": "DONE", "payload": {}})
            assert await s.evaluate() == 0.0  # the folder was never made
        assert not os.path.exists("/tmp/pwned")

    asyncio.run(main())
    with urllib.request.urlopen(f"{srv.url}/healthz", timeout=10) as resp:  # still up
        assert resp.status == 200


def test_infeasible_task_is_scored_by_a_fail_answer(server: tuple[EmbeddedServer, Path]) -> None:
    srv, _ = server

    async def main() -> tuple[float, float]:
        async with _client(srv.url) as client:
            fail = [{"action": {"kind": "control", "type": "FAIL", "payload": {}}}]
            done = [{"action": {"kind": "control", "type": "DONE", "payload": {}}}]
            return (
                await _episode(client, "os-infeasible-bluetooth", fail),
                await _episode(client, "os-infeasible-bluetooth", done),
            )

    assert asyncio.run(main()) == (1.0, 0.0)
