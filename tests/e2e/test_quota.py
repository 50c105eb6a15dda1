"""Admission control: per-key quotas (a default from the config, overrides by admin keys over
/v1/admin/quotas, kept in the store) and the host's overcommit limit. A create beyond either is
refused with a body and leaves nothing; bursts of concurrent creates are counted one by one."""

import concurrent.futures
import hashlib
import os
import signal
import sqlite3
import subprocess
import threading
import time

import pytest

from covetest import COVED, Coved, cgroup_dirs, descendants, sandbox_leftovers

ADMIN = "quota-admin-key"
TENANT_A, TENANT_B = "tenant-a-key", "tenant-b-key"
GI, MI = 1 << 30, 1 << 20
MEMORY_OVERCOMMIT = 1.5  # coved's default


def owner(key):
    return hashlib.sha256(key.encode()).hexdigest()


def mem_total():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal")


@pytest.fixture(scope="module")
def coved():
    d = Coved(api_keys=(TENANT_A, TENANT_B), extra_args=["--admin-api-key", ADMIN]).start()
    try:
        yield d
    finally:
        d.cleanup()


def call(d, method, path, key, body=None, raw=None):
    h = {"Content-Type": "application/json", "OPEN-SANDBOX-API-KEY": key}
    return d.request(method, path, body, headers=h, raw=raw, timeout=120)


def create(d, key, limits):
    return call(d, "POST", "/v1/sandboxes", key, {
        "image": {"uri": "base"}, "entrypoint": ["sleep", "infinity"], "resourceLimits": limits})


def admin(d, method, path, body=None, raw=None):
    return call(d, method, f"/v1/admin/quotas{path}", ADMIN, body, raw)


def set_quota(d, key, **limits):
    status, body, _ = admin(d, "PUT", f"/{owner(key)}", limits)
    assert status == 200, body
    return body


def clear_quota(d, key):
    admin(d, "DELETE", f"/{owner(key)}")


def ids_of(d, key):
    return [s["id"] for s in call(d, "GET", "/v1/sandboxes?pageSize=1000", key)[1]["items"]]


def run_dirs(d):
    run = os.path.join(d.state_dir, "run")
    return set(os.listdir(run)) if os.path.isdir(run) else set()


