//! Settings of the runtime and of single runs.

use ferrograph_core::StreamModes;
use std::sync::Arc;
use std::time::Duration;

/// When checkpoints reach storage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// Each checkpoint is written and flushed before the next superstep starts. A crash loses
    /// at most the superstep that was running. The default.
    #[default]
    Sync,
    /// Checkpoints are written by a background writer while the next superstep runs, at most
    /// `async_lag` behind. A crash can lose the last few supersteps (never a partial one); a
    /// resume then re-runs them.
    Async,
    /// Checkpoints are kept in memory and written when the run ends, is interrupted or fails. A
    /// crash loses the whole run since its start.
    Exit,
}

/// How many restarts a supervisor allows before it gives up and escalates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RestartIntensity {
    /// Restarts allowed in the window.
    pub max_restarts: u32,
    /// The window.
    pub within: Duration,
}

impl Default for RestartIntensity {
    fn default() -> Self {
        RestartIntensity {
            max_restarts: 5,
            within: Duration::from_secs(10),
        }
    }
}

/// Settings of a [`crate::Runtime`].
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// Runs executing at once; further runs wait for a slot (backpressure).
    pub max_concurrent_runs: usize,
    /// Capacity of each run's event stream; a slow consumer slows the run down.
    pub event_buffer: usize,
    /// Restart limit of each node's agents.
    pub restart_intensity: RestartIntensity,
    /// Idle agents kept per node; more are created under load and dropped after use.
    pub idle_agents_per_node: usize,
    /// Checkpoints the async writer may lag behind.
    pub async_lag: usize,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            max_concurrent_runs: 10_000,
            event_buffer: 1024,
            restart_intensity: RestartIntensity::default(),
            idle_agents_per_node: 256,
            async_lag: 16,
        }
    }
}

/// Settings of one run.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Thread the run belongs to; needed for checkpoints, interrupts and resume.
    pub thread_id: Option<String>,
    /// Start from this checkpoint instead of the newest (replay or fork).
    pub checkpoint_id: Option<String>,
    /// Supersteps allowed in this run before it fails with a step-limit error.
    pub max_steps: u64,
    /// Limit for the whole run.
    pub timeout: Option<Duration>,
    /// Streams to produce.
    pub stream: StreamModes,
    /// When checkpoints reach storage.
    pub durability: Durability,
    /// Stops the run from outside (a chat's Ctrl-C, a client that cancels).
    pub cancel: Option<CancelHandle>,
}

/// Stops a run from outside. [`CancelHandle::cancel`] ends the run at once with
/// [`crate::RunError::Cancelled`]: a task running on the run's coordinator is dropped where it
/// awaits (a model call stops generating), tasks on agents are stopped like at a run timeout,
/// and the thread keeps its last superstep boundary. A subgraph's own run, started by a task
/// that is stopped, is not reached (it ends at its next interrupt or when it finishes).
#[derive(Clone, Debug)]
pub struct CancelHandle {
    flag: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Default for CancelHandle {
    fn default() -> Self {
        Self::new()
    }
}

impl CancelHandle {
    /// A handle that has not been used.
    pub fn new() -> Self {
        CancelHandle {
            flag: Arc::new(tokio::sync::watch::Sender::new(false)),
        }
    }

    /// Stops the run (or runs) given this handle; later calls do nothing.
    pub fn cancel(&self) {
        self.flag.send_replace(true);
    }

    /// Whether [`CancelHandle::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        *self.flag.borrow()
    }

    /// Resolves once the handle is cancelled.
    pub async fn cancelled(&self) {
        let mut rx = self.flag.subscribe();
        let _ = rx.wait_for(|c| *c).await;
    }
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            thread_id: None,
            checkpoint_id: None,
            max_steps: 25,
            timeout: None,
            stream: StreamModes::NONE,
            durability: Durability::Sync,
            cancel: None,
        }
    }
}

impl RunConfig {
    /// A config for `thread`.
    pub fn thread(thread: impl Into<String>) -> Self {
        RunConfig {
            thread_id: Some(thread.into()),
            ..Self::default()
        }
    }

    /// Sets the step limit.
    #[must_use]
    pub fn max_steps(mut self, n: u64) -> Self {
        self.max_steps = n;
        self
    }

    /// Sets the run timeout.
    #[must_use]
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = Some(t);
        self
    }

    /// Lets `handle` stop the run.
    #[must_use]
    pub fn cancel(mut self, handle: CancelHandle) -> Self {
        self.cancel = Some(handle);
        self
    }

    /// Sets the stream modes.
    #[must_use]
    pub fn stream(mut self, modes: impl Into<StreamModes>) -> Self {
        self.stream = modes.into();
        self
    }

    /// Starts from a given checkpoint.
    #[must_use]
    pub fn at_checkpoint(mut self, id: impl Into<String>) -> Self {
        self.checkpoint_id = Some(id.into());
        self
    }

    /// Sets durability.
    #[must_use]
    pub fn durability(mut self, d: Durability) -> Self {
        self.durability = d;
        self
    }
}
