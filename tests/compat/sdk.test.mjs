// Cove against the official OpenSandbox JavaScript SDK (@alibaba-group/opensandbox 0.1.11),
// through its public API only. Starts its own coved (temp state dir, port 0); every sandbox is
// deleted and coved stopped in teardown, even when a test fails (and, through coved.mjs's
// reaper, even when the test process is killed).
//
// What the SDK sends and expects (from its source, 0.1.11), in short:
// - Lifecycle base URL: {protocol}://{domain}/v1. Every request carries OPEN-SANDBOX-API-KEY,
//   user-agent: OpenSandbox-JS-SDK/0.1.11 and (when the host has a non-loopback IPv4)
//   OPEN-SANDBOX-CLIENT-IP. No X-Request-ID is sent; x-request-id is read from error replies.
//   After each create it also fires POST /v1/metrics/events (telemetry; any reply ignored).
// - Errors: any non-2xx must have a JSON body {code, message}. An EMPTY error body is not
//   seen as an error at all by openapi-fetch + throwOnOpenApiFetchError (DELETE/pause then
//   "succeed", and a ping that gets an empty 502 counts as healthy).
// - Sandbox.create: POST /v1/sandboxes, application/json, body
//   {image:{uri}, entrypoint:["tail","-f","/dev/null"], resourceLimits:{cpu:"1",memory:"2Gi"},
//    secureAccess:false, env:{}, metadata:{}, extensions:{}, timeout:600}; `timeout` is
//   left out (not null) for timeoutSeconds: null. Reads `id`; `createdAt` must parse as a
//   date (required), `expiresAt` may be absent/null. Then GET .../endpoints/44772 and
//   .../endpoints/18080 (egress: must answer 200 with an object too, or create fails and the
//   SDK deletes the sandbox), both with ?use_server_proxy=true|false. Readiness: no lifecycle
//   state polling at all; GET {execdBaseUrl}/ping every 200 ms until a 2xx, for 30 s.
// - Endpoint {endpoint: "host:port/path" WITHOUT scheme, headers?}; with use_server_proxy the
//   upstream server answers {Host of the request}/sandboxes/{id}/proxy/{port}; execd base URL is
//   `${protocol}://${endpoint}`; execd requests carry the connection headers (API key
//   included) plus endpoint.headers. Cached per (id, port, proxy) for 10 min.
// - connect: only the two endpoint calls + ping (no GET of the sandbox).
// - renew(s): POST .../renew-expiration {expiresAt: Date.toISOString()} (milliseconds, Z);
//   reply 200 {expiresAt}. patchMetadata: PATCH .../metadata, Content-Type
//   application/json, body = the merge patch itself; reply 200 full Sandbox.
// - list: GET /v1/sandboxes?state=A&state=B&metadata=<encodeURIComponent("k=v&k2=v2")>
//   &page=N&pageSize=M; reply needs `items` (each with createdAt); pagination passed through.
// - pause/resume: POST, no body, any 2xx (202 with Content-Length: 0 is fine); the SDK does
//   not wait for Paused. resume() = POST resume, then connect (endpoints + ping).
//   kill: DELETE -> 204.
// - getSignedEndpoint(port, expires): GET .../endpoints/{port}?expires=<epoch seconds> (no
//   use_server_proxy). OSEP-0011 route token {id}-{port}-{expires_b36}-{signature}, URI
//   form {address}/{id}/{port}/{expires_b36}/{signature} (Cove's signature: routeToken).
// - commands.run: POST {execd}/command, accept: text/event-stream, body {command, background:
//   false}; SSE `data:` lines or NDJSON; exitCode = 0 on execution_complete, else
//   int(error.evalue).

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { dirname, join } from "node:path";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";

import {
  DEFAULT_EXECD_PORT,
  Sandbox,
  SandboxApiException,
  SandboxManager,
} from "@alibaba-group/opensandbox";

import { AGENT_PORT, Coved } from "./coved.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
const IMAGE = process.env.COVE_COMPAT_IMAGE ?? "base";
const EGRESS_PORT = 18080;
const RUN = randomBytes(4).toString("hex"); // tags this run's sandboxes in metadata
const TEST_TIMEOUT = 180_000;

const coved = new Coved();
const closable = []; // Sandbox and SandboxManager instances: their HTTP agents are closed last

