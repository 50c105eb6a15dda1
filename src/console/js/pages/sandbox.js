// One sandbox: its state and actions, and tabs for a live terminal (the agent's PTY over a
// WebSocket), files, command and code runs, logs, a live metrics chart, the audit trail and
// endpoints. Agent calls go through the gateway's path form with the key; the WebSocket, which
// cannot carry a header, through a short-lived signed route (api.js, agentSocketUrl).
import { AGENT_PORT, agentPath, agentSocketUrl, del, get, post, request, stream } from "../api.js";
import { MetricsChart } from "../chart.js";
import { age, bytes, h, notify, replace, until } from "../dom.js";
import { Terminal } from "../terminal.js";
import { eventsTable, renderTrail } from "./events.js";
import { actions } from "./sandboxes.js";

const TABS = ["terminal", "files", "run", "logs", "metrics", "events", "endpoints"];
const REFRESH_MS = 2000;

export async function renderSandbox(view, id, tab) {
  const cleanups = [];
  const header = h("div", { class: "card", id: "sandbox-header" });
  const body = h("div", { id: "tab-body" });
  let timer = null;
  let alive = true;
  const path = `/v1/sandboxes/${encodeURIComponent(id)}`;

  const refresh = async () => {
    clearTimeout(timer);
    let sb;
    try {
      sb = await get(path);
    } catch (err) {
      if (!alive) return;
      if (err.status === 404) {
        replace(header, h("p", { id: "sandbox-gone" }, `Sandbox ${id} is gone: ${err.message} `,
          h("a", { href: "#/sandboxes" }, "back to the list")));
        return;
      }
      notify(err.message);
      timer = setTimeout(refresh, REFRESH_MS);
      return;
    }
    if (!alive) return;
    const l = sb.resourceLimits || {};
    replace(header,
      h("h1", {}, "Sandbox ", sb.id, " ",
        h("span", { class: `state state-${sb.status?.state}`, id: "sandbox-state" }, sb.status?.state)),
      h("dl", { class: "kv" },
        h("dt", {}, "template"), h("dd", {}, sb.image?.uri || sb.snapshotId || ""),
        h("dt", {}, "reason"), h("dd", {}, `${sb.status?.reason || ""}: ${sb.status?.message || ""}`),
        h("dt", {}, "created"), h("dd", {}, `${sb.createdAt} (${age(sb.createdAt)} ago)`),
        h("dt", {}, "expires"), h("dd", {}, sb.expiresAt ? `${sb.expiresAt} (${until(sb.expiresAt)})` : "never"),
        h("dt", {}, "limits"), h("dd", {}, Object.entries(l).map(([k, v]) => `${k}=${v}`).join(" ") || "defaults"),
        h("dt", {}, "metadata"), h("dd", {}, Object.entries(sb.metadata || {}).map(([k, v]) => `${k}=${v}`).join(" ")),
        h("dt", {}, "entrypoint"), h("dd", {}, (sb.entrypoint || []).join(" "))),
      h("div", { class: "toolbar" }, actions(sb, (label, ok) => {
        if (label === "Kill" && ok) { // deleted: 204 means gone, ask nothing more of it
          alive = false;
          clearTimeout(timer);
          location.hash = "#/sandboxes";
        } else {
          refresh();
        }
      })));
    timer = setTimeout(refresh, REFRESH_MS);
  };

  const tabs = h("nav", { class: "tabs" }, TABS.map((t) =>
    h("a", { href: `#/sandboxes/${encodeURIComponent(id)}/${t}`, class: t === tab ? "active" : null,
      dataset: { tab: t } }, t)));
  replace(view, h("p", {}, h("a", { href: "#/sandboxes" }, "← sandboxes")), header, tabs, body);
  await refresh();
  const page = { terminal, files, run, logs, metrics, events, endpoints }[tab] ?? terminal;
  try {
    const cleanup = await page(body, id);
    if (cleanup) cleanups.push(cleanup);
  } catch (err) {
    replace(body, h("p", { class: "error-text" }, err.message));
  }
  return () => {
    alive = false;
    clearTimeout(timer);
    for (const c of cleanups) c();
  };
}

// ---- terminal ----

