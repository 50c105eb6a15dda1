"""Snapshots against hostile sandboxes: coved copies a layer the sandbox wrote, as host root.
Symbolic links to host files (the markers), FIFOs, sockets, names with newlines, setuid files
of root inside and a tree of 20,000 entries must come out as the sandbox's own files and
nothing else: no host file read or written through them, nothing in the snapshot owned by a
host id outside the templates' range, no hang. The agent's descriptor of the layer is out of
reach of the sandbox's processes. Afterwards coved, the host and another sandbox are fine."""

import os
import stat
import time
import pytest

from covetest import serve  # noqa: F401 (the module's daemon comes from conftest)
from hostile import delete_and_check, run_python

ID_BASE = 100000  # ID_RANGE_SHARED_BASE: the templates' owners
ID_COUNT = 65536


def run(coved, sid, command, **kw):
    return coved.sh(sid, command, **kw).strip()


def take(coved, sid):
    snap = coved.ok("POST", f"/v1/sandboxes/{sid}/snapshots", {}, expect=(202,))
    deadline = time.time() + 120
    while time.time() < deadline:
        s = coved.ok("GET", f"/v1/snapshots/{snap['id']}")
        if s["status"]["state"] != "Creating":
            return s
        time.sleep(0.05)
    raise AssertionError("snapshot still Creating")


@pytest.mark.native_only(reason="snapshots are refused (409 SNAPSHOT::UNSUPPORTED) by the oci and gvisor runtimes today")
def test_hostile_layer_is_copied_as_data_only(coved, make_sandbox, host_markers):
    sid = make_sandbox()
    marker = host_markers.paths[0]
    out = run_python(coved, sid, f"""
import json, os, socket
os.makedirs('/root/h', exist_ok=True)
os.chdir('/root/h')
for i, p in enumerate({host_markers.paths!r} + ['/etc/shadow', '/proc/1/root/etc/shadow', '/']):
    os.symlink(p, 'link%d' % i)
os.symlink('loop', 'loop')
os.mkfifo('fifo')
s = socket.socket(socket.AF_UNIX); s.bind('/root/h/sock')
open('suid-root', 'w').write('#!/bin/sh\\nid\\n'); os.chmod('suid-root', 0o6755)
open('nl\\nname', 'w').write('x')
open('x' * 255, 'w').write('long')
os.makedirs('many')
for i in range(20000):
    open('many/%d' % i, 'w').close()
print(json.dumps({{"ok": True}}))
""")
    assert out["ok"]
    snap = take(coved, sid)
    assert snap["status"]["state"] == "Ready", snap
    layer = os.path.join(coved.state_dir, "snapshots", snap["id"])
    secret = host_markers.secret
    count = 0
    for top, dirs, files in os.walk(layer):
        for name in dirs + files:
            path = os.path.join(top, name)
            st = os.lstat(path)
            count += 1
            # Every entry is owned by the templates' range: never host root, never a host user.
            assert ID_BASE <= st.st_uid < ID_BASE + ID_COUNT, (path, st.st_uid)
            assert ID_BASE <= st.st_gid < ID_BASE + ID_COUNT, (path, st.st_gid)
            assert not stat.S_ISSOCK(st.st_mode) and not stat.S_ISBLK(st.st_mode)
            if stat.S_ISCHR(st.st_mode):
                assert st.st_rdev == 0, path  # whiteouts only
            if stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    assert secret.encode() not in f.read(), f"host secret copied into {path}"
    assert count >= 20000
    h = os.path.join(layer, "root", "h")
    assert os.readlink(os.path.join(h, "link0")) == marker  # a link, never what it names
    assert stat.S_ISFIFO(os.lstat(os.path.join(h, "fifo")).st_mode)
    assert not os.path.exists(os.path.join(h, "sock"))
    suid = os.lstat(os.path.join(h, "suid-root"))
    assert suid.st_uid == ID_BASE and suid.st_mode & 0o7777 == 0o6755
    assert host_markers.intact()
    # The copy in a new sandbox: the same files, the links still links.
    new = coved.ok("POST", "/v1/sandboxes", {"snapshotId": snap["id"]}, expect=(202,))["id"]
    try:
        assert run(coved, new, "readlink /root/h/link0; ls /root/h/many | wc -l; "
                             "stat -c %a /root/h/suid-root") == f"{marker}\n20000\n6755"
        r = coved.exec(new, f"cat {marker}")
        assert r.exit_code != 0 and secret not in r.stdout
    finally:
        delete_and_check(coved, new)
    delete_and_check(coved, sid)
    coved.ok("DELETE", f"/v1/snapshots/{snap['id']}", expect=(204,))
    deadline = time.time() + 30  # removed in the background
    while os.path.exists(layer) and time.time() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(layer)
    assert host_markers.intact()


