"""OpenAI request/response conversion (the HTTP path itself is tested through Serve with the
official client in tests/integration/test_serve_policy.py)."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from types import SimpleNamespace

import pytest
from PIL import Image

from serve_apps.api import GenerateResult
from serve_apps.errors import RequestError
from serve_apps.openai_api import (
    ChatCompletionRequest,
    completion_body,
    decode_data_url,
    to_generate_request,
)
from serve_apps.prompting.inputs import PromptEncoder


def data_url(fmt: str = "PNG") -> tuple[str, bytes]:
    buf = io.BytesIO()
    Image.new("RGB", (32, 32), (1, 2, 3)).save(buf, fmt)
    raw = buf.getvalue()
    return f"data:image/{fmt.lower()};base64,{base64.b64encode(raw).decode()}", raw


def request(**fields: object) -> ChatCompletionRequest:
    url, _ = data_url()
    body = {
        "model": "policy",
        "messages": [
            {"role": "developer", "content": "be brief"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is on screen?"},
                    {"type": "image_url", "image_url": {"url": url, "detail": "low"}},
                ],
            },
        ],
    }
    return ChatCompletionRequest.model_validate({**body, **fields})


def test_messages_and_images_are_converted() -> None:
    req = to_generate_request(request(temperature=0.5, max_tokens=7, seed=3, user="ignored"))
    assert [m.role for m in req.messages] == ["system", "user"]
    assert req.messages[1].model_dump()["content"] == [
        {"type": "text", "text": "What is on screen?"},
        {"type": "image"},
    ]
    assert req.images == [data_url()[1]]
    assert (req.temperature, req.max_new_tokens, req.seed, req.top_p) == (0.5, 7, 3, None)
    assert to_generate_request(request(max_tokens=7, max_completion_tokens=9)).max_new_tokens == 9


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"n": 2}, "only n=1"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"stop": ["\n"]}, "stop sequences"),
        ({"tools": [{"type": "function"}]}, "tools are not supported"),
    ],
)
def test_unsupported_options_are_400(fields: dict, message: str) -> None:
    with pytest.raises(RequestError, match=message) as err:
        to_generate_request(request(**fields))
    assert err.value.status == 400 and err.value.code == "unsupported_parameter"


def test_data_urls() -> None:
    url, raw = data_url("JPEG")
    assert decode_data_url(url, "x") == raw
    with pytest.raises(RequestError, match="only data URLs"):
        decode_data_url("https://example.com/a.png", "messages[1].content[1].image_url")
    with pytest.raises(RequestError, match="bad base64"):
        decode_data_url("data:image/png;base64,@@@@", "x")


def test_completion_body(tiny_policy_path: Path) -> None:
    server = SimpleNamespace(
        model_name="policy", encoder=PromptEncoder.from_pretrained(tiny_policy_path)
    )
    result = GenerateResult(
        text="hi",
        prompt_ids=[1, 2, 3],
        response_ids=[40, 41],
        logprobs=[-0.5, -1.0],
        weight_version=6,
        finish_reason="length",
    )
    body = completion_body(server, request(logprobs=True), result)  # type: ignore[arg-type]
    assert body["object"] == "chat.completion" and body["model"] == "policy"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert body["weight_version"] == 6 and body["system_fingerprint"] == "v6"
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "hi"}
    assert choice["finish_reason"] == "length"
    assert [c["logprob"] for c in choice["logprobs"]["content"]] == [-0.5, -1.0]
    assert completion_body(server, request(), result)["choices"][0]["logprobs"] is None  # type: ignore[arg-type]
