"""Sandboxes are set up concurrently: coved answers other requests while a set-up runs, a
sandbox being set up is listed as Pending, and one deleted (or stuck) in that state leaves
nothing behind."""

import concurrent.futures
import os
import signal
import threading
import time

import pytest

from covetest import cgroup_dirs, sandbox_leftovers, comm

BODY = {"image": {"uri": "base"}, "entrypoint": ["sleep", "infinity"],
        "resourceLimits": {"cpu": "1", "memory": "256Mi"}}


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return {int(p) for p in f.read().split()}
    except OSError:
        return set()


def create_with_stuck_setup(coved, metadata):
    """Starts a create and stops its set-up process (SIGSTOP) before it becomes the agent,
    as a set-up stuck on a hung mount would be. Returns (thread, result dict, stopped pid);
    retries the race with a new create if the set-up finished first."""
    for _ in range(20):
        before = children(coved.proc.pid)
        result = {}

        def create():
            try:
                result["response"] = coved.request("POST", "/v1/sandboxes",
                                                   dict(BODY, metadata=metadata), timeout=120)
            except OSError as e:  # coved stopped under it
                result["error"] = e

        t = threading.Thread(target=create)
        t.start()
        stopped = None
        deadline = time.monotonic() + 5
        while stopped is None and t.is_alive() and time.monotonic() < deadline:
            for pid in children(coved.proc.pid) - before:
                if comm(pid) == "coved":  # not yet exec'd into cove-agent
                    os.kill(pid, signal.SIGSTOP)
                    if comm(pid) == "coved":
                        stopped = pid
                    else:
                        os.kill(pid, signal.SIGCONT)  # it won the race after all
                    break
        if stopped is not None:
            return t, result, stopped
        t.join()
        status, body, _ = result["response"]
        assert status == 202, body
        coved.delete(body["id"])
    pytest.fail("never caught a sandbox's set-up process before its exec")


def pending_ids(coved, metadata):
    q = "&".join(f"metadata={k}%3D{v}" for k, v in metadata.items())
    items = coved.ok("GET", f"/v1/sandboxes?state=Pending&{q}")["items"]
    return [s["id"] for s in items]


def test_a_stuck_set_up_blocks_nobody_and_deleting_it_leaves_nothing(coved):
    tag = {"case": "stuck-setup"}
    t, result, stopped = create_with_stuck_setup(coved, tag)
    try:
        ids = pending_ids(coved, tag)
        assert len(ids) == 1, ids
        sid = ids[0]
        body = coved.get(sid)
        assert body["status"]["state"] == "Pending" and body["status"]["reason"] == "provisioning"
        # Meanwhile coved serves everything else: another sandbox is made and runs a command.
        other = coved.create()
        assert coved.sh(other, "echo busy elsewhere") == "busy elsewhere\n"
        coved.delete(other)
        # The gateway refuses the Pending sandbox with its state, rather than hanging.
        status, gw, _ = coved.request("POST", f"/sandboxes/{sid}/proxy/44772/command",
                                      {"command": "true"})
        assert status == 409 and "Pending" in gw["message"], gw
        assert coved.request("POST", f"/v1/sandboxes/{sid}/pause")[0] == 409

        assert coved.request("DELETE", f"/v1/sandboxes/{sid}")[0] == 204
        t.join(30)
        status, body, _ = result["response"]
        assert status == 409 and body["code"] == "SANDBOX::DELETED", body
        assert coved.request("GET", f"/v1/sandboxes/{sid}")[0] == 404
        assert not os.path.exists(f"/proc/{stopped}") or comm(stopped) == ""
        assert sandbox_leftovers(coved, sid) == []
    finally:
        if os.path.exists(f"/proc/{stopped}"):
            os.kill(stopped, signal.SIGKILL)
        t.join(30)


@pytest.mark.slow
def test_a_set_up_stuck_past_its_limit_fails_cleanly(coved):
    tag = {"case": "setup-timeout"}
    t, result, stopped = create_with_stuck_setup(coved, tag)
    try:
        sid = pending_ids(coved, tag)[0]
        t.join(60)
        status, body, _ = result["response"]
        assert status == 500 and body["code"] == "SANDBOX::START_FAILED", body
        assert "took more than 30 s" in body["message"]
        assert coved.request("GET", f"/v1/sandboxes/{sid}")[0] == 404
        assert sandbox_leftovers(coved, sid) == []
    finally:
        if os.path.exists(f"/proc/{stopped}") and comm(stopped) == "coved":
            os.kill(stopped, signal.SIGKILL)
        t.join(30)


