"""Test harness: starts a real coved on its own state dir and port, talks to it over HTTP,
and cleans up every process, cgroup and file it made, even when a test fails."""

import contextlib
import glob
import http.client
import json
import os
import secrets
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Absolute: tests run the binaries from other working directories too.
BUILD = os.path.abspath(os.environ.get("COVE_BUILD_DIR", os.path.join(ROOT, "build")))
COVED = os.path.join(BUILD, "src", "coved", "coved")
# The sanitizer pass runs a dynamic agent built with ASan+UBSan (cove-agent-sanitized).
AGENT = os.environ.get("COVE_AGENT", os.path.join(BUILD, "src", "agent", "cove-agent"))
AGENT_SANITIZED = os.path.basename(AGENT) == "cove-agent-sanitized"
CLI = os.path.join(BUILD, "src", "cli", "cove")
AGENT_PORT = 44772


class ApiError(Exception):
    def __init__(self, status, body):
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body


class ExecResult:
    def __init__(self, events):
        self.events = events
        # execd sends a line per event, its ending stripped; an empty line comes as "\n".
        line = lambda t: "\n" if t == "\n" else t + "\n"
        self.stdout = "".join(line(e["text"]) for e in events if e.get("type") == "stdout")
        self.stderr = "".join(line(e["text"]) for e in events if e.get("type") == "stderr")
        self.exit_code = None
        for e in events:
            if e.get("type") == "execution_complete" and self.exit_code is None:
                self.exit_code = 0
            if e.get("type") == "error":
                err = e.get("error") or {}
                try:
                    self.exit_code = int(err.get("evalue"))
                except (TypeError, ValueError):
                    self.exit_code = -1


def parse_events(raw):
    """Splits an execd event stream into JSON events (bare JSON or `data:` lines)."""
    events = []
    for block in raw.replace("\r\n", "\n").split("\n\n"):
        lines = [l[5:].lstrip() if l.startswith("data:") else l for l in block.split("\n")
                 if l and not l.startswith((":", "event:", "id:"))]
        if lines:
            events.append(json.loads("\n".join(lines)))
    return events


def cgroup_dirs(sandbox_id):
    """Every cgroup directory (v1 or v2) Cove may have made for a sandbox."""
    return [d for d in glob.glob(f"/sys/fs/cgroup/**/cove/{sandbox_id}", recursive=True)
            if os.path.isdir(d)]


def kill_cgroup(sandbox_id):
    for d in cgroup_dirs(sandbox_id):
        for state in glob.glob(os.path.join(d, "freezer.state")):
            try:
                open(state, "w").write("THAWED")
            except OSError:
                pass
        for kill in glob.glob(os.path.join(d, "cgroup.kill")):
            try:
                open(kill, "w").write("1")
            except OSError:
                pass
        for _ in range(200):
            try:
                pids = [int(p) for p in open(os.path.join(d, "cgroup.procs")).read().split()]
            except OSError:
                break
            if not pids:
                break
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.01)
        for _ in range(200):
            try:
                os.rmdir(d)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.01)


