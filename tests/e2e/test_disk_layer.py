"""The writable layer on disk (runtime/layer.c): an ext4 image per sandbox on a loop device, its
size the hard cap. A 1 GiB file fits in a 512 MiB sandbox; writing past the cap is ENOSPC for
the writer and nobody else; an upload past it is a 507 that names the cap; the tmpfs layer is
still there and keeps its rule; a delete leaves no loop device and no image; a coved restart
keeps a running sandbox's files."""

import json
import os
import secrets
import signal
import subprocess
import time

import pytest

from covetest import AGENT_PORT, CLI, cgroup_file, loop_devices_of, sandbox_leftovers, serve

MiB = 1 << 20
GiB = 1 << 30

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/loop-control"),
                                reason="no loop devices here: every layer is a tmpfs")


def image_of(coved, sid):
    return os.path.join(coved.run_dir(sid), "layer.img")


def allocated(path):
    return os.stat(path).st_blocks * 512


def memory_stat(sid):
    """The sandbox's memory.stat as a dict (v1: rss, cache...; v2: anon, file...)."""
    text = cgroup_file(sid, "memory", "memory.stat") or ""
    return {k: int(v) for k, v in (line.split() for line in text.splitlines())}


def upload(coved, sid, path, content):
    boundary = "cove-" + secrets.token_hex(8)
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"metadata\"; "
            f"filename=\"metadata\"\r\nContent-Type: application/json\r\n\r\n"
            f"{json.dumps({'path': path})}\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
            f"filename=\"blob\"\r\nContent-Type: application/octet-stream\r\n\r\n").encode() \
        + content + f"\r\n--{boundary}--\r\n".encode()
    h = coved.headers()
    h["Content-Type"] = f"multipart/form-data; boundary={boundary}"
    status, resp, _ = coved.request("POST", f"/sandboxes/{sid}/proxy/{AGENT_PORT}/files/upload",
                                    raw=body, headers=h, timeout=120)
    return status, resp


@pytest.mark.not_under("gvisor", reason="writes through runsc's gofer: the writable layer's cap is not reached as natively (short files, dropped answers)")
def test_gigabyte_file_in_a_512mi_sandbox(coved):
    sid = coved.create(limits={"cpu": "1", "memory": "512Mi", "ephemeral-storage": "2Gi"})
    size = int(coved.sh(sid, "df -B1 --output=size / | tail -1"))
    assert 1.9 * GiB <= size <= 2 * GiB, size  # the filesystem is the cap
    r = coved.exec(sid, "dd if=/dev/urandom of=/home/big bs=1M count=1024 status=none && sync "
                        "&& stat -c %s /home/big && sha256sum /home/big")
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.split("\n")
    assert int(lines[0]) == GiB
    # Its blocks are on the host's disk, in the sandbox's image...
    assert allocated(image_of(coved, sid)) >= GiB
    # ...not in its memory: what the cgroup holds of it is page cache (reclaimable), never
    # anonymous or shared memory (a tmpfs's pages are "shmem"), and it was never OOM-killed.
    st = memory_stat(sid)
    anon = st.get("rss", st.get("anon", 0))
    shmem = st.get("shmem", 0)
    usage = int(cgroup_file(sid, "memory", "memory.usage_in_bytes") or
                cgroup_file(sid, "memory", "memory.current"))
    print(f"1 GiB file: image {allocated(image_of(coved, sid)) / MiB:.0f} MiB on disk, "
          f"memory rss/anon {anon / MiB:.1f} MiB, shmem {shmem / MiB:.1f} MiB, "
          f"usage {usage / MiB:.0f} MiB (limit 512)")
    assert usage <= 512 * MiB + MiB
    assert anon < 128 * MiB and shmem < 64 * MiB, st
    assert coved.get(sid)["status"]["state"] == "Running"
    assert coved.sh(sid, "sha256sum /home/big").split()[0] == lines[1].split()[0]
    coved.delete(sid)
    assert sandbox_leftovers(coved, sid) == []


