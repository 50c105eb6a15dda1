#!/usr/bin/python3
"""Density and scale benchmark (issue 14), on one coved (bench/tools.py's Cove: private copies
of the build's binaries, its own state dir and port, base template, `sleep infinity`, cpu
100m, memory 64Mi each so that a thousand fit any quota):

  100 at once   100 creates sent at once (100 client threads, one connection each): when each
                was answered, whether all were 202 and Running, the time until the last; then
                all deleted at once, and coved's descriptors and RSS before and after
  density       N sandboxes (default 1000; coved's --cpu-overcommit and --memory-overcommit
                raised so that admission lets them all in) made 20 at a time, then idle: host memory per
                sandbox (MemTotal - MemAvailable, before and with them, divided by N), coved's
                RSS and descriptors; the API's latency with N alive (GET one sandbox, GET a
                page of the list, a create and delete of one more, n=50 each, p50/p99); then
                all paused and the memory again; then all deleted, and what is left

Usage: bench/density.py [--sandboxes N] [--at-once N] [--json FILE]  (as root, on a built tree;
needs fs.file-max and pid_max room for N sandboxes: each is about 4 processes)"""
import argparse
import concurrent.futures
import http.client
import json
import os
import shutil
import sys
import tempfile
import time

import bench  # noqa: F401 - catch_signals
from machine import log, machine_info, now, read_meminfo, rss_kib
from measure import percentile
from tools import Cove

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("COVE_BUILD_DIR", os.path.join(ROOT, "build"))
BODY = {"image": {"uri": "base"}, "entrypoint": ["sleep", "infinity"],
        "resourceLimits": {"cpu": "100m", "memory": "64Mi"}}


def used_kib():
    m = read_meminfo()
    return m["MemTotal"] - m["MemAvailable"]


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def pct(values):
    ms = sorted(v * 1000 for v in values)
    return {"n": len(ms), "p50": percentile(ms, 50), "p90": percentile(ms, 90),
            "p99": percentile(ms, 99), "max": ms[-1]} if ms else {"n": 0}


