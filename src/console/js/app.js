// The console's shell: log in (the key goes to sessionStorage), then hash routes to pages.
//   #/sandboxes  #/sandboxes/{id}[/{tab}]  #/events  #/templates  #/pools  #/host
import { apiKey, get, setApiKey } from "./api.js";
import { clearNotice, h, notify, replace } from "./dom.js";
import { renderEvents } from "./pages/events.js";
import { renderHost, renderPools, renderTemplates } from "./pages/host.js";
import { renderSandbox } from "./pages/sandbox.js";
import { renderSandboxes } from "./pages/sandboxes.js";

const view = document.getElementById("view");
const nav = document.getElementById("nav");
let leave = null; // the current page's cleanup (sockets, streams, timers)

function renderLogin(message) {
  nav.hidden = true;
  const input = h("input", { type: "password", id: "api-key", name: "api-key",
    autocomplete: "off", placeholder: "OPEN-SANDBOX-API-KEY", required: true });
  const form = h("form", { class: "card login", id: "login" },
    h("h1", {}, "Cove console"),
    h("p", { class: "muted" }, "Paste an API key. It stays in this tab only (sessionStorage) and " +
      "is sent as a header with every API call; the console sees what this key may see."),
    h("label", { for: "api-key" }, "API key"), input,
    message ? h("p", { class: "error-text" }, message) : null,
    h("button", { type: "submit", class: "primary" }, "Log in"));
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    setApiKey(input.value.trim());
    try {
      await get("/v1/quota"); // any key may ask: proves the key
      if (!location.hash || location.hash === "#/login") location.hash = "#/sandboxes";
      else route();
    } catch (err) {
      setApiKey(null);
      renderLogin(err.status === 401 ? "That key was refused." : err.message);
    }
  });
  replace(view, form);
  input.focus();
}

async function route() {
  if (leave) {
    try { leave(); } catch { /* a page's cleanup never stops the next page */ }
    leave = null;
  }
  clearNotice();
  if (!apiKey()) return renderLogin();
  nav.hidden = false;
  const parts = (location.hash.replace(/^#\/?/, "") || "sandboxes").split("/").map(decodeURIComponent);
  for (const a of nav.querySelectorAll("a"))
    a.classList.toggle("active", a.getAttribute("href") === `#/${parts[0]}`);
  const pages = {
    sandboxes: () => (parts[1] ? renderSandbox(view, parts[1], parts[2] || "terminal")
      : renderSandboxes(view)),
    events: () => renderEvents(view),
    templates: () => renderTemplates(view),
    pools: () => renderPools(view),
    host: () => renderHost(view),
  };
  const page = pages[parts[0]];
  if (!page) {
    replace(view, h("h1", {}, "Not found"), h("p", {}, h("a", { href: "#/sandboxes" }, "Sandboxes")));
    return;
  }
  try {
    leave = (await page()) ?? null;
  } catch (err) {
    if (err.status === 401) {
      setApiKey(null);
      return renderLogin("The key was refused; log in again.");
    }
    notify(err.message);
  }
}

document.getElementById("logout").addEventListener("click", () => {
  setApiKey(null);
  location.hash = "#/login";
  route();
});
window.addEventListener("hashchange", route);
route();
