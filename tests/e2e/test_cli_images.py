"""`cove image pull|ls|rm|prune|import` and `cove create --image` against a real coved and a real
registry (Debian's docker-registry on loopback, tests/registry_world.py, with images built by
tests/image_build.py): the pull's progress on stderr (a line per layer done, or one line
redrawn on a terminal), logins read from stdin, a row per reference, removal by the short
names people type, prune and import (from a file and from stdin), and the exit statuses (0
ok, 1 refused, 2 bad usage before any request)."""

import json
import os
import pty
import re
import secrets
import select
import subprocess
import time

import pytest

import image_build as ib
import registry_world as rw
from covetest import CLI, serve

UNREACHABLE = "http://127.0.0.1:1"
ADMIN = "cli-images-admin-key"
ADMIN_HEADERS = {"OPEN-SANDBOX-API-KEY": ADMIN}
VERBS = ("pull", "ls", "list", "rm", "prune", "import")


# ---- fixtures ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def coved():
    with serve(admin_keys=(ADMIN,)) as d:
        yield d


@pytest.fixture
def own_coved():
    """A daemon of the test's own: an image store with nothing in it (prune takes them all)."""
    with serve(admin_keys=(ADMIN,)) as d:
        yield d


@pytest.fixture(scope="module")
def registry():
    with rw.running_registry("none", address="127.77.2.8") as reg:
        yield reg


@pytest.fixture(scope="module")
def basic_registry():
    with rw.running_registry("basic", address="127.77.2.10") as reg:
        yield reg


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("cli-images")


def cli_env(d, server=None, admin=False):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COVE_", "OPEN_SANDBOX"))}
    env.update(COVE_SERVER=server or f"http://127.0.0.1:{d.port}",
               COVE_API_KEY=d.admin_key if admin else d.key,
               COVE_CONFIG_FILE=os.path.join(d.state_dir, "none.ini"))
    return env


def run(d, *args, check=True, server=None, input=None):
    # Removing, pruning and importing images take an admin key.
    admin = len(args) > 1 and args[0] == "image" and args[1] in ("rm", "prune", "import")
    r = subprocess.run([CLI, *args], capture_output=True, text=True,
                       env=cli_env(d, server, admin),
                       input=input, timeout=300)
    if check and r.returncode != 0:
        raise AssertionError(f"cove {args} -> {r.returncode}: {r.stderr}")
    return r


@pytest.fixture
def cove(coved):
    return lambda *args, **kw: run(coved, *args, **kw)


def push(reg, img, workdir, name=None):
    name = name or f"team/cli-{secrets.token_hex(4)}:v1"
    reg.push_image(img, name, workdir)
    return reg.ref(name)


def api_images(d):
    return d.ok("GET", "/v1/images")["items"]


def table(stdout):
    """A table's rows as lists of cells (columns are separated by three spaces or more)."""
    lines = stdout.splitlines()
    return [re.split(r" {3,}", line.strip()) for line in lines]


# ---- help and usage: no server needed ------------------------------------------------------

def test_help_of_the_group_and_each_verb(cove):
    out = cove("image", "--help").stdout
    assert out.startswith("Usage: cove image COMMAND")
    for verb in ("pull", "ls, list", "rm", "prune", "import"):
        assert f"\n  {verb} " in out, verb
    for verb in VERBS:
        r = cove("image", verb, "--help", server=UNREACHABLE)
        assert r.returncode == 0 and r.stdout.startswith(f"Usage: cove image {verb}"), verb
    assert "--password-stdin" in cove("image", "pull", "--help").stdout
    assert "--reference NAME:TAG" in cove("image", "import", "--help").stdout
    create = cove("create", "--help").stdout
    assert "--image-username USER" in create and "--image-password-stdin" in create
    # listed in `cove --help`, the completion and the man page
    assert "\n  image " in cove("--help").stdout
    bash = cove("completion", "bash").stdout
    assert '"image") echo "pull ls list rm prune import" ;;' in bash
    assert '"image pull") echo " --username --password-stdin -q --quiet" ;;' in bash
    assert '"image import") echo " --reference" ;;' in bash
    assert "--image-username" in bash.split('"create") echo "')[1].split(";;")[0]
    page = cove("help", "--man").stdout
    for verb in VERBS:
        assert f'.SS "cove image {verb}"' in page


