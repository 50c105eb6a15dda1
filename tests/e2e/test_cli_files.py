"""The `cove` CLI inside a running sandbox, through its agent: upload and download (streamed,
a 50 MB round trip with bounded memory), `cove files` (ls, cat, rm, mkdir, mv, search, chmod),
`cove exec -d` with `cove logs [-f]`, and `cove shell` driven through a real pseudo-terminal.
Exit statuses as for every command: 0 ok, 1 the server refused, 2 bad usage, 3 unreachable."""

import base64
import fcntl
import hashlib
import json
import os
import pty
import re
import select
import signal
import socket
import stat
import struct
import subprocess
import sys
import termios
import threading
import time

import pytest

from covetest import CLI

UNREACHABLE = "http://127.0.0.1:1"
SETTINGS_ENV = ("COVE_SERVER", "OPEN_SANDBOX_DOMAIN", "COVE_API_KEY", "OPEN_SANDBOX_API_KEY",
                "COVE_STATE_DIR", "COVE_CONFIG_FILE", "XDG_CONFIG_HOME")
MiB = 1024 * 1024


def cli_env(coved, env=None):
    """The environment cove runs with: settings for coved only (no config file of the user
    running the tests); `env` adds to or (value None) removes from it."""
    base = {k: v for k, v in os.environ.items() if k not in SETTINGS_ENV}
    base.update(COVE_SERVER=f"http://127.0.0.1:{coved.port}", COVE_API_KEY=coved.key,
                COVE_STATE_DIR=coved.state_dir,
                COVE_CONFIG_FILE=os.path.join(coved.state_dir, "no-such-config.ini"))
    for k, v in (env or {}).items():
        if v is None:
            base.pop(k, None)
        else:
            base[k] = v
    return base


def cli(coved, *args, check=True, env=None, input=None, text=True, timeout=120):
    """Runs cove against coved (the pattern of test_cli_lifecycle.py)."""
    r = subprocess.run([CLI, *args], capture_output=True, text=text, env=cli_env(coved, env),
                       input=input, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"cove {args} -> {r.returncode}: {r.stderr}")
    return r


def cli_json(coved, *args, **kw):
    return json.loads(cli(coved, *args, "-o", "json", **kw).stdout)


