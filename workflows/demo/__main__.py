"""``python -m workflows.demo [--config FILE] [key.sub=value ...]``: the demo and trajectory
viewer on Ray Serve, then open the printed URL in a browser; Ctrl-C stops it (every episode's
environment session is released).

With no arguments it serves the embedded default (``workflows/configs/embedded.yaml``: the warm
start ``warm:0`` policy and analyzer in the elements style, the embedded MiniWoB++ server).
Random tiny models instead (no download, no warm start):
``python -m workflows.demo policy.model_path=tiny:0 policy.agent_style=toolcall
analyzer.model_path=tiny:1``. Attach to a running job's apps (``keep_serving=true``):
``demo.attach=true``.
"""

from __future__ import annotations

import argparse
import sys
import threading

import yaml

from workflows.common.config_io import ConfigError
from workflows.common.signals import sigterm_as_interrupt
from workflows.demo.config import DEFAULT_CONFIG, DemoConfig, load_demo_config


def parse(argv: list[str] | None) -> DemoConfig | int:
    """The config, or an exit code (2: bad config; 0: --print-config done)."""
    parser = argparse.ArgumentParser(
        prog="python -m workflows.demo",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="job config file or bundled name")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config")
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides")
    args = parser.parse_args(argv)
    try:
        cfg = load_demo_config(args.config, args.overrides)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.print_config:
        print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
        return 0
    return cfg


def run(cfg: DemoConfig, until: threading.Event | None = None) -> None:
    """Serve the demo until ``until`` is set (or Ctrl-C); the app is deleted afterwards."""
    import ray

    from workflows.common.pipeline import QUIET_LOGS, start_serve
    from workflows.common.ray_cluster import init_ray, shutdown_ray
    from workflows.demo.app import delete_demo, deploy_demo

    started = not ray.is_initialized()
    init_ray(cfg.ray)
    try:
        start_serve(cfg.demo.http_port)
        print("[demo] starting (models load, the environment's browsers start) ...", flush=True)
        cfg = deploy_demo(cfg, QUIET_LOGS)
        url = f"http://127.0.0.1:{cfg.demo.http_port}{cfg.demo.route_prefix}/"
        print(f"[demo] open {url}  (trajectories of {cfg.runs_path}; Ctrl-C stops)", flush=True)
        with sigterm_as_interrupt():
            stop = until or threading.Event()
            while not stop.wait(1.0):  # short waits: signals are handled at once
                pass
    except KeyboardInterrupt:
        print("[demo] stopping", flush=True)
    finally:
        try:
            delete_demo(cfg)  # the demo's replica releases every session on shutdown
        finally:
            if started:
                shutdown_ray()


def main(argv: list[str] | None = None) -> int:
    cfg = parse(argv)
    if isinstance(cfg, int):
        return cfg
    run(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
