"""Process signals shared by the long-running commands (the job, the demo)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """``ray job stop`` and ``kill`` send SIGTERM: unwind like Ctrl-C, so ``finally`` blocks run
    and environment sessions go back. Only the main thread can own a signal handler; elsewhere
    this is a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
