"""Root inside a sandbox tries to reach the kernel and the host: mounts, modules, reboot,
sysctls, other processes, its own limits, namespaces, chroot tricks. Everything fails, and
the host is unchanged afterwards."""

import ctypes
import hashlib
import os
import socket
import threading
import time

import pytest

from hostile import delete_and_check, host_sysctls, run_python
from covetest import AGENT, cgroup_file, sandbox_init_pid

# x86_64 syscall numbers; each attempt records "ok" or the errno name.
SYSCALL_SCRIPT = r"""
import ctypes, errno, json, os, resource, stat
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
res = {}
def rec(name, ok):
    res[name] = "ok" if ok else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
def wide(args):  # variadic: every integer as a full 64-bit long
    return [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
def sc(name, nr, *args):
    ctypes.set_errno(0)
    rec(name, libc.syscall(ctypes.c_long(nr), *wide(args)) >= 0)
COVED = %(coved)d
buf = ctypes.create_string_buffer(4096)
os.makedirs("/tmp/mnt", exist_ok=True)
sc("mount tmpfs", 165, b"none", b"/tmp/mnt", b"tmpfs", 0, None)
sc("mount proc", 165, b"proc", b"/tmp/mnt", b"proc", 0, None)
sc("mount cgroup", 165, b"cgroup", b"/tmp/mnt", b"cgroup", 0, b"pids")
sc("bind / over /usr", 165, b"/tmp", b"/usr", None, 4096 | 16384, None)  # MS_BIND|MS_REC
sc("remount /usr rw", 165, None, b"/usr", None, 32 | 4096, None)  # MS_REMOUNT|MS_BIND
sc("umount /usr", 166, b"/usr", 2)
sc("umount /proc/kcore mask", 166, b"/proc/kcore", 2)
sc("pivot_root", 155, b"/tmp", b"/tmp/mnt")
sc("init_module", 175, buf, 4096, b"")
fd = os.open("/usr/bin/true", os.O_RDONLY)
sc("finit_module", 313, fd, b"", 0)
sc("delete_module", 176, b"ext4", 0)
sc("kexec_load", 246, 0, 0, None, 0)
sc("reboot", 169, 0xfee1dead, 672274793, 0x01234567, None)
sc("swapon", 167, b"/tmp/swap", 0)
sc("acct", 163, b"/tmp/acct")
sc("syslog read", 103, 3, buf, 4096)
sc("sethostname", 170, b"pwned", 5)
sc("setdomainname", 171, b"pwned", 5)
sc("settimeofday", 164, buf, None)
sc("clock_settime", 227, 0, buf)
sc("iopl", 172, 3)
sc("ioperm", 173, 0x80, 1, 1)
sc("keyctl join", 250, 1, None)
sc("bpf map create", 321, 0, buf, 72)
sc("perf_event_open", 298, buf, 0, -1, -1, 0)
sc("userfaultfd", 323, 0)
sc("io_uring_setup", 425, 8, buf)
sc("open_by_handle_at", 304, fd, buf, 0)
sc("unshare user", 272, 0x10000000)
sc("unshare mount", 272, 0x00020000)
sc("unshare net", 272, 0x40000000)
sc("unshare cgroup", 272, 0x02000000)
sc("unshare time", 272, 0x00000080)
def clone(name, nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *wide(args))
    if r == 0:
        os._exit(0)  # a child after all: gone at once
    if r > 0:
        os.waitpid(r, 0)
    rec(name, r >= 0)
clone("clone newuser", 56, 0x10000000 | 17, None, None, None, 0)
clone("clone newns", 56, 0x00020000 | 17, None, None, None, 0)
clone("clone newnet", 56, 0x40000000 | 17, None, None, None, 0)
args = (ctypes.c_uint64 * 11)(0x10000000, 0, 0, 0, 17, 0, 0, 0, 0, 0, 0)
clone("clone3 newuser", 435, args, 88)
nsfd = os.open("/proc/self/ns/mnt", os.O_RDONLY)
sc("setns mnt", 308, nsfd, 0)
sc("ptrace attach coved", 101, 16, COVED, None, None)
sc("kill coved", 62, COVED, 9)
sc("kill coved group", 62, -COVED, 9)
sc("pidfd_open coved", 434, COVED, 0)
class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
local = IoVec(ctypes.addressof(buf), 64)
remote = IoVec(0x400000, 64)
sc("process_vm_readv coved", 310, COVED, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
try:
    os.mknod("/tmp/sda", stat.S_IFBLK | 0o600, os.makedev(8, 0)); rec("mknod block", True)
except OSError as e:
    res["mknod block"] = errno.errorcode.get(e.errno)
try:
    os.mknod("/tmp/mem", stat.S_IFCHR | 0o600, os.makedev(1, 1)); rec("mknod /dev/mem", True)
except OSError as e:
    res["mknod /dev/mem"] = errno.errorcode.get(e.errno)
for lim in ("RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_MEMLOCK", "RLIMIT_AS", "RLIMIT_CORE"):
    r = getattr(resource, lim)
    soft, hard = resource.getrlimit(r)
    if hard == resource.RLIM_INFINITY:
        continue
    try:
        resource.setrlimit(r, (hard * 4 + 1, hard * 4 + 1)); res["raise " + lim] = "ok"
    except (ValueError, OSError) as e:
        res["raise " + lim] = type(e).__name__
for path, data in [("/proc/sys/kernel/hostname", "pwned"), ("/proc/sys/vm/drop_caches", "3"),
                   ("/proc/sys/kernel/core_pattern", "|/tmp/evil"),
                   ("/proc/sys/net/ipv4/ip_forward", "1"), ("/proc/sys/kernel/panic", "1"),
                   ("/proc/sysrq-trigger", "h"), ("/sys/kernel/uevent_helper", "/tmp/evil"),
                   ("/sys/fs/cgroup/pids.max", "max"), ("/sys/fs/cgroup/cgroup.procs", "1"),
                   ("/proc/1/exe", "x"), ("/proc/self/exe", "x"),
                   ("/proc/1/oom_score_adj", "-1000"),
                   ("/proc/self/oom_score_adj", "-1000"), ("/proc/1/attr/current", "x"),
                   ("/dev/kmsg", "x"), ("/dev/mem", "x"), ("/dev/sda", "x"), ("/dev/vda", "x")]:
    try:
        fd = os.open(path, os.O_WRONLY)  # never O_CREAT: a new plain file proves nothing
        os.write(fd, data.encode())
        os.close(fd)
        res["write " + path] = "ok"
    except OSError as e:
        res["write " + path] = errno.errorcode.get(e.errno, str(e.errno))
try:
    os.mkdir("/sys/fs/cgroup/escape"); res["mkdir cgroup"] = "ok"
except OSError as e:
    res["mkdir cgroup"] = errno.errorcode.get(e.errno)
try:
    res["read /proc/kcore"] = "ok" if open("/proc/kcore", "rb").read(64) else "empty"
except OSError as e:
    res["read /proc/kcore"] = errno.errorcode.get(e.errno)
print(json.dumps(res))
"""

