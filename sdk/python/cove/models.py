"""The values the SDK returns: sandbox and file information, command and code results."""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

__all__ = [
    "SandboxInfo", "Endpoint", "EntryInfo", "CommandResult", "ExecutionError", "Result",
    "Logs", "Execution", "Context", "SnapshotInfo",
]


def parse_time(value: Any) -> Optional[_dt.datetime]:
    """An RFC 3339 timestamp (``2026-12-01T13:44:29.321Z``, maybe with nanoseconds) as an
    aware datetime; None for None or what cannot be read."""
    if not isinstance(value, str) or not value:
        return None
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    main, sep, rest = text.partition(".")
    if sep:  # fromisoformat takes at most 6 fraction digits before Python 3.11
        digits = ""
        while rest and rest[0].isdigit():
            digits, rest = digits + rest[0], rest[1:]
        text = f"{main}.{(digits + '000000')[:6]}{rest}"
    try:
        parsed = _dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=_dt.timezone.utc)


def format_time(when: _dt.datetime) -> str:
    """An aware or UTC-naive datetime as RFC 3339 in UTC with milliseconds."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=_dt.timezone.utc)
    when = when.astimezone(_dt.timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


@dataclass
class SandboxInfo:
    """A sandbox as the lifecycle API describes it.

    Attributes:
        sandbox_id: the sandbox's id.
        template: the template (image) it was made from.
        state: ``Pending``, ``Running``, ``Paused``, ``Stopping``, ``Terminated``, ``Failed``...
        reason, message: why it is in that state.
        metadata: the key-value metadata given at creation (or patched since).
        created_at, expires_at: when it was made and when it expires (None: never).
        entrypoint: its main process.
        resources: its resource limits (``cpu``, ``memory``, ...).
        raw: the whole JSON object.
    """

    sandbox_id: str
    template: Optional[str]
    state: str
    reason: Optional[str]
    message: Optional[str]
    metadata: Dict[str, str]
    created_at: Optional[_dt.datetime]
    expires_at: Optional[_dt.datetime]
    entrypoint: List[str]
    resources: Dict[str, str]
    raw: Dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, obj: Dict[str, Any]) -> "SandboxInfo":
        status = obj.get("status") or {}
        return cls(sandbox_id=obj["id"], template=(obj.get("image") or {}).get("uri"),
                   state=status.get("state", ""), reason=status.get("reason"),
                   message=status.get("message"), metadata=dict(obj.get("metadata") or {}),
                   created_at=parse_time(obj.get("createdAt")),
                   expires_at=parse_time(obj.get("expiresAt")),
                   entrypoint=list(obj.get("entrypoint") or []),
                   resources=dict(obj.get("resourceLimits") or {}), raw=obj)


@dataclass
class SnapshotInfo:
    """A snapshot: a sandbox's filesystem captured as a read-only layer, which sandboxes can
    be made from (``Sandbox.create(snapshot=...)``).

    Attributes:
        snapshot_id: the snapshot's id.
        sandbox_id: the sandbox it was taken of (it may be gone since).
        name: the name it was given, or None.
        state: ``Creating``, ``Ready``, ``Failed`` or ``Deleting``.
        reason, message: why it is in that state (a failure's cause).
        created_at: when it was taken.
        raw: the whole JSON object.
    """

    snapshot_id: str
    sandbox_id: str
    name: Optional[str]
    state: str
    reason: Optional[str]
    message: Optional[str]
    created_at: Optional[_dt.datetime]
    raw: Dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, obj: Dict[str, Any]) -> "SnapshotInfo":
        status = obj.get("status") or {}
        return cls(snapshot_id=obj["id"], sandbox_id=obj.get("sandboxId", ""),
                   name=obj.get("name"), state=status.get("state", ""),
                   reason=status.get("reason"), message=status.get("message"),
                   created_at=parse_time(obj.get("createdAt")), raw=obj)


@dataclass
class Endpoint:
    """Where a port of a sandbox is reached from outside.

    Attributes:
        host: host, port and path without a scheme, as the API returns it
            (``127.0.0.1:8080/sandboxes/ID/proxy/3000``).
        url: the same with the server's scheme.
        headers: headers every request to it must carry.
    """

    host: str
    url: str
    headers: Dict[str, str]


@dataclass
class EntryInfo:
    """A file, directory or link in the sandbox.

    Attributes:
        path: its absolute path; name: its last component.
        type: ``file``, ``directory``, ``symlink`` or ``other``.
        size: its size in bytes; mode: its permission bits as an int (0o644 is 420).
        owner, group: its owner's and group's names.
        modified_at, created_at: its times.
    """

    path: str
    name: str
    type: str
    size: int
    mode: int
    owner: str
    group: str
    modified_at: Optional[_dt.datetime]
    created_at: Optional[_dt.datetime]

    @classmethod
    def from_json(cls, obj: Dict[str, Any]) -> "EntryInfo":
        path = obj.get("path", "")
        # execd reports the mode as the octal digits read as a decimal number (644).
        mode_digits = obj.get("mode", 0)
        try:
            mode = int(str(mode_digits), 8)
        except ValueError:
            mode = 0
        return cls(path=path, name=path.rstrip("/").rsplit("/", 1)[-1] or "/",
                   type=obj.get("type") or "file", size=int(obj.get("size") or 0), mode=mode,
                   owner=obj.get("owner", ""), group=obj.get("group", ""),
                   modified_at=parse_time(obj.get("modified_at")),
                   created_at=parse_time(obj.get("created_at")))


@dataclass
class CommandResult:
    """What a finished command produced.

    Attributes:
        stdout, stderr: its output (a background command's stdout and stderr come combined
            in ``stdout``: the server keeps them as one log).
        exit_code: its exit status; -1 when it was killed (by a signal or its timeout).
        error: None when it exited 0; otherwise what the server said (``exit status 3``,
            ``signal: killed; timed out after 500 ms``).
        command_id: the server's id of the command.
    """

    stdout: str
    stderr: str
    exit_code: int
    error: Optional[str] = None
    command_id: Optional[str] = None


@dataclass
class ExecutionError:
    """An error raised by the code: ``name`` (``ZeroDivisionError``), ``value``
    (``division by zero``) and the ``traceback`` lines."""

    name: str
    value: str
    traceback: List[str]

    @property
    def traceback_text(self) -> str:
        """The traceback as one string."""
        return "\n".join(self.traceback)


_FORMATS = {"text": "text", "text/plain": "text", "html": "text/html",
            "markdown": "text/markdown", "svg": "image/svg+xml", "png": "image/png",
            "jpeg": "image/jpeg", "pdf": "application/pdf", "latex": "text/latex",
            "json": "application/json", "javascript": "application/javascript"}


class Result:
    """One rich result of a run: the value of the last expression or something displayed.

    Each representation is None when the result does not have it: ``text`` (text/plain),
    ``html``, ``markdown``, ``svg``, ``png`` and ``jpeg`` (base64 strings, as Jupyter sends
    them), ``pdf``, ``latex``, ``json`` (decoded), ``javascript``. ``raw`` is the MIME bundle
    as received; ``is_main_result`` is true for the run's main result (its last one).
    """

    def __init__(self, bundle: Dict[str, Any], is_main_result: bool = False) -> None:
        self.raw: Dict[str, Any] = dict(bundle)
        self.is_main_result = is_main_result
        self.text: Optional[str] = bundle.get("text", bundle.get("text/plain"))
        self.html: Optional[str] = bundle.get("text/html")
        self.markdown: Optional[str] = bundle.get("text/markdown")
        self.svg: Optional[str] = bundle.get("image/svg+xml")
        self.png: Optional[str] = bundle.get("image/png")
        self.jpeg: Optional[str] = bundle.get("image/jpeg")
        self.pdf: Optional[str] = bundle.get("application/pdf")
        self.latex: Optional[str] = bundle.get("text/latex")
        self.json: Any = bundle.get("application/json")
        self.javascript: Optional[str] = bundle.get("application/javascript")

    def formats(self) -> List[str]:
        """The short names of the representations present (``["text", "png"]``)."""
        return [name for name in ("text", "html", "markdown", "svg", "png", "jpeg", "pdf",
                                  "latex", "json", "javascript") if _FORMATS[name] in self.raw
                or (name == "text" and "text/plain" in self.raw)]

    def __repr__(self) -> str:
        return f"Result(formats={self.formats()!r}, text={self.text!r})"


@dataclass
class Logs:
    """What a run printed, as the chunks arrived."""

    stdout: List[str] = field(default_factory=list)
    stderr: List[str] = field(default_factory=list)


@dataclass
class Execution:
    """The outcome of :meth:`Sandbox.run_code`.

    Attributes:
        results: every rich result, in order (displays and the last expression's value).
        logs: ``logs.stdout`` and ``logs.stderr``, lists of the printed chunks.
        error: the error the code raised, or None.
        execution_count: the kernel's cell number, when the run had a kernel.
        context_id: the context it ran in.
    """

    results: List[Result] = field(default_factory=list)
    logs: Logs = field(default_factory=Logs)
    error: Optional[ExecutionError] = None
    execution_count: Optional[int] = None
    context_id: Optional[str] = None

    @property
    def text(self) -> Optional[str]:
        """The main result's text: the text/plain of the value of the last expression (for
        ``6 * 7``, ``"42"``). When the run produced no result (code that only prints), what
        it printed on stdout, without the final newline; None when it did neither."""
        for r in reversed(self.results):
            if r.is_main_result:
                return r.text
        if self.results:
            return self.results[-1].text
        out = self.stdout
        if not out:
            return None
        return out[:-1] if out.endswith("\n") else out

    @property
    def stdout(self) -> str:
        """Everything printed on stdout, as one string."""
        return "".join(self.logs.stdout)

    @property
    def stderr(self) -> str:
        """Everything printed on stderr, as one string."""
        return "".join(self.logs.stderr)

    @property
    def exit_code(self) -> int:
        """0 when the code ran without error; otherwise the exit status of a shell run, or 1
        for an exception."""
        if self.error is None:
            return 0
        if self.error.name == "CommandExecError":
            try:
                code = int(self.error.value)
                return code if code != 0 else 1
            except ValueError:
                pass
        return 1


@dataclass
class Context:
    """A code context: a kernel (or bash shell) that keeps its state between runs."""

    id: str
    language: str

    @classmethod
    def from_json(cls, obj: Dict[str, Any]) -> "Context":
        return cls(id=obj["id"], language=obj.get("language", ""))
