"""The files API runs as the agent, PID 1 of the sandbox: it does not hand out the agent's own
/proc entries (its environment, its memory map), nor those of the helpers it runs, whatever
path, symlink or ".." names them; a user's own processes' /proc entries stay readable. Host,
coved and a second sandbox are checked afterwards."""

import http.client
import json
import time
import urllib.parse

import pytest

from covetest import AGENT_PORT, sandbox_init_pid


def agent_path(sid, path):
    return f"/sandboxes/{sid}/proxy/{AGENT_PORT}{path}"


def call(coved, sid, method, path, body=None):
    return coved.request(method, agent_path(sid, path), body=body)


def download(coved, sid, path):
    conn = http.client.HTTPConnection("127.0.0.1", coved.port, timeout=60)
    h = coved.headers()
    h.pop("Content-Type")
    conn.request("GET", agent_path(sid, "/files/download?" + urllib.parse.urlencode(
        {"path": path})), headers=h)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, data


def check_still_fine(coved, make_sandbox):
    """coved answers and a new sandbox runs commands."""
    coved.health()
    other = make_sandbox()
    assert coved.sh(other, "echo ok") == "ok\n"


# ---- item 10: the files API and the agent's /proc ----

REFUSED = ["/proc/self/maps", "/proc/self/environ", "/proc/1/environ", "/proc/1/maps",
           "/proc/thread-self/status", "/proc/1/task/1/environ", "/proc/self/../1/environ",
           "/tmp/evil/env", "/tmp/evil/self/maps", "/tmp/evil/one/environ",
           "/tmp/evil/thread/status", "/proc/mounts"]


def assert_refused(status, body, path):
    assert status in (400, 403), (path, status, body[:200])
    err = json.loads(body)
    assert err["code"] and err["message"], (path, err)


