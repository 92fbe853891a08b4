"""Pass@1 aggregation (per run, per task, per kind, overall), the Markdown table and the chart."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest

from workflows.evaluation.evaluate import episode_seed
from workflows.evaluation.report import aggregate, bar_chart, markdown, run_stats


def outcome(ck: str, run: int, task: str, kind: str, success: bool | None) -> dict[str, Any]:
    return {
        "checkpoint": ck, "run": run, "task_id": f"miniwob/{task}/0", "task_name": task,
        "kind": kind, "success": success, "score": None if success is None else float(success),
        "steps": 1, "error": None if success is not None else "EnvUnavailable: down",
    }  # fmt: skip


OUTCOMES = [
    # checkpoint a: run 0 solves 2/3, run 1 solves 1/3, run 2 solves 3/3
    outcome("a", 0, "click-test", "click", True),
    outcome("a", 0, "click-button", "click", True),
    outcome("a", 0, "enter-text", "type", False),
    outcome("a", 1, "click-test", "click", True),
    outcome("a", 1, "click-button", "click", False),
    outcome("a", 1, "enter-text", "type", False),
    outcome("a", 2, "click-test", "click", True),
    outcome("a", 2, "click-button", "click", True),
    outcome("a", 2, "enter-text", "type", True),
    # checkpoint b: never succeeds; one episode could not be played
    *(
        outcome("b", r, t, k, False)
        for r in range(3)
        for t, k in (("click-test", "click"), ("click-button", "click"))
    ),
    outcome("b", 0, "enter-text", "type", None),
    outcome("b", 1, "enter-text", "type", False),
    outcome("b", 2, "enter-text", "type", False),
]


def test_run_stats_are_over_run_level_rates() -> None:
    stats = run_stats({0: [True, False], 1: [True, True], 2: [False, False]})
    assert stats["runs"] == [0.5, 1.0, 0.0]
    assert stats["mean"] == pytest.approx(0.5)
    assert stats["std"] == pytest.approx(statistics.stdev([0.5, 1.0, 0.0]))
    assert (stats["min"], stats["max"], stats["episodes"]) == (0.0, 1.0, 6)
    assert run_stats({0: [True]})["std"] == 0.0
    assert run_stats({})["mean"] is None


def test_aggregate_per_task_kind_and_overall() -> None:
    report = aggregate(OUTCOMES, ["a", "b"])
    a = report["overall"]["a"]
    assert a["runs"] == pytest.approx([2 / 3, 1 / 3, 1.0])
    assert a["mean"] == pytest.approx(2 / 3)
    assert report["by_kind"]["click"]["a"]["runs"] == [1.0, 0.5, 1.0]
    assert report["by_task"]["enter-text"]["a"]["mean"] == pytest.approx(1 / 3)
    assert report["overall"]["b"]["mean"] == 0.0
    assert report["by_task"]["enter-text"]["b"]["episodes"] == 2  # the failed one left out
    assert report["failed_episodes"] == {"a": 0, "b": 1}
    assert list(report["by_kind"]) == ["click", "type"]


def test_markdown_and_chart_compare_checkpoints(tmp_path: Path) -> None:
    report = aggregate(OUTCOMES, ["a", "b"])
    meta = {"split": "eval", "instances": 3, "runs": 3, "max_steps": 50,
            "paths": {"a": "/ckpt/a", "b": "tiny:0"}}  # fmt: skip
    text = markdown(report, meta)
    assert "| | a | b |" in text
    assert "| overall | 66.7 ± 33.3 | 0.0 ± 0.0 |" in text
    assert "| enter-text |" in text and "| type |" in text
    assert "{'b': 1}" in text
    png = bar_chart(report, tmp_path / "chart.png")
    assert png.read_bytes().startswith(b"\x89PNG")


def test_episode_seeds_are_stable_and_differ_across_runs() -> None:
    assert episode_seed(0, 1, "miniwob/x/3") == episode_seed(0, 1, "miniwob/x/3")
    seeds = {episode_seed(0, r, "miniwob/x/3") for r in range(3)}
    assert len(seeds) == 3 and all(0 <= s < 2**30 for s in seeds)


def test_evaluate_cli_takes_repeated_checkpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    from workflows.evaluation import evaluate

    seen: list[Any] = []
    monkeypatch.setattr(evaluate, "run", seen.append)
    argv = ["--checkpoint", "base=tiny:0", "--checkpoint", "rl=/ckpt/rl", "evaluate.runs=2"]
    assert evaluate.main(argv) == 0
    cfg = seen[0]
    assert [(c.name, c.path) for c in cfg.evaluate.checkpoints] == [
        ("base", "tiny:0"),
        ("rl", "/ckpt/rl"),
    ]
    assert cfg.evaluate.runs == 2
    assert evaluate.main(["--checkpoint", "nopath"]) == 2
