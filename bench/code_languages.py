"""First run_code per language: what a client waits for when it opens a context in a language
and runs its first cell (python, javascript, typescript, java, go), and then a second cell.

Cove: in a running code-interpreter sandbox, POST /code/context {"language": L}, then at once
POST /code with a one-line cell whose result is 42: until the end of its event stream (the
result read). Then the same context's next cell (state kept: it uses the first cell's variable).
Every sample is a new context. Through coved's gateway, as a client calls it.

Host: the language's own tool started on the host, no sandbox, no kernel: `python3 -c`,
`node -e`, node with TypeScript's transpileModule, `jshell` reading the cell on stdin, `go run`
of a file: what a user who runs the cell by hand waits for the first time.

Run: /usr/bin/python3 bench/code_languages.py [--runs N] (root, a built tree in build/).
Prints a Markdown table (ms, p50 and min over N) and the ratios Cove / host."""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "e2e"))

from covetest import serve  # noqa: E402
from test_code_interpreter import call, run_code  # noqa: E402

from machine import machine_info  # noqa: E402
from measure import summary  # noqa: E402

CELLS = {
    "python": ("kept = 20\nkept * 2 + 2", "kept + 1"),
    "javascript": ("let kept = 20;\nkept * 2 + 2", "kept + 1"),
    "typescript": ("const kept: number = 20;\nkept * 2 + 2", "kept + 1"),
    "java": ("int kept = 20;\nkept * 2 + 2", "kept + 1"),
    "go": ("kept := 20\nkept*2 + 2", "kept + 1"),
}

TS = "/usr/share/nodejs/typescript"


def host_command(language, workdir):
    """argv and stdin of the host's own tool running the first cell."""
    if language == "python":
        return ["python3", "-c", "kept = 20\nprint(kept * 2 + 2)"], None
    if language == "javascript":
        return ["node", "-e", "let kept = 20; console.log(kept * 2 + 2)"], None
    if language == "typescript":
        script = (f"const ts = require({TS!r}); const js = ts.transpileModule("
                  "'const kept: number = 20; console.log(kept * 2 + 2)', {}).outputText; eval(js)")
        return ["node", "-e", script], None
    if language == "java":
        return ["jshell", "-q", "-R-Xshare:auto"], b"int kept = 20;\nSystem.out.println(kept * 2 + 2);\n/exit\n"
    if language == "go":
        path = os.path.join(workdir, "main.go")
        with open(path, "w") as f:
            f.write('package main\n\nimport "fmt"\n\nfunc main() {\n\tkept := 20\n'
                    '\tfmt.Println(kept*2 + 2)\n}\n')
        return ["go", "run", path], None
    raise ValueError(language)


def host_once(language, workdir):
    argv, stdin = host_command(language, workdir)
    started = time.monotonic()
    out = subprocess.run(argv, input=stdin, capture_output=True, cwd=workdir, check=True).stdout
    elapsed = time.monotonic() - started
    assert b"42" in out, (language, out)
    return elapsed


def cove_once(coved, sid, language):
    first, second = CELLS[language]
    started = time.monotonic()
    status, body, _ = call(coved, sid, "POST", "/code/context", body={"language": language})
    assert status == 200, body
    r = run_code(coved, sid, first, context={"id": body["id"]})
    first_s = time.monotonic() - started
    assert r.text == ["42"], r.events
    started = time.monotonic()
    r = run_code(coved, sid, second, context={"id": body["id"]})
    second_s = time.monotonic() - started
    assert r.text == ["21"], r.events
    call(coved, sid, "DELETE", f"/code/contexts/{body['id']}")
    return first_s, second_s


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    languages = [lang for lang, tool in (("python", "python3"), ("javascript", "node"),
                                         ("typescript", "node"), ("java", "jshell"),
                                         ("go", "go")) if shutil.which(tool)]
    rows = []
    with serve() as coved, tempfile.TemporaryDirectory() as workdir:
        sid = coved.create(template="code-interpreter", limits={"cpu": "2", "memory": "2Gi"})
        for language in languages:
            cove_once(coved, sid, language)  # warm: the page cache, go's build cache
            host_once(language, workdir)
            firsts, seconds, hosts = [], [], []
            for _ in range(args.runs):
                first, second = cove_once(coved, sid, language)
                firsts.append(first)
                seconds.append(second)
                hosts.append(host_once(language, workdir))
            rows.append((language, summary(firsts), summary(seconds), summary(hosts)))
        coved.delete(sid)
    info = machine_info()
    print(f"Machine: {info['cpu']}, {info['cores']} cores, {info['ram_gib']} GiB, "
          f"{info['os']}, Linux {info['kernel']}, cgroup {info['cgroups']}\n")
    print(f"First run_code per language ({args.runs} runs each, ms: p50 / min)\n")
    print("| language | Cove: new context + first cell | Cove: next cell | host tool, cold "
          "| first cell / host |")
    print("|---|---|---|---|---|")
    for language, first, second, host in rows:
        print(f"| {language} | {first['p50']:.0f} / {first['min']:.0f} | "
              f"{second['p50']:.0f} / {second['min']:.0f} | {host['p50']:.0f} / {host['min']:.0f} "
              f"| {first['p50'] / host['p50']:.2f}x |")


if __name__ == "__main__":
    main()
