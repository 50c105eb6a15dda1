"""Helpers of the security suite: run hostile code inside a sandbox and look at the host."""

import ctypes
import json
import os
import secrets
import socket
import subprocess

from covetest import sandbox_leftovers


def delete_and_check(coved, sid):
    coved.delete(sid)
    assert sandbox_leftovers(coved, sid) == []


def run_python(coved, sid, script, **kw):
    """Runs a Python script inside the sandbox; its last stdout line is JSON."""
    r = coved.exec(sid, "python3 - <<'COVE_PY'\n" + script + "\nCOVE_PY", **kw)
    lines = [l for l in r.stdout.splitlines() if l.strip()]
    assert lines, f"no output (exit {r.exit_code}): {r.stderr}"
    return json.loads(lines[-1])


class Markers:
    """Files with a unique name and content written on the host, outside any sandbox."""

    def __init__(self, dirs):
        self.name = "cove-sec-marker-" + secrets.token_hex(8)
        self.secret = "cove-secret-" + secrets.token_hex(16)
        self.paths = []
        for d in dirs:
            path = os.path.join(d, self.name)
            with open(path, "w") as f:
                f.write(self.secret + "\n")
            self.paths.append(path)

    def intact(self):
        for p in self.paths:
            with open(p) as f:
                assert f.read() == self.secret + "\n", f"host marker {p} changed"
        return True

    def remove(self):
        for p in self.paths:
            try:
                os.unlink(p)
            except OSError:
                pass


def host_sysctls():
    """A snapshot of host kernel settings a sandbox must not be able to change."""
    names = ["kernel/hostname", "kernel/domainname", "kernel/panic", "kernel/sysrq",
             "kernel/core_pattern", "kernel/modules_disabled", "kernel/pid_max",
             "kernel/randomize_va_space", "vm/overcommit_memory", "vm/drop_caches",
             "net/ipv4/ip_forward", "net/ipv4/ip_local_port_range", "fs/file-max",
             "fs/inotify/max_user_instances", "user/max_user_namespaces"]
    out = {}
    for n in names:
        try:
            with open("/proc/sys/" + n) as f:
                out[n] = f.read()
        except OSError:
            pass
    return out


def host_ipv4_addresses():
    """The host's non-loopback IPv4 addresses."""
    try:
        out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True,
                             text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    addrs = []
    for line in out.splitlines():
        fields = line.split()
        if "inet" in fields:
            a = fields[fields.index("inet") + 1].split("/")[0]
            if not a.startswith("127."):
                addrs.append(a)
    return addrs


def netns_inodes():
    """Inodes of every network namespace some host process is in."""
    found = set()
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                found.add(os.stat(f"/proc/{p}/ns/net").st_ino)
            except OSError:
                pass
    return found


_libc = ctypes.CDLL(None, use_errno=True)
_SYS_pidfd_getfd = 438
_SIOCGSKNS = 0x894C


def socket_netns_of(pid):
    """Network namespace inode of every socket pid holds (via pidfd_getfd + SIOCGSKNS):
    a socket keeps its namespace alive after every process in it is gone."""
    import fcntl

    found = {}
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return found
    try:
        for name in os.listdir(f"/proc/{pid}/fd"):
            try:
                if not os.readlink(f"/proc/{pid}/fd/{name}").startswith("socket:"):
                    continue
            except OSError:
                continue
            fd = _libc.syscall(_SYS_pidfd_getfd, pidfd, int(name), 0)
            if fd < 0:
                continue
            try:
                nsfd = fcntl.ioctl(fd, _SIOCGSKNS)
                found[int(name)] = os.fstat(nsfd).st_ino
                os.close(nsfd)
            except OSError:
                pass
            finally:
                os.close(fd)
    finally:
        os.close(pidfd)
    return found


def own_netns():
    return os.stat("/proc/self/ns/net").st_ino


class HostListener:
    """TCP (and an abstract unix) listener on the host that counts connections."""

    def __init__(self, host="127.0.0.1", family=socket.AF_INET):
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind((host, 0) if family == socket.AF_INET else host)
        self.sock.listen(16)
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1] if family == socket.AF_INET else None

    def accepted(self):
        n = 0
        while True:
            try:
                c, _ = self.sock.accept()
                c.close()
                n += 1
            except BlockingIOError:
                return n

    def close(self):
        self.sock.close()
