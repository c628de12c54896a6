//! Agent actors and their supervisor.
//!
//! The tasks of a step with several tasks run inside agent actors (a step's only task runs on
//! the run's coordinator, which has nothing else to do meanwhile). Agents of a node are
//! pooled: an idle agent takes the next task of that node, runs it, answers the coordinator
//! and goes back to the pool. Each agent handles one task at a time, so its mailbox never
//! holds more than one message; concurrency comes from having several agents.
//!
//! All agents of a graph are linked to one supervisor actor. A node that panics makes its
//! agent fail on purpose after reporting the panic to the coordinator; the supervisor then
//! restarts it (a fresh agent joins the pool) unless the node's tasks panicked (on agents or
//! on coordinators) more than `max_restarts` times within the window, in which case the node
//! escalates: it is marked failed, runs that reach it fail with [`RunError::Escalated`], and
//! the supervisor stops with an error that its own supervisor (the runtime's root) records.

use crate::config::RuntimeConfig;
use crate::coordinator::{CoordMsg, Coordinator, RunArgs, TaskResult};
use crate::error::RunError;
use crate::runtime::RuntimeInner;
use crate::subgraph::run_subgraph;
use ferrograph_core::engine::panic_message;
use ferrograph_core::graph::NodeKind;
use ferrograph_core::json::Json;
use ferrograph_core::node::{NodeContext, NodeContextParts, NodeError};
use ferrograph_core::{CompiledGraph, State};
use futures::FutureExt;
use parking_lot::Mutex;
use ractor::{Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, SupervisionEvent};
use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Instant;
use tracing::Instrument as _;

/// A task handed to an agent.
pub(crate) struct TaskRequest<S: State> {
    /// The task's span (see [`crate::coordinator`]): the node's work runs in it.
    pub(crate) span: tracing::Span,
    pub(crate) node: usize,
    pub(crate) input: Arc<S>,
    pub(crate) ctx: NodeContextParts,
    /// Resume values addressed by interrupt id (a subgraph routes them to its own tasks).
    pub(crate) resume: Vec<(String, Json)>,
    /// An interrupted subgraph's saved frame.
    pub(crate) child: Option<Vec<u8>>,
    pub(crate) max_steps: u64,
    pub(crate) events: Option<crate::events::EventTx<S>>,
    pub(crate) reply: ReplyGuard<S>,
}

/// Answers the coordinator exactly once: with the result, or, if the agent dies first (panic
/// unwinding, kill on timeout), with [`NodeError::AgentLost`] from `Drop`.
pub(crate) struct ReplyGuard<S: State> {
    pub(crate) coord: ActorRef<CoordMsg<S>>,
    pub(crate) gen: u64,
    pub(crate) slot: usize,
    pub(crate) attempt: u32,
    pub(crate) started: Instant,
    pub(crate) sent: bool,
}

impl<S: State> ReplyGuard<S> {
    fn send(mut self, result: TaskResult<S>) {
        self.sent = true;
        let _ = self.coord.cast(CoordMsg::TaskDone {
            gen: self.gen,
            slot: self.slot,
            attempt: self.attempt,
            result,
            duration: self.started.elapsed(),
        });
    }
}

impl<S: State> Drop for ReplyGuard<S> {
    fn drop(&mut self) {
        if !self.sent {
            let _ = self.coord.cast(CoordMsg::TaskDone {
                gen: self.gen,
                slot: self.slot,
                attempt: self.attempt,
                result: TaskResult::Failed(NodeError::AgentLost(
                    "the agent stopped while running the task".into(),
                )),
                duration: self.started.elapsed(),
            });
        }
    }
}

/// Runs a function node's task, on an agent or on a coordinator, and says how it ended. The
/// node's events go to `events`. A panic, also one thrown before the node returns its future,
/// unwinds out of the returned future for the caller to catch.
pub(crate) async fn call_node<S: State>(
    f: &dyn ferrograph_core::node::NodeFn<S>,
    input: Arc<S>,
    ctx: NodeContextParts,
    events: Option<crate::events::EventTx<S>>,
) -> TaskResult<S> {
    // Events go to the run's stream; a task received from another node brings its own sink.
    let sink = events
        .map(|e| Arc::new(e) as Arc<dyn ferrograph_core::node::EventSink>)
        .or(ctx.sink.clone());
    let ctx = NodeContext::new(NodeContextParts { sink, ..ctx });
    match f.call(input, ctx).await {
        Ok(out) => TaskResult::Output(out),
        Err(NodeError::Interrupted(list)) => TaskResult::Interrupted {
            interrupts: list,
            child: None,
        },
        Err(e) => TaskResult::Failed(e),
    }
}

