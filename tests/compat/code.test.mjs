// Cove's code interpreter (execd's /code operations) against the official OpenSandbox
// JavaScript SDK (@alibaba-group/opensandbox 0.1.11).
//
// That SDK has no code-interpreter API of its own: its Sandbox offers commands, files and
// metrics, and the separate @alibaba-group/opensandbox-code-interpreter package is not on the
// npm registry (`npm view` answers 404). So the SDK is used for everything it does have: the
// sandbox's lifecycle (create, pause, resume, kill), the execd endpoint, its generated execd
// client (`@alibaba-group/opensandbox/internal`, createExecdClient, typed from execd-api.yaml)
// for the context operations, and its ExecutionEventDispatcher to fold the events of POST /code,
// which is sent over raw HTTP (fetch) and split into events as the SDK's own stream parser does
// (JSON lines, with or without "data:").

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { dirname, join } from "node:path";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";

import { DEFAULT_EXECD_PORT, ExecutionEventDispatcher, Sandbox } from "@alibaba-group/opensandbox";
import { createExecdClient } from "@alibaba-group/opensandbox/internal";

import { Coved } from "./coved.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
const RUN = randomBytes(4).toString("hex");
const TEST_TIMEOUT = 180_000;
const PNG_MAGIC = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);

const coved = new Coved();
const closable = [];

before(async () => {
  await coved.start();
});

after(async () => {
  for (const c of closable) await c.close().catch(() => {});
  const problems = await coved.cleanup({ keepLogAs: join(HERE, "coved-code.log") });
  if (problems.length) console.error(`cleanup:\n  ${problems.join("\n  ")}`);
});

function connection() {
  return { domain: coved.domain, apiKey: coved.apiKey, requestTimeoutSeconds: 60 };
}

/** The execd base URL and headers the SDK itself uses for this sandbox. */
async function execdOf(sbx) {
  const ep = await sbx.getEndpoint(DEFAULT_EXECD_PORT);
  const headers = { "OPEN-SANDBOX-API-KEY": coved.apiKey, ...(ep.headers ?? {}) };
  const baseUrl = `http://${ep.endpoint}`;
  return { baseUrl, headers, client: createExecdClient({ baseUrl, headers }) };
}

/** POST /code, its events folded into an SDK Execution. */
async function runCode(execd, code, context) {
  const res = await fetch(`${execd.baseUrl}/code`, {
    method: "POST",
    headers: { ...execd.headers, "content-type": "application/json", accept: "text/event-stream" },
    body: JSON.stringify(context ? { code, context } : { code }),
  });
  if (!res.ok) return { status: res.status, body: await res.json() };
  assert.equal(res.headers.get("content-type"), "text/event-stream");
  const execution = { logs: { stdout: [], stderr: [] }, result: [] };
  const dispatcher = new ExecutionEventDispatcher(execution);
  const events = [];
  for (const rawLine of (await res.text()).split("\n")) {
    const line = rawLine.trim();
    if (!line) continue;
    const json = line.startsWith("data:") ? line.slice(5).trim() : line;
    const ev = JSON.parse(json);
    events.push(ev);
    await dispatcher.dispatch(ev);
  }
  return { status: res.status, execution, events };
}

const stdoutOf = (ex) => ex.logs.stdout.map((m) => m.text).join("");

