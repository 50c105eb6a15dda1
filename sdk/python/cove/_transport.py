"""Runs the protocol layer's steps with a blocking httpx.Client (the sync API)."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Dict, Iterator, Optional

import httpx

from ._config import ConnectionConfig
from ._protocol import (API_KEY_HEADER, EventStreamParser, Op, Request, Response, Sleep,
                        T, UploadBody, raise_for)
from .errors import RequestTimeoutError, ServerUnreachableError


def base_headers(config: ConnectionConfig) -> Dict[str, str]:
    from . import __version__
    h = {"User-Agent": f"cove-python/{__version__}"}
    if config.api_key:
        h[API_KEY_HEADER] = config.api_key
    return h


def url_of(config: ConnectionConfig, req: Request) -> str:
    return req.url if "://" in req.url else config.server + req.url


def timeout_of(config: ConnectionConfig, req: Request) -> httpx.Timeout:
    if req.timeout == "default":
        return httpx.Timeout(config.request_timeout)
    if req.timeout is None:
        return httpx.Timeout(config.request_timeout, read=None, write=None, pool=None)
    return httpx.Timeout(float(req.timeout), connect=config.request_timeout)


def kwargs_of(config: ConnectionConfig, req: Request) -> Dict[str, Any]:
    kw: Dict[str, Any] = {"params": req.params, "headers": req.headers,
                          "timeout": timeout_of(config, req)}
    if req.json is not None:
        kw["json"] = req.json
    return kw


@contextlib.contextmanager
def translated_errors(what: str) -> Iterator[None]:
    """httpx's transport errors as the SDK's."""
    try:
        yield
    except httpx.TimeoutException as e:
        raise RequestTimeoutError(f"{what}: no answer in time ({e})", code="SDK::TIMEOUT") from e
    except httpx.TransportError as e:
        raise ServerUnreachableError(f"{what}: {e}", code="SDK::CONNECTION") from e


def response_of(r: httpx.Response, content: bytes) -> Response:
    return Response(r.status_code, {k.lower(): v for k, v in r.headers.items()}, content,
                    r.headers.get("x-request-id"))


def _body_chunks(body: UploadBody) -> Iterator[bytes]:
    yield body.head
    yield from body.source.chunks()
    yield body.tail


class SyncTransport:
    """One httpx.Client and the loop that runs operations on it."""

    def __init__(self, config: ConnectionConfig, client: Optional[httpx.Client] = None) -> None:
        self.config = config
        self.client = client or httpx.Client(headers=base_headers(config))

    def close(self) -> None:
        self.client.close()

    def run(self, op: Op[T]) -> T:
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
                    value = self.request(step)
                elif isinstance(step, Sleep):
                    time.sleep(step.seconds)
                else:
                    step.fn(step.arg)
            except Exception as e:  # handed to the operation, which may expect it
                exc = e

    def request(self, req: Request) -> Response:
        kw = kwargs_of(self.config, req)
        if req.body is not None:
            kw["content"] = _body_chunks(req.body)
        with translated_errors(req.what):
            with self.client.stream(req.method, url_of(self.config, req), **kw) as r:
                if r.status_code not in req.ok or req.events is None:
                    resp = response_of(r, r.read())
                    raise_for(resp, req)
                    return resp
                parser = EventStreamParser()
                for chunk in r.iter_raw():
                    for event in parser.feed(chunk):
                        for cb in req.events.add(event):
                            cb.fn(cb.arg)
                for event in parser.close():
                    for cb in req.events.add(event):
                        cb.fn(cb.arg)
                return response_of(r, b"")

    def iter_bytes(self, req: Request, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """The body of a GET, streamed (the request is sent at the first next())."""
        with translated_errors(req.what):
            with self.client.stream(req.method, url_of(self.config, req),
                                    **kwargs_of(self.config, req)) as r:
                if r.status_code not in req.ok:
                    raise_for(response_of(r, r.read()), req)
                yield from r.iter_bytes(chunk_size)


