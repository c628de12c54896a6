//! Where streamed tokens go.

use ferrograph_core::node::{EventSink, NodeContext};
use ferrograph_core::stream::{NodeEvent, NodeEventKind};
use std::fmt;
use std::sync::Arc;

/// A callback taking the model name and one piece of text.
pub type PieceCallback = Arc<dyn Fn(&str, &str) + Send + Sync>;

/// Receives the text of generated tokens, in order, while a model generates. The pieces
/// concatenate to the final message text (text held back because it might start a stop string
/// is sent once it is known not to).
#[derive(Clone)]
pub enum TokenSink {
    /// The run's event stream: each piece becomes a [`NodeEventKind::Token`] event of the node
    /// (the *tokens* stream mode).
    Events {
        /// The node's sink (`ctx.sink()`).
        sink: Arc<dyn EventSink>,
        /// Subgraph namespace of the node.
        namespace: Arc<str>,
        /// Node name.
        node: Arc<str>,
        /// Task id.
        task_id: Arc<str>,
    },
    /// A callback, called with the model name and each piece.
    Callback(PieceCallback),
    /// A channel of pieces; a full channel slows generation down (backpressure).
    Channel(tokio::sync::mpsc::Sender<String>),
}

impl fmt::Debug for TokenSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenSink::Events { node, task_id, .. } => f
                .debug_struct("TokenSink::Events")
                .field("node", node)
                .field("task_id", task_id)
                .finish(),
            TokenSink::Callback(_) => f.write_str("TokenSink::Callback"),
            TokenSink::Channel(_) => f.write_str("TokenSink::Channel"),
        }
    }
}

impl TokenSink {
    /// The token stream of the node running with `ctx`, when the run has an event sink.
    pub fn from_context(ctx: &NodeContext) -> Option<Self> {
        let sink = ctx.sink()?;
        Some(TokenSink::Events {
            sink,
            namespace: ctx.namespace().into(),
            node: ctx.node().into(),
            task_id: ctx.task_id().into(),
        })
    }

    /// A sink that calls `f(model, piece)` for every piece.
    pub fn callback(f: impl Fn(&str, &str) + Send + Sync + 'static) -> Self {
        TokenSink::Callback(Arc::new(f))
    }

    /// Whether anyone will see the tokens (lets the model skip streaming work).
    pub fn wants_tokens(&self, model: &str) -> bool {
        match self {
            TokenSink::Events { sink, .. } => sink.wants(&NodeEventKind::Token {
                model: model.to_string(),
                text: String::new(),
            }),
            TokenSink::Callback(_) => true,
            TokenSink::Channel(tx) => !tx.is_closed(),
        }
    }

    /// Delivers one piece of text.
    pub async fn send(&self, model: &str, text: &str) {
        match self {
            TokenSink::Events {
                sink,
                namespace,
                node,
                task_id,
            } => {
                let kind = NodeEventKind::Token {
                    model: model.to_string(),
                    text: text.to_string(),
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
            TokenSink::Callback(f) => f(model, text),
            TokenSink::Channel(tx) => {
                // A dropped receiver only means nobody listens any more.
                let _ = tx.send(text.to_string()).await;
            }
        }
    }
}
