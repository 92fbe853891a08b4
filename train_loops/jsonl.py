"""The project's one JSON-lines appender and reader (metrics, events, annotations).

Append-only: every record is one line, written and flushed on its own, so a killed process
keeps everything it wrote but the line it was cutting. Readers skip such a cut line, and a
writer that opens a file ending in one terminates it first, so the next record starts on a
line of its own. It lives in ``train_loops`` because it is the lowest package that writes
JSONL (trainer rank 0); ``workflows`` imports it from here. A file written whole in one go
(a report) goes through ``workflows.common.pipeline.write_jsonl`` instead, which replaces it
atomically like ``write_json``.

    log = JsonlWriter(run_dir / "metrics.jsonl", run="embedded")   # fields added to every line
    log.write({"loss/pg": 0.1})
    rows = read_jsonl(run_dir / "metrics.jsonl")
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any


class JsonlWriter:
    """Appends records to ``path``; a no-op when ``path`` is None (e.g. trainer ranks other
    than 0). ``common`` fields go into every record; ``timestamp`` adds ``time`` (epoch s)."""

    def __init__(self, path: str | Path | None, *, timestamp: bool = False, **common: Any):
        self.path = None if path is None else Path(path)
        self.timestamp = timestamp
        self.common = common
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _terminate_cut_line(self.path)

    def write(self, record: Mapping[str, Any] | None = None, **fields: Any) -> None:
        if self.path is None:
            return
        full = {"time": time.time()} if self.timestamp else {}
        full.update(self.common)
        full.update(record or {})
        full.update(fields)
        line = json.dumps(full, ensure_ascii=False, default=float) + "\n"
        with self.path.open("a") as f:  # opened per record: safe across forks and restarts
            f.write(line)


def iter_jsonl(path: str | Path) -> Iterator[dict[str, Any]]:
    """The file's records in order (none if it does not exist); cut or non-object lines skipped."""
    path = Path(path)
    if not path.exists():
        return
    with path.open() as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line cut by a kill mid-write
                continue
            if isinstance(rec, dict):
                yield rec


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    return list(iter_jsonl(path))


def _terminate_cut_line(path: Path) -> None:
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open("rb") as f:
        f.seek(-1, 2)
        cut = f.read(1) != b"\n"
    if cut:
        with path.open("a") as f:
            f.write("\n")
