"""How a root server confines a desktop's processes (``DesktopConfig.desktop_user``).

Each desktop gets three things of its own:

- **a user** from a pool (``csd-desktop-0``, ``csd-desktop-1``, …; made by
  ``scripts/setup_desktop.sh``), taken while the desktop lives (:class:`UserLease`): desktops
  cannot read each other's HOME (0700), signal each other's processes or touch their files;
- **a mount namespace** in which the machine's shared writable folders (``/tmp``, ``/var/tmp``,
  ``/dev/shm``, ``/run/lock``) are empty tmpfs of the desktop's own, with only its session folder
  and its X socket put back (:mod:`env_client.desktop.nsholder` holds it): nothing a task writes
  outside its session folder reaches the machine or another desktop;
- **a network namespace** (unless ``network``) with nothing but a loopback that is down: no TCP
  or UDP service of this machine (the environment server, Ray's job API), nothing outside it.
  The X display is reached through its socket file.

Every process of the desktop enters both namespaces through ``nsenter`` and drops to the user
with ``setpriv`` (util-linux; both exec in place: same pid, process group and environment)::

    conf = Confinement(uid=999, gid=995, ns_pid=4242, network=False)
    argv = confined(["xterm"], conf, cwd="/tmp/csd-desktops/desk-d0-ab12/home")
    # ['nsenter', '--target=4242', '--mount', '--net', '--wdns=/tmp/csd-desktops/desk-d0-ab12/home',
    #  '--', 'setpriv', '--reuid=999', '--regid=995', '--clear-groups', '--', 'xterm']

Without a confinement (the server is not root) the command is returned unchanged.
"""

from __future__ import annotations

import contextlib
import fcntl
import pwd
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

WRAPPERS = ("unshare", "nsenter", "setpriv", "mount")


@dataclass(frozen=True)
class Confinement:
    """Who a desktop's processes run as and which namespaces they enter."""

    uid: int
    gid: int
    ns_pid: int  # the desktop's namespace holder
    network: bool  # False: the holder's empty network namespace is entered too

    def flag(self) -> str:
        """The in-desktop server's ``--confine`` value."""
        return f"{self.uid}:{self.gid}:{self.ns_pid}:{int(self.network)}"

    @classmethod
    def parse(cls, text: str) -> Confinement:
        uid, gid, pid, network = (int(v) for v in text.split(":"))
        return cls(uid, gid, pid, bool(network))


def confined(argv: list[str], conf: Confinement | None, cwd: str | Path) -> list[str]:
    """``argv`` run inside the desktop's namespaces as its user, in ``cwd`` (entering a mount
    namespace moves to its root, so the directory is set again); unchanged without one."""
    if conf is None:
        return list(argv)
    enter = ["nsenter", f"--target={conf.ns_pid}", "--mount", *([] if conf.network else ["--net"])]
    enter.append(f"--wdns={cwd}")
    drop = ["setpriv", f"--reuid={conf.uid}", f"--regid={conf.gid}", "--clear-groups", "--"]
    return [*enter, "--", *drop, *argv]


def holder_argv(python: str, keep: list[str], network: bool) -> list[str]:
    """The command that starts a desktop's namespace holder (run as root)."""
    script = str(Path(__file__).with_name("nsholder.py"))
    unshare = ["unshare", "--mount", "--propagation=private", *([] if network else ["--net"])]
    return [*unshare, "--", python, "-I", "-S", script, *(f"--keep={k}" for k in keep)]


class NoDesktopUser(RuntimeError):
    """No pool user is free (or none exists); the message says what to run."""


class UserLease:
    """One user of the pool ``<prefix>-0``, ``<prefix>-1``, … held by this desktop.

    Held with an exclusive ``flock`` on ``<lock_dir>/<name>.lock``: free again when released
    or when the holding process dies, and never shared by two desktops, of this server or of
    another one on the machine."""

    def __init__(self, name: str, uid: int, gid: int, lock: IO[Any]) -> None:
        self.name, self.uid, self.gid = name, uid, gid
        self._lock: IO[Any] | None = lock

    @classmethod
    def take(
        cls,
        prefix: str,
        lock_dir: Path | None = None,
        lookup: Callable[[str], Any] = pwd.getpwnam,
    ) -> UserLease:
        folder = lock_dir or Path(tempfile.gettempdir()) / "csd-desktop-users"
        folder.mkdir(mode=0o700, exist_ok=True)
        k = 0
        while True:
            name = f"{prefix}-{k}"
            try:
                entry = lookup(name)
            except KeyError:
                break
            if entry.pw_uid == 0:
                raise NoDesktopUser(f"desktop user {name!r} is root")
            lock = open(folder / f"{name}.lock", "a")  # noqa: SIM115 (held while the lease lives)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.close()
                k += 1
                continue
            return cls(name, entry.pw_uid, entry.pw_gid, lock)
        if k == 0:
            raise NoDesktopUser(
                f"no desktop user {prefix}-0 to run the desktop as (the server is root): run "
                "scripts/setup_desktop.sh, or set desktop.desktop_user='' to run apps as root"
            )
        raise NoDesktopUser(
            f"all {k} desktop users ({prefix}-0 … {prefix}-{k - 1}) run a desktop: lower the "
            f"capacity, or make more with CSD_DESKTOP_USERS={2 * k} bash scripts/setup_desktop.sh"
        )

    @property
    def ids(self) -> tuple[int, int]:
        return self.uid, self.gid

    def release(self) -> None:
        if self._lock is not None:
            with contextlib.suppress(OSError):
                self._lock.close()  # closing the file drops the flock
            self._lock = None
