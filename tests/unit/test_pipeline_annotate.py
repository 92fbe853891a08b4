"""Annotation: transitions I/O, the append-only record, the oracle expert, and the
OpenAI-compatible expert against a real HTTP server speaking the chat-completions protocol
(aiohttp on localhost): request shape, injected 503/429 answers, refused requests, invalid
answers, the concurrency limit, and resume after an interrupted run."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.unit._pipeline_helpers import click_action, click_button_truth, transition
from train_loops.jsonl import JsonlWriter
from workflows.analyzer.annotate import ANNOTATIONS_FILE, annotate, read_annotations
from workflows.analyzer.transitions import (
    TransitionError,
    read_transitions,
    validate_transition,
    write_transitions,
)
from workflows.common.pipeline_config import (
    AnnotateConfig,
    OpenAIExpertConfig,
    OracleExpertConfig,
    PipelineConfig,
)

OKAY = (24, 73)
MODEL = "judge-vlm"


def rows(n: int) -> list[dict[str, Any]]:
    """n transitions with distinct instructions (the fake server keys its behaviour on them)."""
    before, after = click_button_truth(), click_button_truth(done=True, score=1.0)
    out = []
    for i in range(n):
        row = transition(f"t{i}", before, after, click_action(*OKAY, 'Click the "okay" button.'))
        out.append({**row, "instruction": f"Click okay number {i}."})
    return out


def config(tmp_path: Path, expert: Any, **annotate: Any) -> PipelineConfig:
    cfg = PipelineConfig(
        runs_dir=str(tmp_path), run_name="ann", annotate=AnnotateConfig(expert=expert, **annotate)
    )
    write_transitions(rows(6), cfg.run_dir / "transitions" / "part-0.parquet")
    return cfg


def openai_expert(url: str, **kw: Any) -> OpenAIExpertConfig:
    base = {
        "base_url": url, "model": MODEL, "api_key_env": "PIPELINE_TEST_KEY",
        "concurrency": 3, "max_retries": 6, "backoff_base_s": 0.01, "backoff_cap_s": 0.2,
        "timeout_s": 10, "invalid_retries": 1,
    }  # fmt: skip
    return OpenAIExpertConfig(**{**base, **kw})


class ChatServer:
    """A chat-completions endpoint: checks each request, answers a judgment in a code fence.

    ``plan`` maps a transition number to a list of scripted answers for its successive
    requests ("503", "429", "400", "prose", "hang"); unlisted requests get the judgment.
    """

    def __init__(self, plan: dict[int, list[str]] | None = None) -> None:
        self.plan = plan or {}
        self.seen: list[int] = []
        self.problems: list[str] = []
        self.in_flight = self.max_in_flight = 0

    async def handle(self, request: web.Request) -> web.Response:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            body = await request.json()
            number = self.check(body, request.headers.get("Authorization"))
            self.seen.append(number)
            script = self.plan.get(number) or []
            kind = script.pop(0) if script else "ok"
            await asyncio.sleep(0.02)
            return await self.answer(kind)
        finally:
            self.in_flight -= 1

    async def answer(self, kind: str) -> web.Response:
        if kind == "hang":
            await asyncio.sleep(3600)
        if kind in ("503", "400"):
            return web.json_response({"error": {"message": kind}}, status=int(kind))
        if kind == "429":
            headers = {"Retry-After": "0.05"}
            return web.json_response({"error": "slow down"}, status=429, headers=headers)
        text = "I think it is fine." if kind == "prose" else (
            '```json\n{"consistency": 1, "effectiveness": 1, "guide": "click okay", '
            '"avoid": "clicking cancel"}\n```'
        )  # fmt: skip
        return web.json_response({"choices": [{"message": {"role": "assistant", "content": text}}]})

    def check(self, body: dict[str, Any], auth: str | None) -> int:
        if body.get("model") != MODEL:
            self.problems.append(f"model {body.get('model')}")
        if auth != "Bearer sekret":
            self.problems.append(f"auth {auth}")
        system, user = body["messages"]
        images = [p for p in user["content"] if p["type"] == "image_url"]
        if system["role"] != "system" or len(images) != 2:
            self.problems.append("prompt shape")
        for part in images:
            header, data = part["image_url"]["url"].split(",", 1)
            if header != "data:image/png;base64" or not base64.b64decode(data).startswith(
                b"\x89PNG"
            ):
                self.problems.append("image not a PNG data URL")
        text = " ".join(p["text"] for p in user["content"] if p["type"] == "text")
        return int(text.split("Click okay number ")[1].split(".")[0])


@asynccontextmanager
async def serving(server: ChatServer) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", server.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.5)  # hanging handlers: do not wait 60 s
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()


@pytest.fixture(autouse=True)
def api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPELINE_TEST_KEY", "sekret")


def test_transitions_round_trip_and_validation(tmp_path: Path) -> None:
    data = rows(2)
    path = write_transitions(data, tmp_path / "s.parquet")
    back = read_transitions(tmp_path)
    assert [r["transition_id"] for r in back] == ["t0", "t1"]
    assert back[0]["screenshot_before"] == data[0]["screenshot_before"]
    assert read_transitions(path, columns=["episode_id"])[0] == {"episode_id": "ep-t0"}
    with pytest.raises(TransitionError, match="unknown fields"):
        validate_transition({**data[0], "extra": 1})
    with pytest.raises(TransitionError, match="source"):
        validate_transition({**data[0], "source": "oracle"})


def test_annotation_log_survives_a_line_cut_by_a_kill(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text('{"transition_id": "a", "status": "ok"}\n{"transition_id": "b", "sta')
    assert set(read_annotations(path)) == {"a"}
    JsonlWriter(path).write({"transition_id": "c", "status": "rejected"})
    assert set(read_annotations(path)) == {"a", "c"}


def test_oracle_annotates_and_rejects_transitions_without_ground_truth(tmp_path: Path) -> None:
    cfg = config(tmp_path, OracleExpertConfig())
    extra = {**rows(1)[0], "transition_id": "nt", "truth_after": None}
    write_transitions([extra], cfg.run_dir / "transitions" / "part-1.parquet")
    summary = asyncio.run(annotate(cfg))
    assert (summary["annotated_ok"], summary["rejected"], summary["unannotated"]) == (6, 1, 0)
    assert summary["reject_reasons"] == {"expert refused": 1}
    assert summary["verdicts_by_source"]["policy"] == {"c1e1": 6}
    records = read_annotations(cfg.run_dir / ANNOTATIONS_FILE)
    assert json.loads(records["t0"]["text"])["consistency"] == 1 and records["t0"]["d"] == 1
    again = asyncio.run(annotate(cfg))  # rerun: nothing left to do
    assert again["this_run"] == {} and again["annotated_ok"] == 6


def test_openai_expert_retries_503_and_429_within_its_concurrency(tmp_path: Path) -> None:
    server = ChatServer({0: ["503", "503", "429"], 1: ["503"], 4: ["429", "503"]})

    async def main() -> dict[str, Any]:
        async with serving(server) as url:
            return await annotate(config(tmp_path, openai_expert(url)))

    summary = asyncio.run(main())
    assert server.problems == []
    assert summary["annotated_ok"] == 6 and summary["this_run"] == {"ok": 6}
    assert summary["expert"] == {"requests": 12, "retries": 6}
    assert sorted(set(server.seen)) == list(range(6)) and len(server.seen) == 12
    assert 1 < server.max_in_flight <= 3
    rec = read_annotations(tmp_path / "ann" / ANNOTATIONS_FILE)["t0"]
    assert rec["expert"] == f"openai:{MODEL}" and rec["text"].startswith('{"consistency": 1')


def test_refused_requests_stay_undone_and_invalid_answers_are_rejected(tmp_path: Path) -> None:
    server = ChatServer({1: ["400"], 2: ["prose", "prose"], 3: ["503"] * 3})

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        async with serving(server) as url:
            cfg = config(tmp_path, openai_expert(url, max_retries=2))
            first = await annotate(cfg)
            second = await annotate(cfg)  # the refused/failed ones are asked again
            return first, second

    first, second = asyncio.run(main())
    assert first["this_run"] == {"ok": 3, "errors": 2, "rejected": 1}
    assert any("HTTP 400" in e for e in first["errors"])
    assert any("gave up after 3 tries" in e for e in first["errors"])
    assert first["reject_reasons"] == {"unparseable": 1}
    assert server.seen.count(2) == 2  # invalid_retries=1: asked twice, then rejected
    assert second["this_run"] == {"ok": 2} and second["annotated_ok"] == 5
    assert second["rejected"] == 1 and server.seen.count(2) == 2  # rejects are not re-asked


def test_an_interrupted_run_resumes_without_asking_twice(tmp_path: Path) -> None:
    hang = {i: ["hang"] for i in range(3, 6)}  # numbers 0-2 answer, 3-5 never do
    server = ChatServer(hang)
    out = tmp_path / "ann" / ANNOTATIONS_FILE

    async def interrupted() -> None:
        async with serving(server) as url:
            cfg = config(tmp_path, openai_expert(url, concurrency=6))
            task = asyncio.ensure_future(annotate(cfg))
            while len(read_annotations(out)) < 3:
                await asyncio.sleep(0.02)
            task.cancel()  # a kill: the answers in flight are lost
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(interrupted())
    with out.open("a") as f:
        f.write('{"transition_id": "t4", "stat')  # and a line cut mid-write
    assert sorted(read_annotations(out)) == ["t0", "t1", "t2"]
    healthy = ChatServer()

    async def resumed() -> dict[str, Any]:
        async with serving(healthy) as url:
            return await annotate(config(tmp_path, openai_expert(url)))

    summary = asyncio.run(resumed())
    assert sorted(healthy.seen) == [3, 4, 5]  # nothing done before is asked again
    assert summary["annotated_ok"] == 6 and summary["unannotated"] == 0
    ids = [json.loads(line)["transition_id"] for line in out.read_text().splitlines()[:3]]
    assert sorted(ids) == ["t0", "t1", "t2"]
