"""`cove snapshot create|ls|get|rm` and `cove create --snapshot` against a real coved: the files
a sandbox had when it was snapshotted come back in a sandbox started from the snapshot (and
what it wrote afterwards does not), the list and its filters, a snapshot refused removal while
a sandbox started from it lives, and the exit statuses (0 ok, 1 refused, 2 bad usage)."""

import json
import os
import subprocess
import time

import pytest

from covetest import CLI

UNREACHABLE = "http://127.0.0.1:1"


@pytest.fixture
def cove(coved):
    """Runs cove against coved with settings from the environment only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COVE_", "OPEN_SANDBOX"))}
    env.update(COVE_SERVER=f"http://127.0.0.1:{coved.port}", COVE_API_KEY=coved.key,
               COVE_CONFIG_FILE=os.path.join(coved.state_dir, "none.ini"))

    def run(*args, check=True, server=None):
        e = dict(env, COVE_SERVER=server) if server else env
        r = subprocess.run([CLI, *args], capture_output=True, text=True, env=e, timeout=300)
        if check and r.returncode != 0:
            raise AssertionError(f"cove {args} -> {r.returncode}: {r.stderr}")
        return r
    return run


def as_json(r):
    return json.loads(r.stdout)


@pytest.mark.native_only(reason="snapshots are refused (409 SNAPSHOT::UNSUPPORTED) by the oci and gvisor runtimes today")
def test_snapshot_then_create_from_it_then_rm(coved, cove):
    src = cove("create", "--timeout", "0").stdout.strip()
    made = [src]
    snap = None
    try:
        coved.sh(src, "mkdir -p /home/work && echo kept > /home/work/a.txt && "
                      "echo gone > /home/work/b.txt && rm /home/work/b.txt")
        r = cove("snapshot", "create", "--wait", "--name", "cli-snap", src)
        snap = r.stdout.strip()
        assert r.stdout == snap + "\n" and snap, r.stdout
        got = as_json(cove("snapshot", "get", snap, "-o", "json"))
        assert got["id"] == snap and got["sandboxId"] == src and got["name"] == "cli-snap"
        assert got["status"]["state"] == "Ready"
        # the source ran on; what it writes now is not in the snapshot
        assert coved.get(src)["status"]["state"] == "Running"
        coved.sh(src, "echo later > /home/work/a.txt && echo new > /home/work/c.txt")

        new = cove("create", "--snapshot", snap, "--timeout", "0").stdout.strip()
        made.append(new)
        assert coved.get(new).get("snapshotId") == snap
        assert coved.sh(new, "cat /home/work/a.txt") == "kept\n"
        assert coved.sh(new, "ls /home/work") == "a.txt\n"
        assert coved.sh(src, "cat /home/work/a.txt") == "later\n"

        # ls: the table, its JSON, and the filters
        table = cove("snapshot", "ls").stdout.splitlines()
        assert table[0].split() == ["ID", "NAME", "SANDBOX", "STATE", "CREATED"]
        assert [line.split()[:4] for line in table[1:]] == [[snap, "cli-snap", src, "Ready"]]
        listed = as_json(cove("snapshot", "ls", "-o", "json"))["items"]
        assert [s["id"] for s in listed] == [snap]
        assert [s["id"] for s in as_json(cove("snapshot", "ls", "--sandbox", src, "-o",
                                              "json"))["items"]] == [snap]
        assert as_json(cove("snapshot", "ls", "--sandbox", new, "-o", "json"))["items"] == []
        assert [s["id"] for s in as_json(cove("snapshot", "ls", "--state", "Failed", "--state",
                                              "Ready", "-o", "json"))["items"]] == [snap]
        assert as_json(cove("snapshot", "ls", "--state", "Failed", "-o", "json"))["items"] == []
        assert "cli-snap" in cove("snapshot", "get", snap).stdout

        # rm is refused while a sandbox started from it exists, and removes nothing
        r = cove("snapshot", "rm", snap, check=False)
        assert r.returncode == 1 and r.stdout == "", r
        assert "SNAPSHOT::IN_USE" in r.stderr and "in use" in r.stderr, r.stderr
        assert new in r.stderr  # the message names who uses it
        assert coved.get(new)["status"]["state"] == "Running"
        assert as_json(cove("snapshot", "get", snap, "-o", "json"))["status"]["state"] == "Ready"

        cove("kill", new)
        made.remove(new)
        assert cove("snapshot", "rm", snap).stdout == snap + "\n"
        r = cove("snapshot", "get", snap, check=False)
        assert r.returncode == 1 and "SNAPSHOT::NOT_FOUND" in r.stderr, r.stderr
        assert as_json(cove("snapshot", "ls", "-o", "json"))["items"] == []
        snap = None
    finally:
        for sid in made:
            coved.request("DELETE", f"/v1/sandboxes/{sid}")
        if snap:
            coved.request("DELETE", f"/v1/snapshots/{snap}")


@pytest.mark.native_only(reason="snapshots are refused (409 SNAPSHOT::UNSUPPORTED) by the oci and gvisor runtimes today")
def test_snapshot_outlives_its_sandbox_and_yaml(coved, cove):
    src = cove("create").stdout.strip()
    snap = None
    try:
        coved.sh(src, "echo one > /tmp/one")
        done = as_json(cove("snapshot", "create", src, "--wait", "-o", "json"))
        snap = done["id"]
        assert done["status"]["state"] == "Ready" and done["sandboxId"] == src
        assert "name" not in done or done["name"] in (None, "")
        cove("kill", src)
        src = None
        # a yaml answer names the same snapshot
        assert f"id: {snap}" in cove("snapshot", "get", snap, "-o", "yaml").stdout
        new = cove("create", "--snapshot", snap).stdout.strip()
        try:
            assert coved.sh(new, "cat /tmp/one") == "one\n"
        finally:
            cove("kill", new)
        cove("snapshot", "rm", snap)
        snap = None
    finally:
        if src:
            coved.request("DELETE", f"/v1/sandboxes/{src}")
        if snap:
            coved.request("DELETE", f"/v1/snapshots/{snap}")


@pytest.mark.native_only(reason="snapshots are refused (409 SNAPSHOT::UNSUPPORTED) by the oci and gvisor runtimes today")
def test_snapshot_without_wait_prints_the_id_at_once(coved, cove):
    src = cove("create").stdout.strip()
    snap = None
    try:
        snap = cove("snapshot", "create", src).stdout.strip()
        first = as_json(cove("snapshot", "get", snap, "-o", "json"))
        assert first["status"]["state"] in ("Creating", "Ready")
        # --wait-timeout alone waits too
        cove("snapshot", "create", src, "--wait-timeout", "5m")
        for s in as_json(cove("snapshot", "ls", "--sandbox", src, "-o", "json"))["items"]:
            assert s["sandboxId"] == src
    finally:
        coved.request("DELETE", f"/v1/sandboxes/{src}")
        for s in coved.ok("GET", f"/v1/snapshots?sandboxId={src}")["items"]:
            # a snapshot still Creating cannot be removed yet: wait for it
            for _ in range(600):
                if coved.ok("GET", f"/v1/snapshots/{s['id']}")["status"]["state"] != "Creating":
                    break
                time.sleep(0.1)
            coved.request("DELETE", f"/v1/snapshots/{s['id']}")


@pytest.mark.native_only(reason="snapshots are refused (409 SNAPSHOT::UNSUPPORTED) by the oci and gvisor runtimes today")
def test_wait_for_a_failed_snapshot_exits_1_with_its_message(coved, cove):
    src = cove("create").stdout.strip()
    try:
        # deeper than the copier goes (SNAPSHOT_MAX_DEPTH, 512 levels): the capture fails
        coved.sh(src, 'mkdir -p /tmp/deep/$(printf "d/%.0s" $(seq 520))')
        r = cove("snapshot", "create", "--wait", src, check=False)
        assert r.returncode == 1 and r.stdout == "", r
        assert "CLI::SNAPSHOT_FAILED" in r.stderr and "snapshot_capture_failed" in r.stderr
        assert "deeper than 512 directory levels" in r.stderr, r.stderr
        failed = as_json(cove("snapshot", "ls", "--state", "Failed", "-o", "json"))["items"]
        assert [s["sandboxId"] for s in failed] == [src]
        assert f"'cove snapshot rm {failed[0]['id']}'" in r.stderr
        assert "Failed" in cove("snapshot", "get", failed[0]["id"]).stdout
        # the source was thawed and runs on; the failed snapshot can be removed
        assert coved.sh(src, "echo alive") == "alive\n"
        assert cove("snapshot", "rm", failed[0]["id"]).stdout == failed[0]["id"] + "\n"
    finally:
        coved.request("DELETE", f"/v1/sandboxes/{src}")
        for s in coved.ok("GET", f"/v1/snapshots?sandboxId={src}")["items"]:
            coved.request("DELETE", f"/v1/snapshots/{s['id']}")


def test_refusals_are_exit_1_with_the_servers_code(coved, cove):
    src = cove("create").stdout.strip()
    try:
        coved.pause(src)
        for _ in range(100):
            if coved.get(src)["status"]["state"] == "Paused":
                break
            time.sleep(0.05)
        status, body, _ = coved.request("POST", f"/v1/sandboxes/{src}/snapshots", {})
        assert status == 409
        r = cove("snapshot", "create", "--wait", src, check=False)
        assert r.returncode == 1 and r.stdout == ""
        assert body["code"] in r.stderr and body["message"] in r.stderr
    finally:
        coved.request("DELETE", f"/v1/sandboxes/{src}")
    assert coved.ok("GET", f"/v1/snapshots?sandboxId={src}")["items"] == []
    r = cove("snapshot", "create", "no-such-sandbox", check=False)
    assert r.returncode == 1 and "SANDBOX::NOT_FOUND" in r.stderr
    r = cove("create", "--snapshot", "no-such-snapshot", check=False)
    assert r.returncode == 1 and "SNAPSHOT::NOT_FOUND" in r.stderr and r.stdout == ""
    r = cove("snapshot", "rm", "no-such-snapshot", check=False)
    assert r.returncode == 1 and "SNAPSHOT::NOT_FOUND" in r.stderr


@pytest.mark.parametrize("args", [
    ["snapshot", "create"], ["snapshot", "create", "a", "b"],
    ["snapshot", "create", "--name", "", "a"],
    ["snapshot", "create", "a", "--wait-timeout", "soon"], ["snapshot", "get"],
    ["snapshot", "get", "a", "b"], ["snapshot", "rm"], ["snapshot", "ls", "extra"],
    ["snapshot", "ls", "--bogus"], ["snapshot", "nope"], ["snapshot"],
    ["create", "--snapshot", "s", "--template", "base"],
])
def test_usage_errors_are_exit_2_before_any_request(cove, args):
    r = cove(*args, check=False, server=UNREACHABLE)
    assert r.returncode == 2, (args, r.stderr)
    assert r.stdout == ""


def test_help_completion_and_man_page_name_the_verbs(cove):
    assert cove("snapshot", "--help").stdout.startswith("Usage: cove snapshot COMMAND")
    for verb in ("create", "ls", "get", "rm"):
        assert cove("snapshot", verb, "--help").stdout.startswith(f"Usage: cove snapshot {verb}")
    assert "--snapshot ID" in cove("create", "--help").stdout
    bash = cove("completion", "bash").stdout
    assert '"snapshot") echo "create ls get rm" ;;' in bash
    assert '"snapshot create") echo " --name --wait --wait-timeout" ;;' in bash
    assert "--snapshot" in bash.split('"create") echo "')[1].split(";;")[0]
    page = cove("help", "--man").stdout
    for verb in ("create", "ls", "get", "rm"):
        assert f'.SS "cove snapshot {verb}"' in page