# Forks cove from a small process and reports its peak RSS (KiB): Linux carries the forking
# process's peak across exec, so forking from pytest itself would measure pytest.
PEAK_RSS_HELPER = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)
"""


def cli_peak_rss(coved, *args):
    """(exit status, peak RSS in bytes) of cove run with args."""
    r = subprocess.run([sys.executable, "-c", PEAK_RSS_HELPER, CLI, *args], capture_output=True,
                       text=True, env=cli_env(coved), timeout=300)
    status, kib = r.stdout.split()
    return int(status), int(kib) * 1024


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(MiB), b""):
            h.update(block)
    return h.hexdigest()


def random_file(path, size):
    with open(path, "wb") as f:
        for _ in range(size // MiB):
            f.write(os.urandom(MiB))
        f.write(os.urandom(size % MiB))


def info(coved, sid, path):
    """The FileInfo of path, from `cove files ls -o json` of its directory."""
    entries = cli_json(coved, "files", "ls", sid, os.path.dirname(path))
    found = [e for e in entries if e["path"] == path]
    assert len(found) == 1, (path, entries)
    return found[0]


def remote_sha256(coved, sid, path):
    return coved.sh(sid, f"sha256sum {path}").split()[0]


# ---- upload / download ------------------------------------------------------------------

def test_upload_download_round_trip_50mb_streamed(coved, sandbox, tmp_path):
    local = tmp_path / "big.bin"
    size = 50 * MiB
    random_file(local, size)
    os.chmod(local, 0o640)
    digest = sha256_file(local)

    # streamed both ways: cove's memory stays far below the file's size
    status, peak = cli_peak_rss(coved, "upload", sandbox, str(local), "/tmp/big.bin")
    assert status == 0
    assert peak < 40 * MiB, f"cove upload peaked at {peak / MiB:.1f} MiB for a 50 MiB file"
    assert remote_sha256(coved, sandbox, "/tmp/big.bin") == digest
    remote = info(coved, sandbox, "/tmp/big.bin")
    assert remote["size"] == size and remote["mode"] == 640  # the local mode went along

    back = tmp_path / "back.bin"
    status, peak = cli_peak_rss(coved, "download", sandbox, "/tmp/big.bin", str(back))
    assert status == 0
    assert peak < 40 * MiB, f"cove download peaked at {peak / MiB:.1f} MiB for a 50 MiB file"
    assert sha256_file(back) == digest
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no temporary left

    # to stdout with '-'
    r = cli(coved, "download", sandbox, "/tmp/big.bin", "-", text=False)
    assert hashlib.sha256(r.stdout).hexdigest() == digest and r.stderr == b""


def test_upload_and_download_print_nothing_unless_verbose(coved, sandbox, tmp_path):
    local = tmp_path / "small.txt"
    local.write_bytes(b"hello\n")
    r = cli(coved, "upload", sandbox, str(local), "/tmp/small.txt")
    assert r.stdout == "" and r.stderr == ""
    r = cli(coved, "upload", "-v", sandbox, str(local), "/tmp/small.txt")
    assert r.stdout == "" and len(r.stderr.splitlines()) == 1
    assert "6 bytes" in r.stderr and "/tmp/small.txt" in r.stderr

    r = cli(coved, "download", sandbox, "/tmp/small.txt", str(tmp_path / "d.txt"))
    assert r.stdout == "" and r.stderr == ""
    r = cli(coved, "download", "--verbose", sandbox, "/tmp/small.txt", str(tmp_path / "d.txt"))
    assert r.stdout == "" and len(r.stderr.splitlines()) == 1 and "6 bytes" in r.stderr
    assert (tmp_path / "d.txt").read_bytes() == b"hello\n"


def test_upload_modes_targets_and_stdin(coved, sandbox, tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\necho ran\n")
    os.chmod(script, 0o750)
    cli(coved, "upload", sandbox, str(script), "/tmp/up/deep/")  # '/': keeps its name, dirs made
    assert info(coved, sandbox, "/tmp/up/deep/run.sh")["mode"] == 750
    assert coved.sh(sandbox, "/tmp/up/deep/run.sh") == "ran\n"

    cli(coved, "upload", "--mode", "0600", sandbox, str(script), "/tmp/up/private.sh")
    assert info(coved, sandbox, "/tmp/up/private.sh")["mode"] == 600
    cli(coved, "upload", "--owner", "user", sandbox, str(script), "/tmp/up/owned.sh")
    owned = info(coved, sandbox, "/tmp/up/owned.sh")
    assert owned["owner"] == "user" and owned["group"] == "user"

    # standard input, of unknown length (sent chunked)
    cli(coved, "upload", sandbox, "-", "/tmp/up/from-stdin", input="piped\n" * 1000)
    assert cli(coved, "files", "cat", sandbox, "/tmp/up/from-stdin").stdout == "piped\n" * 1000

    # a replaced file is replaced whole
    (tmp_path / "short").write_text("x")
    cli(coved, "upload", sandbox, str(tmp_path / "short"), "/tmp/up/from-stdin")
    assert cli(coved, "files", "cat", sandbox, "/tmp/up/from-stdin").stdout == "x"


def test_upload_errors(coved, sandbox, tmp_path):
    r = cli(coved, "upload", sandbox, str(tmp_path / "missing"), "/tmp/x", check=False)
    assert r.returncode == 1 and "missing" in r.stderr
    r = cli(coved, "upload", sandbox, str(tmp_path), "/tmp/x", check=False)  # a directory
    assert r.returncode == 1
    (tmp_path / "f").write_text("f")
    r = cli(coved, "upload", sandbox, str(tmp_path / "f"), "/tmp", check=False)  # onto a dir
    assert r.returncode == 1 and "cove: " in r.stderr
    r = cli(coved, "upload", "no-such-sandbox", str(tmp_path / "f"), "/tmp/f", check=False)
    assert r.returncode == 1 and "NOT_FOUND" in r.stderr


def test_download_targets_and_failures(coved, sandbox, tmp_path):
    coved.sh(sandbox, "printf 'new content' > /tmp/dl.txt")
    target = tmp_path / "dir"
    target.mkdir()
    cli(coved, "download", sandbox, "/tmp/dl.txt", str(target))  # into a directory, by name
    assert (target / "dl.txt").read_text() == "new content"

    existing = tmp_path / "existing.txt"
    existing.write_text("old")
    os.chmod(existing, 0o600)
    cli(coved, "download", sandbox, "/tmp/dl.txt", str(existing))
    assert existing.read_text() == "new content"
    assert stat.S_IMODE(os.stat(existing).st_mode) == 0o600  # a replaced file keeps its mode

    # nothing there: exit 1, and the local file is left as it was, no temporary beside it
    before = sorted(os.listdir(tmp_path))
    r = cli(coved, "download", sandbox, "/tmp/no-such-file", str(existing), check=False)
    assert r.returncode == 1 and "FILE_NOT_FOUND" in r.stderr
    assert existing.read_text() == "new content" and sorted(os.listdir(tmp_path)) == before
    r = cli(coved, "download", sandbox, "/tmp", str(tmp_path / "d"), check=False)  # a directory
    assert r.returncode == 1 and not (tmp_path / "d").exists()
    # a device is written to, not replaced
    cli(coved, "download", sandbox, "/tmp/dl.txt", "/dev/null")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


# ---- files ------------------------------------------------------------------------------

@pytest.fixture
def tree(coved, sandbox):
    """/tmp/t with a.txt (hello), sub/b.log, sub/deeper/c.txt and a symlink."""
    coved.sh(sandbox, "mkdir -p /tmp/t/sub/deeper && printf hello > /tmp/t/a.txt && "
                      "printf 12345 > /tmp/t/sub/b.log && printf c > /tmp/t/sub/deeper/c.txt && "
                      "chmod 640 /tmp/t/a.txt && ln -s a.txt /tmp/t/link")
    return sandbox


def table(stdout):
    """A table's rows as lists of cells (the header first)."""
    return [line.split() for line in stdout.splitlines()]


