"""Signed gateway routes (issue 8, item 1): a 128-bit HMAC in the path and host forms, old
32-bit routes refused, bad signatures rate-limited per peer address, keys rotated and retired
with `coved route-key` while coved runs."""

import hashlib
import http.client
import json
import os
import re
import secrets
import stat
import struct
import subprocess
import tempfile
import time

import pytest

from covetest import AGENT_PORT, COVED, Coved, serve

DOMAIN = "cove.test"
FLOOD_PEER = "127.77.0.2"  # all of 127/8 is loopback: a second client address for free
MAX_BAD = 20  # ROUTE_BAD_SIGNATURES_MAX in route_token.h


@pytest.fixture(scope="module")
def legacy_secret():
    return secrets.token_bytes(32)


@pytest.fixture(scope="module")
def coved(legacy_secret):
    """A daemon with host routing, started on a state dir an older coved left: its
    route_secret must become the ring's first key."""
    state = tempfile.mkdtemp(prefix="cove-test-")
    with open(os.path.join(state, "route_secret"), "wb") as f:
        f.write(legacy_secret)
    os.chmod(os.path.join(state, "route_secret"), 0o600)
    with serve("--domain", DOMAIN, state_dir=state) as d:
        yield d


def endpoint(d, sid, expires_in=600, host=False, port=AGENT_PORT):
    q = f"?expires={int(time.time()) + expires_in}" + ("&host=true" if host else "")
    status, body, _ = d.request("GET", f"/v1/sandboxes/{sid}/endpoints/{port}{q}")
    assert status == 200 and body["headers"] == {}, body
    return body["endpoint"]


def through(d, path, host=None, source=None, method="GET", body=None):
    """Status and JSON body of a request to coved from source (an address of 127/8)."""
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=30,
                                      source_address=(source, 0) if source else None)
    headers = {"Host": host} if host else {}
    if body is not None:
        headers["Content-Type"] = "application/json"
    conn.request(method, path, body=body, headers=headers)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    try:
        parsed = json.loads(data) if data else None
    except json.JSONDecodeError:
        parsed = data
    return resp.status, parsed


def path_of(route):
    """/route/... of a path-form endpoint host:port/route/..."""
    return "/" + route.partition("/")[2]


def route_key(d, *args):
    return subprocess.run([COVED, "route-key", *args, "--state-dir", d.state_dir],
                          capture_output=True, text=True, timeout=30)


def old_signature(secret, sid, port, b36):
    """The 9-character signature of the coved before this change (SHA-256 of the secret and
    the route cut to 32 bits): a route the old daemon accepted."""
    canonical = f"v1\nshort\n{sid}\n{port}\n{b36}\n".encode()
    digest = hashlib.sha256(struct.pack(">I", len(secret)) + secret +
                            struct.pack(">I", len(canonical)) + canonical).digest()
    return digest[:4].hex() + "0"


