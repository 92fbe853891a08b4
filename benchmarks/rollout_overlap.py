"""Rollout throughput with the step's judgment and rescoring on / off the critical path.

The next action of an episode never depends on the analyzer's judgment of the last one or on
its privileged rescoring, so ``rollout.overlap_judging=true`` runs them alongside the next
steps and gathers them when the episode ends; ``false`` is the old sequential loop, where each
step waits for both. This measures environment steps/s of the real rollout workers in both
modes in one run: one embedded environment server and one pair of Serve apps (the embedded
default's warm-start policy and analyzer, or any ``--set`` overrides), then, for each round,
fresh RolloutWorkers and a fresh buffer that stops after ``--groups`` groups (no trainer: its
CPU use would blur the comparison on a small machine). After an unmeasured warm-up round,
rounds alternate sequential / overlapped, so slow drift of a shared machine hits both alike;
the ratio is of the sums.

    python benchmarks/rollout_overlap.py                   # ~4 minutes on 2 cores
    python benchmarks/rollout_overlap.py --rounds 1 --groups 2 --pause 0 \\
        --set policy.model_path=tiny:0 policy.agent_style=toolcall analyzer.model_path=tiny:1

``--pause`` is ``rollout.pause_s`` (0.5 s after each action in production; 0 in the embedded
default): the longer an action's environment time, the more of the judging it hides.
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

from workflows.common.config_io import load_config  # noqa: E402
from workflows.online_rl.config import OnlineRLConfig  # noqa: E402

STAGES = ("generate", "env", "analyze", "score")


def play_round(cfg: OnlineRLConfig, env_url: str, tasks: list, groups: int) -> dict[str, float]:
    """Fresh workers and buffer play ``groups`` groups; steps, seconds and stage latencies."""
    import ray

    from workflows.online_rl.buffer import TrajectoryBuffer
    from workflows.online_rl.rollout import RolloutWorker

    buffer = (
        ray.remote(TrajectoryBuffer)
        .options(num_cpus=0, max_concurrency=1000)
        .remote(cfg.buffer, cfg.trainer.samples_per_step, "async", max_groups=groups)
    )
    worker_cls = ray.remote(RolloutWorker).options(
        num_cpus=cfg.rollout.worker_num_cpus, max_concurrency=64
    )
    workers = [
        worker_cls.remote(cfg, i, tasks, env_url, buffer, cfg.policy.name, cfg.analyzer.name)
        for i in range(cfg.rollout.num_workers)
    ]
    t0 = time.perf_counter()
    counters = ray.get([w.run.remote() for w in workers])
    seconds = time.perf_counter() - t0
    total = {k: sum(c[k] for c in counters) for k in counters[0]}
    for actor in (*workers, buffer):
        ray.kill(actor)
    steps = total["env_steps"]
    return {
        "env_steps": steps,
        "seconds": seconds,
        **{f"{s}_s_per_step": total[f"t_{s}"] / max(steps, 1) for s in STAGES},
        "analyzer_errors": total["analyzer_errors"],
        "score_errors": total["score_errors"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=4, help="groups per round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per mode (alternating)")
    parser.add_argument("--warmup-groups", type=int, default=2, help="unmeasured, first")
    parser.add_argument("--pause", type=float, default=0.5, help="rollout.pause_s")
    parser.add_argument("--set", nargs="*", default=[], help="extra config overrides")
    args = parser.parse_args()

    from env_client.tasks.sources import make_task_source
    from workflows.common.pipeline import round_robin, select_tasks
    from workflows.common.ray_cluster import ray_session

    # The job's own model resolution and Serve start-up (private helpers: same code path).
    from workflows.online_rl import job

    run_dir = Path(tempfile.mkdtemp(prefix="rollout-overlap-"))
    base = load_config(
        OnlineRLConfig,
        "embedded",
        [f"runs_dir={run_dir}", "run_name=bench", f"rollout.pause_s={args.pause}",
         "buffer.capacity_samples=100000", *args.set],
    )  # fmt: skip
    base.run_dir.mkdir(parents=True)
    with ray_session(base.ray), job.environment_service(base) as env_url:
        cfg = job._resolved_models(base, None, 0)
        job._start_serving(cfg)
        source = make_task_source(cfg.task_source)
        split = select_tasks(source.tasks(cfg.rollout.train_split), cfg.rollout.tasks, None)
        tasks = round_robin(split, cfg.seed)
        # Not measured: first sessions, first model calls and lazy imports cost extra.
        play_round(cfg, env_url, tasks, args.warmup_groups)
        results: dict[str, list[dict[str, float]]] = {"sequential": [], "overlapped": []}
        for r in range(args.rounds):
            for mode, overlap in (("sequential", False), ("overlapped", True)):
                rollout = cfg.rollout.model_copy(update={"overlap_judging": overlap})
                mode_cfg = cfg.model_copy(update={"rollout": rollout})
                res = play_round(mode_cfg, env_url, tasks, args.groups)
                results[mode].append(res)
                rate = res["env_steps"] / res["seconds"]
                print(f"round {r} {mode}: {rate:.3f} env steps/s {json.dumps(res)}", flush=True)
    rate = {m: sum(x["env_steps"] for x in v) / sum(x["seconds"] for x in v)
            for m, v in results.items()}  # fmt: skip
    print(f"sequential {rate['sequential']:.3f} env steps/s, overlapped "
          f"{rate['overlapped']:.3f} env steps/s, ratio {rate['overlapped'] / rate['sequential']:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
