"""Ports a browser can open (issue 10): host routing on {port}-{id}.localhost out of the box, and
a signed endpoint URL opened in a browser turned into a host-scoped HttpOnly cookie, so that an
app whose page loads /static/... by absolute path just works. Driven with Debian's headless
Chromium (skipped without it), which is only ever pointed at this coved on 127.0.0.1 and is
kept from resolving or calling anything else."""

import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.parse

import pytest

from covetest import serve

HERE = os.path.dirname(os.path.abspath(__file__))
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
APP_PORT = 3000
COOKIE = "cove_route"
LOG = "/tmp/browser_app.log"

# Nothing but this machine: every name other than localhost maps to NOTFOUND, and the
# background services that would call home are off.
CHROMIUM_FLAGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-default-apps", "--metrics-recording-only", "--disable-breakpad",
    "--disable-extensions", "--disable-dev-shm-usage", "--no-proxy-server",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE *.localhost, "
    "EXCLUDE 127.0.0.1",
]


@pytest.fixture(scope="module")
def gw():
    """A coved without --domain: host routing must work on .localhost all the same."""
    with serve() as d:
        yield d


def start_app(d, sid):
    source = open(os.path.join(HERE, "sandbox_servers", "browser_app.py")).read()
    d.sh(sid, f"cat > /tmp/browser_app.py <<'PYEOF'\n{source}\nPYEOF")
    d.exec(sid, f"python3 /tmp/browser_app.py {APP_PORT}", background=True)
    for _ in range(200):
        probe = f"import socket; socket.create_connection(('127.0.0.1', {APP_PORT}))"
        if d.exec(sid, f'python3 -c "{probe}"').exit_code == 0:
            return
        time.sleep(0.05)
    raise AssertionError("the app did not start")


@pytest.fixture(scope="module")
def app(gw):
    sid = gw.create()
    start_app(gw, sid)
    yield sid
    gw.delete(sid)


@pytest.fixture(scope="module")
def other_app(gw):
    sid = gw.create()
    start_app(gw, sid)
    yield sid
    gw.delete(sid)


def app_log(d, sid):
    """What the app got: one {"path", "headers": [[name, value], ...]} per request."""
    out = d.sh(sid, f"cat {LOG} 2>/dev/null || true")
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def clear_app_log(d, sid):
    d.sh(sid, f"rm -f {LOG}")


def endpoint(d, sid, port=APP_PORT, query=""):
    status, body, _ = d.request("GET", f"/v1/sandboxes/{sid}/endpoints/{port}{query}")
    assert status == 200, body
    return body


def signed(d, sid, expires_in=600, host=False, port=APP_PORT):
    q = f"?expires={int(time.time()) + expires_in}" + ("&host=true" if host else "")
    return endpoint(d, sid, port, q)["endpoint"]


def chromium_dom(url, timeout=90):
    """The DOM of url once loaded, as headless Chromium's --dump-dom prints it. Chromium and
    its children run in a process group of their own, killed whatever happens, and its
    profile directory is removed."""
    if not os.path.exists(CHROMIUM):
        pytest.skip("chromium is not installed")
    profile = tempfile.mkdtemp(prefix="cove-chromium-")
    proc = subprocess.Popen([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                             "--dump-dom", url],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, env={**os.environ, "HOME": profile})
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        shutil.rmtree(profile, ignore_errors=True)
    assert out, f"chromium printed no DOM (exit {proc.returncode}): {err.decode()[-2000:]}"
    return out.decode(errors="replace")


def get(d, path, host=None, headers=None, method="GET"):
    """Status, headers (lowercase names, lists of values) and body of one request to coved."""
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=30)
    h = dict(headers or {})
    if host:
        h["Host"] = host
    conn.request(method, path, headers=h)
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    got = {}
    for k, v in resp.getheaders():
        got.setdefault(k.lower(), []).append(v)
    return resp.status, got, body


NAVIGATE = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8", "Sec-Fetch-Mode": "navigate"}


def cookie_through_redirects(d, route, path="/index.html"):
    """Follows the two redirects a browser follows from a signed path route: the cookie's
    Set-Cookie header, the cookie value, and the final host[:port]."""
    status, h, _ = get(d, path_of(route) + path, headers=NAVIGATE)
    assert status == 302, (status, h)
    loc = urllib.parse.urlsplit(h["location"][0])
    assert h["location"][0].startswith("//") and loc.hostname.endswith(".localhost")
    assert "set-cookie" not in h  # a cookie set here would belong to 127.0.0.1
    status, h2, _ = get(d, f"{loc.path}?{loc.query}", host=loc.netloc)
    assert status == 302 and h2["location"] == [path], (status, h2)
    set_cookie = h2["set-cookie"][0]
    value = re.match(rf"{COOKIE}=([^;]+)", set_cookie)[1]
    return set_cookie, value, loc.netloc


def path_of(route):
    return "/" + route.partition("/")[2]


