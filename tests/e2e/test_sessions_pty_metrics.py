"""The agent's bash sessions (/session), interactive shells over WebSocket (/pty) and metrics
(/metrics, /metrics/watch), driven through coved's gateway as a client would."""

import pytest
import base64
import hashlib
import http.client
import json
import os
import re
import socket
import struct
import threading
import time

from covetest import AGENT_PORT, ExecResult, parse_events

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def agent_path(sid, path):
    return f"/sandboxes/{sid}/proxy/{AGENT_PORT}{path}"


def call(coved, sid, method, path, body=None, raw=None):
    return coved.request(method, agent_path(sid, path), body=body, raw=raw)


def run(coved, sid, session_id, command, **extra):
    """POST /session/{id}/run: the streamed events as an ExecResult."""
    body = {"command": command, **extra}
    conn = http.client.HTTPConnection("127.0.0.1", coved.port, timeout=60)
    conn.request("POST", agent_path(sid, f"/session/{session_id}/run"), body=json.dumps(body),
                 headers=coved.headers())
    resp = conn.getresponse()
    raw = resp.read().decode(errors="replace")
    conn.close()
    assert resp.status == 200, raw
    assert resp.getheader("Content-Type") == "text/event-stream"
    return ExecResult(parse_events(raw))


def new_session(coved, sid, **body):
    status, parsed, _ = call(coved, sid, "POST", "/session", body=body)
    assert status == 200, parsed
    return parsed["session_id"]


# ---- bash sessions ----

def test_session_keeps_directory_and_exported_environment(coved, sandbox):
    s = new_session(coved, sandbox, cwd="/tmp/work/deep")  # made if missing, as execd
    r = run(coved, sandbox, s, "pwd")
    assert r.stdout == "/tmp/work/deep\n"
    assert r.events[0] == {"type": "init", "text": s, "timestamp": r.events[0]["timestamp"]}
    run(coved, sandbox, s, "cd /usr/share && export GREETING='hello world' PATH=/opt/x:$PATH")
    r = run(coved, sandbox, s, "pwd; echo \"$GREETING\"; echo $PATH | cut -d: -f1")
    assert r.stdout == "/usr/share\nhello world\n/opt/x\n"
    assert r.exit_code == 0
    # unset is remembered too; values with newlines and quotes survive the trip
    run(coved, sandbox, s, "unset GREETING; export ODD=$'a \"b\"\\nc\\'d'")
    r = run(coved, sandbox, s, "echo ${GREETING-gone}; printf '%s|' \"$ODD\"")
    assert r.stdout == "gone\na \"b\"\nc'd|\n"
    # a run's own cwd becomes the session's, like a cd
    r = run(coved, sandbox, s, "pwd", cwd="/etc")
    assert r.stdout == "/etc\n"
    assert run(coved, sandbox, s, "pwd").stdout == "/etc\n"


def test_session_runs_report_stdout_stderr_and_exit_code(coved, sandbox):
    s = new_session(coved, sandbox)
    r = run(coved, sandbox, s, "echo out; echo err >&2; echo more; exit 3")
    assert (r.stdout, r.stderr, r.exit_code) == ("out\nmore\n", "err\n", 3)
    err = [e for e in r.events if e["type"] == "error"][0]["error"]
    assert err["ename"] == "CommandExecError" and err["evalue"] == "3"
    assert not any(e["type"] == "execution_complete" for e in r.events)
    r = run(coved, sandbox, s, "printf partial; false || true")
    assert (r.stdout, r.stderr, r.exit_code) == ("partial\n", "", 0)
    assert r.events[-1]["type"] == "execution_complete"
    # the command text is taken literally, whatever it holds
    r = run(coved, sandbox, s, "echo \"[$1]\" '$HOME' $#; echo 'a\\b'")
    assert r.stdout == "[] $HOME 0\na\\b\n"


