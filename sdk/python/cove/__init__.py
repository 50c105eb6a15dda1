"""Cove's Python SDK.

``cove.Sandbox`` is the synchronous API, ``cove.aio.Sandbox`` the asynchronous one (the same
methods, awaited). Both talk to coved over HTTP (httpx): the OpenSandbox lifecycle API and,
through coved's gateway, the sandbox's execd API (commands, files, code interpreter, PTY).

    from cove import Sandbox

    with Sandbox.create(template="base") as sandbox:
        sandbox.files.write("/home/user/hello.py", "print(6 * 7)")
        print(sandbox.commands.run("python3 /home/user/hello.py").stdout)
"""

__version__ = "0.1.0"

from ._config import ConnectionConfig  # noqa: E402
from .errors import (AuthenticationError, ConflictError, CoveError,  # noqa: E402
                     InvalidRequestError, NotFoundError, PermissionDeniedError, RateLimitError,
                     RequestTimeoutError, SandboxStateError, ServerError,
                     ServerUnreachableError)
from .models import (CommandResult, Context, Endpoint, EntryInfo, Execution,  # noqa: E402
                     ExecutionError, Logs, Result, SandboxInfo, SnapshotInfo)
from .sandbox import (CommandHandle, Commands, Files, Pty, PtyHandle, Sandbox)  # noqa: E402

__all__ = [
    "Sandbox", "Files", "Commands", "CommandHandle", "Pty", "PtyHandle", "ConnectionConfig",
    "SandboxInfo", "SnapshotInfo", "Endpoint", "EntryInfo", "CommandResult", "Execution", "ExecutionError",
    "Result", "Logs", "Context", "CoveError", "InvalidRequestError", "AuthenticationError",
    "PermissionDeniedError", "NotFoundError", "ConflictError", "RateLimitError", "ServerError",
    "RequestTimeoutError", "ServerUnreachableError", "SandboxStateError", "__version__",
]
