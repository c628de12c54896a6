//! Graphs behind JSON: the type-erased surface that the CLI and the HTTP server use to run any
//! loaded graph by name, whatever its state type.

use crate::config::RunConfig;
use crate::error::RunError;
use crate::runner::{
    GraphRunner, RunInput, RunOutcome, RunStatus, RunStream, SnapshotTask, StateSnapshot,
};
use async_trait::async_trait;
use ferrograph_core::checkpoint::CheckpointSaver;
use ferrograph_core::node::{Command, Goto};
use ferrograph_core::stream::{NodeEventKind, StreamEvent, TaskOutcome};
use ferrograph_core::{Interrupt, Resume, State};
use serde::Serialize;
use serde_json::{json, Value};
use std::sync::Arc;

/// What a JSON run starts with.
#[derive(Clone, Debug)]
pub enum JsonInput {
    /// An update of the graph's state, as JSON (fields of the state's update type).
    Update(Value),
    /// Continue the thread.
    Continue,
    /// Answer pending interrupts.
    Resume(Resume),
    /// LangGraph's `Command` as input (see [`RunInput::Command`]): an update as JSON, nodes
    /// to go to, and resume values, any of them.
    Command {
        /// An update of the graph's state, as JSON.
        update: Option<Value>,
        /// Nodes to run next, with the tasks already planned.
        goto: Vec<String>,
        /// Answers to pending interrupts.
        resume: Option<Resume>,
    },
}

/// One streamed event, as JSON.
#[derive(Clone, Debug, Serialize)]
pub struct JsonEvent {
    /// `values`, `updates`, `custom`, `token`, `task_start`, `task_end`, `tool`, `checkpoint`
    /// or `interrupt`.
    pub kind: &'static str,
    /// Subgraph namespace ("" at the root).
    pub namespace: String,
    /// The payload.
    pub data: Value,
}

/// How a JSON run ended.
#[derive(Clone, Debug, Serialize)]
pub struct JsonOutcome {
    /// `done`, `interrupted` or `drained` (workflows may add their own, such as
    /// `timed_out`).
    pub status: &'static str,
    /// The state.
    pub state: Value,
    /// Pending interrupts.
    pub interrupts: Vec<Interrupt>,
    /// Newest checkpoint.
    pub checkpoint_id: String,
    /// Nodes planned next.
    pub next: Vec<String>,
    /// Thread.
    pub thread_id: Option<String>,
}

/// A thread's state at one checkpoint, as JSON.
#[derive(Clone, Debug, Serialize)]
pub struct JsonSnapshot {
    /// The state.
    pub values: Value,
    /// Nodes planned next.
    pub next: Vec<String>,
    /// Checkpoint id.
    pub checkpoint_id: String,
    /// Parent checkpoint.
    pub parent_id: Option<String>,
    /// Supersteps executed up to it.
    pub step: u64,
    /// Why it was written (`input`, `loop`, `update`, `fork`).
    pub source: Value,
    /// Nodes whose updates produced it.
    pub writers: Vec<String>,
    /// When, ms since the epoch.
    pub created_at_ms: u64,
    /// Interrupts pending at it.
    pub interrupts: Vec<Interrupt>,
    /// The tasks planned at it, with what became of them so far.
    pub tasks: Vec<SnapshotTask>,
}

/// The path a thread took, from its history (newest first, as [`Workflow::history`] gives
/// it): the nodes of each superstep, oldest first (the writers of each checkpoint, without the
/// input pseudo-node), and the nodes planned next. What a drawing highlights
/// ([`ferrograph_core::drawing::Highlight::from_steps`]).
pub fn path_of(history: &[JsonSnapshot]) -> (Vec<Vec<String>>, Vec<String>) {
    let next = history.first().map(|s| s.next.clone()).unwrap_or_default();
    let steps = history
        .iter()
        .rev()
        .map(|s| {
            s.writers
                .iter()
                .filter(|w| !w.starts_with("__"))
                .cloned()
                .collect()
        })
        .collect();
    (steps, next)
}

/// Name and shape of a workflow.
#[derive(Clone, Debug, Serialize)]
pub struct WorkflowInfo {
    /// Graph name.
    pub name: String,
    /// Node names.
    pub nodes: Vec<String>,
    /// A Mermaid flowchart.
    pub mermaid: String,
    /// Nodes and edges, to draw with highlights (SVG, Mermaid, LangGraph's graph JSON).
    pub drawing: ferrograph_core::drawing::GraphDrawing,
}

