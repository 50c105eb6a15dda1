"""The E2B control plane (/e2b) against what a hostile client or a plain SDK user sends: every
error is E2B's {"code": <int>, "message"} whatever bytes the path holds; the metadata filter
as the e2b JS SDK encodes it; a create whose sandbox cannot start is an error and leaves
nothing; timeouts past openapi.yml's int32 are refused before any arithmetic; allowOut wins
over denyOut, as openapi.yml says."""

import http.client
import json
import os
import shutil
import re
import socket
import subprocess
import threading
import time
import urllib.parse
from datetime import datetime

import pytest

import covetest
from covetest import AGENT, serve

A = "key-a"
ADMIN = "review-admin"
HUGE_MAX = str(2**31 - 1)  # --max-timeout as large as coved takes (68 years)


@pytest.fixture(scope="module")
def d():
    with serve("--max-timeout", HUGE_MAX, api_keys=(A,), admin_keys=(ADMIN,)) as coved:
        yield coved


def e2b(d, method, path, body=None, raw=None):
    h = {"Content-Type": "application/json", "X-API-Key": A}
    return d.request(method, "/e2b" + path, body, headers=h, raw=raw)


def e2b_create(d, **fields):
    body = {"templateID": "base", "timeout": 600}
    body.update(fields)
    status, sb, _ = e2b(d, "POST", "/sandboxes", body)
    assert status == 201, sb
    return sb["sandboxID"]


def assert_e2b_error(status, body, expected):
    assert status == expected, body
    assert isinstance(body, dict) and set(body) == {"code", "message"}, body
    assert body["code"] == expected and isinstance(body["message"], str) and body["message"]


def raw_request(d, method, target):
    """One request with target sent as these very bytes (http.client would refuse them)."""
    s = socket.create_connection(("127.0.0.1", d.port), timeout=60)
    try:
        s.sendall(method + b" " + target + b" HTTP/1.1\r\nHost: x\r\nX-API-Key: " +
                  A.encode() + b"\r\nConnection: close\r\n\r\n")
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    finally:
        s.close()
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(body.decode()) if body else None


# Paths whose bytes are not UTF-8, or are cut inside a character where a message quotes them.
HOSTILE_TARGETS = [
    ("GET", b"/e2b/sandboxes/\xff\xfe", 404),
    ("DELETE", b"/e2b/sandboxes/\xc3", 404),
    ("POST", b"/e2b/sandboxes/\xc3/timeout", 404),
    ("GET", b"/e2b/no-such-\xe2\x82", 404),
    ("GET", b"/e2b/" + b"xy" + "\u00e9".encode() * 150, 404),
    ("GET", b"/e2b/sandboxes/" + b"x" + "\u00e9".encode() * 40, 404),
    ("PUT", b"/e2b/sandboxes/\xff", 405),
]


@pytest.mark.parametrize("method,target,expected", HOSTILE_TARGETS,
                         ids=[f"{m} {t[:24]!r}" for m, t, _ in HOSTILE_TARGETS])
def test_errors_keep_their_shape_whatever_the_path_bytes(d, method, target, expected):
    status, body = raw_request(d, method.encode(), target)
    assert_e2b_error(status, body, expected)


def js_sdk_metadata_query(metadata):
    """?metadata= as e2b 2.51.0's JS SDK sends it: encodeURIComponent on each key and value,
    URLSearchParams of those, the result encoded once more as a query value."""
    component = lambda s: urllib.parse.quote(s, safe="-_.!~*'()")
    inner = urllib.parse.urlencode({component(k): component(v) for k, v in metadata.items()})
    return "metadata=" + component(inner)


def test_metadata_filter_as_the_sdk_encodes_it(d):
    # Label keys may carry a DNS prefix: its "/" is what the SDK's encodeURIComponent changes.
    mine = e2b_create(d, metadata={"example.com/app": "demo", "plain": "x"})
    other = e2b_create(d, metadata={"example.com/app": "other", "plain": "x"})
    try:
        for metadata, expected in (({"plain": "x"}, {mine, other}),
                                   ({"example.com/app": "demo"}, {mine}),
                                   ({"example.com/app": "demo", "plain": "x"}, {mine}),
                                   ({"example.com/app": "nobody"}, set())):
            status, items, _ = e2b(d, "GET", "/v2/sandboxes?" + js_sdk_metadata_query(metadata))
            assert status == 200, items
            assert {s["sandboxID"] for s in items} == expected, metadata
    finally:
        e2b(d, "DELETE", f"/sandboxes/{mine}")
        e2b(d, "DELETE", f"/sandboxes/{other}")


