"""Filesystem isolation: the host's files are out of reach, the shared OS is read-only, and
what a sandbox writes stays in that sandbox."""

import os
import secrets
import shlex
import subprocess

import pytest

from hostile import delete_and_check

SEARCH_DIRS = "/root /home /tmp /etc /var /run /opt /srv /mnt /media /dev/shm"


def find_everywhere(coved, sid, name):
    """Paths named `name` anywhere in the sandbox (/proc, /sys and /dev included). The
    sandbox's own /etc/passwd is found too, which shows the walk really ran."""
    out = coved.sh(sid, f"find / \\( -name {name} -o -path /etc/passwd \\) -print 2>/dev/null; "
                        "true")
    lines = out.split()
    assert "/etc/passwd" in lines, f"find did not run: {out!r}"
    return [l for l in lines if l != "/etc/passwd"]


def grep_everywhere(coved, sid, data):
    """Files under SEARCH_DIRS holding `data`; a canary of the sandbox's own shows grep ran."""
    out = coved.sh(sid, f"echo {data} > /tmp/.canary; grep -rIl {data} {SEARCH_DIRS} "
                        f"2>/dev/null; rm /tmp/.canary")
    lines = out.split()
    assert "/tmp/.canary" in lines, f"grep did not run: {out!r}"
    return [l for l in lines if l != "/tmp/.canary"]


def test_host_markers_invisible(coved, make_sandbox, host_markers):
    sid = make_sandbox()
    for path in host_markers.paths:
        r = coved.exec(sid, f"cat {shlex.quote(path)}")
        assert r.exit_code != 0, f"{path} is readable inside: {r.stdout!r}"
        assert host_markers.secret not in r.stdout
        r = coved.exec(sid, f"ls -d {shlex.quote(os.path.dirname(path))}/* 2>/dev/null; true")
        assert host_markers.name not in r.stdout
    # The host's own trees are not there at all (the sandbox's /root and /tmp are its own).
    r = coved.exec(sid, f"ls -d /work {shlex.quote(coved.state_dir)} 2>&1; true")
    assert "No such file or directory" in r.stdout and r.stdout.count("\n") == 2, r.stdout
    assert find_everywhere(coved, sid, host_markers.name) == []
    assert grep_everywhere(coved, sid, host_markers.secret) == []
    # Walking out with .. ends at the sandbox's root.
    out = coved.sh(sid, "cd /tmp/../../../../..; pwd; ls")
    assert out.split("\n")[0] == "/" and "work" not in out.split()
    host_markers.intact()
    delete_and_check(coved, sid)


def write_attempts(path_prefix):
    """Shell lines that each try to change /usr; each prints FAIL or WROTE."""
    name = path_prefix
    tries = [
        f"echo x > /usr/{name}",
        f"mkdir /usr/{name}",
        f"echo x > /usr/bin/{name}",
        f"echo x > /usr/local/{name}",
        "echo x >> /usr/bin/ls",
        "chmod 4777 /usr/bin/ls",
        "touch /usr/bin/ls",
        f"ln -s /etc/passwd /usr/lib/{name}",
        "rm -f /usr/bin/ls",
        "mount -o remount,rw /usr",
        "mount -o remount,rw,bind /usr",
        "umount -l /usr",
    ]
    return "\n".join(f"if {t} 2>/dev/null; then echo WROTE: {shlex.quote(t)}; "
                     f"else echo FAIL; fi" for t in tries), len(tries)


@pytest.mark.parametrize("uid", [None, 1000])
def test_usr_read_only_home_and_tmp_writable(coved, make_sandbox, uid):
    sid = make_sandbox()
    name = "cove-sec-" + secrets.token_hex(6)
    ls_before = os.stat("/usr/bin/ls")
    kw = {} if uid is None else {"uid": uid}
    script, n = write_attempts(name)
    r = coved.exec(sid, script, **kw)
    assert r.stdout.split("\n").count("FAIL") == n, r.stdout
    # /usr is still mounted read-only afterwards.
    r = coved.exec(sid, "touch /usr/x 2>&1; grep ' /usr ' /proc/self/mounts")
    assert "Read-only file system" in r.stdout and " ro," in r.stdout, r.stdout
    # Nothing reached the host's /usr.
    for p in (f"/usr/{name}", f"/usr/bin/{name}", f"/usr/local/{name}", f"/usr/lib/{name}"):
        assert not os.path.lexists(p), f"{p} appeared on the host"
    st = os.stat("/usr/bin/ls")
    assert (st.st_mode, st.st_size, st.st_mtime) == \
        (ls_before.st_mode, ls_before.st_size, ls_before.st_mtime)
    # The sandbox's own writable places.
    for d in ("/home/user", "/tmp"):
        out = coved.sh(sid, f"echo data > {d}/{name} && cat {d}/{name} && rm {d}/{name}", **kw)
        assert out == "data\n"
    delete_and_check(coved, sid)


