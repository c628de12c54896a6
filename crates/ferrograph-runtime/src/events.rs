//! A run's event channel and the sink nodes write into.

use ferrograph_core::node::EventSink;
use ferrograph_core::stream::{NodeEvent, NodeEventKind, StreamEvent, StreamMode, StreamModes};
use ferrograph_core::State;
use futures::future::BoxFuture;
use tokio::sync::mpsc;

/// Sending side of a run's event stream: a bounded channel plus the modes asked for.
pub(crate) struct EventTx<S: State> {
    pub(crate) tx: mpsc::Sender<StreamEvent<S>>,
    pub(crate) modes: StreamModes,
}

impl<S: State> Clone for EventTx<S> {
    fn clone(&self) -> Self {
        EventTx {
            tx: self.tx.clone(),
            modes: self.modes,
        }
    }
}

impl<S: State> EventTx<S> {
    pub(crate) fn wants(&self, mode: StreamMode) -> bool {
        self.modes.contains(mode)
            || (mode == StreamMode::Tasks && self.modes.contains(StreamMode::Debug))
    }

    /// Sends an event, waiting while the consumer is behind. A consumer that went away is
    /// ignored: the run finishes regardless.
    pub(crate) async fn send(&self, event: StreamEvent<S>) {
        let _ = self.tx.send(event).await;
    }
}

impl<S: State> EventSink for EventTx<S> {
    fn emit(&self, event: NodeEvent) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let NodeEvent {
                namespace,
                node,
                kind,
                ..
            } = event;
            let ev = match kind {
                NodeEventKind::Custom(payload) => StreamEvent::Custom {
                    namespace,
                    node,
                    payload,
                },
                NodeEventKind::Token { model, text } => StreamEvent::Token {
                    namespace,
                    node,
                    model,
                    text,
                },
                other => StreamEvent::Tool {
                    namespace,
                    node,
                    event: other,
                },
            };
            self.send(ev).await;
        })
    }

    fn wants(&self, kind: &NodeEventKind) -> bool {
        EventTx::wants(self, kind.mode())
    }
}
