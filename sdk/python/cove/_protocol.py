"""The protocol layer shared by :mod:`cove` (sync) and :mod:`cove.aio` (async).

Every operation is written once here, as a generator that yields *steps* (an HTTP
:class:`Request`, a :class:`Sleep`, a :class:`Callback` to invoke) and receives their
results; it returns the operation's value. The sync and async transports only run steps, so
the two APIs cannot drift: each public method is a one-line call of an operation below.
Parsing (event streams, WebSocket frames), request building and result folding are pure.
"""

from __future__ import annotations

import codecs
import datetime as _dt
import json
import math
import os
import secrets
import urllib.parse
from dataclasses import dataclass, field
from typing import (Any, Callable, Dict, Generator, Iterator, List, Optional, Sequence, Tuple,
                    TypeVar, Union)

from .errors import CoveError, NotFoundError, SandboxStateError, error_from_response
from .models import (CommandResult, Context, Endpoint, EntryInfo, Execution, ExecutionError,
                     Result, SandboxInfo, SnapshotInfo, format_time)

T = TypeVar("T")
API_KEY_HEADER = "OPEN-SANDBOX-API-KEY"
EXECD_PORT = 44772
CHUNK_SIZE = 1 << 20

DEFAULT_TEMPLATE = "base"
DEFAULT_TIMEOUT = 600  # ten minutes, as `cove create` and the OpenSandbox SDKs
# What the CLI asks for by default (OpenSandbox requires resourceLimits and an entrypoint).
DEFAULT_RESOURCES = {"cpu": "500m", "memory": "512Mi"}
DEFAULT_ENTRYPOINT = ["/bin/sh", "-c", "sleep infinity 2>/dev/null || while sleep 3600; do :; done"]


# ---- steps ----

@dataclass
class Request:
    """One HTTP request. ``url`` is absolute, or a path on the server. ``events`` makes it a
    streamed event request whose events go to that folder; ``ok`` are the statuses that are
    not errors; ``timeout`` None waits as long as it takes."""

    method: str
    url: str
    params: Any = None
    json: Any = None
    body: Optional["UploadBody"] = None
    headers: Dict[str, str] = field(default_factory=dict)
    ok: Tuple[int, ...] = (200,)
    events: Optional["Folder"] = None
    timeout: Union[float, None, str] = "default"
    what: str = "request"


@dataclass
class Response:
    status: int
    headers: Dict[str, str]
    content: bytes
    request_id: Optional[str] = None

    def json(self) -> Any:
        return json.loads(self.content) if self.content else None

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


@dataclass
class Sleep:
    seconds: float


@dataclass
class Callback:
    """Calls ``fn(arg)`` (awaiting it in the async API when it returns an awaitable)."""

    fn: Callable[[Any], Any]
    arg: Any


Step = Union[Request, Sleep, Callback]
Op = Generator[Step, Any, T]


def raise_for(resp: Response, req: Request) -> None:
    if resp.status not in req.ok:
        raise error_from_response(resp.status, resp.content, resp.request_id, req.what)


# ---- state of one sandbox handle ----

@dataclass
class SandboxState:
    """What a Sandbox object knows: its id, the server's scheme, and (once looked up) the
    execd endpoint and the sandbox's users."""

    sandbox_id: str
    scheme: str = "http"
    execd_url: Optional[str] = None
    execd_headers: Dict[str, str] = field(default_factory=dict)
    users: Optional[Dict[str, Tuple[int, int]]] = None


def quote(s: str) -> str:
    return urllib.parse.quote(s, safe="")


# ---- event streams ----

