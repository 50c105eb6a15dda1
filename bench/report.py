"""The report: tables of each part, each tool's figures over Cove's, and the machine."""

import code_interpreter
from measure import MEMINFO_FIELDS


def fmt(x):
    if x != x:  # NaN
        return "-"
    return f"{x:.1f}" if x < 100 else f"{x:.0f}"



def latency_table(p, title, rows, mode, second, cove, per_s=None, width=8):
    """One table of a mode: p50/p95/mean of "first" and of `second` ("cycle" or "done") per
    tool, throughput (per_s formats it; None prints "-"), and each tool's p50s over Cove's."""
    p(f"== {title}")
    p(f"{'tool':{width}}{'n':>5} | {'first p50':>9} {'p95':>7} {'mean':>7} | "
      f"{second + ' p50':>9} {'p95':>7} {'mean':>7} | {'/s':>6} | {'first p50':>9} "
      f"{second + ' p50':>9}")
    p(f"{'':{width}}{'':>5} | {'':>9} {'':>7} {'':>7} | {'':>9} {'':>7} {'':>7} | {'':>6} | "
      f"{'tool/cove':>9} {'tool/cove':>9}")
    for r in rows:
        m = r[mode]
        f, c = m["first"], m[second]
        rf = rc = "-"
        if cove and r is not cove and mode in cove:
            rf = f"{f['p50'] / cove[mode]['first']['p50']:.2f}x"
            rc = f"{c['p50'] / cove[mode][second]['p50']:.2f}x"
        p(f"{r['tool']:{width}}{f['n']:>5} | {fmt(f['p50']):>9} {fmt(f['p95']):>7} "
          f"{fmt(f['mean']):>7} | {fmt(c['p50']):>9} {fmt(c['p95']):>7} {fmt(c['mean']):>7} "
          f"| {(per_s(m) if per_s else '-'):>6} | {rf:>9} {rc:>9}")


