"""Entropulse without a trainer: the entropy tracker, the trigger rules, the successful samples
taken from the buffer's shards, the phase's trainer layout."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from train_loops.config import OptimConfig, cpu_trainer
from train_loops.schema import write_parquet
from workflows.online_rl.config import EntropulseConfig
from workflows.online_rl.entropulse import (
    Entropulse,
    EntropulseStop,
    EntropyTracker,
    sft_phase_config,
    should_trigger,
    successful_step_samples,
)


def metric_line(entropy: float, kind: str = "rl") -> str:
    return json.dumps({"kind": kind, "run": kind, "policy/entropy": entropy, "train/step": 1})


def test_tracker_reads_complete_rl_lines_only(tmp_path: Path) -> None:
    path = tmp_path / "train_metrics.jsonl"
    path.write_text(metric_line(9.0) + "\n")
    tracker = EntropyTracker(path)  # from the end: a restarted job starts a fresh window
    assert tracker.poll() == []
    with path.open("a") as f:
        f.write(metric_line(2.0) + "\n" + metric_line(1.0, kind="sft") + "\n")
        f.write("not json\n" + metric_line(1.5)[:20])  # the last line is still being written
    assert tracker.poll() == [2.0]
    with path.open("a") as f:
        f.write(metric_line(1.5)[20:] + "\n")
    assert tracker.poll() == [1.5]
    assert tracker.smoothed(2) == 1.75 and tracker.smoothed(3) is None
    assert EntropyTracker(path, from_end=False).poll() == [9.0, 2.0, 1.5]


def test_threshold_trigger_waits_for_the_window_and_the_cooldown() -> None:
    cfg = EntropulseConfig(enabled=True, threshold=1.0, window=3, min_rl_steps=4)
    assert should_trigger(cfg, [0.5, 0.5, 0.5], phases=0) is None  # before min_rl_steps
    assert should_trigger(cfg, [3.0, 0.5, 0.5, 2.5], phases=0) is None  # mean 1.17
    trig = should_trigger(cfg, [3.0, 0.5, 0.5, 0.5], phases=0)
    assert trig is not None and trig.reason == "threshold" and trig.rl_steps == 4
    assert trig.entropy == 0.5
    limited = cfg.model_copy(update={"max_phases": 1})
    assert should_trigger(limited, [0.1] * 10, phases=1) is None
    off = cfg.model_copy(update={"enabled": False})
    assert should_trigger(off, [0.1] * 10, phases=0) is None


def test_schedule_trigger_counts_rl_steps() -> None:
    cfg = EntropulseConfig(enabled=True, trigger="schedule", every_rl_steps=5, window=2)
    assert should_trigger(cfg, [9.0] * 4, phases=0) is None
    trig = should_trigger(cfg, [9.0] * 5, phases=0)
    assert trig is not None and trig.reason == "schedule"


def step_row(sid: str, reward: float, created: float) -> dict[str, Any]:
    return {
        "sample_id": sid, "task_id": "t", "group_id": "g", "episode_id": "e", "step_index": 0,
        "num_steps": 1, "prompt_ids": [1, 2, 3], "response_ids": [4, 5],
        "behavior_logprobs": [-1.0, -1.0], "ordinary_logprobs": [-1.0, -1.0],
        "privileged_logprobs": [-1.0, -1.0], "screenshots": [], "response_text": "x",
        "action": "{}", "score": max(reward, 0.0), "reward": reward, "advantage": 0.0,
        "consistency": None, "effectiveness": None, "guide": "", "avoid": "", "d": 0, "v": 0.5,
        "behavior_version": 0, "privileged_version": 0, "t_generate_s": 0.0, "t_env_s": 0.0,
        "t_analyze_s": 0.0, "t_score_s": 0.0, "created_at": created,
    }  # fmt: skip


def test_successful_samples_from_pending_and_taken_shards(tmp_path: Path) -> None:
    t = time.time()
    write_parquet(
        [step_row("a", 1.0, t), step_row("b", -1.0, t + 1), step_row("c", 1.0, t + 2)],
        tmp_path / "taken" / "g0.parquet",
    )
    write_parquet(
        [step_row("d", 1.0, t + 3), step_row("c", 1.0, t + 2)], tmp_path / "pending" / "g1.parquet"
    )
    rows = successful_step_samples(tmp_path)
    assert [r["sample_id"] for r in rows] == ["a", "c", "d"]  # no failure, no duplicate
    assert [r["sample_id"] for r in successful_step_samples(tmp_path, max_samples=2)] == ["c", "d"]
    assert successful_step_samples(tmp_path / "nothing") == []


def test_sft_phase_uses_the_rl_trainer_layout() -> None:
    rl = cpu_trainer(samples_per_step=8, max_steps=100, checkpoint_every=10, publish_every=1)
    sft = sft_phase_config(EntropulseConfig(sft_steps=3, lr=2e-5), rl, OptimConfig(lr=1e-6))
    t = sft.trainer
    assert (t.num_workers, t.zero_stage, t.samples_per_step, t.publish_every) == (2, 2, 8, 1)
    assert (t.max_steps, t.checkpoint_every, t.cycle_data) == (3, 3, True)
    assert sft.optim.lr == 2e-5
    keep = sft_phase_config(EntropulseConfig(lr=None), rl, OptimConfig(lr=1e-6))
    assert keep.optim.lr == 1e-6


def test_entropulse_polls_rl_metrics_and_counts_past_phases(tmp_path: Path) -> None:
    cfg = EntropulseConfig(enabled=True, threshold=1.0, window=2, min_rl_steps=2)
    (tmp_path / "entropulse.jsonl").write_text(
        json.dumps({"event": "entropulse/phase_end", "entropulse/index": 1}) + "\n"
    )
    pulse = Entropulse(cfg, tmp_path, cpu_trainer(), OptimConfig())
    assert pulse.phases == 1 and pulse.poll() is None
    with (tmp_path / "train_metrics.jsonl").open("a") as f:
        f.write(metric_line(0.4) + "\n" + metric_line(0.2, "sft") + "\n" + metric_line(0.6) + "\n")
    trig = pulse.poll()
    assert trig is not None and trig.entropy == 0.5 and trig.rl_steps == 2


def test_stop_fn_fires_at_the_step_the_rule_does() -> None:
    """The in-loop trigger: same rule as the JSONL tracker, fed one step's metrics at a time."""
    cfg = EntropulseConfig(enabled=True, threshold=1.0, window=2, min_rl_steps=3)
    stop = EntropulseStop(cfg, phases_done=0)
    steps = [{"policy/entropy": e} for e in (0.5, 0.5, 2.0, 0.4, 0.4)]
    assert [stop(m) for m in steps] == [False, False, False, False, True]
    assert stop({"loss/pg": 0.1}) and len(stop.values) == 5  # no entropy: no value added
    capped = EntropulseStop(cfg.model_copy(update={"max_phases": 1}), phases_done=1)
    assert not any(capped(m) for m in steps)
