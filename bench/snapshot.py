#!/usr/bin/python3
"""Snapshot benchmark: how long Cove takes to snapshot a sandbox whose writable layer holds one
large file (--size-mib, 1 GiB by default, written from /dev/urandom inside; disk layer capped
at --disk), against what a user would otherwise do with the same amount of data, in the same
run on the same disk, each with the file's pages first dropped from the page cache (cold:
`dd iflag=nocache count=0`, POSIX_FADV_DONTNEED) and read into it (warm: `cat`), in turn:

  cove snapshot   POST /v1/sandboxes/{id}/snapshots until GET /v1/snapshots/{id} is Ready
                  (also: until its 202, and the longest `true` through the agent of the
                  source while it ran: how long the source was frozen, as a client sees it)
  tar             tar -cf of a host directory holding the same file
  cp -a           cp -a of that directory
  podman commit   of a running container (--runtime runc, overlay storage, busybox image)
                  that wrote the same amount (skipped with --no-podman or without podman)

Then a create from the snapshot against a create from the template (both POST until the
202, then `echo hi` through the agent until its output is back), interleaved, and podman run
of the committed image against the image it was made from.
Usage: bench/snapshot.py [--iterations N] [--size-mib N] [--disk SIZE] [--no-podman]
                         [--json FILE]     (as root, on a built tree: ninja -C build)"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(here), "tests"))
from covetest import serve  # noqa: E402
from machine import log, machine_info  # noqa: E402
from measure import percentile  # noqa: E402
from tools import Podman, libpod_cgroups, remove_new_globals, run_or_explain, \
    snapshot_globals  # noqa: E402

POLL_S = 0.005


def stats(values):
    ms = [v * 1000 for v in values]
    return {"n": len(ms), "p50": percentile(ms, 50), "p90": percentile(ms, 90),
            "min": min(ms) if ms else float("nan"), "max": max(ms) if ms else float("nan")}


CACHES = ("cold", "warm")


def limits(args):
    # memory above the file's size: its pages fit in the sandbox's page cache (a warm copy)
    return {"cpu": "1", "memory": "2Gi", "ephemeral-storage": args.disk}


def cache_command(path, cache):
    """A shell command that leaves path's pages out of (cold) or in (warm) the page cache: the
    same for the sandbox's file (its layer's ext4, on a loop device with direct I/O: nothing
    of it is cached twice) as for the host's."""
    if cache == "cold":
        return f"dd if={path} iflag=nocache count=0 status=none"  # POSIX_FADV_DONTNEED
    return f"cat {path} > /dev/null"


def cove_create(d, source, args):
    """POST until the 202, then `echo hi` until its output is back: (id, create s, first s)."""
    body = dict(source, entrypoint=["sleep", "infinity"], resourceLimits=limits(args),
                extensions={"cove.layer": "disk"})
    t0 = time.perf_counter()
    status, answer, _ = d.request("POST", "/v1/sandboxes", body)
    t_create = time.perf_counter() - t0
    if status != 202:
        raise RuntimeError(f"create {source}: HTTP {status}: {answer}")
    r = d.exec(answer["id"], "echo hi")
    t_first = time.perf_counter() - t0
    if r.stdout != "hi\n":
        raise RuntimeError(f"echo hi in {answer['id']}: {r.stdout!r} {r.stderr!r}")
    return answer["id"], t_create, t_first


class StallProbe:
    """Runs `true` through the source's agent back to back in a thread, keeping how long each
    took: a frozen sandbox answers none until it is thawed."""

    def __init__(self, d, sid):
        self.d, self.sid = d, sid
        self.samples = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop.is_set():
            t0 = time.perf_counter()
            r = self.d.exec(self.sid, "true")
            self.samples.append((t0, time.perf_counter() - t0))
            if r.exit_code != 0:
                raise RuntimeError(f"true in {self.sid}: {r.exit_code} {r.stderr}")

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(60)


