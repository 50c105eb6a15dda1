"""The audit trail's record of what agents were asked to do (docs/security.md, "What the audit
trail observes"): each command, code run and file change made through the gateway, by the
OpenSandbox execd routes and by E2B's envd and code interpreter, appears exactly once in
GET /v1/sandboxes/{id}/events with the fields coved saw, and a sandbox printing event-shaped
JSON adds nothing. The whole module is skipped while coved has no events route (404)."""

import base64
import hashlib
import json
import secrets
import struct
import time

import pytest

from covetest import AGENT_PORT

ENVD_PORT = 49983
CI_PORT = 49999


@pytest.fixture(scope="module", autouse=True)
def sid(coved):
    """A sandbox for the module; every test is skipped while coved has no events route."""
    s = coved.create()
    status, _, _ = coved.request("GET", f"/v1/sandboxes/{s}/events")
    if status == 404:
        coved.delete(s)
        pytest.skip("coved has no audit events route (GET /v1/sandboxes/{id}/events)")
    yield s
    coved.delete(s)


def events(coved, sid, kind):
    """Every event of sid whose kind starts with kind, oldest first, all pages."""
    items, cursor = [], None
    for _ in range(100):
        path = f"/v1/sandboxes/{sid}/events?kind={kind}"
        if cursor:
            path += f"&cursor={cursor}"
        body = coved.ok("GET", path)
        items += body["items"]
        cursor = body.get("nextCursor")
        if not cursor:
            return items
    raise AssertionError("too many pages")


def new_events(coved, sid, kind, before, count):
    """The events of kind after the before ones, once there are count of them (events are
    recorded when an exchange ends, which the client may see a moment before coved does)."""
    deadline = time.monotonic() + 10
    while True:
        got = [e for e in events(coved, sid, kind) if e["id"] not in before]
        if len(got) >= count or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def ids(coved, sid, kind):
    return {e["id"] for e in events(coved, sid, kind)}


def proxy(sid, port, path):
    return f"/sandboxes/{sid}/proxy/{port}{path}"


def check_common(e, sid, kind):
    assert e["kind"] == kind, e
    assert e["sandboxId"] == sid, e
    assert e["time"] and e["id"], e


# ---- execd ----

def test_command_start_and_end(coved, sid):
    before = ids(coved, sid, "command.")
    marker = secrets.token_hex(4)
    r = coved.exec(sid, f"echo {marker}; echo err >&2", cwd="/tmp")
    assert marker in r.stdout
    got = new_events(coved, sid, "command.", before, 2)
    assert [e["kind"] for e in got] == ["command.start", "command.end"], got
    start, end = got
    check_common(start, sid, "command.start")
    assert start["api"] == "execd"
    assert start["command"] == f"echo {marker}; echo err >&2"
    assert start["cwd"] == "/tmp" and start["background"] is False and start["status"] == 200
    check_common(end, sid, "command.end")
    assert end["exitCode"] == 0 and end["complete"] is True
    assert end["stdoutBytes"] == len(marker) and end["stderrBytes"] == 3, end
    assert isinstance(end["durationMs"], int) and end["durationMs"] >= 0
    assert end["id"]


def test_failing_command_exit_code(coved, sid):
    before = ids(coved, sid, "command.end")
    coved.request("POST", proxy(sid, AGENT_PORT, "/command"), {"command": "exit 7"})
    got = new_events(coved, sid, "command.end", before, 1)
    assert len(got) == 1 and got[0]["exitCode"] == 7, got


def test_printed_events_add_nothing(coved, sid):
    """Output that looks like the agent's events, or like audit events, is only output."""
    before = {k: ids(coved, sid, k) for k in ("command.", "file.", "code.")}
    fake = ('{"type":"execution_complete"}\\n\\n{"type":"error","error":{"evalue":"99"}}\\n\\n'
            '{"kind":"file.delete","path":"/etc/passwd"}')
    coved.exec(sid, f"printf '{fake}'; printf '\\n\\n'")
    got = new_events(coved, sid, "command.", before["command."], 2)
    assert [e["kind"] for e in got] == ["command.start", "command.end"], got
    assert got[1]["exitCode"] == 0
    assert ids(coved, sid, "file.") == before["file."]
    assert ids(coved, sid, "code.") == before["code."]


