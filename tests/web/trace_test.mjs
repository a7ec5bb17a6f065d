// Drives lineage trace's page in Debian's headless Chromium through puppeteer-core.
//   node trace_test.mjs file PAGE.html SHOTS_DIR   a page written by `lineage trace`, opened from disk
//   node trace_test.mjs served PORT SHOTS_DIR      the page `lineage serve` serves at /trace
//   node trace_test.mjs load PAGE.html              only the time from navigation to a drawn page
//   node trace_test.mjs shot PAGE.html OUT.png T LAYER HEAD   one screenshot at token T (docs/study.md)
// It presses play, steps, switches layer and head, and takes screenshots; fails on a console error or
// a request to anywhere but the page (and, served, its server); and checks the numbers the page shows
// against the page's data decoded here, independently of the page's own decoding. Prints JSON.
// (tests/serve/test_trace_page.py runs it.)
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import path from "node:path";

import { check, run, watch } from "./chromium.mjs";

const [mode, target, shots] = process.argv.slice(2);
if (!["file", "served", "load", "shot"].includes(mode) || !target) {
  console.error("usage: node trace_test.mjs file PAGE.html SHOTS | served PORT SHOTS | load PAGE.html | shot PAGE.html OUT.png T LAYER HEAD");
  process.exit(2);
}
// The page's data decoded here from the file (Buffer, not the page's atob).
function decode(o) {
  const b = Buffer.from(o.b64, "base64");
  const ab = b.buffer.slice(b.byteOffset, b.byteOffset + b.length);
  return new ({ f32: Float32Array, u16: Uint16Array, i8: Int8Array, i32: Int32Array }[o.dtype])(ab);
}
function dataOfFile(file) {
  const html = readFileSync(file, "utf8");
  const m = /<script id="trace-data" type="application\/json">([\s\S]*?)<\/script>/.exec(html);
  check(m, "no data in " + file);
  return JSON.parse(m[1]);
}
const close = (a, b) => Math.abs(a - b) <= 1e-6 * Math.max(1, Math.abs(b));

// What the page shows in its table of cells, against the data: every row it names.
async function checkCells(page, D) {
  const s = await page.evaluate(() => ({ t: Number(document.body.dataset.t), layer: Number(document.getElementById("layer").value),
    head: Number(document.getElementById("head").value), state: Number(document.getElementById("state-bytes").dataset.value),
    cells: Array.from(document.querySelectorAll("#cells tr")).map((r) => [r.dataset.name, Number(r.dataset.value)]) }));
  check(s.state === D.state_bytes[s.t], `state bytes shown ${s.state} vs data ${D.state_bytes[s.t]}`);
  const l = D.layers[s.layer], d = l.head_data[String(s.head)];
  let checked = 0;
  for (const [name, value] of s.cells) {
    let want = null;
    if (l.mixer !== "delta") {
      const m = /^w\[(\d+)→(\d+)\]/.exec(name);
      if (m && d) { const t = Number(m[1]), j = Number(m[2]); want = decode(d.weights)[t * (t + 1) / 2 + j] / 65535; check(t === s.t, "weights of another token"); }
    } else {
      const K = l.k, V = l.v, sc = decode(l.scalars), base = (s.t * l.heads + s.head) * 7;
      if (name === "β") want = sc[base];
      else if (name === "‖S after‖") want = sc[base + 6];
      else if (d && name === "S after[0,0]") want = decode(d.state)[s.t * K * V] * decode(d.state_scale)[s.t];
      else if (d && /^(write|erase)\[(\d+),(\d+)\]$/.test(name)) {
        const [, which, i, j] = /^(write|erase)\[(\d+),(\d+)\]$/.exec(name), n = which === "erase" ? 1 : 2;
        want = decode(d.parts)[((s.t * 3 + n) * K + Number(i)) * V + Number(j)] * decode(d.parts_scale)[s.t * 3 + n];
      }
      else if (d && name === "k[0]") want = decode(d.k)[s.t * K];
      else if (d && name === "v[0]") want = decode(d.v)[s.t * V];
      else if (d && name === "read-out[0]") want = decode(d.out)[s.t * V];
    }
    if (want !== null) { check(close(value, want), `${name}: the page shows ${value}, the data holds ${want}`); ++checked; }
  }
  return checked;
}

