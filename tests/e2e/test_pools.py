"""Warm pools (issue 14): sandboxes made ahead, handed out by a create in O(1).

What a user notices: a pool's API (admin keys only) and its status; a create naming a pool
(extensions.poolRef), or of a pool's shape, is served from it and behaves exactly as a fresh
sandbox made for that create (its env, entrypoint, metadata, TTL; none of the pool's env); no
sandbox is handed out twice however many claim at once; the pool refills, keeps within its
capacitySpec, survives a restart of coved, and its idle sandboxes wait frozen and unseen."""
import concurrent.futures
import os
import signal
import sqlite3
import threading
import time

import pytest

from covetest import (AGENT_PORT, Coved, ExecResult, cgroup_file, parse_events,
                      sandbox_init_pid, sandbox_leftovers, serve)

ADMIN = "admin-key"
LIMITS = {"cpu": "500m", "memory": "256Mi"}


@pytest.fixture(scope="module")
def coved():
    with serve(admin_keys=(ADMIN,)) as d:
        yield d


def admin(d):
    return d.headers(ADMIN)


def pool_body(name, template="base", buffer_max=2, pool_max=10, **extra):
    body = {"name": name, "template": template, "resourceLimits": dict(LIMITS),
            "capacitySpec": {"bufferMin": extra.pop("buffer_min", buffer_max),
                             "bufferMax": buffer_max,
                             "poolMin": extra.pop("pool_min", 0), "poolMax": pool_max}}
    body.update(extra)
    return body


def make_pool(d, name, **kw):
    status, body, _ = d.request("POST", "/v1/pools", pool_body(name, **kw), headers=admin(d))
    assert status == 201, body
    return body


def get_pool(d, name):
    status, body, _ = d.request("GET", f"/v1/pools/{name}", headers=admin(d))
    assert status == 200, body
    return body


def delete_pool(d, name):
    status, body, _ = d.request("DELETE", f"/v1/pools/{name}", headers=admin(d))
    assert status == 204, body


def wait_status(d, name, timeout=180, **want):
    """Polls the pool until each status field has its wanted value (no timing asserted)."""
    deadline = time.time() + timeout
    while True:
        st = get_pool(d, name)["status"]
        if all(st[k] == v for k, v in want.items()):
            return st
        assert time.time() < deadline, f"pool {name} never reached {want}: {st}"
        time.sleep(0.1)


def idle_ids(d, pool):
    """The pool's idle sandboxes, as coved keeps them (no API shows them)."""
    con = sqlite3.connect(os.path.join(d.state_dir, "cove.db"))
    try:
        return sorted(r[0] for r in con.execute(
            "SELECT id FROM sandboxes WHERE pool = ? AND pool_idle = 1", (pool,)))
    finally:
        con.close()


def claim(d, pool, key=None, **body):
    body.setdefault("extensions", {})["poolRef"] = pool
    status, got, _ = d.request("POST", "/v1/sandboxes", body, headers=d.headers(key))
    assert status == 202, got
    return got


def frozen(sandbox_id):
    state = cgroup_file(sandbox_id, "freezer", "freezer.state")
    if state is not None:
        return state == "FROZEN"
    return cgroup_file(sandbox_id, "freezer", "cgroup.freeze") == "1"


