"""The fine print of the OpenSandbox contract, item by item: renewing to an earlier expiry,
states Cove never produces in list filters, execd's access-token header, line-based
downloads, image aliases, entrypoints that cannot start, and ended sandboxes remembered."""

import datetime
import http.client
import json
import os
import re
import signal
import time
import urllib.parse

import pytest

from covetest import AGENT_PORT, Coved, serve

HERE = os.path.dirname(os.path.abspath(__file__))
ECHO_PORT = 8000


def iso(t):
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat()


def parse(text):
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def listing(d, query, key=None):
    return d.ok("GET", "/v1/sandboxes?" + query, headers=d.headers(key))


def init_pid(sid):
    for root in ("/sys/fs/cgroup/pids/cove", "/sys/fs/cgroup/cove"):
        path = os.path.join(root, sid, "cgroup.procs")
        if os.path.exists(path):
            return min(int(x) for x in open(path).read().split())
    raise AssertionError(f"no cgroup for {sid}")


def wait_state(d, sid, state, seconds=10):
    deadline = time.time() + seconds
    while time.time() < deadline:
        body = d.get(sid)
        if body["status"]["state"] == state:
            return body
        time.sleep(0.05)
    raise AssertionError(f"{sid} never became {state}: {d.get(sid)}")


# ---- renew-expiration ----

def test_renew_to_an_earlier_future_time_is_accepted_the_past_is_not(coved):
    sid = coved.create(timeout=3600)
    try:
        first = parse(coved.get(sid)["expiresAt"])
        earlier = int(time.time()) + 300
        assert earlier < first - 3000
        body = coved.ok("POST", f"/v1/sandboxes/{sid}/renew-expiration", {"expiresAt": iso(earlier)})
        assert abs(parse(body["expiresAt"]) - earlier) < 0.01
        assert abs(parse(coved.get(sid)["expiresAt"]) - earlier) < 0.01
        for past in (time.time() - 5, time.time() - 86400):
            status, err, _ = coved.request("POST", f"/v1/sandboxes/{sid}/renew-expiration",
                                           {"expiresAt": iso(past)})
            assert status == 400 and err["code"] == "SANDBOX::INVALID_PARAMETER", err
            assert "future" in err["message"]
        assert abs(parse(coved.get(sid)["expiresAt"]) - earlier) < 0.01
        # shortened to seconds from now, it really expires then (a pool handing it out)
        coved.ok("POST", f"/v1/sandboxes/{sid}/renew-expiration", {"expiresAt": iso(time.time() + 1.5)})
        deadline = time.time() + 10
        while time.time() < deadline:
            status, err, _ = coved.request("GET", f"/v1/sandboxes/{sid}")
            if status == 404:
                break
            time.sleep(0.1)
        assert status == 404 and err["code"] == "SANDBOX::NOT_FOUND", err
        assert "ttl_expiry" in err["message"], err
    except Exception:
        coved.request("DELETE", f"/v1/sandboxes/{sid}")
        raise


# ---- list filters ----

def test_list_states_cove_never_produces_match_nothing(coved):
    sid = coved.create(metadata={"fine": "states"})
    try:
        for query in ("state=Allocated", "state=allocated&state=Queued", "state=Nonsense"):
            body = listing(coved, query)
            assert body["items"] == [] and body["pagination"]["totalItems"] == 0, (query, body)
        mixed = listing(coved, "state=Allocated&state=Running&metadata=" +
                        urllib.parse.quote("fine=states"))
        assert [s["id"] for s in mixed["items"]] == [sid]
        assert listing(coved, "state=Paused&metadata=" + urllib.parse.quote("fine=states"))["items"] == []
        # other mistakes are still 400s
        for query in ("bogus=1", "page=0", "&".join(["state=Running"] * 9)):
            status, err, _ = coved.request("GET", "/v1/sandboxes?" + query)
            assert status == 400 and err["code"] == "SANDBOX::INVALID_PARAMETER", (query, err)
    finally:
        coved.delete(sid)


# ---- the endpoint's access-token header ----

