"""Held-out agreement of the warm start's analyzer under other build settings, each trained on
a cached warm start's own policy and data (same transitions, annotations, split and seed).

    python benchmarks/analyzer_settings.py        # the default build: default vs the old one
    python benchmarks/analyzer_settings.py --warm ~/.cache/computersd/warm-0-<digest> \\
        --warm ~/.cache/computersd/warm-0-<other> --arm "" --arm analyzer.epochs=6 \\
        --arm "analyzer.seeds_per_task=24 analyzer.epochs=2" --arm analyzer.verdict_weight=10

An arm is a space-separated set of ``analyzer.*`` overrides of the warm-start config
(``workflows/configs/warm_start.yaml``); ``""`` is the config as it is. For each build and arm
the build's policy and its ``analyzer-pipeline/`` data are copied into ``--out/<build>/<arm>/``,
the analyzer is trained with the warm start's own pipeline settings plus the arm's, and the
held-out transitions are judged through the analyzer deployment (Ray Serve), as a build does.

An arm whose collection settings differ from the build's (more task instances, or other episode
counts per instance) first collects the missing episodes with the build's policy in the
embedded environment and annotates them; the build's own episodes are kept (an arm that asks
for fewer than the build has is refused). That data is
stored once per build and collection settings (``--out/<build>/data-seeds<N>-…/``, marked
complete only at the end) and shared by the arms that ask for it. More data also means a larger
held-out set, so each row gives its size and its own majority answer.

About 10-11 minutes an arm at the default size on 2 cores (12 epochs of minimal prompts; the
compact prompt's 6 epochs about 8); 3x the instances adds ~3 minutes of collection once. Prints one table row per arm as it ends; the last line is
``analyzer_settings: <build>[<arm>] d=<d>% (majority <m>%) ...``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

DATA = ("transitions", "annotations.jsonl", "collect_summary.json", "annotate_summary.json")
DEFAULT_ARMS = ["", "analyzer.prompt_style=compact analyzer.epochs=6"]  # new vs old default


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--warm", action="append", help="cached warm-start folder; repeat for more "
                   "builds (default: the bundled config's)")  # fmt: skip
    p.add_argument("--arm", action="append", help='space-separated analyzer.* overrides; ""'
                   f" is the config as it is; repeat for more (default: {DEFAULT_ARMS})")  # fmt: skip
    p.add_argument("--out", default="runs/analyzer_settings", help="output folder")
    p.add_argument("--serve-port", type=int, default=8000, help="Ray Serve HTTP port")
    args = p.parse_args(argv)
    args.arm = [arm_overrides(a, p.error) for a in (args.arm or DEFAULT_ARMS)]
    return args


def arm_overrides(text: str, error: Any) -> list[str]:
    """``"analyzer.epochs=12 analyzer.lr=2e-3"`` → its overrides, checked against the config."""
    from workflows.warm_start.config import load

    overrides = text.split()
    for item in overrides:
        key = item.split("=", 1)[0]
        if "=" not in item or not key.startswith("analyzer."):
            error(f"--arm {text!r}: {item!r} is not analyzer.<field>=<value> (the policy and "
                  "its data come from the build, so only the analyzer's settings can vary)")  # fmt: skip
    try:
        load(overrides=overrides)
    except Exception as exc:  # a pydantic or override error, reported with the arm's text
        error(f"--arm {text!r}: {exc}")
    return overrides


def arm_name(overrides: list[str]) -> str:
    short = [o.removeprefix("analyzer.") for o in overrides]
    return re.sub(r"[^A-Za-z0-9_.=-]", "_", "_".join(short)) or "default"


COLLECTION = ("seeds_per_task", "policy_episodes", "expert_episodes", "wrong_episodes")
"""The analyzer settings that decide which episodes are collected."""


def collection(analyzer: Any) -> dict[str, int]:
    """The collection settings of an analyzer config (a model or its stored dict)."""
    values = analyzer if isinstance(analyzer, dict) else analyzer.model_dump()
    return {k: int(values[k]) for k in COLLECTION}


def built_collection(warm: Path) -> dict[str, int]:
    """What the build's analyzer data was collected with (its warm_start.json)."""
    info = json.loads((warm / "warm_start.json").read_text())
    return collection(info["config"]["analyzer"])


def prepare(source: Path, work: Path) -> None:
    """A build's policy and analyzer pipeline data (``source``) in a fresh work folder."""
    data = source / "analyzer-pipeline"
    missing = [f for f in DATA if not (data / f).exists()]
    if missing or not (source / "policy").is_dir():
        raise FileNotFoundError(
            f"{source} lacks {missing or ['policy/']}: not a complete warm start build"
        )
    shutil.rmtree(work, ignore_errors=True)
    (work / "analyzer-pipeline").mkdir(parents=True)
    shutil.copytree(source / "policy", work / "policy")
    for name in DATA:
        path = data / name
        target = work / "analyzer-pipeline" / name
        shutil.copytree(path, target) if path.is_dir() else shutil.copy(path, target)