def test_signed_url_opens_app_with_absolute_links_in_chromium(gw, app):
    clear_app_log(gw, app)
    route = signed(gw, app)
    dom = chromium_dom(f"http://{route}/index.html")
    assert f"app.js ran on {APP_PORT}-{app}.localhost:{gw.port}" in dom, dom[-2000:]
    log = app_log(gw, app)
    paths = [e["path"] for e in log]
    assert "/index.html" in paths and "/static/app.js" in paths, paths
    # the app saw neither the cookie nor the value handed over in the query
    for e in log:
        assert COOKIE not in e["path"], e
        for name, value in e["headers"]:
            assert COOKIE not in value, (name, value)


def test_signed_host_form_opens_in_chromium_too(gw, app):
    host_route = signed(gw, app, host=True)
    assert re.fullmatch(rf"{app}-{APP_PORT}-[0-9a-z]+-[0-9a-z]+\.localhost:{gw.port}", host_route)
    dom = chromium_dom(f"http://{host_route}/index.html")
    assert f"app.js ran on {APP_PORT}-{app}.localhost:{gw.port}" in dom, dom[-2000:]


def test_expired_signed_url_is_403_in_chromium_and_curl(gw, app):
    route = signed(gw, app, expires_in=2)
    time.sleep(3.5)
    dom = chromium_dom(f"http://{route}/index.html")
    assert "GATEWAY::ROUTE_EXPIRED" in dom and "app.js ran" not in dom, dom[-2000:]
    for headers in ({}, NAVIGATE):
        status, _, body = get(gw, path_of(route) + "/index.html", headers=headers)
        assert status == 403 and json.loads(body)["code"] == "GATEWAY::ROUTE_EXPIRED"


def test_cookie_is_host_scoped_httponly_lax_and_for_one_sandbox_port(gw, app, other_app):
    set_cookie, value, netloc = cookie_through_redirects(gw, signed(gw, app))
    assert netloc == f"{APP_PORT}-{app}.localhost:{gw.port}"
    attrs = {a.strip().split("=")[0].lower() for a in set_cookie.split(";")[1:]}
    assert {"httponly", "path", "max-age"} <= attrs and "domain" not in attrs
    assert "SameSite=Lax" in set_cookie and "Path=/" in set_cookie
    max_age = int(re.search(r"Max-Age=(\d+)", set_cookie)[1])
    assert 590 <= max_age <= 600  # the signed URL's own expiry
    cookie = {"Cookie": f"{COOKIE}={value}"}
    status, _, body = get(gw, "/index.html", host=netloc, headers=cookie)
    assert status == 200 and b"/static/app.js" in body
    status, _, body = get(gw, "/static/app.js", host=netloc, headers=cookie)
    assert status == 200 and b"script ran" in body
    # another sandbox, another port of the same sandbox: refused, with a body that says why
    for host in (f"{APP_PORT}-{other_app}.localhost:{gw.port}",
                 f"8001-{app}.localhost:{gw.port}"):
        status, _, body = get(gw, "/index.html", host=host, headers=cookie)
        assert status == 403, (host, status, body)
        err = json.loads(body)
        assert err["code"] == "GATEWAY::INVALID_COOKIE" and "sandbox" in err["message"]
    # a forged MAC, a cookie of the right shape signed by nobody
    forged = value[:-2] + ("A" if value[-2] != "A" else "B") + value[-1]
    status, _, body = get(gw, "/index.html", host=netloc, headers={"Cookie": f"{COOKIE}={forged}"})
    assert status == 403 and json.loads(body)["code"] == "GATEWAY::INVALID_COOKIE"
    # no credentials at all: 401 as before
    assert get(gw, "/index.html", host=netloc)[0] == 401
    # a signed route is not a cookie, nor a cookie a signed route
    b36, sig = signed(gw, app).rsplit("/", 2)[1:]
    status, _, _ = get(gw, "/", host=netloc,
                       headers={"Cookie": f"{COOKIE}={app}.{APP_PORT}.{b36}.{sig}"})
    assert status == 403


def test_app_never_sees_the_cookie_and_cannot_replace_it(gw, app):
    _, value, netloc = cookie_through_redirects(gw, signed(gw, app))
    clear_app_log(gw, app)
    status, _, _ = get(gw, "/index.html", host=netloc,
                       headers={"Cookie": f"theme=dark; {COOKIE}={value}; lang=en"})
    assert status == 200
    status, _, _ = get(gw, "/index.html", host=netloc, headers={"Cookie": f"{COOKIE}={value}"})
    assert status == 200
    log = app_log(gw, app)
    cookies = [[v for n, v in e["headers"] if n == "cookie"] for e in log]
    assert cookies == [["theme=dark; lang=en"], []], cookies
    # a Set-Cookie of coved's cookie from the app is dropped; the app's own cookies pass
    status, h, _ = get(gw, "/set-cookie", host=netloc, headers={"Cookie": f"{COOKIE}={value}"})
    assert status == 200 and h.get("set-cookie") == ["app_session=1; Path=/"], h


