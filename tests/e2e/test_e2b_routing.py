"""E2B's sandbox traffic through coved, as the E2B SDKs send it: under /e2b/sandbox
(E2B_SANDBOX_URL) routed by the E2b-Sandbox-Id and E2b-Sandbox-Port headers, or by the host
form {port}-{id}.localhost that Sandbox.getHost(port) returns. envd's port 49983 is the agent
(paths as they are), the code interpreter's 49999 the agent under /ci, any other port the
sandbox's own server; E2B's credentials and E2B's error shape {"code": <status>, "message"}."""

import hashlib
import http.client
import json
import os
import socket

import pytest

from covetest import Coved, serve

HERE = os.path.dirname(os.path.abspath(__file__))
A, B = "key-a", "key-b"
ENVD, CI, APP = 49983, 49999, 8000
SANITIZED = os.environ.get("COVE_SANITIZED") == "1"


@pytest.fixture(scope="module")
def d():
    with serve(api_keys=(A, B)) as coved:
        yield coved


def e2b_create(d, key=A):
    status, sb, _ = d.request("POST", "/e2b/sandboxes", {"templateID": "base", "timeout": 600},
                              headers={"X-API-Key": key, "Content-Type": "application/json"})
    assert status == 201, sb
    return sb


@pytest.fixture(scope="module")
def sb(d):
    """An E2B sandbox running gated_server.py (echo_server.py's, plus /gate) on port APP."""
    made = e2b_create(d)
    sid = made["sandboxID"]
    for name in ("echo_server.py", "gated_server.py"):
        source = open(os.path.join(HERE, "sandbox_servers", name)).read()
        d.sh(sid, f"cat > /tmp/{name} <<'PYEOF'\n{source}\nPYEOF")
    d.exec(sid, f"cd /tmp && python3 gated_server.py {APP}", background=True)
    probe = f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {APP}))\""
    for _ in range(200):
        if d.exec(sid, probe).exit_code == 0:
            break
    else:
        pytest.fail("the sandbox's server did not start")
    yield made
    d.delete(sid)


def connect(d):
    return http.client.HTTPConnection("127.0.0.1", d.port, timeout=60)


def answer(conn, method, path, headers, body=None):
    conn.request(method, path, body=body, headers=headers)
    resp = conn.getresponse()
    data = resp.read()
    try:
        parsed = json.loads(data) if data else None
    except json.JSONDecodeError:
        parsed = data
    return resp.status, parsed


def by_headers(d, sid, port, path="/", method="GET", headers=None, body=None):
    h = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": str(port)}
    h.update(headers or {})
    return answer(connect(d), method, "/e2b/sandbox" + path, h, body)


def by_host(d, sid, port, path="/", method="GET", headers=None, body=None):
    h = {"Host": f"{port}-{sid}.localhost:{d.port}"}
    h.update(headers or {})
    return answer(connect(d), method, path, h, body)


def token(sb):
    return {"X-Access-Token": sb["envdAccessToken"]}


def assert_e2b_error(status, body, expected):
    assert status == expected, body
    assert isinstance(body, dict) and set(body) == {"code", "message"}, body
    assert body["code"] == expected and body["message"], body


FORMS = [by_headers, by_host]


def test_the_traffic_token_is_the_envd_token(d, sb):
    assert sb["trafficAccessToken"] == sb["envdAccessToken"] and sb["envdAccessToken"]
    status, again, _ = d.request("POST", f"/e2b/sandboxes/{sb['sandboxID']}/connect",
                                 {"timeout": 600},
                                 headers={"X-API-Key": A, "Content-Type": "application/json"})
    assert status == 200 and again["trafficAccessToken"] == sb["envdAccessToken"], again


@pytest.mark.parametrize("form", FORMS, ids=["headers", "host"])
def test_envd_port_is_the_agent(d, sb, form):
    assert form(d, sb["sandboxID"], ENVD, "/ping", headers=token(sb)) == (200, None)
    status, body = form(d, sb["sandboxID"], ENVD, "/no/such/agent/route", headers=token(sb))
    assert status == 404 and body["code"] == "NOT_FOUND", body  # the agent's own 404


