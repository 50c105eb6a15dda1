"""Cove's Jupyter kernels for languages Debian packages no kernel for (JavaScript, TypeScript,
Java, Go): an ipykernel Kernel that hands each cell to a driver process and turns what it says
into stream / execute_result / error messages, as IPython's kernel does.

The driver protocol: a cell goes to the driver's descriptor 4 as "<byte length>\\n<code>"; the
driver answers with JSON lines on descriptor 3 ({"result": text}, {"error": {ename, evalue,
traceback}}, then {"done": true}). What the user's code writes to stdout and stderr goes to the
driver's own stdout and stderr, which are forwarded as they come; its stdin is /dev/null. An interrupt is SIGINT to the
kernel's process group (interrupt_mode "signal"): the driver gets it too, stops the cell and
says done; the Go kernel has no long-lived driver and runs each cell's program, which SIGINT
ends. Started as: cove_repl_kernel.py LANGUAGE -f CONNECTION_FILE."""

import json
import os
import selectors
import signal
import subprocess
import sys

from ipykernel.kernelapp import IPKernelApp
from ipykernel.kernelbase import Kernel

HERE = os.path.dirname(os.path.abspath(__file__))
LANGUAGE = sys.argv.pop(1) if len(sys.argv) > 1 else ""

INFO = {
    "javascript": ("javascript", "text/javascript", ".js", "JavaScript"),
    "typescript": ("typescript", "text/typescript", ".ts", "TypeScript"),
    "java": ("java", "text/x-java", ".jshell", "Java"),
    "go": ("go", "text/x-go", ".go", "Go"),
}


def default_signals():
    # The kernel ignores SIGINT between cells; its driver must take it (ignored is inherited).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)


def driver_command(language):
    if language in ("javascript", "typescript"):
        return ["node", "--stack-size=4000", os.path.join(HERE, "node_driver.js"), language]
    if language == "java":
        # A single-file source program: compiled at start, so nothing is built beforehand.
        return ["java", "-XX:+UseSerialGC", "-Xshare:auto",
                "--add-modules", "jdk.jshell", os.path.join(HERE, "JavaDriver.java")]
    if language == "go":
        return ["python3", os.path.join(HERE, "go_driver.py")]
    raise SystemExit(f"cove_repl_kernel: no driver for {language!r}")


class Driver:
    """One long-lived driver process and its three pipes."""

    def __init__(self, command):
        control_read, control_write = os.pipe()
        cells_read, cells_write = os.pipe()
        self.proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            # 3 and 4 kept too: the child closes what is not kept after setup put the pipes there.
            pass_fds=sorted({control_write, cells_read, 3, 4}),
            preexec_fn=self._child_setup(control_write, cells_read), cwd=os.getcwd())
        os.close(control_write)
        os.close(cells_read)
        self.control = control_read
        self.cells = os.fdopen(cells_write, "wb")
        self.pending = b""

    @staticmethod
    def _child_setup(control_write, cells_read):
        def setup():
            default_signals()
            # Out of the way of 3 and 4 first: either may be the other pipe's number.
            control, cells = os.dup(control_write), os.dup(cells_read)
            os.dup2(control, 3)
            os.dup2(cells, 4)
            os.close(control)
            os.close(cells)
        return setup

    def send(self, code):
        data = code.encode()
        self.cells.write(b"%d\n" % len(data) + data)
        self.cells.flush()

    def alive(self):
        return self.proc.poll() is None


