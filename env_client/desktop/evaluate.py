"""A task's evaluator, as OSWorld's ``DesktopEnv.evaluate`` runs it.

1. ``func == "infeasible"``: 1 if the agent's last action was FAIL, else 0.
2. Otherwise a FAIL answer scores 0 (the agent gave up on a feasible task).
3. ``postconfig`` steps run (e.g. save the document), then each metric gets its ``result``
   (and ``expected``, if given) from the getters plus its ``options``.
4. Several metrics combine by ``conj``: ``and`` is 0 as soon as one metric is 0, else their
   mean; ``or`` is their maximum.

A metric that raises on what the agent produced (an unreadable file, a missing cell) scores 0
and says why in ``Evaluation.notes``; a desktop that cannot be reached raises (that is the
environment's failure, not the agent's).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from env_client.desktop.getters import GETTERS
from env_client.desktop.metrics import METRICS
from env_client.desktop.setup import Context, run_steps
from env_client.desktop.tasks import check_evaluator

log = logging.getLogger(__name__)


@dataclass
class Evaluation:
    score: float
    metrics: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _nth(value: Any, i: int) -> Any:
    return value[i] if isinstance(value, list) else value


def evaluate(ctx: Context, task: dict[str, Any], last_control: str | None) -> Evaluation:
    ev = check_evaluator(task["evaluator"], f"task {task.get('id')!r}")
    funcs = ev.func if isinstance(ev.func, list) else [ev.func]
    if funcs == ["infeasible"]:
        return Evaluation(float(last_control == "FAIL"), notes=["infeasible task"])
    if last_control == "FAIL":
        return Evaluation(0.0, notes=["the agent answered FAIL on a feasible task"])
    run_steps(ctx, ev.postconfig, "evaluator.postconfig")
    out = Evaluation(0.0)
    for i, func in enumerate(funcs):
        score = _one_metric(ctx, func, ev, i, out.notes)
        out.metrics.append(score)
        if ev.conj == "and" and score == 0.0:
            return out
    out.score = max(out.metrics) if ev.conj == "or" else sum(out.metrics) / len(out.metrics)
    return out


def _one_metric(ctx: Context, func: str, ev: Any, i: int, notes: list[str]) -> float:
    result_cfg = _nth(ev.result, i)
    expected_cfg = _nth(ev.expected, i)
    options = _nth(ev.options, i) or {}
    # Getter failures (unreachable desktop, a task's missing expected file) are not the
    # agent's: they raise.
    result = _get(ctx, result_cfg)
    args = [result] if expected_cfg is None else [result, _get(ctx, expected_cfg)]
    try:
        score = METRICS[func](*args, **options)
    except Exception as exc:  # what the agent left behind cannot be read: a failed task
        notes.append(f"{func}: {type(exc).__name__}: {exc}"[:300])
        return 0.0
    notes.append(f"{func}: {float(score):.3f}")
    return min(1.0, max(0.0, float(score)))


def _get(ctx: Context, getter: Any) -> Any:
    config = getter.model_dump()
    return GETTERS[config["type"]](ctx, config)