before(async () => {
  await coved.start();
});

after(async () => {
  for (const c of closable) await c.close().catch(() => {});
  const problems = await coved.cleanup({ keepLogAs: join(HERE, "coved.log") });
  if (problems.length) console.error(`cleanup:\n  ${problems.join("\n  ")}`);
});

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function connection(extra = {}) {
  return { domain: coved.domain, apiKey: coved.apiKey, requestTimeoutSeconds: 60, ...extra };
}

async function createSandbox(opts = {}, connExtra = {}) {
  const sbx = await Sandbox.create({ connectionConfig: connection(connExtra), image: IMAGE, ...opts });
  coved.track(sbx.id);
  closable.push(sbx);
  return sbx;
}

function manager(connExtra = {}) {
  const m = SandboxManager.create({ connectionConfig: connection(connExtra) });
  closable.push(m);
  return m;
}

/** assert.rejects predicate: an API error with this status and a server-given {code, message}. */
function apiError(status) {
  return (e) => {
    assert.ok(e instanceof SandboxApiException, `expected a SandboxApiException, got ${e?.stack ?? e}`);
    assert.equal(e.statusCode, status, `expected HTTP ${status}, got ${e.statusCode}: ${e.message}`);
    assert.ok(e.error?.code && e.error.code !== "UNEXPECTED_RESPONSE",
      `the error body must carry a code: ${JSON.stringify(e.rawBody)}`);
    return true;
  };
}

async function waitForState(getInfo, wanted, timeoutMs = 30000) {
  const deadline = Date.now() + timeoutMs;
  let info;
  while (Date.now() < deadline) {
    info = await getInfo();
    if (wanted.includes(info.status?.state)) return info;
    await sleep(100);
  }
  assert.fail(`state is ${info?.status?.state}, wanted one of ${wanted.join(", ")} within ${timeoutMs} ms`);
}

/** After a kill: the sandbox is gone (404) or Terminated. */
async function waitGone(mgr, id, timeoutMs = 30000) {
  const deadline = Date.now() + timeoutMs;
  let last;
  while (Date.now() < deadline) {
    try {
      last = await mgr.getSandboxInfo(id);
      if (last.status?.state === "Terminated") return;
      assert.ok(["Stopping", "Terminated"].includes(last.status?.state),
        `a killed sandbox must be Stopping or Terminated, not ${last.status?.state}`);
    } catch (e) {
      if (e instanceof SandboxApiException && e.statusCode === 404) return;
      throw e;
    }
    await sleep(100);
  }
  assert.fail(`sandbox ${id} still ${last?.status?.state} ${timeoutMs} ms after kill`);
}

const stdoutOf = (ex) => ex.logs.stdout.map((m) => m.text).join("\n");
const stderrOf = (ex) => ex.logs.stderr.map((m) => m.text).join("\n");

function assertNear(date, expectedMs, slackMs, what) {
  assert.ok(date instanceof Date, `${what} must be a date, got ${date}`);
  assert.ok(Math.abs(date.getTime() - expectedMs) <= slackMs,
    `${what} ${date.toISOString()} is not within ${slackMs / 1000} s of ${new Date(expectedMs).toISOString()}`);
}

function assertSchemeless(endpoint, what) {
  assert.equal(typeof endpoint?.endpoint, "string", `${what}: endpoint must be a string`);
  assert.ok(endpoint.endpoint.length > 0, `${what}: endpoint is empty`);
  assert.ok(!endpoint.endpoint.includes("://"), `${what}: endpoint must have no scheme: ${endpoint.endpoint}`);
  if (endpoint.headers !== undefined) {
    assert.equal(typeof endpoint.headers, "object", `${what}: headers must be an object`);
    for (const [k, v] of Object.entries(endpoint.headers)) {
      assert.equal(typeof v, "string", `${what}: header ${k} must be a string`);
    }
  }
}

