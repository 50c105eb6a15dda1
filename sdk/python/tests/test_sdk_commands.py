"""sandbox.commands and sandbox.pty through both APIs: foreground results, every option,
callbacks' order (sync and async callbacks), timeouts, background handles (wait, logs, kill,
connect), errors, and the PTY over its WebSocket (typing, resize, signals, exit status,
reconnecting with replay)."""

import os
import time

import pytest

from cove import CommandResult
from cove.errors import CoveError, InvalidRequestError, NotFoundError

from sdkutil import resolve

pytestmark = pytest.mark.anyio


async def test_run_returns_output_and_exit_code(api, sandbox):
    r = await resolve(sandbox.commands.run("echo out; echo err >&2; echo; printf tail"))
    assert isinstance(r, CommandResult)
    assert (r.stdout, r.stderr, r.exit_code, r.error) == ("out\n\ntail\n", "err\n", 0, None)
    r = await resolve(sandbox.commands.run("echo before; exit 3"))
    assert (r.stdout, r.exit_code, r.error) == ("before\n", 3, "exit status 3")
    assert r.command_id


async def test_cwd_envs_user(api, sandbox):
    r = await resolve(sandbox.commands.run("pwd; echo $A-$B", cwd="/tmp",
                                           envs={"A": "x", "B": "y z"}))
    assert r.stdout == "/tmp\nx-y z\n"
    r = await resolve(sandbox.commands.run("id -un; id -u; id -g", user="user"))
    assert r.stdout == "user\n1000\n1000\n"
    r = await resolve(sandbox.commands.run("id -u", user=1000))
    assert r.stdout == "1000\n"
    r = await resolve(sandbox.commands.run("id -un", user="root"))
    assert r.stdout == "root\n"
    with pytest.raises(NotFoundError) as e:
        await resolve(sandbox.commands.run("true", user="nobody-such"))
    assert e.value.code == "SDK::NO_SUCH_USER"
    with pytest.raises(InvalidRequestError) as e:
        await resolve(sandbox.commands.run("true", cwd="/no/such/dir"))
    assert e.value.code == "INVALID_REQUEST_BODY" and e.value.status == 400


async def test_callbacks_come_in_order(api, sandbox):
    seen = []
    r = await resolve(sandbox.commands.run(
        "echo o1; sleep 0.1; echo e1 >&2; sleep 0.1; echo o2; sleep 0.1; echo e2 >&2",
        on_stdout=lambda s: seen.append(("out", s)), on_stderr=lambda s: seen.append(("err", s))))
    assert seen == [("out", "o1\n"), ("err", "e1\n"), ("out", "o2\n"), ("err", "e2\n")]
    assert (r.stdout, r.stderr) == ("o1\no2\n", "e1\ne2\n")


async def test_callbacks_arrive_while_the_command_runs(api, sandbox):
    stamps = []
    started = time.monotonic()
    await resolve(sandbox.commands.run("echo first; sleep 1; echo second",
                                       on_stdout=lambda s: stamps.append(time.monotonic())))
    assert stamps[0] - started < 0.8 and stamps[1] - stamps[0] > 0.8, stamps


async def test_async_callbacks_are_awaited(conn):
    import cove.aio
    seen = []

    async def on_stdout(line):
        seen.append(line)

    async with await cove.aio.Sandbox.create(**conn) as sb:
        await sb.commands.run("echo a; echo b", on_stdout=on_stdout)
        h = await sb.commands.run("echo bg", background=True, on_stdout=on_stdout)
        await h.wait()
    assert seen == ["a\n", "b\n", "bg\n"]


async def test_timeout_kills_the_command(api, sandbox):
    started = time.monotonic()
    r = await resolve(sandbox.commands.run("echo started; sleep 30", timeout=0.5))
    assert time.monotonic() - started < 10
    assert r.exit_code == -1 and "timed out" in r.error and r.stdout == "started\n"


async def test_background_output_split_inside_a_character(api, sandbox):
    """A poll of the log that ends between the bytes of a character does not garble it."""
    h = await resolve(sandbox.commands.run("printf '\\303'; sleep 1; printf '\\251\\n'",
                                           background=True))
    got = []
    r = await resolve(h.wait(on_stdout=got.append))
    assert r.stdout == "é\n" and "".join(got) == "é\n"