def test_two_sessions_are_independent(coved, sandbox):
    a = new_session(coved, sandbox, cwd="/tmp")
    b = new_session(coved, sandbox)
    run(coved, sandbox, a, "export WHO=a; cd /var")
    run(coved, sandbox, b, "export WHO=b; cd /usr")
    assert run(coved, sandbox, a, "echo $WHO; pwd").stdout == "a\n/var\n"
    assert run(coved, sandbox, b, "echo $WHO; pwd").stdout == "b\n/usr\n"
    # and neither leaks into plain commands
    assert coved.exec(sandbox, "echo ${WHO-none}").stdout == "none\n"


def test_timeout_and_interrupt_kill_the_run_not_the_session(coved, sandbox):
    s = new_session(coved, sandbox)
    run(coved, sandbox, s, "cd /tmp; export KEPT=yes")
    t0 = time.time()
    r = run(coved, sandbox, s, "echo started; sleep 30", timeout=500)
    assert time.time() - t0 < 10
    assert r.stdout == "started\n"
    err = [e for e in r.events if e["type"] == "error"][0]["error"]
    assert any("timed out" in line for line in err["traceback"])

    # DELETE /command with the session id (the id its init event gave) interrupts the run
    result = {}
    worker = threading.Thread(target=lambda: result.update(r=run(coved, sandbox, s, "sleep 30")))
    worker.start()
    time.sleep(1)
    status, _, _ = call(coved, sandbox, "DELETE", f"/command?id={s}")
    assert status == 200
    worker.join(15)
    assert not worker.is_alive()
    assert result["r"].exit_code not in (0, None)

    r = run(coved, sandbox, s, "pwd; echo $KEPT")
    assert (r.stdout, r.exit_code) == ("/tmp\nyes\n", 0)


def test_delete_session_and_errors(coved, sandbox):
    s = new_session(coved, sandbox)
    status, body, _ = call(coved, sandbox, "POST", f"/session/{s}/run", body={"command": ""})
    assert status == 400 and body["code"] == "INVALID_REQUEST_BODY"
    status, body, _ = call(coved, sandbox, "POST", f"/session/{s}/run",
                           body={"command": "ls", "cwd": "/does/not/exist"})
    assert status == 400 and body["code"] == "INVALID_REQUEST_BODY"
    status, body, _ = call(coved, sandbox, "POST", f"/session/{s}/run", raw="{nope")
    assert status == 400 and body["code"] == "INVALID_REQUEST_BODY"
    status, _, _ = call(coved, sandbox, "POST", "/session", raw="")  # an empty body is fine
    assert status == 200
    # a directory that went away since: the session goes on from /, as execd's failing cd
    run(coved, sandbox, s, "mkdir -p /tmp/gone && cd /tmp/gone")
    run(coved, sandbox, s, "rmdir /tmp/gone")
    assert run(coved, sandbox, s, "pwd").stdout == "/\n"

    status, body, _ = call(coved, sandbox, "DELETE", f"/session/{s}")
    assert status == 200
    status, body, _ = call(coved, sandbox, "POST", f"/session/{s}/run", body={"command": "true"})
    assert status == 404 and body["code"] == "CONTEXT_NOT_FOUND"
    status, body, _ = call(coved, sandbox, "DELETE", f"/session/{s}")
    assert status == 404 and body["code"] == "CONTEXT_NOT_FOUND"


def test_deleting_a_session_kills_its_running_command(coved, sandbox):
    s = new_session(coved, sandbox)
    worker = threading.Thread(target=lambda: run(coved, sandbox, s, "sleep 300 # marker-7731"))
    worker.start()
    time.sleep(1)
    assert "marker-7731" in coved.sh(sandbox, "ps -eo args")
    assert call(coved, sandbox, "DELETE", f"/session/{s}")[0] == 200
    worker.join(15)
    assert not worker.is_alive()
    assert "marker-7731" not in coved.sh(sandbox, "ps -eo args")


# ---- PTY over WebSocket ----

