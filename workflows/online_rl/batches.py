"""Rollout batches: the authors' update schedule (``trainer.schedule: rollout_batch``).

The reference takes one optimizer step per rollout batch (4 tasks × 8 episodes) on all of that
batch's step samples, a dynamic batch size, after dropping the samples that carry no gradient;
an update left empty is skipped. Here every ``groups`` completed groups form one batch, in
completion order (a group with no row left still counts: it was part of the batch). Its rows are
padded to a multiple of ``world × micro`` with zero-weight copies, so every rank runs the same
number of full micro-batches (ZeRO reduces gradients on each backward, so the ranks' backward
counts must match), and dealt round-robin into ``world`` parts of equal length. Rank r reads
only ``parts[r]``; the k-th part on every rank belongs to the same batch. A batch left without
rows is not dealt at all (no update; counted in ``empty_batches``).

Pure Python (no ray/torch): the buffer actor owns one :class:`RolloutBatcher`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

Row = dict[str, Any]
TRANSPORT = ("batch_seq", "batch_real", "part_rows", "weight")


def deal(rows: Sequence[Row], seq: int, world: int, micro: int) -> list[list[Row]]:
    """One non-empty rollout batch → ``world`` parts of equal length, with the transport
    fields of ``train_loops.schema.PART_FIELDS``; padding (weight 0) ends each part."""
    if not rows:
        raise ValueError(f"rollout batch {seq} has no rows to deal")
    real, unit = len(rows), world * micro
    padded = list(rows) + [rows[i % real] for i in range(-(-real // unit) * unit - real)]
    per = len(padded) // world
    parts: list[list[Row]] = [[] for _ in range(world)]
    for i, row in enumerate(padded):
        extra = {"batch_seq": seq, "batch_real": real, "part_rows": per}
        parts[i % world].append({**row, **extra, "weight": 1.0 if i < real else 0.0})
    return parts


def strip(row: Row) -> Row:
    """A row without the transport fields."""
    return {k: v for k, v in row.items() if k not in TRANSPORT}


class RolloutBatcher:
    """Completed groups in, per-rank parts out (see the module docstring)."""

    def __init__(self, groups: int, world: int, micro: int) -> None:
        if groups < 1 or world < 1 or micro < 1:
            raise ValueError(f"groups, world, micro must be >= 1, got {groups}, {world}, {micro}")
        self.groups, self.world, self.micro = groups, world, micro
        self.parts: list[deque[Row]] = [deque() for _ in range(world)]
        self._rows: list[Row] = []  # the batch being filled
        self._count = 0  # groups in it
        self._seq_of: dict[str, int] = {}  # sample id → the batch it was dealt in
        self.seq = 0  # number of the next batch
        self.batches = 0
        self.empty_batches = 0

    def add_group(self, rows: Sequence[Row]) -> bool:
        """A completed group's rows that need training (maybe none). True if it completed a
        batch (dealt, or counted as empty)."""
        self._rows.extend(rows)
        self._count += 1
        if self._count < self.groups:
            return False
        self.flush()
        return True

    def flush(self) -> None:
        """Close the batch being filled, short as it may be (no more groups will come)."""
        if not self._count:
            return
        if self._rows:
            self._deal(self._rows, self.seq)
        else:
            self.empty_batches += 1
        self.batches += 1
        self.seq += 1
        self._rows, self._count = [], 0

    def _deal(self, rows: Sequence[Row], seq: int) -> None:
        for part, queue in zip(deal(rows, seq, self.world, self.micro), self.parts, strict=True):
            queue.extend(part)
        self._seq_of.update((str(r["sample_id"]), seq) for r in rows)

    def take(self, rank: int, n: int) -> list[Row]:
        """Up to ``n`` rows of rank ``rank``'s queue (whole parts come out in order)."""
        queue = self.parts[rank]
        return [queue.popleft() for _ in range(min(n, len(queue)))]

    def ready(self, rank: int) -> bool:
        return bool(self.parts[rank])

    def queued(self) -> list[Row]:
        """The real rows not yet taken (padding left out), oldest batch first, without
        transport fields; then the batch being filled."""
        return self._dealt() + list(self._rows)

    def _dealt(self) -> list[Row]:
        dealt = [row for queue in self.parts for row in queue if row["weight"] > 0]
        dealt.sort(key=lambda r: r["batch_seq"])  # stable: part order within a batch
        return [strip(r) for r in dealt]

    def queued_count(self) -> int:
        """Real rows queued (the buffer's capacity counts these)."""
        dealt = sum(1 for queue in self.parts for row in queue if row["weight"] > 0)
        return dealt + len(self._rows)

    def rebuild(self, front: Iterable[Row] = (), drop: Iterable[str] = ()) -> None:
        """Deal every dealt batch again, each with the same members: its rows still queued
        plus those in ``front`` (rows handed to a reader that will never train them, e.g. a
        dead trainer), less the sample ids in ``drop``. A reader that stopped mid-part leaves
        the ranks' queues misaligned; dealing afresh aligns them. A batch left with no row is
        dropped; the batch being filled keeps its groups. Rows of ``front`` this batcher never
        dealt (handed in an earlier life of the buffer) join the batch being filled."""
        gone = set(drop)
        by_seq: dict[int, dict[str, Row]] = {}
        for row in [*map(strip, front), *self._dealt()]:
            sid = str(row["sample_id"])
            if sid not in gone:
                by_seq.setdefault(self._seq_of.get(sid, self.seq), {})[sid] = row
        for queue in self.parts:
            queue.clear()
        fresh = list(by_seq.pop(self.seq, {}).values())
        for seq in sorted(by_seq):
            self._deal(list(by_seq[seq].values()), seq)
        self._rows = [r for r in fresh + self._rows if r["sample_id"] not in gone]
