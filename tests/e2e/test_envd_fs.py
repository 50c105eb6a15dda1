"""E2B envd's files through coved's proxy (/sandboxes/{id}/proxy/44772/...): the REST routes
GET /health and GET/POST /files as the e2b SDK calls them (multipart for envd < 0.5.7, an
octet-stream body for newer), paths relative to the user's home, envd's error shape
{"code": <status>, "message"}, hostile paths and bad bodies that change nothing, and a
100 MB round trip."""

import base64
import hashlib
import http.client
import json
import os
import secrets
import struct
import time
import urllib.parse

import pytest

import covetest
from covetest import AGENT_PORT, sandbox_host_pids


def agent_path(sid, path):
    return f"/sandboxes/{sid}/proxy/{AGENT_PORT}{path}"


def q(**params):
    return urllib.parse.urlencode({k: v for k, v in params.items() if v is not None},
                                  quote_via=urllib.parse.quote)


def call(coved, sid, method, path, raw=None, headers=None):
    h = coved.headers()
    h.pop("Content-Type")
    h.update(headers or {})
    return coved.request(method, agent_path(sid, path), raw=raw, headers=h)


def read(coved, sid, path, **params):
    """(status, bytes) of GET /files, as files.read."""
    conn = http.client.HTTPConnection("127.0.0.1", coved.port, timeout=120)
    h = coved.headers()
    h.pop("Content-Type")
    conn.request("GET", agent_path(sid, "/files?" + q(path=path, **params)), headers=h)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, data


def form(files, boundary=None):
    """multipart/form-data as the SDK's FormData: one part named "file" per (filename, data)."""
    boundary = boundary or "----formdata-" + secrets.token_hex(8)
    body = b"".join(
        f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
        f"filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n".encode()
        + data + b"\r\n" for name, data in files) + f"--{boundary}--\r\n".encode()
    return body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}


def write(coved, sid, files, path=None, username=None):
    body, headers = form(files)
    return call(coved, sid, "POST", "/files?" + q(path=path, username=username), raw=body,
                headers=headers)


def assert_envd_error(status, body, expected):
    assert status == expected, (status, body)
    assert isinstance(body, dict) and set(body) == {"code", "message"}, body
    assert body["code"] == expected and body["message"], body


def owner_mode(coved, sid, path):
    return coved.sh(sid, f"find '{path}' -maxdepth 0 -printf '%u %g %m'").split()


@pytest.fixture(scope="module")
def sid(coved):
    s = coved.create()
    yield s
    coved.delete(s)


@pytest.fixture(scope="module")
def host_markers():
    yield from covetest.host_markers("cove-envd-marker-")


# ---- REST ----

def test_health_is_204(coved, sid):
    status, body, _ = call(coved, sid, "GET", "/health")
    assert status == 204 and body is None


def test_write_then_read_as_the_sdk(coved, sid):
    status, body, _ = write(coved, sid, [("/tmp/e2b/a.txt", b"hello envd\n")],
                            path="/tmp/e2b/a.txt")
    assert status == 200, body
    assert body == [{"name": "a.txt", "type": "file", "path": "/tmp/e2b/a.txt"}]
    assert read(coved, sid, "/tmp/e2b/a.txt") == (200, b"hello envd\n")
    # the directory was made; the file is the default user's (root), 0644 as envd's
    assert owner_mode(coved, sid, "/tmp/e2b/a.txt") == ["root", "root", "644"]
    # overwritten, not appended; an empty file reads empty
    status, _, _ = write(coved, sid, [("x", b"")], path="/tmp/e2b/a.txt")
    assert status == 200 and read(coved, sid, "/tmp/e2b/a.txt") == (200, b"")


def test_write_files_takes_each_part_name(coved, sid):
    """writeFiles([...]) sends no path: each part's file name is its target."""
    status, body, _ = write(coved, sid, [("/tmp/e2b/many/one", b"1"), ("/tmp/e2b/many/two", b"2")])
    assert status == 200, body
    assert [e["path"] for e in body] == ["/tmp/e2b/many/one", "/tmp/e2b/many/two"]
    assert read(coved, sid, "/tmp/e2b/many/two") == (200, b"2")


