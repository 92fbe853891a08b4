"""The built-in desktop task set and its scripted experts.

    from env_client.desktop.experts import builtin_tasks, expert_steps, play
    tasks = builtin_tasks("train")                       # payloads, OSWorld format
    score = play(backend, tasks[0], expert_steps()[tasks[0]["task"]])

The tasks are read through the OSWorld task source (``env_client.tasks.sources``), so a job can
use them with ``task_source: {kind: osworld, path: env_client/tasks/desktop, splits: {train:
train.json, eval: eval.json}}``. Files are written by ``env_client/tasks/desktop/generate.py``.
"""

from __future__ import annotations

import json
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

from env_client.desktop.computer13 import action_ops
from env_client.desktop.tasks import check_task
from env_client.tasks.sources import OSWorldSource, TaskFileError, TaskSourceConfig

BUILTIN_ROOT = Path(__file__).resolve().parents[1] / "tasks" / "desktop"
SPLITS = {"train": "train.json", "eval": "eval.json"}


def builtin_source(root: Path = BUILTIN_ROOT) -> OSWorldSource:
    return OSWorldSource(TaskSourceConfig(kind="osworld", path=str(root), splits=SPLITS))


def builtin_tasks(split: str, root: Path = BUILTIN_ROOT) -> list[dict[str, Any]]:
    """Payloads of a split, each validated for the desktop backend."""
    tasks = builtin_source(root).tasks(split)
    for task in tasks:
        check_task(task, str(root / task["kind"] / f"{task['task']}.json"))
    return tasks


@lru_cache(maxsize=4)
def _experts(path: Path) -> dict[str, list[dict[str, Any]]]:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TaskFileError(f"{path}: cannot read experts: {exc}") from None
    if not isinstance(raw, dict):
        raise TaskFileError(f"{path}: must map task id -> list of steps")
    for tid, steps in raw.items():
        if not isinstance(steps, list) or not steps:
            raise TaskFileError(f"{path}: field {tid!r} must be a non-empty list of steps")
        for i, step in enumerate(steps):
            if not isinstance(step, dict) or "action" not in step:
                raise TaskFileError(f"{path}: field '{tid}[{i}]' needs an 'action'")
            try:
                action_ops(step["action"])
            except ValueError as exc:
                raise TaskFileError(f"{path}: field '{tid}[{i}].action': {exc}") from None
    return raw


def expert_steps(root: Path = BUILTIN_ROOT) -> dict[str, list[dict[str, Any]]]:
    """Task id → the expert's steps ``[{"action": ACTION, "pause": s}, ...]``."""
    return _experts(root / "experts.json")


def play(backend: Any, task: dict[str, Any], steps: list[dict[str, Any]]) -> float:
    """Reset ``backend`` to ``task``, play ``steps`` and return the evaluator's score."""
    backend.reset(task, None)
    for step in steps:
        ops, control = action_ops(step["action"])
        if control is not None:
            backend.note_control(control)
        else:
            backend.perform(ops)
        time.sleep(float(step.get("pause", 0.0)))
    return float(backend.state()["raw_reward"])
