"""OCI images as templates (issue 13): images built here (tests/image_build.py), pushed with
skopeo to Debian's docker-registry on loopback (tests/registry_world.py: no auth, basic auth,
token auth), pulled by coved through POST /v1/images or a sandbox create, and run.

A sandbox made from an image runs the static agent inside the image's root (busybox, or python
with the host's libc): the sanitizer pass, whose agent is dynamic, leaves those tests out
(static_agent); the tests of the API alone run there too."""

import json
import os
import secrets
import threading
import time

import pytest

import image_build as ib
import registry_world as rw
from covetest import serve

ADMIN = "images-admin-key"
SLEEP = ["/bin/sleep", "3600"]
LIMITS = {"cpu": "1", "memory": "512Mi"}


# ---- fixtures --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("images")


@pytest.fixture(scope="module")
def busybox():
    return ib.busybox_image()


@pytest.fixture(scope="module")
def registry():
    with rw.running_registry("none", address="127.77.2.1") as reg:
        yield reg


@pytest.fixture(scope="module")
def basic_registry():
    with rw.running_registry("basic", address="127.77.2.2") as reg:
        yield reg


@pytest.fixture(scope="module")
def token_registry():
    with rw.running_registry("token", address="127.77.2.3") as reg:
        yield reg


@pytest.fixture(scope="module")
def coved():
    with serve(admin_keys=(ADMIN,)) as d:
        yield d


@pytest.fixture
def own_coved():
    """A daemon of the test's own: an empty image store, nothing cached."""
    with serve(admin_keys=(ADMIN,)) as d:
        yield d


@pytest.fixture
def made(coved):
    """Sandboxes to delete when the test ends (sid, daemon)."""
    out = []
    yield out
    for d, sid in out:
        try:
            d.delete(sid)
        except Exception:
            pass


# ---- helpers ---------------------------------------------------------------------------------

def create_raw(d, uri, auth=None, entrypoint=SLEEP, env=None, metadata=None, timeout=300):
    image = {"uri": uri}
    if auth is not None:
        image["auth"] = auth
    body = {"image": image, "resourceLimits": LIMITS}
    if entrypoint is not None:
        body["entrypoint"] = list(entrypoint)
    if env is not None:
        body["env"] = env
    if metadata is not None:
        body["metadata"] = metadata
    status, resp, _ = d.request("POST", "/v1/sandboxes", body, timeout=timeout)
    return status, resp


def create(d, uri, made=None, **kw):
    status, body = create_raw(d, uri, **kw)
    assert status == 202, (status, body)
    if made is not None:
        made.append((d, body["id"]))
    return body["id"]


def pull(d, uri, auth=None, timeout=300):
    body = {"uri": uri}
    if auth is not None:
        body["auth"] = auth
    status, resp, _ = d.request("POST", "/v1/images", body, timeout=timeout)
    return status, resp


def assert_error(status, body, want_status, code):
    assert status == want_status and isinstance(body, dict), (status, body)
    assert body.get("code") == code and body.get("message"), body


def admin(d, content_type="application/json"):
    """Headers with the daemon's admin key: removing, pruning and importing images."""
    return {"OPEN-SANDBOX-API-KEY": d.admin_key, "Content-Type": content_type}


def delete_image(d, key):
    return d.request("DELETE", f"/v1/images/{key}", headers=admin(d))[:2]


def prune(d):
    return d.ok("POST", "/v1/images/prune", headers=admin(d))


def images(d):
    return d.ok("GET", "/v1/images")["items"]


def image_by_digest(d, digest):
    found = [i for i in images(d) if i["digest"] == digest]
    return found[0] if found else None


def store(d, *parts):
    return os.path.join(d.state_dir, "images", *parts)


def listing(path):
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


def layer_dir(d, digest):
    return store(d, "layers", "sha256-" + digest.split(":", 1)[1])


def leftovers_now(d):
    """Half-made things in the store: temporary layers and files of an unfinished pull."""
    return ([n for n in listing(store(d, "layers")) if not n.startswith("sha256-")]
            + listing(store(d, "tmp")))


