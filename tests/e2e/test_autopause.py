"""Lifecycle beyond a timeout's kill (sandbox.h, docs/api.md "Lifecycle extensions"): E2B's
autoPause and OpenSandbox's extensions.onTimeout pause a sandbox at its timeout, memory kept,
for coved's --paused-retention, and a restart keeps it so; autoResume (and every sandbox under
--resume-on-access) is resumed by traffic that needs it running; extensions.idleTimeoutSeconds
pauses a sandbox nobody and nothing uses, and not one whose processes work. Every wait is a
bounded poll for what a client sees."""

import datetime
import subprocess
import time

import pytest

from covetest import COVED, ApiError, sandbox_leftovers, serve

KEY = "test-key"
WAIT_S = 60  # the most any state change below may take; they take about a second


def iso(ts):
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def parse(text):
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def e2b(d, method, path, body=None):
    return d.request(method, "/e2b" + path, body,
                     headers={"Content-Type": "application/json", "X-API-Key": KEY})


def e2b_create(d, **fields):
    body = {"templateID": "base"}
    body.update(fields)
    status, sb, _ = e2b(d, "POST", "/sandboxes", body)
    assert status == 201, sb
    return sb["sandboxID"]


def set_timeout(d, sid, seconds):
    """E2B's setSandboxTimeout: the sandbox times out seconds from now (and a resume out of
    its retention sets that timeout again)."""
    status, body, _ = e2b(d, "POST", f"/sandboxes/{sid}/timeout", {"timeout": seconds})
    assert status == 204, body


