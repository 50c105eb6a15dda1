// A small element builder, so that no page writes HTML as strings (no injection, and the
// Content-Security-Policy allows no inline code anyway).

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs ?? {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k === "value") el.value = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

let noticeTimer;
/** Shows a message at the top of the page (an error unless kind is "info"). */
export function notify(message, kind = "error") {
  const n = document.getElementById("notice");
  n.textContent = message;
  n.className = kind === "info" ? "info" : "";
  n.hidden = false;
  clearTimeout(noticeTimer);
  noticeTimer = setTimeout(() => { n.hidden = true; }, 8000);
}

export function clearNotice() {
  document.getElementById("notice").hidden = true;
}

/** "3m", "2h 5m": how long ago an RFC 3339 time was, or until it, in words. */
export function span(ms) {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

export function age(time) {
  return time ? span(Date.now() - Date.parse(time)) : "";
}

export function until(time) {
  if (!time) return "never";
  const ms = Date.parse(time) - Date.now();
  return ms > 0 ? `in ${span(ms)}` : "expired";
}

export function bytes(n) {
  if (n === undefined || n === null) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = Number(n);
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${i ? v.toFixed(1) : v} ${units[i]}`;
}
