"""Synthetic ground truth and transitions for the analyzer-pipeline unit tests.

The ground-truth dicts copy the shape of the embedded server's ``/debug`` answers (recorded
from real MiniWoB pages): 160x210 screens, elements with ``box`` [x, y, w, h] and ``hit``.
"""

from __future__ import annotations

import io
import json
import time
from typing import Any

from PIL import Image

from env_client.actions import Action, render_response

SCREEN = [160, 210]


def png(color: tuple[int, int, int] = (200, 200, 200)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", tuple(SCREEN), color).save(buf, "PNG")
    return buf.getvalue()


def _meta(done: bool, score: float) -> dict[str, Any]:
    return {"done": done, "raw_reward": score if done else 0, "reason": None}


def _base(task: str, fields: dict[str, str], instruction: str) -> dict[str, Any]:
    query = {
        "tag": "div", "id": "query", "classes": "", "role": None, "text": instruction,
        "own_text": instruction, "box": [0, 0, 160, 50], "hit": [80, 25],
    }  # fmt: skip
    wrap = {
        "tag": "div", "id": "wrap", "classes": "", "role": None, "text": instruction,
        "own_text": "", "box": [0, 0, 160, 210], "hit": [80, 105],
    }  # fmt: skip
    return {
        "task": task, "seed": 0, "instruction": instruction, "fields": fields,
        "screen": SCREEN, "episode_actions": 0, "control_done": False, "elements": [wrap, query],
    }  # fmt: skip


def button(text: str, box: list[int], el_id: str = "") -> dict[str, Any]:
    return {
        "tag": "button", "id": el_id, "classes": "", "role": "button", "text": text,
        "own_text": text, "box": box, "hit": [box[0] + box[2] // 2, box[1] + box[3] // 2],
        "focused": False,
    }  # fmt: skip


def click_button_truth(done: bool = False, score: float = 0.0) -> dict[str, Any]:
    """click-button: 'Click on the "okay" button.' with a second button "cancel"."""
    truth = _base("click-button", {"target": "okay"}, 'Click on the "okay" button.')
    truth["elements"] += [button("okay", [2, 63, 44, 21]), button("cancel", [60, 63, 44, 21])]
    truth.update(score=score, meta=_meta(done, score))
    return truth


def enter_text_truth(
    focused: bool = False, value: str = "", done: bool = False, score: float = 0.0
) -> dict[str, Any]:
    """enter-text: 'Enter "Bob" into the text field and press Submit.'"""
    truth = _base(
        "enter-text", {"target": "Bob"}, 'Enter "Bob" into the text field and press Submit.'
    )
    field = {
        "tag": "input_text", "id": "tt", "classes": "", "role": "textbox", "text": "",
        "own_text": "", "label": "", "value": value, "box": [2, 53, 128, 21], "hit": [66, 63],
        "focused": focused,
    }  # fmt: skip
    truth["elements"] += [field, button("Submit", [2, 80, 95, 31], "subbtn")]
    truth.update(score=score, meta=_meta(done, score))
    return truth


def click_action(x: int, y: int, thought: str) -> Action:
    """A left click at screen pixel (x, y) of a 160x210 screen, on the 0..999 grid."""
    from env_client.actions import to_relative

    return Action(
        name="left_click",
        coordinate=(to_relative(x, SCREEN[0]), to_relative(y, SCREEN[1])),
        thought=thought,
    )


def transition(
    tid: str,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    action: Action,
    *,
    executed: bool = True,
    source: str = "policy",
    episode: str | None = None,
    response: str | None = None,
) -> dict[str, Any]:
    """A transition row of ``workflows.analyzer.transitions.TRANSITION_SCHEMA``."""
    text = (
        response if response is not None else (render_response(action) if action.is_valid else "??")
    )
    return {
        "transition_id": tid, "episode_id": episode or f"ep-{tid}", "source": source,
        "task_id": "miniwob/x/0", "task_name": (before or {}).get("task", "x"),
        "task_kind": "click", "task_seed": 0, "step_index": 0, "num_steps": 1,
        "instruction": (before or {}).get("instruction", "Do it."), "history": [],
        "screenshot_before": png((200, 200, 200)), "screenshot_after": png((100, 200, 100)), "context": "",
        "response_text": text, "action": action.model_dump_json(),
        "executed_action": json.dumps(action.model_dump(exclude_none=True)),
        "executed": executed, "env_done": bool(after and after["meta"]["done"]),
        "truth_before": json.dumps(before) if before else None,
        "truth_after": json.dumps(after) if after else None,
        "episode_score": float((after or {}).get("score", 0.0)),
        "success": float((after or {}).get("score", 0.0)) >= 1.0,
        "model": "test", "created_at": time.time(),
    }  # fmt: skip
