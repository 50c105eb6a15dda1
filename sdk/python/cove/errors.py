"""Typed exceptions.

Every error the server reports is raised as a :class:`CoveError` (or a subclass chosen by the
HTTP status) carrying the API's machine-readable ``code`` and human-readable ``message``, the
HTTP ``status`` and the ``request_id`` when the server sent one.
"""

from __future__ import annotations

import json
from typing import Any, Optional

__all__ = [
    "CoveError",
    "InvalidRequestError",
    "AuthenticationError",
    "PermissionDeniedError",
    "NotFoundError",
    "ConflictError",
    "RateLimitError",
    "ServerError",
    "RequestTimeoutError",
    "ServerUnreachableError",
    "SandboxStateError",
]


class CoveError(Exception):
    """Base class of every error raised by the SDK.

    Attributes:
        code: the API's machine-readable error code (e.g. ``"SANDBOX::NOT_FOUND"``,
            ``"FILE_NOT_FOUND"``), or an SDK code such as ``"SDK::TIMEOUT"``.
        message: the human-readable message.
        status: the HTTP status of the response, when there was one.
        request_id: the ``X-Request-ID`` of the response, when there was one.
        body: the decoded error body (usually ``{"code": ..., "message": ...}``).
    """

    def __init__(self, message: str, code: Optional[str] = None, status: Optional[int] = None,
                 request_id: Optional[str] = None, body: Any = None) -> None:
        super().__init__(f"{code}: {message}" if code else message)
        self.code = code
        self.message = message
        self.status = status
        self.request_id = request_id
        self.body = body


class InvalidRequestError(CoveError):
    """HTTP 400/422: the request was refused as malformed or invalid."""


class AuthenticationError(CoveError):
    """HTTP 401: the API key is missing or wrong."""


class PermissionDeniedError(CoveError):
    """HTTP 403: the key may not do this (quota, admin-only operation, ...)."""


class NotFoundError(CoveError):
    """HTTP 404: no such sandbox, file, command, context, ..."""


class ConflictError(CoveError):
    """HTTP 409: the operation conflicts with the current state (e.g. pausing a paused
    sandbox)."""


class RateLimitError(CoveError):
    """HTTP 429: too many requests or sandboxes."""


class ServerError(CoveError):
    """HTTP 5xx: the server (or the agent in the sandbox) failed."""


class RequestTimeoutError(CoveError):
    """The server did not answer in time (the SDK's own timeout)."""


class ServerUnreachableError(CoveError):
    """The server could not be reached (connection refused, reset, DNS failure, ...)."""


class SandboxStateError(CoveError):
    """The sandbox did not reach the state an operation waits for (e.g. it failed while
    starting)."""


_BY_STATUS = {400: InvalidRequestError, 401: AuthenticationError, 403: PermissionDeniedError,
              404: NotFoundError, 409: ConflictError, 422: InvalidRequestError,
              429: RateLimitError}


def error_from_response(status: int, content: bytes, request_id: Optional[str] = None,
                        what: str = "request") -> CoveError:
    """The exception for a non-2xx response: its class from the status, ``code`` and
    ``message`` from the OpenSandbox error body ``{"code", "message"}`` when it is one."""
    text = content.decode("utf-8", "replace")
    body: Any = text
    code: Optional[str] = None
    message = text.strip() or f"{what} failed with HTTP {status}"
    try:
        body = json.loads(text) if text else None
    except ValueError:
        pass
    if isinstance(body, dict):
        if body.get("code") is not None:
            code = str(body["code"])
        if body.get("message") is not None:
            message = str(body["message"])
    cls = _BY_STATUS.get(status, ServerError if status >= 500 else CoveError)
    return cls(message, code=code or f"HTTP_{status}", status=status, request_id=request_id,
               body=body)
