"""Replica side of the weight hot-swap: follow the registry, load each new version.

At start the replica registers its model's manifest, loads the latest version if it is newer
than the checkpoint's, and reports. Then a background task long-polls the registry: a commit
wakes it at once; it fetches every shard (async, zero-copy views of the object store), checks
the whole state dict against the model, and hands it to the backend, which swaps atomically.
Any failure (lost object, mismatch, timeout) leaves the previous version in service, is
reported, and that version is skipped; the next newer one is tried normally. The replica
reports its state after each load and, as a heartbeat, every poll interval (also during a long
load), so ``wait_for_version`` knows which replicas are alive and what each serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

import ray

from serve_apps.backends.base import InferenceBackend
from serve_apps.config import WeightSyncConfig
from serve_apps.weights.format import shard_tensors
from serve_apps.weights.manifest import Publication
from serve_apps.weights.registry import get_registry

logger = logging.getLogger(__name__)


class WeightFollower:
    def __init__(self, cfg: WeightSyncConfig, backend: InferenceBackend, replica_id: str) -> None:
        self.cfg = cfg
        self.backend = backend
        self.replica_id = replica_id
        self.registry: Any = None
        self.seen = backend.version  # newest version tried (loaded or failed)
        self.loads = 0
        self.failures = 0
        self.last_error: str | None = None
        self.last_load_s: float | None = None
        self.last_fetch_s: float | None = None
        self.last_published_at: float | None = None
        self.last_loaded_at: float | None = None
        self.loading: int | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Connect, catch up with the latest version, report, then follow in the background."""
        await self._connect()
        latest = await self.registry.latest.remote()
        if latest is not None and latest.version > self.seen:
            await self._load(latest)
        await self.report()
        self._tasks = [
            asyncio.create_task(self._follow(), name="csd-weight-follower"),
            asyncio.create_task(self._heartbeat(), name="csd-weight-heartbeat"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.registry is not None:
            await self.registry.forget.remote(self.replica_id)

    def state(self) -> dict[str, Any]:
        return {
            "version": self.backend.version,
            "loading": self.loading,
            "loads": self.loads,
            "failures": self.failures,
            "last_error": self.last_error,
            "last_load_s": self.last_load_s,
            "last_fetch_s": self.last_fetch_s,
            "last_published_at": self.last_published_at,
            "last_loaded_at": self.last_loaded_at,
            "pid": os.getpid(),
            "stale_after_s": self.cfg.stale_after_s,
        }

    async def report(self) -> None:
        await self.registry.report.remote(self.replica_id, self.state())

    async def _connect(self) -> None:
        self.registry = get_registry(self.cfg.registry_name, self.cfg.namespace)
        await self.registry.set_manifest.remote(self.backend.manifest())

    async def _follow(self) -> None:
        while True:
            try:
                pub = await self.registry.wait_newer.remote(self.seen, self.cfg.poll_interval_s)
                if pub is not None:
                    await self._load(pub)
                await self.report()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # registry restarting, network: retry after a pause
                logger.warning("weight follower: %r; reconnecting", exc)
                await asyncio.sleep(min(self.cfg.poll_interval_s, 1.0))
                await self._reconnect()

    async def _heartbeat(self) -> None:
        """Report every poll interval, also while a long load runs (liveness for
        ``wait_for_version``; a replica still loading reports its old version and ``loading``)."""
        while True:
            await asyncio.sleep(self.cfg.poll_interval_s)
            try:
                await self.report()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("weight follower: heartbeat failed: %r", exc)

    async def _reconnect(self) -> None:
        try:
            await self._connect()
        except Exception as exc:
            logger.warning("weight follower: registry unreachable: %r", exc)

    async def _load(self, pub: Publication) -> None:
        self.seen = max(self.seen, pub.version)
        self.loading = pub.version
        with contextlib.suppress(Exception):  # best effort: tell the registry a load started
            await self.report()
        t0 = time.perf_counter()
        try:
            arrays = await asyncio.wait_for(
                asyncio.gather(*[s.ref for s in pub.shards]), self.cfg.load_timeout_s
            )
            self.last_fetch_s = time.perf_counter() - t0
            await self.backend.load_weights(pub.version, _tensors(pub, arrays))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.failures += 1
            self.last_error = f"version {pub.version}: {type(exc).__name__}: {exc}"[:2000]
            logger.error("weight follower: keeping version %d; %s", self.backend.version, exc)
        else:
            self.loads += 1
            self.last_error = None
            self.last_load_s = time.perf_counter() - t0
            self.last_published_at = pub.created_at
            self.last_loaded_at = time.time()
            logger.info("weight follower: version %d in %.3fs", pub.version, self.last_load_s)
        finally:
            self.loading = None


def _tensors(pub: Publication, arrays: list[Any]) -> Iterator[tuple[str, Any]]:
    for shard, shard_arrays in zip(pub.shards, arrays, strict=True):
        yield from shard_tensors(shard.entries, shard_arrays)


def replica_id() -> str:
    """This Serve replica's id, or a process-unique id outside Serve."""
    try:
        from ray import serve

        return serve.get_replica_context().replica_id.to_full_id_str()
    except Exception:
        return f"pid-{os.getpid()}-{ray.get_runtime_context().get_worker_id()[:8]}"
