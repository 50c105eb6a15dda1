"""Process and network isolation: a sandbox sees its own processes and its own loopback only;
the host's services and other sandboxes are out of reach."""

import pytest
import os
import secrets
import socket

from hostile import HostListener, delete_and_check, host_ipv4_addresses, run_python
from covetest import sandbox_host_pids


def proc_table(coved, sid):
    """{pid: cmdline} of every process the sandbox can see in /proc."""
    out = coved.sh(sid, "for p in /proc/[0-9]*; do printf '%s ' ${p#/proc/}; "
                        "tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done")
    table = {}
    for line in out.splitlines():
        pid, _, cmd = line.partition(" ")
        table[int(pid)] = cmd.strip()
    return table


def test_only_own_processes_visible(coved, make_sandbox):
    tag = "cove-sec-proc-" + secrets.token_hex(4)
    sid = make_sandbox(entrypoint=["bash", "-c", f"exec -a {tag} sleep infinity"])
    table = proc_table(coved, sid)
    # (an OCI runtime's agent is /run/cove/cove-agent)
    assert table[1].split()[0].endswith("cove-agent"), table
    assert any(cmd.startswith(tag) for cmd in table.values()), table
    # Everything visible is the agent, the entrypoint or this very command.
    others = {p: c for p, c in table.items()
              if not c.startswith(("cove-agent", "/run/cove/cove-agent ", tag, "/usr/bin/bash -c for p in", "tr "))}
    assert others == {}, f"foreign processes visible: {others}"
    # As many as the host counts in the sandbox's cgroup (the command's own come and go).
    assert len(table) <= len(sandbox_host_pids(sid)) + 2
    # The host's processes are not there by any number.
    for pid in (1, os.getpid(), coved.proc.pid, os.getppid()):
        if pid in table:
            assert not any(w in table[pid] for w in ("coved", "pytest", "python3 -m")), table
    r = coved.exec(sid, f"cat /proc/{coved.proc.pid}/cmdline; ls /proc/{os.getpid()}")
    assert r.exit_code != 0 and "coved" not in r.stdout
    ps = coved.sh(sid, "ps -eo pid=,args=")
    assert "coved" not in ps and "pytest" not in ps and ps.split()[0] == "1", ps
    delete_and_check(coved, sid)


@pytest.mark.not_under("gvisor", reason="runsc's netstack shows its own routes and no /sys/class/net")
def test_only_loopback(coved, make_sandbox):
    sid = make_sandbox()
    assert coved.sh(sid, "ls /sys/class/net").split() == ["lo"]
    dev = coved.sh(sid, "cat /proc/net/dev").splitlines()[2:]
    assert [l.split(":")[0].strip() for l in dev] == ["lo"], dev
    links = coved.sh(sid, "ip -o link show").splitlines()
    assert len(links) == 1 and ": lo:" in links[0], links
    # lo only, and its default route: every outside address leads to coved's egress proxy
    # (docs/egress.md), never to an interface of the host
    assert coved.sh(sid, "ip -4 route show; ip -6 route show | grep -v '^::1 '; true") == \
        "default dev lo scope link src 127.0.0.1 \n"
    addrs = coved.sh(sid, "ip -o addr show | awk '{print $4}'").split()
    assert sorted(addrs) == ["127.0.0.1/8", "127.0.0.11/32", "::1/128"], addrs
    # The host's unix sockets (the daemon's agent sockets among them) are not listed.
    unix = coved.sh(sid, "cat /proc/net/unix")
    assert coved.state_dir not in unix
    delete_and_check(coved, sid)


CONNECT_SCRIPT = r"""
import json, socket
res = {}
def tcp(name, host, port):
    # Every outside address leads to coved's egress proxy, which takes the connection and
    # then refuses it: what counts is whether the service behind answered.
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect((host, port))
        s.sendall(b"GET /health HTTP/1.0\r\nHost: x\r\n\r\n")
        reply = s.recv(300)
        res[name] = "connected" if b"healthy" in reply or b"cove-sec-host" in reply else \
            "refused by the proxy: " + reply[:60].decode(errors="replace")
    except OSError as e:
        res[name] = type(e).__name__ + ":" + str(e.errno)
    finally:
        s.close()
def udp(name, host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.sendto(b"cove-sec", (host, port)); res[name] = "sent"
    except OSError as e:
        res[name] = type(e).__name__ + ":" + str(e.errno)
    finally:
        s.close()
def abstract(name, path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path); res[name] = "connected"
    except OSError as e:
        res[name] = type(e).__name__ + ":" + str(e.errno)
    finally:
        s.close()
for name, host, port in %(tcp)r:
    tcp(name, host, port)
for name, host, port in %(udp)r:
    udp(name, host, port)
for name, path in %(abstract)r:
    abstract(name, path.encode())
# vsock is not namespaced: it would lead to the VM host. Only creating the socket is tried.
try:
    socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM).close(); res["vsock socket"] = "created"
except OSError as e:
    res["vsock socket"] = type(e).__name__ + ":" + str(e.errno)
print(json.dumps(res))
"""


