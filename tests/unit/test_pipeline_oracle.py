"""The ground-truth oracle: verdicts, remaining plans and guidance texts on recorded page shapes."""

from __future__ import annotations

import json

import pytest

from env_client.actions import Action, invalid
from tests.unit._pipeline_helpers import (
    click_action,
    click_button_truth,
    enter_text_truth,
    transition,
)
from workflows.analyzer.experts import validate_answer
from workflows.analyzer.oracle import (
    OracleError,
    element_at,
    element_names,
    judge,
    judge_transition,
    mismatch_plan,
    remaining_plan,
    stated_actions,
)

OKAY = (24, 73)  # centre of the "okay" button (screen pixels)
CANCEL = (82, 73)


def test_element_at_prefers_the_smallest_meaningful_element() -> None:
    truth = click_button_truth()
    assert element_at(truth, *OKAY)["text"] == "okay"
    assert element_at(truth, 80, 20)["id"] == "query"  # the wrapper has no own text
    assert element_at(truth, 150, 200) is None
    close = {"tag": "button", "role": "button", "text": "Close", "own_text": "Close",
             "classes": "ui-dialog-titlebar-close", "box": [0, 0, 9, 9]}  # fmt: skip
    assert {"x", "close"} <= element_names(close)


def test_stated_actions_reads_the_first_known_verb() -> None:
    assert "left_click" in (stated_actions('Click the "OK" button.') or set())
    assert stated_actions('Type "abc".') == {"type"}
    assert stated_actions("Press enter to submit") is not None
    assert stated_actions("") is None and stated_actions("zzz qqq") is None


def test_right_click_on_the_named_button_is_consistent_and_effective() -> None:
    before, after = click_button_truth(), click_button_truth(done=True, score=1.0)
    j = judge(before, after, click_action(*OKAY, 'Click the "okay" button.'), True, "")
    assert (j.consistency, j.effectiveness) == (1, 1)
    assert "left_click at (" in j.guide and "'okay'" in j.guide
    assert '"' not in j.guide + j.avoid  # single quotes: cheaper inside the JSON answer
    assert "cancel" in j.avoid  # the plausible mistake of the scripted wrong plan


def test_wrong_button_said_and_done_is_consistent_but_not_effective() -> None:
    before, after = click_button_truth(), click_button_truth(done=True, score=0.0)
    j = judge(before, after, click_action(*CANCEL, 'Click the "cancel" button.'), True, "")
    assert (j.consistency, j.effectiveness) == (1, 0)
    assert "'cancel' button" in j.avoid and "okay" in j.guide


def test_saying_one_button_and_clicking_another_is_inconsistent() -> None:
    before, after = click_button_truth(), click_button_truth(done=True, score=1.0)
    j = judge(before, after, click_action(*OKAY, 'Click the "cancel" button.'), True, "")
    assert (j.consistency, j.effectiveness) == (0, 1)
    assert "another" in j.avoid


def test_an_unparsed_answer_is_neither() -> None:
    before = click_button_truth()
    j = judge(before, before, invalid("no tool call"), False, "")
    assert (j.consistency, j.effectiveness) == (0, 0)
    assert "tool call" in j.avoid and "left_click" in j.guide


def test_no_stated_intention_is_inconsistent_even_on_target() -> None:
    before, after = click_button_truth(), click_button_truth(done=True, score=1.0)
    j = judge(before, after, click_action(*OKAY, ""), True, "")
    assert (j.consistency, j.effectiveness) == (0, 1)


def test_remaining_plan_follows_the_page_state() -> None:
    assert len(remaining_plan(enter_text_truth()) or []) == 3
    assert [a.name for a in remaining_plan(enter_text_truth(focused=True)) or []] == [
        "type",
        "left_click",
    ]
    assert len(remaining_plan(enter_text_truth(focused=True, value="Bob")) or []) == 1
    assert len(remaining_plan(enter_text_truth(value="Bob")) or []) == 1  # typed, then left
    assert remaining_plan({**enter_text_truth(), "task": "no-such-task"}) is None


def test_multi_step_progress_is_effective_and_a_wrong_text_is_not() -> None:
    start, focused = enter_text_truth(), enter_text_truth(focused=True)
    step1 = judge(start, focused, click_action(66, 63, "Click the text field."), True, "")
    assert (step1.consistency, step1.effectiveness) == (1, 1)
    assert step1.guide.startswith("Click the text field")
    good = Action(name="type", text="Bob", thought='Type "Bob".')
    typed = enter_text_truth(focused=True, value="Bob")
    assert judge(focused, typed, good, True, "").effectiveness == 1
    bad = Action(name="type", text="Bxb", thought='Type "Bxb".')
    j = judge(focused, enter_text_truth(focused=True, value="Bxb"), bad, True, "")
    assert (j.consistency, j.effectiveness) == (1, 0)
    assert "Bob" in j.guide
    said_other = Action(name="type", text="Bob", thought='Type "Alice".')
    assert judge(focused, typed, said_other, True, "").consistency == 0


def test_mismatch_plan_names_something_else_but_acts_like_the_expert() -> None:
    truth = click_button_truth()
    plan = mismatch_plan(truth)
    assert len(plan) == 1 and plan[0].coordinate is not None
    assert "okay" not in plan[0].thought
    j = judge(truth, click_button_truth(done=True, score=1.0), plan[0], True, "")
    assert (j.consistency, j.effectiveness) == (0, 1)


def test_judge_transition_needs_ground_truth_and_answers_valid_json() -> None:
    before, after = click_button_truth(), click_button_truth(done=True, score=1.0)
    row = transition("t1", before, after, click_action(*OKAY, 'Click the "okay" button.'))
    j = judge_transition(row)
    from workflows.analyzer.experts import judgment_json

    judgment, reason = validate_answer(
        judgment_json(j.consistency, j.effectiveness, j.guide, j.avoid), 400
    )
    assert reason is None and judgment is not None and judgment.d == 1
    with pytest.raises(OracleError, match="ground truth"):
        judge_transition({**row, "truth_before": None})
    assert json.loads(row["action"])["name"] == "left_click"


# Elements-style context of the click-button page: the a11y listing the policy saw.
LISTING = (
    "0 text 'Click on the okay button.' 500 150\n1 button 'okay' 150 347\n2 button 'cancel' 512 347"
)


def test_elements_guidance_names_the_expert_answer_and_an_unnumbered_mistake() -> None:
    from workflows.analyzer.oracle import listed_elements

    assert [e.index for e in listed_elements(LISTING)] == [0, 1, 2]
    assert listed_elements("Previous: none") == []
    before, after = click_button_truth(), click_button_truth(done=True, score=1.0)
    good = judge(before, after, click_action(*OKAY, "click 1"), True, "", LISTING)
    assert (good.consistency, good.effectiveness) == (1, 1)
    assert good.guide == "click 1 (button 'okay')" and good.avoid == "click button 'cancel'"
    lost = click_button_truth(done=True, score=0.0)
    bad = judge(before, lost, click_action(*CANCEL, "click 2"), True, "", LISTING)
    assert bad.effectiveness == 0 and bad.guide == "click 1 (button 'okay')"
    assert bad.avoid == "click button 'cancel'"  # what it did, without a number to copy
    unparsed = judge(before, before, invalid("no answer"), False, "", LISTING)
    assert unparsed.avoid.startswith("an invalid answer")
