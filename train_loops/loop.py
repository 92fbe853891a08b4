"""The Ray Train worker function shared by the RL and SFT trainers.

Per optimizer step every worker takes ``samples_per_step / num_workers`` rows from its shard of
the ``"train"`` dataset (bounded or unbounded, see ``train_loops.stream``), runs them as
micro-batches through its DeepSpeed engine (gradient accumulation; DeepSpeed averages over
micro-batches and ranks, so with equal micro-batches the loss is the exact mean over the
step's samples), and steps. Then, in this order:

1. every ``publish_every`` steps: the full weights (gathered under ZeRO-3) go to
   ``publish_fn(state_dict, version)`` on rank 0, version = previous + 1;
2. metrics are combined over ranks and appended to ``<run_dir>/train_metrics.jsonl`` by rank 0
   (lifecycle events to ``train_events.jsonl``, see ``train_loops.metrics``);
3. every ``checkpoint_every`` steps and at the end: a checkpoint (``train_loops.checkpoint``)
   is reported with the metrics through ``ray.train.report``; otherwise the metrics alone,
   at most every ``report_every`` steps and ``report_interval_s`` seconds (a barrier that Ray
   Train V2 drains once per controller poll, so it must not run on every fast step).

The run stops when the step counter reaches ``max_steps``, a bounded dataset ends, or
``stop_fn(metrics)`` (rank 0, after a step; e.g. an Entropulse trigger) asks it to: then it
checkpoints at that exact step and returns.

Every checkpoint carries the lineage of its weights (``train_loops.lineage``: the sample ids of
each step, all ranks), and after it is stored rank 0 tells ``commit_fn(step, sample_ids)`` the
ids it added, so the data source can let go of exactly those. ``start_version`` is a floor for
the weight version: a run restarted from a checkpoint older than the versions already
published takes the next free version and publishes its weights at once, so the served version
never goes backwards.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist

from train_loops.checkpoint import (
    Start,
    TrainerState,
    newest_of,
    resolve_start,
    restore_optimizer,
    write_checkpoint,
)
from train_loops.config import RLTrainConfig, SFTTrainConfig, TrainerConfig
from train_loops.engine import (
    TORCH_DTYPES,
    cpu_autocast,
    cpu_op_env,
    full_state_dict,
    init_engine,
    init_reference,
    load_model,
    skip_shm_comm_op,
)
from train_loops.jsonl import JsonlWriter
from train_loops.lineage import read_lineages, write_lineages
from train_loops.metrics import (
    EVENTS_FILE,
    METRICS_FILE,
    mean_of,
    reduce_across_ranks,
    staleness,
)
from train_loops.objectives import MicroStep, Objective, RLObjective, SFTObjective
from train_loops.stream import PartStream, Row, RowStream, agree, any_rank

log = logging.getLogger(__name__)

PublishFn = Callable[[dict[str, torch.Tensor], int], None]
"""``publish_fn(state_dict, version)``: full CPU weights after an update, on rank 0 only."""
StopFn = Callable[[dict[str, float]], bool]
"""``stop_fn(metrics)``: rank 0, after each step's (rank-reduced) metrics; True ends the run."""
CommitFn = Callable[[int, list[str]], None]
"""``commit_fn(step, sample_ids)``: rank 0, once the checkpoint at ``step`` is stored; the ids of
every rank's samples trained since the previous checkpoint."""


@dataclass
class WorkerArgs:
    """Everything a worker needs; pickled into ``train_loop_config["args"]``."""

    kind: Literal["rl", "sft"]
    config: RLTrainConfig | SFTTrainConfig
    model_path: str
    run_dir: str
    run_name: str
    publish_fn: PublishFn | None = None
    resume_from: Any = None  # ray.train.Checkpoint | None
    start_step: int = 0  # step counter when starting fresh or from another kind's checkpoint
    stop_fn: StopFn | None = None
    commit_fn: CommitFn | None = None
    start_version: int = 0  # floor of the weight version (versions already published elsewhere)


