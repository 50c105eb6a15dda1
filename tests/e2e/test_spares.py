"""Network namespaces made ahead (src/coved/runtime/spares.h, issue 14's cold start).

What must hold however a create gets its namespace: each sandbox has one of its own, never
shared with another sandbox or handed out twice; it is set up exactly as one made at create
time (loopback up, the resolver's address, outbound traffic through coved's proxy, the rest
refused); a burst larger than the stock still works; the stock comes back once creates pause;
nothing is left once coved stops."""
import glob
import os
import subprocess
import time

import pytest

from covetest import cgroup_file, sandbox_init_pid, serve

STOCK = 8  # RUNTIME_SPARES_NETNS


def netns_fds(pid):
    """The network namespaces coved holds descriptors of (its own one included)."""
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("net:["):
            found.append(int(link[5:-1]))
    return found


def netns_of(pid):
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def wait_until(check, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


@pytest.mark.native_only("the spares serve the native runtime's set-up; oci and gvisor make their own")
def test_sandboxes_get_spare_namespaces_set_up_like_fresh_ones():
    with serve() as d:
        own = netns_of(d.proc.pid)
        spares = set(netns_fds(d.proc.pid)) - {own}
        assert len(spares) == STOCK  # made before coved answered
        sids = [d.create() for _ in range(STOCK + 4)]  # more than the stock
        try:
            inodes = [netns_of(sandbox_init_pid(sid)) for sid in sids]
            assert len(set(inodes)) == len(sids)  # one each, none handed out twice
            assert own not in inodes
            assert inodes[0] in spares  # the first create took a spare
            # What coved still holds (or has made since) is no live sandbox's.
            assert not (set(netns_fds(d.proc.pid)) - {own}) & set(inodes)
            for sid in (sids[0], sids[-1]):  # a spare's and (likely) a fallback's
                out = d.sh(sid, "cat /proc/net/fib_trie | grep -c 127.0.0.11; "
                                "cat /sys/class/net/lo/operstate; "
                                "cat /proc/net/route | wc -l")
                count, state, routes = out.split()
                assert int(count) >= 1 and state in ("unknown", "up") and int(routes) >= 2
                # Outbound TCP goes to coved's proxy, which answers 403 for what no rule
                # allows; without the namespace's rules nothing would listen there (refused),
                # as nothing listens on the sandbox's own 127.0.0.1:9.
                r = d.exec(sid, "curl -sS -m 5 -o /dev/null -w '%{http_code}' "
                                "http://127.77.0.9:9/")
                assert r.stdout.strip() == "403", (r.stdout, r.stderr)
                r = d.exec(sid, "curl -sS -m 5 -o /dev/null -w '%{http_code}' "
                                "http://127.0.0.1:9/")
                assert r.exit_code == 7, (r.stdout, r.stderr)  # loopback stays the sandbox's
        finally:
            for sid in sids:
                d.delete(sid)
        # Refilled once creates pause: the stock is whole again.
        assert wait_until(lambda: len(set(netns_fds(d.proc.pid)) - {own}) == STOCK)
        pid = d.proc.pid
    assert not os.path.exists(f"/proc/{pid}")
    # No maker left behind either (a maker is a child of coved, and dies with it).
    leftover = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    assert leftover.stdout.strip() == ""


LAYERS = 4  # RUNTIME_SPARES_LAYERS


def spare_images(d):
    return sorted(glob.glob(os.path.join(d.state_dir, "layers", ".making-spare-*.img")))


def loops_of(state_dir):
    out = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if state_dir in line]


@pytest.mark.native_only("the spares serve the native runtime's set-up; oci and gvisor make their own")
def test_disk_layers_made_ahead_are_whole_layers_of_their_own():
    with serve() as d:
        state = d.state_dir
        made = spare_images(d)
        assert len(made) == LAYERS  # of the default size, before coved answered
        sids = [d.create() for _ in range(LAYERS + 2)]
        try:
            for sid in sids:
                # Its image moved into its run dir; its writable layer is that ext4 alone.
                assert os.path.exists(os.path.join(d.run_dir(sid), "layer.img"))
                d.sh(sid, f"echo {sid} > /mine")
            for sid in sids:  # were two sandboxes' layers one, a file would be the other's
                assert d.sh(sid, "cat /mine").strip() == sid
                size = int(d.sh(sid, "df -B1 --output=size / | tail -1"))
                assert 0.9 * 2**30 < size <= 2**30  # the default cap, 1 GiB
            # Each its own image, none of them still in the stock.
            images = {os.stat(os.path.join(d.run_dir(sid), "layer.img")).st_ino for sid in sids}
            assert len(images) == len(sids)
            assert not images & {os.stat(p).st_ino for p in spare_images(d)}
            # Another size is made at create time, and becomes what the stock is made of.
            other = d.create(limits={"cpu": "500m", "memory": "512Mi",
                                     "ephemeral-storage": "256Mi"})
            sids.append(other)
            size = int(d.sh(other, "df -B1 --output=size / | tail -1"))
            assert size <= 256 * 2**20
        finally:
            for sid in sids:
                d.delete(sid)
        assert wait_until(lambda: len(spare_images(d)) == LAYERS)
    # Gone with coved: no image, no loop device left behind.
    assert not glob.glob(os.path.join(state, "layers", ".making-*"))
    assert wait_until(lambda: not loops_of(state))


