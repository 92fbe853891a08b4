"""Reading a run's step samples for the trajectory viewer (pyarrow only; no Ray, no torch).

A run folder holds ``trajectories/{trained,pending,zero_grad,purged}/*.parquet`` in the step-sample
schema (:mod:`train_loops.schema`). :class:`RunIndex` reads every shard's small columns once
(screenshots and token ids stay on disk; the index is re-read when a shard appears, changes or
moves) and answers selections by policy version, group and episode, optionally only failures
(episode score < 1) or only steps where the gate fired (d ≠ 0 and guidance present). A step's
screenshots are read from its shard on demand.

The *log-prob gap* of a step is Σ_t (privileged_logprobs[t] − ordinary_logprobs[t]) over the
response tokens where both are finite (a step without guidance stores NaN privileged log-probs
and has no gap: None), with the number of tokens it sums.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import pyarrow.parquet as pq

from train_loops.schema import STEP_SAMPLE_SCHEMA

Only = Literal["all", "failures", "gate"]
RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# Everything but the large columns; the two log-prob columns give the gap and are dropped then.
_HEAVY = ("prompt_ids", "response_ids", "behavior_logprobs", "screenshots")
INDEX_COLUMNS = [n for n in STEP_SAMPLE_SCHEMA.names if n not in _HEAVY]


class ViewerError(LookupError):
    """A run, step or selection that does not exist; ``status`` is the HTTP status to answer."""

    def __init__(self, message: str, status: int = 404) -> None:
        super().__init__(message)
        self.status = status


def logprob_gap(privileged: Sequence[float], ordinary: Sequence[float]) -> tuple[float | None, int]:
    """(Σ privileged − ordinary over tokens where both are finite, that token count)."""
    pairs = [
        (p, o)
        for p, o in zip(privileged, ordinary, strict=False)
        if p is not None and o is not None and math.isfinite(p) and math.isfinite(o)
    ]
    if not pairs:
        return None, 0
    return float(sum(p - o for p, o in pairs)), len(pairs)


def gate_fired(step: dict[str, Any]) -> bool:
    """The step's self-distillation was on: a direction and guidance to distill from."""
    guided = bool(str(step.get("guide") or "").strip() or str(step.get("avoid") or "").strip())
    return int(step.get("d") or 0) != 0 and guided


def failed(step: dict[str, Any]) -> bool:
    return float(step.get("score") or 0.0) < 1.0


def list_runs(runs_dir: Path) -> list[dict[str, Any]]:
    """Run folders under ``runs_dir`` that have trajectories, newest first."""
    if not runs_dir.is_dir():
        return []
    runs = []
    for d in runs_dir.iterdir():
        traj = d / "trajectories"
        if d.is_dir() and RUN_NAME.match(d.name) and traj.is_dir():
            shards = list(traj.rglob("*.parquet"))
            mtime = max((s.stat().st_mtime for s in shards), default=traj.stat().st_mtime)
            runs.append({"name": d.name, "shards": len(shards), "modified": mtime})
    return sorted(runs, key=lambda r: -r["modified"])


def run_folder(runs_dir: Path, name: str) -> Path:
    """The folder of run ``name``, or a ViewerError that names what is missing."""
    if not RUN_NAME.match(name):
        raise ViewerError(
            f"run name {name[:80]!r} is not a folder name (letters, digits, . _ -)", 400
        )
    folder = runs_dir / name
    if not folder.is_dir():
        raise ViewerError(f"no run folder {name!r} under {runs_dir}")
    if not (folder / "trajectories").is_dir():
        raise ViewerError(
            f"run {name!r} has no trajectories/ folder yet (no group has completed)", 404
        )
    return folder


def _shards(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "trajectories").rglob("*.parquet"))


def _signature(shards: list[Path]) -> tuple[tuple[str, float, int], ...]:
    out = []
    for s in shards:
        try:
            st = s.stat()
        except FileNotFoundError:  # moved (pending → trained) since the listing
            continue
        out.append((str(s), st.st_mtime, st.st_size))
    return tuple(out)


