"""Fixtures of the security suite: hostile workloads run inside sandboxes, and the host is
checked afterwards. Every sandbox made through `make_sandbox` is deleted after its test, pass or
fail; the module's daemon (tests/conftest.py) removes whatever is left when the module ends."""

import os

import pytest

from covetest import ApiError
from hostile import Markers


@pytest.fixture
def make_sandbox(coved):
    """make_sandbox(limits=..., entrypoint=...) -> id; deleted when the test ends."""
    made = []

    def make(**kw):
        sid = coved.create(**kw)
        made.append(sid)
        return sid

    yield make
    for sid in made:
        try:
            coved.delete(sid)
        except (ApiError, OSError):
            pass


@pytest.fixture(scope="module")
def host_markers(coved):
    """Markers in the host's /root, /tmp, /work and the daemon's state dir."""
    dirs = ["/root", "/tmp", coved.state_dir]
    if os.path.isdir("/work"):
        dirs.append("/work")
    m = Markers(dirs)
    try:
        yield m
    finally:
        m.remove()
