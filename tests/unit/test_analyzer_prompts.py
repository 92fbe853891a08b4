"""The analyzer's request styles: compact and minimal (frozen: analyzers are trained on them,
byte for byte; the warm start's on minimal), the reference one (history screenshots with the
policy's full earlier responses, as the reference analyzer), and the check that a trained
analyzer is served the style it learnt."""

from __future__ import annotations

import json

import pytest

from serve_apps.analyzer import HistoryTransition
from serve_apps.config import AnalyzerAppConfig
from serve_apps.prompting.analyzer import (
    TRAINING_INFO,
    action_line,
    analyzer_messages,
    minimal_analyzer_messages,
    reference_analyzer_messages,
    trained_prompt_mismatch,
    transition_messages,
)

ACTION = '{"action": "left_click"}'


def test_compact_prompt_is_unchanged() -> None:
    messages, images = analyzer_messages(
        "Click OK", ["typed hello"], "B", "resp", ACTION, "A", full=False, context="1 button OK"
    )
    assert images == ["B", "A"]
    assert messages == [
        {
            "role": "system",
            "content": "Judge one step of a computer-use agent from the screens before and "
            'after it. Answer JSON only: {"consistency": 0 or 1, "effectiveness": 0 or 1, '
            '"guide": "...", "avoid": "..."}',
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "text",
                    "text": "Task: Click OK\nPrevious actions:\n1. typed hello\nElements before "
                    "the step:\n1 button OK\nScreen before the step:",
                },
                {"type": "image"},
                {
                    "type": "text",
                    "text": f"\nAgent response:\nresp\nExecuted action: {ACTION}\n"
                    "Screen after the step:",
                },
                {"type": "image"},
                {"type": "text", "text": "\nJudgment (JSON only):"},
            ],
        },
    ]


def test_reference_prompt_shows_history_screens_with_full_responses() -> None:
    earlier = ["Action: open the menu.\n<tool_call>{...}</tool_call>", "Action: pick Save."]
    messages, images = reference_analyzer_messages(
        "Save the file", ["H1", "H2"], earlier, "B", "Action: click OK.", ACTION, "A"
    )
    assert images == ["H1", "H2", "B", "A"]
    parts = messages[1]["content"]
    assert [p["type"] for p in parts] == ["text", "image", "text", "image"] * 2 + ["text"]
    text = "".join(p.get("text", "<img>") for p in parts)
    assert (
        text.index("Step 1 observation:\n<img>")
        < text.index(earlier[0])
        < text.index("Step 2 observation:\n<img>")
    )
    assert f"Step 2 student response:\n{earlier[1]}" in text
    assert "Current observation before the evaluated action:\n<img>" in text
    assert "Student response to evaluate:\nAction: click OK.\n\nExecuted environment action" in text
    assert text.endswith(
        "Post-action observation:\n<img>\n\nEvaluate only the student response above."
    )
    system = messages[0]["content"]
    assert all(f'"{f}"' in system for f in ("consistency", "effectiveness", "guide", "avoid"))
    assert "BEFORE the action" in system  # guide/avoid are advice from the pre-action context


def test_reference_prompt_without_history() -> None:
    messages, images = reference_analyzer_messages("t", [], [], "B", "r", "{}", "A")
    assert images == ["B", "A"]
    assert "Previous interaction history:\nNone\n" in messages[1]["content"][0]["text"]
    with pytest.raises(ValueError, match="1 history screenshots but 0 history responses"):
        reference_analyzer_messages("t", ["H"], [], "B", "r", "{}", "A")


def test_history_transition_and_config() -> None:
    base = {"instruction": "t", "screenshot_before": b"b", "screenshot_after": b"a",
            "response": "r", "action": {"action": "wait"}}  # fmt: skip
    t = HistoryTransition.model_validate(
        {**base, "history_screenshots": [b"h"], "history_responses": ["full"]}
    )
    assert t.history_responses == ["full"] and t.action == '{"action": "wait"}'
    with pytest.raises(ValueError, match="1 history_screenshots but 0 history_responses"):
        HistoryTransition.model_validate({**base, "history_screenshots": [b"h"]})
    cfg = AnalyzerAppConfig(model_path="/ckpt")
    assert (cfg.prompt_style, cfg.fault_rate) == ("compact", 0.0)
    with pytest.raises(ValueError):
        AnalyzerAppConfig(model_path="/ckpt", prompt_style="verbose")