def leftovers(d, wait_s=10.0):
    """What is left half-made once coved has had a moment (removal may finish in the
    background after the answer); [] as soon as nothing is."""
    deadline = time.monotonic() + wait_s
    while True:
        left = leftovers_now(d)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def push(reg, img, workdir, name=None):
    name = name or f"team/img-{secrets.token_hex(4)}:v1"
    reg.push_image(img, name, workdir)
    return name


def auth_of(user, password):
    return {"username": user, "password": password}


def wait_for(pred, seconds=30, step=0.05, what="condition"):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(step)
    raise AssertionError(f"timed out waiting for {what}")


# ---- pulling and running ---------------------------------------------------------------------

@pytest.mark.static_agent
def test_create_by_tag_layers_whiteouts_hardlinks_and_config(coved, registry, busybox,
                                                             workdir, made):
    name = push(registry, busybox, workdir)
    sid = create(coved, registry.ref(name), made)
    # The whiteout removed the lower layer's file; the opaque directory hides what was under it.
    assert coved.exec(sid, "test -e /etc/removed-later").exit_code == 1
    assert coved.sh(sid, "ls -a /opt/lower").split() == [".", "..", "new"]
    assert coved.sh(sid, "cat /opt/lower/new /etc/layer2 /etc/motd") == \
        "upper new\nfrom layer two\nthree\n"
    # The hard link pair shares an inode.
    inodes = coved.sh(sid, "stat -c '%i %h' /data/hard1 /data/hard2").split("\n")
    assert inodes[0] == inodes[1] and inodes[0].split()[1] == "2", inodes
    assert coved.sh(sid, "cat /data/hard2") == "linked twice\n"
    # The config: User, WorkingDir, Env.
    assert coved.sh(sid, "id -u; id -g").split() == ["1000", "1000"]
    assert coved.sh(sid, "pwd") == "/work\n"
    env = coved.sh(sid, "env").split("\n")
    assert "GREETING=hello" in env and "PATH=/usr/local/bin:/usr/bin:/bin" in env, env
    assert coved.sh(sid, "cat hello.txt; stat -c '%u' /work/hello.txt") == \
        "hello from the image\n1000\n"
    # It is listed, with its reference, layers and size.
    img = image_by_digest(coved, busybox.digest)
    assert img is not None, images(coved)
    assert img["id"] == busybox.id
    assert registry.ref(name) in img["references"], img
    assert [l["digest"] for l in img["layers"]] == [l.digest for l in busybox.layers]
    assert img["size"] >= busybox.unpacked_size() // 2, img
    assert img["config"]["workingDir"] == "/work" and img["config"]["user"] == "1000:1000"
    assert "GREETING=hello" in img["config"]["env"]
    assert img["config"]["entrypoint"] == ib.BUSYBOX_ENTRYPOINT
    assert img["inUse"] >= 1
    assert leftovers(coved) == []


@pytest.mark.static_agent
def test_create_by_digest_runs_the_image_entrypoint_with_the_request_env(coved, registry,
                                                                         workdir, made):
    img = ib.unique_image(4096)
    name = push(registry, img, workdir)
    repo = name.split(":")[0]
    sid = create(coved, registry.ref(f"{repo}@{img.digest}"), made, entrypoint=None,
                 env={"GREETING": "hi from the request", "EXTRA": "1"})
    # Entrypoint + Cmd of the image ran (as the image's user), with the request's env on top.
    out = wait_for(lambda: coved.exec(sid, "cat /tmp/entrypoint-ran").stdout, 10,
                   what="the image's entrypoint")
    assert out == "hi from the request from 1000\n", out
    env = coved.sh(sid, "env").split("\n")
    assert "EXTRA=1" in env and "LAYERED=image" in env and "GREETING=hi from the request" in env
    listed = image_by_digest(coved, img.digest)
    assert listed and any(r.endswith("@" + img.digest) for r in listed["references"]), listed
    # Present now: a second create by digest asks the registry nothing; one by tag (not known
    # here yet) resolves the tag but downloads no layer again.
    registry.proxy.clear()
    sid2 = create(coved, registry.ref(f"{repo}@{img.digest}"), made)
    assert registry.proxy.requests() == []
    sid3 = create(coved, registry.ref(name), made)
    for other in (sid2, sid3):
        assert coved.sh(other, "cat /uniq/id") == coved.sh(sid, "cat /uniq/id")
    layer_gets = [r for r in registry.proxy.requests()
                  if any(r[1].endswith(l.digest) for l in img.layers)]
    assert layer_gets == [], registry.proxy.requests()