class EventStreamParser:
    """Splits an execd event stream into JSON events: SSE ``data:`` lines (a blank line ends
    an event) or bare JSON lines, as execd and the official SDKs do."""

    def __init__(self) -> None:
        self._rest = b""
        self._data: List[str] = []

    def _flush(self, out: List[Dict[str, Any]]) -> None:
        if self._data:
            text, self._data = "\n".join(self._data), []
            try:
                out.append(json.loads(text))
            except ValueError:
                pass

    def _line(self, raw: bytes, out: List[Dict[str, Any]]) -> None:
        line = raw.decode("utf-8", "replace").rstrip("\r")
        if not line.strip():
            self._flush(out)
        elif line.startswith(":") or line.startswith(("event:", "id:", "retry:")):
            return
        elif line.startswith("data:"):
            self._data.append(line[5:][1:] if line[5:6] == " " else line[5:])
        else:
            self._flush(out)
            try:
                out.append(json.loads(line))
            except ValueError:
                pass

    def feed(self, chunk: bytes) -> List[Dict[str, Any]]:
        out: List[Dict[str, Any]] = []
        lines = (self._rest + chunk).split(b"\n")
        self._rest = lines.pop()
        for raw in lines:
            self._line(raw, out)
        return out

    def close(self) -> List[Dict[str, Any]]:
        out: List[Dict[str, Any]] = []
        if self._rest:
            self._line(self._rest, out)
            self._rest = b""
        self._flush(out)
        return out


class Folder:
    """Folds a stream's events into a value; ``add`` returns the callbacks to call, in
    order."""

    def add(self, event: Dict[str, Any]) -> List[Callback]:
        raise NotImplementedError

    def finish(self) -> Any:
        raise NotImplementedError


def _line_text(text: str) -> str:
    # Command output comes a line per event, its ending stripped; an empty line as "\n".
    return "\n" if text == "\n" else text + "\n"


class CommandFolder(Folder):
    def __init__(self, on_stdout: Optional[Callable[[str], Any]] = None,
                 on_stderr: Optional[Callable[[str], Any]] = None) -> None:
        self.on_stdout, self.on_stderr = on_stdout, on_stderr
        self.command_id: Optional[str] = None
        self.stdout: List[str] = []
        self.stderr: List[str] = []
        self.exit_code: Optional[int] = None
        self.error: Optional[str] = None
        self.complete = False

    def add(self, event: Dict[str, Any]) -> List[Callback]:
        kind = event.get("type")
        if kind == "init" and self.command_id is None:
            self.command_id = event.get("text")
        elif kind in ("stdout", "stderr"):
            text = _line_text(str(event.get("text", "")))
            (self.stdout if kind == "stdout" else self.stderr).append(text)
            fn = self.on_stdout if kind == "stdout" else self.on_stderr
            return [Callback(fn, text)] if fn else []
        elif kind == "error":
            err = event.get("error") or {}
            value = str(err.get("evalue", ""))
            try:
                self.exit_code = int(value)
            except ValueError:
                self.exit_code = -1
            lines = [str(t) for t in err.get("traceback") or []]
            self.error = "; ".join(lines) or f"{err.get('ename', 'error')}: {value}"
        elif kind == "execution_complete":
            self.complete = True
            if self.exit_code is None:
                self.exit_code = 0
        return []

    def finish(self) -> "CommandFolder":
        return self

    def result(self) -> CommandResult:
        if self.exit_code is None:
            raise CoveError("the command's event stream ended before the command did",
                            code="SDK::STREAM_ENDED")
        return CommandResult(stdout="".join(self.stdout), stderr="".join(self.stderr),
                             exit_code=self.exit_code, error=self.error,
                             command_id=self.command_id)


class CodeFolder(Folder):
    def __init__(self, line_mode: bool, on_stdout: Optional[Callable[[str], Any]] = None,
                 on_stderr: Optional[Callable[[str], Any]] = None,
                 on_result: Optional[Callable[[Result], Any]] = None,
                 on_error: Optional[Callable[[ExecutionError], Any]] = None) -> None:
        self.line_mode = line_mode
        self.on_stdout, self.on_stderr = on_stdout, on_stderr
        self.on_result, self.on_error = on_result, on_error
        self.execution = Execution()

    def add(self, event: Dict[str, Any]) -> List[Callback]:
        ex, kind = self.execution, event.get("type")
        if kind == "init" and ex.context_id is None:
            ex.context_id = event.get("text")
        elif kind in ("stdout", "stderr"):
            text = str(event.get("text", ""))
            if self.line_mode:
                text = _line_text(text)
            (ex.logs.stdout if kind == "stdout" else ex.logs.stderr).append(text)
            fn = self.on_stdout if kind == "stdout" else self.on_stderr
            return [Callback(fn, text)] if fn else []
        elif kind == "result":
            result = Result(event.get("results") or {})
            ex.results.append(result)
            return [Callback(self.on_result, result)] if self.on_result else []
        elif kind == "error":
            err = event.get("error") or {}
            ex.error = ExecutionError(name=str(err.get("ename", "")),
                                      value=str(err.get("evalue", "")),
                                      traceback=[str(t) for t in err.get("traceback") or []])
            return [Callback(self.on_error, ex.error)] if self.on_error else []
        elif kind == "execution_count":
            ex.execution_count = event.get("execution_count")
        return []

    def finish(self) -> Execution:
        if self.execution.results:
            self.execution.results[-1].is_main_result = True
        return self.execution