/// A run in progress, streaming JSON events.
pub struct JsonRun {
    inner: Box<dyn ErasedStream>,
}

impl JsonRun {
    /// The next event, or `None` when the run has ended.
    pub async fn next_event(&mut self) -> Option<JsonEvent> {
        self.inner.next_event().await
    }

    /// Waits for the end of the run.
    pub async fn outcome(self) -> Result<JsonOutcome, RunError> {
        self.inner.outcome().await
    }

    /// The same run with its outcome passed through `f` once it ends: a workflow can turn
    /// an error into an outcome (a time limit into a saved `timed_out` state, say) for every
    /// caller, streaming or not.
    pub fn map_outcome<F, Fut>(self, f: F) -> JsonRun
    where
        F: FnOnce(Result<JsonOutcome, RunError>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<JsonOutcome, RunError>> + Send + 'static,
    {
        JsonRun {
            inner: Box::new(MappedStream {
                inner: self.inner,
                f: Box::new(move |r| Box::pin(f(r))),
            }),
        }
    }
    /// The same run with every event shown to `f` first; only the events for which `f`
    /// returns `true` reach the caller. A workflow can record a full trace (to a file, say)
    /// while its caller streams only the modes it asked for.
    pub fn tee<F>(self, f: F) -> JsonRun
    where
        F: FnMut(&JsonEvent) -> bool + Send + 'static,
    {
        JsonRun {
            inner: Box::new(TeeStream {
                inner: self.inner,
                f: Box::new(f),
            }),
        }
    }
}

struct TeeStream {
    inner: Box<dyn ErasedStream>,
    f: Box<dyn FnMut(&JsonEvent) -> bool + Send>,
}

#[async_trait]
impl ErasedStream for TeeStream {
    async fn next_event(&mut self) -> Option<JsonEvent> {
        loop {
            let ev = self.inner.next_event().await?;
            if (self.f)(&ev) {
                return Some(ev);
            }
        }
    }

    async fn outcome(self: Box<Self>) -> Result<JsonOutcome, RunError> {
        self.inner.outcome().await
    }
}

type OutcomeMap = Box<
    dyn FnOnce(
            Result<JsonOutcome, RunError>,
        ) -> futures::future::BoxFuture<'static, Result<JsonOutcome, RunError>>
        + Send,
>;

struct MappedStream {
    inner: Box<dyn ErasedStream>,
    f: OutcomeMap,
}

#[async_trait]
impl ErasedStream for MappedStream {
    async fn next_event(&mut self) -> Option<JsonEvent> {
        self.inner.next_event().await
    }

    async fn outcome(self: Box<Self>) -> Result<JsonOutcome, RunError> {
        let out = self.inner.outcome().await;
        (self.f)(out).await
    }
}

#[async_trait]
trait ErasedStream: Send {
    async fn next_event(&mut self) -> Option<JsonEvent>;
    async fn outcome(self: Box<Self>) -> Result<JsonOutcome, RunError>;
}

#[async_trait]
impl<S: State> ErasedStream for RunStream<S> {
    async fn next_event(&mut self) -> Option<JsonEvent> {
        RunStream::next_event(self).await.map(|e| event_json(&e))
    }

