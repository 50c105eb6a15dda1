// Inside Cove's sandboxes through E2B's SDKs, unmodified: `e2b` (2.51.0) for commands, PTY and
// files (envd: cove-agent's process.Process and filesystem.Filesystem over Connect, /files,
// /health) and `@e2b/code-interpreter` (2.8.0) for runCode (the agent's code interpreter,
// port 49999). Both are pointed at a coved this test starts: apiUrl http://HOST:PORT/e2b for
// the control plane and sandboxUrl http://HOST:PORT/e2b/sandbox for everything inside a
// sandbox (coved routes it by the SDK's E2b-Sandbox-Id / E2b-Sandbox-Port headers).
//
// What a user would notice is what is asserted: outputs, exit codes and the SDK's errors,
// files' bytes, events, results and charts, state kept across calls and across a pause.

import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { describe, test } from "node:test";

import { CommandExitError, FileType, FilesystemEventType, NotFoundError, Sandbox, TimeoutError } from "e2b";
import { Sandbox as CodeSandbox } from "@e2b/code-interpreter";
import { Sandbox as OpenSandbox } from "@alibaba-group/opensandbox";

import { covedForFile, e2bOptions, until } from "./harness.mjs";

const RUN = randomBytes(4).toString("hex");
const TEST_TIMEOUT = 240_000;
const PNG_MAGIC = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);

const coved = covedForFile("coved-e2b-sdk.log");

async function create(opts = {}) {
  const sbx = await Sandbox.create("base", { ...e2bOptions(coved), metadata: { run: RUN }, ...opts });
  coved.track(sbx.sandboxId);
  return sbx;
}

async function createCode(opts = {}) {
  // No template: the code interpreter's default, code-interpreter-v1 (an alias in Cove).
  const sbx = await CodeSandbox.create({ ...e2bOptions(coved), metadata: { run: RUN }, ...opts });
  coved.track(sbx.sandboxId);
  return sbx;
}

describe("commands through the e2b SDK", () => {
  test("run: stdout, stderr, exit codes, cwd, envs, streaming", { timeout: TEST_TIMEOUT }, async () => {
    const sbx = await create({ envs: { FROM_CREATE: "c" } });
    try {
      const r = await sbx.commands.run("echo hello; echo oops >&2");
      assert.equal(r.exitCode, 0);
      assert.equal(r.stdout, "hello\n");
      assert.equal(r.stderr, "oops\n");

      await assert.rejects(sbx.commands.run("echo partial; exit 3"), (e) => {
        assert.ok(e instanceof CommandExitError, `${e}`);
        assert.equal(e.exitCode, 3);
        assert.equal(e.stdout, "partial\n");
        return true;
      });

      assert.equal((await sbx.commands.run("pwd", { cwd: "/tmp" })).stdout, "/tmp\n");
      const env = await sbx.commands.run('printf "%s|%s" "$FROM_CREATE" "$FROM_RUN"', {
        envs: { FROM_RUN: "r u n" },
      });
      assert.equal(env.stdout, "c|r u n");

      const chunks = [];
      const streamed = await sbx.commands.run("for i in 1 2 3; do echo line$i; sleep 0.2; done", {
        onStdout: (d) => chunks.push(d),
      });
      assert.equal(chunks.join(""), "line1\nline2\nline3\n");
      assert.ok(chunks.length >= 2, `streamed in ${chunks.length} piece(s)`);
      assert.equal(streamed.stdout, "line1\nline2\nline3\n");
    } finally {
      await sbx.kill();
    }
  });

  test("timeout, background + kill, stdin, list", { timeout: TEST_TIMEOUT }, async () => {
    const sbx = await create();
    try {
      await assert.rejects(sbx.commands.run("sleep 30", { timeoutMs: 1000 }), (e) => {
        assert.ok(e instanceof TimeoutError || /deadline|timeout/i.test(`${e}`), `${e}`);
        return true;
      });
      // The timed-out command is gone, not left running.
      await until(async () => !(await sbx.commands.run("pgrep -x sleep || true")).stdout.trim(),
        "the timed-out sleep ended");

      const bg = await sbx.commands.run("sleep 300", { background: true });
      assert.ok(bg.pid > 0);
      const listed = await sbx.commands.list();
      assert.ok(listed.some((p) => p.pid === bg.pid), JSON.stringify(listed));
      assert.equal(await bg.kill(), true);
      const ended = await bg.wait().then(() => null, (e) => e);
      assert.ok(ended instanceof CommandExitError, `${ended}`);
      assert.ok(!(await sbx.commands.list()).some((p) => p.pid === bg.pid));

      const cat = await sbx.commands.run("cat", { background: true, stdin: true });
      await cat.sendStdin("hello stdin\n");
      await cat.closeStdin();
      const done = await cat.wait();
      assert.equal(done.stdout, "hello stdin\n");
    } finally {
      await sbx.kill();
    }
  });

  test("PTY: create, send, resize, kill", { timeout: TEST_TIMEOUT }, async () => {
    const sbx = await create();
    try {
      let out = "";
      const dec = new TextDecoder();
      const pty = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += dec.decode(d); } });
      await sbx.pty.sendInput(pty.pid, new TextEncoder().encode("stty size; echo pty-$((6*7))\n"));
      await until(() => out.includes("pty-42") && out.includes("24 80"), `pty output: ${JSON.stringify(out)}`);
      await sbx.pty.resize(pty.pid, { cols: 100, rows: 30 });
      await sbx.pty.sendInput(pty.pid, new TextEncoder().encode("stty size\n"));
      await until(() => out.includes("30 100"), `resized: ${JSON.stringify(out)}`);
      assert.equal(await sbx.pty.kill(pty.pid), true);
      await pty.wait().catch(() => {});
      assert.ok(!(await sbx.commands.list()).some((p) => p.pid === pty.pid));
    } finally {
      await sbx.kill();
    }
  });
});