@pytest.mark.static_agent
def test_python_image_runs_python_and_the_default_entrypoint(coved, registry, busybox,
                                                             workdir, made):
    py = ib.python_image(busybox.layers[0])
    name = push(registry, py, workdir, "team/python:3.11-small")
    sid = create(coved, registry.ref(name), made, entrypoint=None)
    assert coved.get(sid)["status"]["state"] == "Running"
    out = coved.sh(sid, "python3 -c \"import json,csv,io; b=io.StringIO(); "
                        "csv.writer(b).writerow([1,'a']); "
                        "print(json.dumps({'csv': b.getvalue()}))\"")
    assert json.loads(out) == {"csv": "1,a\r\n"}
    assert coved.sh(sid, "id -u") == "0\n"
    # The busybox layer is the very blob of the busybox image: stored once.
    img = image_by_digest(coved, py.digest)
    assert img and img["layers"][0]["digest"] == busybox.layers[0].digest
    assert os.path.isdir(layer_dir(coved, busybox.layers[0].digest))


@pytest.mark.static_agent
def test_multi_platform_index_resolves_to_the_host_platform(coved, registry, busybox,
                                                             workdir, made):
    index = ib.multi_platform(busybox)
    name = push(registry, index, workdir, f"team/multi-{secrets.token_hex(3)}:v1")
    status, body = pull(coved, registry.ref(name))
    assert status == 200, body
    assert body["digest"] == busybox.digest, body  # the amd64 entry, not the arm64 one
    sid = create(coved, registry.ref(name), made)
    env = coved.sh(sid, "env")
    assert "PLATFORM=arm64" not in env and "GREETING=hello" in env


def test_pull_api_get_by_id_prefix_and_templates(coved, registry, workdir):
    img = ib.unique_image(4096)
    name = push(registry, img, workdir)
    status, body = pull(coved, registry.ref(name))
    assert status == 200, body
    assert body["id"] == img.id and body["digest"] == img.digest
    assert body["references"] == [registry.ref(name)], body
    assert [l["digest"] for l in body["layers"]] == [l.digest for l in img.layers]
    assert body["size"] > 0 and body["inUse"] == 0 and body["createdAt"]
    assert body["config"]["cmd"] == ib.BUSYBOX_CMD
    for key in (img.id, img.digest, img.id[:12]):
        assert coved.ok("GET", f"/v1/images/{key}")["id"] == img.id
    assert_error(*coved.request("GET", "/v1/images/" + "0" * 64)[:2], 404, "IMAGE::NOT_FOUND")
    templates = coved.ok("GET", "/v1/templates")["items"]
    mine = [t for t in templates if t["name"] == registry.ref(name)]
    assert mine and mine[0]["image"]["id"] == img.id and mine[0]["image"]["size"] > 0, templates
    # A second pull of the tag re-resolves it and downloads nothing.
    registry.proxy.clear()
    status, again = pull(coved, registry.ref(name))
    assert status == 200 and again["id"] == img.id
    assert registry.proxy.count("GET", "/blobs/") == 0
    # The tag moves to another image: a pull re-resolves it, and the tag leaves the old one.
    moved = ib.unique_image(4096)
    push(registry, moved, workdir, name)
    status, body = pull(coved, registry.ref(name))
    assert status == 200 and body["id"] == moved.id, body
    assert registry.ref(name) not in coved.ok("GET", f"/v1/images/{img.id}")["references"]
    for i in (img, moved):
        assert delete_image(coved, i.id)[0] == 204


# ---- authentication --------------------------------------------------------------------------

