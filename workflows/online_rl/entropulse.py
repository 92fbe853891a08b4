"""Entropulse (METHOD.md §7, from ComputerRL): when the policy's token entropy collapses during
RL (or on a fixed schedule), a short SFT phase on the successful trajectories gathered so far,
then RL resumes from the SFT weights. Library code for the online RL job.

How the RL job uses it::

    from workflows.online_rl.entropulse import Entropulse

    pulse = Entropulse(cfg.entropulse, run_dir, cfg.trainer, cfg.optim,
                       metrics=JsonlWriter(run_dir / "metrics.jsonl"))   # before the RL fit
    ...
    trigger = pulse.poll()               # new RL lines of <run_dir>/train_metrics.jsonl
    if trigger is not None:
        # 1. end the RL fit so that it leaves its checkpoint (its path: rl_checkpoint)
        phase = pulse.run_phase(rl_checkpoint, trigger, publish_fn=publisher)
        # 2. RL resumes from the SFT weights, under a new Ray Train run name:
        build_rl_trainer(..., resume_from=phase.checkpoint, run_name=phase.next_rl_run_name)

- :class:`EntropyTracker` tails the trainer's metrics JSONL (``policy/entropy``: the mean
  token entropy of the trained responses, one line per RL step; SFT lines are ignored).
- :meth:`Entropulse.poll` fires (``threshold``) when the mean of the last ``window`` RL steps
  is below ``threshold``, at least ``min_rl_steps`` RL steps after the start or the last phase,
  or (``schedule``) every ``every_rl_steps`` RL steps; never past ``max_phases``.
- :meth:`Entropulse.run_phase` / :func:`run_sft_phase`: the buffer's step-sample shards
  (``<run_dir>/trajectories/{pending,trained}/*.parquet``) with reward > ``min_reward`` become
  SFT samples (``sft_sample_from_step``: imitate exactly the tokens the policy sampled on
  successes); ``build_sft_trainer`` runs ``sft_steps`` steps from the RL checkpoint with the RL
  trainer's layout (same workers, ZeRO stage, publication), so the served policy receives the
  SFT weights through ``publish_fn`` and the weight version keeps rising. Returns the new
  checkpoint and its version. Too few successes: the phase is skipped and RL continues from
  its own checkpoint.
- Phase changes are metrics events (``entropulse/phase`` 1 during SFT, 0 after) in
  ``metrics`` (the job's JSONL) and in ``<run_dir>/entropulse.jsonl``.

Note for resuming RL: a checkpoint of another kind restores weights and version but not the
step counter (``train_loops.checkpoint.resolve_start``; the job passes its RL step count as
``start_step``), and a Ray Train run name that already has checkpoints resumes from its own
latest one; hence ``next_rl_run_name``, and an interrupted phase's folder is set aside before
the phase runs again. ``workflows.online_rl.rl_phases`` drives all of this inside the online RL job.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from train_loops.config import OptimConfig, SFTTrainConfig, TrainerConfig
from train_loops.jsonl import JsonlWriter
from workflows.online_rl.config import EntropulseConfig

log = logging.getLogger(__name__)
EVENTS_FILE = "entropulse.jsonl"
TRAIN_METRICS_FILE = "train_metrics.jsonl"  # train_loops.metrics.METRICS_FILE (torch-free here)


@dataclass(frozen=True)
class Trigger:
    """Why a phase starts now."""

    reason: str  # "threshold" | "schedule"
    entropy: float | None  # smoothed entropy at the trigger
    rl_steps: int  # RL steps since the start or the last phase


@dataclass(frozen=True)
class PhaseResult:
    """Where RL continues from after a phase (or a skipped one)."""

    phase: int
    checkpoint: str
    version: int
    skipped: bool
    reason: str | None
    num_samples: int
    sft_steps: int
    elapsed_s: float
    next_rl_run_name: str


class EntropyTracker:
    """Tails a trainer metrics JSONL for one metric of one run kind (complete lines only)."""

    def __init__(
        self,
        path: str | Path,
        metric: str = "policy/entropy",
        kind: str = "rl",
        from_end: bool = True,
    ) -> None:
        self.path = Path(path)
        self.metric, self.kind = metric, kind
        self.offset = self.path.stat().st_size if from_end and self.path.exists() else 0
        self.values: list[float] = []

    def poll(self) -> list[float]:
        """New values since the last poll (also appended to :attr:`values`)."""
        if not self.path.exists():
            return []
        with self.path.open("rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1  # a line being written stays for the next poll
        self.offset += end
        new = []
        for line in chunk[:end].splitlines():
            value = self._value(line)
            if value is not None:
                new.append(value)
        self.values += new
        return new

    def _value(self, line: bytes) -> float | None:
        try:
            rec = json.loads(line)
        except ValueError:
            return None
        if not isinstance(rec, dict) or rec.get("kind", self.kind) != self.kind:
            return None
        value = rec.get(self.metric)
        return float(value) if isinstance(value, int | float) else None

    def smoothed(self, window: int) -> float | None:
        recent = self.values[-window:]
        return sum(recent) / len(recent) if len(recent) >= window else None

    def reset(self) -> None:
        """Forget the values (a new RL phase starts counting again)."""
        self.values = []


def should_trigger(cfg: EntropulseConfig, values: list[float], phases: int) -> Trigger | None:
    """The trigger rule on the RL-step values since the start or the last phase."""
    if not cfg.enabled or (cfg.max_phases is not None and phases >= cfg.max_phases):
        return None
    steps = len(values)
    if cfg.trigger == "schedule":
        if steps >= cfg.every_rl_steps:
            return Trigger("schedule", _mean(values[-cfg.window :]), steps)
        return None
    if steps < max(cfg.min_rl_steps, cfg.window):
        return None
    entropy = _mean(values[-cfg.window :])
    if entropy is not None and entropy < cfg.threshold:
        return Trigger("threshold", entropy, steps)
    return None


class EntropulseStop:
    """The trigger rule as the RL loop's ``stop_fn``: fed each step's metrics on rank 0 (the
    same values the JSONL gets), it ends the fit exactly at the step a phase becomes due.
    Picklable; a fresh one per RL segment (counting starts at the segment's first step)."""

    def __init__(self, cfg: EntropulseConfig, phases_done: int) -> None:
        self.cfg, self.phases_done = cfg, phases_done
        self.values: list[float] = []

    def __call__(self, metrics: Mapping[str, float]) -> bool:
        value = metrics.get(self.cfg.metric)
        if isinstance(value, int | float):
            self.values.append(float(value))
        return should_trigger(self.cfg, self.values, self.phases_done) is not None


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def successful_step_samples(
    trajectories_dir: str | Path, min_reward: float = 0.0, max_samples: int | None = None
) -> list[dict[str, Any]]:
    """Step samples with reward > ``min_reward`` from the buffer's shards (pending and trained),
    deduplicated by sample id, the most recent ``max_samples``."""
    import pyarrow.parquet as pq

    from train_loops.schema import STEP_SAMPLE_SCHEMA

    rows: dict[str, dict[str, Any]] = {}
    for shard in sorted(Path(trajectories_dir).glob("*/*.parquet")):
        table = pq.read_table(
            shard, schema=STEP_SAMPLE_SCHEMA, filters=[("reward", ">", min_reward)]
        )
        for row in table.to_pylist():
            rows[row["sample_id"]] = row
    ordered = sorted(rows.values(), key=lambda r: (r["created_at"], r["sample_id"]))
    return ordered[-max_samples:] if max_samples else ordered


def sft_phase_config(
    cfg: EntropulseConfig, rl_trainer: TrainerConfig, rl_optim: OptimConfig
) -> SFTTrainConfig:
    """The RL trainer's layout for ``sft_steps`` steps over cycled data, checkpoint at the end."""
    trainer = rl_trainer.model_copy(
        update={"max_steps": cfg.sft_steps, "cycle_data": True, "checkpoint_every": cfg.sft_steps}
    )
    optim = rl_optim.model_copy(update={"lr": cfg.lr}) if cfg.lr is not None else rl_optim
    return SFTTrainConfig(trainer=trainer, optim=optim)


def checkpoint_version(checkpoint: str | Path) -> int:
    """The weight version recorded in a trainer checkpoint (0 for a plain model folder)."""
    state = Path(checkpoint) / "trainer_state.json"
    return int(json.loads(state.read_text()).get("version", 0)) if state.exists() else 0


def run_sft_phase(
    cfg: EntropulseConfig,
    run_dir: str | Path,
    rl_checkpoint: str | Path,
    rl_trainer: TrainerConfig,
    rl_optim: OptimConfig,
    *,
    phase: int = 1,
    publish_fn: Any = None,
    trajectories_dir: str | Path | None = None,
) -> PhaseResult:
    """One SFT phase from ``rl_checkpoint`` on the successful step samples so far."""
    import ray

    from train_loops.schema import sft_sample_from_step, to_sft_table
    from train_loops.trainers import build_sft_trainer

    t0 = time.time()
    run_dir = Path(run_dir)
    sft = sft_phase_config(cfg, rl_trainer, rl_optim)
    rows = successful_step_samples(
        trajectories_dir or run_dir / "trajectories", cfg.min_reward, cfg.max_samples
    )
    needed = max(cfg.min_samples, sft.trainer.samples_per_step)
    next_rl = f"rl-p{phase:02d}"
    if len(rows) < needed:
        return PhaseResult(
            phase=phase, checkpoint=str(rl_checkpoint), version=checkpoint_version(rl_checkpoint),
            skipped=True, reason=f"{len(rows)} successful samples < {needed}",
            num_samples=len(rows), sft_steps=0, elapsed_s=time.time() - t0,
            next_rl_run_name=next_rl,
        )  # fmt: skip
    samples = [sft_sample_from_step(r, source="entropulse") for r in rows]
    run_name = f"entropulse-p{phase:02d}"
    _set_aside_interrupted(run_dir / run_name)
    trainer = build_sft_trainer(
        sft, rl_checkpoint, {"train": ray.data.from_arrow(to_sft_table(samples))},
        publish_fn, run_dir, resume_from=rl_checkpoint, run_name=run_name,
    )  # fmt: skip
    result = trainer.fit()
    if result.error is not None or result.checkpoint is None:
        raise RuntimeError(f"Entropulse SFT phase {phase} failed: {result.error}")
    checkpoint = Path(result.checkpoint.path)
    return PhaseResult(
        phase=phase, checkpoint=str(checkpoint), version=checkpoint_version(checkpoint),
        skipped=False, reason=None, num_samples=len(rows), sft_steps=sft.trainer.max_steps,
        elapsed_s=time.time() - t0, next_rl_run_name=next_rl,
    )  # fmt: skip


def _set_aside_interrupted(folder: Path) -> None:
    """A phase folder without a recorded end belongs to a killed job: Ray Train would resume
    that old SFT run instead of starting from the new RL checkpoint."""
    if folder.exists():
        aside = folder.with_name(f"{folder.name}.interrupted-{int(time.time())}")
        log.warning("setting aside %s (an interrupted phase) as %s", folder, aside.name)
        folder.rename(aside)


class Entropulse:
    """Tracker + trigger + phases of one RL run (see the module docstring)."""

    def __init__(
        self,
        cfg: EntropulseConfig,
        run_dir: str | Path,
        rl_trainer: TrainerConfig,
        rl_optim: OptimConfig,
        metrics: Any = None,
        from_end: bool = True,
    ) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.rl_trainer, self.rl_optim = rl_trainer, rl_optim
        self.metrics = metrics  # anything with .write(dict), e.g. train_loops.jsonl.JsonlWriter
        self.tracker = EntropyTracker(
            self.run_dir / TRAIN_METRICS_FILE, cfg.metric, "rl", from_end=from_end
        )
        self.phases = self._phases_so_far()

    def _phases_so_far(self) -> int:
        path = self.run_dir / EVENTS_FILE
        if not path.exists():
            return 0
        ends = [line for line in path.read_text().splitlines() if '"entropulse/phase_end"' in line]
        return len(ends)

    def poll(self) -> Trigger | None:
        """Read new RL metrics; the trigger if a phase is due now."""
        if not self.cfg.enabled:
            return None
        self.tracker.poll()
        return should_trigger(self.cfg, self.tracker.values, self.phases)

    def run_phase(
        self,
        rl_checkpoint: str | Path,
        trigger: Trigger | None = None,
        publish_fn: Any = None,
        trajectories_dir: str | Path | None = None,
    ) -> PhaseResult:
        """Run the next SFT phase (events before and after); the tracker starts afresh."""
        index = self.phases + 1
        self._event(
            "entropulse/phase_start", index, 1.0, version=checkpoint_version(rl_checkpoint),
            reason=trigger.reason if trigger else "manual",
            entropy=trigger.entropy if trigger else None,
            rl_steps=trigger.rl_steps if trigger else len(self.tracker.values),
        )  # fmt: skip
        result = run_sft_phase(
            self.cfg, self.run_dir, rl_checkpoint, self.rl_trainer, self.rl_optim,
            phase=index, publish_fn=publish_fn, trajectories_dir=trajectories_dir,
        )  # fmt: skip
        self.phases = index
        self.tracker.poll()  # the SFT lines are skipped; RL counting starts again after them
        self.tracker.reset()
        self._event("entropulse/phase_end", index, 0.0, **_public(result))
        return result

    def _event(self, name: str, index: int, phase_value: float, **fields: Any) -> None:
        record = {
            "event": name,
            "time": time.time(),
            "entropulse/phase": phase_value,
            "entropulse/index": index,
            **{f"entropulse/{k}": v for k, v in fields.items()},
        }
        if "entropulse/version" in record:
            record["train/version"] = record["entropulse/version"]
        JsonlWriter(self.run_dir / EVENTS_FILE).write(record)
        if self.metrics is not None:
            self.metrics.write(record)
        log.info("%s %s", name, {k: v for k, v in record.items() if k != "event"})


def _public(result: PhaseResult) -> Mapping[str, Any]:
    return {k: v for k, v in asdict(result).items() if k != "phase"}
