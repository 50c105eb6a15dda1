"""The E2B control plane under /e2b: E2B's error shape {"code": <status>, "message"} for bad
input (and nothing changed), each key seeing only its own sandboxes, and one sandbox visible
through both APIs at once."""

import json
import os
import urllib.parse

import pytest

from covetest import run_dirs, send_head_then_read, serve

A, B = "key-a", "key-b"


@pytest.fixture(scope="module")
def d():
    with serve(api_keys=(A, B)) as coved:
        yield coved


def e2b(d, method, path, body=None, key=A, raw=None, headers=None):
    h = {"Content-Type": "application/json"}
    if key is not None:
        h["X-API-Key"] = key
    h.update(headers or {})
    return d.request(method, "/e2b" + path, body, headers=h, raw=raw)


def e2b_create(d, key=A, **fields):
    body = {"templateID": "base", "timeout": 600}
    body.update(fields)
    status, sb, _ = e2b(d, "POST", "/sandboxes", body, key=key)
    assert status == 201, sb
    return sb["sandboxID"]


def assert_e2b_error(status, body, expected):
    assert status == expected, body
    assert isinstance(body, dict) and set(body) == {"code", "message"}, body
    assert body["code"] == expected and isinstance(body["message"], str) and body["message"]


def sandbox_count(d, key=A):
    status, items, _ = e2b(d, "GET", "/v2/sandboxes", key=key)
    assert status == 200, items
    return len(items)


BAD_CREATES = [
    ("malformed JSON", b'{"templateID": "base"', 400),
    ("empty body", b"", 400),
    ("not an object", b'["base"]', 400),
    ("duplicate keys", b'{"templateID":"base","templateID":"base"}', 400),
    ("no templateID", {"timeout": 60}, 400),
    ("templateID a number", {"templateID": 7}, 400),
    ("unknown template", {"templateID": "no-such-template"}, 400),
    ("timeout a string", {"templateID": "base", "timeout": "60"}, 400),
    ("timeout negative", {"templateID": "base", "timeout": -1}, 400),
    ("timeout a float", {"templateID": "base", "timeout": 1.5}, 400),
    ("timeout absurd", {"templateID": "base", "timeout": 10**12}, 400),
    ("metadata not strings", {"templateID": "base", "metadata": {"a": 1}}, 400),
    ("metadata not an object", {"templateID": "base", "metadata": "a=b"}, 400),
    ("envVars not strings", {"templateID": "base", "envVars": {"A": 1}}, 400),
    ("envVars key with =", {"templateID": "base", "envVars": {"A=B": "c"}}, 400),
    ("autoPause not a boolean", {"templateID": "base", "autoPause": "yes"}, 400),
    ("secure not a boolean", {"templateID": "base", "secure": 1}, 400),
    ("autoResume malformed", {"templateID": "base", "autoResume": True}, 400),
    ("mcp unsupported", {"templateID": "base", "mcp": {"x": {}}}, 400),
    ("network not an object", {"templateID": "base", "network": ["x"]}, 400),
    ("network bad target", {"templateID": "base", "network": {"allowOut": ["not a name!"]}}, 400),
    ("network rules", {"templateID": "base", "network": {"rules": {"a.com": []}}}, 400),
    ("volumeMounts unsupported", {"templateID": "base",
                                  "volumeMounts": [{"name": "v", "path": "/v"}]}, 400),
]


@pytest.mark.parametrize("name,body,expected", BAD_CREATES, ids=[c[0] for c in BAD_CREATES])
def test_bad_create_changes_nothing(d, name, body, expected):
    before, dirs = sandbox_count(d), run_dirs(d)
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, parsed, _ = e2b(d, "POST", "/sandboxes", raw=raw)
    assert_e2b_error(status, parsed, expected)
    assert sandbox_count(d) == before
    assert run_dirs(d) == dirs


@pytest.mark.parametrize("path", ["/e2b/sandboxes", "/e2b/v2/sandboxes",
                                  "/e2b/sandboxes/x/timeout"])
