"""OSWorld's setup steps (a task's ``config`` and its evaluator's ``postconfig``), run through a
desktop's in-VM API, so they work the same on a local desktop and on an OSWorld machine.

| type | parameters | what it does |
|---|---|---|
| launch | command, shell? | start a program (``/setup/launch``) |
| execute, command | command, shell? | run a command to its end (``/setup/execute``); a non-zero exit fails |
| open | path | open a file or folder in its app (``/setup/open_file``) |
| sleep | seconds | wait |
| upload_file | files: [{local_path, path}] | copy a file of the task set into the desktop |
| activate_window, close_window | window_name, strict?, by_class? | focus / close a window |

``activate_window`` and ``close_window`` retry until ``window_wait_s`` (a just-launched app
takes a moment to map its window). ``local_path`` is relative to one of the task-file roots
(the built-in set's folder, or the folder of the task file): a task payload cannot copy other
files of the server's machine into a desktop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from env_client.desktop.tasks import STEP_MODELS
from env_client.desktop.vmclient import DesktopApiError, VMClient


class SetupError(RuntimeError):
    """A setup step failed; the message names the step and why."""


@dataclass
class Context:
    """What setup steps and getters need besides the desktop's client."""

    client: VMClient
    files_roots: list[Path]
    cache_dir: Path
    window_wait_s: float = 15.0
    log: list[str] = field(default_factory=list)

    def local_file(self, given: str) -> Path:
        """A file of the task set; SetupError for anything outside the roots."""
        rel = Path(given)
        if rel.is_absolute() or ".." in rel.parts:
            raise SetupError(f"local_path {given!r} must be relative to the task files")
        for root in self.files_roots:
            path = (root / rel).resolve()
            if root.resolve() in path.parents and path.is_file():
                return path
        raise SetupError(f"local_path {given!r}: no such file under {self.files_roots}")


def run_steps(ctx: Context, steps: list[dict[str, Any]], what: str = "config") -> None:
    """Run the steps in order; SetupError names the first one that fails."""
    for i, step in enumerate(steps):
        typ = str(step.get("type"))
        params = STEP_MODELS[typ].model_validate(step.get("parameters", {})).model_dump()
        try:
            _STEPS[typ](ctx, **params)
        except DesktopApiError as exc:
            raise SetupError(f"{what}[{i}] ({typ}) failed: {exc}") from None
        except SetupError as exc:
            raise SetupError(f"{what}[{i}] ({typ}) failed: {exc}") from None
        ctx.log.append(f"{what}[{i}] {typ} ok")


def _launch(ctx: Context, command: Any, shell: bool) -> None:
    ctx.client.launch(command, shell)


def _execute(ctx: Context, command: Any, shell: bool) -> None:
    got = ctx.client.execute(command, shell, route="/setup/execute")
    if got.get("returncode") != 0:
        err = str(got.get("error") or got.get("output") or "")[-300:]
        raise SetupError(f"exit status {got.get('returncode')}: {err.strip()}")


def _open(ctx: Context, path: str) -> None:
    ctx.client.open_file(path)


def _sleep(ctx: Context, seconds: float) -> None:
    time.sleep(seconds)


def _upload(ctx: Context, files: list[dict[str, str]]) -> None:
    for spec in files:
        src = ctx.local_file(spec["local_path"])
        ctx.client.upload(spec["path"], src.read_bytes())


def _window(action: str) -> Any:
    def step(ctx: Context, window_name: str, strict: bool, by_class: bool) -> None:
        deadline = time.monotonic() + ctx.window_wait_s
        while True:
            try:
                ctx.client.window(action, window_name, strict, by_class)
                return
            except DesktopApiError as exc:
                if exc.status != 404 or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    return step


_STEPS = {
    "launch": _launch,
    "execute": _execute,
    "command": _execute,
    "open": _open,
    "sleep": _sleep,
    "upload_file": _upload,
    "activate_window": _window("activate"),
    "close_window": _window("close"),
}
