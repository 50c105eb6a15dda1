// Cove's E2B control plane (/e2b, openapi.yml) against the official `e2b` SDK (2.51.0),
// unmodified, pointed at a coved this test starts: apiUrl http://127.0.0.1:PORT/e2b and one
// of coved's API keys. Only the control plane: nothing here needs envd (commands, files), so
// what runs in a sandbox is checked through the OpenSandbox SDK on the same sandbox.
//
// What the SDK sends and expects (its dist/index.mjs, 2.51.0), in short:
// - Every call carries X-API-KEY; errors are read as {code: <int>, message}: kill() says false
//   and getInfo()/setTimeout() throw SandboxNotFoundError when code is 404, pause() says false
//   on a 409, a 401 is an AuthenticationError.
// - Sandbox.create: POST /v2/sandboxes (not in openapi.yml) {templateID, metadata, envVars,
//   timeout (seconds, left out unless timeoutMs is given), autoPause...}; it reads sandboxID,
//   envdVersion (>= 0.1.0 or it kills the sandbox), envdAccessToken, domain.
// - Sandbox.connect / sandbox.connect(): POST /v2/sandboxes/{id}/connect {timeout?}.
// - Sandbox.list: GET /v2/sandboxes?metadata=<url-encoded k=v&...>&state=a,b&limit&nextToken;
//   the next page's token is the x-next-token header.
// - updateNetwork: PUT /sandboxes/{id}/network {allowOut?, denyOut?, allow_internet_access?}.
// - The SDK has no template listing: GET /templates is fetched directly.

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { describe, test } from "node:test";

import { AuthenticationError, NotFoundError, Sandbox, SandboxNotFoundError } from "e2b";
import { Sandbox as OpenSandbox } from "@alibaba-group/opensandbox";

import { covedForFile, e2bOptions, until } from "./harness.mjs";

const RUN = randomBytes(4).toString("hex"); // tags this run's sandboxes in metadata
const TEST_TIMEOUT = 180_000;

const coved = covedForFile("coved-e2b.log");

async function create(opts = {}) {
  const sbx = await Sandbox.create("base", { ...e2bOptions(coved), ...opts });
  coved.track(sbx.sandboxId);
  return sbx;
}

/** Every item of a listing, all pages. */
async function listAll(query, limit) {
  const paginator = Sandbox.list({ ...e2bOptions(coved), query, limit });
  const items = [];
  let pages = 0;
  while (paginator.hasNext) {
    items.push(...(await paginator.nextItems()));
    pages++;
  }
  return { items, pages };
}

