"""`cove pool create|list|get|update|delete` and `cove create --pool`: warm pools, sandboxes
coved makes ahead of time. Against a real coved (admin key for the pool routes): a pool of one
fills, a create is served from it and runs commands, the pool shows the claim, a change of its
bounds shows, a deleted pool is gone while its sandbox lives on. Without a server: usage
errors are exit 2 before any request, the help, and the requests the CLI sends (to a loopback
stub that records them and answers as the API says)."""

import http.server
import json
import os
import subprocess
import threading
import time
import uuid

import pytest

from covetest import CLI

UNREACHABLE = "http://127.0.0.1:1"
# How long a pool of one may take to start its sandbox (an OCI or gVisor one is slower).
FILL_DEADLINE_S = 120


def cove_env(server, key):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COVE_", "OPEN_SANDBOX"))}
    env.update(COVE_SERVER=server, COVE_CONFIG_FILE="/nonexistent/cove-test-none.ini")
    if key is not None:
        env["COVE_API_KEY"] = key
    return env


def run_cove(server, key, *args, check=True):
    r = subprocess.run([CLI, *args], capture_output=True, text=True, env=cove_env(server, key),
                       timeout=300)
    if check and r.returncode != 0:
        raise AssertionError(f"cove {args} -> {r.returncode}: {r.stdout}{r.stderr}")
    return r


@pytest.fixture
def cove(coved):
    """cove against coved: with its admin key (pools), or admin=False its ordinary key."""
    def run(*args, check=True, admin=True, server=None):
        return run_cove(server or f"http://127.0.0.1:{coved.port}",
                        coved.admin_key if admin else coved.key, *args, check=check)
    return run


@pytest.fixture
def pools(coved):
    """Skips unless the coved under test serves /v1/pools (its server side may not be built
    yet: then the route is unknown, a 404 with HTTP::NOT_FOUND)."""
    status, body, _ = coved.request("GET", "/v1/pools", headers=coved.headers(coved.admin_key))
    if status == 404:
        pytest.skip(f"this coved has no /v1/pools yet ({body})")
    assert status == 200, (status, body)


def pool_json(cove, name):
    return json.loads(cove("pool", "get", name, "-o", "json").stdout)


def wait_for(what, probe):
    """Polls probe() until it returns something true, up to a deadline; that value."""
    deadline = time.monotonic() + FILL_DEADLINE_S
    while True:
        value = probe()
        if value:
            return value
        assert time.monotonic() < deadline, f"no {what} after {FILL_DEADLINE_S} s"
        time.sleep(0.2)


def fields(stdout):
    """`cove pool get`'s lines, "key value", as a dict (env lines left out)."""
    return {k: v for k, v in (line.split(None, 1) for line in stdout.splitlines())
            if k != "env"}


# ---- against coved ------------------------------------------------------------------------