@pytest.fixture(scope="module")
def echo(coved):
    sid = coved.create()
    source = open(os.path.join(HERE, "sandbox_servers", "echo_server.py")).read()
    coved.sh(sid, f"cat > /tmp/echo_server.py <<'PYEOF'\n{source}\nPYEOF")
    coved.exec(sid, f"python3 /tmp/echo_server.py {ECHO_PORT}", background=True)
    for _ in range(100):
        probe = f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {ECHO_PORT}))\""
        if coved.exec(sid, probe).exit_code == 0:
            break
        time.sleep(0.05)
    yield sid
    coved.delete(sid)


def through(d, sid, headers):
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=30)
    conn.request("GET", f"/sandboxes/{sid}/proxy/{ECHO_PORT}/x", headers=headers)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, json.loads(data) if data else None


def test_endpoint_token_header_is_execds_and_the_old_name_still_works(coved, echo):
    ep = coved.ok("GET", f"/v1/sandboxes/{echo}/endpoints/{ECHO_PORT}")
    assert list(ep["headers"]) == ["X-EXECD-ACCESS-TOKEN"], ep
    token = ep["headers"]["X-EXECD-ACCESS-TOKEN"]
    assert re.fullmatch(r"[0-9a-f]{64}", token)
    private = {"x-execd-access-token", "x-cove-access-token", "open-sandbox-api-key"}
    for headers in ({"X-EXECD-ACCESS-TOKEN": token}, {"x-execd-access-token": token},
                    {"X-Cove-Access-Token": token},  # deprecated, still accepted
                    {"X-EXECD-ACCESS-TOKEN": token, "X-Cove-Access-Token": "0" * 64}):
        status, body = through(coved, echo, {**headers, "X-Kept": "1"})
        assert status == 200, headers
        assert body["headers"]["x-kept"] == "1"
        # neither name (nor its value) ever reaches the sandbox
        assert not private & set(body["headers"]), body["headers"]
        assert token not in json.dumps(body)
    for headers in ({"X-EXECD-ACCESS-TOKEN": "0" * 64}, {"X-Cove-Access-Token": "0" * 64},
                    {"X-EXECD-ACCESS-TOKEN": "0" * 64, "X-Cove-Access-Token": token}, {}):
        status, body = through(coved, echo, headers)
        assert status == 401, (headers, body)


# ---- line-based downloads ----

def download(d, sid, headers=None, **params):
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=60)
    h = {"OPEN-SANDBOX-API-KEY": d.key, **(headers or {})}
    conn.request("GET", f"/sandboxes/{sid}/proxy/{AGENT_PORT}/files/download?" +
                 urllib.parse.urlencode(params), headers=h)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, data, resp


def test_download_offset_and_limit_return_lines_joined_without_a_trailing_newline(coved, sandbox):
    # lines: "one", "two" (CRLF), "" (empty), "th\rree" (a CR inside stays), "four" (no LF)
    coved.sh(sandbox, "printf 'one\\ntwo\\r\\n\\nth\\rree\\nfour' > /tmp/lines.txt")
    coved.sh(sandbox, "seq 1 100000 > /tmp/many.txt")  # larger than one read
    path = "/tmp/lines.txt"
    cases = [
        ({"offset": 1, "limit": 2}, b"one\ntwo"),
        ({"offset": 2, "limit": 2}, b"two\n"),
        ({"offset": 2}, b"two\n\nth\rree\nfour"),        # to the end
        ({"limit": 1}, b"one"),                          # from the first line
        ({"limit": 100}, b"one\ntwo\n\nth\rree\nfour"),
        ({"offset": 5, "limit": 3}, b"four"),
        ({"offset": 6}, b""),                            # beyond the end: nothing
        ({"offset": "3", "limit": "1"}, b""),            # the empty line
    ]
    for params, want in cases:
        status, got, resp = download(coved, sandbox, path=path, **params)
        assert status == 200, (params, got)
        assert got == want, (params, got)
        assert resp.getheader("Content-Type").startswith("text/plain"), params
        assert resp.getheader("Content-Disposition") is None
    status, got, _ = download(coved, sandbox, path="/tmp/many.txt", offset=99990, limit=20)
    assert got == "\n".join(str(i) for i in range(99990, 100001)).encode()
    status, got, _ = download(coved, sandbox, path="/tmp/many.txt", offset=50000, limit=2)
    assert got == b"50000\n50001"
    # without either, the file as it is
    status, got, resp = download(coved, sandbox, path=path)
    assert status == 200 and got == b"one\ntwo\r\n\nth\rree\nfour"
    assert resp.getheader("Content-Type") == "application/octet-stream"
    # mutually exclusive with Range, and bad numbers: 400 with a JSON error
    for params, headers in [({"offset": 1}, {"Range": "bytes=0-3"}),
                            ({"limit": 2}, {"Range": "bytes=0-3"}),
                            ({"offset": 0}, None), ({"limit": 0}, None),
                            ({"offset": -1}, None), ({"limit": "x"}, None),
                            ({"offset": "1.5", "limit": 1}, None)]:
        status, got, _ = download(coved, sandbox, headers, path=path, **params)
        assert status == 400, (params, headers, got)
        assert set(json.loads(got)) == {"code", "message"}
    status, got, _ = download(coved, sandbox, {"Range": "bytes=0-2"}, path=path)
    assert status == 206 and got == b"one"


