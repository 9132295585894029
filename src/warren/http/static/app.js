// Warren management UI: hash routing, login, polling, the page modules.
import { currentTags, currentUser, expiresAt, login, loggedIn, loginWithToken, logout, tokenLogin } from "./api.js";
import { h, replace } from "./dom.js";
import * as oauth from "./oauth.js";
import * as admin from "./pages/admin.js";
import { cluster } from "./pages/cluster.js";
import * as conns from "./pages/connections.js";
import * as exchanges from "./pages/exchanges.js";
import * as federation from "./pages/federation.js";
import { overview, startSampler, stopSampler } from "./pages/overview.js";
import * as queues from "./pages/queues.js";
import { shovels } from "./pages/shovels.js";

// [pattern segments, page]; ":x" captures a (decoded) segment.
const ROUTES = [
  [[], overview],
  [["connections"], conns.connectionList],
  [["connections", ":name"], conns.connectionDetail],
  [["channels"], conns.channelList],
  [["channels", ":name"], conns.channelDetail],
  [["exchanges"], exchanges.exchangeList],
  [["exchanges", ":vhost", ":name"], exchanges.exchangeDetail],
  [["queues"], queues.queueList],
  [["queues", ":vhost", ":name"], queues.queueDetail],
  [["users"], admin.users],
  [["vhosts"], admin.vhosts],
  [["permissions"], admin.permissions],
  [["policies"], admin.policies],
  [["definitions"], admin.definitions],
  [["shovels"], shovels],
  [["federation"], federation.federationStatus],
  [["federation", "upstreams"], federation.upstreams],
  [["cluster"], cluster],
];

const main = document.getElementById("main");
const flashBox = document.getElementById("flash");
let generation = 0;
let pendingFlash = null; // shown by the next page (an action that navigates away)
let expiryTimer = null; // an access token's end: back to the login

/** A message under the header: kind "ok" or "error". */
export function flash(text, kind = "ok") {
  replace(flashBox, h("p", { class: `flash ${kind}` }, text));
  flashBox.dataset.kind = kind;
}

function clearFlash() {
  replace(flashBox);
  delete flashBox.dataset.kind;
}

function parseHash() {
  const raw = location.hash.replace(/^#\/?/, "");
  if (raw === "") return [];
  // "exchanges/%2F/" keeps its empty last segment: the default exchange.
  return raw.split("/").map((p) => decodeURIComponent(p));
}

function match(parts) {
  for (const [pattern, page] of ROUTES) {
    if (pattern.length !== parts.length) continue;
    const params = {};
    let ok = true;
    pattern.forEach((p, i) => {
      if (p.startsWith(":")) params[p.slice(1)] = parts[i];
      else if (p !== parts[i]) ok = false;
    });
    if (ok) return [page, params];
  }
  return [null, null];
}

// Pages RabbitMQ keeps to some tags; their links are hidden from other users
// (the pages themselves would only show the API's refusal).
const NAV_TAGS = {
  "#/users": ["administrator"],
  "#/permissions": ["administrator"],
  "#/definitions": ["administrator"],
  "#/policies": ["administrator", "policymaker"],
  // Status lists are for monitoring users, definitions for policymakers.
  "#/shovels": ["administrator", "monitoring", "policymaker"],
  "#/federation": ["administrator", "monitoring", "policymaker"],
  "#/cluster": ["administrator", "monitoring"],
};

function setNav(parts) {
  const here = `#/${parts[0] || ""}`;
  const tags = currentTags();
  for (const a of document.querySelectorAll("#nav a")) {
    const href = a.getAttribute("href");
    a.classList.toggle("active", href === here);
    const needs = NAV_TAGS[href];
    a.hidden = Boolean(needs) && !needs.some((t) => tags.includes(t));
  }
}

/** The login page: the provider's button ([mgmt] oauth_enabled), the password form, or both. */
function showLogin(message) {
  generation += 1;
  clearTimeout(expiryTimer);
  stopSampler();
  document.getElementById("nav").hidden = true;
  document.getElementById("session").hidden = true;
  const error = h("p", { class: "error", role: "alert" }, message || "");
  clearFlash();
  if (!oauth.basicAllowed()) {
    const button = oauthButton(error);
    replace(main, h("div", { class: "login", id: "oauth-login" }, h("h1", null, "Log in"), button, error));
    button.focus();
    return;
  }
  const user = h("input", { name: "username", autocomplete: "username", required: true });
  const password = h("input", { name: "password", type: "password", autocomplete: "current-password" });
  const form = h(
    "form",
    { class: "login", id: "login-form" },
    h("h1", null, "Log in"),
    oauth.oauthEnabled() ? h("p", null, oauthButton(error)) : null,
    h("label", { class: "field" }, h("span", null, "Username"), user),
    h("label", { class: "field" }, h("span", null, "Password"), password),
    h("button", { type: "submit" }, "Log in"),
    error,
  );
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      await login(user.value, password.value);
      route();
    } catch (e) {
      replace(error, e.message);
    }
  });
  replace(main, form);
  user.focus();
}

