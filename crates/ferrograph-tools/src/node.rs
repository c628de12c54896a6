//! Running a model's tool calls in a graph: [`ToolExecutor`], the tool node built from it,
//! and the [`tools_condition`] router.

use crate::registry::ToolRegistry;
use crate::tool::{output_text, ToolContext, ToolError};
use ferrograph_core::message::{Message, Role, ToolCall, ToolStatus};
use ferrograph_core::node::{NodeContext, NodeError, NodeOutput};
use ferrograph_core::state::State;
use ferrograph_core::stream::NodeEventKind;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument;

/// A graph state with a list of chat messages, which the tool node reads and appends to.
///
/// Implement it in two lines for a state with a `#[reducer(messages)]` field, or use
/// [`impl_has_messages!`](crate::impl_has_messages):
///
/// ```
/// use ferrograph_core::prelude::*;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(State, Clone, Debug, Default, Serialize, Deserialize)]
/// struct Chat {
///     #[reducer(messages)]
///     messages: Vec<Message>,
/// }
/// ferrograph_tools::impl_has_messages!(Chat, ChatUpdate, messages);
/// ```
pub trait HasMessages: State {
    /// The conversation so far.
    fn messages(&self) -> &[Message];
    /// An update that appends `messages` to the conversation.
    fn messages_update(messages: Vec<Message>) -> Self::Update;
}

/// Implements [`HasMessages`] for a state whose `field` uses the messages rule:
/// `impl_has_messages!(State, StateUpdate, field)`.
#[macro_export]
macro_rules! impl_has_messages {
    ($state:ty, $update:ty, $field:ident) => {
        impl $crate::HasMessages for $state {
            fn messages(&self) -> &[$crate::__private::Message] {
                &self.$field
            }
            fn messages_update(messages: ::std::vec::Vec<$crate::__private::Message>) -> $update {
                <$update>::default().$field(messages)
            }
        }
    };
}

/// Whether the last message is an AI message asking for tools.
pub fn has_tool_calls(messages: &[Message]) -> bool {
    pending_tool_calls(messages).is_some()
}

/// The tool calls of the last message, when it is an AI message that has some.
pub fn pending_tool_calls(messages: &[Message]) -> Option<&[ToolCall]> {
    match messages.last() {
        Some(m) if m.role == Role::Ai && !m.tool_calls.is_empty() => Some(&m.tool_calls),
        _ => None,
    }
}

/// A router for `add_conditional_edges`: to `tools_node` when the last AI message has tool
/// calls, else to `next` (for example `END`, or a synthesis node).
///
/// ```ignore
/// graph.add_conditional_edges("agent", tools_condition::<Chat>("tools", END), ["tools", END])
/// ```
pub fn tools_condition<S: HasMessages>(
    tools_node: impl Into<String>,
    next: impl Into<String>,
) -> impl Fn(&S) -> String + Send + Sync + 'static {
    let tools_node = tools_node.into();
    let next = next.into();
    move |s: &S| {
        if has_tool_calls(s.messages()) {
            tools_node.clone()
        } else {
            next.clone()
        }
    }
}

/// Runs tool calls against a [`ToolRegistry`]: concurrently, each with its own timeout, every
/// outcome turned into a tool-result message.
///
/// - A tool that returns gives a message with [`ToolStatus::Success`] and the result as
///   content (a JSON string as is, other JSON as its text).
/// - Unknown tools, bad arguments, tool errors and panics give [`ToolStatus::Error`] with the
///   error as content; running past the timeout gives [`ToolStatus::Timeout`] (the call is
///   aborted). None of them fails the node, so the model can read the error and recover.
/// - Every result's metadata records `duration_ms` and `status` (and `error_kind` on
///   failures); `tool_start` / `tool_end` events go to the run's *tasks* stream.
#[derive(Clone, Debug)]
pub struct ToolExecutor {
    registry: ToolRegistry,
    timeout: Duration,
    timeouts: HashMap<String, Duration>,
    max_concurrency: usize,
}

/// The future a tool node returns.
pub type NodeFuture<S> =
    std::pin::Pin<Box<dyn Future<Output = Result<NodeOutput<S>, NodeError>> + Send>>;

/// Default per-call timeout of a [`ToolExecutor`].
pub const DEFAULT_TOOL_TIMEOUT: Duration = Duration::from_secs(30);

impl ToolExecutor {
    /// An executor over `registry` with a 30 s timeout per call and no concurrency limit.
    pub fn new(registry: ToolRegistry) -> Self {
        ToolExecutor {
            registry,
            timeout: DEFAULT_TOOL_TIMEOUT,
            timeouts: HashMap::new(),
            max_concurrency: usize::MAX,
        }
    }

    /// Sets the timeout of every call.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets the timeout of calls to the tool named `tool`.
    #[must_use]
    pub fn tool_timeout(mut self, tool: impl Into<String>, timeout: Duration) -> Self {
        self.timeouts.insert(tool.into(), timeout);
        self
    }

    /// Runs at most `n` calls at a time (at least 1).
    #[must_use]
    pub fn max_concurrency(mut self, n: usize) -> Self {
        self.max_concurrency = n.max(1);
        self
    }

    /// The registry.
    pub fn registry(&self) -> &ToolRegistry {
        &self.registry
    }

    /// The timeout of calls to `tool`.
    pub fn timeout_for(&self, tool: &str) -> Duration {
        self.timeouts.get(tool).copied().unwrap_or(self.timeout)
    }

