"""sandbox.files through both APIs: write (str, bytes, binary and text files, owner and
mode), read (text, bytes, stream), list, exists, get_info, remove, rename, make_dir, errors,
and a 200 MB upload and download that are streamed (the client's memory stays flat)."""

import hashlib
import io
import os
import resource

import pytest

from cove.errors import NotFoundError

from sdkutil import collect, resolve

pytestmark = pytest.mark.anyio


async def test_write_and_read_every_kind(api, sandbox, coved):
    f = sandbox.files
    info = await resolve(f.write("/home/user/a.txt", "héllo\n"))
    assert (info.path, info.name, info.type, info.size) == ("/home/user/a.txt", "a.txt",
                                                            "file", len("héllo\n".encode()))
    assert await resolve(f.read("/home/user/a.txt")) == "héllo\n"
    assert coved.sh(sandbox.sandbox_id, "cat /home/user/a.txt") == "héllo\n"

    blob = bytes(range(256)) * 40
    await resolve(f.write("/home/user/deep/er/blob.bin", blob))  # parents are made
    assert await resolve(f.read("/home/user/deep/er/blob.bin", format="bytes")) == blob
    chunks = await collect(await resolve(f.read("/home/user/deep/er/blob.bin", format="stream")))
    assert b"".join(chunks) == blob

    await resolve(f.write("/tmp/from-file", io.BytesIO(b"binary file object")))
    assert await resolve(f.read("/tmp/from-file")) == "binary file object"
    await resolve(f.write("/tmp/from-text", io.StringIO("text file object ✓")))
    assert await resolve(f.read("/tmp/from-text")) == "text file object ✓"
    await resolve(f.write("/tmp/empty", b""))
    assert await resolve(f.read("/tmp/empty", format="bytes")) == b""
    await resolve(f.write("/tmp/from-file", "replaced"))  # overwrite
    assert await resolve(f.read("/tmp/from-file")) == "replaced"

    info = await resolve(f.write("/home/user/secret", "s", user="user", mode=0o600))
    assert (info.owner, info.group, info.mode) == ("user", "user", 0o600)
    assert coved.sh(sandbox.sandbox_id, "stat -c '%U %a' /home/user/secret") == "user 600\n"

    with pytest.raises(TypeError):
        await resolve(f.write("/tmp/x", 42))


async def test_list_exists_info_rename_remove_make_dir(api, sandbox):
    f = sandbox.files
    assert await resolve(f.make_dir("/home/user/proj/src")) is True
    assert await resolve(f.make_dir("/home/user/proj/src")) is False
    await resolve(f.write("/home/user/proj/README.md", "# readme"))
    await resolve(f.write("/home/user/proj/src/main.py", "print(1)"))

    top = await resolve(f.list("/home/user/proj"))
    assert [(e.name, e.type) for e in top] == [("README.md", "file"), ("src", "directory")]
    deep = await resolve(f.list("/home/user/proj", depth=2))
    assert [e.path for e in deep] == ["/home/user/proj/README.md", "/home/user/proj/src",
                                      "/home/user/proj/src/main.py"]

    assert await resolve(f.exists("/home/user/proj/README.md"))
    assert await resolve(f.exists("/home/user/proj/src"))
    assert not await resolve(f.exists("/home/user/proj/nothing"))
    info = await resolve(f.get_info("/home/user/proj/src"))
    assert info.type == "directory" and info.mode == 0o755

    moved = await resolve(f.rename("/home/user/proj/README.md", "/home/user/proj/src/README"))
    assert moved.path == "/home/user/proj/src/README" and moved.size == len("# readme")
    assert not await resolve(f.exists("/home/user/proj/README.md"))
    assert await resolve(f.read("/home/user/proj/src/README")) == "# readme"

    await resolve(f.remove("/home/user/proj/src/main.py"))
    assert not await resolve(f.exists("/home/user/proj/src/main.py"))
    await resolve(f.remove("/home/user/proj"))  # a directory, with what is in it
    assert not await resolve(f.exists("/home/user/proj"))


async def test_file_errors_carry_codes(api, sandbox):
    f = sandbox.files
    for call in (lambda: f.read("/no/such/file"), lambda: f.get_info("/no/such/file"),
                 lambda: f.remove("/no/such/file")):
        with pytest.raises(NotFoundError) as e:
            await resolve(call())
        assert e.value.code == "FILE_NOT_FOUND" and e.value.status == 404, e.value
        assert "/no/such/file" in e.value.message
    with pytest.raises(Exception) as e:
        await resolve(f.write("/tmp", "a directory is not a file"))
    assert e.value.code == "INVALID_REQUEST_BODY" and e.value.status == 400


def max_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


SIZE = 200 * 1024 * 1024


@pytest.fixture(scope="module")
def big_file(tmp_path_factory):
    """200 MiB of distinct MiB blocks on the local disk, and its sha256."""
    path = tmp_path_factory.mktemp("big") / "big.bin"
    digest = hashlib.sha256()
    block = bytearray(os.urandom(1 << 20))
    with open(path, "wb") as out:
        for i in range(SIZE >> 20):
            block[:8] = i.to_bytes(8, "little")
            out.write(block)
            digest.update(block)
    yield path, digest.hexdigest()
    os.unlink(path)


async def test_failed_download_leaves_the_local_file(api, sandbox, tmp_path):
    local = tmp_path / "precious.txt"
    local.write_text("mine\n")
    os.chmod(local, 0o640)
    with pytest.raises(NotFoundError):
        await resolve(sandbox.files.download("/no/such/file", str(local)))
    assert local.read_text() == "mine\n"
    assert sorted(os.listdir(tmp_path)) == ["precious.txt"]  # no temporary file left
    await resolve(sandbox.files.write("/tmp/new.txt", "theirs"))
    assert await resolve(sandbox.files.download("/tmp/new.txt", local)) == 6
    assert local.read_text() == "theirs" and os.stat(local).st_mode & 0o777 == 0o640
    fresh = tmp_path / "fresh.txt"
    assert await resolve(sandbox.files.download("/tmp/new.txt", str(fresh))) == 6
    mask = os.umask(0)
    os.umask(mask)
    assert os.stat(fresh).st_mode & 0o777 == 0o666 & ~mask
    assert await resolve(sandbox.files.download("/tmp/new.txt", os.devnull)) == 6


async def test_200mb_streamed_upload_and_download(api, conn, big_file, tmp_path):
    path, digest = big_file
    sb = await resolve(api.Sandbox.create(
        resources={"cpu": "1", "memory": "1Gi", "ephemeral-storage": "512Mi"}, **conn))
    try:
        rss_before = max_rss_mib()
        info = await resolve(sb.files.upload(str(path), "/home/user/big.bin"))
        assert info.size == SIZE
        r = await resolve(sb.commands.run("sha256sum /home/user/big.bin"))
        assert r.stdout.split()[0] == digest

        back = tmp_path / "back.bin"
        assert await resolve(sb.files.download("/home/user/big.bin", str(back))) == SIZE
        got = hashlib.sha256()
        with open(back, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                got.update(block)
        assert got.hexdigest() == digest
        # Neither direction held the file in memory.
        assert max_rss_mib() - rss_before < 64, (rss_before, max_rss_mib())
    finally:
        await resolve(sb.kill())
        await resolve(sb.close())
