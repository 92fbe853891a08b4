"""The online RL job end to end on real parts: embedded MiniWoB++ server (Chromium), Ray Serve
policy + analyzer, rollout actors, the buffer's Ray Data stream, Ray Train + DeepSpeed ZeRO-2.

One scenario, two runs of the job over one run folder: run A (a subprocess with its own Ray
cluster, fixed-size updates) is killed with SIGKILL after its first checkpoint; run B
(in-process, on the test session's cluster, its analyzer failing 30% of requests, one update
per rollout batch of 2 groups as in the authors' schedule) resumes from that checkpoint and
trains to the end, with an Entropulse switch forced on its first RL step (entropy threshold
far above any entropy): the RL segment ends, an SFT phase changes the weights, RL continues
from them. Checked: resume point, served versions rising while episodes run, the phase
switch, step-sample structure, group accounting (none lost or duplicated, A's unconsumed
groups restored), analyzer errors masked and counted with no worker lost, TensorBoard
continuing across the kill, every session released.
"""

from __future__ import annotations

import contextlib
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

from train_loops.checkpoint import checkpoint_complete
from train_loops.jsonl import read_jsonl
from train_loops.lineage import read_lineage
from train_loops.schema import read_parquet, validate_sample
from workflows.common.config_io import load_config
from workflows.common.tracking import read_scalars
from workflows.online_rl.config import OnlineRLConfig

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
    """RL steps of the complete RL checkpoints of every segment (rl, rl-p01, …): the kill may
    land while Ray Train is still copying one into the run folder."""
    files = run_dir.glob("rl*/checkpoint_rl_*/trainer_state.json")
    done = [f for f in files if checkpoint_complete(f.parent)]
    return sorted(json.loads(f.read_text())["step"] for f in done)


def _weights(checkpoint: str | Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(Path(checkpoint) / "model.safetensors"))


# Forced Entropulse: any entropy is below the threshold after one RL step; the phase trains
# on every step sample (rewards are ±1 > -2), as the random tiny policy rarely succeeds.
ENTROPULSE = [
    "entropulse.enabled=true",
    "entropulse.threshold=1000000",
    "entropulse.window=1",
    "entropulse.min_rl_steps=1",
    "entropulse.max_phases=1",
    "entropulse.sft_steps=1",
    "entropulse.lr=0.003",
    "entropulse.min_samples=1",
    "entropulse.min_reward=-2",
]


RANDOM_MODELS = [
    "policy.model_path=tiny:0",
    "policy.agent_style=toolcall",
    "policy.sampling.max_new_tokens=48",
    "analyzer.model_path=tiny:1",
    "analyzer.sampling.max_new_tokens=64",
    "rollout.history_screens=2",
]