describe("code contexts through the SDK's execd client and event dispatcher", () => {
  let sbx;
  let execd;

  before(async () => {
    sbx = await Sandbox.create({
      connectionConfig: connection(), image: "code-interpreter",
      resource: { cpu: "1", memory: "1Gi" }, metadata: { suite: "code", run: RUN },
    });
    coved.track(sbx.id);
    closable.push(sbx);
    execd = await execdOf(sbx);
  });

  after(async () => {
    await sbx?.kill().catch(() => {});
  });

  test("createCodeContext, runCode with results, listContexts, getContext", { timeout: TEST_TIMEOUT }, async () => {
    const { data: ctx, response } = await execd.client.POST("/code/context", { body: { language: "python" } });
    assert.equal(response.status, 200);
    assert.equal(ctx.language, "python");
    assert.ok(ctx.id);

    const r = await runCode(execd, "print('hello'); 6 * 7", { id: ctx.id, language: "python" });
    assert.equal(r.status, 200);
    assert.equal(r.execution.id, ctx.id, "init carries the context id");
    assert.equal(stdoutOf(r.execution), "hello\n");
    assert.deepEqual(r.execution.result.map((x) => x.text), ["42"]);
    assert.equal(r.execution.executionCount, 1);
    assert.equal(r.execution.error, undefined);
    assert.equal(typeof r.execution.complete?.executionTimeMs, "number");

    const list = await execd.client.GET("/code/contexts", { params: { query: { language: "python" } } });
    assert.equal(list.response.status, 200);
    assert.ok(list.data.some((c) => c.id === ctx.id && c.language === "python"));
    const got = await execd.client.GET("/code/contexts/{context_id}", { params: { path: { context_id: ctx.id } } });
    assert.deepEqual(got.data, { id: ctx.id, language: "python" });
  });

  test("errors arrive as the dispatcher's ExecutionError, with a traceback", { timeout: TEST_TIMEOUT }, async () => {
    const r = await runCode(execd, "{}['missing']", { language: "python" });
    assert.equal(r.execution.error?.name, "KeyError");
    assert.equal(r.execution.error?.value, "'missing'");
    assert.ok(r.execution.error.traceback.length > 0);
  });

  test("a matplotlib figure is an image/png result", { timeout: TEST_TIMEOUT }, async () => {
    const r = await runCode(execd, "import matplotlib.pyplot as plt\nplt.bar(['a', 'b'], [3, 1])\n", { language: "python" });
    const png = r.execution.result.find((x) => x.raw?.["image/png"]);
    assert.ok(png, `no image/png among ${JSON.stringify(r.execution.result.map((x) => Object.keys(x.raw)))}`);
    assert.ok(Buffer.from(png.raw["image/png"], "base64").subarray(0, 8).equals(PNG_MAGIC));
  });

  test("interruptCode stops a loop; the context keeps its variables across pause and resume", { timeout: TEST_TIMEOUT }, async () => {
    const { data: ctx } = await execd.client.POST("/code/context", { body: { language: "python" } });
    await runCode(execd, "total = sum(range(10))", { id: ctx.id });
    const loop = runCode(execd, "import time\nwhile True:\n    time.sleep(0.01)\n", { id: ctx.id });
    await new Promise((r) => setTimeout(r, 1000));
    const stop = await execd.client.DELETE("/code", { params: { query: { id: ctx.id } } });
    assert.equal(stop.response.status, 200);
    assert.equal((await loop).execution.error?.name, "KeyboardInterrupt");

    await sbx.pause();
    const resumed = await sbx.resume();
    closable.push(resumed);
    const again = await execdOf(resumed);
    const r = await runCode(again, "total", { id: ctx.id });
    assert.deepEqual(r.execution.result.map((x) => x.text), ["45"]);

    const del = await again.client.DELETE("/code/contexts/{context_id}", { params: { path: { context_id: ctx.id } } });
    assert.equal(del.response.status, 200);
    const gone = await again.client.GET("/code/contexts/{context_id}", { params: { path: { context_id: ctx.id } } });
    assert.equal(gone.response.status, 404);
    assert.equal(gone.error?.code, "CONTEXT_NOT_FOUND");
    execd = again;
  });

  test("no context: a stateless shell command; an unknown language: 400", { timeout: TEST_TIMEOUT }, async () => {
    const r = await runCode(execd, "echo from the shell");
    assert.equal(stdoutOf(r.execution).trim(), "from the shell");
    assert.ok(r.execution.complete);
    const bad = await runCode(execd, "1", { language: "cobol" });
    assert.equal(bad.status, 400);
    assert.equal(typeof bad.body.code, "string");
    assert.match(bad.body.message, /no kernel for cobol/);
    const del = await execd.client.DELETE("/code/contexts", { params: { query: { language: "python" } } });
    assert.equal(del.response.status, 200);
    const list = await execd.client.GET("/code/contexts", { params: { query: { language: "python" } } });
    assert.deepEqual(list.data, []);
  });
});

// The other languages OpenSandbox's clients create contexts for, side by side in one sandbox:
// state between runs, an error folded into the dispatcher's ExecutionError, an interrupt that
// leaves the state (Cove's own kernels, src/kernel/kernels/).
describe("javascript, typescript, java and go contexts through the SDK's execd client", () => {
  let sbx;
  let execd;

  before(async () => {
    sbx = await Sandbox.create({
      connectionConfig: connection(), image: "code-interpreter",
      resource: { cpu: "2", memory: "2Gi" }, metadata: { suite: "code-languages", run: RUN },
    });
    coved.track(sbx.id);
    closable.push(sbx);
    execd = await execdOf(sbx);
  });

  after(async () => {
    await sbx?.kill().catch(() => {});
  });

  const languages = [
    { language: "javascript", set: "let kept = 20;", use: "kept * 2 + 2", value: "42",
      fail: "throw new RangeError('too far')", ename: "RangeError", evalue: "too far",
      loop: "while (true) {}" },
    { language: "typescript", set: "const kept: number = 20;", use: "(kept as number) * 2 + 2",
      value: "42", fail: "throw new Error('typed')", ename: "Error", evalue: "typed",
      loop: "for (;;) {}" },
    { language: "java", set: "int kept = 20;", use: "kept * 2 + 2", value: "42",
      fail: "throw new IllegalArgumentException(\"bad argument\");", ename: "EvalException",
      evalue: "bad argument", loop: "while (true) {}" },
    { language: "go", set: "kept := 20", use: "kept*2 + 2", value: "42",
      fail: "panic(\"gone wrong\")", ename: "panic", evalue: "gone wrong", loop: "for {\n}" },
  ];

  for (const l of languages) {
    test(`${l.language}: state, error and interrupt`, { timeout: TEST_TIMEOUT }, async () => {
      const { data: ctx, response } = await execd.client.POST("/code/context", { body: { language: l.language } });
      assert.equal(response.status, 200);
      assert.equal(ctx.language, l.language);
      const set = await runCode(execd, l.set, { id: ctx.id, language: l.language });
      assert.equal(set.execution.error, undefined, JSON.stringify(set.events));
      const use = await runCode(execd, l.use, { id: ctx.id, language: l.language });
      assert.deepEqual(use.execution.result.map((x) => x.text), [l.value], JSON.stringify(use.events));

      const fail = await runCode(execd, l.fail, { id: ctx.id, language: l.language });
      assert.equal(fail.execution.error?.name, l.ename, JSON.stringify(fail.events));
      assert.equal(fail.execution.error?.value, l.evalue);
      assert.ok(fail.execution.error.traceback.length > 0);

      const loop = runCode(execd, l.loop, { id: ctx.id, language: l.language });
      await new Promise((r) => setTimeout(r, 2500));
      const stop = await execd.client.DELETE("/code", { params: { query: { id: ctx.id } } });
      assert.equal(stop.response.status, 200);
      assert.equal((await loop).execution.error?.name, "KeyboardInterrupt");
      const again = await runCode(execd, l.use, { id: ctx.id, language: l.language });
      assert.deepEqual(again.execution.result.map((x) => x.text), [l.value]);
    });
  }
});
