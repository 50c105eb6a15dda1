"""The asynchronous API: the same classes as :mod:`cove`, whose methods are awaited.

    from cove.aio import Sandbox

    async with await Sandbox.create(template="base") as sandbox:
        result = await sandbox.run_code("6 * 7")
        print(result.text)
"""

from .sandbox import (AsyncCommandHandle, AsyncCommands, AsyncFiles, AsyncPty,
                      AsyncPtyHandle, AsyncSandbox)

Sandbox = AsyncSandbox
Files = AsyncFiles
Commands = AsyncCommands
CommandHandle = AsyncCommandHandle
Pty = AsyncPty
PtyHandle = AsyncPtyHandle

__all__ = ["Sandbox", "Files", "Commands", "CommandHandle", "Pty", "PtyHandle", "AsyncSandbox",
           "AsyncFiles", "AsyncCommands", "AsyncCommandHandle", "AsyncPty", "AsyncPtyHandle"]
