"""The asynchronous API: :class:`AsyncSandbox` (``cove.aio.Sandbox``).

The methods are those of :class:`cove.Sandbox`, awaited, and run the same operations of the
shared protocol layer; their documentation is copied from the sync classes.
"""

from __future__ import annotations

import datetime
import inspect
import os
import urllib.parse
from types import TracebackType
from typing import (IO, Any, AsyncIterator, Callable, Dict, List, Literal, Optional, Sequence,
                    Type, TypeVar, Union, overload)

import anyio

from .. import _protocol as p
from .. import _ws
from .. import sandbox as _sync
from .._config import ConnectionConfig
from ..errors import CoveError, RequestTimeoutError, ServerUnreachableError
from ..models import (CommandResult, Context, Endpoint, EntryInfo, Execution, ExecutionError,
                      Result, SandboxInfo, SnapshotInfo)
from ._transport import AsyncTransport, call

__all__ = ["AsyncSandbox", "AsyncFiles", "AsyncCommands", "AsyncCommandHandle", "AsyncPty",
           "AsyncPtyHandle"]

OutputCallback = Callable[[str], Any]  # may be a coroutine function
Data = Union[str, bytes, bytearray, memoryview, IO[Any], Any]
PathOrFile = Union[str, "os.PathLike[str]", IO[Any]]
C = TypeVar("C", bound=type)


def _docs_from(sync_cls: type) -> Callable[[C], C]:
    """Gives the async class's methods the docstrings of the sync class's."""
    def apply(cls: C) -> C:
        for name, member in vars(cls).items():
            fn = getattr(member, "__func__", member)
            source = getattr(sync_cls, name, None)
            source = getattr(source, "__func__", source)
            if callable(fn) and not getattr(fn, "__doc__", None) and source is not None:
                try:
                    fn.__doc__ = source.__doc__
                except AttributeError:
                    pass
        return cls
    return apply