# ---- uploads ----

class Source:
    """Content to upload: bytes, a str (sent as UTF-8) or a file object opened for reading
    (binary, or text, whose characters are sent as UTF-8); read in 1 MiB chunks."""

    def __init__(self, data: Any) -> None:
        self.data: Optional[bytes] = None
        self.file: Any = None
        self.length: Optional[int] = None
        if isinstance(data, str):
            self.data = data.encode("utf-8")
        elif isinstance(data, (bytes, bytearray, memoryview)):
            self.data = bytes(data)
        elif hasattr(data, "read"):
            self.file = data
            self.length = _remaining_size(data)
        else:
            raise TypeError("expected str, bytes or a readable file object, got "
                            f"{type(data).__name__}")
        if self.data is not None:
            self.length = len(self.data)

    def chunks(self) -> Iterator[bytes]:
        if self.data is not None:
            yield self.data
            return
        while True:
            chunk = self.file.read(CHUNK_SIZE)
            if not chunk:
                return
            yield chunk.encode("utf-8") if isinstance(chunk, str) else bytes(chunk)


def _remaining_size(f: Any) -> Optional[int]:
    """Bytes left in a regular binary file, or None when that cannot be known."""
    import io
    if isinstance(f, io.TextIOBase):
        return None
    try:
        st = os.fstat(f.fileno())
        import stat
        if not stat.S_ISREG(st.st_mode):
            return None
        return max(st.st_size - f.tell(), 0)
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        pass
    if isinstance(f, io.BytesIO):
        return len(f.getbuffer()) - f.tell()
    return None


@dataclass
class UploadBody:
    """A multipart/form-data body of a metadata part and a file part, as execd reads it."""

    boundary: str
    head: bytes
    source: Source
    tail: bytes

    @property
    def length(self) -> Optional[int]:
        if self.source.length is None:
            return None
        return len(self.head) + self.source.length + len(self.tail)

    @property
    def content_type(self) -> str:
        return f"multipart/form-data; boundary={self.boundary}"


def upload_body(path: str, source: Source, owner: Optional[str] = None,
                group: Optional[str] = None, mode: Optional[int] = None) -> UploadBody:
    boundary = "cove-" + secrets.token_hex(12)
    meta: Dict[str, Any] = {"path": path}
    if owner is not None:
        meta["owner"] = owner
    if group is not None:
        meta["group"] = group
    if mode is not None:
        meta["mode"] = int(oct(mode)[2:])  # execd takes the octal digits: 0o644 as 644
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"metadata\"; "
            f"filename=\"metadata\"\r\nContent-Type: application/json\r\n\r\n"
            f"{json.dumps(meta)}\r\n--{boundary}\r\nContent-Disposition: form-data; "
            f"name=\"file\"; filename=\"{quote(os.path.basename(path) or 'file')}\"\r\n"
            f"Content-Type: application/octet-stream\r\n\r\n").encode()
    return UploadBody(boundary, head, source, f"\r\n--{boundary}--\r\n".encode())


# ---- lifecycle operations ----

def _sandbox_path(sandbox_id: str, suffix: str = "") -> str:
    return f"/v1/sandboxes/{quote(sandbox_id)}{suffix}"


