// Templates, pools (admin keys only) and the host's totals (the key's quota and use; with an
// admin key every owner's).
import { get } from "../api.js";
import { h, replace } from "../dom.js";

function table(headers, rows) {
  return h("table", {}, h("thead", {}, h("tr", {}, headers.map((x) => h("th", {}, x)))),
    h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: headers.length, class: "muted" }, "none"))));
}

const fmt = (v) => (v === null || v === undefined ? "unlimited" : String(v));

export async function renderTemplates(view) {
  replace(view, h("h1", {}, "Templates"), h("p", { class: "muted" }, "Loading…"));
  const { items } = await get("/v1/templates");
  replace(view, h("h1", {}, "Templates"), table(["name", "kind", "runtime", "prestart", "aliases"],
    items.map((t) => h("tr", { dataset: { template: t.name } }, h("td", {}, t.name),
      h("td", {}, t.hostOs ? "host OS" : (t.source || "root filesystem")),
      h("td", {}, t.runtime || "default"), h("td", {}, t.prestart || ""),
      h("td", {}, (t.aliases || []).join(", "))))));
}

export async function renderPools(view) {
  replace(view, h("h1", {}, "Pools"), h("p", { class: "muted" }, "Loading…"));
  let items;
  try {
    ({ items } = await get("/v1/pools"));
  } catch (err) {
    if (err.status !== 403) throw err;
    replace(view, h("h1", {}, "Pools"), h("p", { class: "card", id: "pools-forbidden" },
      "Warm pools are for admin keys only; this key is not one (", err.code, ")."));
    return;
  }
  replace(view, h("h1", {}, "Pools"), h("div", { id: "pools-table" }, table(
    ["name", "template", "limits", "buffer min/max", "pool min/max", "total", "available", "pending", "last error"],
    items.map((p) => {
      const c = p.capacitySpec || {};
      const s = p.status || {};
      return h("tr", {}, h("td", {}, p.name), h("td", {}, p.template),
        h("td", {}, Object.entries(p.resourceLimits || {}).map(([k, v]) => `${k}=${v}`).join(" ")),
        h("td", {}, `${c.bufferMin ?? ""}/${c.bufferMax ?? ""}`), h("td", {}, `${c.poolMin ?? ""}/${c.poolMax ?? ""}`),
        h("td", {}, s.total ?? ""), h("td", {}, s.available ?? ""), h("td", {}, s.pending ?? ""),
        h("td", { class: "error-text" }, s.lastError || ""));
    }))));
}

function owner(o) {
  const row = (k) => h("tr", {}, h("td", {}, k), h("td", {}, fmt(o.used?.[k])), h("td", {}, fmt(o.limits?.[k])));
  return table(["resource", "used", "limit"], ["sandboxes", "cpu", "memory", "disk"].map(row));
}

export async function renderHost(view) {
  replace(view, h("h1", {}, "Host"), h("p", { class: "muted" }, "Loading…"));
  const [q, list] = await Promise.all([get("/v1/quota"), get("/v1/sandboxes?pageSize=1000")]);
  const byState = {};
  for (const sb of list.items || []) byState[sb.status?.state] = (byState[sb.status?.state] || 0) + 1;
  const parts = [h("h1", {}, "Host"), h("h2", {}, "This key"),
    h("p", { class: "muted" }, `owner ${q.owner || "(shared)"}`, q.admin ? " · admin key" : ""), owner(q),
    h("h2", {}, "This key's sandboxes by state"),
    table(["state", "sandboxes"], Object.entries(byState).map(([k, v]) => h("tr", {}, h("td", {}, k), h("td", {}, v))))];
  if (q.admin) {
    const all = await get("/v1/admin/quotas");
    const owners = all.items || [];
    const host = all.host || {};
    parts.push(h("h2", {}, "The host"), h("div", { id: "host-totals" }, table(["resource", "total", "overcommit", "limit", "used"],
      ["memory", "cpu"].filter((k) => host[k]).map((k) => h("tr", {}, h("td", {}, k), h("td", {}, host[k].total),
        h("td", {}, `${host[k].overcommit}x`), h("td", {}, host[k].limit), h("td", {}, host[k].used))))),
    h("p", {}, `live sandboxes on the host: ${host.sandboxes ?? "?"}`));
    parts.push(h("h2", {}, "Every owner"), table(["owner", "sandboxes", "cpu", "memory", "disk"],
      owners.map((o) => h("tr", {}, h("td", {}, o.owner || "(shared)"),
        ["sandboxes", "cpu", "memory", "disk"].map((k) =>
          h("td", {}, `${fmt(o.used?.[k])} / ${fmt(o.limits?.[k])}`))))));
  }
  replace(view, ...parts);
}
