"""Hostile image layers (issue 13), pushed to a test registry on loopback and pulled by coved:
path escapes ("..", absolute names, writes through a symlink, a hard link to /etc/shadow),
device nodes, set-id binaries and a decompression bomb beyond the store's budget. Each either
fails clearly (an IMAGE:: error, nothing half-made in the store) or is neutralised in the
unpacked layer; the host is untouched, coved stays healthy and the next sandbox is fine."""

import hashlib
import os
import secrets
import stat
import tarfile
import time

import pytest

import image_build as ib
import registry_world as rw
from covetest import serve

BUDGET = 256 << 20  # --image-store-max-bytes of this module's daemon
SLEEP = ["/bin/sleep", "3600"]
HOST_FILES = ["/etc/passwd", "/etc/shadow", "/etc/hostname", "/etc/hosts"]


@pytest.fixture(scope="module")
def coved():
    with serve("--image-store-max-bytes", str(BUDGET)) as d:
        yield d


@pytest.fixture(scope="module")
def registry():
    with rw.running_registry("none", address="127.77.2.20") as reg:
        yield reg


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("hostile-images")


@pytest.fixture(scope="module")
def good(registry, workdir):
    """A well-formed image: what a sandbox is made from after each attack."""
    img = ib.busybox_image(user="")
    registry.push_image(img, "team/good:v1", workdir)
    return registry.ref("team/good:v1")


def file_hashes(paths):
    out = {}
    for p in paths:
        try:
            st = os.lstat(p)
            with open(p, "rb") as f:
                out[p] = (hashlib.sha256(f.read()).hexdigest(), st.st_mode, st.st_uid,
                          st.st_nlink)
        except OSError:
            out[p] = None
    return out


def store(d, *parts):
    return os.path.join(d.state_dir, "images", *parts)


def leftovers_now(d):
    layers = store(d, "layers")
    tmp = store(d, "tmp")
    return ([n for n in (os.listdir(layers) if os.path.isdir(layers) else [])
             if not n.startswith("sha256-")] + (os.listdir(tmp) if os.path.isdir(tmp) else []))


def leftovers(d, wait_s=10.0):
    """What is left half-made once coved has had a moment (removal may finish in the
    background after the answer); [] as soon as nothing is."""
    deadline = time.monotonic() + wait_s
    while True:
        left = leftovers_now(d)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def member(name, type_=tarfile.REGTYPE, linkname="", mode=0o644, uid=0, gid=0, devmajor=0,
           devminor=0):
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode, info.uid, info.gid = type_, linkname, mode, uid, gid
    info.devmajor, info.devminor, info.mtime = devmajor, devminor, ib.MTIME
    return info


def hostile_image(members):
    """busybox, then one layer of the given (TarInfo, data or None) members."""
    t = ib.Tar()
    for info, data in members:
        t.raw(info, data)
    return ib.single_layer_image(t.bytes())


def scan_layers(d):
    """What the unpacked store holds that it must not: set-id files, device nodes other than
    0/0 whiteouts, a hard link to the host's /etc/shadow."""
    bad = []
    shadow = os.stat("/etc/shadow")
    root = store(d, "layers")
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                bad.append(f"set-id {p}")
            if (stat.S_ISCHR(st.st_mode) and st.st_rdev != 0) or stat.S_ISBLK(st.st_mode):
                bad.append(f"device {p}")
            if (st.st_dev, st.st_ino) == (shadow.st_dev, shadow.st_ino):
                bad.append(f"hard link to /etc/shadow {p}")
    return bad


def escaped(d, name):
    """Where a file named `name` turned up outside the unpacked layers (which may hold it
    under a sanitised name): the host's usual places and the whole state dir."""
    found = [os.path.join(top, name) for top in ("/", "/tmp", "/etc", "/root", "/var/tmp",
                                                 os.path.dirname(d.state_dir.rstrip("/")))
             if os.path.lexists(os.path.join(top, name))]
    for dirpath, dirnames, filenames in os.walk(d.state_dir):
        if os.path.basename(dirpath).startswith("sha256-") or dirpath.endswith("/run"):
            dirnames[:] = []
            continue
        if name in filenames or name in dirnames:
            found.append(os.path.join(dirpath, name))
    return found