@pytest.mark.static_agent
def test_basic_auth_registry(coved, basic_registry, workdir, made):
    img = ib.unique_image(4096)
    name = push(basic_registry, img, workdir)
    uri = basic_registry.ref(name)
    status, body = create_raw(coved, uri)
    assert_error(status, body, 403, "IMAGE::UNAUTHORIZED")
    assert basic_registry.host in body["message"], body
    status, body = create_raw(coved, uri, auth=auth_of(rw.USER, "wrong-password"))
    assert_error(status, body, 403, "IMAGE::UNAUTHORIZED")
    assert_error(*pull(coved, uri, auth=auth_of("nobody", "x")), 403, "IMAGE::UNAUTHORIZED")
    assert image_by_digest(coved, img.digest) is None and leftovers(coved) == []
    sid = create(coved, uri, made, auth=auth_of(rw.USER, rw.PASSWORD))
    assert coved.sh(sid, "cat /etc/layer2") == "from layer two\n"
    # The credentials went to the registry, not into the sandbox or its record.
    info = json.dumps(coved.get(sid))
    assert rw.PASSWORD not in info
    assert rw.PASSWORD not in coved.sh(sid, "env")


@pytest.mark.static_agent
def test_token_auth_registry(coved, token_registry, workdir, made):
    img = ib.unique_image(4096)
    team = push(token_registry, img, workdir, f"team/tok-{secrets.token_hex(3)}:v1")
    private = push(token_registry, img, workdir, f"private/tok-{secrets.token_hex(3)}:v1")
    # Anonymous: the token server grants nothing.
    assert_error(*create_raw(coved, token_registry.ref(team)), 403, "IMAGE::UNAUTHORIZED")
    # A wrong password: the token server refuses.
    assert_error(*create_raw(coved, token_registry.ref(team),
                             auth=auth_of(rw.READER, "wrong")), 403, "IMAGE::UNAUTHORIZED")
    # The reader may pull team/ only.
    status, body = pull(coved, token_registry.ref(private),
                        auth=auth_of(rw.READER, rw.READER_PASSWORD))
    assert_error(status, body, 403, "IMAGE::UNAUTHORIZED")
    asked = [r for r in token_registry.token_server.requests if r[0] == rw.READER]
    assert asked and all(r[3] in (200, 401) for r in asked)
    sid = create(coved, token_registry.ref(team), made,
                 auth=auth_of(rw.READER, rw.READER_PASSWORD))
    assert coved.sh(sid, "cat /opt/lower/new") == "upper new\n"
    # coved asked for pull only.
    scopes = [s for r in token_registry.token_server.requests if r[0] == rw.READER and r[3] == 200
              for s in r[1]]
    assert scopes and all(s.endswith(":pull") for s in scopes), scopes


@pytest.mark.static_agent
def test_credentials_file(basic_registry, token_registry, workdir, tmp_path):
    img = ib.unique_image(4096)
    b_name = push(basic_registry, img, workdir)
    t_name = push(token_registry, img, workdir, f"team/file-{secrets.token_hex(3)}:v1")
    path = rw.auth_file(tmp_path / "auth.json", {basic_registry.host: (rw.USER, rw.PASSWORD)})
    # The token registry's entry in the {"username","password"} shape.
    data = json.load(open(path))
    data["auths"][token_registry.host] = {"username": rw.READER, "password": rw.READER_PASSWORD}
    json.dump(data, open(path, "w"))
    with serve("--registry-auth-file", path, admin_keys=(ADMIN,)) as d:
        for uri in (basic_registry.ref(b_name), token_registry.ref(t_name)):
            sid = create(d, uri)
            assert d.sh(sid, "cat /etc/motd") == "three\n"
            d.delete(sid)
    # Without the flag: STATE/auth.json when present.
    state = tmp_path / "state"
    state.mkdir()
    rw.auth_file(state / "auth.json", {basic_registry.host: (rw.USER, rw.PASSWORD)})
    with serve(admin_keys=(ADMIN,), state_dir=str(state)) as d:
        status, body = pull(d, basic_registry.ref(b_name))
        assert status == 200 and body["digest"] == img.digest, body
    # A file with other credentials: the registry's refusal, clearly.
    rw.auth_file(path, {basic_registry.host: (rw.USER, "not-the-password")})
    with serve("--registry-auth-file", path, admin_keys=(ADMIN,)) as d:
        assert_error(*pull(d, basic_registry.ref(b_name)), 403, "IMAGE::UNAUTHORIZED")


