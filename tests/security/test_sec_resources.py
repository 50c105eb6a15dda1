"""Resource bombs: a fork bomb, a memory bomb and a disk filler hit the sandbox's own limits;
the sandbox's agent, the daemon, other sandboxes and the host carry on."""

import os
import statistics
import threading
import time

import pytest

from hostile import delete_and_check, run_python
from covetest import ApiError, cgroup_dirs, cgroup_file, descendants, sandbox_init_pid

MiB = 1 << 20


class Sampler(threading.Thread):
    """Samples a cgroup counter of one sandbox until stopped; keeps the peak."""

    def __init__(self, sid, controller, name, interval=0.02):
        super().__init__(daemon=True)
        self.sid, self.controller, self.name, self.interval = sid, controller, name, interval
        self.peak = 0
        self.samples = 0
        self.halt = threading.Event()

    def run(self):
        while not self.halt.is_set():
            v = cgroup_file(self.sid, self.controller, self.name)
            if v is not None and v.isdigit():
                self.peak = max(self.peak, int(v))
                self.samples += 1
            time.sleep(self.interval)

    def stop(self):
        self.halt.set()
        self.join()
        return self.peak


def pids_events_max(sid):
    """How often the pids limit refused a fork (v1 and v2 both say `max N`)."""
    ev = cgroup_file(sid, "pids", "pids.events") or "max 0"
    return int(dict(l.split() for l in ev.splitlines()).get("max", 0))


def answer_within(coved, sid, seconds):
    """Retries `echo` until the sandbox answers; returns the wait, or None."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        try:
            r = coved.exec(sid, "echo alive", http_timeout=seconds)
            if r.exit_code == 0 and r.stdout == "alive\n":
                return time.monotonic() - t0
        except (ApiError, OSError):
            pass
        time.sleep(0.2)
    return None


@pytest.mark.not_under("gvisor", reason="the sentry lives in the sandbox's cgroups (pids headroom, its memory): bombs take the sandbox down instead")
def test_fork_bomb_stops_at_pids_limit(coved, make_sandbox):
    """A blocking bomb (every copy waits for its two children) and a Python fork loop, each
    ended by the command's timeout (the agent kills its process group)."""
    baseline = len(descendants(coved.proc.pid))
    sid = make_sandbox(limits={"cpu": "1", "memory": "512Mi", "pids": "64"})
    assert cgroup_file(sid, "pids", "pids.max") == "64"
    agent = sandbox_init_pid(sid)
    for bomb in ("bomb(){ bomb | bomb; }; bomb 2>/dev/null",
                 "python3 -c 'import os, time\nwhile True:\n"
                 "    try: os.fork()\n    except OSError: time.sleep(0.01)'"):
        before = pids_events_max(sid)
        sampler = Sampler(sid, "pids", "pids.current")
        sampler.start()
        try:
            t0 = time.monotonic()
            r = coved.exec(sid, bomb, timeout_ms=3000)
            took = time.monotonic() - t0
            during = len(descendants(coved.proc.pid))
            waited = answer_within(coved, sid, 60)
        finally:
            peak = sampler.stop()
        print(f"{bomb.split(chr(10))[0]}: peak {peak} pids, {pids_events_max(sid) - before} "
              f"forks refused, ended after {took:.1f}s ({r.exit_code}), coved's descendants "
              f"{baseline} -> {during}, sandbox answered after {waited:.3f}s")
        assert 0 < peak <= 64 and pids_events_max(sid) > before
        assert r.exit_code != 0
        assert waited is not None, "the sandbox no longer answers after a fork bomb"
    assert sandbox_init_pid(sid) == agent
    assert coved.health()["status"] == "healthy"
    delete_and_check(coved, sid)
    assert len(descendants(coved.proc.pid)) == baseline
    print(f"host processes: {len([p for p in os.listdir('/proc') if p.isdigit()])}")


@pytest.mark.not_under("gvisor", reason="the sentry lives in the sandbox's cgroups (pids headroom, its memory): bombs take the sandbox down instead")
def test_background_fork_bomb_is_contained(coved, make_sandbox):
    """The classic `:(){ :|:& };:` backgrounds two copies and returns, so the command ends at
    once and the bomb rages on by itself, outside any command's timeout. It stays at the pids
    limit; the daemon and a second sandbox answer; deleting the sandbox ends it."""
    baseline = len(descendants(coved.proc.pid))
    sid = make_sandbox(limits={"cpu": "1", "memory": "512Mi", "pids": "64"})
    other = make_sandbox()
    sampler = Sampler(sid, "pids", "pids.current")
    sampler.start()
    try:
        coved.exec(sid, ":(){ :|:& };: 2>/dev/null")
        time.sleep(2)
        during = len(descendants(coved.proc.pid))
        assert coved.health()["status"] == "healthy"
        assert coved.sh(other, "echo alive") == "alive\n"
        # Its bash copies sleep and retry when a fork fails, holding their pids: the sandbox
        # itself may not get one for a while (reported, not required).
        waited = answer_within(coved, sid, 3)
    finally:
        peak = sampler.stop()
    refused = pids_events_max(sid)
    print(f"classic bomb: peak {peak} pids, {refused} forks refused, coved's descendants "
          f"{baseline} -> {during}, bombed sandbox answered: "
          f"{'after %.3fs' % waited if waited is not None else 'not within 3s'}")
    assert 0 < peak <= 64 and refused > 0
    t0 = time.monotonic()
    delete_and_check(coved, sid)
    print(f"deleted the bombed sandbox in {time.monotonic() - t0:.3f}s")
    delete_and_check(coved, other)
    assert len(descendants(coved.proc.pid)) == baseline


