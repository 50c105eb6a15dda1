"""Issue 8 item 11: `rm -rf --no-preserve-root /` inside a sandbox.

In `base` the host OS's merged-/usr links (/bin, /lib64, ...) are read-only mounts, so the
sandbox survives it and still runs commands. A template whose whole root is writable is
bricked by it; coved's health checks then report it: state Running, reason "unhealthy" and a
message that says why, instead of a sandbox that looks fine and fails every command. Every test
checks the host, coved and a second sandbox afterwards."""

import os
import shutil
import subprocess
import time

import pytest

from covetest import AGENT, AGENT_SANITIZED, CLI, COVED, Coved, serve
from hostile import delete_and_check

RM_ROOT = "rm -rf --no-preserve-root / >/dev/null 2>&1; echo rm-done"
RM_TIMEOUT_MS = 120000
# Bounds on the waits below (a poll, not a threshold on how fast coved is).
WAIT_S = 90
HEALTHY_PROBES = 4


@pytest.fixture(scope="module")
def coved():
    """This module's daemon probes every second."""
    with serve("--health-interval", "1", admin_keys=("test-admin-key",)) as d:
        yield d


def status(coved, sid):
    return coved.get(sid)["status"]


def wait_status(coved, sid, pred, what):
    deadline = time.monotonic() + WAIT_S
    while True:
        st = status(coved, sid)
        if pred(st):
            return st
        assert time.monotonic() < deadline, f"{sid} never {what}: {st}"
        time.sleep(0.3)


def unhealthy(st):
    return st["state"] == "Running" and st["reason"] == "unhealthy"


def agent_health(coved, sid):
    return coved.request("GET", f"/sandboxes/{sid}/proxy/44772/cove/health")[:2]


def probe_counter_env():
    """A sandbox env whose bash counts the health probes (`bash -c :`) in /tmp/probes: the
    canary that proves the checks really ran while the sandbox was reported healthy."""
    return {"BASH_ENV": "/tmp/count-probes.sh"}


def install_probe_counter(coved, sid):
    coved.sh(sid, "mkdir -p /tmp && echo '[ \"$BASH_EXECUTION_STRING\" = : ] && "
                  "echo p >> /tmp/probes' > /tmp/count-probes.sh")


def probes_seen(coved, sid):
    out = coved.exec(sid, "cat /tmp/probes 2>/dev/null | wc -l").stdout.strip()
    return int(out or 0)


def assert_stays_healthy(coved, sid):
    """Polls the status while the counter in sid sees HEALTHY_PROBES more probes."""
    start = probes_seen(coved, sid)
    deadline = time.monotonic() + WAIT_S
    while probes_seen(coved, sid) < start + HEALTHY_PROBES:
        st = status(coved, sid)
        assert st["state"] == "Running" and st["reason"] != "unhealthy", st
        assert time.monotonic() < deadline, f"no health probes reached {sid}"
        time.sleep(0.3)
    st = status(coved, sid)
    assert st["state"] == "Running" and st["reason"] != "unhealthy", st


def copy_path(path, root):
    """Puts path (and every symlink on the way to it) at the same place under root."""
    parts = path.strip("/").split("/")
    cur = "/"
    for i, part in enumerate(parts):
        nxt = os.path.join(cur, part)
        if os.path.islink(nxt):
            dst = root + nxt
            if not os.path.lexists(dst):
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                os.symlink(os.readlink(nxt), dst)
            target = os.path.normpath(os.path.join(cur, os.readlink(nxt)))
            return copy_path(os.path.join(target, *parts[i + 1:]), root)
        cur = nxt
    dst = root + cur
    if os.path.isfile(cur) and not os.path.exists(dst):
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(cur, dst)


