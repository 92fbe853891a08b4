"""The action model: policy response text ⇄ typed action ⇄ wire ACTION dict.

A policy answers (../shared/METHOD.md §1)::

    Action: click the "OK" button to confirm.
    <tool_call>{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [512, 380]}}</tool_call>

``parse_response`` turns that into an :class:`Action` (never raises: anything unparseable is an
``invalid`` action with a ``reason``); ``to_protocol`` renders an action for the environment
(a pyautogui command with integer screen pixels, or a DONE/FAIL/WAIT control action);
``render_response`` writes the canonical response text back (scripted demonstrations, tests).

Coordinates on the policy side are a relative 0..999 grid: grid cell ``c`` covers screen pixels
``[c*W/1000, (c+1)*W/1000)``; ``to_pixel`` takes its centre, ``to_relative`` is its inverse
(exact for screens narrower than 1000 pixels).
"""

from __future__ import annotations

import json
import math
import re
import string
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

GRID = 1000  # relative coordinates are 0..GRID-1
MAX_RESPONSE_CHARS = 64_000
MAX_TEXT_CHARS = 2_000
MAX_KEYS = 8
MAX_SCROLL = 10_000

ActionName = Literal[
    "key",
    "type",
    "mouse_move",
    "left_click",
    "left_click_drag",
    "right_click",
    "middle_click",
    "double_click",
    "triple_click",
    "scroll",
    "hscroll",
    "wait",
    "terminate",
    "invalid",
]

ACTION_NAMES: frozenset[str] = frozenset(get_args(ActionName))
POINTER_ACTIONS = frozenset(
    {
        "mouse_move",
        "left_click",
        "left_click_drag",
        "right_click",
        "middle_click",
        "double_click",
        "triple_click",
    }
)
_SCROLL_ACTIONS = frozenset({"scroll", "hscroll"})
_PYAUTOGUI_POINTER = {
    "mouse_move": "moveTo",
    "left_click": "click",
    "right_click": "rightClick",
    "middle_click": "middleClick",
    "double_click": "doubleClick",
    "triple_click": "tripleClick",
}

# pyautogui.KEYBOARD_KEYS (0.9.54) names longer than one character; single printable characters
# are valid keys too.
_KEY_NAMES = """accept add alt altleft altright apps backspace browserback browserfavorites
    browserforward browserhome browserrefresh browsersearch browserstop capslock clear convert
    ctrl ctrlleft ctrlright decimal del delete divide down end enter esc escape execute final fn
    hanguel hangul hanja help home insert junja kana kanji launchapp1 launchapp2 launchmail
    launchmediaselect left modechange multiply nexttrack nonconvert num0 num1 num2 num3 num4 num5
    num6 num7 num8 num9 numlock pagedown pageup pause pgdn pgup playpause prevtrack print
    printscreen prntscrn prtsc prtscr return right scrolllock select separator shift shiftleft
    shiftright sleep space stop subtract tab up volumedown volumemute volumeup win winleft
    winright yen command option optionleft optionright"""
PYAUTOGUI_KEYS = frozenset(_KEY_NAMES.split() + [f"f{i}" for i in range(1, 25)])
_PRINTABLE_KEYS = frozenset(string.printable) - frozenset("\x0b\x0c")

# Names policies (Qwen, xdotool, browsers) use for keys pyautogui calls otherwise.
KEY_ALIASES = {
    "control": "ctrl",
    "control_l": "ctrl",
    "control_r": "ctrlright",
    "ctrl_l": "ctrl",
    "ctrl_r": "ctrlright",
    "alt_l": "alt",
    "alt_r": "altright",
    "shift_l": "shift",
    "shift_r": "shiftright",
    "super": "win",
    "super_l": "win",
    "meta": "win",
    "cmd": "command",
    "escape": "esc",
    "return": "enter",
    "kp_enter": "enter",
    "arrowup": "up",
    "arrowdown": "down",
    "arrowleft": "left",
    "arrowright": "right",
    "page_up": "pageup",
    "page_down": "pagedown",
    "prior": "pageup",
    "next": "pagedown",
    "spacebar": "space",
    "caps_lock": "capslock",
}