# The i386 entry point (int 0x80) must not bypass the x86_64 filter: unshare(CLONE_NEWUSER)
# through it is killed (bad architecture) or refused, never granted.
INT80_SCRIPT = r"""
import ctypes, mmap, json, os, subprocess, sys
code = r'''
import ctypes, mmap, os
m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
m.write(bytes([0xB8, 0x36, 0x01, 0, 0, 0xBB, 0, 0, 0, 0x10, 0xCD, 0x80, 0xC3]))
f = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))
before = os.readlink("/proc/self/ns/user")
rc = f()
print(rc, before != os.readlink("/proc/self/ns/user"))
'''
p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
print(json.dumps({"returncode": p.returncode, "stdout": p.stdout, "stderr": p.stderr[-300:]}))
"""

ESCAPE_SCRIPT = r"""
import json, os
out = {}
os.makedirs("/tmp/jail/inner", exist_ok=True)
real_root = os.open("/", os.O_RDONLY)
os.chdir("/tmp/jail")
os.chroot("inner")            # cwd stays outside the new root
for _ in range(64):
    os.chdir("..")
os.chroot(".")
out["chroot_dotdot"] = sorted(os.listdir("/"))
os.fchdir(real_root)
for _ in range(64):
    os.chdir("..")
os.chroot(".")
out["fchdir"] = sorted(os.listdir("/"))
try:
    out["proc1root"] = sorted(os.listdir("/proc/1/root"))
except PermissionError:
    out["proc1root"] = ["proc"]  # the agent's root is not even ours to look at
out["marker"] = [p for p in %(paths)r if os.path.exists(p)]
print(json.dumps(out))
"""