def test_pool_api_is_for_admin_keys_and_checks_what_it_takes(coved):
    d = coved
    status, body, _ = d.request("GET", "/v1/pools")  # an ordinary key
    assert status == 403 and body["code"] == "AUTH::FORBIDDEN", body
    status, body, _ = d.request("POST", "/v1/pools", pool_body("nope"))
    assert status == 403, body
    bad = [
        ({"name": "x", "template": "base"}, "capacitySpec"),
        (pool_body("Bad_Name"), "name"),
        (pool_body("-x"), "name"),
        (pool_body("x", template="no-such-template"), "no-such-template"),
        (dict(pool_body("x"), resourceLimits={"cpu": "999"}), "cpu"),
        (dict(pool_body("x"), resourceLimits={"memory": 5}), "memory"),
        (dict(pool_body("x"), env={"BAD=NAME": "v"}), "env"),
        (dict(pool_body("x"), color="blue"), "color"),
        (dict(pool_body("x"), extensions={"poolRef": "y"}), "poolRef"),
        (dict(pool_body("x"), capacitySpec={"bufferMin": 3, "bufferMax": 2, "poolMax": 5}),
         "bufferMin"),
        (dict(pool_body("x"), capacitySpec={"bufferMax": 6, "poolMax": 5}), "bufferMax"),
        (dict(pool_body("x"), capacitySpec={"bufferMax": "2", "poolMax": 5}), "integer"),
        (dict(pool_body("x"), capacitySpec={"bufferMax": 1, "poolMax": 5000}), "poolMax"),
    ]
    for body_in, word in bad:
        status, body, _ = d.request("POST", "/v1/pools", body_in, headers=admin(d))
        assert status == 400, (body_in, body)
        assert set(body) >= {"code", "message"} and word in body["message"], (body_in, body)
    status, body, _ = d.request("POST", "/v1/pools", raw=b"{not json", headers=admin(d))
    assert status == 400, body
    status, body, _ = d.request("GET", "/v1/pools", headers=admin(d))
    assert status == 200 and body["items"] == [], body  # nothing of the above was made

    made = make_pool(d, "crud", buffer_max=1, pool_max=3, env={"POOLVAR": "p"})
    assert made["name"] == "crud" and made["template"] == "base"
    assert made["capacitySpec"] == {"bufferMin": 1, "bufferMax": 1, "poolMin": 0, "poolMax": 3}
    assert set(made["status"]) >= {"total", "allocated", "available"}
    status, body, _ = d.request("POST", "/v1/pools", pool_body("crud"), headers=admin(d))
    assert status == 409 and body["code"] == "POOL::ALREADY_EXISTS", body
    try:
        listed = d.ok("GET", "/v1/pools", headers=admin(d))["items"]
        assert [p["name"] for p in listed] == ["crud"]
        status, body, _ = d.request("PATCH", "/v1/pools/crud",
                                    {"capacitySpec": {"bufferMax": 2, "bufferMin": 2}},
                                    headers=admin(d))
        assert status == 200 and body["capacitySpec"]["bufferMax"] == 2, body
        assert body["env"] == {"POOLVAR": "p"}  # the rest stays
        status, body, _ = d.request("PATCH", "/v1/pools/crud", {"name": "other"},
                                    headers=admin(d))
        assert status == 400, body
        status, body, _ = d.request("PATCH", "/v1/pools/crud",
                                    {"capacitySpec": {"bufferMin": 9}}, headers=admin(d))
        assert status == 400, body
        assert get_pool(d, "crud")["capacitySpec"]["bufferMin"] == 2  # unchanged
        wait_status(d, "crud", available=2)
        status, body, _ = d.request("GET", "/v1/pools/nope", headers=admin(d))
        assert status == 404 and body["code"] == "POOL::NOT_FOUND", body
    finally:
        idle = idle_ids(d, "crud")
        delete_pool(d, "crud")
    status, body, _ = d.request("GET", "/v1/pools/crud", headers=admin(d))
    assert status == 404, body
    # Its idle sandboxes went with it, every trace of them.
    deadline = time.time() + 30
    while idle_ids(d, "crud") and time.time() < deadline:
        time.sleep(0.1)
    assert idle_ids(d, "crud") == []
    for sid in idle:
        assert sandbox_leftovers(d, sid) == [], sid


