"""Typed observations and step results, decoded from the wire OBS dict.

Decoding is cheap on purpose (base64 → PNG bytes, size from the PNG header); the PIL image is
decoded on first use of :attr:`Observation.image`.
"""

from __future__ import annotations

import base64
import binascii
import io
import struct
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from env_client.a11y import A11yNode, parse_tree

if TYPE_CHECKING:
    from PIL import Image

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(png: bytes) -> tuple[int, int] | None:
    """(width, height) from a PNG's IHDR chunk, or None if it is not a PNG."""
    if len(png) < 24 or not png.startswith(_PNG_MAGIC) or png[12:16] != b"IHDR":
        return None
    w, h = struct.unpack(">II", png[16:24])
    return int(w), int(h)


@dataclass(eq=False)
class Observation:
    """One screen of the environment."""

    screenshot: bytes | None  # PNG
    accessibility_tree: str | None = None
    terminal: str | None = None
    instruction: str | None = None  # set on reset answers (MiniWoB) or from the task payload

    @property
    def has_screenshot(self) -> bool:
        return bool(self.screenshot)

    @cached_property
    def size(self) -> tuple[int, int]:
        """Screen (width, height) in pixels: the size actions are given in."""
        got = png_size(self.screenshot or b"")
        if got is None:
            raise ValueError("observation has no PNG screenshot")
        return got

    @cached_property
    def image(self) -> Image.Image:
        """The screenshot as an RGB PIL image (decoded once)."""
        from PIL import Image

        if not self.screenshot:
            raise ValueError("observation has no screenshot")
        return Image.open(io.BytesIO(self.screenshot)).convert("RGB")

    @cached_property
    def elements(self) -> list[A11yNode]:
        """The accessibility tree's nodes ([] when there is none or it is another format)."""
        return parse_tree(self.accessibility_tree)


def decode_observation(obs: Any, instruction: str | None = None) -> Observation:
    """Wire OBS → Observation. A missing or undecodable screenshot gives ``screenshot=None``."""
    modalities = obs.get("modalities", {}) if isinstance(obs, dict) else {}
    shot = modalities.get("screenshot") if isinstance(modalities, dict) else None
    png: bytes | None = None
    if isinstance(shot, str) and shot:
        try:
            png = base64.b64decode(shot, validate=False)
        except (binascii.Error, ValueError):
            png = None
    tree = modalities.get("accessibility_tree") if isinstance(modalities, dict) else None
    term = modalities.get("terminal") if isinstance(modalities, dict) else None
    return Observation(
        screenshot=png or None,
        accessibility_tree=tree if isinstance(tree, str) else None,
        terminal=term if isinstance(term, str) else None,
        instruction=instruction,
    )


@dataclass
class StepResult:
    """The answer of one step. ``reward`` is informational; the score comes from evaluate."""

    observation: Observation
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    executed: bool = True  # False: an invalid action, nothing was sent to the environment
