//! The ferrograph runtime: runs compiled graphs on supervised actors.
//!
//! A [`Runtime`] owns a supervision tree. Each loaded graph gets a supervisor whose agent
//! actors run its nodes; each run gets a coordinator actor that drives its supersteps. Actors
//! exchange typed messages only. See `coordinator` for the step protocol and `pool` for
//! supervision and restarts.

mod config;
pub mod confine;
mod coordinator;
mod erased;
mod error;
mod events;
mod node_cache;
pub mod owner;
pub mod placement;
mod pool;
pub mod registry;
mod runner;
mod runtime;
mod subgraph;
mod writer;

pub use config::{CancelHandle, Durability, RestartIntensity, RunConfig, RuntimeConfig};
pub use confine::{InputPath, PathError, PathRole, PathRoots};
pub use erased::{
    event_json, outcome_json, path_of, JsonEvent, JsonInput, JsonOutcome, JsonRun, JsonSnapshot,
    Workflow, WorkflowInfo,
};
pub use error::RunError;
pub use owner::{Liveness, RunOwner};
pub use placement::{RemoteEvent, RemoteOutcome, RemoteTask, TaskPlacer};
pub use registry::{Entry, MetricsFn, ParseArgs, Registry, RegistryError};
pub use runner::{
    GraphRunner, RunInput, RunOutcome, RunStatus, RunStream, SnapshotTask, StateEdit, StateSnapshot,
};
pub use runtime::Runtime;
pub use subgraph::MappedSubgraph;
