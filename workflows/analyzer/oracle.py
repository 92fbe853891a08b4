"""The ground-truth oracle: METHOD.md §2 judgments computed from the embedded environment.

The embedded server's ``/debug`` ground truth (task fields, every element with its box, click
point, text, label, checked/focused/value state, and MiniWoB's score) is stored with each
transition, before and after the step. From it the oracle decides, deterministically:

- **consistency** (the executed action does what the response says it intends): the action is
  valid and was executed; the response's ``Action:`` sentence starts with a verb that fits the
  action (click/select/check/close… → a click, type/enter → typing, …); and every element it
  names in quotes is the element actually hit (for typing: the text actually typed).
- **effectiveness** (real progress toward the goal): the step completes the task, or it shrinks
  the expert's remaining plan (:func:`remaining_plan`: the scripted solution minus what the
  page state already satisfies: a focused field, a typed value, a checked option), without
  ending the episode in failure.
- **guide**: the expert's next action from the state before the step, with its grid
  coordinates ("Click the 'OK' button: left_click at (512, 380).");
  **avoid**: what went wrong (the action taken, the element it hit, the unparsed answer), or
  for a good step the plausible mistake of the scripted wrong plan. Texts quote with single
  quotes: inside the JSON answer, double quotes would be escaped (more answer tokens).

Also :func:`mismatch_plan`: the expert's actions under a sentence naming another element
(inconsistent but effective steps), so annotations cover all four verdict combinations.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from env_client.actions import POINTER_ACTIONS, Action, to_pixel
from env_client.scripted import NoPlan, solve, wrong

Truth = dict[str, Any]
Element = dict[str, Any]

_CLICKS = frozenset(
    {"left_click", "double_click", "triple_click", "right_click", "middle_click"}
)  # fmt: skip
# First verb of the "Action:" sentence → the actions that carry that intention out.
VERB_ACTIONS: dict[str, frozenset[str]] = {
    **dict.fromkeys(
        ("click", "select", "check", "uncheck", "close", "choose", "tick", "focus", "open", "tap"),
        _CLICKS,
    ),
    **dict.fromkeys(("press", "hit", "push"), _CLICKS | {"key"}),
    **dict.fromkeys(("type", "write", "fill", "input"), frozenset({"type"})),
    "enter": frozenset({"type", "key"}),
    "double": frozenset({"double_click"}),
    "triple": frozenset({"triple_click"}),
    "scroll": frozenset({"scroll", "hscroll"}),
    "wait": frozenset({"wait"}),
    **dict.fromkeys(("move", "hover"), frozenset({"mouse_move"})),
    "drag": frozenset({"left_click_drag"}),
    **dict.fromkeys(("done", "finish", "terminate", "stop", "complete"), frozenset({"terminate"})),
}
_QUOTED = re.compile(r'"([^"]{1,80})"|“([^”]{1,80})”')
_WORD = re.compile(r"[a-z]+")


class OracleError(ValueError):
    """The transition lacks what the oracle needs (no ground truth: not the embedded env)."""


@dataclass(frozen=True)
class OracleJudgment:
    consistency: int
    effectiveness: int
    guide: str
    avoid: str


# --- ground truth helpers --------------------------------------------------------------------


def load_truth(text: str | None) -> Truth | None:
    """Ground-truth JSON text → dict (None stays None)."""
    if not text:
        return None
    truth = json.loads(text)
    return truth if isinstance(truth, dict) else None


def _contains(el: Element, x: int, y: int) -> bool:
    box = el.get("box") or (0, 0, 0, 0)
    return box[0] <= x < box[0] + box[2] and box[1] <= y < box[1] + box[3]


def _meaningful(el: Element) -> bool:
    return bool(el.get("role") or el.get("own_text") or el.get("label")) or str(
        el.get("tag", "")
    ).startswith("input")


def element_at(truth: Truth, x: int, y: int) -> Element | None:
    """The smallest meaningful element (role, own text, label or input) under pixel (x, y)."""
    under = [e for e in truth.get("elements") or [] if _contains(e, x, y) and _meaningful(e)]
    if not under:
        return None
    return min(under, key=lambda e: e["box"][2] * e["box"][3])


def _norm(text: str) -> str:
    return " ".join(str(text).lower().split()).strip(" .!?:")


def element_names(el: Element | None) -> set[str]:
    """Names a response may use for an element (text, own text, label; "x" for close buttons)."""
    if el is None:
        return set()
    names = {_norm(el.get(k) or "") for k in ("own_text", "label")}
    if len(str(el.get("text") or "")) <= 60:
        names.add(_norm(el.get("text") or ""))
    if "close" in str(el.get("classes", "")):
        names |= {"x", "×", "close"}
    return names - {""}


def describe_element(el: Element | None) -> str:
    if el is None:
        return "an empty area"
    role, text = el.get("role"), _short(el.get("text") or el.get("own_text") or "")
    label = _short(el.get("label") or "")
    by_role = {
        "button": f'the "{text}" button',
        "textbox": "a text field",
        "checkbox": f'the checkbox "{label}"',
        "radio": f'the option "{label}"',
        "link": f'the link "{text}"',
        "tab": f'the tab "{text}"',
    }
    if role in by_role:
        return by_role[role]
    if el.get("tag") == "a":
        return f'the link "{text}"'
    return f'the text "{_short(el.get("own_text") or text)}"'


def _short(text: str, n: int = 30) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _pixel(truth: Truth, action: Action) -> tuple[int, int] | None:
    if action.coordinate is None:
        return None
    w, h = truth["screen"]
    return to_pixel(action.coordinate[0], w), to_pixel(action.coordinate[1], h)


def _target(truth: Truth, action: Action) -> Element | None:
    xy = _pixel(truth, action)
    return None if xy is None else element_at(truth, *xy)


# --- the expert's remaining plan -------------------------------------------------------------


def remaining_plan(truth: Truth) -> list[Action] | None:
    """The scripted solution minus the actions the page state already satisfies; None when
    the task has no scripted plan."""
    try:
        plan = solve(truth)
    except NoPlan:
        return None
    return [a for i, a in enumerate(plan) if not _satisfied(truth, plan, i)]


def _satisfied(truth: Truth, plan: list[Action], i: int) -> bool:
    action = plan[i]
    if action.name == "type":
        field = _target(truth, plan[i - 1]) if i > 0 else _focused_field(truth)
        return field is not None and field.get("value") == action.text
    el = _target(truth, action) if action.name in _CLICKS else None
    if el is None:
        return False
    if el.get("role") == "textbox":
        nxt = plan[i + 1] if i + 1 < len(plan) else None
        typed = nxt is not None and nxt.name == "type" and el.get("value") == nxt.text
        return bool(el.get("focused")) or typed
    return el.get("role") == "radio" and bool(el.get("checked"))


def _focused_field(truth: Truth) -> Element | None:
    for el in truth.get("elements") or []:
        if el.get("role") == "textbox" and el.get("focused"):
            return el
    return None


# --- verdicts --------------------------------------------------------------------------------


def quoted_names(thought: str) -> list[str]:
    return [_norm(a or b) for a, b in _QUOTED.findall(thought or "")]


def stated_actions(thought: str) -> frozenset[str] | None:
    """Actions fitting the sentence's first known verb; None when it states no intention."""
    for word in _WORD.findall((thought or "").lower()):
        if word in VERB_ACTIONS:
            return VERB_ACTIONS[word]
    return None


