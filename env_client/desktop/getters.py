"""Evaluator getters (OSWorld's ``desktop_env/evaluators/getters`` names): what a metric is
given as ``result`` or ``expected``.

| type | fields | gives |
|---|---|---|
| vm_file | path, dest | the desktop's file, copied to the episode cache; None if missing |
| local_file | path | a file of the task set (relative to the task-file roots) |
| rule | rules | the rules object itself |
| vm_command_line | command, shell? | the command's standard output in the desktop |
| vm_command_error | command, shell? | its standard error |
| accessibility_tree | – | the desktop's accessibility tree (XML text) |

OSWorld's ``cloud_file`` is not offered: the machines here have no internet.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from env_client.desktop.setup import Context, SetupError
from env_client.desktop.tasks import GETTER_TYPES


class GetterError(ValueError):
    """A getter config that cannot work (missing field)."""


def _field(config: dict[str, Any], name: str) -> Any:
    if name not in config:
        raise GetterError(f"getter {config.get('type')!r} needs field {name!r}")
    return config[name]


def get_vm_file(ctx: Context, config: dict[str, Any]) -> str | None:
    data = ctx.client.get_file(_field(config, "path"))
    if data is None:
        return None
    dest = Path(str(config.get("dest") or Path(config["path"]).name)).name  # no folders
    out = ctx.cache_dir / dest
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
    return str(out)


def get_local_file(ctx: Context, config: dict[str, Any]) -> str:
    try:
        return str(ctx.local_file(_field(config, "path")))
    except SetupError as exc:
        raise GetterError(str(exc)) from None


def get_rule(ctx: Context, config: dict[str, Any]) -> Any:
    return _field(config, "rules")


def _run(ctx: Context, config: dict[str, Any]) -> dict[str, Any]:
    return ctx.client.execute(_field(config, "command"), bool(config.get("shell", False)))


def get_vm_command_line(ctx: Context, config: dict[str, Any]) -> str:
    return str(_run(ctx, config).get("output") or "")


def get_vm_command_error(ctx: Context, config: dict[str, Any]) -> str:
    return str(_run(ctx, config).get("error") or "")


def get_accessibility_tree(ctx: Context, config: dict[str, Any]) -> str | None:
    return ctx.client.accessibility()


GETTERS: dict[str, Callable[[Context, dict[str, Any]], Any]] = {
    "vm_file": get_vm_file,
    "local_file": get_local_file,
    "rule": get_rule,
    "vm_command_line": get_vm_command_line,
    "vm_command_error": get_vm_command_error,
    "accessibility_tree": get_accessibility_tree,
}
assert set(GETTERS) == GETTER_TYPES, "tasks.GETTER_TYPES must name exactly these getters"