def train_worker(loop_config: dict[str, Any]) -> None:
    """Ray Train ``train_loop_per_worker``: ``loop_config = {"args": WorkerArgs}``."""
    args: WorkerArgs = loop_config["args"]
    trainer = args.config.trainer
    _prepare_process(trainer)
    import ray.train

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    with ExitStack() as stack:  # keeps a downloaded checkpoint alive while it is loaded
        start = _start(args, rank, world, stack)
        engine = init_engine(load_model(start.weights, trainer), trainer, args.config.optim)
        if start.optimizer_dir is not None:
            restore_optimizer(engine, start.optimizer_dir)
    objective = _objective(args, engine.device, start.state.base_model)
    stream: RowStream | PartStream
    if rollout_batches(args):
        stream = PartStream(ray.train.get_dataset_shard(rank_dataset(rank)))
    else:
        stream = RowStream(
            ray.train.get_dataset_shard("train"), trainer.samples_per_worker, trainer.cycle_data
        )
    Loop(args, engine, objective, stream, start, rank).run()


def rollout_batches(args: WorkerArgs) -> bool:
    """Whether this run steps once per rollout batch (RL only: SFT data has no batches)."""
    return args.kind == "rl" and args.config.trainer.schedule == "rollout_batch"


def rank_dataset(rank: int) -> str:
    """The dataset name of rank ``rank``'s rollout-batch parts."""
    return f"train_rank{rank}"


def _prepare_process(trainer: TrainerConfig) -> None:
    if trainer.cpu_affinity:
        os.sched_setaffinity(0, set(trainer.cpu_affinity))
    if not trainer.use_gpu:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        cpu_op_env()
        skip_shm_comm_op()
        torch.set_num_threads(max(1, int(trainer.cpus_per_worker)))
    torch.manual_seed(trainer.seed)


def _start(args: WorkerArgs, rank: int, world: int, stack: ExitStack) -> Start:
    """The run's own latest checkpoint (after a restart) wins over ``resume_from``, unless
    that one is further on (:func:`~train_loops.checkpoint.newest_of`)."""
    import ray.train

    own, given = ray.train.get_checkpoint(), args.resume_from
    folder = newest_of(
        None if own is None else Path(stack.enter_context(own.as_directory())),
        None if given is None else Path(stack.enter_context(given.as_directory())),
        args.kind,
    )
    trainer = args.config.trainer
    base = TrainerState(
        kind=args.kind,
        step=args.start_step,
        world_size=world,
        zero_stage=trainer.zero_stage,
        base_model=args.model_path,
    )
    return resolve_start(folder, base, args.model_path)


def _objective(args: WorkerArgs, device: Any, base_model: str) -> Objective:
    """The RL objective's KL reference is ``ref_model_path``, else the run's original model
    (recorded in its checkpoints, so a resumed run keeps the same reference)."""
    from train_loops.batching import ImageEncoder

    encoder = ImageEncoder.from_pretrained(args.model_path)
    dtype = TORCH_DTYPES[args.config.trainer.dtype]
    if isinstance(args.config, SFTTrainConfig):
        return SFTObjective(encoder, device=device, dtype=dtype)
    reference = None
    if args.config.loss.uses_reference:
        path = args.config.ref_model_path or _existing(base_model) or args.model_path
        model = load_model(path, args.config.trainer, trainable=False)
        reference = init_reference(model, args.config.trainer, device)
    return RLObjective.from_config(
        args.config.loss, encoder, device=device, dtype=dtype, reference=reference
    )


def _existing(path: str) -> str | None:
    if path and Path(path).is_dir():
        return path
    if path:
        log.warning("reference model %s is gone; using model_path as the KL reference", path)
    return None


