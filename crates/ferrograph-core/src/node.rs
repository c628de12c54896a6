//! What a node is: an async function from a state snapshot to an output, with a context that
//! gives it interrupts, streaming and its identity.

use crate::id::stable_hash;
use crate::interrupt::Interrupt;
use crate::json::Json;
use crate::retry::RetryPolicy;
use crate::state::State;
use crate::stream::{NodeEvent, NodeEventKind};
use futures::future::BoxFuture;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The end of the graph, as an edge target.
pub const END: &str = "__end__";
/// The start of the graph, as an edge source.
pub const START: &str = "__start__";

/// A task sent to a node with its own input, for map-reduce style fan-out. Each `Send` becomes
/// its own task in the next superstep, even when several name the same node.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(bound(serialize = "S: State", deserialize = "S: State"))]
pub struct SendTo<S: State> {
    /// Target node.
    pub node: String,
    /// The input that node receives instead of the graph state.
    pub input: S,
}

impl<S: State> SendTo<S> {
    /// Sends `input` to `node`.
    pub fn new(node: impl Into<String>, input: S) -> Self {
        SendTo {
            node: node.into(),
            input,
        }
    }
}

/// Where control goes next.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(bound(serialize = "S: State", deserialize = "S: State"))]
pub enum Goto<S: State> {
    /// Run this node in the next superstep (on the merged state).
    Node(String),
    /// Run this node with its own input.
    Send(SendTo<S>),
}

impl<S: State> From<&str> for Goto<S> {
    fn from(s: &str) -> Self {
        Goto::Node(s.to_string())
    }
}

impl<S: State> From<String> for Goto<S> {
    fn from(s: String) -> Self {
        Goto::Node(s)
    }
}

impl<S: State> From<SendTo<S>> for Goto<S> {
    fn from(s: SendTo<S>) -> Self {
        Goto::Send(s)
    }
}

/// Which graph a [`Command`] addresses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandTarget {
    /// The graph the node belongs to.
    #[default]
    Current,
    /// The parent of the subgraph the node belongs to.
    Parent,
}

/// A node's combined instruction: update the state, go somewhere, and (as run input only)
/// resume an interrupt.
#[derive(Clone, Debug)]
pub struct Command<S: State> {
    /// State update.
    pub update: Option<S::Update>,
    /// Destinations, in addition to the node's edges.
    pub goto: Vec<Goto<S>>,
    /// Resume value(s), only meaningful as the input of a run.
    pub resume: Option<crate::interrupt::Resume>,
    /// Which graph the update and goto apply to.
    pub target: CommandTarget,
    /// Values that replace fields as they are, bypassing the fields' merge rules (LangGraph's
    /// `Overwrite`).
    pub overwrite: Option<S::Update>,
}

impl<S: State> Default for Command<S> {
    fn default() -> Self {
        Command {
            update: None,
            goto: Vec::new(),
            resume: None,
            target: CommandTarget::Current,
            overwrite: None,
        }
    }
}

impl<S: State> Command<S> {
    /// An empty command.
    pub fn new() -> Self {
        Self::default()
    }

    /// Goes to `target` next.
    #[must_use]
    pub fn goto(mut self, target: impl Into<Goto<S>>) -> Self {
        self.goto.push(target.into());
        self
    }

    /// Applies `update`.
    #[must_use]
    pub fn update(mut self, update: S::Update) -> Self {
        self.update = Some(update);
        self
    }

    /// Addresses the parent graph (from inside a subgraph).
    #[must_use]
    pub fn to_parent(mut self) -> Self {
        self.target = CommandTarget::Parent;
        self
    }

    /// Replaces the fields `values` sets with its values, bypassing their merge rules
    /// (LangGraph's `Overwrite`): an append list becomes exactly the given list, a counter
    /// exactly the given number. Applied after the step's ordinary updates, so it wins over
    /// them; two tasks overwriting one field in a step conflict.
    #[must_use]
    pub fn overwrite(mut self, values: S::Update) -> Self {
        self.overwrite = Some(values);
        self
    }

    /// A command that resumes the pending interrupt(s).
    pub fn resume(resume: crate::interrupt::Resume) -> Self {
        Command {
            resume: Some(resume),
            ..Self::default()
        }
    }
}