def test_octet_stream_upload(coved, sid):
    """envd >= 0.5.7's form: the body is the file."""
    status, body, _ = call(coved, sid, "POST", "/files?" + q(path="/tmp/e2b/raw.bin"),
                           raw=b"\x00\x01raw", headers={"Content-Type": "application/octet-stream"})
    assert status == 200 and body == [{"name": "raw.bin", "type": "file",
                                       "path": "/tmp/e2b/raw.bin"}]
    assert read(coved, sid, "/tmp/e2b/raw.bin") == (200, b"\x00\x01raw")
    # without a path there is nowhere to put it
    status, body, _ = call(coved, sid, "POST", "/files", raw=b"x",
                           headers={"Content-Type": "application/octet-stream"})
    assert_envd_error(status, body, 400)


def test_relative_paths_are_under_the_users_home(coved, sid):
    status, body, _ = write(coved, sid, [("n", b"root's")], path="notes/r.txt")
    assert status == 200 and body[0]["path"] == "/root/notes/r.txt"
    assert read(coved, sid, "~/notes/r.txt") == (200, b"root's")
    status, body, _ = write(coved, sid, [("n", b"user's")], path="u.txt", username="user")
    assert status == 200 and body[0]["path"] == "/home/user/u.txt"
    assert owner_mode(coved, sid, "/home/user/u.txt")[:2] == ["user", "user"]
    assert read(coved, sid, "u.txt", username="user") == (200, b"user's")
    status, body = read(coved, sid, "u.txt", username="nobody-here")
    assert_envd_error(status, json.loads(body), 401)


def test_read_errors(coved, sid):
    status, body = read(coved, sid, "/tmp/e2b/missing")
    assert_envd_error(status, json.loads(body), 404)
    coved.sh(sid, "mkdir -p /tmp/e2b/dir")
    status, body = read(coved, sid, "/tmp/e2b/dir")
    assert_envd_error(status, json.loads(body), 400)
    status, body, _ = call(coved, sid, "GET", "/files")
    assert_envd_error(status, body, 400)
    # the OpenSandbox routes beside it still answer
    status, body, _ = call(coved, sid, "GET", "/files/info?" + q(path="/tmp/e2b/dir"))
    assert status == 200 and body["/tmp/e2b/dir"]["type"] == "directory"


def test_hostile_paths_stay_in_the_sandbox(coved, sid, host_markers):
    name, secret, _ = host_markers
    for path in [f"../../../../tmp/{name}", f"/../../root/{name}"]:
        status, got = read(coved, sid, path)
        assert status == 404 and secret.encode() not in got, (path, got)
    coved.sh(sid, "mkdir -p /tmp/evil && ln -sfn /proc/1/root /tmp/evil/root1")
    status, got = read(coved, sid, "/tmp/evil/root1/etc/hostname")
    assert_envd_error(status, json.loads(got), 400)
    status, body, _ = write(coved, sid, [("x", b"escaped")], path=f"/tmp/evil/root1/tmp/{name}")
    assert_envd_error(status, body, 400)
    # symlinks pointing out resolve inside the sandbox: its /tmp and /root, not the host's
    coved.sh(sid, f"ln -sfn / /tmp/evil/top && ln -sfn ../../../../../root /tmp/evil/up && "
                  f"printf sandbox > /root/{name}")
    for path in [f"/tmp/evil/top/tmp/{name}", f"/tmp/evil/up/{name}"]:
        status, got = read(coved, sid, path)
        assert secret.encode() not in got, path
    assert read(coved, sid, f"/tmp/evil/up/{name}") == (200, b"sandbox")
    status, body, _ = write(coved, sid, [("x", b"via link")], path=f"/tmp/evil/top/root/{name}")
    assert status == 200 and coved.sh(sid, f"cat /root/{name}") == "via link\n"
    # a write through ".." lands inside the sandbox
    status, body, _ = write(coved, sid, [("x", b"inside")], path=f"../../tmp/{name}")
    assert status == 200 and body[0]["path"] == f"/tmp/{name}"
    assert coved.sh(sid, f"cat /tmp/{name}") == "inside\n"


BAD_FORMS = [
    ("no boundary", {"Content-Type": "multipart/form-data"}, b"whatever"),
    ("not multipart", {"Content-Type": "text/plain"}, b"hello"),
    ("truncated", None, b"--B\r\nContent-Disposition: form-data; name=\"file\"; "
                        b"filename=\"f\"\r\n\r\npartial"),
    ("no file part", None, b"--B\r\nContent-Disposition: form-data; name=\"other\"\r\n\r\n"
                           b"x\r\n--B--\r\n"),
    ("gzip", {"Content-Type": "application/octet-stream", "Content-Encoding": "gzip"}, b"x"),
]


