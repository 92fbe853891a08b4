"""The online RL job end to end on real parts: embedded MiniWoB++ server (Chromium), Ray Serve
policy + analyzer, rollout actors, the buffer's Ray Data stream, Ray Train + DeepSpeed ZeRO-2.

One scenario, two runs of the job over one run folder: run A (a subprocess with its own Ray
cluster) is killed with SIGKILL after its first checkpoint; run B (in-process, on the test
session's cluster) resumes from that checkpoint and trains to the end. Checked: resume point,
served versions rising while episodes run, step-sample structure, group accounting (none lost
or duplicated, A's unconsumed groups restored), every environment session released.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from train_loops.schema import read_parquet, validate_sample
from workflows.config import OnlineRLConfig
from workflows.config_io import load_config
from workflows.metrics import read_jsonl

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _live_sessions(url: str) -> int:
    with urllib.request.urlopen(f"{url}/v1/sessions", timeout=10) as r:
        body = json.loads(r.read())
    return len(body["sessions"])


def _checkpoint_steps(run_dir: Path) -> list[int]:
    files = (run_dir / "rl").glob("checkpoint_*/trainer_state.json")
    return sorted(json.loads(f.read_text())["step"] for f in files)


def _wait_for(pred, timeout_s: float, what: str, poll_s: float = 2.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(poll_s)


@pytest.fixture(scope="module")
def env_server():
    from env_client.config import EmbeddedEnvConfig
    from env_client.server import start_embedded_server

    # Short heartbeat expiry: the killed run's sessions must be reclaimed during the test.
    cfg = EmbeddedEnvConfig(capacity=8, prewarm=2, heartbeat_timeout_s=8, reclaim_interval_s=0.5)
    with start_embedded_server(cfg) as server:
        yield server


def _overrides(tmp_path: Path, env_url: str) -> list[str]:
    return [
        f"runs_dir={tmp_path}",
        "run_name=it",
        f"env.server_url={env_url}",
        "env.heartbeat_interval_s=1",
        "trainer.checkpoint_every=2",
        "trainer.cpus_per_worker=0.5",
        "rollout.max_steps=3",
        "progress_every_s=3",
    ]


def test_async_run_killed_and_resumed(tmp_path: Path, env_server, ray_cluster) -> None:
    from workflows import rl_job

    run_dir = tmp_path / "it"
    overrides = _overrides(tmp_path, env_server.url)
    log = (tmp_path / "run_a.log").open("wb")
    run_a = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "workflows.online_rl",
            *overrides,
            f"serve_http_port={_free_port()}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        _wait_for(
            lambda: _checkpoint_steps(run_dir) or run_a.poll() is not None,
            900,
            "run A's first checkpoint",
        )
        assert run_a.poll() is None, (tmp_path / "run_a.log").read_text()[-3000:]
    finally:
        os.killpg(run_a.pid, signal.SIGKILL)
        run_a.wait(30)
    step_a = max(_checkpoint_steps(run_dir))
    assert step_a >= 2 and step_a % 2 == 0
    pending_at_kill = {p.stem for p in (run_dir / "trajectories" / "pending").glob("*.parquet")}
    # The killed run never released its desktops; heartbeat expiry reclaims them.
    _wait_for(lambda: _live_sessions(env_server.url) == 0, 60, "reclaim of run A's sessions", 1.0)

    final = step_a + 2
    cfg = load_config(
        OnlineRLConfig,
        "embedded",
        [*overrides, f"trainer.max_steps={final}", f"serve_http_port={_free_port()}"],
    )
    last = rl_job.run(cfg)

    # Resumed from A's checkpoint, trained to the end.
    starts = [e for e in read_jsonl(run_dir / "train_events.jsonl") if e.get("event") == "start"]
    assert starts[-1]["resumed_from"] is not None and starts[-1]["step"] == step_a
    assert max(_checkpoint_steps(run_dir)) == final
    assert last["train/version"] >= final

    # Weights were hot-swapped while episodes ran: rollouts saw the served version rise in B.
    served = [r["serve/policy_version"] for r in read_jsonl(run_dir / "metrics.jsonl")]
    assert max(served) > step_a

    # No group lost or duplicated; A's completed-but-unconsumed groups came back.
    started = last["rollout/groups_started"]
    ended = sum(
        last[f"rollout/groups_{k}"]
        for k in ("completed", "dropped_failed", "dropped_stale", "cancelled")
    )
    assert started == ended and last["rollout/groups_in_flight"] == 0
    assert last["rollout/groups_restored"] == len(pending_at_kill)

    rows = read_parquet(sorted((run_dir / "trajectories").glob("*/*.parquet")))
    assert rows, "no step samples were written"
    ids = [r["sample_id"] for r in rows]
    assert len(ids) == len(set(ids))
    by_group: dict[str, set[str]] = {}
    for r in rows:
        validate_sample(r)
        assert r["prompt_ids"] and r["response_ids"] and r["screenshots"]
        assert r["reward"] in (-1.0, 1.0) and r["behavior_version"] <= r["privileged_version"] + 1
        by_group.setdefault(r["group_id"], set()).add(r["episode_id"])
    assert all(len(eps) == cfg.rollout.group_size for eps in by_group.values())

    # Every session B opened was handed back.
    assert _live_sessions(env_server.url) == 0
    assert (run_dir / "learning_curve.png").stat().st_size > 0
