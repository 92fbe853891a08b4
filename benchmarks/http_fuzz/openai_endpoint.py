"""Fuzzing the policy's OpenAI endpoint on Ray Serve: its probes (bad bodies and types,
out-of-range sampling settings, images that are not, or claim to be huge), the health check
afterwards (a real chat completion) and the tiny policy app started when no ``--openai-url``
is given."""

from __future__ import annotations

import argparse
import base64
import contextlib
import random
import struct
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp

from benchmarks.http_fuzz.common import (
    BAD_JSON,
    NOT_OBJECTS,
    Probe,
    check_loopback,
    choose,
    json_body,
    oversized,
    pick,
    png_bytes,
    send,
)


@dataclass
class OpenAITarget:
    """The OpenAI-compatible endpoint under fuzz (``model``: the served model id)."""

    model: str
    max_body_bytes: int


def _png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` (a decompression bomb's header)."""
    raw = bytearray(png_bytes((1, 1)))
    ihdr = struct.pack(">II", width, height) + bytes(raw[24:29])
    raw[16:29] = ihdr
    raw[29:33] = struct.pack(">I", zlib.crc32(b"IHDR" + ihdr) & 0xFFFFFFFF)
    return bytes(raw)


def _data_url(raw: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(raw).decode()}"


def _chat(model: str, **over: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **over}


def _image_message(url: Any) -> dict[str, Any]:
    return {
        "role": "user",
        "content": [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": url}],
    }


def _oai_bad_json(rng: random.Random, t: OpenAITarget) -> Probe:
    body = pick(rng, BAD_JSON + NOT_OBJECTS)
    return Probe(f"chat with body {body[:20]!r}", "POST", "/v1/chat/completions", body)


def _oai_types(rng: random.Random, t: OpenAITarget) -> Probe:
    m = t.model
    body = pick(
        rng,
        [
            {"messages": [{"role": "user", "content": "hi"}]},
            {"model": m},
            {"model": 5, "messages": [{"role": "user", "content": "hi"}]},
            {"model": m, "messages": "hi"},
            {"model": m, "messages": []},
            {"model": m, "messages": [None]},
            {"model": m, "messages": [{"role": "robot", "content": "hi"}]},
            {"model": m, "messages": [{"content": "hi"}]},
            {"model": m, "messages": [{"role": "user", "content": 5}]},
            {"model": m, "messages": [{"role": "user", "content": [{"type": "video"}]}]},
            {"model": m, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
            _chat(m, temperature="hot"),
            _chat(m, temperature=-1),
            _chat(m, temperature=5),
            _chat(m, temperature=float("nan")),
            _chat(m, top_p=0),
            _chat(m, top_p=2),
            _chat(m, max_tokens=0),
            _chat(m, max_tokens=-5),
            _chat(m, max_tokens="many"),
            _chat(m, max_tokens=10**12),
            _chat(m, max_completion_tokens=10**30),
            _chat(m, seed=-1),
            _chat(m, seed=2**70),
            _chat(m, seed=1.5),
            _chat(m, n=3),
            _chat(m, n=0),
            _chat(m, stream="maybe"),
            _chat(m, logprobs="x"),
            _chat(m, top_logprobs=50),
            _chat(m, top_logprobs=3),
            _chat(m, stop=["\n"]),
            _chat(m, stop=5),
            _chat(m, tools=[{"type": "function"}]),
        ],
    )
    return Probe(f"chat {str(body)[:80]}", "POST", "/v1/chat/completions", json_body(body))


def _oai_images(rng: random.Random, t: OpenAITarget) -> Probe:
    url = pick(
        rng,
        [
            {"url": "http://127.0.0.1:1/a.png"},
            {"url": "file:///etc/passwd"},
            "https://example.com/x.png",
            {"url": "data:image/png;base64,@@@@"},
            {"url": "data:image/png;base64," + "A" * 7},
            {"url": _data_url(b"definitely not an image")},
            {"url": _data_url(png_bytes()[:40])},  # a truncated PNG
            {"url": _data_url(_png_claiming(100_000, 100_000))},
            {"url": _data_url(_png_claiming(1, 10_000_000))},
            {"url": _data_url(_png_claiming(0, 0))},
            {"url": _data_url(png_bytes(), "text/html")},
            {"url": 5},
            {},
            None,
        ],
    )
    body = {"model": t.model, "messages": [_image_message(url)], "max_tokens": 2}
    shown = str(url)[:60]
    return Probe(f"chat image {shown}", "POST", "/v1/chat/completions", json_body(body))


def _oai_unknown(rng: random.Random, t: OpenAITarget) -> Probe:
    method, path, body = pick(
        rng,
        [
            ("POST", "/v1/chat/completions", _chat(f"no-such-model-{rng.randrange(99)}")),
            ("GET", f"/v1/models/no-such-model-{rng.randrange(99)}", None),
            ("GET", "/v1/chat/completions", None),
            ("PUT", "/v1/models", {}),
            ("POST", "/v1/completions", {"model": t.model, "prompt": "hi"}),
            ("POST", "/v1/embeddings", {"model": t.model, "input": "hi"}),
            ("GET", "/v1/nothing-here", None),
            ("DELETE", "/v1/weights", None),
        ],
    )
    data = None if body is None else json_body(body)
    return Probe(f"{method} {path}", method, path, data)


def _oai_huge(rng: random.Random, t: OpenAITarget) -> Probe:
    return oversized(rng, t.max_body_bytes, "POST", "/v1/chat/completions", "chat")


def openai_probe(rng: random.Random, target: OpenAITarget) -> Probe:
    makers = [(_oai_bad_json, 2.0), (_oai_types, 4.0), (_oai_images, 2.0), (_oai_unknown, 1.5),
              (_oai_huge, 0.7)]  # fmt: skip
    return choose(rng, makers, target)


def openai_error_named(data: Any) -> bool:
    err = data.get("error") if isinstance(data, dict) else None
    return isinstance(err, dict) and isinstance(err.get("message"), str) and len(err["message"]) > 3


async def openai_healthy(http: aiohttp.ClientSession, url: str, target: OpenAITarget) -> list[str]:
    problems = []
    status, _ = await send(http, url, Probe("healthz", "GET", "/healthz"))
    if status != 200:
        problems.append(f"OpenAI /healthz answered {status}")
    body = json_body(_chat(target.model, max_tokens=2, temperature=0))
    status, data = await send(http, url, Probe("chat", "POST", "/v1/chat/completions", body))
    if status != 200 or not isinstance(data, dict) or "choices" not in data:
        problems.append(f"a valid chat completion failed: {status} {str(data)[:200]}")
    return problems


@contextlib.contextmanager
def started_policy(args: argparse.Namespace) -> Iterator[tuple[str, str, int]]:
    """(base URL, model id, max_body_bytes) of the given endpoint or of a tiny policy app."""
    if args.openai_url:
        yield check_loopback(args.openai_url), args.model, args.openai_max_body_bytes
        return
    import socket

    from ray import serve
    from ray.serve.context import _get_global_client

    from serve_apps.config import PolicyAppConfig, SamplingConfig, WeightSyncConfig
    from serve_apps.policy import deploy_policy
    from workflows.common.ray_cluster import RayClusterConfig, init_ray, shutdown_ray
    from workflows.common.tiny_models import tiny_checkpoint

    path = tiny_checkpoint("policy")
    init_ray(RayClusterConfig(num_cpus=2, object_store_memory_mb=256))
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        port = _get_global_client().http_config.port
        cfg = PolicyAppConfig(
            model_path=str(path), name="fuzz-policy", route_prefix="/fuzz-policy",
            num_cpus=0.5, sampling=SamplingConfig(max_new_tokens=4), max_prompt_tokens=1024,
            weights=WeightSyncConfig(enabled=False, registry_name=f"fuzz-{uuid.uuid4().hex[:6]}"),
            max_body_bytes=1 << 20,
        )  # fmt: skip
        deploy_policy(cfg)
        print(f"policy app http://127.0.0.1:{port}{cfg.route_prefix}", flush=True)
        yield f"http://127.0.0.1:{port}{cfg.route_prefix}", cfg.name, cfg.max_body_bytes
    finally:
        shutdown_ray()