@_docs_from(_sync.Sandbox)
class AsyncSandbox:
    """A Cove sandbox, driven with ``await``.

    ``async with await Sandbox.create(...) as sandbox:`` kills it on exit, whether the block
    succeeds or raises. See :class:`cove.Sandbox` for every method."""

    def __init__(self, sandbox_id: str, config: ConnectionConfig,
                 info: Optional[SandboxInfo] = None,
                 _transport: Optional[AsyncTransport] = None) -> None:
        self.sandbox_id = sandbox_id
        self._config = config
        self._t = _transport or AsyncTransport(config)
        self._state = p.SandboxState(sandbox_id,
                                     scheme=urllib.parse.urlsplit(config.server).scheme or "http")
        self._info = info
        self.files = AsyncFiles(self)
        self.commands = AsyncCommands(self)
        self.pty = AsyncPty(self)

    @property
    def id(self) -> str:
        """The sandbox's id (same as ``sandbox_id``)."""
        return self.sandbox_id

    def __repr__(self) -> str:
        return f"AsyncSandbox(sandbox_id={self.sandbox_id!r}, server={self._config.server!r})"

    @classmethod
    async def create(cls, template: str = p.DEFAULT_TEMPLATE,
                     timeout: Union[float, datetime.timedelta, None] = p.DEFAULT_TIMEOUT,
                     envs: Optional[Dict[str, str]] = None,
                     metadata: Optional[Dict[str, str]] = None,
                     network: Optional[Dict[str, Any]] = None,
                     resources: Optional[Dict[str, str]] = None,
                     entrypoint: Optional[Sequence[str]] = None, *, server: Optional[str] = None,
                     api_key: Optional[str] = None, request_timeout: Optional[float] = None,
                     start_timeout: float = 60.0,
                     extra: Optional[Dict[str, Any]] = None,
                     snapshot: Union[str, SnapshotInfo, None] = None) -> "AsyncSandbox":
        config = ConnectionConfig.resolve(server, api_key, request_timeout)
        body = p.create_body(template, timeout, envs, metadata, network, resources, entrypoint,
                             extra, snapshot)
        t = AsyncTransport(config)
        try:
            # Once sent, the request is seen through, even by a cancelled caller: the sandbox
            # it makes is then killed, not left running with nobody holding its id.
            created, cancelled = await t.complete(t.run(p.op_create_request(body)))
            try:
                if cancelled is not None:
                    raise cancelled
                await anyio.lowlevel.checkpoint()  # where an anyio scope's cancellation comes
                info = await t.run(p.op_create_wait(created, start_timeout))
            except Exception:
                raise  # op_create_wait killed it
            except BaseException:
                try:
                    await t.complete(t.run(p.op_kill(created.sandbox_id)))
                except CoveError:
                    pass
                raise
        except BaseException:
            await t.complete(t.close())
            raise
        # the handle takes the transport over: nothing is awaited between here and the caller
        return cls(info.sandbox_id, config, info, _transport=t)

    @classmethod
    async def connect(cls, sandbox_id: str, *, server: Optional[str] = None,
                      api_key: Optional[str] = None, request_timeout: Optional[float] = None,
                      start_timeout: float = 60.0) -> "AsyncSandbox":
        config = ConnectionConfig.resolve(server, api_key, request_timeout)
        t = AsyncTransport(config)
        try:
            info = await t.run(p.op_connect(sandbox_id, start_timeout))
        finally:
            await t.close()
        return cls(sandbox_id, config, info)

    @classmethod
    async def list(cls, state: Union[str, Sequence[str], None] = None,
                   metadata: Optional[Dict[str, str]] = None, *, server: Optional[str] = None,
                   api_key: Optional[str] = None,
                   request_timeout: Optional[float] = None) -> List[SandboxInfo]:
        config = ConnectionConfig.resolve(server, api_key, request_timeout)
        states = [state] if isinstance(state, str) else state
        t = AsyncTransport(config)
        try:
            return await t.run(p.op_list(states, metadata))
        finally:
            await t.close()

    @classmethod
    async def _call(cls, op: Any, server: Optional[str], api_key: Optional[str],
                    request_timeout: Optional[float]) -> Any:
        t = AsyncTransport(ConnectionConfig.resolve(server, api_key, request_timeout))
        try:
            return await t.run(op)
        finally:
            await t.close()

    async def snapshot(self, name: Optional[str] = None, wait: float = 300.0) -> SnapshotInfo:
        return await self._t.run(p.op_snapshot_create(self.sandbox_id, name, wait))

    @classmethod
    async def list_snapshots(cls, sandbox_id: Optional[str] = None,
                             state: Union[str, Sequence[str], None] = None,
                             name: Optional[str] = None, *, server: Optional[str] = None,
                             api_key: Optional[str] = None,
                             request_timeout: Optional[float] = None) -> List[SnapshotInfo]:
        states = [state] if isinstance(state, str) else state
        return await cls._call(p.op_snapshot_list(sandbox_id, states, name), server, api_key,
                               request_timeout)

    @classmethod
    async def get_snapshot(cls, snapshot_id: str, *, server: Optional[str] = None,
                           api_key: Optional[str] = None,
                           request_timeout: Optional[float] = None) -> SnapshotInfo:
        return await cls._call(p.op_snapshot_get(snapshot_id), server, api_key,
                               request_timeout)

    @classmethod
    async def delete_snapshot(cls, snapshot_id: Union[str, SnapshotInfo], *,
                              server: Optional[str] = None, api_key: Optional[str] = None,
                              request_timeout: Optional[float] = None) -> bool:
        sid = snapshot_id.snapshot_id if isinstance(snapshot_id, SnapshotInfo) else snapshot_id
        return await cls._call(p.op_snapshot_delete(sid), server, api_key, request_timeout)

    async def get_info(self) -> SandboxInfo:
        self._info = await self._t.run(p.op_get_info(self.sandbox_id))
        return self._info

    async def is_running(self) -> bool:
        return (await self.get_info()).state == "Running"

    async def kill(self) -> bool:
        return await self._t.run(p.op_kill(self.sandbox_id))

    async def pause(self, wait: float = 60.0) -> SandboxInfo:
        return await self._t.run(p.op_pause(self.sandbox_id, wait))

    async def resume(self, wait: float = 60.0) -> SandboxInfo:
        return await self._t.run(p.op_resume(self._state, wait))

    async def set_timeout(self, timeout: float) -> Optional[datetime.datetime]:
        return await self._t.run(p.op_set_timeout(self.sandbox_id, timeout))

    async def get_endpoint(self, port: int) -> Endpoint:
        return await self._t.run(p.op_endpoint(self._state, port))

    async def get_url(self, port: int) -> str:
        return (await self.get_endpoint(port)).url

    async def get_host(self, port: int) -> str:
        return (await self.get_endpoint(port)).host

    async def close(self) -> None:
        await self._t.close()

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, exc_type: Optional[Type[BaseException]],
                        exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        """Kills the sandbox. When the block raised, a failure to kill does not hide its
        exception."""
        try:
            with anyio.CancelScope(shield=True):  # also when the block was cancelled
                await self.kill()
        except CoveError:
            if exc is None:
                raise
        finally:
            with anyio.CancelScope(shield=True):
                await self.close()

    async def run_code(self, code: str, language: Optional[str] = None,
                       context: Union[Context, str, None] = None,
                       on_stdout: Optional[OutputCallback] = None,
                       on_stderr: Optional[OutputCallback] = None,
                       on_result: Optional[Callable[[Result], Any]] = None,
                       on_error: Optional[Callable[[ExecutionError], Any]] = None,
                       timeout: Optional[float] = None) -> Execution:
        return await self._t.run(p.op_run_code(self._state, code, language, context, on_stdout,
                                               on_stderr, on_result, on_error, timeout))

    async def create_code_context(self, language: str = "python") -> Context:
        return await self._t.run(p.op_create_context(self._state, language))

    async def list_code_contexts(self, language: Optional[str] = None) -> List[Context]:
        return await self._t.run(p.op_list_contexts(self._state, language))

    async def delete_code_context(self, context: Union[Context, str]) -> None:
        await self._t.run(p.op_delete_context(self._state, context))

    async def interrupt_code(self, context: Union[Context, str]) -> None:
        await self._t.run(p.op_interrupt(self._state, context))


