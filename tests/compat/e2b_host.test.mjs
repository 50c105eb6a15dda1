// E2B's sandbox traffic through coved with the official `e2b` SDK (2.51.0), unmodified: the
// SDK's own URLs and headers reach the sandbox.
//
// What the SDK does (its dist/index.mjs, 2.51.0), in short:
// - envd's base URL is `sandboxUrl` (option) or E2B_SANDBOX_URL when set, else
//   https://{envdPort}-{id}.{domain} (http:// and localhost:{port} in debug mode); every envd
//   request carries E2b-Sandbox-Id, E2b-Sandbox-Port (49983) and X-Access-Token (the create
//   answer's envdAccessToken). Cove serves it at http://HOST:PORT/e2b/sandbox.
// - sandbox.getHost(port) is `${port}-${sandboxId}.${domain}`: domain is the create answer's
//   `domain`, else the `domain` option, else E2B_DOMAIN, else e2b.app. With domain
//   localhost:PORT that is the gateway's host form, 8000-{id}.localhost:PORT.
// - trafficAccessToken (create and connect answers) is kept as sandbox.trafficAccessToken;
//   a client sends it as E2B-Traffic-Access-Token to reach a sandbox's ports.
// Node's resolver knows nothing of *.localhost (browsers and curl map it to loopback, RFC
// 6761), so the requests to the host form here resolve it that way themselves.
// Nothing here needs envd's own routes (another part of Cove): the agent's /ping stands for
// them. The server in the sandbox is started through the OpenSandbox SDK on the same sandbox.

import assert from "node:assert/strict";
import { lookup as dnsLookup } from "node:dns";
import { request } from "node:http";
import { describe, test } from "node:test";

import { Sandbox } from "e2b";
import { Sandbox as OpenSandbox } from "@alibaba-group/opensandbox";

import { covedForFile, e2bOptions, sleep } from "./harness.mjs";

const TEST_TIMEOUT = 180_000;
const APP_PORT = 8000;

const coved = covedForFile("coved-e2b-host.log");

/** *.localhost is loopback (RFC 6761 §6.3), as browsers and curl resolve it. */
function localhostLookup(hostname, options, callback) {
  if (hostname === "localhost" || hostname.endsWith(".localhost"))
    return callback(null, options.all ? [{ address: "127.0.0.1", family: 4 }] : "127.0.0.1", 4);
  return dnsLookup(hostname, options, callback);
}

/** GET http://{host}{path}: host is what getHost returned (name:port). */
function get(host, path, headers = {}) {
  const url = new URL(`http://${host}${path}`);
  return new Promise((resolve, reject) => {
    const req = request(url, { headers, lookup: localhostLookup }, (res) => {
      const chunks = [];
      res.on("data", (c) => chunks.push(c));
      res.on("end", () => resolve({ status: res.statusCode, body: Buffer.concat(chunks).toString() }));
    });
    req.on("error", reject);
    req.end();
  });
}

/** A Python HTTP server on APP_PORT in the sandbox, serving /tmp/www with one file. */
async function startServer(sandboxId) {
  const os = await OpenSandbox.connect({
    sandboxId,
    connectionConfig: { domain: coved.domain, apiKey: coved.apiKey, requestTimeoutSeconds: 60 },
  });
  coved.closable.push(os);
  const made = await os.commands.run(`mkdir -p /tmp/www && printf 'hello from %s' ${sandboxId} > /tmp/www/hello.txt`);
  assert.equal(made.exitCode ?? 0, 0);
  await os.commands.run(`python3 -m http.server ${APP_PORT} --bind 127.0.0.1 --directory /tmp/www`, {
    background: true,
  });
  const probe = `python3 -c "import socket; socket.create_connection(('127.0.0.1', ${APP_PORT}))"`;
  for (let i = 0; i < 200; i++) {
    const r = await os.commands.run(probe);
    if (!r.error && (r.exitCode ?? 0) === 0) return;
    await sleep(50);
  }
  throw new Error("the sandbox's server did not start");
}

