"""cove-agent as an isolated session's agent (OSEP-0013): --route-prefix, POST PREFIX/run,
--run-as and --workdir. The static agent runs directly on the host (no sandbox, no coved),
listening on a unix socket in a temporary directory; every request goes over that socket,
and what the agent did is checked on the host's own files."""

import contextlib
import http.client
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse

import pytest

from covetest import AGENT, parse_events

PREFIX = "/v1/isolated/session/abc"
RUN_AS = (1000, 1000)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="--run-as needs root")


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=60):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


class Agent:
    def __init__(self, socket_path, workdir):
        self.socket_path = socket_path
        self.workdir = workdir

    def call(self, method, path, body=None, raw=None, headers=None, timeout=60):
        conn = UnixConnection(self.socket_path, timeout=timeout)
        try:
            data = raw if raw is not None else (json.dumps(body) if body is not None else None)
            conn.request(method, path, body=data, headers=headers or {})
            resp = conn.getresponse()
            text = resp.read().decode(errors="replace")
            content_type = resp.getheader("Content-Type") or ""
            if "json" in content_type and text:
                return resp.status, json.loads(text), resp
            return resp.status, text, resp
        finally:
            conn.close()

    def events(self, path, body, timeout=60):
        status, text, resp = self.call("POST", path, body, timeout=timeout)
        assert status == 200, (status, text)
        assert (resp.getheader("Content-Type") or "").startswith("text/event-stream")
        return parse_events(text)