/// What a node produced.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(bound(serialize = "S: State", deserialize = "S: State"))]
pub struct NodeOutput<S: State> {
    /// Updates, merged in order.
    pub updates: Vec<S::Update>,
    /// Extra destinations.
    pub goto: Vec<Goto<S>>,
    /// Which graph the output addresses.
    pub target: CommandTarget,
    /// Values that replace fields, bypassing their merge rules (see [`Command::overwrite`]).
    pub overwrites: Vec<S::Update>,
}

impl<S: State> Default for NodeOutput<S> {
    fn default() -> Self {
        NodeOutput {
            updates: Vec::new(),
            goto: Vec::new(),
            target: CommandTarget::Current,
            overwrites: Vec::new(),
        }
    }
}

impl<S: State> NodeOutput<S> {
    /// An output that changes nothing.
    pub fn empty() -> Self {
        Self::default()
    }

    /// An output with one update.
    pub fn update(update: S::Update) -> Self {
        NodeOutput {
            updates: vec![update],
            ..Self::default()
        }
    }

    /// An output that overwrites the fields `values` sets (see [`Command::overwrite`]).
    pub fn overwrite(values: S::Update) -> Self {
        NodeOutput {
            overwrites: vec![values],
            ..Self::default()
        }
    }
}

impl<S: State> From<()> for NodeOutput<S> {
    fn from(_: ()) -> Self {
        Self::default()
    }
}

impl<S: State> From<Command<S>> for NodeOutput<S> {
    fn from(c: Command<S>) -> Self {
        NodeOutput {
            updates: c.update.into_iter().collect(),
            goto: c.goto,
            target: c.target,
            overwrites: c.overwrite.into_iter().collect(),
        }
    }
}

/// Boxed error source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a node did not produce an output.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// The node called `interrupt`: the run stops until a resume value arrives. This is control
    /// flow, not a failure.
    #[error("interrupted: {}", .0.iter().map(|i| i.id.as_str()).collect::<Vec<_>>().join(", "))]
    Interrupted(Vec<Interrupt>),
    /// The node failed.
    #[error("{message}")]
    Failed {
        /// What went wrong.
        message: String,
        /// Whether the default retry policy may retry it.
        retryable: bool,
        /// Underlying error.
        #[source]
        source: Option<BoxError>,
    },
    /// A resume value did not have the type the node expected.
    #[error("resume value for interrupt `{interrupt_id}` is not a valid {expected}: {source}")]
    BadResume {
        /// The interrupt.
        interrupt_id: String,
        /// Rust type the node asked for.
        expected: &'static str,
        /// The decoding error.
        #[source]
        source: serde_json::Error,
    },
    /// The node ran past its timeout and was stopped.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The node panicked; its agent actor died and was restarted.
    #[error("panicked: {0}")]
    Panicked(String),
    /// The agent running the node stopped without answering.
    #[error("agent stopped before answering: {0}")]
    AgentLost(String),
    /// The run was cancelled while the node ran.
    #[error("cancelled")]
    Cancelled,
    /// The cluster node running the task (see `NodeOptions::on`) was lost: it exited, was
    /// killed, or the network to it is cut. Retryable: the node's retry policy may run the
    /// task again on another cluster node with the label.
    #[error("cluster node {node} was lost while running the task: {message}")]
    NodeLost {
        /// The lost cluster node's name.
        node: String,
        /// What was seen.
        message: String,
    },
}

impl NodeError {
    /// A retryable failure with a message.
    pub fn failed(message: impl Into<String>) -> Self {
        NodeError::Failed {
            message: message.into(),
            retryable: true,
            source: None,
        }
    }

    /// A failure that no retry will fix (for example invalid input).
    pub fn fatal(message: impl Into<String>) -> Self {
        NodeError::Failed {
            message: message.into(),
            retryable: false,
            source: None,
        }
    }

    /// A retryable failure wrapping an error.
    pub fn from_error(err: impl Into<BoxError>) -> Self {
        let err = err.into();
        NodeError::Failed {
            message: err.to_string(),
            retryable: true,
            source: Some(err),
        }
    }

    /// Whether this is an interrupt rather than a failure.
    pub fn is_interrupt(&self) -> bool {
        matches!(self, NodeError::Interrupted(_))
    }

