"""Kernel budgets a sandbox must not take from others: the per-user ones (pipe pages, epoll
watches, inotify), kept apart by an id range of each sandbox's own, and the host's table of
open files, bounded per sandbox by RLIMIT_NOFILE x pids."""

import json
import os
import signal
import sqlite3
import subprocess
import threading
import time

import pytest

from covetest import COVED, Coved, sandbox_init_pid, sandbox_leftovers
from hostile import delete_and_check, run_python

# Grows pipes to 1 MiB until the kernel refuses (EPERM once the user's pipe pages are used
# up), keeps them open while a file exists, and says how many it grew.
PIPE_FILL = r"""
import fcntl, json, os, time
F_SETPIPE_SZ = 1031
held, err = [], None
for _ in range(%(max)d):
    r, w = os.pipe()
    try:
        fcntl.fcntl(w, F_SETPIPE_SZ, 1 << 20)
    except OSError as e:
        os.close(r)
        os.close(w)
        err = e.errno
        break
    os.close(w)  # the read end keeps the pipe and its pages
    held.append(r)
with open("/tmp/fill.%(tag)s", "w") as f:
    f.write(json.dumps({"grown": len(held), "errno": err}))
deadline = time.monotonic() + %(hold)d
while os.path.exists("/tmp/hold.%(tag)s") and time.monotonic() < deadline:
    time.sleep(0.1)
"""

PIPE_GROW = r"""
import fcntl, json, os
r, w = os.pipe()
try:
    print(json.dumps({"size": fcntl.fcntl(w, 1031, 1 << 20)}))
except OSError as e:
    print(json.dumps({"errno": e.errno}))
"""

ID_RANGE_BASE = 0x10000000  # src/coved/runtime/id_range.h
MAX_PIPES = 400  # 16384 pages (the default soft limit) / 256 pages is 64


