// OCI images through the official OpenSandbox JavaScript SDK (@alibaba-group/opensandbox):
// Sandbox.create({image: "<registry>/<repo>:<tag>"}) with an image coved has never seen pulls
// it from the registry (Debian's docker-registry on loopback, started by registry_helper.py
// with a small busybox image pushed), then runs in it; the image's config is honoured (its
// Env and WorkingDir, its User), and a create by digest of the same image pulls nothing again.
// Its own coved.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { dirname, join } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";

import { Sandbox, SandboxManager } from "@alibaba-group/opensandbox";

import { Coved } from "./coved.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
const TEST_TIMEOUT = 180_000;
const coved = new Coved();
const closable = [];
let mgr, registry, image;

// The registry helper: its first line says where the image is; closing its stdin ends it.
function startRegistry() {
  const proc = spawn("python3", [join(HERE, "registry_helper.py")],
    { stdio: ["pipe", "pipe", "inherit"] });
  return new Promise((resolve, reject) => {
    const lines = createInterface({ input: proc.stdout });
    lines.once("line", (line) => resolve({ proc, info: JSON.parse(line) }));
    proc.once("exit", (code) => reject(new Error(`registry_helper.py exited ${code}`)));
  });
}

before(async () => {
  ({ proc: registry, info: image } = await startRegistry());
  await coved.start();
  mgr = SandboxManager.create({ connectionConfig: connection() });
  closable.push(mgr);
});

after(async () => {
  for (const id of coved.sandboxIds) await mgr?.killSandbox(id).catch(() => {});
  for (const c of closable) await c.close().catch(() => {});
  const problems = await coved.cleanup({ keepLogAs: join(HERE, "coved-images.log") });
  if (problems.length) console.error(`cleanup:\n  ${problems.join("\n  ")}`);
  if (registry) {
    const gone = new Promise((r) => registry.once("exit", r));
    registry.stdin.end();
    await gone;
  }
});

function connection() {
  return { domain: coved.domain, apiKey: coved.apiKey, requestTimeoutSeconds: 120 };
}

async function create(opts) {
  const sbx = await Sandbox.create({ connectionConfig: connection(), ...opts });
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

test("a sandbox from a registry's image, pulled by the create", { timeout: TEST_TIMEOUT }, async () => {
  const sbx = await create({ image: image.ref, metadata: { suite: "images" } });
  const info = await sbx.getInfo();
  assert.equal(info.image?.uri, image.ref);
  assert.equal(info.status.state, "Running");
  // busybox, the image's own files; its Env, WorkingDir and User
  assert.match(await sh(sbx, "ls /bin/busybox"), /busybox/);
  assert.equal((await sh(sbx, "echo $GREETING")).trim(), image.greeting);
  assert.equal((await sh(sbx, "pwd")).trim(), "/work");
  assert.equal((await sh(sbx, "id -u")).trim(), "1000");
  // files through the SDK, in the image's root
  await sbx.files.writeFiles([{ path: "/tmp/sdk.txt", data: "from the SDK\n" }]);
  assert.equal(await sbx.files.readFile("/tmp/sdk.txt"), "from the SDK\n");

  // The images list has it, and a create by digest starts from the same image at once.
  const images = await (await fetch(`http://${coved.domain}/v1/images`,
    { headers: { "OPEN-SANDBOX-API-KEY": coved.apiKey } })).json();
  const mine = images.items.find((i) => i.references.includes(image.ref));
  assert.ok(mine, JSON.stringify(images));
  const again = await create({ image: image.digestRef });
  assert.equal((await again.getInfo()).image?.uri, image.digestRef);
  assert.equal((await sh(again, "echo $GREETING")).trim(), image.greeting);
  await again.kill();
  await sbx.kill();
});

test("an image the registry does not have: a clear error, no sandbox left", { timeout: TEST_TIMEOUT }, async () => {
  const before = (await mgr.listSandboxInfos({})).items.length;
  const missing = image.ref.replace(":v1", ":no-such-tag");
  await assert.rejects(create({ image: missing }), (e) => {
    assert.match(String(e?.message ?? e), /IMAGE::NOT_FOUND|not found/);
    return true;
  });
  assert.equal((await mgr.listSandboxInfos({})).items.length, before);
});