@pytest.fixture
def usr_submount():
    """A tmpfs mounted under the host's /usr, as /usr/local or a package cache might be."""
    path = "/usr/local/cove-sec-submount-" + secrets.token_hex(4)
    os.mkdir(path)
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "cove-sec", path], check=True)
        try:
            yield path
        finally:
            subprocess.run(["umount", "-l", path], check=False)
    finally:
        os.rmdir(path)


def test_usr_submounts_read_only(coved, make_sandbox, usr_submount):
    """Every mount under the shared /usr is read-only inside, not only /usr itself."""
    sid = make_sandbox()
    r = coved.exec(sid, f"echo x > {usr_submount}/written; echo rc=$?; "
                        f"grep ' {usr_submount} ' /proc/self/mounts")
    assert "rc=0" not in r.stdout, f"a submount of /usr is writable: {r.stdout}"
    assert not os.path.exists(os.path.join(usr_submount, "written"))
    delete_and_check(coved, sid)


def test_sandboxes_cannot_see_each_others_files(coved, make_sandbox):
    a, b = make_sandbox(), make_sandbox()
    name = "cove-sec-file-" + secrets.token_hex(6)
    secret = "cove-sec-data-" + secrets.token_hex(16)
    places = ["/tmp", "/home/user", "/root", "/etc", "/var/tmp", "/dev/shm", "/"]
    coved.sh(a, "; ".join(f"echo {secret} > {p.rstrip('/')}/{name}" for p in places))
    assert coved.sh(a, f"cat /tmp/{name}") == secret + "\n"
    assert find_everywhere(coved, b, name) == [], "B finds A's files"
    assert grep_everywhere(coved, b, secret) == [], "B finds A's data"
    # Nor did it land in the shared template or anywhere under the daemon's state dir.
    hits = subprocess.run(["grep", "-rIl", "--no-messages", "--exclude=*.log", secret,
                           coved.state_dir],
                          capture_output=True, text=True).stdout
    assert hits == "", f"A's data is on the host: {hits}"
    # A fresh sandbox starts from the clean template.
    c = make_sandbox()
    assert find_everywhere(coved, c, name) == []
    # ... while A itself still has them all.
    assert len(find_everywhere(coved, a, name)) == len(places)
    for sid in (a, b, c):
        delete_and_check(coved, sid)


@pytest.mark.not_under("gvisor", reason="no cgroup files inside gVisor: limits are not readable from the sandbox")
def test_own_cgroups_visible_read_only_and_nothing_else(coved, make_sandbox):
    """/sys/fs/cgroup shows the sandbox's own cgroups (its limits, for tools and the agent's
    metrics), read-only, and none of the host's or other sandboxes'."""
    other = make_sandbox()
    sid = make_sandbox(limits={"cpu": "500m", "memory": "256Mi", "pids": "100"})
    v1 = os.path.isdir("/sys/fs/cgroup/memory/cove")
    limit = "/sys/fs/cgroup/memory/memory.limit_in_bytes" if v1 else "/sys/fs/cgroup/memory.max"
    assert coved.sh(sid, f"cat {limit}") == f"{256 * 1024 * 1024}\n"
    pids = "/sys/fs/cgroup/pids/pids.max" if v1 else "/sys/fs/cgroup/pids.max"
    assert coved.sh(sid, f"cat {pids}") == "100\n"
    for attempt in (f"echo 999999999999 > {limit}", f"echo max > {pids}",
                    "mkdir /sys/fs/cgroup/memory/escape || mkdir /sys/fs/cgroup/escape",
                    "mount -o remount,rw /sys/fs/cgroup"):
        r = coved.exec(sid, attempt)
        assert r.exit_code != 0, attempt
    assert coved.sh(sid, f"cat {limit}") == f"{256 * 1024 * 1024}\n"
    listing = coved.sh(sid, "find /sys/fs/cgroup -maxdepth 3 -type d; true")
    assert other not in listing and sid not in listing and "/cove" not in listing
