"""vLLM backend. The code it shares with the transformers backend (prompt preparation, sampling
arguments, output conversion, weight manifest and bucketing) runs on CPU here; the engine
itself is tested only where vLLM and a GPU exist (skipped otherwise, with the reason)."""

from __future__ import annotations

import asyncio
import importlib.util
import io
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

from serve_apps.backends.base import ChatPrompt, Sampling
from serve_apps.backends.vllm_backend import (
    SUPPRESS_BIAS,
    checkpoint_manifest,
    generation_from_output,
    prepare_prompt,
    response_logprobs,
    sampling_kwargs,
    score_kwargs,
    weight_buckets,
)
from serve_apps.errors import RequestError
from serve_apps.prompting import agent_messages
from serve_apps.prompting.inputs import PromptEncoder

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(
    not HAS_VLLM or not torch.cuda.is_available(),
    reason="vLLM engine test: needs the `gpu` extra (vllm) and a CUDA device",
)


def image(color: tuple[int, int, int], size: tuple[int, int]) -> Image.Image:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return Image.open(io.BytesIO(buf.getvalue())).convert("RGB")


@pytest.fixture(scope="module")
def encoder(tiny_policy_path: Path) -> PromptEncoder:
    return PromptEncoder.from_pretrained(tiny_policy_path)


