"""The weight registry: a small named actor holding the latest complete weight version.

Publishers put shards into the object store and register them here in one call (or in parts
that become visible only when every part has arrived). Replicas long-poll
:meth:`WeightRegistry.wait_newer`: the call returns as soon as a newer version is committed,
so every replica learns of it at once, without a redeploy; a replica that starts later asks
for :meth:`WeightRegistry.latest`. Replicas also report the version they serve, which is how
tests, benchmarks and the job's metrics see *every* replica (a handle call reaches only one).

The registry holds references to the latest version's shards only; older ones are released
as soon as no replica is still reading them (Ray reference counting). The shards are owned by
the process that put them: keep the publisher's process alive while replicas may still load.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import ray

from serve_apps.weights.manifest import (
    Publication,
    Shard,
    TensorSpec,
    WeightMismatch,
    check_state_dict,
)

logger = logging.getLogger(__name__)

ACTOR_PREFIX = "csd-weights-"


class StaleVersion(ValueError):
    """A publication whose version is not newer than the registry's latest."""


@dataclass
class _Staging:
    num_parts: int
    parts: dict[int, list[Shard]] = field(default_factory=dict)
    publisher: str = ""


class WeightRegistry:
    """Async actor; all methods are coroutines on one event loop (no locks needed)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._latest: Publication | None = None
        self._staging: dict[int, _Staging] = {}
        self._manifest: dict[str, TensorSpec] | None = None
        self._replicas: dict[str, dict[str, Any]] = {}
        self._changed = asyncio.Event()
        self._reported = asyncio.Event()
        self._rejected = 0

    async def commit(self, publication: Publication) -> int:
        """Make ``publication`` the latest version; raises on a stale version or a state dict
        that does not fit the served model (then nothing changes)."""
        self._check(publication)
        self._latest = publication
        for version in [v for v in self._staging if v <= publication.version]:
            del self._staging[version]
        self._changed.set()
        self._changed = asyncio.Event()
        logger.info("registry %s: version %d committed", self.name, publication.version)
        return publication.version

    async def stage(
        self, version: int, part: int, num_parts: int, shards: list[Shard], publisher: str = ""
    ) -> bool:
        """Add one part of a multi-part publication; commits (returns True) with the last."""
        if not 0 <= part < num_parts:
            raise ValueError(f"part {part} of {num_parts}")
        self._check_version(version)
        staging = self._staging.setdefault(version, _Staging(num_parts, publisher=publisher))
        if staging.num_parts != num_parts:
            raise ValueError(f"version {version}: {num_parts} parts, earlier {staging.num_parts}")
        staging.parts[part] = shards
        if len(staging.parts) < num_parts:
            return False
        shards_all = [s for p in sorted(staging.parts) for s in staging.parts[p]]
        await self.commit(Publication(version, shards_all, publisher=staging.publisher))
        return True

    async def abort(self, version: int) -> None:
        """Drop the staged parts of ``version`` (a publisher that gives up)."""
        self._staging.pop(version, None)

    async def latest(self) -> Publication | None:
        return self._latest

    async def latest_version(self) -> int | None:
        return None if self._latest is None else self._latest.version

    async def wait_newer(self, version: int, timeout_s: float) -> Publication | None:
        """The latest publication once its version exceeds ``version``; None after timeout."""
        deadline = time.monotonic() + timeout_s
        while self._latest is None or self._latest.version <= version:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                return None
        return self._latest

    async def set_manifest(self, manifest: dict[str, TensorSpec]) -> None:
        """The served model's weights (sent by replicas); commits are checked against it."""
        if self._manifest is None:
            self._manifest = dict(manifest)
        elif self._manifest != manifest:
            logger.warning("registry %s: replicas report different models", self.name)

    async def report(self, replica_id: str, state: dict[str, Any]) -> None:
        self._replicas[replica_id] = {**state, "reported_at": time.time()}
        self._reported.set()
        self._reported = asyncio.Event()

    async def forget(self, replica_id: str) -> None:
        self._replicas.pop(replica_id, None)

    async def replicas(self) -> dict[str, dict[str, Any]]:
        """Every replica's last report, with ``alive`` (reported within its stale limit)."""
        now = time.time()
        out = {}
        for rid, state in self._replicas.items():
            age = now - state["reported_at"]
            out[rid] = {**state, "age_s": age, "alive": age <= state.get("stale_after_s", 30.0)}
        return out

    async def wait_for_replicas(
        self, version: int, min_replicas: int, timeout_s: float
    ) -> dict[str, dict[str, Any]] | None:
        """Every live replica's state once at least ``min_replicas`` are live and all serve
        ``version`` or newer (woken by their reports); None after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            states = await self.replicas()
            live = [s for s in states.values() if s["alive"]]
            if len(live) >= min_replicas and all(s["version"] >= version for s in live):
                return states
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            # Wake on the next report, or re-check liveness every second.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._reported.wait(), min(remaining, 1.0))

    async def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "latest_version": await self.latest_version(),
            "latest_bytes": 0 if self._latest is None else self._latest.nbytes,
            "staged_versions": sorted(self._staging),
            "rejected": self._rejected,
            "has_manifest": self._manifest is not None,
        }

    def _check(self, publication: Publication) -> None:
        self._check_version(publication.version)
        if self._manifest is not None:
            try:
                check_state_dict(self._manifest, publication.specs())
            except WeightMismatch:
                self._rejected += 1
                raise

    def _check_version(self, version: int) -> None:
        if self._latest is not None and version <= self._latest.version:
            self._rejected += 1
            raise StaleVersion(
                f"version {version} is not newer than the latest {self._latest.version}"
            )


def registry_actor_name(name: str) -> str:
    return ACTOR_PREFIX + name


def get_registry(name: str = "policy", namespace: str = "computersd") -> Any:
    """The registry actor ``name`` (created detached on first use, by whoever comes first)."""
    actor = ray.remote(WeightRegistry).options(
        name=registry_actor_name(name),
        namespace=namespace,
        lifetime="detached",
        get_if_exists=True,
        num_cpus=0,
        max_concurrency=1000,
        max_restarts=-1,
    )
    return actor.remote(name)


def kill_registry(name: str = "policy", namespace: str = "computersd") -> bool:
    """Remove the registry actor (its versions are forgotten); True if one existed."""
    try:
        actor = ray.get_actor(registry_actor_name(name), namespace=namespace)
    except ValueError:
        return False
    ray.kill(actor)
    return True
