"""The transition: one executed step of a collected episode, as the analyzer pipeline stores it.

Written by ``workflows.analyzer.collect`` as Parquet shards under ``<run_dir>/transitions/``,
read by ``workflows.analyzer.annotate`` (what the expert judges) and ``workflows.analyzer.train``
(SFT prompts). Pyarrow only. Field meanings:

- ``history``: one-line summaries of the earlier responses (the policy style's ``summarize``),
  exactly what the analyzer deployment receives during RL.
- ``context``: what the policy saw of the screen before besides the image, as the analyzer
  receives it (the elements style's numbered elements; empty for tool-call answers).
- ``response_text`` is the policy's full answer; ``action`` the parsed :class:`Action` (JSON,
  ``name == "invalid"`` with a reason when it did not parse); ``executed_action`` the JSON text
  the analyzer sees ("executed action"), built like the rollout worker does.
- ``truth_before`` / ``truth_after``: the environment's ground truth (embedded server
  ``/debug``: task, fields, elements with click points, score) as JSON text, or null where the
  environment has none. The oracle expert judges from these.
- ``source``: ``policy`` (the base policy), ``expert``, ``wrong`` or ``mismatch`` (scripted).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

TRANSITION_SCHEMA = pa.schema(
    [
        pa.field("transition_id", pa.string(), nullable=False),
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("task_name", pa.string(), nullable=False),
        pa.field("task_kind", pa.string(), nullable=False),
        pa.field("task_seed", pa.int64(), nullable=False),
        pa.field("step_index", pa.int32(), nullable=False),
        pa.field("num_steps", pa.int32(), nullable=False),
        pa.field("instruction", pa.string(), nullable=False),
        pa.field("history", pa.list_(pa.string()), nullable=False),
        pa.field("screenshot_before", pa.binary(), nullable=False),
        pa.field("screenshot_after", pa.binary(), nullable=False),
        pa.field("context", pa.string(), nullable=False),
        pa.field("response_text", pa.string(), nullable=False),
        pa.field("action", pa.string(), nullable=False),
        pa.field("executed_action", pa.string(), nullable=False),
        pa.field("executed", pa.bool_(), nullable=False),
        pa.field("env_done", pa.bool_(), nullable=False),
        pa.field("truth_before", pa.string(), nullable=True),
        pa.field("truth_after", pa.string(), nullable=True),
        pa.field("episode_score", pa.float32(), nullable=False),
        pa.field("success", pa.bool_(), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("created_at", pa.float64(), nullable=False),
    ],
    metadata={"computersd.schema": "transition/2"},
)

TRANSITION_FIELDS: tuple[str, ...] = tuple(TRANSITION_SCHEMA.names)
SOURCES = ("policy", "expert", "wrong", "mismatch")


class TransitionError(ValueError):
    """A transition row that breaks the schema's invariants; the message names the field."""


def validate_transition(row: Mapping[str, Any]) -> None:
    """Exact field set, known source, both screenshots present."""
    missing = [f for f in TRANSITION_FIELDS if f not in row]
    if missing:
        raise TransitionError(f"transition {row.get('transition_id')!r} lacks fields {missing}")
    extra = sorted(set(row) - set(TRANSITION_FIELDS))
    if extra:
        raise TransitionError(f"transition {row['transition_id']!r} has unknown fields {extra}")
    if row["source"] not in SOURCES:
        raise TransitionError(
            f"transition {row['transition_id']!r}: source {row['source']!r}, allowed {SOURCES}"
        )
    if not row["screenshot_before"] or not row["screenshot_after"]:
        raise TransitionError(f"transition {row['transition_id']!r} lacks a screenshot")


def write_transitions(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """One Parquet shard, written atomically (temp file + rename)."""
    for row in rows:
        validate_transition(row)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    table = pa.Table.from_pylist([dict(r) for r in rows], schema=TRANSITION_SCHEMA)
    pq.write_table(table, tmp)
    tmp.replace(path)
    return path


def shard_paths(folder: str | Path) -> list[Path]:
    return sorted(Path(folder).glob("*.parquet"))


def read_transitions(
    paths: str | Path | Iterable[str | Path], columns: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """Rows of one folder of shards, one shard, or several shards (optionally some columns)."""
    if isinstance(paths, str | Path):
        p = Path(paths)
        paths = shard_paths(p) if p.is_dir() else [p]
    rows: list[dict[str, Any]] = []
    for path in paths:
        table = pq.read_table(path, schema=TRANSITION_SCHEMA, columns=list(columns or []) or None)
        rows.extend(table.to_pylist())
    return rows
