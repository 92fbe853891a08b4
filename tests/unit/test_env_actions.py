"""The action model: policy response parsing (valid, malformed, hostile), coordinate scaling,
rendering back to text, and the wire ACTION dicts."""

from __future__ import annotations

import json
import random

import pytest

from env_client.actions import (
    Action,
    normalize_key,
    parse_response,
    render_response,
    to_pixel,
    to_protocol,
    to_relative,
)
from env_client.commands import KeysOp, PointerOp, ScrollOp, TypeOp, parse_command


def _resp(arguments: dict, thought: str = "do it.") -> str:
    call = {"name": "computer_use", "arguments": arguments}
    return f"Action: {thought}\n<tool_call>{json.dumps(call)}</tool_call>"


def test_parses_the_method_example():
    text = (
        'Action: click the "OK" button to confirm.\n'
        '<tool_call>{"name": "computer_use", "arguments": {"action": "left_click", '
        '"coordinate": [512, 380]}}</tool_call>'
    )
    a = parse_response(text)
    assert a.name == "left_click"
    assert a.coordinate == (512, 380)
    assert a.thought == 'click the "OK" button to confirm.'
    assert render_response(a) == text


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"action": "left_click", "coordinate": [0, 0]}, "pyautogui.click(0, 0)"),
        ({"action": "left_click", "coordinate": [999, 999]}, "pyautogui.click(159, 209)"),
        ({"action": "right_click", "coordinate": [500, 500]}, "pyautogui.rightClick(80, 105)"),
        ({"action": "middle_click", "coordinate": [500, 500]}, "pyautogui.middleClick(80, 105)"),
        ({"action": "double_click", "coordinate": [500, 500]}, "pyautogui.doubleClick(80, 105)"),
        ({"action": "triple_click", "coordinate": [500, 500]}, "pyautogui.tripleClick(80, 105)"),
        ({"action": "mouse_move", "coordinate": [250, 750]}, "pyautogui.moveTo(40, 157)"),
        (
            {"action": "left_click_drag", "coordinate": [500, 500]},
            "pyautogui.dragTo(80, 105, duration=0.5)",
        ),
        ({"action": "type", "text": "hello"}, "pyautogui.write('hello')"),
        ({"action": "key", "keys": ["Return"]}, "pyautogui.press('enter')"),
        ({"action": "key", "keys": ["Control", "a"]}, "pyautogui.hotkey('ctrl', 'a')"),
        ({"action": "key", "keys": "ctrl+c"}, "pyautogui.hotkey('ctrl', 'c')"),
        ({"action": "scroll", "pixels": -5}, "pyautogui.scroll(-5)"),
        (
            {"action": "scroll", "pixels": 3, "coordinate": [500, 500]},
            "pyautogui.scroll(3, x=80, y=105)",
        ),
        ({"action": "hscroll", "pixels": 2}, "pyautogui.hscroll(2)"),
    ],
)
def test_gui_actions_become_pyautogui_commands(arguments, expected):
    a = parse_response(_resp(arguments))
    assert a.is_valid, a.reason
    wire = to_protocol(a, 160, 210)
    assert wire == {"kind": "gui", "type": "pyautogui", "payload": {"command": expected}}
    assert parse_command(expected)  # the server's whitelist accepts every command we emit


@pytest.mark.parametrize(
    ("arguments", "control"),
    [
        ({"action": "terminate", "status": "success"}, "DONE"),
        ({"action": "terminate", "status": "failure"}, "FAIL"),
        ({"action": "wait", "time": 2}, "WAIT"),
        ({"action": "wait"}, "WAIT"),
    ],
)
def test_control_actions(arguments, control):
    a = parse_response(_resp(arguments))
    assert to_protocol(a, 160, 210) == {"kind": "control", "type": control, "payload": {}}


def test_reasoning_of_thinking_models_is_skipped():
    answer = _resp({"action": "left_click", "coordinate": [10, 20]}, thought="click OK.")
    decoy = _resp({"action": "type", "text": "no"}, thought="not this.")
    for text in (
        f"<think>maybe\n{decoy}</think>\n{answer}",
        f"I think…\n{decoy}\n</think>{answer}",
    ):
        a = parse_response(text)
        assert (a.name, a.coordinate, a.thought) == ("left_click", (10, 20), "click OK.")
        assert a.pixel(160, 210) == (1, 4)


def test_float_coordinates_are_rounded_and_thought_is_optional():
    a = parse_response(
        '<tool_call>{"name": "computer_use", "arguments": '
        '{"action": "left_click", "coordinate": [10.4, 20.6]}}</tool_call>'
    )
    assert a.coordinate == (10, 21)
    assert a.thought == ""


