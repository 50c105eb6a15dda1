#!/usr/bin/python3
"""Warm pool benchmark (issue 14): a sandbox from a pool against one made cold, and against
bubblewrap and crun doing the same job, in one run, on one coved (bench/tools.py's Cove:
private copies of the build's binaries, its own state dir and port, base template, cpu 1,
memory 512Mi).

  cove cold        POST /v1/sandboxes {"image": {"uri": "base"}, entrypoint sleep infinity,
                   memory 512Mi: not the pools' shape (500Mi), so never served from one}
                   until its 202, then POST .../proxy/44772/command `echo hi` on a new
                   connection until "hi" is back (create -> first output); DELETE untimed
  cove pooled      the same create naming a pool of that shape (extensions.poolRef), served
                   from it: the claim (thaw, env and entrypoint handed to the agent) until its
                   202, then the same `echo hi`. Before each iteration the bench waits, untimed,
                   until the pool has an idle sandbox again (the pool's refill is not what is
                   measured: a claim when the pool has stock is)
  bwrap            bwrap --unshare-all over the host's /usr, /usr/bin/echo hi (tools.Bwrap)
  crun run         `crun run` of a busybox-static bundle (runtimes.HybridCrun: in a private
                   mount namespace with /sys/fs/cgroup/unified hidden on a hybrid host)
  podman           podman --runtime runc run --rm of the busybox image (tools.Podman), every
                   --podman-every'th iteration only (it is two orders of magnitude slower)

  code cold        a code-interpreter sandbox made cold (its agent prestarts the python
                   kernel), then at once POST /code {"code": "1+1", "context": {"language":
                   "python"}} until the result `2`
  code pooled      the same from a pool of code-interpreter sandboxes (their kernels started
                   before they were frozen); and the second run_code in it, for comparison
  api quiet /      GET /v1/pools/bench back to back, 100 times, with nothing else going on,
  api refilling    then right after the pool's buffer went from 4 to 24 (20 fills, 4 at a
                   time): what a fill's set-up costs every other API call

  ... 20 at once   cove cold, bwrap and crun run, 20 in flight (threads), 100 each
  ... idle         the same one at a time, 100 ms apart, 20 each, the kinds in turn

Iterations take the kinds in turn (drift hits them alike); warm-ups are not counted. Prints
p50/p90/p99 and the ratios, and with --plot FILE draws the distributions (matplotlib, run
with a python that has it: the bench itself needs only the standard library).

Usage: bench/pools.py [--iterations N] [--code-iterations N] [--warmup N] [--no-crun]
[--podman-every N] [--concurrent-iterations N] [--idle-iterations N] [--json FILE]
[--plot FILE]  (as root, on a built tree: scripts/build.sh); bench/pools.py --replot JSON
[--density DENSITY_JSON] --plot FILE redraws a run's plot, with bench/density.py's too"""
import argparse
import json
import os
import shutil
import socket
import sys
import tempfile
import time

import bench  # noqa: F401 - catch_signals
from machine import log, machine_info, now, unmount_under
from measure import percentile, run_concurrent
from runtimes import HybridCrun
from tools import AGENT_PORT, Bwrap, Cove, EventStream, Podman, crun_leftovers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("COVE_BUILD_DIR", os.path.join(ROOT, "build"))
LIMITS = {"cpu": "1", "memory": "512Mi"}  # cold creates (tools.Cove.create's shape too)
# The pools' shape differs from the cold creates' in memory alone: a create of a pool's shape
# is served from the pool even without poolRef, and a "cold" create must never be.
POOL_LIMITS = {"cpu": "1", "memory": "500Mi"}
CONCURRENCY = 20
IDLE_GAP_S = 0.1


def pool_spec(name, template, buffer_max):
    return {"name": name, "template": template, "resourceLimits": dict(POOL_LIMITS),
            "capacitySpec": {"bufferMin": buffer_max, "bufferMax": buffer_max, "poolMin": 0,
                             "poolMax": 1000}}