async function terminal(body, id) {
  const screen = h("pre", { id: "terminal", "aria-label": "terminal" });
  const status = h("span", { class: "muted", id: "terminal-status" }, "connecting…");
  replace(body, h("div", { class: "toolbar" }, status), screen,
    h("p", { class: "muted" }, "Click the terminal and type. The shell lives in the sandbox's PTY."));
  const cols = 100;
  const rows = 30;
  const { session_id: session } = await post(agentPath(id, "/pty"), { cols, rows });
  const encoder = new TextEncoder();
  let ws = null;
  const term = new Terminal(screen, { cols, rows, onData: (text) => {
    if (ws?.readyState !== WebSocket.OPEN) return;
    const data = encoder.encode(text);
    const frame = new Uint8Array(data.length + 1);
    frame.set(data, 1); // channel 0: stdin
    ws.send(frame);
  } });
  ws = new WebSocket(await agentSocketUrl(id, `/pty/${session}/ws`));
  ws.binaryType = "arraybuffer";
  const ping = setInterval(() => {
    if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: "ping" }));
  }, 20000);
  ws.addEventListener("message", (e) => {
    if (typeof e.data === "string") {
      const m = JSON.parse(e.data);
      if (m.type === "connected") {
        status.textContent = `connected (${m.mode})`;
        ws.send(JSON.stringify({ type: "resize", cols, rows }));
      } else if (m.type === "exit") {
        status.textContent = `the shell exited (${m.exit_code})`;
      } else if (m.type === "error") {
        status.textContent = `error: ${m.error}`;
      }
      return;
    }
    const bytesIn = new Uint8Array(e.data);
    if (bytesIn[0] === 1 || bytesIn[0] === 2) term.write(bytesIn.subarray(1));
    else if (bytesIn[0] === 3) term.write(bytesIn.subarray(9)); // replay: after the offset
  });
  ws.addEventListener("close", () => {
    if (!status.textContent.startsWith("the shell")) status.textContent = "disconnected";
  });
  screen.focus();
  return () => {
    clearInterval(ping);
    ws.close();
    del(agentPath(id, `/pty/${session}`)).catch(() => {});
  };
}

// ---- files ----

async function files(body, id) {
  const dir = h("input", { id: "files-path", value: "/root", size: 40 });
  const list = h("tbody", { id: "files-rows" });
  const upload = h("input", { type: "file", id: "files-upload", multiple: true });
  const join = (a, b) => `${a.replace(/\/+$/, "")}/${b}`;

  const show = async () => {
    const q = new URLSearchParams({ path: dir.value, depth: "1" });
    let entries;
    try {
      entries = await get(agentPath(id, `/directories/list?${q}`));
    } catch (err) {
      replace(list, h("tr", {}, h("td", { colspan: 5, class: "error-text" }, err.message)));
      return;
    }
    const parent = dir.value.replace(/\/[^/]*\/?$/, "") || "/";
    replace(list, dir.value !== "/" ? h("tr", {}, h("td", {}, h("a", { href: "#", onclick: (e) => {
      e.preventDefault(); dir.value = parent; show();
    } }, "..")), h("td", {}), h("td", {}), h("td", {}), h("td", {})) : null,
    entries.map((f) => {
      const name = f.path.split("/").pop();
      const isDir = f.type === "directory";
      return h("tr", { dataset: { name, type: f.type } },
        h("td", {}, isDir ? h("a", { href: "#", onclick: (e) => {
          e.preventDefault(); dir.value = f.path; show();
        } }, `${name}/`) : name),
        h("td", {}, f.type), h("td", {}, isDir ? "" : bytes(f.size)), h("td", {}, `${f.mode} ${f.owner}`),
        h("td", {}, isDir ? "" : h("button", { type: "button", dataset: { action: "download" },
          onclick: () => download(id, f.path, name) }, "Download")));
    }));
  };

  upload.addEventListener("change", async () => {
    const form = new FormData();
    for (const f of upload.files) {
      form.append("metadata", new Blob([JSON.stringify({ path: join(dir.value, f.name), mode: 644 })],
        { type: "application/json" }), "metadata");
      form.append("file", f, f.name);
    }
    try {
      await request("POST", agentPath(id, "/files/upload"), { body: form });
      notify(`uploaded ${[...upload.files].map((f) => f.name).join(", ")}`, "info");
    } catch (err) {
      notify(`upload: ${err.message}`);
    }
    upload.value = "";
    show();
  });
  dir.addEventListener("change", show);
  replace(body, h("div", { class: "toolbar" }, "Directory", dir,
    h("button", { type: "button", onclick: show }, "List"), h("label", {}, "Upload ", upload)),
  h("table", {}, h("thead", {}, h("tr", {}, ["name", "type", "size", "mode", ""].map((x) => h("th", {}, x)))), list));
  await show();
}

