"""E2B's code interpreter API (what @e2b/code-interpreter's runCode and contexts calls send to a
sandbox's port 49999), served by the agent under /ci on the same Jupyter kernels as execd's
/code: driven through coved's gateway to the agent, and the lines folded as the SDK folds them
(its parseOutput)."""

import base64
import http.client
import json
import os

import pytest

import covetest
from covetest import AGENT_PORT

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
NATIVE = pytest.mark.native_only(reason="gVisor passes the agent no cove-kernel descriptor: "
                                 "code contexts are a 400 there (test_runtimes.py::"
                                 "test_code_contexts)")


def ci_path(sid, path):
    return f"/sandboxes/{sid}/proxy/{AGENT_PORT}/ci{path}"


def call(coved, sid, method, path, body=None, raw=None):
    return coved.request(method, ci_path(sid, path), body=body, raw=raw, timeout=120)


class Execution:
    """One POST /execute, folded as the SDK's parseOutput folds its lines."""

    def __init__(self, status, raw):
        self.status = status
        self.raw = raw
        self.lines = [json.loads(line) for line in raw.splitlines() if line] if status == 200 else []
        self.stdout = "".join(m["text"] for m in self.lines if m["type"] == "stdout")
        self.stderr = "".join(m["text"] for m in self.lines if m["type"] == "stderr")
        self.results = [m for m in self.lines if m["type"] == "result"]
        errors = [m for m in self.lines if m["type"] == "error"]
        self.error = errors[-1] if errors else None
        counts = [m["execution_count"] for m in self.lines if m["type"] == "number_of_executions"]
        self.count = counts[-1] if counts else None

    @property
    def text(self):
        """The SDK's Execution.text: the main result's text."""
        return next((r.get("text") for r in self.results if r["is_main_result"]), None)

    def body(self):
        """An error answer's body."""
        return json.loads(self.raw)


def execute(coved, sid, code, raw=None, **fields):
    body = raw if raw is not None else json.dumps(dict(code=code, **fields))
    conn = http.client.HTTPConnection("127.0.0.1", coved.port, timeout=120)
    conn.request("POST", ci_path(sid, "/execute"), body=body, headers=coved.headers())
    resp = conn.getresponse()
    raw_answer = resp.read().decode(errors="replace")
    conn.close()
    return Execution(resp.status, raw_answer)


def ok(execution):
    assert execution.status == 200, execution.raw
    assert execution.error is None, execution.error
    # Every stream ends with end_of_execution, as E2B's server ends it.
    assert execution.lines and execution.lines[-1] == {"type": "end_of_execution"}
    return execution


@pytest.fixture(scope="module")
def ci(coved):
    sid = coved.create(template="code-interpreter", limits={"cpu": "1", "memory": "1Gi"})
    yield sid
    coved.delete(sid)


def test_health(coved, ci):
    status, body, _ = call(coved, ci, "GET", "/health")
    assert (status, body) == (200, "OK")


@NATIVE
def test_stdout_streams_and_state_is_kept_in_the_default_context(coved, ci):
    r = ok(execute(coved, ci, "print('hello from e2b')\nx = 1"))
    assert r.stdout == "hello from e2b\n"
    stdout = next(m for m in r.lines if m["type"] == "stdout")
    assert stdout["timestamp"].endswith("Z")
    assert r.count is not None and r.results == []
    again = ok(execute(coved, ci, "x + 1"))
    assert again.text == "2" and again.count == r.count + 1
    # The default python context is execd's too: a run naming only the language sees x.
    assert ok(execute(coved, ci, "x", language="Python")).text == "1"
    conn = http.client.HTTPConnection("127.0.0.1", coved.port, timeout=120)
    conn.request("POST", f"/sandboxes/{ci}/proxy/{AGENT_PORT}/code",
                 body=json.dumps({"code": "x * 10", "context": {"language": "python"}}),
                 headers=coved.headers())
    raw = conn.getresponse().read().decode()
    conn.close()
    assert '"text":"10"' in raw


