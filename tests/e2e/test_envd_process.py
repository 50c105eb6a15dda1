"""E2B envd's process.Process service (Connect-RPC) on the agent, driven through coved's gateway
as the e2b SDKs drive it: JSON as they send it, and the binary codec (encoded here by hand, an
implementation independent of the agent's) that other Connect clients use. Bad input gets a
clear Connect error and leaves the agent serving."""

import base64
import http.client
import json
import struct
import time

import pytest

from covetest import AGENT_PORT

STREAM_JSON = "application/connect+json"
STREAM_PROTO = "application/connect+proto"


def rpc_path(sid, method):
    return f"/sandboxes/{sid}/proxy/{AGENT_PORT}/process.Process/{method}"


# ---- the binary codec, by hand: only what these messages use ----

def varint(n):
    out = b""
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out += bytes([byte | 0x80])
        else:
            return out + bytes([byte])


def pb_len(num, payload):
    if isinstance(payload, str):
        payload = payload.encode()
    return varint(num << 3 | 2) + varint(len(payload)) + payload


def pb_uint(num, value):
    return varint(num << 3) + varint(value)


def pb_decode(data):
    """{field number: [values]}: ints for varints, bytes for length-delimited fields."""
    fields, i = {}, 0
    while i < len(data):
        key, i = read_varint(data, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, i = read_varint(data, i)
        elif wire == 2:
            n, i = read_varint(data, i)
            value, i = data[i:i + n], i + n
        else:
            raise AssertionError(f"unexpected wire type {wire}")
        fields.setdefault(num, []).append(value)
    return fields


def read_varint(data, i):
    shift = value = 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def start_request_proto(cmd, args=(), envs=None, cwd=None, tag=None, stdin=None, pty=None):
    config = pb_len(1, cmd) + b"".join(pb_len(2, a) for a in args)
    for k, v in (envs or {}).items():
        config += pb_len(3, pb_len(1, k) + pb_len(2, v))
    if cwd is not None:
        config += pb_len(4, cwd)
    msg = pb_len(1, config)
    if pty is not None:
        msg += pb_len(2, pb_len(1, pb_uint(1, pty[0]) + pb_uint(2, pty[1])))
    if tag is not None:
        msg += pb_len(3, tag)
    if stdin is not None:
        msg += pb_uint(4, int(stdin))
    return msg


def event_from_proto(data):
    """A StartResponse/ConnectResponse in binary, as the JSON form the tests compare."""
    event = pb_decode(pb_decode(data)[1][0])
    if 1 in event:
        return {"start": {"pid": pb_decode(event[1][0]).get(1, [0])[0]}}
    if 2 in event:
        d = pb_decode(event[2][0])
        (num, (value,)), = d.items()
        return {"data": {{1: "stdout", 2: "stderr", 3: "pty"}[num]:
                         base64.b64encode(value).decode()}}
    if 3 in event:
        e = pb_decode(event[3][0])
        end = {}
        if 1 in e:
            z = e[1][0]
            end["exitCode"] = (z >> 1) ^ -(z & 1)  # sint32: zigzag
        if e.get(2, [0])[0]:
            end["exited"] = True
        if 3 in e:
            end["status"] = e[3][0].decode()
        if 4 in e:
            end["error"] = e[4][0].decode()
        return {"end": end}
    assert 4 in event, event
    return {"keepalive": {}}


# ---- envelopes and calls ----

def envelope(payload, flags=0):
    if isinstance(payload, (dict, list)):
        payload = json.dumps(payload).encode()
    return struct.pack(">BI", flags, len(payload)) + payload


class Stream:
    """A server stream being read: its events as JSON, then the end-stream's error."""

    def __init__(self, coved, sid, method, body, content_type=STREAM_JSON, headers=None):
        self.proto = content_type == STREAM_PROTO
        self.conn = http.client.HTTPConnection("127.0.0.1", coved.port, timeout=60)
        h = coved.headers()
        h.update({"Content-Type": content_type, "Connect-Protocol-Version": "1"})
        h.update(headers or {})
        self.conn.request("POST", rpc_path(sid, method), body=envelope(body), headers=h)
        self.resp = self.conn.getresponse()
        self.end = None  # the end-stream message, once read

    def next(self):
        """The next message (an event), or None at the end-stream (then self.end is set)."""
        head = self.resp.read(5)
        assert len(head) == 5, f"stream cut short: {head!r}"
        flags, length = struct.unpack(">BI", head)
        data = self.resp.read(length)
        assert len(data) == length
        if flags & 2:
            self.end = json.loads(data)
            assert self.resp.read() == b""  # nothing after the end-stream
            return None
        assert flags == 0, flags
        if self.proto:
            return event_from_proto(data)
        return json.loads(data)["event"]

    def events(self):
        """Every event until the end-stream, keepalives left out."""
        out = []
        while (e := self.next()) is not None:
            if "keepalive" not in e:
                out.append(e)
        return out

    def close(self):
        self.conn.close()


def start(coved, sid, cmd, args=(), proto=False, headers=None, **fields):
    if proto:
        body = start_request_proto(cmd, args, **fields)
        return Stream(coved, sid, "Start", body, STREAM_PROTO, headers)
    process = {"cmd": cmd, "args": list(args)}
    for k in ("envs", "cwd"):
        if fields.get(k) is not None:
            process[k] = fields.pop(k)
    body = {"process": process}
    if fields.get("pty") is not None:
        cols, rows = fields.pop("pty")
        body["pty"] = {"size": {"cols": cols, "rows": rows}}
    body.update({k: v for k, v in fields.items() if v is not None})
    return Stream(coved, sid, "Start", body, STREAM_JSON, headers)


def unary(coved, sid, method, body, content_type="application/json", raw=None):
    h = coved.headers()
    h.update({"Content-Type": content_type, "Connect-Protocol-Version": "1"})
    data = raw if raw is not None else json.dumps(body).encode()
    status, parsed, resp = coved.request("POST", rpc_path(sid, method), headers=h, raw=data)
    return status, parsed, resp


def post_raw(coved, sid, method, raw, content_type=STREAM_JSON):
    """(status, Content-Type, body bytes) of a request sent as is."""
    conn = http.client.HTTPConnection("127.0.0.1", coved.port, timeout=60)
    h = coved.headers()
    h["Content-Type"] = content_type
    try:
        conn.request("POST", rpc_path(sid, method), body=raw, headers=h)
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type"), resp.read()
    finally:
        conn.close()


def end_stream_only(data):
    """The end-stream message of a stream that is that alone."""
    flags, length = struct.unpack(">BI", data[:5])
    assert flags == 2 and len(data) == 5 + length, data
    return json.loads(data[5:])


def ok(coved, sid, method, body):
    status, parsed, resp = unary(coved, sid, method, body)
    assert status == 200, parsed
    assert resp.getheader("Content-Type") == "application/json"
    return parsed


def assert_connect_error(status, body, expected_status, code):
    assert status == expected_status, body
    assert isinstance(body, dict) and body.get("code") == code, body
    assert isinstance(body.get("message"), str) and body["message"], body


def output(events, kind="stdout"):
    return b"".join(base64.b64decode(e["data"][kind]) for e in events
                    if "data" in e and kind in e["data"])


def run(coved, sid, script, proto=False, **fields):
    """bash -l -c script, as the SDK's commands.run: (pid, the other events, the end event)."""
    s = start(coved, sid, "/bin/bash", ["-l", "-c", script], proto=proto, **fields)
    try:
        assert s.resp.status == 200
        assert s.resp.getheader("Content-Type") == (STREAM_PROTO if proto else STREAM_JSON)
        events = s.events()
        assert s.end == {"metadata": {}} or s.end == {}, s.end  # no error
    finally:
        s.close()
    assert "start" in events[0], events
    assert "end" in events[-1], events
    return events[0]["start"]["pid"], events[1:-1], events[-1]["end"]


def listed(coved, sid):
    return {p["pid"]: p for p in ok(coved, sid, "List", {}).get("processes", [])}


def wait_until(predicate, what, seconds=30):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"never happened: {what}")