class Loop:
    """The step loop of one worker; all ranks run the same control flow."""

    def __init__(
        self,
        args: WorkerArgs,
        engine: Any,
        objective: Objective,
        stream: RowStream | PartStream,
        start: Start,
        rank: int,
    ):
        self.args, self.engine, self.objective, self.stream = args, engine, objective, stream
        self.cfg: TrainerConfig = args.config.trainer
        self.state = start.state
        self.rank = rank
        run_dir = Path(args.run_dir) if rank == 0 else None
        common = {"run": args.run_name, "kind": args.kind}
        self.metrics_log = JsonlWriter(run_dir and run_dir / METRICS_FILE, timestamp=True, **common)
        self.events = JsonlWriter(run_dir and run_dir / EVENTS_FILE, timestamp=True, **common)
        self.events.write(
            event="start",
            step=self.state.step,
            version=self.state.version,
            resumed_from=start.source,
            restored_optimizer=start.optimizer_dir is not None,
            world_size=self.state.world_size,
        )
        self._last_checkpoint_step = self.state.step
        self._last_report = time.monotonic()
        self._losses: list[float] = []  # per-step losses since the last progress line
        self.lineages = read_lineages(start.source)  # every kind's, carried along
        self._since: list[dict[str, Any]] = []  # this rank's {step, ids} since the checkpoint
        self.dynamic = rollout_batches(args)

    def run(self) -> None:
        reason = "max_steps"
        metrics: dict[str, float] = {}
        self._catch_up_version()
        while self.state.step < self.cfg.max_steps:
            if self._stop_requested(metrics):
                reason = "stop_requested"
                break
            t0 = time.perf_counter()
            rows = self.stream.next()
            ready, report = agree(rows is not None, self._wants_report(), self.engine.device)
            if not ready:
                reason = "data_exhausted"
                break
            assert rows is not None
            metrics = self._step(rows, data_wait=time.perf_counter() - t0)
            self._report(metrics, report)
        if self.state.step > self._last_checkpoint_step:
            self._checkpoint_and_report(metrics)
        self.events.write(
            event="end", reason=reason, step=self.state.step, version=self.state.version
        )

    def _stop_requested(self, metrics: dict[str, float]) -> bool:
        """Rank 0 asks ``stop_fn`` about the last step; every rank learns the answer before
        taking more rows (the collective runs only when a stop_fn is set, on all ranks)."""
        if self.args.stop_fn is None:
            return False
        wish = self.rank == 0 and bool(metrics) and bool(self.args.stop_fn(metrics))
        return any_rank(wish, self.engine.device)

    def _step(self, rows: list[Row], data_wait: float) -> dict[str, float]:
        t0 = time.perf_counter()
        real = [r for r in rows if r.get("weight", 1.0) > 0]  # padding only with rollout batches
        # Over all rows: padding copies real rows of the batch, and every rank needs the keys.
        stale = staleness(rows, self.state.version)
        if self.dynamic:
            means = {}
            sums = train_batch(
                self.engine, self.objective, rows, self.cfg.micro_batch_size,
                self.state.world_size, self.cfg.updates_per_batch, lambda: cpu_autocast(self.cfg),
            )  # fmt: skip
            self.state.samples_seen += int(rows[0]["batch_real"])
        else:
            ordered = by_length(rows) if self.cfg.sort_by_length else rows
            outs = [self._micro(chunk) for chunk in _chunks(ordered, self.cfg.micro_batch_size)]
            means = mean_of([o.metrics for o in outs])
            sums = {"tokens": float(sum(o.tokens for o in outs)), "samples": float(len(rows))}
            self.state.samples_seen += self.cfg.samples_per_step
        grad_norm = self.engine.get_global_grad_norm()
        step_time = time.perf_counter() - t0
        self.state.step += 1
        self._since.append({"step": self.state.step, "ids": [str(r["sample_id"]) for r in real]})
        publish_time = self._maybe_publish()
        means = {
            **means,
            **stale,
            "step_time": step_time,
            "time/data_wait": data_wait,
            "time/publish": publish_time,
            "optim/grad_norm": float(grad_norm) if grad_norm is not None else 0.0,
        }
        metrics = reduce_across_ranks(means, sums, self.engine.device)
        if self.dynamic:  # sample-weighted means: Σ(metric · real rows) / real rows, all ranks
            total = max(metrics["samples"], 1.0)
            metrics.update(
                {k[:-2]: metrics.pop(k) / total for k in list(metrics) if k[-2:] == "@w"}
            )
        metrics.update({"train/step": self.state.step, "train/version": self.state.version})
        self.metrics_log.write(metrics)
        if self._prints_progress():
            self._losses.append(metrics.get("loss/total", float("nan")))
        return metrics

    def _prints_progress(self) -> bool:
        return self.rank == 0 and self.args.kind == "sft"

    def _micro(self, rows: Sequence[Row]) -> MicroStep:
        with cpu_autocast(self.cfg):
            out = self.objective.micro_step(self.engine, rows)
        self.engine.backward(out.loss)
        self.engine.step()  # applies the update only at the accumulation boundary
        return out

    def _catch_up_version(self) -> None:
        """Restarted behind versions already published (the steps after our checkpoint ran,
        published, and were lost): take the next free version and publish these weights."""
        if self.args.start_version <= self.state.version:
            return
        self.state.version = self.args.start_version - 1
        self._publish()
        self.events.write(
            event="version_catch_up", step=self.state.step, version=self.state.version
        )

    def _maybe_publish(self) -> float:
        if self.state.step % self.cfg.publish_every:
            return 0.0
        return self._publish()

    def _publish(self) -> float:
        t0 = time.perf_counter()
        self.state.version += 1
        if self.args.publish_fn is not None:
            weights = full_state_dict(self.engine, self.cfg.zero_stage, self.rank)
            if weights is not None:
                self.args.publish_fn(weights, self.state.version)
        return time.perf_counter() - t0

    def _wants_report(self) -> bool:
        """Rank 0's wish to report after the coming step (the ranks agree on it)."""
        if self.rank != 0 or (self.state.step + 1) % self.cfg.report_every:
            return False
        return time.monotonic() - self._last_report >= self.cfg.report_interval_s

    def _report(self, metrics: dict[str, float], report: bool) -> None:
        import ray.train

        step = self.state.step
        if step % self.cfg.checkpoint_every == 0 or step >= self.cfg.max_steps:
            self._checkpoint_and_report(metrics)
        elif report:
            ray.train.report(metrics)
            self._last_report = time.monotonic()
        if report and self._prints_progress():
            mean = {**metrics, "loss/total": sum(self._losses) / max(len(self._losses), 1)}
            print(progress_line(self.args.run_name, step, self.cfg.max_steps, mean), flush=True)
            self._losses.clear()

    def _checkpoint_and_report(self, metrics: dict[str, float]) -> None:
        import ray.train

        t0 = time.perf_counter()
        weights = full_state_dict(self.engine, self.cfg.zero_stage, self.rank)
        new = _merge_steps(_gather(self._since))
        kind = self.args.kind
        lineages = {**self.lineages, kind: self.lineages.get(kind, []) + new}
        with tempfile.TemporaryDirectory(prefix="csd-ckpt-") as tmp:
            write_checkpoint(
                Path(tmp), self.engine, weights, self.state, self.args.model_path, self.rank
            )
            if self.rank == 0:
                write_lineages(Path(tmp), lineages)
            ray.train.report(
                {**metrics, "time/checkpoint": time.perf_counter() - t0},
                checkpoint=ray.train.Checkpoint.from_directory(tmp),
                checkpoint_dir_name=f"checkpoint_{self.args.kind}_{self.state.step:06d}",
            )
        self._last_checkpoint_step = self.state.step
        self._last_report = time.monotonic()
        self.events.write(event="checkpoint", step=self.state.step, version=self.state.version)
        self.lineages, self._since = lineages, []
        if self.rank == 0 and self.args.commit_fn is not None and new:
            self.args.commit_fn(self.state.step, [i for line in new for i in line["ids"]])