@NATIVE
def test_stderr_and_string_results_lose_their_quotes(coved, ci):
    r = ok(execute(coved, ci, "import sys\nsys.stderr.write('warned\\n')\n'a string'"))
    assert r.stderr == "warned\n" and r.text == "a string"


@NATIVE
def test_exception_is_an_error_line_with_name_value_and_traceback(coved, ci):
    r = execute(coved, ci, "def divide(a, b):\n    return a / b\n\ndivide(1, 0)\n")
    assert r.status == 200 and r.lines[-1] == {"type": "end_of_execution"}
    assert r.error["name"] == "ZeroDivisionError" and r.error["value"] == "division by zero"
    assert isinstance(r.error["traceback"], str) and "divide" in r.error["traceback"]
    # The kernel stays.
    assert ok(execute(coved, ci, "40 + 2")).text == "42"


@NATIVE
def test_matplotlib_chart_is_a_png_result(coved, ci):
    r = ok(execute(coved, ci, (
        "import matplotlib\n"
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3], [4, 1, 9])\n"
        "plt.title('sales')\n"
        "plt.show()\n")))
    charts = [m for m in r.results if "png" in m]
    assert len(charts) == 1, r.results
    assert base64.b64decode(charts[0]["png"]).startswith(PNG_MAGIC)
    assert charts[0]["is_main_result"] is False  # a display, not the cell's value
    assert "Figure" in charts[0]["text"]


@NATIVE
def test_rich_results_have_their_fields(coved, ci):
    r = ok(execute(coved, ci, (
        "from IPython.display import display, HTML, JSON, Markdown\n"
        "display(HTML('<b>bold</b>'))\n"
        "display(JSON({'a': [1, 2]}))\n"
        "display(Markdown('# title'))\n"
        "7 * 6\n")))
    html, js, md, value = r.results
    assert html["html"] == "<b>bold</b>" and not html["is_main_result"]
    assert js["json"] == {"a": [1, 2]}
    assert md["markdown"] == "# title"
    assert value == {"type": "result", "text": "42", "is_main_result": True}


@NATIVE
def test_a_separate_context_has_its_own_state(coved, ci):
    status, ctx, _ = call(coved, ci, "POST", "/contexts", body={"language": "python", "cwd": "/tmp"})
    assert status == 200, ctx
    assert ctx["language"] == "python" and ctx["cwd"] == "/tmp" and ctx["id"]
    ok(execute(coved, ci, "secret = 41", context_id=ctx["id"]))
    other = execute(coved, ci, "secret")  # the default context has no such name
    assert other.status == 200 and other.error["name"] == "NameError"
    r = ok(execute(coved, ci, "import os\nprint(os.getcwd())\nsecret + 1", context_id=ctx["id"]))
    assert r.stdout == "/tmp\n" and r.text == "42"

    status, listed, _ = call(coved, ci, "GET", "/contexts")
    assert status == 200 and ctx in listed
    assert all(set(c) == {"id", "language", "cwd"} for c in listed)
    # The same context through execd's API.
    status, same, _ = coved.request("GET", f"/sandboxes/{ci}/proxy/{AGENT_PORT}/code/contexts/"
                                           f"{ctx['id']}")
    assert status == 200 and same == {"id": ctx["id"], "language": "python"}

    status, _, _ = call(coved, ci, "DELETE", f"/contexts/{ctx['id']}")
    assert status == 200
    assert ctx not in call(coved, ci, "GET", "/contexts")[1]
    gone = execute(coved, ci, "1", context_id=ctx["id"])
    assert gone.status == 404 and gone.body() == {"code": 404,
                                                  "message": f"Context {ctx['id']} not found"}
    status, body, _ = call(coved, ci, "DELETE", f"/contexts/{ctx['id']}")
    assert status == 404 and body["code"] == 404


