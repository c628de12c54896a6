//! Runs of the Agent Server API: started in the background, waited for, streamed, joined,
//! cancelled and listed.
//!
//! A run is admitted like one of ours (the thread is claimed, its input checked, paths
//! confined; a refusal is an HTTP error before anything runs), then driven by the same
//! machinery, and every event it makes is kept on its [`RunSlot`] in every stream mode, so
//! that the client that started it, a client that joins later and one that reconnects with
//! `Last-Event-ID` all read the same sequence. Runs are kept in memory (the last
//! [`KEEP_RUNS`]); the threads they ran on, and their checkpoints, are on disk.
//!
//! Events are bounded by [`EventRetention`](crate::EventRetention): each run keeps at most
//! `per_run_bytes` of them (its oldest dropped first), and all runs together at most
//! `total_bytes` (the events of the oldest finished runs dropped first, then the oldest
//! events of running ones). A stream that asks for dropped events starts with a `dropped`
//! event saying how many were dropped and where what is kept begins (also in the
//! `X-Ferrograph-Events-Dropped` header), and a run's record says what it keeps
//! (`events`). Finished runs' results count too: when dropping every event is not enough,
//! the results of runs finished longer than `result_grace` ago go, and joining such a run
//! answers 410 `run_result_dropped`. The thread's checkpoints keep every step either way.

use super::assistants::Assistant;
use super::stream::{Converter, SseItem, MODES};
use super::threads::interrupt_json;
use super::{iso, metadata_in, unsupported};
use crate::api::{entry_of, load_thread, reconcile, run_input, RunCommand};
use crate::error::{ApiError, ApiJson};
use crate::runs::{lock, start_claimed, ActiveGuard, RunOptions};
use crate::AppState;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ferrograph::core::id::now_millis;
use ferrograph::runtime::JsonOutcome;
use ferrograph::{CancelHandle, Interrupt, StreamMode, StreamModes, ThreadInfo, ThreadStatus};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// The thread metadata key holding the last Agent Server API run started on the thread.
pub(crate) const RUN_KEY: &str = "ferrograph.run";

/// Runs remembered by the server (finished ones beyond this are forgotten, oldest first).
pub(crate) const KEEP_RUNS: usize = 2_000;
/// Events kept per run for joining clients, whatever their size (older ones are dropped
/// first).
const KEEP_EVENTS: usize = 50_000;
/// What one kept event costs besides its text: the item, its `Arc` and its queue slot.
const EVENT_OVERHEAD_BYTES: usize = 96;

/// The runs this server started, and the bytes their kept events hold.
#[derive(Default)]
pub(crate) struct RunTable {
    runs: Mutex<VecDeque<Arc<RunSlot>>>,
    /// Bytes of events kept by every run (shared with each slot, which adds and subtracts
    /// its own).
    held: Arc<AtomicUsize>,
    /// The caps.
    pub(crate) retention: crate::EventRetention,
}

impl RunTable {
    /// Bytes of events kept now, over all runs.
    pub(crate) fn held_bytes(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }
}

#[derive(Default)]
struct SlotState {
    status: &'static str,
    updated_at_ms: u64,
    events: VecDeque<Arc<SseItem>>,
    /// Bytes the kept events hold (counted as [`event_bytes`]).
    event_bytes: usize,
    /// Events dropped from the front.
    dropped: usize,
    /// A run rebuilt from its thread's record after a restart: its events are gone.
    events_lost: bool,
    finished: bool,
    /// What `wait` and `join` answer, as JSON text: the state's values (with
    /// `__interrupt__`), or `{"__error__": …}`; `None` before the run finishes and after
    /// the total cap made the server drop it.
    result: Option<Arc<str>>,
    /// When the run finished (ms since the epoch).
    finished_at_ms: u64,
}

impl SlotState {
    /// Bytes this run holds in the table's count: its kept events and its result.
    fn held_bytes(&self) -> usize {
        self.event_bytes + self.result.as_ref().map_or(0, |r| r.len())
    }
}

/// One run: its record and its events.
pub(crate) struct RunSlot {
    pub(crate) run_id: String,
    pub(crate) thread_id: String,
    assistant_id: String,
    created_at_ms: u64,
    metadata: Value,
    multitask_strategy: String,
    kwargs: Value,
    modes: Vec<String>,
    subgraphs: bool,
    cancel: CancelHandle,
    state: Mutex<SlotState>,
    changed: watch::Sender<u64>,
    /// The table's count of bytes held, which this slot's events are part of.
    held: Arc<AtomicUsize>,
    /// Most bytes of events this run keeps.
    keep_bytes: usize,
}

/// What an event costs to keep.
fn event_bytes(item: &SseItem) -> usize {
    item.data.len() + item.ns.len() + EVENT_OVERHEAD_BYTES
}

impl Drop for RunSlot {
    fn drop(&mut self) {
        let bytes = lock(&self.state).held_bytes();
        self.held.fetch_sub(bytes, Ordering::Relaxed);
    }
}

impl RunSlot {
    fn view(&self) -> Value {
        let s = lock(&self.state);
        json!({
            "run_id": self.run_id,
            "thread_id": self.thread_id,
            "assistant_id": self.assistant_id,
            "created_at": iso(self.created_at_ms),
            "updated_at": iso(s.updated_at_ms),
            "status": s.status,
            "metadata": self.metadata,
            "multitask_strategy": self.multitask_strategy,
            "kwargs": self.kwargs,
            "events": {
                "kept": s.events.len(),
                "dropped": s.dropped,
                "kept_bytes": s.event_bytes,
                "result_bytes": s.result.as_ref().map_or(0, |r| r.len()),
                "result_kept": !s.finished || s.result.is_some(),
                "lost": s.events_lost,
            },
        })
    }

