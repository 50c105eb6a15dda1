"""The `cove` CLI over egress (issue 10): `cove create --allow/--deny/--network/
--credential-proxy`, `cove egress get|allow|deny|remove|events` and `cove credential-vault ...`,
run as a user would against a coved whose outside world is on this machine's loopback
(tests/egress_world.py). Each check looks at what the sandbox could reach, what coved holds, and
what the CLI printed."""
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from covetest import CLI, serve  # noqa: E402
import egress_world  # noqa: E402
from egress_world import world, coved  # noqa: E402,F401 (fixtures)
from egress_world import HTTP_PORT, HTTPS_PORT  # noqa: E402

pytestmark = egress_world.needs_dnsmasq

SETTINGS_ENV = ("COVE_SERVER", "OPEN_SANDBOX_DOMAIN", "COVE_API_KEY", "OPEN_SANDBOX_API_KEY",
                "COVE_STATE_DIR", "COVE_CONFIG_FILE", "XDG_CONFIG_HOME")
SECRET = "sk-cli-secret-7f3a9c2e51d04b68"
SHORT_SECRET = "sk-short-4b68c2"
PLACEHOLDER = "COVE_PLACEHOLDER"


def cli(coved, *args, check=True, stdin=None):
    """Runs cove against coved, its settings from the environment only."""
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS_ENV}
    env.update(COVE_SERVER=f"http://127.0.0.1:{coved.port}", COVE_API_KEY=coved.key,
               COVE_CONFIG_FILE=os.path.join(coved.state_dir, "no-such-config.ini"))
    r = subprocess.run([CLI, *args], capture_output=True, text=True, env=env, timeout=120,
                       input=stdin)
    if check and r.returncode != 0:
        raise AssertionError(f"cove {args} -> {r.returncode}: {r.stderr}")
    return r


def cli_json(coved, *args, **kw):
    return json.loads(cli(coved, *args, "-o", "json", **kw).stdout)


@pytest.fixture
def create(coved, world):
    """`cove create ARGS...`: the sandbox's id; every sandbox made is killed afterwards."""
    made = []

    def create(*args):
        sid = cli(coved, "create", *args).stdout.strip()
        made.append(sid)
        return sid

    yield create
    for sid in made:
        cli(coved, "kill", sid, check=False)
    world.recorder.clear()


def curl(coved, sid, url, *args):
    """curl inside the sandbox: (exit code, output)."""
    r = coved.exec(sid, f"curl -sS -m 10 {' '.join(args)} '{url}'")
    return r.exit_code, r.stdout + r.stderr


def served_by(output):
    try:
        return json.JSONDecoder().raw_decode(output[output.index("{"):])[0]["server"]
    except (ValueError, KeyError, TypeError):
        return None


def policy(coved, sid):
    status, body, _ = coved.request("GET", f"/sandboxes/{sid}/proxy/18080/policy")
    assert status == 200, body
    return body


def rules(coved, sid):
    return [(r["action"], r["target"]) for r in policy(coved, sid)["policy"]["egress"]]


