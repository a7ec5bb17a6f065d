// Debian's headless Chromium through puppeteer-core (no browser download), shared by the page tests
// (page_test.mjs, trace_test.mjs).
//   run(name, body): launches it, awaits body(browser), closes it; exits 1 printing "<name> failed:
//     ..." when body throws, 0 otherwise (2 when Chromium is not installed).
//   watch(page, allowed): the requests whose URL allowed() refuses and the console errors, collected.
import puppeteer from "puppeteer-core";
import { existsSync } from "node:fs";

export function check(ok, what) {
  if (!ok) throw new Error(what);
}

export async function run(name, body) {
  const executablePath = ["/usr/lib/chromium/chromium", "/usr/bin/chromium"].find(existsSync);
  if (!executablePath) {
    console.error("Debian's chromium is not installed (scripts/install-deps.sh --test installs it)");
    process.exit(2);
  }
  const browser = await puppeteer.launch({
    executablePath,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--allow-file-access-from-files"],
  });
  let failed = false;
  try {
    await body(browser);
  } catch (e) {
    failed = true;
    console.error(`${name} failed:`, e.message);
  } finally {
    await browser.close();
  }
  process.exit(failed ? 1 : 0);
}

export function watch(page, allowed) {
  const foreign = [], consoleErrors = [];
  page.on("request", (r) => { if (!allowed(r.url())) foreign.push(r.url()); });
  page.on("console", (m) => { if (m.type() === "error") consoleErrors.push(m.text()); });
  page.on("pageerror", (e) => consoleErrors.push(String(e)));
  return { foreign, consoleErrors };
}
