"""Names, shapes and dtypes of published weights (pure Python: the registry imports no torch).

A :class:`Publication` is one complete weight version: shards (object refs) and the entries
(tensor name, dtype, shape, byte size) each shard holds. A :data:`WeightManifest` is what a
served model needs; :func:`check_state_dict` compares the two before anything is loaded.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: str


WeightManifest = dict[str, TensorSpec]


class WeightMismatch(ValueError):
    """A published state dict does not fit the served model (names, shapes)."""


def check_state_dict(
    expected: Mapping[str, TensorSpec], given: Mapping[str, tuple[tuple[int, ...], str]]
) -> None:
    """Raise :class:`WeightMismatch` unless ``given`` (name -> (shape, dtype)) covers exactly the
    expected names with the same shapes. Dtypes may differ (cast on load)."""
    missing = sorted(set(expected) - set(given))
    unknown = sorted(set(given) - set(expected))
    wrong = [
        f"{n}: {tuple(given[n][0])} != {expected[n].shape}"
        for n in sorted(set(expected) & set(given))
        if tuple(given[n][0]) != expected[n].shape
    ]
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing (e.g. {missing[:3]})")
    if unknown:
        problems.append(f"{len(unknown)} unknown (e.g. {unknown[:3]})")
    if wrong:
        problems.append(f"{len(wrong)} with wrong shape (e.g. {wrong[:3]})")
    if problems:
        raise WeightMismatch("state dict does not fit the model: " + "; ".join(problems))


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str  # torch dtype name without "torch.", e.g. "bfloat16"
    shape: tuple[int, ...]
    nbytes: int


@dataclass
class Shard:
    """One object-store object: a list of uint8 arrays, one per entry, in entry order."""

    ref: Any  # ray.ObjectRef; kept opaque so this module does not import ray
    entries: list[TensorEntry]

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries)


@dataclass
class Publication:
    """A complete weight version: every shard, registered at once."""

    version: int
    shards: list[Shard]
    publisher: str = ""
    created_at: float = field(default_factory=time.time)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.shards)

    @property
    def num_tensors(self) -> int:
        return sum(len(s.entries) for s in self.shards)

    def specs(self) -> dict[str, tuple[tuple[int, ...], str]]:
        return {e.name: (e.shape, e.dtype) for s in self.shards for e in s.entries}