# ---- Start ----

@pytest.mark.parametrize("proto", [False, True], ids=["json", "proto"])
def test_echo_output_and_exit_code(coved, sandbox, proto):
    pid, events, end = run(coved, sandbox, "echo hello; printf 'x%.0s' $(seq 3)", proto=proto)
    assert pid > 0
    assert output(events) == b"hello\nxxx"
    assert output(events, "stderr") == b""
    # Exit code 0 is the default value: left out of the message, as envd's.
    assert end == {"exited": True, "status": "exit status 0"}


@pytest.mark.parametrize("proto", [False, True], ids=["json", "proto"])
def test_nonzero_exit_and_stderr(coved, sandbox, proto):
    _, events, end = run(coved, sandbox, "echo to-out; echo oops >&2; exit 7", proto=proto)
    assert output(events) == b"to-out\n"
    assert output(events, "stderr") == b"oops\n"
    assert end == {"exitCode": 7, "exited": True, "status": "exit status 7",
                   "error": "exit status 7"}


@pytest.mark.parametrize("proto", [False, True], ids=["json", "proto"])
def test_cwd_and_envs(coved, sandbox, proto):
    _, events, end = run(coved, sandbox, 'pwd; echo "$GREETING|$OTHER"', proto=proto,
                         cwd="/usr/share", envs={"GREETING": "hello world", "OTHER": "é"})
    assert output(events).decode() == "/usr/share\nhello world|é\n"
    assert end["exited"] and "exitCode" not in end


