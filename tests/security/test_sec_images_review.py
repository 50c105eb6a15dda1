"""Hostile-review findings on image pulls (issue 13): each test fails on the code as it was
before its fix. A small registry of the test's own (plain HTTP on 127.77.3.x) lies where the
real one would not: declared sizes, endless bodies, slow answers, Basic auth."""

import http.server
import json
import re
import secrets
import socketserver
import tarfile
import threading
import time

import pytest

import image_build as ib
import registry_world as rw
from covetest import serve

ADDRESS = "127.77.3.10"
ADMIN = "review-admin-key"
BUDGET = 32 << 20  # --image-store-max-bytes of this module's daemon
SLEEP = ["/bin/sleep", "3600"]
MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
STREAM_CAP = 256 << 20  # the endless blob stops here (never fill the test host's disk)


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class HostileRegistry:
    """manifests[(repo, ref)] = bytes; blobs[digest] = bytes or "endless";
    auth = (user, password) required as Basic; delay = seconds before each manifest answer."""

    def __init__(self, address=ADDRESS):
        self.address = address
        self.port = rw.free_port(address)
        self.manifests, self.blobs = {}, {}
        self.auth = None
        self.delay = 0.0
        self.lock = threading.Lock()
        self.streamed = 0  # bytes of "endless" blobs sent
        self.seen = []  # (path, Authorization header) of every GET
        self.server = None

    @property
    def host(self):
        return f"{self.address}:{self.port}"

    def ref(self, name):
        return f"{self.host}/{name}"

    def add(self, repo, tag, img, manifest=None):
        body = manifest if manifest is not None else img.manifest_blob
        self.manifests[(repo, tag)] = body
        self.manifests[(repo, ib.sha256(body))] = body
        self.blobs[img.config_digest] = img.config_blob
        for l in img.layers:
            self.blobs[l.digest] = l.blob

    def start(self):
        reg = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _send(self, status, body=b"", ctype="application/json", extra=()):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for k, v in extra:
                    self.send_header(k, v)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def do_GET(self):
                with reg.lock:
                    reg.seen.append((self.path, self.headers.get("Authorization")))
                path = self.path.split("?")[0]
                m = re.match(r"^/v2/(.+)/(manifests|blobs)/([^/]+)$", path)
                if m and m.group(2) == "manifests" and reg.delay:
                    time.sleep(reg.delay)
                if reg.auth and self.headers.get("Authorization") != rw.basic(*reg.auth):
                    return self._send(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}',
                                      extra=[("WWW-Authenticate", 'Basic realm="hostile"')])
                if path in ("/v2", "/v2/"):
                    return self._send(200, b"{}")
                if not m:
                    return self._send(404, b'{"errors":[{"code":"NAME_UNKNOWN"}]}')
                repo, kind, ref = m.groups()
                if kind == "manifests":
                    body = reg.manifests.get((repo, ref))
                    if body is None:
                        return self._send(404, b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}')
                    return self._send(200, body, MT_MANIFEST,
                                      [("Docker-Content-Digest", ib.sha256(body))])
                blob = reg.blobs.get(ref)
                if blob is None:
                    return self._send(404, b'{"errors":[{"code":"BLOB_UNKNOWN"}]}')
                if isinstance(blob, tuple):  # ("redirect", url)
                    return self._send(307, b"", extra=[("Location", blob[1])])
                if blob != "endless":
                    return self._send(200, blob, "application/octet-stream")
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(1 << 40))
                self.end_headers()
                chunk = b"\0" * (1 << 20)
                try:
                    while reg.streamed < STREAM_CAP:
                        self.wfile.write(chunk)
                        with reg.lock:
                            reg.streamed += len(chunk)
                except OSError:
                    pass
                self.close_connection = True

            do_HEAD = do_GET

        self.server = _Server((self.address, self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self):
        if self.server:
            self.server.shutdown()
            self.server.server_close()


@pytest.fixture(scope="module")
def coved():
    with serve("--image-store-max-bytes", str(BUDGET), admin_keys=(ADMIN,)) as d:
        yield d


@pytest.fixture
def hostile():
    reg = HostileRegistry().start()
    try:
        yield reg
    finally:
        reg.stop()


def small_image(tag_bytes=b""):
    t = ib.Tar()
    t.file("hello", b"hello " + tag_bytes + secrets.token_hex(8).encode() + b"\n")
    return ib.single_layer_image(t.bytes())


# ---- F1: a layer blob's download is bounded by the store's room ------------------------------

def test_a_layer_declared_larger_than_the_store_is_refused_before_download(coved, hostile):
    """The manifest names a layer of 1 TiB and the registry streams zeros for ever. Before the
    fix the pull downloaded it into STATE/images/tmp until the disk filled (only the sha256
    check at the very end would have stopped it): a hostile registry filled coved's disk. Now
    a blob larger than what the store may still take is refused with 507 IMAGE::TOO_LARGE
    before a byte of it is fetched."""
    img = small_image()
    huge = "sha256:" + secrets.token_hex(32)
    manifest = json.loads(img.manifest_blob)
    manifest["layers"].append({"mediaType": ib.MT_LAYER["gzip"], "digest": huge,
                               "size": 1 << 40})
    body = json.dumps(manifest).encode()
    hostile.add("evil/huge", "v1", img, manifest=body)
    hostile.blobs[huge] = "endless"
    status, out, _ = coved.request("POST", "/v1/images", {"uri": hostile.ref("evil/huge:v1")},
                                   timeout=300)
    assert status in (413, 507) and out["code"] == "IMAGE::TOO_LARGE", (status, out)
    assert hostile.streamed < 2 * BUDGET, hostile.streamed
    assert coved.health()


# ---- F2: concurrent pulls of one reference with different passwords --------------------------

def _pull(coved, uri, auth, out, i):
    out[i] = coved.request("POST", "/v1/images", {"uri": uri, "auth": auth}, timeout=120)[:2]


def test_a_pull_with_a_wrong_password_shares_nothing_with_a_right_one(coved, hostile):
    """Pulls were shared by reference and user name alone: a client that knew only the user
    name joined a legitimate pull under way and got the private image (200), and a client
    with a wrong password that started first made the legitimate one that joined it fail
    (403). The key now carries a digest of the password too."""
    user, password = "alice", "right-" + secrets.token_hex(8)
    hostile.auth = (user, password)
    hostile.delay = 1.5
    right = {"username": user, "password": password}
    wrong = {"username": user, "password": "wrong-" + secrets.token_hex(8)}

    # A right pull under way; a wrong one joins it.
    img = small_image(b"a")
    hostile.add("private/a", "v1", img)
    out = [None, None]
    t1 = threading.Thread(target=_pull, args=(coved, hostile.ref("private/a:v1"), right, out, 0))
    t2 = threading.Thread(target=_pull, args=(coved, hostile.ref("private/a:v1"), wrong, out, 1))
    t1.start()
    time.sleep(0.5)
    t2.start()
    t1.join()
    t2.join()
    assert out[0][0] == 200, out[0]
    assert out[1][0] == 403 and out[1][1]["code"] == "IMAGE::UNAUTHORIZED", out[1]

    # A wrong pull under way; a right one joins it.
    img = small_image(b"b")
    hostile.add("private/b", "v1", img)
    out = [None, None]
    t1 = threading.Thread(target=_pull, args=(coved, hostile.ref("private/b:v1"), wrong, out, 0))
    t2 = threading.Thread(target=_pull, args=(coved, hostile.ref("private/b:v1"), right, out, 1))
    t1.start()
    time.sleep(0.5)
    t2.start()
    t1.join()
    t2.join()
    assert out[0][0] == 403, out[0]
    assert out[1][0] == 200, out[1]
    assert password not in json.dumps(out)
    assert password not in coved.log()


# ---- F3: etc/resolv.conf a FIFO in an image --------------------------------------------------

@pytest.mark.static_agent
def test_a_fifo_at_etc_resolv_conf_does_not_hang_the_set_up(coved, hostile):
    """The set-up child opened etc/resolv.conf for writing (O_NOFOLLOW, but no O_NONBLOCK):
    a FIFO there blocked it until the start timeout, so no sandbox of that image ever
    started. plain_paths now makes etc/resolv.conf a regular file of the new root first."""
    t = ib.Tar()
    t.dir("etc")
    info = tarfile.TarInfo("etc/resolv.conf")
    info.type, info.mode, info.mtime = tarfile.FIFOTYPE, 0o644, ib.MTIME
    t.raw(info, None)
    img = ib.single_layer_image(t.bytes())
    hostile.add("evil/fifo", "v1", img)
    status, body, _ = coved.request("POST", "/v1/sandboxes", {
        "image": {"uri": hostile.ref("evil/fifo:v1")}, "entrypoint": SLEEP,
        "resourceLimits": {"cpu": "1", "memory": "256Mi"}}, timeout=300)
    assert status == 202, (status, body)
    sid = body["id"]
    try:
        deadline = time.monotonic() + 25
        state = None
        while time.monotonic() < deadline:
            state = coved.get(sid)["status"]
            if state["state"] != "Pending":
                break
            time.sleep(0.2)
        assert state["state"] == "Running", state
        assert "nameserver" in coved.sh(sid, "cat /etc/resolv.conf")
    finally:
        coved.delete(sid)


# ---- F4: an import whose stand-in id is a real image's manifest digest ----------------------

def test_an_import_cannot_take_the_id_of_an_image_pulled_later(coved, hostile):
    """A `docker save` archive's image is named by the sha256 of its config file. An admin
    importing an archive of unknown origin imported one whose "config" is byte for byte the manifest of a registry image it
    wants to poison (manifests are public), with layers of its own: the store then held an
    image of that manifest's digest with the attacker's layers, and the later pull of the
    real image found the id taken and only added its reference to it: every sandbox made
    from the real reference ran the attacker's files."""
    import types
    real = small_image(b"real")
    hostile.add("team/real", "v1", real)
    evil_tar = ib.Tar()
    evil_tar.file("hello", b"POISONED\n")
    evil = ib.Layer(evil_tar.bytes(), "gzip")
    fake = types.SimpleNamespace(config_blob=real.manifest_blob, config_digest=real.digest,
                                 layers=[real.layers[0], evil])
    archive = ib.docker_save_archive(fake, ["evil/trojan:v1"])
    status, body, _ = coved.request("POST", "/v1/images/import", raw=archive,
                                    headers={**coved.headers(ADMIN),
                                             "Content-Type": "application/x-tar"},
                                    timeout=300)
    imported = (status, body)
    status, out, _ = coved.request("POST", "/v1/images", {"uri": hostile.ref("team/real:v1")},
                                   timeout=300)
    if status == 200:
        assert [l["digest"] for l in out["layers"]] == [l.digest for l in real.layers], (
            "the pulled reference names the imported trojan's layers", imported, out)
    else:
        # Refusing the pull of an id the store holds with other layers is fine too.
        assert out["code"].startswith("IMAGE::") and status != 500, (status, out)
    assert coved.health()


# ---- F5: prune while an import installs its layers -------------------------------------------

def test_a_prune_during_an_import_keeps_the_layers_it_installed(coved, hostile):
    """collect_layers (prune, an image's removal, the end of every pull) kept its hands off while a pull was
    under way, but not while an import was: a layer the import had installed and no image
    used yet was removed under it, and the imported image named a layer the store no longer
    had (no sandbox of it could start)."""
    import os
    small = ib.Tar()
    small.file("first", b"first layer " + secrets.token_hex(8).encode())
    many = ib.Tar()
    for i in range(30000):
        many.file(f"d{i // 1000}/f{i}", b"")
    layers = [ib.Layer(small.bytes(), None), ib.Layer(many.bytes(), None)]
    img = ib.Image(layers, ib.image_config(layers, env=["PATH=/bin"]))
    archive = ib.docker_save_archive(img, ["review/prune-race:v1"])
    result = {}

    def run_import():
        result["r"] = coved.request("POST", "/v1/images/import", raw=archive,
                                    headers={**coved.headers(ADMIN),
                                             "Content-Type": "application/x-tar"},
                                    timeout=300)[:2]

    t = threading.Thread(target=run_import)
    t.start()
    # Every pull's end collects unused layers (as a prune does, without removing images):
    # failed pulls, one after another, while the import runs.
    while t.is_alive():
        coved.request("POST", "/v1/images", {"uri": hostile.ref("nothing/here:v1")}, timeout=60)
        time.sleep(0.02)
    t.join()
    status, body = result["r"]
    assert status == 200, (status, body)
    first = layers[0].diff_id.split(":", 1)[1]
    path = os.path.join(coved.state_dir, "images", "layers", "sha256-" + first)
    assert os.path.isdir(path), "the imported image's first layer was pruned during the import"
    coved.ok("DELETE", f"/v1/images/{body['items'][0]['id']}", expect=(204,),
             headers=coved.headers(ADMIN))


# ---- regression: credentials never follow a blob redirect elsewhere -------------------------

def test_blob_redirects_carry_no_credentials_and_no_other_schemes(coved):
    """A registry with Basic auth redirects its blobs to another host:port (a "storage" of
    the attacker's): the blob is fetched there without the Authorization header. A redirect
    to file:// or gopher:// fails the pull cleanly (502), reading nothing."""
    reg = HostileRegistry("127.77.3.11").start()
    storage = HostileRegistry("127.77.3.12").start()
    try:
        user, password = "bob", "secret-" + secrets.token_hex(8)
        reg.auth = (user, password)
        img = small_image(b"redirected")
        reg.add("team/redir", "v1", img)
        for l in img.layers:
            storage.blobs[l.digest] = l.blob
            reg.blobs[l.digest] = ("redirect", f"http://{storage.host}/v2/team/redir/blobs/"
                                               f"{l.digest}")
        auth = {"username": user, "password": password}
        status, out, _ = coved.request("POST", "/v1/images", {"uri": reg.ref("team/redir:v1"),
                                                              "auth": auth}, timeout=120)
        assert status == 200, (status, out)
        assert storage.seen and all(a is None for _, a in storage.seen), storage.seen
        for scheme_url in ("file:///etc/passwd", "gopher://127.77.3.12:70/_x"):
            img = small_image(scheme_url.encode())
            reg.add("team/scheme", "v1", img)
            reg.blobs[img.layers[-1].digest] = ("redirect", scheme_url)
            status, out, _ = coved.request("POST", "/v1/images", {
                "uri": reg.ref("team/scheme:v1"), "auth": auth}, timeout=120)
            assert status == 502 and out["code"] == "IMAGE::REGISTRY_ERROR", (status, out)
            assert "root:" not in json.dumps(out)
        assert password not in coved.log()
    finally:
        reg.stop()
        storage.stop()


# ---- a private image pulled by one API key does not serve every other -------------------------

@pytest.mark.static_agent
def test_a_private_image_is_not_served_to_another_tenant_without_credentials(hostile):
    """An image pulled with one key's registry credentials is that key's: another key's create
    asks the registry (with its own credentials, or none: refused), and gets it once the
    registry let it; the first key starts from it without credentials."""
    with serve(api_keys=("tenant-a-key", "tenant-b-key")) as d:
        user, password = "carol", "secret-" + secrets.token_hex(8)
        hostile.auth = (user, password)
        t = ib.Tar()
        t.file("private", b"tenant a's secret\n")
        img = ib.single_layer_image(t.bytes())
        hostile.add("private/app", "v1", img)
        uri = hostile.ref("private/app:v1")
        status, out, _ = d.request("POST", "/v1/images", {
            "uri": uri, "auth": {"username": user, "password": password}},
            headers=d.headers("tenant-a-key"), timeout=120)
        assert status == 200, (status, out)
        status, out, _ = d.request("POST", "/v1/sandboxes", {
            "image": {"uri": uri}, "entrypoint": SLEEP,
            "resourceLimits": {"cpu": "1", "memory": "256Mi"}},
            headers=d.headers("tenant-b-key"), timeout=120)
        if status == 202:
            d.request("DELETE", f"/v1/sandboxes/{out['id']}", headers=d.headers("tenant-b-key"))
        assert (status, out.get("code")) == (403, "IMAGE::UNAUTHORIZED"), (status, out)
        # tenant a itself needs no credentials again
        body = {"image": {"uri": uri}, "entrypoint": SLEEP,
                "resourceLimits": {"cpu": "1", "memory": "256Mi"}}
        status, out, _ = d.request("POST", "/v1/sandboxes", body,
                                   headers=d.headers("tenant-a-key"), timeout=120)
        assert status == 202, (status, out)
        d.request("DELETE", f"/v1/sandboxes/{out['id']}", headers=d.headers("tenant-a-key"))
        # tenant b with the registry's credentials: it may, from then on
        body["image"]["auth"] = {"username": user, "password": password}
        status, out, _ = d.request("POST", "/v1/sandboxes", body,
                                   headers=d.headers("tenant-b-key"), timeout=120)
        assert status == 202, (status, out)
        d.request("DELETE", f"/v1/sandboxes/{out['id']}", headers=d.headers("tenant-b-key"))
        del body["image"]["auth"]
        status, out, _ = d.request("POST", "/v1/sandboxes", body,
                                   headers=d.headers("tenant-b-key"), timeout=120)
        assert status == 202, (status, out)
        d.request("DELETE", f"/v1/sandboxes/{out['id']}", headers=d.headers("tenant-b-key"))
