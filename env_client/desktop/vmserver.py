"""Our in-desktop HTTP server: the subset of OSWorld's in-VM server API the backend uses.

One runs on each local desktop (started by :mod:`env_client.desktop.local` with ``DISPLAY`` and
``HOME`` of that desktop), so local desktops and remote OSWorld machines are driven by the same
client code (:mod:`env_client.desktop.vmclient`)::

    python -m env_client.desktop.vmserver --display :3 --root /tmp/csd-desktops/d3 \\
        --width 1024 --height 768 --ready-file ready.json

Routes (OSWorld's names and bodies): ``GET /screenshot`` (PNG), ``GET /accessibility``
(``{"AT": xml}``; here the window list in the embedded tree format, then with ``--atspi-bus``
the apps' on-screen widgets, :mod:`env_client.desktop.atspi`), ``POST /execute`` and
``/setup/execute`` (``{"command", "shell"}`` → ``{"status", "output", "error",
"returncode"}``), ``POST /file`` (form ``file_path`` → bytes), ``POST /setup/upload``
(multipart ``file_path``, ``file_data``), ``POST /setup/launch``, ``/setup/open_file``,
``/setup/activate_window``, ``/setup/close_window``, ``GET /platform``, ``/screen_size``,
``/cursor_position``; ours: ``GET /healthz``.

Differences from OSWorld's server, on purpose:
- ``/execute`` of ``python3 -c <pyautogui program>`` is parsed with the command whitelist
  (:func:`env_client.desktop.program.parse_program`) and performed with xdotool; it is never run
  by Python. Its ``output`` is the JSON of what was applied.
- Every file path must resolve inside ``--root`` (the session folder): a path outside is 403.
- With ``--token`` every request must carry ``X-Desktop-Token`` (the server listens on
  127.0.0.1, but other local users must not drive the desktop).
- With ``--confine UID:GID:PID:NET`` (a root server) every process it starts (commands,
  launched apps, opened files) runs as that user with no other groups, inside the namespaces of
  the holder PID (its private ``/tmp``; without network unless NET is 1; see
  :mod:`env_client.desktop.confine`), and uploaded files belong to it.
"""

from __future__ import annotations

import argparse
import email.parser
import email.policy
import hmac
import io
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from env_client.a11y import to_xml
from env_client.commands import CommandError
from env_client.desktop.atspi import AtspiReader, Limits
from env_client.desktop.confine import Confinement, confined
from env_client.desktop.program import parse_program, program_of_execute
from env_client.desktop.xinput import XInput

