"""Typed configuration of the desktop backend (pydantic only: no torch, ray or aiohttp).

One :class:`DesktopConfig` describes both kinds of desktop the backend drives: local X desktops
(``kind="local"``: Xvfb + window manager + our in-desktop server) and remote OSWorld machines
(``kind="remote"``: their in-VM servers at ``remote_urls``).
"""

from __future__ import annotations

import os
import tempfile
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_OPENERS = {
    ".xlsx": ["soffice", "--calc", "--norestore", "--nologo"],
    ".ods": ["soffice", "--calc", "--norestore", "--nologo"],
    ".csv": ["soffice", "--calc", "--norestore", "--nologo"],
    ".docx": ["soffice", "--writer", "--norestore", "--nologo"],
    ".odt": ["soffice", "--writer", "--norestore", "--nologo"],
    ".txt": ["mousepad"],
    ".md": ["mousepad"],
    ".py": ["mousepad"],
    "/": ["pcmanfm"],
}
# LibreOffice started without a window or document; a later `soffice --calc file` hands the
# file to it over its per-profile pipe (LibreOffice's own single-instance mechanism). Not
# --invisible: an invisible instance opens the later documents invisible too.
PREWARM_OFFICE = ("soffice", "--nodefault", "--norestore", "--nologo")


class DesktopConfig(BaseModel):
    """The desktop backend of the environment server (``--backend desktop``)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["local", "remote"] = Field(
        "local",
        description="local: an Xvfb desktop per session on this machine; remote: OSWorld "
        "machines at remote_urls (one session per URL).",
    )
    remote_urls: list[str] = Field(
        default_factory=list,
        description="kind=remote: base URLs of OSWorld in-VM servers, e.g. http://10.0.0.5:5000.",
    )
    root: str = Field(
        default_factory=lambda: os.path.join(tempfile.gettempdir(), "csd-desktops"),
        description="Folder under which each local desktop gets its own session folder (HOME, "
        "TMPDIR, caches); removed with the desktop.",
    )
    screen_width: int = Field(1024, ge=320, le=3840, description="Screen width, pixels.")
    screen_height: int = Field(768, ge=240, le=2160, description="Screen height, pixels.")
    window_manager: list[str] = Field(
        default_factory=lambda: ["openbox"], description="Window manager command (local)."
    )
    openers: dict[str, list[str]] = Field(
        default_factory=lambda: dict(DEFAULT_OPENERS),
        description="File suffix -> command that opens it (the 'open' setup step; '/' is for "
        "folders). The path is appended as the last argument.",
    )
    start_timeout_s: float = Field(30.0, gt=0, description="Desktop start (X + WM + server), s.")
    request_timeout_s: float = Field(60.0, gt=0, description="One in-desktop HTTP request, s.")
    execute_timeout_s: float = Field(
        30.0, gt=0, le=600, description="A setup/getter command runs at most this long, s."
    )
    settle_s: float = Field(
        0.15, ge=0, le=10, description="Wait after actions before the screenshot, s."
    )
    window_wait_s: float = Field(
        15.0, gt=0, le=120, description="open/launch wait this long for a new window, s."
    )
    max_file_bytes: int = Field(
        32 << 20, ge=1024, description="Largest file uploaded to or fetched from a desktop."
    )
    accessibility: bool = Field(
        True,
        description="Send an accessibility tree in every observation: the window list, then "
        "(with atspi) the on-screen widgets of the apps.",
    )
    atspi: bool = Field(
        True,
        description="Local desktops: run an AT-SPI accessibility bus per desktop, so its GTK "
        "apps (Mousepad, PCManFM; LibreOffice with office_ui=gtk3) export their widgets "
        "(buttons, menus, text fields with their text, spreadsheet cells in view) into the "
        "tree. Needs at-spi2-core, libatk-adaptor and the jeepney package "
        "(scripts/setup_desktop.sh); without them the tree is the window list.",
    )
    atspi_timeout_s: float = Field(
        1.5, gt=0, le=30, description="One tree read at most this long; what was read by then "
        "is sent.",
    )  # fmt: skip
    atspi_max_nodes: int = Field(
        300, ge=1, le=5000, description="At most this many AT-SPI nodes per tree."
    )
    office_ui: Literal["gen", "gtk3"] = Field(
        "gen",
        description="LibreOffice's UI toolkit on local desktops (SAL_USE_VCLPLUGIN). gen "
        "(plain X11) exports no widgets over AT-SPI: LibreOffice windows are in the tree as "
        "windows only. gtk3 (package libreoffice-gtk3) exports them, spreadsheet cells in view "
        "included, for about +95 MiB and +0.6 s of CPU per LibreOffice; but on these desktops "
        "it loses some synthetic key presses (an Enter right after ctrl+End in Writer was lost "
        "in 2 of 3 runs, so the writer-append-paragraph expert fails), hence not the default.",
    )
    task_files_roots: list[str] = Field(
        default_factory=list,
        description="Folders that upload_file's local_path and local_file getters may read "
        "from, besides the built-in task set's folder (env_client/tasks/desktop).",
    )
    type_delay_ms: int = Field(8, ge=0, le=200, description="xdotool delay between keys, ms.")
    prewarm: list[list[str]] = Field(
        default_factory=lambda: [list(PREWARM_OFFICE)],
        description="Commands started in the background on a desktop that has not served an "
        "episode yet (right after start and after each revert), so that the episode's 'open' "
        "attaches to a running app instead of cold-starting it. The default is an invisible "
        "LibreOffice without documents; [] turns it off (saves its memory on desktops that "
        "never open an office file).",
    )
    desktop_user: str = Field(
        "csd-desktop",
        description="When the server runs as root: the name prefix of the unprivileged users "
        "that run each desktop's window manager, apps, terminal and setup commands, one user "
        "per live desktop (<prefix>-0, <prefix>-1, …; scripts/setup_desktop.sh makes 8, "
        "CSD_DESKTOP_USERS=N more), each in a private /tmp of its desktop's own; a desktop "
        "does not start without a free one. '' keeps root. A server that is not root runs "
        "everything as itself.",
    )
    desktop_network: bool = Field(
        False,
        description="With desktop_user: whether the desktop's apps may use the network. By "
        "default they get an empty network namespace, so a command typed into the terminal "
        "cannot reach this machine's services (the environment server, Ray's job API), the "
        "internet, or another desktop's X server; the X display is reached through its "
        "socket file.",
    )
    warm_office_profile: bool = Field(
        True,
        description="Complete the template's LibreOffice profile by one headless start when "
        "the server prepares it, so each desktop's first LibreOffice start skips that work.",
    )

    @model_validator(mode="after")
    def _complete(self) -> DesktopConfig:
        if self.kind == "remote" and not self.remote_urls:
            raise ValueError("desktop.remote_urls: required for kind 'remote'")
        if self.kind == "local" and self.remote_urls:
            raise ValueError("desktop.remote_urls: only for kind 'remote'")
        return self
