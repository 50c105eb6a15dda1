"""The code interpreter (execd's /code operations): Jupyter kernels that keep their state between
runs and across pause/resume, rich results, errors, interrupts, contexts; bash contexts and
stateless runs; the `cove run-code` CLI. Driven through coved's gateway as a client would."""

import base64
import http.client
import io
import json
import os
import random
import secrets
import subprocess
import threading
import time

import pytest

import covetest
from covetest import AGENT_PORT, CLI, parse_events

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def agent_path(sid, path):
    return f"/sandboxes/{sid}/proxy/{AGENT_PORT}{path}"


def call(coved, sid, method, path, body=None, raw=None, headers=None):
    h = coved.headers()
    if headers:
        h.update(headers)
    return coved.request(method, agent_path(sid, path), body=body, raw=raw, headers=h)


class Run:
    """The events of one POST /code, folded the way the SDKs fold them."""

    def __init__(self, status, events, raw):
        self.status = status
        self.events = events
        self.raw = raw
        self.stdout = "".join(e["text"] for e in events if e["type"] == "stdout")
        self.stderr = "".join(e["text"] for e in events if e["type"] == "stderr")
        self.results = [e["results"] for e in events if e["type"] == "result"]
        self.errors = [e["error"] for e in events if e["type"] == "error"]
        self.error = self.errors[0] if self.errors else None
        counts = [e["execution_count"] for e in events if e["type"] == "execution_count"]
        self.count = counts[-1] if counts else None
        self.complete = [e for e in events if e["type"] == "execution_complete"]
        self.context = events[0]["text"] if events and events[0]["type"] == "init" else None

    @property
    def text(self):
        return [r["text"] for r in self.results if "text" in r]


def run_code(coved, sid, code, context=None, timeout=120):
    body = {"code": code}
    if context is not None:
        body["context"] = context
    conn = http.client.HTTPConnection("127.0.0.1", coved.port, timeout=timeout)
    conn.request("POST", agent_path(sid, "/code"), body=json.dumps(body), headers=coved.headers())
    resp = conn.getresponse()
    raw = resp.read().decode(errors="replace")
    conn.close()
    if resp.status != 200:
        return Run(resp.status, [], raw)
    assert resp.getheader("Content-Type") == "text/event-stream"
    return Run(resp.status, parse_events(raw), raw)


def ok(run):
    assert run.status == 200, run.raw
    assert not run.errors, run.errors
    assert len(run.complete) == 1 and run.complete[0]["execution_time"] >= 0, run.events
    return run


def new_context(coved, sid, language="python"):
    status, body, _ = call(coved, sid, "POST", "/code/context", body={"language": language})
    assert status == 200, body
    assert body["language"] == language and body["id"]
    return body["id"]


def multipart(path, content):
    boundary = "cove-" + secrets.token_hex(8)
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"metadata\"\r\n"
            f"Content-Type: application/json\r\n\r\n{json.dumps({'path': path})}\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n"
            f"Content-Type: application/octet-stream\r\n\r\n").encode()
    body += content + f"\r\n--{boundary}--\r\n".encode()
    return body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}


@pytest.fixture(scope="module")
def ci(coved):
    """A code-interpreter sandbox shared by the tests that only add contexts of their own."""
    sid = coved.create(template="code-interpreter", limits={"cpu": "1", "memory": "1Gi"})
    yield sid
    coved.delete(sid)


# ---- the acceptance scenarios ----

@pytest.mark.native_only(reason="gVisor passes the agent no cove-kernel descriptor: code contexts are a 400 there (test_runtimes.py::test_code_contexts)")
def test_quickstart_sums_sales_per_region(coved, ci):
    coved.sh(ci, "printf 'region,amount\\nhangzhou,120\\nbeijing,80\\nhangzhou,45\\n"
                 "shanghai,200\\nbeijing,30\\n' > /root/sales.csv")
    script = (
        "import csv\n"
        "from collections import defaultdict\n"
        "totals = defaultdict(int)\n"
        "with open('/root/sales.csv') as f:\n"
        "    for row in csv.DictReader(f):\n"
        "        totals[row['region']] += int(row['amount'])\n"
        "for region, amount in sorted(totals.items(), key=lambda kv: -kv[1]):\n"
        "    print(region, amount)\n")
    r = ok(run_code(coved, ci, script, context={"language": "python"}))
    assert r.stdout == "shanghai 200\nhangzhou 165\nbeijing 110\n"


