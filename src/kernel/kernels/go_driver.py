"""The Go driver of Cove's kernels (cove_repl_kernel.py has the protocol). Go has no REPL: each
cell becomes a program, built with the go command and run once.

State between cells, without running earlier cells again (their side effects happen once):
- declarations (import, func, method, type, const at the start of a line) accumulate, a later
  one of the same name replacing the earlier;
- the other lines are statements, run in main. A variable a cell declares at its top level
  (`x := ...`, `a, b := ...`, `var x T = ...`) is saved at the end of the run, JSON-encoded
  with its type (%T), and the next programs declare it at package level and load its value.
  So a variable keeps its value and type; what JSON cannot carry does not survive: functions,
  channels, unexported struct fields, pointers' identity (a pointer comes back as a copy).
- a last line that is an expression is the result (fmt's %v of its value).
A cell that panics or is interrupted keeps its declarations but leaves the variables as they
were before it. Imports are of the standard library only (no module is fetched)."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

CONTROL = os.fdopen(3, "w")
INTERRUPTED = False
RUNNING = None  # the cell's program while it runs


def on_sigint(signum, frame):
    # The program (or the go command) in this process group got it too and ends; the program
    # is told again in case the signal was this process's alone.
    global INTERRUPTED
    INTERRUPTED = True
    if RUNNING is not None and RUNNING.poll() is None:
        RUNNING.send_signal(signal.SIGINT)


def say(message):
    CONTROL.write(json.dumps(message) + "\n")
    CONTROL.flush()


def read_cell(stream):
    header = stream.readline()
    if not header:
        return None
    return stream.read(int(header.strip())).decode(errors="replace")


def depth_change(line, state):
    """The change of bracket depth over line, skipping strings, runes and comments; state
    carries an open raw string or block comment over lines."""
    depth = 0
    i = 0
    while i < len(line):
        c = line[i]
        if state["in"] == "`":
            if c == "`":
                state["in"] = None
        elif state["in"] == "/*":
            if line.startswith("*/", i):
                state["in"] = None
                i += 1
        elif line.startswith("//", i):
            break
        elif line.startswith("/*", i):
            state["in"] = "/*"
            i += 1
        elif c == "`":
            state["in"] = "`"
        elif c in "\"'":
            j = i + 1
            while j < len(line) and line[j] != c:
                j += 2 if line[j] == "\\" else 1
            i = j
        elif c in "({[":
            depth += 1
        elif c in ")}]":
            depth -= 1
        i += 1
    return depth


DECLARATION = re.compile(r"^(import\b|type\b|const\b|func\s+[A-Za-z_]|func\s*\([^)]*\)\s*[A-Za-z_])")


def split_cell(code):
    """[(kind, text, first line number)], kind "decl" or "stmt", in order."""
    blocks = []
    state = {"in": None}
    current = None
    depth = 0
    for number, line in enumerate(code.split("\n"), 1):
        if current is None or (depth <= 0 and state["in"] is None):
            if line.strip() == "" or line.strip().startswith("//"):
                current = None
                depth = 0
                continue
            kind = "decl" if DECLARATION.match(line) else "stmt"
            current = [kind, [line], number]
            blocks.append(current)
            depth = depth_change(line, state)
            continue
        current[1].append(line)
        depth += depth_change(line, state)
    return [(kind, "\n".join(lines), number) for kind, lines, number in blocks]


IMPORT_SPEC = re.compile(r'^\s*([A-Za-z_.]\w*\s+)?"([^"]+)"')
NAMES = re.compile(r"^([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\s*:=")
VAR_NAMES = re.compile(r"^var\s+([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\b")
ASSIGNMENT = re.compile(r"^[\w.\[\]\s,*]+?\s*([-+*/%&|^]|<<|>>|&\^)?=[^=]")
KEYWORDS = {"for", "if", "switch", "select", "go", "defer", "return", "var", "const", "break",
            "continue", "goto", "fallthrough", "panic"}


def declaration_key(text):
    first = text.split("\n", 1)[0]
    m = re.match(r"^func\s*\(\s*\w*\s*\*?\s*(\w+)[^)]*\)\s*(\w+)", first)
    if m:
        return f"method {m.group(1)}.{m.group(2)}"
    m = re.match(r"^(func|type)\s+(\w+)", first)
    if m:
        return f"{m.group(1)} {m.group(2)}"
    m = re.match(r"^const\s+(\w+)", first)
    if m:
        return f"const {m.group(1)}"
    return "text " + text


def imports_of(text):
    body = text[len("import"):].strip()
    if body.startswith("("):
        body = body[1:body.rfind(")")]
    specs = []
    for line in body.split("\n"):
        m = IMPORT_SPEC.match(line)
        if m:
            specs.append(((m.group(1) or "").strip(), m.group(2)))
    return specs


def result_candidate(text):
    """Whether the cell's last statement may be an expression (the build says for sure)."""
    line = text.strip()
    if not line or "\n" in line or line.endswith(("{", "}", "++", "--")):
        return False
    if NAMES.match(line) or ASSIGNMENT.match(line):
        return False
    word = re.match(r"[A-Za-z_]\w*", line)
    return not (word and word.group(0) in KEYWORDS)


