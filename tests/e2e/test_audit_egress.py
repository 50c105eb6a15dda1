"""Egress decisions in the audit trail (docs/api.md "Audit trail"): each one an event of kind
egress, allowed and denied, with the name, address, port and rule it was decided by."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import egress_world  # noqa: E402
from egress_world import world, coved  # noqa: E402,F401 (fixtures)
from egress_world import HTTP_PORT, allow  # noqa: E402

pytestmark = egress_world.needs_dnsmasq


def test_allowed_and_denied_decisions_are_events(coved, world):
    sid = coved.create(networkPolicy=allow("allowed.test", "127.77.0.10"))
    try:
        r = coved.exec(sid, f"curl -sS -m 10 http://allowed.test:{HTTP_PORT}/hello")
        assert r.exit_code == 0, r.stderr
        coved.exec(sid, f"curl -sS -m 10 --resolve other.test:{HTTP_PORT}:127.77.0.11 "
                        f"http://other.test:{HTTP_PORT}/")
        trail = coved.ok("GET", f"/v1/sandboxes/{sid}/events?kind=egress")["items"]
        kept = coved.ok("GET", f"/v1/sandboxes/{sid}/egress/events")["events"]
        # The same decisions as egress's own record, one event each.
        assert [(e["verdict"], e["name"], e["address"], e["port"], e["rule"]) for e in trail] \
            == [("allowed" if k["action"] == "allow" else "denied", k["name"], k["address"],
                 k["port"], k["rule"]) for k in kept], (trail, kept)
        assert any(e["verdict"] == "allowed" and e["name"] == "allowed.test"
                   and e["address"] == "127.77.0.10" and e["port"] == HTTP_PORT
                   and e["rule"] == "allow allowed.test" for e in trail), trail
        assert any(e["verdict"] == "denied" and e["name"] == "other.test" for e in trail), trail
        owner = coved.ok("GET", f"/v1/sandboxes/{sid}/events?kind=sandbox.create")["items"][0]
        assert all(e["owner"] == owner["owner"] and e["kind"] == "egress" for e in trail)
    finally:
        coved.delete(sid)
    world.recorder.clear()