def make_writable_rootfs(root):
    """An image-like root with bash, rm and sleep and their libraries, all in the writable
    layer (a directory template, not the host's read-only /usr): `rm -rf /` bricks it."""
    programs = [shutil.which(p) for p in ("bash", "rm", "sleep", "cat", "wc")]
    # The sanitizer pass's agent is dynamic: it needs its libraries in the root too.
    linked = programs + ([AGENT] if AGENT_SANITIZED else [])
    needed = set(programs)
    for p in linked:
        out = subprocess.run(["ldd", p], capture_output=True, text=True).stdout
        needed.update(w for line in out.splitlines() for w in line.split() if w.startswith("/"))
    for p in sorted(needed):
        copy_path(p, root)
    for d in ("proc", "sys", "dev", "tmp", "etc", "root"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    os.chmod(os.path.join(root, "tmp"), 0o1777)


def add_template(coved, name, rootfs):
    env = dict(os.environ, COVE_SERVER=f"http://127.0.0.1:{coved.port}",
               COVE_API_KEY=coved.admin_key)  # registering templates needs an admin key
    r = subprocess.run([CLI, "template", "add", name, "--rootfs", rootfs], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr


def check_bystander(coved, other, host_markers):
    assert coved.sh(other, "echo still-here; ls /bin/sh >/dev/null") == "still-here\n"
    assert host_markers.intact()
    coved.health()


@pytest.mark.not_under("gvisor", reason="rm -rf / inside gVisor takes the sentry's view of the root, not the layer's")
def test_rm_rf_root_leaves_base_sandbox_usable(coved, make_sandbox, host_markers):
    victim = make_sandbox(env=probe_counter_env())
    other = make_sandbox()
    r = coved.exec(victim, RM_ROOT, timeout_ms=RM_TIMEOUT_MS, http_timeout=300)
    assert r.stdout.endswith("rm-done\n"), r.stdout + r.stderr
    # The links into /usr stayed, as mount points; the loader with them, so commands run.
    out = coved.sh(victim, "echo alive; for d in /bin /lib64; do [ -d $d ] && echo $d; done; "
                           "ls /bin/sh /lib64/ld-linux-x86-64.so.2 >/dev/null && echo exec-ok")
    assert out == "alive\n/bin\n/lib64\nexec-ok\n", out
    r = coved.exec(victim, "rm -rf /lib64 2>&1; mv /bin /gone 2>&1; ls -d /bin /lib64")
    assert "Device or resource busy" in r.stdout and r.stdout.endswith("/bin\n/lib64\n"), r.stdout
    install_probe_counter(coved, victim)  # / is still writable: /tmp comes back
    assert_stays_healthy(coved, victim)
    status_code, body = agent_health(coved, victim)
    assert status_code == 200 and body["healthy"] is True, body
    check_bystander(coved, other, host_markers)
    delete_and_check(coved, victim)
    delete_and_check(coved, other)


@pytest.mark.not_under("gvisor", reason="rm -rf / inside gVisor takes the sentry's view of the root, not the layer's")
def test_bricked_sandbox_is_reported_unhealthy(coved, make_sandbox, host_markers, tmp_path):
    rootfs = tmp_path / "rootfs"
    make_writable_rootfs(str(rootfs))
    add_template(coved, "writable-root", str(rootfs))
    victim = make_sandbox(template="writable-root", entrypoint=["/usr/bin/sleep", "infinity"])
    other = make_sandbox()
    assert coved.sh(victim, "echo before") == "before\n"
    assert agent_health(coved, victim)[0] == 200
    r = coved.exec(victim, RM_ROOT, timeout_ms=RM_TIMEOUT_MS, http_timeout=300)
    assert r.stdout.endswith("rm-done\n"), r.stdout + r.stderr
    r = coved.exec(victim, "echo after")
    assert r.exit_code != 0 and "after" not in r.stdout  # bricked: nothing starts any more
    st = wait_status(coved, victim, unhealthy, "reported unhealthy")
    assert st["message"].startswith("the sandbox cannot run commands: "), st
    assert "No such file or directory" in st["message"], st
    status_code, body = agent_health(coved, victim)
    assert status_code == 503 and body["code"] == "SANDBOX::UNHEALTHY", body
    # Listing does not hide it either.
    items = coved.ok("GET", "/v1/sandboxes")["items"]
    assert [i["status"]["reason"] for i in items if i["id"] == victim] == ["unhealthy"]
    assert not unhealthy(status(coved, other))
    check_bystander(coved, other, host_markers)
    delete_and_check(coved, victim)
    delete_and_check(coved, other)


@pytest.mark.not_under("gvisor", reason="rm -rf / inside gVisor takes the sentry's view of the root, not the layer's")
def test_unhealthy_clears_when_the_sandbox_recovers(coved, make_sandbox, host_markers):
    """No pid left (every one held by a process that waits for a file): nothing can start, so
    the sandbox is unhealthy; once the file appears (made by the agent, which needs no new
    process) the holders exit and the next check clears it."""
    victim = make_sandbox(limits={"cpu": "1", "memory": "512Mi", "pids": "24"})
    other = make_sandbox()
    # It keeps taking every pid that frees up (a probe's shell may hold one as it fills up).
    holder = ("import os, time\n"
              "flag = '/tmp/release'\n"
              "while not os.path.exists(flag):\n"
              "    try:\n"
              "        pid = os.fork()\n"
              "    except OSError:\n"
              "        time.sleep(0.05)\n"
              "        continue\n"
              "    if pid == 0:\n"
              "        while not os.path.exists(flag):\n"
              "            time.sleep(0.2)\n"
              "        os._exit(0)\n")
    coved.sh(victim, f"cat > /tmp/holder.py <<'EOF'\n{holder}EOF")
    coved.exec(victim, "python3 /tmp/holder.py", background=True)
    st = wait_status(coved, victim, unhealthy, "reported unhealthy")
    assert "cannot fork" in st["message"], st
    status_code, _, _ = coved.request(
        "POST", f"/sandboxes/{victim}/proxy/44772/directories", {"/tmp/release": {"mode": 755}})
    assert status_code == 200
    st = wait_status(coved, victim, lambda s: s["state"] == "Running" and not unhealthy(s),
                     "healthy again")
    assert st["reason"] == "started", st
    assert coved.sh(victim, "echo recovered") == "recovered\n"
    check_bystander(coved, other, host_markers)
    delete_and_check(coved, victim)
    delete_and_check(coved, other)


def test_healthy_sandboxes_are_never_reported_unhealthy(coved, make_sandbox, host_markers):
    """Probes run (the canary counts them) and a working sandbox, busy or idle, stays healthy."""
    quiet = make_sandbox(env=probe_counter_env())
    busy = make_sandbox(env=probe_counter_env())
    for sid in (quiet, busy):
        install_probe_counter(coved, sid)
    coved.exec(busy, "for i in $(seq 20); do sh -c 'ls / >/dev/null'; sleep 0.2; done",
               background=True)
    assert_stays_healthy(coved, quiet)
    assert_stays_healthy(coved, busy)
    status_code, body = agent_health(coved, quiet)
    assert status_code == 200 and body["healthy"] is True and body["shell"].endswith("/bash")
    # execd's ping keeps its contract: an empty 200.
    status_code, body = coved.request("GET", f"/sandboxes/{quiet}/proxy/44772/ping")[:2]
    assert status_code == 200 and body is None
    assert host_markers.intact()
    delete_and_check(coved, quiet)
    delete_and_check(coved, busy)


def test_health_interval_setting(tmp_path):
    for bad in ("-1", "ten", "100000"):
        r = subprocess.run([COVED, "--insecure", "--state-dir", str(tmp_path / "s"),
                            "--health-interval", bad], capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and "health_interval" in r.stderr, (bad, r.stderr)
    r = subprocess.run([COVED, "--help"], capture_output=True, text=True, timeout=30)
    assert "--health-interval" in r.stdout and "COVE_HEALTH_INTERVAL" in r.stdout


def test_hanging_shell_is_reported_and_probes_in_flight_end_cleanly(coved, make_sandbox,
                                                                    host_markers):
    """A shell that never exits is reported (the agent kills it); pausing, resuming and
    deleting sandboxes whose probe is under way leaves nothing behind."""
    env = {"BASH_ENV": "/tmp/hang.sh"}
    hang = "mkdir -p /tmp && echo '[ \"$BASH_EXECUTION_STRING\" = : ] && sleep 600' > /tmp/hang.sh"
    stuck = make_sandbox(env=env)
    paused = make_sandbox(env=env)
    doomed = make_sandbox(env=env)
    for sid in (stuck, paused, doomed):
        coved.sh(sid, hang)
    st = wait_status(coved, stuck, unhealthy, "reported unhealthy")
    assert "did not exit within" in st["message"], st
    # Each timed-out shell was killed with what it started: at most the one probe under way.
    assert int(coved.sh(stuck, "pgrep -c -f 'sleep [6]00' || true")) <= 1
    coved.pause(paused)
    assert coved.get(paused)["status"]["state"] == "Paused"
    coved.resume(paused)
    assert coved.get(paused)["status"]["state"] == "Running"
    delete_and_check(coved, doomed)
    delete_and_check(coved, paused)
    delete_and_check(coved, stuck)
    assert host_markers.intact()
    coved.health()
