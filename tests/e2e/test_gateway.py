"""The gateway: any port of a sandbox by path or by host, keep-alive, streamed bodies, SSE,
WebSocket, and commands whose output is large or slow."""

import base64
import hashlib
import http.client
import json
import os
import socket
import struct
import time

import pytest

from covetest import AGENT_SANITIZED, Coved, parse_events, serve

HERE = os.path.dirname(os.path.abspath(__file__))
DOMAIN = "cove.test"
PORT = 8000


@pytest.fixture(scope="module")
def gw():
    with serve("--domain", DOMAIN) as d:
        yield d


@pytest.fixture(scope="module")
def server(gw):
    """A sandbox running echo_server.py on port 8000."""
    sid = gw.create()
    source = open(os.path.join(HERE, "sandbox_servers", "echo_server.py")).read()
    gw.sh(sid, f"cat > /tmp/echo_server.py <<'PYEOF'\n{source}\nPYEOF")
    gw.exec(sid, f"python3 /tmp/echo_server.py {PORT}", background=True)
    for _ in range(100):
        if gw.exec(sid, f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {PORT}))\"").exit_code == 0:
            break
        time.sleep(0.05)
    yield sid
    gw.delete(sid)


def connect(gw):
    return http.client.HTTPConnection("127.0.0.1", gw.port, timeout=60)


def get_json(conn, method, path, headers, body=None):
    conn.request(method, path, body=body, headers=headers)
    resp = conn.getresponse()
    data = resp.read()
    return resp.status, json.loads(data) if data else None, resp


def test_path_route_keeps_query_headers_and_method(gw, server):
    conn = connect(gw)
    status, echo, resp = get_json(conn, "PATCH", f"/sandboxes/{server}/proxy/{PORT}/a/b?x=1&y=%20z",
                                  {**gw.headers(), "X-Custom": "kept"}, body=b"hello")
    assert status == 200
    assert echo["method"] == "PATCH" and echo["path"] == "/a/b?x=1&y=%20z"
    assert echo["headers"]["x-custom"] == "kept"
    assert echo["headers"]["x-forwarded-prefix"] == f"/sandboxes/{server}/proxy/{PORT}"
    # coved's credentials never reach the sandbox
    assert "open-sandbox-api-key" not in echo["headers"]
    assert echo["body_sha256"] == hashlib.sha256(b"hello").hexdigest()


def test_host_route(gw, server):
    conn = connect(gw)
    status, echo, _ = get_json(conn, "GET", "/plain/path?q=1",
                               {**gw.headers(), "Host": f"{PORT}-{server}.{DOMAIN}:{gw.port}"})
    assert status == 200 and echo["path"] == "/plain/path?q=1"
    status, err, _ = get_json(conn, "GET", "/", {"Host": f"{PORT}-{server}.{DOMAIN}"})
    assert status == 401 and set(err) == {"code", "message"}


def test_keep_alive_across_requests_and_sandboxes(gw, server):
    other = gw.create()
    try:
        conn = connect(gw)
        sockets = set()
        for i in range(5):
            for path in (f"/sandboxes/{server}/proxy/{PORT}/n{i}",
                         f"/sandboxes/{server}/proxy/44772/ping",
                         f"/v1/sandboxes/{other}",  # the lifecycle API on the same connection
                         f"/sandboxes/{other}/proxy/44772/ping"):
                conn.request("GET", path, headers=gw.headers())
                resp = conn.getresponse()
                resp.read()
                assert resp.status == 200, path
                sockets.add(id(conn.sock))
        assert len(sockets) == 1, "the client connection was not kept alive"
        # an error answered by the gateway itself keeps the connection too
        conn.request("GET", "/sandboxes/nope/proxy/80/", headers=gw.headers())
        resp = conn.getresponse()
        assert resp.status == 404 and json.loads(resp.read())["code"]
        conn.request("GET", f"/sandboxes/{server}/proxy/{PORT}/after", headers=gw.headers())
        assert conn.getresponse().status == 200 and id(conn.sock) in sockets
    finally:
        gw.delete(other)


