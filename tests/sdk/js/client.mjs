// LangGraph's official JavaScript client (@langchain/langgraph-sdk, unpatched) against
// `ferrograph serve`. Usage: node client.mjs URL [--triage INPUT.json]
//
// The same walk as client.py: assistants, a thread run to the review interrupt, its state,
// resume with a Command, a streamed run (values and updates), history, a fork from a
// checkpoint, the store, and errors.
import { readFileSync } from "node:fs";
import { Client } from "@langchain/langgraph-sdk";

const url = process.argv[2];
const at = process.argv.indexOf("--triage");
const triage = at > 0 ? { ...JSON.parse(readFileSync(process.argv[at + 1], "utf8")), out_dir: "sdk-triage-js" } : null;
const client = new Client({ apiUrl: url });

function check(cond, what, detail) {
  if (!cond) {
    console.error(`FAILED: ${what}` + (detail === undefined ? "" : `\n${JSON.stringify(detail, null, 1)}`));
    process.exit(1);
  }
  console.log(`ok: ${what}`);
}

async function refused(what, f) {
  try {
    await f();
  } catch (e) {
    const status = e.status ?? e.response?.status;
    check(status >= 400 && status < 500, `${what} is refused with ${status}`, String(e));
    return;
  }
  check(false, `${what} is refused`);
}

const assistants = await client.assistants.search({ limit: 50 });
const byGraph = Object.fromEntries(assistants.map((a) => [a.graph_id, a]));
check(byGraph.review && byGraph.demo, "assistants.search lists the workflows", Object.keys(byGraph));
const graph = await client.assistants.getGraph("review");
check(graph.nodes.some((n) => n.id === "human_review"), "assistants.getGraph");

const thread = await client.threads.create({ metadata: { user: "bo" } });
check(thread.status === "idle" && thread.metadata.user === "bo", "threads.create", thread);
const tid = thread.thread_id;
let out = await client.runs.wait(tid, "review", { input: { title: "Fall back once" } });
check(out.__interrupt__?.[0]?.value?.kind === "review", "runs.wait stops at the review interrupt", out);

const state = await client.threads.getState(tid);
check(state.next[0] === "human_review" && state.interrupts.length === 1, "threads.getState: next and the interrupt", state);
check(state.checkpoint.checkpoint_id, "threads.getState: the checkpoint");

out = await client.runs.wait(tid, "review", { command: { resume: "approve" } });
check(out.decision === "approved" && !out.__interrupt__, "Command resume approve finishes the review", out);

const history = await client.threads.getHistory(tid, { limit: 20 });
check(history.length >= 3, "threads.getHistory", history.length);
const waiting = history.find((h) => h.next[0] === "human_review");
await client.threads.updateState(tid, { values: { title: "Fall back twice" }, checkpointId: waiting.checkpoint.checkpoint_id });
out = await client.runs.wait(tid, "review", { input: null });
check(out.__interrupt__?.[0]?.value?.title === "Fall back twice", "the fork from the checkpoint asks again", out);
out = await client.runs.wait(tid, "review", { command: { resume: "approve" } });
check(out.title === "Fall back twice" && out.decision === "approved", "the fork finishes", out);
const copy = await client.threads.copy(tid);
check(copy.thread_id !== tid, "threads.copy");

const t3 = await client.threads.create();
const kinds = [];
let last;
for await (const part of client.runs.stream(t3.thread_id, "demo", {
  input: { commits: ["feat: stream tokens", "fix: resume after a crash", "docs: durability"] },
  streamMode: ["values", "updates"],
})) {
  kinds.push(part.event);
  if (part.event === "values") last = part.data;
}
check(kinds[0] === "metadata" && kinds.includes("values") && kinds.includes("updates") && !kinds.includes("error"), "runs.stream: metadata, values, updates", kinds);
check(last?.markdown, "the demo's final values have release notes", last);

if (triage) {
  const t4 = await client.threads.create();
  const updated = new Set();
  const seen = [];
  for await (const part of client.runs.stream(t4.thread_id, "triage", { input: triage, streamMode: ["values", "updates"] })) {
    seen.push(part.event);
    if (part.event === "updates") Object.keys(part.data).forEach((k) => updated.add(k));
    if (part.event === "values") last = part.data;
  }
  check(!seen.includes("error"), "triage streamed without error", seen);
  check(updated.size >= 4, "triage's agents each sent updates", [...updated]);
  check(last.status === "COMPLETED", "triage completed", last.status);
  const files = (last.codebase?.relevant_files ?? []).map((f) => f.path);
  check(files.some((f) => f.endsWith("ledgerlite/discounts.py")), "triage found the planted file", files);
  const report = last.writer?.report ?? {};
  check((report.root_cause ?? "").split(/\s+/).length >= 5 && report.root_cause !== report.suggested_fix, "triage's report has a root cause of its own", report);
}

const bg = await client.runs.create(t3.thread_id, "demo", { input: { commits: ["feat: one more"] } });
const joined = await client.runs.join(t3.thread_id, bg.run_id);
check(joined.markdown, "runs.create then runs.join", joined);
const runs = await client.runs.list(t3.thread_id);
check(runs.some((r) => r.run_id === bg.run_id && r.status === "success"), "runs.list", runs);

await client.store.putItem(["users", "bo"], "prefs", { tone: "short" });
const item = await client.store.getItem(["users", "bo"], "prefs");
check(item.value.tone === "short", "store.putItem / getItem");
await client.store.deleteItem(["users", "bo"], "prefs");

await refused("an unknown thread", () => client.threads.get("no-such-thread"));
await refused("an unknown graph", () => client.runs.wait(null, "no-such-graph", { input: {} }));
console.log("all JavaScript SDK checks passed");
