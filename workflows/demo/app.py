"""The demo Serve application: a FastAPI ingress that calls the policy and analyzer apps.

    python -m workflows.demo                                  # embedded default, one command
    serve run workflows/configs/demo_serve.yaml               # the same as a Serve config
    serve run workflows.demo.app:build_app config=embedded overrides='demo.attach=true'

Serve allows one FastAPI ingress per application, and the policy and analyzer deployments
each have one (their OpenAI endpoints), so the demo is three applications deployed together:
frozen copies of the policy and analyzer (``serve_apps`` builders; ``tiny:``/``warm:`` model
paths resolved to local checkpoints) named ``<demo>-policy`` and ``<demo>-analyzer``, and
:class:`DemoServer`, which calls them through handles. With ``demo.attach=true`` only the
ingress is deployed and it calls a running job's apps, ``policy.name``/``analyzer.name``
(``keep_serving=true``). The replica owns an :class:`~env_client.client.EnvClient` (which
starts the embedded environment server when ``env.server_url`` is unset) and releases every
session when Serve shuts it down.
"""

# No ``from __future__ import annotations``: Serve reads the builder's annotation as a class.

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from ray import serve
from ray.serve import Application

from workflows.demo.config import DEFAULT_CONFIG, DemoConfig, load_demo_config