def normalize_key(key: str) -> str | None:
    """A key name as pyautogui spells it, or None if it is not a key."""
    if len(key) == 1:
        return key if key in _PRINTABLE_KEYS else None
    name = key.strip().lower().replace(" ", "")
    if len(name) == 1:
        return name if name in _PRINTABLE_KEYS else None
    name = KEY_ALIASES.get(name, name)
    return name if name in PYAUTOGUI_KEYS else None


def to_pixel(coord: int, size: int) -> int:
    """Relative grid coordinate 0..999 → the pixel at its cell's centre on a ``size`` screen."""
    return min(size - 1, max(0, int((coord + 0.5) * size / GRID)))


def to_relative(pixel: float, size: int) -> int:
    """Screen pixel → relative grid coordinate (the inverse of ``to_pixel`` for size < 1000)."""
    return min(GRID - 1, max(0, int((math.floor(pixel) + 0.5) * GRID / size)))


class Action(BaseModel):
    """One policy action. Coordinates are relative (0..999); ``thought`` is the Action: line."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: ActionName
    thought: str = Field("", description="The sentence after 'Action:'.")
    coordinate: tuple[int, int] | None = Field(None, description="Relative 0..999 (x, y).")
    text: str | None = Field(None, max_length=MAX_TEXT_CHARS, description="For 'type'.")
    keys: tuple[str, ...] | None = Field(None, description="For 'key', pyautogui key names.")
    pixels: int | None = Field(None, description="For scroll/hscroll: + up/right, - down/left.")
    time: float | None = Field(None, ge=0, le=60, description="For 'wait', seconds.")
    status: Literal["success", "failure"] | None = Field(None, description="For 'terminate'.")
    reason: str | None = Field(None, description="Why an 'invalid' action did not parse.")

    @model_validator(mode="after")
    def _check(self) -> Action:
        problem = _action_problem(self)
        if problem:
            raise ValueError(problem)
        return self

    @property
    def is_valid(self) -> bool:
        return self.name != "invalid"

    def pixel(self, screen_w: int, screen_h: int) -> tuple[int, int] | None:
        """The coordinate in screen pixels (None for actions without one)."""
        if self.coordinate is None:
            return None
        return to_pixel(self.coordinate[0], screen_w), to_pixel(self.coordinate[1], screen_h)


def _action_problem(a: Action) -> str | None:
    """What is wrong with an action's arguments, or None."""
    if a.coordinate is not None and not all(0 <= c < GRID for c in a.coordinate):
        return f"coordinate {list(a.coordinate)} is outside the 0..{GRID - 1} grid"
    if a.name in POINTER_ACTIONS and a.coordinate is None:
        return f"{a.name} needs a coordinate [x, y]"
    if a.name == "type" and not a.text:
        return "type needs a non-empty text"
    if a.name == "key":
        if not a.keys or len(a.keys) > MAX_KEYS:
            return f"key needs 1..{MAX_KEYS} keys"
        bad = [k for k in a.keys if normalize_key(k) != k]
        if bad:
            return f"unknown key(s) {bad}"
    if a.name in _SCROLL_ACTIONS and (a.pixels is None or abs(a.pixels) > MAX_SCROLL):
        return f"{a.name} needs pixels in [-{MAX_SCROLL}, {MAX_SCROLL}]"
    if a.name == "terminate" and a.status is None:
        return "terminate needs status 'success' or 'failure'"
    if a.name == "invalid" and not a.reason:
        return "an invalid action needs a reason"
    return None


def invalid(reason: str, thought: str = "") -> Action:
    """The typed 'did not parse' action."""
    return Action(name="invalid", reason=reason[:500] or "unparseable", thought=thought)


