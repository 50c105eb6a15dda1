"""What a hostile review of the cold start's spares (src/coved/runtime/spares.h) found: each test
is a way the stock of namespaces, layers and run dirs, or what came with it (the cpu limit
written late, the host's cgroup2 reconfigured), went wrong, checked as a user or an operator
would see it."""
import ctypes
import glob
import http.client
import os
import subprocess
import tempfile
import threading
import time

import pytest

from covetest import serve
from test_spares import LAYERS, STOCK, netns_fds, netns_of, spare_images, wait_until

pytestmark = [
    pytest.mark.native_only("spares are made for native sandboxes"),
    pytest.mark.skipif(not os.path.exists("/dev/loop-control"),
                       reason="no loop devices here: no disk layers, none made ahead"),
]


def spares_held(d):
    return len(set(netns_fds(d.proc.pid)) - {netns_of(d.proc.pid)})


def running(d, sid):
    return d.get(sid)["status"]["state"] == "Running"


def create_in_background(d):
    """A create whose answer nobody waits for (coved may be stopped before it comes)."""
    def create():
        try:
            d.request("POST", "/v1/sandboxes", {
                "image": {"uri": "base"}, "entrypoint": ["sleep", "infinity"],
                "resourceLimits": {"cpu": "1", "memory": "256Mi"}}, timeout=30)
        except (OSError, http.client.HTTPException):
            pass  # coved stopped first
    t = threading.Thread(target=create, daemon=True)
    t.start()
    return t


def test_disk_layers_made_ahead_when_run_dirs_are_another_mount():
    """STATE/run on a mount of its own (here a bind mount of itself: the same disk, another
    mount, so a rename between them is EXDEV). A layer made ahead lives in STATE/layers until a
    create takes it: moving its image into the run dir cannot work there, and must neither fail
    the create nor leave the image behind."""
    with serve(start=False) as d:
        run = os.path.join(d.state_dir, "run")
        os.makedirs(run)
        subprocess.run(["mount", "--bind", run, run], check=True)
        sids = []
        try:
            d.start()
            assert len(spare_images(d)) == LAYERS  # made, as the stock is
            for _ in range(2):
                sids.append(d.create())
            for sid in sids:
                assert running(d, sid)
                assert d.sh(sid, f"echo {sid} > /mine && cat /mine").strip() == sid
                assert os.path.exists(os.path.join(d.run_dir(sid), "layer.img"))
            # None are made any more (each would fail the same way), and none stay behind.
            assert wait_until(lambda: spare_images(d) == [])
            assert "another file system" in d.log()
            for sid in sids:
                d.delete(sid)
                assert not os.path.exists(d.run_dir(sid))
            sids = []
        finally:
            for sid in sids:
                d.request("DELETE", f"/v1/sandboxes/{sid}")
            d.kill()
            subprocess.run(["umount", "-l", run])


def test_creates_ended_during_set_up_leave_no_layer_image():
    """A create whose set-up is cut short (coved stops while it runs) after it took a layer
    made ahead: that layer's image must go with its run dir, not stay in STATE/layers."""
    with serve() as d:
        state = d.state_dir
        stock = set(spare_images(d))
        assert len(stock) == LAYERS
        threads = [create_in_background(d) for _ in range(2)]
        # Stopped as soon as a create has begun (its run dir is there): its set-up is cut short.
        run = os.path.join(state, "run")
        wait_until(lambda: os.path.isdir(run) and os.listdir(run) != [], timeout=30)
        d.kill()
        for t in threads:
            t.join(30)
        assert d.proc.returncode == 0, d.log()[-3000:]
        # What a coved that stopped cleanly leaves in STATE/layers: its templates, nothing else.
        left = [os.path.basename(p) for p in glob.glob(os.path.join(state, "layers", ".*"))]
        assert left == [], left


# Freed memory filled at once (and no per-thread cache keeping it as it was): what is used
# after it was freed reads garbage, and coved crashes instead of going on by luck.
FREED_FILLED = "glibc.malloc.tcache_count=0:glibc.malloc.perturb=85"


def test_a_stop_during_a_create_uses_nothing_freed():
    """coved stopped (SIGTERM) while a create is being set up, no maker running: the create is
    ended, its run dir put in the trash, and nothing coved freed on its way out (the spares'
    timer, which that trash would start) is used again: coved exits 0. A few rounds: the stop
    must come while the set-up runs, which it does most times."""
    cut_short = 0
    for _ in range(4):
        with serve(env=dict(os.environ, GLIBC_TUNABLES=FREED_FILLED)) as d:
            t = create_in_background(d)
            run = os.path.join(d.state_dir, "run")
            deadline = time.time() + 30
            while time.time() < deadline and not (os.path.isdir(run) and os.listdir(run)):
                pass  # no sleep: the stop must come while the set-up runs
            d.kill()
            t.join(30)
            assert d.proc.returncode == 0, d.log()[-3000:]
            cut_short += "not created" in d.log()
    assert cut_short > 0  # the path was taken at least once