    fn status(&self) -> &'static str {
        lock(&self.state).status
    }

    fn set_status(&self, status: &'static str) {
        let mut s = lock(&self.state);
        s.status = status;
        s.updated_at_ms = now_millis();
        drop(s);
        self.changed.send_modify(|n| *n += 1);
    }

    /// Keeps `item`, dropping this run's oldest events beyond its caps (the newest event is
    /// always kept).
    fn push(&self, item: SseItem) {
        let mut s = lock(&self.state);
        let bytes = event_bytes(&item);
        s.events.push_back(Arc::new(item));
        s.event_bytes += bytes;
        self.held.fetch_add(bytes, Ordering::Relaxed);
        while s.events.len() > 1
            && (s.events.len() > KEEP_EVENTS || s.event_bytes > self.keep_bytes)
        {
            Self::drop_front(&mut s, &self.held);
        }
        drop(s);
        self.changed.send_modify(|n| *n += 1);
    }

    fn drop_front(s: &mut SlotState, held: &AtomicUsize) {
        if let Some(old) = s.events.pop_front() {
            let bytes = event_bytes(&old);
            s.event_bytes -= bytes;
            s.dropped += 1;
            held.fetch_sub(bytes, Ordering::Relaxed);
        }
    }

    /// Drops this run's oldest events until the table holds at most `cap` bytes or the run
    /// keeps none (`keep_last`: one, for a running run, so that a joining client sees where
    /// it is).
    fn shed(&self, cap: usize, keep_last: bool) {
        let floor = usize::from(keep_last);
        let mut s = lock(&self.state);
        while s.events.len() > floor && self.held.load(Ordering::Relaxed) > cap {
            Self::drop_front(&mut s, &self.held);
        }
    }

    /// Drops a finished run's result (after its events) when the table is still over `cap`
    /// and the run finished more than `grace_ms` ago.
    fn shed_result(&self, cap: usize, now_ms: u64, grace_ms: u64) {
        let mut s = lock(&self.state);
        if !s.finished
            || !s.events.is_empty()
            || now_ms.saturating_sub(s.finished_at_ms) < grace_ms
            || self.held.load(Ordering::Relaxed) <= cap
        {
            return;
        }
        if let Some(text) = s.result.take() {
            self.held.fetch_sub(text.len(), Ordering::Relaxed);
        }
    }

    fn finish(&self, status: &'static str, result: &Value) {
        let text: Arc<str> = Arc::from(result.to_string());
        let mut s = lock(&self.state);
        s.status = status;
        self.held.fetch_add(text.len(), Ordering::Relaxed);
        s.result = Some(text);
        s.finished = true;
        s.updated_at_ms = now_millis();
        s.finished_at_ms = s.updated_at_ms;
        drop(s);
        self.changed.send_modify(|n| *n += 1);
    }

    /// Marks a run rebuilt from its thread's record finished, with `result`, and as having
    /// lost every event it made (the process that kept them is gone).
    fn finish_recovered(&self, status: &'static str, result: &Value) {
        let running = status == "running";
        let mut s = lock(&self.state);
        s.status = status;
        s.result = (!running).then(|| Arc::<str>::from(result.to_string()));
        self.held.fetch_add(s.held_bytes(), Ordering::Relaxed);
        s.finished = !running;
        s.finished_at_ms = s.updated_at_ms;
        s.events_lost = true;
    }

    /// Whether the run's events went with the process that ran it.
    fn events_lost(&self) -> bool {
        lock(&self.state).events_lost
    }

    fn is_finished(&self) -> bool {
        lock(&self.state).finished
    }

    /// How many events have been dropped from the front.
    fn dropped(&self) -> usize {
        lock(&self.state).dropped
    }

    /// Events from index `from` on (absolute, counting dropped ones), and whether the run has
    /// finished.
    fn events_from(&self, from: usize) -> (usize, Vec<Arc<SseItem>>, bool) {
        let s = lock(&self.state);
        let start = from.max(s.dropped);
        let items: Vec<Arc<SseItem>> = s.events.iter().skip(start - s.dropped).cloned().collect();
        (start, items, s.finished)
    }

    /// Waits for the run to finish and answers its result as JSON, or a 410 when the caps
    /// made the server drop it.
    async fn finished(&self) -> Result<Response, ApiError> {
        let mut rx = self.changed.subscribe();
        loop {
            {
                let s = lock(&self.state);
                if s.finished {
                    return self.result_response(&s);
                }
            }
            if rx.changed().await.is_err() {
                return self.result_response(&lock(&self.state));
            }
        }
    }

    fn result_response(&self, s: &SlotState) -> Result<Response, ApiError> {
        match &s.result {
            Some(text) => Ok((
                [(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                )],
                text.to_string(),
            )
                .into_response()),
            None => Err(ApiError::new(
                StatusCode::GONE,
                "run_result_dropped",
                format!(
                    "run `{}` finished ({}), but its result was dropped to keep the server's \
                     run memory within --keep-events-mib; the thread's state is at \
                     GET /threads/{}/state",
                    self.run_id, s.status, self.thread_id
                ),
            )),
        }
    }

    fn request_cancel(&self) {
        self.cancel.cancel();
    }
}