@pytest.mark.parametrize("what,headers,body", BAD_FORMS, ids=[b[0] for b in BAD_FORMS])
def test_bad_upload_changes_nothing(coved, sid, what, headers, body):
    target = "/tmp/e2b/bad-" + secrets.token_hex(4)
    h = headers or {"Content-Type": "multipart/form-data; boundary=B"}
    status, got, _ = call(coved, sid, "POST", "/files?" + q(path=target + "/f"), raw=body,
                          headers=h)
    assert_envd_error(status, got, 400)
    # No file; a form cut short has had its file's directory made already (the upload makes
    # the directories on the way when a file part begins, as the OpenSandbox upload does).
    assert coved.sh(sid, f"find {target} -type f 2>/dev/null; true") == ""


def test_100mb_round_trip(coved, sid):
    size = 100 << 20
    block = os.urandom(1 << 20)
    expected = hashlib.sha256(block * 100).hexdigest()
    for kind in ("multipart", "octet-stream"):
        boundary = "big-" + secrets.token_hex(8)
        if kind == "multipart":
            head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
                    f"filename=\"big\"\r\n\r\n").encode()
            tail = f"\r\n--{boundary}--\r\n".encode()
            ctype = f"multipart/form-data; boundary={boundary}"
        else:
            head, tail, ctype = b"", b"", "application/octet-stream"
        conn = http.client.HTTPConnection("127.0.0.1", coved.port, timeout=300)
        conn.putrequest("POST", agent_path(sid, "/files?" + q(path="big.bin")))
        conn.putheader("OPEN-SANDBOX-API-KEY", coved.key)
        conn.putheader("Content-Type", ctype)
        conn.putheader("Content-Length", str(len(head) + size + len(tail)))
        conn.endheaders()
        conn.send(head)
        for _ in range(100):
            conn.sock.sendall(block)
        conn.send(tail)
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        assert json.loads(resp.read())[0]["path"] == "/root/big.bin"
        conn.close()

        conn = http.client.HTTPConnection("127.0.0.1", coved.port, timeout=300)
        conn.request("GET", agent_path(sid, "/files?" + q(path="/root/big.bin")),
                     headers={"OPEN-SANDBOX-API-KEY": coved.key})
        resp = conn.getresponse()
        assert resp.status == 200 and int(resp.getheader("Content-Length")) == size
        got = hashlib.sha256()
        while chunk := resp.read(1 << 20):
            got.update(chunk)
        conn.close()
        assert got.hexdigest() == expected, kind
        coved.sh(sid, "rm /root/big.bin")


# ---- filesystem.Filesystem over Connect (JSON, as connect-web sends it) ----

def rpc(coved, sid, method, body, user=None, raw=None):
    """(status, parsed body) of a unary Connect call."""
    h = {"Content-Type": "application/json", "Connect-Protocol-Version": "1"}
    if user is not None:
        h["Authorization"] = "Basic " + base64.b64encode(f"{user}:".encode()).decode()
    status, got, _ = call(coved, sid, "POST", f"/filesystem.Filesystem/{method}",
                          raw=raw if raw is not None else json.dumps(body), headers=h)
    return status, got


def assert_connect_error(status, body, http_status, code):
    assert status == http_status, (status, body)
    assert body["code"] == code and body.get("message"), body


def envelope(message, flags=0):
    data = json.dumps(message).encode()
    return struct.pack(">BI", flags, len(data)) + data


class Stream:
    """A server stream (application/connect+json) read envelope by envelope."""

    def __init__(self, coved, sid, method, body):
        self.conn = http.client.HTTPConnection("127.0.0.1", coved.port, timeout=30)
        self.conn.request("POST", agent_path(sid, f"/filesystem.Filesystem/{method}"),
                          body=envelope(body),
                          headers={"OPEN-SANDBOX-API-KEY": coved.key,
                                   "Content-Type": "application/connect+json",
                                   "Connect-Protocol-Version": "1",
                                   "Connect-Timeout-Ms": "60000"})
        self.resp = self.conn.getresponse()
        assert self.resp.status == 200, self.resp.read()
        assert self.resp.getheader("Content-Type") == "application/connect+json"

    def next(self):
        """(flags, message) of the next envelope."""
        head = self.resp.read(5)
        assert len(head) == 5, head
        flags, length = struct.unpack(">BI", head)
        return flags, json.loads(self.resp.read(length))

    def next_event(self):
        """The next message that is not a keepalive; the end-stream fails the test."""
        while True:
            flags, msg = self.next()
            assert flags == 0, msg
            if "keepalive" not in msg:
                return msg

    def close(self):
        self.conn.close()


