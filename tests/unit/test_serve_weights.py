"""Weight shard format and manifest checks (no Ray: the object store is played by read-only
numpy arrays, which is what a replica's ``get`` returns)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from serve_apps.weights.format import (
    entry_of,
    plan_buckets,
    shard_tensors,
    strip_prefix,
    tensor_bytes,
)
from serve_apps.weights.manifest import (
    Publication,
    Shard,
    TensorSpec,
    WeightMismatch,
    check_state_dict,
)


def sample_state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {
        "f32": torch.randn(3, 5),
        "bf16": torch.randn(7, 2).to(torch.bfloat16),
        "f16": torch.randn(4).half(),
        "i64": torch.arange(6).reshape(2, 3),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
        "transposed": torch.randn(4, 3).t(),  # not contiguous
    }


def test_round_trip_preserves_values_dtypes_and_shapes() -> None:
    state = sample_state()
    entries = [entry_of(n, t) for n, t in state.items()]
    arrays = [tensor_bytes(t).copy() for t in state.values()]
    for a in arrays:
        a.setflags(write=False)  # like the object store's buffers
    rebuilt = dict(shard_tensors(entries, arrays))
    assert list(rebuilt) == list(state)
    for name, tensor in state.items():
        assert rebuilt[name].dtype == tensor.dtype and rebuilt[name].shape == tensor.shape
        assert torch.equal(rebuilt[name], tensor)
    assert entries[1].dtype == "bfloat16" and entries[1].nbytes == 7 * 2 * 2


def test_tensor_bytes_is_a_view_for_contiguous_cpu_tensors() -> None:
    t = torch.randn(16)
    view = tensor_bytes(t)
    assert view.dtype == np.uint8 and view.nbytes == 64
    t.add_(1.0)
    assert np.array_equal(view, t.view(torch.uint8).numpy())  # same memory


def test_corrupt_shards_are_refused() -> None:
    state = sample_state()
    entries = [entry_of(n, t) for n, t in state.items()]
    arrays = [tensor_bytes(t) for t in state.values()]
    with pytest.raises(ValueError, match="arrays for"):
        list(shard_tensors(entries, arrays[:-1]))
    with pytest.raises(ValueError, match="bytes, expected"):
        list(shard_tensors(entries[:1], [arrays[0][:-4]]))


def test_buckets_and_prefix() -> None:
    state = {f"w{i}": torch.zeros(256) for i in range(10)}  # 1 KiB each
    buckets = plan_buckets(state, bucket_bytes=3 * 1024)
    assert [len(b) for b in buckets] == [3, 3, 3, 1]
    assert [n for b in buckets for n in b] == list(state)
    assert plan_buckets({"big": torch.zeros(10_000)}, 1024) == [["big"]]
    wrapped = {"module.a": torch.zeros(1), "b": torch.zeros(1)}
    assert list(strip_prefix(wrapped, "module.")) == ["a", "b"]
    assert list(strip_prefix(wrapped, None)) == ["module.a", "b"]


def test_manifest_check_names_every_problem() -> None:
    expected = {"a": TensorSpec((2, 3), "float32"), "b": TensorSpec((4,), "float32")}
    check_state_dict(
        expected, {"a": ((2, 3), "bfloat16"), "b": ((4,), "float32")}
    )  # dtype may differ
    with pytest.raises(WeightMismatch) as err:
        check_state_dict(expected, {"a": ((3, 2), "float32"), "c": ((1,), "float32")})
    message = str(err.value)
    assert "1 missing (e.g. ['b'])" in message and "1 unknown (e.g. ['c'])" in message
    assert "a: (3, 2) != (2, 3)" in message


def test_publication_specs() -> None:
    state = sample_state()
    pub = Publication(4, [Shard("ref", [entry_of(n, t) for n, t in state.items()])])
    assert pub.num_tensors == len(state)
    assert pub.nbytes == sum(t.numel() * t.element_size() for t in state.values())
    assert pub.specs()["bf16"] == ((7, 2), "bfloat16")
