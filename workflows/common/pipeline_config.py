"""The config of the offline commands: the GUI-analyzer pipeline (collect → annotate → train)
and evaluation, one file for all four (``workflows/configs/analyzer_pipeline.yaml``).

Pydantic only (no torch/ray), like :mod:`workflows.online_rl.config`: ``--help``,
``--print-config`` and tests load fast. Commands: ``python -m workflows.analyzer.{collect,
annotate,train}`` and ``python -m workflows.evaluation``; each reads its own section.
Method: ../shared/METHOD.md §2 (judgments), §6 (analyzer training), §8 (eval).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from env_client.config import EnvClientConfig
from env_client.tasks.sources import TaskSourceConfig
from serve_apps.config import AnalyzerAppConfig, PolicyAppConfig, SamplingConfig
from train_loops.config import OptimConfig, TrainerConfig, cpu_trainer
from workflows.common.ray_cluster import RayClusterConfig
from workflows.common.tracking import TrackingConfig

TRAINED_ANALYZER = "auto"
"""``analyzer.model_path: auto`` = the checkpoint ``train_analyzer`` writes for this run."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CollectConfig(_Strict):
    """Episodes of the base policy (and optionally scripted ones) whose transitions get judged."""

    split: str = Field("train", description="Task split episodes are drawn from.")
    tasks: list[str] | None = Field(
        None, description="Task names to use (None: every task of the split)."
    )
    seeds_per_task: int = Field(
        4, ge=1, description="Task instances (seeds) per task name, the split's first seeds."
    )
    policy_episodes: int = Field(
        1, ge=0, description="Episodes of the base policy per task instance (0: no Serve app)."
    )
    expert_episodes: int = Field(
        0, ge=0, description="Scripted expert episodes per instance (good transitions, score 1)."
    )
    wrong_episodes: int = Field(
        0, ge=0, description="Scripted plausible-mistake episodes per instance (score 0)."
    )
    mismatch_episodes: int = Field(
        0,
        ge=0,
        description="Scripted episodes whose stated intention names another element than the "
        "expert action they execute (inconsistent but effective steps).",
    )
    max_steps: int = Field(30, ge=1, le=200, description="Step limit per episode (METHOD: 30).")
    history_screens: int = Field(3, ge=1, description="Screenshots in the policy context (H).")
    pause_s: float = Field(0.0, ge=0, description="Pause after each action before observing.")
    concurrency: int = Field(4, ge=1, description="Episodes played at once.")
    episode_retries: int = Field(
        2, ge=0, description="Retries of an episode on a fresh session after an env failure."
    )
    ground_truth: bool = Field(
        True,
        description="Store the environment's ground truth before/after each step (embedded "
        "server's /debug; needed by the oracle expert). Servers without it store null.",
    )
    episodes_per_shard: int = Field(
        16, ge=1, description="Episodes per Parquet shard (a killed run keeps whole shards)."
    )

    @model_validator(mode="after")
    def _some_episodes(self) -> CollectConfig:
        sources = (
            self.policy_episodes,
            self.expert_episodes,
            self.wrong_episodes,
            self.mismatch_episodes,
        )
        if not any(sources):
            raise ValueError("collect plays no episodes: set policy_episodes or *_episodes > 0")
        return self


class OracleExpertConfig(_Strict):
    """Judgments computed from the embedded environment's ground truth (no model involved)."""

    type: Literal["oracle"] = "oracle"