describe("files through the e2b SDK", () => {
  test("write, read, list, exists, getInfo, rename, makeDir, remove", { timeout: TEST_TIMEOUT }, async () => {
    const sbx = await create();
    try {
      const info = await sbx.files.write("/tmp/e2b/notes.txt", "first line\n");
      assert.equal(info.path, "/tmp/e2b/notes.txt");
      assert.equal(await sbx.files.read("/tmp/e2b/notes.txt"), "first line\n");
      assert.equal((await sbx.commands.run("cat /tmp/e2b/notes.txt")).stdout, "first line\n");

      assert.equal(await sbx.files.exists("/tmp/e2b/notes.txt"), true);
      assert.equal(await sbx.files.exists("/tmp/e2b/missing"), false);
      const stat = await sbx.files.getInfo("/tmp/e2b/notes.txt");
      assert.equal(stat.type, FileType.FILE);
      assert.equal(stat.size, 11);
      assert.equal(stat.name, "notes.txt");

      assert.equal(await sbx.files.makeDir("/tmp/e2b/sub/deeper"), true);
      assert.equal(await sbx.files.makeDir("/tmp/e2b/sub/deeper"), false, "exists already");
      await sbx.files.write("/tmp/e2b/sub/deeper/x.bin", new Uint8Array([0, 1, 2, 255]).buffer);
      const bytes = await sbx.files.read("/tmp/e2b/sub/deeper/x.bin", { format: "bytes" });
      assert.deepEqual([...bytes], [0, 1, 2, 255]);

      const top = await sbx.files.list("/tmp/e2b");
      assert.deepEqual(top.map((e) => e.name).sort(), ["notes.txt", "sub"]);
      assert.equal(top.find((e) => e.name === "sub").type, FileType.DIR);
      const deep = await sbx.files.list("/tmp/e2b", { depth: 3 });
      assert.ok(deep.some((e) => e.path === "/tmp/e2b/sub/deeper/x.bin"), JSON.stringify(deep));

      const moved = await sbx.files.rename("/tmp/e2b/notes.txt", "/tmp/e2b/renamed.txt");
      assert.equal(moved.path, "/tmp/e2b/renamed.txt");
      assert.equal(await sbx.files.exists("/tmp/e2b/notes.txt"), false);
      await sbx.files.remove("/tmp/e2b/sub");
      assert.equal(await sbx.files.exists("/tmp/e2b/sub"), false);
      await assert.rejects(sbx.files.read("/tmp/e2b/sub/deeper/x.bin"), (e) => e instanceof NotFoundError);
    } finally {
      await sbx.kill();
    }
  });

  test("a 100 MB file both ways", { timeout: TEST_TIMEOUT }, async () => {
    const sbx = await create({ metadata: { run: RUN, role: "big" } });
    try {
      const big = randomBytes(100 * 1024 * 1024);
      const sum = createHash("sha256").update(big).digest("hex");
      await sbx.files.write("/home/user/big.bin", big.buffer.slice(big.byteOffset, big.byteOffset + big.length));
      const inside = await sbx.commands.run("sha256sum /home/user/big.bin");
      assert.equal(inside.stdout.split(" ")[0], sum);
      const back = await sbx.files.read("/home/user/big.bin", { format: "bytes" });
      assert.equal(back.length, big.length);
      assert.equal(createHash("sha256").update(back).digest("hex"), sum);
    } finally {
      await sbx.kill();
    }
  });

  test("watchDir sees what a command does", { timeout: TEST_TIMEOUT }, async () => {
    const sbx = await create();
    try {
      await sbx.files.makeDir("/tmp/watched");
      const events = [];
      const handle = await sbx.files.watchDir("/tmp/watched", (ev) => events.push(ev));
      await sbx.commands.run("echo a > /tmp/watched/a.txt && mv /tmp/watched/a.txt /tmp/watched/b.txt && rm /tmp/watched/b.txt");
      const seen = (type, name) => events.some((e) => e.type === type && e.name === name);
      await until(() => seen(FilesystemEventType.CREATE, "a.txt") && seen(FilesystemEventType.WRITE, "a.txt") &&
        seen(FilesystemEventType.RENAME, "a.txt") && seen(FilesystemEventType.REMOVE, "b.txt"),
      `watch events: ${JSON.stringify(events)}`);
      await handle.stop();
    } finally {
      await sbx.kill();
    }
  });
});

