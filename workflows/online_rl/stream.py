"""An unbounded Ray Data source over the trajectory buffer.

Each read task loops on ``buffer.take`` and yields small Arrow blocks until the buffer closes,
so ``get_dataset_shard("train")`` in every Train worker sees samples as soon as groups finish.
Blocks must be small (``DataContext.target_max_block_size``) or Ray Data holds them back until
128 MiB accumulate and everything waits silently (RAY_NOTES.md). The tiny size is given to this
dataset only (a dataset keeps a copy of the context it was created under): bounded datasets of
the same process (SFT data, benchmarks) keep Ray's default blocks; at 1 KiB any map stage on
them re-blocks to one block per row (a 64-row table: 64 blocks after ``map_batches``, 1 at the
default).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from train_loops.schema import STEP_SAMPLE_SCHEMA, STREAM_PART_SCHEMA


def _read_forever(
    buffer: Any, rows_per_block: int, poll_s: float, epoch: int | None, rank: int | None
) -> Iterator[pa.Table]:
    import ray

    schema = STEP_SAMPLE_SCHEMA if rank is None else STREAM_PART_SCHEMA
    while True:
        rows = ray.get(buffer.take.remote(rows_per_block, poll_s, epoch, rank))
        if rows is None:  # closed and drained, or this stream epoch ended
            return
        if rows:
            yield pa.Table.from_pylist(rows, schema=schema)


class BufferDatasource(Datasource):
    """``ray.data.read_datasource(BufferDatasource(buffer), override_num_blocks=n)``.

    ``epoch`` (from ``buffer.open_stream``) ends the stream when the buffer ends that epoch;
    None reads until the buffer closes. ``rank``: read the rollout-batch parts dealt to that
    trainer rank (``train_loops.schema.STREAM_PART_SCHEMA``); None: the shared queue."""

    def __init__(
        self,
        buffer: Any,
        rows_per_block: int = 2,
        poll_s: float = 1.0,
        epoch: int | None = None,
        rank: int | None = None,
    ) -> None:
        self.buffer = buffer
        self.rows_per_block = rows_per_block
        self.poll_s = poll_s
        self.epoch = epoch
        self.rank = rank

    def estimate_inmemory_data_size(self) -> int | None:
        return None

    def get_read_tasks(
        self,
        parallelism: int,
        per_task_row_limit: int | None = None,
        data_context: Any | None = None,
    ) -> list[ReadTask]:
        meta = BlockMetadata(num_rows=None, size_bytes=None, exec_stats=None, input_files=None)
        buffer, n, poll, epoch, rank = (
            self.buffer, self.rows_per_block, self.poll_s, self.epoch, self.rank
        )  # fmt: skip
        schema = STEP_SAMPLE_SCHEMA if rank is None else STREAM_PART_SCHEMA
        # One reader per rank's parts: two would interleave a part's rows out of order.
        readers = max(1, parallelism) if rank is None else 1
        return [
            ReadTask(lambda: _read_forever(buffer, n, poll, epoch, rank), meta, schema=schema)
            for _ in range(readers)
        ]


def buffer_dataset(
    buffer: Any,
    num_readers: int = 1,
    rows_per_block: int = 2,
    epoch: int | None = None,
    block_size_kb: int = 1,
    rank: int | None = None,
):  # -> Dataset
    """A streaming dataset of step samples (of rank ``rank``'s rollout-batch parts if given);
    ends when the buffer closes or ends ``epoch``."""
    import ray

    with streaming_blocks(block_size_kb):
        return ray.data.read_datasource(
            BufferDatasource(buffer, rows_per_block, epoch=epoch, rank=rank),
            override_num_blocks=num_readers if rank is None else 1,
            num_cpus=0,
        )


@contextmanager
def streaming_blocks(block_size_kb: int = 1) -> Iterator[None]:
    """Datasets created inside get ``block_size_kb`` blocks; the process default is restored."""
    from ray.data import DataContext

    ctx = DataContext.get_current()
    saved = ctx.target_max_block_size
    ctx.target_max_block_size = block_size_kb * 1024
    try:
        yield
    finally:
        ctx.target_max_block_size = saved