impl AppState {
    fn remember_run(&self, slot: Arc<RunSlot>) {
        let mut runs = lock(&self.inner.agent_runs.runs);
        runs.push_back(slot);
        while runs.len() > KEEP_RUNS {
            match runs.iter().position(|r| r.is_finished()) {
                Some(i) => {
                    runs.remove(i);
                }
                None => break,
            }
        }
    }

    /// Keeps the bytes of all runs' events under the total cap: the oldest finished runs'
    /// events go first, then the oldest events of running runs.
    fn shed_events(&self) {
        let table = &self.inner.agent_runs;
        let cap = table.retention.total_bytes;
        if table.held_bytes() <= cap {
            return;
        }
        let runs: Vec<Arc<RunSlot>> = lock(&table.runs).iter().cloned().collect();
        for finished in [true, false] {
            for r in runs.iter().filter(|r| r.is_finished() == finished) {
                if table.held_bytes() <= cap {
                    return;
                }
                r.shed(cap, !finished);
            }
        }
        let now = now_millis();
        let grace = u64::try_from(table.retention.result_grace.as_millis()).unwrap_or(u64::MAX);
        for r in &runs {
            if table.held_bytes() <= cap {
                return;
            }
            r.shed_result(cap, now, grace);
        }
    }

    fn find_run(&self, thread: &str, run: &str) -> Result<Arc<RunSlot>, ApiError> {
        lock(&self.inner.agent_runs.runs)
            .iter()
            .find(|r| r.run_id == run && r.thread_id == thread)
            .cloned()
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::NOT_FOUND,
                    "run_not_found",
                    format!("thread `{thread}` has no run `{run}` on this server"),
                )
            })
    }

    /// The run from this server's memory, or else the thread's last run as its record left
    /// it: a server restarted after it was killed during a run still answers for that run
    /// (`error`, saying how to continue the thread) and for the thread's last finished one.
    async fn find_or_recover_run(&self, thread: &str, run: &str) -> Result<Arc<RunSlot>, ApiError> {
        let missing = match self.find_run(thread, run) {
            Ok(slot) => return Ok(slot),
            Err(e) => e,
        };
        let Some(info) = self.inner.saver.get_thread(thread).await? else {
            return Err(missing);
        };
        let info = reconcile(self, info).await;
        match self.recovered_run(&info).await {
            Some(slot) if slot.run_id == run => Ok(slot),
            _ => Err(missing),
        }
    }

    /// The thread's last run rebuilt from its record, when this server does not remember it.
    async fn recovered_run(&self, info: &ThreadInfo) -> Option<Arc<RunSlot>> {
        let record: Value = serde_json::from_str(info.metadata.get(RUN_KEY)?).ok()?;
        let run_id = record["run_id"].as_str()?.to_string();
        if self.find_run(&info.thread_id, &run_id).is_ok() {
            return None;
        }
        let thread = &info.thread_id;
        let orphaned = ferrograph::runtime::owner::is_orphaned(info, self.is_active(thread));
        let (status, result) = if orphaned {
            let err = json!({
                "error": "server_stopped",
                "message": format!(
                    "the server stopped during this run; POST /threads/{thread}/runs with the \
                     same assistant and no input continues the thread from its last checkpoint"
                ),
            });
            ("error", json!({ "__error__": err }))
        } else {
            match info.status {
                ThreadStatus::Running => ("running", json!({})),
                ThreadStatus::Failed => {
                    let message = info.error.clone().unwrap_or_default();
                    let err = json!({ "error": "run_failed", "message": message });
                    ("error", json!({ "__error__": err }))
                }
                ThreadStatus::Interrupted => {
                    let values = super::threads::current_values(self, info).await;
                    ("interrupted", with_interrupts(values, &info.interrupts))
                }
                _ => ("success", super::threads::current_values(self, info).await),
            }
        };
        let (changed, _) = watch::channel(0);
        let slot = Arc::new(RunSlot {
            run_id,
            thread_id: thread.clone(),
            assistant_id: record["assistant_id"].as_str().unwrap_or("").to_string(),
            created_at_ms: record["created_at_ms"]
                .as_u64()
                .unwrap_or(info.created_at_ms),
            metadata: json!({ "recovered": true }),
            multitask_strategy: record["multitask_strategy"]
                .as_str()
                .unwrap_or("reject")
                .to_string(),
            kwargs: json!({}),
            modes: vec!["values".to_string()],
            subgraphs: false,
            cancel: CancelHandle::new(),
            state: Mutex::new(SlotState {
                status,
                updated_at_ms: info.updated_at_ms,
                ..SlotState::default()
            }),
            changed,
            held: Arc::new(AtomicUsize::new(0)),
            keep_bytes: 0,
        });
        // Finished with its result, and with no events: a join stream says they are gone.
        slot.finish_recovered(status, &result);
        Some(slot)
    }

    fn runs_of(&self, thread: &str) -> Vec<Arc<RunSlot>> {
        lock(&self.inner.agent_runs.runs)
            .iter()
            .filter(|r| r.thread_id == thread)
            .cloned()
            .collect()
    }
}

/// A stream mode list: one name or several.
#[derive(Deserialize)]
#[serde(untagged)]
enum Modes {
    One(String),
    Many(Vec<String>),
}

