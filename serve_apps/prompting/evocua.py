"""The EvoCUA agent style: EvoCUA's "S2" prompt, as the reference's ``EvoCUAAgent`` builds it
(ComputerSD ``online-rl/agents/evocua_agent.py``, ``prompt_style=S2``, relative coordinates).

Context for step t with H screens (H = ``history_screens``; the reference keeps
``max_history_turns`` = 3 earlier steps, so H = 4)::

    system     # Tools … <tools>{EvoCUA's computer_use schema}</tools> … # Response format …
    user       [screen t-H+1] Please generate the next move … Instruction: … Previous actions:
               Step 1: … (only the steps older than the replayed ones)
    assistant  full response of step t-H+1
    user       [screen t-H+2]
    assistant  full response of step t-H+2
    …
    user       [screen t]        (the instruction text comes here when there is no history)

Answers: :mod:`serve_apps.prompting.computer_use`. EvoCUA's schema also has ``key_down`` and
``key_up`` (hold a key across steps), which our action model cannot express: such an answer is
an invalid action. The style itself is ``styles.EvoCUAStyle``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from serve_apps.prompting import computer_use as cu

DESCRIPTION = "\n".join(
    [
        "Use a mouse and keyboard to interact with a computer, and take screenshots.",
        "* This is an interface to a desktop GUI. You must click on desktop icons to start "
        "applications.",
        "* Some applications may take time to start or process actions, so you may need to wait "
        "and take successive screenshots to see the results of your actions. E.g. if you click "
        "on Firefox and a window doesn't open, try wait and taking another screenshot.",
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

# The reference's text byte for byte (it lists `answer`, which its enum leaves out).
ACTION_HELP = """
* `key`: Performs key down presses on the arguments passed in order, then performs key releases in reverse order.
* `key_down`: Press and HOLD the specified key(s) down in order (no release). Use this for stateful holds like holding Shift while clicking.
* `key_up`: Release the specified key(s) in reverse order.
* `type`: Type a string of text on the keyboard.
* `mouse_move`: Move the cursor to a specified (x, y) pixel coordinate on the screen.
* `left_click`: Click the left mouse button at a specified (x, y) pixel coordinate on the screen.
* `left_click_drag`: Click and drag the cursor to a specified (x, y) pixel coordinate on the screen.
* `right_click`: Click the right mouse button at a specified (x, y) pixel coordinate on the screen.
* `middle_click`: Click the middle mouse button at a specified (x, y) pixel coordinate on the screen.
* `double_click`: Double-click the left mouse button at a specified (x, y) pixel coordinate on the screen.
* `triple_click`: Triple-click the left mouse button at a specified (x, y) pixel coordinate on the screen.
* `scroll`: Performs a scroll of the mouse scroll wheel.
* `hscroll`: Performs a horizontal scroll (mapped to regular scroll).
* `wait`: Wait specified seconds for the change to happen.
* `terminate`: Terminate the current task and report its completion status.
* `answer`: Answer a question.
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
    "wait",
    "terminate",
    "key_down",
    "key_up",
)

TOOL = cu.tool_spec(DESCRIPTION, ACTION_HELP, ACTIONS)
SYSTEM_PROMPT = cu.tool_system_prompt(TOOL, ensure_ascii=False)
# The reference's S2 parser also takes "click" for a left click and executes hscroll.
DIALECT = cu.Dialect(
    no_line="Execute the computer action",
    aliases={"click": "left_click"},
    unsupported=frozenset({"key_down", "key_up"}),
)
HISTORY_SCREENS = 4
"""The current screen and the reference's ``max_history_turns`` = 3 earlier steps."""
MAX_NEW_TOKENS = 32768
"""The reference's ``ROLLOUT_MAX_RESPONSE_LEN`` for EvoCUA."""


def evocua_messages(
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
    start = len(responses) - turns
    actions = [cu.previous_action(r, DIALECT) for r in responses]
    # The instruction rides on the oldest replayed screen, listing only the steps before it.
    text = cu.instruction_prompt(instruction, actions[:start])
    messages = [cu.system_message(SYSTEM_PROMPT)]
    for i, response in enumerate(responses[start:]):
        messages += [cu.user_message(text if i == 0 else None), cu.assistant_message(response)]
    messages.append(cu.user_message(None if turns else text))
    return messages, [*shown, screens[-1]]
