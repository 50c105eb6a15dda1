import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from covetest import Coved, serve  # noqa: E402

# The shared daemons' admin key (coved.admin_key): registering templates needs one.
ADMIN_KEY = "test-admin-key"


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: waits on real timers (skipped in the sanitizer pass)")
    config.addinivalue_line("markers", "static_agent: runs the agent in a root without libc "
                            "(skipped in the sanitizer pass, whose agent is dynamic)")
    config.addinivalue_line("markers", "native_only(reason): about the native runtime itself "
                            "(skipped when COVE_TEST_RUNTIME names another)")
    config.addinivalue_line("markers", "not_under(*runtimes, reason): a known difference of "
                            "those runtimes (docs/security.md, \"Other runtimes\"): skipped "
                            "under them, saying why")
    config.addinivalue_line("markers", "serial(reason): runs alone, not beside other test "
                            "files under pytest-xdist (scripts/test.sh runs `-m 'not serial'` "
                            "with -n, then `-m serial` without): load tests and what asserts "
                            "about the whole host")


def pytest_collection_modifyitems(config, items):
    """COVE_TEST_RUNTIME=oci|gvisor runs the suite's daemons with that --default-runtime
    (covetest.py): what is about the native runtime alone is skipped, saying why."""
    runtime = os.environ.get("COVE_TEST_RUNTIME", "native")
    if runtime == "native":
        return
    for item in items:
        mark = item.get_closest_marker("native_only")
        if mark is not None:
            why = mark.kwargs.get("reason") or (mark.args[0] if mark.args else "native runtime")
            item.add_marker(pytest.mark.skip(reason=f"native only ({runtime} run): {why}"))
        for mark in item.iter_markers("not_under"):
            if runtime in mark.args:
                item.add_marker(pytest.mark.skip(
                    reason=f"known {runtime} difference: {mark.kwargs.get('reason', '')}"))


LOG_TAIL_LINES = 80


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report carries the end of its coved's log (with the agents' stderr):
    what CI prints is then enough to tell why a sandbox failed."""
    outcome = yield
    report = outcome.get_result()
    if report.passed or report.skipped:
        return
    for name in ("coved", "fresh_coved"):
        d = item.funcargs.get(name) if hasattr(item, "funcargs") else None
        if isinstance(d, Coved):
            tail = (d.final_log or d.log()).splitlines()[-LOG_TAIL_LINES:]
            report.sections.append((f"coved log ({name}, last {len(tail)} lines)",
                                    "\n".join(tail)))


@pytest.fixture(scope="module")
def coved():
    """A daemon shared by one test module; each test makes its own sandboxes."""
    with serve(admin_keys=(ADMIN_KEY,)) as d:
        yield d


@pytest.fixture
def fresh_coved():
    """A daemon of the test's own, for tests that restart or kill it."""
    with serve(start=False) as d:
        yield d


@pytest.fixture
def sandbox(coved):
    sid = coved.create()
    yield sid
    try:
        coved.delete(sid)
    except Exception:
        pass