# --- parsing -------------------------------------------------------------------------------

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_THOUGHT = re.compile(r"^\s*Action:[ \t]*(.*)$", re.MULTILINE)
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


def parse_response(text: str) -> Action:
    """Policy response → Action. Never raises; problems give an ``invalid`` action."""
    try:
        return _parse(text)
    except Exception as exc:  # a parser must not kill an episode, whatever the input
        return invalid(f"parser error: {type(exc).__name__}: {exc}")


def _parse(text: Any) -> Action:
    if not isinstance(text, str):
        return invalid(f"response is {type(text).__name__}, not text")
    if len(text) > MAX_RESPONSE_CHARS:
        return invalid(f"response longer than {MAX_RESPONSE_CHARS} characters")
    # Thinking models reason first; only what follows the reasoning is the answer (the
    # opening <think> may sit in the prompt, so a lone </think> ends the reasoning too).
    text = _THINK.sub("", text).rpartition("</think>")[2]
    m = _THOUGHT.search(text)
    thought = m.group(1).strip() if m else ""
    calls = _TOOL_CALL.findall(text)
    if len(calls) != 1:
        what = "no <tool_call>…</tool_call>" if not calls else f"{len(calls)} tool calls"
        return invalid(f"expected exactly one tool call, found {what}", thought)
    try:
        call = json.loads(calls[0])
    except (ValueError, RecursionError) as exc:
        return invalid(f"tool call is not JSON: {exc}", thought)
    fields, problem = _tool_fields(call)
    if problem:
        return invalid(problem, thought)
    try:
        return Action(thought=thought, **fields)
    except ValidationError as exc:
        return invalid(_validation_message(exc), thought)


def _tool_fields(call: Any) -> tuple[dict[str, Any], str | None]:
    """The tool call's JSON → Action fields, or a problem."""
    if not isinstance(call, dict) or call.get("name") != "computer_use":
        return {}, 'tool call must be {"name": "computer_use", "arguments": {…}}'
    args = call.get("arguments")
    if not isinstance(args, dict):
        return {}, "tool call arguments must be an object"
    name = args.get("action")
    if not isinstance(name, str) or name == "invalid" or name not in ACTION_NAMES:
        return {}, f"unknown action {str(name)[:40]!r}"
    fields: dict[str, Any] = {"name": name}
    for key, conv in _ARGUMENTS.items():
        if key in args:
            value, problem = conv(args[key])
            if problem:
                return {}, f"{name}: argument {key!r} {problem}"
            fields[key] = value
    return fields, None


def _as_int(v: Any) -> int | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return round(v)


def _conv_coordinate(v: Any) -> tuple[Any, str | None]:
    if not isinstance(v, list | tuple) or len(v) != 2:
        return None, "must be [x, y]"
    xy = [_as_int(c) for c in v]
    if xy[0] is None or xy[1] is None:
        return None, "must hold two numbers"
    return (xy[0], xy[1]), None


def _conv_keys(v: Any) -> tuple[Any, str | None]:
    if isinstance(v, str):
        v = v.split("+") if len(v) > 1 else [v]
    if not isinstance(v, list | tuple) or not all(isinstance(k, str) for k in v):
        return None, "must be a list of key names"
    keys = [normalize_key(k) for k in v]
    if any(k is None for k in keys):
        return None, f"has unknown key(s) {[k for k in v if normalize_key(k) is None][:4]}"
    return tuple(keys), None


def _conv_text(v: Any) -> tuple[Any, str | None]:
    return (v, None) if isinstance(v, str) else (None, "must be a string")


def _conv_pixels(v: Any) -> tuple[Any, str | None]:
    n = _as_int(v)
    return (n, None) if n is not None else (None, "must be a number")


def _conv_time(v: Any) -> tuple[Any, str | None]:
    ok = not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v)
    return (float(v), None) if ok else (None, "must be a number of seconds")


