"""The code-interpreter part of the bench (bench/run.sh --only code).

Cove: POST /sandboxes/{id}/proxy/44772/code on a kept-alive connection through the gateway, the
events read until the result `2` arrives (first) and to the end of the stream (done).

  round trip    `1+1` in a running python context, back to back
  cold start    POST /v1/sandboxes, then at once POST /code {"code": "1+1", "context":
                {"language": "python"}}: until the result `2`. With the code-interpreter
                template (its agent prestarts the python kernel with the sandbox) and with base
                (the kernel starts on that first request).
  after a pause the same, but the first POST /code goes 1.5 s after the create (what a client
                that uploads its data first sees): the request's own latency.

Host: the same `1+1` through jupyter_client (the library Jupyter itself uses) to an ipykernel
started on the host with no isolation: the floor a local kernel gives.

Only the standard library (and python3-jupyter-client for the host row)."""

import json
import os
import socket
import time

from machine import now
from measure import summary
from tools import AGENT_PORT, EventStream

THINK_S = 1.5


class CodeClient:
    """POST /code through coved's gateway on one kept-alive connection."""

    def __init__(self, cove):
        self.cove = cove
        self.sock = None

    def connect(self):
        self.sock = socket.create_connection(("127.0.0.1", self.cove.port), timeout=120)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def close(self):
        if self.sock:
            self.sock.close()
        self.sock = None

    def run(self, sid, code, context, expect):
        """(seconds until a result whose text is `expect`, seconds until the end)."""
        if self.sock is None:
            self.connect()
        body = json.dumps({"code": code, "context": context}).encode()
        req = (f"POST /sandboxes/{sid}/proxy/{AGENT_PORT}/code HTTP/1.1\r\n"
               f"Host: 127.0.0.1:{self.cove.port}\r\nOPEN-SANDBOX-API-KEY: {self.cove.key}\r\n"
               f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        t0 = now()
        stream = EventStream()
        first = None
        self.sock.sendall(req)
        while not stream.done:
            data = self.sock.recv(65536)
            if not data:
                break
            for ev in stream.feed(data):
                if first is None and ev.get("type") == "result" and \
                        (ev.get("results") or {}).get("text") == expect:
                    first = now()
        end = now()
        if not stream.done or stream.close or stream.leftover:
            self.close()
        if stream.status != 200 or first is None:
            raise RuntimeError(f"POST /code in {sid}: HTTP {stream.status}, events "
                               f"{stream.events!r}, raw {stream.raw[:300]!r}")
        return first - t0, end - t0


def create(cove, template):
    return cove.create(template=template, memory="1Gi")


def measure_cove(cove, args):
    out = {"tool": "cove",
           "note": "coved HTTP API and gateway; POST .../proxy/44772/code on a kept-alive "
                   "connection; kernel: the host's ipykernel in the sandbox (python3 "
                   "kernelspec), run by cove-kernel over ZeroMQ"}
    client = CodeClient(cove)
    try:
        sid = create(cove, "code-interpreter")
        ctx = {"language": "python"}
        client.run(sid, "1+1", ctx, "2")  # the prestarted kernel may still be starting
        for _ in range(5):
            client.run(sid, "1+1", ctx, "2")
        first, done = [], []
        for _ in range(args.code_iterations):
            f, d = client.run(sid, "1+1", ctx, "2")
            first.append(f)
            done.append(d)
        out["round_trip"] = {"first": summary(first), "done": summary(done)}
        cove.delete(sid)

        for template, key in (("code-interpreter", "prestarted"), ("base", "cold")):
            cold, think = [], []
            for _ in range(args.code_start_iterations):
                client.close()  # a client of its own: a new connection
                t0 = now()
                sid = create(cove, template)
                t_request = now()
                f, _ = client.run(sid, "1+1", {"language": "python"}, "2")
                cold.append(t_request + f - t0)
                cove.delete(sid)
            for _ in range(args.code_think_iterations):
                client.close()
                sid = create(cove, template)
                time.sleep(THINK_S)
                f, _ = client.run(sid, "1+1", {"language": "python"}, "2")
                think.append(f)
                cove.delete(sid)
            out[key] = {"create_to_first": summary(cold), "first_after_pause": summary(think)}
    finally:
        client.close()
    return out


def measure_host(args):
    """jupyter_client to an ipykernel on the host: start -> first result, and 1+1 round trips."""
    # ipykernel's debugger warns about frozen modules on every start (cove-kernel sets this too).
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    try:
        from jupyter_client.manager import start_new_kernel
    except ImportError as e:
        return {"tool": "host", "note": f"skipped: no jupyter_client ({e})"}

    def execute(client, code):
        t0 = now()
        msg_id = client.execute(code)
        first = None
        while True:
            msg = client.get_iopub_msg(timeout=60)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if first is None and msg["msg_type"] == "execute_result":
                first = now()
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        return first - t0, now() - t0

    starts = []
    for _ in range(args.code_start_iterations):
        t0 = now()
        km, kc = start_new_kernel(kernel_name="python3", startup_timeout=60)
        try:
            t_request = now()
            f, _ = execute(kc, "1+1")
            starts.append(t_request + f - t0)
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
    km, kc = start_new_kernel(kernel_name="python3", startup_timeout=60)
    try:
        for _ in range(5):
            execute(kc, "1+1")
        first, done = [], []
        for _ in range(args.code_iterations):
            f, d = execute(kc, "1+1")
            first.append(f)
            done.append(d)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return {"tool": "host",
            "note": "jupyter_client (start_new_kernel, execute, IOPub until idle) to the "
                    "host's ipykernel, no isolation, no HTTP: the floor",
            "round_trip": {"first": summary(first), "done": summary(done)},
            "cold": {"create_to_first": summary(starts)}}


def fmt(x):
    return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:.0f}"


