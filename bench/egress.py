"""Egress benchmark (issue 10): what going through coved's proxy adds to a connection and a
request, against the same client going direct, in one run. Four paths, each a fresh TCP
connection, one HTTP request and its response per iteration:
  direct        the client on the host, straight to the server (no sandbox, no proxy)
  proxy         the client in a sandbox, plain HTTP: redirect, Host check, relay
  passthrough   the client in a sandbox, HTTPS that coved does not decrypt (SNI check, relay)
  mitm          the client in a sandbox, HTTPS to a host with a credential binding (coved
                terminates TLS, injects the header, verifies the upstream)
TLS paths are compared with TLS direct. The same again for TLS with requests on one
kept-alive connection (what each request costs once connected; plain HTTP is not kept alive
through the proxy, see docs/egress.md). Then throughput: one connection downloading
--bulk-mib through the relay vs direct. Servers are on loopback (tests/egress_world.py).
Usage: bench/egress.py [--iterations N] [--bulk-mib N] [--json FILE]"""
import argparse
import json
import os
import socket
import socketserver
import subprocess
import sys
import threading
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(here), "tests"))
from covetest import serve  # noqa: E402
import egress_world  # noqa: E402
from egress_world import HTTP_PORT, HTTPS_PORT, allow  # noqa: E402

BULK_PORT = 7100

# The client, run the same way on the host and in a sandbox: prints JSON timings (ms).
CLIENT = r'''
import json, socket, ssl, sys, time
mode, host, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
cafile = sys.argv[5] if len(sys.argv) > 5 else None
ctx = ssl.create_default_context(cafile=cafile) if cafile else ssl.create_default_context()
req = ("GET /bench HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % host).encode()
out = []
# resolved once, as a client with a DNS cache would: the figures are the connections'
address = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)[0][4]
if mode == "bulk":
    t = time.perf_counter()
    s = socket.create_connection(address)
    s.sendall(req)
    got, buf = 0, bytearray(1 << 20)
    while True:
        k = s.recv_into(buf)
        if not k:
            break
        got += k
    print(json.dumps({"bytes": got, "s": time.perf_counter() - t}))
    sys.exit(0)
if mode in ("http-keepalive", "tls-keepalive"):
    # one connection, n requests on it: what each request costs once connected
    s = socket.create_connection(address)
    if mode == "tls-keepalive":
        s = ctx.wrap_socket(s, server_hostname=host)
    f = s.makefile("rb")
    one = ("GET /bench HTTP/1.1\r\nHost: %s\r\n\r\n" % host).encode()
    for i in range(n):
        t = time.perf_counter()
        s.sendall(one)
        length = 0
        while True:
            line = f.readline()
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
            if line in (b"\r\n", b""):
                break
        f.read(length)
        out.append((time.perf_counter() - t) * 1000)
    print(json.dumps(out))
    sys.exit(0)
for i in range(n):
    t = time.perf_counter()
    s = socket.create_connection(address)
    if mode == "tls":
        s = ctx.wrap_socket(s, server_hostname=host)
    s.sendall(req)
    data = b""
    while True:
        k = s.recv(65536)
        if not k:
            break
        data += k
    s.close()
    assert data.startswith(b"HTTP/1."), data[:40]
    out.append((time.perf_counter() - t) * 1000)
print(json.dumps(out))
'''