def test_files_ls(coved, tree):
    rows = table(cli(coved, "files", "ls", tree, "/tmp/t").stdout)
    assert rows[0] == ["NAME", "TYPE", "SIZE", "MODE", "MODIFIED"]
    by_name = {row[0]: row for row in rows[1:]}
    assert list(by_name) == ["a.txt", "link", "sub"]  # name order, one level
    assert by_name["a.txt"][1:4] == ["file", "5", "640"]
    assert by_name["link"][1] == "symlink" and by_name["sub"][1] == "directory"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", by_name["a.txt"][4])

    names = [row[0] for row in table(cli(coved, "files", "ls", "-R", tree, "/tmp/t").stdout)[1:]]
    assert names == ["a.txt", "link", "sub", "sub/b.log", "sub/deeper", "sub/deeper/c.txt"]
    names = [row[0] for row in
             table(cli(coved, "files", "ls", "--depth", "2", tree, "/tmp/t/").stdout)[1:]]
    assert names == ["a.txt", "link", "sub", "sub/b.log", "sub/deeper"]

    entries = cli_json(coved, "files", "ls", tree, "/tmp/t")
    assert [e["path"] for e in entries] == ["/tmp/t/a.txt", "/tmp/t/link", "/tmp/t/sub"]
    assert entries[0]["size"] == 5 and entries[0]["mode"] == 640

    # a file, or a symlink (not followed), is listed as itself
    rows = table(cli(coved, "files", "ls", tree, "/tmp/t/link").stdout)
    assert rows[0][0] == "PATH" and rows[1][:2] == ["/tmp/t/link", "symlink"]

    r = cli(coved, "files", "ls", tree, "/tmp/t/nothing", check=False)
    assert r.returncode == 1 and "FILE_NOT_FOUND" in r.stderr and r.stdout == ""


