"""Task order: round-robin, and round-robin that passes over saturated tasks."""

from __future__ import annotations

from workflows.online_rl.curriculum import TaskPicker

NAMES = ["a", "b", "c"] * 4  # round_robin's layout: names cycle, instances follow


def test_round_robin_ignores_outcomes() -> None:
    picker = TaskPicker(NAMES)
    for i in range(3):
        picker.record(i, 2, 2)
    assert [picker.pick(s) for s in range(5)] == [0, 1, 2, 3, 4]


def test_informative_skips_a_saturated_task_until_it_is_explored() -> None:
    picker = TaskPicker(NAMES, order="informative", window=2, explore=0.0)
    assert picker.pick(0) == 0  # nothing known yet
    picker.record(NAMES[0], 2, 2)  # "a" solved every time, twice
    picker.record(NAMES[3], 0, 2)
    picker.record(NAMES[1], 1, 2)  # "b" mixed: informative
    assert picker.saturated("a") and not picker.saturated("b")
    assert picker.pick(3) == 4  # entry 3 is "a": passed over to the next instance, a "b"
    assert picker.stats() == {"tasks_saturated": 1, "tasks_skipped": 1}
    picker.record(NAMES[6], 1, 2)  # "a" became informative again
    assert picker.pick(6) == 6


def test_everything_saturated_falls_back_to_round_robin() -> None:
    picker = TaskPicker(NAMES, order="informative", window=1, explore=0.0)
    for i in range(3):
        picker.record(i, 3, 3)
    assert picker.pick(5) == 5


def test_explore_revisits_saturated_tasks_sometimes() -> None:
    picker = TaskPicker(NAMES, order="informative", window=1, explore=0.5, seed=3)
    picker.record(NAMES[0], 2, 2)
    picks = [picker.pick(0) for _ in range(200)]
    share = picks.count(0) / len(picks)
    assert 0.3 < share < 0.7  # "a" still comes up about half of the time
