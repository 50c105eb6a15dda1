"""Isolated sessions (OSEP-0013, /v1/isolated/* on a sandbox's execd endpoint): each session
its own mount namespace (the workspace an overlay, read-only, or as it is; a private /tmp) and
pid namespace inside the sandbox. Runs stream as /command does and keep state between runs;
sessions do not see each other's files, /tmp or processes; strict hides secrets from the
environment; uid/gid apply; files routes work on the session's view; sessions end on DELETE,
when idle, with their sandbox and with coved; bad requests are 4xx and change nothing."""

import http.client
import io
import json
import os
import tarfile
import time

import pytest

from covetest import AGENT_PORT, ExecResult, parse_events, sandbox_leftovers, serve


def base(sid):
    return f"/sandboxes/{sid}/proxy/{AGENT_PORT}/v1/isolated"


def create(d, sid, expect=201, **body):
    body.setdefault("workspace", {"path": "/workspace"})
    status, resp, _ = d.request("POST", base(sid) + "/session", body)
    assert status == expect, resp
    return resp


def run(d, sid, session, code, expect=200, **extra):
    body = {"code": code, **extra}
    status, raw, _ = d.request("POST", f"{base(sid)}/session/{session}/run", body, timeout=120)
    assert status == expect, raw
    if status != 200:
        return raw
    return ExecResult(parse_events(raw if isinstance(raw, str) else json.dumps(raw)))


def out(d, sid, session, code, **extra):
    r = run(d, sid, session, code, **extra)
    assert r.exit_code == 0, (code, r.stdout, r.stderr)
    return r.stdout.strip()


def sh(d, sid, command):
    return d.sh(sid, command).strip()


def test_capabilities(coved):
    sid = coved.create()
    status, caps, _ = coved.request("GET", base(sid) + "/capabilities")
    assert status == 200 and caps["available"] is True
    assert caps["commit_supported"] is True and caps["diff_supported"] is True
    assert caps["setpriv_available"] is True and caps["userns_available"] is False
    coved.delete(sid)


@pytest.mark.native_only(reason="isolated sessions are refused (409 ISOLATED::NOT_SUPPORTED) by the oci and gvisor runtimes today")
def test_overlay_session_keeps_state_and_leaves_the_sandbox_alone(coved):
    sid = coved.create()
    coved.sh(sid, "mkdir -p /workspace && echo original > /workspace/kept.txt")
    s = create(coved, sid, profile="strict")
    assert set(s) >= {"session_id", "created_at"}
    assert s["isolation"] == {"profile": "strict",
                              "workspace": {"path": "/workspace", "mode": "overlay"}}
    a = s["session_id"]
    r = run(coved, sid, a, "echo hi > /workspace/a.txt; cat /workspace/a.txt /workspace/kept.txt; "
                           "rm /workspace/kept.txt; echo t > /tmp/mine")
    assert r.exit_code == 0 and r.stdout == "hi\noriginal\n", r.stderr
    types = [e["type"] for e in r.events]
    assert types[0] == "init" and types[-1] == "execution_complete"
    # State between runs of one session.
    assert out(coved, sid, a, "cat /workspace/a.txt /tmp/mine; ls /workspace") == "hi\nt\na.txt"
    # The sandbox itself: its workspace and /tmp untouched.
    assert sh(coved, sid, "ls /workspace; cat /workspace/kept.txt; ls /tmp") == \
        "kept.txt\noriginal"
    # Another session: neither the first's files nor its /tmp nor its processes.
    b = create(coved, sid)["session_id"]
    assert out(coved, sid, b, "ls /workspace; ls /tmp | wc -l") == "kept.txt\n0"
    procs = out(coved, sid, b, "ps -e -o pid=,comm=").split("\n")
    comms = [p.split()[1] for p in procs]
    assert "sleep" not in comms and comms[0].startswith("cove-agent"), procs  # its own PID 1
    assert procs[0].split()[0] == "1"
    # The sandbox sees its sessions' processes (they are in its pid namespace, below).
    assert int(sh(coved, sid, "ps -e -o comm= | grep -c cove-agent")) >= 3
    listed = coved.ok("GET", base(sid) + "/sessions")["sessions"]
    assert {x["session_id"] for x in listed} == {a, b}
    assert all(x["status"] == "active" for x in listed)
    state = coved.ok("GET", f"{base(sid)}/session/{a}")
    assert state["status"] == "active" and state["workspace"]["mode"] == "overlay"
    assert state["idle_timeout_seconds"] == 1800 and 0 < state["idle_remaining_seconds"] <= 1800
    for x in (a, b):
        status, _, _ = coved.request("DELETE", f"{base(sid)}/session/{x}")
        assert status == 200
    status, body, _ = coved.request("GET", f"{base(sid)}/session/{a}")
    assert status == 404 and body["code"] == "SESSION_NOT_FOUND"
    status, body, _ = coved.request("POST", f"{base(sid)}/session/{a}/run", {"code": "true"})
    assert status == 404
    deadline = time.time() + 10
    while time.time() < deadline and int(sh(coved, sid, "ps -e -o comm= | grep -c cove-agent")) > 1:
        time.sleep(0.1)
    assert sh(coved, sid, "ps -e -o comm= | grep -c cove-agent") == "1"  # the sandbox's own
    coved.delete(sid)