# ---- failures leave nothing ------------------------------------------------------------------

@pytest.mark.static_agent
def test_registry_failing_mid_layer_leaves_nothing_then_a_retry_works(own_coved, registry,
                                                                      workdir):
    d = own_coved
    img = ib.unique_image(512 << 10)
    name = push(registry, img, workdir)
    uri = registry.ref(name)
    registry.proxy.fail_blobs(times=1000, after=4096)  # every blob download is cut short
    try:
        status, body = create_raw(d, uri, metadata={"case": "cut"})
        assert_error(status, body, 502, "IMAGE::REGISTRY_ERROR")
        assert registry.host in body["message"], body
        cut = [r for r in registry.proxy.requests() if not r[4]]
        assert cut, registry.proxy.requests()
        assert leftovers(d) == []
        assert not os.path.exists(layer_dir(d, img.layers[-1].digest))
        assert not os.path.exists(store(d, "images", img.id + ".json"))
        assert image_by_digest(d, img.digest) is None
        assert d.ok("GET", "/v1/sandboxes?metadata=case%3Dcut")["items"] == []
        assert_error(*pull(d, uri), 502, "IMAGE::REGISTRY_ERROR")
        # A registry answering 5xx for the blobs: the same.
        registry.proxy.fail_blobs(times=0)
        registry.proxy.fail_with(503, times=1000)
        assert_error(*create_raw(d, uri), 502, "IMAGE::REGISTRY_ERROR")
        assert leftovers(d) == []
    finally:
        registry.proxy.fail_blobs(times=0)
        registry.proxy.fail_with(503, times=0)
    sid = create(d, uri)
    assert d.sh(sid, "wc -c < /uniq/blob").strip() == str(512 << 10)
    assert leftovers(d) == []
    d.delete(sid)


@pytest.mark.static_agent
def test_two_concurrent_creates_pull_once(own_coved, registry, workdir):
    d = own_coved
    img = ib.unique_image(256 << 10)
    name = push(registry, img, workdir)
    repo = name.split(":")[0]
    registry.proxy.clear()
    registry.proxy.slow_blobs(chunk=16 << 10, delay=0.05)
    results = [None, None]

    def make(i):
        results[i] = create_raw(d, registry.ref(name), metadata={"case": f"twice{i}"})

    threads = [threading.Thread(target=make, args=(i,)) for i in range(2)]
    try:
        threads[0].start()
        assert registry.proxy.blob_started.wait(30), registry.proxy.requests()
        threads[1].start()
        wait_for(lambda: len(d.ok("GET", "/v1/sandboxes?state=Pending")["items"]) >= 2, 20,
                 what="both creates Pending")
    finally:
        registry.proxy.release()
        for t in threads:
            if t.ident is not None:
                t.join(120)
    ids = []
    for status, body in results:
        assert status == 202, (status, body)
        ids.append(body["id"])
    assert registry.proxy.count("GET", "/manifests/", repo) == 1, registry.proxy.requests()
    for blob in [img.config_digest] + [l.digest for l in img.layers]:
        got = [r for r in registry.proxy.requests() if r[0] == "GET" and r[1].endswith(blob)]
        assert len(got) == 1, (blob, registry.proxy.requests())
    for sid in ids:
        assert d.sh(sid, "cat /etc/motd") == "three\n"
    # IMAGES.md: inUse counts the sandboxes using the image (a bare true passes as well)
    assert image_by_digest(d, img.digest)["inUse"] in (2, True)
    for sid in ids:
        d.delete(sid)


