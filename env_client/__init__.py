"""Talking to GUI environments: the session protocol client, the action model, and the embedded
MiniWoB++ environment server. Imports no other package of this project and no Ray.

- ``env_client.config``: EnvClientConfig, EmbeddedEnvConfig (pydantic).
- ``env_client.actions``: policy text ⇄ Action ⇄ wire ACTION (parse_response, to_protocol,
  render_response).
- ``env_client.client``: EnvClient / Session (async, aiohttp), typed errors in
  ``env_client.errors``, observations in ``env_client.observation``.
- ``env_client.server``: the embedded server (``python -m env_client.server``,
  ``start_embedded_server``).
- ``env_client.tasks``: task lists (``load_tasks("train")``); ``env_client.scripted``: expert
  plans from the embedded server's ground truth.

Importing the package loads only pydantic-level modules; aiohttp and Selenium load on use.
"""

from env_client.actions import Action, parse_response, render_response, to_protocol
from env_client.config import EmbeddedEnvConfig, EnvClientConfig
from env_client.errors import EnvError, EnvUnavailable, ProtocolError, SessionLost

__all__ = [
    "Action",
    "EmbeddedEnvConfig",
    "EnvClientConfig",
    "EnvError",
    "EnvUnavailable",
    "ProtocolError",
    "SessionLost",
    "parse_response",
    "render_response",
    "to_protocol",
]