def attack(d, registry, workdir, good, members, name, must_succeed=False, check=None):
    """Pushes the hostile image, creates a sandbox from it and checks the outcome."""
    before = file_hashes(HOST_FILES)
    img = hostile_image(members)
    repo = f"hostile/{name}-{secrets.token_hex(3)}:v1"
    registry.push_image(img, repo, workdir)
    status, body, _ = d.request("POST", "/v1/sandboxes", {
        "image": {"uri": registry.ref(repo)}, "entrypoint": SLEEP,
        "resourceLimits": {"cpu": "1", "memory": "256Mi"}}, timeout=300)
    sid = body.get("id") if status == 202 and isinstance(body, dict) else None
    try:
        if must_succeed:
            assert status == 202, (status, body)
        if sid is None:
            assert 400 <= status < 600 and status != 500, (status, body)
            assert str(body.get("code", "")).startswith("IMAGE::") and body.get("message"), body
            assert leftovers(d) == []
        elif check:
            check(d, sid)
        assert scan_layers(d) == []
        assert file_hashes(HOST_FILES) == before
        assert d.health()
    finally:
        if sid:
            d.delete(sid)
    # The next sandbox, from a good image, is fine.
    status, body, _ = d.request("POST", "/v1/sandboxes", {
        "image": {"uri": good}, "entrypoint": SLEEP}, timeout=300)
    assert status == 202, (status, body)
    try:
        assert d.sh(body["id"], "cat /etc/motd; ls /opt/lower") == "three\nnew\n"
    finally:
        d.delete(body["id"])
    return status


@pytest.mark.static_agent
def test_dot_dot_entries_do_not_escape(coved, registry, workdir, good, host_markers):
    mark = "cove-escape-" + secrets.token_hex(6)
    members = [(member("../../" + mark), b"escaped\n"),
               (member("../../../../../../../../tmp/" + mark), b"escaped\n"),
               (member("etc/../../" + mark + "-b"), b"escaped\n"),
               (member("ok/../../../" + mark + "-c", type_=tarfile.DIRTYPE, mode=0o755), None)]
    attack(coved, registry, workdir, good, members, "dotdot")
    for m in (mark, mark + "-b", mark + "-c"):
        assert escaped(coved, m) == [], m
    assert host_markers.intact()


@pytest.mark.static_agent
def test_absolute_names_stay_inside(coved, registry, workdir, good, host_markers):
    mark = "cove-abs-" + secrets.token_hex(6)

    def check(d, sid):
        # If kept, it is the image's /tmp, not the host's.
        r = d.exec(sid, f"cat /tmp/{mark} 2>/dev/null; true")
        assert r.stdout in ("", "absolute\n"), r.stdout

    members = [(member("/tmp/" + mark), b"absolute\n"),
               (member("/etc/" + mark), b"absolute\n")]
    attack(coved, registry, workdir, good, members, "absolute", check=check)
    assert not os.path.exists("/tmp/" + mark) and not os.path.exists("/etc/" + mark)
    assert host_markers.intact()


@pytest.mark.static_agent
def test_nothing_is_written_through_a_symlink(coved, registry, workdir, good, host_markers):
    mark = "cove-through-" + secrets.token_hex(6)

    def check(d, sid):
        assert "pwned" not in d.sh(sid, "cat /etc/passwd")

    members = [(member("evil", tarfile.SYMTYPE, "/etc", mode=0o777), None),
               (member("evil/passwd"), b"pwned::0:0::/:/bin/sh\n"),
               (member("evil2", tarfile.SYMTYPE, "/tmp", mode=0o777), None),
               (member("evil2/" + mark), b"pwned\n"),
               (member("up", tarfile.SYMTYPE, "../../../../../../tmp", mode=0o777), None),
               (member("up/" + mark + "-rel"), b"pwned\n")]
    attack(coved, registry, workdir, good, members, "symlink", check=check)
    assert not os.path.exists("/tmp/" + mark) and not os.path.exists("/tmp/" + mark + "-rel")
    assert escaped(coved, mark) == []
    assert host_markers.intact()


@pytest.mark.static_agent
def test_hard_link_to_a_host_file_is_refused(coved, registry, workdir, good, host_markers):
    shadow = open("/etc/shadow", "rb").read()

    def check(d, sid):
        for p in ("/shadow-link", "/shadow-up", "/etc/shadow-abs"):
            r = d.exec(sid, f"cat {p} 2>/dev/null; true")
            assert r.stdout.encode() != shadow and "root:" not in r.stdout, p

    members = [(member("shadow-link", tarfile.LNKTYPE, "/etc/shadow"), None),
               (member("shadow-up", tarfile.LNKTYPE, "../../../../../../etc/shadow"), None),
               (member("etc/shadow-abs", tarfile.LNKTYPE, "/etc/shadow"), None)]
    nlink = os.stat("/etc/shadow").st_nlink
    attack(coved, registry, workdir, good, members, "hardlink", check=check)
    assert os.stat("/etc/shadow").st_nlink == nlink
    assert host_markers.intact()


