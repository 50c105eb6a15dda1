"""run_code and code contexts through both APIs on the base template: the issue's quickstart
run as a script (verbatim but for the import), rich results (png, html, svg, json), errors
and exit codes, callbacks' order, contexts (create, list, delete, isolation), bash, and
interrupting a run."""

import base64
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from cove import Context, Execution
from cove.errors import NotFoundError

from sdkutil import SDK, resolve

pytestmark = pytest.mark.anyio

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

QUICKSTART = '''
import asyncio

from cove.aio import Sandbox

CSV = """region,amount
hangzhou,120
beijing,80
hangzhou,45
shanghai,200
beijing,30
"""

AGENT_CODE = """
import csv
from collections import defaultdict

totals = defaultdict(int)
with open("/home/user/sales.csv") as f:
    for row in csv.DictReader(f):
        totals[row["region"]] += int(row["amount"])
for region, amount in sorted(totals.items(), key=lambda kv: kv[1], reverse=True):
    print(region, amount)
"""


async def main():
    async with await Sandbox.create(template="base") as sandbox:
        await sandbox.files.write("/home/user/sales.csv", CSV)
        result = await sandbox.run_code(AGENT_CODE)
        print(result.text); print("exit code:", result.exit_code)


asyncio.run(main())
'''


def run_script(source, coved, tmp_path):
    script = tmp_path / "quickstart.py"
    script.write_text(source)
    env = dict(os.environ, COVE_SERVER=f"http://127.0.0.1:{coved.port}", COVE_API_KEY=coved.key,
               PYTHONPATH=SDK)
    before = set(coved.known_sandboxes())
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert set(coved.known_sandboxes()) - before == set()  # killed on the way out
    return r.stdout


def test_quickstart_async_verbatim(coved, tmp_path):
    out = run_script(QUICKSTART, coved, tmp_path)
    assert out == "shanghai 200\nhangzhou 165\nbeijing 110\nexit code: 0\n"


def test_quickstart_sync(coved, tmp_path):
    sync = (QUICKSTART.replace("from cove.aio import Sandbox", "from cove import Sandbox")
            .replace("async with await ", "with ").replace("await ", "")
            .replace("async def main", "def main").replace("asyncio.run(main())", "main()"))
    assert "await" not in sync
    out = run_script(sync, coved, tmp_path)
    assert out == "shanghai 200\nhangzhou 165\nbeijing 110\nexit code: 0\n"


def test_the_readmes_quickstart_runs(coved, tmp_path):
    readme = open(os.path.join(os.path.dirname(SDK), "..", "README.md")).read()
    block = readme.split("```python\n", 1)[1].split("```", 1)[0]
    out = run_script(block, coved, tmp_path)
    assert out == "shanghai 200\nhangzhou 165\nbeijing 110\nexit code: 0\n"


async def test_value_stdout_stderr_and_main_result(api, sandbox):
    r = await resolve(sandbox.run_code("import sys\nprint('out')\nprint('err', file=sys.stderr)\n"
                                       "6 * 7"))
    assert isinstance(r, Execution)
    assert (r.text, r.exit_code, r.error) == ("42", 0, None)
    assert r.logs.stdout == ["out\n"] and r.logs.stderr == ["err\n"]
    assert (r.stdout, r.stderr) == ("out\n", "err\n")
    assert len(r.results) == 1 and r.results[0].is_main_result
    assert r.execution_count >= 1 and r.context_id


async def test_rich_results(api, sandbox):
    r = await resolve(sandbox.run_code(textwrap.dedent("""
        from IPython.display import display, HTML, SVG, JSON
        display(HTML('<b>bold</b>'))
        display(SVG('<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"/>'))
        display(JSON({'a': [1, 2]}))
        'done'
        """)))
    assert r.error is None, r.error
    html, svg, js, value = r.results
    assert html.html == "<b>bold</b>" and "html" in html.formats()
    assert svg.svg.startswith("<svg")
    assert js.json == {"a": [1, 2]}
    assert value.text == "'done'" and r.text == "'done'" and value.is_main_result
    assert not html.is_main_result and html.png is None

    # A matplotlib figure comes as a PNG, without savefig or show.
    r = await resolve(sandbox.run_code("import matplotlib.pyplot as plt\n"
                                       "plt.plot([1, 2, 3], [3, 1, 2])\n"))
    assert r.error is None, r.error
    pngs = [x.png for x in r.results if x.png is not None]
    assert len(pngs) == 1, r.results
    assert base64.b64decode(pngs[0]).startswith(PNG_MAGIC)
    assert "png" in [x for res in r.results for x in res.formats()]


