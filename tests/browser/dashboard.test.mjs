// Drives the broker's dashboard in Debian's chromium (playwright-core, no
// browser download) for tests/e2e/test_dashboard_browser.py, which starts
// the cluster and makes things happen when this script asks for them.
//
//   node dashboard.test.mjs --url http://127.0.0.1:PORT/ --out DIR --brokers N --scenario live|big
//
// Protocol on stdout/stdin (one line each): this script prints
// `WAIT <event>` and blocks until the test writes `<event>` back; it prints
// `OK` at the end, or `FAIL <reason>` and exits 1. Screenshots go to DIR.
import { chromium } from "playwright-core";
import { createInterface } from "node:readline";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => (a.startsWith("--") ? [...acc, [a.slice(2), all[i + 1]]] : acc), []),
);
const url = args.url;
const out = args.out;
const brokers = Number(args.brokers || 1);
const scenario = args.scenario || "live";
const exe = process.env.CHROMIUM || "/usr/bin/chromium";

const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
async function waitFor(event) {
  console.log(`WAIT ${event}`);
  for (;;) {
    const { value, done } = await lines.next();
    if (done) throw new Error(`stdin closed while waiting for ${event}`);
    if (value.trim() === event) return;
  }
}

// `WAIT <event>`, answered by `<event> <data…>`: returns the data words.
async function waitForData(event) {
  console.log(`WAIT ${event}`);
  for (;;) {
    const { value, done } = await lines.next();
    if (done) throw new Error(`stdin closed while waiting for ${event}`);
    const words = value.trim().split(/\s+/);
    if (words[0] === event) return words.slice(1);
  }
}

async function until(page, what, fn, arg, timeout = 20000) {
  try {
    await page.waitForFunction(fn, arg, { timeout, polling: 200 });
  } catch (e) {
    await page.screenshot({ path: join(out, `failed-${what}.png`), fullPage: true });
    throw new Error(`${what}: not seen within ${timeout} ms`);
  }
}

