"""Browsers whose environment server died without closing them, found and killed.

A server killed with SIGKILL (the OOM killer, a crashed node agent, the soak) cannot quit its
chromedrivers, and Chromium does not die with its parent: every session's browser would live
on. So each browser process is started with ``COMPUTERSD_ENV_SERVER_PID=<server pid>`` in its
environment (Chromium inherits chromedriver's), and every server sweeps, when it starts and
then once a minute, the processes whose server is gone. Linux ``/proc`` only; elsewhere the
sweep finds nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from pathlib import Path

log = logging.getLogger(__name__)

OWNER_VAR = "COMPUTERSD_ENV_SERVER_PID"


def browser_env() -> dict[str, str]:
    """The environment of a browser this process starts: its owner recorded."""
    return {**os.environ, OWNER_VAR: str(os.getpid())}


def _owner_of(pid_dir: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        for item in (pid_dir / "environ").read_bytes().split(b"\0"):
            if item.startswith(OWNER_VAR.encode() + b"="):
                return int(item.split(b"=", 1)[1])
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_orphan_browsers(proc: Path = Path("/proc")) -> list[int]:
    """SIGKILL every process that names a dead server as its owner; returns their pids."""
    killed: list[int] = []
    if not proc.is_dir():
        return killed
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        owner = _owner_of(entry)
        if owner is None or _alive(owner):
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(entry.name), signal.SIGKILL)
            killed.append(int(entry.name))
    if killed:
        log.warning("killed %d browser processes left by dead servers: %s", len(killed), killed)
    return killed