@pytest.mark.not_under("gvisor", reason="the sentry lives in the sandbox's cgroups (pids headroom, its memory): bombs take the sandbox down instead")
def test_memory_bomb_is_oom_killed_inside(coved, make_sandbox):
    sid = make_sandbox(limits={"cpu": "1", "memory": "256Mi", "pids": "64"})
    agent = sandbox_init_pid(sid)
    limit = int(cgroup_file(sid, "memory", "memory.limit_in_bytes") or
                cgroup_file(sid, "memory", "memory.max"))
    assert limit == 256 * MiB
    sampler = Sampler(sid, "memory", "memory.usage_in_bytes")
    sampler.start()
    try:
        r = coved.exec(sid, "python3 -c 'x = b\"x\" * (2 << 30); print(len(x))'")
    finally:
        peak = sampler.stop()
    err = [e["error"] for e in r.events if e.get("type") == "error"]
    print(f"memory bomb: {err}, peak usage {peak / MiB:.0f} MiB of {limit / MiB:.0f}")
    assert r.exit_code == -1 and err and err[0]["traceback"] == ["signal: killed"], r.events
    assert r.stdout == ""
    if sampler.samples:
        assert peak <= limit
    oom = cgroup_file(sid, "memory", "memory.oom_control") or \
        cgroup_file(sid, "memory", "memory.events")
    assert int(dict(l.split() for l in oom.splitlines())["oom_kill"]) >= 1, oom
    # The agent (PID 1) survived and answers; the daemon too.
    assert sandbox_init_pid(sid) == agent
    assert coved.sh(sid, "echo alive") == "alive\n"
    assert coved.sh(sid, "python3 -c 'print(len(b\"y\" * (64 << 20)))'") == f"{64 * MiB}\n"
    assert coved.proc.poll() is None and coved.health()["status"] == "healthy"
    delete_and_check(coved, sid)


def test_the_sandboxes_processes_are_oom_victims_before_its_agent(coved, make_sandbox):
    """Commands and the entrypoint carry oom_score_adj +500, the agent less: however small
    the processes of a workload that fills the memory, the OOM killer takes them first (and,
    host-wide, sandboxed code before the host's own daemons)."""
    sid = make_sandbox(limits={"cpu": "1", "memory": "256Mi", "pids": "64"})
    out = coved.sh(sid, "cat /proc/self/oom_score_adj /proc/1/oom_score_adj; "
                        "for p in /proc/[0-9]*; do [ \"$(cat $p/comm)\" = sleep ] && "
                        "cat $p/oom_score_adj; done; true")
    command, agent, entrypoint = (int(x) for x in out.split()[:3])
    assert command == 500 and entrypoint == 500, out
    assert agent <= 0, out
    host_agent = int(open(f"/proc/{sandbox_init_pid(sid)}/oom_score_adj").read())
    assert host_agent == agent


def du(path):
    total = 0
    for root, dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total


def host_used(path="/"):
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


