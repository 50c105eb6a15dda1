// Cove's in-sandbox execd API (commands, background commands, interrupt, bash sessions, the
// files API, metrics) against the official OpenSandbox JavaScript SDK
// (@alibaba-group/opensandbox 0.1.11), through its public API only: sandbox.commands,
// sandbox.files, sandbox.getMetrics / sandbox.metrics. Every suite runs twice: with the SDK
// talking to the agent directly (the endpoint coved gives for port 44772) and with
// useServerProxy (?use_server_proxy=true on the endpoint call; coved answers both with its
// gateway route /sandboxes/{id}/proxy/44772, a sandbox having no address of its own). Starts
// its own coved; every sandbox is deleted and coved stopped in teardown (coved.mjs).
//
// What the SDK sends and expects from execd (its source, 0.1.11), in short:
// - commands.run(cmd, {workingDirectory, background, timeoutSeconds, uid, gid, envs}):
//   POST /command {command, cwd, background, timeout (ms), uid, gid, envs}, accept:
//   text/event-stream; events as JSON lines (with or without "data:"). `init` carries the
//   command id in `text`; exitCode = 0 after execution_complete, int(error.evalue) after an
//   error event, and is not inferred at all for background runs.
// - interrupt(id): DELETE /command?id=ID. getCommandStatus(id): GET /command/status/{id} ->
//   {id, content, running, exit_code, error, started_at, finished_at} (ISO dates).
//   getBackgroundCommandLogs(id, cursor): GET /command/{id}/logs?cursor=N, text body, next
//   cursor in the EXECD-COMMANDS-TAIL-CURSOR header.
// - createSession({workingDirectory}): POST /session {cwd} -> {session_id};
//   runInSession(id, cmd, {workingDirectory, timeoutSeconds}): POST /session/{id}/run
//   {command, cwd, timeout}, same event stream; deleteSession: DELETE /session/{id}.
// - files: getFileInfo GET /files/info?path=a&path=b -> {path: FileInfo}; writeFiles one
//   multipart POST /files/upload per file (parts "metadata" {path, owner, group, mode} then
//   "file"; streamed bodies for async iterables); readFile/readBytes/readBytesStream
//   GET /files/download?path=[&offset=&limit=] with an optional Range header; deleteFiles
//   DELETE /files?path=..; createDirectories POST /directories {path: {mode, owner, group}}
//   (mode 755 when none is given); deleteDirectories DELETE /directories?path=..;
//   listDirectory GET /directories/list?path=&depth=; search GET /files/search?path=&pattern=;
//   moveFiles POST /files/mv [{src, dest}]; replaceContents(Detailed) POST /files/replace
//   [?verbose=true] {path: {old, new}} -> {path: {replacedCount}}; setPermissions
//   POST /files/permissions {path: {mode, owner, group}}. Modes are octal digits written as a
//   decimal number (644). FileInfo: {path, type, size, modified_at, created_at, mode, owner,
//   group}. Upload and download errors become SandboxApiException with the HTTP status only.
// - getMetrics: GET /metrics -> {cpu_count, cpu_used_pct, mem_total_mib, mem_used_mib,
//   timestamp (ms)}.
// Not covered here: sandbox.isolation (execd's /v1/isolated/* sessions): isolated.test.mjs.
//
// COVE_COMPAT_TRACE=1 prints every HTTP exchange the SDK makes (method, URL, status).

import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { dirname, join } from "node:path";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";

import { Sandbox, SandboxApiException } from "@alibaba-group/opensandbox";

import { Coved } from "./coved.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
const IMAGE = process.env.COVE_COMPAT_IMAGE ?? "base";
const RUN = randomBytes(4).toString("hex");
const TEST_TIMEOUT = 180_000;

if (process.env.COVE_COMPAT_TRACE) {
  // The SDK takes the global fetch when it builds a connection's transport: wrap it first.
  const realFetch = globalThis.fetch;
  globalThis.fetch = async (input, init) => {
    const method = init?.method ?? input?.method ?? "GET";
    const url = typeof input === "string" ? input : input?.url ?? String(input);
    const res = await realFetch(input, init);
    console.error(`[trace] ${method} ${url} -> ${res.status} ${res.headers.get("content-type") ?? ""}`);
    return res;
  };
}

const coved = new Coved();
const closable = []; // Sandbox instances: their HTTP agents are closed last

before(async () => {
  await coved.start();
});

after(async () => {
  for (const c of closable) await c.close().catch(() => {});
  const problems = await coved.cleanup({ keepLogAs: join(HERE, "coved-execd.log") });
  if (problems.length) console.error(`cleanup:\n  ${problems.join("\n  ")}`);
});

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const stdoutOf = (ex) => ex.logs.stdout.map((m) => m.text).join("\n");
const stderrOf = (ex) => ex.logs.stderr.map((m) => m.text).join("\n");
const sha256 = (bytes) => createHash("sha256").update(bytes).digest("hex");

function connection(extra = {}) {
  return { domain: coved.domain, apiKey: coved.apiKey, requestTimeoutSeconds: 60, ...extra };
}

async function createSandbox(suite, useServerProxy) {
  const sbx = await Sandbox.create({
    connectionConfig: connection({ useServerProxy }),
    image: IMAGE,
    metadata: { suite, run: RUN },
  });
  coved.track(sbx.id);
  closable.push(sbx);
  return sbx;
}