def test_claim_is_a_fresh_sandbox_of_the_create(coved):
    d = coved
    make_pool(d, "fresh", buffer_max=2, env={"POOLVAR": "from-pool"})
    try:
        wait_status(d, "fresh", available=2, pending=0)
        idle = idle_ids(d, "fresh")
        assert len(idle) == 2
        # Waiting, they are frozen and no client sees them, not even an admin.
        assert all(frozen(sid) for sid in idle), idle
        for key in (None, ADMIN):
            listed = d.ok("GET", "/v1/sandboxes?pageSize=200", headers=d.headers(key))["items"]
            assert not set(idle) & {s["id"] for s in listed}
            status, body, _ = d.request("GET", f"/v1/sandboxes/{idle[0]}", headers=d.headers(key))
            assert status == 404, body
        status, _, _ = d.request("DELETE", f"/v1/sandboxes/{idle[0]}")
        assert status == 404

        before = time.time()
        got = claim(d, "fresh", env={"FOO": "bar baz"}, metadata={"team": "ml"}, timeout=600,
                    entrypoint=["sh", "-c", "echo \"$FOO\" > /tmp/entry; exec sleep infinity"])
        sid = got["id"]
        assert sid in idle  # it came from the pool
        assert got["status"]["state"] == "Running", got
        assert got["metadata"] == {"team": "ml"}
        assert got["entrypoint"][0] == "sh"
        created = got["createdAt"]
        info = d.get(sid)
        assert info["metadata"] == {"team": "ml"}
        # Its life starts at the claim, not when the pool made it.
        expires = time.mktime(time.strptime(info["expiresAt"][:19], "%Y-%m-%dT%H:%M:%S"))
        made = time.mktime(time.strptime(created[:19], "%Y-%m-%dT%H:%M:%S"))
        assert expires - made == pytest.approx(600, abs=2), info
        assert made >= time.mktime(time.gmtime(before)) - 1
        # The create's env reaches commands; the pool's env is gone.
        assert d.sh(sid, 'echo "[$FOO][${POOLVAR-unset}][$HOSTNAME]"').strip() == \
            f"[bar baz][unset][{sid}]"
        assert d.sh(sid, "cat /tmp/entry").strip() == "bar baz"  # the entrypoint ran, with it
        assert d.sh(sid, "env | grep -c POOLVAR || true").strip() == "0"
        # A bash session and a background command see the same.
        sess = d.ok("POST", f"/sandboxes/{sid}/proxy/{AGENT_PORT}/session", {})["session_id"]
        status, raw, _ = d.request("POST", f"/sandboxes/{sid}/proxy/{AGENT_PORT}/session/{sess}/run",
                                   {"command": "echo $FOO-${POOLVAR-none}"})
        assert status == 200, raw
        assert "bar baz-none" in ExecResult(parse_events(raw)).stdout, raw
        assert not frozen(sid)
        st = wait_status(d, "fresh", allocated=1, available=2)  # refilled
        assert st["total"] == 3
        assert sid not in idle_ids(d, "fresh")
        # It is the creator's: another key cannot see it.
        d.delete(sid)
        wait_status(d, "fresh", allocated=0)
    finally:
        delete_pool(d, "fresh")


def test_a_create_of_the_pools_shape_is_served_from_it_without_poolref(coved):
    d = coved
    make_pool(d, "shape", buffer_max=1)
    try:
        wait_status(d, "shape", available=1, pending=0)
        idle = idle_ids(d, "shape")
        sid = d.create(limits=dict(LIMITS), env={"WHO": "implicit"})
        assert sid in idle
        assert d.sh(sid, "echo $WHO").strip() == "implicit"
        # Other resources: made cold, the pool untouched.
        wait_status(d, "shape", available=1, pending=0)
        other = d.create(limits={"cpu": "250m", "memory": "256Mi"})
        assert other not in idle_ids(d, "shape")
        assert get_pool(d, "shape")["status"]["allocated"] == 1
        for s in (sid, other):
            d.delete(s)
    finally:
        delete_pool(d, "shape")