@pytest.mark.not_under("gvisor", reason="the sentry lives in the sandbox's cgroups (pids headroom, its memory): bombs take the sandbox down instead")
# How much the host's disk use grew is the host's, not this sandbox's alone.
@pytest.mark.serial(reason="measures the whole host's disk use")
@pytest.mark.parametrize("layer", ["tmpfs", "disk"])
def test_disk_filler_hits_enospc(coved, make_sandbox, layer):
    sid = make_sandbox(limits={"cpu": "1", "memory": "512Mi", "ephemeral-storage": "64Mi"},
                       extensions={"cove.layer": layer})
    image = os.path.join(coved.run_dir(sid), "layer.img")
    assert os.path.exists(image) == (layer == "disk")
    state_before, host_before, tmp_before = du(coved.state_dir), host_used("/"), host_used("/tmp")
    r = coved.exec(sid, "dd if=/dev/zero of=/tmp/fill bs=1M")
    assert r.exit_code != 0 and "No space left on device" in r.stderr, r.stderr
    size = int(coved.sh(sid, "stat -c %s /tmp/fill"))
    # (ext4 keeps a few MiB of its 64 for its own metadata)
    assert (48 if layer == "disk" else 56) * MiB <= size <= 64 * MiB, size
    # The whole writable layer is full, not just /tmp; fallocate cannot get around it. (A
    # byte may still fit on ext4, in blocks its delayed allocation had held back.)
    r = coved.exec(sid, "head -c 1048576 /dev/zero > /home/user/more")
    assert r.exit_code != 0 and "No space left on device" in r.stderr
    r = coved.exec(sid, "fallocate -l 1G /tmp/big")
    assert r.exit_code != 0
    usage = int(cgroup_file(sid, "memory", "memory.usage_in_bytes") or
                cgroup_file(sid, "memory", "memory.current"))
    state_after, host_after, tmp_after = du(coved.state_dir), host_used("/"), host_used("/tmp")
    print(f"disk filler ({layer}): {size / MiB:.1f} MiB written, sandbox memory "
          f"{usage / MiB:.0f} MiB, state dir {state_before} -> {state_after} B, host disk used "
          f"{(host_after - host_before) / MiB:+.1f} MiB "
          f"(/tmp {(tmp_after - tmp_before) / MiB:+.1f})")
    if layer == "tmpfs":
        # The layer is memory charged to the sandbox, not the host's disk.
        assert usage >= size
        assert state_after - state_before < MiB
        # (a disk layer would show all 64 MiB; other users of the host leave a margin)
        assert host_after - host_before < 48 * MiB and tmp_after - tmp_before < 48 * MiB
    else:
        # The layer is the sandbox's image on the host's disk, and never more than its cap.
        assert os.stat(image).st_blocks * 512 <= 64 * MiB
        assert state_after - state_before <= 64 * MiB + MiB
    # Freeing space makes it usable again; the agent was never in danger.
    assert coved.sh(sid, "rm /tmp/fill && head -c 1048576 /dev/zero > /tmp/ok && "
                         "stat -c %s /tmp/ok") == "1048576\n"
    delete_and_check(coved, sid)
    assert not os.path.exists(image)


@pytest.mark.not_under("gvisor", reason="the sentry lives in the sandbox's cgroups (pids headroom, its memory): bombs take the sandbox down instead")
def test_host_and_daemon_stay_responsive_under_bombs(coved, make_sandbox):
    cpus = str(min(2, os.cpu_count() or 1))  # all the host has, up to two
    hostile = make_sandbox(limits={"cpu": cpus, "memory": "256Mi", "pids": "64"})
    calm = make_sandbox(limits={"cpu": "500m", "memory": "256Mi"})
    bombs = ("(while :; do :; done) & (while :; do :; done) & "
             "(python3 -c 'l = []\nwhile True: l.append(b\"x\" * (16 << 20))' ; "
             "python3 -c 'l = []\nwhile True: l.append(b\"x\" * (16 << 20))') & "
             "bomb(){ bomb | bomb; }; bomb 2>/dev/null")
    done = threading.Event()
    outcome = {}

    def run():
        try:
            outcome["r"] = coved.exec(hostile, bombs, timeout_ms=6000)
        except Exception as e:  # noqa: BLE001 - reported below
            outcome["e"] = e
        finally:
            done.set()

    t = threading.Thread(target=run)
    t.start()
    echo_ms, health_ms = [], []
    try:
        time.sleep(0.5)
        while not done.is_set():
            t0 = time.monotonic()
            assert coved.sh(calm, "echo hi") == "hi\n"
            echo_ms.append((time.monotonic() - t0) * 1000)
            t0 = time.monotonic()
            assert coved.health()["status"] == "healthy"
            health_ms.append((time.monotonic() - t0) * 1000)
            time.sleep(0.05)
    finally:
        t.join()
    assert "e" not in outcome, outcome
    assert len(echo_ms) >= 3

    def fmt(v):
        return (f"n={len(v)} min {min(v):.1f} median {statistics.median(v):.1f} "
                f"max {max(v):.1f} ms")

    print(f"\nwhile bombing: echo in another sandbox {fmt(echo_ms)}; GET /health {fmt(health_ms)}")
    # Deleting the sandbox while its bomb still rages leaves nothing behind.
    coved.exec(hostile, "bomb(){ bomb | bomb; }; bomb 2>/dev/null & sleep 0.5; echo started")
    delete_and_check(coved, hostile)
    assert coved.sh(calm, "echo hi") == "hi\n"
    delete_and_check(coved, calm)