def test_expired_cookie_is_403(gw, app):
    _, value, netloc = cookie_through_redirects(gw, signed(gw, app, expires_in=2))
    cookie = {"Cookie": f"{COOKIE}={value}"}
    assert get(gw, "/index.html", host=netloc, headers=cookie)[0] == 200
    time.sleep(3.5)
    status, _, body = get(gw, "/index.html", host=netloc, headers=cookie)
    assert status == 403 and json.loads(body)["code"] == "GATEWAY::COOKIE_EXPIRED"
    # nor can the hand-over be replayed once expired
    status, _, body = get(gw, f"/index.html?{COOKIE}={value}", host=netloc)
    assert status == 403 and json.loads(body)["code"] == "GATEWAY::COOKIE_EXPIRED"


def test_redirects_never_leave_the_sandbox_host(gw, app):
    route = signed(gw, app)
    host = f"{APP_PORT}-{app}.localhost:{gw.port}"
    # the signed route's rest, a query only, nothing: all stay paths on the host form
    for rest, want in (("//evil.example/x", "/evil.example/x?"), ("?q=1", "/?q=1&"),
                       ("", "/?")):
        status, h, _ = get(gw, path_of(route) + rest, headers=NAVIGATE)
        assert status == 302 and h["location"][0].startswith(f"//{host}{want}{COOKIE}="), h
    _, value, _ = cookie_through_redirects(gw, route)
    for path, want in ((f"//evil.example/x?{COOKIE}={value}", "/evil.example/x"),
                       (f"/%5Cevil.example?{COOKIE}={value}", "/%5Cevil.example"),
                       (f"/a?x=1&{COOKIE}={value}&y=2", "/a?x=1&y=2")):
        status, h, _ = get(gw, path, host=host)
        assert status == 302 and h["location"] == [want], (path, h)
    # the hand-over is for GET: a POST with it is refused, not forwarded
    status, _, body = get(gw, f"/index.html?{COOKIE}={value}", host=host, method="POST")
    assert status == 405 and json.loads(body)["code"] == "GATEWAY::METHOD_NOT_ALLOWED"
    # a Host whose "port" is not one is no route (it could end up in a Location)
    status, _, _ = get(gw, path_of(signed(gw, app, host=False)), headers=NAVIGATE,
                       host=f"127.0.0.1:{gw.port}@evil.example")
    assert status == 200  # forwarded as a plain signed route: no redirect to such a host


def test_api_clients_keep_signed_path_routes_without_redirect(gw, app):
    route = signed(gw, app)
    # curl's and requests' Accept: */*, and a POST that asks for HTML: forwarded as before
    status, h, body = get(gw, path_of(route) + "/index.html", headers={"Accept": "*/*"})
    assert status == 200 and b"/static/app.js" in body and "set-cookie" not in h
    status, _, _ = get(gw, path_of(route) + "/index.html", headers={"Accept": "text/html"},
                       method="POST")
    assert status == 501  # http.server's answer to a POST: it reached the app
    # a script's fetch of HTML is no navigation either
    status, _, _ = get(gw, path_of(route) + "/index.html",
                       headers={"Accept": "text/html", "Sec-Fetch-Mode": "cors"})
    assert status == 200


def test_curl_reaches_localhost_host_form_with_access_token(gw, app):
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    ep = endpoint(gw, app, query="?host=true")
    assert ep["endpoint"] == f"{APP_PORT}-{app}.localhost:{gw.port}"
    (name, token), = ep["headers"].items()
    url = f"http://{ep['endpoint']}/index.html"
    base = ["curl", "-sS", "--noproxy", "*", "--max-time", "30", "-o", "-", "-w", "\n%{http_code}"]
    ok = subprocess.run(base + ["-H", f"{name}: {token}", url], capture_output=True, text=True,
                        timeout=60)
    body, _, code = ok.stdout.rpartition("\n")
    assert code == "200" and "/static/app.js" in body, (ok.stdout, ok.stderr)
    bad = subprocess.run(base + [url], capture_output=True, text=True, timeout=60)
    assert bad.stdout.rpartition("\n")[2] == "401", (bad.stdout, bad.stderr)


def test_endpoint_api_default_is_still_the_path_form(gw, app):
    ep = endpoint(gw, app)
    assert ep["endpoint"] == f"127.0.0.1:{gw.port}/sandboxes/{app}/proxy/{APP_PORT}"
    assert "/route/" in signed(gw, app)


def test_localhost_and_domain_both_route_when_a_domain_is_set():
    with serve("--domain", "cove.test") as d:
        sid = d.create()
        try:
            start_app(d, sid)
            assert endpoint(d, sid, query="?host=true")["endpoint"] == \
                f"{APP_PORT}-{sid}.cove.test:{d.port}"
            for suffix in ("cove.test", "localhost"):
                status, _, body = get(d, "/index.html", host=f"{APP_PORT}-{sid}.{suffix}:{d.port}",
                                      headers=d.headers())
                assert status == 200 and b"/static/app.js" in body, suffix
            # a browser's signed path route goes to the --domain host form
            status, h, _ = get(d, path_of(signed(d, sid)) + "/", headers=NAVIGATE)
            assert status == 302
            assert h["location"][0].startswith(f"//{APP_PORT}-{sid}.cove.test:{d.port}/?{COOKIE}=")
        finally:
            d.delete(sid)
