"""Pass@1 aggregation and reports of ``workflows.evaluation.evaluate`` (pure Python + matplotlib).

Input: one outcome per (checkpoint, run, task instance): ``{"checkpoint", "run", "task_id",
"task_name", "kind", "success", "score", "steps", "error"}``; ``success`` is None when the
episode could not be played (environment failures after retries): such episodes are left out
of the rates and counted. Per checkpoint, each run's Pass@1 is its mean success (overall, per
task kind, per task name); the report gives the mean over runs and the spread (sample standard
deviation, min, max) of those run-level rates (METHOD.md §8: 3 runs).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

Outcome = Mapping[str, Any]


def run_stats(per_run: Mapping[int, list[bool]]) -> dict[str, Any]:
    """Mean and spread over runs of each run's success rate."""
    rates = [sum(v) / len(v) for _, v in sorted(per_run.items()) if v]
    if not rates:
        return {"mean": None, "std": None, "min": None, "max": None, "runs": [], "episodes": 0}
    return {
        "mean": statistics.fmean(rates),
        "std": statistics.stdev(rates) if len(rates) > 1 else 0.0,
        "min": min(rates),
        "max": max(rates),
        "runs": rates,
        "episodes": sum(len(v) for v in per_run.values()),
    }


def _grouped(outcomes: Sequence[Outcome], key: str | None) -> dict[str, dict[int, list[bool]]]:
    groups: dict[str, dict[int, list[bool]]] = defaultdict(lambda: defaultdict(list))
    for o in outcomes:
        if o["success"] is None:
            continue
        groups["overall" if key is None else str(o[key])][int(o["run"])].append(bool(o["success"]))
    return groups


def aggregate(outcomes: Sequence[Outcome], checkpoints: Sequence[str]) -> dict[str, Any]:
    """``{"checkpoints", "overall": {ck: stats}, "by_kind": {kind: {ck: stats}},
    "by_task": {name: {ck: stats}}, "failed_episodes": {ck: n}}``."""
    report: dict[str, Any] = {
        "checkpoints": list(checkpoints),
        "overall": {},
        "by_kind": defaultdict(dict),
        "by_task": defaultdict(dict),
        "failed_episodes": {},
    }
    for ck in checkpoints:
        mine = [o for o in outcomes if o["checkpoint"] == ck]
        report["overall"][ck] = run_stats(_grouped(mine, None)["overall"])
        for section, key in (("by_kind", "kind"), ("by_task", "task_name")):
            for name, per_run in _grouped(mine, key).items():
                report[section][name][ck] = run_stats(per_run)
        report["failed_episodes"][ck] = sum(o["success"] is None for o in mine)
    report["by_kind"] = dict(sorted(report["by_kind"].items()))
    report["by_task"] = dict(sorted(report["by_task"].items()))
    return report


def _cell(stats: Mapping[str, Any] | None) -> str:
    if not stats or stats["mean"] is None:
        return "–"
    return f"{100 * stats['mean']:.1f} ± {100 * stats['std']:.1f}"


def _table(title: str, rows: Mapping[str, Mapping[str, Any]], checkpoints: Sequence[str]) -> list:
    lines = [f"## {title}", "", "| | " + " | ".join(checkpoints) + " |"]
    lines.append("|---" * (len(checkpoints) + 1) + "|")
    for name, per_ck in rows.items():
        lines.append(
            f"| {name} | " + " | ".join(_cell(per_ck.get(ck)) for ck in checkpoints) + " |"
        )
    return [*lines, ""]


def markdown(report: Mapping[str, Any], meta: Mapping[str, Any]) -> str:
    cks = report["checkpoints"]
    lines = [
        "# Pass@1 evaluation",
        "",
        f"Split `{meta.get('split')}`, {meta.get('instances')} task instances, "
        f"{meta.get('runs')} independent runs, at most {meta.get('max_steps')} steps per "
        "episode. Cells: mean ± sample std over runs of the run's success rate, in %.",
        "",
    ]
    lines += _table("Overall", {"overall": report["overall"]}, cks)
    lines += _table("By task kind", report["by_kind"], cks)
    lines += _table("By task", report["by_task"], cks)
    lines.append("Checkpoints: " + ", ".join(f"`{n}` = `{p}`" for n, p in meta["paths"].items()))
    failed = {k: v for k, v in report["failed_episodes"].items() if v}
    if failed:
        lines.append(f"\nEpisodes not played (environment failures, excluded): {failed}")
    return "\n".join(lines) + "\n"


def bar_chart(report: Mapping[str, Any], out: str | Path, title: str = "Pass@1") -> Path:
    """Grouped bars: one group per task kind plus overall, one bar per checkpoint, error bars
    = std over runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [*report["by_kind"].keys(), "overall"]
    cks = report["checkpoints"]
    width = 0.8 / max(len(cks), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(groups) * max(1, len(cks)) * 0.6), 4))
    for i, ck in enumerate(cks):
        stats = [
            (report["overall"] if g == "overall" else report["by_kind"][g]).get(ck) for g in groups
        ]
        means = [100 * (s["mean"] or 0.0) if s else 0.0 for s in stats]
        errs = [100 * (s["std"] or 0.0) if s else 0.0 for s in stats]
        xs = [x + (i - (len(cks) - 1) / 2) * width for x in range(len(groups))]
        bars = ax.bar(xs, means, width, yerr=errs, capsize=3, label=ck)
        ax.bar_label(bars, fmt="%.0f", fontsize=7, padding=2)  # a 0% bar is still readable
    ax.set_xticks(range(len(groups)), groups, rotation=20)
    ax.set_ylabel("success rate (%)")
    ax.set_ylim(0, 112)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