class OpenAIExpertConfig(_Strict):
    """Any OpenAI-compatible chat endpoint (``POST {base_url}/chat/completions``)."""

    type: Literal["openai"] = "openai"
    base_url: str | None = Field(
        default_factory=lambda: os.environ.get("OPENAI_BASE_URL") or None,
        description="API base including /v1 (default env OPENAI_BASE_URL).",
    )
    model: str = Field(
        default_factory=lambda: os.environ.get("ANNOTATOR_MODEL", ""),
        description="Model name sent in each request (default env ANNOTATOR_MODEL).",
    )
    api_key_env: str | None = Field(
        "OPENAI_API_KEY",
        description="Environment variable holding the API key (never stored in configs); "
        "None or unset: no Authorization header.",
    )
    concurrency: int = Field(8, ge=1, le=512, description="Requests in flight at once.")
    max_retries: int = Field(
        6, ge=0, le=50, description="Retries of 408/409/429/5xx answers and transport errors."
    )
    backoff_base_s: float = Field(1.0, gt=0, description="First retry delay (doubles per try).")
    backoff_cap_s: float = Field(60.0, gt=0, description="Largest retry delay, seconds.")
    timeout_s: float = Field(120.0, gt=0, description="One request's timeout, seconds.")
    invalid_retries: int = Field(
        1, ge=0, le=5, description="New requests when an answer does not validate."
    )
    temperature: float = Field(0.0, ge=0, le=2, description="Sampling temperature.")
    max_tokens: int = Field(512, ge=16, description="max_tokens of each request.")
    full_system_prompt: bool = Field(
        True, description="Detailed analyzer instructions (a strong model benefits from them)."
    )

    @model_validator(mode="after")
    def _endpoint(self) -> OpenAIExpertConfig:
        if not self.base_url:
            raise ValueError("expert.base_url is not set (or set OPENAI_BASE_URL)")
        if not self.model:
            raise ValueError("expert.model is not set (or set ANNOTATOR_MODEL)")
        return self


ExpertConfig = Annotated[OracleExpertConfig | OpenAIExpertConfig, Field(discriminator="type")]


class AnnotateConfig(_Strict):
    """Label every collected transition with the analyzer JSON of METHOD.md §2."""

    expert: ExpertConfig = Field(default_factory=OracleExpertConfig, description="By `type`.")
    retry_rejects: bool = Field(
        False, description="On a rerun, annotate again the transitions rejected before."
    )
    max_text_chars: int = Field(
        400, ge=20, description="Longest guide/avoid text accepted (longer is a reject)."
    )
    limit: int | None = Field(None, ge=1, description="Annotate at most this many (tests, trials).")


class AnalyzerTrainConfig(_Strict):
    """SFT of the analyzer from the base policy on the annotations (METHOD.md §6)."""

    base_model: str | None = Field(
        None, description="Initial weights; None: the base policy (policy.model_path)."
    )
    holdout_frac: float = Field(
        0.2, ge=0.0, lt=1.0, description="Share of episodes held out for the agreement report."
    )
    epochs: float = Field(3.0, gt=0, description="Passes over the training annotations.")
    max_steps: int | None = Field(
        None, ge=1, description="Optimizer steps; None: derived from epochs and the data size."
    )
    target_prefix: str = Field(
        "",
        description="Text before the JSON in the target (e.g. '</think>\\n\\n' for chat "
        "templates that open a thinking block in the generation prompt).",
    )
    verdict_weight: float = Field(
        1.0,
        ge=1.0,
        le=1000.0,
        description="Weight of the consistency and effectiveness digits in each answer's token "
        "mean (1: a plain mean, where the two tokens the gate reads are ~4% of a 50-token "
        "answer and the guide text dominates the loss).",
    )
    trainer: TrainerConfig = Field(
        default_factory=lambda: cpu_trainer(checkpoint_every=1000),
        description="Ray Train + DeepSpeed layout; max_steps is replaced by the derived one.",
    )
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=1e-5))
    resume: bool = Field(
        False, description="Continue the previous fit of this run instead of starting fresh."
    )
    eval_limit: int | None = Field(
        None, ge=1, description="Held-out transitions judged for the report (None: all)."
    )
    eval_concurrency: int = Field(8, ge=1, description="Analyzer requests in flight.")


class CheckpointSpec(_Strict):
    """One policy to evaluate."""

    name: str = Field(min_length=1, description="Label in tables and charts.")
    path: str = Field(min_length=1, description="Checkpoint folder or 'tiny:<seed>'.")


