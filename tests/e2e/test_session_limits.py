"""Limits on the sessions a client opens and may forget (issue 8, item 13): bash sessions
(/session) and PTY sessions (/pty) nobody uses for the idle timeout (coved
--session-idle-timeout, passed to every agent) are closed and what they run is killed; one in
use (a run under way, a client attached, requests coming) stays. A sandbox holds at most 64 of
each; one more is a 429 with a body that says why."""

import os
import subprocess
import time

import pytest

from covetest import COVED, Coved, serve
from test_sessions_pty_metrics import WebSocket, call, new_pty, new_session, run

IDLE_SECONDS = 2
CAP = 64  # the agent's default


@pytest.fixture(scope="module")
def idle_coved():
    with serve("--session-idle-timeout", str(IDLE_SECONDS)) as d:
        yield d


@pytest.fixture
def idle_sandbox(idle_coved):
    sid = idle_coved.create()
    yield sid
    try:
        idle_coved.delete(sid)
    except Exception:
        pass


def test_idle_sessions_and_ptys_are_closed_with_their_processes(idle_coved, idle_sandbox):
    coved, sid = idle_coved, idle_sandbox
    s = new_session(coved, sid)
    assert run(coved, sid, s, "cd /tmp && export MARK=1").exit_code == 0
    # a PTY whose shell runs a job, then its client leaves: the shell goes on, unattended
    p = new_pty(coved, sid)
    ws = WebSocket(coved, sid, f"/pty/{p}/ws")
    assert ws.status == 101
    ws.json()  # connected
    ws.type("sleep 7771 & echo started-$((1+1))\r")
    ws.read_until(b"started-2")
    ws.close()
    assert coved.sh(sid, "pgrep -f 'sleep [7]771' >/dev/null && echo running") == "running\n"

    # Requests about a session are use of it: wait on the sandbox's processes, not on them.
    deadline = time.time() + 30
    while coved.exec(sid, "pgrep -f 'sleep [7]771'").exit_code == 0 and time.time() < deadline:
        time.sleep(0.25)
    assert coved.exec(sid, "pgrep -f 'sleep [7]771'").exit_code != 0, "the PTY's job still runs"
    time.sleep(IDLE_SECONDS)  # the bash session, made first, is closed by the same tick or one
    status, body, _ = call(coved, sid, "GET", f"/pty/{p}")
    assert status == 404 and body["code"] == "CONTEXT_NOT_FOUND" and body["message"], body
    status, body, _ = call(coved, sid, "POST", f"/session/{s}/run", body={"command": "true"})
    assert status == 404 and body["code"] == "CONTEXT_NOT_FOUND", (status, body)
    status, body, _ = call(coved, sid, "DELETE", f"/session/{s}")
    assert status == 404, body
    # closing them did not break anything: new ones work
    s2 = new_session(coved, sid)
    assert run(coved, sid, s2, "echo fresh").stdout == "fresh\n"


def test_sessions_in_use_stay(idle_coved, idle_sandbox):
    coved, sid = idle_coved, idle_sandbox
    # a run longer than the timeout, its client attached all along
    long = new_session(coved, sid)
    r = run(coved, sid, long, f"sleep {IDLE_SECONDS * 2}; echo slept")
    assert r.exit_code == 0 and r.stdout == "slept\n"
    assert run(coved, sid, long, "echo still").stdout == "still\n"
    # a session used more often than the timeout
    busy = new_session(coved, sid)
    # a PTY with its client attached
    p = new_pty(coved, sid)
    ws = WebSocket(coved, sid, f"/pty/{p}/ws")
    ws.json()
    # a PTY asked about (GET) more often than the timeout
    polled = new_pty(coved, sid)
    end = time.time() + IDLE_SECONDS * 3
    while time.time() < end:
        assert run(coved, sid, busy, "true").exit_code == 0
        status, body, _ = call(coved, sid, "GET", f"/pty/{polled}")
        assert status == 200, body
        time.sleep(IDLE_SECONDS / 4)
    ws.type("echo attached-$((2+3))\r")
    ws.read_until(b"attached-5")
    status, body, _ = call(coved, sid, "GET", f"/pty/{p}")
    assert status == 200 and body["running"] is True
    ws.close()