/// Runs a function node's task here, or on another node when it is placed there.
pub(crate) async fn run_func_task<S: State>(
    remote: Option<crate::placement::Remote>,
    f: &dyn ferrograph_core::node::NodeFn<S>,
    input: Arc<S>,
    ctx: NodeContextParts,
    events: Option<crate::events::EventTx<S>>,
) -> TaskResult<S> {
    match remote {
        Some(remote) => remote.run(input, ctx, events).await,
        None => call_node(f, input, ctx, events).await,
    }
}

/// Messages an agent understands.
pub(crate) enum AgentMsg<S: State> {
    /// Run a task and answer through its reply guard.
    Execute(Box<TaskRequest<S>>),
}

/// Local only: never sent to another node (ractor's `cluster` feature asks every message
/// type to say whether it serializes; this one does not).
impl<S: State> ractor::Message for AgentMsg<S> {}

/// The agent actor: runs one node's tasks.
pub(crate) struct AgentActor<S: State> {
    pool: Weak<AgentPool<S>>,
    node: usize,
}

impl<S: State> Actor for AgentActor<S> {
    type Msg = AgentMsg<S>;
    type State = ();
    type Arguments = ();

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        _args: (),
    ) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        _state: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        let AgentMsg::Execute(req) = message;
        let Some(pool) = self.pool.upgrade() else {
            // The pool is gone: the guard answers with AgentLost.
            myself.stop(None);
            return Ok(());
        };
        let TaskRequest {
            span,
            node,
            input,
            ctx,
            resume,
            child: child_saved,
            max_steps,
            events,
            reply,
        } = *req;
        debug_assert_eq!(node, self.node);
        let spec = pool.graph.node(node);
        let work = async {
            match &spec.kind {
                NodeKind::Func(f) => {
                    let remote = pool
                        .runtime
                        .upgrade()
                        .and_then(|rt| rt.remote_for(&pool.graph, node));
                    run_func_task(remote, f.as_ref(), input, ctx, events.clone()).await
                }
                NodeKind::Foreign(child) => {
                    let Some(runtime) = pool.runtime.upgrade() else {
                        return TaskResult::Failed(NodeError::fatal("the runtime is gone"));
                    };
                    let call = ferrograph_core::subgraph::ChildCall {
                        ctx: ctx.clone(),
                        saved: child_saved,
                        resume,
                        max_steps,
                    };
                    match child.run(runtime, input, call).await {
                        ferrograph_core::subgraph::ChildOutcome::Output(out) => {
                            TaskResult::Output(out)
                        }
                        ferrograph_core::subgraph::ChildOutcome::Interrupted {
                            interrupts,
                            saved,
                        } => TaskResult::Interrupted {
                            interrupts,
                            child: Some(saved),
                        },
                        ferrograph_core::subgraph::ChildOutcome::Failed(e) => TaskResult::Failed(e),
                    }
                }
                NodeKind::Subgraph(graph) => {
                    let Some(runtime) = pool.runtime.upgrade() else {
                        return TaskResult::Failed(NodeError::fatal("the runtime is gone"));
                    };
                    Box::pin(run_subgraph(
                        &runtime,
                        graph.clone(),
                        input,
                        &ctx,
                        child_saved,
                        resume,
                        max_steps,
                        events.clone(),
                    ))
                    .await
                }
            }
        };
        match Box::pin(AssertUnwindSafe(work.instrument(span)).catch_unwind()).await {
            Ok(result) => {
                reply.send(result);
                pool.release(self.node, myself);
                Ok(())
            }
            Err(payload) => {
                let message = panic_message(payload.as_ref());
                reply.send(TaskResult::Failed(NodeError::Panicked(message.clone())));
                // Fail on purpose so that the supervisor sees it and restarts the agent.
                Err(format!("node `{}` panicked: {message}", spec.name).into())
            }
        }
    }
}

/// The per-graph supervisor actor.
pub(crate) struct PoolSupervisor<S: State> {
    pool: Weak<AgentPool<S>>,
}

/// Messages of the supervisor.
pub(crate) enum SupervisorMsg {
    /// Stop every agent and then the supervisor.
    Shutdown,
    /// A node escalated (this says why): fail.
    Escalate(String),
}

/// Local only: never sent to another node (ractor's `cluster` feature asks every message
/// type to say whether it serializes; this one does not).
impl ractor::Message for SupervisorMsg {}

