// The dashboard's shell: one herald connection (the SDK, served from clients/js), navigation by
// URL hash, and the views, each started the first time it is shown.

import { connect } from "./herald-client.js";
import * as overview from "./overview.js";
import * as topics from "./topics.js";
import * as live from "./live.js";
import * as images from "./images.js";
import * as latency from "./latency.js";

/** @typedef {{ init(client: import("./herald-client.js").HeraldClient): void, show?(): void, hide?(): void }} View */

/** @type {Record<string, View>} */
const views = { overview, topics, live, images, latency };
const started = new Set();

const wsUrl = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws`;
const client = connect(wsUrl, { maxDelayMs: 5000 });
const pill = /** @type {HTMLElement} */ (document.getElementById("conn"));
client.on("state", ({ state }) => {
  pill.dataset.state = state;
  pill.textContent = state;
});

let current = "";
function route() {
  const name = location.hash.slice(1).split("?")[0] || "overview";
  const next = views[name] ? name : "overview";
  if (next === current) return;
  if (current) {
    /** @type {HTMLElement} */ (document.getElementById(current)).hidden = true;
    views[current].hide?.();
  }
  current = next;
  /** @type {HTMLElement} */ (document.getElementById(next)).hidden = false;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.getAttribute("href") === `#${next}`);
  if (!started.has(next)) {
    started.add(next);
    views[next].init(client);
  }
  views[next].show?.();
}
addEventListener("hashchange", route);
route();
// Other views can be asked to open with a parameter (the topic explorer's "watch").
addEventListener("herald:watch", (/** @type {any} */ e) => {
  location.hash = "live";
  live.watch(e.detail);
});
