"""Fault injection for the embedded server: armed rules, matched per request.

Rules come from ``EmbeddedEnvConfig.faults`` at start or from ``POST /v1/faults`` (enabled by
``fault_api``); see :class:`env_client.config.FaultRule` for their meaning.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from typing import Any

from env_client.config import FaultRule


@dataclass
class _Armed:
    rule_id: int
    rule: FaultRule
    seen: int = 0
    fired: int = 0
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.rule.seed)

    def matches(self, op: str, session_id: str | None, phase: str) -> bool:
        r = self.rule
        return (
            r.phase == phase
            and r.op in (op, "any")
            and (r.session_id is None or r.session_id == session_id)
        )

    @property
    def exhausted(self) -> bool:
        return self.fired >= self.rule.times


class FaultBook:
    """The armed rules; ``take`` says which fault (if any) hits this request now."""

    def __init__(self, rules: list[FaultRule] | None = None) -> None:
        self._ids = itertools.count(1)
        self._armed: list[_Armed] = []
        self.add(rules or [])

    def add(self, rules: list[FaultRule]) -> list[int]:
        armed = [_Armed(next(self._ids), r) for r in rules]
        self._armed.extend(armed)
        return [a.rule_id for a in armed]

    def clear(self) -> None:
        self._armed.clear()

    def take(self, op: str, session_id: str | None, phase: str) -> FaultRule | None:
        """The first rule that fires for this request; every matching rule counts it."""
        hit: FaultRule | None = None
        for armed in self._armed:
            if armed.exhausted or not armed.matches(op, session_id, phase):
                continue
            armed.seen += 1
            if armed.seen <= armed.rule.skip or hit is not None:
                continue
            # A rate draw per eligible request, so the schedule depends on the seed alone.
            if armed.rule.rate >= 1.0 or armed.rng.random() < armed.rule.rate:
                armed.fired += 1
                hit = armed.rule
        return hit

    def snapshot(self) -> list[dict[str, Any]]:
        return [
            {"id": a.rule_id, "rule": a.rule.model_dump(), "seen": a.seen, "fired": a.fired}
            for a in self._armed
        ]
