"""Code contexts in the languages OpenSandbox's clients use besides Python: JavaScript and
TypeScript (node), Java (JShell) and Go, on Cove's own kernels (src/kernel/kernels/). Each keeps
its state between runs, reports errors with ename/evalue, gives a last expression's value as a
result, is interruptible with its state kept, and runs beside contexts of other languages."""

import shutil
import threading
import time

import pytest

from test_code_interpreter import call, new_context, ok, run_code

needs_node = pytest.mark.skipif(shutil.which("node") is None, reason="no node on this host")
needs_java = pytest.mark.skipif(shutil.which("jshell") is None, reason="no JDK on this host")
needs_go = pytest.mark.skipif(shutil.which("go") is None, reason="no Go on this host")


@pytest.fixture(scope="module")
def ci(coved):
    sid = coved.create(template="code-interpreter", limits={"cpu": "2", "memory": "2Gi"})
    yield sid
    coved.delete(sid)


def interrupted_run(coved, sid, ctx, code, after=1.5):
    """Runs code that never ends and interrupts it after a while; returns the run."""
    def interrupt():
        time.sleep(after)
        status, body, _ = call(coved, sid, "DELETE", f"/code?id={ctx}")
        assert status == 200, body

    t = threading.Thread(target=interrupt)
    t.start()
    started = time.monotonic()
    r = run_code(coved, sid, code, context={"id": ctx}, timeout=90)
    t.join()
    assert time.monotonic() - started < 30, r.events
    assert r.status == 200 and len(r.errors) == 1, r.events
    return r


# ---- JavaScript ----

@pytest.mark.native_only(reason="gVisor passes the agent no cove-kernel descriptor: code contexts are a 400 there (test_runtimes.py::test_code_contexts)")
@needs_node
def test_javascript_state_results_and_output(coved, ci):
    ctx = new_context(coved, ci, "javascript")
    r = ok(run_code(coved, ci, "let n = 40; const greet = (w) => `hi ${w}`;\nn + 2",
                    context={"id": ctx}))
    assert r.text == ["42"]
    # A later cell may declare the same names again, as in a notebook.
    r = ok(run_code(coved, ci, "let n = 5;\nconsole.log(greet('js'), n);\nclass Box { v() "
                    "{ return n * 2 } }\nnew Box().v()", context={"id": ctx}))
    assert r.stdout == "hi js 5\n" and r.text == ["10"]
    r = ok(run_code(coved, ci, "const got = await Promise.resolve(n + 1);\n({got, s: 'x'})",
                    context={"id": ctx}))
    assert r.text == ["{ got: 6, s: 'x' }"]
    assert ok(run_code(coved, ci, "got * 2", context={"id": ctx})).text == ["12"]
    # No value: no result.
    r = ok(run_code(coved, ci, "let unused = 1;", context={"id": ctx}))
    assert r.results == []
    # The code's stdin is empty, not the channel the cells come on.
    r = ok(run_code(coved, ci, "require('fs').readFileSync(0, 'utf8').length", context={"id": ctx}))
    assert r.text == ["0"]
    assert ok(run_code(coved, ci, "n", context={"id": ctx})).text == ["5"]


@pytest.mark.native_only(reason="gVisor passes the agent no cove-kernel descriptor: code contexts are a 400 there (test_runtimes.py::test_code_contexts)")
@needs_node
def test_javascript_errors(coved, ci):
    ctx = new_context(coved, ci, "javascript")
    r = run_code(coved, ci, "function f() { throw new TypeError('not a number') }\nf()",
                 context={"id": ctx})
    assert (r.error["ename"], r.error["evalue"]) == ("TypeError", "not a number"), r.events
    assert "TypeError: not a number" in r.error["traceback"][0]
    assert any("at f" in line for line in r.error["traceback"])
    r = run_code(coved, ci, "let x = ;", context={"id": ctx})
    assert r.error["ename"] == "SyntaxError", r.events
    r = run_code(coved, ci, "await Promise.reject(new RangeError('later'))", context={"id": ctx})
    assert (r.error["ename"], r.error["evalue"]) == ("RangeError", "later"), r.events
    assert ok(run_code(coved, ci, "typeof f", context={"id": ctx})).text == ["'function'"]


