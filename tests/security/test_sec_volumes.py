"""Volumes against hostile users and workloads: no way out of a bind through '..', symbolic
links (placed before the create, swapped in during it, or made by a sandbox in a volume), no
remount, bind or unmount that makes a read-only volume writable, nothing of one sandbox's
volume in another, and no file of host root's made through a volume. The host is checked
afterwards."""

import os
import shutil
import tempfile
import threading

import pytest

from covetest import serve

OWNER = 24680


@pytest.fixture(scope="module")
def host_root():
    d = tempfile.mkdtemp(prefix="cove-secvol-root-")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def outside():
    """A directory outside the allowed root, owned like the volumes, with a secret."""
    d = tempfile.mkdtemp(prefix="cove-secvol-outside-")
    os.chmod(d, 0o755)
    os.chown(d, OWNER, OWNER)
    with open(os.path.join(d, "secret.txt"), "w") as f:
        f.write("outside-secret\n")
    os.chown(os.path.join(d, "secret.txt"), OWNER, OWNER)
    yield d
    assert open(os.path.join(d, "secret.txt")).read() == "outside-secret\n"
    assert os.listdir(d) == ["secret.txt"], "nothing was written outside the root"
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def coved(host_root):
    with serve("--volume-host-root", host_root) as d:
        yield d


def owned_dir(root, name, files=None):
    path = os.path.join(root, name)
    os.makedirs(path, exist_ok=True)
    os.chown(path, OWNER, OWNER)
    for rel, data in (files or {}).items():
        with open(os.path.join(path, rel), "w") as f:
            f.write(data)
        os.chown(os.path.join(path, rel), OWNER, OWNER)
    return path


def attempt(coved, volumes):
    body = {"image": {"uri": "base"}, "entrypoint": ["sleep", "infinity"],
            "resourceLimits": {"cpu": "1", "memory": "256Mi"}, "volumes": volumes}
    status, answer, _ = coved.request("POST", "/v1/sandboxes", body)
    return status, answer


def host(path, mount="/v", **kw):
    return {"name": kw.pop("name", "h"), "host": {"path": path}, "mountPath": mount, **kw}


def test_symlinks_in_the_root_are_refused(coved, host_root, outside):
    os.symlink(outside, os.path.join(host_root, "link-out"))
    inner = owned_dir(host_root, "inner")
    os.symlink(outside, os.path.join(inner, "link-out"))
    os.symlink(inner, os.path.join(host_root, "link-in"))
    for volume in (host(os.path.join(host_root, "link-out")),
                   host(inner, subPath="link-out"),
                   host(os.path.join(host_root, "link-in")),  # even one that stays inside
                   host(os.path.join(host_root, "link-in", "link-out"))):
        status, body = attempt(coved, [volume])
        assert status == 400, (volume, body)
        assert body["code"] == "VOLUME::HOST_PATH_NOT_FOUND", body
        assert "symbolic link" in body["message"], body
    assert coved.ok("GET", "/v1/sandboxes")["items"] == []


def test_dot_dot_is_refused(coved, host_root, outside):
    rel = os.path.relpath(outside, host_root)
    inner = owned_dir(host_root, "dots")
    for volume, code in ((host(os.path.join(host_root, rel)), "VOLUME::INVALID_HOST_PATH"),
                         (host(host_root + "/dots/../.."), "VOLUME::INVALID_HOST_PATH"),
                         (host(inner, subPath="../" + rel), "VOLUME::INVALID_SUB_PATH"),
                         (host(inner, subPath="a/../../x"), "VOLUME::INVALID_SUB_PATH")):
        status, body = attempt(coved, [volume])
        assert status == 400 and body["code"] == code, (volume, body)


