"""The Qwen3-VL agent style: Qwen3-VL's own ``computer_use`` prompt, as the reference's
``Qwen3VLAgentLocal`` builds it (ComputerSD ``online-rl/agents/qwen3vl_agent.py``).

Context for step t with H screens (H = ``history_screens``, the reference's
``max_image_history_length`` = 3)::

    system     # Tools … <tools>{computer_use schema}</tools> … # Response format …
    user       [screen t-H+1]                       ┐ the last H-1 earlier steps,
    assistant  full response of step t-H+1          ┘ oldest first
    …
    user       [screen t] Please generate the next move … Instruction: … Previous actions:
               Step 1: <Action: line of response 1> … (every earlier step)

Answers: :mod:`serve_apps.prompting.computer_use` (relative 0..999 coordinates). The style
itself is ``styles.Qwen3VLStyle``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from serve_apps.prompting import computer_use as cu

DESCRIPTION = "\n".join(
    [
        "Use a mouse and keyboard to interact with a computer, and take screenshots.",
        "* This is an interface to a desktop GUI. You do not have access to a terminal or "
        "applications menu. You must click on desktop icons to start applications.",
        "* Some applications may take time to start or process actions, so you may need to wait "
        "and take successive screenshots to see the results of your actions.",
        cu.RELATIVE_RESOLUTION,
        "* Whenever you intend to move the cursor to click on an element like an icon, you should "
        "consult a screenshot to determine the coordinates of the element before moving the "
        "cursor.",
        "* If you tried clicking on a program or link but it failed to load even after waiting, "
        "try adjusting your cursor position so that the tip of the cursor visually falls on the "
        "element that you want to click.",
        "* Make sure to click any buttons, links, icons, etc with the cursor tip in the center of "
        "the element. Don't click boxes on their edges unless asked.",
    ]
)

# The reference's text byte for byte, including the indentation its triple-quoted string
# ends with: the model was prompted with exactly this JSON.
ACTION_HELP = """
* `key`: Performs key down presses on the arguments passed in order, then performs key releases in reverse order.
* `type`: Type a string of text on the keyboard.
* `mouse_move`: Move the cursor to a specified (x, y) pixel coordinate on the screen.
* `left_click`: Click the left mouse button at a specified (x, y) pixel coordinate on the screen.
* `left_click_drag`: Click and drag the cursor to a specified (x, y) pixel coordinate on the screen.
* `right_click`: Click the right mouse button at a specified (x, y) pixel coordinate on the screen.
* `middle_click`: Click the middle mouse button at a specified (x, y) pixel coordinate on the screen.
* `double_click`: Double-click the left mouse button at a specified (x, y) pixel coordinate on the screen.
* `triple_click`: Triple-click the left mouse button at a specified (x, y) pixel coordinate on the screen (simulated as double-click since it's the closest action).
* `scroll`: Performs a scroll of the mouse scroll wheel.
* `hscroll`: Performs a horizontal scroll (mapped to regular scroll).
* `wait`: Wait specified seconds for the change to happen.
* `terminate`: Terminate the current task and report its completion status.
        """

ACTIONS = (
    "key",
    "type",
    "mouse_move",
    "left_click",
    "left_click_drag",
    "right_click",
    "middle_click",
    "double_click",
    "triple_click",
    "scroll",
    "hscroll",
    "wait",
    "terminate",
)

TOOL = cu.tool_spec(DESCRIPTION, ACTION_HELP, ACTIONS)
SYSTEM_PROMPT = cu.tool_system_prompt(TOOL, ensure_ascii=True)
DIALECT = cu.Dialect(no_line="Execute the tool call")
HISTORY_SCREENS = 3
"""The reference's ``max_image_history_length``: the current screen and two earlier steps."""


def qwen3vl_messages(
    instruction: str,
    screens: Sequence[bytes],
    responses: Sequence[str],
    history_screens: int = HISTORY_SCREENS,
) -> tuple[list[dict[str, Any]], list[bytes]]:
    """The context of the next step and its images in order. ``screens`` ends with the current
    one; ``responses`` are the full earlier responses, oldest first."""
    if history_screens < 1:
        raise ValueError(f"history_screens must be >= 1, got {history_screens}")
    turns = min(history_screens - 1, len(responses))
    shown = cu.earlier_screens(screens, turns)
    messages = [cu.system_message(SYSTEM_PROMPT)]
    for response in responses[len(responses) - turns :]:
        messages += [cu.user_message(), cu.assistant_message(response)]
    actions = [cu.previous_action(r, DIALECT) for r in responses]
    messages.append(cu.user_message(cu.instruction_prompt(instruction, actions)))
    return messages, [*shown, screens[-1]]
