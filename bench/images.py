#!/usr/bin/python3
"""OCI image benchmark (issue 13): how long Cove takes to pull an image and to start a sandbox
from it, against podman doing the same with the same image from the same registry, in one run.
The registry is Debian's docker-registry on loopback (tests/registry_world.py, at 127.77.4.1:
pulls go to it directly, not through the tests' recording proxy); the image is the tests'
python_image() (tests/image_build.py; each path once, see without_duplicates): busybox and
the host's python3 with its stdlib, two gzip layers, about 21 MB compressed, 56 MB unpacked,
pushed once with skopeo. Each iteration, the kinds in turn first (drift hits them alike):

  cove pull         POST /v1/images until its 200, on an empty image store (every image
                    DELETEd and POST /v1/images/prune'd before, its layers gone from disk)
  cove create       then --runs creates from the pulled image, entrypoint omitted (the image
                    has none: `tail -f /dev/null`), POST until the 202, then
                    `python3 -c 'print(1)'` through the agent until its output is back; as
                    many from the `base` template (the host's /usr), interleaved, for reference
  cove create+pull  the same create on an empty store again: the pull inside the create
  podman pull       podman --runtime runc pull --tls-verify=false, on a new, empty --root
                    (overlay storage, bench/tools.py's flags); then --runs times
                    `podman run --rm IMAGE python3 -c 'print(1)'` with it pulled (one more
                    before, not counted)
  podman run+pull   `podman run --rm --tls-verify=false` of the image on another empty --root
  skopeo copy       docker://REF to oci:DIR (a new DIR): the download alone, the floor; then
                    `tar -xzf` of its two layer blobs into a new directory (the unpack alone)

Usage: bench/images.py [--iterations N] [--warmup N] [--runs N] [--no-podman] [--json FILE]
(as root, on a built tree: scripts/build.sh; needs docker-registry, skopeo, podman, runc)"""
import argparse
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(here), "tests"))
import image_build  # noqa: E402 - the tests' image builder, found through sys.path
import registry_world  # noqa: E402 - the tests' registry
from covetest import serve  # noqa: E402
from machine import log, machine_info, unmount_under  # noqa: E402
from measure import percentile  # noqa: E402
from tools import Podman, ProcTool, libpod_cgroups, remove_new_globals, run_or_explain, \
    snapshot_globals  # noqa: E402

ADDRESS = "127.77.4.1"  # the bench's loopback address (the tests' registries are 127.77.2.x)
REPOSITORY = "bench/python:v1"
ADMIN = "images-bench-admin-key"
LIMITS = {"cpu": "1", "memory": "512Mi"}
COMMAND = "python3 -c 'print(1)'"
PODMAN_COMMAND = ["python3", "-c", "print(1)"]
POLL_S = 0.02


def stats(values):
    ms = [v * 1000 for v in values]
    return {"n": len(ms), "p50": percentile(ms, 50), "p90": percentile(ms, 90),
            "mean": statistics.fmean(ms) if ms else float("nan"),
            "min": min(ms) if ms else float("nan"), "max": max(ms) if ms else float("nan")}


def without_duplicates(layer):
    """The layer with each path once (its first entry): the tests' python layer holds
    `usr/bin/` twice, which Cove takes as tar does (the last one wins) but podman refuses
    ("processing tar file(): duplicates of file paths not supported")."""
    src = tarfile.open(fileobj=io.BytesIO(layer.tar))
    buf = io.BytesIO()
    seen = set()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as out:
        for m in src.getmembers():
            name = m.name.rstrip("/")
            if name in seen:
                continue
            seen.add(name)
            out.addfile(m, src.extractfile(m) if m.isreg() else None)
    return image_build.Layer(buf.getvalue(), layer.compression)


def python_image():
    """tests/image_build.py's python_image(), each path once in its layers."""
    img = image_build.python_image()
    layers = [without_duplicates(l) for l in img.layers]
    cfg = img.config["config"]
    return image_build.Image(layers, image_build.image_config(
        layers, env=cfg.get("Env"), entrypoint=cfg.get("Entrypoint"), cmd=cfg.get("Cmd"),
        working_dir=cfg.get("WorkingDir", ""), user=cfg.get("User", "")))


class BenchRegistry(registry_world.Registry):
    """The tests' Registry (no auth) on the bench's own address: its constructor keeps to the
    tests' 127.77.2.x, so the same attributes are set here for 127.77.4.x; start, push, stop
    and the cleanup are the tests' own."""

    def __init__(self, address=ADDRESS):
        assert address.startswith("127.77.4."), address
        self.auth = "none"
        self.address = address
        self.users = {}
        self.dir = tempfile.mkdtemp(prefix="cove-bench-registry-")
        self.backend_port = registry_world.free_port(address)
        self.proc = None
        self.token_server = None
        self.proxy = None
        self.log_path = os.path.join(self.dir, "registry.log")


