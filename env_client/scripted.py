"""Scripted expert (and deliberately wrong) action sequences for the MiniWoB task list.

Plans are computed from the embedded server's ground truth of the current episode
(``await session.ground_truth()``: MiniWoB's instruction fields and every shown element with
its click point in screen pixels). They are typed :class:`Action` objects on the 0..999 grid,
so ``render_response`` turns them into demonstration texts for behaviour cloning, and the
oracle annotator can compare a policy's action with the expert's.

    truth = await session.ground_truth()
    results = await play(session, solve(truth))      # score 1 expected
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from env_client.actions import Action, to_relative

if TYPE_CHECKING:
    from env_client.client import Session
    from env_client.observation import StepResult

Truth = dict[str, Any]
Element = dict[str, Any]


class NoPlan(LookupError):
    """The ground truth lacks what a plan needs (unknown task, element not found)."""


# --- element helpers ---------------------------------------------------------------------


def _elements(truth: Truth) -> list[Element]:
    return list(truth.get("elements") or [])


def _find(truth: Truth, what: str, pred: Callable[[Element], bool]) -> Element:
    for el in _elements(truth):
        if pred(el) and el.get("hit"):
            return el
    raise NoPlan(f"{truth.get('task')}: no clickable {what}")


def _all(truth: Truth, pred: Callable[[Element], bool]) -> list[Element]:
    return [el for el in _elements(truth) if pred(el) and el.get("hit")]


def _by_id(truth: Truth, dom_id: str) -> Element:
    return _find(truth, f"#{dom_id}", lambda e: e.get("id") == dom_id)


def _has_class(el: Element, cls: str) -> bool:
    return cls in str(el.get("classes", "")).split()


def _is_button(el: Element) -> bool:
    return el.get("role") == "button"


def _field(truth: Truth, name: str) -> str:
    fields = truth.get("fields") or {}
    if name not in fields:
        raise NoPlan(f"{truth.get('task')}: instruction field {name!r} missing ({fields})")
    return str(fields[name])


def click(truth: Truth, el: Element, thought: str) -> Action:
    """A left click on the element's click point (relative grid coordinates)."""
    w, h = truth["screen"]
    x, y = el["hit"]
    return Action(
        name="left_click", coordinate=(to_relative(x, w), to_relative(y, h)), thought=thought
    )


def type_text(text: str, thought: str) -> Action:
    return Action(name="type", text=text, thought=thought)


def _blank_click(truth: Truth, thought: str) -> Action:
    """A click on the instruction bar, which nothing listens to."""
    q = _by_id(truth, "query")
    return click(truth, q, thought)


def _label(el: Element) -> str:
    return str(el.get("label") or el.get("text") or "")


# --- expert plans ------------------------------------------------------------------------


def _click_test(t: Truth) -> list[Action]:
    btn = _by_id(t, "subbtn")
    return [click(t, btn, f'Click the "{btn["text"]}" button.')]


def _click_named_button(t: Truth) -> list[Action]:
    target = _field(t, "target")
    btn = _find(t, f"button {target!r}", lambda e: _is_button(e) and e.get("text") == target)
    return [click(t, btn, f'Click the "{target}" button.')]


def _focus_text(t: Truth) -> list[Action]:
    return [click(t, _by_id(t, "tt"), "Click into the textbox to focus it.")]


_ORDINAL = {"1": "1st", "2": "2nd", "3": "3rd"}


def _focus_text_2(t: Truth) -> list[Action]:
    n = _field(t, "target")
    return [click(t, _by_id(t, f"tt{n}"), f"Click into the {_ORDINAL.get(n, n)} textbox.")]


def _enter_text(t: Truth) -> list[Action]:
    text = _field(t, "target")
    return [
        click(t, _by_id(t, "tt"), "Click the text field."),
        type_text(text, f'Type "{text}".'),
        click(t, _by_id(t, "subbtn"), 'Click "Submit".'),
    ]


def _checkbox_targets(t: Truth) -> set[str]:
    return {v for k, v in (t.get("fields") or {}).items() if k.startswith("target")}


def _click_checkboxes(t: Truth, invert: bool = False) -> list[Action]:
    wanted = _checkbox_targets(t)
    plan = []
    for box in _all(t, lambda e: e.get("tag") == "input_checkbox"):
        should = (_label(box) in wanted) != invert
        if should != bool(box.get("checked")):
            verb = "Check" if should else "Uncheck"
            plan.append(click(t, box, f'{verb} "{_label(box)}".'))
    plan.append(click(t, _by_id(t, "subbtn"), 'Click "Submit".'))
    return plan


def _click_option(t: Truth) -> list[Action]:
    target = _field(t, "target")
    radio = _find(
        t, f"option {target!r}", lambda e: e.get("tag") == "input_radio" and _label(e) == target
    )
    return [
        click(t, radio, f'Select "{target}".'),
        click(t, _by_id(t, "subbtn"), 'Click "Submit".'),
    ]


def _tab_anchor(t: Truth, n: str) -> Element:
    name = f"Tab #{n}"
    return _find(t, name, lambda e: e.get("tag") == "a" and e.get("text") == name)


def _click_tab(t: Truth) -> list[Action]:
    n = _field(t, "target")
    return [click(t, _tab_anchor(t, n), f'Click on "Tab #{n}".')]


def _close_button(t: Truth) -> Element:
    return _find(t, "dialog close button", lambda e: _has_class(e, "ui-dialog-titlebar-close"))


