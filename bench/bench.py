#!/usr/bin/python3
"""Cove start-up, memory and exec benchmark. Run it through bench/run.sh (as root).

Measures, for Cove and for bwrap, crun and podman (runc) doing the same job:
start an isolated environment, run `echo hi`, read its first output, tear it down.

  first  = from the start of the request until "hi" reaches the client
  cycle  = the same, plus waiting for the end of the command and the teardown

Three modes: sequential (back to back), concurrent (a fixed number in flight, in threads)
and idle (one at a time after a pause, as a lone request on a quiet host would see it).
Then the host memory an idle, paused Cove sandbox costs.

And the exec part: the round trip of `echo hi` in an environment that is already running
(Cove: POST .../proxy/44772/command on a kept-alive connection; podman exec; crun exec).

  first  = from the start of the request until "hi" reaches the client
  done   = until the end of the event stream (Cove) or the exit of the exec command

--only startup,memory,exec picks the parts (default: all three).

Only the Python 3 standard library is used. Everything made (coved and its state dir,
sandboxes, the busybox rootfs, the OCI bundle, podman's storage, containers, cgroups,
mounts) is removed at the end, also on failure or Ctrl-C."""

import argparse
import concurrent.futures
import ctypes
import glob
import http.client
import itertools
import json
import os
import platform
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import code_interpreter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("COVE_BUILD_DIR", os.path.join(ROOT, "build"))
AGENT_PORT = 44772
BUSYBOX = "/usr/bin/busybox"
BUSYBOX_APPLETS = ["sh", "echo", "sleep", "cat", "true", "ls"]
# Host paths the container tools create on first use. Whatever of these did not exist before
# the run is removed after it.
# (`crun --version` alone makes /run/crun; podman makes /dev/shm/libpod_lock and the others.)
TOOL_GLOBAL_PATHS = ["/run/crun", "/run/runc", "/run/libpod", "/run/containers",
                     "/run/mount", "/var/lib/containers", "/etc/containers/networks",
                     "/dev/shm/libpod_lock"]
CRUN_STATE = "/run/crun"
MNT_DETACH = 2
LIBPOD_CGROUP = "libpod_parent"


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def now():
    return time.perf_counter()


# ---------------------------------------------------------------- statistics and output

def percentile(values, p):
    """Linear interpolation between closest ranks (like numpy's default)."""
    s = sorted(values)
    if not s:
        return float("nan")
    k = (len(s) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summary(values):
    ms = [v * 1000.0 for v in values]
    return {"n": len(ms), "p50": percentile(ms, 50), "p95": percentile(ms, 95),
            "mean": statistics.fmean(ms) if ms else float("nan"),
            "min": min(ms) if ms else float("nan"), "max": max(ms) if ms else float("nan")}


def fmt(x):
    if x != x:  # NaN
        return "-"
    return f"{x:.1f}" if x < 100 else f"{x:.0f}"


# ---------------------------------------------------------------- machine description

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


# ---------------------------------------------------------------- subprocess-based tools

class ProcTool:
    """A tool whose one iteration is a process: it prints "hi" and exits after teardown."""

    name = "?"
    note = ""

    def __init__(self, tmp):
        self.tmp = tmp
        self.errlog = os.path.join(tmp, f"{self.name}.stderr")
        self.errf = None
        self.counter = itertools.count()

    def setup(self):
        self.errf = open(self.errlog, "ab")

    def argv(self, n):
        raise NotImplementedError

    def once(self):
        return self.run_argv(self.argv(next(self.counter)))

    def run_argv(self, argv):
        t0 = now()
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=self.errf, close_fds=True)
        fd = p.stdout.fileno()
        buf = b""
        t_first = None
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            buf += chunk
            if t_first is None and b"hi" in buf:
                t_first = now()
        rc = p.wait()
        t_end = now()
        p.stdout.close()
        if rc != 0 or buf.strip() != b"hi" or t_first is None:
            raise RuntimeError(f"{self.name}: exit {rc}, output {buf[:200]!r}; "
                               f"stderr in {self.errlog}:\n{self.tail_err()}")
        return {"first": t_first - t0, "cycle": t_end - t0}

    def tail_err(self):
        try:
            self.errf.flush()
            return open(self.errlog, errors="replace").read()[-2000:]
        except (OSError, AttributeError):
            return ""

    def cleanup(self):
        if self.errf:
            self.errf.close()
            self.errf = None


class HostExec(ProcTool):
    name = "host"
    note = "plain fork+exec of /usr/bin/echo, no isolation (the client's own floor)"

    def argv(self, n):
        return ["/usr/bin/echo", "hi"]


class Bwrap(ProcTool):
    name = "bwrap"
    note = ("bwrap --unshare-all, host /usr read-only, /proc, /dev, /tmp; "
            "no cgroup, no overlay, no seccomp")

    def argv(self, n):
        return ["bwrap", "--unshare-all", "--die-with-parent", "--new-session",
                "--ro-bind", "/usr", "/usr",
                "--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin",
                "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
                "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
                "--hostname", f"bench{n}", "/usr/bin/echo", "hi"]


def run_or_explain(argv, env=None):
    """Runs a set-up command whose stdout is not needed (a detached container must not
    hold a pipe of ours open); fails with its stderr."""
    with tempfile.TemporaryFile() as err:
        rc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=err).returncode
        if rc != 0:
            err.seek(0)
            raise RuntimeError(f"{' '.join(argv)}: exit {rc}: "
                               f"{err.read().decode(errors='replace')[-1500:]}")


def make_busybox_rootfs(path):
    for d in ["bin", "proc", "sys", "dev", "tmp", "etc", "root"]:
        os.makedirs(os.path.join(path, d), exist_ok=True)
    shutil.copy2(BUSYBOX, os.path.join(path, "bin", "busybox"))
    for a in BUSYBOX_APPLETS:
        os.symlink("busybox", os.path.join(path, "bin", a))
    with open(os.path.join(path, "etc", "passwd"), "w") as f:
        f.write("root:x:0:0:root:/root:/bin/sh\n")
    with open(os.path.join(path, "etc", "group"), "w") as f:
        f.write("root:x:0:\n")


class Crun(ProcTool):
    name = "crun"
    note = "crun run, OCI bundle: busybox-static rootfs (read-only), crun's default spec"

    def __init__(self, tmp):
        super().__init__(tmp)
        self.bundle = os.path.join(tmp, "crun-bundle")
        self.prefix = os.path.basename(tmp) + "-"

    def setup(self):
        super().setup()
        os.makedirs(self.bundle)
        make_busybox_rootfs(os.path.join(self.bundle, "rootfs"))
        subprocess.run(["crun", "spec"], cwd=self.bundle, check=True)
        cfg_path = os.path.join(self.bundle, "config.json")
        cfg = json.load(open(cfg_path))
        cfg["process"]["terminal"] = False
        cfg["process"]["args"] = ["/bin/echo", "hi"]
        cfg["root"]["readonly"] = True
        json.dump(cfg, open(cfg_path, "w"), indent=1)

    def argv(self, n):
        return ["crun", "run", "--bundle", self.bundle, f"{self.prefix}{n}"]

    exec_note = ("crun exec into a running container (`crun run --detach`, same bundle, "
                 "`sleep` as its process): joins its namespaces and cgroups, execs /bin/echo")

    def start_running(self):
        """A container that keeps running (busybox sleep), for `crun exec`."""
        self.exec_id = f"{self.prefix}exec"
        cfg = json.load(open(os.path.join(self.bundle, "config.json")))
        cfg["process"]["args"] = ["/bin/sleep", "3600"]
        json.dump(cfg, open(os.path.join(self.bundle, "config-sleep.json"), "w"), indent=1)
        run_or_explain(["crun", "run", "--detach", "--bundle", self.bundle,
                        "--config", os.path.join(self.bundle, "config-sleep.json"),
                        self.exec_id])

    def exec_argv(self):
        return ["crun", "exec", self.exec_id, "/bin/echo", "hi"]

    def cleanup(self):
        # A container that outlived its `crun run` (only after a failure) has state here,
        # and so has the exec part's detached container.
        for cid in crun_leftovers(self.prefix):
            subprocess.run(["crun", "delete", "-f", cid], capture_output=True)
        super().cleanup()


