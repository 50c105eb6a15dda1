"""The `cove` CLI over the whole lifecycle: renew, endpoint, metadata, list filters, the
per-user config file and its precedence, -o json, and the exit statuses scripts rely on
(0 ok, 1 the server refused, 2 bad usage, 3 unreachable)."""

import configparser
import datetime
import json
import os
import socket
import stat
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from covetest import AGENT_PORT, CLI

UNREACHABLE = "http://127.0.0.1:1"
SETTINGS_ENV = ("COVE_SERVER", "OPEN_SANDBOX_DOMAIN", "COVE_API_KEY", "OPEN_SANDBOX_API_KEY",
                "COVE_STATE_DIR", "COVE_CONFIG_FILE", "XDG_CONFIG_HOME")


@pytest.fixture
def config_file(tmp_path):
    """Where the CLI keeps its settings in a test: nothing there until a test writes it."""
    return str(tmp_path / "cfg" / "cove" / "config.ini")


def cli(coved, *args, check=True, env=None, config=None):
    """Runs cove against coved with settings from the environment only (no config file of the
    user running the tests); `env` adds to or (value None) removes from that environment."""
    base = {k: v for k, v in os.environ.items() if k not in SETTINGS_ENV}
    base.update(COVE_SERVER=f"http://127.0.0.1:{coved.port}", COVE_API_KEY=coved.key,
                COVE_STATE_DIR=coved.state_dir,
                COVE_CONFIG_FILE=config or os.path.join(coved.state_dir, "no-such-config.ini"))
    for k, v in (env or {}).items():
        if v is None:
            base.pop(k, None)
        else:
            base[k] = v
    r = subprocess.run([CLI, *args], capture_output=True, text=True, env=base, timeout=120)
    if check and r.returncode != 0:
        raise AssertionError(f"cove {args} -> {r.returncode}: {r.stderr}")
    return r


def cli_json(coved, *args, **kw):
    return json.loads(cli(coved, *args, "-o", "json", **kw).stdout)


def parse_time(text):
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def iso(ts):
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ")


