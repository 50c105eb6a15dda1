"""The code interpreter in sandboxes made from OCI images (issue 13): it works in an image that
has python3 and ipykernel, and answers a clear 400 in those that do not.

cove-kernel is linked dynamically; an image's root has neither its libraries nor, in general,
a loader for it. coved copies the loader and the libraries into STATE/kernel-libs/ and the
agent runs the helper under them (src/coved/runtime/kernel_libs.h). The images are built here
(tests/image_build.py): busybox, python3 with its stdlib (python_image), and that with one more
layer holding the host's ipykernel and its Python dependency closure, pushed to a registry of
the test's own on 127.77.5.x."""

import http.client
import json
import os
import stat
import subprocess

import pytest

import image_build as ib
import registry_world as rw
from covetest import AGENT_PORT, parse_events, serve

ADMIN = "images-code-admin-key"
ADDRESS = "127.77.5.1"
DIST = "/usr/lib/python3/dist-packages/"
# What `import ipykernel` and a kernel that runs code need of Debian's python3-ipykernel and
# what it depends on. Left out, as ipykernel and IPython import them only if they are there:
# the debugger (debugpy, pydevd, bytecode, coverage), jedi and parso (completion), setuptools,
# pkg_resources and py.
IPYKERNEL_PACKAGES = (
    "python3-ipykernel", "python3-ipython", "python3-jupyter-client", "python3-jupyter-core",
    "python3-zmq", "python3-tornado", "python3-traitlets", "python3-prompt-toolkit",
    "python3-wcwidth", "python3-stack-data", "python3-asttokens", "python3-executing",
    "python3-pure-eval", "python3-pexpect", "python3-ptyprocess", "python3-psutil",
    "python3-packaging", "python3-dateutil", "python3-six", "python3-matplotlib-inline",
    "python3-nest-asyncio", "python3-backcall", "python3-decorator", "python3-pickleshare",
    "python3-pygments", "python3-entrypoints")
KERNELSPEC = "/usr/share/jupyter/kernels/python3/kernel.json"


def package_files(package):
    out = subprocess.run(["dpkg", "-L", package], capture_output=True, text=True, check=True)
    return [p for p in out.stdout.split("\n")
            if p.startswith(DIST) and os.path.isfile(p) and not os.path.islink(p)
            and "/tests/" not in p and "/__pycache__/" not in p]


def python_layer_libraries():
    """The libraries python_image's python layer holds already: python3's and its stdlib
    extension modules' (as image_build.python_layer finds them)."""
    exe = os.path.realpath(ib.HOST_PYTHON)
    libs = set(ib._ldd(exe))
    dynload = f"/usr/lib/{os.path.basename(exe)}/lib-dynload"
    for name in os.listdir(dynload):
        if name.endswith(".so"):
            libs.update(ib._ldd(os.path.join(dynload, name)))
    return libs


def ipykernel_layer():
    """The host's ipykernel and its dependency closure (IPYKERNEL_PACKAGES) from
    dist-packages, its kernelspec, and the shared libraries their extension modules need
    beyond python's (libzmq and what it needs)."""
    t = ib.Tar()
    seen = set()
    files = sorted({p for pkg in IPYKERNEL_PACKAGES for p in package_files(pkg)})
    libs = set()
    for p in files:
        ib._host_path_entries(t, p, seen)
        if p.endswith(".so"):
            libs.update(ib._ldd(p))
    ib._host_path_entries(t, KERNELSPEC, seen)
    for lib in sorted(libs - python_layer_libraries()):
        ib._host_path_entries(t, lib, seen)
    return ib.Layer(t.bytes(), "gzip")


class Registry(rw.Registry):
    """registry_world's registry (no auth), on an address of this file's own."""

    def __init__(self, address):
        super().__init__("none")
        self.address = address
        self.backend_port = rw.free_port(address)


# ---- fixtures --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("images-code")


@pytest.fixture(scope="module")
def registry():
    reg = Registry(ADDRESS)
    try:
        yield reg.start()
    finally:
        reg.stop()


@pytest.fixture(scope="module")
def coved():
    with serve(admin_keys=(ADMIN,)) as d:
        yield d


@pytest.fixture(scope="module")
def images(registry, workdir):
    """References of the three images: busybox, python (no ipykernel), python + ipykernel."""
    busybox = ib.busybox_image()
    python = ib.python_image(busybox.layers[0])
    layer = ipykernel_layer()
    layers = python.layers + [layer]
    jupyter = ib.Image(layers, ib.image_config(layers, env=ib.PYTHON_ENV, working_dir="/"))
    print(f"ipykernel layer: {len(layer.tar) >> 20} MiB as a tar, {layer.size >> 20} MiB "
          f"gzipped; the image {jupyter.unpacked_size() >> 20} MiB unpacked")
    refs = {}
    for name, img in (("busybox", busybox), ("python", python), ("jupyter", jupyter)):
        registry.push_image(img, f"code/{name}:v1", workdir)
        refs[name] = registry.ref(f"code/{name}:v1")
    return refs


@pytest.fixture
def made(coved):
    out = []
    yield out
    for sid in out:
        try:
            coved.delete(sid)
        except Exception:
            pass


# ---- the code API ----------------------------------------------------------------------------

def agent_path(sid, path):
    return f"/sandboxes/{sid}/proxy/{AGENT_PORT}{path}"


def call(coved, sid, method, path, body=None):
    return coved.request(method, agent_path(sid, path), body=body, headers=coved.headers(),
                         timeout=180)


