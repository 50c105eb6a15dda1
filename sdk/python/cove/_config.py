"""Where the server is and which key to use, found the way the ``cove`` CLI finds them."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Dict, Optional

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


def _config_file_path() -> Optional[str]:
    """The CLI's config file: ``$COVE_CONFIG_FILE``, else ``$XDG_CONFIG_HOME/cove/config.ini``
    (an absolute XDG_CONFIG_HOME only), else ``~/.config/cove/config.ini``."""
    explicit = os.environ.get("COVE_CONFIG_FILE")
    if explicit:
        return explicit
    xdg = os.environ.get("XDG_CONFIG_HOME")
    if xdg and xdg.startswith("/"):
        return os.path.join(xdg, "cove", "config.ini")
    home = os.path.expanduser("~")
    return None if home == "~" else os.path.join(home, ".config", "cove", "config.ini")


def _config_file_values() -> Dict[str, str]:
    """The settings of the CLI's config file (``cove config set``, ``cove config init``):
    ``key = value`` lines, ``#`` or ``;`` comment lines, a `` ;`` comment after a value;
    nothing when there is no file or it cannot be read."""
    path = _config_file_path()
    values: Dict[str, str] = {}
    if path is None:
        return values
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError):
        return values
    for line in lines:
        line = line.strip()
        if not line or line[0] in "#;[":
            continue
        name, sep, value = line.partition("=")
        if not sep:
            name, sep, value = line.partition(":")
        if not sep:
            continue
        value = re.split(r"\s;", value, maxsplit=1)[0].strip()
        if value:
            values.setdefault(name.strip(), value)
    return values


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
        """Arguments win; then ``COVE_SERVER`` (else ``OPEN_SANDBOX_DOMAIN``, else the CLI's
        config file's ``server``, else http://127.0.0.1:8080) and ``COVE_API_KEY`` (else
        ``OPEN_SANDBOX_API_KEY``, else the config file's ``api-key``, else the ``api_key``
        file in ``$COVE_STATE_DIR`` or /var/lib/cove), as the CLI does. A server
        given without a scheme gets ``http://``."""
        file = _config_file_values() if not (server and api_key) else {}
        raw_server = (server or _first_env("COVE_SERVER", "OPEN_SANDBOX_DOMAIN")
                      or file.get("server") or DEFAULT_SERVER)
        key = (api_key or _first_env("COVE_API_KEY", "OPEN_SANDBOX_API_KEY")
               or file.get("api-key") or _state_dir_key())
        return cls(server=_normalize_server(raw_server), api_key=key,
                   request_timeout=DEFAULT_REQUEST_TIMEOUT if request_timeout is None
                   else request_timeout)