def test_host_services_unreachable(coved, make_sandbox):
    sid = make_sandbox()
    local = HostListener("127.0.0.1")
    anyaddr = HostListener("0.0.0.0")
    abstract_name = "\0cove-sec-" + secrets.token_hex(6)
    unix = HostListener(abstract_name, socket.AF_UNIX)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.setblocking(False)
    try:
        tcp = [("daemon", "127.0.0.1", coved.port), ("host 127.0.0.1", "127.0.0.1", local.port),
               ("host 0.0.0.0 via lo", "127.0.0.1", anyaddr.port),
               ("host ssh", "127.0.0.1", 22)]
        for a in host_ipv4_addresses():
            tcp += [(f"daemon via {a}", a, coved.port), (f"host via {a}", a, anyaddr.port)]
        tcp += [("metadata", "169.254.169.254", 80), ("internet", "1.1.1.1", 443)]
        res = run_python(coved, sid, CONNECT_SCRIPT % {
            "tcp": tcp, "udp": [("udp to host", "127.0.0.1", udp.getsockname()[1])],
            "abstract": [("abstract unix", abstract_name)]}, http_timeout=60)
        print(res)
        assert {k: v for k, v in res.items() if v in ("connected", "created")} == {}, res
        # bash's /dev/tcp too.
        r = coved.exec(sid, f"echo x > /dev/tcp/127.0.0.1/{coved.port}")
        assert r.exit_code != 0
        assert local.accepted() == 0 and anyaddr.accepted() == 0 and unix.accepted() == 0
        try:
            data = udp.recv(100)
        except BlockingIOError:
            data = None
        assert data is None, "a datagram from the sandbox reached the host"
    finally:
        for s in (local, anyaddr, unix, udp):
            s.close()
    assert coved.health()["status"] == "healthy"
    delete_and_check(coved, sid)


SERVE_SCRIPT = r"""
import os, socket, sys, time
t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind(("127.0.0.1", 7777)); t.listen(8)
u = socket.socket(socket.AF_UNIX); u.bind(b"\0cove-sec-peer"); u.listen(8)
print("listening", flush=True)
time.sleep(600)
"""


def test_sandboxes_cannot_see_each_others_processes_or_network(coved, make_sandbox):
    tag = "cove-sec-peer-" + secrets.token_hex(4)
    a = make_sandbox(entrypoint=["bash", "-c", f"exec -a {tag} sleep infinity"])
    b = make_sandbox()
    assert tag in coved.sh(a, "ps -eo args=")
    # A listens on its loopback (TCP and an abstract unix socket) and makes IPC objects.
    coved.sh(a, "setsid python3 -c '" + SERVE_SCRIPT.replace("'", "'\\''") +
             "' > /tmp/serve.log 2>&1 < /dev/null & "
             "for i in $(seq 50); do grep -q listening /tmp/serve.log && break; sleep 0.1; done; "
             "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 7777)).close()'")
    coved.sh(a, "ipcmk -M 4096 -p 0666 >/dev/null && ipcmk -Q >/dev/null && "
                "ipcmk -S 1 >/dev/null")
    ps_b = coved.sh(b, "ps -eo pid=,args=")
    assert tag not in ps_b and "cove-sec-peer" not in ps_b and "python3 -c" not in ps_b, ps_b
    assert "sleep infinity" in ps_b  # B's own entrypoint
    # B's own ps matches what the host counts in B's cgroup: nothing borrowed from A.
    assert len(ps_b.splitlines()) <= len(sandbox_host_pids(b)) + 2  # + the shell and ps
    res = run_python(coved, b, CONNECT_SCRIPT % {
        "tcp": [("A's port", "127.0.0.1", 7777)], "udp": [],
        "abstract": [("A's abstract socket", "\0cove-sec-peer")]})
    assert {k: v for k, v in res.items() if v == "connected"} == {}, res
    ipcs = coved.sh(b, "ipcs -a")
    assert "0x" not in ipcs.replace("0x00000000", ""), ipcs
    assert len([l for l in ipcs.splitlines() if l.startswith("0x")]) == 0, ipcs
    # A pid of A's, as the host numbers it, means nothing in B.
    host_pid = sandbox_host_pids(a)[0]
    r = coved.exec(b, f"kill -0 {host_pid} && echo alive")
    assert "alive" not in r.stdout
    for sid in (a, b):
        delete_and_check(coved, sid)
