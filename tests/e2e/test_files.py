"""The execd Filesystem operations through the gateway (/sandboxes/{id}/proxy/44772/...):
metadata, listing, search, multipart upload with metadata, ranged download, permissions, moves,
content replacement, directories; hostile paths (.., /proc magic links, symlinks swapped during
an upload, names with newlines or bytes that are not UTF-8) checked against markers on the host;
and a 1 GiB round trip with flat memory in the agent and in coved."""

import hashlib
import http.client
import json
import os
import secrets
import time
import urllib.parse

import pytest

import covetest
from covetest import AGENT_PORT, sandbox_host_pids


# ---- helpers ----

def agent_path(sid, path):
    return f"/sandboxes/{sid}/proxy/{AGENT_PORT}{path}"


def q(**params):
    """A query string; list values repeat the parameter."""
    items = []
    for k, v in params.items():
        for one in v if isinstance(v, list) else [v]:
            items.append((k, one))
    return urllib.parse.urlencode(items, quote_via=urllib.parse.quote)


def call(coved, sid, method, path, body=None, headers=None, raw=None):
    """(status, parsed JSON or text or None, response) of an agent request."""
    h = coved.headers()
    if headers:
        h.update(headers)
    return coved.request(method, agent_path(sid, path), body=body, raw=raw, headers=h)


def download(coved, sid, path, headers=None, **params):
    """(status, bytes, response headers) of GET /files/download."""
    conn = http.client.HTTPConnection("127.0.0.1", coved.port, timeout=120)
    h = coved.headers()
    h.pop("Content-Type")
    h.update(headers or {})
    query = q(path=path, **params) if isinstance(path, str) else \
        "path=" + urllib.parse.quote_from_bytes(path) + ("&" + q(**params) if params else "")
    conn.request("GET", agent_path(sid, "/files/download?" + query), headers=h)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, data, resp


def multipart(files, boundary=None, order="pairs"):
    """A multipart/form-data body as the SDKs send it: for each (metadata dict, content) a
    "metadata" part then a "file" part ("pairs"), or every metadata part first ("grouped")."""
    boundary = boundary or "cove-" + secrets.token_hex(8)
    meta_parts, file_parts = [], []
    for meta, content in files:
        meta_parts.append(
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"metadata\"; "
            f"filename=\"metadata\"\r\nContent-Type: application/json\r\n\r\n".encode()
            + (meta if isinstance(meta, bytes) else json.dumps(meta).encode()) + b"\r\n")
        file_parts.append(
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
            f"filename=\"blob\"\r\nContent-Type: application/octet-stream\r\n\r\n".encode()
            + content + b"\r\n")
    if order == "pairs":
        parts = [p for pair in zip(meta_parts, file_parts) for p in pair]
    else:
        parts = meta_parts + file_parts
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    return body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}


def upload(coved, sid, files, order="pairs"):
    body, headers = multipart(files, order=order)
    return call(coved, sid, "POST", "/files/upload", raw=body, headers=headers)


def stat_in(coved, sid, path):
    """owner group octal-mode size of path, from inside the sandbox. find, not stat(1): gVisor
    (runsc 20221219) refuses coreutils' statx flag AT_NO_AUTOMOUNT with EINVAL."""
    return coved.sh(sid, f"find '{path}' -maxdepth 0 -printf '%u %g %m %s'").split()


def check_error(status, body, expect_status, expect_code):
    assert status == expect_status, (status, body)
    assert set(body) == {"code", "message"} and body["code"] == expect_code, body


@pytest.fixture(scope="module")
def sid(coved):
    s = coved.create()
    yield s
    coved.delete(s)


@pytest.fixture(scope="module")
def host_markers():
    yield from covetest.host_markers("cove-files-marker-")


# ---- metadata, listing, search ----

def test_info_of_files_directories_and_symlinks(coved, sid):
    coved.sh(sid, "mkdir -p /tmp/info && printf 12345 > /tmp/info/f && chmod 640 /tmp/info/f "
                  "&& chown user:user /tmp/info/f && ln -sfn f /tmp/info/l")
    status, body, _ = call(coved, sid, "GET", "/files/info?" + q(path=["/tmp/info/f", "/tmp/info",
                                                                       "/tmp/info/l"]))
    assert status == 200, body
    f = body["/tmp/info/f"]
    assert {"path", "type", "size", "modified_at", "created_at", "owner", "group", "mode"} <= set(f)
    assert (f["path"], f["type"], f["size"], f["owner"], f["group"], f["mode"]) == \
        ("/tmp/info/f", "file", 5, "user", "user", 640)
    assert f["modified_at"].endswith("Z") and "T" in f["modified_at"]
    assert body["/tmp/info"]["type"] == "directory"
    assert body["/tmp/info/l"]["type"] == "symlink"  # not followed, as execd
    # relative and untidy paths are made absolute; the key stays as sent
    status, body, _ = call(coved, sid, "GET", "/files/info?" + q(path="tmp//info/../info/./f"))
    assert status == 200 and body["tmp//info/../info/./f"]["path"] == "/tmp/info/f"
    status, body, _ = call(coved, sid, "GET", "/files/info?" + q(path="/tmp/info/none"))
    check_error(status, body, 404, "FILE_NOT_FOUND")


