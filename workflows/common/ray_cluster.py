"""Start or join a Ray cluster with settings that work on a 2-core, no-GPU machine.

``ray.init`` with no address and no running cluster starts a local one; with ``auto`` (what
``ray job submit`` sets through RAY_ADDRESS) it joins the job's cluster and takes its resources
as they are.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from pydantic import BaseModel, ConfigDict, Field


class RayClusterConfig(BaseModel):
    """How the driver finds or starts Ray."""

    model_config = ConfigDict(extra="forbid")

    address: str | None = Field(
        None,
        description="Cluster to join ('auto', 'ray://…'); None: RAY_ADDRESS or a new local one.",
    )
    num_cpus: int = Field(
        4, gt=0, description="Logical CPUs of a new local cluster (oversubscribed on 2 cores)."
    )
    object_store_memory_mb: int = Field(
        768, ge=78, description="Object store of a new local cluster, MiB."
    )
    include_dashboard: bool = Field(False, description="Start the dashboard on a local cluster.")
    data_block_size_kb: int = Field(
        1,
        ge=1,
        description=(
            "Ray Data target block size of the trajectory stream, KiB. Tiny on purpose: a "
            "streaming read task holds rows until a block fills, so anything larger stalls a "
            "paused stream (sync mode). Other datasets keep Ray's default."
        ),
    )


def quiet_ray_env() -> None:
    """Environment that keeps Ray's console readable and its workers on CPU."""
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # Ray Train replaces print in its workers with a root-logger call that also writes to the
    # redirected stdout: every line a train worker prints (the SFT progress line, DeepSpeed's)
    # reached the console twice. Ray Train passes this variable on to its workers.
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")


def init_ray(cfg: RayClusterConfig | None = None, runtime_env: dict | None = None) -> None:
    """Connect to (or start) Ray; Ray Data without progress bars (they flood job logs)."""
    import ray
    from ray.data import DataContext

    cfg = cfg or RayClusterConfig()
    quiet_ray_env()
    if not ray.is_initialized():
        address = cfg.address or os.environ.get("RAY_ADDRESS")
        env: dict = {"env_vars": {k: os.environ[k] for k in _WORKER_ENV if k in os.environ}}
        env.update(runtime_env or {})
        env.setdefault("worker_process_setup_hook", WORKER_SETUP_HOOK)
        if address:
            # Under `ray job submit --runtime-env-json '{"env_vars": …}'` Ray refuses a driver
            # runtime env that names the same fields unless told to combine them.
            os.environ.setdefault("RAY_OVERRIDE_JOB_RUNTIME_ENV", "1")
            ray.init(address=address, runtime_env=env, log_to_driver=True)
        else:
            # address="local": always a new cluster, never one someone `ray start`ed here.
            ray.init(
                address="local",
                num_cpus=cfg.num_cpus,
                object_store_memory=cfg.object_store_memory_mb * 1024 * 1024,
                include_dashboard=cfg.include_dashboard,
                runtime_env=env,
            )
    DataContext.get_current().enable_progress_bars = False


WORKER_SETUP_HOOK = "workflows.common.ray_cluster.quiet_worker_logs"
# Ray Train's PlacementGroupCleaner asks the State API every second whether the training
# controller still lives, and warns each time it cannot; the State API is served by the
# dashboard, which a local cluster here runs without: a warning a second for every training run.
_NOISY_LOGGERS = {
    "ray.train.v2._internal.execution.controller.placement_group_cleaner": logging.ERROR
}
# Every train worker logs each ray.train.report at INFO with its whole metrics dict (~2 KB a
# step; the job's progress line, or an SFT run's `[train …]` line, says it in one); that logger
# is named by its file's path.
_NOISY_RAY_FILES = {"train/v2/_internal/execution/context.py": logging.WARNING}
# Deprecations raised inside our dependencies, not by our calls, once per train worker and
# Ray Data actor of every fit: DeepSpeed's ZeRO-2 gathers, Ray Train's dataset options.
NOISY_WARNINGS = (
    r"`torch\.distributed\.all_gather_into_tensor` is deprecated",
    r"`ExecutionOptions\.exclude_resources` is deprecated",
)


def noisy_loggers() -> dict[str, int]:
    """Logger name → the lowest level it may still print at, for the worker set-up hook."""
    import ray

    root = os.path.dirname(ray.__file__)
    files = {os.path.join(root, path): level for path, level in _NOISY_RAY_FILES.items()}
    return _NOISY_LOGGERS | files


def quiet_worker_logs() -> None:
    """Ray's worker set-up hook: raise the noisy loggers' levels in every worker."""
    for name, level in noisy_loggers().items():
        logging.getLogger(name).setLevel(level)
    for message in NOISY_WARNINGS:
        warnings.filterwarnings("ignore", message=message)


_WORKER_ENV = (
    "DS_ACCELERATOR",
    "TOKENIZERS_PARALLELISM",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "MINIWOB_CHROME_BINARY",
    "MINIWOB_CHROMEDRIVER",
    "CSD_CACHE",
)


def shutdown_ray() -> None:
    """Shut down Serve (if running) and Ray; safe to call twice."""
    import ray

    if not ray.is_initialized():
        return
    try:
        from ray import serve

        serve.shutdown()
    except Exception:
        pass
    ray.shutdown()


@contextmanager
def ray_session(cfg: RayClusterConfig | None = None) -> Iterator[None]:
    init_ray(cfg)
    try:
        yield
    finally:
        shutdown_ray()