# ---- image aliases ----

def test_templates_list_their_aliases_and_aliases_create_sandboxes(coved):
    items = {t["name"]: t for t in coved.ok("GET", "/v1/templates")["items"]}
    assert "opensandbox/code-interpreter" in items["code-interpreter"]["aliases"]
    assert "ubuntu" in items["base"]["aliases"]
    assert all(isinstance(t["aliases"], list) for t in items.values())
    sid = coved.create(template="ubuntu:22.04")
    try:
        assert coved.get(sid)["image"] == {"uri": "base"}
        assert coved.sh(sid, "echo ok") == "ok\n"
    finally:
        coved.delete(sid)
    for image in ("opensandbox/code-interpreter:v1.0.1",
                  "sandbox-registry.cn-zhangjiakou.cr.aliyuncs.com/opensandbox/code-interpreter:v1.0.1"):
        sid = coved.create(template=image)
        try:
            assert coved.get(sid)["image"] == {"uri": "code-interpreter"}, image
        finally:
            coved.delete(sid)


def test_unknown_image_is_a_400_listing_templates_and_aliases(coved):
    before = listing(coved, "pageSize=1000")["pagination"]["totalItems"]
    for image in ("opensandbox/chrome:latest", "opensandbox/code-interpreter-x", "nope"):
        status, err, _ = coved.request("POST", "/v1/sandboxes", {
            "image": {"uri": image}, "entrypoint": ["sleep", "1"]})
        assert status == 400 and err["code"] == "SANDBOX::IMAGE_NOT_FOUND", err
        assert image in err["message"]
        assert "base" in err["message"] and "code-interpreter" in err["message"]
        assert "opensandbox/code-interpreter" in err["message"]  # the aliases too
    assert listing(coved, "pageSize=1000")["pagination"]["totalItems"] == before


def test_image_aliases_are_configurable():
    with serve("--image-aliases", "registry.example.com/team/tools=base, python:3.11=base") as d:
        items = {t["name"]: t for t in d.ok("GET", "/v1/templates")["items"]}
        assert items["base"]["aliases"] == ["team/tools", "python:3.11"]
        assert items["code-interpreter"]["aliases"] == []
        sid = d.create(template="other.example.org:5000/team/tools:7")
        try:
            assert d.get(sid)["image"] == {"uri": "base"}
        finally:
            d.delete(sid)
        # the table replaced the defaults; a tagged entry is that tag only
        for image in ("opensandbox/code-interpreter", "python:3.12"):
            status, err, _ = d.request("POST", "/v1/sandboxes", {
                "image": {"uri": image}, "entrypoint": ["sleep", "1"]})
            assert status == 400 and err["code"] == "SANDBOX::IMAGE_NOT_FOUND", (image, err)
    with serve("--image-aliases", "") as d:
        assert all(t["aliases"] == [] for t in d.ok("GET", "/v1/templates")["items"])
    for bad in ("opensandbox/code-interpreter", "a=Not_A_Template", "=base"):
        d = Coved(extra_args=["--image-aliases", bad])
        try:
            with pytest.raises(RuntimeError):
                d.start()
            assert "image_aliases" in d.log(), d.log()
        finally:
            d.cleanup()