class Coved:
    """One coved process with its own state dir and port."""

    def __init__(self, api_keys=("test-key",), extra_args=(), state_dir=None, env=None,
                 wrapper=(), coved=COVED, agent=AGENT, admin_keys=()):
        """coved, agent: the binaries (the bench runs private copies of the build's)."""
        self.state_dir = state_dir or tempfile.mkdtemp(prefix="cove-test-")
        self.coved_path, self.agent_path = coved, agent
        self.api_keys = list(api_keys)
        self.key = self.api_keys[0] if self.api_keys else None
        self.admin_keys = list(admin_keys)  # --admin-api-key: templates, quotas
        self.admin_key = self.admin_keys[0] if self.admin_keys else None
        self.extra_args = list(extra_args)
        self.wrapper = list(wrapper)  # e.g. valgrind and its options
        self.env = env
        self.proc = None
        self.port = None
        self.log_path = os.path.join(self.state_dir, "coved.log")
        self.returncode = None
        self.final_log = ""

    def start(self, port=0, new_session=False):
        """new_session: coved leads a session and process group of its own, as a shell's
        foreground job does (its group is then os.getpgid(coved.proc.pid))."""
        args = self.wrapper + [self.coved_path, "--listen", f"127.0.0.1:{port}", "--state-dir",
                               self.state_dir, "--agent", self.agent_path]
        for k in self.api_keys:
            args += ["--api-key", k]
        for k in self.admin_keys:
            args += ["--admin-api-key", k]
        args += self.extra_args
        # The runtime the suite runs under (conftest.py): unless a test names one itself.
        runtime = os.environ.get("COVE_TEST_RUNTIME", "native")
        if runtime != "native" and "--default-runtime" not in self.extra_args:
            args += ["--default-runtime", runtime]
        log = open(self.log_path, "ab")
        env = dict(self.env or os.environ)
        # Tests never reach a registry off this host: images come from loopback ones only.
        env.setdefault("COVE_IMAGE_REGISTRIES", "loopback")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, env=env,
                                     start_new_session=new_session)
        line = self.proc.stdout.readline().decode()
        if "ready on" not in line:
            self.proc.wait(5)
            raise RuntimeError(f"coved did not start: {line!r}\n{self.log()}")
        self.port = int(line.strip().rsplit(":", 1)[1])
        self.wait_for_mcp_child(args)
        return self

    def wait_for_mcp_child(self, args, timeout=10):
        """coved starts its MCP server (`cove mcp serve`) as it comes up: until that child
        has exec'd it looks like any other child of coved, which tests counting coved's
        descendants would take for a sandbox's. Waits until it runs (if coved has one)."""
        i = args.index("--mcp-command") if "--mcp-command" in args else -1
        if i >= 0 and i + 1 < len(args) and args[i + 1] == "none":
            return
        deadline = time.time() + timeout
        while time.time() < deadline and self.proc.poll() is None:
            if any(is_mcp_server(p) for p in descendants(self.proc.pid, helpers=True)):
                return
            log = self.log()
            if "no MCP server" in log or "cannot start the MCP server" in log:
                return
            time.sleep(0.02)

    def log(self):
        try:
            return open(self.log_path).read()
        except OSError:
            return ""

    def kill(self, sig=signal.SIGTERM):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(60 if self.wrapper else 10)
        if self.proc and self.proc.stdout:
            self.proc.stdout.close()

    def known_sandboxes(self):
        db = os.path.join(self.state_dir, "cove.db")
        if not os.path.exists(db):
            return []
        con = sqlite3.connect(db)
        try:
            return [r[0] for r in con.execute("SELECT id FROM sandboxes")]
        except sqlite3.Error:
            return []
        finally:
            con.close()

    def cleanup(self):
        """Stops coved and removes whatever its sandboxes left, whatever state they are in.
        coved gets SIGTERM first so that a sanitizer build reports leaks at exit."""
        ids = self.known_sandboxes()
        try:
            self.kill(signal.SIGTERM)
        except subprocess.TimeoutExpired:
            self.kill(signal.SIGKILL)
        self.returncode = self.proc.returncode if self.proc else None
        self.final_log = self.log()
        for i in ids:
            kill_cgroup(i)
        run = os.path.join(self.state_dir, "run")
        for i in ids + (os.listdir(run) if os.path.isdir(run) else []):
            kill_cgroup(i)
        shutil.rmtree(self.state_dir, ignore_errors=True)

    # ---- HTTP ----

    def headers(self, key=None):
        h = {"Content-Type": "application/json"}
        k = self.key if key is None else key
        if k:
            h["OPEN-SANDBOX-API-KEY"] = k
        return h

    def request(self, method, path, body=None, headers=None, raw=None, timeout=60):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        conn.request(method, path, body=data,
                     headers=headers if headers is not None else self.headers())
        resp = conn.getresponse()
        payload = resp.read()
        conn.close()
        text = payload.decode(errors="replace")
        try:
            parsed = json.loads(text) if text else None
        except json.JSONDecodeError:
            parsed = text
        return resp.status, parsed, resp

    def ok(self, method, path, body=None, expect=(200,), **kw):
        status, parsed, _ = self.request(method, path, body, **kw)
        if status not in expect:
            raise ApiError(status, parsed)
        return parsed

    def create(self, template="base", entrypoint=("sleep", "infinity"), limits=None, **extra):
        body = {"image": {"uri": template}, "entrypoint": list(entrypoint),
                "resourceLimits": limits or {"cpu": "1", "memory": "512Mi"}}
        body.update(extra)
        return self.ok("POST", "/v1/sandboxes", body, expect=(202,))["id"]

    def get(self, sandbox_id):
        return self.ok("GET", f"/v1/sandboxes/{sandbox_id}")

    def delete(self, sandbox_id):
        return self.ok("DELETE", f"/v1/sandboxes/{sandbox_id}", expect=(204,))

    def health(self, timeout=30):
        return self.ok("GET", "/health", timeout=timeout)

    def pause(self, sandbox_id):
        return self.ok("POST", f"/v1/sandboxes/{sandbox_id}/pause", expect=(202,))

    def resume(self, sandbox_id):
        return self.ok("POST", f"/v1/sandboxes/{sandbox_id}/resume", expect=(202,))

    def exec(self, sandbox_id, command, timeout_ms=None, key=None, http_timeout=120, **extra):
        body = {"command": command}
        if timeout_ms is not None:
            body["timeout"] = timeout_ms
        body.update(extra)
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=http_timeout)
        conn.request("POST", f"/sandboxes/{sandbox_id}/proxy/{AGENT_PORT}/command",
                     body=json.dumps(body), headers=self.headers(key))
        resp = conn.getresponse()
        raw = resp.read().decode(errors="replace")
        conn.close()
        if resp.status != 200:
            raise ApiError(resp.status, raw)
        return ExecResult(parse_events(raw))

    def sh(self, sandbox_id, command, **kw):
        """Runs a command that must succeed; returns its stdout."""
        r = self.exec(sandbox_id, command, **kw)
        assert r.exit_code == 0, f"{command!r} failed ({r.exit_code}): {r.stderr}"
        return r.stdout

    def run_dir(self, sandbox_id):
        return os.path.join(self.state_dir, "run", sandbox_id)


