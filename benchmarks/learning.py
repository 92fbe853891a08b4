"""Does the main job learn, and does value-gated self-distillation help? GRPO-only against
GRPO + value-gated SD, from the same warm start, on the same rollout budget.

    python benchmarks/learning.py            # 3 seeds per arm (seeds fixed below), ~60 min
    python benchmarks/learning.py --quick    # 1 seed per arm, ~20 min

Both arms run the embedded default job (``workflows/configs/embedded.yaml``: the warm start
``warm:0``, its analyzer, async rollouts) for ``--steps`` optimizer steps; they differ only in
``loss.sd_type`` (``off`` vs ``gated``): the analyzer runs in both, so environment steps and
wall time match. Before and after RL, ``workflows.evaluation`` measures Pass@1 on the held-out
eval split (instances the warm start and RL never saw). Printed: a table (mean ± std over the
seeds), the diagnostics that explain it (gate activity, masked fraction, zero-variance groups,
success during training, the warm start's guidance gap and analyzer agreement), a curves PNG
under ``--out``; the last line is exactly::

    learning: rl_gain=+<a>pp sd_gain=<+/-b>pp

rl_gain: GRPO+SD's held-out success after RL minus the warm start's; sd_gain: GRPO+SD minus
GRPO-only (means over the seeds, percentage points).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SEEDS = (0, 1, 2)  # fixed before any result was seen
ARMS = {"grpo": "off", "grpo+sd": "gated"}
CYCLE = 48  # episodes in one pass over the 12 training task names (group size 4)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="one seed per arm")
    p.add_argument(
        "--groups", type=int, default=48,
        help="rollout budget per run: episode groups (G=4 episodes each) played for training",
    )  # fmt: skip
    p.add_argument("--steps", type=int, default=1000, help="cap on RL optimizer steps per run")
    p.add_argument(
        "--arms", nargs="+", choices=sorted(ARMS), default=list(ARMS), help="arms to run"
    )
    p.add_argument("--eval-seeds", type=int, default=5, help="eval-split instances per task")
    p.add_argument("--eval-runs", type=int, default=3, help="independent eval runs (Pass@1)")
    p.add_argument("--out", default="runs/learning", help="output folder")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="extra config override for both arms' RL runs (repeatable), e.g. optim.lr=5e-4",
    )  # fmt: skip
    args = p.parse_args(argv)
    for name in ("groups", "steps", "eval_seeds", "eval_runs"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def rl_run(arm: str, seed: int, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """One RL run of the embedded default; its final checkpoint and training diagnostics."""
    from workflows.common.config_io import load_config
    from workflows.online_rl import job
    from workflows.online_rl.config import OnlineRLConfig
    from workflows.online_rl.rl_phases import resume_point

    name = f"{arm.replace('+', '-')}-s{seed}"
    cfg = load_config(OnlineRLConfig, "embedded", [
        f"runs_dir={out}", f"run_name={name}", f"seed={seed}", "resume=false",
        f"loss.sd_type='{ARMS[arm]}'", f"rollout.max_groups={args.groups}",
        f"trainer.max_steps={args.steps}", f"trainer.checkpoint_every={args.steps}",
        "progress_every_s=30", *args.set,
    ])  # fmt: skip
    t0 = time.time()
    job.run(cfg)
    point = resume_point(cfg.run_dir)
    if point.checkpoint is None:
        raise RuntimeError(f"{name}: no final checkpoint in {cfg.run_dir}")
    return {"arm": arm, "seed": seed, "run": name, "checkpoint": str(point.checkpoint),
            "wall_s": time.time() - t0, **diagnostics(cfg.run_dir)}  # fmt: skip


def diagnostics(run_dir: Path) -> dict[str, Any]:
    """What explains a run's result, from its own files."""
    import pyarrow.parquet as pq

    from train_loops.jsonl import read_jsonl

    train = [r for r in read_jsonl(run_dir / "train_metrics.jsonl") if "loss/pg" in r]
    rows = [
        r
        for folder in ("trained", "taken", "pending", "zero_grad", "purged")
        for p in sorted((run_dir / "trajectories" / folder).glob("*.parquet"))
        for r in pq.read_table(p, columns=["group_id", "episode_id", "reward"]).to_pylist()
    ]
    episodes: dict[str, tuple[str, float]] = {
        r["episode_id"]: (r["group_id"], r["reward"]) for r in rows
    }
    groups: dict[str, set[float]] = {}
    for group, reward in episodes.values():
        groups.setdefault(group, set()).add(reward)
    order = sorted(episodes)  # group ids count up with the task cursor
    wins = [episodes[e][1] > 0 for e in order]
    third = max(len(wins) // 3, 1)

    def mean(key: str) -> float | None:
        vals = [float(r[key]) for r in train if key in r]
        return statistics.fmean(vals) if vals else None

    return {
        "env_steps": len(rows),
        "episodes": len(episodes),
        "zero_variance_groups": sum(len(v) == 1 for v in groups.values()) / max(len(groups), 1),
        "train_success_first_third": sum(wins[:third]) / third if wins else None,
        "train_success_last_third": sum(wins[-third:]) / third if wins else None,
        "gate_mean": mean("sd/gate_mean"),
        "frac_masked": mean("sd/frac_masked"),
        "loss_pg_abs": statistics.fmean(abs(float(r["loss/pg"])) for r in train) if train else None,
        "curve": [(i, w) for i, w in enumerate(wins)],
    }


def evaluate(checkpoints: dict[str, str], args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Pass@1 of every checkpoint on the held-out eval split, one report."""
    from workflows.common.config_io import load_config
    from workflows.common.pipeline_config import CheckpointSpec, PipelineConfig
    from workflows.evaluation.evaluate import run

    cfg = load_config(PipelineConfig, "analyzer_pipeline", [
        f"runs_dir={out}", "run_name=eval", "policy.agent_style=elements",
        "policy.sampling.max_new_tokens=16", f"evaluate.seeds_per_task={args.eval_seeds}",
        f"evaluate.runs={args.eval_runs}", "evaluate.max_steps=6", "evaluate.history_screens=1",
        "evaluate.reference_expert=false",
    ])  # fmt: skip
    specs = [CheckpointSpec(name=n, path=p) for n, p in checkpoints.items()]
    cfg = cfg.model_copy(
        update={"evaluate": cfg.evaluate.model_copy(update={"checkpoints": specs})}
    )
    report = run(cfg)
    return {name: report["overall"][name]["mean"] for name in checkpoints}


def summarize(runs: list[dict[str, Any]], success: dict[str, float], warm: dict[str, Any]) -> str:
    def stats(values: list[float]) -> tuple[float, float]:
        return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0

    lines = ["| arm | held-out success (mean ± std) | per seed | zero-var groups | gate | masked |",
             "|---|---|---|---|---|---|",
             f"| warm start | {100 * success['warm']:.1f} | | | | |"]  # fmt: skip
    for arm in sorted({r["arm"] for r in runs}, key=list(ARMS).index):
        mine = [r for r in runs if r["arm"] == arm]
        m, s = stats([success[r["run"]] for r in mine])
        per = ", ".join(f"{100 * success[r['run']]:.1f}" for r in mine)
        zv = statistics.fmean(r["zero_variance_groups"] for r in mine)
        gate = [r["gate_mean"] for r in mine if r["gate_mean"] is not None]
        masked = [r["frac_masked"] for r in mine if r["frac_masked"] is not None]
        lines.append(
            f"| {arm} | {100 * m:.1f} ± {100 * s:.1f} | {per} | {zv:.2f} | "
            f"{statistics.fmean(gate) if gate else float('nan'):.3f} | "
            f"{statistics.fmean(masked) if masked else float('nan'):.2f} |"
        )
    gap = warm.get("guidance_gap", {})
    agree = (warm.get("analyzer") or {}).get("agreement", {})
    lines += [
        "",
        f"warm start: guidance gap median {gap.get('median', float('nan')):.2f} nats "
        f"(mean {gap.get('mean', float('nan')):.2f}, > 1 nat on {gap.get('frac_above_1nat', 0):.0%} "
        f"of held-out states); analyzer held-out d accuracy "
        f"{agree.get('accuracy', {}).get('d', float('nan')):.3f} vs majority "
        f"{agree.get('baseline_majority', {}).get('d', float('nan')):.3f}",
    ]
    for r in runs:
        lines.append(
            f"{r['run']}: training success {r['train_success_first_third']:.2f} → "
            f"{r['train_success_last_third']:.2f} (first → last third), {r['env_steps']} env "
            f"steps, {r['wall_s']:.0f}s"
        )
    return "\n".join(lines)


def curves_png(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    colors = {"grpo": "tab:blue", "grpo+sd": "tab:red"}
    for r in runs:
        wins = [w for _, w in r["curve"]]
        # Tasks come round-robin, so a window shorter than one pass over all task names
        # (12 names x 4 episodes) would show the task mix, not the policy.
        k = min(CYCLE, max(len(wins) // 2, 1))
        xs = range(k - 1, len(wins))  # full windows only
        smooth = [statistics.fmean(wins[i - k + 1 : i + 1]) for i in xs]
        ax.plot(xs, smooth, color=colors[r["arm"]], alpha=0.8, label=f"{r['arm']} seed {r['seed']}")
    ax.set_xlabel("training episode")
    ax.set_ylabel(f"success (mean of the last {CYCLE} episodes)")
    ax.set_title("Training success: GRPO-only vs GRPO + value-gated SD")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from workflows.warm_start.build import REPORT, warm_start
    from workflows.warm_start.config import load

    out = Path(args.out).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    folder = warm_start(load())
    warm = json.loads((folder / REPORT).read_text())
    seeds = SEEDS[:1] if args.quick else SEEDS
    runs = []
    for seed in seeds:
        for arm in args.arms:
            print(f"[learning] RL run {arm} seed {seed} ({time.time() - t0:.0f}s)", flush=True)
            runs.append(rl_run(arm, seed, args, out))
    checkpoints = {"warm": str(folder / "policy"), **{r["run"]: r["checkpoint"] for r in runs}}
    print(f"[learning] evaluating {len(checkpoints)} checkpoints ({time.time() - t0:.0f}s)")
    success = evaluate(checkpoints, args, out)
    table = summarize(runs, success, warm)
    curves_png(runs, out / "learning_curves.png")
    mean = {
        arm: statistics.fmean(success[r["run"]] for r in runs if r["arm"] == arm)
        for arm in args.arms
    }
    result = {"runs": [{k: v for k, v in r.items() if k != "curve"} for r in runs],
              "success": success, "elapsed_s": time.time() - t0}  # fmt: skip
    (out / "learning.json").write_text(json.dumps(result, indent=2, default=float))
    (out / "learning.md").write_text(table + "\n")
    print(table)
    print(f"[learning] {time.time() - t0:.0f}s; curves: {out / 'learning_curves.png'}")
    if set(mean) != set(ARMS):  # a probe of one arm: no comparison to report
        arm = args.arms[0]
        print(f"learning ({arm} only): rl_gain={100 * (mean[arm] - success['warm']):+.1f}pp")
        return 0
    sd, grpo = mean["grpo+sd"], mean["grpo"]
    print(
        f"learning: rl_gain={100 * (sd - success['warm']):+.1f}pp sd_gain={100 * (sd - grpo):+.1f}pp"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
