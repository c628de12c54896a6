// ferrograph console: plain JavaScript, no dependencies.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { token: sessionStorage.getItem("ferrograph-token") || "", workflows: [], selected: null,
  source: null, reader: null, refreshTimer: null, busy: false };

// ---- helpers -------------------------------------------------------------------------------

function esc(s) {
  return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

// Inline Markdown on text that is already HTML-escaped: code spans, bold, italics.
function inline(s) {
  return s.split(/(`[^`]+`)/).map((part) => {
    if (part.length >= 2 && part.startsWith("`") && part.endsWith("`")) return "<code>" + part.slice(1, -1) + "</code>";
    return part.replace(/\*\*([^*]+)\*\*/g, "<strong>$1</strong>")
      .replace(/__([^_]+)__/g, "<strong>$1</strong>")
      .replace(/(^|[\s(])\*([^*\s][^*]*)\*/g, "$1<em>$2</em>");
  }).join("");
}

// A tiny, safe Markdown renderer: the source is escaped first, then only fixed tags are added.
// Headings, bullet and numbered lists, fenced code, inline code, bold, italics, paragraphs.
function markdown(src) {
  const lines = esc(src == null ? "" : src).split("\n");
  const out = [];
  let para = [], list = null, code = null;
  const flushPara = () => { if (para.length) { out.push("<p>" + inline(para.join(" ")) + "</p>"); para = []; } };
  const closeList = () => { if (list) { out.push("</" + list + ">"); list = null; } };
  for (const line of lines) {
    if (code !== null) {
      if (line.trim().startsWith("```")) { out.push("<pre><code>" + code.join("\n") + "</code></pre>"); code = null; }
      else code.push(line);
      continue;
    }
    if (line.trim().startsWith("```")) { flushPara(); closeList(); code = []; continue; }
    let m = /^(#{1,6})\s+(.*)$/.exec(line);
    if (m) { flushPara(); closeList(); const h = Math.min(m[1].length + 2, 6); out.push(`<h${h}>${inline(m[2])}</h${h}>`); continue; }
    m = /^\s*[-*+]\s+(.*)$/.exec(line);
    if (m) { flushPara(); if (list !== "ul") { closeList(); out.push("<ul>"); list = "ul"; } out.push("<li>" + inline(m[1]) + "</li>"); continue; }
    m = /^\s*\d+[.)]\s+(.*)$/.exec(line);
    if (m) { flushPara(); if (list !== "ol") { closeList(); out.push("<ol>"); list = "ol"; } out.push("<li>" + inline(m[1]) + "</li>"); continue; }
    if (!line.trim()) { flushPara(); closeList(); continue; }
    closeList();
    para.push(line.trim());
  }
  if (code !== null) out.push("<pre><code>" + code.join("\n") + "</code></pre>");
  flushPara(); closeList();
  return out.join("\n");
}

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

function ago(ms) {
  if (!ms) return "";
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 60) return s + "s ago";
  if (s < 3600) return Math.floor(s / 60) + "m ago";
  if (s < 86400) return Math.floor(s / 3600) + "h ago";
  return new Date(ms).toLocaleString();
}

function pill(status) { return el("span", { class: "pill pill-" + status, "data-status": status }, status); }

function headers(json) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  if (state.token) h["Authorization"] = "Bearer " + state.token;
  return h;
}

async function api(method, path, body) {
  const resp = await fetch(path, { method, headers: headers(body !== undefined), body: body === undefined ? undefined : JSON.stringify(body) });
  if (resp.status === 401) { $("token-form").classList.remove("hidden"); }
  if (resp.status === 204) return null;
  const text = await resp.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (_) { data = { error: { code: "bad_response", message: text } }; }
  if (!resp.ok) {
    const err = new Error((data && data.error && data.error.message) || resp.statusText);
    err.status = resp.status; err.code = data && data.error && data.error.code;
    throw err;
  }
  return data;
}

// ---- health and workflows ------------------------------------------------------------------

async function checkHealth() {
  const h = $("health");
  try { await api("GET", "/healthz"); h.textContent = "healthy"; h.className = "pill pill-ok"; }
  catch (_) { h.textContent = "unreachable"; h.className = "pill pill-down"; }
}

async function loadWorkflows() {
  try {
    const data = await api("GET", "/workflows");
    state.workflows = data.workflows;
    const sel = $("wf-select");
    sel.replaceChildren(...data.workflows.map((w) => el("option", { value: w.name }, w.name)));
    if (data.workflows.some((w) => w.name === "review")) sel.value = "review";
    onWorkflowChange();
  } catch (e) { $("run-msg").textContent = e.message; }
}

