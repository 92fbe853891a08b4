"""The local desktop's episode hygiene without a display: when it reverts, what the template
HOME holds, which user a root in-desktop server runs commands as. (On real desktops with real
apps: tests/integration/test_desktop_local.py.)"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from env_client.desktop import local
from env_client.desktop.backend import DesktopBackend
from env_client.desktop.config import DesktopConfig
from env_client.desktop.local import LocalDesktop, prepare_template
from env_client.desktop.vmclient import VMClient


@pytest.fixture
def desktop(tmp_path: Path) -> LocalDesktop:
    """A desktop whose folder and HOME exist, without X (nothing to prewarm)."""
    cfg = DesktopConfig(root=str(tmp_path), prewarm=[], warm_office_profile=False)
    d = LocalDesktop(cfg, 0)
    d.folder.mkdir(parents=True)
    d._fresh_home()
    return d


def test_a_clean_desktop_keeps_its_prewarmed_apps_a_used_one_is_reverted(
    desktop: LocalDesktop, monkeypatch: pytest.MonkeyPatch
) -> None:
    kills: list[set[int]] = []
    monkeypatch.setattr(local, "_kill_all", lambda pids, timeout_s=5.0: kills.append(pids))
    desktop.begin_episode()  # a fresh desktop: its prewarmed apps stay
    assert kills == [] and desktop.used
    (desktop.home / "Documents" / "episode-1.txt").write_text("left behind")
    desktop.begin_episode()  # used: apps killed, HOME fresh from the template
    assert len(kills) == 1
    assert not (desktop.home / "Documents" / "episode-1.txt").exists()
    assert (desktop.home / "Documents").is_dir() and desktop.used


def test_an_action_before_any_reset_makes_the_next_reset_revert(tmp_path: Path) -> None:
    b = DesktopBackend(DesktopConfig(root=str(tmp_path), prewarm=[], warm_office_profile=False), 0)
    b.local = LocalDesktop(b.cfg, 0)
    b.client = object()  # type: ignore[assignment]  # perform([]) sends nothing
    try:
        assert not b.local.used
        b.perform([])
        assert b.local.used
    finally:
        b.close()


def _fake_soffice(bin_dir: Path, calls: Path) -> None:
    """An ``soffice`` that writes what a first start writes, slowly, and counts its runs."""
    bin_dir.mkdir()
    script = bin_dir / "soffice"
    script.write_text(
        "#!/bin/sh\n"
        f"echo run >> {calls}\n"
        "sleep 0.3\n"
        'mkdir -p "$HOME/.config/libreoffice/4/user/extensions" "$HOME/.cache/junk"\n'
        'echo 1 > "$HOME/.config/libreoffice/4/user/extensions/buildid"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


def test_the_warm_template_is_made_once_and_keeps_only_the_office_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = tmp_path / "calls"
    _fake_soffice(tmp_path / "bin", calls)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    root = tmp_path / "desktops"
    threads = [threading.Thread(target=prepare_template, args=(root, True)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    home = root / "template-home"
    assert calls.read_text().splitlines() == ["run"]  # three desktops, one warm-up
    user = home / ".config" / "libreoffice" / "4" / "user"
    assert (user / "extensions" / "buildid").exists()
    assert "WarnAlienFormat" in (user / "registrymodifications.xcu").read_text()
    assert not (home / ".cache").exists()


def _confined_user() -> tuple[int, int] | None:
    try:
        return local.desktop_user(DesktopConfig())
    except local.DesktopStartError:
        return None


@pytest.mark.skipif(_confined_user() is None, reason="needs root and scripts/setup_desktop.sh")
def test_a_root_server_runs_commands_as_the_desktop_user(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Commands and uploads of a root in-desktop server with --run-as: the user's, confined
    (no writing outside HOME, no network)."""
    user = _confined_user()
    assert user is not None
    reachable = Path(tempfile.mkdtemp(prefix="csd-test-"))  # pytest's tmp_path is root's only
    reachable.chmod(0o711)
    request.addfinalizer(lambda: shutil.rmtree(reachable, ignore_errors=True))
    root = reachable / "session"
    home = root / "home"
    home.mkdir(parents=True)
    os.chown(home, *user)
    ready = tmp_path / "ready.json"
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, HOME=str(home), CSD_DESKTOP_TOKEN="t", PYTHONPATH=str(repo))
    argv = [sys.executable, "-m", "env_client.desktop.vmserver", "--display=:none",
            f"--root={root}", "--width=800", "--height=600", f"--ready-file={ready}",
            f"--run-as={user[0]}:{user[1]}", "--no-network"]  # fmt: skip
    proc = subprocess.Popen(argv, env=env, cwd=home)
    try:
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
            time.sleep(0.05)
        client = VMClient(json.loads(ready.read_text())["url"], 10, "t")
        assert client.execute("id -u", shell=True)["output"].strip() == str(user[0])
        marker = repo / f"confined-{os.getpid()}"
        for outside in (marker, Path("/root/confined-x")):
            assert client.execute(f"touch {outside}", shell=True)["returncode"] != 0
        assert client.execute("touch ~/ok", shell=True)["returncode"] == 0
        port = int(client.base_url.rsplit(":", 1)[1])  # this server: reachable from the host
        probe = ["bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{port}"]
        assert subprocess.run(probe, check=False).returncode == 0  # the probe works here
        assert client.execute(probe)["returncode"] != 0  # not from inside
        assert not marker.exists() and not Path("/root/confined-x").exists()
        assert (home / "ok").stat().st_uid == user[0]
        client.upload("~/Documents/in.txt", b"data")  # a new folder and file: the user's
        assert (home / "Documents").stat().st_uid == user[0]
        assert (home / "Documents" / "in.txt").stat().st_uid == user[0]
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_desktop_root_the_user_cannot_reach_is_a_clear_error(tmp_path: Path) -> None:
    if _confined_user() is None:
        pytest.skip("needs root and scripts/setup_desktop.sh")
    hidden = tmp_path / "private"
    hidden.mkdir(mode=0o700)
    d = LocalDesktop(DesktopConfig(root=str(hidden / "desktops")), 0)
    with pytest.raises(local.DesktopStartError, match="cannot reach"):
        d.start()
    assert not d.folder.exists()
