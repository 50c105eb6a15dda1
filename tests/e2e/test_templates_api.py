"""Templates over the API (GET/POST/DELETE /v1/templates, admin keys only) and `cove template
add|ls|rm` on top of them: a directory on coved's host or an uploaded tarball, sandboxes made
from them, removal refused while in use, and hostile archives refused with nothing left."""

import gzip
import io
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tarfile
import time

import pytest

from covetest import CLI, COVED, Coved, sanitizer_problems, serve

BUSYBOX = shutil.which("busybox") or "/usr/bin/busybox"
ADMIN = "templates-admin-key"
CAP = 8 << 20  # --max-template-size of this module's daemon
BUILTINS = ["base", "code-interpreter"]


@pytest.fixture(scope="module")
def coved():
    with serve("--max-template-size", "8Mi", admin_keys=(ADMIN,)) as d:
        yield d


def busybox_rootfs(path):
    """A root with a static busybox (no libc), a file owned by uid 1000 and a setuid file."""
    os.makedirs(os.path.join(path, "bin"))
    shutil.copy(BUSYBOX, os.path.join(path, "bin", "busybox"))
    for applet in ("sh", "echo", "ls", "cat", "stat", "id", "sleep"):
        os.symlink("busybox", os.path.join(path, "bin", applet))
    for d in ("proc", "sys", "dev", "tmp", "etc", "root", "home/user"):
        os.makedirs(os.path.join(path, d), exist_ok=True)
    os.chmod(os.path.join(path, "tmp"), 0o1777)
    with open(os.path.join(path, "etc", "marker"), "w") as f:
        f.write("from the template\n")
    os.chown(os.path.join(path, "home", "user"), 1000, 1000)
    with open(os.path.join(path, "bin", "suid"), "w") as f:
        f.write("#!/bin/sh\nid -u\n")
    os.chmod(os.path.join(path, "bin", "suid"), 0o4755)
    return path


def tarball(root, compress=False):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if compress else "w") as t:
        t.add(root, arcname=".")
    return buf.getvalue()


def admin_headers(content_type="application/x-tar", key=ADMIN):
    return {"OPEN-SANDBOX-API-KEY": key, "Content-Type": content_type}


def upload(coved, name, data, key=ADMIN, content_type="application/x-tar"):
    return coved.request("POST", f"/v1/templates?name={name}", raw=data,
                         headers=admin_headers(content_type, key), timeout=120)


def register_dir(coved, name, rootfs, key=ADMIN):
    return coved.request("POST", "/v1/templates", {"name": name, "rootfs": str(rootfs)},
                         headers=admin_headers("application/json", key), timeout=120)


def delete(coved, name, key=ADMIN):
    return coved.request("DELETE", f"/v1/templates/{name}",
                         headers={"OPEN-SANDBOX-API-KEY": key})


def listed(coved):
    return [t["name"] for t in coved.ok("GET", "/v1/templates")["items"]]


def templates_dir(coved):
    return sorted(os.listdir(os.path.join(coved.state_dir, "templates")))


def assert_error(status, body, want_status, code=None):
    assert status == want_status, (status, body)
    assert isinstance(body, dict) and body.get("code") and body.get("message"), body
    if code:
        assert body["code"] == code, body


def cli(coved, *args, key=ADMIN, check=True):
    env = dict(os.environ, COVE_SERVER=f"http://127.0.0.1:{coved.port}", COVE_API_KEY=key)
    env.pop("COVE_STATE_DIR", None)  # the CLI needs none: it talks to coved only
    r = subprocess.run([CLI, *args], capture_output=True, text=True, env=env, timeout=120)
    if check and r.returncode != 0:
        raise AssertionError(f"cove {args} -> {r.returncode}: {r.stderr}")
    return r


def test_template_changes_need_an_admin_key(coved, tmp_path):
    root = busybox_rootfs(str(tmp_path / "r"))
    before = templates_dir(coved)
    assert_error(*register_dir(coved, "by-user", root, key=coved.key)[:2], 403, "AUTH::FORBIDDEN")
    assert_error(*upload(coved, "by-user", tarball(root), key=coved.key)[:2], 403,
                 "AUTH::FORBIDDEN")
    assert_error(*delete(coved, "base", key=coved.key)[:2], 403, "AUTH::FORBIDDEN")
    assert_error(*upload(coved, "by-nobody", b"x", key="wrong-key")[:2], 401)
    r = cli(coved, "template", "add", "by-user", "--rootfs", root, key=coved.key, check=False)
    assert r.returncode == 1 and "admin" in r.stderr, r.stderr
    # Listing is for every key.
    assert listed(coved) == BUILTINS
    assert templates_dir(coved) == before


