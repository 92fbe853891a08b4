"""Held-out agreement of the warm start's analyzer SFT under several ``train.verdict_weight``
values, on one cached warm start's own data (same transitions, annotations, split and seed).

    python benchmarks/analyzer_verdict_weight.py                       # the default warm start
    python benchmarks/analyzer_verdict_weight.py --warm ~/.cache/computersd/warm-0-<digest> \\
        --weights 1 10 30

For each weight it copies the warm start's policy and its ``analyzer-pipeline/`` transitions
and annotations into ``--out/w<weight>/`` (collect and annotate are not rerun), trains the
analyzer with the warm start's own pipeline settings and that weight, and judges the held-out
transitions through the analyzer deployment (Ray Serve), as the build does. About 8-9 minutes a
weight on 2 cores. Prints d / consistency / effectiveness agreement overall and by source
(expert, policy, wrong-element steps) per weight; the last line compares each weight's d with
weight 1 (the plain token mean) and the majority answer.
"""

from __future__ import annotations

import argparse
import os
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--warm", help="cached warm-start folder (default: the bundled config's)")
    p.add_argument("--weights", type=float, nargs="+", default=[1.0, 10.0, 30.0])
    p.add_argument("--out", default="runs/verdict_weight", help="output folder")
    args = p.parse_args(argv)
    bad = [w for w in args.weights if not 1.0 <= w <= 1000.0]
    if bad:
        p.error(f"--weights must lie in [1, 1000], got {bad}")
    return args


def prepare(warm: Path, work: Path) -> None:
    """The warm start's policy and pipeline data in a fresh work folder."""
    source = warm / "analyzer-pipeline"
    missing = [f for f in DATA if not (source / f).exists()]
    if missing or not (warm / "policy").is_dir():
        raise FileNotFoundError(
            f"{warm} lacks {missing or ['policy/']}: not a complete warm start build"
        )
    shutil.rmtree(work, ignore_errors=True)
    (work / "analyzer-pipeline").mkdir(parents=True)
    shutil.copytree(warm / "policy", work / "policy")
    for name in DATA:
        path = source / name
        target = work / "analyzer-pipeline" / name
        shutil.copytree(path, target) if path.is_dir() else shutil.copy(path, target)


def train_one(weight: float, warm: Path, out: Path) -> dict[str, Any]:
    from workflows.analyzer import train as train_analyzer
    from workflows.warm_start.config import load
    from workflows.warm_start.pipeline import analyzer_pipeline_config

    cfg = load(overrides=[f"analyzer.verdict_weight={weight}"])
    work = out / f"w{weight:g}"
    prepare(warm, work)
    t0 = time.time()
    report = train_analyzer.run(analyzer_pipeline_config(cfg, cfg.env, work))
    return {"weight": weight, "seconds": time.time() - t0, **report["agreement"]}


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| verdict_weight | d | consistency | effectiveness | expert | policy | wrong |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        acc, by = r["accuracy"], r["by_source"]
        src = [f"{100 * by[s]['d']:.1f}% ({by[s]['n']})" if s in by else "–"
               for s in ("expert", "policy", "wrong")]  # fmt: skip
        lines.append(
            f"| {r['weight']:g} | {100 * acc['d']:.1f}% | {100 * acc['consistency']:.1f}% | "
            f"{100 * acc['effectiveness']:.1f}% | " + " | ".join(src) + " |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from workflows.warm_start.config import load

    warm = Path(args.warm).expanduser() if args.warm else load().folder
    out = Path(args.out)
    rows = []
    for weight in args.weights:
        print(f"[verdict_weight] training the analyzer at weight {weight:g}", flush=True)
        rows.append(train_one(weight, warm, out))
        print(table(rows), flush=True)
    majority = rows[0]["baseline_majority"]["d"]
    base = next((r for r in rows if r["weight"] == 1.0), None)
    parts = [f"w={r['weight']:g} d={100 * r['accuracy']['d']:.1f}%" for r in rows]
    vs = f" vs w=1 {100 * base['accuracy']['d']:.1f}%" if base else ""
    print(f"analyzer_verdict_weight: {' '.join(parts)}{vs} (majority {100 * majority:.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