class WebSocket:
    """A minimal RFC 6455 client: handshake, masked frames, reassembly, pongs."""

    def __init__(self, coved, sid, path, timeout=15):
        self.sock = socket.create_connection(("127.0.0.1", coved.port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {agent_path(sid, path)} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                           "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                           f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                           f"OPEN-SANDBOX-API-KEY: {coved.key}\r\n\r\n").encode())
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            chunk = self.sock.recv(4096)
            if not chunk:
                break
            self.buf += chunk
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        self.status = int(head.split(b" ")[1])
        if self.status == 101:
            accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest())
            assert b"Sec-WebSocket-Accept: " + accept in head
        self.close_code = None
        self.stdout = b""

    def send(self, opcode, payload):
        mask = os.urandom(4)
        n = len(payload)
        head = bytes([0x80 | opcode])
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 65536:
            head += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", n)
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def send_json(self, obj):
        self.send(1, json.dumps(obj).encode())

    def type(self, text):
        """Keys on the terminal: binary frame, channel 0x00 (stdin)."""
        self.send(2, b"\x00" + text.encode())

    def _read(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def frame(self):
        """The next frame as (first byte, payload), pings and pongs included."""
        b0, b1 = self._read(2)
        assert not b1 & 0x80, "server frames are not masked"
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack(">H", self._read(2))[0]
        elif n == 127:
            n = struct.unpack(">Q", self._read(8))[0]
        return b0, self._read(n)

    def recv(self):
        """The next message as (opcode, payload); pings are answered on the way."""
        message, opcode = b"", None
        while True:
            b0, payload = self.frame()
            op = b0 & 0x0F
            if op == 9:
                self.send(10, payload)
                continue
            if op == 10:
                continue
            if op == 8:
                self.close_code = struct.unpack(">H", payload[:2])[0] if len(payload) >= 2 else 1005
                return 8, payload
            opcode = opcode or op
            message += payload
            if b0 & 0x80:
                return opcode, message

    def json(self):
        """The next JSON (text) message; terminal output on the way is kept in stdout."""
        while True:
            op, payload = self.recv()
            if op == 2 and payload[:1] == b"\x01":
                self.stdout += payload[1:]
                continue
            assert op == 1, (op, payload)
            return json.loads(payload)

    def read_until(self, needle, timeout=10):
        """Collects stdout (channel 0x01) until, without its terminal control sequences
        (bash's bracketed-paste switches), it holds needle."""
        deadline = time.time() + timeout
        while needle not in re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]", b"", self.stdout):
            assert time.time() < deadline, f"no {needle!r} in {self.stdout[-500:]!r}"
            op, payload = self.recv()
            assert op != 8, f"closed while waiting for {needle!r}"
            if op == 2 and payload[:1] == b"\x01":
                self.stdout += payload[1:]
        return self.stdout

    def wait_close(self):
        """Skips messages until the close frame; returns its payload."""
        while True:
            op, payload = self.recv()
            if op == 8:
                return payload

    def close(self):
        try:
            self.send(8, struct.pack(">H", 1000))
        except OSError:
            pass
        self.sock.close()


def new_pty(coved, sid, **body):
    status, parsed, _ = call(coved, sid, "POST", "/pty", body=body)
    assert status == 201, parsed
    return parsed["session_id"]


@pytest.mark.not_under("gvisor", reason="runsc's terminal does not turn ^C into SIGINT for the foreground job")
def test_pty_echo_resize_and_ctrl_c(coved, sandbox):
    p = new_pty(coved, sandbox, cwd="/tmp", cols=100, rows=30)
    ws = WebSocket(coved, sandbox, f"/pty/{p}/ws")
    assert ws.status == 101
    assert ws.json() == {"type": "connected", "session_id": p, "mode": "pty"}

    ws.type("echo hi\r")
    ws.read_until(b"echo hi\r\n\rhi\r\n")  # the terminal echoes the line, then bash answers
    ws.type("stty size; pwd\r")
    ws.read_until(b"30 100\r\n/tmp\r\n")
    ws.send_json({"type": "resize", "cols": 120, "rows": 40})
    ws.type("stty size\r")
    ws.read_until(b"40 120\r\n")

    # ^C reaches the foreground job through the terminal; the shell carries on
    ws.type("sleep 100\r")
    time.sleep(0.5)
    t0 = time.time()
    ws.type("\x03")
    ws.type("echo after-$((40+2))\r")
    ws.read_until(b"after-42")
    assert time.time() - t0 < 5
    # so does a signal frame (sent to the terminal's foreground job)
    ws.type("sleep 100\r")
    time.sleep(0.5)
    ws.send_json({"type": "signal", "signal": "SIGINT"})
    ws.type("echo signalled-$((1+2))\r")
    ws.read_until(b"signalled-3")

    ws.send_json({"type": "ping"})
    assert ws.json() == {"type": "pong"}
    ws.send_json({"type": "bogus"})
    assert ws.json()["code"] == "INVALID_FRAME"

    ws.type("exit 7\r")
    while True:
        op, payload = ws.recv()
        if op == 1:
            assert json.loads(payload) == {"type": "exit", "exit_code": 7}
            break
    assert ws.recv()[0] == 8 and ws.close_code == 1000
    ws.close()
    status, body, _ = call(coved, sandbox, "GET", f"/pty/{p}")
    assert status == 200 and body["running"] is False


def test_pty_replay_from_offset_one_client_and_takeover(coved, sandbox):
    p = new_pty(coved, sandbox)
    ws = WebSocket(coved, sandbox, f"/pty/{p}/ws")
    ws.json()  # connected
    ws.type("echo first-$((1+1))\r")
    ws.read_until(b"first-2\r\n")

    # one client at a time: 409 before the upgrade
    other = WebSocket(coved, sandbox, f"/pty/{p}/ws")
    assert other.status == 409
    assert json.loads(other.buf.decode())["code"] == "ALREADY_CONNECTED"
    other.sock.close()

    ws.close()  # the shell outlives its client, and its output is kept
    time.sleep(0.3)
    status, body, _ = call(coved, sandbox, "GET", f"/pty/{p}")
    assert status == 200 and body["running"] is True
    offset = body["output_offset"]
    assert offset >= len(ws.stdout)

    # reconnect: replay of everything from byte 0, then connected
    ws = WebSocket(coved, sandbox, f"/pty/{p}/ws?since=0")
    op, payload = ws.recv()
    assert op == 2 and payload[0] == 0x03
    assert struct.unpack(">Q", payload[1:9])[0] == 0
    assert b"first-2\r\n" in payload[9:] and len(payload) - 9 == offset
    assert ws.json()["type"] == "connected"
    ws.type("echo second-$((1+2))\r")
    ws.read_until(b"second-3\r\n")
    ws.close()
    time.sleep(0.3)

    # from an offset: only what came after it, tagged with that offset
    ws = WebSocket(coved, sandbox, f"/pty/{p}/ws?since={offset}")
    op, payload = ws.recv()
    assert op == 2 and payload[0] == 0x03
    assert struct.unpack(">Q", payload[1:9])[0] == offset
    assert b"second-3" in payload[9:] and b"first-2\r\n" not in payload[9:]
    assert ws.json()["type"] == "connected"

    # takeover: the holder is closed with 4001 and the newcomer gets the same shell
    newcomer = WebSocket(coved, sandbox, f"/pty/{p}/ws?takeover=1&since=999999999")
    assert newcomer.status == 101
    assert newcomer.json()["type"] == "connected"  # nothing to replay past the end
    assert ws.recv() == (8, struct.pack(">H", 4001) + b"TAKEN_OVER")
    newcomer.type("echo third-$((2+2))\r")
    newcomer.read_until(b"third-4\r\n")

    assert call(coved, sandbox, "DELETE", f"/pty/{p}")[0] == 200
    newcomer.wait_close()  # the session went away under it
    assert newcomer.close_code == 1001
    assert call(coved, sandbox, "GET", f"/pty/{p}")[0] == 404
    assert WebSocket(coved, sandbox, f"/pty/{p}/ws").status == 404


def test_pty_pipe_mode_keeps_stderr_apart(coved, sandbox):
    p = new_pty(coved, sandbox)
    ws = WebSocket(coved, sandbox, f"/pty/{p}/ws?pty=0")
    assert ws.json() == {"type": "connected", "session_id": p, "mode": "pipe"}
    ws.send_json({"type": "stdin", "data": "echo out; echo err >&2; tty || true\n"})
    got = {1: b"", 2: b""}
    while b"not a tty" not in got[1] or b"err" not in got[2]:
        op, payload = ws.recv()
        assert op == 2
        got[payload[0]] += payload[1:]
    assert got[1].startswith(b"out\n") and got[2] == b"err\n"
    ws.close()
    assert call(coved, sandbox, "DELETE", f"/pty/{p}")[0] == 200


def test_pty_with_a_command_and_bad_requests(coved, sandbox):
    p = new_pty(coved, sandbox, command="echo from-command; exit 3")
    ws = WebSocket(coved, sandbox, f"/pty/{p}/ws")
    messages = []
    while True:
        op, payload = ws.recv()
        if op == 8:
            break
        messages.append((op, payload))
    out = b"".join(m[1][1:] for m in messages if m[0] == 2)
    assert b"from-command" in out
    assert json.loads(messages[-1][1]) == {"type": "exit", "exit_code": 3}

    # not a WebSocket handshake: 400 before any upgrade; unknown session: 404
    status, body, _ = call(coved, sandbox, "GET", f"/pty/{p}/ws")
    assert status == 400
    status, body, _ = call(coved, sandbox, "GET", "/pty/nope/ws")
    assert status == 404 and body["code"] == "CONTEXT_NOT_FOUND"
    assert call(coved, sandbox, "DELETE", "/pty/nope")[0] == 404
    assert call(coved, sandbox, "POST", "/pty", raw="[1]")[0] == 400


def client_frame(first_byte, payload, masked=True):
    """One client frame with first_byte (FIN, opcode) as given, masked unless told."""
    n = len(payload)
    length = bytes([n]) if n < 126 else bytes([126]) + struct.pack(">H", n) if n < 65536 \
        else bytes([127]) + struct.pack(">Q", n)
    if not masked:
        return bytes([first_byte]) + length + payload
    mask = os.urandom(4)
    return (bytes([first_byte, length[0] | 0x80]) + length[1:] + mask
            + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))