@contextlib.contextmanager
def serve(*extra_args, start=True, **kw):
    """A coved of its own (started unless start=False) for a fixture: cleaned up afterwards,
    and with a sanitizer build, checked for what ASan/UBSan/LSan reported."""
    d = Coved(extra_args=list(extra_args), **kw)
    try:
        if start:
            d.start()
        yield d
    finally:
        d.cleanup()
    problems = sanitizer_problems(d)
    assert problems is None, problems


def sanitizer_problems(coved):
    """With a sanitizer build (COVE_SANITIZED=1): what ASan/UBSan/LSan reported, if anything."""
    if not os.environ.get("COVE_SANITIZED") or coved.proc is None:
        return None
    markers = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")
    found = [line for line in coved.final_log.splitlines() if any(m in line for m in markers)]
    if coved.returncode not in (0, None) or found:
        return f"coved exit {coved.returncode}; " + "\n".join(found[:20])
    return None


def comm(pid):
    """The command name of a host process, or "" once it is gone."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def sandbox_leftovers(coved, sandbox_id):
    """What a deleted sandbox left on the host: cgroups, run dir, processes."""
    left = []
    if cgroup_dirs(sandbox_id):
        left.append(f"cgroups {cgroup_dirs(sandbox_id)}")
    if os.path.exists(coved.run_dir(sandbox_id)):
        left.append(f"run dir {coved.run_dir(sandbox_id)}")
    for p in glob.glob("/proc/[0-9]*/environ"):
        try:
            if f"HOSTNAME={sandbox_id}".encode() in open(p, "rb").read().split(b"\0"):
                left.append(f"process {p.split('/')[2]}")
        except OSError:
            pass
    with open("/proc/self/mountinfo") as f:
        for line in f:
            if sandbox_id in line:
                left.append(f"mount {line.split()[4]}")
    left += [f"loop device {dev}" for dev in loop_devices_of(coved.run_dir(sandbox_id))]
    return left


def loop_devices_of(run_dir, wait_s=2.0):
    """Loop devices whose backing file (a disk layer's image) is in run_dir. The kernel clears
    one when the sandbox's mount namespace lets go of it: given a moment to."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for f in glob.glob("/sys/block/loop*/loop/backing_file"):
            try:
                if open(f).read().strip().startswith(run_dir.rstrip("/") + "/"):
                    found.append("/dev/" + f.split("/")[3])
            except OSError:
                pass
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


# ---- host-side views of a sandbox ----

def cgroup_file(sandbox_id, controller, name):
    """A control file of the sandbox's cgroup, stripped, or None. `controller` names the v1
    hierarchy to look in; on cgroup v2 every file is in the sandbox's one directory."""
    for d in cgroup_dirs(sandbox_id):
        v2 = os.path.exists(os.path.join(d, "cgroup.controllers"))
        if v2 or f"/{controller}/cove/" in d:
            try:
                with open(os.path.join(d, name)) as f:
                    return f.read().strip()
            except OSError:
                pass
    return None


def sandbox_host_pids(sandbox_id):
    """Host pids of the processes in the sandbox's cgroup."""
    procs = cgroup_file(sandbox_id, "pids", "cgroup.procs")
    return [int(p) for p in procs.split()] if procs else []


def sandbox_init_pid(sandbox_id):
    """Host pid of the sandbox's PID 1 (the agent), or None."""
    for pid in sandbox_host_pids(sandbox_id):
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("NSpid:") and line.split()[-1] == "1":
                        return pid
        except OSError:
            pass
    return None


def is_mcp_server(pid):
    """Whether pid is the MCP server coved runs behind /mcp (`cove mcp serve`)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"\0mcp\0serve\0" in f.read()
    except OSError:
        return False


def is_coved_helper(pid, coved=None):
    """Whether pid is a process coved runs for itself rather than for a sandbox: the MCP
    server behind /mcp, or the spares' maker (a child of coved named coved-spares, which
    refills the spares and empties the run trash after creates and deletes). With coved,
    the maker counts only as that process's own child."""
    if is_mcp_server(pid):
        return True
    try:
        with open(f"/proc/{pid}/comm") as f:
            if f.read().strip() != "coved-spares":
                return False
        with open(f"/proc/{pid}/stat") as f:
            parent = int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return False
    return coved is None or parent == coved


