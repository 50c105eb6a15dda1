"""PATCH metadata (RFC 7396), renew-expiration, and TTL expiry."""

import datetime
import time

import pytest

from covetest import sandbox_leftovers


def iso(ts):
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def parse(text):
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_patch_metadata_merge_semantics(coved):
    sid = coved.create(metadata={"team": "ml", "env": "dev"})
    try:
        body = coved.ok("PATCH", f"/v1/sandboxes/{sid}/metadata",
                        {"team": None, "env": "prod", "project": "apollo", "absent": None})
        assert body["metadata"] == {"env": "prod", "project": "apollo"}
        assert coved.get(sid)["metadata"] == {"env": "prod", "project": "apollo"}
        assert coved.ok("PATCH", f"/v1/sandboxes/{sid}/metadata", {})["metadata"] == \
            {"env": "prod", "project": "apollo"}
    finally:
        coved.delete(sid)


@pytest.mark.parametrize("patch", [
    {"opensandbox.io/owner": "me"}, {"bad key!": "x"}, {"k": "has space"}, {"k": "x" * 64},
    {"k": 5}, {"k": {"nested": "x"}}, {"k": "-leading"}, ["not", "an", "object"],
])
def test_bad_metadata_patch_changes_nothing(coved, patch):
    sid = coved.create(metadata={"keep": "me"})
    try:
        status, body, _ = coved.request("PATCH", f"/v1/sandboxes/{sid}/metadata", patch)
        assert status == 400 and set(body) == {"code", "message"}, body
        assert coved.get(sid)["metadata"] == {"keep": "me"}
    finally:
        coved.delete(sid)


def test_renew_rules(coved):
    sid = coved.create(timeout=60)
    manual = coved.create()  # timeout omitted: no expiry
    try:
        expires = parse(coved.get(sid)["expiresAt"])
        assert "expiresAt" not in coved.get(manual)
        later = expires + 120
        body = coved.ok("POST", f"/v1/sandboxes/{sid}/renew-expiration", {"expiresAt": iso(later)})
        assert abs(parse(body["expiresAt"]) - later) < 0.01
        assert abs(parse(coved.get(sid)["expiresAt"]) - later) < 0.01
        for bad in ({"expiresAt": iso(time.time() - 10)},
                    {"expiresAt": "tomorrow"}, {"expiresAt": 12345}, {},
                    {"expiresAt": iso(later + 60), "extra": 1},
                    {"expiresAt": iso(time.time() + 10 ** 9)}):
            status, err, _ = coved.request("POST", f"/v1/sandboxes/{sid}/renew-expiration", bad)
            assert status == 400 and set(err) == {"code", "message"}, (bad, err)
        assert abs(parse(coved.get(sid)["expiresAt"]) - later) < 0.01
        status, err, _ = coved.request("POST", f"/v1/sandboxes/{manual}/renew-expiration",
                                       {"expiresAt": iso(time.time() + 600)})
        assert status == 409, err
    finally:
        coved.delete(sid)
        coved.delete(manual)


@pytest.mark.slow
def test_ttl_reaps_at_the_renewed_time_not_before_even_across_a_restart(fresh_coved):
    """timeout 60, renewed to 66 s after creation, coved killed with SIGKILL and restarted
    meanwhile: alive at 62 s, gone (with its resources) shortly after 66 s, running or
    paused."""
    import signal
    coved = fresh_coved.start()
    running = coved.create(timeout=60)
    paused = coved.create(timeout=60)
    created = parse(coved.get(running)["createdAt"])
    renewed = created + 66
    for sid in (running, paused):
        coved.ok("POST", f"/v1/sandboxes/{sid}/renew-expiration", {"expiresAt": iso(renewed)})
    coved.pause(paused)
    coved.proc.send_signal(signal.SIGKILL)
    coved.proc.wait(10)
    coved.start()
    assert abs(parse(coved.get(running)["expiresAt"]) - renewed) < 0.01
    time.sleep(max(0, created + 62 - time.time()))
    assert coved.sh(running, "echo alive") == "alive\n"
    assert coved.get(paused)["status"]["state"] == "Paused"
    time.sleep(max(0, renewed + 1.5 - time.time()))
    for sid in (running, paused):
        status, _, _ = coved.request("GET", f"/v1/sandboxes/{sid}")
        assert status == 404
        assert sandbox_leftovers(coved, sid) == []


def test_renew_on_access_through_the_gateway(coved):
    sid = coved.create(timeout=60, extensions={"access.renew.extend.seconds": "600"})
    plain = coved.create(timeout=60)
    try:
        before = parse(coved.get(sid)["expiresAt"])
        assert before - time.time() < 65
        coved.sh(sid, "true")
        coved.sh(plain, "true")
        after = parse(coved.get(sid)["expiresAt"])
        assert 590 < after - time.time() < 605
        assert parse(coved.get(plain)["expiresAt"]) - time.time() < 65
        # lifecycle calls are not "access": only gateway traffic renews
        coved.get(sid)
        assert abs(parse(coved.get(sid)["expiresAt"]) - after) < 0.01
    finally:
        coved.delete(sid)
        coved.delete(plain)


@pytest.mark.parametrize("extensions", [
    {"access.renew.extend.seconds": "10"}, {"access.renew.extend.seconds": "soon"},
    {"access.renew.extend.seconds": [1]}, {"poolRef": 5}, {"cove.pool": "warm"}, "yes",
])
def test_bad_extensions(coved, extensions):
    status, body, _ = coved.request("POST", "/v1/sandboxes", {
        "image": {"uri": "base"}, "entrypoint": ["true"], "extensions": extensions})
    assert status == 400 and set(body) == {"code", "message"}, body
