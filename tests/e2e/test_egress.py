"""Egress: outbound traffic denied by default and allowed by name, IP and CIDR (issue 10).
Every server is on this machine's loopback (tests/egress_world.py); coved resolves the test
names with a dnsmasq it is pointed at. Each check asserts what the sandbox got and what the
servers saw."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from covetest import serve  # noqa: E402
import egress_world  # noqa: E402
from egress_world import world, coved  # noqa: E402,F401 (fixtures)
from egress_world import HTTP_PORT, HTTPS_PORT, ECHO_PORT, allow  # noqa: E402

pytestmark = egress_world.needs_dnsmasq


@pytest.fixture
def make(coved, world):
    made = []

    def make(policy=None, **extra):
        if policy is not None:
            extra["networkPolicy"] = policy
        sid = coved.create(**extra)
        made.append(sid)
        # the test CA, for HTTPS the proxy only passes through
        with open(world.ca) as f:
            ca = f.read()
        r = coved.exec(sid, f"cat > /tmp/test-ca.pem <<'EOF'\n{ca}EOF")
        assert r.exit_code == 0
        return sid

    yield make
    for sid in made:
        try:
            coved.delete(sid)
        except Exception:
            pass
    world.recorder.clear()


def curl(coved, sid, url, *args):
    """curl inside the sandbox: (exit code, body)."""
    extra = " ".join(args)
    r = coved.exec(sid, f"curl -sS -m 10 --cacert /tmp/test-ca.pem {extra} '{url}'")
    return r.exit_code, r.stdout + r.stderr


def served_by(output):
    """Which test server answered (its echo names itself)."""
    try:
        return json.JSONDecoder().raw_decode(output[output.index("{"):])[0]["server"]
    except (ValueError, KeyError, TypeError):
        return None


def events(coved, sid):
    return coved.ok("GET", f"/v1/sandboxes/{sid}/egress/events")["events"]


def test_default_is_deny_all(coved, make, world):
    sid = make()
    code, out = curl(coved, sid, f"http://allowed.test:{HTTP_PORT}/")
    assert code != 0
    r = coved.exec(sid, "getent hosts allowed.test")
    assert r.exit_code != 0  # the resolver does not know it for this sandbox
    assert world.recorder.to("127.77.0.10") == []
    ev = events(coved, sid)
    assert any(e["action"] == "deny" and e["name"] == "allowed.test" and "default" in e["rule"]
               for e in ev), ev


def test_allowed_by_name_and_nothing_else(coved, make, world):
    sid = make(allow("allowed.test", "127.77.0.10"))
    code, out = curl(coved, sid, f"http://allowed.test:{HTTP_PORT}/hello")
    assert code == 0 and served_by(out) == "127.77.0.10", out
    code, out = curl(coved, sid, f"https://allowed.test:{HTTPS_PORT}/tls")
    assert code == 0 and served_by(out) == "127.77.0.10", out
    assert coved.sh(sid, "getent hosts allowed.test").split()[0] == "127.77.0.10"
    # another name: not in the sandbox's DNS, and refused by name if reached by address
    code, _ = curl(coved, sid, f"http://other.test:{HTTP_PORT}/")
    assert code != 0
    code, out = curl(coved, sid, f"http://other.test:{HTTP_PORT}/",
                     f"--resolve other.test:{HTTP_PORT}:127.77.0.11")
    assert "cove egress" in out and "other.test" in out, out
    assert world.recorder.to("127.77.0.11") == []
    ev = events(coved, sid)
    assert any(e["action"] == "allow" and e["name"] == "allowed.test"
               and e["address"] == "127.77.0.10" and e["rule"] == "allow allowed.test"
               for e in ev), ev
    assert any(e["action"] == "deny" and e["name"] == "other.test" for e in ev), ev


def test_wildcard_names(coved, make, world):
    sid = make(allow("*.wild.test", "127.77.0.16"))
    code, out = curl(coved, sid, f"http://deep.wild.test:{HTTP_PORT}/")
    assert code == 0 and served_by(out) == "127.77.0.16", out
    code, _ = curl(coved, sid, f"http://allowed.test:{HTTP_PORT}/")
    assert code != 0


def test_ip_and_cidr_rules_allow_raw_tcp(coved, make, world):
    sid = make(allow("127.77.0.11", "127.77.0.12/31"))
    # raw TCP where the server speaks first (no name to go by): the address rule decides
    probe = ("import socket,sys; s=socket.create_connection((sys.argv[1], %d), timeout=5);"
             "print(s.recv(100).decode().strip()); s.sendall(b'ping'); print(s.recv(100).decode())"
             % ECHO_PORT)
    for address in ("127.77.0.11", "127.77.0.12", "127.77.0.13"):
        out = coved.sh(sid, f"python3 -c \"{probe}\" {address}")
        assert out.splitlines() == [f"echo-server {address}", "ping"], out
    r = coved.exec(sid, f"python3 -c \"{probe}\" 127.77.0.14")
    assert r.exit_code != 0
    assert world.recorder.to("127.77.0.14") == []


def test_deny_wins_over_allow(coved, make, world):
    sid = make({"defaultAction": "deny", "egress": [
        {"action": "allow", "target": "*.test"},
        {"action": "allow", "target": "127.77.0.0/24"},
        {"action": "deny", "target": "denied.test"},
        {"action": "deny", "target": "127.77.0.11"},
    ]})
    code, out = curl(coved, sid, f"http://allowed.test:{HTTP_PORT}/")
    assert code == 0 and served_by(out) == "127.77.0.10", out
    code, out = curl(coved, sid, f"http://denied.test:{HTTP_PORT}/",
                     f"--resolve denied.test:{HTTP_PORT}:127.77.0.14")
    assert code != 0 or "cove egress" in out
    # other.test's name is allowed, its address is not
    code, out = curl(coved, sid, f"http://other.test:{HTTP_PORT}/")
    assert code != 0 or "cove egress" in out, out
    assert world.recorder.to("127.77.0.14") == [] and world.recorder.to("127.77.0.11") == []


def test_allow_all_still_denies_the_host(coved, make, world):
    sid = make({})  # an explicit empty policy: allow-all
    code, out = curl(coved, sid, f"http://allowed.test:{HTTP_PORT}/",
                     f"--resolve allowed.test:{HTTP_PORT}:127.77.0.10")
    # the name is allowed but its address is loopback, which no rule names
    assert code != 0 or "cove egress" in out, out
    for url in (f"http://127.0.0.1:{coved.port}/health", "http://169.254.169.254/latest/",
                f"http://metadata.test:{HTTP_PORT}/", f"http://rebind.test:{coved.port}/health"):
        code, out = curl(coved, sid, url)
        assert "healthy" not in out and (code != 0 or "cove egress" in out), (url, out)
    # even rules naming the host's loopback do not open coved's own port (127.0.0.1 inside is
    # the sandbox's own loopback: the way out to the host's is a name that resolves there)
    sid2 = make(allow("rebind.test", "127.0.0.1", default="allow"))
    code, out = curl(coved, sid2, f"http://rebind.test:{coved.port}/health",
                     f"--resolve rebind.test:{coved.port}:127.77.0.10")
    assert "healthy" not in out and "cove egress" in out, out
    ev = events(coved, sid2)
    assert any("coved's own" in e["rule"] for e in ev), ev


def test_runtime_patch_applies_to_the_next_connection(coved, make, world):
    sid = make(allow("allowed.test", "127.77.0.10"))
    code, _ = curl(coved, sid, f"http://other.test:{HTTP_PORT}/")
    assert code != 0
    base = f"/sandboxes/{sid}/proxy/18080/policy"
    status, body, _ = coved.request("PATCH", base, [{"action": "allow", "target": "other.test"},
                                                    {"action": "allow", "target": "127.77.0.11"}])
    assert status == 200 and body["status"] == "ok", body
    code, out = curl(coved, sid, f"http://other.test:{HTTP_PORT}/")
    assert code == 0 and served_by(out) == "127.77.0.11", out
    status, body, _ = coved.request("GET", base)
    targets = [r["target"] for r in body["policy"]["egress"]]
    assert status == 200 and body["mode"] == "deny_all" and "other.test" in targets, body
    status, body, _ = coved.request("DELETE", base, ["other.test", "127.77.0.11"])
    assert status == 200
    code, _ = curl(coved, sid, f"http://other.test:{HTTP_PORT}/")
    assert code != 0
    # a bad patch is a 400 and changes nothing
    status, body, _ = coved.request("PATCH", base, [{"action": "maybe", "target": "x.test"}])
    assert status == 400 and body["code"], body
    status, body, _ = coved.request("GET", base)
    assert [r["target"] for r in body["policy"]["egress"]] == ["allowed.test", "127.77.0.10"]


def test_policy_api_needs_a_key_and_is_not_reachable_from_inside(coved, make, world):
    sid = make({})
    status, _, _ = coved.request("GET", f"/sandboxes/{sid}/proxy/18080/policy",
                                 headers={"OPEN-SANDBOX-API-KEY": "wrong"})
    assert status == 401
    for url in ("http://127.0.0.1:18080/policy", f"http://127.0.0.1:{coved.port}"
                f"/sandboxes/{sid}/proxy/18080/policy"):
        code, out = curl(coved, sid, url, "-H 'OPEN-SANDBOX-API-KEY: test-key'")
        assert '"policy"' not in out, out
    assert not os.path.exists(os.path.join(coved.run_dir(sid), "egress-api.sock"))
    r = coved.exec(sid, "ls / /run /tmp; find / -name 'egress-api.sock' 2>/dev/null | head -1")
    assert "egress-api.sock" not in r.stdout


def test_bad_network_policy_is_a_400_and_creates_nothing(coved, world):
    before = coved.ok("GET", "/v1/sandboxes")
    for policy in ({"defaultAction": "sometimes"}, {"egress": [{"action": "allow"}]},
                   {"egress": [{"action": "allow", "target": "bad name!"}]},
                   {"egress": "pypi.org"}, {"unknown": 1}, "deny"):
        status, body, _ = coved.request("POST", "/v1/sandboxes", {
            "image": {"uri": "base"}, "entrypoint": ["sleep", "1"],
            "resourceLimits": {"cpu": "1", "memory": "256Mi"}, "networkPolicy": policy})
        assert status == 400 and body["code"] and body["message"], (policy, body)
    assert coved.ok("GET", "/v1/sandboxes")["items"] == before["items"]


def test_policy_survives_a_restart(world):
    with serve(*world.coved_args(), start=False) as d:
        d.start()
        sid = d.create(networkPolicy=allow("allowed.test", "127.77.0.10"))
        d.request("PATCH", f"/sandboxes/{sid}/proxy/18080/policy",
                  [{"action": "allow", "target": "other.test"},
                   {"action": "allow", "target": "127.77.0.11"}])
        d.kill()
        d.start()
        out = d.sh(sid, f"curl -sS -m 10 http://other.test:{HTTP_PORT}/")
        assert served_by(out) == "127.77.0.11", out
        r = d.exec(sid, f"curl -sS -m 10 http://denied.test:{HTTP_PORT}/")
        assert r.exit_code != 0
        d.delete(sid)


def test_outside_addresses_reach_the_proxy(coved, make):
    """An address outside 127/8 (TEST-NET-2, never dialled: the policy denies it) goes to the
    proxy like any other, which answers for it; the sandbox's ::1 stays its own."""
    sid = make()
    code, out = curl(coved, sid, "http://198.51.100.10:8080/")
    assert "cove egress" in out and "198.51.100.10" in out, out
    ev = events(coved, sid)
    assert any(e["action"] == "deny" and e["address"] == "198.51.100.10" for e in ev), ev
    probe = ("import socket; s=socket.socket(socket.AF_INET6); s.bind(('::1',8765)); s.listen();"
             "c=socket.create_connection(('::1',8765),timeout=5); a,_=s.accept(); c.sendall(b'v6');"
             "print(a.recv(10).decode())")
    assert coved.sh(sid, f'python3 -c "{probe}"').strip() == "v6"
