"""The analyzer-pipeline configs: the bundled YAML, bounds, cross-field checks, CLI parsing."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from workflows.common.config_io import load_config
from workflows.common.pipeline import parse_cli
from workflows.common.pipeline_config import (
    TRAINED_ANALYZER,
    CollectConfig,
    EvaluateConfig,
    OpenAIExpertConfig,
    OracleExpertConfig,
    PipelineConfig,
)
from workflows.online_rl.config import EntropulseConfig, OnlineRLConfig


def test_bundled_yaml_loads_with_cpu_defaults() -> None:
    cfg = load_config(PipelineConfig, "analyzer_pipeline")
    assert cfg.policy.model_path == "tiny:0" and cfg.analyzer.model_path == TRAINED_ANALYZER
    assert isinstance(cfg.annotate.expert, OracleExpertConfig)
    assert not cfg.train.trainer.use_gpu and cfg.train.trainer.zero_stage == 2
    assert cfg.evaluate.runs == 3 and cfg.evaluate.max_steps <= 50
    assert cfg.analyzer.prompt_style == "minimal"  # as the RL job's embedded analyzer
    embedded = load_config(OnlineRLConfig, "embedded")
    assert embedded.analyzer.prompt_style == cfg.analyzer.prompt_style
    assert embedded.analyzer.full_system_prompt == cfg.analyzer.full_system_prompt


def test_overrides_reach_every_section() -> None:
    cfg = load_config(
        PipelineConfig,
        "analyzer_pipeline",
        ["collect.seeds_per_task=1", "annotate.expert.type=openai",
         "annotate.expert.base_url=http://h/v1", "annotate.expert.model=m", "evaluate.runs=2"],
    )  # fmt: skip
    assert cfg.collect.seeds_per_task == 1 and cfg.evaluate.runs == 2
    assert isinstance(cfg.annotate.expert, OpenAIExpertConfig)
    assert cfg.annotate.expert.api_key_env == "OPENAI_API_KEY"


def test_openai_expert_needs_an_endpoint_and_a_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("ANNOTATOR_MODEL", raising=False)
    with pytest.raises(ValidationError, match="base_url"):
        OpenAIExpertConfig(model="m")
    with pytest.raises(ValidationError, match="model"):
        OpenAIExpertConfig(base_url="http://h/v1")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://env/v1")
    monkeypatch.setenv("ANNOTATOR_MODEL", "vlm")
    assert OpenAIExpertConfig().base_url == "http://env/v1"


def test_cross_field_checks() -> None:
    with pytest.raises(ValidationError, match="no episodes"):
        CollectConfig(policy_episodes=0)
    with pytest.raises(ValidationError, match="unique"):
        EvaluateConfig(checkpoints=[{"name": "a", "path": "x"}, {"name": "a", "path": "y"}])
    with pytest.raises(ValidationError):
        EvaluateConfig(max_steps=51)  # METHOD.md §8: at most 50 steps
    assert EntropulseConfig().enabled is False


def test_cli_prints_config_and_rejects_bad_values(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_cli("x", None, ["--print-config", "evaluate.runs=5"]) == 0
    assert "runs: 5" in capsys.readouterr().out
    assert parse_cli("x", None, ["collect.concurrency=0"]) == 2
    assert "collect.concurrency" in capsys.readouterr().err


def test_round_robin_cycles_through_task_names() -> None:
    from workflows.common.pipeline import round_robin

    tasks = [{"task": name, "seed": s} for name in ("a", "b", "c") for s in range(4)]
    order = round_robin(tasks, seed=0)
    assert sorted(map(str, order)) == sorted(map(str, tasks))  # a permutation
    for i in range(0, 12, 3):  # every window of 3 has each name once
        assert {t["task"] for t in order[i : i + 3]} == {"a", "b", "c"}
    assert order == round_robin(tasks, seed=0) and order != round_robin(tasks, seed=1)