@pytest.mark.native_only(reason="isolated sessions are refused (409 ISOLATED::NOT_SUPPORTED) by the oci and gvisor runtimes today")
def test_rw_and_ro_workspaces(coved):
    sid = coved.create()
    rw = create(coved, sid, profile="balanced")
    assert rw["isolation"]["workspace"]["mode"] == "rw" and rw["artifacts"] is None
    out(coved, sid, rw["session_id"], "echo through > /workspace/rw.txt; echo shared > /tmp/b")
    assert sh(coved, sid, "cat /workspace/rw.txt /tmp/b") == "through\nshared"  # balanced: /tmp too
    ro = create(coved, sid, workspace={"path": "/workspace", "mode": "ro"})["session_id"]
    assert out(coved, sid, ro, "cat /workspace/rw.txt") == "through"
    r = run(coved, sid, ro, "echo no > /workspace/x")
    assert r.exit_code != 0 and "Read-only file system" in r.stderr
    # Root inside cannot make it writable again.
    r = run(coved, sid, ro, "mount -o remount,rw /workspace || umount /workspace; "
                            "echo no > /workspace/x")
    assert r.exit_code != 0
    assert sh(coved, sid, "test -e /workspace/x && echo yes || echo no") == "no"
    coved.delete(sid)


@pytest.mark.native_only(reason="isolated sessions are refused (409 ISOLATED::NOT_SUPPORTED) by the oci and gvisor runtimes today")
def test_identity_environment_and_network(coved):
    sid = coved.create(env={"OPENAI_API_KEY": "sk-secret", "VISIBLE": "yes", "AWS_REGION": "x"})
    strict = create(coved, sid, uid=1000, gid=1000)["session_id"]
    assert out(coved, sid, strict, "id -u; id -g") == "1000\n1000"
    env = out(coved, sid, strict, "env")
    assert "VISIBLE=yes" in env and "sk-secret" not in env and "AWS_REGION" not in env
    assert "PATH=" in env
    # The workspace root is the sandbox root's, so user 1000 may write only where allowed.
    out(coved, sid, strict, "mkdir -p /tmp/u && echo mine > /tmp/u/f && stat -c %u /tmp/u/f")
    allow = create(coved, sid, env_passthrough={"mode": "allow", "keys": ["VISIBLE"]})
    env = out(coved, sid, allow["session_id"], "env").split("\n")
    keys = {e.split("=", 1)[0] for e in env}
    assert "VISIBLE" in keys and "OPENAI_API_KEY" not in keys and keys <= {
        "VISIBLE", "PATH", "HOME", "LANG", "PWD", "SHLVL", "_"}, keys
    balanced = create(coved, sid, profile="balanced")["session_id"]
    assert "sk-secret" in out(coved, sid, balanced, "env")  # balanced passes everything
    # envs of a run win.
    assert out(coved, sid, strict, "echo $VISIBLE", envs={"VISIBLE": "run"}) == "run"
    # Network: the sandbox's by default; with share_net false only lo, no route at all.
    shared = out(coved, sid, strict, "tail -n +2 /proc/net/route | wc -l")
    alone = create(coved, sid, share_net=False)["session_id"]
    assert out(coved, sid, alone, "tail -n +2 /proc/net/route | wc -l") == "0"
    assert shared != "0"
    coved.delete(sid)