    async fn outcome(self: Box<Self>) -> Result<JsonOutcome, RunError> {
        RunStream::outcome(*self).await.map(|o| outcome_json(&o))
    }
}

/// A loaded graph behind JSON.
#[async_trait]
pub trait Workflow: Send + Sync {
    /// Name and shape.
    fn info(&self) -> WorkflowInfo;
    /// The checkpointer, if any.
    fn checkpointer(&self) -> Option<Arc<dyn CheckpointSaver>>;
    /// Starts a run, streaming events in the modes of `config.stream`.
    async fn start(&self, input: JsonInput, config: RunConfig) -> Result<JsonRun, RunError>;
    /// Runs to the end or an interrupt.
    async fn invoke(&self, input: JsonInput, config: RunConfig) -> Result<JsonOutcome, RunError>;
    /// A thread's state.
    async fn get_state(
        &self,
        thread: &str,
        checkpoint: Option<&str>,
    ) -> Result<JsonSnapshot, RunError>;
    /// A thread's history, newest first.
    async fn history(&self, thread: &str) -> Result<Vec<JsonSnapshot>, RunError>;
    /// Edits a thread's state as node `as_node` (or as input).
    async fn update_state(
        &self,
        thread: &str,
        update: Value,
        as_node: Option<&str>,
    ) -> Result<String, RunError>;
    /// Edits a thread's state at an older checkpoint: the new checkpoint follows `checkpoint`
    /// and becomes the thread's newest (LangGraph's `update_state` with a checkpoint id).
    async fn update_state_at(
        &self,
        thread: &str,
        checkpoint: &str,
        update: Value,
        as_node: Option<&str>,
    ) -> Result<String, RunError>;
    /// Copies a thread at a checkpoint into a new thread.
    async fn fork(
        &self,
        thread: &str,
        checkpoint: &str,
        new_thread: &str,
    ) -> Result<String, RunError>;
    /// Runs a task that another node's coordinator placed here (see
    /// [`crate::placement`]), sending its events to `events`.
    async fn run_task(
        &self,
        task: crate::placement::RemoteTask,
        events: tokio::sync::mpsc::Sender<crate::placement::RemoteEvent>,
    ) -> crate::placement::RemoteOutcome {
        let _ = events;
        crate::placement::RemoteOutcome::Failed {
            message: format!("workflow {} cannot run tasks for other nodes", task.graph),
            retryable: false,
        }
    }
}

fn parse_update<S: State>(value: Value) -> Result<S::Update, RunError> {
    serde_json::from_value(value).map_err(|e| {
        RunError::InvalidInput(format!(
            "the input is not a valid update of `{}`: {e}",
            std::any::type_name::<S>()
                .rsplit("::")
                .next()
                .unwrap_or("state")
        ))
    })
}

fn input<S: State>(input: JsonInput) -> Result<RunInput<S>, RunError> {
    Ok(match input {
        JsonInput::Update(v) => RunInput::Update(parse_update::<S>(v)?),
        JsonInput::Continue => RunInput::Continue,
        JsonInput::Resume(r) => RunInput::Resume(r),
        JsonInput::Command {
            update,
            goto,
            resume,
        } => {
            let mut command = Command::new();
            command.update = update.map(parse_update::<S>).transpose()?;
            command.goto = goto.into_iter().map(Goto::Node).collect();
            command.resume = resume;
            RunInput::Command(command)
        }
    })
}

fn to_json<T: Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or_else(|e| json!({ "error": format!("not serializable: {e}") }))
}

/// The JSON form of an outcome.
pub fn outcome_json<S: State>(o: &RunOutcome<S>) -> JsonOutcome {
    JsonOutcome {
        status: match o.status {
            RunStatus::Done => "done",
            RunStatus::Interrupted => "interrupted",
            RunStatus::Drained => "drained",
        },
        state: to_json(&*o.state),
        interrupts: o.interrupts.clone(),
        checkpoint_id: o.checkpoint_id.clone(),
        next: o.next.clone(),
        thread_id: o.thread_id.clone(),
    }
}

fn snapshot_json<S: State>(s: &StateSnapshot<S>) -> JsonSnapshot {
    JsonSnapshot {
        values: to_json(&*s.values),
        next: s.next.clone(),
        checkpoint_id: s.checkpoint_id.clone(),
        parent_id: s.parent_id.clone(),
        step: s.step,
        source: to_json(&s.source),
        writers: s.writers.clone(),
        created_at_ms: s.created_at_ms,
        interrupts: s.interrupts.clone(),
        tasks: s.tasks.clone(),
    }
}

fn node_event_json(kind: &NodeEventKind) -> Value {
    match kind {
        NodeEventKind::Custom(v) => v.0.clone(),
        NodeEventKind::Token { model, text } => json!({ "model": model, "text": text }),
        NodeEventKind::ToolStart { call_id, tool } => {
            json!({ "event": "tool_start", "call_id": call_id, "tool": tool })
        }
        NodeEventKind::ToolEnd {
            call_id,
            tool,
            status,
            duration,
        } => json!({
            "event": "tool_end", "call_id": call_id, "tool": tool, "status": status,
            "duration_ms": duration.as_secs_f64() * 1e3,
        }),
        other => json!({ "event": format!("{other:?}") }),
    }
}

