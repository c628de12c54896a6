//! Runs started through the API: claiming the thread, driving the run's event stream in a task
//! of its own (so a client that goes away does not stop the run), recording metrics, and feeding
//! the thread's live event channel and the client's own stream.

use crate::error::ApiError;
use crate::metrics::RunTracker;
use crate::{AppState, LiveEvent};
use ferrograph::runtime::{JsonInput, JsonOutcome, JsonRun, RunError, Workflow};
use ferrograph::{CancelHandle, RunConfig, StreamMode, StreamModes, ThreadInfo, ThreadStatus};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::{broadcast, mpsc, oneshot};

/// Capacity of a thread's live channel; a subscriber further behind gets a `lagged` event.
const LIVE_CAPACITY: usize = 1024;

/// Locks a mutex, ignoring poisoning (the data is plain bookkeeping).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Held while a run is in progress on a thread; frees the thread when dropped.
pub(crate) struct ActiveGuard {
    state: AppState,
    thread: String,
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        lock(&self.state.inner.active).remove(&self.thread);
    }
}

impl AppState {
    /// Claims a thread for a run, or 409 when one is in progress.
    pub(crate) fn claim(&self, thread: &str) -> Result<ActiveGuard, ApiError> {
        if !lock(&self.inner.active).insert(thread.to_string()) {
            return Err(ApiError::thread_busy(thread));
        }
        Ok(ActiveGuard {
            state: self.clone(),
            thread: thread.to_string(),
        })
    }

    /// Follows which nodes of a thread's run are running now (for its graph's highlight).
    fn track_node(&self, thread: &str, kind: &str, data: &Value) {
        // Every event passes here (tokens included): only task starts and ends take the lock.
        if kind != "task_start" && kind != "task_end" {
            return;
        }
        let Some(node) = data.get("node").and_then(Value::as_str) else {
            return;
        };
        let mut running = lock(&self.inner.running);
        let nodes = running.entry(thread.to_string()).or_default();
        match kind {
            "task_start" => nodes.push(node.to_string()),
            "task_end" => {
                if let Some(i) = nodes.iter().position(|n| n == node) {
                    nodes.remove(i);
                }
            }
            _ => {}
        }
    }

    /// The nodes running now on `thread`, while a run of this server is on it.
    pub(crate) fn running_nodes(&self, thread: &str) -> Option<Vec<String>> {
        lock(&self.inner.running)
            .get(thread)
            .filter(|n| !n.is_empty())
            .cloned()
    }

    /// Whether a run is in progress on `thread`.
    pub(crate) fn is_active(&self, thread: &str) -> bool {
        lock(&self.inner.active).contains(thread)
    }

    /// Whether this process has already checked the thread's record against its checkpoint.
    pub(crate) fn was_reconciled(&self, thread: &str) -> bool {
        lock(&self.inner.reconciled).contains(thread)
    }

    pub(crate) fn mark_reconciled(&self, thread: &str) {
        lock(&self.inner.reconciled).insert(thread.to_string());
    }

    /// The thread's live channel, created if needed.
    pub(crate) fn live_sender(&self, thread: &str) -> broadcast::Sender<Arc<LiveEvent>> {
        let mut live = lock(&self.inner.live);
        if live.len() > 4096 {
            let active = lock(&self.inner.active);
            live.retain(|t, s| s.receiver_count() > 0 || active.contains(t));
        }
        live.entry(thread.to_string())
            .or_insert_with(|| broadcast::channel(LIVE_CAPACITY).0)
            .clone()
    }

    /// Forgets the thread's live channel if nobody listens.
    pub(crate) fn release_live(&self, thread: &str, force: bool) {
        let mut live = lock(&self.inner.live);
        if force || live.get(thread).is_some_and(|s| s.receiver_count() == 0) {
            live.remove(thread);
        }
    }
}

/// Which requested stream mode carries events of `kind` (`None`: always delivered).
fn mode_of(kind: &str) -> Option<StreamMode> {
    Some(match kind {
        "values" => StreamMode::Values,
        "updates" => StreamMode::Updates,
        "custom" => StreamMode::Custom,
        "token" => StreamMode::Tokens,
        "task_start" | "task_end" | "tool" => StreamMode::Tasks,
        "checkpoint" => StreamMode::Debug,
        _ => return None,
    })
}