describe("E2B sandbox traffic", () => {
  test("getHost(port) reaches the sandbox's server with the traffic token", { timeout: TEST_TIMEOUT }, async () => {
    const sbx = await Sandbox.create("base", e2bOptions(coved));
    coved.track(sbx.sandboxId);
    assert.ok(sbx.trafficAccessToken, "create answers a trafficAccessToken");
    const host = sbx.getHost(APP_PORT);
    assert.equal(host, `${APP_PORT}-${sbx.sandboxId}.localhost:${coved.port}`);
    await startServer(sbx.sandboxId);

    const page = await get(host, "/hello.txt", { "E2B-Traffic-Access-Token": sbx.trafficAccessToken });
    assert.equal(page.status, 200, page.body);
    assert.equal(page.body, `hello from ${sbx.sandboxId}`);
    // without the token the port is closed (Cove's sandboxes' ports are never public)
    const refused = await get(host, "/hello.txt");
    assert.equal(refused.status, 401, refused.body);

    // envd's port by the host form is the agent (its /ping standing for envd's routes)
    const envd = await get(sbx.getHost(49983), "/ping", { "X-Access-Token": sbx.envdAccessToken });
    assert.equal(envd.status, 200, envd.body);
    const noToken = await get(sbx.getHost(49983), "/ping");
    assert.equal(noToken.status, 401);
    assert.equal(JSON.parse(noToken.body).code, 401); // E2B's error shape
    assert.equal(await sbx.kill(), true);
  });

  test("the SDK's envd client reaches the agent through sandboxUrl with its own headers", { timeout: TEST_TIMEOUT }, async () => {
    const sbx = await Sandbox.create("base", e2bOptions(coved));
    coved.track(sbx.sandboxId);
    // The SDK's envd HTTP client: its base URL, E2b-Sandbox-Id/Port and X-Access-Token.
    const ping = await sbx.envdApi.api.GET("/ping");
    assert.equal(ping.response.status, 200);
    const other = await Sandbox.create("base", e2bOptions(coved));
    coved.track(other.sandboxId);
    // Each sandbox's own token: one sandbox's does not open the other.
    const crossed = await fetch(`${coved.baseUrl}/e2b/sandbox/ping`, {
      headers: { "E2b-Sandbox-Id": other.sandboxId, "E2b-Sandbox-Port": "49983", "X-Access-Token": sbx.envdAccessToken },
    });
    assert.equal(crossed.status, 401);
    assert.equal(await other.kill(), true);
    // a killed sandbox: E2B's 502, which the SDK's health probe reads as not running
    assert.equal(await sbx.kill(), true);
    const gone = await sbx.envdApi.api.GET("/ping");
    assert.equal(gone.response.status, 502);
  });

  test("E2B_API_URL, E2B_SANDBOX_URL and E2B_DOMAIN configure it all", { timeout: TEST_TIMEOUT }, async () => {
    const saved = { ...process.env };
    Object.assign(process.env, {
      E2B_API_URL: `${coved.baseUrl}/e2b`,
      E2B_SANDBOX_URL: `${coved.baseUrl}/e2b/sandbox`,
      E2B_DOMAIN: `localhost:${coved.port}`,
      E2B_API_KEY: coved.apiKey,
    });
    try {
      const sbx = await Sandbox.create("base");
      coved.track(sbx.sandboxId);
      assert.equal(sbx.getHost(49983), `49983-${sbx.sandboxId}.localhost:${coved.port}`);
      assert.equal((await sbx.envdApi.api.GET("/ping")).response.status, 200);
      const again = await Sandbox.connect(sbx.sandboxId);
      assert.equal(again.trafficAccessToken, sbx.trafficAccessToken);
      assert.equal(await sbx.kill(), true);
    } finally {
      for (const k of ["E2B_API_URL", "E2B_SANDBOX_URL", "E2B_DOMAIN", "E2B_API_KEY"]) {
        if (k in saved) process.env[k] = saved[k];
        else delete process.env[k];
      }
    }
  });
});
