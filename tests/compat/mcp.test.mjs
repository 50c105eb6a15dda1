// Cove's MCP server against clients nobody here wrote:
// - @modelcontextprotocol/sdk's Client over stdio (spawning `cove mcp`) and over streamable
//   HTTP (coved's /mcp with the API key as a bearer token): tools listed, every tool called on
//   a real sandbox, errors as tool errors, 401 without a key, 403 for a foreign Origin, the
//   /mcp child restarted when it dies.
// - @modelcontextprotocol/conformance's server scenarios that apply to a server other than its
//   reference "everything" server, against coved's /mcp (it tests URLs only, so not stdio).
// - `cove mcp install` files read back by the clients themselves where the npm packages can:
//   Claude Code (`claude mcp get`, which for a user-scope server starts `cove mcp` and
//   connects to it) and Codex (`codex mcp get --json`); Cursor and VS Code publish no parser
//   or schema on npm, so their files' shape is checked here.

import assert from "node:assert/strict";
import { execFile, spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import {
  existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ErrorCode, McpError } from "@modelcontextprotocol/sdk/types.js";

import { Coved } from "./coved.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = resolve(HERE, "..", "..");
const BUILD = process.env.COVE_BUILD_DIR ? resolve(process.env.COVE_BUILD_DIR) : join(ROOT, "build");
const CLI = join(BUILD, "src", "cli", "cove");
const BIN = join(HERE, "node_modules", ".bin");
const RUN = randomBytes(4).toString("hex");
const TEST_TIMEOUT = 300_000;
const run = promisify(execFile);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const TOOLS = [
  "sandbox_create", "sandbox_list", "sandbox_get", "sandbox_kill", "sandbox_pause",
  "sandbox_resume", "sandbox_renew", "run_command", "run_code", "file_read", "file_write",
  "file_list", "file_search", "file_delete", "file_upload_from_url", "sandbox_endpoint",
];

const coved = new Coved();
const clients = [];

before(async () => {
  await coved.start();
});

after(async () => {
  for (const c of clients) await c.close().catch(() => {});
  const problems = await coved.cleanup({ keepLogAs: join(HERE, "coved-mcp.log") });
  if (problems.length) console.error(`cleanup:\n  ${problems.join("\n  ")}`);
});

async function stdioClient() {
  const transport = new StdioClientTransport({
    command: CLI,
    args: ["mcp"],
    env: { PATH: process.env.PATH, COVE_SERVER: coved.baseUrl, COVE_API_KEY: coved.apiKey },
    stderr: "pipe",
  });
  const client = new Client({ name: "cove-compat", version: "1.0.0" });
  await client.connect(transport);
  clients.push(client);
  return client;
}

async function httpClient(headers = { Authorization: `Bearer ${coved.apiKey}` }) {
  const transport = new StreamableHTTPClientTransport(new URL(`${coved.baseUrl}/mcp`), {
    requestInit: { headers },
  });
  const client = new Client({ name: "cove-compat", version: "1.0.0" });
  await client.connect(transport);
  clients.push(client);
  return client;
}

const TRANSPORTS = { stdio: stdioClient, http: httpClient };

const texts = (result) => result.content.filter((c) => c.type === "text").map((c) => c.text);

async function call(client, name, args, { error = false } = {}) {
  const result = await client.callTool({ name, arguments: args }, undefined, { timeout: 240_000 });
  assert.equal(Boolean(result.isError), error,
    `${name} ${JSON.stringify(args)}: isError ${result.isError}: ${texts(result).join(" | ")}`);
  return result;
}

async function callJson(client, name, args) {
  return JSON.parse(texts(await call(client, name, args))[0]);
}

for (const [transport, connect] of Object.entries(TRANSPORTS)) {
  describe(`MCP over ${transport}`, () => {
    let client;
    before(async () => {
      client = await connect();
    });

    test("negotiates the newest revision and lists every tool with a strict schema", async () => {
      assert.equal(client.getServerVersion().name, "cove");
      assert.ok(client.getServerCapabilities().tools);
      const { tools } = await client.listTools();
      assert.deepEqual(tools.map((t) => t.name).sort(), [...TOOLS].sort());
      for (const t of tools) {
        assert.ok(t.description.length > 20, t.name);
        assert.equal(t.inputSchema.type, "object", t.name);
        assert.equal(t.inputSchema.additionalProperties, false, t.name);
        assert.equal(typeof t.annotations.readOnlyHint, "boolean", t.name);
        assert.equal(typeof t.annotations.destructiveHint, "boolean", t.name);
        if (t.name !== "sandbox_create" && t.name !== "sandbox_list")
          assert.ok(t.inputSchema.required.includes("sandbox_id"), t.name);
      }
      assert.equal(tools.find((t) => t.name === "file_read").annotations.readOnlyHint, true);
      assert.equal(tools.find((t) => t.name === "sandbox_kill").annotations.destructiveHint, true);
    });

    test("every tool on a real sandbox", { timeout: TEST_TIMEOUT }, async () => {
      const created = await callJson(client, "sandbox_create", {
        template: "code-interpreter", timeout: 900, metadata: { run: RUN, via: transport },
        env: { GREETING: "hello from env" }, allow: ["pypi.org", "*.example.com"],
      });
      const id = coved.track(created.id);
      assert.match(id, /^[a-z0-9]+$/);
      assert.equal(created.status.state, "Running");

      assert.equal((await callJson(client, "sandbox_get", { sandbox_id: id })).id, id);
      const listed = await callJson(client, "sandbox_list", { metadata: { run: RUN, via: transport } });
      assert.deepEqual(listed.items.map((s) => s.id), [id]);

      // a command: output, exit code, env of the sandbox and of the command, cwd
      let out = texts(await call(client, "run_command", {
        sandbox_id: id, command: "echo \"$GREETING\"; echo \"$ONE\" >&2; pwd; exit 3",
        envs: { ONE: "per-command" }, cwd: "/tmp",
      }));
      assert.equal(out[0], "exit code: 3");
      assert.equal(out[1], "stdout:\nhello from env\n/tmp\n");
      assert.equal(out[2], "stderr:\nper-command\n");
      // long output is cut, and says so
      out = texts(await call(client, "run_command", { sandbox_id: id, command: "seq 1 200000" }));
      assert.equal(out[0], "exit code: 0");
      assert.match(out[1], /^stdout:\n1\n2\n3\n/);
      assert.match(out[1], /\[stdout truncated: showing the first 65536 of 1288895 bytes\]$/);
      // a command past its timeout
      out = texts(await call(client, "run_command", { sandbox_id: id, command: "sleep 30",
        timeout: 1 }, { error: true }));
      assert.match(out[0], /timeout of 1 s|timed out/i);

      // files
      await call(client, "file_write", { sandbox_id: id, path: "/work/mcp/notes.txt",
        content: "line one\nline two\n" });
      assert.deepEqual(texts(await call(client, "file_read", { sandbox_id: id,
        path: "/work/mcp/notes.txt" })), ["line one\nline two\n"]);
      const png = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0, 0xff]);
      await call(client, "file_write", { sandbox_id: id, path: "/work/mcp/bin.dat",
        content: png.toString("base64"), encoding: "base64", mode: "600" });
      const binary = await call(client, "file_read", { sandbox_id: id, path: "/work/mcp/bin.dat" });
      assert.equal(binary.content[0].type, "resource");
      assert.deepEqual(Buffer.from(binary.content[0].resource.blob, "base64"), png);
      const listing = await callJson(client, "file_list", { sandbox_id: id, path: "/work/mcp" });
      assert.deepEqual(listing.map((e) => e.path).sort(), ["/work/mcp/bin.dat", "/work/mcp/notes.txt"]);
      assert.equal(listing.find((e) => e.path.endsWith("bin.dat")).mode, 600);
      const found = await callJson(client, "file_search", { sandbox_id: id, path: "/work",
        pattern: "*.txt" });
      assert.deepEqual(found.map((e) => e.path), ["/work/mcp/notes.txt"]);
      await call(client, "file_delete", { sandbox_id: id, path: "/work/mcp" }, { error: true });
      await call(client, "file_delete", { sandbox_id: id, path: "/work/mcp/notes.txt" });
      await call(client, "file_read", { sandbox_id: id, path: "/work/mcp/notes.txt" },
        { error: true });
      await call(client, "file_delete", { sandbox_id: id, path: "/work/mcp", recursive: true });
      await call(client, "file_list", { sandbox_id: id, path: "/work/mcp" }, { error: true });

      // code: text, a figure as image content, an exception as a tool error
      const code = await call(client, "run_code", { sandbox_id: id, code:
        "import matplotlib.pyplot as plt\nprint('plotting')\nplt.plot([1, 2, 3], [3, 1, 2])\n" +
        "6 * 7\n" });
      assert.ok(texts(code).includes("stdout:\nplotting\n"), JSON.stringify(texts(code)));
      assert.ok(texts(code).includes("42"), JSON.stringify(texts(code)));
      const image = code.content.find((c) => c.type === "image");
      assert.ok(image, "a figure comes back as image content");
      assert.equal(image.mimeType, "image/png");
      assert.deepEqual([...Buffer.from(image.data, "base64").subarray(0, 4)], [0x89, 0x50, 0x4e, 0x47]);
      const raised = texts(await call(client, "run_code", { sandbox_id: id,
        code: "raise ValueError('nope')" }, { error: true }));
      assert.match(raised.at(-1), /^ValueError: nope/);

      // a service in the sandbox, its endpoint, and a download the sandbox itself makes
      await call(client, "file_write", { sandbox_id: id, path: "/srv/www/hello.txt",
        content: "served\n" });
      await call(client, "run_command", { sandbox_id: id, command:
        "cd /srv/www && (nohup python3 -m http.server 8765 --bind 127.0.0.1 >/dev/null 2>&1 &) " +
        "&& for i in $(seq 50); do python3 -c \"import urllib.request; " +
        "urllib.request.urlopen('http://127.0.0.1:8765/')\" 2>/dev/null && exit 0; sleep 0.1; " +
        "done; exit 1" });
      const endpoint = await callJson(client, "sandbox_endpoint", { sandbox_id: id, port: 8765 });
      assert.match(endpoint.url, /^http:\/\//);
      const served = await fetch(`${endpoint.url}/hello.txt`, { headers: endpoint.headers });
      assert.equal(served.status, 200);
      assert.equal(await served.text(), "served\n");
      // the allow list became the sandbox's egress policy (its egress API, port 18080)
      const egress = await callJson(client, "sandbox_endpoint", { sandbox_id: id, port: 18080 });
      const policy = await (await fetch(`${egress.url}/policy`, { headers: egress.headers })).json();
      assert.equal(policy.policy.defaultAction, "deny");
      assert.deepEqual(policy.policy.egress.map((r) => [r.action, r.target]),
        [["allow", "pypi.org"], ["allow", "*.example.com"]]);
      const fetched = texts(await call(client, "file_upload_from_url", { sandbox_id: id,
        url: "http://127.0.0.1:8765/hello.txt", path: "/tmp/dl/hello.txt" }));
      assert.match(fetched[0], /Downloaded .* \(7 bytes\)/);
      assert.deepEqual(texts(await call(client, "file_read", { sandbox_id: id,
        path: "/tmp/dl/hello.txt" })), ["served\n"]);
      // the sandbox's egress policy (deny-all by default) decides: this address is refused
      // by the sandbox's own egress proxy, and nothing leaves the host
      const refused = texts(await call(client, "file_upload_from_url", { sandbox_id: id,
        url: "http://192.0.2.1/x", path: "/tmp/x", timeout: 30 }, { error: true }));
      assert.match(refused[0], /failed inside the sandbox/);
      await call(client, "file_upload_from_url", { sandbox_id: id, url: "file:///etc/passwd",
        path: "/tmp/y" }, { error: true });

      // lifecycle
      const renewed = await callJson(client, "sandbox_renew", { sandbox_id: id, timeout: 1800 });
      assert.ok(Date.parse(renewed.expiresAt) > Date.now() + 1700_000);
      await call(client, "sandbox_pause", { sandbox_id: id });
      for (let i = 0; i < 100; i++) {
        if ((await callJson(client, "sandbox_get", { sandbox_id: id })).status.state === "Paused") break;
        await sleep(100);
      }
      assert.equal((await callJson(client, "sandbox_get", { sandbox_id: id })).status.state, "Paused");
      const whilePaused = texts(await call(client, "run_command", { sandbox_id: id,
        command: "true" }, { error: true }));
      assert.match(whilePaused[0], /HTTP 409/);
      await call(client, "sandbox_resume", { sandbox_id: id });
      out = texts(await call(client, "run_command", { sandbox_id: id, command: "echo back" }));
      assert.equal(out[1], "stdout:\nback\n");
      await call(client, "sandbox_kill", { sandbox_id: id });
      const gone = texts(await call(client, "sandbox_get", { sandbox_id: id }, { error: true }));
      assert.match(gone[0], /SANDBOX::NOT_FOUND \(HTTP 404\)/);
    });

    test("errors are tool errors or JSON-RPC errors, never a crash", async () => {
      const missing = texts(await call(client, "sandbox_get", { sandbox_id: "no-such-sandbox" },
        { error: true }));
      assert.match(missing[0], /^SANDBOX::NOT_FOUND \(HTTP 404\): /);
      const bad = texts(await call(client, "run_command", { sandbox_id: "x", command: "true",
        shell: "bash" }, { error: true }));
      assert.match(bad[0], /Invalid arguments for run_command: shell: unknown argument/);
      const typed = texts(await call(client, "sandbox_create", { timeout: "soon" }, { error: true }));
      assert.match(typed[0], /timeout: must be an integer/);
      await call(client, "sandbox_renew", { sandbox_id: "x" }, { error: true });
      await assert.rejects(client.callTool({ name: "no_such_tool", arguments: {} }),
        (e) => e instanceof McpError && e.code === ErrorCode.InvalidParams);
      await assert.rejects(client.request({ method: "resources/list" }, (await import(
        "@modelcontextprotocol/sdk/types.js")).ListResourcesResultSchema),
      (e) => e instanceof McpError && e.code === ErrorCode.MethodNotFound);
      assert.deepEqual(await client.ping(), {});
    });
  });
}

