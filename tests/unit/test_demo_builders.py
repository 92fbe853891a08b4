"""The demo's ``serve run`` builders and its bundled Serve config (no Ray cluster needed:
building an application only binds deployments)."""

from __future__ import annotations

import inspect

import pytest
import yaml
from pydantic import ValidationError
from ray.serve import Application
from ray.serve._private.api import call_user_app_builder_with_args_if_necessary
from ray.serve.schema import ServeDeploySchema

from workflows.common.config_io import CONFIG_DIR
from workflows.demo import app as demo_app
from workflows.demo.config import load_demo_config

TINY = ["policy.model_path=tiny:0", "policy.agent_style=toolcall", "analyzer.model_path=tiny:1"]


def test_builders_are_typed_for_serve_run() -> None:
    for builder in (demo_app.build_app, demo_app.build_policy, demo_app.build_analyzer):
        param = next(iter(inspect.signature(builder).parameters.values()))
        assert param.annotation is demo_app.DemoArgs


def test_the_bundled_serve_config_builds_three_matching_apps() -> None:
    schema = ServeDeploySchema.model_validate(
        yaml.safe_load((CONFIG_DIR / "demo_serve.yaml").read_text())
    )
    names = {a.name: a for a in schema.applications}
    assert set(names) == {"demo", "demo-policy", "demo-analyzer"}
    # What the demo ingress calls is what the config deploys.
    cfg = demo_app.for_demo(load_demo_config("embedded"))
    assert (cfg.policy.name, cfg.analyzer.name) == ("demo-policy", "demo-analyzer")
    assert not cfg.policy.weights.enabled  # a frozen copy follows no registry
    args = {"config": "embedded", "overrides": " ".join(TINY)}  # serve run passes strings
    for spec in schema.applications:
        builder = getattr(demo_app, spec.import_path.split(":")[1])
        built = call_user_app_builder_with_args_if_necessary(builder, args)
        assert isinstance(built, Application)


def test_bad_arguments_fail_with_the_field() -> None:
    from workflows.common.config_io import ConfigError

    with pytest.raises(ValidationError, match="colour"):
        call_user_app_builder_with_args_if_necessary(demo_app.build_app, {"colour": "red"})
    with pytest.raises(ConfigError, match=r"policy\.sampling\.temperature"):
        call_user_app_builder_with_args_if_necessary(
            demo_app.build_app, {"overrides": "policy.sampling.temperature=-1"}
        )


def test_attach_uses_the_running_job_apps() -> None:
    cfg = demo_app.for_demo(load_demo_config("embedded", ["demo.attach=true"]))
    assert (cfg.policy.name, cfg.analyzer.name) == ("policy", "analyzer")


def test_print_config_imports_no_heavy_modules() -> None:
    import subprocess
    import sys

    code = (
        "import sys, contextlib, io\n"
        "from workflows.demo.__main__ import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert main(['--print-config']) == 0\n"
        "print(','.join(m for m in ('torch', 'ray', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"--print-config imported {out.stdout.strip()}"