def test_files_cat(coved, tree):
    assert cli(coved, "files", "cat", tree, "/tmp/t/a.txt").stdout == "hello"
    assert cli(coved, "files", "cat", tree, "/tmp/t/a.txt", "/tmp/t/sub/b.log",
               "/tmp/t/link").stdout == "hello12345hello"
    coved.sh(tree, "head -c 3000000 /dev/urandom > /tmp/t/bin")
    r = cli(coved, "files", "cat", tree, "/tmp/t/bin", text=False)
    assert hashlib.sha256(r.stdout).hexdigest() == remote_sha256(coved, tree, "/tmp/t/bin")
    r = cli(coved, "files", "cat", tree, "/tmp/t/nothing", check=False)
    assert r.returncode == 1 and "FILE_NOT_FOUND" in r.stderr
    r = cli(coved, "files", "cat", tree, "/tmp/t/sub", check=False)
    assert r.returncode == 1


def test_files_rm(coved, tree):
    cli(coved, "files", "rm", tree, "/tmp/t/a.txt", "/tmp/t/link")
    assert coved.sh(tree, "ls /tmp/t").split() == ["sub"]

    # a directory needs -r; nothing is removed when one path cannot be
    coved.sh(tree, "touch /tmp/t/keep")
    r = cli(coved, "files", "rm", tree, "/tmp/t/keep", "/tmp/t/sub", check=False)
    assert r.returncode == 1 and "-r" in r.stderr
    r = cli(coved, "files", "rm", tree, "/tmp/t/keep", "/tmp/t/missing", check=False)
    assert r.returncode == 1 and "FILE_NOT_FOUND" in r.stderr
    assert coved.sh(tree, "ls /tmp/t").split() == ["keep", "sub"]

    cli(coved, "files", "rm", "-f", tree, "/tmp/t/keep", "/tmp/t/missing")
    cli(coved, "files", "rm", "-r", tree, "/tmp/t/sub")
    assert coved.sh(tree, "ls -A /tmp/t") == ""
    cli(coved, "files", "rm", "-rf", tree, "/tmp/t/missing")


def test_files_mkdir(coved, sandbox):
    cli(coved, "files", "mkdir", sandbox, "/tmp/m/a/b", "/tmp/m/c")  # parents made
    cli(coved, "files", "mkdir", "-p", sandbox, "/tmp/m/a/b")  # already there: fine
    cli(coved, "files", "mkdir", "--mode", "700", sandbox, "/tmp/m/private")
    assert info(coved, sandbox, "/tmp/m/a/b")["type"] == "directory"
    assert info(coved, sandbox, "/tmp/m/a/b")["mode"] == 755
    assert info(coved, sandbox, "/tmp/m/private")["mode"] == 700
    cli(coved, "files", "mkdir", "--owner", "user", sandbox, "/tmp/m/users")
    assert info(coved, sandbox, "/tmp/m/users")["owner"] == "user"
    r = cli(coved, "files", "mkdir", "--mode", "9", sandbox, "/tmp/m/x", check=False)
    assert r.returncode == 2


def test_files_mv(coved, tree):
    cli(coved, "files", "mv", tree, "/tmp/t/a.txt", "/tmp/t/renamed.txt")
    assert cli(coved, "files", "cat", tree, "/tmp/t/renamed.txt").stdout == "hello"
    cli(coved, "files", "mv", tree, "/tmp/t/renamed.txt", "/tmp/t/sub")  # into a directory
    assert cli(coved, "files", "cat", tree, "/tmp/t/sub/renamed.txt").stdout == "hello"
    cli(coved, "files", "mv", tree, "/tmp/t/sub/deeper", "/tmp/t/new/place/")  # dirs made
    assert cli(coved, "files", "cat", tree, "/tmp/t/new/place/deeper/c.txt").stdout == "c"
    # what exists is not replaced
    r = cli(coved, "files", "mv", tree, "/tmp/t/sub/b.log", "/tmp/t/sub/renamed.txt",
            check=False)
    assert r.returncode == 1 and "exists" in r.stderr
    r = cli(coved, "files", "mv", tree, "/tmp/t/missing", "/tmp/t/x", check=False)
    assert r.returncode == 1 and "FILE_NOT_FOUND" in r.stderr