def test_bad_creates_naming_a_pool_change_nothing(coved):
    d = coved
    make_pool(d, "strict", buffer_max=1)
    try:
        wait_status(d, "strict", available=1, pending=0)
        idle = idle_ids(d, "strict")
        cases = [
            ({"extensions": {"poolRef": "missing"}}, 404, "POOL::NOT_FOUND"),
            ({"extensions": {"poolRef": 7}}, 400, None),
            ({"extensions": {"poolRef": "strict"}, "resourceLimits": {"cpu": "1"}}, 400,
             "POOL::MISMATCH"),
            ({"extensions": {"poolRef": "strict"}, "image": {"uri": "code-interpreter"}}, 400,
             "POOL::MISMATCH"),
            ({"extensions": {"poolRef": "strict"},
              "volumes": [{"name": "v", "emptyDir": {}, "mountPath": "/v"}]}, 400, None),
            ({"extensions": {"poolRef": "strict"}, "env": {"BAD=NAME": "x"}}, 400, None),
            ({"extensions": {"poolRef": "strict"}, "timeout": 5}, 400, None),
        ]
        for body, status_want, code in cases:
            status, got, _ = d.request("POST", "/v1/sandboxes", body)
            assert status == status_want, (body, got)
            assert "message" in got and (code is None or got["code"] == code), (body, got)
        assert idle_ids(d, "strict") == idle
        st = get_pool(d, "strict")["status"]
        assert st["available"] == 1 and st["allocated"] == 0, st
        assert d.ok("GET", "/v1/sandboxes")["items"] == []
    finally:
        delete_pool(d, "strict")


def test_no_sandbox_is_handed_out_twice_to_50_claimers(coved):
    d = coved
    make_pool(d, "race", buffer_max=10, pool_max=60)
    try:
        wait_status(d, "race", available=10, pending=0)
        idle = set(idle_ids(d, "race"))

        def one(i):
            got = claim(d, "race", env={"ME": str(i)})
            return i, got["id"]

        with concurrent.futures.ThreadPoolExecutor(50) as ex:
            results = list(ex.map(one, range(50)))
        ids = [sid for _, sid in results]
        assert len(set(ids)) == 50, "a sandbox was handed out twice"
        from_pool = [sid for sid in ids if sid in idle]
        assert len(from_pool) >= 1  # the pool served what it had; the rest were made
        # Each is its own claimer's: its env says who.
        for i, sid in results:
            assert d.sh(sid, "echo $ME").strip() == str(i), sid
        # Fills that became ready during the race were claimed too: every sandbox the pool
        # handed out is one of these, each once.
        con = sqlite3.connect(os.path.join(d.state_dir, "cove.db"))
        try:
            pooled = {r[0] for r in con.execute(
                "SELECT id FROM sandboxes WHERE pool = 'race' AND pool_idle = 0")}
        finally:
            con.close()
        assert set(from_pool) <= pooled <= set(ids)
        assert get_pool(d, "race")["status"]["allocated"] == len(pooled)
        for sid in ids:
            d.delete(sid)
    finally:
        delete_pool(d, "race")


def test_capacity_bounds_the_pool(coved):
    d = coved
    make_pool(d, "bounded", buffer_max=2, pool_max=2)
    try:
        wait_status(d, "bounded", available=2, pending=0)
        a = claim(d, "bounded")["id"]
        b = claim(d, "bounded")["id"]
        # poolMax reached by claimed sandboxes: nothing more is made.
        time.sleep(1.5)
        st = get_pool(d, "bounded")["status"]
        assert (st["available"], st["pending"], st["allocated"]) == (0, 0, 2), st
        c = claim(d, "bounded")["id"]  # still served: made cold, outside the pool
        assert get_pool(d, "bounded")["status"]["allocated"] == 2
        d.delete(a)
        wait_status(d, "bounded", allocated=1, available=1, pending=0)
        for s in (b, c):
            d.delete(s)
        wait_status(d, "bounded", allocated=0, available=2, pending=0)
        # A smaller buffer trims what waits.
        status, body, _ = d.request("PATCH", "/v1/pools/bounded",
                                    {"capacitySpec": {"bufferMin": 1, "bufferMax": 1}},
                                    headers=admin(d))
        assert status == 200, body
        wait_status(d, "bounded", available=1, pending=0)
        deadline = time.time() + 30
        while len(idle_ids(d, "bounded")) != 1 and time.time() < deadline:
            time.sleep(0.1)
        assert len(idle_ids(d, "bounded")) == 1
    finally:
        delete_pool(d, "bounded")


