"""Typed errors of the environment client.

The rollout side catches :class:`EnvError` (the base) and retries the episode on a fresh
session, within its budget. Subclasses say why: the server refused the call (4xx/5xx),
the session is gone, or the service stayed unreachable through all retries.
"""

from __future__ import annotations


class EnvError(RuntimeError):
    """An environment call failed. Names the session, the operation and the server's message."""

    def __init__(
        self,
        message: str,
        *,
        session_id: str | None = None,
        operation: str = "",
        status: int | None = None,
    ) -> None:
        self.session_id = session_id
        self.operation = operation
        self.status = status
        self.server_message = message
        where = f"session {session_id}" if session_id else "environment service"
        code = f" (HTTP {status})" if status is not None else ""
        super().__init__(f"{operation} on {where} failed{code}: {message}")


class SessionLost(EnvError):
    """The session is unknown or has ended (reclaimed, crashed, released): start a fresh one."""


class EnvUnavailable(EnvError):
    """Transient failures (5xx, transport, timeouts) outlasted the retries or the deadline, or
    the call may not be retried safely (a step against a server without idempotency)."""


class ProtocolError(EnvError):
    """The server answered something the protocol does not allow (e.g. a foreign operation_id)."""
