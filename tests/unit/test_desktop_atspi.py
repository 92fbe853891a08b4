"""The AT-SPI tree's pure parts: which accessibles become nodes, in what order and shape, and
how malformed replies are read. The walk over a real bus is tested on real desktops
(tests/integration/test_desktop_local.py)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from env_client.a11y import parse_tree, to_xml
from env_client.desktop.atspi import (
    CHECKED,
    EDITABLE,
    ENABLED,
    FOCUSED,
    SHOWING,
    AtspiReader,
    Limits,
    _box,
    _emit,
    _Node,
    _ref,
    _state_bits,
    _variant_str,
)

ON = 1 << SHOWING | 1 << ENABLED


def node(role: str, name: str = "", box=(10, 10, 50, 20), state: int = ON, **kw) -> _Node:
    return _Node(("bus", f"/{role}/{name}"), role=role, name=name, state=state, box=box, **kw)


def test_containers_are_walked_through_and_widgets_come_out_in_document_order() -> None:
    frame = node("frame", "Editor", box=(0, 0, 800, 600))
    panel = node("panel", box=(0, 0, 800, 600))
    menu_bar = node("menu bar", box=(0, 0, 800, 25))
    menu_bar.kids = [
        node("menu", "File", box=(0, 0, 40, 25)),
        node("menu", "Edit", (40, 0, 40, 25)),
    ]
    text = node("text", box=(0, 30, 800, 500), state=ON | 1 << EDITABLE | 1 << FOCUSED)
    text.value = "buy milk"
    panel.kids = [menu_bar, text, node("push button", "Save", box=(700, 560, 80, 30))]
    frame.kids = [panel]
    app = _Node(("bus", "/root"), role="application", name="mousepad", kids=[frame])
    out = _emit([app], 1024, 768, limit=100)
    assert [(n["role"], n["name"]) for n in out] == [
        ("menu", "File"), ("menu", "Edit"), ("textbox", ""), ("button", "Save")
    ]  # fmt: skip
    assert out[2]["value"] == "buy milk" and out[2]["focused"] is True
    # The nodes are the embedded tree's: they survive its XML.
    back = parse_tree(to_xml(out, 1024, 768))
    assert [n.role for n in back] == ["menu", "menu", "textbox", "button"]
    assert back[2].value == "buy milk" and back[3].center == (740, 575)


def test_hidden_off_screen_and_empty_accessibles_are_left_out_and_boxes_clipped() -> None:
    kids = [
        node("push button", "Hidden", state=1 << ENABLED),  # not showing
        node("push button", "Away", box=(2000, 10, 50, 20)),  # off screen
        node("label", ""),  # nothing to read or act on
        node("label", "Wide", box=(-20, 700, 2000, 100)),  # clipped to the screen
        node("push button", "Boxless", box=None),
    ]
    out = _emit(kids, 1024, 768, limit=100)
    assert out == [
        {"role": "text", "name": "Wide", "box": [0, 700, 1024, 68], "focused": False,
         "disabled": False}
    ]  # fmt: skip


def test_repeated_widgets_are_shown_once_and_the_node_cap_holds() -> None:
    # LibreOffice exports its menu bar twice, a pixel or so apart.
    twins = [node("menu", "File", box=(0, 19, 39, 25)), node("menu", "File", box=(0, 19, 35, 19))]
    far = node("menu", "File", box=(300, 19, 39, 25))  # another File menu, elsewhere
    assert len(_emit([*twins, far], 1024, 768, limit=100)) == 2
    many = [node("push button", f"b{i}", box=(i, 0, 5, 5)) for i in range(50)]
    assert [n["name"] for n in _emit(many, 1024, 768, limit=7)] == [f"b{i}" for i in range(7)]


def test_states_become_flags() -> None:
    box = node("check box", "Bold", state=ON | 1 << CHECKED)
    off = node("push button", "Gone", state=1 << SHOWING)  # neither enabled nor sensitive
    cell = node("table cell", "B2", value="42")
    out = _emit([box, off, cell], 1024, 768, limit=10)
    assert out[0]["checked"] is True and out[0]["role"] == "checkbox"
    assert out[1]["disabled"] is True and "checked" not in out[1]
    assert (out[2]["role"], out[2]["name"], out[2]["value"]) == ("cell", "B2", "42")


def test_malformed_replies_are_read_as_nothing() -> None:
    assert _state_bits(([1 << SHOWING, 1],)[0]) == 1 << SHOWING | 1 << 32
    assert _state_bits("junk") == 0
    assert _variant_str((("s", "x" * 500),), 10) == "x" * 10
    assert _variant_str((("i", 5),), 10) == "" and _variant_str(None, 10) == ""
    assert _box(((1, 2, 3, 4),)) == (1, 2, 3, 4)
    assert _box(((1, 2, 0, 4),)) is None and _box(("nope",)) is None and _box(None) is None
    assert _ref([":1.5", "/a/b"]) == (":1.5", "/a/b")
    with pytest.raises(ValueError, match="not an object reference"):
        _ref("/a/b")


def test_a_bus_that_is_not_there_gives_an_empty_tree() -> None:
    missing = Path(tempfile.mkdtemp()) / "no-bus"
    reader = AtspiReader(f"unix:path={missing}", Limits(timeout_s=0.5))
    assert reader.nodes(1024, 768) == []
    assert reader.nodes(1024, 768) == []  # and again: it retries the connection