@pytest.mark.parametrize("args", [
    ["image"], ["image", "nope"], ["image", "pull"], ["image", "pull", "a", "b"],
    ["image", "pull", ""], ["image", "pull", "--bogus", "a"],
    ["image", "pull", "--password-stdin", "a"], ["image", "pull", "--username", "u", "a"],
    ["image", "pull", "--username", "", "--password-stdin", "a"],
    ["image", "ls", "extra"], ["image", "list", "--bogus"], ["image", "rm"],
    ["image", "prune", "extra"], ["image", "import"], ["image", "import", "a", "b"],
    ["image", "import", "--reference", "", "a"], ["image", "ls", "-o", "xml"],
    ["create", "--image-password-stdin", "--image", "x"],
    ["create", "--image-username", "u", "--image", "x"],
    ["create", "--snapshot", "s", "--image-username", "u", "--image-password-stdin"],
])
def test_usage_errors_are_exit_2_before_any_request(cove, args):
    r = cove(*args, check=False, server=UNREACHABLE, input="secret\n")
    assert r.returncode == 2, (args, r.stderr)
    assert r.stdout == ""
    if args != ["image"]:
        assert "Run 'cove " in r.stderr, r.stderr


def test_an_empty_password_on_stdin_is_a_usage_error(cove):
    for stdin in ("", "\n", "\r\n"):
        r = cove("image", "pull", "--username", "u", "--password-stdin", "x", check=False,
                 server=UNREACHABLE, input=stdin)
        assert r.returncode == 2 and "no password on stdin" in r.stderr, (stdin, r.stderr)
    r = cove("image", "pull", "--username", "u", "--password-stdin", "x", check=False,
             server=UNREACHABLE, input="p" * 5000)
    assert r.returncode == 2 and "longer than" in r.stderr, r.stderr


def test_an_unreachable_server_is_exit_3(cove, tmp_path):
    archive = tmp_path / "a.tar"
    archive.write_bytes(b"")
    for args in (["image", "pull", "busybox"], ["image", "ls"], ["image", "rm", "busybox"],
                 ["image", "prune"], ["image", "import", str(archive)]):
        r = cove(*args, check=False, server=UNREACHABLE)
        assert r.returncode == 3 and "CLI::UNREACHABLE" in r.stderr, (args, r.stderr)


def test_import_of_a_missing_file_a_directory_or_a_terminal_is_refused(coved, cove, tmp_path):
    r = cove("image", "import", str(tmp_path / "missing.tar"), check=False)
    assert r.returncode == 1 and "CLI::LOCAL_FILE" in r.stderr and r.stdout == ""
    r = cove("image", "import", str(tmp_path), check=False)
    assert r.returncode == 2 and "is a directory" in r.stderr and r.stdout == ""
    # "-" with a terminal on stdin: nothing to read, said at once instead of waiting
    master, slave = pty.openpty()
    try:
        r = subprocess.run([CLI, "image", "import", "-"], stdin=slave, capture_output=True,
                           text=True, env=cli_env(coved, UNREACHABLE), timeout=60)
    finally:
        os.close(slave)
        os.close(master)
    assert r.returncode == 2 and "stdin is a terminal" in r.stderr and r.stdout == ""


# ---- pull ----------------------------------------------------------------------------------

def pulling_lines(stderr, uri):
    lines = stderr.splitlines()
    return [l for l in lines if l.startswith(f"pulling {uri}")], lines


