"""Hugging Face transformers backend (CPU default; one GPU works too).

Batches of prompts are left-padded into one call: ``model.generate`` for sampling (raw logits
kept, so the reported log-probs are those of the model at temperature 1, as vLLM's
``raw_logprobs``), one forward pass for scoring (``logits_to_keep`` limits the logits to the
response positions). Model calls run one at a time on a dedicated thread: Qwen3-VL keeps
per-call state (``rope_deltas``) on the module, and the event loop must stay free. Weights
live in :class:`VersionedSlots`, so a swap never overlaps a request on the same copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from serve_apps.backends.base import (
    ChatPrompt,
    Generation,
    InferenceBackend,
    Sampling,
    Scored,
    manifest_of,
)
from serve_apps.backends.versioned import VersionedSlots
from serve_apps.config import TransformersBackendConfig
from serve_apps.prompting.inputs import EncodedPrompt, PromptEncoder
from serve_apps.weights.manifest import WeightManifest, check_state_dict


class TransformersBackend(InferenceBackend):
    def __init__(
        self,
        cfg: TransformersBackendConfig,
        model_path: str,
        encoder: PromptEncoder,
        version: int = 0,
    ) -> None:
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        self.cfg = cfg
        self.encoder = encoder
        self.device = _device(cfg.device)
        model = load_model(model_path, self.device, cfg)
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.max_context_tokens = _max_positions(model)
        self._manifest = manifest_of(model.state_dict())
        eos = _eos_ids(model, encoder)
        self._ids = _SpecialIds(
            eos=eos,
            pad=_pad_id(encoder, eos),
            device=self.device,
            suppress=list(encoder.vision_token_ids),
        )
        standby = copy.deepcopy if cfg.double_buffer else None
        self.slots: VersionedSlots[Any] = VersionedSlots(model, version, standby)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="csd-model")

    @property
    def version(self) -> int:
        return self.slots.version

    def manifest(self) -> WeightManifest:
        return dict(self._manifest)

    def healthy(self) -> bool:
        return self.slots.broken is None

    def prepare(self, prompt: ChatPrompt) -> EncodedPrompt:
        return self.encoder.encode(prompt.messages, prompt.images)

    async def generate(
        self, prompts: Sequence[EncodedPrompt], sampling: Sequence[Sampling]
    ) -> list[Generation]:
        encoded = list(prompts)
        results: list[Generation | None] = [None] * len(prompts)
        async with self.slots.use() as (model, version):
            for group in _sampling_groups(sampling):
                batch = [encoded[i] for i in group]
                rows = await self._run(_generate_rows, model, batch, sampling[group[0]], self._ids)
                for i, (ids, lps, finish) in zip(group, rows, strict=True):
                    results[i] = Generation(
                        prompt_ids=encoded[i].prompt_ids,
                        response_ids=ids,
                        logprobs=lps,
                        text=self.encoder.decode(ids),
                        finish_reason=finish,
                        weight_version=version,
                    )
        return [r for r in results if r is not None]

    async def score(
        self, prompts: Sequence[EncodedPrompt], responses: Sequence[Sequence[int]]
    ) -> list[Scored]:
        self.check_response_ids(responses)
        encoded = list(prompts)
        async with self.slots.use() as (model, version):
            rows = await self._run(_score_rows, model, encoded, responses, self._ids)
        return [
            Scored(logprobs=lps, weight_version=version, num_prompt_tokens=e.num_tokens)
            for lps, e in zip(rows, encoded, strict=True)
        ]

    async def load_weights(self, version: int, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        named = dict(tensors)
        check_state_dict(
            self._manifest, {n: (tuple(t.shape), str(t.dtype)) for n, t in named.items()}
        )
        await self.slots.swap_in(version, lambda model: copy_weights(model, named))

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)


def load_model(path: str, device: torch.device, cfg: TransformersBackendConfig) -> Any:
    from transformers import AutoModelForImageTextToText, GenerationConfig

    dtype = _dtype(cfg.dtype, device)
    kwargs: dict[str, Any] = {"dtype": dtype}
    if cfg.attn_implementation:
        kwargs["attn_implementation"] = cfg.attn_implementation
    model: Any = AutoModelForImageTextToText.from_pretrained(path, **kwargs)
    model = model.to(device).eval()
    # Sampling is fully specified per request: drop the checkpoint's sampling defaults (a real
    # Qwen3-VL ships top_k=20, top_p=0.8, ...) so they can never leak into generate().
    gen = model.generation_config
    model.generation_config = GenerationConfig(
        eos_token_id=gen.eos_token_id, pad_token_id=gen.pad_token_id, bos_token_id=gen.bos_token_id
    )
    return model


@torch.no_grad()
def copy_weights(model: Any, named: dict[str, torch.Tensor]) -> None:
    """Write every tensor into the model's state in place (dtype/device cast on copy)."""
    state = model.state_dict()
    for name, tensor in named.items():
        state[name].copy_(tensor, non_blocking=False)