def test_files_search(coved, tree):
    rows = table(cli(coved, "files", "search", tree, "/tmp/t", "*.txt").stdout)
    assert rows[0] == ["PATH", "TYPE", "SIZE", "MODE", "MODIFIED"]
    assert [row[0] for row in rows[1:]] == ["/tmp/t/a.txt", "/tmp/t/sub/deeper/c.txt"]
    found = cli_json(coved, "files", "search", tree, "/tmp/t", "{b,c}.*")
    assert [e["path"] for e in found] == ["/tmp/t/sub/b.log", "/tmp/t/sub/deeper/c.txt"]
    assert cli_json(coved, "files", "search", tree, "/tmp/t", "*.none") == []
    r = cli(coved, "files", "search", tree, "/tmp/t", "[", check=False)
    assert r.returncode == 1


def test_files_chmod(coved, tree):
    cli(coved, "files", "chmod", tree, "600", "/tmp/t/a.txt", "/tmp/t/sub/b.log")
    assert info(coved, tree, "/tmp/t/a.txt")["mode"] == 600
    assert info(coved, tree, "/tmp/t/sub/b.log")["mode"] == 600
    cli(coved, "files", "chmod", tree, "0755", "/tmp/t/sub", "--owner", "nobody",
        "--group", "nogroup")
    sub = info(coved, tree, "/tmp/t/sub")
    assert (sub["mode"], sub["owner"], sub["group"]) == (755, "nobody", "nogroup")
    r = cli(coved, "files", "chmod", tree, "644", "/tmp/t/a.txt", "--owner", "nosuchuser",
            check=False)
    assert r.returncode == 1 and "nosuchuser" in r.stderr
    r = cli(coved, "files", "chmod", tree, "644", "/tmp/t/missing", check=False)
    assert r.returncode == 1


# ---- exec -d and logs -------------------------------------------------------------------

def test_exec_detach_prints_the_id_and_logs_follow(coved, sandbox, tmp_path):
    script = ("for i in 1 2 3 4; do echo out-$i; echo err-$i >&2; sleep 0.4; done; exit 7")
    r = cli(coved, "exec", "-d", sandbox, "--", "sh", "-c", script)
    command_id = r.stdout.strip()
    assert r.stdout == command_id + "\n" and re.fullmatch(r"[0-9a-zA-Z_-]+", command_id)

    # -f streams: the first line arrives while the command still runs
    with open(tmp_path / "stderr", "w+") as stderr_file:
        follow = subprocess.Popen([CLI, "logs", "-f", sandbox, command_id],
                                  stdout=subprocess.PIPE, stderr=stderr_file, text=True,
                                  env=cli_env(coved))
        try:
            first = follow.stdout.readline()
            assert first == "out-1\n"
            assert follow.poll() is None
            rest = follow.stdout.read()
            follow.wait(timeout=60)
        finally:
            if follow.poll() is None:
                follow.kill()
            follow.stdout.close()
        stderr = (tmp_path / "stderr").read_text()
    lines = (first + rest).splitlines()
    assert [l for l in lines if l.startswith("out-")] == [f"out-{i}" for i in range(1, 5)]
    assert [l for l in lines if l.startswith("err-")] == [f"err-{i}" for i in range(1, 5)]
    assert follow.returncode == 7 and stderr == ""  # the command's own status

    # without -f: what there is, once; exit 0
    r = cli(coved, "logs", sandbox, command_id)
    assert r.stdout.splitlines() == lines
    r = cli(coved, "logs", "--follow", sandbox, command_id, check=False)
    assert r.returncode == 7 and r.stdout.splitlines() == lines


def test_logs_follow_of_quick_and_killed_commands(coved, sandbox):
    command_id = cli(coved, "exec", "-d", sandbox, "--", "echo", "quick").stdout.strip()
    r = cli(coved, "logs", "-f", sandbox, command_id)
    assert r.stdout == "quick\n" and r.returncode == 0

    command_id = cli(coved, "exec", "-d", "--timeout", "1", sandbox, "--", "sleep",
                     "30").stdout.strip()
    started = time.monotonic()
    r = cli(coved, "logs", "-f", sandbox, command_id, check=False)
    assert r.returncode == 1 and "cove: " in r.stderr and time.monotonic() - started < 20

    r = cli(coved, "logs", sandbox, "no-such-command", check=False)
    assert r.returncode == 1 and "COMMAND_NOT_FOUND" in r.stderr


