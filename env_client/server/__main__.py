"""Run the embedded environment server (MiniWoB++ by default, or real desktops).

    python -m env_client.server --port 8765 --capacity 4
    python -m env_client.server --backend desktop --capacity 2      # local X desktops
    python -m env_client.server --backend desktop \
        --desktop-json '{"kind": "remote", "remote_urls": ["http://10.0.0.5:5000"]}'
    python -m env_client.server --config-json '{"capacity": 2, "screen_width": 320, ...}'

Flags override fields of ``--config-json`` (an EmbeddedEnvConfig). With ``--ready-file`` the
server writes ``{"url": …, "pid": …}`` there once it listens and its prewarmed browsers are up
(that is how ``start_embedded_server`` learns a free port). With ``--parent-pid`` it exits when
that process is gone, so a crashed test run leaves no browsers behind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from pathlib import Path

from env_client.config import EmbeddedEnvConfig

_FLAGS = {
    "backend": str,
    "host": str,
    "port": int,
    "capacity": int,
    "prewarm": int,
    "screen_width": int,
    "screen_height": int,
    "heartbeat_timeout_s": float,
    "step_delay_s": float,
    "episode_time_limit_s": int,
    "log_level": str,
}


def parse_args(argv: list[str] | None = None) -> tuple[EmbeddedEnvConfig, argparse.Namespace]:
    p = argparse.ArgumentParser(
        prog="python -m env_client.server",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config-json", default="{}", help="EmbeddedEnvConfig as JSON.")
    for name, typ in _FLAGS.items():
        field = EmbeddedEnvConfig.model_fields[name]
        p.add_argument(f"--{name.replace('_', '-')}", type=typ, help=field.description)
    p.add_argument("--desktop-json", help="DesktopConfig as JSON (backend desktop).")
    p.add_argument("--fault-api", action="store_true", help="Serve /v1/faults (tests only).")
    p.add_argument("--ready-file", type=Path, help="Write {url, pid} here when ready.")
    p.add_argument("--parent-pid", type=int, help="Exit when this process is gone.")
    args = p.parse_args(argv)
    data = json.loads(args.config_json)
    data.update({k: v for k in _FLAGS if (v := getattr(args, k)) is not None})
    if args.fault_api:
        data["fault_api"] = True
    if args.desktop_json:
        data["desktop"] = {**data.get("desktop", {}), **json.loads(args.desktop_json)}
    return EmbeddedEnvConfig.model_validate(data), args


def _public_host(host: str) -> str:
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host


def _write_ready(path: Path, url: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"url": url, "pid": os.getpid()}))
    tmp.replace(path)  # atomic: the launcher never reads half a file


async def _watch_parent(pid: int, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            logging.getLogger(__name__).warning("parent %d is gone; stopping", pid)
            stop.set()
        except PermissionError:  # exists, owned by someone else
            pass
        await asyncio.sleep(1.0)


async def serve(cfg: EmbeddedEnvConfig, ready_file: Path | None, parent_pid: int | None) -> None:
    from aiohttp import web

    from env_client.server.app import EnvServer

    server = EnvServer(cfg)
    runner = web.AppRunner(server.build(), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, cfg.host, cfg.port)
    await site.start()
    port = runner.addresses[0][1]
    url = f"http://{_public_host(cfg.host)}:{port}"
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watcher = asyncio.ensure_future(_watch_parent(parent_pid, stop)) if parent_pid else None
    try:
        await server.mgr.prewarm()
        if ready_file:
            _write_ready(ready_file, url)
        logging.getLogger(__name__).info("env server ready at %s (capacity %d)", url, cfg.capacity)
        await stop.wait()
    finally:
        if watcher:
            watcher.cancel()
        await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    cfg, args = parse_args(argv)
    logging.basicConfig(
        level=cfg.log_level,
        format="%(asctime)s %(levelname)s env-server %(name)s: %(message)s",
        stream=sys.stderr,
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(cfg, args.ready_file, args.parent_pid))


if __name__ == "__main__":
    main()
