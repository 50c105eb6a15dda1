"""Volumes (sandbox-lifecycle.yml `Volume`): host binds under the allowed roots, read-only ones,
subPath, named (pvc) volumes kept across sandboxes and restarts and shared, the size cap,
GET/DELETE /v1/volumes and `cove volume`, and the refusals."""

import json
import os
import shutil
import signal
import subprocess
import tempfile

import pytest

from covetest import CLI, ApiError, Coved, serve

OWNER = 23456  # host uid and gid of the bound directories: root inside
OTHER_KEY = "volume-other-key"


@pytest.fixture(scope="module")
def host_root():
    d = tempfile.mkdtemp(prefix="cove-vol-root-")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def coved(host_root):
    with serve("--volume-host-root", host_root, api_keys=("test-key", OTHER_KEY),
               admin_keys=("volume-admin",)) as d:
        yield d


def owned_dir(root, name, files=None):
    path = os.path.join(root, name)
    os.makedirs(path, exist_ok=True)
    os.chown(path, OWNER, OWNER)
    for rel, data in (files or {}).items():
        p = os.path.join(path, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(data)
        os.chown(p, OWNER, OWNER)
        os.chown(os.path.dirname(p), OWNER, OWNER)
    return path


def host_volume(path, mount, **kw):
    v = {"name": kw.pop("name", "h"), "host": {"path": path}, "mountPath": mount}
    v.update(kw)
    return v


def pvc_volume(claim, mount, name="p", sub_path=None, read_only=False, **pvc):
    v = {"name": name, "pvc": {"claimName": claim, **pvc}, "mountPath": mount,
         "readOnly": read_only}
    if sub_path is not None:
        v["subPath"] = sub_path
    return v


def create_error(coved, volumes, key=None):
    body = {"image": {"uri": "base"}, "entrypoint": ["sleep", "infinity"],
            "resourceLimits": {"cpu": "1", "memory": "256Mi"}, "volumes": volumes}
    status, answer, _ = coved.request("POST", "/v1/sandboxes", body,
                                      headers=coved.headers(key))
    return status, answer


def volumes_of(coved, key=None):
    return {v["name"]: v for v in coved.ok("GET", "/v1/volumes",
                                           headers=coved.headers(key))["items"]}


@pytest.mark.native_only(reason="volumes are refused (400) by the oci and gvisor runtimes today")
def test_host_bind_read_write(coved, host_root):
    path = owned_dir(host_root, "rw", {"hello.txt": "from the host\n"})
    sid = coved.create(volumes=[host_volume(path, "/mnt/work")])
    try:
        assert coved.sh(sid, "cat /mnt/work/hello.txt") == "from the host\n"
        # The directory's owner is root inside; what root writes is the owner's on the host.
        assert coved.sh(sid, "stat -c %u:%g /mnt/work /mnt/work/hello.txt").split() == \
            ["0:0", "0:0"]
        coved.sh(sid, "echo from the sandbox > /mnt/work/out.txt; mkdir /mnt/work/d")
        st = os.stat(os.path.join(path, "out.txt"))
        assert (st.st_uid, st.st_gid) == (OWNER, OWNER)
        assert open(os.path.join(path, "out.txt")).read() == "from the sandbox\n"
        assert os.stat(os.path.join(path, "d")).st_uid == OWNER
        # The host's changes are seen at once (a bind, not a copy).
        with open(os.path.join(path, "late.txt"), "w") as f:
            f.write("later\n")
        assert coved.sh(sid, "cat /mnt/work/late.txt") == "later\n"
    finally:
        coved.delete(sid)
    assert os.path.exists(os.path.join(path, "out.txt")), "the host's files outlive the sandbox"


@pytest.mark.native_only(reason="volumes are refused (400) by the oci and gvisor runtimes today")
def test_host_bind_read_only(coved, host_root):
    path = owned_dir(host_root, "ro", {"keep.txt": "keep\n"})
    sid = coved.create(volumes=[host_volume(path, "/ro", readOnly=True)])
    try:
        assert coved.sh(sid, "cat /ro/keep.txt") == "keep\n"
        r = coved.exec(sid, "echo x > /ro/new.txt")
        assert r.exit_code != 0 and "Read-only file system" in r.stderr, r.stderr
        r = coved.exec(sid, "echo x >> /ro/keep.txt; rm -f /ro/keep.txt; touch /ro/keep.txt")
        assert r.exit_code != 0
        assert " ro," in coved.sh(sid, "grep ' /ro ' /proc/mounts")
    finally:
        coved.delete(sid)
    assert os.listdir(path) == ["keep.txt"]
    assert open(os.path.join(path, "keep.txt")).read() == "keep\n"


@pytest.mark.native_only(reason="volumes are refused (400) by the oci and gvisor runtimes today")
def test_host_sub_path_and_file(coved, host_root):
    path = owned_dir(host_root, "sub", {"a/b/inner.txt": "inner\n", "top.txt": "top\n"})
    sid = coved.create(volumes=[host_volume(path, "/inner", subPath="a/b"),
                                host_volume(path + "/top.txt", "/etc/top.txt", name="f")])
    try:
        assert coved.sh(sid, "ls /inner") == "inner.txt\n"
        assert coved.sh(sid, "cat /etc/top.txt") == "top\n"
    finally:
        coved.delete(sid)


@pytest.mark.native_only(reason="volumes are refused (400) by the oci and gvisor runtimes today")
def test_named_volume_kept_and_shared(coved):
    a = coved.create(volumes=[pvc_volume("shared-data", "/data")])
    b = None
    try:
        coved.sh(a, "echo one > /data/f; mkdir -p /data/sub; echo deep > /data/sub/g")
        b = coved.create(volumes=[pvc_volume("shared-data", "/srv/d")])
        assert coved.sh(b, "cat /srv/d/f") == "one\n"
        coved.sh(b, "echo two >> /srv/d/f")
        assert coved.sh(a, "cat /data/f") == "one\ntwo\n", "both see the same files at once"
        v = volumes_of(coved)["shared-data"]
        assert sorted(v["sandboxes"]) == sorted([a, b])
        assert v["sizeBytes"] == 1 << 30 and v["autoCreated"] is True
        status, body, _ = coved.request("DELETE", "/v1/volumes/shared-data")
        assert status == 409 and body["code"] == "VOLUME::IN_USE", body
    finally:
        coved.delete(a)
        if b:
            coved.delete(b)
    assert volumes_of(coved)["shared-data"]["sandboxes"] == []
    # Kept after its sandboxes: a new one finds the files; subPath picks a directory of it.
    c = coved.create(volumes=[pvc_volume("shared-data", "/data", sub_path="sub",
                                         read_only=True)])
    try:
        assert coved.sh(c, "ls /data; cat /data/g") == "g\ndeep\n"
        assert coved.exec(c, "touch /data/x").exit_code != 0
        # Files are stored with the sandboxes' canonical ids: root's here is root's there.
        assert coved.sh(c, "stat -c %u /data/g") == "0\n"
    finally:
        coved.delete(c)
    coved.ok("DELETE", "/v1/volumes/shared-data", expect=(204,))
    assert "shared-data" not in volumes_of(coved)
    assert not os.path.exists(os.path.join(coved.state_dir, "volumes", "shared-data.img"))
    status, body, _ = coved.request("GET", "/v1/volumes/shared-data")
    assert status == 404 and body["code"] == "VOLUME::NOT_FOUND"


@pytest.mark.native_only(reason="volumes are refused (400) by the oci and gvisor runtimes today")
def test_named_volume_size_cap(coved):
    sid = coved.create(volumes=[pvc_volume("small", "/small", storage="20Mi",
                                           deleteOnSandboxTermination=True)])
    try:
        r = coved.exec(sid, "dd if=/dev/zero of=/small/fill bs=1M count=64 2>&1; sync")
        assert "No space left on device" in r.stdout + r.stderr, r.stdout
        used = int(coved.sh(sid, "du -sm /small/fill | cut -f1"))
        assert used < 21
        assert volumes_of(coved)["small"]["sizeBytes"] == 20 << 20
    finally:
        coved.delete(sid)
    # deleteOnSandboxTermination: gone with its last sandbox.
    assert "small" not in volumes_of(coved)
    assert not os.path.exists(os.path.join(coved.state_dir, "volumes", "small.img"))


@pytest.mark.native_only(reason="volumes are refused (400) by the oci and gvisor runtimes today")
def test_delete_on_termination_waits_for_the_last_user(coved):
    a = coved.create(volumes=[pvc_volume("scratch", "/s", deleteOnSandboxTermination=True)])
    b = coved.create(volumes=[pvc_volume("scratch", "/s")])
    coved.delete(a)
    assert volumes_of(coved)["scratch"]["sandboxes"] == [b]
    coved.delete(b)
    assert "scratch" not in volumes_of(coved)


@pytest.mark.native_only(reason="volumes are refused (400) by the oci and gvisor runtimes today")
def test_named_volume_beyond_the_hosts_disk(coved):
    """An image's blocks are reserved at creation: one larger than the free space is refused
    rather than promised (it would fail with I/O errors once the disk filled)."""
    st = os.statvfs(os.path.join(coved.state_dir, "volumes"))
    too_big = (st.f_bavail * st.f_frsize + (64 << 30)) >> 30
    status, body = create_error(coved, [pvc_volume("huge", "/h", storage=f"{too_big}Gi")])
    assert status == 409 and body["code"] == "VOLUME::NO_SPACE", body
    assert "huge" not in volumes_of(coved)
    assert not os.path.exists(os.path.join(coved.state_dir, "volumes", "huge.img"))
    # A create that fails leaves none of the volumes it made behind.
    status, body = create_error(coved, [pvc_volume("first", "/f"),
                                        pvc_volume("huge", "/h", name="q", storage=f"{too_big}Gi")])
    assert status == 409 and body["code"] == "VOLUME::NO_SPACE", body
    assert "first" not in volumes_of(coved)
    assert not os.path.exists(os.path.join(coved.state_dir, "volumes", "first.img"))
    status, body = create_error(coved, [pvc_volume("second", "/s", sub_path="x"),
                                        host_volume("/etc", "/e")])
    assert status == 400 and "second" not in volumes_of(coved), body
    # A volume that fits has its blocks allocated, not a sparse promise.
    sid = coved.create(volumes=[pvc_volume("reserved", "/r", storage="64Mi",
                                           deleteOnSandboxTermination=True)])
    try:
        img = os.stat(os.path.join(coved.state_dir, "volumes", "reserved.img"))
        assert img.st_blocks * 512 >= 64 << 20, img
    finally:
        coved.delete(sid)


@pytest.mark.native_only(reason="volumes are refused (400) by the oci and gvisor runtimes today")
def test_failed_set_up_leaves_no_volume_it_made(coved):
    """The set-up fails (a mount point on the read-only /usr): the volume this create made goes
    with it; one that existed before stays."""
    keep = coved.create(volumes=[pvc_volume("existing", "/e")])
    coved.delete(keep)
    status, body = create_error(coved, [pvc_volume("made-now", "/usr/cove-x"),
                                        pvc_volume("existing", "/e", name="q")])
    assert status == 500 and body["code"] == "SANDBOX::START_FAILED", body
    names = volumes_of(coved)
    assert "made-now" not in names and names["existing"]["sandboxes"] == []
    assert not os.path.exists(os.path.join(coved.state_dir, "volumes", "made-now.img"))
    coved.ok("DELETE", "/v1/volumes/existing", expect=(204,))


def test_named_volume_missing_when_not_created(coved):
    status, body = create_error(coved, [pvc_volume("never-made", "/x", createIfNotExists=False)])
    assert status == 404 and body["code"] == "VOLUME::PVC_NOT_FOUND", body
    assert "never-made" not in volumes_of(coved)


@pytest.mark.native_only(reason="volumes are refused (400) by the oci and gvisor runtimes today")
def test_volumes_are_scoped_by_key(coved):
    sid = coved.create(volumes=[pvc_volume("mine", "/m")])
    try:
        assert "mine" not in volumes_of(coved, OTHER_KEY)
        status, body, _ = coved.request("GET", "/v1/volumes/mine",
                                        headers=coved.headers(OTHER_KEY))
        assert status == 404
        status, body, _ = coved.request("DELETE", "/v1/volumes/mine",
                                        headers=coved.headers(OTHER_KEY))
        assert status == 404
        status, body = create_error(coved, [pvc_volume("mine", "/m")], key=OTHER_KEY)
        assert status == 409 and body["code"] == "VOLUME::NAME_TAKEN", body
        assert "mine" in volumes_of(coved, "volume-admin"), "an admin key sees every volume"
    finally:
        coved.delete(sid)
    coved.ok("DELETE", "/v1/volumes/mine", expect=(204,))


@pytest.mark.parametrize("volume,code", [
    ({"name": "o", "ossfs": {"bucket": "b", "endpoint": "e", "accessKeyId": "i",
                             "accessKeySecret": "s"}, "mountPath": "/o"},
     "VOLUME::UNSUPPORTED_BACKEND"),
    ({"name": "n", "mountPath": "/n"}, "VOLUME::INVALID_BACKEND"),
    ({"name": "n", "host": {"path": "/tmp"}, "pvc": {"claimName": "x"}, "mountPath": "/n"},
     "VOLUME::INVALID_BACKEND"),
    ({"name": "Bad_Name", "pvc": {"claimName": "x"}, "mountPath": "/n"}, "VOLUME::INVALID_NAME"),
    ({"name": "n", "pvc": {"claimName": "Bad_Claim"}, "mountPath": "/n"},
     "VOLUME::INVALID_PVC_NAME"),
    ({"name": "n", "pvc": {"claimName": "x"}, "mountPath": "relative"},
     "VOLUME::INVALID_MOUNT_PATH"),
    ({"name": "n", "pvc": {"claimName": "x"}, "mountPath": "/a/../b"},
     "VOLUME::INVALID_MOUNT_PATH"),
    ({"name": "n", "pvc": {"claimName": "x"}, "mountPath": "/proc/sys"},
     "VOLUME::INVALID_MOUNT_PATH"),
    ({"name": "n", "pvc": {"claimName": "x"}, "mountPath": "/"}, "VOLUME::INVALID_MOUNT_PATH"),
    ({"name": "n", "pvc": {"claimName": "x"}, "mountPath": "/etc"},
     "VOLUME::INVALID_MOUNT_PATH"),
    ({"name": "n", "pvc": {"claimName": "x"}, "mountPath": "/n", "subPath": "../up"},
     "VOLUME::INVALID_SUB_PATH"),
    ({"name": "n", "pvc": {"claimName": "x"}, "mountPath": "/n", "subPath": "/abs"},
     "VOLUME::INVALID_SUB_PATH"),
    ({"name": "n", "pvc": {"claimName": "x", "storage": "1Ki"}, "mountPath": "/n"},
     "VOLUME::INVALID_STORAGE"),
    ({"name": "n", "pvc": {"claimName": "x"}, "mountPath": "/n", "extra": 1}, "VOLUME::INVALID"),
    ({"name": "n", "host": {"path": "tmp/x"}, "mountPath": "/n"}, "VOLUME::INVALID_HOST_PATH"),
])
def test_bad_volumes_refused(coved, volume, code):
    before = volumes_of(coved, "volume-admin")
    sandboxes = coved.ok("GET", "/v1/sandboxes")["items"]
    status, body = create_error(coved, [volume])
    assert status == 400 and body["code"] == code, body
    assert volumes_of(coved, "volume-admin") == before
    assert coved.ok("GET", "/v1/sandboxes")["items"] == sandboxes


def test_duplicate_names_and_mount_paths(coved, host_root):
    status, body = create_error(coved, [pvc_volume("x", "/a"), pvc_volume("y", "/b")])
    assert status == 400 and body["code"] == "VOLUME::DUPLICATE_NAME"
    status, body = create_error(coved, [pvc_volume("x", "/a"),
                                        pvc_volume("y", "/a", name="q")])
    assert status == 400 and body["code"] == "VOLUME::DUPLICATE_MOUNT_PATH"


def test_host_path_outside_the_roots(coved, host_root):
    status, body = create_error(coved, [host_volume("/etc", "/mnt/etc")])
    assert status == 400 and body["code"] == "VOLUME::HOST_PATH_NOT_ALLOWED", body
    # A sibling whose name starts like the root is not under it.
    sibling = host_root + "-sibling"
    os.makedirs(sibling, exist_ok=True)
    try:
        status, body = create_error(coved, [host_volume(sibling, "/mnt/s")])
        assert status == 400 and body["code"] == "VOLUME::HOST_PATH_NOT_ALLOWED", body
    finally:
        os.rmdir(sibling)
    status, body = create_error(coved, [host_volume(host_root + "/missing", "/mnt/m")])
    assert status == 400 and body["code"] == "VOLUME::HOST_PATH_NOT_FOUND", body
    # Host root's directories are never handed to a sandbox's root.
    rootdir = os.path.join(host_root, "root-owned")
    os.makedirs(rootdir, exist_ok=True)
    status, body = create_error(coved, [host_volume(rootdir, "/mnt/r")])
    assert status == 400 and body["code"] == "VOLUME::HOST_PATH_OWNED_BY_ROOT", body


def test_host_volumes_off_without_roots():
    with serve() as d:
        status, body = create_error(d, [host_volume("/tmp", "/mnt/tmp")])
        assert status == 400 and body["code"] == "VOLUME::HOST_PATH_NOT_ALLOWED"
        assert "volume-host-root" in body["message"], body["message"]
        assert d.ok("GET", "/v1/sandboxes")["items"] == []


@pytest.mark.native_only(reason="volumes are refused (400) by the oci and gvisor runtimes today")
def test_restart_keeps_volumes_and_users(host_root):
    d = Coved(extra_args=["--volume-host-root", host_root])
    try:
        d.start()
        sid = d.create(volumes=[pvc_volume("durable", "/d")])
        d.sh(sid, "echo kept > /d/f")
        d.kill(signal.SIGTERM)
        d.start()
        # The re-adopted sandbox still has its mount, and still counts as a user.
        assert d.sh(sid, "cat /d/f") == "kept\n"
        v = volumes_of(d)["durable"]
        assert v["sandboxes"] == [sid]
        status, body, _ = d.request("DELETE", "/v1/volumes/durable")
        assert status == 409
        # A new sandbox mounts the same filesystem (the same loop device, not a second one).
        other = d.create(volumes=[pvc_volume("durable", "/d")])
        d.sh(other, "echo more >> /d/f")
        assert d.sh(sid, "cat /d/f") == "kept\nmore\n"
        d.delete(sid)
        d.delete(other)
        d.ok("DELETE", "/v1/volumes/durable", expect=(204,))
    finally:
        d.cleanup()


@pytest.mark.native_only(reason="volumes are refused (400) by the oci and gvisor runtimes today")
def test_cli_volume_commands(coved, host_root):
    path = owned_dir(host_root, "cli", {"c.txt": "cli\n"})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COVE_", "OPEN_SANDBOX"))}
    env.update(COVE_SERVER=f"http://127.0.0.1:{coved.port}", COVE_API_KEY=coved.key,
               COVE_CONFIG_FILE=os.path.join(coved.state_dir, "none.ini"))

    def cove(*args, check=True):
        r = subprocess.run([CLI, *args], capture_output=True, text=True, env=env, timeout=120)
        assert not check or r.returncode == 0, r.stderr
        return r

    sid = cove("create", "--volume", f"host:{path}:/mnt/c:ro",
               "--volume", "pvc:cli-vol/sub:/data:size=32Mi").stdout.strip()
    try:
        assert coved.sh(sid, "cat /mnt/c/c.txt") == "cli\n"
        assert coved.exec(sid, "touch /mnt/c/x").exit_code != 0
        coved.sh(sid, "echo y > /data/y")
        listed = json.loads(cove("volume", "ls", "-o", "json").stdout)["items"]
        assert [v["name"] for v in listed] == ["cli-vol"]
        assert listed[0]["sizeBytes"] == 32 << 20 and listed[0]["sandboxes"] == [sid]
        table = cove("volume", "ls").stdout.splitlines()
        assert table[0].split() == ["NAME", "SIZE", "SANDBOXES", "CREATED", "AUTO_DELETE"]
        assert table[1].split()[:3] == ["cli-vol", "32Mi", sid], table
        r = cove("volume", "rm", "cli-vol", check=False)
        assert r.returncode != 0 and "VOLUME::IN_USE" in r.stderr
    finally:
        coved.delete(sid)
    assert cove("volume", "rm", "cli-vol").stdout.strip() == "cli-vol"
    assert "cli-vol" not in volumes_of(coved)
    r = cove("create", "--volume", "nfs:/x:/y", check=False)
    assert r.returncode != 0 and "--volume expects" in r.stderr
