"""The synchronous API: :class:`Sandbox` and its ``files``, ``commands`` and ``pty``.

Every method is one call of an operation of the shared protocol layer (``cove._protocol``);
:mod:`cove.aio` runs the same operations asynchronously.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import ssl
import stat
import tempfile
import time
import urllib.parse
from types import TracebackType
from typing import (IO, Any, Callable, Dict, Iterator, List, Literal, Optional, Sequence, Type,
                    Union, overload)

from . import _protocol as p
from . import _ws
from ._config import ConnectionConfig
from ._transport import SyncTransport
from .errors import CoveError, RequestTimeoutError, ServerUnreachableError
from .models import (CommandResult, Context, Endpoint, EntryInfo, Execution, ExecutionError,
                     Result, SandboxInfo, SnapshotInfo)

__all__ = ["Sandbox", "Files", "Commands", "CommandHandle", "Pty", "PtyHandle"]

OutputCallback = Callable[[str], Any]
Data = Union[str, bytes, bytearray, memoryview, IO[Any]]
PathOrFile = Union[str, "os.PathLike[str]", IO[Any]]


class Sandbox:
    """A Cove sandbox.

    Make one with :meth:`create` (or attach to one with :meth:`connect`); use it as a context
    manager to kill it on exit, whether the block succeeds or raises::

        with Sandbox.create(template="base") as sandbox:
            sandbox.files.write("/home/user/a.txt", "hello")
            print(sandbox.commands.run("cat /home/user/a.txt").stdout)

    Attributes:
        sandbox_id: the sandbox's id.
        files: the sandbox's filesystem (:class:`Files`).
        commands: commands in the sandbox (:class:`Commands`).
        pty: interactive terminals (:class:`Pty`).
    """

    def __init__(self, sandbox_id: str, config: ConnectionConfig,
                 info: Optional[SandboxInfo] = None) -> None:
        """Prefer :meth:`create` and :meth:`connect`; this only builds the handle."""
        self.sandbox_id = sandbox_id
        self._config = config
        self._t = SyncTransport(config)
        self._state = p.SandboxState(sandbox_id,
                                     scheme=urllib.parse.urlsplit(config.server).scheme or "http")
        self._info = info
        self.files = Files(self)
        self.commands = Commands(self)
        self.pty = Pty(self)

    @property
    def id(self) -> str:
        """The sandbox's id (same as ``sandbox_id``)."""
        return self.sandbox_id

    def __repr__(self) -> str:
        return f"Sandbox(sandbox_id={self.sandbox_id!r}, server={self._config.server!r})"

    # ---- lifecycle ----

    @classmethod
    def create(cls, template: str = p.DEFAULT_TEMPLATE, timeout: Union[float, datetime.timedelta, None] = p.DEFAULT_TIMEOUT,
               envs: Optional[Dict[str, str]] = None, metadata: Optional[Dict[str, str]] = None,
               network: Optional[Dict[str, Any]] = None,
               resources: Optional[Dict[str, str]] = None,
               entrypoint: Optional[Sequence[str]] = None, *, server: Optional[str] = None,
               api_key: Optional[str] = None, request_timeout: Optional[float] = None,
               start_timeout: float = 60.0, extra: Optional[Dict[str, Any]] = None,
               snapshot: Union[str, SnapshotInfo, None] = None) -> "Sandbox":
        """Creates a sandbox and waits until it runs.

        Args:
            template: the template to start from (``base``, ``code-interpreter``, ...).
            timeout: seconds (or a timedelta) until the sandbox expires and is killed (default
                600), rounded up to whole seconds; None for a sandbox that lives until killed.
            envs: environment variables of the sandbox.
            metadata: string key-values, for :meth:`list` filters and your own bookkeeping.
            network: the egress policy, as OpenSandbox's ``networkPolicy``:
                ``{"defaultAction": "deny", "egress": [{"action": "allow",
                "target": "pypi.org"}]}``.
            resources: resource limits merged over ``{"cpu": "500m", "memory": "512Mi"}``
                (also ``pids``, ``nofile``, ``ephemeral-storage``).
            entrypoint: the sandbox's main process (default: one that idles).
            server, api_key: where coved is and the key to use; by default from
                ``COVE_SERVER``/``COVE_API_KEY`` (or ``OPEN_SANDBOX_DOMAIN``/
                ``OPEN_SANDBOX_API_KEY``, or the CLI's config file, or the state dir's
                ``api_key`` file), as the CLI.
            request_timeout: seconds to wait for an ordinary API answer (default 60).
            start_timeout: seconds to wait for the sandbox to be Running.
            extra: more fields of the create request, sent as they are.
            snapshot: a snapshot (or its id) to start from instead of ``template``: the
                sandbox has the files the snapshot's sandbox had (:meth:`snapshot`).

        Raises:
            CoveError: the server refused (e.g. :class:`~cove.errors.InvalidRequestError`
                with code ``SANDBOX::IMAGE_NOT_FOUND`` for an unknown template).
        """
        config = ConnectionConfig.resolve(server, api_key, request_timeout)
        body = p.create_body(template, timeout, envs, metadata, network, resources, entrypoint,
                             extra, snapshot)
        t = SyncTransport(config)
        try:
            info = t.run(p.op_create(body, start_timeout))
        finally:
            t.close()
        return cls(info.sandbox_id, config, info)

    @classmethod
    def connect(cls, sandbox_id: str, *, server: Optional[str] = None,
                api_key: Optional[str] = None, request_timeout: Optional[float] = None,
                start_timeout: float = 60.0) -> "Sandbox":
        """Attaches to an existing sandbox, resuming it if it is paused.

        Raises:
            NotFoundError: there is no such sandbox (code ``SANDBOX::NOT_FOUND``).
        """
        config = ConnectionConfig.resolve(server, api_key, request_timeout)
        t = SyncTransport(config)
        try:
            info = t.run(p.op_connect(sandbox_id, start_timeout))
        finally:
            t.close()
        return cls(sandbox_id, config, info)

    @classmethod
    def list(cls, state: Union[str, Sequence[str], None] = None,
             metadata: Optional[Dict[str, str]] = None, *, server: Optional[str] = None,
             api_key: Optional[str] = None,
             request_timeout: Optional[float] = None) -> List[SandboxInfo]:
        """The sandboxes the key may see, every page of them.

        Args:
            state: only sandboxes in this state (or any of these states), e.g. ``"Running"``.
            metadata: only sandboxes whose metadata has all these key-values.
        """
        config = ConnectionConfig.resolve(server, api_key, request_timeout)
        states = [state] if isinstance(state, str) else state
        t = SyncTransport(config)
        try:
            return t.run(p.op_list(states, metadata))
        finally:
            t.close()

    @classmethod
    def _call(cls, op: Any, server: Optional[str], api_key: Optional[str],
              request_timeout: Optional[float]) -> Any:
        t = SyncTransport(ConnectionConfig.resolve(server, api_key, request_timeout))
        try:
            return t.run(op)
        finally:
            t.close()

    # ---- snapshots ----

    def snapshot(self, name: Optional[str] = None, wait: float = 300.0) -> SnapshotInfo:
        """Captures the sandbox's filesystem as a snapshot (the sandbox is frozen meanwhile,
        then runs on) and waits until it is Ready; ``wait=0`` returns it Creating.

        Raises:
            ConflictError: the sandbox is not Running, or a snapshot of it is being taken.
            SandboxStateError: the snapshot Failed (code ``SDK::SNAPSHOT_FAILED``, with why).
        """
        return self._t.run(p.op_snapshot_create(self.sandbox_id, name, wait))

    @classmethod
    def list_snapshots(cls, sandbox_id: Optional[str] = None,
                       state: Union[str, Sequence[str], None] = None, name: Optional[str] = None,
                       *, server: Optional[str] = None, api_key: Optional[str] = None,
                       request_timeout: Optional[float] = None) -> List[SnapshotInfo]:
        """The key's snapshots, every page of them, oldest first; filtered by source
        sandbox, state(s) and name."""
        states = [state] if isinstance(state, str) else state
        return cls._call(p.op_snapshot_list(sandbox_id, states, name), server, api_key,
                         request_timeout)

    @classmethod
    def get_snapshot(cls, snapshot_id: str, *, server: Optional[str] = None,
                     api_key: Optional[str] = None,
                     request_timeout: Optional[float] = None) -> SnapshotInfo:
        """One snapshot (NotFoundError, code ``SNAPSHOT::NOT_FOUND``, if there is none)."""
        return cls._call(p.op_snapshot_get(snapshot_id), server, api_key, request_timeout)

    @classmethod
    def delete_snapshot(cls, snapshot_id: Union[str, SnapshotInfo], *,
                        server: Optional[str] = None, api_key: Optional[str] = None,
                        request_timeout: Optional[float] = None) -> bool:
        """Deletes a snapshot: True, or False if there was none. ConflictError (code
        ``SNAPSHOT::IN_USE``) while a sandbox made from it lives."""
        sid = snapshot_id.snapshot_id if isinstance(snapshot_id, SnapshotInfo) else snapshot_id
        return cls._call(p.op_snapshot_delete(sid), server, api_key, request_timeout)

    def get_info(self) -> SandboxInfo:
        """The sandbox's current description (state, metadata, expiry, ...)."""
        self._info = self._t.run(p.op_get_info(self.sandbox_id))
        return self._info

    def is_running(self) -> bool:
        """Whether the sandbox is Running."""
        return self.get_info().state == "Running"

    def kill(self) -> bool:
        """Kills the sandbox: True if it was killed, False if it was already gone."""
        return self._t.run(p.op_kill(self.sandbox_id))

    def pause(self, wait: float = 60.0) -> SandboxInfo:
        """Pauses the sandbox (its processes and memory are kept) and waits until it is
        Paused.

        Raises:
            ConflictError: it is not running (code ``SANDBOX::INVALID_STATE``).
        """
        return self._t.run(p.op_pause(self.sandbox_id, wait))

    def resume(self, wait: float = 60.0) -> SandboxInfo:
        """Resumes a paused sandbox and waits until it is Running."""
        return self._t.run(p.op_resume(self._state, wait))

    def set_timeout(self, timeout: float) -> Optional[datetime.datetime]:
        """Makes the sandbox expire ``timeout`` seconds from now; returns the new expiry
        (a datetime).

        Cove only moves an expiry later, and only for a sandbox made with a timeout:
        otherwise it raises :class:`~cove.errors.ConflictError` or
        :class:`~cove.errors.InvalidRequestError` with the server's code.
        """
        return self._t.run(p.op_set_timeout(self.sandbox_id, timeout))

    def get_endpoint(self, port: int) -> Endpoint:
        """Where ``port`` of the sandbox is reached from outside, with the headers to send."""
        return self._t.run(p.op_endpoint(self._state, port))

    def get_url(self, port: int) -> str:
        """The URL (with scheme) of ``port`` of the sandbox, through coved's gateway."""
        return self.get_endpoint(port).url

    def get_host(self, port: int) -> str:
        """The address of ``port`` of the sandbox without a scheme
        (``127.0.0.1:8080/sandboxes/ID/proxy/3000``)."""
        return self.get_endpoint(port).host

    def close(self) -> None:
        """Closes the handle's connections (the sandbox goes on running)."""
        self._t.close()

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        """Kills the sandbox. When the block raised, a failure to kill does not hide its
        exception."""
        try:
            self.kill()
        except CoveError:
            if exc is None:
                raise
        finally:
            self.close()

    # ---- code interpreter ----

    def run_code(self, code: str, language: Optional[str] = None,
                 context: Union[Context, str, None] = None,
                 on_stdout: Optional[OutputCallback] = None,
                 on_stderr: Optional[OutputCallback] = None,
                 on_result: Optional[Callable[[Result], Any]] = None,
                 on_error: Optional[Callable[[ExecutionError], Any]] = None,
                 timeout: Optional[float] = None) -> Execution:
        """Runs code in a kernel of the sandbox (Python by default) and returns its
        :class:`~cove.models.Execution`.

        Without ``context``, the code runs in the language's default context, which keeps
        its variables between runs; with one (from :meth:`create_code_context`, or its id)
        it runs there. ``language="bash"`` runs in a shell that keeps its directory and
        environment. Callbacks get output and results as they come, in order.

        An exception in the code is not raised: it is ``execution.error``, and
        ``execution.exit_code`` is then non-zero.

        Args:
            timeout: seconds to wait for the run (default: as long as it takes).
        """
        return self._t.run(p.op_run_code(self._state, code, language, context, on_stdout,
                                         on_stderr, on_result, on_error, timeout))

    def create_code_context(self, language: str = "python") -> Context:
        """A new context (its own kernel) for ``language``."""
        return self._t.run(p.op_create_context(self._state, language))

    def list_code_contexts(self, language: Optional[str] = None) -> List[Context]:
        """The sandbox's contexts, or those of one language."""
        return self._t.run(p.op_list_contexts(self._state, language))

    def delete_code_context(self, context: Union[Context, str]) -> None:
        """Deletes a context and its kernel (a run in it ends)."""
        self._t.run(p.op_delete_context(self._state, context))

    def interrupt_code(self, context: Union[Context, str]) -> None:
        """Interrupts what runs in a context (Python gets KeyboardInterrupt); the context
        stays."""
        self._t.run(p.op_interrupt(self._state, context))


