"""Snapshots (sandbox-lifecycle.yml's Snapshots, sandbox/snapshot.h): a Running sandbox's
filesystem captured as a read-only layer; a sandbox made from it (snapshotId) starts with those
files, deletions and replaced directories included, owners, modes, links and holes kept; the
source runs on; list/get/delete with the contract's states and errors; a snapshot in use cannot
be deleted; snapshots of sandboxes made from snapshots stack; everything survives a restart."""

import os
import time

import pytest

from covetest import ApiError, sandbox_leftovers, serve

MiB = 1 << 20


def run(coved, sid, command, **kw):
    """A command that must succeed: its stdout without the last newline."""
    return coved.sh(sid, command, **kw).strip()


def snapshot(coved, sid, name=None, key=None):
    body = {} if name is None else {"name": name}
    status, snap, resp = coved.request("POST", f"/v1/sandboxes/{sid}/snapshots", body,
                                       headers=coved.headers(key))
    assert status == 202, snap
    assert snap["status"]["state"] == "Creating", snap
    assert resp.getheader("Location") == f"/v1/snapshots/{snap['id']}"
    return snap


def wait_ready(coved, snap_id, timeout=120, key=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        s = coved.ok("GET", f"/v1/snapshots/{snap_id}", headers=coved.headers(key))
        if s["status"]["state"] != "Creating":
            return s
        time.sleep(0.05)
    raise AssertionError(f"snapshot {snap_id} still Creating after {timeout} s")


def create_from(coved, snap_id, **extra):
    body = {"snapshotId": snap_id, "resourceLimits": {"cpu": "1", "memory": "512Mi"}}
    body.update(extra)
    return coved.ok("POST", "/v1/sandboxes", body, expect=(202,))["id"]


def error(coved, method, path, body=None, raw=None, key=None):
    status, resp, _ = coved.request(method, path, body, raw=raw, headers=coved.headers(key))
    assert status >= 400, (status, resp)
    assert set(resp) >= {"code", "message"}, resp
    return status, resp["code"], resp["message"]


# What the source does to its filesystem before the snapshot, and what the copy must show.
PREPARE = r"""
set -e
mkdir -p /root/work/sub /opt/replaced
echo hello > /root/work/a.txt
printf 'x%.0s' $(seq 1 5000) > /root/work/sub/b.txt
echo gone > /root/work/gone.txt && rm /root/work/gone.txt
echo old > /opt/replaced/old.txt
ln -s /etc/hostname /root/work/link
ln -s /root/work/a.txt /root/work/abs-link
mkfifo /root/work/fifo
truncate -s 64M /root/work/sparse && printf end >> /root/work/sparse
echo data | dd of=/root/work/sparse bs=1 seek=1000 conv=notrunc status=none
echo suid > /root/work/suid && chmod 4755 /root/work/suid
echo mine > /root/work/owned && chown 1000:1000 /root/work/owned
touch -d '2001-02-03 04:05:06' /root/work/dated
printf 'nl' > "/root/work/new
line"
rm /etc/os-release
"""


@pytest.mark.native_only(reason="snapshots are refused (409 SNAPSHOT::UNSUPPORTED) by the oci and gvisor runtimes today")
def test_snapshot_then_create_from_it(coved):
    src = coved.create()
    run(coved, src, PREPARE)
    run(coved, src, "rm -rf /opt/replaced && mkdir /opt/replaced && echo new > /opt/replaced/new.txt")
    snap = snapshot(coved, src, name="checkpoint-before-import")
    assert snap["sandboxId"] == src and snap["name"] == "checkpoint-before-import"
    ready = wait_ready(coved, snap["id"])
    assert ready["status"]["state"] == "Ready", ready
    assert ready["status"]["reason"] == "snapshot_ready"
    assert set(ready) <= {"id", "sandboxId", "name", "status", "createdAt"}
    # The source runs on, unfrozen, and its later changes are not in the snapshot.
    assert coved.get(src)["status"]["state"] == "Running"
    run(coved, src, "echo later > /root/work/later.txt")

    new = create_from(coved, snap["id"])
    info = coved.get(new)
    assert info["snapshotId"] == snap["id"]
    assert info["status"]["state"] == "Running"
    assert info["entrypoint"] == ["tail", "-f", "/dev/null"]  # the contract's default
    assert info["image"]["uri"] == "base"  # the source's template
    sh = lambda c: run(coved, new, c)  # noqa: E731
    assert sh("cat /root/work/a.txt") == "hello"
    assert sh("wc -c < /root/work/sub/b.txt") == "5000"
    assert sh("test -e /root/work/gone.txt && echo yes || echo no") == "no"
    assert sh("test -e /root/work/later.txt && echo yes || echo no") == "no"
    assert sh("ls /opt/replaced") == "new.txt"
    assert sh("readlink /root/work/link") == "/etc/hostname"
    assert sh("cat /root/work/abs-link") == "hello"
    assert sh("stat -c %F /root/work/fifo") == "fifo"
    assert sh("stat -c '%s %a %u:%g' /root/work/suid /root/work/owned").split("\n") == [
        "5 4755 0:0", "5 644 1000:1000"]
    assert sh("stat -c %Y /root/work/dated") == str(int(time.mktime(
        time.strptime("2001-02-03 04:05:06", "%Y-%m-%d %H:%M:%S"))))
    assert sh("cat '/root/work/new\nline'") == "nl"
    # The template's file the source deleted stays deleted; the rest of the template is there.
    assert sh("test -e /etc/os-release && echo yes || echo no") == "no"
    assert sh("test -e /etc/passwd && echo yes || echo no") == "yes"
    # Holes kept: 64 MiB apparent, a few blocks on disk, the data where it was.
    apparent, blocks = sh("stat -c '%s %b' /root/work/sparse").split()
    assert int(apparent) == 64 * MiB + 3 and int(blocks) * 512 < 4 * MiB
    assert sh("dd if=/root/work/sparse bs=1 skip=1000 count=4 status=none") == "data"
    # The new sandbox writes over the snapshot without touching it: a second one sees it as it was.
    sh("echo changed > /root/work/a.txt && rm /root/work/sub/b.txt")
    other = create_from(coved, snap["id"])
    assert run(coved, other, "cat /root/work/a.txt; ls /root/work/sub") == "hello\nb.txt"
    # ...and its files on the host are owned like a template's, never by the source's range.
    layer = os.path.join(coved.state_dir, "snapshots", snap["id"])
    st = os.lstat(os.path.join(layer, "root", "work", "owned"))
    assert st.st_uid == os.lstat(os.path.join(layer, "root", "work", "a.txt")).st_uid + 1000
    for sid in (new, other, src):
        coved.delete(sid)
    coved.ok("DELETE", f"/v1/snapshots/{snap['id']}", expect=(204,))
    deadline = time.time() + 30  # removed in the background
    while os.path.exists(layer) and time.time() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(layer)


@pytest.mark.native_only(reason="snapshots are refused (409 SNAPSHOT::UNSUPPORTED) by the oci and gvisor runtimes today")
def test_list_get_delete_and_in_use(coved):
    src = coved.create()
    run(coved, src, "echo one > /root/f")
    a = snapshot(coved, src)
    assert "name" not in a
    wait_ready(coved, a["id"])
    run(coved, src, "echo two > /root/f")
    b = snapshot(coved, src, name="second")
    wait_ready(coved, b["id"])
    listed = coved.ok("GET", f"/v1/snapshots?sandboxId={src}")
    assert [s["id"] for s in listed["items"]] == [a["id"], b["id"]]
    assert listed["pagination"] == {"page": 1, "pageSize": 20, "totalItems": 2, "totalPages": 1,
                                    "hasNextPage": False}
    assert [s["id"] for s in coved.ok("GET", "/v1/snapshots?name=second")["items"]] == [b["id"]]
    page = coved.ok("GET", f"/v1/snapshots?sandboxId={src}&pageSize=1&page=2")
    assert [s["id"] for s in page["items"]] == [b["id"]] and not page["pagination"]["hasNextPage"]
    states = coved.ok("GET", f"/v1/snapshots?sandboxId={src}&state=Ready&state=Failed")
    assert len(states["items"]) == 2
    # A state Cove never produces is a filter that matches nothing, not a 400.
    assert coved.ok("GET", f"/v1/snapshots?sandboxId={src}&state=Pushing")["items"] == []
    assert coved.ok("GET", "/v1/snapshots?sandboxId=nosuch")["items"] == []

    # In use by a sandbox made from it: 409, nothing changes; free again once that one is gone.
    user = create_from(coved, b["id"], entrypoint=["sleep", "infinity"])
    assert coved.get(user)["entrypoint"] == ["sleep", "infinity"]
    assert run(coved, user, "cat /root/f") == "two"
    status, code, message = error(coved, "DELETE", f"/v1/snapshots/{b['id']}")
    assert (status, code) == (409, "SNAPSHOT::IN_USE") and user in message
    assert coved.ok("GET", f"/v1/snapshots/{b['id']}")["status"]["state"] == "Ready"
    coved.delete(user)
    coved.ok("DELETE", f"/v1/snapshots/{b['id']}", expect=(204,))
    status, code, _ = error(coved, "GET", f"/v1/snapshots/{b['id']}")
    assert (status, code) == (404, "SNAPSHOT::NOT_FOUND")
    status, code, _ = error(coved, "DELETE", f"/v1/snapshots/{b['id']}")
    assert (status, code) == (404, "SNAPSHOT::NOT_FOUND")
    # The snapshot outlives its source.
    coved.delete(src)
    assert coved.ok("GET", f"/v1/snapshots/{a['id']}")["sandboxId"] == src
    again = create_from(coved, a["id"])
    assert run(coved, again, "cat /root/f") == "one"
    coved.delete(again)
    coved.ok("DELETE", f"/v1/snapshots/{a['id']}", expect=(204,))


def test_bad_requests_change_nothing(coved):
    src = coved.create()
    before = coved.ok("GET", "/v1/snapshots")["pagination"]["totalItems"]
    for body, raw in [({"name": ""}, None), ({"name": "x" * 129}, None), ({"name": 5}, None),
                      ({"name": "a\nb"}, None), ({"label": "x"}, None), (None, b"{not json"),
                      (None, b"[1]")]:
        status, code, _ = error(coved, "POST", f"/v1/sandboxes/{src}/snapshots", body, raw=raw)
        assert status == 400, (body, raw, code)
    status, code, _ = error(coved, "POST", "/v1/sandboxes/nosuch/snapshots", {})
    assert (status, code) == (404, "SANDBOX::NOT_FOUND")
    coved.pause(src)
    status, code, message = error(coved, "POST", f"/v1/sandboxes/{src}/snapshots", {})
    assert status == 409 and "Running" in message
    coved.resume(src)
    assert coved.ok("GET", "/v1/snapshots")["pagination"]["totalItems"] == before
    # Creates naming a snapshot badly.
    status, code, _ = error(coved, "POST", "/v1/sandboxes", {"snapshotId": "snap-nosuch"})
    assert (status, code) == (404, "SNAPSHOT::NOT_FOUND")
    status, code, _ = error(coved, "POST", "/v1/sandboxes",
                            {"snapshotId": "x", "image": {"uri": "base"}, "entrypoint": ["true"]})
    assert status == 400 and code == "SANDBOX::INVALID_PARAMETER"
    status, code, _ = error(coved, "POST", "/v1/sandboxes", {"snapshotId": 7})
    assert status == 400
    status, code, _ = error(coved, "GET", "/v1/snapshots?page=0")
    assert status == 400
    status, code, _ = error(coved, "GET", "/v1/snapshots?colour=red")
    assert status == 400
    coved.delete(src)


@pytest.mark.native_only(reason="snapshots are refused (409 SNAPSHOT::UNSUPPORTED) by the oci and gvisor runtimes today")
def test_pause_refused_while_capturing(coved):
    src = coved.create(limits={"cpu": "1", "memory": "512Mi", "ephemeral-storage": "2Gi"})
    run(coved, src, "dd if=/dev/urandom of=/root/big bs=1M count=768 status=none")
    snap = snapshot(coved, src)
    status, resp, _ = coved.request("POST", f"/v1/sandboxes/{src}/pause")
    state_then = coved.ok("GET", f"/v1/snapshots/{snap['id']}")["status"]["state"]
    if state_then == "Creating" or status == 409:
        assert status == 409 and resp["code"] == "SANDBOX::SNAPSHOT_IN_PROGRESS", resp
    ready = wait_ready(coved, snap["id"])
    assert ready["status"]["state"] == "Ready"
    if status == 202:
        coved.resume(src)
    # Thawed afterwards: its processes run.
    assert run(coved, src, "echo alive") == "alive"
    assert coved.get(src)["status"]["state"] == "Running"
    new = create_from(coved, snap["id"])
    assert run(coved, new, "stat -c %s /root/big") == str(768 * MiB)
    assert run(coved, new, "sha256sum < /root/big") == run(coved, src, "sha256sum < /root/big")
    coved.delete(new)
    coved.delete(src)
    coved.ok("DELETE", f"/v1/snapshots/{snap['id']}", expect=(204,))


@pytest.mark.native_only(reason="snapshots are refused (409 SNAPSHOT::UNSUPPORTED) by the oci and gvisor runtimes today")
def test_snapshots_stack(coved):
    src = coved.create()
    run(coved, src, "echo base-layer > /root/one && echo keep > /root/keep && mkdir /root/dir && "
                  "echo a > /root/dir/a")
    first = snapshot(coved, src)
    wait_ready(coved, first["id"])
    mid = create_from(coved, first["id"])
    # A directory of the lower snapshot removed and made again: opaque in mid's layer, so the
    # lower one's contents must stay hidden in a sandbox made from mid's snapshot.
    run(coved, mid, "echo second-layer > /root/two && rm /root/keep && echo over > /root/one && "
                  "rm -rf /root/dir && mkdir /root/dir && echo b > /root/dir/b")
    second = snapshot(coved, mid)
    assert wait_ready(coved, second["id"])["status"]["state"] == "Ready"
    top = create_from(coved, second["id"])
    assert run(coved, top, "cat /root/one /root/two; ls /root; ls /root/dir") == \
        "over\nsecond-layer\ndir\none\ntwo\nb"
    # The lower snapshot is in use by the upper one, even with no sandbox left on it.
    for sid in (top, mid, src):
        coved.delete(sid)
    status, code, message = error(coved, "DELETE", f"/v1/snapshots/{first['id']}")
    assert (status, code) == (409, "SNAPSHOT::IN_USE") and second["id"] in message
    coved.ok("DELETE", f"/v1/snapshots/{second['id']}", expect=(204,))
    coved.ok("DELETE", f"/v1/snapshots/{first['id']}", expect=(204,))


@pytest.mark.native_only(reason="snapshots are refused (409 SNAPSHOT::UNSUPPORTED) by the oci and gvisor runtimes today")
def test_failed_capture_leaves_the_source_running(coved):
    """A tree deeper than the copier allows: the snapshot is Failed with why, its partial
    copy removed, and the source thawed."""
    src = coved.create()
    run(coved, src, "cd /root && for i in $(seq 600); do mkdir d && cd d; done; echo deep > f")
    snap = snapshot(coved, src)
    failed = wait_ready(coved, snap["id"])
    assert failed["status"]["state"] == "Failed", failed
    assert failed["status"]["reason"] == "snapshot_capture_failed"
    assert "deep" in failed["status"]["message"] or "depth" in failed["status"]["message"]
    assert run(coved, src, "echo alive") == "alive"
    coved.pause(src)  # no longer snapshotting
    coved.resume(src)
    status, code, _ = error(coved, "POST", "/v1/sandboxes", {"snapshotId": snap["id"]})
    assert (status, code) == (409, "SNAPSHOT::NOT_READY")
    left = [n for n in os.listdir(os.path.join(coved.state_dir, "snapshots"))]
    assert left == [], left
    coved.ok("DELETE", f"/v1/snapshots/{snap['id']}", expect=(204,))
    coved.delete(src)


@pytest.mark.native_only(reason="snapshots are refused (409 SNAPSHOT::UNSUPPORTED) by the oci and gvisor runtimes today")
def test_other_keys_snapshots_are_invisible():
    with serve(api_keys=("key-a", "key-b")) as d:
        sid = d.create()
        snap = snapshot(d, sid)
        wait_ready(d, snap["id"])
        for method, path in [("GET", f"/v1/snapshots/{snap['id']}"),
                             ("DELETE", f"/v1/snapshots/{snap['id']}")]:
            status, code, _ = error(d, method, path, key="key-b")
            assert (status, code) == (404, "SNAPSHOT::NOT_FOUND")
        assert d.ok("GET", "/v1/snapshots", headers=d.headers("key-b"))["items"] == []
        status, code, _ = error(d, "POST", "/v1/sandboxes",
                                {"snapshotId": snap["id"]}, key="key-b")
        assert (status, code) == (404, "SNAPSHOT::NOT_FOUND")
        status, _, _ = error(d, "POST", f"/v1/sandboxes/{sid}/snapshots", {}, key="key-b")
        assert status == 404
        d.delete(sid)


@pytest.mark.native_only(reason="snapshots are refused (409 SNAPSHOT::UNSUPPORTED) by the oci and gvisor runtimes today")
def test_snapshots_survive_a_restart(fresh_coved):
    d = fresh_coved.start()
    src = d.create()
    run(d, src, "echo persisted > /root/p")
    snap = snapshot(d, src)
    wait_ready(d, snap["id"])
    user = create_from(d, snap["id"])
    d.kill()
    d.start()
    assert d.ok("GET", f"/v1/snapshots/{snap['id']}")["status"]["state"] == "Ready"
    assert d.get(user)["snapshotId"] == snap["id"]
    assert run(d, user, "cat /root/p") == "persisted"
    status, code, _ = error(d, "DELETE", f"/v1/snapshots/{snap['id']}")
    assert (status, code) == (409, "SNAPSHOT::IN_USE")
    again = create_from(d, snap["id"])
    assert run(d, again, "cat /root/p") == "persisted"
    # A sandbox re-adopted after the restart can be snapshotted too.
    run(d, src, "echo after > /root/q")
    later = snapshot(d, src)
    assert wait_ready(d, later["id"])["status"]["state"] == "Ready"
    for sid in (again, user, src):
        d.delete(sid)
        assert sandbox_leftovers(d, sid) == []
    d.ok("DELETE", f"/v1/snapshots/{snap['id']}", expect=(204,))
    d.ok("DELETE", f"/v1/snapshots/{later['id']}", expect=(204,))


@pytest.mark.native_only(reason="snapshots are refused (409 SNAPSHOT::UNSUPPORTED) by the oci and gvisor runtimes today")
def test_restart_during_capture_fails_it_and_thaws_the_source(fresh_coved):
    d = fresh_coved.start()
    src = d.create(limits={"cpu": "1", "memory": "512Mi", "ephemeral-storage": "2Gi"})
    run(d, src, "dd if=/dev/urandom of=/root/big bs=1M count=1024 status=none")
    snap = snapshot(d, src)
    d.kill()  # SIGTERM while the copy runs
    d.start()
    s = d.ok("GET", f"/v1/snapshots/{snap['id']}")
    if s["status"]["state"] == "Failed":
        assert "coved stopped" in s["status"]["message"]
    else:  # the copy beat the signal
        assert s["status"]["state"] == "Ready", s
    assert run(d, src, "echo alive", http_timeout=30) == "alive"
    assert [n for n in os.listdir(os.path.join(d.state_dir, "snapshots"))
            if n.startswith(".")] == []
    d.ok("DELETE", f"/v1/snapshots/{snap['id']}", expect=(204,))
    d.delete(src)


@pytest.mark.native_only(reason="snapshots are refused (409 SNAPSHOT::UNSUPPORTED) by the oci and gvisor runtimes today")
@pytest.mark.static_agent  # the busybox root has no libc for a dynamic agent
def test_template_in_use_by_a_snapshot_cannot_be_removed(coved, tmp_path):
    """A snapshot stands on its template: removing the template is refused while it exists."""
    from test_templates_api import busybox_rootfs
    root = busybox_rootfs(str(tmp_path / "rootfs"))
    headers = {"OPEN-SANDBOX-API-KEY": coved.admin_key, "Content-Type": "application/json"}
    coved.ok("POST", "/v1/templates", {"name": "snaptpl", "rootfs": root}, expect=(201,),
             headers=headers, timeout=120)
    src = coved.create(template="snaptpl", entrypoint=["/bin/sleep", "3600"])
    run(coved, src, "echo x > /root/x")
    snap = snapshot(coved, src)
    wait_ready(coved, snap["id"])
    coved.delete(src)
    status, resp, _ = coved.request("DELETE", "/v1/templates/snaptpl", headers=headers)
    assert status == 409, resp
    new = create_from(coved, snap["id"], entrypoint=["/bin/sleep", "3600"])
    assert coved.get(new)["image"]["uri"] == "snaptpl"
    assert run(coved, new, "cat /etc/marker /root/x") == "from the template\nx"
    coved.delete(new)
    coved.ok("DELETE", f"/v1/snapshots/{snap['id']}", expect=(204,))
    status, resp, _ = coved.request("DELETE", "/v1/templates/snaptpl", headers=headers)
    assert status == 204, resp
