"""Bad input gets a clear 4xx {"code","message"} and changes nothing."""

import http.client
import json
import os

import pytest

from covetest import run_dirs, send_head_then_read

KEY = {"OPEN-SANDBOX-API-KEY": "test-key"}

VALID = {"image": {"uri": "base"}, "entrypoint": ["sleep", "infinity"],
         "resourceLimits": {"cpu": "500m", "memory": "256Mi"}}


def with_(**changes):
    body = json.loads(json.dumps(VALID))
    for k, v in changes.items():
        if v is KeyError:
            body.pop(k, None)
        else:
            body[k] = v
    return body


def limits(**kw):
    return with_(resourceLimits=kw)


BAD_CREATES = [
    ("malformed JSON", b'{"image": {"uri": "base"', 400),
    ("not an object", b'[1, 2, 3]', 400),
    ("empty body", b'', 400),
    ("trailing garbage", b'{"image":{"uri":"base"},"entrypoint":["sh"]} xyz', 400),
    ("duplicate keys", b'{"image":{"uri":"base"},"image":{"uri":"base"},"entrypoint":["sh"]}', 400),
    ("invalid UTF-8", b'{"image":{"uri":"\xff\xfe"},"entrypoint":["sh"]}', 400),
    ("unknown template", with_(image={"uri": "no-such-template"}), 400),
    ("image missing", with_(image=KeyError), 400),
    ("image uri wrong type", with_(image={"uri": 42}), 400),
    ("entrypoint missing", with_(entrypoint=KeyError), 400),
    ("entrypoint empty", with_(entrypoint=[]), 400),
    ("entrypoint not strings", with_(entrypoint=["sleep", 5]), 400),
    ("entrypoint a string", with_(entrypoint="sleep infinity"), 400),
    ("unknown field", with_(colour="blue"), 400),
    ("timeout too small", with_(timeout=59), 400),
    ("timeout negative", with_(timeout=-1), 400),
    ("timeout absurd", with_(timeout=10**12), 400),
    ("timeout a string", with_(timeout="60"), 400),
    ("timeout a float", with_(timeout=60.5), 400),
    ("cpu negative", limits(cpu="-1"), 400),
    ("cpu zero", limits(cpu="0"), 400),
    ("cpu absurd", limits(cpu="100000"), 400),
    ("cpu garbage", limits(cpu="lots"), 400),
    ("cpu a number", limits(cpu=1), 400),
    ("memory negative", limits(memory="-512Mi"), 400),
    ("memory tiny", limits(memory="1Ki"), 400),
    ("memory absurd", limits(memory="1000Ti"), 400),
    ("memory overflow", limits(memory="99999999999999999999Gi"), 400),
    ("pids zero", limits(pids="0"), 400),
    ("pids absurd", limits(pids="999999999"), 400),
    ("disk absurd", limits(**{"ephemeral-storage": "1000Ti"}), 400),
    ("unknown resource", limits(gpu="1"), 400),
    ("limits not an object", with_(resourceLimits=["cpu"]), 400),
    ("env not strings", with_(env={"A": 1}), 400),
    ("env key with =", with_(env={"A=B": "c"}), 400),
    ("env not an object", with_(env="A=B"), 400),
    ("metadata not strings", with_(metadata={"a": {"b": "c"}}), 400),
    ("platform unsupported", with_(platform={"os": "windows", "arch": "amd64"}), 400),
    ("snapshot unknown", with_(snapshotId="snap-1", image=KeyError), 404),
    ("snapshot and image", with_(snapshotId="snap-1"), 400),
    ("snapshot not a string", with_(snapshotId=["snap-1"], image=KeyError), 400),
]


def sandbox_count(coved):
    return coved.ok("GET", "/v1/sandboxes?pageSize=1000")["pagination"]["totalItems"]


def assert_error(status, body, expected):
    assert status == expected, body
    assert isinstance(body, dict), body
    assert set(body) == {"code", "message"}, body
    assert body["code"] and body["message"]