def cove_snapshot(d, sid):
    """(snapshot id, POST -> 202 s, POST -> Ready s, the snapshot as GET answered)."""
    t0 = time.perf_counter()
    status, body, _ = d.request("POST", f"/v1/sandboxes/{sid}/snapshots", {}, timeout=600)
    t_accept = time.perf_counter() - t0
    if status != 202:
        raise RuntimeError(f"snapshot of {sid}: HTTP {status}: {body}")
    snap = body["id"]
    while True:
        got = d.ok("GET", f"/v1/snapshots/{snap}")
        if got["status"]["state"] != "Creating":
            break
        time.sleep(POLL_S)
    t_ready = time.perf_counter() - t0
    if got["status"]["state"] != "Ready":
        raise RuntimeError(f"snapshot {snap}: {got['status']}")
    return snap, t_accept, t_ready, got


def timed(argv, env=None):
    t0 = time.perf_counter()
    run_or_explain(argv, env=env)
    return time.perf_counter() - t0


def measure_cove(args, res):
    with serve() as d:
        if "disk layers: available" not in d.log() and "disk layers available" not in d.log():
            raise RuntimeError("coved has no disk layers here (no loop devices or mke2fs)")
        src, _, _ = cove_create(d, {"image": {"uri": "base"}}, args)
        log(f"cove: writing {args.size_mib} MiB into sandbox {src} ...")
        d.sh(src, f"mkdir -p /home/data && head -c {args.size_mib}M /dev/urandom "
                  f"> /home/data/big && sync", http_timeout=900)
        size = int(d.sh(src, "stat -c %s /home/data/big"))
        # The probe's own round trip while nothing is frozen, for comparison.
        with StallProbe(d, src) as idle:
            time.sleep(1.0)
        snap_times = {c: {"accept": [], "ready": [], "stall": []} for c in CACHES}
        create = {"snapshot": {"create": [], "first": []}, "template": {"create": [], "first": []}}
        deletes = []
        for i in range(args.warmup + args.iterations):
            counted = i >= args.warmup
            log(f"cove: snapshots {i + 1}/{args.warmup + args.iterations}"
                f"{'' if counted else ' (warm-up)'} ...")
            snaps = []
            for cache in (CACHES if i % 2 == 0 else CACHES[::-1]):
                d.sh(src, cache_command("/home/data/big", cache), http_timeout=600)
                with StallProbe(d, src) as probe:
                    time.sleep(0.2)
                    t_start = time.perf_counter()
                    snap, t_accept, t_ready, got = cove_snapshot(d, src)
                    t_end = time.perf_counter()
                    time.sleep(0.2)
                snaps.append(snap)
                # The longest probe that overlapped the snapshot.
                during = [dt for t0, dt in probe.samples if t0 < t_end and t0 + dt > t_start]
                if counted:
                    snap_times[cache]["accept"].append(t_accept)
                    snap_times[cache]["ready"].append(t_ready)
                    snap_times[cache]["stall"].append(max(during) if during else 0.0)
                    res.setdefault("snapshot_messages", []).append(got["status"]["message"])
            # From the snapshot and from the template, in turn first (drift hits both alike).
            order = ("snapshot", "template") if i % 2 == 0 else ("template", "snapshot")
            for kind in order:
                source = {"snapshotId": snap} if kind == "snapshot" else {"image": {"uri": "base"}}
                sid, t_create, t_first = cove_create(d, source, args)
                if kind == "snapshot":
                    copied = int(d.sh(sid, "stat -c %s /home/data/big"))
                    if copied != size:
                        raise RuntimeError(f"the copy holds {copied} bytes, not {size}")
                d.delete(sid)
                if counted:
                    create[kind]["create"].append(t_create)
                    create[kind]["first"].append(t_first)
            for snap in snaps:
                t0 = time.perf_counter()
                d.ok("DELETE", f"/v1/snapshots/{snap}", expect=(204,))
                if counted:
                    deletes.append(time.perf_counter() - t0)
        d.delete(src)
    res["bytes"] = size
    res["cove"] = {c: {k: stats(v) for k, v in m.items()} for c, m in snap_times.items()}
    res["probe_idle"] = stats([dt for _, dt in idle.samples])
    res["delete_snapshot"] = stats(deletes)
    res["create"] = {kind: {k: stats(v) for k, v in m.items()} for kind, m in create.items()}


