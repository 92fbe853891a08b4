"""The job's memory figure covers the Ray session's processes, not only the driver's children
(under ``ray job submit`` the workers hang off the raylet, not the driver)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def test_session_processes_are_found_and_counted(ray_cluster) -> None:
    import ray

    from workflows.online_rl.metrics import _session_roots, tree_memory_gb

    @ray.remote(num_cpus=0)
    class Holder:
        def __init__(self) -> None:
            self.block = bytearray(200 * 2**20)  # 200 MiB, touched

        def pid(self) -> int:
            import os

            return os.getpid()

    holder = Holder.remote()
    pid = ray.get(holder.pid.remote())
    roots = _session_roots()
    assert {p.name() for p in roots} == {"raylet", "gcs_server"}
    assert any(pid in {c.pid for c in r.children(recursive=True)} for r in roots)
    assert tree_memory_gb() > 0.2
    ray.kill(holder)
