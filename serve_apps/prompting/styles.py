"""Agent prompt styles behind one interface: what the policy sees and how its answer is read.

A style turns the episode so far into the ordinary context ``c`` (messages + images), parses a
response into an :class:`~env_client.actions.Action`, writes the history line of a response,
and renders a scripted action as the text the policy would have answered. The rollout workers,
the analyzer pipeline's episodes and evaluation all go through the policy's configured style
(``policy.agent_style``), so a checkpoint is always prompted the way it was trained.

- ``toolcall``: METHOD.md §1, "Action: …" + a ``computer_use`` tool call; last H screens.
- ``elements``: :mod:`serve_apps.prompting.elements`, numbered elements and one short answer
  line, for tiny models on the embedded environment.
- ``qwen3vl``: :mod:`serve_apps.prompting.qwen3vl`, Qwen3-VL's own ``computer_use`` prompt with
  earlier steps replayed as user(screen)/assistant(response) turns, as the reference agent.
- ``evocua``: :mod:`serve_apps.prompting.evocua`, EvoCUA's agent prompt, as the reference agent.

The two reference styles keep the policy's *full* responses as history (their ``summarize``
returns the text unchanged): the prompt replays the last ones and lists every ``Action:`` line.

    style = make_style("elements")
    messages, images = style.prompt(instruction, screens, history)
    action = style.parse(text, screens[-1])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar, Literal, Protocol

from env_client.actions import Action, parse_response, render_response
from env_client.observation import png_size
from serve_apps.prompting import computer_use as cu
from serve_apps.prompting import elements as el
from serve_apps.prompting import evocua, qwen3vl
from serve_apps.prompting.messages import HISTORY_SCREENSHOTS, agent_messages, summarize_response

StyleName = Literal["toolcall", "elements", "qwen3vl", "evocua"]


@dataclass(frozen=True)
class Screen:
    """One screen the agent saw: the PNG and, where the environment gives one, its
    accessibility tree (XML of :mod:`env_client.a11y`)."""

    png: bytes
    tree: str | None = None
    size_hint: tuple[int, int] | None = field(default=None, compare=False)

    @cached_property
    def size(self) -> tuple[int, int]:
        got = self.size_hint or png_size(self.png)
        if got is None:
            raise ValueError("screen has no PNG screenshot to take its size from")
        return got

    @cached_property
    def elements(self) -> list[el.Listed]:
        return el.list_elements(self.tree, self.size) if self.tree else []


class AgentStyle(Protocol):
    @property
    def name(self) -> str: ...  # read-only, so frozen dataclasses match

    def prompt(
        self, instruction: str, screens: Sequence[Screen], history: Sequence[str]
    ) -> tuple[list[dict[str, Any]], list[bytes]]: ...

    def parse(self, text: str, screen: Screen) -> Action: ...

    def summarize(self, text: str, screen: Screen) -> str: ...

    def render(self, action: Action, screen: Screen) -> str | None: ...

    def screen_context(self, screen: Screen, instruction: str) -> str:
        """Text the analyzer needs beside the screenshot to read this style's answers."""
        ...


@dataclass(frozen=True)
class ToolCallStyle:
    """METHOD.md §1's answer format; ``system`` None = the short system prompt."""

    history_screens: int = HISTORY_SCREENSHOTS
    system: str | None = None
    name: str = "toolcall"

    def prompt(
        self, instruction: str, screens: Sequence[Screen], history: Sequence[str]
    ) -> tuple[list[dict[str, Any]], list[bytes]]:
        return agent_messages(
            instruction,
            [s.png for s in screens],
            history,
            num_screenshots=self.history_screens,
            system=self.system,
        )

    def parse(self, text: str, screen: Screen) -> Action:
        return parse_response(text)

    def summarize(self, text: str, screen: Screen) -> str:
        return summarize_response(text)

    def render(self, action: Action, screen: Screen) -> str | None:
        return render_response(action)

    def screen_context(self, screen: Screen, instruction: str) -> str:
        return ""  # the answer carries its own coordinates