async def test_background_wait_logs_kill_connect(api, sandbox):
    h = await resolve(sandbox.commands.run("echo one; sleep 0.5; echo two >&2; exit 4",
                                           background=True))
    assert h.id and await resolve(h.is_running())
    got = []
    r = await resolve(h.wait(on_stdout=got.append))
    assert (r.stdout, r.exit_code, r.error) == ("one\ntwo\n", 4, "exit status 4")
    assert "".join(got) == "one\ntwo\n"
    assert await resolve(h.logs()) == "one\ntwo\n"
    assert not await resolve(h.is_running())

    long = await resolve(sandbox.commands.run("sleep 300", background=True))
    same = sandbox.commands.connect(long.id)
    assert await resolve(same.is_running())
    assert await resolve(same.kill()) is True
    r = await resolve(long.wait(timeout=10))
    assert r.exit_code == -1 or r.exit_code >= 128, r

    slow = await resolve(sandbox.commands.run("sleep 300", background=True))
    with pytest.raises(CoveError) as e:
        await resolve(slow.wait(timeout=0.3))
    assert e.value.code == "SDK::TIMEOUT"
    assert await resolve(sandbox.commands.kill(slow.id))
    with pytest.raises(NotFoundError):
        await resolve(sandbox.commands.connect("no-such-command").logs())


async def test_pty_types_resizes_signals_and_exits(api, sandbox):
    t = await resolve(sandbox.pty.create(cols=100, rows=30, cwd="/tmp"))
    try:
        await resolve(t.send_input("stty size; pwd\r"))
        await resolve(t.read_until("30 100\r\n/tmp\r\n"))
        await resolve(t.resize(120, 40))
        await resolve(t.send_input("stty size\r"))
        await resolve(t.read_until("40 120\r\n"))
        await resolve(t.send_input("sleep 100\r"))
        time.sleep(0.3)
        await resolve(t.signal("SIGINT"))
        await resolve(t.send_input("echo after-$((40+2))\r"))
        await resolve(t.read_until("after-42"))
        await resolve(t.send_input("exit 7\r"))
        chunks = []
        assert await resolve(t.wait(on_data=chunks.append)) == 7
        assert t.exit_code == 7
    finally:
        await resolve(t.close())


async def test_pty_outlives_its_connection_and_replays(api, sandbox):
    t = await resolve(sandbox.pty.create())
    await resolve(t.send_input("echo first-$((1+1))\r"))
    await resolve(t.read_until("first-2\r\n"))
    await resolve(t.close())
    again = await resolve(sandbox.pty.connect(t.id, since=0))
    try:
        ev = await resolve(again.next_event(10))
        assert ev.kind == "output" and ev.channel == 3 and ev.offset == 0
        assert b"first-2\r\n" in ev.data
        with pytest.raises(CoveError) as e:  # one client at a time
            await resolve(sandbox.pty.connect(t.id))
        assert e.value.status == 409
        await resolve(again.send_input("echo second-$((1+2))\r"))
        await resolve(again.read_until("second-3"))
    finally:
        assert await resolve(again.kill()) is True
    with pytest.raises(NotFoundError) as e:
        await resolve(sandbox.pty.connect(t.id))
    assert e.value.code == "CONTEXT_NOT_FOUND"


async def test_a_refused_pty_upgrade_leaves_no_socket_open(api, sandbox):
    def sockets():
        n = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
            except OSError:
                pass  # the directory's own descriptor, closed by now
        return n
    await resolve(sandbox.get_info())  # the client's own pooled connection made first
    before = sockets()
    for _ in range(5):
        with pytest.raises(NotFoundError):
            await resolve(sandbox.pty.connect("no-such-pty"))
    assert sockets() <= before


async def test_pty_with_a_command(api, sandbox):
    t = await resolve(sandbox.pty.create(command="echo from-command; exit 3"))
    out = []
    assert await resolve(t.wait(on_data=out.append)) == 3
    assert b"from-command" in b"".join(out)
    await resolve(t.close())
