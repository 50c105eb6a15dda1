"""Images across a coved restart (issue 13): the image store is read back at start, a sandbox
made from an image is re-adopted and keeps running in it, and its image stays in use (a
restored sandbox holds no reference to its template: the store counts it by name) until the
sandbox is gone. A snapshot of a sandbox made from an image starts new sandboxes over the
image's layers too."""

import os
import secrets
import signal
import time

import pytest

import image_build as ib
import registry_world as rw
from covetest import sandbox_leftovers, serve

ADMIN = "images-restart-admin-key"


@pytest.fixture(scope="module")
def registry():
    with rw.running_registry("none", address="127.77.2.40") as reg:
        yield reg


@pytest.fixture
def own_coved():
    with serve(start=False, admin_keys=(ADMIN,)) as d:
        yield d


def admin(d):
    return {"OPEN-SANDBOX-API-KEY": ADMIN}


def create(d, uri, **body):
    status, out, _ = d.request("POST", "/v1/sandboxes", {"image": {"uri": uri}, **body},
                               timeout=300)
    assert status == 202, (status, out)
    return out["id"]


@pytest.mark.static_agent
def test_an_image_sandbox_survives_a_restart_and_keeps_its_image(own_coved, registry, tmp_path):
    d = own_coved.start()
    img = ib.busybox_image()
    name = f"team/restart-{secrets.token_hex(3)}:v1"
    registry.push_image(img, name, tmp_path)
    ref = registry.ref(name)
    sid = create(d, ref)
    # the image's entrypoint runs (it may not have written its file yet when the create answers)
    assert d.sh(sid, "for i in $(seq 100); do test -s /tmp/entrypoint-ran && break; sleep 0.05; "
                "done; cat /tmp/entrypoint-ran") == "hello from 1000\n"
    d.sh(sid, "echo kept > /tmp/mine")

    d.kill(signal.SIGKILL)  # a crash: the sandbox lives on
    time.sleep(0.2)
    d.start()
    assert d.get(sid)["status"]["state"] == "Running"
    assert d.sh(sid, "cat /tmp/mine; echo $GREETING") == "kept\nhello\n"
    images = d.ok("GET", "/v1/images")["items"]
    assert [i["references"] for i in images] == [[ref]], images
    assert images[0]["inUse"] == 1
    status, body, _ = d.request("DELETE", f"/v1/images/{img.id}", headers=admin(d))
    assert (status, body["code"]) == (409, "IMAGE::IN_USE"), body
    # A second sandbox from it needs no pull: the registry is asked nothing.
    registry.proxy.clear()
    other = create(d, ref)
    assert registry.proxy.requests() == []
    d.delete(other)
    d.delete(sid)
    assert sandbox_leftovers(d, sid) == []
    status, _, _ = d.request("DELETE", f"/v1/images/{img.id}", headers=admin(d))
    assert status == 204


@pytest.mark.native_only(reason="snapshots are refused (409 SNAPSHOT::UNSUPPORTED) by the oci and gvisor runtimes today")
@pytest.mark.static_agent
def test_a_snapshot_of_an_image_sandbox_restores_over_the_image(own_coved, registry, tmp_path):
    d = own_coved.start()
    img = ib.busybox_image()
    name = f"team/snap-{secrets.token_hex(3)}:v1"
    registry.push_image(img, name, tmp_path)
    sid = create(d, registry.ref(name))
    d.sh(sid, "mkdir -p /tmp/s && echo snap > /tmp/s/file")
    status, snap, _ = d.request("POST", f"/v1/sandboxes/{sid}/snapshots", {"name": "img"})
    assert status == 202, snap
    for _ in range(600):
        state = d.ok("GET", f"/v1/snapshots/{snap['id']}")["status"]["state"]
        if state != "Creating":
            break
        time.sleep(0.1)
    assert state == "Ready", state
    status, body, _ = d.request("POST", "/v1/sandboxes", {"snapshotId": snap["id"]}, timeout=300)
    assert status == 202, body
    restored = body["id"]
    # the snapshot's files over the image's, and the image's own (busybox, its layers)
    assert d.sh(restored, "cat /tmp/s/file /etc/motd; ls /bin/busybox; id -u") \
        == "snap\nthree\n/bin/busybox\n1000\n"
    # the image is in use by the snapshot too
    d.delete(restored)
    d.delete(sid)
    status, body, _ = d.request("DELETE", f"/v1/images/{img.id}", headers=admin(d))
    assert (status, body["code"]) == (409, "IMAGE::IN_USE"), body
    assert d.request("DELETE", f"/v1/snapshots/{snap['id']}")[0] == 204
    status, _, _ = d.request("DELETE", f"/v1/images/{img.id}", headers=admin(d))
    assert status == 204


@pytest.mark.static_agent
def test_a_registry_mirror_serves_its_registrys_images(registry, tmp_path):
    """--registry-mirror REG=MIRROR: REG's images come from MIRROR (here REG itself is down:
    nothing listens there, so only the mirror can have answered)."""
    img = ib.busybox_image()
    name = f"team/mirrored-{secrets.token_hex(3)}:v1"
    registry.push_image(img, name, tmp_path)
    down = f"127.77.2.41:{rw.closed_port('127.77.2.41')}"
    with serve("--registry-mirror", f"{down}={registry.host}", admin_keys=(ADMIN,)) as d:
        registry.proxy.clear()
        sid = create(d, f"{down}/{name}")
        assert d.sh(sid, "echo $GREETING") == "hello\n"
        assert registry.proxy.count("GET", "/manifests/") >= 1
        assert d.get(sid)["image"] == {"uri": f"{down}/{name}"}
        d.delete(sid)
    # without the mirror, the same name is unreachable: a clear 502
    with serve(admin_keys=(ADMIN,)) as d:
        status, body, _ = d.request("POST", "/v1/sandboxes", {"image": {"uri": f"{down}/{name}"}},
                                    timeout=300)
        assert (status, body["code"]) == (502, "IMAGE::REGISTRY_ERROR"), body


@pytest.mark.static_agent
@pytest.mark.parametrize("runtime", ["oci", "gvisor"])
def test_an_image_under_the_oci_and_gvisor_runtimes(registry, tmp_path, runtime):
    """The same image, its config honoured, behind crun's and gVisor's walls."""
    img = ib.busybox_image()
    name = f"team/{runtime}-{secrets.token_hex(3)}:v1"
    registry.push_image(img, name, tmp_path)
    with serve(admin_keys=(ADMIN,)) as d:
        sid = create(d, registry.ref(name), extensions={"runtime": runtime})
        assert d.sh(sid, "echo $GREETING; id -u; pwd; cat /etc/motd") == "hello\n1000\n/work\nthree\n"
        assert d.get(sid)["image"] == {"uri": registry.ref(name)}
        d.delete(sid)
        assert sandbox_leftovers(d, sid) == []