def test_symlink_swapped_in_during_creates(coved, host_root, outside):
    """A directory replaced by a symbolic link out of the root, over and over, while sandboxes
    are created on it: each create binds the real directory or fails; none sees outside."""
    real = owned_dir(host_root, "race-real", {"marker.txt": "inside\n"})
    target = os.path.join(host_root, "race")
    stop = threading.Event()

    def swap():
        link, moved = target + ".lnk", target + ".dir"
        os.symlink(outside, link)
        os.rename(real, moved)
        while not stop.is_set():
            os.rename(moved, target)   # the directory...
            os.rename(target, moved)
            os.replace(link, target)   # ...then the link, at the same name
            os.rename(target, link)
        os.rename(moved, real)
        os.unlink(link)

    t = threading.Thread(target=swap)
    t.start()
    mounted = refused = 0
    try:
        for _ in range(30):
            status, body = attempt(coved, [host(target, "/race")])
            if status != 202:
                assert status == 400, body
                refused += 1
                continue
            mounted += 1
            sid = body["id"]
            try:
                out = coved.sh(sid, "cat /race/* 2>&1; ls /race")
                assert "outside-secret" not in out and "secret.txt" not in out, out
                assert "inside" in out, out
            finally:
                coved.delete(sid)
    finally:
        stop.set()
        t.join()
    assert mounted + refused == 30
    print(f"race: {mounted} mounted, {refused} refused")


@pytest.mark.native_only(reason="volumes are refused (400) by the oci and gvisor runtimes today")
def test_read_only_volume_stays_read_only(coved, host_root):
    path = owned_dir(host_root, "ro", {"keep.txt": "keep\n"})
    status, body = attempt(coved, [host(path, "/ro", readOnly=True),
                                   {"name": "p", "pvc": {"claimName": "ro-named"},
                                    "mountPath": "/rop", "readOnly": True}])
    assert status == 202, body
    sid = body["id"]
    try:
        tricks = [
            "mount -o remount,rw /ro",
            "mount -o remount,rw,bind /ro",
            "mount --bind /ro /tmp/b && mount -o remount,rw,bind /tmp/b",
            "umount /ro",
            "umount -l /ro",
            "mount -o remount,rw /rop",
            "unshare -Urm sh -c 'mount -o remount,rw /ro && echo x > /ro/keep.txt'",
            "unshare -Urm sh -c 'mount -o remount,rw,bind /ro && echo x > /ro/keep.txt'",
            "unshare -Urm sh -c 'umount /ro && echo x > /ro/keep.txt'",
            "unshare -Urm sh -c 'mount --bind /ro /mnt && mount -o remount,rw,bind /mnt "
            "&& echo x > /mnt/keep.txt'",
        ]
        coved.sh(sid, "mkdir -p /tmp/b")
        for trick in tricks:
            r = coved.exec(sid, trick)
            assert "not found" not in r.stderr, (trick, r.stderr)
            assert r.exit_code != 0, (trick, r.stdout, r.stderr)
        # Still mounted, still read-only, writes still refused.
        for p in ("/ro", "/rop"):
            assert " ro," in coved.sh(sid, f"grep ' {p} ' /proc/mounts"), p
            r = coved.exec(sid, f"echo x > {p}/new; echo x >> {p}/keep.txt")
            assert r.exit_code != 0 and "Read-only" in r.stderr, r.stderr
        # A Python try at the syscalls, bypassing the tools.
        script = (
            "import ctypes, os\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "MS_REMOUNT, MS_BIND, MS_RDONLY = 32, 4096, 1\n"
            "r1 = libc.mount(b'none', b'/ro', None, MS_REMOUNT | MS_BIND, None)\n"
            "e1 = ctypes.get_errno()\n"
            "r2 = libc.umount2(b'/ro', 2)\n"
            "e2 = ctypes.get_errno()\n"
            "attr = (ctypes.c_uint64 * 4)(0, 1, 0, 0)  # attr_clr = MOUNT_ATTR_RDONLY\n"
            "r3 = libc.syscall(442, -100, b'/ro', 0, attr, 32)  # mount_setattr\n"
            "e3 = ctypes.get_errno()\n"
            "print(r1, e1, r2, e2, r3, e3)\n")
        out = coved.sh(sid, "python3 - <<'EOF'\n" + script + "EOF")
        r1, e1, r2, e2, r3, e3 = out.split()
        assert r1 == "-1" and r2 == "-1" and r3 == "-1", out
        assert e3 in ("1", "38"), out  # EPERM (ENOSYS if the filter has no such call)
    finally:
        coved.delete(sid)
    assert os.listdir(path) == ["keep.txt"]
    assert open(os.path.join(path, "keep.txt")).read() == "keep\n"
    coved.ok("DELETE", "/v1/volumes/ro-named", expect=(204,))


