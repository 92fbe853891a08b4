"""Bad input on the OpenAI endpoint, over real HTTP in-process: the FastAPI app of
:func:`build_openai_app` under uvicorn on a loopback port, in front of a stand-in replica with
the real tiny-policy prompt encoder. No request here may reach the model: the stand-in's
``generate_request`` checks the images as the real replica does, then fails loudly (500).
The real Serve app is fuzzed by ``benchmarks/fuzz_http.py``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
import uvicorn
from pydantic import ValidationError

from benchmarks.http_fuzz.common import Tally, run_probes
from benchmarks.http_fuzz.driver import draw
from benchmarks.http_fuzz.openai_endpoint import OpenAITarget, _png_claiming
from serve_apps.api import GenerateRequest
from serve_apps.openai_api import ChatCompletionRequest, build_openai_app
from serve_apps.prompting.inputs import PromptEncoder

pytestmark = pytest.mark.timeout(120)
LIMIT = 4096


class StandIn:
    """What build_openai_app needs of a replica; the model itself must never be asked."""

    model_name = "policy"

    def __init__(self, encoder: PromptEncoder) -> None:
        self.cfg = SimpleNamespace(max_body_bytes=LIMIT)
        self.backend = SimpleNamespace(version=0)
        self.encoder = encoder

    async def generate_request(self, req: GenerateRequest) -> Any:
        self.encoder.load_images(req.images)  # bad images: RequestError, as in the replica
        raise AssertionError("a bad request reached the model")

    async def weight_status(self) -> dict[str, Any]:
        return {"version": 0}

    async def check_health(self) -> None:
        return None


@asynccontextmanager
async def served(tiny_policy_path: Path) -> AsyncIterator[str]:
    app = build_openai_app(StandIn(PromptEncoder.from_pretrained(tiny_policy_path)))
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve())
    while not server.started:
        await asyncio.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


async def _post(url: str, data: Any) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession() as http, http.post(url, data=data, headers=headers) as r:
        return r.status, await r.json()


def test_seeds_beyond_64_bits_are_refused():
    """torch.manual_seed overflows on them: the whole co-batched generate call failed (500)."""
    body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(ValidationError, match="seed"):
        ChatCompletionRequest.model_validate({**body, "seed": 2**70})
    assert ChatCompletionRequest.model_validate({**body, "seed": 2**63 - 1}).seed == 2**63 - 1


@pytest.mark.parametrize("chunked", [False, True])
def test_bodies_over_the_limit_are_413_before_parsing(tiny_policy_path, chunked):
    async def go() -> None:
        async with served(tiny_policy_path) as url:
            body = b"{" * (LIMIT + 1)  # not even JSON: parsing it would answer 400

            async def stream() -> AsyncIterator[bytes]:
                yield body

            status, answer = await _post(
                f"{url}/v1/chat/completions", stream() if chunked else body
            )
            assert status == 413
            assert f"limit of {LIMIT} bytes" in answer["error"]["message"]

    asyncio.run(go())


def test_elongated_images_are_400_not_a_processor_crash(tiny_policy_path):
    url = "data:image/png;base64," + base64.b64encode(_png_claiming(1, 10_000_000)).decode()
    part = {"type": "image_url", "image_url": {"url": url}}
    body = {"model": "policy", "messages": [{"role": "user", "content": [part]}]}

    async def go() -> None:
        async with served(tiny_policy_path) as base:
            status, answer = await _post(f"{base}/v1/chat/completions", json.dumps(body))
            assert status == 400 and "more elongated than 200:1" in answer["error"]["message"]

    asyncio.run(go())


def test_unknown_routes_and_methods_are_named_in_openai_errors(tiny_policy_path):
    async def go() -> None:
        async with served(tiny_policy_path) as base, aiohttp.ClientSession() as http:
            async with http.get(f"{base}/v1/nothing") as r:
                assert r.status == 404
                assert (await r.json())["error"]["message"] == "no route GET /v1/nothing"
            async with http.get(f"{base}/v1/chat/completions") as r:
                assert (
                    r.status == 405 and "method not allowed" in (await r.json())["error"]["message"]
                )

    asyncio.run(go())


def test_fuzz_probes_all_get_named_4xx(tiny_policy_path):
    async def go() -> None:
        async with served(tiny_policy_path) as base, aiohttp.ClientSession() as http:
            tally = Tally()
            probes = draw(random.Random(5), 120, None, (base, OpenAITarget("policy", LIMIT)))
            await run_probes(http, probes, tally)
            assert tally.counts["4xx"] == 120, tally.failures

    asyncio.run(go())