# ---- shell ------------------------------------------------------------------------------

class Terminal:
    """A program run on a real pseudo-terminal of our own, as a person would run it."""

    def __init__(self, argv, env, cols=100, rows=30):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            try:
                os.execve(argv[0], argv, env)
            finally:
                os._exit(127)
        self.resize(cols, rows)
        self.output = b""

    def resize(self, cols, rows):
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def type(self, text):
        os.write(self.fd, text.encode())

    def read_until(self, pattern, timeout=20):
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.output):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{pattern!r} did not come; got {self.output[-500:]!r}")
            if select.select([self.fd], [], [], left)[0]:
                try:
                    data = os.read(self.fd, 65536)
                except OSError:  # EIO: the other side is closed
                    data = b""
                if not data:
                    raise AssertionError(f"{pattern!r} did not come before the end; "
                                         f"got {self.output[-500:]!r}")
                self.output += data

    def wait(self, timeout=20):
        """The exit status, reading (and keeping) the output meanwhile."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.drain()
                return os.waitstatus_to_exitcode(status)
            self.drain(0.1)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        raise AssertionError(f"still running; output {self.output[-500:]!r}")

    def drain(self, timeout=0):
        while select.select([self.fd], [], [], timeout)[0]:
            try:
                data = os.read(self.fd, 65536)
            except OSError:
                return
            if not data:
                return
            self.output += data
            timeout = 0

    def close(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(self.fd)


@pytest.mark.not_under("gvisor", reason="runsc's terminal does not turn ^C into SIGINT for the foreground job")
def test_shell_through_a_pseudo_terminal(coved, sandbox, tmp_path):
    # sh runs cove on the terminal, then records the terminal's settings: restored by cove
    script = (f'stty -g > {tmp_path}/before; "$CLI" shell "$SID"; echo "cove-exit=$?"; '
              f'stty -g > {tmp_path}/after')
    env = cli_env(coved, {"CLI": CLI, "SID": sandbox})
    term = Terminal(["/bin/sh", "-c", script], env, cols=100, rows=30)
    try:
        term.read_until(rb"[#$] $")  # the remote shell's prompt: cove is connected, raw
        term.type("stty size\r")
        term.read_until(rb"[\r\n]30 100\r\n")  # the window size went along
        term.resize(120, 40)  # SIGWINCH: sent as a resize
        time.sleep(0.3)
        term.type("stty size\r")
        term.read_until(rb"[\r\n]40 120\r\n")
        term.type("sleep 100\r")
        term.read_until(rb"sleep 100\r\n.*\r")  # bash took the line (and ends paste mode)
        time.sleep(0.5)
        term.type("\x03")  # raw mode: ^C goes to the sandbox, cove stays
        term.type("echo after-$((40+2))\r")
        term.read_until(rb"[\r\n]after-42\r\n")

        term.type("echo hi-from-pty; exit 3\r")
        term.read_until(rb"[\r\n]hi-from-pty\r\n")
        term.read_until(rb"cove-exit=3")  # the shell's exit code
        assert term.wait() == 0
    finally:
        term.close()
    assert (tmp_path / "before").read_text() == (tmp_path / "after").read_text()


def test_shell_with_piped_input_and_a_command(coved, sandbox):
    r = cli(coved, "shell", sandbox, input=b"echo piped-$((2+2))\nexit 4\n", timeout=60,
            check=False, text=False)
    assert r.returncode == 4 and re.search(rb"[\r\n]piped-4\r\n", r.stdout), r
    r = cli(coved, "shell", "--cwd", "/tmp", sandbox, "--", "sh", "-c", "pwd; exit 5",
            input=b"", timeout=60, check=False, text=False)
    assert r.returncode == 5 and r.stdout == b"/tmp\r\n", r


def test_shell_refusals(coved, sandbox):
    r = cli(coved, "shell", "no-such-sandbox", input="", check=False)
    assert r.returncode == 1 and "NOT_FOUND" in r.stderr
    r = cli(coved, "shell", sandbox, input="", check=False, env={"COVE_SERVER": UNREACHABLE})
    assert r.returncode == 3
    # the WebSocket is spoken over plain HTTP only: said before anything is made
    r = cli(coved, "shell", sandbox, input="", check=False,
            env={"COVE_SERVER": "https://127.0.0.1:1"})
    assert r.returncode == 2 and "http://" in r.stderr
    assert "http://" in cli(coved, "shell", "--help").stdout


class FakeAgent:
    """Just enough of coved's gateway and the agent's PTY API for `cove shell`, on a socket of
    our own: POST /pty, DELETE /pty/{id}, and a WebSocket whose answer (101, then `frames`)
    goes out in one write, after which the server stays silent."""

    def __init__(self, frames):
        self.frames = frames
        self.requests = []
        self.from_client = b""  # what the client sent on the WebSocket
        self.client_gone = threading.Event()
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(8)
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        self.server.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.server.accept()
            except socket.timeout:
                continue
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

    def handle(self, conn):
        buffered = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buffered:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buffered += data
                head, buffered = buffered.split(b"\r\n\r\n", 1)
                lines = head.decode().split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {k.lower(): v.strip() for k, v in
                           (line.split(":", 1) for line in lines[1:])}
                length = int(headers.get("content-length", 0))
                while len(buffered) < length:
                    buffered += conn.recv(65536)
                buffered = buffered[length:]
                self.requests.append((method, target))
                if headers.get("upgrade", "").lower() == "websocket":
                    accept = base64.b64encode(hashlib.sha1(
                        (headers["sec-websocket-key"] +
                         "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
                    conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                                 b"Connection: Upgrade\r\nSec-WebSocket-Accept: " +
                                 accept.encode() + b"\r\n\r\n" + b"".join(self.frames))
                    while True:  # silent until the client goes
                        data = conn.recv(65536)
                        if not data:
                            break
                        self.from_client += data
                    self.client_gone.set()
                    return
                body = b'{"session_id":"s1"}' if method == "POST" else b""
                conn.sendall(b"HTTP/1.1 %d OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n" % (201 if body else 200, len(body))
                             + body)

    def close(self):
        self.stop.set()
        self.thread.join()
        self.server.close()


def ws_frame(opcode, payload, fin=True, mask=None):
    assert len(payload) < 126
    if mask is not None:
        return (bytes([0x80 * fin | opcode, 0x80 | len(payload)]) + mask
                + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))
    return bytes([0x80 * fin | opcode, len(payload)]) + payload


def client_frames(data):
    """The client's frames as (first byte, unmasked payload); each must be masked."""
    frames = []
    while data:
        b0, b1 = data[0], data[1]
        assert b1 & 0x80, "a client's frames are masked"
        n, at = b1 & 0x7F, 2
        if n == 126:
            n, at = struct.unpack(">H", data[2:4])[0], 4
        elif n == 127:
            n, at = struct.unpack(">Q", data[2:10])[0], 10
        mask, payload = data[at:at + 4], data[at + 4:at + 4 + n]
        frames.append((b0, bytes(b ^ mask[i % 4] for i, b in enumerate(payload))))
        data = data[at + 4 + n:]
    return frames


