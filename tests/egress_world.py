"""The outside world of the egress tests, all on this machine's loopback (127.77.0.x): a test
CA and servers it signs, a DNS server (Debian's dnsmasq) that coved is pointed at for the test
names, plain HTTP, HTTPS and raw TCP servers that record who reached them, and a UDP sink.
Nothing here ever sends traffic off the machine."""
import contextlib
import http.server
import json
import os
import shutil
import socket
import socketserver
import ssl
import subprocess
import tempfile
import threading
import time

import pytest

from covetest import serve

# name -> address the test DNS server answers
NAMES = {
    "allowed.test": "127.77.0.10",
    "other.test": "127.77.0.11",
    "api.test": "127.77.0.12",
    "pypi.test": "127.77.0.13",
    "denied.test": "127.77.0.14",
    "doh.test": "127.77.0.15",
    "deep.wild.test": "127.77.0.16",
    "rebind.test": "127.0.0.1",
    "metadata.test": "169.254.169.254",
}
DNS_ADDRESS = "127.77.0.53"
# The servers listen on fixed ports of the addresses above. Under pytest-xdist every worker
# (PYTEST_XDIST_WORKER gw0, gw1, ...) runs a world of its own at the same time: each gets ports
# of its own, so that two egress modules never contend for one socket, and what a world's
# recorder saw came from its own worker's sandboxes.
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").lstrip("gw") or 0)
HTTP_PORT = 8080 + 10 * _WORKER
HTTPS_PORT = 8443 + 10 * _WORKER
ECHO_PORT = 7000 + 10 * _WORKER


def free_port(address):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def make_ca(dir_):
    """A CA and a leaf for every test name (SAN), with openssl's command line."""
    ca_key, ca_pem = os.path.join(dir_, "ca.key"), os.path.join(dir_, "ca.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", ca_key, "-out", ca_pem,
                    "-days", "2", "-subj", "/CN=Cove egress test CA"],
                   check=True, capture_output=True)
    key, csr, pem = (os.path.join(dir_, n) for n in ("leaf.key", "leaf.csr", "leaf.pem"))
    subprocess.run(["openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=test servers"],
                   check=True, capture_output=True)
    ext = os.path.join(dir_, "leaf.ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=" + ",".join(f"DNS:{n}" for n in NAMES) + "\n")
    subprocess.run(["openssl", "x509", "-req", "-in", csr, "-CA", ca_pem, "-CAkey", ca_key,
                    "-CAcreateserial", "-out", pem, "-days", "2", "-extfile", ext],
                   check=True, capture_output=True)
    return ca_pem, pem, key


class Recorder:
    """Who reached which server, and what they sent."""

    def __init__(self):
        self.lock = threading.Lock()
        self.hits = []  # (server address, kind, path, headers dict)

    def add(self, *hit):
        with self.lock:
            self.hits.append(hit)

    def to(self, address):
        with self.lock:
            return [h for h in self.hits if h[0] == address]

    def clear(self):
        with self.lock:
            self.hits.clear()