def sales_q3_csv(rows=400_000):
    """region, category, month, amount; in East China furniture falls fastest over Q3."""
    rng = random.Random(20240930)
    regions = ["East China", "North China", "South China", "West China"]
    categories = ["electronics", "apparel", "groceries", "furniture", "toys"]
    months = ["2024-07", "2024-08", "2024-09"]
    trend = {c: (1.0, 0.97, 0.94) for c in categories}
    trend["furniture"] = (1.0, 0.72, 0.45)
    trend["toys"] = (1.0, 0.9, 0.8)
    out = io.StringIO()
    out.write("region,category,month,amount\n")
    for _ in range(rows):
        region, category, m = rng.choice(regions), rng.choice(categories), rng.randrange(3)
        factor = trend[category][m] if region == "East China" else 1.0
        out.write(f"{region},{category},{months[m]},{rng.uniform(10, 500) * factor:.2f}\n")
    return out.getvalue().encode()


@pytest.mark.native_only(reason="gVisor passes the agent no cove-kernel descriptor: code contexts are a 400 there (test_runtimes.py::test_code_contexts)")
def test_operator_scenario_dataframe_survives_pause(coved):
    sid = coved.create(template="code-interpreter", limits={"cpu": "1", "memory": "1Gi"})
    try:
        raw, headers = multipart("/root/sales_q3.csv", sales_q3_csv())
        status, body, _ = call(coved, sid, "POST", "/files/upload", raw=raw, headers=headers)
        assert status == 200, body
        assert coved.sh(sid, "wc -l < /root/sales_q3.csv").strip() == "400001"
        ctx = new_context(coved, sid)

        load = ok(run_code(coved, sid, (
            "import pandas as pd\n"
            "reads = 0\n"
            "def load(path):\n"
            "    global reads\n"
            "    reads += 1\n"
            "    return pd.read_csv(path)\n"
            "df = load('/root/sales_q3.csv')\n"
            "print(len(df), id(df))\n"), context={"id": ctx}))
        rows, df_id = load.stdout.split()
        assert rows == "400000"

        plot = ok(run_code(coved, sid, (
            "east = df[df.region == 'East China']\n"
            "monthly = east.pivot_table(index='month', columns='category', values='amount',\n"
            "                           aggfunc='sum').sort_index()\n"
            "change = (monthly.iloc[-1] - monthly.iloc[0]) / monthly.iloc[0]\n"
            "fastest = change.idxmin()\n"
            "print(fastest, f'{change[fastest]:.0%}')\n"
            "ax = monthly[fastest].plot(marker='o', title=f'East China: {fastest} in Q3')\n"
            "ax.set_ylabel('sales')\n"), context={"id": ctx}))
        assert plot.stdout.split()[0] == "furniture", plot.stdout
        pngs = [r["image/png"] for r in plot.results if "image/png" in r]
        assert len(pngs) == 1, plot.results  # shown without savefig or plt.show()
        assert base64.b64decode(pngs[0]).startswith(PNG_MAGIC)

        # The file goes away and the sandbox sleeps: the answer must come from memory.
        coved.sh(sid, "rm /root/sales_q3.csv")
        coved.pause(sid)
        assert coved.get(sid)["status"]["state"] == "Paused"
        coved.resume(sid)
        assert coved.get(sid)["status"]["state"] == "Running"

        again = ok(run_code(coved, sid, (
            "import os\n"
            "print(id(df), reads, len(df), os.path.exists('/root/sales_q3.csv'))\n"
            "change.idxmin()\n"), context={"id": ctx}))
        assert again.stdout.split() == [df_id, "1", "400000", "False"]
        assert again.text == ["'furniture'"]
        assert again.count == 3
    finally:
        coved.delete(sid)


# ---- results and errors ----