@pytest.mark.parametrize("name,body,expected", BAD_CREATES, ids=[c[0] for c in BAD_CREATES])
def test_bad_create_changes_nothing(coved, name, body, expected):
    before, dirs = sandbox_count(coved), run_dirs(coved)
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, parsed, _ = coved.request("POST", "/v1/sandboxes", raw=raw)
    assert_error(status, parsed, expected)
    assert sandbox_count(coved) == before
    assert run_dirs(coved) == dirs


def test_unknown_template_lists_known_ones(coved):
    status, body, _ = coved.request("POST", "/v1/sandboxes", with_(image={"uri": "nope"}))
    assert status == 400
    assert "base" in body["message"] and "code-interpreter" in body["message"]


@pytest.mark.parametrize("method,path,expected", [
    ("GET", "/v1/sandboxes/does-not-exist", 404),
    ("DELETE", "/v1/sandboxes/does-not-exist", 404),
    ("POST", "/v1/sandboxes/does-not-exist/pause", 404),
    ("POST", "/v1/sandboxes/does-not-exist/resume", 404),
    ("POST", "/sandboxes/does-not-exist/proxy/44772/command", 404),
    ("GET", "/v1/sandboxes/../../etc/passwd", 404),
    ("GET", "/v1/no-such-route", 404),
    ("PUT", "/v1/sandboxes", 405),
    ("GET", "/v1/sandboxes/x/pause", 405),
    ("GET", "/v1/sandboxes?page=0", 400),
    ("GET", "/v1/sandboxes?pageSize=-3", 400),
    # (a state Cove never produces is no error: test_fine_print) but more than 8 are
    ("GET", "/v1/sandboxes?" + "&".join(["state=Running"] * 9), 400),
    ("GET", "/v1/sandboxes?colour=blue", 400),
])
def test_bad_routes(coved, method, path, expected):
    status, body, _ = coved.request(method, path)
    assert_error(status, body, expected)


def test_missing_and_wrong_key_are_401(coved):
    for headers in ({}, {"OPEN-SANDBOX-API-KEY": "wrong"}, {"OPEN-SANDBOX-API-KEY": ""}):
        for method, path in (("GET", "/v1/sandboxes"), ("POST", "/v1/sandboxes"),
                             ("POST", "/sandboxes/x/proxy/44772/command")):
            status, body, _ = coved.request(method, path, VALID, headers=headers)
            assert_error(status, body, 401)


def test_huge_body_is_413_and_daemon_survives(coved):
    before = sandbox_count(coved)
    status, body = send_head_then_read(coved.port, "POST", "/v1/sandboxes", 8 * 1024 * 1024 + 40,
                                       b'{"image":{"uri":"base"},"entrypoint":["' + b"a" * 4096,
                                       KEY)
    assert_error(status, body, 413)
    assert coved.ok("GET", "/health")["status"] == "healthy"
    assert sandbox_count(coved) == before


