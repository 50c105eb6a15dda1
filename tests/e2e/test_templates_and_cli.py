"""Templates registered with `cove template add`, a rootfs without a libc, and the CLI."""

import json
import os
import subprocess
import tarfile
import tempfile

import pytest

import covetest
from covetest import CLI


def make_busybox_rootfs(path):
    covetest.busybox_rootfs(path, ("sh", "echo", "ls", "cat", "ps", "id", "sleep", "hostname"))


def cli(coved, *args, check=True, input=None, admin=False):
    """admin: with the daemon's admin key, which registering templates needs."""
    env = dict(os.environ, COVE_SERVER=f"http://127.0.0.1:{coved.port}",
               COVE_API_KEY=coved.admin_key if admin else coved.key, COVE_STATE_DIR=coved.state_dir)
    r = subprocess.run([CLI, *args], capture_output=True, text=True, env=env, timeout=120,
                       input=input)
    if check and r.returncode != 0:
        raise AssertionError(f"cove {args} -> {r.returncode}: {r.stderr}")
    return r


@pytest.mark.parametrize("as_tarball", [False, True], ids=["directory", "tarball"])
@pytest.mark.static_agent
def test_busybox_template_runs_agent_without_libc(coved, as_tarball, tmp_path):
    rootfs = tmp_path / "rootfs"
    make_busybox_rootfs(str(rootfs))
    assert not any(n.startswith(("libc", "ld-")) for _, _, files in os.walk(rootfs) for n in files)
    source = str(rootfs)
    name = "bb-tar" if as_tarball else "bb-dir"
    if as_tarball:
        source = str(tmp_path / "rootfs.tar")
        with tarfile.open(source, "w") as t:
            t.add(str(rootfs), arcname=".")
    assert cli(coved, "template", "add", name, "--rootfs", source, admin=True).stdout.strip() == name
    names = [t["name"] for t in coved.ok("GET", "/v1/templates")["items"]]
    assert name in names
    sid = coved.create(template=name, entrypoint=["/bin/sleep", "3600"])
    try:
        r = coved.exec(sid, "echo hi from busybox; id -u; ls /bin/busybox; ls /lib 2>&1")
        assert r.stdout.startswith("hi from busybox\n0\n/bin/busybox\n"), r.stdout + r.stderr
        assert "No such file" in r.stdout + r.stderr
    finally:
        coved.delete(sid)


def test_template_add_refuses_bad_names_and_duplicates(coved, tmp_path):
    rootfs = tmp_path / "r"
    make_busybox_rootfs(str(rootfs))
    def add(name, source):
        return cli(coved, "template", "add", name, "--rootfs", source, check=False, admin=True)
    assert add("../evil", str(rootfs)).returncode != 0
    assert add("Base", str(rootfs)).returncode != 0
    assert add("base", str(rootfs)).returncode != 0
    r = add("x", str(tmp_path / "missing"))
    assert r.returncode == 2


def test_cli_lifecycle_and_exit_codes(coved):
    sid = cli(coved, "create", "--memory", "256Mi", "-e", "FOO=bar", "-m", "team=ml").stdout.strip()
    try:
        r = cli(coved, "exec", sid, "--", "sh", "-c", 'echo "$FOO"; echo err >&2; exit 7', check=False)
        assert r.returncode == 7
        assert r.stdout == "bar\n" and r.stderr == "err\n"
        r = cli(coved, "exec", sid, "--", "echo", "it's a \"quoted\" $HOME")
        assert r.stdout == "it's a \"quoted\" $HOME\n"
        info = json.loads(cli(coved, "get", sid, "-o", "json").stdout)
        assert info["status"]["state"] == "Running" and info["metadata"] == {"team": "ml"}
        cli(coved, "pause", sid)
        assert coved.get(sid)["status"]["state"] == "Paused"
        assert cli(coved, "pause", sid, check=False).returncode == 1
        listed = json.loads(cli(coved, "list", "--state", "Paused", "-o", "json").stdout)
        assert sid in [s["id"] for s in listed["items"]]
        cli(coved, "resume", sid)
        assert cli(coved, "exec", sid, "--", "true").returncode == 0
    finally:
        cli(coved, "kill", sid)
    assert cli(coved, "get", sid, check=False).returncode == 1


def test_cli_unreachable_server_is_exit_3(coved):
    env = dict(os.environ, COVE_SERVER="http://127.0.0.1:1", COVE_API_KEY="x")
    r = subprocess.run([CLI, "list"], capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 3