def test_pull_prints_the_id_and_a_line_per_layer_done(coved, cove, registry, workdir):
    img = ib.unique_image(512 << 10)
    uri = push(registry, img, workdir)
    # slow enough for several looks at the pull (every 250 ms), fast enough for a test
    registry.proxy.slow_blobs(chunk=32 << 10, delay=0.05)
    try:
        r = cove("image", "pull", uri)
    finally:
        registry.proxy.release()
    assert r.stdout == img.id + "\n"
    progress, lines = pulling_lines(r.stderr, uri)
    assert progress, r.stderr
    # a line per change, not a flood: no line twice, layers done never going back
    assert len(progress) == len(set(progress)), progress
    assert len(progress) <= 2 * len(img.layers) + 2, progress
    done = [int(m.group(1)) for m in
            (re.search(r": (\d+)/%d layers, " % len(img.layers), l) for l in progress) if m]
    assert done and done == sorted(done), progress
    assert lines[-1].startswith(f"pulled {uri}: {len(img.layers)} layers, "), lines
    assert "\r" not in r.stderr and "\033" not in r.stderr
    assert [i["id"] for i in api_images(coved)].count(img.id) == 1

    # pulled again: the same id, with -o json the API's image; -q shows nothing
    r = cove("image", "pull", "-q", uri, "-o", "json")
    body = json.loads(r.stdout)
    assert body["id"] == img.id and uri in body["references"] and r.stderr == ""
    assert coved.request("DELETE", f"/v1/images/{img.id}", headers=ADMIN_HEADERS)[0] == 204


def test_pull_on_a_terminal_redraws_one_line(coved, registry, workdir):
    img = ib.unique_image(512 << 10)
    uri = push(registry, img, workdir)
    registry.proxy.slow_blobs(chunk=32 << 10, delay=0.05)
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen([CLI, "image", "pull", uri], stdout=subprocess.PIPE,
                                stderr=slave, stdin=subprocess.DEVNULL, env=cli_env(coved))
        os.close(slave)
        seen = b""
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if not select.select([master], [], [], 1)[0]:
                continue
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the child closed its end
                break
            if not chunk:
                break
            seen += chunk
        out, _ = proc.communicate(timeout=300)
    finally:
        registry.proxy.release()
        os.close(master)
    assert proc.returncode == 0, seen
    assert out.decode() == img.id + "\n"
    text = seen.decode()
    assert f"\rpulling {uri}" in text and "\033[K" in text, text
    # one line in all: redrawn with \r, ended once, by what was pulled
    assert text.count("\n") == 1 and text.endswith("\n"), repr(text)
    assert f"\rpulled {uri}: {len(img.layers)} layers, " in text, repr(text)
    assert coved.request("DELETE", f"/v1/images/{img.id}", headers=ADMIN_HEADERS)[0] == 204


def test_pull_errors_are_the_servers_and_exit_1(cove, registry):
    r = cove("image", "pull", registry.ref("team/no-such-image:v1"), check=False)
    assert r.returncode == 1 and r.stdout == ""
    assert "IMAGE::NOT_FOUND" in r.stderr, r.stderr
    # a progress line, if one was shown, is ended before the error
    assert r.stderr.splitlines()[-1].startswith("cove: IMAGE::NOT_FOUND: "), r.stderr
    r = cove("image", "pull", "team/UPPER:v1", check=False)
    assert r.returncode == 1 and "IMAGE::INVALID_REFERENCE" in r.stderr and r.stdout == ""
    r = cove("image", "pull", f"127.77.2.11:{rw.closed_port('127.77.2.11')}/team/x:v1",
             check=False)
    assert r.returncode == 1 and "IMAGE::REGISTRY_ERROR" in r.stderr and r.stdout == ""


