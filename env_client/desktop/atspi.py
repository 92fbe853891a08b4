"""A local desktop's accessibility tree from AT-SPI, read over the desktop's own bus.

Each local desktop runs a private accessibility bus (``dbus-daemon`` with at-spi2's
``accessibility.conf``) and AT-SPI registry, started by :mod:`env_client.desktop.local`; its GTK
apps (Mousepad, PCManFM) and LibreOffice (with the gtk3 VCL plugin) export their widgets there.
:class:`AtspiReader` walks them breadth-first and returns the on-screen ones as nodes of the
embedded tree format (:func:`env_client.a11y.to_xml`: role, name, box in screen pixels, value,
checked/focused/disabled), in document order.

Speed: every D-Bus call of one level of the tree is sent before any reply is read (pipelined),
so a walk costs one round-trip per level and per phase, not one per call; only what is showing
is descended into. A spreadsheet's table (2^31 cells that "manage their descendants") is read
through the cells in view: the cells under its top-left and bottom-right corners give the
visible rows and columns, and only those cells that hold text (or the focus) become nodes.

Bounds, because an app, or a program an agent typed into the terminal, owns its side of the
bus: one deadline for the whole walk (what was read by then is returned), caps on the nodes
visited and returned, on children per node, on cells per table and on text per node; a reply
that fails or does not come is a node left out, never an error of the observation.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

Ref = tuple[str, str]  # (bus name, object path) of one accessible
Call = tuple[Ref, str, str, "str | None", tuple[Any, ...]]  # ref, interface, method, sig, args
REGISTRY: Ref = ("org.a11y.atspi.Registry", "/org/a11y/atspi/accessible/root")
ACC = "org.a11y.atspi.Accessible"
COMPONENT = "org.a11y.atspi.Component"
TEXT = "org.a11y.atspi.Text"
TABLE = "org.a11y.atspi.Table"
VALUE = "org.a11y.atspi.Value"
PROPS = "org.freedesktop.DBus.Properties"
SCREEN_COORDS = 0  # ATSPI_COORD_TYPE_SCREEN

# Bits of AT-SPI's state set (AtspiStateType).
CHECKED, EDITABLE, ENABLED, FOCUSED = 4, 7, 8, 12
SENSITIVE, SHOWING, VISIBLE, MANAGES_DESCENDANTS = 24, 25, 30, 31

# AT-SPI role names → the embedded tree's roles; others keep their name, spaces as dashes.
ROLES = {
    "push button": "button",
    "toggle button": "button",
    "check box": "checkbox",
    "radio button": "radio",
    "combo box": "combobox",
    "entry": "textbox",
    "password text": "textbox",
    "spin button": "textbox",
    "label": "text",
    "static": "text",
    "paragraph": "text",
    "page tab": "tab",
    "icon": "image",
    "menu item": "menuitem",
    "check menu item": "menuitem",
    "radio menu item": "menuitem",
    "table cell": "cell",
}
# Layout and window containers: walked through, never nodes themselves (windows come from the
# window manager's list, which also covers apps without AT-SPI, such as xterm).
CONTAINERS = {
    "application", "frame", "window", "dialog", "filler", "panel", "scroll pane", "viewport",
    "split pane", "root pane", "layered pane", "glass pane", "redundant object", "unknown",
    "invalid", "section", "tool bar", "menu bar", "page tab list", "separator", "scroll bar",
    "drawing area", "canvas", "internal frame", "option pane", "desktop frame",
}  # fmt: skip
CHECKABLE = {"check box", "radio button", "toggle button", "check menu item", "radio menu item"}
TEXT_ROLES = {"text", "entry", "paragraph", "terminal", "spin button", "combo box", "heading",
              "table cell"}  # fmt: skip
ACTIONABLE = {"push button", "toggle button", "check box", "radio button", "combo box", "entry",
              "spin button", "text", "link", "page tab", "menu item", "menu", "slider",
              "table cell", "list item", "tree item"}  # fmt: skip


@dataclass
class _Node:
    ref: Ref
    role: str = ""
    name: str = ""
    state: int = 0
    count: int = 0
    box: tuple[int, int, int, int] | None = None
    value: str | None = None
    kids: list[_Node] = field(default_factory=list)

    def has(self, bit: int) -> bool:
        return bool(self.state >> bit & 1)


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 1.5  # the whole walk
    max_visit: int = 3000  # accessibles looked at
    max_nodes: int = 300  # nodes returned
    max_children: int = 300  # a node with more children is not descended into
    max_cells: int = 600  # cells of one table looked at
    max_text: int = 200  # characters of a node's text
    batch: int = 512  # calls in flight at once


class AtspiReader:
    """Reads the tree of one desktop's AT-SPI bus (``address``: a D-Bus address such as
    ``unix:path=/…/a11y-bus``). Thread-safe; reconnects after a failure."""

    def __init__(self, address: str, limits: Limits | None = None) -> None:
        self.address = address
        self.limits = limits or Limits()
        self._conn: Any = None
        self._lock = threading.Lock()

    def nodes(self, width: int, height: int) -> list[dict[str, Any]]:
        """The on-screen widgets of the desktop's apps ([] when the bus cannot be read)."""
        with self._lock:
            deadline = time.monotonic() + self.limits.timeout_s
            try:
                walk = _Walk(self._connect(), self.limits, deadline)
                roots = walk.run()
            except (OSError, TimeoutError, ValueError, RuntimeError):
                self.close()
                return []
            return _emit(roots, width, height, self.limits.max_nodes)

    def _connect(self) -> Any:
        if self._conn is None:
            from jeepney.io.blocking import open_dbus_connection

            self._conn = open_dbus_connection(self.address, auth_timeout=1.0)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()
            self._conn = None


