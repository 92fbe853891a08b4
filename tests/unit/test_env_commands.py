"""The server's pyautogui whitelist: accepted commands and their operations; rejected ones,
with nothing executed."""

from __future__ import annotations

import pytest

from env_client.commands import (
    CommandError,
    KeysOp,
    PointerOp,
    ScrollOp,
    SleepOp,
    TypeOp,
    parse_command,
)


@pytest.mark.parametrize(
    ("command", "ops"),
    [
        ("pyautogui.click(10, 20)", [PointerOp("click", 10, 20)]),
        ("pyautogui.click(x=10, y=20, button='right')", [PointerOp("click", 10, 20, "right")]),
        ("pyautogui.click((3, 4))", [PointerOp("click", 3, 4)]),
        ("pyautogui.click()", [PointerOp("click", None, None)]),
        ("pyautogui.click(1, 2, clicks=2)", [PointerOp("click", 1, 2, clicks=2)]),
        ("pyautogui.doubleClick(1, 2)", [PointerOp("click", 1, 2, clicks=2)]),
        ("pyautogui.tripleClick(1, 2)", [PointerOp("click", 1, 2, clicks=3)]),
        ("pyautogui.rightClick(1, 2)", [PointerOp("click", 1, 2, "right")]),
        ("pyautogui.middleClick(1, 2)", [PointerOp("click", 1, 2, "middle")]),
        ("pyautogui.moveTo(-1.5, 2)", [PointerOp("move", -1.5, 2)]),
        ("pyautogui.dragTo(5, 6, duration=0.5)", [PointerOp("drag", 5, 6)]),
        ("pyautogui.write('hi there')", [TypeOp("hi there")]),
        ("pyautogui.typewrite('abc', interval=0.1)", [TypeOp("abc")]),
        ("pyautogui.typewrite(['a', 'enter'])", [TypeOp("a"), KeysOp(("enter",))]),
        ("pyautogui.press('Return')", [KeysOp(("enter",))]),
        ("pyautogui.press('tab', presses=3)", [KeysOp(("tab",), presses=3)]),
        ("pyautogui.press(['tab', 'tab'])", [KeysOp(("tab",)), KeysOp(("tab",))]),
        ("pyautogui.hotkey('ctrl', 'shift', 't')", [KeysOp(("ctrl", "shift", "t"))]),
        ("pyautogui.scroll(-3)", [ScrollOp(-3, None, None)]),
        ("pyautogui.hscroll(2, x=5, y=6)", [ScrollOp(2, 5, 6, horizontal=True)]),
        (
            "import pyautogui\nimport time\npyautogui.click(1, 2); time.sleep(0.5)\n"
            "pyautogui.write('x')",
            [PointerOp("click", 1, 2), SleepOp(0.5), TypeOp("x")],
        ),
    ],
)
def test_whitelisted_commands(command, ops):
    assert parse_command(command) == ops


@pytest.mark.parametrize(
    ("command", "why"),
    [
        ("__import__('os').system('touch {marker}')", "not allowed"),
        ("import os; os.system('touch {marker}')", "only 'import pyautogui'"),
        ("exec(\"open('{marker}', 'w')\")", "not allowed"),
        ("eval('1')", "not allowed"),
        ("pyautogui.write(open('{marker}', 'w').name)", "not a literal"),
        ("pyautogui.click(__import__('os').system('touch {marker}'), 1)", "not a literal"),
        ('pyautogui.write(f\'{{open("{marker}", "w")}}\')', "not a literal"),
        ("getattr(pyautogui, 'click')(1, 2)", "not allowed"),
        ("pyautogui.__class__.__init__(1)", "not allowed"),
        ("pyautogui.screenshot('{marker}')", "not an allowed function"),
        ("import pyautogui as p; p.click(1, 2)", "only 'import pyautogui'"),
        ("from os import system", "only calls"),
        ("x = pyautogui.click(1, 2)", "only calls"),
        ("[pyautogui.click(1, 2) for _ in range(9)]", "only calls"),
        ("pyautogui.click(*[1, 2])", "*args"),
        ("pyautogui.click(**{{'x': 1, 'y': 2}})", "*args"),
        ("pyautogui.click(lambda: 0, 1)", "not a literal"),
        ("pyautogui.click(1 + 1, 2)", "not a literal"),
        ("pyautogui.click(x=1)", "both x and y"),
        ("pyautogui.click(1e999, 2)", "finite"),
        ("pyautogui.click(True, 2)", "finite"),
        ("pyautogui.click(10**9, 2)", "not a literal"),
        ("pyautogui.click(1000000, 2)", "out of range"),
        ("pyautogui.click(1, 2, clicks=1000)", "clicks"),
        ("pyautogui.click(1, 2, button='evil')", "button"),
        ("pyautogui.click(1, 2, nonsense=3)", "unexpected keyword"),
        ("pyautogui.click(1, 2, 3, 4, 5, 6, 7, 8)", "too many"),
        ("pyautogui.press('notakey')", "unknown key"),
        ("pyautogui.hotkey()", "1..8 keys"),
        ("pyautogui.write(5)", "string"),
        ("pyautogui.scroll('up')", "number"),
        ("time.sleep(3600)", "outside"),
        ("pyautogui.click(1, 2)\x00", "not valid Python"),
        ("pyautogui.click(", "not valid Python"),
        ("", "empty"),
        ("(" * 20000, "longer than"),
        ("pyautogui.click(1, 2)\n" * 30, "statements"),
    ],
)
def test_hostile_or_bad_commands_are_rejected_and_nothing_runs(tmp_path, command, why):
    marker = tmp_path / "pwned"
    with pytest.raises(CommandError, match=why.replace("*", r"\*").replace("(", r"\(")):
        parse_command(command.format(marker=marker))
    assert not marker.exists()


def test_non_string_commands_are_rejected():
    for bad in (None, 3, ["pyautogui.click(1, 2)"], {"command": "x"}):
        with pytest.raises(CommandError):
            parse_command(bad)