function onWorkflowChange() {
  const w = state.workflows.find((x) => x.name === $("wf-select").value);
  if (!w) return;
  $("wf-desc").textContent = w.description + " — nodes: " + w.nodes.join(", ");
  $("run-input").value = JSON.stringify(w.sample_input, null, 2);
}

// ---- threads -------------------------------------------------------------------------------

async function refreshThreads() {
  const status = $("status-filter").value;
  const q = "/threads?limit=200" + (status ? "&status=" + encodeURIComponent(status) : "");
  try {
    const data = await api("GET", q);
    const rows = data.threads.map((t) => {
      const tr = el("tr", { "data-thread": t.thread_id, onclick: () => selectThread(t.thread_id) },
        el("td", { class: "mono", title: t.thread_id }, t.thread_id.length > 14 ? t.thread_id.slice(0, 12) + "…" : t.thread_id),
        el("td", {}, t.workflow),
        el("td", {}, pill(t.active ? "running" : t.run_status)),
        el("td", { class: "muted small" }, ago(t.updated_at_ms)));
      if (t.thread_id === state.selected) tr.classList.add("selected");
      return tr;
    });
    $("thread-rows").replaceChildren(...rows);
    $("thread-count").textContent = data.total > data.threads.length
      ? `showing ${data.threads.length} of ${data.total}` : `${data.total} thread${data.total === 1 ? "" : "s"}`;
  } catch (e) { $("thread-count").textContent = "could not list threads: " + e.message; }
}

function scheduleRefresh() {
  clearInterval(state.refreshTimer);
  if ($("auto-refresh").checked) state.refreshTimer = setInterval(() => { refreshThreads(); if (state.selected) refreshDetail(); }, 2000);
}

// ---- thread detail -------------------------------------------------------------------------

async function selectThread(id) {
  state.selected = id;
  for (const tr of document.querySelectorAll("#thread-rows tr")) tr.classList.toggle("selected", tr.dataset.thread === id);
  $("empty").classList.add("hidden");
  $("detail").classList.remove("hidden");
  $("events").replaceChildren();
  openEvents(id);
  await refreshDetail();
}

// Refreshes overlap (the poll, a run's end event, a resume): only the newest may write, so a
// slow older one cannot put a stale state under a newer status. The thread is read first and
// its state after (so the state is at least as new as the status), and both are shown together.
async function refreshDetail() {
  const id = state.selected;
  if (!id) return;
  const gen = state.detailGen = (state.detailGen || 0) + 1;
  const stale = () => id !== state.selected || gen !== state.detailGen;
  let t;
  try { t = await api("GET", "/threads/" + encodeURIComponent(id)); }
  catch (e) { if (!stale()) $("d-meta").textContent = e.message; return; }
  if (stale()) return;
  let snap, hist, failure = null;
  try {
    [snap, hist] = await Promise.all([
      api("GET", "/threads/" + encodeURIComponent(id) + "/state"),
      api("GET", "/threads/" + encodeURIComponent(id) + "/history?limit=50"),
    ]);
  } catch (e) { failure = e; }
  if (stale()) return;
  renderThread(t);
  refreshGraph(id);
  if (failure) { $("d-state").textContent = failure.message; return; }
  $("d-state").textContent = JSON.stringify(snap.values, null, 2);
  $("history-rows").replaceChildren(...hist.history.map((h) => el("tr", {},
    el("td", {}, h.step), el("td", {}, typeof h.source === "string" ? h.source : JSON.stringify(h.source)),
    el("td", { class: "mono" }, h.writers.join(", ")), el("td", { class: "mono" }, h.next.join(", ")),
    el("td", { class: "muted small" }, ago(h.created_at_ms)))));
}

// The thread's graph as inline SVG (the server draws it with the node that runs or waits now
// and the path taken highlighted); parsed as SVG, never as HTML.
async function refreshGraph(id) {
  try {
    const resp = await fetch("/threads/" + encodeURIComponent(id) + "/graph?format=svg", { headers: headers(false) });
    if (!resp.ok || id !== state.selected) return;
    // The picture's own <style> is for the file on its own; here console.css styles it (the
    // page's Content-Security-Policy allows no inline styles, parsed ones included).
    const text = (await resp.text()).replace(/<style>[\s\S]*?<\/style>/g, "");
    const doc = new DOMParser().parseFromString(text, "image/svg+xml");
    const svg = doc.documentElement;
    if (svg.nodeName !== "svg") return;
    $("d-graph").replaceChildren(document.importNode(svg, true));
  } catch (_) { /* the picture is optional */ }
}