class _Walk:
    """One breadth-first walk over a connection, bounded by ``deadline``."""

    def __init__(self, conn: Any, limits: Limits, deadline: float) -> None:
        self.conn = conn
        self.limits = limits
        self.deadline = deadline
        self.visited = 0

    def run(self) -> list[_Node]:
        (apps,) = self.many([(REGISTRY, ACC, "GetChildren", None, ())])
        roots = [_Node(_ref(r)) for r in (apps or ((),))[0]]
        level, tables = roots, []
        while level and not self.late():
            self.visited += len(level)
            shown = self.showing(level)
            self.describe(shown)
            self.place(shown)
            level = self.children(shown)
            tables += [n for n in shown if _is_big_table(n, self.limits.max_children)]
        for table in tables[:2]:
            if not self.late():
                self.cells(table)
        return roots

    def late(self) -> bool:
        return time.monotonic() > self.deadline or self.visited >= self.limits.max_visit

    # --- the phases of one level ---------------------------------------------------------

    def showing(self, level: list[_Node]) -> list[_Node]:
        """The nodes of ``level`` on screen (their state read); the others are dropped."""
        got = self.many([(n.ref, ACC, "GetState", None, ()) for n in level])
        for n, state in zip(level, got, strict=True):
            n.state = _state_bits(state[0]) if state else 0
        # An application root is not "showing" itself; its windows are.
        return [n for n in level if n.has(SHOWING) or n.ref[1].endswith("/root")]

    def describe(self, shown: list[_Node]) -> None:
        calls = []
        for n in shown:
            calls += [
                (n.ref, ACC, "GetRoleName", None, ()),
                (n.ref, PROPS, "Get", "ss", (ACC, "Name")),
                (n.ref, PROPS, "Get", "ss", (ACC, "ChildCount")),
            ]
        got = self.many(calls)
        for k, n in enumerate(shown):
            role, name, count = got[3 * k : 3 * k + 3]
            n.role = str(role[0]) if role else "unknown"
            n.name = _variant_str(name, self.limits.max_text)
            n.count = int(count[0][1]) if count and isinstance(count[0][1], int) else 0

    def place(self, shown: list[_Node]) -> None:
        """Boxes of the shown nodes, and the text of those that hold text."""
        boxed = [n for n in shown if n.role != "application"]
        texts = [n for n in boxed if n.role in TEXT_ROLES and n.role != "password text"]
        calls: list[Call] = [(n.ref, COMPONENT, "GetExtents", "u", (SCREEN_COORDS,)) for n in boxed]
        calls += [(n.ref, TEXT, "GetText", "ii", (0, -1)) for n in texts]  # -1: to the end
        got = self.many(calls)
        for n, box in zip(boxed, got[: len(boxed)], strict=True):
            n.box = _box(box)
        for n, text in zip(texts, got[len(boxed) :], strict=True):
            if text and isinstance(text[0], str):
                n.value = text[0][: self.limits.max_text]

    def children(self, shown: list[_Node]) -> list[_Node]:
        parents = [
            n for n in shown
            if 0 < n.count <= self.limits.max_children and not n.has(MANAGES_DESCENDANTS)
        ]  # fmt: skip
        got = self.many([(n.ref, ACC, "GetChildren", None, ()) for n in parents])
        level: list[_Node] = []
        for parent, kids in zip(parents, got, strict=True):
            refs = kids[0] if kids else []
            parent.kids = [_Node(_ref(r)) for r in refs[: self.limits.max_children]]
            level += parent.kids
        return level

    def cells(self, table: _Node) -> None:
        """The cells in view of a big table (a spreadsheet), as its children."""
        if table.box is None:
            return
        x, y, w, h = table.box
        corners = [(x + 2, y + 2), (x + w - 3, y + h - 3)]
        hits = self.many(
            [(table.ref, COMPONENT, "GetAccessibleAtPoint", "iiu", (*p, 0)) for p in corners]
        )
        if not all(hits):
            return
        index = self.many([(_ref(h[0]), ACC, "GetIndexInParent", None, ()) for h in hits])
        if not all(index):
            return
        rc = self.many(
            [(table.ref, TABLE, m, "i", (i[0],)) for i in index
             for m in ("GetRowAtIndex", "GetColumnAtIndex")]
        )  # fmt: skip
        if not all(rc):
            return
        (r0,), (c0,), (r1,), (c1,) = rc
        spots = [(r, c) for r in range(r0, r1 + 1) for c in range(c0, c1 + 1)]
        spots = spots[: self.limits.max_cells]
        got = self.many([(table.ref, TABLE, "GetAccessibleAt", "ii", rc_) for rc_ in spots])
        cells = [_Node(_ref(g[0]), role="table cell") for g in got if g]
        # Only the cells that hold text become nodes (the name box shows the focused one).
        texts = self.many([(c.ref, TEXT, "GetText", "ii", (0, -1)) for c in cells])
        full = []
        for c, text in zip(cells, texts, strict=True):
            if text and isinstance(text[0], str) and text[0]:
                c.value = text[0][: self.limits.max_text]
                full.append(c)
        self.showing(full)
        got = self.many(
            [(c.ref, PROPS, "Get", "ss", (ACC, "Name")) for c in full]
            + [(c.ref, COMPONENT, "GetExtents", "u", (SCREEN_COORDS,)) for c in full]
        )
        for k, c in enumerate(full):
            c.name = _variant_str(got[k], self.limits.max_text)
            c.box = _box(got[len(full) + k])
        table.kids = full

    # --- pipelined calls -----------------------------------------------------------------

    def many(self, calls: Sequence[Call]) -> list[Any]:
        """Each call's reply body (None for an error or no reply by the deadline); all the
        calls of a batch are sent before the first reply is read."""
        from jeepney import DBusAddress, MessageType, new_method_call
        from jeepney.low_level import HeaderFields

        out: list[Any] = [None] * len(calls)
        for start in range(0, len(calls), self.limits.batch):
            waiting: dict[int, int] = {}
            for k in range(start, min(start + self.limits.batch, len(calls))):
                (bus, path), iface, method, sig, body = calls[k]
                addr = DBusAddress(path, bus_name=bus, interface=iface)
                serial = next(self.conn.outgoing_serial)
                self.conn.send(new_method_call(addr, method, sig, body), serial=serial)
                waiting[serial] = k
            while waiting:
                left = self.deadline - time.monotonic()
                if left <= 0:
                    return out
                try:
                    msg = self.conn.receive(timeout=left)
                except TimeoutError:
                    return out
                k = waiting.pop(msg.header.fields.get(HeaderFields.reply_serial, -1), -1)
                if k >= 0 and msg.header.message_type == MessageType.method_return:
                    out[k] = msg.body
        return out


