#!/usr/bin/python3
"""Runtime benchmark (issue 13): what each of Cove's runtimes costs, in one run. Part 1,
create -> first output: a new environment runs `echo hi`, timed from the start of the request
until "hi" reaches the client. Part 2, gVisor's cost inside a running sandbox: loops of
execs and of file writes, timed inside the sandbox. Each iteration (part 1) or round (part 2)
takes the kinds in turn first (drift hits them alike); warm-ups are not counted.

Part 1, create -> first output (`echo hi`), one coved (bench/tools.py's Cove: private copies
of the build's binaries, its own state dir and port, default disk layer, cpu 1, memory 512Mi):

  cove native     POST /v1/sandboxes {"image": {"uri": "base"}, entrypoint sleep infinity,
  cove oci          "extensions": {"runtime": R}} until its 202, then POST
  cove gvisor       .../proxy/44772/command `echo hi` on a new connection until "hi" is back;
                    then DELETE (timed apart). oci is crun, gvisor is runsc --platform=ptrace
                    (this VM has no KVM; Debian's runsc predates systrap)
  bwrap           bwrap --unshare-all over the host's /usr, /usr/bin/echo hi (tools.Bwrap)
  crun run        `crun run` of an OCI bundle: busybox-static rootfs, crun's default spec
                    (tools.Crun); on a hybrid cgroup host in a private mount namespace with
                    /sys/fs/cgroup/unified unmounted (crun refuses hybrid, as in bench.py;
                    Cove's oci runtime does the same)
  runsc run       `runsc --platform=ptrace --network=none --ignore-cgroups run` of the same
                    bundle, its --root in the bench's temp dir
  runsc do        `runsc --platform=ptrace --network=none --ignore-cgroups do /usr/bin/echo
                    hi`: the host's / as its root, under runsc's overlay
  podman          podman --runtime runc run --rm of the busybox image (tools.Podman: imported
                    once, its own --root; --no-podman skips it)

Part 2, one sandbox per Cove runtime (base, cpu 2, memory 1Gi: no CPU quota between gVisor's
sentry and its tasks), each command through the agent (bash -c), timed inside with bash's
$EPOCHREALTIME around the loop (the command's duration seen by the client alongside):

  exec       for i in $(seq 200); do /bin/true; done
  files      2000 files of 2 bytes (`echo x > fN`) in a new directory, no fsync
  dd         dd if=/dev/zero of=F bs=1M count=64 (64 MiB, no fsync: page cache)
  dd fsync   the same with conv=fsync (the data on the layer's disk before dd exits)
  python     10 x python3 -c 'print(1)' (interpreter start-up: many opens, stats, mmaps)

The files are written in /root/rtbench-N, in the writable layer (natively and under crun the
overlay on the layer's ext4, or on a tmpfs with --cove-layer tmpfs; under gVisor the same
overlay through its gofer), and removed by a separate, untimed command.

Usage: bench/runtimes.py [--iterations N] [--warmup N] [--runs N] [--rounds N] [--no-podman]
[--cove-layer disk|tmpfs] [--only 1,2] [--json FILE]  (as root, on a built tree:
scripts/build.sh; needs crun, runsc, bwrap, busybox-static, and podman and runc unless
--no-podman)"""
import argparse
import ctypes
import glob
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import bench  # noqa: F401 - catch_signals
from machine import MNT_DETACH, cgroup_mode, log, machine_info, mounts_under, umount, \
    unmount_under
from measure import percentile
from tools import Bwrap, Cove, Crun, Podman, crun_leftovers, libpod_cgroups, \
    remove_new_globals, snapshot_globals

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("COVE_BUILD_DIR", os.path.join(ROOT, "build"))
RUNTIMES = ("native", "oci", "gvisor")
LIMITS = {"cpu": "1", "memory": "512Mi"}
LOOP_LIMITS = {"cpu": "2", "memory": "1Gi"}
GVISOR_PLATFORM = "ptrace"
LOOPS = [
    ("exec", "200 x /bin/true", "for i in $(seq 200); do /bin/true; done"),
    ("files", "2000 small files", "for i in $(seq 2000); do echo x > f$i; done"),
    ("dd", "dd 64 MiB, no fsync", "dd if=/dev/zero of=big bs=1M count=64 status=none"),
    ("dd_fsync", "dd 64 MiB, conv=fsync",
     "dd if=/dev/zero of=big bs=1M count=64 conv=fsync status=none"),
    ("python", "10 x python3 print(1)",
     "for i in $(seq 10); do python3 -c 'print(1)' >/dev/null; done"),
]
CLONE_NEWNS = 0x00020000
MS_REC, MS_PRIVATE = 0x4000, 0x40000
_libc = ctypes.CDLL(None, use_errno=True)