@_docs_from(_sync.Files)
class AsyncFiles:
    """The sandbox's filesystem (``sandbox.files``); see :class:`cove.Files`. Callbacks and
    file objects may be async (a file object whose ``read`` is a coroutine function)."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    async def write(self, path: str, data: Data, *, user: Optional[str] = None,
                    group: Optional[str] = None, mode: Optional[int] = None) -> EntryInfo:
        return await self._sb._t.run(p.op_write(self._sb._state, path, data, user, group, mode))

    @overload
    async def read(self, path: str, format: Literal["text"] = "text") -> str: ...

    @overload
    async def read(self, path: str, format: Literal["bytes"]) -> bytes: ...

    @overload
    async def read(self, path: str, format: Literal["stream"]) -> AsyncIterator[bytes]: ...

    async def read(self, path: str, format: str = "text") -> Any:
        """Reads a file: as text (UTF-8), ``format="bytes"``, or ``format="stream"``, an
        async iterator of byte chunks that is not held in memory."""
        if format == "stream":
            req = await self._sb._t.run(p.op_download_request(self._sb._state, path))
            return self._sb._t.iter_bytes(req)
        data = await self._sb._t.run(p.op_read(self._sb._state, path))
        if format == "bytes":
            return data
        if format == "text":
            return data.decode("utf-8")
        raise ValueError(f"format must be text, bytes or stream, not {format!r}")

    async def list(self, path: str, depth: int = 1) -> List[EntryInfo]:
        return await self._sb._t.run(p.op_list_dir(self._sb._state, path, depth))

    async def exists(self, path: str) -> bool:
        return await self._sb._t.run(p.op_exists(self._sb._state, path))

    async def get_info(self, path: str) -> EntryInfo:
        return await self._sb._t.run(p.op_file_info(self._sb._state, path))

    async def remove(self, path: str) -> None:
        await self._sb._t.run(p.op_remove(self._sb._state, path))

    async def rename(self, old_path: str, new_path: str) -> EntryInfo:
        return await self._sb._t.run(p.op_rename(self._sb._state, old_path, new_path))

    async def make_dir(self, path: str, mode: int = 0o755, *, user: Optional[str] = None,
                       group: Optional[str] = None) -> bool:
        return await self._sb._t.run(p.op_make_dir(self._sb._state, path, mode, user, group))

    async def upload(self, local: PathOrFile, path: str, *, user: Optional[str] = None,
                     group: Optional[str] = None, mode: Optional[int] = None) -> EntryInfo:
        if isinstance(local, (str, os.PathLike)):
            with open(local, "rb") as f:
                return await self.write(path, f, user=user, group=group, mode=mode)
        return await self.write(path, local, user=user, group=group, mode=mode)

    async def download(self, path: str, local: PathOrFile) -> int:
        if isinstance(local, (str, os.PathLike)):
            with _sync.local_target(local) as f:
                return await self.download(path, f)
        total = 0
        write = local.write
        async for chunk in await self.read(path, format="stream"):
            if inspect.iscoroutinefunction(write):  # an async file object
                await write(chunk)
            else:  # a blocking one: written in a worker thread
                await anyio.to_thread.run_sync(write, chunk)
            total += len(chunk)
        return total


@_docs_from(_sync.CommandHandle)
class AsyncCommandHandle:
    """A command running in the background; see :class:`cove.CommandHandle`."""

    def __init__(self, sandbox: AsyncSandbox, command_id: str,
                 on_stdout: Optional[OutputCallback] = None) -> None:
        self._sb = sandbox
        self.command_id = command_id
        self._on_stdout = on_stdout

    @property
    def id(self) -> str:
        """The command's id."""
        return self.command_id

    async def wait(self, on_stdout: Optional[OutputCallback] = None,
                   timeout: Optional[float] = None) -> CommandResult:
        return await self._sb._t.run(p.op_command_wait(self._sb._state, self.command_id,
                                                       on_stdout or self._on_stdout, timeout))

    async def logs(self) -> str:
        return (await self._sb._t.run(p.op_command_logs(self._sb._state, self.command_id)))[0]

    async def is_running(self) -> bool:
        status = await self._sb._t.run(p.op_command_status(self._sb._state, self.command_id))
        return bool(status.get("running"))

    async def kill(self) -> bool:
        return await self._sb._t.run(p.op_command_kill(self._sb._state, self.command_id))