def _click_dialog(t: Truth) -> list[Action]:
    return [click(t, _close_button(t), 'Close the dialog with its "x" button.')]


def _dialog_button(t: Truth, label: str) -> Element:
    if label == "x":
        return _close_button(t)
    return _find(t, f"dialog button {label!r}", lambda e: _is_button(e) and e.get("text") == label)


def _click_dialog_2(t: Truth) -> list[Action]:
    target = _field(t, "target")
    return [click(t, _dialog_button(t, target), f'Click the dialog\'s "{target}" button.')]


def _links(t: Truth) -> list[Element]:
    return _all(t, lambda e: _has_class(e, "alink"))


def _click_link(t: Truth) -> list[Action]:
    target = _field(t, "target")
    link = _find(
        t, f"link {target!r}", lambda e: _has_class(e, "alink") and e.get("text") == target
    )
    return [click(t, link, f'Click the link "{target}".')]


SOLVERS: dict[str, Callable[[Truth], list[Action]]] = {
    "click-test": _click_test,
    "click-test-2": _click_named_button,
    "click-button": _click_named_button,
    "focus-text": _focus_text,
    "focus-text-2": _focus_text_2,
    "enter-text": _enter_text,
    "click-checkboxes": _click_checkboxes,
    "click-option": _click_option,
    "click-tab": _click_tab,
    "click-dialog": _click_dialog,
    "click-dialog-2": _click_dialog_2,
    "click-link": _click_link,
}


# --- wrong plans (score 0): the plausible mistakes -------------------------------------------


def _other(t: Truth, candidates: list[Element], right: str, thought: str) -> list[Action]:
    others = [e for e in candidates if e.get("text") != right]
    if not others:
        return [_blank_click(t, "Click the instruction text.")]
    return [click(t, others[0], thought.format(others[0].get("text")))]


def _wrong_click_named_button(t: Truth) -> list[Action]:
    return _other(t, _all(t, _is_button), _field(t, "target"), 'Click the "{}" button.')


def _wrong_focus_text_2(t: Truth) -> list[Action]:
    n = _field(t, "target")
    other = next(k for k in ("1", "2", "3") if k != n)
    return [click(t, _by_id(t, f"tt{other}"), f"Click into the {_ORDINAL[other]} textbox.")]


def _wrong_enter_text(t: Truth) -> list[Action]:
    text = _field(t, "target")
    wrong = text[::-1] + "x"
    return [
        click(t, _by_id(t, "tt"), "Click the text field."),
        type_text(wrong, f'Type "{wrong}".'),
        click(t, _by_id(t, "subbtn"), 'Click "Submit".'),
    ]


def _wrong_click_option(t: Truth) -> list[Action]:
    target = _field(t, "target")
    radios = _all(t, lambda e: e.get("tag") == "input_radio" and _label(e) != target)
    return [
        click(t, radios[0], f'Select "{_label(radios[0])}".'),
        click(t, _by_id(t, "subbtn"), 'Click "Submit".'),
    ]


def _wrong_click_tab(t: Truth) -> list[Action]:
    n = _field(t, "target")
    other = next(k for k in ("1", "2", "3") if k != n)
    return [click(t, _tab_anchor(t, other), f'Click on "Tab #{other}".')]


def _wrong_click_dialog(t: Truth) -> list[Action]:
    text = _find(t, "dialog text", lambda e: e.get("tag") == "p")
    return [click(t, text, "Click the dialog's text.")]


def _wrong_click_dialog_2(t: Truth) -> list[Action]:
    target = _field(t, "target")
    other = next(b for b in ("x", "OK", "Cancel") if b != target)
    return [click(t, _dialog_button(t, other), f'Click the dialog\'s "{other}" button.')]


def _wrong_click_link(t: Truth) -> list[Action]:
    return _other(t, _links(t), _field(t, "target"), 'Click the link "{}".')


WRONG: dict[str, Callable[[Truth], list[Action]]] = {
    "click-test": lambda t: [_blank_click(t, "Click the instruction text.")],
    "click-test-2": _wrong_click_named_button,
    "click-button": _wrong_click_named_button,
    "focus-text": lambda t: [_blank_click(t, "Click the instruction text.")],
    "focus-text-2": _wrong_focus_text_2,
    "enter-text": _wrong_enter_text,
    "click-checkboxes": lambda t: _click_checkboxes(t, invert=True),
    "click-option": _wrong_click_option,
    "click-tab": _wrong_click_tab,
    "click-dialog": _wrong_click_dialog,
    "click-dialog-2": _wrong_click_dialog_2,
    "click-link": _wrong_click_link,
}


def _plan(table: dict[str, Callable[[Truth], list[Action]]], truth: Truth) -> list[Action]:
    task = truth.get("task")
    if task not in table:
        raise NoPlan(f"no scripted plan for task {task!r}")
    return table[str(task)](truth)


def solve(truth: Truth) -> list[Action]:
    """The expert's actions for the episode in ``truth`` (scores 1)."""
    return _plan(SOLVERS, truth)


def wrong(truth: Truth) -> list[Action]:
    """A plausible wrong action sequence for the episode in ``truth`` (scores 0)."""
    return _plan(WRONG, truth)


async def play(session: Session, actions: list[Action], pause: float = 0.0) -> list[StepResult]:
    """Run actions on a session until the episode is done; returns the step results."""
    results = []
    for action in actions:
        result = await session.act(action, pause=pause)
        results.append(result)
        if result.done:
            break
    return results
