"""How a state dict travels through the object store: shards of raw tensor bytes.

Each tensor becomes a flat ``uint8`` numpy view of its bytes (no copy on the publisher for CPU
tensors); a shard is one object holding the views of up to ``bucket_bytes`` of tensors. Ray
stores numpy arrays out-of-band, so ``ray.put`` copies each byte once into shared memory and a
replica's ``get`` maps them without copying; the replica's only copy is into its parameters.
Dtypes travel by name, so bfloat16 works although numpy has no such type.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import torch

from serve_apps.weights.manifest import TensorEntry


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def tensor_bytes(tensor: torch.Tensor) -> np.ndarray:
    """The tensor's bytes as a flat uint8 numpy array (a view for contiguous CPU tensors)."""
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous().reshape(-1)
    if t.numel() == 0:
        return np.empty(0, dtype=np.uint8)
    return t.view(torch.uint8).numpy()


def entry_of(name: str, tensor: torch.Tensor) -> TensorEntry:
    nbytes = tensor.numel() * tensor.element_size()
    return TensorEntry(name, dtype_name(tensor.dtype), tuple(tensor.shape), nbytes)


def plan_buckets(state: Mapping[str, torch.Tensor], bucket_bytes: int) -> list[list[str]]:
    """Group names (in state-dict order) into buckets of about ``bucket_bytes``."""
    buckets: list[list[str]] = [[]]
    size = 0
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if buckets[-1] and size + nbytes > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(name)
        size += nbytes
    return [b for b in buckets if b]


def shard_tensors(
    entries: Sequence[TensorEntry], arrays: Sequence[np.ndarray]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Rebuild ``(name, tensor)`` pairs from a fetched shard; tensors alias the arrays."""
    if len(entries) != len(arrays):
        raise ValueError(f"shard has {len(arrays)} arrays for {len(entries)} entries")
    for entry, array in zip(entries, arrays, strict=True):
        if array.nbytes != entry.nbytes:
            raise ValueError(f"{entry.name}: {array.nbytes} bytes, expected {entry.nbytes}")
        dtype = getattr(torch, entry.dtype)
        if entry.nbytes == 0:
            yield entry.name, torch.empty(entry.shape, dtype=dtype)
            continue
        with warnings.catch_warnings():  # the object store's buffers are read-only; we only read
            warnings.simplefilter("ignore", UserWarning)
            flat = torch.frombuffer(array, dtype=torch.uint8)
        yield entry.name, flat.view(dtype).view(entry.shape)


def strip_prefix(state: Mapping[str, torch.Tensor], prefix: str | None) -> dict[str, torch.Tensor]:
    """Drop a wrapper prefix (DeepSpeed/DDP's ``module.``) from every name that has it."""
    if not prefix:
        return dict(state)
    return {n.removeprefix(prefix): t for n, t in state.items()}