@pytest.mark.native_only(reason="isolated sessions are refused (409 ISOLATED::NOT_SUPPORTED) by the oci and gvisor runtimes today")
def test_session_files_routes(coved):
    sid = coved.create()
    coved.sh(sid, "mkdir -p /workspace && echo before > /workspace/old.txt")
    s = create(coved, sid, uid=1000, gid=1000)["session_id"]
    files = f"{base(sid)}/session/{s}"
    status, info, _ = coved.request("GET", f"{files}/files/info?path=/workspace/old.txt")
    assert status == 200 and info["/workspace/old.txt"]["size"] == 7
    # Upload through the session: in its view (owned by its uid), not the sandbox's.
    boundary = "cove-iso"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"metadata\"; "
            f"filename=\"metadata\"\r\nContent-Type: application/json\r\n\r\n"
            f"{json.dumps({'path': '/workspace/up.txt'})}\r\n--{boundary}\r\n"
            f"Content-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n"
            f"Content-Type: application/octet-stream\r\n\r\nuploaded\r\n--{boundary}--\r\n")
    h = coved.headers()
    h["Content-Type"] = f"multipart/form-data; boundary={boundary}"
    status, resp, _ = coved.request("POST", f"{files}/files/upload", raw=body.encode(), headers=h)
    assert status == 200, resp
    assert out(coved, sid, s, "cat /workspace/up.txt; echo; stat -c %u /workspace/up.txt") == \
        "uploaded\n1000"
    status, listing, _ = coved.request("GET", f"{files}/directories/list?path=/workspace")
    assert status == 200 and {e["path"].rsplit("/", 1)[-1] for e in listing} >= {"old.txt",
                                                                                  "up.txt"}
    status, _, _ = coved.request("DELETE", f"{files}/files?path=/workspace/old.txt")
    assert status == 200
    assert out(coved, sid, s, "ls /workspace") == "up.txt"
    assert sh(coved, sid, "ls /workspace; cat /workspace/old.txt") == "old.txt\nbefore"
    status, _, _ = coved.request("GET", f"{files}/files/download?path=/workspace/up.txt")
    assert status == 200
    # Not a route of the session's agent, nor of coved's: 404.
    status, _, _ = coved.request("GET", f"{files}/ping")
    assert status == 404
    coved.delete(sid)


def diff_of(coved, sid, session):
    conn = http.client.HTTPConnection("127.0.0.1", coved.port, timeout=60)
    conn.request("GET", f"{base(sid)}/session/{session}/diff", headers=coved.headers())
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    assert resp.status == 200, data[:300]
    assert resp.getheader("Content-Type") == "application/gzip"
    return tarfile.open(fileobj=io.BytesIO(data), mode="r:gz")