fn wanted(modes: StreamModes, kind: &str) -> bool {
    match mode_of(kind) {
        None => true,
        Some(StreamMode::Tasks) => {
            modes.contains(StreamMode::Tasks) || modes.contains(StreamMode::Debug)
        }
        Some(m) => modes.contains(m),
    }
}

/// Modes every API run streams internally, for metrics and the live channel.
fn internal_modes() -> StreamModes {
    StreamModes::NONE
        .with(StreamMode::Tasks)
        .with(StreamMode::Tokens)
        .with(StreamMode::Custom)
        .with(StreamMode::Updates)
}

pub(crate) fn live_event(kind: &str, data: &Value) -> Arc<LiveEvent> {
    Arc::new(LiveEvent {
        kind: kind.to_string(),
        data: data.to_string(),
        event: None,
    })
}

/// A run that was admitted and is now driven in the background.
pub(crate) struct StartedRun {
    /// How it ended.
    pub(crate) outcome: oneshot::Receiver<Result<JsonOutcome, ApiError>>,
    /// Its events (in the requested modes) then `end` or `error`, when streaming was asked for.
    pub(crate) events: Option<mpsc::Receiver<Arc<LiveEvent>>>,
}

/// Errors that the runtime reports before the run does anything.
fn refused_before_start(e: &RunError) -> bool {
    matches!(
        e,
        RunError::NoPendingInterrupt(_)
            | RunError::UnknownInterrupt { .. }
            | RunError::AmbiguousResume { .. }
            | RunError::NothingToContinue(_)
            | RunError::InvalidInput(_)
    )
}

/// Settings of a run beyond its input and stream.
#[derive(Clone, Default)]
pub(crate) struct RunOptions {
    /// Stops the run from outside (the Agent Server API's cancel).
    pub(crate) cancel: Option<CancelHandle>,
    /// Start from this checkpoint instead of the newest.
    pub(crate) checkpoint_id: Option<String>,
    /// Supersteps allowed (LangGraph's `recursion_limit`); the runtime's default when unset.
    pub(crate) max_steps: Option<u64>,
    /// Run id announced in the `run_start` live event.
    pub(crate) run_id: Option<String>,
}

/// Starts a run on `info`'s thread. `stream` is the set of modes the client asked to stream, or
/// `None` for a client that waits for the outcome.
pub(crate) async fn start_run(
    state: &AppState,
    info: ThreadInfo,
    workflow: Arc<dyn Workflow>,
    input: JsonInput,
    stream: Option<StreamModes>,
    options: RunOptions,
) -> Result<StartedRun, ApiError> {
    let thread = info.thread_id.clone();
    let guard = state.claim(&thread)?;
    start_claimed(state, info, workflow, input, stream, options, guard).await
}

