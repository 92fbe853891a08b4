"""Helpers of the trainer integration tests: an endless Ray Data source and a publisher probe."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import ray
import torch
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from workflows.online_rl.stream import streaming_blocks


class EndlessSource(Datasource):
    """A streaming source whose single read task never ends: it cycles ``rows`` forever,
    ``rows_per_block`` at a time, like the online-RL buffer source does with fresh samples."""

    def __init__(self, table: pa.Table, rows_per_block: int = 2):
        self._table = table
        self._per_block = rows_per_block

    def estimate_inmemory_data_size(self) -> int | None:
        return None

    def get_read_tasks(
        self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None
    ) -> list[ReadTask]:
        table, per_block = self._table, self._per_block

        def read() -> Iterator[pa.Table]:
            for start in itertools.cycle(range(0, table.num_rows, per_block)):
                yield table.slice(start, per_block)

        meta = BlockMetadata(num_rows=None, size_bytes=None, input_files=None, exec_stats=None)
        return [ReadTask(read, meta, schema=table.schema)]


def endless_dataset(table: pa.Table, rows_per_block: int = 2) -> ray.data.Dataset:
    with streaming_blocks():
        return ray.data.read_datasource(EndlessSource(table, rows_per_block), override_num_blocks=1)


def weights_digest(state_dict: dict[str, torch.Tensor]) -> str:
    """Order-independent digest of a state dict's names and values."""
    h = hashlib.sha256()
    for name in sorted(state_dict):
        h.update(name.encode())
        h.update(state_dict[name].detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


@ray.remote(num_cpus=0)
class PublishLog:
    """Remembers every publication (version, digest, tensor count) and the latest weights."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.latest: dict[str, torch.Tensor] | None = None

    def record(self, version: int, digest: str, weights_ref: Sequence[ray.ObjectRef]) -> None:
        self.latest = ray.get(weights_ref[0])
        n = len(self.latest)
        self.calls.append({"version": version, "digest": digest, "tensors": n})

    def get_calls(self) -> list[dict[str, Any]]:
        return self.calls

    def get_latest(self) -> dict[str, torch.Tensor] | None:
        return self.latest


def new_publish_log() -> Any:
    """A fresh :class:`PublishLog` actor."""
    return PublishLog.remote()  # type: ignore[attr-defined]


class RecordingPublisher:
    """A ``publish_fn``: puts the weights in the object store and tells :class:`PublishLog`,
    the way the workflows' publisher hands them to the Serve replicas."""

    def __init__(self, log: Any):
        self.log = log

    def __call__(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        assert all(t.device.type == "cpu" for t in state_dict.values())
        ref = ray.put(state_dict)
        ray.get(self.log.record.remote(version, weights_digest(state_dict), [ref]))