describe("the /mcp endpoint", () => {
  const post = (headers, body) => fetch(`${coved.baseUrl}/mcp`, {
    method: "POST",
    headers: { "Content-Type": "application/json", Accept: "application/json, text/event-stream",
      ...headers },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
  const initialize = { jsonrpc: "2.0", id: 1, method: "initialize",
    params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "t", version: "1" } } };

  test("needs the API key: 401 without it or with a wrong one", async () => {
    for (const headers of [{}, { Authorization: "Bearer wrong" }, { "OPEN-SANDBOX-API-KEY": "wrong" }]) {
      const res = await post(headers, initialize);
      assert.equal(res.status, 401);
      assert.match((await res.json()).code, /^AUTH::/);
    }
    await assert.rejects(httpClient({}), /AUTH::MISSING_API_KEY/);
    // the usual header works as well as a bearer token
    const res = await post({ "OPEN-SANDBOX-API-KEY": coved.apiKey }, initialize);
    assert.equal(res.status, 200);
    const body = await res.json();
    assert.equal(body.result.protocolVersion, "2025-06-18");
    assert.equal(res.headers.get("mcp-session-id"), null); // stateless
  });

  test("the transport's rules: Origin, methods, notifications, bad JSON, versions", async () => {
    const key = { Authorization: `Bearer ${coved.apiKey}` };
    let res = await post({ ...key, Origin: "http://evil.example" }, initialize);
    assert.equal(res.status, 403);
    res = await post({ ...key, Origin: "http://localhost:3000" }, initialize);
    assert.equal(res.status, 200);
    res = await fetch(`${coved.baseUrl}/mcp`, { headers: { ...key, Accept: "text/event-stream" } });
    assert.equal(res.status, 405);
    res = await fetch(`${coved.baseUrl}/mcp`, { method: "DELETE", headers: key });
    assert.equal(res.status, 405);
    res = await post(key, { jsonrpc: "2.0", method: "notifications/initialized" });
    assert.equal(res.status, 202);
    assert.equal(await res.text(), "");
    res = await post(key, "{not json");
    assert.equal(res.status, 400);
    assert.equal((await res.json()).error.code, -32700);
    res = await post({ ...key, "MCP-Protocol-Version": "1999-01-01" }, { jsonrpc: "2.0", id: 2, method: "ping" });
    assert.equal(res.status, 400);
    res = await post({ ...key, "MCP-Protocol-Version": "2025-11-25" },
      [{ jsonrpc: "2.0", id: 2, method: "ping" }]);
    assert.equal((await res.json()).error.code, -32600); // no batches after 2025-03-26
    res = await post({ ...key, "MCP-Protocol-Version": "2025-03-26" },
      [{ jsonrpc: "2.0", id: 2, method: "ping" }, { jsonrpc: "2.0", id: 3, method: "ping" }]);
    assert.deepEqual((await res.json()).map((r) => r.id), [2, 3]);
    res = await post(key, { ...initialize, params: { ...initialize.params, protocolVersion: "2030-01-01" } });
    assert.equal((await res.json()).result.protocolVersion, "2025-11-25");
  });

  test("coved restarts its MCP child when it dies", { timeout: 60_000 }, async () => {
    const sock = join(coved.stateDir, "mcp.sock");
    const children = readdirSync("/proc").filter((p) => /^\d+$/.test(p)).filter((p) => {
      try {
        return readFileSync(`/proc/${p}/cmdline`, "utf8").split("\0").includes(sock);
      } catch {
        return false;
      }
    });
    assert.equal(children.length, 1);
    process.kill(Number(children[0]), "SIGKILL");
    const key = { Authorization: `Bearer ${coved.apiKey}` };
    let status = 0;
    for (let i = 0; i < 100 && status !== 200; i++) {
      await sleep(100);
      status = (await post(key, initialize)).status;
      if (status !== 200) assert.equal(status, 503); // while it is down: a clear 503
    }
    assert.equal(status, 200);
  });
});