def test_huge_body_is_413_in_e2b_shape(d, path):
    before, dirs = sandbox_count(d), run_dirs(d)
    status, body = send_head_then_read(d.port, "POST", path, 2 * 1024 * 1024,
                                       b'{"templateID": "base", "metadata": {"a": "' + b"x" * 4096,
                                       {"X-API-Key": A})
    assert_e2b_error(status, body, 413)
    assert sandbox_count(d) == before
    assert run_dirs(d) == dirs


def test_bad_input_on_a_sandbox_changes_nothing(d):
    sid = e2b_create(d)
    try:
        info = e2b(d, "GET", f"/sandboxes/{sid}")[1]
        for method, path, raw, expected in (
                ("POST", f"/sandboxes/{sid}/timeout", b"{", 400),
                ("POST", f"/sandboxes/{sid}/timeout", b"{}", 400),
                ("POST", f"/sandboxes/{sid}/timeout", b'{"timeout": "5"}', 400),
                ("POST", f"/sandboxes/{sid}/timeout", b'{"timeout": -5}', 400),
                ("POST", f"/sandboxes/{sid}/refreshes", b'{"duration": 3601}', 400),
                ("POST", f"/sandboxes/{sid}/connect", b'{"timeout": []}', 400),
                ("POST", f"/sandboxes/{sid}/pause", b'{"memory": "no"}', 400),
                ("POST", f"/sandboxes/{sid}/pause", b"[]", 400),
                ("POST", f"/sandboxes/{sid}/resume", b"{}", 409),  # it is not paused
                ("PUT", f"/sandboxes/{sid}", b"{}", 405),
                ("GET", f"/sandboxes/{sid}/pause", None, 405),
                ("GET", "/v2/sandboxes?limit=0", None, 400),
                ("GET", "/v2/sandboxes?limit=101", None, 400),
                ("GET", "/v2/sandboxes?state=stopped", None, 400),
                ("GET", "/v2/sandboxes?nextToken=garbage", None, 400),
                ("GET", "/v2/sandboxes?nextToken=99999999999999999999999.x", None, 400),
                ("GET", "/v2/sandboxes?metadata=%25", None, 400),
                ("GET", "/v2/sandboxes?state=" + ",".join(["running"] * 40), None, 400),
                ("GET", "/v2/sandboxes?order=sideways", None, 400),
                ("GET", "/v2/sandboxes?startedAfter=yesterday", None, 400),
                ("GET", "/no-such-route", None, 404),
                ("GET", "/sandboxes/no-such-sandbox", None, 404),
                ("DELETE", "/sandboxes/no-such-sandbox", None, 404),
                ("POST", "/sandboxes/no-such-sandbox/timeout", b'{"timeout": 5}', 404),
                ("POST", "/sandboxes/no-such-sandbox/connect", b'{"timeout": 5}', 404),
                ("GET", "/sandboxes/no-such-sandbox/metrics", None, 404)):
            status, body, _ = e2b(d, method, path, raw=raw if raw is not None else b"")
            assert_e2b_error(status, body, expected)
        after = e2b(d, "GET", f"/sandboxes/{sid}")[1]
        assert after == info, "bad requests changed the sandbox"
    finally:
        e2b(d, "DELETE", f"/sandboxes/{sid}")


@pytest.mark.parametrize("method,path", [
    ("POST", "/sandboxes/x/fork"),
    ("POST", "/sandboxes/x/snapshots"), ("GET", "/snapshots"), ("POST", "/v3/templates"),
    ("POST", "/templates"), ("GET", "/templates/base/builds/b/status"), ("GET", "/teams"),
    ("GET", "/volumes"), ("GET", "/secrets"), ("GET", "/api-keys"), ("GET", "/sandboxes/metrics"),
])
def test_unsupported_routes_say_so(d, method, path):
    status, body, _ = e2b(d, method, path, raw=b"{}")
    assert_e2b_error(status, body, 501)
    assert "docs/e2b.md" in body["message"]