def one_create(port, key):
    """A create on a connection of its own: (seconds to the answer, status, id)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    t0 = now()
    c.request("POST", "/v1/sandboxes", json.dumps(BODY),
              {"Content-Type": "application/json", "OPEN-SANDBOX-API-KEY": key})
    r = c.getresponse()
    body = r.read()
    c.close()
    sid = json.loads(body).get("id") if r.status == 202 else None
    return now() - t0, r.status, sid, body[:200]


def one_delete(port, key, sid):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    c.request("DELETE", f"/v1/sandboxes/{sid}", headers={"OPEN-SANDBOX-API-KEY": key})
    r = c.getresponse()
    r.read()
    c.close()
    return r.status


def at_once(cove, n):
    log(f"{n} creates at once ...")
    pid = cove.pid
    fds_before, rss_before = fds(pid), rss_kib(pid)
    t0 = now()
    with concurrent.futures.ThreadPoolExecutor(n) as ex:
        results = list(ex.map(lambda _: one_create(cove.port, cove.key), range(n)))
    wall = now() - t0
    ids = [sid for _, status, sid, _ in results if status == 202]
    states = [cove.get(sid)["status"]["state"] for sid in ids]
    failures = [(status, body) for _, status, _, body in results if status != 202]
    t1 = now()
    with concurrent.futures.ThreadPoolExecutor(n) as ex:
        deleted = list(ex.map(lambda sid: one_delete(cove.port, cove.key, sid), ids))
    delete_wall = now() - t1
    time.sleep(2)
    return {"n": n, "answered": len(results), "created": len(ids),
            "running": states.count("Running"), "failures": failures[:5],
            "all_answered_s": wall, "latency": pct([r[0] for r in results]),
            "samples_s": [r[0] for r in results],
            "deleted": deleted.count(204), "delete_all_s": delete_wall,
            "coved_fds": [fds_before, fds(pid)], "coved_rss_kib": [rss_before, rss_kib(pid)]}


def density(cove, n):
    pid = cove.pid
    base_used, base_rss, base_fds = used_kib(), rss_kib(pid), fds(pid)
    log(f"density: making {n} sandboxes, 20 at a time ...")
    ids, t0 = [], now()
    with concurrent.futures.ThreadPoolExecutor(20) as ex:
        for _, status, sid, body in ex.map(lambda _: one_create(cove.port, cove.key), range(n)):
            if status != 202:
                raise RuntimeError(f"create {len(ids)}: HTTP {status}: {body!r}")
            ids.append(sid)
    made_s = now() - t0
    time.sleep(5)  # the agents' start-up settles
    idle_used, idle_rss, idle_fds = used_kib(), rss_kib(pid), fds(pid)
    log("density: the API with them alive ...")
    gets, lists, cycles = [], [], []
    for i in range(50):
        t = now()
        cove.get(ids[i * (n // 50)])
        gets.append(now() - t)
        t = now()
        cove.request("GET", "/v1/sandboxes?pageSize=50")
        lists.append(now() - t)
        t = now()
        sid = cove.create(memory="64Mi")
        cove.delete(sid)
        cycles.append(now() - t)
    log("density: pausing them ...")
    for sid in ids:
        cove.pause(sid)
    time.sleep(3)
    paused_used = used_kib()
    log("density: deleting them ...")
    t0 = now()
    with concurrent.futures.ThreadPoolExecutor(20) as ex:
        list(ex.map(lambda sid: one_delete(cove.port, cove.key, sid), ids))
    deleted_s = now() - t0
    time.sleep(3)
    return {
        "samples_s": {"get": gets, "list_page_50": lists, "create_delete": cycles},
        "n": n, "made_s": made_s, "deleted_s": deleted_s,
        "idle_host_kib_per_sandbox": (idle_used - base_used) / n,
        "paused_host_kib_per_sandbox": (paused_used - base_used) / n,
        "coved_rss_kib": {"before": base_rss, "with": idle_rss, "after": rss_kib(pid)},
        "coved_fds": {"before": base_fds, "with": idle_fds, "after": fds(pid)},
        "api_with_all_alive": {"get": pct(gets), "list_page_50": pct(lists),
                               "create_delete": pct(cycles)},
        "host_used_kib_after": used_kib() - base_used,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sandboxes", type=int, default=1000)
    ap.add_argument("--at-once", type=int, default=100)
    ap.add_argument("--json")
    ap.add_argument("--coved", default=os.path.join(BUILD, "src", "coved", "coved"))
    ap.add_argument("--agent", default=os.path.join(BUILD, "src", "agent", "cove-agent"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        log("bench/density.py: run as root")
        return 2
    bench.catch_signals()
    info = machine_info()
    tmp = tempfile.mkdtemp(prefix="cove-bench-density-")
    # Admission would stop at 320 of these (16 x 2 CPUs of 100m limits) and at 1.5 x RAM of
    # 64Mi limits: both raised, the sandboxes are idle.
    cove = Cove(tmp, args.coved, args.agent,
                extra_args=["--cpu-overcommit", "100", "--memory-overcommit", "4"])
    out, rc = {"machine": info}, 0
    try:
        cove.start(log_level="warn")
        if args.at_once > 0:
            out["at_once"] = at_once(cove, args.at_once)
        if args.sandboxes > 0:
            out["density"] = density(cove, args.sandboxes)
    except KeyboardInterrupt:
        rc = 130
    except Exception as e:  # noqa: BLE001 - report, clean up, fail
        log(f"bench/density.py: FAILED: {e}\n{cove.log()}")
        rc = 1
    finally:
        left = cove.list_ids() or []
        for sid in left:
            try:
                cove.delete(sid)
            except Exception:  # noqa: BLE001 - best effort
                pass
        cove.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return rc


if __name__ == "__main__":
    sys.exit(main())