def crun_leftovers(prefix):
    try:
        return [c for c in os.listdir(CRUN_STATE) if c.startswith(prefix)]
    except OSError:
        return []


class Podman(ProcTool):
    name = "podman"
    note = ("podman --runtime runc run --rm --network none, image imported from the same "
            "busybox rootfs; its own --root/--runroot in a temp dir")

    def __init__(self, tmp):
        super().__init__(tmp)
        self.dir = os.path.join(tmp, "podman")
        self.image = "localhost/cove-bench-busybox:latest"
        self.env = dict(os.environ, TMPDIR=os.path.join(self.dir, "tmp"))

    def base(self):
        d = self.dir
        return ["podman", "--root", f"{d}/root", "--runroot", f"{d}/runroot",
                "--tmpdir", f"{d}/libpod", "--network-config-dir", f"{d}/net",
                "--volumepath", f"{d}/volumes", "--storage-driver", "overlay",
                "--events-backend", "none", "--cgroup-manager", "cgroupfs",
                "--runtime", "runc"]

    def setup(self):
        super().setup()
        for sub in ["tmp", "net", "libpod", "volumes"]:
            os.makedirs(os.path.join(self.dir, sub))
        rootfs = os.path.join(self.dir, "rootfs")
        make_busybox_rootfs(rootfs)
        tar = os.path.join(self.dir, "rootfs.tar")
        subprocess.run(["tar", "-C", rootfs, "-cf", tar, "."], check=True)
        subprocess.run(self.base() + ["import", tar, self.image], check=True, env=self.env,
                       stdout=subprocess.DEVNULL, stderr=self.errf)

    def argv(self, n):
        # No CAP_SYS_RESOURCE here: podman's default rlimits (nofile 1048576) cannot be set,
        # so ask for low ones that any process may set.
        return self.base() + ["run", "--rm", "--network", "none",
                              "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
                              self.image, "echo", "hi"]

    exec_note = ("podman --runtime runc exec into a running container (`podman run -d`, "
                 "same image and flags, `sleep` as its process): conmon + runc exec")

    def start_running(self):
        """A container that keeps running (busybox sleep), for `podman exec`."""
        self.exec_name = f"{os.path.basename(self.tmp)}-exec"
        run_or_explain(self.base() + ["run", "-d", "--name", self.exec_name,
                                      "--network", "none",
                                      "--ulimit", "nofile=1024:1024",
                                      "--ulimit", "nproc=1024:1024",
                                      self.image, "sleep", "3600"], env=self.env)

    def exec_argv(self):
        return self.base() + ["exec", self.exec_name, "echo", "hi"]

    def cleanup(self):
        if os.path.isdir(self.dir):
            try:
                subprocess.run(self.base() + ["rm", "-a", "-f", "-t", "0"], capture_output=True,
                               env=self.env, timeout=60)
                subprocess.run(self.base() + ["rmi", "-a", "-f"], capture_output=True,
                               env=self.env, timeout=60)
            except (OSError, subprocess.SubprocessError):
                pass
            unmount_under(self.dir)
        super().cleanup()


# ---------------------------------------------------------------- Cove