    /// Runs `calls` concurrently; returns one tool-result message per call, in call order.
    /// `ctx` (the node's context) receives the `tool_start` / `tool_end` events.
    pub async fn execute(&self, calls: &[ToolCall], ctx: Option<&NodeContext>) -> Vec<Message> {
        let limit = Arc::new(tokio::sync::Semaphore::new(
            self.max_concurrency
                .min(tokio::sync::Semaphore::MAX_PERMITS),
        ));
        let futures = calls.iter().map(|call| {
            let limit = limit.clone();
            async move {
                // The semaphore is never closed, so acquiring only waits.
                let _permit = limit.acquire().await.ok();
                self.execute_one(call, ctx).await
            }
        });
        futures::future::join_all(futures).await
    }

    /// Runs the tool calls of the last message when it is an AI message with calls (none
    /// otherwise).
    pub async fn execute_pending(
        &self,
        messages: &[Message],
        ctx: Option<&NodeContext>,
    ) -> Vec<Message> {
        match pending_tool_calls(messages) {
            Some(calls) => self.execute(calls, ctx).await,
            None => Vec::new(),
        }
    }

    async fn execute_one(&self, call: &ToolCall, ctx: Option<&NodeContext>) -> Message {
        let timeout = self.timeout_for(&call.name);
        if let Some(ctx) = ctx {
            ctx.emit(NodeEventKind::ToolStart {
                call_id: call.id.clone(),
                tool: call.name.clone(),
            })
            .await;
        }
        let span = tracing::info_span!("tool", tool = %call.name, call_id = %call.id);
        let started = Instant::now();
        let result = self
            .run_call(call, ctx, timeout)
            .instrument(span.clone())
            .await;
        let duration = started.elapsed();
        let (status, content, kind) = match result {
            Ok(value) => (ToolStatus::Success, output_text(&value), None),
            Err(e @ ToolError::Timeout { .. }) => {
                (ToolStatus::Timeout, e.to_string(), Some("timeout"))
            }
            Err(e) => (ToolStatus::Error, format!("error: {e}"), Some(e.kind())),
        };
        let status_name = match status {
            ToolStatus::Success => "success",
            ToolStatus::Error => "error",
            ToolStatus::Timeout => "timeout",
        };
        span.in_scope(|| {
            tracing::debug!(
                status = status_name,
                duration_ms = duration.as_millis() as u64,
                "tool call finished"
            );
        });
        if let Some(ctx) = ctx {
            ctx.emit(NodeEventKind::ToolEnd {
                call_id: call.id.clone(),
                tool: call.name.clone(),
                status: status_name.to_string(),
                duration,
            })
            .await;
        }
        let mut msg = Message::tool(call, status, content)
            .with_metadata(
                "duration_ms",
                format!("{:.3}", duration.as_secs_f64() * 1e3),
            )
            .with_metadata("status", status_name);
        if let Some(kind) = kind {
            msg = msg.with_metadata("error_kind", kind);
        }
        msg
    }

    async fn run_call(
        &self,
        call: &ToolCall,
        ctx: Option<&NodeContext>,
        timeout: Duration,
    ) -> Result<serde_json::Value, ToolError> {
        let tool = self.registry.require(&call.name)?;
        let tool_ctx = ToolContext {
            call_id: call.id.clone(),
            tool: call.name.clone(),
            node: ctx.map(|c| c.node().to_string()).unwrap_or_default(),
            thread_id: ctx.and_then(|c| c.thread_id().map(str::to_string)),
            timeout: Some(timeout),
            store: ctx.and_then(|c| c.store().cloned()),
        };
        let args = call.args.0.clone();
        // A task of its own: a panicking tool becomes an error, and a timed-out one is aborted.
        let handle = tokio::spawn(async move { tool.call(args, &tool_ctx).await });
        let abort = handle.abort_handle();
        match tokio::time::timeout(timeout, handle).await {
            Ok(Ok(result)) => result,
            Ok(Err(join)) => Err(ToolError::failed(if join.is_panic() {
                format!("tool `{}` panicked", call.name)
            } else {
                format!("tool `{}` was cancelled", call.name)
            })),
            Err(_) => {
                abort.abort();
                Err(ToolError::Timeout {
                    tool: call.name.clone(),
                    timeout,
                })
            }
        }
    }

    /// The tool node for a state with messages: runs the last AI message's tool calls and
    /// appends their results. Add it with `graph.add_node("tools", executor.node())`.
    pub fn node<S: HasMessages>(
        &self,
    ) -> impl Fn(Arc<S>, NodeContext) -> NodeFuture<S> + Send + Sync + 'static {
        self.node_with(|s: &S| s.messages(), S::messages_update)
    }

    /// The tool node for any state: `read` gets the messages (only the last one is looked
    /// at), `update` turns the tool results into the state's update.
    ///
    /// ```ignore
    /// graph.add_node("tools", executor.node_with(|s: &Chat| &s.history[..], |m| ChatUpdate::new().history(m)))
    /// ```
    pub fn node_with<S, R, U>(
        &self,
        read: R,
        update: U,
    ) -> impl Fn(Arc<S>, NodeContext) -> NodeFuture<S> + Send + Sync + 'static
    where
        S: State,
        R: for<'a> Fn(&'a S) -> &'a [Message] + Send + Sync + 'static,
        U: Fn(Vec<Message>) -> S::Update + Send + Sync + 'static,
    {
        let exec = self.clone();
        let read = Arc::new(read);
        let update = Arc::new(update);
        move |state: Arc<S>, ctx: NodeContext| {
            let exec = exec.clone();
            let read = read.clone();
            let update = update.clone();
            Box::pin(async move {
                let calls = pending_tool_calls(read(&state)).map(<[ToolCall]>::to_vec);
                let Some(calls) = calls else {
                    return Ok(NodeOutput::empty());
                };
                let results = exec.execute(&calls, Some(&ctx)).await;
                if results.is_empty() {
                    return Ok(NodeOutput::empty());
                }
                Ok(NodeOutput::update(update(results)))
            })
        }
    }
}
