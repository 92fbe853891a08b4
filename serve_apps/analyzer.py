"""The GUI analyzer deployment: judges one transition (METHOD.md §2) with k votes.

    serve run serve_apps.analyzer:build_app model_path=/ckpt/analyzer votes=3 \
        sampling='{"temperature": 0.7, "max_new_tokens": 256}'

``await handle.analyze.remote(transition)`` with a :class:`serve_apps.api.Transition` dict
returns a :class:`serve_apps.judgment.Judgment` dict (consistency, effectiveness, guide,
avoid, guidance, d, v, status, reason, votes, raw) plus ``weight_version``. Model output never
raises: answers are parsed strictly, and a malformed one gives ``d = 0`` with the reason. It
also serves ``generate``/``score`` and the OpenAI endpoint, like the policy.

With ``prompt_style=reference`` the transition also carries ``history_screenshots`` and
``history_responses`` (the earlier screens still in the policy's context and its full
responses there; see :class:`HistoryTransition`). ``fault_rate`` > 0 makes that fraction of
``analyze`` calls fail on purpose (tests of the callers' error handling).
"""

# No ``from __future__ import annotations``: Serve reads the builder's annotation as a class.

import asyncio
import dataclasses
import random
from collections.abc import Mapping
from typing import Any

from pydantic import Field, model_validator
from ray import serve
from ray.serve import Application
from ray.serve.handle import DeploymentHandle

from serve_apps.api import Transition
from serve_apps.backends.base import ChatPrompt, Generation, Sampling
from serve_apps.config import AnalyzerAppConfig
from serve_apps.errors import RequestError
from serve_apps.judgment import combine_votes
from serve_apps.prompting.analyzer import (
    reference_analyzer_messages,
    trained_prompt_mismatch,
    transition_messages,
)
from serve_apps.server import ModelServer, check_budget, parse_request


class HistoryTransition(Transition):
    """A transition with the history the reference prompt shows (oldest step first)."""

    history_screenshots: list[bytes] = Field(
        default_factory=list, description="Earlier screens still in the policy's context."
    )
    history_responses: list[str] = Field(
        default_factory=list, description="The policy's full response at each of those steps."
    )

    @model_validator(mode="after")
    def _aligned(self) -> "HistoryTransition":
        if len(self.history_screenshots) != len(self.history_responses):
            raise ValueError(
                f"{len(self.history_screenshots)} history_screenshots but "
                f"{len(self.history_responses)} history_responses"
            )
        return self


@serve.deployment
@serve.ingress()
class AnalyzerServer(ModelServer):
    """One analyzer replica (methods: ``analyze``, ``generate``, ``score``)."""

    async def __init__(self, cfg: AnalyzerAppConfig) -> None:  # type: ignore[misc]
        await self._setup(cfg)
        self.analyzer_cfg = cfg
        self._faults = random.Random(cfg.sampling.seed or 0)

    async def analyze(self, transition: Mapping[str, Any] | Transition) -> dict[str, Any]:
        """Judge a transition: k sampled answers, parsed strictly and combined by majority."""
        if self._faults.random() < self.analyzer_cfg.fault_rate:
            raise RequestError("injected analyzer fault (fault_rate)", status=503, code="fault")
        t = parse_request(HistoryTransition, transition)
        prepared = await asyncio.to_thread(self._prepare_transition, t)
        check_budget(
            prepared.num_tokens,
            self.cfg.sampling.max_new_tokens,
            self.cfg.max_prompt_tokens,
            self.backend.max_context_tokens,
        )
        gens: list[Generation] = await asyncio.gather(
            *[self._generate_batch((prepared, s)) for s in self._vote_sampling()]
        )
        judgment = combine_votes([g.text for g in gens])
        return {**judgment.model_dump(), "weight_version": gens[0].weight_version}

    def _prepare_transition(self, t: HistoryTransition) -> Any:
        messages, images = self._messages(t)
        return self.backend.prepare(ChatPrompt(messages, self.encoder.load_images(images)))

    def _messages(self, t: HistoryTransition) -> tuple[list[dict[str, Any]], list[bytes]]:
        if self.analyzer_cfg.prompt_style == "reference":
            return reference_analyzer_messages(
                t.instruction,
                t.history_screenshots,
                t.history_responses,
                t.screenshot_before,
                t.response,
                t.action,
                t.screenshot_after,
                context=t.context,
            )
        return transition_messages(
            self.analyzer_cfg.prompt_style,
            t.instruction,
            t.history,
            t.screenshot_before,
            t.response,
            t.action,
            t.screenshot_after,
            full=self.analyzer_cfg.full_system_prompt,
            context=t.context,
        )

    def _vote_sampling(self) -> list[Any]:
        s = self.cfg.sampling
        base = Sampling(s.temperature, s.top_p, s.max_new_tokens, s.seed)
        if base.seed is None:
            return [base] * self.analyzer_cfg.votes
        return [
            dataclasses.replace(base, seed=base.seed + i) for i in range(self.analyzer_cfg.votes)
        ]


def build_analyzer_app(args: AnalyzerAppConfig) -> Application:
    """Typed app builder (``serve run serve_apps.analyzer:build_app key=value ...``)."""
    cfg = args if isinstance(args, AnalyzerAppConfig) else AnalyzerAppConfig.model_validate(args)
    mismatch = trained_prompt_mismatch(cfg.model_path, cfg.prompt_style, cfg.full_system_prompt)
    if mismatch:
        raise ValueError(mismatch)
    return AnalyzerServer.options(  # type: ignore[attr-defined]
        name=cfg.name,
        num_replicas=cfg.num_replicas,
        max_ongoing_requests=cfg.max_ongoing_requests,
        ray_actor_options={"num_cpus": cfg.num_cpus, "num_gpus": cfg.num_gpus},
    ).bind(cfg)


build_app = build_analyzer_app


def deploy_analyzer(cfg: AnalyzerAppConfig, blocking: bool = False) -> DeploymentHandle:
    """``serve.run`` the analyzer app under its name and route prefix; returns its handle."""
    return serve.run(
        build_analyzer_app(cfg), name=cfg.name, route_prefix=cfg.route_prefix, blocking=blocking
    )