log = logging.getLogger("vmserver")
MAX_BODY = 64 << 20


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Desktop:
    """What the routes act on: the display, the session folder, launched processes."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.root = Path(args.root).resolve()
        self.home = Path(os.environ.get("HOME", str(self.root))).resolve()
        self.width, self.height = args.width, args.height
        self.display = args.display
        self.openers: dict[str, list[str]] = json.loads(args.openers)
        self.exec_timeout = args.exec_timeout
        self.window_wait = args.window_wait
        self.env = dict(os.environ, DISPLAY=args.display)
        self.xinput = XInput(self.env, args.width, args.height, args.type_delay_ms)
        self.launched: list[subprocess.Popen[bytes]] = []
        self.input_lock = threading.Lock()  # one program at a time drives the pointer
        self.conf = Confinement.parse(args.confine) if args.confine else None
        self.user = (self.conf.uid, self.conf.gid) if self.conf else None
        self.atspi: AtspiReader | None = None
        if args.atspi_bus:
            limits = Limits(timeout_s=args.atspi_timeout, max_nodes=args.atspi_max_nodes)
            self.atspi = AtspiReader(args.atspi_bus, limits)

    # --- paths -------------------------------------------------------------------------

    def path(self, given: Any) -> Path:
        """A request's path, ``~`` being the desktop's HOME; it must stay inside the root."""
        if not isinstance(given, str) or not given:
            raise ApiError(400, "file path must be a non-empty string")
        p = Path(given.replace("~", str(self.home), 1) if given.startswith("~") else given)
        p = (self.home / p if not p.is_absolute() else p).resolve()
        if p != self.root and self.root not in p.parents:
            raise ApiError(403, f"path {given!r} is outside the session folder")
        return p

    def write_file(self, path: Path, data: bytes) -> None:
        """Write an uploaded file (and its missing folders) as the desktop's user's; the last
        component is never followed if it is a link (one made after ``path()`` checked)."""
        missing = [p for p in [path.parent, *path.parent.parents] if not p.exists()]
        path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
        try:
            fd = os.open(path, flags, 0o644)
        except OSError as exc:
            raise ApiError(403, f"cannot write {path}: {exc.strerror}") from None
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if self.user is not None:
                os.fchown(f.fileno(), *self.user)
        if self.user is not None:
            for folder in missing:
                os.chown(folder, *self.user, follow_symlinks=False)

    # --- processes ---------------------------------------------------------------------

    def argv(self, command: Any, shell: bool) -> list[str]:
        """The argv that runs a request's command, confined (``--confine``)."""
        argv = _argv(command, shell)
        full = ["/bin/sh", "-c", argv] if shell else argv
        return confined(full, self.conf, self.home)

    def run(self, command: Any, shell: bool) -> dict[str, Any]:
        argv = self.argv(command, shell)
        try:
            done = subprocess.run(
                argv,
                cwd=self.home,
                env=self.env,
                capture_output=True,
                timeout=self.exec_timeout,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            return _status("error", "", f"timed out after {self.exec_timeout} s", -1)
        except OSError as exc:
            return _status("error", "", f"{type(exc).__name__}: {exc}", -1)
        out, err = done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
        return _status("success" if done.returncode == 0 else "error", out, err, done.returncode)

    def perform(self, program: str) -> dict[str, Any]:
        try:
            ops = parse_program(program)
        except CommandError as exc:
            raise ApiError(400, f"refused: {exc}") from None
        with self.input_lock:
            result = self.xinput.perform(ops)
        return _status("success", json.dumps(result.as_dict()), "", 0)

    def launch(self, command: Any, shell: bool) -> subprocess.Popen[bytes]:
        argv = self.argv(command, shell)
        try:
            proc = subprocess.Popen(
                argv,
                cwd=self.home,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        except OSError as exc:
            raise ApiError(400, f"cannot launch {argv!r}: {exc}") from None
        self.launched.append(proc)
        return proc

    def windows(self, frames: bool = False) -> list[dict[str, Any]]:
        """Top-level windows: id, title, box (wmctrl -lG). wmctrl's box is the client area
        shifted by the frame's left and top extents; with ``frames`` each box is the whole
        window as drawn (title bar and borders included, from _NET_FRAME_EXTENTS)."""
        done = subprocess.run(
            ["wmctrl", "-lG"], env=self.env, capture_output=True, timeout=10, check=False
        )
        found = []
        for line in done.stdout.decode(errors="replace").splitlines():
            parts = line.split(None, 7)
            if len(parts) < 7:
                continue
            wid, _, x, y, w, h = parts[:6]
            title = parts[7] if len(parts) == 8 else ""
            box = [int(x), int(y), int(w), int(h)]
            if frames:
                left, right, top, bottom = self.frame_extents(wid)
                box = [box[0] - 2 * left, box[1] - 2 * top, box[2] + left + right,
                       box[3] + top + bottom]  # fmt: skip
            found.append({"id": int(wid, 16), "name": title, "box": box})
        return found

    def frame_extents(self, wid: str) -> tuple[int, int, int, int]:
        """(left, right, top, bottom) of the window manager's frame around window ``wid``."""
        done = subprocess.run(
            ["xprop", "-id", wid, "_NET_FRAME_EXTENTS"],
            env=self.env, capture_output=True, timeout=10, check=False,
        )  # fmt: skip
        values = done.stdout.decode(errors="replace").partition("=")[2].split(",")
        try:
            left, right, top, bottom = (int(v) for v in values)
        except ValueError:  # undecorated, or gone meanwhile
            return 0, 0, 0, 0
        return left, right, top, bottom

    def wait_window(self, before: set[int], hint: str, title_grace_s: float = 3.0) -> bool:
        """Wait until a window named like ``hint`` is there, or a window that was not there
        before has had ``title_grace_s`` to take its title (an app maps its window before it
        names it; the first observation should show the named, drawn window)."""
        deadline = time.monotonic() + self.window_wait
        new_since: float | None = None
        while time.monotonic() < deadline:
            now = self.windows()
            if hint and any(hint in w["name"] for w in now):
                return True
            if any(w["id"] not in before for w in now):
                new_since = time.monotonic() if new_since is None else new_since
                if not hint or time.monotonic() - new_since >= title_grace_s:
                    return True
            time.sleep(0.1)
        return new_since is not None

    def active_window(self) -> int | None:
        done = subprocess.run(
            ["xdotool", "getactivewindow"], env=self.env, capture_output=True, check=False
        )
        text = done.stdout.decode().strip()
        return int(text) if text.isdigit() else None


def _argv(command: Any, shell: bool) -> Any:
    if shell:
        if isinstance(command, list):
            command = " ".join(shlex.quote(str(c)) for c in command)
        if not isinstance(command, str) or not command:
            raise ApiError(400, "command must be a non-empty string or list")
        return command
    if isinstance(command, str):
        command = shlex.split(command)
    if not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command):
        raise ApiError(400, "command must be a non-empty list of strings (or shell=true)")
    return command


def _status(status: str, output: str, error: str, code: int) -> dict[str, Any]:
    return {"status": status, "output": output, "error": error, "returncode": code}


# --- routes ------------------------------------------------------------------------------


def screenshot(d: Desktop, req: Request) -> Reply:
    from PIL import ImageGrab

    img = ImageGrab.grab(xdisplay=d.display)
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=1)  # level 1: 4x faster, ~20% larger
    return 200, "image/png", buf.getvalue()


