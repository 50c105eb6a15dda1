"""Sandboxes run by an OCI runtime (crun) and by gVisor (runsc): extensions.runtime on create.
The same API as a native sandbox: commands, files, the gateway, pause and resume, egress
denied by default, and nothing left on the host once deleted."""
import os
import shutil
import signal
import socket
import stat
import threading
import time

import pytest

from covetest import AGENT_PORT, ApiError, cgroup_file, sandbox_host_pids, sandbox_leftovers
from covetest import serve
from test_files import call, download, stat_in, upload

RUNTIMES = [
    pytest.param("oci", marks=pytest.mark.skipif(shutil.which("crun") is None,
                                                 reason="no crun here")),
    pytest.param("gvisor", marks=pytest.mark.skipif(
        shutil.which("runsc") is None and not os.path.exists("/usr/sbin/runsc"),
        reason="no runsc here")),
]


def wait_state(coved, sid, want, timeout=30):
    deadline = time.monotonic() + timeout
    while True:
        state = coved.get(sid)["status"]["state"]
        if state == want or time.monotonic() > deadline:
            return state
        time.sleep(0.05)


def delete_leaving_nothing(d, sid):
    d.delete(sid)
    deadline = time.monotonic() + 10
    while sandbox_leftovers(d, sid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sandbox_leftovers(d, sid) == []


@pytest.fixture(params=RUNTIMES)
def runtime_sandbox(request, coved):
    sid = coved.create(extensions={"runtime": request.param})
    assert wait_state(coved, sid, "Running") == "Running", coved.get(sid)
    yield request.param, sid
    try:
        coved.delete(sid)
    except ApiError:
        pass


def test_runtime_is_the_one_asked_for(coved, runtime_sandbox):
    kind, sid = runtime_sandbox
    assert coved.get(sid)["extensions"]["runtime"] == kind
    # gVisor's sentry answers uname with its own kernel, not the host's.
    inside = coved.sh(sid, "uname -r").strip()
    if kind == "gvisor":
        assert inside != os.uname().release, inside
    else:
        assert inside == os.uname().release, inside
        # root inside is an unprivileged host range, as for a native sandbox
        uid_map = coved.sh(sid, "cat /proc/self/uid_map").split()
        assert uid_map[0] == "0" and int(uid_map[1]) > 65535, uid_map
        # Cove's seccomp profile holds the agent and everything it starts, as natively.
        assert "Seccomp:\t2" in coved.sh(sid, "cat /proc/self/status")
        r = coved.exec(sid, "unshare -U true")
        assert r.exit_code != 0 and "Operation not permitted" in r.stderr, r.stderr
    # The agent is PID 1 of the sandbox, and its hostname is the sandbox's id.
    assert coved.sh(sid, "hostname").strip() == sid
    assert "cove-agent" in coved.sh(sid, "tr '\\0' ' ' < /proc/1/cmdline")


def test_commands_and_files(coved, runtime_sandbox):
    kind, sid = runtime_sandbox
    r = coved.exec(sid, "echo out; echo err >&2; exit 3")
    assert (r.stdout.strip(), r.stderr.strip(), r.exit_code) == ("out", "err", 3)
    assert coved.sh(sid, "python3 -c 'print(6*7)'").strip() == "42"
    content = os.urandom(3000) + b"end"
    status, _, _ = upload(coved, sid, [({"path": "/tmp/blob.bin"}, content)])
    assert status == 200
    assert coved.sh(sid, "wc -c < /tmp/blob.bin").strip() == str(len(content))
    status, data, _ = download(coved, sid, "/tmp/blob.bin")
    assert (status, data) == (200, content)
    coved.sh(sid, "printf written-inside > /root/inside.txt")
    status, data, _ = download(coved, sid, "/root/inside.txt")
    assert (status, data) == (200, b"written-inside")


def test_upload_into_a_new_directory(coved, runtime_sandbox):
    _, sid = runtime_sandbox
    status, body, _ = upload(coved, sid, [({"path": "/tmp/new/dir/f.txt"}, b"deep")])
    assert status == 200, body
    assert coved.sh(sid, "cat /tmp/new/dir/f.txt").strip() == "deep"
    # the directories made on the way: the default owner, 0755; and an owner changed later
    assert coved.sh(sid, "find /tmp/new /tmp/new/dir -maxdepth 0 -printf '%U %G %m\\n'").split() == \
        ["0", "0", "755"] * 2
    # an owner changed later, through the agent's O_PATH descriptor of the file
    status, body, _ = call(coved, sid, "POST", "/files/permissions",
                           body={"/tmp/new/dir/f.txt": {"owner": "nobody", "mode": 600}})
    assert status == 200, body
    assert stat_in(coved, sid, "/tmp/new/dir/f.txt")[::2] == ["nobody", "600"]


def test_gateway_reaches_a_port_inside(coved, runtime_sandbox):
    _, sid = runtime_sandbox
    coved.exec(sid, "cd /tmp && echo served > index.html && "
               "nohup python3 -m http.server 8123 >/dev/null 2>&1 &")
    deadline = time.monotonic() + 20
    while True:
        status, body, _ = coved.request("GET", f"/sandboxes/{sid}/proxy/8123/index.html",
                                        headers={k: v for k, v in coved.headers().items()
                                                 if k != "Content-Type"})
        if status == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert status == 200 and "served" in str(body), (status, body)


def test_pause_keeps_memory_and_resume_goes_on(coved, runtime_sandbox):
    _, sid = runtime_sandbox
    # Written aside and renamed: a read never meets the file truncated and not yet written.
    coved.exec(sid, "nohup sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; "
               "mv /tmp/count.new /tmp/count; sleep 0.05; done' >/dev/null 2>&1 &")
    time.sleep(0.5)
    coved.pause(sid)
    assert wait_state(coved, sid, "Paused") == "Paused"
    assert sandbox_host_pids(sid), "the runtime's processes are in the sandbox's cgroup"
    # The freezer holds every one of them (v1; v2 says so in cgroup.events).
    state = cgroup_file(sid, "freezer", "freezer.state")
    if state is not None:
        assert state == "FROZEN", state
    else:
        assert "frozen 1" in cgroup_file(sid, "", "cgroup.events")
    time.sleep(0.3)
    coved.resume(sid)
    assert wait_state(coved, sid, "Running") == "Running"
    first = int(coved.sh(sid, "cat /tmp/count"))
    time.sleep(0.4)
    assert int(coved.sh(sid, "cat /tmp/count")) > first, "the loop goes on after resume"


def test_egress_is_denied_by_default(coved, runtime_sandbox):
    _, sid = runtime_sandbox
    # A listener on a loopback address of the host: the sandbox must not reach it.
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.77.0.9", 0))
    srv.listen(4)
    srv.settimeout(0.2)
    port = srv.getsockname()[1]
    accepted = []

    def accept():
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            try:
                accepted.append(srv.accept()[0])
            except socket.timeout:
                pass
    t = threading.Thread(target=accept)
    t.start()
    r = coved.exec(sid, f"python3 -c \"import socket; s=socket.create_connection(('127.77.0.9', "
                        f"{port}), timeout=3); s.sendall(b'x'); print('sent', s.recv(1))\"")
    r2 = coved.exec(sid, "python3 -c \"import socket; print(socket.gethostbyname('example.com'))\"")
    t.join()
    srv.close()
    assert accepted == [], "the sandbox reached a host address"
    assert "sent b'x'" not in r.stdout
    assert r2.exit_code != 0, r2.stdout


def test_delete_leaves_nothing(coved):
    for param in RUNTIMES:
        kind = param.values[0]
        if any(m.args and m.args[0] for m in param.marks):
            continue
        sid = coved.create(extensions={"runtime": kind})
        assert wait_state(coved, sid, "Running") == "Running"
        coved.sh(sid, "echo x > /tmp/x")
        coved.pause(sid)
        assert wait_state(coved, sid, "Paused") == "Paused"
        coved.delete(sid)  # a paused one too
        deadline = time.monotonic() + 10
        while sandbox_leftovers(coved, sid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sandbox_leftovers(coved, sid) == [], kind
        for p in os.listdir("/proc"):
            if p.isdigit():
                try:
                    cmd = open(f"/proc/{p}/cmdline", "rb").read()
                except OSError:
                    continue
                assert sid.encode() not in cmd, (kind, p, cmd)


def test_agent_death_fails_the_sandbox(coved, runtime_sandbox):
    kind, sid = runtime_sandbox
    pid = sandbox_host_pids(sid)
    assert pid
    # kill the sandbox's PID 1 as the host sees it (crun: the agent; runsc: its sentry)
    target = None
    for p in pid:
        try:
            cmd = open(f"/proc/{p}/cmdline", "rb").read()
        except OSError:
            continue
        if (kind == "oci" and cmd.startswith(b"/run/cove/cove-agent")) or \
                (kind == "gvisor" and cmd.startswith(b"runsc-sandbox")):
            target = p
            break
    assert target is not None, pid
    # PID 1 is not coved's child but that of the sandbox's cove-shim, which is coved's.
    shim = int(open(f"/proc/{target}/stat").read().rsplit(")", 1)[1].split()[1])
    assert open(f"/proc/{shim}/comm").read().strip() == "cove-shim"
    assert int(open(f"/proc/{shim}/stat").read().rsplit(")", 1)[1].split()[1]) == coved.proc.pid
    os.kill(target, 9)
    assert wait_state(coved, sid, "Failed", timeout=15) == "Failed"
    # How PID 1 ended is known, as for a native sandbox; and nothing of it is left: no shim,
    # no runtime process, no zombie under coved.
    assert "killed by signal 9" in coved.get(sid)["status"]["message"], coved.get(sid)
    assert not os.path.exists(f"/proc/{shim}"), shim
    deadline = time.monotonic() + 10
    while sandbox_host_pids(sid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sandbox_host_pids(sid) == []
    kids = [k for t in os.listdir(f"/proc/{coved.proc.pid}/task")
            for k in open(f"/proc/{coved.proc.pid}/task/{t}/children").read().split()]
    states = [open(f"/proc/{k}/stat").read().rsplit(")", 1)[1].split()[0] for k in kids
              if os.path.exists(f"/proc/{k}/stat")]
    assert "Z" not in states, kids


def test_unknown_runtime_is_a_400_listing_them(coved):
    status, body, _ = coved.request("POST", "/v1/sandboxes", {
        "image": {"uri": "base"}, "entrypoint": ["sleep", "infinity"],
        "extensions": {"runtime": "kata"}})
    assert status == 400 and body["code"] == "SANDBOX::INVALID_PARAMETER", body
    for name in ("native", "oci", "gvisor"):
        assert name in body["message"]
    status, body, _ = coved.request("POST", "/v1/sandboxes", {
        "image": {"uri": "base"}, "entrypoint": ["sleep", "infinity"],
        "extensions": {"runtime": 3}})
    assert status == 400, body


@pytest.mark.native_only(reason="checks the default of a daemon given no --default-runtime")
def test_native_is_the_default(coved):
    sid = coved.create()
    try:
        assert coved.get(sid)["extensions"]["runtime"] == "native"
        assert coved.sh(sid, "uname -r").strip() == os.uname().release
    finally:
        coved.delete(sid)


assert AGENT_PORT == 44772


@pytest.mark.parametrize("kind", RUNTIMES)
def test_sandbox_survives_a_daemon_kill(fresh_coved, kind):
    d = fresh_coved.start()
    sid = d.create(extensions={"runtime": kind})
    assert wait_state(d, sid, "Running") == "Running"
    d.sh(sid, "echo kept > /tmp/marker")
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait(10)
    d.start()
    assert d.get(sid)["status"]["state"] == "Running"
    assert d.get(sid)["extensions"]["runtime"] == kind
    assert d.sh(sid, "cat /tmp/marker").strip() == "kept"
    d.delete(sid)
    deadline = time.monotonic() + 10
    while sandbox_leftovers(d, sid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sandbox_leftovers(d, sid) == []


def test_snapshot_is_a_409_for_these_runtimes(coved, runtime_sandbox):
    kind, sid = runtime_sandbox
    status, body, _ = coved.request("POST", f"/v1/sandboxes/{sid}/snapshots", {})
    assert status == 409 and body["code"] == "SNAPSHOT::UNSUPPORTED", body
    assert coved.sh(sid, "echo still").strip() == "still"


def test_gvisor_agent_socket_cannot_be_swapped_for_a_host_path(coved):
    if shutil.which("runsc") is None:
        pytest.skip("no runsc here")
    sid = coved.create(extensions={"runtime": "gvisor"})
    try:
        assert wait_state(coved, sid, "Running") == "Running"
        # The socket's directory is the sandbox's to change: a link there to a host socket
        # must not become coved's way in.
        # (gVisor may refuse some of it: whatever it allows, coved's way in stays the agent.)
        r = coved.exec(sid, "ln -s /run/systemd/private /run/cove/sock/evil; "
                            "mv -f /run/cove/sock/evil /run/cove/sock/agent.sock; "
                            "rm -f /run/cove/sock/agent.sock; "
                            "ln -s /run/systemd/private /run/cove/sock/agent.sock; ls -l /run/cove/sock")
        print(r.stdout, r.stderr)
        host = os.path.join(coved.run_dir(sid), "agent.sock")
        assert not os.path.islink(host)
        assert stat.S_ISSOCK(os.lstat(host).st_mode)
        assert coved.sh(sid, "echo still-the-agent").strip() == "still-the-agent"
    finally:
        coved.delete(sid)


@pytest.mark.parametrize("kind", RUNTIMES)
def test_code_contexts(coved, kind):
    """crun passes cove-kernel to the agent (fd 5): kernels keep their state. runsc passes
    no descriptor: code contexts are refused with a clear 4xx, never a hang."""
    from test_code_interpreter import run_code
    sid = coved.create(template="code-interpreter", limits={"cpu": "1", "memory": "1Gi"},
                       extensions={"runtime": kind})
    try:
        assert wait_state(coved, sid, "Running") == "Running"
        first = run_code(coved, sid, "x = 20 + 1\nprint('set')", context={"language": "python"})
        if kind == "gvisor":
            assert 400 <= first.status < 500, first.raw
            return
        assert first.status == 200 and "set" in first.stdout, first.raw
        again = run_code(coved, sid, "print(x * 2)", context={"language": "python"})
        assert "42" in again.stdout, again.raw
    finally:
        coved.delete(sid)


@pytest.mark.static_agent  # a busybox root: no libc for the sanitizer pass's dynamic agent
def test_a_templates_default_runtime(tmp_path):
    """A template registered with a runtime gives it to the sandboxes made from it that name
    none; a create's own runtime still wins; a bad one is a 400 that registers nothing."""
    admin = "runtime-template-admin"
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    shutil.copy("/bin/busybox", root / "bin" / "busybox")
    for tool in ("sh", "cat", "sleep", "uname"):
        os.symlink("busybox", root / "bin" / tool)
    with serve(admin_keys=(admin,)) as d:
        headers = {"OPEN-SANDBOX-API-KEY": admin, "Content-Type": "application/json"}
        status, body, _ = d.request("POST", "/v1/templates",
                                    {"name": "walled", "rootfs": str(root), "runtime": "nope"},
                                    headers=headers)
        assert (status, body["code"]) == (400, "TEMPLATE::INVALID_RUNTIME"), body
        status, body, _ = d.request("POST", "/v1/templates",
                                    {"name": "walled", "rootfs": str(root), "runtime": "gvisor"},
                                    headers=headers)
        assert status == 201, body
        listed = {t["name"]: t for t in d.ok("GET", "/v1/templates")["items"]}
        assert listed["walled"]["runtime"] == "gvisor"
        sid = d.create(template="walled", entrypoint=["/bin/sleep", "600"])
        assert d.get(sid)["extensions"]["runtime"] == "gvisor"
        # gVisor's own kernel answers uname
        assert "gVisor" in d.sh(sid, "cat /proc/version") or d.sh(sid, "uname -r") != \
            os.uname().release
        d.delete(sid)
        sid = d.create(template="walled", entrypoint=["/bin/sleep", "600"],
                       extensions={"runtime": "native"})
        assert d.get(sid)["extensions"]["runtime"] == "native"
        d.delete(sid)


RUNC = shutil.which("runc") or ("/usr/sbin/runc" if os.path.exists("/usr/sbin/runc") else None)


@pytest.mark.skipif(RUNC is None, reason="no runc here")
def test_runc_as_the_oci_runtime():
    """runc mounts the container's root from inside its user namespace (crun before it): the
    same sandbox all the same, in an unprivileged id range, in Cove's cgroups, paused by
    their freezer, and gone without a trace."""
    from covetest import serve
    with serve("--oci-runtime", RUNC) as d:
        sid = d.create(extensions={"runtime": "oci"})
        assert wait_state(d, sid, "Running") == "Running", d.get(sid)
        r = d.exec(sid, "echo out; echo err >&2; exit 3")
        assert (r.stdout.strip(), r.stderr.strip(), r.exit_code) == ("out", "err", 3)
        uid_map = d.sh(sid, "cat /proc/self/uid_map").split()
        assert uid_map[0] == "0" and int(uid_map[1]) > 65535, uid_map
        assert "Seccomp:\t2" in d.sh(sid, "cat /proc/self/status")
        assert d.sh(sid, "hostname").strip() == sid
        assert d.sh(sid, "ls /sys/class/net").split() == ["lo"]
        status, _, _ = upload(d, sid, [({"path": "/tmp/new/f.txt"}, b"runc")])
        assert status == 200
        assert download(d, sid, "/tmp/new/f.txt")[:2] == (200, b"runc")
        assert sandbox_host_pids(sid), "the container's processes are in the sandbox's cgroup"
        d.pause(sid)
        assert wait_state(d, sid, "Paused") == "Paused"
        d.resume(sid)
        assert wait_state(d, sid, "Running") == "Running"
        assert d.sh(sid, "cat /tmp/new/f.txt") == "runc\n"
        delete_leaving_nothing(d, sid)


def test_coreutils_stat_and_ls_work(coved, runtime_sandbox):
    """coreutils pass AT_NO_AUTOMOUNT to statx, which this runsc's sentry refuses (EINVAL):
    `ls /` failed in every gVisor sandbox until cove-gvisor-compat.so was preloaded there."""
    kind, sid = runtime_sandbox
    out = coved.sh(sid, "mkdir -p /tmp/d && echo 12345 > /tmp/d/f && ls /tmp/d && "
                        "stat -c '%s %F' /tmp/d/f && ls -ld / >/dev/null && echo ok")
    assert out == "f\n6 regular file\nok\n", (kind, out)


@pytest.mark.parametrize("kind", RUNTIMES)
def test_entrypoint_that_cannot_start_fails_the_create(coved, kind):
    """As natively: the create is a clear failure naming why, not a Running sandbox whose
    entrypoint never ran (runsc's agent says so through its --ready-file)."""
    status, body, _ = coved.request("POST", "/v1/sandboxes", {
        "image": {"uri": "base"}, "entrypoint": ["/no/such/program"],
        "extensions": {"runtime": kind}})
    if status == 202:
        state = wait_state(coved, body["id"], "Failed")
        info = coved.get(body["id"])
        coved.delete(body["id"])
        assert state == "Failed", info
        message = info["status"]["message"]
    else:
        assert status >= 400, body
        message = body["message"]
    assert "No such file" in message and "/no/such/program" in message, message


def shim_of(sid):
    """Host pid of the sandbox's cove-shim: the parent of its PID 1 (or sentry)."""
    for p in sandbox_host_pids(sid):
        try:
            ppid = int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1])
            if open(f"/proc/{ppid}/comm").read().strip() == "cove-shim":
                return ppid
        except OSError:
            continue
    return None


def test_a_killed_shim_loses_nothing(coved, runtime_sandbox):
    """The shim is outside the sandbox's cgroups (its own, not coved's: a service manager
    stopping coved leaves it); killed from outside, the sandbox runs on and is deleted clean."""
    kind, sid = runtime_sandbox
    shim = shim_of(sid)
    assert shim is not None, sandbox_host_pids(sid)
    assert shim not in sandbox_host_pids(sid)
    cg = open(f"/proc/{shim}/cgroup").read()
    assert "/cove/shims" in cg and sid not in cg, cg
    os.kill(shim, signal.SIGKILL)
    time.sleep(0.5)
    assert coved.get(sid)["status"]["state"] == "Running", coved.get(sid)
    assert coved.sh(sid, "echo alive") == "alive\n"
    delete_leaving_nothing(coved, sid)