/// The body of a run request, as the SDKs send it.
#[derive(Deserialize)]
pub(crate) struct RunBody {
    assistant_id: String,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    command: Option<Value>,
    #[serde(default)]
    stream_mode: Option<Modes>,
    #[serde(default)]
    stream_subgraphs: Option<bool>,
    #[serde(default)]
    metadata: Option<Value>,
    #[serde(default)]
    config: Option<Value>,
    #[serde(default)]
    context: Option<Value>,
    #[serde(default)]
    checkpoint: Option<Value>,
    #[serde(default)]
    checkpoint_id: Option<String>,
    #[serde(default)]
    interrupt_before: Option<Value>,
    #[serde(default)]
    interrupt_after: Option<Value>,
    #[serde(default)]
    webhook: Option<String>,
    #[serde(default)]
    multitask_strategy: Option<String>,
    #[serde(default)]
    if_not_exists: Option<String>,
    #[serde(default)]
    on_disconnect: Option<String>,
    #[serde(default)]
    on_completion: Option<String>,
    #[serde(default)]
    after_seconds: Option<f64>,
    #[serde(default)]
    durability: Option<String>,
    // Accepted and ignored: they change nothing a client can observe here.
    #[serde(default)]
    #[allow(dead_code)]
    stream_resumable: Option<bool>,
    #[serde(default)]
    #[allow(dead_code)]
    feedback_keys: Option<Value>,
    #[serde(default)]
    #[allow(dead_code)]
    checkpoint_during: Option<bool>,
    #[serde(default)]
    #[allow(dead_code)]
    langsmith_tracer: Option<Value>,
    #[serde(default)]
    #[allow(dead_code)]
    strict_resume: Option<bool>,
}

fn parse_body(body: Value) -> Result<RunBody, ApiError> {
    serde_json::from_value(body)
        .map_err(|e| ApiError::invalid_body(format!("not a run request: {e}")))
}

fn non_empty(v: &Option<Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(m)) => !m.is_empty(),
        Some(Value::String(s)) => !s.is_empty(),
        Some(_) => true,
    }
}

/// Refuses what ferrograph does not do, naming it.
fn check_supported(b: &RunBody) -> Result<(), ApiError> {
    if non_empty(&b.interrupt_before) || non_empty(&b.interrupt_after) {
        return Err(unsupported(
            "`interrupt_before`/`interrupt_after` per run",
            "breakpoints are part of the compiled graph (`StateGraph::interrupt_before`)",
        ));
    }
    if b.webhook.as_deref().is_some_and(|w| !w.is_empty()) {
        return Err(unsupported(
            "`webhook`",
            "the server makes no outbound calls; follow the run with `join` or `/threads/{id}/events`",
        ));
    }
    if b.after_seconds.is_some_and(|s| s > 0.0) {
        return Err(unsupported("`after_seconds`", "runs start when requested"));
    }
    if non_empty(&b.context) {
        return Err(unsupported(
            "run `context`",
            "ferrograph's workflows take their settings from the server's configuration",
        ));
    }
    if b.durability.as_deref().is_some_and(|d| d != "sync") {
        return Err(unsupported(
            "a durability other than `sync` per run",
            "every step of an API run is checkpointed before the next starts",
        ));
    }
    if b.multitask_strategy.as_deref() == Some("rollback") {
        return Err(unsupported(
            "`multitask_strategy: rollback`",
            "checkpoints are never deleted; use `interrupt` to stop the run in progress",
        ));
    }
    Ok(())
}

fn modes_of(b: &RunBody) -> Result<Vec<String>, ApiError> {
    let list = match &b.stream_mode {
        None => vec!["values".to_string()],
        Some(Modes::One(m)) => vec![m.clone()],
        Some(Modes::Many(l)) if l.is_empty() => vec!["values".to_string()],
        Some(Modes::Many(l)) => l.clone(),
    };
    for m in &list {
        if !MODES.contains(&m.as_str()) {
            return Err(ApiError::invalid_body(format!(
                "unknown stream mode `{m}` (known: {})",
                MODES.join(", ")
            )));
        }
    }
    Ok(list)
}

/// Every mode the runtime can stream: a slot keeps all of them.
fn all_modes() -> StreamModes {
    StreamMode::ALL
        .into_iter()
        .fold(StreamModes::NONE, StreamModes::with)
}

/// Claims the thread for a run, following the multitask strategy when a run is on it:
/// `reject` refuses (409), `interrupt` cancels the runs in progress and waits for the thread,
/// `enqueue` waits for it.
async fn claim_for(
    state: &AppState,
    thread: &str,
    strategy: &str,
) -> Result<ActiveGuard, ApiError> {
    match state.claim(thread) {
        Ok(g) => return Ok(g),
        Err(e) if strategy == "reject" => return Err(e),
        Err(_) => {}
    }
    if strategy == "interrupt" {
        for r in state.runs_of(thread) {
            if !r.is_finished() {
                r.request_cancel();
            }
        }
    }
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if let Ok(g) = state.claim(thread) {
            return Ok(g);
        }
    }
}

/// A run's result for `wait` and `join`.
fn result_of(outcome: &JsonOutcome) -> Value {
    let mut v = if outcome.state.is_object() {
        outcome.state.clone()
    } else {
        json!({})
    };
    super::messages::present(&mut v);
    with_interrupts(v, &outcome.interrupts)
}

/// `values` with the open `interrupts` under `__interrupt__`, as `wait` and `join` answer.
fn with_interrupts(mut values: Value, interrupts: &[Interrupt]) -> Value {
    if !interrupts.is_empty() && values.is_object() {
        values["__interrupt__"] = Value::Array(interrupts.iter().map(interrupt_json).collect());
    }
    values
}