def test_stat_of_file_directory_symlink_and_missing(coved, sid):
    coved.sh(sid, "mkdir -p /tmp/fs/d && printf 12345 > /tmp/fs/f && chmod 640 /tmp/fs/f && "
                  "ln -sfn /tmp/fs/f /tmp/fs/l")
    status, body = rpc(coved, sid, "Stat", {"path": "/tmp/fs/f"})
    assert status == 200, body
    e = body["entry"]
    assert (e["name"], e["type"], e["path"], e["size"], e["mode"], e["permissions"],
            e["owner"], e["group"]) == ("f", "FILE_TYPE_FILE", "/tmp/fs/f", "5", 0o640,
                                        "-rw-r-----", "root", "root")
    assert e["modifiedTime"].endswith("Z")
    status, body = rpc(coved, sid, "Stat", {"path": "/tmp/fs/d"})
    assert status == 200 and body["entry"]["type"] == "FILE_TYPE_DIRECTORY"
    assert body["entry"]["permissions"].startswith("d")
    status, body = rpc(coved, sid, "Stat", {"path": "/tmp/fs/l"})
    assert status == 200 and body["entry"]["type"] == "FILE_TYPE_SYMLINK"
    assert body["entry"]["symlinkTarget"] == "/tmp/fs/f"
    status, body = rpc(coved, sid, "Stat", {"path": "/tmp/fs/missing"})
    assert_connect_error(status, body, 404, "not_found")
    # relative: under the Authorization header's user's home
    coved.sh(sid, "printf x > /home/user/mine")
    status, body = rpc(coved, sid, "Stat", {"path": "mine"}, user="user")
    assert status == 200 and body["entry"]["path"] == "/home/user/mine"
    status, body = rpc(coved, sid, "Stat", {"path": "mine"}, user="no-such-user")
    assert_connect_error(status, body, 401, "unauthenticated")


def test_make_dir_move_remove(coved, sid):
    status, body = rpc(coved, sid, "MakeDir", {"path": "/tmp/fs2/a/b"})
    assert status == 200 and body["entry"]["type"] == "FILE_TYPE_DIRECTORY", body
    assert body["entry"]["path"] == "/tmp/fs2/a/b"
    status, body = rpc(coved, sid, "MakeDir", {"path": "/tmp/fs2/a/b"})
    assert_connect_error(status, body, 409, "already_exists")
    coved.sh(sid, "printf data > /tmp/fs2/file")
    status, body = rpc(coved, sid, "MakeDir", {"path": "/tmp/fs2/file"})
    assert_connect_error(status, body, 400, "invalid_argument")
    # made as the user, under its home
    status, body = rpc(coved, sid, "MakeDir", {"path": "newdir"}, user="user")
    assert status == 200 and body["entry"]["path"] == "/home/user/newdir"
    assert owner_mode(coved, sid, "/home/user/newdir")[:2] == ["user", "user"]

    status, body = rpc(coved, sid, "Move", {"source": "/tmp/fs2/file",
                                            "destination": "/tmp/fs2/a/moved"})
    assert status == 200 and body["entry"]["path"] == "/tmp/fs2/a/moved", body
    assert coved.sh(sid, "cat /tmp/fs2/a/moved; ls /tmp/fs2") == "dataa\n"
    status, body = rpc(coved, sid, "Move", {"source": "/tmp/fs2/missing",
                                            "destination": "/tmp/fs2/x"})
    assert_connect_error(status, body, 404, "not_found")

    status, body = rpc(coved, sid, "Remove", {"path": "/tmp/fs2/a"})
    assert status == 200 and body == {}
    assert coved.sh(sid, "ls -A /tmp/fs2") == ""
    status, body = rpc(coved, sid, "Remove", {"path": "/"})
    assert_connect_error(status, body, 400, "invalid_argument")