def create_body(template: str, timeout: Union[int, float, _dt.timedelta, None], envs: Optional[Dict[str, str]],
                metadata: Optional[Dict[str, str]], network: Optional[Dict[str, Any]],
                resources: Optional[Dict[str, str]], entrypoint: Optional[Sequence[str]],
                extra: Optional[Dict[str, Any]],
                snapshot: Union[str, SnapshotInfo, None] = None) -> Dict[str, Any]:
    """The create request; with ``snapshot``, from that snapshot (whose template it has)
    instead of ``template``."""
    if isinstance(timeout, _dt.timedelta):
        timeout = timeout.total_seconds()
    if timeout is not None and not isinstance(timeout, int):
        # coved takes whole seconds only: 1800.0 (timedelta.total_seconds()) is 1800
        timeout = math.ceil(timeout)
    body: Dict[str, Any] = {
        "image": {"uri": template},
        "entrypoint": list(entrypoint or DEFAULT_ENTRYPOINT),
        "resourceLimits": {**DEFAULT_RESOURCES, **(resources or {})},
        "timeout": timeout,
    }
    if snapshot is not None:
        del body["image"]
        body["snapshotId"] = snapshot.snapshot_id if isinstance(snapshot, SnapshotInfo) \
            else snapshot
    if envs:
        body["env"] = dict(envs)
    if metadata:
        body["metadata"] = dict(metadata)
    if network is not None:
        body["networkPolicy"] = network
    body.update(extra or {})
    return body


def op_wait_state(sandbox_id: str, want: Sequence[str], wait: float,
                  moving: Sequence[str] = ("Pending", "Pausing", "Resuming")) -> Op[SandboxInfo]:
    """Polls the sandbox until its state is one of ``want``."""
    waited, delay = 0.0, 0.02
    while True:
        info = yield from op_get_info(sandbox_id)
        if info.state in want:
            return info
        if info.state not in moving or waited >= wait:
            raise SandboxStateError(
                f"sandbox {sandbox_id} is {info.state} ({info.message or info.reason}), "
                f"not {' or '.join(want)}", code="SDK::UNEXPECTED_STATE")
        yield Sleep(delay)
        waited += delay
        delay = min(delay * 2, 0.5)


def op_create_request(body: Dict[str, Any]) -> Op[SandboxInfo]:
    """The create request alone: the sandbox as the server made it (maybe not yet Running)."""
    resp = yield Request("POST", "/v1/sandboxes", json=body, ok=(200, 201, 202),
                         what="create sandbox")
    return SandboxInfo.from_json(resp.json())


def op_create(body: Dict[str, Any], wait: float) -> Op[SandboxInfo]:
    created = yield from op_create_request(body)
    return (yield from op_create_wait(created, wait))


def op_create_wait(created: SandboxInfo, wait: float) -> Op[SandboxInfo]:
    """Waits until a sandbox just made runs; kills it when it does not."""
    if created.state == "Running":
        return created
    try:
        return (yield from op_wait_state(created.sandbox_id, ("Running",), wait))
    except BaseException:
        # Nobody holds a handle on it yet: do not leave it behind.
        try:
            yield from op_kill(created.sandbox_id)
        except CoveError:
            pass
        raise


def op_get_info(sandbox_id: str) -> Op[SandboxInfo]:
    resp = yield Request("GET", _sandbox_path(sandbox_id), what="get sandbox")
    return SandboxInfo.from_json(resp.json())


def op_list(states: Optional[Sequence[str]], metadata: Optional[Dict[str, str]],
            page_size: int = 100) -> Op[List[SandboxInfo]]:
    out: List[SandboxInfo] = []
    page = 1
    while True:
        params: List[Tuple[str, Any]] = [("page", page), ("pageSize", page_size)]
        params += [("state", s) for s in states or ()]
        if metadata:
            params.append(("metadata", urllib.parse.urlencode(metadata)))
        resp = yield Request("GET", "/v1/sandboxes", params=params, what="list sandboxes")
        body = resp.json() or {}
        out += [SandboxInfo.from_json(s) for s in body.get("items") or []]
        if not (body.get("pagination") or {}).get("hasNextPage"):
            return out
        page += 1


def op_snapshot_get(snapshot_id: str) -> Op[SnapshotInfo]:
    resp = yield Request("GET", f"/v1/snapshots/{quote(snapshot_id)}", what="get snapshot")
    return SnapshotInfo.from_json(resp.json())