# ---- entrypoints that cannot start ----

@pytest.mark.parametrize("entrypoint, why", [
    (["/no/such/program", "arg"], "No such file"),
    (["no-such-command-anywhere"], "No such file"),
    (["/etc/passwd"], "Permission denied"),  # not executable
])
def test_entrypoint_that_cannot_start_makes_the_sandbox_failed(coved, entrypoint, why):
    status, body, _ = coved.request("POST", "/v1/sandboxes", {
        "image": {"uri": "base"}, "entrypoint": entrypoint, "metadata": {"fine": "entry"}})
    assert status == 202, body
    sid = body["id"]
    try:
        for shown in (body, coved.get(sid)):
            assert shown["status"]["state"] == "Failed", shown
            assert shown["status"]["reason"] == "entrypoint_failed", shown
            assert entrypoint[0] in shown["status"]["message"], shown
            assert why in shown["status"]["message"], shown
        ids = [s["id"] for s in listing(coved, "state=Failed&metadata=" +
                                        urllib.parse.quote("fine=entry"))["items"]]
        assert ids == [sid]
        # nothing of it runs: its ports are refused with the reason
        status, err, _ = coved.request("POST", f"/sandboxes/{sid}/proxy/{AGENT_PORT}/command",
                                       {"command": "true"})
        assert status == 409 and why in err["message"], err
        assert not os.path.exists(coved.run_dir(sid))
    finally:
        coved.delete(sid)
    status, err, _ = coved.request("GET", f"/v1/sandboxes/{sid}")
    assert status == 404 and "(failed:" in err["message"] and why in err["message"], err


def test_entrypoint_that_starts_and_exits_is_not_a_start_failure(coved):
    sid = coved.create(entrypoint=["true"])
    try:
        body = coved.get(sid)
        assert body["status"]["state"] == "Running", body  # the agent, PID 1, goes on
        assert coved.sh(sid, "echo alive") == "alive\n"
    finally:
        coved.delete(sid)


# ---- ended sandboxes remembered ----

@pytest.fixture
def two_owners():
    with serve(api_keys=("key-a", "key-b")) as d:
        yield d


def ended_message(d, sid, key=None):
    status, err, _ = d.request("GET", f"/v1/sandboxes/{sid}", headers=d.headers(key))
    assert status == 404 and err["code"] == "SANDBOX::NOT_FOUND", err
    return err["message"]


def test_deleted_sandbox_is_a_404_saying_when_and_why(two_owners):
    d = two_owners
    sid = d.create(metadata={"team": "a", "run": "one"}, timeout=600)
    before = time.time()
    d.delete(sid)
    message = ended_message(d, sid)
    assert "user_delete" in message and sid in message, message
    when = re.search(r"\d{4}-\d\d-\d\dT[0-9:.]+Z", message)
    assert when and before - 1 <= parse(when.group()) <= time.time() + 1, message
    # every route on it says the same
    for method, path in (("DELETE", f"/v1/sandboxes/{sid}"),
                         ("POST", f"/v1/sandboxes/{sid}/pause"),
                         ("GET", f"/v1/sandboxes/{sid}/endpoints/80")):
        status, err, _ = d.request(method, path)
        assert status == 404 and "user_delete" in err["message"], (path, err)
    # a typo still reads as one
    assert "ended" not in ended_message(d, "nosuchsandbox00")
    # another owner learns nothing
    other = ended_message(d, sid, key="key-b")
    assert "ended" not in other and "user_delete" not in other
    # state=Terminated lists the remembered ones (the owner's, with the other filters)
    terminated = listing(d, "state=Terminated")["items"]
    assert [s["id"] for s in terminated] == [sid]
    t = terminated[0]
    assert t["status"]["state"] == "Terminated" and t["status"]["reason"] == "user_delete"
    assert t["metadata"] == {"team": "a", "run": "one"}
    assert t["image"] == {"uri": "base"} and t["entrypoint"] == ["sleep", "infinity"]
    assert "expiresAt" in t and "createdAt" in t
    assert listing(d, "state=Terminated&metadata=" + urllib.parse.quote("run=two"))["items"] == []
    assert listing(d, "state=Terminated", key="key-b")["items"] == []
    # without state=Terminated the list is the live ones only
    assert sid not in [s["id"] for s in listing(d, "pageSize=1000")["items"]]
    live = d.create()
    try:
        both = listing(d, "state=Running&state=TERMINATED")["items"]
        assert [s["id"] for s in both] == [live, sid]
        assert listing(d, "state=Running&state=Terminated&pageSize=1&page=2")["items"][0]["id"] == sid
    finally:
        d.delete(live)


