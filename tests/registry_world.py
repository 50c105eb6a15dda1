"""OCI registries for the image tests, all on loopback (127.77.2.x): Debian's `docker-registry`
with a generated config (no auth, htpasswd basic auth, or token auth against a token server of
the test's own that signs RS256 JWTs), behind a small HTTP proxy of the test's that records
every request and can cut a blob download short or slow it down. Pushes (skopeo) go to the
registry itself, pulls (coved) through the proxy. Everything started is stopped and every
file removed when the registry stops, pass or fail.

    with running_registry(auth="token") as reg:
        reg.push(layout, "v1", "team/busybox:v1")
        uri = reg.ref("team/busybox:v1")       # "127.77.2.1:PORT/team/busybox:v1"
        reg.proxy.count("GET", "/blobs/")
"""
import base64
import contextlib
import datetime
import http.client
import http.server
import json
import os
import secrets
import shutil
import socket
import socketserver
import subprocess
import tempfile
import threading
import time
import urllib.parse
import warnings

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import crypt  # bcrypt for the htpasswd file (docker-registry takes nothing else)

import image_build

REGISTRY_BIN = shutil.which("docker-registry") or "/usr/bin/docker-registry"
DEFAULT_ADDRESS = "127.77.2.1"
SERVICE = "cove-test-registry"
ISSUER = "cove-test-token-issuer"
USER, PASSWORD = "cove", "cove-registry-secret"  # may push and pull everything
READER, READER_PASSWORD = "reader", "reader-secret"  # may pull the "team/" repositories only


def free_port(address):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def closed_port(address):
    """A port on address where nothing listens (an unreachable registry)."""
    return free_port(address)


def basic(user, password):
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False


# ---- the token server ------------------------------------------------------------------------