def test_the_gateways_path_form_reaches_the_same_places(d, sb):
    sid = sb["sandboxID"]
    conn = connect(d)
    assert answer(conn, "GET", f"/sandboxes/{sid}/proxy/{ENVD}/ping", token(sb)) == (200, None)
    status, body = answer(conn, "GET", f"/sandboxes/{sid}/proxy/{CI}/ping", token(sb))
    assert status == 404 and body["code"] == "NOT_FOUND", body  # the agent's, under /ci
    assert_e2b_error(*answer(conn, "GET", f"/sandboxes/{sid}/proxy/{ENVD}/ping", {}), 401)


@pytest.mark.parametrize("form", FORMS, ids=["headers", "host"])
def test_code_interpreter_port_is_the_agent_under_ci(d, sb, form):
    """/ping exists at the agent's root (200 on envd's port), so a 404 from the agent on the
    code interpreter's port shows the path went there under /ci."""
    status, body = form(d, sb["sandboxID"], CI, "/ping",
                        headers={"E2B-Traffic-Access-Token": sb["trafficAccessToken"]})
    assert status == 404 and body == {"code": "NOT_FOUND", "message": "no such route"}, body


@pytest.mark.parametrize("form", FORMS, ids=["headers", "host"])
def test_other_ports_are_the_sandboxs_server(d, sb, form):
    status, echo = form(d, sb["sandboxID"], APP, "/a/b?x=1&y=%20z", method="PATCH",
                        headers={**token(sb), "E2B-Traffic-Access-Token": sb["envdAccessToken"],
                                 "X-Custom": "kept"}, body=b"hello")
    assert status == 200, echo
    assert echo["method"] == "PATCH" and echo["path"] == "/a/b?x=1&y=%20z"
    assert echo["headers"]["x-custom"] == "kept"
    assert echo["body_sha256"] == hashlib.sha256(b"hello").hexdigest()
    # the traffic token is coved's, never the sandbox's
    assert "e2b-traffic-access-token" not in echo["headers"]
    if form is by_headers:
        assert echo["headers"]["x-forwarded-prefix"] == "/e2b/sandbox"
        assert "x-access-token" not in echo["headers"]


def test_e2b_credentials_are_taken_off_on_e2b_routes_only(d, sb):
    sid = sb["sandboxID"]
    status, echo = by_headers(d, sid, APP, "/", headers={"X-API-Key": A})
    assert status == 200 and "x-api-key" not in echo["headers"], echo
    # on the host form of an app's own port, X-API-Key is the app's header, not coved's
    status, echo = by_host(d, sid, APP, "/", headers={**token(sb), "X-API-Key": "the app's"})
    assert status == 401, echo  # X-Access-Token is E2B's for envd only; not a gateway token here
    status, echo = by_host(d, sid, APP, "/", headers={"E2B-Traffic-Access-Token":
                                                      sb["trafficAccessToken"],
                                                      "X-API-Key": "the app's"})
    assert status == 200 and echo["headers"]["x-api-key"] == "the app's", echo


@pytest.mark.parametrize("form", FORMS, ids=["headers", "host"])
def test_envd_and_the_code_interpreter_need_the_token_or_the_owners_key(d, sb, form):
    sid = sb["sandboxID"]
    for port in (ENVD, CI):
        assert_e2b_error(*form(d, sid, port, "/ping"), 401)
        assert_e2b_error(*form(d, sid, port, "/ping", headers={"X-Access-Token": "0" * 64}), 401)
        assert_e2b_error(*form(d, sid, port, "/ping",
                               headers={"E2B-Traffic-Access-Token": "wrong"}), 401)
        assert_e2b_error(*form(d, sid, port, "/ping", headers={"X-API-Key": "not-a-key"}), 401)
        # another owner's key sees no such sandbox, as E2B answers one that is not there
        assert_e2b_error(*form(d, sid, port, "/ping", headers={"X-API-Key": B}), 502)
    assert form(d, sid, ENVD, "/ping", headers={"X-API-Key": A}) == (200, None)
    assert form(d, sid, ENVD, "/ping", headers={"OPEN-SANDBOX-API-KEY": A}) == (200, None)
    assert form(d, sid, ENVD, "/ping",
                headers={"E2B-Traffic-Access-Token": sb["trafficAccessToken"]}) == (200, None)