@_docs_from(_sync.Commands)
class AsyncCommands:
    """Shell commands in the sandbox; see :class:`cove.Commands`."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    @overload
    async def run(self, cmd: str, *, background: Literal[False] = False,
                  cwd: Optional[str] = None, envs: Optional[Dict[str, str]] = None,
                  user: Union[str, int, None] = None, timeout: Optional[float] = None,
                  on_stdout: Optional[OutputCallback] = None,
                  on_stderr: Optional[OutputCallback] = None) -> CommandResult: ...

    @overload
    async def run(self, cmd: str, *, background: Literal[True], cwd: Optional[str] = None,
                  envs: Optional[Dict[str, str]] = None, user: Union[str, int, None] = None,
                  timeout: Optional[float] = None, on_stdout: Optional[OutputCallback] = None,
                  on_stderr: Optional[OutputCallback] = None) -> AsyncCommandHandle: ...

    async def run(self, cmd: str, *, background: bool = False, cwd: Optional[str] = None,
                  envs: Optional[Dict[str, str]] = None, user: Union[str, int, None] = None,
                  timeout: Optional[float] = None, on_stdout: Optional[OutputCallback] = None,
                  on_stderr: Optional[OutputCallback] = None
                  ) -> Union[CommandResult, AsyncCommandHandle]:
        folder = await self._sb._t.run(p.op_run_command(self._sb._state, cmd, cwd, envs, user,
                                                        timeout, background, on_stdout,
                                                        on_stderr))
        if background:
            assert folder.command_id is not None  # op_run_command checked it
            return AsyncCommandHandle(self._sb, folder.command_id, on_stdout)
        return folder.result()

    def connect(self, command_id: str, on_stdout: Optional[OutputCallback] = None
                ) -> AsyncCommandHandle:
        return AsyncCommandHandle(self._sb, command_id, on_stdout)

    async def kill(self, command_id: str) -> bool:
        return await self._sb._t.run(p.op_command_kill(self._sb._state, command_id))


@_docs_from(_sync.PtyHandle)
class AsyncPtyHandle:
    """An interactive terminal in the sandbox; see :class:`cove.PtyHandle`."""

    def __init__(self, sandbox: AsyncSandbox, pty_id: str, stream: Any,
                 proto: _ws.PtyProtocol, pending: bytes) -> None:
        self._sb = sandbox
        self.id = pty_id
        self._stream = stream
        self._proto = proto
        self._events: List[_ws.PtyEvent] = []
        self._pending = pending
        self.exit_code: Optional[int] = None
        self.output = b""
        self.closed = False

    async def _take(self, data: bytes) -> None:
        events, reply = self._proto.feed(data)
        if reply:
            await self._send(reply)
        self._events += events

    async def _send(self, data: bytes) -> None:
        try:
            await self._stream.send(data)
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as e:
            raise ServerUnreachableError(f"pty {self.id}: {e}", code="SDK::CONNECTION") from e

    async def send_input(self, data: Union[str, bytes]) -> None:
        await self._send(_ws.stdin_frame(data))

    async def resize(self, cols: int, rows: int) -> None:
        await self._send(_ws.json_frame({"type": "resize", "cols": cols, "rows": rows}))

    async def signal(self, name: str = "SIGINT") -> None:
        await self._send(_ws.json_frame({"type": "signal", "signal": name}))

    async def next_event(self, timeout: Optional[float] = None) -> _ws.PtyEvent:
        if self._pending:
            pending, self._pending = self._pending, b""
            await self._take(pending)
        while not self._events:
            if self.closed:
                return _ws.PtyEvent("closed")
            try:
                with anyio.fail_after(timeout):
                    data = await self._stream.receive(65536)
            except TimeoutError:
                raise RequestTimeoutError(f"pty {self.id}: nothing within {timeout} s",
                                          code="SDK::TIMEOUT")
            except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                self.closed = True
                return _ws.PtyEvent("closed")
            await self._take(data)
        ev = self._events.pop(0)
        if ev.kind == "output":
            self.output += ev.data
        elif ev.kind == "exit":
            self.exit_code = ev.exit_code
        elif ev.kind == "closed":
            self.closed = True
        return ev

    async def read_until(self, needle: Union[str, bytes], timeout: float = 30.0) -> bytes:
        want = needle.encode() if isinstance(needle, str) else needle
        try:
            with anyio.fail_after(timeout):
                while want not in self.output:
                    if (await self.next_event()).kind == "closed":
                        break
        except TimeoutError:
            pass
        if want not in self.output:
            raise RequestTimeoutError(f"pty {self.id}: no {want!r} in the output",
                                      code="SDK::TIMEOUT")
        return self.output

    async def wait(self, on_data: Optional[Callable[[bytes], Any]] = None,
                   timeout: Optional[float] = None) -> Optional[int]:
        while True:
            ev = await self.next_event(timeout)
            if ev.kind == "output" and on_data is not None:
                await call(on_data, ev.data)
            if ev.kind == "closed":
                return self.exit_code

    async def kill(self) -> bool:
        killed = await self._sb._t.run(p.op_pty_kill(self._sb._state, self.id))
        await self.close()
        return killed

    async def close(self) -> None:
        if not self.closed:
            try:
                await self._stream.send(_ws.close_frame())
            except Exception:
                pass
        self.closed = True
        await self._stream.aclose()

    async def __aenter__(self) -> "AsyncPtyHandle":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


@_docs_from(_sync.Pty)
class AsyncPty:
    """Interactive terminals in the sandbox; see :class:`cove.Pty`."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    async def create(self, cols: int = 80, rows: int = 24, cwd: Optional[str] = None,
                     command: Optional[str] = None, timeout: float = 30.0) -> AsyncPtyHandle:
        pty_id = await self._sb._t.run(p.op_pty_create(self._sb._state, cols, rows, cwd,
                                                       command))
        return await self.connect(pty_id, timeout=timeout)

    async def connect(self, pty_id: str, since: Optional[int] = None, takeover: bool = False,
                      timeout: float = 30.0) -> AsyncPtyHandle:
        base, headers = await self._sb._t.run(p.op_execd(self._sb._state))
        query = {k: v for k, v in (("since", since), ("takeover", 1 if takeover else None))
                 if v is not None}
        url = f"{base}/pty/{p.quote(pty_id)}/ws" + (
            "?" + urllib.parse.urlencode(query) if query else "")
        if self._sb._config.api_key:
            headers[p.API_KEY_HEADER] = self._sb._config.api_key
        t = _ws.target(url)
        request, key = _ws.handshake(t, headers)
        stream = None
        try:
            with anyio.fail_after(timeout):
                stream = await anyio.connect_tcp(t.host, t.port, tls=t.tls,
                                                 tls_hostname=t.host if t.tls else None)
                await stream.send(request)
                buf = b""
                while b"\r\n\r\n" not in buf:
                    buf += await stream.receive(65536)
                head, _, rest = buf.partition(b"\r\n\r\n")
                if not head.startswith(b"HTTP/1.1 101"):
                    need = _ws.content_length(head)
                    try:
                        while len(rest) < need:
                            rest += await stream.receive(65536)
                    except anyio.EndOfStream:
                        pass
            _ws.check_handshake(head, rest, key)
        except BaseException as e:
            if stream is not None:
                with anyio.CancelScope(shield=True):
                    await stream.aclose()  # a failed upgrade leaves nothing open
            if isinstance(e, (OSError, anyio.EndOfStream, TimeoutError)):
                raise ServerUnreachableError(f"pty {pty_id}: {e!r}",
                                             code="SDK::CONNECTION") from e
            raise
        return AsyncPtyHandle(self._sb, pty_id, stream, _ws.PtyProtocol(), rest)

    async def kill(self, pty_id: str) -> bool:
        return await self._sb._t.run(p.op_pty_kill(self._sb._state, pty_id))