function renderThread(t) {
  const status = t.active ? "running" : t.run_status;
  $("d-title").textContent = t.thread_id;
  const p = $("d-status"); p.textContent = status; p.className = "pill pill-" + status; p.dataset.status = status;
  $("d-meta").textContent = `workflow ${t.workflow} · created ${ago(t.created_at_ms)} · updated ${ago(t.updated_at_ms)}` +
    (t.last_checkpoint_id ? ` · checkpoint ${t.last_checkpoint_id}` : "");
  const err = $("d-error");
  err.textContent = t.error || ""; err.classList.toggle("hidden", !t.error);
  const key = JSON.stringify(t.pending_interrupts.map((i) => i.id)) + status;
  const box = $("interrupts");
  if (box.dataset.key === key) return; // keep what the reviewer is typing
  box.dataset.key = key;
  if (status === "orphaned") { box.replaceChildren(renderOrphaned(t)); return; }
  box.replaceChildren(...(status === "interrupted" ? t.pending_interrupts.map((i) => renderInterrupt(t, i)) : []));
}

// A run whose process ended mid-run: it continues from its last checkpoint.
function renderOrphaned(thread) {
  const card = el("div", { class: "card interrupt", "data-orphaned": thread.thread_id });
  card.append(el("div", { class: "card-head" }, el("h2", {}, "Stopped mid-run"), el("span", { class: "pill pill-orphaned" }, "orphaned")));
  card.append(el("p", { class: "small muted" }, "The process running this thread ended before the run did. Continue runs it on from its last checkpoint; finished steps are not run again."));
  const msg = el("span", { class: "small" });
  const button = el("button", { class: "approve", "data-choice": "continue", onclick: async () => {
    button.disabled = true; msg.textContent = "continuing…"; msg.className = "small muted";
    try {
      const out = await api("POST", "/threads/" + encodeURIComponent(thread.thread_id) + "/runs", {});
      msg.textContent = "run " + out.status;
    } catch (e) { msg.textContent = e.message; msg.className = "small error"; button.disabled = false; }
    refreshThreads(); refreshDetail();
  } }, "Continue");
  card.append(el("div", { class: "actions" }, button, msg));
  return card;
}

const MARKDOWN_FIELDS = ["summary", "question", "description", "markdown", "body", "draft", "message"];
// Fields an interrupt card shows in their own way (or not at all: `prompt` repeats `summary`).
const SPECIAL_FIELDS = ["title", "choices", "diff", "prompt", "feedback_placeholder"];

// ---- unified diffs, with light syntax colouring of the code ---------------------------------

const KEYWORDS = new Set(("abstract async await boolean break case catch class const continue def default do " +
  "double else enum export extends false final fn for from function if impl implements import in int interface " +
  "let long match mod new null package private protected public pub record return self static struct super " +
  "switch this throw throws true try type use var void while").split(" "));