/// The JSON form of a stream event.
pub fn event_json<S: State>(e: &StreamEvent<S>) -> JsonEvent {
    let data = match e {
        StreamEvent::Values { step, state, .. } => {
            json!({ "step": step, "state": to_json(&**state) })
        }
        StreamEvent::Updates {
            step, node, update, ..
        } => json!({ "step": step, "node": &**node, "update": to_json(update) }),
        StreamEvent::Custom { node, payload, .. } => {
            json!({ "node": &**node, "payload": payload.0 })
        }
        StreamEvent::Token {
            node, model, text, ..
        } => json!({ "node": &**node, "model": model, "text": text }),
        StreamEvent::TaskStart {
            step,
            node,
            task_id,
            attempt,
            ..
        } => json!({ "step": step, "node": &**node, "task_id": &**task_id, "attempt": attempt }),
        StreamEvent::TaskEnd {
            step,
            node,
            task_id,
            attempt,
            duration,
            outcome,
            ..
        } => {
            let outcome: Value = match outcome {
                TaskOutcome::Ok => json!("ok"),
                TaskOutcome::Cached => json!("cached"),
                TaskOutcome::Interrupted => json!("interrupted"),
                TaskOutcome::Handled { error } => json!({ "handled": error }),
                TaskOutcome::Error { error, will_retry } => {
                    json!({ "error": error, "will_retry": will_retry })
                }
            };
            json!({
                "step": step, "node": &**node, "task_id": &**task_id, "attempt": attempt,
                "duration_ms": duration.as_secs_f64() * 1e3, "outcome": outcome,
            })
        }
        StreamEvent::Tool { node, event, .. } => {
            json!({ "node": &**node, "event": node_event_json(event) })
        }
        StreamEvent::Checkpoint {
            step,
            checkpoint_id,
            next,
            ..
        } => json!({ "step": step, "checkpoint_id": checkpoint_id, "next": next }),
        StreamEvent::Interrupt { interrupts, .. } => json!({ "interrupts": interrupts }),
        _ => json!({}),
    };
    JsonEvent {
        kind: e.kind(),
        namespace: e.namespace().to_string(),
        data,
    }
}

#[async_trait]
impl<S: State> Workflow for GraphRunner<S> {
    fn info(&self) -> WorkflowInfo {
        let spec = self.graph().spec();
        let drawing = self.graph().drawing();
        WorkflowInfo {
            name: self.graph().name().to_string(),
            nodes: spec.nodes.iter().map(|n| n.name.to_string()).collect(),
            mermaid: drawing.to_mermaid(None),
            drawing,
        }
    }

    fn checkpointer(&self) -> Option<Arc<dyn CheckpointSaver>> {
        GraphRunner::checkpointer(self).cloned()
    }

    async fn start(&self, i: JsonInput, config: RunConfig) -> Result<JsonRun, RunError> {
        let stream = self.stream(input::<S>(i)?, config).await?;
        Ok(JsonRun {
            inner: Box::new(stream),
        })
    }

    async fn invoke(&self, i: JsonInput, config: RunConfig) -> Result<JsonOutcome, RunError> {
        GraphRunner::invoke(self, input::<S>(i)?, config)
            .await
            .map(|o| outcome_json(&o))
    }

    async fn get_state(
        &self,
        thread: &str,
        checkpoint: Option<&str>,
    ) -> Result<JsonSnapshot, RunError> {
        GraphRunner::get_state(self, thread, checkpoint)
            .await
            .map(|s| snapshot_json(&s))
    }

    async fn history(&self, thread: &str) -> Result<Vec<JsonSnapshot>, RunError> {
        Ok(self
            .get_state_history(thread)
            .await?
            .iter()
            .map(snapshot_json)
            .collect())
    }

    async fn update_state(
        &self,
        thread: &str,
        update: Value,
        as_node: Option<&str>,
    ) -> Result<String, RunError> {
        let update = parse_update::<S>(update)?;
        GraphRunner::update_state(self, thread, update, as_node).await
    }

    async fn update_state_at(
        &self,
        thread: &str,
        checkpoint: &str,
        update: Value,
        as_node: Option<&str>,
    ) -> Result<String, RunError> {
        let update = parse_update::<S>(update)?;
        GraphRunner::update_state_at(self, thread, checkpoint, update, as_node).await
    }

    async fn fork(
        &self,
        thread: &str,
        checkpoint: &str,
        new_thread: &str,
    ) -> Result<String, RunError> {
        GraphRunner::fork(self, thread, checkpoint, new_thread).await
    }

    async fn run_task(
        &self,
        task: crate::placement::RemoteTask,
        events: tokio::sync::mpsc::Sender<crate::placement::RemoteEvent>,
    ) -> crate::placement::RemoteOutcome {
        crate::placement::run_here(self.graph(), task, events).await
    }
}