def test_missing_cwd_or_program_is_invalid_argument(coved, sandbox):
    for fields in ({"cwd": "/no/such/dir"}, {}):
        cmd = "/bin/true" if fields else "/no/such/program"
        s = start(coved, sandbox, cmd, **fields)
        try:
            assert s.resp.status == 200  # a stream's errors are in its end-stream
            assert s.events() == []
            assert s.end["error"]["code"] == "invalid_argument", s.end
            assert ("/no/such" in s.end["error"]["message"]), s.end
        finally:
            s.close()


def test_stdin_send_input_and_close_stdin(coved, sandbox):
    # After EOF cat ends and sleep keeps the process there, to be sent more input.
    s = start(coved, sandbox, "/bin/bash", ["-c", "cat; echo; exec sleep 300"], stdin=True)
    try:
        pid = s.next()["start"]["pid"]
        sel = {"pid": pid}
        chunk = base64.b64encode(b"line one\n").decode()
        assert ok(coved, sandbox, "SendInput", {"process": sel, "input": {"stdin": chunk}}) == {}
        # The same in binary: SendInputRequest{process{pid}, input{stdin}}.
        body = pb_len(1, pb_uint(1, pid)) + pb_len(2, pb_len(1, b"line two\n"))
        status, parsed, resp = unary(coved, sandbox, "SendInput", None,
                                     "application/proto", raw=body)
        assert status == 200 and resp.getheader("Content-Type") == "application/proto"
        assert ok(coved, sandbox, "CloseStdin", {"process": sel}) == {}
        seen = b""
        while not seen.endswith(b"\n\n"):  # cat saw EOF, then the echo ran
            seen += output([s.next()])
        assert seen == b"line one\nline two\n\n"
        # Input after EOF is refused, clearly.
        status, parsed, _ = unary(coved, sandbox, "SendInput",
                                  {"process": sel, "input": {"stdin": chunk}})
        assert_connect_error(status, parsed, 400, "failed_precondition")
        assert ok(coved, sandbox, "SendSignal", {"process": sel, "signal": "SIGNAL_SIGKILL"}) == {}
        events = s.events()
    finally:
        s.close()
    assert output(events) == b""
    assert events[-1]["end"]["status"] == "signal: killed"


def test_stdin_false_reads_nothing(coved, sandbox):
    s = start(coved, sandbox, "/bin/cat", stdin=False)
    try:
        pid = s.next()["start"]["pid"]
        events = s.events()
    finally:
        s.close()
    assert output(events) == b"" and events[-1]["end"]["exited"]
    status, parsed, _ = unary(coved, sandbox, "SendInput",
                              {"process": {"pid": pid}, "input": {"stdin": "eA=="}})
    assert_connect_error(status, parsed, 404, "not_found")  # it ended: gone from the records


