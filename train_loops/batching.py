"""Step samples → model inputs, and the current policy's log-probs of the sampled tokens.

Layout. Each sequence is ``prompt_ids + response_ids`` exactly as sampled (never
re-tokenized), **left**-padded to the batch's longest sequence, so that every response ends at
the last position. Token-level training tensors then live in a *response window* ``[B, T]``
(T = the longest response): sample b's response fills its last ``n_b`` columns, the loss mask
is True exactly there, and the model only needs logits for the last T+1 positions
(``logits_to_keep``), never for the whole prompt. Padding is masked out of attention and of
every loss, so per-sample token means are exact; no packing is done.

Screenshots (PNG bytes, in prompt order) go through the checkpoint's image processor; the
prompt must already hold the matching number of image-pad tokens (the processor's expansion),
which is checked. ``mm_token_type_ids`` is 1 at image-pad tokens, 0 elsewhere.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from train_loops.losses import RLTerms
from train_loops.schema import SampleError

Row = Mapping[str, Any]


class ModelInputs(NamedTuple):
    """Keyword arguments of a Qwen3-VL forward. [B, L] token tensors, images flattened."""

    input_ids: Tensor
    attention_mask: Tensor
    mm_token_type_ids: Tensor
    pixel_values: Tensor | None
    image_grid_thw: Tensor | None

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> ModelInputs:
        """Move to ``device``; ``dtype`` applies to ``pixel_values`` only."""
        pv = self.pixel_values
        if pv is not None:
            pv = pv.to(device=device, dtype=dtype or pv.dtype)
        thw = None if self.image_grid_thw is None else self.image_grid_thw.to(device)
        return ModelInputs(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.mm_token_type_ids.to(device),
            pv,
            thw,
        )


@dataclass
class SequenceBatch:
    """Model inputs plus the response window: ``targets`` and ``loss_mask`` are [B, T]."""

    inputs: ModelInputs
    targets: Tensor
    loss_mask: Tensor

    @property
    def window(self) -> int:
        return int(self.targets.shape[1])

    @property
    def num_tokens(self) -> int:
        return int(self.loss_mask.sum())

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> SequenceBatch:
        return SequenceBatch(
            self.inputs.to(device, dtype), self.targets.to(device), self.loss_mask.to(device)
        )


@dataclass(frozen=True)
class ImageEncoder:
    """The checkpoint's image processor plus the ids that tie images to prompt tokens."""

    image_processor: Any
    image_token_id: int
    pad_token_id: int
    merge_size: int

    @classmethod
    def from_pretrained(cls, model_path: str) -> ImageEncoder:
        """Read the processor and model config of a Hugging Face checkpoint folder."""
        from transformers import AutoConfig, AutoProcessor

        processor = AutoProcessor.from_pretrained(model_path)
        config = AutoConfig.from_pretrained(model_path)
        pad = processor.tokenizer.pad_token_id
        return cls(
            image_processor=processor.image_processor,
            image_token_id=int(config.image_token_id),
            pad_token_id=int(pad if pad is not None else 0),
            merge_size=int(processor.image_processor.merge_size),
        )

    def encode(self, screenshots: Sequence[bytes]) -> tuple[Tensor | None, Tensor | None]:
        """PNG bytes → (pixel_values [P, D], image_grid_thw [I, 3]); (None, None) if none."""
        if not screenshots:
            return None, None
        from PIL import Image

        images = [Image.open(io.BytesIO(b)).convert("RGB") for b in screenshots]
        out = self.image_processor(images=images, return_tensors="pt")
        return out["pixel_values"], out["image_grid_thw"]

    def tokens_per_image(self, grid_thw: Tensor) -> Tensor:
        """[I, 3] → [I] number of image-pad tokens each image takes in the prompt."""
        return grid_thw.prod(dim=-1) // (self.merge_size**2)


def right_aligned(values: Sequence[Sequence[float]], width: int, fill: float, dtype) -> Tensor:
    """Ragged rows → [B, width], each row's values in its last ``len(row)`` columns."""
    out = torch.full((len(values), width), fill, dtype=dtype)
    for i, row in enumerate(values):
        if len(row):
            out[i, width - len(row) :] = torch.as_tensor(row, dtype=dtype)
    return out


def build_sequence_batch(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    screenshots: Sequence[Sequence[bytes]],
    encoder: ImageEncoder,
    sample_ids: Sequence[str] | None = None,
) -> SequenceBatch:
    """Left-padded ``prompt + response`` sequences with the response window (see module doc)."""
    if any(len(p) == 0 for p in prompts):
        raise SampleError("a sample has an empty prompt; every response needs a context")
    seqs = [list(p) + list(r) for p, r in zip(prompts, responses, strict=True)]
    length = max((len(s) for s in seqs), default=0)
    window = max((len(r) for r in responses), default=0)
    ids = right_aligned(seqs, length, encoder.pad_token_id, torch.long)
    attention = right_aligned([[1] * len(s) for s in seqs], length, 0, torch.long)
    flat = [img for shots in screenshots for img in shots]
    pixel_values, grid_thw = encoder.encode(flat)
    _check_image_tokens(prompts, responses, screenshots, grid_thw, encoder, sample_ids)
    mm_types = ((ids == encoder.image_token_id) & (attention == 1)).long()
    targets = ids[:, length - window :] if window else ids[:, :0]
    mask = right_aligned([[True] * len(r) for r in responses], window, False, torch.bool)
    inputs = ModelInputs(ids, attention, mm_types, pixel_values, grid_thw)
    return SequenceBatch(inputs, targets, mask)


