#!/usr/bin/python3
"""Writable-layer benchmark: what a disk layer (an ext4 image on a loop device, copied from a
formatted template) costs a create against a tmpfs layer, in one run on one coved, creates of
both kinds interleaved so that drift hits both alike. Per iteration, for each layer:

  create   POST /v1/sandboxes until its 202 (the sandbox is Running: its layer is mounted)
  first    the same, plus `echo hi` through the agent until its output is back
  delete   DELETE until its 204 (the loop device and the image are gone with it)

Then the same create, echo and delete cycles, --concurrency at once; the first create of a
size no sandbox had before (the template is formatted by mke2fs then: once per size); and
sequential write throughput inside (dd of --write-mib MiB, then sync) on each layer.
Usage: bench/layer.py [--iterations N] [--concurrency N] [--write-mib N] [--json FILE]
(as root, on a built tree: ninja -C build)"""
import argparse
import concurrent.futures
import json
import os
import platform
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(here), "tests"))
from covetest import serve  # noqa: E402
from machine import machine_info  # noqa: E402
from measure import percentile  # noqa: E402

LIMITS = {"cpu": "1", "memory": "512Mi", "ephemeral-storage": "256Mi"}


def create(d, layer, limits=LIMITS):
    t0 = time.perf_counter()
    status, body, _ = d.request("POST", "/v1/sandboxes", {
        "image": {"uri": "base"}, "entrypoint": ["sleep", "infinity"], "resourceLimits": limits,
        "extensions": {"cove.layer": layer}})
    t_create = time.perf_counter() - t0
    if status != 202:
        raise RuntimeError(f"create ({layer}): HTTP {status}: {body}")
    sid = body["id"]
    r = d.exec(sid, "echo hi")
    t_first = time.perf_counter() - t0
    if r.stdout != "hi\n":
        raise RuntimeError(f"echo hi in {sid} ({layer}): {r.stdout!r} {r.stderr!r}")
    return sid, t_create, t_first


def delete(d, sid):
    t0 = time.perf_counter()
    d.delete(sid)
    return time.perf_counter() - t0


def stats(values):
    ms = [v * 1000 for v in values]
    return {"n": len(ms), "p50": percentile(ms, 50), "p90": percentile(ms, 90),
            "max": max(ms) if ms else float("nan")}


def write_throughput(d, layer, mib):
    limits = dict(LIMITS, **{"ephemeral-storage": f"{mib + 256}Mi"})
    if layer == "tmpfs":
        limits["memory"] = f"{mib + 512}Mi"
    sid, _, _ = create(d, layer, limits)
    try:
        t0 = time.perf_counter()
        r = d.exec(sid, f"dd if=/dev/zero of=/home/w bs=1M count={mib} status=none && sync",
                   http_timeout=600)
        wall = time.perf_counter() - t0
        if r.exit_code != 0:
            raise RuntimeError(f"dd ({layer}): {r.stderr}")
        return mib / wall
    finally:
        d.delete(sid)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--concurrency", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--write-mib", type=int, default=1024)
    ap.add_argument("--json")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/layer.py: run as root", file=sys.stderr)
        return 2
    layers = ("disk", "tmpfs")
    res = {"machine": machine_info(), "iterations": args.iterations}
    with serve() as d:
        if "disk layers: available" not in d.log() and "disk layers available" not in d.log():
            print("bench/layer.py: coved has no disk layers here (no loop devices or mke2fs)",
                  file=sys.stderr)
            return 2
        for _ in range(args.warmup):
            for layer in layers:
                sid, _, _ = create(d, layer)
                delete(d, sid)
        seq = {layer: {"create": [], "first": [], "delete": []} for layer in layers}
        for i in range(args.iterations):
            # Alternate which goes first: neither always follows the other's delete.
            for layer in (layers if i % 2 == 0 else layers[::-1]):
                sid, c, f = create(d, layer)
                seq[layer]["create"].append(c)
                seq[layer]["first"].append(f)
                seq[layer]["delete"].append(delete(d, sid))
        res["sequential"] = {layer: {k: stats(v) for k, v in m.items()}
                             for layer, m in seq.items()}
        conc = {}
        for layer in layers:
            def cycle(_):  # at most --concurrency live at once
                made = create(d, layer)
                delete(d, made[0])
                return made
            with concurrent.futures.ThreadPoolExecutor(args.concurrency) as ex:
                t0 = time.perf_counter()
                made = list(ex.map(cycle, range(args.iterations)))
                wall = time.perf_counter() - t0
            conc[layer] = {"create": stats([m[1] for m in made]),
                           "first": stats([m[2] for m in made]),
                           "cycles_per_s": len(made) / wall}
        res["concurrent"] = conc
        # A size no sandbox had: its template is formatted first (mke2fs), once.
        cold = []
        for k in range(5):
            size = {"ephemeral-storage": f"{3000 + k}Mi"}
            sid, c, _ = create(d, "disk", dict(LIMITS, **size))
            delete(d, sid)
            sid, c2, _ = create(d, "disk", dict(LIMITS, **size))
            delete(d, sid)
            cold.append((c, c2))
        res["new_size"] = {"first": stats([c for c, _ in cold]),
                           "second": stats([c2 for _, c2 in cold])}
        if args.write_mib > 0:
            res["write_mib_per_s"] = {layer: write_throughput(d, layer, args.write_mib)
                                      for layer in layers}
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
    print(f"== Create latency, disk layer vs tmpfs layer ({LIMITS['ephemeral-storage']} cap, "
          f"base template), ms")
    for mode, title in (("sequential", f"sequential, interleaved, n={args.iterations} each"),
                        ("concurrent", f"{args.concurrency} at once, n={args.iterations} each")):
        r = res[mode]
        print(f"-- {title}")
        print(f"{'layer':6} | {'create p50':>10} {'p90':>7} | {'first p50':>9} {'p90':>7}"
              + (f" | {'delete p50':>10} {'p90':>7}" if mode == "sequential" else
                 f" | {'cycles/s':>9}"))
        for layer in ("disk", "tmpfs"):
            x = r[layer]
            tail = (f" | {x['delete']['p50']:>10.1f} {x['delete']['p90']:>7.1f}"
                    if mode == "sequential" else f" | {x['cycles_per_s']:>9.1f}")
            print(f"{layer:6} | {x['create']['p50']:>10.1f} {x['create']['p90']:>7.1f} | "
                  f"{x['first']['p50']:>9.1f} {x['first']['p90']:>7.1f}" + tail)
        d, t = r["disk"], r["tmpfs"]
        print(f"ratio disk/tmpfs: create p50 {d['create']['p50'] / t['create']['p50']:.2f}x, "
              f"p90 {d['create']['p90'] / t['create']['p90']:.2f}x; first p50 "
              f"{d['first']['p50'] / t['first']['p50']:.2f}x")
    n = res["new_size"]
    print(f"-- first create of a new size (template formatted by mke2fs) p50 "
          f"{n['first']['p50']:.1f} ms, p90 {n['first']['p90']:.1f}; the next one of that size "
          f"p50 {n['second']['p50']:.1f} ms")
    if "write_mib_per_s" in res:
        w = res["write_mib_per_s"]
        print(f"-- dd {args.write_mib} MiB + sync inside: disk {w['disk']:.0f} MiB/s, tmpfs "
              f"{w['tmpfs']:.0f} MiB/s")


if __name__ == "__main__":
    sys.exit(main())
