"""Create and delete 100 sandboxes, 20 at a time: nothing of theirs stays behind - no process,
mount, cgroup, network namespace, run dir, or descriptor in the daemon."""

import glob
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from hostile import netns_inodes, own_netns, socket_netns_of
from covetest import cgroup_dirs, descendants, sandbox_host_pids, sandbox_leftovers, settled_fds

WAVES, WIDTH = 5, 20
SERVER = ["python3", "-m", "http.server", "--bind", "127.0.0.1", "8080", "--directory", "/tmp"]


def cove_cgroups():
    return {os.path.basename(d) for d in glob.glob("/sys/fs/cgroup/**/cove/*", recursive=True)
            if os.path.isdir(d)}


def named_netns():
    try:
        return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    except OSError:
        return ""


def test_create_delete_100_leaves_nothing(coved):
    pid = coved.proc.pid
    netns_before, named_before = netns_inodes(), named_netns()
    fds_before = settled_fds(pid)
    host_ns = own_netns()
    ids = []

    def create(i):
        # One wave serves HTTP, so the gateway opens sockets inside sandboxes' namespaces.
        if i // WIDTH == 1:
            return coved.create(entrypoint=SERVER, limits={"cpu": "500m", "memory": "128Mi"})
        return coved.create(limits={"cpu": "500m", "memory": "128Mi", "pids": "32"})

    def touch(sid):
        out = coved.sh(sid, "echo $HOSTNAME")
        assert out == sid + "\n"
        # Through the gateway to a sandbox port: answered by the server, or refused.
        for _ in range(100):
            status, _, _ = coved.request("GET", f"/sandboxes/{sid}/proxy/8080/")
            if status == 200 or sid not in served:
                break
            time.sleep(0.1)  # the server is still starting
        return status

    served = set()
    statuses = []
    with ThreadPoolExecutor(WIDTH) as pool:
        for wave in range(WAVES):
            new = list(pool.map(create, range(wave * WIDTH, (wave + 1) * WIDTH)))
            ids += new
            if wave == 1:
                served.update(new)
            statuses += list(pool.map(touch, new))
            # They really run: coved's descendants, or (an OCI runtime daemonizes them)
            # processes in their cgroups.
            assert len(descendants(pid)) >= WIDTH or all(sandbox_host_pids(s) for s in new)
            list(pool.map(coved.delete, new))
    print(f"gateway statuses: {sorted(set(statuses))}")
    assert statuses.count(200) == WIDTH, statuses

    left = {sid: l for sid in ids if (l := sandbox_leftovers(coved, sid))}
    assert left == {}, f"leftovers: {left}"
    assert cove_cgroups() & set(ids) == set()
    assert all(cgroup_dirs(sid) == [] for sid in ids)
    run = os.path.join(coved.state_dir, "run")
    assert set(os.listdir(run) if os.path.isdir(run) else []) & set(ids) == set()
    assert descendants(pid) == []
    # No network namespace of theirs survives: none held by a process of the daemon's, and
    # none kept alive by a socket the daemon still holds.
    assert not any(os.stat(f"/proc/{p}/ns/net").st_ino not in netns_before
                   for p in descendants(pid))
    assert named_netns() == named_before  # nothing under /run/netns either
    foreign = {fd: ns for fd, ns in socket_netns_of(pid).items() if ns != host_ns}
    assert foreign == {}, f"coved holds sockets in sandbox namespaces: {foreign}"
    with open(f"/proc/{pid}/mountinfo") as f:
        mounts = f.read()
    assert not any(sid in mounts for sid in ids)
    fds_after = settled_fds(pid)
    print(f"coved fds {fds_before} -> {fds_after}; new netns on the host: "
          f"{len(netns_inodes() - netns_before)} (other users' included)")
    assert fds_after <= fds_before + 2
    assert coved.health()["status"] == "healthy"
    assert coved.ok("GET", "/v1/sandboxes").get("items", []) == []