SOCKET_FLOOD = r"""
import json, resource, socket, time
LIMIT, CONNS = %(limit)d, %(conns)d
def mem(proto):
    for line in open("/proc/net/sockstat"):
        if line.startswith(proto + ":"):
            f = line.split()
            return int(f[f.index("mem") + 1]) * 4096
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
out = {}
# TCP: connections to ourselves whose peer never reads.
base, held, stop = mem("TCP"), [], None
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(CONNS)
chunk = b"x" * 65536
try:
    for _ in range(CONNS):
        c = socket.create_connection(srv.getsockname()); p, _ = srv.accept()
        c.setblocking(False); held += [c, p]
        while mem("TCP") - base < LIMIT:
            try:
                c.send(chunk)
            except BlockingIOError:
                break
        if mem("TCP") - base >= LIMIT:
            break
except OSError as e:
    stop = str(e)
out["tcp"] = mem("TCP") - base
out["tcp_sockets"], out["tcp_stop"] = len(held) // 2, stop
for s in held:
    s.close()
srv.close()
time.sleep(0.5)
# UDP: datagrams to receivers that never read.
base, held, stop = mem("UDP"), [], None
snd = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); snd.setblocking(False)
dgram = b"x" * 60000
try:
    for _ in range(CONNS * 4):
        r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); r.bind(("127.0.0.1", 0))
        r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 30); held.append(r)
        for _ in range(64):
            try:
                snd.sendto(dgram, r.getsockname())
            except OSError:
                break
        if mem("UDP") - base >= LIMIT:
            break
except OSError as e:
    stop = str(e)
out["udp"] = mem("UDP") - base
out["udp_sockets"], out["udp_stop"] = len(held), stop
print(json.dumps(out))
"""


@pytest.mark.not_under("gvisor", reason="the sentry lives in the sandbox's cgroups (pids headroom, its memory): bombs take the sandbox down instead")
# /proc/net/sockstat's "mem" is the whole host's TCP and UDP memory (what other test files'
# traffic uses too), and the flood takes the host's tcp_mem up to a quarter of its limit.
@pytest.mark.serial(reason="measures the whole host's socket memory")
def test_socket_buffers_count_against_the_sandbox(coved, make_sandbox):
    """Data queued on the sandbox's own loopback is kernel memory: it must come out of the
    sandbox's budget, not the host's (cgroup v1 leaves socket buffers out unless kmem.tcp is
    limited; the host's tcp_mem/udp_mem would run out for every socket on it)."""
    memory = 128 * MiB
    with open("/proc/sys/net/ipv4/tcp_mem") as f:
        tcp_max = int(f.read().split()[2]) * 4096
    attempt = min(3 * memory, tcp_max // 4)  # never near the host's own limit
    if attempt < 2 * memory:
        pytest.skip("the host's tcp_mem is too small to tell a bounded sandbox apart safely")
    sid = make_sandbox(limits={"cpu": "1", "memory": "128Mi", "pids": "64"})
    res = run_python(coved, sid, SOCKET_FLOOD % {"limit": attempt, "conns": 256},
                     http_timeout=120)
    print(f"socket flood with {memory / MiB:.0f} MiB of memory: TCP {res['tcp'] / MiB:.0f} MiB "
          f"over {res['tcp_sockets']} connections ({res['tcp_stop']}), UDP "
          f"{res['udp'] / MiB:.0f} MiB over {res['udp_sockets']} sockets ({res['udp_stop']})")
    # The budget, plus what TCP forces through for every connection whatever the limit.
    slack = 16 * MiB + res["tcp_sockets"] * 160 * 1024
    assert res["tcp"] <= memory + slack, "TCP buffers escaped the sandbox's memory limit"
    assert res["udp"] <= memory + 16 * MiB, "UDP buffers escaped the sandbox's memory limit"
    assert coved.sh(sid, "echo alive") == "alive\n"
    delete_and_check(coved, sid)


def test_sandboxes_together_leave_pids_for_the_host(coved, make_sandbox):
    """A sandbox may be allowed more processes than the host has pids, and a few dozen at the
    default limit would fill the pid space: all sandboxes together stay below it, leaving the
    host room to fork."""
    with open("/proc/sys/kernel/pid_max") as f:
        space = int(f.read())
    # the most one sandbox may ask for: half the pid space, or fewer if more would leave its
    # processes under 32 open files each within its share (1/16) of the host's
    with open("/proc/sys/fs/file-max") as f:
        pids = min(space // 2, int(f.read()) // 16 // 32)
    sid = make_sandbox(limits={"memory": "256Mi", "pids": str(pids)})
    with open("/proc/sys/kernel/threads-max") as f:
        space = min(space, int(f.read()))
    own = [d for d in cgroup_dirs(sid)
           if "/pids/cove/" in d or os.path.exists(os.path.join(d, "cgroup.controllers"))][0]
    with open(os.path.join(os.path.dirname(own), "pids.max")) as f:
        cap = f.read().strip()
    print(f"pid space {space}, all sandboxes together {cap}")
    assert cap != "max" and int(cap) <= space - 1024
    delete_and_check(coved, sid)