def test_stream_input_client_stream(coved, sandbox):
    s = start(coved, sandbox, "/bin/cat", stdin=True, tag="streamed")
    try:
        s.next()
        body = (envelope({"start": {"process": {"tag": "streamed"}}}) +
                envelope({"keepalive": {}}) +
                envelope({"data": {"input": {"stdin": base64.b64encode(b"via stream\n").decode()}}}))
        status, content_type, data = post_raw(coved, sandbox, "StreamInput", body)
        assert status == 200 and content_type == STREAM_JSON
        # One StreamInputResponse (empty), then the end-stream without an error.
        assert data[:7] == envelope({}) and end_stream_only(data[7:]) == {}, data
        pid = [p for p in listed(coved, sandbox).values() if p.get("tag") == "streamed"][0]["pid"]
        assert ok(coved, sandbox, "CloseStdin", {"process": {"pid": pid}}) == {}
        events = s.events()
    finally:
        s.close()
    assert output(events) == b"via stream\n"


# ---- background processes: List, Connect, SendSignal ----

def test_background_list_connect_and_kill(coved, sandbox):
    s = start(coved, sandbox, "/bin/bash", ["-c", "echo started; sleep 300"], tag="bg-job",
              cwd="/tmp", envs={"K": "V"})
    pid = s.next()["start"]["pid"]
    assert output([s.next()]) == b"started\n"
    s.close()  # the client goes away: the process does not
    time.sleep(0.2)
    info = listed(coved, sandbox)[pid]
    assert info["tag"] == "bg-job"
    assert info["config"] == {"cmd": "/bin/bash", "args": ["-c", "echo started; sleep 300"],
                              "envs": {"K": "V"}, "cwd": "/tmp"}
    c = Stream(coved, sandbox, "Connect", {"process": {"tag": "bg-job"}})
    try:
        assert c.next() == {"start": {"pid": pid}}
        assert ok(coved, sandbox, "SendSignal",
                  {"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}) == {}
        events = c.events()
    finally:
        c.close()
    assert events[-1]["end"] == {"exitCode": -1, "status": "signal: killed",
                                 "error": "signal: killed"}
    assert pid not in listed(coved, sandbox)
    # Gone: a second kill is not_found, as the SDK's kill() reads it (false).
    status, parsed, _ = unary(coved, sandbox, "SendSignal",
                              {"process": {"pid": pid}, "signal": 9})
    assert_connect_error(status, parsed, 404, "not_found")


def test_sigterm_and_bad_signal(coved, sandbox):
    s = start(coved, sandbox, "/bin/sleep", ["300"])
    try:
        pid = s.next()["start"]["pid"]
        status, parsed, _ = unary(coved, sandbox, "SendSignal",
                                  {"process": {"pid": pid}, "signal": "SIGNAL_UNSPECIFIED"})
        assert_connect_error(status, parsed, 400, "invalid_argument")
        assert pid in listed(coved, sandbox)  # nothing happened to it
        assert ok(coved, sandbox, "SendSignal", {"process": {"pid": pid}, "signal": 15}) == {}
        events = s.events()
    finally:
        s.close()
    assert events[-1]["end"]["status"] == "signal: terminated"


def test_connect_to_unknown_process(coved, sandbox):
    for selector in ({"pid": 999999}, {"tag": "nobody"}, {}):
        c = Stream(coved, sandbox, "Connect", {"process": selector})
        try:
            assert c.resp.status == 200
            assert c.events() == []
            assert c.end["error"]["code"] == ("invalid_argument" if not selector
                                              else "not_found"), c.end
        finally:
            c.close()


# ---- PTY ----

def pty_until(stream, text):
    seen = b""
    while text.encode() not in seen:
        e = stream.next()
        assert e is not None, f"ended before {text!r}: {seen!r}"
        assert "stdout" not in e.get("data", {}) and "stderr" not in e.get("data", {})
        seen += output([e], "pty")
    return seen


def test_pty_input_and_resize(coved, sandbox):
    s = start(coved, sandbox, "/bin/sh", pty=(80, 24), envs={"PS1": "$ "})
    try:
        pid = s.next()["start"]["pid"]
        sel = {"pid": pid}

        def type_(text):
            data = base64.b64encode(text.encode()).decode()
            ok(coved, sandbox, "SendInput", {"process": sel, "input": {"pty": data}})

        type_("stty size; tty\n")
        seen = pty_until(s, "/dev/pts/")
        assert b"24 80" in seen
        assert ok(coved, sandbox, "Update",
                  {"process": sel, "pty": {"size": {"cols": 100, "rows": 30}}}) == {}
        type_("stty size\n")
        pty_until(s, "30 100")
        # stdin input and CloseStdin are for pipes, not a PTY.
        status, parsed, _ = unary(coved, sandbox, "SendInput",
                                  {"process": sel, "input": {"stdin": "eA=="}})
        assert_connect_error(status, parsed, 400, "failed_precondition")
        status, parsed, _ = unary(coved, sandbox, "CloseStdin", {"process": sel})
        assert_connect_error(status, parsed, 400, "failed_precondition")
        type_("exit 3\n")
        events = s.events()
    finally:
        s.close()
    assert events[-1]["end"]["exitCode"] == 3


def test_update_without_pty_is_refused(coved, sandbox):
    s = start(coved, sandbox, "/bin/sleep", ["300"])
    try:
        pid = s.next()["start"]["pid"]
        status, parsed, _ = unary(coved, sandbox, "Update",
                                  {"process": {"pid": pid},
                                   "pty": {"size": {"cols": 10, "rows": 10}}})
        assert_connect_error(status, parsed, 400, "failed_precondition")
        ok(coved, sandbox, "SendSignal", {"process": {"pid": pid}, "signal": 9})
        s.events()
    finally:
        s.close()


# ---- deadlines and keepalives ----

def test_deadline_ends_the_stream_and_kills_the_process(coved, sandbox):
    s = start(coved, sandbox, "/bin/sleep", ["300"], headers={"Connect-Timeout-Ms": "300"})
    try:
        pid = s.next()["start"]["pid"]
        events = s.events()
    finally:
        s.close()
    assert events == []
    assert s.end["error"]["code"] == "deadline_exceeded", s.end
    wait_until(lambda: pid not in listed(coved, sandbox), "the process killed at its deadline")


@pytest.mark.slow
def test_keepalive_events(coved, sandbox):
    s = start(coved, sandbox, "/bin/sleep", ["3"], headers={"Keepalive-Ping-Interval": "1"})
    try:
        s.next()
        seen = []
        while (e := s.next()) is not None:
            seen.append(e)
    finally:
        s.close()
    assert {"keepalive": {}} in seen
    assert "end" in seen[-1]


# ---- bad input ----

def assert_agent_works(coved, sid):
    _, events, end = run(coved, sid, "echo still here")
    assert output(events) == b"still here\n" and end["exited"]


def test_unknown_procedure_and_wrong_content_type(coved, sandbox):
    status, parsed, _ = unary(coved, sandbox, "NoSuchMethod", {})
    assert_connect_error(status, parsed, 404, "unimplemented")
    status, parsed, _ = unary(coved, sandbox, "List", {}, content_type="text/plain")
    assert status == 415, parsed
    # A unary method called as a stream, and a stream as unary: 415 too.
    status, parsed, _ = unary(coved, sandbox, "List", None, STREAM_JSON, raw=envelope({}))
    assert status == 415, parsed
    status, parsed, _ = unary(coved, sandbox, "Start", {"process": {"cmd": "/bin/true"}})
    assert status == 415, parsed
    assert_agent_works(coved, sandbox)


BAD_STREAMS = [
    ("truncated envelope", envelope({"process": {"cmd": "/bin/true"}})[:-3]),
    ("no message", b""),
    ("two messages", envelope({"process": {"cmd": "/bin/true"}}) * 2),
    ("not JSON", envelope(b"{not json")),
    ("wrong type", envelope({"process": {"cmd": 7}})),
    ("compressed", struct.pack(">BI", 1, 2) + b"{}"),
    ("end-stream from the client", envelope({}, flags=2)),
]


@pytest.mark.parametrize("name,raw", BAD_STREAMS, ids=[b[0] for b in BAD_STREAMS])
def test_bad_stream_requests_are_invalid_argument(coved, sandbox, name, raw):
    before = listed(coved, sandbox)
    status, content_type, data = post_raw(coved, sandbox, "Start", raw)
    assert status == 200 and content_type == STREAM_JSON
    end = end_stream_only(data)
    assert end["error"]["code"] == "invalid_argument" and end["error"]["message"], end
    assert listed(coved, sandbox) == before  # nothing started


def test_bad_unary_requests(coved, sandbox):
    for raw in (b"{not json", b"[]", b'{"process": {"pid": "x"}}', b""):
        status, parsed, _ = unary(coved, sandbox, "SendSignal", None, raw=raw)
        assert_connect_error(status, parsed, 400, "invalid_argument")
    status, parsed, _ = unary(coved, sandbox, "SendSignal", None, "application/proto",
                              raw=b"\xff\xff\xff")
    assert_connect_error(status, parsed, 400, "invalid_argument")
    assert_agent_works(coved, sandbox)


def test_huge_messages_are_resource_exhausted(coved, sandbox):
    big = json.dumps({"process": {"pid": 1}, "input": {"stdin": "A" * (2 << 20)}}).encode()
    status, parsed, _ = unary(coved, sandbox, "SendInput", None, raw=big)
    assert_connect_error(status, parsed, 429, "resource_exhausted")
    # A stream's envelope announcing 100 MiB is refused from its header.
    raw = struct.pack(">BI", 0, 100 << 20) + b"{" * 1000
    status, _, data = post_raw(coved, sandbox, "Start", raw)
    assert status == 200
    assert end_stream_only(data)["error"]["code"] == "resource_exhausted"
    assert_agent_works(coved, sandbox)


# ---- the user ----

def basic(user):
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:".encode()).decode()}


def test_user_from_authorization(coved, sandbox):
    # None (the SDKs send none unless the caller names a user): the agent's, root here.
    _, events, _ = run(coved, sandbox, 'id -un; echo "$HOME|$USER"; pwd')
    assert output(events) == b"root\n/root|root\n/root\n"
    _, events, _ = run(coved, sandbox, "id -u", headers=basic("nobody"), cwd="/")
    assert output(events) == b"65534\n"
    # An unknown user, and a header that is not Basic (as the files routes answer both).
    for headers in (basic("no-such-user"), {"Authorization": "Bearer abc"}):
        s = start(coved, sandbox, "/bin/true", headers=headers)
        try:
            assert s.events() == []
            assert s.end["error"]["code"] == "unauthenticated", s.end
        finally:
            s.close()


# ---- more of the streams ----

@pytest.mark.parametrize("proto", [False, True], ids=["json", "proto"])
def test_large_output_arrives_whole_and_in_order(coved, sandbox, proto):
    # Megabytes through pipes read in chunks, with the client's backpressure in between.
    _, events, end = run(coved, sandbox, "seq 1 400000; seq 1 1000 >&2", proto=proto)
    expected = "".join(f"{i}\n" for i in range(1, 400001)).encode()
    assert output(events) == expected
    assert output(events, "stderr") == "".join(f"{i}\n" for i in range(1, 1001)).encode()
    assert end == {"exited": True, "status": "exit status 0"}


def test_stream_input_needs_its_start_first(coved, sandbox):
    body = envelope({"data": {"input": {"stdin": "eA=="}}})
    status, content_type, data = post_raw(coved, sandbox, "StreamInput", body)
    assert status == 200 and content_type == STREAM_JSON
    assert end_stream_only(data)["error"]["code"] == "failed_precondition"
    body = envelope({"start": {"process": {"pid": 999999}}})
    status, _, data = post_raw(coved, sandbox, "StreamInput", body)
    assert end_stream_only(data)["error"]["code"] == "not_found"


def test_connect_client_going_away_leaves_the_process(coved, sandbox):
    s = start(coved, sandbox, "/bin/bash", ["-c", "while :; do echo tick; sleep 0.05; done"])
    pid = s.next()["start"]["pid"]
    for _ in range(3):
        c = Stream(coved, sandbox, "Connect", {"process": {"pid": pid}})
        assert c.next() == {"start": {"pid": pid}}
        assert output([c.next()]) == b"tick\n"
        c.close()  # mid-stream
    s.close()
    assert pid in listed(coved, sandbox)
    c = Stream(coved, sandbox, "Connect", {"process": {"pid": pid}})
    try:
        c.next()
        ok(coved, sandbox, "SendSignal", {"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"})
        events = c.events()
    finally:
        c.close()
    assert events[-1]["end"]["status"] == "signal: killed"
    assert pid not in listed(coved, sandbox)