def accessibility(d: Desktop, req: Request) -> Reply:
    active = d.active_window()
    nodes = [
        {"role": "window", "name": w["name"], "box": w["box"], "focused": w["id"] == active}
        for w in d.windows(frames=True)
    ]
    if d.atspi is not None:
        nodes += d.atspi.nodes(d.width, d.height)
    return _json({"AT": to_xml(nodes, d.width, d.height)})


def execute(d: Desktop, req: Request) -> Reply:
    body = req.json()
    program = program_of_execute(body.get("command"))
    if program is not None:
        return _json(d.perform(program))
    return _json(d.run(body.get("command"), bool(body.get("shell", False))))


def get_file(d: Desktop, req: Request) -> Reply:
    path = d.path(req.form().get("file_path"))
    if not path.is_file():
        raise ApiError(404, f"no file {path}")
    return 200, "application/octet-stream", path.read_bytes()


def upload(d: Desktop, req: Request) -> Reply:
    fields = req.multipart()
    if "file_path" not in fields or "file_data" not in fields:
        raise ApiError(400, "upload needs multipart fields file_path and file_data")
    path = d.path(fields["file_path"].decode(errors="replace"))
    d.write_file(path, fields["file_data"])
    return _json({"status": "success", "message": f"uploaded {path}"})


def launch(d: Desktop, req: Request) -> Reply:
    body = req.json()
    proc = d.launch(body.get("command"), bool(body.get("shell", False)))
    return _json({"status": "success", "message": f"launched pid {proc.pid}"})


def open_file(d: Desktop, req: Request) -> Reply:
    path = d.path(req.json().get("path"))
    if not path.exists():
        raise ApiError(404, f"no file {path}")
    opener = d.openers.get("/" if path.is_dir() else path.suffix.lower())
    if opener is None:
        raise ApiError(400, f"no opener for {path.suffix or 'this file'} (desktop.openers)")
    before = {w["id"] for w in d.windows()}
    d.launch([*opener, str(path)], shell=False)
    if not d.wait_window(before, path.name):
        raise ApiError(500, f"no window appeared for {path} within {d.window_wait} s")
    return _json({"status": "success", "message": f"opened {path}"})


def _window_cmd(d: Desktop, req: Request, action: str) -> Reply:
    body = req.json()
    name = body.get("window_name")
    if not isinstance(name, str) or not name:
        raise ApiError(400, "window_name must be a non-empty string")
    flags = ["-F"] if body.get("strict") else []
    flags += ["-x"] if body.get("by_class") else []
    done = subprocess.run(["wmctrl", *flags, action, name], env=d.env, check=False, timeout=10)
    if done.returncode != 0:
        raise ApiError(404, f"no window {name!r}")
    return _json({"status": "success", "message": f"{action} {name}"})


def activate_window(d: Desktop, req: Request) -> Reply:
    return _window_cmd(d, req, "-a")


def close_window(d: Desktop, req: Request) -> Reply:
    return _window_cmd(d, req, "-c")


def platform(d: Desktop, req: Request) -> Reply:
    return 200, "text/plain", b"Linux"


def screen_size(d: Desktop, req: Request) -> Reply:
    return _json({"width": d.width, "height": d.height})


def cursor_position(d: Desktop, req: Request) -> Reply:
    done = subprocess.run(
        ["xdotool", "getmouselocation", "--shell"], env=d.env, capture_output=True, check=True
    )
    vals = dict(line.split("=", 1) for line in done.stdout.decode().split() if "=" in line)
    return _json([int(vals.get("X", 0)), int(vals.get("Y", 0))])


def healthz(d: Desktop, req: Request) -> Reply:
    return _json({"ok": True, "display": d.display})