_ARGUMENTS = {
    "coordinate": _conv_coordinate,
    "keys": _conv_keys,
    "text": _conv_text,
    "pixels": _conv_pixels,
    "time": _conv_time,
    "status": _conv_text,
}


def _validation_message(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    msg = str(err["msg"]).removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg


# --- rendering -----------------------------------------------------------------------------


def tool_arguments(action: Action) -> dict[str, Any]:
    """The ``arguments`` object of the action's tool call."""
    if not action.is_valid:
        raise ValueError(f"an invalid action has no tool call ({action.reason})")
    args: dict[str, Any] = {"action": action.name}
    if action.keys is not None:
        args["keys"] = list(action.keys)
    if action.text is not None:
        args["text"] = action.text
    if action.coordinate is not None:
        args["coordinate"] = list(action.coordinate)
    if action.pixels is not None:
        args["pixels"] = action.pixels
    if action.time is not None:
        args["time"] = action.time
    if action.status is not None:
        args["status"] = action.status
    return args


def render_response(action: Action) -> str:
    """Action → the canonical policy response text (``Action: …`` + one tool call)."""
    call = {"name": "computer_use", "arguments": tool_arguments(action)}
    thought = " ".join((action.thought or describe(action)).split())
    return f"Action: {thought}\n<tool_call>{json.dumps(call, ensure_ascii=False)}</tool_call>"


def describe(action: Action) -> str:
    """A plain sentence for an action without a thought."""
    if action.name == "invalid":
        return f"(invalid: {action.reason})"
    where = f" at {list(action.coordinate)}" if action.coordinate else ""
    what = {
        "type": f" {action.text!r}",
        "key": f" {'+'.join(action.keys or ())}",
        "scroll": f" by {action.pixels}",
        "hscroll": f" by {action.pixels}",
        "wait": f" {action.time or 1:g} s",
        "terminate": f" ({action.status})",
    }.get(action.name, "")
    return f"{action.name.replace('_', ' ')}{what}{where}."


ProtocolAction = dict[str, Any]


def control(kind: Literal["DONE", "FAIL", "WAIT"]) -> ProtocolAction:
    return {"kind": "control", "type": kind, "payload": {}}


def gui(command: str) -> ProtocolAction:
    return {"kind": "gui", "type": "pyautogui", "payload": {"command": command}}


def to_protocol(action: Action, screen_w: int, screen_h: int) -> ProtocolAction | None:
    """Action → the ENV_PROTOCOL ACTION dict; None for an invalid action (no env call)."""
    if not action.is_valid:
        return None
    if action.name == "terminate":
        return control("DONE" if action.status == "success" else "FAIL")
    if action.name == "wait":
        return control("WAIT")
    return gui(pyautogui_command(action, screen_w, screen_h))


def pyautogui_command(action: Action, screen_w: int, screen_h: int) -> str:
    """The pyautogui call (integer pixels, Python literals only) for a GUI action."""
    xy = ""
    if action.coordinate is not None:
        xy = f"{to_pixel(action.coordinate[0], screen_w)}, {to_pixel(action.coordinate[1], screen_h)}"
    name = action.name
    if name in _PYAUTOGUI_POINTER:
        return f"pyautogui.{_PYAUTOGUI_POINTER[name]}({xy})"
    if name == "left_click_drag":
        return f"pyautogui.dragTo({xy}, duration=0.5)"
    if name == "type":
        return f"pyautogui.write({action.text!r})"
    if name == "key":
        keys = action.keys or ()
        if len(keys) == 1:
            return f"pyautogui.press({keys[0]!r})"
        return f"pyautogui.hotkey({', '.join(repr(k) for k in keys)})"
    if name in _SCROLL_ACTIONS:
        at = ""
        if action.coordinate is not None:
            px, py = xy.split(", ")
            at = f", x={px}, y={py}"
        return f"pyautogui.{name}({action.pixels}{at})"
    raise ValueError(f"{name} has no pyautogui form")
