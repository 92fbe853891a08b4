"""Strict parser of pyautogui command strings (the GUI ACTION payload) into typed operations.

The embedded server never executes the text: it parses it with ``ast`` and accepts only
statements of the form ``pyautogui.<whitelisted>(<literals>)`` (plus the no-op ``import
pyautogui`` / ``import time`` and a bounded ``time.sleep(s)``, which OSWorld-style commands
carry). Names, attribute chains, calls inside arguments, comprehensions, f-strings, ``*args`` and
``**kwargs`` are all rejected with a :class:`CommandError` naming what was refused. Arguments are
bound against pyautogui's own signatures, so wrong arity or unknown keywords are refused too.
"""

from __future__ import annotations

import ast
import inspect
import math
from dataclasses import dataclass, field
from typing import Any

from env_client.actions import normalize_key

MAX_COMMAND_CHARS = 10_000
MAX_STATEMENTS = 20
MAX_CLICKS = 10
MAX_SLEEP_S = 10.0
MAX_ABS_COORD = 100_000


class CommandError(ValueError):
    """A command outside the whitelist; the message says what and where."""


@dataclass
class StepInfo:
    """What happened to one step's operations (the step's ``info``), in a browser or on a
    desktop; zero counts and empty lists are left out of :meth:`as_dict`."""

    applied: int = 0
    out_of_bounds: int = 0
    ignored_after_done: int = 0
    unsupported_keys: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"applied": self.applied}
        for name in ("out_of_bounds", "ignored_after_done", "unsupported_keys"):
            if value := getattr(self, name):
                d[name] = value
        return d


@dataclass(frozen=True)
class PointerOp:
    """Move, click or drag. ``x``/``y`` None means the current pointer position."""

    kind: str  # "move" | "click" | "drag"
    x: float | None
    y: float | None
    button: str = "left"
    clicks: int = 1


@dataclass(frozen=True)
class TypeOp:
    text: str


@dataclass(frozen=True)
class KeysOp:
    """Press ``keys`` together (a hotkey) ``presses`` times; one key is a plain press."""

    keys: tuple[str, ...]
    presses: int = 1


@dataclass(frozen=True)
class ScrollOp:
    clicks: int  # + up / right, - down / left (pyautogui's sign)
    x: float | None
    y: float | None
    horizontal: bool = False


@dataclass(frozen=True)
class SleepOp:
    seconds: float


Op = PointerOp | TypeOp | KeysOp | ScrollOp | SleepOp


# pyautogui's signatures (0.9.54), trimmed to what changes the outcome; used only for binding.
def _click(x=None, y=None, clicks=1, interval=0.0, button="left", duration=0.0, tween=None):
    pass


def _click_n(x=None, y=None, interval=0.0, button="left", duration=0.0, tween=None):
    pass


def _click_b(x=None, y=None, duration=0.0, tween=None):
    pass


def _move(x=None, y=None, duration=0.0, tween=None):
    pass


def _drag(x=None, y=None, duration=0.0, tween=None, button="left", mouseDownUp=True):
    pass


def _write(message, interval=0.0):
    pass


def _press(keys, presses=1, interval=0.0):
    pass


def _hotkey(*args, interval=0.0):
    pass


def _scroll(clicks, x=None, y=None):
    pass


def _sleep(secs):
    pass


_SIGNATURES = {
    "click": _click,
    "doubleClick": _click_n,
    "tripleClick": _click_n,
    "rightClick": _click_b,
    "middleClick": _click_b,
    "moveTo": _move,
    "dragTo": _drag,
    "write": _write,
    "typewrite": _write,
    "press": _press,
    "hotkey": _hotkey,
    "scroll": _scroll,
    "hscroll": _scroll,
}
WHITELIST = frozenset(_SIGNATURES)


