#!/usr/bin/python3
"""Cove start-up, memory and exec benchmark. Run it through bench/run.sh (as root).

Measures, for Cove and for bwrap, crun and podman (runc) doing the same job:
start an isolated environment, run `echo hi`, read its first output, tear it down.

  first  = from the start of the request until "hi" reaches the client
  cycle  = the same, plus waiting for the end of the command and the teardown

Three modes: sequential (back to back), concurrent (a fixed number in flight, in threads)
and idle (one at a time after a pause, as a lone request on a quiet host would see it).
Then the host memory an idle, paused Cove sandbox costs.

And the exec part: the round trip of `echo hi` in an environment that is already running
(Cove: POST .../proxy/44772/command on a kept-alive connection; podman exec; crun exec).

  first  = from the start of the request until "hi" reaches the client
  done   = until the end of the event stream (Cove) or the exit of the exec command

--only startup,memory,exec picks the parts (default: all three).

Parts: tools.py (how each tool is started and driven; coved through the test suite's launcher,
tests/covetest.py), measure.py (timing loops, percentiles, memory), report.py (tables, ratios),
machine.py (the host's description, /proc and /sys), code_interpreter.py (the code part).

Only the Python 3 standard library is used. Everything made (coved and its state dir,
sandboxes, the busybox rootfs, the OCI bundle, podman's storage, containers, cgroups,
mounts) is removed at the end, also on failure or Ctrl-C."""

import argparse
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import code_interpreter
from machine import cgroup_mode, log, machine_info, mounts_under, now, umount, unmount_under
from measure import measure_container_tool, measure_cove_exec, measure_exec, measure_memory, \
    measure_tool
from report import print_report
from tools import (Bwrap, Cove, Crun, HostExec, Podman, ProcExec, crun_leftovers, libpod_cgroups,
                   remove_new_globals, snapshot_globals)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("COVE_BUILD_DIR", os.path.join(ROOT, "build"))


# ---------------------------------------------------------------- crun in a private mount namespace

HIDDEN_UNIFIED_NOTE = ("; run in a private mount namespace with the empty cgroup2 mount "
                       "/sys/fs/cgroup/unified hidden (crun refuses hybrid mode), so it uses v1")


def run_crun_isolated(args, tmp, parts):
    """crun 1.8 refuses cgroup "hybrid" mode (v1 controllers plus a cgroup2 mount at
    /sys/fs/cgroup/unified). Run the crun part in a private mount namespace where that
    (controller-less) cgroup2 mount is hidden, so crun sees a plain v1 host."""
    out_path = os.path.join(tmp, "crun-result.json")
    cmd = ["unshare", "--mount", "--propagation", "private",
           sys.executable, os.path.abspath(__file__), "--worker", "crun", "--worker-hide-unified",
           "--worker-tmp", tmp, "--worker-out", out_path, "--only", ",".join(sorted(parts)),
           "--iterations", str(args.iterations), "--concurrency", str(args.concurrency),
           "--warmup", str(args.warmup), "--idle-iterations", str(args.idle_iterations),
           "--idle-gap", str(args.idle_gap), "--slow-threshold", str(args.slow_threshold),
           "--slow-iterations", str(args.slow_iterations),
           "--exec-iterations", str(args.exec_iterations)]
    proc = subprocess.Popen(cmd)
    try:
        rc = proc.wait()
    except KeyboardInterrupt:
        # Not subprocess.run: it would SIGKILL the worker, which then could not delete its
        # containers (the exec part's is detached and would keep running). Ask it to stop
        # and clean up, and wait for that.
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        raise
    if rc != 0:
        raise subprocess.CalledProcessError(rc, cmd)
    out = json.load(open(out_path))
    for res in out.values():
        if res:
            res["note"] += HIDDEN_UNIFIED_NOTE
    return out["startup"], out["exec"]


