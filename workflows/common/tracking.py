"""Experiment tracking: TensorBoard event files for every run, W&B and MLflow when configured.

One :class:`Tracker` per run folder, used by one process (the job driver, or the evaluation
command), so every scalar is logged once. Its state lives in ``<run_dir>/tracking.json``: the
next step and the W&B / MLflow run ids, so a resumed job appends to the same TensorBoard run
(``<run_dir>/tensorboard/``) and continues the same W&B / MLflow run. ``tensorboardX`` comes
with ``ray[train]``; ``wandb`` and ``mlflow`` are optional and named in a clear error when a
config asks for them and they are missing.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, TypeGuard

from pydantic import BaseModel, ConfigDict, Field

STATE_FILE = "tracking.json"
TB_DIR = "tensorboard"


class TrackingConfig(BaseModel):
    """Where a run's curves go (``tracking`` in the job configs)."""

    model_config = ConfigDict(extra="forbid")

    tensorboard: bool = Field(True, description="TensorBoard event files under <run>/tensorboard.")
    wandb_project: str | None = Field(
        None, description="Also log to this W&B project (needs `pip install wandb`)."
    )
    wandb_mode: str = Field("online", description="W&B mode: online, offline or disabled.")
    mlflow_tracking_uri: str | None = Field(
        None, description="Also log to this MLflow tracking URI (needs `pip install mlflow`)."
    )
    mlflow_experiment: str = Field("computersd", description="MLflow experiment name.")


class Tracker:
    """``log(metrics)`` appends one step of numeric scalars to every configured backend."""

    def __init__(self, cfg: TrackingConfig, run_dir: Path, run_name: str, config: dict) -> None:
        self.cfg = cfg
        self.path = run_dir / STATE_FILE
        self.state: dict[str, Any] = _read_state(self.path)
        self.step = int(self.state.get("next_step", 0))
        self._tb = self._wandb = self._mlflow = None
        if cfg.tensorboard:
            from tensorboardX import SummaryWriter

            # Event files are named by the second they were opened: a suffix keeps a quick
            # restart from overwriting the previous writer's file.
            suffix = f".{os.getpid()}.{time.time_ns()}"
            self._tb = SummaryWriter(str(run_dir / TB_DIR), flush_secs=10, filename_suffix=suffix)
        if cfg.wandb_project:
            self._wandb = self._start_wandb(run_name, config)
        if cfg.mlflow_tracking_uri:
            self._mlflow = self._start_mlflow(run_name, config)
        self._save()

    def log(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """Numeric, finite values only; ``step`` None: the tracker's own counter."""
        scalars = {k: float(v) for k, v in metrics.items() if _is_number(v)}
        at = self.step if step is None else step
        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(key, value, at)
        if self._wandb is not None:
            self._wandb.log(scalars, step=at)
        if self._mlflow is not None:
            self._mlflow.log_metrics({_mlflow_key(k): v for k, v in scalars.items()}, step=at)
        self.step = max(self.step, at + 1)
        self._save()

    def log_steps(self, prefix: str, rows: list[dict[str, Any]], step_key: str) -> None:
        """Per-step records (e.g. every optimizer step) under ``prefix/`` at their own step
        ``row[step_key]``; rows at or before the last one logged (a resumed run re-reading its
        file) are skipped."""
        done = int(self.state.get(f"{prefix}_last", -1))
        for row in rows:
            raw = row.get(step_key)
            if not _is_number(raw) or int(raw) <= done:
                continue
            at = int(raw)
            scalars = {f"{prefix}/{k}": float(v) for k, v in row.items() if _is_number(v)}
            if self._tb is not None:
                for key, value in scalars.items():
                    self._tb.add_scalar(key, value, at)
            if self._mlflow is not None:
                self._mlflow.log_metrics({_mlflow_key(k): v for k, v in scalars.items()}, step=at)
            if self._wandb is not None:  # W&B wants one monotonic step: attach to the current
                self._wandb.log(scalars, step=self.step)
            done = at
        self.state[f"{prefix}_last"] = done
        self._save()

    def log_text(self, tag: str, text: str) -> None:
        """A table or note (markdown), e.g. an evaluation report."""
        if self._tb is not None:
            self._tb.add_text(tag, text, self.step)
        if self._wandb is not None:
            self._wandb.log({tag: text}, step=self.step)
        if self._mlflow is not None:
            self._mlflow.log_text(text, f"{tag.replace('/', '_')}.md")

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._mlflow is not None:
            self._mlflow.end_run()

    def _save(self) -> None:
        self.state["next_step"] = self.step
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=1))
        os.replace(tmp, self.path)  # a kill mid-write leaves the previous state

    def _start_wandb(self, run_name: str, config: dict) -> Any:
        wandb = _optional("wandb", "tracking.wandb_project")
        run = wandb.init(
            project=self.cfg.wandb_project, name=run_name, config=config,
            id=self.state.get("wandb_run_id"), resume="allow", mode=self.cfg.wandb_mode,
        )  # fmt: skip
        self.state["wandb_run_id"] = run.id
        return run

    def _start_mlflow(self, run_name: str, config: dict) -> Any:
        mlflow = _optional("mlflow", "tracking.mlflow_tracking_uri")
        mlflow.set_tracking_uri(self.cfg.mlflow_tracking_uri)
        mlflow.set_experiment(self.cfg.mlflow_experiment)
        run = mlflow.start_run(run_id=self.state.get("mlflow_run_id"), run_name=run_name)
        if "mlflow_run_id" not in self.state:
            mlflow.log_params({k: str(v)[:250] for k, v in _flatten(config).items()})
        self.state["mlflow_run_id"] = run.info.run_id
        return mlflow


def read_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in ``<run_dir>/tensorboard`` as {tag: [(step, value), ...]}, in file and
    write order (the TFRecord framing read directly: the ``tensorboard`` package is not a
    dependency)."""
    import struct

    from tensorboardX.proto import event_pb2

    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted((run_dir / TB_DIR).glob("events.out.tfevents.*")):
        data = path.read_bytes()
        pos = 0
        while pos + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[pos : pos + 8])
            record = data[pos + 12 : pos + 12 + length]
            pos += 12 + length + 4  # length, its CRC, the record, its CRC
            event = event_pb2.Event.FromString(record)
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    out.setdefault(value.tag, []).append((event.step, value.simple_value))
    return out


def _read_state(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except json.JSONDecodeError as exc:
        msg = f"{path}: tracking state is not JSON ({exc}); delete it to start anew"
        raise RuntimeError(msg) from None
    return data if isinstance(data, dict) else {}


def _optional(module: str, field: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        msg = f"{field} is set but {module} is not installed: pip install {module}"
        raise RuntimeError(msg) from None


def _is_number(v: Any) -> TypeGuard[int | float]:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _mlflow_key(key: str) -> str:
    # MLflow allows letters, digits, _ - . space : and /
    return "".join(c if c.isalnum() or c in "_-. :/" else "_" for c in key)


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        out.update(_flatten(v, f"{key}.") if isinstance(v, dict) else {key: v})
    return out
