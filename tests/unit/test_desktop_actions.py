"""The desktop backend's action path: pyautogui programs (whitelist + down/up) and OSWorld
computer_13 dicts, rendered to one program and parsed back to the same operations."""

from __future__ import annotations

import pytest

from env_client.commands import CommandError, KeysOp, PointerOp, ScrollOp, SleepOp, TypeOp
from env_client.desktop.computer13 import action_ops
from env_client.desktop.program import (
    HoldOp,
    osworld_execute_body,
    parse_program,
    program_of_execute,
    render_program,
)
from env_client.desktop.xinput import keysym

OPS = [
    PointerOp("click", 10, 20, button="right", clicks=2),
    PointerOp("move", 5, 6),
    PointerOp("drag", 300, 400, button="left"),
    PointerOp("click", None, None),
    TypeOp('it\'s "quoted"\nnext line'),
    KeysOp(("ctrl", "s")),
    KeysOp(("enter",), presses=3),
    ScrollOp(-3, 50, 60),
    ScrollOp(2, None, None, horizontal=True),
    SleepOp(0.5),
    HoldOp("mouse", "left", True),
    HoldOp("key", "shift", False),
]


def test_render_then_parse_gives_the_same_operations() -> None:
    assert parse_program(render_program(OPS)) == OPS


def test_osworld_execute_body_round_trips_through_the_server_parser() -> None:
    body = osworld_execute_body(render_program(OPS))
    program = program_of_execute(body["command"])
    assert program is not None and program.startswith("import pyautogui")
    assert parse_program(program) == OPS


@pytest.mark.parametrize(
    "program",
    [
        "import os; os.system('rm -rf /')",
        "pyautogui.FAILSAFE = True",
        "x = 1",
        "pyautogui.click(__import__('os').getpid(), 1)",
        "pyautogui.mouseDown(button=open('/etc/passwd').read())",
        "pyautogui.keyDown('notakey')",
        "pyautogui.mouseDown(button='left', x=3)",
        "exec('print(1)')",
        "pyautogui.screenshot('/tmp/x.png')",
    ],
)
def test_hostile_or_unknown_programs_are_refused(program: str) -> None:
    with pytest.raises(CommandError):
        parse_program(program)


def test_program_of_execute_only_takes_python_dash_c() -> None:
    assert program_of_execute(["bash", "-c", "ls"]) is None
    assert program_of_execute("python3 -c x") is None
    assert program_of_execute(["python3", "-c", "pyautogui.press('a')"]) == "pyautogui.press('a')"


@pytest.mark.parametrize(
    ("action", "ops"),
    [
        ({"type": "MOVE_TO", "payload": {"x": 1, "y": 2}}, [PointerOp("move", 1, 2)]),
        (
            {"type": "CLICK", "payload": {"button": "right", "x": 3, "y": 4, "num_clicks": 2}},
            [PointerOp("click", 3, 4, button="right", clicks=2)],
        ),
        ({"type": "CLICK", "payload": {}}, [PointerOp("click", None, None)]),
        ({"type": "MOUSE_DOWN", "payload": {}}, [HoldOp("mouse", "left", True)]),
        ({"type": "MOUSE_UP", "payload": {"button": "middle"}}, [HoldOp("mouse", "middle", False)]),
        ({"type": "RIGHT_CLICK", "payload": {"x": 5, "y": 6}}, [PointerOp("click", 5, 6, "right")]),
        ({"type": "DOUBLE_CLICK", "payload": {}}, [PointerOp("click", None, None, clicks=2)]),
        ({"type": "DRAG_TO", "payload": {"x": 7, "y": 8}}, [PointerOp("drag", 7, 8)]),
        (
            {"type": "SCROLL", "payload": {"dx": 2, "dy": -3}},
            [ScrollOp(2, None, None, horizontal=True), ScrollOp(-3, None, None)],
        ),
        ({"type": "TYPING", "payload": {"text": "hi"}}, [TypeOp("hi")]),
        ({"type": "PRESS", "payload": {"key": "Return"}}, [KeysOp(("enter",))]),
        ({"type": "KEY_DOWN", "payload": {"key": "ctrl"}}, [HoldOp("key", "ctrl", True)]),
        ({"type": "KEY_UP", "payload": {"key": "ctrl"}}, [HoldOp("key", "ctrl", False)]),
        ({"type": "HOTKEY", "payload": {"keys": ["ctrl", "c"]}}, [KeysOp(("ctrl", "c"))]),
    ],
)
def test_computer13_maps_onto_operations(action: dict, ops: list) -> None:
    got, control = action_ops({"kind": "gui", **action})
    assert control is None
    assert got == ops
    assert parse_program(render_program(got)) == got  # and executes through the same path


@pytest.mark.parametrize("typ", ["DONE", "FAIL", "WAIT"])
def test_control_actions_in_both_spellings(typ: str) -> None:
    assert action_ops({"kind": "control", "type": typ}) == ([], typ)
    assert action_ops({"kind": "gui", "type": typ, "payload": {}}) == ([], typ)


def test_pyautogui_actions_use_the_unchanged_whitelist() -> None:
    ops, _ = action_ops(
        {"kind": "gui", "type": "pyautogui", "payload": {"command": "pyautogui.click(1, 2)"}}
    )
    assert ops == [PointerOp("click", 1, 2)]
    with pytest.raises(CommandError, match="not allowed"):
        action_ops({"kind": "gui", "type": "pyautogui", "payload": {"command": "os.remove('x')"}})


@pytest.mark.parametrize(
    ("action", "message"),
    [
        ({"kind": "gui", "type": "CLICK", "payload": {"x": "1", "y": 2}}, "payload.x"),
        ({"kind": "gui", "type": "CLICK", "payload": {"x": 1}}, "payload.y"),
        ({"kind": "gui", "type": "CLICK", "payload": {"num_clicks": 0}}, "num_clicks"),
        ({"kind": "gui", "type": "MOVE_TO", "payload": {}}, "payload.x"),
        ({"kind": "gui", "type": "TYPING", "payload": {"text": ""}}, "payload.text"),
        ({"kind": "gui", "type": "PRESS", "payload": {"key": "hyperdrive"}}, "payload.key"),
        ({"kind": "gui", "type": "HOTKEY", "payload": {"keys": "ctrl+c"}}, "payload.keys"),
        ({"kind": "gui", "type": "SCROLL", "payload": {}}, "dx or payload.dy"),
        ({"kind": "gui", "type": "CLICK", "payload": {"command": "x"}}, "unknown payload"),
        ({"kind": "gui", "type": "LAUNCH_ROCKET", "payload": {}}, "is not one of"),
        ({"kind": "shell", "type": "CLICK"}, "kind"),
        ("CLICK", "JSON object"),
    ],
)
def test_bad_computer13_actions_say_what_is_wrong(action: object, message: str) -> None:
    with pytest.raises(CommandError, match=message):
        action_ops(action)


def test_keysyms_cover_the_keys_experts_and_policies_use() -> None:
    assert keysym("enter") == "Return"
    assert keysym("ctrl") == "ctrl"
    assert keysym("-") == "minus"
    assert keysym("f5") == "F5"
    assert keysym("a") == "a"
    assert keysym("launchapp1") is None  # counted as unsupported, not sent
