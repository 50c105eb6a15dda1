"""coved's daemon paths under valgrind memcheck: no invalid access, no leak."""

import os
import shutil

import pytest

from covetest import Coved, sandbox_leftovers

pytestmark = pytest.mark.skipif(
    shutil.which("valgrind") is None or os.environ.get("COVE_SANITIZED") == "1",
    reason="needs valgrind, and a build without sanitizers")


@pytest.mark.native_only(reason="valgrind 3.19 does not know open_tree (ENOSYS), which the gVisor set-up calls")
def test_daemon_paths_are_valgrind_clean(tmp_path):
    log = tmp_path / "valgrind.log"
    d = Coved(wrapper=["valgrind", "--tool=memcheck", "--leak-check=full",
                       "--show-leak-kinds=definite,indirect", "--errors-for-leak-kinds=definite,indirect",
                       "--error-exitcode=99", "--child-silent-after-fork=yes",
                       f"--log-file={log}"])
    try:
        d.start()
        sid = d.create(metadata={"k": "v"}, env={"A": "1"})
        assert d.sh(sid, "echo $A") == "1\n"
        d.ok("GET", "/v1/sandboxes?state=Running&metadata=k%3Dv")
        d.pause(sid)
        for (method, path, kw), expected in [
                (("POST", f"/v1/sandboxes/{sid}/pause", {}), 409),
                (("POST", "/v1/sandboxes", {"raw": b"{not json"}), 400),
                (("POST", "/v1/sandboxes", {"body": {"image": {"uri": "nope"},
                                                     "entrypoint": ["x"]}}), 400),
                (("GET", "/v1/sandboxes/unknown", {}), 404),
                (("GET", "/v1/sandboxes", {"headers": {}}), 401)]:
            status, body, _ = d.request(method, path, **kw)
            assert status == expected and set(body) == {"code", "message"}, (path, status, body)
        d.resume(sid)
        assert d.sh(sid, "echo again") == "again\n"
        d.delete(sid)
        assert sandbox_leftovers(d, sid) == []
    finally:
        d.cleanup()
    report = log.read_text()
    assert d.returncode == 0, report[-4000:]
    assert "ERROR SUMMARY: 0 errors" in report, report[-4000:]
