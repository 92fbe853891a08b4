"""Prompt formats (pure Python) and the prompt builder (``serve_apps.prompting.inputs``, torch).

Importing this package loads no torch: the rollout side uses the message builders directly.
"""

from serve_apps.prompting.analyzer import (
    FULL_ANALYZER_PROMPT,
    SHORT_ANALYZER_PROMPT,
    analyzer_messages,
)
from serve_apps.prompting.messages import (
    FULL_SYSTEM_PROMPT,
    HISTORY_SCREENSHOTS,
    PRIVILEGED_BLOCK,
    SHORT_SYSTEM_PROMPT,
    agent_messages,
    guidance_text,
    history_text,
    privileged_messages,
    summarize_response,
    system_prompt,
)

__all__ = [
    "FULL_ANALYZER_PROMPT",
    "FULL_SYSTEM_PROMPT",
    "HISTORY_SCREENSHOTS",
    "PRIVILEGED_BLOCK",
    "SHORT_ANALYZER_PROMPT",
    "SHORT_SYSTEM_PROMPT",
    "agent_messages",
    "analyzer_messages",
    "guidance_text",
    "history_text",
    "privileged_messages",
    "summarize_response",
    "system_prompt",
]