def test_pool_fills_serves_a_create_and_is_deleted(coved, cove, pools):
    name = "cli-" + uuid.uuid4().hex[:8]
    made = []
    try:
        shown = fields(cove("pool", "create", name, "--template", "base", "--buffer-max", "1",
                            "--pool-max", "3", "--env", "POOL_MARK=warm").stdout)
        assert shown["name"] == name and shown["template"] == "base"
        assert shown["buffer"] == "1-1" and shown["pool"] == "0-3"

        table = cove("pool", "list").stdout.splitlines()
        assert table[0].split() == ["NAME", "TEMPLATE", "AVAILABLE", "ALLOCATED", "PENDING",
                                    "TOTAL", "BUFFER", "POOL"]
        row = [line.split() for line in table[1:] if line.split()[0] == name]
        assert len(row) == 1 and row[0][1] == "base" and row[0][6:] == ["1-1", "0-3"], table

        wait_for("ready sandbox in the pool",
                 lambda: pool_json(cove, name)["status"]["available"] == 1)

        # an ordinary key creates from it; the sandbox runs commands and has the create's env,
        # not the pool's (that one is what it had while it waited)
        sid = cove("create", "--pool", name, "--env", "MINE=yes", admin=False).stdout.strip()
        made.append(sid)
        assert sid and "\n" not in sid
        assert cove("exec", sid, "--", "echo", "from-pool", admin=False).stdout == "from-pool\n"
        assert cove("exec", sid, "--", "sh", "-c", "echo ${POOL_MARK-none}-$MINE",
                    admin=False).stdout == "none-yes\n"

        status = pool_json(cove, name)["status"]
        assert status["allocated"] == 1, status
        assert fields(cove("pool", "get", name).stdout)["allocated"] == "1"

        updated = fields(cove("pool", "update", name, "--buffer-max", "2").stdout)
        assert updated["buffer"] == "1-2", updated
        spec = pool_json(cove, name)["capacitySpec"]
        assert spec["bufferMax"] == 2 and spec["bufferMin"] == 1 and spec["poolMax"] == 3, spec

        r = cove("pool", "delete", name)
        assert r.stdout == name + "\n"
        r = cove("pool", "get", name, check=False)
        assert r.returncode == 1 and "POOL::NOT_FOUND" in r.stderr, r
        assert name not in [p["name"] for p in
                            json.loads(cove("pool", "list", "-o", "json").stdout)["items"]]

        # what was claimed from the pool lives on without it
        assert cove("exec", sid, "--", "echo", "still", admin=False).stdout == "still\n"
        cove("kill", sid, admin=False)
        made.remove(sid)
        assert cove("get", sid, check=False, admin=False).returncode == 1
    finally:
        for sid in made:
            cove("kill", sid, check=False, admin=False)
        cove("pool", "delete", name, check=False)


def test_pool_refusals_are_exit_1_with_the_servers_code(coved, cove, pools):
    name = "cli-" + uuid.uuid4().hex[:8]
    try:
        cove("pool", "create", name, "-t", "base", "--buffer-max", "1", "--pool-max", "2")
        r = cove("pool", "create", name, "-t", "base", "--buffer-max", "1", "--pool-max", "2",
                 check=False)
        assert r.returncode == 1 and "POOL::ALREADY_EXISTS" in r.stderr, r
        # bounds the server cannot keep, more ready than in all: refused, and nothing changed
        r = cove("pool", "update", name, "--buffer-max", "5", "--pool-max", "2", check=False)
        assert r.returncode == 1 and "POOL::INVALID_PARAMETER" in r.stderr, r
        assert pool_json(cove, name)["capacitySpec"]["bufferMax"] == 1
        # pools are for admin keys
        r = cove("pool", "list", admin=False, check=False)
        assert r.returncode == 1 and "AUTH::FORBIDDEN" in r.stderr, r
    finally:
        cove("pool", "delete", name, check=False)
    for args in (["get", "cli-none"], ["update", "cli-none", "--pool-max", "2"],
                 ["delete", "cli-none"]):
        r = cove("pool", *args, check=False)
        assert r.returncode == 1 and "POOL::NOT_FOUND" in r.stderr, (args, r)
    r = cove("create", "--pool", "cli-none", admin=False, check=False)
    assert r.returncode == 1 and r.stdout == "", r