@pytest.mark.native_only(reason="isolated sessions are refused (409 ISOLATED::NOT_SUPPORTED) by the oci and gvisor runtimes today")
def test_diff_and_commit(coved):
    sid = coved.create()
    coved.sh(sid, "mkdir -p /workspace/keep /workspace/replace && echo a > /workspace/keep/a && "
                  "echo gone > /workspace/gone.txt && echo old > /workspace/replace/old && "
                  "echo same > /workspace/same.txt")
    s = create(coved, sid)["session_id"]
    out(coved, sid, s, "echo new > /workspace/new.txt && echo more >> /workspace/keep/a && "
                       "rm /workspace/gone.txt && rm -rf /workspace/replace && "
                       "mkdir /workspace/replace && echo fresh > /workspace/replace/fresh && "
                       "ln -s /etc/passwd /workspace/link && mkdir -p /workspace/d/e && "
                       "head -c 3000000 /dev/urandom > /workspace/d/e/blob && echo ok")
    t = diff_of(coved, sid, s)
    members = {m.name.lstrip("./").rstrip("/"): m for m in t.getmembers()}
    assert {"new.txt", "keep/a", "gone.txt", "replace", "replace/fresh", "link",
            "d/e/blob"} <= set(members), sorted(members)
    assert "same.txt" not in members and "keep/../same.txt" not in members
    assert t.extractfile(members["new.txt"]).read() == b"new\n"
    assert members["gone.txt"].ischr() and members["gone.txt"].devmajor == 0  # a whiteout
    assert members["link"].issym() and members["link"].linkname == "/etc/passwd"
    assert members["replace"].pax_headers.get("SCHILY.xattr.trusted.overlay.opaque") == "y"
    assert members["d/e/blob"].size == 3000000
    # The sandbox has none of it before the commit...
    assert sh(coved, sid, "ls /workspace | sort | tr '\\n' ' '") == "gone.txt keep replace same.txt"
    status, body, _ = coved.request("POST", f"{base(sid)}/session/{s}/commit", timeout=120)
    assert status == 200 and body["status"] == "committed", body
    assert body["removed"] >= 2 and body["files"] >= 4
    # ...and after it, what the session saw.
    assert sh(coved, sid, "cd /workspace && ls | sort | tr '\\n' ' '; cat keep/a new.txt; "
                          "ls replace; readlink link; stat -c %s d/e/blob") == \
        "d keep link new.txt replace same.txt a\nmore\nnew\nfresh\n/etc/passwd\n3000000"
    assert out(coved, sid, s, "ls /workspace | wc -l") == "6"  # the session's view unchanged
    # Options are refused, and a non-overlay session has nothing to diff or commit.
    status, _, _ = coved.request("POST", f"{base(sid)}/session/{s}/commit",
                                 {"reset_upper_after": True})
    assert status == 400
    rw = create(coved, sid, profile="balanced")["session_id"]
    for method, tail in [("GET", "diff"), ("POST", "commit")]:
        status, body, _ = coved.request(method, f"{base(sid)}/session/{rw}/{tail}")
        assert status == 400 and body["code"] == "NO_DIFF", body
    coved.delete(sid)


BAD = [
    ({"workspace": {"path": "relative"}}, 400),
    ({"workspace": {"path": "/"}}, 400),
    ({"workspace": {"path": "/a/../b"}}, 400),
    ({"workspace": {"path": "/proc/x"}}, 400),
    ({"workspace": {"path": "/w", "mode": "bogus"}}, 400),
    ({"workspace": "/w"}, 400),
    ({}, 400),
    ({"workspace": {"path": "/w"}, "profile": "lax"}, 400),
    ({"workspace": {"path": "/w"}, "extra_writable": ["/data"]}, 400),
    ({"workspace": {"path": "/w"}, "binds": [{"source": "/etc"}]}, 400),
    ({"workspace": {"path": "/w"}, "uid": -1}, 400),
    ({"workspace": {"path": "/w"}, "uid": 70000}, 400),
    ({"workspace": {"path": "/w"}, "gid": 5}, 400),
    ({"workspace": {"path": "/w"}, "share_net": "no"}, 400),
    ({"workspace": {"path": "/w"}, "idle_timeout_seconds": -1}, 400),
    ({"workspace": {"path": "/w"}, "env_passthrough": {"mode": "some"}}, 400),
    ({"workspace": {"path": "/w"}, "uid_mode": "userns"}, 503),
    ({"workspace": {"path": "/w"}, "colour": "red"}, 400),
]


