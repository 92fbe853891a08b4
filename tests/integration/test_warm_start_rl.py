"""The main job learns from a warm start: a small warm start is built by the real pipeline
(scripted demonstrations in Chromium → behaviour cloning through Ray Train + DeepSpeed → the
analyzer pipeline), then six RL steps of the online job from it give a policy gradient (groups
that sometimes succeed: samples with non-zero advantage) and distillation targets (the
analyzer's judgments are usable on part of the steps)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from train_loops.jsonl import read_jsonl
from workflows.common.config_io import load_config
from workflows.online_rl.config import OnlineRLConfig
from workflows.warm_start.build import REPORT, problems, warm_start
from workflows.warm_start.config import load

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]

# Tasks the small warm start half learns: GRPO groups on them have reward variance.
TASKS = "[click-button,click-dialog-2,click-tab]"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_rl_steps_from_a_small_warm_start(tmp_path: Path, ray_cluster) -> None:
    cfg = load(overrides=[
        f"cache_dir={tmp_path / 'cache'}", f"tasks={TASKS}", "demos.seeds_per_task=16",
        "bc.steps=120", "check.seeds_per_task=2", "analyzer.seeds_per_task=6",
        "analyzer.epochs=12",
    ])  # fmt: skip
    folder = warm_start(cfg)
    assert problems(folder) == [] and folder == cfg.folder
    report = json.loads((folder / REPORT).read_text())
    assert report["guidance_gap"]["n"] > 0 and report["analyzer"]["num_train"] > 0
    assert warm_start(cfg) == folder  # cached: found, not rebuilt

    rl = load_config(OnlineRLConfig, "embedded", [
        f"runs_dir={tmp_path}", "run_name=warm-rl", f"policy.model_path={folder / 'policy'}",
        f"analyzer.model_path={folder / 'analyzer'}", f"rollout.tasks={TASKS}",
        # Six steps, without the samples that carry no gradient. The first groups to finish are
        # the quick all-success ones (one-step episodes); a small warm start often solves a task
        # always or never, so the informative order passes over tasks whose last two groups had
        # equal rewards (with fixed round-robin, one CI run trained 4 steps on such groups only).
        "trainer.max_steps=6", "trainer.checkpoint_every=6", "buffer.drop_zero_gradient=true",
        "rollout.task_order=informative",
        "trainer.cpus_per_worker=0.5", f"serve_http_port={_free_port()}", "progress_every_s=5",
    ])  # fmt: skip
    from workflows.online_rl import job

    job.run(rl)
    steps = [r for r in read_jsonl(rl.run_dir / "train_metrics.jsonl") if "loss/pg" in r]
    assert len(steps) == 6
    # Groups with mixed outcomes: samples with non-zero advantage, hence a policy gradient
    # (the value of L_PG is -mean A at ρ = 1, ~0 for whole groups, so it says less).
    assert max(r["pg/frac_nonzero_adv"] for r in steps) > 0, steps
    assert min(r["sd/frac_masked"] for r in steps) < 1.0, steps
