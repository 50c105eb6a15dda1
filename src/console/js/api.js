// Every call the console makes goes through Cove's public API with the key the user pasted,
// sent in the OPEN-SANDBOX-API-KEY header (never a cookie: a cross-site form or script cannot
// make the browser send it, so there is nothing to forge). The key lives in sessionStorage:
// this tab only, gone when it closes.

const KEY_STORAGE = "cove.apiKey";
export const AGENT_PORT = 44772;

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export function apiKey() {
  return sessionStorage.getItem(KEY_STORAGE);
}

export function setApiKey(key) {
  if (key) sessionStorage.setItem(KEY_STORAGE, key);
  else sessionStorage.removeItem(KEY_STORAGE);
}

async function errorOf(res) {
  let code = `HTTP::${res.status}`;
  let message = `${res.status} ${res.statusText}`;
  try {
    const body = await res.json();
    if (body && typeof body.code === "string") code = body.code;
    if (body && typeof body.message === "string") message = body.message;
  } catch {
    // not JSON: keep the status line
  }
  return new ApiError(res.status, code, message);
}

/** fetch() with the key; throws ApiError for a status >= 400. */
export async function request(method, path, { body, headers = {}, raw = false, signal } = {}) {
  const h = { "OPEN-SANDBOX-API-KEY": apiKey() ?? "", ...headers };
  let payload = body;
  if (body !== undefined && !(body instanceof FormData) && !(body instanceof Blob)) {
    h["Content-Type"] = "application/json";
    payload = JSON.stringify(body);
  }
  const res = await fetch(path, { method, headers: h, body: payload, signal, credentials: "omit",
    cache: "no-store" });
  if (res.status >= 400) throw await errorOf(res);
  if (raw) return res;
  const text = await res.text();
  return text ? JSON.parse(text) : null;
}

export const get = (path, opts) => request("GET", path, opts);
export const post = (path, body, opts) => request("POST", path, { ...opts, body });
export const del = (path, opts) => request("DELETE", path, opts);

/** A path of the sandbox's agent (the execd API) through the gateway's path form. */
export function agentPath(id, path) {
  return `/sandboxes/${encodeURIComponent(id)}/proxy/${AGENT_PORT}${path}`;
}

/**
 * Reads an execd event stream (POST /command, /code): compact JSON objects separated by blank
 * lines, with or without "data:"; calls onEvent for each and resolves when the stream ends.
 */
export async function stream(path, body, onEvent, { signal, method = "POST" } = {}) {
  const res = await request(method, path, { body, raw: true, signal,
    headers: { Accept: "text/event-stream" } });
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffered = "";
  const flush = (chunk) => {
    for (let line of chunk.split("\n")) {
      line = line.trim();
      if (line.startsWith("data:")) line = line.slice(5).trim();
      if (!line) continue;
      try {
        onEvent(JSON.parse(line));
      } catch {
        // a partial or foreign line: skip it
      }
    }
  };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffered += decoder.decode(value, { stream: true });
    let at;
    while ((at = buffered.indexOf("\n\n")) >= 0) {
      flush(buffered.slice(0, at));
      buffered = buffered.slice(at + 2);
    }
  }
  flush(buffered + decoder.decode());
}

/**
 * A WebSocket URL for a path of the agent. A browser cannot put a header on a WebSocket, so
 * this asks the API (with the key) for a signed route to the agent's port, valid for a few
 * minutes, and uses its path on this page's own host.
 */
export async function agentSocketUrl(id, path, seconds = 300) {
  const expires = Math.floor(Date.now() / 1000) + seconds;
  const ep = await get(`/v1/sandboxes/${encodeURIComponent(id)}/endpoints/${AGENT_PORT}` +
    `?expires=${expires}`);
  const slash = ep.endpoint.indexOf("/");
  const route = slash >= 0 ? ep.endpoint.slice(slash) : "";
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  return `${scheme}//${location.host}${route}${path}`;
}