def _gather(items: list[Any]) -> list[Any]:
    """Every rank's ``items``, concatenated (this rank's alone without torch.distributed)."""
    if not (dist.is_available() and dist.is_initialized()):
        return list(items)
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, items)
    return [x for part in parts for x in part]


def _merge_steps(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per-rank ``{step, ids}`` lines → one line per step with every rank's ids."""
    steps: dict[int, list[str]] = {}
    for line in lines:
        steps.setdefault(int(line["step"]), []).extend(line["ids"])
    return [{"step": k, "ids": sorted(v)} for k, v in sorted(steps.items())]


def train_batch(
    engine: Any,
    objective: Objective,
    rows: list[Row],
    micro: int,
    world: int,
    updates: int = 1,
    precision: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> dict[str, float]:
    """``updates`` optimizer updates on one rank's part of a rollout batch (PPO epochs; each
    is :func:`train_part`). The metric sums are their means, so ``pg/clip_frac`` shows how far
    the later updates moved off the behaviour policy; ``tokens`` and ``samples`` count the
    batch once."""
    parts = [train_part(engine, objective, rows, micro, world, precision) for _ in range(updates)]
    return {key: sum(p[key] for p in parts) / updates for key in parts[0]}


def train_part(
    engine: Any,
    objective: Objective,
    rows: list[Row],
    micro: int,
    world: int,
    precision: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> dict[str, float]:
    """One rank's part of a rollout batch: its micro-batches accumulate into one update.

    The batch has ``batch_real`` real rows over all ranks and ``size`` rows with padding.
    DeepSpeed divides each micro-batch's loss by the accumulation steps and averages over
    ranks, i.e. divides by ``size / micro``; scaling the loss of a micro-batch's real rows by
    ``n_real / micro · size / batch_real`` makes the update the exact mean over the batch's
    real rows. A micro-batch of padding only still runs forward and backward (× 0): ZeRO
    reduces gradients on every backward, so all ranks must take as many. Returns sums for
    :func:`~train_loops.metrics.reduce_across_ranks`: each metric weighted by real rows
    (``<name>@w``), ``tokens`` and ``samples`` of the real rows."""
    size = int(rows[0]["part_rows"]) * world
    batch_real = int(rows[0]["batch_real"])
    engine.set_train_batch_size(size)
    chunks = _chunks(rows, micro)
    sums = {"tokens": 0.0, "samples": 0.0}
    for i, chunk in enumerate(chunks):
        real = [r for r in chunk if r["weight"] > 0]
        engine.set_gradient_accumulation_boundary(i == len(chunks) - 1)
        with precision():
            out = objective.micro_step(engine, real or chunk)
        engine.backward(out.loss * (len(real) / micro * size / batch_real))
        engine.step()
        for key, value in out.metrics.items():
            sums[f"{key}@w"] = sums.get(f"{key}@w", 0.0) + float(value) * len(real)
        sums["tokens"] += out.tokens if real else 0
        sums["samples"] += len(real)
    return sums


def progress_line(run: str, step: int, max_steps: int, metrics: dict[str, float]) -> str:
    """An SFT run's line at each report (loss: the mean since the last line). Nothing else
    watches an SFT run's metrics as it goes (the online job's driver prints the RL trainer's),
    so without it a 10-minute behaviour cloning is silent."""
    loss = metrics.get("loss/total", float("nan"))
    per_step = metrics.get("step_time", 0.0) + metrics.get("time/data_wait", 0.0)
    eta_min = max(max_steps - step, 0) * per_step / 60
    return (
        f"[train {run}] step {step}/{max_steps} loss {loss:.4f} "
        f"{per_step:.2f} s/step, about {eta_min:.1f} min left"
    )


def by_length(rows: Sequence[Row]) -> list[Row]:
    """Rows shortest first by their token ids (prompt plus target or response); a stable sort,
    so equal lengths keep their order. A micro-batch is padded to its longest row, so
    neighbours of like length waste the least compute."""
    return sorted(rows, key=lambda r: sum(len(r.get(k) or ()) for k in _ID_FIELDS))


_ID_FIELDS = ("prompt_ids", "target_ids", "response_ids")


def _chunks(rows: Sequence[Row], size: int) -> list[Sequence[Row]]:
    return [rows[i : i + size] for i in range(0, len(rows), size)]
