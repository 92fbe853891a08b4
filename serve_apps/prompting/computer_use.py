"""Qwen's ``computer_use`` tool-call dialogue, shared by the Qwen3-VL and EvoCUA agent styles.

Both families are prompted as the reference agents (ComputerSD ``online-rl/agents``) prompt
them: a ``# Tools`` system prompt holding the tool's JSON schema, earlier steps replayed as
user(screenshot) / assistant(full response) turns, and an instruction text with a numbered
"previous actions" list. They answer::

    Action: Click the "File" menu.
    <tool_call>
    {"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [24, 41]}}
    </tool_call>

Coordinates are on the relative 0..999 grid ("The screen's resolution is 1000x1000"), which is
:class:`~env_client.actions.Action`'s own convention, so they are taken over unscaled; the
environment client maps a grid cell to its centre pixel (the reference multiplies by W/999:
the two differ by under one pixel). :func:`parse_tool_response` never raises: a response that
does not hold exactly one usable tool call is an ``invalid`` action with a reason.

The styles' history entries are the policy's full responses (their ``summarize`` returns them),
since the prompt replays the last ones verbatim and the previous-actions list takes each
response's ``Action:`` line (:func:`previous_action`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from env_client.actions import (
    ACTION_NAMES,
    GRID,
    MAX_RESPONSE_CHARS,
    POINTER_ACTIONS,
    Action,
    describe,
    invalid,
    normalize_key,
    tool_arguments,
)

Message = dict[str, Any]

RELATIVE_RESOLUTION = "* The screen's resolution is 1000x1000."
"""The reference's relative coordinate mode tells the model the screen is 1000x1000."""

# The reference writes this wrapper by hand into the system message (no ``tools=`` to the
# chat template, which would render a second copy), so do we.
_SYSTEM_TEMPLATE = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>

# Response format

Response format for every step:
1) Action: a short imperative describing what to do in the UI.
2) A single <tool_call>...</tool_call> block containing only the JSON: {{"name": <function-name>, "arguments": <args-json-object>}}.

Rules:
- Output exactly in the order: Action, <tool_call>.
- Be brief: one sentence for Action.
- Do not output anything else outside those parts.
- If finishing, use action=terminate in the tool call."""

_INSTRUCTION_TEMPLATE = (
    "Please generate the next move according to the UI screenshot, instruction and previous "
    "actions.\n\nInstruction: {instruction}\n\nPrevious actions:\n{previous}"
)

ARGUMENT_SCHEMA: dict[str, Any] = {
    "keys": {"description": "Required only by `action=key`.", "type": "array"},
    "text": {"description": "Required only by `action=type`.", "type": "string"},
    "coordinate": {"description": "The x,y coordinates for mouse actions.", "type": "array"},
    "pixels": {"description": "The amount of scrolling.", "type": "number"},
    "time": {"description": "The seconds to wait.", "type": "number"},
    "status": {
        "description": "The status of the task.",
        "type": "string",
        "enum": ["success", "failure"],
    },
}
"""The schema of the tool's arguments besides ``action`` (the same in both families)."""


def tool_spec(description: str, action_help: str, actions: Sequence[str]) -> dict[str, Any]:
    """The ``computer_use`` function definition, keys in the reference's order (the order
    shows in the prompt's JSON)."""
    action = {"description": action_help, "enum": list(actions), "type": "string"}
    return {
        "type": "function",
        "function": {
            "name_for_human": "computer_use",
            "name": "computer_use",
            "description": description,
            "parameters": {
                "properties": {"action": action, **ARGUMENT_SCHEMA},
                "required": ["action"],
                "type": "object",
            },
            "args_format": "Format the arguments as a JSON object.",
        },
    }


def tool_system_prompt(tool: Mapping[str, Any], *, ensure_ascii: bool) -> str:
    """The ``# Tools`` system prompt around one function definition."""
    return _SYSTEM_TEMPLATE.format(tools=json.dumps(tool, ensure_ascii=ensure_ascii))


def instruction_prompt(instruction: str, actions: Sequence[str]) -> str:
    """The task text with the numbered ``Step i: …`` list of earlier actions (``None``)."""
    previous = "\n".join(f"Step {i + 1}: {a}" for i, a in enumerate(actions)) or "None"
    return _INSTRUCTION_TEMPLATE.format(instruction=instruction, previous=previous)


def system_message(text: str) -> Message:
    return {"role": "system", "content": [{"type": "text", "text": text}]}


