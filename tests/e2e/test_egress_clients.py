"""The clients people run inside sandboxes, through the egress proxy (issue 10): `git clone`
over HTTPS (a repository served by the loopback test server, git's "dumb" HTTP protocol),
`npm install` from a registry there, Python `httpx`. Each is allowed by name, trusts the test
CA the way its users point it at a private CA, and is refused for a name not allowed."""
import base64
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import egress_world  # noqa: E402
from egress_world import coved  # noqa: E402,F401 (the fixture)
from egress_world import HTTPS_PORT, allow  # noqa: E402

pytestmark = egress_world.needs_dnsmasq

BASE = f"https://allowed.test:{HTTPS_PORT}"


def npm_package():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for name, text in {"package/package.json": json.dumps(
                {"name": "coveprobe-js", "version": "1.0.0", "main": "index.js"}),
                "package/index.js": "module.exports = 'installed through the egress allowlist';\n"
                }.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    tgz = buf.getvalue()
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(tgz).digest()).decode()
    meta = {"name": "coveprobe-js", "dist-tags": {"latest": "1.0.0"}, "versions": {"1.0.0": {
        "name": "coveprobe-js", "version": "1.0.0", "main": "index.js",
        "dist": {"tarball": f"{BASE}/coveprobe-js/-/coveprobe-js-1.0.0.tgz",
                 "integrity": integrity, "shasum": hashlib.sha1(tgz).hexdigest()}}}}
    return json.dumps(meta).encode(), tgz


@pytest.fixture(scope="module")
def world():
    with egress_world.running_world() as w:
        repo = os.path.join(w.dir, "static", "repo.git")
        work = os.path.join(w.dir, "work")
        env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                   GIT_COMMITTER_EMAIL="t@t", HOME=w.dir)
        subprocess.run(["git", "init", "-q", "-b", "main", work], check=True, env=env)
        with open(os.path.join(work, "README"), "w") as f:
            f.write("cloned through the egress allowlist\n")
        subprocess.run(["git", "-C", work, "add", "README"], check=True, env=env)
        subprocess.run(["git", "-C", work, "commit", "-q", "-m", "one"], check=True, env=env)
        subprocess.run(["git", "clone", "-q", "--bare", work, repo], check=True, env=env)
        subprocess.run(["git", "-C", repo, "update-server-info"], check=True, env=env)
        w.files["static"] = ("/static/", os.path.join(w.dir, "static"))
        meta, tgz = npm_package()
        w.files["/coveprobe-js"] = (meta, "application/json")
        w.files["/coveprobe-js/-/coveprobe-js-1.0.0.tgz"] = (tgz, "application/octet-stream")
        yield w


@pytest.fixture
def sid(coved, world):
    s = coved.create(networkPolicy=allow("allowed.test", "127.77.0.10"),
                     limits={"cpu": "1", "memory": "1Gi"})
    with open(world.ca) as f:
        coved.sh(s, f"cat > /tmp/test-ca.pem <<'EOF'\n{f.read()}EOF")
    yield s
    coved.delete(s)


def test_git_clone(coved, sid):
    out = coved.sh(sid, f"GIT_SSL_CAINFO=/tmp/test-ca.pem git clone -q {BASE}/static/repo.git"
                        " /tmp/repo && cat /tmp/repo/README")
    assert out == "cloned through the egress allowlist\n"
    r = coved.exec(sid, "GIT_SSL_CAINFO=/tmp/test-ca.pem git clone -q "
                        f"https://other.test:{HTTPS_PORT}/static/repo.git /tmp/other")
    assert r.exit_code != 0 and "other.test" in r.stderr, r.stderr


@pytest.mark.skipif(not os.path.exists("/usr/bin/npm"), reason="needs npm")
def test_npm_install(coved, sid):
    out = coved.sh(sid, f"mkdir -p /tmp/app && cd /tmp/app && npm install --no-audit --no-fund"
                        f" --registry {BASE}/ --cafile /tmp/test-ca.pem coveprobe-js >/dev/null"
                        " && node -e \"console.log(require('coveprobe-js'))\"", http_timeout=300)
    assert out.strip() == "installed through the egress allowlist"


def test_httpx(coved, sid):
    out = coved.sh(sid, "python3 -c \"import httpx; r = httpx.get('%s/httpx', "
                        "verify='/tmp/test-ca.pem'); print(r.status_code, r.json()['server'])\""
                   % BASE)
    assert out.split() == ["200", "127.77.0.10"]
    r = coved.exec(sid, "python3 -c \"import httpx; httpx.get('https://denied.test:%d/', "
                        "verify='/tmp/test-ca.pem')\"" % HTTPS_PORT)
    assert r.exit_code != 0
