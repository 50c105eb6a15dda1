#!/usr/bin/python3
"""What the audit trail costs (issue 16): the create and exec cycle on a coved that records every
action against the same cycle on one started with the trail off, in one run, kinds in turn.

  cycle        POST /v1/sandboxes (base, sleep infinity, cpu 1, memory 512Mi) until its 202,
               POST .../proxy/44772/command `echo hi` on a new connection until "hi" and the
               end of the stream, DELETE until its 204 (tools.Cove.once): what it records is
               the create, the command's start and end, and the delete
  exec         `echo hi` in one running sandbox on a kept-alive connection, stream read to its
               end (tools.Cove.exec_keepalive): a command's two events, nothing else
  bwrap        bwrap --unshare-all over the host's /usr, /usr/bin/echo hi (tools.Bwrap): what
               a user would run instead, for scale

The two coveds are alike (private copies of the build's binaries, own state dirs and ports)
but for the flag that switches the trail off (--off-flag, default --no-audit). Iterations take
the kinds in turn so drift hits them alike; warm-ups are not counted. Prints p50/p90/p99 and
the ratios on/off, and with --json FILE the samples.

Usage: bench/audit.py [--iterations N] [--exec-iterations N] [--warmup N] [--json FILE]
(as root, on a built tree: scripts/build.sh)"""
import argparse
import json
import os
import shutil
import sys
import tempfile

import bench  # noqa: F401 - catch_signals
from machine import log, machine_info
from measure import percentile
from tools import Bwrap, Cove

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("COVE_BUILD_DIR", os.path.join(ROOT, "build"))


def summary(values):
    s = sorted(values)
    return {"n": len(s), "p50": percentile(s, 50), "p90": percentile(s, 90),
            "p99": percentile(s, 99)}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=100, help="cycles per coved")
    ap.add_argument("--exec-iterations", type=int, default=500, help="execs per coved")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--off-flag", default="--no-audit", help="coved's flag for no trail")
    ap.add_argument("--json")
    ap.add_argument("--coved", default=os.path.join(BUILD, "src", "coved", "coved"))
    ap.add_argument("--agent", default=os.path.join(BUILD, "src", "agent", "cove-agent"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        log("bench/audit.py: run as root")
        return 2
    bench.catch_signals()
    info = machine_info()
    tmp = tempfile.mkdtemp(prefix="cove-bench-audit-")
    coveds = {"on": Cove(os.path.join(tmp, "on"), args.coved, args.agent),
              "off": Cove(os.path.join(tmp, "off"), args.coved, args.agent,
                          extra_args=[args.off_flag])}
    bwrap = Bwrap(tmp)
    samples = {f"{kind} {mode}": [] for kind in ("cycle", "exec") for mode in coveds}
    samples["bwrap"] = []
    rc = 0
    try:
        for name, c in coveds.items():
            os.makedirs(os.path.join(tmp, name))
            c.start(log_level="warn")
        bwrap.setup()
        for i in range(args.warmup + args.iterations):
            for mode, c in coveds.items() if i % 2 else reversed(coveds.items()):
                r = c.once()
                if i >= args.warmup:
                    samples[f"cycle {mode}"].append(r["cycle"])
            r = bwrap.once()
            if i >= args.warmup:
                samples["bwrap"].append(r["cycle"])
        running = {mode: c.create() for mode, c in coveds.items()}
        for i in range(args.warmup + args.exec_iterations):
            for mode, c in coveds.items() if i % 2 else reversed(coveds.items()):
                _, done = c.exec_keepalive(running[mode])
                if i >= args.warmup:
                    samples[f"exec {mode}"].append(done)
        # The trail did record: the sandbox that ran the execs has its events (on only).
        status, payload = coveds["on"].request(
            "GET", f"/v1/sandboxes/{running['on']}/events?kind=command.&limit=1")
        recorded = status == 200 and bool(json.loads(payload).get("items"))
        for mode, c in coveds.items():
            c.delete(running[mode])
    except KeyboardInterrupt:
        rc = 130
    except Exception as e:  # noqa: BLE001 - report, then clean up
        log(f"bench/audit.py: {e}")
        rc = 1
    finally:
        for c in coveds.values():
            c.stop()
        bwrap.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
    if rc:
        return rc
    res = {k: summary(v) for k, v in samples.items() if v}
    ms = lambda s: f"{s * 1000:.2f}"  # noqa: E731
    print(f"audit trail on vs off ({info.get('cores', '?')} CPUs, kernel {info.get('kernel', '?')});"
          f" the trail recorded the execs: {recorded}\n")
    print("| what | p50 ms | p90 ms | p99 ms | n | p50 on/off |")
    print("| --- | --- | --- | --- | --- | --- |")
    for kind in ("cycle", "exec"):
        on, off = res[f"{kind} on"], res[f"{kind} off"]
        for mode, s in (("on", on), ("off", off)):
            ratio = f"{on['p50'] / off['p50']:.3f}" if mode == "on" else ""
            print(f"| {kind}, trail {mode} | {ms(s['p50'])} | {ms(s['p90'])} | {ms(s['p99'])} | "
                  f"{s['n']} | {ratio} |")
    s = res["bwrap"]
    print(f"| bwrap echo hi | {ms(s['p50'])} | {ms(s['p90'])} | {ms(s['p99'])} | {s['n']} | |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": info, "summary": res, "samples": samples,
                       "recorded": recorded}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
