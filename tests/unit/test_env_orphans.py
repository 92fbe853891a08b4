"""The sweep of browsers whose environment server died (real processes, real /proc)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from env_client.server.orphans import OWNER_VAR, kill_orphan_browsers


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_processes_of_a_dead_server_are_killed_and_live_owners_kept() -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    orphan = subprocess.Popen(sleeper, env={**os.environ, OWNER_VAR: str(_dead_pid())})
    owned = subprocess.Popen(sleeper, env={**os.environ, OWNER_VAR: str(os.getpid())})
    try:
        time.sleep(0.2)  # the children's /proc environ is readable once they exec
        killed = kill_orphan_browsers()
        assert orphan.pid in killed and owned.pid not in killed
        assert orphan.wait(10) != 0
        assert owned.poll() is None
    finally:
        for p in (orphan, owned):
            p.kill()
            p.wait()