def test_namespaces_are_made_ahead_while_disk_layers_cannot_be():
    """A maker that cannot make disk layers (here STATE/layers made immutable: as a full disk
    does, it refuses new files) still makes the network namespaces, which need no disk: the
    stock of namespaces comes back after a burst of creates, which make their layers
    themselves (in their run dirs)."""
    small = {"cpu": "1", "memory": "256Mi", "ephemeral-storage": "256Mi"}
    with serve() as d:
        layers = os.path.join(d.state_dir, "layers")
        # A create of another size: the stock is made of that size from now on (its template
        # formatted by this create).
        sids = [d.create(limits=small)]
        assert wait_until(lambda: len(spare_images(d)) == LAYERS)
        subprocess.run(["chattr", "+i", layers], check=True)
        try:
            # The default size again: its template is there, but no layer of it can be made
            # ahead any more. Enough creates to take the namespaces under their low mark.
            for _ in range(STOCK - 3):
                sids.append(d.create())
            for sid in sids:
                assert d.sh(sid, "echo ok").strip() == "ok"
            assert wait_until(lambda: spares_held(d) == STOCK), spares_held(d)
            assert "a disk layer" in d.log()  # the maker said what it could not make
        finally:
            subprocess.run(["chattr", "-i", layers])
            for sid in sids:
                d.request("DELETE", f"/v1/sandboxes/{sid}")


# ---- the host's cgroup2, reconfigured with favordynmods ----

AT_FDCWD = -100
FSPICK_CLOEXEC = 1
FSCONFIG_SET_FLAG = 0
FSCONFIG_CMD_RECONFIGURE = 7


def cgroup2_mount(mountinfo="/proc/self/mountinfo", where=None):
    """(mount point, the mount's own options, the superblock's options) of the cgroup2 mount
    at `where`, or of the last one; None without one."""
    found = None
    with open(mountinfo) as f:
        for line in f:
            left, right = line.split(" - ", 1)
            fields, after = left.split(), right.split()
            if after[0] == "cgroup2" and (where is None or fields[4] == where):
                found = (fields[4], fields[5].split(","), after[2].split(","))
    return found


def reconfigure(target, flags):
    """The superblock of the mount at target, given exactly these flags (fspick, fsconfig)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.fspick(AT_FDCWD, target.encode(), FSPICK_CLOEXEC)
    if fd < 0:
        raise OSError(ctypes.get_errno(), f"fspick {target}")
    try:
        for flag in flags:
            if libc.fsconfig(fd, FSCONFIG_SET_FLAG, flag.encode(), None, 0) < 0:
                raise OSError(ctypes.get_errno(), f"fsconfig {flag}")
        if libc.fsconfig(fd, FSCONFIG_CMD_RECONFIGURE, None, None, 0) < 0:
            raise OSError(ctypes.get_errno(), "fsconfig reconfigure")
    finally:
        os.close(fd)


@pytest.mark.serial("turns favordynmods off on the host's cgroup2 for a moment")
def test_favordynmods_keeps_the_mounts_own_flags():
    """coved turns on favordynmods on the host's cgroup2 as it starts. That is a setting of
    the superblock; the mount's own flags (nosuid, nodev, noexec, as systemd mounts
    /sys/fs/cgroup) and the superblock's other options must stay as they were."""
    host = cgroup2_mount()
    if host is None:
        pytest.skip("no cgroup2 mount here")
    target, _, superopts = host
    others = [o for o in superopts if o not in ("rw", "ro", "favordynmods")]
    had = "favordynmods" in superopts
    if had:
        reconfigure(target, others)  # off, so that coved has something to do
    try:
        if "favordynmods" in cgroup2_mount(where=target)[2]:
            pytest.skip("this kernel keeps favordynmods on (CONFIG_CGROUP_FAVOR_DYNMODS)")
        # coved in a mount namespace of its own, with a cgroup2 mount as systemd makes one.
        mnt = tempfile.mkdtemp(prefix="cove-test-cgroup2-")
        wrapper = ["unshare", "-m", "--propagation", "private", "sh", "-c",
                   'mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 "$0" && exec "$@"', mnt]
        try:
            with serve(wrapper=wrapper) as d:
                found = cgroup2_mount(f"/proc/{d.proc.pid}/mountinfo", where=mnt)
                assert found is not None, d.log()
                _, own, sb = found
                assert "favordynmods" in sb, d.log()  # what coved came to do
                assert {"nosuid", "nodev", "noexec"} <= set(own), own  # what it must keep
                assert set(others) <= set(sb), (others, sb)
        finally:
            os.rmdir(mnt)
    finally:
        now = cgroup2_mount(where=target)[2]
        if had and "favordynmods" not in now:
            reconfigure(target, others + ["favordynmods"])


# ---- the cpu limit ----

FIRST_LOOK = ("q=$(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null || "
              "cut -d' ' -f1 /sys/fs/cgroup/cpu.max); echo $q > /tmp/first; exec sleep infinity")


def test_the_entrypoint_never_runs_without_its_cpu_limit():
    """The cpu limit is written after the set-up's mounts (which it would slow down), but
    before anything of the sandbox's runs: the entrypoint's first look at its own cgroup finds
    the limit, however busy coved is with other creates at that moment."""
    with serve() as d:
        results, errors = {}, []

        def create(i):
            try:
                results[i] = d.create(entrypoint=("sh", "-c", FIRST_LOOK),
                                      limits={"cpu": "250m", "memory": "256Mi"})
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        try:
            assert not errors, errors
            for sid in results.values():
                assert wait_until(lambda: d.exec(sid, "cat /tmp/first").stdout.strip() != "")
                assert d.sh(sid, "cat /tmp/first").strip() == "25000", sid
        finally:
            for sid in results.values():
                d.delete(sid)
