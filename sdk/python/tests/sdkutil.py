"""Helpers of the SDK's tests (a module of its own name, so that it cannot be confused with
the repo's other test helpers when one pytest run collects both)."""

import inspect
import os

import cove
import cove.aio

HERE = os.path.dirname(os.path.abspath(__file__))
SDK = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(SDK))


async def resolve(value):
    """The value of a sync call, or of an async one once awaited: lets one test body drive
    both APIs."""
    if inspect.isawaitable(value):
        return await value
    return value


async def collect(stream):
    """Every chunk of a sync or async byte iterator."""
    if hasattr(stream, "__aiter__"):
        return [c async for c in stream]
    return list(stream)


class Api:
    """The API under test: ``Sandbox`` is cove.Sandbox or cove.aio.Sandbox."""

    def __init__(self, name):
        self.name = name
        self.is_async = name == "async"
        self.Sandbox = cove.aio.Sandbox if self.is_async else cove.Sandbox

    def __repr__(self):
        return self.name