def table(stdout, header):
    """The rows of the table whose header row starts with `header` (up to a blank line), split
    on whitespace."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == [header])
    rows = []
    for line in lines[start + 1:]:
        if not line.strip():
            break
        rows.append(line.split())
    return rows


# ---- create with a policy, and the policy at runtime ------------------------------------

def test_create_with_allow_reaches_only_what_it_names(coved, create, world):
    sid = create("--allow", "allowed.test", "--allow", "127.77.0.10")
    assert policy(coved, sid)["mode"] == "deny_all"
    assert rules(coved, sid) == [("allow", "allowed.test"), ("allow", "127.77.0.10")]
    code, out = curl(coved, sid, f"http://allowed.test:{HTTP_PORT}/cli")
    assert code == 0 and served_by(out) == "127.77.0.10", out
    code, out = curl(coved, sid, f"http://other.test:{HTTP_PORT}/cli")
    assert code != 0 or "cove egress" in out, out
    assert world.recorder.to("127.77.0.11") == []

    # `egress get` shows the mode and the rules in order; -o json is the server's answer
    out = cli(coved, "egress", "get", sid).stdout
    assert out.splitlines()[0] == "mode: deny_all", out
    assert table(out, "ACTION") == [["allow", "allowed.test"], ["allow", "127.77.0.10"]], out
    assert cli_json(coved, "egress", "get", sid) == policy(coved, sid)

    # the decisions so far: the denied name is there, with the rule that decided
    out = cli(coved, "egress", "events", sid).stdout
    assert out.splitlines()[0].split() == ["TIME", "ACTION", "PROTOCOL", "NAME", "ADDRESS",
                                           "RULE"], out
    rows = table(out, "TIME")
    assert any(r[1] == "allow" and r[3] == "allowed.test" and r[4] == f"127.77.0.10:{HTTP_PORT}"
               for r in rows), out
    assert any(r[1] == "deny" and r[3] == "other.test" for r in rows), out
    events = cli_json(coved, "egress", "events", sid)["events"]
    assert events == coved.ok("GET", f"/v1/sandboxes/{sid}/egress/events")["events"]
    assert len(rows) == len(events)


def test_egress_allow_deny_remove_apply_to_the_next_connection(coved, create, world):
    sid = create("--allow", "allowed.test", "--allow", "127.77.0.10")
    code, _ = curl(coved, sid, f"http://other.test:{HTTP_PORT}/")
    assert code != 0

    out = cli(coved, "egress", "allow", sid, "other.test", "127.77.0.11").stdout
    assert table(out, "ACTION") == [["allow", "other.test"], ["allow", "127.77.0.11"],
                                    ["allow", "allowed.test"], ["allow", "127.77.0.10"]], out
    code, out = curl(coved, sid, f"http://other.test:{HTTP_PORT}/now")
    assert code == 0 and served_by(out) == "127.77.0.11", out

    # a deny for the same target replaces its allow
    body = cli_json(coved, "egress", "deny", sid, "other.test")
    assert ["deny", "other.test"] in [[r["action"], r["target"]] for r in body["policy"]["egress"]]
    assert ("allow", "other.test") not in rules(coved, sid)
    code, out = curl(coved, sid, f"http://other.test:{HTTP_PORT}/denied")
    assert code != 0 or "cove egress" in out, out

    out = cli(coved, "egress", "remove", sid, "other.test", "127.77.0.11").stdout
    assert rules(coved, sid) == [("allow", "allowed.test"), ("allow", "127.77.0.10")]
    assert table(out, "ACTION") == [["allow", "allowed.test"], ["allow", "127.77.0.10"]], out
    code, out = curl(coved, sid, f"http://other.test:{HTTP_PORT}/gone")
    assert code != 0 or "cove egress" in out, out
    assert [h[2] for h in world.recorder.to("127.77.0.11")] == ["/now"]


def test_egress_patch_merges_rules_from_a_file(coved, create, world, tmp_path):
    sid = create("--allow", "allowed.test", "--allow", "127.77.0.10")
    f = tmp_path / "rules.json"
    f.write_text('[{"action": "allow", "target": "other.test"},'
                 ' {"action": "allow", "target": "127.77.0.11"}]')
    cli(coved, "egress", "patch", sid, "--file", str(f))
    assert ("allow", "other.test") in rules(coved, sid)
    code, out = curl(coved, sid, f"http://other.test:{HTTP_PORT}/patched")
    assert code == 0 and served_by(out) == "127.77.0.11", out
    f.write_text('{"action": "allow"}')
    r = cli(coved, "egress", "patch", sid, "--file", str(f), check=False)
    assert r.returncode != 0 and "array" in r.stderr, r.stderr


def test_create_rules_keep_their_order_and_network_sets_the_default(coved, create):
    sid = create("--deny", "denied.test", "--allow", "*.test", "--network", "allow-all",
                 "--allow", "127.77.0.0/24")
    body = policy(coved, sid)
    assert body["mode"] == "allow_all" and body["policy"]["defaultAction"] == "allow", body
    assert rules(coved, sid) == [("deny", "denied.test"), ("allow", "*.test"),
                                 ("allow", "127.77.0.0/24")]
    code, out = curl(coved, sid, f"http://allowed.test:{HTTP_PORT}/")
    assert code == 0 and served_by(out) == "127.77.0.10", out
    code, out = curl(coved, sid, f"http://denied.test:{HTTP_PORT}/")
    assert code != 0 or "cove egress" in out, out

    # --network alone: that default and no rules
    sid = create("--network", "allow-all")
    body = policy(coved, sid)
    assert body["policy"] == {"defaultAction": "allow", "egress": []}, body
    out = cli(coved, "egress", "get", sid).stdout
    assert out == "mode: allow_all\nno rules\n", out
    sid = create("--network", "deny-all")
    assert policy(coved, sid)["policy"] == {"defaultAction": "deny", "egress": []}


def test_no_network_flag_leaves_the_servers_default(coved, create):
    sid = create()
    assert policy(coved, sid)["policy"] == {"defaultAction": "deny", "egress": []}
    code, out = curl(coved, sid, f"http://allowed.test:{HTTP_PORT}/")
    assert code != 0 or "cove egress" in out, out


def test_bad_targets_show_the_servers_message(coved, create):
    before = coved.ok("GET", "/v1/sandboxes")["items"]
    status, expected, _ = coved.request("POST", "/v1/sandboxes", {
        "image": {"uri": "base"}, "entrypoint": ["sleep", "1"],
        "resourceLimits": {"cpu": "500m", "memory": "512Mi"},
        "networkPolicy": {"defaultAction": "deny",
                          "egress": [{"action": "allow", "target": "bad name!"}]}})
    assert status == 400 and expected["message"], expected
    r = cli(coved, "create", "--allow", "bad name!", check=False)
    assert r.returncode == 1 and r.stdout == "", r
    assert r.stderr == f"cove: {expected['code']}: {expected['message']}\n", r.stderr
    assert coved.ok("GET", "/v1/sandboxes")["items"] == before

    sid = create("--allow", "allowed.test")
    r = cli(coved, "egress", "allow", sid, "ok.test", "bad name!", check=False)
    assert r.returncode == 1 and "bad name!" in r.stderr and r.stderr.startswith("cove: "), r
    assert rules(coved, sid) == [("allow", "allowed.test")]  # nothing changed

    # usage errors: exit 2 and nothing sent
    for args in (("create", "--network", "sometimes"), ("egress", "allow", sid),
                 ("egress", "get"), ("egress", "bogus", sid)):
        r = cli(coved, *args, check=False)
        assert r.returncode == 2, (args, r)
    assert rules(coved, sid) == [("allow", "allowed.test")]
    r = cli(coved, "egress", "get", "no-such-sandbox", check=False)
    assert r.returncode == 1 and "no-such-sandbox" in r.stderr, r


# ---- the credential vault ---------------------------------------------------------------

def vault_body():
    return {
        "credentials": [{"name": "bearer", "source": {"type": "inline", "value": SECRET}}],
        "bindings": [{"name": "b-bearer",
                      "match": {"hosts": ["api.test"], "schemes": ["https"],
                                "ports": [HTTPS_PORT], "paths": ["/bearer*"]},
                      "auth": {"type": "bearer", "credential": "bearer"}}],
    }


def test_credential_vault_round_trip_never_prints_the_value(coved, create, world, tmp_path):
    outputs = []

    def run(*args, **kw):
        r = cli(coved, *args, **kw)
        outputs.append(r.stdout + r.stderr)
        return r

    sid = create("--credential-proxy", "--allow", "api.test", "--allow", "127.77.0.12")
    body_file = tmp_path / "vault.json"
    body_file.write_text(json.dumps(vault_body()))

    out = run("credential-vault", "create", sid, "--file", str(body_file)).stdout
    assert out.splitlines()[0] == "revision: 1", out
    assert table(out, "CREDENTIAL")[0] == ["bearer", "inline", "1"], out
    binding = table(out, "BINDING")[0]
    assert binding[:5] == ["b-bearer", "bearer", "https", "api.test", str(HTTPS_PORT)], out

    # the vault works: the sandbox sends the placeholder, the server gets the real value
    r = coved.exec(sid, f"curl -sS -m 10 -H 'Authorization: Bearer {PLACEHOLDER}'"
                        f" https://api.test:{HTTPS_PORT}/bearer/cli")
    assert r.exit_code == 0, r.stderr
    seen = [h for h in world.recorder.to("127.77.0.12") if h[2] == "/bearer/cli"]
    assert seen and seen[-1][3]["Authorization"] == f"Bearer {SECRET}", seen

    state = json.loads(run("credential-vault", "get", sid, "-o", "json").stdout)
    assert state == coved.ok("GET", f"/sandboxes/{sid}/proxy/18080/credential-vault")
    assert state["revision"] == 1 and [c["name"] for c in state["credentials"]] == ["bearer"]
    run("credential-vault", "get", sid)
    out = run("credential-vault", "credentials", sid).stdout
    assert table(out, "CREDENTIAL") == [["bearer", "inline", "1"]], out
    out = run("credential-vault", "credentials", sid, "bearer").stdout
    assert table(out, "CREDENTIAL") == [["bearer", "inline", "1"]], out
    out = run("credential-vault", "bindings", sid, "b-bearer").stdout
    assert table(out, "BINDING")[0][0] == "b-bearer", out
    one = json.loads(run("credential-vault", "bindings", sid, "b-bearer", "-o", "json").stdout)
    assert one["name"] == "b-bearer" and one["auth"]["type"] == "bearer", one
    r = run("credential-vault", "credentials", sid, "nope", check=False)
    assert r.returncode == 1 and "nope" in r.stderr, r

    # patch from stdin: a new value at the expected revision; a stale revision changes nothing
    patch = {"expectedRevision": 1, "credentials": {"replace": [
        {"name": "bearer", "source": {"type": "inline", "value": SECRET + "-2"}}]}}
    out = run("credential-vault", "patch", sid, "--file", "-", stdin=json.dumps(patch)).stdout
    assert out.splitlines()[0] == "revision: 2", out
    r = run("credential-vault", "patch", sid, "--file", "-", stdin=json.dumps(patch),
            check=False)
    assert r.returncode == 1 and r.stderr.startswith("cove: "), r
    assert coved.ok("GET", f"/sandboxes/{sid}/proxy/18080/credential-vault")["revision"] == 2
    coved.exec(sid, f"curl -sS -m 10 -H 'Authorization: Bearer {PLACEHOLDER}'"
                    f" https://api.test:{HTTPS_PORT}/bearer/patched")
    seen = [h for h in world.recorder.to("127.77.0.12") if h[2] == "/bearer/patched"]
    assert seen and seen[-1][3]["Authorization"] == f"Bearer {SECRET}-2", seen

    # a file that is not JSON: the error names where, never the text near it (the value)
    bad = tmp_path / "bad.json"
    # (a comma missing before a short value: jansson's own message would quote it whole)
    bad.write_text('{"credentials": [{"name": "x", "source": {"type": "inline" "'
                   + SHORT_SECRET + '"}}]}')
    r = run("credential-vault", "patch", sid, "--file", str(bad), check=False)
    assert r.returncode == 1 and "line 1" in r.stderr, r
    assert SHORT_SECRET not in r.stderr, r
    r = run("credential-vault", "create", sid, "--file", str(tmp_path / "missing.json"),
            check=False)
    assert r.returncode == 1 and "missing.json" in r.stderr, r
    r = run("credential-vault", "create", sid, check=False)
    assert r.returncode == 2, r
    # creating it twice is the server's 409
    r = run("credential-vault", "create", sid, "--file", str(body_file), check=False)
    assert r.returncode == 1 and "EGRESS::VAULT_EXISTS" in r.stderr, r

    r = run("credential-vault", "delete", sid)
    assert r.stdout == "", r
    status, body, _ = coved.request("GET", f"/sandboxes/{sid}/proxy/18080/credential-vault")
    assert status == 404, body
    r = run("credential-vault", "get", sid, check=False)
    assert r.returncode == 1 and body["message"] in r.stderr, r

    everything = "\n".join(outputs)
    assert "revision: 2" in everything  # the outputs were collected
    assert SECRET not in everything, everything


def test_credential_vault_needs_the_credential_proxy(coved, create, tmp_path):
    sid = create("--allow", "api.test")
    body_file = tmp_path / "vault.json"
    body_file.write_text(json.dumps(vault_body()))
    r = cli(coved, "credential-vault", "create", sid, "--file", str(body_file), check=False)
    assert r.returncode == 1 and "EGRESS::CREDENTIAL_PROXY_DISABLED" in r.stderr, r
    assert SECRET not in r.stdout + r.stderr


def test_help_lists_the_network_commands(coved):
    out = cli(coved, "--help").stdout
    section = out.split("Network:\n")[1].split("\n\n")[0]
    assert [line.split()[0] for line in section.splitlines() if line.startswith("  ") and
            not line.startswith("   ")] == ["egress", "credential-vault"], section
    for group, subs in (("egress", ("get", "allow", "deny", "remove", "events")),
                        ("credential-vault", ("create", "get", "patch", "delete", "credentials",
                                              "bindings"))):
        for sub in subs:
            r = cli(coved, group, sub, "--help")
            assert r.stdout.startswith(f"Usage: cove {group} {sub}"), (group, sub, r.stdout)
    r = cli(coved, "egress", check=False)
    assert r.returncode == 2 and "Usage: cove egress" in r.stderr
    assert "--allow TARGET" in cli(coved, "create", "--help").stdout