@pytest.mark.not_under("gvisor", reason="writes through runsc's gofer: the writable layer's cap is not reached as natively (short files, dropped answers)")
def test_300mb_upload_into_a_default_sandbox(coved):
    """The issue's example: with a tmpfs layer a default sandbox (512Mi memory, so a 256 MiB
    cap) could not take it; a default disk layer (1 GiB) does, and keeps it on disk."""
    sid = coved.create()  # memory 512Mi, no ephemeral-storage
    content = os.urandom(300 * 1000 * 1000)
    status, body = upload(coved, sid, "/home/user/big.bin", content)
    assert status == 200, (status, body)
    assert coved.sh(sid, "stat -c %s /home/user/big.bin && sync") == f"{len(content)}\n"
    assert allocated(image_of(coved, sid)) >= len(content)
    coved.delete(sid)


@pytest.mark.not_under("gvisor", reason="writes through runsc's gofer: the writable layer's cap is not reached as natively (short files, dropped answers)")
def test_cap_enforced_for_that_sandbox_only(coved):
    sid = coved.create(limits={"cpu": "1", "memory": "256Mi", "ephemeral-storage": "64Mi"})
    other = coved.create(limits={"cpu": "1", "memory": "256Mi", "ephemeral-storage": "64Mi"})
    r = coved.exec(sid, "dd if=/dev/zero of=/tmp/fill bs=1M")
    assert r.exit_code != 0 and "No space left on device" in r.stderr, r.stderr
    size = int(coved.sh(sid, "stat -c %s /tmp/fill"))
    assert 48 * MiB <= size <= 64 * MiB, size
    # The whole layer is full, not just /tmp; fallocate cannot get around it.
    r = coved.exec(sid, "head -c 1048576 /dev/zero > /home/more")
    assert r.exit_code != 0 and "No space left on device" in r.stderr
    assert coved.exec(sid, "fallocate -l 1G /tmp/big").exit_code != 0
    assert allocated(image_of(coved, sid)) <= 64 * MiB
    # The other sandbox, and this one once it frees space, work as before.
    assert coved.sh(other, "head -c 8388608 /dev/zero > /tmp/ok && stat -c %s /tmp/ok") \
        == "8388608\n"
    assert coved.sh(sid, "rm /tmp/fill && echo ok > /tmp/ok && cat /tmp/ok") == "ok\n"
    for s in (sid, other):
        coved.delete(s)
        assert sandbox_leftovers(coved, s) == []


@pytest.mark.not_under("gvisor", reason="writes through runsc's gofer: the writable layer's cap is not reached as natively (short files, dropped answers)")
def test_upload_past_the_cap_names_it(coved):
    sid = coved.create(limits={"cpu": "1", "memory": "256Mi", "ephemeral-storage": "32Mi"})
    # The layer nearly full (1 MiB left), then 3 MiB more: the agent answers as soon as a write
    # fails, and coved's HTTP server reads the rest of the body (up to 4 MiB) to drop it.
    coved.exec(sid, "dd if=/dev/zero of=/home/fill bs=1M")
    coved.sh(sid, "truncate -s -1M /home/fill && sync")
    status, body = upload(coved, sid, "/tmp/too-big", os.urandom(3 * MiB))
    assert status == 507, (status, body)
    assert body["code"] == "INSUFFICIENT_STORAGE", body
    assert str(32 * MiB) in body["message"] and "ephemeral-storage" in body["message"], body
    assert "cove create --disk" in body["message"], body
    # Nothing half written is left behind, and a file that fits still goes in.
    assert coved.sh(sid, "ls -A /tmp") == ""
    coved.sh(sid, "rm /home/fill")
    status, body = upload(coved, sid, "/tmp/fits", b"x" * (8 * MiB))
    assert status == 200, (status, body)
    coved.delete(sid)