def descendants(pid, helpers=False):
    """Host pids of every live descendant of pid; coved's own helpers (and theirs) only with
    helpers=True."""
    children = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.split("/")[2]))
    found, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if helpers or not is_coved_helper(c, pid):
                found.append(c)
                todo.append(c)
    return found


def settled_fds(pid, timeout=15):
    """coved's open descriptors once they stop moving: right after a create or a delete its
    stock of spares (src/coved/runtime/spares.h: namespaces, layers and run dirs, each a
    descriptor) is being refilled, which takes a moment after creates pause. The count, once
    it read the same 5 times 0.1 s apart (or when timeout passed)."""
    deadline = time.time() + timeout
    last, same = None, 0
    while time.time() < deadline:
        n = len(os.listdir(f"/proc/{pid}/fd"))
        same = same + 1 if n == last else 0
        last = n
        if same >= 4:
            break
        time.sleep(0.1)
    return last


def answer_complete(reply):
    """True once reply holds a head and all the body its Content-Length announces."""
    head, sep, body = reply.partition(b"\r\n\r\n")
    if not sep:
        return False
    lengths = [int(line.split(b":")[1]) for line in head.split(b"\r\n")
               if line.lower().startswith(b"content-length:")]
    return len(body) >= (lengths[0] if lengths else 0)


def send_head_then_read(port, method, path, length, body_start=b"", headers=None):
    """Sends a request head announcing `length` body bytes (and the start of the body), then
    reads the answer without sending the rest: a server that refuses a body that size answers
    before it has come. (status, parsed body); a connection closed without an answer is a
    failure, never taken as the answer expected."""
    import socket
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\n{extra}"
                  f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
                  .encode() + body_start)
        reply = b""
        while not answer_complete(reply):
            chunk = s.recv(65536)
            assert chunk, f"connection closed without an answer: {reply!r}"
            reply += chunk
    finally:
        s.close()
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(body)


def run_dirs(coved):
    """The names in coved's STATE/run: one per sandbox it holds."""
    run = os.path.join(coved.state_dir, "run")
    return sorted(os.listdir(run)) if os.path.isdir(run) else []


def host_markers(prefix, dirs=("/root", "/tmp")):
    """Files with a unique name (prefix + random) and secret content in host directories, outside
    any sandbox: a generator for a fixture, yielding (name, secret, paths); afterwards it asserts
    each is unchanged and removes it."""
    name = prefix + secrets.token_hex(6)
    secret = secrets.token_hex(16)
    paths = []
    for d in dirs:
        p = os.path.join(d, name)
        with open(p, "w") as f:
            f.write(secret)
        paths.append(p)
    yield name, secret, paths
    for p in paths:
        with open(p) as f:
            assert f.read() == secret, f"host marker {p} changed"
        os.unlink(p)


BUSYBOX = shutil.which("busybox") or "/usr/bin/busybox"


def busybox_rootfs(path, applets=("sh", "sleep")):
    """A root filesystem with a static busybox (those applets linked) and nothing else: no libc,
    no Jupyter, none of the kernel helper's libraries."""
    path = str(path)
    os.makedirs(os.path.join(path, "bin"))
    shutil.copy(BUSYBOX, os.path.join(path, "bin", "busybox"))
    for applet in applets:
        os.symlink("busybox", os.path.join(path, "bin", applet))
    for d in ("proc", "sys", "dev", "tmp", "etc", "root"):
        os.makedirs(os.path.join(path, d), exist_ok=True)
    os.chmod(os.path.join(path, "tmp"), 0o1777)


def busybox_template(coved, path, prefix):
    """busybox_rootfs(path) registered with `cove template add` (the daemon's admin key) under
    a new name starting with prefix; returns the name."""
    busybox_rootfs(path)
    env = dict(os.environ, COVE_SERVER=f"http://127.0.0.1:{coved.port}",
               COVE_API_KEY=coved.admin_key)
    name = prefix + secrets.token_hex(3)
    subprocess.run([CLI, "template", "add", name, "--rootfs", str(path)], env=env, check=True,
                   capture_output=True, timeout=60)
    return name