describe("the code interpreter through @e2b/code-interpreter", () => {
  test("the quickstart: sales.csv summed per region", { timeout: TEST_TIMEOUT }, async () => {
    const sbx = await createCode();
    try {
      await sbx.files.write("/home/user/sales.csv",
        "region,amount\nshanghai,120\nhangzhou,165\nbeijing,110\nshanghai,80\n");
      const ex = await sbx.runCode(`
import csv
from collections import defaultdict
totals = defaultdict(int)
with open("/home/user/sales.csv") as f:
    for row in csv.DictReader(f):
        totals[row["region"]] += int(row["amount"])
for region, amount in sorted(totals.items(), key=lambda kv: -kv[1]):
    print(region, amount)
`);
      assert.equal(ex.error, undefined, JSON.stringify(ex.error));
      assert.equal(ex.logs.stdout.join(""), "shanghai 200\nhangzhou 165\nbeijing 110\n");
    } finally {
      await sbx.kill();
    }
  });

  test("state across calls, an exception, a chart, a separate context", { timeout: TEST_TIMEOUT }, async () => {
    const sbx = await createCode();
    try {
      await sbx.runCode("x = 41");
      const r = await sbx.runCode("x + 1");
      assert.equal(r.text, "42");

      const bad = await sbx.runCode("1 / 0");
      assert.equal(bad.error.name, "ZeroDivisionError");
      assert.match(bad.error.traceback, /ZeroDivisionError/);

      const chart = await sbx.runCode(
        "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.title('cove')\nplt.show()");
      assert.equal(chart.error, undefined, JSON.stringify(chart.error));
      const png = chart.results.find((res) => res.png);
      assert.ok(png, `results: ${JSON.stringify(chart.results.map((res) => res.formats()))}`);
      assert.deepEqual(Buffer.from(png.png, "base64").subarray(0, 8), PNG_MAGIC);

      const ctx = await sbx.createCodeContext({ cwd: "/tmp" });
      const other = await sbx.runCode("import os\n'x' in globals(), os.getcwd()", { context: ctx });
      assert.equal(other.text, "(False, '/tmp')");
      assert.equal((await sbx.runCode("x")).text, "41", "the default context kept its state");
      await sbx.removeCodeContext(ctx);
    } finally {
      await sbx.kill();
    }
  });
});

describe("lifecycle through the e2b SDK", () => {
  test("pause, then connect: the state is intact", { timeout: TEST_TIMEOUT }, async () => {
    const sbx = await createCode();
    try {
      await sbx.runCode("kept = [i * i for i in range(1000)]");
      assert.equal(await sbx.pause(), true);
      const again = await CodeSandbox.connect(sbx.sandboxId, e2bOptions(coved));
      assert.equal((await again.runCode("sum(kept)")).text, String([...Array(1000).keys()].reduce((a, i) => a + i * i, 0)));
    } finally {
      await Sandbox.kill(sbx.sandboxId, e2bOptions(coved));
    }
  });

  test("setTimeout, then expiry", { timeout: TEST_TIMEOUT }, async () => {
    const sbx = await create();
    await sbx.setTimeout(3_000);
    await until(async () => !(await sbx.isRunning().catch(() => false)), "expired", 120_000);
    assert.equal(await Sandbox.kill(sbx.sandboxId, e2bOptions(coved)), false, "gone already");
  });

  test("the same sandbox through both APIs", { timeout: TEST_TIMEOUT }, async () => {
    // Made by the OpenSandbox SDK, used by the e2b SDK...
    const os = await OpenSandbox.create({
      image: "base",
      metadata: { run: RUN },
      connectionConfig: { domain: coved.domain, apiKey: coved.apiKey, requestTimeoutSeconds: 60 },
    });
    coved.closable.push(os);
    coved.track(os.id);
    await os.files.writeFiles([{ path: "/tmp/from-os.txt", data: "opensandbox" }]);
    const viaE2b = await Sandbox.connect(os.id, e2bOptions(coved));
    assert.equal(await viaE2b.files.read("/tmp/from-os.txt"), "opensandbox");
    await viaE2b.files.write("/tmp/from-e2b.txt", "e2b");
    const ex = await os.commands.run("cat /tmp/from-e2b.txt");
    assert.equal(ex.logs.stdout.map((m) => m.text).join(""), "e2b");
    // ...and killed through E2B's API: gone for both.
    assert.equal(await viaE2b.kill(), true);
    await until(async () => !(await coved.listedIds()).includes(os.id), "gone from the OpenSandbox API");
  });
});
