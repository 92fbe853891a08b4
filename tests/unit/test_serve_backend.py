"""Transformers backend on CPU with the tiny checkpoint (no Ray): generate/score consistency,
batching, sampling controls, atomic versioned weight loads."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest
import torch
from PIL import Image

from serve_apps.backends.base import ChatPrompt, Sampling
from serve_apps.backends.transformers_backend import TransformersBackend, _trim_row
from serve_apps.backends.versioned import BrokenModelError, VersionedSlots
from serve_apps.config import TransformersBackendConfig
from serve_apps.errors import RequestError
from serve_apps.prompting import agent_messages, guidance_text, privileged_messages
from serve_apps.prompting.inputs import PromptEncoder
from serve_apps.weights.manifest import WeightMismatch

TOL = 1e-4


def png(color: tuple[int, int, int], size: tuple[int, int] = (160, 210)) -> Image.Image:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return Image.open(io.BytesIO(buf.getvalue())).convert("RGB")


@pytest.fixture(scope="module")
def backend(tiny_policy_path: Path) -> TransformersBackend:
    encoder = PromptEncoder.from_pretrained(tiny_policy_path)
    return TransformersBackend(TransformersBackendConfig(), str(tiny_policy_path), encoder, 0)


def prompt(backend: TransformersBackend, n_images: int = 2, task: str = "Click OK") -> object:
    shots = [png((40 * i, 200, 90)) for i in range(n_images)]
    messages, images = agent_messages(task, shots, ["typed x"] * (n_images - 1))
    return backend.prepare(ChatPrompt(messages, images))


def run(coro):
    return asyncio.run(coro)


def test_generate_then_score_reproduces_logprobs(backend: TransformersBackend) -> None:
    prompts = [prompt(backend, 1), prompt(backend, 2, "Type hello"), prompt(backend, 3)]
    sampling = [Sampling(1.0, 1.0, 24)] * 3
    gens = run(backend.generate(prompts, sampling))
    assert [g.prompt_ids for g in gens] == [p.prompt_ids for p in prompts]
    for g in gens:
        assert len(g.response_ids) == len(g.logprobs) > 0 and g.weight_version == 0
        assert g.finish_reason in ("stop", "length") and all(lp <= 0 for lp in g.logprobs)
    scored = run(backend.score(prompts, [g.response_ids for g in gens]))
    for g, s in zip(gens, scored, strict=True):
        assert max(abs(a - b) for a, b in zip(g.logprobs, s.logprobs, strict=True)) < TOL
        assert s.num_prompt_tokens == len(g.prompt_ids)


def test_batched_scoring_equals_one_by_one(backend: TransformersBackend) -> None:
    prompts = [prompt(backend, 1), prompt(backend, 3, "A much longer task description here")]
    responses = [[5, 17, 300, 42], [9, 9, 100]]
    together = run(backend.score(prompts, responses))
    for p, r, t in zip(prompts, responses, together, strict=True):
        alone = run(backend.score([p], [r]))[0]
        assert max(abs(a - b) for a, b in zip(alone.logprobs, t.logprobs, strict=True)) < TOL


def test_privileged_context_changes_logprobs(backend: TransformersBackend) -> None:
    shots = [png((200, 10, 10)), png((10, 10, 200))]
    messages, images = agent_messages("Click OK", shots, ["clicked a"])
    ordinary = backend.prepare(ChatPrompt(messages, images))
    guidance = guidance_text("Click the OK button at the bottom", "Do not click Cancel")
    privileged = backend.prepare(ChatPrompt(privileged_messages(messages, guidance), images))
    response = run(backend.generate([ordinary], [Sampling(1.0, 1.0, 16, seed=1)]))[0].response_ids
    a, b = run(backend.score([ordinary, privileged], [response, response]))
    assert len(a.logprobs) == len(b.logprobs) == len(response)
    assert sum(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) > 1e-3


def test_seed_greedy_and_grouping(backend: TransformersBackend) -> None:
    p = prompt(backend, 1)
    seeded = [
        Sampling(1.0, 1.0, 16, seed=7),
        Sampling(1.0, 1.0, 16, seed=7),
        Sampling(1.0, 1.0, 16, seed=8),
    ]
    a, b, c = run(backend.generate([p, p, p], seeded))
    assert a.response_ids == b.response_ids != c.response_ids
    g1, g2 = run(backend.generate([p, p], [Sampling(0.0, 1.0, 12)] * 2))
    assert g1.response_ids == g2.response_ids
    mixed = run(backend.generate([p, p], [Sampling(0.0, 1.0, 5), Sampling(1.0, 0.9, 7)]))
    assert [len(g.response_ids) <= n for g, n in zip(mixed, (5, 7), strict=True)] == [True, True]


def test_vision_placeholders_are_never_sampled_nor_scored(backend: TransformersBackend) -> None:
    p = prompt(backend, 1)
    gens = run(backend.generate([p] * 4, [Sampling(3.0, 1.0, 64)] * 4))  # flat distribution
    vision = set(backend.encoder.vision_token_ids)
    assert not vision.intersection(i for g in gens for i in g.response_ids)
    with pytest.raises(RequestError, match="vision placeholder"):
        run(backend.score([p], [[5, backend.encoder.image_token_id]]))
    with pytest.raises(RequestError, match="outside the vocabulary"):
        run(backend.score([p], [[backend.vocab_size]]))


def test_trim_row_keeps_eos_and_reports_finish() -> None:
    ids, lps = torch.tensor([4, 5, 9, 1, 1]), torch.tensor([-1.0, -2.0, -3.0, -4.0, -5.0])
    assert _trim_row(ids, lps, [9]) == ([4, 5, 9], [-1.0, -2.0, -3.0], "stop")
    assert _trim_row(ids, lps, [7])[2] == "length"


def test_load_weights_is_checked_then_atomic(tiny_policy_path: Path) -> None:
    encoder = PromptEncoder.from_pretrained(tiny_policy_path)
    backend = TransformersBackend(TransformersBackendConfig(), str(tiny_policy_path), encoder, 0)
    p = prompt(backend, 1)
    before = run(backend.score([p], [[5, 6, 7]]))[0]
    state = backend.slots._slots[0].model.state_dict()
    bad = dict(state)
    bad.pop(next(iter(bad)))
    with pytest.raises(WeightMismatch, match="1 missing"):
        run(backend.load_weights(1, bad.items()))
    wrong = {k: (v[:1] if v.dim() else v) for k, v in state.items()}
    with pytest.raises(WeightMismatch, match="wrong shape"):
        run(backend.load_weights(1, wrong.items()))
    assert backend.version == 0
    torch.manual_seed(0)
    new = {k: v + 0.05 * torch.randn_like(v) for k, v in state.items()}
    run(backend.load_weights(3, new.items()))
    after = run(backend.score([p], [[5, 6, 7]]))[0]
    assert (before.weight_version, after.weight_version) == (0, 3)
    assert sum(abs(a - b) for a, b in zip(before.logprobs, after.logprobs, strict=True)) > 1e-3


# ---- VersionedSlots: the atomicity contract, with a toy model -----------------------------------


def test_double_buffer_requests_never_see_a_half_load() -> None:
    async def scenario() -> None:
        slots: VersionedSlots[dict] = VersionedSlots({"w": 0}, 0, make_standby=dict)
        started = asyncio.Event()
        release = asyncio.Event()

        async def long_request() -> tuple[int, int]:
            async with slots.use() as (model, version):
                started.set()
                await release.wait()
                return model["w"], version

        def load(model: dict) -> None:
            model["w"] = 1

        first = asyncio.create_task(long_request())
        await started.wait()
        await slots.swap_in(1, load)  # standby loads while the old slot is in use
        async with slots.use() as (model, version):
            assert (model["w"], version) == (1, 1)
        release.set()
        assert await first == (0, 0)  # finished on the version it started on
        # The next load goes into the old slot, now free.
        await slots.swap_in(2, lambda m: m.update(w=2))
        async with slots.use() as (model, version):
            assert (model["w"], version) == (2, 2)

    run(scenario())


def test_double_buffer_load_waits_for_readers_of_the_standby() -> None:
    async def scenario() -> None:
        slots: VersionedSlots[dict] = VersionedSlots({"w": 0}, 0, make_standby=dict)
        await slots.swap_in(1, lambda m: m.update(w=1))  # slot B current, slot A standby
        release = asyncio.Event()
        order: list[str] = []

        async def reader_of_b() -> None:
            async with slots.use() as (model, version):
                assert version == 1
                await release.wait()
                order.append(f"read w={model['w']}")

        reader = asyncio.create_task(reader_of_b())
        await asyncio.sleep(0)
        await slots.swap_in(2, lambda m: m.update(w=2))  # into A: no wait needed
        loading_into_b = asyncio.create_task(slots.swap_in(3, lambda m: m.update(w=3)))
        await asyncio.sleep(0.05)
        assert not loading_into_b.done()  # B still has a reader
        release.set()
        await reader
        await loading_into_b
        assert order == ["read w=1"] and slots.version == 3

    run(scenario())


def test_single_slot_drains_and_holds_requests() -> None:
    async def scenario() -> None:
        slots: VersionedSlots[dict] = VersionedSlots({"w": 0}, 0)
        loading = asyncio.Event()
        finish = asyncio.Event()

        async def slow_load(model: dict) -> None:
            loading.set()
            await finish.wait()
            model["w"] = 1

        swap = asyncio.create_task(slots.swap_in(1, slow_load, run_in_thread=False))
        await loading.wait()

        async def request() -> tuple[int, int]:
            async with slots.use() as (model, version):
                return model["w"], version

        waiting = asyncio.create_task(request())
        await asyncio.sleep(0.05)
        assert not waiting.done()  # held back during the in-place load
        finish.set()
        await swap
        assert await waiting == (1, 1)

    run(scenario())


def test_failed_loads_keep_or_break_as_documented() -> None:
    def boom(model: dict) -> None:
        model["w"] = "half"
        raise OSError("lost shard")

    async def scenario() -> None:
        double: VersionedSlots[dict] = VersionedSlots({"w": 0}, 0, make_standby=dict)
        with pytest.raises(OSError):
            await double.swap_in(1, boom)
        async with double.use() as (model, version):
            assert (model["w"], version) == (0, 0)
        await double.swap_in(2, lambda m: m.update(w=2))  # recovers with the next version
        assert double.version == 2
        single: VersionedSlots[dict] = VersionedSlots({"w": 0}, 0)
        with pytest.raises(OSError):
            await single.swap_in(1, boom)
        assert single.broken is not None
        with pytest.raises(BrokenModelError):
            async with single.use():
                pass

    run(scenario())
