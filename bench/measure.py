"""Measurement: the timing loops (sequential, concurrent, idle), their percentiles, and the
host memory idle Cove sandboxes cost. What one iteration is, is the tool's (tools.py)."""

import concurrent.futures
import os
import statistics
import time

from machine import log, now, read_int, read_meminfo, read_stat, rss_kib
from tools import CoveExec, ProcExec


def percentile(values, p):
    """Linear interpolation between closest ranks (like numpy's default)."""
    s = sorted(values)
    if not s:
        return float("nan")
    k = (len(s) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summary(values):
    """Milliseconds: n, p50, p95, mean, min, max of durations in seconds ({"n": 0} for none)."""
    ms = [v * 1000.0 for v in values]
    if not ms:
        return {"n": 0}
    return {"n": len(ms), "p50": percentile(ms, 50), "p95": percentile(ms, 95),
            "mean": statistics.fmean(ms), "min": min(ms), "max": max(ms)}


# ---------------------------------------------------------------- runs

def run_sequential(tool, iterations, warmup, gap=0.0):
    for _ in range(warmup):
        tool.once()
    samples = []
    busy = 0.0
    for _ in range(iterations):
        if gap:
            time.sleep(gap)
        t0 = now()
        samples.append(tool.once())
        busy += now() - t0
    return samples, busy


def run_concurrent(tool, total, concurrency):
    samples = []
    t0 = now()
    with concurrent.futures.ThreadPoolExecutor(max_workers=concurrency) as ex:
        futs = [ex.submit(tool.once) for _ in range(total)]
        for f in futs:
            samples.append(f.result())
    return samples, now() - t0


def summarize_modes(res, modes):
    """res[mode]: the summary of each timing of the samples, their wall time and rate."""
    for mode, samples, wall in modes:
        r = {k: summary([s[k] for s in samples]) for k in samples[0]}
        r["wall_s"] = wall
        r["per_s"] = len(samples) / wall
        res[mode] = r


def measure_tool(tool, args):
    """Warm-up, then sequential and concurrent runs. Returns a result dict."""
    res = {"tool": tool.name, "note": tool.note}
    t0 = now()
    tool.once()  # also the first-use cost (storage init etc.), not counted
    first_use = now() - t0
    seq_n = args.iterations
    conc_n = args.iterations
    # Warm-up, and estimate one iteration to decide whether to cut the count.
    warm = [tool.once() for _ in range(args.warmup)]
    est = statistics.fmean(w["cycle"] for w in warm) if warm else 0
    if est > args.slow_threshold:
        seq_n = max(10, min(seq_n, args.slow_iterations))
        conc_n = max(args.concurrency, min(conc_n, args.slow_iterations * 2))
        res["reduced"] = (f"one iteration took {est * 1000:.0f} ms (> {args.slow_threshold:.1f} s):"
                          f" {seq_n} sequential / {conc_n} concurrent instead of "
                          f"{args.iterations}")
    log(f"  {tool.name}: sequential x{seq_n} ...")
    seq, seq_wall = run_sequential(tool, seq_n, 0)
    log(f"  {tool.name}: concurrent x{conc_n} ({args.concurrency} at once) ...")
    conc, conc_wall = run_concurrent(tool, conc_n, args.concurrency)
    modes = [("sequential", seq, seq_wall), ("concurrent", conc, conc_wall)]
    if args.idle_iterations > 0:
        idle_n = min(args.idle_iterations, seq_n)
        log(f"  {tool.name}: idle x{idle_n} ({args.idle_gap * 1000:.0f} ms pause before each)...")
        idle, idle_wall = run_sequential(tool, idle_n, 0, gap=args.idle_gap)
        modes.append(("idle", idle, idle_wall))
    res["first_use_ms"] = first_use * 1000
    summarize_modes(res, modes)
    return res


def measure_exec(tool, args, concurrent=False):
    """Exec part: warm-up, then `--exec-iterations` back to back, and (Cove only) the same
    number with `--concurrency` in flight."""
    res = {"tool": tool.name, "note": tool.note}
    warm = [tool.once() for _ in range(max(1, args.warmup))]
    n = args.exec_iterations
    est = statistics.fmean(w["done"] for w in warm)
    if est > args.slow_threshold:
        n = max(10, min(n, args.slow_iterations))
        res["reduced"] = (f"one exec took {est * 1000:.0f} ms (> {args.slow_threshold:.1f} s): "
                          f"{n} iterations instead of {args.exec_iterations}")
    log(f"  {tool.name}: exec, sequential x{n} ...")
    modes = [("sequential",) + run_sequential(tool, n, 0)]
    if concurrent and args.concurrency > 1:
        log(f"  {tool.name}: exec, concurrent x{n} ({args.concurrency} at once) ...")
        modes.append(("concurrent",) + run_concurrent(tool, n, args.concurrency))
    summarize_modes(res, modes)
    return res


def measure_cove_exec(cove, args):
    """Exec part for Cove: one sandbox, kept running for all iterations, then deleted."""
    sid = cove.create()
    try:
        tool = CoveExec(cove, sid)
        cpu0 = cove.cpu_seconds(sid)
        res = [measure_exec(tool, args, concurrent=True)]
        cpu1 = cove.cpu_seconds(sid)
        # One connection per client thread, none lost: keep-alive held for every request.
        res[0]["connections"] = cove.gw_connects
        res[0]["connections_lost"] = cove.gw_lost
        # Where the CPU goes, per exec (warm-up, sequential and concurrent together).
        for i, key in enumerate(("sandbox_cpu_ms_per_exec", "coved_cpu_ms_per_exec")):
            if cpu0[i] is not None and cpu1[i] is not None:
                res[0][key] = (cpu1[i] - cpu0[i]) * 1000 / tool.calls
        res.append(measure_exec(CoveExec(cove, sid, keepalive=False), args))
        res.append(measure_exec(CoveExec(cove, sid, keepalive="ping"), args))
    finally:
        cove.drop_gw()
        cove.delete(sid)
    return res


def measure_container_tool(tool, args, parts):
    """Start-up and/or exec part of crun or podman, on one setup. Returns (start-up result,
    exec result), None for a part not run."""
    start = ex = None
    try:
        tool.setup()
        if "startup" in parts:
            start = measure_tool(tool, args)
        if "exec" in parts and hasattr(tool, "start_running"):
            log(f"{tool.name}: exec: starting a container that keeps running ...")
            tool.start_running()
            ex = measure_exec(ProcExec(tool), args)
    finally:
        tool.cleanup()
    return start, ex



# ---------------------------------------------------------------- memory

MEMINFO_FIELDS = ["MemAvailable", "Used", "AnonPages", "Shmem", "Slab", "SUnreclaim",
                  "KernelStack", "PageTables"]
# What a sandbox can add to the host's used memory, field by field (SUnreclaim is in Slab).
ACCOUNTED_FIELDS = ["AnonPages", "Shmem", "Slab", "KernelStack", "PageTables"]


def meminfo_sample(samples=10, interval=0.1):
    """Median over `samples` readings of the interesting /proc/meminfo fields (KiB), and the
    spread (max - min) of MemAvailable over them. Used is free(1)'s "used"."""
    rows = []
    for i in range(samples):
        m = read_meminfo()
        m["Used"] = (m["MemTotal"] - m["MemFree"] - m.get("Buffers", 0) - m.get("Cached", 0)
                     - m.get("SReclaimable", 0))
        rows.append(m)
        if i + 1 < samples:
            time.sleep(interval)
    med = {k: statistics.median(r.get(k, 0) for r in rows) for k in MEMINFO_FIELDS}
    avail = [r["MemAvailable"] for r in rows]
    return med, max(avail) - min(avail)



def memory_round(cove, n):
    # Short windows: other processes on the host move its memory all the time, and the
    # longer between the two samples the more of that lands in the difference.
    time.sleep(0.3)
    before, noise_before = meminfo_sample(5, 0.05)
    coved_before = rss_kib(cove.pid)
    ids = [cove.create() for _ in range(n)]
    try:
        time.sleep(0.3)  # let the agents finish starting
        for sid in ids:
            cove.pause(sid)
        states = {(cove.get(sid) or {}).get("status", {}).get("state") for sid in ids}
        time.sleep(0.1)
        after, noise_after = meminfo_sample(5, 0.05)
        coved_after = rss_kib(cove.pid)
        usage = kmem = 0
        stat_sum = {}
        v2 = False
        for sid in ids:
            d = cove.cgroup_memory_dir(sid)
            if d is None:
                raise RuntimeError(f"no memory cgroup found for sandbox {sid}")
            u = read_int(os.path.join(d, "memory.usage_in_bytes"))
            if u is None:
                u = read_int(os.path.join(d, "memory.current"))
                v2 = True
            usage += u or 0
            kmem += read_int(os.path.join(d, "memory.kmem.usage_in_bytes")) or 0
            for key, val in read_stat(os.path.join(d, "memory.stat")).items():
                stat_sum[key] = stat_sum.get(key, 0) + val
    finally:
        for sid in ids:
            cove.delete(sid)
    time.sleep(0.5)
    gone, noise_gone = meminfo_sample(5, 0.05)
    keys = (["anon", "file", "shmem", "kernel", "kernel_stack", "pagetables", "slab", "sock"]
            if v2 else ["rss", "cache", "shmem", "mapped_file"])
    breakdown = {k: stat_sum.get(k, 0) / n / 1024 for k in keys if k in stat_sum}
    if not v2:
        breakdown["kmem"] = kmem / n / 1024
    delta = {k: (after[k] - before[k]) / n for k in MEMINFO_FIELDS}
    delta["MemAvailable"] = -delta["MemAvailable"]  # a decrease is a cost
    return {"states": sorted(s for s in states if s), "meminfo_per_sandbox_kib": delta,
            "not_returned_kib": before["MemAvailable"] - gone["MemAvailable"],
            "noise_kib": max(noise_before, noise_after, noise_gone),
            "cgroup_usage_kib_per_sandbox": usage / n / 1024,
            "cgroup_file": "memory.current" if v2 else "memory.usage_in_bytes",
            "cgroup_breakdown_kib_per_sandbox": breakdown,
            "coved_rss_growth_kib": coved_after - coved_before}


def measure_memory(cove, n, rounds):
    res = []
    for r in range(rounds):
        log(f"  memory: round {r + 1}/{rounds}: {n} idle sandboxes, paused ...")
        res.append(memory_round(cove, n))

    def med(get):
        vals = [get(x) for x in res]
        return {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
    return {
        "n": n, "rounds": rounds, "states": sorted({s for x in res for s in x["states"]}),
        "cgroup_file": res[0]["cgroup_file"],
        "meminfo_per_sandbox_kib": {k: med(lambda x, k=k: x["meminfo_per_sandbox_kib"][k])
                                    for k in MEMINFO_FIELDS},
        "not_returned_kib": med(lambda x: x["not_returned_kib"]),
        "first_round_memavailable_kib": res[0]["meminfo_per_sandbox_kib"]["MemAvailable"],
        "first_round_used_kib": res[0]["meminfo_per_sandbox_kib"]["Used"],
        "accounted_kib": med(lambda x: sum(x["meminfo_per_sandbox_kib"][k]
                                           for k in ACCOUNTED_FIELDS)),
        "noise_kib": max(x["noise_kib"] for x in res),
        "cgroup_usage_kib_per_sandbox": med(lambda x: x["cgroup_usage_kib_per_sandbox"]),
        "cgroup_breakdown_kib_per_sandbox": {
            k: statistics.median(x["cgroup_breakdown_kib_per_sandbox"][k] for x in res)
            for k in res[0]["cgroup_breakdown_kib_per_sandbox"]},
        "coved_rss_growth_kib": med(lambda x: x["coved_rss_growth_kib"]),
    }

