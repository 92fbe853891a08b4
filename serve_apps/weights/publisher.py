"""Trainer-side API of the weight hot-swap: publish a state dict as version v, and watch every
replica reach it.

    publisher = WeightPublisher("policy")
    publisher.publish(model.state_dict(), version=step)      # returns once registered
    publisher.wait_for_version(step, timeout_s=60, min_replicas=2)

A publication is atomic: shards go into the object store first, then ONE registry call makes
the version visible. If anything fails before that call (an exception, a crash) nothing is
registered and replicas stay on the previous version. The registry also refuses a state dict
that does not fit the served model (missing/unknown names, wrong shapes) and a version that is
not newer than the latest; both raise here, in the trainer. With several ranks holding parts
of the weights, each calls :meth:`WeightPublisher.publish_part`; the version becomes visible
when the last part arrives.

The publishing process owns the shards: keep it alive while replicas may still load them.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import ray
import torch

from serve_apps.weights.format import entry_of, plan_buckets, strip_prefix, tensor_bytes
from serve_apps.weights.manifest import Publication, Shard
from serve_apps.weights.registry import get_registry

DEFAULT_BUCKET_MB = 256


@dataclass
class PublishReport:
    version: int
    num_tensors: int
    num_shards: int
    nbytes: int
    put_s: float
    commit_s: float

    @property
    def total_s(self) -> float:
        return self.put_s + self.commit_s


class WeightPublisher:
    """Publishes state dicts to the registry ``registry_name`` (the policy deployment's
    ``weights.registry_name``)."""

    def __init__(
        self,
        registry_name: str = "policy",
        namespace: str = "computersd",
        bucket_mb: int = DEFAULT_BUCKET_MB,
        strip_prefix: str | None = "module.",
    ) -> None:
        self.registry = get_registry(registry_name, namespace)
        self.bucket_bytes = bucket_mb << 20
        self.prefix = strip_prefix
        self.who = f"{socket.gethostname()}:{os.getpid()}"

    def publish(self, state_dict: Mapping[str, torch.Tensor], version: int) -> PublishReport:
        """Put every tensor into the object store, then register them as ``version``."""
        t0 = time.perf_counter()
        shards = self._put(state_dict)
        t1 = time.perf_counter()
        ray.get(self.registry.commit.remote(Publication(version, shards, publisher=self.who)))
        return _report(version, shards, t1 - t0, time.perf_counter() - t1)

    def publish_part(
        self, state_dict: Mapping[str, torch.Tensor], version: int, part: int, num_parts: int
    ) -> bool:
        """Register one of ``num_parts`` disjoint parts of ``version``; True when this part
        completed the version (it is then visible to replicas)."""
        shards = self._put(state_dict)
        return ray.get(self.registry.stage.remote(version, part, num_parts, shards, self.who))

    def abort(self, version: int) -> None:
        """Forget the parts of ``version`` staged so far."""
        ray.get(self.registry.abort.remote(version))

    def latest_version(self) -> int | None:
        return ray.get(self.registry.latest_version.remote())

    def replica_versions(self, alive_only: bool = True) -> dict[str, int]:
        """Version each replica serves now (from their own reports)."""
        states = ray.get(self.registry.replicas.remote())
        return {r: s["version"] for r, s in states.items() if s["alive"] or not alive_only}

    def replica_states(self) -> dict[str, dict[str, Any]]:
        return ray.get(self.registry.replicas.remote())

    def wait_for_version(
        self, version: int, timeout_s: float = 60.0, min_replicas: int = 1
    ) -> dict[str, int]:
        """Block until at least ``min_replicas`` live replicas report, and every live replica
        serves ``version`` or newer; returns their versions. Raises TimeoutError with each
        replica's state otherwise."""
        return _wait(self.registry, version, timeout_s, min_replicas)

    def _put(self, state_dict: Mapping[str, torch.Tensor]) -> list[Shard]:
        state = strip_prefix(state_dict, self.prefix)
        shards = []
        for names in plan_buckets(state, self.bucket_bytes):
            arrays = [tensor_bytes(state[n]) for n in names]
            shards.append(Shard(ray.put(arrays), [entry_of(n, state[n]) for n in names]))
        return shards


def publish_weights(
    state_dict: Mapping[str, torch.Tensor],
    version: int,
    registry_name: str = "policy",
    namespace: str = "computersd",
    bucket_mb: int = DEFAULT_BUCKET_MB,
) -> PublishReport:
    """One-shot :meth:`WeightPublisher.publish`."""
    return WeightPublisher(registry_name, namespace, bucket_mb).publish(state_dict, version)


def wait_for_version(
    version: int,
    timeout_s: float = 60.0,
    min_replicas: int = 1,
    registry_name: str = "policy",
    namespace: str = "computersd",
) -> dict[str, int]:
    """See :meth:`WeightPublisher.wait_for_version`."""
    return _wait(get_registry(registry_name, namespace), version, timeout_s, min_replicas)


def replica_versions(
    registry_name: str = "policy", namespace: str = "computersd", alive_only: bool = True
) -> dict[str, int]:
    """Version each replica of the deployment following ``registry_name`` serves now."""
    states = ray.get(get_registry(registry_name, namespace).replicas.remote())
    return {r: s["version"] for r, s in states.items() if s["alive"] or not alive_only}


def _wait(registry: Any, version: int, timeout_s: float, min_replicas: int) -> dict[str, int]:
    done = ray.get(registry.wait_for_replicas.remote(version, min_replicas, timeout_s))
    if done is not None:
        return {r: s["version"] for r, s in done.items() if s["alive"]}
    states = ray.get(registry.replicas.remote())
    summary = {
        r: {k: s.get(k) for k in ("version", "alive", "last_error")} for r, s in states.items()
    }
    raise TimeoutError(
        f"not every replica reached version {version} within {timeout_s}s "
        f"(need {min_replicas} live): {summary}"
    )


def _report(version: int, shards: list[Shard], put_s: float, commit_s: float) -> PublishReport:
    return PublishReport(
        version=version,
        num_tensors=sum(len(s.entries) for s in shards),
        num_shards=len(shards),
        nbytes=sum(s.nbytes for s in shards),
        put_s=put_s,
        commit_s=commit_s,
    )
