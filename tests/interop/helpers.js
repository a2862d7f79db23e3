// What the interop tests share: a bounded wait, and a Chromium page served by herald with a
// client library's browser bundle loaded.
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";
import { CHROMIUM, CHROMIUM_ARGS } from "../../clients/js/test/browser.js";

/** `promise`, or an error naming `what` once `ms` have passed. */
export function withTimeout(promise, what, ms = 3_000) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no ${what} within ${ms} ms`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

/**
 * A headless Chromium page on herald's origin (`http`) with the bundle at `bundle` (a path
 * under this folder's node_modules) loaded; `problems` collects the page's errors. The browser
 * closes after the test.
 */
export async function pageWith(t, http, bundle) {
  const browser = await chromium.launch({ executablePath: CHROMIUM, args: CHROMIUM_ARGS });
  t.after(() => browser.close());
  const page = await browser.newPage();
  const problems = [];
  page.on("pageerror", (e) => problems.push(e.message));
  await page.goto(http + "/");
  await page.addScriptTag({ path: fileURLToPath(new URL(bundle, import.meta.url)) });
  return { page, problems };
}