@pytest.mark.not_under("gvisor", reason="writes through runsc's gofer: the writable layer's cap is not reached as natively (short files, dropped answers)")
def test_tmpfs_layer_keeps_its_rule(coved):
    ext = {"extensions": {"cove.layer": "tmpfs"}}
    status, body, _ = coved.request("POST", "/v1/sandboxes", {
        "image": {"uri": "base"}, "entrypoint": ["sleep", "infinity"],
        "resourceLimits": {"cpu": "1", "memory": "256Mi", "ephemeral-storage": "512Mi"}, **ext})
    assert status == 400 and "cannot exceed memory" in body["message"], body
    sid = coved.create(limits={"cpu": "1", "memory": "256Mi", "ephemeral-storage": "32Mi"}, **ext)
    assert not os.path.exists(image_of(coved, sid))
    r = coved.exec(sid, "dd if=/dev/zero of=/tmp/fill bs=1M")
    assert "No space left on device" in r.stderr
    # Its pages are the sandbox's memory.
    st = memory_stat(sid)
    assert st.get("shmem", 0) >= 24 * MiB, st
    coved.delete(sid)
    assert sandbox_leftovers(coved, sid) == []
    # A disk layer has no such rule: its cap may exceed its memory.
    sid = coved.create(limits={"cpu": "1", "memory": "64Mi", "ephemeral-storage": "1Gi"})
    assert os.path.exists(image_of(coved, sid))
    coved.delete(sid)


@pytest.mark.parametrize("value", ["ram", "", 1, None, ["disk"]])
def test_bad_layer_is_refused_and_changes_nothing(coved, value):
    before = len(coved.ok("GET", "/v1/sandboxes")["items"])
    status, body, _ = coved.request("POST", "/v1/sandboxes", {
        "image": {"uri": "base"}, "entrypoint": ["sleep", "infinity"],
        "extensions": {"cove.layer": value}})
    assert status == 400 and "cove.layer" in body["message"], body
    assert len(coved.ok("GET", "/v1/sandboxes")["items"]) == before


@pytest.mark.not_under("gvisor", reason="writes through runsc's gofer: the writable layer's cap is not reached as natively (short files, dropped answers)")
def test_cap_beyond_the_hosts_free_disk_is_refused(coved):
    st = os.statvfs(coved.state_dir)
    free = st.f_bavail * st.f_frsize
    want = f"{free // GiB + 64}Gi"
    status, body, _ = coved.request("POST", "/v1/sandboxes", {
        "image": {"uri": "base"}, "entrypoint": ["sleep", "infinity"],
        "resourceLimits": {"memory": "256Mi", "ephemeral-storage": want}})
    assert status == 409 and body["code"] == "HOST::OVERCOMMITTED", body
    assert os.listdir(os.path.join(coved.state_dir, "run")) == [] or all(
        not os.path.exists(os.path.join(coved.state_dir, "run", d, "layer.img"))
        for d in os.listdir(os.path.join(coved.state_dir, "run")))


def test_coved_layer_tmpfs_flag():
    with serve("--layer", "tmpfs") as d:
        sid = d.create(limits={"cpu": "1", "memory": "256Mi", "ephemeral-storage": "32Mi"})
        assert not os.path.exists(image_of(d, sid))
        assert "tmpfs by default" in d.log()
        sid2 = d.create(limits={"cpu": "1", "memory": "64Mi", "ephemeral-storage": "256Mi"},
                        extensions={"cove.layer": "disk"})
        assert os.path.exists(image_of(d, sid2))
        for s in (sid, sid2):
            d.delete(s)
            assert sandbox_leftovers(d, s) == []


def test_without_loop_devices_every_layer_is_a_tmpfs():
    """coved in a mount namespace where /dev/loop-control is /dev/null (a container without
    loop devices): a warning at start, and sandboxes get a tmpfs with its rule, whatever they
    ask for."""
    hide = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            'mount --bind /dev/null /dev/loop-control && exec "$@"', "sh"]
    with serve(wrapper=hide) as d:
        assert "writable layers on disk are unavailable" in d.log(), d.log()
        for ext in ({}, {"extensions": {"cove.layer": "disk"}}):
            sid = d.create(limits={"cpu": "1", "memory": "256Mi", "ephemeral-storage": "32Mi"},
                           **ext)
            assert not os.path.exists(image_of(d, sid))
            assert d.sh(sid, "echo ok > /tmp/ok && cat /tmp/ok") == "ok\n"
            d.delete(sid)
        status, body, _ = d.request("POST", "/v1/sandboxes", {
            "image": {"uri": "base"}, "entrypoint": ["sleep", "infinity"],
            "resourceLimits": {"memory": "64Mi", "ephemeral-storage": "1Gi"}})
        assert status == 400 and "cannot exceed memory" in body["message"], body


