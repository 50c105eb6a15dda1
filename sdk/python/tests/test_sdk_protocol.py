"""The shared protocol layer without a server: event-stream parsing however the bytes are
cut, result folding, error mapping, multipart bodies, WebSocket frames both ways, and the
operations' steps driven by hand."""

import json
import struct

import pytest

from cove import _protocol as p
from cove import _ws
from cove.errors import ConflictError, CoveError, NotFoundError, ServerError, error_from_response
from cove.models import EntryInfo, Execution, ExecutionError, Result, parse_time


def feed_all(parser, raw, step):
    out = []
    for i in range(0, len(raw), step):
        out += parser.feed(raw[i:i + step])
    return out + parser.close()


@pytest.mark.parametrize("step", [1, 3, 7, 1000])
def test_event_stream_in_any_pieces(step):
    events = [{"type": "init", "text": "id"}, {"type": "stdout", "text": "a é"},
              {"type": "execution_complete"}]
    bare = "".join(json.dumps(e) + "\n\n" for e in events).encode()
    sse = ": comment\r\nevent: x\r\n" + "".join(
        f"data: {json.dumps(e)}\r\n\r\n" for e in events)
    multi = "data: {\"type\":\ndata: \"stdout\", \"text\": \"m\"}\n\n"
    assert feed_all(p.EventStreamParser(), bare, step) == events
    assert feed_all(p.EventStreamParser(), sse.encode(), step) == events
    assert feed_all(p.EventStreamParser(), multi.encode(), step) == [{"type": "stdout",
                                                                      "text": "m"}]
    # the last event without its blank line, and a line that is not JSON
    assert feed_all(p.EventStreamParser(), b"nonsense\n" + bare[:-2], step) == events


def test_command_folder():
    f = p.CommandFolder(on_stdout=lambda s: None)
    calls = []
    for e in [{"type": "init", "text": "c1"}, {"type": "stdout", "text": "x"},
              {"type": "stdout", "text": "\n"}, {"type": "stderr", "text": "e"},
              {"type": "error", "error": {"ename": "CommandExecError", "evalue": "3",
                                          "traceback": ["exit status 3"]}}]:
        calls += f.add(e)
    r = f.result()
    assert (r.stdout, r.stderr, r.exit_code, r.error, r.command_id) == (
        "x\n\n", "e\n", 3, "exit status 3", "c1")
    assert [c.arg for c in calls] == ["x\n", "\n"]
    with pytest.raises(CoveError) as e:
        p.CommandFolder().result()  # the stream ended without an outcome
    assert e.value.code == "SDK::STREAM_ENDED"


def test_execution_text_and_exit_code():
    assert Execution().text is None and Execution().exit_code == 0
    ex = Execution()
    ex.logs.stdout += ["a\n", "b\n"]
    assert ex.text == "a\nb"
    ex.results.append(Result({"text": "'x'", "text/html": "<i>x</i>"}, is_main_result=True))
    assert ex.text == "'x'" and ex.results[0].formats() == ["text", "html"]
    ex.error = ExecutionError("CommandExecError", "4", [])
    assert ex.exit_code == 4
    ex.error = ExecutionError("ValueError", "bad", [])
    assert ex.exit_code == 1


def test_errors_by_status():
    e = error_from_response(404, b'{"code":"SANDBOX::NOT_FOUND","message":"gone"}', "r1")
    assert isinstance(e, NotFoundError) and (e.code, e.message, e.request_id) == (
        "SANDBOX::NOT_FOUND", "gone", "r1")
    assert isinstance(error_from_response(409, b"{}"), ConflictError)
    e = error_from_response(502, b"bad gateway")
    assert isinstance(e, ServerError) and (e.code, e.message) == ("HTTP_502", "bad gateway")


def test_models_parse():
    t = parse_time("2026-12-01T13:46:48.193964902Z")
    assert (t.microsecond, t.utcoffset().total_seconds()) == (193964, 0)
    info = EntryInfo.from_json({"path": "/a/b.txt", "type": "file", "size": 3, "mode": 644,
                                "owner": "u", "group": "g"})
    assert (info.name, info.mode) == ("b.txt", 0o644)