struct Admitted {
    slot: Arc<RunSlot>,
    on_disconnect_cancel: bool,
}

/// Admits and starts a run on `thread` (creating the thread when asked to), returning its
/// slot once the run is under way. Refusals are HTTP errors and leave nothing behind.
async fn admit(
    state: &AppState,
    thread: String,
    b: RunBody,
    stateless: bool,
) -> Result<Admitted, ApiError> {
    check_supported(&b)?;
    let modes = modes_of(&b)?;
    let assistant: Assistant = state.assistant(&b.assistant_id).await?;
    let strategy = b
        .multitask_strategy
        .clone()
        .unwrap_or_else(|| "reject".to_string());
    if !matches!(strategy.as_str(), "reject" | "interrupt" | "enqueue") {
        return Err(ApiError::invalid_body(format!(
            "multitask_strategy must be reject, interrupt or enqueue, not `{strategy}`"
        )));
    }
    match state.inner.saver.get_thread(&thread).await? {
        // Corrected from its checkpoint first if its record claims too much (this must come
        // before the claim: a claimed thread is taken as running here).
        Some(existing) => {
            reconcile(state, existing).await;
        }
        None if stateless || b.if_not_exists.as_deref() == Some("create") => {
            crate::api::check_thread_id(&thread)?;
        }
        None => return Err(ApiError::thread_not_found(&thread)),
    }
    let guard = claim_for(state, &thread, &strategy).await?;
    // Read under the claim: a queued run finds the thread as the run it waited for left it.
    let mut info = match state.inner.saver.get_thread(&thread).await? {
        Some(i) => i,
        None => {
            let mut i = ThreadInfo::new(thread.clone(), assistant.graph_id.clone());
            i.status = ThreadStatus::Done;
            if stateless {
                i.metadata.insert("stateless".into(), "true".into());
            }
            i
        }
    };
    if info.graph.is_empty() {
        info.graph = assistant.graph_id.clone();
    }
    // As LangGraph's server does, a thread's metadata names the graph and assistant that
    // first ran on it (clients list a graph's threads by them).
    for (key, value) in [
        ("graph_id", &assistant.graph_id),
        ("assistant_id", &assistant.assistant_id),
    ] {
        info.metadata
            .entry(key.to_string())
            .or_insert_with(|| value.clone());
    }
    // A thread runs one graph: the entry it is bound to (by registry name or graph name)
    // must be the assistant's.
    let entry = entry_of(state, &info)?;
    let same = state
        .inner
        .registry
        .get(&assistant.graph_id)
        .is_some_and(|e| Arc::ptr_eq(&e.workflow, &entry.workflow));
    if !same {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "thread_graph_mismatch",
            format!(
                "thread `{thread}` runs graph `{}`; assistant `{}` is of graph `{}`",
                info.graph, assistant.assistant_id, assistant.graph_id
            ),
        ));
    }
    let command: Option<RunCommand> = match b.command {
        None | Some(Value::Null) => None,
        Some(c) => Some(serde_json::from_value(c).map_err(|e| {
            ApiError::invalid_body(format!(
                "`command` has `resume`, `update` and `goto` (node names): {e}"
            ))
        })?),
    };
    let input = run_input(state, entry, &info, b.input, command)?;
    let workflow = entry.workflow.clone();
    let run_id = uuid::Uuid::now_v7().to_string();
    let created_at_ms = now_millis();
    // The run's record goes with the thread's: a server killed during the run answers for it
    // after a restart (`error`, and how to continue) instead of not knowing it.
    info.metadata.insert(
        RUN_KEY.to_string(),
        json!({
            "run_id": run_id,
            "assistant_id": assistant.assistant_id,
            "created_at_ms": created_at_ms,
            "multitask_strategy": strategy,
        })
        .to_string(),
    );
    // Persist the binding (and a new thread) before the run, so a crash leaves a thread
    // that says which graph it belongs to.
    state.inner.saver.put_thread(info.clone()).await?;
    let checkpoint_id = match (&b.checkpoint_id, &b.checkpoint) {
        (Some(c), _) if !c.is_empty() => Some(c.clone()),
        (_, Some(c)) => super::threads::checkpoint_id_of(c)?,
        _ => None,
    };
    let max_steps = b
        .config
        .as_ref()
        .and_then(|c| c.get("recursion_limit"))
        .and_then(Value::as_u64)
        .or_else(|| assistant.recursion_limit());
    let cancel = CancelHandle::new();
    let mut meta = b.metadata.clone().unwrap_or(json!({}));
    metadata_in(&meta)?; // same rules as thread metadata
    meta["assistant_id"] = json!(assistant.assistant_id);
    meta["graph_id"] = json!(assistant.graph_id);
    let (changed, _) = watch::channel(0);
    let slot = Arc::new(RunSlot {
        run_id: run_id.clone(),
        thread_id: thread.clone(),
        assistant_id: assistant.assistant_id.clone(),
        created_at_ms,
        metadata: meta,
        multitask_strategy: strategy,
        kwargs: json!({
            "config": b.config.unwrap_or(json!({})),
            "stream_mode": modes,
            "subgraphs": b.stream_subgraphs.unwrap_or(false),
            "checkpoint_id": checkpoint_id,
        }),
        modes,
        subgraphs: b.stream_subgraphs.unwrap_or(false),
        cancel: cancel.clone(),
        state: Mutex::new(SlotState {
            status: "pending",
            updated_at_ms: now_millis(),
            ..SlotState::default()
        }),
        changed,
        held: state.inner.agent_runs.held.clone(),
        keep_bytes: state.inner.agent_runs.retention.per_run_bytes,
    });
    slot.push(SseItem::new(
        None,
        "metadata",
        "",
        &json!({ "run_id": run_id, "attempt": 1 }),
    ));
    let options = RunOptions {
        cancel: Some(cancel),
        checkpoint_id,
        max_steps,
        run_id: Some(run_id),
    };
    let started = start_claimed(
        state,
        info,
        workflow,
        input,
        Some(all_modes()),
        options,
        guard,
    )
    .await?;
    // The runtime has marked the thread running (with this process as its owner); make
    // that durable before answering, so that a server killed during the run finds the run
    // cut off after its restart rather than a thread that looks finished.
    if let Err(e) = state.inner.saver.flush().await {
        tracing::warn!(thread = %slot.thread_id, error = %e, "could not flush the run's record");
    }
    slot.set_status("running");
    state.remember_run(slot.clone());
    tokio::spawn(pump(
        state.clone(),
        slot.clone(),
        started,
        stateless && b.on_completion.as_deref() != Some("keep"),
    ));
    Ok(Admitted {
        slot,
        on_disconnect_cancel: b.on_disconnect.as_deref() == Some("cancel"),
    })
}

