"""Evaluation end to end: two policy checkpoints deployed in turn as Serve apps, three
independent runs over eval-split instances on the embedded MiniWoB++ server, the scripted
expert as the reference column; the Markdown + JSON report and the bar chart."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from workflows.common.config_io import load_config
from workflows.common.pipeline_config import PipelineConfig
from workflows.evaluation import evaluate

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_checkpoints_three_runs_one_report(tmp_path: Path, ray_cluster) -> None:
    cfg = load_config(
        PipelineConfig,
        "analyzer_pipeline",
        [
            f"runs_dir={tmp_path}", "run_name=ev", f"serve_http_port={_free_port()}",
            "env.embedded.capacity=4", "env.embedded.prewarm=2", "policy.num_cpus=0.25",
            "evaluate.checkpoints=[{name: base, path: 'tiny:0'}, {name: seed1, path: 'tiny:1'}]",
            "evaluate.tasks=[click-test, click-button]", "evaluate.seeds_per_task=1",
            "evaluate.runs=3", "evaluate.max_steps=2", "evaluate.reference_expert=true",
        ],
    )  # fmt: skip
    report = evaluate.run(cfg)

    out = cfg.run_dir / "eval"
    data = json.loads((out / "report.json").read_text())
    outcomes = data["outcomes"]
    assert len(outcomes) == 3 * 3 * 2  # checkpoints (2 + expert) x runs x instances
    assert {o["checkpoint"] for o in outcomes} == {"base", "seed1", evaluate.EXPERT}
    assert all(o["error"] is None and o["steps"] <= 2 for o in outcomes)
    assert report["failed_episodes"] == {"base": 0, "seed1": 0, evaluate.EXPERT: 0}
    expert = report["overall"][evaluate.EXPERT]
    assert expert["runs"] == [1.0, 1.0, 1.0] and expert["std"] == 0.0  # the harness scores right
    for name in ("base", "seed1"):
        stats = report["overall"][name]
        assert len(stats["runs"]) == 3 and stats["episodes"] == 6
        assert set(report["by_task"]["click-button"]) == {"base", "seed1", evaluate.EXPERT}
    assert list(report["by_kind"]) == ["click"]
    text = (out / "report.md").read_text()
    assert "| | base | seed1 | scripted-expert |" in text
    assert "| overall |" in text and "| click-test |" in text
    assert "| 100.0 ± 0.0 |" in text
    assert (out / "pass_at_1.png").read_bytes().startswith(b"\x89PNG")
