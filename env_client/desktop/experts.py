"""The built-in desktop task set and its scripted experts.

    from env_client.desktop.experts import builtin_tasks, expert_steps, play
    tasks = builtin_tasks("train")                       # payloads, OSWorld format
    score = play(backend, tasks[0], expert_steps()[tasks[0]["task"]])
    plan = expert_plan("calc-sum", 1024, 768)           # [(Action, pause after), ...]

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

from env_client.actions import Action, to_relative
from env_client.commands import KeysOp, PointerOp, ScrollOp, SleepOp, TypeOp
from env_client.desktop.computer13 import action_ops
from env_client.desktop.tasks import check_task
from env_client.scripted import NoPlan
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


class NoExpertPlan(NoPlan):
    """A task has no expert, or its expert does something a policy answer cannot say."""


_CLICKS = {("left", 1): "left_click", ("left", 2): "double_click", ("left", 3): "triple_click",
           ("right", 1): "right_click", ("middle", 1): "middle_click"}  # fmt: skip
_CONTROL = {
    "DONE": Action(name="terminate", status="success"),
    "FAIL": Action(name="terminate", status="failure"),
    "WAIT": Action(name="wait", time=1.0),
}


def expert_plan(
    task_id: str, width: int, height: int, root: Path = BUILTIN_ROOT
) -> list[tuple[Action, float]]:
    """The expert's steps as the actions a policy would answer (0..999 coordinates on a
    ``width`` x ``height`` screen), each with the pause to keep after it: scripted episodes
    of the analyzer pipeline and the harness check of evaluation speak the policy's format."""
    steps = expert_steps(root).get(task_id)
    if steps is None:
        raise NoExpertPlan(f"no expert for desktop task {task_id!r} in {root / 'experts.json'}")
    plan: list[tuple[Action, float]] = []
    for i, step in enumerate(steps):
        ops, control = action_ops(step["action"])
        if control is not None:
            plan.append((_CONTROL[control], 0.0))
        for op in ops:
            if isinstance(op, SleepOp):
                if plan:
                    plan[-1] = (plan[-1][0], plan[-1][1] + op.seconds)
                continue
            try:
                plan.extend((a, 0.0) for a in _as_actions(op, width, height))
            except (ValueError, TypeError) as exc:
                raise NoExpertPlan(f"{task_id} step {i}: {exc}") from None
        if plan and step.get("pause"):
            plan[-1] = (plan[-1][0], plan[-1][1] + float(step["pause"]))
    return plan


def _as_actions(op: Any, width: int, height: int) -> list[Action]:
    if isinstance(op, TypeOp):
        return [Action(name="type", text=op.text)]
    if isinstance(op, KeysOp):
        return [Action(name="key", keys=op.keys)] * op.presses
    at = None
    if getattr(op, "x", None) is not None and getattr(op, "y", None) is not None:
        at = (to_relative(op.x, width), to_relative(op.y, height))
    if isinstance(op, ScrollOp):
        return [Action(name="hscroll" if op.horizontal else "scroll", pixels=op.clicks,
                       coordinate=at)]  # fmt: skip
    if isinstance(op, PointerOp) and at is not None:
        if op.kind == "move":
            return [Action(name="mouse_move", coordinate=at)]
        if op.kind == "drag":
            return [Action(name="left_click_drag", coordinate=at)]
        if (op.button, op.clicks) in _CLICKS:
            return [Action(name=_CLICKS[(op.button, op.clicks)], coordinate=at)]
    raise ValueError(f"{op!r} has no policy action")
