"""Weight registry, publisher and replica-side follower on a real Ray cluster (no Serve): the
publication protocol, failure handling, and a late replica catching up. The full hot-swap
through Serve replicas is in test_serve_policy.py."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
import torch

from serve_apps.backends.base import ChatPrompt
from serve_apps.backends.transformers_backend import TransformersBackend
from serve_apps.config import TransformersBackendConfig, WeightSyncConfig
from serve_apps.prompting import agent_messages
from serve_apps.prompting.inputs import PromptEncoder
from serve_apps.weights.follower import WeightFollower
from serve_apps.weights.format import shard_tensors
from serve_apps.weights.manifest import Publication, Shard, TensorSpec, WeightMismatch
from serve_apps.weights.publisher import WeightPublisher
from serve_apps.weights.registry import StaleVersion, get_registry, kill_registry

pytestmark = pytest.mark.integration


@pytest.fixture
def registry_name(ray_cluster: None) -> Iterator[str]:
    name = f"test-{uuid.uuid4().hex[:8]}"
    yield name
    kill_registry(name)


def small_state(seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return {"a": torch.randn(4, 3), "b": torch.randn(5).to(torch.bfloat16)}


def manifest_of_small() -> dict[str, TensorSpec]:
    return {"a": TensorSpec((4, 3), "float32"), "b": TensorSpec((5,), "bfloat16")}


def test_publish_round_trip_and_versions(registry_name: str) -> None:
    pub = WeightPublisher(registry_name, bucket_mb=1)
    assert pub.latest_version() is None
    report = pub.publish(small_state(), 1)
    assert (report.version, report.num_tensors, report.num_shards) == (1, 2, 1)
    latest: Publication = ray.get(pub.registry.latest.remote())
    arrays = ray.get([s.ref for s in latest.shards])
    got = {
        n: t
        for s, a in zip(latest.shards, arrays, strict=True)
        for n, t in shard_tensors(s.entries, a)
    }
    assert all(torch.equal(got[n], t) for n, t in small_state().items())
    with pytest.raises(StaleVersion, match="not newer than the latest 1"):
        pub.publish(small_state(), 1)
    pub.publish({f"module.{k}": v for k, v in small_state(1).items()}, 2)  # DeepSpeed prefix
    assert set(ray.get(pub.registry.latest.remote()).specs()) == {"a", "b"}


def test_manifest_refuses_state_dicts_that_do_not_fit(registry_name: str) -> None:
    registry = get_registry(registry_name)
    ray.get(registry.set_manifest.remote(manifest_of_small()))
    pub = WeightPublisher(registry_name)
    pub.publish(small_state(), 1)
    missing = {"a": torch.randn(4, 3)}
    with pytest.raises(WeightMismatch, match="1 missing"):
        pub.publish(missing, 2)
    with pytest.raises(WeightMismatch, match="wrong shape"):
        pub.publish({"a": torch.randn(3, 4), "b": torch.randn(5)}, 2)
    info = ray.get(registry.info.remote())
    assert info["latest_version"] == 1 and info["rejected"] == 2


def test_multi_part_publication_is_invisible_until_complete(registry_name: str) -> None:
    pub = WeightPublisher(registry_name)
    pub.publish(small_state(), 1)
    state = small_state(2)
    assert pub.publish_part({"a": state["a"]}, 2, part=0, num_parts=2) is False
    assert pub.latest_version() == 1  # a publisher that dies here leaves version 1 in place
    assert ray.get(pub.registry.info.remote())["staged_versions"] == [2]
    pub.abort(2)
    assert pub.publish_part({"a": state["a"]}, 3, part=0, num_parts=2) is False
    assert pub.publish_part({"b": state["b"]}, 3, part=1, num_parts=2) is True
    assert pub.latest_version() == 3


def test_long_poll_wakes_at_once(registry_name: str) -> None:
    registry = get_registry(registry_name)
    ray.get(registry.info.remote())  # the actor is up
    waiting = registry.wait_newer.remote(0, 60.0)
    time.sleep(0.3)
    t0 = time.perf_counter()
    WeightPublisher(registry_name).publish(small_state(), 1)
    pub = ray.get(waiting)
    # Woken by the commit, not by the 60 s timeout (generous bound: shared 2-core machine).
    assert pub.version == 1 and time.perf_counter() - t0 < 5.0
    assert ray.get(registry.wait_newer.remote(1, 0.2)) is None  # nothing newer: times out


@ray.remote
def _lost_shard() -> list:
    raise OSError("the object holding this shard is gone")


def test_follower_catches_up_follows_and_survives_bad_publications(
    registry_name: str, tiny_policy_path: Path
) -> None:
    from PIL import Image

    encoder = PromptEncoder.from_pretrained(tiny_policy_path)
    messages, images = agent_messages("Click OK", [Image.new("RGB", (160, 210), (9, 9, 9))])
    base = TransformersBackend(TransformersBackendConfig(), str(tiny_policy_path), encoder, 0)
    state = base.slots._slots[0].model.state_dict()
    torch.manual_seed(0)
    v1 = {k: v + 0.05 * torch.randn_like(v) for k, v in state.items()}
    publisher = WeightPublisher(registry_name)
    publisher.publish(v1, 1)  # published before the "replica" below exists
    cfg = WeightSyncConfig(registry_name=registry_name, poll_interval_s=0.5)

    async def scenario() -> None:
        backend = TransformersBackend(
            TransformersBackendConfig(), str(tiny_policy_path), encoder, 0
        )
        prepared = backend.prepare(ChatPrompt(messages, images))
        follower = WeightFollower(cfg, backend, "late-replica")
        await follower.start()  # a replica starting late loads the latest version first
        assert backend.version == 1 and follower.loads == 1
        v1_scores = (await backend.score([prepared], [[5, 6, 7, 8]]))[0].logprobs
        # A committed version whose shard cannot be fetched: the replica keeps version 1.
        entries = ray.get(publisher.registry.latest.remote()).shards
        broken = Publication(2, [Shard(_lost_shard.remote(), s.entries) for s in entries])
        ray.get(publisher.registry.commit.remote(broken))
        await _until(lambda: follower.failures == 1)
        assert (
            backend.version == 1 and "the object holding this shard is gone" in follower.last_error
        )
        still = (await backend.score([prepared], [[5, 6, 7, 8]]))[0]
        assert still.weight_version == 1 and still.logprobs == v1_scores
        await follower.report()
        state_report = ray.get(publisher.registry.replicas.remote())["late-replica"]
        assert state_report["version"] == 1 and "version 2" in state_report["last_error"]
        # The next good version loads normally.
        torch.manual_seed(3)
        publisher.publish({k: v + 0.05 * torch.randn_like(v) for k, v in state.items()}, 3)
        await _until(lambda: backend.version == 3)
        after = (await backend.score([prepared], [[5, 6, 7, 8]]))[0]
        assert after.weight_version == 3 and after.logprobs != v1_scores
        await _until(lambda: follower.last_error is None)
        await follower.stop()

    asyncio.run(scenario())
    assert publisher.replica_versions() == {}  # stop() unregistered it


async def _until(condition, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


def test_wait_for_version_names_laggards(registry_name: str) -> None:
    registry = get_registry(registry_name)
    ray.get(registry.report.remote("r1", {"version": 3, "stale_after_s": 30.0}))
    ray.get(registry.report.remote("r2", {"version": 2, "stale_after_s": 30.0, "last_error": "x"}))
    publisher = WeightPublisher(registry_name)
    assert publisher.wait_for_version(2, timeout_s=1, min_replicas=2) == {"r1": 3, "r2": 2}
    with pytest.raises(TimeoutError, match=r"'r2': \{'version': 2"):
        publisher.wait_for_version(3, timeout_s=0.5, min_replicas=2)
    with pytest.raises(TimeoutError, match="need 3 live"):
        publisher.wait_for_version(2, timeout_s=0.5, min_replicas=3)
    ray.get(registry.report.remote("r2", {"version": 3, "stale_after_s": 30.0}))
    assert publisher.wait_for_version(3, timeout_s=1, min_replicas=2) == {"r1": 3, "r2": 3}
