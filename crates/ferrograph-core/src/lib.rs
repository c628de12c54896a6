//! Core of ferrograph: typed state with merge rules, messages, the graph builder and its
//! validation, and the superstep semantics of a run. No IO and no ML live here; the runtime
//! crate executes what this crate defines.

#[allow(unused_extern_crates)]
extern crate self as ferrograph_core;

pub mod checkpoint;
pub mod drawing;
pub mod engine;
pub mod graph;
pub mod id;
pub mod interrupt;
pub mod json;
pub mod message;
pub mod migrate;
pub mod node;
pub mod retry;
pub mod state;
pub mod store;
pub mod stream;
pub mod subgraph;

pub use ferrograph_macros::State;

pub use checkpoint::{CheckpointError, CheckpointSaver, ThreadInfo, ThreadStatus};
pub use engine::{Frame, StepError};
pub use graph::{CompileError, CompiledGraph, GraphProblem, Route, StateGraph};
pub use interrupt::{Interrupt, Resume};
pub use json::Json;
pub use message::{
    Message, MessageOp, MessagesUpdate, Role, TokenUsage, ToolCall, ToolSpec, ToolStatus,
};
pub use node::{
    CachePolicy, Command, Goto, NodeContext, NodeError, NodeOptions, NodeOutput, NodeResult,
    SendTo, END, START,
};
pub use retry::{RetryPolicy, Retryable};
pub use state::{ReducerError, State, StateUpdate};
pub use store::{Store, StoreError};
pub use stream::{StreamEvent, StreamMode, StreamModes};

/// Re-exports used by generated code. Not a public API.
#[doc(hidden)]
pub mod __private {
    pub use serde;
}

/// The names most programs need.
pub mod prelude {
    pub use crate::message::{Message, MessageOp, MessagesUpdate, ToolCall, ToolSpec};
    pub use crate::node::{
        CachePolicy, Command, NodeContext, NodeError, NodeOptions, NodeOutput, SendTo, END, START,
    };
    pub use crate::retry::RetryPolicy;
    pub use crate::state::{State, StateUpdate};
    pub use crate::stream::{StreamEvent, StreamMode, StreamModes};
    pub use crate::{graph::Route, graph::StateGraph, CompiledGraph, Json, Resume};
    pub use ferrograph_macros::State;
}