describe("sandbox lifecycle through Sandbox", () => {
  test("create → getInfo → renew → connect → pause → resume → kill", { timeout: TEST_TIMEOUT }, async () => {
    const startedAt = Date.now();
    const sbx = await createSandbox({ metadata: { suite: "lifecycle", run: RUN }, timeoutSeconds: 600 });
    assert.match(sbx.id, /^\S+$/);

    // getInfo: the full Sandbox, Running once create returned (execd answered its ping).
    const info = await sbx.getInfo();
    assert.equal(info.id, sbx.id);
    assert.equal(info.status.state, "Running");
    assert.ok(info.createdAt instanceof Date);
    assert.ok(info.createdAt.getTime() >= startedAt - 5000 && info.createdAt.getTime() <= Date.now() + 5000,
      `createdAt ${info.createdAt.toISOString()} is not now`);
    assertNear(info.expiresAt, info.createdAt.getTime() + 600_000, 30_000, "expiresAt");
    assert.deepEqual(info.metadata, { suite: "lifecycle", run: RUN });
    assert.deepEqual(info.entrypoint, ["tail", "-f", "/dev/null"]);
    assert.equal(info.image?.uri, IMAGE);

    // renew: expiresAt = now + 1800 s, sent with milliseconds ("...T..:..:..sssZ").
    const requested = Date.now() + 1800_000;
    const renewed = await sbx.renew(1800);
    assertNear(renewed.expiresAt, requested, 5_000, "renewed expiresAt");
    const afterRenew = await sbx.getInfo();
    assertNear(afterRenew.expiresAt, renewed.expiresAt.getTime(), 1_000, "expiresAt after renew");

    // connect by id: a second handle on the same sandbox that can run commands.
    const other = await Sandbox.connect({ sandboxId: sbx.id, connectionConfig: connection() });
    closable.push(other);
    assert.equal(other.id, sbx.id);
    assert.equal((await other.getInfo()).id, sbx.id);
    const ex = await other.commands.run("echo connected");
    assert.equal(ex.exitCode, 0, stderrOf(ex));
    assert.equal(stdoutOf(ex).trim(), "connected");

    // pause: accepted at once; the sandbox reaches Paused (through Pausing).
    await sbx.pause();
    const paused = await waitForState(() => sbx.getInfo(), ["Paused"]);
    assert.equal(paused.id, sbx.id);

    // resume: returns a new, ready handle; the sandbox is Running and its processes work again.
    const resumed = await sbx.resume();
    closable.push(resumed);
    assert.equal(resumed.id, sbx.id);
    await waitForState(() => resumed.getInfo(), ["Running"]);
    const ex2 = await resumed.commands.run("echo resumed");
    assert.equal(ex2.exitCode, 0, stderrOf(ex2));
    assert.equal(stdoutOf(ex2).trim(), "resumed");

    // kill: DELETE; then the sandbox is gone (or Terminated).
    await resumed.kill();
    await waitGone(manager(), sbx.id);
  });

  test("timeoutSeconds: null → no expiresAt, and renew is refused with 409", { timeout: TEST_TIMEOUT }, async () => {
    const sbx = await createSandbox({ timeoutSeconds: null, metadata: { suite: "no-expiry", run: RUN } });
    const info = await sbx.getInfo();
    assert.equal(info.status.state, "Running");
    assert.equal(info.expiresAt, null, `a sandbox without timeout has no expiresAt, got ${info.expiresAt}`);
    await assert.rejects(sbx.renew(600), apiError(409));
    assert.equal((await sbx.getInfo()).expiresAt, null, "a refused renew must not set an expiry");
    await sbx.kill();
    await waitGone(manager(), sbx.id);
  });

  test("connect to an unknown sandbox fails with 404", { timeout: TEST_TIMEOUT }, async () => {
    await assert.rejects(
      Sandbox.connect({ sandboxId: `no-such-sandbox-${RUN}`, connectionConfig: connection(), skipHealthCheck: true }),
      apiError(404));
  });

  test("renew on a killed sandbox fails with 404", { timeout: TEST_TIMEOUT }, async () => {
    const sbx = await createSandbox({ metadata: { suite: "renew-gone", run: RUN } });
    await sbx.kill();
    await waitGone(manager(), sbx.id);
    await assert.rejects(manager().renewSandbox(sbx.id, 600), apiError(404));
  });
});

