"""Where the server is and which key to use, found the way the ``cove`` CLI finds them."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

DEFAULT_SERVER = "http://127.0.0.1:8080"
DEFAULT_STATE_DIR = "/var/lib/cove"
DEFAULT_REQUEST_TIMEOUT = 60.0


def _first_env(*names: str) -> Optional[str]:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


def _normalize_server(raw: str) -> str:
    url = raw if "://" in raw else "http://" + raw
    return url.rstrip("/")


def _state_dir_key() -> Optional[str]:
    """The first line of ``$COVE_STATE_DIR/api_key`` (or /var/lib/cove/api_key), the key
    coved writes when none is configured; None when it cannot be read."""
    path = os.path.join(os.environ.get("COVE_STATE_DIR") or DEFAULT_STATE_DIR, "api_key")
    try:
        with open(path, encoding="utf-8") as f:
            line = f.readline().rstrip("\r\n ")
    except OSError:
        return None
    return line or None


@dataclass(frozen=True)
class ConnectionConfig:
    """How to reach coved.

    Attributes:
        server: base URL of coved, e.g. ``http://127.0.0.1:8080``.
        api_key: the ``OPEN-SANDBOX-API-KEY`` to send, or None.
        request_timeout: seconds to wait for an ordinary API answer.
    """

    server: str
    api_key: Optional[str]
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT

    @classmethod
    def resolve(cls, server: Optional[str] = None, api_key: Optional[str] = None,
                request_timeout: Optional[float] = None) -> "ConnectionConfig":
        """Arguments win; then ``COVE_SERVER`` (else ``OPEN_SANDBOX_DOMAIN``, else
        http://127.0.0.1:8080) and ``COVE_API_KEY`` (else ``OPEN_SANDBOX_API_KEY``, else the
        ``api_key`` file in ``$COVE_STATE_DIR`` or /var/lib/cove), as the CLI does. A server
        given without a scheme gets ``http://``."""
        raw_server = server or _first_env("COVE_SERVER", "OPEN_SANDBOX_DOMAIN") or DEFAULT_SERVER
        key = api_key or _first_env("COVE_API_KEY", "OPEN_SANDBOX_API_KEY") or _state_dir_key()
        return cls(server=_normalize_server(raw_server), api_key=key,
                   request_timeout=DEFAULT_REQUEST_TIMEOUT if request_timeout is None
                   else request_timeout)