def test_pull_with_a_login_read_from_stdin(coved, cove, basic_registry, workdir):
    img = ib.unique_image(4096)
    uri = push(basic_registry, img, workdir)
    r = cove("image", "pull", uri, check=False)
    assert r.returncode == 1 and "IMAGE::UNAUTHORIZED" in r.stderr
    r = cove("image", "pull", "--username", rw.USER, "--password-stdin", uri, check=False,
             input="wrong-password\n")
    assert r.returncode == 1 and "IMAGE::UNAUTHORIZED" in r.stderr and r.stdout == ""
    r = cove("image", "pull", "--username", rw.USER, "--password-stdin", uri,
             input=rw.PASSWORD + "\n")
    assert r.stdout == img.id + "\n"
    assert rw.PASSWORD not in json.dumps(api_images(coved))
    assert coved.request("DELETE", f"/v1/images/{img.id}", headers=ADMIN_HEADERS)[0] == 204


# ---- ls ------------------------------------------------------------------------------------

def test_ls_has_a_row_per_reference(coved, cove, registry, workdir):
    img = ib.unique_image(4096)
    one = push(registry, img, workdir)
    two = push(registry, img, workdir)  # the same image under a second name
    cove("image", "pull", "-q", one)
    cove("image", "pull", "-q", two)
    api = [i for i in api_images(coved) if i["id"] == img.id]
    assert len(api) == 1 and set(api[0]["references"]) == {one, two}, api
    for verb in ("ls", "list"):
        rows = table(cove("image", verb).stdout)
        assert rows[0] == ["ID", "REFERENCE", "SIZE", "LAYERS", "IN USE", "CREATED"], rows[0]
        mine = [row for row in rows[1:] if row[0] == img.id[:12]]
        assert sorted(row[1] for row in mine) == sorted([one, two]), rows
        for row in mine:
            assert re.fullmatch(r"\d+(\.\d)? (B|KiB|MiB|GiB)", row[2]), row
            assert row[3] == str(len(img.layers)) and row[4] == "0", row
            assert row[5] == api[0]["createdAt"], row
    # -o json: the API's answer as it is
    assert json.loads(cove("image", "ls", "-o", "json").stdout) == coved.ok("GET", "/v1/images")
    assert coved.request("DELETE", f"/v1/images/{img.id}", headers=ADMIN_HEADERS)[0] == 204
    assert img.id[:12] not in cove("image", "ls").stdout


# ---- rm ------------------------------------------------------------------------------------

def import_file(d, tmp_path, data, *extra):
    path = tmp_path / f"archive-{secrets.token_hex(3)}.tar"
    path.write_bytes(data)
    return run(d, "image", "import", str(path), *extra)


def test_rm_by_the_short_names_people_type(coved, cove, registry, workdir, tmp_path):
    # docker.io names, which only an import can give here (no pulls from the internet)
    img = ib.unique_image(4096)
    short = f"cli-rm-{secrets.token_hex(3)}"
    import_file(coved, tmp_path, ib.docker_save_archive(img, [f"{short}:v1"]))
    # (a docker-save archive holds no manifest: the id is not the registry's)
    found = [i for i in api_images(coved) if f"docker.io/library/{short}:v1" in i["references"]]
    assert len(found) == 1 and found[0]["references"] == [f"docker.io/library/{short}:v1"], found
    saved_id = found[0]["id"]
    r = cove("image", "rm", f"{short}:v2", check=False)  # another tag: not this image
    assert r.returncode == 1 and "IMAGE::NOT_FOUND" in r.stderr and r.stdout == ""
    r = cove("image", "rm", short, check=False)  # that is :latest
    assert r.returncode == 1 and "IMAGE::NOT_FOUND" in r.stderr
    assert cove("image", "rm", f"{short}:v1").stdout == saved_id + "\n"
    assert saved_id not in [i["id"] for i in api_images(coved)]

    # on a registry of its own: no tag means :latest; by a prefix of the id; sha256:ID
    img2 = ib.unique_image(4096)
    repo = f"team/cli-rm-{secrets.token_hex(3)}"
    latest = push(registry, img2, workdir, f"{repo}:latest")
    cove("image", "pull", "-q", latest)
    assert cove("image", "rm", f"{registry.host}/{repo}").stdout == img2.id + "\n"
    cove("image", "pull", "-q", latest)
    assert cove("image", "rm", img2.id[:12]).stdout == img2.id + "\n"
    cove("image", "pull", "-q", latest)
    assert cove("image", "rm", "sha256:" + img2.id).stdout == img2.id + "\n"
    assert img2.id not in [i["id"] for i in api_images(coved)]