// @modelcontextprotocol/conformance's server mode connects to a URL with no credentials, so
// it gets a coved of its own with --insecure (no API key, loopback only). The scenarios that
// apply: the rest call the reference server's own tools, resources and prompts by name.
const CONFORMANCE = ["server-initialize", "ping", "tools-list", "dns-rebinding-protection",
  "server-sse-polling", "server-sse-multiple-streams"];

describe("conformance (streamable HTTP)", () => {
  const open = new Coved({ extraArgs: ["--insecure"] });
  before(async () => {
    await open.start();
  });
  after(async () => {
    await open.cleanup({ keepLogAs: join(HERE, "coved-mcp-conformance.log") });
  });

  for (const scenario of CONFORMANCE) {
    test(scenario, { timeout: 120_000 }, async () => {
      const out = mkdtempSync(join(tmpdir(), "cove-conformance-"));
      try {
        const result = spawnSync(join(BIN, "conformance"), ["server", "--url",
          `${open.baseUrl}/mcp`, "--scenario", scenario, "-o", out], { encoding: "utf8",
          timeout: 110_000 });
        const dirs = readdirSync(out);
        assert.equal(dirs.length, 1, `${result.stdout}\n${result.stderr}`);
        const checks = JSON.parse(readFileSync(join(out, dirs[0], "checks.json"), "utf8"));
        const failed = checks.filter((c) => c.status === "FAILURE");
        assert.deepEqual(failed, [], `${scenario}: ${JSON.stringify(failed, null, 1)}`);
        assert.equal(result.status, 0, `${result.stdout}\n${result.stderr}`);
        // the scenarios that test what a stateless server does must have passed, not skipped
        if (!scenario.startsWith("server-sse"))
          assert.ok(checks.some((c) => c.status === "SUCCESS"), JSON.stringify(checks));
      } finally {
        rmSync(out, { recursive: true, force: true });
      }
    });
  }
});

