// The dashboard's shell: one herald connection (the SDK, served from clients/js), navigation by
// URL hash, the login herald needs when authentication is on, a notice of why the connection
// last closed and what herald dropped, and the views, each started the first time it is shown
// and told when it is shown and hidden (a hidden view holds no subscription).

import { connect } from "./herald-client.js";
import { credentials, store, takeFromFragment } from "./api.js";
import { count } from "./format.js";
import * as overview from "./overview.js";
import * as topics from "./topics.js";
import * as live from "./live.js";
import * as images from "./images.js";
import * as latency from "./latency.js";

/** @typedef {{ init(client: import("./herald-client.js").HeraldClient): void, show?(): void, hide?(): void }} View */

/** @type {Record<string, View>} */
const views = { overview, topics, live, images, latency };
const started = new Set();
const $ = (/** @type {string} */ id) => /** @type {HTMLElement} */ (document.getElementById(id));

takeFromFragment();
const { token, adminKey } = credentials();
const wsUrl = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws`;
// The token goes in the first message rather than the URL, which proxies and logs may keep.
const client = connect(wsUrl, { maxDelayMs: 5000, token: token || undefined, tokenIn: "message" });
const pill = $("conn");
/** Whether the login form is up: the pill then says so rather than "open". */
let signInNeeded = false;

client.on("state", ({ state, code, reason }) => {
  if (!signInNeeded) {
    pill.dataset.state = state;
    pill.textContent = state;
  }
  if (state === "open") notice("notice-conn", "");
  if (code !== undefined) {
    const when = new Date().toLocaleTimeString();
    const what = state === "closed" ? "closed" : "disconnected, reconnecting";
    notice("notice-conn", `${when}: herald ${what}: ${code}${reason ? ` ${reason}` : ""}`);
  }
  if (state === "closed" && code === 4003) {
    showLogin("ws", token
      ? `herald refused the token (4003 ${reason || "unauthorized"}).`
      : `herald has authentication on: the WebSocket needs a token (4003 ${reason || "unauthorized"}).`);
  }
});
client.on("error", (e) => {
  if (e.code === "unauthorized") showLogin("ws", `herald refused the token: ${e.message}`);
});

/** What herald dropped for this page, by reason (drop, conflate, remote). @type {Map<string, number>} */
const drops = new Map();
client.on("dropped", (d) => {
  const reason = d.reason ?? "drop";
  drops.set(reason, (drops.get(reason) ?? 0) + d.count);
  const list = [...drops].map(([r, n]) => `${count(n)} (${r})`).join(", ");
  notice("notice-drops", `herald dropped for this page: ${list}. Live and Images count them per view.`);
});

/** @param {string} id @param {string} text */
function notice(id, text) {
  $(id).textContent = text;
  $("notice").hidden = !$("notice-conn").textContent && !$("notice-drops").textContent;
}

/** Why the login form is up, by what was refused: "api" (the admin API key) or "ws" (the
 * token). @type {Map<string, string>} */
const refusals = new Map();

/** @param {"api" | "ws"} what @param {string} message */
function showLogin(what, message) {
  signInNeeded = true;
  pill.dataset.state = "closed";
  pill.textContent = "sign in needed";
  refusals.set(what, message);
  $("login-error").textContent = [...refusals.values()].join("\n");
  if ($("login").hidden) {
    $("login").hidden = false;
    /** @type {HTMLInputElement} */ ($("login-token")).value = credentials().token;
    /** @type {HTMLInputElement} */ ($("login-key")).value = credentials().adminKey;
    $(credentials().token ? "login-key" : "login-token").focus();
  }
}
addEventListener("herald:auth", (/** @type {any} */ e) => showLogin("api", e.detail));

$("login-form").addEventListener("submit", (e) => {
  e.preventDefault();
  store({
    token: /** @type {HTMLInputElement} */ ($("login-token")).value.trim(),
    adminKey: /** @type {HTMLInputElement} */ ($("login-key")).value.trim(),
  });
  location.reload(); // a fresh connection with the new token
});
$("signout").hidden = !token && !adminKey;
$("signout").addEventListener("click", () => {
  store({ token: "", adminKey: "" });
  location.reload();
});

let current = "";
function route() {
  const name = location.hash.slice(1).split("?")[0] || "overview";
  const next = views[name] ? name : "overview";
  if (next === current) return;
  if (current) {
    $(current).hidden = true;
    views[current].hide?.();
  }
  current = next;
  $(next).hidden = false;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.getAttribute("href") === `#${next}`);
  if (!started.has(next)) {
    started.add(next);
    views[next].init(client);
  }
  views[next].show?.();
}
addEventListener("hashchange", route);
route();
// Other views can be asked to open with a topic (the topic explorer's "watch"): images in the
// Images view, anything else in Live.
addEventListener("herald:watch", (/** @type {any} */ e) => {
  const { pattern, image } = e.detail;
  (image ? images : live).watch(pattern);
  location.hash = image ? "images" : "live";
});
