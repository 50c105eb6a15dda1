// The fine print through the official OpenSandbox JavaScript SDK
// (@alibaba-group/opensandbox 0.1.11), where the SDK exposes the call: renew to an earlier
// expiry, a list filter on a state Cove never produces, the endpoint's access-token header,
// readFile with offset or limit alone, image names the SDK examples use, an entrypoint that
// cannot start, and a killed sandbox remembered. Starts its own coved; every sandbox is
// deleted and coved stopped in teardown.

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { dirname, join } from "node:path";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";

import { Sandbox, SandboxApiException, SandboxManager } from "@alibaba-group/opensandbox";

import { AGENT_PORT, Coved } from "./coved.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
const RUN = randomBytes(4).toString("hex");
const TEST_TIMEOUT = 180_000;

const coved = new Coved();
const closable = [];

before(async () => {
  await coved.start();
});

after(async () => {
  for (const c of closable) await c.close().catch(() => {});
  const problems = await coved.cleanup({ keepLogAs: join(HERE, "coved-fineprint.log") });
  if (problems.length) console.error(`cleanup:\n  ${problems.join("\n  ")}`);
});

function connection() {
  return { domain: coved.domain, apiKey: coved.apiKey, requestTimeoutSeconds: 60 };
}

async function createSandbox(opts = {}) {
  const sbx = await Sandbox.create({ connectionConfig: connection(), image: "base", ...opts });
  coved.track(sbx.id);
  closable.push(sbx);
  return sbx;
}

function manager() {
  const m = SandboxManager.create({ connectionConfig: connection() });
  closable.push(m);
  return m;
}

function apiError(status, messagePart) {
  return (e) => {
    assert.ok(e instanceof SandboxApiException, `expected a SandboxApiException, got ${e?.stack ?? e}`);
    assert.equal(e.statusCode, status, `expected HTTP ${status}, got ${e.statusCode}: ${e.message}`);
    if (messagePart !== undefined) {
      const text = `${e.error?.message ?? ""} ${e.rawBody ?? ""}`;
      assert.ok(text.includes(messagePart), `expected "${messagePart}" in ${text}`);
    }
    return true;
  };
}

describe("fine print through the SDK", () => {
  test("renew to an earlier time than the current expiry; the past is refused", { timeout: TEST_TIMEOUT }, async () => {
    const sbx = await createSandbox({ timeoutSeconds: 3600, metadata: { run: RUN, suite: "renew" } });
    const renewed = await sbx.renew(120);
    assert.ok(Math.abs(renewed.expiresAt.getTime() - (Date.now() + 120_000)) < 5_000);
    const info = await sbx.getInfo();
    assert.ok(Math.abs(info.expiresAt.getTime() - renewed.expiresAt.getTime()) < 1_000);
    await assert.rejects(sbx.renew(-60), apiError(400));
    await sbx.kill();
  });

  test("a state filter Cove never produces matches nothing", { timeout: TEST_TIMEOUT }, async () => {
    const mgr = manager();
    const sbx = await createSandbox({ metadata: { run: RUN, suite: "states" } });
    const metadata = { run: RUN, suite: "states" };
    const none = await mgr.listSandboxInfos({ states: ["Allocated"], metadata });
    assert.deepEqual(none.items, []);
    const some = await mgr.listSandboxInfos({ states: ["Allocated", "Running"], metadata });
    assert.deepEqual(some.items.map((s) => s.id), [sbx.id]);
    await sbx.kill();
  });

  test("the endpoint's header is X-EXECD-ACCESS-TOKEN and opens execd on its own", { timeout: TEST_TIMEOUT }, async () => {
    const sbx = await createSandbox({ metadata: { run: RUN, suite: "token" } });
    const ep = await sbx.getEndpoint(AGENT_PORT);
    assert.deepEqual(Object.keys(ep.headers ?? {}), ["X-EXECD-ACCESS-TOKEN"]);
    const ping = await fetch(`http://${ep.endpoint}/ping`, { headers: ep.headers });
    assert.equal(ping.status, 200);
    const refused = await fetch(`http://${ep.endpoint}/ping`);
    assert.equal(refused.status, 401);
    await sbx.kill();
  });

  test("readFile with offset or limit alone: lines joined by \\n, none added", { timeout: TEST_TIMEOUT }, async () => {
    const sbx = await createSandbox({ metadata: { run: RUN, suite: "lines" } });
    const path = "/tmp/lines.txt";
    await sbx.files.writeFiles([{ path, data: "l1\nl2\r\nl3\n" }]);
    assert.equal(await sbx.files.readFile(path, { offset: 2 }), "l2\nl3");
    assert.equal(await sbx.files.readFile(path, { limit: 2 }), "l1\nl2");
    assert.equal(await sbx.files.readFile(path, { offset: 2, limit: 1 }), "l2");
    assert.equal(await sbx.files.readFile(path, { offset: 9 }), "");
    await assert.rejects(sbx.files.readFile(path, { offset: 1, range: "bytes=0-1" }), apiError(400));
    await sbx.kill();
  });

  test("image names of the SDK examples map to Cove's templates", { timeout: TEST_TIMEOUT }, async () => {
    for (const image of ["opensandbox/code-interpreter:v1.0.1",
      "sandbox-registry.cn-zhangjiakou.cr.aliyuncs.com/opensandbox/code-interpreter:v1.0.1"]) {
      const sbx = await createSandbox({ image, metadata: { run: RUN, suite: "alias" } });
      assert.equal((await sbx.getInfo()).image?.uri, "code-interpreter");
      await sbx.kill();
    }
    await assert.rejects(createSandbox({ image: "opensandbox/chrome:latest" }),
      apiError(400, "opensandbox/code-interpreter"));
  });

  test("an entrypoint that cannot start: Failed with the reason", { timeout: TEST_TIMEOUT }, async () => {
    const sbx = await createSandbox({ entrypoint: ["/no/such/program"], skipHealthCheck: true,
      metadata: { run: RUN, suite: "entrypoint" } });
    const info = await sbx.getInfo();
    assert.equal(info.status.state, "Failed");
    assert.equal(info.status.reason, "entrypoint_failed");
    assert.match(info.status.message, /\/no\/such\/program.*No such file/);
    await sbx.kill();
  });

  test("a killed sandbox: 404 saying user_delete, and listed as Terminated", { timeout: TEST_TIMEOUT }, async () => {
    const mgr = manager();
    const metadata = { run: RUN, suite: "ended" };
    const sbx = await createSandbox({ metadata });
    await sbx.kill();
    await assert.rejects(mgr.getSandboxInfo(sbx.id), apiError(404, "user_delete"));
    const ended = await mgr.listSandboxInfos({ states: ["Terminated"], metadata });
    assert.deepEqual(ended.items.map((s) => s.id), [sbx.id]);
    assert.equal(ended.items[0].status.state, "Terminated");
    assert.equal(ended.items[0].status.reason, "user_delete");
    assert.ok(ended.items[0].createdAt instanceof Date);
  });
});
