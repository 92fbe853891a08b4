"""The tracker: TensorBoard scalars read back, a resumed run continuing the same steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workflows.common.tracking import STATE_FILE, Tracker, TrackingConfig, read_scalars


def test_scalars_are_written_and_a_resumed_run_continues(tmp_path: Path) -> None:
    first = Tracker(TrackingConfig(), tmp_path, "run", {"lr": 1e-4})
    first.log({"loss/pg": 0.5, "rollout/success_rate": 0.25, "note": "text", "nan": float("nan")})
    first.log({"loss/pg": 0.4, "flag": True})
    first.close()
    # A restarted job: a new tracker over the same folder picks up at the next step.
    again = Tracker(TrackingConfig(), tmp_path, "run", {"lr": 1e-4})
    again.log({"loss/pg": 0.3, "rollout/success_rate": 0.5})
    again.log_text("eval/report", "| a | b |")
    again.close()
    scalars = read_scalars(tmp_path)
    assert scalars["loss/pg"] == [(0, 0.5), (1, pytest.approx(0.4)), (2, pytest.approx(0.3))]
    assert scalars["rollout/success_rate"] == [(0, 0.25), (2, 0.5)]
    assert not {"note", "nan", "flag"} & set(scalars)  # numbers only, finite, no booleans
    assert json.loads((tmp_path / STATE_FILE).read_text())["next_step"] == 3


def test_missing_optional_backend_is_named(tmp_path: Path) -> None:
    pytest.importorskip("tensorboardX")
    cfg = TrackingConfig(tensorboard=False, mlflow_tracking_uri="file:///nowhere")
    try:
        import mlflow  # noqa: F401
    except ImportError:
        with pytest.raises(RuntimeError, match="pip install mlflow"):
            Tracker(cfg, tmp_path, "run", {})
    else:
        pytest.skip("mlflow is installed here")


def test_corrupt_state_names_the_file(tmp_path: Path) -> None:
    (tmp_path / STATE_FILE).write_text("{oops")
    with pytest.raises(RuntimeError, match=r"tracking\.json: tracking state is not JSON"):
        Tracker(TrackingConfig(), tmp_path, "run", {})


def test_every_optimizer_step_once_across_a_resume(tmp_path: Path) -> None:
    rows = [{"train/step": s, "loss/pg": 0.1 * s, "kind": "rl"} for s in (1, 2, 3)]
    first = Tracker(TrackingConfig(), tmp_path, "run", {})
    first.log_steps("rl_step", rows[:2], "train/step")
    first.log_steps("rl_step", rows[:2], "train/step")  # the same file read again next tick
    first.close()
    again = Tracker(TrackingConfig(), tmp_path, "run", {})
    again.log_steps("rl_step", rows, "train/step")  # a resumed job re-reads the whole file
    again.close()
    got = read_scalars(tmp_path)["rl_step/loss/pg"]
    assert [s for s, _ in got] == [1, 2, 3]
    assert "rl_step/kind" not in read_scalars(tmp_path)