def _handler(recorder, address, kind, files):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # headers and body leave as they are written (no Nagle wait on kept-alive connections)
        disable_nagle_algorithm = True

        def log_message(self, *a):
            pass

        def _answer(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = {k: v for k, v in self.headers.items()}
            recorder.add(address, kind, self.path, headers)
            path = self.path.split("?")[0]
            static = files.get("static")  # (prefix, directory): files served as they are
            if path in files:
                data, ctype = files[path]
            elif static and path.startswith(static[0]) and ".." not in path:
                full = os.path.join(static[1], path[len(static[0]):])
                if not os.path.isfile(full):
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                with open(full, "rb") as f:
                    data, ctype = f.read(), "application/octet-stream"
            else:
                # echoes what arrived: the headers, the path and the body
                data = json.dumps({"server": address, "path": self.path, "headers": headers,
                                   "body": body.decode(errors="replace")}).encode()
                ctype = "application/json"
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("X-Echo-Authorization", headers.get("Authorization", ""))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _answer
    return Handler


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class _Echo(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True


class World:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="cove-egress-world-")
        self.ca, self.cert, self.key = make_ca(self.dir)
        self.recorder = Recorder()
        self.files = {}  # path -> (bytes, content type), served by every HTTP(S) server
        self.servers = []
        self.threads = []
        self.dnsmasq = None
        self.dns_port = None
        self.dns_log = os.path.join(self.dir, "dnsmasq.log")
        self.udp_sink = None
        self.udp_got = []

    # ---- servers ----

    def _serve(self, server):
        t = threading.Thread(target=server.serve_forever, daemon=True)
        t.start()
        self.servers.append(server)
        self.threads.append(t)

    def start(self):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert, self.key)
        for name, address in NAMES.items():
            if not address.startswith("127.77."):
                continue
            self._serve(_Server((address, HTTP_PORT),
                                _handler(self.recorder, address, "http", self.files)))
            https = _Server((address, HTTPS_PORT),
                            _handler(self.recorder, address, "https", self.files))
            https.socket = ctx.wrap_socket(https.socket, server_side=True)
            self._serve(https)
            rec = self.recorder

            class EchoHandler(socketserver.BaseRequestHandler):
                def handle(self, address=address):
                    rec.add(address, "tcp", "", {})
                    self.request.sendall(b"echo-server " + address.encode() + b"\n")
                    data = self.request.recv(4096)
                    self.request.sendall(data)
            self._serve(_Echo((address, ECHO_PORT), EchoHandler))
        # a UDP sink: nothing from a sandbox may ever arrive here
        self.udp_sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp_sink.bind(("127.77.0.20", 0))
        self.udp_sink.settimeout(0.2)
        self._start_dnsmasq()
        return self

    def _start_dnsmasq(self):
        dnsmasq = shutil.which("dnsmasq") or "/usr/sbin/dnsmasq"
        self.dns_port = free_port(DNS_ADDRESS)
        args = [dnsmasq, "--keep-in-foreground", "--no-resolv", "--no-hosts", "--no-poll",
                "--bind-interfaces", f"--listen-address={DNS_ADDRESS}",
                f"--port={self.dns_port}", "--user=root", "--group=root", "--pid-file=",
                "--log-queries", f"--log-facility={self.dns_log}", "--local=/test/"]
        args += [f"--address=/{n}/{a}" for n, a in NAMES.items()]
        args += ["--address=/exfil.test/127.77.0.99"]
        self.dnsmasq = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 10
        while time.time() < deadline:
            if self.dnsmasq.poll() is not None:
                raise RuntimeError("dnsmasq did not start: " + self.dnsmasq.stderr.read().decode())
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                try:
                    s.connect((DNS_ADDRESS, self.dns_port))
                    s.send(b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
                           b"\x07allowed\x04test\x00\x00\x01\x00\x01")
                    s.settimeout(0.2)
                    if s.recv(512):
                        return
                except OSError:
                    time.sleep(0.05)
        raise RuntimeError("dnsmasq does not answer")

    def dns_queries(self):
        try:
            with open(self.dns_log) as f:
                return f.read()
        except OSError:
            return ""

    def udp_received(self):
        got = []
        while True:
            try:
                got.append(self.udp_sink.recvfrom(4096))
            except OSError:
                return got

    def coved_args(self):
        return ["--dns-server", f"{DNS_ADDRESS}:{self.dns_port}", "--egress-ca-bundle", self.ca,
                "--egress-log", "all"]

    def stop(self):
        for s in self.servers:
            s.shutdown()
            s.server_close()
        if self.udp_sink:
            self.udp_sink.close()
        if self.dnsmasq and self.dnsmasq.poll() is None:
            self.dnsmasq.kill()
            self.dnsmasq.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def running_world():
    w = World()
    try:
        yield w.start()
    finally:
        w.stop()


# The fixtures of the egress test modules (`from egress_world import world, coved`): one world
# and one coved pointed at it per module. A module that serves more (a package index, a
# repository) defines its own `world` around running_world().
needs_dnsmasq = pytest.mark.skipif(not os.path.exists("/usr/sbin/dnsmasq"), reason="needs dnsmasq")


@pytest.fixture(scope="module")
def world():
    with running_world() as w:
        yield w


@pytest.fixture(scope="module")
def coved(world):
    with serve(*world.coved_args()) as d:
        yield d


def allow(*targets, default="deny"):
    """A NetworkPolicy allowing targets (names, and the test addresses they need)."""
    return {"defaultAction": default,
            "egress": [{"action": "allow", "target": t} for t in targets]}