class DemoArgs(BaseModel):
    """``serve run`` arguments: a job config file and overrides (as on the command line)."""

    model_config = ConfigDict(extra="forbid")

    config: str = Field(DEFAULT_CONFIG, description="Config file or bundled name.")
    overrides: list[str] = Field(default_factory=list, description="key.sub=value overrides.")

    @field_validator("overrides", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        return value.split() if isinstance(value, str) else value


@serve.deployment
@serve.ingress()
class DemoServer:
    """The page, the live episodes and the trajectory viewer of one replica."""

    async def __init__(self, cfg: DemoConfig) -> None:  # type: ignore[misc]
        from env_client.client import EnvClient
        from env_client.tasks.sources import make_task_source
        from serve_apps.prompting.styles import make_style
        from workflows.demo.api import DemoService
        from workflows.demo.live import EpisodeManager, Models
        from workflows.demo.viewer import RunIndex

        policy = serve.get_app_handle(cfg.policy.name)
        analyzer = serve.get_app_handle(cfg.analyzer.name) if cfg.demo.use_analyzer else None
        update = {"allocate_deadline_s": cfg.demo.allocate_deadline_s}
        self.client = EnvClient(cfg.env.model_copy(update=update))
        await self.client.start()  # starts the embedded server when env.server_url is unset
        models = Models(
            policy,
            analyzer if cfg.demo.use_analyzer else None,
            cfg.analyzer.prompt_style == "reference",
        )
        style = make_style(cfg.policy.agent_style, cfg.demo.history_screens)
        manager = EpisodeManager(self.client, cfg.demo, cfg.episode_limit, style, models)
        source = make_task_source(cfg.task_source)
        self.service = DemoService(cfg, source, manager, RunIndex(cfg.runs_path), self.client.url)

    def __serve_build_asgi_app__(self) -> Any:
        from workflows.demo.api import build_api

        return build_api(self.service)

    async def __del__(self) -> None:
        # Serve calls this on shutdown: every episode's session goes back, the server stops.
        service = getattr(self, "service", None)
        if service is not None:
            await service.manager.close()
        client = getattr(self, "client", None)
        if client is not None:
            await client.close()


def for_demo(cfg: DemoConfig) -> DemoConfig:
    """The policy and analyzer apps the demo calls: its own frozen copies, named after it so
    they never clash with a job's (the policy follows no weight registry); a running job's
    apps as configured with ``demo.attach``."""
    if cfg.demo.attach:
        return cfg
    from workflows.common.pipeline import frozen_policy

    name = cfg.demo.name
    policy = frozen_policy(cfg.policy, cfg.policy.model_path, f"{name}-policy")
    update = {"name": f"{name}-analyzer", "route_prefix": f"/{name}-analyzer"}
    return cfg.model_copy(
        update={"policy": policy, "analyzer": cfg.analyzer.model_copy(update=update)}
    )


def resolve_models(cfg: DemoConfig) -> DemoConfig:
    """``tiny:``/``warm:`` model paths → local checkpoint folders."""
    policy = cfg.policy.model_copy(
        update={"model_path": model_folder(cfg.policy.model_path, "policy")}
    )
    analyzer = cfg.analyzer.model_copy(
        update={"model_path": model_folder(cfg.analyzer.model_path, "analyzer")}
    )
    return cfg.model_copy(update={"policy": policy, "analyzer": analyzer})


def model_folder(path: str, member: str) -> str:
    """A checkpoint folder, ``tiny:<seed>`` (random tiny model) or ``warm:<seed>`` (the cached
    warm start's policy/analyzer, built on first use: ~20 min once)."""
    from workflows.warm_start.config import is_warm

    if is_warm(path):
        from workflows.warm_start.build import warm_member

        return str(warm_member(path, member))
    from workflows.common.pipeline import resolve_model_path

    return resolve_model_path(path, member)


def build_demo_app(cfg: DemoConfig) -> Application:
    """The demo ingress alone; it calls the apps named ``cfg.policy.name``/``analyzer.name``."""
    # The replica's working directory is not the caller's: the runs folder goes absolute.
    demo = cfg.demo.model_copy(update={"runs_dir": str(cfg.runs_path)})
    cfg = cfg.model_copy(update={"demo": demo})
    return DemoServer.options(  # type: ignore[attr-defined]
        name=cfg.demo.name, ray_actor_options={"num_cpus": cfg.demo.num_cpus}
    ).bind(cfg)


def deploy_demo(cfg: DemoConfig, logging_config: dict[str, Any] | None = None) -> DemoConfig:
    """``serve.run`` the policy and analyzer copies (unless attached), then the demo; returns
    the config as deployed (app names, model folders)."""
    from serve_apps.analyzer import build_analyzer_app
    from serve_apps.policy import build_policy_app

    cfg = for_demo(cfg)
    if not cfg.demo.attach:
        cfg = resolve_models(cfg)
        apps: list[tuple[Any, Any]] = [(build_policy_app(cfg.policy), cfg.policy)]
        if cfg.demo.use_analyzer:
            apps.append((build_analyzer_app(cfg.analyzer), cfg.analyzer))
        for app, app_cfg in apps:
            serve.run(app, name=app_cfg.name, route_prefix=app_cfg.route_prefix,
                      logging_config=logging_config)  # fmt: skip
    serve.run(
        build_demo_app(cfg),
        name=cfg.demo.name,
        route_prefix=cfg.demo.route_prefix,
        logging_config=logging_config,
    )
    return cfg


def delete_demo(cfg: DemoConfig) -> None:
    """Delete the demo app first (its replica releases every session), then its model apps."""
    import contextlib

    names = [cfg.demo.name] + ([] if cfg.demo.attach else [cfg.policy.name, cfg.analyzer.name])
    for name in names:
        with contextlib.suppress(Exception):
            serve.delete(name)


def _load(args: Any) -> DemoConfig:
    parsed = args if isinstance(args, DemoArgs) else DemoArgs.model_validate(args)
    return for_demo(load_demo_config(parsed.config, parsed.overrides))


def build_app(args: DemoArgs) -> Application:
    """``serve run`` builder of the demo ingress (config file + overrides, validated here)."""
    return build_demo_app(_load(args))


def build_policy(args: DemoArgs) -> Application:
    """``serve run`` builder of the demo's frozen policy copy (model path resolved here)."""
    from serve_apps.policy import build_policy_app

    return build_policy_app(resolve_models(_load(args)).policy)


def build_analyzer(args: DemoArgs) -> Application:
    """``serve run`` builder of the demo's analyzer copy (model path resolved here)."""
    from serve_apps.analyzer import build_analyzer_app

    return build_analyzer_app(resolve_models(_load(args)).analyzer)
