"""The GUI analyzer's prompt (METHOD.md §2): one transition in, JSON judgment out.

Pure Python. The analyzer sees the instruction, recent history, the screen before, the
policy's response, the executed action (JSON) and the screen after; it answers JSON only:
``{"consistency": 0|1, "effectiveness": 0|1, "guide": "...", "avoid": "..."}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from serve_apps.prompting.messages import history_text

Image = TypeVar("Image")

ANSWER_FORMAT = '{"consistency": 0 or 1, "effectiveness": 0 or 1, "guide": "...", "avoid": "..."}'

SHORT_ANALYZER_PROMPT = (
    "Judge one step of a computer-use agent from the screens before and after it. "
    f"Answer JSON only: {ANSWER_FORMAT}"
)

FULL_ANALYZER_PROMPT = f"""You are a GUI analyzer. You judge one step of a computer-use agent.
You see the task, the earlier actions, the screen before the step, the agent's response (its
stated intention and tool call), the action that was executed, and the screen after the step.

Fields:
- consistency: 1 if the executed action does what the response says it intends (same action,
  same target element), else 0.
- effectiveness: 1 if the step makes real progress toward completing the task (the screen after
  shows the intended effect and it moves toward the goal), else 0.
- guide: one or two concrete sentences on what the agent should do at this step (which element,
  which action, which text).
- avoid: one sentence on what the agent should not do here.

Answer with the JSON object only, no other text:
{ANSWER_FORMAT}"""


def analyzer_messages(
    instruction: str,
    history: Sequence[str],
    screenshot_before: Image,
    response: str,
    action_json: str,
    screenshot_after: Image,
    *,
    full: bool = True,
    max_history_lines: int | None = 10,
    context: str = "",
) -> tuple[list[dict[str, Any]], list[Image]]:
    """Messages and images (before, after) for one transition. ``context`` is what the policy
    saw of the screen before besides the image (the elements style's numbered elements, which
    its answers refer to); empty for answers that carry their own coordinates."""
    before = f"Task: {instruction.strip()}\n{history_text(history, max_history_lines)}\n"
    if context.strip():
        before += f"Elements before the step:\n{context.strip()}\n"
    before += "Screen before the step:"
    middle = (
        f"\nAgent response:\n{response.strip()}\n"
        f"Executed action: {action_json.strip()}\n"
        "Screen after the step:"
    )
    content = [
        {"type": "text", "text": before},
        {"type": "image"},
        {"type": "text", "text": middle},
        {"type": "image"},
        {"type": "text", "text": "\nJudgment (JSON only):"},
    ]
    system = FULL_ANALYZER_PROMPT if full else SHORT_ANALYZER_PROMPT
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": content},
    ]
    return messages, [screenshot_before, screenshot_after]