def test_list_directory_with_depth(coved, sid):
    coved.sh(sid, "mkdir -p /tmp/ls/b/deeper /tmp/ls/a && touch /tmp/ls/c /tmp/ls/b/x "
                  "/tmp/ls/b/deeper/y && ln -sfn /tmp/ls/b /tmp/ls/link")
    status, body, _ = call(coved, sid, "GET", "/directories/list?" + q(path="/tmp/ls"))
    assert status == 200
    assert [e["path"] for e in body] == ["/tmp/ls/a", "/tmp/ls/b", "/tmp/ls/c", "/tmp/ls/link"]
    assert [e["type"] for e in body] == ["directory", "directory", "file", "symlink"]
    status, body, _ = call(coved, sid, "GET", "/directories/list?" + q(path="/tmp/ls", depth=2))
    assert [e["path"] for e in body] == ["/tmp/ls/a", "/tmp/ls/b", "/tmp/ls/b/deeper",
                                         "/tmp/ls/b/x", "/tmp/ls/c", "/tmp/ls/link"]
    status, body, _ = call(coved, sid, "GET", "/directories/list?" + q(path="/tmp/ls", depth=0))
    assert status == 200 and body == []
    status, body, _ = call(coved, sid, "GET", "/directories/list?" + q(path="/tmp/ls/link"))
    check_error(status, body, 400, "INVALID_REQUEST_BODY")
    status, body, _ = call(coved, sid, "GET", "/directories/list?" + q(path="/tmp/ls/c"))
    check_error(status, body, 400, "INVALID_REQUEST_BODY")
    status, body, _ = call(coved, sid, "GET", "/directories/list?" + q(path="/tmp/ls", depth=-1))
    check_error(status, body, 400, "INVALID_REQUEST_BODY")
    status, body, _ = call(coved, sid, "GET", "/directories/list?" + q(path="/tmp/none"))
    check_error(status, body, 404, "FILE_NOT_FOUND")
    status, body, _ = call(coved, sid, "GET", "/directories/list")
    check_error(status, body, 400, "MISSING_QUERY")


def test_large_listing_streams(coved, sid):
    coved.sh(sid, "mkdir -p /tmp/many && cd /tmp/many && seq -f 'file-%05g' 1 3000 | xargs touch")
    status, body, resp = call(coved, sid, "GET", "/directories/list?" + q(path="/tmp/many"))
    assert status == 200 and len(body) == 3000
    assert resp.getheader("Transfer-Encoding") == "chunked"  # beyond 64 KiB: streamed
    assert body[0]["path"] == "/tmp/many/file-00001" and body[-1]["path"] == "/tmp/many/file-03000"


def test_search_by_glob(coved, sid):
    coved.sh(sid, "mkdir -p /tmp/s/src/pkg /tmp/s/docs && touch /tmp/s/src/a.py /tmp/s/src/pkg/b.py "
                  "/tmp/s/docs/c.md /tmp/s/README.md /tmp/s/src/.hidden.py")
    def search(pattern=None, path="/tmp/s"):
        params = {"path": path}
        if pattern is not None:
            params["pattern"] = pattern
        return call(coved, sid, "GET", "/files/search?" + q(**params))
    status, body, _ = search("*.py")
    assert status == 200
    assert sorted(e["path"] for e in body) == ["/tmp/s/src/.hidden.py", "/tmp/s/src/a.py",
                                              "/tmp/s/src/pkg/b.py"]
    assert all({"path", "size", "owner", "group", "mode"} <= set(e) for e in body)
    status, body, _ = search()  # ** by default: every file, no directory
    assert len(body) == 5 and all(e["type"] == "file" for e in body)
    status, body, _ = search("**/*.md")
    assert sorted(e["path"] for e in body) == ["/tmp/s/README.md", "/tmp/s/docs/c.md"]
    status, body, _ = search("{a,b}.py")
    assert sorted(e["path"] for e in body) == ["/tmp/s/src/a.py", "/tmp/s/src/pkg/b.py"]
    status, body, _ = search("[abc")
    check_error(status, body, 400, "INVALID_REQUEST_BODY")
    status, body, _ = search("*", path="/tmp/nowhere")
    check_error(status, body, 404, "FILE_NOT_FOUND")
    status, body, _ = call(coved, sid, "GET", "/files/search")
    check_error(status, body, 400, "MISSING_QUERY")


# ---- upload ----