@pytest.mark.native_only(reason="isolated sessions are refused (409 ISOLATED::NOT_SUPPORTED) by the oci and gvisor runtimes today")
def test_bad_requests_change_nothing(coved):
    sid = coved.create()
    for body, want in BAD:
        status, resp, _ = coved.request("POST", base(sid) + "/session", body)
        assert status == want and set(resp) >= {"code", "message"}, (body, status, resp)
    status, resp, _ = coved.request("POST", base(sid) + "/session", raw=b"{nope")
    assert status == 400
    assert coved.ok("GET", base(sid) + "/sessions")["sessions"] == []
    assert sh(coved, sid, "test -e /w && echo yes || echo no") == "no"
    s = create(coved, sid)["session_id"]
    for code in [None, 5, ""]:
        status, _, _ = coved.request("POST", f"{base(sid)}/session/{s}/run",
                                     {} if code is None else {"code": code})
        assert status == 400, code
    for path in ["/session/not-a-uuid", "/session/00000000-0000-0000-0000-000000000000",
                 "/session/00000000-0000-0000-0000-000000000000/run", "/nothing"]:
        status, _, _ = coved.request("GET", base(sid) + path)
        assert status == 404, path
    # A symlinked workspace is refused, never followed.
    coved.sh(sid, "ln -s /etc /linked")
    status, resp, _ = coved.request("POST", base(sid) + "/session",
                                    {"workspace": {"path": "/linked"}})
    assert status >= 400 and "symbolic" in resp["message"], resp
    # Another key cannot reach the sessions (the gateway's own check).
    status, _, _ = coved.request("GET", base(sid) + "/sessions",
                                 headers={"OPEN-SANDBOX-API-KEY": "wrong"})
    assert status == 401
    coved.delete(sid)


@pytest.mark.native_only(reason="isolated sessions are refused (409 ISOLATED::NOT_SUPPORTED) by the oci and gvisor runtimes today")
def test_run_timeout_and_idle_timeout(coved):
    sid = coved.create()
    s = create(coved, sid, idle_timeout_seconds=2)["session_id"]
    r = run(coved, sid, s, "sleep 30", timeout_seconds=1)
    assert r.exit_code != 0
    # Idle past its timeout: gone within a GC tick (10 s).
    deadline = time.time() + 30
    while time.time() < deadline:
        status, _, _ = coved.request("GET", f"{base(sid)}/session/{s}")
        if status == 404:
            break
        time.sleep(0.5)
    assert status == 404
    coved.delete(sid)


@pytest.mark.native_only(reason="isolated sessions are refused (409 ISOLATED::NOT_SUPPORTED) by the oci and gvisor runtimes today")
def test_sessions_end_with_their_sandbox(coved):
    sid = coved.create()
    s = create(coved, sid)["session_id"]
    out(coved, sid, s, "(sleep 1000 &) ; echo started")
    coved.delete(sid)
    assert sandbox_leftovers(coved, sid) == []
    status, _, _ = coved.request("GET", f"{base(sid)}/session/{s}")
    assert status == 404


@pytest.mark.native_only(reason="isolated sessions are refused (409 ISOLATED::NOT_SUPPORTED) by the oci and gvisor runtimes today")
def test_sessions_end_with_coved(fresh_coved):
    d = fresh_coved.start()
    sid = d.create()
    s = create(d, sid)["session_id"]
    out(d, sid, s, "(sleep 1000 &) ; echo started")
    assert int(sh(d, sid, "ps -e -o comm= | grep -c cove-agent")) == 2
    d.kill()
    d.start()
    status, _, _ = d.request("GET", f"{base(sid)}/session/{s}")
    assert status == 404
    deadline = time.time() + 10
    while time.time() < deadline and sh(d, sid, "ps -e -o comm= | grep -c 'cove-agent\\|sleep'") != "2":
        time.sleep(0.1)
    # Left: the sandbox's agent and its entrypoint (sleep); the session's are gone.
    assert sh(d, sid, "ps -e -o comm= | grep -c 'cove-agent\\|sleep'") == "2"
    d.delete(sid)
