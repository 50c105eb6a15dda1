"""How each tool of the bench is started and driven: host (plain fork+exec), bwrap, crun and
podman as processes that print "hi", and Cove over its HTTP API, on a coved started by the
test suite's launcher (tests/covetest.py). One iteration of any of them is `tool.once()`."""

import glob
import http.client
import itertools
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading

from machine import log, now, read_int, read_stat, unmount_under

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests"))
import covetest  # noqa: E402 - the test suite's coved launcher, found through sys.path

AGENT_PORT = covetest.AGENT_PORT
BUSYBOX = "/usr/bin/busybox"
BUSYBOX_APPLETS = ["sh", "echo", "sleep", "cat", "true", "ls"]
# Host paths the container tools create on first use. Whatever of these did not exist before
# the run is removed after it.
# (`crun --version` alone makes /run/crun; podman makes /dev/shm/libpod_lock and the others.)
TOOL_GLOBAL_PATHS = ["/run/crun", "/run/runc", "/run/libpod", "/run/containers",
                     "/run/mount", "/var/lib/containers", "/etc/containers/networks",
                     "/dev/shm/libpod_lock"]
CRUN_STATE = "/run/crun"
LIBPOD_CGROUP = "libpod_parent"


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

class Cove:
    """Cove over its HTTP API, on a private coved started by the test suite's launcher
    (covetest.Coved) from copies of the build's binaries, with its own port, key and state
    dir: keep-alive connections to the API, one per client thread, and the gateway."""

    def __init__(self, tmp, coved_path, agent_path, state_parent=None, layer=None, admin=False,
                 extra_args=()):
        self.dir = os.path.join(tmp, "cove")
        self.extra_args = list(extra_args)  # more of coved's flags
        self.admin = admin  # its key an admin key too (the pools' API)
        # The state dir (database and run dirs) lives in the bench's temp dir unless asked
        # to live elsewhere (e.g. on a tmpfs, to see what the disk costs).
        self.state_parent = state_parent
        self.layer = layer  # coved's --layer (disk, its default, or tmpfs)
        self.key = secrets.token_hex(16)
        self.coved_src, self.agent_src = coved_path, agent_path
        self.daemon = None  # covetest.Coved
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
        # Private copies: the build dir may be rebuilt by someone else during the run.
        bindir = os.path.join(self.dir, "bin")
        os.makedirs(bindir)
        coved = os.path.join(bindir, "coved")
        agent = os.path.join(bindir, "cove-agent")
        shutil.copy2(self.coved_src, coved)
        shutil.copy2(self.agent_src, agent)
        # Found next to coved, like the agent: the code-interpreter part needs it.
        kernel_src = os.path.join(os.path.dirname(os.path.dirname(self.agent_src)), "kernel",
                                  "cove-kernel")
        if os.path.exists(kernel_src):
            shutil.copy2(kernel_src, os.path.join(bindir, "cove-kernel"))
        # What the oci and gvisor runtimes need next to coved (cove-shim, the gVisor preload).
        for helper in ("cove-shim", "cove-gvisor-compat.so"):
            src = os.path.join(os.path.dirname(self.coved_src), helper)
            if os.path.exists(src):
                shutil.copy2(src, os.path.join(bindir, helper))
        if self.state_parent:
            state = tempfile.mkdtemp(prefix="cove-bench-state-", dir=self.state_parent)
        else:
            state = os.path.join(self.dir, "state")
            os.makedirs(state)
        self.daemon = covetest.Coved(api_keys=(self.key,), state_dir=state, coved=coved,
                                     admin_keys=(self.key,) if self.admin else (),
                                     agent=agent, extra_args=["--log-level", log_level] +
                                     (["--layer", self.layer] if self.layer else []) +
                                     self.extra_args)
        # Its own session: a Ctrl-C on the terminal must reach the bench only, which then
        # deletes the sandboxes through the API before stopping coved.
        self.daemon.start(new_session=True)
        return self

    @property
    def port(self):
        return self.daemon.port if self.daemon else None

    @property
    def pid(self):
        return self.daemon.proc.pid

    def log(self):
        return self.daemon.log()[-3000:] if self.daemon else ""

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

    def create(self, template="base", memory="512Mi", entrypoint=("sleep", "infinity")):
        status, payload = self.request("POST", "/v1/sandboxes", {
            "image": {"uri": template}, "entrypoint": list(entrypoint),
            "resourceLimits": {"cpu": "1", "memory": memory}})
        if status != 202:
            raise RuntimeError(f"create {template}: HTTP {status}: {payload[:300]!r}")
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

    def gateway_request(self, sid, command):
        """POST .../proxy/44772/command of command, or GET .../ping for command=None."""
        if command is None:
            return (f"GET /sandboxes/{sid}/proxy/{AGENT_PORT}/ping HTTP/1.1\r\n"
                    f"Host: 127.0.0.1:{self.port}\r\nOPEN-SANDBOX-API-KEY: {self.key}\r\n"
                    "\r\n").encode()
        body = json.dumps({"command": command}).encode()
        return (f"POST /sandboxes/{sid}/proxy/{AGENT_PORT}/command HTTP/1.1\r\n"
                f"Host: 127.0.0.1:{self.port}\r\nOPEN-SANDBOX-API-KEY: {self.key}\r\n"
                f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode() + body

    @staticmethod
    def read_response(s, expect):
        """Reads one response off the socket s: (its EventStream, the time the stdout line
        `expect` arrived, or None)."""
        stream = EventStream()
        t_first = None
        while not stream.done:
            data = s.recv(65536)
            if not data:
                break
            for ev in stream.feed(data):
                if (t_first is None and ev.get("type") == "stdout"
                        and ev.get("text", "").strip() == expect):
                    t_first = now()
        return stream, t_first

    def exec_first(self, sid, command="echo hi", expect="hi"):
        """Runs a command through the gateway on a new connection; returns (time of first
        expected output, time of end of stream)."""
        s = socket.create_connection(("127.0.0.1", self.port), timeout=60)
        try:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.sendall(self.gateway_request(sid, command))
            stream, t_first = self.read_response(s, expect)
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
        req = self.gateway_request(sid, command)
        s = getattr(self.local, "gw", None)
        if s is None:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=60)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.local.gw = s
            with self.lock:
                self.gw_connects += 1
        t0 = now()
        try:
            s.sendall(req)
            stream, t_first = self.read_response(s, expect)
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
            f = open(f"/proc/{self.pid}/stat").read().rsplit(")", 1)[1].split()
            coved = (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            coved = None
        return sb, coved

    def cgroup_memory_dir(self, sid):
        for d in (f"/sys/fs/cgroup/memory/cove/{sid}", f"/sys/fs/cgroup/cove/{sid}"):
            if os.path.isdir(d):
                return d
        return None

    def stop(self):
        """Deletes what is left through the API, stops coved, and removes by hand whatever
        a failure may have left (processes, cgroups, mounts, its state dir)."""
        if self.daemon is None:
            return
        proc = self.daemon.proc
        if proc and proc.poll() is None and self.port:
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
        try:
            self.daemon.kill(signal.SIGTERM)
        except subprocess.TimeoutExpired:
            self.daemon.kill(signal.SIGKILL)
        for sid in self.all_ids:
            covetest.kill_cgroup(sid)
        # Mounts first: removing the state dir must not reach into what is mounted there.
        unmount_under(self.dir)
        unmount_under(self.daemon.state_dir)
        self.daemon.cleanup()

    def leftovers(self):
        left = [f"cgroup {d}" for sid in self.all_ids for d in covetest.cgroup_dirs(sid)]
        if self.daemon and os.path.exists(self.daemon.state_dir):
            left.append(f"state dir {self.daemon.state_dir}")
        return left

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



# ---------------------------------------------------------------- what the tools leave on the host

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