@pytest.mark.native_only(reason="gVisor passes the agent no cove-kernel descriptor: code contexts are a 400 there (test_runtimes.py::test_code_contexts)")
@needs_node
def test_javascript_interrupt_keeps_state(coved, ci):
    ctx = new_context(coved, ci, "javascript")
    ok(run_code(coved, ci, "var kept = 'before';", context={"id": ctx}))
    r = interrupted_run(coved, ci, ctx, "let i = 0; while (true) { i++ }")
    assert r.error["ename"] == "KeyboardInterrupt", r.events
    assert ok(run_code(coved, ci, "kept", context={"id": ctx})).text == ["'before'"]
    # A cell waiting on a promise that never settles is interrupted too.
    r = interrupted_run(coved, ci, ctx, "await new Promise(() => {})")
    assert r.error["ename"] == "KeyboardInterrupt", r.events
    assert ok(run_code(coved, ci, "kept + '!'", context={"id": ctx})).text == ["'before!'"]


# ---- TypeScript ----

@pytest.mark.native_only(reason="gVisor passes the agent no cove-kernel descriptor: code contexts are a 400 there (test_runtimes.py::test_code_contexts)")
@needs_node
def test_typescript_state_types_and_errors(coved, ci):
    ctx = new_context(coved, ci, "typescript")
    r = ok(run_code(coved, ci, "interface Point { x: number; y: number }\n"
                    "const p: Point = { x: 3, y: 4 };\n"
                    "function norm(q: Point): number { return Math.hypot(q.x, q.y) }\nnorm(p)",
                    context={"id": ctx}))
    assert r.text == ["5"]
    r = ok(run_code(coved, ci, "enum Color { Red, Green }\nconsole.log(Color[1]);\n"
                    "const p: Point = { x: 6, y: 8 };\nnorm(p)", context={"id": ctx}))
    assert r.stdout == "Green\n" and r.text == ["10"]
    r = run_code(coved, ci, "let broken: = 1", context={"id": ctx})
    assert r.error["ename"] == "TSError" and "Type expected" in r.error["evalue"], r.events
    r = run_code(coved, ci, "throw new Error('typed ' + (p.x as number))", context={"id": ctx})
    assert (r.error["ename"], r.error["evalue"]) == ("Error", "typed 6"), r.events
    r = interrupted_run(coved, ci, ctx, "for (;;) {}")
    assert r.error["ename"] == "KeyboardInterrupt", r.events
    assert ok(run_code(coved, ci, "p.y", context={"id": ctx})).text == ["8"]


# ---- Java ----

@pytest.mark.native_only(reason="gVisor passes the agent no cove-kernel descriptor: code contexts are a 400 there (test_runtimes.py::test_code_contexts)")
@needs_java
def test_java_state_results_and_output(coved, ci):
    ctx = new_context(coved, ci, "java")
    r = ok(run_code(coved, ci, "int base = 40;\nint add(int a) { return base + a; }\nadd(2)",
                    context={"id": ctx}))
    assert r.text == ["42"]
    r = ok(run_code(coved, ci, "List<String> names = new ArrayList<>(List.of(\"a\", \"b\"));\n"
                    "System.out.println(\"size \" + names.size());\nbase = 1;\nadd(1)",
                    context={"id": ctx}))
    assert r.stdout == "size 2\n" and r.text == ["2"]
    r = ok(run_code(coved, ci, "record Pair(int l, int r) {}\nvar pair = new Pair(1, 2);",
                    context={"id": ctx}))
    assert r.results == []
    assert ok(run_code(coved, ci, "pair.l() + pair.r()", context={"id": ctx})).text == ["3"]
    # The code's stdin is empty, not the channel the cells come on.
    assert ok(run_code(coved, ci, "System.in.read()", context={"id": ctx})).text == ["-1"]
    assert ok(run_code(coved, ci, "base", context={"id": ctx})).text == ["1"]


