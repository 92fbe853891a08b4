"""Chat messages + screenshots -> model inputs, through the checkpoint's own processor.

The one prompt builder of the project: the same code for a tiny checkpoint and a real
Qwen3-VL-8B, because both are loaded with ``AutoProcessor.from_pretrained(path)`` and rendered
with the checkpoint's chat template. The processor expands each ``<|image_pad|>`` into
``t*h*w / merge**2`` pads, so ``prompt_ids`` is exactly the sequence the model sees.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from serve_apps.errors import RequestError

ALLOWED_IMAGE_FORMATS = frozenset({"PNG", "JPEG", "WEBP", "GIF", "BMP"})
END_OF_TURN = "<|im_end|>"
VISION_TOKENS = (
    "<|image_pad|>",
    "<|video_pad|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
)


@dataclass
class EncodedPrompt:
    """One prompt as tensors (batch of one) plus its token ids as a list."""

    input_ids: torch.Tensor  # [1, L] int64
    attention_mask: torch.Tensor  # [1, L]
    mm_token_type_ids: torch.Tensor  # [1, L]; 0 text, 1 image
    pixel_values: torch.Tensor | None  # [sum(t*h*w), C*T*P*P] patches of all images
    image_grid_thw: torch.Tensor | None  # [num_images, 3]

    @property
    def prompt_ids(self) -> list[int]:
        return self.input_ids[0].tolist()

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    def model_kwargs(self) -> dict[str, torch.Tensor]:
        out = {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "mm_token_type_ids": self.mm_token_type_ids,
        }
        if self.pixel_values is not None:
            out["pixel_values"] = self.pixel_values
            out["image_grid_thw"] = self.image_grid_thw  # type: ignore[assignment]
        return out


@dataclass(frozen=True)
class ImageLimits:
    max_images: int = 8
    max_bytes: int = 8 << 20
    max_pixels: int = 4096 * 4096


class PromptEncoder:
    """Renders and tokenizes conversations with a checkpoint's processor."""

    def __init__(self, processor: Any, limits: ImageLimits | None = None) -> None:
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.limits = limits or ImageLimits()
        self.image_token_id = int(self.tokenizer.convert_tokens_to_ids("<|image_pad|>"))
        self.merge_size = int(getattr(processor.image_processor, "merge_size", 2))
        self.vision_token_ids = _known_ids(self.tokenizer, VISION_TOKENS)

    @classmethod
    def from_pretrained(cls, path: str | Path, limits: ImageLimits | None = None) -> PromptEncoder:
        from transformers import AutoProcessor

        return cls(AutoProcessor.from_pretrained(str(path)), limits)

    def render(self, messages: Sequence[dict[str, Any]]) -> str:
        """The chat template's text with one ``<|image_pad|>`` per image, ending with the
        assistant turn's opening (generation prompt)."""
        try:
            return self.processor.apply_chat_template(
                list(messages), add_generation_prompt=True, tokenize=False
            )
        except Exception as exc:  # the template rejects roles/orders it cannot render
            raise RequestError(f"chat template cannot render the messages: {exc}") from exc

    def load_images(self, images: Sequence[bytes | Image.Image]) -> list[Image.Image]:
        """Decode and check images (count, size, format); RGB PIL images out."""
        if len(images) > self.limits.max_images:
            raise RequestError(
                f"{len(images)} images, at most {self.limits.max_images} allowed", param="images"
            )
        return [self._load_image(i, img) for i, img in enumerate(images)]

    def encode(
        self, messages: Sequence[dict[str, Any]], images: Sequence[Image.Image]
    ) -> EncodedPrompt:
        """Tensors for one prompt; ``images`` already loaded (see :meth:`load_images`)."""
        text = self.render(messages)
        kwargs: dict[str, Any] = {"text": [text], "return_tensors": "pt"}
        if images:
            kwargs["images"] = list(images)
        out = self.processor(**kwargs)
        ids = out["input_ids"]
        mm = out.get("mm_token_type_ids")
        if mm is None:  # processors that do not emit it: derive from the image pads
            mm = (ids == self.image_token_id).long()
        return EncodedPrompt(
            input_ids=ids,
            attention_mask=out["attention_mask"],
            mm_token_type_ids=mm,
            pixel_values=out.get("pixel_values") if images else None,
            image_grid_thw=out.get("image_grid_thw") if images else None,
        )

    def text_ids(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        """Token ids of the rendered template with image pads NOT expanded (one per image), as
        engines that expand placeholders themselves (vLLM) expect."""
        return list(self.tokenizer(self.render(messages), add_special_tokens=False)["input_ids"])

    def answer_ids(self, text: str) -> list[int]:
        """Token ids of an assistant answer as a model should learn to end it: the text, then
        the end of the turn (``<|im_end|>``, else the tokenizer's eos). SFT targets use this."""
        tok = self.tokenizer
        eot = tok.convert_tokens_to_ids(END_OF_TURN)
        end = [eot] if isinstance(eot, int) and eot != tok.unk_token_id else []
        if not end and tok.eos_token_id is not None:
            end = [int(tok.eos_token_id)]
        return list(tok.encode(text, add_special_tokens=False)) + end

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def image_pad_count(self, grid_thw: torch.Tensor) -> int:
        """Pads the processor writes for images of these grids: sum of t*h*w / merge**2."""
        return int((grid_thw.prod(-1) // (self.merge_size**2)).sum())

    def _load_image(self, index: int, data: bytes | Image.Image) -> Image.Image:
        if isinstance(data, Image.Image):
            image = data
        else:
            if not isinstance(data, bytes | bytearray | memoryview):
                raise RequestError(f"image {index}: expected bytes, got {type(data).__name__}")
            if len(data) > self.limits.max_bytes:
                raise RequestError(
                    f"image {index}: {len(data)} bytes, at most {self.limits.max_bytes} allowed",
                    param="images",
                )
            image = _open_image(index, bytes(data))
        w, h = image.size
        if w * h > self.limits.max_pixels or w < 1 or h < 1:
            raise RequestError(
                f"image {index}: {w}x{h} pixels, at most {self.limits.max_pixels} allowed",
                param="images",
            )
        return image.convert("RGB") if image.mode != "RGB" else image


def _known_ids(tokenizer: Any, tokens: Sequence[str]) -> list[int]:
    """Ids of the tokens the vocabulary has (unknown ones map to the unk id or None)."""
    unk = tokenizer.unk_token_id
    ids = [tokenizer.convert_tokens_to_ids(t) for t in tokens]
    return [int(i) for i in ids if isinstance(i, int) and i >= 0 and i != unk]


def _open_image(index: int, data: bytes) -> Image.Image:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            fmt = image.format
            image.load()
    except Exception as exc:
        raise RequestError(f"image {index}: not a decodable image ({exc})", param="images") from exc
    if fmt not in ALLOWED_IMAGE_FORMATS:
        raise RequestError(
            f"image {index}: format {fmt} not accepted (use {sorted(ALLOWED_IMAGE_FORMATS)})",
            param="images",
        )
    return image
