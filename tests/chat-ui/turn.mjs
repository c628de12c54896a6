// LangGraph's agent chat UI (the Vite template of create-agent-chat-app, built unchanged by
// scripts/setup-chat-ui.sh; run by scripts/sdk-test.sh) against `ferrograph serve`, in headless Chromium: one chat turn
// with the `chatbot` graph on the real local model, then a reload that must show the same
// conversation from the thread's state.
//
// Usage: node tests/chat-ui/turn.mjs UI_URL API_URL
// The answer is judged as a person would: prose of a few words, no loop, and the fact asked
// for. Screenshots go to $SCREENSHOT_DIR (default /tmp).
import { launch } from "../browser/launch.mjs";
import path from "node:path";

const [ui, api] = process.argv.slice(2);
if (!ui || !api) {
  console.error("usage: node tests/chat-ui/turn.mjs UI_URL API_URL");
  process.exit(2);
}
const shots = process.env.SCREENSHOT_DIR || "/tmp";
const question = "What color is the sky on a clear day?";
const problems = [];

/** Why `text` is not an answer a person would accept, or null. */
function unusable(text) {
  const words = text.toLowerCase().match(/[a-z0-9']+/g) || [];
  if (words.length < 3) return `too short: "${text}"`;
  const seen = new Map();
  for (let i = 0; i + 6 <= words.length; i++) {
    const gram = words.slice(i, i + 6).join(" ");
    seen.set(gram, (seen.get(gram) || 0) + 1);
    if (seen.get(gram) > 1) return `repeats "${gram}"`;
  }
  if (!words.includes("blue")) return `does not say blue: "${text}"`;
  return null;
}

const { context, close } = await launch({ width: 1100, height: 800 });
let failed = false;
try {
  const page = context.pages()[0] || (await context.newPage());
  page.setDefaultTimeout(120000);
  page.on("pageerror", (e) => problems.push("page error: " + e.message));
  page.on("console", (m) => {
    if (m.type() === "error") problems.push("console error: " + m.text());
  });
  page.on("requestfailed", (r) => problems.push(`request failed: ${r.method()} ${r.url()} ${r.failure()?.errorText}`));
  const apiCalls = [];
  page.on("response", (r) => {
    if (r.url().startsWith(api)) apiCalls.push(`${r.request().method()} ${new URL(r.url()).pathname} ${r.status()}`);
  });

  const url = `${ui}/?apiUrl=${encodeURIComponent(api)}&assistantId=chatbot`;
  await page.goto(url, { waitUntil: "domcontentloaded" });
  const input = page.getByPlaceholder("Type your message...");
  await input.waitFor();
  await input.fill(question);
  await input.press("Enter");

  // The human bubble at once (optimistic), then the answer once the run's values arrive.
  await page.locator("p.rounded-3xl", { hasText: question }).first().waitFor();
  const answer = page.locator("div.group.mr-auto div.py-1").first();
  await answer.waitFor();
  // Wait for the run to end (the thread idle on the server), then for the page to show the
  // answer the server holds.
  await page.waitForFunction(() => new URL(location.href).searchParams.get("threadId"));
  const threadId = new URL(page.url()).searchParams.get("threadId");
  let thread;
  for (let i = 0; i < 600; i++) {
    thread = await (await fetch(`${api}/threads/${threadId}`)).json();
    if (thread.status !== "busy" && (thread.values?.messages || []).length >= 2) break;
    await new Promise((r) => setTimeout(r, 200));
  }
  if (thread.status !== "idle") throw new Error(`thread ${threadId} ended ${thread.status}: ${JSON.stringify(thread)}`);
  const held = thread.values.messages.at(-1).content.trim();
  await page.waitForFunction(
    (want) => [...document.querySelectorAll("div.group.mr-auto div.py-1")].some((e) => e.innerText.trim() === want),
    held,
  );
  const text = (await answer.innerText()).trim();
  console.log(`answer in the chat UI: ${JSON.stringify(text)}`);
  const bad = unusable(text);
  if (bad) throw new Error(`the answer is not usable: ${bad}`);
  await page.screenshot({ path: path.join(shots, "ferrograph-agent-chat-ui.png") });

  // The server holds the same conversation, in LangChain's message shape.
  const state = await (await fetch(`${api}/threads/${threadId}/state`)).json();
  const msgs = state.values.messages || [];
  const kinds = msgs.map((m) => m.type).join(",");
  if (kinds !== "human,ai") throw new Error(`thread ${threadId} holds ${kinds}, not human,ai`);
  if (msgs[0].content !== question || msgs[1].content.trim() !== text) {
    throw new Error(`thread ${threadId} holds other text: ${JSON.stringify(msgs)}`);
  }

  // A reload shows the conversation from the server (the thread's state), not from memory.
  await page.reload({ waitUntil: "domcontentloaded" });
  await page.locator("p.rounded-3xl", { hasText: question }).first().waitFor();
  const again = (await page.locator("div.group.mr-auto div.py-1").first().innerText()).trim();
  if (again !== text) throw new Error(`after a reload the answer reads ${JSON.stringify(again)}`);
  // The thread list (history panel) finds the thread by its graph.
  const found = await (await fetch(`${api}/threads/search`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ metadata: { graph_id: "chatbot" } }),
  })).json();
  if (!found.some((t) => t.thread_id === threadId)) throw new Error("threads/search does not find the thread by graph_id");

  const refused = apiCalls.filter((c) => !/ 2\d\d$/.test(c));
  if (refused.length) throw new Error(`API calls refused: ${refused.join("; ")}`);
  // The template's index.html links /src/styles.css, which its own build does not emit (Vite
  // says so while building): that 404 is the template's, not ours.
  const stylesMissing = problems.some((p) => p.startsWith("request failed: GET") && p.includes("/src/styles.css"));
  const unexpected = problems.filter((p) => !p.includes("favicon")
    && !p.includes("/src/styles.css")
    && !(stylesMissing && p === "console error: Failed to load resource: the server responded with a status of 404 (File not found)"));
  if (unexpected.length) throw new Error(unexpected.join("\n"));
  console.log(`chat UI turn ok (${apiCalls.length} API calls: ${[...new Set(apiCalls.map((c) => c.split(" ").slice(0, 2).join(" ").replace(/[0-9a-f-]{36}/g, ":id")))].join(", ")})`);
} catch (e) {
  failed = true;
  console.error(String(e && e.stack || e));
  if (problems.length) console.error(problems.join("\n"));
  try {
    const page = context.pages()[0];
    await page.screenshot({ path: path.join(shots, "ferrograph-agent-chat-ui-failure.png") });
  } catch {}
} finally {
  await close();
}
process.exit(failed ? 1 : 0);
