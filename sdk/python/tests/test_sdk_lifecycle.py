"""Lifecycle through cove.Sandbox and cove.aio.Sandbox: create with every option, connect,
list with filters, pause/resume, timeouts, endpoints, kill, the context managers (killing on
success and on exception), configuration from the CLI's variables and the state dir, and
the typed errors with the API's codes."""

import datetime as dt
import http.client
import urllib.parse

import pytest

import cove
import cove.aio
from cove.errors import (AuthenticationError, ConflictError, CoveError, InvalidRequestError,
                         NotFoundError, ServerUnreachableError)

from sdkutil import resolve

pytestmark = pytest.mark.anyio


def state_of(coved, sid):
    status, body, _ = coved.request("GET", f"/v1/sandboxes/{sid}")
    return body["status"]["state"] if status == 200 else status


async def test_create_with_options_and_get_info(api, conn, coved):
    sb = await resolve(api.Sandbox.create(
        template="base", timeout=600, envs={"GREETING": "hello"},
        metadata={"project": "sdk", "owner": "tests"},
        resources={"cpu": "1", "memory": "256Mi"}, **conn))
    try:
        assert isinstance(sb, api.Sandbox)
        info = await resolve(sb.get_info())
        assert info.sandbox_id == sb.sandbox_id == sb.id
        assert info.state == "Running" and info.template == "base"
        assert info.metadata == {"project": "sdk", "owner": "tests"}
        assert info.resources["memory"] == "256Mi" and info.resources["cpu"] == "1"
        left = (info.expires_at - dt.datetime.now(dt.timezone.utc)).total_seconds()
        assert 500 < left <= 600, left
        assert isinstance(info.created_at, dt.datetime)
        r = await resolve(sb.commands.run("echo $GREETING"))
        assert r.stdout == "hello\n"
        assert await resolve(sb.is_running())
    finally:
        assert await resolve(sb.kill()) is True
        await resolve(sb.close())
    assert state_of(coved, sb.sandbox_id) == 404
    # Killing again is not an error: it says it was gone.
    again = api.Sandbox(sb.sandbox_id, cove.ConnectionConfig.resolve(**conn))
    assert await resolve(again.kill()) is False
    await resolve(again.close())


async def test_network_policy_is_sent(api, conn, coved):
    sb = await resolve(api.Sandbox.create(
        network={"defaultAction": "deny", "egress": [{"action": "allow",
                                                       "target": "example.com"}]}, **conn))
    try:
        status, body, _ = coved.request("GET", f"/sandboxes/{sb.sandbox_id}/proxy/18080/policy")
        assert status == 200, body
        assert body["mode"] == "deny_all", body
        assert [r["target"] for r in body["policy"]["egress"]] == ["example.com"]
    finally:
        await resolve(sb.kill())
        await resolve(sb.close())


async def test_create_without_timeout_never_expires(api, conn):
    sb = await resolve(api.Sandbox.create(timeout=None, **conn))
    try:
        assert (await resolve(sb.get_info())).expires_at is None
        with pytest.raises(ConflictError) as e:  # nothing to renew
            await resolve(sb.set_timeout(600))
        assert e.value.code == "SANDBOX::NO_EXPIRATION" and e.value.status == 409
    finally:
        await resolve(sb.kill())
        await resolve(sb.close())


async def test_create_timeout_as_float_or_timedelta(api, conn):
    """coved takes whole seconds; a float (timedelta.total_seconds()) or a timedelta is one."""
    for timeout, seconds in ((dt.timedelta(minutes=5).total_seconds(), 300),
                             (dt.timedelta(minutes=2), 120), (90.2, 91)):
        sb = await resolve(api.Sandbox.create(timeout=timeout, **conn))
        try:
            info = await resolve(sb.get_info())
            assert (info.expires_at - info.created_at).total_seconds() == seconds
        finally:
            await resolve(sb.kill())
            await resolve(sb.close())


async def test_set_timeout_moves_the_expiry(api, sandbox):
    before = (await resolve(sandbox.get_info())).expires_at
    new = await resolve(sandbox.set_timeout(3600))
    assert new > before
    assert abs((new - dt.datetime.now(dt.timezone.utc)).total_seconds() - 3600) < 30
    assert (await resolve(sandbox.get_info())).expires_at == new