def until(predicate, seconds=10):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def test_routes_from_the_api_work_in_path_and_host_form(coved, make_sandbox):
    sid = make_sandbox()
    route = endpoint(coved, sid)
    m = re.fullmatch(rf"127\.0\.0\.1:{coved.port}/route/{sid}/{AGENT_PORT}/([0-9a-z]+)/"
                     r"([0-9a-z])([A-Za-z0-9_-]{22})", route)
    assert m, route  # key id + 128 bits of base64url
    assert through(coved, path_of(route) + "/ping", source="127.77.0.4")[0] == 200
    status, out = through(coved, path_of(route) + "/command", method="POST",
                          body=json.dumps({"command": "echo through-a-signed-route"}))
    assert status == 200 and b"through-a-signed-route" in (out if isinstance(out, bytes)
                                                          else json.dumps(out).encode())

    host = endpoint(coved, sid, host=True)
    label, _, rest = host.partition(".")
    assert rest == f"{DOMAIN}:{coved.port}" and len(label) <= 63, host
    assert re.fullmatch(rf"{sid}-{AGENT_PORT}-[0-9a-z]+-[0-9a-z][a-z2-7]{{26}}", label), label
    assert through(coved, "/ping", host=host, source="127.77.0.4")[0] == 200
    # browsers lower-case host names; any case is the same name
    assert through(coved, "/ping", host=host.upper(), source="127.77.0.4")[0] == 200
    # host=true without expires: the host form with the access token header
    status, plain, _ = coved.request("GET", f"/v1/sandboxes/{sid}/endpoints/{AGENT_PORT}?host=true")
    assert status == 200 and plain["endpoint"] == f"{AGENT_PORT}-{sid}.{DOMAIN}:{coved.port}"
    conn = http.client.HTTPConnection("127.0.0.1", coved.port, timeout=30)
    conn.request("GET", "/ping", headers={"Host": plain["endpoint"], **plain["headers"]})
    assert conn.getresponse().status == 200
    conn.close()
    # the host form's signature is not valid in the path and the other way round
    b36, sig = label.split("-")[2:]
    assert through(coved, f"/route/{sid}/{AGENT_PORT}/{b36}/{sig}/ping",
                   source="127.77.0.4")[0] == 403
    assert through(coved, "/ping", host=f"{sid}-{AGENT_PORT}-{m[1]}-{m[2]}{m[3]}.{DOMAIN}",
                   source="127.77.0.4")[0] == 403


def test_tampered_truncated_and_old_routes_are_403(coved, make_sandbox, legacy_secret):
    sid = make_sandbox()
    route = path_of(endpoint(coved, sid))
    prefix, sig = route.rsplit("/", 1)
    b36 = prefix.rsplit("/", 1)[1]
    assert through(coved, route + "/ping", source="127.77.0.3")[0] == 200
    # what the coved before this change signed with the very same secret: refused now
    old = old_signature(legacy_secret, sid, AGENT_PORT, b36)
    status, err = through(coved, f"{prefix}/{old}/ping", source="127.77.0.3")
    assert status == 403 and err["code"] == "GATEWAY::INVALID_SIGNATURE", (status, err)
    bad = []
    for i in (0, 1, 11, len(sig) - 1):  # the key id, the MAC's first, middle and last char
        c = "A" if sig[i] != "A" else "B"
        bad.append(sig[:i] + c + sig[i + 1:])
    bad += [sig[:-1], sig[:12], sig + "A", sig.lower() if sig != sig.lower() else sig.upper()]
    bad += ["00000000" + "0"]
    for s in bad:
        status, err = through(coved, f"{prefix}/{s}/ping", source="127.77.0.3")
        assert status == 403 and set(err) == {"code", "message"}, (s, status, err)
        assert err["code"] == "GATEWAY::INVALID_SIGNATURE"
    host_bad = f"{sid}-{AGENT_PORT}-{b36}-{old}.{DOMAIN}"
    assert through(coved, "/ping", host=host_bad, source="127.77.0.3")[0] == 403
    # the old secret went into the ring (0600) and its file is gone
    assert not os.path.exists(os.path.join(coved.state_dir, "route_secret"))
    mode = os.stat(os.path.join(coved.state_dir, "route_keys")).st_mode
    assert stat.S_IMODE(mode) == 0o600
    assert through(coved, route + "/ping", source="127.77.0.3")[0] == 200
    assert coved.health()["status"] == "healthy"