def collate(
    prompts: Sequence[EncodedPrompt],
    suffixes: Sequence[Sequence[int]] | None,
    pad_id: int,
    device: torch.device,
) -> dict[str, torch.Tensor]:
    """Left-pad prompts (each followed by its suffix ids, if given) into one batch."""
    seqs = []
    for i, p in enumerate(prompts):
        ids = p.input_ids[0]
        mm = p.mm_token_type_ids[0]
        if suffixes is not None:
            extra = torch.tensor(list(suffixes[i]), dtype=ids.dtype)
            ids, mm = torch.cat([ids, extra]), torch.cat([mm, torch.zeros_like(extra)])
        seqs.append((ids, mm))
    width = max(len(ids) for ids, _ in seqs)
    input_ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mm_types = torch.zeros((len(seqs), width), dtype=seqs[0][1].dtype)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, (ids, mm) in enumerate(seqs):
        input_ids[row, width - len(ids) :] = ids
        mm_types[row, width - len(ids) :] = mm
        mask[row, width - len(ids) :] = 1
    batch = {"input_ids": input_ids, "attention_mask": mask, "mm_token_type_ids": mm_types}
    pixels = [p.pixel_values for p in prompts if p.pixel_values is not None]
    if pixels:
        batch["pixel_values"] = torch.cat(pixels)
        batch["image_grid_thw"] = torch.cat(
            [p.image_grid_thw for p in prompts if p.image_grid_thw is not None]
        )
    return {k: v.to(device) for k, v in batch.items()}


@dataclass(frozen=True)
class _SpecialIds:
    eos: list[int]
    pad: int
    device: torch.device
    suppress: list[int]  # never sampled: vision placeholders would corrupt later prompts


def _generate_rows(
    model: Any, prompts: list[EncodedPrompt], s: Sampling, ids: _SpecialIds
) -> list[tuple[list[int], list[float], str]]:
    from transformers import GenerationConfig

    batch = collate(prompts, None, ids.pad, ids.device)
    gen = GenerationConfig(
        do_sample=not s.greedy,
        temperature=None if s.greedy else s.temperature,
        top_p=None if s.greedy or s.top_p >= 1.0 else s.top_p,
        top_k=None if s.greedy else 0,
        suppress_tokens=ids.suppress or None,
        max_new_tokens=s.max_new_tokens,
        eos_token_id=ids.eos,
        pad_token_id=ids.pad,
        output_logits=True,
        return_dict_in_generate=True,
    )
    with torch.no_grad(), _seeded(s.seed, ids.device):
        out = model.generate(**batch, generation_config=gen)
    new = out.sequences[:, batch["input_ids"].shape[1] :].cpu()
    logits = torch.stack(out.logits, dim=1).float().cpu()  # [B, T, V], raw (unprocessed)
    logp = torch.log_softmax(logits, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
    return [_trim_row(new[r], logp[r], ids.eos) for r in range(new.shape[0])]


@contextlib.contextmanager
def _seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    """Seed the global RNG for one call and restore it after (model calls are serialized)."""
    if seed is None:
        yield
        return
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def _trim_row(
    ids: torch.Tensor, logp: torch.Tensor, eos: list[int]
) -> tuple[list[int], list[float], str]:
    """Cut a generated row after its first EOS (kept: the model sampled it)."""
    tokens = ids.tolist()
    for t, tok in enumerate(tokens):
        if tok in eos:
            return tokens[: t + 1], logp[: t + 1].tolist(), "stop"
    return tokens, logp.tolist(), "length"


def _score_rows(
    model: Any, prompts: list[EncodedPrompt], responses: Sequence[Sequence[int]], ids: _SpecialIds
) -> list[list[float]]:
    batch = collate(prompts, responses, ids.pad, ids.device)
    keep = max(len(r) for r in responses) + 1
    with torch.no_grad():
        logits = model(**batch, logits_to_keep=keep).logits.float()  # [B, keep, V]
    logp = torch.log_softmax(logits, dim=-1)
    out = []
    for row, resp in enumerate(responses):
        n = len(resp)
        # Row ends with the response (left padding): position -1-n predicts its first token.
        pos = logp[row, keep - 1 - n : keep - 1]
        target = torch.tensor(list(resp), device=pos.device)
        out.append(pos.gather(-1, target.unsqueeze(-1)).squeeze(-1).cpu().tolist())
    return out


def _sampling_groups(sampling: Sequence[Sampling]) -> list[list[int]]:
    """Indices of requests that can share one generate call (same params, no seed)."""
    groups: list[list[int]] = []
    keyed: dict[Sampling, list[int]] = {}
    for i, s in enumerate(sampling):
        if s.seed is not None:
            groups.append([i])  # a seeded request is sampled alone, reproducibly
        else:
            keyed.setdefault(s, []).append(i)
    return list(keyed.values()) + groups


def _device(choice: str) -> torch.device:
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(choice)


def _dtype(choice: str, device: torch.device) -> torch.dtype:
    if choice == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, choice)


def _eos_ids(model: Any, encoder: PromptEncoder) -> list[int]:
    eos = model.generation_config.eos_token_id
    ids = [eos] if isinstance(eos, int) else list(eos or [])
    im_end = encoder.tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end >= 0 and im_end not in ids:
        ids.append(im_end)
    return ids


def _pad_id(encoder: PromptEncoder, eos: list[int]) -> int:
    pad = encoder.tokenizer.pad_token_id
    return int(pad) if pad is not None else eos[0]


def _max_positions(model: Any) -> int | None:
    text = model.config.get_text_config()
    return getattr(text, "max_position_embeddings", None)
