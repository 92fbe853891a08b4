"""Request and result shapes of the policy and analyzer deployments (pydantic, no torch/ray).

Handle calls take a dict (or one of these models) and return a plain dict:

    policy.generate.remote({"messages": [...], "images": [png, ...], "temperature": 1.0})
      -> {"text", "prompt_ids", "response_ids", "logprobs", "weight_version", "finish_reason"}
    policy.score.remote({"messages": [...], "images": [...], "response_ids": [...]})
      -> {"logprobs", "weight_version", "num_prompt_tokens"}
    analyzer.analyze.remote({"instruction", "history", "screenshot_before", "screenshot_after",
                             "response", "action"})
      -> serve_apps.judgment.Judgment as a dict

Messages follow the chat-template convention: ``content`` is a string or a list of parts,
``{"type": "text", "text": ...}`` or ``{"type": "image"}``; the i-th image part is ``images[i]``
(encoded PNG/JPEG bytes). ``prompt_ids`` is exactly what the model saw, image pads expanded.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"] = "text"
    text: str


class ImagePart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["image"] = "image"


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant"]
    content: str | list[ContentPart]

    def num_images(self) -> int:
        if isinstance(self.content, str):
            return 0
        return sum(isinstance(p, ImagePart) for p in self.content)


class ChatInput(BaseModel):
    """A conversation and the images its image parts refer to, in order."""

    model_config = ConfigDict(extra="forbid")
    messages: list[ChatMessage] = Field(..., min_length=1)
    images: list[bytes] = Field(default_factory=list)

    @model_validator(mode="after")
    def _images_match_parts(self) -> ChatInput:
        parts = sum(m.num_images() for m in self.messages)
        if parts != len(self.images):
            raise ValueError(
                f"messages have {parts} image parts but {len(self.images)} images were given"
            )
        return self

    def message_dicts(self) -> list[dict[str, Any]]:
        return [m.model_dump() for m in self.messages]


class GenerateRequest(ChatInput):
    """Sample one response; unset sampling fields take the deployment's defaults."""

    temperature: float | None = Field(None, ge=0.0, le=10.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    max_new_tokens: int | None = Field(None, ge=1, le=32768)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)  # torch.manual_seed's range


class ScoreRequest(ChatInput):
    """Per-token log-probs of ``response_ids`` after the prompt (prefill only, no sampling)."""

    response_ids: list[int] = Field(..., min_length=1)

    @field_validator("response_ids")
    @classmethod
    def _non_negative(cls, ids: list[int]) -> list[int]:
        if min(ids) < 0:
            raise ValueError("response_ids must be non-negative token ids")
        return ids


class GenerateResult(BaseModel):
    text: str
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    weight_version: int
    finish_reason: Literal["stop", "length"]


class ScoreResult(BaseModel):
    logprobs: list[float]
    weight_version: int
    num_prompt_tokens: int


class Transition(BaseModel):
    """One executed step, as the analyzer sees it (METHOD.md §2)."""

    model_config = ConfigDict(extra="forbid")
    instruction: str
    history: list[str] = Field(default_factory=list, description="One line per earlier action.")
    screenshot_before: bytes
    screenshot_after: bytes
    response: str = Field(..., description="The policy's full response text.")
    action: str = Field(..., description="The executed action as JSON text.")
    context: str = Field(
        "", description="What the policy saw besides the screenshot (e.g. listed elements)."
    )

    @field_validator("action", mode="before")
    @classmethod
    def _action_json(cls, value: Any) -> Any:
        if isinstance(value, dict | list):
            return json.dumps(value, ensure_ascii=False)
        return value
