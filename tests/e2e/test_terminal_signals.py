"""coved run in a terminal: what the terminal sends coved's process group is not for the
sandboxes, which outlive coved."""

import os
import signal


def test_ctrl_c_to_coveds_process_group_spares_the_sandboxes(fresh_coved):
    """A terminal's Ctrl-C sends SIGINT to the whole foreground process group. coved stops;
    its sandboxes, in sessions of their own, keep running and are re-adopted by the next
    coved."""
    d = fresh_coved.start(new_session=True)
    pgid = os.getpgid(d.proc.pid)
    assert pgid == d.proc.pid
    sandboxes = [d.create(), d.create()]
    for sid in sandboxes:
        d.sh(sid, "echo kept > /tmp/marker")
    os.killpg(pgid, signal.SIGINT)
    # A bound on a hang, not a timing: a sanitized coved beside a parallel suite exits slowly.
    assert d.proc.wait(60) == 0
    d.proc.stdout.close()
    d.start(new_session=True)
    states = {s["id"]: s["status"]["state"] for s in d.ok("GET", "/v1/sandboxes")["items"]}
    for sid in sandboxes:
        assert states[sid] == "Running", (sid, d.get(sid)["status"])
        # The entrypoint was not told to stop, and a command outlasts the agent's shutdown
        # grace (2 s): no agent is on its way out.
        assert "sleep infinity" in d.sh(sid, "ps -eo args")
        assert d.sh(sid, "sleep 3; cat /tmp/marker") == "kept\n"
        assert d.get(sid)["status"]["state"] == "Running"
    # Nor is a hang-up of coved's terminal (SIGHUP to the group) theirs.
    os.killpg(os.getpgid(d.proc.pid), signal.SIGHUP)
    d.proc.wait(60)
    d.proc.stdout.close()
    d.start()
    for sid in sandboxes:
        assert d.get(sid)["status"]["state"] == "Running"
        assert d.sh(sid, "echo ok") == "ok\n"
        d.delete(sid)
