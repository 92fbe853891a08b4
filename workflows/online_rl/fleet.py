"""The rollout workers of a job, kept at strength: a worker that dies is replaced.

A rollout worker actor can die (its process killed, its node lost, a bug in its loop). The
fleet notices at the monitor's next poll, tells the buffer (the groups it had in flight end in
the ledger as ``worker_died``; nothing waits for them), kills what is left of the actor and
starts a new one with the same index. Its counters carry over, so the job's totals never go
backwards. Ray is imported inside the methods: the module is safe to import anywhere.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

# Counters a worker reports that are totals (summed across its lives); the rest are states.
_NOT_TOTALS = {"served_version"}


class RolloutFleet:
    """``make(index)`` → a started worker actor; ``run`` method refs are watched."""

    def __init__(self, make: Callable[[int], Any], size: int, buffer: Any) -> None:
        self.make = make
        self.buffer = buffer
        self.workers: list[Any] = [make(i) for i in range(size)]
        self.refs: list[Any] = [w.run.remote() for w in self.workers]
        self.restarts = 0
        self.stopping = False
        self._carried: list[dict[str, float]] = [{} for _ in range(size)]
        self._last: list[dict[str, float]] = [{} for _ in range(size)]

    def check(self) -> list[str]:
        """Replace every worker whose ``run`` ended in an error; returns a line per restart."""
        import ray

        if self.stopping:
            return []
        done, _ = ray.wait(self.refs, num_returns=len(self.refs), timeout=0)
        lines = []
        for ref in done:
            i = self.refs.index(ref)
            try:
                ray.get(ref)
                continue  # a normal end: the buffer closed
            except Exception as exc:  # the actor died, or its loop raised
                lines.append(self._replace(i, exc))
        return lines

    def _replace(self, i: int, exc: BaseException) -> str:
        import ray

        with contextlib.suppress(Exception):  # already gone; else no late answers from it
            ray.kill(self.workers[i], no_restart=True)
        lost = ray.get(self.buffer.worker_lost.remote(i))
        last = self._last[i]
        self._carried[i] = {
            k: self._carried[i].get(k, 0.0) + v for k, v in last.items() if k not in _NOT_TOTALS
        }
        self._last[i] = {}
        self.workers[i] = self.make(i)
        self.refs[i] = self.workers[i].run.remote()
        self.restarts += 1
        cause = type(exc).__name__
        return f"rollout worker {i} died ({cause}): {len(lost)} groups in flight dropped; restarted"

    def stats(self) -> list[dict[str, float]]:
        """Per worker counters (lifetime totals); a dead worker reports its last known ones."""
        import ray

        out = []
        for i, worker in enumerate(self.workers):
            with contextlib.suppress(Exception):  # dead: its last answer stands
                self._last[i] = ray.get(worker.stats.remote(), timeout=30)
            now = self._last[i]
            merged = {k: v + self._carried[i].get(k, 0.0) for k, v in now.items()}
            for k, v in self._carried[i].items():
                merged.setdefault(k, v)
            out.append(merged)
        return out

    def stop(self, timeout_s: float = 120.0) -> None:
        """Workers stop starting groups; in-flight episodes finish and release their sessions
        (cancelled after ``timeout_s``: their release still runs)."""
        import ray

        self.stopping = True
        for worker in self.workers:
            worker.stop.remote()
        _, pending = ray.wait(self.refs, num_returns=len(self.refs), timeout=timeout_s)
        for ref in pending:
            ray.cancel(ref)
        ray.wait(self.refs, num_returns=len(self.refs), timeout=30)