def is_consistent(truth: Truth, action: Action, executed: bool) -> bool:
    if not executed or not action.is_valid:
        return False
    allowed = stated_actions(action.thought)
    if allowed is None or action.name not in allowed:
        return False
    names = quoted_names(action.thought)
    if not names:
        return True
    if action.name in POINTER_ACTIONS:
        return bool(set(names) & element_names(_target(truth, action)))
    if action.name == "type":
        return _norm(action.text or "") in names
    return True


def is_effective(before: Truth, after: Truth, executed: bool) -> bool:
    if float(after.get("score") or 0.0) >= 1.0:
        return True
    if (after.get("meta") or {}).get("done") or not executed:
        return False
    plan_before, plan_after = remaining_plan(before), remaining_plan(after)
    if plan_before is None or plan_after is None:
        return False
    return len(plan_after) < len(plan_before)


def judge(
    before: Truth,
    after: Truth,
    action: Action,
    executed: bool,
    instruction: str,
    context: str = "",
) -> OracleJudgment:
    """The oracle's verdict on one transition (see the module docstring). With the elements
    style's ``context`` (numbered elements), guide and avoid are answers of that style."""
    c = is_consistent(before, action, executed)
    e = is_effective(before, after, executed)
    plan = remaining_plan(before)
    listed = listed_elements(context)
    if listed:
        guide, avoid = element_guidance(before, action, executed, c and e, plan, listed)
    else:
        guide = guide_text(before, plan, instruction)
        avoid = avoid_text(before, action, executed, c, e, plan)
    # Single quotes inside the texts: JSON escapes double ones, which costs answer tokens.
    return OracleJudgment(
        consistency=int(c),
        effectiveness=int(e),
        guide=guide.replace('"', "'"),
        avoid=avoid.replace('"', "'"),
    )