@pytest.mark.native_only(reason="volumes are refused (400) by the oci and gvisor runtimes today")
def test_links_made_inside_a_volume_do_not_lead_out(coved, host_root, outside):
    """A sandbox plants links in its volumes; a later volume naming them is refused rather
    than resolved on the host."""
    path = owned_dir(host_root, "planted")
    status, body = attempt(coved, [host(path, "/hv"),
                                   {"name": "p", "pvc": {"claimName": "planted"},
                                    "mountPath": "/pv"}])
    assert status == 202, body
    sid = body["id"]
    try:
        coved.sh(sid, f"ln -s {outside} /hv/out; ln -s / /hv/root; ln -s / /pv/root; "
                      f"ln -s /etc /pv/etc; mkdir /pv/d; ln -s {outside} /pv/d/out")
        # Inside, the links resolve in the sandbox's own root, not the host's.
        assert coved.exec(sid, f"cat /hv/out/secret.txt").exit_code != 0
    finally:
        coved.delete(sid)
    for volume in (host(path + "/out"), host(path + "/root"), host(path, subPath="out"),
                   {"name": "p", "pvc": {"claimName": "planted"}, "mountPath": "/x",
                    "subPath": "root"},
                   {"name": "p", "pvc": {"claimName": "planted"}, "mountPath": "/x",
                    "subPath": "etc"},
                   {"name": "p", "pvc": {"claimName": "planted"}, "mountPath": "/x",
                    "subPath": "d/out/more"}):
        status, body = attempt(coved, [volume])
        assert status == 400, (volume, body)
        assert "symbolic link" in body["message"], body
    coved.ok("DELETE", "/v1/volumes/planted", expect=(204,))


@pytest.mark.native_only(reason="volumes are refused (400) by the oci and gvisor runtimes today")
def test_mount_point_never_made_on_the_host(coved, host_root):
    """Mount points are made in the sandbox's root only: under the host's read-only /usr
    (bound into the base template) the create fails and the host's /usr is untouched."""
    path = owned_dir(host_root, "mp")
    status, body = attempt(coved, [host(path, "/tmp/ok/deeper")])
    assert status == 202, body
    coved.delete(body["id"])
    status, body = attempt(coved, [host(path, "/usr/cove-volume-mount-point")])
    assert status == 500 and body["code"] == "SANDBOX::START_FAILED", body
    assert "mount point" in body["message"], body
    assert not os.path.exists("/usr/cove-volume-mount-point")
    assert coved.ok("GET", "/v1/sandboxes")["items"] == []


@pytest.mark.native_only(reason="volumes are refused (400) by the oci and gvisor runtimes today")
def test_another_sandbox_sees_nothing_of_a_volume(coved, host_root):
    path = owned_dir(host_root, "private", {"only-a.txt": "cove-private-a\n"})
    status, body = attempt(coved, [host(path, "/mine"),
                                   {"name": "p", "pvc": {"claimName": "private-a"},
                                    "mountPath": "/pa"}])
    assert status == 202
    a = body["id"]
    status, body = attempt(coved, [])
    b = body["id"]
    try:
        coved.sh(a, "echo cove-private-named > /pa/n.txt")
        out = coved.sh(b, "echo cove-private-canary > /tmp/c; grep -rl cove-private /tmp /root "
                          "/home /mnt /srv /opt /var /etc /run /dev/shm /mine /pa 2>/dev/null; "
                          "ls -d /mine /pa 2>/dev/null; true")
        assert out.split() == ["/tmp/c"], out
        assert " /mine " not in coved.sh(b, "cat /proc/mounts")
    finally:
        coved.delete(a)
        coved.delete(b)
    coved.ok("DELETE", "/v1/volumes/private-a", expect=(204,))