class Coved:
    """A private coved: copied binaries, its own port, key and state dir."""

    def __init__(self, tmp, coved_path, agent_path, state_parent=None):
        self.dir = os.path.join(tmp, "cove")
        # The state dir (database and run dirs) lives in the bench's temp dir unless asked
        # to live elsewhere (e.g. on a tmpfs, to see what the disk costs).
        self.state_tmp = tempfile.mkdtemp(prefix="cove-bench-state-", dir=state_parent) \
            if state_parent else None
        self.state = os.path.join(self.state_tmp or self.dir, "state")
        self.key = secrets.token_hex(16)
        self.coved_src, self.agent_src = coved_path, agent_path
        self.proc = None
        self.port = None
        self.ids = set()  # every sandbox created and not yet deleted
        self.all_ids = set()  # every sandbox ever created (for the leftover check)
        self.name = "cove"
        self.note = ("coved HTTP API: POST /v1/sandboxes (base template, keep-alive), "
                     "POST .../proxy/44772/command (new connection), DELETE (keep-alive)")
        self.lock = threading.Lock()
        self.local = threading.local()
        self.gw_connects = 0  # connections opened by exec_keepalive
        self.gw_lost = 0      # of which closed by the server or left unusable after a reply

    def start(self, log_level="info"):
        os.makedirs(self.state)
        # Private copies: the build dir may be rebuilt by someone else during the run.
        bindir = os.path.join(self.dir, "bin")
        os.makedirs(bindir)
        coved = os.path.join(bindir, "coved")
        shutil.copy2(self.coved_src, coved)
        shutil.copy2(self.agent_src, os.path.join(bindir, "cove-agent"))
        # Found next to coved, like the agent: the code-interpreter part needs it.
        kernel_src = os.path.join(os.path.dirname(os.path.dirname(self.agent_src)), "kernel",
                                  "cove-kernel")
        if os.path.exists(kernel_src):
            shutil.copy2(kernel_src, os.path.join(bindir, "cove-kernel"))
        self.logf = open(os.path.join(self.dir, "coved.log"), "ab")
        self.proc = subprocess.Popen(
            [coved, "--listen", "127.0.0.1:0", "--state-dir", self.state, "--api-key", self.key,
             "--log-level", log_level],
            stdout=subprocess.PIPE, stderr=self.logf, stdin=subprocess.DEVNULL,
            # Its own session: a Ctrl-C on the terminal must reach the bench only, which then
            # deletes the sandboxes through the API before stopping coved.
            start_new_session=True)
        line = self.proc.stdout.readline().decode()
        if "ready on" not in line:
            self.proc.wait(5)
            raise RuntimeError(f"coved did not start: {line!r}\n{self.log()}")
        self.port = int(line.strip().rsplit(":", 1)[1])
        return self

    def log(self):
        try:
            return open(os.path.join(self.dir, "coved.log"), errors="replace").read()[-3000:]
        except OSError:
            return ""

    def headers(self):
        return {"Content-Type": "application/json", "OPEN-SANDBOX-API-KEY": self.key}

    def conn(self):
        """This thread's keep-alive connection to the lifecycle API."""
        c = getattr(self.local, "conn", None)
        if c is None:
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            c.connect()
            c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.local.conn = c
        return c

    def request(self, method, path, body=None):
        data = json.dumps(body) if body is not None else None
        for attempt in range(2):
            c = self.conn()
            try:
                c.request(method, path, body=data, headers=self.headers())
                r = c.getresponse()
                payload = r.read()
                if r.getheader("Connection", "").lower() == "close":
                    c.close()
                    self.local.conn = None
                return r.status, payload
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                # The server closed the idle keep-alive connection before this request.
                c.close()
                self.local.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def create(self, entrypoint=("sleep", "infinity")):
        status, payload = self.request("POST", "/v1/sandboxes", {
            "image": {"uri": "base"}, "entrypoint": list(entrypoint),
            "resourceLimits": {"cpu": "1", "memory": "512Mi"}})
        if status != 202:
            raise RuntimeError(f"create: HTTP {status}: {payload[:300]!r}")
        sid = json.loads(payload)["id"]
        with self.lock:
            self.ids.add(sid)
            self.all_ids.add(sid)
        return sid

    def delete(self, sid):
        status, payload = self.request("DELETE", f"/v1/sandboxes/{sid}")
        if status != 204:
            raise RuntimeError(f"delete {sid}: HTTP {status}: {payload[:300]!r}")
        with self.lock:
            self.ids.discard(sid)

    def pause(self, sid):
        status, payload = self.request("POST", f"/v1/sandboxes/{sid}/pause")
        if status != 202:
            raise RuntimeError(f"pause {sid}: HTTP {status}: {payload[:300]!r}")

    def get(self, sid):
        status, payload = self.request("GET", f"/v1/sandboxes/{sid}")
        return json.loads(payload) if status == 200 else None

    def list_ids(self):
        status, payload = self.request("GET", "/v1/sandboxes?pageSize=1000")
        if status != 200:
            return None
        j = json.loads(payload)
        items = j.get("items", j) if isinstance(j, dict) else j
        return [i["id"] for i in items]

    def exec_first(self, sid, command="echo hi", expect="hi"):
        """Runs a command through the gateway; returns (time of first expected output,
        time of end of stream). The gateway closes each connection after one exchange."""
        body = json.dumps({"command": command}).encode()
        head = (f"POST /sandboxes/{sid}/proxy/{AGENT_PORT}/command HTTP/1.1\r\n"
                f"Host: 127.0.0.1:{self.port}\r\nOPEN-SANDBOX-API-KEY: {self.key}\r\n"
                f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        s = socket.create_connection(("127.0.0.1", self.port), timeout=60)
        try:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.sendall(head + body)
            stream = EventStream()
            t_first = None
            while True:
                data = s.recv(65536)
                if not data:
                    break
                for ev in stream.feed(data):
                    if (t_first is None and ev.get("type") == "stdout"
                            and ev.get("text", "").strip() == expect):
                        t_first = now()
                if stream.done:
                    break
            t_end = now()
        finally:
            s.close()
        if stream.status != 200 or t_first is None:
            raise RuntimeError(f"exec in {sid}: HTTP {stream.status}, events {stream.events!r}, "
                               f"raw {stream.raw[:300]!r}")
        return t_first, t_end

    def exec_keepalive(self, sid, command="echo hi", expect="hi"):
        """The same exchange as exec_first on this thread's kept-alive connection to the
        gateway (opened on first use, and again only if the server closes it). Returns (time
        of first expected output, time of end of stream), both from the start of the send.
        command=None sends GET .../proxy/44772/ping instead (the HTTP path alone)."""
        if command is None:
            req = (f"GET /sandboxes/{sid}/proxy/{AGENT_PORT}/ping HTTP/1.1\r\n"
                   f"Host: 127.0.0.1:{self.port}\r\nOPEN-SANDBOX-API-KEY: {self.key}\r\n"
                   "\r\n").encode()
        else:
            body = json.dumps({"command": command}).encode()
            req = (f"POST /sandboxes/{sid}/proxy/{AGENT_PORT}/command HTTP/1.1\r\n"
                   f"Host: 127.0.0.1:{self.port}\r\nOPEN-SANDBOX-API-KEY: {self.key}\r\n"
                   f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        s = getattr(self.local, "gw", None)
        if s is None:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=60)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.local.gw = s
            with self.lock:
                self.gw_connects += 1
        t0 = now()
        stream = EventStream()
        t_first = None
        try:
            s.sendall(req)
            while not stream.done:
                data = s.recv(65536)
                if not data:
                    break
                for ev in stream.feed(data):
                    if (t_first is None and ev.get("type") == "stdout"
                            and ev.get("text", "").strip() == expect):
                        t_first = now()
            t_end = now()
            if command is None:
                t_first = t_end
        except OSError:
            self.drop_gw()
            raise
        if not stream.done or stream.close or stream.leftover:
            self.drop_gw()  # not reusable: the next call connects again
            with self.lock:
                self.gw_lost += 1
        if stream.status != 200 or t_first is None or not stream.done:
            raise RuntimeError(f"exec in {sid}: HTTP {stream.status}, events {stream.events!r}, "
                               f"raw {stream.raw[:300]!r}")
        return t_first - t0, t_end - t0

    def drop_gw(self):
        s = getattr(self.local, "gw", None)
        if s is not None:
            s.close()
            self.local.gw = None

    def once(self):
        t0 = now()
        sid = self.create()
        t_created = now()
        t_first, t_exec_end = self.exec_first(sid)
        self.delete(sid)
        t_end = now()
        return {"first": t_first - t0, "cycle": t_end - t0, "create": t_created - t0,
                "exec_first": t_first - t_created, "exec_rest": t_exec_end - t_first,
                "delete": t_end - t_exec_end}

    def cpu_seconds(self, sid):
        """CPU time used so far by a sandbox's cgroup (its agent and everything it ran) and
        by coved itself, in seconds; None where it cannot be read."""
        sb = read_int(f"/sys/fs/cgroup/cpuacct/cove/{sid}/cpuacct.usage")  # v1, ns
        if sb is None:
            sb = read_int(f"/sys/fs/cgroup/cpu,cpuacct/cove/{sid}/cpuacct.usage")
        if sb is not None:
            sb /= 1e9
        else:
            usec = read_stat(f"/sys/fs/cgroup/cove/{sid}/cpu.stat").get("usage_usec")  # v2
            sb = usec / 1e6 if usec is not None else None
        try:
            f = open(f"/proc/{self.proc.pid}/stat").read().rsplit(")", 1)[1].split()
            coved = (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            coved = None
        return sb, coved

    def cgroup_memory_dir(self, sid):
        for d in (f"/sys/fs/cgroup/memory/cove/{sid}", f"/sys/fs/cgroup/cove/{sid}"):
            if os.path.isdir(d):
                return d
        return None

    def stop(self, all_ids):
        """Deletes what is left through the API, stops coved, and removes by hand whatever
        a failure may have left (processes, cgroups, mounts)."""
        if self.proc and self.proc.poll() is None and self.port:
            for sid in list(self.ids):
                try:
                    self.delete(sid)
                except Exception as e:  # noqa: BLE001 - keep cleaning up
                    log(f"cleanup: delete {sid}: {e}")
            try:
                for sid in self.list_ids() or []:
                    log(f"cleanup: coved still lists {sid}; deleting it")
                    self.all_ids.add(sid)
                    self.delete(sid)
            except Exception as e:  # noqa: BLE001
                log(f"cleanup: {e}")
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc and self.proc.stdout:
            self.proc.stdout.close()
        for sid in all_ids:
            kill_cgroup(sid)
        unmount_under(self.dir)
        if self.state_tmp:
            unmount_under(self.state_tmp)
            shutil.rmtree(self.state_tmp, ignore_errors=True)


def kill_cgroup(sid):
    dirs = [d for d in glob.glob(f"/sys/fs/cgroup/*/cove/{sid}") + glob.glob(
        f"/sys/fs/cgroup/cove/{sid}") if os.path.isdir(d)]
    for d in dirs:
        for f, v in (("freezer.state", "THAWED"), ("cgroup.freeze", "0"), ("cgroup.kill", "1")):
            try:
                with open(os.path.join(d, f), "w") as fh:
                    fh.write(v)
            except OSError:
                pass
    for d in dirs:
        for _ in range(500):
            try:
                pids = [int(p) for p in open(os.path.join(d, "cgroup.procs")).read().split()]
            except OSError:
                pids = []
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                os.rmdir(d)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.01)


class EventStream:
    """Incremental HTTP/1.1 response parser for the execd event stream: status, headers,
    chunked or plain body, events separated by blank lines (bare JSON or SSE data: lines)."""

    def __init__(self):
        self.raw = b""
        self.status = None
        self.chunked = False
        self.length = None   # Content-Length, if the response has one
        self.body = b""      # de-chunked, not yet split into events
        self.pending = b""   # raw body bytes not yet de-chunked
        self.headers_done = False
        self.done = False
        self.close = False     # the server said Connection: close
        self.leftover = b""    # bytes after the end of the body (must be none)
        self.events = []

    def feed(self, data):
        self.raw += data if len(self.raw) < 4096 else b""
        if not self.headers_done:
            self.pending += data
            end = self.pending.find(b"\r\n\r\n")
            if end < 0:
                return []
            head = self.pending[:end].decode("latin-1").split("\r\n")
            self.status = int(head[0].split()[1])
            for h in head[1:]:
                k, _, v = h.partition(":")
                if k.strip().lower() == "transfer-encoding" and "chunked" in v.lower():
                    self.chunked = True
                if k.strip().lower() == "connection" and "close" in v.lower():
                    self.close = True
                if k.strip().lower() == "content-length":
                    self.length = int(v)
            self.pending = self.pending[end + 4:]
            self.headers_done = True
        else:
            self.pending += data
        if self.chunked:
            while True:
                nl = self.pending.find(b"\r\n")
                if nl < 0:
                    break
                size = int(self.pending[:nl].split(b";")[0], 16)
                if size == 0:
                    # The last chunk, then trailers (none expected) and an empty line: wait
                    # for all of it so that a kept-alive connection is left at a boundary.
                    rest = self.pending[nl + 2:]
                    if rest.startswith(b"\r\n"):
                        end = 2
                    elif b"\r\n\r\n" in rest:
                        end = rest.find(b"\r\n\r\n") + 4
                    else:
                        break
                    self.done = True
                    self.leftover = rest[end:]
                    self.pending = b""
                    break
                if len(self.pending) < nl + 2 + size + 2:
                    break
                self.body += self.pending[nl + 2:nl + 2 + size]
                self.pending = self.pending[nl + 2 + size + 2:]
        elif self.length is not None:
            self.body += self.pending[:self.length]
            self.leftover = self.pending[self.length:]
            self.length -= len(self.pending) - len(self.leftover)
            self.pending = b""
            self.done = self.length == 0
        else:
            self.body += self.pending
            self.pending = b""
        out = []
        text = self.body.replace(b"\r\n", b"\n")
        while b"\n\n" in text:
            block, text = text.split(b"\n\n", 1)
            lines = [l[5:].lstrip() if l.startswith(b"data:") else l
                     for l in block.split(b"\n")
                     if l and not l.startswith((b":", b"event:", b"id:"))]
            if lines:
                try:
                    ev = json.loads(b"\n".join(lines))
                except ValueError:
                    continue
                out.append(ev)
        self.body = text
        self.events += out
        return out


# ---------------------------------------------------------------- runs

def run_sequential(tool, iterations, warmup, gap=0.0):
    for _ in range(warmup):
        tool.once()
    samples = []
    busy = 0.0
    for _ in range(iterations):
        if gap:
            time.sleep(gap)
        t0 = now()
        samples.append(tool.once())
        busy += now() - t0
    return samples, busy


def run_concurrent(tool, total, concurrency):
    samples = []
    t0 = now()
    with concurrent.futures.ThreadPoolExecutor(max_workers=concurrency) as ex:
        futs = [ex.submit(tool.once) for _ in range(total)]
        for f in futs:
            samples.append(f.result())
    return samples, now() - t0


def measure_tool(tool, args):
    """Warm-up, then sequential and concurrent runs. Returns a result dict."""
    res = {"tool": tool.name, "note": tool.note}
    t0 = now()
    tool.once()  # also the first-use cost (storage init etc.), not counted
    first_use = now() - t0
    seq_n = args.iterations
    conc_n = args.iterations
    # Warm-up, and estimate one iteration to decide whether to cut the count.
    warm = [tool.once() for _ in range(args.warmup)]
    est = statistics.fmean(w["cycle"] for w in warm) if warm else 0
    if est > args.slow_threshold:
        seq_n = max(10, min(seq_n, args.slow_iterations))
        conc_n = max(args.concurrency, min(conc_n, args.slow_iterations * 2))
        res["reduced"] = (f"one iteration took {est * 1000:.0f} ms (> {args.slow_threshold:.1f} s):"
                          f" {seq_n} sequential / {conc_n} concurrent instead of "
                          f"{args.iterations}")
    log(f"  {tool.name}: sequential x{seq_n} ...")
    seq, seq_wall = run_sequential(tool, seq_n, 0)
    log(f"  {tool.name}: concurrent x{conc_n} ({args.concurrency} at once) ...")
    conc, conc_wall = run_concurrent(tool, conc_n, args.concurrency)
    modes = [("sequential", seq, seq_wall), ("concurrent", conc, conc_wall)]
    if args.idle_iterations > 0:
        idle_n = min(args.idle_iterations, seq_n)
        log(f"  {tool.name}: idle x{idle_n} ({args.idle_gap * 1000:.0f} ms pause before each)...")
        idle, idle_wall = run_sequential(tool, idle_n, 0, gap=args.idle_gap)
        modes.append(("idle", idle, idle_wall))
    res["first_use_ms"] = first_use * 1000
    for mode, samples, wall in modes:
        r = {k: summary([s[k] for s in samples]) for k in samples[0]}
        r["wall_s"] = wall
        r["per_s"] = len(samples) / wall
        res[mode] = r
    return res


# ---------------------------------------------------------------- exec in a running environment

class CoveExec:
    """One iteration: `echo hi` through the gateway in one running sandbox, on this thread's
    kept-alive connection (keepalive=True) or on a new connection each time."""

    def __init__(self, cove, sid, keepalive=True):
        self.cove, self.sid, self.keepalive = cove, sid, keepalive
        self.calls = 0
        if keepalive == "ping":
            self.name = "cove-ping"
            self.note = ("GET /sandboxes/{id}/proxy/44772/ping on a kept-alive connection: "
                         "the HTTP path (client, gateway, agent) without a process")
        elif keepalive:
            self.name = "cove"
            self.note = ("POST /sandboxes/{id}/proxy/44772/command {\"command\":\"echo hi\"} "
                         "on a kept-alive HTTP/1.1 connection (one per client thread), event "
                         "stream read to its end; one running sandbox (base, sleep infinity)")
        else:
            self.name = "cove-new"
            self.note = "the same request on a new TCP connection each time (for comparison)"

    def once(self):
        self.calls += 1  # (threads: a lost increment only blurs the CPU-per-exec figure)
        if self.keepalive == "ping":
            first, done = self.cove.exec_keepalive(self.sid, command=None)
        elif self.keepalive:
            first, done = self.cove.exec_keepalive(self.sid)
        else:
            t0 = now()
            t_first, t_end = self.cove.exec_first(self.sid)
            first, done = t_first - t0, t_end - t0
        return {"first": first, "done": done}


class ProcExec:
    """One iteration: a process (`crun exec ...`, `podman exec ...`, or plain echo for the
    host floor) that prints "hi" and exits."""

    def __init__(self, tool):
        self.tool = tool
        self.name = tool.name
        self.note = getattr(tool, "exec_note", tool.note)

    def once(self):
        argv = self.tool.exec_argv() if hasattr(self.tool, "exec_argv") else self.tool.argv(0)
        r = self.tool.run_argv(argv)
        return {"first": r["first"], "done": r["cycle"]}


def measure_exec(tool, args, concurrent=False):
    """Exec part: warm-up, then `--exec-iterations` back to back, and (Cove only) the same
    number with `--concurrency` in flight."""
    res = {"tool": tool.name, "note": tool.note}
    warm = [tool.once() for _ in range(max(1, args.warmup))]
    n = args.exec_iterations
    est = statistics.fmean(w["done"] for w in warm)
    if est > args.slow_threshold:
        n = max(10, min(n, args.slow_iterations))
        res["reduced"] = (f"one exec took {est * 1000:.0f} ms (> {args.slow_threshold:.1f} s): "
                          f"{n} iterations instead of {args.exec_iterations}")
    log(f"  {tool.name}: exec, sequential x{n} ...")
    modes = [("sequential",) + run_sequential(tool, n, 0)]
    if concurrent and args.concurrency > 1:
        log(f"  {tool.name}: exec, concurrent x{n} ({args.concurrency} at once) ...")
        modes.append(("concurrent",) + run_concurrent(tool, n, args.concurrency))
    for mode, samples, wall in modes:
        r = {k: summary([s[k] for s in samples]) for k in samples[0]}
        r["wall_s"] = wall
        r["per_s"] = len(samples) / wall
        res[mode] = r
    return res


def measure_cove_exec(cove, args):
    """Exec part for Cove: one sandbox, kept running for all iterations, then deleted."""
    sid = cove.create()
    try:
        tool = CoveExec(cove, sid)
        cpu0 = cove.cpu_seconds(sid)
        res = [measure_exec(tool, args, concurrent=True)]
        cpu1 = cove.cpu_seconds(sid)
        # One connection per client thread, none lost: keep-alive held for every request.
        res[0]["connections"] = cove.gw_connects
        res[0]["connections_lost"] = cove.gw_lost
        # Where the CPU goes, per exec (warm-up, sequential and concurrent together).
        for i, key in enumerate(("sandbox_cpu_ms_per_exec", "coved_cpu_ms_per_exec")):
            if cpu0[i] is not None and cpu1[i] is not None:
                res[0][key] = (cpu1[i] - cpu0[i]) * 1000 / tool.calls
        res.append(measure_exec(CoveExec(cove, sid, keepalive=False), args))
        res.append(measure_exec(CoveExec(cove, sid, keepalive="ping"), args))
    finally:
        cove.drop_gw()
        cove.delete(sid)
    return res


def measure_container_tool(tool, args, parts):
    """Start-up and/or exec part of crun or podman, on one setup. Returns (start-up result,
    exec result), None for a part not run."""
    start = ex = None
    try:
        tool.setup()
        if "startup" in parts:
            start = measure_tool(tool, args)
        if "exec" in parts and hasattr(tool, "start_running"):
            log(f"{tool.name}: exec: starting a container that keeps running ...")
            tool.start_running()
            ex = measure_exec(ProcExec(tool), args)
    finally:
        tool.cleanup()
    return start, ex


HIDDEN_UNIFIED_NOTE = ("; run in a private mount namespace with the empty cgroup2 mount "
                       "/sys/fs/cgroup/unified hidden (crun refuses hybrid mode), so it uses v1")


def run_crun_isolated(args, tmp, parts):
    """crun 1.8 refuses cgroup "hybrid" mode (v1 controllers plus a cgroup2 mount at
    /sys/fs/cgroup/unified). Run the crun part in a private mount namespace where that
    (controller-less) cgroup2 mount is hidden, so crun sees a plain v1 host."""
    out_path = os.path.join(tmp, "crun-result.json")
    cmd = ["unshare", "--mount", "--propagation", "private",
           sys.executable, os.path.abspath(__file__), "--worker", "crun", "--worker-hide-unified",
           "--worker-tmp", tmp, "--worker-out", out_path, "--only", ",".join(sorted(parts)),
           "--iterations", str(args.iterations), "--concurrency", str(args.concurrency),
           "--warmup", str(args.warmup), "--idle-iterations", str(args.idle_iterations),
           "--idle-gap", str(args.idle_gap), "--slow-threshold", str(args.slow_threshold),
           "--slow-iterations", str(args.slow_iterations),
           "--exec-iterations", str(args.exec_iterations)]
    proc = subprocess.Popen(cmd)
    try:
        rc = proc.wait()
    except KeyboardInterrupt:
        # Not subprocess.run: it would SIGKILL the worker, which then could not delete its
        # containers (the exec part's is detached and would keep running). Ask it to stop
        # and clean up, and wait for that.
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        raise
    if rc != 0:
        raise subprocess.CalledProcessError(rc, cmd)
    out = json.load(open(out_path))
    for res in out.values():
        if res:
            res["note"] += HIDDEN_UNIFIED_NOTE
    return out["startup"], out["exec"]


def delete_crun_leftovers(tmp):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "crun-cleanup",
           "--worker-tmp", tmp, "--worker-out", os.devnull]
    if cgroup_mode() == "hybrid":
        cmd = ["unshare", "--mount", "--propagation", "private"] + cmd + \
            ["--worker-hide-unified"]
    try:
        subprocess.run(cmd, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        log(f"cleanup: crun containers: {e}")


def raise_interrupt(signum, frame):
    # Once: a second signal (Ctrl-C reaches a worker, then its parent's SIGTERM) must not
    # interrupt the clean-up the first one started.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signum}")


def catch_signals():
    """SIGINT, SIGTERM and SIGHUP become KeyboardInterrupt so that `finally` cleans up (also
    when the bench was started with SIGINT ignored, as `cmd &` does)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, raise_interrupt)


def worker_main(args):
    catch_signals()
    if args.worker_hide_unified:
        umount("/sys/fs/cgroup/unified")  # in this private mount namespace only
    if args.worker == "crun-cleanup":
        # Backstop after a failed worker: delete this run's crun containers, seeing v1.
        Crun(args.worker_tmp).cleanup()
        return
    tool = {"crun": Crun}[args.worker](args.worker_tmp)
    start, ex = measure_container_tool(tool, args, set(args.only.split(",")))
    json.dump({"startup": start, "exec": ex}, open(args.worker_out, "w"))


# ---------------------------------------------------------------- memory

MEMINFO_FIELDS = ["MemAvailable", "Used", "AnonPages", "Shmem", "Slab", "SUnreclaim",
                  "KernelStack", "PageTables"]
# What a sandbox can add to the host's used memory, field by field (SUnreclaim is in Slab).
ACCOUNTED_FIELDS = ["AnonPages", "Shmem", "Slab", "KernelStack", "PageTables"]


def meminfo_sample(samples=10, interval=0.1):
    """Median over `samples` readings of the interesting /proc/meminfo fields (KiB), and the
    spread (max - min) of MemAvailable over them. Used is free(1)'s "used"."""
    rows = []
    for i in range(samples):
        m = read_meminfo()
        m["Used"] = (m["MemTotal"] - m["MemFree"] - m.get("Buffers", 0) - m.get("Cached", 0)
                     - m.get("SReclaimable", 0))
        rows.append(m)
        if i + 1 < samples:
            time.sleep(interval)
    med = {k: statistics.median(r.get(k, 0) for r in rows) for k in MEMINFO_FIELDS}
    avail = [r["MemAvailable"] for r in rows]
    return med, max(avail) - min(avail)


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


def memory_round(cove, n):
    # Short windows: other processes on the host move its memory all the time, and the
    # longer between the two samples the more of that lands in the difference.
    time.sleep(0.3)
    before, noise_before = meminfo_sample(5, 0.05)
    coved_before = rss_kib(cove.proc.pid)
    ids = [cove.create() for _ in range(n)]
    try:
        time.sleep(0.3)  # let the agents finish starting
        for sid in ids:
            cove.pause(sid)
        states = {(cove.get(sid) or {}).get("status", {}).get("state") for sid in ids}
        time.sleep(0.1)
        after, noise_after = meminfo_sample(5, 0.05)
        coved_after = rss_kib(cove.proc.pid)
        usage = kmem = 0
        stat_sum = {}
        v2 = False
        for sid in ids:
            d = cove.cgroup_memory_dir(sid)
            if d is None:
                raise RuntimeError(f"no memory cgroup found for sandbox {sid}")
            u = read_int(os.path.join(d, "memory.usage_in_bytes"))
            if u is None:
                u = read_int(os.path.join(d, "memory.current"))
                v2 = True
            usage += u or 0
            kmem += read_int(os.path.join(d, "memory.kmem.usage_in_bytes")) or 0
            for key, val in read_stat(os.path.join(d, "memory.stat")).items():
                stat_sum[key] = stat_sum.get(key, 0) + val
    finally:
        for sid in ids:
            cove.delete(sid)
    time.sleep(0.5)
    gone, noise_gone = meminfo_sample(5, 0.05)
    keys = (["anon", "file", "shmem", "kernel", "kernel_stack", "pagetables", "slab", "sock"]
            if v2 else ["rss", "cache", "shmem", "mapped_file"])
    breakdown = {k: stat_sum.get(k, 0) / n / 1024 for k in keys if k in stat_sum}
    if not v2:
        breakdown["kmem"] = kmem / n / 1024
    delta = {k: (after[k] - before[k]) / n for k in MEMINFO_FIELDS}
    delta["MemAvailable"] = -delta["MemAvailable"]  # a decrease is a cost
    return {"states": sorted(s for s in states if s), "meminfo_per_sandbox_kib": delta,
            "not_returned_kib": before["MemAvailable"] - gone["MemAvailable"],
            "noise_kib": max(noise_before, noise_after, noise_gone),
            "cgroup_usage_kib_per_sandbox": usage / n / 1024,
            "cgroup_file": "memory.current" if v2 else "memory.usage_in_bytes",
            "cgroup_breakdown_kib_per_sandbox": breakdown,
            "coved_rss_growth_kib": coved_after - coved_before}


def measure_memory(cove, n, rounds):
    res = []
    for r in range(rounds):
        log(f"  memory: round {r + 1}/{rounds}: {n} idle sandboxes, paused ...")
        res.append(memory_round(cove, n))

    def med(get):
        vals = [get(x) for x in res]
        return {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
    return {
        "n": n, "rounds": rounds, "states": sorted({s for x in res for s in x["states"]}),
        "cgroup_file": res[0]["cgroup_file"],
        "meminfo_per_sandbox_kib": {k: med(lambda x, k=k: x["meminfo_per_sandbox_kib"][k])
                                    for k in MEMINFO_FIELDS},
        "not_returned_kib": med(lambda x: x["not_returned_kib"]),
        "first_round_memavailable_kib": res[0]["meminfo_per_sandbox_kib"]["MemAvailable"],
        "first_round_used_kib": res[0]["meminfo_per_sandbox_kib"]["Used"],
        "accounted_kib": med(lambda x: sum(x["meminfo_per_sandbox_kib"][k]
                                           for k in ACCOUNTED_FIELDS)),
        "noise_kib": max(x["noise_kib"] for x in res),
        "cgroup_usage_kib_per_sandbox": med(lambda x: x["cgroup_usage_kib_per_sandbox"]),
        "cgroup_breakdown_kib_per_sandbox": {
            k: statistics.median(x["cgroup_breakdown_kib_per_sandbox"][k] for x in res)
            for k in res[0]["cgroup_breakdown_kib_per_sandbox"]},
        "coved_rss_growth_kib": med(lambda x: x["coved_rss_growth_kib"]),
    }


# ---------------------------------------------------------------- report

def latency_table(p, title, rows, mode, second, cove, per_s=None, width=8):
    """One table of a mode: p50/p95/mean of "first" and of `second` ("cycle" or "done") per
    tool, throughput (per_s formats it; None prints "-"), and each tool's p50s over Cove's."""
    p(f"== {title}")
    p(f"{'tool':{width}}{'n':>5} | {'first p50':>9} {'p95':>7} {'mean':>7} | "
      f"{second + ' p50':>9} {'p95':>7} {'mean':>7} | {'/s':>6} | {'first p50':>9} "
      f"{second + ' p50':>9}")
    p(f"{'':{width}}{'':>5} | {'':>9} {'':>7} {'':>7} | {'':>9} {'':>7} {'':>7} | {'':>6} | "
      f"{'tool/cove':>9} {'tool/cove':>9}")
    for r in rows:
        m = r[mode]
        f, c = m["first"], m[second]
        rf = rc = "-"
        if cove and r is not cove and mode in cove:
            rf = f"{f['p50'] / cove[mode]['first']['p50']:.2f}x"
            rc = f"{c['p50'] / cove[mode][second]['p50']:.2f}x"
        p(f"{r['tool']:{width}}{f['n']:>5} | {fmt(f['p50']):>9} {fmt(f['p95']):>7} "
          f"{fmt(f['mean']):>7} | {fmt(c['p50']):>9} {fmt(c['p95']):>7} {fmt(c['mean']):>7} "
          f"| {(per_s(m) if per_s else '-'):>6} | {rf:>9} {rc:>9}")


def print_report(info, results, memory, exec_results, args, wall, code_results=()):
    p = print
    p()
    p("== Machine")
    p(f"CPU: {info['cpu']}, {info['cores']} cores; RAM {info['ram_gib']} GiB; "
      f"kernel {info['kernel']}; {info['os']}; cgroups {info['cgroups']}")
    p("Versions: " + "; ".join(f"{k}: {v}" for k, v in info["versions"].items()))
    p()
    if results:
        p("== Tools")
    for r in results:
        p(f"{r['tool']:7} {r['note']}")
        if r.get("reduced"):
            p(f"        NOTE: {r['reduced']}")
    cove = next((r for r in results if r["tool"] == "cove"), None)
    titles = {"sequential": "Sequential, back to back",
              "concurrent": f"Concurrent, {args.concurrency} at once",
              "idle": f"Idle: one at a time, {args.idle_gap * 1000:.0f} ms pause before each"}
    for mode in ("sequential", "concurrent", "idle"):
        if not results or not all(mode in r for r in results):
            continue
        p()
        latency_table(p, f"{titles[mode]}: milliseconds (first = start -> \"hi\" received; "
                      "cycle = + end of command + teardown)", results, mode, "cycle", cove,
                      per_s=(lambda m: format(m["per_s"], "6.1f")) if mode != "idle" else None)
        if cove:
            m = cove[mode]
            p("cove phases p50/p95 (ms): " + ", ".join(
                f"{k} {fmt(m[k]['p50'])}/{fmt(m[k]['p95'])}"
                for k in ("create", "exec_first", "exec_rest", "delete")))
    if cove and "sequential" in cove:
        p()
        p("== Targets (sequential)")
        f = cove["sequential"]["first"]["p50"]
        p(f"cove create->first output p50 {f:.1f} ms: "
          f"{'MET' if f < 10 else 'NOT MET'} (target < 10 ms)")
        cr = next((r for r in results if r["tool"] == "crun"), None)
        if cr:
            ratio = cr["sequential"]["first"]["p50"] / f
            p(f"crun/cove first-output p50 ratio {ratio:.2f}x: "
              f"{'MET' if ratio >= 2 else 'NOT MET'} (target >= 2x)")
    if memory:
        p()
        p(f"== Memory: {memory['n']} idle Cove sandboxes (entrypoint sleep infinity), paused "
          f"(states seen: {', '.join(memory['states'])}); {memory['rounds']} rounds, "
          "median [min..max], KiB per sandbox")
        mi = memory["meminfo_per_sandbox_kib"]

        def mm(d):
            return f"{d['median']:.0f} [{d['min']:.0f}..{d['max']:.0f}]"
        p(f"host MemAvailable decrease: first round {memory['first_round_memavailable_kib']:.0f}; "
          f"all rounds {mm(mi['MemAvailable'])}")
        p(f"host used (free(1)) increase: first round {memory['first_round_used_kib']:.0f}; "
          f"all rounds {mm(mi['Used'])}")
        p(f"host used memory by /proc/meminfo field (AnonPages+Shmem+Slab+KernelStack+PageTables):"
          f" {mm(memory['accounted_kib'])}")
        p("  fields (median): " + ", ".join(
            f"{k} {mi[k]['median']:.0f}" for k in MEMINFO_FIELDS[2:]) +
          " (SUnreclaim is part of Slab)")
        p("  (MemFree/MemAvailable deltas of a few MB read low: pages freed earlier, by any "
          "process or by the previous round's deletions, wait on the kernel's per-CPU free lists,"
          " which MemFree does not count, and are reused first. The field sum and the cgroup "
          "charge are the steadier figures.)")
        p(f"  noise: MemAvailable moved by up to {memory['noise_kib']} KiB within 0.2 s,"
          f" i.e. ±{memory['noise_kib'] / memory['n']:.0f} KiB per sandbox")
        p(f"sum of cgroup {memory['cgroup_file']}: {mm(memory['cgroup_usage_kib_per_sandbox'])};"
          " breakdown: " + ", ".join(
              f"{k} {v:.0f}" for k, v in memory["cgroup_breakdown_kib_per_sandbox"].items()))
        p(f"coved RSS growth while holding {memory['n']}: "
          f"{memory['coved_rss_growth_kib']['median']:.0f} KiB in total; MemAvailable 0.5 s after "
          f"deleting them vs. before: {memory['not_returned_kib']['median']:.0f} KiB lower "
          "(all sandboxes; noise applies)")
    if exec_results:
        print_exec_report(exec_results, args)
    if code_results:
        code_interpreter.print_report(code_results, args)
    p()
    p(f"Total bench time {wall:.0f} s.")


def print_exec_report(exec_results, args):
    p = print

    def fmt(x):  # sub-millisecond rows (the ping) need the second digit
        return f"{x:.2f}" if x < 1 else globals()["fmt"](x)
    p()
    p("== Exec in a running environment: `echo hi`")
    for r in exec_results:
        p(f"{r['tool']:9} {r['note']}")
        if r.get("reduced"):
            p(f"          NOTE: {r['reduced']}")
    p("bwrap     skipped: there is no exec into a running bwrap")
    cove = next((r for r in exec_results if r["tool"] == "cove"), None)
    if cove and "connections" in cove:
        p(f"cove client connections: {cove['connections']} opened (one per client thread), "
          f"{cove['connections_lost']} closed by the server or unusable after a reply")
    if cove and "sandbox_cpu_ms_per_exec" in cove:
        p(f"cove CPU per exec: sandbox cgroup (agent, bash, echo) "
          f"{cove['sandbox_cpu_ms_per_exec']:.2f} ms; coved (API, gateway) "
          f"{cove.get('coved_cpu_ms_per_exec', float('nan')):.2f} ms")
    for mode, title in (("sequential", "back to back"),
                        ("concurrent", f"{args.concurrency} at once (Cove only)")):
        rows = [r for r in exec_results if mode in r]
        if not rows:
            continue
        p()
        latency_table(p, f"Exec, {title}: milliseconds (first = request -> \"hi\" received; "
                      "done = end of the event stream / exit of the exec command)", rows, mode,
                      "done", cove, per_s=lambda m: fmt(m["per_s"]), width=9)


# ---------------------------------------------------------------- main

def snapshot_globals():
    return {p: os.path.lexists(p) for p in TOOL_GLOBAL_PATHS}


def libpod_cgroups():
    return [d for d in glob.glob(f"/sys/fs/cgroup/*/{LIBPOD_CGROUP}") if os.path.isdir(d)]


def remove_new_globals(before, libpod_before):
    for path, existed in before.items():
        if not existed and os.path.lexists(path):
            unmount_under(path)
            if path in ("/run/crun", "/run/runc"):
                # Runtime state dirs: remove only if nothing else has state there now.
                try:
                    os.rmdir(path)
                except OSError:
                    log(f"cleanup: {path} not empty, left in place")
            elif os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.unlink(path)
                except OSError as e:
                    log(f"cleanup: {path}: {e}")
    if not libpod_before:
        for d in libpod_cgroups():
            for sub in sorted(glob.glob(os.path.join(d, "**/"), recursive=True), key=len,
                              reverse=True):
                try:
                    os.rmdir(sub)
                except OSError:
                    pass


def leftovers(tmp, cove_ids, crun_prefix, globals_before, libpod_before):
    left = []
    if mounts_under(tmp):
        left.append(f"mounts {mounts_under(tmp)}")
    if os.path.exists(tmp):
        left.append(f"temp dir {tmp}")
    for sid in cove_ids:
        left += [f"cgroup {d}" for d in glob.glob(f"/sys/fs/cgroup/*/cove/{sid}") +
                 glob.glob(f"/sys/fs/cgroup/cove/{sid}")]
    left += [f"crun container {c}" for c in crun_leftovers(crun_prefix)]
    left += [f"cgroup {d}" for d in glob.glob(f"/sys/fs/cgroup/*/{crun_prefix}*")]
    for path, existed in globals_before.items():
        if not existed and os.path.lexists(path):
            left.append(f"path {path}")
    if not libpod_before:
        left += [f"cgroup {d}" for d in libpod_cgroups()]
    for p in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            if tmp.encode() in open(p, "rb").read():
                left.append(f"process {p.split('/')[2]}")
        except OSError:
            pass
    return left


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=100,
                    help="iterations per tool of the start-up part, sequential and concurrent "
                         "(default 100)")
    ap.add_argument("--concurrency", type=int, default=20, help="in flight at once (default 20)")
    ap.add_argument("--warmup", type=int, default=3, help="uncounted iterations (default 3)")
    ap.add_argument("--memory-sandboxes", type=int, default=20,
                    help="paused idle sandboxes for the memory measurement (default 20)")
    ap.add_argument("--tools", default="cove,host,bwrap,crun,podman",
                    help="comma-separated subset of cove,host,bwrap,crun,podman")
    ap.add_argument("--idle-iterations", type=int, default=20,
                    help="iterations of the idle mode: one at a time, after a pause (default 20;"
                         " 0 skips it)")
    ap.add_argument("--idle-gap", type=float, default=0.1,
                    help="pause before each idle-mode iteration, seconds (default 0.1)")
    ap.add_argument("--memory-rounds", type=int, default=5,
                    help="repetitions of the memory measurement; the median is reported")
    ap.add_argument("--slow-threshold", type=float, default=1.0,
                    help="seconds per iteration above which a tool runs fewer iterations")
    ap.add_argument("--slow-iterations", type=int, default=20)
    ap.add_argument("--coved", default=os.path.join(BUILD, "src", "coved", "coved"))
    ap.add_argument("--agent", default=os.path.join(BUILD, "src", "agent", "cove-agent"))
    ap.add_argument("--cove-state-parent",
                    help="make coved's state dir under this directory instead of the bench's "
                         "temp dir (e.g. /dev/shm to take the disk out of the picture)")
    ap.add_argument("--only", default="startup,memory,exec,code",
                    help="comma-separated parts to run: startup (create, echo hi, delete), "
                         "memory (paused idle Cove sandboxes), exec (echo hi in a running "
                         "environment), code (1+1 in a python kernel: Cove and, with the host "
                         "tool, jupyter_client on the host); default all four")
    ap.add_argument("--code-iterations", type=int, default=200,
                    help="1+1 round trips in a running kernel (default 200)")
    ap.add_argument("--code-start-iterations", type=int, default=10,
                    help="sandbox (or host kernel) starts to a first result, per variant "
                         "(default 10)")
    ap.add_argument("--code-think-iterations", type=int, default=5,
                    help="first runs 1.5 s after the create, per variant (default 5)")
    ap.add_argument("--exec-iterations", type=int, default=200,
                    help="iterations of the exec part per tool, sequential (and, for Cove, "
                         "concurrent) (default 200; 0 skips it)")
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--worker-tmp", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    ap.add_argument("--worker-hide-unified", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        try:
            worker_main(args)
        except KeyboardInterrupt:
            return 130
        return 0
    if os.geteuid() != 0:
        log("bench: run as root (namespaces, cgroups, mounts)")
        return 2
    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    parts = {p.strip() for p in args.only.split(",") if p.strip()}
    bad = parts - {"startup", "memory", "exec", "code"} or \
        set(tools) - {"cove", "host", "bwrap", "crun", "podman"}
    if bad:
        log(f"bench: unknown part or tool: {', '.join(sorted(bad))}")
        return 2
    if args.memory_sandboxes <= 0:
        parts.discard("memory")
    if args.exec_iterations <= 0:
        parts.discard("exec")

    catch_signals()

    t_start = now()
    globals_before = snapshot_globals()  # first: even `crun --version` makes /run/crun
    info = machine_info()
    libpod_before = bool(libpod_cgroups())
    tmp = tempfile.mkdtemp(prefix="cove-bench-")
    results, memory, exec_results, code_results = [], None, [], []
    cove = None
    crun_prefix = os.path.basename(tmp) + "-"
    rc = 0
    try:
        if "cove" in tools:
            log("cove: starting coved ...")
            cove = Coved(tmp, args.coved, args.agent, args.cove_state_parent).start()
            if args.cove_state_parent:
                cove.note += f"; state dir under {args.cove_state_parent}"
            # Memory first, while few pages freed by this run itself sit on per-CPU free lists
            # (see the note printed with the result).
            if "memory" in parts:
                memory = measure_memory(cove, args.memory_sandboxes, args.memory_rounds)
            if "startup" in parts:
                results.append(measure_tool(cove, args))
            if "exec" in parts:
                log("cove: exec: one running sandbox ...")
                exec_results += measure_cove_exec(cove, args)
            if "code" in parts:
                log("cove: code interpreter ...")
                code_results.append(code_interpreter.measure_cove(cove, args, EventStream))
        if "code" in parts and "host" in tools:
            log("host: code interpreter (jupyter_client) ...")
            code_results.append(code_interpreter.measure_host(args))
        for name in tools:
            if name == "cove" or not parts & {"startup", "exec"}:
                continue
            if name == "bwrap" and "startup" not in parts:
                continue  # no exec into a running bwrap
            log(f"{name}: ...")
            start = ex = None
            if name == "crun" and cgroup_mode() == "hybrid":
                start, ex = run_crun_isolated(args, tmp, parts)
            elif name in ("crun", "podman"):
                cls = {"crun": Crun, "podman": Podman}[name]
                start, ex = measure_container_tool(cls(tmp), args, parts)
            else:
                tool = {"host": HostExec, "bwrap": Bwrap}[name](tmp)
                try:
                    tool.setup()
                    if "startup" in parts:
                        start = measure_tool(tool, args)
                    if "exec" in parts and name == "host":
                        ex = measure_exec(ProcExec(tool), args)
                finally:
                    tool.cleanup()
            if start:
                results.append(start)
            if ex:
                exec_results.append(ex)
    except KeyboardInterrupt as e:
        log(f"bench: interrupted ({e}); cleaning up")
        rc = 130
    except Exception as e:  # noqa: BLE001 - report, clean up, fail
        log(f"bench: FAILED: {e}")
        if cove:
            log("coved log tail:\n" + cove.log())
        rc = 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        all_cove_ids = cove.all_ids if cove else set()
        if cove:
            cove.stop(all_cove_ids)
        if crun_leftovers(crun_prefix):  # only if a crun worker died without cleaning up
            delete_crun_leftovers(tmp)
        unmount_under(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        remove_new_globals(globals_before, libpod_before)
        left = leftovers(tmp, all_cove_ids, crun_prefix, globals_before, libpod_before)
        if cove and cove.state_tmp and os.path.exists(cove.state_tmp):
            left.append(f"state dir {cove.state_tmp}")
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if results or memory or exec_results or code_results:
        print_report(info, results, memory, exec_results, args, now() - t_start, code_results)
    print()
    print("Cleanup check: " + ("nothing left behind (coved, sandboxes, cgroups, mounts, "
                               "containers, temp dir)" if not left else "LEFT: " + "; ".join(left)))
    if left and rc == 0:
        rc = 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": info, "results": results, "memory": memory,
                       "exec": exec_results, "code": code_results, "leftovers": left}, f,
                      indent=1)
    return rc


if __name__ == "__main__":
    sys.exit(main())