@pytest.mark.parametrize("how", ["flag", "env", "ini"])
def test_coved_refuses_a_layer_that_is_neither(tmp_path, how):
    from covetest import COVED
    args, env = [COVED, "--state-dir", str(tmp_path / "state")], dict(os.environ)
    if how == "flag":
        args += ["--layer", "ram"]
    elif how == "env":
        env["COVE_LAYER"] = "ram"
    else:
        ini = tmp_path / "coved.ini"
        ini.write_text("[server]\nlayer = ram\n")
        args += ["--config", str(ini)]
    r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 2 and "layer is disk or tmpfs" in r.stderr, (r.returncode, r.stderr)


def test_restart_keeps_files_then_delete_cleans(fresh_coved):
    d = fresh_coved.start()
    sid = d.create(limits={"cpu": "1", "memory": "256Mi", "ephemeral-storage": "512Mi"})
    d.sh(sid, "head -c 3000000 /dev/urandom > /home/keep && sha256sum /home/keep > /home/sum")
    devices = loop_devices_of(d.run_dir(sid), wait_s=0)
    assert len(devices) == 1, devices
    d.kill(signal.SIGKILL)  # a crash: the sandbox lives on, and with it its layer
    time.sleep(0.2)
    assert loop_devices_of(d.run_dir(sid), wait_s=0) == devices
    d.start()
    assert d.get(sid)["status"]["state"] == "Running"
    assert d.sh(sid, "sha256sum -c /home/sum") == "/home/keep: OK\n"
    d.pause(sid)
    d.delete(sid)
    assert sandbox_leftovers(d, sid) == []


def test_orphan_run_dir_is_cleaned_at_start(fresh_coved):
    """A run dir no sandbox record knows (coved died between making it and saving the record)
    is removed, its image with it, when coved starts."""
    d = fresh_coved
    run = os.path.join(d.state_dir, "run", "orphan0000000000")
    os.makedirs(run)
    with open(os.path.join(run, "layer.img"), "wb") as f:
        f.truncate(64 * MiB)
    d.start()
    assert not os.path.exists(run)


def cove_cli(coved, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COVE_", "OPEN_SANDBOX_"))}
    env.update(COVE_SERVER=f"http://127.0.0.1:{coved.port}", COVE_API_KEY=coved.key,
               COVE_CONFIG_FILE=os.path.join(coved.state_dir, "no-such-config.ini"))
    return subprocess.run([CLI, *args], capture_output=True, text=True, env=env, timeout=120)


def test_cli_layer_flag(coved):
    r = cove_cli(coved, "create", "--layer", "tmpfs", "--memory", "256Mi", "--disk", "32Mi")
    assert r.returncode == 0, r.stderr
    sid = r.stdout.strip()
    assert not os.path.exists(image_of(coved, sid))
    r = cove_cli(coved, "create", "--layer", "disk", "--memory", "64Mi", "--disk", "1Gi")
    assert r.returncode == 0, r.stderr
    sid2 = r.stdout.strip()
    assert os.path.exists(image_of(coved, sid2))
    # tmpfs keeps its rule; a layer that is neither is refused before any request
    r = cove_cli(coved, "create", "--layer", "tmpfs", "--memory", "64Mi", "--disk", "1Gi")
    assert r.returncode == 1 and "cannot exceed memory" in r.stderr, r.stderr
    r = cove_cli(coved, "create", "--layer", "ram")
    assert r.returncode == 2 and "--layer is disk or tmpfs" in r.stderr, r.stderr
    for s in (sid, sid2):
        coved.delete(s)