@pytest.mark.parametrize(
    ("text", "reason_part"),
    [
        ("", "no <tool_call>"),
        ("Action: click somewhere.", "no <tool_call>"),
        ("<tool_call>{not json}</tool_call>", "not JSON"),
        ("<tool_call>[1, 2]</tool_call>", "computer_use"),
        ('<tool_call>{"name": "shell", "arguments": {}}</tool_call>', "computer_use"),
        ('<tool_call>{"name": "computer_use", "arguments": 3}</tool_call>', "arguments"),
        (_resp({"action": "fly"}), "unknown action"),
        (_resp({"action": "invalid"}), "unknown action"),
        (_resp({"action": "left_click"}), "needs a coordinate"),
        (_resp({"action": "left_click", "coordinate": [1000, 5]}), "outside"),
        (_resp({"action": "left_click", "coordinate": [-1, 5]}), "outside"),
        (_resp({"action": "left_click", "coordinate": [1, 2, 3]}), "[x, y]"),
        (_resp({"action": "left_click", "coordinate": [True, 2]}), "two numbers"),
        (_resp({"action": "left_click", "coordinate": ["1", "2"]}), "two numbers"),
        (_resp({"action": "type"}), "non-empty text"),
        (_resp({"action": "type", "text": 5}), "string"),
        (_resp({"action": "type", "text": "x" * 5000}), "text"),
        (_resp({"action": "key", "keys": ["notakey"]}), "unknown key"),
        (_resp({"action": "key", "keys": []}), "1..8 keys"),
        (_resp({"action": "scroll"}), "pixels"),
        (_resp({"action": "scroll", "pixels": 10**9}), "pixels"),
        (_resp({"action": "terminate", "status": "maybe"}), "status"),
        (_resp({"action": "wait", "time": -1}), "time"),
        (_resp({"action": "left_click", "coordinate": [1, 1]}) * 2, "2 tool calls"),
    ],
)
def test_malformed_responses_become_invalid_actions(text, reason_part):
    a = parse_response(text)
    assert a.name == "invalid"
    assert reason_part in (a.reason or ""), a.reason
    assert to_protocol(a, 160, 210) is None  # nothing is sent for an invalid action
    with pytest.raises(ValueError):
        render_response(a)


def test_hostile_inputs_never_raise():
    rng = random.Random(0)
    hostile = [
        None,
        123,
        b"bytes",
        "<tool_call>" + "[" * 100_000 + "</tool_call>",
        "<tool_call>" + '{"a":' * 5000 + "1" + "}" * 5000 + "</tool_call>",
        "x" * 1_000_000,
        "<tool_call>\x00\x01\x02</tool_call>",
        "<tool_call>"
        + json.dumps({"name": "computer_use", "arguments": {"action": ["left_click"]}})
        + "</tool_call>",
        "".join(chr(rng.randrange(0, 0x3000)) for _ in range(5000)),
    ]
    for text in hostile:
        a = parse_response(text)  # type: ignore[arg-type]
        assert a.name == "invalid" and a.reason


def test_injection_in_typed_text_stays_a_string_literal():
    payload = "'); __import__('os').system('touch /tmp/pwned'); ('\n\"\\"
    a = parse_response(_resp({"action": "type", "text": payload}))
    command = to_protocol(a, 160, 210)["payload"]["command"]  # type: ignore[index]
    assert parse_command(command) == [TypeOp(payload)]


def test_render_parse_round_trip():
    actions = [
        Action(name="left_click", coordinate=(1, 998), thought="Click it."),
        Action(name="type", text='say "hi"\n', thought="Type."),
        Action(name="key", keys=("ctrl", "shift", "t")),
        Action(name="scroll", pixels=-3, coordinate=(500, 500)),
        Action(name="wait", time=1.5),
        Action(name="terminate", status="failure"),
    ]
    for a in actions:
        back = parse_response(render_response(a))
        assert back.model_dump(exclude={"thought"}) == a.model_dump(exclude={"thought"})
        assert back.thought  # a sentence is generated when the action has none


def test_relative_pixel_round_trip_is_exact_below_1000_pixels():
    for size in (160, 210, 320, 999):
        for px in range(size):
            assert to_pixel(to_relative(px, size), size) == px
    assert to_pixel(0, 1920) == 0 and to_pixel(999, 1920) == 1919
    assert to_relative(-5, 160) == 0 and to_relative(10_000, 160) == 999


def test_key_normalization():
    assert normalize_key("Return") == "enter"
    assert normalize_key("ESCAPE") == "esc"
    assert normalize_key("A") == "A"
    assert normalize_key("F5") == "f5"
    assert normalize_key("\x0b") is None
    assert normalize_key("rm -rf") is None


def test_emitted_commands_parse_to_the_intended_operations():
    a = parse_response(_resp({"action": "double_click", "coordinate": [500, 500]}))
    assert parse_command(to_protocol(a, 320, 420)["payload"]["command"]) == [  # type: ignore[index]
        PointerOp("click", 160, 210, clicks=2)
    ]
    a = parse_response(_resp({"action": "key", "keys": ["ctrl", "a"]}))
    assert parse_command(to_protocol(a, 160, 210)["payload"]["command"]) == [  # type: ignore[index]
        KeysOp(("ctrl", "a"))
    ]
    a = parse_response(_resp({"action": "hscroll", "pixels": -2, "coordinate": [0, 0]}))
    assert parse_command(to_protocol(a, 160, 210)["payload"]["command"]) == [  # type: ignore[index]
        ScrollOp(-2, 0, 0, horizontal=True)
    ]
