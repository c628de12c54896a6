//! Tasks that run on other nodes of a cluster.
//!
//! A graph node pinned to a label ([`NodeOptions::on`], or [`Runtime::place`] for a graph
//! someone else wrote) runs its tasks through the runtime's [`TaskPlacer`] when it has one:
//! the task's input and context go out as a [`RemoteTask`], the node's events come back as
//! [`RemoteEvent`]s while it runs, and its output comes back as a [`RemoteOutcome`]. Everything
//! else stays here: the coordinator plans the steps, merges the outputs and writes the
//! checkpoints, so a worker that disappears takes no committed state with it. A lost worker
//! is a retryable task failure ([`NodeError::Failed`] with `retryable: true`): the node's
//! retry policy decides whether it runs again (on another node with the label), and without
//! one the run fails with the error, which names the lost node.
//!
//! The crate has no network code: `ferrograph-cluster` implements [`TaskPlacer`] on
//! ractor_cluster, and a worker runs the tasks it receives with [`crate::Workflow::run_task`].
//!
//! [`NodeOptions::on`]: ferrograph_core::node::NodeOptions::on
//! [`Runtime::place`]: crate::Runtime::place

use crate::coordinator::TaskResult;
use async_trait::async_trait;
use ferrograph_core::interrupt::Interrupt;
use ferrograph_core::json::Json;
use ferrograph_core::node::{EventSink, NodeContextParts, NodeError, NodeOutput};
use ferrograph_core::stream::{NodeEvent, NodeEventKind};
use ferrograph_core::State;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use tokio::sync::mpsc;

/// A task sent to another node.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RemoteTask {
    /// The graph's name (the worker runs the graph of that name).
    pub graph: String,
    /// The node to run.
    pub node: String,
    /// The label the task must run on.
    pub label: String,
    /// The node's input (the state, or a `Send` payload) as JSON.
    pub input: serde_json::Value,
    /// Task id.
    pub task_id: String,
    /// Subgraph namespace.
    pub namespace: String,
    /// Superstep.
    pub step: u64,
    /// Attempt, from 1.
    pub attempt: u32,
    /// The run's thread.
    pub thread_id: Option<String>,
    /// Resume values for the task's interrupts.
    pub resume: Vec<Json>,
    /// Supersteps left.
    pub remaining_steps: Option<u64>,
}

/// An event a remote task emitted, forwarded to the run's stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum RemoteEvent {
    /// Custom data.
    Custom(Json),
    /// A model token.
    Token {
        /// The model.
        model: String,
        /// The text.
        text: String,
    },
}

/// How a remote task ended.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum RemoteOutcome {
    /// The node's output, as the JSON of its `NodeOutput`.
    Output(serde_json::Value),
    /// The node asked for input.
    Interrupted(Vec<Interrupt>),
    /// The node failed.
    Failed {
        /// What went wrong.
        message: String,
        /// Whether the retry policy may run it again.
        retryable: bool,
    },
}

/// Runs tasks on other nodes (implemented by the cluster).
#[async_trait]
pub trait TaskPlacer: Send + Sync {
    /// Runs `task` on a node labelled `task.label`, sending the events it emits to `events`
    /// as they come. A node lost mid-task is `Err` with a retryable [`NodeError::Failed`]
    /// naming it; the caller's retry policy decides what happens next.
    async fn run(
        &self,
        task: RemoteTask,
        events: mpsc::Sender<RemoteEvent>,
    ) -> Result<RemoteOutcome, NodeError>;
}

impl RemoteTask {
    /// The task of node `graph`/`ctx.node` with `input`.
    pub(crate) fn new<S: State>(
        graph: &str,
        label: &str,
        input: &S,
        ctx: &NodeContextParts,
    ) -> Result<Self, NodeError> {
        let input = serde_json::to_value(input).map_err(|e| {
            NodeError::fatal(format!(
                "the task's input cannot be sent to another node: {e}"
            ))
        })?;
        Ok(RemoteTask {
            graph: graph.to_string(),
            node: ctx.node.to_string(),
            label: label.to_string(),
            input,
            task_id: ctx.task_id.to_string(),
            namespace: ctx.namespace.to_string(),
            step: ctx.step,
            attempt: ctx.attempt,
            thread_id: ctx.thread_id.as_ref().map(|t| t.to_string()),
            resume: ctx.resume.clone(),
            remaining_steps: ctx.remaining_steps,
        })
    }

    /// The context parts of this task on the worker (events go to `sink`).
    pub fn context(&self, sink: Option<Arc<dyn EventSink>>) -> NodeContextParts {
        NodeContextParts {
            node: self.node.as_str().into(),
            task_id: self.task_id.as_str().into(),
            namespace: self.namespace.as_str().into(),
            step: self.step,
            attempt: self.attempt,
            thread_id: self.thread_id.as_deref().map(Into::into),
            resume: self.resume.clone(),
            sink,
            remaining_steps: self.remaining_steps,
            store: None,
        }
    }
}

/// Where a placed node's tasks go: the placer, the graph's name and the label.
pub(crate) struct Remote {
    pub(crate) placer: Arc<dyn TaskPlacer>,
    pub(crate) graph: String,
    pub(crate) label: String,
}