describe("SandboxManager: list with filters and pages, patchMetadata", () => {
  const ids = {};
  let mgr;

  before(async () => {
    mgr = manager();
    // a1 and a2 in group a, b1 in group b; b1 is paused.
    for (const [name, group] of [["a1", "a"], ["a2", "a"], ["b1", "b"]]) {
      const sbx = await createSandbox({ metadata: { suite: "manager", run: RUN, group, name } });
      ids[name] = sbx.id;
    }
    await mgr.pauseSandbox(ids.b1);
    await waitForState(() => mgr.getSandboxInfo(ids.b1), ["Paused"]);
  });

  after(async () => {
    for (const id of Object.values(ids)) await mgr?.killSandbox(id).catch(() => {});
  });

  const idsOf = (res) => res.items.map((s) => s.id).sort();

  test("metadata filter (one key, then two keys ANDed)", { timeout: TEST_TIMEOUT }, async () => {
    const all = await mgr.listSandboxInfos({ metadata: { suite: "manager", run: RUN } });
    assert.deepEqual(idsOf(all), [ids.a1, ids.a2, ids.b1].sort());
    for (const s of all.items) {
      assert.ok(s.createdAt instanceof Date);
      assert.equal(s.metadata.run, RUN);
    }
    const groupA = await mgr.listSandboxInfos({ metadata: { run: RUN, group: "a" } });
    assert.deepEqual(idsOf(groupA), [ids.a1, ids.a2].sort());
    const none = await mgr.listSandboxInfos({ metadata: { run: RUN, group: "nope" } });
    assert.deepEqual(none.items, []);
  });

  test("state filter (one state, several states ORed, with metadata)", { timeout: TEST_TIMEOUT }, async () => {
    const paused = await mgr.listSandboxInfos({ states: ["Paused"], metadata: { run: RUN, suite: "manager" } });
    assert.deepEqual(idsOf(paused), [ids.b1]);
    assert.equal(paused.items[0].status.state, "Paused");
    const running = await mgr.listSandboxInfos({ states: ["Running"], metadata: { run: RUN, suite: "manager" } });
    assert.deepEqual(idsOf(running), [ids.a1, ids.a2].sort());
    const both = await mgr.listSandboxInfos({ states: ["Running", "Paused"], metadata: { run: RUN, suite: "manager" } });
    assert.deepEqual(idsOf(both), [ids.a1, ids.a2, ids.b1].sort());
  });

  test("pagination: page and pageSize", { timeout: TEST_TIMEOUT }, async () => {
    const filter = { metadata: { run: RUN, suite: "manager" }, pageSize: 2 };
    const p1 = await mgr.listSandboxInfos({ ...filter, page: 1 });
    assert.equal(p1.items.length, 2);
    assert.deepEqual(p1.pagination, { page: 1, pageSize: 2, totalItems: 3, totalPages: 2, hasNextPage: true });
    const p2 = await mgr.listSandboxInfos({ ...filter, page: 2 });
    assert.equal(p2.items.length, 1);
    assert.deepEqual(p2.pagination, { page: 2, pageSize: 2, totalItems: 3, totalPages: 2, hasNextPage: false });
    assert.deepEqual([...idsOf(p1), ...idsOf(p2)].sort(), [ids.a1, ids.a2, ids.b1].sort());
    const p3 = await mgr.listSandboxInfos({ ...filter, page: 3 });
    assert.deepEqual(p3.items, []);
    assert.equal(p3.pagination.hasNextPage, false);
  });

  test("patchMetadata: merge patch adds, replaces and deletes keys", { timeout: TEST_TIMEOUT }, async () => {
    const sbx = await Sandbox.connect({ sandboxId: ids.a1, connectionConfig: connection() });
    closable.push(sbx);
    const patched = await sbx.patchMetadata({ team: "platform", group: null, name: "first" });
    assert.equal(patched.id, ids.a1);
    assert.ok(patched.createdAt instanceof Date);
    assert.deepEqual(patched.metadata, { suite: "manager", run: RUN, team: "platform", name: "first" });
    assert.deepEqual((await sbx.getInfo()).metadata, patched.metadata);

    // The list filters see the new metadata at once.
    const byTeam = await mgr.listSandboxInfos({ metadata: { run: RUN, team: "platform" } });
    assert.deepEqual(idsOf(byTeam), [ids.a1]);
    const groupA = await mgr.listSandboxInfos({ metadata: { run: RUN, group: "a" } });
    assert.deepEqual(idsOf(groupA), [ids.a2]);

    // {} is a no-op; deleting an absent key is ignored.
    assert.deepEqual((await sbx.patchMetadata({})).metadata, patched.metadata);
    assert.deepEqual((await mgr.patchSandboxMetadata(ids.a1, { absent: null })).metadata, patched.metadata);

    // The manager form, on a paused sandbox (no restart needed).
    const pausedPatch = await mgr.patchSandboxMetadata(ids.b1, { note: "paused-one" });
    assert.equal(pausedPatch.metadata.note, "paused-one");
    assert.equal(pausedPatch.status.state, "Paused");
  });

  test("patchMetadata rejects reserved and invalid keys with 400", { timeout: TEST_TIMEOUT }, async () => {
    await assert.rejects(mgr.patchSandboxMetadata(ids.a2, { "opensandbox.io/owner": "me" }), apiError(400));
    await assert.rejects(mgr.patchSandboxMetadata(ids.a2, { "bad key!": "x" }), apiError(400));
    const info = await mgr.getSandboxInfo(ids.a2);
    assert.deepEqual(info.metadata, { suite: "manager", run: RUN, group: "a", name: "a2" });
  });

  test("manager renew, resume and kill", { timeout: TEST_TIMEOUT }, async () => {
    const requested = Date.now() + 3600_000;
    await mgr.renewSandbox(ids.a2, 3600);
    assertNear((await mgr.getSandboxInfo(ids.a2)).expiresAt, requested, 5_000, "expiresAt after renewSandbox");

    await mgr.resumeSandbox(ids.b1);
    await waitForState(() => mgr.getSandboxInfo(ids.b1), ["Running"]);

    await mgr.killSandbox(ids.b1);
    await waitGone(mgr, ids.b1);
    const left = await mgr.listSandboxInfos({ metadata: { run: RUN, suite: "manager" } });
    assert.ok(!idsOf(left).includes(ids.b1) ||
      left.items.find((s) => s.id === ids.b1).status.state === "Terminated",
      "a killed sandbox must leave the list (or show Terminated)");
  });
});

