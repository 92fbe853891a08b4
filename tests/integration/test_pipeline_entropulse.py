"""Entropulse for real: a forced entropy trigger on the trainer's metrics JSONL, an SFT phase
with Ray Train + DeepSpeed ZeRO-2 (2 CPU workers) from an RL checkpoint on the successful step
samples of the buffer's shards, weight publication continuing the version count, and the RL
start decision (``resolve_start``) taking exactly the SFT weights."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import ray
import torch

from tests.integration._train_helpers import RecordingPublisher, new_publish_log, weights_digest
from train_loops.checkpoint import TrainerState, resolve_start
from train_loops.config import OptimConfig, cpu_trainer
from train_loops.jsonl import JsonlWriter, read_jsonl
from train_loops.schema import write_parquet
from workflows.online_rl.config import EntropulseConfig
from workflows.online_rl.entropulse import EVENTS_FILE, Entropulse

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
RL_STEP, RL_VERSION, SFT_STEPS = 5, 5, 3


def _weights(path: Path | str) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(str(path)).state_dict()


def _rl_checkpoint(run_dir: Path, policy: Path) -> Path:
    """A checkpoint as the RL trainer leaves it (weights, processor files, trainer state)."""
    ckpt = run_dir / "rl" / f"checkpoint_rl_{RL_STEP:06d}"
    shutil.copytree(policy, ckpt)
    state = {"kind": "rl", "step": RL_STEP, "version": RL_VERSION, "world_size": 2,
             "zero_stage": 2, "base_model": str(policy)}  # fmt: skip
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    return ckpt


def _metric(entropy: float, kind: str) -> str:
    return json.dumps({"run": kind, "kind": kind, "policy/entropy": entropy}) + "\n"


def test_forced_trigger_runs_an_sft_phase_that_rl_continues_from(
    tmp_path: Path, ray_cluster, tiny_policy_path: Path
) -> None:
    from train_loops.sample_maker import make_step_samples

    rows = make_step_samples(str(tiny_policy_path), num_groups=3, group_size=4, max_new_tokens=8)
    write_parquet(rows, tmp_path / "trajectories" / "taken" / "g0.parquet")
    successes = [r for r in rows if r["reward"] > 0]
    assert 4 <= len(successes) < len(rows)
    ckpt = _rl_checkpoint(tmp_path, tiny_policy_path)
    trainer = cpu_trainer(samples_per_step=4, micro_batch_size=2, cpus_per_worker=0.5)
    # threshold far above any entropy: the trigger is forced as soon as the window is full
    cfg = EntropulseConfig(enabled=True, threshold=1e6, window=2, min_rl_steps=2,
                           sft_steps=SFT_STEPS, lr=3e-3, min_samples=4)  # fmt: skip
    pulse = Entropulse(cfg, tmp_path, trainer, OptimConfig(lr=1e-6),
                       metrics=JsonlWriter(tmp_path / "metrics.jsonl"))  # fmt: skip
    metrics = tmp_path / "train_metrics.jsonl"
    with metrics.open("a") as f:
        f.write(_metric(6.9, "rl"))
    assert pulse.poll() is None  # window not full yet
    with metrics.open("a") as f:
        f.write(_metric(6.8, "rl"))
    trigger = pulse.poll()
    assert trigger is not None and trigger.reason == "threshold" and trigger.rl_steps == 2

    log = new_publish_log()
    phase = pulse.run_phase(ckpt, trigger, publish_fn=RecordingPublisher(log))

    assert not phase.skipped and phase.num_samples == len(successes)
    assert phase.version == RL_VERSION + SFT_STEPS and phase.sft_steps == SFT_STEPS
    calls: list[dict[str, Any]] = ray.get(log.get_calls.remote())
    assert [c["version"] for c in calls] == [6, 7, 8]  # served policy follows the SFT phase
    # The SFT phase changed the weights ...
    before, after = _weights(ckpt), _weights(phase.checkpoint)
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(changed) > len(before) // 2, f"only {len(changed)} tensors changed"
    assert calls[-1]["digest"] == weights_digest(after)
    # ... and RL continues from exactly those weights, at the phase's version.
    rl_base = TrainerState(kind="rl", world_size=2, zero_stage=2, base_model=str(ckpt))
    start = resolve_start(Path(phase.checkpoint), rl_base, str(ckpt))
    assert start.weights == phase.checkpoint and start.state.version == phase.version
    assert start.state.step == 0 and start.optimizer_dir is None  # a new RL phase
    assert start.state.base_model == str(tiny_policy_path)  # KL reference kept
    resumed = _weights(start.weights)
    assert all(torch.equal(resumed[k], after[k]) for k in after)

    sft_losses = [r["loss/sft"] for r in read_jsonl(metrics) if r.get("kind") == "sft"]
    assert len(sft_losses) == SFT_STEPS and sft_losses[-1] < sft_losses[0]
    events = read_jsonl(tmp_path / EVENTS_FILE)
    assert [e["event"] for e in events] == ["entropulse/phase_start", "entropulse/phase_end"]
    assert [e["entropulse/phase"] for e in events] == [1.0, 0.0]
    assert events[0]["train/version"] == RL_VERSION and events[1]["train/version"] == 8
    assert read_jsonl(tmp_path / "metrics.jsonl") == events  # visible in the job's metrics
    assert pulse.phases == 1 and pulse.poll() is None  # RL counting starts again