def op_snapshot_create(sandbox_id: str, name: Optional[str], wait: float) -> Op[SnapshotInfo]:
    """Takes a snapshot and waits until it is Ready (raising if it Failed); wait 0 returns it
    Creating."""
    body: Dict[str, Any] = {} if name is None else {"name": name}
    resp = yield Request("POST", _sandbox_path(sandbox_id, "/snapshots"), json=body,
                         ok=(200, 201, 202), what="create snapshot")
    snap = SnapshotInfo.from_json(resp.json())
    waited, delay = 0.0, 0.02
    while snap.state == "Creating" and waited < wait:
        yield Sleep(delay)
        waited += delay
        delay = min(delay * 2, 0.5)
        snap = yield from op_snapshot_get(snap.snapshot_id)
    if snap.state not in ("Ready", "Creating") or (wait > 0 and snap.state != "Ready"):
        raise SandboxStateError(
            f"snapshot {snap.snapshot_id} of sandbox {sandbox_id} is {snap.state}"
            f"{': ' + snap.message if snap.message else ''}", code="SDK::SNAPSHOT_FAILED")
    return snap


def op_snapshot_list(sandbox_id: Optional[str], states: Optional[Sequence[str]],
                     name: Optional[str], page_size: int = 100) -> Op[List[SnapshotInfo]]:
    out: List[SnapshotInfo] = []
    page = 1
    while True:
        params: List[Tuple[str, Any]] = [("page", page), ("pageSize", page_size)]
        params += [("state", s) for s in states or ()]
        if sandbox_id is not None:
            params.append(("sandboxId", sandbox_id))
        if name is not None:
            params.append(("name", name))
        resp = yield Request("GET", "/v1/snapshots", params=params, what="list snapshots")
        body = resp.json() or {}
        out += [SnapshotInfo.from_json(s) for s in body.get("items") or []]
        if not (body.get("pagination") or {}).get("hasNextPage"):
            return out
        page += 1


def op_snapshot_delete(snapshot_id: str) -> Op[bool]:
    resp = yield Request("DELETE", f"/v1/snapshots/{quote(snapshot_id)}", ok=(204, 404),
                         what="delete snapshot")
    return resp.status != 404


def op_kill(sandbox_id: str) -> Op[bool]:
    resp = yield Request("DELETE", _sandbox_path(sandbox_id), ok=(200, 202, 204, 404),
                         what="kill sandbox")
    return resp.status != 404


def op_pause(sandbox_id: str, wait: float) -> Op[SandboxInfo]:
    yield Request("POST", _sandbox_path(sandbox_id, "/pause"), ok=(200, 202, 204),
                  what="pause sandbox")
    return (yield from op_wait_state(sandbox_id, ("Paused",), wait))


def op_resume(state: SandboxState, wait: float) -> Op[SandboxInfo]:
    yield Request("POST", _sandbox_path(state.sandbox_id, "/resume"), ok=(200, 202, 204),
                  what="resume sandbox")
    state.execd_url = None  # the endpoint may change across a pause
    return (yield from op_wait_state(state.sandbox_id, ("Running",), wait))


def op_connect(sandbox_id: str, wait: float) -> Op[SandboxInfo]:
    info = yield from op_get_info(sandbox_id)
    if info.state in ("Paused", "Pausing"):
        if info.state == "Pausing":
            info = yield from op_wait_state(sandbox_id, ("Paused",), wait)
        yield Request("POST", _sandbox_path(sandbox_id, "/resume"), ok=(200, 202, 204),
                      what="resume sandbox")
    if info.state != "Running":
        info = yield from op_wait_state(sandbox_id, ("Running",), wait)
    return info


def op_set_timeout(sandbox_id: str, seconds: float) -> Op[Optional[_dt.datetime]]:
    from .models import parse_time
    when = _dt.datetime.now(_dt.timezone.utc) + _dt.timedelta(seconds=seconds)
    resp = yield Request("POST", _sandbox_path(sandbox_id, "/renew-expiration"),
                         json={"expiresAt": format_time(when)}, what="renew expiration")
    return parse_time((resp.json() or {}).get("expiresAt"))


