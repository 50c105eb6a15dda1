// The web console (/console) in a real browser: Debian's headless Chromium driven by
// puppeteer-core (no browser of its own is downloaded: PUPPETEER_SKIP_DOWNLOAD, and the
// system's /usr/bin/chromium is launched). It logs in with a key, creates a sandbox from the
// form, types `echo hi` in the terminal (the agent's PTY over a WebSocket through a signed
// route), uploads a file, runs Python that draws a matplotlib chart, pauses, resumes and kills
// it, and visits every page, saving a screenshot of each to artifacts/console-*.png. Any page
// error, console error or Content-Security-Policy violation fails the test, except the
// refusals the test itself provokes (the pools page with a key that is not an admin's).

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";

import puppeteer from "puppeteer-core";

import { Coved } from "./coved.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
const ARTIFACTS = join(HERE, "artifacts");
const CHROMIUM = process.env.CHROMIUM ?? "/usr/bin/chromium";
const RUN = randomBytes(4).toString("hex");
const TIMEOUT = 240_000;
const WAIT = { timeout: 120_000 };

// Nothing but this machine: every other name is NOTFOUND, background services off.
const CHROMIUM_ARGS = [
  "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync",
  "--disable-default-apps", "--disable-breakpad", "--disable-extensions",
  "--disable-dev-shm-usage", "--no-proxy-server",
  "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE *.localhost, EXCLUDE 127.0.0.1",
];

const ADMIN_KEY = `console-admin-${randomBytes(12).toString("hex")}`;
const coved = new Coved({ extraArgs: ["--admin-api-key", ADMIN_KEY] });
let browser;
let page;
const problems = [];
// Refusals the test provokes on purpose, which the browser logs as failed loads.
const expectedRefusals = [{ status: 403, url: /\/v1\/pools$/ }, { status: 404, url: /\/v1\/sandboxes\/[a-z0-9]+\/events$/ },
  { status: 404, url: /\/v1\/events$/ }];

before(async () => {
  await coved.start();
  mkdirSync(ARTIFACTS, { recursive: true });
});

after(async () => {
  await browser?.close().catch(() => {});
  const left = await coved.cleanup({ keepLogAs: join(HERE, "coved-console.log") });
  if (left.length) console.error(`cleanup:\n  ${left.join("\n  ")}`);
});

async function shot(name) {
  await page.screenshot({ path: join(ARTIFACTS, `console-${name}.png`), fullPage: true });
}

async function go(hash, selector) {
  await page.evaluate((h) => { location.hash = h; }, hash);
  if (selector) await page.waitForSelector(selector, WAIT);
}

const textOf = (selector) => page.$eval(selector, (el) => el.textContent);

