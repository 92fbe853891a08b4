"""The reference agents' prompt styles (qwen3vl, evocua): prompts rendered through a real Qwen
chat template against golden files, and their answer parsers on reference-format responses.

Regenerate the golden files after an intended prompt change (then read the diff):

    UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit/test_reference_styles.py
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from env_client.actions import Action, invalid, to_pixel, to_protocol
from serve_apps.config import PolicyAppConfig, VLLMBackendConfig
from serve_apps.prompting import evocua, qwen3vl
from serve_apps.prompting.evocua import SYSTEM_PROMPT as EVOCUA_SYSTEM
from serve_apps.prompting.inputs import PromptEncoder
from serve_apps.prompting.messages import privileged_messages
from serve_apps.prompting.qwen3vl import SYSTEM_PROMPT as QWEN_SYSTEM
from serve_apps.prompting.styles import STYLES, EvoCUAStyle, Qwen3VLStyle, Screen, make_style

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
SIZE = (1920, 1080)
INSTRUCTION = "Save the open document as report.odt on the Desktop."

# A Qwen3-VL-8B-Thinking episode: its responses start inside the <think> block that the chat
# template's generation prompt opens, so they carry a closing </think> but no opening one.
QWEN_RESPONSES = [
    "The document is open in LibreOffice Writer. To save it under a new name I need the File "
    'menu.\n</think>\n\nAction: Click the "File" menu in the menu bar.\n<tool_call>\n'
    '{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [18, 52]}}\n'
    "</tool_call>",
    "The File menu is open; Save As is the entry I want.\n</think>\n\nAction: Choose "
    '"Save As..." in the File menu.\n<tool_call>\n{"name": "computer_use", "arguments": '
    '{"action": "left_click", "coordinate": [64, 318]}}\n</tool_call>',
    "The Save As dialog shows a Name field with the text selected.\n</think>\n\nAction: Type "
    'the new file name.\n<tool_call>\n{"name": "computer_use", "arguments": {"action": "type", '
    '"text": "report.odt"}}\n</tool_call>',
]

# EvoCUA answers without reasoning; its S2 parser also reads the one-line tag layout.
EVOCUA_RESPONSES = [
    'Action: Open the "File" menu.\n<tool_call>\n{"name": "computer_use", "arguments": '
    '{"action": "left_click", "coordinate": [18, 52]}}\n</tool_call>',
    'Action: Click "Save As...".\n<tool_call>{"name": "computer_use", "arguments": {"action": '
    '"left_click", "coordinate": [64, 318]}}</tool_call>',
    'Action: Type the file name.\n<tool_call>\n{"name": "computer_use", "arguments": {"action": '
    '"type", "text": "report.odt"}}\n</tool_call>',
]


@pytest.fixture(scope="module")
def encoder(tiny_policy_path: Path) -> PromptEncoder:
    return PromptEncoder.from_pretrained(tiny_policy_path)


def screens(n: int) -> list[Screen]:
    # Distinct bytes per screen, so the image order can be checked; never decoded here.
    return [Screen(f"png-{i}".encode(), size_hint=SIZE) for i in range(n)]


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), f"{name} changed; see the module docstring"


# ---- prompts ---------------------------------------------------------------------------------


def test_qwen3vl_prompt_matches_golden(encoder: PromptEncoder) -> None:
    style = make_style("qwen3vl", history_screens=3)
    shots = screens(4)
    messages, images = style.prompt(INSTRUCTION, shots, QWEN_RESPONSES)
    # H=3: two earlier steps replayed, then the current screen with the instruction.
    assert images == [s.png for s in shots[1:]]
    assert [m["role"] for m in messages] == ["system", *["user", "assistant"] * 2, "user"]
    assert messages[2]["content"][0]["text"] == QWEN_RESPONSES[1]  # the full response
    check_golden("qwen3vl_prompt_3_steps.txt", encoder.render(messages))


def test_evocua_prompt_matches_golden(encoder: PromptEncoder) -> None:
    style = make_style("evocua", history_screens=4)
    shots = screens(4)
    messages, images = style.prompt(INSTRUCTION, shots, EVOCUA_RESPONSES)
    # H=4: three earlier steps replayed; the instruction rides on the oldest one.
    assert images == [s.png for s in shots]
    assert [m["role"] for m in messages] == ["system", *["user", "assistant"] * 3, "user"]
    assert messages[1]["content"][1]["text"].endswith("Previous actions:\nNone")
    assert messages[-1]["content"] == [{"type": "image"}]
    check_golden("evocua_prompt_3_steps.txt", encoder.render(messages))


def test_first_step_has_one_user_turn_with_no_previous_actions() -> None:
    for name in ("qwen3vl", "evocua"):
        messages, images = make_style(name).prompt("Do it.", screens(1), [])
        assert [m["role"] for m in messages] == ["system", "user"] and len(images) == 1
        image, text = messages[1]["content"]
        assert image == {"type": "image"}
        assert text["text"].endswith("Instruction: Do it.\n\nPrevious actions:\nNone")


def test_older_steps_survive_only_in_the_previous_actions_list() -> None:
    enter = call('{"action": "key", "keys": ["enter"]}')
    history = [*QWEN_RESPONSES, f"Action: Press Enter.\n{enter}"]
    messages, images = make_style("qwen3vl", 3).prompt("x", screens(5), history)
    assert len(images) == 3 and len(messages) == 6
    listing = messages[-1]["content"][1]["text"].split("Previous actions:\n")[1]
    assert listing.splitlines() == [
        'Step 1: Click the "File" menu in the menu bar.',
        'Step 2: Choose "Save As..." in the File menu.',
        "Step 3: Type the new file name.",
        "Step 4: Press Enter.",
    ]
    messages, _ = make_style("evocua", 4).prompt("x", screens(5), history)
    first_text = messages[1]["content"][1]["text"]  # only the step before the replayed three
    assert first_text.endswith('Previous actions:\nStep 1: Click the "File" menu in the menu bar.')


def test_previous_action_wording_follows_the_reference() -> None:
    call = '<tool_call>\n{"name": "computer_use", "arguments": {"action": "wait"}}\n</tool_call>'
    qwen, evo = Qwen3VLStyle(), EvoCUAStyle()
    assert qwen.previous_actions([call, "I am not sure.", "action:   Scroll down. "]) == [
        "Execute the tool call",
        "Execute action",
        "Scroll down.",
    ]
    assert evo.previous_actions([call]) == ["Execute the computer action"]


def test_privileged_guidance_goes_after_the_current_screen() -> None:
    messages, _ = make_style("evocua").prompt("x", screens(3), EVOCUA_RESPONSES[:2])
    priv = privileged_messages(messages, "[GUIDE]\nclick Save")
    assert priv[-1]["content"][0] == {"type": "image"}
    assert priv[-1]["content"][-1]["text"].startswith("\n\n[PRIVILEGED_ACTION_GUIDANCE]")
    assert messages[-1]["content"] == [{"type": "image"}]  # the input is left alone


def test_too_few_screens_for_the_history_is_an_error() -> None:
    with pytest.raises(ValueError, match="need 3 screens"):
        make_style("qwen3vl", 3).prompt("x", screens(2), QWEN_RESPONSES)


def test_system_prompts_hold_each_familys_schema() -> None:
    assert QWEN_SYSTEM.startswith("# Tools\n\nYou may call one or more functions")
    assert QWEN_SYSTEM.endswith("- If finishing, use action=terminate in the tool call.")
    assert "The screen's resolution is 1000x1000." in QWEN_SYSTEM
    assert '"hscroll"' in QWEN_SYSTEM and '"key_down"' not in QWEN_SYSTEM
    assert (
        '"key_down", "key_up"]' in EVOCUA_SYSTEM and "E.g. if you click on Firefox" in EVOCUA_SYSTEM
    )
    assert "You do not have access to a terminal" not in EVOCUA_SYSTEM


# ---- answers ---------------------------------------------------------------------------------


def call(args: str) -> str:
    return f'<tool_call>\n{{"name": "computer_use", "arguments": {args}}}\n</tool_call>'


VALID = [
    # (response, expected fields); both families read these the same way
    (QWEN_RESPONSES[0], {"name": "left_click", "coordinate": (18, 52)}),
    (EVOCUA_RESPONSES[1], {"name": "left_click", "coordinate": (64, 318)}),
    (
        "Action: Copy the cell.\n" + call('{"action": "key", "keys": ["Control_L", "c"]}'),
        {"name": "key", "keys": ("ctrl", "c")},
    ),
    (call('{"action": "key", "keys": "ctrl+shift+t"}'), {"keys": ("ctrl", "shift", "t")}),
    (call('{"action": "type", "text": "hello\\nworld"}'), {"text": "hello\nworld"}),
    (call('{"action": "scroll", "pixels": -5}'), {"name": "scroll", "pixels": -5}),
    (
        call('{"action": "scroll", "coordinate": [500, 500], "pixels": 3}'),
        {"coordinate": (500, 500), "pixels": 3},
    ),
    (call('{"action": "terminate"}'), {"name": "terminate", "status": "success"}),
    (call('{"action": "terminate", "status": "FAILURE"}'), {"status": "failure"}),
    (call('{"action": "wait", "time": 2}'), {"name": "wait", "time": 2.0}),
    (call('{"action": "left_click_drag", "coordinate": [999.4, "12"]}'), {"coordinate": (999, 12)}),
    (call('{"action": "double_click", "coordinate": [1000, 0]}'), {"coordinate": (999, 0)}),
    (call('{"action": "mouse_move", "coordinate": [3, 4], "keys": []}'), {"name": "mouse_move"}),
    # the closing tag lost at the stop token; no tags at all (bare JSON line)
    ('Action: Wait.\n<tool_call>\n{"name": "computer_use", "arguments": {"action": "wait"}}', {}),
    ('Action: Wait.\n{"name": "computer_use", "arguments": {"action": "wait"}}', {"name": "wait"}),
    # long reasoning is not held against the answer's length limit
    ("hmm " * 20_000 + "</think>\n" + EVOCUA_RESPONSES[2], {"text": "report.odt"}),
    # reasoning that mentions its own "Action:" and a tool call is not the answer
    (
        "Maybe Action: right click?\n<tool_call>x</tool_call>\n</think>\nAction: Click OK.\n"
        + call('{"action": "left_click", "coordinate": [1, 2]}'),
        {"thought": "Click OK.", "coordinate": (1, 2)},
    ),
]

INVALID = [
    # (response, words of the reason)
    ("", "no tool call"),
    ("Action: Click the OK button.", "no tool call"),
    (EVOCUA_RESPONSES[0] + "\n" + EVOCUA_RESPONSES[2], "2 tool calls"),
    ("<tool_call>\n{'name': 'computer_use'}\n</tool_call>", "not JSON"),
    ('<tool_call>{"name": "computer_use", "arguments": {"action": "left_', "not JSON"),
    ('<tool_call>{"name": "browser", "arguments": {}}</tool_call>', "computer_use"),
    ('<tool_call>{"name": "computer_use", "arguments": "click"}</tool_call>', "object"),
    (call('{"action": "fly"}'), "unknown action"),
    (call('{"action": "invalid"}'), "unknown action"),
    (call('{"action": "left_click"}'), "needs a coordinate"),
    (call('{"action": "left_click", "coordinate": [1200, 40]}'), "outside"),
    (call('{"action": "left_click", "coordinate": [10]}'), "[x, y]"),
    (call('{"action": "right_click", "coordinate": ["a", 2]}'), "two numbers"),
    (call('{"action": "key", "keys": ["hyper"]}'), "unknown key"),
    (call('{"action": "key"}'), "key needs"),
    (call('{"action": "type", "text": ""}'), "non-empty"),
    (call('{"action": "terminate", "status": "done"}'), "success"),
    (call('{"action": "scroll", "pixels": "lots"}'), "number"),
    ("[1, 2, 3]\n{not json}", "no tool call"),
    (None, "not text"),
    ("x" * 70_000, "longer"),
]


@pytest.mark.parametrize("name", ["qwen3vl", "evocua"])
@pytest.mark.parametrize(("response", "expected"), VALID)
def test_reference_responses_parse(name: str, response: str, expected: dict) -> None:
    action = make_style(name).parse(response, screens(1)[0])
    assert action.is_valid, action.reason
    for key, value in expected.items():
        assert getattr(action, key) == value


@pytest.mark.parametrize("name", ["qwen3vl", "evocua"])
@pytest.mark.parametrize(("response", "reason"), INVALID)
def test_malformed_responses_are_invalid_actions(name: str, response: str, reason: str) -> None:
    action = make_style(name).parse(response, screens(1)[0])
    assert action.name == "invalid" and reason in (action.reason or ""), action.reason


def test_dialects_differ_where_the_reference_parsers_do() -> None:
    click = call('{"action": "click", "coordinate": [5, 6]}')
    hold = call('{"action": "key_down", "keys": ["shift"]}')
    evo, qwen = make_style("evocua"), make_style("qwen3vl")
    s = screens(1)[0]
    assert evo.parse(click, s).name == "left_click" and qwen.parse(click, s).name == "invalid"
    assert "no equivalent" in (evo.parse(hold, s).reason or "")
    assert "unknown action" in (qwen.parse(hold, s).reason or "")


def test_parsers_never_raise_on_mangled_responses() -> None:
    rng = random.Random(0)
    pieces = [*QWEN_RESPONSES, *EVOCUA_RESPONSES, "<tool_call>", "</tool_call>", "</think>", "{"]
    for _ in range(300):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 3)))
        text = text[: rng.randint(0, len(text))] if rng.random() < 0.5 else text
        for name in ("qwen3vl", "evocua"):
            action = make_style(name).parse(text, screens(1)[0])
            assert isinstance(action, Action)


def test_grid_coordinates_reach_the_screen_as_the_reference_scales_them() -> None:
    action = make_style("qwen3vl").parse(QWEN_RESPONSES[1], screens(1)[0])
    assert to_protocol(action, *SIZE) == {
        "kind": "gui",
        "type": "pyautogui",
        "payload": {"command": "pyautogui.click(123, 343)"},
    }
    for c in (0, 1, 18, 64, 318, 500, 998, 999):  # reference: int(c * size / 999)
        for size in SIZE:
            assert abs(to_pixel(c, size) - int(c * size / 999)) <= 1


def test_rendered_actions_round_trip_and_history_keeps_full_responses() -> None:
    s = screens(1)[0]
    actions = [
        Action(name="left_click", coordinate=(18, 52), thought='Click "File".'),
        Action(name="type", text="report.odt"),
        Action(name="key", keys=("ctrl", "s")),
        Action(name="scroll", pixels=-3),
        Action(name="terminate", status="failure"),
    ]
    for name in ("qwen3vl", "evocua"):
        style = make_style(name)
        for action in actions:
            text = style.render(action, s) or ""
            assert "\n<tool_call>\n{" in text and text.endswith("}\n</tool_call>")
            parsed = style.parse(text, s)
            assert parsed.model_dump(exclude={"thought"}) == action.model_dump(exclude={"thought"})
            assert style.summarize(text, s) == text and style.screen_context(s, "x") == ""
        assert style.render(invalid("bad"), s) is None


def test_registry_and_config_know_the_four_styles() -> None:
    assert STYLES == ("toolcall", "elements", "qwen3vl", "evocua")
    for name in STYLES:
        assert make_style(name).name == name
        assert PolicyAppConfig(model_path="/ckpt", agent_style=name).agent_style == name
    assert make_style("evocua") == EvoCUAStyle(history_screens=4)
    assert make_style("qwen3vl", 2) == Qwen3VLStyle(history_screens=2)


@pytest.mark.parametrize(
    ("config", "family"), [("production_qwen3vl", qwen3vl), ("production_evocua", evocua)]
)
def test_production_configs_prompt_as_the_reference(
    config: str, family: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workflows.common.config_io import load_config
    from workflows.online_rl.config import OnlineRLConfig

    for k in ("HF_CKPT", "ANALYZER_MODEL_PATH", "GUI_TEST_CONFIG_BASE_DIR"):
        monkeypatch.setenv(k, "/ckpt")
    monkeypatch.setenv("GUI_ENV_SERVER_URL", "http://env:8000")
    cfg = load_config(OnlineRLConfig, config)
    policy = cfg.policy
    style = make_style(policy.agent_style, cfg.rollout.history_screens)
    assert style == make_style(style.name)  # the family's reference history length
    backend = policy.backend
    assert isinstance(backend, VLLMBackendConfig)
    assert cfg.rollout.history_screens <= backend.max_images_per_prompt
    new_tokens = policy.sampling.max_new_tokens
    assert new_tokens == (evocua.MAX_NEW_TOKENS if family is evocua else 1024)
    assert policy.max_prompt_tokens + new_tokens <= backend.max_model_len
