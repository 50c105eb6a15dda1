"""cove-agent as a warm pool's sandbox (--pooled, src/agent/pool.h): GET /cove/warm is held until
the prestarted kernel is ready, POST /cove/claim then gives the sandbox its user's environment
and entrypoint, once. coved cannot start pooled agents yet, so the agent runs directly on the
host (no sandbox, no coved), listening on a unix socket, with the real kernel helper
(--kernel-helper-fd) running the host's ipykernel. What is checked is what the user of a claimed
sandbox sees: commands, sessions, the prestarted Python kernel and new contexts all have the
claim's variables, and the silent update left no trace in the kernel's history."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time

import pytest

from covetest import AGENT, BUILD, ExecResult, parse_events
from test_agent_route_prefix import Agent, UnixConnection, check_error, listening, stop

KERNEL_HELPER = os.path.join(BUILD, "src", "kernel", "cove-kernel")
# A sandbox's PATH: the system's python3, whose ipykernel the host's kernelspec names.
SANDBOX_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def have_ipykernel():
    return subprocess.run(["/usr/bin/python3", "-c", "import ipykernel"],
                          capture_output=True).returncode == 0


needs_kernel = pytest.mark.skipif(not have_ipykernel() or not os.path.exists(KERNEL_HELPER),
                                  reason="needs the host's ipykernel and a built cove-kernel")


class PoolAgent(Agent):
    def command(self, command):
        status, text, _ = self.call("POST", "/command", {"command": command})
        assert status == 200, (status, text)
        return ExecResult(parse_events(text))

    def run_code(self, code, context=None):
        events = self.events("/code", {"code": code,
                                       "context": context or {"language": "python"}}, timeout=120)
        errors = [e for e in events if e.get("type") == "error"]
        assert not errors, events
        stdout = "".join(e["text"] for e in events if e.get("type") == "stdout")
        counts = [e["execution_count"] for e in events if e.get("type") == "execution_count"]
        return stdout, counts[-1] if counts else None, events[0].get("text")

    def claim(self, body=None, raw=None):
        return self.call("POST", "/cove/claim", body, raw=raw)


@contextlib.contextmanager
def start_agent(*flags, env=None, kernel=False, expect_exit=None):
    """The agent with flags (and, with kernel, the kernel helper's descriptor) on a fresh
    socket; stopped, with everything it started, at the end, even when the test fails."""
    top = tempfile.mkdtemp(prefix="cove-poolagent-")
    sock = os.path.join(top, "agent.sock")
    log = open(os.path.join(top, "agent.log"), "wb")
    home = os.path.join(top, "home")
    os.mkdir(home)
    agent_env = {"PATH": SANDBOX_PATH, "HOME": home, **(env or {})}
    helper_fd = os.open(KERNEL_HELPER, os.O_PATH) if kernel else None
    argv = [AGENT, "--listen", "unix:" + sock]
    if helper_fd is not None:
        argv += ["--kernel-helper-fd", str(helper_fd)]
    proc = subprocess.Popen(argv + list(flags), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                            env=agent_env, pass_fds=(helper_fd,) if kernel else (),
                            start_new_session=True)
    if helper_fd is not None:
        os.close(helper_fd)
    try:
        if expect_exit is not None:
            assert proc.wait(timeout=10) == expect_exit, open(log.name).read()
            yield open(log.name, errors="replace").read()
            return
        deadline = time.monotonic() + 10
        # The socket's file exists from its bind, before the agent listens: until a
        # connect is taken, it is not there yet.
        while not listening(sock):
            assert proc.poll() is None, open(log.name).read()
            assert time.monotonic() < deadline, "the agent did not listen"
            time.sleep(0.02)
        agent = PoolAgent(sock, home)
        agent.top = top
        agent.log = log.name
        yield agent
        stop(proc)
        with open(log.name, errors="replace") as f:
            text = f.read()
        for marker in ("AddressSanitizer", "LeakSanitizer", "runtime error:"):
            assert marker not in text, text
        assert proc.returncode == 0, text
    finally:
        stop(proc)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
        shutil.rmtree(top, ignore_errors=True)


def gated_kernelspec(top):
    """A python kernelspec whose kernel starts only once GATE exists: the prestart is held for
    as long as the test likes, with no timing involved. Its directory goes in JUPYTER_PATH."""
    spec_dir = os.path.join(top, "jupyter", "kernels", "python3")
    os.makedirs(spec_dir)
    gate = os.path.join(top, "gate")
    script = f'while [ ! -e {gate} ]; do sleep 0.05; done; exec /usr/bin/python3 -m ipykernel_launcher -f "$0"'
    with open(os.path.join(spec_dir, "kernel.json"), "w") as f:
        json.dump({"argv": ["sh", "-c", script, "{connection_file}"],
                   "display_name": "gated python", "language": "python"}, f)
    return os.path.join(top, "jupyter"), gate


def warm_in_thread(agent, results):
    def ask():
        results.append(agent.call("GET", "/cove/warm", timeout=180)[:2])
    t = threading.Thread(target=ask)
    t.start()
    return t


BAD_CLAIMS = [
    (None, "{nope"),
    (None, "[]"),
    ({"env": ["FOO=bar"]}, None),
    ({"env": {"FOO": 1}}, None),
    ({"env": {"": "x"}}, None),
    ({"env": {"A=B": "x"}}, None),
    (None, '{"env": {"FOO": "a\\u0000b"}}'),
    ({"unset": "POOLVAR"}, None),
    ({"unset": ["A=B"]}, None),
    ({"entrypoint": "sleep 60"}, None),
    ({"entrypoint": []}, None),
    ({"entrypoint": ["sleep", ""]}, None),
    ({"entrypoint": ["x"] * 1025}, None),
    # Good variables do not excuse a bad entrypoint: nothing of it is applied.
    ({"env": {"FOO": "early"}, "unset": ["POOLVAR"], "entrypoint": [""]}, None),
]


# ---- without --pooled ----

def test_without_pooled_both_routes_are_404():
    with start_agent() as agent:
        for method, path in (("GET", "/cove/warm"), ("POST", "/cove/claim"),
                             ("GET", "/cove/claim"), ("POST", "/cove/warm")):
            status, body, _ = agent.call(method, path, {"env": {"FOO": "bar"}})
            check_error(status, body, 404)
        assert agent.command('echo "[$FOO]"').stdout == "[]\n"


def test_pooled_agent_refuses_an_entrypoint():
    with start_agent("--pooled", "sleep", "60", expect_exit=2) as log:
        assert "--pooled takes no entrypoint" in log


# ---- /cove/warm ----

def test_warm_without_prestart_answers_at_once():
    with start_agent("--pooled") as agent:
        assert agent.call("GET", "/cove/warm")[:2] == (200, {"prestart": None})


def test_warm_reports_a_prestart_that_cannot_start():
    # No kernel helper: the prestarted python context cannot start.
    with start_agent("--pooled", "--prestart", "python") as agent:
        status, body, _ = agent.call("GET", "/cove/warm")
        check_error(status, body, 503)
        assert body["code"] == "SANDBOX::PRESTART_FAILED", body
        assert "python" in body["message"], body
        assert agent.call("GET", "/code/contexts")[:2] == (200, [])


@needs_kernel
def test_warm_is_held_until_the_kernel_serves_and_a_claim_meanwhile_reaches_it():
    top = tempfile.mkdtemp(prefix="cove-poolgate-")
    try:
        jupyter_path, gate = gated_kernelspec(top)
        with start_agent("--pooled", "--prestart", "python", kernel=True,
                         env={"JUPYTER_PATH": jupyter_path, "POOLVAR": "pooled"}) as agent:
            results = []
            threads = [warm_in_thread(agent, results) for _ in range(3)]
            # Clients that go away while held: the agent forgets them and goes on.
            for _ in range(2):
                conn = UnixConnection(agent.socket_path)
                conn.request("GET", "/cove/warm")
                conn.close()
            # The kernel cannot serve before the gate opens: nobody is answered yet, while
            # the agent answers other requests.
            assert agent.call("GET", "/ping")[0] == 200
            # A claim while the kernel starts: its update waits in the helper for the kernel.
            assert agent.claim({"env": {"FOO": "bar"}, "unset": ["POOLVAR"]})[:2] == (200, {})
            assert results == [] and all(t.is_alive() for t in threads)
            open(gate, "w").close()
            for t in threads:
                t.join(timeout=150)
            assert results == [(200, {"prestart": "python"})] * 3, results
            status, contexts, _ = agent.call("GET", "/code/contexts")
            assert status == 200 and [c["language"] for c in contexts] == ["python"], contexts
            out, count, context_id = agent.run_code(
                "import os; print(os.environ.get('FOO'), os.environ.get('POOLVAR'))")
            assert out == "bar None\n" and count == 1, (out, count)
            assert context_id == contexts[0]["id"]  # the prestarted context ran it
            # Answered at once now that the kernel is up.
            assert agent.call("GET", "/cove/warm")[:2] == (200, {"prestart": "python"})
    finally:
        shutil.rmtree(top, ignore_errors=True)


# What the first code of a claimed sandbox finds in the prestarted kernel, printed as JSON:
# history, the last result, the names bound, a caught error. The names IPython itself put in
# the namespace are its hidden ones; the cell's own are the only others.
FIRST_CODE = """import json, sys
ip = get_ipython()
print(json.dumps({"In": In, "Out": list(Out), "_": _, "_i": _i, "_ii": _ii,
                  "history": [n for s, n, c in ip.history_manager.get_range()],
                  "names": sorted(n for n in ip.user_ns if n not in ip.user_ns_hidden),
                  "last_error": hasattr(sys, "last_value"),
                  "formatters_built": "formatters" in ip.display_formatter._trait_values}))"""


@needs_kernel
def test_warm_up_leaves_no_trace_in_the_prestarted_kernel():
    """The helper warms the kernel (a silent execution) before it is ready: the user's first
    code is the kernel's execution 1, with nothing before it in history, results or names, and
    only its own output. formatters_built is the canary: the warm-up did run (IPython builds its
    display formatters lazily, and this cell has displayed nothing yet)."""
    with start_agent("--pooled", "--prestart", "python", kernel=True) as agent:
        assert agent.call("GET", "/cove/warm", timeout=150)[:2] == (200, {"prestart": "python"})
        assert agent.claim({})[:2] == (200, {})
        events = agent.events("/code", {"code": FIRST_CODE, "context": {"language": "python"}},
                              timeout=120)
        events = [e for e in events if e["type"] != "status"]  # busy, idle
        assert [e["type"] for e in events] == \
            ["init", "execution_count", "stdout", "execution_complete"], events
        assert events[1]["execution_count"] == 1, events
        seen = json.loads(events[2]["text"])
        assert seen == {"In": ["", FIRST_CODE], "Out": [], "_": "", "_i": "", "_ii": "",
                        "history": [1], "names": ["ip", "json", "sys"],
                        "last_error": False, "formatters_built": True}, seen
        out, count, _ = agent.run_code("print(len(In), list(Out), _i == _i1)")
        assert (out, count) == ("3 [] True\n", 2)


# ---- /cove/claim ----

@needs_kernel
def test_claim_gives_everything_the_users_environment_once():
    with start_agent("--pooled", "--prestart", "python", kernel=True,
                     env={"POOLVAR": "pooled", "KEEP": "kept"}) as agent:
        assert agent.call("GET", "/cove/warm", timeout=150)[:2] == (200, {"prestart": "python"})

        for body, raw in BAD_CLAIMS:
            status, answer, _ = agent.claim(body, raw=raw)
            check_error(status, answer, 400)
            assert answer["code"] == "SANDBOX::INVALID_PARAMETER", (body, raw, answer)
        # Nothing changed: not the environment, not the entrypoint, not the once-flag.
        assert agent.command('echo "[$FOO] [$POOLVAR]"').stdout == "[] [pooled]\n"
        assert agent.call("GET", "/command/status/entrypoint")[0] == 404

        marker = os.path.join(agent.top, "entrypoint-env")
        value = 'sp ace "quote" \\back/slash é 😀 $(x) \' ; \n second line'
        status, answer, _ = agent.claim({
            "env": {"FOO": "bar", "ODD": value, "EMPTY": ""},
            "unset": ["POOLVAR"],
            "entrypoint": ["sh", "-c", f'echo "$FOO|${{POOLVAR-unset}}|$KEEP" > {marker}; '
                           "exec sleep 600"],
        })
        assert (status, answer) == (200, {}), answer

        # The entrypoint runs, with the claim's environment.
        deadline = time.monotonic() + 30
        while not os.path.exists(marker) or not open(marker).read():
            assert time.monotonic() < deadline, "the entrypoint did not run"
            time.sleep(0.05)
        assert open(marker).read() == "bar|unset|kept\n"
        status, entry, _ = agent.call("GET", "/command/status/entrypoint")
        assert status == 200 and entry.get("running") is True, entry

        # Commands, background commands and bash sessions.
        assert agent.command("echo $FOO $POOLVAR").stdout == "bar\n"
        assert agent.command('echo "$FOO|${POOLVAR-unset}|$KEEP|${EMPTY-unset}"').stdout == \
            "bar|unset|kept|\n"
        assert agent.command('printf %s "$ODD" | od -An -c | tr -d " \\n"').stdout == \
            subprocess.run(["od", "-An", "-c"], input=value.encode(), capture_output=True,
                           check=True).stdout.decode().replace(" ", "").replace("\n", "") + "\n"
        status, session, _ = agent.call("POST", "/session", {})
        assert status == 200, session
        events = agent.events(f"/session/{session['session_id']}/run",
                              {"command": 'echo "$FOO|${POOLVAR-unset}"'})
        assert "".join(e["text"] for e in events if e["type"] == "stdout") == "bar|unset"

        # The prestarted kernel: the claim's variables, and no trace of how they came.
        out, count, _ = agent.run_code(
            "import os; print(os.environ.get('FOO'), os.environ.get('POOLVAR'))")
        assert (out, count) == ("bar None\n", 1)
        out, count, _ = agent.run_code(
            "print(os.environ['ODD'] == " + json.dumps(value, ensure_ascii=False) + ", "
            "os.environ['EMPTY'] == '', len(In), [n for n in ('e', 'd', 'k') if n in globals()])")
        assert (out, count) == ("True True 3 []\n", 2)
        # What the kernel starts inherits its os.environ.
        out, count, _ = agent.run_code(
            "import subprocess; print(subprocess.run(['sh', '-c', 'echo $FOO ${POOLVAR-unset}'],"
            " capture_output=True, text=True).stdout, end='')")
        assert (out, count) == ("bar unset\n", 3)

        # A new context's kernel starts with the agent's environment.
        status, ctx, _ = agent.call("POST", "/code/context", {"language": "python"}, timeout=150)
        assert status == 200, ctx
        out, count, _ = agent.run_code(
            "import os; print(os.environ.get('FOO'), os.environ.get('POOLVAR'))",
            context={"id": ctx["id"]})
        assert (out, count) == ("bar None\n", 1)

        # Once only: the second claim changes nothing.
        status, answer, _ = agent.claim({"env": {"FOO": "other"}, "unset": ["KEEP"],
                                         "entrypoint": ["sleep", "1"]})
        check_error(status, answer, 409)
        assert answer["code"] == "SANDBOX::ALREADY_CLAIMED"
        assert agent.command('echo "$FOO|$KEEP"').stdout == "bar|kept\n"
        out, _, _ = agent.run_code("print(os.environ.get('FOO'), os.environ.get('KEEP'))")
        assert out == "bar kept\n"


def test_claim_without_entrypoint_or_body():
    with start_agent("--pooled", env={"POOLVAR": "pooled"}) as agent:
        assert agent.claim(raw="")[:2] == (200, {})
        assert agent.command('echo "[$POOLVAR]"').stdout == "[pooled]\n"
        assert agent.call("GET", "/command/status/entrypoint")[0] == 404
        check_error(*agent.claim({})[:2], 409)


def test_claim_whose_entrypoint_cannot_start_is_422_and_final():
    with start_agent("--pooled") as agent:
        status, answer, _ = agent.claim({"env": {"FOO": "bar"},
                                         "entrypoint": ["/nonexistent/entrypoint", "x"]})
        check_error(status, answer, 422)
        assert answer["code"] == "SANDBOX::ENTRYPOINT_FAILED", answer
        assert answer["message"].startswith("cannot start entrypoint /nonexistent/entrypoint: "), \
            answer
        check_error(*agent.claim({"entrypoint": ["sleep", "60"]})[:2], 409)


def test_claim_reaches_a_prestarted_bash_context():
    with start_agent("--pooled", "--prestart", "bash", env={"POOLVAR": "pooled"}) as agent:
        assert agent.call("GET", "/cove/warm")[:2] == (200, {"prestart": "bash"})
        assert agent.claim({"env": {"FOO": "bar"}, "unset": ["POOLVAR"]})[:2] == (200, {})
        events = agent.events("/code", {"code": 'echo "$FOO|${POOLVAR-unset}"',
                                        "context": {"language": "bash"}})
        assert "".join(e["text"] for e in events if e["type"] == "stdout") == "bar|unset"