def judge_transition(t: Mapping[str, Any]) -> OracleJudgment:
    """:func:`judge` on a stored transition row (``workflows.analyzer.transitions``)."""
    before, after = load_truth(t.get("truth_before")), load_truth(t.get("truth_after"))
    if before is None or after is None:
        raise OracleError(
            f"transition {t.get('transition_id')!r} has no ground truth (the oracle needs the "
            "embedded environment; collect with collect.ground_truth=true)"
        )
    action = Action.model_validate_json(t["action"])
    instruction = str(t.get("instruction") or "")
    return judge(before, after, action, bool(t["executed"]), instruction, t.get("context") or "")


# --- guidance in the elements style ----------------------------------------------------------

_LISTED = re.compile(r"^(\d+) (\S+) '(.*)' (\d+) (\d+)")


@dataclass(frozen=True)
class ListedElement:
    """One line of the elements style's listing: number, role, name, centre on the grid."""

    index: int
    role: str
    name: str
    x: int
    y: int

    @property
    def label(self) -> str:
        return f"{self.role} '{self.name}'"


def listed_elements(context: str) -> list[ListedElement]:
    """The numbered element lines of an elements-style context ([] for any other context)."""
    out = []
    for line in (context or "").splitlines():
        m = _LISTED.match(line)
        if m:
            out.append(ListedElement(int(m[1]), m[2], m[3], int(m[4]), int(m[5])))
    return out


def element_answer(
    action: Action, listed: list[ListedElement], with_number: bool = True
) -> str | None:
    """An action as the elements style answers it, with the element it names: ``click 3
    (button 'OK')``, or without the number (``click button 'OK'``), as avoid texts say it so
    that the guide's number is the only one in the guidance. A click goes to the listed
    element nearest its point (listing centres and ground-truth click points come from the
    same page)."""
    if action.name == "type" and action.text:
        return f'type "{_short(action.text, 40)}"'
    if action.name == "key" and action.keys:
        return "key " + "+".join(action.keys)
    if action.coordinate is None:
        return None
    x, y = action.coordinate
    acting = [e for e in listed if e.role != "text"] or listed
    near = min(acting, key=lambda e: (e.x - x) ** 2 + (e.y - y) ** 2)
    return f"click {near.index} ({near.label})" if with_number else f"click {near.label}"