def test_list_dir_depths(coved, sid):
    coved.sh(sid, "mkdir -p /tmp/ls/b/deep/deeper && touch /tmp/ls/a /tmp/ls/b/c "
                  "/tmp/ls/b/deep/d && ln -sfn /tmp/ls/b /tmp/ls/link")
    status, body = rpc(coved, sid, "ListDir", {"path": "/tmp/ls", "depth": 1})
    assert status == 200, body
    assert [(e["path"], e["type"]) for e in body["entries"]] == [
        ("/tmp/ls/a", "FILE_TYPE_FILE"), ("/tmp/ls/b", "FILE_TYPE_DIRECTORY"),
        ("/tmp/ls/link", "FILE_TYPE_SYMLINK")]
    status, body = rpc(coved, sid, "ListDir", {"path": "/tmp/ls", "depth": 2})
    assert [e["path"] for e in body["entries"]] == [
        "/tmp/ls/a", "/tmp/ls/b", "/tmp/ls/b/c", "/tmp/ls/b/deep", "/tmp/ls/link"]
    status, body = rpc(coved, sid, "ListDir", {"path": "/tmp/ls/missing"})
    assert_connect_error(status, body, 404, "not_found")
    status, body = rpc(coved, sid, "ListDir", {"path": "/tmp/ls/a"})
    assert_connect_error(status, body, 400, "invalid_argument")


def test_bad_connect_input_changes_nothing(coved, sid):
    for raw in [b"{", b"[]", b'{"path": 7}']:
        status, body = rpc(coved, sid, "MakeDir", None, raw=raw)
        assert_connect_error(status, body, 400, "invalid_argument")
    status, body = rpc(coved, sid, "MakeDir", {"path": ""})
    assert_connect_error(status, body, 400, "invalid_argument")
    status, body = rpc(coved, sid, "NoSuchMethod", {})
    assert_connect_error(status, body, 404, "unimplemented")
    for auth in ["Bearer x", "Basic !!!!", "Basic " + base64.b64encode(b"no-colon").decode(),
                 "Basic " + base64.b64encode(b"nul\0user:").decode()]:
        status, body, _ = call(coved, sid, "POST", "/filesystem.Filesystem/MakeDir",
                               raw=json.dumps({"path": "/tmp/auth-made"}),
                               headers={"Content-Type": "application/json",
                                        "Connect-Protocol-Version": "1", "Authorization": auth})
        assert_connect_error(status, body, 401, "unauthenticated")
    assert coved.sh(sid, "ls -d /tmp/auth-made 2>/dev/null; true") == ""
    status, body = rpc(coved, sid, "GetWatcherEvents", {"watcherId": "nope"})
    assert_connect_error(status, body, 404, "not_found")
    # through a /proc magic link: refused, and nothing made on the host
    coved.sh(sid, "mkdir -p /tmp/evil2 && ln -sfn /proc/1/root /tmp/evil2/root1")
    marker = "cove-envd-mkdir-" + secrets.token_hex(6)
    status, body = rpc(coved, sid, "MakeDir", {"path": f"/tmp/evil2/root1/tmp/{marker}"})
    assert_connect_error(status, body, 400, "invalid_argument")
    assert not os.path.exists(f"/tmp/{marker}")