def test_twenty_creates_at_once_all_run_and_deletes_race_them_cleanly(coved):
    """20 creates in flight while another client deletes some of what it sees Pending: every
    create ends as Running or as deleted, never half-made, and nothing is left."""
    tag = {"case": "create-storm"}
    seen, deleted, stop = set(), set(), threading.Event()

    def reaper():
        while not stop.is_set():
            for sid in pending_ids(coved, tag):
                seen.add(sid)
                if len(deleted) < 5 and coved.request("DELETE", f"/v1/sandboxes/{sid}")[0] == 204:
                    deleted.add(sid)

    def create(_):
        return coved.request("POST", "/v1/sandboxes", dict(BODY, metadata=tag), timeout=120)

    r = threading.Thread(target=reaper)
    r.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(20) as ex:
            results = list(ex.map(create, range(20)))
    finally:
        stop.set()
        r.join()
    made, refused = [], 0
    for status, body, _ in results:
        if status == 409:
            assert body["code"] == "SANDBOX::DELETED", body
            assert any(sid in body["message"] for sid in deleted), body
            refused += 1
        else:
            assert status == 202 and body["status"]["state"] == "Running", body
            seen.add(body["id"])
            if body["id"] not in deleted:  # deleted just after its set-up ended
                made.append(body["id"])
    print(f"{len(made)} made, {refused} deleted while Pending, {len(deleted)} deletes")
    assert refused <= len(deleted) and len(made) + len(deleted) == 20
    for sid in made:
        assert coved.sh(sid, "hostname") == f"{sid}\n"
    for sid in made:
        coved.delete(sid)
    for sid in seen:
        assert sandbox_leftovers(coved, sid) == [], sid
        assert cgroup_dirs(sid) == []


def test_coved_stopping_during_a_set_up_removes_that_sandbox(fresh_coved):
    d = fresh_coved.start()
    kept = d.create()
    t, result, stopped = create_with_stuck_setup(d, {"case": "stop-during-setup"})
    try:
        sid = pending_ids(d, {"case": "stop-during-setup"})[0]
        d.kill(signal.SIGTERM)
        assert d.proc.returncode == 0
        t.join(30)
        assert "error" in result  # the connection closed: its answer can never come
        # Its set-up cannot be finished by another daemon: it is gone, nothing left of it.
        assert sandbox_leftovers(d, sid) == []
        assert not os.path.exists(f"/proc/{stopped}") or comm(stopped) == ""
        # A sandbox that was running is not: it outlives the daemon and is re-adopted.
        d.start()
        assert d.sh(kept, "echo still here") == "still here\n"
        assert d.request("GET", f"/v1/sandboxes/{sid}")[0] == 404
        d.delete(kept)
    finally:
        if os.path.exists(f"/proc/{stopped}") and comm(stopped) == "coved":
            os.kill(stopped, signal.SIGKILL)
        t.join(30)


def test_a_slow_teardown_blocks_nobody_and_is_deleted_once(coved):
    """A sandbox holding 1.5 GiB takes a while to die: meanwhile coved answers (the sandbox is
    seen Stopping), a second delete is refused, and the first answers once all is gone."""
    hold = ("import time; b = b'x' * (1536 << 20); open('/tmp/ready', 'w').close(); "
            "time.sleep(1e6)")
    sid = coved.create(entrypoint=["python3", "-c", hold], limits={"cpu": "1", "memory": "2Gi"})
    for _ in range(600):
        if coved.exec(sid, "test -f /tmp/ready").exit_code == 0:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the sandbox never allocated its memory")
    result = {}
    t = threading.Thread(target=lambda: result.update(
        r=coved.request("DELETE", f"/v1/sandboxes/{sid}")))
    t.start()
    states, second = set(), None
    while t.is_alive():
        status, body, _ = coved.request("GET", f"/v1/sandboxes/{sid}")
        if status == 200:
            states.add(body["status"]["state"])
            if body["status"]["state"] == "Stopping" and second is None:
                second = coved.request("DELETE", f"/v1/sandboxes/{sid}")
    t.join()
    assert result["r"][0] == 204
    assert "Stopping" in states, states  # answered while the teardown went on
    assert second is not None and second[0] == 409, second
    assert second[1]["code"] == "SANDBOX::INVALID_STATE", second
    assert coved.request("GET", f"/v1/sandboxes/{sid}")[0] == 404
    assert sandbox_leftovers(coved, sid) == []