class PodmanStore(Podman):
    """podman as bench/tools.py runs it (runc, overlay, cgroupfs, its own --root, --runroot
    and tmp dirs), on a storage of its own that starts empty: nothing imported."""

    def __init__(self, tmp, name):
        super().__init__(tmp)
        self.dir = os.path.join(tmp, name)
        self.env = dict(os.environ, TMPDIR=os.path.join(self.dir, "tmp"))

    def setup(self):
        ProcTool.setup(self)
        for sub in ["tmp", "net", "libpod", "volumes"]:
            os.makedirs(os.path.join(self.dir, sub))

    def run_flags(self):
        # tools.Podman's: no CAP_SYS_RESOURCE here, so low rlimits any process may set.
        return ["--rm", "--network", "none", "--ulimit", "nofile=1024:1024",
                "--ulimit", "nproc=1024:1024"]

    def cleanup(self):
        super().cleanup()
        unmount_under(self.dir)
        shutil.rmtree(self.dir, ignore_errors=True)


def first_output(argv, expect, env=None):
    """Runs argv; (seconds until `expect` was on its stdout, seconds until it exited)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=err, close_fds=True)
        buf, t_first = b"", None
        while True:
            chunk = os.read(p.stdout.fileno(), 65536)
            if not chunk:
                break
            buf += chunk
            if t_first is None and expect in buf:
                t_first = time.perf_counter() - t0
        rc = p.wait()
        t_end = time.perf_counter() - t0
        p.stdout.close()
        if rc != 0 or t_first is None:
            err.seek(0)
            raise RuntimeError(f"{' '.join(argv)}: exit {rc}, output {buf[:200]!r}: "
                               f"{err.read().decode(errors='replace')[-1500:]}")
    return t_first, t_end


def timed(argv, env=None):
    t0 = time.perf_counter()
    run_or_explain(argv, env=env)
    return time.perf_counter() - t0


# ---------------------------------------------------------------- Cove

def layer_dirs(d):
    root = os.path.join(d.state_dir, "images", "layers")
    try:
        return [n for n in os.listdir(root) if n.startswith("sha256-")]
    except FileNotFoundError:
        return []


def empty_store(d):
    """Deletes every image and prunes; waits until no layer is left on disk (a removal may
    finish after its answer)."""
    admin = {"OPEN-SANDBOX-API-KEY": ADMIN, "Content-Type": "application/json"}
    for img in d.ok("GET", "/v1/images")["items"]:
        d.ok("DELETE", f"/v1/images/{img['id']}", expect=(204,), headers=admin)
    d.ok("POST", "/v1/images/prune", headers=admin)
    deadline = time.time() + 60
    while layer_dirs(d) or d.ok("GET", "/v1/images")["items"]:
        if time.time() > deadline:
            raise RuntimeError(f"the image store is not empty: {layer_dirs(d)}")
        time.sleep(POLL_S)


def cove_pull(d, ref, img):
    if layer_dirs(d):
        raise RuntimeError("a cold pull on a store that holds layers")
    t0 = time.perf_counter()
    status, body, _ = d.request("POST", "/v1/images", {"uri": ref}, timeout=600)
    t = time.perf_counter() - t0
    if status != 200 or body.get("digest") != img.digest:
        raise RuntimeError(f"pull {ref}: HTTP {status}: {body}")
    return t, body


def cove_create(d, uri):
    """POST until the 202 (entrypoint omitted for an image, `sleep infinity` for base), then
    the command until its output is back: (create s, create + first output s)."""
    body = {"image": {"uri": uri}, "resourceLimits": LIMITS}
    if uri == "base":
        body["entrypoint"] = ["sleep", "infinity"]
    t0 = time.perf_counter()
    status, answer, _ = d.request("POST", "/v1/sandboxes", body, timeout=600)
    t_create = time.perf_counter() - t0
    if status != 202:
        raise RuntimeError(f"create from {uri}: HTTP {status}: {answer}")
    try:
        r = d.exec(answer["id"], COMMAND)
        t_first = time.perf_counter() - t0
        if r.stdout != "1\n":
            raise RuntimeError(f"{COMMAND} in {answer['id']}: {r.stdout!r} {r.stderr!r}")
    finally:
        d.delete(answer["id"])
    return t_create, t_first


def cove_iteration(d, ref, img, args, times, counted):
    empty_store(d)
    t_pull, body = cove_pull(d, ref, img)
    for k in range(args.runs):
        for uri in ((ref, "base") if k % 2 == 0 else ("base", ref)):
            t_create, t_first = cove_create(d, uri)
            if counted:
                kind = "cached" if uri == ref else "base"
                times[kind]["create"].append(t_create)
                times[kind]["first"].append(t_first)
    empty_store(d)
    t_create, t_first = cove_create(d, ref)
    if counted:
        times["pull"]["pull"].append(t_pull)
        times["create_pull"]["create"].append(t_create)
        times["create_pull"]["first"].append(t_first)
    return body


# ---------------------------------------------------------------- podman and the floor

def podman_iteration(tmp, ref, args, times, counted, i):
    p = PodmanStore(tmp, f"pp{i}")
    try:
        p.setup()
        t_pull = timed(p.base() + ["pull", "-q", "--tls-verify=false", ref], env=p.env)
        first_output(p.base() + ["run"] + p.run_flags() + [ref] + PODMAN_COMMAND, b"1",
                     env=p.env)  # not counted: the storage's first container
        runs = [first_output(p.base() + ["run"] + p.run_flags() + [ref] + PODMAN_COMMAND,
                             b"1", env=p.env) for _ in range(args.runs)]
    finally:
        p.cleanup()
    p = PodmanStore(tmp, f"pr{i}")
    try:
        p.setup()
        cold = first_output(p.base() + ["run", "--tls-verify=false"] + p.run_flags() +
                            [ref] + PODMAN_COMMAND, b"1", env=p.env)
    finally:
        p.cleanup()
    if counted:
        times["pull"]["pull"].append(t_pull)
        times["cached"]["first"] += [f for f, _ in runs]
        times["cached"]["exit"] += [e for _, e in runs]
        times["create_pull"]["first"].append(cold[0])
        times["create_pull"]["exit"].append(cold[1])


def skopeo_iteration(tmp, ref, img, times, counted, i):
    layout = os.path.join(tmp, f"skopeo-{i}")
    unpacked = os.path.join(tmp, f"unpacked-{i}")
    try:
        t_copy = timed([image_build.SKOPEO, "--insecure-policy", "copy", "-q",
                        "--src-tls-verify=false", f"docker://{ref}", f"oci:{layout}:v1"])
        os.makedirs(unpacked)
        t0 = time.perf_counter()
        for layer in img.layers:  # bottom first, as a pull unpacks them
            blob = os.path.join(layout, "blobs", "sha256", layer.digest.split(":", 1)[1])
            run_or_explain(["tar", "-xzf", blob, "-C", unpacked])
        t_untar = time.perf_counter() - t0
    finally:
        shutil.rmtree(layout, ignore_errors=True)
        shutil.rmtree(unpacked, ignore_errors=True)
    if counted:
        times["copy"].append(t_copy)
        times["untar"].append(t_untar)


# ---------------------------------------------------------------- the run

def tool_version(argv):
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        return (out.stdout or out.stderr).splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError, IndexError):
        return "not installed"


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=8, help="counted iterations (8)")
    ap.add_argument("--warmup", type=int, default=1, help="iterations not counted (1)")
    ap.add_argument("--runs", type=int, default=4,
                    help="cached creates and podman runs per iteration (4)")
    ap.add_argument("--no-podman", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/images.py: run as root", file=sys.stderr)
        return 2
    for tool in ("skopeo", "docker-registry", "tar"):
        if shutil.which(tool) is None:
            print(f"bench/images.py: {tool} is not installed", file=sys.stderr)
            return 2
    podman = not args.no_podman and shutil.which("podman") and shutil.which("runc")
    info = machine_info()
    info["versions"]["skopeo"] = tool_version([image_build.SKOPEO, "--version"])
    info["versions"]["docker-registry"] = tool_version([registry_world.REGISTRY_BIN,
                                                        "--version"])
    res = {"machine": info, "iterations": args.iterations, "warmup": args.warmup,
           "runs": args.runs, "load_before": os.getloadavg()}
    cove = {"pull": {"pull": []}, "cached": {"create": [], "first": []},
            "base": {"create": [], "first": []}, "create_pull": {"create": [], "first": []}}
    pod = {"pull": {"pull": []}, "cached": {"first": [], "exit": []},
           "create_pull": {"first": [], "exit": []}}
    floor = {"copy": [], "untar": []}
    tmp = tempfile.mkdtemp(prefix="cove-bench-img-")  # podman: runroot < 50 chars
    globals_before, libpod_before = snapshot_globals(), libpod_cgroups()
    t_start = time.perf_counter()
    reg = BenchRegistry()
    try:
        log("building the python image (tests/image_build.py) ...")
        img = python_image()
        res["image"] = {"digest": img.digest, "layers": [l.size for l in img.layers],
                        "compressed": sum(l.size for l in img.layers),
                        "unpacked": img.unpacked_size()}
        reg.start()
        reg.push_image(img, REPOSITORY, tmp)
        ref = f"{reg.backend}/{REPOSITORY}"  # docker-registry itself, not the tests' proxy
        res["reference"] = ref
        with serve("--mcp-command", "none", admin_keys=(ADMIN,)) as d:
            for i in range(args.warmup + args.iterations):
                counted = i >= args.warmup
                log(f"iteration {i + 1}/{args.warmup + args.iterations}"
                    f"{'' if counted else ' (warm-up)'} ...")
                kinds = ["cove", "skopeo"] + (["podman"] if podman else [])
                shift = i % len(kinds)
                for kind in kinds[shift:] + kinds[:shift]:
                    if kind == "cove":
                        body = cove_iteration(d, ref, img, args, cove, counted)
                        res["cove_image"] = {"size": body["size"], "layers": body["layers"]}
                    elif kind == "podman":
                        podman_iteration(tmp, ref, args, pod, counted, i)
                    else:
                        skopeo_iteration(tmp, ref, img, floor, counted, i)
            empty_store(d)
    finally:
        reg.stop()
        remove_new_globals(globals_before, libpod_before)
        shutil.rmtree(tmp, ignore_errors=True)
    res["wall_s"] = time.perf_counter() - t_start
    res["load_after"] = os.getloadavg()
    res["cove"] = {k: {m: stats(v) for m, v in x.items()} for k, x in cove.items()}
    res["floor"] = {k: stats(v) for k, v in floor.items()}
    if podman:
        res["podman"] = {k: {m: stats(v) for m, v in x.items()} for k, x in pod.items()}
    else:
        res["podman_skipped"] = "--no-podman" if args.no_podman else "podman or runc missing"
    print_report(res, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


def fmt(x):
    if x != x:  # NaN
        return "-"
    return f"{x:.1f}" if x < 100 else f"{x:.0f}"


def print_report(res, args):
    m = res["machine"]
    print(f"== Machine: {m['cpu']}, {m['cores']} cores; RAM {m['ram_gib']} GiB; "
          f"kernel {m['kernel']}; {m['os']}; cgroups {m['cgroups']}; python "
          f"{platform.python_version()}")
    print("== Versions: " + "; ".join(f"{k}: {v}" for k, v in m["versions"].items()))
    im = res["image"]
    print(f"== Image {res['reference']} ({im['digest'][:19]}...): {len(im['layers'])} gzip "
          f"layers, {im['compressed'] / 1e6:.1f} MB compressed, {im['unpacked'] / 1e6:.1f} MB "
          f"unpacked; in Cove's store {res['cove_image']['size'] / 1e6:.1f} MB")
    print(f"== n={args.iterations} iterations after {args.warmup} warm-up ({args.runs} cached "
          f"creates/runs each); load average {res['load_before'][0]:.2f} before, "
          f"{res['load_after'][0]:.2f} after; {res['wall_s']:.0f} s in all. Milliseconds:")
    c, p, fl = res["cove"], res.get("podman"), res["floor"]
    rows = [("cove pull (POST /v1/images, empty store)", c["pull"]["pull"],
             p and p["pull"]["pull"]),
            ("podman pull (empty --root)", p and p["pull"]["pull"], None),
            ("skopeo copy docker:// oci: (download only)", fl["copy"], p and p["pull"]["pull"]),
            ("tar -xzf of the two layers (unpack only)", fl["untar"], None),
            ("cove create, image pulled: 202", c["cached"]["create"], None),
            ("cove create, image pulled: + print(1)", c["cached"]["first"],
             p and p["cached"]["first"]),
            ("podman run --rm, pulled: print(1) out", p and p["cached"]["first"], None),
            ("podman run --rm, pulled: exit", p and p["cached"]["exit"], None),
            ("cove create from base: 202", c["base"]["create"], None),
            ("cove create from base: + print(1)", c["base"]["first"],
             p and p["cached"]["first"]),
            ("cove create+pull (empty store): 202", c["create_pull"]["create"], None),
            ("cove create+pull: + print(1)", c["create_pull"]["first"],
             p and p["create_pull"]["first"]),
            ("podman run --rm, not pulled: print(1) out", p and p["create_pull"]["first"], None),
            ("podman run --rm, not pulled: exit", p and p["create_pull"]["exit"], None)]
    print(f"{'what':44} {'n':>3} | {'p50':>7} {'p90':>7} {'mean':>7} | {'/ podman p50':>12}")
    for name, s, ref in rows:
        if not s:
            continue
        ratio = f"{s['p50'] / ref['p50']:.2f}x" if ref else ""
        print(f"{name:44} {s['n']:>3} | {fmt(s['p50']):>7} {fmt(s['p90']):>7} "
              f"{fmt(s['mean']):>7} | {ratio:>12}")
    if not p:
        print(f"podman skipped: {res['podman_skipped']}")


if __name__ == "__main__":
    sys.exit(main())
