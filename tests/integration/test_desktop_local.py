"""The desktop backend on real local desktops: Xvfb, openbox, xterm, Mousepad and LibreOffice
driven through our in-desktop server, with the built-in tasks and their scripted experts.

Skips (with the reason) where the desktop's programs are not installed; install them with
``bash scripts/setup_desktop.sh``. Set ``CSD_DESKTOP_SCREENSHOT=<file.png>`` to keep a
screenshot of a session (the README's picture).
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from env_client.commands import KeysOp, PointerOp, TypeOp
from env_client.desktop.backend import DesktopBackend
from env_client.desktop.config import DesktopConfig
from env_client.desktop.experts import builtin_tasks, expert_steps, play
from env_client.desktop.local import (
    LO_GTK3,
    TAG_VAR,
    atspi_missing,
    atspi_ready,
    missing_binaries,
    tagged_pids,
)
from env_client.desktop.local import user_pids as local_user_pids
from env_client.desktop.setup import SetupError
from env_client.observation import png_size

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

APPS = ("xterm", "mousepad", "soffice", "openbox")


def _missing() -> list[str]:
    missing = missing_binaries(DesktopConfig()) + [a for a in APPS if shutil.which(a) is None]
    for module in ("openpyxl", "docx"):
        try:
            __import__(module)
        except ImportError:
            missing.append(f"python:{module}")
    return sorted(set(missing))


if _missing():
    pytest.skip(
        f"desktop programs not installed ({', '.join(_missing())}): run scripts/setup_desktop.sh",
        allow_module_level=True,
    )


REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cfg() -> Iterator[DesktopConfig]:
    # Not under pytest's tmp_path: a root server's desktop user must be able to enter the root.
    root = Path(tempfile.mkdtemp(prefix="csd-test-desktops-"))
    root.chmod(0o711)
    try:
        yield DesktopConfig(root=str(root))
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def backend(cfg: DesktopConfig) -> Iterator[DesktopBackend]:
    b = DesktopBackend(cfg, 0)
    b.start()
    try:
        yield b
    finally:
        b.close()
    assert not tagged_pids(TAG_VAR, b.local.tag) if b.local else True


def _all_tasks() -> list[dict]:
    return builtin_tasks("train") + builtin_tasks("eval")


def _gone(backends: list[DesktopBackend]) -> None:
    """Nothing of these desktops is left: no process (by tag and by pid), no folder."""
    for b in backends:
        assert b.local is not None
        assert not tagged_pids(TAG_VAR, b.local.tag)
        assert not b.local.folder.exists()
    ps = os.popen("ps -eo pid=,comm=").read().split("\n")
    xvfb = {int(line.split()[0]) for line in ps if line.strip().endswith("Xvfb")}
    assert not xvfb & {b.local.xvfb.pid for b in backends if b.local and b.local.xvfb}


def test_experts_solve_the_builtin_tasks_on_two_concurrent_desktops(cfg: DesktopConfig) -> None:
    tasks, experts = _all_tasks(), expert_steps()
    backends = [DesktopBackend(cfg, i) for i in range(2)]
    scores: dict[str, float] = {}
    errors: list[str] = []

    def worker(b: DesktopBackend, mine: list[dict]) -> None:
        try:
            b.start()
            for task in mine:
                scores[task["task"]] = play(b, task, experts[task["task"]])
                if task["task"] == "calc-sum" and os.environ.get("CSD_DESKTOP_SCREENSHOT"):
                    Path(os.environ["CSD_DESKTOP_SCREENSHOT"]).write_bytes(b.observe().png)
        except Exception as exc:  # reported below, with the task scores so far
            errors.append(f"desktop {b.index}: {type(exc).__name__}: {exc}")

    threads = [
        threading.Thread(target=worker, args=(b, tasks[i::2])) for i, b in enumerate(backends)
    ]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for b in backends:
            b.close()
    _gone(backends)
    assert not errors, errors
    failed = sorted(t for t, s in scores.items() if s < 1.0)
    assert len(scores) == len(tasks)
    assert len(failed) <= 0.1 * len(tasks), f"experts failed {failed}"
    print(f"experts solved {len(tasks) - len(failed)}/{len(tasks)}; failed: {failed}")


@pytest.mark.parametrize(
    "tid", ["os-write-csv", "te-append-line", "calc-sum", "writer-center-title"]
)
def test_random_actions_score_zero(backend: DesktopBackend, tid: str) -> None:
    task = next(t for t in _all_tasks() if t["task"] == tid)
    backend.reset(task)
    rng = random.Random(tid)
    w, h = backend.cfg.screen_width, backend.cfg.screen_height
    for _ in range(6):
        backend.perform(
            [
                PointerOp("click", rng.randrange(w), rng.randrange(h)),
                TypeOp("".join(rng.choice("abcxyz") for _ in range(4))),
                KeysOp((rng.choice(["tab", "left", "down", "esc"]),)),
            ]
        )
    backend.note_control("DONE")
    assert backend.state()["raw_reward"] == 0.0


def test_observation_is_a_screenshot_of_the_display_and_a_window_tree(
    backend: DesktopBackend,
) -> None:
    task = next(t for t in _all_tasks() if t["task"] == "te-append-line")
    instruction, _ = backend.reset(task)
    assert "water plants" in instruction
    raw = backend.observe()
    assert png_size(raw.png) == (backend.cfg.screen_width, backend.cfg.screen_height)
    names = [n["name"] for n in raw.nodes]
    assert any("todo.txt" in n for n in names), names
    info = backend.perform([PointerOp("click", 5000, 5000), KeysOp(("launchapp1",))])
    assert info.as_dict() == {
        "applied": 0,
        "out_of_bounds": 1,
        "unsupported_keys": ["launchapp1"],
    }


def test_the_tree_holds_the_apps_widgets_from_atspi(backend: DesktopBackend) -> None:
    """Mousepad's and LibreOffice Calc's widgets, read from the desktop's own AT-SPI bus: the
    text being edited, menus inside the window, the spreadsheet cells in view."""
    if backend.cfg.office_ui == "gtk3" or not LO_GTK3.exists():
        pytest.skip("needs the gen default and libreoffice-gtk3 installed")
    if not atspi_ready(backend.cfg):
        pytest.skip(f"AT-SPI not installed ({atspi_missing()}): run scripts/setup_desktop.sh")
    task = next(t for t in _all_tasks() if t["task"] == "te-append-line")
    backend.reset(task)
    nodes = backend.observe().nodes
    window = next(n for n in nodes if n["role"] == "window" and "todo.txt" in n["name"])
    text = next(n for n in nodes if n["role"] == "textbox" and "buy milk" in n.get("value", ""))
    assert text["focused"], text
    wx, wy, ww, wh = window["box"]
    menus = [n for n in nodes if n["role"] == "menu" and n["name"] == "File"]
    assert any(wx <= x < wx + ww and wy <= y < wy + wh for x, y, _, _ in (m["box"] for m in menus))
    backend.perform([KeysOp(("ctrl", "end")), TypeOp("zebra crossing")])
    nodes = backend.observe().nodes
    assert any("zebra crossing" in n.get("value", "") for n in nodes if n["role"] == "textbox")

    # LibreOffice exports its widgets with its GTK UI only (office_ui=gtk3, not the default).
    calc = next(t for t in _all_tasks() if t["task"] == "calc-sum")
    backend.reset(calc)
    assert not [n for n in backend.observe().nodes if n["role"] == "cell"]
    gtk = DesktopBackend(backend.cfg.model_copy(update={"office_ui": "gtk3"}), 1)
    try:
        gtk.start()
        gtk.reset(calc)
        started = time.monotonic()
        nodes = gtk.observe().nodes
        took = time.monotonic() - started
    finally:
        gtk.close()
    cells = {n["name"]: n.get("value") for n in nodes if n["role"] == "cell"}
    assert cells.get("A1") == "Item" and cells.get("B2") == "10", cells
    print(f"Calc (gtk3) observation: {len(nodes)} nodes, {len(cells)} cells, {took:.2f} s")


def test_app_crash_mid_episode_scores_zero_and_the_desktop_recovers(
    backend: DesktopBackend,
) -> None:
    task = next(t for t in _all_tasks() if t["task"] == "calc-fill-qty")
    backend.reset(task)
    backend.perform([KeysOp(("ctrl", "home")), TypeOp("10")])
    assert backend.local is not None and backend.local.kill_apps() >= 1  # Calc dies unsaved
    backend.note_control("DONE")
    assert backend.state()["raw_reward"] == 0.0
    assert backend.alive()
    assert play(backend, task, expert_steps()["calc-fill-qty"]) == 1.0


def test_a_failing_setup_step_is_a_clear_error_and_the_desktop_stays_usable(
    backend: DesktopBackend,
) -> None:
    task = next(t for t in _all_tasks() if t["task"] == "os-make-folder")
    bad = {**task, "config": [{"type": "open", "parameters": {"path": "~/missing.xlsx"}}]}
    with pytest.raises(SetupError, match=r"config\[0\] \(open\) failed.*no file"):
        backend.reset(bad)
    assert play(backend, task, expert_steps()["os-make-folder"]) == 1.0


def test_a_dead_x_server_is_detected_and_cleaned_up(cfg: DesktopConfig) -> None:
    b = DesktopBackend(cfg, 7)
    b.start()
    try:
        b.kill()
        assert b.local is not None and b.local.xvfb is not None
        b.local.xvfb.wait(10)
        assert not b.alive()
    finally:
        b.close()
    _gone([b])


def _office_pids(b: DesktopBackend) -> set[int]:
    assert b.local is not None
    return {p for p in b.local.pids() if _comm(p) == "soffice.bin"}


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    """Running (a killed process whose parent does not reap it stays a zombie: not alive)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _wait(what: str, check: Callable[[], object], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_the_first_reset_attaches_to_the_prewarmed_office_and_the_next_starts_clean(
    backend: DesktopBackend,
) -> None:
    """A fresh desktop prewarms LibreOffice with no window; the first Calc task's open hands
    its file to it. The next reset kills it and everything of the episode (files, documents)
    and prewarms a new one."""
    assert backend.local is not None
    _wait("the prewarmed LibreOffice", lambda: _office_pids(backend))
    warm: set[int] = set()
    while warm != _office_pids(backend):  # a first start restarts itself once
        warm = _office_pids(backend)
        time.sleep(1.0)
    assert not backend.observe().nodes  # no window, no document
    task = next(t for t in _all_tasks() if t["task"] == "calc-sum")
    backend.reset(task)
    assert warm <= _office_pids(backend)  # the prewarmed one serves the document
    _wait("the launcher's client to exit", lambda: _office_pids(backend) == warm)  # no 2nd one
    names = [n["name"] for n in backend.observe().nodes]
    assert any("stock" in n for n in names), names
    left = backend.local.home / "Documents" / "left-behind.txt"
    left.write_text("episode 1")
    other = next(t for t in _all_tasks() if t["task"] == "os-make-folder")
    backend.reset(other)
    assert not left.exists()
    assert not (warm & backend.local.pids())  # the episode's LibreOffice is gone
    assert not any("stock" in n["name"] for n in backend.observe().nodes)
    _wait("a new prewarmed LibreOffice", lambda: _office_pids(backend))


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("xterm") is None, reason="confinement applies to root"
)
def test_commands_typed_into_the_terminal_cannot_write_outside_the_session(
    backend: DesktopBackend, cfg: DesktopConfig
) -> None:
    """The agent's terminal runs as its desktop's own user, in a private /tmp, without
    network: root's home, the project, the machine's /tmp and /dev/shm, another desktop's HOME
    and this machine's services are out of reach; its own HOME is not (the control that the
    typing really ran). A process that leaves the desktop's tag and group dies with it."""
    other = DesktopBackend(cfg, 1)
    other.start()
    try:
        assert backend.local is not None and other.local is not None
        user, other_user = backend.local.user, other.local.user
        assert user is not None and other_user is not None and user[0] != other_user[0]
        (other.local.home / "secret.txt").write_text("B's")
        os.chown(other.local.home / "secret.txt", *other_user)
        task = next(t for t in _all_tasks() if t["task"] == "os-count-lines")  # opens an xterm
        backend.reset(task)
        tag = f"csd-confine-{os.getpid()}"
        outside = [Path("/root") / tag, REPO / tag, Path("/tmp") / tag, Path("/dev/shm") / tag,
                   other.local.home / tag]  # fmt: skip
        typed = " ; ".join(f"touch {p}" for p in [*outside, Path("~") / tag])
        typed += f" ; cat {other.local.home / 'secret.txt'} > ~/{tag}-read"
        typed += f" ; touch /tmp/{tag} && ls /tmp/{tag} && touch ~/{tag}-tmp"
        port = backend.local.url.rsplit(":", 1)[1]  # the in-desktop server, on this machine
        typed += f" ; (echo > /dev/tcp/127.0.0.1/{port}) && touch ~/{tag}-net"
        typed += " ; setsid env -i sleep 600 &"  # leaves the tag and the process group
        backend.perform([TypeOp(typed + "\n")])
        _wait("the typed command", lambda: (backend.local.home / f"{tag}-tmp").exists())
        time.sleep(0.5)  # the network probe and the escape run last
        assert [p for p in outside if p.exists()] == []
        assert (backend.local.home / f"{tag}-read").read_text() == ""  # B's HOME is closed
        assert not (backend.local.home / f"{tag}-net").exists()  # no network
        assert (backend.local.home / tag).stat().st_uid == user[0]
        xterms = [p for p in backend.local.pids() if _comm(p) == "xterm"]
        assert xterms and all(os.stat(f"/proc/{p}").st_uid == user[0] for p in xterms)
        escaped = [p for p in local_user_pids(user[0]) if _comm(p) == "sleep"]
        assert escaped and not set(escaped) & backend.local.pids()
        backend.close()
        assert not [p for p in escaped if _alive(p)]  # the user's processes die with it
    finally:
        other.close()
        for p in outside:
            p.unlink(missing_ok=True)
