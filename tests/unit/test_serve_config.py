"""serve_apps configs: defaults, bounds, cross-field checks, serve-run strings, examples, and
that the light modules import neither torch nor ray."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from serve_apps.config import (
    AnalyzerAppConfig,
    PolicyAppConfig,
    TransformersBackendConfig,
    VLLMBackendConfig,
    production_16gpu_example,
    tiny_cpu_example,
)


def test_policy_defaults_follow_method() -> None:
    cfg = PolicyAppConfig(model_path="/ckpt")
    assert cfg.sampling.temperature == 1.0 and cfg.sampling.top_p == 1.0
    assert cfg.sampling.max_new_tokens == 1024
    assert isinstance(cfg.backend, TransformersBackendConfig)
    assert cfg.weights.enabled and cfg.weights.registry_name == "policy"


def test_analyzer_is_frozen_and_greedy_by_default() -> None:
    cfg = AnalyzerAppConfig(model_path="/ckpt")
    assert cfg.votes == 1 and cfg.sampling.temperature == 0.0
    assert not cfg.weights.enabled


def test_serve_run_style_strings_are_parsed() -> None:
    cfg = PolicyAppConfig.model_validate(
        {
            "model_path": "/ckpt",
            "num_replicas": "2",
            "num_gpus": "1",
            "backend": '{"type": "vllm", "gpu_memory_utilization": 0.5}',
            "sampling": '{"max_new_tokens": 64}',
        }
    )
    assert cfg.num_replicas == 2
    assert isinstance(cfg.backend, VLLMBackendConfig)
    assert cfg.backend.gpu_memory_utilization == 0.5
    assert cfg.sampling.max_new_tokens == 64


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"backend": {"type": "vllm"}}, "needs num_gpus > 0"),
        (
            {"backend": {"type": "vllm", "gpu_memory_utilization": 0.8}, "num_gpus": 0.5},
            "gpu_memory_utilization",
        ),
        (
            {"backend": {"type": "vllm", "tensor_parallel_size": 2}, "num_gpus": 1},
            "tensor_parallel",
        ),
        ({"backend": {"type": "transformers", "device": "cuda"}}, "needs num_gpus"),
        ({"backend": {"type": "tgi"}}, "tag"),
        ({"sampling": {"top_p": 0.0}}, "top_p"),
        ({"sampling": {"temperature": -1}}, "temperature"),
        ({"num_replicas": 0}, "num_replicas"),
        ({"route_prefix": "policy"}, "start with '/'"),
        ({"model_path": "https://huggingface.co/x"}, "local folder"),
        ({"unknown_field": 1}, "unknown_field"),
        ({"sampling": "{not json"}, "not valid JSON"),
    ],
)
def test_bad_policy_configs_name_the_problem(fields: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        PolicyAppConfig.model_validate({"model_path": "/ckpt", **fields})


def test_votes_need_sampling_temperature() -> None:
    with pytest.raises(ValidationError, match="identical votes"):
        AnalyzerAppConfig(model_path="/ckpt", votes=3)
    cfg = AnalyzerAppConfig(model_path="/ckpt", votes=3, sampling={"temperature": 0.7})
    assert cfg.votes == 3


def test_examples_validate_and_fit_16_gpus() -> None:
    tiny = tiny_cpu_example("/tiny/policy", "/tiny/analyzer")
    assert tiny.policy.num_gpus == 0 and tiny.policy.num_replicas == 1
    prod = production_16gpu_example("/ckpt/policy", "/ckpt/analyzer")
    gpus = sum(app.num_replicas * app.num_gpus for app in (prod.policy, prod.analyzer))
    assert gpus == 8  # the other 8 of 16 train
    assert prod.policy.backend.type == "vllm" and prod.analyzer.num_gpus == 0.5
    assert prod.policy.sampling.max_new_tokens == 1024


def test_light_modules_import_no_torch_or_ray() -> None:
    code = (
        "import sys\n"
        "import serve_apps.config, serve_apps.api, serve_apps.judgment, serve_apps.prompting\n"
        "import serve_apps.weights.manifest\n"
        "heavy = sorted(m for m in ('torch', 'ray', 'transformers') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