def test_missing_or_wrong_key_is_401(d):
    sid = e2b_create(d)
    try:
        for key in (None, "", "key-c", "KEY-A"):
            for method, path in (("GET", "/v2/sandboxes"), ("GET", f"/sandboxes/{sid}"),
                                 ("DELETE", f"/sandboxes/{sid}"), ("POST", "/sandboxes"),
                                 ("GET", "/templates"), ("GET", "/no-such-route")):
                status, body, _ = e2b(d, method, path, key=key, raw=b'{"templateID":"base"}')
                assert_e2b_error(status, body, 401)
        # The OpenSandbox key header is not E2B's.
        status, body, _ = e2b(d, "GET", "/v2/sandboxes", key=None,
                              headers={"OPEN-SANDBOX-API-KEY": A})
        assert_e2b_error(status, body, 401)
        assert e2b(d, "GET", f"/sandboxes/{sid}")[1]["state"] == "running"
    finally:
        e2b(d, "DELETE", f"/sandboxes/{sid}")


def test_a_key_sees_and_touches_only_its_own(d):
    theirs = e2b_create(d, key=B, metadata={"owner": "b"})
    mine = e2b_create(d, key=A, metadata={"owner": "a"})
    try:
        listed = {s["sandboxID"] for s in e2b(d, "GET", "/v2/sandboxes")[1]}
        assert mine in listed and theirs not in listed
        assert theirs not in {s["sandboxID"] for s in e2b(d, "GET", "/sandboxes")[1]}
        q = urllib.parse.quote("owner=b")
        assert e2b(d, "GET", f"/v2/sandboxes?metadata={q}")[1] == []
        for method, path, body in (
                ("GET", f"/sandboxes/{theirs}", None),
                ("DELETE", f"/sandboxes/{theirs}", None),
                ("POST", f"/sandboxes/{theirs}/timeout", {"timeout": 1}),
                ("POST", f"/sandboxes/{theirs}/refreshes", {"duration": 60}),
                ("POST", f"/sandboxes/{theirs}/pause", None),
                ("POST", f"/sandboxes/{theirs}/resume", {}),
                ("POST", f"/sandboxes/{theirs}/connect", {"timeout": 60}),
                ("POST", f"/v2/sandboxes/{theirs}/connect", {"timeout": 60}),
                ("GET", f"/sandboxes/{theirs}/metrics", None),
                ("PUT", f"/sandboxes/{theirs}/network", {"denyOut": ["0.0.0.0/0"]}),
                ("GET", f"/sandboxes/{theirs}/logs", None)):
            status, err, _ = e2b(d, method, path, body)
            assert_e2b_error(status, err, 404)
        # Nor through the OpenSandbox API with the other key.
        status, _, _ = d.request("GET", f"/v1/sandboxes/{theirs}", headers=d.headers(A))
        assert status == 404
        info = e2b(d, "GET", f"/sandboxes/{theirs}", key=B)[1]
        assert info["state"] == "running" and info["metadata"] == {"owner": "b"}
    finally:
        e2b(d, "DELETE", f"/sandboxes/{theirs}", key=B)
        e2b(d, "DELETE", f"/sandboxes/{mine}", key=A)