def test_prompt_preparation_matches_the_transformers_expansion(encoder: PromptEncoder) -> None:
    shots = [image((200, 0, 0), (160, 224)), image((0, 0, 200), (256, 192))]
    messages, images = agent_messages("Click OK", shots, ["typed a"])
    prepared = prepare_prompt(encoder, ChatPrompt(messages, images))
    expanded = encoder.encode(messages, images)  # what the transformers backend feeds
    assert prepared.num_tokens == expanded.num_tokens
    pad = encoder.image_token_id
    per_image = (expanded.image_grid_thw.prod(-1) // encoder.merge_size**2).tolist()
    rebuilt: list[int] = []
    counts = iter(per_image)
    for tok in prepared.text_ids:  # expand each placeholder as vLLM's processor does
        rebuilt.extend([pad] * next(counts) if tok == pad else [tok])
    assert rebuilt == expanded.prompt_ids
    engine_input = prepared.engine_input([11, 12])
    assert engine_input["prompt_token_ids"] == [*prepared.text_ids, 11, 12]
    assert engine_input["multi_modal_data"]["image"] == images
    with pytest.raises(RequestError, match="2 image placeholders for 1 images"):
        prepare_prompt(encoder, ChatPrompt(messages, images[:1]))


def test_sampling_arguments() -> None:
    kw = sampling_kwargs(Sampling(0.7, 0.9, 33, seed=5), suppress=[3, 4], eos=[9])
    assert kw["temperature"] == 0.7 and kw["top_p"] == 0.9 and kw["top_k"] == 0
    assert kw["max_tokens"] == 33 and kw["seed"] == 5 and kw["logprobs"] == 0
    assert kw["logit_bias"] == {3: SUPPRESS_BIAS, 4: SUPPRESS_BIAS} and kw["stop_token_ids"] == [9]
    assert "seed" not in sampling_kwargs(Sampling(), [], [])
    assert score_kwargs()["prompt_logprobs"] == 0 and score_kwargs()["max_tokens"] == 1


def _lp(value: float) -> SimpleNamespace:
    return SimpleNamespace(logprob=value, rank=1, decoded_token="x")


def test_output_conversion_keeps_eos_and_raw_logprobs(encoder: PromptEncoder) -> None:
    completion = SimpleNamespace(
        token_ids=[5, 6, 7],
        logprobs=[{5: _lp(-0.5)}, {6: _lp(-1.5), 99: _lp(-0.1)}, {7: _lp(-0.25)}],
        finish_reason="stop",
    )
    output = SimpleNamespace(prompt_token_ids=[1, 2, 2, 2, 3], outputs=[completion])
    gen = generation_from_output(output, 4, encoder.decode)
    assert gen.prompt_ids == [1, 2, 2, 2, 3] and gen.response_ids == [5, 6, 7]
    assert gen.logprobs == [-0.5, -1.5, -0.25]
    assert gen.finish_reason == "stop" and gen.weight_version == 4
    completion.finish_reason = "length"
    assert generation_from_output(output, 4, encoder.decode).finish_reason == "length"
    completion.finish_reason = "abort"
    with pytest.raises(RuntimeError, match="abort"):
        generation_from_output(output, 4, encoder.decode)


def test_prompt_logprobs_tail_is_the_response() -> None:
    prompt_logprobs = [None, {2: _lp(-3.0)}, {8: _lp(-0.7)}, {9: _lp(-0.2)}]
    assert response_logprobs(prompt_logprobs, [8, 9]) == [-0.7, -0.2]
    with pytest.raises(RuntimeError, match="no log-prob for token 5"):
        response_logprobs(prompt_logprobs, [5, 9])
    with pytest.raises(RuntimeError, match="prompt log-probs for a 5-token"):
        response_logprobs(prompt_logprobs, [1, 2, 3, 4, 5])


def test_weight_buckets_cover_every_tensor_in_order() -> None:
    tensors = [(f"t{i}", torch.zeros(100 * (i + 1))) for i in range(6)]  # 400..2400 bytes
    buckets = list(weight_buckets(tensors, bucket_bytes=2500))
    assert [n for b in buckets for n, _ in b] == [n for n, _ in tensors]
    assert all(sum(t.numel() * 4 for _, t in b) <= 2500 or len(b) == 1 for b in buckets)


def test_checkpoint_manifest_uses_the_trainers_names(tiny_policy_path: Path) -> None:
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(str(tiny_policy_path))
    manifest = checkpoint_manifest(tiny_policy_path)
    state = model.state_dict()
    assert set(manifest) == set(state)
    assert all(manifest[n].shape == tuple(t.shape) for n, t in state.items())
    assert {s.dtype for s in manifest.values()} == {"float32"}


@pytest.mark.gpu
@needs_vllm
def test_vllm_engine_generate_score_and_swap(
    tiny_policy_path: Path, encoder: PromptEncoder
) -> None:
    from serve_apps.backends.vllm_backend import VLLMBackend
    from serve_apps.config import VLLMBackendConfig

    cfg = VLLMBackendConfig(
        dtype="float32", gpu_memory_utilization=0.3, max_model_len=2048, enforce_eager=True
    )
    shots = [image((200, 0, 0), (160, 224)), image((0, 0, 200), (160, 224))]
    messages, images = agent_messages("Click OK", shots)

    async def scenario() -> None:
        backend = VLLMBackend(cfg, str(tiny_policy_path), encoder, 0)
        await backend.start()
        prepared = backend.prepare(ChatPrompt(messages, images))
        gen = (await backend.generate([prepared], [Sampling(1.0, 1.0, 16, seed=3)]))[0]
        assert len(gen.prompt_ids) == prepared.num_tokens and gen.weight_version == 0
        scored = (await backend.score([prepared], [gen.response_ids]))[0]
        assert max(abs(a - b) for a, b in zip(gen.logprobs, scored.logprobs, strict=True)) < 1e-3
        from transformers import AutoModelForImageTextToText

        state = AutoModelForImageTextToText.from_pretrained(str(tiny_policy_path)).state_dict()
        torch.manual_seed(0)
        await backend.load_weights(
            1, [(n, t + 0.05 * torch.randn_like(t)) for n, t in state.items()]
        )
        rescored = (await backend.score([prepared], [gen.response_ids]))[0]
        assert rescored.weight_version == 1
        assert (
            sum(abs(a - b) for a, b in zip(scored.logprobs, rescored.logprobs, strict=True)) > 1e-3
        )
        await backend.close()

    asyncio.run(scenario())