/** Runs a shell command through the SDK and returns its stdout; fails on a non-zero exit. */
async function sh(sbx, command, opts) {
  const ex = await sbx.commands.run(command, opts);
  assert.equal(ex.exitCode, 0, `\`${command}\` exited ${ex.exitCode}: ${stderrOf(ex)}`);
  return stdoutOf(ex);
}

/** assert.rejects predicate: a SandboxApiException with this HTTP status (and, for the JSON
 * routes, a {code, message} body: the SDK keeps its code). */
function apiError(status, { coded = true } = {}) {
  return (e) => {
    assert.ok(e instanceof SandboxApiException, `expected a SandboxApiException, got ${e?.stack ?? e}`);
    assert.equal(e.statusCode, status, `expected HTTP ${status}, got ${e.statusCode}: ${e.message}`);
    if (coded) {
      assert.ok(e.error?.code && e.error.code !== "UNEXPECTED_RESPONSE",
        `the error body must carry a code: ${JSON.stringify(e.rawBody)}`);
    }
    return true;
  };
}

async function waitFinished(sbx, id, timeoutMs = 30000) {
  const deadline = Date.now() + timeoutMs;
  let status;
  while (Date.now() < deadline) {
    status = await sbx.commands.getCommandStatus(id);
    if (status.running === false) return status;
    await sleep(100);
  }
  assert.fail(`command ${id} still running after ${timeoutMs} ms: ${JSON.stringify(status)}`);
}

/** All of a background command's log, read through the cursor until it stops growing. */
async function allLogs(sbx, id) {
  let content = "";
  let cursor;
  for (let i = 0; i < 100; i++) {
    const page = await sbx.commands.getBackgroundCommandLogs(id, cursor);
    content += page.content;
    if (page.cursor === undefined || page.cursor === cursor || page.content === "") return content;
    cursor = page.cursor;
  }
  return content;
}

async function* chunks(parts) {
  for (const p of parts) {
    await sleep(5);
    yield p;
  }
}

async function collect(iterable) {
  const parts = [];
  for await (const p of iterable) parts.push(Buffer.from(p));
  return Buffer.concat(parts);
}