@pytest.mark.native_only(reason="gVisor passes the agent no cove-kernel descriptor: code contexts are a 400 there (test_runtimes.py::test_code_contexts)")
@needs_java
def test_java_errors_are_eval_exceptions(coved, ci):
    ctx = new_context(coved, ci, "java")
    r = run_code(coved, ci, "throw new IllegalStateException(\"bad state\");", context={"id": ctx})
    assert (r.error["ename"], r.error["evalue"]) == ("EvalException", "bad state"), r.events
    assert r.error["traceback"][0] == "java.lang.IllegalStateException: bad state"
    r = run_code(coved, ci, "Integer.parseInt(\"zz\")", context={"id": ctx})
    assert r.error["ename"] == "EvalException" and "zz" in r.error["evalue"], r.events
    r = run_code(coved, ci, "int y = \"text\";", context={"id": ctx})
    assert r.error["ename"] == "CompilationError", r.events
    assert "incompatible types" in r.error["evalue"], r.events
    assert ok(run_code(coved, ci, "1 + 1", context={"id": ctx})).text == ["2"]


@pytest.mark.native_only(reason="gVisor passes the agent no cove-kernel descriptor: code contexts are a 400 there (test_runtimes.py::test_code_contexts)")
@needs_java
def test_java_interrupt_keeps_state(coved, ci):
    ctx = new_context(coved, ci, "java")
    ok(run_code(coved, ci, "String kept = \"before\";", context={"id": ctx}))
    r = interrupted_run(coved, ci, ctx, "long i = 0; while (true) { i++; }", after=2.0)
    assert r.error["ename"] == "KeyboardInterrupt", r.events
    assert ok(run_code(coved, ci, "kept", context={"id": ctx})).text == ['"before"']


# ---- across languages ----

@pytest.mark.native_only(reason="gVisor passes the agent no cove-kernel descriptor: code contexts are a 400 there (test_runtimes.py::test_code_contexts)")
@needs_node
@needs_java
def test_contexts_of_different_languages_run_concurrently(coved, ci):
    """A busy Java context does not hold up a JavaScript one or a Python one."""
    java = new_context(coved, ci, "java")
    js = new_context(coved, ci, "javascript")
    py = new_context(coved, ci, "python")
    ok(run_code(coved, ci, "1", context={"id": java}))
    ok(run_code(coved, ci, "1", context={"id": js}))
    runs = {}

    def slow_java():
        runs["java"] = run_code(coved, ci, "Thread.sleep(4000);\n\"java done\"", context={"id": java})

    t = threading.Thread(target=slow_java)
    t.start()
    time.sleep(0.5)
    started = time.monotonic()
    assert ok(run_code(coved, ci, "'js ' + (6 * 7)", context={"id": js})).text == ["'js 42'"]
    assert ok(run_code(coved, ci, "6 * 7", context={"id": py})).text == ["42"]
    assert time.monotonic() - started < 3
    t.join()
    assert ok(runs["java"]).text == ['"java done"']


def test_unknown_language_is_still_a_400(coved, ci):
    for language in ("cobol", "jav", "javascriptx"):
        status, body, _ = call(coved, ci, "POST", "/code/context", body={"language": language})
        assert status == 400 and "no kernel for" in body["message"], (language, body)
    status, body, _ = call(coved, ci, "POST", "/code/context", body={"language": "../java"})
    assert status == 400, body


# ---- Go ----

