"""Typed app builders: ``serve run serve_apps.policy:build_app key=value ...`` validates its
arguments against the config class (checked with the same function ``serve run`` calls)."""

from __future__ import annotations

import inspect

import pytest
from pydantic import ValidationError
from ray.serve import Application
from ray.serve._private.api import call_user_app_builder_with_args_if_necessary

from serve_apps import analyzer, policy
from serve_apps.config import AnalyzerAppConfig, PolicyAppConfig


@pytest.mark.parametrize(
    ("module", "config"), [(policy, PolicyAppConfig), (analyzer, AnalyzerAppConfig)]
)
def test_builders_are_typed_for_serve_run(module: object, config: type) -> None:
    builder = module.build_app  # type: ignore[attr-defined]
    param = next(iter(inspect.signature(builder).parameters.values()))
    assert param.annotation is config  # a class, not a string: Serve validates with it


def test_serve_run_arguments_are_validated() -> None:
    app = call_user_app_builder_with_args_if_necessary(
        policy.build_app, {"model_path": "/ckpt", "num_replicas": "2", "num_cpus": "0.25"}
    )
    assert isinstance(app, Application)
    with pytest.raises(ValidationError, match="num_replicas"):
        call_user_app_builder_with_args_if_necessary(
            policy.build_app, {"model_path": "/ckpt", "num_replicas": "0"}
        )
    with pytest.raises(ValidationError, match="identical votes"):
        call_user_app_builder_with_args_if_necessary(
            analyzer.build_app, {"model_path": "/ckpt", "votes": "3"}
        )
    app = call_user_app_builder_with_args_if_necessary(
        analyzer.build_app,
        {"model_path": "/ckpt", "votes": "3", "sampling": '{"temperature": 0.7}'},
    )
    assert isinstance(app, Application)
