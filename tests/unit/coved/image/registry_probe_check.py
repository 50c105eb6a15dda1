#!/usr/bin/env python3
"""Drives registry_probe (the registry client, src/coved/image/registry.c) against real
registries on 127.77.1.x: Debian's docker-registry over plain HTTP, HTTPS, basic auth
(htpasswd) and token auth (a small token server here, signing ES256 JWTs), and a hostile server
that cuts blobs short, corrupts them, sends too much, or redirects them to another host.
Not part of the unit suite (it needs docker-registry, skopeo and python3-cryptography):

    python3 tests/unit/coved/image/registry_probe_check.py build/tests/unit/registry_probe

Every process it starts is stopped at the end; its files live in one temporary directory."""
import base64, gzip, hashlib, io, json, os, shutil, signal, subprocess, sys, tarfile, tempfile
import threading, time, urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

PROBE = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/tests/unit/registry_probe")
WORK = tempfile.mkdtemp(prefix="cove-registry-check-")
PLAIN, BASIC, TOKEN, TLS = "127.77.1.10:5000", "127.77.1.11:5000", "127.77.1.12:5000", "127.77.1.17:5443"
TOKEN_SERVER, HOSTILE, STORAGE = ("127.77.1.13", 5001), ("127.77.1.14", 5000), ("127.77.1.15", 5000)
DOWN = "127.77.1.16:5000"
procs, servers, failures = [], [], []
# this script's own requests never go through a proxy (the probe's may be tested with one set)
urlopen = urllib.request.build_opener(urllib.request.ProxyHandler({})).open


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def blob(out, data):
    d = hashlib.sha256(data).hexdigest()
    with open(f"{out}/blobs/sha256/{d}", "wb") as f:
        f.write(data)
    return "sha256:" + d, len(data)


def make_layout(out):
    os.makedirs(out + "/blobs/sha256")
    layers = []
    for files in ({"bin/hello": b"#!/bin/sh\necho hi\n"}, {"big": os.urandom(3 << 20)}):
        b = io.BytesIO()
        with tarfile.open(fileobj=b, mode="w") as t:
            for name, content in files.items():
                ti = tarfile.TarInfo(name)
                ti.size = len(content)
                t.addfile(ti, io.BytesIO(content))
        layers.append((b.getvalue(), blob(out, gzip.compress(b.getvalue(), mtime=0))))
    cfg = {"architecture": "amd64", "os": "linux",
           "config": {"Env": ["PATH=/bin", "A=b"], "Cmd": ["/bin/hello"], "WorkingDir": "/w"},
           "rootfs": {"type": "layers",
                      "diff_ids": ["sha256:" + hashlib.sha256(raw).hexdigest() for raw, _ in layers]}}
    c = blob(out, json.dumps(cfg).encode())
    man = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
           "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": c[0], "size": c[1]},
           "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": d, "size": n}
                      for _, (d, n) in layers]}
    man_bytes = json.dumps(man).encode()
    m = blob(out, man_bytes)
    with open(out + "/index.json", "w") as f:
        json.dump({"schemaVersion": 2, "manifests": [{
            "mediaType": man["mediaType"], "digest": m[0], "size": m[1],
            "annotations": {"org.opencontainers.image.ref.name": "v1"}}]}, f)
    with open(out + "/oci-layout", "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    return man, man_bytes, m[0]


def start(cmd, log):
    p = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=WORK)
    procs.append(p)
    return p


def wait_http(url, tls=False):
    import ssl
    ctx = ssl._create_unverified_context() if tls else None
    for _ in range(100):
        try:
            (urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx)).open(url, timeout=1))
            return
        except urllib.error.HTTPError:
            return
        except Exception:
            time.sleep(0.05)
    raise RuntimeError("no server at " + url)


def registry(addr, name, extra=""):
    conf = f"{WORK}/{name}.yml"
    with open(conf, "w") as f:
        f.write(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {WORK}/data\n"
                f"http:\n  addr: {addr}\n{extra}log:\n  level: warn\n")
    start(["docker-registry", "serve", conf], f"{WORK}/{name}.log")
    wait_http(f"http{'s' if 'tls' in extra else ''}://{addr}/v2/", tls="tls" in extra)