def listening(path):
    """Whether a unix socket at path takes connections."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


@contextlib.contextmanager
def start_agent(*flags):
    """The agent with flags on a fresh socket, in a fresh work directory; stopped (and
    everything it started with it) at the end, even when the test fails."""
    top = tempfile.mkdtemp(prefix="cove-isoagent-")
    os.chmod(top, 0o755)  # the --run-as user works in it
    work = os.path.join(top, "work")
    os.mkdir(work)
    os.chmod(work, 0o777)
    sock = os.path.join(top, "agent.sock")
    log = open(os.path.join(top, "agent.log"), "wb")
    proc = subprocess.Popen([AGENT, "--listen", "unix:" + sock, "--workdir", work, *flags],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        # The socket's file exists from its bind, before the agent listens: until a
        # connect is taken, it is not there yet.
        while not listening(sock):
            assert proc.poll() is None, open(log.name).read()
            assert time.monotonic() < deadline, "the agent did not listen"
            time.sleep(0.02)
        yield Agent(sock, work)
        stop(proc)
        with open(log.name, errors="replace") as f:
            text = f.read()
        # The sanitizer pass (COVE_AGENT=cove-agent-sanitized) reports here.
        for marker in ("AddressSanitizer", "LeakSanitizer", "runtime error:"):
            assert marker not in text, text
        assert proc.returncode == 0, text
    finally:
        stop(proc)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # anything left in its group
        log.close()
        shutil.rmtree(top, ignore_errors=True)


def cwd_of(pid):
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def agent():
    with start_agent("--route-prefix", PREFIX, "--run-as", "%d:%d" % RUN_AS) as a:
        yield a


def q(path):
    return urllib.parse.quote(path, safe="/")


def check_error(status, body, expect_status):
    assert status == expect_status, (status, body)
    assert isinstance(body, dict) and set(body) == {"code", "message"}, body
    assert body["code"] and body["message"], body


def stdout_of(events):
    return [e["text"] for e in events if e.get("type") == "stdout"]


def multipart(meta, content):
    boundary = "cove-" + secrets.token_hex(8)
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"metadata\"; "
            f"filename=\"metadata\"\r\nContent-Type: application/json\r\n\r\n".encode()
            + json.dumps(meta).encode() + b"\r\n"
            + f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
            f"filename=\"blob\"\r\nContent-Type: application/octet-stream\r\n\r\n".encode()
            + content + b"\r\n" + f"--{boundary}--\r\n".encode())
    return body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}


# ---- the route prefix ----

def test_prefixed_files_and_directories(agent):
    path = os.path.join(agent.workdir, "info-me")
    with open(path, "w") as f:
        f.write("12345")
    status, body, _ = agent.call("GET", f"{PREFIX}/files/info?path={q(path)}")
    assert status == 200, body
    assert body[path]["size"] == 5, body
    status, body, _ = agent.call("GET", f"{PREFIX}/directories/list?path={q(agent.workdir)}")
    assert status == 200, body
    assert "info-me" in json.dumps(body), body
    status, body, _ = agent.call("GET", f"{PREFIX}/ping")
    assert status == 200, body


@pytest.mark.parametrize("path", [
    "/files/info?path=/",          # no prefix
    "/ping",
    "/v1/isolated/session/abcd/files/info?path=/",  # a longer id is another session
    "/v1/isolated/session/ab/files/info?path=/",
    "/v1/isolated/session/files/info?path=/",
    f"{PREFIX}",                   # the prefix alone is no route
    f"/x{PREFIX}/files/info?path=/",
])
def test_paths_outside_the_prefix_are_404(agent, path):
    status, body, _ = agent.call("GET", path)
    check_error(status, body, 404)


def test_run_needs_post_and_the_prefix(agent):
    status, body, _ = agent.call("GET", f"{PREFIX}/run")
    check_error(status, body, 405)
    status, body, _ = agent.call("POST", "/run", {"code": "true"})
    check_error(status, body, 404)


def test_without_a_prefix_there_is_no_run():
    with start_agent() as plain:
        status, body, _ = plain.call("POST", "/run", {"code": "true"})
        check_error(status, body, 404)
        status, body, _ = plain.call("GET", f"/files/info?path={q(plain.workdir)}")
        assert status == 200, body
        # Without --run-as, commands keep the agent's identity.
        events = plain.events("/command", {"command": "id -u"})
        assert stdout_of(events) == [str(os.geteuid())], events


@pytest.mark.parametrize("flags", [
    ["--route-prefix", "v1/isolated"],
    ["--route-prefix", "/v1/a?b"],
    ["--route-prefix", "/v1/a/"],
    ["--route-prefix", "/v1//a"],
    ["--route-prefix", "/"],
    ["--route-prefix", "/v1/%61"],
    ["--route-prefix", "/" + "a" * 300],
    ["--run-as", "1000"],
    ["--run-as", "x:1"],
    ["--run-as", "-1:5"],
    ["--run-as", "1000:"],
    ["--run-as", "4294967295:0"],
    ["--workdir", "/nonexistent/cove-test"],
])
def test_bad_flags_are_refused(flags):
    top = tempfile.mkdtemp(prefix="cove-isoagent-")
    try:
        sock = os.path.join(top, "agent.sock")
        proc = subprocess.run([AGENT, "--listen", "unix:" + sock, *flags], timeout=10,
                              stdin=subprocess.DEVNULL, capture_output=True)
        assert proc.returncode == 2, proc
        assert not os.path.exists(sock)
    finally:
        shutil.rmtree(top, ignore_errors=True)


# ---- POST PREFIX/run ----

def test_run_streams_the_events_of_command(agent):
    events = agent.events(f"{PREFIX}/run", {"code": "id -u; id -g; echo hi; pwd"})
    types = [e["type"] for e in events]
    assert types[0] == "init" and types[-1] == "execution_complete", events
    assert stdout_of(events) == ["1000", "1000", "hi", agent.workdir], events
    # The same shape as POST /command gives for the same command.
    command = agent.events(f"{PREFIX}/command", {"command": "id -u; id -g; echo hi; pwd"})
    assert [e["type"] for e in command] == types, (command, events)
    assert stdout_of(command) == stdout_of(events)


def test_run_applies_envs_and_cwd(agent):
    cwd = os.path.join(agent.workdir, "sub")
    os.makedirs(cwd, exist_ok=True)
    events = agent.events(f"{PREFIX}/run", {"code": "echo \"$FOO-$BAR\"; pwd; echo oops >&2",
                                            "envs": {"FOO": "one", "BAR": "two words"},
                                            "cwd": cwd, "unknown_field": [1, 2]})
    assert stdout_of(events) == ["one-two words", cwd], events
    assert [e["text"] for e in events if e["type"] == "stderr"] == ["oops"], events
    assert events[-1]["type"] == "execution_complete", events


def test_run_failure_is_the_command_error(agent):
    events = agent.events(f"{PREFIX}/run", {"code": "echo before; exit 3"})
    assert stdout_of(events) == ["before"], events
    assert events[-1]["type"] == "error", events
    assert events[-1]["error"]["evalue"] == "3", events
    assert not [e for e in events if e["type"] == "execution_complete"], events


def test_run_timeout_kills(agent):
    started = time.monotonic()
    events = agent.events(f"{PREFIX}/run", {"code": "echo start; sleep 30; echo never",
                                            "timeout_seconds": 1}, timeout=30)
    elapsed = time.monotonic() - started
    assert elapsed < 15, elapsed
    assert stdout_of(events) == ["start"], events
    last = events[-1]
    assert last["type"] == "error", events
    assert last["error"]["evalue"] == "-1", last
    assert "signal: killed" in last["error"]["traceback"], last
    assert "timed out after 1000 ms" in last["error"]["traceback"], last
    # POST /command's timeout ends the same way.
    command = agent.events(f"{PREFIX}/command", {"command": "echo start; sleep 30", "timeout": 1000},
                           timeout=30)
    assert [e["type"] for e in command] == [e["type"] for e in events], (command, events)
    assert command[-1]["error"] == last["error"], (command[-1], last)
    # The sleep is gone with its shell (its process group was killed): no `sleep 30` of the
    # run-as user works in this agent's directory (other tests, run alongside under
    # pytest-xdist, may have sleeps of their own elsewhere).
    out = subprocess.run(["pgrep", "-u", str(RUN_AS[0]), "-f", "^sleep 30$"],
                         capture_output=True, text=True)
    left = [p for p in out.stdout.split() if cwd_of(p) == agent.workdir]
    assert left == [], out.stdout


def test_run_default_timeout_is_long(agent):
    """timeout_seconds 0 or null is the default (300 s), not "kill at once"."""
    for timeout in (0, None):
        events = agent.events(f"{PREFIX}/run", {"code": "sleep 1.2; echo done",
                                                "timeout_seconds": timeout})
        assert stdout_of(events) == ["done"], events
        assert events[-1]["type"] == "execution_complete", events


@pytest.mark.parametrize("raw", [
    "{}",
    '{"code": ""}',
    '{"code": null}',
    '{"code": 5}',
    '{"code": ["ls"]}',
    '{"code": "true", "timeout_seconds": -1}',
    '{"code": "true", "timeout_seconds": 86401}',
    '{"code": "true", "timeout_seconds": 99999999999999}',
    '{"code": "true", "timeout_seconds": "5"}',
    '{"code": "true", "timeout_seconds": 1.5}',
    '{"code": "true", "envs": {"A": 1}}',
    '{"code": "true", "envs": ["A=1"]}',
    '{"code": "true", "envs": {"A=B": "1"}}',
    '{"code": "true", "cwd": 7}',
    '{"code": "true", "cwd": "/nonexistent/cove"}',
    '{"code": "true"',
    "not json",
    "",
    '["code"]',
])
def test_bad_run_bodies_are_400(agent, raw):
    marker = os.path.join(agent.workdir, "ran-" + secrets.token_hex(4))
    if raw.startswith('{"code": "true"') and raw.endswith("}"):
        raw = raw.replace('"true"', json.dumps(f"touch {marker}"), 1)
    status, body, _ = agent.call("POST", f"{PREFIX}/run", raw=raw,
                                 headers={"Content-Type": "application/json"})
    check_error(status, body, 400)
    assert body["code"] == "INVALID_REQUEST_BODY", body
    assert not os.path.exists(marker)  # nothing ran


# ---- --run-as ----

def test_command_runs_as_the_default_user_unless_told(agent):
    events = agent.events(f"{PREFIX}/command", {"command": "id -u; id -g"})
    assert stdout_of(events) == ["1000", "1000"], events
    events = agent.events(f"{PREFIX}/command", {"command": "id -u; id -g", "uid": 0, "gid": 0})
    assert stdout_of(events) == ["0", "0"], events
    events = agent.events(f"{PREFIX}/run", {"code": "id -u", "uid": 0})  # not /run's field
    assert stdout_of(events) == ["1000"], events


def test_upload_without_owner_belongs_to_the_default_user(agent):
    target = os.path.join(agent.workdir, "up", "deep", "file.txt")
    body, headers = multipart({"path": target}, b"uploaded")
    status, resp, _ = agent.call("POST", f"{PREFIX}/files/upload", raw=body, headers=headers)
    assert status == 200, resp
    with open(target, "rb") as f:
        assert f.read() == b"uploaded"
    for path in (target, os.path.dirname(target), os.path.dirname(os.path.dirname(target))):
        st = os.stat(path)
        assert (st.st_uid, st.st_gid) == RUN_AS, (path, st)
    # An explicit owner still wins.
    other = os.path.join(agent.workdir, "up", "root-owned")
    body, headers = multipart({"path": other, "owner": "0", "group": "0"}, b"x")
    status, resp, _ = agent.call("POST", f"{PREFIX}/files/upload", raw=body, headers=headers)
    assert status == 200, resp
    st = os.stat(other)
    assert (st.st_uid, st.st_gid) == (0, 0)


def test_mkdir_without_owner_belongs_to_the_default_user(agent):
    made = os.path.join(agent.workdir, "mk", "a", "b")
    status, body, _ = agent.call("POST", f"{PREFIX}/directories", {made: {"mode": 750}})
    assert status == 200, body
    st = os.stat(made)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (*RUN_AS, 0o750)
    st = os.stat(os.path.dirname(made))
    assert (st.st_uid, st.st_gid) == RUN_AS
    # The default user can write where the agent made a directory for it.
    events = agent.events(f"{PREFIX}/run", {"code": f"touch {made}/mine && stat -c %u {made}/mine"})
    assert stdout_of(events) == ["1000"], events


def test_replace_keeps_the_owner(agent):
    path = os.path.join(agent.workdir, "keep")
    with open(path, "w") as f:
        f.write("hello world")
    os.chown(path, 0, 0)
    status, body, _ = agent.call("POST", f"{PREFIX}/files/replace",
                                 {path: {"old": "world", "new": "there"}})
    assert status == 200, body
    with open(path) as f:
        assert f.read() == "hello there"
    st = os.stat(path)
    assert (st.st_uid, st.st_gid) == (0, 0)


def test_bash_session_runs_as_the_default_user(agent):
    """Every process started without a uid of its own gets --run-as, not only /command's."""
    status, body, _ = agent.call("POST", f"{PREFIX}/session", {})
    assert status == 200, body
    sid = body["session_id"]
    try:
        events = agent.events(f"{PREFIX}/session/{sid}/run", {"command": "id -u; id -g"})
        assert stdout_of(events) == ["1000", "1000"], events
    finally:
        agent.call("DELETE", f"{PREFIX}/session/{sid}")


def test_unprefixed_upload_is_404_and_writes_nothing(agent):
    target = os.path.join(agent.workdir, "never-uploaded")
    body, headers = multipart({"path": target}, b"x")
    status, resp, _ = agent.call("POST", "/files/upload", raw=body, headers=headers)
    check_error(status, resp, 404)
    assert not os.path.exists(target)
