"""Desktop task payloads: OSWorld's task JSON, checked for what this backend can run.

On top of the generic check of :func:`env_client.tasks.sources.load_osworld_task` (``id``,
``instruction``, ``config``, ``evaluator``), :func:`check_task` validates every setup step's
parameters (:data:`STEP_MODELS`, OSWorld's step names) and the evaluator: metric names known
to :mod:`env_client.desktop.metrics`, getter types known to :mod:`env_client.desktop.getters`,
``conj``, ``options`` and ``postconfig``. Errors are :class:`TaskFileError` naming the source
(a file, or ``task_payload``) and the field, e.g. ``config[1].parameters.path``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from env_client.tasks.sources import OSWorldTask, TaskFileError, load_osworld_task

MAX_SLEEP_S = 60.0


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LaunchParams(_Params):
    command: list[str] | str = Field(min_length=1)
    shell: bool = False


class ExecuteParams(_Params):
    """OSWorld's ``stdout``/``stderr``/``until`` options are not supported (refused)."""

    command: list[str] | str = Field(min_length=1)
    shell: bool = False


class OpenParams(_Params):
    path: str = Field(min_length=1)


class SleepParams(_Params):
    seconds: float = Field(ge=0, le=MAX_SLEEP_S)


class FileSpec(_Params):
    local_path: str = Field(min_length=1)
    path: str = Field(min_length=1)


class UploadParams(_Params):
    files: list[FileSpec] = Field(min_length=1)


class WindowParams(_Params):
    window_name: str = Field(min_length=1)
    strict: bool = False
    by_class: bool = False


STEP_MODELS: dict[str, type[_Params]] = {
    "launch": LaunchParams,
    "execute": ExecuteParams,
    "command": ExecuteParams,
    "open": OpenParams,
    "sleep": SleepParams,
    "upload_file": UploadParams,
    "activate_window": WindowParams,
    "close_window": WindowParams,
}


class Getter(BaseModel):
    """A result/expected getter: ``type`` plus its own fields (checked by the getter)."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(min_length=1)


class Evaluator(BaseModel):
    model_config = ConfigDict(extra="forbid")

    func: str | list[str]
    result: Getter | list[Getter] | None = None
    expected: Getter | list[Getter] | None = None
    options: dict[str, Any] | list[dict[str, Any]] = Field(default_factory=dict)
    conj: Literal["and", "or"] = "and"
    postconfig: list[dict[str, Any]] = Field(default_factory=list)


def _loc(err: Any) -> str:
    out = ""
    for part in err["loc"]:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(root)"


def _fail(source: str, field: str, message: str) -> TaskFileError:
    return TaskFileError(f"{source}: field {field!r}: {message}")


def check_steps(steps: Any, source: str, field: str) -> None:
    """Each setup step is ``{"type": <known>, "parameters": {...}}`` with valid parameters."""
    if not isinstance(steps, list):
        raise _fail(source, field, "must be a list of setup steps")
    for i, step in enumerate(steps):
        where = f"{field}[{i}]"
        if not isinstance(step, dict) or step.get("type") not in STEP_MODELS:
            typ = step.get("type") if isinstance(step, dict) else step
            raise _fail(source, f"{where}.type", f"{typ!r} is not one of {sorted(STEP_MODELS)}")
        extra = set(step) - {"type", "parameters"}
        if extra:
            raise _fail(source, where, f"unknown key(s) {sorted(extra)}")
        try:
            STEP_MODELS[step["type"]].model_validate(step.get("parameters", {}))
        except ValidationError as exc:
            err = exc.errors()[0]
            raise _fail(source, f"{where}.parameters.{_loc(err)}", err["msg"]) from None


# The getter types ``getters.GETTERS`` implements (named here: getters builds on this module).
GETTER_TYPES = frozenset(
    ("vm_file", "local_file", "rule", "vm_command_line", "vm_command_error", "accessibility_tree")
)


def check_evaluator(evaluator: Any, source: str) -> Evaluator:
    from env_client.desktop.metrics import METRICS

    try:
        ev = Evaluator.model_validate(evaluator)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise _fail(source, f"evaluator.{_loc(err)}", err["msg"]) from None
    funcs = _as_list(ev.func)
    for i, func in enumerate(funcs):
        if func not in METRICS:
            raise _fail(source, f"evaluator.func[{i}]", f"unknown metric {func!r}")
    for name in ("result", "expected", "options"):
        value = getattr(ev, name)
        listed = isinstance(ev.func, list) and name != "options" and value is not None
        if listed and not isinstance(value, list):
            raise _fail(source, f"evaluator.{name}", "must be a list when func is a list")
        if isinstance(value, list) and len(value) != len(funcs):
            raise _fail(source, f"evaluator.{name}", f"needs one entry per func ({len(funcs)})")
    for name in ("result", "expected"):
        for i, getter in enumerate(_as_list(getattr(ev, name))):
            if getter is not None and getter.type not in GETTER_TYPES:
                raise _fail(source, f"evaluator.{name}[{i}].type", f"unknown {getter.type!r}")
    if funcs != ["infeasible"] and ev.result is None:
        raise _fail(source, "evaluator.result", "required (a getter) for this metric")
    check_steps(ev.postconfig, source, "evaluator.postconfig")
    return ev


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value] if value is not None else []


def check_task(task: Any, source: str = "task_payload") -> dict[str, Any]:
    """A desktop task, fully validated (the same dict back); TaskFileError otherwise."""
    if not isinstance(task, dict):
        raise TaskFileError(f"{source}: a task must be a JSON object")
    try:
        OSWorldTask.model_validate(task)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise _fail(source, _loc(err), err["msg"]) from None
    check_steps(task.get("config", []), source, "config")
    check_evaluator(task["evaluator"], source)
    return task


def load_task(path: Path) -> dict[str, Any]:
    """A desktop task file, validated (generic OSWorld check first, then ours)."""
    return check_task(load_osworld_task(path), str(path))
