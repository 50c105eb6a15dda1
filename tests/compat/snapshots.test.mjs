// Snapshots through the official OpenSandbox JavaScript SDK (@alibaba-group/opensandbox 0.1.11):
// SandboxManager.createSnapshot (POST /v1/sandboxes/{id}/snapshots), getSnapshot,
// listSnapshots ({sandboxId, states} as ?sandboxId=&state=&state=), deleteSnapshot, and
// Sandbox.create({snapshotId}) (the SDK then sends snapshotId instead of image, with its own
// default entrypoint, tail -f /dev/null). A sandbox started from a snapshot must have the files
// its source had at that moment: one written, one written and then deleted (absent: the
// overlay's whiteout came along), a directory replaced by another of the same name (only the
// new one's files: the opaque directory came along), and nothing the source wrote later.
// Its own coved.

import assert from "node:assert/strict";
import { dirname, join } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";

import { Sandbox, SandboxApiException, SandboxManager } from "@alibaba-group/opensandbox";

import { Coved } from "./coved.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
const TEST_TIMEOUT = 180_000;
const coved = new Coved();
const closable = [];
const snapshotIds = new Set();
let mgr;

before(async () => {
  await coved.start();
  mgr = SandboxManager.create({ connectionConfig: connection() });
  closable.push(mgr);
});

after(async () => {
  // Sandboxes first (a snapshot in use cannot go), then the snapshots, then coved.
  for (const id of coved.sandboxIds) await mgr?.killSandbox(id).catch(() => {});
  for (const id of snapshotIds) await mgr?.deleteSnapshot(id).catch(() => {});
  for (const c of closable) await c.close().catch(() => {});
  const problems = await coved.cleanup({ keepLogAs: join(HERE, "coved-snapshots.log") });
  if (problems.length) console.error(`cleanup:\n  ${problems.join("\n  ")}`);
});

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function connection() {
  return { domain: coved.domain, apiKey: coved.apiKey, requestTimeoutSeconds: 60 };
}

async function create(source) {
  const sbx = await Sandbox.create({ connectionConfig: connection(), ...source });
  coved.track(sbx.id);
  closable.push(sbx);
  return sbx;
}

const stdoutOf = (ex) => ex.logs.stdout.map((m) => m.text).join("\n");

async function sh(sbx, command) {
  const ex = await sbx.commands.run(command);
  assert.equal(ex.error, undefined, `${command}: ${JSON.stringify(ex.error)}`);
  return stdoutOf(ex);
}

/** assert.rejects predicate: an API error with this status and a server-given {code, message}. */
function apiError(status, code) {
  return (e) => {
    assert.ok(e instanceof SandboxApiException, `expected a SandboxApiException, got ${e?.stack ?? e}`);
    assert.equal(e.statusCode, status, `expected HTTP ${status}, got ${e.statusCode}: ${e.message}`);
    assert.ok(e.error?.code && e.error.code !== "UNEXPECTED_RESPONSE",
      `the error body must carry a code: ${JSON.stringify(e.rawBody)}`);
    if (code) assert.equal(e.error.code, code);
    return true;
  };
}

async function waitReady(id, timeoutMs = 120_000) {
  const deadline = Date.now() + timeoutMs;
  let info;
  while (Date.now() < deadline) {
    info = await mgr.getSnapshot(id);
    if (info.status.state !== "Creating") break;
    await sleep(50);
  }
  assert.equal(info.status.state, "Ready", `snapshot ${id}: ${JSON.stringify(info.status)}`);
  return info;
}

async function snapshot(sandboxId, req) {
  const snap = await mgr.createSnapshot(sandboxId, req);
  snapshotIds.add(snap.id);
  return snap;
}