const TOKEN = /("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|\/\/.*$|@[A-Za-z_]+|\b[A-Za-z_][A-Za-z0-9_]*\b)/g;

function highlightInto(parent, code) {
  let last = 0;
  for (const m of code.matchAll(TOKEN)) {
    if (m.index > last) parent.append(code.slice(last, m.index));
    const t = m[0];
    const cls = t.startsWith("//") ? "tok-comment" : t[0] === '"' || t[0] === "'" ? "tok-string"
      : t[0] === "@" ? "tok-annotation" : KEYWORDS.has(t) ? "tok-kw" : null;
    parent.append(cls ? el("span", { class: cls }, t) : t);
    last = m.index + t.length;
  }
  if (last < code.length) parent.append(code.slice(last));
}

function renderDiff(text) {
  const pre = el("pre", { class: "diff", "data-field": "diff" });
  for (const line of text.replace(/\n$/, "").split("\n")) {
    let cls = "ctx";
    if (/^(diff --git|index |--- |\+\+\+ |new file mode|deleted file mode)/.test(line)) cls = "meta";
    else if (line.startsWith("@@")) cls = "hunk";
    else if (line.startsWith("+")) cls = "add";
    else if (line.startsWith("-")) cls = "del";
    const span = el("span", { class: "line " + cls });
    if (cls === "add" || cls === "del" || cls === "ctx") { span.append(line.slice(0, 1)); highlightInto(span, line.slice(1)); }
    else span.append(line);
    pre.append(span);
  }
  return pre;
}

function renderInterrupt(thread, intr) {
  const v = intr.value;
  const card = el("div", { class: "card interrupt", "data-interrupt": intr.id });
  const title = v && typeof v === "object" && v.title ? v.title : "Waiting for input";
  card.append(el("div", { class: "card-head" }, el("h2", {}, title), el("span", { class: "pill pill-interrupted" }, "interrupt · " + intr.node)));
  if (v && typeof v === "object" && !Array.isArray(v)) {
    const dl = el("dl", { class: "kv" });
    for (const [k, val] of Object.entries(v)) {
      if (SPECIAL_FIELDS.includes(k) || MARKDOWN_FIELDS.includes(k)) continue;
      // A review with a diff lists its files and warnings in its summary already.
      if (typeof v.diff === "string" && (k === "files" || k === "warnings")) continue;
      // With a summary, structured fields are what it summarises: only plain values are listed.
      if (typeof v.summary === "string" && val !== null && typeof val === "object") continue;
      dl.append(el("dt", {}, k), el("dd", {}, typeof val === "string" ? val : JSON.stringify(val)));
    }
    if (dl.childElementCount) card.append(dl);
    for (const k of MARKDOWN_FIELDS) {
      if (typeof v[k] === "string") { const md = el("div", { class: "md" }); md.innerHTML = markdown(v[k]); card.append(md); }
    }
    if (typeof v.diff === "string" && v.diff) card.append(renderDiff(v.diff));
  } else {
    const md = el("div", { class: "md" }); md.innerHTML = markdown(typeof v === "string" ? v : JSON.stringify(v, null, 2)); card.append(md);
  }
  const msg = el("span", { class: "small" });
  const resume = async (value, buttons) => {
    buttons.forEach((b) => (b.disabled = true));
    msg.textContent = "resuming…"; msg.className = "small muted";
    const addressed = thread.pending_interrupts.length > 1 ? { [intr.id]: value } : value;
    try {
      const out = await api("POST", "/threads/" + encodeURIComponent(thread.thread_id) + "/runs", { command: { resume: addressed } });
      msg.textContent = "run " + out.status;
    } catch (e) { msg.textContent = e.message; msg.className = "small error"; buttons.forEach((b) => (b.disabled = false)); }
    refreshThreads(); refreshDetail();
  };
  const choices = v && Array.isArray(v.choices) ? v.choices : null;
  const actions = el("div", { class: "actions" });
  if (choices) {
    const buttons = [];
    const hint = v && typeof v.feedback_placeholder === "string" ? v.feedback_placeholder : "feedback for a revision";
    const fb = el("textarea", { rows: 1, placeholder: hint, "aria-label": "feedback" });
    for (const c of choices) {
      if (c === "feedback") continue;
      const cls = c === "approve" ? "approve" : c === "reject" ? "reject" : "";
      buttons.push(el("button", { class: cls, "data-choice": c, onclick: () => resume(c, buttons) }, c[0].toUpperCase() + c.slice(1)));
    }
    if (choices.includes("feedback")) {
      buttons.push(el("button", { "data-choice": "feedback", onclick: () => {
        if (!fb.value.trim()) { msg.textContent = "write some feedback first"; return; }
        resume({ feedback: fb.value.trim() }, buttons);
      } }, "Send feedback"));
      actions.append(...buttons.slice(0, -1), fb, buttons[buttons.length - 1]);
    } else actions.append(...buttons);
  } else {
    const ta = el("textarea", { rows: 2, placeholder: "resume value (JSON)", "aria-label": "resume value", spellcheck: "false" });
    const buttons = [];
    buttons.push(el("button", { class: "primary", onclick: () => {
      let val; try { val = JSON.parse(ta.value); } catch (_) { val = ta.value; }
      resume(val, buttons);
    } }, "Resume"));
    actions.append(ta, ...buttons);
  }
  actions.append(msg);
  card.append(actions);
  return card;
}

// ---- live events ---------------------------------------------------------------------------

const EVENT_KINDS = ["thread", "run_start", "values", "updates", "custom", "token", "task_start", "task_end", "tool", "checkpoint", "interrupt", "end", "error", "lagged"];

function summarize(kind, data) {
  const d = data && data.data !== undefined && data.kind ? data.data : data;
  switch (kind) {
    case "thread": return `status ${d.active ? "running" : d.run_status}`;
    case "run_start": return "run started";
    case "task_start": return `${d.node} (step ${d.step}, attempt ${d.attempt})`;
    case "task_end": return `${d.node} ${typeof d.outcome === "string" ? d.outcome : "error: " + (d.outcome.error || "")} in ${Number(d.duration_ms).toFixed(2)} ms`;
    case "updates": return `${d.node}: ${JSON.stringify(Object.fromEntries(Object.entries(d.update || {}).filter(([, v]) => v !== null)))}`;
    case "interrupt": return (d.interrupts || []).map((i) => `${i.node} asks (${i.id.slice(0, 8)})`).join("; ");
    case "token": return `${d.model}: ${d.text}`;
    case "end": return `run ${d.status}`;
    case "error": return d.error ? d.error.message : JSON.stringify(d);
    default: return JSON.stringify(d);
  }
}

function addEvent(kind, text) {
  let data = null;
  try { data = JSON.parse(text); } catch (_) { data = text; }
  const list = $("events");
  const body = (() => { try { return summarize(kind, data); } catch (_) { return text; } })();
  list.append(el("li", { "data-kind": kind }, el("span", { class: "kind kind-" + kind }, kind), el("span", { class: "body" }, body)));
  while (list.childElementCount > 300) list.firstElementChild.remove();
  list.scrollTop = list.scrollHeight;
  if (kind === "task_start") refreshGraph(state.selected);
  if (kind === "end" || kind === "error" || kind === "interrupt") { refreshDetail(); refreshThreads(); }
}

function closeEvents() {
  if (state.source) { state.source.close(); state.source = null; }
  if (state.reader) { state.reader.abort(); state.reader = null; }
}

function openEvents(id) {
  closeEvents();
  const url = "/threads/" + encodeURIComponent(id) + "/events";
  $("ev-state").textContent = "connecting…";
  if (!state.token) {
    const src = new EventSource(url);
    state.source = src;
    src.onopen = () => { $("ev-state").textContent = "live"; };
    src.onerror = () => { $("ev-state").textContent = "reconnecting…"; };
    for (const k of EVENT_KINDS) src.addEventListener(k, (e) => addEvent(k, e.data));
    return;
  }
  // EventSource cannot send a bearer token: read the stream with fetch instead.
  const ctl = new AbortController();
  state.reader = ctl;
  (async () => {
    try {
      const resp = await fetch(url, { headers: headers(false), signal: ctl.signal });
      if (!resp.ok) { $("ev-state").textContent = "events: HTTP " + resp.status; return; }
      $("ev-state").textContent = "live";
      await readSse(resp, addEvent);
      $("ev-state").textContent = "closed";
    } catch (e) { if (e.name !== "AbortError") $("ev-state").textContent = "events: " + e.message; }
  })();
}

// ---- new run -------------------------------------------------------------------------------

async function startRun(ev) {
  ev.preventDefault();
  const msg = $("run-msg");
  let input;
  try { input = JSON.parse($("run-input").value || "{}"); }
  catch (e) { msg.textContent = "input is not JSON: " + e.message; msg.className = "small error"; return; }
  const body = { workflow: $("wf-select").value };
  const tid = $("run-thread").value.trim();
  if (tid) body.thread_id = tid;
  $("run-start").disabled = true;
  msg.textContent = "starting…"; msg.className = "small muted";
  try {
    const t = await api("POST", "/threads", body);
    await selectThread(t.thread_id);
    const out = await api("POST", "/threads/" + encodeURIComponent(t.thread_id) + "/runs", { input });
    msg.textContent = `${t.thread_id.slice(0, 12)}: ${out.status}`; msg.className = "small";
    $("run-thread").value = "";
  } catch (e) { msg.textContent = e.message; msg.className = "small error"; }
  finally { $("run-start").disabled = false; refreshThreads(); refreshDetail(); }
}

// ---- start ---------------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("wf-select").addEventListener("change", onWorkflowChange);
  $("run-form").addEventListener("submit", startRun);
  $("status-filter").addEventListener("change", refreshThreads);
  $("auto-refresh").addEventListener("change", scheduleRefresh);
  $("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    state.token = $("token").value.trim();
    sessionStorage.setItem("ferrograph-token", state.token);
    $("token-form").classList.add("hidden");
    loadWorkflows(); refreshThreads();
    if (state.selected) selectThread(state.selected);
  });
  checkHealth(); setInterval(checkHealth, 10000);
  loadWorkflows(); refreshThreads(); scheduleRefresh();
});
