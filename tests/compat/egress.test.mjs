// Cove's egress (network policy and credential vault) against the official OpenSandbox
// JavaScript SDK (@alibaba-group/opensandbox 0.1.11), through its public API only:
// Sandbox.create({networkPolicy, credentialProxy}), sandbox.getEgressPolicy /
// patchEgressRules / deleteEgressRules, and sandbox.credentialVault. The SDK finds the egress
// API at the endpoint of port 18080 (GET .../endpoints/18080) and calls {endpoint}/policy and
// {endpoint}/credential-vault there with the endpoint's headers; coved serves it through its
// gateway. No traffic leaves the machine: the names in these policies are never dialled
// except pypi.org's denial, which coved answers itself (NXDOMAIN from the sandbox's resolver).
import assert from "node:assert/strict";
import { dirname, join } from "node:path";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";

import { Sandbox, SandboxApiException } from "@alibaba-group/opensandbox";

import { Coved } from "./coved.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
const TEST_TIMEOUT = 180_000;
const coved = new Coved();
const closable = [];

before(async () => {
  await coved.start();
});

after(async () => {
  for (const c of closable) await c.close().catch(() => {});
  const problems = await coved.cleanup({ keepLogAs: join(HERE, "coved-egress.log") });
  if (problems.length) console.error(`cleanup:\n  ${problems.join("\n  ")}`);
});

async function createSandbox(opts = {}) {
  const sbx = await Sandbox.create({
    connectionConfig: { domain: coved.domain, apiKey: coved.apiKey, requestTimeoutSeconds: 60 },
    image: "base",
    ...opts,
  });
  coved.track(sbx.id);
  closable.push(sbx);
  return sbx;
}

describe("network policy through the SDK", () => {
  test("create with a policy, get it, patch and delete rules", { timeout: TEST_TIMEOUT }, async () => {
    const sbx = await createSandbox({
      networkPolicy: { defaultAction: "deny", egress: [{ action: "allow", target: "pypi.org" }] },
    });
    try {
      let policy = await sbx.getEgressPolicy();
      assert.equal(policy.defaultAction, "deny");
      assert.deepEqual(policy.egress, [{ action: "allow", target: "pypi.org" }]);

      await sbx.patchEgressRules([
        { action: "allow", target: "*.githubusercontent.com" },
        { action: "deny", target: "bad.example.com" },
      ]);
      policy = await sbx.getEgressPolicy();
      const targets = policy.egress.map((r) => `${r.action} ${r.target}`);
      assert.ok(targets.includes("allow *.githubusercontent.com"), targets.join(", "));
      assert.ok(targets.includes("deny bad.example.com"), targets.join(", "));
      assert.ok(targets.includes("allow pypi.org"), targets.join(", "));

      await sbx.deleteEgressRules(["bad.example.com"]);
      policy = await sbx.getEgressPolicy();
      assert.ok(!policy.egress.some((r) => r.target === "bad.example.com"));

      // a bad rule is refused with the API's error shape
      await assert.rejects(sbx.patchEgressRules([{ action: "perhaps", target: "x.example" }]),
        (e) => e instanceof SandboxApiException || /400/.test(String(e)));

      // the policy is enforced inside: a name not allowed does not resolve
      const ex = await sbx.commands.run("getent hosts example.com; echo rc=$?");
      assert.match(ex.logs.stdout.map((m) => m.text).join("\n"), /rc=2/);
    } finally {
      await sbx.kill();
    }
  });

  test("no networkPolicy: coved's default, deny-all", { timeout: TEST_TIMEOUT }, async () => {
    const sbx = await createSandbox();
    try {
      const policy = await sbx.getEgressPolicy();
      assert.equal(policy.defaultAction, "deny");
      assert.deepEqual(policy.egress ?? [], []);
    } finally {
      await sbx.kill();
    }
  });
});

describe("credential vault through the SDK", () => {
  test("create, get, patch with revisions, list, get one, delete", { timeout: TEST_TIMEOUT }, async () => {
    const sbx = await createSandbox({
      networkPolicy: { defaultAction: "deny", egress: [{ action: "allow", target: "api.example.com" }] },
      credentialProxy: { enabled: true },
    });
    const secret = "sk-compat-secret-value-0123456789";
    try {
      const vault = sbx.credentialVault;
      const created = await vault.create({
        credentials: [{ name: "openai", source: { type: "inline", value: secret } }],
        bindings: [{
          name: "openai-api",
          match: { hosts: ["api.example.com"] },
          auth: { type: "bearer", credential: "openai" },
        }],
      });
      assert.ok(created.revision >= 1);
      assert.ok(!JSON.stringify(created).includes(secret), "the value is write-only");
      const state = await vault.get();
      assert.equal(state.revision, created.revision);
      assert.deepEqual(state.credentials.map((c) => c.name), ["openai"]);

      const patched = await vault.patch({
        expectedRevision: state.revision,
        credentials: { add: [{ name: "gh", source: { type: "inline", value: "ghp_compat" } }] },
        bindings: {
          add: [{ name: "gh-api", match: { hosts: ["api.github.com"] },
                  auth: { type: "apiKey", name: "X-Api-Key", credential: "gh" } }],
        },
      });
      assert.equal(patched.revision, state.revision + 1);
      await assert.rejects(vault.patch({ expectedRevision: state.revision, credentials: { delete: ["gh"] } }),
        (e) => e instanceof SandboxApiException && e.statusCode === 409);

      const creds = await vault.listCredentials();
      assert.deepEqual(creds.map((c) => c.name).sort(), ["gh", "openai"]);
      const binding = await vault.getBinding("gh-api");
      assert.equal(binding.name, "gh-api");
      assert.equal(binding.auth.type, "apiKey");
      const one = await vault.getCredential("openai");
      assert.equal(one.name, "openai");
      assert.ok(!JSON.stringify(one).includes(secret));

      await vault.delete();
      await assert.rejects(vault.get(), (e) => e instanceof SandboxApiException && e.statusCode === 404);

      // the sandbox never held the value; it trusts coved's CA for the bound hosts
      const ex = await sbx.commands.run("env; echo; grep -c BEGIN /etc/ssl/certs/ca-certificates.crt");
      const out = ex.logs.stdout.map((m) => m.text).join("\n");
      assert.ok(!out.includes(secret));
      assert.match(out, /SSL_CERT_FILE=\/etc\/ssl\/certs\/ca-certificates.crt/);
    } finally {
      await sbx.kill();
    }
  });

  test("without credentialProxy the vault is refused (412)", { timeout: TEST_TIMEOUT }, async () => {
    const sbx = await createSandbox({ networkPolicy: { defaultAction: "deny" } });
    try {
      await assert.rejects(sbx.credentialVault.create({ credentials: [], bindings: [] }),
        (e) => e instanceof SandboxApiException && e.statusCode === 412);
    } finally {
      await sbx.kill();
    }
  });
});
