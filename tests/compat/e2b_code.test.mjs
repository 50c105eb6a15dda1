// E2B's code interpreter API (the agent's /ci routes, docs/e2b-code.md) against the official
// @e2b/code-interpreter SDK (2.8.0), unmodified: runCode with its callbacks, results, errors,
// contexts, restart, envs. The sandbox is made through the SDK and Cove's E2B control plane;
// the SDK reaches port 49999 of it through coved's sandbox URL (/e2b/sandbox, docs/e2b.md).

import assert from "node:assert/strict";
import { before, describe, test } from "node:test";

import { NotFoundError, Sandbox } from "@e2b/code-interpreter";

import { covedForFile, e2bOptions } from "./harness.mjs";

const TEST_TIMEOUT = 180_000;
const PNG_MAGIC = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);

const coved = covedForFile("coved-e2b-code.log");
let sbx;

before(async () => {
  await coved.started();
  sbx = await Sandbox.create(e2bOptions(coved)); // the SDK's default template
  coved.track(sbx.sandboxId);
});

describe("E2B's code interpreter through @e2b/code-interpreter", () => {
  test("runCode streams stdout, keeps state and counts executions", { timeout: TEST_TIMEOUT }, async () => {
    const lines = [];
    const first = await sbx.runCode("x = 1\nprint('hello')", { onStdout: (m) => lines.push(m.line) });
    assert.deepEqual(first.logs, { stdout: ["hello\n"], stderr: [] });
    assert.deepEqual(lines, ["hello\n"]);
    assert.equal(first.error, undefined);
    const second = await sbx.runCode("x + 1");
    assert.equal(second.text, "2");
    assert.equal(second.executionCount, first.executionCount + 1);
    assert.equal((await sbx.runCode("'a string'")).text, "a string");
  });

  test("an exception is an ExecutionError; a chart is a png result", { timeout: TEST_TIMEOUT }, async () => {
    const failed = await sbx.runCode("def f():\n    return 1 / 0\nf()");
    assert.equal(failed.error.name, "ZeroDivisionError");
    assert.equal(failed.error.value, "division by zero");
    assert.match(failed.error.traceback, /Traceback[^]*ZeroDivisionError/); // with ANSI colours
    const chart = await sbx.runCode("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()");
    assert.equal(chart.results.length, 1);
    assert.deepEqual(chart.results[0].formats(), ["png"]);
    assert.equal(chart.results[0].isMainResult, false);
    assert.ok(Buffer.from(chart.results[0].png, "base64").subarray(0, 8).equals(PNG_MAGIC));
  });

  test("contexts: their own state and cwd, listed, restarted, removed", { timeout: TEST_TIMEOUT }, async () => {
    const ctx = await sbx.createCodeContext({ language: "python", cwd: "/tmp" });
    assert.equal(ctx.language, "python");
    assert.equal(ctx.cwd, "/tmp");
    await sbx.runCode("mine = 41", { context: ctx });
    assert.equal((await sbx.runCode("import os\nos.getcwd()", { context: ctx })).text, "/tmp");
    assert.equal((await sbx.runCode("mine")).error.name, "NameError"); // not in the default one
    assert.ok((await sbx.listCodeContexts()).some((c) => c.id === ctx.id));
    await sbx.restartCodeContext(ctx);
    assert.equal((await sbx.runCode("mine", { context: ctx })).error.name, "NameError");
    await sbx.removeCodeContext(ctx.id);
    assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === ctx.id));
    await assert.rejects(sbx.runCode("1", { context: ctx }), NotFoundError);
  });

  test("envs hold for one run; javascript runs by language", { timeout: TEST_TIMEOUT }, async () => {
    const code = "import os\nprint(os.environ.get('GREETING'))";
    assert.deepEqual((await sbx.runCode(code, { envs: { GREETING: "hi" } })).logs.stdout, ["hi\n"]);
    assert.deepEqual((await sbx.runCode(code)).logs.stdout, ["None\n"]);
    const js = await sbx.runCode("console.log('from js'); 2 + 3", { language: "js" });
    assert.deepEqual(js.logs.stdout, ["from js\n"]);
    assert.equal(js.text, "5");
  });
});