def _signing_cert(dir_):
    """An RSA key and a self-signed certificate (the registry's rootcertbundle)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cove test token signer")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    pem = os.path.join(dir_, "token-signer.pem")
    with open(pem, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    der = cert.public_bytes(serialization.Encoding.DER)
    return pem, key_pem, base64.b64encode(der).decode()


class TokenServer:
    """The Bearer realm of a token-auth registry: GET /token?service=..&scope=.. with Basic
    credentials (or none: anonymous) answers a JWT granting, of what each scope asks, only the
    actions the user has on that repository. A wrong password is a 401."""

    def __init__(self, address, dir_, users):
        self.address = address
        self.port = free_port(address)
        self.users = users  # name -> (password, {repo prefix ("" = all): set of actions})
        self.cert_pem, self.key_pem, self.x5c = _signing_cert(dir_)
        self.requests = []  # (account, scopes asked, access granted, status)
        self.lock = threading.Lock()
        self.server = None

    @property
    def realm(self):
        return f"http://{self.address}:{self.port}/token"

    def grant(self, user, scopes):
        rights = self.users.get(user or "", (None, {}))[1]
        access = []
        for scope in scopes:
            parts = scope.split(":")
            if len(parts) < 3 or parts[0] != "repository":
                continue
            name, asked = ":".join(parts[1:-1]), parts[-1].split(",")
            allowed = set()
            for prefix, actions in rights.items():
                if name.startswith(prefix):
                    allowed |= set(actions)
            given = [a for a in asked if a in allowed or ("*" in allowed and a)]
            if given:
                access.append({"type": "repository", "name": name, "actions": given})
        return access

    def token(self, user, access):
        import jwt

        now = int(time.time())
        claims = {"iss": ISSUER, "sub": user or "", "aud": SERVICE, "exp": now + 300,
                  "nbf": now - 10, "iat": now, "jti": secrets.token_hex(16), "access": access}
        return jwt.encode(claims, self.key_pem, algorithm="RS256",
                          headers={"typ": "JWT", "x5c": [self.x5c]})

    def start(self):
        ts = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _send(self, status, body, extra=()):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in extra:
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                url = urllib.parse.urlsplit(self.path)
                q = urllib.parse.parse_qs(url.query)
                scopes = []
                for s in q.get("scope", []):
                    scopes += s.split(" ")
                user = None
                auth = self.headers.get("Authorization", "")
                status = 200
                if auth.startswith("Basic "):
                    try:
                        u, _, p = base64.b64decode(auth[6:]).decode().partition(":")
                    except (ValueError, UnicodeDecodeError):
                        u, p = "", None
                    known = ts.users.get(u)
                    if not u or known is None or known[0] != p:
                        status = 401
                    else:
                        user = u
                if url.path != "/token" or q.get("service", [""])[0] != SERVICE:
                    status = 404 if status == 200 else status
                granted = ts.grant(user, scopes) if status == 200 else []
                with ts.lock:
                    ts.requests.append((user, scopes, granted, status))
                if status == 401:
                    self._send(401, {"errors": [{"code": "UNAUTHORIZED",
                                                 "message": "cove test token server: wrong "
                                                            "user name or password"}]},
                               [("WWW-Authenticate", 'Basic realm="cove-test-token"')])
                elif status != 200:
                    self._send(status, {"errors": [{"code": "NOT_FOUND", "message": "no"}]})
                else:
                    tok = ts.token(user, granted)
                    self._send(200, {"token": tok, "access_token": tok, "expires_in": 300,
                                     "issued_at": datetime.datetime.now(
                                         datetime.timezone.utc).isoformat()})

        self.server = _Server((self.address, self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self):
        if self.server:
            self.server.shutdown()
            self.server.server_close()


# ---- the proxy in front of the registry ------------------------------------------------------

HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade"}


class Proxy:
    """Forwards to the registry and records (method, path, status, bytes sent). Faults, for
    GETs of blobs only:
    - fail_blobs(times, after): the next `times` blob downloads send `after` bytes of the body
      (with the full Content-Length) and then the connection is cut;
    - slow_blobs(chunk, delay): blob bodies go out `chunk` bytes every `delay` s until
      release() (then at full speed);
    - fail_with(status, times): the next `times` blob GETs answer `status` (a 5xx)."""

    def __init__(self, address, backend):
        self.address = address
        self.port = free_port(address)
        self.backend = backend  # (host, port)
        self.lock = threading.Lock()
        self.log = []  # (method, path, status, bytes of body sent, complete)
        self.cut = [0, 0]  # times, after bytes
        self.error = [0, 500]
        self.slow = None  # (chunk, delay)
        self.released = threading.Event()
        self.server = None
        self.blob_started = threading.Event()  # set when a blob body starts going out

    def fail_blobs(self, times=1, after=4096):
        with self.lock:
            self.cut = [times, after]

    def fail_with(self, status=500, times=1):
        with self.lock:
            self.error = [times, status]

    def slow_blobs(self, chunk=1024, delay=0.1):
        self.released.clear()
        self.blob_started.clear()
        with self.lock:
            self.slow = (chunk, delay)

    def release(self):
        with self.lock:
            self.slow = None
        self.released.set()

    def clear(self):
        with self.lock:
            self.log.clear()

    def count(self, method, fragment, repo=None):
        """Requests of that method whose path contains fragment (and /v2/REPO/ if given)."""
        with self.lock:
            return sum(1 for m, p, *_ in self.log if m == method and fragment in p
                       and (repo is None or p.startswith(f"/v2/{repo}/")))

    def requests(self):
        with self.lock:
            return list(self.log)

    def start(self):
        px = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *a):
                pass

            def _forward(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                path = self.path.split("?")[0]
                is_blob = self.command == "GET" and "/blobs/sha256:" in path
                with px.lock:
                    if is_blob and px.error[0] > 0:
                        px.error[0] -= 1
                        status = px.error[1]
                        px.log.append((self.command, path, status, 0, True))
                        data = b'{"errors":[{"code":"UNKNOWN","message":"injected failure"}]}'
                        self.send_response(status)
                        self.send_header("Content-Type", "application/json")
                        self.send_header("Content-Length", str(len(data)))
                        self.end_headers()
                        self.wfile.write(data)
                        return
                    cut = None
                    if is_blob and px.cut[0] > 0:
                        px.cut[0] -= 1
                        cut = px.cut[1]
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
                conn = http.client.HTTPConnection(*px.backend, timeout=120)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                finally:
                    conn.close()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in HOP and k.lower() != "content-length":
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                sent, complete = 0, True
                if self.command != "HEAD":
                    if is_blob and resp.status == 200:
                        px.blob_started.set()
                    if cut is not None and resp.status == 200:
                        self.wfile.write(data[:cut])
                        self.wfile.flush()
                        sent, complete = min(cut, len(data)), False
                        self.close_connection = True
                        try:
                            self.connection.shutdown(socket.SHUT_RDWR)
                        except OSError:
                            pass
                    else:
                        while sent < len(data):
                            with px.lock:
                                slow = px.slow if is_blob else None
                            n = slow[0] if slow else len(data) - sent
                            try:
                                self.wfile.write(data[sent:sent + n])
                                self.wfile.flush()
                            except OSError:
                                complete = False
                                self.close_connection = True
                                break
                            sent += n
                            if slow:
                                px.released.wait(slow[1])
                with px.lock:
                    px.log.append((self.command, path, resp.status, sent, complete))

            do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

        self.server = _Server((self.address, self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self):
        self.release()
        if self.server:
            self.server.shutdown()
            self.server.server_close()


# ---- the registry ----------------------------------------------------------------------------

class Registry:
    """docker-registry serving STORAGE on ADDRESS:backend_port, the proxy on ADDRESS:port.
    auth: "none", "basic" (htpasswd, bcrypt) or "token" (the TokenServer).
    users: name -> (password, {repository prefix: actions}); by default USER may push and pull
    everything and READER pull the "team/" repositories."""

    def __init__(self, auth="none", address=DEFAULT_ADDRESS, users=None):
        assert auth in ("none", "basic", "token"), auth
        assert address.startswith("127.77.") and not address.startswith("127.77.0."), address
        self.auth = auth
        self.address = address
        self.users = users if users is not None else {
            USER: (PASSWORD, {"": {"pull", "push"}}),
            READER: (READER_PASSWORD, {"team/": {"pull"}})}
        self.dir = tempfile.mkdtemp(prefix="cove-registry-")
        self.backend_port = free_port(address)
        self.proc = None
        self.token_server = None
        self.proxy = None
        self.log_path = os.path.join(self.dir, "registry.log")

    # what clients use
    @property
    def host(self):
        """HOST:PORT of the proxy (what coved pulls from)."""
        return f"{self.address}:{self.proxy.port}"

    @property
    def backend(self):
        """HOST:PORT of docker-registry itself (what pushes go to)."""
        return f"{self.address}:{self.backend_port}"

    def ref(self, name):
        """"REPO:TAG" or "REPO@sha256:..." on this registry (through the proxy)."""
        return f"{self.host}/{name}"

    def creds(self):
        return None if self.auth == "none" else f"{USER}:{PASSWORD}"

    def _config(self):
        storage = os.path.join(self.dir, "storage")
        os.makedirs(storage)
        lines = ["version: 0.1",
                 "log:", "  level: info", "  formatter: text",
                 "  accesslog:", "    disabled: false",
                 "storage:", "  filesystem:", f"    rootdirectory: {storage}",
                 "  delete:", "    enabled: true",
                 "  maintenance:", "    uploadpurging:", "      enabled: false",
                 "http:", f"  addr: {self.address}:{self.backend_port}",
                 f"  secret: {secrets.token_hex(16)}",
                 "health:", "  storagedriver:", "    enabled: false"]
        if self.auth == "basic":
            htpasswd = os.path.join(self.dir, "htpasswd")
            with open(htpasswd, "w") as f:
                for user, (pw, _) in self.users.items():
                    if user:  # bcrypt at cost 4: docker-registry checks it on every request
                        salt = crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16)
                        f.write(f"{user}:{crypt.crypt(pw, salt)}\n")
            lines += ["auth:", "  htpasswd:", "    realm: cove-test-registry",
                      f"    path: {htpasswd}"]
        elif self.auth == "token":
            lines += ["auth:", "  token:", f"    realm: {self.token_server.realm}",
                      f"    service: {SERVICE}", f"    issuer: {ISSUER}",
                      f"    rootcertbundle: {self.token_server.cert_pem}"]
        path = os.path.join(self.dir, "config.yml")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        return path

    def start(self):
        if self.auth == "token":
            self.token_server = TokenServer(self.address, self.dir, self.users).start()
        config = self._config()
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen([REGISTRY_BIN, "serve", config], stdout=log,
                                         stderr=log, stdin=subprocess.DEVNULL)
        finally:
            log.close()
        deadline = time.time() + 20
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"docker-registry exited: {self.log()}")
            try:
                status, _, _ = self.get("/v2/", backend=True, auth=False)
                if status in (200, 401):
                    break
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError(f"docker-registry does not answer: {self.log()}")
            time.sleep(0.05)
        self.proxy = Proxy(self.address, (self.address, self.backend_port)).start()
        return self

    def stop(self):
        if self.proxy:
            self.proxy.stop()
        if self.token_server:
            self.token_server.stop()
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    # ---- pushing and looking ----

    def push(self, layout, tag, name, all_platforms=False):
        """Pushes oci:LAYOUT:TAG as NAME ("repo:tag") straight to docker-registry."""
        image_build.skopeo_push(layout, tag, f"{self.backend}/{name}", creds=self.creds(),
                                all_platforms=all_platforms)

    def push_image(self, img, name, workdir, all_platforms=None):
        """Writes img (an Image or an Index) into a fresh layout under workdir and pushes it."""
        layout = image_build.OciLayout(os.path.join(str(workdir), "layout-" +
                                                    secrets.token_hex(4)))
        layout.add(img, "push")
        self.push(layout, "push", name, all_platforms=isinstance(img, image_build.Index)
                  if all_platforms is None else all_platforms)
        return img

    def _bearer(self, path, user, password):
        """A token for the scope the registry's challenge on path names."""
        status, headers, _ = self.get(path, backend=True, auth=False)
        chal = headers.get("www-authenticate", "")
        params = dict(p.split("=", 1) for p in chal[len("Bearer "):].split(",") if "=" in p)
        params = {k: v.strip('"') for k, v in params.items()}
        q = urllib.parse.urlencode({"service": params.get("service", ""),
                                    "scope": params.get("scope", "")})
        url = urllib.parse.urlsplit(params["realm"])
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
        conn.request("GET", f"{url.path}?{q}", headers={"Authorization": basic(user, password)})
        resp = conn.getresponse()
        body = json.loads(resp.read() or b"{}")
        conn.close()
        return body.get("token")

    def get(self, path, backend=False, auth=True, accept=None, user=USER, password=PASSWORD):
        """GET path on the registry (or through the proxy): (status, headers, body)."""
        headers = {}
        if accept:
            headers["Accept"] = accept
        if auth and self.auth == "basic":
            headers["Authorization"] = basic(user, password)
        elif auth and self.auth == "token":
            headers["Authorization"] = "Bearer " + (self._bearer(path, user, password) or "")
        port = self.backend_port if backend else self.proxy.port
        conn = http.client.HTTPConnection(self.address, port, timeout=30)
        try:
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
            body = resp.read()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, body
        finally:
            conn.close()

    def manifest(self, name, reference, accept=None):
        accept = accept or ", ".join([image_build.MT_MANIFEST, image_build.MT_INDEX,
                                      "application/vnd.docker.distribution.manifest.v2+json",
                                      "application/vnd.docker.distribution.manifest.list.v2+json"])
        return self.get(f"/v2/{name}/manifests/{reference}", backend=True, accept=accept)

    def stored_blobs(self):
        """Digests of every blob the registry stores."""
        root = os.path.join(self.dir, "storage", "docker", "registry", "v2", "blobs", "sha256")
        out = []
        for dirpath, _, files in os.walk(root):
            if "data" in files:
                out.append("sha256:" + os.path.basename(dirpath))
        return out


@contextlib.contextmanager
def running_registry(auth="none", **kw):
    reg = Registry(auth=auth, **kw)
    try:
        yield reg.start()
    finally:
        reg.stop()


def auth_file(path, entries):
    """An auth.json: entries = {registry host: (user, password)}; written as "auth" (base64)."""
    with open(path, "w") as f:
        json.dump({"auths": {h: {"auth": base64.b64encode(f"{u}:{p}".encode()).decode()}
                             for h, (u, p) in entries.items()}}, f)
    os.chmod(path, 0o600)
    return str(path)
