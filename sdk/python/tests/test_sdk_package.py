"""The package installs with pip from the source tree (Debian's pip and setuptools, offline)
and works from where it was installed."""

import os
import shutil
import subprocess
import sys

from sdkutil import REPO, SDK


def test_pip_install_target(tmp_path):
    target = tmp_path / "site"
    leftovers = [os.path.join(SDK, "build"), os.path.join(SDK, "cove_sdk.egg-info")]
    existed = {p for p in leftovers if os.path.exists(p)}
    try:
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps",
                            "--no-build-isolation", "--no-index", "--target", str(target),
                            "./sdk/python"], cwd=REPO, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        for p in leftovers:
            if p not in existed:
                shutil.rmtree(p, ignore_errors=True)
    assert (target / "cove" / "py.typed").exists()
    assert (target / "cove" / "aio" / "__init__.py").exists()
    check = ("import cove, cove.aio, sys; "
             "assert cove.__file__.startswith(sys.argv[1]), cove.__file__; "
             "assert cove.aio.Sandbox.create.__doc__; "
             "print(cove.__version__, cove.Sandbox.__name__, cove.aio.Sandbox.__name__)")
    r = subprocess.run([sys.executable, "-c", check, str(target)], capture_output=True,
                       text=True, env=dict(os.environ, PYTHONPATH=str(target)), cwd=str(tmp_path),
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0.1.0", "Sandbox", "AsyncSandbox"]
    dist = [d for d in os.listdir(target) if d.endswith(".dist-info")]
    assert dist and dist[0].startswith("cove_sdk-0.1.0")
    requires = (target / dist[0] / "METADATA").read_text()
    assert "Requires-Dist: httpx" in requires