def print_report(results, args):
    p = print
    p()
    p("== Code interpreter: `1+1` in a python kernel")
    for r in results:
        p(f"{r['tool']:6} {r['note']}")
    cove = next((r for r in results if r["tool"] == "cove"), None)
    rows = [r for r in results if "round_trip" in r]
    if rows:
        p()
        p("== Code, round trip in a running context, back to back: milliseconds (first = "
          "request -> result `2`; done = end of the event stream / kernel idle)")
        p(f"{'tool':6}{'n':>5} | {'first p50':>9} {'p95':>7} {'mean':>7} | {'done p50':>9} "
          f"{'p95':>7} | {'first p50':>9}")
        p(f"{'':6}{'':>5} | {'':>9} {'':>7} {'':>7} | {'':>9} {'':>7} | {'cove/tool':>9}")
        for r in rows:
            f, d = r["round_trip"]["first"], r["round_trip"]["done"]
            ratio = "-"
            if cove and r is not cove:
                ratio = f"{cove['round_trip']['first']['p50'] / f['p50']:.2f}x"
            p(f"{r['tool']:6}{f['n']:>5} | {fmt(f['p50']):>9} {fmt(f['p95']):>7} "
              f"{fmt(f['mean']):>7} | {fmt(d['p50']):>9} {fmt(d['p95']):>7} | {ratio:>9}")
    if cove and "prestarted" in cove:
        host = next((r for r in results if r["tool"] == "host" and "cold" in r), None)
        p()
        p("== Code, cold start: milliseconds from POST /v1/sandboxes to the result `2` of the "
          "first POST /code sent right after it (host: start_new_kernel to the result)")
        p(f"{'':26}{'n':>4} | {'p50':>7} {'p95':>7} {'mean':>7}")
        for label, m in (("cove, kernel prestarted", cove["prestarted"]["create_to_first"]),
                         ("cove, kernel on first use", cove["cold"]["create_to_first"]),
                         ("host jupyter_client", host["cold"]["create_to_first"] if host
                          else None)):
            if m and m.get("n"):
                p(f"{label:26}{m['n']:>4} | {fmt(m['p50']):>7} {fmt(m['p95']):>7} "
                  f"{fmt(m['mean']):>7}")
        p()
        p(f"== Code, first POST /code {THINK_S:.1f} s after the create (the client uploads "
          "its data first): milliseconds from that request to the result `2`")
        for label, m in (("cove, kernel prestarted", cove["prestarted"]["first_after_pause"]),
                         ("cove, kernel on first use", cove["cold"]["first_after_pause"])):
            if m.get("n"):
                p(f"{label:26}{m['n']:>4} | {fmt(m['p50']):>7} {fmt(m['p95']):>7} "
                  f"{fmt(m['mean']):>7}")
