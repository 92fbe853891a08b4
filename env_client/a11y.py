"""The embedded environment's accessibility tree: a flat XML list of screen elements.

Format (boxes in screen pixels, document order)::

    <tree width="160" height="210">
      <node role="button" name="OK" x="99" y="148" w="36" h="21"/>
      <node role="textbox" name="" value="Alice" focused="true" x="17" y="64" w="128" h="21"/>
    </tree>

Roles: text, button, link, textbox, checkbox, radio, tab, combobox, slider, image, graphic, … .
The server writes it with :func:`to_xml`; :func:`parse_tree` reads it back into
:class:`A11yNode` (for prompts, e.g. element centres on the 0..999 grid).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import quoteattr

_FLAGS = ("checked", "focused", "disabled")


@dataclass(frozen=True)
class A11yNode:
    role: str
    name: str
    box: tuple[int, int, int, int]  # x, y, w, h in screen pixels
    value: str | None = None
    checked: bool | None = None
    focused: bool = False
    disabled: bool = False

    @property
    def center(self) -> tuple[int, int]:
        x, y, w, h = self.box
        return x + w // 2, y + h // 2


def _attr(name: str, value: Any) -> str:
    if isinstance(value, bool):
        value = "true" if value else "false"
    return f"{name}={quoteattr(_xml_safe(str(value)))}"


def _xml_safe(text: str) -> str:
    # XML 1.0 forbids most control characters even when escaped.
    return "".join(c for c in text if c in "\t\n\r" or ord(c) >= 0x20)


def to_xml(nodes: Iterable[Mapping[str, Any]], width: int, height: int) -> str:
    """Nodes ({role, name, box, value?, checked?, focused?, disabled?}) → the tree's XML."""
    lines = [f'<tree width="{width}" height="{height}">']
    for n in nodes:
        x, y, w, h = (int(v) for v in n["box"])
        attrs = [_attr("role", n["role"]), _attr("name", n.get("name", ""))]
        if n.get("value") is not None:
            attrs.append(_attr("value", n["value"]))
        attrs += [_attr(f, n[f]) for f in _FLAGS if n.get(f) is not None]
        attrs += [f'x="{x}" y="{y}" w="{w}" h="{h}"']
        lines.append(f"  <node {' '.join(attrs)}/>")
    lines.append("</tree>")
    return "\n".join(lines)


def parse_tree(xml: str | None) -> list[A11yNode]:
    """The tree's XML → nodes; [] for None or text that is not such a tree."""
    if not xml:
        return []
    try:
        root = ET.fromstring(xml)
    except ET.ParseError:
        return []
    nodes = []
    for el in root.iter("node"):
        try:
            box = tuple(int(el.get(k, "0")) for k in ("x", "y", "w", "h"))
        except ValueError:
            continue
        checked = el.get("checked")
        nodes.append(
            A11yNode(
                role=el.get("role", ""),
                name=el.get("name", ""),
                box=box,  # type: ignore[arg-type]
                value=el.get("value"),
                checked=None if checked is None else checked == "true",
                focused=el.get("focused") == "true",
                disabled=el.get("disabled") == "true",
            )
        )
    return nodes