def measure_host(args, res, tmp):
    tree = os.path.join(tmp, "tree")
    os.makedirs(os.path.join(tree, "home", "data"))
    big = os.path.join(tree, "home", "data", "big")
    log(f"host: writing {args.size_mib} MiB into {tree} ...")
    run_or_explain(["sh", "-c", f"head -c {args.size_mib}M /dev/urandom > {big} && sync"])
    times = {c: {"tar": [], "cp": []} for c in CACHES}
    archive, copy = os.path.join(tmp, "out.tar"), os.path.join(tmp, "copy")
    for i in range(args.warmup + args.iterations):
        for cache in (CACHES if i % 2 == 0 else CACHES[::-1]):
            run_or_explain(["sh", "-c", cache_command(big, cache)])
            t_tar = timed(["tar", "-cf", archive, "-C", tree, "."])
            os.unlink(archive)
            run_or_explain(["sh", "-c", cache_command(big, cache)])
            t_cp = timed(["cp", "-a", tree, copy])
            shutil.rmtree(copy)
            if i >= args.warmup:
                times[cache]["tar"].append(t_tar)
                times[cache]["cp"].append(t_cp)
    shutil.rmtree(tree)
    res["host"] = {c: {k: stats(v) for k, v in m.items()} for c, m in times.items()}