await run("trace page test", async (browser) => {
  const page = await browser.newPage();
  await page.setViewport({ width: 1200, height: 900 });
  const origin = mode === "served" ? `http://127.0.0.1:${target}` : null;
  // Served with one head in full, so that picking another fetches it.
  const url = mode === "served" ? origin + "/trace?detail_bytes=1" : pathToFileURL(path.resolve(target)).href;
  const { foreign, consoleErrors } = watch(page, (u) => u === url || u.startsWith("data:") || (origin && u.startsWith(origin + "/")));

  const t0 = Date.now();
  await page.goto(url, { waitUntil: "load", timeout: 60000 });
  await page.waitForFunction(() => document.body.dataset.ready === "1" && document.getElementById("mixer"), { timeout: 60000 });
  const loadMs = Date.now() - t0;
  if (mode === "shot") {
    const [t, layer, head] = process.argv.slice(5);
    for (const sfx of ["", "-2"]) {  // every run of the page (a comparison has two)
      if (!(await page.$("#layer" + sfx))) continue;
      await page.select("#layer" + sfx, String(layer ?? 0));
      await page.select("#head" + sfx, String(head ?? 0));
    }
    await page.evaluate((u) => { const s = document.getElementById("slider"); s.value = u; s.dispatchEvent(new Event("input")); }, String(t ?? 0));
    await page.screenshot({ path: shots, fullPage: true });
    check(consoleErrors.length === 0, "console errors: " + consoleErrors.join("; "));
    console.log(JSON.stringify({ load_ms: loadMs, screenshot: shots }));
  } else if (mode === "load") {
    check(consoleErrors.length === 0, "console errors: " + consoleErrors.join("; "));
    console.log(JSON.stringify({ load_ms: loadMs }));
  } else {
    const D = mode === "file" ? dataOfFile(target) : await (await fetch(origin + "/trace/data", { method: "POST",
      body: JSON.stringify({ prompt: await page.$eval("#prompt", (e) => e.value), detail_bytes: 1 }) })).json();
    const T = D.tokens.length;
    const shot = async (name) => page.screenshot({ path: path.join(shots, `trace_${mode}_${name}.png`) });
    let checked = await checkCells(page, D);
    await shot("start");
    // Play: the token advances by itself; pause stops it.
    await page.select("#speed", "80");
    await page.click("#play");
    await page.waitForFunction(() => Number(document.body.dataset.t) >= 3, { timeout: 20000 });
    await page.click("#play");
    const paused = await page.evaluate(() => Number(document.body.dataset.t));
    await new Promise((r) => setTimeout(r, 400));
    check(await page.evaluate(() => Number(document.body.dataset.t)) === paused, "pause did not stop the playback");
    await shot("played");
    // Step forward and back.
    await page.click("#next");
    check(await page.evaluate(() => Number(document.body.dataset.t)) === Math.min(T - 1, paused + 1), "next did not step");
    await page.click("#prev");
    check(await page.evaluate(() => Number(document.body.dataset.t)) === paused, "prev did not step back");
    checked += await checkCells(page, D);
    // Every layer, its first detail head (or head 0), with its own view drawn and its numbers checked.
    const kinds = new Set();
    for (let i = 0; i < (mode === "file" ? D.layers.length : 0); i++) {
      const l = D.layers[i];
      await page.select("#layer", String(i));
      const h = l.detail.length ? l.detail[l.detail.length - 1] : 0;
      await page.select("#head", String(h));
      const drawn = await page.evaluate(() => ({ maps: document.querySelectorAll("#mixer canvas").length, missing: !!document.getElementById("missing") }));
      check(drawn.maps > 0, `layer ${i} drew nothing`);
      check(drawn.missing === !l.detail.includes(h), `layer ${i} head ${h}: detail shown or missing wrongly`);
      checked += await checkCells(page, D);
      if (!kinds.has(l.mixer)) { kinds.add(l.mixer); await shot(`layer${i}_${l.mixer}`); }
    }
    if (mode === "served") {  // a head the first answer did not hold: the page fetches it
      for (let i = 0; i < D.layers.length; i++) {
        const l = D.layers[i], h = l.heads - 1;
        if (l.detail.includes(h)) continue;
        await page.select("#layer", String(i));
        await page.select("#head", String(h));
        // Not in the first answer (D, fetched with the page's own budget): drawn once the page has fetched
        // it (a fetch for it may already be on its way from the layer switch, so no "missing" is awaited).
        await page.waitForFunction(() => !document.getElementById("missing"), { timeout: 60000 });
        check(await page.evaluate(() => document.querySelectorAll("#mixer canvas").length > 1), `layer ${i}: the fetched head is drawn`);
        kinds.add(l.mixer);
        if (!kinds.has("fetched")) { kinds.add("fetched"); await shot("fetched_head"); }
      }
    }
    check(checked >= 6, `only ${checked} shown values checked`);
    check(foreign.length === 0, "requests outside the page: " + foreign.join(", "));
    check(consoleErrors.length === 0, "console errors: " + consoleErrors.join("; "));
    const columns = await page.evaluate(() => Array.from(document.querySelectorAll(".run"), (r) => ({
      title: r.querySelector("h3").textContent, drawn: r.querySelectorAll("canvas").length })));
    console.log(JSON.stringify({ load_ms: loadMs, checked, views: [...kinds], tokens: T, runs: columns }));
  }
});
