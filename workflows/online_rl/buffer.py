"""The trajectory buffer: completed groups in, step samples out, with version-based admission.

One asyncio Ray actor sits between the rollout workers and the trainer's Ray Data stream:

- ``acquire`` is asked before a group starts. In ``async`` mode it admits a group while the
  served policy is at most ``max_staleness`` versions behind the trainer and the buffer has
  room; in ``sync`` mode it admits groups only until the current version's share of samples
  is produced, then waits for the next published version (rollout → train → publish).
- ``put_group`` stores a finished group atomically (all its samples or none) and writes it to a
  Parquet shard under the run folder first, so a killed job loses no completed group.
- ``take`` hands out up to ``n`` samples atomically (one method call; see RAY_NOTES.md trap 2).
  With the authors' schedule (``trainer.schedule: rollout_batch``) it hands rank r the parts of
  rollout batches dealt to it (:mod:`workflows.online_rl.batches`): one optimizer step each.
- Handing out is not training: a group's shard stays in ``pending/`` until the trainer
  ``commit``s its rows (after the checkpoint that holds them), then moves to ``trained/``. When a
  trainer attempt dies, ``requeue`` hands its uncommitted rows out again (those in the newest
  checkpoint's lineage, :mod:`train_loops.lineage`, count as trained); a restarted job reloads
  exactly the pending rows that lineage lacks. No row is trained twice or lost.
- Every group's fate is a line of ``ledger.jsonl`` (started, completed, dropped with a reason,
  trained), which :mod:`workflows.online_rl.accounting` audits.
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

from train_loops.jsonl import JsonlWriter, read_jsonl
from train_loops.schema import read_parquet, write_parquet
from workflows.online_rl.batches import RolloutBatcher
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


LEDGER_FILE = "ledger.jsonl"
# Why a started group ended without rows (ledger "drop" reasons): the episodes' environment
# budget ran out, the job stopped it, it came back too stale, its rollout worker died, or the
# job died while it was in flight (found by the next start).
DROP_REASONS = ("failed", "cancelled", "stale", "worker_died", "abandoned")


def group_id_of(seq: int) -> str:
    return f"g{seq:06d}"


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
        trained_ids: list[str] | None = None,
        batcher: RolloutBatcher | None = None,
    ) -> None:
        self.cfg = cfg
        # trainer.schedule=rollout_batch: rows go out as per-rank parts of rollout batches
        # (workflows.online_rl.batches); None: one first-in-first-out queue for all readers.
        self.batcher = batcher
        self.sd_type = sd_type
        self.kinds = kinds or {}  # task name → family/domain, for per-domain success rates
        self._by_kind: dict[str, list[int]] = {}  # kind → [episodes, successes]
        self.samples_per_step = samples_per_step
        self.mode = mode
        self.version = start_version
        self.shard_dir = Path(shard_dir) if shard_dir else None
        self.ledger = JsonlWriter(self.shard_dir and self.shard_dir / LEDGER_FILE, timestamp=True)
        self._rows: deque[dict[str, Any]] = deque()
        self._open: dict[str, set[str]] = {}  # group id → its rows not yet trained or purged
        self._group_of: dict[str, str] = {}  # sample id of an open row → its group id
        self._trained_in: dict[str, int] = {}  # group id → its rows trained so far
        self._handed: dict[str, tuple[str, int]] = {}  # sample id → (group id, stream epoch)
        self._owner: dict[str, int] = {}  # group in flight → rollout worker index
        self._ended: set[str] = set()  # groups dropped in this life (a late put is ignored)
        self._cond = asyncio.Condition()
        self._closed = False
        self.max_groups = max_groups  # rollout budget: no group starts past it
        self.picker = picker  # which task each group plays (None: the worker's round-robin)
        self._epoch = 0  # stream epoch: readers of an ended epoch get None
        self._in_flight = 0
        self._phase_groups = 0  # groups completed since the version changed (sync batches)
        self._cursor = start_cursor  # sequence number of the next group (picks its task)
        self._phase_version = start_version
        self._phase_produced = 0
        self._samples_per_group = 1.0
        self.stats_: dict[str, float] = dict.fromkeys(
            (
                "groups_started",
                "groups_completed",
                "groups_trained",
                "groups_dropped_failed",
                "groups_dropped_stale",
                "groups_cancelled",
                "groups_worker_died",
                "groups_abandoned",
                "groups_restored",
                "groups_purged_stale",
                "groups_zero_grad",
                "groups_late",
                "samples_dropped_zero_grad",
                "samples_in",
                "samples_out",
                "samples_trained",
                "samples_requeued",
                "episodes",
                "episodes_success",
                "lag_sum",
            ),
            0.0,
        )
        self._started_at = time.time()
        if self.shard_dir:
            self._restore(set(trained_ids or ()))

    # ---- producer side -------------------------------------------------------------------
    async def acquire(self, served_version: int, worker: int = -1) -> int | None:
        """Wait until a new group may start; returns its sequence number (the task cursor;
        the group's id is :func:`group_id_of` it), or None once the buffer is closed."""
        async with self._cond:
            await self._cond.wait_for(lambda: self._closed or self._may_start(served_version))
            if self._closed or self._budget_spent():
                return None
            self._in_flight += 1
            self.stats_["groups_started"] += 1
            seq, self._cursor = self._cursor, self._cursor + 1
            self._owner[group_id_of(seq)] = worker
            self.ledger.write(ev="start", group=group_id_of(seq), worker=worker)
            return seq

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
        if self._queued() >= self.cfg.capacity_samples:
            return False
        if self.mode == "async":
            return True
        self._maybe_new_phase()
        if self.batcher is not None:  # one rollout batch per version
            return self._phase_groups + self._in_flight < self.batcher.groups
        expected = self._phase_produced + self._in_flight * self._samples_per_group
        return expected < self.samples_per_step

    def _maybe_new_phase(self) -> None:
        if self.version != self._phase_version:
            self._phase_version = self.version
            self._phase_produced = 0
            self._phase_groups = 0

    def _finish_flight(self, group_id: str) -> bool:
        """The group's slot is free again; False if it had already been dropped (a put or drop
        arriving after its worker was declared dead changes nothing)."""
        if group_id in self._ended:
            self.stats_["groups_late"] += 1
            return False
        self._owner.pop(group_id, None)
        self._in_flight = max(0, self._in_flight - 1)
        self._close_if_done()
        return True

    async def put_group(self, group_id: str, rows: list[dict[str, Any]], successes: int) -> bool:
        """Store a finished group (all rows or none). Returns False if it was dropped as stale."""
        async with self._cond:
            if not self._finish_flight(group_id):
                return False
            oldest = min((r["behavior_version"] for r in rows), default=self.version)
            if self.version - oldest > self.cfg.max_staleness + 1:
                self._drop(group_id, "stale")
                self._cond.notify_all()
                return False
            if self.shard_dir:
                write_parquet(rows, self.shard_dir / "pending" / f"{group_id}.parquet")
            self.ledger.write(ev="complete", group=group_id, rows=len(rows))
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
            self._phase_groups += 1
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

    def _admit(self, group_id: str, rows: list[dict[str, Any]], trained: set[str] = set()) -> int:  # noqa: B006
        """Queue the group's rows that still need training; returns how many were queued."""
        if self.cfg.drop_zero_gradient:
            kept = [r for r in rows if has_gradient(r, self.sd_type)]
            self.stats_["samples_dropped_zero_grad"] += len(rows) - len(kept)
            if kept and len(kept) < len(rows):
                flat = sorted({r["sample_id"] for r in rows} - {r["sample_id"] for r in kept})
                self.ledger.write(ev="zero_grad_samples", group=group_id, ids=flat)
            if not kept:  # the whole group: its shard is kept aside, with the reason
                self.stats_["groups_zero_grad"] += 1
                self._move_shard(group_id, "zero_grad")
                self.ledger.write(ev="zero_grad", group=group_id)
                self._add_to_batch([])  # still one of its rollout batch's groups
                return 0
            rows = kept
        done = [r for r in rows if r["sample_id"] in trained]
        todo = [r for r in rows if r["sample_id"] not in trained]
        self._trained_in[group_id] = len(done)
        if not todo:
            self._settled(group_id)
            return 0
        if self.batcher is not None:
            self._add_to_batch(todo)
        else:
            self._rows.extend(todo)
        self._open[group_id] = {r["sample_id"] for r in todo}
        self._group_of.update((r["sample_id"], group_id) for r in todo)
        self.stats_["samples_in"] += len(todo)
        return len(todo)

    def _add_to_batch(self, rows: list[dict[str, Any]]) -> None:
        if self.batcher is None:
            return
        empty = self.batcher.empty_batches
        if self.batcher.add_group(rows) and self.batcher.empty_batches > empty:
            # No update will come of it, so no new version: in sync mode the next batch's
            # groups may start now.
            self.ledger.write(ev="empty_batch", batch=self.batcher.seq - 1)
            self._phase_groups = 0

    def _queued(self) -> int:
        """Rows waiting for a reader (padding not counted)."""
        return self.batcher.queued_count() if self.batcher is not None else len(self._rows)

    def task_for(self, seq: int) -> int:
        """Index of the task group ``seq`` plays, in the job's task list."""
        return seq if self.picker is None else self.picker.pick(seq)

    async def drop_group(
        self, reason: Literal["failed", "cancelled"], group_id: str | None = None
    ) -> None:
        """A started group that will never complete (env budget exhausted, shutdown)."""
        async with self._cond:
            if group_id is None or self._finish_flight(group_id):
                if group_id is None:  # callers that do not name it (tests, old workers)
                    self._in_flight = max(0, self._in_flight - 1)
                    self._close_if_done()
                self._drop(group_id, reason)
            self._cond.notify_all()

    async def worker_lost(self, worker: int) -> list[str]:
        """Rollout worker ``worker`` died: its groups in flight end as ``worker_died``."""
        async with self._cond:
            lost = [g for g, w in self._owner.items() if w == worker]
            for group_id in lost:
                self._finish_flight(group_id)
                self._drop(group_id, "worker_died")
            self._cond.notify_all()
            return lost

    def _drop(self, group_id: str | None, reason: str) -> None:
        key = {
            "failed": "groups_dropped_failed",
            "cancelled": "groups_cancelled",
            "stale": "groups_dropped_stale",
            "worker_died": "groups_worker_died",
            "abandoned": "groups_abandoned",
        }[reason]
        self.stats_[key] += 1
        if group_id is not None:
            self._ended.add(group_id)
            self.ledger.write(ev="drop", group=group_id, reason=reason)

    # ---- consumer side -------------------------------------------------------------------
    async def take(
        self, n: int, timeout_s: float = 1.0, epoch: int | None = None, rank: int | None = None
    ) -> list[dict[str, Any]] | None:
        """Up to ``n`` samples (waits up to ``timeout_s`` for the first); None once closed and
        empty, or once stream ``epoch`` (None: any) has ended. With rollout batches, ``rank``
        names the trainer rank whose parts are read (padding rows included)."""
        if (self.batcher is None) != (rank is None):
            raise ValueError(
                f"take(rank={rank!r}): a rank is needed exactly when the buffer deals rollout "
                f"batches (trainer.schedule=rollout_batch; this buffer: "
                f"{'fixed' if self.batcher is None else 'rollout_batch'})"
            )

        def ended() -> bool:
            return epoch is not None and epoch != self._epoch

        def ready() -> bool:
            return (
                self.batcher.ready(rank)
                if self.batcher is not None and rank is not None
                else bool(self._rows)
            )

        async with self._cond:
            try:
                await asyncio.wait_for(
                    self._cond.wait_for(lambda: self._closed or ended() or ready()), timeout_s
                )
            except TimeoutError:
                return []
            if self._closed and self.batcher is not None:
                self.batcher.flush()  # no more groups: the last, short batch goes out
            if ended() or (not ready() and self._closed):
                return None
            if self.batcher is not None and rank is not None:
                out = self.batcher.take(rank, n)
            else:
                out = [self._rows.popleft() for _ in range(min(n, len(self._rows)))]
            real = [row for row in out if row.get("weight", 1.0) > 0]
            for row in real:
                self._handed[row["sample_id"]] = (row["group_id"], self._epoch)
            self.stats_["samples_out"] += len(real)
            self._cond.notify_all()
            return out

    async def commit(self, step: int, sample_ids: list[str]) -> int:
        """The trainer's checkpoint at ``step`` holds these samples: they are trained. A group
        whose rows are all trained moves to ``trained/``. Idempotent; returns rows newly settled."""
        async with self._cond:
            n = sum(self._settle(sid, trained=True) for sid in sample_ids)
            if n:
                self.ledger.write(ev="commit", step=step, rows=n)
            return n

    async def requeue(self, trained_ids: list[str]) -> int:
        """After a trainer attempt died (call between ``end_stream`` and ``open_stream``): rows
        handed to its streams are trained if ``trained_ids`` (the lineage of the checkpoint the
        next attempt starts from) has them, else they go back to the head of the queue, read
        again from their pending shards. Returns the rows requeued."""
        async with self._cond:
            rows = self._take_back(set(trained_ids))
            if self.batcher is not None:
                self.batcher.rebuild(front=rows)
            else:
                self._rows.extendleft(reversed(rows))
            self._cond.notify_all()
            return len(rows)

    def _take_back(self, trained: set[str]) -> list[dict[str, Any]]:
        """Rows handed to readers of ended stream epochs: settled as trained if in
        ``trained``, else returned (read again from their pending shards) to be queued."""
        back: dict[str, set[str]] = {}
        for sid, (group_id, epoch) in list(self._handed.items()):
            if epoch >= self._epoch:  # a current reader has it
                continue
            if sid in trained:
                self._settle(sid, trained=True)
            else:
                del self._handed[sid]
                back.setdefault(group_id, set()).add(sid)
        rows = [r for g, sids in sorted(back.items()) for r in self._shard_rows(g, sids)]
        self.stats_["samples_requeued"] += len(rows)
        if rows or back:
            self.ledger.write(ev="requeue", rows=len(rows), groups=sorted(back))
        return rows

    def _shard_rows(self, group_id: str, sample_ids: set[str]) -> list[dict[str, Any]]:
        if not self.shard_dir:
            return []
        rows = read_parquet(self.shard_dir / "pending" / f"{group_id}.parquet")
        return [r for r in rows if r["sample_id"] in sample_ids]

    def _settle(self, sample_id: str, trained: bool, dequeue: bool = True) -> bool:
        """``sample_id`` needs no more training (trained, or purged as too stale); its queued
        copy, if any, is removed unless the caller already did (``dequeue=False``)."""
        group_id = self._group_of.pop(sample_id, None)
        if group_id is None:
            return False
        if self._handed.pop(sample_id, None) is None and dequeue:  # still queued
            if self.batcher is not None:
                self.batcher.rebuild(drop={sample_id})
            else:
                self._rows = deque(r for r in self._rows if r["sample_id"] != sample_id)
        left = self._open[group_id]
        left.discard(sample_id)
        if trained:
            self._trained_in[group_id] = self._trained_in.get(group_id, 0) + 1
            self.stats_["samples_trained"] += 1
        if not left:
            self._settled(group_id)
        return True

    def _settled(self, group_id: str) -> None:
        self._open.pop(group_id, None)
        trained = self._trained_in.pop(group_id, 0)
        self._move_shard(group_id, "trained" if trained else "purged")
        if trained:
            self.stats_["groups_trained"] += 1
            self.ledger.write(ev="trained", group=group_id)

    def _move_shard(self, group_id: str, to: str) -> None:
        """pending/ → ``to``/: a restart restores only what was never trained."""
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
        """The epoch for a new stream, after dropping buffered rows too stale to train on
        (same rule as ``put_group``; counted as ``groups_purged_stale``, shards kept)."""
        async with self._cond:
            limit = self.version - self.cfg.max_staleness - 1
            if self.batcher is not None:
                # Rows an ended stream read ahead and never trained (its checkpoint committed
                # what it trained) go back, and every rank's parts are dealt afresh: a reader
                # that stopped mid-part would leave the ranks' parts misaligned.
                back = self._take_back(set())
                queued = back + self.batcher.queued()
            else:
                queued = list(self._rows)
            stale = [r for r in queued if r["behavior_version"] < limit]
            ids = {r["sample_id"] for r in stale}
            if self.batcher is not None:
                self.batcher.rebuild(front=back, drop=ids)
            elif ids:
                self._rows = deque(r for r in self._rows if r["sample_id"] not in ids)
            if stale:
                self.ledger.write(ev="purge", ids=sorted(ids))
                for row in stale:
                    self._settle(row["sample_id"], trained=False, dequeue=False)
                self.stats_["groups_purged_stale"] += len({r["group_id"] for r in stale})
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
            buffered_samples=self._queued(),
            handed_samples=len(self._handed),
            groups_in_flight=self._in_flight,
            mean_lag=s["lag_sum"] / s["samples_in"] if s["samples_in"] else 0.0,
            success_rate=s["episodes_success"] / s["episodes"] if s["episodes"] else 0.0,
            uptime_s=time.time() - self._started_at,
        )
        s.update({f"success_rate/{k}": v for k, v in self.success_by_kind().items()})
        s.update(self.picker.stats() if self.picker else {"tasks_saturated": 0, "tasks_skipped": 0})
        if self.batcher is not None:
            s.update(
                rollout_batches=self.batcher.batches,
                rollout_batches_empty=self.batcher.empty_batches,
            )
        return s

    def _restore(self, trained: set[str]) -> None:
        """A (re)start: reload the pending rows the trainer's checkpoint has not trained on,
        record groups the previous life left in flight as abandoned, and continue the group
        numbering after the highest group ever started (ids stay unique across restarts)."""
        assert self.shard_dir is not None
        history = read_jsonl(self.shard_dir / LEDGER_FILE)
        ended = {e["group"] for e in history if e.get("ev") in ("complete", "drop", "zero_grad")}
        pending = sorted((self.shard_dir / "pending").glob("*.parquet"))
        restored = 0
        for shard in pending:
            if shard.stem not in ended:  # written, but the life ended before its ledger line
                self.ledger.write(ev="complete", group=shard.stem, rows=-1)
                ended.add(shard.stem)
            rows = read_parquet(shard)
            if rows:
                restored += self._admit(shard.stem, rows, trained) > 0
        self.stats_["groups_restored"] = restored
        started = [e["group"] for e in history if e.get("ev") == "start"]
        for group_id in dict.fromkeys(started):
            if group_id not in ended and not self._shard_exists(group_id):
                self._drop(group_id, "abandoned")
        seqs = [int(g[1:]) for g in started if g[1:].isdigit()]
        self._cursor = max([self._cursor, *(s + 1 for s in seqs)])
        self.ledger.write(ev="life", restored_groups=restored, cursor=self._cursor)

    def _shard_exists(self, group_id: str) -> bool:
        assert self.shard_dir is not None
        return any(self.shard_dir.glob(f"*/{group_id}.parquet"))
