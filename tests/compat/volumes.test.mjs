// Volumes through the official OpenSandbox JavaScript SDK (@alibaba-group/opensandbox 0.1.11):
// Sandbox.create({volumes}) passes the spec's Volume objects through as they are. A host bind
// (read-only, and with subPath), a pvc named volume shared by two sandboxes, and the SDK's
// error for ossfs. Its own coved, with a host root of its own.

import assert from "node:assert/strict";
import { chownSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";

import { Sandbox, SandboxApiException } from "@alibaba-group/opensandbox";

import { Coved } from "./coved.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
const OWNER = 23457; // host owner of the bound directory: root inside
const root = mkdtempSync(join(tmpdir(), "cove-compat-volumes-"));
const coved = new Coved({ extraArgs: ["--volume-host-root", root] });
const closable = [];

before(async () => {
  await coved.start();
});

after(async () => {
  for (const c of closable) await c.close().catch(() => {});
  const problems = await coved.cleanup({ keepLogAs: join(HERE, "coved-volumes.log") });
  rmSync(root, { recursive: true, force: true });
  if (problems.length) console.error(`cleanup:\n  ${problems.join("\n  ")}`);
});

async function create(volumes) {
  const sbx = await Sandbox.create({
    connectionConfig: { domain: coved.domain, apiKey: coved.apiKey, requestTimeoutSeconds: 60 },
    image: "base",
    volumes,
  });
  coved.track(sbx.id);
  closable.push(sbx);
  return sbx;
}

const stdoutOf = (ex) => ex.logs.stdout.map((m) => m.text).join("\n");

async function sh(sbx, command) {
  return { out: stdoutOf(await sbx.commands.run(command)) };
}

test("host volumes: read-only bind and subPath", { timeout: 120_000 }, async () => {
  const dir = join(root, "project");
  mkdirSync(join(dir, "src"), { recursive: true });
  writeFileSync(join(dir, "src", "main.txt"), "from the host\n");
  for (const p of [dir, join(dir, "src"), join(dir, "src", "main.txt")]) chownSync(p, OWNER, OWNER);
  const sbx = await create([
    { name: "code", host: { path: dir }, mountPath: "/workspace", readOnly: true },
    { name: "src", host: { path: dir }, mountPath: "/srcdir", subPath: "src" },
  ]);
  assert.equal((await sh(sbx, "cat /workspace/src/main.txt")).out, "from the host");
  const ro = await sh(sbx, "touch /workspace/x 2>&1; echo rc=$?");
  assert.match(ro.out, /Read-only file system/);
  assert.equal((await sh(sbx, "echo written > /srcdir/out.txt && ls /srcdir")).out, "main.txt\nout.txt");
  assert.equal(readFileSync(join(dir, "src", "out.txt"), "utf8"), "written\n");
  assert.deepEqual(readdirSync(dir).sort(), ["src"]);
  await sbx.kill();
});

test("pvc volume: made on first use, shared, kept", { timeout: 120_000 }, async () => {
  const a = await create([{ name: "data", pvc: { claimName: "compat-shared" }, mountPath: "/data" }]);
  const b = await create([{ name: "data", pvc: { claimName: "compat-shared" }, mountPath: "/mnt/data", readOnly: true }]);
  await sh(a, "echo shared > /data/f");
  assert.equal((await sh(b, "cat /mnt/data/f")).out, "shared");
  assert.notEqual((await sh(b, "touch /mnt/data/g 2>/dev/null; echo $?")).out, "0");
  const listed = await (await fetch(`${coved.baseUrl}/v1/volumes`, {
    headers: { "OPEN-SANDBOX-API-KEY": coved.apiKey },
  })).json();
  const vol = listed.items.find((v) => v.name === "compat-shared");
  assert.deepEqual(vol.sandboxes.sort(), [a.id, b.id].sort());
  await a.kill();
  await b.kill();
});

test("ossfs volumes are refused with a clear 400", { timeout: 60_000 }, async () => {
  await assert.rejects(
    create([{ name: "oss", ossfs: { bucket: "bkt", endpoint: "oss.example", accessKeyId: "i", accessKeySecret: "s" }, mountPath: "/oss" }]),
    (e) => {
      assert.ok(e instanceof SandboxApiException, `${e?.stack ?? e}`);
      assert.equal(e.statusCode, 400);
      assert.equal(e.error?.code, "VOLUME::UNSUPPORTED_BACKEND");
      assert.match(e.error?.message ?? "", /ossfs/);
      return true;
    },
  );
});