def test_one_sandbox_through_both_apis(d):
    # Made through E2B's API: the OpenSandbox API shows it, runs a command in it with its
    # envVars, and pauses it; E2B's sees the pause; the OpenSandbox API deletes it.
    sid = e2b_create(d, metadata={"via": "e2b"}, envVars={"GREETING": "hello there"})
    try:
        os_view = d.get(sid)
        assert os_view["status"]["state"] == "Running" and os_view["metadata"] == {"via": "e2b"}
        assert d.sh(sid, 'printf %s "$GREETING"').rstrip("\n") == "hello there"
        d.pause(sid)
        assert e2b(d, "GET", f"/sandboxes/{sid}")[1]["state"] == "paused"
        status, body, _ = e2b(d, "POST", f"/sandboxes/{sid}/connect", {"timeout": 600})
        assert status == 201 and body["sandboxID"] == sid, body
        assert d.get(sid)["status"]["state"] == "Running"
        assert d.sh(sid, "echo back").strip() == "back"
    finally:
        d.delete(sid)
    status, body, _ = e2b(d, "GET", f"/sandboxes/{sid}")
    assert_e2b_error(status, body, 404)

    # Made through the OpenSandbox API (no timeout): E2B's API lists it, sets a timeout on
    # it, and kills it.
    sid = d.create(metadata={"via": "opensandbox"})
    try:
        q = urllib.parse.quote("via=opensandbox")
        listed = e2b(d, "GET", f"/v2/sandboxes?metadata={q}")[1]
        assert [s["sandboxID"] for s in listed] == [sid]
        assert listed[0]["templateID"] == "base" and listed[0]["state"] == "running"
        status, _, _ = e2b(d, "POST", f"/sandboxes/{sid}/timeout", {"timeout": 900})
        assert status == 204
        assert "expiresAt" in d.get(sid)
        status, _, _ = e2b(d, "DELETE", f"/sandboxes/{sid}")
        assert status == 204
        assert e2b(d, "GET", f"/v2/sandboxes?metadata={q}")[1] == []
        # Being deleted or gone, it is not found: a second kill is a 404, never a 409.
        status, body, _ = e2b(d, "DELETE", f"/sandboxes/{sid}")
        assert_e2b_error(status, body, 404)
    finally:
        d.request("DELETE", f"/v1/sandboxes/{sid}")


def policy(d, sid):
    """The sandbox's egress policy, as the OpenSandbox side (egress API, port 18080) has it."""
    status, body, _ = d.request("GET", f"/sandboxes/{sid}/proxy/18080/policy")
    assert status == 200, body
    return body["policy"]


def test_network_is_the_egress_policy(d):
    sid = e2b_create(d, network={"denyOut": ["0.0.0.0/0"], "allowOut": ["1.1.1.1", "*.example.com"]})
    try:
        assert policy(d, sid) == {"defaultAction": "deny", "egress": [
            {"action": "allow", "target": "1.1.1.1"},
            {"action": "allow", "target": "*.example.com"}]}
        for body, expected in (
                ({"denyOut": ["10.0.0.0/8"]},
                 {"defaultAction": "allow", "egress": [{"action": "deny", "target": "10.0.0.0/8"}]}),
                ({"allow_internet_access": False}, {"defaultAction": "deny", "egress": []}),
                ({}, {"defaultAction": "allow", "egress": []})):
            status, err, _ = e2b(d, "PUT", f"/sandboxes/{sid}/network", body)
            assert status == 204, (body, err)
            assert policy(d, sid) == expected, body
        before = policy(d, sid)
        for raw in (b"{", b"[]", b'{"allowOut": "1.1.1.1"}', b'{"allowOut": [1]}',
                    b'{"allowOut": ["not a name!"]}', b'{"rules": {"a.com": []}}',
                    b'{"egressProxy": {"address": "p:1080"}}',
                    b'{"allow_internet_access": "no"}',
                    b'{"denyOut": ["10.0.0.0/8"], "allowOut": ["10.1.2.3"]}'):
            status, err, _ = e2b(d, "PUT", f"/sandboxes/{sid}/network", raw=raw)
            assert_e2b_error(status, err, 400)
            assert policy(d, sid) == before, raw
        status, err, _ = e2b(d, "PUT", "/sandboxes/no-such-sandbox/network", {})
        assert_e2b_error(status, err, 404)
    finally:
        e2b(d, "DELETE", f"/sandboxes/{sid}")
    sid = e2b_create(d, allow_internet_access=False)
    try:
        assert policy(d, sid) == {"defaultAction": "deny", "egress": []}
    finally:
        e2b(d, "DELETE", f"/sandboxes/{sid}")