def pipeline_config(overrides: list[str], work: Path, port: int, env: Any = None) -> Any:
    from workflows.warm_start.config import load
    from workflows.warm_start.pipeline import analyzer_pipeline_config

    cfg = load(overrides=overrides)
    pc = analyzer_pipeline_config(cfg, env or cfg.env, work)
    return pc.model_copy(update={"serve_http_port": port})


def fewer_than_built(warm: Path, overrides: list[str]) -> list[str]:
    """The arm's collection settings below the build's: stored episodes cannot be left out (the
    pipeline trains on every annotation in its folder), so such an arm cannot be measured."""
    from workflows.warm_start.config import load

    wanted, built = collection(load(overrides=overrides).analyzer), built_collection(warm)
    return [f"analyzer.{k}={wanted[k]} < {built[k]}" for k in COLLECTION if wanted[k] < built[k]]


def data_source(warm: Path, overrides: list[str], out: Path, port: int) -> Path:
    """The build itself, or a copy of it with the episodes the arm's collection settings add
    (the build's own are kept), stored under ``out`` and reused by later arms and runs."""
    from workflows.analyzer import annotate, collect
    from workflows.common.pipeline import environment
    from workflows.warm_start.config import load

    cfg = load(overrides=overrides)
    wanted = collection(cfg.analyzer)
    if wanted == built_collection(warm):
        return warm
    folder = out / ("data-" + "-".join(f"{k.split('_')[0]}{v}" for k, v in wanted.items()))
    done = folder / "collected"
    if done.exists():
        return folder
    print(f"[analyzer_settings] collecting {wanted} into {folder}", flush=True)
    prepare(warm, folder)
    with environment(cfg.env, folder / "env_server.log") as url:
        env = cfg.env.model_copy(update={"server_url": url})
        pc = pipeline_config(overrides, folder, port, env)
        collect.run(pc)
        annotate.run(pc)
    done.write_text("")
    return folder


def train_one(warm: Path, overrides: list[str], out: Path, port: int) -> dict[str, Any]:
    from workflows.analyzer import train as train_analyzer

    build = out / warm.name
    source = data_source(warm, overrides, build, port)
    work = build / arm_name(overrides)
    prepare(source, work)
    t0 = time.time()
    report = train_analyzer.run(pipeline_config(overrides, work, port))
    return {
        "build": warm.name, "arm": " ".join(overrides) or "(default)",
        "seconds": time.time() - t0, "sft_steps": report["sft_steps"], **report["agreement"],
    }  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| build | arm | held out | majority | d | expert | policy | wrong | parsed | SFT |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        by = r["by_source"]
        src = [f"{100 * by[s]['d']:.1f}% ({by[s]['n']})" if s in by else "–"
               for s in ("expert", "policy", "wrong")]  # fmt: skip
        lines.append(
            f"| {r['build']} | {r['arm']} | {r['n']} | {100 * r['baseline_majority']['d']:.1f}% | "
            f"**{100 * r['accuracy']['d']:.1f}%** | " + " | ".join(src) + f" | "
            f"{100 * r['parsed']:.1f}% | {r['sft_steps']} steps, {r['seconds'] / 60:.1f} min |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from workflows.warm_start.config import load

    builds = [Path(w).expanduser() for w in args.warm] if args.warm else [load().folder]
    for warm in builds:
        if not (warm / "warm_start.json").is_file():
            print(f"analyzer_settings.py: error: {warm} is not a finished warm start build (no "
                  "warm_start.json); build one with python -m workflows.warm_start", file=sys.stderr)  # fmt: skip
            return 2
        for overrides in args.arm:
            if fewer := fewer_than_built(warm, overrides):
                print(f"analyzer_settings.py: error: {warm.name} collected more than the arm "
                      f"{' '.join(overrides)!r} asks for: {', '.join(fewer)}", file=sys.stderr)  # fmt: skip
                return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for warm in builds:
        for overrides in args.arm:
            print(f"[analyzer_settings] {warm.name}: {' '.join(overrides) or '(default)'}",
                  flush=True)  # fmt: skip
            rows.append(train_one(warm, overrides, out, args.serve_port))
            print(table(rows), flush=True)
            (out / "rows.json").write_text(json.dumps(rows, indent=1, default=float))
    parts = [f"{r['build']}[{r['arm']}] d={100 * r['accuracy']['d']:.1f}% "
             f"(majority {100 * r['baseline_majority']['d']:.1f}%)" for r in rows]  # fmt: skip
    print(f"analyzer_settings: {' '.join(parts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