/// Feeds a run's events into its slot and records how it ended.
async fn pump(
    state: AppState,
    slot: Arc<RunSlot>,
    started: crate::runs::StartedRun,
    delete_after: bool,
) {
    let mut conv = Converter::new(&slot.run_id, &slot.thread_id);
    if let Some(mut rx) = started.events {
        while let Some(le) = rx.recv().await {
            // The server's own `end`/`error` carry no runtime event: the outcome below says
            // how the run ended.
            let Some(ev) = &le.event else {
                continue;
            };
            for item in conv.convert(ev.kind, &ev.namespace, &ev.data) {
                slot.push(item);
            }
            state.shed_events();
        }
    }
    let cancelled = slot.cancel.is_cancelled();
    let (status, result) = match started.outcome.await {
        Ok(Ok(o)) => {
            let status = match o.status {
                "done" => "success",
                "interrupted" | "drained" => "interrupted",
                "timed_out" => "timeout",
                _ => "success",
            };
            (status, result_of(&o))
        }
        Ok(Err(e)) if cancelled => {
            tracing::info!(run = %slot.run_id, error = %e.message, "run cancelled");
            let values = match state.inner.saver.get_thread(&slot.thread_id).await {
                Ok(Some(info)) => super::threads::current_values(&state, &info).await,
                _ => json!({}),
            };
            ("interrupted", values)
        }
        Ok(Err(e)) => {
            let err = json!({ "error": e.code, "message": e.message });
            slot.push(SseItem::new(None, "error", "", &err));
            let status = if e.code == "timeout" || e.code == "run_timeout" {
                "timeout"
            } else {
                "error"
            };
            (status, json!({ "__error__": err }))
        }
        Err(_) => {
            let err =
                json!({ "error": "internal_error", "message": "the run ended without an outcome" });
            slot.push(SseItem::new(None, "error", "", &err));
            ("error", json!({ "__error__": err }))
        }
    };
    if delete_after {
        if let Ok(guard) = state.claim(&slot.thread_id) {
            let deleted = state.inner.saver.delete_thread(&slot.thread_id).await;
            if let Err(e) = deleted {
                tracing::warn!(thread = %slot.thread_id, error = %e, "could not delete a stateless run's thread");
            }
            let _ = state.inner.saver.flush().await;
            drop(guard);
        }
    }
    slot.finish(status, &result);
    state.shed_events();
}

fn located(mut resp: Response, slot: &RunSlot) -> Response {
    let loc = format!("/threads/{}/runs/{}", slot.thread_id, slot.run_id);
    if let Ok(v) = HeaderValue::from_str(&loc) {
        resp.headers_mut().insert(header::CONTENT_LOCATION, v);
    }
    resp
}

/// `POST /threads/{id}/runs` with `assistant_id`: a background run; answers the run.
pub(crate) async fn create_on_thread(
    state: AppState,
    thread: String,
    body: Value,
) -> Result<Response, ApiError> {
    let a = admit(&state, thread, parse_body(body)?, false).await?;
    Ok(located(Json(a.slot.view()).into_response(), &a.slot))
}

/// Admits a stateless run: on a new thread, deleted afterwards unless
/// `on_completion: keep`.
async fn admit_stateless(state: &AppState, body: Value) -> Result<Admitted, ApiError> {
    admit(
        state,
        uuid::Uuid::now_v7().to_string(),
        parse_body(body)?,
        true,
    )
    .await
}

/// `POST /runs`: a background run on a new thread.
pub(crate) async fn create_stateless(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<Value>,
) -> Result<Response, ApiError> {
    let a = admit_stateless(&state, body).await?;
    Ok(located(Json(a.slot.view()).into_response(), &a.slot))
}

async fn wait_response(a: Admitted) -> Response {
    match a.slot.finished().await {
        Ok(resp) => located(resp, &a.slot),
        Err(e) => e.into_response(),
    }
}

