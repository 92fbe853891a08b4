"""OpenAI-compatible HTTP endpoint of a model deployment (``/v1/chat/completions``, ``/v1/models``).

Ordinary clients talk to the served model: images come as ``image_url`` parts holding data URLs
(``data:image/png;base64,...``; remote URLs are refused, nothing is fetched), ``logprobs=true``
returns the sampled tokens' log-probs, ``stream=true`` sends the finished answer as SSE chunks.
Extras beside the OpenAI fields: ``weight_version`` (also as ``system_fingerprint`` ``v<N>``).
Bad requests get OpenAI-style JSON errors: 400 (invalid field, bad image, too many tokens,
unsupported option), 404 (unknown model or route), 405 (wrong method) or 413 (a body longer
than the deployment's ``max_body_bytes``, refused before it is parsed).

Built per replica by :func:`build_openai_app`, so the routes call the replica's own methods.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import Any, Literal, Protocol

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from PIL import Image
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from serve_apps.api import GenerateRequest, GenerateResult
from serve_apps.errors import RequestError, format_validation


class ModelServer(Protocol):
    """What the endpoint needs of a replica (``serve_apps.server.ModelServer`` is one); a
    protocol, so this module does not import the server that builds it."""

    model_name: str
    cfg: Any  # .max_body_bytes: the request body limit
    backend: Any  # .version: the loaded weights' version
    encoder: Any  # .tokenizer: decodes sampled token ids

    async def generate_request(self, req: GenerateRequest) -> GenerateResult: ...
    async def weight_status(self) -> dict[str, Any]: ...
    async def check_health(self) -> None: ...


# Qwen-VL image processors refuse images more elongated than this (a ValueError deep in
# preprocessing, which answered 500); such an image is refused here as a bad request instead.
MAX_ASPECT_RATIO = 200
_DATA_URL = re.compile(r"^data:(image/[\w.+-]+)?(;[\w-]+=[\w.-]+)*;base64,(?P<data>.*)$", re.S)


class ImageURL(BaseModel):
    url: str
    detail: str | None = None


class OAITextPart(BaseModel):
    type: Literal["text"]
    text: str


class OAIImagePart(BaseModel):
    type: Literal["image_url"]
    image_url: ImageURL | str


OAIPart = OAITextPart | OAIImagePart


class OAIMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[OAIPart] | None = None


class ChatCompletionRequest(BaseModel):
    """The subset of OpenAI's chat completion request we serve; unknown fields are ignored."""

    model_config = ConfigDict(extra="ignore")
    model: str
    messages: list[OAIMessage] = Field(..., min_length=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    # Bounded: torch.manual_seed and vLLM take 64-bit seeds; a larger one crashed the batch.
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    n: int = Field(1, ge=1)
    stream: bool = False
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    stop: str | list[str] | None = None
    tools: list[Any] | None = None


def build_openai_app(server: ModelServer) -> FastAPI:
    app = FastAPI(title=f"{server.model_name} (OpenAI-compatible)", docs_url=None, redoc_url=None)
    app.add_middleware(BodyLimit, max_bytes=server.cfg.max_body_bytes)
    app.add_exception_handler(RequestError, _request_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [_model_card(server)]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        _check_model(server, model_id)
        return _model_card(server)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: ChatCompletionRequest) -> dict[str, Any] | StreamingResponse:
        _check_model(server, body.model)
        result = await server.generate_request(to_generate_request(body))
        completion = completion_body(server, body, result)
        if body.stream:
            return StreamingResponse(_sse(completion), media_type="text/event-stream")
        return completion

    @app.get("/v1/weights")
    async def weights() -> dict[str, Any]:
        return await server.weight_status()

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        await server.check_health()
        return {"status": "ok", "weight_version": server.backend.version}

    return app


Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class BodyLimit:
    """ASGI middleware: bodies over ``max_bytes`` get 413 before the app reads or parses them.

    A declared Content-Length is checked before a byte is read. A body of unknown length
    (chunked) is counted as it arrives and handed on whole once it is known to fit, so the
    app never parses a cut-off body."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None:
            if declared > self.max_bytes:
                await self._refuse(send)
            else:  # the server enforces the declared length itself
                await self.app(scope, receive, send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                await self._refuse(send)
                return
            if not message.get("more_body"):
                break
        await self.app(scope, _replay(b"".join(chunks), receive), send)

    async def _refuse(self, send: Send) -> None:
        message = f"request body exceeds the limit of {self.max_bytes} bytes (max_body_bytes)"
        body = json.dumps(_error_body(message, "request_too_large", None)).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive() that gives the buffered body once, then what the connection says next."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return again


def to_generate_request(body: ChatCompletionRequest) -> GenerateRequest:
    """OpenAI request -> our request (messages with image parts + decoded image bytes)."""
    _check_supported(body)
    messages: list[dict[str, Any]] = []
    images: list[bytes] = []
    for i, msg in enumerate(body.messages):
        role = "system" if msg.role == "developer" else msg.role
        messages.append({"role": role, "content": _content(i, msg, images)})
    try:
        return GenerateRequest(
            messages=messages,
            images=images,
            temperature=body.temperature,
            top_p=body.top_p,
            max_new_tokens=body.max_completion_tokens or body.max_tokens,
            seed=body.seed,
        )
    except ValidationError as exc:
        raise RequestError(format_validation(exc)) from None


def decode_data_url(url: str, where: str) -> bytes:
    match = _DATA_URL.match(url.strip())
    if not match:
        shown = url[:40] + ("…" if len(url) > 40 else "")
        raise RequestError(
            f"{where}: only data URLs (data:image/png;base64,...) are accepted, got {shown!r}",
            param=where,
        )
    try:
        return base64.b64decode(match.group("data"), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise RequestError(f"{where}: bad base64 in data URL ({exc})", param=where) from None


def _check_shape(raw: bytes, where: str) -> bytes:
    """Refuse an image whose header states an aspect ratio the model cannot take. Only the
    header is read; undecodable images are left to the encoder, which names their fault."""
    try:
        w, h = Image.open(io.BytesIO(raw)).size
    except Exception:
        return raw
    if min(w, h) > 0 and max(w, h) / min(w, h) > MAX_ASPECT_RATIO:
        raise RequestError(
            f"{where}: a {w}x{h} image is more elongated than {MAX_ASPECT_RATIO}:1",
            param=where,
        )
    return raw


def completion_body(
    server: ModelServer, body: ChatCompletionRequest, result: GenerateResult
) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": result.text},
        "finish_reason": result.finish_reason,
        "logprobs": _logprobs(server, result) if body.logprobs else None,
    }
    prompt, completion = len(result.prompt_ids), len(result.response_ids)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": server.model_name,
        "system_fingerprint": f"v{result.weight_version}",
        "choices": [choice],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
        "weight_version": result.weight_version,
    }


def _check_supported(body: ChatCompletionRequest) -> None:
    unsupported = {
        "n": body.n != 1 and "only n=1 is served",
        "top_logprobs": bool(body.top_logprobs)
        and "top_logprobs > 0 is not served (logprobs=true gives the sampled tokens')",
        "stop": bool(body.stop) and "stop sequences are not supported",
        "tools": bool(body.tools)
        and "tools are not supported (the policy writes <tool_call> text itself)",
    }
    for param, why in unsupported.items():
        if why:
            raise RequestError(f"{param}: {why}", param=param, code="unsupported_parameter")


def _content(index: int, msg: OAIMessage, images: list[bytes]) -> str | list[dict[str, Any]]:
    if msg.content is None:
        return ""
    if isinstance(msg.content, str):
        return msg.content
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(msg.content):
        if isinstance(part, OAITextPart):
            parts.append({"type": "text", "text": part.text})
        else:
            url = part.image_url if isinstance(part.image_url, str) else part.image_url.url
            where = f"messages[{index}].content[{j}].image_url"
            images.append(_check_shape(decode_data_url(url, where), where))
            parts.append({"type": "image"})
    return parts


def _logprobs(server: ModelServer, result: GenerateResult) -> dict[str, Any]:
    tok = server.encoder.tokenizer
    content = []
    for token_id, lp in zip(result.response_ids, result.logprobs, strict=True):
        text = tok.decode([token_id])
        content.append(
            {"token": text, "logprob": lp, "bytes": list(text.encode()), "top_logprobs": []}
        )
    return {"content": content}


def _model_card(server: ModelServer) -> dict[str, Any]:
    return {"id": server.model_name, "object": "model", "created": 0, "owned_by": "computersd"}


def _check_model(server: ModelServer, model_id: str) -> None:
    if model_id != server.model_name:
        raise RequestError(
            f"model {model_id!r} does not exist here; served: {server.model_name!r}",
            status=404,
            code="model_not_found",
            param="model",
        )


def _sse(completion: dict[str, Any]) -> Iterator[str]:
    base = {k: completion[k] for k in ("id", "created", "model", "system_fingerprint")}
    choice = completion["choices"][0]
    chunks = [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None},
        {
            "index": 0,
            "delta": {"content": choice["message"]["content"]},
            "logprobs": choice["logprobs"],
            "finish_reason": None,
        },
        {"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]},
    ]
    for c in chunks:
        yield (
            "data: "
            + json.dumps({**base, "object": "chat.completion.chunk", "choices": [c]})
            + "\n\n"
        )
    yield "data: [DONE]\n\n"


def _error_body(message: str, code: str, param: str | None) -> dict[str, Any]:
    return {
        "error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    }


async def _request_error(_: Request, exc: RequestError) -> JSONResponse:
    return JSONResponse(_error_body(exc.message, exc.code, exc.param), status_code=exc.status)


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Routing and framework errors (unknown route, wrong method, unparsable body) in the same
    OpenAI shape as every other error."""
    where = f"{request.method} {request.url.path}"
    if exc.status_code == 404:
        message, code = f"no route {where}", "not_found"
    elif exc.status_code == 405:
        message, code = f"method not allowed: {where}", "method_not_allowed"
    else:
        message, code = f"{where}: {exc.detail}", "invalid_request"
    return JSONResponse(
        _error_body(message, code, None), status_code=exc.status_code, headers=exc.headers
    )


async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    parts = []
    for err in exc.errors()[:10]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{loc or 'body'}: {err.get('msg')}")
    return JSONResponse(_error_body("; ".join(parts), "invalid_request", None), status_code=400)