def test_time_paused_is_not_idle_time(idle_coved, idle_sandbox):
    """A sandbox paused for longer than the timeout keeps its sessions: the agent could not
    run meanwhile, so nobody could have used them."""
    coved, sid = idle_coved, idle_sandbox
    s = new_session(coved, sid)
    p = new_pty(coved, sid)
    coved.pause(sid)
    assert coved.get(sid)["status"]["state"] == "Paused"
    time.sleep(IDLE_SECONDS * 3)
    coved.resume(sid)
    assert coved.get(sid)["status"]["state"] == "Running"
    assert run(coved, sid, s, "echo kept").stdout == "kept\n"
    status, body, _ = call(coved, sid, "GET", f"/pty/{p}")
    assert status == 200, body


def test_session_cap_is_a_clear_429(coved, sandbox):
    """The module's default daemon: the agent's default timeout (30 min) and cap (64)."""
    sessions = [new_session(coved, sandbox) for _ in range(CAP)]
    status, body, _ = call(coved, sandbox, "POST", "/session", body={})
    assert status == 429, body
    assert body["code"] == "SESSION_LIMIT_REACHED" and "64" in body["message"], body
    ptys = [new_pty(coved, sandbox) for _ in range(CAP)]
    status, body, _ = call(coved, sandbox, "POST", "/pty", body={})
    assert status == 429, body
    assert body["code"] == "SESSION_LIMIT_REACHED" and "64" in body["message"], body
    # the ones open still work, and deleting one makes room for another
    assert run(coved, sandbox, sessions[0], "echo ok").stdout == "ok\n"
    status, _, _ = call(coved, sandbox, "DELETE", f"/session/{sessions[0]}")
    assert status == 200
    s = new_session(coved, sandbox)
    assert run(coved, sandbox, s, "echo again").stdout == "again\n"
    status, _, _ = call(coved, sandbox, "DELETE", f"/pty/{ptys[0]}")
    assert status == 200
    new_pty(coved, sandbox)
    coved.health()


def agent_argv(d, sid):
    # from inside: the host's PID 1 of a gVisor sandbox is runsc's sentry, not the agent
    return d.sh(sid, "tr '\\0' '\\n' < /proc/1/cmdline").split("\n")


def test_idle_timeout_setting_from_file_environment_and_flag(tmp_path):
    """session_idle_timeout_seconds follows coved's order (INI < environment < flag) down to
    every agent's command line; without it the agent keeps its default; a bad value refuses
    to start."""
    ini = tmp_path / "coved.ini"
    ini.write_text("[server]\nsession_idle_timeout_seconds = 111\n")
    for env, flag, expected in [({}, [], None), ({"COVE_CONFIG": str(ini)}, [], "111"),
                                ({"COVE_CONFIG": str(ini), "COVE_SESSION_IDLE_TIMEOUT": "222"},
                                 [], "222"),
                                ({"COVE_SESSION_IDLE_TIMEOUT": "222"},
                                 ["--session-idle-timeout", "0"], "0")]:
        d = Coved(extra_args=flag, env=dict(os.environ, **env))
        try:
            d.start()
            sid = d.create()
            argv = agent_argv(d, sid)
            if expected is None:
                assert "--session-idle-timeout" not in argv, argv
            else:
                i = argv.index("--session-idle-timeout")
                assert argv[i + 1] == expected, argv
            d.delete(sid)
        finally:
            d.cleanup()
    for bad in ("-1", "ten", ""):
        r = subprocess.run([COVED, "--session-idle-timeout", bad, "--api-key", "k",
                            "--state-dir", str(tmp_path / "s")],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and "session_idle_timeout_seconds" in r.stderr, (bad, r.stderr)