@pytest.mark.native_only(reason="volumes are refused (400) by the oci and gvisor runtimes today")
def test_no_host_root_files_through_a_bind(coved, host_root):
    """Only the bind's owner is mapped: set-id files made inside belong to that owner, other
    users of the sandbox cannot write, and nothing inside is executed set-id."""
    path = owned_dir(host_root, "suid")
    status, body = attempt(coved, [host(path, "/s")])
    assert status == 202
    sid = body["id"]
    try:
        coved.sh(sid, "cp /bin/sh /s/sh; chmod 4755 /s/sh; touch /s/f")
        r = coved.exec(sid, "chown 1000:1000 /s/f")
        assert r.exit_code != 0, "no other host id can be given through the bind"
        r = coved.exec(sid, "setpriv --reuid 1000 --regid 1000 --clear-groups touch /s/other")
        assert r.exit_code != 0, r.stdout
        assert "nosuid" in coved.sh(sid, "grep ' /s ' /proc/mounts")
    finally:
        coved.delete(sid)
    for name in os.listdir(path):
        st = os.lstat(os.path.join(path, name))
        assert (st.st_uid, st.st_gid) == (OWNER, OWNER), (name, st)
    assert sorted(os.listdir(path)) == ["f", "sh"]


@pytest.mark.native_only(reason="volumes are refused (400) by the oci and gvisor runtimes today")
def test_no_escape_through_dot_dot_after_a_rename(coved, host_root):
    """The bind-mount escape: sandbox A binds P/inner and sits in P/inner/d; sandbox B, which
    binds P, moves d out of inner. A's `..` must not climb past its mount into P, nor on to
    the host's root."""
    p = owned_dir(host_root, "renamed", {"p-only.txt": "cove-canary-p\n"})
    inner = owned_dir(p, "inner")
    owned_dir(inner, "d")
    marker = tempfile.NamedTemporaryFile(prefix="cove-secvol-marker-", dir="/tmp", delete=False)
    marker.write(b"cove-canary-host\n")
    marker.close()
    status, body = attempt(coved, [host(p, "/a", subPath="inner")])
    assert status == 202, body
    a = body["id"]
    status, body = attempt(coved, [host(p, "/b")])
    assert status == 202, body
    b = body["id"]
    seen = {}

    def in_a():
        seen["out"] = coved.exec(a, (
            "cd /a/d || exit 9; touch ready; "
            "for i in $(seq 200); do [ -e moved ] && break; sleep 0.05; done; "
            "[ -e moved ] || echo not-moved; "
            "for i in 1 2 3 4 5 6 7 8; do cd .. 2>&1 || break; pwd; ls -a 2>&1; done; "
            "cat ../p-only.txt ../../p-only.txt 2>&1; "
            f"ls /tmp/ ../../../../../../tmp 2>&1; true"), http_timeout=60).stdout

    t = threading.Thread(target=in_a)
    t.start()
    try:
        coved.sh(b, "for i in $(seq 200); do [ -e /b/inner/d/ready ] && break; sleep 0.05; done;"
                    " mv /b/inner/d /b/d && touch /b/d/moved")
    finally:
        t.join()
        coved.delete(a)
        coved.delete(b)
        os.unlink(marker.name)
    out = seen.get("out", "")
    assert "not-moved" not in out, out
    lines = [line.strip() for line in out.splitlines()]
    assert "cove-canary-p" not in out and "p-only.txt" not in lines, out
    assert os.path.basename(marker.name) not in out, out