def parse_source(text: Any, what: str) -> ast.Module:
    """``text`` parsed (never run), or CommandError naming ``what`` when it is not a string,
    too long, or not Python."""
    if not isinstance(text, str):
        raise CommandError(f"{what} must be a string, got {type(text).__name__}")
    if len(text) > MAX_COMMAND_CHARS:
        raise CommandError(f"{what} longer than {MAX_COMMAND_CHARS} characters")
    try:
        return ast.parse(text, mode="exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise CommandError(f"{what} is not valid Python: {type(exc).__name__}: {exc}") from None


def parse_command(command: Any) -> list[Op]:
    """pyautogui command text → operations, or CommandError. Never evaluates anything."""
    tree = parse_source(command, "command")
    if not tree.body:
        raise CommandError("command is empty")
    if len(tree.body) > MAX_STATEMENTS:
        raise CommandError(f"more than {MAX_STATEMENTS} statements")
    ops: list[Op] = []
    for i, stmt in enumerate(tree.body, 1):
        ops.extend(_statement(stmt, i))
    return ops


def _statement(stmt: ast.stmt, index: int) -> list[Op]:
    where = f"statement {index}"
    if isinstance(stmt, ast.Import):
        names = [(a.name, a.asname) for a in stmt.names]
        if all(n in ("pyautogui", "time") and alias is None for n, alias in names):
            return []
        raise CommandError(f"{where}: only 'import pyautogui' / 'import time' are allowed")
    if not isinstance(stmt, ast.Expr) or not isinstance(stmt.value, ast.Call):
        raise CommandError(f"{where}: only calls of pyautogui functions are allowed")
    call = stmt.value
    module, func = _callee(call.func, where)
    if module == "time":
        seconds = _number(_bind(_sleep, call, f"{where} time.sleep")["secs"], "secs", where)
        if not 0 <= seconds <= MAX_SLEEP_S:
            raise CommandError(f"{where}: time.sleep({seconds}) outside 0..{MAX_SLEEP_S} s")
        return [SleepOp(seconds)]
    args = _bind(_SIGNATURES[func], call, f"{where} pyautogui.{func}")
    return _BUILDERS[func](func, args, f"{where} pyautogui.{func}")


def _callee(node: ast.expr, where: str) -> tuple[str, str]:
    """The (module, function) a call names; only pyautogui.<whitelist> and time.sleep pass."""
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in ("pyautogui", "time")
    ):
        module, func = node.value.id, node.attr
        if (module, func) == ("time", "sleep") or (module == "pyautogui" and func in WHITELIST):
            return module, func
        raise CommandError(f"{where}: {module}.{func} is not an allowed function")
    shown = ast.unparse(node)[:60]
    raise CommandError(f"{where}: calling {shown!r} is not allowed (only pyautogui.<function>)")


def _bind(signature_of: Any, call: ast.Call, where: str) -> dict[str, Any]:
    """Literal arguments bound to the function's parameters (defaults applied)."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(
        k.arg is None for k in call.keywords
    ):
        raise CommandError(f"{where}: *args / **kwargs are not allowed")
    args = [_literal(a, where) for a in call.args]
    kwargs = {k.arg: _literal(k.value, where) for k in call.keywords if k.arg is not None}
    try:
        bound = inspect.signature(signature_of).bind(*args, **kwargs)
    except TypeError as exc:
        raise CommandError(f"{where}: {exc}") from None
    bound.apply_defaults()
    return dict(bound.arguments)


def _literal(node: ast.expr, where: str, depth: int = 0) -> Any:
    """A plain literal: number, string, bool, None, or a short flat list/tuple of those."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float | str | bool):
        return node.value
    if isinstance(node, ast.Constant) and node.value is None:
        return None
    if (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub | ast.UAdd)
        and isinstance(node.operand, ast.Constant)
        and isinstance(node.operand.value, int | float)
        and not isinstance(node.operand.value, bool)
    ):
        value = node.operand.value
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.List | ast.Tuple) and depth == 0 and len(node.elts) <= 64:
        return [_literal(e, where, depth + 1) for e in node.elts]
    raise CommandError(f"{where}: argument {ast.unparse(node)[:60]!r} is not a literal")


def _number(v: Any, name: str, where: str, allow_none: bool = False) -> Any:
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise CommandError(f"{where}: {name}={v!r} is not a finite number")
    if abs(v) > MAX_ABS_COORD:
        raise CommandError(f"{where}: {name}={v!r} is out of range")
    return v


def _xy(args: dict[str, Any], where: str) -> tuple[Any, Any]:
    x, y = args.get("x"), args.get("y")
    if isinstance(x, list) and y is None and len(x) == 2:  # pyautogui accepts click((x, y))
        x, y = x
    x = _number(x, "x", where, allow_none=True)
    y = _number(y, "y", where, allow_none=True)
    if (x is None) != (y is None):
        raise CommandError(f"{where}: give both x and y, or neither")
    return x, y


