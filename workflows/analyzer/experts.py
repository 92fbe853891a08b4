"""Experts that label transitions with the analyzer JSON of METHOD.md §2, behind one interface.

``await expert.judge(transition) -> str`` returns the expert's raw answer for one transition
row (``workflows.analyzer.transitions``); :func:`validate_answer` parses it with the analyzer
deployment's own parser (``serve_apps.judgment``) and accepts it only if both verdicts are
present and the texts are usable. Two experts:

- :class:`OracleExpert`: the embedded environment's ground truth (``workflows.analyzer.oracle``).
- :class:`OpenAIExpert`: any OpenAI-compatible chat endpoint (``POST {base_url}/chat/
  completions``) with the analyzer prompt and both screenshots as ``image_url`` data URLs; at
  most ``concurrency`` requests in flight; 408/409/429/5xx answers and transport errors are
  retried with exponential backoff (jittered; ``Retry-After`` honoured); other 4xx raise
  :class:`ExpertError` at once.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import random
from collections.abc import Mapping
from typing import Any, Protocol

from serve_apps.judgment import Judgment, combine_votes
from serve_apps.prompting.analyzer import analyzer_messages
from workflows.common.pipeline_config import ExpertConfig, OpenAIExpertConfig

log = logging.getLogger(__name__)
RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


class ExpertError(RuntimeError):
    """The expert could not answer. ``permanent``: asking again cannot help (recorded as a
    reject); otherwise (retries exhausted, refused request) the transition stays unannotated
    and a rerun asks again."""

    def __init__(self, message: str, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


class Expert(Protocol):
    name: str
    concurrency: int
    invalid_retries: int

    async def judge(self, transition: Mapping[str, Any]) -> str:
        """The raw answer text for one transition; raises :class:`ExpertError`."""
        ...

    async def close(self) -> None: ...


def judgment_json(consistency: int, effectiveness: int, guide: str, avoid: str) -> str:
    """The canonical answer text (what the analyzer is trained to write)."""
    body = {
        "consistency": consistency,
        "effectiveness": effectiveness,
        "guide": guide,
        "avoid": avoid,
    }
    return json.dumps(body, ensure_ascii=False)


def validate_answer(raw: str, max_text_chars: int) -> tuple[Judgment | None, str | None]:
    """(judgment, None) if the answer is a complete judgment, else (None, the reason)."""
    judgment = combine_votes([raw])
    if judgment.consistency is None or judgment.effectiveness is None:
        return None, f"unparseable: {judgment.reason or 'missing verdict'}"[:300]
    for name in ("guide", "avoid"):
        text = getattr(judgment, name)
        if not text.strip():
            return None, f"{name} is empty"
        if len(text) > max_text_chars:
            return None, f"{name} longer than {max_text_chars} characters"
    return judgment, None


def analyzer_request_messages(t: Mapping[str, Any], full: bool) -> list[dict[str, Any]]:
    """The analyzer prompt for one transition with images as OpenAI ``image_url`` parts."""
    messages, images = analyzer_messages(
        t["instruction"],
        list(t["history"]),
        t["screenshot_before"],
        t["response_text"],
        t["executed_action"],
        t["screenshot_after"],
        full=full,
        context=t["context"],
    )
    pending = iter(images)
    out = []
    for m in messages:
        content = m["content"]
        if isinstance(content, list):
            content = [_openai_part(p, pending) for p in content]
        out.append({"role": m["role"], "content": content})
    return out


def _openai_part(part: dict[str, Any], images: Any) -> dict[str, Any]:
    if part["type"] != "image":
        return part
    data = base64.b64encode(next(images)).decode("ascii")
    return {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}


class OracleExpert:
    """Ground-truth judgments (deterministic: never worth asking twice)."""

    name = "oracle"
    concurrency = 64
    invalid_retries = 0

    async def judge(self, transition: Mapping[str, Any]) -> str:
        from workflows.analyzer.oracle import OracleError, judge_transition

        try:
            j = judge_transition(transition)
        except OracleError as exc:
            raise ExpertError(str(exc), permanent=True) from None
        return judgment_json(j.consistency, j.effectiveness, j.guide, j.avoid)

    async def close(self) -> None:
        return None


class OpenAIExpert:
    """A chat-completions client with a concurrency limit and retries (see module doc)."""

    def __init__(self, cfg: OpenAIExpertConfig) -> None:
        self.cfg = cfg
        self.name = f"openai:{cfg.model}"
        self.concurrency = cfg.concurrency
        self.invalid_retries = cfg.invalid_retries
        self.url = f"{str(cfg.base_url).rstrip('/')}/chat/completions"
        key = os.environ.get(cfg.api_key_env) if cfg.api_key_env else None
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http: Any = None
        self.stats = {"requests": 0, "retries": 0}

    async def judge(self, transition: Mapping[str, Any]) -> str:
        body = {
            "model": self.cfg.model,
            "messages": analyzer_request_messages(transition, self.cfg.full_system_prompt),
            "temperature": self.cfg.temperature,
            "max_tokens": self.cfg.max_tokens,
        }
        answer = await self._post(body, str(transition.get("transition_id")))
        return _message_text(answer)

    async def _post(self, body: dict[str, Any], what: str) -> dict[str, Any]:
        import aiohttp

        if self._http is None:
            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.cfg.timeout_s)
            )
        for attempt in range(self.cfg.max_retries + 1):
            self.stats["requests"] += 1
            try:
                async with self._http.post(self.url, json=body, headers=self.headers) as resp:
                    text = await resp.text()
                    if resp.status == 200:
                        return _json_object(text, what)
                    problem = f"HTTP {resp.status}: {text[:300]}"
                    if resp.status not in RETRY_STATUS:
                        raise ExpertError(f"{what}: {problem}")
                    wait = self._backoff(attempt, resp.headers.get("Retry-After"))
            except (aiohttp.ClientError, TimeoutError) as exc:
                problem = f"{type(exc).__name__}: {exc}"
                wait = self._backoff(attempt, None)
            if attempt >= self.cfg.max_retries:
                break
            self.stats["retries"] += 1
            log.info("%s: %s; retry %d in %.2f s", what, problem, attempt + 1, wait)
            await asyncio.sleep(wait)
        raise ExpertError(f"{what}: gave up after {self.cfg.max_retries + 1} tries ({problem})")

    def _backoff(self, attempt: int, retry_after: str | None) -> float:
        delay = min(self.cfg.backoff_cap_s, self.cfg.backoff_base_s * 2**attempt)
        delay *= random.uniform(0.5, 1.0)  # jitter: concurrent retries do not stampede
        if retry_after:
            with contextlib.suppress(ValueError):  # an HTTP date: keep our own delay
                delay = max(delay, min(float(retry_after), self.cfg.backoff_cap_s))
        return delay

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None


def _json_object(text: str, what: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError:
        raise ExpertError(f"{what}: answer is not JSON: {text[:200]!r}") from None
    if not isinstance(data, dict):
        raise ExpertError(f"{what}: answer is not a JSON object")
    return data


def _message_text(answer: dict[str, Any]) -> str:
    """``choices[0].message.content`` as text (string, or a list of text parts)."""
    try:
        content = answer["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise ExpertError(f"answer has no choices[0].message: {str(answer)[:200]}") from None
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def make_expert(cfg: ExpertConfig) -> Expert:
    if isinstance(cfg, OpenAIExpertConfig):
        return OpenAIExpert(cfg)
    return OracleExpert()
