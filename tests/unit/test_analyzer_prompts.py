"""The analyzer's two request styles: the compact one (frozen: the cached warm-start analyzer
is trained on it, byte for byte) and the reference one (history screenshots with the policy's
full earlier responses, as the reference analyzer)."""

from __future__ import annotations

import pytest

from serve_apps.analyzer import HistoryTransition
from serve_apps.config import AnalyzerAppConfig
from serve_apps.prompting.analyzer import analyzer_messages, reference_analyzer_messages

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