async def test_connect_list_and_filters(api, conn, coved):
    a = await resolve(api.Sandbox.create(metadata={"suite": "sdk-list", "n": "1"}, **conn))
    b = await resolve(api.Sandbox.create(metadata={"suite": "sdk-list", "n": "2"}, **conn))
    try:
        again = await resolve(api.Sandbox.connect(a.sandbox_id, **conn))
        assert (await resolve(again.commands.run("echo same"))).stdout == "same\n"
        await resolve(again.close())

        ids = {s.sandbox_id for s in await resolve(api.Sandbox.list(**conn))}
        assert {a.sandbox_id, b.sandbox_id} <= ids
        mine = await resolve(api.Sandbox.list(metadata={"suite": "sdk-list"}, **conn))
        assert {s.sandbox_id for s in mine} == {a.sandbox_id, b.sandbox_id}
        one = await resolve(api.Sandbox.list(metadata={"suite": "sdk-list", "n": "2"}, **conn))
        assert [s.sandbox_id for s in one] == [b.sandbox_id]

        await resolve(b.pause())
        paused = await resolve(api.Sandbox.list(state="Paused", **conn))
        assert b.sandbox_id in {s.sandbox_id for s in paused}
        assert a.sandbox_id not in {s.sandbox_id for s in paused}
        both = await resolve(api.Sandbox.list(state=["Paused", "Running"],
                                              metadata={"suite": "sdk-list"}, **conn))
        assert len(both) == 2
        # connect resumes a paused sandbox
        c = await resolve(api.Sandbox.connect(b.sandbox_id, **conn))
        assert (await resolve(c.get_info())).state == "Running"
        await resolve(c.close())
    finally:
        for s in (a, b):
            await resolve(s.kill())
            await resolve(s.close())


async def test_list_follows_every_page(api, conn, coved):
    made = [coved.create(metadata={"suite": "sdk-pages"}) for _ in range(3)]
    try:
        from cove import _protocol as p
        # pages of one: the SDK must follow hasNextPage to the end
        t = (cove.aio._transport.AsyncTransport if api.is_async else cove._transport.SyncTransport)(
            cove.ConnectionConfig.resolve(**conn))
        got = await resolve(t.run(p.op_list(None, {"suite": "sdk-pages"}, page_size=1)))
        await resolve(t.close())
        assert sorted(s.sandbox_id for s in got) == sorted(made)
    finally:
        for sid in made:
            coved.delete(sid)


async def test_pause_resume_keeps_processes(api, sandbox, coved):
    h = await resolve(sandbox.commands.run("sleep 300", background=True))
    info = await resolve(sandbox.pause())
    assert info.state == "Paused" and state_of(coved, sandbox.sandbox_id) == "Paused"
    with pytest.raises(ConflictError) as e:
        await resolve(sandbox.pause())
    assert e.value.code == "SANDBOX::INVALID_STATE"
    info = await resolve(sandbox.resume())
    assert info.state == "Running"
    assert await resolve(h.is_running())
    assert await resolve(h.kill())


async def test_endpoints(api, sandbox, coved):
    url = await resolve(sandbox.get_url(8000))
    host = await resolve(sandbox.get_host(8000))
    assert url == f"http://{host}"
    assert host == f"127.0.0.1:{coved.port}/sandboxes/{sandbox.sandbox_id}/proxy/8000"
    ep = await resolve(sandbox.get_endpoint(8000))
    assert ep.url == url and isinstance(ep.headers, dict)
    # The URL and its headers reach a server in the sandbox.
    await resolve(sandbox.files.write("/tmp/www/hello.txt", "served"))
    await resolve(sandbox.commands.run(
        "cd /tmp/www && python3 -m http.server 8000 >/dev/null 2>&1", background=True))
    u = urllib.parse.urlsplit(url)
    for _ in range(100):
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
        c.request("GET", u.path + "/hello.txt", headers=ep.headers)
        r = c.getresponse()
        body = r.read()
        c.close()
        if r.status == 200:
            break
        import time
        time.sleep(0.1)
    assert (r.status, body) == (200, b"served")


def test_sync_with_kills_on_success_and_on_exception(conn, coved):
    with cove.Sandbox.create(**conn) as sb:
        sid = sb.sandbox_id
        assert state_of(coved, sid) == "Running"
    assert state_of(coved, sid) == 404
    with pytest.raises(ZeroDivisionError):
        with cove.Sandbox.create(**conn) as sb:
            sid = sb.sandbox_id
            1 / 0
    assert state_of(coved, sid) == 404