@pytest.mark.native_only(reason="the agent holds the writable layer's descriptor (fd 64, for snapshots) in native sandboxes only")
def test_layer_descriptor_is_out_of_reach(coved, make_sandbox):
    """The agent keeps the writable layer open for coved: no process of the sandbox can use
    that descriptor (not inherited, /proc/1/fd closed to it, pidfd_getfd refused)."""
    sid = make_sandbox()
    out = run_python(coved, sid, """
import ctypes, json, os
res = {}
res["own"] = os.path.exists('/proc/self/fd/64')
for what, path in [("ls", "/proc/1/fd"), ("open", "/proc/1/fd/64"), ("upper", "/proc/1/fd/64/upper")]:
    try:
        (os.listdir if what == "ls" else os.stat)(path)
        res[what] = "reached"
    except OSError as e:
        res[what] = e.errno
libc = ctypes.CDLL(None, use_errno=True)
pidfd = libc.syscall(434, 1, 0)  # pidfd_open(1)
fd = libc.syscall(438, pidfd, 64, 0) if pidfd >= 0 else -1  # pidfd_getfd
res["getfd"] = fd if fd < 0 else "reached"
res["getfd_errno"] = ctypes.get_errno()
print(json.dumps(res))
""")
    assert out["own"] is False, out
    # Listing /proc/1/fd shows numbers only (as for every descriptor of the agent's); what one
    # names cannot be opened.
    for k in ("open", "upper"):
        assert out[k] in (1, 13), out  # EPERM, EACCES
    assert out["getfd"] != "reached", out
    # And the sandbox is still snapshottable afterwards: the agent kept its descriptor.
    assert take(coved, sid)["status"]["state"] == "Ready"


@pytest.mark.native_only(reason="snapshots are refused (409 SNAPSHOT::UNSUPPORTED) by the oci and gvisor runtimes today")
def test_snapshot_churn_leaves_coved_and_others_fine(coved, make_sandbox):
    other = make_sandbox()
    run(coved, other, "echo steady > /root/s")
    sid = make_sandbox()
    run(coved, sid, "head -c 50000000 /dev/urandom > /root/blob")
    for _ in range(4):
        snap_id = coved.ok("POST", f"/v1/sandboxes/{sid}/snapshots", {}, expect=(202,))["id"]
        # One capture at a time per sandbox: a second one meanwhile is refused, not queued.
        status, resp, _ = coved.request("POST", f"/v1/sandboxes/{sid}/snapshots", {})
        state = coved.ok("GET", f"/v1/snapshots/{snap_id}")["status"]["state"]
        if status != 202:
            assert (status, resp["code"]) == (409, "SANDBOX::SNAPSHOT_IN_PROGRESS"), resp
        deadline = time.time() + 60
        while state == "Creating":
            assert time.time() < deadline
            time.sleep(0.05)
            state = coved.ok("GET", f"/v1/snapshots/{snap_id}")["status"]["state"]
        assert state == "Ready"
        coved.ok("DELETE", f"/v1/snapshots/{snap_id}", expect=(204,))
        if status == 202:  # the first had finished already: its twin goes too
            twin = resp["id"]
            while coved.ok("GET", f"/v1/snapshots/{twin}")["status"]["state"] == "Creating":
                time.sleep(0.05)
            coved.ok("DELETE", f"/v1/snapshots/{twin}", expect=(204,))
    assert coved.health()["status"] == "healthy"
    assert run(coved, other, "cat /root/s") == "steady"
    assert run(coved, sid, "stat -c %s /root/blob") == "50000000"
    deadline = time.time() + 30  # deleted snapshots are removed in the background
    while time.time() < deadline and [n for n in os.listdir(
            os.path.join(coved.state_dir, "snapshots")) if not n.startswith("snap-")]:
        time.sleep(0.05)
    assert [n for n in os.listdir(os.path.join(coved.state_dir, "snapshots"))
            if not n.startswith("snap-")] == []


@pytest.mark.native_only(reason="snapshots are refused (409 SNAPSHOT::UNSUPPORTED) by the oci and gvisor runtimes today")
def test_hard_links_cost_the_host_no_more_than_the_sandbox(coved, make_sandbox):
    """200 names of one 8 MiB file, and 60,000 names of one empty file: the snapshot keeps
    them as links (a copy per name would be 1.6 GB and 60,000 inodes on the host)."""
    sid = make_sandbox()
    run(coved, sid, "mkdir /root/l && cd /root/l && head -c 8388608 /dev/urandom > big && "
                    "for i in $(seq 199); do ln big big$i; done && : > e && "
                    "mkdir many && python3 -c \"import os\n"
                    "for i in range(60000): os.link('e', 'many/%d' % i)\"")
    snap = take(coved, sid)
    assert snap["status"]["state"] == "Ready", snap
    layer = os.path.join(coved.state_dir, "snapshots", snap["id"])
    used, inodes = 0, set()
    for top, dirs, files in os.walk(layer):
        for name in files:
            st = os.lstat(os.path.join(top, name))
            if st.st_ino not in inodes:
                inodes.add(st.st_ino)
                used += st.st_blocks * 512
    assert used < 16 << 20, used
    assert len(inodes) < 100, len(inodes)
    new = coved.ok("POST", "/v1/sandboxes", {"snapshotId": snap["id"]}, expect=(202,))["id"]
    try:
        assert run(coved, new, "stat -c %h /root/l/big; ls /root/l/many | wc -l; "
                               "cmp /root/l/big /root/l/big77 && echo same") == "200\n60000\nsame"
    finally:
        delete_and_check(coved, new)
    coved.ok("DELETE", f"/v1/snapshots/{snap['id']}", expect=(204,))
