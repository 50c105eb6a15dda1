"""Pause freezes the whole sandbox: no progress, no CPU, no commands; resume continues it."""

import time

import pytest

from hostile import delete_and_check
from covetest import ApiError, cgroup_file, sandbox_init_pid

# Written aside and renamed: a read never meets the file truncated and not yet written.
COUNTER = "i=0; while :; do i=$((i+1)); echo $i > /tmp/c.new; mv /tmp/c.new /tmp/c; sleep 0.05; done"


def cpu_usage_ns(sid):
    v1 = cgroup_file(sid, "cpuacct", "cpuacct.usage")
    if v1 is not None:
        return int(v1)
    stat = dict(l.split() for l in (cgroup_file(sid, "cpu", "cpu.stat") or "").splitlines())
    return int(stat["usage_usec"]) * 1000


def freezer_state(sid):
    v1 = cgroup_file(sid, "freezer", "freezer.state")
    if v1 is not None:
        return v1
    events = dict(l.split() for l in cgroup_file(sid, "cpu", "cgroup.events").splitlines())
    return "FROZEN" if events.get("frozen") == "1" else "THAWED"


@pytest.mark.native_only(reason="reads the frozen sandbox's files through /proc/PID/root of its PID 1, which under gVisor is the sentry (pause under gVisor: test_runtimes.py::test_pause_keeps_memory_and_resume_goes_on)")
def test_paused_sandbox_makes_no_progress(coved, make_sandbox):
    sid = make_sandbox(entrypoint=["sh", "-c", COUNTER])
    agent = sandbox_init_pid(sid)

    def read_inside():
        return int(coved.sh(sid, "cat /tmp/c"))

    def read_from_host():
        # The host can look at the frozen sandbox's files through its PID 1's root.
        with open(f"/proc/{agent}/root/tmp/c") as f:
            return int(f.read())

    deadline = time.monotonic() + 10
    while coved.exec(sid, "cat /tmp/c").exit_code != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    v1 = read_inside()
    coved.pause(sid)
    t_paused = time.monotonic()
    assert coved.get(sid)["status"]["state"] == "Paused"
    assert freezer_state(sid) == "FROZEN"
    h1, cpu1 = read_from_host(), cpu_usage_ns(sid)
    with pytest.raises(ApiError) as e:
        coved.exec(sid, "echo should not run", http_timeout=10)
    assert e.value.status == 409
    time.sleep(2)
    h2, cpu2 = read_from_host(), cpu_usage_ns(sid)
    assert h2 == h1, f"the counter moved while paused: {h1} -> {h2}"
    assert cpu2 == cpu1, f"the sandbox used CPU while paused: {cpu1} -> {cpu2} ns"
    assert coved.get(sid)["status"]["state"] == "Paused"

    coved.resume(sid)
    paused_for = time.monotonic() - t_paused
    assert coved.get(sid)["status"]["state"] == "Running"
    assert freezer_state(sid) == "THAWED"
    v2 = read_inside()
    # Unfrozen it would have counted ~20 a second; only the moments around pause and resume
    # count here (half the unfrozen rate leaves room for a loaded machine).
    print(f"counter {v1} before pause, {h1}/{h2} while paused ({paused_for:.1f}s), {v2} after")
    assert v2 - v1 < 10 * paused_for, f"{v2 - v1} ticks during a {paused_for:.1f}s pause"
    time.sleep(1)
    v3 = read_inside()
    assert v3 - v2 >= 5, f"the counter does not go on after resume: {v2} -> {v3}"
    assert sandbox_init_pid(sid) == agent

    # Deleting a paused sandbox leaves nothing (frozen tasks need thawing to die).
    coved.pause(sid)
    delete_and_check(coved, sid)