/// `POST /threads/{id}/runs/wait`: runs and answers the final values (with `__interrupt__`
/// when the run stopped at one, `__error__` when it failed).
pub(crate) async fn wait_on_thread(
    State(state): State<AppState>,
    Path(thread): Path<String>,
    ApiJson(body): ApiJson<Value>,
) -> Result<Response, ApiError> {
    let a = admit(&state, thread, parse_body(body)?, false).await?;
    Ok(wait_response(a).await)
}

/// `POST /runs/wait`: the same on a new thread, deleted afterwards unless
/// `on_completion: keep`.
pub(crate) async fn wait_stateless(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<Value>,
) -> Result<Response, ApiError> {
    Ok(wait_response(admit_stateless(&state, body).await?).await)
}

/// Cancels the run when the client goes away before it finished, for `on_disconnect: cancel`.
struct DisconnectGuard {
    slot: Arc<RunSlot>,
    cancel: bool,
}

impl Drop for DisconnectGuard {
    fn drop(&mut self) {
        if self.cancel && !self.slot.is_finished() {
            tracing::info!(run = %self.slot.run_id, "client went away; cancelling its run");
            self.slot.request_cancel();
        }
    }
}

/// The event that tells a client events `asked..kept_from` were dropped before it read them
/// (it has no id, so `Last-Event-ID` still names the last event read).
fn dropped_event(asked: usize, kept_from: usize) -> Event {
    let data = json!({
        "dropped": kept_from - asked,
        "first_dropped_id": asked,
        "kept_from_id": kept_from,
        "message": format!(
            "events {asked}..{kept_from} of this run were dropped to keep the server's event \
             memory within its caps (--keep-run-events-mib, --keep-events-mib); the thread's \
             state and history are in its checkpoints"
        ),
    });
    Event::default().event("dropped").data(data.to_string())
}

