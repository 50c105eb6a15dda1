"""Hostile clients against coved's HTTP server and gateway (issue 8, items 2-4): pipelined
bytes while a response is pending, slowloris heads, connection floods from one address and
from many, tunnel floods against one sandbox. Each test bounds what it sends and checks
afterwards that coved answers /health, that another sandbox works and that coved's memory
and descriptors came back."""

import json
import os
import select
import socket
import threading
import time

import pytest

from covetest import AGENT_PORT, serve, settled_fds

# Loopback addresses for attackers; well-behaved clients use 127.0.0.1.
ATTACKERS = [f"127.77.0.{i}" for i in range(1, 21)]


# ASan keeps freed memory in quarantine (256 MiB by default): a sanitized coved's RSS grows
# with every allocation it frees, bounded or not. There the bytes coved takes are the check.
SANITIZED = os.environ.get("COVE_SANITIZED") == "1"


def assert_memory_flat(grown_kib):
    if not SANITIZED:
        assert grown_kib < 64 * 1024, f"coved grew by {grown_kib >> 10} MiB"


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def connect(port, source=None, timeout=5):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout,
                                 source_address=(source, 0) if source else None)
    return s


def read_response(sock, timeout=5):
    """Bytes until the peer closes or `timeout` passes with nothing more."""
    sock.settimeout(timeout)
    out = b""
    try:
        while True:
            b = sock.recv(65536)
            if not b:
                break
            out += b
    except (socket.timeout, ConnectionResetError):
        pass
    return out


def closed_by_peer(sock, timeout):
    """True once the server closes the connection (EOF or reset) within `timeout`."""
    sock.settimeout(timeout)
    deadline = time.time() + timeout
    try:
        while time.time() < deadline:
            b = sock.recv(65536)
            if not b:
                return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False
    return False


def get_health(port, source=None):
    s = connect(port, source)
    try:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return read_response(s)
    finally:
        s.close()


def push(sock, data, most, seconds=4):
    """Sends data over and over for `seconds` (or up to `most` bytes) without reading: how
    many bytes the peer took."""
    sock.settimeout(0.5)
    sent = 0
    deadline = time.time() + seconds
    while time.time() < deadline and sent < most:
        try:
            sent += sock.send(data)
        except socket.timeout:
            pass
    return sent


def wait_until(predicate, timeout=20, step=0.1):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


@pytest.fixture
def guarded():
    """A coved with small connection limits and short deadlines, so that the attacks below
    stay small."""
    with serve("--head-timeout", "2", "--max-connections", "300", "--max-connections-per-peer",
               "40", "--max-tunnels-per-sandbox", "20", "--gateway-idle-timeout", "3") as d:
        yield d


def proxy_head(sid, path, key="test-key", extra=""):
    return (f"GET /sandboxes/{sid}/proxy/{AGENT_PORT}{path} HTTP/1.1\r\nHost: x\r\n"
            f"OPEN-SANDBOX-API-KEY: {key}\r\n{extra}\r\n").encode()