@pytest.mark.static_agent
def test_device_nodes_are_skipped(coved, registry, workdir, good, host_markers):
    def check(d, sid):
        out = d.sh(sid, "for f in /dev-mem /disk /dev/evil-kmsg; do "
                        "test -c $f -o -b $f && echo DEVICE $f; done; true")
        assert "DEVICE" not in out, out

    members = [(member("dev-mem", tarfile.CHRTYPE, devmajor=1, devminor=1, mode=0o666), None),
               (member("disk", tarfile.BLKTYPE, devmajor=8, devminor=0, mode=0o666), None),
               (member("dev/evil-kmsg", tarfile.CHRTYPE, devmajor=1, devminor=11, mode=0o666),
                None),
               (member("fifo", tarfile.FIFOTYPE, mode=0o644), None),
               (member("after-devices"), b"still here\n")]
    attack(coved, registry, workdir, good, members, "devices", must_succeed=True, check=check)
    assert host_markers.intact()


@pytest.mark.static_agent
def test_set_id_bits_are_dropped(coved, registry, workdir, good, host_markers):
    data = open(ib.BUSYBOX, "rb").read()

    def check(d, sid):
        out = d.sh(sid, "stat -c '%a %n' /bin/suid-busybox /bin/sgid-file /opt/sticky-dir")
        modes = dict(reversed(l.split()) for l in out.splitlines())
        assert modes["/bin/suid-busybox"] == "755" and modes["/bin/sgid-file"] == "755", modes
        assert modes["/opt/sticky-dir"] in ("755", "1755"), modes

    members = [(member("bin/suid-busybox", mode=0o4755), data),
               (member("bin/sgid-file", mode=0o2755), b"#!/bin/sh\nid\n"),
               (member("opt/", tarfile.DIRTYPE, mode=0o755), None),
               (member("opt/sticky-dir", tarfile.DIRTYPE, mode=0o7755), None)]
    attack(coved, registry, workdir, good, members, "setid", must_succeed=True, check=check)
    assert host_markers.intact()


@pytest.mark.static_agent
def test_decompression_bomb_beyond_the_budget_fails_and_leaves_nothing(coved, registry,
                                                                       workdir, good,
                                                                       host_markers):
    bomb = ib.gzip_bomb("bomb", size=1 << 30)  # 1 GiB of zeros in about 1 MB
    assert bomb.size < 4 << 20
    base = ib.Layer(ib.busybox_base_tar().bytes(), "gzip")
    img = ib.Image([base, bomb], ib.image_config([base, bomb], env=["PATH=/bin"]))
    registry.push_image(img, "hostile/bomb:v1", workdir)
    before = file_hashes(HOST_FILES)
    status, body, _ = coved.request("POST", "/v1/sandboxes", {
        "image": {"uri": registry.ref("hostile/bomb:v1")}, "entrypoint": SLEEP}, timeout=300)
    assert status in (413, 507) and body["code"] == "IMAGE::TOO_LARGE", (status, body)
    assert body.get("message")
    assert leftovers(coved) == []
    assert not os.path.exists(store(coved, "layers", "sha256-" + bomb.digest.split(":")[1]))
    status, body, _ = coved.request("POST", "/v1/images", {"uri": registry.ref("hostile/bomb:v1")},
                                    timeout=300)
    assert status in (413, 507) and body["code"] == "IMAGE::TOO_LARGE", (status, body)
    assert leftovers(coved) == []
    assert file_hashes(HOST_FILES) == before
    assert coved.health()
    st = os.statvfs(coved.state_dir)
    assert st.f_bavail * st.f_frsize > 0
    # Nothing stayed behind on disk: the whole store is far below the bomb.
    total = 0
    for dirpath, _, files in os.walk(store(coved)):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    assert total < BUDGET, total
    sid = coved.create(template=good, entrypoint=SLEEP)
    try:
        assert coved.sh(sid, "cat /etc/layer2") == "from layer two\n"
    finally:
        coved.delete(sid)
    assert host_markers.intact()


def test_a_registry_serving_another_blob_than_its_digest_is_refused(coved, registry, workdir,
                                                                    good):
    """A layer blob whose content is not what the manifest's digest says: 502
    IMAGE::DIGEST_MISMATCH, nothing stored."""
    img = ib.unique_image(4096)
    repo = f"hostile/mismatch-{secrets.token_hex(3)}:v1"
    registry.push_image(img, repo, workdir)
    # Swap the stored blob's bytes (same length) behind the registry's back.
    victim = img.layers[-1].digest.split(":")[1]
    path = os.path.join(registry.dir, "storage", "docker", "registry", "v2", "blobs", "sha256",
                        victim[:2], victim, "data")
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(path, "wb").write(bytes(data))
    status, body, _ = coved.request("POST", "/v1/images", {"uri": registry.ref(repo)},
                                    timeout=300)
    assert status == 502 and body["code"] == "IMAGE::DIGEST_MISMATCH", (status, body)
    assert not os.path.exists(store(coved, "layers", "sha256-" + victim))
    assert leftovers(coved) == []
    assert coved.health()