@pytest.mark.parametrize("form", FORMS, ids=["headers", "host"])
def test_unknown_sandbox_is_502(d, sb, form):
    for headers in (token(sb), {"X-API-Key": A}):
        status, body = form(d, "nosuchsandbox0000", ENVD, "/ping", headers=headers)
        assert_e2b_error(status, body, 502)
        assert "was not found" in body["message"]


def test_a_killed_sandbox_is_502(d):
    made = e2b_create(d)
    sid = made["sandboxID"]
    assert by_headers(d, sid, ENVD, "/ping", headers=token(made)) == (200, None)
    status, _, _ = d.request("DELETE", f"/e2b/sandboxes/{sid}", headers={"X-API-Key": A})
    assert status == 204
    assert_e2b_error(*by_headers(d, sid, ENVD, "/ping", headers=token(made)), 502)


BAD_HEADERS = [
    ("no id", {"E2b-Sandbox-Port": "49983"}),
    ("no port", {"E2b-Sandbox-Id": "SID"}),
    ("neither", {}),
    ("port not a number", {"E2b-Sandbox-Id": "SID", "E2b-Sandbox-Port": "envd"}),
    ("port 0", {"E2b-Sandbox-Id": "SID", "E2b-Sandbox-Port": "0"}),
    ("port too big", {"E2b-Sandbox-Id": "SID", "E2b-Sandbox-Port": "65536"}),
    ("port signed", {"E2b-Sandbox-Id": "SID", "E2b-Sandbox-Port": "+49983"}),
    ("id not an id", {"E2b-Sandbox-Id": "../SID", "E2b-Sandbox-Port": "49983"}),
    ("id empty", {"E2b-Sandbox-Id": "", "E2b-Sandbox-Port": "49983"}),
]


@pytest.mark.parametrize("name,headers", BAD_HEADERS, ids=[c[0] for c in BAD_HEADERS])
def test_missing_or_bad_headers_are_400(d, sb, name, headers):
    h = {k: v.replace("SID", sb["sandboxID"]) for k, v in headers.items()}
    status, body = answer(connect(d), "GET", "/e2b/sandbox/ping", {**h, **token(sb)})
    assert_e2b_error(status, body, 400)


def test_the_control_plane_beside_it_on_one_connection(d, sb):
    """/e2b/sandboxes is the control plane's, not under /e2b/sandbox; one keep-alive
    connection goes back and forth between the two."""
    conn = connect(d)
    sid = sb["sandboxID"]
    for _ in range(3):
        assert answer(conn, "GET", "/e2b/sandbox/ping", {"E2b-Sandbox-Id": sid,
                                                         "E2b-Sandbox-Port": str(ENVD),
                                                         **token(sb)}) == (200, None)
        status, listed = answer(conn, "GET", "/e2b/v2/sandboxes", {"X-API-Key": A})
        assert status == 200 and sid in [s["sandboxID"] for s in listed], listed


def vm_hwm_kb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