def test_max_template_size_is_checked(tmp_path):
    for flags, env in ((["--max-template-size", "lots"], {}), ([], {"COVE_MAX_TEMPLATE_BYTES": "0"})):
        r = subprocess.run([COVED, "--state-dir", str(tmp_path), *flags], capture_output=True,
                           text=True, timeout=30, env=dict(os.environ, **env))
        assert r.returncode == 2 and "max_template_bytes" in r.stderr, r.stderr


def test_builtins_cannot_be_removed_and_unknown_is_404(coved):
    for name in BUILTINS:
        assert_error(*delete(coved, name)[:2], 409, "TEMPLATE::BUILTIN")
    assert_error(*delete(coved, "never-there")[:2], 404, "TEMPLATE::NOT_FOUND")
    assert listed(coved) == BUILTINS
    coved.delete(coved.create())  # base still makes sandboxes


def test_bad_registrations_are_4xx_and_change_nothing(coved, tmp_path):
    root = busybox_rootfs(str(tmp_path / "r"))
    before = templates_dir(coved)
    cases = [
        register_dir(coved, "rel", "relative/path"),
        register_dir(coved, "missing", tmp_path / "missing"),
        register_dir(coved, "a-file", tmp_path / "r" / "etc" / "marker"),
        register_dir(coved, "Bad Name", root),
        register_dir(coved, "base", root),
        register_dir(coved, "itself", coved.state_dir),
        register_dir(coved, "root", "/"),
        coved.request("POST", "/v1/templates", {"name": "x"}, headers=admin_headers("application/json")),
        upload(coved, "", tarball(root)),
        upload(coved, "../evil", tarball(root)),
        upload(coved, "base", tarball(root)),
        upload(coved, "not-tar", b"this is not an archive at all" * 100),
        upload(coved, "empty", b""),
        upload(coved, "wrong-type", tarball(root), content_type="text/plain"),
    ]
    for status, body, _ in cases:
        assert 400 <= status < 500, (status, body)
        assert body.get("code") and body.get("message"), body
    assert [c[0] for c in cases[-3:]] == [400, 400, 415]
    assert cases[4][0] == 409 and cases[10][0] == 409
    assert cases[5][1]["code"] == cases[6][1]["code"] == "TEMPLATE::INVALID_ROOTFS"
    assert listed(coved) == BUILTINS
    assert templates_dir(coved) == before


@pytest.mark.static_agent
@pytest.mark.parametrize("how", ["directory", "tarball", "tar.gz"])
def test_register_create_delete_in_use_then_removed(coved, tmp_path, how):
    root = busybox_rootfs(str(tmp_path / "r"))
    name = f"api-{how.replace('.', '-')}-{secrets.token_hex(2)}"
    if how == "directory":
        status, body, resp = register_dir(coved, name, root)
    else:
        status, body, resp = upload(coved, name, tarball(root, compress=how == "tar.gz"),
                                    content_type="application/gzip" if how == "tar.gz"
                                    else "application/x-tar")
    assert status == 201, body
    assert body["name"] == name and body["hostOs"] is False
    assert resp.getheader("Location") == f"/v1/templates/{name}"
    assert name in listed(coved)
    assert not [n for n in templates_dir(coved) if n.startswith(".")]
    # Owners are in the templates' id range on the host, set-id bits are gone.
    home = os.path.join(coved.state_dir, "templates", name, "rootfs", "home", "user")
    assert os.stat(home).st_uid == 100000 + 1000
    sid = coved.create(template=name, entrypoint=["/bin/sleep", "3600"])
    try:
        out = coved.sh(sid, "cat /etc/marker; stat -c '%u %a' /home/user /bin/suid; id -u")
        assert out == "from the template\n1000 755\n0 755\n0\n", out
        assert_error(*delete(coved, name)[:2], 409, "TEMPLATE::IN_USE")
        assert coved.sh(sid, "echo still running") == "still running\n"
    finally:
        coved.delete(sid)
    status, _, _ = delete(coved, name)
    assert status == 204
    assert name not in listed(coved) and name not in templates_dir(coved)
    assert_error(*coved.request("POST", "/v1/sandboxes", {"image": {"uri": name},
                 "entrypoint": ["/bin/sleep", "1"]})[:2], 400, "SANDBOX::IMAGE_NOT_FOUND")
    # The name is free again.
    status, body, _ = register_dir(coved, name, root)
    assert status == 201, body
    assert delete(coved, name)[0] == 204


