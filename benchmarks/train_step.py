"""Training throughput: the Ray Train + DeepSpeed RL loop vs a plain single-process torch loop.

Both loops do the same work on the same real step samples (sampled from the tiny policy by
``train_loops.sample_maker``): the RL objective of METHOD.md (GRPO-clip + k3 KL against a frozen
reference + gated self-distillation), micro-batches with gradient accumulation, AdamW with the
same parameter groups and gradient clipping, fp32 on CPU, the same number of torch threads.
The Ray side is the production path: ``build_rl_trainer`` → TorchTrainer (1 worker) →
DeepSpeed ZeRO-2 → rows from a Ray Data shard, metrics all-reduced and logged every step,
``ray.train.report`` at its configured interval.

Fixed start-up costs (cluster, worker, DeepSpeed init) and the first ``--warmup`` steps are
excluded. Throughput is samples per step over the median step interval after warm-up (the
whole-window figure is printed beside it), measured the same way for both loops from step end
times. The loops alternate (plain, Ray, plain, Ray, plain for ``--rounds 2``) and the ratio is
of the medians over runs, to cancel drift from other load on the (shared) machine. As a second
view it prints CPU seconds per sample of each loop's whole process tree (for Ray: GCS, raylet,
controller, data actors and the worker), sampled with psutil, and the load average at the end:
on a busy machine the wall-clock figures mostly measure the other load.

    python benchmarks/train_step.py                 # tiny policy, ~3-4 minutes on 2 cores
    python benchmarks/train_step.py --samples-per-step 8 --micro-batch 4 --max-new-tokens 24

The Ray/DeepSpeed overhead is mostly per step and per micro-batch (DeepSpeed's gradient-bucket
hooks and flat-partition optimizer step, Ray's daemons sharing the two cores), so it shrinks as
steps grow. Measured on the 2-core dev machine at load ≈ 1: the default (16 samples/step,
micro-batch 8, ~120 tokens/sample, 2 threads) gave 0.95x, 0.80x and 0.82x in three runs; the
small step of the second command gave 0.74x with 2 threads and 0.82x with ``--threads 1``.

The last line is ``<ratio>x (target >= 0.85x)``.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

import psutil

from train_loops.config import LossConfig, OptimConfig, RLTrainConfig, cpu_trainer

LABELS = {"plain": "plain torch loop", "ray": "Ray Train + DeepSpeed ZeRO-2, 1 worker"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", default=None, help="policy checkpoint; default: tiny policy")
    p.add_argument("--groups", type=int, default=4, help="task groups of sampled step samples")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--samples-per-step", type=int, default=16)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=2, help="torch threads (= Ray worker CPUs)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2, help="Ray runs, each bracketed by plain runs")
    return p.parse_args(argv)


def config(args: argparse.Namespace) -> RLTrainConfig:
    trainer = cpu_trainer(
        num_workers=1,
        cpus_per_worker=float(args.threads),
        samples_per_step=args.samples_per_step,
        micro_batch_size=args.micro_batch,
        max_steps=args.warmup + args.steps,
        checkpoint_every=10**6,
    )
    return RLTrainConfig(trainer=trainer, optim=OptimConfig(lr=1e-5), loss=LossConfig())


def throughput(stamps: list[float], warmup: int, samples_per_step: int) -> tuple[float, float]:
    """(median-step, whole-window) samples/s after ``warmup`` steps, from step end times.

    The median step interval is the headline figure: it ignores bursts of unrelated load on a
    shared machine, which hit the two loops at different times.
    """
    timed = stamps[warmup - 1 :]
    intervals = [b - a for a, b in itertools.pairwise(timed)]
    median = statistics.median(intervals)
    return samples_per_step / median, (len(timed) - 1) * samples_per_step / (timed[-1] - timed[0])


class TreeCpu(threading.Thread):
    """Samples the CPU seconds used by this process and all its descendants (the local Ray
    cluster: GCS, raylet, controller, data actors, the train worker) every 0.2 s."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[tuple[float, float]] = []
        self._stop_event = threading.Event()
        self._seen: dict[int, float] = {}

    def _total(self) -> float:
        me = psutil.Process()
        for proc in [me, *me.children(recursive=True)]:
            try:
                t = proc.cpu_times()
                self._seen[proc.pid] = t.user + t.system + t.children_user + t.children_system
            except psutil.Error:
                pass  # exited: its last sample stays counted
        return sum(self._seen.values())

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.samples.append((time.time(), self._total()))
            time.sleep(0.2)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()

    def between(self, t0: float, t1: float) -> float:
        """CPU seconds spent between wall times t0 and t1 (linear interpolation)."""
        times = [t for t, _ in self.samples]
        cpus = [c for _, c in self.samples]
        return _interp(t1, times, cpus) - _interp(t0, times, cpus)


def _interp(t: float, times: list[float], values: list[float]) -> float:
    i = max(1, min(bisect.bisect_left(times, t), len(times) - 1))
    (ta, va), (tb, vb) = (times[i - 1], values[i - 1]), (times[i], values[i])
    return va + (vb - va) * (t - ta) / (tb - ta) if tb > ta else vb


def measured(loop, cfg: RLTrainConfig, model_path: str, rows, warmup: int) -> dict[str, float]:
    """Run ``loop`` under a CPU sampler: median-step and window samples/s, CPU-s per sample."""
    sampler = TreeCpu()
    sampler.start()
    try:
        stamps = loop(cfg, model_path, rows)
    finally:
        sampler.stop()
    sps = cfg.trainer.samples_per_step
    median, window = throughput(stamps, warmup, sps)
    timed = stamps[warmup - 1 :]
    cpu = sampler.between(timed[0], timed[-1]) / ((len(timed) - 1) * sps)
    return {"median": median, "window": window, "cpu_per_sample": cpu}