RUN_DIRS = 8  # RUNTIME_SPARES_RUNDIRS


def spare_run_dirs(state_dir):
    return sorted(glob.glob(os.path.join(state_dir, "run-spares", ".spare-*")))


@pytest.mark.native_only("the spares serve the native runtime's set-up; oci and gvisor make their own")
def test_run_dirs_made_ahead_and_what_a_dead_coved_left():
    d = serve(start=False)
    with d as coved:
        # What a coved killed with spares in stock left: removed at the next start.
        stale = os.path.join(coved.state_dir, "run-spares", ".spare-0123456789abcdef")
        os.makedirs(stale)
        open(os.path.join(stale, "agent.sock"), "w").close()
        coved.start()
        assert not os.path.exists(stale)
        made = spare_run_dirs(coved.state_dir)
        assert len(made) == RUN_DIRS
        sids = [coved.create() for _ in range(RUN_DIRS + 2)]
        try:
            assert os.listdir(os.path.join(coved.state_dir, "run")) != []
            assert not [n for n in os.listdir(os.path.join(coved.state_dir, "run"))
                        if n not in sids]  # STATE/run lists sandboxes only
            for sid in sids:
                assert os.path.exists(os.path.join(coved.run_dir(sid), "agent.sock"))
                assert coved.sh(sid, "echo ok").strip() == "ok"  # its agent listens there
        finally:
            for sid in sids:
                coved.delete(sid)
        assert wait_until(lambda: len(spare_run_dirs(coved.state_dir)) == RUN_DIRS)
        state = coved.state_dir
    assert not spare_run_dirs(state)


@pytest.mark.native_only("the spares serve the native runtime's set-up; oci and gvisor make their own")
def test_deleted_run_dirs_are_removed_off_the_event_loop():
    d = serve(start=False)
    with d as coved:
        trash = os.path.join(coved.state_dir, "run-trash")
        os.makedirs(os.path.join(trash, "left-by-a-dead-coved", "upper"))
        open(os.path.join(trash, "left-by-a-dead-coved", "layer.img"), "w").close()
        coved.start()
        sids = [coved.create() for _ in range(3)]
        for sid in sids:
            coved.sh(sid, "head -c 4000000 /dev/urandom > /big")  # blocks for ext4 to free
        for sid in sids:
            coved.delete(sid)
            assert not os.path.exists(coved.run_dir(sid))  # gone as the delete answers
        # The trash, the dead coved's leftover included, is emptied once deletes pause.
        assert wait_until(lambda: os.listdir(trash) == [])
        # The deleted sandboxes' loop devices went with them (the stock's stay).
        assert wait_until(lambda: not [line for line in loops_of(coved.state_dir)
                                       if ".making-spare-" not in line])


@pytest.mark.native_only("the native runtime writes the cpu limit after its set-up; oci and gvisor give it to their runtime")
def test_cpu_limit_holds_once_the_sandbox_runs():
    """The set-up runs before the cpu limit is written (a small limit would throttle coved's
    own work); by the time the create is answered and the sandbox runs, the limit holds."""
    with serve() as d:
        for cpu, quota in (("250m", 25000), ("2", 200000)):
            sid = d.create(limits={"cpu": cpu, "memory": "256Mi"})
            try:
                assert d.get(sid)["status"]["state"] == "Running"
                v1 = cgroup_file(sid, "cpu", "cpu.cfs_quota_us")
                v2 = cgroup_file(sid, "cpu", "cpu.max")
                assert (v1 == str(quota)) or (v2 == f"{quota} 100000"), (v1, v2)
                # What the sandbox itself reads, as its cgroup namespace shows it.
                inside = d.sh(sid, "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null || "
                                   "cut -d' ' -f1 /sys/fs/cgroup/cpu.max")
                assert inside.strip() == str(quota)
            finally:
                d.delete(sid)