@pytest.mark.static_agent
def test_pull_progress_is_visible_while_the_sandbox_is_pending(own_coved, registry, workdir):
    d = own_coved
    img = ib.unique_image(1 << 20)
    name = push(registry, img, workdir)
    uri = registry.ref(name)
    registry.proxy.slow_blobs(chunk=8 << 10, delay=0.05)
    result = {}
    t = threading.Thread(target=lambda: result.update(r=create_raw(d, uri,
                                                                   metadata={"case": "slow"})))
    try:
        t.start()
        pulls = wait_for(lambda: [p for p in d.ok("GET", "/v1/images/pulls")["items"]
                                  if p["bytes"] > 0], 30, what="a pull in progress")
        p = pulls[0]
        assert p["reference"] == uri and p["layers"] == len(img.layers), p
        assert 0 <= p["layersDone"] < p["layers"] and p["startedAt"]
        assert p["totalBytes"] >= sum(l.size for l in img.layers), p
        first = p["bytes"]
        pending = d.ok("GET", "/v1/sandboxes?state=Pending&metadata=case%3Dslow")["items"]
        assert len(pending) == 1, pending
        status = d.get(pending[0]["id"])["status"]
        assert status["state"] == "Pending" and status["reason"] == "IMAGE_PULLING", status
        assert status.get("message"), status
        wait_for(lambda: any(q["bytes"] > first for q in d.ok("GET", "/v1/images/pulls")["items"]),
                 30, what="the pull to progress")
    finally:
        registry.proxy.release()
        t.join(120)
    status, body = result["r"]
    assert status == 202 and body["status"]["state"] == "Running", body
    assert d.ok("GET", "/v1/images/pulls")["items"] == []
    d.delete(body["id"])


# ---- removal, prune, import ------------------------------------------------------------------

@pytest.mark.static_agent
def test_delete_in_use_then_removed_with_its_layers(own_coved, registry, workdir):
    d = own_coved
    img = ib.unique_image(64 << 10)
    name = push(registry, img, workdir)
    sid = create(d, registry.ref(name))
    assert os.path.isdir(layer_dir(d, img.layers[-1].digest))
    assert d.ok("GET", f"/v1/images/{img.id}")["inUse"] == 1
    assert_error(*delete_image(d, img.id), 409, "IMAGE::IN_USE")
    assert d.sh(sid, "cat /etc/motd") == "three\n"
    d.delete(sid)
    assert delete_image(d, img.id)[0] == 204
    assert_error(*d.request("GET", f"/v1/images/{img.id}")[:2], 404, "IMAGE::NOT_FOUND")
    assert_error(*delete_image(d, img.id), 404, "IMAGE::NOT_FOUND")
    for l in img.layers:
        assert not os.path.exists(layer_dir(d, l.digest)), l.digest
    assert not os.path.exists(store(d, "images", img.id + ".json"))
    assert registry.ref(name) not in [t["name"] for t in d.ok("GET", "/v1/templates")["items"]]


@pytest.mark.static_agent
def test_prune_removes_unused_images_and_layers(own_coved, registry, workdir):
    d = own_coved
    unused, used = ib.unique_image(64 << 10), ib.unique_image(64 << 10)
    n_unused, n_used = push(registry, unused, workdir), push(registry, used, workdir)
    assert pull(d, registry.ref(n_unused))[0] == 200
    sid = create(d, registry.ref(n_used))
    body = prune(d)
    assert body["removed"] == [unused.id], body
    assert body["bytesFreed"] >= 64 << 10
    assert not os.path.exists(layer_dir(d, unused.layers[-1].digest))
    # Shared layers stay for the image still in use.
    for l in used.layers:
        assert os.path.isdir(layer_dir(d, l.digest)), l.digest
    assert [i["id"] for i in images(d)] == [used.id]
    assert d.sh(sid, "cat /etc/motd") == "three\n"
    d.delete(sid)
    body = prune(d)
    assert body["removed"] == [used.id] and images(d) == []
    assert leftovers(d) == [] and listing(store(d, "layers")) == []


def import_archive(d, data, query="", content_type="application/x-tar"):
    status, body, _ = d.request("POST", "/v1/images/import" + query, raw=data,
                                headers=admin(d, content_type), timeout=300)
    return status, body


