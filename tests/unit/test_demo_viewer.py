"""The trajectory viewer's reading of run folders (real Parquet shards, no Ray)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.unit._demo_helpers import png, write_run
from workflows.demo.viewer import RunIndex, ViewerError, gate_fired, list_runs, logprob_gap

pytestmark = pytest.mark.timeout(60)


def test_logprob_gap_sums_finite_tokens_only() -> None:
    assert logprob_gap([-0.5, math.nan, -0.25], [-1.0, -2.0, -0.5]) == (0.75, 2)
    assert logprob_gap([math.nan] * 3, [-1.0, -2.0, -0.5]) == (None, 0)
    assert logprob_gap([], []) == (None, 0)
    assert logprob_gap([-1.0, math.inf], [-1.0, -1.0]) == (0.0, 1)


def test_gate_fires_on_a_direction_with_guidance() -> None:
    assert gate_fired({"d": -1, "guide": "click 3", "avoid": ""})
    assert gate_fired({"d": 1, "guide": " ", "avoid": "click 1"})
    assert not gate_fired({"d": 1, "guide": "", "avoid": "  "})
    assert not gate_fired({"d": 0, "guide": "click 3", "avoid": "click 1"})


def test_index_browses_by_version_group_episode_and_filters(tmp_path: Path) -> None:
    write_run(tmp_path, "run-a")
    index = RunIndex(tmp_path)
    everything = index.select("run-a")
    assert [s["sample_id"] for s in everything["steps"]] == [
        "g000000-e0-s0", "g000000-e1-s0", "g000000-e1-s1", "g000001-e0-s0",
    ]  # fmt: skip
    assert everything["facets"]["versions"] == [0, 1]
    assert everything["counts"] == {"all": 4, "failures": 3, "gate": 1}
    guided = index.step("run-a", "g000000-e1-s0")
    assert guided["gap"] == pytest.approx(0.75) and guided["gap_tokens"] == 2
    assert guided["status"] == "taken" and guided["gate_fired"]
    assert index.step("run-a", "g000000-e0-s0")["gap"] is None

    v1 = index.select("run-a", version=1)
    assert v1["facets"]["groups"] == ["g000001"] and len(v1["steps"]) == 1
    assert v1["steps"][0]["status"] == "pending" and not v1["steps"][0]["gate_fired"]
    episode = index.select("run-a", group="g000000", episode="g000000-e1")
    assert [s["step_index"] for s in episode["steps"]] == [0, 1]
    assert {s["sample_id"] for s in index.select("run-a", only="failures")["steps"]} == {
        "g000000-e1-s0", "g000000-e1-s1", "g000001-e0-s0",
    }  # fmt: skip
    assert [s["sample_id"] for s in index.select("run-a", only="gate")["steps"]] == [
        "g000000-e1-s0"
    ]


def test_screenshots_come_back_as_written(tmp_path: Path) -> None:
    shots = [png((10, 20, 30)), png((40, 50, 60))]
    write_run(tmp_path, "run-b", screenshots=shots)
    assert RunIndex(tmp_path).screenshots("run-b", "g000001-e0-s0") == shots


def test_index_follows_a_shard_that_moves(tmp_path: Path) -> None:
    folder = write_run(tmp_path, "run-c")
    index = RunIndex(tmp_path)
    assert index.step("run-c", "g000001-e0-s0")["status"] == "pending"
    taken = folder / "trajectories" / "taken" / "g000001.parquet"
    (folder / "trajectories" / "pending" / "g000001.parquet").rename(taken)
    assert index.step("run-c", "g000001-e0-s0")["status"] == "taken"
    assert len(index.screenshots("run-c", "g000001-e0-s0")) == 1


def test_missing_runs_and_steps_are_named(tmp_path: Path) -> None:
    write_run(tmp_path, "run-d")
    (tmp_path / "no-traj").mkdir()
    index = RunIndex(tmp_path)
    with pytest.raises(ViewerError, match="no run folder 'nope'") as missing:
        index.steps("nope")
    assert missing.value.status == 404
    with pytest.raises(ViewerError, match="no trajectories/ folder"):
        index.steps("no-traj")
    with pytest.raises(ViewerError, match="not a folder name") as bad:
        index.steps("../etc")
    assert bad.value.status == 400
    with pytest.raises(ViewerError, match="no step 'g9-e9-s9'"):
        index.step("run-d", "g9-e9-s9")
    assert [r["name"] for r in list_runs(tmp_path)] == ["run-d"]
    assert list_runs(tmp_path / "absent") == []
