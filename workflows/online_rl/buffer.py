"""The trajectory buffer: completed groups in, step samples out, with version-based admission.

One asyncio Ray actor sits between the rollout workers and the trainer's Ray Data stream:

- ``acquire`` is asked before a group starts. In ``async`` mode it admits a group while the
  served policy is at most ``max_staleness`` versions behind the trainer and the buffer has
  room; in ``sync`` mode it admits groups only until the current version's share of samples
  is produced, then waits for the next published version (rollout → train → publish).
- ``put_group`` stores a finished group atomically (all its samples or none) and writes it to a
  Parquet shard under the run folder first, so a killed job loses no completed group.
- ``take`` hands out up to ``n`` samples atomically (one method call; see RAY_NOTES.md trap 2).
- The trainer's stream has epochs: ``end_stream`` ends the current one (its readers get None,
  so the RL fit ends and checkpoints) while rollouts go on; ``open_stream`` starts the next one
  for a new fit (after an Entropulse phase), first discarding rows that became too stale.
- Every count that could hide a loss (dropped, failed, stale groups) is a stat.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from pathlib import Path
from typing import Any, Literal

from train_loops.schema import read_parquet, write_parquet
from workflows.online_rl.config import BufferConfig
from workflows.online_rl.curriculum import TaskPicker


def has_gradient(row: dict[str, Any], sd_type: str) -> bool:
    """Whether a step sample moves the policy: a non-zero advantage, or an active
    self-distillation target (the variant distils it and the analyzer gave guidance; ``gated``
    and its kin also need a verdict d ≠ 0, ``ungated`` distils every step). The KL term alone
    does not count, as in the authors' trainer."""
    if float(row.get("advantage") or 0.0) != 0.0:
        return True
    if sd_type == "off" or not (row.get("guide") or row.get("avoid")):
        return False
    return sd_type == "ungated" or int(row.get("d") or 0) != 0