@pytest.mark.native_only(reason="gVisor passes the agent no cove-kernel descriptor: code contexts are a 400 there (test_runtimes.py::test_code_contexts)")
def test_results_carry_mime_bundles(coved, ci):
    ctx = new_context(coved, ci)
    r = ok(run_code(coved, ci, (
        "from IPython.display import display, HTML, SVG, JSON\n"
        "display(HTML('<b>bold</b>'))\n"
        "display(SVG('<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"4\" height=\"4\"/>'))\n"
        "display(JSON({'a': [1, 2]}))\n"
        "print('printed')\n"
        "6 * 7\n"), context={"id": ctx}))
    assert r.context == ctx
    assert r.events[0]["type"] == "init"
    assert r.stdout == "printed\n"
    html, svg, js, value = r.results
    assert html["text/html"] == "<b>bold</b>" and "text" in html
    assert svg["image/svg+xml"].startswith("<svg")
    assert js["application/json"] == {"a": [1, 2]}
    assert value == {"text": "42"}  # text/plain is reported as text
    assert r.count == 1
    assert [e["text"] for e in r.events if e["type"] == "status"] == ["busy", "idle"]
    assert all(isinstance(e["timestamp"], int) for e in r.events)


@pytest.mark.native_only(reason="gVisor passes the agent no cove-kernel descriptor: code contexts are a 400 there (test_runtimes.py::test_code_contexts)")
def test_exception_and_syntax_error_report_ename_and_traceback(coved, ci):
    ctx = new_context(coved, ci)
    r = run_code(coved, ci, "def divide(a, b):\n    return a / b\n\ndivide(1, 0)\n",
                 context={"id": ctx})
    assert r.status == 200 and len(r.errors) == 1
    assert r.error["ename"] == "ZeroDivisionError" and r.error["evalue"] == "division by zero"
    assert len(r.error["traceback"]) > 1 and "divide" in "".join(r.error["traceback"])
    assert len(r.complete) == 1  # the kernel finished the execution and stays
    r = run_code(coved, ci, "raise ValueError('bad input')", context={"id": ctx})
    assert (r.error["ename"], r.error["evalue"]) == ("ValueError", "bad input")
    r = run_code(coved, ci, "def f(:\n    pass\n", context={"id": ctx})
    assert r.error["ename"] == "SyntaxError" and r.error["traceback"]
    assert ok(run_code(coved, ci, "'still here'", context={"id": ctx})).text == ["'still here'"]


@pytest.mark.native_only(reason="gVisor passes the agent no cove-kernel descriptor: code contexts are a 400 there (test_runtimes.py::test_code_contexts)")
def test_infinite_loop_is_interrupted_and_kernel_survives(coved, ci):
    ctx = new_context(coved, ci)
    ok(run_code(coved, ci, "kept = 'before'", context={"id": ctx}))

    def interrupt():
        time.sleep(1.0)
        status, body, _ = call(coved, ci, "DELETE", f"/code?id={ctx}")
        assert status == 200, body

    t = threading.Thread(target=interrupt)
    t.start()
    started = time.monotonic()
    r = run_code(coved, ci, "while True:\n    pass\n", context={"id": ctx}, timeout=60)
    t.join()
    assert time.monotonic() - started < 30
    assert r.error["ename"] == "KeyboardInterrupt", r.events
    assert ok(run_code(coved, ci, "1+1", context={"id": ctx})).text == ["2"]
    assert ok(run_code(coved, ci, "kept", context={"id": ctx})).text == ["'before'"]
    # Interrupting an idle context is harmless; missing ids are refused.
    assert call(coved, ci, "DELETE", f"/code?id={ctx}")[0] == 200
    assert call(coved, ci, "DELETE", "/code")[0] == 400
    assert call(coved, ci, "DELETE", "/code?id=no-such-context")[0] == 404


@pytest.mark.native_only(reason="gVisor passes the agent no cove-kernel descriptor: code contexts are a 400 there (test_runtimes.py::test_code_contexts)")
def test_killed_kernel_reports_error_and_next_run_gets_a_fresh_one(coved, ci):
    ctx = new_context(coved, ci)
    ok(run_code(coved, ci, "lost = 1", context={"id": ctx}))
    started = time.monotonic()
    r = run_code(coved, ci, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
                 context={"id": ctx}, timeout=60)
    assert r.status == 200 and r.error["ename"] == "KernelDied", r.events
    assert "killed by signal 9" in r.error["evalue"]
    r = ok(run_code(coved, ci, "print('lost' in globals()); 1+1", context={"id": ctx}))
    assert (r.stdout, r.text, r.count) == ("False\n", ["2"], 1)
    assert time.monotonic() - started < 30
    assert call(coved, ci, "GET", f"/code/contexts/{ctx}")[0] == 200  # same context


