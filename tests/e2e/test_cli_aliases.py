"""The `cove` CLI as OpenSandbox's `osb` (and `abx`-style top-level verbs) spell it, against a
real coved: every alias must do the operation, checked by its effect (the sandbox gone, the
mode changed, the command stopped), not by its exit status alone. Also: the default TTL of
`cove create`, progress bars on a pseudo-terminal (and silence when piped), -o yaml read back
by a YAML parser, completion scripts, the man page and the error hints."""

import json
import os
import pty
import re
import select
import shutil
import stat
import subprocess
import time

import pytest
import yaml

from covetest import BUILD, CLI, ApiError

SETTINGS_ENV = ("COVE_SERVER", "OPEN_SANDBOX_DOMAIN", "COVE_API_KEY", "OPEN_SANDBOX_API_KEY",
                "COVE_STATE_DIR", "COVE_CONFIG_FILE", "XDG_CONFIG_HOME")
MiB = 1024 * 1024


def cli_env(coved, env=None):
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


def cli(coved, *args, check=True, env=None, input=None, timeout=120):
    r = subprocess.run([CLI, *args], capture_output=True, text=True, env=cli_env(coved, env),
                       input=input, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"cove {args} -> {r.returncode}: {r.stderr}")
    return r


def cli_json(coved, *args, **kw):
    return json.loads(cli(coved, *args, "-o", "json", **kw).stdout)


def parse_time(text):
    from datetime import datetime
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def gone(coved, sid):
    try:
        coved.get(sid)
    except ApiError as e:
        return e.status == 404
    return False


@pytest.fixture
def sid(coved):
    sandbox_id = cli(coved, "sandbox", "create").stdout.strip()
    yield sandbox_id
    try:
        coved.delete(sandbox_id)
    except Exception:
        pass


# ---- sandbox VERB ----------------------------------------------------------------------

def test_sandbox_create_list_get_kill(coved):
    created = cli_json(coved, "sandbox", "create", "--image", "base", "-m", "suite=aliases")
    sandbox_id = created["id"]
    try:
        assert coved.get(sandbox_id)["image"]["uri"] == "base"
        listed = cli_json(coved, "sandbox", "list", "-m", "suite=aliases")
        assert [s["id"] for s in listed["items"]] == [sandbox_id]
        assert sandbox_id in cli(coved, "sandbox", "list").stdout
        assert cli_json(coved, "sandbox", "get", sandbox_id)["id"] == sandbox_id
    finally:
        r = cli(coved, "sandbox", "kill", sandbox_id, "--yes")
    assert r.stdout == "" and gone(coved, sandbox_id)


def test_sandbox_pause_resume_renew_endpoint(coved, sid):
    cli(coved, "sandbox", "pause", sid)
    assert coved.get(sid)["status"]["state"] == "Paused"
    cli(coved, "sandbox", "resume", sid)
    assert coved.get(sid)["status"]["state"] == "Running"

    before = time.time()
    renewed = cli_json(coved, "sandbox", "renew", sid, "--timeout", "30m")
    assert before + 1800 - 2 <= parse_time(renewed["expiresAt"]) <= time.time() + 1800 + 2
    assert abs(parse_time(coved.get(sid)["expiresAt"]) - parse_time(renewed["expiresAt"])) < 0.01

    by_flag = cli(coved, "sandbox", "endpoint", sid, "--port", "8000").stdout
    by_operand = cli(coved, "endpoint", sid, "8000").stdout
    assert by_flag == by_operand and by_flag.startswith("http")
    assert cli(coved, "sandbox", "endpoint", sid, "--port", "0", check=False).returncode == 2


