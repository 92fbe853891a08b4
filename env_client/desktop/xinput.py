"""Operations → xdotool on one X display (used inside the in-desktop server).

Each operation is one short ``xdotool`` call with a fixed argument vector (no shell). Pointer
operations outside the screen are not sent (xdotool would clamp them to the edge) and are
counted as ``out_of_bounds``; keys with no X keysym (media keys and the like) are counted as
``unsupported_keys``.
"""

from __future__ import annotations

import subprocess
import time

from env_client.commands import KeysOp, PointerOp, ScrollOp, SleepOp, StepInfo, TypeOp
from env_client.desktop.program import DesktopOp, HoldOp

_BUTTONS = {"left": "1", "middle": "2", "right": "3"}
# pyautogui key name → X keysym (names not listed: a single character is its own keysym).
_KEYSYMS = {
    "enter": "Return",
    "return": "Return",
    "tab": "Tab",
    "space": "space",
    "backspace": "BackSpace",
    "delete": "Delete",
    "del": "Delete",
    "esc": "Escape",
    "escape": "Escape",
    "up": "Up",
    "down": "Down",
    "left": "Left",
    "right": "Right",
    "home": "Home",
    "end": "End",
    "pageup": "Prior",
    "pgup": "Prior",
    "pagedown": "Next",
    "pgdn": "Next",
    "insert": "Insert",
    "shift": "shift",
    "shiftleft": "Shift_L",
    "shiftright": "Shift_R",
    "ctrl": "ctrl",
    "ctrlleft": "Control_L",
    "ctrlright": "Control_R",
    "alt": "alt",
    "altleft": "Alt_L",
    "altright": "Alt_R",
    "option": "alt",
    "optionleft": "Alt_L",
    "optionright": "Alt_R",
    "win": "super",
    "winleft": "Super_L",
    "winright": "Super_R",
    "command": "super",
    "capslock": "Caps_Lock",
    "numlock": "Num_Lock",
    "scrolllock": "Scroll_Lock",
    "printscreen": "Print",
    "prtsc": "Print",
    "prtscr": "Print",
    "prntscrn": "Print",
    "print": "Print",
    "pause": "Pause",
    "apps": "Menu",
    "menu": "Menu",
    "clear": "Clear",
    "help": "Help",
    "volumeup": "XF86AudioRaiseVolume",
    "volumedown": "XF86AudioLowerVolume",
    "volumemute": "XF86AudioMute",
    "playpause": "XF86AudioPlay",
    "nexttrack": "XF86AudioNext",
    "prevtrack": "XF86AudioPrev",
    "add": "KP_Add",
    "subtract": "KP_Subtract",
    "multiply": "KP_Multiply",
    "divide": "KP_Divide",
    "decimal": "KP_Decimal",
}
_CHAR_KEYSYMS = {
    " ": "space",
    "\n": "Return",
    "\t": "Tab",
    "+": "plus",
    "-": "minus",
    ",": "comma",
    ".": "period",
    "/": "slash",
    "\\": "backslash",
    ";": "semicolon",
    "'": "apostrophe",
    "[": "bracketleft",
    "]": "bracketright",
    "=": "equal",
    "`": "grave",
}


def keysym(name: str) -> str | None:
    """The X keysym xdotool understands for a pyautogui key name; None if there is none."""
    if len(name) == 1:
        return _CHAR_KEYSYMS.get(name, name)
    if name.startswith("f") and name[1:].isdigit() and 1 <= int(name[1:]) <= 24:
        return name.upper()
    if name.startswith("num") and name[3:].isdigit():
        return f"KP_{name[3:]}"
    return _KEYSYMS.get(name)


