// What the test files that drive the SDKs share: one coved for the file, started before its
// tests and taken down after them (coved.mjs), the E2B SDKs' connection options for it, and a
// poll for a condition (no timing threshold: its deadline only ends a test that hangs).

import assert from "node:assert/strict";
import { dirname, join } from "node:path";
import { after, before } from "node:test";
import { fileURLToPath } from "node:url";

import { Coved } from "./coved.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));

/** A coved for this file: started before its tests; after them, everything pushed to its
 * `closable` is closed, every sandbox deleted and its log kept as tests/compat/<logName>. */
export function covedForFile(logName, opts) {
  const coved = new Coved(opts);
  coved.closable = [];
  let starting = null;
  /** coved's start, once: for the file's own before hooks, which may run before this one's. */
  coved.started = () => (starting ??= coved.start());
  before(() => coved.started());
  after(async () => {
    for (const c of coved.closable) await c.close().catch(() => {});
    const problems = await coved.cleanup({ keepLogAs: join(HERE, logName) });
    if (problems.length) console.error(`cleanup:\n  ${problems.join("\n  ")}`);
  });
  return coved;
}

/** The E2B SDKs' options for coved: the control plane under /e2b, envd and the code
 * interpreter through /e2b/sandbox, the host form's domain, and coved's key. */
export function e2bOptions(coved, extra = {}) {
  return {
    apiUrl: `${coved.baseUrl}/e2b`,
    sandboxUrl: `${coved.baseUrl}/e2b/sandbox`,
    domain: `localhost:${coved.port}`,
    apiKey: coved.apiKey,
    requestTimeoutMs: 60_000,
    ...extra,
  };
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Polls until fn() is true; fails naming `what` when it is not within timeoutMs. */
export async function until(fn, what, timeoutMs = 60_000) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await fn()) return;
    await sleep(200);
  }
  assert.fail(`${what}: not within ${timeoutMs} ms`);
}
