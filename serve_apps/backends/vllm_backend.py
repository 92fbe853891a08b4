"""vLLM backend (GPU; ``pip install .[gpu]``). vLLM is imported only when this backend starts.

Written against vLLM's documented V1 engine API:

- ``AsyncLLM.from_engine_args(AsyncEngineArgs(...))``; ``engine.generate(prompt, params,
  request_id)`` streams ``RequestOutput``; the final one carries ``prompt_token_ids`` (image
  placeholders expanded by vLLM's multimodal processor), ``outputs[0].token_ids``,
  ``outputs[0].logprobs`` and ``prompt_logprobs``.
- Prompts are ``{"prompt_token_ids": ids, "multi_modal_data": {"image": [PIL, ...]}}`` with one
  ``<|image_pad|>`` per image (vLLM expands it, as the HF processor does).
- ``logprobs_mode="raw_logprobs"``: log-probs of the model's own distribution (before
  temperature/top-p/bias), the same quantity the transformers backend and the trainer compute.
- Scoring is a prefill with ``prompt_logprobs=0`` and ``max_tokens=1``; the response's log-probs
  are the last ``len(response)`` prompt positions.
- Weight swap: ``engine.collective_rpc`` calls :mod:`serve_apps.backends.vllm_worker` (a
  ``worker_extension_cls``) on every worker, which feeds HF-named tensors to the model's own
  ``load_weights`` (the verl/OpenRLHF pattern), then the prefix cache is reset. A
  read/write gate (single-slot :class:`VersionedSlots`) drains running requests first and holds
  new ones during the load, so no request ever mixes versions.

The pure helpers (sampling arguments, output conversion, bucketing, prompt preparation) are
shared with CPU tests; only :class:`VLLMBackend` itself needs vLLM and a GPU.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from serve_apps.backends.base import (
    ChatPrompt,
    FinishReason,
    Generation,
    InferenceBackend,
    Sampling,
    Scored,
)
from serve_apps.backends.versioned import VersionedSlots
from serve_apps.config import VLLMBackendConfig
from serve_apps.errors import RequestError
from serve_apps.prompting.inputs import PromptEncoder
from serve_apps.weights.manifest import TensorSpec, WeightManifest, check_state_dict

WORKER_EXTENSION = "serve_apps.backends.vllm_worker.CsdWeightLoader"
SUPPRESS_BIAS = -100.0


@dataclass
class VLLMPrompt:
    """A prompt for vLLM: template ids with one pad per image, the images, the expanded length."""

    text_ids: list[int]
    images: list[Image.Image]
    num_tokens: int

    def engine_input(self, suffix: Sequence[int] = ()) -> dict[str, Any]:
        out: dict[str, Any] = {"prompt_token_ids": self.text_ids + list(suffix)}
        if self.images:
            out["multi_modal_data"] = {"image": list(self.images)}
        return out


def prepare_prompt(encoder: PromptEncoder, prompt: ChatPrompt) -> VLLMPrompt:
    """Template ids (placeholders unexpanded) and the expanded token count, from the same
    processor the transformers backend uses."""
    ids = encoder.text_ids(prompt.messages)
    pads = ids.count(encoder.image_token_id)
    if pads != len(prompt.images):
        raise RequestError(f"prompt has {pads} image placeholders for {len(prompt.images)} images")
    extra = 0
    if prompt.images:
        grid = encoder.processor.image_processor(images=prompt.images, return_tensors="pt")
        extra = encoder.image_pad_count(grid["image_grid_thw"]) - pads
    return VLLMPrompt(ids, list(prompt.images), len(ids) + extra)


def sampling_kwargs(s: Sampling, suppress: Sequence[int], eos: Sequence[int]) -> dict[str, Any]:
    """``vllm.SamplingParams`` arguments for one request (top-k off, vision ids suppressed)."""
    kwargs: dict[str, Any] = {
        "n": 1,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": 0,
        "max_tokens": s.max_new_tokens,
        "logprobs": 0,  # the sampled token's log-prob only
        "stop_token_ids": list(eos),
        "skip_special_tokens": True,
    }
    if s.seed is not None:
        kwargs["seed"] = s.seed
    if suppress:
        kwargs["logit_bias"] = {int(t): SUPPRESS_BIAS for t in suppress}
    return kwargs


def score_kwargs() -> dict[str, Any]:
    """Prefill-only scoring: one throwaway token, the given tokens' log-probs."""
    return {"n": 1, "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0, "detokenize": False}


def token_logprob(entry: Any, token_id: int) -> float:
    """Log-prob of ``token_id`` in one position's ``{token_id: Logprob}`` mapping."""
    if entry is None or token_id not in entry:
        raise RuntimeError(f"engine returned no log-prob for token {token_id}")
    value = entry[token_id]
    return float(getattr(value, "logprob", value))


def generation_from_output(output: Any, version: int, decode: Any) -> Generation:
    """A final ``RequestOutput`` -> :class:`Generation` (EOS kept, like the transformers one)."""
    completion = output.outputs[0]
    ids = list(completion.token_ids)
    logprobs = [token_logprob(e, t) for e, t in zip(completion.logprobs or [], ids, strict=True)]
    if len(logprobs) != len(ids):
        raise RuntimeError(f"{len(logprobs)} log-probs for {len(ids)} tokens")
    if completion.finish_reason not in ("stop", "length"):
        raise RuntimeError(f"request ended with finish_reason={completion.finish_reason!r}")
    finish: FinishReason = "stop" if completion.finish_reason == "stop" else "length"
    return Generation(
        prompt_ids=list(output.prompt_token_ids),
        response_ids=ids,
        logprobs=logprobs,
        text=decode(ids),
        finish_reason=finish,
        weight_version=version,
    )


def response_logprobs(prompt_logprobs: Sequence[Any], response_ids: Sequence[int]) -> list[float]:
    """Log-probs of the response: the last ``len(response_ids)`` prompt positions."""
    n = len(response_ids)
    tail = list(prompt_logprobs)[-n:]
    if len(tail) != n:
        raise RuntimeError(f"{len(tail)} prompt log-probs for a {n}-token response")
    return [token_logprob(e, t) for e, t in zip(tail, response_ids, strict=True)]


def weight_buckets(
    tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive groups of about ``bucket_bytes`` (one RPC each)."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def checkpoint_manifest(path: str | Path) -> WeightManifest:
    """Names, shapes, dtypes of the checkpoint's safetensors (headers only; HF names)."""
    from safetensors import safe_open

    folder = Path(path)
    index = folder / "model.safetensors.index.json"
    files = (
        sorted({folder / f for f in json.loads(index.read_text())["weight_map"].values()})
        if index.exists()
        else sorted(folder.glob("*.safetensors"))
    )
    manifest: WeightManifest = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                sl = f.get_slice(name)
                dtype = str(_SAFETENSORS_DTYPES.get(sl.get_dtype(), sl.get_dtype()))
                manifest[name] = TensorSpec(tuple(sl.get_shape()), dtype)
    return manifest


_SAFETENSORS_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "I64": "int64"}


class VLLMBackend(InferenceBackend):
    def __init__(
        self, cfg: VLLMBackendConfig, model_path: str, encoder: PromptEncoder, version: int = 0
    ) -> None:
        self.cfg = cfg
        self.model_path = model_path
        self.encoder = encoder
        self.max_context_tokens = cfg.max_model_len
        self._manifest = checkpoint_manifest(model_path)
        self._initial_version = version
        self._eos = _eos_ids(model_path, encoder)
        self.slots: VersionedSlots[Any] | None = None
        self.vocab_size = len(encoder.tokenizer)

    async def start(self) -> None:
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(
            model=self.model_path,
            dtype=self.cfg.dtype,
            tensor_parallel_size=self.cfg.tensor_parallel_size,
            gpu_memory_utilization=self.cfg.gpu_memory_utilization,
            max_model_len=self.cfg.max_model_len,
            max_num_seqs=self.cfg.max_num_seqs,
            enable_prefix_caching=self.cfg.enable_prefix_caching,
            enforce_eager=self.cfg.enforce_eager,
            limit_mm_per_prompt={"image": self.cfg.max_images_per_prompt},
            seed=self.cfg.seed,
            logprobs_mode="raw_logprobs",
            generation_config="vllm",  # ignore the checkpoint's sampling defaults
            worker_extension_cls=WORKER_EXTENSION,
        )
        engine = AsyncLLM.from_engine_args(args)
        self.vocab_size = int(engine.model_config.get_vocab_size())
        self.slots = VersionedSlots(engine, self._initial_version, None)

    @property
    def version(self) -> int:
        return self._initial_version if self.slots is None else self.slots.version

    def manifest(self) -> WeightManifest:
        return dict(self._manifest)

    def healthy(self) -> bool:
        return self.slots is not None and self.slots.broken is None

    def prepare(self, prompt: ChatPrompt) -> VLLMPrompt:
        return prepare_prompt(self.encoder, prompt)

    async def generate(
        self, prompts: Sequence[VLLMPrompt], sampling: Sequence[Sampling]
    ) -> list[Generation]:
        import asyncio

        from vllm import SamplingParams

        assert self.slots is not None, "start() first"
        suppress = self.encoder.vision_token_ids
        async with self.slots.use() as (engine, version):
            outs = await asyncio.gather(
                *[
                    _final(
                        engine,
                        p.engine_input(),
                        SamplingParams(**sampling_kwargs(s, suppress, self._eos)),
                    )
                    for p, s in zip(prompts, sampling, strict=True)
                ]
            )
        return [generation_from_output(o, version, self.encoder.decode) for o in outs]

    async def score(
        self, prompts: Sequence[VLLMPrompt], responses: Sequence[Sequence[int]]
    ) -> list[Scored]:
        import asyncio

        from vllm import SamplingParams

        assert self.slots is not None, "start() first"
        self.check_response_ids(responses)
        params = SamplingParams(**score_kwargs())
        async with self.slots.use() as (engine, version):
            outs = await asyncio.gather(
                *[
                    _final(engine, p.engine_input(r), params)
                    for p, r in zip(prompts, responses, strict=True)
                ]
            )
        return [
            Scored(
                logprobs=response_logprobs(o.prompt_logprobs, r),
                weight_version=version,
                num_prompt_tokens=len(o.prompt_token_ids) - len(r),
            )
            for o, r in zip(outs, responses, strict=True)
        ]

    async def load_weights(self, version: int, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        assert self.slots is not None, "start() first"
        named = dict(tensors)
        check_state_dict(
            self._manifest, {n: (tuple(t.shape), str(t.dtype)) for n, t in named.items()}
        )
        bucket_bytes = self.cfg.weight_bucket_mb << 20

        async def load(engine: Any) -> None:
            for bucket in weight_buckets(named.items(), bucket_bytes):
                await engine.collective_rpc("csd_load_weights", args=(bucket,))
            await engine.collective_rpc("csd_finish_weights")
            await engine.reset_prefix_cache()
            if hasattr(engine, "reset_encoder_cache"):  # cached vision-encoder outputs
                await engine.reset_encoder_cache()

        await self.slots.swap_in(version, load, run_in_thread=False)

    async def close(self) -> None:
        if self.slots is not None:
            async with self.slots.use() as (engine, _):
                engine.shutdown()


async def _final(engine: Any, prompt: dict[str, Any], params: Any) -> Any:
    final = None
    async for out in engine.generate(prompt, params, request_id=uuid.uuid4().hex):
        final = out
    if final is None:
        raise RuntimeError("engine returned no output")
    return final


def _eos_ids(model_path: str, encoder: PromptEncoder) -> list[int]:
    ids: list[int] = []
    gen = Path(model_path) / "generation_config.json"
    if gen.exists():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        ids = [eos] if isinstance(eos, int) else list(eos or [])
    im_end = encoder.tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end >= 0 and im_end not in ids:
        ids.append(im_end)
    return ids
