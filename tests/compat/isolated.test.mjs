import zlib from "node:zlib";
// Cove's isolated execution API (OSEP-0013, /v1/isolated/* on a sandbox's execd endpoint)
// against the official OpenSandbox JavaScript SDK (@alibaba-group/opensandbox 0.1.11), through
// sandbox.isolation only: capabilities, create / attach / list, session.run / get / delete /
// files, runOnce and withSession. One sandbox (env OPENAI_API_KEY and VISIBLE) holds every
// session; the sandbox's own commands and files APIs are the outside view that the sessions'
// overlays, private /tmp and pid namespaces must not leak into. Starts its own coved; every
// sandbox is deleted and coved stopped in teardown (coved.mjs).
//
// What the SDK sends and expects (its source, 0.1.11: adapters/isolatedSessionsAdapter.ts and
// isolatedFilesystemAdapter.ts), in short:
// - capabilities(): GET /v1/isolated/capabilities -> {available, commit_supported,
//   diff_supported, setpriv_available?, userns_available?, ...}.
// - create(req): POST /v1/isolated/session with the request as it is; the 2xx JSON body
//   becomes session.info as it is (the spec's IsolatedCreateSessionResponse has only
//   session_id and created_at, so info's creation fields may be absent).
// - attach(id) / session.get(): GET /v1/isolated/session/{id} -> SessionState {status, ...,
//   the creation parameters}; attach copies those into info. session.delete(): DELETE on it.
// - list(): GET /v1/isolated/sessions -> {sessions: [...]}.
// - session.run(code, {envs, timeout_seconds}): POST .../run {code, envs?, timeout_seconds?}
//   accept text/event-stream; the same events as /command; exitCode = 0 after
//   execution_complete, int(error.value) after an error event.
// - These JSON calls throw a plain Error "METHOD PATH failed: STATUS BODY" on any non-2xx
//   (not a SandboxApiException): a 404 or 400 is recognised by that message.
// - session.files: execd's files API under /v1/isolated/session/{id}: uploads are multipart
//   POST .../files/upload, downloads GET .../files/download?path=, DELETE .../files?path=,
//   GET .../directories/list?path=&depth=, GET .../files/info?path=; errors are
//   SandboxApiException.
// The SDK has no call for /diff and /commit: that test fetches them itself.

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { dirname, join } from "node:path";
import { after, afterEach, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";

import { Sandbox } from "@alibaba-group/opensandbox";

import { AGENT_PORT, Coved } from "./coved.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
const RUN = randomBytes(4).toString("hex");
const TEST_TIMEOUT = 180_000;
const WS = "/workspace";
const PRE = `${WS}/pre.txt`; // written through the sandbox's files API before any session

const coved = new Coved();
const closable = [];
let sbx; // the sandbox every session lives in
let proxied; // the same sandbox, the SDK reaching execd through coved's server proxy
const sessions = new Set(); // sessions to delete in teardown if a test left them

before(async () => {
  await coved.start();
  sbx = await Sandbox.create({
    connectionConfig: connection(),
    image: "base",
    env: { OPENAI_API_KEY: "sk-secret", VISIBLE: "yes" },
    metadata: { run: RUN, suite: "isolated" },
  });
  coved.track(sbx.id);
  closable.push(sbx);
  await sh(sbx, `mkdir -p ${WS}`);
  await sbx.files.writeFiles([{ path: PRE, data: "from before\n" }]);
  proxied = await Sandbox.connect({ sandboxId: sbx.id, connectionConfig: connection({ useServerProxy: true }) });
  closable.push(proxied);
});

// A failed test's sessions go with it, so that the next test's list() starts empty.
afterEach(async () => {
  for (const s of sessions) await s.delete().catch(() => {});
  sessions.clear();
});

after(async () => {
  for (const c of closable) await c.close().catch(() => {});
  const problems = await coved.cleanup({ keepLogAs: join(HERE, "coved-isolated.log") });
  if (problems.length) console.error(`cleanup:\n  ${problems.join("\n  ")}`);
});

function connection(extra = {}) {
  return { domain: coved.domain, apiKey: coved.apiKey, requestTimeoutSeconds: 60, ...extra };
}

const stdoutOf = (ex) => ex.logs.stdout.map((m) => m.text).join("\n");
const stderrOf = (ex) => ex.logs.stderr.map((m) => m.text).join("\n");

/** A shell command in the sandbox itself (the SDK's normal command API): its stdout; must exit 0. */
async function sh(target, command) {
  const ex = await target.commands.run(command);
  assert.equal(ex.exitCode, 0, `\`${command}\` in the sandbox exited ${ex.exitCode}: ${stderrOf(ex)}`);
  return stdoutOf(ex);
}

/** A new session through the SDK, deleted in teardown unless a test deletes it. */
async function session(request, iso = sbx.isolation) {
  const s = await iso.create(request);
  assert.match(s.sessionId, /^[0-9a-f-]{36}$/);
  sessions.add(s);
  return s;
}

async function drop(s) {
  await s.delete();
  sessions.delete(s);
}

/** Runs code in a session: {ex, out, err}; must exit 0 unless expectFail. */
async function run(s, code, { expectFail = false, opts, handlers } = {}) {
  const ex = await s.run(code, opts, handlers);
  const out = stdoutOf(ex);
  const err = stderrOf(ex);
  if (expectFail) assert.notEqual(ex.exitCode, 0, `\`${code}\` should fail in the session: ${out}`);
  else assert.equal(ex.exitCode, 0, `\`${code}\` in the session exited ${ex.exitCode}: ${err}`);
  return { ex, out, err };
}

/** assert.rejects predicate for the SDK's JSON calls: Error "METHOD PATH failed: STATUS ...". */
function failsWith(status) {
  return (e) => {
    assert.ok(e instanceof Error, `expected an Error, got ${e}`);
    assert.match(e.message, new RegExp(` failed: ${status}\\b`), `expected HTTP ${status}: ${e.message}`);
    return true;
  };
}

/** Names in `env` output, without those the shell itself sets. */
function envKeys(out) {
  const shell = new Set(["PWD", "OLDPWD", "SHLVL", "_"]);
  return out.split("\n").filter(Boolean).map((l) => l.split("=")[0]).filter((k) => !shell.has(k)).sort();
}

describe("isolated sessions through the SDK", () => {
  test("capabilities: available, with diff and commit", { timeout: TEST_TIMEOUT }, async () => {
    const caps = await sbx.isolation.capabilities();
    assert.equal(caps.available, true);
    assert.equal(caps.commit_supported, true);
    assert.equal(caps.diff_supported, true);
    assert.equal(caps.setpriv_available, true);
    assert.equal(typeof caps.isolator, "string");
  });

  test("strict overlay: output streams, state is kept, nothing leaks out", { timeout: TEST_TIMEOUT }, async () => {
    const a = await session({ workspace: { path: WS, mode: "overlay" }, profile: "strict" });
    assert.ok(!Number.isNaN(new Date(a.info.created_at).getTime()), `created_at: ${a.info.created_at}`);
    const streamed = [];
    let completed = null;
    const { ex, out } = await run(a, `echo hi > ${WS}/a.txt; cat ${WS}/a.txt`, {
      handlers: {
        onStdout: (m) => streamed.push(m.text),
        onExecutionComplete: (c) => {
          completed = c;
        },
      },
    });
    assert.equal(out, "hi");
    assert.deepEqual(streamed, ["hi"]);
    assert.ok(completed, "no execution_complete event");
    assert.equal(ex.exitCode, 0);
    assert.equal(ex.error, undefined);

    // The same session again: its overlay kept the file; a failing run reports its code.
    assert.equal((await run(a, `cat ${WS}/a.txt; cat ${PRE}`)).out, "hi\nfrom before");
    const failed = await run(a, "exit 7", { expectFail: true });
    assert.equal(failed.ex.exitCode, 7);

    // Not in the sandbox, not in another session.
    assert.equal(await sh(sbx, `test -e ${WS}/a.txt && echo present || echo absent`), "absent");
    const b = await session({ workspace: { path: WS, mode: "overlay" }, profile: "strict" });
    assert.equal((await run(b, `test -e ${WS}/a.txt && echo present || echo absent`)).out, "absent");

    // Private /tmp each (strict).
    await run(a, "echo a > /tmp/only-a");
    assert.equal((await run(b, "ls /tmp/only-a 2>&1; echo rc=$?")).out.split("\n").pop(), "rc=2");
    assert.equal(await sh(sbx, "test -e /tmp/only-a && echo present || echo absent"), "absent");
    assert.equal((await run(a, "cat /tmp/only-a")).out, "a");

    // Its own pid namespace: the sandbox's processes (its entrypoint, tail; a sleep started
    // through the sandbox's command API) are not there.
    await sbx.commands.run("sleep 300", { background: true });
    const outside = await sh(sbx, "ps -e -o pid=,comm=");
    assert.match(outside, /\bsleep\b/, `the sandbox's own ps: ${outside}`);
    assert.match(outside, /\btail\b/, `the sandbox's own ps shows its entrypoint: ${outside}`);
    const inside = (await run(a, "ps -e -o pid=,comm=")).out;
    assert.doesNotMatch(inside, /\b(sleep|tail)\b/, inside);
    const comms = inside.split("\n").map((l) => l.trim().split(/\s+/));
    assert.deepEqual(comms[0], ["1", "cove-agent"], `the session's agent is its pid 1: ${inside}`);
    assert.ok(comms.some(([, c]) => c === "ps"), inside);
    for (const [, c] of comms) assert.ok(["cove-agent", "ps", "sh", "bash"].includes(c), `only the session's own processes: ${inside}`);
    await drop(a);
    await drop(b);
  });

  test("balanced rw writes land in the sandbox; ro refuses writes, reads work", { timeout: TEST_TIMEOUT }, async () => {
    const rw = await session({ workspace: { path: WS, mode: "rw" }, profile: "balanced" });
    await run(rw, `echo through > ${WS}/rw.txt`);
    assert.equal(await sh(sbx, `cat ${WS}/rw.txt`), "through");
    await drop(rw);

    const ro = await session({ workspace: { path: WS, mode: "ro" }, profile: "strict" });
    const w = await run(ro, `echo x > ${WS}/ro.txt`, { expectFail: true });
    assert.match(w.err, /Read-only file system/);
    assert.equal((await run(ro, `cat ${PRE}`)).out, "from before");
    assert.equal(await sh(sbx, `test -e ${WS}/ro.txt && echo present || echo absent`), "absent");
    await drop(ro);
  });

  test("uid/gid 1000: the session's processes and its files API", { timeout: TEST_TIMEOUT }, async () => {
    const s = await session({ workspace: { path: WS, mode: "overlay" }, uid: 1000, gid: 1000 });
    assert.equal((await run(s, "id -u; id -g")).out, "1000\n1000");
    await s.files.writeFiles([{ path: "/tmp/owned.txt", data: "mine\n" }]);
    assert.equal((await run(s, "stat -c %u:%g /tmp/owned.txt; cat /tmp/owned.txt")).out, "1000:1000\nmine");
    await s.files.writeFiles([{ path: `${WS}/owned.txt`, data: "ws\n" }]);
    assert.equal((await run(s, `stat -c %u ${WS}/owned.txt`)).out, "1000");
    await drop(s);
  });

  test("env_passthrough: strict drops secrets, allow keeps only the keys listed", { timeout: TEST_TIMEOUT }, async () => {
    const own = envKeys(await sh(sbx, "env"));
    assert.ok(own.includes("OPENAI_API_KEY") && own.includes("VISIBLE"), `the sandbox's env: ${own}`);

    const strict = await session({ workspace: { path: WS }, profile: "strict" });
    const keys = envKeys((await run(strict, "env")).out);
    assert.ok(keys.includes("VISIBLE"), `strict session env: ${keys}`);
    assert.ok(!keys.includes("OPENAI_API_KEY"), `strict session env: ${keys}`);
    assert.equal((await run(strict, 'echo "$VISIBLE"')).out, "yes");
    await drop(strict);

    const allow = await session({ workspace: { path: WS }, env_passthrough: { mode: "allow", keys: ["VISIBLE"] } });
    const only = envKeys((await run(allow, "env")).out);
    assert.ok(only.includes("VISIBLE"), `allow session env: ${only}`);
    assert.deepEqual(only.filter((k) => !["PATH", "HOME", "LANG"].includes(k)), ["VISIBLE"]);
    // Per-run envs are the SDK's IsolatedRunOpts.envs.
    assert.equal((await run(allow, 'echo "$EXTRA"', { opts: { envs: { EXTRA: "per-run" } } })).out, "per-run");
    await drop(allow);
  });

  test("share_net false: a network namespace of its own", { timeout: TEST_TIMEOUT }, async () => {
    const ifaces = (out) => out.split("\n").slice(2).map((l) => l.split(":")[0].trim()).filter(Boolean).sort();
    const s = await session({ workspace: { path: WS }, share_net: false });
    assert.equal((await s.get()).share_net, false);
    assert.deepEqual(ifaces((await run(s, "cat /proc/net/dev")).out), ["lo"]);
    const shared = await session({ workspace: { path: WS } });
    assert.equal((await shared.get()).share_net, true);
    assert.deepEqual(ifaces((await run(shared, "cat /proc/net/dev")).out), ifaces(await sh(sbx, "cat /proc/net/dev")));
    await drop(s);
    await drop(shared);
  });

  test("run: timeout_seconds ends a run that takes longer", { timeout: TEST_TIMEOUT }, async () => {
    const s = await session({ workspace: { path: WS } });
    const started = Date.now();
    const slow = await run(s, "sleep 30; echo late", { expectFail: true, opts: { timeout_seconds: 1 } });
    assert.ok(Date.now() - started < 15_000, `took ${Date.now() - started} ms`);
    assert.doesNotMatch(slow.out, /late/);
    assert.equal((await run(s, "echo still there")).out, "still there");
    await drop(s);
  });

  // The SDK keeps create()'s 201 body as session.info (IsolatedSessionInfo): Cove answers the
  // creation parameters at the top level, as GET does (and OSEP-0013's isolation/artifacts).
  test("create(): session.info carries the creation parameters like attach()", { timeout: TEST_TIMEOUT }, async () => {
    const s = await session({ workspace: { path: WS, mode: "ro" }, profile: "balanced", uid: 1000 });
    assert.equal(s.info.profile, "balanced");
    assert.deepEqual(s.info.workspace, { path: WS, mode: "ro" });
    assert.equal(s.info.uid, 1000);
    await drop(s);
  });

  test("session.files: write, read, list, info, delete; the overlay keeps the sandbox's copy", { timeout: TEST_TIMEOUT }, async () => {
    const s = await session({ workspace: { path: WS, mode: "overlay" } });
    const files = s.files;
    await files.createDirectories([{ path: `${WS}/docs`, mode: 755 }]);
    await files.writeFiles([{ path: `${WS}/docs/new.txt`, data: "new in the session\n", mode: 644 }]);
    assert.equal(await files.readFile(`${WS}/docs/new.txt`), "new in the session\n");
    assert.equal((await run(s, `cat ${WS}/docs/new.txt`)).out, "new in the session");
    const listed = await files.listDirectory({ path: `${WS}/docs`, depth: 1 });
    assert.deepEqual(listed.map((f) => f.path).filter((p) => p !== `${WS}/docs`), [`${WS}/docs/new.txt`]);
    const info = await files.getFileInfo([`${WS}/docs/new.txt`]);
    assert.equal(info[`${WS}/docs/new.txt`].size, "new in the session\n".length);
    assert.equal(await files.readFile(PRE), "from before\n");

    // Writes and deletions stay in the session's overlay.
    assert.equal(await sh(sbx, `test -e ${WS}/docs && echo present || echo absent`), "absent");
    await files.deleteFiles([PRE]);
    assert.equal((await run(s, `test -e ${PRE} && echo present || echo absent`)).out, "absent");
    await assert.rejects(files.readFile(PRE), (e) => {
      assert.equal(e.statusCode, 404, `${e}`);
      return true;
    });
    assert.equal(await sbx.files.readFile(PRE), "from before\n");
    await files.moveFiles([{ src: `${WS}/docs/new.txt`, dest: `${WS}/docs/moved.txt` }]);
    const found = await files.search({ path: `${WS}/docs`, pattern: "*.txt" });
    assert.deepEqual(found.map((f) => f.path), [`${WS}/docs/moved.txt`]);
    await files.deleteFiles([`${WS}/docs/moved.txt`]);
    assert.deepEqual((await files.listDirectory({ path: `${WS}/docs`, depth: 1 }))
      .map((f) => f.path).filter((p) => p !== `${WS}/docs`), []);
    await drop(s);
  });

  test("list, get, attach, delete; runOnce and withSession leave nothing", { timeout: TEST_TIMEOUT }, async () => {
    const request = {
      workspace: { path: WS, mode: "ro" },
      profile: "balanced",
      env_passthrough: { mode: "deny", keys: ["OPENAI_*"] },
      uid: 1000,
      gid: 1000,
      idle_timeout_seconds: 600,
    };
    const s = await session(request);
    const other = await session({ workspace: { path: WS } });
    const listed = await sbx.isolation.list();
    assert.deepEqual(listed.map((x) => x.session_id).sort(), [s.sessionId, other.sessionId].sort());
    for (const x of listed) {
      assert.equal(x.status, "active");
      assert.ok(!Number.isNaN(new Date(x.created_at).getTime()));
    }

    const state = await s.get();
    assert.equal(state.status, "active");
    assert.equal(state.profile, "balanced");
    assert.deepEqual(state.workspace, { path: WS, mode: "ro" });
    assert.deepEqual(state.env_passthrough, { mode: "deny", keys: ["OPENAI_*"] });
    assert.equal(state.uid, 1000);
    assert.equal(state.gid, 1000);
    assert.equal(state.idle_timeout_seconds, 600);
    assert.ok(state.idle_remaining_seconds > 590 && state.idle_remaining_seconds <= 600, `${state.idle_remaining_seconds}`);
    assert.equal(new Date(state.created_at).getTime(), new Date(s.info.created_at).getTime());

    // attach: a handle from the id alone, with the creation parameters echoed into info.
    const again = await sbx.isolation.attach(s.sessionId);
    assert.equal(again.sessionId, s.sessionId);
    assert.equal(again.info.profile, "balanced");
    assert.deepEqual(again.info.workspace, { path: WS, mode: "ro" });
    assert.equal(again.info.uid, 1000);
    assert.equal((await run(again, "id -u; env | grep -c ^OPENAI_ || true")).out, "1000\n0");

    await drop(s);
    await assert.rejects(s.get(), failsWith(404));
    await assert.rejects(sbx.isolation.attach(s.sessionId), failsWith(404));
    await assert.rejects(s.delete(), failsWith(404));
    await assert.rejects(s.run("true"), (e) => e instanceof Error);
    await assert.rejects(s.files.readFile(PRE), (e) => e.statusCode === 404);
    await assert.rejects(sbx.isolation.attach("00000000-0000-4000-8000-000000000000"), failsWith(404));
    assert.deepEqual((await sbx.isolation.list()).map((x) => x.session_id), [other.sessionId]);
    await drop(other);
    assert.deepEqual(await sbx.isolation.list(), []);

    const once = await sbx.isolation.runOnce(`cat ${PRE}; echo scratch > ${WS}/once.txt`, WS);
    assert.equal(once.exitCode, 0, stderrOf(once));
    assert.equal(stdoutOf(once), "from before");
    assert.equal(await sh(sbx, `test -e ${WS}/once.txt && echo present || echo absent`), "absent");
    assert.deepEqual(await sbx.isolation.list(), []);

    const seen = await sbx.isolation.withSession({ workspace: { path: WS }, profile: "strict" }, async (w) => {
      assert.deepEqual((await sbx.isolation.list()).map((x) => x.session_id), [w.sessionId]);
      return (await run(w, "echo inside")).out;
    });
    assert.equal(seen, "inside");
    assert.deepEqual(await sbx.isolation.list(), []);
    await assert.rejects(sbx.isolation.withSession({ workspace: { path: WS } }, async () => {
      throw new Error("from fn");
    }), /from fn/);
    assert.deepEqual(await sbx.isolation.list(), []);
  });

  test("bad requests reject with 400", { timeout: TEST_TIMEOUT }, async () => {
    const bad = [
      { workspace: { path: "relative" } },
      { workspace: { path: WS, mode: "bogus" } },
      { workspace: { path: WS }, profile: "bogus" },
      { workspace: { path: "/" } },
      { workspace: { path: `${WS}/../etc` } },
      { profile: "strict" },
      { workspace: { path: WS }, uid: -1 },
      { workspace: { path: WS }, env_passthrough: { mode: "maybe" } },
      { workspace: { path: WS }, idle_timeout_seconds: "soon" },
    ];
    for (const request of bad) {
      await assert.rejects(sbx.isolation.create(request), failsWith(400), JSON.stringify(request));
    }
    await assert.rejects(sbx.isolation.runOnce("true", "relative"), failsWith(400));
    // What capabilities() says is missing: userns_available false -> 503.
    assert.equal((await sbx.isolation.capabilities()).userns_available, false);
    await assert.rejects(sbx.isolation.create({ workspace: { path: WS }, uid_mode: "userns" }), failsWith(503));
    assert.deepEqual(await sbx.isolation.list(), []);
  });

  test("diff is a tar.gz of the changes, commit merges them into the sandbox", { timeout: TEST_TIMEOUT }, async () => {
    // The SDK has no call for /diff or /commit: raw fetch on the endpoint the SDK uses.
    await sbx.files.writeFiles([{ path: `${WS}/before-commit.txt`, data: "old\n" }]);
    const s = await session({ workspace: { path: WS, mode: "overlay" } });
    assert.equal((await run(s, `echo committed > ${WS}/c.txt; rm ${WS}/before-commit.txt; echo ok`)).out, "ok");
    const ep = await sbx.getEndpoint(AGENT_PORT);
    const base = `http://${ep.endpoint}/v1/isolated/session/${s.sessionId}`;
    const diff = await fetch(`${base}/diff`, { headers: ep.headers });
    assert.equal(diff.status, 200);
    assert.equal(diff.headers.get("content-type"), "application/gzip");
    const tgz = Buffer.from(await diff.arrayBuffer());
    assert.equal(tgz[0], 0x1f); // gzip magic
    assert.equal(tgz[1], 0x8b);
    const tar = zlib.gunzipSync(tgz).toString("latin1");
    assert.ok(tar.includes("c.txt") && tar.includes("committed") && tar.includes("before-commit.txt"));
    assert.equal(await sbx.files.readFile(`${WS}/before-commit.txt`), "old\n"); // not yet
    const res = await fetch(`${base}/commit`, { method: "POST", headers: ep.headers });
    assert.equal(res.status, 200);
    assert.equal((await res.json()).status, "committed");
    assert.equal(await sbx.files.readFile(`${WS}/c.txt`), "committed\n");
    await assert.rejects(sbx.files.readFile(`${WS}/before-commit.txt`));
    await drop(s);
  });

  test("the same through coved's server proxy (useServerProxy)", { timeout: TEST_TIMEOUT }, async () => {
    const iso = proxied.isolation;
    assert.equal((await iso.capabilities()).available, true);
    const s = await session({ workspace: { path: WS, mode: "overlay" } }, iso);
    assert.equal((await run(s, `echo proxied > ${WS}/p.txt; cat ${WS}/p.txt`)).out, "proxied");
    await s.files.writeFiles([{ path: `${WS}/p2.txt`, data: "two" }]);
    assert.equal(await s.files.readFile(`${WS}/p2.txt`), "two");
    assert.deepEqual((await sbx.isolation.list()).map((x) => x.session_id), [s.sessionId]);
    assert.equal((await s.get()).status, "active");
    await drop(s);
    await assert.rejects(s.get(), failsWith(404));
    assert.equal(await sh(sbx, `ls ${WS}/p.txt ${WS}/p2.txt 2>/dev/null || echo none`), "none");
  });
});