# ---- without a server ---------------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ["pool"], ["pool", "nope"],
    ["pool", "create"], ["pool", "create", "a", "b", "-t", "base", "--buffer-max", "1",
                         "--pool-max", "2"],
    ["pool", "create", "", "-t", "base", "--buffer-max", "1", "--pool-max", "2"],
    ["pool", "create", "a", "--buffer-max", "1", "--pool-max", "2"],
    ["pool", "create", "a", "-t", "base", "--pool-max", "2"],
    ["pool", "create", "a", "-t", "base", "--buffer-max", "1"],
    ["pool", "create", "a", "-t", "base", "--buffer-max", "one", "--pool-max", "2"],
    ["pool", "create", "a", "-t", "base", "--buffer-max", "-1", "--pool-max", "2"],
    ["pool", "create", "a", "-t", "base", "--buffer-max", "1.5", "--pool-max", "2"],
    ["pool", "create", "a", "-t", "base", "--buffer-max", "1", "--pool-max", "2x"],
    ["pool", "create", "a", "-t", "base", "--buffer-max", "1", "--pool-max", "99999999999"],
    ["pool", "create", "a", "-t", "base", "--buffer-max", "1", "--pool-max", "2",
     "--buffer-min", ""],
    ["pool", "create", "a", "-t", "base", "--buffer-max", "1", "--pool-max", "2",
     "--env", "NOEQUALS"],
    ["pool", "create", "a", "-t", "base", "--buffer-max", "1", "--pool-max", "2",
     "--runtime", "kvm"],
    ["pool", "create", "a", "-t", "base", "--buffer-max", "1", "--pool-max", "2", "--bogus"],
    ["pool", "list", "extra"], ["pool", "ls", "--bogus"],
    ["pool", "get"], ["pool", "get", "a", "b"], ["pool", "get", ""],
    ["pool", "update"], ["pool", "update", "a"], ["pool", "update", "a", "b", "--pool-max", "2"],
    ["pool", "update", "a", "--pool-min", "+1"],
    ["pool", "update", "a", "--template", "base"],
    ["pool", "delete"], ["pool", "rm"],
    ["create", "--pool", "p", "--snapshot", "s"], ["create", "--pool", ""],
])
def test_usage_errors_are_exit_2_before_any_request(args):
    r = run_cove(UNREACHABLE, "k", *args, check=False)
    assert r.returncode == 2, (args, r.stdout, r.stderr)
    assert r.stdout == ""
    assert "Usage: cove pool" in r.stderr or "--help' for usage" in r.stderr, r.stderr


def test_a_count_names_the_option_and_what_it_got():
    r = run_cove(UNREACHABLE, "k", "pool", "create", "py", "-t", "base", "--buffer-max", "two",
                 "--pool-max", "2", check=False)
    assert r.returncode == 2
    assert "--buffer-max expects a whole number from 0, got 'two'" in r.stderr, r.stderr
    r = run_cove(UNREACHABLE, "k", "pool", "create", "py", "--buffer-max", "1", "--pool-max",
                 "2", check=False)
    assert "--template NAME is required" in r.stderr, r.stderr


def test_unreachable_server_is_exit_3():
    for args in (["pool", "list"], ["pool", "get", "a"], ["pool", "delete", "a"],
                 ["pool", "create", "a", "-t", "base", "--buffer-max", "1", "--pool-max", "2"],
                 ["pool", "update", "a", "--pool-max", "2"], ["create", "--pool", "a"]):
        r = run_cove(UNREACHABLE, "k", *args, check=False)
        assert r.returncode == 3, (args, r.stderr)


def test_help_completion_and_man_page_name_the_verbs():
    verbs = ("create", "list", "ls", "get", "update", "delete", "rm")
    main = run_cove(UNREACHABLE, None, "--help").stdout
    section = main.split("Administration (admin key):\n")[1].split("\n\n")[0]
    assert [line.split()[0] for line in section.splitlines()] == ["pool"]
    assert run_cove(UNREACHABLE, None, "pool", "--help").stdout.startswith(
        "Usage: cove pool COMMAND")
    assert run_cove(UNREACHABLE, None, "help", "pool").stdout.startswith("Usage: cove pool")
    for verb in verbs:
        assert run_cove(UNREACHABLE, None, "pool", verb, "--help").stdout.startswith(
            f"Usage: cove pool {verb}")
        assert run_cove(UNREACHABLE, None, "help", "pool", verb).stdout.startswith(
            f"Usage: cove pool {verb}")
    created = run_cove(UNREACHABLE, None, "pool", "create", "--help").stdout
    for flag in ("--template NAME", "--cpu", "--memory", "--disk", "--env KEY=VALUE",
                 "--runtime", "--buffer-max N", "--buffer-min N", "--pool-max N", "--pool-min N"):
        assert flag in created, flag
    assert "--pool NAME" in run_cove(UNREACHABLE, None, "create", "--help").stdout
    bash = run_cove(UNREACHABLE, None, "completion", "bash").stdout
    assert f'"pool") echo "{" ".join(verbs)}" ;;' in bash
    assert ('"pool update") echo " --buffer-min --buffer-max --pool-min --pool-max -e --env" ;;'
            in bash)
    assert "--pool" in bash.split('"create") echo "')[1].split(";;")[0]
    page = run_cove(UNREACHABLE, None, "help", "--man").stdout
    for verb in verbs:
        assert f'.SS "cove pool {verb}"' in page