async def test_async_with_kills_on_success_and_on_exception(conn, coved):
    async with await cove.aio.Sandbox.create(**conn) as sb:
        sid = sb.sandbox_id
        assert state_of(coved, sid) == "Running"
    assert state_of(coved, sid) == 404

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        async with await cove.aio.Sandbox.create(**conn) as sb:
            sid = sb.sandbox_id
            await sb.commands.run("true")
            raise Boom()
    assert state_of(coved, sid) == 404


async def test_async_with_kills_when_cancelled(conn, coved):
    import anyio
    sid = None
    with anyio.move_on_after(2.0) as scope:
        async with await cove.aio.Sandbox.create(**conn) as sb:
            sid = sb.sandbox_id
            await sb.commands.run("sleep 30")  # cancelled half-way
    assert scope.cancel_called and sid is not None
    assert state_of(coved, sid) == 404


async def _held_answers_proxy(port, release):
    """A TCP proxy to coved on 127.0.0.1 that passes requests on at once and holds every
    answer back until `release` is set: the create is then in flight for as long as the test
    wants, however fast coved makes the sandbox."""
    import asyncio

    async def pump(reader, writer, gate):
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                if gate is not None:
                    await gate.wait()
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def serve(client_r, client_w):
        up_r, up_w = await asyncio.open_connection("127.0.0.1", port)
        await asyncio.gather(pump(client_r, up_w, None), pump(up_r, client_w, release))

    return await asyncio.start_server(serve, "127.0.0.1", 0)


async def test_create_cancelled_in_flight_leaves_no_sandbox(conn, coved):
    """A create cancelled (Task.cancel, as asyncio.wait_for does) while coved is making the
    sandbox still learns its id, kills it, and raises the cancellation."""
    import asyncio
    release = asyncio.Event()
    proxy = await _held_answers_proxy(coved.port, release)
    held = dict(conn, server=f"http://127.0.0.1:{proxy.sockets[0].getsockname()[1]}")
    try:
        for _ in range(3):
            release.clear()
            before = set(coved.known_sandboxes())
            task = asyncio.ensure_future(cove.aio.Sandbox.create(**held))
            for _ in range(30000):  # coved has the sandbox once it is in its store
                if set(coved.known_sandboxes()) - before or task.done():
                    break
                await asyncio.sleep(0.001)
            new = set(coved.known_sandboxes()) - before
            assert len(new) == 1 and not task.done()  # its answer is held back
            task.cancel()
            await asyncio.sleep(0.01)
            release.set()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert [state_of(coved, sid) for sid in new] == [404]
    finally:
        release.set()
        proxy.close()
        await proxy.wait_closed()


async def test_create_cancelled_by_a_scope_leaves_no_sandbox(conn, coved):
    import anyio
    before = set(coved.known_sandboxes())
    for delay in (0.01, 0.02, 0.03, 0.05):
        sb = None
        with anyio.move_on_after(delay):
            sb = await cove.aio.Sandbox.create(**conn)
        if sb is not None:  # it came back in time
            await sb.kill()
            await sb.close()
    new = set(coved.known_sandboxes()) - before
    assert [state_of(coved, sid) for sid in new] == [404] * len(new)


async def test_exception_in_with_survives_a_failed_kill(api, conn, coved):
    """The block's exception comes out even when the kill on exit cannot reach coved."""
    sb = await resolve(api.Sandbox.create(**conn))
    sid = sb.sandbox_id
    broken = api.Sandbox(sid, cove.ConnectionConfig.resolve(server="http://127.0.0.1:1",
                                                            api_key="x"))
    with pytest.raises(KeyError):
        if api.is_async:
            async with broken:
                raise KeyError("mine")
        else:
            with broken:
                raise KeyError("mine")
    assert state_of(coved, sid) == "Running"
    await resolve(sb.kill())
    await resolve(sb.close())


async def test_config_from_cli_variables(api, cove_env, coved):
    sb = await resolve(api.Sandbox.create())
    try:
        assert state_of(coved, sb.sandbox_id) == "Running"
    finally:
        await resolve(sb.kill())
        await resolve(sb.close())


