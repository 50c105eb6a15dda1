"""Credentials that never enter the sandbox (issue 10): OpenSandbox's credential vault, held
by coved; a sandbox with credentialProxy gets coved's CA in its trust, sends a placeholder, and
coved injects the real value on the way out (TLS terminated only for bound hosts), and masks
it in what comes back. The upstream is a test HTTPS server on loopback whose certificate coved
verifies against the test CA (--egress-ca-bundle); it echoes what it received."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import egress_world  # noqa: E402
from egress_world import world, coved  # noqa: E402,F401 (fixtures)
from egress_world import HTTP_PORT, HTTPS_PORT, allow  # noqa: E402

pytestmark = egress_world.needs_dnsmasq

REAL = {"bearer": "sk-real-bearer-0123456789abcdef", "basic": "dXNlcjpyZWFsLXBhc3N3b3Jk",
        "key": "real-api-key-fedcba9876543210", "custom": "real-custom-value-55aa55aa"}
PLACEHOLDER = "COVE_PLACEHOLDER"


def vault_body():
    def binding(name, path, auth, scheme="https", port=HTTPS_PORT):
        return {"name": name, "match": {"hosts": ["api.test"], "schemes": [scheme],
                                        "ports": [port], "paths": [path]}, "auth": auth}
    return {
        "credentials": [{"name": k, "source": {"type": "inline", "value": v}}
                        for k, v in REAL.items()],
        "bindings": [
            binding("b-bearer", "/bearer*", {"type": "bearer", "credential": "bearer"}),
            binding("b-basic", "/basic*", {"type": "basic", "credential": "basic"}),
            binding("b-key", "/key*", {"type": "apiKey", "name": "X-Api-Key", "credential": "key"}),
            binding("b-custom", "/custom*", {"type": "customHeaders", "headers": [
                {"name": "X-Custom-Auth", "credential": "custom"}]}),
            binding("b-plain", "/plain*", {"type": "bearer", "credential": "bearer"},
                    scheme="http", port=HTTP_PORT),
        ],
    }


@pytest.fixture(scope="module")
def sid(coved, world):
    s = coved.create(networkPolicy=allow("api.test", "127.77.0.12", "allowed.test",
                                         "127.77.0.10"),
                     credentialProxy={"enabled": True})
    status, body, _ = coved.request("POST", f"/sandboxes/{s}/proxy/18080/credential-vault",
                                    vault_body())
    assert status == 201 and body["revision"] >= 1, body
    yield s
    coved.delete(s)


def upstream_headers(world, path):
    hits = [h for h in world.recorder.to("127.77.0.12") if h[2].startswith(path)]
    assert hits, f"the server saw no request for {path}"
    return hits[-1][3]


CLIENTS = {
    "curl": "curl -sS -m 10 {headers} 'https://api.test:%d{path}'" % HTTPS_PORT,
    "requests": ("python3 -c \"import requests,sys; r=requests.get('https://api.test:%d{path}',"
                 " headers=dict(h.split(': ',1) for h in sys.argv[1:]), timeout=10);"
                 " print(r.headers.get('X-Echo-Authorization')); print(r.text)\" {pyargs}"
                 % HTTPS_PORT),
    "node": ("node -e \"const h={{}}; for (const a of process.argv.slice(1)) {{ const i=a.indexOf(': ');"
             " h[a.slice(0,i)]=a.slice(i+2); }} fetch('https://api.test:%d{path}', {{headers: h}})"
             ".then(async r => {{ console.log(r.headers.get('x-echo-authorization'));"
             " console.log(await r.text()); }})"
             ".catch(e => {{ console.error(String(e.cause || e)); process.exit(1); }})\" {pyargs}"
             % HTTPS_PORT),
}


@pytest.mark.parametrize("client", sorted(CLIENTS))
@pytest.mark.parametrize("kind,path,header,expect", [
    ("bearer", "/bearer", "Authorization", "Bearer " + REAL["bearer"]),
    ("basic", "/basic", "Authorization", "Basic " + REAL["basic"]),
    ("key", "/key", "X-Api-Key", REAL["key"]),
    ("custom", "/custom", "X-Custom-Auth", REAL["custom"]),
])
def test_each_kind_is_injected_for_each_client(coved, world, sid, client, kind, path, header,
                                               expect):
    path = f"{path}/{client}"
    sent = {"Authorization": f"Bearer {PLACEHOLDER}"} if header == "Authorization" else {
        header: PLACEHOLDER}
    hs = " ".join(f"-H '{k}: {v}'" for k, v in sent.items())
    pyargs = " ".join(f"'{k}: {v}'" for k, v in sent.items())
    r = coved.exec(sid, CLIENTS[client].format(path=path, headers=hs, pyargs=pyargs))
    assert r.exit_code == 0, r.stdout + r.stderr
    got = upstream_headers(world, path)
    assert got.get(header) == expect, got
    # the echo carries the real value back: the sandbox sees it masked
    assert REAL[kind] not in r.stdout and REAL[kind] not in r.stderr, r.stdout


def test_the_sandbox_never_holds_a_real_value(coved, sid):
    out = coved.sh(sid, "env; cat /proc/1/environ | tr '\\0' '\\n';"
                        " grep -rsl -e real-api-key -e sk-real-bearer -e real-custom /etc /tmp"
                        " /root /home /run 2>/dev/null; echo end")
    for v in REAL.values():
        assert v not in out
    assert out.strip().endswith("end")
    assert "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt" in out


def test_plain_http_binding_and_unbound_hosts(coved, world, sid):
    out = coved.sh(sid, f"curl -sS -m 10 -H 'Authorization: Bearer {PLACEHOLDER}'"
                        f" http://api.test:{HTTP_PORT}/plain")
    assert upstream_headers(world, "/plain")["Authorization"] == "Bearer " + REAL["bearer"]
    assert REAL["bearer"] not in out
    # a host without a binding: its TLS is not decrypted (the sandbox must trust the server's
    # own CA, coved's does not help), and the placeholder goes out as it is
    r = coved.exec(sid, f"curl -sS -m 10 -H 'Authorization: Bearer {PLACEHOLDER}'"
                        f" https://allowed.test:{HTTPS_PORT}/unbound")
    assert r.exit_code != 0 and "certificate" in (r.stdout + r.stderr).lower(), r.stderr
    with open(world.ca) as f:
        coved.sh(sid, f"cat > /tmp/test-ca.pem <<'EOF'\n{f.read()}EOF")
    out = coved.sh(sid, f"curl -sS -m 10 --cacert /tmp/test-ca.pem -H 'Authorization: Bearer "
                        f"{PLACEHOLDER}' https://allowed.test:{HTTPS_PORT}/unbound")
    seen = [h for h in world.recorder.to("127.77.0.10") if h[2] == "/unbound"][-1][3]
    assert seen["Authorization"] == f"Bearer {PLACEHOLDER}"
    # a path with no binding on the bound host: nothing injected
    coved.sh(sid, f"curl -sS -m 10 -H 'Authorization: Bearer {PLACEHOLDER}'"
                  f" https://api.test:{HTTPS_PORT}/elsewhere")
    assert upstream_headers(world, "/elsewhere")["Authorization"] == f"Bearer {PLACEHOLDER}"


def test_vault_api_is_sanitized_and_revisioned(coved, sid):
    base = f"/sandboxes/{sid}/proxy/18080/credential-vault"
    status, state, _ = coved.request("GET", base)
    assert status == 200
    text = json.dumps(state)
    for v in REAL.values():
        assert v not in text
    rev = state["revision"]
    assert {c["name"] for c in state["credentials"]} == set(REAL)
    status, one, _ = coved.request("GET", base + "/bindings/b-key")
    assert status == 200 and one["name"] == "b-key" and one["auth"]["type"] == "apiKey", one
    assert coved.request("GET", base + "/credentials/nope")[0] == 404
    # a stale revision changes nothing
    status, body, _ = coved.request("PATCH", base, {"expectedRevision": rev + 7, "credentials": {
        "replace": [{"name": "key", "source": {"type": "inline", "value": "stale"}}]}})
    assert status == 409, body
    # an invalid part fails the whole mutation
    status, body, _ = coved.request("PATCH", base, {"expectedRevision": rev, "credentials": {
        "add": [{"name": "ok-one", "source": {"type": "inline", "value": "v"}}]},
        "bindings": {"add": [{"name": "bad", "match": {"hosts": ["x.test"]},
                              "auth": {"type": "bearer", "credential": "missing"}}]}})
    assert status == 400, body
    assert coved.ok("GET", base)["revision"] == rev
    status, body, _ = coved.request("PATCH", base, {"expectedRevision": rev, "credentials": {
        "add": [{"name": "ok-one", "source": {"type": "inline", "value": "v"}}]}})
    assert status == 200 and body["revision"] == rev + 1, body


def test_vault_needs_the_credential_proxy(coved):
    s = coved.create(networkPolicy=allow("api.test"))
    try:
        status, body, _ = coved.request("POST", f"/sandboxes/{s}/proxy/18080/credential-vault",
                                        vault_body())
        assert status == 412, body
        assert "SSL_CERT_FILE" not in coved.sh(s, "env")
    finally:
        coved.delete(s)
