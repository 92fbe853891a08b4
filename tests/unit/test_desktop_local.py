"""The local desktop's episode hygiene without a display: when it reverts, what the template
HOME holds, which user a root in-desktop server runs commands as. (On real desktops with real
apps: tests/integration/test_desktop_local.py.)"""

from __future__ import annotations

import functools
import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from env_client.desktop import local
from env_client.desktop.backend import DesktopBackend
from env_client.desktop.config import DesktopConfig
from env_client.desktop.confine import (
    Confinement,
    NoDesktopUser,
    UserLease,
    confined,
    holder_argv,
)
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


def _pool_ready() -> bool:
    """Root, and scripts/setup_desktop.sh has made the desktop users."""
    try:
        return os.geteuid() == 0 and pwd.getpwnam("csd-desktop-0").pw_uid != 0
    except KeyError:
        return False


NEEDS_POOL = pytest.mark.skipif(not _pool_ready(), reason="needs root and scripts/setup_desktop.sh")


def _entries(n: int) -> Callable[[str], SimpleNamespace]:
    """A passwd of ``n`` pool users (this test is about the pool, not about passwd)."""

    def lookup(name: str) -> SimpleNamespace:
        prefix, _, k = name.rpartition("-")
        if prefix != "pool" or not k.isdigit() or int(k) >= n:
            raise KeyError(name)
        return SimpleNamespace(pw_uid=5000 + int(k), pw_gid=5000)

    return lookup


def test_each_desktop_takes_a_user_of_its_own_and_gives_it_back(tmp_path: Path) -> None:
    take = functools.partial(UserLease.take, "pool", tmp_path, _entries(2))
    a, b = take(), take()
    assert (a.name, a.uid, b.name, b.uid) == ("pool-0", 5000, "pool-1", 5001)
    with pytest.raises(
        NoDesktopUser, match=r"all 2 desktop users \(pool-0 … pool-1\).*CSD_DESKTOP_USERS=4"
    ):
        take()
    a.release()
    a.release()  # idempotent
    c = take()
    assert c.name == "pool-0"
    # Another server on the machine (another process) sees the same leases.
    probe = (
        "import fcntl, sys\n"
        f"f = open({str(tmp_path / 'pool-1.lock')!r}, 'a')\n"
        "try:\n    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\nexcept BlockingIOError:\n"
        "    sys.exit(3)\n"
    )
    assert subprocess.run([sys.executable, "-c", probe], check=False).returncode == 3
    b.release()
    assert subprocess.run([sys.executable, "-c", probe], check=False).returncode == 0


def test_no_pool_user_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(NoDesktopUser, match=r"no desktop user pool-0.*scripts/setup_desktop\.sh"):
        UserLease.take("pool", tmp_path, _entries(0))
    root = lambda name: SimpleNamespace(pw_uid=0, pw_gid=0)  # noqa: E731
    with pytest.raises(NoDesktopUser, match="is root"):
        UserLease.take("pool", tmp_path, root)


def test_confined_commands_enter_the_desktops_namespaces_as_its_user() -> None:
    conf = Confinement(uid=5001, gid=5000, ns_pid=4242, network=False)
    assert confined(["xterm"], conf, "/d/home") == [
        "nsenter", "--target=4242", "--mount", "--net", "--wdns=/d/home", "--",
        "setpriv", "--reuid=5001", "--regid=5000", "--clear-groups", "--", "xterm",
    ]  # fmt: skip
    online = Confinement(5001, 5000, 4242, network=True)
    assert "--net" not in confined(["xterm"], online, "/d/home")
    assert Confinement.parse(online.flag()) == online
    assert confined(["xterm"], None, "/d/home") == ["xterm"]


@NEEDS_POOL
def test_a_root_server_runs_commands_as_the_desktop_user_in_a_private_tmp(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Commands and uploads of a root in-desktop server with --confine: the pool user's, in
    the desktop's namespaces (no writing outside HOME, a /tmp of its own, no network)."""
    lease = UserLease.take("csd-desktop")
    request.addfinalizer(lease.release)
    reachable = Path(tempfile.mkdtemp(prefix="csd-test-"))  # pytest's tmp_path is root's only
    reachable.chmod(0o711)
    request.addfinalizer(lambda: shutil.rmtree(reachable, ignore_errors=True))
    root = reachable / "session"
    home = root / "home"
    home.mkdir(parents=True)
    os.chown(home, *lease.ids)
    holder = subprocess.Popen(
        holder_argv(sys.executable, [str(root)], network=False), stdout=subprocess.PIPE
    )
    request.addfinalizer(holder.kill)
    assert holder.stdout is not None and holder.stdout.readline().strip() == b"ready"
    conf = Confinement(*lease.ids, ns_pid=holder.pid, network=False)
    ready = tmp_path / "ready.json"
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, HOME=str(home), CSD_DESKTOP_TOKEN="t", PYTHONPATH=str(repo))
    argv = [sys.executable, "-m", "env_client.desktop.vmserver", "--display=:none",
            f"--root={root}", "--width=800", "--height=600", f"--ready-file={ready}",
            f"--confine={conf.flag()}"]  # fmt: skip
    proc = subprocess.Popen(argv, env=env, cwd=home)
    try:
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
            time.sleep(0.05)
        client = VMClient(json.loads(ready.read_text())["url"], 10, "t")
        assert client.execute("id -u", shell=True)["output"].strip() == str(lease.uid)
        assert client.execute("pwd", shell=True)["output"].strip() == str(home)  # cwd kept
        marker = repo / f"confined-{os.getpid()}"
        for outside in (marker, Path("/root/confined-x")):
            assert client.execute(f"touch {outside}", shell=True)["returncode"] != 0
        assert client.execute("touch ~/ok", shell=True)["returncode"] == 0
        # /tmp and /dev/shm are writable, but the desktop's own: nothing reaches the machine's.
        shared = [Path("/tmp") / f"csd-private-{os.getpid()}", Path("/dev/shm") / "csd-x"]
        for p in shared:
            done = client.execute(f"touch {p} && ls {p}", shell=True)
            assert done["returncode"] == 0, done
        assert [p for p in shared if p.exists()] == []
        seen = client.execute(f"ls {reachable} /tmp", shell=True)["output"].split()
        assert "session" in seen and tmp_path.name not in seen
        port = int(client.base_url.rsplit(":", 1)[1])  # this server: reachable from the host
        probe = ["bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{port}"]
        assert subprocess.run(probe, check=False).returncode == 0  # the probe works here
        assert client.execute(probe)["returncode"] != 0  # not from inside
        assert not marker.exists() and not Path("/root/confined-x").exists()
        assert (home / "ok").stat().st_uid == lease.uid
        client.upload("~/Documents/in.txt", b"data")  # a new folder and file: the user's
        assert (home / "Documents").stat().st_uid == lease.uid
        assert (home / "Documents" / "in.txt").stat().st_uid == lease.uid
    finally:
        proc.terminate()
        proc.wait(10)


@NEEDS_POOL
def test_a_desktop_root_the_user_cannot_reach_is_a_clear_error(tmp_path: Path) -> None:
    hidden = tmp_path / "private"
    hidden.mkdir(mode=0o700)
    d = LocalDesktop(DesktopConfig(root=str(hidden / "desktops")), 0)
    with pytest.raises(local.DesktopStartError, match="cannot reach"):
        d.start()
    assert not d.folder.exists()