test("the console in headless Chromium: log in, create, terminal, files, code, pause, resume, kill",
  { timeout: TIMEOUT, skip: existsSync(CHROMIUM) ? false : `no ${CHROMIUM}` }, async () => {
    browser = await puppeteer.launch({ executablePath: CHROMIUM, headless: true, args: CHROMIUM_ARGS });
    page = await browser.newPage();
    await page.setViewport({ width: 1280, height: 900 });
    page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
    page.on("console", (m) => {
      if (m.type() !== "error" && m.type() !== "warn") return;
      const text = m.text();
      const url = m.location()?.url ?? "";
      const refused = /status of (\d+)/.exec(text);
      if (refused && expectedRefusals.some((r) => r.status === Number(refused[1]) && r.url.test(url))) return;
      problems.push(`console ${m.type()}: ${text} (${url})`);
    });
    await page.evaluateOnNewDocument(() => {
      document.addEventListener("securitypolicyviolation", (e) =>
        console.error(`CSP violation: ${e.violatedDirective} ${e.blockedURI}`));
    });

    // Log in: a wrong key is refused, the right one goes to the list.
    await page.goto(`${coved.baseUrl}/console`, { waitUntil: "networkidle0" });
    await page.waitForSelector("#api-key", WAIT);
    await shot("login");
    expectedRefusals.push({ status: 401, url: /\/v1\/quota$/ });
    await page.type("#api-key", "not-the-key");
    await page.click("#login button[type=submit]");
    await page.waitForFunction(() => document.querySelector("#login .error-text")?.textContent.includes("refused"), WAIT);
    expectedRefusals.pop();
    await page.$eval("#api-key", (el) => { el.value = ""; });
    await page.type("#api-key", coved.apiKey);
    await page.click("#login button[type=submit]");
    await page.waitForSelector("#create-form", WAIT);
    assert.equal(await page.evaluate(() => sessionStorage.getItem("cove.apiKey")), coved.apiKey);
    assert.equal(await page.evaluate(() => document.cookie), "", "no cookie holds the key");

    // Create a code-interpreter sandbox from the form; the console opens it.
    await page.select("#create-template", "code-interpreter");
    await page.type("#create-form input[name=cpu]", "1");
    await page.type("#create-form input[name=memory]", "1Gi");
    await page.type("#create-form input[name=metadata]", `run=${RUN}`);
    await page.click("#create-submit");
    await page.waitForFunction(() => /^#\/sandboxes\/[a-z0-9]+/.test(location.hash), WAIT);
    const id = (await page.evaluate(() => location.hash)).split("/")[2];
    coved.track(id);
    await page.waitForFunction(() => document.querySelector("#sandbox-state")?.textContent === "Running", WAIT);

    // The terminal: a shell over the PTY WebSocket. Each command is typed at a prompt (keys
    // typed while the shell switches the terminal's modes may be dropped, as in any terminal).
    await page.waitForFunction(() => document.querySelector("#terminal-status")?.textContent.startsWith("connected"), WAIT);
    const lines = () => document.querySelector("#terminal").textContent.split("\n").map((l) => l.trimEnd());
    const atPrompt = () => page.waitForFunction(`(${lines})().at(-1).endsWith("#")`, WAIT);
    const screenHas = (line) => page.waitForFunction((l) => document.querySelector("#terminal").textContent
      .split("\n").some((x) => x.trimEnd() === l), WAIT, line)
      .catch(async (err) => { throw new Error(`no line ${line} in the terminal:\n${await textOf("#terminal")}`, { cause: err }); });
    const command = async (text) => {
      await atPrompt();
      await page.keyboard.type(text);
      await page.keyboard.press("Enter");
    };
    await page.focus("#terminal");
    await command("echo hi");
    await screenHas("hi");
    // Colours are dropped, a backspace takes back a character, Ctrl-C interrupts.
    await command("printf '\\033[1;31mred\\033[0m plain\\n'");
    await screenHas("red plain");
    await command("printf 'ab\\bc\\n'");
    await screenHas("ac");
    await atPrompt();
    await page.keyboard.type("echo typo");
    for (let i = 0; i < 4; i++) await page.keyboard.press("Backspace");
    await page.keyboard.type("fixed");
    await page.keyboard.press("Enter");
    await screenHas("fixed");
    await command("sleep 1000");
    // Running: its line ends the screen, the cursor on the (empty) next one.
    await page.waitForFunction(`(() => { const l = (${lines})(); return l.at(-1) === "" && l.at(-2).endsWith("# sleep 1000"); })()`, WAIT);
    await page.keyboard.down("Control");
    await page.keyboard.press("c");
    await page.keyboard.up("Control");
    await command("echo after-interrupt");
    await screenHas("after-interrupt");
    assert.ok(!(await textOf("#terminal")).includes("\x1b"), "no escape sequence is shown");
    await shot("terminal");

    // Upload a file into /root and see it listed.
    await go(`#/sandboxes/${id}/files`, "#files-upload");
    await page.waitForSelector("#files-rows tr", WAIT);
    const name = `console-${RUN}.txt`;
    const local = join(tmpdir(), name);
    writeFileSync(local, `uploaded by the console test ${RUN}\n`);
    const input = await page.$("#files-upload");
    await input.uploadFile(local);
    await page.waitForSelector(`#files-rows tr[data-name="${name}"]`, WAIT);
    rmSync(local, { force: true });
    await shot("files");
    // Download it back (the browser saves it where CDP says).
    const downloads = mkdtempSync(join(tmpdir(), "console-dl-"));
    const cdp = await page.createCDPSession();
    await cdp.send("Browser.setDownloadBehavior", { behavior: "allow", downloadPath: downloads });
    await page.click(`#files-rows tr[data-name="${name}"] button[data-action=download]`);
    const saved = join(downloads, name);
    const content = `uploaded by the console test ${RUN}\n`;
    const savedText = () => (existsSync(saved) ? readFileSync(saved, "utf8") : null);
    // The browser may make the file before it has written it: wait for the whole of it.
    for (let i = 0; i < 600 && savedText() !== content; i++) await new Promise((r) => setTimeout(r, 100));
    assert.equal(savedText(), content);
    rmSync(downloads, { recursive: true, force: true });

    // A command, then Python drawing a chart: the PNG result shown as an image.
    await go(`#/sandboxes/${id}/run`, "#command-input");
    await page.type("#command-input", `cat /root/${name}`);
    await page.click("#command-run");
    await page.waitForFunction((r) => document.querySelector("#command-output").textContent.includes(`console test ${r}`), WAIT, RUN);
    await page.select("#code-language", "python");
    await page.type("#code-input", "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2, 4])\nplt.title('console')\n");
    await page.click("#code-run");
    await page.waitForSelector("#code-results img", WAIT);
    await page.waitForFunction(() => {
      const img = document.querySelector("#code-results img");
      return img.complete && img.naturalWidth > 0 && img.src.startsWith("data:image/png;base64,");
    }, WAIT);
    await shot("run");

    // Logs, metrics, the audit trail, endpoints.
    await go(`#/sandboxes/${id}/logs`, "#logs-output");
    await shot("logs");
    await go(`#/sandboxes/${id}/metrics`, "#metrics-chart");
    await page.waitForFunction(() => document.querySelector("#metrics-now").textContent.startsWith("now:"), WAIT);
    // The live stream (GET /metrics/watch, one sample a second) adds to the first sample.
    await page.waitForFunction(() => Number(document.querySelector("#metrics-chart").dataset.samples) >= 3, WAIT);
    await shot("metrics");
    await go(`#/sandboxes/${id}/events`, "#events-trail");
    await page.waitForFunction(() => document.querySelector("#events-trail table, #events-trail p"), WAIT);
    await shot("events");
    await go(`#/sandboxes/${id}/endpoints`, "#endpoint-result");
    await page.waitForSelector("#endpoint-open", WAIT);
    await shot("endpoints");
    // The link opens the sandbox's port in a browser: a server started from the command
    // runner in the background, reached by the signed host form (another origin).
    const link = await page.$eval("#endpoint-open", (a) => a.href);
    assert.match(link, new RegExp(`^http://${id}-8000-[0-9a-z]+-[0-9a-z]+\\.localhost:${coved.port}/$`));
    await go(`#/sandboxes/${id}/run`, "#command-input");
    await page.type("#command-input", "python3 -m http.server 8000 --bind 127.0.0.1 --directory /root");
    await page.click("#command-background");
    await page.click("#command-run");
    await page.waitForFunction(() => document.querySelector("#command-output").textContent.includes("[started"), WAIT);
    const app = await browser.newPage();
    let listing = "";
    for (let i = 0; i < 100 && !listing.includes(name); i++) {
      const res = await app.goto(link, { waitUntil: "load" }).catch(() => null);
      listing = res?.ok() ? await app.content() : "";
      if (!listing.includes(name)) await new Promise((r) => setTimeout(r, 200));
    }
    assert.ok(listing.includes(name), `the app at ${link} did not list ${name}`);
    assert.notEqual(new URL(app.url()).origin, new URL(coved.baseUrl).origin);
    await app.close();
    // The server's own log (a background command's output) on the logs tab.
    const started = await textOf("#command-output");
    const commandId = /\[started ([^:]+):/.exec(started)[1];
    await go(`#/sandboxes/${id}/logs`, "#logs-command");
    await page.$eval("#logs-command", (el, c) => { el.value = c; el.dispatchEvent(new Event("change")); }, commandId);
    await page.waitForFunction(() => document.querySelector("#logs-output").textContent.includes('"GET / HTTP/1.1" 200'), WAIT);
    await shot("logs-background");

    // Pause and resume from the header; the state follows.
    await page.click("#sandbox-header button[data-action=pause]");
    await page.waitForFunction(() => document.querySelector("#sandbox-state")?.textContent === "Paused", WAIT);
    assert.equal((await coved.raw("GET", `/v1/sandboxes/${id}`)).body.status.state, "Paused");
    await shot("paused");
    await page.click("#sandbox-header button[data-action=resume]");
    await page.waitForFunction(() => document.querySelector("#sandbox-state")?.textContent === "Running", WAIT);

    // Renew: the expiry the dialog asks for (minutes from now) is what coved then has.
    const before = (await coved.raw("GET", `/v1/sandboxes/${id}`)).body.expiresAt;
    page.once("dialog", (d) => d.accept("300"));
    await page.click("#sandbox-header button[data-action=renew]");
    await page.waitForFunction((b) => !document.querySelector("#sandbox-header").textContent.includes(b), WAIT, before);
    const renewed = Date.parse((await coved.raw("GET", `/v1/sandboxes/${id}`)).body.expiresAt);
    assert.ok(renewed > Date.parse(before) + 3 * 3600_000, `${before} -> ${new Date(renewed).toISOString()}`);

    // The list's filters: by metadata it is there, by another state it is not.
    await go("#/sandboxes", `tr[data-id="${id}"]`);
    await page.type("#filter-metadata", `run=${RUN}`);
    await page.keyboard.press("Enter");
    await page.waitForSelector(`tr[data-id="${id}"]`, WAIT);
    await page.select("#filter-state", "Paused");
    await page.waitForFunction((i) => !document.querySelector(`tr[data-id="${i}"]`), WAIT, id);
    await page.select("#filter-state", "Running");
    await page.waitForSelector(`tr[data-id="${id}"]`, WAIT);
    await page.$eval("#filter-metadata", (el) => { el.value = "run=another"; el.dispatchEvent(new Event("change")); });
    await page.waitForFunction((i) => !document.querySelector(`tr[data-id="${i}"]`), WAIT, id);
    await page.$eval("#filter-metadata", (el) => { el.value = ""; el.dispatchEvent(new Event("change")); });
    await page.select("#filter-state", "");

    // Templates, pools (not for this key), the host's totals.
    await go("#/events", "#events-trail");
    await page.waitForFunction(() => document.querySelector("#events-trail table, #events-trail #events-unavailable"), WAIT);
    await shot("events-all");
    await go("#/templates", "tr[data-template=code-interpreter]");
    await shot("templates");
    await go("#/pools", "#pools-forbidden");
    assert.match(await textOf("#pools-forbidden"), /admin keys only/);
    await shot("pools");
    await go("#/host", "table");
    await shot("host");

    // Kill it from the list: the row goes, and so does the sandbox. Another key's sandbox is
    // never listed: the console sees what its key may see.
    const res = await fetch(`${coved.baseUrl}/v1/sandboxes`, { method: "POST",
      headers: { "OPEN-SANDBOX-API-KEY": ADMIN_KEY, "Content-Type": "application/json" },
      body: JSON.stringify({ image: { uri: "base" }, entrypoint: ["sleep", "infinity"], metadata: { run: RUN } }) });
    assert.equal(res.status, 202);
    const others = (await res.json()).id;
    coved.track(others);
    await go("#/sandboxes", `tr[data-id="${id}"]`);
    await page.waitForSelector(`tr[data-id="${id}"]`, WAIT);
    // A list fetched after that create: one refresh more than now.
    const generation = Number(await page.$eval("#sandbox-rows", (b) => b.dataset.generation));
    await page.click("#list-refresh");
    await page.waitForFunction((g) => Number(document.querySelector("#sandbox-rows").dataset.generation) > g, WAIT, generation);
    assert.ok(await page.$(`tr[data-id="${id}"]`));
    assert.equal(await page.$(`tr[data-id="${others}"]`), null, "another key's sandbox is listed");
    await shot("sandboxes");
    await page.click(`tr[data-id="${id}"] button[data-action=kill]`);
    await page.waitForFunction((i) => !document.querySelector(`tr[data-id="${i}"]`), WAIT, id);
    assert.equal((await coved.raw("GET", `/v1/sandboxes/${id}`)).status, 404);

    // Log out: the key is gone from the tab; an admin key sees the pools.
    await page.click("#logout");
    await page.waitForSelector("#api-key", WAIT);
    assert.equal(await page.evaluate(() => sessionStorage.getItem("cove.apiKey")), null);
    await page.type("#api-key", ADMIN_KEY);
    await page.click("#login button[type=submit]");
    await page.waitForSelector("#create-form", WAIT);
    // The admin key's own sandbox, killed from its page.
    await go("#/sandboxes", `tr[data-id="${others}"]`);
    await go(`#/sandboxes/${others}/files`, "#files-rows tr");
    await page.click("#sandbox-header button[data-action=kill]");
    await page.waitForFunction(() => location.hash === "#/sandboxes", WAIT);
    await page.waitForFunction((i) => !document.querySelector(`tr[data-id="${i}"]`), WAIT, others);
    assert.equal((await fetch(`${coved.baseUrl}/v1/sandboxes/${others}`, { headers: { "OPEN-SANDBOX-API-KEY": ADMIN_KEY } })).status, 404);
    await go("#/pools", "#pools-table");
    await go("#/host", "table");
    await page.waitForFunction(() => document.querySelector("main").textContent.includes("Every owner"), WAIT);
    await page.waitForSelector("#host-totals td", WAIT);
    await shot("host-admin");

    assert.deepEqual(problems, []);
  });