def stats(values):
    ms = [v * 1000 for v in values]
    return {"n": len(ms), "p50": percentile(ms, 50), "p90": percentile(ms, 90),
            "mean": statistics.fmean(ms) if ms else float("nan"),
            "min": min(ms) if ms else float("nan"), "max": max(ms) if ms else float("nan")}


def hide_unified():
    """preexec_fn of crun on a hybrid cgroup host: a private mount namespace of its own in
    which the (controller-less) cgroup2 mount /sys/fs/cgroup/unified is gone, so that crun
    sees plain v1 (it refuses hybrid). Runs in the child between fork and exec."""
    if _libc.unshare(CLONE_NEWNS) != 0 or \
            _libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "unshare/mount")
    umount("/sys/fs/cgroup/unified", MNT_DETACH)


def first_output(argv, expect, errf, preexec_fn=None):
    """Runs argv; (seconds until `expect` was on its stdout, seconds until it exited)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errf,
                         close_fds=True, preexec_fn=preexec_fn)
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
        raise RuntimeError(f"{' '.join(argv)}: exit {rc}, output {buf[:200]!r} "
                           f"(stderr in {errf.name})")
    return t_first, t_end


# ---------------------------------------------------------------- the tools, directly

class HybridCrun(Crun):
    """tools.Crun (busybox bundle, crun's default spec), each `crun` in hide_unified's mount
    namespace when the host's cgroups are hybrid."""

    def __init__(self, tmp):
        super().__init__(tmp)
        self.preexec = hide_unified if cgroup_mode() == "hybrid" else None

    def once(self):
        f, e = first_output(self.argv(next(self.counter)), b"hi", self.errf, self.preexec)
        return {"first": f, "cycle": e}

    def cleanup(self):
        for cid in crun_leftovers(self.prefix):
            subprocess.run(["crun", "delete", "-f", cid], capture_output=True,
                           preexec_fn=self.preexec)
        if self.errf:
            self.errf.close()
            self.errf = None


class Runsc:
    """runsc (ptrace, no network, no cgroups) run of crun's bundle, or `do` over the host."""

    def __init__(self, tmp, crun, mode):
        self.name = f"runsc {mode}"
        self.mode = mode
        self.crun = crun
        self.root = os.path.join(tmp, f"runsc-{mode}-state")
        self.bundle = os.path.join(tmp, "runsc-bundle")
        self.errf = None
        self.n = 0
        self.prefix = os.path.basename(tmp) + f"-{mode}-"

    def base(self):
        return ["runsc", "--root", self.root, f"--platform={GVISOR_PLATFORM}", "--network=none",
                "--ignore-cgroups"]

    def setup(self):
        os.makedirs(self.root)
        self.errf = open(os.path.join(os.path.dirname(self.root), f"runsc-{self.mode}.stderr"),
                         "ab")
        if self.mode == "run" and not os.path.isdir(self.bundle):
            # crun's bundle and rootfs (the rootfs shared, read-only), its spec as it is.
            os.makedirs(self.bundle)
            cfg = json.load(open(os.path.join(self.crun.bundle, "config.json")))
            cfg["root"]["path"] = os.path.join(self.crun.bundle, "rootfs")
            json.dump(cfg, open(os.path.join(self.bundle, "config.json"), "w"), indent=1)

    def once(self):
        self.n += 1
        if self.mode == "run":
            argv = self.base() + ["run", "--bundle", self.bundle, f"{self.prefix}{self.n}"]
        else:
            argv = self.base() + ["do", "/usr/bin/echo", "hi"]
        f, e = first_output(argv, b"hi", self.errf)
        return {"first": f, "cycle": e}

    def cleanup(self):
        try:
            for cid in os.listdir(self.root):
                if cid.startswith(self.prefix):
                    subprocess.run(self.base() + ["delete", "-force", cid.split(".")[0]],
                                   capture_output=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            pass
        if self.errf:
            self.errf.close()
            self.errf = None


# ---------------------------------------------------------------- Cove

def cove_create(cove, runtime, limits=LIMITS):
    status, payload = cove.request("POST", "/v1/sandboxes", {
        "image": {"uri": "base"}, "entrypoint": ["sleep", "infinity"], "resourceLimits": limits,
        "extensions": {"runtime": runtime}})
    if status != 202:
        raise RuntimeError(f"create ({runtime}): HTTP {status}: {payload[:300]!r}")
    sid = json.loads(payload)["id"]
    with cove.lock:
        cove.ids.add(sid)
        cove.all_ids.add(sid)
    return sid


class CoveRuntime:
    """One create -> `echo hi` -> delete of a Cove sandbox of one runtime."""

    def __init__(self, cove, runtime):
        self.cove, self.runtime = cove, runtime
        self.name = f"cove {runtime}"

    def once(self):
        t0 = time.perf_counter()
        sid = cove_create(self.cove, self.runtime)
        t_created = time.perf_counter()
        t_first, t_exec_end = self.cove.exec_first(sid)
        self.cove.delete(sid)
        t_end = time.perf_counter()
        return {"create": t_created - t0, "first": t_first - t0, "delete": t_end - t_exec_end,
                "cycle": t_end - t0}


def loop_command(name, body, n):
    """The loop in /root/rtbench-N (made before the timing), timed by bash itself."""
    d = f"/root/rtbench-{n}"
    return (f"set -e; mkdir -p {d}; cd {d}; s=$EPOCHREALTIME; {body}; e=$EPOCHREALTIME; "
            f"echo \"rtbench {name} $s $e\"")


def run_loop(cove, sid, name, body, n):
    t0 = time.perf_counter()
    r = cove.daemon.exec(sid, loop_command(name, body, n), http_timeout=600)
    t_client = time.perf_counter() - t0
    words = r.stdout.split()
    if r.exit_code != 0 or len(words) != 4 or words[:2] != ["rtbench", name]:
        raise RuntimeError(f"{name} in {sid}: exit {r.exit_code}, {r.stdout!r} {r.stderr!r}")
    inside = float(words[3].replace(",", ".")) - float(words[2].replace(",", "."))
    clean = cove.daemon.exec(sid, f"rm -rf /root/rtbench-{n}", http_timeout=600)
    if clean.exit_code != 0:
        raise RuntimeError(f"rm in {sid}: {clean.stderr!r}")
    return inside, t_client


def describe_sandbox(cove, sid):
    r = cove.daemon.exec(sid, "mkdir -p /root/rtbench-0 && stat -f -c %T /root/rtbench-0 && "
                         "rmdir /root/rtbench-0 && uname -r")
    return " ".join(r.stdout.split())


# ---------------------------------------------------------------- the run

def tool_version(argv):
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        return (out.stdout or out.stderr).splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError, IndexError):
        return "not installed"


def part1(cove, tmp, args, res, loads):
    tools = [CoveRuntime(cove, r) for r in RUNTIMES]
    bw = Bwrap(tmp)
    cr = HybridCrun(tmp)
    direct = [bw, cr, Runsc(tmp, cr, "run"), Runsc(tmp, cr, "do")]
    if args.podman:
        direct.append(Podman(tmp))
    try:
        for t in direct:
            log(f"setting up {t.name} ...")
            t.setup()
        tools += direct
        times = {t.name: {} for t in tools}
        for i in range(args.warmup + args.iterations):
            counted = i >= args.warmup
            loads.append(os.getloadavg()[0])
            log(f"part 1: iteration {i + 1}/{args.warmup + args.iterations}"
                f"{'' if counted else ' (warm-up)'} ...")
            shift = i % len(tools)
            for t in tools[shift:] + tools[:shift]:
                for _ in range(args.runs):
                    r = t.once()
                    if counted:
                        for k, v in r.items():
                            times[t.name].setdefault(k, []).append(v)
        res["part1"] = {name: {k: stats(v) for k, v in x.items()} for name, x in times.items()}
        res["part1_tools"] = [t.name for t in tools]
    finally:
        for t in reversed(direct):
            try:
                t.cleanup()
            except Exception as e:  # noqa: BLE001 - keep cleaning up
                log(f"cleanup: {t.name}: {e}")


def part2(cove, args, res, loads):
    sids = {}
    times = {r: {name: {"inside": [], "client": []} for name, _, _ in LOOPS} for r in RUNTIMES}
    try:
        for r in RUNTIMES:
            sids[r] = cove_create(cove, r, LOOP_LIMITS)
            cove.exec_first(sids[r])  # running and answering
        res["part2_sandboxes"] = {r: describe_sandbox(cove, sids[r]) for r in RUNTIMES}
        n = 0
        for i in range(args.loop_warmup + args.rounds):
            counted = i >= args.loop_warmup
            loads.append(os.getloadavg()[0])
            log(f"part 2: round {i + 1}/{args.loop_warmup + args.rounds}"
                f"{'' if counted else ' (warm-up)'} ...")
            shift = i % len(RUNTIMES)
            for r in RUNTIMES[shift:] + RUNTIMES[:shift]:
                for name, _, body in LOOPS:
                    n += 1
                    inside, client = run_loop(cove, sids[r], name, body, n)
                    if counted:
                        times[r][name]["inside"].append(inside)
                        times[r][name]["client"].append(client)
    finally:
        for sid in sids.values():
            try:
                cove.delete(sid)
            except Exception as e:  # noqa: BLE001
                log(f"cleanup: delete {sid}: {e}")
    res["part2"] = {r: {name: {k: stats(v) for k, v in x.items()} for name, x in y.items()}
                    for r, y in times.items()}


def leftovers(tmp, cove, globals_before, libpod_before):
    left = []
    if mounts_under(tmp):
        left.append(f"mounts {mounts_under(tmp)}")
    if os.path.exists(tmp):
        left.append(f"temp dir {tmp}")
    left += cove.leftovers()
    prefix = os.path.basename(tmp)
    left += [f"crun container {c}" for c in crun_leftovers(prefix)]
    left += [f"cgroup {d}" for d in glob.glob(f"/sys/fs/cgroup/*/{prefix}*")]
    for path, existed in globals_before.items():
        if not existed and os.path.lexists(path):
            left.append(f"path {path}")
    if not libpod_before:
        left += [f"cgroup {d}" for d in libpod_cgroups()]
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if tmp.encode() in open(f"/proc/{p}/cmdline", "rb").read():
                    left.append(f"process {p}")
            except OSError:
                pass
    return left


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=10, help="part 1: counted iterations (10)")
    ap.add_argument("--warmup", type=int, default=1, help="part 1: iterations not counted (1)")
    ap.add_argument("--runs", type=int, default=2, help="part 1: runs per kind per iteration (2)")
    ap.add_argument("--rounds", type=int, default=8, help="part 2: counted rounds (8)")
    ap.add_argument("--loop-warmup", type=int, default=1, help="part 2: rounds not counted (1)")
    ap.add_argument("--no-podman", dest="podman", action="store_false")
    ap.add_argument("--only", default="1,2", help="parts to run: 1, 2 or 1,2 (default)")
    ap.add_argument("--cove-layer", choices=("disk", "tmpfs"),
                    help="coved's --layer: the sandboxes' writable layer (default disk)")
    ap.add_argument("--coved", default=os.path.join(BUILD, "src", "coved", "coved"))
    ap.add_argument("--agent", default=os.path.join(BUILD, "src", "agent", "cove-agent"))
    ap.add_argument("--json")
    args = ap.parse_args()
    parts = set(args.only.split(","))
    if os.geteuid() != 0:
        print("bench/runtimes.py: run as root", file=sys.stderr)
        return 2
    need = ["crun", "runsc", "bwrap", "busybox"] + (["podman", "runc"] if args.podman else [])
    missing = [t for t in need if shutil.which(t) is None]
    if missing:
        print(f"bench/runtimes.py: not installed: {' '.join(missing)}", file=sys.stderr)
        return 2
    # The runtimes come from the create requests, not from the test suite's default.
    os.environ.pop("COVE_TEST_RUNTIME", None)
    os.environ["COVE_GVISOR_PLATFORM"] = GVISOR_PLATFORM
    bench.catch_signals()
    info = machine_info()
    info["versions"]["runsc"] = tool_version(["runsc", "--version"])
    res = {"machine": info, "iterations": args.iterations, "warmup": args.warmup,
           "runs": args.runs, "rounds": args.rounds, "loop_warmup": args.loop_warmup,
           "layer": args.cove_layer or "disk",
           "load_before": os.getloadavg()}
    loads = []
    tmp = tempfile.mkdtemp(prefix="cove-bench-rt-")  # podman: runroot < 50 chars
    globals_before, libpod_before = snapshot_globals(), libpod_cgroups()
    t_start = time.perf_counter()
    cove = Cove(tmp, args.coved, args.agent, layer=args.cove_layer)
    rc = 0
    try:
        cove.start()
        if "1" in parts:
            part1(cove, tmp, args, res, loads)
        if "2" in parts:
            part2(cove, args, res, loads)
    except KeyboardInterrupt:
        rc = 130
    finally:
        try:
            cove.stop()
        finally:
            unmount_under(tmp)
            remove_new_globals(globals_before, libpod_before)
            shutil.rmtree(tmp, ignore_errors=True)
    res["wall_s"] = time.perf_counter() - t_start
    res["load_after"] = os.getloadavg()
    res["load_during"] = [min(loads), max(loads)] if loads else []
    res["leftovers"] = leftovers(tmp, cove, globals_before, libpod_before)
    if rc == 0:
        print_report(res, args)
    print("Cleanup check: " + ("nothing left behind" if not res["leftovers"] else
                               "LEFT: " + "; ".join(res["leftovers"])))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return rc or (1 if res["leftovers"] else 0)


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
    ld = res["load_during"]
    print(f"== Load average (1 min): {res['load_before'][0]:.2f} before, "
          f"{ld[0]:.2f}-{ld[1]:.2f} during, {res['load_after'][0]:.2f} after; "
          f"{res['wall_s']:.0f} s in all; Cove's writable layer: {res['layer']}")
    if "part1" in res:
        p1 = res["part1"]
        ref = p1["cove native"]["first"]
        print(f"== Create -> first output (`echo hi`): n={args.iterations * args.runs} "
              f"({args.iterations} iterations x {args.runs}, after {args.warmup} warm-up); "
              "milliseconds")
        print(f"{'what':34} {'n':>3} | {'p50':>7} {'p90':>7} {'mean':>7} | {'/ native p50':>12}")
        rows = []
        for name in res["part1_tools"]:
            x = p1[name]
            if name.startswith("cove"):
                rows.append((f"{name}: 202", x["create"], None))
                rows.append((f"{name}: + \"hi\" back", x["first"], ref))
                rows.append((f"{name}: delete", x["delete"], None))
            else:
                rows.append((f"{name}: \"hi\" out", x["first"], ref))
                rows.append((f"{name}: exit", x["cycle"], None))
        for name, s, r in rows:
            ratio = f"{s['p50'] / r['p50']:.2f}x" if r else ""
            print(f"{name:34} {s['n']:>3} | {fmt(s['p50']):>7} {fmt(s['p90']):>7} "
                  f"{fmt(s['mean']):>7} | {ratio:>12}")
        if not args.podman:
            print("podman skipped: --no-podman")
    if "part2" in res:
        p2 = res["part2"]
        print(f"== Inside a running sandbox: n={args.rounds} rounds after {args.loop_warmup} "
              "warm-up; milliseconds timed inside (bash $EPOCHREALTIME), client = the "
              "command's request to the end of its answer")
        for r, d in res["part2_sandboxes"].items():
            print(f"   {r}: the files' filesystem and uname -r: {d}")
        print(f"{'loop':22} {'runtime':7} {'n':>3} | {'p50':>7} {'p90':>7} {'mean':>7} | "
              f"{'client p50':>10} | {'/ native p50':>12}")
        for name, title, _ in LOOPS:
            base = p2["native"][name]["inside"]
            for r in RUNTIMES:
                s, c = p2[r][name]["inside"], p2[r][name]["client"]
                ratio = f"{s['p50'] / base['p50']:.2f}x" if r != "native" else ""
                print(f"{title:22} {r:7} {s['n']:>3} | {fmt(s['p50']):>7} {fmt(s['p90']):>7} "
                      f"{fmt(s['mean']):>7} | {fmt(c['p50']):>10} | {ratio:>12}")


if __name__ == "__main__":
    sys.exit(main())
