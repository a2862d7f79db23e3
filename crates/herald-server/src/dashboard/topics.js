// Topic explorer: GET /api/topics every two seconds while shown, as a tree by level. A branch
// shows the sum of its topics' rates; clicking it folds it; "watch" opens the Images view for
// images (a topic, or a branch of nothing else) and Live for the rest.

import { count, bytes, cell } from "./format.js";
import { api } from "./api.js";

const $ = (/** @type {string} */ id) => /** @type {HTMLElement} */ (document.getElementById(id));

/**
 * @typedef {{topic: string, seq: number, subscribers: number, rate: number,
 *   last: null | {ct?: string, bytes: number, binary: boolean, text?: string, truncated?: boolean}}} Topic
 * @typedef {{name: string, path: string, children: Map<string, Node>, topic?: Topic, rate: number, topics: number, images: number}} Node
 */

/** Branches the user folded (paths). */
const folded = new Set();
let timer = 0;
let visible = false;
/** @type {Topic[]} */
let latest = [];

export function init() {
  $("t-filter").addEventListener("input", () => {
    clearTimeout(timer);
    poll();
  });
}

export function show() {
  visible = true;
  poll();
}

export function hide() {
  visible = false;
  clearTimeout(timer);
}

async function poll() {
  clearTimeout(timer);
  if (!visible) return;
  try {
    const prefix = encodeURIComponent(/** @type {HTMLInputElement} */ ($("t-filter")).value);
    const body = await api(`/api/topics?limit=2000&prefix=${prefix}`);
    latest = body.topics;
    $("t-summary").textContent = `${count(body.total)} topics` + (body.truncated ? `, first ${latest.length} shown` : "");
    render();
  } catch (e) {
    $("t-summary").textContent = `not updated: ${e instanceof Error ? e.message : e}`;
  }
  timer = setTimeout(poll, 2000);
}

/** @param {Topic[]} topics */
function tree(topics) {
  /** @type {Node} */
  const root = { name: "", path: "", children: new Map(), rate: 0, topics: 0, images: 0 };
  for (const t of topics) {
    const image = isImage(t) ? 1 : 0;
    let node = root;
    node.rate += t.rate;
    node.topics++;
    node.images += image;
    for (const level of t.topic.split("/")) {
      const path = node.path ? `${node.path}/${level}` : level;
      let child = node.children.get(level);
      if (!child) node.children.set(level, (child = { name: level, path, children: new Map(), rate: 0, topics: 0, images: 0 }));
      child.rate += t.rate;
      child.topics++;
      child.images += image;
      node = child;
    }
    node.topic = t;
  }
  return root;
}

function render() {
  const rows = [];
  /** @param {Node} node @param {number} depth */
  const walk = (node, depth) => {
    for (const child of [...node.children.values()].sort((a, b) => a.name.localeCompare(b.name))) {
      rows.push(row(child, depth));
      if (child.children.size && !folded.has(child.path)) walk(child, depth + 1);
    }
  };
  walk(tree(latest), 0);
  $("t-body").replaceChildren(...rows);
}

/** @param {Node} node @param {number} depth */
function row(node, depth) {
  const tr = document.createElement("tr");
  const name = cell("");
  name.style.paddingLeft = `${0.5 + depth * 1.2}rem`;
  const t = node.topic;
  if (node.children.size) {
    tr.className = "branch";
    const caret = document.createElement("span");
    caret.className = "caret";
    caret.textContent = folded.has(node.path) ? "▸" : "▾";
    const n = document.createElement("small");
    n.className = "muted";
    n.textContent = ` ${count(node.topics)} topic${node.topics === 1 ? "" : "s"}`;
    name.append(caret, node.name + "/", n);
    name.title = `${node.path}/ — click to fold`;
    name.addEventListener("click", () => {
      folded.has(node.path) ? folded.delete(node.path) : folded.add(node.path);
      render();
    });
  } else {
    name.append(node.name);
    name.title = node.path;
  }
  const image = node.images === node.topics;
  const watch = document.createElement("a");
  watch.href = image ? "#images" : "#live";
  watch.textContent = "watch";
  watch.className = "watch";
  watch.title = image ? "show in Images" : "show in Live";
  watch.addEventListener("click", (e) => {
    e.preventDefault();
    dispatchEvent(new CustomEvent("herald:watch", { detail: { pattern: node.children.size ? `${node.path}/>` : node.path, image } }));
  });
  name.append(watch);
  tr.append(
    name,
    cell(count(node.rate), "n"),
    cell(t ? count(t.subscribers) : "", "n"),
    cell(t ? count(t.seq) : "", "n"),
    cell(t?.last ? lastValue(t.last) : ""),
  );
  return tr;
}

/** Whether a topic's last message is an image the Images view draws. @param {Topic} t */
function isImage(t) {
  return !!t.last?.binary && /^image\/|fits/i.test(t.last.ct ?? "");
}

/** @param {NonNullable<Topic["last"]>} last */
function lastValue(last) {
  if (last.binary) return `‹${bytes(last.bytes)}${last.ct ? " " + last.ct : ""}›`;
  return (last.text ?? "") + (last.truncated ? "…" : "");
}