    /// Whether the default retry policy retries it.
    pub fn is_retryable(&self) -> bool {
        match self {
            NodeError::Failed { retryable, .. } => *retryable,
            NodeError::Timeout(_)
            | NodeError::Panicked(_)
            | NodeError::AgentLost(_)
            | NodeError::NodeLost { .. } => true,
            NodeError::Interrupted(_) | NodeError::BadResume { .. } | NodeError::Cancelled => false,
        }
    }
}

impl From<String> for NodeError {
    fn from(s: String) -> Self {
        NodeError::failed(s)
    }
}

impl From<&str> for NodeError {
    fn from(s: &str) -> Self {
        NodeError::failed(s)
    }
}

impl From<serde_json::Error> for NodeError {
    fn from(e: serde_json::Error) -> Self {
        NodeError::Failed {
            message: e.to_string(),
            retryable: false,
            source: Some(Box::new(e)),
        }
    }
}

impl From<std::io::Error> for NodeError {
    fn from(e: std::io::Error) -> Self {
        NodeError::from_error(e)
    }
}

impl From<BoxError> for NodeError {
    fn from(e: BoxError) -> Self {
        NodeError::from_error(e)
    }
}

/// Result of a node.
pub type NodeResult<S> = Result<NodeOutput<S>, NodeError>;

/// Receives events a node emits while it runs (custom data, tokens, tool progress).
pub trait EventSink: Send + Sync {
    /// Delivers one event; waits when the consumer is slow (backpressure).
    fn emit(&self, event: NodeEvent) -> BoxFuture<'_, ()>;
    /// Whether anyone listens for events of this kind (lets nodes skip building them).
    fn wants(&self, kind: &NodeEventKind) -> bool;
}

/// Id of the `index`-th interrupt raised by task `task_id` in subgraph namespace `namespace`.
pub fn interrupt_id(namespace: &str, task_id: &str, index: usize) -> String {
    stable_hash(&[
        namespace.as_bytes(),
        task_id.as_bytes(),
        index.to_string().as_bytes(),
    ])
}

/// What a running node knows about itself and the run, and how it talks back.
pub struct NodeContext {
    node: Arc<str>,
    task_id: Arc<str>,
    namespace: Arc<str>,
    step: u64,
    attempt: u32,
    thread_id: Option<Arc<str>>,
    resume: Vec<Json>,
    interrupt_counter: AtomicUsize,
    sink: Option<Arc<dyn EventSink>>,
    remaining_steps: Option<u64>,
    store: Option<Arc<dyn crate::store::Store>>,
}

impl fmt::Debug for NodeContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeContext")
            .field("node", &self.node)
            .field("task_id", &self.task_id)
            .field("namespace", &self.namespace)
            .field("step", &self.step)
            .field("attempt", &self.attempt)
            .field("thread_id", &self.thread_id)
            .field("resume", &self.resume)
            .field("remaining_steps", &self.remaining_steps)
            .finish()
    }
}

/// The parts a [`NodeContext`] is made from; built by the runtime.
#[derive(Clone, Default)]
pub struct NodeContextParts {
    /// Node name.
    pub node: Arc<str>,
    /// Task id.
    pub task_id: Arc<str>,
    /// Subgraph namespace ("" at the root).
    pub namespace: Arc<str>,
    /// Superstep number.
    pub step: u64,
    /// Attempt number, from 1.
    pub attempt: u32,
    /// Thread, when the run has one.
    pub thread_id: Option<Arc<str>>,
    /// Resume values for this task's interrupts, in order.
    pub resume: Vec<Json>,
    /// Event sink.
    pub sink: Option<Arc<dyn EventSink>>,
    /// Supersteps the run may still take, counting the current one (`None`: no limit known).
    pub remaining_steps: Option<u64>,
    /// The runner's long-term store, if it has one.
    pub store: Option<Arc<dyn crate::store::Store>>,
}

impl NodeContext {
    /// Builds a context.
    pub fn new(parts: NodeContextParts) -> Self {
        NodeContext {
            node: parts.node,
            task_id: parts.task_id,
            namespace: parts.namespace,
            step: parts.step,
            attempt: parts.attempt,
            thread_id: parts.thread_id,
            resume: parts.resume,
            interrupt_counter: AtomicUsize::new(0),
            sink: parts.sink,
            remaining_steps: parts.remaining_steps,
            store: parts.store,
        }
    }