@pytest.mark.static_agent
@pytest.mark.parametrize("compression", [None, "gzip"])
def test_import_docker_save_archive(own_coved, busybox, compression):
    d = own_coved
    tag = f"cove-test/saved-{secrets.token_hex(3)}:v1"
    status, body = import_archive(d, ib.docker_save_archive(busybox, [tag], compression))
    assert status == 200, body
    assert len(body["items"]) == 1
    assert "docker.io/" + tag in body["items"][0]["references"], body
    sid = create(d, tag)
    assert d.exec(sid, "test -e /etc/removed-later").exit_code == 1
    assert d.sh(sid, "ls /opt/lower; id -u; pwd") == "new\n1000\n/work\n"
    d.delete(sid)


@pytest.mark.static_agent
def test_import_oci_layout_tar(own_coved, busybox, workdir):
    d = own_coved
    name = f"docker.io/cove-test/oci-{secrets.token_hex(3)}:v1"
    layout = ib.OciLayout(workdir / f"import-{secrets.token_hex(3)}")
    layout.add(busybox, "v1", name=name)
    data = layout.tar("zstd" if ib.zstd_available() else "gzip")
    status, body = import_archive(d, data)
    assert status == 200, body
    assert body["items"][0]["digest"] == busybox.digest
    assert name in body["items"][0]["references"], body
    sid = create(d, name)
    assert d.sh(sid, "stat -c '%i' /data/hard1 /data/hard2").split("\n")[0] == \
        d.sh(sid, "stat -c '%i' /data/hard2").strip()
    d.delete(sid)
    # An archive that names nothing: ?reference= names it.
    bare = ib.OciLayout(workdir / f"import-bare-{secrets.token_hex(3)}")
    bare.add(ib.unique_image(4096), None)
    status, body = import_archive(d, bare.tar(), "?reference=cove-test/renamed:v2")
    assert status == 200, body
    assert "docker.io/cove-test/renamed:v2" in body["items"][0]["references"], body
    sid = create(d, "cove-test/renamed:v2")
    assert d.sh(sid, "cat /etc/motd; test -f /uniq/blob && echo unique") == "three\nunique\n"
    d.delete(sid)
    # Not an archive: a clear 400, nothing kept.
    status, body = import_archive(d, b"not a tar at all" * 100)
    assert 400 <= status < 500 and body.get("code"), (status, body)
    assert leftovers(d) == []


# ---- bad references, unknown images, unreachable registries ----------------------------------

BAD_REFERENCES = [
    "127.77.2.1:5000/Team/Upper:v1",
    "127.77.2.1:5000/team/../etc:v1",
    "127.77.2.1:5000/team/" + "a" * 300 + ":v1",
    "127.77.2.1:5000/team/x:" + "t" * 200,
    "127.77.2.1:5000/team/x\x01y:v1",
    "127.77.2.1:5000/team/x:v1\n",
    "127.77.2.1:5000/team/x@sha256:1234",
    "127.77.2.1:5000/team/x@md5:" + "0" * 32,
    "127.77.2.1:5000/team/x:bad tag",
    "127.77.2.1:5000//x:v1",
    " ",
]


def test_bad_references_are_400(coved):
    for ref in BAD_REFERENCES:
        assert_error(*pull(coved, ref), 400, "IMAGE::INVALID_REFERENCE")
    status, body = pull(coved, "")  # no reference at all: a bad request, whatever its code
    assert status == 400 and body.get("code", "").startswith("IMAGE::"), body
    for ref in BAD_REFERENCES[:6]:
        status, body = create_raw(coved, ref)
        assert status == 400 and body.get("code"), (ref, status, body)
    assert coved.health()


def test_unknown_image_is_404_and_an_unreachable_registry_502(coved, registry):
    for ref in (registry.ref("team/never-pushed:v1"),
                registry.ref(f"team/never-pushed@sha256:{'ab' * 32}")):
        assert_error(*pull(coved, ref), 404, "IMAGE::NOT_FOUND")
        assert_error(*create_raw(coved, ref), 404, "IMAGE::NOT_FOUND")
    dead = f"127.77.2.9:{rw.closed_port('127.77.2.9')}/team/x:v1"
    status, body = pull(coved, dead)
    assert_error(status, body, 502, "IMAGE::REGISTRY_ERROR")
    assert "127.77.2.9" in body["message"], body
    assert_error(*create_raw(coved, dead), 502, "IMAGE::REGISTRY_ERROR")
    assert leftovers(coved) == []
