"""The main job: fully asynchronous online RL with value-gated self-distillation.

Embedded default (local Ray cluster, MiniWoB++ in headless Chromium, tiny Qwen3-VL models)::

    python -m workflows.online_rl                       # = --config embedded
    python -m workflows.online_rl trainer.max_steps=4 mode=sync

On a cluster::

    ray job submit --working-dir . -- python -m workflows.online_rl --config production_qwen3vl

Overrides are ``key.sub=value`` (values parsed as YAML). The resolved config, metrics JSONL,
checkpoints and the learning curve are written under ``<runs_dir>/<run_name>/``.
"""

from __future__ import annotations

import argparse

from workflows.common.config_io import config_from_cli


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m workflows.online_rl",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="Example: python -m workflows.online_rl --config embedded trainer.max_steps=4",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config",
        default="embedded",
        help="YAML file, or a bundled name in workflows/configs (default: embedded)",
    )
    parser.add_argument(
        "--print-config", action="store_true", help="print the resolved config and exit"
    )
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from workflows.online_rl.config import OnlineRLConfig

    cfg = config_from_cli(OnlineRLConfig, args.config, args.overrides, args.print_config)
    if isinstance(cfg, int):
        return cfg
    from workflows.online_rl.job import run  # heavy imports (ray, torch) only after parsing

    run(cfg)
    return 0