function oauthButton(error) {
  const button = h("button", { type: "button", id: "oauth-login-button" }, "Log in with the OAuth 2 provider");
  button.addEventListener("click", async () => {
    try {
      await oauth.startLogin();
    } catch (e) {
      replace(error, e.message);
    }
  });
  return button;
}

/** With an access token: the login page when it expires (by this browser's clock). */
function watchExpiry() {
  clearTimeout(expiryTimer);
  const at = expiresAt();
  if (at === null) return;
  const wait = Math.min(Math.max(at - Date.now(), 0), 2 ** 31 - 1);
  expiryTimer = setTimeout(() => {
    logout();
    showLogin("Your session has expired: please log in again.");
  }, wait);
}

/** Context handed to a page: its params, the main element, polling and errors. */
function context(gen, params) {
  const ctx = {
    params,
    alive: () => gen === generation,
    flash,
    /** Navigates; message (optional) is flashed on the page navigated to. */
    go: (hash, message) => {
      pendingFlash = message ? [message, "ok"] : null;
      if (location.hash === hash) route();
      else location.hash = hash;
    },
    /**
     * Calls fn now and every ms milliseconds while this page is shown. The first
     * call's error is the page's (a 404 shows "Not found"); a later one is
     * flashed, and a 404 then (the object went away) stops the polling.
     */
    async poll(fn, ms = 5000) {
      const again = () =>
        setTimeout(async () => {
          if (!ctx.alive()) return;
          try {
            await fn();
          } catch (e) {
            ctx.fail(e);
            if (e.status === 404) return;
          }
          if (ctx.alive()) again();
        }, ms);
      await fn();
      again();
    },
    fail(e) {
      if (e.status === 401) return;
      flash(e.message || String(e), "error");
    },
    /** Wraps an action: runs it, reports its error, returns its result. */
    async act(fn, ok) {
      try {
        const r = await fn();
        if (ok) flash(typeof ok === "function" ? ok(r) : ok, "ok");
        return r;
      } catch (e) {
        ctx.fail(e);
        return undefined;
      }
    },
  };
  return ctx;
}

async function route() {
  if (!loggedIn()) {
    showLogin();
    return;
  }
  generation += 1;
  const gen = generation;
  watchExpiry();
  startSampler();
  document.getElementById("nav").hidden = false;
  document.getElementById("session").hidden = false;
  replace(document.getElementById("whoami"), currentUser());
  const parts = parseHash();
  setNav(parts);
  if (pendingFlash) flash(...pendingFlash);
  else clearFlash();
  pendingFlash = null;
  const [page, params] = match(parts);
  if (!page) {
    replace(main, h("h1", null, "Not found"), h("p", null, h("a", { href: "#/" }, "Back to the overview")));
    return;
  }
  const ctx = context(gen, params);
  try {
    const node = await page(ctx);
    if (ctx.alive() && node) replace(main, node);
  } catch (e) {
    if (!ctx.alive()) return;
    if (e.status === 401) return; // the login form is already shown
    replace(main, h("h1", null, e.status === 404 ? "Not found" : "Error"), h("p", { class: "error" }, e.message));
  }
}

window.addEventListener("hashchange", route);
window.addEventListener("warren:unauthorized", () => showLogin("Your session has ended: please log in again."));
document.getElementById("logout").addEventListener("click", async () => {
  const token = tokenLogin();
  logout();
  // Logged in through the provider: its logout too, when it has one (it comes back here).
  const url = token ? await oauth.logoutUrl() : null;
  if (url) {
    location.assign(url);
    return;
  }
  location.hash = "#/";
  showLogin();
});

/** The login settings first; a return from the provider's login completes it. */
async function start() {
  await oauth.loadSettings();
  try {
    const done = await oauth.completeLogin();
    if (done) await loginWithToken(done.token, done.expiresAt);
  } catch (e) {
    showLogin(e.message);
    return;
  }
  route();
}

start();