impl<S: State> Actor for PoolSupervisor<S> {
    type Msg = SupervisorMsg;
    type State = ();
    type Arguments = ();

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        _args: (),
    ) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<Self::Msg>,
        _state: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        myself.stop_children(None);
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: SupervisorMsg,
        _state: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        match message {
            SupervisorMsg::Shutdown => {
                myself.stop_children(None);
                myself.stop(None);
            }
            // A node that ran on a coordinator panicked past the restart limit: fail as for
            // an agent's, so that the runtime's root sees the escalation.
            SupervisorMsg::Escalate(failure) => return Err(failure.into()),
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        _state: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        let Some(pool) = self.pool.upgrade() else {
            return Ok(());
        };
        match event {
            SupervisionEvent::ActorFailed(cell, err) => {
                let Some(node) = pool.forget(cell.get_id()) else {
                    return Ok(());
                };
                let name = pool.graph.node(node).name.to_string();
                if let Some(failure) = pool.count_failure(node, &err.to_string()) {
                    tracing::error!(node = %name, error = %err, "restart limit exceeded, escalating");
                    return Err(failure.into());
                }
                tracing::warn!(node = %name, error = %err, "agent failed, restarting");
                pool.restarts
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if let Ok(agent) = pool.spawn_agent(node, myself.get_cell()).await {
                    pool.release(node, agent);
                }
            }
            SupervisionEvent::ActorTerminated(cell, _, _) => {
                pool.forget(cell.get_id());
            }
            _ => {}
        }
        Ok(())
    }
}

/// The agents of one compiled graph.
pub(crate) struct AgentPool<S: State> {
    pub(crate) graph: CompiledGraph<S>,
    pub(crate) runtime: Weak<RuntimeInner>,
    pub(crate) config: RuntimeConfig,
    me: Weak<AgentPool<S>>,
    supervisor: OnceLock<ActorRef<SupervisorMsg>>,
    idle: Vec<Mutex<Vec<ActorRef<AgentMsg<S>>>>>,
    agents: Mutex<HashMap<ActorId, usize>>,
    escalated: Mutex<Option<(usize, String)>>,
    /// When each node's tasks last panicked, within the restart window.
    failures: Mutex<HashMap<usize, VecDeque<Instant>>>,
    coordinators: Mutex<Vec<ActorRef<CoordMsg<S>>>>,
    /// Agents restarted after a failure.
    pub(crate) restarts: AtomicU64,
    /// Outputs of nodes with a cache policy.
    pub(crate) node_cache: crate::node_cache::NodeCache<S>,
}

impl<S: State> AgentPool<S> {
    /// Creates the pool and its supervisor, linked under `root`.
    pub(crate) async fn start(
        graph: CompiledGraph<S>,
        runtime: &Arc<RuntimeInner>,
        root: ActorCell,
    ) -> Result<Arc<Self>, RunError> {
        let n = graph.spec().nodes.len();
        let pool = Arc::new_cyclic(|me| AgentPool {
            graph,
            runtime: Arc::downgrade(runtime),
            config: runtime.config.clone(),
            me: me.clone(),
            supervisor: OnceLock::new(),
            idle: (0..n).map(|_| Mutex::new(Vec::new())).collect(),
            agents: Mutex::new(HashMap::new()),
            escalated: Mutex::new(None),
            failures: Mutex::new(HashMap::new()),
            coordinators: Mutex::new(Vec::new()),
            restarts: AtomicU64::new(0),
            node_cache: crate::node_cache::NodeCache::new(),
        });
        let (sup, _) = Actor::spawn_linked(
            None,
            PoolSupervisor {
                pool: Arc::downgrade(&pool),
            },
            (),
            root,
        )
        .await
        .map_err(|e| RunError::Internal(format!("could not start the supervisor: {e}")))?;
        let _ = pool.supervisor.set(sup);
        Ok(pool)
    }

    fn supervisor_cell(&self) -> Result<ActorCell, RunError> {
        self.supervisor
            .get()
            .map(|s| s.get_cell())
            .ok_or_else(|| RunError::Internal("agent pool has no supervisor".into()))
    }

