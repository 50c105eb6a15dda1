// Test harness for the SDK compatibility tests: starts a real coved on its own temp state dir
// and port, and takes down everything it made (sandboxes, coved, leftover cgroups, the state
// dir) even when a test fails. Only the teardown talks to coved without the SDK, so that it
// works whatever state the SDK-facing routes are in.
//
// The test process may die without running its teardown: `node --test` kills its test files
// hard on Ctrl-C or a timeout. So start() also spawns a reaper (this file, run with --reap) in
// its own process group, holding the read end of a pipe from the test process: when that pipe
// closes, whoever closed it, the reaper runs the same cleanup (a no-op if it was done). coved
// also gets its own process group, so that a Ctrl-C does not stop it before the reaper has
// deleted the sandboxes through it (coved leaves sandboxes running when it stops).

import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import {
  appendFileSync, closeSync, existsSync, mkdtempSync, openSync, readdirSync, readFileSync,
  rmdirSync, rmSync, statSync, writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

const SELF = fileURLToPath(import.meta.url);
const ROOT = resolve(dirname(SELF), "..", "..");
const BUILD = process.env.COVE_BUILD_DIR ? resolve(process.env.COVE_BUILD_DIR) : join(ROOT, "build");
export const COVED = join(BUILD, "src", "coved", "coved");
export const AGENT = join(BUILD, "src", "agent", "cove-agent");
export const AGENT_PORT = 44772;

const CGROUP_ROOT = "/sys/fs/cgroup";
const REAPER_LOG = join(tmpdir(), "cove-compat-reaper.log");
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Every cgroup directory (v1 or v2) Cove may have made for a sandbox: .../cove/{id}. */
function cgroupDirs(sandboxId) {
  const found = [];
  const walk = (dir, depth) => {
    let entries;
    try {
      entries = readdirSync(dir, { withFileTypes: true });
    } catch {
      return;
    }
    for (const e of entries) {
      if (!e.isDirectory()) continue;
      const path = join(dir, e.name);
      if (e.name === "cove") {
        const mine = join(path, sandboxId);
        if (existsSync(mine)) found.push(mine);
      } else if (depth < 3) {
        walk(path, depth + 1);
      }
    }
  };
  walk(CGROUP_ROOT, 0);
  return found;
}

function tryWrite(path, text) {
  try {
    writeFileSync(path, text);
  } catch {
    // absent, or not writable: nothing to do
  }
}

/** Kills whatever still runs in a sandbox's cgroups and removes them. */
async function killCgroups(sandboxId) {
  const dirs = cgroupDirs(sandboxId);
  for (const d of dirs) {
    tryWrite(join(d, "freezer.state"), "THAWED");
    tryWrite(join(d, "cgroup.kill"), "1");
    for (let i = 0; i < 200; i++) {
      let pids;
      try {
        pids = readFileSync(join(d, "cgroup.procs"), "utf8").split(/\s+/).filter(Boolean);
      } catch {
        break;
      }
      if (pids.length === 0) break;
      for (const p of pids) {
        try {
          process.kill(Number(p), "SIGKILL");
        } catch {
          // already gone
        }
      }
      await sleep(10);
    }
    for (let i = 0; i < 200; i++) {
      try {
        rmdirSync(d);
        break;
      } catch (e) {
        if (e.code === "ENOENT") break;
        await sleep(10);
      }
    }
  }
  return dirs;
}

/** Mount points under dir, as this process sees them: never rm -rf across one of them. */
function mountsUnder(dir) {
  try {
    return readFileSync("/proc/self/mountinfo", "utf8")
      .split("\n")
      .map((l) => l.split(" ")[4])
      .filter((m) => m && (m === dir || m.startsWith(dir + "/")));
  } catch {
    return [];
  }
}

export class Coved {
  /** A new coved (then start()), or, given stateDir/port/pid, one already started. */
  constructor({ apiKey, stateDir, port, pid, extraArgs } = {}) {
    this.apiKey = apiKey ?? `compat-${randomBytes(12).toString("hex")}`;
    this.stateDir = stateDir ?? mkdtempSync(join(tmpdir(), "cove-compat-"));
    this.logPath = join(this.stateDir, "coved.log");
    this.port = port ?? null;
    this.pid = pid ?? null;
    this.proc = null;
    this.reaper = null;
    /** Ids of every sandbox the tests made: all are deleted in cleanup(). */
    this.sandboxIds = new Set();
    this.cleaning = null;
    /** More of coved's flags (e.g. ["--insecure"]). */
    this.extraArgs = extraArgs ?? [];
  }

  /** host:port of the lifecycle API, as the SDK's `domain` wants it (no scheme). */
  get domain() {
    return `127.0.0.1:${this.port}`;
  }

  get baseUrl() {
    return `http://${this.domain}`;
  }

  async start({ readyTimeoutMs = 30000 } = {}) {
    for (const bin of [COVED, AGENT]) {
      if (!existsSync(bin)) throw new Error(`${bin} is missing: build with ninja -C ${BUILD}`);
    }
    const logFd = openSync(this.logPath, "a");
    const args = ["--listen", "127.0.0.1:0", "--state-dir", this.stateDir, "--agent", AGENT,
      "--api-key", this.apiKey, ...this.extraArgs];
    let proc;
    try {
      // Tests never reach a registry off this host: images come from loopback ones only.
      const env = { COVE_IMAGE_REGISTRIES: "loopback", ...process.env };
      proc = spawn(COVED, args, { stdio: ["ignore", "pipe", logFd], detached: true, env });
    } finally {
      closeSync(logFd);
    }
    this.proc = proc;
    await new Promise((ok, fail) => {
      proc.once("spawn", ok);
      proc.once("error", fail);
    });
    this.pid = proc.pid;
    this.startReaper();
    const line = await new Promise((resolveLine, reject) => {
      const rl = createInterface({ input: proc.stdout });
      const timer = setTimeout(() => {
        rl.close();
        reject(new Error(`coved printed no ready line in ${readyTimeoutMs} ms\n${this.log()}`));
      }, readyTimeoutMs);
      rl.once("line", (l) => {
        clearTimeout(timer);
        rl.close();
        resolveLine(l);
      });
      proc.once("exit", (code, sig) => {
        clearTimeout(timer);
        reject(new Error(`coved exited (${code ?? sig}) before it was ready\n${this.log()}`));
      });
    });
    const m = /coved ready on http:\/\/([^\s:]+):(\d+)/.exec(line);
    if (!m) throw new Error(`unexpected first line from coved: ${JSON.stringify(line)}`);
    this.port = Number(m[2]);
    this.reaper.stdin.write(`${JSON.stringify({ port: this.port })}\n`);
    // Keep reading stdout so that coved never blocks on a full pipe.
    proc.stdout.resume();
    return this;
  }

  startReaper() {
    const info = { stateDir: this.stateDir, pid: this.pid, apiKey: this.apiKey };
    this.reaper = spawn(process.execPath, [SELF, "--reap", JSON.stringify(info)], {
      stdio: ["pipe", "ignore", "ignore"],
      detached: true,
    });
    this.reaper.on("error", () => {});
    this.reaper.stdin.on("error", () => {});
    // Neither the reaper nor its pipe keeps the test process alive.
    this.reaper.unref();
    this.reaper.stdin.unref();
  }

  log() {
    try {
      return readFileSync(this.logPath, "utf8");
    } catch {
      return "";
    }
  }

  track(id) {
    if (id) this.sandboxIds.add(id);
    return id;
  }

  /** Whether our coved still runs (its pid, with our state dir on its command line). */
  isRunning() {
    if (!this.pid) return false;
    try {
      return readFileSync(`/proc/${this.pid}/cmdline`, "utf8").split("\0").includes(this.stateDir);
    } catch {
      return false;
    }
  }

  async raw(method, path, { timeoutMs = 15000 } = {}) {
    const res = await fetch(`${this.baseUrl}${path}`, {
      method,
      headers: { "OPEN-SANDBOX-API-KEY": this.apiKey },
      signal: AbortSignal.timeout(timeoutMs),
    });
    const text = await res.text();
    let body = null;
    try {
      body = text ? JSON.parse(text) : null;
    } catch {
      body = text;
    }
    return { status: res.status, body };
  }

  /** Every sandbox id coved lists for our key (all pages, every state). */
  async listedIds() {
    const ids = [];
    for (let page = 1; page <= 100; page++) {
      const { status, body } = await this.raw("GET", `/v1/sandboxes?page=${page}&pageSize=100`);
      if (status !== 200 || !Array.isArray(body?.items)) break;
      ids.push(...body.items.map((s) => s.id));
      if (!body.pagination?.hasNextPage) break;
    }
    return ids;
  }

  /** Whether coved's process group (coved and the helpers it runs, such as a template copy;
   * it was started as a group leader) still has members. */
  groupAlive() {
    if (!this.pid) return false;
    try {
      process.kill(-this.pid, 0);
      return true;
    } catch {
      return false;
    }
  }

  async stop(problems) {
    if (!this.isRunning() && !this.groupAlive()) return;
    const signal = (target, sig) => {
      try {
        process.kill(target, sig);
      } catch {
        // gone
      }
    };
    if (this.isRunning()) signal(this.pid, "SIGTERM");
    for (let i = 0; i < 300 && this.isRunning(); i++) await sleep(50);
    if (this.isRunning()) {
      problems.push("coved ignored SIGTERM for 15 s: killed");
      signal(this.pid, "SIGKILL");
      for (let i = 0; i < 100 && this.isRunning(); i++) await sleep(50);
    }
    // Helpers coved left behind (a stopped coved does not wait for them).
    if (this.groupAlive()) {
      signal(-this.pid, "SIGTERM");
      for (let i = 0; i < 100 && this.groupAlive(); i++) await sleep(50);
      if (this.groupAlive()) {
        problems.push("coved's helpers ignored SIGTERM: killed");
        signal(-this.pid, "SIGKILL");
        for (let i = 0; i < 100 && this.groupAlive(); i++) await sleep(50);
      }
    }
  }

  /** Deletes every sandbox, stops coved, kills leftovers, removes the state dir. Never throws;
   * resolves to what it had to clean by force (for the log). Runs once, however often called. */
  cleanup(opts) {
    this.cleaning ??= this.doCleanup(opts).catch((e) => [`cleanup failed: ${e.stack ?? e}`]);
    return this.cleaning;
  }

  async doCleanup({ keepLogAs } = {}) {
    const problems = [];
    const ids = new Set(this.sandboxIds);
    if (this.isRunning() && this.port) {
      try {
        for (const id of await this.listedIds()) ids.add(id);
      } catch (e) {
        problems.push(`listing sandboxes: ${e.message}`);
      }
      for (const id of ids) {
        try {
          const { status } = await this.raw("DELETE", `/v1/sandboxes/${encodeURIComponent(id)}`,
            { timeoutMs: 30000 });
          if (status !== 204 && status !== 404) problems.push(`DELETE ${id}: HTTP ${status}`);
        } catch (e) {
          problems.push(`DELETE ${id}: ${e.message}`);
        }
      }
      // Deletion may finish asynchronously (Stopping -> Terminated): wait for it a little.
      const deadline = Date.now() + 20000;
      for (const id of ids) {
        while (Date.now() < deadline) {
          try {
            const { status, body } = await this.raw("GET", `/v1/sandboxes/${encodeURIComponent(id)}`);
            if (status === 404 || body?.status?.state === "Terminated") break;
          } catch {
            break;
          }
          await sleep(100);
        }
      }
    }
    await this.stop(problems);
    const runDir = join(this.stateDir, "run");
    try {
      if (statSync(runDir).isDirectory()) for (const id of readdirSync(runDir)) ids.add(id);
    } catch {
      // no run dir
    }
    for (const id of ids) {
      const forced = await killCgroups(id);
      if (forced.length) problems.push(`sandbox ${id} left cgroups ${forced.join(", ")}`);
    }
    if (keepLogAs) {
      try {
        writeFileSync(keepLogAs, this.log());
      } catch (e) {
        problems.push(`keeping the log as ${keepLogAs}: ${e.message}`);
      }
    }
    const mounts = mountsUnder(this.stateDir);
    if (mounts.length) {
      problems.push(`state dir ${this.stateDir} kept: mounts remain under it: ${mounts.join(", ")}`);
    } else {
      try {
        // Retries: a child coved left (its template copy) may still be finishing.
        rmSync(this.stateDir, { recursive: true, force: true, maxRetries: 20, retryDelay: 100 });
      } catch (e) {
        problems.push(`removing ${this.stateDir}: ${e.message}`);
      }
    }
    // Done: the reaper may go (it finds nothing left to do).
    this.reaper?.stdin.end();
    return problems;
  }
}

// The reaper: waits for its stdin to close, then cleans up after the test process.
if (process.argv[2] === "--reap" && resolve(process.argv[1] ?? "") === SELF) {
  const info = JSON.parse(process.argv[3]);
  process.on("SIGINT", () => {}); // a Ctrl-C is for the tests: the reaper outlives them
  let buffered = "";
  process.stdin.setEncoding("utf8");
  process.stdin.on("data", (d) => {
    buffered += d;
  });
  process.stdin.on("error", () => {});
  process.stdin.on("close", async () => {
    for (const line of buffered.split("\n")) {
      if (line.trim()) Object.assign(info, JSON.parse(line));
    }
    if (!existsSync(info.stateDir)) process.exit(0); // the tests cleaned up themselves
    const problems = await new Coved(info).cleanup();
    appendFileSync(REAPER_LOG, `${new Date().toISOString()} cleaned up ${info.stateDir} after ` +
      `the test process: ${problems.length ? problems.join("; ") : "nothing forced"}\n`);
    process.exit(0);
  });
}
