"""Isolated sessions against hostile code run in them: a session cannot undo its mounts (the
overlay, a read-only workspace, its /tmp), make new namespaces or mounts, see or signal the
sandbox's processes or another session's, or escape through /proc; `kill -9 -1` and a fork
bomb in a session end that session's processes at most; filling its tmpfs stops at the cap.
Afterwards the sandbox, another session, another sandbox, coved and the host are fine."""

import json
import pytest

from covetest import AGENT_PORT, ExecResult, parse_events

from hostile import delete_and_check


def base(sid):
    return f"/sandboxes/{sid}/proxy/{AGENT_PORT}/v1/isolated"


def session(coved, sid, **body):
    body.setdefault("workspace", {"path": "/workspace"})
    status, resp, _ = coved.request("POST", base(sid) + "/session", body)
    assert status == 201, resp
    return resp["session_id"]


def run(coved, sid, s, code, timeout_seconds=60):
    status, raw, _ = coved.request("POST", f"{base(sid)}/session/{s}/run",
                                   {"code": code, "timeout_seconds": timeout_seconds}, timeout=120)
    assert status == 200, raw
    return ExecResult(parse_events(raw if isinstance(raw, str) else json.dumps(raw)))


ESCAPES = r"""
umount /workspace 2>/dev/null && echo UMOUNTED-WS
umount -l /tmp 2>/dev/null && echo UMOUNTED-TMP
umount -l /proc 2>/dev/null && echo UMOUNTED-PROC
mount -t tmpfs x /mnt 2>/dev/null && echo MOUNTED
mount -o remount,rw /workspace 2>/dev/null && echo REMOUNTED
unshare -m true 2>/dev/null && echo UNSHARE-M
unshare -U true 2>/dev/null && echo UNSHARE-U
unshare -p -f true 2>/dev/null && echo UNSHARE-P
nsenter -t 1 -m true 2>/dev/null && echo NSENTER
ls /proc/1/root/ >/dev/null 2>&1 || true
cat /proc/1/environ >/dev/null 2>&1 && echo ENVIRON-OF-1
for p in /proc/[0-9]*; do cat $p/comm 2>/dev/null; done | sort -u | tr '\n' ' '
echo
"""


@pytest.mark.native_only(reason="isolated sessions are refused (409 ISOLATED::NOT_SUPPORTED) by the oci and gvisor runtimes today")
def test_session_cannot_undo_its_walls(coved, make_sandbox):
    sid = make_sandbox()
    coved.sh(sid, "mkdir -p /workspace && echo real > /workspace/real.txt && "
                  "(sleep 1000 > /dev/null 2>&1 &)")
    ro = session(coved, sid, workspace={"path": "/workspace", "mode": "ro"})
    r = run(coved, sid, ro, ESCAPES)
    lines = r.stdout.strip().split("\n")
    assert not any(w in r.stdout for w in ("UMOUNTED", "MOUNTED", "REMOUNTED", "UNSHARE",
                                           "NSENTER")), r.stdout
    # Only the session's own processes are there to see: its agent, the shell, its tools.
    comms = set(lines[-1].split())
    assert "sleep" not in comms and comms <= {"cove-agent", "cove-agent-sani", "bash", "sh",
                                              "cat", "sort", "tr", "ls"}, comms
    r = run(coved, sid, ro, "echo x > /workspace/real.txt")
    assert r.exit_code != 0
    assert coved.sh(sid, "cat /workspace/real.txt").strip() == "real"
    # The sandbox's entrypoint still runs.
    assert "sleep" in coved.sh(sid, "ps -e -o comm=")


@pytest.mark.native_only(reason="isolated sessions are refused (409 ISOLATED::NOT_SUPPORTED) by the oci and gvisor runtimes today")
def test_kill_all_and_fork_bomb_stay_in_the_session(coved, make_sandbox):
    other_sandbox = make_sandbox()
    sid = make_sandbox(limits={"cpu": "1", "memory": "512Mi", "pids": "256"})
    coved.sh(sid, "(sleep 1000 > /dev/null 2>&1 &)")
    victim = session(coved, sid)
    bystander = session(coved, sid)
    run(coved, sid, bystander, "echo steady > /tmp/b")
    # kill -9 -1 as the session's root: every process it can see is its own.
    run(coved, sid, victim, "kill -9 -1; sleep 1", timeout_seconds=10)
    assert "sleep" in coved.sh(sid, "ps -e -o comm=")
    r = run(coved, sid, bystander, "cat /tmp/b")
    assert r.stdout.strip() == "steady"
    # A fork bomb (bounded by the run's timeout and the sandbox's pids limit).
    bomber = session(coved, sid)
    run(coved, sid, bomber, "b() { b | b & }; b; sleep 5", timeout_seconds=8)
    status, _, _ = coved.request("DELETE", f"{base(sid)}/session/{bomber}")
    assert status == 200
    assert coved.health()["status"] == "healthy"
    assert run(coved, sid, bystander, "cat /tmp/b").stdout.strip() == "steady"
    assert coved.sh(other_sandbox, "echo fine").strip() == "fine"
    delete_and_check(coved, sid)