def test_watch_dir_streams_create_and_write(coved, sid):
    coved.sh(sid, "mkdir -p /tmp/w")
    s = Stream(coved, sid, "WatchDir", {"path": "/tmp/w"})
    try:
        assert s.next_event() == {"start": {}}
        coved.sh(sid, "printf hi > /tmp/w/new.txt")
        got = [s.next_event()["filesystem"], s.next_event()["filesystem"]]
        assert got == [{"name": "new.txt", "type": "EVENT_TYPE_CREATE"},
                       {"name": "new.txt", "type": "EVENT_TYPE_WRITE"}]
    finally:
        s.close()
    # with includeEntry, each event carries the entry as Stat gives it (while it is there)
    s = Stream(coved, sid, "WatchDir", {"path": "/tmp/w", "includeEntry": True,
                                        "recursive": True})
    try:
        assert s.next_event() == {"start": {}}
        coved.sh(sid, "mkdir /tmp/w/sub")
        created = s.next_event()["filesystem"]
        coved.sh(sid, "rmdir /tmp/w/sub")
        removed = s.next_event()["filesystem"]
        assert created["type"] == "EVENT_TYPE_CREATE" and created["name"] == "sub"
        assert created["entry"]["path"] == "/tmp/w/sub"
        assert created["entry"]["type"] == "FILE_TYPE_DIRECTORY"
        assert removed == {"name": "sub", "type": "EVENT_TYPE_REMOVE"}
    finally:
        s.close()
    # the watched directory going away ends the stream, without an error
    coved.sh(sid, "mkdir -p /tmp/w/doomed")
    s = Stream(coved, sid, "WatchDir", {"path": "/tmp/w/doomed"})
    try:
        assert s.next_event() == {"start": {}}
        coved.sh(sid, "rmdir /tmp/w/doomed")
        flags, msg = s.next()
        while flags == 0 and "keepalive" in msg:
            flags, msg = s.next()
        assert flags == 2 and "error" not in msg, msg
    finally:
        s.close()
    # a watch of what is not there ends the stream with not_found
    s = Stream(coved, sid, "WatchDir", {"path": "/tmp/w/missing"})
    try:
        flags, msg = s.next()
        assert flags == 2 and msg["error"]["code"] == "not_found", msg
    finally:
        s.close()


def test_polling_watcher(coved, sid):
    coved.sh(sid, "mkdir -p /tmp/pw/sub")
    status, body = rpc(coved, sid, "CreateWatcher", {"path": "/tmp/pw", "recursive": True})
    assert status == 200, body
    wid = body["watcherId"]
    coved.sh(sid, "printf x > /tmp/pw/sub/x && chmod 600 /tmp/pw/sub/x && "
                  "mv /tmp/pw/sub/x /tmp/pw/y && rm /tmp/pw/y")
    status, body = rpc(coved, sid, "GetWatcherEvents", {"watcherId": wid})
    assert status == 200
    assert [(e["name"], e["type"]) for e in body["events"]] == [
        ("sub/x", "EVENT_TYPE_CREATE"), ("sub/x", "EVENT_TYPE_WRITE"),
        ("sub/x", "EVENT_TYPE_CHMOD"), ("sub/x", "EVENT_TYPE_RENAME"),
        ("y", "EVENT_TYPE_CREATE"), ("y", "EVENT_TYPE_REMOVE")], body
    # read once: the next poll has nothing new
    status, body = rpc(coved, sid, "GetWatcherEvents", {"watcherId": wid})
    assert status == 200 and body.get("events", []) == []
    status, body = rpc(coved, sid, "RemoveWatcher", {"watcherId": wid})
    assert status == 200 and body == {}
    status, body = rpc(coved, sid, "GetWatcherEvents", {"watcherId": wid})
    assert_connect_error(status, body, 404, "not_found")
    status, body = rpc(coved, sid, "CreateWatcher", {"path": "/tmp/pw/missing"})
    assert_connect_error(status, body, 404, "not_found")


def inotify_fds(pid):
    fd_dir = f"/proc/{pid}/fd"
    count = 0
    for fd in os.listdir(fd_dir):
        try:
            count += os.readlink(os.path.join(fd_dir, fd)) == "anon_inode:inotify"
        except FileNotFoundError:  # closed meanwhile (a command's pipe)
            pass
    return count


@pytest.mark.native_only(reason="reads the agent's descriptors in the host's /proc")
def test_watches_are_released(coved, sid):
    """A WatchDir the client closes, and a removed polling watcher, hold no inotify any more."""
    agent = min(sandbox_host_pids(sid))
    before = inotify_fds(agent)
    coved.sh(sid, "mkdir -p /tmp/rel")
    streams = [Stream(coved, sid, "WatchDir", {"path": "/tmp/rel"}) for _ in range(3)]
    for s in streams:
        assert s.next_event() == {"start": {}}
    ids = []
    for _ in range(2):
        status, body = rpc(coved, sid, "CreateWatcher", {"path": "/tmp/rel"})
        assert status == 200
        ids.append(body["watcherId"])
    assert inotify_fds(agent) == before + 5
    for s in streams:
        s.close()
    for wid in ids:
        assert rpc(coved, sid, "RemoveWatcher", {"watcherId": wid})[0] == 200
    deadline = time.monotonic() + 30  # the close travels through coved's proxy
    while inotify_fds(agent) != before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert inotify_fds(agent) == before
