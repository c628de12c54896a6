// The team's two human gates in the console, in headless Chromium: start the fixture brief,
// see the stories gate (the requirement and the stories as Markdown), reject it with a reason
// and see the revised stories gate, approve; see the deployment gate (quality score, the CI
// configuration, the runbook), approve, and see the run end deployed.
// Usage: node team.mjs http://127.0.0.1:PORT BRIEF_DIR
import { launch } from "./launch.mjs";
import path from "node:path";

const [base, brief] = process.argv.slice(2);
if (!base || !brief) {
  console.error("usage: node team.mjs BASE_URL BRIEF_DIR");
  process.exit(2);
}
const shots = process.env.SCREENSHOT_DIR || "/tmp";
const problems = [];
const { context, close } = await launch({ width: 1360, height: 1000 });
let failed = false;
try {
  const page = context.pages()[0] || (await context.newPage());
  page.setDefaultTimeout(60000);
  page.on("pageerror", (e) => problems.push("page error: " + e.message));
  page.on("console", (m) => { if (m.type() === "error") problems.push("console error: " + m.text()); });
  await page.goto(base + "/", { waitUntil: "domcontentloaded" });
  await page.waitForSelector("#wf-select option[value=team]", { state: "attached" });
  await page.selectOption("#wf-select", "team");
  await page.fill("#run-input", JSON.stringify({ brief }, null, 2));
  await page.click("#run-start");

  // Gate 1: the stories.
  let card = page.locator(".interrupt").first();
  await card.locator("h2", { hasText: "Approve the user stories" }).waitFor();
  await card.locator(".md", { hasText: "Acceptance criteria" }).waitFor();
  await card.locator(".md", { hasText: "US-1" }).waitFor();
  const ph = await card.locator("textarea[aria-label=feedback]").getAttribute("placeholder");
  if (!ph.includes("product owner")) throw new Error("the feedback box does not say what it does: " + ph);
  await card.screenshot({ path: path.join(shots, "ferrograph-console-team-stories.png") });
  await card.locator("textarea[aria-label=feedback]").fill("also report how many words the text has");
  await card.locator("button[data-choice=feedback]").click();
  // The revised requirement carries the reason; approve it.
  card = page.locator(".interrupt").first();
  await card.locator(".md", { hasText: "also report how many words" }).waitFor();
  await card.locator("button[data-choice=approve]").click();

  // Gate 2: the deployment.
  card = page.locator(".interrupt").first();
  await card.locator("h2", { hasText: "Approve the deployment" }).waitFor();
  await card.locator(".md", { hasText: "Quality score" }).waitFor();
  await card.locator(".md", { hasText: "python3 -m unittest discover" }).waitFor();
  await card.locator(".md", { hasText: "Roll back" }).waitFor();
  await page.screenshot({ path: path.join(shots, "ferrograph-console-team-deploy.png"), fullPage: true });
  await card.locator("button[data-choice=approve]").click();
  await page.locator("#d-status[data-status=done]").waitFor();
  await page.locator("#d-state", { hasText: '"status": "deployed"' }).waitFor();
  const values = JSON.parse(await page.textContent("#d-state"));
  if (values.lifecycle !== "deployed" || values.requirement.rejections !== 1) {
    throw new Error("unexpected final state: " + JSON.stringify({ lifecycle: values.lifecycle, rejections: values.requirement.rejections }));
  }
  if (problems.length) throw new Error(problems.join("\n"));
  console.log("team console test passed: stories rejected with a reason, revised, approved; deployment approved; deployed");
} catch (e) {
  failed = true;
  console.error(e);
} finally {
  await close();
}
process.exit(failed ? 1 : 0);