@pytest.mark.not_under("gvisor", reason="runsc's terminal does not turn ^C into SIGINT for the foreground job")
def test_pty_websocket_protocol_rules(coved, sandbox):
    """The agent's WebSocket, through the gateway, keeps RFC 6455: a message in fragments with
    a ping between them, the ping's pong, the closing handshake echoing the code; an unmasked
    frame is answered with 1002 and a message over 1 MiB with 1009 before its payload came."""
    p = new_pty(coved, sandbox)
    ws = WebSocket(coved, sandbox, f"/pty/{p}/ws")
    assert ws.json()["type"] == "connected"
    text = json.dumps({"type": "stdin", "data": "echo frag-$((3+4))\r"}).encode()
    ws.sock.sendall(client_frame(0x01, text[:7]) + client_frame(0x89, b"heartbeat")
                    + client_frame(0x00, text[7:20]) + client_frame(0x80, text[20:]))
    while True:  # the pong comes before the shell's echo of what the message typed
        b0, payload = ws.frame()
        assert b0 & 0x0F != 8, payload
        if b0 == 0x8A:
            assert payload == b"heartbeat"
            break
    ws.read_until(b"frag-7\r\n")
    ws.sock.sendall(client_frame(0x88, struct.pack(">H", 1000) + b"done"))
    assert ws.wait_close() == struct.pack(">H", 1000)
    assert ws.sock.recv(1) == b""  # and the agent drops the connection
    ws.sock.close()

    hostile = [client_frame(0x81, b'{"type":"ping"}', masked=False),
               # 1 MiB + 1 announced: refused from the header, nothing more is sent
               bytes([0x82, 0xFF]) + struct.pack(">Q", 1024 * 1024 + 1) + os.urandom(4)]
    for frame, code in zip(hostile, (1002, 1009)):
        time.sleep(0.3)  # the previous client is gone from the session
        ws = WebSocket(coved, sandbox, f"/pty/{p}/ws?since=999999999")
        assert ws.status == 101
        assert ws.json()["type"] == "connected"
        ws.sock.sendall(frame)
        ws.wait_close()
        assert ws.close_code == code
        ws.sock.close()

    coved.health()
    status, body, _ = call(coved, sandbox, "GET", f"/pty/{p}")
    assert status == 200 and body["running"] is True  # the shell outlived its clients
    assert call(coved, sandbox, "DELETE", f"/pty/{p}")[0] == 200