def _wait_for(pred, timeout_s: float, what: str, poll_s: float = 2.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(poll_s)


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the job and its whole Ray cluster at once, like a lost machine. Ray's daemons
    and workers run in process groups of their own, so the tree is collected by parentage."""
    import psutil

    try:
        tree = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    os.killpg(proc.pid, signal.SIGKILL)
    for child in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    proc.wait(30)
    psutil.wait_procs(tree, timeout=30)


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
        # Random tiny models in the tool-call style: this test is about the job's machinery
        # (kill, resume, Entropulse), not learning; the warm start has its own test.
        *RANDOM_MODELS,
        "env.heartbeat_interval_s=1",
        "trainer.checkpoint_every=2",
        "trainer.cpus_per_worker=0.5",
        "rollout.max_steps=3",
        "progress_every_s=3",
    ]


def test_async_run_killed_and_resumed(tmp_path: Path, env_server, ray_cluster) -> None:
    from workflows.online_rl import job as rl_job

    run_dir = tmp_path / "it"
    overrides = _overrides(tmp_path, env_server.url)
    log = (tmp_path / "run_a.log").open("wb")
    run_a = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "workflows.online_rl",
            *overrides,
            "rollout.score_ordinary=true",  # A rescores both contexts, B the privileged only
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
        _kill_tree(run_a)
    step_a = max(_checkpoint_steps(run_dir))
    assert step_a >= 2 and step_a % 2 == 0
    # The killed run never released its desktops; heartbeat expiry reclaims them.
    _wait_for(lambda: _live_sessions(env_server.url) == 0, 60, "reclaim of run A's sessions", 1.0)
    pending_at_kill = {p.stem for p in (run_dir / "trajectories" / "pending").glob("*.parquet")}

    final = step_a + 2
    cfg = load_config(
        OnlineRLConfig,
        "embedded",
        [
            *overrides, *ENTROPULSE, f"trainer.max_steps={final}",
            f"serve_http_port={_free_port()}",
            "analyzer.fault_rate=0.3",  # B's analyzer fails 30% of its requests (503)
            # B: the authors' update schedule, fed first by the groups A left untrained.
            "trainer.schedule=rollout_batch", "buffer.groups_per_batch=2",
        ],
    )  # fmt: skip
    last = rl_job.run(cfg)

    # Resumed from A's checkpoint, trained to the end.
    events = read_jsonl(run_dir / "train_events.jsonl")
    starts = [e for e in events if e.get("event") == "start" and e["kind"] == "rl"]
    assert [e["run"] for e in starts[-2:]] == ["rl", "rl-p01"]
    assert starts[-2]["resumed_from"] is not None and starts[-2]["step"] == step_a
    assert starts[-2]["restored_optimizer"]
    assert max(_checkpoint_steps(run_dir)) == final

    # The Entropulse switch: RL segment ended → SFT phase → RL resumed from the SFT weights.
    phase_start, phase_end = read_jsonl(run_dir / "entropulse.jsonl")
    assert phase_start["entropulse/reason"] == "threshold" and not phase_end["entropulse/skipped"]
    rl_end = [e for e in events if e.get("event") == "end" and e["run"] == "rl"][-1]
    assert rl_end["step"] == step_a + 1 and rl_end["reason"] == "stop_requested"
    sft_ckpt = phase_end["entropulse/checkpoint"]
    rl_ckpt = run_dir / "rl" / f"checkpoint_rl_{rl_end['step']:06d}"
    before, after = _weights(rl_ckpt), _weights(sft_ckpt)
    assert sum(not before[k].equal(after[k]) for k in before) > len(before) // 2
    assert starts[-1]["resumed_from"] == sft_ckpt and starts[-1]["step"] == rl_end["step"]
    assert starts[-1]["version"] == phase_end["entropulse/version"] == rl_end["version"] + 1
    assert not starts[-1]["restored_optimizer"]  # a new RL segment
    assert last["train/version"] >= final + 1  # the SFT step was published too
    phase_flags = [r.get("entropulse/phase") for r in read_jsonl(run_dir / "metrics.jsonl")]
    assert 1.0 in phase_flags and phase_flags[-1] == 0.0

    # Weights were hot-swapped while episodes ran: rollouts saw the served version rise in B.
    records = read_jsonl(run_dir / "metrics.jsonl")  # monitor records and phase events
    served = [r["serve/policy_version"] for r in records if "serve/policy_version" in r]
    assert max(served) > step_a

    # No group lost or duplicated; A's completed-but-unconsumed groups came back.
    started = last["rollout/groups_started"]
    ended = sum(
        last[f"rollout/groups_{k}"]
        for k in ("completed", "dropped_failed", "dropped_stale", "cancelled")
    )
    assert started == ended and last["rollout/groups_in_flight"] == 0
    # The analyzer's failed requests masked their steps and were counted; no worker stopped
    # (a dead worker's group would be missing from the accounting above).
    assert 0 < last["rollout/analyzer_errors"] < last["env/steps"]
    assert last["rollout/score_errors"] == 0 and last["rollout/groups_dropped_failed"] == 0
    assert last["rollout/groups_restored"] == len(pending_at_kill)

    rows = read_parquet(sorted((run_dir / "trajectories").glob("*/*.parquet")))
    assert rows, "no step samples were written"
    # B's updates are whole rollout batches: every sample of at most 2 groups (a group A began
    # training before the kill brings the rest of its rows), sizes varying with the episodes.
    group_of = {r["sample_id"]: r["group_id"] for r in rows}
    lineage = read_lineage(run_dir / "rl-p01" / f"checkpoint_rl_{final:06d}")
    b_steps = [line for line in lineage if line["step"] > step_a]
    assert [line["step"] for line in b_steps] == list(range(step_a + 1, final + 1))
    for line in b_steps:
        assert 1 <= len({group_of[i] for i in line["ids"]}) <= 2, line
    assert last["buffer/rollout_batches"] >= len(b_steps)
    ids = [r["sample_id"] for r in rows]
    assert len(ids) == len(set(ids))
    by_group: dict[str, set[str]] = {}
    for r in rows:
        validate_sample(r)
        assert r["prompt_ids"] and r["response_ids"] and r["screenshots"]
        assert r["reward"] in (-1.0, 1.0) and r["behavior_version"] <= r["privileged_version"] + 1
        by_group.setdefault(r["group_id"], set()).add(r["episode_id"])
    assert all(len(eps) == cfg.rollout.group_size for eps in by_group.values())

    # TensorBoard: A's and B's records in one run folder, B's steps continuing after A's.
    scalars = read_scalars(run_dir)
    assert scalars["loss/pg"] and scalars["rollout/success_rate"]
    steps = [step for step, _ in scalars["env/steps"]]
    # Every monitor record (not the two phase events; A may die between its two writes).
    assert steps == sorted(steps) and len(steps) >= len(records) - 3
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) >= 2
    rl_steps = [step for step, _ in scalars["rl_step/loss/pg"]]  # every optimizer step, once
    assert rl_steps == sorted(set(rl_steps)) and rl_steps[-1] == final

    # Every session B opened was handed back.
    assert _live_sessions(env_server.url) == 0
    assert (run_dir / "learning_curve.png").stat().st_size > 0


def test_production_config_on_the_embedded_server_fails_fast(
    tmp_path: Path, env_server, ray_cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OSWorld task files sent to the MiniWoB server: the job stops at its preflight with the
    server's reason, before any Serve app or trainer starts (no job of failing groups)."""
    from tests.unit.test_task_sources import osworld_task, write_tree
    from workflows.online_rl import job

    examples = write_tree(tmp_path / "osworld", {"os": [osworld_task("a1")]})
    for name, value in {
        "HF_CKPT": str(tmp_path / "no-policy"),
        "ANALYZER_MODEL_PATH": str(tmp_path / "no-analyzer"),
        "GUI_ENV_SERVER_URL": env_server.url,
        "GUI_TEST_CONFIG_BASE_DIR": str(examples.parent),
    }.items():
        monkeypatch.setenv(name, value)
    cfg = load_config(OnlineRLConfig, "production_qwen3vl", [
        f"runs_dir={tmp_path}", "run_name=prod", "task_source.splits={train: ../test_all.json}",
    ])  # fmt: skip
    with pytest.raises(RuntimeError, match=r"refused task 'a1' of task source 'osworld'") as err:
        job.run(cfg)
    assert "runs MiniWoB tasks" in str(err.value)
    assert not (tmp_path / "prod" / "rl").exists()  # no trainer ever started