@contextlib.contextmanager
def local_target(local: "Union[str, os.PathLike[str]]") -> Iterator[IO[bytes]]:
    """A binary file to download into the local path: a temporary file beside it, put in its
    place once the download is whole, so that a failed one leaves the path as it was (a
    replaced file keeps its mode); a path that is not a regular file (/dev/null, a FIFO) is
    written to as it is."""
    path = os.fspath(local)
    try:
        st: Optional[os.stat_result] = os.stat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        with open(path, "wb") as f:
            yield f
        return
    fd, temp = tempfile.mkstemp(dir=os.path.dirname(path) or ".",
                                prefix=f".{os.path.basename(path)}.", suffix=".cove")
    try:
        if st is not None:
            mode = stat.S_IMODE(st.st_mode)
        else:
            mask = os.umask(0)
            os.umask(mask)
            mode = 0o666 & ~mask
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            yield f
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


class Files:
    """The sandbox's filesystem (``sandbox.files``). Paths are inside the sandbox."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def write(self, path: str, data: Data, *, user: Optional[str] = None,
              group: Optional[str] = None, mode: Optional[int] = None) -> EntryInfo:
        """Writes a file (making missing parent directories), replacing what was there.

        Args:
            data: a str (written as UTF-8), bytes, or a file object opened for reading,
                which is streamed.
            user, group: owner and group (names) of the file.
            mode: its permission bits, e.g. ``0o600``.
        """
        return self._sb._t.run(p.op_write(self._sb._state, path, data, user, group, mode))

    @overload
    def read(self, path: str, format: Literal["text"] = "text") -> str: ...

    @overload
    def read(self, path: str, format: Literal["bytes"]) -> bytes: ...

    @overload
    def read(self, path: str, format: Literal["stream"]) -> Iterator[bytes]: ...

    def read(self, path: str, format: str = "text") -> Any:
        """Reads a file: as text (UTF-8), ``format="bytes"``, or ``format="stream"``, an
        iterator of byte chunks that is not held in memory."""
        if format == "stream":
            req = self._sb._t.run(p.op_download_request(self._sb._state, path))
            return self._sb._t.iter_bytes(req)
        data = self._sb._t.run(p.op_read(self._sb._state, path))
        if format == "bytes":
            return data
        if format == "text":
            return data.decode("utf-8")
        raise ValueError(f"format must be text, bytes or stream, not {format!r}")

    def list(self, path: str, depth: int = 1) -> List[EntryInfo]:
        """The entries of a directory (``depth`` levels down; 1: its children)."""
        return self._sb._t.run(p.op_list_dir(self._sb._state, path, depth))

    def exists(self, path: str) -> bool:
        """Whether something is at ``path``."""
        return self._sb._t.run(p.op_exists(self._sb._state, path))

    def get_info(self, path: str) -> EntryInfo:
        """What is at ``path`` (raises NotFoundError, code ``FILE_NOT_FOUND``, if nothing)."""
        return self._sb._t.run(p.op_file_info(self._sb._state, path))

    def remove(self, path: str) -> None:
        """Removes a file, or a directory with everything in it."""
        self._sb._t.run(p.op_remove(self._sb._state, path))

    def rename(self, old_path: str, new_path: str) -> EntryInfo:
        """Renames or moves ``old_path`` to ``new_path``; returns the new entry."""
        return self._sb._t.run(p.op_rename(self._sb._state, old_path, new_path))

    def make_dir(self, path: str, mode: int = 0o755, *, user: Optional[str] = None,
                 group: Optional[str] = None) -> bool:
        """Makes a directory and its missing parents: False if it already existed."""
        return self._sb._t.run(p.op_make_dir(self._sb._state, path, mode, user, group))

    def upload(self, local: PathOrFile, path: str, *, user: Optional[str] = None,
               group: Optional[str] = None, mode: Optional[int] = None) -> EntryInfo:
        """Uploads a local file (a path or a file object opened in binary mode) to ``path``,
        streamed in 1 MiB chunks, so its size does not matter."""
        if isinstance(local, (str, os.PathLike)):
            with open(local, "rb") as f:
                return self.write(path, f, user=user, group=group, mode=mode)
        return self.write(path, local, user=user, group=group, mode=mode)

    def download(self, path: str, local: PathOrFile) -> int:
        """Downloads ``path`` to a local path or binary file object, streamed; returns the
        number of bytes. A local path is replaced only once the whole file has come."""
        if isinstance(local, (str, os.PathLike)):
            with local_target(local) as f:
                return self.download(path, f)
        total = 0
        for chunk in self.read(path, format="stream"):
            local.write(chunk)
            total += len(chunk)
        return total


class CommandHandle:
    """A command running in the background (``commands.run(..., background=True)``).

    Its stdout and stderr are kept by the server as one log: :meth:`logs` and the result of
    :meth:`wait` give them combined, and ``on_stdout`` gets every chunk of it.
    """

    def __init__(self, sandbox: Sandbox, command_id: str,
                 on_stdout: Optional[OutputCallback] = None) -> None:
        self._sb = sandbox
        self.command_id = command_id
        self._on_stdout = on_stdout

    @property
    def id(self) -> str:
        """The command's id."""
        return self.command_id

    def wait(self, on_stdout: Optional[OutputCallback] = None,
             timeout: Optional[float] = None) -> CommandResult:
        """Waits until the command ends and returns its result (its output, exit code and
        error). Output is passed to ``on_stdout`` (or the one given to ``run``) as it comes.

        Raises:
            RequestTimeoutError: it still ran after ``timeout`` seconds.
        """
        return self._sb._t.run(p.op_command_wait(self._sb._state, self.command_id,
                                                 on_stdout or self._on_stdout, timeout))

    def logs(self) -> str:
        """Everything the command printed so far (stdout and stderr combined)."""
        return self._sb._t.run(p.op_command_logs(self._sb._state, self.command_id))[0]

    def is_running(self) -> bool:
        """Whether the command still runs."""
        status = self._sb._t.run(p.op_command_status(self._sb._state, self.command_id))
        return bool(status.get("running"))

    def kill(self) -> bool:
        """Kills the command: False if the server did not know it."""
        return self._sb._t.run(p.op_command_kill(self._sb._state, self.command_id))


