"""Rows from a Ray Data shard, a fixed number at a time, for bounded and unbounded sources.

An online-RL source never ends (its read tasks run forever), so the loop never waits for the
dataset to finish: it takes ``rows_per_step`` rows, trains, and stops on ``max_steps``. A
bounded source (SFT data, a fixed test batch) ends; with ``cycle=True`` another pass starts,
otherwise :meth:`RowStream.next` returns None and the ranks agree to stop
(:func:`agree`), so no rank is left waiting in a collective.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

Row = dict[str, Any]


class RowStream:
    """``next()`` → a list of exactly ``rows_per_step`` rows, or None when the data ended."""

    def __init__(self, shard: Any, rows_per_step: int, cycle: bool, prefetch_batches: int = 1):
        self._shard = shard
        self._n = rows_per_step
        self._cycle = cycle
        self._prefetch = prefetch_batches
        self._it: Iterator[Any] | None = None
        self._rows_this_pass = 0
        self.passes = 0

    def _open(self) -> Iterator[Any]:
        self.passes += 1
        self._rows_this_pass = 0
        batches = self._shard.iter_batches(
            batch_size=self._n,
            batch_format="pyarrow",
            drop_last=True,
            prefetch_batches=self._prefetch,
        )
        return iter(batches)

    def next(self) -> list[Row] | None:
        for _ in range(2):  # at most one new pass per call: an empty pass means no data at all
            if self._it is None:
                self._it = self._open()
            table = next(self._it, None)
            if table is not None:
                self._rows_this_pass += table.num_rows
                return table.to_pylist()
            self._it = None
            if not self._cycle or self._rows_this_pass == 0:
                return None
        return None


class PartStream:
    """``next()`` → the rows of this rank's next rollout-batch part (``part_rows`` of them,
    padding included; ``train_loops.schema.PART_FIELDS``), or None when the data ended.

    The shard is this rank's own, unsplit dataset: the buffer deals the k-th part of every
    rollout batch to every rank, so the ranks' k-th calls return parts of the same batch."""

    def __init__(self, shard: Any, prefetch_batches: int = 1):
        self._shard = shard
        self._prefetch = prefetch_batches
        self._it: Iterator[Any] | None = None
        self._left: list[Row] = []  # rows read past the end of the last part

    def next(self) -> list[Row] | None:
        if self._it is None:
            self._it = iter(
                self._shard.iter_batches(
                    batch_size=None, batch_format="pyarrow", prefetch_batches=self._prefetch
                )
            )
        rows, self._left = self._left, []
        while not rows or len(rows) < int(rows[0]["part_rows"]):
            table = next(self._it, None)
            if table is None:  # a part cut short (its epoch ended) is not trained
                return None
            rows.extend(table.to_pylist())
        n = int(rows[0]["part_rows"])
        part, self._left = rows[:n], rows[n:]
        seqs = sorted({int(r["batch_seq"]) for r in part})
        if len(seqs) > 1:
            raise RuntimeError(f"a part mixes rows of rollout batches {seqs}")
        return part


def agree(ready: bool, want_report: bool, device: torch.device | str) -> tuple[bool, bool]:
    """(every rank is ready, some rank wants a report) in one MIN all-reduce.

    Decisions that change collective calls (stop, ``ray.train.report``) must be identical on
    all ranks; without torch.distributed the inputs are returned.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return ready, want_report
    flags = torch.tensor([int(ready), -int(want_report)], dtype=torch.int32, device=device)
    dist.all_reduce(flags, op=dist.ReduceOp.MIN)
    return bool(flags[0].item() == 1), bool(flags[1].item() == -1)


def any_rank(flag: bool, device: torch.device | str) -> bool:
    """True on every rank if ``flag`` is True on some rank (one MAX all-reduce)."""
    if not (dist.is_available() and dist.is_initialized()):
        return flag
    t = torch.tensor([int(flag)], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())
