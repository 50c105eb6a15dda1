"""coved's settings: INI file < environment < flags; bad settings refuse to start."""

import os
import subprocess

from covetest import COVED, Coved


def key_works(d, key):
    status, _, _ = d.request("GET", "/v1/sandboxes", headers={"OPEN-SANDBOX-API-KEY": key})
    return status == 200


def test_file_then_environment_then_flags(tmp_path):
    ini = tmp_path / "coved.ini"
    ini.write_text("[server]\napi_keys = from-file, second-file-key\nmax_sandbox_timeout_seconds = 120\n")
    env = dict(os.environ, COVE_CONFIG=str(ini))
    d = Coved(api_keys=(), env=env)
    try:
        d.start()
        assert key_works(d, "from-file") and key_works(d, "second-file-key")
        assert not key_works(d, "other")
        d.key = "from-file"
        status, body, _ = d.request("POST", "/v1/sandboxes", {
            "image": {"uri": "base"}, "entrypoint": ["true"], "timeout": 121})
        assert status == 400 and "120" in body["message"]
    finally:
        d.cleanup()

    d = Coved(api_keys=(), env=dict(env, COVE_API_KEYS="from-env"))
    try:
        d.start()
        assert key_works(d, "from-env") and not key_works(d, "from-file")
    finally:
        d.cleanup()

    d = Coved(api_keys=("from-flag",), env=dict(env, COVE_API_KEYS="from-env"))
    try:
        d.start()
        assert key_works(d, "from-flag") and not key_works(d, "from-env")
    finally:
        d.cleanup()


def test_no_key_refuses_to_start_unless_insecure(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("COVE_")}
    r = run_coved("--state-dir", str(tmp_path / "s"), "--listen", "127.0.0.1:0", env=env)
    assert r.returncode == 2 and "no API key" in r.stderr
    d = Coved(api_keys=(), extra_args=["--insecure"], env=env)
    try:
        d.start()
        d.key = None
        assert d.request("GET", "/v1/sandboxes", headers={})[0] == 200
    finally:
        d.cleanup()


def test_key_file(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# team keys\nkey-one\n\n  key-two  \n")
    d = Coved(api_keys=(), extra_args=["--api-key-file", str(keys)])
    try:
        d.start()
        assert key_works(d, "key-one") and key_works(d, "key-two")
        assert not key_works(d, "# team keys") and not key_works(d, "")
    finally:
        d.cleanup()


def run_coved(*args, env=None):
    return subprocess.run([COVED, *args], capture_output=True, text=True, timeout=30,
                          env=env or os.environ.copy())


def test_bad_settings_refuse_to_start(tmp_path):
    ini = tmp_path / "bad.ini"
    for text in ("[server]\nbogus = 1\n", "[other]\nlisten = 1.2.3.4:5\n", "not ini at all\n",
                 "[server]\nmax_sandbox_timeout_seconds = ten\n",
                 "[server]\nmax_sandbox_timeout_seconds = 9223372036854775807\n"):
        ini.write_text(text)
        r = run_coved("--config", str(ini), "--state-dir", str(tmp_path / "s"))
        assert r.returncode == 2, (text, r.stderr)
        assert r.stderr.startswith("coved: ")
    r = run_coved("--config", str(tmp_path / "missing.ini"))
    assert r.returncode == 2
    r = run_coved("--insecure", "--listen", "0.0.0.0:0", "--state-dir", str(tmp_path / "s"))
    assert r.returncode == 2 and "loopback" in r.stderr
    r = run_coved("--help")
    assert r.returncode == 0 and "COVE_STATE_DIR" in r.stdout and "api_keys" in r.stdout


def cgroup2_mounts():
    with open("/proc/self/mountinfo") as f:
        rows = [line.split(" - ") for line in f]
    return [(left.split()[4], right.split()[2]) for left, right in rows
            if right.split()[0] == "cgroup2"]


def test_cgroup_favor_dynmods(tmp_path):
    """coved remounts the host's cgroup2 with favordynmods, keeping the mount's own options
    (a remount that dropped nsdelegate would loosen systemd's delegation), unless told not
    to; a value that is no boolean refuses to start."""
    before = cgroup2_mounts()
    d = Coved()
    try:
        d.start()
        after = cgroup2_mounts()
        log = d.log()
    finally:
        d.cleanup()
    if not before:
        assert "no cgroup2 mount" in log
        return
    target = next((m for m in after if m[0] == "/sys/fs/cgroup"), after[0])
    opts = set(target[1].split(","))
    if "cannot remount" in log:  # a kernel older than 6.0 has no such option
        return
    assert "favordynmods" in opts, (target, log[-2000:])
    old = dict(before)[target[0]].split(",")
    assert set(old) <= opts  # nothing the mount had was lost
    d = Coved(extra_args=["--cgroup-favor-dynmods", "false"])
    try:
        d.start()
        assert "favordynmods" not in d.log()
    finally:
        d.cleanup()
    r = run_coved("--cgroup-favor-dynmods", "maybe", "--state-dir", str(tmp_path / "s"))
    assert r.returncode == 2 and "cgroup_favor_dynmods" in r.stderr
