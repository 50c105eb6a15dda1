"""The audit trail (docs/api.md "Audit trail"): what coved records of each sandbox, who may
read it, how long it is kept, and that a sandbox can neither add to it nor hide from it."""

import http.client
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from covetest import AGENT_PORT, CLI, Coved, sandbox_init_pid, serve  # noqa: E402

KEY_A, KEY_B, ADMIN = "audit-key-a", "audit-key-b", "audit-admin"


@pytest.fixture(scope="module")
def coved():
    with serve(api_keys=(KEY_A, KEY_B), admin_keys=(ADMIN,)) as d:
        yield d


def iso(t):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def events(d, sid=None, key=None, query="", expect=(200,)):
    path = f"/v1/sandboxes/{sid}/events" if sid else "/v1/events"
    return d.ok("GET", path + (f"?{query}" if query else ""), headers=d.headers(key),
                expect=expect)


def kinds(items, prefix=""):
    return [e["kind"] for e in items if e["kind"].startswith(prefix)]


def wait_for(what, probe, seconds=30):
    deadline = time.time() + seconds
    while time.time() < deadline:
        got = probe()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"never: {what}")


def wait_state(d, sid, state):
    return wait_for(f"{sid} {state}", lambda: d.get(sid)["status"]["state"] == state)


def test_each_lifecycle_call_is_one_event_with_who_and_result(coved):
    d = coved
    d.key = KEY_A
    sid = d.create(metadata={"team": "a"}, timeout=600)
    d.pause(sid)
    wait_state(d, sid, "Paused")
    d.resume(sid)
    wait_state(d, sid, "Running")
    later = iso(time.time() + 3600)
    d.ok("POST", f"/v1/sandboxes/{sid}/renew-expiration", {"expiresAt": later})
    d.ok("PATCH", f"/v1/sandboxes/{sid}/metadata", {"stage": "two"})
    # A refused call is recorded too, with the error the caller got.
    status, _, _ = d.request("POST", f"/v1/sandboxes/{sid}/resume")
    assert status == 409
    d.delete(sid)
    items = events(d, sid)["items"]
    assert kinds(items) == ["sandbox.create", "sandbox.pause", "sandbox.resume",
                            "sandbox.renew", "sandbox.metadata", "sandbox.resume",
                            "sandbox.delete"], items
    ids = [e["id"] for e in items]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    owner = items[0]["owner"]
    assert len(owner) == 64 and KEY_A not in json.dumps(items)  # the key's id, never the key
    for e in items:
        assert e["sandboxId"] == sid and e["owner"] == owner and e["time"].endswith("Z")
        assert set(e) >= {"id", "time", "sandboxId", "owner", "kind", "by", "result"}
    create, pause, resume, renew, metadata, refused, delete = items
    assert create["result"] == "ok" and create["template"] == "base" and create["by"] == "api"
    assert pause["reason"] == "user_pause" and pause["state"] == "Paused"
    assert resume["reason"] == "user_resume" and resume["result"] == "ok"
    assert renew["expiresAt"] == later.replace("Z", ".000Z")
    assert metadata["metadata"] == {"team": "a", "stage": "two"}
    assert refused["result"] == "error" and refused["status"] == 409 and refused["code"]
    assert delete["reason"] == "user_delete" and delete["result"] == "ok"


def test_expiry_is_coveds_own_event(coved):
    d = coved
    d.key = KEY_A
    sid = d.create(timeout=600)
    soon = iso(time.time() + 2)
    d.ok("POST", f"/v1/sandboxes/{sid}/renew-expiration", {"expiresAt": soon})
    wait_for("expired", lambda: "sandbox.expire" in kinds(events(d, sid)["items"]))
    items = events(d, sid, query="kind=sandbox.expire")["items"]
    assert len(items) == 1 and items[0]["by"] == "coved" and items[0]["reason"] == "ttl_expiry"
    assert "sandbox.delete" not in kinds(events(d, sid)["items"])


