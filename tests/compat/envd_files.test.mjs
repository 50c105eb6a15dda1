// The `e2b` SDK's files module (2.51.0, unmodified) against cove-agent's envd routes alone:
// GET/POST /files, GET /health and filesystem.Filesystem over Connect. The SDK is given a
// sandboxUrl that is a small forwarder of this test's, which passes every request to coved's
// OpenSandbox gateway route /sandboxes/{id}/proxy/44772 with the API key: what is tested is
// the agent's side of envd, whatever coved's own E2B routing does (e2b_sdk.test.mjs drives
// the whole path). The SDK is told envdVersion 0.4.0 (Cove reports 0.5.7), so writes are
// multipart, as it sends them to envd < 0.5.7; e2b_sdk.test.mjs covers the octet-stream form.

import assert from "node:assert/strict";
import http from "node:http";
import { dirname, join } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";

import { FileType, FilesystemEventType, NotFoundError, Sandbox } from "e2b";

import { Coved } from "./coved.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
const TEST_TIMEOUT = 120_000;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const coved = new Coved();
let forwarder;
let sbx;

/** Passes each request to the sandbox's agent through coved's gateway route, with the key. */
function forward(sandboxId) {
  const server = http.createServer((req, res) => {
    const headers = { ...req.headers, "open-sandbox-api-key": coved.apiKey, host: coved.domain };
    const up = http.request({
      host: "127.0.0.1", port: coved.port, method: req.method, headers,
      path: `/sandboxes/${sandboxId}/proxy/44772${req.url}`,
    }, (r) => {
      res.writeHead(r.statusCode, r.headers);
      r.pipe(res);
    });
    up.on("error", (e) => res.destroy(e));
    res.on("close", () => up.destroy());
    req.pipe(up);
  });
  return new Promise((ok) => server.listen(0, "127.0.0.1", () => ok(server)));
}

before(async () => {
  await coved.start();
  const res = await fetch(`${coved.baseUrl}/v1/sandboxes`, {
    method: "POST",
    headers: { "OPEN-SANDBOX-API-KEY": coved.apiKey, "Content-Type": "application/json" },
    body: JSON.stringify({ image: { uri: "base" }, entrypoint: ["sleep", "infinity"],
      resourceLimits: { cpu: "1", memory: "512Mi" } }),
  });
  const body = await res.json();
  assert.equal(res.status, 202, JSON.stringify(body));
  coved.track(body.id);
  forwarder = await forward(body.id);
  sbx = new Sandbox({ sandboxId: body.id, envdVersion: "0.4.0", apiKey: "unused",
    sandboxUrl: `http://127.0.0.1:${forwarder.address().port}`, requestTimeoutMs: 30_000 });
});

after(async () => {
  forwarder?.closeAllConnections();
  forwarder?.close();
  const problems = await coved.cleanup({ keepLogAs: join(HERE, "coved-envd-files.log") });
  if (problems.length) console.error(`cleanup:\n  ${problems.join("\n  ")}`);
});

test("write, read, stat, list, makeDir, rename, remove", { timeout: TEST_TIMEOUT }, async () => {
  const info = await sbx.files.write("/tmp/e2b/notes.txt", "first line\n");
  assert.deepEqual([info.name, info.type, info.path], ["notes.txt", "file", "/tmp/e2b/notes.txt"]);
  assert.equal(await sbx.files.read("/tmp/e2b/notes.txt"), "first line\n");
  assert.equal(await sbx.files.exists("/tmp/e2b/notes.txt"), true);
  assert.equal(await sbx.files.exists("/tmp/e2b/missing"), false);
  const stat = await sbx.files.getInfo("/tmp/e2b/notes.txt");
  assert.deepEqual([stat.type, stat.size, stat.permissions, stat.owner], [FileType.FILE, 11, "-rw-r--r--", "root"]);
  assert.ok(stat.modifiedTime instanceof Date);

  assert.equal(await sbx.files.makeDir("/tmp/e2b/sub/deeper"), true);
  assert.equal(await sbx.files.makeDir("/tmp/e2b/sub/deeper"), false, "exists already");
  await sbx.files.write("/tmp/e2b/sub/deeper/x.bin", new Uint8Array([0, 1, 2, 255]).buffer);
  const bytes = await sbx.files.read("/tmp/e2b/sub/deeper/x.bin", { format: "bytes" });
  assert.deepEqual([...bytes], [0, 1, 2, 255]);

  const top = await sbx.files.list("/tmp/e2b");
  assert.deepEqual(top.map((e) => [e.name, e.type]), [["notes.txt", FileType.FILE], ["sub", FileType.DIR]]);
  const deep = await sbx.files.list("/tmp/e2b", { depth: 3 });
  assert.deepEqual(deep.map((e) => e.path), ["/tmp/e2b/notes.txt", "/tmp/e2b/sub",
    "/tmp/e2b/sub/deeper", "/tmp/e2b/sub/deeper/x.bin"]);

  const moved = await sbx.files.rename("/tmp/e2b/notes.txt", "/tmp/e2b/renamed.txt");
  assert.equal(moved.path, "/tmp/e2b/renamed.txt");
  assert.equal(await sbx.files.exists("/tmp/e2b/notes.txt"), false);
  await sbx.files.remove("/tmp/e2b/sub");
  assert.equal(await sbx.files.exists("/tmp/e2b/sub"), false);
  await assert.rejects(sbx.files.read("/tmp/e2b/sub/deeper/x.bin"), (e) => e instanceof NotFoundError);
  await assert.rejects(sbx.files.getInfo("/tmp/e2b/sub"), (e) => e instanceof NotFoundError);
});

test("writeFiles: several files, relative paths under root's home", { timeout: TEST_TIMEOUT }, async () => {
  const written = await sbx.files.writeFiles([{ path: "/tmp/e2b/m1", data: "1" }, { path: "m2", data: "2" }]);
  assert.deepEqual(written.map((e) => e.path), ["/tmp/e2b/m1", "/root/m2"]);
  assert.equal(await sbx.files.read("m2"), "2");
});

test("a 20 MiB file round trip", { timeout: TEST_TIMEOUT }, async () => {
  const big = new Uint8Array(20 << 20);
  for (let i = 0; i < big.length; i += 997) big[i] = i & 255;
  await sbx.files.write("/tmp/big.bin", big.buffer);
  const back = await sbx.files.read("/tmp/big.bin", { format: "bytes" });
  assert.ok(Buffer.from(back).equals(Buffer.from(big)));
});

test("watchDir sees writes, renames and removals", { timeout: TEST_TIMEOUT }, async () => {
  await sbx.files.makeDir("/tmp/watched");
  const events = [];
  const handle = await sbx.files.watchDir("/tmp/watched", (ev) => events.push([ev.type, ev.name]));
  try {
    await sbx.files.write("/tmp/watched/a.txt", "a");
    await sbx.files.rename("/tmp/watched/a.txt", "/tmp/watched/b.txt");
    await sbx.files.remove("/tmp/watched/b.txt");
    for (let i = 0; i < 200 && events.length < 5; i++) await sleep(50);
  } finally {
    await handle.stop();
  }
  assert.deepEqual(events, [[FilesystemEventType.CREATE, "a.txt"], [FilesystemEventType.WRITE, "a.txt"],
    [FilesystemEventType.RENAME, "a.txt"], [FilesystemEventType.CREATE, "b.txt"],
    [FilesystemEventType.REMOVE, "b.txt"]]);
});