SHELL_ATTEMPTS = [
    "unshare -Urm true", "unshare -m true", "unshare -n true", "unshare -fp true",
    "unshare -Ur true", "nsenter -t 1 -m true", "nsenter -t 1 -U true",
    "mount -t tmpfs none /mnt", "mount -t proc proc /mnt", "mount -t cgroup -o pids none /mnt",
    "mount -t sysfs none /mnt", "mount --bind /tmp /usr", "umount -l /proc",
    "hostname pwned", "date -s '2001-01-01'", "sysctl -w kernel.panic=1",
    "echo 1 > /proc/sys/kernel/sysrq", "ip link add d0 type dummy", "ip link set lo down",
    "modprobe dummy", "insmod /tmp/evil.ko",
]


def host_state(coved, sid, markers):
    try:
        with open("/proc/modules") as f:
            modules = sorted(l.split()[0] for l in f)
    except FileNotFoundError:  # a kernel without loadable modules
        modules = None
    with open(AGENT, "rb") as f:
        agent_sum = hashlib.sha256(f.read()).hexdigest()
    return {
        "sysctls": host_sysctls(),
        "hostname": socket.gethostname(),
        "modules": modules,
        "agent": agent_sum,
        "limits": [cgroup_file(sid, "pids", "pids.max"),
                   cgroup_file(sid, "memory", "memory.limit_in_bytes") or
                   cgroup_file(sid, "memory", "memory.max")],
        "markers": markers.intact(),
    }


@pytest.mark.not_under("gvisor", reason="this runsc emulates no /proc/self/ns")
def test_kernel_and_host_operations_fail(coved, make_sandbox, host_markers):
    sid = make_sandbox(limits={"cpu": "1", "memory": "256Mi", "pids": "64"})
    before = host_state(coved, sid, host_markers)
    coved_pid = coved.proc.pid

    res = run_python(coved, sid, SYSCALL_SCRIPT % {"coved": coved_pid})
    print("attempts from inside:", res)
    allowed = {k: v for k, v in res.items() if v == "ok"}
    assert allowed == {}, f"allowed inside the sandbox: {allowed}"
    # Things outside are not merely protected but absent.
    assert res["kill coved"] == "ESRCH" and res["ptrace attach coved"] == "ESRCH", res

    r = run_python(coved, sid, INT80_SCRIPT)
    out = r["stdout"].split()
    granted = r["returncode"] == 0 and out and (out[0] == "0" or out[1] == "True")
    assert not granted, f"unshare(CLONE_NEWUSER) through int 0x80 succeeded: {r}"
    print("int 0x80 unshare(CLONE_NEWUSER):", r)

    for cmd in SHELL_ATTEMPTS:
        res = coved.exec(sid, cmd)
        assert res.exit_code != 0, f"{cmd!r} succeeded inside: {res.stdout} {res.stderr}"

    esc = run_python(coved, sid, ESCAPE_SCRIPT % {"paths": host_markers.paths})
    for key in ("chroot_dotdot", "fchdir", "proc1root"):
        assert "work" not in esc[key] and "proc" in esc[key], f"{key}: {esc[key]}"
    assert esc["marker"] == []

    # Signals to everything it can see reach only the sandbox: PID 1 (the agent) stays.
    agent = sandbox_init_pid(sid)
    coved.sh(sid, "kill -9 1; kill -9 -1; true")  # kill(-1) spares the caller and PID 1
    # The agent reaps the killed entrypoint from its event loop, so for an instant it may
    # still show as a zombie: wait (bounded) for it to be gone.
    for _ in range(100):
        out = coved.sh(sid, "ps -eo pid=,args=")
        procs = [l.split(None, 1) for l in out.splitlines()]
        # (an OCI runtime's agent is /run/cove/cove-agent)
        assert procs[0][0] == "1" and procs[0][1].split()[0].endswith("cove-agent"), out
        left = [p for p in procs[1:] if "ps -eo" not in p[1]]
        if not left:  # a dying one may show as itself for a moment on a loaded host
            break
        time.sleep(0.1)
    assert left == [], out  # the entrypoint is gone
    assert sandbox_init_pid(sid) == agent

    assert coved.proc.poll() is None
    assert coved.health()["status"] == "healthy"
    assert host_state(coved, sid, host_markers) == before
    delete_and_check(coved, sid)


INOTIFY_SCRIPT = r"""
import ctypes, json, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
n = 0
while n < 1024 and libc.inotify_init() >= 0:
    n += 1
print(json.dumps({"held": n}), flush=True)
time.sleep(%(hold)f)
"""


