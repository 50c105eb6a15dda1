"""A small RFC 6455 WebSocket client codec (no I/O), for execd's PTY sessions, shared by the
sync and async PTY handles: the handshake, masked client frames, and a parser that turns the
server's bytes into messages and the PTY protocol's events."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct
import urllib.parse
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from .errors import CoveError, error_from_response

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0, 1, 2, 8, 9, 10
CHANNEL_STDIN, CHANNEL_STDOUT, CHANNEL_STDERR, CHANNEL_REPLAY = 0, 1, 2, 3
MAX_MESSAGE = 64 << 20


@dataclass
class Target:
    host: str
    port: int
    tls: bool
    path: str


def target(url: str) -> Target:
    """Where a ws upgrade for an http(s) URL goes."""
    u = urllib.parse.urlsplit(url)
    tls = u.scheme in ("https", "wss")
    path = u.path or "/"
    if u.query:
        path += "?" + u.query
    return Target(u.hostname or "127.0.0.1", u.port or (443 if tls else 80), tls, path)


def handshake(t: Target, headers: Dict[str, str]) -> Tuple[bytes, str]:
    """The upgrade request and the Sec-WebSocket-Key it carries."""
    key = base64.b64encode(os.urandom(16)).decode()
    host = t.host if t.port in (80, 443) else f"{t.host}:{t.port}"
    lines = [f"GET {t.path} HTTP/1.1", f"Host: {host}", "Upgrade: websocket",
             "Connection: Upgrade", f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode(), key


def check_handshake(head: bytes, body: bytes, key: str) -> None:
    """Raises the API's error when the server refused the upgrade."""
    lines = head.decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split(" ")[1])
    except (IndexError, ValueError):
        raise CoveError(f"not an HTTP answer to the upgrade: {lines[0]!r}",
                        code="SDK::BAD_HANDSHAKE")
    if status != 101:
        raise error_from_response(status, body, None, "open pty")
    expect = base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()
    fields = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip()
    if fields.get("sec-websocket-accept") != expect:
        raise CoveError("the server's Sec-WebSocket-Accept is wrong", code="SDK::BAD_HANDSHAKE")


def content_length(head: bytes) -> int:
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length" and value.strip().isdigit():
            return int(value.strip())
    return 0


def frame(opcode: int, payload: bytes) -> bytes:
    """One final, masked client frame."""
    n = len(payload)
    head = bytes([0x80 | opcode])
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 65536:
        head += bytes([0x80 | 126]) + struct.pack(">H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack(">Q", n)
    mask = os.urandom(4)
    masked = (int.from_bytes(payload, "big") ^ int.from_bytes((mask * (n // 4 + 1))[:n], "big")
              ).to_bytes(n, "big") if n else b""
    return head + mask + masked


@dataclass
class PtyEvent:
    """One thing the PTY said: ``kind`` is ``output`` (``data``: bytes, ``channel``: 1 stdout,
    2 stderr, 3 replay with ``offset``), ``connected``, ``exit`` (``exit_code``), ``pong``,
    ``error`` (``message``: the JSON) or ``closed`` (``close_code``)."""

    kind: str
    data: bytes = b""
    channel: int = 0
    offset: Optional[int] = None
    exit_code: Optional[int] = None
    close_code: Optional[int] = None
    message: Optional[Dict[str, Any]] = None


class PtyProtocol:
    """Feed it the server's bytes; it returns PTY events and the bytes to send back (pongs,
    the close reply)."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._message = bytearray()
        self._opcode: Optional[int] = None
        self.closed = False

    def feed(self, data: bytes) -> Tuple[List[PtyEvent], bytes]:
        self._buf += data
        events: List[PtyEvent] = []
        reply = b""
        while True:
            parsed = self._frame()
            if parsed is None:
                return events, reply
            fin, op, payload = parsed
            if op == OP_PING:
                reply += frame(OP_PONG, payload)
            elif op == OP_PONG:
                continue
            elif op == OP_CLOSE:
                code = struct.unpack(">H", payload[:2])[0] if len(payload) >= 2 else 1005
                if not self.closed:
                    reply += frame(OP_CLOSE, payload[:2])
                self.closed = True
                events.append(PtyEvent("closed", data=payload[2:], close_code=code))
            else:
                if op != OP_CONT:
                    self._opcode = op
                self._message += payload
                if len(self._message) > MAX_MESSAGE:
                    raise CoveError("PTY message too large", code="SDK::WS_MESSAGE_TOO_LARGE")
                if fin:
                    events.append(self._event(self._opcode or OP_BINARY, bytes(self._message)))
                    self._message.clear()

    def _frame(self) -> Optional[Tuple[bool, int, bytes]]:
        b = self._buf
        if len(b) < 2:
            return None
        n, at = b[1] & 0x7F, 2
        if n == 126:
            if len(b) < 4:
                return None
            n, at = struct.unpack(">H", b[2:4])[0], 4
        elif n == 127:
            if len(b) < 10:
                return None
            n, at = struct.unpack(">Q", b[2:10])[0], 10
        if b[1] & 0x80:
            raise CoveError("the server sent a masked frame", code="SDK::WS_PROTOCOL")
        if len(b) < at + n:
            return None
        fin, op, payload = bool(b[0] & 0x80), b[0] & 0x0F, bytes(b[at:at + n])
        del b[:at + n]
        return fin, op, payload

    @staticmethod
    def _event(op: int, payload: bytes) -> PtyEvent:
        if op == OP_BINARY and payload:
            channel = payload[0]
            if channel == CHANNEL_REPLAY and len(payload) >= 9:
                return PtyEvent("output", data=payload[9:], channel=channel,
                                offset=struct.unpack(">Q", payload[1:9])[0])
            return PtyEvent("output", data=payload[1:], channel=channel)
        try:
            msg = json.loads(payload.decode("utf-8"))
        except ValueError:
            return PtyEvent("error", message={"message": payload.decode("utf-8", "replace")})
        kind = msg.get("type") if isinstance(msg, dict) else None
        if kind == "exit":
            return PtyEvent("exit", exit_code=msg.get("exit_code"), message=msg)
        if kind in ("connected", "pong"):
            return PtyEvent(kind, message=msg)
        return PtyEvent("error", message=msg if isinstance(msg, dict) else {"message": msg})


def stdin_frame(data: Any) -> bytes:
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    return frame(OP_BINARY, bytes([CHANNEL_STDIN]) + raw)


def json_frame(obj: Dict[str, Any]) -> bytes:
    return frame(OP_TEXT, json.dumps(obj).encode())


def close_frame(code: int = 1000) -> bytes:
    return frame(OP_CLOSE, struct.pack(">H", code))