def wait_available(cove, name, want=1, timeout=300):
    deadline = time.time() + timeout
    while True:
        status, payload = cove.request("GET", f"/v1/pools/{name}")
        st = json.loads(payload)["status"] if status == 200 else {}
        if st.get("available", 0) >= want and st.get("pending", 1) == 0:
            return
        if time.time() > deadline:
            raise RuntimeError(f"pool {name} never had {want} available: {payload[:300]!r}")
        time.sleep(0.02)


def create(cove, body):
    t0 = now()
    status, payload = cove.request("POST", "/v1/sandboxes", body)
    t1 = now()
    if status != 202:
        raise RuntimeError(f"create: HTTP {status}: {payload[:300]!r}")
    sid = json.loads(payload)["id"]
    with cove.lock:
        cove.ids.add(sid)
        cove.all_ids.add(sid)
    return sid, t1 - t0


def cold_body(template="base"):
    return {"image": {"uri": template}, "entrypoint": ["sleep", "infinity"],
            "resourceLimits": dict(LIMITS)}


def echo_once(cove, body):
    t0 = now()
    sid, claim_s = create(cove, body)
    t_first, _ = cove.exec_first(sid)
    first = t_first - t0
    cove.delete(sid)
    return {"first": first, "create": claim_s}


class CodeRun:
    """POST /code through the gateway on a new connection, until the result `2`."""

    @staticmethod
    def once(cove, sid):
        body = json.dumps({"code": "1+1", "context": {"language": "python"}}).encode()
        req = (f"POST /sandboxes/{sid}/proxy/{AGENT_PORT}/code HTTP/1.1\r\n"
               f"Host: 127.0.0.1\r\nOPEN-SANDBOX-API-KEY: {cove.key}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        t0 = now()
        s = socket.create_connection(("127.0.0.1", cove.port), timeout=120)
        try:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.sendall(req + body)
            stream = EventStream()
            t_result = None
            while not stream.done:
                data = s.recv(65536)
                if not data:
                    break
                for ev in stream.feed(data):
                    if ev.get("type") == "result" and t_result is None and \
                            "2" == str(ev.get("results", {}).get("text", "")).strip():
                        t_result = now()
        finally:
            s.close()
        if t_result is None:
            raise RuntimeError(f"run_code in {sid}: {stream.status} {stream.events!r}")
        return t_result - t0


def code_once(cove, body):
    t0 = now()
    sid, claim_s = create(cove, body)
    first = CodeRun.once(cove, sid)
    second = CodeRun.once(cove, sid)
    total = now() - t0 - second
    cove.delete(sid)
    return {"first": total, "create": claim_s, "run_first": first, "run_second": second}


def api_latencies(cove, n):
    """GET /v1/pools/bench, back to back on a kept-alive connection: what any API call waits
    for the event loop."""
    out = []
    for _ in range(n):
        t0 = now()
        cove.request("GET", "/v1/pools/bench")
        out.append({"first": now() - t0})
    return out


def stats(values):
    ms = [v * 1000 for v in values]
    return {"n": len(ms), "p50": percentile(ms, 50), "p90": percentile(ms, 90),
            "p99": percentile(ms, 99), "min": min(ms), "max": max(ms)} if ms else {"n": 0}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--code-iterations", type=int, default=20)
    ap.add_argument("--concurrent-iterations", type=int, default=100,
                    help=f"creates per tool in the {CONCURRENCY}-at-once mode (default 100)")
    ap.add_argument("--idle-iterations", type=int, default=20,
                    help=f"creates per tool {IDLE_GAP_S * 1000:.0f} ms apart (default 20)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-crun", action="store_true")
    ap.add_argument("--podman-every", type=int, default=5,
                    help="podman in every Nth iteration (0: none; default 5)")
    ap.add_argument("--json")
    ap.add_argument("--plot", help="write a PNG of the distributions (needs matplotlib)")
    ap.add_argument("--coved", default=os.path.join(BUILD, "src", "coved", "coved"))
    ap.add_argument("--agent", default=os.path.join(BUILD, "src", "agent", "cove-agent"))
    ap.add_argument("--replot", metavar="JSON",
                    help="only draw --plot from the samples of an earlier run's --json")
    ap.add_argument("--density", metavar="JSON",
                    help="with --replot: add bench/density.py's distributions (its --json) to "
                         "the plot (100 creates at once, the API with 1000 sandboxes alive)")
    args = ap.parse_args()
    if args.replot:
        samples = json.load(open(args.replot))["samples"]
        if args.density:
            samples.update(density_samples(json.load(open(args.density))))
        plot(samples, args.plot or "pools.png")
        return 0
    if os.geteuid() != 0:
        log("bench/pools.py: run as root")
        return 2
    bench.catch_signals()
    info = machine_info()
    tmp = tempfile.mkdtemp(prefix="cove-bench-pools-")
    cove = Cove(tmp, args.coved, args.agent, admin=True)
    tools = {}
    kinds = ["cove pooled", "cove cold", "bwrap", "crun run", "podman"]
    for mode in (f"{CONCURRENCY} at once", "idle"):
        kinds += [f"{k} {mode}" for k in ("cove cold", "bwrap", "crun run")]
    kinds += ["code pooled", "code cold", "api quiet", "api refilling"]
    samples = {k: [] for k in kinds}
    rc = 0
    try:
        cove.start()
        for name, template, n in (("bench", "base", 4), ("bench-code", "code-interpreter", 2)):
            status, payload = cove.request("POST", "/v1/pools", pool_spec(name, template, n))
            if status != 201:
                raise RuntimeError(f"pool {name}: HTTP {status}: {payload[:300]!r}")
        tools["bwrap"] = Bwrap(tmp)
        tools["bwrap"].setup()
        if not args.no_crun:
            tools["crun run"] = HybridCrun(tmp)
            tools["crun run"].setup()
        if args.podman_every > 0:
            tools["podman"] = Podman(tmp)
            tools["podman"].setup()
        pooled = dict(cold_body(), resourceLimits=dict(POOL_LIMITS),
                      extensions={"poolRef": "bench"})
        for i in range(args.warmup + args.iterations):
            counted = i >= args.warmup
            r = echo_once(cove, cold_body())
            if counted:
                samples["cove cold"].append(r)
            wait_available(cove, "bench")
            r = echo_once(cove, pooled)
            if counted:
                samples["cove pooled"].append(r)
            for name in ("bwrap", "crun run", "podman"):
                if name == "podman" and (args.podman_every <= 0 or i % args.podman_every != 0):
                    continue
                if name in tools:
                    t0 = now()
                    tools[name].once()
                    if counted:
                        samples[name].append({"first": now() - t0})
        # The cold modes bench/bench.py has too, in this run: 20 at once, and one at a time
        # after a pause (what a lone request on a quiet host sees).
        cold_tools = [("cove cold", cove)] + [(n, tools[n]) for n in ("bwrap", "crun run")
                                              if n in tools]
        for name, tool in cold_tools:
            log(f"{name}: {args.concurrent_iterations}, {CONCURRENCY} at once ...")
            for r in run_concurrent(tool, args.concurrent_iterations, CONCURRENCY)[0]:
                samples[f"{name} {CONCURRENCY} at once"].append({"first": r["first"]})
        log(f"idle: {args.idle_iterations} of each, {IDLE_GAP_S * 1000:.0f} ms apart ...")
        for _ in range(args.idle_iterations):
            for name, tool in cold_tools:
                time.sleep(IDLE_GAP_S)
                samples[f"{name} idle"].append({"first": tool.once()["first"]})
        log("the API while a pool refills ...")
        samples["api quiet"] = api_latencies(cove, 100)
        status, payload = cove.request("PATCH", "/v1/pools/bench",
                                       {"capacitySpec": {"bufferMin": 24, "bufferMax": 24}})
        if status != 200:
            raise RuntimeError(f"PATCH: HTTP {status}: {payload[:300]!r}")
        samples["api refilling"] = api_latencies(cove, 100)
        wait_available(cove, "bench", 24)
        log("code interpreter ...")
        for i in range(1 + args.code_iterations):
            counted = i >= 1
            r = code_once(cove, cold_body("code-interpreter"))
            if counted:
                samples["code cold"].append(r)
            wait_available(cove, "bench-code")
            r = code_once(cove, {"extensions": {"poolRef": "bench-code"}})
            if counted:
                samples["code pooled"].append(r)
    except KeyboardInterrupt:
        rc = 130
    except Exception as e:  # noqa: BLE001 - report, clean up, fail
        log(f"bench/pools.py: FAILED: {e}\n{cove.log()}")
        rc = 1
    finally:
        for t in tools.values():
            t.cleanup()
        for name in ("bench", "bench-code"):
            try:
                cove.request("DELETE", f"/v1/pools/{name}")
            except Exception:  # noqa: BLE001 - coved may be gone
                pass
        cove.stop()
        unmount_under(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        if crun_leftovers(os.path.basename(tmp) + "-"):
            log("bench/pools.py: crun left containers behind")
            rc = rc or 1
    results = {k: {"first": stats([s["first"] for s in v])} for k, v in samples.items() if v}
    for k in ("cove cold", "cove pooled", "code cold", "code pooled"):
        if samples[k]:
            results[k]["create"] = stats([s["create"] for s in samples[k]])
    for k in ("code cold", "code pooled"):
        if samples[k]:
            results[k]["run_first"] = stats([s["run_first"] for s in samples[k]])
            results[k]["run_second"] = stats([s["run_second"] for s in samples[k]])
    report(info, results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": info, "results": results,
                       "samples": {k: v for k, v in samples.items()}}, f, indent=1)
    if args.plot and rc == 0:
        plot(samples, args.plot)
    return rc


def report(info, results):
    print(f"\nmachine: {info.get('cpu', '?')}, {info.get('kernel', '?')}")
    print(f"{'':14} {'n':>4} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8}   (create -> first output)")
    for k, r in results.items():
        s = r["first"]
        if k.startswith("api"):
            print(f"{k:14} {s['n']:>4} {s['p50']:8.2f} {s['p90']:8.2f} {s['p99']:8.2f}   "
                  "(GET of a pool: the loop's latency)")
            continue
        print(f"{k:14} {s['n']:>4} {s['p50']:8.2f} {s['p90']:8.2f} {s['p99']:8.2f}")
    for k in ("cove cold", "cove pooled", "code cold", "code pooled"):
        if k in results:
            print(f"  {k}: the create's answer alone p50 {results[k]['create']['p50']:.2f} ms")
    for k in ("code cold", "code pooled"):
        if k in results:
            print(f"  {k}: first run_code p50 {results[k]['run_first']['p50']:.2f} ms, "
                  f"second {results[k]['run_second']['p50']:.2f} ms")
    pooled = results.get("cove pooled", {}).get("first", {}).get("p50")
    for other in ("cove cold", "bwrap", "crun run", "podman"):
        if pooled and other in results:
            print(f"  cove pooled / {other}: {pooled / results[other]['first']['p50']:.2f}x")
    for mode in ("", f" {CONCURRENCY} at once", " idle"):
        cold = results.get(f"cove cold{mode}", {}).get("first", {}).get("p50")
        for other in ("bwrap", "crun run"):
            if cold and f"{other}{mode}" in results:
                print(f"  cove cold{mode} / {other}{mode}: "
                      f"{cold / results[other + mode]['first']['p50']:.2f}x")


def density_samples(d):
    """bench/density.py's distributions, as this bench's samples (seconds, "first")."""
    n = d.get("density", {}).get("n", 1000)
    out = {"cove cold 100 at once (each answer)":
           [{"first": v} for v in d.get("at_once", {}).get("samples_s", [])]}
    alive = d.get("density", {}).get("samples_s", {})
    out[f"GET a sandbox, {n} alive"] = [{"first": v} for v in alive.get("get", [])]
    out[f"create+delete, {n} alive"] = [{"first": v} for v in alive.get("create_delete", [])]
    return {k: v for k, v in out.items() if v}


def plot(samples, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("bench/pools.py: no matplotlib here: no plot (run with a python that has it)")
        return
    names = [k for k, v in samples.items() if v and not k.startswith("api")]
    data = [[s["first"] * 1000 for s in samples[k]] for k in names]
    fig, ax = plt.subplots(figsize=(9, 7))
    ax.boxplot(data, vert=False, labels=names, showfliers=True)
    ax.set_xscale("log")
    ax.set_xlabel("create -> first output (or as labelled), ms (log scale)")
    ax.set_title("Cove warm pools vs cold starts, bubblewrap and crun (one run)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
