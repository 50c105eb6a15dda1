#!/usr/bin/python3
"""Isolated-session benchmark (OSEP-0013): what a session costs inside a running sandbox,
against what a user would otherwise do for a fresh, isolated place to run one command, all in
one run:

  cove session   POST /v1/isolated/session (overlay workspace, private /tmp, own pid
                 namespace) until its 201, then `echo hi` in it through /run until the output
                 is back; then DELETE
  cove sandbox   a whole new sandbox instead: POST /v1/sandboxes until 202, `echo hi`, DELETE
  bwrap          on the host: bwrap --ro-bind / / --dev /dev --proc /proc --tmpfs /tmp
                 --bind W W --unshare-pid -- echo hi (OSEP-0013's isolator; Debian 12's
                 bubblewrap 0.8 has no --overlay-src, so its workspace is a plain bind)
  run only       /run of `echo hi` in an existing session (the per-run cost once it exists)

Usage: bench/isolated.py [--iterations N] [--json FILE]   (as root, on a built tree)"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(here), "tests"))
from covetest import AGENT_PORT, ExecResult, parse_events, serve  # noqa: E402
from machine import machine_info  # noqa: E402
from measure import percentile  # noqa: E402


def stats(values):
    ms = [v * 1000 for v in values]
    return {"n": len(ms), "p50": percentile(ms, 50), "p90": percentile(ms, 90),
            "p99": percentile(ms, 99), "max": max(ms) if ms else float("nan")}


def base(sid):
    return f"/sandboxes/{sid}/proxy/{AGENT_PORT}/v1/isolated"


def run_in(d, sid, session, code):
    status, raw, _ = d.request("POST", f"{base(sid)}/session/{session}/run", {"code": code})
    if status != 200:
        raise RuntimeError(f"run: HTTP {status}: {raw}")
    r = ExecResult(parse_events(raw if isinstance(raw, str) else json.dumps(raw)))
    if r.stdout != "hi\n":
        raise RuntimeError(f"run: {r.stdout!r} {r.stderr!r}")


def session_cycle(d, sid):
    t0 = time.perf_counter()
    status, body, _ = d.request("POST", base(sid) + "/session", {"workspace": {"path": "/workspace"}})
    if status != 201:
        raise RuntimeError(f"session: HTTP {status}: {body}")
    t_create = time.perf_counter() - t0
    run_in(d, sid, body["session_id"], "echo hi")
    t_first = time.perf_counter() - t0
    d.request("DELETE", f"{base(sid)}/session/{body['session_id']}")
    return t_create, t_first


def sandbox_cycle(d):
    t0 = time.perf_counter()
    sid = d.create()
    t_create = time.perf_counter() - t0
    r = d.exec(sid, "echo hi")
    t_first = time.perf_counter() - t0
    if r.stdout != "hi\n":
        raise RuntimeError(f"echo in {sid}: {r.stdout!r}")
    d.delete(sid)
    return t_create, t_first


def bwrap_cycle(workspace):
    t0 = time.perf_counter()
    out = subprocess.run(["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                          "--tmpfs", "/tmp", "--bind", workspace, workspace, "--unshare-pid", "--",
                          "echo", "hi"], capture_output=True, text=True)
    if out.returncode != 0 or out.stdout != "hi\n":
        raise RuntimeError(f"bwrap: {out.returncode} {out.stdout!r} {out.stderr!r}")
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--json")
    args = ap.parse_args()
    n = args.iterations
    res = {"machine": machine_info(), "iterations": n, "kernel": platform.release()}
    workspace = tempfile.mkdtemp(prefix="cove-bench-ws-")
    with serve("--mcp-command", "none") as d:
        sid = d.create()
        d.sh(sid, "mkdir -p /workspace && echo x > /workspace/x")
        for _ in range(5):  # warm-up, not counted
            session_cycle(d, sid)
            sandbox_cycle(d)
            bwrap_cycle(workspace)
        sc, sf, bc, bf, bw, runs = [], [], [], [], [], []
        for _ in range(n):  # interleaved: drift hits every kind alike
            c, f = session_cycle(d, sid)
            sc.append(c)
            sf.append(f)
            c, f = sandbox_cycle(d)
            bc.append(c)
            bf.append(f)
            bw.append(bwrap_cycle(workspace))
        status, body, _ = d.request("POST", base(sid) + "/session",
                                    {"workspace": {"path": "/workspace"}})
        for _ in range(n):
            t0 = time.perf_counter()
            run_in(d, sid, body["session_id"], "echo hi")
            runs.append(time.perf_counter() - t0)
        d.delete(sid)
    shutil.rmtree(workspace, ignore_errors=True)
    res["session_create"] = stats(sc)
    res["session_first_run"] = stats(sf)
    res["sandbox_create"] = stats(bc)
    res["sandbox_first_exec"] = stats(bf)
    res["bwrap_echo"] = stats(bw)
    res["session_run"] = stats(runs)
    res["ratio_session_vs_sandbox_p50"] = res["session_first_run"]["p50"] / \
        res["sandbox_first_exec"]["p50"]
    res["ratio_session_vs_bwrap_p50"] = res["session_first_run"]["p50"] / res["bwrap_echo"]["p50"]
    print(json.dumps(res, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