def shell_against(coved, frames):
    """`cove shell sbx` against a FakeAgent whose WebSocket sends frames, to its end: the
    result, and the agent (what it was asked, what the client sent it)."""
    agent = FakeAgent(frames)
    try:
        r = cli(coved, "shell", "sbx", input=b"", text=False, timeout=20, check=False,
                env={"COVE_SERVER": agent.url})
        assert agent.client_gone.wait(10)
    finally:
        agent.close()
    return r, agent


def test_shell_handles_frames_that_come_with_the_handshake(coved):
    r, agent = shell_against(coved, [
        ws_frame(1, b'{"type":"connected","session_id":"s1","mode":"pty"}'),
        ws_frame(2, b"\x01coalesced-output\r\n"),
        ws_frame(2, b"\x03" + bytes(8) + b"replayed\r\n"),
        ws_frame(1, b'{"type":"exit","exit_code":5}')])
    assert r.returncode == 5, r
    assert r.stdout == b"coalesced-output\r\nreplayed\r\n"
    paths = [(m, t.split("/proxy/44772", 1)[1]) for m, t in agent.requests]
    assert paths == [("POST", "/pty"), ("GET", "/pty/s1/ws"), ("DELETE", "/pty/s1")]


def test_shell_answers_pings_joins_fragments_and_echoes_the_close(coved):
    """`cove shell` keeps RFC 6455 with the server: a ping (even between the fragments of a
    message) gets its pong, fragments make one message, and a close is answered with its code
    and reported; everything it sends is masked."""
    r, agent = shell_against(coved, [
        ws_frame(9, b"hb-1"),
        ws_frame(1, b'{"type":"connected","session_id":"s1","mode":"pty"}'),
        ws_frame(2, b"\x01frag", fin=False), ws_frame(9, b"hb-2"),
        ws_frame(0, b"ment", fin=False), ws_frame(0, b"ed\r\n"),
        ws_frame(8, struct.pack(">H", 1011) + b"agent trouble")])
    assert r.returncode == 1, r
    assert r.stdout == b"fragmented\r\n"
    assert b"(1011: agent trouble)" in r.stderr, r.stderr
    sent = client_frames(agent.from_client)
    assert (0x8A, b"hb-1") in sent and (0x8A, b"hb-2") in sent
    assert sent[-1] == (0x88, struct.pack(">H", 1011))


