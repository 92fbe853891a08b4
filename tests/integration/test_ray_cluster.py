"""The worker set-up hook runs in Ray's workers, not just in this process."""

from __future__ import annotations

import logging

import pytest

from workflows.common.ray_cluster import noisy_loggers

pytestmark = pytest.mark.usefixtures("ray_cluster")


def test_ray_workers_start_with_the_noisy_loggers_quieted() -> None:
    import ray

    @ray.remote(num_cpus=0.1)
    def levels() -> dict[str, int]:
        return {n: logging.getLogger(n).getEffectiveLevel() for n in noisy_loggers()}

    assert ray.get(levels.remote(), timeout=120) == noisy_loggers()