@pytest.mark.native_only(reason="gVisor passes the agent no cove-kernel descriptor: code contexts are a 400 there (test_runtimes.py::test_code_contexts)")
def test_runs_of_a_context_queue_and_a_client_that_leaves_interrupts_its_run(coved, ci):
    ctx = new_context(coved, ci)
    done = {}

    def first():
        done["first"] = run_code(coved, ci, "import time\ntime.sleep(1)\nprint('first')",
                                 context={"id": ctx})

    t = threading.Thread(target=first)
    t.start()
    time.sleep(0.3)
    second = ok(run_code(coved, ci, "print('second')", context={"id": ctx}))
    t.join()
    assert (ok(done["first"]).stdout, second.stdout) == ("first\n", "second\n")
    assert second.count == done["first"].count + 1  # one after the other, in order

    # A client that hangs up takes its execution with it (as execd: the kernel is interrupted).
    body = json.dumps({"code": "import time\nwhile True:\n    time.sleep(0.01)\n",
                       "context": {"id": ctx}})
    conn = http.client.HTTPConnection("127.0.0.1", coved.port, timeout=60)
    conn.request("POST", agent_path(ci, "/code"), body=body, headers=coved.headers())
    resp = conn.getresponse()
    assert resp.status == 200
    resp.read1(1)  # the stream has begun
    conn.close()
    started = time.monotonic()
    assert ok(run_code(coved, ci, "'free again'", context={"id": ctx})).text == ["'free again'"]
    assert time.monotonic() - started < 20


@pytest.mark.native_only(reason="gVisor passes the agent no cove-kernel descriptor: code contexts are a 400 there (test_runtimes.py::test_code_contexts)")
def test_clients_that_leave_at_once_never_wedge_or_abort_the_next_run(coved, ci):
    """An interrupt can land while the kernel is still entering the code (IPython then goes
    idle without replying) or just after an error (IPython then aborts what comes next): the
    next run must still come back, and succeed. Repeated to hit both windows."""
    ctx = new_context(coved, ci)
    body = json.dumps({"code": "import time\nwhile True:\n    time.sleep(0.01)\n",
                       "context": {"id": ctx}})
    for i in range(15):
        conn = http.client.HTTPConnection("127.0.0.1", coved.port, timeout=60)
        conn.request("POST", agent_path(ci, "/code"), body=body, headers=coved.headers())
        resp = conn.getresponse()
        assert resp.status == 200
        resp.read1(1)
        conn.close()
        r = run_code(coved, ci, f"'free {i}'", context={"id": ctx}, timeout=30)
        assert ok(r).text == [f"'free {i}'"], (i, r.events)


@pytest.mark.native_only(reason="gVisor passes the agent no cove-kernel descriptor: code contexts are a 400 there (test_runtimes.py::test_code_contexts)")
def test_deleting_a_context_ends_its_run(coved, ci):
    ctx = new_context(coved, ci)

    def delete():
        time.sleep(0.8)
        assert call(coved, ci, "DELETE", f"/code/contexts/{ctx}")[0] == 200

    t = threading.Thread(target=delete)
    t.start()
    r = run_code(coved, ci, "import time\ntime.sleep(60)", context={"id": ctx}, timeout=30)
    t.join()
    assert r.status == 200 and r.error["ename"] == "ContextDeleted" and not r.complete


@pytest.mark.native_only(reason="gVisor passes the agent no cove-kernel descriptor: code contexts are a 400 there (test_runtimes.py::test_code_contexts)")
def test_kernel_that_cannot_start_is_an_error_with_its_complaint(coved):
    # Kernelspecs come from the sandbox's own Jupyter path too.
    sid = coved.create(template="base", env={"JUPYTER_PATH": "/tmp/jupyter"})
    try:
        spec = {"argv": ["/bin/sh", "-c", "echo no such module >&2; exit 3", "{connection_file}"],
                "language": "broken"}
        coved.sh(sid, "mkdir -p /tmp/jupyter/kernels/broken && cat > "
                      f"/tmp/jupyter/kernels/broken/kernel.json <<'EOF'\n{json.dumps(spec)}\nEOF")
        status, body, _ = call(coved, sid, "POST", "/code/context", body={"language": "broken"})
        assert status == 500 and body["code"] == "RUNTIME_ERROR", body
        assert "exited during start-up: exit status 3: no such module" in body["message"]
        r = run_code(coved, sid, "1", context={"language": "broken"})
        assert r.status == 500 and "no such module" in r.raw
        assert call(coved, sid, "GET", "/code/contexts")[1] == []
    finally:
        coved.delete(sid)


