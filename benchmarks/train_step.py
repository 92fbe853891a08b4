"""Training throughput: the Ray Train + DeepSpeed RL loop vs a plain single-process torch loop.

Both loops do the same work on the same real step samples (sampled from the tiny policy by
``train_loops.sample_maker``): the RL objective of METHOD.md (GRPO-clip + k3 KL against a frozen
reference + gated self-distillation), micro-batches with gradient accumulation, AdamW with the
same parameter groups and gradient clipping, fp32 on CPU, the same number of torch threads.
The Ray side is the production path: ``build_rl_trainer`` → TorchTrainer (1 worker) →
DeepSpeed ZeRO-2 → rows from a Ray Data shard, metrics all-reduced, ``ray.train.report`` every
step. Fixed start-up costs (cluster, worker, DeepSpeed init) and the first ``--warmup`` steps
are excluded. Throughput is samples per step over the median step interval after warm-up
(the whole-window figure is printed beside it), measured the same way for both loops from
step end times; the plain loop runs before and after the Ray run and the two are averaged,
to cancel drift from other load on the (shared) machine.

    python benchmarks/train_step.py                 # tiny policy, ~2-3 minutes on 2 cores
    python benchmarks/train_step.py --steps 40 --threads 2

The last line is ``<ratio>x (target >= 0.85x)``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

from train_loops.config import LossConfig, OptimConfig, RLTrainConfig, cpu_trainer

LABELS = {
    "plain-before": "plain torch loop (before)",
    "ray": "Ray Train + DeepSpeed ZeRO-2, 1 worker",
    "plain-after": "plain torch loop (after)",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", default=None, help="policy checkpoint; default: tiny policy")
    p.add_argument("--groups", type=int, default=4, help="task groups of sampled step samples")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--samples-per-step", type=int, default=8)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--threads", type=int, default=2, help="torch threads (= Ray worker CPUs)")
    p.add_argument("--max-new-tokens", type=int, default=24)
    return p.parse_args(argv)


def config(args: argparse.Namespace) -> RLTrainConfig:
    trainer = cpu_trainer(
        num_workers=1,
        cpus_per_worker=float(args.threads),
        samples_per_step=args.samples_per_step,
        micro_batch_size=args.micro_batch,
        max_steps=args.warmup + args.steps,
        checkpoint_every=10**6,
        cycle_data=True,
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
    stamps = []
    for step in range(t.max_steps):
        start = (step * t.samples_per_step) % len(rows)
        batch = (rows + rows)[start : start + t.samples_per_step]
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
            dataset = ray.data.from_arrow(to_table(rows))
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
    sps = cfg.trainer.samples_per_step
    runs = {}
    for name, loop in (
        ("plain-before", plain_loop),
        ("ray", ray_loop),
        ("plain-after", plain_loop),
    ):
        median, window = throughput(loop(cfg, model_path, rows), args.warmup, sps)
        runs[name] = median
        print(f"{LABELS[name]}: {median:.2f} samples/s (median step; whole window {window:.2f})",
              flush=True)  # fmt: skip
    plain = (runs["plain-before"] + runs["plain-after"]) / 2
    print(f"plain torch loop, mean of before/after: {plain:.2f} samples/s")
    print(f"{runs['ray'] / plain:.2f}x (target >= 0.85x)")


if __name__ == "__main__":
    main()