def test_config_resolution_order(monkeypatch, tmp_path):
    for v in ("COVE_SERVER", "OPEN_SANDBOX_DOMAIN", "COVE_API_KEY", "OPEN_SANDBOX_API_KEY"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("COVE_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("COVE_CONFIG_FILE", str(tmp_path / "no-config.ini"))
    c = cove.ConnectionConfig.resolve()
    assert (c.server, c.api_key) == ("http://127.0.0.1:8080", None)
    (tmp_path / "api_key").write_text("from-state-dir\n")
    assert cove.ConnectionConfig.resolve().api_key == "from-state-dir"
    monkeypatch.setenv("OPEN_SANDBOX_DOMAIN", "10.0.0.1:9000/")
    monkeypatch.setenv("OPEN_SANDBOX_API_KEY", "os-key")
    c = cove.ConnectionConfig.resolve()
    assert (c.server, c.api_key) == ("http://10.0.0.1:9000", "os-key")
    monkeypatch.setenv("COVE_SERVER", "https://cove.example:8443")
    monkeypatch.setenv("COVE_API_KEY", "cove-key")
    c = cove.ConnectionConfig.resolve()
    assert (c.server, c.api_key) == ("https://cove.example:8443", "cove-key")
    c = cove.ConnectionConfig.resolve(server="127.0.0.9:1", api_key="arg")
    assert (c.server, c.api_key) == ("http://127.0.0.9:1", "arg")


def test_config_file_of_the_cli(monkeypatch, tmp_path):
    """What `cove config init` stores is what the SDK uses, below the variables, as the CLI
    does (`cove config show`)."""
    import json
    import subprocess
    from covetest import CLI
    for v in ("COVE_SERVER", "OPEN_SANDBOX_DOMAIN", "COVE_API_KEY", "OPEN_SANDBOX_API_KEY",
              "XDG_CONFIG_HOME"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("COVE_STATE_DIR", str(tmp_path))
    (tmp_path / "api_key").write_text("from-state-dir\n")
    monkeypatch.setenv("COVE_CONFIG_FILE", str(tmp_path / "cfg" / "config.ini"))
    subprocess.run([CLI, "config", "init", "--server", "127.0.0.7:7777", "--api-key",
                    "from-config"], check=True, stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL)
    shown = json.loads(subprocess.run([CLI, "config", "show", "-o", "json"], check=True,
                                      capture_output=True, text=True).stdout)
    c = cove.ConnectionConfig.resolve()
    assert (c.server, c.api_key) == ("http://127.0.0.7:7777", "from-config")
    assert (shown["server"], shown["apiKeySource"]) == ("http://127.0.0.7:7777", "config file")
    # a comment after a value, as the CLI's reader takes it
    (tmp_path / "cfg" / "config.ini").write_text("# mine\nserver = 127.0.0.8:8 ; old\n")
    assert cove.ConnectionConfig.resolve().server == "http://127.0.0.8:8"
    monkeypatch.setenv("COVE_SERVER", "127.0.0.9:9")
    monkeypatch.setenv("COVE_API_KEY", "from-env")
    c = cove.ConnectionConfig.resolve()
    assert (c.server, c.api_key) == ("http://127.0.0.9:9", "from-env")


async def test_key_from_the_state_dir(api, coved, monkeypatch, tmp_path):
    for v in ("COVE_API_KEY", "OPEN_SANDBOX_API_KEY", "OPEN_SANDBOX_DOMAIN"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("COVE_SERVER", f"127.0.0.1:{coved.port}")
    monkeypatch.setenv("COVE_STATE_DIR", str(tmp_path))
    (tmp_path / "api_key").write_text(coved.key + "\n")
    sb = await resolve(api.Sandbox.create())
    await resolve(sb.kill())
    await resolve(sb.close())


async def test_errors_carry_codes(api, conn, coved):
    with pytest.raises(AuthenticationError) as e:
        await resolve(api.Sandbox.list(server=conn["server"], api_key="wrong"))
    assert (e.value.status, e.value.code) == (401, "AUTH::INVALID_API_KEY")
    assert e.value.message == "invalid API key" and isinstance(e.value, CoveError)

    with pytest.raises(NotFoundError) as e:
        await resolve(api.Sandbox.connect("no-such-sandbox", **conn))
    assert (e.value.status, e.value.code) == (404, "SANDBOX::NOT_FOUND")
    assert "no-such-sandbox" in e.value.message

    with pytest.raises(InvalidRequestError) as e:
        await resolve(api.Sandbox.create(template="no-such-template", **conn))
    assert e.value.code == "SANDBOX::IMAGE_NOT_FOUND" and e.value.status == 400
    assert "no-such-template" in str(e.value)

    with pytest.raises(InvalidRequestError) as e:
        await resolve(api.Sandbox.create(resources={"cpu": "1", "gpus": "8"}, **conn))
    assert e.value.code == "SANDBOX::INVALID_PARAMETER"

    with pytest.raises(ServerUnreachableError) as e:
        await resolve(api.Sandbox.list(server="http://127.0.0.1:1", api_key="x"))
    assert e.value.code == "SDK::CONNECTION"
