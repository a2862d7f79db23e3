// Talking to herald beyond the SDK: /api/* with the credentials herald needs when
// authentication is on, and ending a view's subscription.
//
// With authentication on the dashboard needs a token for its WebSocket and the admin API key for
// /api/*. Both come from the login form or the URL fragment (`#token=…&admin_key=…`, so that
// an operator can bookmark them) and are kept in this tab's session storage, never in the URL:
// the fragment is read once and removed from the address bar.

const TOKEN = "herald.token";
const ADMIN_KEY = "herald.admin_key";

/** @typedef {{token: string, adminKey: string}} Credentials */

/**
 * Moves credentials from the URL fragment to session storage and returns the fragment's view
 * name (`#live&token=…` opens Live), or "" when the fragment held none.
 */
export function takeFromFragment() {
  const parts = location.hash.slice(1).split("&");
  const params = new URLSearchParams(parts.filter((p) => p.includes("=")).join("&"));
  if (!params.has("token") && !params.has("admin_key")) return "";
  store({ token: params.get("token") ?? "", adminKey: params.get("admin_key") ?? "" });
  const view = parts.find((p) => p && !p.includes("=")) ?? "overview";
  history.replaceState(null, "", `${location.pathname}${location.search}#${view}`);
  return view;
}

/** @returns {Credentials} */
export function credentials() {
  return { token: sessionStorage.getItem(TOKEN) ?? "", adminKey: sessionStorage.getItem(ADMIN_KEY) ?? "" };
}

/** @param {Credentials} c */
export function store(c) {
  for (const [key, value] of [[TOKEN, c.token], [ADMIN_KEY, c.adminKey]]) {
    if (value) sessionStorage.setItem(key, value);
    else sessionStorage.removeItem(key);
  }
}

/** An /api/* request herald refused or could not answer. */
export class ApiError extends Error {
  /** @param {number} status @param {string} message */
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

/**
 * GET an /api/* path as JSON, with the admin API key when one is stored. A refusal (401, 403)
 * is also announced as a `herald:auth` event carrying a message for people, which the shell
 * shows on the login form.
 * @param {string} path
 */
export async function api(path) {
  const { adminKey } = credentials();
  const r = await fetch(path, adminKey ? { headers: { authorization: `Bearer ${adminKey}` } } : {});
  if (r.ok) return r.json();
  let why = "";
  try {
    why = (await r.json()).message ?? "";
  } catch {
    // not JSON: the status says enough
  }
  if (r.status === 401 || r.status === 403) {
    const message = !adminKey
      ? `herald has authentication on: ${path} needs the admin API key (HTTP ${r.status}).`
      : `herald refused the admin API key for ${path} (HTTP ${r.status}${why ? `: ${why}` : ""}).`;
    dispatchEvent(new CustomEvent("herald:auth", { detail: message }));
    throw new ApiError(r.status, message);
  }
  throw new ApiError(r.status, `${path}: HTTP ${r.status}${why ? `: ${why}` : ""}`);
}

/**
 * Ends a view's subscription. It can only fail when the connection closed first, which ended
 * the subscription at herald too, so failures are not reported.
 * @param {import("./herald-client.js").Subscription | null} sub
 */
export function release(sub) {
  sub?.unsubscribe().catch(() => {});
}
