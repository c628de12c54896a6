//! Subgraphs with a state type of their own (LangGraph's subgraph with different state
//! schemas): the contract between a graph and the runtime that runs such a child.
//!
//! A node of a `StateGraph<P>` can run a compiled graph over another state `C`, with a
//! function from the parent's state to the child's input and one from the child's final state
//! to the parent's update (so a child can have keys the parent does not, and the reverse). The
//! runtime implements [`ForeignGraph`] for such children (`ferrograph_runtime::MappedSubgraph`);
//! this module only says what a run of one is given and what it gives back.

use crate::interrupt::Interrupt;
use crate::json::Json;
use crate::node::{NodeContextParts, NodeError, NodeOutput};
use crate::state::State;
use futures::future::BoxFuture;
use std::any::Any;
use std::sync::Arc;

/// What a run of a child graph is given.
#[derive(Clone, Default)]
pub struct ChildCall {
    /// The parent task's context (node, task id, namespace, thread, store).
    pub ctx: NodeContextParts,
    /// The child's saved state, when it interrupted before and is being resumed.
    pub saved: Option<Vec<u8>>,
    /// Resume values addressed by interrupt id.
    pub resume: Vec<(String, Json)>,
    /// The step limit of the child's run.
    pub max_steps: u64,
}

/// How a run of a child graph ended, in the parent's terms.
#[derive(Debug)]
pub enum ChildOutcome<P: State> {
    /// It finished: the parent node's output.
    Output(NodeOutput<P>),
    /// It stopped on interrupts; `saved` resumes it.
    Interrupted {
        /// The child's open interrupts.
        interrupts: Vec<Interrupt>,
        /// The child's saved frame and pending writes.
        saved: Vec<u8>,
    },
    /// It failed.
    Failed(NodeError),
}

/// A child graph over another state type, run as one node of a `StateGraph<P>`.
pub trait ForeignGraph<P: State>: Send + Sync + 'static {
    /// The child graph's name.
    fn graph_name(&self) -> &str;

    /// Runs (or resumes) the child for one parent task. `host` is the runtime that runs it,
    /// opaque here (the runtime's own implementation knows its type).
    fn run(
        &self,
        host: Arc<dyn Any + Send + Sync>,
        input: Arc<P>,
        call: ChildCall,
    ) -> BoxFuture<'static, ChildOutcome<P>>;
}