test("snapshot a sandbox, start another from it, delete it", { timeout: TEST_TIMEOUT }, async () => {
  const src = await create({ image: "base" });
  await src.files.writeFiles([{ path: "/home/snap/kept.txt", data: "kept\n" }]);
  await sh(src, "echo gone > /home/snap/gone.txt && rm /home/snap/gone.txt");
  await sh(src, "mkdir -p /etc/snapdir && echo old > /etc/snapdir/old.txt");
  await sh(src, "rm -r /etc/snapdir && mkdir /etc/snapdir && echo new > /etc/snapdir/new.txt");
  // a directory of the template replaced (the base template's /etc/skel has .bashrc, ...)
  assert.match(await sh(src, "ls -A /etc/skel"), /\.bashrc/);
  await sh(src, "rm -rf /etc/skel && mkdir /etc/skel && echo mine > /etc/skel/only.txt");

  const accepted = await snapshot(src.id, { name: "compat-snap" });
  assert.equal(accepted.sandboxId, src.id);
  assert.equal(accepted.name, "compat-snap");
  assert.equal(accepted.status.state, "Creating");
  assert.ok(accepted.createdAt instanceof Date && !Number.isNaN(accepted.createdAt.getTime()));
  const ready = await waitReady(accepted.id);
  assert.equal(ready.id, accepted.id);
  assert.ok(ready.status.lastTransitionAt instanceof Date);

  // the source runs on; what it writes now stays out of the snapshot
  assert.equal((await mgr.getSandboxInfo(src.id)).status.state, "Running");
  await sh(src, "echo later > /home/snap/kept.txt && echo after > /home/snap/after.txt");

  const copy = await create({ snapshotId: accepted.id });
  assert.equal((await mgr.getSandboxInfo(copy.id)).snapshotId, accepted.id);
  assert.equal(await copy.files.readFile("/home/snap/kept.txt"), "kept\n");
  assert.equal(await sh(copy, "ls -A /home/snap"), "kept.txt");
  assert.equal(await sh(copy, "ls -A /etc/snapdir && cat /etc/snapdir/new.txt"), "new.txt\nnew");
  assert.equal(await sh(copy, "ls -A /etc/skel"), "only.txt");
  assert.equal(await copy.files.readFile("/home/snap/kept.txt"), "kept\n");
  // and they are two sandboxes: a write in the copy is not in the source
  await sh(copy, "echo copy > /home/snap/copy.txt");
  assert.equal(await sh(src, "ls -A /home/snap"), "after.txt\nkept.txt");

  // list: by sandbox and by state
  const bySandbox = await mgr.listSnapshots({ sandboxId: src.id });
  assert.deepEqual(bySandbox.items.map((s) => s.id), [accepted.id]);
  assert.ok(bySandbox.items[0].createdAt instanceof Date);
  assert.equal(bySandbox.pagination?.totalItems, 1);
  assert.deepEqual((await mgr.listSnapshots({ sandboxId: copy.id })).items, []);
  assert.deepEqual((await mgr.listSnapshots({ states: ["Ready"] })).items.map((s) => s.id),
    [accepted.id]);
  assert.deepEqual((await mgr.listSnapshots({ states: ["Failed", "Ready"] })).items.map((s) => s.id),
    [accepted.id]);
  assert.deepEqual((await mgr.listSnapshots({ states: ["Failed"] })).items, []);
  assert.deepEqual((await mgr.listSnapshots({ name: "compat-snap" })).items.map((s) => s.id),
    [accepted.id]);

  // refused while a sandbox started from it exists
  await assert.rejects(mgr.deleteSnapshot(accepted.id), apiError(409));
  assert.equal((await mgr.getSnapshot(accepted.id)).status.state, "Ready");
  await copy.kill();
  coved.sandboxIds.delete(copy.id);
  await mgr.deleteSnapshot(accepted.id);
  snapshotIds.delete(accepted.id);
  await assert.rejects(mgr.getSnapshot(accepted.id), apiError(404, "SNAPSHOT::NOT_FOUND"));
  assert.deepEqual((await mgr.listSnapshots({ sandboxId: src.id })).items, []);
  await assert.rejects(create({ snapshotId: accepted.id }), apiError(404, "SNAPSHOT::NOT_FOUND"));
  await src.kill();
});

test("a snapshot outlives its sandbox; unnamed; refusals", { timeout: TEST_TIMEOUT }, async () => {
  const src = await create({ image: "base" });
  await src.files.writeFiles([{ path: "/tmp/keep/a", data: "a" }]);
  await sh(src, "head -c 128M /dev/urandom > /tmp/keep/big");
  const snap = await snapshot(src.id);
  assert.equal(snap.name ?? "", "");
  // copying 128 MiB takes a while: a delete meanwhile is refused
  await assert.rejects(mgr.deleteSnapshot(snap.id), apiError(409, "SNAPSHOT::INVALID_STATE"));
  await waitReady(snap.id);
  await src.kill();
  coved.sandboxIds.delete(src.id);
  const listed = await mgr.listSnapshots({ sandboxId: src.id });
  assert.deepEqual(listed.items.map((s) => s.id), [snap.id]);
  const copy = await create({ snapshotId: snap.id });
  assert.equal(await copy.files.readFile("/tmp/keep/a"), "a");
  assert.equal(await sh(copy, "stat -c %s /tmp/keep/big"), String(128 << 20));
  await copy.kill();
  coved.sandboxIds.delete(copy.id);

  await assert.rejects(mgr.createSnapshot("no-such-sandbox"), apiError(404));
  await assert.rejects(mgr.getSnapshot("no-such-snapshot"), apiError(404, "SNAPSHOT::NOT_FOUND"));
  await assert.rejects(mgr.deleteSnapshot("no-such-snapshot"), apiError(404, "SNAPSHOT::NOT_FOUND"));
  // a paused sandbox is not Running: 409
  const paused = await create({ image: "base" });
  await mgr.pauseSandbox(paused.id);
  for (let i = 0; i < 100 && (await mgr.getSandboxInfo(paused.id)).status.state !== "Paused"; i++) {
    await sleep(50);
  }
  await assert.rejects(mgr.createSnapshot(paused.id), apiError(409));
  assert.deepEqual((await mgr.listSnapshots({ sandboxId: paused.id })).items, []);
  await mgr.killSandbox(paused.id);
  coved.sandboxIds.delete(paused.id);

  await mgr.deleteSnapshot(snap.id);
  snapshotIds.delete(snap.id);
});

test("a snapshot of a sandbox made from a snapshot stacks on it", { timeout: TEST_TIMEOUT }, async () => {
  const first = await create({ image: "base" });
  await sh(first, "mkdir -p /home/chain && echo a > /home/chain/a && echo b > /home/chain/b");
  const one = await snapshot(first.id, { name: "one" });
  await waitReady(one.id);
  await first.kill();
  coved.sandboxIds.delete(first.id);

  const second = await create({ snapshotId: one.id });
  await sh(second, "rm /home/chain/a && echo c > /home/chain/c && echo b2 > /home/chain/b");
  const two = await snapshot(second.id, { name: "two" });
  await waitReady(two.id);
  await second.kill();
  coved.sandboxIds.delete(second.id);

  const third = await create({ snapshotId: two.id });
  assert.equal(await sh(third, "ls -A /home/chain && cat /home/chain/b"), "b\nc\nb2");
  await third.kill();
  coved.sandboxIds.delete(third.id);
  // no sandbox uses "one" now, but "two" stands on it
  await assert.rejects(mgr.deleteSnapshot(one.id), apiError(409));
  await mgr.deleteSnapshot(two.id);
  snapshotIds.delete(two.id);
  await mgr.deleteSnapshot(one.id);
  snapshotIds.delete(one.id);
});
