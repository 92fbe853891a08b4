"""The agent's message formats (METHOD.md §1, §3): ordinary and privileged contexts.

Pure Python (no torch, no PIL): the rollout side builds messages here, sends them with the
screenshots to the policy deployment, and the deployment turns them into token ids with
:mod:`serve_apps.prompting.inputs`. Images are ``{"type": "image"}`` parts; the screenshots
travel beside the messages in the same order.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from typing import Any, TypeVar, get_args

from env_client.actions import ActionName

Image = TypeVar("Image")
Message = dict[str, Any]

HISTORY_SCREENSHOTS = 3
"""H in METHOD.md: the context holds the last H screenshots, the last one is the current screen."""

# The action space is env_client's (the lowest package owns the contract); "invalid" is the
# parser's verdict, not something the policy may choose.
ACTIONS = tuple(a for a in get_args(ActionName) if a != "invalid")

SHORT_SYSTEM_PROMPT = (
    "Use the computer_use tool; coordinates on a 0..999 grid, (0, 0) top-left. Reply "
    '"Action: <one sentence>" then <tool_call>{"name": "computer_use", "arguments": {...}}</tool_call>'
)
"""The embedded/tiny default: every token costs on CPU. The action list is in the full one."""

FULL_SYSTEM_PROMPT = """You are a computer-use agent. You see screenshots of a desktop and act through one tool.

# Tool
computer_use: mouse and keyboard control of the screen.
Coordinates are [x, y] on a relative 0..999 grid over the screenshot: [0, 0] is the top-left
corner, [999, 999] the bottom-right. Arguments by action:
- key: keys (list of key names pressed together, e.g. ["ctrl", "c"])
- type: text (string to type)
- mouse_move, left_click, right_click, middle_click, double_click, triple_click: coordinate
- left_click_drag: coordinate (end point; the drag starts at the current mouse position)
- scroll, hscroll: pixels (positive = down/right), optional coordinate
- wait: time (seconds)
- terminate: status ("success" when the task is done, "failure" when it cannot be done)

# Answer format
One sentence saying what you do and why, then exactly one tool call:
Action: click the "OK" button to confirm.
<tool_call>{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [512, 380]}}</tool_call>"""

PRIVILEGED_BLOCK = "\n\n[PRIVILEGED_ACTION_GUIDANCE]\n{guidance}\n[/PRIVILEGED_ACTION_GUIDANCE]"
GUIDANCE_TEMPLATE = "[GUIDE]\n{guide}\n\n[AVOID]\n{avoid}"


def system_prompt(style: str = "short") -> str:
    """The agent's system prompt: ``short`` (tiny/CPU default; few tokens) or ``full``."""
    prompts = {"short": SHORT_SYSTEM_PROMPT, "full": FULL_SYSTEM_PROMPT}
    if style not in prompts:
        raise ValueError(f"system prompt style {style!r}: allowed {sorted(prompts)}")
    return prompts[style]


def previous_line(history: Sequence[str], keep: int) -> str:
    """The last ``keep`` earlier actions on one line: ``Previous: a; b`` (``none`` before
    the first, or when ``keep`` is 0)."""
    shown = list(history)[-keep:] if keep > 0 else []
    return "Previous: " + ("; ".join(shown) if shown else "none")


def history_text(history: Sequence[str], max_lines: int | None = None) -> str:
    """Numbered one-line summaries of earlier actions; the oldest are elided past ``max_lines``."""
    if not history:
        return "Previous actions: none"
    first = 0 if max_lines is None else max(0, len(history) - max_lines)
    lines = ["Previous actions:"]
    if first:
        lines.append(f"({first} earlier actions omitted)")
    lines += [f"{i + 1}. {_one_line(h)}" for i, h in enumerate(history) if i >= first]
    return "\n".join(lines)


def agent_messages(
    instruction: str,
    screenshots: Sequence[Image],
    history: Sequence[str] = (),
    *,
    num_screenshots: int = HISTORY_SCREENSHOTS,
    system: str | None = None,
    max_history_lines: int | None = None,
) -> tuple[list[Message], list[Image]]:
    """The ordinary context ``c``: system prompt, instruction, action history, last H screens.

    ``screenshots`` are all screens seen so far (oldest first; the last is the current one);
    the returned image list holds the last ``num_screenshots`` of them, matching the image
    parts of the messages. ``system`` defaults to the short system prompt.
    """
    if not screenshots:
        raise ValueError("agent_messages needs at least the current screenshot")
    if num_screenshots < 1:
        raise ValueError(f"num_screenshots must be >= 1, got {num_screenshots}")
    shown = list(screenshots[-num_screenshots:])
    header = f"Task: {instruction.strip()}\n{history_text(history, max_history_lines)}\n" + (
        "Screenshots, oldest first; the last is the current screen:"
        if len(shown) > 1
        else "Current screen:"
    )
    content: list[dict[str, Any]] = [{"type": "text", "text": header}]
    content += [{"type": "image"} for _ in shown]
    messages: list[Message] = [
        {"role": "system", "content": system if system is not None else SHORT_SYSTEM_PROMPT},
        {"role": "user", "content": content},
    ]
    return messages, shown


def guidance_text(guide: str, avoid: str) -> str:
    """The analyzer's guidance as it enters the privileged context (METHOD.md §2)."""
    return GUIDANCE_TEMPLATE.format(guide=guide.strip(), avoid=avoid.strip())


def privileged_messages(messages: Sequence[Message], guidance: str) -> list[Message]:
    """The privileged context ``c+``: ``messages`` with the guidance block appended to the LAST
    user message (METHOD.md §3). The input is not modified; images stay where they were."""
    out = copy.deepcopy(list(messages))
    for message in reversed(out):
        if message.get("role") == "user":
            _append_text(message, PRIVILEGED_BLOCK.format(guidance=guidance))
            return out
    raise ValueError("privileged_messages: the conversation has no user message")


def summarize_response(text: str, max_chars: int = 120) -> str:
    """One line for the action history: the response's ``Action: ...`` sentence, else its first
    line outside any tool call, else the tool call itself, cut to ``max_chars``."""
    match = re.search(r"Action:\s*(.+)", text)
    if match:
        line = match.group(1)
    else:
        outside = re.sub(r"<tool_call>.*?(</tool_call>|$)", " ", text, flags=re.DOTALL).strip()
        call = re.search(r"<tool_call>(.*?)(</tool_call>|$)", text, flags=re.DOTALL)
        line = outside or (call.group(1) if call else "") or "(no action)"
    return _one_line(line, max_chars)


def _append_text(message: Message, text: str) -> None:
    content = message.get("content")
    if isinstance(content, str):
        message["content"] = content + text
    elif isinstance(content, list):
        content.append({"type": "text", "text": text})
    else:
        raise ValueError(f"message content must be a string or a list, got {type(content)}")


def _one_line(text: str, max_chars: int = 200) -> str:
    line = " ".join(text.split())
    return line if len(line) <= max_chars else line[: max_chars - 1] + "…"