def probe(*args):
    r = subprocess.run([PROBE, *args], capture_output=True, text=True, timeout=120)
    return r.returncode, (json.loads(r.stdout) if r.returncode == 0 else None), r.stderr


def serve(addr, handler):
    s = ThreadingHTTPServer(addr, handler)
    threading.Thread(target=s.serve_forever, daemon=True).start()
    servers.append(s)


def token_handler(key, cert_der):
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
    b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()

    class H(BaseHTTPRequestHandler):
        issued = []

        def do_GET(self):
            q = parse_qs(urlparse(self.path).query)
            user, a = None, self.headers.get("Authorization", "")
            if a.startswith("Basic "):
                u, _, p = base64.b64decode(a[6:]).decode().partition(":")
                if (u, p) != ("alice", "s3cret"):
                    self.send_response(401)
                    self.end_headers()
                    self.wfile.write(b'{"details":"bad credentials"}')
                    return
                user = u
            scope = q.get("scope", [""])[0]
            access = []
            if user and scope.startswith("repository:"):
                access = [{"type": "repository", "name": scope.split(":")[1], "actions": ["pull"]}]
            now = int(time.time())
            hdr = {"typ": "JWT", "alg": "ES256", "x5c": [base64.b64encode(cert_der).decode()]}
            claims = {"iss": "check", "sub": user or "", "aud": q.get("service", [""])[0],
                      "exp": now + 300, "nbf": now - 10, "iat": now, "jti": os.urandom(8).hex(),
                      "access": access}
            si = (b64(json.dumps(hdr).encode()) + "." + b64(json.dumps(claims).encode())).encode()
            r, s = decode_dss_signature(key.sign(si, ec.ECDSA(hashes.SHA256())))
            token = si.decode() + "." + b64(r.to_bytes(32, "big") + s.to_bytes(32, "big"))
            H.issued.append(user)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps({"token": token}).encode())

        def log_message(self, *a):
            pass
    return H


def hostile_handler(man_bytes, blobs, big_layer):
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        mode = "ok"
        seen = []

        def send(self, code, body=b"", hdrs={}):
            self.send_response(code)
            for k, v in hdrs.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            H.seen.append((self.headers.get("Host"), self.path, self.headers.get("Authorization")))
            if self.path.startswith("/token"):
                return self.send(200, b'{"access_token":"tok123"}')
            if self.path.startswith("/storage/"):
                return self.send(200, blobs[self.path[9:]])
            if self.headers.get("Authorization") != "Bearer tok123":
                return self.send(401, b'{"errors":[{"code":"UNAUTHORIZED","message":"no"}]}', {
                    "WWW-Authenticate": f'Bearer realm="http://{HOSTILE[0]}:{HOSTILE[1]}/token",service="h"'})
            if "/manifests/" in self.path:
                return self.send(200, man_bytes, {"Content-Type": "application/vnd.oci.image.manifest.v1+json"})
            digest = self.path.rsplit("/", 1)[1]
            data = blobs[digest]
            if digest == big_layer and H.mode == "cut":
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[: len(data) // 2])
                self.close_connection = True
                return
            if digest == big_layer and H.mode == "corrupt":
                return self.send(200, data[:-1] + bytes([data[-1] ^ 1]))
            if digest == big_layer and H.mode == "long":
                self.send_response(200)
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data + b"extra")
                self.close_connection = True
                return
            if H.mode == "redirect":
                return self.send(307, b"", {"Location": f"http://{STORAGE[0]}:{STORAGE[1]}/storage/{digest}"})
            return self.send(200, data)

        def log_message(self, *a):
            pass
    return H