class TrajectoryBuffer:
    """Use as a Ray actor: ``ray.remote(TrajectoryBuffer).options(name=…).remote(…)``."""

    def __init__(
        self,
        cfg: BufferConfig,
        samples_per_step: int,
        mode: Literal["async", "sync"] = "async",
        shard_dir: str | None = None,
        start_version: int = 0,
        start_cursor: int = 0,
        sd_type: str = "gated",
        kinds: dict[str, str] | None = None,
        max_groups: int | None = None,
        picker: TaskPicker | None = None,
    ) -> None:
        self.cfg = cfg
        self.sd_type = sd_type
        self.kinds = kinds or {}  # task name → family/domain, for per-domain success rates
        self._by_kind: dict[str, list[int]] = {}  # kind → [episodes, successes]
        self.samples_per_step = samples_per_step
        self.mode = mode
        self.version = start_version
        self.shard_dir = Path(shard_dir) if shard_dir else None
        self._rows: deque[dict[str, Any]] = deque()
        self._group_left: dict[str, int] = {}  # group id → rows not yet taken
        self._cond = asyncio.Condition()
        self._closed = False
        self.max_groups = max_groups  # rollout budget: no group starts past it
        self.picker = picker  # which task each group plays (None: the worker's round-robin)
        self._epoch = 0  # stream epoch: readers of an ended epoch get None
        self._in_flight = 0
        self._cursor = start_cursor  # sequence number of the next group (picks its task)
        self._phase_version = start_version
        self._phase_produced = 0
        self._samples_per_group = 1.0
        self.stats_: dict[str, float] = dict.fromkeys(
            (
                "groups_started",
                "groups_completed",
                "groups_dropped_failed",
                "groups_dropped_stale",
                "groups_cancelled",
                "groups_restored",
                "groups_purged_stale",
                "groups_zero_grad",
                "samples_dropped_zero_grad",
                "samples_in",
                "samples_out",
                "episodes",
                "episodes_success",
                "lag_sum",
            ),
            0.0,
        )
        self._started_at = time.time()
        if self.shard_dir:
            self._restore()

    # ---- producer side -------------------------------------------------------------------
    async def acquire(self, served_version: int) -> int | None:
        """Wait until a new group may start; returns its sequence number (the task cursor),
        or None once the buffer is closed."""
        async with self._cond:
            await self._cond.wait_for(lambda: self._closed or self._may_start(served_version))
            if self._closed or self._budget_spent():
                return None
            self._in_flight += 1
            self.stats_["groups_started"] += 1
            self._cursor += 1
            return self._cursor - 1

    def _budget_spent(self) -> bool:
        return self.max_groups is not None and self._cursor >= self.max_groups

    def _close_if_done(self) -> None:
        """Once the budget's last group finished, the stream ends after its rows: the trainer
        trains on them and stops (``data_exhausted``)."""
        if self._budget_spent() and self._in_flight == 0:
            self._closed = True

    def _may_start(self, served_version: int) -> bool:
        if self._budget_spent():
            return True  # acquire answers None at once
        if self.version - served_version > self.cfg.max_staleness:
            return False
        if len(self._rows) >= self.cfg.capacity_samples:
            return False
        if self.mode == "async":
            return True
        self._maybe_new_phase()
        expected = self._phase_produced + self._in_flight * self._samples_per_group
        return expected < self.samples_per_step

    def _maybe_new_phase(self) -> None:
        if self.version != self._phase_version:
            self._phase_version = self.version
            self._phase_produced = 0

    async def put_group(self, group_id: str, rows: list[dict[str, Any]], successes: int) -> bool:
        """Store a finished group (all rows or none). Returns False if it was dropped as stale."""
        async with self._cond:
            self._in_flight = max(0, self._in_flight - 1)
            self._close_if_done()
            oldest = min((r["behavior_version"] for r in rows), default=self.version)
            if self.version - oldest > self.cfg.max_staleness + 1:
                self.stats_["groups_dropped_stale"] += 1
                self._cond.notify_all()
                return False
            if self.shard_dir:
                write_parquet(rows, self.shard_dir / "pending" / f"{group_id}.parquet")
            self._admit(group_id, rows)
            self.stats_["groups_completed"] += 1
            self.stats_["episodes"] += len({r["episode_id"] for r in rows})
            self.stats_["episodes_success"] += successes
            self._count_kinds(rows)
            if self.picker is not None and rows:
                episodes = len({r["episode_id"] for r in rows})
                self.picker.record(str(rows[0].get("task_id")), successes, episodes)
            self.stats_["lag_sum"] += sum(self.version - r["behavior_version"] for r in rows)
            self._maybe_new_phase()
            self._phase_produced += len(rows)
            self._samples_per_group = 0.8 * self._samples_per_group + 0.2 * len(rows)
            self._cond.notify_all()
            return True

    def _count_kinds(self, rows: list[dict[str, Any]]) -> None:
        episodes = {r["episode_id"]: (r.get("task_id"), r.get("reward", 0.0)) for r in rows}
        for task, reward in episodes.values():
            tally = self._by_kind.setdefault(self.kinds.get(str(task), "other"), [0, 0])
            tally[0] += 1
            tally[1] += int(float(reward or 0.0) > 0)

    def success_by_kind(self) -> dict[str, float]:
        """Success rate per task family/domain over the completed groups."""
        return {k: wins / n for k, (n, wins) in sorted(self._by_kind.items()) if n}

    def _admit(self, group_id: str, rows: list[dict[str, Any]]) -> None:
        if self.cfg.drop_zero_gradient:
            kept = [r for r in rows if has_gradient(r, self.sd_type)]
            self.stats_["samples_dropped_zero_grad"] += len(rows) - len(kept)
            if not kept:  # the whole group: its shard is kept aside, with the reason
                self.stats_["groups_zero_grad"] += 1
                self._move_shard(group_id, "zero_grad")
                return
            rows = kept
        self._rows.extend(rows)
        self._group_left[group_id] = len(rows)
        self.stats_["samples_in"] += len(rows)

    def task_for(self, seq: int) -> int:
        """Index of the task group ``seq`` plays, in the job's task list."""
        return seq if self.picker is None else self.picker.pick(seq)

    async def drop_group(self, reason: Literal["failed", "cancelled"]) -> None:
        """A started group that will never complete (env budget exhausted, shutdown)."""
        async with self._cond:
            self._in_flight = max(0, self._in_flight - 1)
            self._close_if_done()
            key = "groups_dropped_failed" if reason == "failed" else "groups_cancelled"
            self.stats_[key] += 1
            self._cond.notify_all()

    # ---- consumer side -------------------------------------------------------------------
    async def take(
        self, n: int, timeout_s: float = 1.0, epoch: int | None = None
    ) -> list[dict[str, Any]] | None:
        """Up to ``n`` samples (waits up to ``timeout_s`` for the first); None once closed and
        empty, or once stream ``epoch`` (None: any) has ended."""

        def ended() -> bool:
            return epoch is not None and epoch != self._epoch

        async with self._cond:
            try:
                await asyncio.wait_for(
                    self._cond.wait_for(lambda: self._closed or ended() or bool(self._rows)),
                    timeout_s,
                )
            except TimeoutError:
                return []
            if ended() or (not self._rows and self._closed):
                return None
            out = [self._rows.popleft() for _ in range(min(n, len(self._rows)))]
            for row in out:
                self._mark_taken(row["group_id"])
            self.stats_["samples_out"] += len(out)
            self._cond.notify_all()
            return out

    def _mark_taken(self, group_id: str) -> None:
        left = self._group_left.get(group_id, 0) - 1
        if left > 0:
            self._group_left[group_id] = left
            return
        self._group_left.pop(group_id, None)
        self._move_shard(group_id, "taken")

    def _move_shard(self, group_id: str, to: str) -> None:
        """pending/ → ``to``/: a restart restores only what was never handed out."""
        if self.shard_dir:
            src = self.shard_dir / "pending" / f"{group_id}.parquet"
            if src.exists():
                (self.shard_dir / to).mkdir(parents=True, exist_ok=True)
                src.replace(self.shard_dir / to / src.name)

    # ---- control -------------------------------------------------------------------------
    async def set_version(self, version: int) -> None:
        async with self._cond:
            self.version = max(self.version, version)
            self._cond.notify_all()

    async def end_stream(self) -> None:
        """End the current stream epoch: its readers get None; groups keep coming in."""
        async with self._cond:
            self._epoch += 1
            self._cond.notify_all()

    async def open_stream(self) -> int:
        """The epoch for a new stream, after dropping buffered groups too stale to train on
        (same rule as ``put_group``; counted as ``groups_purged_stale``, shards kept)."""
        async with self._cond:
            limit = self.version - self.cfg.max_staleness - 1
            stale = {r["group_id"] for r in self._rows if r["behavior_version"] < limit}
            if stale:
                self._rows = deque(r for r in self._rows if r["group_id"] not in stale)
                for group_id in stale:
                    self._group_left.pop(group_id, None)
                    self._move_shard(group_id, "purged")
                self.stats_["groups_purged_stale"] += len(stale)
                self._cond.notify_all()
            return self._epoch

    async def close(self) -> None:
        async with self._cond:
            self._closed = True
            self._cond.notify_all()

    def stats(self) -> dict[str, float]:
        s = dict(self.stats_)
        s.update(
            version=self.version,
            cursor=self._cursor,
            buffered_samples=len(self._rows),
            groups_in_flight=self._in_flight,
            mean_lag=s["lag_sum"] / s["samples_in"] if s["samples_in"] else 0.0,
            success_rate=s["episodes_success"] / s["episodes"] if s["episodes"] else 0.0,
            uptime_s=time.time() - self._started_at,
        )
        s.update({f"success_rate/{k}": v for k, v in self.success_by_kind().items()})
        s.update(self.picker.stats() if self.picker else {"tasks_saturated": 0, "tasks_skipped": 0})
        return s

    def _restore(self) -> None:
        """Reload groups that completed but were never handed out before a restart."""
        assert self.shard_dir is not None
        for shard in sorted((self.shard_dir / "pending").glob("*.parquet")):
            rows = read_parquet(shard)
            if rows:
                self._admit(shard.stem, rows)
                self.stats_["groups_restored"] += 1
