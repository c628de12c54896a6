//! The runtime: the root supervisor, admission control, graph pools and graceful drain.

use crate::config::RuntimeConfig;
use crate::error::RunError;
use crate::pool::AgentPool;
use crate::runner::GraphRunner;
use ferrograph_core::{CompiledGraph, State};
use parking_lot::Mutex;
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// The root supervisor: parent of every pool supervisor and coordinator. It records their
/// failures; a pool whose supervisor escalated is replaced on next use.
pub(crate) struct RootSupervisor;

impl Actor for RootSupervisor {
    type Msg = ();
    type State = ();
    type Arguments = ();

    async fn pre_start(&self, _m: ActorRef<()>, _a: ()) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<()>,
        event: SupervisionEvent,
        _state: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        if let SupervisionEvent::ActorFailed(cell, err) = event {
            tracing::error!(actor = %cell.get_id(), error = %err, "supervised actor failed");
        }
        Ok(())
    }
}

pub(crate) struct RuntimeInner {
    pub(crate) config: RuntimeConfig,
    pub(crate) root: ActorRef<()>,
    permits: Arc<Semaphore>,
    draining: AtomicBool,
    active: AtomicUsize,
    idle: Notify,
    busy_threads: Mutex<HashSet<String>>,
    pools: tokio::sync::Mutex<HashMap<usize, Arc<dyn Any + Send + Sync>>>,
    placer: parking_lot::RwLock<Option<Arc<dyn crate::placement::TaskPlacer>>>,
    /// Labels given to nodes from outside their graph: (graph, node) → label.
    placements: parking_lot::RwLock<HashMap<(String, String), String>>,
}

impl RuntimeInner {
    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Where the tasks of `graph`'s node `node` run: elsewhere when the node has a label (its
    /// own, or one given with [`Runtime::place`]) and there is a placer; `None` (here) costs no
    /// allocation.
    pub(crate) fn remote_for<S: State>(
        &self,
        graph: &CompiledGraph<S>,
        node: usize,
    ) -> Option<crate::placement::Remote> {
        let placer = self.placer.read().clone()?;
        let spec = graph.node(node);
        let label = spec.options.placement.clone().or_else(|| {
            self.placements
                .read()
                .get(&(graph.name().to_string(), spec.name.to_string()))
                .cloned()
        })?;
        Some(crate::placement::Remote {
            placer,
            graph: graph.name().to_string(),
            label,
        })
    }

    /// The agent pool of `graph`, started on first use (or again after an escalation).
    pub(crate) async fn pool_for<S: State>(
        self: &Arc<Self>,
        graph: &CompiledGraph<S>,
    ) -> Result<Arc<AgentPool<S>>, RunError> {
        let mut pools = self.pools.lock().await;
        if let Some(existing) = pools.get(&graph.id()) {
            if let Ok(pool) = existing.clone().downcast::<AgentPool<S>>() {
                if !pool.is_escalated() {
                    return Ok(pool);
                }
                pool.shutdown();
            }
        }
        let pool = AgentPool::start(graph.clone(), self, self.root.get_cell()).await?;
        pools.insert(graph.id(), pool.clone());
        Ok(pool)
    }

    /// Admits a run: waits for a slot, then claims the thread.
    pub(crate) async fn begin_run(
        self: &Arc<Self>,
        thread: Option<&str>,
    ) -> Result<RunGuard, RunError> {
        if self.is_draining() {
            return Err(RunError::ShuttingDown);
        }
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| RunError::ShuttingDown)?;
        if let Some(t) = thread {
            if !self.busy_threads.lock().insert(t.to_string()) {
                return Err(RunError::ThreadBusy(t.to_string()));
            }
        }
        self.active.fetch_add(1, Ordering::AcqRel);
        Ok(RunGuard {
            runtime: self.clone(),
            thread: thread.map(str::to_string),
            _permit: permit,
        })
    }
}

/// Held while a run is in progress; releases its slot and thread when dropped.
pub(crate) struct RunGuard {
    runtime: Arc<RuntimeInner>,
    thread: Option<String>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for RunGuard {
    fn drop(&mut self) {
        if let Some(t) = &self.thread {
            self.runtime.busy_threads.lock().remove(t);
        }
        if self.runtime.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.runtime.idle.notify_waiters();
        }
    }
}

/// Runs graphs: owns the supervision tree, admits runs, and drains them on shutdown.
/// Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct Runtime {
    pub(crate) inner: Arc<RuntimeInner>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("active_runs", &self.active_runs())
            .field("draining", &self.inner.is_draining())
            .finish()
    }
}

impl Runtime {
    /// A runtime with default settings. Must be called inside a tokio runtime.
    pub async fn new() -> Result<Self, RunError> {
        Self::with_config(RuntimeConfig::default()).await
    }

    /// A runtime with the given settings.
    pub async fn with_config(config: RuntimeConfig) -> Result<Self, RunError> {
        let (root, _) = Actor::spawn(None, RootSupervisor, ())
            .await
            .map_err(|e| RunError::Internal(format!("could not start the root supervisor: {e}")))?;
        Ok(Runtime {
            inner: Arc::new(RuntimeInner {
                permits: Arc::new(Semaphore::new(config.max_concurrent_runs.max(1))),
                config,
                root,
                draining: AtomicBool::new(false),
                active: AtomicUsize::new(0),
                idle: Notify::new(),
                busy_threads: Mutex::new(HashSet::new()),
                pools: tokio::sync::Mutex::new(HashMap::new()),
                placer: parking_lot::RwLock::new(None),
                placements: parking_lot::RwLock::new(HashMap::new()),
            }),
        })
    }

    /// Prepares a compiled graph to run here (starts its supervisor; agents start on demand).
    pub async fn load<S: State>(
        &self,
        graph: CompiledGraph<S>,
    ) -> Result<GraphRunner<S>, RunError> {
        let pool = self.inner.pool_for(&graph).await?;
        Ok(GraphRunner::new(self.clone(), graph, pool))
    }

    /// Runs the tasks of labelled nodes through `placer` (a cluster) from now on.
    pub fn set_placer(&self, placer: Arc<dyn crate::placement::TaskPlacer>) {
        *self.inner.placer.write() = Some(placer);
    }

    /// Pins node `node` of the graph named `graph` to cluster nodes labelled `label`, as
    /// [`NodeOptions::on`](ferrograph_core::node::NodeOptions::on) would in the graph's own
    /// code (which wins when both are set).
    pub fn place(&self, graph: &str, node: &str, label: &str) {
        self.inner
            .placements
            .write()
            .insert((graph.to_string(), node.to_string()), label.to_string());
    }

    /// Runs in progress.
    pub fn active_runs(&self) -> usize {
        self.inner.active.load(Ordering::Acquire)
    }

    /// Whether a shutdown has begun.
    pub fn is_draining(&self) -> bool {
        self.inner.is_draining()
    }

    /// Graceful shutdown: refuses new runs, lets every run finish its current superstep and
    /// save its checkpoint, then stops it (status *drained*; continue the thread later).
    /// Returns false if runs were still active after `timeout`.
    pub async fn shutdown(&self, timeout: Duration) -> bool {
        self.inner.draining.store(true, Ordering::Release);
        let wait = async {
            loop {
                let notified = self.inner.idle.notified();
                if self.active_runs() == 0 {
                    return;
                }
                notified.await;
            }
        };
        let drained = tokio::time::timeout(timeout, wait).await.is_ok();
        if drained {
            let pools = self.inner.pools.lock().await;
            for _ in pools.values() {}
            self.inner.root.stop_children(None);
        }
        drained
    }
}