@pytest.mark.not_under("gvisor", reason="the memory limit counts the sentry")
def test_oom_kill_is_an_event(coved):
    d = coved
    d.key = KEY_A
    sid = d.create(limits={"memory": "12Mi"})
    boundary = "auditoom"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"metadata\"; "
            f"filename=\"metadata\"\r\nContent-Type: application/json\r\n\r\n"
            f"{json.dumps({'path': '/dev/shm/big.bin'})}\r\n--{boundary}\r\n"
            f"Content-Disposition: form-data; name=\"file\"; filename=\"blob\"\r\n"
            f"Content-Type: application/octet-stream\r\n\r\n").encode() + \
        b"x" * (12 << 20) + f"\r\n--{boundary}--\r\n".encode()
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=60)
    try:
        conn.request("POST", f"/sandboxes/{sid}/proxy/{AGENT_PORT}/files/upload", body=body,
                     headers={"OPEN-SANDBOX-API-KEY": d.key,
                              "Content-Type": f"multipart/form-data; boundary={boundary}"})
        conn.getresponse().read()
    except OSError:
        pass  # the agent died under it
    conn.close()
    wait_state(d, sid, "Failed")
    oom = events(d, sid, query="kind=sandbox.oom")["items"]
    assert len(oom) == 1 and oom[0]["by"] == "coved" and oom[0]["reason"] == "oom", oom
    assert "OOM killer" in oom[0]["message"]
    assert "sandbox.exit" not in kinds(events(d, sid)["items"])
    d.delete(sid)


@pytest.mark.native_only("kills the sandbox's init from the host")
def test_the_death_of_its_init_is_an_event(coved):
    d = coved
    d.key = KEY_A
    sid = d.create()
    os.kill(sandbox_init_pid(sid), signal.SIGKILL)
    wait_for("exit", lambda: "sandbox.exit" in kinds(events(d, sid)["items"]))
    ex = events(d, sid, query="kind=sandbox.exit")["items"]
    assert len(ex) == 1 and ex[0]["by"] == "coved" and ex[0]["reason"] == "process_exited"
    d.delete(sid)


def test_a_key_never_sees_another_keys_events(coved):
    d = coved
    d.key = KEY_B
    theirs = d.create()
    d.key = KEY_A
    mine = d.create()
    try:
        status, err, _ = d.request("GET", f"/v1/sandboxes/{theirs}/events",
                                   headers=d.headers(KEY_A))
        assert status == 404 and set(err) == {"code", "message"}
        assert theirs not in {e["sandboxId"] for e in events(d, key=KEY_A, query="limit=1000")["items"]}
        assert mine in {e["sandboxId"] for e in events(d, key=KEY_A, query="limit=1000")["items"]}
        b = {e["sandboxId"] for e in events(d, key=KEY_B, query="limit=1000")["items"]}
        assert theirs in b and mine not in b
        everyone = {e["sandboxId"] for e in events(d, key=ADMIN, query="limit=1000")["items"]}
        assert {mine, theirs} <= everyone
        status, _, _ = d.request("GET", f"/v1/sandboxes/{theirs}/events?follow=true",
                                 headers=d.headers(KEY_A))
        assert status == 404
        # A's live stream of everything: B's delete never shows up in it.
        stream = Stream(d, "/v1/events", KEY_A)
        d.key = KEY_B
        d.delete(theirs)
        d.key = KEY_A
        d.delete(mine)
        got = stream.until(lambda e: e["sandboxId"] == mine and e["kind"] == "sandbox.delete")
        stream.close()
        assert theirs not in {e["sandboxId"] for e in got}
    finally:
        for key, sid in ((KEY_B, theirs), (KEY_A, mine)):
            d.request("DELETE", f"/v1/sandboxes/{sid}", headers=d.headers(key))


def test_events_of_a_deleted_sandbox_stay_readable_by_its_owner(coved):
    d = coved
    d.key = KEY_A
    sid = d.create()
    d.delete(sid)
    assert d.request("GET", f"/v1/sandboxes/{sid}")[0] == 404
    assert kinds(events(d, sid)["items"]) == ["sandbox.create", "sandbox.delete"]
    status, _, _ = d.request("GET", f"/v1/sandboxes/{sid}/events", headers=d.headers(KEY_B))
    assert status == 404
    assert d.request("GET", "/v1/sandboxes/nosuchsandbox/events")[0] == 404


