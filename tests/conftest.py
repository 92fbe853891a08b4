"""Shared fixtures: one Ray cluster per test session, tiny checkpoints built once."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")


@pytest.fixture(scope="session")
def tiny_policy_path() -> Path:
    """A tiny Qwen3-VL checkpoint (built once, cached under $CSD_CACHE)."""
    from workflows.common.tiny_models import tiny_checkpoint

    return tiny_checkpoint("policy")


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """One local Ray cluster for the whole session; Serve and Ray shut down at the end."""
    from workflows.common.ray_cluster import RayClusterConfig, init_ray, shutdown_ray

    init_ray(RayClusterConfig(num_cpus=4, object_store_memory_mb=768))
    try:
        yield
    finally:
        shutdown_ray()
