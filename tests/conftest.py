import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from covetest import Coved, sanitizer_problems  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: waits on real timers (skipped in the sanitizer pass)")


@pytest.fixture(scope="module")
def coved():
    """A daemon shared by one test module; each test makes its own sandboxes."""
    d = Coved().start()
    try:
        yield d
    finally:
        d.cleanup()
    problems = sanitizer_problems(d)
    assert problems is None, problems


@pytest.fixture
def fresh_coved():
    """A daemon of the test's own, for tests that restart or kill it."""
    d = Coved()
    try:
        yield d
    finally:
        d.cleanup()
    problems = sanitizer_problems(d)
    assert problems is None, problems


@pytest.fixture
def sandbox(coved):
    sid = coved.create()
    yield sid
    try:
        coved.delete(sid)
    except Exception:
        pass
