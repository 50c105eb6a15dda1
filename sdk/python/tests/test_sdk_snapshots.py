"""Snapshots through cove.Sandbox and cove.aio.Sandbox: take one (waiting until Ready), make
a sandbox from it (``snapshot=``) that has the files, list with filters, get, delete (refused
while in use, with the server's code), and the typed errors."""

import pytest

import cove
from cove.errors import ConflictError, NotFoundError, SandboxStateError

from sdkutil import resolve

pytestmark = pytest.mark.anyio


async def test_snapshot_create_from_list_delete(api, conn, sandbox):
    await resolve(sandbox.files.write("/root/notes.txt", "kept across the snapshot"))
    await resolve(sandbox.commands.run("rm -f /etc/os-release && mkdir -p /srv/data && "
                                       "seq 1000 > /srv/data/n"))
    snap = await resolve(sandbox.snapshot(name="sdk-test"))
    assert isinstance(snap, cove.SnapshotInfo)
    assert snap.state == "Ready" and snap.name == "sdk-test"
    assert snap.sandbox_id == sandbox.sandbox_id and snap.created_at is not None
    # The source runs on.
    assert (await resolve(sandbox.commands.run("echo alive"))).stdout == "alive\n"

    listed = await resolve(api.Sandbox.list_snapshots(sandbox_id=sandbox.sandbox_id, **conn))
    assert [s.snapshot_id for s in listed] == [snap.snapshot_id]
    assert await resolve(api.Sandbox.list_snapshots(name="no-such-name", **conn)) == []
    assert [s.snapshot_id for s in await resolve(api.Sandbox.list_snapshots(
        state=["Ready", "Failed"], sandbox_id=sandbox.sandbox_id, **conn))] == [snap.snapshot_id]
    got = await resolve(api.Sandbox.get_snapshot(snap.snapshot_id, **conn))
    assert got.snapshot_id == snap.snapshot_id and got.state == "Ready"

    child = await resolve(api.Sandbox.create(snapshot=snap, **conn))
    try:
        info = await resolve(child.get_info())
        assert info.raw["snapshotId"] == snap.snapshot_id and info.template == "base"
        assert await resolve(child.files.read("/root/notes.txt")) == "kept across the snapshot"
        r = await resolve(child.commands.run("wc -l < /srv/data/n; test -e /etc/os-release "
                                             "&& echo yes || echo no"))
        assert r.stdout == "1000\nno\n"
        # In use: the server's 409 with its code, and the snapshot stays.
        with pytest.raises(ConflictError) as e:
            await resolve(api.Sandbox.delete_snapshot(snap, **conn))
        assert e.value.code == "SNAPSHOT::IN_USE"
    finally:
        await resolve(child.kill())
    # By id too (a string), once nothing uses it; a second delete finds nothing.
    assert await resolve(api.Sandbox.delete_snapshot(snap.snapshot_id, **conn)) is True
    assert await resolve(api.Sandbox.delete_snapshot(snap.snapshot_id, **conn)) is False
    with pytest.raises(NotFoundError) as e:
        await resolve(api.Sandbox.get_snapshot(snap.snapshot_id, **conn))
    assert e.value.code == "SNAPSHOT::NOT_FOUND"


async def test_snapshot_errors(api, conn, sandbox):
    await resolve(sandbox.pause())
    with pytest.raises(ConflictError):
        await resolve(sandbox.snapshot())
    await resolve(sandbox.resume())
    # A too deep tree cannot be captured: the SDK raises with the server's reason.
    await resolve(sandbox.commands.run(
        "cd /root && for i in $(seq 600); do mkdir d && cd d; done"))
    with pytest.raises(SandboxStateError) as e:
        await resolve(sandbox.snapshot())
    assert e.value.code == "SDK::SNAPSHOT_FAILED" and "512" in str(e.value)
    for s in await resolve(api.Sandbox.list_snapshots(sandbox_id=sandbox.sandbox_id, **conn)):
        assert s.state == "Failed"
        await resolve(api.Sandbox.delete_snapshot(s, **conn))
    with pytest.raises(NotFoundError):
        await resolve(api.Sandbox.create(snapshot="snap-nosuch", **conn))