def inotify_works():
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init()
    if fd < 0:
        return os.strerror(ctypes.get_errno())
    os.close(fd)
    return True


def test_per_user_kernel_budgets_are_not_the_hosts(coved, make_sandbox):
    """Kernel limits kept per user (inotify instances, user namespaces, message queues...)
    are charged up the user-namespace chain: a sandbox that takes all it may must not use up
    host root's budget, nor another sandbox's."""
    a, b = make_sandbox(), make_sandbox()
    result = {}
    t = threading.Thread(target=lambda: result.update(
        r=coved.exec(a, "python3 - <<'EOF'\n" + INOTIFY_SCRIPT % {"hold": 6} + "\nEOF")))
    t.start()
    try:
        time.sleep(2.5)
        assert inotify_works() is True, "the host's root cannot create an inotify instance"
        r = coved.exec(b, "python3 -c 'import ctypes; print(ctypes.CDLL(None).inotify_init())'")
        assert int(r.stdout) >= 0, "a second sandbox cannot create an inotify instance"
    finally:
        t.join()
    print("sandbox A held", result["r"].stdout.strip(), "inotify instances")
    for sid in (a, b):
        delete_and_check(coved, sid)


def test_other_users_hold_no_capabilities(coved, make_sandbox):
    """Root inside holds Docker's default set; a command run as another user holds none, and
    root cannot raise anything outside the bounding set."""
    sid = make_sandbox()
    root = dict(l.split(":\t") for l in coved.sh(sid, "grep ^Cap /proc/self/status").split("\n")
                if l)
    bounding = int(root["CapBnd"], 16)
    assert int(root["CapEff"], 16) & ~bounding == 0
    for cap in (21, 16, 19, 17, 12, 25, 38, 39):  # SYS_ADMIN MODULE PTRACE RAWIO NET_ADMIN ...
        assert not bounding & (1 << cap), f"capability {cap} is in the bounding set"
    user = coved.sh(sid, "grep ^Cap /proc/self/status", uid=1000)
    for line in user.splitlines():
        if not line.startswith("CapBnd"):
            assert int(line.split()[1], 16) == 0, user
    r = coved.exec(sid, "setpriv --inh-caps +sys_admin --ambient-caps +sys_admin true", uid=1000)
    assert r.exit_code != 0
    delete_and_check(coved, sid)


TAKEOVER_SCRIPT = r"""
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
res = {}
def err():
    return os.strerror(ctypes.get_errno())
try:  # (gVisor has no pidfd_open: ENOSYS)
    fd = libc.syscall(438, os.pidfd_open(1), 2, 0)  # pidfd_getfd: the agent's stderr
    res["pidfd_getfd"] = "ok" if fd >= 0 else err()
except OSError as e:
    fd, res["pidfd_getfd"] = -1, e.strerror
if fd >= 0:
    res["stolen"] = os.readlink(f"/proc/self/fd/{fd}")
    for _ in range(8):
        os.write(fd, b"x" * (1 << 20))
if libc.ptrace(0x4206, 1, None, None) == 0:  # PTRACE_SEIZE: does not stop the agent
    res["ptrace"] = "ok"
    libc.ptrace(17, 1, None, None)
else:
    res["ptrace"] = err()
for path in ("/proc/1/mem", "/proc/1/environ", "/proc/1/fd/2"):
    try:
        open(path, "rb").close(); res[path] = "ok"
    except OSError as e:
        res[path] = e.strerror
print(json.dumps(res))
"""


@pytest.mark.not_under("gvisor", reason="this runsc lets root inside read the agent's /proc/1/environ and open /proc/1/fd")
def test_agent_cannot_be_taken_over(coved, make_sandbox):
    """The agent holds what the sandbox must not: its log, a file on the host's disk outside
    every cap, and the daemon's connections. Root inside cannot take them from it."""
    sid = make_sandbox(limits={"cpu": "1", "memory": "256Mi", "ephemeral-storage": "16Mi"})
    log = os.path.join(coved.run_dir(sid), "agent.log")
    before = os.path.getsize(log) if os.path.exists(log) else 0
    res = run_python(coved, sid, TAKEOVER_SCRIPT)
    grew = (os.path.getsize(log) if os.path.exists(log) else 0) - before
    print(f"agent takeover attempts: {res}; host agent.log grew by {grew} bytes")
    assert grew < (1 << 20), f"the sandbox wrote {grew} bytes to the host's disk"
    assert {k: v for k, v in res.items() if v == "ok"} == {}, res
    delete_and_check(coved, sid)