def test_sandbox_health_and_metrics(coved, sid):
    r = cli(coved, "sandbox", "health", sid)
    assert r.stdout.startswith("healthy") and "Running" in r.stdout
    report = cli_json(coved, "sandbox", "health", sid)
    assert report["healthy"] is True and report["state"] == "Running"

    metrics = cli_json(coved, "sandbox", "metrics", sid)
    assert metrics["cpu_count"] > 0 and metrics["mem_total_mib"] > 0
    table = cli(coved, "sandbox", "metrics", sid).stdout
    assert re.search(r"^mem_total_mib\s+\d", table, re.M)

    # a paused sandbox's agent cannot answer: unhealthy, exit 1
    coved.pause(sid)
    try:
        r = cli(coved, "sandbox", "health", sid, "-o", "json", check=False)
        assert r.returncode == 1
        report = json.loads(r.stdout)
        assert report["healthy"] is False and report["state"] == "Paused" and report["error"]
    finally:
        coved.resume(sid)
    # a sandbox that does not exist is an error of its own
    r = cli(coved, "sandbox", "health", "no-such-sandbox", check=False)
    assert r.returncode == 1 and "NOT_FOUND" in r.stderr and r.stdout == ""


def kill_on_a_terminal(coved, sandbox_id, answer, *extra):
    """`cove kill ID` with stdin and stderr on a pseudo-terminal, answering its question."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([CLI, "kill", sandbox_id, *extra], stdin=slave, stderr=slave,
                            stdout=subprocess.PIPE, env=cli_env(coved))
    os.close(slave)
    seen = b""
    try:
        deadline = time.time() + 30
        while answer is not None and b"[y/N] " not in seen:
            assert time.time() < deadline, seen
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                seen += os.read(master, 4096)
        if answer is not None:
            os.write(master, answer.encode() + b"\n")
        proc.communicate(timeout=30)
    finally:
        os.close(master)
    return proc.returncode, seen.decode(errors="replace")


def test_kill_asks_on_a_terminal_unless_yes(coved, sid):
    status, seen = kill_on_a_terminal(coved, sid, "n")
    assert status == 1 and f"Delete sandbox(es) {sid}? [y/N] " in seen
    assert not gone(coved, sid)
    status, _ = kill_on_a_terminal(coved, sid, "y")
    assert status == 0 and gone(coved, sid)
    other = cli(coved, "create").stdout.strip()
    status, seen = kill_on_a_terminal(coved, other, None, "--yes")
    assert status == 0 and gone(coved, other) and "[y/N]" not in seen


def test_top_level_abx_verbs(coved, tmp_path):
    """create --template, upload ID SRC DST, exec ID -- CMD, download, list, kill ID --yes."""
    sandbox_id = cli(coved, "create", "--template", "base").stdout.strip()
    try:
        src = tmp_path / "in.txt"
        src.write_text("abx payload\n")
        cli(coved, "upload", sandbox_id, str(src), "/tmp/in.txt")
        assert cli(coved, "exec", sandbox_id, "--", "cat", "/tmp/in.txt").stdout == "abx payload\n"
        cli(coved, "download", sandbox_id, "/tmp/in.txt", str(tmp_path / "out.txt"))
        assert (tmp_path / "out.txt").read_text() == "abx payload\n"
        assert sandbox_id in cli(coved, "list").stdout
    finally:
        cli(coved, "kill", sandbox_id, "--yes")
    assert gone(coved, sandbox_id)


# ---- command VERB ----------------------------------------------------------------------

def test_command_run_status_logs_interrupt(coved, sid):
    r = cli(coved, "command", "run", sid, "--", "sh", "-c", "echo hi; exit 3", check=False)
    assert r.returncode == 3 and r.stdout == "hi\n"
    r = cli(coved, "command", "run", sid, "-o", "raw", "--", "python3", "-c", "print(1 + 1)")
    assert r.stdout == "2\n"  # osb's spelling of plain output

    command_id = cli(coved, "command", "run", sid, "--background", "--", "sh", "-c",
                     "echo started; sleep 300").stdout.strip()
    assert re.fullmatch(r"[0-9a-zA-Z_-]+", command_id)
    deadline = time.time() + 30
    while "started" not in cli(coved, "command", "logs", sid, command_id).stdout:
        assert time.time() < deadline
        time.sleep(0.2)
    status = cli_json(coved, "command", "status", sid, command_id)
    assert status["id"] == command_id and status["running"] is True
    assert re.search(r"^running\s+true$", cli(coved, "command", "status", sid, command_id).stdout,
                     re.M)
    logs = cli_json(coved, "command", "logs", sid, command_id)
    assert logs["output"] == "started\n" and logs["cursor"] == len("started\n")
    assert cli_json(coved, "command", "logs", sid, command_id, "--cursor", "4")["output"] == \
        "ted\n"

    cli(coved, "command", "interrupt", sid, command_id)
    deadline = time.time() + 30
    while cli_json(coved, "command", "status", sid, command_id)["running"]:
        assert time.time() < deadline, "the interrupted command still runs"
        time.sleep(0.2)
    assert "sleep 300" not in coved.sh(sid, "ps -eo args")
    r = cli(coved, "command", "interrupt", sid, "no-such-command", check=False)
    assert r.returncode == 1 and "COMMAND_NOT_FOUND" in r.stderr


def test_command_logs_json_while_a_character_is_cut(coved, sid):
    """-o json of logs that end inside a UTF-8 character: what is whole so far, and a cursor
    at the cut character, which the next call gives whole."""
    command_id = cli(coved, "command", "run", sid, "--background", "--", "sh", "-c",
                     "printf 'h\\303'; sleep 3; printf '\\251llo\\n'").stdout.strip()
    time.sleep(1)  # "h" and the character's first byte have come, not its second
    logs = cli_json(coved, "command", "logs", sid, command_id)
    assert (logs["output"], logs["cursor"]) == ("h", 1)
    deadline = time.time() + 30
    while cli_json(coved, "command", "status", sid, command_id)["running"]:
        assert time.time() < deadline
        time.sleep(0.2)
    logs = cli_json(coved, "command", "logs", sid, command_id, "--cursor", "1")
    assert (logs["output"], logs["cursor"]) == ("éllo\n", len("héllo\n".encode()))


def test_command_session_create_run_delete(coved, sid):
    session = cli(coved, "command", "session", "create", sid, "--workdir", "/tmp/sess").stdout
    session = session.strip()
    assert cli(coved, "command", "session", "run", sid, session, "--", "pwd").stdout == \
        "/tmp/sess\n"
    cli(coved, "command", "session", "run", sid, session, "--", "export", "FOO=bar")
    cli(coved, "command", "session", "run", sid, session, "--", "cd /")
    r = cli(coved, "command", "session", "run", sid, session, "--", 'echo "$FOO $PWD"')
    assert r.stdout == "bar /\n"
    r = cli(coved, "command", "session", "run", sid, session, "--", "exit 4", check=False)
    assert r.returncode == 4
    assert cli_json(coved, "command", "session", "create", sid)["session_id"]

    cli(coved, "command", "session", "delete", sid, session)
    r = cli(coved, "command", "session", "run", sid, session, "--", "pwd", check=False)
    assert r.returncode == 1 and "not found" in r.stderr


# ---- file VERB -------------------------------------------------------------------------

def content(coved, sid, path):
    """A file's bytes (as text) in the sandbox; exec's output lines end in a newline."""
    out = coved.sh(sid, f"cat {path}; echo '|'")
    assert out.endswith("|\n")
    return out[:-2]


def test_file_write_cat_info_chmod_replace(coved, sid):
    cli(coved, "file", "write", sid, "/tmp/f/hello.txt", "-c", "hello old world")
    assert content(coved, sid, "/tmp/f/hello.txt") == "hello old world"
    cli(coved, "file", "write", sid, "/tmp/f/piped", input="from stdin\n")
    assert content(coved, sid, "/tmp/f/piped") == "from stdin\n"
    assert cli(coved, "file", "cat", sid, "/tmp/f/hello.txt").stdout == "hello old world"

    info = cli_json(coved, "file", "info", sid, "/tmp/f/hello.txt")["/tmp/f/hello.txt"]
    assert info["type"] == "file" and info["size"] == len("hello old world")
    assert cli(coved, "file", "info", sid, "/tmp/f/nothing", check=False).returncode == 1

    cli(coved, "file", "chmod", sid, "/tmp/f/hello.txt", "--mode", "600")
    assert coved.sh(sid, "stat -c %a /tmp/f/hello.txt").strip() == "600"
    cli(coved, "files", "chmod", sid, "640", "/tmp/f/hello.txt")  # cove's own spelling
    assert coved.sh(sid, "stat -c %a /tmp/f/hello.txt").strip() == "640"

    r = cli(coved, "file", "replace", sid, "/tmp/f/hello.txt", "--old", "old", "--new", "new")
    assert r.stdout == "/tmp/f/hello.txt: 1 replaced\n"
    assert content(coved, sid, "/tmp/f/hello.txt") == "hello new world"
    counts = cli_json(coved, "file", "replace", sid, "/tmp/f/hello.txt", "--old", "l",
                      "--new", "L")
    assert counts == {"/tmp/f/hello.txt": {"replacedCount": 3}}
    assert cli(coved, "file", "replace", sid, "/tmp/f/hello.txt", "--new", "x",
               check=False).returncode == 2


def test_file_mkdir_mv_search_rm_rmdir(coved, sid):
    cli(coved, "file", "mkdir", sid, "/tmp/d/sub")
    assert coved.sh(sid, "test -d /tmp/d/sub && echo yes") == "yes\n"
    cli(coved, "file", "write", sid, "/tmp/d/a.py", "-c", "print(1)")
    cli(coved, "file", "write", sid, "/tmp/d/sub/b.py", "-c", "print(2)")
    cli(coved, "file", "write", sid, "/tmp/d/c.txt", "-c", "x")
    found = cli_json(coved, "file", "search", sid, "/tmp/d", "--pattern", "*.py")
    assert sorted(e["path"] for e in found) == ["/tmp/d/a.py", "/tmp/d/sub/b.py"]

    cli(coved, "file", "mv", sid, "/tmp/d/c.txt", "/tmp/d/moved.txt")
    assert coved.sh(sid, "ls /tmp/d").split() == ["a.py", "moved.txt", "sub"]
    cli(coved, "file", "rm", sid, "/tmp/d/moved.txt")
    assert coved.sh(sid, "ls /tmp/d").split() == ["a.py", "sub"]

    # rmdir: only directories, then with what is in them
    r = cli(coved, "file", "rmdir", sid, "/tmp/d/a.py", check=False)
    assert r.returncode == 1 and "not a directory" in r.stderr
    assert coved.sh(sid, "ls /tmp/d").split() == ["a.py", "sub"]
    cli(coved, "file", "rmdir", sid, "/tmp/d/sub")
    assert coved.sh(sid, "ls /tmp/d").split() == ["a.py"]


def test_file_upload_download(coved, sid, tmp_path):
    src = tmp_path / "up.bin"
    src.write_bytes(os.urandom(100_000))
    cli(coved, "file", "upload", sid, str(src), "/tmp/up.bin")
    cli(coved, "file", "download", sid, "/tmp/up.bin", str(tmp_path / "down.bin"))
    assert (tmp_path / "down.bin").read_bytes() == src.read_bytes()


# ---- egress and config -----------------------------------------------------------------

def test_egress_get_patch(coved, sid):
    before = cli_json(coved, "egress", "get", sid)
    assert "mode" in before
    after = cli_json(coved, "egress", "patch", sid, "--rule", "allow=pypi.org",
                     "--rule", "deny=internal.example.com")
    rules = {(r["action"], r["target"]) for r in after["policy"]["egress"]}
    assert {("allow", "pypi.org"), ("deny", "internal.example.com")} <= rules
    got = cli_json(coved, "egress", "get", sid)
    assert {(r["action"], r["target"]) for r in got["policy"]["egress"]} == rules
    assert cli(coved, "egress", "patch", sid, "--rule", "maybe=x", check=False).returncode == 2
    assert cli(coved, "egress", "patch", sid, check=False).returncode == 2


def test_config_init_set_show(coved, tmp_path):
    path = tmp_path / "cfg" / "config.ini"
    env = {"COVE_CONFIG_FILE": str(path), "COVE_SERVER": None, "COVE_API_KEY": None,
           "COVE_STATE_DIR": str(tmp_path)}
    # no terminal: no questions, the values given
    r = cli(coved, "config", "init", "--server", f"http://127.0.0.1:{coved.port}",
            "--api-key", coved.key, env=env)
    assert r.stdout == f"{path}\n"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    text = path.read_text()
    assert f"server = http://127.0.0.1:{coved.port}" in text and f"api-key = {coved.key}" in text
    # the file is what the next commands use
    assert isinstance(cli_json(coved, "list", env=env)["items"], list)
    # init again: refused unless --force
    r = cli(coved, "config", "init", env=env, check=False)
    assert r.returncode == 2 and "--force" in r.stderr and path.read_text() == text
    cli(coved, "config", "init", "--force", "--server", "http://127.0.0.1:1", env=env)
    assert "server = http://127.0.0.1:1" in path.read_text()
    assert f"api-key = {coved.key}" in path.read_text()  # kept

    cli(coved, "config", "set", "server", f"http://127.0.0.1:{coved.port}", env=env)
    shown = cli_json(coved, "config", "show", env=env)
    assert shown["server"] == f"http://127.0.0.1:{coved.port}"
    assert shown["serverSource"] == "config file" and shown["apiKeySource"] == "config file"
    assert coved.key not in json.dumps(shown) and shown["configFile"] == str(path)
    shown = cli_json(coved, "config", "show", "--server", "http://other:1", env=env)
    assert shown["server"] == "http://other:1" and shown["serverSource"] == "--server"
    shown = cli_json(coved, "config", "show", env={**env, "OPEN_SANDBOX_API_KEY": "k" * 20})
    assert shown["apiKeySource"] == "OPEN_SANDBOX_API_KEY" and shown["apiKey"] == "kkkk****"
    assert "serverSource" in cli(coved, "config", "show", env=env).stdout


def test_config_init_force_replaces_a_broken_file(coved, tmp_path):
    """A config file the CLI cannot read stops every command; --force is the way out."""
    path = tmp_path / "broken.ini"
    path.write_text("not a setting\n")
    env = {"COVE_CONFIG_FILE": str(path), "COVE_SERVER": None, "COVE_API_KEY": None}
    r = cli(coved, "config", "init", "--server", "http://127.0.0.1:1", env=env, check=False)
    assert r.returncode == 2 and path.read_text() == "not a setting\n"
    cli(coved, "config", "init", "--force", "--server", f"http://127.0.0.1:{coved.port}",
        "--api-key", coved.key, env=env)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert isinstance(cli_json(coved, "list", env=env)["items"], list)


def test_config_init_asks_on_a_terminal(coved, tmp_path):
    path = tmp_path / "asked.ini"
    env = cli_env(coved, {"COVE_CONFIG_FILE": str(path), "COVE_API_KEY": None})
    master, slave = pty.openpty()
    proc = subprocess.Popen([CLI, "config", "init"], stdin=slave, stderr=slave,
                            stdout=subprocess.PIPE, env=env)
    os.close(slave)
    seen = b""

    def wait_for(text):
        nonlocal seen
        deadline = time.time() + 30
        while text not in seen:
            assert time.time() < deadline, seen
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                seen += os.read(master, 4096)

    try:
        wait_for(b"Server [http://127.0.0.1:8080]: ")
        os.write(master, f"http://127.0.0.1:{coved.port}\n".encode())
        wait_for(b"API key (empty: none): ")
        os.write(master, f"{coved.key}\n".encode())
        out, _ = proc.communicate(timeout=30)
    finally:
        os.close(master)
    assert proc.returncode == 0 and out.decode() == f"{path}\n"
    assert coved.key.encode() not in seen  # typed without echo
    text = path.read_text()
    assert f"server = http://127.0.0.1:{coved.port}" in text and f"api-key = {coved.key}" in text


# ---- default TTL -----------------------------------------------------------------------

def test_create_expires_in_ten_minutes_by_default(coved):
    before = time.time()
    sandbox_id = cli(coved, "create").stdout.strip()
    try:
        expires = parse_time(coved.get(sandbox_id)["expiresAt"])
        assert before + 600 - 2 <= expires <= time.time() + 600 + 2
    finally:
        coved.delete(sandbox_id)
    for forever in ("0", "none"):
        sandbox_id = cli(coved, "create", "--timeout", forever).stdout.strip()
        try:
            assert coved.get(sandbox_id).get("expiresAt") is None
        finally:
            coved.delete(sandbox_id)
    sandbox_id = cli(coved, "sandbox", "create", "--timeout", "2m").stdout.strip()
    try:
        expires = parse_time(coved.get(sandbox_id)["expiresAt"])
        assert abs(expires - time.time() - 120) < 5
    finally:
        coved.delete(sandbox_id)
    help_text = cli(coved, "create", "--help").stdout
    assert "600" in help_text and "10 minutes" in help_text and "--timeout 0" in help_text
    assert cli(coved, "create", "--timeout", "10x", check=False).returncode == 2


# ---- progress on a terminal ------------------------------------------------------------

def run_with_pty_stderr(coved, *args, stdin_file=None, timeout=120):
    """Runs cove with stderr on a pseudo-terminal: (exit status, what the terminal got).
    With stdin_file, cove reads it from a pipe (cat FILE | cove ...): a size it cannot know."""
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(["sh", "-c", 'cat "$0" | "$@"', stdin_file, CLI, *args]
                                if stdin_file else [CLI, *args],
                                stdout=subprocess.DEVNULL, stderr=slave,
                                stdin=subprocess.DEVNULL, env=cli_env(coved))
        os.close(slave)
        slave = -1
        chunks = []
        deadline = time.time() + timeout
        while time.time() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every writer is gone
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        proc.wait(timeout=30)
        return proc.returncode, b"".join(chunks).decode(errors="replace")
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)


def test_progress_bar_on_a_terminal_and_silence_when_piped(coved, sid, tmp_path):
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(12 * MiB))
    status, shown = run_with_pty_stderr(coved, "upload", sid, str(big), "/tmp/big.bin")
    assert status == 0, shown
    assert re.search(r"\rupload big\.bin \[[#-]{10,40}\] +\d+% [\d.]+ [KMG]?i?B/12\.0 MiB", shown), \
        shown
    final = shown.replace("\r\n", "\n").rsplit("\r", 1)[-1]
    assert re.search(r"upload big\.bin: 12\.0 MiB in [\d.]+ s \([\d.]+ [KMG]iB/s\)", final), final
    assert coved.sh(sid, "stat -c %s /tmp/big.bin").strip() == str(12 * MiB)

    status, shown = run_with_pty_stderr(coved, "download", sid, "/tmp/big.bin",
                                        str(tmp_path / "back.bin"))
    assert status == 0, shown
    assert "download big.bin" in shown and re.search(r"12\.0 MiB in [\d.]+ s", shown)
    assert (tmp_path / "back.bin").read_bytes() == big.read_bytes()

    # from a pipe, of a size not known ahead: the bar once past 4 MiB, without a percentage
    status, shown = run_with_pty_stderr(coved, "upload", sid, "-", "/tmp/piped.bin",
                                        stdin_file=str(big))
    assert status == 0, shown
    assert re.search(r"upload piped\.bin [\d.]+ MiB [\d.]+ [KMG]?i?B/s", shown), shown
    assert "%" not in shown and re.search(r"upload piped\.bin: 12\.0 MiB in", shown), shown
    assert coved.sh(sid, "stat -c %s /tmp/piped.bin").strip() == str(12 * MiB)

    # piped: nothing at all
    r = cli(coved, "upload", sid, str(big), "/tmp/big2.bin")
    assert r.stderr == "" and r.stdout == ""
    r = cli(coved, "download", sid, "/tmp/big.bin", str(tmp_path / "again.bin"))
    assert r.stderr == "" and r.stdout == ""
    # small files: no bar even on a terminal
    small = tmp_path / "small.bin"
    small.write_bytes(b"x" * 1000)
    status, shown = run_with_pty_stderr(coved, "upload", sid, str(small), "/tmp/small.bin")
    assert status == 0 and shown == ""


# ---- -o yaml ---------------------------------------------------------------------------

# metadata values coved takes ([A-Za-z0-9._-]) that YAML would read as something else
TRICKY_METADATA = {"yes": "yes", "num": "0123", "null": "null", "float": "1e3", "on": "on",
                   "octal": "0o17", "bool": "True", "real": "1.5", "inf": "1.0e-5",
                   "dotted": "a.b-c_d", "plain": "words"}
# file names with what YAML's plain scalars cannot hold
TRICKY_NAMES = ["a: b", "#x", "- item", "it's \"q\"", "multi\nline", " lead", "trail ", "~",
                "*ref", "&anchor", "!tag", "%pct", "@at", "`tick", "{brace}", "[list]", "a #b",
                "|pipe", ">fold", "héllo ☃", "back\\slash", "tab\there", "null", "1e3", "yes",
                "0x1F", "12:30", "=", "?q", "-", "---", "...",
                # line breaks and characters YAML parsers refuse unescaped
                "line\u2028sep", "para\u2029sep", "nel\x85x", "c1\x80x", "\ufeffbom", "x\uffff"]


def test_yaml_output_reads_back_as_the_json(coved):
    args = ["create"]
    for k, v in TRICKY_METADATA.items():
        args += ["-m", f"{k}={v}"]
    sandbox_id = cli(coved, *args).stdout.strip()
    try:
        as_json = cli_json(coved, "get", sandbox_id)
        as_yaml = yaml.safe_load(cli(coved, "get", sandbox_id, "-o", "yaml").stdout)
        assert as_yaml == as_json
        assert as_yaml["metadata"] == TRICKY_METADATA

        for i, name in enumerate(TRICKY_NAMES):
            cli(coved, "file", "write", sandbox_id, f"/tmp/y/{i}/{name}", "-c", "x")
        found_json = cli_json(coved, "file", "search", sandbox_id, "/tmp/y", "--pattern", "*")
        found_yaml = yaml.safe_load(cli(coved, "file", "search", sandbox_id, "/tmp/y",
                                        "--pattern", "*", "-o", "yaml").stdout)
        assert found_yaml == found_json
        assert sorted(os.path.basename(e["path"]) for e in found_yaml) == sorted(TRICKY_NAMES)
        listed = yaml.safe_load(cli(coved, "sandbox", "list", "-o", "yaml").stdout)
        assert listed == cli_json(coved, "sandbox", "list")
        assert yaml.safe_load(cli(coved, "sandbox", "metrics", sandbox_id, "-o", "yaml").stdout)
        files = yaml.safe_load(cli(coved, "file", "info", sandbox_id, "/tmp", "-o", "yaml").stdout)
        assert files["/tmp"]["type"] == "directory"
        # an empty list is still a list
        assert yaml.safe_load(cli(coved, "list", "-m", "nobody=has-this", "-o", "yaml").stdout) \
            == {"items": []}
    finally:
        coved.delete(sandbox_id)
    assert cli(coved, "list", "-o", "xml", check=False).returncode == 2


# ---- completion and the man page -------------------------------------------------------

def complete_bash(words):
    script = (f"source <({CLI} completion bash); COMP_WORDS=({' '.join(words)}); "
              f"COMP_CWORD={len(words) - 1}; _cove; printf '%s\\n' \"${{COMPREPLY[@]}}\"")
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_bash_completion(coved):
    r = subprocess.run(["bash", "-c", f"source <({CLI} completion bash); complete -p cove"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "complete -F _cove cove" in r.stdout, r.stderr
    assert complete_bash(["cove", "sand"]) == ["sandbox"]
    assert set(complete_bash(["cove", "file", "ch"])) == {"chmod"}
    assert complete_bash(["cove", "command", "session", ""]) == ["create", "run", "delete"]
    assert "--memory" in complete_bash(["cove", "create", "--me"])
    assert "--yes" in complete_bash(["cove", "sandbox", "kill", "ID", "--y"])
    assert complete_bash(["cove", "-o", "y"]) == ["yaml"]
    assert complete_bash(["cove", "-o", "json", "tem"]) == ["template"]


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_completion(coved):
    r = subprocess.run(["zsh", "-c", f"autoload -U compinit && compinit -u; "
                        f"source <({CLI} completion zsh); echo ${{_comps[cove]}}"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout.strip() == "_cove", r.stderr


def test_zsh_completion_script_names_the_same_words(coved):
    zsh = cli(coved, "completion", "zsh").stdout
    bash = cli(coved, "completion", "bash").stdout
    assert zsh.startswith("#compdef cove\n")
    # the tables are the same; only the driving function differs
    assert zsh[zsh.index("_cove_next()"):zsh.index("_cove() {")] == \
        bash[bash.index("_cove_next()"):bash.index("_cove() {")]
    assert cli(coved, "completion", "fish", check=False).returncode == 2


def test_man_page(coved, tmp_path):
    page = cli(coved, "help", "--man").stdout
    built = os.path.join(BUILD, "src", "cli", "cove.1")
    assert os.path.exists(built) and open(built).read() == page
    assert page.startswith(".TH COVE 1 ")
    for section in (".SH NAME", ".SH SYNOPSIS", ".SH DESCRIPTION", '.SH "COMMANDS"'):
        assert f"\n{section}" in page
    for command in ("cove create", "cove sandbox kill", "cove command session run",
                    "cove file chmod", "cove completion"):
        assert f'.SS "{command}"' in page
    # no line of help text is read as a request
    for line in page.splitlines():
        assert not line.startswith("'")
        if line.startswith("."):
            assert re.match(r"\.(TH|SH|SS|PP|nf|fi|B|TP|I) ?", line), line
    if shutil.which("man"):
        r = subprocess.run(["man", "-l", built], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "MANPAGER": "cat", "MANWIDTH": "100"})
        assert r.returncode == 0, r.stderr
        text = re.sub(r".\x08", "", r.stdout)
        assert "cove file chmod" in text and "--timeout" in text and "NAME" in text
    assert cli(coved, "help", "file", "chmod").stdout.startswith("Usage: cove files chmod")
    assert cli(coved, "help", "nope", check=False).returncode == 2


# ---- error hints -----------------------------------------------------------------------

def test_missing_key_says_where_it_looked_and_how_to_set_one(coved, tmp_path):
    config = tmp_path / "config.ini"
    r = cli(coved, "list", check=False,
            env={"COVE_API_KEY": None, "COVE_STATE_DIR": str(tmp_path),
                 "COVE_CONFIG_FILE": str(config)})
    assert r.returncode == 1
    for place in ("$COVE_API_KEY", "$OPEN_SANDBOX_API_KEY", str(config),
                  str(tmp_path / "api_key"), "cove config set api-key", "export COVE_API_KEY"):
        assert place in r.stderr, (place, r.stderr)
    # a key that is wrong: said so, not that there is none
    r = cli(coved, "list", check=False, env={"COVE_API_KEY": "wrong"})
    assert r.returncode == 1 and "refused the API key" in r.stderr
    assert "No API key" not in r.stderr


def test_memory_unit_mistake_lists_the_units(coved):
    r = cli(coved, "create", "--memory", "1g", check=False)
    assert r.returncode == 2 and r.stdout == ""
    assert "unknown unit 'g'" in r.stderr
    for unit in ("Ki", "Mi", "Gi", "Ti", "K", "M", "G", "T", "bytes"):
        assert unit in r.stderr
    assert "unknown unit 'GB'" in cli(coved, "create", "--disk", "1GB", check=False).stderr
    # the units named are the ones the server takes
    for ok in ("1Gi", "600M", "536870912"):
        sandbox_id = cli(coved, "create", "--memory", ok).stdout.strip()
        coved.delete(sandbox_id)
