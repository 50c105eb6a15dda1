"""Runs the protocol layer's steps with an httpx.AsyncClient (the async API)."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, AsyncIterator, Awaitable, Callable, Optional, Tuple

import anyio
import httpx

from .._config import ConnectionConfig
from .._protocol import EventStreamParser, Op, Request, Response, Sleep, T, UploadBody, raise_for
from .._transport import base_headers, kwargs_of, response_of, translated_errors, url_of


async def call(fn: Callable[[Any], Any], arg: Any) -> None:
    """Calls a callback, awaiting it when it is a coroutine function (or returns an
    awaitable)."""
    result = fn(arg)
    if inspect.isawaitable(result):
        await result


async def _body_chunks(body: UploadBody) -> AsyncIterator[bytes]:
    yield body.head
    src = body.source
    if src.data is not None:
        yield src.data
    elif inspect.iscoroutinefunction(getattr(src.file, "read", None)):
        while True:  # an async file object (anyio, aiofiles)
            chunk = await src.file.read(1 << 20)
            if not chunk:
                break
            yield chunk.encode("utf-8") if isinstance(chunk, str) else bytes(chunk)
    else:
        # a blocking file object: read in a worker thread, so the event loop goes on
        chunks = src.chunks()
        while True:
            chunk = await anyio.to_thread.run_sync(next, chunks, None)
            if chunk is None:
                break
            yield chunk
    yield body.tail


class AsyncTransport:
    """One httpx.AsyncClient and the loop that runs operations on it."""

    def __init__(self, config: ConnectionConfig,
                 client: Optional[httpx.AsyncClient] = None) -> None:
        self.config = config
        self.client = client or httpx.AsyncClient(headers=base_headers(config))

    async def close(self) -> None:
        await self.client.aclose()

    async def run(self, op: Op[T]) -> T:
        value: Any = None
        exc: Optional[BaseException] = None
        while True:
            try:
                step = op.throw(exc) if exc is not None else op.send(value)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            value, exc = None, None
            try:
                if isinstance(step, Request):
                    value = await self.request(step)
                elif isinstance(step, Sleep):
                    await anyio.sleep(step.seconds)
                else:
                    await call(step.fn, step.arg)
            except Exception as e:  # handed to the operation, which may expect it
                exc = e

    async def complete(self, awaitable: Awaitable[T]) -> Tuple[T, Optional[BaseException]]:
        """Awaits ``awaitable`` to its end even when the caller is cancelled meanwhile (an
        answer may name something to clean up, such as a sandbox just made). Returns its
        value and the cancellation that came meanwhile, or None: the caller cleans up, then
        raises it."""
        with anyio.CancelScope(shield=True):  # anyio's (and trio's) cancellation
            try:
                asyncio.get_running_loop()
            except RuntimeError:  # not asyncio (trio): the shield is enough
                return await awaitable, None
            # asyncio's own cancellation (Task.cancel, asyncio.wait_for): a task of its own
            task = asyncio.ensure_future(awaitable)
            cancelled: Optional[BaseException] = None
            while True:
                try:
                    return await asyncio.shield(task), cancelled
                except asyncio.CancelledError as e:
                    if task.cancelled():
                        raise
                    cancelled = e  # the caller's: the task goes on (or just ended)
                except BaseException:
                    if cancelled is not None:
                        raise cancelled
                    raise

    async def request(self, req: Request) -> Response:
        kw = kwargs_of(self.config, req)
        if req.body is not None:
            kw["content"] = _body_chunks(req.body)
        with translated_errors(req.what):
            async with self.client.stream(req.method, url_of(self.config, req), **kw) as r:
                if r.status_code not in req.ok or req.events is None:
                    resp = response_of(r, await r.aread())
                    raise_for(resp, req)
                    return resp
                parser = EventStreamParser()
                async for chunk in r.aiter_raw():
                    for event in parser.feed(chunk):
                        for cb in req.events.add(event):
                            await call(cb.fn, cb.arg)
                for event in parser.close():
                    for cb in req.events.add(event):
                        await call(cb.fn, cb.arg)
                return response_of(r, b"")

    async def iter_bytes(self, req: Request, chunk_size: int = 1 << 20) -> AsyncIterator[bytes]:
        """The body of a GET, streamed."""
        with translated_errors(req.what):
            async with self.client.stream(req.method, url_of(self.config, req),
                                          **kwargs_of(self.config, req)) as r:
                if r.status_code not in req.ok:
                    raise_for(response_of(r, await r.aread()), req)
                async for chunk in r.aiter_bytes(chunk_size):
                    yield chunk