def element_guidance(
    truth: Truth,
    action: Action,
    executed: bool,
    good: bool,
    plan: list[Action] | None,
    listed: list[ListedElement],
) -> tuple[str, str]:
    """(guide, avoid): guide = the expert's next answer (``click 3 (button 'OK')``); avoid =
    the step's own action when it was wrong, else the scripted plausible mistake, both named
    without a number (``click link 'Cancel'``)."""
    nxt = plan[0] if plan else None
    guide = element_answer(nxt, listed) if nxt is not None else None
    if guide is None:
        guide = "the goal is reached" if plan == [] else "do what the task asks"
    if not good:
        own = element_answer(action, listed, False) if action.is_valid and executed else None
        return guide, own or f"an invalid answer ({_short(action.reason or 'not executed', 40)})"
    try:
        mistakes = [m for m in wrong(truth) if m.name != "type"]
    except NoPlan:
        mistakes = []
    plain_guide = element_answer(nxt, listed, False) if nxt is not None else None
    for m in mistakes:
        said = element_answer(m, listed, False)
        if said is not None and said != plain_guide:
            return guide, said
    return guide, "any element the task does not name"


# --- guidance texts --------------------------------------------------------------------------


def call_text(action: Action) -> str:
    """The tool call in words: ``left_click at (512, 380)``, ``type "abc"``."""
    if action.coordinate is not None:
        return f"{action.name} at ({action.coordinate[0]}, {action.coordinate[1]})"
    if action.name == "type":
        return f'type "{_short(action.text or "", 40)}"'
    if action.name == "key":
        return f"key {'+'.join(action.keys or ())}"
    return action.name


def guide_text(truth: Truth, plan: list[Action] | None, instruction: str) -> str:
    if plan is None:
        return f"Do what the instruction asks: {_short(instruction, 80)}"
    if not plan:
        return "The goal is reached: terminate with status success."
    nxt = plan[0]
    if nxt.name == "type":
        return f'Type "{_short(nxt.text or "", 40)}" into the focused text field.'
    return f"{nxt.thought.rstrip('.')}: {call_text(nxt)}."


def avoid_text(
    truth: Truth, action: Action, executed: bool, c: bool, e: bool, plan: list[Action] | None
) -> str:
    if not action.is_valid or not executed:
        reason = _short(action.reason or "not executed", 60)
        return f"Do not answer without exactly one valid computer_use tool call ({reason})."
    if not c:
        if action.coordinate is not None:
            hit = describe_element(_target(truth, action))
            return f"Do not describe one target and act on another: {call_text(action)} hits {hit}."
        if action.name == "type":
            return f"Do not announce one text and type another: {call_text(action)}."
        return f"Do not state an intention that {call_text(action)} does not carry out."
    if not e:
        what = f"hits {describe_element(_target(truth, action))}" if action.coordinate else ""
        return f"Do not {call_text(action)}{': it ' + what if what else ''}; it makes no progress."
    return _plausible_mistake(truth, plan)


def _plausible_mistake(truth: Truth, plan: list[Action] | None) -> str:
    try:
        mistakes, solution = wrong(truth), solve(truth)
    except NoPlan:
        mistakes, solution = [], []
    # Neither a step still to do nor one already done is a mistake at this point.
    harmless = {call_text(a) for a in solution} | {call_text(a) for a in plan or []}
    for m in mistakes:
        if call_text(m) not in harmless:
            said = m.thought[:1].lower() + m.thought[1:].rstrip(".")
            return f"Do not {said}: {call_text(m)}." if m.coordinate else f"Do not {said}."
    return "Do not act on any other element than the one the instruction names."


# --- inconsistent-but-effective demonstrations ----------------------------------------------


def mismatch_plan(truth: Truth) -> list[Action]:
    """The expert's actions, each under a sentence that names something else."""
    out = []
    for action in solve(truth):
        if action.name == "type":
            other = (action.text or "")[::-1] + "x"
            out.append(action.model_copy(update={"thought": f'Type "{other}".'}))
            continue
        name = _other_name(truth, action)
        out.append(action.model_copy(update={"thought": f'Click "{name}".'}))
    return out


def _other_name(truth: Truth, action: Action) -> str:
    hit = element_names(_target(truth, action))
    candidates = [
        str(el.get("own_text") or el.get("label"))
        for el in truth.get("elements") or []
        if _meaningful(el) and (el.get("own_text") or el.get("label"))
    ]
    others = [c for c in candidates if _norm(c) not in hit and '"' not in c]
    others.sort(key=len)  # short names read like element labels
    return others[0] if others else "nothing"