def test_filters_and_cursor_paging(coved):
    d = coved
    d.key = KEY_A
    sid = d.create()
    for _ in range(3):
        d.pause(sid)
        wait_state(d, sid, "Paused")
        d.resume(sid)
        wait_state(d, sid, "Running")
    d.delete(sid)
    every = events(d, sid)["items"]
    assert len(every) == 8
    assert kinds(events(d, sid, query="kind=sandbox.pause")["items"]) == ["sandbox.pause"] * 3
    both = events(d, sid, query="kind=sandbox.pause,sandbox.create")["items"]
    assert kinds(both) == ["sandbox.create"] + ["sandbox.pause"] * 3
    again = events(d, sid, query="kind=sandbox.pause&kind=sandbox.create")["items"]
    assert again == both
    assert len(events(d, sid, query="kind=sandbox.")["items"]) == 8
    pages, cursor = [], None
    while True:
        page = events(d, sid, query="limit=3" + (f"&cursor={cursor}" if cursor else ""))
        pages.append(page["items"])
        cursor = page["nextCursor"]
        if cursor is None:
            break
    assert [len(p) for p in pages] == [3, 3, 2]
    assert sum(pages, []) == every
    after = events(d, sid, query=f"after={every[4]['id']}")["items"]
    assert after == every[5:]
    future = iso(time.time() + 3600)
    assert events(d, sid, query=f"since={future}")["items"] == []
    assert events(d, sid, query=f"until={future}")["items"] == every


@pytest.mark.parametrize("query", [
    "limit=0", "limit=1001", "limit=x", "since=yesterday", "until=2025-13-01T00:00:00Z",
    "kind=Sandbox", "kind=", "kind=a,,b", "after=-1", "cursor=abc", "format=xml",
    "follow=maybe", "nosuch=1", "limit=1&limit=2", "after=1&cursor=2",
    "since=2026-01-02T00:00:00Z&until=2026-01-01T00:00:00Z",
    "kind=a,b,c,d,e,f,g,h,i", "after=99999999999999999999", "cursor=99999999999999999999",
])
def test_bad_queries_are_400(coved, query):
    status, err, _ = coved.request("GET", f"/v1/events?{query}", headers=coved.headers(KEY_A))
    assert status == 400 and set(err) == {"code", "message"}, (query, err)


def test_bad_last_event_id_is_400(coved):
    h = coved.headers(KEY_A)
    h["Last-Event-ID"] = "nope"
    status, err, _ = coved.request("GET", "/v1/events?follow=true", headers=h)
    assert status == 400 and set(err) == {"code", "message"}


def test_jsonl_export(coved):
    d = coved
    d.key = KEY_A
    sid = d.create()
    d.delete(sid)
    want = events(d, sid)["items"]
    for query, headers in (("format=jsonl", {}), ("", {"Accept": "application/x-ndjson"})):
        h = d.headers(KEY_A)
        h.update(headers)
        conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=30)
        conn.request("GET", f"/v1/sandboxes/{sid}/events?{query}", headers=h)
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("Content-Type") == "application/x-ndjson"
        lines = resp.read().decode().splitlines()
        conn.close()
        assert [json.loads(l) for l in lines] == want


class Stream:
    """An SSE subscription read line by line: subscribed once its first comment came."""

    def __init__(self, d, path, key, last_event_id=None, accept=True):
        self.conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=30)
        h = d.headers(key)
        if accept:
            h["Accept"] = "text/event-stream"
        else:
            path += ("&" if "?" in path else "?") + "follow=true"
        if last_event_id is not None:
            h["Last-Event-ID"] = str(last_event_id)
        self.conn.request("GET", path, headers=h)
        self.resp = self.conn.getresponse()
        assert self.resp.status == 200, self.resp.read()
        assert self.resp.getheader("Content-Type") == "text/event-stream"
        assert self.resp.readline() == b": subscribed\n"
        assert self.resp.readline() == b"\n"

    def next(self):
        """The next event: (its id: line, its data)."""
        event_id, data = None, None
        while True:
            line = self.resp.readline().decode()
            assert line, "the stream ended"
            line = line.rstrip("\n")
            if line.startswith("id: "):
                event_id = int(line[4:])
            elif line.startswith("data: "):
                data = json.loads(line[6:])
            elif line == "" and data is not None:
                assert event_id == data["id"]
                return data

    def until(self, pred):
        got = []
        while True:
            e = self.next()
            got.append(e)
            if pred(e):
                return got

    def close(self):
        self.conn.close()