for (const useServerProxy of [false, true]) {
  const mode = useServerProxy ? "useServerProxy" : "direct";

  describe(`endpoints and commands (${mode})`, () => {
    let sbx;

    before(async () => {
      sbx = await createSandbox({ metadata: { suite: `endpoints-${mode}`, run: RUN } }, { useServerProxy });
    });

    after(async () => {
      await sbx?.kill().catch(() => {});
    });

    test(`getEndpoint(${AGENT_PORT})`, { timeout: TEST_TIMEOUT }, async () => {
      assert.equal(DEFAULT_EXECD_PORT, AGENT_PORT);
      const ep = await sbx.getEndpoint(AGENT_PORT);
      assertSchemeless(ep, `endpoint for ${AGENT_PORT}`);
      if (useServerProxy) {
        // The server proxies: {lifecycle host:port}/sandboxes/{id}/proxy/{port}.
        const re = new RegExp(`^127\\.0\\.0\\.1:${coved.port}(/v1)?/sandboxes/${sbx.id}/proxy/${AGENT_PORT}$`);
        assert.match(ep.endpoint, re);
      }
      assert.equal(await sbx.getEndpointUrl(AGENT_PORT), `http://${ep.endpoint}`);
      // The SDK's own execd client uses that endpoint: its ping must pass.
      assert.equal(await sbx.isHealthy(), true);
    });

    test(`getEndpoint(${EGRESS_PORT}) answers too (create and connect fetch it)`, { timeout: TEST_TIMEOUT }, async () => {
      assertSchemeless(await sbx.getEndpoint(EGRESS_PORT), `endpoint for ${EGRESS_PORT}`);
    });

    test("commands.run: echo hi", { timeout: TEST_TIMEOUT }, async () => {
      const ex = await sbx.commands.run("echo hi");
      assert.equal(ex.error, undefined, `unexpected error event: ${JSON.stringify(ex.error)}`);
      assert.ok(ex.complete, "no execution_complete event");
      assert.equal(ex.exitCode, 0);
      assert.equal(stdoutOf(ex).trim(), "hi");
      assert.equal(stderrOf(ex), "");
    });

    test("commands.run: a failing exit code, with stderr", { timeout: TEST_TIMEOUT }, async () => {
      const ex = await sbx.commands.run("echo oops >&2; exit 3");
      assert.ok(ex.error, "a failing command must end with an error event");
      assert.equal(ex.exitCode, 3);
      assert.equal(stderrOf(ex).trim(), "oops");
      assert.equal(stdoutOf(ex), "");
    });

    test("commands.run through Sandbox.connect in the same mode", { timeout: TEST_TIMEOUT }, async () => {
      const other = await Sandbox.connect({ sandboxId: sbx.id, connectionConfig: connection({ useServerProxy }) });
      closable.push(other);
      const ex = await other.commands.run("printf '%s\\n' \"$((6 * 7))\"");
      assert.equal(ex.exitCode, 0, stderrOf(ex));
      assert.equal(stdoutOf(ex).trim(), "42");
    });
  });
}

