"""The demo app's HTTP API and page (FastAPI), built per replica over a :class:`DemoService`.

Every refusal is a 4xx/5xx JSON body ``{"ok": false, "error": "<what and why>"}`` that the page
shows as it is: unknown task or split (404), a body over ``demo.max_body_bytes`` (413, refused
before it is parsed: a declared length unread, a chunked body once it passes the limit; a 1 MB
instruction never reaches the parser), a field of the wrong JSON type, an instruction over
``demo.max_instruction_chars`` or another invalid field (422, naming the field), every episode
slot taken (429), no free desktop (503), a run folder or step that does not exist (404).

Routes (relative to the app's route prefix, ``/demo`` by default)::

    GET  /                                   the page
    GET  /api/info                           tasks per split, limits, models
    GET  /api/status                         live episodes, the episode limit, the env service
    POST /api/episodes                       start {task, split, seed?, instruction?, temperature?}
    GET  /api/episodes/{id}?since=N          state + steps N.. (each poll is the page's heartbeat)
    POST /api/episodes/{id}/{step|run|pause|stop}
    PUT  /api/episodes/{id}/temperature      {temperature}
    GET  /api/runs                           run folders with trajectories
    GET  /api/runs/{run}/steps?version&group&episode&only=all|failures|gate
    GET  /api/runs/{run}/steps/{sample_id}   one step + its number of screenshots
    GET  /api/runs/{run}/steps/{sample_id}/screenshots/{k}   PNG
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from env_client.tasks.sources import TaskSource
from serve_apps.openai_api import BodyLimit
from workflows.demo.config import DemoConfig
from workflows.demo.live import DemoError, EpisodeManager, draw_seed
from workflows.demo.viewer import Only, RunIndex, ViewerError

PAGE = Path(__file__).with_name("page.html")


class StartRequest(BaseModel):
    """Start an episode: a task of a split, optionally with a typed instruction. Strict types
    (the page sends JSON numbers): ``"seed": true`` or ``"temperature": "0.5"`` is refused, not
    read as 1 and 0.5."""

    model_config = ConfigDict(extra="forbid", strict=True)

    task: str = Field(min_length=1, max_length=200, description="Task name of the split.")
    split: str = Field("train", min_length=1, max_length=100)
    seed: int | None = Field(None, ge=0, le=2**31 - 1, description="Task instance; None: draw.")
    instruction: str | None = Field(None, description="Replaces the task's instruction.")
    temperature: float | None = Field(None, ge=0.0, le=10.0, description="None: the policy's.")


class TemperatureRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    temperature: float | None = Field(None, ge=0.0, le=10.0)


@dataclass
class DemoService:
    """What the routes work on: config, task source, live episodes, the runs index."""

    cfg: DemoConfig
    source: TaskSource
    manager: EpisodeManager
    index: RunIndex
    env_url: str | None = None

    def splits(self) -> list[str]:
        if self.cfg.task_source.kind == "osworld":
            return sorted(self.cfg.task_source.splits)
        from env_client.tasks import DEFAULT_TASKS, load_task_list

        return sorted(load_task_list(self.cfg.task_source.path or DEFAULT_TASKS).splits)

    def task_names(self, split: str) -> list[str]:
        if split not in self.splits():
            raise DemoError(f"unknown split {split[:60]!r}; splits: {self.splits()}", 404)
        return sorted({str(t["task"]) for t in self.source.tasks(split)})

    def task_instance(self, split: str, name: str, seed: int | None) -> dict[str, Any]:
        names = self.task_names(split)
        if name not in names:
            raise DemoError(f"unknown task {name[:80]!r} in split {split!r}; tasks: {names}", 404)
        payload = next(t for t in self.source.tasks(split) if t["task"] == name)
        return self.source.instance(payload, draw_seed() if seed is None else seed)

    def check_instruction(self, text: str | None) -> str | None:
        text = (text or "").strip()
        limit = self.cfg.demo.max_instruction_chars
        if len(text) > limit:
            raise DemoError(
                f"instruction has {len(text)} characters; the demo accepts at most {limit}", 422
            )
        return text or None

    def info(self) -> dict[str, Any]:
        return {
            "tasks": {s: self.task_names(s) for s in self.splits()},
            "limit": self.manager.limit,
            "live": self.manager.live_count(),
            "max_steps": self.cfg.demo.max_steps,
            "max_instruction_chars": self.cfg.demo.max_instruction_chars,
            "policy": {
                "name": self.cfg.policy.name,
                "style": self.cfg.policy.agent_style,
                "temperature": self.cfg.policy.sampling.temperature,
            },
            "analyzer": self.cfg.analyzer.name if self.cfg.demo.use_analyzer else None,
            "runs_dir": str(self.cfg.runs_path),
        }

    def status(self) -> dict[str, Any]:
        return {
            "live": self.manager.live_count(),
            "limit": self.manager.limit,
            "env_url": self.env_url,
            "episodes": [
                {"id": e.id, "state": e.state, "task": e.task.get("task"), "steps": len(e.steps)}
                for e in self.manager.episodes.values()
            ],
        }


def _error(message: str, status: int) -> JSONResponse:
    return JSONResponse({"ok": False, "error": message}, status_code=status)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors()[:3]:
        loc = ".".join(str(p) for p in err["loc"] if p != "body") or "body"
        parts.append(f"{loc}: {err['msg']}")
    return "invalid request: " + "; ".join(parts)


class DemoBodyLimit(BodyLimit):
    """The OpenAI endpoint's body limit (a declared Content-Length over the limit is refused
    before a byte is read; a chunked body is counted as it arrives and refused once over it, so
    the app never parses it), answering 413 in the demo's error shape: only ``_refuse``, the
    one place it answers, is replaced."""

    def __init__(self, app: Any, max_bytes: int, max_chars: int) -> None:
        super().__init__(app, max_bytes)
        self.max_chars = max_chars

    async def _refuse(self, send: Any) -> None:
        answer = _error(
            f"request body is over the demo's limit: it accepts at most {self.max_bytes} bytes "
            f"(an instruction is at most {self.max_chars} characters)",
            413,
        )
        await send({"type": "http.response.start", "status": 413, "headers": answer.raw_headers})
        await send({"type": "http.response.body", "body": answer.body})


def _add_error_handlers(app: FastAPI) -> None:
    async def demo_error(request: Request, exc: Exception) -> JSONResponse:
        return _error(str(exc), getattr(exc, "status", 400))

    async def invalid(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return _error(_validation_message(exc), 422)

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        what = "no such route" if exc.status_code == 404 else str(exc.detail)
        return _error(f"{what}: {request.method} {request.url.path}", exc.status_code)

    app.add_exception_handler(DemoError, demo_error)
    app.add_exception_handler(ViewerError, demo_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(StarletteHTTPException, http_error)


def build_api(service: DemoService) -> FastAPI:
    """The page and its API over ``service``."""
    cfg = service.cfg.demo
    app = FastAPI(title="ComputerSD demo", docs_url=None, redoc_url=None, openapi_url=None)
    _add_error_handlers(app)
    app.add_middleware(
        DemoBodyLimit, max_bytes=cfg.max_body_bytes, max_chars=cfg.max_instruction_chars
    )
    _episode_routes(app, service)
    _viewer_routes(app, service.index)
    page = PAGE.read_text()

    @app.get("/", response_class=HTMLResponse)
    async def index() -> HTMLResponse:
        return HTMLResponse(page, headers={"Cache-Control": "no-store"})

    @app.get("/api/info")
    async def info() -> dict[str, Any]:
        return await asyncio.to_thread(service.info)

    @app.get("/api/status")
    async def status() -> dict[str, Any]:
        return service.status()

    return app


def _episode_routes(app: FastAPI, service: DemoService) -> None:
    manager = service.manager

    @app.post("/api/episodes", status_code=201)
    async def start(body: StartRequest) -> dict[str, Any]:
        instruction = service.check_instruction(body.instruction)
        task = service.task_instance(body.split, body.task, body.seed)
        episode = await manager.start(task, instruction, body.temperature)
        return episode.view()

    @app.get("/api/episodes/{episode_id}")
    async def poll(episode_id: str, since: int = 0) -> dict[str, Any]:
        return manager.get(episode_id).view(max(0, since))

    @app.post("/api/episodes/{episode_id}/{command}")
    async def control(episode_id: str, command: str, since: int = 0) -> dict[str, Any]:
        episode = manager.get(episode_id)
        if command == "step":
            episode.step()
        elif command == "run":
            episode.run()
        elif command == "pause":
            episode.pause()
        elif command == "stop":
            await episode.stop("stopped from the page")
        else:
            raise DemoError(f"unknown command {command[:40]!r}; use step, run, pause or stop", 404)
        return episode.view(max(0, since))

    @app.put("/api/episodes/{episode_id}/temperature")
    async def temperature(episode_id: str, body: TemperatureRequest) -> dict[str, Any]:
        episode = manager.get(episode_id)
        episode.set_temperature(body.temperature)
        return {"ok": True, "temperature": episode.temperature}


def _viewer_routes(app: FastAPI, index: RunIndex) -> None:
    from workflows.demo.viewer import list_runs

    @app.get("/api/runs")
    async def runs() -> dict[str, Any]:
        return {"runs_dir": str(index.runs_dir), "runs": list_runs(index.runs_dir)}

    @app.get("/api/runs/{run}/steps")
    async def steps(
        run: str,
        version: int | None = None,
        group: str | None = None,
        episode: str | None = None,
        only: Only = "all",
    ) -> dict[str, Any]:
        return await asyncio.to_thread(index.select, run, version, group, episode, only)

    @app.get("/api/runs/{run}/steps/{sample_id}")
    async def step(run: str, sample_id: str) -> dict[str, Any]:
        shots = await asyncio.to_thread(index.screenshots, run, sample_id)
        return {**index.step(run, sample_id), "screenshots": len(shots)}

    @app.get("/api/runs/{run}/steps/{sample_id}/screenshots/{k}")
    async def screenshot(run: str, sample_id: str, k: int) -> Response:
        shots = await asyncio.to_thread(index.screenshots, run, sample_id)
        if not 0 <= k < len(shots):
            raise ViewerError(f"step {sample_id!r} has {len(shots)} screenshots, no index {k}")
        return Response(shots[k], media_type="image/png")
