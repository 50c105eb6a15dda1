"""API keys own sandboxes; the gateway takes the key, the sandbox's token or a signed route."""

import http.client
import json
import time

import pytest

from covetest import Coved


@pytest.fixture(scope="module")
def two_keys():
    d = Coved(api_keys=("key-a", "key-b")).start()
    try:
        yield d
    finally:
        d.cleanup()


def call(d, method, path, key, body=None, headers=None):
    h = {"Content-Type": "application/json"}
    if key is not None:
        h["OPEN-SANDBOX-API-KEY"] = key
    h.update(headers or {})
    return d.request(method, path, body, headers=h)


def test_a_key_sees_and_touches_only_its_own_sandboxes(two_keys):
    d = two_keys
    d.key = "key-b"
    theirs = d.create(timeout=600)
    d.key = "key-a"
    mine = d.create()
    try:
        listed = {s["id"] for s in call(d, "GET", "/v1/sandboxes", "key-a")[1]["items"]}
        assert mine in listed and theirs not in listed
        future = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3000))
        for method, path, body in (
                ("GET", f"/v1/sandboxes/{theirs}", None),
                ("DELETE", f"/v1/sandboxes/{theirs}", None),
                ("POST", f"/v1/sandboxes/{theirs}/pause", None),
                ("POST", f"/v1/sandboxes/{theirs}/resume", None),
                ("POST", f"/v1/sandboxes/{theirs}/renew-expiration", {"expiresAt": future}),
                ("PATCH", f"/v1/sandboxes/{theirs}/metadata", {"x": "y"}),
                ("GET", f"/v1/sandboxes/{theirs}/endpoints/44772", None),
                ("POST", f"/sandboxes/{theirs}/proxy/44772/command", {"command": "id"})):
            status, err, _ = call(d, method, path, "key-a", body)
            assert status == 404 and set(err) == {"code", "message"}, (method, path, err)
        info = call(d, "GET", f"/v1/sandboxes/{theirs}", "key-b")[1]
        assert info["status"]["state"] == "Running" and info["metadata"] == {}
    finally:
        call(d, "DELETE", f"/v1/sandboxes/{theirs}", "key-b")
        call(d, "DELETE", f"/v1/sandboxes/{mine}", "key-a")


def test_missing_or_wrong_key_is_401_everywhere(two_keys):
    d = two_keys
    d.key = "key-a"
    sid = d.create()
    try:
        for key in (None, "", "key-c", "key-a ", "KEY-A"):
            for method, path in (("GET", "/v1/sandboxes"), ("GET", f"/v1/sandboxes/{sid}"),
                                 ("DELETE", f"/v1/sandboxes/{sid}"),
                                 ("GET", f"/v1/sandboxes/{sid}/endpoints/44772"),
                                 ("POST", f"/sandboxes/{sid}/proxy/44772/command")):
                status, err, _ = call(d, method, path, key, {"command": "id"})
                assert status == 401 and set(err) == {"code", "message"}, (key, path, err)
        assert d.get(sid)["status"]["state"] == "Running"
        status, _, _ = call(d, "GET", "/health", None)
        assert status == 200
    finally:
        d.delete(sid)


def endpoint(d, sid, key, query=""):
    status, body, _ = call(d, "GET", f"/v1/sandboxes/{sid}/endpoints/44772{query}", key)
    assert status == 200, body
    return body


def get_through(d, ep, path="/ping", headers=None):
    hostport, _, route = ep["endpoint"].partition("/")
    host, port = hostport.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("GET", "/" + route + path, headers=headers or {})
    resp = conn.getresponse()
    resp.read()
    conn.close()
    return resp.status


def test_access_token_reaches_its_own_sandbox_only(two_keys):
    d = two_keys
    d.key = "key-a"
    one, two = d.create(), d.create()
    try:
        ep1, ep2 = endpoint(d, one, "key-a"), endpoint(d, two, "key-a")
        assert ep1["endpoint"].endswith(f"/sandboxes/{one}/proxy/44772")
        assert get_through(d, ep1, headers=ep1["headers"]) == 200
        # the other sandbox's token does not open this one
        assert get_through(d, ep1, headers=ep2["headers"]) == 401
        assert get_through(d, ep1, headers={k: "0" * 64 for k in ep1["headers"]}) == 401
        assert get_through(d, ep1) == 401
        # the token never reaches the sandbox: the agent sees no such header
        status, body, _ = d.request("POST", f"/sandboxes/{one}/proxy/44772/command",
                                    raw=json.dumps({"command": "true"}),
                                    headers={"Content-Type": "application/json", **ep1["headers"]})
        assert status == 200
    finally:
        d.delete(one)
        d.delete(two)


def test_signed_routes(two_keys):
    d = two_keys
    d.key = "key-a"
    sid = d.create()
    try:
        good = endpoint(d, sid, "key-a", f"?expires={int(time.time()) + 600}")
        assert "/route/" in good["endpoint"] and not good["headers"]
        assert get_through(d, good) == 200
        route = good["endpoint"]
        sig = route.rsplit("/", 1)[1]
        assert len(sig) == 23  # a key id and 128 bits of HMAC in base64url
        forged_sig = dict(good, endpoint=route[:-2] + ("0" if route[-2] != "0" else "1") + route[-1])
        assert get_through(d, forged_sig) == 403
        old_format = dict(good, endpoint=route[:-len(sig)] + sig[1:9] + sig[0])
        assert get_through(d, old_format) == 403  # 9 characters: the 32-bit routes of old
        parts = route.split("/")
        later = dict(good, endpoint="/".join(parts[:-2] + ["zzzzzz", parts[-1]]))
        assert get_through(d, later) == 403  # a longer expiry without a new signature
        other = d.create()
        try:
            moved = dict(good, endpoint=route.replace(f"/{sid}/", f"/{other}/"))
            assert get_through(d, moved) == 403  # the signature covers the sandbox id
        finally:
            d.delete(other)
        short = endpoint(d, sid, "key-a", f"?expires={int(time.time()) + 2}")
        assert get_through(d, short) == 200
        time.sleep(3)
        assert get_through(d, short) == 403
        for q in ("?expires=1", "?expires=abc", "?expires=01",
                  f"?expires={int(time.time()) + 600}&use_server_proxy=true",
                  "?use_server_proxy=maybe", "?colour=red"):
            status, err, _ = call(d, "GET", f"/v1/sandboxes/{sid}/endpoints/44772{q}", "key-a")
            assert status == 400 and set(err) == {"code", "message"}, (q, err)
    finally:
        d.delete(sid)
