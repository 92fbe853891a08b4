"""What one micro-batch of rows costs: the RL objective and the SFT objective.

Both turn rows into model inputs (``train_loops.batching``), run the policy, and call the pure
losses (``train_loops.losses``). The training loop only sees :class:`Objective`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor

from train_loops.batching import (
    ImageEncoder,
    SequenceBatch,
    collate_rl,
    collate_sft,
    response_logprobs,
    right_aligned,
    sft_target_weights,
)
from train_loops.config import LossConfig
from train_loops.losses import (
    Metrics,
    RLCoefs,
    RLTerms,
    keep_finite,
    masked_mean,
    rl_loss,
    sft_loss,
)
from train_loops.schema import SampleError
from train_loops.self_distill import SelfDistillation, make_self_distillation

Row = dict[str, Any]

RL_FIELDS = (
    "prompt_ids",
    "response_ids",
    "behavior_logprobs",
    "privileged_logprobs",
    "screenshots",
    "advantage",
    "d",
    "v",
    "guide",
    "avoid",
)
SFT_FIELDS = ("prompt_ids", "target_ids", "screenshots")


class MicroStep(NamedTuple):
    """A micro-batch's loss (with graph), its metric means and its trained-token count."""

    loss: Tensor
    metrics: Metrics
    tokens: int


class Objective(Protocol):
    kind: str

    def micro_step(self, model: Any, rows: Sequence[Row]) -> MicroStep:
        """Forward ``rows`` through ``model`` (a module or DeepSpeed engine) → loss."""
        ...


def require_fields(rows: Sequence[Row], fields: Sequence[str], kind: str) -> None:
    """Raise :class:`SampleError` naming the first row that lacks one of ``fields``."""
    for row in rows:
        missing = [f for f in fields if f not in row]
        if missing:
            raise SampleError(f"{kind} sample {row.get('sample_id')!r} lacks fields {missing}")


def _with_entropy(metrics: Metrics, entropy: Tensor | None, batch: SequenceBatch) -> Metrics:
    if entropy is not None:
        metrics["policy/entropy"] = masked_mean(entropy, batch.loss_mask)
    return metrics


@dataclass
class RLObjective:
    """GRPO-clip + k3 KL (when a reference is given) + self-distillation (METHOD.md §4–§5)."""

    encoder: ImageEncoder
    coefs: RLCoefs
    variant: SelfDistillation
    device: torch.device | str = "cpu"
    dtype: torch.dtype = torch.float32
    reference: Any = None
    kind: str = "rl"

    @classmethod
    def from_config(cls, loss: LossConfig, encoder: ImageEncoder, **kw: Any) -> RLObjective:
        coefs = RLCoefs(
            clip_eps=loss.clip_eps,
            clip_eps_high=loss.clip_eps_high,
            tis_cap=loss.tis_cap,
            kl_coef=loss.kl_coef,
            kl_clamp=loss.kl_clamp,
            sd_coef=loss.sd_coef,
            ratio_anchor=loss.ratio_anchor,
        )
        return cls(encoder, coefs, make_self_distillation(loss.sd_type, loss.gate_beta), **kw)

    def micro_step(self, model: Any, rows: Sequence[Row]) -> MicroStep:
        require_fields(rows, RL_FIELDS, "RL")
        batch, terms = collate_rl(rows, self.encoder)
        batch = batch.to(self.device, self.dtype)
        terms = terms._replace(guided=has_guidance(rows))
        terms = RLTerms._make(None if t is None else t.to(self.device) for t in terms)
        logprobs, entropy = response_logprobs(model, batch, with_entropy=True)
        loss, metrics = rl_loss(logprobs, terms, self.coefs, self.variant, self._ref(batch))
        metrics.update(_guidance_gap(rows, terms))
        return MicroStep(loss, _with_entropy(metrics, entropy, batch), batch.num_tokens)

    def _ref(self, batch: SequenceBatch) -> Tensor | None:
        if self.reference is None:
            return None
        with torch.no_grad():
            ref, _ = response_logprobs(self.reference, batch)
        return ref


def has_guidance(rows: Sequence[Row]) -> Tensor:
    """[B] bool: the step's analyzer gave a guide or an avoid text. A step without guidance has
    no distillation target and is masked for self-distillation exactly like d = 0 (METHOD.md
    §2; the reference masks it too), whatever the variant."""
    texts = [str(r["guide"] or "").strip() or str(r["avoid"] or "").strip() for r in rows]
    return torch.tensor([bool(t) for t in texts], dtype=torch.bool)


def _guidance_gap(rows: Sequence[Row], terms: RLTerms) -> Metrics:
    """``sd/guidance_gap``: mean T_t - ordinary_t at the rescoring version, if rows carry it."""
    if not all("ordinary_logprobs" in r for r in rows):
        return {}
    window = terms.loss_mask.shape[1]
    ordinary = right_aligned([r["ordinary_logprobs"] for r in rows], window, 0.0, torch.float32)
    ordinary = ordinary.to(terms.privileged_logprobs.device)
    mask = keep_finite(terms.loss_mask, ordinary, terms.privileged_logprobs)
    return {"sd/guidance_gap": masked_mean(terms.privileged_logprobs - ordinary, mask)}


@dataclass
class SFTObjective:
    """Cross-entropy on the target tokens of SFT samples."""

    encoder: ImageEncoder
    device: torch.device | str = "cpu"
    dtype: torch.dtype = torch.float32
    kind: str = "sft"

    def micro_step(self, model: Any, rows: Sequence[Row]) -> MicroStep:
        require_fields(rows, SFT_FIELDS, "SFT")
        batch = collate_sft(rows, self.encoder).to(self.device, self.dtype)
        logprobs, entropy = response_logprobs(model, batch, with_entropy=True)
        weights = sft_target_weights(rows, batch.window)
        if weights is not None:
            weights = weights.to(self.device)
        loss, metrics = sft_loss(logprobs, batch.loss_mask, weights)
        return MicroStep(loss, _with_entropy(metrics, entropy, batch), batch.num_tokens)