def pct(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


class Bulk(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True


def bulk_server(address, total, dir_="/tmp"):
    """Sends `total` bytes with sendfile(2) from a 64 MiB file: the source costs little CPU,
    so the figures are the path's, not Python's."""
    import tempfile
    src = tempfile.NamedTemporaryFile(dir=dir_, prefix="cove-bench-bulk-")
    src.write(b"x" * (64 << 20))
    src.flush()

    class H(socketserver.BaseRequestHandler):
        def handle(self):
            self.request.recv(4096)
            self.request.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
            with open(src.name, "rb") as f:
                for _ in range(total // (64 << 20)):
                    offset = 0
                    while offset < 64 << 20:
                        offset += os.sendfile(self.request.fileno(), f.fileno(), offset,
                                              (64 << 20) - offset)
    srv = Bulk((address, BULK_PORT), H)
    srv.source = src  # removed with the server
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=300)
    ap.add_argument("--bulk-mib", type=int, default=2048)
    ap.add_argument("--json")
    args = ap.parse_args()
    n = args.iterations
    with egress_world.running_world() as w:
        bulk = bulk_server("127.77.0.10", args.bulk_mib << 20)
        client = os.path.join(w.dir, "client.py")
        with open(client, "w") as f:
            f.write(CLIENT)

        with serve(*w.coved_args(), "--egress-log", "none") as d:
            sid = d.create(networkPolicy=allow("allowed.test", "api.test", "127.77.0.10",
                                               "127.77.0.12"),
                           credentialProxy={"enabled": True},
                           limits={"cpu": "2", "memory": "1Gi"})
            d.ok("POST", f"/sandboxes/{sid}/proxy/18080/credential-vault", {
                "credentials": [{"name": "k", "source": {"type": "inline", "value": "real"}}],
                "bindings": [{"name": "b", "match": {"hosts": ["api.test"],
                                                     "ports": [HTTPS_PORT]},
                              "auth": {"type": "bearer", "credential": "k"}}]},
                 expect=(201,))
            with open(client) as f:
                d.sh(sid, f"cat > /tmp/client.py <<'EOF'\n{f.read()}EOF")
            with open(w.ca) as f:
                d.sh(sid, f"cat > /tmp/test-ca.pem <<'EOF'\n{f.read()}EOF")

            def sandbox_run(*a):
                out = d.sh(sid, "python3 /tmp/client.py " + " ".join(map(str, a)),
                           http_timeout=600)
                return json.loads(out)

            results = {}
            # warm both sides once (name caches, leaf certificate)
            direct_run(client, w, "http", "allowed.test", HTTP_PORT, 20)
            sandbox_run("http", "allowed.test", HTTP_PORT, 20)
            sandbox_run("tls", "api.test", HTTPS_PORT, 5)
            results["direct http"] = direct_run(client, w, "http", "allowed.test", HTTP_PORT, n)
            results["proxy http"] = sandbox_run("http", "allowed.test", HTTP_PORT, n)
            # direct TLS: the host's client trusts the test CA, as the sandbox's does
            results["direct tls"] = direct_run(client, w, "tls", "allowed.test", HTTPS_PORT, n,
                                               w.ca)
            results["passthrough tls"] = sandbox_run("tls", "allowed.test", HTTPS_PORT, n,
                                                     "/tmp/test-ca.pem")
            results["mitm tls"] = sandbox_run("tls", "api.test", HTTPS_PORT, n)
            # (plain HTTP is not kept alive through the proxy: each request's Host is decided
            # on, so coved asks the server to close after each answer)
            results["direct tls, per request"] = direct_run(client, w, "tls-keepalive",
                                                             "allowed.test", HTTPS_PORT, n, w.ca)
            results["passthrough tls, per request"] = sandbox_run(
                "tls-keepalive", "allowed.test", HTTPS_PORT, n, "/tmp/test-ca.pem")
            results["mitm tls, per request"] = sandbox_run("tls-keepalive", "api.test",
                                                           HTTPS_PORT, n)
            bulk_direct = direct_run(client, w, "bulk", "allowed.test", BULK_PORT, 1)
            bulk_proxy = sandbox_run("bulk", "allowed.test", BULK_PORT, 1)
        bulk.shutdown()
    report(results, bulk_direct, bulk_proxy, n, args)


def direct_run(client, w, *args):
    """The client straight from the host: the names resolve through /etc/hosts in a private
    mount namespace (the same name, Host header and certificate as in the sandbox), without
    touching the host's resolver."""
    hosts = os.path.join(w.dir, "hosts")
    with open(hosts, "w") as f:
        f.write("127.77.0.10 allowed.test\n127.77.0.12 api.test\n")
    r = subprocess.run(["unshare", "-m", "sh", "-c",
                        f"mount --bind {hosts} /etc/hosts && exec {sys.executable} {client} "
                        + " ".join(map(str, args))],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def report(results, bulk_direct, bulk_proxy, n, args):
    print(f"== Egress: a new connection and one HTTP request each time, or (per request) "
          f"requests on one kept-alive connection; {n} iterations, ms")
    print(f"{'path':30} {'p50':>7} {'p99':>7} {'mean':>7} | {'added p50':>9} {'added p99':>9}")
    rows = {}
    for name, values in results.items():
        kind = ("tls" if "tls" in name else "http") + (", per request" if "request" in name else "")
        ref = results["direct " + kind]
        p50, p99 = pct(values, 50), pct(values, 99)
        add50 = p50 - pct(ref, 50)
        add99 = p99 - pct(ref, 99)
        rows[name] = {"p50": p50, "p99": p99, "mean": sum(values) / len(values),
                      "added_p50": add50, "added_p99": add99}
        print(f"{name:30} {p50:7.3f} {p99:7.3f} {rows[name]['mean']:7.3f} | "
              f"{add50:+9.3f} {add99:+9.3f}")
    gd = bulk_direct["bytes"] / bulk_direct["s"] / 1e9
    gp = bulk_proxy["bytes"] / bulk_proxy["s"] / 1e9
    print(f"== Throughput, one connection, {bulk_direct['bytes'] >> 20} MiB: direct {gd:.2f} GB/s,"
          f" through the relay {gp:.2f} GB/s ({gp / gd:.2f}x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"latency": rows, "throughput_gbps": {"direct": gd, "relay": gp}}, f,
                      indent=2)


if __name__ == "__main__":
    main()
