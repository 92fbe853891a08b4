"""Client of OSWorld's in-VM HTTP API, for our in-desktop server and for OSWorld machines alike.

Blocking (urllib; the backend calls it from its desktop's worker thread). Every failure is a
:class:`DesktopApiError` naming the route and what the server said.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
import uuid
from typing import Any

from env_client.desktop.program import osworld_execute_body


class DesktopApiError(RuntimeError):
    """A request to a desktop's server failed (status 0: it could not be reached)."""

    def __init__(self, route: str, status: int, message: str) -> None:
        super().__init__(f"desktop {route}: {message}" + (f" (HTTP {status})" if status else ""))
        self.route = route
        self.status = status


class VMClient:
    """Talks to one desktop at ``base_url``."""

    def __init__(self, base_url: str, timeout_s: float = 60.0, token: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.headers = {"X-Desktop-Token": token} if token else {}

    def _call(
        self, method: str, route: str, body: bytes | None = None, ctype: str | None = None
    ) -> bytes:
        headers = dict(self.headers)
        if ctype:
            headers["Content-Type"] = ctype
        req = urllib.request.Request(
            self.base_url + route, data=body, method=method, headers=headers
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return bytes(resp.read())
        except urllib.error.HTTPError as exc:
            raise DesktopApiError(route, exc.code, _message(exc.read())) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise DesktopApiError(route, 0, f"unreachable: {reason}") from None

    def _json(self, route: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body or {}).encode()
        raw = self._call("POST", route, data, "application/json")
        try:
            return json.loads(raw)
        except ValueError:
            raise DesktopApiError(route, 200, f"answer is not JSON: {raw[:200]!r}") from None

    # --- observation -------------------------------------------------------------------

    def screenshot(self) -> bytes:
        return self._call("GET", "/screenshot")

    def accessibility(self) -> str | None:
        raw = self._call("GET", "/accessibility")
        tree = json.loads(raw).get("AT")
        return tree if isinstance(tree, str) else None

    def screen_size(self) -> tuple[int, int]:
        got = self._json("/screen_size")
        return int(got["width"]), int(got["height"])

    # --- commands ----------------------------------------------------------------------

    def execute(self, command: Any, shell: bool = False, route: str = "/execute") -> dict[str, Any]:
        """Run a command in the desktop: {status, output, error, returncode}."""
        answer = self._json(route, {"command": command, "shell": shell})
        if not isinstance(answer, dict):
            raise DesktopApiError(route, 200, f"unexpected answer {str(answer)[:200]}")
        return answer

    def perform(self, program: str) -> dict[str, Any]:
        """Run a pyautogui program the way OSWorld's controller does."""
        return self._json("/execute", osworld_execute_body(program))

    def launch(self, command: Any, shell: bool = False) -> None:
        self._json("/setup/launch", {"command": command, "shell": shell})

    def open_file(self, path: str) -> None:
        self._json("/setup/open_file", {"path": path})

    def window(self, action: str, name: str, strict: bool, by_class: bool) -> None:
        body = {"window_name": name, "strict": strict, "by_class": by_class}
        self._json(f"/setup/{action}_window", body)

    # --- files -------------------------------------------------------------------------

    def get_file(self, path: str) -> bytes | None:
        """The file's bytes, or None when the desktop has no such file."""
        form = urllib.parse.urlencode({"file_path": path}).encode()
        try:
            return self._call("POST", "/file", form, "application/x-www-form-urlencoded")
        except DesktopApiError as exc:
            if exc.status == 404:
                return None
            raise

    def upload(self, path: str, data: bytes) -> None:
        boundary = uuid.uuid4().hex
        body = _multipart(boundary, {"file_path": path.encode()}, {"file_data": data})
        self._call("POST", "/setup/upload", body, f"multipart/form-data; boundary={boundary}")


def _multipart(boundary: str, fields: dict[str, bytes], files: dict[str, bytes]) -> bytes:
    out = []
    for name, value in fields.items():
        out.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode()
            + value
            + b"\r\n"
        )
    for name, value in files.items():
        out.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; '
            f'filename="{name}"\r\nContent-Type: application/octet-stream\r\n\r\n'.encode()
            + value
            + b"\r\n"
        )
    return b"".join(out) + f"--{boundary}--\r\n".encode()


def _message(raw: bytes) -> str:
    try:
        got = json.loads(raw)
    except ValueError:
        return raw[:300].decode(errors="replace")
    if isinstance(got, dict):
        return str(got.get("message") or got.get("error") or got)[:500]
    return str(got)[:500]