def _ref(value: Any) -> Ref:
    """An object reference from a reply; ValueError (ending the walk) for a malformed one."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(f"not an object reference: {value!r:.80}")
    return str(value[0]), str(value[1])


def _is_big_table(n: _Node, max_children: int) -> bool:
    return n.role == "table" and (n.has(MANAGES_DESCENDANTS) or n.count > max_children)


def _state_bits(words: Any) -> int:
    words = list(words)[:2] if isinstance(words, (list, tuple)) else []
    return sum(int(w) << (32 * i) for i, w in enumerate(words))


def _variant_str(reply: Any, limit: int) -> str:
    """The string inside a ``Properties.Get`` reply (a (signature, value) variant)."""
    if not reply:
        return ""
    value = reply[0][1] if isinstance(reply[0], tuple) else reply[0]
    return value[:limit] if isinstance(value, str) else ""


def _box(reply: Any) -> tuple[int, int, int, int] | None:
    if not reply or not isinstance(reply[0], tuple) or len(reply[0]) != 4:
        return None
    x, y, w, h = (int(v) for v in reply[0])
    return (x, y, w, h) if w > 0 and h > 0 else None


def _emit(roots: Iterable[_Node], width: int, height: int, limit: int) -> list[dict[str, Any]]:
    """Depth-first (document order): the nodes worth showing an agent, clipped to the screen.
    A node repeating an earlier one (same role and name, centre within a few pixels; toolkits
    export some widgets twice, e.g. LibreOffice's menu bar) is left out."""
    out: list[dict[str, Any]] = []
    seen: dict[tuple[str, str], list[tuple[int, int]]] = {}
    stack = list(reversed(list(roots)))
    while stack and len(out) < limit:
        n = stack.pop()
        stack += reversed(n.kids)
        node = _as_node(n, width, height)
        if node is None:
            continue
        x, y, w, h = node["box"]
        cx, cy = x + w // 2, y + h // 2
        centres = seen.setdefault((node["role"], node["name"]), [])
        if any(abs(cx - a) <= 8 and abs(cy - b) <= 8 for a, b in centres):
            continue
        centres.append((cx, cy))
        out.append(node)
    return out


def _as_node(n: _Node, width: int, height: int) -> dict[str, Any] | None:
    if n.role in CONTAINERS or not n.has(SHOWING) or n.box is None:
        return None
    x, y, w, h = n.box
    x0, y0, x1, y1 = max(x, 0), max(y, 0), min(x + w, width), min(y + h, height)
    if x1 <= x0 or y1 <= y0:
        return None  # off screen
    editable = n.has(EDITABLE)
    if not (n.name or n.value or n.role in ACTIONABLE):
        return None
    role = ROLES.get(n.role, n.role.replace(" ", "-"))
    if n.role == "text":
        role = "textbox" if editable else "text"
    node: dict[str, Any] = {
        "role": role,
        "name": n.name or (n.value if role == "text" else "") or "",
        "box": [x0, y0, x1 - x0, y1 - y0],
        "focused": n.has(FOCUSED),
        "disabled": not (n.has(ENABLED) or n.has(SENSITIVE)),
    }
    if n.value is not None and role != "text":
        node["value"] = n.value
    if n.role in CHECKABLE:
        node["checked"] = n.has(CHECKED)
    return node