def test_files_api_refuses_the_agents_own_proc(coved, make_sandbox):
    sid = make_sandbox()
    # Symlinks the sandbox made to the agent's entries, plain (not magic) ones.
    coved.sh(sid, "mkdir -p /tmp/evil && ln -s /proc/1/environ /tmp/evil/env && "
                  "ln -s /proc/self /tmp/evil/self && ln -s /proc/1 /tmp/evil/one && "
                  "ln -s /proc/thread-self /tmp/evil/thread")
    # (the agent's environment as the host sees it; under gVisor the host's PID 1 of the
    # sandbox is runsc's sentry, whose environment is empty: HOSTNAME= is checked instead)
    secret_env = open(f"/proc/{sandbox_init_pid(sid)}/environ", "rb").read() or b"HOSTNAME="
    for path in REFUSED:
        status, body = download(coved, sid, path)
        assert status == 403, (path, status, body[:200])
        assert_refused(status, body, path)
        assert b"HOSTNAME=" not in body and b"cove-agent" not in body, path
    # through a magic link of the agent: refused too (400, magic links are not followed)
    for path in ["/proc/1/root/proc/1/environ", "/proc/self/cwd/proc/1/maps"]:
        status, body = download(coved, sid, path)
        assert_refused(status, body, path)
    # metadata, listing, search, uploads into them
    for method, path, body in [
        ("GET", "/files/info?" + urllib.parse.urlencode({"path": "/proc/1/environ"}), None),
        ("GET", "/files/info?" + urllib.parse.urlencode({"path": "/proc/1"}), None),
        # (info on /tmp/evil/env itself describes the link, which is the sandbox's own file)
        ("GET", "/files/info?" + urllib.parse.urlencode({"path": "/tmp/evil/one/environ"}), None),
        ("GET", "/directories/list?" + urllib.parse.urlencode({"path": "/proc/1"}), None),
        ("GET", "/directories/list?" + urllib.parse.urlencode({"path": "/proc/self/task"}), None),
        ("GET", "/files/search?" + urllib.parse.urlencode({"path": "/proc/1"}), None),
        ("GET", "/files/search?" + urllib.parse.urlencode({"path": "/tmp/evil/one"}), None),
        ("POST", "/files/replace", {"/proc/1/environ": {"old": "a", "new": "b"}}),
        ("POST", "/files/permissions", {"/proc/1/environ": {"mode": 644}}),
    ]:
        status, got, _ = call(coved, sid, method, path, body=body)
        assert status == 403, (path, status, got)
        assert got["code"] and got["message"], (path, got)
    # a write into the agent's /proc (its OOM score) is refused and changes nothing
    agent = sandbox_init_pid(sid)
    score = open(f"/proc/{agent}/oom_score_adj").read()
    boundary = "cove-test-boundary"
    meta = json.dumps({"path": "/proc/1/oom_score_adj"})
    raw = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"metadata\"; "
           f"filename=\"metadata\"\r\nContent-Type: application/json\r\n\r\n{meta}\r\n"
           f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
           f"filename=\"blob\"\r\nContent-Type: application/octet-stream\r\n\r\n1000\r\n"
           f"--{boundary}--\r\n").encode()
    h = coved.headers()
    h["Content-Type"] = f"multipart/form-data; boundary={boundary}"
    status, got, _ = coved.request("POST", agent_path(sid, "/files/upload"), raw=raw, headers=h)
    assert status in (400, 403), (status, got)
    assert open(f"/proc/{agent}/oom_score_adj").read() == score
    # a search of all /proc finds a user's process's entries (so it ran) and none of the agent's
    user = coved.sh(sid, "pidof sleep").split()[0]
    status, found, _ = call(coved, sid, "GET", "/files/search?" + urllib.parse.urlencode(
        {"path": "/proc", "pattern": "cmdline"}))
    assert status == 200, found
    paths = {f["path"] for f in found}
    assert f"/proc/{user}/cmdline" in paths
    assert not [p for p in paths if p.startswith(("/proc/1/", "/proc/self/"))], paths
    # a user's own process reads as before, as ps would
    status, body = download(coved, sid, f"/proc/{user}/status")
    assert status == 200 and b"Name:\tsleep" in body
    status, body = download(coved, sid, f"/proc/{user}/cmdline")
    assert status == 200 and body.startswith(b"sleep")
    assert secret_env not in body
    status, info, _ = call(coved, sid, "GET", "/files/info?" + urllib.parse.urlencode(
        {"path": f"/proc/{user}/status"}))
    assert status == 200, info
    # and what is not a process's: /proc/meminfo
    status, body = download(coved, sid, "/proc/meminfo")
    assert status == 200 and b"MemTotal" in body
    check_still_fine(coved, make_sandbox)


def test_files_api_refuses_the_kernel_helpers_proc(coved, make_sandbox):
    """cove-kernel, the helper the agent runs for code contexts, has the agent's environment:
    its /proc entries are refused as the agent's; the Jupyter kernel it starts runs the user's
    code and stays readable."""
    sid = make_sandbox(template="code-interpreter", limits={"cpu": "1", "memory": "1Gi"})
    deadline = time.time() + 60
    helper = kernel = ""
    while time.time() < deadline:
        # [e] and [i]: the patterns must not match the shell running this very command.
        helper = coved.exec(sid, "pgrep -f -- '--languag[e] python' | head -1").stdout.strip()
        kernel = coved.exec(sid, "pgrep -f '[i]pykernel' | head -1").stdout.strip()
        if helper and kernel:
            break
        time.sleep(0.5)
    if not helper:
        pytest.skip("no kernel helper in this sandbox (no cove-kernel or no python kernel)")
    for path in [f"/proc/{helper}/environ", f"/proc/{helper}/maps", f"/proc/{helper}/status"]:
        status, body = download(coved, sid, path)
        assert status == 403, (path, status, body[:200])
        assert_refused(status, body, path)
    if kernel and kernel != helper:
        status, body = download(coved, sid, f"/proc/{kernel}/status")
        assert status == 200 and b"Name:" in body
    check_still_fine(coved, make_sandbox)