def test_upload_several_files_with_metadata(coved, sid):
    one = os.urandom(300_000)
    two = b"hello\r\n--not-a-boundary\r\n" * 100
    status, body, _ = upload(coved, sid, [
        ({"path": "/tmp/up/new/deep/one.bin", "owner": "user", "mode": 600}, one),
        ({"path": "/tmp/up/two.txt", "owner": "nobody", "group": "user", "mode": 644}, two),
        ({"path": "/tmp/up/three", "owner": None, "group": None, "mode": None}, b""),
    ])
    assert status == 200, body
    assert stat_in(coved, sid, "/tmp/up/new/deep/one.bin") == ["user", "user", "600", "300000"]
    assert stat_in(coved, sid, "/tmp/up/two.txt") == ["nobody", "user", "644", str(len(two))]
    assert stat_in(coved, sid, "/tmp/up/three") == ["root", "root", "755", "0"]
    assert stat_in(coved, sid, "/tmp/up/new/deep")[:3] == ["root", "root", "755"]
    assert download(coved, sid, "/tmp/up/new/deep/one.bin")[1] == one
    assert download(coved, sid, "/tmp/up/two.txt")[1] == two
    # no temporary files are left beside them
    assert coved.sh(sid, "ls -A /tmp/up /tmp/up/new/deep").count(".cove-tmp") == 0


def test_upload_metadata_first_and_overwrite(coved, sid):
    coved.sh(sid, "mkdir -p /tmp/up2 && echo old > /tmp/up2/a && chmod 700 /tmp/up2/a")
    status, body, _ = upload(coved, sid, [({"path": "/tmp/up2/a"}, b"new a"),
                                          ({"path": "/tmp/up2/b"}, b"new b")], order="grouped")
    assert status == 200, body
    assert coved.sh(sid, "cat /tmp/up2/a; echo; cat /tmp/up2/b") == "new a\nnew b\n"
    assert stat_in(coved, sid, "/tmp/up2/a")[2] == "700"  # an overwritten file keeps its mode


