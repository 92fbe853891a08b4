"""Builders of the Ray Train ``TorchTrainer`` for the RL and SFT loops.

    trainer = build_rl_trainer(cfg, model_path, {"train": dataset}, publish_fn, run_dir)
    result = trainer.fit()          # result.checkpoint: the latest checkpoint

``datasets["train"]`` may be an unbounded streaming dataset (RL) or a bounded one (SFT,
tests); it is split over the workers. With ``trainer.schedule: rollout_batch`` (RL) there is
one unsplit dataset per rank instead, ``datasets["train_rank<r>"]``, read by rank r alone (the
buffer deals each rollout batch into one part per rank; ``train_loops.loop``). Checkpoints land under ``<run_dir>/<run_name>/``; step metrics are in
``<run_dir>/train_metrics.jsonl`` (see ``train_loops.metrics``) and in ``ray.train.report``.
Resuming: pass ``resume_from`` (a checkpoint of ours, or a plain Hugging Face folder for the
weights only); a run restarted under the same ``run_dir``/``run_name`` resumes from its own
latest checkpoint instead (Ray Train's run snapshot). ``start_step`` sets the step counter when
the weights come from elsewhere (RL resuming from an Entropulse SFT checkpoint keeps counting
its steps globally, so ``max_steps`` stays the run's total). ``stop_fn(metrics)`` (picklable,
called on rank 0 after each step) ends the fit early with a checkpoint at that step.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from train_loops.config import RLTrainConfig, SFTTrainConfig, TrainerConfig
from train_loops.loop import CommitFn, PublishFn, StopFn, WorkerArgs, rank_dataset, train_worker

if TYPE_CHECKING:
    from ray.train import Checkpoint
    from ray.train.torch import TorchTrainer


def build_rl_trainer(
    cfg: RLTrainConfig,
    model_path: str | Path,
    datasets: dict[str, Any],
    publish_fn: PublishFn | None,
    run_dir: str | Path,
    resume_from: Checkpoint | str | Path | None = None,
    run_name: str = "rl",
    start_step: int = 0,
    stop_fn: StopFn | None = None,
    commit_fn: CommitFn | None = None,
    start_version: int = 0,
) -> TorchTrainer:
    """The online-RL trainer (METHOD.md §4–§5) over step samples in ``datasets["train"]``.
    ``commit_fn`` and ``start_version``: see :mod:`train_loops.loop`."""
    return _build(
        "rl", cfg, model_path, datasets, publish_fn, run_dir, resume_from, run_name,
        start_step, stop_fn, commit_fn, start_version,
    )  # fmt: skip


def build_sft_trainer(
    cfg: SFTTrainConfig,
    model_path: str | Path,
    datasets: dict[str, Any],
    publish_fn: PublishFn | None,
    run_dir: str | Path,
    resume_from: Checkpoint | str | Path | None = None,
    run_name: str = "sft",
) -> TorchTrainer:
    """The SFT trainer (analyzer SFT, Entropulse phases) over SFT samples."""
    return _build("sft", cfg, model_path, datasets, publish_fn, run_dir, resume_from, run_name)


def _build(
    kind: Literal["rl", "sft"],
    cfg: RLTrainConfig | SFTTrainConfig,
    model_path: str | Path,
    datasets: dict[str, Any],
    publish_fn: PublishFn | None,
    run_dir: str | Path,
    resume_from: Checkpoint | str | Path | None,
    run_name: str,
    start_step: int = 0,
    stop_fn: StopFn | None = None,
    commit_fn: CommitFn | None = None,
    start_version: int = 0,
) -> TorchTrainer:
    from ray.train.torch import TorchTrainer

    dataset_config = _dataset_config(kind, cfg.trainer, datasets)
    run_dir = Path(run_dir).expanduser().resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    args = WorkerArgs(
        kind=kind,
        config=cfg,
        model_path=str(Path(model_path).expanduser().resolve()),
        run_dir=str(run_dir),
        run_name=run_name,
        publish_fn=publish_fn,
        resume_from=_as_checkpoint(resume_from),
        start_step=start_step,
        stop_fn=stop_fn,
        commit_fn=commit_fn,
        start_version=start_version,
    )
    return TorchTrainer(
        train_worker,
        train_loop_config={"args": args},
        scaling_config=_scaling(cfg.trainer),
        run_config=_run_config(cfg.trainer, run_dir, run_name),
        datasets=datasets,
        dataset_config=dataset_config,
    )


def _dataset_config(kind: str, trainer: TrainerConfig, datasets: dict[str, Any]) -> Any:
    """Split ``train`` over the workers; per-rank datasets (rollout batches) stay whole."""
    from ray.train import DataConfig

    if kind == "rl" and trainer.schedule == "rollout_batch":
        wanted = [rank_dataset(r) for r in range(trainer.num_workers)]
        missing = [name for name in wanted if name not in datasets]
        if missing:
            raise ValueError(
                f"trainer.schedule='rollout_batch' needs one dataset per rank {wanted}; "
                f"missing {missing} (got {sorted(datasets)})"
            )
        return DataConfig(datasets_to_split=[])
    if "train" not in datasets:
        raise ValueError(f"datasets needs a 'train' entry, got {sorted(datasets)}")
    return DataConfig(datasets_to_split=["train"])


def _as_checkpoint(source: Checkpoint | str | Path | None) -> Checkpoint | None:
    from ray.train import Checkpoint

    if source is None or isinstance(source, Checkpoint):
        return source
    path = Path(source).expanduser().resolve()
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"resume_from={source!s}: no config.json, not a model folder")
    return Checkpoint.from_directory(str(path))


def _scaling(trainer: TrainerConfig) -> Any:
    from ray.train import ScalingConfig

    return ScalingConfig(
        num_workers=trainer.num_workers,
        use_gpu=trainer.use_gpu,
        resources_per_worker={"CPU": trainer.cpus_per_worker},
    )


def _run_config(trainer: TrainerConfig, run_dir: Path, run_name: str) -> Any:
    from ray.train import CheckpointConfig, FailureConfig, RunConfig

    return RunConfig(
        name=run_name,
        storage_path=str(run_dir),
        checkpoint_config=CheckpointConfig(num_to_keep=trainer.keep_checkpoints),
        failure_config=FailureConfig(max_failures=trainer.max_failures),
    )