def test_rotate_keeps_old_routes_and_retire_ends_them(coved, make_sandbox):
    sid = make_sandbox()
    before = path_of(endpoint(coved, sid))
    host_before = endpoint(coved, sid, host=True)
    old_id = before.rsplit("/", 1)[1][0]
    assert through(coved, before + "/ping", source="127.77.0.5")[0] == 200

    r = route_key(coved, "rotate")
    assert r.returncode == 0, r.stderr
    new_id = re.search(r"key (\w) signs", r.stdout)[1]
    assert new_id != old_id
    # coved picks the new ring up by itself (within about a second)
    assert until(lambda: path_of(endpoint(coved, sid)).rsplit("/", 1)[1][0] == new_id)
    after = path_of(endpoint(coved, sid))
    assert through(coved, after + "/ping", source="127.77.0.5")[0] == 200
    # old routes keep working
    assert through(coved, before + "/ping", source="127.77.0.5")[0] == 200
    assert through(coved, "/ping", host=host_before, source="127.77.0.5")[0] == 200
    listed = route_key(coved, "list")
    assert listed.returncode == 0
    rows = {line.split()[0]: line.split()[1] for line in listed.stdout.splitlines()[1:]}
    assert rows == {old_id: "verify", new_id: "current"}, listed.stdout
    assert not re.search(r"[0-9a-f]{64}", listed.stdout)  # never the secrets

    # the current key cannot go; an unknown one is an error too
    for args in (("retire", new_id), ("retire", "q" if "q" not in rows else "p")):
        r = route_key(coved, *args)
        assert r.returncode == 1 and r.stdout == "" and "route-key retire" in r.stderr, r
    r = route_key(coved, "retire", old_id)
    assert r.returncode == 0, r.stderr
    assert until(lambda: through(coved, before + "/ping", source="127.77.0.5")[0] == 403)
    assert through(coved, "/ping", host=host_before, source="127.77.0.5")[0] == 403
    assert through(coved, after + "/ping", source="127.77.0.5")[0] == 200
    assert "route keys: reloaded" in coved.log()
    # usage errors
    for args in ((), ("spin",), ("retire",), ("retire", "ab"), ("list", "extra")):
        assert route_key(coved, *args).returncode == 2, args


def test_route_key_on_a_wrong_state_dir_changes_nothing(tmp_path):
    r = subprocess.run([COVED, "route-key", "rotate", "--state-dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "no route keys" in r.stderr, r
    assert os.listdir(tmp_path) == []


def test_bad_signature_flood_from_one_peer_gets_429_others_unaffected(coved, make_sandbox):
    sid, other = make_sandbox(), make_sandbox()
    route = path_of(endpoint(coved, sid))
    prefix, sig = route.rsplit("/", 1)
    # a guesser: one keep-alive connection from its own address, bounded to 3 * MAX_BAD tries
    conn = http.client.HTTPConnection("127.0.0.1", coved.port, timeout=30,
                                      source_address=(FLOOD_PEER, 0))
    statuses = []
    for i in range(3 * MAX_BAD):
        guess = sig[0] + secrets.token_urlsafe(16)[:21] + "A"
        conn.request("GET", f"{prefix}/{guess}/ping")
        resp = conn.getresponse()
        body = json.loads(resp.read())
        assert set(body) == {"code", "message"}
        statuses.append(resp.status)
    conn.close()
    assert statuses == [403] * MAX_BAD + [429] * (2 * MAX_BAD), statuses
    # from that peer even a good route is refused, unchecked, for a while
    status, err = through(coved, route + "/ping", source=FLOOD_PEER)
    assert status == 429 and err["code"] == "GATEWAY::TOO_MANY_BAD_SIGNATURES", err
    # another address is not affected: its good routes work, its bad ones are just 403
    assert through(coved, route + "/ping", source="127.0.0.1")[0] == 200
    assert through(coved, f"{prefix}/{sig[:-1]}B/ping", source="127.0.0.1")[0] == 403
    # the API and key or token routes from the blocked address are untouched
    assert through(coved, "/health", source=FLOOD_PEER)[0] == 200
    # failures are logged a line a second at most (the rest counted), and the block names
    # the peer
    lines = coved.log().splitlines()
    bad_lines = [l for l in lines if "bad signed route from" in l]
    assert 1 <= len(bad_lines) < MAX_BAD, bad_lines
    assert any(f"{FLOOD_PEER} sent {MAX_BAD} bad signed routes" in l for l in lines)
    # and afterwards: coved healthy, a second sandbox works through a new signed route
    assert coved.proc.poll() is None and coved.health()["status"] == "healthy"
    assert coved.exec(other, "echo alive").stdout.strip() == "alive"
    assert through(coved, path_of(endpoint(coved, other)) + "/ping")[0] == 200
