"""Self-distillation variants of METHOD.md §5, each a small class behind one interface.

``ℓ_t = direction · gate · magnitude · (T_t - s_t)``; the loss function in
``train_loops.losses`` does the masking and reduction, a variant only says

- ``direction(d)``: [B] effective verdict (0 masks the sample),
- ``gate(delta, direction)``: [B, T] g_t from Δ_t = T_t - sg[s_t] (detached by the caller),
- ``magnitude(v)``: [B] a per-sample scale m.

Pick one by name with :func:`make_self_distillation` (the ``LossConfig.sd_type`` choices).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor


class SelfDistillation(Protocol):
    """One self-distillation variant."""

    def direction(self, d: Tensor) -> Tensor:
        """[B] analyzer direction d ∈ {-1, 0, +1} → [B] effective direction."""
        ...

    def gate(self, delta: Tensor, direction: Tensor) -> Tensor:
        """Δ [B, T] and direction [B, 1] → gate g [B, T] in [0, 1]."""
        ...

    def magnitude(self, v: Tensor) -> Tensor:
        """[B] step value v ∈ [0, 1] → [B] scale m."""
        ...


@dataclass(frozen=True)
class GatedSD:
    """The method: ``g = sigmoid(β·d·Δ)``, m = 1; d = 0 masks the step."""

    beta: float = 5.0

    def direction(self, d: Tensor) -> Tensor:
        return d

    def gate(self, delta: Tensor, direction: Tensor) -> Tensor:
        return torch.sigmoid(self.beta * direction * delta)

    def magnitude(self, v: Tensor) -> Tensor:
        return torch.ones_like(v)


@dataclass(frozen=True)
class UngatedSD(GatedSD):
    """Ablation: the verdict is ignored, d = +1 on every step (also where the analyzer gave 0)."""

    def direction(self, d: Tensor) -> Tensor:
        return torch.ones_like(d)


@dataclass(frozen=True)
class HardSD(GatedSD):
    """Ablation: a hard gate ``g = 1[β·d·Δ > 0]``."""

    def gate(self, delta: Tensor, direction: Tensor) -> Tensor:
        return (self.beta * direction * delta > 0).to(delta.dtype)


@dataclass(frozen=True)
class ContinuousSD(GatedSD):
    """Ablation: the gated loss scaled by the step value's confidence ``m = |2v - 1|``."""

    def magnitude(self, v: Tensor) -> Tensor:
        return (2.0 * v - 1.0).abs()


@dataclass(frozen=True)
class NoGateSD(GatedSD):
    """Ablation (the authors' gate off): ``g = 1``, the verdict's direction kept, d = 0 masked."""

    def gate(self, delta: Tensor, direction: Tensor) -> Tensor:
        return torch.ones_like(delta)


@dataclass(frozen=True)
class NoJudgeSD(GatedSD):
    """Ablation (the authors' judge gate off, SEED's loss): direction +1 on every judged step,
    ``g = sigmoid(β·Δ)``; unlike ``ungated``, steps the analyzer left at d = 0 stay masked."""

    def direction(self, d: Tensor) -> Tensor:
        return (d != 0).to(d.dtype)


@dataclass(frozen=True)
class OffSD(GatedSD):
    """Ablation: GRPO only; every sample is masked, the loss is 0."""

    def direction(self, d: Tensor) -> Tensor:
        return torch.zeros_like(d)


VARIANTS: dict[str, type[GatedSD]] = {
    "gated": GatedSD,
    "ungated": UngatedSD,
    "hard": HardSD,
    "continuous": ContinuousSD,
    "nogate": NoGateSD,
    "nojudge": NoJudgeSD,
    "off": OffSD,
}


def make_self_distillation(sd_type: str, beta: float = 5.0) -> SelfDistillation:
    """The variant named ``sd_type`` (one of :data:`VARIANTS`) with gate temperature ``beta``."""
    try:
        return VARIANTS[sd_type](beta=beta)
    except KeyError:
        raise ValueError(f"unknown sd_type {sd_type!r}; choose from {sorted(VARIANTS)}") from None