def test_deleting_a_pool_leaves_its_claimed_sandboxes_alone(coved):
    d = coved
    make_pool(d, "gone", buffer_max=2)
    wait_status(d, "gone", available=2, pending=0)
    sid = claim(d, "gone", env={"K": "v"})["id"]
    idle = idle_ids(d, "gone")
    delete_pool(d, "gone")
    assert d.sh(sid, "echo $K").strip() == "v"
    status, body, _ = d.request("POST", "/v1/sandboxes", {"extensions": {"poolRef": "gone"}})
    assert status == 404 and body["code"] == "POOL::NOT_FOUND", body
    deadline = time.time() + 30
    while any(sandbox_leftovers(d, s) for s in idle) and time.time() < deadline:
        time.sleep(0.2)
    for s in idle:
        assert sandbox_leftovers(d, s) == [], s
    assert d.get(sid)["status"]["state"] == "Running"
    d.delete(sid)


@pytest.mark.not_under("gvisor", reason="gVisor passes the agent no cove-kernel descriptor: code contexts are a 400 there (test_runtimes.py::test_code_contexts)")
def test_code_interpreter_pool_has_its_kernel_started():
    with serve(admin_keys=(ADMIN,)) as d:
        make_pool(d, "py", template="code-interpreter", buffer_max=1,
                  env={"POOLVAR": "pool"})
        wait_status(d, "py", available=1, pending=0, timeout=240)
        claimed_at = time.time()
        sid = claim(d, "py", env={"FOO": "bar"})["id"]
        # The kernel was started by the pool, before the claim: its process is older.
        code = ("import os\n"
                "ticks = os.sysconf('SC_CLK_TCK')\n"
                "start = int(open('/proc/self/stat').read().rsplit(')', 1)[1].split()[19])\n"
                "up = float(open('/proc/uptime').read().split()[0])\n"
                "print(os.environ.get('FOO'), os.environ.get('POOLVAR'), up - start / ticks)")
        status, raw, _ = d.request("POST", f"/sandboxes/{sid}/proxy/{AGENT_PORT}/code",
                                   {"code": code, "context": {"language": "python"}}, timeout=120)
        assert status == 200, raw
        events = parse_events(raw)
        out = "".join(e["text"] for e in events if e["type"] == "stdout")
        assert len(out.split()) == 3, events
        foo, poolvar, age = out.split()
        assert (foo, poolvar) == ("bar", "None"), out
        assert float(age) > time.time() - claimed_at, (age, "the kernel started at the claim")
        counts = [e["execution_count"] for e in events if e["type"] == "execution_count"]
        assert counts == [1], events  # the env update left no trace in the history
        d.delete(sid)
        delete_pool(d, "py")


def test_pools_and_their_idle_sandboxes_survive_a_restart():
    d = Coved(admin_keys=(ADMIN,))
    try:
        d.start()
        make_pool(d, "lasting", buffer_max=2, env={"P": "1"})
        wait_status(d, "lasting", available=2, pending=0)
        idle = idle_ids(d, "lasting")
        spec = get_pool(d, "lasting")
        d.kill()
        d.start()
        again = get_pool(d, "lasting")
        for k in ("name", "template", "resourceLimits", "env", "capacitySpec", "createdAt"):
            assert again[k] == spec[k], k
        wait_status(d, "lasting", available=2, pending=0)
        assert idle_ids(d, "lasting") == idle  # taken back, not made anew
        assert all(frozen(s) for s in idle)
        sid = claim(d, "lasting", env={"AFTER": "restart"})["id"]
        assert sid in idle
        assert d.sh(sid, "echo $AFTER-${P-none}").strip() == "restart-none"
        d.delete(sid)
        delete_pool(d, "lasting")
    finally:
        d.cleanup()


