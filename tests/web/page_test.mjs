// Drives lineage serve's chat page (/) in Debian's headless Chromium through puppeteer-core:
// loads it, sends two messages, waits for each streamed reply, checks the numbers the page shows
// against the server's own (/metrics), that the page fetched nothing but the server, and takes a
// screenshot. Usage: node page_test.mjs PORT SCREENSHOT.png   (tests/serve/test_page.py runs it)
import { check, run, watch } from "./chromium.mjs";

const [port, screenshot] = process.argv.slice(2);
if (!port || !screenshot) {
  console.error("usage: node page_test.mjs PORT SCREENSHOT.png");
  process.exit(2);
}
const origin = `http://127.0.0.1:${port}`;
await run("page test", async (browser) => {
  const page = await browser.newPage();
  await page.setViewport({ width: 1000, height: 700 });
  const { foreign, consoleErrors } = watch(page, (u) => u.startsWith(origin) || u.startsWith("data:"));

  await page.goto(origin + "/", { waitUntil: "networkidle0", timeout: 30000 });
  check((await page.title()) === "lineage chat", "the page's title");
  await page.waitForFunction(() => document.getElementById("model").textContent.includes("layers"), { timeout: 10000 });

  const replies = [];
  for (const [i, message] of ["Hello, what do you store?", "And how do you read it back?"].entries()) {
    await page.evaluate(() => { document.getElementById("temperature").value = "0"; document.getElementById("max-tokens").value = "24"; });
    await page.type("#input", message);
    await page.keyboard.press("Enter");
    // Streamed: the bubble shows text while it is still streaming or once done.
    await page.waitForFunction((n) => {
      const done = document.querySelectorAll(".msg.assistant.done");
      return done.length === n;
    }, { timeout: 60000 }, i + 1);
    const r = await page.evaluate(() => {
      const all = document.querySelectorAll(".msg.assistant");
      const last = all[all.length - 1];
      const s = document.getElementById("stats").dataset;
      return { text: last.firstChild ? last.firstChild.textContent : "", meta: last.querySelector(".meta")?.textContent || "",
               tokps: Number(s.tokps), cached: Number(s.cached), state: Number(s.stateBytes),
               errors: document.querySelectorAll(".msg.error").length, users: document.querySelectorAll(".msg.user").length };
    });
    check(r.errors === 0, "an error bubble: " + JSON.stringify(r));
    check(r.users === i + 1, "the user's message is shown");
    check(r.text.length > 0, "no streamed text in the reply");
    check(r.tokps > 0, "tok/s shown: " + r.meta);
    check(r.state > 0, "state bytes shown: " + r.meta);
    check(/tok\/s/.test(r.meta) && /cached/.test(r.meta) && /state/.test(r.meta), "the reply's line: " + r.meta);
    replies.push(r);
  }
  // The second turn starts with the first turn's prompt and reply: the cache serves part of it.
  check(replies[1].cached > 0, "the second turn's cached tokens: " + replies[1].meta);
  const metrics = await (await fetch(origin + "/metrics")).text();
  const cachedTotal = Number(/^lineage_cached_tokens_total (\S+)$/m.exec(metrics)[1]);
  check(cachedTotal >= replies[1].cached, `the page's cached tokens (${replies[1].cached}) against /metrics (${cachedTotal})`);
  check(foreign.length === 0, "requests outside the server: " + foreign.join(", "));
  check(consoleErrors.length === 0, "console errors: " + consoleErrors.join("; "));
  await page.screenshot({ path: screenshot });
  console.log(JSON.stringify({ replies: replies.map((r) => r.meta), screenshot }));
});