def live_sandboxes(d):
    """Every sandbox of key A the OpenSandbox API lists, in any state but one being torn down."""
    status, body, _ = d.request("GET", "/v1/sandboxes?pageSize=200", headers=d.headers(A))
    assert status == 200, body
    return [s for s in body["items"] if s["status"]["state"] not in ("Stopping", "Terminated")]


def test_a_create_whose_sandbox_cannot_start_is_an_error_and_leaves_nothing(d, tmp_path):
    # A template without tail: E2B's sandbox process (tail -f /dev/null) cannot start in it.
    root = tmp_path / "rootfs"
    covetest.busybox_rootfs(root)
    # The sanitizer pass's agent is dynamic: it runs in the template with its libraries.
    ldd = subprocess.run(["ldd", AGENT], capture_output=True, text=True).stdout
    for lib in re.findall(r"(/\S+) \(0x", ldd):
        os.makedirs(root / os.path.dirname(lib).lstrip("/"), exist_ok=True)
        shutil.copy(lib, root / lib.lstrip("/"))
    status, body, _ = d.request("POST", "/v1/templates", {"name": "no-tail", "rootfs": str(root)},
                                headers={"OPEN-SANDBOX-API-KEY": ADMIN,
                                         "Content-Type": "application/json"}, timeout=120)
    assert status == 201, body
    try:
        before = live_sandboxes(d)
        for path in ("/sandboxes", "/v2/sandboxes"):
            status, err, _ = e2b(d, "POST", path, {"templateID": "no-tail", "timeout": 30})
            assert status >= 400, err  # never a 201 for a sandbox the client cannot use
            assert_e2b_error(status, err, status)
            assert "tail" in err["message"], err
        assert live_sandboxes(d) == before
    finally:
        d.request("DELETE", "/v1/templates/no-tail", headers={"OPEN-SANDBOX-API-KEY": ADMIN})


def test_timeouts_past_int32_are_refused_and_change_nothing(d):
    # openapi.yml's timeouts are int32 seconds; coved's own maximum (here 2^63-1) is no bound
    # on the milliseconds arithmetic.
    huge = 2**62
    for path in ("/sandboxes", "/v2/sandboxes"):
        status, err, _ = e2b(d, "POST", path, {"templateID": "base", "timeout": huge})
        assert_e2b_error(status, err, 400)
    sid = e2b_create(d)
    try:
        info = e2b(d, "GET", f"/sandboxes/{sid}")[1]
        for path in ("timeout", "connect", "resume"):
            for timeout in (huge, 2**31):
                status, err, _ = e2b(d, "POST", f"/sandboxes/{sid}/{path}", {"timeout": timeout})
                assert_e2b_error(status, err, 400)
        status, body, _ = e2b(d, "POST", f"/sandboxes/{sid}/timeout", {"timeout": 2**31 - 1})
        assert status == 204, body
        after = e2b(d, "GET", f"/sandboxes/{sid}")[1]
        assert after["state"] == "running" and after["endAt"] > info["endAt"], after
    finally:
        e2b(d, "DELETE", f"/sandboxes/{sid}")


def policy(d, sid):
    status, body, _ = d.request("GET", f"/sandboxes/{sid}/proxy/18080/policy",
                                headers=d.headers(A))
    assert status == 200, body
    return body["policy"]


ALLOW_ALL = {"defaultAction": "allow", "egress": []}