def test_sandbox_that_failed_then_was_deleted_ended_failed(two_owners):
    d = two_owners
    sid = d.create()
    os.kill(init_pid(sid), signal.SIGKILL)
    failed = wait_state(d, sid, "Failed")
    d.delete(sid)
    message = ended_message(d, sid)
    assert "(failed:" in message and "killed by signal 9" in message, message
    ended = listing(d, "state=Terminated")["items"]
    assert ended[0]["status"]["reason"] == "failed"
    # it ended when it failed, not when it was deleted
    assert ended[0]["status"]["lastTransitionAt"] == failed["status"]["lastTransitionAt"]


def test_retention_is_configurable():
    with serve("--ended-retention", "0") as d:
        sid = d.create()
        d.delete(sid)
        assert ended_message(d, sid) == f"sandbox {sid} not found"
        assert listing(d, "state=Terminated")["items"] == []
    with serve("--ended-retention", "2") as d:
        sid = d.create()
        d.delete(sid)
        assert "user_delete" in ended_message(d, sid)
        time.sleep(2.5)
        assert ended_message(d, sid) == f"sandbox {sid} not found"
        assert listing(d, "state=Terminated")["items"] == []
    d = Coved(extra_args=["--ended-retention", "-1"])
    try:
        with pytest.raises(RuntimeError):
            d.start()
    finally:
        d.cleanup()


def test_ended_sandboxes_are_in_memory_only(fresh_coved):
    d = fresh_coved.start()
    sid = d.create()
    d.delete(sid)
    assert "user_delete" in ended_message(d, sid)
    d.kill()
    d.start()
    assert ended_message(d, sid) == f"sandbox {sid} not found"


@pytest.mark.not_under("gvisor", reason="the memory limit counts the sentry: runsc itself is OOM-killed at start")
def test_init_killed_by_the_oom_killer_is_failed_oom_and_ends_oom(two_owners):
    d = two_owners
    sid = d.create(limits={"memory": "12Mi"})
    # The agent (PID 1) writes an upload itself: into /dev/shm, memory charged to the sandbox
    # that nothing can reclaim, beyond the limit, the OOM killer ends the entrypoint and then
    # the agent, the last process left.
    boundary = "fineprint"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"metadata\"; "
            f"filename=\"metadata\"\r\nContent-Type: application/json\r\n\r\n"
            f"{json.dumps({'path': '/dev/shm/big.bin'})}\r\n--{boundary}\r\n"
            f"Content-Disposition: form-data; name=\"file\"; filename=\"blob\"\r\n"
            f"Content-Type: application/octet-stream\r\n\r\n").encode() + \
        b"x" * (12 << 20) + f"\r\n--{boundary}--\r\n".encode()
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=60)
    try:
        conn.request("POST", f"/sandboxes/{sid}/proxy/{AGENT_PORT}/files/upload", body=body,
                     headers={"OPEN-SANDBOX-API-KEY": d.key,
                              "Content-Type": f"multipart/form-data; boundary={boundary}"})
        conn.getresponse().read()
    except OSError:
        pass  # the agent died under it
    conn.close()
    failed = wait_state(d, sid, "Failed")
    assert failed["status"]["reason"] == "oom", failed
    assert "OOM killer" in failed["status"]["message"]
    d.delete(sid)
    message = ended_message(d, sid)
    assert "(oom:" in message and "OOM killer" in message, message
    assert listing(d, "state=Terminated")["items"][0]["status"]["reason"] == "oom"