def test_a_pool_made_again_under_its_name_gets_nothing_of_the_old_one(coved):
    d = coved
    make_pool(d, "again", buffer_max=1, resourceLimits={"cpu": "500m", "memory": "256Mi"})
    delete_pool(d, "again")  # at once: its fill is under way
    make_pool(d, "again", buffer_max=1, resourceLimits={"cpu": "250m", "memory": "128Mi"})
    try:
        st = wait_status(d, "again", available=1, pending=0)
        assert st["total"] == 1, st
        deadline = time.time() + 30
        while len(idle_ids(d, "again")) != 1 and time.time() < deadline:
            time.sleep(0.1)
        (idle,) = idle_ids(d, "again")
        assert memory_limit(idle) == 128 << 20  # the new pool's, not the old one's 256Mi
        sid = claim(d, "again")["id"]
        assert sid == idle
        assert memory_limit(sid) == 128 << 20
        d.delete(sid)
    finally:
        delete_pool(d, "again")


def memory_limit(sandbox_id):
    """The sandbox's memory limit as the host's cgroup has it (v1 or v2), in bytes."""
    value = cgroup_file(sandbox_id, "memory", "memory.limit_in_bytes") or \
        cgroup_file(sandbox_id, "memory", "memory.max")
    return int(value) if value and value.isdigit() else value


def agent_pid(sandbox_id):
    pid = sandbox_init_pid(sandbox_id)
    assert pid, sandbox_id
    return pid


def test_a_claim_its_agent_does_not_take_is_made_cold(coved):
    d = coved
    make_pool(d, "wedged", buffer_max=1, pool_max=1)
    try:
        wait_status(d, "wedged", available=1, pending=0)
        (idle,) = idle_ids(d, "wedged")
        os.kill(agent_pid(idle), signal.SIGSTOP)  # takes effect once it is thawed
        got = claim(d, "wedged", env={"WHO": "cold"})
        sid = got["id"]
        assert sid != idle, "the wedged sandbox was handed out"
        assert d.sh(sid, "echo $WHO").strip() == "cold"
        deadline = time.time() + 30
        while sandbox_leftovers(d, idle) and time.time() < deadline:
            time.sleep(0.2)
        assert sandbox_leftovers(d, idle) == []
        d.delete(sid)
    finally:
        delete_pool(d, "wedged")


def test_a_claim_cut_short_by_a_crash_is_not_handed_out_again():
    d = Coved(admin_keys=(ADMIN,))
    try:
        d.start()
        make_pool(d, "crash", buffer_max=1, pool_max=1)
        wait_status(d, "crash", available=1, pending=0)
        (idle,) = idle_ids(d, "crash")
        pid = agent_pid(idle)
        os.kill(pid, signal.SIGSTOP)
        result = {}

        def create():
            result["r"] = d.request("POST", "/v1/sandboxes",
                                    {"extensions": {"poolRef": "crash"},
                                     "env": {"FIRST_TENANT": "secret"}}, timeout=30)

        t = threading.Thread(target=create)
        t.start()
        deadline = time.time() + 10
        while idle_ids(d, "crash") and time.time() < deadline:  # the claim is in the store
            time.sleep(0.02)
        assert idle_ids(d, "crash") == []
        d.proc.kill()  # SIGKILL mid-claim
        d.proc.wait(10)
        t.join(30)
        os.kill(pid, signal.SIGCONT)
        d.start()
        # The half-claimed sandbox is gone; the pool makes a new one, nobody's.
        deadline = time.time() + 30
        while sandbox_leftovers(d, idle) and time.time() < deadline:
            time.sleep(0.2)
        assert sandbox_leftovers(d, idle) == []
        wait_status(d, "crash", available=1, pending=0)
        assert idle not in idle_ids(d, "crash")
        sid = claim(d, "crash", env={"SECOND": "tenant"})["id"]
        assert d.sh(sid, "echo ${FIRST_TENANT-none}").strip() == "none"
        d.delete(sid)
        delete_pool(d, "crash")
    finally:
        d.cleanup()
