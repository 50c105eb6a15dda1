"""`pip install` through the egress allowlist (issue 10): a package index served over HTTPS
on loopback (a test CA the sandbox is told to trust, as a private index's users do), reached
by name only when the policy allows it. pip installs into the user site: the sandbox's /usr is
read-only, and PEP 668 does not get in the way."""
import base64
import hashlib
import io
import os
import sys
import zipfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import egress_world  # noqa: E402
from egress_world import coved  # noqa: E402,F401 (the fixture)
from egress_world import HTTPS_PORT, allow  # noqa: E402

pytestmark = egress_world.needs_dnsmasq

WHEEL = "coveprobe-1.0-py3-none-any.whl"


def build_wheel():
    files = {
        "coveprobe/__init__.py": b"ANSWER = 'installed through the egress allowlist'\n",
        "coveprobe-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: coveprobe\n"
                                            b"Version: 1.0\n",
        "coveprobe-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: cove-test\n"
                                         b"Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.append(f"{name},sha256={digest.decode()},{len(data)}")
        record.append("coveprobe-1.0.dist-info/RECORD,,")
        z.writestr("coveprobe-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return buf.getvalue()


@pytest.fixture(scope="module")
def world():
    with egress_world.running_world() as w:
        wheel = build_wheel()
        sha = hashlib.sha256(wheel).hexdigest()
        w.files[f"/packages/{WHEEL}"] = (wheel, "application/octet-stream")
        w.files["/simple/coveprobe/"] = (
            f'<html><body><a href="/packages/{WHEEL}#sha256={sha}">{WHEEL}</a></body></html>'
            .encode(), "text/html")
        yield w


PIP = (f"pip install --no-cache-dir --retries 0 --timeout 10 --cert /tmp/test-ca.pem"
       f" --index-url https://pypi.test:{HTTPS_PORT}/simple coveprobe")


@pytest.mark.parametrize("template", ["base", "code-interpreter"])
def test_pip_install_when_the_index_is_allowed(coved, world, template):
    sid = coved.create(template=template, networkPolicy=allow("pypi.test", "127.77.0.13"))
    try:
        with open(world.ca) as f:
            coved.sh(sid, f"cat > /tmp/test-ca.pem <<'EOF'\n{f.read()}EOF")
        r = coved.exec(sid, PIP)
        assert r.exit_code == 0, r.stdout + r.stderr
        assert "externally-managed" not in r.stderr
        out = coved.sh(sid, "python -c 'import coveprobe; print(coveprobe.ANSWER)'")
        assert out.strip() == "installed through the egress allowlist"
        assert coved.sh(sid, "python --version").startswith("Python 3")
    finally:
        coved.delete(sid)


def test_pip_install_fails_clearly_when_the_index_is_denied(coved, world):
    world.recorder.clear()
    sid = coved.create(networkPolicy=allow("allowed.test", "127.77.0.10"))
    try:
        with open(world.ca) as f:
            coved.sh(sid, f"cat > /tmp/test-ca.pem <<'EOF'\n{f.read()}EOF")
        r = coved.exec(sid, PIP)
        assert r.exit_code != 0
        text = r.stdout + r.stderr
        assert "pypi.test" in text, text
        assert "coveprobe" in text and "Successfully installed" not in text
        assert world.recorder.to("127.77.0.13") == []
        ev = coved.ok("GET", f"/v1/sandboxes/{sid}/egress/events")["events"]
        assert any(e["action"] == "deny" and e["name"] == "pypi.test" for e in ev), ev
    finally:
        coved.delete(sid)