@pytest.mark.parametrize("form", ["headers", "host"])
def test_a_64_mb_upload_streams_through(d, sb, form):
    size = 64 * 1024 * 1024
    block = os.urandom(1024 * 1024)
    expected = hashlib.sha256(block * (size // len(block))).hexdigest()
    before = vm_hwm_kb(d.proc.pid)
    conn = connect(d)
    sid = sb["sandboxID"]
    if form == "headers":
        conn.putrequest("POST", "/e2b/sandbox/upload", skip_host=True)
        conn.putheader("Host", f"127.0.0.1:{d.port}")
        conn.putheader("E2b-Sandbox-Id", sid)
        conn.putheader("E2b-Sandbox-Port", str(APP))
    else:
        conn.putrequest("POST", "/upload", skip_host=True)
        conn.putheader("Host", f"{APP}-{sid}.localhost:{d.port}")
    conn.putheader("E2B-Traffic-Access-Token", sb["trafficAccessToken"])
    conn.putheader("Content-Length", str(size))
    conn.endheaders()
    for _ in range(size // len(block)):
        conn.send(block)
    resp = conn.getresponse()
    echo = json.loads(resp.read())
    assert resp.status == 200 and echo["body_size"] == size and echo["body_sha256"] == expected
    # relayed as it came: coved never held the body (a sanitized coved keeps what it freed in
    # ASan's quarantine, so its peak says nothing)
    assert vm_hwm_kb(d.proc.pid) - before < size // 1024 // 2 or SANITIZED


@pytest.mark.parametrize("form", ["headers", "host"])
def test_a_streamed_answer_is_not_held_back(d, sb, form):
    """The server writes its second part only once the first has reached the client (which
    then opens the gate): if coved held the answer back, the first part would never come."""
    sid = sb["sandboxID"]
    d.sh(sid, "rm -f /tmp/gate-open")
    s = socket.create_connection(("127.0.0.1", d.port), timeout=30)
    try:
        if form == "headers":
            head = (f"GET /e2b/sandbox/gate HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    f"E2b-Sandbox-Id: {sid}\r\nE2b-Sandbox-Port: {APP}\r\n")
        else:
            head = f"GET /gate HTTP/1.1\r\nHost: {APP}-{sid}.localhost:{d.port}\r\n"
        head += f"E2B-Traffic-Access-Token: {sb['trafficAccessToken']}\r\n\r\n"
        s.sendall(head.encode())
        got = b""
        while b'{"part": 1}' not in got:
            chunk = s.recv(65536)
            assert chunk, got
            got += chunk
        assert b'{"part": 2}' not in got
        d.sh(sid, "touch /tmp/gate-open")
        while b"0\r\n\r\n" not in got:
            chunk = s.recv(65536)
            assert chunk, got
            got += chunk
        assert b'{"part": 2}' in got
    finally:
        s.close()


def test_the_agents_stream_on_envds_port_is_not_held_back(d, sb):
    """The agent's own streamed answer (a command's output, as envd's Connect streams will
    be) through envd's port: the command prints its second line only once the first has
    reached the client."""
    sid = sb["sandboxID"]
    d.sh(sid, "rm -f /tmp/agent-gate")
    # printf builds the markers, so the command's own text does not hold them
    command = ("printf 'fi%sst\\n' r; while [ ! -e /tmp/agent-gate ]; do sleep 0.02; done; "
               "printf 'sec%snd\\n' o")
    body = json.dumps({"command": command}).encode()
    s = socket.create_connection(("127.0.0.1", d.port), timeout=30)
    try:
        s.sendall((f"POST /e2b/sandbox/command HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                   f"E2b-Sandbox-Id: {sid}\r\nE2b-Sandbox-Port: {ENVD}\r\n"
                   f"X-Access-Token: {sb['envdAccessToken']}\r\n"
                   f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                   f"\r\n").encode() + body)
        got = b""
        while b"first" not in got:
            chunk = s.recv(65536)
            assert chunk, got
            got += chunk
        assert got.startswith(b"HTTP/1.1 200") and b"second" not in got, got
        d.sh(sid, "touch /tmp/agent-gate")
        while b"second" not in got:
            chunk = s.recv(65536)
            assert chunk, got
            got += chunk
    finally:
        s.close()


def test_paused_sandbox_is_409_or_resumed_on_access(d):
    made = e2b_create(d)
    sid = made["sandboxID"]
    try:
        status, _, _ = d.request("POST", f"/e2b/sandboxes/{sid}/pause", headers={"X-API-Key": A})
        assert status == 204
        status, body = by_headers(d, sid, ENVD, "/ping", headers=token(made))
        assert_e2b_error(status, body, 409)
        assert "paused" in body["message"].lower() and "resume" in body["message"]
        assert d.get(sid)["status"]["state"] == "Paused"
    finally:
        d.delete(sid)
    r = Coved(api_keys=(A,), extra_args=["--resume-on-access"]).start()
    try:
        made = e2b_create(r)
        sid = made["sandboxID"]
        status, _, _ = r.request("POST", f"/e2b/sandboxes/{sid}/pause", headers={"X-API-Key": A})
        assert status == 204 and r.get(sid)["status"]["state"] == "Paused"
        for form in FORMS:
            assert form(r, sid, ENVD, "/ping", headers=token(made)) == (200, None)
            assert r.get(sid)["status"]["state"] == "Running"
            r.pause(sid)
    finally:
        r.cleanup()