def test_an_answer_before_the_end_of_the_body_keeps_the_connection_usable(gw, server):
    """The agent refuses an upload under a regular file as soon as it has read the metadata
    part, before the end of the body. The rest of that body, sent after the answer, must be
    dropped, and the next request on the same client connection must work (it used to be
    forwarded without its body, and hang or get a 400)."""
    gw.sh(server, "echo plain > /tmp/early-plain.txt")
    conn = connect(gw)

    def upload(path, content):
        b = "cove-early-boundary"
        first = (f"--{b}\r\nContent-Disposition: form-data; name=\"metadata\"; filename=\"metadata\"\r\n"
                 f"Content-Type: application/json\r\n\r\n{json.dumps({'path': path})}\r\n"
                 f"--{b}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n"
                 f"Content-Type: application/octet-stream\r\n\r\n").encode()
        rest = content + f"\r\n--{b}--\r\n".encode()
        conn.putrequest("POST", f"/sandboxes/{server}/proxy/44772/files/upload")
        for k, v in gw.headers().items():
            if k.lower() != "content-type":
                conn.putheader(k, v)
        conn.putheader("Content-Type", f"multipart/form-data; boundary={b}")
        conn.putheader("Content-Length", str(len(first) + len(rest)))
        conn.endheaders(first)
        return rest

    for i in range(3):
        rest = upload(f"/tmp/early-plain.txt/child-{i}", os.urandom(1024 * 1024))
        resp = conn.getresponse()  # answered before the rest of the body was sent
        assert resp.status == 404 and json.loads(resp.read())["code"]
        conn.send(rest)
        conn.send(upload(f"/tmp/early-ok-{i}.txt", b"ok %d" % i))
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        resp.read()
        conn.request("GET", f"/sandboxes/{server}/proxy/44772/files/download?path=/tmp/early-ok-{i}.txt",
                     headers=gw.headers())
        resp = conn.getresponse()
        assert resp.status == 200 and resp.read() == b"ok %d" % i


def test_a_huge_body_after_an_early_answer_is_not_read_forever(gw, server):
    """The dropped rest of a refused body is bounded: coved reads a few MiB of it (enough for
    the test above), then closes the connection rather than read an endless upload."""
    gw.sh(server, "echo plain > /tmp/early-huge.txt")
    conn = connect(gw)
    b = "cove-huge-boundary"
    first = (f"--{b}\r\nContent-Disposition: form-data; name=\"metadata\"; filename=\"metadata\"\r\n"
             f"Content-Type: application/json\r\n\r\n{json.dumps({'path': '/tmp/early-huge.txt/x'})}\r\n"
             f"--{b}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n"
             f"Content-Type: application/octet-stream\r\n\r\n").encode()
    size = 256 * 1024 * 1024
    conn.putrequest("POST", f"/sandboxes/{server}/proxy/44772/files/upload")
    for k, v in gw.headers().items():
        if k.lower() != "content-type":
            conn.putheader(k, v)
    conn.putheader("Content-Type", f"multipart/form-data; boundary={b}")
    conn.putheader("Content-Length", str(len(first) + size))
    conn.endheaders(first)
    resp = conn.getresponse()
    assert resp.status == 404
    resp.read()
    block, sent = b"\0" * (1024 * 1024), 0
    with pytest.raises(OSError):  # reset by coved once it stopped reading
        while sent < size:
            conn.sock.sendall(block)
            sent += len(block)
    assert sent < 64 * 1024 * 1024, sent
    gw.health()  # and coved is fine


