"""The analyzer pipeline's config for a warm start: collect from the warm policy (elements
style) and scripted episodes, annotate with the oracle, SFT the analyzer from the policy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from serve_apps.config import AnalyzerAppConfig, PolicyAppConfig, SamplingConfig
from train_loops.config import OptimConfig, cpu_trainer
from workflows.common.pipeline_config import (
    TRAINED_ANALYZER,
    AnalyzerTrainConfig,
    CollectConfig,
    PipelineConfig,
)
from workflows.warm_start.config import WarmStartConfig

ANALYZER_TOKENS = 96
"""The analyzer's answers here are 45-70 tokens (short element answers as guide and avoid)."""


def analyzer_pipeline_config(cfg: WarmStartConfig, env: Any, work: Path) -> PipelineConfig:
    a = cfg.analyzer
    policy = work / "policy"
    return PipelineConfig(
        run_name="analyzer-pipeline", runs_dir=str(work), seed=cfg.seed, ray=cfg.ray, env=env,
        policy=PolicyAppConfig(
            model_path=str(policy), num_cpus=0.5, agent_style="elements",
            sampling=SamplingConfig(temperature=1.0, max_new_tokens=16),
        ),
        analyzer=AnalyzerAppConfig(
            model_path=TRAINED_ANALYZER, num_cpus=0.5, full_system_prompt=False,
            prompt_style=a.prompt_style,
            sampling=SamplingConfig(temperature=0.0, max_new_tokens=ANALYZER_TOKENS),
        ),
        collect=CollectConfig(
            split=cfg.demos.split, tasks=cfg.tasks, seeds_per_task=a.seeds_per_task,
            policy_episodes=a.policy_episodes, expert_episodes=a.expert_episodes,
            wrong_episodes=a.wrong_episodes, mismatch_episodes=0, max_steps=cfg.demos.max_steps,
            history_screens=1, concurrency=cfg.demos.concurrency,
        ),
        train=AnalyzerTrainConfig(
            base_model=str(policy), epochs=a.epochs, holdout_frac=0.2,
            verdict_weight=a.verdict_weight,
            trainer=cpu_trainer(samples_per_step=16, micro_batch_size=4, checkpoint_every=100_000,
                                report_every=50, cpu_autocast=a.cpu_autocast,
                                zero_stage=a.zero_stage),
            optim=OptimConfig(lr=a.lr, weight_decay=0.0),
        ),
    )  # fmt: skip