@dataclass(frozen=True)
class ElementsStyle:
    """Numbered elements, one short answer line, the current screen only."""

    name: str = "elements"

    def prompt(
        self, instruction: str, screens: Sequence[Screen], history: Sequence[str]
    ) -> tuple[list[dict[str, Any]], list[bytes]]:
        if not screens:
            raise ValueError("the elements style needs the current screen")
        current = screens[-1]
        return el.agent_messages(instruction, current.png, current.elements, history)

    def parse(self, text: str, screen: Screen) -> Action:
        return el.parse_answer(text, screen.elements)

    def summarize(self, text: str, screen: Screen) -> str:
        return el.summarize_answer(text, screen.elements)

    def render(self, action: Action, screen: Screen) -> str | None:
        return el.encode_action(action, screen.elements, screen.size)

    def screen_context(self, screen: Screen, instruction: str) -> str:
        return "\n".join(el.element_line(e, instruction) for e in screen.elements)


@dataclass(frozen=True)
class _ComputerUseStyle:
    """The answer side of the reference families (:mod:`serve_apps.prompting.computer_use`);
    each subclass sets its dialect and prompt builder."""

    dialect: ClassVar[cu.Dialect] = cu.Dialect(no_line=cu.NO_ACTION)

    def parse(self, text: str, screen: Screen) -> Action:
        return cu.parse_tool_response(text, self.dialect)

    def summarize(self, text: str, screen: Screen) -> str:
        return text  # the full response: the prompt replays it and reads its Action: line

    def render(self, action: Action, screen: Screen) -> str | None:
        return cu.render_tool_response(action) if action.is_valid else None

    def screen_context(self, screen: Screen, instruction: str) -> str:
        return ""  # the answer carries its own coordinates

    history_screens: int  # set by each family
    messages: ClassVar[Callable[..., tuple[list[dict[str, Any]], list[bytes]]]]

    def prompt(
        self, instruction: str, screens: Sequence[Screen], history: Sequence[str]
    ) -> tuple[list[dict[str, Any]], list[bytes]]:
        pngs = [s.png for s in screens]
        return self.messages(instruction, pngs, history, self.history_screens)

    def previous_actions(self, history: Sequence[str]) -> list[str]:
        """The previous-actions list the prompt shows for these full responses."""
        return [cu.previous_action(text, self.dialect) for text in history]


@dataclass(frozen=True)
class Qwen3VLStyle(_ComputerUseStyle):
    """Qwen3-VL's tool-call prompt; H screens = H-1 earlier steps replayed + the current."""

    history_screens: int = qwen3vl.HISTORY_SCREENS
    name: str = "qwen3vl"
    dialect: ClassVar[cu.Dialect] = qwen3vl.DIALECT
    messages = staticmethod(qwen3vl.qwen3vl_messages)


@dataclass(frozen=True)
class EvoCUAStyle(_ComputerUseStyle):
    """EvoCUA's S2 prompt; H screens = H-1 earlier steps replayed + the current."""

    history_screens: int = evocua.HISTORY_SCREENS
    name: str = "evocua"
    dialect: ClassVar[cu.Dialect] = evocua.DIALECT
    messages = staticmethod(evocua.evocua_messages)


_FACTORIES: dict[str, Callable[[int | None], AgentStyle]] = {
    "toolcall": lambda h: ToolCallStyle(history_screens=h or HISTORY_SCREENSHOTS),
    "elements": lambda h: ElementsStyle(),  # the current screen only
    "qwen3vl": lambda h: Qwen3VLStyle(history_screens=h or qwen3vl.HISTORY_SCREENS),
    "evocua": lambda h: EvoCUAStyle(history_screens=h or evocua.HISTORY_SCREENS),
}
STYLES: tuple[str, ...] = tuple(_FACTORIES)


def make_style(name: str, history_screens: int | None = None) -> AgentStyle:
    """The style called ``name`` (a config's ``policy.agent_style``) showing ``history_screens``
    screens (H, the current one included) where the style shows several; None = the style's
    default (the reference agent's for qwen3vl and evocua)."""
    factory = _FACTORIES.get(name)
    if factory is None:
        raise ValueError(f"agent style {name!r}: allowed {list(STYLES)}")
    return factory(history_screens)
