"""Asynchronous vs synchronous online RL on the same workload, measured in one run.

Both modes train the same number of samples (``trainer.max_steps`` × ``samples_per_step``) on
the embedded environment with a realistic per-step latency (``--step-delay``, desktops take
1–2 s per action). Reported for each mode: wall clock from the first env step to the last
optimizer step (rollouts + training; fixed start-up costs excluded), the trainer's idle fraction
over that span (1 − Σ step_time / span), and the async/sync speedup. The last line states the speedup against the target.

    python benchmarks/async_vs_sync.py                 # defaults: 1.5 s delay, 6 steps each
    python benchmarks/async_vs_sync.py --steps 4 --step-delay 1.0
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

# Run as a script, Python puts benchmarks/ first on sys.path, where benchmarks/env_client.py
# would shadow the env_client package: drop that entry and put the repo root instead.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [str(_HERE.parent)] + [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from workflows.config import OnlineRLConfig  # noqa: E402
from workflows.config_io import load_config  # noqa: E402
from workflows.metrics import read_jsonl  # noqa: E402


def measure(run_dir: Path) -> dict[str, float]:
    """Wall clock from the first executed env step to the last optimizer step (rollouts and
    training both inside it), and the trainer's idle fraction over that span."""
    from train_loops.schema import read_parquet

    rows = read_parquet(sorted((run_dir / "trajectories").glob("*/*.parquet")))
    steps = [r for r in read_jsonl(run_dir / "train_metrics.jsonl") if "step_time" in r]
    start = min(r["created_at"] - r["t_env_s"] - r["t_generate_s"] for r in rows)
    end = max(r["time"] for r in steps)
    busy = sum(r["step_time"] for r in steps)
    phase = end - start
    return {"phase_s": phase, "idle_frac": max(0.0, 1.0 - busy / phase), "steps": len(steps)}


def run_mode(mode: str, args: argparse.Namespace, root: Path) -> dict[str, float]:
    from workflows import rl_job

    overrides = [
        f"runs_dir={root}",
        f"run_name={mode}",
        f"mode={mode}",
        f"trainer.max_steps={args.steps}",
        f"trainer.checkpoint_every={args.steps}",
        f"env.embedded.step_delay_s={args.step_delay}",
        f"rollout.max_steps={args.episode_steps}",
        "resume=false",
        "progress_every_s=15",
    ]
    cfg = load_config(OnlineRLConfig, args.config, overrides)
    t0 = time.time()
    rl_job.run(cfg)
    out = measure(cfg.run_dir)
    out["total_s"] = time.time() - t0
    print(f"[bench] {mode}: {json.dumps({k: round(v, 3) for k, v in out.items()})}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="embedded")
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps per mode")
    parser.add_argument("--step-delay", type=float, default=1.5, help="env latency per step, s")
    parser.add_argument("--episode-steps", type=int, default=3, help="step limit per episode")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-async-sync-"))
    sync = run_mode("sync", args, root)
    asyn = run_mode("async", args, root)
    speedup = sync["phase_s"] / asyn["phase_s"]
    print(f"sync : training phase {sync['phase_s']:.1f}s, trainer idle {sync['idle_frac']:.0%}")
    print(
        f"async: training phase {asyn['phase_s']:.1f}s, trainer idle {asyn['idle_frac']:.0%} (target < 25%)"
    )
    print(f"async/sync speedup: {speedup:.2f}x (target >= 2x)")


if __name__ == "__main__":
    main()