def test_shell_refuses_a_masked_server_frame(coved):
    """A server never masks (RFC 6455 5.1): `cove shell` closes with 1002 and says why."""
    r, agent = shell_against(coved, [
        ws_frame(1, b'{"type":"connected","session_id":"s1","mode":"pty"}',
                 mask=b"\x01\x02\x03\x04")])
    assert r.returncode != 0, r
    assert b"invalid frame" in r.stderr, r.stderr
    closes = [payload for b0, payload in client_frames(agent.from_client) if b0 == 0x88]
    assert closes and closes[0][:2] == struct.pack(">H", 1002)


# ---- usage and reachability -------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ["upload", "id", "local"], ["upload", "id", "a", "b", "c"], ["upload", "--mode", "8", "i", "a", "b"],
    ["download", "id", "remote"], ["download", "--bogus", "id", "a", "b"],
    ["files", "ls"], ["files", "ls", "id", "a", "b"], ["files", "ls", "--depth", "0", "id"],
    ["files", "cat", "id"], ["files", "rm", "id"], ["files", "mkdir", "id"],
    ["files", "mv", "id", "a"], ["files", "search", "id", "dir"], ["files", "chmod", "id", "644"],
    ["files", "chmod", "id", "u+x", "/a"], ["files", "nope", "id"], ["files"],
    ["logs", "id"], ["logs", "id", "cmd", "extra"], ["shell"],
])
def test_usage_errors_are_exit_2_before_any_request(coved, args):
    r = cli(coved, *args, check=False, env={"COVE_SERVER": UNREACHABLE})
    assert r.returncode == 2, (args, r.stderr)


@pytest.mark.parametrize("args", [
    ["upload", "id", "/etc/passwd", "/tmp/x"], ["download", "id", "/x", "-"],
    ["files", "ls", "id", "/"], ["files", "cat", "id", "/x"], ["files", "rm", "-rf", "id", "/x"],
    ["files", "mkdir", "id", "/x"], ["files", "mv", "id", "/a", "/b"],
    ["files", "search", "id", "/", "*"], ["files", "chmod", "id", "644", "/x"],
    ["logs", "-f", "id", "cmd"],
])
def test_exit_3_when_unreachable(coved, args):
    r = cli(coved, *args, check=False, env={"COVE_SERVER": UNREACHABLE})
    assert r.returncode == 3, (args, r.stderr)


def test_help_of_the_new_commands(coved):
    out = cli(coved, "--help").stdout
    for command in ("upload", "download", "files", "logs", "shell"):
        assert re.search(rf"^  {command} ", out, re.M), command
        assert cli(coved, command, "--help").stdout.startswith(f"Usage: cove {command}")
    for sub in ("ls", "cat", "rm", "mkdir", "mv", "search", "chmod"):
        r = cli(coved, "files", sub, "--help")
        assert r.stdout.startswith(f"Usage: cove files {sub}"), (sub, r.stdout)