@NATIVE
def test_restart_loses_the_state_and_keeps_the_context(coved, ci):
    status, ctx, _ = call(coved, ci, "POST", "/contexts", body={})
    assert status == 200 and ctx["language"] == "python"
    ok(execute(coved, ci, "kept = 'before'", context_id=ctx["id"]))
    status, _, _ = call(coved, ci, "POST", f"/contexts/{ctx['id']}/restart")
    assert status == 200
    r = execute(coved, ci, "kept", context_id=ctx["id"])
    assert r.status == 200 and r.error["name"] == "NameError"
    assert ok(execute(coved, ci, "'after'", context_id=ctx["id"])).text == "after"
    assert ctx["id"] in [c["id"] for c in call(coved, ci, "GET", "/contexts")[1]]
    status, body, _ = call(coved, ci, "POST", "/contexts/no-such-context/restart")
    assert status == 404 and "no-such-context" in body["message"]
    assert call(coved, ci, "DELETE", f"/contexts/{ctx['id']}")[0] == 200


@NATIVE
def test_restart_ends_the_run_under_way(coved, ci):
    status, ctx, _ = call(coved, ci, "POST", "/contexts", body={"language": "python"})
    assert status == 200, ctx
    conn = http.client.HTTPConnection("127.0.0.1", coved.port, timeout=120)
    try:
        conn.request("POST", ci_path(ci, "/execute"), headers=coved.headers(),
                     body=json.dumps({"code": "import time\nprint('started', flush=True)\n"
                                              "time.sleep(600)", "context_id": ctx["id"]}))
        resp = conn.getresponse()
        assert resp.status == 200
        seen = []
        while not any(m["type"] == "stdout" for m in seen):
            seen.append(json.loads(resp.readline()))
        assert call(coved, ci, "POST", f"/contexts/{ctx['id']}/restart")[0] == 200
        rest = [json.loads(line) for line in resp.read().decode().splitlines() if line]
    finally:
        conn.close()
    errors = [m for m in rest if m["type"] == "error"]
    assert [e["name"] for e in errors] == ["ContextRestarting"], rest
    assert rest[-1] == {"type": "end_of_execution"}
    assert ok(execute(coved, ci, "'fresh'", context_id=ctx["id"])).text == "fresh"
    assert call(coved, ci, "DELETE", f"/contexts/{ctx['id']}")[0] == 200


@NATIVE
def test_a_client_that_leaves_interrupts_its_run(coved, ci):
    status, ctx, _ = call(coved, ci, "POST", "/contexts", body={"language": "python"})
    assert status == 200, ctx
    conn = http.client.HTTPConnection("127.0.0.1", coved.port, timeout=120)
    conn.request("POST", ci_path(ci, "/execute"), headers=coved.headers(),
                 body=json.dumps({"code": "import time\nprint('looping', flush=True)\n"
                                          "while True:\n    time.sleep(0.1)",
                                  "context_id": ctx["id"]}))
    resp = conn.getresponse()
    while json.loads(resp.readline())["type"] != "stdout":
        pass
    conn.close()  # as the SDK's timeoutMs aborts its fetch
    # The loop was interrupted: the context runs the next code, its state intact.
    ok(execute(coved, ci, "after = 'yes'", context_id=ctx["id"]))
    assert ok(execute(coved, ci, "after", context_id=ctx["id"])).text == "yes"
    assert call(coved, ci, "DELETE", f"/contexts/{ctx['id']}")[0] == 200


@NATIVE
def test_env_vars_hold_for_one_execution(coved, ci):
    r = ok(execute(coved, ci, "import os\nprint(os.environ.get('E2B_GREETING'))",
                   env_vars={"E2B_GREETING": "hello"}))
    assert r.stdout == "hello\n"
    after = ok(execute(coved, ci, "import os\nprint(os.environ.get('E2B_GREETING'))"))
    assert after.stdout == "None\n"
    # A variable the sandbox has is its own again after the run.
    home = ok(execute(coved, ci, "print(os.environ['HOME'])")).stdout
    r = ok(execute(coved, ci, "print(os.environ['HOME'])", env_vars={"HOME": "/elsewhere"}))
    assert r.stdout == "/elsewhere\n"
    assert ok(execute(coved, ci, "print(os.environ['HOME'])")).stdout == home
    # javascript too (Cove's own kernel), in its default context.
    js = ok(execute(coved, ci, "console.log(process.env.E2B_GREETING)", language="js",
                    env_vars={"E2B_GREETING": "hi from js"}))
    assert js.stdout == "hi from js\n"
    assert ok(execute(coved, ci, "console.log(process.env.E2B_GREETING)",
                      language="javascript")).stdout == "undefined\n"
    # Elsewhere env_vars are refused, not ignored.
    before = call(coved, ci, "GET", "/contexts")[1]
    r = execute(coved, ci, "1", language="java", env_vars={"A": "b"})
    assert r.status == 400 and "env_vars" in r.body()["message"]
    assert call(coved, ci, "GET", "/contexts")[1] == before