def wait_for(what, probe):
    """Polls probe() until it returns something true (returned), for at most WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while True:
        got = probe()
        if got:
            return got
        assert time.monotonic() < deadline, f"still not {what}"
        time.sleep(0.1)


def state_of(d, sid):
    return d.get(sid)["status"]["state"]


def wait_state(d, sid, state):
    return wait_for(f"{state}: {sid}", lambda: (b := d.get(sid))["status"]["state"] == state
                    and b)


def start_sleeper(d, sid):
    """A process that only sleeps, and a file in /dev/shm (memory): both outlive a pause only
    if the sandbox's memory does. Returns the sleeper's pid."""
    out = d.sh(sid, "setsid sleep 100000 </dev/null >/dev/null 2>&1 & echo $!; "
                    "echo kept > /dev/shm/marker")
    return int(out.split()[0])


def assert_memory_kept(d, sid, pid):
    out = d.sh(sid, f"kill -0 {pid} && cat /proc/{pid}/cmdline | tr '\\0' ' '; "
                    "cat /dev/shm/marker")
    assert out.split() == ["sleep", "100000", "kept"], out


@pytest.fixture(scope="module")
def d():
    with serve(api_keys=(KEY,)) as coved:
        yield coved


def test_e2b_autopause_keeps_memory_and_connect_resumes(d):
    sid = e2b_create(d, timeout=60, autoPause=True)
    try:
        status, info, _ = e2b(d, "GET", f"/sandboxes/{sid}")
        assert status == 200 and info["lifecycle"] == {"onTimeout": "pause",
                                                       "autoResume": False}, info
        pid = start_sleeper(d, sid)
        set_timeout(d, sid, 1)
        # Not gone at its timeout: paused, and listed as such through both APIs.
        wait_for("paused (E2B)", lambda: e2b(d, "GET", f"/sandboxes/{sid}")[1]["state"] ==
                 "paused")
        body = d.get(sid)
        assert body["status"]["state"] == "Paused" and body["status"]["reason"] == \
            "timeout_pause", body
        status, listed, _ = e2b(d, "GET", "/v2/sandboxes?state=paused")
        assert status == 200 and sid in [s["sandboxID"] for s in listed], listed
        listed = d.ok("GET", "/v1/sandboxes?state=Paused")["items"]
        assert sid in [s["id"] for s in listed]
        # Kept for coved's retention (7 days by default), not its timeout.
        assert parse(body["expiresAt"]) > time.time() + 6 * 86400, body
        # autoResume false (E2B's default): traffic does not wake it.
        status, err, _ = d.request("POST", f"/sandboxes/{sid}/proxy/44772/command",
                                   {"command": "true"})
        assert status == 409 and err["code"] == "SANDBOX::NOT_RUNNING", err
        assert state_of(d, sid) == "Paused"
        # connect resumes it, as it was: the sleeper and the file in memory are there.
        status, sb, _ = e2b(d, "POST", f"/sandboxes/{sid}/connect", {"timeout": 300})
        assert status == 201 and sb["sandboxID"] == sid, sb
        assert state_of(d, sid) == "Running"
        assert_memory_kept(d, sid, pid)
        # Out of its retention: its timeout again (extended by connect's), from the resume.
        assert time.time() + 200 < parse(d.get(sid)["expiresAt"]) < time.time() + 400
    finally:
        d.delete(sid)


def test_e2b_lifecycle_object_and_auto_resume(d):
    sid = e2b_create(d, timeout=60, lifecycle={"onTimeout": "pause", "autoResume": True})
    try:
        status, info, _ = e2b(d, "GET", f"/sandboxes/{sid}")
        assert info["lifecycle"] == {"onTimeout": "pause", "autoResume": True}, info
        pid = start_sleeper(d, sid)
        set_timeout(d, sid, 1)
        wait_state(d, sid, "Paused")
        # A timeout set while it is paused is the one its resume sets; its retention stays.
        retention_end = d.get(sid)["expiresAt"]
        set_timeout(d, sid, 300)
        body = d.get(sid)
        assert body["status"]["state"] == "Paused" and body["expiresAt"] == retention_end, body
        # An exec through the gateway resumes it and runs.
        assert_memory_kept(d, sid, pid)
        body = d.get(sid)
        assert body["status"]["state"] == "Running" and body["status"]["reason"] == \
            "auto_resume", body
        assert time.time() + 200 < parse(body["expiresAt"]) < time.time() + 301, body
    finally:
        d.delete(sid)


@pytest.mark.parametrize("fields", [
    {"autoPause": "yes"},
    {"lifecycle": "pause"},
    {"lifecycle": {"onTimeout": "nap"}},
    {"lifecycle": {"onTimeout": "pause", "autoResume": "yes"}},
    {"lifecycle": {"onTimeout": "kill"}, "autoPause": True},
    {"lifecycle": {"onTimeout": "pause", "autoResume": True}, "autoResume": {"enabled": False}},
])
def test_e2b_bad_lifecycle_changes_nothing(d, fields):
    body = {"templateID": "base", "timeout": 60}
    body.update(fields)
    before = d.ok("GET", "/v1/sandboxes")["items"]
    status, err, _ = e2b(d, "POST", "/sandboxes", body)
    assert status == 400 and set(err) == {"code", "message"} and err["code"] == 400, err
    assert d.ok("GET", "/v1/sandboxes")["items"] == before


def renew_in(d, sid, seconds):
    d.ok("POST", f"/v1/sandboxes/{sid}/renew-expiration", {"expiresAt": iso(time.time() +
                                                                             seconds)})


def test_opensandbox_on_timeout_pause_then_exec_resumes(d):
    sid = d.create(timeout=60, extensions={"onTimeout": "pause"})
    try:
        ext = d.get(sid)["extensions"]
        assert ext["onTimeout"] == "pause" and ext["autoResume"] == "true", ext
        pid = start_sleeper(d, sid)
        renew_in(d, sid, 1)  # its timeout, sooner than the 60 s a create may give
        body = wait_state(d, sid, "Paused")
        assert body["status"]["reason"] == "timeout_pause", body
        assert parse(body["expiresAt"]) > time.time() + 6 * 86400, body
        # The exec is held while the sandbox resumes, then runs: nothing of it was lost.
        assert_memory_kept(d, sid, pid)
        body = d.get(sid)
        assert body["status"]["state"] == "Running", body
        assert time.time() < parse(body["expiresAt"]) < time.time() + 61, body
    finally:
        d.delete(sid)


def test_manual_pause_resumes_on_access_with_auto_resume(d):
    sid = d.create(extensions={"autoResume": "true"})
    plain = d.create()
    try:
        d.pause(sid)
        d.pause(plain)
        assert d.sh(sid, "echo awake").strip() == "awake"
        assert state_of(d, sid) == "Running"
        with pytest.raises(ApiError) as e:
            d.exec(plain, "true")
        assert e.value.status == 409
        assert state_of(d, plain) == "Paused"
    finally:
        d.delete(sid)
        d.delete(plain)


@pytest.mark.parametrize("extensions", [
    {"onTimeout": "sleep"}, {"onTimeout": True}, {"autoResume": "yes"}, {"autoResume": 1},
    {"idleTimeoutSeconds": "0"}, {"idleTimeoutSeconds": "-5"}, {"idleTimeoutSeconds": "soon"},
    {"idleTimeoutSeconds": 10 ** 12},
])
def test_bad_lifecycle_extension_changes_nothing(d, extensions):
    before = d.ok("GET", "/v1/sandboxes")["items"]
    status, err, _ = d.request("POST", "/v1/sandboxes", {
        "image": {"uri": "base"}, "entrypoint": ["sleep", "infinity"],
        "resourceLimits": {"cpu": "1", "memory": "512Mi"}, "extensions": extensions})
    assert status == 400 and set(err) == {"code", "message"}, err
    assert err["code"] == "SANDBOX::INVALID_PARAMETER", err
    assert d.ok("GET", "/v1/sandboxes")["items"] == before


@pytest.mark.not_under("gvisor", reason="the sentry's own CPU time is the sandbox's cgroup's")
def test_idle_timeout_pauses_idle_not_busy(d):
    # The busy one's idle clock starts first: were its loop not activity, it would pause first.
    busy = d.create(entrypoint=["sh", "-c", "while :; do :; done"],
                    extensions={"idleTimeoutSeconds": "2"})
    idle = d.create(extensions={"idleTimeoutSeconds": "2"})
    try:
        pid = start_sleeper(d, idle)
        body = wait_state(d, idle, "Paused")
        assert body["status"]["reason"] == "idle_pause", body
        assert d.get(idle)["extensions"]["idleTimeoutSeconds"] == "2"
        assert state_of(d, busy) == "Running"
        # Resumed by the next exec (autoResume is on with an idle timeout), memory kept.
        assert_memory_kept(d, idle, pid)
        assert state_of(d, idle) == "Running"
        # And idle again once nothing uses it.
        wait_state(d, idle, "Paused")
        assert state_of(d, busy) == "Running"
    finally:
        d.delete(busy)
        d.delete(idle)


@pytest.mark.not_under("gvisor", reason="the sentry's own CPU time is the sandbox's cgroup's")
def test_open_gateway_connection_is_activity(d):
    sid = d.create(extensions={"idleTimeoutSeconds": "1"})
    try:
        # A command that sleeps streams nothing and uses no CPU: its open connection is what
        # keeps the sandbox awake until it is done.
        r = d.exec(sid, "sleep 4; echo done", http_timeout=30)
        assert r.exit_code == 0 and r.stdout == "done\n", r.events
        wait_state(d, sid, "Paused")
    finally:
        d.delete(sid)


def test_retention_deletes_a_paused_sandbox():
    with serve("--paused-retention", "1", api_keys=(KEY,)) as d:
        sid = e2b_create(d, timeout=60, autoPause=True)
        set_timeout(d, sid, 1)
        wait_for("paused", lambda: e2b(d, "GET", f"/sandboxes/{sid}")[1].get("state") ==
                 "paused")
        status, body, _ = wait_for("deleted", lambda: (r := d.request(
            "GET", f"/v1/sandboxes/{sid}"))[0] == 404 and r)
        assert "ttl_expiry" in body["message"], body
        status, err, _ = e2b(d, "GET", f"/sandboxes/{sid}")
        assert status == 404 and err["code"] == 404, err
        assert sandbox_leftovers(d, sid) == []


def test_restart_keeps_it_paused_and_its_deadline():
    with serve("--paused-retention", "3600", api_keys=(KEY,)) as d:
        sid = e2b_create(d, timeout=60, autoPause=True, autoResume={"enabled": True})
        pid = start_sleeper(d, sid)
        set_timeout(d, sid, 1)
        before = wait_state(d, sid, "Paused")
        d.kill()
        # Another retention now: the deadline was set when it paused, and stays.
        d.extra_args = ["--paused-retention", "5"]
        d.start()
        after = d.get(sid)
        assert after["status"]["state"] == "Paused", after
        assert after["expiresAt"] == before["expiresAt"], (before, after)
        status, info, _ = e2b(d, "GET", f"/sandboxes/{sid}")
        assert info["lifecycle"] == {"onTimeout": "pause", "autoResume": True}, info
        set_timeout(d, sid, 300)  # not paused again under the exec below
        assert_memory_kept(d, sid, pid)  # auto-resumed by the exec, after the restart too
        d.delete(sid)
        assert sandbox_leftovers(d, sid) == []


@pytest.mark.parametrize("value", ["-1", "soon", "", "31536001"])
def test_bad_paused_retention_refuses_to_start(tmp_path, value):
    r = subprocess.run([COVED, "--paused-retention", value, "--api-key", KEY, "--state-dir",
                        str(tmp_path / "s"), "--listen", "127.0.0.1:0"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "paused_retention_seconds" in r.stderr, r.stderr
