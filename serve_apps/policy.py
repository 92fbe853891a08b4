"""The policy deployment: generate, score, OpenAI chat endpoint, weight hot-swap.

    serve run serve_apps.policy:build_app model_path=/ckpt/tiny-policy num_replicas=2

or from code ``handle = deploy_policy(PolicyAppConfig(model_path=...))`` and then
``await handle.generate.remote({...})`` / ``handle.score.remote({...})`` (see
:mod:`serve_apps.api` for the request shapes). New weights arrive through the registry named
``weights.registry_name``: :class:`serve_apps.weights.publisher.WeightPublisher`.
"""

# No ``from __future__ import annotations`` here: Serve reads the builder's annotation as a
# class to validate ``serve run`` arguments.

from typing import Any

from ray import serve
from ray.serve import Application
from ray.serve.handle import DeploymentHandle

from serve_apps.config import PolicyAppConfig
from serve_apps.server import ModelServer


@serve.deployment
@serve.ingress()
class PolicyServer(ModelServer):
    """One policy replica (methods: ``generate``, ``score``, ``weight_status``; HTTP: OpenAI)."""

    async def __init__(self, cfg: PolicyAppConfig) -> None:  # type: ignore[misc]
        await self._setup(cfg)


def build_policy_app(args: PolicyAppConfig) -> Application:
    """Typed app builder (``serve run serve_apps.policy:build_app key=value ...``)."""
    cfg = _as_config(args)
    return PolicyServer.options(  # type: ignore[attr-defined]
        name=cfg.name,
        num_replicas=cfg.num_replicas,
        max_ongoing_requests=cfg.max_ongoing_requests,
        ray_actor_options={"num_cpus": cfg.num_cpus, "num_gpus": cfg.num_gpus},
    ).bind(cfg)


build_app = build_policy_app


def deploy_policy(cfg: PolicyAppConfig, blocking: bool = False) -> DeploymentHandle:
    """``serve.run`` the policy app under its name and route prefix; returns its handle."""
    return serve.run(
        build_policy_app(cfg), name=cfg.name, route_prefix=cfg.route_prefix, blocking=blocking
    )


def _as_config(args: Any) -> PolicyAppConfig:
    return args if isinstance(args, PolicyAppConfig) else PolicyAppConfig.model_validate(args)