def test_the_stream_delivers_events_as_they_happen_and_resumes(coved):
    d = coved
    d.key = KEY_A
    stream = Stream(d, "/v1/events?kind=sandbox.", KEY_A, accept=False)
    sid = d.create()
    first = stream.next()
    assert first["kind"] == "sandbox.create" and first["sandboxId"] == sid
    d.pause(sid)
    paused = stream.next()
    assert paused["kind"] == "sandbox.pause" and paused["sandboxId"] == sid
    stream.close()
    d.resume(sid)
    d.delete(sid)
    # Resuming after the pause gets what came since, then goes on live.
    again = Stream(d, f"/v1/sandboxes/{sid}/events", KEY_A, last_event_id=paused["id"])
    assert [again.next()["kind"] for _ in range(2)] == ["sandbox.resume", "sandbox.delete"]
    again.close()


def test_a_sandbox_cannot_forge_or_erase_events(coved, tmp_path):
    d = coved
    d.key = KEY_A
    fake = json.dumps({"id": 1, "kind": "sandbox.delete", "sandboxId": "x", "owner": "y"})
    sid = d.create(entrypoint=("sh", "-c", f"echo '{fake}'; sleep infinity"))
    before = events(d, sid)["items"]
    d.sh(sid, f"echo '{fake}'; echo '{fake}' >&2")
    d.sh(sid, f"echo '{fake}' > /tmp/events.jsonl")
    # Its own view of coved's API: nothing answers it from inside, with or without a key.
    r = d.exec(sid, f"wget -q -O- http://127.0.0.1:{d.port}/v1/events 2>&1; echo rc=$?")
    assert "items" not in r.stdout and "rc=0" not in r.stdout, r.stdout
    for method in ("POST", "DELETE", "PUT", "PATCH"):
        status, _, _ = d.request(method, f"/v1/sandboxes/{sid}/events", {"kind": "fake"})
        assert status == 405
        status, _, _ = d.request(method, "/v1/events", {"kind": "fake"})
        assert status == 405
    after = events(d, sid)["items"]
    assert after[:len(before)] == before and kinds(before) == ["sandbox.create"]
    # What came since is coved's own record of the three commands it was asked to run (the
    # gateway's observer), a start and an end each: nothing of what they printed or wrote.
    added = after[len(before):]
    assert sorted(kinds(added)) == ["command.end"] * 3 + ["command.start"] * 3, added
    assert all(e["sandboxId"] == sid and e["owner"] == before[0]["owner"] for e in added)
    d.delete(sid)


def test_diagnostics_render_the_trail(coved):
    d = coved
    d.key = KEY_A
    sid = d.create()
    d.pause(sid)
    d.resume(sid)
    for what in ("events", "logs"):
        body = d.ok("GET", f"/v1/sandboxes/{sid}/diagnostics/{what}?scope=lifecycle")
        assert body["sandboxId"] == sid and body["kind"] == what and body["scope"] == "lifecycle"
        assert body["delivery"] == "inline" and body["truncated"] is False
        assert body["contentType"] == "text/plain; charset=utf-8"
        lines = body["content"].splitlines()
        assert [l.split(" ")[1] for l in lines] == ["sandbox.create", "sandbox.pause",
                                                    "sandbox.resume"], lines
    assert d.ok("GET", f"/sandboxes/{sid}/diagnostics/events?scope=all")["scope"] == "all"
    for query in ("", "?scope=nosuch", "?scope=all&scope=all", "?other=1"):
        status, err, _ = d.request("GET", f"/v1/sandboxes/{sid}/diagnostics/events{query}")
        assert status == 400 and set(err) == {"code", "message"}, query
    status, _, _ = d.request("GET", f"/v1/sandboxes/{sid}/diagnostics/events?scope=all",
                             headers=d.headers(KEY_B))
    assert status == 404
    d.delete(sid)


def test_the_per_sandbox_cap_drops_the_oldest():
    with serve("--audit-max-events", "3", api_keys=(KEY_A,)) as d:
        sid = d.create()
        for _ in range(2):
            d.pause(sid)
            d.resume(sid)
        items = events(d, sid)["items"]
        assert kinds(items) == ["sandbox.resume", "sandbox.pause", "sandbox.resume"], items
        d.delete(sid)
        assert kinds(events(d, sid)["items"]) == ["sandbox.pause", "sandbox.resume",
                                                  "sandbox.delete"]


