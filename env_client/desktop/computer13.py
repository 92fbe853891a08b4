"""The step ACTION of the desktop backend: pyautogui, control, or OSWorld ``computer_13``.

``computer_13`` is OSWorld's structured action space (``desktop_env/actions.py``): an action
type plus parameters. The authors' session client sends it as ``{"kind": "gui", "type":
"CLICK", "payload": {"button": "left", "x": 10, "y": 20, "num_clicks": 1}}``. Each type maps
onto the same whitelisted operations a pyautogui command parses into, so both action spaces
share one execution path (and one set of limits):

| type | payload | operations |
|---|---|---|
| MOVE_TO | x, y | move |
| CLICK | button?, x?, y?, num_clicks? | click |
| MOUSE_DOWN / MOUSE_UP | button? | press / release the button |
| RIGHT_CLICK / DOUBLE_CLICK | x?, y? | click (right / twice) |
| DRAG_TO | x, y | drag from the pointer with the left button |
| SCROLL | dx?, dy? | horizontal then vertical scroll (clicks, + right / up) |
| TYPING | text | type |
| PRESS / KEY_DOWN / KEY_UP | key | press / hold / release |
| HOTKEY | keys | keys together |
| WAIT / FAIL / DONE | – | control action |
"""

from __future__ import annotations

import math
from typing import Any

from env_client.actions import normalize_key
from env_client.commands import (
    MAX_ABS_COORD,
    MAX_CLICKS,
    CommandError,
    KeysOp,
    PointerOp,
    ScrollOp,
    TypeOp,
    parse_command,
)
from env_client.desktop.program import DesktopOp, HoldOp

CONTROL_TYPES = ("DONE", "FAIL", "WAIT")
MAX_TEXT_CHARS = 10_000


def action_ops(action: Any) -> tuple[list[DesktopOp], str | None]:
    """(operations, control type) of a step ACTION; CommandError names what is wrong."""
    if not isinstance(action, dict):
        raise CommandError("action must be a JSON object")
    kind, typ = action.get("kind"), action.get("type")
    payload = action.get("payload")
    payload = {} if payload is None else payload
    if not isinstance(payload, dict):
        raise CommandError("action payload must be a JSON object")
    if kind == "control" or (kind == "gui" and typ in CONTROL_TYPES):
        if typ not in CONTROL_TYPES:
            raise CommandError(f"control action type must be DONE, FAIL or WAIT, got {typ!r}")
        return [], typ
    if kind != "gui":
        raise CommandError(f"action kind must be 'gui' or 'control', got {kind!r}")
    if typ == "pyautogui":
        if "command" not in payload:
            raise CommandError("gui action 'pyautogui' needs payload.command")
        return list(parse_command(payload["command"])), None
    if typ not in _BUILDERS:
        known = ", ".join(["pyautogui", *_BUILDERS, *CONTROL_TYPES])
        raise CommandError(f"gui action type {typ!r} is not one of {known}")
    _only(payload, _ALLOWED[typ], typ)
    return _BUILDERS[typ](payload, typ), None


def _only(payload: dict[str, Any], allowed: tuple[str, ...], typ: str) -> None:
    extra = sorted(set(payload) - set(allowed))
    if extra:
        raise CommandError(f"{typ}: unknown payload field(s) {extra}; allowed {list(allowed)}")