def user_message(text: str | None = None) -> Message:
    """A user turn: one screenshot, then the text if any (the reference's order)."""
    content: list[dict[str, Any]] = [{"type": "image"}]
    if text is not None:
        content.append({"type": "text", "text": text})
    return {"role": "user", "content": content}


def assistant_message(response: str) -> Message:
    return {"role": "assistant", "content": [{"type": "text", "text": response}]}


def earlier_screens(screens: Sequence[bytes], turns: int) -> list[bytes]:
    """The screens of the last ``turns`` earlier steps, oldest first; ``screens`` ends with the
    current one (all screens so far, or at least ``turns + 1`` of the latest)."""
    if len(screens) < turns + 1:
        raise ValueError(f"{turns} earlier turns need {turns + 1} screens, got {len(screens)}")
    return list(screens[len(screens) - 1 - turns : -1])


# --- answers -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dialect:
    """How one family's tool calls map onto our action model.

    ``aliases`` renames actions the family's parser accepts under another name;
    ``unsupported`` are actions of the family's schema that :class:`Action` cannot express;
    ``no_line`` is the previous-actions entry of a response without an ``Action:`` line whose
    tool call parsed (the reference's wording; one that did not parse is "Execute action").
    """

    no_line: str
    aliases: Mapping[str, str] = field(default_factory=dict)
    unsupported: frozenset[str] = frozenset()


_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
_ACTION_LINE = re.compile(r"^[ \t]*action[ \t]*:[ \t]*(\S.*?)[ \t]*$", re.IGNORECASE | re.MULTILINE)
# An unclosed last tag still counts: a response cut at the stop token keeps its JSON.
_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL | re.IGNORECASE)
NO_ACTION = "Execute action"


def answer_part(text: str) -> str:
    """The response without its reasoning (thinking models write ``…</think>`` first; the
    opening ``<think>`` may sit in the prompt)."""
    return _THINK.sub("", text).rpartition("</think>")[2]


def action_line(text: str) -> str:
    """The answer's first non-empty ``Action:`` sentence, or ""."""
    match = _ACTION_LINE.search(answer_part(text))
    return match.group(1) if match else ""


def previous_action(text: str, dialect: Dialect) -> str:
    """A response's entry in the previous-actions list, worded as the reference words it."""
    line = action_line(text)
    if line:
        return line
    return dialect.no_line if parse_tool_response(text, dialect).is_valid else NO_ACTION


def parse_tool_response(text: str, dialect: Dialect) -> Action:
    """A family's response → Action. Never raises; problems give an ``invalid`` action."""
    try:
        return _parse(text, dialect)
    except Exception as exc:  # a parser must not kill an episode, whatever the input
        return invalid(f"parser error: {type(exc).__name__}: {exc}")


