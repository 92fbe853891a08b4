"""Fixed guidance (the authors' ``GUI_GUIDANCE_FILE`` ablation): precomputed guidance per task
and step replaces the analyzer, so the privileged context no longer depends on the current step.

File formats (JSON), as the reference reads them:

- ``{"<task_id>": {"steps": [...]}}`` or ``{"<task_id>": [...]}``, or a list of
  ``{"task_id": ..., "steps": [...]}`` records;
- a step entry is a string (its position is the step index) or
  ``{"step_index": i, "guidance": "..."}``.

A task with one entry at step 0 is trajectory-level guidance: it is used at every step. With
no analyzer there is no verdict, so a guided step distils toward the guidance (d = +1) and an
unguided one is masked (d = 0). Pure Python.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

Table = dict[str, dict[int, str]]


def load_guidance(path: str | Path) -> Table:
    """The file's guidance by task id and step; a malformed file raises naming what is wrong."""
    path = Path(path)
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"rollout.fixed_guidance_file: {path} not found") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"rollout.fixed_guidance_file: {path} is not JSON ({exc})") from None
    if isinstance(document, list):
        entries = [(_task_id(r, path), r) for r in document]
    elif isinstance(document, dict):
        entries = list(document.items())
    else:
        raise ValueError(f"{path}: guidance must be a task map or a list of task records")
    table: Table = {}
    for task_id, record in entries:
        if str(task_id) in table:
            raise ValueError(f"{path}: task {task_id!r} appears twice")
        table[str(task_id)] = _steps(record, f"{path}: task {task_id!r}")
    return table


def _task_id(record: Any, path: Path) -> str:
    if not isinstance(record, dict) or not record.get("task_id"):
        raise ValueError(f"{path}: list entries need 'task_id' and 'steps'")
    return str(record["task_id"])


def _steps(record: Any, where: str) -> dict[int, str]:
    steps = record.get("steps") if isinstance(record, dict) else record
    if not isinstance(steps, list):
        raise ValueError(f"{where}: 'steps' must be a list")
    out: dict[int, str] = {}
    for position, step in enumerate(steps):
        index = step.get("step_index", position) if isinstance(step, dict) else position
        text = step.get("guidance", "") if isinstance(step, dict) else step
        if type(index) is not int or index < 0 or index in out:
            raise ValueError(f"{where}: invalid or repeated step_index {index!r}")
        if not isinstance(text, str):
            raise ValueError(f"{where}, step {index}: guidance must be a string")
        out[index] = text.strip()
    return out


def step_guidance(table: Table, task_id: str, step: int) -> str:
    """The guidance for ``step`` of ``task_id`` ('' when there is none)."""
    steps = table.get(task_id, {})
    text = steps.get(step, "")
    if not text and len(steps) == 1 and 0 in steps:  # trajectory-level: every step
        text = steps[0]
    return text


def fixed_judgment(table: Table, task_id: str, step: int) -> dict[str, Any]:
    """The judgment a step gets from the file, in the rollout's judgment fields."""
    text = step_guidance(table, task_id, step)
    return {
        "consistency": None,
        "effectiveness": None,
        "guide": text,
        "avoid": "",
        "d": 1 if text else 0,
        "v": 0.5,
    }