Reply = tuple[int, str, bytes]
ROUTES = {
    ("GET", "/screenshot"): screenshot,
    ("GET", "/accessibility"): accessibility,
    ("POST", "/accessibility"): accessibility,
    ("POST", "/execute"): execute,
    ("POST", "/setup/execute"): execute,
    ("POST", "/file"): get_file,
    ("POST", "/setup/upload"): upload,
    ("POST", "/setup/launch"): launch,
    ("POST", "/setup/open_file"): open_file,
    ("POST", "/setup/activate_window"): activate_window,
    ("POST", "/setup/close_window"): close_window,
    ("GET", "/platform"): platform,
    ("GET", "/screen_size"): screen_size,
    ("POST", "/screen_size"): screen_size,
    ("GET", "/cursor_position"): cursor_position,
    ("GET", "/healthz"): healthz,
}


def _json(value: Any) -> Reply:
    return 200, "application/json", json.dumps(value).encode()


class Request:
    """A request's body, decoded on demand."""

    def __init__(self, content_type: str, body: bytes) -> None:
        self.content_type = content_type
        self.body = body

    def json(self) -> dict[str, Any]:
        try:
            value = json.loads(self.body or b"{}")
        except ValueError as exc:
            raise ApiError(400, f"body is not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ApiError(400, "body must be a JSON object")
        return value

    def form(self) -> dict[str, str]:
        if self.content_type.startswith("application/json"):
            return {k: str(v) for k, v in self.json().items()}
        pairs = urllib.parse.parse_qsl(self.body.decode(errors="replace"))
        return dict(pairs)

    def multipart(self) -> dict[str, bytes]:
        head = f"Content-Type: {self.content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode()
        msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + self.body)
        if not msg.is_multipart():
            raise ApiError(400, "body must be multipart/form-data")
        fields: dict[str, bytes] = {}
        for part in msg.iter_parts():
            name = part.get_param("name", header="content-disposition")
            payload = part.get_payload(decode=True)
            if isinstance(name, str):
                fields[name] = payload if isinstance(payload, bytes) else b""
        return fields


def make_handler(desktop: Desktop, token: str | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            log.debug(format, *args)

        def do_GET(self) -> None:
            self._handle("GET")

        def do_POST(self) -> None:
            self._handle("POST")

        def _handle(self, method: str) -> None:
            try:
                status, ctype, body = self._route(method)
            except ApiError as exc:
                status, ctype = exc.status, "application/json"
                body = json.dumps({"status": "error", "message": str(exc)}).encode()
            except Exception as exc:  # a route bug must answer, not drop the connection
                log.exception("%s %s failed", method, self.path)
                status, ctype = 500, "application/json"
                body = json.dumps({"status": "error", "message": f"{exc!r}"[:500]}).encode()
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _route(self, method: str) -> Reply:
            given = self.headers.get("X-Desktop-Token", "")
            if token and not hmac.compare_digest(given, token):
                raise ApiError(HTTPStatus.FORBIDDEN, "missing or wrong X-Desktop-Token")
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                raise ApiError(413, f"body over {MAX_BODY} bytes")
            body = self.rfile.read(length) if length else b""
            route = ROUTES.get((method, urllib.parse.urlsplit(self.path).path))
            if route is None:
                raise ApiError(404, f"no route {method} {self.path}")
            return route(desktop, Request(self.headers.get("Content-Type", ""), body))

    return Handler


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m env_client.desktop.vmserver", description=__doc__)
    p.add_argument("--display", required=True, help="X display, e.g. :3")
    p.add_argument("--root", required=True, help="Session folder; file paths must stay inside.")
    p.add_argument("--width", type=int, required=True)
    p.add_argument("--height", type=int, required=True)
    p.add_argument("--openers", default="{}", help="JSON: suffix -> opener command.")
    p.add_argument("--exec-timeout", type=float, default=30.0)
    p.add_argument("--window-wait", type=float, default=15.0)
    p.add_argument("--type-delay-ms", type=int, default=8)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--token", default=os.environ.pop("CSD_DESKTOP_TOKEN", None))
    p.add_argument("--ready-file", type=Path, help="Write {url, pid} here once listening.")
    p.add_argument(
        "--confine",
        help="UID:GID:PID:NET (root only): every started process runs as UID:GID inside the "
        "namespaces of process PID, with its network namespace too unless NET is 1.",
    )
    p.add_argument(
        "--atspi-bus",
        help="D-Bus address of the desktop's AT-SPI bus: the apps' widgets join the tree.",
    )
    p.add_argument("--atspi-timeout", type=float, default=1.5, help="One tree read, s.")
    p.add_argument("--atspi-max-nodes", type=int, default=300)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s vmserver %(message)s")
    desktop = Desktop(args)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(desktop, args.token))
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    if args.ready_file:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        tmp = args.ready_file.with_name(args.ready_file.name + ".tmp")
        tmp.write_text(json.dumps({"url": url, "pid": os.getpid()}))
        tmp.replace(args.ready_file)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        sys.stdout.flush()


if __name__ == "__main__":
    main()
