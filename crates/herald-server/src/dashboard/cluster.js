// The Cluster panel of the overview: this node's NATS state from /api/stats's `cluster` (null
// for a node alone, and then the panel stays hidden). Rates come from two samples, like the
// overview's.

import { count, bytes, cell } from "./format.js";

/** @type {any} */
let previous = null;

/** @param {any} cluster the `cluster` object of /api/stats, or null @param {number} nowUs */
export function showCluster(cluster, nowUs) {
  const panel = /** @type {HTMLElement} */ (document.getElementById("cluster-panel"));
  panel.hidden = !cluster;
  if (!cluster) return;
  const dt = previous ? (nowUs - previous.now_us) / 1e6 : 0;
  const rate = (/** @type {string} */ k) =>
    dt > 0 && cluster[k] >= previous.cluster[k] ? (cluster[k] - previous.cluster[k]) / dt : NaN;
  const jetstream = !cluster.jetstream ? "off" : cluster.jetstream_available ? "available" : "unavailable";
  /** @type {[string, string, string?][]} */
  const rows = [
    ["NATS", cluster.nats_connected ? "connected" : "disconnected", cluster.nats_connected ? "ok" : "bad"],
    ["nodes seen", count(cluster.nodes_seen)],
    ["remote interest (patterns)", count(cluster.remote_interest)],
    ["messages in via NATS", `${count(cluster.messages_in)} (${count(rate("messages_in"))}/s)`],
    ["messages out via NATS", `${count(cluster.messages_out)} (${count(rate("messages_out"))}/s)`],
    ["bytes in / out", `${bytes(cluster.bytes_in)} / ${bytes(cluster.bytes_out)}`],
    ["pending to NATS", bytes(cluster.pending_bytes)],
    ["not carried", count(cluster.not_carried), cluster.not_carried ? "bad" : undefined],
    ["missed from other nodes", count(cluster.missed), cluster.missed ? "bad" : undefined],
    ["JetStream history", jetstream, jetstream === "unavailable" ? "bad" : undefined],
    ["read from JetStream", count(cluster.recalled)],
    ["node id", cluster.node_id],
  ];
  /** @type {HTMLElement} */ (document.getElementById("s-cluster")).replaceChildren(
    ...rows.map(([k, v, state]) => {
      const tr = document.createElement("tr");
      const value = cell(v, "n");
      if (state) value.dataset.state = state;
      tr.append(cell(k), value);
      return tr;
    }),
  );
  previous = { now_us: nowUs, cluster };
}