def _stream_order(cfg: RLTrainConfig, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows both loops consume, in order: ``rows`` repeated to fill every step."""
    needed = cfg.trainer.max_steps * cfg.trainer.samples_per_step
    return (rows * (needed // len(rows) + 1))[:needed]


def plain_loop(cfg: RLTrainConfig, model_path: str, rows: list[dict[str, Any]]) -> list[float]:
    """One process, no Ray, no DeepSpeed: the same objective and optimizer; step end times."""
    import torch
    from transformers import AutoModelForImageTextToText

    from train_loops.batching import ImageEncoder
    from train_loops.engine import param_groups
    from train_loops.objectives import RLObjective

    t, o = cfg.trainer, cfg.optim
    torch.manual_seed(t.seed)
    model = AutoModelForImageTextToText.from_pretrained(model_path).train()
    reference = AutoModelForImageTextToText.from_pretrained(model_path).eval()
    reference.requires_grad_(False)
    opt = torch.optim.AdamW(param_groups(model, o.weight_decay), lr=o.lr, betas=o.betas, eps=o.eps)
    objective = RLObjective.from_config(
        cfg.loss, ImageEncoder.from_pretrained(model_path), reference=reference
    )
    stream = _stream_order(cfg, rows)
    stamps = []
    for step in range(t.max_steps):
        batch = stream[step * t.samples_per_step : (step + 1) * t.samples_per_step]
        for i in range(0, len(batch), t.micro_batch_size):
            out = objective.micro_step(model, batch[i : i + t.micro_batch_size])
            (out.loss / t.grad_accum_steps).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip or float("inf"))
        opt.step()
        opt.zero_grad(set_to_none=True)
        stamps.append(time.time())
    return stamps


def ray_loop(cfg: RLTrainConfig, model_path: str, rows: list[dict[str, Any]]) -> list[float]:
    """The production trainer with one worker; step end times from its metrics JSONL."""
    import ray

    from train_loops.metrics import METRICS_FILE
    from train_loops.schema import to_table
    from train_loops.trainers import build_rl_trainer
    from workflows.ray_cluster import RayClusterConfig, init_ray, shutdown_ray

    init_ray(RayClusterConfig(num_cpus=cfg.trainer.cpus_per_worker + 2))
    try:
        with tempfile.TemporaryDirectory(prefix="bench-train-") as run_dir:
            # one pass covers every step, like the production stream (no per-epoch restarts)
            dataset = ray.data.from_arrow(to_table(_stream_order(cfg, rows)))
            trainer = build_rl_trainer(cfg, model_path, {"train": dataset}, None, run_dir)
            result = trainer.fit()
            if result.error is not None:
                raise result.error
            lines = (Path(run_dir) / METRICS_FILE).read_text().splitlines()
            return [json.loads(line)["time"] for line in lines]
    finally:
        shutdown_ray()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch

    from train_loops.sample_maker import make_step_samples

    torch.set_num_threads(args.threads)
    model_path = args.model_path
    if model_path is None:
        from workflows.tiny_models import tiny_checkpoint

        model_path = str(tiny_checkpoint("policy"))
    cfg = config(args)
    rows = make_step_samples(
        model_path, args.groups, args.group_size, max_new_tokens=args.max_new_tokens
    )
    tokens = sum(len(r["prompt_ids"]) + len(r["response_ids"]) for r in rows) / len(rows)
    print(f"{len(rows)} step samples, {tokens:.0f} tokens each on average; "
          f"{args.samples_per_step} samples/step, micro-batch {args.micro_batch}, "
          f"{args.threads} threads, {args.warmup} warm-up + {args.steps} timed steps")  # fmt: skip
    runs: dict[str, list[dict[str, float]]] = {"plain": [], "ray": []}
    order = ["plain", *["ray", "plain"] * args.rounds]  # plain brackets every Ray run
    for i, name in enumerate(order):
        loop = ray_loop if name == "ray" else plain_loop
        r = measured(loop, cfg, model_path, rows, args.warmup)
        runs[name].append(r)
        print(f"[{i + 1}/{len(order)}] {LABELS[name]}: {r['median']:.2f} samples/s (median "
              f"step; whole window {r['window']:.2f}); {1000 * r['cpu_per_sample']:.1f} "
              "CPU-ms/sample (process tree)", flush=True)  # fmt: skip
    plain = statistics.median(r["median"] for r in runs["plain"])
    ray_sps = statistics.median(r["median"] for r in runs["ray"])
    cpu = {k: statistics.median(r["cpu_per_sample"] for r in v) for k, v in runs.items()}
    print(f"median over runs: plain torch loop {plain:.2f} samples/s, "
          f"Ray Train + DeepSpeed {ray_sps:.2f} samples/s")  # fmt: skip
    print(f"CPU-normalized ratio (plain CPU-s/sample ÷ Ray's): {cpu['plain'] / cpu['ray']:.2f}x")
    load = os.getloadavg()[0]
    print(
        f"load average now {load:.1f} on {os.cpu_count()} cores"
        + (" (busy machine: wall-clock figures are unreliable)" if load > 1.5 else "")
    )
    print(f"{ray_sps / plain:.2f}x (target >= 0.85x)")


if __name__ == "__main__":
    main()
