"""Fixtures of the SDK's tests: a real coved per test module (tests/covetest.py from the repo),
the package imported from the source tree, and an ``api`` fixture that runs a test against
the sync API and again against the async one."""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SDK = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(SDK))
sys.path.insert(0, SDK)
sys.path.insert(0, os.path.join(REPO, "tests"))

from covetest import serve  # noqa: E402
from sdkutil import Api, resolve  # noqa: E402


@pytest.fixture(scope="module")
def coved():
    """One daemon for the module, on its own state dir and port; removed afterwards with
    whatever sandboxes the tests left."""
    with serve() as d:
        yield d


@pytest.fixture(scope="module")
def conn(coved):
    """The connection arguments for coved."""
    return {"server": f"http://127.0.0.1:{coved.port}", "api_key": coved.key}


@pytest.fixture
def cove_env(coved, monkeypatch):
    """COVE_SERVER and COVE_API_KEY pointing at coved, as a user of the CLI has them."""
    monkeypatch.setenv("COVE_SERVER", f"http://127.0.0.1:{coved.port}")
    monkeypatch.setenv("COVE_API_KEY", coved.key)


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(params=["sync", "async"])
def api(request):
    return Api(request.param)


@pytest.fixture
async def sandbox(api, conn, coved):
    """A base sandbox of the API under test, killed at the test's end whatever happens."""
    sb = await resolve(api.Sandbox.create(template="base", **conn))
    try:
        yield sb
    finally:
        try:
            await resolve(sb.kill())
        finally:
            await resolve(sb.close())