def op_endpoint(state: SandboxState, port: int) -> Op[Endpoint]:
    resp = yield Request("GET", _sandbox_path(state.sandbox_id, f"/endpoints/{int(port)}"),
                         what="get endpoint")
    body = resp.json() or {}
    host = str(body.get("endpoint", ""))
    url = host if "://" in host else f"{state.scheme}://{host}"
    return Endpoint(host=host.split("://", 1)[-1], url=url.rstrip("/"),
                    headers=dict(body.get("headers") or {}))


# ---- execd ----

def op_execd(state: SandboxState) -> Op[Tuple[str, Dict[str, str]]]:
    """The execd base URL and the headers it wants (looked up once per handle)."""
    if state.execd_url is None:
        ep = yield from op_endpoint(state, EXECD_PORT)
        state.execd_url, state.execd_headers = ep.url, ep.headers
    return state.execd_url, dict(state.execd_headers)


def execd_request(state: SandboxState, method: str, path: str, **kw: Any) -> Op[Request]:
    base, headers = yield from op_execd(state)
    headers.update(kw.pop("headers", {}))
    return Request(method, base + path, headers=headers, **kw)


def op_execd_call(state: SandboxState, method: str, path: str, **kw: Any) -> Op[Response]:
    req = yield from execd_request(state, method, path, **kw)
    return (yield req)


# ---- files ----

def op_file_info(state: SandboxState, path: str) -> Op[EntryInfo]:
    resp = yield from op_execd_call(state, "GET", "/files/info", params=[("path", path)],
                                    what="get file info")
    body = resp.json() or {}
    obj = body.get(path) or next(iter(body.values()), None)
    if obj is None:
        raise NotFoundError(f"no information about {path}", code="FILE_NOT_FOUND", status=404)
    return EntryInfo.from_json(obj)


def op_exists(state: SandboxState, path: str) -> Op[bool]:
    try:
        yield from op_file_info(state, path)
    except NotFoundError:
        return False
    return True


def op_write(state: SandboxState, path: str, data: Any, user: Optional[str] = None,
             group: Optional[str] = None, mode: Optional[int] = None) -> Op[EntryInfo]:
    body = upload_body(path, Source(data), owner=user, group=group, mode=mode)
    headers = {"Content-Type": body.content_type}
    if body.length is not None:
        headers["Content-Length"] = str(body.length)
    yield from op_execd_call(state, "POST", "/files/upload", body=body, headers=headers,
                             timeout=None, what="upload file")
    return (yield from op_file_info(state, path))


def op_read(state: SandboxState, path: str) -> Op[bytes]:
    resp = yield from op_execd_call(state, "GET", "/files/download", params=[("path", path)],
                                    timeout=None, what="download file")
    return resp.content


def op_download_request(state: SandboxState, path: str) -> Op[Request]:
    return (yield from execd_request(state, "GET", "/files/download", params=[("path", path)],
                                     timeout=None, what="download file"))


def op_list_dir(state: SandboxState, path: str, depth: int = 1) -> Op[List[EntryInfo]]:
    resp = yield from op_execd_call(state, "GET", "/directories/list",
                                    params=[("path", path), ("depth", depth)],
                                    what="list directory")
    return [EntryInfo.from_json(e) for e in resp.json() or []]


def op_remove(state: SandboxState, path: str) -> Op[None]:
    info = yield from op_file_info(state, path)
    where = "/directories" if info.type == "directory" else "/files"
    yield from op_execd_call(state, "DELETE", where, params=[("path", path)], what="remove")


def op_rename(state: SandboxState, old: str, new: str) -> Op[EntryInfo]:
    yield from op_execd_call(state, "POST", "/files/mv", json=[{"src": old, "dest": new}],
                             what="rename")
    return (yield from op_file_info(state, new))


def op_make_dir(state: SandboxState, path: str, mode: int = 0o755,
                user: Optional[str] = None, group: Optional[str] = None) -> Op[bool]:
    if (yield from op_exists(state, path)):
        return False
    perm: Dict[str, Any] = {"mode": int(oct(mode)[2:])}
    if user is not None:
        perm["owner"] = user
    if group is not None:
        perm["group"] = group
    yield from op_execd_call(state, "POST", "/directories", json={path: perm},
                             what="make directory")
    return True


# ---- commands ----