class ReplKernel(Kernel):
    implementation = "cove-" + LANGUAGE
    implementation_version = "1.0"
    banner = f"Cove {INFO.get(LANGUAGE, ('', '', '', LANGUAGE))[3]} kernel"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        name, mime, ext, _ = INFO[LANGUAGE]
        self.language_info = {"name": name, "mimetype": mime, "file_extension": ext}
        # Started now, while the client waits for the kernel: its start (a JVM, node) overlaps.
        self.driver = Driver(driver_command(LANGUAGE))

    def _stream(self, name, data):
        if data:
            self.send_response(self.iopub_socket, "stream",
                               {"name": name, "text": data.decode(errors="replace")})

    def _take(self, key, sel, d):
        """Reads what one ready pipe has; 1 when it is at its end, else 0."""
        fd = key.fileobj if isinstance(key.fileobj, int) else key.fileobj.fileno()
        chunk = os.read(fd, 65536)
        if not chunk:
            sel.unregister(key.fileobj)
            return 1
        if key.data != "control":
            self._stream(key.data, chunk)
            return 0
        d.pending += chunk
        while b"\n" in d.pending:
            line, d.pending = d.pending.split(b"\n", 1)
            message = json.loads(line)
            if "error" in message:
                d.error = message["error"]
            elif "result" in message:
                d.result = message["result"]
            elif message.get("done"):
                d.said_done = True
        return 0

    def _run(self, code):
        """Sends code to the driver and forwards what it says until it is done; returns the
        error it reported, or None, and the result text."""
        if self.driver is None or not self.driver.alive():
            self.driver = Driver(driver_command(LANGUAGE))
        d = self.driver
        sel = selectors.DefaultSelector()
        sel.register(d.proc.stdout, selectors.EVENT_READ, "stdout")
        sel.register(d.proc.stderr, selectors.EVENT_READ, "stderr")
        sel.register(d.control, selectors.EVENT_READ, "control")
        done = interrupted = False
        d.error = d.result = None
        d.said_done = False
        try:
            d.send(code)
        except (BrokenPipeError, ValueError):
            pass  # it is gone: its pipes are at their end, and that is reported below
        open_fds = 3
        while not done and open_fds > 0:
            try:
                for key, _ in sel.select():
                    open_fds -= self._take(key, sel, d)
                done = d.said_done
            except KeyboardInterrupt:
                # Wherever it lands: the driver got the same SIGINT (one process group) and
                # ends the cell itself; leaving now would take its answer for the next cell's.
                interrupted = True
        # What the code wrote before the driver said done is in the pipes already.
        for stream, name in ((d.proc.stdout, "stdout"), (d.proc.stderr, "stderr")):
            os.set_blocking(stream.fileno(), False)
            try:
                while chunk := os.read(stream.fileno(), 65536):
                    self._stream(name, chunk)
            except (BlockingIOError, OSError):
                pass
            os.set_blocking(stream.fileno(), True)
        sel.close()
        error, result = d.error, d.result
        if not done:
            d.proc.wait()
            self.driver = None
            if interrupted or d.proc.returncode == -signal.SIGINT:
                error = {"ename": "KeyboardInterrupt", "evalue": "interrupted", "traceback": []}
            else:
                error = {"ename": "DriverDied", "evalue":
                         f"the {LANGUAGE} driver exited ({d.proc.returncode}); its state is lost",
                         "traceback": []}
        return error, result

    def do_execute(self, code, silent, store_history=True, user_expressions=None,
                   allow_stdin=False):
        error, result = self._run(code)
        if error is not None:
            content = {"ename": error.get("ename", "Error"), "evalue": error.get("evalue", ""),
                       "traceback": error.get("traceback") or
                       [f"{error.get('ename', 'Error')}: {error.get('evalue', '')}"]}
            self.send_response(self.iopub_socket, "error", content)
            return dict(content, status="error", execution_count=self.execution_count)
        if result is not None and not silent:
            self.send_response(self.iopub_socket, "execute_result", {
                "execution_count": self.execution_count, "data": {"text/plain": result},
                "metadata": {}})
        return {"status": "ok", "execution_count": self.execution_count, "payload": [],
                "user_expressions": {}}

    def do_shutdown(self, restart):
        if self.driver is not None and self.driver.alive():
            self.driver.proc.kill()
        return {"status": "ok", "restart": restart}


if __name__ == "__main__":
    if LANGUAGE not in INFO:
        raise SystemExit(f"usage: cove_repl_kernel.py {{{'|'.join(INFO)}}} -f CONNECTION_FILE")
    IPKernelApp.launch_instance(kernel_class=ReplKernel)
