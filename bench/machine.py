"""The machine the bench runs on: its description for the report, readers of /proc and /sys,
and its mounts (what a tool may leave behind)."""

import ctypes
import os
import platform
import re
import subprocess
import sys
import time

MNT_DETACH = 2


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def now():
    return time.perf_counter()


def machine_info():
    info = {}
    try:
        cpu = open("/proc/cpuinfo").read()
        m = re.search(r"^model name\s*:\s*(.*)$", cpu, re.M)
        info["cpu"] = m.group(1).strip() if m else platform.processor()
    except OSError:
        info["cpu"] = "?"
    info["cores"] = os.cpu_count()
    mem = read_meminfo()
    info["ram_gib"] = round(mem.get("MemTotal", 0) / 1024 / 1024, 1)
    info["kernel"] = platform.release()
    info["cgroups"] = cgroup_mode()
    try:
        info["os"] = re.search(r'^PRETTY_NAME="?(.*?)"?$', open("/etc/os-release").read(),
                               re.M).group(1)
    except (OSError, AttributeError):
        info["os"] = "?"
    vers = {}
    for name, cmd in [("bwrap", ["bwrap", "--version"]), ("crun", ["crun", "--version"]),
                      ("runc", ["runc", "--version"]), ("podman", ["podman", "--version"]),
                      ("python", [sys.executable, "--version"])]:
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout
            vers[name] = out.splitlines()[0].strip() if out else "?"
        except (OSError, subprocess.SubprocessError):
            vers[name] = "not installed"
    info["versions"] = vers
    return info


def cgroup_mode():
    v2_root = v1_memory = v2_other = False
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            mp = left.split()[4]
            fstype = right.split()[0]
            if fstype == "cgroup2":
                if mp == "/sys/fs/cgroup":
                    v2_root = True
                else:
                    v2_other = True
            elif fstype == "cgroup" and "memory" in right.split()[2].split(","):
                v1_memory = True
    if v2_root:
        return "v2"
    if v1_memory and v2_other:
        return "hybrid"
    return "v1" if v1_memory else "unknown"


def read_meminfo():
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k] = int(v.split()[0])
    return out


def mounts_under(prefix):
    res = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].replace("\\040", " ")
            if mp == prefix or mp.startswith(prefix.rstrip("/") + "/"):
                res.append(mp)
    return res


_libc = ctypes.CDLL(None, use_errno=True)


def umount(path, flags=0):
    """umount2(2) directly: the umount command would create /run/mount (libmount's utab)."""
    if _libc.umount2(os.fsencode(path), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), path)


def unmount_under(prefix):
    for mp in sorted(mounts_under(prefix), key=len, reverse=True):
        try:
            umount(mp, MNT_DETACH)
        except OSError as e:
            log(f"cleanup: umount {mp}: {e}")



def read_int(path):
    try:
        return int(open(path).read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def read_stat(path):
    out = {}
    try:
        for line in open(path):
            k, v = line.split()
            out[k] = int(v)
    except (OSError, ValueError):
        pass
    return out


def rss_kib(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0

