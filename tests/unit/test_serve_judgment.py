"""Analyzer answer parsing and vote combination: valid, malformed and adversarial outputs."""

from __future__ import annotations

import time

import pytest

from serve_apps.judgment import combine_votes, parse_vote

GOOD = '{"consistency": 1, "effectiveness": 1, "guide": "Click OK.", "avoid": "Cancel."}'


def test_valid_answer() -> None:
    vote = parse_vote(GOOD)
    assert (vote.consistency, vote.effectiveness) == (1, 1)
    assert (vote.guide, vote.avoid, vote.errors) == ("Click OK.", "Cancel.", [])
    j = combine_votes([GOOD])
    assert (j.d, j.v, j.reason) == (1, 1.0, None)
    assert j.guidance == "[GUIDE]\nClick OK.\n\n[AVOID]\nCancel."
    assert j.raw == [GOOD] and len(j.votes) == 1


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('Here you go:\n```json\n{"consistency": 0, "effectiveness": 1}\n```\nDone.', (0, 1)),
        ('```\n{"consistency": "1", "effectiveness": "no"}\n```', (1, 0)),
        ('{"Consistency": true, " EFFECTIVENESS ": false}', (1, 0)),
        ('{"consistency": 1.0, "effectiveness": 0.0}', (1, 0)),
        ("{'consistency': 1, 'effectiveness': True, 'guide': 'x'}", (1, 1)),  # Python literal
        ('{"judgment": {"consistency": 0, "effectiveness": 0}}', (0, 0)),  # nested one level
        (
            '<think>maybe {"consistency": 0, "effectiveness": 0}</think>{"consistency": 1, "effectiveness": 1}',
            (1, 1),
        ),
        (
            '{"guide": "use {braces} and \\"quotes\\"", "consistency": 1, "effectiveness": 0}',
            (1, 0),
        ),
        (
            'first {"consistency": 0, "effectiveness": 0} then corrected {"consistency": 1, "effectiveness": 1}',
            (1, 1),
        ),
    ],
)
def test_extra_text_fences_and_variants(text: str, expected: tuple[int, int]) -> None:
    vote = parse_vote(text)
    assert (vote.consistency, vote.effectiveness) == expected, vote.errors


def test_missing_and_invalid_fields_mask_the_step() -> None:
    missing = combine_votes(['{"consistency": 1, "guide": "g"}'])
    assert missing.effectiveness is None and missing.d == 0 and missing.v == 0.5
    assert "effectiveness missing" in missing.reason
    invalid = combine_votes(['{"consistency": 2, "effectiveness": "maybe"}'])
    assert invalid.d == 0 and "consistency=2 is not 0/1" in invalid.reason
    assert "effectiveness='maybe' is not 0/1" in invalid.reason
    nothing = combine_votes(["I cannot judge this."])
    assert nothing.d == 0 and "no JSON object" in nothing.reason
    bad_direction = combine_votes(['{"consistency": 1, "effectiveness": 0}'])
    assert (bad_direction.d, bad_direction.v) == (-1, 0.5)
    worst = combine_votes(['{"consistency": 0, "effectiveness": 0}'])
    assert (worst.d, worst.v) == (-1, 0.0)


def test_truncated_json_is_salvaged_field_by_field() -> None:
    vote = parse_vote('{"consistency": 1, "effectiveness": 0, "guide": "click the OK butt')
    assert (vote.consistency, vote.effectiveness) == (1, 0)
    assert "recovered fields from malformed JSON" in vote.errors
    conflicting = parse_vote('"consistency": 1, "consistency": 0, "effectiveness": 1 {')
    assert conflicting.consistency is None and conflicting.effectiveness == 1


def test_duplicate_key_with_different_values_is_ambiguous() -> None:
    vote = parse_vote('{"consistency": 1, "consistency": 0, "effectiveness": 1}')
    assert vote.consistency is None and vote.effectiveness == 1
    assert "consistency given twice with different values" in vote.errors
    same = parse_vote('{"consistency": 1, "consistency": 1, "effectiveness": 1}')
    assert same.consistency == 1


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
        '{"consistency": ' + "9" * 10_000 + ', "effectiveness": 1}',
        '{"consistency": 1, "effectiveness": 1, "guide": "' + "x" * 100_000 + '"}',
        '{"consistency": NaN, "effectiveness": Infinity}',
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
    j = combine_votes(['{"consistency": 1, "effectiveness": 1, "guide": "' + "y" * 5000 + '"}'])
    assert j.d == 1 and len(j.guide) == 2000


def test_majority_of_all_k_votes() -> None:
    yes = '{"consistency": 1, "effectiveness": 1, "guide": "yes-guide"}'
    no = '{"consistency": 1, "effectiveness": 0, "guide": "no-guide", "avoid": "a"}'
    two_of_three = combine_votes([yes, no, yes])
    assert (two_of_three.consistency, two_of_three.effectiveness, two_of_three.d) == (1, 1, 1)
    assert two_of_three.guide == "yes-guide"  # from a vote that agrees with the outcome
    tie = combine_votes([yes, no])
    assert tie.effectiveness is None and tie.d == 0
    assert "effectiveness: no majority (1x1, 1x0, 0 invalid of 2)" in tie.reason
    # One valid vote out of three is not a majority.
    weak = combine_votes([yes, "garbage", "more garbage"])
    assert weak.d == 0 and weak.consistency is None
    assert "vote 1: no JSON object" in weak.reason
    strong = combine_votes([no, no, "garbage"])
    assert (strong.d, strong.guide, strong.avoid) == (-1, "no-guide", "a")
    assert combine_votes([]).d == 0
