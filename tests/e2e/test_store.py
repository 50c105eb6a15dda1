"""The store (STATE/cove.db): a database made by an older Cove is migrated with its sandboxes
and their processes kept; one made by a newer Cove is refused at start and left as it was;
what the API answered is kept when coved is killed right after."""

import os
import signal
import sqlite3
import subprocess
import time

from covetest import COVED, AGENT, Coved, sandbox_leftovers

ADMIN = "store-admin-key"
SCHEMA_VERSION = 20  # STORE_SCHEMA_VERSION in src/coved/store/store.h

# The SQL of src/coved/store/store.c at commit 4732dad (before quotas and per-sandbox id
# ranges, before schema versions): its schema, run on every open, and its save.
SCHEMA_4732DAD = (
    "PRAGMA journal_mode=WAL;"
    "PRAGMA synchronous=FULL;"
    "CREATE TABLE IF NOT EXISTS sandboxes ("
    " id TEXT PRIMARY KEY, owner TEXT NOT NULL, template TEXT NOT NULL,"
    " state TEXT NOT NULL, reason TEXT NOT NULL, message TEXT NOT NULL,"
    " transition_ms INTEGER NOT NULL, created_ms INTEGER NOT NULL, expires_ms INTEGER NOT NULL,"
    " entrypoint TEXT NOT NULL, env TEXT NOT NULL, metadata TEXT NOT NULL, limits TEXT NOT NULL,"
    " pid INTEGER NOT NULL, start_time INTEGER NOT NULL, run_dir TEXT NOT NULL,"
    " access_token TEXT NOT NULL DEFAULT '', renew_on_access_s INTEGER NOT NULL DEFAULT 0);")
SAVE_4732DAD = "INSERT OR REPLACE INTO sandboxes VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
COLUMNS_4732DAD = ("id, owner, template, state, reason, message, transition_ms, created_ms,"
                   " expires_ms, entrypoint, env, metadata, limits, pid, start_time, run_dir,"
                   " access_token, renew_on_access_s")


def db_path(d):
    return os.path.join(d.state_dir, "cove.db")


def query(path, sql):
    con = sqlite3.connect(path)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def remove_db(path):
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.unlink(path + suffix)


def admin(d, method, path, body=None):
    h = {"Content-Type": "application/json", "OPEN-SANDBOX-API-KEY": ADMIN}
    return d.request(method, f"/v1/admin/quotas{path}", body, headers=h)


def owner_of(d, sid):
    return query(db_path(d), f"SELECT owner FROM sandboxes WHERE id = '{sid}'")[0][0]


def test_a_database_made_at_4732dad_is_migrated(fresh_coved):
    """The sandbox an older coved stored runs on under this one, with its metadata, expiry and
    renew-on-access; the tables and columns added since work (quota overrides kept across a
    restart, new sandboxes get id ranges of their own)."""
    d = fresh_coved
    d.extra_args = ["--admin-api-key", ADMIN]
    d.start()
    sid = d.create(metadata={"team": "ml"}, timeout=3600,
                   extensions={"access.renew.extend.seconds": "600"})
    d.sh(sid, "echo kept > /tmp/marker")
    before = d.get(sid)
    d.kill(signal.SIGKILL)
    path = db_path(d)
    row = query(path, f"SELECT {COLUMNS_4732DAD} FROM sandboxes WHERE id = '{sid}'")[0]
    assert row[-1] == 600  # renew_on_access_s, to see it carried over
    # The database as coved at 4732dad would have left it, with this sandbox in it.
    remove_db(path)
    con = sqlite3.connect(path)
    con.executescript(SCHEMA_4732DAD)
    con.execute(SAVE_4732DAD, row)
    con.commit()
    con.close()
    assert query(path, "PRAGMA user_version") == [(0,)]
    assert query(path, "SELECT name FROM sqlite_schema WHERE name = 'quotas'") == []

    d.start()
    assert "migrated from schema version 0" in d.log()
    after = d.get(sid)
    assert after["status"]["state"] == "Running"
    for field in ("metadata", "expiresAt", "createdAt", "entrypoint"):
        assert after[field] == before[field], field
    assert d.sh(sid, "cat /tmp/marker") == "kept\n"
    assert query(path, "PRAGMA user_version") == [(SCHEMA_VERSION,)]
    assert query(path, f"SELECT id_slot, renew_on_access_s FROM sandboxes WHERE id = '{sid}'") \
        == [(-1, 600)]  # the shared id range it was made with
    status, body, _ = admin(d, "PUT", f"/{owner_of(d, sid)}", {"sandboxes": 3})
    assert status == 200, body
    other = d.create()
    assert d.sh(other, "echo ok") == "ok\n"
    assert query(path, f"SELECT id_slot FROM sandboxes WHERE id = '{other}'")[0][0] >= 0
    d.kill(signal.SIGTERM)

    d.start()
    assert d.log().count("migrated from schema version") == 1  # nothing left to do
    status, body, _ = admin(d, "GET", f"/{owner_of(d, sid)}")
    assert status == 200 and body["override"] == {"sandboxes": 3}, body
    for s in (sid, other):
        assert d.sh(s, "echo still") == "still\n"
        d.delete(s)
        assert sandbox_leftovers(d, s) == []
    assert d.health()