def print_report(info, results, memory, exec_results, args, wall, code_results=()):
    p = print
    p()
    p("== Machine")
    p(f"CPU: {info['cpu']}, {info['cores']} cores; RAM {info['ram_gib']} GiB; "
      f"kernel {info['kernel']}; {info['os']}; cgroups {info['cgroups']}")
    p("Versions: " + "; ".join(f"{k}: {v}" for k, v in info["versions"].items()))
    p()
    if results:
        p("== Tools")
    for r in results:
        p(f"{r['tool']:7} {r['note']}")
        if r.get("reduced"):
            p(f"        NOTE: {r['reduced']}")
    cove = next((r for r in results if r["tool"] == "cove"), None)
    titles = {"sequential": "Sequential, back to back",
              "concurrent": f"Concurrent, {args.concurrency} at once",
              "idle": f"Idle: one at a time, {args.idle_gap * 1000:.0f} ms pause before each"}
    for mode in ("sequential", "concurrent", "idle"):
        if not results or not all(mode in r for r in results):
            continue
        p()
        latency_table(p, f"{titles[mode]}: milliseconds (first = start -> \"hi\" received; "
                      "cycle = + end of command + teardown)", results, mode, "cycle", cove,
                      per_s=(lambda m: format(m["per_s"], "6.1f")) if mode != "idle" else None)
        if cove:
            m = cove[mode]
            p("cove phases p50/p95 (ms): " + ", ".join(
                f"{k} {fmt(m[k]['p50'])}/{fmt(m[k]['p95'])}"
                for k in ("create", "exec_first", "exec_rest", "delete")))
    if cove and "sequential" in cove:
        p()
        p("== Targets (sequential)")
        f = cove["sequential"]["first"]["p50"]
        p(f"cove create->first output p50 {f:.1f} ms: "
          f"{'MET' if f < 10 else 'NOT MET'} (target < 10 ms)")
        cr = next((r for r in results if r["tool"] == "crun"), None)
        if cr:
            ratio = cr["sequential"]["first"]["p50"] / f
            p(f"crun/cove first-output p50 ratio {ratio:.2f}x: "
              f"{'MET' if ratio >= 2 else 'NOT MET'} (target >= 2x)")
    if memory:
        p()
        p(f"== Memory: {memory['n']} idle Cove sandboxes (entrypoint sleep infinity), paused "
          f"(states seen: {', '.join(memory['states'])}); {memory['rounds']} rounds, "
          "median [min..max], KiB per sandbox")
        mi = memory["meminfo_per_sandbox_kib"]

        def mm(d):
            return f"{d['median']:.0f} [{d['min']:.0f}..{d['max']:.0f}]"
        p(f"host MemAvailable decrease: first round {memory['first_round_memavailable_kib']:.0f}; "
          f"all rounds {mm(mi['MemAvailable'])}")
        p(f"host used (free(1)) increase: first round {memory['first_round_used_kib']:.0f}; "
          f"all rounds {mm(mi['Used'])}")
        p(f"host used memory by /proc/meminfo field (AnonPages+Shmem+Slab+KernelStack+PageTables):"
          f" {mm(memory['accounted_kib'])}")
        p("  fields (median): " + ", ".join(
            f"{k} {mi[k]['median']:.0f}" for k in MEMINFO_FIELDS[2:]) +
          " (SUnreclaim is part of Slab)")
        p("  (MemFree/MemAvailable deltas of a few MB read low: pages freed earlier, by any "
          "process or by the previous round's deletions, wait on the kernel's per-CPU free lists,"
          " which MemFree does not count, and are reused first. The field sum and the cgroup "
          "charge are the steadier figures.)")
        p(f"  noise: MemAvailable moved by up to {memory['noise_kib']} KiB within 0.2 s,"
          f" i.e. ±{memory['noise_kib'] / memory['n']:.0f} KiB per sandbox")
        p(f"sum of cgroup {memory['cgroup_file']}: {mm(memory['cgroup_usage_kib_per_sandbox'])};"
          " breakdown: " + ", ".join(
              f"{k} {v:.0f}" for k, v in memory["cgroup_breakdown_kib_per_sandbox"].items()))
        p(f"coved RSS growth while holding {memory['n']}: "
          f"{memory['coved_rss_growth_kib']['median']:.0f} KiB in total; MemAvailable 0.5 s after "
          f"deleting them vs. before: {memory['not_returned_kib']['median']:.0f} KiB lower "
          "(all sandboxes; noise applies)")
    if exec_results:
        print_exec_report(exec_results, args)
    if code_results:
        code_interpreter.print_report(code_results, args)
    p()
    p(f"Total bench time {wall:.0f} s.")


def print_exec_report(exec_results, args):
    p = print

    def fmt(x):  # sub-millisecond rows (the ping) need the second digit
        return f"{x:.2f}" if x < 1 else globals()["fmt"](x)
    p()
    p("== Exec in a running environment: `echo hi`")
    for r in exec_results:
        p(f"{r['tool']:9} {r['note']}")
        if r.get("reduced"):
            p(f"          NOTE: {r['reduced']}")
    p("bwrap     skipped: there is no exec into a running bwrap")
    cove = next((r for r in exec_results if r["tool"] == "cove"), None)
    if cove and "connections" in cove:
        p(f"cove client connections: {cove['connections']} opened (one per client thread), "
          f"{cove['connections_lost']} closed by the server or unusable after a reply")
    if cove and "sandbox_cpu_ms_per_exec" in cove:
        p(f"cove CPU per exec: sandbox cgroup (agent, bash, echo) "
          f"{cove['sandbox_cpu_ms_per_exec']:.2f} ms; coved (API, gateway) "
          f"{cove.get('coved_cpu_ms_per_exec', float('nan')):.2f} ms")
    for mode, title in (("sequential", "back to back"),
                        ("concurrent", f"{args.concurrency} at once (Cove only)")):
        rows = [r for r in exec_results if mode in r]
        if not rows:
            continue
        p()
        latency_table(p, f"Exec, {title}: milliseconds (first = request -> \"hi\" received; "
                      "done = end of the event stream / exit of the exec command)", rows, mode,
                      "done", cove, per_s=lambda m: fmt(m["per_s"]), width=9)