class EvaluateConfig(_Strict):
    """Pass@1 over an eval split (METHOD.md §8)."""

    checkpoints: list[CheckpointSpec] = Field(
        default_factory=lambda: [CheckpointSpec(name="base", path="tiny:0")],
        min_length=1,
        description="Policies compared in one report.",
    )
    split: str = Field("eval", description="Task split.")
    tasks: list[str] | None = Field(None, description="Task names (None: all of the split).")
    seeds_per_task: int | None = Field(
        None, ge=1, description="Instances per task name (None: all seeds of the split)."
    )
    runs: int = Field(3, ge=1, le=20, description="Independent runs (METHOD: 3).")
    max_steps: int = Field(50, ge=1, le=50, description="Step limit per episode (METHOD: ≤ 50).")
    history_screens: int = Field(3, ge=1, description="Screenshots in the policy context (H).")
    pause_s: float = Field(0.0, ge=0, description="Pause after each action before observing.")
    temperature: float | None = Field(
        None, ge=0, le=10, description="Sampling temperature; None: the deployment's default."
    )
    concurrency: int = Field(4, ge=1, description="Episodes played at once.")
    episode_retries: int = Field(2, ge=0, description="Retries of an episode after env failures.")
    reference_expert: bool = Field(
        False,
        description="Add the scripted expert as a reference column (embedded environment "
        "only): a sanity check of the harness, near 100%.",
    )
    out_name: str = Field("eval", description="Report folder under the run folder.")

    @model_validator(mode="after")
    def _unique_names(self) -> EvaluateConfig:
        names = [c.name for c in self.checkpoints]
        if len(set(names)) != len(names):
            raise ValueError(f"checkpoint names must be unique, got {names}")
        return self


class PipelineConfig(_Strict):
    """collect → annotate → train_analyzer, and evaluate (one YAML file for all four)."""

    run_name: str = Field("analyzer-pipeline", description="Run folder name under runs_dir.")
    runs_dir: str = Field("runs", description="Where run folders are written.")
    seed: int = Field(0, description="Seed of task order, splits and sampling seeds.")
    serve_http_port: int = Field(
        8000, ge=1, le=65535, description="Ray Serve HTTP port (OpenAI endpoints)."
    )
    ray: RayClusterConfig = Field(default_factory=RayClusterConfig)
    env: EnvClientConfig = Field(
        default_factory=EnvClientConfig,
        description="Environment service; server_url None starts the embedded server.",
    )
    policy: PolicyAppConfig = Field(
        default_factory=lambda: PolicyAppConfig(
            model_path="tiny:0", sampling=SamplingConfig(max_new_tokens=48)
        ),
        description="The base policy deployment (collect); its model_path is also the "
        "analyzer's initial weights. 'tiny:<seed>' builds a tiny model offline.",
    )
    analyzer: AnalyzerAppConfig = Field(
        default_factory=lambda: AnalyzerAppConfig(model_path=TRAINED_ANALYZER),
        description="Analyzer deployment for the agreement report; model_path 'auto' is the "
        "checkpoint this run trains. Prompt settings here are also used to build SFT samples.",
    )
    collect: CollectConfig = Field(default_factory=CollectConfig)
    annotate: AnnotateConfig = Field(default_factory=AnnotateConfig)
    train: AnalyzerTrainConfig = Field(default_factory=AnalyzerTrainConfig)
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig)
    tracking: TrackingConfig = Field(
        default_factory=TrackingConfig,
        description="Where evaluate logs its tables and scores (TensorBoard by default).",
    )
    task_source: TaskSourceConfig = Field(
        default_factory=TaskSourceConfig,
        description="Tasks of collect and evaluate: the embedded MiniWoB list or OSWorld task "
        "files (e.g. the built-in desktop set with env.embedded.backend=desktop). The oracle "
        "annotator and collect's wrong/mismatch episodes need MiniWoB's ground truth.",
    )

    @model_validator(mode="after")
    def _trainable_prompt(self) -> PipelineConfig:
        if self.analyzer.prompt_style == "reference":
            raise ValueError(
                "analyzer.prompt_style='reference': collect stores no history screens, so the "
                "pipeline trains and judges the compact or minimal prompt only"
            )
        return self

    @property
    def run_dir(self) -> Path:
        return Path(self.runs_dir).expanduser().resolve() / self.run_name