class Commands:
    """Shell commands in the sandbox (``sandbox.commands``)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    @overload
    def run(self, cmd: str, *, background: Literal[False] = False, cwd: Optional[str] = None,
            envs: Optional[Dict[str, str]] = None, user: Union[str, int, None] = None,
            timeout: Optional[float] = None, on_stdout: Optional[OutputCallback] = None,
            on_stderr: Optional[OutputCallback] = None) -> CommandResult: ...

    @overload
    def run(self, cmd: str, *, background: Literal[True], cwd: Optional[str] = None,
            envs: Optional[Dict[str, str]] = None, user: Union[str, int, None] = None,
            timeout: Optional[float] = None, on_stdout: Optional[OutputCallback] = None,
            on_stderr: Optional[OutputCallback] = None) -> CommandHandle: ...

    def run(self, cmd: str, *, background: bool = False, cwd: Optional[str] = None,
            envs: Optional[Dict[str, str]] = None, user: Union[str, int, None] = None,
            timeout: Optional[float] = None, on_stdout: Optional[OutputCallback] = None,
            on_stderr: Optional[OutputCallback] = None) -> Union[CommandResult, CommandHandle]:
        """Runs ``cmd`` with ``/bin/sh -c``.

        In the foreground (default) it returns the :class:`~cove.models.CommandResult` once
        the command ends; a non-zero exit is not raised but is ``exit_code`` (and
        ``error``). ``on_stdout``/``on_stderr`` get each line (with its newline) as it is
        printed, in order. With ``background=True`` it returns a :class:`CommandHandle` at
        once.

        Args:
            cwd: its working directory.
            envs: environment variables added to the sandbox's.
            user: the user to run as, by name (``"user"``, ``"root"``) or uid; by default
                the agent's (root).
            timeout: seconds after which the server kills it (``exit_code`` -1).
        """
        folder = self._sb._t.run(p.op_run_command(self._sb._state, cmd, cwd, envs, user, timeout,
                                                  background, on_stdout, on_stderr))
        if background:
            assert folder.command_id is not None  # op_run_command checked it
            return CommandHandle(self._sb, folder.command_id, on_stdout)
        return folder.result()

    def connect(self, command_id: str, on_stdout: Optional[OutputCallback] = None
                ) -> CommandHandle:
        """A handle on a background command started earlier."""
        return CommandHandle(self._sb, command_id, on_stdout)

    def kill(self, command_id: str) -> bool:
        """Kills a command by id: False if the server did not know it."""
        return self._sb._t.run(p.op_command_kill(self._sb._state, command_id))


class PtyHandle:
    """An interactive terminal in the sandbox, over execd's PTY WebSocket.

    Attributes:
        id: the PTY session's id (it outlives the connection: :meth:`Pty.connect`).
        exit_code: the shell's exit status once it exited, else None.
        output: every byte of terminal output received so far.
    """

    def __init__(self, sandbox: Sandbox, pty_id: str, sock: socket.socket,
                 proto: _ws.PtyProtocol, pending: bytes) -> None:
        self._sb = sandbox
        self.id = pty_id
        self._sock = sock
        self._proto = proto
        self._events: List[_ws.PtyEvent] = []
        self.exit_code: Optional[int] = None
        self.output = b""
        self.closed = False
        if pending:
            self._take(pending)

    def _take(self, data: bytes) -> None:
        events, reply = self._proto.feed(data)
        if reply:
            self._sock.sendall(reply)
        self._events += events

    def _send(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except OSError as e:
            raise ServerUnreachableError(f"pty {self.id}: {e}", code="SDK::CONNECTION") from e

    def send_input(self, data: Union[str, bytes]) -> None:
        """Types ``data`` on the terminal (``"\\r"`` is Enter, ``"\\x03"`` Ctrl-C)."""
        self._send(_ws.stdin_frame(data))

    def resize(self, cols: int, rows: int) -> None:
        """Resizes the terminal."""
        self._send(_ws.json_frame({"type": "resize", "cols": cols, "rows": rows}))

    def signal(self, name: str = "SIGINT") -> None:
        """Sends a signal (``SIGINT``, ``SIGTERM``, ...) to the terminal's foreground job."""
        self._send(_ws.json_frame({"type": "signal", "signal": name}))

    def next_event(self, timeout: Optional[float] = None) -> _ws.PtyEvent:
        """The next event from the terminal (output, exit, close, ...)."""
        while not self._events:
            if self.closed:
                return _ws.PtyEvent("closed")
            self._sock.settimeout(timeout)
            try:
                data = self._sock.recv(65536)
            except socket.timeout:
                raise RequestTimeoutError(f"pty {self.id}: nothing within {timeout} s",
                                          code="SDK::TIMEOUT")
            except ConnectionError:  # reset or broken: closed, as the async handle says
                data = b""
            if not data:
                self.closed = True
                return _ws.PtyEvent("closed")
            self._take(data)
        ev = self._events.pop(0)
        if ev.kind == "output":
            self.output += ev.data
        elif ev.kind == "exit":
            self.exit_code = ev.exit_code
        elif ev.kind == "closed":
            self.closed = True
        return ev

    def read_until(self, needle: Union[str, bytes], timeout: float = 30.0) -> bytes:
        """Reads output until everything received holds ``needle``; returns all output.

        Raises:
            RequestTimeoutError: it did not come within ``timeout`` seconds.
        """
        want = needle.encode() if isinstance(needle, str) else needle
        deadline = time.monotonic() + timeout
        while want not in self.output:
            left = deadline - time.monotonic()
            if left <= 0 or self.next_event(left).kind == "closed":
                raise RequestTimeoutError(f"pty {self.id}: no {want!r} in the output",
                                          code="SDK::TIMEOUT")
        return self.output

    def wait(self, on_data: Optional[Callable[[bytes], Any]] = None,
             timeout: Optional[float] = None) -> Optional[int]:
        """Reads until the shell exits (or the connection ends); returns its exit status.
        ``on_data`` gets each chunk of output."""
        while True:
            ev = self.next_event(timeout)
            if ev.kind == "output" and on_data is not None:
                on_data(ev.data)
            if ev.kind == "closed":
                return self.exit_code

    def kill(self) -> bool:
        """Ends the PTY session and its shell."""
        killed = self._sb._t.run(p.op_pty_kill(self._sb._state, self.id))
        self.close()
        return killed

    def close(self) -> None:
        """Disconnects; the shell goes on (reconnect with :meth:`Pty.connect`)."""
        if not self.closed:
            try:
                self._sock.sendall(_ws.close_frame())
            except OSError:
                pass
        self.closed = True
        self._sock.close()

    def __enter__(self) -> "PtyHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Pty:
    """Interactive terminals in the sandbox (``sandbox.pty``)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def create(self, cols: int = 80, rows: int = 24, cwd: Optional[str] = None,
               command: Optional[str] = None, timeout: float = 30.0) -> PtyHandle:
        """Starts a shell (or ``command``) on a new terminal and connects to it."""
        pty_id = self._sb._t.run(p.op_pty_create(self._sb._state, cols, rows, cwd, command))
        return self.connect(pty_id, timeout=timeout)

    def connect(self, pty_id: str, since: Optional[int] = None, takeover: bool = False,
                timeout: float = 30.0) -> PtyHandle:
        """Connects to a PTY session. ``since``: replay its output from that byte offset;
        ``takeover``: replace a client already connected (else ConflictError)."""
        base, headers = self._sb._t.run(p.op_execd(self._sb._state))
        query = {k: v for k, v in (("since", since), ("takeover", 1 if takeover else None))
                 if v is not None}
        url = f"{base}/pty/{p.quote(pty_id)}/ws" + (
            "?" + urllib.parse.urlencode(query) if query else "")
        if self._sb._config.api_key:
            headers[p.API_KEY_HEADER] = self._sb._config.api_key
        t = _ws.target(url)
        request, key = _ws.handshake(t, headers)
        sock = None
        try:
            sock = socket.create_connection((t.host, t.port), timeout=timeout)
            if t.tls:
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=t.host)
            sock.sendall(request)
            buf = b""
            while b"\r\n\r\n" not in buf:
                chunk = sock.recv(65536)
                if not chunk:
                    raise ServerUnreachableError("the connection closed during the upgrade",
                                                 code="SDK::CONNECTION")
                buf += chunk
            head, _, rest = buf.partition(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 101"):
                need = _ws.content_length(head)
                while len(rest) < need:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    rest += chunk
            _ws.check_handshake(head, rest, key)
        except BaseException as e:
            if sock is not None:
                sock.close()  # a failed upgrade leaves nothing open
            if isinstance(e, OSError):
                raise ServerUnreachableError(f"pty {pty_id}: {e}", code="SDK::CONNECTION") from e
            raise
        return PtyHandle(self._sb, pty_id, sock, _ws.PtyProtocol(), rest)

    def kill(self, pty_id: str) -> bool:
        """Ends a PTY session by id."""
        return self._sb._t.run(p.op_pty_kill(self._sb._state, pty_id))