def host_uid(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Uid:"):
                return int(line.split()[1])
    return None


def start_fill(coved, sid, tag, uid):
    kw = {} if uid is None else {"uid": uid}
    script = PIPE_FILL % {"max": MAX_PIPES, "tag": tag, "hold": 60}
    coved.sh(sid, f"touch /tmp/hold.{tag}; chmod 666 /tmp/hold.{tag}")
    coved.sh(sid, "cat > /tmp/fill.py <<'COVE_PY'\n" + script + "\nCOVE_PY")
    coved.sh(sid, "python3 /tmp/fill.py >/dev/null 2>&1 &", **kw)
    for _ in range(200):
        r = coved.exec(sid, f"cat /tmp/fill.{tag} 2>/dev/null")
        if r.stdout.strip():
            return json.loads(r.stdout)
        time.sleep(0.05)
    raise AssertionError(f"the pipe filler ({tag}) said nothing")


@pytest.mark.not_under("gvisor", reason="the sentry keeps its own descriptor and pipe tables: the host's per-user budgets do not apply")
def test_per_user_pipe_budget_is_not_shared(coved, make_sandbox):
    """Sandbox A's uid 1000, then its root, take every pipe page the kernel allows a user;
    sandbox B's uid 1000 and root can still grow a pipe to 1 MiB and B's agent still runs
    commands: the two sandboxes' users are different host users."""
    a, b = make_sandbox(), make_sandbox()
    try:
        for tag, uid in (("user", 1000), ("root", None)):
            filled = start_fill(coved, a, tag, uid)
            assert filled["errno"] == 1 and 0 < filled["grown"] < MAX_PIPES, filled
            # The budget is really used up in A, for that user...
            assert run_python(coved, a, PIPE_GROW, **({"uid": uid} if uid else {})) == \
                {"errno": 1}
            # ... and untouched in B.
            grown = run_python(coved, b, PIPE_GROW, **({"uid": uid} if uid else {}))
            assert grown == {"size": 1 << 20}, f"uid {uid or 0} of sandbox B: {grown}"
            assert coved.sh(b, "echo still-here") == "still-here\n"
        # Root of each sandbox is a host uid of its own, neither host root nor the other's.
        ua, ub = host_uid(sandbox_init_pid(a)), host_uid(sandbox_init_pid(b))
        assert ua != ub and 0 not in (ua, ub), (ua, ub)
    finally:
        for tag in ("user", "root"):
            coved.exec(a, f"rm -f /tmp/hold.{tag}")
    assert coved.health()["status"] == "healthy"
    for sid in (a, b):
        delete_and_check(coved, sid)


@pytest.mark.not_under("gvisor", reason="the sentry keeps its own descriptor and pipe tables: the host's per-user budgets do not apply")
def test_files_inside_keep_their_owners(coved, make_sandbox):
    """The template is seen through an idmapped mount: its root-owned files are root's inside,
    /home/user is uid 1000's, and a file made by uid 1000 is 1000's."""
    sid = make_sandbox()
    out = coved.sh(sid, "stat -c '%u:%g %n' /etc/passwd /etc /home/user /tmp /usr/bin/env")
    assert out.splitlines() == ["0:0 /etc/passwd", "0:0 /etc", "1000:1000 /home/user",
                                "0:0 /tmp", "65534:65534 /usr/bin/env"], out
    coved.sh(sid, "touch /home/user/mine", uid=1000)
    assert coved.sh(sid, "stat -c '%u:%g' /home/user/mine") == "1000:1000\n"
    r = coved.exec(sid, "echo x >> /etc/passwd", uid=1000)
    assert r.exit_code != 0, "uid 1000 wrote root's /etc/passwd"
    coved.sh(sid, "echo '# changed' >> /etc/passwd && chown 1000 /etc/hosts")
    assert coved.sh(sid, "stat -c '%u' /etc/passwd /etc/hosts") == "0\n1000\n"
    delete_and_check(coved, sid)


# Forks `procs` children; each raises its soft RLIMIT_NOFILE to the hard one and opens
# /dev/null until EMFILE (or a bound), then holds its files until told to stop.
FD_FILL = r"""
import json, os, resource, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
children = []
for i in range(%(procs)d):
    r, w = os.pipe()
    try:
        pid = os.fork()
    except OSError:  # out of pids
        os.close(r)
        os.close(w)
        break
    if pid == 0:
        os.close(r)
        n = 0
        try:
            while n < %(per_proc)d:
                os.open("/dev/null", os.O_RDONLY)
                n += 1
        except OSError:
            pass
        os.write(w, str(n).encode() + b"\n")
        deadline = time.monotonic() + 60
        while os.path.exists("/tmp/hold-fds") and time.monotonic() < deadline:
            time.sleep(0.1)
        os._exit(0)
    os.close(w)
    children.append(r)
held = sum(int(os.read(r, 64) or b"0") for r in children)
print(json.dumps({"soft": soft, "hard": hard, "held": held}), flush=True)
"""


def host_open_files():
    with open("/proc/sys/fs/file-nr") as f:
        return int(f.read().split()[0])


def file_max():
    with open("/proc/sys/fs/file-max") as f:
        return int(f.read())


@pytest.mark.not_under("gvisor", reason="the sentry keeps its own descriptor and pipe tables: the host's per-user budgets do not apply")
def test_default_nofile_fits_the_hosts_file_table(coved, make_sandbox):
    """A default sandbox's processes together cannot open more than its share (1/16) of the
    host's fs.file-max, and the default soft limit is no more than 1024."""
    sid = make_sandbox()
    soft, hard = (int(x) for x in coved.sh(sid, "ulimit -Sn; ulimit -Hn").split())
    pids = int(coved.sh(sid, "cat /sys/fs/cgroup/pids.max 2>/dev/null || "
                             "cat /sys/fs/cgroup/pids/pids.max"))
    assert 32 <= soft <= 1024 and soft <= hard, (soft, hard)
    assert hard * pids <= file_max() // 16, (hard, pids, file_max())
    # Root inside cannot raise the hard limit.
    r = coved.exec(sid, f"ulimit -Hn {hard + 1}")
    assert r.exit_code != 0
    delete_and_check(coved, sid)


@pytest.mark.not_under("gvisor", reason="the sentry keeps its own descriptor and pipe tables: the host's per-user budgets do not apply")
def test_nofile_request_is_honoured_or_refused(coved, make_sandbox):
    """resourceLimits.nofile sets the sandbox's RLIMIT_NOFILE; one that with its pids would
    exceed the sandbox's share of the host's file table is a 400 saying so."""
    sid = make_sandbox(limits={"cpu": "1", "memory": "512Mi", "pids": "64", "nofile": "100"})
    assert coved.sh(sid, "ulimit -Sn; ulimit -Hn") == "100\n100\n"
    # The agent itself keeps more, for the connections it serves; what it starts gets the
    # sandbox's limit, and cannot raise it.
    limits = open(f"/proc/{sandbox_init_pid(sid)}/limits").read()
    agent_files = [line.split()[3:5] for line in limits.splitlines()
                   if line.startswith("Max open files")][0]
    assert agent_files == ["2048", "2048"], limits
    assert coved.exec(sid, "ulimit -n 200").exit_code != 0
    delete_and_check(coved, sid)
    sid = make_sandbox(limits={"cpu": "1", "memory": "512Mi", "pids": "64", "nofile": "2000"})
    assert coved.sh(sid, "ulimit -Sn; ulimit -Hn") == "2000\n2000\n"
    delete_and_check(coved, sid)
    too_many = str(file_max() // 16 // 64 + 1)
    for limits in ({"pids": "64", "nofile": too_many},
                   {"pids": str(file_max() // 16 // 32 + 1)},  # leaves fewer than 32 each
                   {"nofile": "8"}, {"nofile": "lots"}):
        status, body, _ = coved.request("POST", "/v1/sandboxes", {
            "image": {"uri": "base"}, "entrypoint": ["sleep", "infinity"],
            "resourceLimits": dict({"cpu": "1", "memory": "512Mi"}, **limits)})
        assert status == 400 and body["code"] == "SANDBOX::INVALID_PARAMETER", (limits, body)
        assert "nofile" in body["message"] or "open files" in body["message"], body
    assert coved.health()["status"] == "healthy"


@pytest.mark.not_under("gvisor", reason="the sentry keeps its own descriptor and pipe tables: the host's per-user budgets do not apply")
def test_fd_flood_stays_within_the_sandbox_share(coved, make_sandbox):
    """A sandbox forks processes that each open files until EMFILE: the host's allocated files
    grow by no more than the sandbox's share of fs.file-max; another sandbox and coved work."""
    procs = 14  # with the agent, a shell and the parent: within 20 pids
    sid = make_sandbox(limits={"cpu": "1", "memory": "1Gi", "pids": "20"})
    other = make_sandbox()
    budget = file_max() // 16
    before = host_open_files()
    coved.sh(sid, "touch /tmp/hold-fds")
    result = {}
    t = threading.Thread(target=lambda: result.update(r=run_python(
        coved, sid, FD_FILL % {"procs": procs, "per_proc": 40000})))
    t.start()
    try:
        t.join(120)
        assert not t.is_alive(), "the fd flood did not finish"
        held = result["r"]
        grew = host_open_files() - before
        print("fd flood:", held, "host files grew by", grew, "budget", budget)
        assert held["held"] > 0
        assert held["held"] <= budget and grew <= budget, (held, grew, budget)
        # While the files are held: another sandbox runs commands and opens files, coved
        # answers.
        assert coved.sh(other, "python3 -c 'import os; print(len([os.open(\"/dev/null\", 0) "
                               "for _ in range(50)]))'") == "50\n"
        assert coved.health()["status"] == "healthy"
    finally:
        coved.exec(sid, "rm -f /tmp/hold-fds")
    for s in (sid, other):
        delete_and_check(coved, s)


def stored_slots(coved):
    con = sqlite3.connect(os.path.join(coved.state_dir, "cove.db"))
    try:
        return dict(con.execute("SELECT id, id_slot FROM sandboxes"))
    finally:
        con.close()


@pytest.mark.native_only(reason="host id ranges are the native (and crun) sandboxes' user namespaces; runsc's sentry maps its own (host_id_base 0)")
def test_id_ranges_are_kept_across_restarts(fresh_coved):
    """A sandbox's id range is stored with it and still its own after coved restarts: new
    sandboxes get other ranges, and a deleted sandbox's range is not handed out at once."""
    d = fresh_coved.start()
    a, b = d.create(), d.create()
    uid = lambda sid: host_uid(sandbox_init_pid(sid))
    before = {sid: uid(sid) for sid in (a, b)}
    slots = stored_slots(d)
    for sid in (a, b):
        assert before[sid] == ID_RANGE_BASE + slots[sid] * 65536, (before, slots)
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait(10)
    d.proc.stdout.close()
    d.start()
    assert stored_slots(d) == slots
    c = d.create()
    d.delete(a)
    e = d.create()
    uids = [uid(sid) for sid in (b, c, e)] + [before[a]]
    assert uids[0] == before[b]
    assert len(set(uids)) == 4, uids  # nor a's, just freed
    for sid in (b, c, e):
        assert d.sh(sid, "id -u; stat -c %u /etc/passwd") == "0\n0\n"
        d.delete(sid)
        assert sandbox_leftovers(d, sid) == []


def test_store_from_before_id_ranges_is_read(fresh_coved):
    """A database without the id_slot column (coved before per-sandbox ranges) gets it: its
    sandboxes are re-adopted, and new ones are made."""
    d = fresh_coved.start()
    sid = d.create()
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait(10)
    d.proc.stdout.close()
    con = sqlite3.connect(os.path.join(d.state_dir, "cove.db"))
    con.execute("ALTER TABLE sandboxes DROP COLUMN id_slot")
    con.execute("PRAGMA user_version = 0")  # as every Cove before schema versions left it
    con.commit()
    con.close()
    d.start()
    assert d.get(sid)["status"]["state"] == "Running"
    assert stored_slots(d)[sid] == -1  # the shared range it is taken to have
    other = d.create()
    assert d.sh(other, "echo ok") == "ok\n"
    for s in (sid, other):
        d.delete(s)
        assert sandbox_leftovers(d, s) == []


def test_file_share_setting_and_startup_log(tmp_path):
    """sandbox_file_share (INI < COVE_SANDBOX_FILE_SHARE < --sandbox-file-share) sets each
    sandbox's share; coved says at start what a default sandbox gets; bad values refuse to
    start."""
    ini = tmp_path / "coved.ini"
    ini.write_text("[server]\nsandbox_file_share = 4\n")
    for env, args, share in (({"COVE_CONFIG": str(ini)}, [], 4),
                             ({"COVE_CONFIG": str(ini), "COVE_SANDBOX_FILE_SHARE": "32"}, [], 32),
                             ({"COVE_SANDBOX_FILE_SHARE": "32"}, ["--sandbox-file-share", "64"],
                              64)):
        d = Coved(extra_args=args, env=dict(os.environ, **env))
        try:
            d.start()
            sid = d.create()
            hard = int(d.sh(sid, "ulimit -Hn"))
            assert hard == min(4096, file_max() // share // 1024), (share, hard)
            assert f"1/{share} of it" in d.log() or f"/ {share})" in d.log(), d.log()
            d.delete(sid)
        finally:
            d.cleanup()
    for bad in ("0", "-3", "x", "70000"):
        r = subprocess.run([COVED, "--insecure", "--state-dir", str(tmp_path / "s"), "--listen",
                            "127.0.0.1:0", "--sandbox-file-share", bad],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and "sandbox_file_share" in r.stderr, (bad, r.stderr)