def _parse(text: Any, dialect: Dialect) -> Action:
    if not isinstance(text, str):
        return invalid(f"response is {type(text).__name__}, not text")
    # The limit is on the answer: EvoCUA's 32768-token budget lets reasoning run past it.
    answer = answer_part(text)
    if len(answer) > MAX_RESPONSE_CHARS:
        return invalid(f"answer longer than {MAX_RESPONSE_CHARS} characters")
    thought = action_line(answer)
    calls = _tool_calls(answer)
    if len(calls) != 1:
        what = "no tool call" if not calls else f"{len(calls)} tool calls"
        return invalid(f"expected exactly one computer_use tool call, found {what}", thought)
    fields, problem = _fields(calls[0], dialect)
    if problem:
        return invalid(problem, thought)
    try:
        return Action(thought=thought, **fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        return invalid(str(err["msg"]).removeprefix("Value error, "), thought)


def _tool_calls(answer: str) -> list[Any]:
    """The tool calls' JSON values (a tagged payload that is not JSON stays a string, to be
    reported). Like the reference, bare ``{"name": …, "arguments": …}`` lines count when the
    answer has no ``<tool_call>`` tag at all."""
    tagged = _TOOL_CALL.findall(answer)
    if tagged:
        return [_json_or_text(p) for p in tagged]
    lines = [ln for ln in answer.splitlines() if ln.strip().startswith("{")]
    values = [_json_or_text(ln) for ln in lines]
    return [v for v in values if isinstance(v, dict) and "name" in v and "arguments" in v]


def _json_or_text(payload: str) -> Any:
    try:
        return json.loads(payload)
    except (ValueError, RecursionError):
        return payload


def _fields(call: Any, dialect: Dialect) -> tuple[dict[str, Any], str | None]:
    """A tool call's JSON → Action fields, or a problem."""
    if isinstance(call, str):
        return {}, f"tool call is not JSON: {call.strip()[:80]!r}"
    if not isinstance(call, dict) or call.get("name") != "computer_use":
        return {}, 'tool call must be {"name": "computer_use", "arguments": {…}}'
    args = call.get("arguments")
    if not isinstance(args, dict):
        return {}, "tool call arguments must be an object"
    raw = str(args.get("action") or "").strip().lower()
    name = dialect.aliases.get(raw, raw)
    if name in dialect.unsupported:
        return {}, f"action {name!r} has no equivalent in our action model"
    if name not in ACTION_NAMES or name == "invalid":
        return {}, f"unknown action {raw[:40]!r}"
    fields: dict[str, Any] = {"name": name}
    for key in _USES.get(name, ()):  # other arguments are ignored, as the reference does
        if args.get(key) is not None:
            value, problem = _CONVERTERS[key](args[key])
            if problem:
                return {}, f"{name}: argument {key!r} {problem}"
            fields[key] = value
    return _defaults(fields), None


def _defaults(fields: dict[str, Any]) -> dict[str, Any]:
    """The reference's defaults for arguments a call may leave out."""
    if fields["name"] == "terminate":
        fields.setdefault("status", "success")
    if fields["name"] in ("scroll", "hscroll"):
        fields.setdefault("pixels", 0)
    return fields


def _number(v: Any) -> float | None:
    """A finite number from a JSON number or numeric string (the reference calls float())."""
    if isinstance(v, bool):
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _coordinate(v: Any) -> tuple[Any, str | None]:
    if not isinstance(v, list | tuple) or len(v) != 2:
        return None, "must be [x, y]"
    x, y = _number(v[0]), _number(v[1])
    if x is None or y is None:
        return None, "must hold two numbers"
    # The prompt announces a 1000x1000 screen, so 1000 is its far edge: the last grid cell.
    if not (0 <= x <= GRID and 0 <= y <= GRID):
        return None, f"{[round(x), round(y)]} is outside the 0..{GRID - 1} grid"
    return (min(GRID - 1, round(x)), min(GRID - 1, round(y))), None


def _keys(v: Any) -> tuple[Any, str | None]:
    values = v if isinstance(v, list | tuple) else [v]
    names = [str(k).strip() for k in values if k is not None and str(k).strip()]
    if len(names) == 1 and len(names[0]) > 1 and "+" in names[0]:
        names = names[0].split("+")  # "ctrl+c" as one string
    keys = [normalize_key(k) for k in names]
    if not keys or any(k is None for k in keys):
        bad = [k for k in names if normalize_key(k) is None][:4]
        return None, f"has unknown key(s) {bad}" if bad else "is empty"
    return tuple(keys), None


def _text(v: Any) -> tuple[Any, str | None]:
    return str(v), None


def _pixels(v: Any) -> tuple[Any, str | None]:
    x = _number(v)
    return (round(x), None) if x is not None else (None, "must be a number")


def _time(v: Any) -> tuple[Any, str | None]:
    x = _number(v)  # the reference ignores the time; we keep it within Action's bounds
    return (min(60.0, max(0.0, x)), None) if x is not None else (None, "must be seconds")


def _status(v: Any) -> tuple[Any, str | None]:
    status = str(v).strip().lower()
    ok = status in ("success", "failure")
    return (status, None) if ok else (None, "must be 'success' or 'failure'")


_CONVERTERS = {
    "coordinate": _coordinate,
    "keys": _keys,
    "text": _text,
    "pixels": _pixels,
    "time": _time,
    "status": _status,
}
# Which arguments each action reads; scroll keeps its optional position (the reference drops
# it and scrolls wherever the mouse is).
_USES: dict[str, tuple[str, ...]] = {
    **{a: ("coordinate",) for a in POINTER_ACTIONS},
    "scroll": ("pixels", "coordinate"),
    "hscroll": ("pixels", "coordinate"),
    "type": ("text",),
    "key": ("keys",),
    "wait": ("time",),
    "terminate": ("status",),
}


def render_tool_response(action: Action) -> str:
    """Action → the response the family writes: the ``Action:`` line, then the tool call on
    its own lines (the layout of Qwen3-VL's chat template, which the reference's line-based
    Qwen3-VL parser needs)."""
    call = {"name": "computer_use", "arguments": tool_arguments(action)}
    thought = " ".join((action.thought or describe(action)).split())
    return f"Action: {thought}\n<tool_call>\n{json.dumps(call, ensure_ascii=False)}\n</tool_call>"