const profile = mkdtempSync(join(tmpdir(), "kaas-chromium-"));
// A fresh profile each run (playwright passes it as --user-data-dir).
const browser = await chromium.launchPersistentContext(profile, {
  executablePath: exe,
  headless: true,
  viewport: { width: 1440, height: 900 },
  args: [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
  ],
});
const problems = [];
let frozen = false;
let code = 0;
try {
  const page = browser.pages()[0] || (await browser.newPage());
  page.on("console", (m) => { if (m.type() === "error" && !frozen) problems.push(`console: ${m.text()}`); });
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  // While the broker is frozen on purpose its requests are aborted by the
  // page's own timeout: expected, not a problem.
  page.on("requestfailed", (r) => { if (!frozen) problems.push(`request failed: ${r.url()} ${r.failure()?.errorText}`); });

  if (scenario === "big") {
    // The fastest of three cold loads: the machine running the tests is
    // shared, and one stalled load says nothing about the page.
    let first = Infinity;
    for (let attempt = 0; attempt < 3 && first > 1000; attempt++) {
      const t0 = Date.now();
      await page.goto(url, { waitUntil: "load" });
      await until(page, "first render", () => Number(document.body.dataset.updates || 0) >= 1, null, 10000);
      first = Math.min(first, Date.now() - t0);
    }
    // Steady state: a poll with every part of the page redrawn.
    const before = await page.evaluate(() => Number(document.body.dataset.updates));
    await until(page, "second render", (n) => Number(document.body.dataset.updates) > n, before, 10000);
    const renderMs = await page.evaluate(() => Number(document.body.dataset.renderMs));
    const total = await page.textContent("#partitions-total");
    const rows = await page.locator("#partitions tbody tr").count();
    await page.screenshot({ path: join(out, "big-cluster.png"), fullPage: true });
    console.log(`METRIC first_render_ms=${first} poll_render_ms=${renderMs} partitions_total=${total} rows=${rows}`);
    if (first > 1000) throw new Error(`first render took ${first} ms (> 1 s)`);
    if (renderMs > 1000) throw new Error(`a poll took ${renderMs} ms (> 1 s)`);
    if (rows > 60) throw new Error(`${rows} partition rows rendered: the table must be paged`);
  } else {
    await page.goto(url, { waitUntil: "load" });
    await until(page, "all brokers alive", (n) =>
      [...document.querySelectorAll("#brokers tr.broker")].filter((r) => r.textContent.includes("alive")).length === n, brokers);
    await until(page, "actor kinds", () =>
      [...document.querySelectorAll("#kinds tr.kind")].some((r) => r.dataset.kind === "partition_leader"));
    await until(page, "actor rows", () => document.querySelectorAll("#actors tr.actor").length > 0);
    await until(page, "controller", () => /\d/.test(document.getElementById("controller-id")?.textContent || ""));
    // Incarnations digit for digit as the broker records, logs and
    // `kaas inspect` print them (a JSON number lost its low bits here).
    if (args.incarnations) {
      const want = args.incarnations.split(",");
      await until(page, `incarnations ${want.join(" ")}`, (w) => {
        const text = [...document.querySelectorAll("#brokers tr.broker")].map((r) => r.textContent).join(" ");
        return w.every((inc) => text.includes(inc));
      }, want);
    }
    await page.screenshot({ path: join(out, "cluster-idle.png"), fullPage: true });
    const idleUpdates = await page.evaluate(() => Number(document.body.dataset.updates));

    await waitFor("load-started");
    // Live: the leaders' message rate and the produce sparkline move by
    // themselves, without a reload.
    await until(page, "live message rate", () => {
      const row = [...document.querySelectorAll("#kinds tr.kind")].find((r) => r.dataset.kind === "partition_leader");
      return row && Number(row.cells[4].textContent.replace(/[^0-9.]/g, "")) > 0;
    });
    await until(page, "high watermark moves", () =>
      [...document.querySelectorAll("#partitions tr.partition td:nth-child(5)")].some((td) => Number(td.textContent.replace(/[^0-9]/g, "")) > 0));
    const updates = await page.evaluate(() => Number(document.body.dataset.updates));
    if (!(updates > idleUpdates)) throw new Error("the page did not update by itself");
    await page.screenshot({ path: join(out, "cluster-under-load.png"), fullPage: true });

    // A group coordinated by another broker: its lag is on this page too
    // (it was only on the coordinator's own page).
    const [group, lag, coordinator] = await waitForData("lag");
    await until(page, `group ${group} lag ${lag} coordinated by broker ${coordinator}`, ([g, l, c]) =>
      [...document.querySelectorAll("#lag tr.lag-group")].some((r) => r.dataset.group === g &&
        r.dataset.lag === l && r.dataset.coordinator === c && r.textContent.includes(`broker ${c}`)), [group, lag, coordinator]);
    await page.screenshot({ path: join(out, "consumer-lag.png"), fullPage: true });

    await waitFor("restarted");
    await until(page, "restart highlighted", () =>
      [...document.querySelectorAll("#highlighted .badge")].some((b) => b.textContent === "restarted"), null, 30000);
    await page.screenshot({ path: join(out, "restart-highlighted.png"), fullPage: true });

    // The page's own broker is stopped (SIGSTOP): its connections are still
    // accepted and never answered. Within 3 s (plus a poll) the page says
    // its data is stale instead of showing the last render as current.
    frozen = true;
    await waitFor("frozen");
    const t0 = Date.now();
    await until(page, "stale within 3 s", () => document.body.dataset.stale === "1", null, 4500);
    console.log(`METRIC stale_after_ms=${Date.now() - t0}`);
    const status = await page.evaluate(() => document.getElementById("status").textContent);
    if (!/STALE/.test(status)) throw new Error(`no STALE status line: ${status}`);
    await page.screenshot({ path: join(out, "stale.png"), fullPage: true });
    await waitFor("thawed");
    await until(page, "fresh again", () => document.body.dataset.stale === "0", null, 20000);
    frozen = false;

    // Another broker is killed: "needs attention" names it (it listed only
    // this broker's actors, so a dead broker never appeared there).
    await waitFor("killed");
    await until(page, "dead broker in needs attention", (id) =>
      [...document.querySelectorAll("#highlighted li.cluster")].some((li) => li.textContent.includes(`broker ${id}`) &&
        /dead|stopped heartbeating/.test(li.textContent)), args.killed, 30000);
    await page.screenshot({ path: join(out, "dead-broker.png"), fullPage: true });
  }
  if (problems.length) throw new Error(problems.join("\n"));
  console.log("OK");
} catch (e) {
  console.log(`FAIL ${String(e.message).replace(/\n/g, " | ")}`);
  code = 1;
} finally {
  await browser.close();
  rmSync(profile, { recursive: true, force: true });
}
process.exit(code);