def test_large_bodies_stream_both_ways(gw, server):
    size = 64 * 1024 * 1024
    block = os.urandom(1024 * 1024)
    expected = hashlib.sha256(block * (size // len(block))).hexdigest()
    conn = connect(gw)
    conn.putrequest("POST", f"/sandboxes/{server}/proxy/{PORT}/upload")
    for k, v in gw.headers().items():
        conn.putheader(k, v)
    conn.putheader("Content-Length", str(size))
    conn.endheaders()
    for _ in range(size // len(block)):
        conn.send(block)
    resp = conn.getresponse()
    echo = json.loads(resp.read())
    assert echo["body_size"] == size and echo["body_sha256"] == expected
    # chunked request bodies pass with their framing
    conn.putrequest("POST", f"/sandboxes/{server}/proxy/{PORT}/chunked")
    for k, v in gw.headers().items():
        conn.putheader(k, v)
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    for part in (b"abc", b"defgh", b"x" * 70000):
        conn.send(b"%x\r\n%s\r\n" % (len(part), part))
    conn.send(b"0\r\n\r\n")
    echo = json.loads(conn.getresponse().read())
    assert echo["body_sha256"] == hashlib.sha256(b"abcdefgh" + b"x" * 70000).hexdigest()


def test_sse_arrives_as_it_is_written(gw, server):
    s = socket.create_connection(("127.0.0.1", gw.port), timeout=30)
    headers = "".join(f"{k}: {v}\r\n" for k, v in gw.headers().items())
    s.sendall(f"GET /sandboxes/{server}/proxy/{PORT}/sse HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode())
    buf, lags = b"", []
    while len(lags) < 5:
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
        now = time.time()
        while b"data: " in buf and b"\n\n" in buf.split(b"data: ", 1)[1]:
            _, rest = buf.split(b"data: ", 1)
            event, buf = rest.split(b"\n\n", 1)
            lags.append(now - float(event.split()[1]))
    s.close()
    assert len(lags) == 5
    # each event came before the next was written (0.3 s apart): forwarded as it came
    assert max(lags) < 0.3, lags
    print(f"SSE through the gateway: lag per event {[round(l * 1000, 1) for l in lags]} ms")


def ws_frame(payload, opcode=1):
    mask = os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    n = len(payload)
    head = bytes([0x80 | opcode]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack("!H", n))
    return head + mask + masked


def ws_roundtrip(gw, path, host):
    s = socket.create_connection(("127.0.0.1", gw.port), timeout=30)
    key = base64.b64encode(os.urandom(16)).decode()
    headers = "".join(f"{k}: {v}\r\n" for k, v in gw.headers().items())
    s.sendall((f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n{headers}\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    expected = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
    assert b"Sec-WebSocket-Accept: " + expected in head
    replies = []
    for msg in (b"hello", b"x" * 1000):
        s.sendall(ws_frame(msg))
        hdr = s.recv(2)
        n = hdr[1] & 0x7F
        if n == 126:
            n = struct.unpack("!H", s.recv(2))[0]
        data = b""
        while len(data) < n:
            data += s.recv(n - len(data))
        replies.append(data)
    s.sendall(ws_frame(b"", opcode=8))
    s.close()
    return replies


def test_websocket_by_path_and_by_host(gw, server):
    expect = [b"echo: hello", b"echo: " + b"x" * 1000]
    assert ws_roundtrip(gw, f"/sandboxes/{server}/proxy/{PORT}/ws", "x") == expect
    assert ws_roundtrip(gw, "/ws", f"{PORT}-{server}.{DOMAIN}") == expect


def test_nothing_listening_is_502(gw, server):
    status, err, _ = get_json(connect(gw), "GET", f"/sandboxes/{server}/proxy/9/", gw.headers())
    assert status == 502 and set(err) == {"code", "message"}


def vm_hwm_kb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def agent_pid(sid):
    for d in ("/sys/fs/cgroup/pids/cove", "/sys/fs/cgroup/cove"):
        p = os.path.join(d, sid, "cgroup.procs")
        if os.path.exists(p):
            return min(int(x) for x in open(p).read().split())
    raise AssertionError("no cgroup for " + sid)


def test_200_mb_of_output_streams_with_flat_memory(gw):
    sid = gw.create(limits={"cpu": "2", "memory": "512Mi"})
    try:
        agent = agent_pid(sid)
        daemon_before, agent_before = vm_hwm_kb(gw.proc.pid), vm_hwm_kb(agent)
        conn = connect(gw)
        conn.request("POST", f"/sandboxes/{sid}/proxy/44772/command",
                     body=json.dumps({"command": "head -c 150000000 /dev/zero | base64 -w 76"}),
                     headers=gw.headers())
        resp = conn.getresponse()
        total, tail = 0, b""
        while True:
            chunk = resp.read(1 << 20)
            if not chunk:
                break
            total += len(chunk)
            tail = (tail + chunk)[-4096:]
        events = parse_events(tail.decode().split("\n\n", 1)[1])
        assert events[-1]["type"] == "execution_complete", events[-1]
        assert total > 200_000_000  # 200 MB of base64 text, plus the event framing
        grew_daemon = vm_hwm_kb(gw.proc.pid) - daemon_before
        grew_agent = vm_hwm_kb(agent) - agent_before
        print(f"200 MB streamed: coved peak grew {grew_daemon} KiB, agent {grew_agent} KiB")
        # A sanitized build keeps freed memory in ASan's quarantine (256 MiB by default): its
        # peak says nothing of what it holds. coved's audit observer parses each output line
        # it counts, so a sanitized coved's peak is the quarantine's (with quarantine_size_mb=8
        # it grew 10 MiB here); the plain build's runs hold coved to the bound.
        assert grew_daemon < 32 * 1024 or os.environ.get("COVE_SANITIZED")
        assert grew_agent < 32 * 1024 or AGENT_SANITIZED
    finally:
        gw.delete(sid)


def test_a_slow_command_delivers_each_line_as_printed(gw):
    sid = gw.create()
    try:
        s = socket.create_connection(("127.0.0.1", gw.port), timeout=30)
        body = json.dumps({"command": "for i in 1 2 3 4; do date +%s.%N; sleep 1; done"})
        headers = "".join(f"{k}: {v}\r\n" for k, v in gw.headers().items())
        s.sendall((f"POST /sandboxes/{sid}/proxy/44772/command HTTP/1.1\r\nHost: x\r\n{headers}"
                   f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
        buf, lags = b"", []
        while len(lags) < 4:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
            now = time.time()
            for piece in buf.split(b"\n\n")[:-1]:
                start = piece.find(b"{")
                if start >= 0:
                    event = json.loads(piece[start:])
                    if event.get("type") == "stdout":
                        lags.append(now - float(event["text"]))
            buf = buf.split(b"\n\n")[-1]
        s.close()
        assert len(lags) == 4
        # each line arrived before the next one was printed (1 s later): no buffering
        assert max(lags) < 1.0, lags
        print(f"line-per-second command: lag per line {[round(l * 1000, 1) for l in lags]} ms")
    finally:
        gw.delete(sid)


def test_a_client_that_leaves_takes_its_command_with_it_at_once(gw, server):
    """The client's FIN goes on to the agent through the gateway: a foreground command whose
    client closed is killed then, not when its next output (or the 3 s heartbeat) would
    have found the client gone. Here that is before the command's second step."""
    gw.sh(server, "rm -f /tmp/after-leaving")
    conn = connect(gw)
    conn.request("POST", f"/sandboxes/{server}/proxy/44772/command",
                 body=json.dumps({"command": "sleep 2 && touch /tmp/after-leaving"}),
                 headers=gw.headers())
    resp = conn.getresponse()
    assert resp.status == 200
    resp.read1(1)  # the stream has begun: the command runs
    conn.close()
    time.sleep(3.5)
    assert gw.exec(server, "test -e /tmp/after-leaving").exit_code == 1


def test_paused_sandbox_is_409_or_resumed_on_access(gw):
    sid = gw.create()
    try:
        gw.pause(sid)
        status, err, _ = get_json(connect(gw), "GET", f"/sandboxes/{sid}/proxy/44772/ping",
                                  gw.headers())
        assert status == 409 and "resume" in err["message"]
        assert gw.get(sid)["status"]["state"] == "Paused"
    finally:
        gw.delete(sid)
    d = Coved(extra_args=["--resume-on-access"]).start()
    try:
        sid = d.create()
        d.sh(sid, "echo kept > /tmp/state")
        d.pause(sid)
        assert d.sh(sid, "cat /tmp/state") == "kept\n"  # the request itself resumed it
        assert d.get(sid)["status"]["state"] == "Running"
        d.delete(sid)
    finally:
        d.cleanup()


def test_api_request_pipelined_behind_a_proxied_one(coved, sandbox):
    """A keep-alive client pipelines an API request right behind a proxied one: the proxied
    response comes first, then the connection goes back to the API for the second (the
    tunnel fuzzer found the tunnel freed under its own feet here)."""
    import socket
    body = json.dumps({"command": "sleep 0.5; echo late"}).encode()
    s = socket.create_connection(("127.0.0.1", coved.port), timeout=20)
    try:
        s.sendall(f"POST /sandboxes/{sandbox}/proxy/44772/command HTTP/1.1\r\nHost: x\r\n"
                  f"OPEN-SANDBOX-API-KEY: test-key\r\nContent-Length: {len(body)}\r\n\r\n"
                  .encode() + body +
                  b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        reply = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            reply += chunk
    finally:
        s.close()
    first, _, rest = reply.partition(b"HTTP/1.1 200 OK\r\nContent-Type: application/json")
    assert b"late" in first
    assert b'"healthy"' in rest
    assert coved.health()["status"] == "healthy"


def test_http10_through_the_gateway_closes_unless_asked_to_stay(coved, sandbox):
    """Issue 9: an HTTP/1.0 request through the gateway is answered as the API answers it: the
    connection closes after the response unless the client asked for keep-alive, and then it
    stays open for the next request (the tunnel used to replay every head as HTTP/1.1)."""
    path = f"/sandboxes/{sandbox}/proxy/44772/ping"
    s = socket.create_connection(("127.0.0.1", coved.port), timeout=10)
    s.sendall(f"GET {path} HTTP/1.0\r\nOPEN-SANDBOX-API-KEY: test-key\r\n\r\n".encode())
    reply = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break  # closed by coved: what an HTTP/1.0 client expects
        reply += chunk
    s.close()
    assert reply.startswith(b"HTTP/1.1 200"), reply
    assert b"connection: close" in reply.lower()

    s = socket.create_connection(("127.0.0.1", coved.port), timeout=10)
    try:
        for _ in range(2):
            s.sendall(f"GET {path} HTTP/1.0\r\nConnection: keep-alive\r\n"
                      f"OPEN-SANDBOX-API-KEY: test-key\r\n\r\n".encode())
            reply = s.recv(65536)
            assert reply.startswith(b"HTTP/1.1 200"), reply
            assert b"connection: keep-alive" in reply.lower()
    finally:
        s.close()