def test_a_database_from_a_newer_cove_is_refused_at_start(tmp_path):
    """coved says why and exits before listening; the database keeps its version and rows."""
    state = tmp_path / "state"
    state.mkdir()
    path = str(state / "cove.db")
    con = sqlite3.connect(path)
    con.executescript("CREATE TABLE sandboxes (id TEXT PRIMARY KEY, shape TEXT);"
                      "INSERT INTO sandboxes VALUES ('sbx-future', 'unknown');"
                      f"PRAGMA user_version = {SCHEMA_VERSION + 1};")
    con.close()
    r = subprocess.run([COVED, "--insecure", "--listen", "127.0.0.1:0", "--state-dir",
                        str(state), "--agent", AGENT],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, (r.returncode, r.stderr)  # coved's failure, no sanitizer report
    assert "ready on" not in r.stdout
    assert f"schema version {SCHEMA_VERSION + 1}, newer than this coved knows " \
           f"({SCHEMA_VERSION})" in r.stderr, r.stderr
    assert query(path, "PRAGMA user_version") == [(SCHEMA_VERSION + 1,)]
    assert query(path, "SELECT * FROM sandboxes") == [("sbx-future", "unknown")]
    assert query(path, "PRAGMA journal_mode") == [("delete",)]
    # The same coved starts on a database it knows.
    d = Coved()
    try:
        d.start()
        assert d.health()
    finally:
        d.cleanup()


def test_what_was_answered_survives_a_kill_right_after(fresh_coved):
    """Commits are not synced to the disk one by one (store.c), but they are in the kernel
    before the API answers: a SIGKILL of coved right after each answer loses none of them."""
    d = fresh_coved
    d.extra_args = ["--admin-api-key", ADMIN]
    d.start()
    meta, paused, gone = d.create(), d.create(), d.create()
    renewed = d.create(timeout=600)
    owner = owner_of(d, meta)
    d.ok("PATCH", f"/v1/sandboxes/{meta}/metadata", {"stage": "patched"})
    d.kill(signal.SIGKILL)
    d.start()
    assert d.get(meta)["metadata"] == {"stage": "patched"}

    expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 7200))
    d.ok("POST", f"/v1/sandboxes/{renewed}/renew-expiration", {"expiresAt": expires})
    d.kill(signal.SIGKILL)
    d.start()
    assert d.get(renewed)["expiresAt"].startswith(expires[:-1])

    d.pause(paused)
    d.kill(signal.SIGKILL)
    d.start()
    assert d.get(paused)["status"]["state"] == "Paused"

    d.delete(gone)
    d.kill(signal.SIGKILL)
    d.start()
    assert d.request("GET", f"/v1/sandboxes/{gone}")[0] == 404

    status, body, _ = admin(d, "PUT", f"/{owner}", {"sandboxes": 7})
    assert status == 200, body
    d.kill(signal.SIGKILL)
    d.start()
    assert admin(d, "GET", f"/{owner}")[1]["override"] == {"sandboxes": 7}

    d.resume(paused)
    for s in (meta, renewed, paused):
        assert d.sh(s, "echo ok") == "ok\n"
        d.delete(s)
        assert sandbox_leftovers(d, s) == []
    assert sandbox_leftovers(d, gone) == []
