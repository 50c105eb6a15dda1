// The key's sandboxes: state, template, age, expiry, limits; filters by state and metadata;
// create, pause, resume, renew, kill.
import { del, get, post } from "../api.js";
import { age, h, notify, replace, until } from "../dom.js";

const STATES = ["", "Pending", "Running", "Pausing", "Paused", "Resuming", "Stopping", "Failed", "Terminated"];
const REFRESH_MS = 3000;

/** The buttons for what sb's state allows; done(label, ok) after each action. */
export function actions(sb, done) {
  const id = sb.id;
  const state = sb.status?.state;
  const act = (label, fn, cls) => h("button", { type: "button", class: cls, dataset: { action: label.toLowerCase() },
    onclick: async (e) => {
      e.target.disabled = true;
      let ok = false;
      try { await fn(); ok = true; } catch (err) { notify(`${label} ${id}: ${err.message}`); }
      e.target.disabled = false;
      done(label, ok);
    } }, label);
  const path = `/v1/sandboxes/${encodeURIComponent(id)}`;
  return [
    state === "Running" ? act("Pause", () => post(`${path}/pause`)) : null,
    state === "Paused" ? act("Resume", () => post(`${path}/resume`)) : null,
    sb.expiresAt && (state === "Running" || state === "Paused") ? act("Renew", () => {
      const minutes = Number(prompt("New expiry, in minutes from now:", "60"));
      if (!minutes) return null;
      return post(`${path}/renew-expiration`, { expiresAt: new Date(Date.now() + minutes * 60000).toISOString() });
    }) : null,
    state !== "Stopping" && state !== "Terminated" ? act("Kill", () => del(path), "danger") : null,
  ];
}

function limits(sb) {
  const l = sb.resourceLimits || {};
  return [l.cpu ? `cpu ${l.cpu}` : "cpu all", l.memory ? `mem ${l.memory}` : ""].filter(Boolean).join(" · ");
}

function createForm(templates, onCreated) {
  const template = h("select", { name: "template", id: "create-template" },
    templates.map((t) => h("option", { value: t.name }, t.name)));
  const timeout = h("input", { name: "timeout", type: "number", min: 60, value: 3600, size: 6,
    title: "seconds; empty: never expires" });
  const cpu = h("input", { name: "cpu", placeholder: "cpu (500m)", size: 8 });
  const memory = h("input", { name: "memory", placeholder: "memory (512Mi)", size: 10 });
  const metadata = h("input", { name: "metadata", placeholder: "metadata k=v,k2=v2", size: 18 });
  const form = h("form", { class: "inline card", id: "create-form" }, h("strong", {}, "New sandbox"),
    template, h("label", {}, "timeout ", timeout), cpu, memory, metadata,
    h("button", { type: "submit", class: "primary", id: "create-submit" }, "Create"));
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const body = { image: { uri: template.value }, entrypoint: ["sleep", "infinity"],
      timeout: timeout.value ? Number(timeout.value) : null, resourceLimits: {} };
    if (cpu.value) body.resourceLimits.cpu = cpu.value.trim();
    if (memory.value) body.resourceLimits.memory = memory.value.trim();
    if (metadata.value.trim()) {
      body.metadata = Object.fromEntries(metadata.value.split(",").map((kv) => kv.trim().split("=")));
    }
    const button = form.querySelector("button");
    button.disabled = true;
    try {
      const sb = await post("/v1/sandboxes", body);
      notify(`created ${sb.id}`, "info");
      onCreated(sb);
    } catch (err) {
      notify(`create: ${err.message}`);
    }
    button.disabled = false;
  });
  return form;
}

export async function renderSandboxes(view) {
  const stateFilter = h("select", { id: "filter-state" }, STATES.map((s) => h("option", { value: s }, s || "any state")));
  const metaFilter = h("input", { id: "filter-metadata", placeholder: "metadata k=v&k2=v2", size: 20 });
  const body = h("tbody", { id: "sandbox-rows" });
  const status = h("span", { class: "muted" });
  let timer = null;
  let alive = true;

  const refresh = async () => {
    clearTimeout(timer);
    const q = new URLSearchParams({ pageSize: "200" });
    if (stateFilter.value) q.append("state", stateFilter.value);
    if (metaFilter.value.trim()) q.append("metadata", metaFilter.value.trim());
    try {
      const { items, pagination } = await get(`/v1/sandboxes?${q}`);
      if (!alive) return;
      const rows = items.map((sb) => h("tr", { dataset: { id: sb.id, state: sb.status?.state } },
        h("td", {}, h("a", { href: `#/sandboxes/${encodeURIComponent(sb.id)}` }, sb.id)),
        h("td", {}, h("span", { class: `state state-${sb.status?.state}` }, sb.status?.state),
          h("div", { class: "muted" }, sb.status?.reason || "")),
        h("td", {}, sb.image?.uri || sb.snapshotId || ""),
        h("td", {}, age(sb.createdAt)),
        h("td", { title: sb.expiresAt || "" }, until(sb.expiresAt)),
        h("td", {}, limits(sb)),
        h("td", {}, Object.entries(sb.metadata || {}).map(([k, v]) => `${k}=${v}`).join(" ")),
        h("td", { class: "actions" }, actions(sb, refresh))));
      replace(body, rows.length ? rows : h("tr", {}, h("td", { colspan: 8, class: "muted" }, "no sandboxes")));
      status.textContent = `${pagination?.totalItems ?? items.length} sandbox(es)`;
      body.dataset.generation = String(Number(body.dataset.generation ?? 0) + 1); // for tests
    } catch (err) {
      if (!alive) return;
      notify(err.message);
    }
    if (alive) timer = setTimeout(refresh, REFRESH_MS);
  };

  const { items: templates } = await get("/v1/templates");
  stateFilter.addEventListener("change", refresh);
  metaFilter.addEventListener("change", refresh);
  replace(view, h("h1", {}, "Sandboxes"),
    createForm(templates, (sb) => { location.hash = `#/sandboxes/${encodeURIComponent(sb.id)}`; }),
    h("div", { class: "toolbar" }, "Filter:", stateFilter, metaFilter,
      h("button", { type: "button", id: "list-refresh", onclick: refresh }, "Refresh"), status),
    h("table", {}, h("thead", {}, h("tr", {}, ["id", "state", "template", "age", "expires", "limits", "metadata", ""]
      .map((x) => h("th", {}, x)))), body));
  await refresh();
  return () => { alive = false; clearTimeout(timer); };
}