def test_file_actions(coved, sid):
    before = ids(coved, sid, "file.")
    boundary = "cove" + secrets.token_hex(4)
    content = b"x" * 1000
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"metadata\"\r\n\r\n"
            + json.dumps({"path": "/tmp/audit/a.txt"})
            + f"\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
              f"filename=\"a.txt\"\r\n\r\n").encode() + content + f"\r\n--{boundary}--\r\n".encode()
    headers = coved.headers()
    headers["Content-Type"] = f"multipart/form-data; boundary={boundary}"
    status, _, _ = coved.request("POST", proxy(sid, AGENT_PORT, "/files/upload"), raw=body,
                                 headers=headers)
    assert status == 200
    status, _, _ = coved.request("POST", proxy(sid, AGENT_PORT, "/files/mv"),
                                 [{"src": "/tmp/audit/a.txt", "dest": "/tmp/audit/b.txt"}])
    assert status == 200
    status, _, _ = coved.request("POST", proxy(sid, AGENT_PORT, "/files/permissions"),
                                 {"/tmp/audit/b.txt": {"mode": 600}})
    assert status == 200
    status, _, _ = coved.request("DELETE", proxy(sid, AGENT_PORT, "/files?path=/tmp/audit/b.txt"))
    assert status == 200
    got = new_events(coved, sid, "file.", before, 4)
    assert [e["kind"] for e in got] == ["file.write", "file.move", "file.chmod", "file.delete"]
    write, move, chmod, delete = got
    assert write["path"] == "/tmp/audit/a.txt" and write["size"] == 1000
    assert move["from"] == "/tmp/audit/a.txt" and move["to"] == "/tmp/audit/b.txt"
    assert chmod["path"] == "/tmp/audit/b.txt" and chmod["mode"] == 600
    assert delete["path"] == "/tmp/audit/b.txt"
    assert all(e["status"] == 200 and e["api"] == "execd" for e in got)


# ---- E2B ----

def envelope(data, flags=0):
    return bytes([flags]) + struct.pack(">I", len(data)) + data


def test_envd_process_start(coved, sid):
    before = ids(coved, sid, "command.")
    start = {"process": {"cmd": "/bin/sh", "args": ["-c", "echo envd; exit 4"], "cwd": "/tmp"}}
    headers = coved.headers()
    headers.update({"Content-Type": "application/connect+json",
                    "Connect-Protocol-Version": "1",
                    "Authorization": "Basic " + base64.b64encode(b"root:").decode()})
    status, _, _ = coved.request("POST", proxy(sid, ENVD_PORT, "/process.Process/Start"),
                                 raw=envelope(json.dumps(start).encode()), headers=headers)
    assert status == 200
    got = new_events(coved, sid, "command.", before, 2)
    assert [e["kind"] for e in got] == ["command.start", "command.end"], got
    assert got[0]["api"] == "envd" and got[0]["argv"] == ["/bin/sh", "-c", "echo envd; exit 4"]
    assert got[0]["cwd"] == "/tmp" and got[0]["user"] == "root"
    assert got[1]["exitCode"] == 4 and got[1]["stdoutBytes"] == 5


def test_envd_upload(coved, sid):
    before = ids(coved, sid, "file.")
    headers = coved.headers()
    headers["Content-Type"] = "application/octet-stream"
    status, _, _ = coved.request("POST", proxy(sid, ENVD_PORT, "/files?path=/tmp/envd.bin"),
                                 raw=b"0123456789", headers=headers)
    assert status == 200
    got = new_events(coved, sid, "file.", before, 1)
    assert len(got) == 1 and got[0]["kind"] == "file.write", got
    assert got[0]["path"] == "/tmp/envd.bin" and got[0]["size"] == 10 and got[0]["api"] == "envd"


@pytest.mark.native_only(reason="code contexts need cove-kernel (test_e2b_code.py)")
def test_code_interpreter_run(coved):
    sid = coved.create(template="code-interpreter")
    try:
        before = ids(coved, sid, "code.")
        code = "print(6 * 7)"
        status, _, _ = coved.request("POST", proxy(sid, CI_PORT, "/execute"),
                                     {"code": code, "language": "python"}, timeout=120)
        assert status == 200
        got = new_events(coved, sid, "code.", before, 1)
        assert len(got) == 1 and got[0]["kind"] == "code.run", got
        run = got[0]
        assert run["codeSha256"] == hashlib.sha256(code.encode()).hexdigest()
        assert run["codeBytes"] == len(code) and run["result"] == "ok"
        assert run["stdoutBytes"] == 3
    finally:
        coved.delete(sid)
