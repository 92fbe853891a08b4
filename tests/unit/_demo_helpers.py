"""Shared by the demo app's tests: a run folder of real step-sample Parquet shards, the demo's
FastAPI app served on a loopback port (uvicorn in a thread), and JSON calls to it."""

from __future__ import annotations

import contextlib
import io
import json
import math
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from train_loops.schema import write_parquet

NAN = math.nan


def png(color: tuple[int, int, int], size: tuple[int, int] = (160, 210)) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return buf.getvalue()


def step_row(
    group: str,
    episode: int,
    step: int,
    *,
    score: float,
    d: int = 0,
    guide: str = "",
    avoid: str = "",
    privileged: list[float] | None = None,
    ordinary: list[float] | None = None,
    version: int = 0,
    screenshots: list[bytes] | None = None,
    num_steps: int = 2,
) -> dict[str, Any]:
    """One step sample with the fields a rollout worker writes (3 response tokens)."""
    episode_id = f"{group}-e{episode}"
    ordinary = ordinary if ordinary is not None else [-1.0, -2.0, -0.5]
    return {
        "sample_id": f"{episode_id}-s{step}",
        "task_id": "click-test",
        "group_id": group,
        "episode_id": episode_id,
        "step_index": step,
        "num_steps": num_steps,
        "prompt_ids": [1, 2, 3],
        "response_ids": [4, 5, 6],
        "behavior_logprobs": list(ordinary),
        "ordinary_logprobs": list(ordinary),
        "privileged_logprobs": privileged if privileged is not None else [NAN] * 3,
        "screenshots": screenshots if screenshots is not None else [png((200, 30, 30))],
        "response_text": 'click 3 (button "OK")',
        "action": json.dumps({"name": "left_click", "coordinate": [500, 400]}),
        "score": score,
        "reward": 1.0 if score >= 1 else -1.0,
        "advantage": 0.87 if score >= 1 else -0.87,
        "consistency": 1 if d else None,
        "effectiveness": (1 if d > 0 else 0) if d else None,
        "guide": guide,
        "avoid": avoid,
        "d": d,
        "v": 1.0 if d > 0 else (0.0 if d < 0 else 0.5),
        "behavior_version": version,
        "privileged_version": version,
        "t_generate_s": 0.1,
        "t_env_s": 0.1,
        "t_analyze_s": 0.1,
        "t_score_s": 0.1,
        "created_at": time.time(),
    }


def write_run(runs_dir: Path, name: str, screenshots: list[bytes] | None = None) -> Path:
    """A run folder as the job leaves it: a taken shard (version 0: one success, one failure
    whose first step got guidance) and a pending one (version 1), real Parquet files."""
    shots = screenshots
    guided = step_row(
        "g000000", 1, 0, score=0.0, d=-1, guide='click 3 (button "OK")', avoid="click 1",
        privileged=[-0.5, NAN, -0.25], screenshots=shots,
    )  # fmt: skip
    unguided = step_row(
        "g000001",
        0,
        0,
        score=0.0,
        d=1,
        version=1,
        privileged=[-1.0, -1.0, -1.0],
        screenshots=shots,
        num_steps=1,
    )  # fmt: skip  (d without guidance: the gate did not fire)
    g0 = [
        step_row("g000000", 0, 0, score=1.0, screenshots=shots, num_steps=1),
        guided,
        step_row("g000000", 1, 1, score=0.0, screenshots=shots),
    ]
    g1 = [unguided]
    folder = runs_dir / name
    write_parquet(g0, folder / "trajectories" / "taken" / "g000000.parquet")
    write_parquet(g1, folder / "trajectories" / "pending" / "g000001.parquet")
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(app: Any) -> Iterator[str]:
    """Serve an ASGI app on a loopback port for the block; its base URL inside."""
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(30)


def call(
    method: str, url: str, body: Any = None, raw: bytes | None = None
) -> tuple[int, dict[str, Any]]:
    """(status, JSON body) of one request; 4xx/5xx answers are returned, not raised."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())