@pytest.mark.parametrize("parts,status,code", [
    ([("metadata", b'{"path":"/tmp/e/x"}')], 400, "INVALID_FILE_CONTENT"),
    ([("file", b"data")], 400, "INVALID_FILE_METADATA"),
    ([("metadata", b"not json"), ("file", b"x")], 400, "INVALID_FILE_METADATA"),
    ([("metadata", b'{"mode":644}'), ("file", b"x")], 400, "INVALID_FILE_METADATA"),
    ([("metadata", b'{"path":"/tmp/e/x","owner":"ghost"}'), ("file", b"x")], 400,
     "INVALID_FILE_METADATA"),
    ([("metadata", b'{"path":"/tmp/e/x","mode":999}'), ("file", b"x")], 400,
     "INVALID_FILE_METADATA"),
    ([("metadata", b'{"path":"/tmp/e/\xff"}'), ("file", b"x")], 400, "INVALID_FILE_METADATA"),
    ([("metadata", b'{"path":"/tmp/e/ok"}'), ("file", b"x"), ("metadata", b'{"path":"/tmp/e/y"}')],
     400, "INVALID_FILE"),
    ([("metadata", b'{"path":"/tmp"}'), ("file", b"x")], 400, "INVALID_REQUEST_BODY"),
])
def test_bad_uploads_write_nothing(coved, sid, parts, status, code):
    boundary = "b0undary"
    body = b"".join(f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; "
                    f"filename=\"{name}\"\r\n\r\n".encode() + data + b"\r\n" for name, data in parts)
    body += f"--{boundary}--\r\n".encode()
    got, err, _ = call(coved, sid, "POST", "/files/upload", raw=body,
                       headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    check_error(got, err, status, code)
    assert coved.exec(sid, "test -e /tmp/e/ok || test -e /tmp/e/x").exit_code != 0


def test_upload_needs_multipart(coved, sid):
    status, body, _ = call(coved, sid, "POST", "/files/upload", body={"path": "/tmp/x"})
    check_error(status, body, 400, "INVALID_FILE")
    body, headers = multipart([({"path": "/tmp/trunc"}, b"abc")])
    status, err, _ = call(coved, sid, "POST", "/files/upload", raw=body[:-10], headers=headers)
    check_error(status, err, 400, "INVALID_FILE")
    assert coved.exec(sid, "test -e /tmp/trunc").exit_code != 0


# ---- download ----

def test_download_whole_ranges_and_lines(coved, sid):
    data = bytes(range(256)) * 40  # 10240 bytes
    assert upload(coved, sid, [({"path": "/tmp/dl/data.bin"}, data)])[0] == 200
    status, got, resp = download(coved, sid, "/tmp/dl/data.bin")
    assert status == 200 and got == data
    assert resp.getheader("Content-Length") == "10240"
    assert resp.getheader("Content-Type") == "application/octet-stream"
    assert resp.getheader("Content-Disposition") == 'attachment; filename="data.bin"'
    assert resp.getheader("Accept-Ranges") == "bytes"
    for rng, start, end in [("bytes=0-9", 0, 9), ("bytes=10000-", 10000, 10239),
                            ("bytes=-100", 10140, 10239), ("bytes=10200-99999", 10200, 10239),
                            ("bytes=5-5, 20-30", 5, 5)]:
        status, got, resp = download(coved, sid, "/tmp/dl/data.bin", headers={"Range": rng})
        assert status == 206, rng
        assert got == data[start:end + 1], rng
        assert resp.getheader("Content-Range") == f"bytes {start}-{end}/10240"
        assert resp.getheader("Content-Length") == str(end - start + 1)
    for rng in ["bytes=10240-", "bytes=20000-30000", "bytes=9-3", "items=0-1", "bytes=x-y"]:
        status, got, resp = download(coved, sid, "/tmp/dl/data.bin", headers={"Range": rng})
        assert status == 416, rng
        assert resp.getheader("Content-Range") == "bytes */10240"
        assert set(json.loads(got)) == {"code", "message"}
    # line mode (the SDKs' readFile offset/limit): lines 2..3, CR before LF dropped, joined
    # by "\n" with none added at the end (execd-api.yaml's downloadFile)
    coved.sh(sid, "printf 'one\\r\\ntwo\\r\\nthree\\nfour' > /tmp/dl/lines.txt")
    status, got, _ = download(coved, sid, "/tmp/dl/lines.txt", offset=2, limit=2)
    assert status == 200 and got == b"two\nthree"
    status, got, _ = download(coved, sid, "/tmp/dl/lines.txt", offset=4, limit=10)
    assert got == b"four"
    status, got, _ = download(coved, sid, "/tmp/dl/lines.txt", offset=0, limit=1)
    assert status == 400 and json.loads(got)["code"] == "INVALID_PARAMETER"


def test_download_refusals(coved, sid):
    status, got, _ = download(coved, sid, "/tmp")
    assert status == 400 and json.loads(got)["code"] == "INVALID_REQUEST_BODY"
    status, got, _ = download(coved, sid, "/tmp/none")
    assert status == 404 and json.loads(got)["code"] == "FILE_NOT_FOUND"
    coved.sh(sid, "mkfifo /tmp/fifo")
    status, got, _ = download(coved, sid, "/tmp/fifo")  # would block forever if opened plainly
    assert status == 400
    status, got, _ = download(coved, sid, "/dev/zero")  # endless
    assert status == 400
    conn = http.client.HTTPConnection("127.0.0.1", coved.port, timeout=30)
    conn.request("GET", agent_path(sid, "/files/download"), headers=coved.headers())
    resp = conn.getresponse()
    assert resp.status == 400 and json.loads(resp.read())["code"] == "MISSING_QUERY"


# ---- changing files ----

def test_permissions(coved, sid):
    coved.sh(sid, "mkdir -p /tmp/perm && touch /tmp/perm/f && ln -sfn f /tmp/perm/l")
    status, body, _ = call(coved, sid, "POST", "/files/permissions",
                           body={"/tmp/perm/f": {"owner": "user", "group": "nogroup", "mode": 751}})
    assert status == 200, body
    assert stat_in(coved, sid, "/tmp/perm/f") == ["user", "nogroup", "751", "0"]
    # through a symlink (followed, as chmod); only the mode given changes
    status, body, _ = call(coved, sid, "POST", "/files/permissions",
                           body={"/tmp/perm/l": {"mode": 600}})
    assert status == 200 and stat_in(coved, sid, "/tmp/perm/f") == ["user", "nogroup", "600", "0"]
    for bad in [{"/tmp/perm/f": {"mode": 800}}, {"/tmp/perm/f": {"owner": "ghost"}},
                {"/tmp/perm/f": {"mode": "644"}}, ["/tmp/perm/f"]]:
        status, body, _ = call(coved, sid, "POST", "/files/permissions", body=bad)
        check_error(status, body, 400, "INVALID_REQUEST_BODY")
    # a bad entry anywhere changes nothing
    status, body, _ = call(coved, sid, "POST", "/files/permissions",
                           body={"/tmp/perm/f": {"mode": 777}, "/tmp/perm/l": {"group": "ghost"}})
    assert status == 400 and stat_in(coved, sid, "/tmp/perm/f")[2] == "600"
    status, body, _ = call(coved, sid, "POST", "/files/permissions",
                           body={"/tmp/perm/none": {"mode": 644}})
    check_error(status, body, 404, "FILE_NOT_FOUND")


def test_move(coved, sid):
    coved.sh(sid, "mkdir -p /tmp/mv && echo a > /tmp/mv/a && echo b > /tmp/mv/b")
    status, body, _ = call(coved, sid, "POST", "/files/mv",
                           body=[{"src": "/tmp/mv/a", "dest": "/tmp/mv/sub/dir/a2"}])
    assert status == 200, body
    assert coved.sh(sid, "cat /tmp/mv/sub/dir/a2; test ! -e /tmp/mv/a && echo gone") == "a\ngone\n"
    status, body, _ = call(coved, sid, "POST", "/files/mv",
                           body=[{"src": "/tmp/mv/b", "dest": "/tmp/mv/sub/dir/a2"}])
    check_error(status, body, 400, "INVALID_REQUEST_BODY")  # the destination exists
    status, body, _ = call(coved, sid, "POST", "/files/mv",
                           body=[{"src": "/tmp/mv/none", "dest": "/tmp/mv/x"}])
    check_error(status, body, 404, "FILE_NOT_FOUND")
    # across filesystems (/dev/shm is a tmpfs of its own): copied, then removed
    coved.sh(sid, "chmod 604 /tmp/mv/b")
    status, body, _ = call(coved, sid, "POST", "/files/mv",
                           body=[{"src": "/tmp/mv/b", "dest": "/dev/shm/b"}])
    assert status == 200, body
    assert coved.sh(sid, "cat /dev/shm/b; find /dev/shm/b -printf '%m\\n'; test ! -e /tmp/mv/b && echo gone") \
        == "b\n604\ngone\n"
    status, body, _ = call(coved, sid, "POST", "/files/mv", body=[{"src": "/tmp/mv/sub"}])
    check_error(status, body, 400, "INVALID_REQUEST_BODY")


def test_move_across_filesystems_that_cannot_remove_the_source_changes_nothing(coved, sid):
    """A move to another filesystem is a copy, then the source's removal: when the source
    cannot go (here /usr, read-only in the sandbox), the move is an error and the copy is taken
    back, so neither side changed."""
    src = coved.sh(sid, "find /usr/bin -maxdepth 1 -type f -size -64k | head -1").strip()
    link = coved.sh(sid, "find /usr/bin -maxdepth 1 -type l | head -1").strip()
    assert src and link
    before = coved.sh(sid, f"sha256sum {src}; readlink {link}")
    coved.sh(sid, "mkdir -p /tmp/mv-ro")
    for path, name in [(src, "file"), (link, "link")]:
        status, body, _ = call(coved, sid, "POST", "/files/mv",
                               body=[{"src": path, "dest": f"/tmp/mv-ro/{name}"}])
        assert status in (400, 403, 500), (path, status, body)
        assert set(body) == {"code", "message"} and path in body["message"], body
        assert coved.sh(sid, f"test ! -e /tmp/mv-ro/{name} && test ! -L /tmp/mv-ro/{name} && "
                             "ls -A /tmp/mv-ro | wc -l") == "0\n"
    assert coved.sh(sid, f"sha256sum {src}; readlink {link}") == before
    # a move that can remove its source still goes across filesystems
    coved.sh(sid, "echo c > /tmp/mv-ro/c")
    status, body, _ = call(coved, sid, "POST", "/files/mv",
                           body=[{"src": "/tmp/mv-ro/c", "dest": "/dev/shm/c"}])
    assert status == 200, body
    assert coved.sh(sid, "cat /dev/shm/c; test ! -e /tmp/mv-ro/c && echo gone") == "c\ngone\n"


def test_replace_content(coved, sid):
    coved.sh(sid, "printf 'host=localhost:8080\\nother=localhost\\n' > /tmp/conf && chmod 640 /tmp/conf"
                  " && chown user /tmp/conf && ln -sfn conf /tmp/conf-link")
    status, body, _ = call(coved, sid, "POST", "/files/replace",
                           body={"/tmp/conf-link": {"old": "localhost", "new": "0.0.0.0"}})
    assert status == 200 and body is None
    assert coved.sh(sid, "cat /tmp/conf") == "host=0.0.0.0:8080\nother=0.0.0.0\n"
    assert stat_in(coved, sid, "/tmp/conf")[:3] == ["user", "root", "640"]
    assert coved.sh(sid, "test -L /tmp/conf-link && echo still-a-link") == "still-a-link\n"
    status, body, _ = call(coved, sid, "POST", "/files/replace?verbose=true",
                           body={"/tmp/conf": {"old": "0.0.0.0", "new": ""}})
    assert status == 200 and body == {"/tmp/conf": {"replacedCount": 2}}
    status, body, _ = call(coved, sid, "POST", "/files/replace?verbose=true",
                           body={"/tmp/conf": {"old": "absent", "new": "x"}})
    assert body == {"/tmp/conf": {"replacedCount": 0}}
    status, body, _ = call(coved, sid, "POST", "/files/replace",
                           body={"/tmp/conf": {"old": "", "new": "x"}})
    check_error(status, body, 400, "INVALID_REQUEST_BODY")
    status, body, _ = call(coved, sid, "POST", "/files/replace",
                           body={"/tmp/none": {"old": "a", "new": "b"}})
    check_error(status, body, 404, "FILE_NOT_FOUND")


def test_replace_across_chunk_boundaries(coved, sid):
    # 256 KiB chunks: occurrences straddling them are found too
    data = (b"x" * 262141 + b"NEEDLE") * 5 + b"NEED"
    assert upload(coved, sid, [({"path": "/tmp/big.txt"}, data)])[0] == 200
    status, body, _ = call(coved, sid, "POST", "/files/replace?verbose=true",
                           body={"/tmp/big.txt": {"old": "NEEDLE", "new": "pin"}})
    assert body == {"/tmp/big.txt": {"replacedCount": 5}}
    assert download(coved, sid, "/tmp/big.txt")[1] == data.replace(b"NEEDLE", b"pin")


def test_directories_make_and_remove(coved, sid):
    status, body, _ = call(coved, sid, "POST", "/directories",
                           body={"/tmp/md/a/b": {"mode": 700, "owner": "user"},
                                 "/tmp/md/c": {"mode": 755}})
    assert status == 200, body
    assert stat_in(coved, sid, "/tmp/md/a/b")[:3] == ["user", "user", "700"]
    assert stat_in(coved, sid, "/tmp/md/a")[:3] == ["root", "root", "755"]
    # an existing directory is left as it is
    status, body, _ = call(coved, sid, "POST", "/directories", body={"/tmp/md/a/b": {"mode": 755}})
    assert status == 200 and stat_in(coved, sid, "/tmp/md/a/b")[2] == "700"
    coved.sh(sid, "touch /tmp/md/file /tmp/md/a/b/inner && mkdir -p /tmp/keep && touch /tmp/keep/k"
                  " && ln -sfn /tmp/keep /tmp/md/a/link")
    status, body, _ = call(coved, sid, "POST", "/directories", body={"/tmp/md/file/x": {"mode": 755}})
    assert status in (400, 404) and set(body) == {"code", "message"}
    status, body, _ = call(coved, sid, "DELETE", "/files?" + q(path="/tmp/md/a"))
    check_error(status, body, 400, "INVALID_REQUEST_BODY")  # removeFiles leaves directories
    assert stat_in(coved, sid, "/tmp/md/a/b")[2] == "700"
    for method, route in (("GET", "/files/info"), ("DELETE", "/files"), ("DELETE", "/directories")):
        status, body, _ = call(coved, sid, method, route)  # no path at all
        check_error(status, body, 400, "MISSING_QUERY")
    status, body, _ = call(coved, sid, "DELETE", "/directories?" + q(path=["/tmp/md/a", "/tmp/md/none"]))
    assert status == 200, body
    # rm -rf removed the link, not what it pointed to
    assert coved.sh(sid, "test ! -e /tmp/md/a && ls /tmp/keep") == "k\n"
    status, body, _ = call(coved, sid, "DELETE", "/files?" + q(path=["/tmp/md/file", "/tmp/md/none"]))
    assert status == 200 and coved.exec(sid, "test -e /tmp/md/file").exit_code != 0
    status, body, _ = call(coved, sid, "DELETE", "/directories?" + q(path="/"))
    check_error(status, body, 400, "INVALID_REQUEST_BODY")


# ---- hostile paths ----

def test_dotdot_and_absolute_paths_stay_in_the_sandbox(coved, sid, host_markers):
    name, secret, _ = host_markers
    for path in [f"../../../../../root/{name}", f"/../../tmp/{name}", f"/proc/1/root/tmp/{name}"]:
        status, got, _ = download(coved, sid, path)
        assert status in (400, 404), (path, status)
        assert secret.encode() not in got
    # writes to the same names land in the sandbox's own /tmp and /root
    status, body, _ = upload(coved, sid, [({"path": f"../../../tmp/{name}"}, b"sandbox copy"),
                                          ({"path": f"/../root/{name}"}, b"sandbox copy")])
    assert status == 200, body
    assert coved.sh(sid, f"cat /tmp/{name} /root/{name}") == "sandbox copy" * 2 + "\n"
    status, body, _ = call(coved, sid, "DELETE", "/directories?" + q(path=f"../../tmp/{name}"))
    assert status == 200
    host_shadow = open("/etc/shadow", "rb").read() if os.path.exists("/etc/shadow") else None
    status, got, _ = download(coved, sid, "../../etc/shadow")
    assert status == 404 or got != host_shadow


def test_proc_magic_links_are_not_followed(coved, sid, host_markers):
    name, secret, _ = host_markers
    coved.sh(sid, "mkdir -p /tmp/evil && ln -sfn /proc/1/root /tmp/evil/root1 && "
                  "ln -sfn /proc/self/cwd /tmp/evil/cwd && ln -sfn /proc/1/fd /tmp/evil/fds")
    for path in ["/tmp/evil/root1/etc/hostname", "/proc/1/root/etc/hostname",
                 "/proc/self/root/etc/passwd", "/tmp/evil/cwd/etc/passwd", "/tmp/evil/fds/0"]:
        status, got, _ = download(coved, sid, path)
        assert status == 400, (path, got)
        assert json.loads(got)["code"] == "INVALID_REQUEST_BODY"
    status, body, _ = upload(coved, sid, [({"path": f"/tmp/evil/root1/tmp/{name}"}, b"x")])
    check_error(status, body, 400, "INVALID_REQUEST_BODY")
    for method, path, body in [
        ("GET", "/directories/list?" + q(path="/tmp/evil/root1/tmp"), None),
        ("GET", "/files/search?" + q(path="/proc/1/root/tmp"), None),
        ("POST", "/files/permissions", {"/tmp/evil/root1/etc/passwd": {"mode": 777}}),
        ("POST", "/files/replace", {"/tmp/evil/root1/etc/passwd": {"old": "root", "new": "x"}}),
        ("POST", "/directories", {"/tmp/evil/root1/tmp/newdir": {"mode": 755}}),
        ("POST", "/files/mv", [{"src": "/tmp/evil/root1/etc/passwd", "dest": "/tmp/p"}]),
    ]:
        status, got, _ = call(coved, sid, method, path, body=body)
        assert status == 400, (path, got)
    # the links themselves are reported (not followed) and can be removed
    status, body, _ = call(coved, sid, "GET", "/files/info?" + q(path="/tmp/evil/root1"))
    assert status == 200 and body["/tmp/evil/root1"]["type"] == "symlink"
    status, body, _ = call(coved, sid, "DELETE", "/directories?" + q(path="/tmp/evil"))
    assert status == 200
    assert stat_in(coved, sid, "/etc/passwd")[2] == "644"


def test_names_with_newlines_and_bytes_that_are_not_utf8(coved, sid):
    coved.sh(sid, "mkdir -p /tmp/odd && printf nl > \"/tmp/odd/a$(printf '\\nb')\" && "
                  "printf latin > /tmp/odd/$(printf 'caf\\351')")
    status, body, _ = call(coved, sid, "GET", "/directories/list?" + q(path="/tmp/odd"))
    assert status == 200
    assert sorted(e["path"] for e in body) == ["/tmp/odd/a\nb", "/tmp/odd/caf\ufffd"]
    # a name that is not UTF-8 is reached with its bytes percent-encoded
    status, got, resp = download(coved, sid, b"/tmp/odd/caf\xe9")
    assert status == 200 and got == b"latin"
    assert "filename*=UTF-8''caf%E9" in resp.getheader("Content-Disposition")
    status, got, resp = download(coved, sid, "/tmp/odd/a\nb")
    assert status == 200 and got == b"nl"
    assert "\n" not in resp.getheader("Content-Disposition")
    status, body, _ = call(coved, sid, "GET", "/files/info?path=" +
                           urllib.parse.quote_from_bytes(b"/tmp/odd/caf\xe9"))
    assert status == 200 and list(body.values())[0]["size"] == 5
    # uploads: a newline is fine in JSON; bytes that are not UTF-8 cannot be said in JSON
    status, body, _ = upload(coved, sid, [({"path": "/tmp/odd/up\nload"}, b"ok")])
    assert status == 200 and coved.sh(sid, "cat \"/tmp/odd/up$(printf '\\nload')\"") == "ok\n"
    status, body, _ = upload(coved, sid, [(b'{"path":"/tmp/odd/\xff"}', b"no")])
    check_error(status, body, 400, "INVALID_FILE_METADATA")
    status, body, _ = call(coved, sid, "GET", "/files/info?path=/tmp/odd/nul%00byte")
    check_error(status, body, 400, "INVALID_REQUEST_BODY")
    status, body, _ = call(coved, sid, "DELETE", "/files?path=" +
                           urllib.parse.quote_from_bytes(b"/tmp/odd/caf\xe9"))
    assert status == 200 and "caf" not in coved.sh(sid, "ls /tmp/odd")


def test_symlink_swapped_in_during_an_upload_is_not_written_through(coved, sid, host_markers):
    name, secret, _ = host_markers
    coved.sh(sid, f"mkdir -p /tmp/race/dir /tmp/victims && echo untouched > /tmp/victims/file && "
                  f"echo untouched > /tmp/victims/{name}")
    boundary = "race-boundary"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"metadata\"\r\n\r\n"
            + json.dumps({"path": "/tmp/race/dir/target"}) + f"\r\n--{boundary}\r\n"
            "Content-Disposition: form-data; name=\"file\"; filename=\"target\"\r\n\r\n").encode()
    content = b"uploaded content\n" * 10000
    tail = f"\r\n--{boundary}--\r\n".encode()
    conn = http.client.HTTPConnection("127.0.0.1", coved.port, timeout=60)
    conn.putrequest("POST", agent_path(sid, "/files/upload"))
    for k, v in coved.headers().items():
        if k != "Content-Type":
            conn.putheader(k, v)
    conn.putheader("Content-Type", f"multipart/form-data; boundary={boundary}")
    conn.putheader("Content-Length", str(len(head) + len(content) + len(tail)))
    conn.endheaders()
    conn.send(head + content[:50000])
    # The agent is writing beside the target now; swap both the target and its directory.
    for _ in range(200):
        if ".cove-tmp-" in coved.sh(sid, "ls -A /tmp/race/dir"):
            break
        time.sleep(0.02)
    else:
        pytest.fail("the upload's temporary file never appeared")
    coved.sh(sid, f"ln -s /tmp/victims/file /tmp/race/dir/target && mv /tmp/race/dir /tmp/race/orig"
                  f" && ln -s /tmp/victims /tmp/race/dir")
    conn.send(content[50000:] + tail)
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    conn.close()
    # The file went where the directory was when the upload began, replacing the symlink.
    assert coved.sh(sid, "cat /tmp/victims/file") == "untouched\n"
    assert coved.sh(sid, "test -f /tmp/race/orig/target && ! test -L /tmp/race/orig/target && "
                         "echo regular") == "regular\n"
    assert download(coved, sid, "/tmp/race/orig/target")[1] == content
    assert coved.exec(sid, "test -e /tmp/victims/target").exit_code != 0
    assert coved.sh(sid, f"cat /tmp/victims/{name}") == "untouched\n"