def test_upload_body():
    body = p.upload_body("/x/y.bin", p.Source(b"data"), owner="user", mode=0o600)
    assert body.length == len(body.head) + 4 + len(body.tail)
    meta = body.head.split(b"\r\n\r\n", 1)[1].split(b"\r\n", 1)[0]
    assert json.loads(meta) == {"path": "/x/y.bin", "owner": "user", "mode": 600}
    assert body.tail == f"\r\n--{body.boundary}--\r\n".encode()
    import io
    assert p.Source(io.StringIO("t")).length is None  # text: its byte length is not known


def unmask(raw):
    n, at = raw[1] & 0x7F, 2
    if n == 126:
        n, at = struct.unpack(">H", raw[2:4])[0], 4
    elif n == 127:
        n, at = struct.unpack(">Q", raw[2:10])[0], 10
    mask = raw[at:at + 4]
    return raw[0], bytes(b ^ mask[i % 4] for i, b in enumerate(raw[at + 4:at + 4 + n]))


@pytest.mark.parametrize("n", [0, 5, 125, 126, 65535, 65536])
def test_client_frames_are_masked(n):
    first, payload = unmask(_ws.stdin_frame(b"k" * n))
    assert first == 0x82 and payload == b"\x00" + b"k" * n


def server_frame(op, payload, fin=True):
    n = len(payload)
    length = bytes([n]) if n < 126 else bytes([126]) + struct.pack(">H", n)
    return bytes([(0x80 if fin else 0) | op]) + length + payload


def test_pty_protocol_fragments_pings_and_close():
    proto = _ws.PtyProtocol()
    raw = (server_frame(1, b'{"type":"connected","session_id":"s","mode":"pty"}')
           + server_frame(2, b"\x01par", fin=False) + server_frame(9, b"hb")
           + server_frame(0, b"tial") + server_frame(2, b"\x03" + struct.pack(">Q", 7) + b"old")
           + server_frame(1, b'{"type":"exit","exit_code":3}')
           + server_frame(8, struct.pack(">H", 1000)))
    events, reply = [], b""
    for i in range(len(raw)):  # a byte at a time
        ev, rep = proto.feed(raw[i:i + 1])
        events += ev
        reply += rep
    assert [e.kind for e in events] == ["connected", "output", "output", "exit", "closed"]
    assert events[1].data == b"partial" and events[1].channel == 1
    assert (events[2].channel, events[2].offset, events[2].data) == (3, 7, b"old")
    assert events[3].exit_code == 3 and events[4].close_code == 1000
    first, payload = unmask(reply)
    assert (first, payload) == (0x8A, b"hb")  # the ping was answered


def test_handshake_refusal_is_the_api_error():
    with pytest.raises(ConflictError) as e:
        _ws.check_handshake(b"HTTP/1.1 409 Conflict\r\nContent-Length: 40",
                            b'{"code":"PTY_IN_USE","message":"taken"}', "k")
    assert e.value.code == "PTY_IN_USE"


def test_operations_are_plain_steps():
    """An operation yields requests and takes responses: here driven by hand."""
    state = p.SandboxState("sb1")
    op = p.op_exists(state, "/missing")
    req = next(op)  # the endpoint lookup comes first
    assert (req.method, req.url) == ("GET", "/v1/sandboxes/sb1/endpoints/44772")
    req = op.send(p.Response(200, {}, b'{"endpoint":"h:1/sandboxes/sb1/proxy/44772",'
                                       b'"headers":{"X-T":"t"}}'))
    assert req.url == "http://h:1/sandboxes/sb1/proxy/44772/files/info"
    assert req.headers == {"X-T": "t"} and req.params == [("path", "/missing")]
    with pytest.raises(StopIteration) as stop:
        op.throw(NotFoundError("no", code="FILE_NOT_FOUND", status=404))
    assert stop.value.value is False