def test_retention_drops_old_events():
    with serve("--audit-retention", "1", api_keys=(KEY_A,)) as d:
        sid = d.create()
        d.delete(sid)
        # Once its events are gone, nothing of the sandbox is left to answer for.
        wait_for("pruned", lambda: d.request("GET", f"/v1/sandboxes/{sid}/events")[0] == 404)
        db = sqlite3.connect(os.path.join(d.state_dir, "cove.db"))
        try:
            left = db.execute("SELECT COUNT(*) FROM audit_events WHERE sandbox_id = ?",
                              (sid,)).fetchone()[0]
        finally:
            db.close()
        assert left == 0


def test_audit_off_records_nothing():
    with serve("--no-audit", api_keys=(KEY_A,)) as d:
        sid = d.create()
        d.pause(sid)
        assert events(d, sid)["items"] == []
        d.delete(sid)


def test_events_survive_a_restart():
    d = Coved(api_keys=(KEY_A,)).start()
    try:
        sid = d.create()
        d.delete(sid)
        before = events(d, sid)["items"]
        assert kinds(before) == ["sandbox.create", "sandbox.delete"]
        d.kill()
        d.start()
        assert events(d, sid)["items"] == before
        other = d.create()
        d.delete(other)
        assert events(d, other)["items"][0]["id"] > before[-1]["id"]
    finally:
        d.cleanup()


SETTINGS_ENV = ("COVE_SERVER", "OPEN_SANDBOX_DOMAIN", "COVE_API_KEY", "OPEN_SANDBOX_API_KEY",
                "COVE_STATE_DIR", "COVE_CONFIG_FILE", "XDG_CONFIG_HOME")


def cli_env(d, key):
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS_ENV}
    env.update(COVE_SERVER=f"http://127.0.0.1:{d.port}", COVE_API_KEY=key,
               COVE_CONFIG_FILE=os.path.join(d.state_dir, "no-such-config.ini"))
    return env


