//! Errors of runs and of the runtime.

use ferrograph_core::checkpoint::CheckpointError;
use ferrograph_core::{NodeError, StepError};
use std::time::Duration;

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// A node failed after its retries. The step's other writes are kept as pending writes, so
    /// resuming the thread re-runs only the failed task.
    #[error("node `{node}` failed (task {task_id}, attempt {attempts}): {source}")]
    Node {
        /// Node.
        node: String,
        /// Task.
        task_id: String,
        /// Attempts made.
        attempts: u32,
        /// The last error.
        #[source]
        source: NodeError,
    },
    /// Merging or routing a step failed.
    #[error(transparent)]
    Step(#[from] StepError),
    /// The run executed its maximum number of supersteps.
    #[error("step limit of {limit} supersteps reached without finishing (raise max_steps if the graph loops on purpose)")]
    StepLimit {
        /// The limit.
        limit: u64,
    },
    /// The whole run took longer than its timeout.
    #[error("run timed out after {0:?}; the last superstep boundary is saved")]
    Timeout(Duration),
    /// The run was stopped through its [`crate::CancelHandle`].
    #[error("run cancelled; the last superstep boundary is saved")]
    Cancelled,
    /// Checkpoint storage failed or returned damaged data.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// No such thread.
    #[error("thread `{0}` not found")]
    ThreadNotFound(String),
    /// A run is already in progress on the thread.
    #[error("thread `{0}` already has a run in progress")]
    ThreadBusy(String),
    /// A resume value was given but nothing is waiting for one.
    #[error("thread `{0}` has no pending interrupt to resume")]
    NoPendingInterrupt(String),
    /// A resume value was addressed to an interrupt that is not pending.
    #[error("interrupt `{id}` is not pending (pending: {})", pending.join(", "))]
    UnknownInterrupt {
        /// The id given.
        id: String,
        /// The pending ids.
        pending: Vec<String>,
    },
    /// A single resume value was given while several interrupts are pending.
    #[error("{} interrupts are pending; address resume values by id: {}", pending.len(), pending.join(", "))]
    AmbiguousResume {
        /// The pending ids.
        pending: Vec<String>,
    },
    /// The operation needs a checkpointer and a thread id.
    #[error("this operation needs a checkpointer and a thread id")]
    NoCheckpointer,
    /// There is nothing to continue: the thread has no checkpoint and no input was given.
    #[error("thread `{0}` has no checkpoint to continue from; give an input")]
    NothingToContinue(String),
    /// A node's agents failed more often than their restart limit allows.
    #[error("agents of node `{node}` exceeded their restart limit and were escalated: {reason}")]
    Escalated {
        /// Node.
        node: String,
        /// Last failure.
        reason: String,
    },
    /// The input (or an update) does not fit the graph's state.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A thread id breaks the id rule (`ferrograph_core::id::check_thread_id`).
    #[error("invalid thread id: {0}")]
    InvalidThreadId(#[from] ferrograph_core::id::InvalidId),
    /// The runtime is shutting down and accepts no new runs.
    #[error("the runtime is shutting down")]
    ShuttingDown,
    /// An invariant of the runtime broke (a bug).
    #[error("internal runtime error: {0}")]
    Internal(String),
}
