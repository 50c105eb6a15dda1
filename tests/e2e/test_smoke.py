def test_create_exec_delete(coved):
    sid = coved.create()
    assert coved.get(sid)["status"]["state"] == "Running"
    r = coved.exec(sid, "echo hello; echo oops >&2; exit 3")
    assert r.stdout == "hello\n"
    assert r.stderr == "oops\n"
    assert r.exit_code == 3
    coved.delete(sid)
