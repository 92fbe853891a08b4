"""The demo app's config: the model, environment and task settings of a job config file plus
the demo's own section.

``load_demo_config("embedded", ["policy.model_path=tiny:0"])`` reads
``workflows/configs/embedded.yaml`` (any online-RL config file), keeps what the demo shares with
the job (``policy``, ``analyzer``, ``env``, ``task_source``, ``ray``; ``rollout.max_steps``,
``history_screens``, ``pause_s``, ``use_analyzer``; ``runs_dir``; ``serve_http_port``), takes
a ``demo:`` section where the file has one, applies ``key.sub=value`` overrides and validates.
Pydantic only (no torch/ray), so ``--help`` and ``serve run`` argument checks load fast.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from env_client.config import EnvClientConfig
from env_client.tasks.sources import TaskSourceConfig
from serve_apps.config import AnalyzerAppConfig, PolicyAppConfig
from workflows.common.config_io import (
    ConfigError,
    apply_overrides,
    expand_env,
    format_validation_error,
    read_config_file,
    resolve_config_path,
)
from workflows.common.ray_cluster import RayClusterConfig

DEFAULT_CONFIG = "embedded"
# Job-config keys the demo takes as they are, and the job keys it maps into its own section.
SHARED_SECTIONS = ("ray", "env", "policy", "analyzer", "task_source")
FROM_JOB = {
    ("rollout", "max_steps"): "max_steps",
    ("rollout", "history_screens"): "history_screens",
    ("rollout", "pause_s"): "pause_s",
    ("rollout", "use_analyzer"): "use_analyzer",
    ("runs_dir",): "runs_dir",
    ("serve_http_port",): "http_port",
}
_APP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DemoSettings(_Strict):
    """The demo app itself: HTTP, episode limits and timeouts, the runs folder."""

    name: str = Field("demo", description="Serve application name.")
    route_prefix: str = Field("/demo", description="HTTP prefix of the page and its API.")
    http_port: int = Field(8000, ge=1, le=65535, description="Ray Serve HTTP port.")
    attach: bool = Field(
        False,
        description="Use the running policy/analyzer apps named policy.name/analyzer.name (a "
        "job with keep_serving=true) instead of deploying frozen copies inside the demo app.",
    )
    max_episodes: int | None = Field(
        None,
        ge=1,
        description="Episodes (environment sessions) at once over all viewers; None: the "
        "embedded environment's capacity (4 when an external service is used).",
    )
    max_steps: int = Field(30, ge=1, le=200, description="Step limit of one episode.")
    history_screens: int = Field(3, ge=1, description="Screenshots in the policy's context (H).")
    pause_s: float = Field(0.0, ge=0, le=30, description="Pause after each action, seconds.")
    use_analyzer: bool = Field(True, description="Judge each step with the analyzer.")
    page_timeout_s: float = Field(
        20.0,
        gt=0,
        description="An episode whose page has not polled for this long is stopped and its "
        "session released (the page was closed); the page polls every second.",
    )
    idle_timeout_s: float = Field(
        300.0, gt=0, description="An episode nobody controlled for this long is stopped."
    )
    allocate_deadline_s: float = Field(
        30.0, gt=0, description="Longest wait for a free desktop before a start fails (503)."
    )
    max_instruction_chars: int = Field(
        2000, ge=1, le=64_000, description="Longest typed instruction (the actions' own limit)."
    )
    max_body_bytes: int = Field(
        64 << 10, ge=1024, description="Largest request body; a longer one is 413 unread."
    )
    keep_finished: int = Field(
        32, ge=0, description="Finished episodes kept (their steps stay viewable)."
    )
    runs_dir: str = Field("runs", description="Folder of run folders the viewer browses.")
    num_cpus: float = Field(0.1, ge=0, description="CPUs reserved for the demo replica.")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _APP_NAME.match(value):
            raise ValueError(f"name must be letters, digits, _ or -, got {value!r}")
        return value

    @field_validator("route_prefix")
    @classmethod
    def _slash(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"route_prefix must start with '/', got {value!r}")
        return value


class DemoConfig(_Strict):
    """Everything ``python -m workflows.demo`` and ``build_app`` need."""

    demo: DemoSettings = Field(default_factory=DemoSettings)
    ray: RayClusterConfig = Field(default_factory=RayClusterConfig)
    env: EnvClientConfig = Field(
        default_factory=EnvClientConfig,
        description="Environment service; server_url None: the demo starts the embedded server.",
    )
    policy: PolicyAppConfig = Field(
        description="Policy; model_path 'tiny:<seed>', 'warm:<seed>' or a checkpoint folder."
    )
    analyzer: AnalyzerAppConfig = Field(
        description="Analyzer; model_path 'tiny:<seed>', 'warm:<seed>' or a checkpoint folder."
    )
    task_source: TaskSourceConfig = Field(default_factory=TaskSourceConfig)

    @model_validator(mode="after")
    def _consistent(self) -> DemoConfig:
        if self.task_source.kind != "miniwob" and not self.env.server_url:
            raise ValueError(
                f"task_source.kind={self.task_source.kind!r} needs env.server_url: the "
                "embedded server runs MiniWoB tasks only"
            )
        limit = self.demo.max_episodes
        capacity = self.env.embedded.capacity
        if limit is not None and not self.env.server_url and limit > capacity:
            raise ValueError(f"demo.max_episodes={limit} exceeds env.embedded.capacity={capacity}")
        if self.demo.history_screens > self.policy.max_images:
            raise ValueError(
                f"demo.history_screens={self.demo.history_screens} exceeds "
                f"policy.max_images={self.policy.max_images}"
            )
        return self

    @property
    def episode_limit(self) -> int:
        """Episodes at once: the configured limit, else what the environment holds."""
        if self.demo.max_episodes is not None:
            return self.demo.max_episodes
        return 4 if self.env.server_url else self.env.embedded.capacity

    @property
    def runs_path(self) -> Path:
        return Path(self.demo.runs_dir).expanduser().resolve()


def demo_data(job: dict[str, Any]) -> dict[str, Any]:
    """The demo's part of a job config mapping (see the module docstring)."""
    data: dict[str, Any] = {k: job[k] for k in SHARED_SECTIONS if k in job}
    demo: dict[str, Any] = {}
    for path, key in FROM_JOB.items():
        node: Any = job
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            demo[key] = node
    own = job.get("demo") or {}
    if not isinstance(own, dict):
        raise ConfigError("demo: must be a mapping")
    data["demo"] = {**demo, **own}
    return data


def load_demo_config(
    config: str | Path = DEFAULT_CONFIG, overrides: Sequence[str] = ()
) -> DemoConfig:
    """A job config file (path or bundled name) + overrides → a validated DemoConfig."""
    path = resolve_config_path(config)
    data = expand_env(apply_overrides(demo_data(read_config_file(path)), overrides, DemoConfig))
    source = str(path) + (" + overrides " + " ".join(overrides) if overrides else "")
    try:
        return DemoConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, data, source, DemoConfig)) from None