@pytest.mark.static_agent
def test_cli_template_add_ls_rm_against_the_api(coved, tmp_path):
    root = busybox_rootfs(str(tmp_path / "r"))
    listener = socket.socket(socket.AF_UNIX)  # a socket in the directory is left out
    listener.bind(os.path.join(root, "tmp", "s"))
    listener.close()
    tar = tmp_path / "r.tar.gz"
    tar.write_bytes(tarball(root, compress=True))
    names = {"cli-dir-" + secrets.token_hex(2): root, "cli-tgz-" + secrets.token_hex(2): str(tar)}
    for name, source in names.items():
        assert cli(coved, "template", "add", name, "--rootfs", source).stdout == name + "\n"
    shown = json.loads(cli(coved, "template", "ls", "-o", "json", key=coved.key).stdout)
    assert set(names) <= {t["name"] for t in shown["items"]}
    table = cli(coved, "template", "list", key=coved.key).stdout
    assert all(n in table for n in names)
    for name in names:
        sid = coved.create(template=name, entrypoint=["/bin/sleep", "3600"])
        try:
            assert coved.sh(sid, "cat /etc/marker") == "from the template\n"
            r = cli(coved, "template", "rm", name, check=False)
            assert r.returncode == 1 and "in use" in r.stderr, r.stderr
        finally:
            coved.delete(sid)
    r = cli(coved, "template", "rm", *names, key=coved.key, check=False)
    assert r.returncode == 1 and "admin" in r.stderr
    assert cli(coved, "template", "rm", *names).stdout.split() == list(names)
    assert listed(coved) == BUILTINS
    assert cli(coved, "template", "rm", "base", check=False).returncode == 1


@pytest.mark.static_agent
def test_in_use_survives_a_restart(tmp_path):
    """A sandbox re-adopted after a restart holds its template as much as a new one."""
    root = busybox_rootfs(str(tmp_path / "r"))
    d = Coved(admin_keys=(ADMIN,))
    try:
        d.start()
        assert register_dir(d, "kept", root)[0] == 201
        sid = d.create(template="kept", entrypoint=["/bin/sleep", "3600"])
        d.kill(signal.SIGTERM)
        d.start()
        assert "kept" in listed(d)
        assert_error(*delete(d, "kept")[:2], 409, "TEMPLATE::IN_USE")
        assert d.sh(sid, "cat /etc/marker") == "from the template\n"
        d.delete(sid)
        assert delete(d, "kept")[0] == 204
    finally:
        d.cleanup()
    assert sanitizer_problems(d) is None


# ---- hostile archives -------------------------------------------------------------------

def member(t, name, data=b"pwned\n", **fields):
    info = tarfile.TarInfo(name)
    for k, v in fields.items():
        setattr(info, k, v)
    if info.type == tarfile.REGTYPE:
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    else:
        t.addfile(info)


def hostile(kind, outside):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT, encoding="utf-8",
                      errors="surrogateescape") as t:
        member(t, "bin", type=tarfile.DIRTYPE, mode=0o755)
        member(t, "bin/ok", b"fine\n", mode=0o755)
        if kind == "dotdot":
            member(t, "../../../" + os.path.basename(outside) + "/dotdot")
        elif kind == "dotdot-inside":
            member(t, "bin/../../escaped")
        elif kind == "absolute":
            member(t, os.path.join(outside, "absolute"))
        elif kind == "symlink-then-file":
            member(t, "link", type=tarfile.SYMTYPE, linkname=outside)
            member(t, "link/through")
        elif kind == "symlink-dir-then-file":
            member(t, "etc", type=tarfile.SYMTYPE, linkname="../../..")
            member(t, "etc/through")
        elif kind == "hardlink-outside":
            member(t, "passwd", type=tarfile.LNKTYPE, linkname="/etc/passwd")
        elif kind == "hardlink-dotdot":
            member(t, "passwd", type=tarfile.LNKTYPE, linkname="../../../../../../etc/passwd")
        elif kind == "char-device":
            member(t, "dev/mem", type=tarfile.CHRTYPE, devmajor=1, devminor=1)
        elif kind == "block-device":
            member(t, "sda", type=tarfile.BLKTYPE, devmajor=8, devminor=0)
        elif kind == "dotdot-not-utf8":
            member(t, "../\udcff\udcfe-name")  # bytes 0xff 0xfe: not UTF-8
        elif kind == "truncated":
            pass
    data = buf.getvalue()
    if kind == "truncated":
        big = io.BytesIO()
        with tarfile.open(fileobj=big, mode="w") as t:
            member(t, "big", b"x" * 100000)
        data = big.getvalue()[:50000]
    return data


HOSTILE = ["dotdot", "dotdot-inside", "absolute", "symlink-then-file", "symlink-dir-then-file",
           "hardlink-outside", "hardlink-dotdot", "char-device", "block-device", "truncated",
           "dotdot-not-utf8"]


