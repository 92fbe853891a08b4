"""pyautogui program text ⇄ operations, for OSWorld's ``/execute`` endpoint.

The backend turns every action into whitelisted operations first (``env_client.commands``), then
renders them back as a canonical pyautogui program (:func:`render_program`) and sends that to
the desktop's ``/execute`` as ``python3 -c <program>``, exactly as OSWorld's own controller
does. A real OSWorld machine runs the program with pyautogui; our in-desktop server parses it
again with :func:`parse_program` (never ``exec``) and performs the operations with xdotool.

``parse_program`` accepts what the command whitelist accepts, unchanged, plus three things
OSWorld's programs carry: ``pyautogui.FAILSAFE = False`` (a no-op here) and the press/release
calls ``pyautogui.mouseDown/mouseUp/keyDown/keyUp`` that ``computer_13``'s MOUSE_DOWN,
MOUSE_UP, KEY_DOWN and KEY_UP need (:class:`HoldOp`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from env_client.actions import normalize_key
from env_client.commands import (
    CommandError,
    KeysOp,
    Op,
    PointerOp,
    ScrollOp,
    SleepOp,
    TypeOp,
    parse_command,
    parse_source,
)

MAX_PROGRAM_STATEMENTS = 200
_HOLD_FUNCS = {"mouseDown": ("mouse", True), "mouseUp": ("mouse", False)}
_HOLD_FUNCS |= {"keyDown": ("key", True), "keyUp": ("key", False)}


@dataclass(frozen=True)
class HoldOp:
    """Press (``down``) or release a mouse button or a key, without the other half."""

    device: str  # "mouse" | "key"
    name: str  # button (left/right/middle) or pyautogui key name
    down: bool


DesktopOp = Op | HoldOp


def parse_program(text: str) -> list[DesktopOp]:
    """A pyautogui program → operations; CommandError for anything outside the whitelist."""
    tree = parse_source(text, "program")
    if len(tree.body) > MAX_PROGRAM_STATEMENTS:
        raise CommandError(f"program has more than {MAX_PROGRAM_STATEMENTS} statements")
    ops: list[DesktopOp] = []
    for i, stmt in enumerate(tree.body, 1):
        if _is_failsafe_off(stmt):
            continue
        hold = _hold(stmt, i)
        if hold is not None:
            ops.append(hold)
            continue
        # Everything else goes through the whitelist parser unchanged, one statement at a time.
        ops.extend(parse_command(ast.unparse(stmt)))
    return ops


def _is_failsafe_off(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Assign)
        and len(stmt.targets) == 1
        and ast.unparse(stmt.targets[0]) == "pyautogui.FAILSAFE"
        and isinstance(stmt.value, ast.Constant)
        and stmt.value.value is False
    )


def _hold(stmt: ast.stmt, index: int) -> HoldOp | None:
    """A mouseDown/mouseUp/keyDown/keyUp statement, or None for any other statement."""
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return None
    func = stmt.value.func
    if not (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id == "pyautogui"
        and func.attr in _HOLD_FUNCS
    ):
        return None
    where = f"statement {index} pyautogui.{func.attr}"
    device, down = _HOLD_FUNCS[func.attr]
    call = stmt.value
    if any(isinstance(a, ast.Starred) for a in call.args) or len(call.args) > 1:
        raise CommandError(f"{where}: takes one literal argument")
    kwargs = {k.arg: k.value for k in call.keywords}
    want = "button" if device == "mouse" else "key"
    if set(kwargs) - {want} or (call.args and kwargs):
        raise CommandError(f"{where}: only the argument {want!r} is allowed")
    node = call.args[0] if call.args else kwargs.get(want)
    value = "left" if node is None and device == "mouse" else _string(node, where)
    return HoldOp(device, _hold_name(device, value, where), down)


def _string(node: ast.expr | None, where: str) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    shown = ast.unparse(node)[:60] if node is not None else "nothing"
    raise CommandError(f"{where}: argument {shown!r} is not a string literal")


def _hold_name(device: str, value: str, where: str) -> str:
    if device == "mouse":
        if value not in ("left", "right", "middle"):
            raise CommandError(f"{where}: button={value!r} is not left/right/middle")
        return value
    key = normalize_key(value)
    if key is None:
        raise CommandError(f"{where}: unknown key {value!r}")
    return key


def render_program(ops: list[DesktopOp]) -> str:
    """Operations → one canonical pyautogui program (the inverse of :func:`parse_program`)."""
    return "\n".join(render_op(op) for op in ops)


def render_op(op: DesktopOp) -> str:
    """One operation as one pyautogui statement (integer pixels, literals only)."""
    if isinstance(op, PointerOp):
        return _render_pointer(op)
    if isinstance(op, TypeOp):
        return f"pyautogui.write({op.text!r})"
    if isinstance(op, KeysOp):
        if len(op.keys) == 1:
            return f"pyautogui.press({op.keys[0]!r}, presses={op.presses})"
        return "\n".join([f"pyautogui.hotkey({', '.join(map(repr, op.keys))})"] * op.presses)
    if isinstance(op, ScrollOp):
        at = "" if op.x is None else f", x={_px(op.x)}, y={_px(op.y)}"
        return f"pyautogui.{'hscroll' if op.horizontal else 'scroll'}({op.clicks}{at})"
    if isinstance(op, SleepOp):
        return f"time.sleep({op.seconds!r})"
    if isinstance(op, HoldOp):
        func = {("mouse", True): "mouseDown", ("mouse", False): "mouseUp"}
        func |= {("key", True): "keyDown", ("key", False): "keyUp"}
        arg = "button" if op.device == "mouse" else "key"
        return f"pyautogui.{func[(op.device, op.down)]}({arg}={op.name!r})"
    raise TypeError(f"unknown operation {op!r}")


def _px(v: float | None) -> int:
    return int(v) if v is not None else 0


def _render_pointer(op: PointerOp) -> str:
    xy = "" if op.x is None else f"{_px(op.x)}, {_px(op.y)}"
    sep = ", " if xy else ""
    if op.kind == "move":
        return f"pyautogui.moveTo({xy})"
    if op.kind == "drag":
        return f"pyautogui.dragTo({xy}{sep}button={op.button!r})"
    return f"pyautogui.click({xy}{sep}clicks={op.clicks}, button={op.button!r})"


def osworld_execute_body(program: str) -> dict[str, object]:
    """The ``/execute`` body OSWorld's controller sends for a pyautogui program."""
    prefix = "import pyautogui; import time; pyautogui.FAILSAFE = False\n"
    return {"command": ["python3", "-c", prefix + program], "shell": False}


def program_of_execute(command: object) -> str | None:
    """The program of an ``/execute`` body that runs Python with ``-c``, else None."""
    if (
        isinstance(command, list)
        and len(command) == 3
        and command[0] in ("python", "python3")
        and command[1] == "-c"
        and isinstance(command[2], str)
    ):
        return command[2]
    return None
