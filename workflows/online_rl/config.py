"""The online RL job's config (pydantic; no torch/ray imports, so ``--help`` is fast).

Each component owns its config model in its own package; the job config composes them. Files
live in ``workflows/configs/`` and are loaded by :func:`workflows.common.config_io.load_config`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from env_client.config import EnvClientConfig
from env_client.tasks.sources import TaskSourceConfig
from serve_apps.config import AnalyzerAppConfig, PolicyAppConfig
from train_loops.config import LossConfig, OptimConfig, TrainerConfig
from workflows.common.ray_cluster import RayClusterConfig
from workflows.common.tracking import TrackingConfig


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EntropulseConfig(_Strict):
    """Entropulse (METHOD.md §7): when the policy's token entropy collapses during RL (or on a
    schedule), a short SFT phase on the successful trajectories so far, then RL resumes."""

    enabled: bool = Field(False, description="Off: RL never pauses for SFT phases.")
    trigger: Literal["threshold", "schedule"] = Field(
        "threshold", description="threshold: smoothed entropy below `threshold`; schedule: "
        "every `every_rl_steps` RL steps.",
    )  # fmt: skip
    metric: str = Field("policy/entropy", description="Trainer metric tracked (per RL step).")
    threshold: float = Field(0.3, ge=0, description="Entropy (nats/token) that triggers a phase.")
    window: int = Field(5, ge=1, description="RL steps averaged before comparing to threshold.")
    min_rl_steps: int = Field(
        10, ge=1, description="RL steps after the start or a phase before the next may trigger."
    )
    every_rl_steps: int = Field(100, ge=1, description="Phase period for trigger='schedule'.")
    max_phases: int | None = Field(None, ge=1, description="Most SFT phases in one run.")
    sft_steps: int = Field(20, ge=1, description="Optimizer steps of one SFT phase.")
    lr: float | None = Field(
        1e-5, gt=0, le=1, description="SFT learning rate; None: the RL optimizer's."
    )
    min_samples: int = Field(
        8, ge=1, description="Fewer successful step samples than this: the phase is skipped."
    )
    max_samples: int | None = Field(
        4096, ge=1, description="Most recent successful step samples used (None: all)."
    )
    min_reward: float = Field(
        0.0, description="Step samples with reward > this are successes (METHOD: r = +1)."
    )


class RolloutConfig(_Strict):
    """How episodes are played (METHOD.md §1–§4)."""

    group_size: int = Field(8, ge=2, description="Episodes per task (G); GRPO needs ≥ 2.")
    num_workers: int = Field(2, ge=1, description="RolloutWorker actors.")
    groups_in_flight_per_worker: int = Field(
        2, ge=1, description="Groups each worker plays concurrently (episodes = groups × G)."
    )
    train_split: str = Field("train", description="Task split the rollouts draw from.")
    tasks: list[str] | None = Field(
        None, min_length=1, description="Task names to train on (None: every task of the split)."
    )
    max_steps: int = Field(30, ge=1, le=200, description="Step limit per training episode.")
    history_screens: int = Field(3, ge=1, description="Screenshots kept in the context (H).")
    pause_s: float = Field(0.5, ge=0, description="Pause after each action before observing.")
    episode_retries: int = Field(
        2, ge=0, description="Retries of an episode on a fresh session after an env failure."
    )
    serve_retry_s: float = Field(
        120.0,
        ge=0,
        description="How long a policy request is retried while its replica is down (Serve "
        "restarts a dead replica, which loads the latest weights); past it the group is dropped.",
    )
    use_analyzer: bool = Field(
        True, description="Judge each transition; off → d=0 everywhere (plain GRPO)."
    )
    worker_num_cpus: float = Field(0.25, ge=0, description="Logical CPUs per RolloutWorker.")
    task_order: Literal["round_robin", "informative"] = Field(
        "round_robin",
        description="round_robin: every task in turn. informative: pass over a task whose last "
        "`saturation_window` groups all had equal rewards (no GRPO signal), except in "
        "a share `explore` of the groups (workflows/online_rl/curriculum.py).",
    )
    saturation_window: int = Field(
        2, ge=1, description="Consecutive all-equal-reward groups that make a task saturated."
    )
    explore: float = Field(
        0.2, ge=0.0, le=1.0, description="Share of groups that keep the plain round-robin task."
    )
    fixed_guidance_file: str | None = Field(
        None,
        description="Ablation (the authors' GUI_GUIDANCE_FILE): guidance per task id and step "
        "from this JSON file instead of the analyzer (workflows/online_rl/fixed_guidance.py).",
    )
    max_groups: int | None = Field(
        None,
        ge=1,
        description="Rollout budget: no group starts after this many (over resumes too); the "
        "trainer trains on the rest and the job ends. None: trainer.max_steps alone ends it.",
    )
    preflight: bool = Field(
        True,
        description="Before starting, reset one session with the first task: a service that "
        "refuses the task source (e.g. OSWorld tasks sent to the MiniWoB server) fails the job "
        "at once with the server's reason, instead of every group failing.",
    )
    overlap_judging: bool = Field(
        True,
        description="Judge and rescore each step alongside the episode's next steps (the next "
        "action never depends on them); off: each step waits for them (the old sequential "
        "loop, kept as the benchmarks' baseline). Rows are the same either way.",
    )
    score_ordinary: bool = Field(
        False,
        description="Also rescore y under the ordinary context (one more prefill per step) "
        "for the sd/guidance_gap diagnostic; off: ordinary_logprobs are the behaviour "
        "log-probs from generation (METHOD §3 needs only the privileged rescoring).",
    )


class BufferConfig(_Strict):
    """The trajectory buffer between rollouts and the trainer."""

    capacity_samples: int = Field(
        512, ge=1, description="Samples held before producers wait (backpressure)."
    )
    max_staleness: int = Field(
        1, ge=0, description="A group may start only if trainer version − its version ≤ this."
    )
    drop_zero_gradient: bool = Field(
        False,
        description="Drop step samples that carry no gradient: advantage 0 (an all-equal-reward "
        "group) and no active self-distillation target (sd off, d = 0 or no guidance). The "
        "authors' trainer drops them; counted as buffer/samples_dropped_zero_grad.",
    )
    groups_per_batch: int = Field(
        4,
        ge=1,
        description="With trainer.schedule=rollout_batch: completed groups per rollout batch, "
        "i.e. per optimizer step (the authors': 4 tasks x 8 episodes = 4 groups of 8).",
    )


class OnlineRLConfig(_Strict):
    """The fully asynchronous online RL job (``python -m workflows.online_rl``)."""

    run_name: str = Field("online-rl", description="Name of the run folder under runs_dir.")
    runs_dir: str = Field("runs", description="Where run folders are written.")
    seed: int = Field(0, description="Seed for task order and sampling.")
    mode: Literal["async", "sync"] = Field(
        "async", description="async: rollouts overlap training; sync: rollout → train → publish."
    )
    resume: bool = Field(True, description="Continue from the run folder's latest checkpoint.")
    progress_every_s: float = Field(10.0, gt=0, description="Console progress line period.")
    keep_serving: bool = Field(
        False, description="Leave the policy/analyzer Serve apps up after the job (demos)."
    )
    serve_http_port: int = Field(
        8000, ge=1, le=65535, description="Ray Serve HTTP port (demo, OpenAI)."
    )
    ray: RayClusterConfig = Field(default_factory=RayClusterConfig)
    env: EnvClientConfig = Field(
        default_factory=EnvClientConfig,
        description="Environment service; server_url None starts the embedded server (env.embedded).",
    )
    policy: PolicyAppConfig = Field(
        description="Policy deployment; model_path 'tiny:<seed>' builds a random tiny model offline, "
        "'warm:<seed>' the cached warm start (python -m workflows.warm_start)."
    )
    analyzer: AnalyzerAppConfig = Field(
        description="Analyzer deployment; model_path 'tiny:<seed>' builds a random tiny model offline, "
        "'warm:<seed>' the analyzer trained with that warm start."
    )
    task_source: TaskSourceConfig = Field(
        default_factory=TaskSourceConfig,
        description="Where tasks come from: the embedded MiniWoB++ list or OSWorld task files.",
    )
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    buffer: BufferConfig = Field(default_factory=BufferConfig)
    trainer: TrainerConfig = Field(
        default_factory=lambda: TrainerConfig(
            num_workers=2,
            use_gpu=False,
            zero_stage=2,
            dtype="fp32",
            samples_per_step=8,
            micro_batch_size=2,
        )
    )
    loss: LossConfig = Field(default_factory=LossConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    tracking: TrackingConfig = Field(
        default_factory=TrackingConfig,
        description="TensorBoard (default) and optional W&B / MLflow; a resumed run continues.",
    )
    entropulse: EntropulseConfig = Field(
        default_factory=EntropulseConfig,
        description="SFT phases on successful trajectories when entropy collapses (METHOD §7).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> OnlineRLConfig:
        if self.buffer.capacity_samples < self.trainer.samples_per_step:
            raise ValueError(
                f"buffer.capacity_samples={self.buffer.capacity_samples} is smaller than "
                f"trainer.samples_per_step={self.trainer.samples_per_step}: the trainer would wait forever"
            )
        backend = self.env.embedded.backend
        embedded = not self.env.server_url
        if self.task_source.kind == "osworld" and embedded and backend != "desktop":
            raise ValueError(
                f"task_source.kind={self.task_source.kind!r} needs env.server_url (an OSWorld "
                "service) or env.embedded.backend=desktop: the embedded server's default backend "
                "runs MiniWoB tasks only"
            )
        if self.task_source.kind == "miniwob" and embedded and backend == "desktop":
            raise ValueError(
                "env.embedded.backend=desktop plays OSWorld-format tasks: set task_source.kind="
                "osworld (e.g. the built-in set, --config embedded_desktop)"
            )
        if self.trainer.updates_per_batch > 1 and self.loss.ratio_anchor != "behaviour":
            raise ValueError(
                f"trainer.updates_per_batch={self.trainer.updates_per_batch} needs "
                f"loss.ratio_anchor='behaviour' (got {self.loss.ratio_anchor!r}): a recomputed "
                "anchor restarts the ratio at 1 on every update, so nothing would bound them"
            )
        if self.rollout.history_screens > self.policy.max_images:
            raise ValueError(
                f"rollout.history_screens={self.rollout.history_screens} exceeds "
                f"policy.max_images={self.policy.max_images}"
            )
        return self

    @property
    def run_dir(self) -> Path:
        return Path(self.runs_dir).expanduser().resolve() / self.run_name
