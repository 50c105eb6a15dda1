"""Lifecycle through the API: create, get, list, pause, resume, delete, daemon restarts."""

import os
import signal
import time

from covetest import sandbox_host_pids, sandbox_init_pid, sandbox_leftovers

RUNTIME = os.environ.get("COVE_TEST_RUNTIME", "native")


def gvisor_sentry_pid(sid):
    """Host pid of the sentry (`runsc boot`) of a gVisor sandbox, or None."""
    for pid in sandbox_host_pids(sid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"\0boot\0" in f.read():
                    return pid
        except OSError:
            pass
    return None


def test_create_returns_spec_shape(coved):
    status, body, resp = coved.request("POST", "/v1/sandboxes", {
        "image": {"uri": "base"}, "entrypoint": ["sleep", "infinity"],
        "env": {"GREETING": "hello there"}, "metadata": {"team": "ml"},
        "resourceLimits": {"cpu": "500m", "memory": "256Mi"}, "timeout": 3600})
    assert status == 202, body
    sid = body["id"]
    try:
        assert resp.getheader("Location") == f"/v1/sandboxes/{sid}"
        assert resp.getheader("X-Request-ID")
        assert body["status"]["state"] == "Running"
        assert body["metadata"] == {"team": "ml"}
        assert body["entrypoint"] == ["sleep", "infinity"]
        assert body["expiresAt"] and body["createdAt"]
        full = coved.get(sid)
        assert full["image"] == {"uri": "base"}
        assert full["status"]["lastTransitionAt"]
        # the env reaches commands, the hostname is the id
        out = coved.sh(sid, 'echo "$GREETING"; hostname')
        assert out == f"hello there\n{sid}\n"
    finally:
        coved.delete(sid)
    status, body, _ = coved.request("GET", f"/v1/sandboxes/{sid}")
    assert status == 404


def test_request_id_is_echoed(coved):
    _, _, resp = coved.request("GET", "/health", headers={"X-Request-ID": "abc-123"})
    assert resp.getheader("X-Request-ID") == "abc-123"


def test_list_filters_by_state_and_metadata(coved):
    a = coved.create(metadata={"project": "apollo", "note": "demo-test"})
    b = coved.create(metadata={"project": "apollo"})
    c = coved.create(metadata={"project": "gemini"})
    try:
        coved.pause(b)
        ids = lambda q: {s["id"] for s in coved.ok("GET", "/v1/sandboxes" + q)["items"]}
        assert {a, b, c} <= ids("")
        assert ids("?metadata=project%3Dapollo") == {a, b}
        assert ids("?metadata=project%3Dapollo%26note%3Ddemo-test") == {a}
        assert ids("?state=Paused") == {b}
        assert ids("?state=Running&state=Paused&metadata=project%3Dapollo") == {a, b}
        page = coved.ok("GET", "/v1/sandboxes?pageSize=2&page=1")
        assert len(page["items"]) == 2 and page["pagination"]["hasNextPage"]
        assert page["pagination"]["totalItems"] >= 3
    finally:
        for s in (a, b, c):
            coved.delete(s)


def test_delete_removes_everything(coved):
    sid = coved.create()
    coved.sh(sid, "sleep 1000 >/dev/null 2>&1 & echo started")
    coved.delete(sid)
    assert sandbox_leftovers(coved, sid) == []


def test_paused_sandbox_can_be_deleted(coved):
    sid = coved.create()
    coved.pause(sid)
    coved.delete(sid)
    assert sandbox_leftovers(coved, sid) == []


def test_sandboxes_survive_daemon_kill(fresh_coved):
    d = fresh_coved.start()
    running = [d.create() for _ in range(6)]
    paused = [d.create() for _ in range(4)]
    for sid in running + paused:
        d.sh(sid, "echo kept > /tmp/marker")
    for sid in paused:
        d.pause(sid)
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait(10)
    d.start()
    states = {s["id"]: s["status"]["state"] for s in d.ok("GET", "/v1/sandboxes")["items"]}
    for sid in running:
        assert states[sid] == "Running"
        assert d.sh(sid, "cat /tmp/marker") == "kept\n"
    for sid in paused:
        assert states[sid] == "Paused"
        d.resume(sid)
        assert d.sh(sid, "cat /tmp/marker") == "kept\n"
    for sid in running + paused:
        d.delete(sid)
        assert sandbox_leftovers(d, sid) == []


def test_sandbox_whose_processes_died_is_failed_after_restart(fresh_coved):
    d = fresh_coved.start()
    sid = d.create()
    pid = int(open(os.path.join("/sys/fs/cgroup/pids/cove", sid, "cgroup.procs")).read().split()[0]) \
        if os.path.isdir("/sys/fs/cgroup/pids/cove") else None
    d.kill(signal.SIGKILL)
    if pid is None:  # cgroup v2 host
        pid = int(open(f"/sys/fs/cgroup/cove/{sid}/cgroup.procs").read().split()[0])
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    d.start()
    body = d.get(sid)
    assert body["status"]["state"] == "Failed"
    assert body["status"]["message"]
    assert sandbox_leftovers(d, sid) == []


def test_agent_crash_marks_sandbox_failed(coved):
    sid = coved.create()
    # The sandbox's PID 1 (the agent; under an OCI runtime not coved's child but its shim's),
    # or for gVisor the sentry that runs it.
    pid = sandbox_init_pid(sid) if RUNTIME != "gvisor" else gvisor_sentry_pid(sid)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    for _ in range(100):
        if coved.get(sid)["status"]["state"] == "Failed":
            break
        time.sleep(0.05)
    assert coved.get(sid)["status"]["state"] == "Failed"
    status, body, _ = coved.request("POST", f"/sandboxes/{sid}/proxy/44772/command",
                                    {"command": "true"})
    # The gateway says why: what ended the sandbox, not advice to resume it.
    assert status == 409 and "killed by signal 9" in body["message"], body
    assert "resume" not in body["message"]
    coved.delete(sid)


def test_entrypoint_output_is_kept_in_the_sandbox(coved):
    sid = coved.create(entrypoint=["sh", "-c", "echo from-entrypoint; echo oops >&2; sleep 1000"])
    try:
        logs = ""
        for _ in range(50):
            status, logs, _ = coved.request(
                "GET", f"/sandboxes/{sid}/proxy/44772/command/entrypoint/logs")
            if "oops" in str(logs):
                break
            time.sleep(0.05)
        assert status == 200
        assert "from-entrypoint" in logs and "oops" in logs
        st = coved.ok("GET", f"/sandboxes/{sid}/proxy/44772/command/status/entrypoint")
        assert st["running"] is True
        # nothing of it reached the host's side of the sandbox
        log = os.path.join(coved.run_dir(sid), "agent.log")
        assert "from-entrypoint" not in (open(log).read() if os.path.exists(log) else "")
    finally:
        coved.delete(sid)


def test_agent_log_reaches_coved_log_and_no_host_file(coved):
    sid = coved.create(entrypoint=["sh", "-c", "sleep 1000"])
    try:
        coved.sh(sid, "true")
        for _ in range(50):
            if f"sandbox {sid} agent:" in coved.log():
                break
            time.sleep(0.05)
        assert f"sandbox {sid} agent:" in coved.log()
        # the agent writes into a pipe coved reads with a budget, never into a host file
        assert os.listdir(coved.run_dir(sid)) == ["agent.sock"] or \
            "agent.log" not in os.listdir(coved.run_dir(sid))
    finally:
        coved.delete(sid)
