"""GET /metrics (issue 16): Prometheus's text format, checked by promtool, behind an admin key
(or open by config), and counters that move by exactly the actions a test performs. The
egress checks use the loopback world of tests/egress_world.py."""
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from covetest import AGENT_PORT, serve  # noqa: E402
import egress_world  # noqa: E402
from egress_world import world  # noqa: E402,F401 (fixture)
from egress_world import HTTP_PORT, allow  # noqa: E402

ADMIN = "metrics-admin"

pytestmark = egress_world.needs_dnsmasq


@pytest.fixture(scope="module")
def coved(world):
    with serve(*world.coved_args(), admin_keys=(ADMIN,)) as d:
        yield d


SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?')


def scrape_text(d, key=ADMIN):
    status, body, resp = d.request("GET", "/metrics", headers=d.headers(key))
    assert status == 200, body
    assert resp.getheader("Content-Type") == "text/plain; version=0.0.4; charset=utf-8"
    return body


def scrape(d):
    """{(name, frozenset(labels)): value}"""
    out = {}
    for line in scrape_text(d).splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        assert m, line
        labels = frozenset((k, v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\"))
                           for k, v in LABEL.findall(m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def value(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples, name, **labels):
    """The sum over every series of name whose labels include these."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def test_needs_an_admin_key(coved):
    status, body, _ = coved.request("GET", "/metrics", headers={})
    assert status == 401, body
    status, body, _ = coved.request("GET", "/metrics")  # the ordinary key
    assert status == 403 and body["code"] == "AUTH::FORBIDDEN", body
    assert scrape_text(coved).startswith("# HELP ")
    # as Prometheus sends a scrape's credentials
    status, body, _ = coved.request("GET", "/metrics", headers={"Authorization": "Bearer " + ADMIN})
    assert status == 200 and "# TYPE cove_sandboxes gauge" in body
    status, body, _ = coved.request("GET", "/metrics",
                                    headers={"Authorization": "Bearer " + coved.key})
    assert status == 403, body
    status, body, _ = coved.request("GET", "/metrics", headers={"Authorization": "Bearer nope"})
    assert status == 401, body


def test_open_when_configured():
    with serve("--metrics-open") as d:
        status, body, resp = d.request("GET", "/metrics", headers={})
        assert status == 200 and "# TYPE cove_sandboxes gauge" in body, body
        # the rest of the API still wants its key
        status, _, _ = d.request("GET", "/v1/sandboxes", headers={})
        assert status == 401


@pytest.mark.skipif(shutil.which("promtool") is None, reason="needs promtool (prometheus)")
def test_promtool_accepts_the_exposition(coved):
    sid = coved.create()
    try:
        coved.sh(sid, "true")  # a histogram with an observation, a gateway request
        text = scrape_text(coved)
    finally:
        coved.delete(sid)
    for family in ("cove_sandboxes", "cove_exec_duration_seconds", "process_open_fds",
                   "cove_event_loop_lag_seconds", "cove_egress_decisions_total"):
        assert f"# TYPE {family} " in text, text
    r = subprocess.run(["promtool", "check", "metrics"], input=text.encode(),
                       capture_output=True, timeout=60)
    assert r.returncode == 0 and r.stdout == b"" and r.stderr == b"", (r, text)


def test_counters_move_by_exactly_the_actions(coved):
    before = scrape(coved)
    made = [coved.create(), coved.create()]
    status, body, _ = coved.request("POST", "/v1/sandboxes", {
        "image": {"uri": "no-such-template"}, "entrypoint": ["sleep", "1"],
        "resourceLimits": {"cpu": "1", "memory": "256Mi"}})
    assert status == 400, body
    status, body, _ = coved.request("POST", "/v1/sandboxes", raw=b"{not json")
    assert status == 400, body
    r = coved.exec(made[0], "echo hi")
    assert r.stdout.strip() == "hi"
    coved.delete(made[1])
    after = scrape(coved)
    try:
        delta = lambda name, **ls: value(after, name, **ls) - value(before, name, **ls)  # noqa
        assert delta("cove_sandbox_creates_total", api="opensandbox") == 2
        assert delta("cove_sandbox_create_failures_total", api="opensandbox",
                     reason="invalid") == 2
        assert total(after, "cove_sandbox_create_failures_total") - \
            total(before, "cove_sandbox_create_failures_total") == 2
        assert delta("cove_sandbox_deletes_total", api="opensandbox") == 1
        assert delta("cove_sandbox_create_duration_seconds_count", api="opensandbox") == 2
        assert delta("cove_exec_duration_seconds_count") == 1
        assert delta("cove_gateway_requests_total", code="2xx") == 1
        assert total(after, "cove_gateway_requests_total") - \
            total(before, "cove_gateway_requests_total") == 1
        assert delta("cove_gateway_received_bytes_total") > 0
        assert delta("cove_gateway_sent_bytes_total") >= len("hi")
        # the gauge of sandboxes by state agrees with the API's list
        listed = coved.ok("GET", "/v1/sandboxes?pageSize=200")["items"]
        by_state = {}
        for sb in listed:
            by_state[sb["status"]["state"]] = by_state.get(sb["status"]["state"], 0) + 1
        for state, n in by_state.items():
            assert total(after, "cove_sandboxes", state=state) == n, (state, listed)
        assert total(after, "cove_sandboxes", state="Running", template="base") >= 1
    finally:
        coved.delete(made[0])


def test_an_error_through_the_gateway_counts_by_class(coved):
    before = scrape(coved)
    status, _, _ = coved.request("GET", "/sandboxes/nosuchsandbox/proxy/8080/")
    assert status == 404
    after = scrape(coved)
    assert value(after, "cove_gateway_requests_total", code="4xx") - \
        value(before, "cove_gateway_requests_total", code="4xx") == 1
    assert value(after, "cove_exec_duration_seconds_count") == \
        value(before, "cove_exec_duration_seconds_count")


def curl(coved, sid, url):
    r = coved.exec(sid, f"curl -sS -m 10 '{url}'")
    return r.exit_code


def test_egress_decisions_count(coved, world):
    sid = coved.create(networkPolicy=allow("allowed.test", "127.77.0.10"))
    try:
        before = scrape(coved)
        assert curl(coved, sid, f"http://allowed.test:{HTTP_PORT}/") == 0
        mid = scrape(coved)
        curl(coved, sid, f"http://127.77.0.14:{HTTP_PORT}/")  # refused (an error page)
        after = scrape(coved)
        events = coved.ok("GET", f"/v1/sandboxes/{sid}/egress/events")["events"]
    finally:
        coved.delete(sid)
    allowed = lambda s: total(s, "cove_egress_decisions_total", verdict="allowed")  # noqa
    denied = lambda s: total(s, "cove_egress_decisions_total", verdict="denied")  # noqa
    assert allowed(mid) - allowed(before) == 1 and denied(mid) == denied(before)
    assert denied(after) - denied(mid) == 1 and allowed(after) == allowed(mid)
    # the same decisions the sandbox's own trail shows
    assert [e["action"] for e in events] == ["allow", "deny"], events


def test_pool_gauges_match_the_pool(coved):
    admin = coved.headers(ADMIN)
    body = {"name": "metrics-pool", "template": "base",
            "resourceLimits": {"cpu": "500m", "memory": "256Mi"},
            "capacitySpec": {"bufferMin": 1, "bufferMax": 1, "poolMin": 0, "poolMax": 3}}
    status, got, _ = coved.request("POST", "/v1/pools", body, headers=admin)
    assert status == 201, got
    try:
        deadline = time.time() + 180
        while True:
            st = coved.ok("GET", "/v1/pools/metrics-pool", headers=admin)["status"]
            if st["available"] == 1:
                break
            assert time.time() < deadline, st
            time.sleep(0.1)
        samples = scrape(coved)
        assert value(samples, "cove_pool_sandboxes", pool="metrics-pool", state="ready") == 1
        assert value(samples, "cove_pool_target_sandboxes", pool="metrics-pool") == 1
        assert value(samples, "cove_sandbox_creates_total", api="pool") >= 1
        # idle pooled sandboxes are the pool's, not in the gauge of sandboxes
        listed = coved.ok("GET", "/v1/sandboxes?pageSize=200")["items"]
        assert total(samples, "cove_sandboxes") == len(listed)
    finally:
        status, got, _ = coved.request("DELETE", "/v1/pools/metrics-pool", headers=admin)
        assert status == 204, got
    assert ("cove_pool_target_sandboxes", frozenset({("pool", "metrics-pool")})) \
        not in scrape(coved)


def test_process_metrics(coved):
    samples = scrape(coved)
    pid = coved.proc.pid
    with open(f"/proc/{pid}/statm") as f:
        resident = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    assert 0 < value(samples, "process_resident_memory_bytes") < 4 * resident
    assert value(samples, "process_open_fds") > 3
    assert time.time() - 3600 < value(samples, "process_start_time_seconds") <= time.time()
    assert total(samples, "cove_build_info") == 1
    assert ("cove_event_loop_lag_seconds_count", frozenset()) in samples


def test_e2b_creates_and_kills_count_as_e2b(coved):
    before = scrape(coved)
    h = {"Content-Type": "application/json", "X-API-Key": coved.key}
    status, sb, _ = coved.request("POST", "/e2b/sandboxes", {"templateID": "base", "timeout": 600},
                                  headers=h)
    assert status == 201, sb
    status, body, _ = coved.request("POST", "/e2b/sandboxes",
                                    {"templateID": "no-such-template"}, headers=h)
    assert status == 400, body
    status, body, _ = coved.request("DELETE", f"/e2b/sandboxes/{sb['sandboxID']}", headers=h)
    assert status == 204, body
    after = scrape(coved)
    delta = lambda name, **ls: value(after, name, **ls) - value(before, name, **ls)  # noqa
    assert delta("cove_sandbox_creates_total", api="e2b") == 1
    assert delta("cove_sandbox_creates_total", api="opensandbox") == 0
    assert delta("cove_sandbox_create_failures_total", api="e2b", reason="invalid") == 1
    assert delta("cove_sandbox_deletes_total", api="e2b") == 1
    assert delta("cove_sandbox_create_duration_seconds_count", api="e2b") == 1


def test_an_envd_process_start_is_an_exec(coved):
    """E2B's envd (Connect over the agent's port): process.Process/Start is a run too."""
    sid = coved.create()
    try:
        before = scrape(coved)
        payload = json.dumps({"process": {"cmd": "/bin/echo", "args": ["hi"]}}).encode()
        h = coved.headers()
        h.update({"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"})
        status, body, _ = coved.request(
            "POST", f"/sandboxes/{sid}/proxy/{AGENT_PORT}/process.Process/Start",
            raw=struct.pack(">BI", 0, len(payload)) + payload, headers=h)
        assert status == 200 and "end" in str(body), body
        # an ordinary agent request is not a run
        status, _, _ = coved.request("GET", f"/sandboxes/{sid}/proxy/{AGENT_PORT}/ping")
        after = scrape(coved)
    finally:
        coved.delete(sid)
    assert value(after, "cove_exec_duration_seconds_count") - \
        value(before, "cove_exec_duration_seconds_count") == 1
    assert total(after, "cove_gateway_requests_total") - \
        total(before, "cove_gateway_requests_total") == 2


def test_an_expiry_counts_once(coved):
    before = scrape(coved)
    sid = coved.create(timeout=60)
    soon = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() + 3)) + ".000Z"
    coved.ok("POST", f"/v1/sandboxes/{sid}/renew-expiration", {"expiresAt": soon})
    deadline = time.time() + 60
    while coved.request("GET", f"/v1/sandboxes/{sid}")[0] != 404:
        assert time.time() < deadline, "never expired"
        time.sleep(0.1)
    after = scrape(coved)
    assert value(after, "cove_sandbox_expiries_total") - \
        value(before, "cove_sandbox_expiries_total") == 1
    assert value(after, "cove_sandbox_deletes_total", api="opensandbox") == \
        value(before, "cove_sandbox_deletes_total", api="opensandbox")


def test_a_create_over_quota_counts_as_quota(coved):
    owner = hashlib.sha256(coved.key.encode()).hexdigest()
    admin = coved.headers(ADMIN)
    status, body, _ = coved.request("PUT", f"/v1/admin/quotas/{owner}", {"sandboxes": 0},
                                    headers=admin)
    assert status == 200, body
    try:
        before = scrape(coved)
        status, body, _ = coved.request("POST", "/v1/sandboxes", {
            "image": {"uri": "base"}, "entrypoint": ["sleep", "1"],
            "resourceLimits": {"cpu": "1", "memory": "256Mi"}})
        assert status == 429, body
        after = scrape(coved)
    finally:
        status, body, _ = coved.request("DELETE", f"/v1/admin/quotas/{owner}", headers=admin)
        assert status == 204, body
    assert value(after, "cove_sandbox_create_failures_total", api="opensandbox", reason="quota") - \
        value(before, "cove_sandbox_create_failures_total", api="opensandbox", reason="quota") == 1
    assert value(after, "cove_sandbox_creates_total", api="opensandbox") == \
        value(before, "cove_sandbox_creates_total", api="opensandbox")