def test_allow_out_of_everything_wins_over_deny_out(d):
    # "Allowed entries always take precedence over denied entries" (SandboxNetworkConfig).
    sid = e2b_create(d, network={"denyOut": ["0.0.0.0/0"], "allowOut": ["0.0.0.0/0"]})
    try:
        assert policy(d, sid) == ALLOW_ALL
        for body in ({"denyOut": ["0.0.0.0/0"]}, {"allowOut": ["0.0.0.0/0"],
                                                  "denyOut": ["10.0.0.0/8"]},
                     {"denyOut": ["0.0.0.0/0"]},
                     {"allowOut": ["0.0.0.0/0"], "allow_internet_access": False}):
            status, err, _ = e2b(d, "PUT", f"/sandboxes/{sid}/network", body)
            assert status == 204, (body, err)
            if "allowOut" in body:
                assert policy(d, sid) == ALLOW_ALL, body
            else:
                assert policy(d, sid) == {"defaultAction": "deny", "egress": []}, body
        before = policy(d, sid)
        status, err, _ = e2b(d, "PUT", f"/sandboxes/{sid}/network",
                             {"allowOut": ["0.0.0.0/0"], "denyOut": ["not a cidr!"]})
        assert_e2b_error(status, err, 400)
        assert policy(d, sid) == before
    finally:
        e2b(d, "DELETE", f"/sandboxes/{sid}")


def test_timeouts_keep_within_coveds_maximum():
    # An operator's --max-timeout bounds every way to set an end: the create's default (the
    # SDK sends no timeout unless asked) and refreshes' 3600 s too.
    with serve("--max-timeout", "120", api_keys=(A,)) as small:
        status, sb, _ = e2b(small, "POST", "/v2/sandboxes", {"templateID": "base"})
        assert status == 201, sb
        sid = sb["sandboxID"]
        try:
            info = e2b(small, "GET", f"/sandboxes/{sid}")[1]
            started, ends = (datetime.fromisoformat(info[k].replace("Z", "+00:00"))
                             for k in ("startedAt", "endAt"))
            assert (ends - started).total_seconds() <= 120, info
            for path, body in (("refreshes", {"duration": 121}),
                               ("refreshes", {"duration": 3600}),
                               ("timeout", {"timeout": 121}),
                               ("connect", {"timeout": 121})):
                status, err, _ = e2b(small, "POST", f"/sandboxes/{sid}/{path}", body)
                assert_e2b_error(status, err, 400)
            assert e2b(small, "GET", f"/sandboxes/{sid}")[1] == info
            status, body, _ = e2b(small, "POST", f"/sandboxes/{sid}/refreshes", {"duration": 120})
            assert status == 204, body
        finally:
            e2b(small, "DELETE", f"/sandboxes/{sid}")


@pytest.fixture
def stalling_registry():
    """A loopback "registry" that takes connections and never answers: a create of an image
    there stays Pending (pulling) for as long as a test needs."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held = []

    def accept():
        while True:
            try:
                held.append(listener.accept()[0])
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{listener.getsockname()[1]}"
    listener.shutdown(socket.SHUT_RDWR)
    listener.close()
    thread.join()
    for c in held:
        c.close()


def pending_sandbox(d):
    """The one sandbox of key A the OpenSandbox API lists (the create's, still Pending)."""
    for _ in range(600):
        items = live_sandboxes(d)
        if items:
            assert len(items) == 1 and items[0]["status"]["state"] == "Pending", items
            return items[0]["id"]
        time.sleep(0.05)
    raise AssertionError("the create never listed its sandbox")


@pytest.mark.parametrize("client_stays", [True, False])
def test_a_sandbox_killed_while_its_create_waits(d, stalling_registry, client_stays):
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=60)
    conn.request("POST", "/e2b/sandboxes",
                 body=json.dumps({"templateID": f"{stalling_registry}/stalls:1"}),
                 headers={"Content-Type": "application/json", "X-API-Key": A})
    sid = pending_sandbox(d)
    # Nothing but a kill is done to a sandbox being made; it is not shown either.
    for method, path, body, expected in (
            ("GET", "", None, 404), ("POST", "/connect", {}, 409), ("POST", "/pause", None, 409),
            ("POST", "/resume", {}, 409), ("POST", "/timeout", {"timeout": 5}, 409),
            ("PUT", "/network", {}, 409)):
        status, err, _ = e2b(d, method, f"/sandboxes/{sid}{path}", body)
        assert_e2b_error(status, err, expected)
    if not client_stays:
        conn.close()
    status, body, _ = e2b(d, "DELETE", f"/sandboxes/{sid}")
    assert status == 204, body
    if client_stays:
        resp = conn.getresponse()
        assert_e2b_error(resp.status, json.loads(resp.read()), 409)
        conn.close()
    assert live_sandboxes(d) == []
    assert_e2b_error(*e2b(d, "GET", f"/sandboxes/{sid}")[:2], 404)