# ---- contexts ----

@pytest.mark.native_only(reason="gVisor passes the agent no cove-kernel descriptor: code contexts are a 400 there (test_runtimes.py::test_code_contexts)")
def test_contexts_are_isolated_listed_and_deleted(coved, ci):
    a, b = new_context(coved, ci), new_context(coved, ci)
    assert a != b
    ok(run_code(coved, ci, "secret = 41", context={"id": a}))
    r = run_code(coved, ci, "secret", context={"id": b})
    assert r.error["ename"] == "NameError"
    assert ok(run_code(coved, ci, "secret + 1", context={"id": a})).text == ["42"]

    status, listed, _ = call(coved, ci, "GET", "/code/contexts?language=python")
    assert status == 200 and {"id": a, "language": "python"} in listed
    assert {c["id"] for c in listed} >= {a, b}
    assert call(coved, ci, "GET", f"/code/contexts/{a}")[1] == {"id": a, "language": "python"}
    assert call(coved, ci, "GET", "/code/contexts?language=bash")[1] == []

    assert call(coved, ci, "DELETE", f"/code/contexts/{a}")[0] == 200
    status, body, _ = call(coved, ci, "GET", f"/code/contexts/{a}")
    assert status == 404 and body["code"] == "CONTEXT_NOT_FOUND"
    assert run_code(coved, ci, "1", context={"id": a}).status == 404
    assert call(coved, ci, "DELETE", f"/code/contexts/{a}")[0] == 404
    assert ok(run_code(coved, ci, "'b lives'", context={"id": b})).text == ["'b lives'"]

    assert call(coved, ci, "DELETE", "/code/contexts")[0] == 400  # language is required
    assert call(coved, ci, "DELETE", "/code/contexts?language=python")[0] == 200
    assert call(coved, ci, "GET", "/code/contexts?language=python")[1] == []
    # A run naming only the language makes its default context again.
    r = ok(run_code(coved, ci, "1+1", context={"language": "python"}))
    assert call(coved, ci, "GET", "/code/contexts?language=python")[1] == [
        {"id": r.context, "language": "python"}]


@pytest.mark.native_only(reason="gVisor passes the agent no cove-kernel descriptor: code contexts are a 400 there (test_runtimes.py::test_code_contexts)")
def test_language_only_runs_share_the_default_context(coved, ci):
    first = ok(run_code(coved, ci, "shared = 'default'", context={"language": "python"}))
    again = ok(run_code(coved, ci, "shared", context={"language": "Python"}))
    assert again.context == first.context and again.text == ["'default'"]


@pytest.mark.native_only(reason="gVisor passes the agent no cove-kernel descriptor: code contexts are a 400 there (test_runtimes.py::test_code_contexts)")
def test_prestarted_kernel_and_none_without_prestart(coved):
    sid = coved.create(template="code-interpreter")
    plain = coved.create(template="base")
    try:
        # The template's default kernel is under way before any request for it.
        status, listed, _ = call(coved, sid, "GET", "/code/contexts")
        assert status == 200 and [c["language"] for c in listed] == ["python"]
        r = ok(run_code(coved, sid, "1+1", context={"language": "python"}))
        assert r.context == listed[0]["id"] and r.text == ["2"]
        assert call(coved, plain, "GET", "/code/contexts")[1] == []
        assert ok(run_code(coved, plain, "1+1", context={"language": "python"})).text == ["2"]
    finally:
        coved.delete(sid)
        coved.delete(plain)


def test_language_without_kernel_is_a_clear_400(coved, ci, tmp_path):
    status, body, _ = call(coved, ci, "POST", "/code/context", body={"language": "cobol"})
    assert status == 400 and "no kernel for cobol" in body["message"], body
    r = run_code(coved, ci, "DISPLAY 'HI'", context={"language": "cobol"})
    assert r.status == 400 and "no kernel for cobol" in json.loads(r.raw)["message"]
    assert call(coved, ci, "GET", "/code/contexts?language=cobol")[1] == []
    status, body, _ = call(coved, ci, "POST", "/code/context", body={})
    assert status == 400 and body["code"] == "INVALID_REQUEST_BODY"
    assert run_code(coved, ci, "").status == 400
    assert call(coved, ci, "POST", "/code", raw="{not json")[0] == 400