def test_minimal_prompt_is_unchanged() -> None:
    click = '{"name": "left_click", "thought": "click 1", "coordinate": [309, 554]}'
    messages, images = minimal_analyzer_messages(
        "Click OK", ["typed hello", "click button 'A'"], "B", "click 1", click, "A",
        context="1 button 'OK' 309 554",
    )  # fmt: skip
    assert images == ["B", "A"]
    assert messages == [
        {
            "role": "user",
            "content": [
                {
                    "type": "text",
                    "text": "Task: Click OK\nPrevious: typed hello; click button 'A'\n"
                    "Elements:\n1 button 'OK' 309 554\nBefore:",
                },
                {"type": "image"},
                {
                    "type": "text",
                    "text": "\nResponse: click 1\nExecuted: left_click 309 554\nAfter:",
                },
                {"type": "image"},
            ],
        }
    ]
    first = minimal_analyzer_messages("t", [], "B", "r", "{}", "A")[0][0]["content"][0]["text"]
    assert first == "Task: t\nPrevious: none\nBefore:"
    many = [f"step {i}" for i in range(12)]
    text = minimal_analyzer_messages("t", many, "B", "r", "{}", "A")[0][0]["content"][0]["text"]
    assert "Previous: step 2; step 3;" in text and "step 1;" not in text  # the last 10


def test_action_line_keeps_what_was_executed() -> None:
    assert action_line('{"name": "type", "thought": "x", "text": "a b"}') == 'type "a b"'
    assert action_line('{"name": "key", "keys": ["ctrl", "a"]}') == "key ctrl+a"
    assert action_line('{"name": "scroll", "coordinate": [5, 6], "scroll_amount": -3}') == (
        "scroll 5 6 -3"
    )
    assert action_line('{"name": "wait", "text": null}') == "wait"
    # Not an action object: shown as it came, never dropped.
    assert action_line(' {"action": "wait"} ') == '{"action": "wait"}'
    assert action_line("not json") == "not json"


def test_transition_messages_dispatch() -> None:
    args = ("Click OK", ["typed hello"], "B", "resp", ACTION, "A")
    assert transition_messages("compact", *args, full=False) == analyzer_messages(*args, full=False)
    assert transition_messages("minimal", *args, full=True) == minimal_analyzer_messages(*args)
    with pytest.raises(ValueError, match="'reference' needs the history screens"):
        transition_messages("reference", *args)


def test_a_trained_analyzer_is_served_the_prompt_it_learnt(tmp_path) -> None:
    def trained(**info) -> str:
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        (folder / TRAINING_INFO).write_text(json.dumps(info))
        return str(folder)

    minimal = trained(full_system_prompt=False, prompt_style="minimal")
    assert trained_prompt_mismatch(minimal, "minimal", True) is None  # no system prompt at all
    why = trained_prompt_mismatch(minimal, "compact", False)
    assert why is not None and minimal in why and "set analyzer.prompt_style=minimal" in why
    older = trained(full_system_prompt=False)  # before prompt_style was written: compact
    assert trained_prompt_mismatch(older, "compact", False) is None
    why = trained_prompt_mismatch(older, "compact", True)
    assert why is not None and "full_system_prompt=False" in why
    # Not pipeline-trained analyzers: nothing is known, nothing is refused.
    assert trained_prompt_mismatch(trained(kind="warm-start policy"), "compact", True) is None
    assert trained_prompt_mismatch(str(tmp_path / "absent"), "minimal", False) is None
    from serve_apps.analyzer import build_analyzer_app

    with pytest.raises(ValueError, match="was trained on prompt_style=minimal"):
        build_analyzer_app(AnalyzerAppConfig(model_path=minimal, prompt_style="compact"))