@pytest.mark.native_only(reason="isolated sessions are refused (409 ISOLATED::NOT_SUPPORTED) by the oci and gvisor runtimes today")
def test_filling_a_session_stops_at_its_cap(coved, make_sandbox):
    sid = make_sandbox(limits={"cpu": "1", "memory": "512Mi"})
    s = session(coved, sid)
    # The overlay's changes are capped at half the memory (256 MiB), /tmp at a quarter.
    r = run(coved, sid, s, "dd if=/dev/zero of=/workspace/fill bs=1M count=400 2>&1; "
                           "dd if=/dev/zero of=/tmp/fill bs=1M count=200 2>&1; "
                           "du -sm /workspace/fill /tmp/fill", timeout_seconds=60)
    assert "No space left on device" in r.stdout, r.stdout
    sizes = [int(line.split()[0]) for line in r.stdout.strip().split("\n")[-2:]]
    assert sizes[0] <= 256 and sizes[1] <= 128, sizes
    # The sandbox is alive and its own disk untouched.
    assert coved.get(sid)["status"]["state"] == "Running"
    assert coved.sh(sid, "test -e /workspace/fill && echo yes || echo no").strip() == "no"
    status, _, _ = coved.request("DELETE", f"{base(sid)}/session/{s}")
    assert status == 200
    # The memory comes back with the session: a new one can fill its cap again.
    s2 = session(coved, sid)
    r = run(coved, sid, s2, "dd if=/dev/zero of=/workspace/f bs=1M count=100 2>&1 | tail -1")
    assert r.exit_code == 0, r.stdout


@pytest.mark.native_only(reason="isolated sessions are refused (409 ISOLATED::NOT_SUPPORTED) by the oci and gvisor runtimes today")
def test_links_the_sandbox_plants_are_never_followed(coved, make_sandbox):
    """The sandbox's root swaps /tmp (or /dev/shm) for a link before a session is made: coved
    (host root, building the session) refuses it rather than mounting through it."""
    sid = make_sandbox()
    coved.sh(sid, "mv /tmp /tmp.real && ln -s /etc /tmp")
    status, resp, _ = coved.request("POST", base(sid) + "/session",
                                    {"workspace": {"path": "/workspace"}})
    assert status == 500 and "symbolic" in resp["message"], resp
    assert coved.sh(sid, "ls /etc | wc -l").strip() != "0"  # nothing mounted over it
    coved.sh(sid, "rm /tmp && mv /tmp.real /tmp")
    s = session(coved, sid)
    assert run(coved, sid, s, "ls /tmp | wc -l; ls /dev/shm | wc -l").stdout == "0\n0\n"


@pytest.mark.native_only(reason="isolated sessions are refused (409 ISOLATED::NOT_SUPPORTED) by the oci and gvisor runtimes today")
def test_private_ipc_and_shm_under_strict(coved, make_sandbox):
    sid = make_sandbox()
    coved.sh(sid, "echo sandbox > /dev/shm/mine; python3 -c \"import sysv_ipc\" 2>/dev/null; "
                  "ipcmk -M 4096 >/dev/null")
    strict = session(coved, sid)
    balanced = session(coved, sid, profile="balanced")
    assert run(coved, sid, strict, "ls /dev/shm | wc -l; ipcs -m | grep -c '^0x' || true"
               ).stdout.split() == ["0", "0"]
    out = run(coved, sid, balanced, "cat /dev/shm/mine; ipcs -m | grep -c '^0x'").stdout.split()
    assert out[0] == "sandbox" and int(out[1]) >= 1


@pytest.mark.native_only(reason="isolated sessions are refused (409 ISOLATED::NOT_SUPPORTED) by the oci and gvisor runtimes today")
def test_idle_sessions_of_a_paused_sandbox_go_without_stalling_coved(coved, make_sandbox):
    """A paused sandbox's sessions are frozen with it; their idle GC kills them and leaves
    their (frozen) set-up processes to be reaped once thawed, never waiting on the loop."""
    import time
    sid = make_sandbox()
    for _ in range(3):
        session(coved, sid, idle_timeout_seconds=1)
    coved.pause(sid)
    deadline = time.time() + 30
    while time.time() < deadline:
        # A loop blocked on a frozen process would never answer.
        assert coved.health(timeout=20)["status"] == "healthy"
        if "idle past its timeout" in coved.log() and coved.log().count("idle past") >= 3:
            break
        time.sleep(0.5)
    coved.resume(sid)
    status, body, _ = coved.request("GET", base(sid) + "/sessions")
    assert status == 200 and body["sessions"] == []
    deadline = time.time() + 10
    while time.time() < deadline and coved.sh(sid, "ps -e -o comm= | grep -c cove-agent").strip() != "1":
        time.sleep(0.2)
    assert coved.sh(sid, "ps -e -o comm= | grep -c cove-agent").strip() == "1"