# go 1.19 says the second, later ones the first.
UNUSED_IMPORT = re.compile(r'^(?:"([^"]+)" imported (?:as \w+ )?and not used|imported and not used: "([^"]+)")')
GO_TYPE_QUALIFIED = re.compile(r"\b([A-Za-z_]\w*)\.([A-Za-z_]\w*)")


class Session:
    def __init__(self):
        # Next to this file: cove-kernel removes that directory, whatever ends the kernel.
        self.dir = tempfile.mkdtemp(prefix="go-", dir=os.path.dirname(os.path.abspath(__file__)))
        self.imports = {}  # path -> alias ("" for none)
        self.declarations = {}  # key -> text, in insertion order
        self.variables = {}  # name -> {"type": Go type, "value": JSON}
        self.env = dict(os.environ)
        if "GOCACHE" not in self.env:
            cache = os.path.join(os.path.expanduser("~"), ".cache", "go-build")
            try:
                os.makedirs(cache, exist_ok=True)
                probe = tempfile.NamedTemporaryFile(dir=cache)
                probe.close()
            except OSError:
                cache = os.path.join(self.dir, "cache")
            self.env["GOCACHE"] = cache
        self.env.setdefault("GOPATH", os.path.join(self.dir, "gopath"))
        self.env["GO111MODULE"] = "off"  # one file of the standard library's packages
        self.env.setdefault("CGO_ENABLED", "0")
        self.count = 0

    @staticmethod
    def declared_type(go_type, imports):
        """The %T of a saved value as a program with imports spells it, or None if it cannot."""
        spelled = go_type.replace("main.", "")
        for package, name in GO_TYPE_QUALIFIED.findall(spelled):
            if not name[0].isupper() or not any(
                    path.split("/")[-1] == package or alias == package
                    for path, alias in imports.items()):
                return None
        if "func(" in spelled or "chan " in spelled or spelled.startswith("<nil>"):
            return None
        return spelled

    def program(self, imports, declarations, statements, result, saved, line_map):
        out = ["package main", "", "import ("]
        out += [f'\t{alias} "{path}"' for path, alias in imports.items()]
        out += ['\t__cove_json "encoding/json"', '\t__cove_fmt "fmt"', '\t__cove_os "os"',
                '\t__cove_debug "runtime/debug"', ")", ""]

        def add(text, first_line):
            for offset, line in enumerate(text.split("\n")):
                out.append(line)
                if first_line is not None:
                    line_map[len(out)] = first_line + offset

        for text, first_line in declarations:
            add(text, first_line)
            out.append("")
        state_types = {}
        for name, var in self.variables.items():
            spelled = self.declared_type(var["type"], imports)
            if spelled is not None:
                state_types[name] = spelled
                out.append(f"var {name} {spelled}")
        out += [
            "",
            "func init() {",
            '\tdata, _ := __cove_os.ReadFile(__cove_os.Getenv("COVE_GO_STATE"))',
            "\tvar state map[string]struct{ Value __cove_json.RawMessage }",
            "\t_ = __cove_json.Unmarshal(data, &state)",
        ]
        for name in state_types:
            out.append(f'\t_ = __cove_json.Unmarshal(state["{name}"].Value, &{name})')
        out += [
            "}",
            "",
            "func __cove_save(values map[string]any) {",
            "\tstate := map[string]map[string]any{}",
            "\tfor name, value := range values {",
            "\t\tif data, err := __cove_json.Marshal(value); err == nil {",
            '\t\t\tstate[name] = map[string]any{"Type": __cove_fmt.Sprintf("%T", value),'
            ' "Value": __cove_json.RawMessage(data)}',
            "\t\t}",
            "\t}",
            "\tdata, _ := __cove_json.Marshal(state)",
            '\t_ = __cove_os.WriteFile(__cove_os.Getenv("COVE_GO_SAVED"), data, 0o600)',
            "}",
            "",
            "func __cove_result(value any) {",
            '\t_ = __cove_os.WriteFile(__cove_os.Getenv("COVE_GO_RESULT"),'
            ' []byte(__cove_fmt.Sprintf("%v", value)), 0o600)',
            "}",
            "",
            "func __cove_recover() {",
            "\tif r := recover(); r != nil {",
            '\t\tdata, _ := __cove_json.Marshal(map[string]string{"evalue": __cove_fmt.Sprint(r),'
            ' "stack": string(__cove_debug.Stack())})',
            '\t\t_ = __cove_os.WriteFile(__cove_os.Getenv("COVE_GO_PANIC"), data, 0o600)',
            "\t\t__cove_os.Exit(2)",
            "\t}",
            "}",
            "",
            "func main() {",
            "\tdefer __cove_recover()",
        ]
        for i, (text, first_line) in enumerate(statements):
            if result and i == len(statements) - 1:
                add(f"__cove_result({text.strip()})", first_line)
            else:
                add(text, first_line)
        names = list(state_types) + [n for n in saved if n not in state_types]
        out.append("\t__cove_save(map[string]any{" +
                   ", ".join(f'"{n}": {n}' for n in names) + "})")
        out.append("}")
        return "\n".join(out) + "\n"

    def build(self, source, line_map):
        path = os.path.join(self.dir, "main.go")
        with open(path, "w") as f:
            f.write(source)
        binary = os.path.join(self.dir, "cell")
        proc = subprocess.run(["go", "build", "-o", binary, "main.go"], cwd=self.dir,
                              env=self.env, capture_output=True, text=True)
        errors = []
        for line in proc.stderr.splitlines():
            m = re.match(r"^\.?/?main\.go:(\d+):(\d+): (.*)$", line)
            if m:
                errors.append((int(m.group(1)), m.group(3)))
            elif line.strip() and not line.startswith("#"):
                errors.append((0, line.strip()))
        return proc.returncode == 0, errors, binary, proc.returncode

    def execute(self, code):
        global INTERRUPTED
        INTERRUPTED = False
        self.count += 1
        blocks = split_cell(code)
        imports = dict(self.imports)
        declarations = dict(self.declarations)
        fresh_declarations = []
        statements = []
        saved = []
        for kind, text, first_line in blocks:
            if kind == "decl" and text.startswith("import"):
                for alias, path in imports_of(text):
                    imports[path] = alias
            elif kind == "decl":
                key = declaration_key(text)
                declarations.pop(key, None)
                declarations[key] = text
                fresh_declarations.append((key, first_line))
            else:
                statements.append((text, first_line))
                head = text.split("\n", 1)[0]
                m = NAMES.match(head) or VAR_NAMES.match(head)
                if m:
                    saved += [n.strip() for n in m.group(1).split(",") if n.strip() != "_"]
        first_lines = dict(fresh_declarations)
        ordered = [(text, first_lines.get(key)) for key, text in declarations.items()]
        result = bool(statements) and result_candidate(statements[-1][0])
        built, errors, binary, line_map = self._build_trying(imports, ordered, statements, result,
                                                             saved)
        if INTERRUPTED:
            return {"ename": "KeyboardInterrupt", "evalue": "interrupted",
                    "traceback": ["KeyboardInterrupt: the build was interrupted"]}
        if not built:
            messages = [(f"line {line_map[n]}: " if n in line_map else "") + text
                        for n, text in errors]
            return {"ename": "CompilationError", "evalue": "\n".join(messages),
                    "traceback": ["CompilationError:"] + messages}
        # It compiles: its declarations and imports are the session's now, whatever it does.
        self.imports = imports
        self.declarations = declarations
        files = {k: os.path.join(self.dir, k) for k in ("state", "saved", "result", "panic")}
        for f in files.values():
            if os.path.exists(f) and f != files["state"]:
                os.unlink(f)
        with open(files["state"], "w") as f:
            json.dump(self.variables, f)
        env = dict(self.env, COVE_GO_STATE=files["state"], COVE_GO_SAVED=files["saved"],
                   COVE_GO_RESULT=files["result"], COVE_GO_PANIC=files["panic"])
        global RUNNING
        RUNNING = proc = subprocess.Popen([binary], env=env, preexec_fn=default_signals,
                                          stdin=subprocess.DEVNULL)
        status = proc.wait()
        RUNNING = None
        if os.path.exists(files["panic"]):
            with open(files["panic"]) as f:
                panic = json.load(f)
            return {"ename": "panic", "evalue": panic["evalue"],
                    "traceback": [f"panic: {panic['evalue']}"] + user_frames(panic["stack"])}
        if status == -signal.SIGINT or INTERRUPTED and status != 0:
            return {"ename": "KeyboardInterrupt", "evalue": "interrupted",
                    "traceback": ["KeyboardInterrupt: the execution was interrupted"]}
        if status != 0:
            return {"ename": "ExitError", "evalue": f"exit status {status}",
                    "traceback": [f"the program exited with status {status}"]}
        if os.path.exists(files["saved"]):
            with open(files["saved"]) as f:
                for name, var in json.load(f).items():
                    self.variables[name] = {"type": var["Type"], "value": var["Value"]}
        if os.path.exists(files["result"]):
            with open(files["result"]) as f:
                say({"result": f.read()})
        return None

    def _build_trying(self, imports, ordered, statements, result, saved):
        """Builds, dropping imports this program does not use (earlier cells' imports stay
        the session's) and the result call when the last line is no single value."""
        imports = dict(imports)
        for _ in range(len(imports) + 3):
            line_map = {}
            source = self.program(imports, ordered, statements, result, saved, line_map)
            built, errors, binary, _ = self.build(source, line_map)
            if built or INTERRUPTED:
                return built, errors, binary, line_map
            unused = [UNUSED_IMPORT.match(text) for _, text in errors]
            unused = [m.group(1) or m.group(2) for m in unused if m]
            if unused:
                for path in unused:
                    imports.pop(path, None)
                continue
            if result:
                result = False
                continue
            return built, errors, binary, line_map
        return built, errors, binary, line_map


def user_frames(stack):
    """A panic's stack without the frames of the recovering (each frame is two lines)."""
    lines = stack.splitlines()
    out = lines[:1]
    for i in range(1, len(lines) - 1, 2):
        if not lines[i].startswith(("runtime/debug.Stack", "main.__cove_", "panic(")):
            out += lines[i:i + 2]
    return out


def default_signals():
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def main():
    if shutil.which("go") is None:
        sys.stderr.write("cove go driver: no go command (Debian: golang-go)\n")
        sys.exit(3)
    signal.signal(signal.SIGINT, on_sigint)
    session = Session()
    stdin = os.fdopen(4, "rb")
    try:
        while (code := read_cell(stdin)) is not None:
            try:
                error = session.execute(code)
            except Exception as e:  # a driver bug is the cell's error, not the kernel's end
                error = {"ename": type(e).__name__, "evalue": str(e), "traceback": [repr(e)]}
            if error is not None:
                say({"error": error})
            say({"done": True})
    finally:
        shutil.rmtree(session.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
