"""Typed configuration of the trainers: loss, optimizer, Ray Train + DeepSpeed scaling.

Pydantic only (no torch, no ray) so the workflows' configs, ``--help`` and tests load fast.
Defaults are the production defaults of ../shared/METHOD.md (8 GPU workers, ZeRO-3, bf16,
AdamW lr 1e-6, betas (0.9, 0.95), weight decay 0.1, ε = ε_high = 0.2, β_KL 0.01, λ_SD 0.01,
gate β 5); :func:`cpu_trainer` gives the embedded CPU default (2 workers, ZeRO-2, fp32).
Values that METHOD.md does not fix say so in their description.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

SDType = Literal["gated", "off", "ungated", "hard", "continuous", "nogate", "nojudge"]


class LossConfig(BaseModel):
    """RL loss: GRPO-clip policy gradient + k3 reference KL + value-gated self-distillation.

    ``total = L_PG + kl_coef · KL + sd_coef · L_SD`` (METHOD.md §4–§5); every term is a
    per-sample token mean over response tokens, then a mean over samples.
    """

    model_config = ConfigDict(extra="forbid")

    clip_eps: float = Field(
        0.2, gt=0.0, lt=1.0, description="PPO clip ε: the ratio is clipped below at 1-ε."
    )
    clip_eps_high: float = Field(
        0.2, gt=0.0, description="PPO clip ε_high: the ratio is clipped above at 1+ε_high."
    )
    ratio_anchor: Literal["behaviour", "recomputed"] = Field(
        "behaviour",
        description=(
            "What the PPO ratio divides by. behaviour: the inference engine's sampling "
            "log-probs (METHOD.md §4; stale samples are clipped). recomputed: the trainer's "
            "own log-probs before the update, as the authors' slime setup recomputes them "
            "(ratio 1 with one update per batch; add tis_cap for a stale-sample correction)."
        ),
    )
    tis_cap: float | None = Field(
        None,
        ge=1.0,
        description=(
            "Truncated importance sampling cap C (needs ratio_anchor=recomputed): decoupled "
            "PPO, each token weighted by min(π_θ/π_behaviour, C). None: no weight."
        ),
    )
    kl_coef: float = Field(
        0.01, ge=0.0, description="β_KL of the k3 KL to the reference policy; 0 skips it."
    )
    kl_clamp: float = Field(
        10.0, gt=0.0, description="k3's log-ratio q = log π_ref - log π_θ is clamped to ±this."
    )
    sd_type: SDType = Field(
        "gated",
        description=(
            "Self-distillation variant: gated (METHOD.md §5), off (GRPO only), ungated "
            "(d=+1 everywhere), hard (g = 1[β·d·Δ>0]), continuous (× |2v-1|), nogate (g = 1, "
            "direction d kept), nojudge (direction +1 where d≠0, d=0 still masked)."
        ),
    )
    sd_coef: float = Field(0.01, ge=0.0, description="λ_SD, weight of the self-distillation loss.")
    gate_beta: float = Field(5.0, gt=0.0, description="β of the gate sigmoid(β·d·Δ).")

    @model_validator(mode="after")
    def _check(self) -> LossConfig:
        if self.tis_cap is not None and self.ratio_anchor == "behaviour":
            raise ValueError("tis_cap needs ratio_anchor='recomputed' (the ratio's anchor)")
        if self.sd_type != "off" and self.sd_coef == 0.0:
            raise ValueError("sd_coef=0 with sd_type!='off': say sd_type='off' to disable SD")
        return self

    @property
    def uses_reference(self) -> bool:
        """Whether the trainer must hold a frozen reference model."""
        return self.kl_coef > 0.0


class OptimConfig(BaseModel):
    """AdamW with a constant learning rate (METHOD.md production defaults)."""

    model_config = ConfigDict(extra="forbid")

    lr: float = Field(1e-6, gt=0.0, le=1.0, description="Learning rate (constant).")
    betas: tuple[float, float] = Field((0.9, 0.95), description="AdamW (β1, β2), each in [0, 1).")
    eps: float = Field(1e-8, gt=0.0, description="AdamW ε (not in METHOD.md; PyTorch default).")
    weight_decay: float = Field(
        0.1, ge=0.0, description="Decoupled weight decay; not applied to biases and norms."
    )
    grad_clip: float | None = Field(
        1.0, gt=0.0, description="Global gradient-norm clip; None disables (not in METHOD.md)."
    )

    @model_validator(mode="after")
    def _check(self) -> OptimConfig:
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas must lie in [0, 1), got {self.betas}")
        return self


class TrainerConfig(BaseModel):
    """How the Ray Train ``TorchTrainer`` + DeepSpeed run is laid out and paced.

    One optimizer step consumes ``samples_per_step`` samples, split evenly over the workers
    and, on each worker, into micro-batches of ``micro_batch_size`` (gradient accumulation).
    """

    model_config = ConfigDict(extra="forbid")

    num_workers: int = Field(8, ge=1, description="Ray Train workers (data-parallel ranks).")
    use_gpu: bool = Field(True, description="One GPU per worker; False: CPU workers over gloo.")
    cpus_per_worker: float = Field(
        1.0, gt=0.0, description="Ray CPUs reserved per worker (sets its torch threads)."
    )
    zero_stage: Literal[0, 1, 2, 3] = Field(
        3, description="DeepSpeed ZeRO stage; ≤ 2 on CPU (stage 3 needs a GPU)."
    )
    dtype: Literal["fp32", "bf16"] = Field(
        "bf16", description="Training dtype (fp32 master weights kept by DeepSpeed under bf16)."
    )
    cpu_autocast: Literal["off", "bf16"] = Field(
        "off",
        description="CPU only: run forward and backward under bf16 autocast (fp32 weights, "
        "optimizer and log-softmax). About 1.5x the fp32 speed where the CPU has native bf16 "
        "(AVX512-BF16/AMX); fp32 with a warning where it has not. For SFT: RL's ratios "
        "compare these log-probs with the fp32 serving engine's.",
    )
    samples_per_step: int = Field(
        64,
        ge=1,
        description="Samples per optimizer step, all workers together (our choice); with "
        "schedule=rollout_batch only DeepSpeed's starting batch size.",
    )
    schedule: Literal["fixed", "rollout_batch"] = Field(
        "fixed",
        description="fixed: every step takes samples_per_step rows of the split 'train' "
        "dataset. rollout_batch (the authors'): every step is one rollout batch, whatever "
        "its size: rank r reads its part of it from the 'train_rank<r>' dataset (parts padded "
        "to whole micro-batches with zero-weight rows; a batch left empty is not dealt: no step).",
    )
    updates_per_batch: int = Field(
        1,
        ge=1,
        description="With schedule=rollout_batch: optimizer updates taken on each rollout "
        "batch (PPO epochs; the authors take 1). Later updates reuse the batch off-policy, so "
        "the ratio must be anchored on the behaviour log-probs, whose clip bounds the move.",
    )
    micro_batch_size: int = Field(
        1, ge=1, description="Samples per forward/backward on one worker (our choice)."
    )
    sort_by_length: bool = Field(
        True,
        description="fixed schedule: a worker orders its rows of a step by token count before "
        "cutting micro-batches, so rows of like length share one and less padding is "
        "computed. The loss is a mean over samples, so the step's gradient is the same.",
    )
    max_steps: int = Field(
        1000, ge=1, description="Stop when the step counter reaches this (counted across resumes)."
    )
    checkpoint_every: int = Field(
        50, ge=1, description="Save a checkpoint every N optimizer steps (and at the end)."
    )
    keep_checkpoints: int | None = Field(
        3, ge=1, description="Checkpoints kept by Ray Train; None keeps all."
    )
    publish_every: int = Field(
        1,
        ge=1,
        description="Hand the weights to the publisher every N optimizer steps; each hand-off "
        "is the next weight version (versions count publications, not steps).",
    )
    report_every: int = Field(
        1, ge=1, description="Consider ray.train.report only on every N-th step."
    )
    report_interval_s: float = Field(
        10.0,
        ge=0.0,
        description=(
            "Besides report_every, report only if this long has passed since the last report "
            "(rank 0's clock, agreed by all ranks). ray.train.report is a barrier and Ray Train V2 takes one report per "
            "controller poll (~2 s), so reporting every fast step would stall training. "
            "Checkpoints are always reported; train_metrics.jsonl gets every step."
        ),
    )
    cycle_data: bool = Field(
        False,
        description=(
            "When a bounded dataset ends, start another pass (SFT epochs). False: the run "
            "stops at the end of the data. An unbounded stream never ends either way."
        ),
    )
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in backward (saves memory on large models)."
    )
    seed: int = Field(0, description="Seed of torch on every worker.")
    cpu_affinity: list[int] | None = Field(
        None,
        description="CPU cores the workers are pinned to (None: no pinning). Keeps training "
        "and serving on disjoint cores of one machine, as they are on disjoint GPUs in production.",
    )
    max_failures: int = Field(
        0, ge=-1, description="Worker-group restarts Ray Train allows (-1: unlimited)."
    )

    @model_validator(mode="after")
    def _check(self) -> TrainerConfig:
        per_round = self.num_workers * self.micro_batch_size
        if self.samples_per_step % per_round:
            raise ValueError(
                f"samples_per_step={self.samples_per_step} must be a multiple of "
                f"num_workers*micro_batch_size={per_round} so that every micro-batch is full "
                "and the per-sample mean stays exact"
            )
        if self.updates_per_batch > 1 and self.schedule != "rollout_batch":
            raise ValueError(
                f"updates_per_batch={self.updates_per_batch} needs schedule='rollout_batch' "
                f"(got {self.schedule!r}): a fixed-schedule step has no batch to revisit"
            )
        if not self.use_gpu and self.zero_stage == 3:
            raise ValueError("zero_stage=3 needs GPUs; use zero_stage<=2 with use_gpu=False")
        if not self.use_gpu and self.dtype != "fp32":
            raise ValueError("CPU training runs in fp32; set dtype='fp32' with use_gpu=False")
        if self.use_gpu and self.cpu_autocast != "off":
            raise ValueError("cpu_autocast is for use_gpu=False; on GPUs set dtype='bf16'")
        return self

    @property
    def samples_per_worker(self) -> int:
        """Samples one worker consumes per optimizer step."""
        return self.samples_per_step // self.num_workers

    @property
    def grad_accum_steps(self) -> int:
        """Micro-batches per worker per optimizer step."""
        return self.samples_per_worker // self.micro_batch_size


def cpu_trainer(**overrides: object) -> TrainerConfig:
    """The embedded CPU layout: 2 workers, ZeRO-2, fp32, small batches."""
    base: dict[str, object] = {
        "num_workers": 2,
        "use_gpu": False,
        "zero_stage": 2,
        "dtype": "fp32",
        "samples_per_step": 8,
        "micro_batch_size": 2,
        "checkpoint_every": 20,
    }
    base.update(overrides)
    return TrainerConfig.model_validate(base)


class RLTrainConfig(BaseModel):
    """Everything the RL trainer needs besides the model path, data and callbacks."""

    model_config = ConfigDict(extra="forbid")

    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    ref_model_path: str | None = Field(
        None, description="Frozen reference policy for the KL; None: the initial model_path."
    )


class SFTTrainConfig(BaseModel):
    """The SFT trainer (analyzer SFT, Entropulse phases): cross-entropy on target tokens."""

    model_config = ConfigDict(extra="forbid")

    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    optim: OptimConfig = Field(
        default_factory=lambda: OptimConfig(lr=1e-5),
        description="Optimizer; lr 1e-5 by default (our choice, not in METHOD.md).",
    )