class XInput:
    """Performs operations on ``display`` (a screen of ``width`` x ``height`` pixels)."""

    def __init__(self, env: dict[str, str], width: int, height: int, type_delay_ms: int) -> None:
        self.env = env
        self.width, self.height = width, height
        self.type_delay_ms = type_delay_ms

    def perform(self, ops: list[DesktopOp]) -> StepInfo:
        result = StepInfo()
        for op in ops:
            result.applied += int(self._apply(op, result))
        return result

    def _xdo(self, *args: str) -> None:
        subprocess.run(["xdotool", *args], env=self.env, check=True, timeout=60)

    def _inside(self, x: float | None, y: float | None) -> bool:
        if x is None or y is None:
            return True
        return 0 <= x < self.width and 0 <= y < self.height

    def _apply(self, op: DesktopOp, result: StepInfo) -> bool:
        if isinstance(op, SleepOp):
            time.sleep(op.seconds)
            return True
        if isinstance(op, TypeOp):
            self._type(op.text)
            return True
        if isinstance(op, KeysOp | HoldOp) and not self._keys_known(op, result):
            return False
        if isinstance(op, KeysOp):
            combo = "+".join(keysym(k) or k for k in op.keys)
            self._xdo("key", "--delay", "30", *([combo] * op.presses))
            return True
        if isinstance(op, HoldOp):
            return self._hold(op)
        if isinstance(op, PointerOp | ScrollOp):
            if not self._inside(op.x, op.y):
                result.out_of_bounds += 1
                return False
            return self._pointer(op) if isinstance(op, PointerOp) else self._scroll(op)
        raise TypeError(f"unknown operation {op!r}")  # pragma: no cover

    def _type(self, text: str) -> None:
        # xdotool types "\n" as a linefeed keysym that most apps ignore: line breaks and tabs
        # are sent as Return / Tab key presses between the typed chunks.
        chunk = ""
        for ch in text:
            if ch in "\n\r\t":
                if chunk:
                    self._xdo("type", "--delay", str(self.type_delay_ms), "--", chunk)
                    chunk = ""
                self._xdo("key", "Tab" if ch == "\t" else "Return")
            else:
                chunk += ch
        if chunk:
            self._xdo("type", "--delay", str(self.type_delay_ms), "--", chunk)

    def _keys_known(self, op: KeysOp | HoldOp, result: StepInfo) -> bool:
        names = op.keys if isinstance(op, KeysOp) else (op.name,) if op.device == "key" else ()
        bad = [k for k in names if keysym(k) is None]
        result.unsupported_keys.extend(bad)
        return not bad

    def _move_args(self, x: float | None, y: float | None) -> list[str]:
        return [] if x is None else ["mousemove", str(int(x)), str(int(y or 0))]

    def _pointer(self, op: PointerOp) -> bool:
        button = _BUTTONS[op.button]
        move = self._move_args(op.x, op.y)
        if op.kind == "move":
            if move:
                self._xdo(*move)
        elif op.kind == "drag":
            # Press, travel in two hops (apps need motion events to see a drag), release.
            self._xdo("mousedown", button)
            if move:
                self._xdo(*move, "sleep", "0.05", *move, "sleep", "0.05")
            self._xdo("mouseup", button)
        else:
            self._xdo(*move, "click", "--repeat", str(op.clicks), "--delay", "60", button)
        return True

    def _scroll(self, op: ScrollOp) -> bool:
        # X wheel buttons: 4 up, 5 down, 6 left, 7 right; pyautogui: + is up / right.
        button = {(True, True): "7", (True, False): "6", (False, True): "4", (False, False): "5"}[
            (op.horizontal, op.clicks > 0)
        ]
        clicks = min(abs(op.clicks), 200)
        if clicks:
            move = self._move_args(op.x, op.y)
            self._xdo(*move, "click", "--repeat", str(clicks), "--delay", "10", button)
        return True

    def _hold(self, op: HoldOp) -> bool:
        if op.device == "mouse":
            self._xdo("mousedown" if op.down else "mouseup", _BUTTONS[op.name])
        else:
            self._xdo("keydown" if op.down else "keyup", keysym(op.name) or op.name)
        return True
