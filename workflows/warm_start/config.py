"""The warm start's config (pydantic; no torch/ray): what is built and how, and its cache key.

Everything that changes the result is in :meth:`WarmStartConfig.digest`; where it runs (Ray
settings, environment server size, cache folder) is not, so one cached warm start serves every
machine that asks for the same thing.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from env_client.config import EnvClientConfig
from train_loops.config import OptimConfig, TrainerConfig, cpu_trainer
from workflows.common.config_io import load_config
from workflows.common.ray_cluster import RayClusterConfig
from workflows.common.tiny_models import TinyModelSpec

WARM_PREFIX = "warm:"
DEFAULT_CONFIG = "warm_start"


def is_warm(model_path: str) -> bool:
    """``warm:<seed>`` in a model_path: the cached warm start of that seed (built on first use)."""
    return model_path.startswith(WARM_PREFIX)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def warm_model_spec(seed: int = 0) -> TinyModelSpec:
    """The warm-start architecture: Qwen3-VL, ~4.6M parameters, a tokenizer that knows the
    elements style, a small screenshot (~6 image tokens)."""
    return TinyModelSpec(
        seed=seed, vocab_size=2048, hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2,
        intermediate_size=768, vision_hidden_size=64, vision_depth=1,
        min_pixels=32 * 32, max_pixels=64 * 96, corpus="elements",
    )  # fmt: skip


class DemoConfig(_Strict):
    """Scripted demonstrations on the embedded environment (behaviour-cloning data)."""

    split: str = Field("train", description="Task split the demonstrations come from.")
    seeds_per_task: int = Field(
        40, ge=1, description="Task instances per task name (the split's first seeds)."
    )
    recover: bool = Field(
        True,
        description="Also play the scripted plausible mistake first, then the expert from "
        "there: states with a mistake on the page and in the history.",
    )
    max_steps: int = Field(6, ge=1, le=30, description="Step limit per demonstration.")
    concurrency: int = Field(4, ge=1, description="Episodes played at once.")


class BCConfig(_Strict):
    """Behaviour cloning (SFT on the expert's answers) through the project's SFT loop."""

    privileged_frac: float = Field(
        1.0,
        ge=0,
        le=1,
        description="States that also get a privileged twin: the guidance block (guide = the "
        "expert's answer) appended, same target, so the policy learns to use guidance.",
    )
    blind_frac: float = Field(
        0.6,
        ge=0,
        le=1,
        description="Of the privileged twins, the share whose task line is the task's generic "
        "description: only the guidance says which element, so it must be read.",
    )
    follow_frac: float = Field(
        1.0,
        ge=0,
        le=1,
        description="States that also get a *follow* twin: generic task line, guidance naming a "
        "random listed element, that element as the target. The page alone cannot predict it, "
        "so these teach what a privileged context is for: do what the guidance says.",
    )
    heldout_frac: float = Field(
        0.1, ge=0, lt=1, description="Demonstration episodes kept out for the guidance gap."
    )
    steps: int = Field(250, ge=1, description="Optimizer steps (the loss is flat from ~250).")
    trainer: TrainerConfig = Field(
        # ZeRO-0: at 4.6M parameters the optimizer state is ~70 MB, so sharding it saves
        # nothing and its extra collectives cost time (BC step 0.99 s vs 1.11 s under ZeRO-2).
        default_factory=lambda: cpu_trainer(
            zero_stage=0,
            samples_per_step=16,
            micro_batch_size=4,
            checkpoint_every=100_000,
            report_every=50,
            cpu_autocast="bf16",
        ),
        description="Ray Train + DeepSpeed layout; max_steps is set from `steps`.",
    )
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=1e-3, weight_decay=0.0))


class CheckConfig(_Strict):
    """How the built policy is checked: sampled success on training tasks."""

    seeds_per_task: int = Field(5, ge=1, description="Task instances per task name.")
    seed_offset: int = Field(
        150, ge=0, description="First seed of the check (past the demonstrations' seeds)."
    )
    temperature: float = Field(1.0, ge=0, le=10, description="Sampling temperature (RL's).")
    max_steps: int = Field(6, ge=1, le=50, description="Step limit per episode.")


class AnalyzerBuildConfig(_Strict):
    """The analyzer, trained from the warm policy by the analyzer pipeline (METHOD.md §6)."""

    seeds_per_task: int = Field(8, ge=1, description="Task instances collected per task name.")
    policy_episodes: int = Field(2, ge=0, description="Warm-policy episodes per instance.")
    expert_episodes: int = Field(1, ge=0, description="Scripted expert episodes per instance.")
    wrong_episodes: int = Field(1, ge=0, description="Scripted mistake episodes per instance.")
    epochs: float = Field(12.0, gt=0, description="SFT passes over the annotations.")
    lr: float = Field(1e-3, gt=0, description="SFT learning rate.")
    cpu_autocast: Literal["off", "bf16"] = Field(
        "bf16", description="The SFT's trainer.cpu_autocast (bf16: ~1.5x faster on CPUs with bf16)."
    )
    zero_stage: Literal[0, 1, 2] = Field(
        0, description="The SFT's trainer.zero_stage (0: nothing to shard at this model size)."
    )
    prompt_style: Literal["compact", "minimal"] = Field(
        "minimal",
        description="The analyzer's prompt, in its SFT samples and in the job (which reads it "
        "from the build). minimal: half compact's tokens, so twice the SFT steps in the time.",
    )
    verdict_weight: float = Field(
        1.0,
        ge=1.0,
        le=1000.0,
        description="The SFT's train.verdict_weight: weight of the consistency/effectiveness "
        "digits in each answer's token mean. 1 (a plain mean): weights 10 and 30 helped on one "
        "build's data and hurt on another's (README, the warm start).",
    )


class WarmStartConfig(_Strict):
    """``python -m workflows.warm_start``: demonstrations → BC policy → check → analyzer."""

    seed: int = Field(0, description="Seed of the weights, data order and sampling.")
    tasks: list[str] | None = Field(
        None, min_length=1, description="Task names taught and checked (None: every task)."
    )
    cache_dir: str | None = Field(
        None, description="Where warm starts are cached (None: $CSD_CACHE or ~/.cache/computersd)."
    )
    model: TinyModelSpec | None = Field(
        None, description="Policy architecture (None: warm_model_spec(seed))."
    )
    demos: DemoConfig = Field(default_factory=DemoConfig)
    bc: BCConfig = Field(default_factory=BCConfig)
    check: CheckConfig = Field(default_factory=CheckConfig)
    analyzer: AnalyzerBuildConfig = Field(default_factory=AnalyzerBuildConfig)
    ray: RayClusterConfig = Field(default_factory=RayClusterConfig)
    env: EnvClientConfig = Field(
        default_factory=EnvClientConfig,
        description="Environment service; server_url None starts the embedded server.",
    )

    @property
    def model_spec(self) -> TinyModelSpec:
        return self.model or warm_model_spec(self.seed)

    def digest(self) -> str:
        """Cache key: everything that changes what is built (not where or how fast)."""
        what = self.model_dump(mode="json", exclude={"cache_dir", "ray", "env"})
        what["model"] = self.model_spec.model_dump(mode="json")
        what["demos"].pop("concurrency")
        # RL-only (rollout batches); an SFT run never reads it, and adding it must not
        # invalidate the warm starts already built.
        what["bc"]["trainer"].pop("updates_per_batch")
        blob = json.dumps(what, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    @property
    def folder(self) -> Path:
        root = self.cache_dir or os.environ.get("CSD_CACHE") or Path.home() / ".cache/computersd"
        return Path(root).expanduser() / f"warm-{self.seed}-{self.digest()}"


def load(config: str = DEFAULT_CONFIG, overrides: list[str] | None = None) -> WarmStartConfig:
    """A warm-start config file (bundled name or path) with ``key.sub=value`` overrides."""
    return load_config(WarmStartConfig, config, overrides or [])