def delete_crun_leftovers(tmp):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "crun-cleanup",
           "--worker-tmp", tmp, "--worker-out", os.devnull]
    if cgroup_mode() == "hybrid":
        cmd = ["unshare", "--mount", "--propagation", "private"] + cmd + \
            ["--worker-hide-unified"]
    try:
        subprocess.run(cmd, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        log(f"cleanup: crun containers: {e}")


def raise_interrupt(signum, frame):
    # Once: a second signal (Ctrl-C reaches a worker, then its parent's SIGTERM) must not
    # interrupt the clean-up the first one started.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signum}")


def catch_signals():
    """SIGINT, SIGTERM and SIGHUP become KeyboardInterrupt so that `finally` cleans up (also
    when the bench was started with SIGINT ignored, as `cmd &` does)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, raise_interrupt)


def worker_main(args):
    catch_signals()
    if args.worker_hide_unified:
        umount("/sys/fs/cgroup/unified")  # in this private mount namespace only
    if args.worker == "crun-cleanup":
        # Backstop after a failed worker: delete this run's crun containers, seeing v1.
        Crun(args.worker_tmp).cleanup()
        return
    tool = {"crun": Crun}[args.worker](args.worker_tmp)
    start, ex = measure_container_tool(tool, args, set(args.only.split(",")))
    json.dump({"startup": start, "exec": ex}, open(args.worker_out, "w"))



# ---------------------------------------------------------------- main

def leftovers(tmp, cove, crun_prefix, globals_before, libpod_before):
    left = []
    if mounts_under(tmp):
        left.append(f"mounts {mounts_under(tmp)}")
    if os.path.exists(tmp):
        left.append(f"temp dir {tmp}")
    if cove:
        left += cove.leftovers()
    left += [f"crun container {c}" for c in crun_leftovers(crun_prefix)]
    left += [f"cgroup {d}" for d in glob.glob(f"/sys/fs/cgroup/*/{crun_prefix}*")]
    for path, existed in globals_before.items():
        if not existed and os.path.lexists(path):
            left.append(f"path {path}")
    if not libpod_before:
        left += [f"cgroup {d}" for d in libpod_cgroups()]
    for p in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            if tmp.encode() in open(p, "rb").read():
                left.append(f"process {p.split('/')[2]}")
        except OSError:
            pass
    return left



def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=100,
                    help="iterations per tool of the start-up part, sequential and concurrent "
                         "(default 100)")
    ap.add_argument("--concurrency", type=int, default=20, help="in flight at once (default 20)")
    ap.add_argument("--warmup", type=int, default=3, help="uncounted iterations (default 3)")
    ap.add_argument("--memory-sandboxes", type=int, default=20,
                    help="paused idle sandboxes for the memory measurement (default 20)")
    ap.add_argument("--tools", default="cove,host,bwrap,crun,podman",
                    help="comma-separated subset of cove,host,bwrap,crun,podman")
    ap.add_argument("--idle-iterations", type=int, default=20,
                    help="iterations of the idle mode: one at a time, after a pause (default 20;"
                         " 0 skips it)")
    ap.add_argument("--idle-gap", type=float, default=0.1,
                    help="pause before each idle-mode iteration, seconds (default 0.1)")
    ap.add_argument("--memory-rounds", type=int, default=5,
                    help="repetitions of the memory measurement; the median is reported")
    ap.add_argument("--slow-threshold", type=float, default=1.0,
                    help="seconds per iteration above which a tool runs fewer iterations")
    ap.add_argument("--slow-iterations", type=int, default=20)
    ap.add_argument("--coved", default=os.path.join(BUILD, "src", "coved", "coved"))
    ap.add_argument("--agent", default=os.path.join(BUILD, "src", "agent", "cove-agent"))
    ap.add_argument("--cove-layer", choices=("disk", "tmpfs"),
                    help="coved's --layer: the sandboxes' writable layer (default coved's, "
                         "disk; bench/layer.py compares the two)")
    ap.add_argument("--cove-state-parent",
                    help="make coved's state dir under this directory instead of the bench's "
                         "temp dir (e.g. /dev/shm to take the disk out of the picture)")
    ap.add_argument("--only", default="startup,memory,exec,code",
                    help="comma-separated parts to run: startup (create, echo hi, delete), "
                         "memory (paused idle Cove sandboxes), exec (echo hi in a running "
                         "environment), code (1+1 in a python kernel: Cove and, with the host "
                         "tool, jupyter_client on the host); default all four")
    ap.add_argument("--code-iterations", type=int, default=200,
                    help="1+1 round trips in a running kernel (default 200)")
    ap.add_argument("--code-start-iterations", type=int, default=10,
                    help="sandbox (or host kernel) starts to a first result, per variant "
                         "(default 10)")
    ap.add_argument("--code-think-iterations", type=int, default=5,
                    help="first runs 1.5 s after the create, per variant (default 5)")
    ap.add_argument("--exec-iterations", type=int, default=200,
                    help="iterations of the exec part per tool, sequential (and, for Cove, "
                         "concurrent) (default 200; 0 skips it)")
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--worker-tmp", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    ap.add_argument("--worker-hide-unified", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        try:
            worker_main(args)
        except KeyboardInterrupt:
            return 130
        return 0
    if os.geteuid() != 0:
        log("bench: run as root (namespaces, cgroups, mounts)")
        return 2
    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    parts = {p.strip() for p in args.only.split(",") if p.strip()}
    bad = parts - {"startup", "memory", "exec", "code"} or \
        set(tools) - {"cove", "host", "bwrap", "crun", "podman"}
    if bad:
        log(f"bench: unknown part or tool: {', '.join(sorted(bad))}")
        return 2
    if args.memory_sandboxes <= 0:
        parts.discard("memory")
    if args.exec_iterations <= 0:
        parts.discard("exec")

    catch_signals()

    t_start = now()
    globals_before = snapshot_globals()  # first: even `crun --version` makes /run/crun
    info = machine_info()
    libpod_before = bool(libpod_cgroups())
    tmp = tempfile.mkdtemp(prefix="cove-bench-")
    results, memory, exec_results, code_results = [], None, [], []
    cove = None
    crun_prefix = os.path.basename(tmp) + "-"
    rc = 0
    try:
        if "cove" in tools:
            log("cove: starting coved ...")
            cove = Cove(tmp, args.coved, args.agent, args.cove_state_parent, args.cove_layer)
            cove.start()
            if args.cove_state_parent:
                cove.note += f"; state dir under {args.cove_state_parent}"
            cove.note += f"; writable layer: {args.cove_layer or 'coved default (disk)'}"
            # Memory first, while few pages freed by this run itself sit on per-CPU free lists
            # (see the note printed with the result).
            if "memory" in parts:
                memory = measure_memory(cove, args.memory_sandboxes, args.memory_rounds)
            if "startup" in parts:
                results.append(measure_tool(cove, args))
            if "exec" in parts:
                log("cove: exec: one running sandbox ...")
                exec_results += measure_cove_exec(cove, args)
            if "code" in parts:
                log("cove: code interpreter ...")
                code_results.append(code_interpreter.measure_cove(cove, args))
        if "code" in parts and "host" in tools:
            log("host: code interpreter (jupyter_client) ...")
            code_results.append(code_interpreter.measure_host(args))
        for name in tools:
            if name == "cove" or not parts & {"startup", "exec"}:
                continue
            if name == "bwrap" and "startup" not in parts:
                continue  # no exec into a running bwrap
            log(f"{name}: ...")
            start = ex = None
            if name == "crun" and cgroup_mode() == "hybrid":
                start, ex = run_crun_isolated(args, tmp, parts)
            elif name in ("crun", "podman"):
                cls = {"crun": Crun, "podman": Podman}[name]
                start, ex = measure_container_tool(cls(tmp), args, parts)
            else:
                tool = {"host": HostExec, "bwrap": Bwrap}[name](tmp)
                try:
                    tool.setup()
                    if "startup" in parts:
                        start = measure_tool(tool, args)
                    if "exec" in parts and name == "host":
                        ex = measure_exec(ProcExec(tool), args)
                finally:
                    tool.cleanup()
            if start:
                results.append(start)
            if ex:
                exec_results.append(ex)
    except KeyboardInterrupt as e:
        log(f"bench: interrupted ({e}); cleaning up")
        rc = 130
    except Exception as e:  # noqa: BLE001 - report, clean up, fail
        log(f"bench: FAILED: {e}")
        if cove:
            log("coved log tail:\n" + cove.log())
        rc = 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if cove:
            cove.stop()
        if crun_leftovers(crun_prefix):  # only if a crun worker died without cleaning up
            delete_crun_leftovers(tmp)
        unmount_under(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        remove_new_globals(globals_before, libpod_before)
        left = leftovers(tmp, cove, crun_prefix, globals_before, libpod_before)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if results or memory or exec_results or code_results:
        print_report(info, results, memory, exec_results, args, now() - t_start, code_results)
    print()
    print("Cleanup check: " + ("nothing left behind (coved, sandboxes, cgroups, mounts, "
                               "containers, temp dir)" if not left else "LEFT: " + "; ".join(left)))
    if left and rc == 0:
        rc = 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": info, "results": results, "memory": memory,
                       "exec": exec_results, "code": code_results, "leftovers": left}, f,
                      indent=1)
    return rc


if __name__ == "__main__":
    sys.exit(main())
