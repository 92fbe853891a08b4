"""Analyzer request errors during the online RL job: with the analyzer deployment's fault switch
failing a fraction of ``analyze`` calls, the embedded job still trains to the end; those steps
are masked for self-distillation (d = 0, no privileged target) and counted in the job's
metrics, and no rollout worker stops (a group lost to a dead worker would leave the group
accounting unbalanced or the trainer short of samples)."""

from __future__ import annotations

import math
import socket
from pathlib import Path

import pytest

from train_loops.jsonl import read_jsonl
from train_loops.schema import read_parquet
from workflows.common.config_io import load_config
from workflows.online_rl.config import OnlineRLConfig

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_analyzer_errors_mask_steps_and_the_job_goes_on(tmp_path: Path, ray_cluster) -> None:
    from workflows.online_rl import job

    cfg = load_config(OnlineRLConfig, "embedded", [
        f"runs_dir={tmp_path}", "run_name=faults", f"serve_http_port={_free_port()}",
        # Random tiny models (no warm start to build in CI): the job's machinery is under test.
        "policy.model_path=tiny:0", "policy.agent_style=toolcall",
        "policy.sampling.max_new_tokens=24", "analyzer.model_path=tiny:1",
        "analyzer.sampling.max_new_tokens=24", "analyzer.fault_rate=0.3",
        "rollout.max_steps=3", "trainer.max_steps=2", "trainer.checkpoint_every=2",
        "trainer.cpus_per_worker=0.5", "progress_every_s=3",
    ])  # fmt: skip
    last = job.run(cfg)

    steps = [r for r in read_jsonl(cfg.run_dir / "train_metrics.jsonl") if "loss/total" in r]
    assert len(steps) == 2 and all(math.isfinite(r["loss/total"]) for r in steps)
    assert all(r["sd/frac_masked"] == 1.0 for r in steps)  # no step had a target
    started = last["rollout/groups_started"]
    ended = sum(last[f"rollout/groups_{k}"] for k in ("completed", "dropped_stale", "cancelled"))
    assert last["rollout/groups_dropped_failed"] == 0 and started == ended
    errors, env_steps = last["rollout/analyzer_errors"], last["env/steps"]
    assert 0 < errors < env_steps and last["rollout/score_errors"] == 0

    rows = read_parquet(sorted((cfg.run_dir / "trajectories").glob("*/*.parquet")))
    assert rows
    for r in rows:  # a failed judgment (or the random analyzer's garbage): masked, no target
        assert r["d"] == 0 and r["guide"] == r["avoid"] == ""
        assert all(math.isnan(x) for x in r["privileged_logprobs"])
