"""What every model replica does, policy or analyzer: load the backend, follow the weight
registry, validate requests, batch them, and answer ``generate`` / ``score``.

Requests are validated and tokenized one by one (a bad request fails alone, with a
:class:`~serve_apps.errors.RequestError`), then concurrent ones are grouped by ``@serve.batch``
into one backend call, which runs on one weight version and reports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from ray import serve

from serve_apps.api import (
    ChatInput,
    GenerateRequest,
    GenerateResult,
    ScoreRequest,
    ScoreResult,
)
from serve_apps.backends import make_backend
from serve_apps.backends.base import ChatPrompt, Generation, InferenceBackend, Sampling, Scored
from serve_apps.config import AnalyzerAppConfig, PolicyAppConfig
from serve_apps.errors import RequestError, format_validation
from serve_apps.prompting.inputs import ImageLimits, PromptEncoder
from serve_apps.weights.follower import WeightFollower, replica_id

logger = logging.getLogger(__name__)
R = TypeVar("R", bound=BaseModel)
ServerConfig = PolicyAppConfig | AnalyzerAppConfig


class ModelServer:
    """Base of the policy and analyzer deployments (subclasses add their own methods)."""

    cfg: ServerConfig
    backend: InferenceBackend
    encoder: PromptEncoder
    follower: WeightFollower | None

    async def _setup(self, cfg: ServerConfig) -> None:
        self.cfg = cfg
        self.replica_id = replica_id()
        self.model_name = cfg.served_model_name or cfg.name
        limits = ImageLimits(cfg.max_images, cfg.max_image_bytes, cfg.max_image_pixels)
        self.encoder = await asyncio.to_thread(
            PromptEncoder.from_pretrained, cfg.model_path, limits
        )
        self.backend = await asyncio.to_thread(
            make_backend, cfg.backend, cfg.model_path, self.encoder, cfg.weights.initial_version
        )
        await self.backend.start()
        for method in (self._generate_batch, self._score_batch):
            batcher: Any = method  # serve.batch adds these setters to the wrapped method
            batcher.set_max_batch_size(cfg.batching.max_batch_size)
            batcher.set_batch_wait_timeout_s(cfg.batching.batch_wait_timeout_s)
        self.follower = None
        if cfg.weights.enabled:
            self.follower = WeightFollower(cfg.weights, self.backend, self.replica_id)
            await self.follower.start()

    # ---- handle API -------------------------------------------------------------------------

    async def generate(self, request: Mapping[str, Any] | GenerateRequest) -> dict[str, Any]:
        """Sample one response: text, prompt/response ids, log-probs, weight version."""
        req = parse_request(GenerateRequest, request)
        return (await self.generate_request(req)).model_dump()

    async def score(self, request: Mapping[str, Any] | ScoreRequest) -> dict[str, Any]:
        """Log-probs of ``response_ids`` under the request's context (prefill only)."""
        req = parse_request(ScoreRequest, request)
        self.backend.check_response_ids([req.response_ids])
        prepared = await self._prepare(req, extra_tokens=len(req.response_ids))
        scored: Scored = await self._score_batch((prepared, req.response_ids))
        return ScoreResult(
            logprobs=scored.logprobs,
            weight_version=scored.weight_version,
            num_prompt_tokens=scored.num_prompt_tokens,
        ).model_dump()

    async def weight_status(self) -> dict[str, Any]:
        """This replica's version and weight-follower state (one replica: the handle's pick)."""
        state = self.follower.state() if self.follower else {"version": self.backend.version}
        return {"replica_id": self.replica_id, **state}

    async def check_health(self) -> None:
        if not self.backend.healthy():
            raise RuntimeError("model weights are broken (failed in-place load); restart me")

    # ---- shared by the HTTP endpoint ----------------------------------------------------------

    async def generate_request(self, req: GenerateRequest) -> GenerateResult:
        sampling = self.sampling_for(req)
        prepared = await self._prepare(req, extra_tokens=sampling.max_new_tokens)
        gen: Generation = await self._generate_batch((prepared, sampling))
        return GenerateResult(
            text=gen.text,
            prompt_ids=gen.prompt_ids,
            response_ids=gen.response_ids,
            logprobs=gen.logprobs,
            weight_version=gen.weight_version,
            finish_reason=gen.finish_reason,
        )

    def sampling_for(self, req: GenerateRequest) -> Sampling:
        base = self.cfg.sampling
        return Sampling(
            temperature=base.temperature if req.temperature is None else req.temperature,
            top_p=base.top_p if req.top_p is None else req.top_p,
            max_new_tokens=base.max_new_tokens
            if req.max_new_tokens is None
            else req.max_new_tokens,
            seed=base.seed if req.seed is None else req.seed,
        )

    async def _prepare(self, req: ChatInput, extra_tokens: int) -> Any:
        """Decode images, render, tokenize (in a thread) and check the token budget."""
        prepared = await asyncio.to_thread(self._prepare_sync, req)
        check_budget(
            prepared.num_tokens,
            extra_tokens,
            self.cfg.max_prompt_tokens,
            self.backend.max_context_tokens,
        )
        return prepared

    def _prepare_sync(self, req: ChatInput) -> Any:
        prompt = ChatPrompt(req.message_dicts(), self.encoder.load_images(req.images))
        return self.backend.prepare(prompt)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.005)
    async def _generate_batch(self, items: list[tuple[Any, Sampling]]) -> list[Generation]:
        return await self.backend.generate([p for p, _ in items], [s for _, s in items])

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.005)
    async def _score_batch(self, items: list[tuple[Any, list[int]]]) -> list[Scored]:
        return await self.backend.score([p for p, _ in items], [r for _, r in items])

    def __serve_build_asgi_app__(self) -> Any:
        """The replica's HTTP app (Serve calls this after the constructor)."""
        from serve_apps.openai_api import build_openai_app

        return build_openai_app(self)

    def __del__(self) -> None:
        follower = getattr(self, "follower", None)
        if follower is not None and follower.registry is not None:
            with contextlib.suppress(Exception):  # best effort at shutdown
                follower.registry.forget.remote(follower.replica_id)


def parse_request(model: type[R], request: Any) -> R:
    """Validate a handle request (dict or model) into ``model``; RequestError on failure."""
    if isinstance(request, model):
        return request
    if isinstance(request, BaseModel):
        request = request.model_dump()
    if not isinstance(request, Mapping):
        raise RequestError(f"expected a {model.__name__} dict, got {type(request).__name__}")
    try:
        return model.model_validate(dict(request))
    except ValidationError as exc:
        raise RequestError(f"invalid {model.__name__}: {format_validation(exc)}") from None


def check_budget(
    prompt_tokens: int, extra_tokens: int, max_prompt: int, max_context: int | None
) -> None:
    if prompt_tokens > max_prompt:
        raise RequestError(
            f"prompt has {prompt_tokens} tokens (images included), the limit is {max_prompt}",
            code="context_length_exceeded",
            param="messages",
        )
    if max_context is not None and prompt_tokens + extra_tokens > max_context:
        raise RequestError(
            f"prompt ({prompt_tokens} tokens) + {extra_tokens} response tokens exceed the "
            f"model's context of {max_context}",
            code="context_length_exceeded",
            param="max_tokens",
        )