@pytest.mark.native_only(reason="gVisor passes the agent no cove-kernel descriptor: code contexts are a 400 there (test_runtimes.py::test_code_contexts)")
@needs_go
def test_go_declarations_and_variables_carry_over(coved, ci):
    ctx = new_context(coved, ci, "go")
    r = ok(run_code(coved, ci, 'import "fmt"\ncount := 40\nname := "go"\nfmt.Println(name, count)',
                    context={"id": ctx}))
    assert r.stdout == "go 40\n" and r.results == []
    assert ok(run_code(coved, ci, "count + 2", context={"id": ctx})).text == ["42"]
    r = ok(run_code(coved, ci, "type Point struct{ X, Y int }\n"
                    "func (p Point) Sum() int { return p.X + p.Y }\n"
                    "p := Point{3, 4}\np.Sum()", context={"id": ctx}))
    assert r.text == ["7"]
    # Statements run once: this Println is not repeated by the next cell.
    r = ok(run_code(coved, ci, 'count *= 2\np.X = 10\nseen := map[string]int{"a": 1}\n'
                    'fmt.Println("updated")', context={"id": ctx}))
    assert r.stdout == "updated\n"
    r = ok(run_code(coved, ci, 'fmt.Println(count, p, seen["a"])\np.Sum()', context={"id": ctx}))
    assert r.stdout == "80 {10 4} 1\n" and r.text == ["14"]
    # A function redefined replaces the earlier one.
    ok(run_code(coved, ci, "func twice(v int) int { return v * 2 }", context={"id": ctx}))
    ok(run_code(coved, ci, "func twice(v int) int { return v * 3 }", context={"id": ctx}))
    assert ok(run_code(coved, ci, "twice(count)", context={"id": ctx})).text == ["240"]
    r = ok(run_code(coved, ci, 'import "io"\nimport "os"\nin, _ := io.ReadAll(os.Stdin)\nlen(in)',
                    context={"id": ctx}))
    assert r.text == ["0"]


@pytest.mark.native_only(reason="gVisor passes the agent no cove-kernel descriptor: code contexts are a 400 there (test_runtimes.py::test_code_contexts)")
@needs_go
def test_go_errors_and_interrupt(coved, ci):
    ctx = new_context(coved, ci, "go")
    ok(run_code(coved, ci, 'kept := "before"', context={"id": ctx}))
    r = run_code(coved, ci, "var values []int\nkept = \"changed\"\n_ = values[5]", context={"id": ctx})
    assert r.error["ename"] == "panic", r.events
    assert r.error["evalue"] == "runtime error: index out of range [5] with length 0"
    r = run_code(coved, ci, "notDefined + 1", context={"id": ctx})
    assert r.error["ename"] == "CompilationError", r.events
    assert "line 1: undefined: notDefined" in r.error["evalue"]
    r = interrupted_run(coved, ci, ctx, "kept = \"lost\"\nfor {\n}", after=2.5)
    assert r.error["ename"] == "KeyboardInterrupt", r.events
    # A cell that failed leaves the variables as they were.
    assert ok(run_code(coved, ci, "kept", context={"id": ctx})).text == ["before"]


@pytest.mark.native_only(reason="gVisor passes the agent no cove-kernel descriptor: code contexts are a 400 there (test_runtimes.py::test_code_contexts)")
@needs_go
def test_kernel_files_go_with_the_context(coved, ci):
    """Cove's kernels are written to the sandbox's /tmp for their context's life only."""
    def kernel_dirs():
        # One line: a command's output events are its lines, without their newlines.
        r = run_code(coved, ci, "echo $(ls -d /tmp/cove-kernels-* /tmp/cove-kernels-*/go-* "
                     "2>/dev/null)")
        assert r.status == 200, r.raw
        return sorted(r.stdout.split())

    before = kernel_dirs()
    ctx = new_context(coved, ci, "go")
    ok(run_code(coved, ci, "x := 1", context={"id": ctx}))
    during = [d for d in kernel_dirs() if d not in before]
    assert len(during) == 2 and "/go-" in during[1], during  # the kernel's, Go's scratch in it
    assert call(coved, ci, "DELETE", f"/code/contexts/{ctx}")[0] == 200
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and kernel_dirs() != before:
        time.sleep(0.2)
    assert kernel_dirs() == before