# ---- the requests the CLI sends -------------------------------------------------------------

class Recorder(http.server.BaseHTTPRequestHandler):
    """Records each request; answers as the pool API does (the answers are fixed, so these
    tests are about what the CLI sends and how it prints, not about coved)."""

    def log_message(self, *args):
        pass

    def answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.requests.append((self.command, self.path, json.loads(body) if body else None,
                                     self.headers.get("OPEN-SANDBOX-API-KEY")))
        status, answer = self.server.answers.get((self.command, self.path), (404, {
            "code": "POOL::NOT_FOUND", "message": f"no pool at {self.path}"}))
        data = json.dumps(answer).encode() if answer is not None else b""
        self.send_response(status)
        if data:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PATCH = do_DELETE = answer


POOL = {"name": "py", "template": "code-interpreter",
        "resourceLimits": {"cpu": "500m", "memory": "512Mi"}, "env": {"K": "V"},
        "capacitySpec": {"bufferMin": 1, "bufferMax": 2, "poolMin": 0, "poolMax": 10},
        "extensions": {"runtime": "oci"},
        "status": {"total": 3, "allocated": 1, "available": 2, "pending": 0,
                   "lastError": "template code-interpreter: no such template"},
        "createdAt": "2026-01-01T00:00:00Z", "updatedAt": "2026-01-01T00:00:01Z"}


@pytest.fixture
def recorder():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    server.requests, server.answers = [], {}
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_pool_create_sends_what_was_given_and_prints_the_pool(recorder):
    recorder.answers[("POST", "/v1/pools")] = (201, POOL)
    r = run_cove(recorder.url, "admin", "pool", "create", "py", "-t", "code-interpreter",
                 "--cpu", "500m", "--memory", "512Mi", "--disk", "1Gi", "-e", "K=V",
                 "--env", "A=b=c", "--runtime", "oci", "--buffer-max", "2", "--buffer-min", "1",
                 "--pool-max", "10", "--pool-min", "0")
    assert recorder.requests == [("POST", "/v1/pools", {
        "name": "py", "template": "code-interpreter",
        "resourceLimits": {"cpu": "500m", "memory": "512Mi", "ephemeral-storage": "1Gi"},
        "env": {"K": "V", "A": "b=c"},
        "capacitySpec": {"bufferMax": 2, "bufferMin": 1, "poolMax": 10, "poolMin": 0},
        "extensions": {"runtime": "oci"}}, "admin")]
    shown = fields(r.stdout)
    assert shown["name"] == "py" and shown["runtime"] == "oci" and shown["buffer"] == "1-2"
    assert shown["available"] == "2" and shown["allocated"] == "1" and shown["pool"] == "0-10"
    assert shown["lastError"] == "template code-interpreter: no such template"
    assert "env          K=V" in r.stdout

    # the least: no limits, env or extensions; the server's defaults for the minimums
    recorder.requests.clear()
    run_cove(recorder.url, "admin", "pool", "create", "py", "--template", "base",
             "--buffer-max", "0", "--pool-max", "1")
    assert recorder.requests[0][2] == {"name": "py", "template": "base",
                                       "capacitySpec": {"bufferMax": 0, "poolMax": 1}}


