"""Every process coved starts has one owner that signals and reaps it through a pidfd: a
set-up that fails never takes another sandbox with it (even once its pid is handed out
again), no zombie is left under coved, and a re-adopted sandbox is watched as well as one
coved started. As PID 1 of its pid namespace coved also reaps what is orphaned in it."""

import os
import shutil
import signal
import threading
import time

import pytest

from covetest import Coved, descendants, sandbox_init_pid, sandbox_leftovers, comm

BODY = {"image": {"uri": "base"}, "entrypoint": ["sleep", "infinity"],
        "resourceLimits": {"cpu": "1", "memory": "256Mi"}}

# coved runs as PID 1 of a pid namespace of its own whose pids wrap after this many: a pid
# freed by a failed set-up is soon another process's, so a stale kill would hit something.
PID_MAX = 500


def children(pid):
    found = set()
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found |= {int(p) for p in f.read().split()}
    except OSError:
        pass
    return found


def stat_field(pid, index):
    """Field `index` after the command name of /proc/PID/stat (0: the state letter)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[index]
    except (OSError, IndexError):
        return None


def zombies_under(pid):
    return sorted(c for c in children(pid) if stat_field(c, 0) == "Z")


def zombies_staying_under(pid, wait_s=5):
    """The zombies under pid (with their names) still there after waiting up to wait_s for
    none: a child that has just exited is one until its owner (an orphan's: coved as init)
    reaps it."""
    deadline = time.monotonic() + wait_s
    while zombies_under(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [(z, comm(z)) for z in zombies_under(pid)]


def coved_as_init(pid_max=None):
    """coved as PID 1 of its own pid namespace (with its own /proc), started."""
    script = 'exec "$@"'
    if pid_max is not None:
        script = f"echo {pid_max} > /proc/sys/kernel/pid_max && " + script
    d = Coved(wrapper=["unshare", "--pid", "--fork", "--mount-proc", "--kill-child=SIGTERM",
                       "sh", "-c", script, "sh"])
    try:
        d.start()
    except RuntimeError as e:
        d.cleanup()
        if pid_max is not None and ("pid_max" in str(e) or "Invalid argument" in str(e)):
            pytest.skip("no pid_max per pid namespace here (Linux 6.14 or later)")
        raise
    return d


def run_as_init(d):
    """A fixture's life of coved_as_init's daemon."""
    # The wrapper forwards nothing: coved itself gets the signals.
    (inner,) = children(d.proc.pid)
    d.inner_pid = inner
    try:
        yield d
    finally:
        if d.proc.poll() is None and comm(inner) == "coved":
            os.kill(inner, signal.SIGTERM)
            try:
                d.proc.wait(30)
            except Exception:
                pass
        d.cleanup()


@pytest.fixture
def init_coved():
    """coved as PID 1 of its own pid namespace: what is orphaned in it is coved's child."""
    yield from run_as_init(coved_as_init())


@pytest.fixture
def small_pid_coved():
    """coved as PID 1 of its own pid namespace (with its own /proc), pid_max PID_MAX."""
    yield from run_as_init(coved_as_init(PID_MAX))


def kill_set_up(d, result):
    """Starts a create and SIGKILLs its set-up child before it becomes the agent. Returns the
    thread and whether the set-up was caught (False: it finished first)."""
    before = children(d.inner_pid)

    def create():
        result["response"] = d.request("POST", "/v1/sandboxes",
                                       dict(BODY, metadata={"case": "killed-set-up"}),
                                       timeout=120)

    t = threading.Thread(target=create)
    t.start()
    deadline = time.monotonic() + 5
    while t.is_alive() and time.monotonic() < deadline:
        for pid in children(d.inner_pid) - before:
            if comm(pid) == "coved":  # a set-up child, not yet exec'd into cove-agent
                os.kill(pid, signal.SIGKILL)
                return t, True
    return t, False


@pytest.mark.not_under("gvisor", reason="a set-up killed while runsc runs orphans runsc's sentry and gofer to coved as PID 1")
def test_failing_set_ups_kill_nobody_else_and_leave_no_zombie(small_pid_coved):
    d = small_pid_coved
    kept = [d.create() for _ in range(3)]
    kept_pids = {sid: sandbox_init_pid(sid) for sid in kept}
    assert all(kept_pids.values()), kept_pids
    churn_errors, churned, stop = [], [], threading.Event()
    # A set-up child cannot tell whose create it serves: the churn's creates wait while one
    # is hunted here, and the rest of its work (commands, deletes) goes on at the same time.
    creating = threading.Lock()

    def churn():
        # Sandboxes made, used and deleted meanwhile: each takes pids a stale kill could hit.
        while not stop.is_set():
            try:
                with creating:
                    sid = d.create()
                churned.append(sid)
                out = d.sh(sid, "for i in 1 2 3 4 5 6 7 8; do /bin/true; done; echo ok")
                if out != "ok\n":
                    churn_errors.append(f"{sid}: {out!r}")
                d.delete(sid)
            except Exception as e:  # noqa: BLE001 - any failure here is the finding
                churn_errors.append(repr(e))
                return

    c = threading.Thread(target=churn)
    c.start()
    caught, made = 0, []
    try:
        for _ in range(30):
            result = {}
            with creating:
                t, hit = kill_set_up(d, result)
                t.join(60)
            status, body, _ = result["response"]
            if status == 202:  # the set-up won the race
                made.append(body["id"])
                d.delete(body["id"])
                continue
            assert status == 500 and body["code"] == "SANDBOX::START_FAILED", body
            caught += hit
    finally:
        stop.set()
        c.join(120)
    print(f"{caught} set-ups killed, {len(made)} won the race, {len(churned)} churned")
    assert caught >= 5, f"caught only {caught} set-ups before their exec"
    assert churn_errors == [], churn_errors
    assert churned, "the churn made no sandbox"
    # The sandboxes that were there all along still run, with the same PID 1.
    for sid in kept:
        body = d.get(sid)
        assert body["status"]["state"] == "Running", body
        assert sandbox_init_pid(sid) == kept_pids[sid]
        assert d.sh(sid, "echo alive") == "alive\n"
    assert d.ok("GET", "/v1/sandboxes?metadata=case%3Dkilled-set-up")["items"] == []
    # What a set-up killed midway had started (the oci runtime's crun, the container's agent)
    # is orphaned to coved, its init: reaped as well.
    assert zombies_staying_under(d.inner_pid) == []
    assert d.health()["status"] == "healthy"
    for sid in kept:
        d.delete(sid)
    for sid in kept + churned + made:
        assert sandbox_leftovers(d, sid) == [], sid
    assert zombies_staying_under(d.inner_pid) == []


@pytest.mark.skipif(shutil.which("crun") is None, reason="no crun here")
def test_an_oci_set_up_killed_while_crun_runs_leaves_no_zombie_and_no_crun(init_coved):
    """A set-up killed midway orphans what it started to coved, PID 1 here: the create fails
    on the set-up's end (were its status pipe still held, coved would wait out the start's
    time-out), crun dies with it, and coved reaps every orphan."""
    d = init_coved
    caught = 0
    for _ in range(10):
        before = children(d.inner_pid)
        result = {}

        def create():
            result["response"] = d.request(
                "POST", "/v1/sandboxes",
                dict(BODY, extensions={"runtime": "oci"}, metadata={"case": "crun-orphaned"}),
                timeout=120)

        t = threading.Thread(target=create)
        t.start()
        hit = False
        while t.is_alive() and not hit:
            for pid in children(d.inner_pid) - before:
                # The set-up child (not yet cove-shim) while crun, its child, runs.
                if comm(pid) == "coved" and "crun" in {comm(c) for c in children(pid)}:
                    os.kill(pid, signal.SIGKILL)
                    hit = True
                    break
        t.join(120)
        status, body, _ = result["response"]
        if status == 202:  # crun was done before it was seen
            d.delete(body["id"])
            continue
        assert status == 500 and body["code"] == "SANDBOX::START_FAILED", body
        assert "the set-up process" in body["message"], body  # its end, not a time-out
        caught += hit
        if caught == 3:
            break
    assert caught > 0, "crun never seen running under a set-up"
    assert d.ok("GET", "/v1/sandboxes?metadata=case%3Dcrun-orphaned")["items"] == []
    assert zombies_staying_under(d.inner_pid) == []
    left = [p for p in descendants(d.inner_pid, helpers=True)
            if comm(p) in ("crun", "cove-agent") and stat_field(p, 0) != "Z"]
    assert left == [], left
    assert d.health()["status"] == "healthy"


def test_deleted_and_crashed_sandboxes_leave_no_zombie(coved):
    crashed, deleted = coved.create(), coved.create()
    os.kill(sandbox_init_pid(crashed), signal.SIGKILL)
    for _ in range(200):
        if coved.get(crashed)["status"]["state"] == "Failed":
            break
        time.sleep(0.05)
    assert "killed by signal 9" in coved.get(crashed)["status"]["message"]
    coved.delete(deleted)
    assert zombies_under(coved.proc.pid) == []
    coved.delete(crashed)
    assert zombies_under(coved.proc.pid) == []


def test_a_re_adopted_sandbox_whose_init_dies_is_failed(fresh_coved):
    """After a restart the sandbox is not coved's child: its exit is still seen, at once."""
    d = fresh_coved.start()
    sid, other = d.create(), d.create()
    d.kill(signal.SIGTERM)
    d.start()
    assert d.get(sid)["status"]["state"] == "Running"
    os.kill(sandbox_init_pid(sid), signal.SIGKILL)
    for _ in range(200):
        if d.get(sid)["status"]["state"] == "Failed":
            break
        time.sleep(0.05)
    body = d.get(sid)
    assert body["status"]["state"] == "Failed", body
    assert body["status"]["reason"] == "process_exited", body
    # Its neighbour, re-adopted the same way, is untouched.
    assert d.sh(other, "echo still here") == "still here\n"
    d.delete(sid)
    d.delete(other)
    assert sandbox_leftovers(d, sid) == [] and sandbox_leftovers(d, other) == []