def sandbox_of_process(pid):
    """The cove sandbox id whose cgroup holds pid, or None."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            text = f.read()
    except OSError:
        return None
    for line in text.splitlines():
        parts = line.split("/cove/")
        if len(parts) > 1:
            found = parts[1].split("/")[0]
            if found == "shims":
                # An OCI sandbox's cove-shim (Cove's own cgroup): it counts as the sandbox of
                # the PID 1 it holds, if any.
                try:
                    kids = open(f"/proc/{pid}/task/{pid}/children").read().split()
                except OSError:
                    return None  # gone meanwhile
                held = {sandbox_of_process(int(k)) for k in kids} - {None}
                return held.pop() if len(held) == 1 else f"shim {pid} of {sorted(held)}"
            return found
    return None


def assert_only_these_exist(d, ids):
    """A refused create leaves nothing: no listed sandbox, store row, run dir or process
    beyond those admitted."""
    ids = set(ids)
    listed = {sid for key in d.api_keys + [ADMIN] for sid in ids_of(d, key)}
    assert listed == ids
    assert set(d.known_sandboxes()) == ids
    assert run_dirs(d) == ids
    strays = {p: sandbox_of_process(p) for p in descendants(d.proc.pid)}
    assert {s for s in strays.values() if s is not None} <= ids, strays


def refused(result, status, code, *fragments):
    got, body, _ = result
    assert got == status, body
    assert set(body) == {"code", "message"} and body["code"] == code, body
    for f in fragments:
        assert f in body["message"], (f, body["message"])


def delete_all(d, key, ids):
    for sid in ids:
        assert call(d, "DELETE", f"/v1/sandboxes/{sid}", key)[0] == 204
    for sid in ids:
        assert sandbox_leftovers(d, sid) == [] and cgroup_dirs(sid) == []


def test_a_burst_of_40_8gib_creates_stops_at_the_host_limit(coved):
    d = coved
    assert d.known_sandboxes() == []
    budget = mem_total() * MEMORY_OVERCOMMIT
    with concurrent.futures.ThreadPoolExecutor(40) as ex:
        results = list(ex.map(lambda _: create(d, TENANT_A, {"cpu": "250m", "memory": "8Gi"}),
                              range(40)))
    made = [body["id"] for status, body, _ in results if status == 202]
    try:
        refusals = [r for r in results if r[0] != 202]
        print(f"{len(made)} of 40 admitted, {len(refusals)} refused; budget {budget / GI:.1f} GiB")
        # Every create was counted while the others were still Pending: what was promised
        # stays within the budget, and the budget is used (not everything refused).
        assert len(made) * 8 * GI <= budget < (len(made) + 1) * 8 * GI
        for r in refusals:
            refused(r, 409, "HOST::OVERCOMMITTED", "memory", "8Gi more", "memory_overcommit 1.5")
        assert_only_these_exist(d, made)
        for sid in made:
            assert d.get(sid)["status"]["state"] == "Running"
        # The host's usage shows the same sums.
        host = admin(d, "GET", "")[1]["host"]
        assert host["sandboxes"] == len(made) and host["memory"]["used"] == f"{len(made) * 8}Gi"
    finally:
        delete_all(d, TENANT_A, made)
    # Deleting gave the budget back; coved and another sandbox are fine.
    assert d.health()["status"] == "healthy"
    status, body, _ = create(d, TENANT_B, {"cpu": "250m", "memory": "8Gi"})
    assert status == 202, body
    assert d.sh(body["id"], "echo fine", key=TENANT_B) == "fine\n"
    delete_all(d, TENANT_B, [body["id"]])


CASES = {
    # quota, admitted creates' limits, the refused one's, what its message says
    "sandboxes": ({"sandboxes": 2}, [{"cpu": "250m", "memory": "64Mi"}] * 2,
                  {"cpu": "250m", "memory": "64Mi"}, ["sandboxes limit is 2", "2 live"]),
    "cpu": ({"cpu": "1500m"}, [{"cpu": "1", "memory": "64Mi"}, {"cpu": "500m", "memory": "64Mi"}],
            {"cpu": "100m", "memory": "64Mi"},
            ["cpu limit is 1500m", "use 1500m", "asks for 100m more"]),
    "memory": ({"memory": "1Gi"}, [{"cpu": "250m", "memory": "512Mi"}] * 2,
               {"cpu": "250m", "memory": "256Mi"},
               ["memory limit is 1Gi", "use 1Gi", "asks for 256Mi more"]),
    "disk": ({"disk": "1Gi"},
             [{"cpu": "250m", "memory": "1Gi", "ephemeral-storage": "512Mi"}] * 2,
             {"cpu": "250m", "memory": "256Mi", "ephemeral-storage": "16Mi"},
             ["disk limit is 1Gi", "use 1Gi", "asks for 16Mi more"]),
}


@pytest.mark.parametrize("resource", list(CASES))
def test_each_quota_of_a_key_refuses_with_429(coved, resource):
    d = coved
    quota, admitted, over, fragments = CASES[resource]
    set_quota(d, TENANT_A, **quota)
    made, other = [], []
    try:
        for limits in admitted:
            status, body, _ = create(d, TENANT_A, limits)
            assert status == 202, body
            made.append(body["id"])
        r = create(d, TENANT_A, over)
        refused(r, 429, "QUOTA::EXCEEDED", resource, *fragments)
        assert_only_these_exist(d, made)
        mine = call(d, "GET", "/v1/quota", TENANT_A)[1]
        assert mine["owner"] == owner(TENANT_A) and mine["admin"] is False
        assert mine["limits"][resource] == list(quota.values())[0]
        assert mine["used"]["sandboxes"] == len(made)
        # Another key's quota is its own: the same create is admitted for it.
        status, body, _ = create(d, TENANT_B, over)
        assert status == 202, body
        other.append(body["id"])
    finally:
        clear_quota(d, TENANT_A)
        delete_all(d, TENANT_A, made)
        delete_all(d, TENANT_B, other)


def test_a_sandbox_without_cpu_limit_counts_as_every_cpu(coved):
    d = coved
    cpus = os.cpu_count()
    set_quota(d, TENANT_A, cpu=f"{cpus * 1000 - 1}m")
    try:
        refused(create(d, TENANT_A, {"memory": "64Mi"}), 429, "QUOTA::EXCEEDED",
                f"asks for {cpus} more")
        assert_only_these_exist(d, [])
    finally:
        clear_quota(d, TENANT_A)


def test_a_burst_of_creates_of_one_key_stops_at_its_quota(coved):
    d = coved
    set_quota(d, TENANT_A, sandboxes=3)
    made = []
    try:
        with concurrent.futures.ThreadPoolExecutor(10) as ex:
            results = list(ex.map(
                lambda _: create(d, TENANT_A, {"cpu": "250m", "memory": "64Mi"}), range(10)))
        made = [body["id"] for status, body, _ in results if status == 202]
        assert len(made) == 3, [r[:2] for r in results]
        for r in results:
            if r[0] != 202:
                refused(r, 429, "QUOTA::EXCEEDED", "sandboxes limit is 3")
        assert_only_these_exist(d, made)
    finally:
        clear_quota(d, TENANT_A)
        delete_all(d, TENANT_A, made)


def test_deleting_sandboxes_frees_quota(coved):
    d = coved
    set_quota(d, TENANT_A, sandboxes=1, memory="128Mi")
    made = []
    try:
        status, body, _ = create(d, TENANT_A, {"cpu": "250m", "memory": "128Mi"})
        assert status == 202, body
        made.append(body["id"])
        refused(create(d, TENANT_A, {"cpu": "250m", "memory": "64Mi"}), 429, "QUOTA::EXCEEDED")
        delete_all(d, TENANT_A, [made.pop()])
        assert call(d, "GET", "/v1/quota", TENANT_A)[1]["used"] == {
            "sandboxes": 0, "cpu": "0", "memory": "0", "disk": "0"}
        status, body, _ = create(d, TENANT_A, {"cpu": "250m", "memory": "128Mi"})
        assert status == 202, body
        made.append(body["id"])
    finally:
        clear_quota(d, TENANT_A)
        delete_all(d, TENANT_A, made)


def test_admin_api_sets_gets_lists_and_deletes_overrides(coved):
    d = coved
    path = f"/{owner(TENANT_B)}"
    assert admin(d, "GET", path)[1] == {
        "owner": owner(TENANT_B), "override": None,
        "limits": {"sandboxes": None, "cpu": None, "memory": None, "disk": None},
        "used": {"sandboxes": 0, "cpu": "0", "memory": "0", "disk": "0"}}
    body = set_quota(d, TENANT_B, sandboxes=5, cpu="2500m", memory="3Gi", disk=None)
    assert body["override"] == {"sandboxes": 5, "cpu": "2500m", "memory": "3Gi", "disk": None}
    assert body["limits"] == body["override"]
    assert admin(d, "GET", path)[1] == body
    # A PUT replaces the override: left-out fields go back to the default.
    body = set_quota(d, TENANT_B, memory="0.5Gi")
    assert body["override"] == {"memory": "512Mi"}
    assert body["limits"] == {"sandboxes": None, "cpu": None, "memory": "512Mi", "disk": None}
    listing = admin(d, "GET", "")[1]
    assert listing["defaults"] == {"sandboxes": None, "cpu": None, "memory": None, "disk": None}
    assert [i for i in listing["items"] if i["owner"] == owner(TENANT_B)] == [body]
    assert listing["host"]["memory"]["overcommit"] == MEMORY_OVERCOMMIT
    assert admin(d, "DELETE", path)[0] == 204
    refused(admin(d, "DELETE", path), 404, "QUOTA::NOT_FOUND")
    assert admin(d, "GET", path)[1]["override"] is None
    assert not [i for i in admin(d, "GET", "")[1]["items"] if i["owner"] == owner(TENANT_B)]
    # Owners unknown to coved may be given a quota (a key added later).
    unknown = "ab" * 32
    assert admin(d, "PUT", f"/{unknown}", {"sandboxes": 0})[0] == 200
    assert admin(d, "DELETE", f"/{unknown}")[0] == 204
    refused(admin(d, "POST", path, {}), 405, "HTTP::METHOD_NOT_ALLOWED")
    refused(admin(d, "PUT", "", {}), 405, "HTTP::METHOD_NOT_ALLOWED")


def test_an_admin_key_is_an_ordinary_key_too(coved):
    d = coved
    me = call(d, "GET", "/v1/quota", ADMIN)[1]
    assert me["owner"] == owner(ADMIN) and me["admin"] is True
    status, body, _ = create(d, ADMIN, {"cpu": "250m", "memory": "64Mi"})
    assert status == 202, body
    try:
        assert ids_of(d, ADMIN) == [body["id"]]
        assert ids_of(d, TENANT_A) == []  # ordinary keys still see only their own
        assert call(d, "GET", f"/v1/sandboxes/{body['id']}", TENANT_A)[0] == 404
        assert ids_of(d, ADMIN) == [body["id"]]  # and the admin key only its own
    finally:
        delete_all(d, ADMIN, [body["id"]])


def test_ordinary_keys_get_403_on_admin_routes(coved):
    d = coved
    for method, path, body in (("GET", "", None), ("GET", f"/{owner(TENANT_A)}", None),
                               ("PUT", f"/{owner(TENANT_A)}", {"sandboxes": 1000}),
                               ("DELETE", f"/{owner(TENANT_B)}", None)):
        r = call(d, method, f"/v1/admin/quotas{path}", TENANT_A, body)
        refused(r, 403, "AUTH::FORBIDDEN", "admin key")
    refused(call(d, "GET", "/v1/admin/quotas", "no-such-key"), 401, "AUTH::INVALID_API_KEY")
    assert call(d, "GET", "/v1/quota", TENANT_A)[1]["override"] is None  # nothing was set


BAD_BODIES = [
    ({"sandboxes": "3"}, "sandboxes"), ({"sandboxes": -1}, "sandboxes"),
    ({"sandboxes": 2.5}, "sandboxes"), ({"sandboxes": 10 ** 7}, "sandboxes"),
    ({"cpu": 2}, "cpu"), ({"cpu": "-1"}, "cpu"), ({"cpu": "lots"}, "cpu"),
    ({"memory": "-4Gi"}, "memory"), ({"memory": 4096}, "memory"), ({"disk": ["1Gi"]}, "disk"),
    ({"pids": "10"}, "unknown field"),
]


@pytest.mark.parametrize("body,fragment", BAD_BODIES, ids=[str(b) for b, _ in BAD_BODIES])
def test_bad_override_bodies_are_400(coved, body, fragment):
    refused(admin(coved, "PUT", f"/{owner(TENANT_A)}", body), 400, "QUOTA::INVALID_PARAMETER",
            fragment)
    assert admin(coved, "GET", f"/{owner(TENANT_A)}")[1]["override"] is None


def test_malformed_bodies_and_owner_ids_are_400(coved):
    d = coved
    path = f"/{owner(TENANT_A)}"
    refused(admin(d, "PUT", path, raw="{not json"), 400, "SANDBOX::INVALID_JSON")
    refused(admin(d, "PUT", path, raw="[1, 2]"), 400, "SANDBOX::INVALID_JSON")
    for bad in (owner(TENANT_A).upper(), owner(TENANT_A)[:63], owner(TENANT_A) + "0",
                "z" * 64, TENANT_A):
        for method in ("GET", "PUT", "DELETE"):
            refused(admin(d, method, f"/{bad}", {"sandboxes": 1}), 400, "QUOTA::INVALID_OWNER",
                    "SHA-256")
    assert admin(d, "GET", path)[1]["override"] is None


def test_overrides_persist_across_a_restart(fresh_coved):
    d = fresh_coved
    d.api_keys, d.key = [TENANT_A], TENANT_A
    d.extra_args = ["--admin-api-key", ADMIN]
    d.start()
    set_quota(d, TENANT_A, sandboxes=1, memory="256Mi")
    set_quota(d, TENANT_B, cpu="1")
    assert admin(d, "DELETE", f"/{owner(TENANT_B)}")[0] == 204
    status, body, _ = create(d, TENANT_A, {"cpu": "250m", "memory": "128Mi"})
    assert status == 202, body
    kept = body["id"]
    d.kill(signal.SIGTERM)
    d.start()
    got = admin(d, "GET", f"/{owner(TENANT_A)}")[1]
    assert got["override"] == {"sandboxes": 1, "memory": "256Mi"}
    assert got["used"]["sandboxes"] == 1 and got["used"]["memory"] == "128Mi"  # re-adopted
    assert admin(d, "GET", f"/{owner(TENANT_B)}")[1]["override"] is None
    refused(create(d, TENANT_A, {"cpu": "250m", "memory": "64Mi"}), 429, "QUOTA::EXCEEDED",
            "sandboxes limit is 1")
    delete_all(d, TENANT_A, [kept])
    assert_only_these_exist(d, [])


def test_a_database_from_before_quotas_opens(fresh_coved):
    d = fresh_coved.start()
    sid = d.create()
    d.kill(signal.SIGTERM)
    con = sqlite3.connect(os.path.join(d.state_dir, "cove.db"))
    con.execute("DROP TABLE quotas")
    con.execute("PRAGMA user_version = 0")  # as every Cove before schema versions left it
    con.commit()
    con.close()
    d.start()
    assert d.sh(sid, "echo still here") == "still here\n"
    assert d.ok("GET", "/v1/quota")["used"]["sandboxes"] == 1
    d.delete(sid)


def quota_of(d):
    return d.ok("GET", "/v1/quota")["limits"]


def test_default_quota_from_file_environment_and_flags(tmp_path):
    ini = tmp_path / "coved.ini"
    ini.write_text("[server]\nquota_sandboxes = 5\nquota_memory = 8Gi\nquota_disk = unlimited\n"
                   "admin_api_keys = admin-from-file\n")
    env = dict(os.environ, COVE_CONFIG=str(ini))
    env.pop("COVE_QUOTA_SANDBOXES", None)
    cases = [
        ({}, [], {"sandboxes": 5, "cpu": None, "memory": "8Gi", "disk": None}),
        ({"COVE_QUOTA_SANDBOXES": "4", "COVE_QUOTA_CPU": "2"}, [],
         {"sandboxes": 4, "cpu": "2", "memory": "8Gi", "disk": None}),
        ({"COVE_QUOTA_SANDBOXES": "4"}, ["--quota-sandboxes", "3", "--quota-disk", "1Gi"],
         {"sandboxes": 3, "cpu": None, "memory": "8Gi", "disk": "1Gi"}),
    ]
    for extra_env, flags, want in cases:
        d = Coved(env=dict(env, **extra_env), extra_args=flags)
        try:
            d.start()
            assert quota_of(d) == want
            assert call(d, "GET", "/v1/quota", "admin-from-file")[1]["admin"] is True
        finally:
            d.cleanup()
    d = Coved(env=dict(env, COVE_ADMIN_API_KEYS="admin-from-env"),
              extra_args=["--admin-api-key", "admin-from-flag"])
    try:
        d.start()
        assert call(d, "GET", "/v1/quota", "admin-from-flag")[1]["admin"] is True
        assert call(d, "GET", "/v1/quota", "admin-from-env")[0] == 401
        assert call(d, "GET", "/v1/quota", "admin-from-file")[0] == 401
    finally:
        d.cleanup()


def test_the_default_quota_applies_to_every_key(tmp_path):
    d = Coved(api_keys=(TENANT_A, TENANT_B), extra_args=["--quota-sandboxes", "1"])
    made = []
    try:
        d.start()
        for key in (TENANT_A, TENANT_B):
            status, body, _ = create(d, key, {"cpu": "250m", "memory": "64Mi"})
            assert status == 202, body
            made.append((key, body["id"]))
            refused(create(d, key, {"cpu": "250m", "memory": "64Mi"}), 429, "QUOTA::EXCEEDED",
                    "sandboxes limit is 1")
    finally:
        for key, sid in made:
            call(d, "DELETE", f"/v1/sandboxes/{sid}", key)
        d.cleanup()


def test_a_host_limit_below_one_sandbox_refuses_everything(tmp_path):
    d = Coved(extra_args=["--cpu-overcommit", "0.1"])
    try:
        d.start()
        # 0.1 x the CPUs: less than one CPU on a host of fewer than 10.
        cpus = os.cpu_count()
        if cpus >= 10:
            pytest.skip("needs fewer than 10 CPUs")
        status, body, _ = d.request("POST", "/v1/sandboxes", {
            "image": {"uri": "base"}, "entrypoint": ["true"],
            "resourceLimits": {"cpu": "1", "memory": "64Mi"}})
        refused((status, body, None), 409, "HOST::OVERCOMMITTED", "cpu_overcommit 0.1")
        assert run_dirs(d) == set() and d.known_sandboxes() == []
    finally:
        d.cleanup()


@pytest.mark.parametrize("args", [
    ["--memory-overcommit", "0"], ["--memory-overcommit", "1.5x"], ["--cpu-overcommit", "-1"],
    ["--quota-cpu", "-1"], ["--quota-memory", "lots"], ["--quota-sandboxes", "2.5"],
    ["--quota-disk", ""],
])
def test_bad_admission_settings_refuse_to_start(tmp_path, args):
    r = subprocess.run([COVED, "--api-key", "k", "--state-dir", str(tmp_path / "s"), *args],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and r.stderr.startswith("coved: "), (args, r.stderr)
    assert args[0].lstrip("-").replace("-", "_") in r.stderr


def test_a_stopping_sandbox_counts_until_it_is_gone(coved):
    """A sandbox holding 1.5 GiB takes a while to die: while it is Stopping its memory is
    still the host's, and still counted."""
    d = coved
    hold = ("import time; b = b'x' * (1536 << 20); open('/tmp/ready', 'w').close(); "
            "time.sleep(1e6)")
    status, body, _ = call(d, "POST", "/v1/sandboxes", TENANT_A, {
        "image": {"uri": "base"}, "entrypoint": ["python3", "-c", hold],
        "resourceLimits": {"cpu": "1", "memory": "2Gi"}})
    assert status == 202, body
    sid = body["id"]
    for _ in range(600):
        if d.exec(sid, "test -f /tmp/ready", key=TENANT_A).exit_code == 0:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the sandbox never allocated its memory")
    result = {}
    t = threading.Thread(target=lambda: result.update(
        r=call(d, "DELETE", f"/v1/sandboxes/{sid}", TENANT_A)))
    t.start()
    during = []
    while t.is_alive():
        # A usage read between two reads that both see Stopping was made while Stopping.
        before = call(d, "GET", f"/v1/sandboxes/{sid}", TENANT_A)[1]
        used = call(d, "GET", "/v1/quota", TENANT_A)[1]["used"]
        after = call(d, "GET", f"/v1/sandboxes/{sid}", TENANT_A)[1]
        if all(isinstance(s, dict) and s.get("status", {}).get("state") == "Stopping"
               for s in (before, after)):
            during.append(used)
    t.join()
    assert result["r"][0] == 204
    assert during, "never saw the sandbox Stopping"
    assert all(u["sandboxes"] == 1 and u["memory"] == "2Gi" for u in during), during
    assert call(d, "GET", "/v1/quota", TENANT_A)[1]["used"]["sandboxes"] == 0
    assert sandbox_leftovers(d, sid) == []