impl Remote {
    /// Runs a task of node `ctx.node` through the placer, forwarding its events to `events`
    /// as the node's own.
    pub(crate) async fn run<S: State>(
        self,
        input: Arc<S>,
        ctx: NodeContextParts,
        events: Option<crate::events::EventTx<S>>,
    ) -> TaskResult<S> {
        run_remote(self, input, ctx, events).await
    }
}

async fn run_remote<S: State>(
    remote: Remote,
    input: Arc<S>,
    ctx: NodeContextParts,
    events: Option<crate::events::EventTx<S>>,
) -> TaskResult<S> {
    let task = match RemoteTask::new(&remote.graph, &remote.label, input.as_ref(), &ctx) {
        Ok(t) => t,
        Err(e) => return TaskResult::Failed(e),
    };
    let (tx, mut rx) = mpsc::channel::<RemoteEvent>(256);
    let sink = events.map(|e| Arc::new(e) as Arc<dyn EventSink>);
    let (namespace, node, task_id) = (ctx.namespace.clone(), ctx.node.clone(), ctx.task_id);
    let forward = async move {
        while let Some(ev) = rx.recv().await {
            let Some(sink) = &sink else { continue };
            let kind = match ev {
                RemoteEvent::Custom(v) => NodeEventKind::Custom(v),
                RemoteEvent::Token { model, text } => NodeEventKind::Token { model, text },
            };
            if sink.wants(&kind) {
                sink.emit(NodeEvent {
                    namespace: namespace.clone(),
                    node: node.clone(),
                    task_id: task_id.clone(),
                    kind,
                })
                .await;
            }
        }
    };
    let (result, ()) = tokio::join!(remote.placer.run(task, tx), forward);
    match result {
        Ok(RemoteOutcome::Output(json)) => match serde_json::from_value::<NodeOutput<S>>(json) {
            Ok(out) => TaskResult::Output(out),
            Err(e) => TaskResult::Failed(NodeError::fatal(format!(
                "the remote task's output is not this graph's: {e}"
            ))),
        },
        Ok(RemoteOutcome::Interrupted(interrupts)) => TaskResult::Interrupted {
            interrupts,
            child: None,
        },
        Ok(RemoteOutcome::Failed { message, retryable }) => TaskResult::Failed(if retryable {
            NodeError::failed(message)
        } else {
            NodeError::fatal(message)
        }),
        Err(e) => TaskResult::Failed(e),
    }
}

/// Forwards a worker-side task's token and custom events into a channel.
struct ForwardSink(mpsc::Sender<RemoteEvent>);

impl EventSink for ForwardSink {
    fn emit(&self, event: NodeEvent) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let ev = match event.kind {
                NodeEventKind::Custom(v) => RemoteEvent::Custom(v),
                NodeEventKind::Token { model, text } => RemoteEvent::Token { model, text },
                _ => return,
            };
            let _ = self.0.send(ev).await;
        })
    }

    fn wants(&self, kind: &NodeEventKind) -> bool {
        matches!(kind, NodeEventKind::Custom(_) | NodeEventKind::Token { .. })
    }
}

/// Runs a task received from another node on `graph` here.
pub(crate) async fn run_here<S: State>(
    graph: &ferrograph_core::CompiledGraph<S>,
    task: RemoteTask,
    events: mpsc::Sender<RemoteEvent>,
) -> RemoteOutcome {
    use ferrograph_core::graph::NodeKind;
    use futures::FutureExt;
    let fail = |message: String, retryable: bool| RemoteOutcome::Failed { message, retryable };
    let Some(index) = graph.node_index(&task.node) else {
        return fail(
            format!("graph {} has no node {}", graph.name(), task.node),
            false,
        );
    };
    let NodeKind::Func(f) = &graph.node(index).kind else {
        return fail(
            format!(
                "node {} is a subgraph: only function nodes run on other nodes",
                task.node
            ),
            false,
        );
    };
    let input: S = match serde_json::from_value(task.input.clone()) {
        Ok(i) => i,
        Err(e) => {
            return fail(
                format!("the task's input is not this graph's state: {e}"),
                false,
            )
        }
    };
    let sink: Arc<dyn EventSink> = Arc::new(ForwardSink(events));
    let parts = task.context(Some(sink));
    let run = std::panic::AssertUnwindSafe(crate::pool::call_node(
        f.as_ref(),
        Arc::new(input),
        parts,
        None,
    ))
    .catch_unwind();
    match run.await {
        Ok(TaskResult::Output(out)) => match serde_json::to_value(&out) {
            Ok(json) => RemoteOutcome::Output(json),
            Err(e) => fail(format!("the node's output cannot be sent back: {e}"), false),
        },
        Ok(TaskResult::Interrupted { interrupts, .. }) => RemoteOutcome::Interrupted(interrupts),
        Ok(TaskResult::Failed(e)) => fail(e.to_string(), e.is_retryable()),
        Err(panic) => fail(
            format!(
                "panicked on the worker: {}",
                ferrograph_core::engine::panic_message(&*panic)
            ),
            false,
        ),
    }
}
