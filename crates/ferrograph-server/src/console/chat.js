// ferrograph chat page: a conversation with a chat workflow (the tutor) over the HTTP API.
// Each message is a run on the thread, streamed (tokens as they are written); a quiz question
// is a pending interrupt, answered with its option buttons (a resume). Plain JavaScript.
"use strict";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const chat = { token: sessionStorage.getItem("ferrograph-token") || "", thread: params.get("thread") || "",
  workflow: params.get("workflow") || "tutor", busy: false, subjectSent: "" };

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null) e.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
  return e;
}

function headers(json) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  if (chat.token) h["Authorization"] = "Bearer " + chat.token;
  return h;
}

async function api(method, path, body) {
  const resp = await fetch(path, { method, headers: headers(body !== undefined), body: body === undefined ? undefined : JSON.stringify(body) });
  if (resp.status === 401) $("token-form").classList.remove("hidden");
  const text = await resp.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (_) { data = null; }
  if (!resp.ok) throw new Error((data && data.error && data.error.message) || resp.statusText);
  return data;
}

// Hides <thinking>…</thinking> and drops <answer> tags from streamed pieces (tags may be split).
function thinkingFilter() {
  let buf = "", inside = false;
  const tags = ["<thinking>", "</thinking>", "<answer>", "</answer>"];
  return (piece) => {
    buf += piece;
    let out = "";
    for (;;) {
      const lt = buf.indexOf("<");
      if (lt < 0) { if (!inside) out += buf; buf = ""; return out; }
      if (!inside) out += buf.slice(0, lt);
      const rest = buf.slice(lt);
      const tag = tags.find((t) => rest.startsWith(t));
      if (tag) { if (tag === "<thinking>") inside = true; if (tag === "</thinking>") inside = false; buf = rest.slice(tag.length); continue; }
      if (tags.some((t) => t.startsWith(rest))) { buf = rest; return out; }
      if (!inside) out += "<";
      buf = rest.slice(1);
    }
  };
}

function bubble(role, text) {
  const li = el("li", { class: role, "data-role": role }, text || "");
  $("chat-log").append(li);
  li.scrollIntoView({ block: "end" });
  return li;
}

const STATUS = { rag_search: "searching the course notes…", get_guia: "reading the course guide…",
  test_session: "preparing the quiz…", tool_error: "a tool the tutor does not have…" };

// Posts a run with streaming and calls onEvent(kind, data) for each event.
async function streamRun(body, onEvent) {
  const resp = await fetch("/threads/" + encodeURIComponent(chat.thread) + "/runs", {
    method: "POST", headers: headers(true),
    body: JSON.stringify({ ...body, stream: true, stream_mode: ["tokens", "tasks"] }),
  });
  if (!resp.ok) {
    let msg = resp.statusText;
    try { const d = await resp.json(); msg = d.error.message; } catch (_) { /* keep the status text */ }
    throw new Error(msg);
  }
  await readSse(resp, (kind, text) => {
    let parsed = null;
    try { parsed = JSON.parse(text); } catch (_) { parsed = text; }
    onEvent(kind, parsed);
  });
}

function lastAnswer(values) {
  const msgs = (values && values.messages) || [];
  const last = msgs[msgs.length - 1];
  return last && last.role === "ai" && !(last.tool_calls || []).length ? last : null;
}

// One run: a new message or a quiz answer. The streamed text is replaced by the final answer
// (the tutor may have replaced an unreliable answer by the course material).
async function run(body, human) {
  if (chat.busy) return;
  chat.busy = true;
  $("chat-send").disabled = true;
  $("chat-status").textContent = "";
  if (human) bubble("human", human);
  const ai = bubble("ai", "");
  ai.dataset.tokens = "0";
  const filter = thinkingFilter();
  let failed = null;
  try {
    await streamRun(body, (kind, d) => {
      if (kind === "token") {
        ai.textContent += filter(d.text || "");
        ai.dataset.tokens = String(Number(ai.dataset.tokens) + 1);
        ai.scrollIntoView({ block: "end" });
      } else if (kind === "task_start" && STATUS[d.node]) {
        $("chat-status").textContent = STATUS[d.node];
      } else if (kind === "error") {
        failed = (d && d.error && d.error.message) || JSON.stringify(d);
      }
    });
  } catch (e) { failed = e.message; }
  $("chat-status").textContent = "";
  if (failed) {
    ai.remove();
    bubble("error", "error: " + failed);
  }
  await refresh(ai);
  chat.busy = false;
  $("chat-send").disabled = false;
  $("chat-input").focus();
}