def run_code(coved, sid, code, context, timeout=180):
    """(status, events, raw body) of one POST /code."""
    conn = http.client.HTTPConnection("127.0.0.1", coved.port, timeout=timeout)
    conn.request("POST", agent_path(sid, "/code"),
                 body=json.dumps({"code": code, "context": context}), headers=coved.headers())
    resp = conn.getresponse()
    raw = resp.read().decode(errors="replace")
    conn.close()
    return resp.status, parse_events(raw) if resp.status == 200 else [], raw


def results(events):
    return [e["results"]["text"] for e in events if e["type"] == "result"]


def stdout(events):
    return "".join(e["text"] for e in events if e["type"] == "stdout")


def errors(events):
    return [e["error"] for e in events if e["type"] == "error"]


def create(coved, uri, made, entrypoint=None):
    body = {"image": {"uri": uri}, "resourceLimits": {"cpu": "1", "memory": "1Gi"}}
    if entrypoint is not None:
        body["entrypoint"] = entrypoint
    sid = coved.ok("POST", "/v1/sandboxes", body, expect=(202,), timeout=300)["id"]
    made.append(sid)
    return sid


# ---- tests -----------------------------------------------------------------------------------

def test_kernel_libraries_are_roots_and_read_only(coved):
    top = os.path.join(coved.state_dir, "kernel-libs")
    sets = os.listdir(top)
    assert len(sets) == 1, sets
    d = os.path.join(top, sets[0])
    st = os.stat(d)
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o555
    names = os.listdir(d)
    assert "ld.so" in names and "libzmq.so.5" in names and "libc.so.6" in names, names
    for n in names:
        st = os.lstat(os.path.join(d, n))
        assert stat.S_ISREG(st.st_mode) and st.st_uid == 0, n
        assert stat.S_IMODE(st.st_mode) == (0o555 if n == "ld.so" else 0o444), n


@pytest.mark.not_under("gvisor", reason="gVisor sandboxes have no kernel helper (code contexts are refused)")
@pytest.mark.static_agent
def test_image_with_ipykernel_runs_code_that_keeps_its_state(coved, images, made):
    sid = create(coved, images["jupyter"], made)  # no entrypoint: the image has none either
    # The image has none of the helper's own libraries (libjansson is not python's).
    assert coved.sh(sid, "find / -xdev -name 'libjansson*' | wc -l").strip() == "0"
    status, ctx, _ = call(coved, sid, "POST", "/code/context", {"language": "python"})
    assert status == 200 and ctx["language"] == "python", ctx
    context = {"id": ctx["id"]}
    status, events, raw = run_code(coved, sid, "x = 41\nprint('set', x)", context)
    assert status == 200 and not errors(events), raw
    assert stdout(events) == "set 41\n"
    status, events, raw = run_code(coved, sid, "x + 1", context)
    assert status == 200 and results(events) == ["42"], raw
    status, events, raw = run_code(coved, sid, "undefined_name", context)
    assert status == 200 and errors(events)[0]["ename"] == "NameError", raw
    # The helper ran under coved's loader, and neither it nor the kernel it started holds the
    # loader's descriptors (the helper, its libraries' directory) any more.
    code = ("import os, json\n"
            "def fds(pid):\n"
            "    d, out = f'/proc/{pid}/fd', []\n"
            "    for n in os.listdir(d):\n"
            "        try:\n"
            "            out.append(os.readlink(f'{d}/{n}'))\n"
            "        except OSError:\n"
            "            pass  # the listing's own descriptor\n"
            "    return sorted(out)\n"
            "print(json.dumps({'exe': os.readlink(f'/proc/{os.getppid()}/exe'),\n"
            "                  'helper': fds(os.getppid()), 'kernel': fds('self')}))")
    status, events, raw = run_code(coved, sid, code, context)
    assert status == 200 and not errors(events), raw
    seen = json.loads(stdout(events))
    assert seen["exe"].endswith("/ld.so"), seen
    assert len(seen["helper"]) >= 3 and len(seen["kernel"]) >= 3, seen  # the listing ran
    for fd in seen["helper"] + seen["kernel"]:
        assert "kernel-libs" not in fd and "cove-kernel" not in fd and not fd.endswith("ld.so"), \
            seen
    # The state is still there.
    status, events, raw = run_code(coved, sid, "x * 2", context)
    assert status == 200 and results(events) == ["82"], raw
    # A language-only run makes the default context in this image too.
    status, events, raw = run_code(coved, sid, "import sys; sys.version_info[0]",
                                   {"language": "python"})
    assert status == 200 and results(events) == ["3"], raw


@pytest.mark.static_agent
@pytest.mark.parametrize("image", ["busybox", "python"])
def test_image_without_ipykernel_is_a_clear_400(coved, images, made, image):
    sid = create(coved, images[image], made, entrypoint=["sleep", "infinity"])
    status, body, _ = call(coved, sid, "POST", "/code/context", {"language": "python"})
    assert status == 400 and body["code"] == "INVALID_REQUEST_BODY", body
    assert "no kernel for python" in body["message"], body
    status, _, raw = run_code(coved, sid, "1 + 1", {"language": "python"})
    assert status == 400 and "no kernel for python" in json.loads(raw)["message"], raw
    assert call(coved, sid, "GET", "/code/contexts")[1] == []
    assert coved.sh(sid, "echo still fine") == "still fine\n"