async function download(id, path, name) {
  try {
    const res = await request("GET", agentPath(id, `/files/download?${new URLSearchParams({ path })}`), { raw: true });
    const url = URL.createObjectURL(await res.blob());
    const a = h("a", { href: url, download: name });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  } catch (err) {
    notify(`download: ${err.message}`);
  }
}

// ---- command and code runs ----

function outputLine(out, cls, text) {
  out.append(h("span", { class: cls }, `${text}\n`));
}

function showError(out, e) {
  outputLine(out, "stderr", `${e.error?.ename ?? "error"}: ${e.error?.evalue ?? ""}`);
  for (const t of e.error?.traceback ?? []) outputLine(out, "stderr", t.replace(/\x1b\[[0-9;]*m/g, ""));
}

/** A result's data by MIME type: images as <img> (data: URLs), text as text, never as HTML. */
function showResult(results, r) {
  for (const [mime, data] of Object.entries(r || {})) {
    if (mime === "image/png" || mime === "image/jpeg" || mime === "image/gif") {
      results.append(h("img", { src: `data:${mime};base64,${data}`, alt: "result image", class: "result-image" }));
    } else if (mime === "image/svg+xml") {
      results.append(h("img", { src: `data:image/svg+xml;charset=utf-8,${encodeURIComponent(data)}`,
        alt: "result image", class: "result-image" }));
    } else if (mime === "text" || mime === "text/plain") {
      results.append(h("pre", { class: "output result-text" }, data));
    }
  }
}

async function run(body, id) {
  const command = h("textarea", { id: "command-input", placeholder: "a shell command" });
  const commandOut = h("pre", { class: "output", id: "command-output" });
  const code = h("textarea", { id: "code-input", placeholder: "code" });
  const language = h("select", { id: "code-language" }, ["python", "bash", "javascript", "typescript", "java", "go"]
    .map((l) => h("option", { value: l }, l)));
  const codeOut = h("pre", { class: "output", id: "code-output" });
  const results = h("div", { class: "results", id: "code-results" });
  const busy = (button, fn) => async () => {
    button.disabled = true;
    try { await fn(); } catch (err) { notify(err.message); }
    button.disabled = false;
  };
  const background = h("input", { type: "checkbox", id: "command-background" });
  const runCommand = h("button", { type: "button", class: "primary", id: "command-run" }, "Run command");
  runCommand.addEventListener("click", busy(runCommand, async () => {
    commandOut.replaceChildren();
    const request = { command: command.value, background: background.checked };
    await stream(agentPath(id, "/command"), request, (e) => {
      if (e.type === "init" && request.background) outputLine(commandOut, "muted", `[started ${e.text}: its output is under logs]`);
      if (e.type === "stdout" || e.type === "stderr") outputLine(commandOut, e.type, e.text);
      else if (e.type === "error") showError(commandOut, e);
      else if (e.type === "execution_complete") outputLine(commandOut, "muted", `[done in ${e.execution_time} ms]`);
    });
  }));
  const runCode = h("button", { type: "button", class: "primary", id: "code-run" }, "Run code");
  runCode.addEventListener("click", busy(runCode, async () => {
    codeOut.replaceChildren();
    results.replaceChildren();
    await stream(agentPath(id, "/code"), { code: code.value, context: { language: language.value } }, (e) => {
      if (e.type === "stdout" || e.type === "stderr") outputLine(codeOut, e.type, e.text);
      else if (e.type === "error") showError(codeOut, e);
      else if (e.type === "result") showResult(results, e.results);
      else if (e.type === "execution_complete") outputLine(codeOut, "muted", `[done in ${e.execution_time} ms]`);
    });
  }));
  replace(body, h("div", { class: "card" }, h("h2", {}, "Command"), command, h("div", { class: "toolbar" }, runCommand,
    h("label", {}, background, " in the background")), commandOut),
    h("div", { class: "card" }, h("h2", {}, "Code"), code, h("div", { class: "toolbar" }, language, runCode), codeOut, results));
}

// ---- logs ----

async function logs(body, id) {
  const which = h("input", { id: "logs-command", value: "entrypoint", size: 36 });
  const out = h("pre", { class: "output", id: "logs-output" });
  let cursor = 0;
  let timer = null;
  let alive = true;
  const poll = async () => {
    clearTimeout(timer);
    try {
      const res = await request("GET", agentPath(id, `/command/${encodeURIComponent(which.value)}/logs?cursor=${cursor}`), { raw: true });
      const text = await res.text();
      if (!alive) return;
      if (text) out.append(text);
      cursor = Number(res.headers.get("EXECD-COMMANDS-TAIL-CURSOR") ?? cursor + text.length);
    } catch (err) {
      if (!alive) return;
      replace(out, h("span", { class: "stderr" }, err.message));
    }
    if (alive) timer = setTimeout(poll, REFRESH_MS);
  };
  which.addEventListener("change", () => { cursor = 0; out.replaceChildren(); poll(); });
  replace(body, h("div", { class: "toolbar" }, "Output of the background command", which,
    h("span", { class: "muted" }, "(entrypoint: the sandbox's main process)")), out);
  await poll();
  return () => { alive = false; clearTimeout(timer); };
}

// ---- metrics ----

async function metrics(body, id) {
  const canvas = h("canvas", { class: "chart", id: "metrics-chart" });
  const now = h("span", { id: "metrics-now" });
  replace(body, h("div", { class: "legend" }, h("span", { class: "cpu" }, "— CPU % of its limit"),
    h("span", { class: "mem" }, "— memory MiB"), now), canvas);
  const chart = new MetricsChart(canvas);
  const abort = new AbortController();
  const add = (m) => {
    chart.add(m);
    now.textContent = `now: ${m.cpu_used_pct?.toFixed(1)}% of ${m.cpu_count} CPU, ` +
      `${m.mem_used_mib?.toFixed(1)} of ${m.mem_total_mib?.toFixed(0)} MiB`;
  };
  add(await get(agentPath(id, "/metrics")));
  stream(agentPath(id, "/metrics/watch"), undefined, add, { method: "GET", signal: abort.signal })
    .catch((err) => { if (!abort.signal.aborted) now.textContent = `stream ended: ${err.message}`; });
  return () => abort.abort();
}

// ---- audit trail and egress decisions ----

async function events(body, id) {
  const trail = h("div", { id: "events-trail" });
  const egress = h("div", { id: "events-egress" });
  replace(body, h("h2", {}, "Audit trail"), trail, h("h2", {}, "Egress decisions"), egress);
  const base = `/v1/sandboxes/${encodeURIComponent(id)}`;
  await renderTrail(trail, `${base}/events`);
  try {
    const { events: items = [] } = await get(`${base}/egress/events`);
    replace(egress, items.length ? eventsTable(items, ["time", "action", "protocol", "name", "address", "port", "rule"])
      : h("p", { class: "muted" }, "no egress decisions"));
  } catch (err) {
    replace(egress, h("p", { class: "muted" }, err.message));
  }
}

// ---- endpoints ----

const LOOPBACK = /^(localhost|127\.\d+\.\d+\.\d+|\[::1\])$/;

/**
 * Where to open a port in a browser: the signed host form, which is another origin than the
 * console's (an app there cannot read this tab's storage), when the browser can reach it (a
 * --domain, or *.localhost from this machine); else the signed path form on this host.
 */
async function openUrl(base) {
  const expires = Math.floor(Date.now() / 1000) + 3600;
  const byHost = await get(`${base}?expires=${expires}&host=true`);
  const host = byHost.endpoint.split("/")[0];
  const local = /\.localhost(:\d+)?$/.test(host);
  if (!local || LOOPBACK.test(location.hostname)) return `${location.protocol}//${host}/`;
  const byPath = await get(`${base}?expires=${expires}`);
  return `${location.protocol}//${location.host}${byPath.endpoint.slice(byPath.endpoint.indexOf("/"))}/`;
}

async function endpoints(body, id) {
  const port = h("input", { id: "endpoint-port", type: "number", min: 1, max: 65535, value: 8000 });
  const out = h("div", { id: "endpoint-result" });
  const show = async () => {
    const base = `/v1/sandboxes/${encodeURIComponent(id)}/endpoints/${Number(port.value)}`;
    try {
      const [plain, url] = await Promise.all([get(base), openUrl(base)]);
      replace(out, h("dl", { class: "kv" },
        h("dt", {}, "signed route (1 h)"), h("dd", {}, h("a", { href: url, target: "_blank",
          rel: "noopener noreferrer", id: "endpoint-open" }, url)),
        h("dt", {}, "endpoint"), h("dd", {}, plain.endpoint),
        h("dt", {}, "headers"), h("dd", {}, Object.entries(plain.headers || {}).map(([k, v]) => `${k}: ${v}`).join("\n"))));
    } catch (err) {
      replace(out, h("p", { class: "error-text" }, err.message));
    }
  };
  replace(body, h("div", { class: "toolbar" }, "Port", port, h("button", { type: "button", onclick: show }, "Get endpoint"),
    h("span", { class: "muted" }, `(${AGENT_PORT} is the agent)`)), out);
  await show();
}