async function refresh(ai) {
  if (!chat.thread) return;
  let snap;
  try { snap = await api("GET", "/threads/" + encodeURIComponent(chat.thread) + "/state"); }
  catch (e) { bubble("error", "error: " + e.message); return; }
  const quiz = (snap.interrupts || []).find((i) => i.value && i.value.action === "answer_question");
  if (ai && ai.isConnected) {
    const last = lastAnswer(snap.values);
    if (quiz) ai.remove();
    else if (last) { ai.textContent = last.content; ai.dataset.final = "true"; }
    else if (!ai.textContent) ai.remove();
  }
  showQuiz(quiz ? quiz.value : null);
}

function showQuiz(q) {
  const box = $("chat-quiz");
  if (!q) { box.classList.add("hidden"); box.replaceChildren(); return; }
  box.classList.remove("hidden");
  const parts = [];
  if (q.feedback) parts.push(el("p", { class: "feedback", "data-feedback": "" }, q.feedback));
  if (q.invalid_answer) parts.push(el("p", { class: "error small" }, q.invalid_answer));
  parts.push(el("h2", {}, `Question ${q.question_num} of ${q.total_questions}`));
  parts.push(el("p", { class: "question" }, q.question_text));
  const opts = el("div", { class: "options" });
  for (const o of q.options || []) {
    const letter = o.slice(0, 1);
    opts.append(el("button", { type: "button", "data-letter": letter, onclick: () => {
      for (const b of opts.querySelectorAll("button")) b.disabled = true;
      run({ command: { resume: letter } }, null);
    } }, o));
  }
  parts.push(opts);
  box.replaceChildren(...parts);
  box.dataset.question = String(q.question_num);
}

async function send(ev) {
  ev.preventDefault();
  const text = $("chat-input").value.trim();
  if (!text || chat.busy) return;
  const subject = $("chat-subject").value.trim();
  try {
    if (!chat.thread) {
      const t = await api("POST", "/threads", { workflow: chat.workflow });
      chat.thread = t.thread_id;
      $("chat-thread").textContent = chat.thread;
      history.replaceState(null, "", "?workflow=" + encodeURIComponent(chat.workflow) + "&thread=" + encodeURIComponent(chat.thread));
    }
  } catch (e) { bubble("error", "error: " + e.message); return; }
  const input = { message: text };
  if (subject && subject !== chat.subjectSent) { input.subject = subject; }
  $("chat-input").value = "";
  showQuiz(null);
  await run({ input }, text);
  chat.subjectSent = subject;
}

async function loadThread() {
  $("chat-thread").textContent = chat.thread || "new";
  if (!chat.thread) return;
  try {
    const snap = await api("GET", "/threads/" + encodeURIComponent(chat.thread) + "/state");
    const v = snap.values || {};
    if (v.subject) { $("chat-subject").value = v.subject; chat.subjectSent = v.subject; }
    for (const m of v.messages || []) {
      if (m.role === "human") bubble("human", m.content);
      else if (m.role === "ai" && !(m.tool_calls || []).length && m.content) bubble("ai", m.content);
    }
    const quiz = (snap.interrupts || []).find((i) => i.value && i.value.action === "answer_question");
    showQuiz(quiz ? quiz.value : null);
  } catch (e) { bubble("error", "error: " + e.message); }
}

async function loadWorkflows() {
  try {
    const data = await api("GET", "/workflows");
    const sel = $("chat-workflow");
    sel.replaceChildren(...data.workflows.map((w) => el("option", { value: w.name }, w.name)));
    if (data.workflows.some((w) => w.name === chat.workflow)) sel.value = chat.workflow;
  } catch (e) { $("chat-status").textContent = e.message; }
}

document.addEventListener("DOMContentLoaded", () => {
  $("chat-form").addEventListener("submit", send);
  $("chat-workflow").addEventListener("change", () => { chat.workflow = $("chat-workflow").value; });
  $("chat-new").addEventListener("click", () => {
    chat.thread = ""; chat.subjectSent = "";
    $("chat-log").replaceChildren(); showQuiz(null);
    $("chat-thread").textContent = "new";
    history.replaceState(null, "", "?workflow=" + encodeURIComponent(chat.workflow));
  });
  $("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    chat.token = $("token").value.trim();
    sessionStorage.setItem("ferrograph-token", chat.token);
    $("token-form").classList.add("hidden");
    loadWorkflows(); loadThread();
  });
  loadWorkflows(); loadThread();
});
