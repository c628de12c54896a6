// The ticket-to-pr review gate in the console, in headless Chromium: start TASK-101 on the
// fixture, see the gate's unified diff rendered with added/removed lines and coloured code,
// approve, see the run end with its pull request.
// Usage: node ticket.mjs http://127.0.0.1:PORT FIXTURE_DIR
import { launch } from "./launch.mjs";
import path from "node:path";

const [base, fixture] = process.argv.slice(2);
if (!base || !fixture) {
  console.error("usage: node ticket.mjs BASE_URL FIXTURE_DIR");
  process.exit(2);
}
const shots = process.env.SCREENSHOT_DIR || "/tmp";
const problems = [];
const { context, close } = await launch({ width: 1360, height: 1000 });
let failed = false;
try {
  const page = context.pages()[0] || (await context.newPage());
  page.setDefaultTimeout(30000);
  page.on("pageerror", (e) => problems.push("page error: " + e.message));
  page.on("console", (m) => { if (m.type() === "error") problems.push("console error: " + m.text()); });
  await page.goto(base + "/", { waitUntil: "domcontentloaded" });
  await page.waitForSelector("#wf-select option[value=ticket-to-pr]", { state: "attached" });
  await page.selectOption("#wf-select", "ticket-to-pr");
  const input = { ticket_key: "TASK-101", tickets: path.join(fixture, "tickets"), repo: path.join(fixture, "repo") };
  await page.fill("#run-input", JSON.stringify(input, null, 2));
  await page.click("#run-start");

  const card = page.locator(".interrupt").first();
  await card.waitFor();
  const diff = card.locator("pre.diff");
  await diff.waitFor();
  const added = await diff.locator(".line.add", { hasText: "!= null" }).count();
  const removed = await diff.locator(".line.del", { hasText: "isBefore(today)" }).count();
  const meta = await diff.locator(".line.meta", { hasText: "TaskService.java" }).count();
  const keywords = await diff.locator(".tok-kw").count();
  if (added < 1 || removed < 1 || meta < 1 || keywords < 1) {
    throw new Error(`the diff is not rendered: added=${added} removed=${removed} meta=${meta} keywords=${keywords}`);
  }
  await card.locator(".md", { hasText: "Root cause" }).waitFor();
  await page.screenshot({ path: path.join(shots, "ferrograph-console-ticket-diff.png"), fullPage: true });
  await card.screenshot({ path: path.join(shots, "ferrograph-console-ticket-gate.png") });

  await card.locator("button[data-choice=approve]").click();
  await page.locator("#d-status[data-status=done]").waitFor();
  // The state panel follows the status: wait for the final state, not the one before.
  await page.locator("#d-state", { hasText: '"status": "pr opened"' }).waitFor();
  const values = JSON.parse(await page.textContent("#d-state"));
  if (values.status !== "pr opened" || !values.pr || values.pr.number < 1) {
    throw new Error("unexpected final state: " + JSON.stringify(values).slice(0, 400));
  }
  if (problems.length) throw new Error(problems.join("\n"));
  console.log("ticket-to-pr console test passed: diff rendered, approved, PR #" + values.pr.number);
} catch (e) {
  failed = true;
  console.error(e);
} finally {
  await close();
}
process.exit(failed ? 1 : 0);