/** The OSEP-0011 route token in a signed endpoint: {id}, {port}, expires in base 36 and a
 * signature, in the URI ("/"-separated) or host/header ("-"-separated) form. OSEP-0011's
 * 8 hex digits of a hash are forgeable; Cove signs with a 128-bit HMAC-SHA256 instead: a key
 * id and 22 base64url characters in the URI form, a key id and 26 lowercase base32 ones in
 * host names (which fold case). Returns the match; [1] is the signature. */
function routeToken(ep, id, port, expires) {
  const b36 = expires.toString(36);
  const uri = new RegExp(`/${id}/${port}/${b36}/([0-9a-z][A-Za-z0-9_-]{22})(?=/|$)`);
  const dashed = new RegExp(`(?:^|[^0-9a-z])${id}-${port}-${b36}-([0-9a-z][a-z2-7]{26})(?![0-9a-z])`);
  for (const where of [ep.endpoint, ...Object.values(ep.headers ?? {})]) {
    const m = uri.exec(where) ?? dashed.exec(where);
    if (m) return m;
  }
  assert.fail(`no OSEP-0011 route token for expires=${expires} (b36 ${b36}) in ${JSON.stringify(ep)}`);
}

describe("signed endpoints (OSEP-0011)", () => {
  let sbx;

  before(async () => {
    sbx = await createSandbox({ metadata: { suite: "signed", run: RUN } });
  });

  after(async () => {
    await sbx?.kill().catch(() => {});
  });

  test("getSignedEndpoint returns a route token that reaches the port without the API key", { timeout: TEST_TIMEOUT }, async () => {
    const expires = Math.floor(Date.now() / 1000) + 600;
    const ep = await sbx.getSignedEndpoint(AGENT_PORT, expires);
    assertSchemeless(ep, "signed endpoint");
    const m = routeToken(ep, sbx.id, AGENT_PORT, expires);

    // Whoever holds the URL reaches the port: no API key, only the endpoint's headers.
    const url = `http://${ep.endpoint}/ping`;
    const res = await fetch(url, { headers: ep.headers ?? {}, signal: AbortSignal.timeout(30000) });
    await res.arrayBuffer();
    assert.equal(res.status, 200, `GET ${url} -> ${res.status}`);

    // A forged signature is refused.
    const sig = m[1];
    const forgedSig = (sig[0] === "0" ? "1" : "0") + sig.slice(1);
    const forged = {
      endpoint: ep.endpoint.replace(sig, forgedSig),
      headers: Object.fromEntries(Object.entries(ep.headers ?? {}).map(([k, v]) => [k, v.replace(sig, forgedSig)])),
    };
    const bad = await fetch(`http://${forged.endpoint}/ping`, { headers: forged.headers, signal: AbortSignal.timeout(30000) });
    await bad.arrayBuffer();
    assert.ok([401, 403, 404].includes(bad.status), `a forged signature must be refused, got ${bad.status}`);
  });

  test("a signed endpoint that has expired does not reach the port", { timeout: TEST_TIMEOUT }, async () => {
    const expires = Math.floor(Date.now() / 1000) - 60;
    let ep;
    try {
      ep = await sbx.getSignedEndpoint(AGENT_PORT, expires);
    } catch (e) {
      apiError(400)(e); // refusing to sign a past expiry is fine too
      return;
    }
    assertSchemeless(ep, "expired signed endpoint");
    routeToken(ep, sbx.id, AGENT_PORT, expires);
    const res = await fetch(`http://${ep.endpoint}/ping`, { headers: ep.headers ?? {}, signal: AbortSignal.timeout(30000) });
    await res.arrayBuffer();
    assert.ok([401, 403, 404, 410].includes(res.status), `an expired route must be refused, got ${res.status}`);
  });
});