/// [`start_run`] on a thread already claimed by `guard`.
pub(crate) async fn start_claimed(
    state: &AppState,
    info: ThreadInfo,
    workflow: Arc<dyn Workflow>,
    input: JsonInput,
    stream: Option<StreamModes>,
    options: RunOptions,
    guard: ActiveGuard,
) -> Result<StartedRun, ApiError> {
    let thread = info.thread_id.clone();
    let modes = stream.map_or(internal_modes(), |m| {
        StreamMode::ALL
            .into_iter()
            .filter(|x| m.contains(*x))
            .fold(internal_modes(), StreamModes::with)
    });
    let mut attempts = 0;
    let run = loop {
        let mut config = RunConfig::thread(thread.clone()).stream(modes);
        if let Some(c) = &options.cancel {
            config = config.cancel(c.clone());
        }
        if let Some(cp) = &options.checkpoint_id {
            config = config.at_checkpoint(cp.clone());
        }
        if let Some(n) = options.max_steps {
            config = config.max_steps(n);
        }
        match workflow.start(input.clone(), config).await {
            Ok(run) => break run,
            // This server holds the thread, so the runtime's claim is the tail of the previous
            // run, released just after its outcome was delivered: wait a moment.
            Err(RunError::ThreadBusy(_)) if attempts < 200 => {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(e) => {
                if refused_before_start(&e) {
                    // The runtime marks the thread running before it checks the resume value;
                    // nothing ran, so put the record back as it was.
                    if let Err(err) = state.inner.saver.put_thread(info).await {
                        tracing::warn!(error = %err, "could not restore the thread record");
                    }
                }
                return Err(e.into());
            }
        }
    };
    let (done_tx, done_rx) = oneshot::channel();
    let (client_tx, client_rx) = match stream {
        Some(m) => {
            let (tx, rx) = mpsc::channel(256);
            (Some((tx, m)), Some(rx))
        }
        None => (None, None),
    };
    let live = state.live_sender(&thread);
    let _ = live.send(live_event(
        "run_start",
        &json!({ "thread_id": thread, "workflow": info.graph, "run_id": options.run_id }),
    ));
    tokio::spawn(drive(
        state.clone(),
        info,
        workflow,
        run,
        live,
        client_tx,
        done_tx,
        guard,
    ));
    Ok(StartedRun {
        outcome: done_rx,
        events: client_rx,
    })
}

#[allow(clippy::too_many_arguments)]
async fn drive(
    state: AppState,
    info: ThreadInfo,
    workflow: Arc<dyn Workflow>,
    mut run: JsonRun,
    live: broadcast::Sender<Arc<LiveEvent>>,
    mut client: Option<(mpsc::Sender<Arc<LiveEvent>>, StreamModes)>,
    done: oneshot::Sender<Result<JsonOutcome, ApiError>>,
    guard: ActiveGuard,
) {
    let started = Instant::now();
    let thread = info.thread_id.as_str();
    let mut tracker = RunTracker::default();
    while let Some(ev) = run.next_event().await {
        tracker.observe(ev.kind, &ev.data);
        if ev.namespace.is_empty() {
            state.track_node(thread, ev.kind, &ev.data);
        }
        let kind = ev.kind;
        let le = Arc::new(LiveEvent {
            kind: kind.to_string(),
            data: serde_json::to_string(&ev).unwrap_or_else(|_| "{}".to_string()),
            event: Some(ev),
        });
        if live.receiver_count() > 0 {
            let _ = live.send(le.clone());
        }
        if let Some((tx, modes)) = &client {
            if wanted(*modes, kind) && tx.send(le).await.is_err() {
                client = None;
            }
        }
    }
    let result = run.outcome().await;
    let (status, final_event, result) = match result {
        Ok(o) => {
            let ev = live_event("end", &serde_json::to_value(&o).unwrap_or(Value::Null));
            (o.status, ev, Ok(o))
        }
        Err(e) => {
            reopen_interrupts(&state, &info, workflow.as_ref(), &e).await;
            let err = ApiError::from(e);
            tracing::info!(thread, code = err.code, message = %err.message, "run failed");
            ("failed", live_event("error", &err.body()), Err(err))
        }
    };
    state
        .inner
        .metrics
        .record_run(&info.graph, status, tracker, started.elapsed());
    lock(&state.inner.running).remove(thread);
    // Free the thread before anyone hears that the run ended, so that a client reacting to the
    // end (a console resuming the next interrupt) is not refused as busy.
    drop(guard);
    let _ = live.send(final_event.clone());
    if let Some((tx, _)) = client {
        let _ = tx.send(final_event).await;
    }
    let _ = done.send(result);
    drop(live);
    state.release_live(thread, false);
}

/// A run that failed on a resume leaves its interrupt open (the runtime keeps it as a pending
/// write) but records the thread as failed with no interrupts; put them back on the record so
/// that the thread shows as waiting for an answer, with the error alongside.
async fn reopen_interrupts(
    state: &AppState,
    info: &ThreadInfo,
    workflow: &dyn Workflow,
    e: &RunError,
) {
    if !matches!(e, RunError::Node { .. }) {
        return;
    }
    let thread = info.thread_id.as_str();
    let Ok(snapshot) = workflow.get_state(thread, None).await else {
        return;
    };
    if snapshot.interrupts.is_empty() {
        return;
    }
    let saver = &state.inner.saver;
    let Ok(Some(mut record)) = saver.get_thread(thread).await else {
        return;
    };
    if record.status != ThreadStatus::Failed {
        return;
    }
    record.status = ThreadStatus::Interrupted;
    record.interrupts = snapshot.interrupts;
    record.error = Some(format!("{e} (the interrupt is still pending)"));
    if let Err(err) = saver.put_thread(record).await {
        tracing::warn!(error = %err, "could not update the thread record");
    }
}
