// E2B's SDK against OpenSandbox's, on the same Cove sandbox: what an agent's call costs through
// each wire protocol (issue 15's benchmark).
//
//   commands.run("echo hi")  e2b: envd's process.Process/Start over Connect (JSON envelopes),
//                            OpenSandbox: execd's POST /command (SSE), both the SDKs' own calls
//   runCode("1+1")           @e2b/code-interpreter's runCode (POST /execute, JSON lines) and
//                            execd's POST /code (the OpenSandbox JS SDK has no code API: the
//                            request its execd client would send, over fetch, read to the end)
//
// One coved (started here, its own state dir and port, removed at the end), one sandbox of the
// code-interpreter template made through the E2B API and reached by both SDKs. Each call is
// timed from the SDK call to its resolved result; calls alternate between the SDKs so that
// both see the same host. Prints a markdown table and, with --json FILE, the samples.
//
// Usage: node bench/e2b_sdk.mjs [--iterations N] [--json FILE]   (root, a built tree, and
// tests/compat's npm packages: cd tests/compat && npm ci)

import { writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { parseArgs } from "node:util";

const ROOT = dirname(dirname(fileURLToPath(import.meta.url)));
const COMPAT = join(ROOT, "tests", "compat");
const load = (p) => import(pathToFileURL(join(COMPAT, p)).href);

const { values: opts } = parseArgs({
  options: { iterations: { type: "string", default: "200" }, json: { type: "string" } },
});
const N = Number(opts.iterations);

const { Coved } = await load("coved.mjs");
const { Sandbox: CodeSandbox } = await load("node_modules/@e2b/code-interpreter/dist/index.mjs");
const { Sandbox: OpenSandbox, DEFAULT_EXECD_PORT } = await load(
  "node_modules/@alibaba-group/opensandbox/dist/index.js");

function percentile(sorted, p) {
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[i];
}

function summary(samples) {
  const s = [...samples].sort((a, b) => a - b);
  return { n: s.length, p50: percentile(s, 50), p90: percentile(s, 90), p99: percentile(s, 99) };
}

async function timed(fn) {
  const t = process.hrtime.bigint();
  await fn();
  return Number(process.hrtime.bigint() - t) / 1e6;
}

const coved = new Coved();
await coved.start();
let e2bSbx;
let os;
try {
  const conn = {
    apiUrl: `${coved.baseUrl}/e2b`, sandboxUrl: `${coved.baseUrl}/e2b/sandbox`,
    apiKey: coved.apiKey, requestTimeoutMs: 60_000,
  };
  e2bSbx = await CodeSandbox.create({ ...conn, metadata: { bench: "e2b-sdk" } });
  coved.track(e2bSbx.sandboxId);
  os = await OpenSandbox.connect({
    sandboxId: e2bSbx.sandboxId,
    connectionConfig: { domain: coved.domain, apiKey: coved.apiKey, requestTimeoutSeconds: 60 },
  });
  const ep = await os.getEndpoint(DEFAULT_EXECD_PORT);
  const execdUrl = `http://${ep.endpoint}`;
  const execdHeaders = { "OPEN-SANDBOX-API-KEY": coved.apiKey, ...(ep.headers ?? {}) };

  const calls = {
    "commands.run(\"echo hi\")": {
      e2b: async () => {
        const r = await e2bSbx.commands.run("echo hi");
        if (r.stdout !== "hi\n") throw new Error(`e2b: ${JSON.stringify(r.stdout)}`);
      },
      opensandbox: async () => {
        const r = await os.commands.run("echo hi");
        const out = r.logs.stdout.map((m) => m.text).join("");
        if (out.trim() !== "hi") throw new Error(`opensandbox: ${JSON.stringify(out)}`);
      },
    },
    "runCode(\"1+1\")": {
      e2b: async () => {
        const r = await e2bSbx.runCode("1+1");
        if (r.text !== "2") throw new Error(`e2b: ${JSON.stringify(r.text)}`);
      },
      opensandbox: async () => {
        const res = await fetch(`${execdUrl}/code`, {
          method: "POST",
          headers: { ...execdHeaders, "content-type": "application/json", accept: "text/event-stream" },
          body: JSON.stringify({ code: "1+1", context: { language: "python" } }),
        });
        const text = await res.text();
        const result = text.split("\n").filter((l) => l.startsWith("{"))
          .map((l) => JSON.parse(l)).find((e) => e.type === "result");
        const value = result?.results?.["text/plain"] ?? result?.results?.text;
        if (!res.ok || value !== "2") throw new Error(`opensandbox: ${text}`);
      },
    },
  };

  const results = {};
  for (const [name, pair] of Object.entries(calls)) {
    for (const fn of Object.values(pair)) for (let i = 0; i < 5; i++) await fn(); // warm
    const samples = { e2b: [], opensandbox: [] };
    for (let i = 0; i < N; i++) {
      for (const sdk of i % 2 ? ["opensandbox", "e2b"] : ["e2b", "opensandbox"]) {
        samples[sdk].push(await timed(pair[sdk]));
      }
    }
    results[name] = { e2b: summary(samples.e2b), opensandbox: summary(samples.opensandbox), samples };
  }

  const f = (ms) => ms.toFixed(2);
  console.log(`E2B SDK vs OpenSandbox SDK, same sandbox, ${N} calls each (ms)\n`);
  console.log("| call | SDK | p50 | p90 | p99 | p50 ratio e2b/opensandbox |");
  console.log("| --- | --- | --- | --- | --- | --- |");
  for (const [name, r] of Object.entries(results)) {
    for (const sdk of ["e2b", "opensandbox"]) {
      const s = r[sdk];
      const ratio = sdk === "e2b" ? (r.e2b.p50 / r.opensandbox.p50).toFixed(2) : "";
      console.log(`| ${name} | ${sdk} | ${f(s.p50)} | ${f(s.p90)} | ${f(s.p99)} | ${ratio} |`);
    }
  }
  if (opts.json) writeFileSync(opts.json, JSON.stringify(results, null, 1));
} finally {
  await os?.close().catch(() => {});
  const problems = await coved.cleanup({});
  if (problems.length) console.error(`cleanup:\n  ${problems.join("\n  ")}`);
}