def _summaries(shard: Path, run_dir: Path) -> list[dict[str, Any]]:
    columns = [*INDEX_COLUMNS, "privileged_logprobs", "ordinary_logprobs"]
    rows = pq.read_table(shard, columns=columns, schema=STEP_SAMPLE_SCHEMA).to_pylist()
    status = shard.parent.name if shard.parent != run_dir / "trajectories" else ""
    for row in rows:
        gap, tokens = logprob_gap(row.pop("privileged_logprobs"), row.pop("ordinary_logprobs"))
        row.update(gap=gap, gap_tokens=tokens, shard=str(shard.relative_to(run_dir)))
        row.update(status=status, failed=failed(row), gate_fired=gate_fired(row))
        row["v"] = round(float(row["v"]), 4)
    return rows


class RunIndex:
    """The step summaries of the runs under ``runs_dir``, cached per run until a shard changes."""

    def __init__(self, runs_dir: Path, max_runs: int = 8) -> None:
        self.runs_dir = runs_dir
        self.max_runs = max_runs
        self._cache: dict[str, tuple[tuple, list[dict[str, Any]]]] = {}

    def steps(self, name: str) -> list[dict[str, Any]]:
        """Every step summary of run ``name``, ordered by version, group, episode, step."""
        folder = run_folder(self.runs_dir, name)
        for _ in range(3):  # a shard may move between the listing and the read
            shards = _shards(folder)
            sig = _signature(shards)
            cached = self._cache.get(name)
            if cached and cached[0] == sig:
                return cached[1]
            try:
                rows = [r for s in shards for r in _summaries(s, folder)]
            except FileNotFoundError:
                continue
            rows.sort(
                key=lambda r: (
                    r["behavior_version"],
                    r["group_id"],
                    r["episode_id"],
                    r["step_index"],
                )
            )
            self._remember(name, sig, rows)
            return rows
        raise ViewerError(f"run {name!r}: its shards kept moving while being read; retry", 503)

    def _remember(self, name: str, sig: tuple, rows: list[dict[str, Any]]) -> None:
        self._cache.pop(name, None)
        while len(self._cache) >= self.max_runs:
            self._cache.pop(next(iter(self._cache)))
        self._cache[name] = (sig, rows)

    def select(
        self,
        name: str,
        version: int | None = None,
        group: str | None = None,
        episode: str | None = None,
        only: Only = "all",
    ) -> dict[str, Any]:
        """The steps of a selection plus what the page's pickers offer at each level."""
        rows = self.steps(name)
        facets: dict[str, list[Any]] = {"versions": sorted({r["behavior_version"] for r in rows})}
        if version is not None:
            rows = [r for r in rows if r["behavior_version"] == version]
        facets["groups"] = sorted({r["group_id"] for r in rows})
        if group is not None:
            rows = [r for r in rows if r["group_id"] == group]
        facets["episodes"] = sorted({r["episode_id"] for r in rows})
        if episode is not None:
            rows = [r for r in rows if r["episode_id"] == episode]
        counts = {
            "all": len(rows),
            "failures": sum(r["failed"] for r in rows),
            "gate": sum(r["gate_fired"] for r in rows),
        }
        if only == "failures":
            rows = [r for r in rows if r["failed"]]
        elif only == "gate":
            rows = [r for r in rows if r["gate_fired"]]
        return {"run": name, "facets": facets, "counts": counts, "steps": rows}

    def step(self, name: str, sample_id: str) -> dict[str, Any]:
        for row in self.steps(name):
            if row["sample_id"] == sample_id:
                return row
        raise ViewerError(f"run {name!r} has no step {sample_id[:120]!r}")

    def screenshots(self, name: str, sample_id: str) -> list[bytes]:
        """The PNG screenshots of a step's context (prompt order: the current screen last)."""
        row = self.step(name, sample_id)
        path = self.runs_dir / name / row["shard"]
        table = pq.read_table(
            path,
            columns=["sample_id", "screenshots"],
            filters=[("sample_id", "=", sample_id)],
            schema=STEP_SAMPLE_SCHEMA,
        )
        if table.num_rows == 0:
            raise ViewerError(f"step {sample_id!r} is no longer in {row['shard']}; reload", 409)
        return list(table.column("screenshots")[0].as_py())