def op_user_ids(state: SandboxState, user: Union[str, int]) -> Op[Tuple[int, Optional[int]]]:
    """uid and gid of a user of the sandbox, by number or by name (from its /etc/passwd)."""
    if isinstance(user, int):
        return user, None
    if user.isdigit():
        return int(user), None
    if state.users is None:
        users: Dict[str, Tuple[int, int]] = {}
        text = (yield from op_read(state, "/etc/passwd")).decode("utf-8", "replace")
        for line in text.splitlines():
            f = line.split(":")
            if len(f) >= 4 and f[2].isdigit() and f[3].isdigit():
                users.setdefault(f[0], (int(f[2]), int(f[3])))
        state.users = users
    if user not in state.users:
        raise NotFoundError(f"no user {user!r} in the sandbox", code="SDK::NO_SUCH_USER")
    return state.users[user]


def op_run_command(state: SandboxState, cmd: str, cwd: Optional[str] = None,
                   envs: Optional[Dict[str, str]] = None, user: Union[str, int, None] = None,
                   timeout: Optional[float] = None, background: bool = False,
                   on_stdout: Optional[Callable[[str], Any]] = None,
                   on_stderr: Optional[Callable[[str], Any]] = None) -> Op[CommandFolder]:
    body: Dict[str, Any] = {"command": cmd, "background": bool(background)}
    if cwd is not None:
        body["cwd"] = cwd
    if envs:
        body["envs"] = dict(envs)
    if timeout is not None:
        body["timeout"] = int(timeout * 1000)
    if user is not None:
        body["uid"], gid = yield from op_user_ids(state, user)
        if gid is not None:
            body["gid"] = gid
    folder = CommandFolder(None if background else on_stdout,
                           None if background else on_stderr)
    yield from op_execd_call(state, "POST", "/command", json=body, events=folder,
                             headers={"Accept": "text/event-stream"}, timeout=None,
                             what="run command")
    if folder.command_id is None and background:
        raise CoveError("the server gave no id for the background command",
                        code="SDK::NO_COMMAND_ID")
    return folder


def op_command_status(state: SandboxState, command_id: str) -> Op[Dict[str, Any]]:
    resp = yield from op_execd_call(state, "GET", f"/command/status/{quote(command_id)}",
                                    what="command status")
    return resp.json() or {}


def op_command_logs_bytes(state: SandboxState, command_id: str,
                          cursor: Optional[int] = None) -> Op[Tuple[bytes, Optional[int]]]:
    """The output from byte ``cursor`` on, as bytes, and the cursor of its end."""
    params = [("cursor", cursor)] if cursor is not None else None
    resp = yield from op_execd_call(state, "GET", f"/command/{quote(command_id)}/logs",
                                    params=params, what="command logs")
    tail = resp.headers.get("execd-commands-tail-cursor")
    return resp.content, int(tail) if tail and tail.isdigit() else None


def op_command_logs(state: SandboxState, command_id: str,
                    cursor: Optional[int] = None) -> Op[Tuple[str, Optional[int]]]:
    raw, tail = yield from op_command_logs_bytes(state, command_id, cursor)
    return raw.decode("utf-8", "replace"), tail


def op_command_kill(state: SandboxState, command_id: str) -> Op[bool]:
    resp = yield from op_execd_call(state, "DELETE", "/command",
                                    params=[("id", command_id)], ok=(200, 204, 404),
                                    what="kill command")
    return resp.status != 404


def op_command_wait(state: SandboxState, command_id: str,
                    on_output: Optional[Callable[[str], Any]] = None,
                    timeout: Optional[float] = None, poll: float = 0.05) -> Op[CommandResult]:
    """Polls a background command until it ends, passing new output to ``on_output``."""
    cursor: Optional[int] = 0
    chunks: List[str] = []
    # a chunk may end inside a character: its first bytes wait for the rest
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    waited = 0.0
    while True:
        status = yield from op_command_status(state, command_id)
        raw, tail = yield from op_command_logs_bytes(state, command_id, cursor)
        running = status.get("running", False)
        text = decoder.decode(raw, final=not running)
        if text:
            chunks.append(text)
            if on_output is not None:
                yield Callback(on_output, text)
        cursor = tail if tail is not None else cursor
        if not running:
            exit_code = status.get("exit_code")
            return CommandResult(stdout="".join(chunks), stderr="",
                                 exit_code=-1 if exit_code is None else int(exit_code),
                                 error=status.get("error") or None, command_id=command_id)
        if timeout is not None and waited >= timeout:
            from .errors import RequestTimeoutError
            raise RequestTimeoutError(f"command {command_id} still runs after {timeout} s",
                                      code="SDK::TIMEOUT")
        yield Sleep(poll)
        waited += poll
        poll = min(poll * 1.5, 0.5)