    /// A context for calling a node directly, outside any run (tests, tools).
    pub fn detached(node: &str) -> Self {
        Self::new(NodeContextParts {
            node: node.into(),
            task_id: "detached".into(),
            attempt: 1,
            ..NodeContextParts::default()
        })
    }

    /// Name of the running node.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Id of the running task.
    pub fn task_id(&self) -> &str {
        &self.task_id
    }

    /// Subgraph namespace ("" at the root).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Superstep number.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Attempt number, from 1 (greater after retries).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Supersteps the run may still take before its step limit, counting the current one
    /// (LangGraph's `RemainingSteps`): 1 means this is the last step the limit allows, so a
    /// node can wrap up instead of routing into another round. `u64::MAX` outside a run.
    pub fn remaining_steps(&self) -> u64 {
        self.remaining_steps.unwrap_or(u64::MAX)
    }

    /// The long-term store shared across threads (see [`crate::store`]), when the runner was
    /// given one with `GraphRunner::with_store`.
    pub fn store(&self) -> Option<&Arc<dyn crate::store::Store>> {
        self.store.as_ref()
    }

    /// The thread the run belongs to.
    pub fn thread_id(&self) -> Option<&str> {
        self.thread_id.as_deref()
    }

    /// Id of the `index`-th interrupt of this task.
    pub fn interrupt_id(&self, index: usize) -> String {
        interrupt_id(&self.namespace, &self.task_id, index)
    }

    /// Stops the run and shows `value` to a person, or, when the run is resumed, returns the
    /// value they answered with. Call it with `?`: the first time it returns
    /// [`NodeError::Interrupted`], which stops the node. When the run is resumed the node runs
    /// again from the start and this call returns the resume value, decoded as `R`.
    ///
    /// A node may interrupt several times; each call is matched with its resume value by order.
    pub fn interrupt<T, R>(&self, value: T) -> Result<R, NodeError>
    where
        T: Serialize,
        R: DeserializeOwned,
    {
        let index = self.interrupt_counter.fetch_add(1, Ordering::SeqCst);
        let id = self.interrupt_id(index);
        if let Some(answer) = self.resume.get(index) {
            return answer
                .to_typed::<R>()
                .map_err(|source| NodeError::BadResume {
                    interrupt_id: id,
                    expected: std::any::type_name::<R>(),
                    source,
                });
        }
        let value = Json::from_serialize(&value)?;
        Err(NodeError::Interrupted(vec![Interrupt {
            id,
            node: self.node.to_string(),
            task_id: self.task_id.to_string(),
            value,
            static_: false,
        }]))
    }

    /// Emits a custom event to the *custom* stream. Waits if the consumer is slow.
    pub async fn emit_custom<T: Serialize>(&self, payload: &T) -> Result<(), NodeError> {
        let kind = NodeEventKind::Custom(Json::from_serialize(payload)?);
        self.emit(kind).await;
        Ok(())
    }

    /// Emits one event of any kind, if anyone listens for it.
    pub async fn emit(&self, kind: NodeEventKind) {
        if let Some(sink) = &self.sink {
            if sink.wants(&kind) {
                sink.emit(NodeEvent {
                    namespace: self.namespace.clone(),
                    node: self.node.clone(),
                    task_id: self.task_id.clone(),
                    kind,
                })
                .await;
            }
        }
    }

    /// Whether anyone listens for events of this kind.
    pub fn wants(&self, kind: &NodeEventKind) -> bool {
        self.sink.as_ref().is_some_and(|s| s.wants(kind))
    }

    /// The event sink, for handing to model calls that stream tokens.
    pub fn sink(&self) -> Option<Arc<dyn EventSink>> {
        self.sink.clone()
    }
}

/// A node's behaviour. Implemented for async closures by [`node_fn`].
pub trait NodeFn<S: State>: Send + Sync + 'static {
    /// Runs the node.
    fn call(&self, input: Arc<S>, ctx: NodeContext) -> BoxFuture<'static, NodeResult<S>>;
}

struct FnNode<F>(F);

impl<S, F, Fut, O> NodeFn<S> for FnNode<F>
where
    S: State,
    F: Fn(Arc<S>, NodeContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<O, NodeError>> + Send + 'static,
    O: Into<NodeOutput<S>>,
{
    fn call(&self, input: Arc<S>, ctx: NodeContext) -> BoxFuture<'static, NodeResult<S>> {
        let fut = (self.0)(input, ctx);
        Box::pin(async move { fut.await.map(Into::into) })
    }
}

