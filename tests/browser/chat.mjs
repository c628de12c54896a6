// End-to-end test of the console's chat page in headless Chromium, against the test server
// started with --tutor (the tutor with a stand-in model that streams a sentence of the notes).
// Usage: node chat.mjs http://127.0.0.1:PORT
// A question: the answer arrives as several streamed tokens and ends as the final answer. A
// two-question quiz: each question shows four option buttons; the second shows the feedback
// on the first; the summary is the last answer. A reload of the page shows the conversation.
import { launch } from "./launch.mjs";
import path from "node:path";

const base = process.argv[2];
if (!base) {
  console.error("usage: node chat.mjs BASE_URL");
  process.exit(2);
}
const shots = process.env.SCREENSHOT_DIR || "/tmp";
const problems = [];

const { context, close } = await launch({ width: 1100, height: 900 });
let failed = false;
try {
  const page = context.pages()[0] || (await context.newPage());
  page.setDefaultTimeout(30000);
  page.on("pageerror", (e) => problems.push("page error: " + e.message));
  page.on("console", (m) => { if (m.type() === "error") problems.push("console error: " + m.text()); });

  await page.goto(base + "/console/chat?workflow=tutor", { waitUntil: "domcontentloaded" });
  await page.waitForSelector("#chat-workflow option[value=tutor]", { state: "attached" });
  await page.fill("#chat-subject", "networks");

  // A question: streamed, then final.
  await page.fill("#chat-input", "Explain the TCP handshake");
  await page.click("#chat-send");
  const answer = page.locator("#chat-log li.ai[data-final=true]").first();
  await answer.waitFor();
  const tokens = Number(await answer.getAttribute("data-tokens"));
  if (!(tokens > 3)) throw new Error(`the answer was not streamed (${tokens} token events)`);
  const text = await answer.textContent();
  if (!text.startsWith("From the notes: ")) throw new Error("unexpected answer: " + text);
  const thread = await page.textContent("#chat-thread");
  if (!thread || thread === "new") throw new Error("no thread id shown");

  // A quiz of two questions, answered with the buttons.
  await page.fill("#chat-input", "Quiz me on TCP with 2 questions");
  await page.click("#chat-send");
  await page.locator("#chat-quiz[data-question='1'] .options button").nth(3).waitFor();
  const q1 = await page.textContent("#chat-quiz .question");
  if ((await page.locator("#chat-quiz .options button").count()) !== 4) throw new Error("not four options");
  await page.screenshot({ path: path.join(shots, "ferrograph-chat-quiz.png"), fullPage: true });
  await page.click("#chat-quiz .options button[data-letter=A]");
  await page.locator("#chat-quiz[data-question='2'] .feedback").waitFor();
  const q2 = await page.textContent("#chat-quiz .question");
  if (q1 === q2) throw new Error("the same question twice: " + q1);
  const feedback = await page.textContent("#chat-quiz .feedback");
  if (!/^(Correct: A\)|Not quite: you chose A\))/.test(feedback)) throw new Error("feedback does not match the answer: " + feedback);
  await page.click("#chat-quiz .options button[data-letter=B]");
  const summary = page.locator("#chat-log li.ai[data-final=true]", { hasText: "Quiz on TCP:" });
  await summary.waitFor();
  if (!/Quiz on TCP: [0-2]\/2 correct\./.test(await summary.textContent())) throw new Error("no score in the summary");
  await page.locator("#chat-quiz").waitFor({ state: "hidden" });
  const shot = path.join(shots, "ferrograph-chat.png");
  await page.screenshot({ path: shot, fullPage: true });

  // The conversation is the thread's: a reload shows it.
  await page.reload({ waitUntil: "domcontentloaded" });
  await page.locator("#chat-log li.human", { hasText: "Explain the TCP handshake" }).waitFor();
  await page.locator("#chat-log li.ai", { hasText: "Quiz on TCP:" }).waitFor();
  if (problems.length) throw new Error(problems.join("\n"));
  console.log(`chat page test passed: streamed answer (${tokens} tokens), two-question quiz, reload; screenshot ${shot}`);
} catch (e) {
  failed = true;
  console.error("chat page test FAILED: " + (e && e.stack ? e.stack : e));
  try {
    const page = context.pages()[0];
    if (page) await page.screenshot({ path: path.join(shots, "ferrograph-chat-failure.png"), fullPage: true });
  } catch (_) { /* best effort */ }
} finally {
  await close();
}
process.exit(failed ? 1 : 0);
