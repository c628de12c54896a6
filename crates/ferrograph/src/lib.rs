//! ferrograph: agent graphs on supervised actors, on one machine.
//!
//! LangGraph's programming model (typed state with merge rules, nodes, conditional edges,
//! parallel fan-out with `SendTo`, interrupts, checkpoints, subgraphs, streaming) with every
//! node running in a supervised actor.
//!
//! ```no_run
//! use ferrograph::prelude::*;
//! use serde::{Deserialize, Serialize};
//! use std::sync::Arc;
//!
//! #[derive(State, Clone, Debug, Default, Serialize, Deserialize)]
//! struct Counter {
//!     #[reducer(add)]
//!     count: i64,
//! }
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let graph = StateGraph::<Counter>::new("counter")
//!     .add_node("inc", |_s: Arc<Counter>, _ctx: NodeContext| async move {
//!         Ok::<_, NodeError>(CounterUpdate::new().count(1))
//!     })
//!     .add_edge(START, "inc")
//!     .add_edge("inc", END)
//!     .compile()?;
//! let runtime = Runtime::new().await?;
//! let runner = runtime.load(graph).await?;
//! let out = runner
//!     .invoke(RunInput::update(CounterUpdate::new().count(41)), RunConfig::default())
//!     .await?;
//! assert_eq!(out.state.count, 42);
//! # Ok(()) }
//! ```

pub mod settings;

pub use ferrograph_chat as chat;
pub use ferrograph_checkpoint as checkpoint_savers;
pub use ferrograph_core as core;
pub use ferrograph_runtime as runtime;

pub use ferrograph_checkpoint::MemorySaver;
pub use ferrograph_core::{
    CheckpointError, CheckpointSaver, Command, CompileError, CompiledGraph, Interrupt, Json,
    Message, NodeContext, NodeError, NodeOptions, NodeOutput, Resume, RetryPolicy, SendTo, State,
    StateGraph, StreamEvent, StreamMode, StreamModes, ThreadInfo, ThreadStatus, END, START,
};
pub use settings::WorkflowSettings;

pub use ferrograph_runtime::{
    CancelHandle, Durability, Entry, GraphRunner, MappedSubgraph, Registry, RegistryError,
    RunConfig, RunError, RunInput, RunOutcome, RunStatus, RunStream, Runtime, RuntimeConfig,
    SnapshotTask, StateEdit, StateSnapshot,
};

/// Everything most programs need, in one import.
pub mod prelude {
    pub use ferrograph_checkpoint::MemorySaver;
    pub use ferrograph_core::prelude::*;
    pub use ferrograph_runtime::{
        Durability, GraphRunner, RunConfig, RunError, RunInput, RunOutcome, RunStatus, Runtime,
        RuntimeConfig,
    };
}