def test_client_gone_mid_upload_leaves_nothing(coved, sid):
    body, headers = multipart([({"path": "/tmp/gone/file"}, b"z" * 2_000_000)])
    conn = http.client.HTTPConnection("127.0.0.1", coved.port, timeout=30)
    conn.putrequest("POST", agent_path(sid, "/files/upload"))
    h = coved.headers()
    h.update(headers)
    for k, v in h.items():
        conn.putheader(k, v)
    conn.putheader("Content-Length", str(len(body)))
    conn.endheaders()
    conn.send(body[:1_000_000])
    for _ in range(200):
        if ".cove-tmp-" in coved.exec(sid, "ls -A /tmp/gone 2>/dev/null").stdout:
            break
        time.sleep(0.02)
    conn.close()
    for _ in range(200):
        if coved.exec(sid, "ls -A /tmp/gone").stdout == "":
            break
        time.sleep(0.02)
    assert coved.exec(sid, "ls -A /tmp/gone").stdout == ""
    assert call(coved, sid, "GET", "/ping")[0] == 200


# ---- a 1 GiB round trip ----

def vm_hwm_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


@pytest.mark.slow
def test_1gib_round_trip_with_flat_memory(coved):
    total_blocks = 1024
    size = total_blocks << 20
    sid = coved.create(limits={"cpu": "2", "memory": "3Gi", "ephemeral-storage": "2Gi"})
    try:
        agent = min(sandbox_host_pids(sid))
        coved_before, agent_before = vm_hwm_kib(coved.proc.pid), vm_hwm_kib(agent)
        random_block = os.urandom(1 << 20)

        def content():
            """1024 distinct MiB blocks, made cheaply: one random block, numbered in place (each
            is sent or hashed before the next one overwrites it)."""
            block = bytearray(random_block)
            for i in range(total_blocks):
                block[:8] = i.to_bytes(8, "little")
                yield block

        expected = hashlib.sha256()
        for b in content():
            expected.update(b)

        boundary = "gib-" + secrets.token_hex(8)
        head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"metadata\"; "
                f"filename=\"metadata\"\r\nContent-Type: application/json\r\n\r\n"
                + json.dumps({"path": "/home/user/big.bin", "owner": "user"})
                + f"\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
                f"filename=\"big.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n").encode()
        tail = f"\r\n--{boundary}--\r\n".encode()
        conn = http.client.HTTPConnection("127.0.0.1", coved.port, timeout=300)
        conn.putrequest("POST", agent_path(sid, "/files/upload"))
        for k, v in coved.headers().items():
            if k != "Content-Type":
                conn.putheader(k, v)
        conn.putheader("Content-Type", f"multipart/form-data; boundary={boundary}")
        conn.putheader("Content-Length", str(len(head) + size + len(tail)))
        conn.endheaders()
        started = time.monotonic()
        conn.send(head)
        for b in content():
            conn.sock.sendall(b)
        conn.send(tail)
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        resp.read()
        upload_s = time.monotonic() - started
        conn.close()

        got = hashlib.sha256()
        received = 0
        conn = http.client.HTTPConnection("127.0.0.1", coved.port, timeout=300)
        h = coved.headers()
        h.pop("Content-Type")
        started = time.monotonic()
        conn.request("GET", agent_path(sid, "/files/download?" + q(path="/home/user/big.bin")),
                     headers=h)
        resp = conn.getresponse()
        assert resp.status == 200 and int(resp.getheader("Content-Length")) == size
        buf = bytearray(1 << 20)
        view = memoryview(buf)
        while True:
            n = resp.readinto(buf)
            if not n:
                break
            got.update(view[:n])
            received += n
        download_s = time.monotonic() - started
        conn.close()

        assert received == size
        assert got.hexdigest() == expected.hexdigest()
        assert stat_in(coved, sid, "/home/user/big.bin")[::3] == ["user", str(size)]
        grew_coved = vm_hwm_kib(coved.proc.pid) - coved_before
        grew_agent = vm_hwm_kib(agent) - agent_before
        mb = size / 1e6
        print(f"\n1 GiB through the gateway: upload {mb / upload_s:.0f} MB/s ({upload_s:.2f} s), "
              f"download {mb / download_s:.0f} MB/s ({download_s:.2f} s); peak memory grew: "
              f"coved {grew_coved} KiB, agent {grew_agent} KiB")
        assert grew_coved < 32 * 1024 and grew_agent < 32 * 1024
    finally:
        coved.delete(sid)