# ---- code interpreter ----

def _context_ref(context: Union[Context, str, None]) -> Optional[str]:
    return context.id if isinstance(context, Context) else context


def op_run_code(state: SandboxState, code: str, language: Optional[str] = None,
                context: Union[Context, str, None] = None,
                on_stdout: Optional[Callable[[str], Any]] = None,
                on_stderr: Optional[Callable[[str], Any]] = None,
                on_result: Optional[Callable[[Result], Any]] = None,
                on_error: Optional[Callable[[ExecutionError], Any]] = None,
                timeout: Optional[float] = None) -> Op[Execution]:
    if context is not None and language is not None:
        raise ValueError("give a context or a language, not both")
    if isinstance(context, str):
        context = yield from op_get_context(state, context)
    if context is not None:
        body: Dict[str, Any] = {"code": code, "context": {"id": context.id,
                                                         "language": context.language}}
        lang = context.language
    else:
        lang = language or "python"
        body = {"code": code, "context": {"language": lang}}
    # Kernels send output chunks as printed; shells (bash) a line per event.
    folder = CodeFolder(lang.lower() == "bash", on_stdout, on_stderr, on_result, on_error)
    yield from op_execd_call(state, "POST", "/code", json=body, events=folder,
                             headers={"Accept": "text/event-stream"}, timeout=timeout,
                             what="run code")
    return folder.finish()


def op_create_context(state: SandboxState, language: str = "python") -> Op[Context]:
    resp = yield from op_execd_call(state, "POST", "/code/context", json={"language": language},
                                    timeout=None, what="create code context")
    return Context.from_json(resp.json())


def op_get_context(state: SandboxState, context_id: str) -> Op[Context]:
    resp = yield from op_execd_call(state, "GET", f"/code/contexts/{quote(context_id)}",
                                    what="get code context")
    return Context.from_json(resp.json())


def op_list_contexts(state: SandboxState, language: Optional[str] = None) -> Op[List[Context]]:
    params = [("language", language)] if language else None
    resp = yield from op_execd_call(state, "GET", "/code/contexts", params=params,
                                    what="list code contexts")
    return [Context.from_json(c) for c in resp.json() or []]


def op_delete_context(state: SandboxState, context: Union[Context, str]) -> Op[None]:
    yield from op_execd_call(state, "DELETE", f"/code/contexts/{quote(_context_ref(context))}",
                             what="delete code context")


def op_interrupt(state: SandboxState, context: Union[Context, str]) -> Op[None]:
    yield from op_execd_call(state, "DELETE", "/code", params=[("id", _context_ref(context))],
                             what="interrupt code")


# ---- PTY ----

def op_pty_create(state: SandboxState, cols: int, rows: int, cwd: Optional[str],
                  command: Optional[str]) -> Op[str]:
    body: Dict[str, Any] = {"cols": cols, "rows": rows}
    if cwd is not None:
        body["cwd"] = cwd
    if command is not None:
        body["command"] = command
    resp = yield from op_execd_call(state, "POST", "/pty", json=body, ok=(200, 201),
                                    what="create pty")
    return str(resp.json()["session_id"])


def op_pty_info(state: SandboxState, pty_id: str) -> Op[Dict[str, Any]]:
    resp = yield from op_execd_call(state, "GET", f"/pty/{quote(pty_id)}", what="pty info")
    return resp.json() or {}


def op_pty_kill(state: SandboxState, pty_id: str) -> Op[bool]:
    resp = yield from op_execd_call(state, "DELETE", f"/pty/{quote(pty_id)}", ok=(200, 204, 404),
                                    what="kill pty")
    return resp.status != 404
