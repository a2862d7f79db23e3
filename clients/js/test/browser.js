// Debian's Chromium, launched the way the tests and the display-rate measurement need it.

export const CHROMIUM = process.env.CHROMIUM ?? "/usr/bin/chromium";
export const CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync"];
