"""The ``elements`` agent style: a prompt a tiny model can learn in CPU minutes (embedded only).

The screen's accessibility tree is listed one element a line, numbered, with its centre already
on the 0..999 grid, and the answer is one short line naming an element by its number
(set-of-marks), so the model picks an element instead of spelling coordinates digit by digit:

    Task: Click on the 'Submit' button.
    Elements:
    0 text 'Click on the Submit button.' 500 120
    1 button 'Submit' 187 433 match
    2 textbox '' 500 610 focused value='Alice'
    Previous: none
    Screen: <image>

    answer: click 1        |  type "Alice"  |  key enter

``match`` flags an element one can act on whose name the task line contains: a lexical cue read
from the observation itself (no privileged information) that a tiny model would otherwise need
many more steps to compute. Names are quoted with single quotes everywhere (task line, elements, the analyzer's guidance):
Qwen's pre-tokenizer glues an opening quote to the word after it, so a name quoted one way
here and another way there would be different tokens, and a tiny model could not match them.

:func:`parse_answer` maps an answer back to an :class:`~env_client.actions.Action` (a click at
the element's centre); :func:`encode_action` does the reverse for an expert action (behaviour
cloning, oracle guidance), through the listed element that holds its click point. Production
prompts keep the tool-call format of :mod:`serve_apps.prompting.messages`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from env_client.a11y import A11yNode, parse_tree
from env_client.actions import Action, invalid, to_pixel, to_relative
from serve_apps.prompting.messages import previous_line

Image = TypeVar("Image")

MAX_ELEMENTS = 24
"""Elements listed per screen (document order): every MiniWoB task we use has fewer."""
MAX_NAME_CHARS = 24
HISTORY_LINES = 3
SYSTEM_PROMPT = 'Answer one action: click N | type "TEXT" | key KEY'


@dataclass(frozen=True)
class Listed:
    """One listed element: its number in the prompt, the node, its centre on the grid."""

    index: int
    node: A11yNode
    x: int
    y: int


def list_elements(tree_xml: str | None, screen: tuple[int, int]) -> list[Listed]:
    """The accessibility tree's first ``MAX_ELEMENTS`` nodes, numbered, centres on the grid."""
    w, h = screen
    out: list[Listed] = []
    for node in parse_tree(tree_xml)[:MAX_ELEMENTS]:
        cx, cy = node.center
        out.append(Listed(len(out), node, to_relative(cx, w), to_relative(cy, h)))
    return out


def single_quotes(text: str) -> str:
    return text.replace('"', "'").replace("“", "'").replace("”", "'")


def _short(text: str) -> str:
    text = " ".join(single_quotes(text).split())
    return text if len(text) <= MAX_NAME_CHARS else text[: MAX_NAME_CHARS - 1] + "~"


def named_in(el: Listed, task: str) -> bool:
    """Whether ``task`` names this element (whole words, any case); never for plain text."""
    name = " ".join(single_quotes(el.node.name).split()).casefold()
    if el.node.role == "text" or not name:
        return False
    return re.search(rf"(?<!\w){re.escape(name)}(?!\w)", single_quotes(task).casefold()) is not None


def element_line(el: Listed, task: str = "") -> str:
    n = el.node
    parts = [str(el.index), n.role, f"'{_short(n.name)}'", str(el.x), str(el.y)]
    if n.checked is not None:
        parts.append("checked" if n.checked else "unchecked")
    if n.focused:
        parts.append("focused")
    if n.value:
        parts.append(f"value='{_short(n.value)}'")
    if task and named_in(el, task):
        parts.append("match")
    return " ".join(parts)


def element_label(el: Listed) -> str:
    """How history lines and guidance name an element: ``button 'Submit'``."""
    return f"{el.node.role} '{_short(el.node.name)}'"


def screen_text(instruction: str, elements: Sequence[Listed], history: Sequence[str]) -> str:
    """The user turn's text before the screenshot."""
    lines = [f"Task: {single_quotes(instruction.strip())}", "Elements:"]
    lines += [element_line(e, instruction) for e in elements]
    lines.append(previous_line(history, HISTORY_LINES))
    lines.append("Screen:")
    return "\n".join(lines)


def agent_messages(
    instruction: str,
    screenshot: Image,
    elements: Sequence[Listed],
    history: Sequence[str] = (),
) -> tuple[list[dict[str, Any]], list[Image]]:
    """The ordinary context ``c`` of the elements style: one user turn, the current screen."""
    content = [
        {"type": "text", "text": screen_text(instruction, elements, history)},
        {"type": "image"},
    ]
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": content},
    ], [screenshot]


def element_at(elements: Sequence[Listed], px: int, py: int) -> Listed | None:
    """The smallest listed element whose box holds pixel (px, py), preferring elements one can
    act on over plain text."""
    under = [
        e
        for e in elements
        if e.node.box[0] <= px < e.node.box[0] + e.node.box[2]
        and e.node.box[1] <= py < e.node.box[1] + e.node.box[3]
    ]
    acting = [e for e in under if e.node.role != "text"] or under
    return min(acting, key=lambda e: e.node.box[2] * e.node.box[3], default=None)


def encode_action(
    action: Action, elements: Sequence[Listed], screen: tuple[int, int]
) -> str | None:
    """An (expert) action → its answer line; None when it cannot be said in this style (a
    click on no listed element, an action the style has no word for)."""
    if action.name == "type" and action.text:
        return f'type "{action.text}"'
    if action.name == "key" and action.keys:
        return "key " + "+".join(action.keys)
    if action.name != "left_click" or action.coordinate is None:
        return None
    w, h = screen
    el = element_at(elements, to_pixel(action.coordinate[0], w), to_pixel(action.coordinate[1], h))
    return None if el is None else f"click {el.index}"


_CLICK = re.compile(r"click\s+(\d{1,3})")
_TYPE = re.compile(r'type\s+"(.+)"', re.DOTALL)
_KEY = re.compile(r"key\s+([A-Za-z0-9+]+)")


def parse_answer(text: str, elements: Sequence[Listed]) -> Action:
    """Answer line → Action; never raises (anything else is an ``invalid`` action)."""
    answer = text.strip()
    try:
        if m := _CLICK.fullmatch(answer):
            i = int(m.group(1))
            if i >= len(elements):
                return invalid(f"no element {i} (the screen lists {len(elements)})", answer)
            el = elements[i]
            return Action(name="left_click", coordinate=(el.x, el.y), thought=answer)
        if m := _TYPE.fullmatch(answer):
            return Action(name="type", text=m.group(1), thought=answer)
        if m := _KEY.fullmatch(answer):
            return Action(name="key", keys=tuple(m.group(1).lower().split("+")), thought=answer)
    except ValueError as exc:  # e.g. an unknown key name or a too long text
        return invalid(f"bad arguments: {exc}", answer)
    return invalid(f"not an answer of the elements style: {answer[:60]!r}", answer)


def summarize_answer(text: str, elements: Sequence[Listed]) -> str:
    """The history line of an answer: element numbers change between screens, so a click is
    remembered by what it clicked (``click button 'Submit'``)."""
    answer = " ".join(text.split())
    m = _CLICK.fullmatch(answer)
    if m and int(m.group(1)) < len(elements):
        return f"click {element_label(elements[int(m.group(1))])}"
    return answer[:60]