def fetch(url, headers=None):
    """GET with exactly these headers (no API key); the HTTP status."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def parse_endpoint(stdout):
    """The URL on the first line, then `Name: value` headers."""
    lines = stdout.splitlines()
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return lines[0], headers


# ---- help -------------------------------------------------------------------------------

COMMANDS = ("create", "get", "list", "kill", "pause", "resume", "renew", "endpoint", "metadata",
            "events", "exec", "run-code", "template", "image", "volume", "snapshot", "config", "mcp")


def test_help_lists_every_command_and_each_has_help(coved):
    out = cli(coved, "--help").stdout
    listed = [line.split()[0] for line in out.split("Commands:\n")[1].split("\n\n")[0].splitlines()]
    assert listed == list(COMMANDS)
    for command in COMMANDS:
        r = cli(coved, command, "--help")
        assert r.stdout.startswith(f"Usage: cove {command}"), (command, r.stdout)
    for group, subs in (("config", ("set", "get", "unset", "path")), ("template", ("list", "add")),
                        ("volume", ("ls", "rm")),
                        ("image", ("pull", "ls", "list", "rm", "prune", "import")),
                        ("snapshot", ("create", "ls", "get", "rm"))):
        for sub in subs:
            r = cli(coved, group, sub, "--help")
            assert r.stdout.startswith(f"Usage: cove {group} {sub}"), (group, sub, r.stdout)
    # a group without a command: its help, as a usage error
    r = cli(coved, "config", check=False)
    assert r.returncode == 2 and "Usage: cove config" in r.stderr


# ---- renew ------------------------------------------------------------------------------

def test_renew_with_timeout_and_expires_at(coved):
    sid = cli(coved, "create", "--timeout", "60").stdout.strip()
    try:
        before = time.time()
        printed = cli(coved, "renew", sid, "--timeout", "600").stdout
        assert printed.endswith("\n") and len(printed.splitlines()) == 1
        renewed = parse_time(printed.strip())
        assert before + 600 - 1 <= renewed <= time.time() + 600 + 1
        assert abs(parse_time(coved.get(sid)["expiresAt"]) - renewed) < 0.01

        later = int(renewed) + 120
        body = cli_json(coved, "renew", sid, "--expires-at", iso(later))
        assert set(body) == {"expiresAt"} and abs(parse_time(body["expiresAt"]) - later) < 0.01
        assert abs(parse_time(coved.get(sid)["expiresAt"]) - later) < 0.01

        # in the past: the server's 400, exit 1, expiry unchanged
        r = cli(coved, "renew", sid, "--expires-at", iso(time.time() - 30), check=False)
        assert r.returncode == 1 and r.stdout == "" and "cove: " in r.stderr
        assert abs(parse_time(coved.get(sid)["expiresAt"]) - later) < 0.01
    finally:
        cli(coved, "kill", sid)


def test_renew_of_sandbox_without_expiry_is_409_exit_1_with_code(coved):
    sid = cli(coved, "create", "--timeout", "0").stdout.strip()  # never expires
    try:
        status, err, _ = coved.request("POST", f"/v1/sandboxes/{sid}/renew-expiration",
                                       {"expiresAt": iso(time.time() + 600)})
        assert status == 409
        r = cli(coved, "renew", sid, "--timeout", "600", check=False)
        assert r.returncode == 1 and r.stdout == ""
        assert err["code"] in r.stderr and err["message"] in r.stderr
        assert coved.get(sid).get("expiresAt") is None
    finally:
        cli(coved, "kill", sid)


@pytest.mark.parametrize("args", [
    [], ["--timeout", "60", "--expires-at", "2030-01-01T00:00:00Z"], ["--timeout", "0"],
    ["--timeout", "-5"], ["--timeout", "soon"], ["--timeout", "99999999999999999999"],
    ["--expires-at", "tomorrow"], ["--expires-at", "2030-13-01T00:00:00Z"],
    ["--expires-at", "1700000000"], ["--bogus"],
])
def test_renew_usage_errors_are_exit_2_before_any_request(coved, args):
    # the server is unreachable: a usage error must be found without it (else exit 3)
    r = cli(coved, "renew", "some-id", *args, check=False, env={"COVE_SERVER": UNREACHABLE})
    assert r.returncode == 2, (args, r.stderr)
    assert r.stdout == ""
    r = cli(coved, "renew", "--timeout", "60", check=False)  # no id
    assert r.returncode == 2


# ---- endpoint ---------------------------------------------------------------------------

def test_endpoint_url_and_headers_reach_the_sandbox_without_api_key(coved):
    sid = cli(coved, "create").stdout.strip()
    try:
        out = cli(coved, "endpoint", sid, str(AGENT_PORT)).stdout
        url, headers = parse_endpoint(out)
        assert url == f"http://127.0.0.1:{coved.port}/sandboxes/{sid}/proxy/{AGENT_PORT}"
        assert headers, "a direct endpoint needs its access header"
        assert "OPEN-SANDBOX-API-KEY" not in {h.upper() for h in headers}
        assert fetch(url + "/ping", headers) == 200
        assert fetch(url + "/ping") == 401  # the headers are needed

        # the scheme comes from the server URL, even given without one
        out = cli(coved, "endpoint", sid, str(AGENT_PORT),
                  env={"COVE_SERVER": f"127.0.0.1:{coved.port}"}).stdout
        assert parse_endpoint(out)[0] == url

        # -o json: the server's answer as is, endpoint without a scheme
        body = cli_json(coved, "endpoint", sid, str(AGENT_PORT))
        assert body == {"endpoint": url[len("http://"):], "headers": headers}

        out = cli(coved, "endpoint", sid, str(AGENT_PORT), "--server-proxy").stdout
        proxy_url, proxy_headers = parse_endpoint(out)
        assert fetch(proxy_url + "/ping", proxy_headers) == 200
    finally:
        cli(coved, "kill", sid)


def test_endpoint_signed_with_expires(coved):
    sid = cli(coved, "create").stdout.strip()
    try:
        out = cli(coved, "endpoint", sid, str(AGENT_PORT), "--expires", "120").stdout
        url, headers = parse_endpoint(out)
        assert url.startswith(f"http://127.0.0.1:{coved.port}/") and headers == {}
        assert fetch(url + "/ping") == 200
        # the signature covers the route: another port is refused
        forged = url.replace(f"/{AGENT_PORT}/", f"/{AGENT_PORT + 1}/")
        assert forged != url and fetch(forged + "/ping") == 403

        at = int(time.time()) + 120
        out = cli(coved, "endpoint", sid, str(AGENT_PORT), "--expires-at", str(at)).stdout
        url, headers = parse_endpoint(out)
        assert headers == {} and fetch(url + "/ping") == 200
        body = cli_json(coved, "endpoint", sid, str(AGENT_PORT), "--expires", "120")
        assert body["headers"] == {} and "://" not in body["endpoint"]

        # refused by the server (signed and proxied at once): exit 1
        r = cli(coved, "endpoint", sid, str(AGENT_PORT), "--expires", "60", "--server-proxy",
                check=False)
        assert r.returncode == 1 and r.stdout == ""
    finally:
        cli(coved, "kill", sid)


@pytest.mark.parametrize("args", [
    [], ["only-id"], ["id", "0"], ["id", "65536"], ["id", "http"], ["id", "80", "extra"],
    ["id", "80", "--expires", "60", "--expires-at", "9999999999"], ["id", "80", "--expires", "x"],
    ["id", "80", "--expires", "0"], ["id", "80", "--expires-at", "-1"],
    ["id", "80", "--expires-at", "soon"], ["id", "80", "-o", "xml"],
])
def test_endpoint_usage_errors_are_exit_2(coved, args):
    r = cli(coved, "endpoint", *args, check=False, env={"COVE_SERVER": UNREACHABLE})
    assert r.returncode == 2, (args, r.stderr)


# ---- metadata ---------------------------------------------------------------------------

def test_metadata_set_and_remove(coved):
    sid = cli(coved, "create", "-m", "team=ml", "-m", "env=dev").stdout.strip()
    try:
        assert cli(coved, "metadata", sid).stdout == "env=dev\nteam=ml\n"
        r = cli(coved, "metadata", sid, "env=prod", "team-", "project=apollo", "gone-")
        assert r.stdout == "env=prod\nproject=apollo\n"
        assert coved.get(sid)["metadata"] == {"env": "prod", "project": "apollo"}
        sandbox = cli_json(coved, "metadata", sid, "owner=me")
        assert sandbox["id"] == sid
        assert sandbox["metadata"] == {"env": "prod", "project": "apollo", "owner": "me"}
        assert cli_json(coved, "metadata", sid)["metadata"] == sandbox["metadata"]

        # the server refuses a bad key: exit 1 and nothing changed
        r = cli(coved, "metadata", sid, "bad key=x", "env=test", check=False)
        assert r.returncode == 1 and "cove: " in r.stderr
        assert coved.get(sid)["metadata"] == sandbox["metadata"]
        # not KEY=VALUE nor KEY-: exit 2, nothing sent
        for bad in ("justakey", "-", "=value"):
            r = cli(coved, "metadata", sid, bad, check=False)
            assert r.returncode == 2, (bad, r.stderr)
        assert cli(coved, "metadata", check=False).returncode == 2
        assert coved.get(sid)["metadata"] == sandbox["metadata"]
    finally:
        cli(coved, "kill", sid)


# ---- list -------------------------------------------------------------------------------

def test_list_filters_by_state_and_metadata(coved):
    tag = f"t{int(time.time() * 1000) % 10 ** 9}"
    running = cli(coved, "create", "-m", f"suite={tag}", "-m", "role=a").stdout.strip()
    paused = cli(coved, "create", "-m", f"suite={tag}", "-m", "role=b").stdout.strip()
    other = cli(coved, "create", "-m", "suite=elsewhere").stdout.strip()
    try:
        cli(coved, "pause", paused)

        def ids(*args):
            return {s["id"] for s in cli_json(coved, "list", *args)["items"]}

        assert ids("--metadata", f"suite={tag}") == {running, paused}
        assert ids("--metadata", f"suite={tag}", "--state", "Paused") == {paused}
        assert ids("--metadata", f"suite={tag}", "--state", "Running") == {running}
        assert ids("-m", f"suite={tag}", "--state", "Running", "--state", "Paused") == \
            {running, paused}
        assert ids("-m", f"suite={tag}", "-m", "role=b") == {paused}  # all of them must match
        assert ids("-m", f"suite={tag}", "-m", "role=c") == set()
        assert other in ids("--state", "Running") and paused not in ids("--state", "Running")

        table = cli(coved, "list", "-m", f"suite={tag}").stdout.splitlines()
        assert table[0].split() == ["ID", "STATE", "TEMPLATE", "CREATED", "EXPIRES"]
        rows = {line.split()[0]: line.split()[1] for line in table[1:]}
        assert rows == {running: "Running", paused: "Paused"}

        r = cli(coved, "list", "--metadata", "novalue", check=False)
        assert r.returncode == 2
        r = cli(coved, "list", "stray", check=False)
        assert r.returncode == 2
    finally:
        cli(coved, "kill", running, paused, other)


# ---- config -----------------------------------------------------------------------------

def test_config_set_get_unset_and_file_mode(coved, config_file):
    c = dict(config=config_file)
    assert cli(coved, "config", "path", **c).stdout == config_file + "\n"
    assert cli_json(coved, "config", "path", **c) == {"path": config_file}
    assert cli(coved, "config", "get", **c).stdout == ""  # no file yet: no settings
    r = cli(coved, "config", "get", "server", check=False, **c)
    assert r.returncode == 1 and r.stdout == ""
    assert not os.path.exists(config_file)

    cli(coved, "config", "set", "server", "http://example.invalid:1234", **c)
    st = os.stat(config_file)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(config_file)).st_mode) == 0o700
    cli(coved, "config", "set", "api-key", "secret-key", **c)
    # written anew and renamed into place, not rewritten in place; no temporary left over
    assert os.stat(config_file).st_ino != st.st_ino
    assert stat.S_IMODE(os.stat(config_file).st_mode) == 0o600
    assert os.listdir(os.path.dirname(config_file)) == ["config.ini"]

    assert cli(coved, "config", "get", "server", **c).stdout == "http://example.invalid:1234\n"
    assert cli(coved, "config", "get", "api-key", **c).stdout == "secret-key\n"
    assert cli(coved, "config", "get", **c).stdout == \
        "server=http://example.invalid:1234\napi-key=secret-key\n"
    assert cli_json(coved, "config", "get", **c) == \
        {"server": "http://example.invalid:1234", "api-key": "secret-key"}
    assert cli_json(coved, "config", "get", "api-key", **c) == {"api-key": "secret-key"}
    assert cli_json(coved, "config", "set", "server", "http://other:1", **c) == \
        {"server": "http://other:1", "api-key": "secret-key"}
    cli(coved, "config", "unset", "server", **c)
    assert cli(coved, "config", "get", **c).stdout == "api-key=secret-key\n"
    # the file is plain INI that other tools read too
    parser = configparser.ConfigParser()
    parser.read_string("[top]\n" + open(config_file).read())
    assert dict(parser["top"]) == {"api-key": "secret-key"}

    # unknown keys and bad values are usage errors, and change nothing
    before = open(config_file).read()
    for args in (["set", "colour", "blue"], ["get", "colour"], ["unset", "colour"],
                 ["set", "output", "xml"], ["set", "server"], ["set", "server", ""],
                 ["set", "api-key", "two\nlines"], ["set", "api-key", " padded "],
                 ["set", "a", "b", "c"], ["get", "server", "api-key"], ["path", "extra"]):
        r = cli(coved, "config", *args, check=False, **c)
        assert r.returncode == 2, (args, r.stderr)
    assert open(config_file).read() == before
    r = cli(coved, "config", "frobnicate", check=False, **c)
    assert r.returncode == 2


def test_config_file_location(coved, tmp_path):
    env = {"COVE_CONFIG_FILE": None, "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
           "HOME": str(tmp_path / "home")}
    assert cli(coved, "config", "path", env=env).stdout == f"{tmp_path}/xdg/cove/config.ini\n"
    cli(coved, "config", "set", "output", "json", env=env)
    assert os.path.exists(tmp_path / "xdg" / "cove" / "config.ini")
    env["XDG_CONFIG_HOME"] = None
    assert cli(coved, "config", "path", env=env).stdout == \
        f"{tmp_path}/home/.config/cove/config.ini\n"
    env["COVE_CONFIG_FILE"] = str(tmp_path / "explicit.ini")
    assert cli(coved, "config", "path", env=env).stdout == f"{tmp_path}/explicit.ini\n"


def test_config_precedence_server(coved, config_file):
    c = dict(config=config_file)
    good = f"http://127.0.0.1:{coved.port}"
    cli(coved, "config", "set", "server", good, **c)
    no_env = {"COVE_SERVER": None, "OPEN_SANDBOX_DOMAIN": None}
    # the file is used when nothing else names a server
    assert cli(coved, "list", env=no_env, **c).returncode == 0
    # the environment wins over the file
    r = cli(coved, "list", check=False, env={"COVE_SERVER": UNREACHABLE}, **c)
    assert r.returncode == 3
    r = cli(coved, "list", check=False,
            env={"COVE_SERVER": None, "OPEN_SANDBOX_DOMAIN": "127.0.0.1:1"}, **c)
    assert r.returncode == 3
    # COVE_SERVER wins over OPEN_SANDBOX_DOMAIN, and --server over both
    assert cli(coved, "list", env={"OPEN_SANDBOX_DOMAIN": "127.0.0.1:1"}, **c).returncode == 0
    assert cli(coved, "--server", good, "list", env={"COVE_SERVER": UNREACHABLE,
                                                       "OPEN_SANDBOX_DOMAIN": UNREACHABLE},
               **c).returncode == 0
    assert cli(coved, "list", "--server", UNREACHABLE, check=False, **c).returncode == 3
    # a file naming a dead server loses to the environment
    cli(coved, "config", "set", "server", UNREACHABLE, **c)
    assert cli(coved, "list", **c).returncode == 0
    assert cli(coved, "list", check=False, env=no_env, **c).returncode == 3
    # with neither: the default address
    os.unlink(config_file)
    with socket.socket() as probe:
        default_in_use = probe.connect_ex(("127.0.0.1", 8080)) == 0
    if not default_in_use:
        r = cli(coved, "list", check=False, env=no_env, **c)
        assert r.returncode == 3 and "127.0.0.1:8080" in r.stderr


def test_config_precedence_api_key(coved, config_file, tmp_path):
    c = dict(config=config_file)
    key_dir = tmp_path / "state"
    key_dir.mkdir()
    (key_dir / "api_key").write_text("wrong-from-state-dir\n")
    no_env = {"COVE_API_KEY": None, "OPEN_SANDBOX_API_KEY": None, "COVE_STATE_DIR": str(key_dir)}

    def status(*args, env=None):
        return cli(coved, *args, "list", check=False, env={**no_env, **(env or {})}, **c).returncode

    assert status() == 1  # only the state dir's (wrong) key: 401
    (key_dir / "api_key").write_text(coved.key + "\n")
    assert status() == 0  # the state dir's key
    cli(coved, "config", "set", "api-key", "wrong-from-file", **c)
    assert status() == 1  # the file wins over the state dir
    (key_dir / "api_key").write_text("wrong-from-state-dir\n")
    cli(coved, "config", "set", "api-key", coved.key, **c)
    assert status() == 0
    assert status(env={"OPEN_SANDBOX_API_KEY": "wrong"}) == 1  # environment over the file
    assert status(env={"COVE_API_KEY": "wrong"}) == 1
    cli(coved, "config", "set", "api-key", "wrong-from-file", **c)
    assert status(env={"OPEN_SANDBOX_API_KEY": coved.key}) == 0
    assert status(env={"COVE_API_KEY": coved.key, "OPEN_SANDBOX_API_KEY": "wrong"}) == 0
    assert status("--api-key", coved.key, env={"COVE_API_KEY": "wrong"}) == 0  # flag over all
    assert status("--api-key", "wrong", env={"COVE_API_KEY": coved.key}) == 1
    r = cli(coved, "list", check=False, env=no_env, **c)
    assert r.returncode == 1 and "cove: " in r.stderr


def test_config_output_default_and_bad_file(coved, config_file):
    c = dict(config=config_file)
    sid = cli(coved, "create", **c).stdout.strip()
    try:
        cli(coved, "config", "set", "output", "json", **c)
        assert json.loads(cli(coved, "get", sid, **c).stdout)["id"] == sid
        assert cli(coved, "get", sid, "-o", "table", **c).stdout.startswith("ID ")
        cli(coved, "config", "set", "output", "table", **c)
        assert cli(coved, "get", sid, **c).stdout.startswith("ID ")

        # a file cove cannot make sense of is a usage error naming it
        for text in ("server = x\ncolour = blue\n", "[section]\nserver = x\n",
                     "this is not ini\n", "output = xml\n", "server = a\nserver = b\n"):
            with open(config_file, "w") as f:
                f.write(text)
            r = cli(coved, "get", sid, check=False, **c)
            assert r.returncode == 2 and config_file in r.stderr, (text, r.stderr)
        # comments and blank lines are fine
        with open(config_file, "w") as f:
            f.write("# mine\n\n; also a comment\noutput = json\n")
        assert json.loads(cli(coved, "get", sid, **c).stdout)["id"] == sid
    finally:
        cli(coved, "kill", sid)


# ---- -o json and exit statuses ----------------------------------------------------------

def test_json_output_of_every_command_parses(coved, config_file):
    created = cli_json(coved, "create", "--timeout", "300", "-m", "k=v")
    sid = created["id"]
    try:
        assert cli_json(coved, "get", sid)["id"] == sid
        assert sid in [s["id"] for s in cli_json(coved, "list")["items"]]
        assert "expiresAt" in cli_json(coved, "renew", sid, "--timeout", "600")
        assert set(cli_json(coved, "endpoint", sid, str(AGENT_PORT))) == {"endpoint", "headers"}
        assert cli_json(coved, "metadata", sid, "k-")["metadata"] == {}
        assert "items" in cli_json(coved, "template", "list")
        assert cli_json(coved, "config", "set", "output", "table", config=config_file) == \
            {"output": "table"}
        assert cli_json(coved, "config", "get", config=config_file) == {"output": "table"}
        assert cli_json(coved, "config", "unset", "output", config=config_file) == {}
        assert "path" in cli_json(coved, "config", "path", config=config_file)
        # -o before the command works too
        assert json.loads(cli(coved, "-o", "json", "get", sid).stdout)["id"] == sid
    finally:
        cli(coved, "kill", sid)


MISSING = "nosuchsandbox0000"


@pytest.mark.parametrize("args", [
    ["get", MISSING], ["kill", MISSING], ["pause", MISSING], ["resume", MISSING],
    ["renew", MISSING, "--timeout", "60"], ["endpoint", MISSING, "8080"],
    ["metadata", MISSING], ["metadata", MISSING, "a=b"],
])
def test_exit_1_when_the_server_refuses(coved, args):
    r = cli(coved, *args, check=False)
    assert r.returncode == 1, r.stderr
    assert r.stdout == "" and r.stderr.startswith("cove: ")
    r = cli(coved, *args, check=False, env={"COVE_API_KEY": "not-a-key"})
    assert r.returncode == 1, r.stderr


@pytest.mark.parametrize("args", [
    ["frobnicate"], ["list", "--bogus"], ["get"], ["get", "a", "b"], ["kill"], ["pause"],
    ["create", "--timeout", "soon"], ["renew", "x"], ["endpoint", "x"], ["metadata"],
    ["list", "-o", "xml"], ["config", "set", "nokey", "v"], ["template", "nothing"], [],
])
def test_exit_2_on_bad_usage(coved, args):
    r = cli(coved, *args, check=False, env={"COVE_SERVER": UNREACHABLE})
    assert r.returncode == 2, (args, r.stderr)
    assert r.stdout == ""


@pytest.mark.parametrize("args", [
    ["list"], ["get", "x"], ["create"], ["kill", "x"], ["renew", "x", "--timeout", "60"],
    ["endpoint", "x", "8080"], ["metadata", "x", "a=b"], ["template", "list"],
])
def test_exit_3_when_unreachable(coved, args):
    r = cli(coved, *args, check=False, env={"COVE_SERVER": UNREACHABLE})
    assert r.returncode == 3, (args, r.stderr)
    assert "CLI::UNREACHABLE" in r.stderr
