// E2B's pause on timeout through the official `e2b` SDK (2.51.0), unmodified: what
// Sandbox.create({lifecycle: {onTimeout: "pause", autoResume}}) sends (autoPause and
// autoResume {enabled}) makes a sandbox that is paused at its timeout, not killed; getInfo()
// shows that lifecycle and the paused state; traffic resumes it with autoResume, and
// Sandbox.connect does whatever it says. What runs inside is checked through the OpenSandbox
// SDK on the same sandbox (nothing here needs envd).

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { Sandbox } from "e2b";
import { Sandbox as OpenSandbox } from "@alibaba-group/opensandbox";

import { covedForFile, e2bOptions, until } from "./harness.mjs";

const TEST_TIMEOUT = 180_000;

const coved = covedForFile("coved-e2b-autopause.log");

async function opensandbox(id) {
  const os = await OpenSandbox.connect({
    sandboxId: id,
    connectionConfig: { domain: coved.domain, apiKey: coved.apiKey, requestTimeoutSeconds: 60 },
  });
  coved.closable.push(os);
  return os;
}

const stdout = (ex) => ex.logs.stdout.map((m) => m.text).join("");

describe("E2B pause on timeout through the e2b SDK", () => {
  test("paused at its timeout with memory kept; traffic resumes it (autoResume)",
    { timeout: TEST_TIMEOUT }, async () => {
      const sbx = await Sandbox.create("base", {
        ...e2bOptions(coved), timeoutMs: 60_000, lifecycle: { onTimeout: "pause", autoResume: true },
      });
      coved.track(sbx.sandboxId);
      const info = await sbx.getInfo();
      assert.deepEqual(info.lifecycle, { onTimeout: "pause", autoResume: true });
      const os = await opensandbox(sbx.sandboxId);
      const pid = stdout(await os.commands.run("setsid sleep 100000 </dev/null >/dev/null 2>&1 & echo $!")).trim();
      await sbx.setTimeout(1_000);
      await until(async () => (await sbx.getInfo()).state === "paused", "paused at its timeout");
      await sbx.setTimeout(300_000); // what its resume sets: not paused again under the command
      const paused = await Sandbox.list({ ...e2bOptions(coved), query: { state: ["paused"] } }).nextItems();
      assert.ok(paused.some((s) => s.sandboxId === sbx.sandboxId), JSON.stringify(paused));
      // A command through the gateway wakes it: the sleeper is still there.
      assert.equal(stdout(await os.commands.run(`kill -0 ${pid} && echo alive`)).trim(), "alive");
      assert.equal((await sbx.getInfo()).state, "running");
      assert.equal(await sbx.kill(), true);
    });

  test("autoResume false: paused until Sandbox.connect", { timeout: TEST_TIMEOUT }, async () => {
    const sbx = await Sandbox.create("base", { ...e2bOptions(coved), timeoutMs: 1_000, lifecycle: { onTimeout: "pause" } });
    coved.track(sbx.sandboxId);
    // getInfo answers alike for a sandbox that is paused already.
    assert.deepEqual((await sbx.getInfo()).lifecycle, { onTimeout: "pause", autoResume: false });
    await until(async () => (await sbx.getInfo()).state === "paused", "paused at its timeout");
    const again = await Sandbox.connect(sbx.sandboxId, { ...e2bOptions(coved), timeoutMs: 300_000 });
    assert.equal(again.sandboxId, sbx.sandboxId);
    const info = await sbx.getInfo();
    assert.equal(info.state, "running");
    assert.ok(info.endAt.getTime() > Date.now() + 200_000, `endAt ${info.endAt.toISOString()}`);
    assert.equal(await sbx.kill(), true);
  });
});