def test_rm_reports_each_failure_and_removes_the_rest(coved, cove, registry, workdir):
    a, b = ib.unique_image(4096), ib.unique_image(4096)
    ref_a, ref_b = push(registry, a, workdir), push(registry, b, workdir)
    ref_a2 = push(registry, a, workdir)
    for ref in (ref_a, ref_a2, ref_b):
        cove("image", "pull", "-q", ref)
    r = cove("image", "rm", "no-such-image:v1", ref_a, "NOT A REFERENCE", ref_a2, "0" * 64,
             ref_b, check=False)
    assert r.returncode == 1
    # two names of one image: removed once, printed once
    assert r.stdout == f"{a.id}\n{b.id}\n", r.stdout
    errors = [l for l in r.stderr.splitlines() if l.startswith("cove: ")]
    assert len(errors) == 3, r.stderr
    assert "IMAGE::NOT_FOUND" in errors[0] and "no-such-image:v1" in errors[0]
    assert "IMAGE::INVALID_REFERENCE" in errors[1]
    assert "IMAGE::NOT_FOUND" in errors[2]  # the server's, for an id it does not have
    left = [i["id"] for i in api_images(coved)]
    assert a.id not in left and b.id not in left


@pytest.mark.static_agent
def test_rm_of_an_image_in_use_is_refused(coved, cove, registry, workdir):
    img = ib.unique_image(4096)
    uri = push(registry, img, workdir)
    sid = cove("create", "--image", uri, "--timeout", "0").stdout.strip()
    try:
        assert coved.get(sid)["image"]["uri"] == uri  # passed on as typed
        row = [r for r in table(cove("image", "ls").stdout) if r[0] == img.id[:12]]
        assert row and row[0][4] == "1", row
        r = cove("image", "rm", uri, check=False)
        assert r.returncode == 1 and "IMAGE::IN_USE" in r.stderr and r.stdout == ""
    finally:
        coved.delete(sid)
    assert cove("image", "rm", uri).stdout == img.id + "\n"


# ---- prune ---------------------------------------------------------------------------------

@pytest.mark.static_agent
def test_prune_prints_what_it_removed(own_coved, registry, workdir):
    d = own_coved
    unused, used = ib.unique_image(64 << 10), ib.unique_image(64 << 10)
    ref_unused, ref_used = push(registry, unused, workdir), push(registry, used, workdir)
    run(d, "image", "pull", "-q", ref_unused)
    sid = run(d, "create", "--image", ref_used, "--timeout", "0").stdout.strip()
    try:
        lines = run(d, "image", "prune").stdout.splitlines()
        assert lines[0] == unused.id, lines
        m = re.fullmatch(r"removed 1 image, freed (\d+(?:\.\d)?) (B|KiB|MiB|GiB)", lines[1])
        assert m and len(lines) == 2, lines
        assert [i["id"] for i in api_images(d)] == [used.id]
        body = json.loads(run(d, "image", "prune", "-o", "json").stdout)
        assert body == {"removed": [], "bytesFreed": 0}, body
        assert run(d, "image", "prune").stdout == "removed 0 images, freed 0 B\n"
    finally:
        d.delete(sid)
    lines = run(d, "image", "prune").stdout.splitlines()
    assert lines[0] == used.id and lines[1].startswith("removed 1 image, freed "), lines
    assert api_images(d) == []


# ---- import --------------------------------------------------------------------------------