async def test_errors_and_exit_codes(api, sandbox):
    r = await resolve(sandbox.run_code("def divide(a, b):\n    return a / b\n\ndivide(1, 0)\n"))
    assert r.exit_code != 0 and r.error.name == "ZeroDivisionError"
    assert r.error.value == "division by zero" and "divide" in r.error.traceback_text
    r = await resolve(sandbox.run_code("raise ValueError('bad input')"))
    assert (r.error.name, r.error.value, r.exit_code) == ("ValueError", "bad input", 1)
    r = await resolve(sandbox.run_code("'fine'"))
    assert (r.exit_code, r.text) == (0, "'fine'")
    r = await resolve(sandbox.run_code("echo hi; exit 3", language="bash"))
    assert (r.stdout, r.exit_code, r.error.name) == ("hi\n", 3, "CommandExecError")


async def test_callbacks_in_order(api, sandbox):
    seen = []
    errors = []
    code = textwrap.dedent("""
        import sys, time
        print('o1', flush=True); time.sleep(0.1)
        print('e1', file=sys.stderr, flush=True); time.sleep(0.1)
        display('shown')
        print('o2', flush=True); time.sleep(0.1)
        1 + 1
        """)
    r = await resolve(sandbox.run_code(code, on_stdout=lambda s: seen.append(("out", s)),
                                       on_stderr=lambda s: seen.append(("err", s)),
                                       on_result=lambda res: seen.append(("result", res.text))))
    assert seen == [("out", "o1\n"), ("err", "e1\n"), ("result", "'shown'"), ("out", "o2\n"),
                    ("result", "2")]
    assert r.text == "2"
    await resolve(sandbox.run_code("1/0", on_error=errors.append))
    assert [e.name for e in errors] == ["ZeroDivisionError"]


async def test_async_callbacks_are_awaited(conn):
    import cove.aio
    seen = []

    async def on_stdout(text):
        seen.append(text)

    async def on_result(result):
        seen.append(result.text)

    async with await cove.aio.Sandbox.create(**conn) as sb:
        await sb.run_code("print('x')\n3", on_stdout=on_stdout, on_result=on_result)
    assert seen == ["x\n", "3"]


async def test_contexts(api, sandbox):
    a = await resolve(sandbox.create_code_context())
    b = await resolve(sandbox.create_code_context("python"))
    assert isinstance(a, Context) and a.language == "python" and a.id != b.id
    await resolve(sandbox.run_code("secret = 41", context=a))
    r = await resolve(sandbox.run_code("secret", context=b))
    assert r.error.name == "NameError"
    assert (await resolve(sandbox.run_code("secret + 1", context=a.id))).text == "42"

    listed = await resolve(sandbox.list_code_contexts())
    assert {a.id, b.id} <= {c.id for c in listed}
    assert {c.id for c in await resolve(sandbox.list_code_contexts("python"))} >= {a.id, b.id}
    assert await resolve(sandbox.list_code_contexts("bash")) == []

    sh = await resolve(sandbox.create_code_context("bash"))
    await resolve(sandbox.run_code("cd /tmp && export G=hello", context=sh))
    r = await resolve(sandbox.run_code("echo $G; pwd", context=sh))
    assert r.stdout == "hello\n/tmp\n"

    await resolve(sandbox.delete_code_context(a))
    with pytest.raises(NotFoundError) as e:
        await resolve(sandbox.run_code("1", context=a))
    assert e.value.code == "CONTEXT_NOT_FOUND"
    with pytest.raises(NotFoundError):
        await resolve(sandbox.delete_code_context(a.id))
    assert (await resolve(sandbox.run_code("'b lives'", context=b))).text == "'b lives'"
    # runs without a context share the language's default context
    await resolve(sandbox.run_code("shared = 'default'"))
    assert (await resolve(sandbox.run_code("shared"))).text == "'default'"


def test_interrupt_sync(conn):
    import cove
    with cove.Sandbox.create(**conn) as sb:
        ctx = sb.create_code_context()
        sb.run_code("kept = 'before'", context=ctx)
        t = threading.Timer(1.0, sb.interrupt_code, args=(ctx,))
        t.start()
        started = time.monotonic()
        r = sb.run_code("while True:\n    pass\n", context=ctx)
        t.join()
        assert time.monotonic() - started < 30
        assert r.error.name == "KeyboardInterrupt" and r.exit_code != 0
        assert sb.run_code("kept", context=ctx).text == "'before'"


async def test_interrupt_async(conn):
    import anyio
    import cove.aio
    async with await cove.aio.Sandbox.create(**conn) as sb:
        ctx = await sb.create_code_context()
        await sb.run_code("kept = 'before'", context=ctx)
        results = []

        async def run():
            results.append(await sb.run_code("while True:\n    pass\n", context=ctx))

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await anyio.sleep(1.0)
            await sb.interrupt_code(ctx)
        assert results[0].error.name == "KeyboardInterrupt"
        assert (await sb.run_code("kept", context=ctx)).text == "'before'"
