// End-to-end test of the ferrograph console in headless Chromium (Debian's /usr/bin/chromium;
// playwright-core never downloads a browser).
// Usage: node test.mjs http://127.0.0.1:PORT [--token TOKEN]
// With --token, the server requires a bearer token: the console must ask for it, then send it
// with every call (and read the live events with fetch, since EventSource cannot send it).
import { launch } from "./launch.mjs";
import path from "node:path";

const base = process.argv[2];
const tokenAt = process.argv.indexOf("--token");
const token = tokenAt > 0 ? process.argv[tokenAt + 1] : "";
if (!base || (tokenAt > 0 && !token)) {
  console.error("usage: node test.mjs BASE_URL [--token TOKEN]");
  process.exit(2);
}
const tag = token ? "-token" : "";
const shots = process.env.SCREENSHOT_DIR || "/tmp";
const title = `Browser test ${Date.now()}`;
const problems = [];

const { context, close } = await launch({ width: 1360, height: 900 });
let failed = false;
try {
  const page = context.pages()[0] || (await context.newPage());
  page.setDefaultTimeout(20000);
  page.on("pageerror", (e) => problems.push("page error: " + e.message));
  page.on("console", (m) => { if (m.type() === "error") problems.push("console error: " + m.text()); });
  page.on("requestfailed", (r) => {
    // EventSource connections are cancelled when the page switches threads or closes.
    if (!r.url().endsWith("/events")) problems.push("request failed: " + r.url());
  });

  await page.goto(base + "/", { waitUntil: "domcontentloaded" });
  if (token) {
    await page.locator("#token-form").waitFor();
    await page.fill("#token", token);
    await page.click("#token-form button");
  }
  await page.waitForSelector("#wf-select option[value=review]", { state: "attached" });
  await page.selectOption("#wf-select", "review");
  const sample = JSON.parse(await page.inputValue("#run-input"));
  if (!sample.title) throw new Error("the input is not prefilled with the sample: " + JSON.stringify(sample));
  sample.title = title;
  await page.fill("#run-input", JSON.stringify(sample, null, 2));
  await page.click("#run-start");

  // The interrupt appears, its summary rendered as Markdown.
  const card = page.locator(".interrupt").first();
  await card.waitFor();
  await page.locator(".interrupt .md h4", { hasText: title }).waitFor();
  const codeSpans = await card.locator(".md code").count();
  if (codeSpans < 1) throw new Error("the summary's file names are not rendered as code");
  await page.locator("#d-status[data-status=interrupted]").waitFor();
  await page.locator("#thread-rows [data-status=interrupted]").first().waitFor();
  await page.locator("#events li[data-kind=interrupt]").first().waitFor();
  await page.locator("#ev-state", { hasText: "live" }).waitFor();
  // The graph: the waiting node highlighted as current, the path to it as taken.
  await page.locator('#d-graph g.node.current[data-node="human_review"]').waitFor();
  await page.locator('#d-graph g.node.visited[data-node="draft"]').waitFor();
  await page.locator('#d-graph path.taken[data-source="draft"][data-target="human_review"]').waitFor({ state: "attached" });
  await page.screenshot({ path: path.join(shots, `ferrograph-console${tag}-interrupt.png`), fullPage: true });

  // Approve: the run resumes and the thread reaches done.
  await card.locator("button[data-choice=approve]").click();
  await page.locator("#d-status[data-status=done]").waitFor();
  await page.locator("#events li[data-kind=end]").last().waitFor();
  await page.locator(".interrupt").waitFor({ state: "detached" });
  const stateText = await page.textContent("#d-state");
  const values = JSON.parse(stateText);
  if (values.published !== true || values.decision !== "approved" || values.title !== title) {
    throw new Error("unexpected final state: " + stateText);
  }
  await page.locator("#history-rows tr").nth(3).waitFor();
  await page.locator('#d-graph g.node.visited[data-node="publish"]').waitFor();
  if (await page.locator("#d-graph g.node.current").count() !== 0) throw new Error("a finished thread shows a current node");
  await page.locator("#thread-rows [data-status=done]").first().waitFor();
  const shot = path.join(shots, `ferrograph-console${tag}.png`);
  await page.screenshot({ path: shot, fullPage: true });
  // With a token, the refused first calls are expected console errors (401).
  const real = problems.filter((p) => !(token && p.includes("401")));
  if (real.length) throw new Error(real.join("\n"));
  console.log(`console test${token ? " (with a token)" : ""} passed: review run approved and done; screenshot ${shot}`);
} catch (e) {
  failed = true;
  console.error("console test FAILED: " + (e && e.stack ? e.stack : e));
  try {
    const page = context.pages()[0];
    if (page) await page.screenshot({ path: path.join(shots, `ferrograph-console${tag}-failure.png`), fullPage: true });
  } catch (_) { /* best effort */ }
} finally {
  await close();
}
process.exit(failed ? 1 : 0);