def test_malformed_http_is_400(coved):
    import socket
    for junk in (b"GARBAGE\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n", b"\x00\x01\x02\r\n\r\n",
                 b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n"):
        s = socket.create_connection(("127.0.0.1", coved.port), timeout=10)
        s.sendall(junk)
        reply = s.recv(65536)
        s.close()
        assert reply.startswith(b"HTTP/1.1 400"), reply
    assert coved.ok("GET", "/health")["status"] == "healthy"


def test_wrong_state_transitions_are_409(coved):
    sid = coved.create()
    try:
        status, body, _ = coved.request("POST", f"/v1/sandboxes/{sid}/resume")
        assert_error(status, body, 409)
        coved.pause(sid)
        status, body, _ = coved.request("POST", f"/v1/sandboxes/{sid}/pause")
        assert_error(status, body, 409)
        assert coved.get(sid)["status"]["state"] == "Paused"
    finally:
        coved.delete(sid)


@pytest.fixture
def target(coved):
    sid = coved.create(timeout=600, metadata={"keep": "me"})
    yield sid
    coved.delete(sid)


ROUTE_CASES = [
    # (method, path template, raw body, expected status)
    ("PATCH", "/v1/sandboxes/{id}/metadata", b"{not json", 400),
    ("PATCH", "/v1/sandboxes/{id}/metadata", b"[]", 400),
    ("PATCH", "/v1/sandboxes/{id}/metadata", b'"text"', 400),
    ("PATCH", "/v1/sandboxes/{id}/metadata", b'{"a": {"b": "c"}}', 400),
    ("PATCH", "/v1/sandboxes/{id}/metadata", b'{"a": 1}', 400),
    ("PATCH", "/v1/sandboxes/{id}/metadata", b'{"a": "b", "a": "c"}', 400),
    ("PATCH", "/v1/sandboxes/{id}/metadata", b"", 400),
    ("POST", "/v1/sandboxes/{id}/renew-expiration", b"{}", 400),
    ("POST", "/v1/sandboxes/{id}/renew-expiration", b'{"expiresAt": 1900000000}', 400),
    ("POST", "/v1/sandboxes/{id}/renew-expiration", b'{"expiresAt": "2099-13-01T00:00:00Z"}', 400),
    ("POST", "/v1/sandboxes/{id}/renew-expiration", b'{"expiresAt": "2099-01-01"}', 400),
    ("POST", "/v1/sandboxes/{id}/renew-expiration", b'{"expiresAt": "2099-01-01T00:00:00"}', 400),
    ("POST", "/v1/sandboxes/{id}/renew-expiration", b'{"expiresAt": "1999-01-01T00:00:00Z"}', 400),
    ("POST", "/v1/sandboxes/{id}/renew-expiration", b'{"expiresAt": null}', 400),
    ("POST", "/v1/sandboxes/{id}/renew-expiration", b'{"expires_at": "2099-01-01T00:00:00Z"}', 400),
    ("POST", "/v1/sandboxes/{id}/renew-expiration", b"not json", 400),
    ("GET", "/v1/sandboxes/{id}/endpoints/0", None, 400),
    ("GET", "/v1/sandboxes/{id}/endpoints/65536", None, 400),
    ("GET", "/v1/sandboxes/{id}/endpoints/http", None, 400),
    ("GET", "/v1/sandboxes/{id}/endpoints/80?expires=-1", None, 400),
    ("GET", "/v1/sandboxes/{id}/endpoints/80?host=maybe", None, 400),
    ("GET", "/v1/sandboxes/{id}/endpoints/80?use_server_proxy=perhaps", None, 400),
    ("GET", "/v1/sandboxes/{id}/endpoints/80/extra", None, 404),
    ("POST", "/v1/sandboxes/{id}/snapshots", b'{"name": ""}', 400),
    ("POST", "/v1/sandboxes/{id}/snapshots", b'{"name": 1}', 400),
    ("POST", "/v1/sandboxes/{id}/snapshots", b'{"tag": "x"}', 400),
    ("POST", "/v1/sandboxes/{id}/snapshots", b"[]", 400),
    ("GET", "/v1/snapshots?pageSize=0", None, 400),
    ("GET", "/v1/snapshots/snap-nosuch", None, 404),
    ("DELETE", "/v1/snapshots/snap-nosuch", None, 404),
    ("GET", "/v1/sandboxes?page=0", None, 400),
    ("GET", "/v1/sandboxes?pageSize=0", None, 400),
    ("GET", "/v1/sandboxes?pageSize=100000", None, 400),
    ("GET", "/v1/sandboxes?page=abc", None, 400),
    ("GET", "/v1/sandboxes?metadata=%ZZ", None, 400),
    ("PUT", "/v1/sandboxes/{id}", b"{}", 405),
    ("POST", "/v1/sandboxes/{id}/metadata", b"{}", 405),
    ("GET", "/v1/sandboxes/{id}/renew-expiration", None, 405),
]


@pytest.mark.parametrize("method,path,raw,expected", ROUTE_CASES,
                         ids=[f"{c[0]} {c[1]} {c[2]!r:.30}" for c in ROUTE_CASES])
def test_bad_input_on_every_route_changes_nothing(coved, target, method, path, raw, expected):
    before = coved.get(target)
    status, body, _ = coved.request(method, path.format(id=target), raw=raw)
    assert_error(status, body, expected)
    after = coved.get(target)
    assert after["metadata"] == before["metadata"] == {"keep": "me"}
    assert after["expiresAt"] == before["expiresAt"]
    assert after["status"]["state"] == "Running"


@pytest.mark.parametrize("method,path", [
    ("POST", "/v1/sandboxes"), ("PATCH", "/v1/sandboxes/{id}/metadata"),
    ("POST", "/v1/sandboxes/{id}/renew-expiration"),
])
def test_huge_bodies_are_413_on_every_route(coved, target, method, path):
    status, body = send_head_then_read(coved.port, method, path.format(id=target), 2 * 1024 * 1024,
                                       b'{"k": "' + b"v" * 4096, KEY)
    assert_error(status, body, 413)
    assert coved.get(target)["metadata"] == {"keep": "me"}


def raw_exchange(coved, data):
    """One raw request on its own connection: (status, parsed JSON body) of the answer."""
    import socket
    s = socket.create_connection(("127.0.0.1", coved.port), timeout=10)
    try:
        s.sendall(data)
        reply = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            reply += chunk
            head, _, body = reply.partition(b"\r\n\r\n")
            length = [int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")]
            if length and len(body) >= length[0]:
                break
    finally:
        s.close()
    assert reply, "the connection closed without an answer"
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(body)


@pytest.mark.parametrize("path", [
    b"/v1/sandboxes/\xff\xfe", b"/v1/sandboxes/\xc3", b"/sandboxes/\xff\xfe/proxy/44772/ping",
    b"/v1/sandboxes/\xed\xa0\x80/pause",
])
def test_invalid_utf8_in_ids_gets_a_body(coved, path):
    """Issue 8 item 15: an id that is not UTF-8 is quoted in the message: the body is still
    valid JSON (invalid bytes replaced), never empty."""
    method = b"POST" if path.endswith(b"pause") else b"GET"
    status, body = raw_exchange(coved, method + b" " + path + b" HTTP/1.1\r\nHost: x\r\n"
                                b"OPEN-SANDBOX-API-KEY: test-key\r\nContent-Length: 0\r\n"
                                b"Connection: close\r\n\r\n")
    assert_error(status, body, 404)


def test_unknown_transfer_encoding_is_400_with_a_body(coved, target):
    """Issue 8 item 15: `Transfer-Encoding: xchunked` is a 400 with a body, on the API and
    through the gateway (first request and pipelined after another)."""
    api = (b"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nOPEN-SANDBOX-API-KEY: test-key\r\n"
           b"Transfer-Encoding: xchunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
    assert_error(*raw_exchange(coved, api), 400)
    gw = (f"POST /sandboxes/{target}/proxy/44772/command HTTP/1.1\r\nHost: x\r\n"
          f"OPEN-SANDBOX-API-KEY: test-key\r\nTransfer-Encoding: xchunked\r\n\r\n"
          f"5\r\nhello\r\n0\r\n\r\n").encode()
    assert_error(*raw_exchange(coved, gw), 400)
    ping = (f"GET /sandboxes/{target}/proxy/44772/ping HTTP/1.1\r\nHost: x\r\n"
            f"OPEN-SANDBOX-API-KEY: test-key\r\n\r\n").encode()
    import socket
    s = socket.create_connection(("127.0.0.1", coved.port), timeout=10)
    try:
        s.sendall(ping + gw)
        reply = b""
        while reply.count(b"HTTP/1.1 ") < 2 or not reply.rstrip().endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            reply += chunk
    finally:
        s.close()
    second = reply[reply.index(b"HTTP/1.1 ", 1):]
    assert second.startswith(b"HTTP/1.1 400"), reply
    assert json.loads(second.partition(b"\r\n\r\n")[2])["code"] == "HTTP::MALFORMED"
    assert coved.get(target)["status"]["state"] == "Running"