    /// Fails with [`RunError::Escalated`] when `node`'s failures went past the restart limit.
    pub(crate) fn check_escalated(&self, node: usize) -> Result<(), RunError> {
        match &*self.escalated.lock() {
            Some((bad, reason)) if *bad == node => Err(RunError::Escalated {
                node: self.graph.node(node).name.to_string(),
                reason: reason.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// Counts a panic of one of `node`'s tasks against the restart intensity. Past the limit,
    /// the node escalates and this returns why (the supervisor fails with it).
    fn count_failure(&self, node: usize, error: &str) -> Option<String> {
        let limit = self.config.restart_intensity;
        let now = Instant::now();
        let count = {
            let mut failures = self.failures.lock();
            let history = failures.entry(node).or_default();
            history.push_back(now);
            while history
                .front()
                .is_some_and(|t| now.duration_since(*t) > limit.within)
            {
                history.pop_front();
            }
            history.len()
        };
        if count as u32 <= limit.max_restarts {
            return None;
        }
        self.escalate(node, error.to_string());
        Some(format!(
            "tasks of node `{}` panicked {count} times within {:?}: {error}",
            self.graph.node(node).name,
            limit.within
        ))
    }

    /// A task of `node` that ran on its coordinator panicked: count it as an agent's failure
    /// would be (no agent needs replacing), escalating past the limit.
    pub(crate) fn node_panicked(&self, node: usize, message: &str) {
        let reason = format!("node `{}` panicked: {message}", self.graph.node(node).name);
        if let Some(failure) = self.count_failure(node, &reason) {
            tracing::error!(node = %self.graph.node(node).name, error = %reason, "restart limit exceeded, escalating");
            if let Some(s) = self.supervisor.get() {
                let _ = s.cast(SupervisorMsg::Escalate(failure));
            }
        } else {
            tracing::warn!(node = %self.graph.node(node).name, error = %reason, "node panicked");
        }
    }

    /// An idle agent for `node`, or a new one.
    pub(crate) async fn acquire(&self, node: usize) -> Result<ActorRef<AgentMsg<S>>, RunError> {
        self.check_escalated(node)?;
        if let Some(agent) = self.idle[node].lock().pop() {
            return Ok(agent);
        }
        self.spawn_agent(node, self.supervisor_cell()?).await
    }

    async fn spawn_agent(
        &self,
        node: usize,
        supervisor: ActorCell,
    ) -> Result<ActorRef<AgentMsg<S>>, RunError> {
        let actor = AgentActor {
            pool: self.me.clone(),
            node,
        };
        let (agent, _) = Actor::spawn_linked(None, actor, (), supervisor)
            .await
            .map_err(|e| RunError::Internal(format!("could not start an agent: {e}")))?;
        self.agents.lock().insert(agent.get_id(), node);
        Ok(agent)
    }

    /// Hands `args` to an idle coordinator (or a new one), which starts the run at once.
    pub(crate) async fn start_run(&self, args: RunArgs<S>) -> Result<(), RunError> {
        let mut msg = CoordMsg::Start(Box::new(args));
        // An idle coordinator that died since it was released gives the message back.
        for _ in 0..3 {
            let idle = self.coordinators.lock().pop();
            let coord = match idle {
                Some(c) => c,
                None => {
                    let (c, _) = Actor::spawn_linked(
                        None,
                        Coordinator::<S>::new(),
                        (),
                        self.supervisor_cell()?,
                    )
                    .await
                    .map_err(|e| {
                        RunError::Internal(format!("could not start a coordinator: {e}"))
                    })?;
                    c
                }
            };
            match coord.cast(msg) {
                Ok(()) => return Ok(()),
                Err(ractor::MessagingErr::SendErr(back)) => msg = back,
                Err(e) => return Err(RunError::Internal(format!("coordinator unreachable: {e}"))),
            }
        }
        Err(RunError::Internal(
            "no coordinator could take the run".into(),
        ))
    }

    /// Returns a coordinator that finished its run to the idle pool.
    pub(crate) fn release_coordinator(&self, coord: ActorRef<CoordMsg<S>>) {
        let mut idle = self.coordinators.lock();
        if idle.len() < self.config.idle_agents_per_node {
            idle.push(coord);
        } else {
            drop(idle);
            coord.stop(None);
        }
    }

    /// Returns an agent to the idle pool, or stops it if the pool is full.
    pub(crate) fn release(&self, node: usize, agent: ActorRef<AgentMsg<S>>) {
        let mut idle = self.idle[node].lock();
        if idle.len() < self.config.idle_agents_per_node {
            idle.push(agent);
        } else {
            drop(idle);
            agent.stop(None);
        }
    }

    fn forget(&self, id: ActorId) -> Option<usize> {
        let node = self.agents.lock().remove(&id)?;
        self.idle[node].lock().retain(|a| a.get_id() != id);
        Some(node)
    }

    fn escalate(&self, node: usize, reason: String) {
        *self.escalated.lock() = Some((node, reason));
        for agent in self.idle[node].lock().drain(..) {
            agent.stop(None);
        }
    }

    /// Whether the supervisor escalated.
    pub(crate) fn is_escalated(&self) -> bool {
        self.escalated.lock().is_some()
    }

    /// Stops the supervisor and every agent.
    pub(crate) fn shutdown(&self) {
        if let Some(s) = self.supervisor.get() {
            let _ = s.cast(SupervisorMsg::Shutdown);
        }
    }

    /// Agents alive now.
    pub(crate) fn agent_count(&self) -> usize {
        self.agents.lock().len()
    }
}
