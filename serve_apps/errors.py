"""Errors a deployment returns to its caller (handle or HTTP) instead of a stack trace."""

from __future__ import annotations

from pydantic import ValidationError


class RequestError(ValueError):
    """A request the deployment refuses; ``status`` is the HTTP code the endpoint answers with.

    Raised through a Serve handle it arrives as a ``RayTaskError`` whose message holds this text.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        code: str = "invalid_request",
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.param = param

    def __reduce__(self):  # keep status/code/param across Ray's pickling
        return (_rebuild, (self.message, self.status, self.code, self.param))


def _rebuild(message: str, status: int, code: str, param: str | None) -> RequestError:
    return RequestError(message, status=status, code=code, param=param)


def format_validation(exc: ValidationError) -> str:
    """A pydantic error as one line: ``field.path: message; ...`` (at most 10 errors)."""
    parts = []
    for err in exc.errors()[:10]:
        where = ".".join(str(p) for p in err["loc"]) or "request"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)
