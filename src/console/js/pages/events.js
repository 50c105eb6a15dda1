// The audit trail: GET /v1/sandboxes/{id}/events (one sandbox) and GET /v1/events (every
// sandbox of the key), paged by nextCursor. A coved without the trail answers 404 on those
// routes: the page says so instead of failing.
import { get } from "../api.js";
import { h, replace } from "../dom.js";

const LEADING = ["time", "kind", "sandboxId", "owner"];

export function eventsTable(items, columns) {
  return h("table", {}, h("thead", {}, h("tr", {}, columns.map((c) => h("th", {}, c)))),
    h("tbody", {}, items.map((e) => h("tr", { dataset: { kind: e.kind ?? e.action ?? "" } }, columns.map((c) => {
      const v = e[c];
      return h("td", {}, v === undefined || v === null ? "" : typeof v === "object" ? JSON.stringify(v) : String(v));
    })))));
}

/** Fills el with the trail at path (".../events"), "More" fetching the next page. */
export async function renderTrail(el, path, { withSandbox = false } = {}) {
  const page = async (cursor) => {
    let answer;
    try {
      answer = await get(`${path}${cursor ? `?cursor=${encodeURIComponent(cursor)}` : ""}`);
    } catch (err) {
      if (err.status === 404 && err.code !== "SANDBOX::NOT_FOUND") {
        replace(el, h("p", { class: "muted", id: "events-unavailable" }, "The audit trail is not available on this coved."));
        return;
      }
      throw err;
    }
    const items = answer?.items ?? [];
    const lead = LEADING.filter((k) => withSandbox || k !== "sandboxId");
    const columns = [...lead, ...new Set(items.flatMap((e) => Object.keys(e))
      .filter((k) => k !== "id" && !LEADING.includes(k)))];
    if (!cursor) el.replaceChildren();
    el.append(items.length ? eventsTable(items, columns) : h("p", { class: "muted" }, cursor ? "" : "no events"));
    if (answer?.nextCursor) {
      const more = h("button", { type: "button", id: "events-more", onclick: () => { more.remove(); page(answer.nextCursor); } }, "More");
      el.append(more);
    }
  };
  await page(null);
}

export async function renderEvents(view) {
  const trail = h("div", { id: "events-trail" }, h("p", { class: "muted" }, "Loading…"));
  replace(view, h("h1", {}, "Events"), h("p", { class: "muted" }, "What every sandbox of this key did, newest first."), trail);
  await renderTrail(trail, "/v1/events", { withSandbox: true });
}