def measure_podman(args, res, tmp):
    p = Podman(tmp)
    flags = ["--network", "none", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
    times = {"commit": [], "run_committed": [], "run_image": []}
    try:
        p.setup()
        log(f"podman: a container writing {args.size_mib} MiB ...")
        run_or_explain(p.base() + ["run", "-d", "--name", "snapsrc"] + flags + [
            p.image, "sh", "-c", f"busybox mkdir -p /home/data && busybox head -c "
            f"{args.size_mib * 1048576} /dev/urandom > /home/data/big && busybox sync && "
            f"busybox touch /ready && sleep 3600"], env=p.env)
        deadline = time.time() + 900
        while subprocess.run(p.base() + ["exec", "snapsrc", "busybox", "test", "-f", "/ready"],
                             env=p.env, capture_output=True).returncode != 0:
            if time.time() > deadline:
                raise RuntimeError("the podman container did not finish writing")
            time.sleep(0.2)
        for i in range(args.warmup + args.iterations):
            image = f"localhost/cove-bench-snap{i}"
            t_commit = timed(p.base() + ["commit", "-q", "snapsrc", image], env=p.env)
            runs = {}
            for kind in (("committed", "image") if i % 2 == 0 else ("image", "committed")):
                runs[kind] = timed(p.base() + ["run", "--rm"] + flags + [
                    image if kind == "committed" else p.image, "echo", "hi"], env=p.env)
            run_or_explain(p.base() + ["rmi", "-f", image], env=p.env)
            if i >= args.warmup:
                times["commit"].append(t_commit)
                times["run_committed"].append(runs["committed"])
                times["run_image"].append(runs["image"])
    finally:
        p.cleanup()
    res["podman"] = {k: stats(v) for k, v in times.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--disk", default="2Gi", help="the sandbox's ephemeral-storage (2Gi)")
    ap.add_argument("--no-podman", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/snapshot.py: run as root", file=sys.stderr)
        return 2
    res = {"machine": machine_info(), "iterations": args.iterations, "size_mib": args.size_mib}
    tmp = tempfile.mkdtemp(prefix="cove-bench-snapshot-")
    globals_before, libpod_before = snapshot_globals(), libpod_cgroups()
    try:
        measure_cove(args, res)
        measure_host(args, res, tmp)
        if args.no_podman:
            res["podman_skipped"] = "--no-podman"
        elif shutil.which("podman") is None or shutil.which("runc") is None:
            res["podman_skipped"] = "podman or runc is not installed"
        else:
            measure_podman(args, res, tmp)
    finally:
        remove_new_globals(globals_before, libpod_before)
        shutil.rmtree(tmp, ignore_errors=True)
    print_report(res, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


def print_report(res, args):
    m = res["machine"]
    print(f"== Machine: {m['cpu']}, {m['cores']} cores; RAM {m['ram_gib']} GiB; "
          f"kernel {m['kernel']}; {m['os']}; cgroups {m['cgroups']}; python "
          f"{platform.python_version()}")
    mib = res["bytes"] / 1048576
    print(f"== Snapshot of {mib:.0f} MiB (one file from /dev/urandom), n={args.iterations} each "
          f"after {args.warmup} warm-up; the file's pages out of (cold) or in (warm) the page "
          f"cache first; ms")
    print(f"{'what':44} {'cache':5} | {'p50':>8} {'p90':>8} {'min':>8} | {'MiB/s':>6} | "
          f"{'/ cove':>6}")

    def row(name, cache, s, base):
        rate = mib / (s["p50"] / 1000) if s["p50"] > 0 else float("nan")
        ratio = f"{s['p50'] / base['p50']:.2f}x" if base else ""
        print(f"{name:44} {cache:5} | {s['p50']:>8.1f} {s['p90']:>8.1f} {s['min']:>8.1f} | "
              f"{rate:>6.0f} | {ratio:>6}")
    for cache in CACHES:
        c = res["cove"][cache]
        row("cove snapshot (POST -> Ready)", cache, c["ready"], c["ready"])
        print(f"{'  of which POST -> 202':44} {'':5} | {c['accept']['p50']:>8.1f} "
              f"{c['accept']['p90']:>8.1f} {c['accept']['min']:>8.1f} |")
        print(f"{'  source stalled (longest `true` meanwhile)':44} {'':5} | "
              f"{c['stall']['p50']:>8.1f} {c['stall']['p90']:>8.1f} {c['stall']['min']:>8.1f} |")
        h = res["host"][cache]
        row("tar -cf of the same tree, host", cache, h["tar"], c["ready"])
        row("cp -a of the same tree, host", cache, h["cp"], c["ready"])
    if "podman" in res:
        row("podman commit (runc, overlay; cache as left)", "", res["podman"]["commit"],
            res["cove"]["warm"]["ready"])
    else:
        print(f"podman commit: skipped ({res.get('podman_skipped')})")
    idle = res["probe_idle"]
    print(f"`true` through the agent while nothing is frozen: p50 {idle['p50']:.1f} ms, max "
          f"{idle['max']:.1f}; snapshot delete p50 {res['delete_snapshot']['p50']:.1f} ms")
    print(f"the last snapshot said: {res['snapshot_messages'][-1]}")
    cr = res["create"]
    s, t = cr["snapshot"], cr["template"]
    print("== Create, from the snapshot vs from the template (interleaved), ms")
    print(f"{'source':10} | {'create p50':>10} {'p90':>7} | {'+ echo hi p50':>13} {'p90':>7}")
    for name, x in (("snapshot", s), ("template", t)):
        print(f"{name:10} | {x['create']['p50']:>10.1f} {x['create']['p90']:>7.1f} | "
              f"{x['first']['p50']:>13.1f} {x['first']['p90']:>7.1f}")
    print(f"ratio snapshot/template: create p50 {s['create']['p50'] / t['create']['p50']:.2f}x, "
          f"+ echo hi p50 {s['first']['p50'] / t['first']['p50']:.2f}x")
    if "podman" in res:
        pr = res["podman"]
        print(f"podman run --rm echo hi: committed image p50 {pr['run_committed']['p50']:.1f} ms, "
              f"its base image p50 {pr['run_image']['p50']:.1f} ms "
              f"({pr['run_committed']['p50'] / pr['run_image']['p50']:.2f}x)")


if __name__ == "__main__":
    sys.exit(main())
