"""The agent as the sandbox's PID 1, signalled from inside: SIGTERM, SIGINT and SIGHUP sent
to it by the sandbox's root are not a shutdown (only a signal from outside the pid namespace,
coved's or an operator's, stops it), and neither is ^C on the terminal coved was started
from. Host, coved and a second sandbox are checked afterwards."""

import fcntl
import os
import pty
import select
import signal
import subprocess
import tempfile
import termios
import time

from covetest import AGENT, COVED, Coved, sandbox_init_pid, sandbox_leftovers


def state(coved, sid):
    return coved.get(sid)["status"]["state"]


def check_still_fine(coved, make_sandbox):
    """coved answers and a new sandbox runs commands."""
    coved.health()
    other = make_sandbox()
    assert coved.sh(other, "echo ok") == "ok\n"


# ---- item 9: kill 1 from inside ----

def test_signals_to_pid_1_from_inside_are_ignored(coved, make_sandbox):
    sid = make_sandbox()
    agent_before = sandbox_init_pid(sid)
    # As root of the sandbox, the three signals a shell's `kill 1` reaches for. Before the fix
    # SIGTERM made the agent stop every process (this very shell included) and exit.
    r = coved.exec(sid, "id -u; kill -TERM 1; kill -INT 1; kill -HUP 1; sleep 1; echo survived")
    assert r.exit_code == 0, (r.exit_code, r.stdout, r.stderr)
    assert r.stdout == "0\nsurvived\n"
    # A loop of them, bounded in count, while commands keep running.
    r = coved.exec(sid, "for i in $(seq 200); do kill -TERM 1; kill -INT 1; done; echo done")
    assert r.exit_code == 0 and r.stdout == "done\n"
    for _ in range(3):
        assert state(coved, sid) == "Running"
        assert coved.sh(sid, "echo alive") == "alive\n"
        time.sleep(0.5)
    assert sandbox_init_pid(sid) == agent_before  # the same agent, not a restarted one
    # coved still tears it down, from outside, leaving nothing behind.
    coved.delete(sid)
    deadline = time.time() + 20
    while sandbox_leftovers(coved, sid) and time.time() < deadline:
        time.sleep(0.2)
    assert sandbox_leftovers(coved, sid) == []
    check_still_fine(coved, make_sandbox)


def test_sigterm_from_outside_still_stops_the_sandbox(coved, make_sandbox):
    """The signal coved's host side (or an operator) sends still is a shutdown: the agent
    stops the sandbox's processes and exits."""
    sid = make_sandbox()
    assert coved.sh(sid, "echo up") == "up\n"  # the agent itself runs, not coved's child before
    pid = sandbox_init_pid(sid)
    pidfd = os.pidfd_open(pid)
    try:
        os.kill(pid, signal.SIGTERM)
        readable, _, _ = select.select([pidfd], [], [], 20)  # readable once it has exited
        assert readable, "the agent did not exit on SIGTERM from outside"
    finally:
        os.close(pidfd)
    coved.delete(sid)
    check_still_fine(coved, make_sandbox)


def test_ctrl_c_on_coveds_terminal_does_not_stop_sandboxes(make_sandbox):
    """coved run in the foreground of a terminal, then ^C and the terminal closed: its
    sandboxes keep running (item 8, the agent's half: a terminal's SIGINT and SIGHUP are not
    the agent's to act on, whichever process group it is in), and a new coved re-adopts them
    Running."""
    # A short path, as covetest's own: the agent's socket in state_dir/run/ID must fit a unix
    # socket's path (a pytest tmp_path under xdist, .../popen-gwN/..., may not).
    state_dir = tempfile.mkdtemp(prefix="cove-test-")
    master, slave = pty.openpty()

    def on_the_terminal():  # coved leads a session whose terminal is the pty's
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    log = open(os.path.join(state_dir, "coved.log"), "ab")
    proc = subprocess.Popen([COVED, "--listen", "127.0.0.1:0", "--state-dir", state_dir,
                             "--agent", AGENT, "--api-key", "test-key"],
                            stdin=slave, stdout=subprocess.PIPE, stderr=log,
                            preexec_fn=on_the_terminal)
    os.close(slave)
    log.close()
    restarted = Coved(state_dir=state_dir)
    try:
        line = proc.stdout.readline().decode()
        assert "ready on" in line, line
        first = Coved(state_dir=state_dir)
        first.port = int(line.strip().rsplit(":", 1)[1])
        sid = first.create()
        assert first.sh(sid, "echo up") == "up\n"
        agent = sandbox_init_pid(sid)
        os.write(master, b"\x03")  # ^C: SIGINT to the terminal's foreground process group
        proc.wait(20)
        os.close(master)  # hang-up for whatever is left on the terminal
        master = None
        time.sleep(1)
        os.kill(agent, 0)  # the agent lives
        restarted.start()
        deadline = time.time() + 20
        while state(restarted, sid) != "Running" and time.time() < deadline:
            time.sleep(0.2)
        assert state(restarted, sid) == "Running"
        assert restarted.sh(sid, "echo still") == "still\n"
        restarted.delete(sid)
    finally:
        if master is not None:
            os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        restarted.cleanup()  # kills what is left of the sandboxes in state_dir


