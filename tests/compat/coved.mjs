// Test harness for the SDK compatibility tests: starts a real coved on its own temp state dir
// and port, and takes down everything it made (sandboxes, coved, leftover cgroups, the state
// dir) even when a test failed. Only the teardown talks to coved without the SDK, so that it
// works whatever state the SDK-facing routes are in.

import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import {
  closeSync, existsSync, mkdtempSync, openSync, readdirSync, readFileSync, rmdirSync, rmSync,
  statSync, writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
const BUILD = process.env.COVE_BUILD_DIR ? resolve(process.env.COVE_BUILD_DIR) : join(ROOT, "build");
export const COVED = join(BUILD, "src", "coved", "coved");
export const AGENT = join(BUILD, "src", "agent", "cove-agent");
export const AGENT_PORT = 44772;

const CGROUP_ROOT = "/sys/fs/cgroup";
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
  constructor({ apiKey } = {}) {
    this.apiKey = apiKey ?? `compat-${randomBytes(12).toString("hex")}`;
    this.stateDir = mkdtempSync(join(tmpdir(), "cove-compat-"));
    this.logPath = join(this.stateDir, "coved.log");
    this.proc = null;
    this.port = null;
    /** Ids of every sandbox the tests made: all are deleted in cleanup(). */
    this.sandboxIds = new Set();
    this.exitHook = () => {
      if (this.proc && this.proc.exitCode === null && this.proc.signalCode === null) {
        this.proc.kill("SIGKILL");
      }
    };
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
      "--api-key", this.apiKey];
    try {
      this.proc = spawn(COVED, args, { stdio: ["ignore", "pipe", logFd] });
    } finally {
      closeSync(logFd);
    }
    process.on("exit", this.exitHook);
    const proc = this.proc;
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
      proc.once("error", (e) => {
        clearTimeout(timer);
        reject(e);
      });
    });
    const m = /coved ready on http:\/\/([^\s:]+):(\d+)/.exec(line);
    if (!m) throw new Error(`unexpected first line from coved: ${JSON.stringify(line)}`);
    this.port = Number(m[2]);
    // Keep reading stdout so that coved never blocks on a full pipe.
    proc.stdout.resume();
    return this;
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

  /** Deletes every sandbox, stops coved, kills leftovers, removes the state dir. Never throws;
   * returns what it had to clean by force (for the log). */
  async cleanup({ keepLogAs } = {}) {
    const problems = [];
    const ids = new Set(this.sandboxIds);
    const alive = this.proc && this.proc.exitCode === null && this.proc.signalCode === null;
    if (alive && this.port) {
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
    if (this.proc) {
      const proc = this.proc;
      if (proc.exitCode === null && proc.signalCode === null) {
        const exited = new Promise((r) => proc.once("exit", r));
        proc.kill("SIGTERM");
        const timedOut = await Promise.race([exited.then(() => false), sleep(15000).then(() => true)]);
        if (timedOut) {
          problems.push("coved ignored SIGTERM for 15 s: killed");
          proc.kill("SIGKILL");
          await exited;
        }
      }
      process.removeListener("exit", this.exitHook);
    }
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
      rmSync(this.stateDir, { recursive: true, force: true });
    }
    return problems;
  }
}