def main():
    man, man_bytes, man_digest = make_layout(f"{WORK}/oci")
    blobs = {d["digest"]: open(f"{WORK}/oci/blobs/sha256/{d['digest'][7:]}", "rb").read()
             for d in [man["config"]] + man["layers"]}
    registry(PLAIN, "plain")
    subprocess.run(["skopeo", "copy", "-q", "--dest-tls-verify=false", f"oci:{WORK}/oci:v1",
                    f"docker://{PLAIN}/t/img:v1"], check=True)
    # an index with this platform and another, and one without it
    for tag, arch in (("idx", "amd64"), ("noplat", "s390x")):
        index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [
            {"mediaType": man["mediaType"], "digest": man_digest, "size": len(man_bytes),
             "platform": {"architecture": "arm64", "os": "linux"}},
            {"mediaType": man["mediaType"], "digest": man_digest, "size": len(man_bytes),
             "platform": {"architecture": arch, "os": "linux"}}]}
        urlopen(urllib.request.Request(
            f"http://{PLAIN}/v2/t/img/manifests/{tag}", data=json.dumps(index).encode(), method="PUT",
            headers={"Content-Type": index["mediaType"]}))

    out = f"{WORK}/pull"
    rc, got, err = probe(f"{PLAIN}/t/img:v1", out)
    check(rc == 0 and got["digest"] == man_digest, "plain HTTP pull by tag (https tried first)")
    check(rc == 0 and sorted(os.listdir(out)) == sorted("sha256-" + d["digest"][7:] for d in man["layers"]),
          "the layers are in DIR")
    check(rc == 0 and all(open(f"{out}/sha256-{d[7:]}", "rb").read() == blobs[d] for d in blobs if d != man["config"]["digest"]),
          "the layers' bytes are the registry's")
    check(rc == 0 and got["imageConfig"]["cmd"] == ["/bin/hello"], "the config is read")
    rc, got, err = probe("--manifest-only", f"{PLAIN}/t/img@{man_digest}", out)
    check(rc == 0 and got["digest"] == man_digest, "pull by digest")
    rc, got, err = probe("--manifest-only", f"{PLAIN}/t/img:idx", out)
    check(rc == 0 and got["digest"] == man_digest and got["index"].startswith("sha256:"), "an index resolved to linux/amd64")
    rc, got, err = probe("--manifest-only", f"{PLAIN}/t/img:noplat", out)
    check(rc == 1 and err.startswith("400 IMAGE::UNSUPPORTED") and "linux/s390x" in err, "an index without the platform: 400")
    wrong = man_digest[:-1] + ("0" if man_digest[-1] != "0" else "1")
    rc, got, err = probe("--manifest-only", f"{PLAIN}/t/img@{wrong}", out)
    check(rc == 1 and err.startswith("404 IMAGE::NOT_FOUND"), "an unknown digest: 404")
    rc, got, err = probe(f"{PLAIN}/t/nope:v1", out)
    check(rc == 1 and err.startswith("404 IMAGE::NOT_FOUND"), "an unknown repository: 404")
    rc, got, err = probe(f"{DOWN}/t/img:v1", out)
    check(rc == 1 and err.startswith("502 IMAGE::REGISTRY_ERROR"), "an unreachable registry: 502")

    # HTTPS (loopback: not verified, as Docker treats 127.0.0.0/8)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key",
                    "-out", "tls.crt", "-days", "2", "-subj", "/CN=check"], cwd=WORK, check=True,
                   capture_output=True)
    registry(TLS, "tls", f"  tls:\n    certificate: {WORK}/tls.crt\n    key: {WORK}/tls.key\n")
    rc, got, err = probe(f"{TLS}/t/img:v1", out)
    check(rc == 0 and got["digest"] == man_digest, "HTTPS pull")

    # basic auth
    import crypt
    with open(f"{WORK}/htpasswd", "w") as f:
        f.write("alice:" + crypt.crypt("s3cret", crypt.mksalt(crypt.METHOD_BLOWFISH)) + "\n")
    registry(BASIC, "basic", f"auth:\n  htpasswd:\n    realm: r\n    path: {WORK}/htpasswd\n")
    rc, got, err = probe("--manifest-only", f"{BASIC}/t/img:v1", out)
    check(rc == 1 and err.startswith("403 IMAGE::UNAUTHORIZED"), "basic auth, anonymous: 403")
    rc, got, err = probe("--user", "alice", "--password", "nope", "--manifest-only", f"{BASIC}/t/img:v1", out)
    check(rc == 1 and err.startswith("403 IMAGE::UNAUTHORIZED") and "nope" not in err, "basic auth, bad password: 403")
    rc, got, err = probe("--user", "alice", "--password", "s3cret", f"{BASIC}/t/img:idx", out)
    check(rc == 0 and got["digest"] == man_digest, "basic auth pull")
    with open(f"{WORK}/auth.json", "w") as f:
        json.dump({"auths": {f"http://{BASIC}/": {"auth": base64.b64encode(b"alice:s3cret").decode()}}}, f)
    rc, got, err = probe("--auth-file", f"{WORK}/auth.json", "--manifest-only", f"{BASIC}/t/img:v1", out)
    check(rc == 0, "basic auth from an auth file")

    # mirrors: a dead one, then one that refuses (the pull's credentials are not sent to it)
    before = os.path.getsize(f"{WORK}/basic.log")
    rc, got, err = probe("--mirror", f"{PLAIN}={DOWN}", "--mirror", f"{PLAIN}={BASIC}", "--user", "alice",
                         "--password", "s3cret", f"{PLAIN}/t/img:v1", out)
    check(rc == 0, "mirrors that fail fall back to the registry")
    with open(f"{WORK}/basic.log") as f:
        f.seek(before)
        statuses = [line.split('" ')[1].split()[0] for line in f if '"GET /v2/' in line]
    check(statuses and set(statuses) == {"401"}, "the mirror got no credentials (only 401s)")
    rc, got, err = probe("--mirror", f"{BASIC}=http://{PLAIN}", "--manifest-only", f"{BASIC}/t/img:v1", out)
    check(rc == 0, "a mirror serves the manifest")

    # token auth
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", "token.key", "-out", "token.crt", "-days", "2", "-subj", "/CN=token"],
                   cwd=WORK, check=True, capture_output=True)
    key = serialization.load_pem_private_key(open(f"{WORK}/token.key", "rb").read(), None)
    der = x509.load_pem_x509_certificate(open(f"{WORK}/token.crt", "rb").read()).public_bytes(serialization.Encoding.DER)
    th = token_handler(key, der)
    serve(TOKEN_SERVER, th)
    registry(TOKEN, "token", f"auth:\n  token:\n    realm: http://{TOKEN_SERVER[0]}:{TOKEN_SERVER[1]}/token\n"
             f"    service: check\n    issuer: check\n    rootcertbundle: {WORK}/token.crt\n")
    rc, got, err = probe("--manifest-only", f"{TOKEN}/t/img:v1", out)
    check(rc == 1 and err.startswith("403 IMAGE::UNAUTHORIZED"), "token auth, anonymous: 403")
    rc, got, err = probe("--user", "alice", "--password", "bad", "--manifest-only", f"{TOKEN}/t/img:v1", out)
    check(rc == 1 and err.startswith("403 IMAGE::UNAUTHORIZED") and "token server" in err, "token auth, bad password: 403")
    th.issued.clear()
    rc, got, err = probe("--user", "alice", "--password", "s3cret", f"{TOKEN}/t/img:idx", out)
    check(rc == 0 and got["digest"] == man_digest, "token auth pull (index, manifest, config, layers)")
    check(th.issued == ["alice"], "one token, reused for the manifests and blobs")

    # a hostile registry
    hh = hostile_handler(man_bytes, blobs, man["layers"][1]["digest"])
    serve(HOSTILE, hh)
    serve(STORAGE, hh)
    host = f"{HOSTILE[0]}:{HOSTILE[1]}"
    for mode, expect in (("cut", "502 IMAGE::REGISTRY_ERROR"), ("corrupt", "502 IMAGE::DIGEST_MISMATCH"),
                         ("long", "502 IMAGE::DIGEST_MISMATCH")):
        hh.mode = mode
        shutil.rmtree(out, ignore_errors=True)
        rc, got, err = probe("--timeout", "5", f"{host}/t/img:v1", out)
        check(rc == 1 and err.startswith(expect), f"a blob {mode}: {expect}")
    hh.mode = "redirect"
    hh.seen.clear()
    rc, got, err = probe(f"{host}/t/img:v1", out)
    storage = [s for s in hh.seen if s[1].startswith("/storage/")]
    check(rc == 0 and len(storage) == 3, "blobs redirected to another host")
    check(all(s[2] is None for s in storage), "no Authorization header to the other host")
    print(f"{len(failures)} failed" if failures else "all passed")


try:
    main()
finally:
    for s in servers:
        s.shutdown()
    for p in procs:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=10)
    shutil.rmtree(WORK, ignore_errors=True)
sys.exit(1 if failures else 0)