/// The slot's events from `from` on, in `modes`, as SSE, until the run finishes.
fn sse(
    state: &AppState,
    slot: Arc<RunSlot>,
    from: usize,
    modes: Vec<String>,
    subgraphs: bool,
    cancel_on_disconnect: bool,
) -> Response {
    let guard = DisconnectGuard {
        slot: slot.clone(),
        cancel: cancel_on_disconnect,
    };
    let rx = slot.changed.subscribe();
    let closing = state.inner.closing.subscribe();
    let mut first = VecDeque::<Event>::new();
    if slot.events_lost() {
        let data = json!({
            "dropped": "all",
            "message": "this run's events were kept by the server process that ran it, which \
                        stopped; the thread's checkpoints keep every step \
                        (GET /threads/{id}/history)",
        });
        first.push_back(Event::default().event("dropped").data(data.to_string()));
    }
    let stream = futures::stream::unfold(
        (slot, rx, from, closing, guard, first, false),
        move |(slot, mut rx, mut next, mut closing, guard, mut queue, mut done)| {
            let modes = modes.clone();
            async move {
                loop {
                    if let Some(ev) = queue.pop_front() {
                        return Some((
                            Ok::<_, Infallible>(ev),
                            (slot, rx, next, closing, guard, queue, done),
                        ));
                    }
                    if done {
                        return None;
                    }
                    let (start, items, finished) = slot.events_from(next);
                    if start > next {
                        queue.push_back(dropped_event(next, start));
                    }
                    next = start + items.len();
                    for (k, it) in items.iter().enumerate() {
                        if it.wanted(&modes, subgraphs) {
                            queue.push_back(
                                Event::default()
                                    .event(it.name())
                                    .id((start + k).to_string())
                                    .data(&it.data),
                            );
                        }
                    }
                    if finished {
                        done = true;
                        continue;
                    }
                    if !queue.is_empty() {
                        continue;
                    }
                    tokio::select! {
                        r = rx.changed() => if r.is_err() { done = true; },
                        _ = closing.wait_for(|c| *c) => { done = true; },
                    }
                }
            }
        },
    );
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

async fn stream_response(state: &AppState, a: Admitted) -> Response {
    let modes = a.slot.modes.clone();
    let subgraphs = a.slot.subgraphs;
    let slot = a.slot.clone();
    located(
        sse(state, a.slot, 0, modes, subgraphs, a.on_disconnect_cancel),
        &slot,
    )
}

/// `POST /threads/{id}/runs/stream`.
pub(crate) async fn stream_on_thread(
    State(state): State<AppState>,
    Path(thread): Path<String>,
    ApiJson(body): ApiJson<Value>,
) -> Result<Response, ApiError> {
    let a = admit(&state, thread, parse_body(body)?, false).await?;
    Ok(stream_response(&state, a).await)
}

/// `POST /runs/stream`: streamed on a new thread, deleted afterwards unless
/// `on_completion: keep`.
pub(crate) async fn stream_stateless(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<Value>,
) -> Result<Response, ApiError> {
    let a = admit_stateless(&state, body).await?;
    Ok(stream_response(&state, a).await)
}

#[derive(Deserialize)]
pub(crate) struct ListQuery {
    limit: Option<i64>,
    offset: Option<i64>,
    status: Option<String>,
}

/// `GET /threads/{id}/runs`: the thread's runs on this server, newest first.
pub(crate) async fn list(
    State(state): State<AppState>,
    Path(thread): Path<String>,
    Query(q): Query<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let info = load_thread(&state, &thread).await?;
    let (limit, offset) = super::page(q.limit, q.offset)?;
    let mut known = state.runs_of(&thread);
    if let Some(slot) = state.recovered_run(&info).await {
        known.insert(0, slot);
    }
    let runs: Vec<Value> = known
        .iter()
        .rev()
        .filter(|r| q.status.as_deref().is_none_or(|s| r.status() == s))
        .skip(offset)
        .take(limit)
        .map(|r| r.view())
        .collect();
    Ok(Json(Value::Array(runs)))
}

pub(crate) async fn get(
    State(state): State<AppState>,
    Path((thread, run)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(state.find_or_recover_run(&thread, &run).await?.view()))
}

pub(crate) async fn delete(
    State(state): State<AppState>,
    Path((thread, run)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let slot = state.find_run(&thread, &run)?;
    if !slot.is_finished() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "run_in_progress",
            format!("run `{run}` is still in progress; cancel it first"),
        ));
    }
    lock(&state.inner.agent_runs.runs).retain(|r| r.run_id != run);
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /threads/{id}/runs/{run}/join`: waits for the run and answers its result.
pub(crate) async fn join(
    State(state): State<AppState>,
    Path((thread, run)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let slot = state.find_or_recover_run(&thread, &run).await?;
    slot.finished().await
}

#[derive(Deserialize)]
pub(crate) struct JoinQuery {
    #[serde(default)]
    stream_mode: Option<String>,
    #[serde(default)]
    cancel_on_disconnect: Option<String>,
}

/// `GET /threads/{id}/runs/{run}/stream`: the run's events (from after `Last-Event-ID` when
/// given), in its own stream modes or the ones asked for.
pub(crate) async fn join_stream(
    State(state): State<AppState>,
    Path((thread, run)): Path<(String, String)>,
    Query(q): Query<JoinQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let slot = state.find_or_recover_run(&thread, &run).await?;
    let from = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<usize>().ok())
        .map_or(0, |n| n + 1);
    let modes = match q.stream_mode.as_deref() {
        Some(m) if !m.is_empty() => m.split(',').map(str::to_string).collect(),
        _ => slot.modes.clone(),
    };
    let cancel = matches!(q.cancel_on_disconnect.as_deref(), Some("true" | "1"));
    let subgraphs = slot.subgraphs;
    let dropped = slot.dropped().saturating_sub(from);
    let lost = slot.events_lost();
    let mut resp = sse(&state, slot, from, modes, subgraphs, cancel);
    if lost {
        resp.headers_mut().insert(
            "x-ferrograph-events-dropped",
            HeaderValue::from_static("all"),
        );
    }
    if dropped > 0 {
        resp.headers_mut()
            .insert("x-ferrograph-events-dropped", HeaderValue::from(dropped));
    }
    Ok(resp)
}

#[derive(Deserialize)]
pub(crate) struct CancelQuery {
    #[serde(default)]
    wait: Option<String>,
    #[serde(default)]
    action: Option<String>,
}

/// `POST /threads/{id}/runs/{run}/cancel`: stops the run where it is (the thread keeps its
/// last step); `?wait=1` answers once it has stopped.
pub(crate) async fn cancel(
    State(state): State<AppState>,
    Path((thread, run)): Path<(String, String)>,
    Query(q): Query<CancelQuery>,
) -> Result<StatusCode, ApiError> {
    if q.action.as_deref() == Some("rollback") {
        return Err(unsupported(
            "cancelling with `action=rollback`",
            "checkpoints are never deleted; `interrupt` stops the run and keeps its steps",
        ));
    }
    let slot = state.find_run(&thread, &run)?;
    if !slot.is_finished() {
        slot.request_cancel();
    }
    if matches!(q.wait.as_deref(), Some("1" | "true")) {
        let _ = slot.finished().await;
        return Ok(StatusCode::NO_CONTENT);
    }
    Ok(StatusCode::ACCEPTED)
}

#[derive(Deserialize)]
pub(crate) struct CancelManyBody {
    #[serde(default)]
    thread_id: Option<String>,
    #[serde(default)]
    run_ids: Option<Vec<String>>,
    #[serde(default)]
    status: Option<String>,
}

/// `POST /runs/cancel`: cancels the runs named, or those of a thread, or every pending or
/// running one.
pub(crate) async fn cancel_many(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<CancelManyBody>,
) -> Result<StatusCode, ApiError> {
    let runs: Vec<Arc<RunSlot>> = lock(&state.inner.agent_runs.runs).iter().cloned().collect();
    for r in runs {
        let by_thread = body.thread_id.as_deref().is_none_or(|t| r.thread_id == t);
        let by_id = body
            .run_ids
            .as_ref()
            .is_none_or(|ids| ids.contains(&r.run_id));
        let by_status = match body.status.as_deref() {
            None | Some("all") => true,
            Some(s) => r.status() == s,
        };
        if by_thread && by_id && by_status && !r.is_finished() {
            r.request_cancel();
        }
    }
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn interrupts_view(list: &[Interrupt]) -> Value {
        Value::Array(list.iter().map(interrupt_json).collect())
    }

    #[test]
    fn results_carry_interrupts() {
        let o = JsonOutcome {
            status: "interrupted",
            state: json!({"a": 1}),
            interrupts: vec![Interrupt {
                id: "i".into(),
                node: "gate".into(),
                task_id: "t".into(),
                value: json!("ok?").into(),
                static_: false,
            }],
            checkpoint_id: "c".into(),
            next: vec!["gate".into()],
            thread_id: Some("th".into()),
        };
        let r = result_of(&o);
        assert_eq!(r["a"], 1);
        assert_eq!(r["__interrupt__"], interrupts_view(&o.interrupts));
    }
}