describe("cove mcp install, read back by the clients", () => {
  // No traffic beyond this machine from the clients' own CLIs.
  const quiet = { CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: "1", DISABLE_TELEMETRY: "1",
    DISABLE_AUTOUPDATER: "1", DISABLE_ERROR_REPORTING: "1", NO_PROXY: "*" };
  let home, project, env;
  before(() => {
    home = mkdtempSync(join(tmpdir(), "cove-mcp-home-"));
    project = join(home, "project");
    mkdirSync(project);
    env = { PATH: process.env.PATH, HOME: home, COVE_SERVER: coved.baseUrl,
      COVE_API_KEY: coved.apiKey, ...quiet };
  });
  after(() => rmSync(home, { recursive: true, force: true }));

  const install = (...args) => {
    const r = spawnSync(CLI, ["mcp", "install", ...args], { cwd: project, env, encoding: "utf8" });
    assert.equal(r.status, 0, r.stderr);
    return r;
  };

  test("Claude Code reads both scopes and connects to the user-scope server", { timeout: 120_000 },
    async () => {
      writeFileSync(join(home, ".claude.json"),
        JSON.stringify({ numStartups: 3, mcpServers: { other: { type: "stdio", command: "true" } } }));
      const claude = (args, cwd) => run(join(BIN, "claude"), args, { cwd, env, timeout: 90_000 });
      install("--target", "claude"); // the project's .mcp.json
      const shared = await claude(["mcp", "get", "cove"], project);
      assert.match(shared.stdout, /Project config \(shared via \.mcp\.json\)/);
      assert.match(shared.stdout, new RegExp(`COVE_SERVER=${coved.baseUrl}`));
      install("--target", "claude", "--scope", "user");
      const user = await claude(["mcp", "get", "cove"], home);
      assert.match(user.stdout, /Scope: User config/);
      assert.match(user.stdout, /Status: ✔ Connected/); // it started `cove mcp` and initialized
      assert.match(user.stdout, new RegExp(`Command: ${CLI}`));
      assert.match(user.stdout, /Args: mcp/);
      const other = await claude(["mcp", "get", "other"], home);
      assert.match(other.stdout, /Command: true/);
      assert.equal(JSON.parse(readFileSync(join(home, ".claude.json"), "utf8")).numStartups, 3);
    });

  test("Codex reads ~/.codex/config.toml", { timeout: 60_000 }, async () => {
    mkdirSync(join(home, ".codex"), { recursive: true });
    writeFileSync(join(home, ".codex", "config.toml"),
      'model = "o4"\n\n[mcp_servers.other]\ncommand = "true"\n');
    install("--target", "codex");
    install("--target", "codex"); // again: replaced, not repeated
    const codex = (args) => run(join(BIN, "codex"), args, { cwd: home, env, timeout: 50_000 });
    const cove = JSON.parse((await codex(["mcp", "get", "cove", "--json"])).stdout);
    assert.equal(cove.transport.type, "stdio");
    assert.equal(cove.transport.command, CLI);
    assert.deepEqual(cove.transport.args, ["mcp"]);
    assert.deepEqual(cove.transport.env, { COVE_SERVER: coved.baseUrl });
    const other = JSON.parse((await codex(["mcp", "get", "other", "--json"])).stdout);
    assert.equal(other.transport.command, "true");
    const text = readFileSync(join(home, ".codex", "config.toml"), "utf8");
    assert.ok(text.startsWith('model = "o4"\n\n[mcp_servers.other]\ncommand = "true"\n'), text);
    assert.equal(text.match(/\[mcp_servers\.cove\]/g).length, 1);
  });

  test("Cursor and VS Code files have each client's documented shape", () => {
    install("--target", "cursor");
    install("--target", "cursor", "--scope", "project");
    install("--target", "vscode");
    install("--target", "vscode", "--scope", "project");
    for (const file of [join(home, ".cursor", "mcp.json"), join(project, ".cursor", "mcp.json")]) {
      const entry = JSON.parse(readFileSync(file, "utf8")).mcpServers.cove;
      assert.deepEqual(entry, { command: CLI, args: ["mcp"], env: { COVE_SERVER: coved.baseUrl } });
    }
    for (const file of [join(home, ".config", "Code", "User", "mcp.json"),
      join(project, ".vscode", "mcp.json")]) {
      const entry = JSON.parse(readFileSync(file, "utf8")).servers.cove;
      assert.deepEqual(entry, { type: "stdio", command: CLI, args: ["mcp"],
        env: { COVE_SERVER: coved.baseUrl } });
    }
    assert.ok(existsSync(join(project, ".vscode", "mcp.json")));
  });
});