def _button(args: dict[str, Any], where: str, default: str = "left") -> str:
    button = args.get("button", default)
    if button not in ("left", "right", "middle", "primary", "secondary"):
        raise CommandError(f"{where}: button={button!r} is not left/right/middle")
    return {"primary": "left", "secondary": "right"}.get(button, button)


def _count(v: Any, name: str, where: str, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= hi:
        raise CommandError(f"{where}: {name}={v!r} must be an integer in 0..{hi}")
    return v


def _keys(v: Any, where: str) -> tuple[str, ...]:
    raw = v if isinstance(v, list) else [v]
    if not raw or not all(isinstance(k, str) for k in raw):
        raise CommandError(f"{where}: keys must be key-name strings")
    keys = tuple(normalize_key(k) for k in raw)
    bad = [k for k, n in zip(raw, keys, strict=True) if n is None]
    if bad:
        raise CommandError(f"{where}: unknown key(s) {bad[:4]}")
    return keys  # type: ignore[return-value]


def _build_click(func: str, args: dict[str, Any], where: str) -> list[Op]:
    x, y = _xy(args, where)
    clicks = {"doubleClick": 2, "tripleClick": 3}.get(func)
    if clicks is None:
        clicks = _count(args.get("clicks", 1), "clicks", where, MAX_CLICKS)
    button = {"rightClick": "right", "middleClick": "middle"}.get(func) or _button(args, where)
    return [PointerOp("click", x, y, button=button, clicks=clicks)]


def _build_move(func: str, args: dict[str, Any], where: str) -> list[Op]:
    x, y = _xy(args, where)
    return [PointerOp("move", x, y)]


def _build_drag(func: str, args: dict[str, Any], where: str) -> list[Op]:
    x, y = _xy(args, where)
    if x is None:
        raise CommandError(f"{where}: dragTo needs x and y")
    return [PointerOp("drag", x, y, button=_button(args, where))]


def _build_write(func: str, args: dict[str, Any], where: str) -> list[Op]:
    message = args["message"]
    if isinstance(message, list):  # typewrite(['a', 'enter']) presses each key in turn
        return _each_key(message, where)
    if not isinstance(message, str):
        raise CommandError(f"{where}: message must be a string")
    return [TypeOp(message)]


def _each_key(keys: list[Any], where: str) -> list[Op]:
    return [TypeOp(k) if len(k) == 1 else KeysOp((k,)) for k in _keys(keys, where)]


def _build_press(func: str, args: dict[str, Any], where: str) -> list[Op]:
    presses = _count(args.get("presses", 1), "presses", where, MAX_CLICKS)
    keys = args["keys"]
    if isinstance(keys, list) and len(keys) != 1:  # press(['a', 'b']) presses them in turn
        return _each_key(keys, where) * presses
    return [KeysOp(_keys(keys, where), presses=presses)]


def _build_hotkey(func: str, args: dict[str, Any], where: str) -> list[Op]:
    keys = args.get("args") or ()
    if not keys or len(keys) > 8:
        raise CommandError(f"{where}: hotkey needs 1..8 keys")
    return [KeysOp(_keys(list(keys), where))]


def _build_scroll(func: str, args: dict[str, Any], where: str) -> list[Op]:
    clicks = args["clicks"]
    if isinstance(clicks, bool) or not isinstance(clicks, int | float) or not math.isfinite(clicks):
        raise CommandError(f"{where}: clicks={clicks!r} is not a number")
    if abs(clicks) > 10_000:
        raise CommandError(f"{where}: clicks={clicks!r} is out of range")
    x, y = _xy(args, where)
    return [ScrollOp(int(clicks), x, y, horizontal=func == "hscroll")]


_BUILDERS = {
    "click": _build_click,
    "doubleClick": _build_click,
    "tripleClick": _build_click,
    "rightClick": _build_click,
    "middleClick": _build_click,
    "moveTo": _build_move,
    "dragTo": _build_drag,
    "write": _build_write,
    "typewrite": _build_write,
    "press": _build_press,
    "hotkey": _build_hotkey,
    "scroll": _build_scroll,
    "hscroll": _build_scroll,
}