for (const useServerProxy of [false, true]) {
  const mode = useServerProxy ? "useServerProxy" : "direct";

  describe(`commands (${mode})`, () => {
    let sbx;

    before(async () => {
      sbx = await createSandbox(`commands-${mode}`, useServerProxy);
    });

    after(async () => {
      await sbx?.kill().catch(() => {});
    });

    test("run: success with stdout and stderr, an id from the init event", { timeout: TEST_TIMEOUT }, async () => {
      const inits = [];
      const ex = await sbx.commands.run("echo out-1; echo err-1 >&2; echo out-2", undefined,
        { onInit: (i) => inits.push(i) });
      assert.equal(ex.error, undefined, `unexpected error event: ${JSON.stringify(ex.error)}`);
      assert.ok(ex.complete, "no execution_complete event");
      assert.equal(ex.exitCode, 0);
      assert.equal(stdoutOf(ex), "out-1\nout-2");
      assert.equal(stderrOf(ex), "err-1");
      assert.equal(inits.length, 1);
      assert.ok(ex.id, "the init event must carry the command id");
      assert.equal(inits[0].id, ex.id);
    });

    test("run: workingDirectory", { timeout: TEST_TIMEOUT }, async () => {
      const dir = `/tmp/cwd-${RUN}`;
      await sh(sbx, `mkdir -p '${dir}/sub'`);
      assert.equal((await sh(sbx, "pwd", { workingDirectory: dir })).trim(), dir);
      assert.equal((await sh(sbx, "ls", { workingDirectory: dir })).trim(), "sub");
      // Without one, the command does not inherit the previous run's directory.
      assert.notEqual((await sh(sbx, "pwd")).trim(), dir);
      // A directory that does not exist: an error (an HTTP error or a failing execution).
      let failed = false;
      try {
        const ex = await sbx.commands.run("pwd", { workingDirectory: `/tmp/absent-${RUN}` });
        failed = ex.exitCode !== 0;
      } catch (e) {
        failed = e instanceof SandboxApiException;
      }
      assert.ok(failed, "a missing working directory must not run the command");
    });

    test("run: envs are injected, the environment is kept", { timeout: TEST_TIMEOUT }, async () => {
      const value = "a b 'c' \"d\" $HOME ü";
      const out = await sh(sbx, 'printf "%s|%s|%s\\n" "$COMPAT_ONE" "$COMPAT_TWO" "$PATH"', {
        envs: { COMPAT_ONE: "1", COMPAT_TWO: value },
      });
      const [one, two, path] = out.trim().split("|");
      assert.equal(one, "1");
      assert.equal(two, value);
      assert.match(path, /\/usr\/bin/, "injected envs must not replace the inherited PATH");
      // They are for that command only.
      assert.equal((await sh(sbx, 'echo "[${COMPAT_ONE-unset}]"')).trim(), "[unset]");
    });

    test("run: a failing command gives its exit code and an error", { timeout: TEST_TIMEOUT }, async () => {
      const ex = await sbx.commands.run("echo partial; echo bad >&2; exit 42");
      assert.ok(ex.error, "a failing command must end with an error event");
      assert.equal(ex.exitCode, 42);
      assert.equal(stdoutOf(ex), "partial");
      assert.equal(stderrOf(ex), "bad");
      const notFound = await sbx.commands.run(`no-such-command-${RUN}`);
      assert.equal(notFound.exitCode, 127);
    });

    test("run: uid/gid", { timeout: TEST_TIMEOUT }, async () => {
      assert.equal((await sh(sbx, "id -u; id -g", { uid: 1000, gid: 1000 })).trim(), "1000\n1000");
      assert.equal((await sh(sbx, "id -u", { uid: 65534 })).trim(), "65534");
    });

    test("run: timeoutSeconds ends a command that runs too long", { timeout: TEST_TIMEOUT }, async () => {
      const started = Date.now();
      const ex = await sbx.commands.run("echo started; sleep 60; echo never", { timeoutSeconds: 1 });
      assert.ok(Date.now() - started < 20_000, `the timeout did not end the command (${Date.now() - started} ms)`);
      assert.notEqual(ex.exitCode, 0);
      assert.equal(stdoutOf(ex), "started");
    });

    test("background: status while running, then exit code, dates and logs", { timeout: TEST_TIMEOUT }, async () => {
      const marker = `/tmp/bg-${RUN}-${randomBytes(3).toString("hex")}`;
      const startedAt = Date.now();
      const command =
        `echo line-1; echo err-line >&2; while [ ! -e '${marker}' ]; do sleep 0.1; done; echo line-2; exit 5`;
      const ex = await sbx.commands.run(command, { background: true });
      assert.ok(ex.id, "a background run must give the command id (init event)");
      assert.equal(ex.exitCode, undefined, "the SDK infers no exit code for a background run");
      assert.equal(ex.error, undefined);

      const running = await sbx.commands.getCommandStatus(ex.id);
      assert.equal(running.running, true, JSON.stringify(running));
      assert.equal(running.id, ex.id);
      assert.equal(running.content, command);
      assert.equal(running.exitCode, null);
      assert.equal(running.finishedAt, null);
      assert.ok(running.startedAt instanceof Date, `startedAt must be a date: ${running.startedAt}`);
      assert.ok(Math.abs(running.startedAt.getTime() - startedAt) < 30_000, `startedAt ${running.startedAt.toISOString()} is not now`);

      // Logs while it runs (the first line arrives shortly).
      let early = "";
      for (let i = 0; i < 100 && !early.includes("line-1"); i++) {
        early = (await sbx.commands.getBackgroundCommandLogs(ex.id)).content;
        if (!early.includes("line-1")) await sleep(100);
      }
      assert.match(early, /line-1/);

      await sh(sbx, `touch '${marker}'`);
      const done = await waitFinished(sbx, ex.id);
      assert.equal(done.exitCode, 5);
      assert.ok(done.finishedAt instanceof Date, `finishedAt must be a date: ${done.finishedAt}`);
      assert.ok(done.finishedAt.getTime() >= done.startedAt.getTime());

      const all = await sbx.commands.getBackgroundCommandLogs(ex.id);
      for (const line of ["line-1", "err-line", "line-2"]) assert.match(all.content, new RegExp(line));
      assert.ok(all.content.indexOf("line-1") < all.content.indexOf("line-2"));
      assert.equal(typeof all.cursor, "number", "the logs must give a cursor (EXECD-COMMANDS-TAIL-CURSOR)");
      // From the cursor on, nothing new.
      const rest = await sbx.commands.getBackgroundCommandLogs(ex.id, all.cursor);
      assert.equal(rest.content, "");
    });

    test("background: the log cursor is a byte offset into the output", { timeout: TEST_TIMEOUT }, async () => {
      const ex = await sbx.commands.run("for i in $(seq 1 200); do echo \"row-$i\"; done", { background: true });
      assert.ok(ex.id);
      const done = await waitFinished(sbx, ex.id);
      assert.equal(done.exitCode, 0);
      const all = await sbx.commands.getBackgroundCommandLogs(ex.id);
      const rows = all.content.split("\n").filter(Boolean);
      assert.equal(rows.length, 200);
      assert.equal(rows[0], "row-1");
      assert.equal(rows[199], "row-200");
      assert.equal(all.cursor, Buffer.byteLength(all.content));
      assert.deepEqual(await sbx.commands.getBackgroundCommandLogs(ex.id, 0), all);
      const tail = await sbx.commands.getBackgroundCommandLogs(ex.id, 100);
      assert.equal(tail.content, all.content.slice(100));
      assert.equal(tail.cursor, all.cursor);
      assert.equal(await allLogs(sbx, ex.id), all.content);
    });

    test("background: workingDirectory and envs", { timeout: TEST_TIMEOUT }, async () => {
      const ex = await sbx.commands.run('echo "$PWD:$BG_VAR"', {
        background: true, workingDirectory: "/tmp", envs: { BG_VAR: "bg-value" },
      });
      const done = await waitFinished(sbx, ex.id);
      assert.equal(done.exitCode, 0);
      assert.equal((await allLogs(sbx, ex.id)).trim(), "/tmp:bg-value");
    });

    test("interrupt: a long foreground command", { timeout: TEST_TIMEOUT }, async () => {
      let id;
      let sawOutput;
      const output = new Promise((r) => {
        sawOutput = r;
      });
      const started = Date.now();
      const running = sbx.commands.run("echo begun; sleep 120; echo never", undefined, {
        onInit: (i) => {
          id = i.id;
        },
        onStdout: (m) => {
          if (m.text.includes("begun")) sawOutput();
        },
      });
      await Promise.race([output, running]);
      assert.ok(id, "no command id before the first output");
      await sbx.commands.interrupt(id);
      const ex = await running;
      assert.ok(Date.now() - started < 30_000, "the interrupted command's stream did not end");
      assert.notEqual(ex.exitCode, 0, `an interrupted command must not succeed: ${JSON.stringify(ex.error)}`);
      assert.ok(!stdoutOf(ex).includes("never"));
      const status = await waitFinished(sbx, id, 10_000);
      assert.equal(status.running, false);
      assert.notEqual(status.exitCode, 0);
      assert.ok(status.finishedAt instanceof Date);
    });

    test("interrupt: a background command", { timeout: TEST_TIMEOUT }, async () => {
      const ex = await sbx.commands.run("sleep 120", { background: true });
      assert.equal((await sbx.commands.getCommandStatus(ex.id)).running, true);
      await sbx.commands.interrupt(ex.id);
      const status = await waitFinished(sbx, ex.id, 15_000);
      assert.notEqual(status.exitCode, 0, `an interrupted command must not succeed: ${JSON.stringify(status)}`);
    });

    test("unknown command ids give 404", { timeout: TEST_TIMEOUT }, async () => {
      const id = `no-such-command-${RUN}`;
      await assert.rejects(sbx.commands.getCommandStatus(id), apiError(404));
      await assert.rejects(sbx.commands.getBackgroundCommandLogs(id), apiError(404));
      await assert.rejects(sbx.commands.interrupt(id), apiError(404));
    });
  });

  describe(`bash sessions (${mode})`, () => {
    let sbx;

    before(async () => {
      sbx = await createSandbox(`sessions-${mode}`, useServerProxy);
    });

    after(async () => {
      await sbx?.kill().catch(() => {});
    });

    test("createSession → runs keep cwd and exported variables → deleteSession", { timeout: TEST_TIMEOUT }, async () => {
      const dir = `/tmp/session-${RUN}`;
      await sh(sbx, `mkdir -p '${dir}/inner'`);
      const id = await sbx.commands.createSession({ workingDirectory: dir });
      assert.equal(typeof id, "string");
      assert.ok(id.length > 0);

      const first = await sbx.commands.runInSession(id, "pwd");
      assert.equal(first.exitCode, 0, stderrOf(first));
      assert.equal(stdoutOf(first).trim(), dir);

      // What a run leaves for the next (as execd, which runs each in a new bash and carries
      // over the directory and `export -p`): cwd and exported variables, and unsets of them.
      // Shell variables that are not exported, and functions, do not carry over.
      const setup = await sbx.commands.runInSession(id,
        "cd inner && export SESSION_VAR='kept value' GONE_VAR=x && PLAIN_VAR=plain");
      assert.equal(setup.exitCode, 0, stderrOf(setup));
      const unset = await sbx.commands.runInSession(id, "unset GONE_VAR");
      assert.equal(unset.exitCode, 0, stderrOf(unset));

      const again = await sbx.commands.runInSession(id,
        'pwd; echo "$SESSION_VAR"; echo "[${GONE_VAR-unset}] [${PLAIN_VAR-unset}]"');
      assert.equal(again.exitCode, 0, stderrOf(again));
      assert.deepEqual(stdoutOf(again).trim().split("\n"), [`${dir}/inner`, "kept value", "[unset] [unset]"]);

      // A run's own workingDirectory; a failing run keeps the session usable.
      const elsewhere = await sbx.commands.runInSession(id, "pwd", { workingDirectory: "/tmp" });
      assert.equal(elsewhere.exitCode, 0, stderrOf(elsewhere));
      assert.equal(stdoutOf(elsewhere).trim(), "/tmp");
      const failing = await sbx.commands.runInSession(id, "echo nope >&2; false");
      assert.notEqual(failing.exitCode, 0);
      assert.equal(stderrOf(failing).trim(), "nope");
      const still = await sbx.commands.runInSession(id, 'echo "$SESSION_VAR"');
      assert.equal(still.exitCode, 0, stderrOf(still));
      assert.equal(stdoutOf(still).trim(), "kept value");

      // Not in plain commands, nor in another session.
      assert.equal((await sh(sbx, 'echo "[${SESSION_VAR-unset}]"')).trim(), "[unset]");
      const other = await sbx.commands.createSession();
      const otherRun = await sbx.commands.runInSession(other, 'echo "[${SESSION_VAR-unset}]"');
      assert.equal(stdoutOf(otherRun).trim(), "[unset]");
      await sbx.commands.deleteSession(other);

      await sbx.commands.deleteSession(id);
      await assert.rejects(sbx.commands.runInSession(id, "true"), apiError(404, { coded: false }));
      await assert.rejects(sbx.commands.deleteSession(id), apiError(404));
    });

    test("runInSession: exit code and timeoutSeconds", { timeout: TEST_TIMEOUT }, async () => {
      const id = await sbx.commands.createSession();
      try {
        const ex = await sbx.commands.runInSession(id, "(exit 9)");
        assert.equal(ex.exitCode, 9);
        const started = Date.now();
        const slow = await sbx.commands.runInSession(id, "sleep 60", { timeoutSeconds: 1 });
        assert.ok(Date.now() - started < 30_000, "timeoutSeconds did not end the run");
        assert.notEqual(slow.exitCode, 0);
      } finally {
        await sbx.commands.deleteSession(id).catch(() => {});
      }
    });
  });

  describe(`files (${mode})`, () => {
    let sbx;
    let n = 0;
    /** A fresh directory for one test (made by the SDK's createDirectories). */
    const freshDir = async () => {
      const dir = `/tmp/files-${RUN}-${++n}`;
      await sbx.files.createDirectories([{ path: dir }]);
      return dir;
    };
    const statOf = async (path) => (await sh(sbx, `stat -c '%F|%a|%U|%G|%s' '${path}'`)).trim();
    const exists = async (path) => (await sh(sbx, `[ -e '${path}' ] && echo yes || echo no`)).trim() === "yes";

    before(async () => {
      sbx = await createSandbox(`files-${mode}`, useServerProxy);
    });

    after(async () => {
      await sbx?.kill().catch(() => {});
    });

    test("writeFiles: text, bytes, ArrayBuffer, Blob and a streamed body; read back", { timeout: TEST_TIMEOUT }, async () => {
      const dir = await freshDir();
      const text = "héllo wörld\nsecond line\n";
      const binary = Uint8Array.from({ length: 256 }, (_, i) => i);
      const big = randomBytes(3 * 1024 * 1024 + 17);
      const parts = [big.subarray(0, 1000), big.subarray(1000, 2 * 1024 * 1024), big.subarray(2 * 1024 * 1024)];
      await sbx.files.writeFiles([
        { path: `${dir}/text.txt`, data: text },
        { path: `${dir}/bytes.bin`, data: binary },
        { path: `${dir}/buffer.bin`, data: binary.slice(10, 20).buffer },
        { path: `${dir}/blob.txt`, data: new Blob(["from a blob"]) },
        { path: `${dir}/stream.bin`, data: chunks(parts) },
        { path: `${dir}/empty.txt`, data: "" },
      ]);

      // Through the SDK.
      assert.equal(await sbx.files.readFile(`${dir}/text.txt`), text);
      assert.deepEqual(await sbx.files.readBytes(`${dir}/bytes.bin`), binary);
      assert.deepEqual(await sbx.files.readBytes(`${dir}/buffer.bin`), binary.slice(10, 20));
      assert.equal(await sbx.files.readFile(`${dir}/blob.txt`), "from a blob");
      const streamed = await collect(sbx.files.readBytesStream(`${dir}/stream.bin`));
      assert.equal(streamed.length, big.length);
      assert.equal(sha256(streamed), sha256(big));
      assert.equal(await sbx.files.readFile(`${dir}/empty.txt`), "");

      // Through commands.
      assert.equal(await sh(sbx, `cat '${dir}/text.txt'`), text.replace(/\n$/, ""));
      assert.equal((await sh(sbx, `sha256sum < '${dir}/stream.bin'`)).split(" ")[0], sha256(big));
      assert.equal((await sh(sbx, `sha256sum < '${dir}/bytes.bin'`)).split(" ")[0], sha256(binary));
      assert.equal((await sh(sbx, `stat -c %s '${dir}/empty.txt'`)).trim(), "0");
    });

    test("writeFiles: overwrite truncates, parents are made, mode/owner/group apply", { timeout: TEST_TIMEOUT }, async () => {
      const dir = await freshDir();
      await sbx.files.writeFiles([{ path: `${dir}/f.txt`, data: "a long first version" }]);
      await sbx.files.writeFiles([{ path: `${dir}/f.txt`, data: "short" }]);
      assert.equal(await sbx.files.readFile(`${dir}/f.txt`), "short");

      await sbx.files.writeFiles([{ path: `${dir}/new/deeper/g.txt`, data: "deep" }]);
      assert.equal((await sh(sbx, `cat '${dir}/new/deeper/g.txt'`)), "deep");

      await sbx.files.writeFiles([
        { path: `${dir}/owned.txt`, data: "x", mode: 640, owner: "user", group: "user" },
        { path: `${dir}/script.sh`, data: "#!/bin/sh\necho ran\n", mode: 755 },
      ]);
      assert.equal(await statOf(`${dir}/owned.txt`), "regular file|640|user|user|1");
      assert.match(await statOf(`${dir}/script.sh`), /^regular file\|755\|/);
      assert.equal((await sh(sbx, `'${dir}/script.sh'`)).trim(), "ran");

      // "~" is the home directory, as in execd.
      const name = `compat-home-${RUN}-${randomBytes(3).toString("hex")}.txt`;
      await sbx.files.writeFiles([{ path: `~/${name}`, data: "at home" }]);
      assert.equal(await sh(sbx, `cat "$HOME/${name}"`), "at home");
      assert.equal(await sbx.files.readFile(`~/${name}`), "at home");
      await sbx.files.deleteFiles([`~/${name}`]);
      assert.equal(await exists(`/root/${name}`), false);
    });

    test("writeFiles refused early (path under a regular file): the connection stays usable", { timeout: TEST_TIMEOUT }, async () => {
      // The agent refuses such an upload as soon as it has read the metadata part, before the
      // end of the body. The SDK keeps its connection alive: the next requests on it must work.
      const dir = await freshDir();
      await sbx.files.writeFiles([{ path: `${dir}/plain.txt`, data: "plain" }]);
      const refused = (e) => {
        assert.ok(e instanceof SandboxApiException, `expected a SandboxApiException, got ${e?.stack ?? e}`);
        assert.ok(e.statusCode >= 400 && e.statusCode < 500, `expected a 4xx, got ${e.statusCode}`);
        return true;
      };
      const big = randomBytes(4 * 1024 * 1024);
      for (let i = 0; i < 5; i++) {
        // (Another request between two uploads: it takes another of the SDK's connections
        // while the refused upload's one is still busy sending; the next upload gets that one.)
        await assert.rejects(sbx.files.writeFiles([{ path: `${dir}/plain.txt/child-${i}`, data: `no ${i}` }]), refused);
        assert.equal(await sbx.files.readFile(`${dir}/plain.txt`), "plain");
        await sbx.files.writeFiles([{ path: `${dir}/ok-${i}.txt`, data: `ok ${i}` }]);
        await assert.rejects(
          sbx.files.writeFiles([{ path: `${dir}/plain.txt/big-${i}`, data: chunks([big.subarray(0, 1000), big.subarray(1000)]) }]),
          refused);
        assert.equal(await sbx.files.readFile(`${dir}/ok-${i}.txt`), `ok ${i}`);
        await sbx.files.writeFiles([{ path: `${dir}/ok-${i}.txt`, data: `ok ${i}` }]);
      }
      assert.equal(await sbx.files.readFile(`${dir}/plain.txt`), "plain");
      assert.deepEqual((await sbx.files.listDirectory({ path: dir })).map((e) => e.path),
        [0, 1, 2, 3, 4].map((i) => `${dir}/ok-${i}.txt`).concat(`${dir}/plain.txt`));
    });

    test("readFile/readBytes: Range and line offset/limit", { timeout: TEST_TIMEOUT }, async () => {
      const dir = await freshDir();
      const path = `${dir}/lines.txt`;
      await sbx.files.writeFiles([{ path, data: "l1\nl2\nl3\nl4\nl5\n" }]);
      assert.equal(await sbx.files.readFile(path, { range: "bytes=3-7" }), "l2\nl3");
      assert.deepEqual(Buffer.from(await sbx.files.readBytes(path, { range: "bytes=-3" })), Buffer.from("l5\n"));
      const rangeStream = await collect(sbx.files.readBytesStream(path, { range: "bytes=12-" }));
      assert.equal(rangeStream.toString(), "l5\n");
      assert.equal(await sbx.files.readFile(path, { offset: 2, limit: 2 }), "l2\nl3");
      assert.equal(await sbx.files.readFile(path, { offset: 5, limit: 10 }), "l5");
      await assert.rejects(sbx.files.readBytes(path, { range: "bytes=100-200" }), apiError(416, { coded: false }));
    });

    test("getFileInfo: files and directories, several at once", { timeout: TEST_TIMEOUT }, async () => {
      const dir = await freshDir();
      const before = Date.now();
      await sbx.files.writeFiles([{ path: `${dir}/info.txt`, data: "12345", mode: 600 }]);
      const info = await sbx.files.getFileInfo([`${dir}/info.txt`, dir]);
      assert.deepEqual(Object.keys(info).sort(), [`${dir}/info.txt`, dir].sort());
      const f = info[`${dir}/info.txt`];
      assert.equal(f.path, `${dir}/info.txt`);
      assert.equal(f.type, "file");
      assert.equal(f.size, 5);
      assert.equal(f.mode, 600);
      assert.equal(f.owner, "root");
      assert.equal(f.group, "root");
      assert.ok(f.modifiedAt instanceof Date && f.createdAt instanceof Date);
      assert.ok(Math.abs(f.modifiedAt.getTime() - before) < 60_000, `modifiedAt ${f.modifiedAt.toISOString()} is not now`);
      const d = info[dir];
      assert.equal(d.type, "directory");
      assert.equal(d.mode, 755);

      // The same facts as stat inside the sandbox.
      const [size, mtime] = (await sh(sbx, `stat -c '%s %Y' '${dir}/info.txt'`)).trim().split(" ").map(Number);
      assert.equal(f.size, size);
      assert.equal(Math.floor(f.modifiedAt.getTime() / 1000), mtime);

      await assert.rejects(sbx.files.getFileInfo([`${dir}/absent`]), apiError(404));
    });

    test("createDirectories / listDirectory (depth)", { timeout: TEST_TIMEOUT }, async () => {
      const dir = await freshDir();
      await sbx.files.createDirectories([
        { path: `${dir}/b/c/d`, mode: 750 },
        { path: `${dir}/a`, mode: 700, owner: "user", group: "users" },
      ]);
      await sbx.files.writeFiles([
        { path: `${dir}/z.txt`, data: "z" },
        { path: `${dir}/b/inside.txt`, data: "in" },
      ]);
      assert.equal(await statOf(`${dir}/b/c/d`), "directory|750|root|root|" + (await sh(sbx, `stat -c %s '${dir}/b/c/d'`)).trim());
      assert.match(await statOf(`${dir}/a`), /^directory\|700\|user\|users\|/);
      // Creating an existing directory again is fine (mkdir -p).
      await sbx.files.createDirectories([{ path: `${dir}/b/c` }]);

      const top = await sbx.files.listDirectory({ path: dir });
      assert.deepEqual(top.map((e) => [e.path, e.type]), [
        [`${dir}/a`, "directory"], [`${dir}/b`, "directory"], [`${dir}/z.txt`, "file"]]);
      const z = top.find((e) => e.path.endsWith("z.txt"));
      assert.equal(z.size, 1);
      assert.ok(z.modifiedAt instanceof Date);

      const two = await sbx.files.listDirectory({ path: dir, depth: 2 });
      assert.deepEqual(two.map((e) => e.path), [
        `${dir}/a`, `${dir}/b`, `${dir}/b/c`, `${dir}/b/inside.txt`, `${dir}/z.txt`]);

      const listed = (await sh(sbx, `cd '${dir}' && find . -mindepth 1 | sort`)).trim().split("\n");
      assert.deepEqual(listed, ["./a", "./b", "./b/c", "./b/c/d", "./b/inside.txt", "./z.txt"]);

      await assert.rejects(sbx.files.listDirectory({ path: `${dir}/absent` }), apiError(404));
    });

    test("search: glob patterns, recursive", { timeout: TEST_TIMEOUT }, async () => {
      const dir = await freshDir();
      await sbx.files.writeFiles([
        { path: `${dir}/one.txt`, data: "1" },
        { path: `${dir}/two.md`, data: "2" },
        { path: `${dir}/sub/three.txt`, data: "3" },
        { path: `${dir}/sub/deep/four.log`, data: "4" },
      ]);
      const paths = (r) => r.map((f) => f.path).sort();
      const txt = await sbx.files.search({ path: dir, pattern: "*.txt" });
      assert.deepEqual(paths(txt), [`${dir}/one.txt`, `${dir}/sub/three.txt`]);
      for (const f of txt) {
        assert.equal(f.type, "file");
        assert.equal(f.size, 1);
        assert.ok(f.modifiedAt instanceof Date);
      }
      assert.deepEqual(paths(await sbx.files.search({ path: dir })),
        [`${dir}/one.txt`, `${dir}/sub/deep/four.log`, `${dir}/sub/three.txt`, `${dir}/two.md`]);
      assert.deepEqual(paths(await sbx.files.search({ path: dir, pattern: "f*" })), [`${dir}/sub/deep/four.log`]);
      // execd's doublestar rules, on base names.
      assert.deepEqual(paths(await sbx.files.search({ path: dir, pattern: "**/*.txt" })), paths(txt));
      assert.deepEqual(paths(await sbx.files.search({ path: dir, pattern: "*.{md,log}" })),
        [`${dir}/sub/deep/four.log`, `${dir}/two.md`]);
      assert.deepEqual(await sbx.files.search({ path: dir, pattern: "*.none" }), []);
      await assert.rejects(sbx.files.search({ path: `${dir}/absent`, pattern: "*" }), apiError(404));
    });

    test("replaceContents / replaceContentsDetailed", { timeout: TEST_TIMEOUT }, async () => {
      const dir = await freshDir();
      await sbx.files.writeFiles([
        { path: `${dir}/r1.txt`, data: "foo bar foo\nfoo\n", mode: 640 },
        { path: `${dir}/r2.txt`, data: "nothing here" },
      ]);
      await sbx.files.replaceContents([{ path: `${dir}/r1.txt`, oldContent: "foo", newContent: "qux" }]);
      assert.equal(await sbx.files.readFile(`${dir}/r1.txt`), "qux bar qux\nqux\n");
      assert.match(await statOf(`${dir}/r1.txt`), /^regular file\|640\|/, "replace must keep the mode");

      const detailed = await sbx.files.replaceContentsDetailed([
        { path: `${dir}/r1.txt`, oldContent: "qux", newContent: "é" },
        { path: `${dir}/r2.txt`, oldContent: "absent", newContent: "x" },
      ]);
      const counts = Object.fromEntries(detailed.map((r) => [r.path, r.replacedCount]));
      assert.deepEqual(counts, { [`${dir}/r1.txt`]: 3, [`${dir}/r2.txt`]: 0 });
      assert.equal(await sh(sbx, `cat '${dir}/r1.txt'`), "é bar é\né");
      assert.equal(await sbx.files.readFile(`${dir}/r2.txt`), "nothing here");

      await assert.rejects(
        sbx.files.replaceContents([{ path: `${dir}/absent.txt`, oldContent: "a", newContent: "b" }]),
        apiError(404));
    });

    test("moveFiles: rename a file, move into a directory, rename a directory", { timeout: TEST_TIMEOUT }, async () => {
      const dir = await freshDir();
      await sbx.files.writeFiles([
        { path: `${dir}/src.txt`, data: "moving" },
        { path: `${dir}/tree/leaf.txt`, data: "leaf" },
      ]);
      await sbx.files.createDirectories([{ path: `${dir}/target` }]);
      await sbx.files.moveFiles([
        { src: `${dir}/src.txt`, dest: `${dir}/target/dest.txt` },
        { src: `${dir}/tree`, dest: `${dir}/tree2` },
      ]);
      assert.equal(await exists(`${dir}/src.txt`), false);
      assert.equal(await exists(`${dir}/tree`), false);
      assert.equal(await sbx.files.readFile(`${dir}/target/dest.txt`), "moving");
      assert.equal(await sh(sbx, `cat '${dir}/tree2/leaf.txt'`), "leaf");
      await assert.rejects(sbx.files.getFileInfo([`${dir}/src.txt`]), apiError(404));
      await assert.rejects(sbx.files.moveFiles([{ src: `${dir}/absent`, dest: `${dir}/x` }]), apiError(404));
    });

    test("setPermissions: mode, owner and group", { timeout: TEST_TIMEOUT }, async () => {
      const dir = await freshDir();
      await sbx.files.writeFiles([{ path: `${dir}/p.txt`, data: "p" }]);
      await sbx.files.setPermissions([{ path: `${dir}/p.txt`, mode: 600 }]);
      assert.match(await statOf(`${dir}/p.txt`), /^regular file\|600\|root\|root\|/);
      await sbx.files.setPermissions([{ path: `${dir}/p.txt`, mode: 644, owner: "nobody", group: "nogroup" }]);
      assert.equal(await statOf(`${dir}/p.txt`), "regular file|644|nobody|nogroup|1");
      const info = (await sbx.files.getFileInfo([`${dir}/p.txt`]))[`${dir}/p.txt`];
      assert.equal(info.mode, 644);
      assert.equal(info.owner, "nobody");
      assert.equal(info.group, "nogroup");
      // The owner can read it, another user cannot write it.
      assert.equal(await sh(sbx, `cat '${dir}/p.txt'`, { uid: 65534 }), "p");
      const denied = await sbx.commands.run(`echo x >> '${dir}/p.txt'`, { uid: 1000 });
      assert.notEqual(denied.exitCode, 0);

      await assert.rejects(sbx.files.setPermissions([{ path: `${dir}/absent`, mode: 600 }]), apiError(404));
    });

    test("deleteFiles / deleteDirectories", { timeout: TEST_TIMEOUT }, async () => {
      const dir = await freshDir();
      await sbx.files.writeFiles([
        { path: `${dir}/d1.txt`, data: "1" },
        { path: `${dir}/d2.txt`, data: "2" },
        { path: `${dir}/keep.txt`, data: "k" },
        { path: `${dir}/tree/a/b.txt`, data: "b" },
      ]);
      await sbx.files.deleteFiles([`${dir}/d1.txt`, `${dir}/d2.txt`]);
      assert.equal(await exists(`${dir}/d1.txt`), false);
      assert.equal(await exists(`${dir}/d2.txt`), false);
      assert.equal(await sbx.files.readFile(`${dir}/keep.txt`), "k");
      await assert.rejects(sbx.files.readFile(`${dir}/d1.txt`), apiError(404, { coded: false }));

      await sbx.files.deleteDirectories([`${dir}/tree`]);
      assert.equal(await exists(`${dir}/tree`), false);
      assert.deepEqual((await sbx.files.listDirectory({ path: dir })).map((e) => e.path), [`${dir}/keep.txt`]);
    });
  });

  describe(`metrics (${mode})`, () => {
    let sbx;

    before(async () => {
      sbx = await createSandbox(`metrics-${mode}`, useServerProxy);
    });

    after(async () => {
      await sbx?.kill().catch(() => {});
    });

    test("getMetrics", { timeout: TEST_TIMEOUT }, async () => {
      const m = await sbx.getMetrics();
      assert.ok(Number.isInteger(m.cpuCount) && m.cpuCount >= 1, `cpuCount ${m.cpuCount}`);
      assert.ok(m.cpuUsedPercentage >= 0, `cpuUsedPercentage ${m.cpuUsedPercentage}`);
      assert.ok(m.memoryTotalMiB > 0, `memoryTotalMiB ${m.memoryTotalMiB}`);
      assert.ok(m.memoryUsedMiB > 0 && m.memoryUsedMiB <= m.memoryTotalMiB,
        `memoryUsedMiB ${m.memoryUsedMiB} of ${m.memoryTotalMiB}`);
      assert.ok(Math.abs(m.timestamp - Date.now()) < 60_000, `timestamp ${m.timestamp} is not now (ms)`);

      // The sandbox's own memory: allocating 64 MiB shows.
      // (bash keeps the 64 MiB string for 3 s)
      const bg = await sbx.commands.run("x=$(head -c 67108864 /dev/zero | tr '\\0' a); sleep 3; echo ${#x}",
        { background: true });
      let peak = 0;
      for (let i = 0; i < 20; i++) {
        peak = Math.max(peak, (await sbx.metrics.getMetrics()).memoryUsedMiB);
        if (peak >= m.memoryUsedMiB + 32) break;
        await sleep(100);
      }
      await waitFinished(sbx, bg.id);
      assert.ok(peak >= m.memoryUsedMiB + 32, `memoryUsedMiB went from ${m.memoryUsedMiB} to ${peak} only`);
    });
  });
}