/// Wraps an async function `(Arc<S>, NodeContext) -> Result<impl Into<NodeOutput<S>>, NodeError>`
/// as a node.
pub fn node_fn<S, F, Fut, O>(f: F) -> Arc<dyn NodeFn<S>>
where
    S: State,
    F: Fn(Arc<S>, NodeContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<O, NodeError>> + Send + 'static,
    O: Into<NodeOutput<S>>,
{
    Arc::new(FnNode(f))
}

/// Per-node settings.
#[derive(Clone, Debug, Default)]
pub struct NodeOptions {
    /// Retry policy; none when unset.
    pub retry: Option<RetryPolicy>,
    /// Time limit per attempt.
    pub timeout: Option<Duration>,
    /// Nodes this node may go to with a [`Command`], for validation and reachability.
    pub destinations: Vec<String>,
    /// Deferred: the node's task waits while any task of another node is planned, and runs in
    /// the first step where nothing else is pending (LangGraph's `defer=True`), for example to
    /// gather the results of branches of different lengths.
    pub defer: bool,
    /// Cache policy: a task whose node and input match an earlier successful task (within the
    /// time to live) reuses its output instead of running.
    pub cache: Option<CachePolicy>,
    /// The cluster label the node's tasks run on (see [`NodeOptions::on`]); anywhere when
    /// unset.
    pub placement: Option<String>,
}

/// How a node's outputs are cached. The key is the node's name and its input (the state
/// snapshot, or a `Send` payload); a task that is answering an interrupt is never cached.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CachePolicy {
    /// How long an entry is used; forever when unset.
    pub ttl: Option<Duration>,
}

impl CachePolicy {
    /// Entries are used forever (while the graph is loaded).
    pub fn new() -> Self {
        Self::default()
    }

    /// Entries are used for `ttl` after they were written.
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }
}

impl NodeOptions {
    /// Default options.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the retry policy.
    #[must_use]
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = Some(policy);
        self
    }

    /// Sets the per-attempt timeout.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Defers the node: it runs only when nothing else is pending.
    #[must_use]
    pub fn defer(mut self) -> Self {
        self.defer = true;
        self
    }

    /// Caches the node's outputs under `policy`.
    #[must_use]
    pub fn cache(mut self, policy: CachePolicy) -> Self {
        self.cache = Some(policy);
        self
    }

    /// Pins the node's tasks to cluster nodes labelled `label` (`gpu`, …): when the runtime
    /// has a task placer (a cluster), each task runs on the least busy node with the label;
    /// its input goes there as JSON and its output comes back, and its events (tokens,
    /// custom data) are streamed back as it runs. Without a placer the label is ignored and
    /// tasks run here.
    #[must_use]
    pub fn on(mut self, label: impl Into<String>) -> Self {
        self.placement = Some(label.into());
        self
    }

    /// Declares the destinations of the node's commands.
    #[must_use]
    pub fn destinations<I, T>(mut self, targets: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        self.destinations = targets.into_iter().map(Into::into).collect();
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interrupt_then_resume_by_order() {
        let ctx = NodeContext::detached("n");
        let err = ctx.interrupt::<_, String>("question").unwrap_err();
        let NodeError::Interrupted(list) = err else {
            panic!("expected interrupt")
        };
        assert_eq!(list[0].value, Json(serde_json::json!("question")));
        let first_id = list[0].id.clone();

        let ctx = NodeContext::new(NodeContextParts {
            node: "n".into(),
            task_id: "detached".into(),
            resume: vec![Json(serde_json::json!("yes"))],
            ..Default::default()
        });
        let answer: String = ctx.interrupt("question").unwrap();
        assert_eq!(answer, "yes");
        assert_eq!(ctx.interrupt_id(0), first_id);
        let second = ctx.interrupt::<_, String>("again").unwrap_err();
        assert!(second.is_interrupt());
    }

    #[test]
    fn bad_resume_is_typed() {
        let ctx = NodeContext::new(NodeContextParts {
            resume: vec![Json(serde_json::json!({"not": "a number"}))],
            ..Default::default()
        });
        let err = ctx.interrupt::<_, u32>("q").unwrap_err();
        assert!(matches!(err, NodeError::BadResume { .. }), "{err:?}");
        assert!(!err.is_retryable());
    }
}