def test_hostile_archives_are_400_and_leave_nothing(coved, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    before = templates_dir(coved)
    passwd = open("/etc/passwd", "rb").read()
    for kind in HOSTILE:
        status, body, _ = upload(coved, "hostile-" + kind, hostile(kind, str(outside)))
        assert_error(status, body, 400)
        assert templates_dir(coved) == before, kind
        assert list(outside.iterdir()) == [], kind
    assert listed(coved) == BUILTINS
    assert open("/etc/passwd", "rb").read() == passwd
    state = coved.state_dir
    assert not [p for p, _, files in os.walk(state) for f in files
                if f in ("dotdot", "escaped", "through", "absolute")]
    assert not os.path.exists(os.path.join(state, "escaped"))
    coved.health()
    coved.delete(coved.create())


def test_a_directory_with_a_device_node_is_refused(coved, tmp_path):
    root = busybox_rootfs(str(tmp_path / "r"))
    os.mknod(os.path.join(root, "dev", "null"), 0o666 | 0o020000, os.makedev(1, 3))
    before = templates_dir(coved)
    status, body, _ = register_dir(coved, "with-device", root)
    assert_error(status, body, 400, "TEMPLATE::INVALID_ARCHIVE")
    assert "device" in body["message"]
    assert templates_dir(coved) == before and listed(coved) == BUILTINS


def test_archives_beyond_the_cap_are_413_and_leave_nothing(coved):
    before = templates_dir(coved)
    # Beyond the cap as uploaded: refused as it streams in (the rest is read and dropped).
    huge = io.BytesIO()
    with tarfile.open(fileobj=huge, mode="w") as t:
        member(t, "big", os.urandom(CAP + (1 << 20)))
    status, body, _ = upload(coved, "too-big", huge.getvalue())
    assert_error(status, body, 413, "TEMPLATE::TOO_LARGE")
    # Small as uploaded, beyond the cap once extracted (a compression bomb).
    bomb = io.BytesIO()
    with tarfile.open(fileobj=bomb, mode="w") as t:
        member(t, "zeros", bytes(CAP + (1 << 20)))
    packed = gzip.compress(bomb.getvalue())
    assert len(packed) < CAP // 100
    status, body, _ = upload(coved, "bomb", packed, content_type="application/gzip")
    assert_error(status, body, 413, "TEMPLATE::TOO_LARGE")
    assert templates_dir(coved) == before and listed(coved) == BUILTINS
    coved.health()


def test_an_upload_cut_short_leaves_nothing(coved):
    before = templates_dir(coved)
    s = socket.create_connection(("127.0.0.1", coved.port), timeout=10)
    head = (f"POST /v1/templates?name=cut-short HTTP/1.1\r\nHost: x\r\n"
            f"OPEN-SANDBOX-API-KEY: {ADMIN}\r\nContent-Type: application/x-tar\r\n"
            f"Content-Length: {4 << 20}\r\n\r\n").encode()
    s.sendall(head + tarball_prefix())
    deadline = time.time() + 10
    while time.time() < deadline and not [n for n in templates_dir(coved) if n.startswith(".")]:
        time.sleep(0.05)
    assert [n for n in templates_dir(coved) if n.startswith(".staging-")]  # the import began
    # While it is under way the name is taken.
    assert_error(*upload(coved, "cut-short", b"")[:2], 409, "TEMPLATE::EXISTS")
    s.close()
    deadline = time.time() + 10
    while time.time() < deadline and templates_dir(coved) != before:
        time.sleep(0.05)
    assert templates_dir(coved) == before
    assert listed(coved) == BUILTINS
    coved.health()


def tarball_prefix():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        member(t, "big", b"y" * 300000)
    return buf.getvalue()[:200000]


def test_coved_stopping_during_an_upload_leaves_nothing():
    d = Coved(admin_keys=(ADMIN,))
    s = None
    try:
        d.start()
        before = templates_dir(d)
        s = socket.create_connection(("127.0.0.1", d.port), timeout=10)
        s.sendall((f"POST /v1/templates?name=stopped HTTP/1.1\r\nHost: x\r\n"
                   f"OPEN-SANDBOX-API-KEY: {ADMIN}\r\nContent-Type: application/x-tar\r\n"
                   f"Content-Length: {4 << 20}\r\n\r\n").encode() + tarball_prefix())
        deadline = time.time() + 10
        while time.time() < deadline and not [n for n in templates_dir(d) if n.startswith(".")]:
            time.sleep(0.05)
        assert [n for n in templates_dir(d) if n.startswith(".staging-")]
        d.kill(signal.SIGTERM)
        assert d.proc.returncode == 0
        assert templates_dir(d) == before
    finally:
        if s is not None:
            s.close()
        d.cleanup()
    assert sanitizer_problems(d) is None
