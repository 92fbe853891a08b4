"""Which task a rollout group plays: round-robin, or round-robin that skips saturated tasks.

A group whose G episodes all got the same reward has zero GRPO advantage: its environment time
teaches the policy nothing through the policy gradient. On a warm-started policy most such groups
come from tasks it always solves or never solves (on the embedded default ~75% of groups). The
``informative`` order (``rollout.task_order``) keeps the round-robin cursor but passes over a task
whose last ``window`` groups were all equal-reward, except for a share ``explore`` of the groups, so a
task that becomes learnable (or unlearned) is noticed again. This is the task-level form of
dynamic sampling (DAPO); the rollout budget then goes where the gradient is.

Pure Python; the trajectory buffer holds the job's one :class:`TaskPicker` (it hands out the
group numbers and sees every finished group), so all rollout workers learn from all groups.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any, Literal

TaskOrder = Literal["round_robin", "informative"]


class TaskPicker:
    """``pick(seq)`` → index into the job's task list; ``record(name, …)`` after each group. Saturation is per task *name* (``names[i]`` is the name of entry ``i``): the list
    holds many instances of each name, cycling through the names (``common.pipeline.round_robin``).
    """

    def __init__(
        self,
        names: list[str],
        order: TaskOrder = "round_robin",
        window: int = 2,
        explore: float = 0.2,
        seed: int = 0,
    ) -> None:
        if not names:
            raise ValueError("no tasks to pick from")
        self.names = names
        self.order = order
        self.explore = explore
        self.window = window
        self._recent: dict[str, deque[bool]] = {}
        self._rng = random.Random(seed)
        self.skipped = 0

    def pick(self, seq: int) -> int:
        """The entry of group ``seq``: the round-robin one, or the first one after it whose
        name is not saturated (every name saturated: the round-robin one)."""
        start = seq % len(self.names)
        # One exploration draw per group (not per task passed over, which would let most
        # picks through once many tasks are saturated).
        if self.order == "round_robin" or self._rng.random() < self.explore:
            return start
        for offset in range(min(len(self.names), len(set(self.names)))):
            index = (start + offset) % len(self.names)
            if not self.saturated(self.names[index]):
                self.skipped += offset
                return index
        return start

    def saturated(self, name: str) -> bool:
        """Whether the task's last ``window`` groups all had equal rewards."""
        recent = self._recent.get(name)
        return recent is not None and len(recent) == self.window and not any(recent)

    def record(self, name: str, successes: int, episodes: int) -> None:
        """A finished group of task ``name``: informative unless all its episodes succeeded
        or all failed (equal rewards, zero advantages)."""
        informative = 0 < successes < episodes
        self._recent.setdefault(name, deque(maxlen=self.window)).append(informative)

    def stats(self) -> dict[str, Any]:
        return {
            "tasks_saturated": sum(self.saturated(n) for n in set(self.names)),
            "tasks_skipped": self.skipped,
        }
