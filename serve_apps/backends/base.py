"""The inference backend interface shared by the transformers and vLLM engines.

A backend owns one model and its weight version. Every call runs entirely on one version and
returns it; :meth:`InferenceBackend.load_weights` replaces the weights atomically (no call ever
sees half-loaded weights) and only after checking the whole state dict against the model.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch
from PIL import Image

from serve_apps.errors import RequestError
from serve_apps.prompting.inputs import PromptEncoder
from serve_apps.weights.manifest import TensorSpec, WeightManifest

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class Sampling:
    """Resolved sampling parameters of one request (no unset fields)."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class ChatPrompt:
    """Messages (chat-template dicts) and their decoded images, in image-part order."""

    messages: list[dict[str, Any]]
    images: list[Image.Image] = field(default_factory=list)


@dataclass
class Generation:
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]  # log pi(y_t | prompt, y_<t) from the raw logits (temperature 1)
    text: str
    finish_reason: FinishReason
    weight_version: int


@dataclass
class Scored:
    logprobs: list[float]
    weight_version: int
    num_prompt_tokens: int


def manifest_of(state: Mapping[str, torch.Tensor]) -> WeightManifest:
    return {
        n: TensorSpec(tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in state.items()
    }


class Prepared(Protocol):
    """A prompt made ready for one backend (tensors, or token ids + images)."""

    @property
    def num_tokens(self) -> int:
        """Tokens the model will see, image pads expanded."""
        ...


class InferenceBackend(abc.ABC):
    """One model, one weight version at a time."""

    encoder: PromptEncoder
    vocab_size: int
    max_context_tokens: int | None = None

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Start the engine on the running event loop (optional)."""

    @property
    @abc.abstractmethod
    def version(self) -> int:
        """The version new requests run on."""

    @abc.abstractmethod
    def manifest(self) -> WeightManifest:
        """Every weight a publication must provide: name -> shape, dtype."""

    @abc.abstractmethod
    def prepare(self, prompt: ChatPrompt) -> Prepared:
        """Render and tokenize one prompt (CPU work, no model call); raises RequestError."""

    @abc.abstractmethod
    async def generate(
        self, prompts: Sequence[Any], sampling: Sequence[Sampling]
    ) -> list[Generation]:
        """Sample one response per prepared prompt; raw (temperature-1) log-probs."""

    @abc.abstractmethod
    async def score(
        self, prompts: Sequence[Any], responses: Sequence[Sequence[int]]
    ) -> list[Scored]:
        """Per-token log-probs of each response after its prepared prompt; prefill only."""

    @abc.abstractmethod
    async def load_weights(self, version: int, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace all weights with ``tensors`` and make ``version`` current, atomically."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release the engine (optional)."""

    def healthy(self) -> bool:
        return True

    def check_response_ids(self, responses: Sequence[Sequence[int]]) -> None:
        """Refuse ids the model cannot score: out of vocabulary, or vision placeholders (the
        model would take them for image slots; generation never samples them)."""
        vocab, vision = self.vocab_size, set(self.encoder.vision_token_ids)
        for i, ids in enumerate(responses):
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise RequestError(
                    f"response {i}: token ids {bad[:5]} outside the vocabulary [0, {vocab})",
                    param="response_ids",
                )
            placeholders = sorted(vision.intersection(ids))
            if placeholders:
                raise RequestError(
                    f"response {i}: contains vision placeholder token ids {placeholders}",
                    param="response_ids",
                )
