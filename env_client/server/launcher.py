"""Start and stop the embedded environment server as a subprocess.

    with start_embedded_server(EmbeddedEnvConfig(capacity=2)) as server:
        ...  # EnvClient(EnvClientConfig(server_url=server.url))

The child runs ``python -m env_client.server`` in its own process group (so stopping it also
stops its chromedriver and Chromium processes), exits by itself if this process dies, and
logs to ``server.log_path``.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

from env_client.config import EmbeddedEnvConfig


class EmbeddedServerError(RuntimeError):
    """The embedded server did not come up; the message carries the end of its log."""


class EmbeddedServer:
    """Handle of a running embedded server: ``url``, ``pid``, ``log_path``, ``stop()``."""

    def __init__(
        self, proc: subprocess.Popen[bytes], url: str, log_path: Path, scratch: Path | None = None
    ) -> None:
        self.proc = proc
        self.url = url
        self.log_path = log_path
        self.pid = proc.pid
        self._scratch = scratch  # ready file and default log: removed on stop
        atexit.register(self.stop)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM (browsers close cleanly), then SIGKILL the whole process group."""
        atexit.unregister(self.stop)
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout_s)
        # Stragglers of our own group (chromedriver, chromium) go too; the group id is the
        # child's pid because it was started in a new session.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and self._group_exists():
            time.sleep(0.05)  # killed children linger until init reaps them
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    def _group_exists(self) -> bool:
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def __enter__(self) -> EmbeddedServer:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _child_env() -> dict[str, str]:
    """This process's environment, with the directory holding env_client on PYTHONPATH."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def start_embedded_server(
    cfg: EmbeddedEnvConfig | None = None,
    *,
    timeout_s: float = 120.0,
    log_path: str | Path | None = None,
) -> EmbeddedServer:
    """Start ``python -m env_client.server`` and wait until it listens with browsers up."""
    cfg = cfg or EmbeddedEnvConfig()
    workdir = Path(tempfile.mkdtemp(prefix="env-server-"))
    ready = workdir / "ready.json"
    log = Path(log_path) if log_path else workdir / "server.log"
    cmd = [
        sys.executable, "-m", "env_client.server",
        "--config-json", cfg.model_dump_json(),
        "--ready-file", str(ready),
        "--parent-pid", str(os.getpid()),
    ]  # fmt: skip
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=_child_env(), start_new_session=True
        )
    deadline = time.monotonic() + timeout_s
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            handle = EmbeddedServer(proc, "", log, workdir)
            why = f"exited with {proc.returncode}" if proc.poll() is not None else "timed out"
            tail = handle.log_tail()
            handle.stop()
            raise EmbeddedServerError(f"embedded env server {why}; log:\n{tail}")
        time.sleep(0.05)
    url = json.loads(ready.read_text())["url"]
    return EmbeddedServer(proc, url, log, workdir)