def test_cli_events(coved):
    d = coved
    d.key = KEY_A
    sid = d.create()
    d.pause(sid)
    d.resume(sid)
    env = cli_env(d, KEY_A)
    r = subprocess.run([CLI, "events", sid, "--json"], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert [json.loads(l) for l in r.stdout.splitlines()] == events(d, sid)["items"]
    r = subprocess.run([CLI, "events", sid, "--kind", "sandbox.pause"], capture_output=True,
                       text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 1 and lines[0].split()[1:3] == ["sandbox.pause", sid], lines
    assert "reason=user_pause" in lines[0]
    # All of the key's: this sandbox's events among them, none of the other key's.
    r = subprocess.run([CLI, "events", "--json"], capture_output=True, text=True,
                       env=cli_env(d, KEY_B), timeout=60)
    assert r.returncode == 0 and sid not in r.stdout, r.stderr
    # --follow prints what there is, then each event as it happens.
    follow = subprocess.Popen([CLI, "events", sid, "--follow", "--json"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env)
    try:
        seen = [json.loads(follow.stdout.readline())["kind"] for _ in range(3)]
        assert seen == ["sandbox.create", "sandbox.pause", "sandbox.resume"]
        d.pause(sid)
        assert json.loads(follow.stdout.readline())["kind"] == "sandbox.pause"
    finally:
        follow.kill()
        follow.wait()
        follow.stdout.close()
        follow.stderr.close()
    r = subprocess.run([CLI, "events", "nosuchsandbox"], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode != 0 and "not found" in r.stderr
    d.delete(sid)


def test_e2b_lifecycle_calls_are_the_same_events(coved):
    d = coved
    d.key = KEY_A
    h = {"Content-Type": "application/json", "X-API-Key": KEY_A}
    status, sb, _ = d.request("POST", "/e2b/sandboxes", {"templateID": "base", "timeout": 600},
                              headers=h)
    assert status == 201, sb
    sid = sb["sandboxID"]
    status, _, _ = d.request("POST", f"/e2b/sandboxes/{sid}/timeout", {"timeout": 900}, headers=h)
    assert status == 204
    status, _, _ = d.request("POST", f"/e2b/sandboxes/{sid}/pause", headers=h)
    assert status == 204
    status, _, _ = d.request("DELETE", f"/e2b/sandboxes/{sid}", headers=h)
    assert status == 204
    items = events(d, sid)["items"]
    assert kinds(items) == ["sandbox.create", "sandbox.renew", "sandbox.pause",
                            "sandbox.delete"], items
    assert all(e["by"] == "api" and e["result"] == "ok" for e in items)


def test_auto_resume_is_coveds_own_event(coved):
    d = coved
    d.key = KEY_A
    sid = d.create(extensions={"autoResume": "true"})
    d.pause(sid)
    assert d.sh(sid, "echo awake").strip() == "awake"  # traffic wakes it
    resumes = events(d, sid, query="kind=sandbox.resume")["items"]
    assert len(resumes) == 1 and resumes[0]["by"] == "coved", resumes
    assert resumes[0]["reason"] == "auto_resume" and resumes[0]["result"] == "ok"
    d.delete(sid)


def test_live_streams_are_capped():
    # 32 a key (AUDIT_SUBSCRIBERS_PER_OWNER), so that one key cannot take every stream; 256 in
    # all (AUDIT_SUBSCRIBERS_MAX), 8 keys' worth.
    keys = [f"audit-stream-key-{i}" for i in range(9)]
    with serve(api_keys=keys) as d:
        streams = []
        try:
            for _ in range(32):
                streams.append(Stream(d, "/v1/events", keys[0]))
            h = d.headers(keys[0])
            h["Accept"] = "text/event-stream"
            status, err, _ = d.request("GET", "/v1/events", headers=h)
            assert status == 429 and err["code"] == "AUDIT::TOO_MANY_STREAMS", err
            for key in keys[1:8]:
                for _ in range(32):
                    streams.append(Stream(d, "/v1/events", key))
            h = d.headers(keys[8])
            h["Accept"] = "text/event-stream"
            status, err, _ = d.request("GET", "/v1/events", headers=h)
            assert status == 503 and err["code"] == "AUDIT::TOO_MANY_STREAMS", err
            streams.pop().close()
            # A slot freed by a client that went away is taken again.
            streams.append(wait_for("a slot again", lambda: try_stream(d, keys[8])))
        finally:
            for s in streams:
                s.close()


def try_stream(d, key=KEY_A):
    try:
        return Stream(d, "/v1/events", key)
    except AssertionError:
        return None


DNS_FLOOD = r"""
import socket, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(0.05)
for i in range(300):
    name = b"".join(bytes([len(p)]) + p for p in (b"flood%d" % i, b"example")) + b"\0"
    s.sendto(struct.pack(">HHHHHH", i, 0x0100, 1, 0, 0, 0) + name + b"\0\1\0\1",
             ("127.0.0.11", 53))
    try:
        s.recv(512)
    except OSError:
        pass
"""


def test_a_flood_of_egress_events_pushes_out_only_egress_events():
    # The cap counts each class on its own: a sandbox that makes thousands of DNS queries
    # cannot push its create, or the command it ran, out of its trail.
    with serve("--audit-max-events", "20", api_keys=(KEY_A,)) as d:
        sid = d.create()
        d.sh(sid, "echo the-command-to-hide")
        d.exec(sid, f"python3 -c '{DNS_FLOOD}'")

        def egress():
            items = events(d, sid, query="limit=1000")["items"]
            return items if len(kinds(items, "egress")) >= 20 else None
        items = wait_for("20 egress events", egress)
        assert len(kinds(items, "egress")) == 20, kinds(items)
        assert kinds(items, "sandbox.") == ["sandbox.create"]
        starts = [e for e in items if e["kind"] == "command.start"]
        assert any("the-command-to-hide" in e["command"] for e in starts), starts
        flood = [e for e in items if e["kind"] == "egress"]
        assert "flood299" in flood[-1]["name"], flood[-1]  # the newest kept, the oldest gone
        d.delete(sid)


def test_a_huge_command_line_is_clipped_in_its_event(coved):
    d = coved
    d.key = KEY_A
    sid = d.create()
    line = "true #" + "A" * 600_000
    status, _, _ = d.request("POST", f"/sandboxes/{sid}/proxy/{AGENT_PORT}/command",
                             {"command": line})
    assert status == 200
    start = wait_for("its start", lambda: events(d, sid, query="kind=command.start")["items"])
    assert start[0]["clipped"] is True and line.startswith(start[0]["command"])
    assert 4000 <= len(start[0]["command"]) <= 4096, len(start[0]["command"])
    d.delete(sid)