# ---- metrics ----

def metrics(coved, sid):
    status, body, _ = call(coved, sid, "GET", "/metrics")
    assert status == 200, body
    assert set(body) == {"cpu_count", "cpu_used_pct", "mem_total_mib", "mem_used_mib", "timestamp"}
    assert all(isinstance(body[k], (int, float)) for k in body)
    assert abs(body["timestamp"] - time.time() * 1000) < 60000
    assert body["cpu_count"] > 0 and 0 <= body["cpu_used_pct"] <= 100
    assert 0 < body["mem_used_mib"] <= body["mem_total_mib"]
    return body


@pytest.mark.not_under("gvisor", reason="no cgroup files inside gVisor: limits are not readable from the sandbox")
def test_metrics_report_the_sandbox_limits(coved):
    """From the sandbox's own cgroup (mounted read-only at /sys/fs/cgroup): its CPU quota in
    cores and its memory limit, not the machine's."""
    sid = coved.create(limits={"cpu": "500m", "memory": "256Mi"})
    try:
        m = metrics(coved, sid)
        assert m["cpu_count"] == 0.5
        assert m["mem_total_mib"] == 256
    finally:
        coved.delete(sid)


def test_metrics_follow_memory_and_cpu_use(coved, sandbox):
    before = metrics(coved, sandbox)["mem_used_mib"]
    coved.exec(sandbox, "python3 -c 'import time; x = b\"x\" * (100 << 20); time.sleep(60)' "
                        ">/dev/null 2>&1 &")
    time.sleep(1.5)
    assert metrics(coved, sandbox)["mem_used_mib"] - before >= 80
    coved.exec(sandbox, "pkill -f 'time.sleep\\(60\\)'")

    coved.exec(sandbox, "timeout 4 sh -c 'while :; do :; done' >/dev/null 2>&1 &")
    time.sleep(0.5)
    busy = metrics(coved, sandbox)
    # one busy process on a one-CPU limit: a good part of what the sandbox may use. On a host
    # busy with other tests too (pytest-xdist) a sample may catch it waiting for a CPU: sampled
    # again while it spins (4 s).
    deadline = time.monotonic() + 3
    while busy["cpu_used_pct"] < 100 / busy["cpu_count"] / 3 and time.monotonic() < deadline:
        time.sleep(0.25)
        busy = metrics(coved, sandbox)
    assert busy["cpu_used_pct"] >= 100 / busy["cpu_count"] / 3


def test_metrics_watch_streams_a_sample_each_second(coved, sandbox):
    conn = http.client.HTTPConnection("127.0.0.1", coved.port, timeout=30)
    conn.request("GET", agent_path(sandbox, "/metrics/watch"), headers=coved.headers())
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.getheader("Content-Type") == "text/event-stream"
    samples, buf, t0 = [], b"", time.time()
    while len(samples) < 3:
        buf += resp.read1(4096)
        while b"\n\n" in buf:
            line, buf = buf.split(b"\n\n", 1)
            samples.append(json.loads(line))
    elapsed = time.time() - t0
    conn.close()
    assert 1.5 < elapsed < 10
    assert all(set(s) == {"cpu_count", "cpu_used_pct", "mem_total_mib", "mem_used_mib",
                          "timestamp"} for s in samples)
    stamps = [s["timestamp"] for s in samples]
    assert stamps == sorted(stamps) and stamps[-1] - stamps[0] >= 1500