def test_pool_list_get_update_delete_requests_and_output(recorder):
    other = dict(POOL, name="b/c", template="base", status={
        "total": 0, "allocated": 0, "available": 0, "pending": 1})
    recorder.answers[("GET", "/v1/pools")] = (200, {"items": [POOL, other]})
    recorder.answers[("GET", "/v1/pools/py")] = (200, POOL)
    recorder.answers[("PATCH", "/v1/pools/py")] = (200, POOL)
    recorder.answers[("DELETE", "/v1/pools/py")] = (204, None)
    recorder.answers[("DELETE", "/v1/pools/b%2Fc")] = (204, None)

    table = run_cove(recorder.url, "admin", "pool", "list").stdout.splitlines()
    assert [line.split() for line in table] == [
        ["NAME", "TEMPLATE", "AVAILABLE", "ALLOCATED", "PENDING", "TOTAL", "BUFFER", "POOL"],
        ["py", "code-interpreter", "2", "1", "0", "3", "1-2", "0-10"],
        ["b/c", "base", "0", "0", "1", "0", "1-2", "0-10"]]
    listed = json.loads(run_cove(recorder.url, "admin", "pool", "ls", "-o", "json").stdout)
    assert listed == {"items": [POOL, other]}

    assert json.loads(run_cove(recorder.url, "admin", "pool", "get", "py", "-o",
                               "json").stdout) == POOL

    # a merge patch of only what was given
    recorder.requests.clear()
    run_cove(recorder.url, "admin", "pool", "update", "py", "--buffer-max", "5")
    run_cove(recorder.url, "admin", "pool", "update", "py", "--buffer-min", "0", "--pool-min",
             "1", "--pool-max", "20", "-e", "K=W")
    assert [(m, p, b) for m, p, b, _ in recorder.requests] == [
        ("PATCH", "/v1/pools/py", {"capacitySpec": {"bufferMax": 5}}),
        ("PATCH", "/v1/pools/py", {"capacitySpec": {"bufferMin": 0, "poolMin": 1, "poolMax": 20},
                                   "env": {"K": "W"}})]

    recorder.requests.clear()
    r = run_cove(recorder.url, "admin", "pool", "delete", "py", "b/c")
    assert r.stdout == "py\nb/c\n"
    assert [(m, p) for m, p, _, _ in recorder.requests] == [
        ("DELETE", "/v1/pools/py"), ("DELETE", "/v1/pools/b%2Fc")]

    # the server's error, as every command prints it: exit 1, its code and message
    r = run_cove(recorder.url, "admin", "pool", "get", "gone", check=False)
    assert r.returncode == 1 and r.stdout == ""
    assert "cove: POOL::NOT_FOUND: no pool at /v1/pools/gone" in r.stderr, r.stderr


def test_create_from_a_pool_sends_no_defaults_of_its_own(recorder):
    recorder.answers[("POST", "/v1/sandboxes")] = (202, {"id": "sbx-1"})
    r = run_cove(recorder.url, "user", "create", "--pool", "py")
    assert r.stdout == "sbx-1\n"
    body = recorder.requests[-1][2]
    # the pool's template, limits and entrypoint: none sent; the CLI's TTL still is
    assert body == {"extensions": {"poolRef": "py"}, "timeout": 600}, body

    # what is given explicitly is sent, and only that
    run_cove(recorder.url, "user", "create", "--pool", "py", "-t", "base", "--memory", "1Gi",
             "--layer", "tmpfs", "-e", "X=1", "--timeout", "0", "--", "sleep", "9")
    body = recorder.requests[-1][2]
    assert body == {"extensions": {"cove.layer": "tmpfs", "poolRef": "py"}, "timeout": None,
                    "image": {"uri": "base"}, "resourceLimits": {"memory": "1Gi"},
                    "env": {"X": "1"}, "entrypoint": ["sleep", "9"]}, body

    # without --pool the defaults are as they were
    run_cove(recorder.url, "user", "create")
    body = recorder.requests[-1][2]
    assert "extensions" not in body and body["image"] == {"uri": "base"}
    assert body["resourceLimits"] == {"cpu": "500m", "memory": "512Mi"}
    assert body["entrypoint"][0] == "/bin/sh"
    run_cove(recorder.url, "user", "create", "--memory", "2Gi")
    assert recorder.requests[-1][2]["resourceLimits"] == {"memory": "2Gi", "cpu": "500m"}
