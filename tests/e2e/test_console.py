"""The web console's serving side (issue 16): /console and its files come out of coved itself
with their types, strict security headers, ETags, and 404s for anything not embedded, with no
key needed for the page while every API call it makes still needs one. The browser side is
tests/compat/console.test.mjs."""

import http.client
import json
import re

import pytest

CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
       "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


def fetch(coved, method, target, headers=None):
    """A request with exactly these headers (no key unless given), the target sent as is."""
    conn = http.client.HTTPConnection("127.0.0.1", coved.port, timeout=30)
    conn.putrequest(method, target, skip_accept_encoding=True)
    for k, v in (headers or {}).items():
        conn.putheader(k, v)
    conn.endheaders()
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp, body


def assert_secure(resp):
    for name, value in SECURITY_HEADERS.items():
        assert resp.getheader(name) == value, (name, resp.getheader(name))


@pytest.mark.parametrize("path", ["/console", "/console/", "/console/index.html"])
def test_the_page_loads_without_a_key(coved, path):
    resp, body = fetch(coved, "GET", path)
    assert resp.status == 200
    assert resp.getheader("Content-Type") == "text/html; charset=utf-8"
    assert_secure(resp)
    page = body.decode()
    assert '<script type="module" src="/console/js/app.js"></script>' in page
    # The policy allows no inline code: the page has none.
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", page)
    assert "<style" not in page and " style=" not in page and " onclick=" not in page


def test_every_linked_file_is_served_with_its_type(coved):
    _, body = fetch(coved, "GET", "/console")
    page = body.decode()
    css = re.findall(r'href="(/console/[^"]+\.css)"', page)
    js = re.findall(r'src="(/console/[^"]+\.js)"', page)
    assert css and js
    for path in css:
        resp, text = fetch(coved, "GET", path)
        assert resp.status == 200 and resp.getheader("Content-Type") == "text/css; charset=utf-8"
        assert_secure(resp)
    # The modules the entry point imports, and theirs, all resolve (relative imports).
    seen, todo = set(), list(js)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        resp, text = fetch(coved, "GET", path)
        assert resp.status == 200, path
        assert resp.getheader("Content-Type") == "text/javascript; charset=utf-8", path
        assert_secure(resp)
        base = path.rsplit("/", 1)[0]
        for rel in re.findall(r'from "(\.\.?/[^"]+)"', text.decode()):
            parts = (base + "/" + rel).split("/")
            out = []
            for p in parts:
                if p == "..":
                    out.pop()
                elif p != ".":
                    out.append(p)
            todo.append("/".join(out))
    assert len(seen) >= 5, seen


def test_etag_and_revalidation(coved):
    resp, body = fetch(coved, "GET", "/console/js/app.js")
    etag = resp.getheader("ETag")
    assert re.fullmatch(r'"[0-9a-f]{32}"', etag), etag
    assert resp.getheader("Cache-Control") == "no-cache"
    again, empty = fetch(coved, "GET", "/console/js/app.js", {"If-None-Match": etag})
    assert again.status == 304 and empty == b""
    assert again.getheader("ETag") == etag
    assert_secure(again)
    # A list, and a weak form of it, match too; another tag does not.
    listed, _ = fetch(coved, "GET", "/console/js/app.js", {"If-None-Match": f'"x", W/{etag}'})
    assert listed.status == 304
    other, again_body = fetch(coved, "GET", "/console/js/app.js", {"If-None-Match": '"nope"'})
    assert other.status == 200 and again_body == body
    # Another file has another tag.
    css, _ = fetch(coved, "GET", "/console/css/console.css")
    assert css.getheader("ETag") != etag


def test_head_has_the_headers_and_no_body(coved):
    get, body = fetch(coved, "GET", "/console/css/console.css")
    head, nothing = fetch(coved, "HEAD", "/console/css/console.css")
    assert head.status == 200 and nothing == b""
    assert head.getheader("Content-Length") == str(len(body))
    assert head.getheader("ETag") == get.getheader("ETag")
    assert_secure(head)


@pytest.mark.parametrize("path", [
    "/console/nope.js", "/console/js/", "/console/js", "/console/index.html/",
    "/console/../v1/sandboxes", "/console/js/../index.html", "/console/%2e%2e/etc/passwd",
    "/console/..%2f..%2fetc%2fpasswd", "/console//index.html", "/console/./index.html",
    "/console/js/app.js%00", "/console/\\..\\index.html", "/console/INDEX.HTML",
])
def test_unknown_names_and_traversal_are_404(coved, path):
    resp, body = fetch(coved, "GET", path)
    assert resp.status == 404, (path, resp.status, body)
    assert resp.getheader("Content-Type") == "application/json"
    err = json.loads(body)
    assert err["code"] == "CONSOLE::NOT_FOUND" and err["message"]
    assert_secure(resp)


def test_other_methods_are_refused(coved):
    resp, body = fetch(coved, "POST", "/console/index.html", {"Content-Length": "0"})
    assert resp.status == 405 and resp.getheader("Allow") == "GET, HEAD"


def test_paths_that_only_start_alike_are_not_the_console(coved):
    resp, _ = fetch(coved, "GET", "/consoles")
    assert resp.status == 404
    assert resp.getheader("Content-Security-Policy") is None


def test_the_api_still_needs_the_key(coved):
    """The page is public; what it shows is not: its calls carry the key in a header, and a
    cookie is no credential for the API (so a cross-site form cannot act for a user)."""
    resp, _ = fetch(coved, "GET", "/v1/sandboxes")
    assert resp.status == 401
    resp, _ = fetch(coved, "GET", "/v1/sandboxes", {"Cookie": f"OPEN-SANDBOX-API-KEY={coved.key}"})
    assert resp.status == 401
    resp, _ = fetch(coved, "POST", "/v1/sandboxes", {"Cookie": f"cove_route={coved.key}",
                                                      "Content-Type": "application/json",
                                                      "Content-Length": "0"})
    assert resp.status == 401
    resp, _ = fetch(coved, "GET", "/v1/sandboxes", {"OPEN-SANDBOX-API-KEY": coved.key})
    assert resp.status == 200
    # No CORS consent, so a page of another origin can neither send the header nor read.
    for method, headers in (("OPTIONS", {"Origin": "http://evil.example",
                                         "Access-Control-Request-Method": "GET",
                                         "Access-Control-Request-Headers": "open-sandbox-api-key"}),
                            ("GET", {"Origin": "http://evil.example",
                                     "OPEN-SANDBOX-API-KEY": coved.key})):
        resp, _ = fetch(coved, method, "/v1/sandboxes", headers)
        assert not any(k.lower().startswith("access-control-") for k, _ in resp.getheaders()), \
            resp.getheaders()