def test_import_from_a_file_and_from_stdin(own_coved, tmp_path, workdir):
    d = own_coved
    saved = ib.unique_image(4096)
    tag = f"cove-test/cli-saved-{secrets.token_hex(3)}:v1"
    rows = table(import_file(d, tmp_path, ib.docker_save_archive(saved, [tag], "gzip")).stdout)
    assert rows[0][:2] == ["ID", "REFERENCE"]
    # (a docker-save archive holds no manifest: its id is not the registry's)
    assert rows[1][1] == "docker.io/" + tag and len(rows[1][0]) == 12, rows

    # an OCI layout through stdin, named by --reference, -o json: the API's items
    layout_img = ib.unique_image(4096)
    layout = ib.OciLayout(workdir / f"cli-import-{secrets.token_hex(3)}")
    layout.add(layout_img, "v1")
    name = f"127.0.0.1:5000/cli/imported-{secrets.token_hex(3)}:v2"
    r = subprocess.run([CLI, "image", "import", "-", "--reference", name, "-o", "json"],
                       input=layout.tar("gzip"), capture_output=True, env=cli_env(d, admin=True),
                       timeout=300)
    assert r.returncode == 0, r.stderr
    items = json.loads(r.stdout)["items"]
    assert [i["id"] for i in items] == [layout_img.id] and name in items[0]["references"], items
    ids = [i["id"] for i in api_images(d)]
    assert len(ids) == 2 and layout_img.id in ids and rows[1][0] in [i[:12] for i in ids], ids

    # not an archive: the server's error, exit 1, nothing added
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"this is not a tar archive" * 100)
    r = run(d, "image", "import", str(bad), check=False)
    assert r.returncode == 1 and r.stdout == "" and r.stderr.startswith("cove: "), r.stderr
    assert len(api_images(d)) == 2


# ---- create --image with a login -----------------------------------------------------------

@pytest.mark.static_agent
def test_create_with_an_image_login_read_from_stdin(coved, cove, basic_registry, workdir):
    img = ib.unique_image(4096)
    uri = push(basic_registry, img, workdir)
    r = cove("create", "--image", uri, check=False)
    assert r.returncode == 1 and "IMAGE::UNAUTHORIZED" in r.stderr and r.stdout == ""
    sid = cove("create", "--image", uri, "--image-username", rw.USER, "--image-password-stdin",
               "--timeout", "0", input=rw.PASSWORD + "\n").stdout.strip()
    try:
        assert coved.sh(sid, "cat /etc/layer2") == "from layer two\n"
        assert rw.PASSWORD not in json.dumps(coved.get(sid))
    finally:
        coved.delete(sid)
    assert coved.request("DELETE", f"/v1/images/{img.id}", headers=ADMIN_HEADERS)[0] == 204


@pytest.mark.static_agent
def test_create_of_an_image_runs_its_own_entrypoint(coved, cove, registry, workdir):
    """`cove create --image REF` without a command runs the image's Entrypoint and Cmd, as
    `docker run` does; an image alias (a template's) still gets the idle entrypoint; a command
    given runs instead."""
    busybox = ib.busybox_image()
    uri = push(registry, busybox, workdir)
    sid = cove("create", "--image", uri).stdout.strip()
    try:
        assert coved.get(sid)["entrypoint"] == ib.BUSYBOX_ENTRYPOINT + ib.BUSYBOX_CMD
        assert coved.sh(sid, "for i in $(seq 100); do test -s /tmp/entrypoint-ran && break; "
                        "sleep 0.05; done; cat /tmp/entrypoint-ran") == "hello from 1000\n"
    finally:
        coved.delete(sid)
    sid = cove("create", "--image", uri, "/bin/sleep", "600").stdout.strip()
    try:
        assert coved.get(sid)["entrypoint"] == ["/bin/sleep", "600"]
    finally:
        coved.delete(sid)
    # an alias of a template (opensandbox/code-interpreter -> code-interpreter): idle, Running
    sid = cove("create", "--image", "opensandbox/code-interpreter:v1.0.1").stdout.strip()
    try:
        body = coved.get(sid)
        assert body["status"]["state"] == "Running" and body["entrypoint"][0] == "/bin/sh"
    finally:
        coved.delete(sid)
