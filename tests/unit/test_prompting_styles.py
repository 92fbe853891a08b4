"""Agent prompt styles: the elements style's listing, answers and round trips, and that the
tool-call style is today's format."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from env_client.a11y import to_xml
from env_client.actions import Action, to_pixel
from serve_apps.prompting.elements import encode_action, list_elements, parse_answer
from serve_apps.prompting.messages import privileged_messages
from serve_apps.prompting.styles import Screen, make_style

SIZE = (160, 210)
NODES = [
    {"role": "text", "name": 'Click on the "Submit" button.', "box": (0, 0, 160, 40)},
    {"role": "button", "name": "Submit", "box": (20, 80, 60, 20)},
    {"role": "textbox", "name": "", "value": "Alice", "focused": True, "box": (10, 120, 140, 20)},
    {"role": "checkbox", "name": "red", "checked": False, "box": (10, 150, 12, 12)},
]


def png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", SIZE, (255, 255, 255)).save(buf, format="PNG")
    return buf.getvalue()


def screen() -> Screen:
    return Screen(png(), to_xml(NODES, *SIZE))


def test_elements_are_numbered_with_grid_centres() -> None:
    els = list_elements(to_xml(NODES, *SIZE), SIZE)
    assert [e.index for e in els] == [0, 1, 2, 3]
    button = els[1]
    # centre (50, 90) px on a 160x210 screen → grid (315, 430), and back within one pixel
    assert (button.x, button.y) == (315, 430)
    assert abs(to_pixel(button.x, SIZE[0]) - 50) <= 1 and abs(to_pixel(button.y, SIZE[1]) - 90) <= 1


def test_prompt_lists_elements_and_privileged_block_follows_them() -> None:
    style = make_style("elements")
    messages, images = style.prompt("Click on the Submit button.", [screen()], ["click link 'x'"])
    text = messages[1]["content"][0]["text"]
    assert "1 button 'Submit' 315 430 match" in text  # the task line names it
    assert "2 textbox '' 503 621 focused value='Alice'" in text
    assert "3 checkbox 'red' 103 745 unchecked" in text
    assert "Task: Click on the Submit button." in text  # double quotes become single ones
    assert "Previous: click link 'x'" in text and len(images) == 1
    priv = privileged_messages(messages, "[GUIDE]\nclick 1")
    assert priv[1]["content"][-1]["text"].endswith("click 1\n[/PRIVILEGED_ACTION_GUIDANCE]")


@pytest.mark.parametrize(
    ("answer", "name", "field", "value"),
    [
        ("click 1", "left_click", "coordinate", (315, 430)),
        (' type "Bob" ', "type", "text", "Bob"),
        ("key enter", "key", "keys", ("enter",)),
        ("key ctrl+a", "key", "keys", ("ctrl", "a")),
    ],
)
def test_answers_parse_to_actions(answer: str, name: str, field: str, value: object) -> None:
    action = parse_answer(answer, list_elements(to_xml(NODES, *SIZE), SIZE))
    assert action.name == name and getattr(action, field) == value


@pytest.mark.parametrize(
    ("answer", "reason"),
    [("click 9", "no element 9"), ("click the button", "not an answer"), ("key nokey", "bad")],
)
def test_bad_answers_are_invalid_actions_with_a_reason(answer: str, reason: str) -> None:
    action = parse_answer(answer, list_elements(to_xml(NODES, *SIZE), SIZE))
    assert action.name == "invalid" and reason in (action.reason or "")


def test_expert_actions_round_trip_through_the_answer() -> None:
    style, s = make_style("elements"), screen()
    px, py = 50, 90  # inside the button
    click = Action(name="left_click", coordinate=(px * 1000 // 160, py * 1000 // 210))
    text = style.render(click, s)
    assert text == "click 1"
    assert style.parse(text, s).coordinate == (315, 430)
    assert style.summarize(text, s) == "click button 'Submit'"
    assert style.render(Action(name="type", text="Bob"), s) == 'type "Bob"'
    # a click on no listed element cannot be said in this style
    assert encode_action(Action(name="left_click", coordinate=(990, 990)), s.elements, SIZE) is None
    assert "1 button 'Submit' 315 430 match" in style.screen_context(s, "Click Submit.")


def test_toolcall_style_is_the_method_format() -> None:
    style, s = make_style("toolcall", history_screens=2), screen()
    messages, images = style.prompt("Do it.", [s, s, s], [])
    assert len(images) == 2 and "<tool_call>" in messages[0]["content"]
    text = style.render(Action(name="left_click", coordinate=(1, 2), thought="click it"), s)
    assert style.parse(text or "", s).coordinate == (1, 2) and style.screen_context(s, "x") == ""
    with pytest.raises(ValueError, match="allowed"):
        make_style("nope")
