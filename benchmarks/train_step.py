"""Training throughput: the Ray Train + DeepSpeed RL loop vs a plain single-process torch loop.

Both loops do the same work on the same real step samples (sampled from the tiny policy by
``train_loops.sample_maker``): the RL objective of METHOD.md (GRPO-clip + k3 KL against a frozen
reference + gated self-distillation), micro-batches with gradient accumulation, AdamW with the
same parameter groups and gradient clipping, fp32 on CPU, the same number of torch threads.
The Ray side is the production path: ``build_rl_trainer`` → TorchTrainer (1 worker) →
DeepSpeed ZeRO-2 → rows from a Ray Data shard, metrics all-reduced and logged every step,
``ray.train.report`` at its configured interval.

The two loops take turns on the machine. Both start once (start-up and ``--warmup`` steps are
not timed); then the plain loop (a child process) runs ``--window`` steps, the Ray loop runs
``--window`` steps, the plain loop again, and so on, ``--turns`` Ray turns bracketed by plain
ones. Whichever loop is not on turn waits at a step boundary: the plain child blocks on its
pipe, the Ray worker inside its ``stop_fn`` hook (rank 0, after each step), which asks a small
Ray actor for the next turn. This machine's speed drifts by tens of percent over minutes
(other tenants: the same plain loop ran at 59 and 80 samples/s in two runs a minute apart), so
loops timed in separate runs mostly measured the drift; turns of a few seconds see the same
machine. Throughput of a turn is samples per step over its median step interval (the first
step of a turn, which includes the hand-over, is not counted); each Ray turn is compared with
the mean of the plain turns before and after it, and the result is the median of those
ratios.

As a second view it prints CPU seconds per sample of each kind of turn for the whole process
tree (the plain child, and the local Ray cluster: GCS, raylet, controller, data actors, the
worker), sampled with psutil.

    python benchmarks/train_step.py                 # tiny policy, ~2 minutes on 2 cores
    python benchmarks/train_step.py --no-isolate    # 2 threads, every core shared

By default (``--isolate``) both loops compute on core 0 with one thread, and Ray's processes
(and this driver) run on the other cores: the layout of a GPU trainer, whose accelerator does
the math while Ray's control plane uses host CPUs. Measured on the 2-core dev machine: 0.89x,
0.90x, 0.92x, 0.93x and 0.90x in five runs (per-turn ratios 0.75-1.00). With ``--no-isolate``
(2 threads, shared cores) it was 0.74x: a local cluster runs ~15 Ray processes (GCS, raylet,
agents, Ray Train's controller and helpers, Ray Data's coordinators) at about 1% of a core
each, and on two cores they preempt the two-thread loop; the same plain loop ran at 49-60
samples/s beside the idle cluster and at 61-83 with it paused.

The last line is ``<ratio>x (target >= 0.85x)``.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import itertools
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

import psutil

from train_loops.config import LossConfig, OptimConfig, RLTrainConfig, cpu_trainer

Row = dict[str, Any]
COMPUTE_CORE = 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", default=None, help="policy checkpoint; default: tiny policy")
    p.add_argument("--groups", type=int, default=4, help="task groups of sampled step samples")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--samples-per-step", type=int, default=16)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3, help="untimed steps of each loop first")
    p.add_argument("--window", type=int, default=10, help="steps per turn (>= 3)")
    p.add_argument("--turns", type=int, default=8, help="Ray turns, each between plain turns")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (= Ray worker CPUs); default: 1 with --isolate, else 2",
    )
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument(
        "--isolate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="compute (both loops) on core 0, Ray's processes and this driver on the others, "
        "like a GPU trainer beside its host's CPUs; --no-isolate shares every core",
    )
    p.add_argument(
        "--pause-ray",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="SIGSTOP the Ray cluster during plain turns (else its idle daemons share them)",
    )
    args = p.parse_args(argv)
    if args.threads is None:
        args.threads = 1 if args.isolate else 2
    for name, low in {"window": 3, "turns": 1, "warmup": 1, "threads": 1}.items():
        if getattr(args, name) < low:
            p.error(f"--{name} must be >= {low}, got {getattr(args, name)}")
    return args


def config(args: argparse.Namespace) -> RLTrainConfig:
    trainer = cpu_trainer(
        num_workers=1,
        cpus_per_worker=float(args.threads),
        samples_per_step=args.samples_per_step,
        micro_batch_size=args.micro_batch,
        max_steps=args.warmup + args.turns * args.window,
        checkpoint_every=10**6,
        cpu_affinity=[COMPUTE_CORE] if args.isolate else None,
    )
    return RLTrainConfig(trainer=trainer, optim=OptimConfig(lr=1e-5), loss=LossConfig())


def step_rows(rows: list[Row], step: int, samples_per_step: int) -> list[Row]:
    """The rows of optimizer step ``step`` (from 0): ``rows`` repeated, the same for both loops."""
    return [rows[(step * samples_per_step + j) % len(rows)] for j in range(samples_per_step)]


def turn_throughput(stamps: list[float], samples_per_step: int) -> float:
    """Samples/s of one turn from its step end times: the first step (hand-over) is dropped
    by taking intervals between consecutive ends only."""
    intervals = [b - a for a, b in itertools.pairwise(stamps)]
    return samples_per_step / statistics.median(intervals)


def bracketed_ratios(plain: list[float], ray: list[float]) -> list[float]:
    """Ray turn i over the mean of the plain turns just before and after it."""
    if len(plain) != len(ray) + 1:
        raise ValueError(f"need one more plain turn than Ray turns, got {len(plain)}, {len(ray)}")
    return [r / ((a + b) / 2) for r, a, b in zip(ray, plain[:-1], plain[1:], strict=True)]


class TreeCpu(threading.Thread):
    """Samples the CPU seconds used by this process and all its descendants (the plain child,
    the local Ray cluster: GCS, raylet, controller, data actors, the train worker) every 0.2 s."""

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


# --- the plain loop: a child process that runs the steps it is asked for -------------------


def plain_child(conn: Any, cfg_json: str, model_path: str, rows: list[Row], threads: int) -> None:
    """One process, no Ray, no DeepSpeed: the same objective and optimizer. Receives a step
    count, runs that many steps, sends back their end times; None ends it."""
    cfg = RLTrainConfig.model_validate_json(cfg_json)
    if cfg.trainer.cpu_affinity:  # the same core(s) as the Ray trainer
        os.sched_setaffinity(0, set(cfg.trainer.cpu_affinity))
    import torch
    from transformers import AutoModelForImageTextToText

    from train_loops.batching import ImageEncoder
    from train_loops.engine import param_groups
    from train_loops.objectives import RLObjective

    torch.set_num_threads(threads)
    t, o = cfg.trainer, cfg.optim
    torch.manual_seed(t.seed)
    model = AutoModelForImageTextToText.from_pretrained(model_path).train()
    reference = AutoModelForImageTextToText.from_pretrained(model_path).eval()
    reference.requires_grad_(False)
    opt = torch.optim.AdamW(param_groups(model, o.weight_decay), lr=o.lr, betas=o.betas, eps=o.eps)
    objective = RLObjective.from_config(
        cfg.loss, ImageEncoder.from_pretrained(model_path), reference=reference
    )
    step = 0
    while (n := conn.recv()) is not None:
        stamps = []
        for _ in range(n):
            batch = step_rows(rows, step, t.samples_per_step)
            for i in range(0, len(batch), t.micro_batch_size):
                out = objective.micro_step(model, batch[i : i + t.micro_batch_size])
                (out.loss / t.grad_accum_steps).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip or float("inf"))
            opt.step()
            opt.zero_grad(set_to_none=True)
            stamps.append(time.time())
            step += 1
        conn.send(stamps)


class PlainLoop:
    def __init__(self, cfg: RLTrainConfig, model_path: str, rows: list[Row], threads: int):
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=plain_child,
            args=(child, cfg.model_dump_json(), model_path, rows, threads),
            daemon=True,
        )
        self._proc.start()

    def run(self, steps: int) -> list[float]:
        self._conn.send(steps)
        while not self._conn.poll(1.0):
            if not self._proc.is_alive():
                raise RuntimeError(f"plain loop exited with code {self._proc.exitcode}")
        return self._conn.recv()

    @property
    def pids(self) -> set[int]:
        """The child and anything it started."""
        proc = psutil.Process(self._proc.pid)
        return {proc.pid, *(c.pid for c in proc.children(recursive=True))}

    def close(self) -> None:
        self._conn.send(None)
        self._proc.join(timeout=30)


@contextmanager
def cluster_paused(keep: set[int]) -> Iterator[None]:
    """SIGSTOP every process of the local Ray cluster (this driver's descendants, but ``keep``)
    and SIGCONT them after: the plain loop gets the machine to itself, as without Ray."""
    stopped = []
    try:
        for proc in psutil.Process().children(recursive=True):
            if proc.pid not in keep:
                with suppress(psutil.Error):
                    proc.suspend()
                    stopped.append(proc)
        yield
    finally:
        for proc in reversed(stopped):
            with suppress(psutil.Error):
                proc.resume()


# --- the Ray loop: the production trainer, held at step boundaries between its turns --------


class Turns:
    """Ray actor (async): ``granted`` steps the trainer may have finished, ``done`` it has."""

    def __init__(self) -> None:
        self.granted = 0
        self.done = 0
        self._changed = asyncio.Condition()

    async def grant(self, steps: int) -> None:
        async with self._changed:
            self.granted = steps
            self._changed.notify_all()

    async def after_step(self, step: int) -> None:
        """Called by the trainer after ``step``; returns when step+1 is granted."""
        async with self._changed:
            self.done = step
            self._changed.notify_all()
            await self._changed.wait_for(lambda: self.granted > step)

    async def reached(self, steps: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self.done >= steps)


def _turns_actor() -> Any:
    import ray

    actor_cls: Any = ray.remote(num_cpus=0)(Turns)
    return actor_cls.remote()


@dataclass
class TurnGate:
    """The trainer's ``stop_fn``: waits for the next turn after each step, never stops it."""

    turns: Any

    def __call__(self, metrics: dict[str, float]) -> bool:
        import ray

        ray.get(self.turns.after_step.remote(int(metrics["train/step"])))
        return False


class RayLoop:
    def __init__(self, cfg: RLTrainConfig, model_path: str, rows: list[Row], run_dir: str):
        import ray

        from train_loops.schema import to_table
        from train_loops.trainers import build_rl_trainer

        self.turns = _turns_actor()
        self.run_dir = run_dir
        # one pass covers every step, like the production stream (no per-epoch restarts)
        t = cfg.trainer
        ordered = [
            r for step in range(t.max_steps) for r in step_rows(rows, step, t.samples_per_step)
        ]
        dataset = ray.data.from_arrow(to_table(ordered))
        trainer = build_rl_trainer(
            cfg, model_path, {"train": dataset}, None, run_dir, stop_fn=TurnGate(self.turns)
        )
        self.error: BaseException | None = None
        self._fit = threading.Thread(target=self._run, args=(trainer,), daemon=True)
        self._fit.start()
        self.granted = 0
        self.max_steps = cfg.trainer.max_steps

    def _run(self, trainer: Any) -> None:
        try:
            result = trainer.fit()
            self.error = result.error
        except BaseException as e:  # re-raised by run()
            self.error = e

    def run(self, steps: int) -> None:
        """Lets the trainer finish ``steps`` more steps and waits for them."""
        import ray

        self.granted += steps
        ray.get(self.turns.grant.remote(self.granted))
        if self.granted >= self.max_steps:  # the last step ends fit(), no hook after it
            self._fit.join()
        else:
            ref = self.turns.reached.remote(self.granted)
            while not ray.wait([ref], timeout=1.0)[0]:
                if not self._fit.is_alive():
                    break
        stopped_early = not self._fit.is_alive() and self.granted < self.max_steps
        if self.error is not None or stopped_early:
            raise RuntimeError(f"Ray trainer failed: {self.error!r}")

    def stamps(self) -> dict[int, float]:
        """Step → end time, from the run's metrics JSONL."""
        from train_loops.metrics import METRICS_FILE

        lines = (Path(self.run_dir) / METRICS_FILE).read_text().splitlines()
        return {int(r["train/step"]): r["time"] for r in map(json.loads, lines)}


# --- the turns ------------------------------------------------------------------------------


@dataclass
class Turn:
    kind: str
    samples_per_s: float
    start: float
    end: float
    steps: int


def play(
    args: argparse.Namespace, cfg: RLTrainConfig, model_path: str, rows: list[Row]
) -> list[Turn]:
    from workflows.common.ray_cluster import RayClusterConfig, init_ray, shutdown_ray

    sps, k = cfg.trainer.samples_per_step, args.window
    plain = PlainLoop(cfg, model_path, rows, args.threads)
    init_ray(RayClusterConfig(num_cpus=args.threads + 2))
    turns: list[Turn] = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-train-") as run_dir:
            ray_loop = RayLoop(cfg, model_path, rows, run_dir)
            plain.run(args.warmup)
            ray_loop.run(args.warmup)
            print(f"both loops started and warmed up ({args.warmup} steps each)", flush=True)
            ray_spans = []
            for i in range(2 * args.turns + 1):
                t0 = time.time()
                if i % 2 == 0:
                    with cluster_paused(plain.pids) if args.pause_ray else nullcontext():
                        stamps = plain.run(k)
                    turns.append(Turn("plain", turn_throughput(stamps, sps), t0, time.time(), k))
                else:
                    first = ray_loop.granted + 1
                    ray_loop.run(k)
                    ray_spans.append((len(turns), first))
                    turns.append(Turn("ray", 0.0, t0, time.time(), k))
                _progress(turns, i, args.turns)
            stamps_by_step = ray_loop.stamps()
            for index, first in ray_spans:
                stamps = [stamps_by_step[s] for s in range(first, first + k)]
                turns[index].samples_per_s = turn_throughput(stamps, sps)
    finally:
        plain.close()
        shutdown_ray()
    return turns


def _progress(turns: list[Turn], i: int, n: int) -> None:
    t = turns[-1]
    rate = f"{t.samples_per_s:.1f} samples/s" if t.kind == "plain" else "timed at the end"
    print(f"[turn {i + 1}/{2 * n + 1}] {t.kind}: {t.end - t.start:.1f} s, {rate}", flush=True)


def report(turns: list[Turn], sampler: TreeCpu, sps: int) -> None:
    plain = [t.samples_per_s for t in turns if t.kind == "plain"]
    ray = [t.samples_per_s for t in turns if t.kind == "ray"]
    ratios = bracketed_ratios(plain, ray)
    print("plain samples/s by turn: " + " ".join(f"{x:.1f}" for x in plain))
    print("Ray   samples/s by turn: " + " ".join(f"{x:.1f}" for x in ray))
    print("Ray ÷ neighbouring plain: " + " ".join(f"{x:.2f}" for x in ratios))
    cpu = {
        kind: sum(sampler.between(t.start, t.end) for t in turns if t.kind == kind)
        / sum(t.steps * sps for t in turns if t.kind == kind)
        for kind in ("plain", "ray")
    }
    print(f"median: plain torch loop {statistics.median(plain):.2f} samples/s, "
          f"Ray Train + DeepSpeed ZeRO-2 (1 worker) {statistics.median(ray):.2f} samples/s; "
          f"ratio of medians {statistics.median(ray) / statistics.median(plain):.2f}x")  # fmt: skip
    print(f"CPU-ms per sample (process tree): plain {1000 * cpu['plain']:.1f}, "
          f"Ray {1000 * cpu['ray']:.1f} → CPU-normalized {cpu['plain'] / cpu['ray']:.2f}x")  # fmt: skip
    load = os.getloadavg()[0]
    print(f"load average now {load:.1f} on {os.cpu_count()} cores")
    print(f"{statistics.median(ratios):.2f}x (target >= 0.85x)")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from train_loops.sample_maker import make_step_samples

    model_path = args.model_path
    if model_path is None:
        from workflows.common.tiny_models import tiny_checkpoint

        model_path = str(tiny_checkpoint("policy"))
    cfg = config(args)
    placement = "shared cores"
    if args.isolate:
        cores = sorted(os.sched_getaffinity(0))
        if COMPUTE_CORE not in cores or len(cores) < 2:
            raise SystemExit(f"--isolate needs core {COMPUTE_CORE} and another; this has {cores}")
        placement = f"compute on core {COMPUTE_CORE}, Ray and the driver on {cores[1:]}"
    rows = make_step_samples(
        model_path, args.groups, args.group_size, max_new_tokens=args.max_new_tokens
    )
    tokens = sum(len(r["prompt_ids"]) + len(r["response_ids"]) for r in rows) / len(rows)
    print(f"{len(rows)} step samples, {tokens:.0f} tokens each on average; "
          f"{args.samples_per_step} samples/step, micro-batch {args.micro_batch}, "
          f"{args.threads} threads; {args.turns} Ray turns of {args.window} steps between "
          f"{args.turns + 1} plain turns; {placement}")  # fmt: skip
    if args.isolate:  # before Ray starts and the plain child spawns: they inherit it
        os.sched_setaffinity(0, set(os.sched_getaffinity(0)) - {COMPUTE_CORE})
    sampler = TreeCpu()
    sampler.start()
    try:
        turns = play(args, cfg, model_path, rows)
    finally:
        sampler.stop()
    report(turns, sampler, cfg.trainer.samples_per_step)


if __name__ == "__main__":
    main()
