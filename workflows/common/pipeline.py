"""Plumbing shared by the offline commands (analyzer collect, annotate, train; evaluation):
the command line, model paths, task selection, the environment service, Ray and Serve apps.

Every command reads ``workflows/configs/analyzer_pipeline.yaml`` (or ``--config FILE``) plus
``key.sub=value`` overrides into :class:`~workflows.common.pipeline_config.PipelineConfig`; heavy
imports (ray, torch) happen only after the config validated.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from env_client.config import EnvClientConfig
from serve_apps.config import PolicyAppConfig
from workflows.common.config_io import config_from_cli
from workflows.common.pipeline_config import PipelineConfig
from workflows.common.tiny_models import TINY_PREFIX, is_tiny

DEFAULT_CONFIG = "analyzer_pipeline"
# Per-request access logs would drown the commands' output; they stay in Ray's log files.
QUIET_LOGS = {"log_level": "WARNING", "enable_access_log": False}


def parse_cli(
    prog: str,
    doc: str | None,
    argv: list[str] | None,
    add_args: Callable[[argparse.ArgumentParser], None] | None = None,
) -> tuple[PipelineConfig, argparse.Namespace] | int:
    """(config, args), or an exit code (2: bad config; 0: --print-config done)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=doc.split("\n\n")[0] if doc else None,
        epilog=f"Config: workflows/configs/{DEFAULT_CONFIG}.yaml; override with key.sub=value.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="YAML file or bundled name")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config")
    if add_args:
        add_args(parser)
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides")
    args = parser.parse_args(argv)
    cfg = config_from_cli(PipelineConfig, args.config, args.overrides, args.print_config)
    return cfg if isinstance(cfg, int) else (cfg, args)


def resolve_model_path(path: str, name: str = "policy") -> str:
    """A checkpoint folder, or ``tiny:<seed>`` → the cached tiny checkpoint ``name`` (built
    offline on first use; ``tiny:0`` as ``policy`` is the RL job's base policy)."""
    if not is_tiny(path):
        return str(Path(path).expanduser().resolve())
    from workflows.common.tiny_models import TinyModelSpec, tiny_checkpoint

    seed = int(path[len(TINY_PREFIX) :] or 0)
    return str(tiny_checkpoint(name, TinyModelSpec(seed=seed)))


def select_tasks(
    tasks: list[dict[str, Any]], names: list[str] | None, seeds_per_task: int | None
) -> list[dict[str, Any]]:
    """The split's task payloads for ``names`` (all if None), the first seeds of each."""
    if names is not None:
        unknown = sorted(set(names) - {t["task"] for t in tasks})
        if unknown:
            raise ValueError(f"tasks {unknown} are not in the split")
    kept: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for task in tasks:
        if names is None or task["task"] in names:
            kept[task["task"]].append(task)
    return [t for group in kept.values() for t in group[: seeds_per_task or len(group)]]


def round_robin(tasks: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """The task payloads reordered so that consecutive entries cycle through the task names
    (in a seeded order, instances shuffled per name): a run that plays only the first few
    groups still sees every task, instead of 200 instances of the first one."""
    import random

    rng = random.Random(seed)
    by_name: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for task in tasks:
        by_name[str(task["task"])].append(task)
    names = sorted(by_name)
    rng.shuffle(names)
    for name in names:
        rng.shuffle(by_name[name])
    longest = max((len(v) for v in by_name.values()), default=0)
    return [by_name[n][i] for i in range(longest) for n in names if i < len(by_name[n])]


@contextlib.contextmanager
def environment(env: EnvClientConfig, log_path: Path) -> Iterator[str]:
    """The configured environment service URL, or an embedded server for the command."""
    if env.server_url:
        yield env.server_url
        return
    from env_client.server import start_embedded_server

    with start_embedded_server(env.embedded, log_path=log_path) as server:
        print(f"[pipeline] embedded environment server at {server.url}", flush=True)
        yield server.url


def preflight_task(env: EnvClientConfig, url: str, task: dict[str, Any], source: str) -> None:
    """Reset one session with ``task`` and release it; a refusal raises a RuntimeError that
    names the service, the task and the server's reason (fail fast, not a job of failed groups)."""
    import asyncio

    from env_client.client import EnvClient
    from env_client.errors import EnvError

    async def probe() -> None:
        client = EnvClient(env.model_copy(update={"server_url": url}))
        async with client, client.session() as sess:
            await sess.reset(task)

    try:
        asyncio.run(probe())
    except EnvError as exc:
        raise RuntimeError(
            f"the environment service at {url} refused task {task.get('id')!r} of task source "
            f"{source!r}: {exc}. Does it serve this task source? (the embedded server runs "
            "MiniWoB++ tasks by default; OSWorld-format tasks need env.embedded.backend=desktop or "
            "env.server_url of an OSWorld service)"
        ) from exc


@contextlib.contextmanager
def ray_session(cfg: PipelineConfig) -> Iterator[None]:
    """Join or start Ray for the command; shut it down only if we started it."""
    import ray

    from workflows.common.ray_cluster import init_ray, shutdown_ray

    started = not ray.is_initialized()
    init_ray(cfg.ray)
    try:
        yield
    finally:
        if started:
            shutdown_ray()


def start_serve(http_port: int) -> None:
    """Start Serve with HTTP on 127.0.0.1:port; a Serve instance already running on the
    cluster is kept as it is (with its own port)."""
    from ray import serve

    serve.start(http_options={"host": "127.0.0.1", "port": http_port}, logging_config=QUIET_LOGS)


@contextlib.contextmanager
def serve_app(app: Any, name: str, route_prefix: str) -> Iterator[Any]:
    """Deploy an app for the block; its handle inside, the app deleted afterwards."""
    from ray import serve

    handle = serve.run(app, name=name, route_prefix=route_prefix, logging_config=QUIET_LOGS)
    try:
        yield handle
    finally:
        with contextlib.suppress(Exception):
            serve.delete(name)


def frozen_policy(base: PolicyAppConfig, model_path: str, name: str) -> PolicyAppConfig:
    """The policy deployment config for a frozen checkpoint under its own app name/route."""
    weights = base.weights.model_copy(update={"enabled": False})
    return base.model_copy(
        update={
            "model_path": model_path,
            "name": name,
            "route_prefix": f"/{name}",
            "weights": weights,
        }
    )


def write_json(path: Path, data: Any) -> Path:
    """Write JSON atomically (temp file + rename)."""
    return _write_atomically(path, json.dumps(data, indent=2, default=float) + "\n")


def write_jsonl(path: Path, rows: Iterable[Any]) -> Path:
    """Write one JSON object per line atomically (temp file + rename)."""
    return _write_atomically(path, "".join(json.dumps(r, default=str) + "\n" for r in rows))


def _write_atomically(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path
