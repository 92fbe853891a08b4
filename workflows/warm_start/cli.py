"""Build the warm start of the embedded default: a behaviour-cloned tiny policy that succeeds
sometimes and uses guidance, and the GUI analyzer trained from it. Cached: a second call
prints the folder at once.

    python -m workflows.warm_start                      # = --config warm_start
    python -m workflows.warm_start seed=1 bc.steps=200  # another warm start (own cache folder)
    python -m workflows.warm_start --rebuild            # build again even if cached

The online job builds it on first use when a model_path is ``warm:<seed>`` (embedded.yaml).
"""

from __future__ import annotations

import argparse
import json

from workflows.common.config_io import config_from_cli
from workflows.warm_start.config import DEFAULT_CONFIG, WarmStartConfig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m workflows.warm_start",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog=f"Config: workflows/configs/{DEFAULT_CONFIG}.yaml; override with key.sub=value.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="YAML file or bundled name")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config")
    parser.add_argument("--rebuild", action="store_true", help="build even if cached")
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides")
    args = parser.parse_args(argv)
    cfg = config_from_cli(WarmStartConfig, args.config, args.overrides, args.print_config)
    if isinstance(cfg, int):
        return cfg
    from workflows.warm_start.build import REPORT, warm_start

    folder = warm_start(cfg, rebuild=args.rebuild)
    report = json.loads((folder / REPORT).read_text())
    print(json.dumps({k: v for k, v in report.items() if k != "gaps"}, indent=2, default=float))
    print(f"warm start: {folder}")
    return 0
