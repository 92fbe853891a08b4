"""Versioned model slots: every request runs on one (model, version); swaps are atomic.

Two modes, same contract:

- double buffer (two slots): new weights are written into the standby slot while requests keep
  running on the current one; the swap is a reference change on the event loop. A request that
  started before the swap finishes on the old slot, and the next load into that slot waits for
  it. Costs a second copy of the model.
- single slot: a load waits for running requests to finish and holds new ones back while it
  writes in place (the vLLM way; no extra memory, a short pause).

All bookkeeping happens on the event loop; the weight copy itself runs in a worker thread so
the loop keeps answering. Loads are serialized.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

M = TypeVar("M")


@dataclass
class _Slot(Generic[M]):
    model: M
    version: int | None
    inflight: int = 0
    blocked: bool = False


class BrokenModelError(RuntimeError):
    """An in-place load failed half-way; the replica must restart (it reloads the latest)."""


class VersionedSlots(Generic[M]):
    """Holds one or two copies of a model and the version each one carries."""

    def __init__(
        self, model: M, version: int, make_standby: Callable[[M], M] | None = None
    ) -> None:
        self._slots: list[_Slot[M]] = [_Slot(model, version)]
        self._current = 0
        self._make_standby = make_standby
        self._cond = asyncio.Condition()
        self._load_lock = asyncio.Lock()
        self.broken: str | None = None

    @property
    def version(self) -> int:
        version = self._slots[self._current].version
        assert version is not None
        return version

    @property
    def double_buffered(self) -> bool:
        return self._make_standby is not None

    @asynccontextmanager
    async def use(self) -> AsyncIterator[tuple[M, int]]:
        """Hold the current model for one request; yields ``(model, version)``."""
        async with self._cond:
            await self._cond.wait_for(lambda: not self._slots[self._current].blocked)
            if self.broken:
                raise BrokenModelError(self.broken)
            slot = self._slots[self._current]
            slot.inflight += 1
        try:
            assert slot.version is not None
            yield slot.model, slot.version
        finally:
            async with self._cond:
                slot.inflight -= 1
                self._cond.notify_all()

    async def swap_in(
        self,
        version: int,
        load: Callable[[M], Any] | Callable[[M], Awaitable[None]],
        run_in_thread: bool = True,
    ) -> None:
        """Run ``load(model)`` on a slot no request uses (in a thread, or awaited when
        ``run_in_thread`` is False), then make it current with ``version``. If ``load``
        raises, the current version stays and the error propagates (single-slot mode then
        marks the model broken: it was written in place)."""
        async with self._load_lock:
            target = await self._target_slot()
            async with self._cond:
                target.blocked = True
                await self._cond.wait_for(lambda: target.inflight == 0)
            try:
                if run_in_thread:
                    await asyncio.to_thread(load, target.model)
                else:
                    await load(target.model)
            except BaseException as exc:
                await self._after_failure(target, exc)
                raise
            async with self._cond:
                target.version = version
                target.blocked = False
                self._current = self._slots.index(target)
                self._cond.notify_all()

    async def _target_slot(self) -> _Slot[M]:
        if self._make_standby is None:
            return self._slots[0]
        if len(self._slots) == 1:
            make = self._make_standby
            standby = await asyncio.to_thread(make, self._slots[0].model)
            self._slots.append(_Slot(standby, None))
        return self._slots[1 - self._current]

    async def _after_failure(self, target: _Slot[M], exc: BaseException) -> None:
        async with self._cond:
            if self._make_standby is None:
                self.broken = f"in-place weight load failed: {exc!r}"
            else:
                target.version = None  # never served until a later load rewrites it
            target.blocked = False
            self._cond.notify_all()