describe("E2B control plane through the e2b SDK", () => {
  test("create from base with metadata and envs; the same sandbox through the OpenSandbox API",
    { timeout: TEST_TIMEOUT }, async () => {
      const sbx = await create({ metadata: { run: RUN, role: "envs" }, envs: { E2B_FOO: "bar baz" } });
      assert.match(sbx.sandboxId, /^[a-z0-9]+$/);
      const info = await sbx.getInfo();
      assert.equal(info.sandboxId, sbx.sandboxId);
      assert.equal(info.templateId, "base");
      assert.deepEqual(info.metadata, { run: RUN, role: "envs" });
      assert.equal(info.state, "running");
      assert.ok(info.startedAt instanceof Date && !Number.isNaN(info.startedAt.getTime()));
      // No timeoutMs given: E2B's five minutes, from the start.
      const lifetime = info.endAt.getTime() - info.startedAt.getTime();
      assert.ok(lifetime > 250_000 && lifetime < 400_000, `lifetime ${lifetime} ms`);
      assert.ok(info.cpuCount >= 1 && info.memoryMB >= 128, JSON.stringify(info));
      assert.ok(info.envdVersion);

      // The OpenSandbox SDK sees it under the same id, and the envs reached its processes.
      const os = await OpenSandbox.connect({
        sandboxId: sbx.sandboxId,
        connectionConfig: { domain: coved.domain, apiKey: coved.apiKey, requestTimeoutSeconds: 60 },
      });
      coved.closable.push(os);
      const ex = await os.commands.run("printf '%s' \"$E2B_FOO\"");
      assert.equal(ex.logs.stdout.map((m) => m.text).join(""), "bar baz");
      assert.equal((await os.getInfo()).metadata.run, RUN);
      assert.equal(await sbx.kill(), true);
    });

  test("list: filters by metadata and state, pages with x-next-token", { timeout: TEST_TIMEOUT }, async () => {
    const tag = `list-${RUN}`;
    const a = await create({ metadata: { run: tag, role: "a" } });
    const b = await create({ metadata: { run: tag, role: "b" } });
    const c = await create({ metadata: { run: tag, role: "c" } });
    const other = await create({ metadata: { run: `other-${RUN}` } });
    try {
      const all = await listAll({ metadata: { run: tag } });
      assert.deepEqual(all.items.map((s) => s.sandboxId).sort(),
        [a.sandboxId, b.sandboxId, c.sandboxId].sort());
      for (const s of all.items) {
        assert.equal(s.templateId, "base");
        assert.equal(s.state, "running");
        assert.ok(s.startedAt instanceof Date && s.endAt instanceof Date);
      }
      const paged = await listAll({ metadata: { run: tag } }, 1);
      assert.equal(paged.pages, 3);
      assert.deepEqual(paged.items.map((s) => s.sandboxId).sort(), all.items.map((s) => s.sandboxId).sort());

      const byTwo = await listAll({ metadata: { run: tag, role: "b" } });
      assert.deepEqual(byTwo.items.map((s) => s.sandboxId), [b.sandboxId]);

      assert.equal(await b.pause(), true);
      assert.equal(await b.pause(), false, "a second pause is a 409, which the SDK says as false");
      const paused = await listAll({ metadata: { run: tag }, state: ["paused"] });
      assert.deepEqual(paused.items.map((s) => s.sandboxId), [b.sandboxId]);
      assert.equal(paused.items[0].state, "paused");
      const running = await listAll({ metadata: { run: tag }, state: ["running"] });
      assert.deepEqual(running.items.map((s) => s.sandboxId).sort(), [a.sandboxId, c.sandboxId].sort());
      const both = await listAll({ metadata: { run: tag }, state: ["running", "paused"] });
      assert.equal(both.items.length, 3);
    } finally {
      for (const s of [a, b, c, other]) await s.kill();
    }
  });

  test("pause, then connect: running again, same sandbox", { timeout: TEST_TIMEOUT }, async () => {
    const sbx = await create({ metadata: { run: RUN, role: "pause" } });
    assert.equal(await sbx.pause(), true);
    assert.equal((await Sandbox.getInfo(sbx.sandboxId, e2bOptions(coved))).state, "paused");
    const again = await Sandbox.connect(sbx.sandboxId, e2bOptions(coved));
    assert.equal(again.sandboxId, sbx.sandboxId);
    assert.equal((await again.getInfo()).state, "running");
    // connect on a running one changes nothing and still answers.
    await again.connect();
    assert.equal((await again.getInfo()).state, "running");
    // The state survived the pause: the OpenSandbox side runs a command in it.
    const os = await OpenSandbox.connect({
      sandboxId: sbx.sandboxId,
      connectionConfig: { domain: coved.domain, apiKey: coved.apiKey, requestTimeoutSeconds: 60 },
    });
    coved.closable.push(os);
    const ex = await os.commands.run("echo alive");
    assert.equal(ex.logs.stdout.map((m) => m.text).join("").trim(), "alive");
    const metrics = await again.getMetrics();
    assert.equal(metrics.length, 1);
    assert.ok(metrics[0].memTotal > 0 && metrics[0].cpuCount >= 1, JSON.stringify(metrics));
    await again.kill();
  });

  test("setTimeout, then it expires", { timeout: TEST_TIMEOUT }, async () => {
    const sbx = await create({ timeoutMs: 120_000 });
    const before = await sbx.getInfo();
    await sbx.setTimeout(600_000);
    const later = await sbx.getInfo();
    assert.ok(later.endAt > before.endAt, "a longer timeout moves the end later");
    await sbx.setTimeout(2_000);
    const soon = await sbx.getInfo();
    assert.ok(soon.endAt < later.endAt, "a shorter one moves it sooner");
    await until(async () => {
      try {
        await Sandbox.getInfo(sbx.sandboxId, e2bOptions(coved));
        return false;
      } catch (e) {
        if (e instanceof SandboxNotFoundError) return true;
        throw e;
      }
    }, "the sandbox to expire");
    assert.equal(await Sandbox.kill(sbx.sandboxId, e2bOptions(coved)), false, "kill of an expired one is false");
  });

  test("kill: gone for both APIs", { timeout: TEST_TIMEOUT }, async () => {
    const sbx = await create();
    assert.equal(await sbx.kill(), true);
    await assert.rejects(Sandbox.getInfo(sbx.sandboxId, e2bOptions(coved)), SandboxNotFoundError);
    const { items } = await listAll({});
    assert.ok(!items.some((s) => s.sandboxId === sbx.sandboxId));
    await until(async () => {
      const { status, body } = await coved.raw("GET", `/v1/sandboxes/${sbx.sandboxId}`);
      return status === 404 || body?.status?.state === "Terminated";
    }, "the OpenSandbox API to see it gone");
  });

  test("network: create's allowOut/denyOut and updateNetwork are the egress policy", { timeout: TEST_TIMEOUT }, async () => {
    const policyOf = async (id) => {
      const { status, body } = await coved.raw("GET", `/sandboxes/${id}/proxy/18080/policy`);
      assert.equal(status, 200, JSON.stringify(body));
      return body.policy;
    };
    const sbx = await create({ network: { denyOut: ["0.0.0.0/0"], allowOut: ["1.1.1.1"] } });
    assert.deepEqual(await policyOf(sbx.sandboxId),
      { defaultAction: "deny", egress: [{ action: "allow", target: "1.1.1.1" }] });
    await sbx.updateNetwork({ denyOut: ["10.0.0.0/8"] });
    assert.deepEqual(await policyOf(sbx.sandboxId),
      { defaultAction: "allow", egress: [{ action: "deny", target: "10.0.0.0/8" }] });
    await sbx.updateNetwork({ allowInternetAccess: false });
    assert.deepEqual(await policyOf(sbx.sandboxId), { defaultAction: "deny", egress: [] });
    await assert.rejects(sbx.updateNetwork({ allowOut: ["not a name!"] }), (e) => /^400: /.test(e.message));
    assert.deepEqual(await policyOf(sbx.sandboxId), { defaultAction: "deny", egress: [] });
    await sbx.kill();
    const offline = await create({ allowInternetAccess: false });
    assert.deepEqual(await policyOf(offline.sandboxId), { defaultAction: "deny", egress: [] });
    await offline.kill();
  });

  test("templates are listed (GET /templates, which the SDK does not wrap)", async () => {
    const res = await fetch(`${coved.baseUrl}/e2b/templates`, { headers: { "X-API-Key": coved.apiKey } });
    assert.equal(res.status, 200);
    const templates = await res.json();
    const base = templates.find((t) => t.templateID === "base");
    assert.ok(base, JSON.stringify(templates));
    assert.ok(Array.isArray(base.aliases) && base.names.includes("base"));
    assert.equal(base.buildStatus, "ready");
  });

  test("a wrong key is the SDK's AuthenticationError", async () => {
    await assert.rejects(Sandbox.create("base", e2bOptions(coved, { apiKey: `wrong-${RUN}` })), AuthenticationError);
    await assert.rejects(Sandbox.list(e2bOptions(coved, { apiKey: `wrong-${RUN}` })).nextItems(), AuthenticationError);
    await assert.rejects(Sandbox.getInfo("whatever", e2bOptions(coved, { apiKey: `wrong-${RUN}` })), AuthenticationError);
  });

  test("an unknown id is a NotFoundError; an unknown template a clear error", async () => {
    const id = `nosuch${RUN}`;
    await assert.rejects(Sandbox.getInfo(id, e2bOptions(coved)), (e) => e instanceof SandboxNotFoundError && e instanceof NotFoundError);
    await assert.rejects(Sandbox.setTimeout(id, 10_000, e2bOptions(coved)), SandboxNotFoundError);
    await assert.rejects(Sandbox.connect(id, e2bOptions(coved)), SandboxNotFoundError);
    await assert.rejects(Sandbox.pause(id, e2bOptions(coved)), SandboxNotFoundError);
    assert.equal(await Sandbox.kill(id, e2bOptions(coved)), false);
    await assert.rejects(Sandbox.create(`no-such-template-${RUN}`, e2bOptions(coved)), (e) => {
      assert.match(e.message, /^400: .*no-such-template/);
      return true;
    });
  });
});