def _coord(payload: dict[str, Any], typ: str, required: bool) -> tuple[Any, Any]:
    x, y = payload.get("x"), payload.get("y")
    if x is None and y is None and not required:
        return None, None
    for name, v in (("x", x), ("y", y)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise CommandError(f"{typ}: payload.{name}={v!r} is not a finite number")
        if abs(v) > MAX_ABS_COORD:
            raise CommandError(f"{typ}: payload.{name}={v!r} is out of range")
    return x, y


def _button(payload: dict[str, Any], typ: str) -> str:
    button = payload.get("button", "left")
    if button not in ("left", "right", "middle"):
        raise CommandError(f"{typ}: payload.button={button!r} is not left/right/middle")
    return str(button)


def _key(value: Any, typ: str, field: str) -> str:
    key = normalize_key(value) if isinstance(value, str) else None
    if key is None:
        raise CommandError(f"{typ}: payload.{field}={value!r} is not a key name")
    return key


def _click(payload: dict[str, Any], typ: str) -> list[DesktopOp]:
    x, y = _coord(payload, typ, required=False)
    clicks = payload.get("num_clicks", 1)
    if isinstance(clicks, bool) or not isinstance(clicks, int) or not 1 <= clicks <= MAX_CLICKS:
        raise CommandError(f"{typ}: payload.num_clicks={clicks!r} must be 1..{MAX_CLICKS}")
    return [PointerOp("click", x, y, button=_button(payload, typ), clicks=clicks)]


def _right_click(payload: dict[str, Any], typ: str) -> list[DesktopOp]:
    x, y = _coord(payload, typ, required=False)
    return [PointerOp("click", x, y, button="right")]


def _double_click(payload: dict[str, Any], typ: str) -> list[DesktopOp]:
    x, y = _coord(payload, typ, required=False)
    return [PointerOp("click", x, y, clicks=2)]


def _move(payload: dict[str, Any], typ: str) -> list[DesktopOp]:
    return [PointerOp("move", *_coord(payload, typ, required=True))]


def _drag(payload: dict[str, Any], typ: str) -> list[DesktopOp]:
    return [PointerOp("drag", *_coord(payload, typ, required=True))]


def _mouse_hold(payload: dict[str, Any], typ: str) -> list[DesktopOp]:
    return [HoldOp("mouse", _button(payload, typ), typ == "MOUSE_DOWN")]


def _scroll(payload: dict[str, Any], typ: str) -> list[DesktopOp]:
    ops: list[DesktopOp] = []
    for field, horizontal in (("dx", True), ("dy", False)):
        v = payload.get(field, 0)
        if isinstance(v, bool) or not isinstance(v, int) or abs(v) > 10_000:
            raise CommandError(f"{typ}: payload.{field}={v!r} must be an integer click count")
        if v:
            ops.append(ScrollOp(v, None, None, horizontal=horizontal))
    if not ops:
        raise CommandError(f"{typ}: needs a non-zero payload.dx or payload.dy")
    return ops


def _typing(payload: dict[str, Any], typ: str) -> list[DesktopOp]:
    text = payload.get("text")
    if not isinstance(text, str) or not text or len(text) > MAX_TEXT_CHARS:
        raise CommandError(f"{typ}: payload.text must be 1..{MAX_TEXT_CHARS} characters")
    return [TypeOp(text)]


def _press(payload: dict[str, Any], typ: str) -> list[DesktopOp]:
    return [KeysOp((_key(payload.get("key"), typ, "key"),))]


def _key_hold(payload: dict[str, Any], typ: str) -> list[DesktopOp]:
    return [HoldOp("key", _key(payload.get("key"), typ, "key"), typ == "KEY_DOWN")]


def _hotkey(payload: dict[str, Any], typ: str) -> list[DesktopOp]:
    keys = payload.get("keys")
    if not isinstance(keys, list) or not 1 <= len(keys) <= 8:
        raise CommandError(f"{typ}: payload.keys must be a list of 1..8 key names")
    return [KeysOp(tuple(_key(k, typ, "keys") for k in keys))]


_BUILDERS = {
    "MOVE_TO": _move,
    "CLICK": _click,
    "MOUSE_DOWN": _mouse_hold,
    "MOUSE_UP": _mouse_hold,
    "RIGHT_CLICK": _right_click,
    "DOUBLE_CLICK": _double_click,
    "DRAG_TO": _drag,
    "SCROLL": _scroll,
    "TYPING": _typing,
    "PRESS": _press,
    "KEY_DOWN": _key_hold,
    "KEY_UP": _key_hold,
    "HOTKEY": _hotkey,
}
_ALLOWED: dict[str, tuple[str, ...]] = {
    "MOVE_TO": ("x", "y"),
    "CLICK": ("button", "x", "y", "num_clicks"),
    "MOUSE_DOWN": ("button",),
    "MOUSE_UP": ("button",),
    "RIGHT_CLICK": ("x", "y"),
    "DOUBLE_CLICK": ("x", "y"),
    "DRAG_TO": ("x", "y"),
    "SCROLL": ("dx", "dy"),
    "TYPING": ("text",),
    "PRESS": ("key",),
    "KEY_DOWN": ("key",),
    "KEY_UP": ("key",),
    "HOTKEY": ("keys",),
}
