"""Analyzer answer parsing (strict, the reference's verdicts) and vote combination: valid,
malformed and adversarial outputs; every way a step gets d = 0."""

from __future__ import annotations

import time

import pytest

from serve_apps.judgment import combine_votes, parse_vote

GOOD = '{"consistency": 1, "effectiveness": 1, "guide": "Click OK.", "avoid": "Cancel."}'


def answer(c: object, e: object, guide: str = "g", avoid: str = "a") -> str:
    return f'{{"consistency": {c}, "effectiveness": {e}, "guide": "{guide}", "avoid": "{avoid}"}}'


def test_valid_answer() -> None:
    vote = parse_vote(GOOD)
    assert (vote.consistency, vote.effectiveness) == (1, 1)
    assert (vote.guide, vote.avoid, vote.errors) == ("Click OK.", "Cancel.", [])
    j = combine_votes([GOOD])
    assert (j.d, j.v, j.status, j.reason) == (1, 1.0, "ok", None)
    assert j.guidance == "[GUIDE]\nClick OK.\n\n[AVOID]\nCancel."
    assert j.raw == [GOOD] and len(j.votes) == 1


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Here you go:\n```json\n" + answer(0, 1) + "\n```\nDone.", (0, 1)),
        (answer('"1"', '" 0 "'), (1, 0)),  # the strings "0"/"1"
        (answer("true", "false"), (1, 0)),  # JSON booleans
        (answer("1.0", "0.0"), (1, 0)),
        ('{"judgment": ' + answer(0, 0) + "}", (0, 0)),  # the first object with all four keys
        ('{"consistency": 1, "effectiveness": 1} then ' + answer(0, 1), (0, 1)),
        (answer(1, 0) + " corrected: " + answer(1, 1), (1, 0)),  # the FIRST one counts
        ('<think>draft {"consistency": 0}</think>' + answer(1, 1), (1, 1)),
        (
            '{"guide": "use {braces} and \\"quotes\\"", "avoid": "", "consistency": 1, '
            '"effectiveness": 0}',
            (1, 0),
        ),
    ],
)
def test_answers_the_reference_accepts(text: str, expected: tuple[int, int]) -> None:
    vote = parse_vote(text)
    assert vote.valid and (vote.consistency, vote.effectiveness) == expected, vote.errors


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('{"consistency": 1, "effectiveness": 1, "guide": "g"}', "no JSON object with"),
        ("I cannot judge this.", "no JSON object with"),
        (answer(2, 1), "consistency=2 is not 0 or 1"),
        (answer(1, '"yes"'), "effectiveness='yes' is not 0 or 1"),
        (answer(1, "null"), "effectiveness=None is not 0 or 1"),
        ('{"consistency": 1, "effectiveness": 1, "guide": 3, "avoid": ""}', "guide=3 is not a"),
        ("{'consistency': 1, 'effectiveness': 1, 'guide': 'g', 'avoid': 'a'}", "no JSON object"),
        ('{"consistency": 1, "effectiveness": 0, "guide": "click the OK butt', "no JSON object"),
        ('{"consistency": NaN, "effectiveness": 1, "guide": "", "avoid": ""}', "is not 0 or 1"),
    ],
)
def test_format_errors_are_not_salvaged(text: str, error: str) -> None:
    vote = parse_vote(text)
    assert not vote.valid and error in vote.errors[0]
    j = combine_votes([text])
    assert (j.d, j.v, j.status) == (0, 0.5, "format_error") and error in j.reason


def test_verdicts_give_the_direction() -> None:
    assert (combine_votes([answer(1, 0)]).d, combine_votes([answer(1, 0)]).v) == (-1, 0.5)
    assert (combine_votes([answer(0, 0)]).d, combine_votes([answer(0, 0)]).v) == (-1, 0.0)


def test_empty_guidance_masks_the_step() -> None:
    j = combine_votes([answer(1, 1, guide="  ", avoid="")])
    assert (j.consistency, j.effectiveness) == (1, 1)
    assert (j.d, j.status, j.guide, j.avoid) == (0, "empty_guidance", "", "")
    one_block = combine_votes([answer(0, 1, guide="", avoid="Do not cancel.")])
    assert (one_block.d, one_block.avoid) == (-1, "Do not cancel.")


def test_majority_of_the_valid_votes() -> None:
    yes, no = answer(1, 1, guide="yes-guide"), answer(1, 0, guide="no-guide", avoid="longer a")
    two_of_three = combine_votes([yes, no, yes])
    assert (two_of_three.consistency, two_of_three.effectiveness, two_of_three.d) == (1, 1, 1)
    assert two_of_three.guide == "yes-guide"  # the guidance of a vote that agrees
    # Format errors do not vote: one valid vote out of three decides, as in the reference.
    assert combine_votes([yes, "garbage", "more garbage"]).d == 1
    assert combine_votes(["garbage", "more"]).status == "format_error"
    assert combine_votes([]).status == "format_error"


def test_a_tie_masks_the_step_but_keeps_the_guidance() -> None:
    tie = combine_votes([answer(1, 1, guide="short"), answer(1, 0, guide="a longer guide")])
    assert (tie.consistency, tie.effectiveness, tie.d, tie.v) == (1, None, 0, 0.5)
    assert tie.status == "no_majority" and "effectiveness: no majority" in tie.reason
    assert tie.guide == "a longer guide"  # equal agreement: the longest guidance


def test_guidance_from_a_valid_vote_when_the_majority_gave_none() -> None:
    j = combine_votes([answer(1, 1, "", ""), answer(1, 1, "", ""), answer(1, 0, "click")])
    assert (j.d, j.guide) == (1, "click")


@pytest.mark.parametrize(
    "text",
    [
        None,
        12345,
        {"consistency": 1},
        "",
        "{" * 100_000,
        "}" * 100_000,
        '{"a":' * 5000 + "1" + "}" * 5000,  # deep nesting: json's recursion limit
        "[" * 100_000 + "]" * 100_000,
        '{"a": "' * 20_000,  # many object starts, each a long failed decode
        '{"consistency": ' + "9" * 10_000 + ', "effectiveness": 1}',
        '{"consistency": 1, "effectiveness": 1, "guide": "' + "x" * 100_000 + '", "avoid": ""}',
        "{__import__('os').system('echo pwned')}",
        '\x00\x01{"consistency": 1}\udcff',
        "{}" * 10_000,
    ],
)
def test_adversarial_outputs_never_raise(text: object) -> None:
    t0 = time.perf_counter()
    j = combine_votes([text])
    assert time.perf_counter() - t0 < 2.0
    assert j.d in (-1, 0, 1) and 0.0 <= j.v <= 1.0
    assert len(j.guide) <= 2000 and len(j.raw) == 1


def test_long_guide_is_cut() -> None:
    j = combine_votes([answer(1, 1, guide="y" * 5000)])
    assert j.d == 1 and len(j.guide) == 2000