def test_bad_input_is_a_clear_error_and_changes_nothing(coved, ci):
    before = call(coved, ci, "GET", "/contexts")[1]
    cases = [
        (dict(raw="{not json"), "invalid request body"),
        (dict(raw="[1, 2]"), "JSON object"),
        (dict(raw=json.dumps({"language": "python"})), "code is required"),
        (dict(raw=json.dumps({"code": 1})), "code must be a string"),
        (dict(raw=json.dumps({"code": "1", "context_id": 5})), "context_id must be a string"),
        (dict(raw=json.dumps({"code": "1", "env_vars": ["A"]})), "env_vars must be an object"),
        (dict(raw=json.dumps({"code": "1", "env_vars": {"A": 1}})), "env_vars must be an object"),
        (dict(raw=json.dumps({"code": "1", "context_id": "x", "language": "python"})),
         "Only one of context_id or language"),
        (dict(raw=json.dumps({"code": "1", "language": "no such!"})), "unknown language"),
        (dict(raw=json.dumps({"code": "ls", "language": "bash"})), "execd's API"),
    ]
    for kw, message in cases:
        r = execute(coved, ci, None, **kw)
        assert r.status == 400, (kw, r.raw)
        assert r.body()["code"] == 400 and message in r.body()["message"], (kw, r.raw)
    r = execute(coved, ci, "1", context_id="no-such-context")
    assert r.status == 404 and r.body()["code"] == 404
    status, body, _ = call(coved, ci, "POST", "/contexts", body={"language": 3})
    assert status == 400 and "language must be a string" in body["message"]
    status, body, _ = call(coved, ci, "POST", "/contexts", body={"language": "bash"})
    assert status == 400 and "execd's API" in body["message"]
    status, body, _ = call(coved, ci, "POST", "/contexts", raw="nope")
    assert status == 400 and body["code"] == 400
    assert call(coved, ci, "GET", "/contexts")[1] == before


def test_language_without_kernel_is_a_clear_400(coved, ci):
    r = execute(coved, ci, "DISPLAY 'HI'", language="cobol")
    assert r.status == 400 and "no kernel for cobol" in r.body()["message"], r.raw
    status, body, _ = call(coved, ci, "POST", "/contexts", body={"language": "cobol"})
    assert status == 400 and body["code"] == 400 and "no kernel for cobol" in body["message"]
    assert "cobol" not in [c["language"] for c in call(coved, ci, "GET", "/contexts")[1]]


@pytest.mark.static_agent
def test_sandbox_without_a_kernel_answers_a_clear_error(coved, tmp_path):
    # A root filesystem without Jupyter (nor the kernel helper's libraries): a static busybox.
    name = covetest.busybox_template(coved, tmp_path / "rootfs", "bb-e2b-")
    sid = coved.create(template=name)
    try:
        r = execute(coved, sid, "print(1)")
        assert r.status == 400, r.raw
        assert r.body()["code"] == 400 and "no kernel for python" in r.body()["message"]
        status, body, _ = call(coved, sid, "POST", "/contexts", body={})
        assert status == 400 and "no kernel for python" in body["message"]
        assert call(coved, sid, "GET", "/contexts")[1] == []
        assert call(coved, sid, "GET", "/health")[:2] == (200, "OK")
    finally:
        coved.delete(sid)
