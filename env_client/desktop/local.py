"""One local desktop: a session folder, an Xvfb display, a window manager, our in-desktop server.

Isolation and cleanup:
- Everything the desktop writes goes under its session folder ``<root>/desk-<n>-<hex>``: HOME,
  TMPDIR and the XDG folders point there, and the in-desktop server refuses file paths outside
  it. ``close()`` removes the folder.
- Every process is started with the desktop's tag in its environment (``CSD_DESKTOP_TAG``) and
  in the desktop's process group (Xvfb's). ``close()`` kills the group, then any process still
  carrying the tag (an app that started its own session), so nothing outlives the desktop.
- ``revert()`` is the local stand-in for OSWorld's snapshot revert between episodes: every app
  process of the desktop is killed and HOME is recreated from a fresh copy of the template (an
  app profile prepared once per server, see :func:`prepare_template`).

Confinement (``cfg.desktop_user``; :mod:`env_client.desktop.confine`): when the server runs as
root, everything of the desktop an agent can drive (window manager, apps, terminal, setup
commands) runs as a pool user of its own that owns HOME and TMPDIR and nothing else, inside the
desktop's own mount namespace (``/tmp``, ``/var/tmp``, ``/dev/shm`` and ``/run/lock`` are empty
tmpfs of its own holding only its session folder and X socket) and, by default, an empty network
namespace. A command typed into the terminal cannot write to the project, root's files, the
machine's shared folders or another desktop's, nor reach the machine's services. Xvfb and the
in-desktop server stay root outside (the server's interpreter may be unreadable to that user);
the server starts every process confined and hands the user the files it uploads. On close,
every process of that user is killed before the user goes back to the pool.

Pre-warming (``cfg.prewarm``): a desktop that has not served an episode yet runs the prewarm
commands in the background (by default an invisible LibreOffice with no document), started
right after the desktop and after each revert, off the episode's critical path. The first
episode's ``open`` then hands its file to the running LibreOffice instead of cold-starting one.
``begin_episode()`` reverts only a desktop that has been used (an episode, or an action before
one); a desktop that is still clean holds nothing but the template HOME and the document-less
prewarmed apps, so nothing of an earlier episode can reach the next one.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import logging
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from env_client.desktop.config import DesktopConfig
from env_client.desktop.confine import (
    WRAPPERS,
    Confinement,
    NoDesktopUser,
    UserLease,
    confined,
    holder_argv,
)

log = logging.getLogger(__name__)
TAG_VAR = "CSD_DESKTOP_TAG"
REQUIRED_BINARIES = ("Xvfb", "xdotool", "wmctrl", *WRAPPERS)
# AT-SPI (cfg.atspi): the accessibility bus's config and the registry, from at-spi2-core.
A11Y_CONF = Path("/usr/share/defaults/at-spi2/accessibility.conf")
REGISTRYD = Path("/usr/libexec/at-spi2-registryd")
LO_GTK3 = Path("/usr/lib/libreoffice/program/libvclplug_gtk3lo.so")
_warned: set[str] = set()

# LibreOffice settings of the template profile: no first-start and tip dialogs, no "keep
# format?" question on saving .xlsx/.docx (it would make ctrl+s a two-step action), no
# document-recovery dialog after an app was killed.
_LO_SETTINGS = {
    ("/org.openoffice.Office.Common/Save/Document", "WarnAlienFormat"): ("boolean", "false"),
    ("/org.openoffice.Office.Common/Misc", "ShowTipOfTheDay"): ("boolean", "false"),
    ("/org.openoffice.Office.Common/Misc", "FirstRun"): ("boolean", "false"),
    ("/org.openoffice.Setup/Office", "ooSetupInstCompleted"): ("boolean", "true"),
    ("/org.openoffice.Office.Recovery/RecoveryInfo", "Enabled"): ("boolean", "false"),
    ("/org.openoffice.Office.Recovery/AutoSave", "Enabled"): ("boolean", "false"),
    ("/org.openoffice.Office.Common/Save/Document", "CreateBackup"): ("boolean", "false"),
}


class DesktopStartError(RuntimeError):
    """The desktop could not start; the message says which part and why."""


def missing_binaries(cfg: DesktopConfig) -> list[str]:
    """Programs a local desktop needs that are not on PATH (the WM included)."""
    need = [*REQUIRED_BINARIES, cfg.window_manager[0]]
    return [b for b in need if shutil.which(b) is None]


def atspi_missing() -> list[str]:
    """What AT-SPI trees need and this machine lacks ([] when all is there)."""
    missing = [] if shutil.which("dbus-daemon") else ["dbus-daemon"]
    missing += [str(p) for p in (A11Y_CONF, REGISTRYD) if not p.exists()]
    if importlib.util.find_spec("jeepney") is None:
        missing.append("the Python package jeepney")
    return missing


def atspi_ready(cfg: DesktopConfig) -> bool:
    """Whether local desktops of ``cfg`` get AT-SPI trees."""
    return cfg.atspi and cfg.accessibility and not atspi_missing()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


def lo_registry() -> str:
    """registrymodifications.xcu holding :data:`_LO_SETTINGS`."""
    items = "\n".join(
        f'<item oor:path="{path}"><prop oor:name="{name}" oor:op="fuse">'
        f"<value>{value}</value></prop></item>"
        for (path, name), (_, value) in _LO_SETTINGS.items()
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<oor:items xmlns:oor="http://openoffice.org/2001/registry" '
        'xmlns:xs="http://www.w3.org/2001/XMLSchema" '
        'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">\n'
        f"{items}\n</oor:items>\n"
    )


def prepare_template(folder: Path, warm_office: bool = False) -> Path:
    """The HOME every desktop starts from (made once per root): the usual folders and a
    LibreOffice profile with the settings above; with ``warm_office`` the profile is also
    completed by one headless LibreOffice start (what a first start writes, done once)."""
    home = folder / "template-home"
    if (home / ".ready").exists():
        return home
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "template.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # desktops of several threads/processes share it
        if (home / ".ready").exists():
            return home
        for sub in ("Desktop", "Documents", "Downloads"):
            (home / sub).mkdir(parents=True, exist_ok=True)
        user = home / ".config" / "libreoffice" / "4" / "user"
        user.mkdir(parents=True, exist_ok=True)
        (user / "registrymodifications.xcu").write_text(lo_registry())
        if warm_office and shutil.which("soffice"):
            _warm_office(home)
        (home / ".ready").write_text("1")
    return home


def _warm_office(home: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL")}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"))
    env.update(XDG_CACHE_HOME=str(home / ".cache"), DBUS_SESSION_BUS_ADDRESS="disabled:")
    argv = ["soffice", "--headless", "--norestore", "--terminate_after_init"]
    try:
        subprocess.run(argv, env=env, cwd=home, capture_output=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        log.warning("warming the LibreOffice profile timed out; the template stays cold")
    for junk in (".cache", ".local"):
        shutil.rmtree(home / junk, ignore_errors=True)


class LocalDesktop:
    """Start, revert and close one local desktop; ``url``/``token`` reach its server."""

    def __init__(self, cfg: DesktopConfig, index: int) -> None:
        self.cfg = cfg
        self.index = index
        self.tag = f"d{index}-{secrets.token_hex(6)}"
        self.folder = Path(cfg.root).resolve() / f"desk-{self.tag}"
        self.home = self.folder / "home"
        self.token = secrets.token_urlsafe(24)
        self.display: str | None = None
        self.url: str | None = None
        self.xvfb: subprocess.Popen[bytes] | None = None
        self.core_pids: set[int] = set()
        self.procs: list[subprocess.Popen[bytes]] = []  # waited for on close (no zombies)
        self.used = False  # has served an episode (or an action) since start or the last revert
        self.lease: UserLease | None = None  # the pool user the desktop's processes run as
        self.user: tuple[int, int] | None = None  # its (uid, gid)
        self.conf: Confinement | None = None  # that user + the desktop's namespaces
        self.a11y_bus: Path | None = None  # the socket of its AT-SPI bus, once started

    # --- start -------------------------------------------------------------------------

    def start(self) -> None:
        missing = missing_binaries(self.cfg)
        if missing:
            raise DesktopStartError(
                f"missing programs {missing}: run scripts/setup_desktop.sh (opt-in set-up)"
            )
        self.lease = take_user(self.cfg)
        self.user = self.lease.ids if self.lease else None
        try:
            self.folder.mkdir(parents=True, exist_ok=False)
            self.folder.chmod(0o755)  # root's logs and ready file; HOME and TMPDIR: the user's
            if self.lease is not None and not _traversable(self.folder, *self.lease.ids):
                raise DesktopStartError(
                    f"user {self.lease.name!r} cannot reach {self.folder}: put desktop.root "
                    "under folders others may enter (the default /tmp/csd-desktops is)"
                )
            self._fresh_home()
            self._start_x()
            self._start_namespace()
            self._start_atspi()
            self._start_wm()
            self._start_server()
            self._prewarm()
        except BaseException:
            self.close()
            raise

    def env(self) -> dict[str, str]:
        """The environment of every process of the desktop."""
        keep = ("PATH", "LANG", "LC_ALL", "PYTHONPATH", "VIRTUAL_ENV")
        env = {k: os.environ[k] for k in keep if k in os.environ}
        tmp = self.folder / "tmp"
        env.update(
            HOME=str(self.home),
            TMPDIR=str(tmp),
            XDG_CONFIG_HOME=str(self.home / ".config"),
            XDG_CACHE_HOME=str(self.home / ".cache"),
            XDG_DATA_HOME=str(self.home / ".local" / "share"),
            XDG_RUNTIME_DIR=str(tmp / "runtime"),
            # No session bus: apps would start daemons of their own outside the group.
            DBUS_SESSION_BUS_ADDRESS="disabled:",
            SAL_USE_VCLPLUGIN=self.office_ui(),
            **{TAG_VAR: self.tag},
        )
        if self.a11y_bus is not None:
            env["AT_SPI_BUS_ADDRESS"] = f"unix:path={self.a11y_bus}"
        else:  # no bus of its own: the apps' AT-SPI bridges would look for (and start) one
            env["NO_AT_BRIDGE"] = "1"
        if self.display:
            env["DISPLAY"] = self.display
        return env

    def office_ui(self) -> str:
        """LibreOffice's VCL plugin on this desktop (``cfg.office_ui``; gen when gtk3 is
        asked for but not installed)."""
        if self.cfg.office_ui == "gtk3" and not LO_GTK3.exists():
            _warn_once(f"office_ui gtk3: {LO_GTK3} missing (package libreoffice-gtk3); using gen")
            return "gen"
        return self.cfg.office_ui

    def _fresh_home(self) -> None:
        template = prepare_template(self.folder.parent, self.cfg.warm_office_profile)
        if self.home.exists():
            shutil.rmtree(self.home)
        shutil.copytree(template, self.home, ignore=shutil.ignore_patterns(".ready"))
        tmp = self.folder / "tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "runtime").mkdir(parents=True)
        (tmp / "runtime").chmod(0o700)
        self.home.chmod(0o700)
        if self.user is not None:
            for top in (self.home, tmp):
                _chown_tree(top, *self.user)

    def _start_x(self) -> None:
        read_fd, write_fd = os.pipe()
        size = f"{self.cfg.screen_width}x{self.cfg.screen_height}x24"
        self.xvfb = subprocess.Popen(
            ["Xvfb", "-displayfd", str(write_fd), "-screen", "0", size, "-nolisten", "tcp"],
            pass_fds=(write_fd,),
            env=self.env(),
            process_group=0,  # its own group, which every process of the desktop joins
            stdout=subprocess.DEVNULL,
            stderr=self._log("xvfb"),
        )
        os.close(write_fd)
        self.core_pids.add(self.xvfb.pid)
        self.procs.append(self.xvfb)
        number = _read_line(read_fd, self.cfg.start_timeout_s)
        if not number.isdigit():
            raise DesktopStartError(f"Xvfb gave no display number; see {self.folder}/xvfb.log")
        self.display = f":{number}"

    def _start_namespace(self) -> None:
        """A root server's desktop: start the holder of its mount (and network) namespace,
        with its session folder and X socket kept (``env_client.desktop.nsholder``)."""
        if self.user is None:
            return
        assert self.xvfb is not None and self.display is not None
        x_socket = f"/tmp/.X11-unix/X{self.display.lstrip(':')}"
        keep = [str(self.folder), x_socket]
        read_fd, write_fd = os.pipe()
        holder = subprocess.Popen(
            holder_argv(sys.executable, keep, self.cfg.desktop_network),
            env=self.env(),
            process_group=self.xvfb.pid,
            stdin=subprocess.DEVNULL,
            stdout=write_fd,
            stderr=self._log("namespace"),
        )
        os.close(write_fd)
        self.core_pids.add(holder.pid)
        self.procs.append(holder)
        if _read_line(read_fd, self.cfg.start_timeout_s) != "ready":
            raise DesktopStartError(
                f"the desktop's private namespace did not start; see {self.folder}/namespace.log"
            )
        assert self.lease is not None
        self.conf = Confinement(
            self.lease.uid, self.lease.gid, holder.pid, self.cfg.desktop_network
        )

    def _start_atspi(self) -> None:
        """The desktop's own accessibility bus and AT-SPI registry (``cfg.atspi``), as its
        user; the socket lies in the session folder, outside what a revert renews."""
        if not atspi_ready(self.cfg):
            if self.cfg.atspi and self.cfg.accessibility:
                _warn_once(f"AT-SPI trees off (window lists only): missing {atspi_missing()}; "
                           "run scripts/setup_desktop.sh")  # fmt: skip
            return
        folder = self.folder / "a11y"
        folder.mkdir(mode=0o700)
        if self.user is not None:
            os.chown(folder, *self.user)
        bus = folder / "bus"
        argv = ["dbus-daemon", f"--config-file={A11Y_CONF}", "--nofork"]
        self._spawn([*argv, f"--address=unix:path={bus}"], "a11y")
        deadline = time.monotonic() + self.cfg.start_timeout_s
        while not bus.exists():
            if time.monotonic() > deadline:
                raise DesktopStartError(
                    f"the accessibility bus did not start; see {self.folder}/a11y.log"
                )
            time.sleep(0.02)
        self.a11y_bus = bus
        self._spawn([str(REGISTRYD)], "a11y")  # env() now names the bus

    def _log(self, name: str) -> int:
        return os.open(self.folder / f"{name}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def _spawn(self, argv: list[str], name: str, core: bool = True) -> subprocess.Popen[bytes]:
        assert self.xvfb is not None
        proc = subprocess.Popen(
            confined(argv, self.conf, self.home),
            env=self.env(),
            cwd=self.home,
            process_group=self.xvfb.pid,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._log(name),
        )
        if core:
            self.core_pids.add(proc.pid)
        self.procs = [p for p in self.procs if p.poll() is None]  # reap the apps killed so far
        self.procs.append(proc)
        return proc

    def _prewarm(self) -> None:
        """Start the prewarm apps in the background (not waited for); revert kills them."""
        for argv in self.cfg.prewarm:
            if shutil.which(argv[0]) is None:
                log.warning("prewarm: %s not installed; skipped", argv[0])
                continue
            self._spawn(list(argv), "prewarm", core=False)

    def _start_wm(self) -> None:
        self._spawn(list(self.cfg.window_manager), "wm")

    def _start_server(self) -> None:
        ready = self.folder / "server.json"
        argv = [
            sys.executable,
            "-m",
            "env_client.desktop.vmserver",
            f"--display={self.display}",
            f"--root={self.folder}",
            f"--width={self.cfg.screen_width}",
            f"--height={self.cfg.screen_height}",
            f"--openers={json.dumps(self.cfg.openers)}",
            f"--exec-timeout={self.cfg.execute_timeout_s}",
            f"--window-wait={self.cfg.window_wait_s}",
            f"--type-delay-ms={self.cfg.type_delay_ms}",
            f"--ready-file={ready}",
        ]
        if self.conf is not None:
            argv.append(f"--confine={self.conf.flag()}")
        if self.a11y_bus is not None:
            argv += [
                f"--atspi-bus=unix:path={self.a11y_bus}",
                f"--atspi-timeout={self.cfg.atspi_timeout_s}",
                f"--atspi-max-nodes={self.cfg.atspi_max_nodes}",
            ]
        proc = self._spawn_server(argv)
        deadline = time.monotonic() + self.cfg.start_timeout_s
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise DesktopStartError(
                    f"in-desktop server did not start; see {self.folder}/server.log"
                )
            time.sleep(0.05)
        self.url = json.loads(ready.read_text())["url"]

    def _spawn_server(self, argv: list[str]) -> subprocess.Popen[bytes]:
        # The server must import this project: run it from the project root.
        project = Path(__file__).resolve().parents[2]
        env = self.env()
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(project), env.get("PYTHONPATH")]))
        env["CSD_DESKTOP_TOKEN"] = self.token
        assert self.xvfb is not None
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=self.home,
            process_group=self.xvfb.pid,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._log("server"),
        )
        self.core_pids.add(proc.pid)
        self.procs.append(proc)
        return proc

    # --- state -------------------------------------------------------------------------

    def alive(self) -> bool:
        """Xvfb and every core process still run."""
        return bool(self.core_pids) and all(_running(p) for p in self.core_pids)

    def pids(self) -> set[int]:
        """Every live process of this desktop (by tag), the core ones included."""
        return tagged_pids(TAG_VAR, self.tag)

    # --- revert and close --------------------------------------------------------------

    def begin_episode(self) -> None:
        """The state an episode starts from: revert a used desktop, keep a clean one (and the
        apps it is prewarming); either way the desktop counts as used from now on."""
        if self.used:
            self.revert()
        self.used = True

    def revert(self) -> None:
        """Kill the desktop's apps, give it a fresh HOME (the episode's clean state) and start
        the prewarm apps again."""
        apps = self.pids() - self.core_pids
        _kill_all(apps)
        self._fresh_home()
        self.used = False
        self._prewarm()

    def kill_apps(self) -> int:
        """Kill every app of the desktop (not X, the WM or the server); how many died."""
        apps = self.pids() - self.core_pids
        _kill_all(apps)
        return len(apps)

    def close(self) -> None:
        """Kill every process of the desktop and remove its folder (idempotent)."""
        if self.xvfb is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.xvfb.pid, signal.SIGKILL)
        _kill_all(self.pids())
        if self.lease is not None:
            # Also what left the tag and the group behind (``setsid env -i …`` typed into the
            # terminal): the user is this desktop's alone, so all its processes are the desktop's.
            _kill_all(user_pids(self.lease.uid))
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        self.procs.clear()
        self.core_pids.clear()
        shutil.rmtree(self.folder, ignore_errors=True)
        if self.lease is not None:
            self.lease.release()
            self.lease = None


def take_user(cfg: DesktopConfig) -> UserLease | None:
    """A free pool user for a desktop of a root server (None: the server's own user)."""
    if os.geteuid() != 0 or not cfg.desktop_user:
        return None
    try:
        return UserLease.take(cfg.desktop_user)
    except NoDesktopUser as exc:
        raise DesktopStartError(str(exc)) from None


def _traversable(folder: Path, uid: int, gid: int) -> bool:
    """Whether ``uid``/``gid`` (no other groups) may enter ``folder`` and all its parents."""
    for p in [folder, *folder.parents]:
        st = p.stat()
        bit = stat.S_IXUSR if st.st_uid == uid else stat.S_IXGRP if st.st_gid == gid else 0o001
        if not st.st_mode & bit:
            return False
    return True


def _chown_tree(top: Path, uid: int, gid: int) -> None:
    os.chown(top, uid, gid, follow_symlinks=False)
    for base, dirs, files in os.walk(top):
        for name in dirs + files:
            os.chown(os.path.join(base, name), uid, gid, follow_symlinks=False)


def _read_line(fd: int, timeout_s: float) -> str:
    """The first line written to ``fd`` (stripped; '' if none came in time); closes ``fd``."""
    import select

    try:
        got = b""
        deadline = time.monotonic() + timeout_s
        while not got.endswith(b"\n") and time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                chunk = os.read(fd, 64)
                if not chunk:
                    break
                got += chunk
        return got.decode(errors="replace").strip()
    finally:
        os.close(fd)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def tagged_pids(var: str, tag: str) -> set[int]:
    """Live processes whose environment holds ``var=tag`` (reads /proc; our own user's)."""
    want = f"{var}={tag}".encode()
    found = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                if want in f.read().split(b"\0") and _running(int(entry.name)):
                    found.add(int(entry.name))
        except OSError:  # gone meanwhile, or not ours
            continue
    return found


def user_pids(uid: int) -> set[int]:
    """Live processes whose real user id is ``uid``."""
    found = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status") as f:
                line = next(x for x in f if x.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        if int(line.split()[1]) == uid and _running(int(entry.name)):
            found.add(int(entry.name))
    return found


def _kill_all(pids: set[int], timeout_s: float = 5.0) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(_running(p) for p in pids):
        time.sleep(0.02)
