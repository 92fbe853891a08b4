"""The soak's Ray CLI calls: a failure says why, and a secret printed on stdout is never logged."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from benchmarks.soak import RayCluster


def _cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RayCluster:
    monkeypatch.setenv("RAY_AUTH_MODE", "token")  # restored after the test
    return RayCluster(tmp_path, "soak-unit")


def test_a_failing_command_raises_with_the_tail_of_its_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = _cluster(tmp_path, monkeypatch)
    script = "import sys; print('no token found', file=sys.stderr); sys.exit(3)"
    with pytest.raises(RuntimeError, match=r"(?s)ray start exited 3.*no token found"):
        cluster._run_logged([sys.executable, "-c", script], "ray start")


def test_a_secret_stdout_stays_out_of_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = _cluster(tmp_path, monkeypatch)
    script = "import sys; print('s3' + 'cr3t'); print('generated', file=sys.stderr)"
    cluster._run_logged([sys.executable, "-c", script], "ray get-auth-token", secret_stdout=True)
    cluster._run_logged([sys.executable, "-c", "print('plain')"], "ray start")
    log = (tmp_path / "ray_start.log").read_text()
    assert "generated" in log and "plain" in log
    assert "s3cr3t" not in log