@pytest.mark.static_agent
def test_template_without_the_helpers_libraries_has_no_kernels(coved, tmp_path):
    # A root filesystem without the helper's libraries (a static busybox) has no kernels.
    name = covetest.busybox_template(coved, tmp_path / "rootfs", "bb-code-")
    sid = coved.create(template=name)
    try:
        status, body, _ = call(coved, sid, "POST", "/code/context", body={"language": "python"})
        assert status == 400 and "no kernel for python" in body["message"], body
        assert call(coved, sid, "GET", "/code/contexts")[1] == []
        assert coved.sh(sid, "echo still fine") == "still fine\n"
    finally:
        coved.delete(sid)


# ---- bash contexts and stateless runs ----

def test_bash_context_keeps_directory_and_environment(coved, ci):
    ctx = new_context(coved, ci, "bash")
    r = run_code(coved, ci, "cd /tmp && export GREETING=hello", context={"id": ctx})
    assert r.status == 200 and r.complete and r.context == ctx
    r = run_code(coved, ci, "echo $GREETING; pwd", context={"id": ctx})
    assert [e["text"] for e in r.events if e["type"] == "stdout"] == ["hello", "/tmp"]
    r = run_code(coved, ci, "exit 3", context={"id": ctx})
    assert r.error["ename"] == "CommandExecError" and r.error["evalue"] == "3"
    assert {"id": ctx, "language": "bash"} in call(coved, ci, "GET", "/code/contexts?language=bash")[1]
    assert call(coved, ci, "DELETE", f"/code/contexts/{ctx}")[0] == 200
    assert run_code(coved, ci, "pwd", context={"id": ctx}).status == 404


def test_run_without_context_is_a_stateless_command(coved, ci):
    r = run_code(coved, ci, "echo hi from the shell; export GONE=1")
    assert r.status == 200 and r.complete
    assert [e["text"] for e in r.events if e["type"] == "stdout"] == ["hi from the shell"]
    r = run_code(coved, ci, "echo ${GONE:-unset}; exit 4", context={})
    assert [e["text"] for e in r.events if e["type"] == "stdout"] == ["unset"]
    assert r.error["evalue"] == "4"


# ---- the CLI ----

@pytest.mark.native_only(reason="gVisor passes the agent no cove-kernel descriptor: code contexts are a 400 there (test_runtimes.py::test_code_contexts)")
def test_cli_run_code_prints_text_saves_images_and_fails_on_error(coved, ci, tmp_path):
    env = dict(os.environ, COVE_SERVER=f"http://127.0.0.1:{coved.port}", COVE_API_KEY=coved.key)
    code = ("import matplotlib.pyplot as plt\n"
            "print('plotting')\n"
            "plt.plot([1, 2, 3], [3, 1, 2])\n"
            "'done'\n")
    r = subprocess.run([CLI, "run-code", ci, "--save-dir", str(tmp_path), "-"], input=code,
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "plotting"
    saved = [l for l in lines if l.startswith("[image/png saved to ")]
    assert len(saved) == 1, r.stdout
    path = saved[0][len("[image/png saved to "):-1]
    assert open(path, "rb").read().startswith(PNG_MAGIC)
    assert "'done'" in lines

    script = tmp_path / "fail.py"
    script.write_text("x = 1\n1 / 0\n")
    r = subprocess.run([CLI, "run-code", ci, "--language", "python", str(script)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 1 and "ZeroDivisionError" in r.stderr, (r.stdout, r.stderr)

    ctx = new_context(coved, ci, "bash")
    r = subprocess.run([CLI, "run-code", ci, "--context", ctx, "-"], input="echo a; echo b\n",
                       capture_output=True, text=True, env=env, timeout=120)
    assert (r.returncode, r.stdout) == (0, "a\nb\n"), r.stderr
    r = subprocess.run([CLI, "run-code", ci, "--context", "missing", "-"], input="1",
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 1 and "CONTEXT_NOT_FOUND" in r.stderr