def test_pipelined_bytes_are_not_buffered_without_limit(coved):
    """Item 2: while a response is pending the gateway stops reading the client's next bytes:
    a client that pushes 512 MiB of pipelined requests gets only a bounded amount accepted
    and coved's memory does not grow with it."""
    sid = coved.create()
    try:
        before = rss_kib(coved.proc.pid)
        s = connect(coved.port)
        body = json.dumps({"command": "sleep 6"}).encode()
        s.sendall(f"POST /sandboxes/{sid}/proxy/{AGENT_PORT}/command HTTP/1.1\r\nHost: x\r\n"
                  f"OPEN-SANDBOX-API-KEY: test-key\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        junk = proxy_head(sid, "/ping") * 4096  # ~600 KiB of pipelined heads a piece
        sent = push(s, junk, 512 * 1024 * 1024)
        grown = rss_kib(coved.proc.pid) - before
        s.close()
        # Accepted: kernel socket buffers (a few MiB on loopback) plus the gateway's bound.
        assert sent < 64 * 1024 * 1024, f"coved accepted {sent >> 20} MiB of pipelined bytes"
        assert_memory_flat(grown)
        assert b'"status"' in get_health(coved.port)
        assert coved.sh(sid, "echo alive").strip() == "alive"
    finally:
        coved.delete(sid)


def test_sandbox_talking_out_of_turn_is_not_buffered(coved):
    """Item 2, the other direction: a sandbox server that sends endless bytes no client asked
    for costs coved a bounded read-ahead."""
    sid = coved.create()
    try:
        # An HTTP/1.1 server that answers one request, then floods the connection.
        coved.sh(sid, "cat > /tmp/flood.py <<'EOF'\n"
                 "import socket\n"
                 "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
                 "s.bind(('127.0.0.1', 8099)); s.listen(8)\n"
                 "while True:\n"
                 "    c,_=s.accept(); c.recv(65536)\n"
                 "    c.sendall(b'HTTP/1.1 200 OK\\r\\nContent-Length: 2\\r\\n\\r\\nok')\n"
                 "    chunk=b'x'*65536\n"
                 "    try:\n"
                 "        for _ in range(16384): c.sendall(chunk)\n"
                 "    except OSError: pass\n"
                 "    c.close()\n"
                 "EOF\n"
                 "nohup python3 /tmp/flood.py >/dev/null 2>&1 &\n"
                 "for i in $(seq 50); do python3 -c \"import socket; "
                 "socket.create_connection(('127.0.0.1',8099)).close()\" 2>/dev/null && break;"
                 " sleep 0.1; done")
        before = rss_kib(coved.proc.pid)
        s = connect(coved.port)
        s.sendall(f"GET /sandboxes/{sid}/proxy/8099/ HTTP/1.1\r\nHost: x\r\n"
                  f"OPEN-SANDBOX-API-KEY: test-key\r\n\r\n".encode())
        s.settimeout(5)
        first = s.recv(65536)
        assert b"200 OK" in first
        time.sleep(3)  # the sandbox pushes up to 1 GiB meanwhile; nobody reads it
        grown = rss_kib(coved.proc.pid) - before
        s.close()
        assert_memory_flat(grown)
        assert b'"status"' in get_health(coved.port)
    finally:
        coved.delete(sid)


def test_slowloris_heads_are_cut_off_and_health_keeps_answering(guarded):
    """Item 3: 600 connections from 20 addresses trickle a header forever; /health and an
    established keep-alive client are served meanwhile, the trickling connections are closed
    once their head deadline passes, and coved's descriptors come back."""
    fds_before = settled_fds(guarded.proc.pid)
    established = connect(guarded.port)
    established.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert b"200 OK" in established.recv(65536)

    trickling = []
    stop = threading.Event()
    for i in range(600):
        try:
            s = connect(guarded.port, ATTACKERS[i % len(ATTACKERS)], timeout=2)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            trickling.append(s)
        except OSError:
            pass

    def trickle():
        while not stop.is_set():
            for s in list(trickling):
                try:
                    s.send(b"a")
                except OSError:
                    pass
            stop.wait(0.3)

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    try:
        for _ in range(5):
            assert b"200 OK" in get_health(guarded.port), "/health starved by slowloris"
            established.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert b"200 OK" in established.recv(65536), "established client starved"
            time.sleep(0.2)
        # Every trickling connection ends by its deadline, though it keeps sending.
        assert all(closed_by_peer(s, 10) for s in trickling)
    finally:
        stop.set()
        t.join(5)
        for s in trickling:
            s.close()
        established.close()
    assert wait_until(lambda: settled_fds(guarded.proc.pid) <= fds_before + 2)
    sid = guarded.create()
    assert guarded.sh(sid, "echo ok").strip() == "ok"
    guarded.delete(sid)


def test_one_address_cannot_take_every_connection(guarded):
    """Item 3: past max_connections_per_peer, further connections from that address are
    refused with a body, while other addresses are served."""
    held = []
    try:
        for _ in range(40):
            s = connect(guarded.port, ATTACKERS[0])
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert b"200 OK" in s.recv(65536)
            held.append(s)
        extra = connect(guarded.port, ATTACKERS[0])
        answer = read_response(extra, 3)
        extra.close()
        assert answer == b"" or b"429" in answer.split(b"\r\n")[0]
        if answer:
            assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["code"]
        assert b"200 OK" in get_health(guarded.port, ATTACKERS[1])
        assert b"200 OK" in get_health(guarded.port)
    finally:
        for s in held:
            s.close()
    assert wait_until(lambda: b"200 OK" in get_health(guarded.port, ATTACKERS[0]))


def test_tunnel_flood_is_capped_and_idle_tunnels_close(guarded):
    """Item 4: gateway tunnels count against the caps: one sandbox takes at most
    max_tunnels_per_sandbox (the next gets 429 with a body), another sandbox and /health stay
    reachable, idle tunnels are closed after the gateway's idle timeout and coved's
    descriptors come back."""
    a, b = guarded.create(), guarded.create()
    fds_before = settled_fds(guarded.proc.pid)
    tunnels = []
    try:
        refused = None
        for i in range(30):
            s = connect(guarded.port, ATTACKERS[i % len(ATTACKERS)])
            s.sendall(proxy_head(a, "/ping"))
            s.settimeout(5)
            first = s.recv(65536)
            tunnels.append(s)
            if b" 429 " in first.split(b"\r\n")[0]:
                refused = first
                break
            assert b"200" in first.split(b"\r\n")[0], first
        assert refused is not None, "no tunnel cap per sandbox"
        body = refused.split(b"\r\n\r\n", 1)[1]
        assert json.loads(body)["code"] == "GATEWAY::TOO_MANY_CONNECTIONS"
        assert len(tunnels) == 21
        assert guarded.sh(b, "echo other").strip() == "other"
        assert b"200 OK" in get_health(guarded.port)
        # Idle: no byte either way for the idle timeout closes them all.
        assert all(closed_by_peer(s, 15) for s in tunnels[:20])
    finally:
        for s in tunnels:
            s.close()
    assert wait_until(lambda: settled_fds(guarded.proc.pid) <= fds_before + 2)
    assert guarded.sh(a, "echo again").strip() == "again"
    guarded.delete(a)
    guarded.delete(b)


def test_streams_with_bytes_flowing_outlive_the_idle_timeout(guarded):
    """Item 4: the idle timeout cuts only silence: a command streaming output for longer than
    the timeout runs to its end."""
    sid = guarded.create()
    try:
        r = guarded.exec(sid, "for i in 1 2 3 4 5 6; do echo tick$i; sleep 1; done")
        assert r.exit_code == 0
        assert "tick6" in r.stdout
    finally:
        guarded.delete(sid)


def test_trickled_head_inside_a_tunnel_is_cut_off(guarded):
    """Item 3 through the gateway: after a first request, a client that trickles its next
    head on the same connection is answered 408 and closed."""
    sid = guarded.create()
    try:
        s = connect(guarded.port)
        s.sendall(proxy_head(sid, "/ping"))
        s.settimeout(5)
        assert b"200" in s.recv(65536)
        s.sendall(b"GET /sandboxes/" + sid.encode() + b"/proxy/44772/ping HTTP/1.1\r\nX: ")
        got = b""
        deadline = time.time() + 10
        # A byte a client sends once coved has answered and closed would draw a reset that
        # can take the answer with it: one more byte only while nothing has come.
        while time.time() < deadline:
            readable, _, _ = select.select([s], [], [], 0.3)
            if readable:
                b = s.recv(65536)
                if not b:
                    break
                got += b
                continue
            try:
                s.send(b"a")
            except OSError:
                break
        s.close()
        assert b"408" in got.split(b"\r\n")[0], got
        assert json.loads(got.split(b"\r\n\r\n", 1)[1])["code"] == "HTTP::REQUEST_TIMEOUT"
    finally:
        guarded.delete(sid)


def test_one_address_holds_a_quarter_of_a_sandboxs_tunnels(guarded):
    """Item 4: one client address may hold a quarter of max_tunnels_per_sandbox (5 of 20
    here): its next tunnel is a 429, while another address still reaches the sandbox."""
    sid = guarded.create()
    held = []
    try:
        for _ in range(5):
            s = connect(guarded.port, ATTACKERS[3])
            s.sendall(proxy_head(sid, "/ping"))
            s.settimeout(5)
            assert b"200" in s.recv(65536).split(b"\r\n")[0]
            held.append(s)
        s = connect(guarded.port, ATTACKERS[3])
        s.sendall(proxy_head(sid, "/ping"))
        answer = read_response(s, 3)
        s.close()
        assert b" 429 " in answer.split(b"\r\n")[0], answer
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["code"] == \
            "GATEWAY::TOO_MANY_CONNECTIONS"
        other = connect(guarded.port, ATTACKERS[4])
        other.sendall(proxy_head(sid, "/ping"))
        other.settimeout(5)
        assert b"200" in other.recv(65536).split(b"\r\n")[0]
        other.close()
    finally:
        for s in held:
            s.close()
        guarded.delete(sid)


def test_leftover_bytes_of_one_upstream_never_answer_the_next_request(coved):
    """A sandbox server answers with `Connection: close` and sends a forged response after
    it; the client's next request, pipelined to another upstream (the agent), gets the
    agent's answer, not the forgery (the tunnel once read on in the old upstream's bytes)."""
    sid = coved.create()
    try:
        coved.sh(sid, "cat > /tmp/forge.py <<'EOF'\n"
                 "import socket\n"
                 "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
                 "s.bind(('127.0.0.1', 8101)); s.listen(8)\n"
                 "while True:\n"
                 "    c,_=s.accept(); c.recv(65536)\n"
                 "    c.sendall(b'HTTP/1.1 200 OK\\r\\nContent-Length: 4\\r\\nConnection: close'\n"
                 "              b'\\r\\n\\r\\nrealHTTP/1.1 200 OK\\r\\nContent-Length: 6\\r\\n\\r\\nFORGED')\n"
                 "    c.close()\n"
                 "EOF\n"
                 "nohup python3 /tmp/forge.py >/dev/null 2>&1 &\n"
                 "for i in $(seq 50); do python3 -c \"import socket; "
                 "socket.create_connection(('127.0.0.1',8101)).close()\" 2>/dev/null && break;"
                 " sleep 0.1; done")
        for _ in range(5):
            s = connect(coved.port)
            s.sendall(f"GET /sandboxes/{sid}/proxy/8101/ HTTP/1.1\r\nHost: x\r\n"
                      f"OPEN-SANDBOX-API-KEY: test-key\r\n\r\n".encode() +
                      proxy_head(sid, "/ping", extra="Connection: close\r\n"))
            got = read_response(s, 5)
            s.close()
            assert b"real" in got, got
            assert b"FORGED" not in got, got
            assert got.count(b"HTTP/1.1 200") == 2, got
    finally:
        coved.delete(sid)


@pytest.mark.parametrize("route", ["gateway", "api"])
def test_answers_to_a_client_that_never_reads_stay_bounded(coved, route):
    """Pipelined requests that coved answers itself (refused gateway routes, API calls) from a
    client that never reads: coved stops taking requests once its answers queue up, so its
    memory does not grow with what the client pushes."""
    before = rss_kib(coved.proc.pid)
    head = (b"GET /sandboxes/nosuchsandbox/proxy/80/ HTTP/1.1\r\nHost: x\r\n\r\n"
            if route == "gateway" else b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n") * 2048
    s = connect(coved.port)
    sent = push(s, head, 256 * 1024 * 1024)
    grown = rss_kib(coved.proc.pid) - before
    s.close()
    assert sent < 64 * 1024 * 1024, f"coved took {sent >> 20} MiB of requests it had to answer"
    assert_memory_flat(grown)
    assert b"200 OK" in get_health(coved.port)


def test_a_refusal_reaches_a_client_that_half_closed(coved):
    """A client that sends one request and shuts its side (`nc -N`) still gets the gateway's
    refusal, as the API's answers reach it."""
    s = connect(coved.port)
    s.sendall(b"GET /sandboxes/nosuchsandbox/proxy/80/ HTTP/1.1\r\nHost: x\r\n"
              b"OPEN-SANDBOX-API-KEY: test-key\r\n\r\n")
    s.shutdown(socket.SHUT_WR)
    got = read_response(s, 5)
    s.close()
    assert got.startswith(b"HTTP/1.1 404"), got
    assert json.loads(got.split(b"\r\n\r\n", 1)[1])["code"] == "SANDBOX::NOT_FOUND"