def _check_image_tokens(prompts, responses, screenshots, grid_thw, encoder, sample_ids) -> None:
    """Image-pad tokens must match the screenshots' features exactly, and only in prompts: the
    model would otherwise fail deep inside its forward with no sample named."""
    per_image = [] if grid_thw is None else encoder.tokens_per_image(grid_thw).tolist()
    start = 0
    for i, (prompt, shots) in enumerate(zip(prompts, screenshots, strict=True)):
        expected = sum(per_image[start : start + len(shots)])
        start += len(shots)
        found = sum(1 for t in prompt if t == encoder.image_token_id)
        in_response = sum(1 for t in responses[i] if t == encoder.image_token_id)
        name = sample_ids[i] if sample_ids else i
        if found != expected:
            raise SampleError(
                f"sample {name!r}: prompt has {found} image-pad tokens, its "
                f"{len(shots)} screenshot(s) need {expected} (processor mismatch?)"
            )
        if in_response:
            raise SampleError(
                f"sample {name!r}: response has {in_response} image-pad token(s); the "
                "policy backend must never sample vision tokens"
            )


def collate_rl(rows: Sequence[Row], encoder: ImageEncoder) -> tuple[SequenceBatch, RLTerms]:
    """Step samples (``train_loops.schema.STEP_SAMPLE_SCHEMA`` rows) → inputs + RL constants."""
    for row in rows:
        _check_lengths(row, "response_ids", ("behavior_logprobs", "privileged_logprobs"))
    batch = _sequences(rows, "response_ids", encoder)
    window = batch.window

    def tokens(name: str) -> Tensor:
        return right_aligned([r[name] for r in rows], window, 0.0, torch.float32)

    def per_sample(name: str) -> Tensor:
        return torch.tensor([float(r[name]) for r in rows], dtype=torch.float32)

    terms = RLTerms(
        behavior_logprobs=tokens("behavior_logprobs"),
        privileged_logprobs=tokens("privileged_logprobs"),
        advantages=per_sample("advantage"),
        d=per_sample("d"),
        v=per_sample("v"),
        loss_mask=batch.loss_mask,
    )
    return batch, terms


def collate_sft(rows: Sequence[Row], encoder: ImageEncoder) -> SequenceBatch:
    """SFT samples (``train_loops.schema.SFT_SAMPLE_SCHEMA`` rows) → inputs, mask on targets."""
    return _sequences(rows, "target_ids", encoder)


def sft_target_weights(rows: Sequence[Row], window: int) -> Tensor | None:
    """[B, window] weights of the SFT target tokens, aligned like ``loss_mask`` (1 where a row
    gives none); None when no row gives any (the plain token mean)."""
    if all(r.get("target_weights") is None for r in rows):
        return None
    return right_aligned([_weights(r) for r in rows], window, 0.0, torch.float32)


def _weights(row: Row) -> Sequence[float]:
    w = row.get("target_weights")
    return [1.0] * len(row["target_ids"]) if w is None else w


def _sequences(rows: Sequence[Row], response_field: str, encoder: ImageEncoder) -> SequenceBatch:
    return build_sequence_batch(
        [r["prompt_ids"] for r in rows],
        [r[response_field] for r in rows],
        [r.get("screenshots") or [] for r in rows],
        encoder,
        [str(r.get("sample_id", i)) for i, r in enumerate(rows)],
    )


def _check_lengths(row: Row, ids_field: str, per_token: Sequence[str]) -> None:
    n = len(row[ids_field])
    for name in per_token:
        if len(row[name]) != n:
            raise SampleError(
                f"sample {row.get('sample_id')!r}: {name} has {len(row[name])} entries, "
                f"{ids_field} has {n}"
            )


def response_logprobs(
    model: torch.nn.Module, batch: SequenceBatch, with_entropy: bool = False
) -> tuple[Tensor, Tensor | None]:
    """log π(y_t | c, y_<t) over the response window: [B, T]; entropy [B, T] (no grad) if asked.

    Only the last T+1 positions' logits are computed; logits are upcast to fp32 before the
    log-softmax. Positions outside ``batch.loss_mask`` hold meaningless values.
    """
    t = batch.window
    out = model(**batch.inputs._asdict(), logits_to_keep=t + 1, use_cache=False)
    logp = torch.log_softmax(out.logits[:, :-1].float(), dim=-1)
    lp = logp.gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = torch.special.entr(logp.exp()).sum(dim=-1)
    return lp, entropy
