//! The coordinator actor: one per run, it drives the supersteps.
//!
//! A step: plan the tasks (from the frame), reuse outputs recorded by an earlier attempt of
//! the same step, hand the rest to agents (or, when one task is left, run it here: see
//! `runs_inline`), collect their answers (retrying failures under the node's policy, killing
//! agents that overrun their timeout), and at the barrier either merge everything into a new
//! checkpoint or, if a task failed or interrupted, record the finished tasks' outputs as
//! pending writes and stop. Nothing of a step is applied unless all of it is.

use crate::config::RunConfig;
use crate::error::RunError;
use crate::events::EventTx;
use crate::pool::{run_func_task, AgentMsg, AgentPool, ReplyGuard, TaskRequest};
use crate::runtime::{RunGuard, RuntimeInner};
use crate::writer::Writer;
use ferrograph_core::checkpoint::{
    decode_output, encode_checkpoint, encode_output, ChainStats, CheckpointSaver, CheckpointSource,
    PendingKind, PendingWrite, ThreadInfo, ThreadStatus,
};
use ferrograph_core::engine::{panic_message, FinishedTask, Frame, PlannedTask};
use ferrograph_core::graph::NodeKind;
use ferrograph_core::id::stable_hash;
use ferrograph_core::json::Json;
use ferrograph_core::node::{interrupt_id, CommandTarget, NodeContextParts, NodeError, NodeOutput};
use ferrograph_core::stream::{StreamEvent, StreamMode, TaskOutcome};
use ferrograph_core::{CompiledGraph, Interrupt, State, StateUpdate};
use futures::FutureExt;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tracing::Instrument as _;

/// What an agent reports for a task.
pub(crate) enum TaskResult<S: State> {
    Output(NodeOutput<S>),
    Interrupted {
        interrupts: Vec<Interrupt>,
        child: Option<Vec<u8>>,
    },
    Failed(NodeError),
}

/// Messages of the coordinator. Coordinators are pooled and reused run after run; every
/// message about a run carries the run's generation, and messages of an earlier run are ignored.
pub(crate) enum CoordMsg<S: State> {
    /// Take on a run.
    Start(Box<RunArgs<S>>),
    /// An agent answered.
    TaskDone {
        gen: u64,
        slot: usize,
        attempt: u32,
        result: TaskResult<S>,
        duration: Duration,
    },
    /// A task's attempt ran out of time.
    TaskTimeout { gen: u64, slot: usize, attempt: u32 },
    /// Dispatch a task again after its backoff.
    Retry { gen: u64, slot: usize },
    /// The whole run ran out of time.
    RunTimeout { gen: u64 },
    /// The run's cancel handle was used.
    RunCancelled { gen: u64 },
}

/// Local only: never sent to another node (ractor's `cluster` feature asks every message
/// type to say whether it serializes; this one does not).
impl<S: State> ractor::Message for CoordMsg<S> {}

/// How a run ended.
pub(crate) enum RunEnd<S: State> {
    Done {
        frame: Frame<S>,
        writes: Vec<S::Update>,
    },
    Interrupted {
        frame: Frame<S>,
        /// The state as the caller sees it: the frame's, with the outputs of the tasks that
        /// finished in the stopped step applied (as `get_state` shows it).
        view: Arc<S>,
        interrupts: Vec<Interrupt>,
        pending: Vec<PendingWrite>,
        /// Subgraph mode: updates merged so far.
        merged: Vec<S::Update>,
    },
    Drained {
        frame: Frame<S>,
    },
    /// A subgraph node addressed its parent: the subgraph stops and the parent applies this
    /// command's own update and goto, and nothing else the subgraph wrote.
    Parent {
        output: NodeOutput<S>,
    },
    Failed(RunError),
}

/// Everything a coordinator starts with.
pub(crate) struct RunArgs<S: State> {
    pub(crate) graph: CompiledGraph<S>,
    pub(crate) pool: Arc<AgentPool<S>>,
    pub(crate) runtime: Arc<RuntimeInner>,
    pub(crate) writer: Writer,
    pub(crate) thread_id: Option<Arc<str>>,
    pub(crate) namespace: Arc<str>,
    pub(crate) frame: Frame<S>,
    pub(crate) stats: ChainStats,
    pub(crate) pending: Vec<PendingWrite>,
    pub(crate) config: RunConfig,
    pub(crate) events: Option<EventTx<S>>,
    pub(crate) done: oneshot::Sender<RunEnd<S>>,
    /// Subgraph mode: keep every merged update for the parent; parent commands end the run.
    pub(crate) is_subgraph: bool,
    /// Holds the thread (and the runtime's admission) until the run is dropped, which
    /// happens before its answer is sent.
    pub(crate) _guard: Option<RunGuard>,
    /// Where to record the thread's status when the run ends.
    pub(crate) saver: Option<Arc<dyn CheckpointSaver>>,
    pub(crate) thread_info: Option<ThreadInfo>,
    /// Subgraph mode: updates merged before an interrupt, when resuming.
    pub(crate) merged: Vec<S::Update>,
    /// Where to leave the final frame for the thread's next run.
    pub(crate) cache: Option<Arc<crate::runner::FrameCache<S>>>,
    /// The run continues a thread with a command: its first step passes static breakpoints.
    pub(crate) resuming: bool,
    /// The long-term store nodes see.
    pub(crate) store: Option<Arc<dyn ferrograph_core::Store>>,
    /// The span the run was started under (a subgraph's run: its node's), the parent of the
    /// run's own span.
    pub(crate) parent_span: tracing::Span,
}

enum SlotState<S: State> {
    Waiting,
    Running,
    Done(NodeOutput<S>),
    Interrupted(Vec<Interrupt>),
    Failed(NodeError),
}

struct Slot<S: State> {
    task: PlannedTask<S>,
    node: usize,
    attempt: u32,
    resume: Vec<(String, Json)>,
    child: Option<Vec<u8>>,
    state: SlotState<S>,
    agent: Option<ActorRef<AgentMsg<S>>>,
    started: Instant,
    /// Whether its output is already recorded as a pending write.
    recorded: bool,
    /// Its key in the node cache, when its node has a cache policy and it ran.
    cache_key: Option<String>,
}

/// A finished run's answer, sent once the run's resources are released.
pub(crate) struct Answer<S: State> {
    done: oneshot::Sender<RunEnd<S>>,
    end: RunEnd<S>,
}

/// The coordinator's state: its current run, if any.
pub(crate) struct CoordState<S: State> {
    gen: u64,
    run: Option<Box<RunState<S>>>,
}

/// State of the run a coordinator drives.
pub(crate) struct RunState<S: State> {
    gen: u64,
    args: RunArgs<S>,
    done: Option<oneshot::Sender<RunEnd<S>>>,
    slots: Vec<Slot<S>>,
    outstanding: usize,
    steps_run: u64,
    pass_static_before: bool,
    collected: Vec<S::Update>,
    started: Instant,
    /// The run's span (target `ferrograph::trace`): supersteps and node tasks nest under it,
    /// and model calls under their node (exported over OTLP when the CLI is told to).
    span: tracing::Span,
    /// The span of the superstep in progress.
    step_span: tracing::Span,
}

/// The coordinator actor.
pub(crate) struct Coordinator<S: State>(std::marker::PhantomData<fn() -> S>);

impl<S: State> Coordinator<S> {
    pub(crate) fn new() -> Self {
        Coordinator(std::marker::PhantomData)
    }
}

impl<S: State> Actor for Coordinator<S> {
    type Msg = CoordMsg<S>;
    type State = CoordState<S>;
    type Arguments = ();

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        _args: (),
    ) -> Result<CoordState<S>, ActorProcessingErr> {
        Ok(CoordState { gen: 0, run: None })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        cs: &mut CoordState<S>,
    ) -> Result<(), ActorProcessingErr> {
        let current = cs.gen;
        let stale = |gen: u64| gen != current;
        // Each arm is boxed so that this handler's own future stays small: ractor moves it onto
        // the heap for every message, and a large future costs a large copy each time.
        let mut outcome: StepOutcome<S> = match message {
            CoordMsg::Start(args) => {
                cs.gen += 1;
                let st = RunState::begin(cs.gen, *args, &myself);
                let st = cs.run.insert(Box::new(st));
                Box::pin(st.emit_start_values()).await;
                Box::pin(st.start_step(&myself)).await
            }
            CoordMsg::TaskDone {
                gen,
                slot,
                attempt,
                result,
                duration,
            } => match cs.run.as_mut() {
                Some(st) if !stale(gen) => {
                    Box::pin(st.task_done(&myself, slot, attempt, result, duration)).await
                }
                _ => return Ok(()),
            },
            CoordMsg::TaskTimeout { gen, slot, attempt } => match cs.run.as_mut() {
                Some(st) if !stale(gen) => Box::pin(st.task_timeout(&myself, slot, attempt)).await,
                _ => return Ok(()),
            },
            CoordMsg::Retry { gen, slot } => match cs.run.as_mut() {
                Some(st) if !stale(gen) => Box::pin(st.run_task(&myself, slot)).await,
                _ => return Ok(()),
            },
            CoordMsg::RunTimeout { gen } => match cs.run.as_mut() {
                Some(st) if !stale(gen) => {
                    st.kill_running();
                    let limit = st.args.config.timeout.unwrap_or_default();
                    Err(RunError::Timeout(limit))
                }
                _ => return Ok(()),
            },
            CoordMsg::RunCancelled { gen } => match cs.run.as_mut() {
                Some(st) if !stale(gen) => {
                    st.kill_running();
                    Err(RunError::Cancelled)
                }
                _ => return Ok(()),
            },
        };
        let Some(st) = cs.run.as_mut() else {
            return Ok(());
        };
        // Steps follow each other here, without a round trip through the mailbox.
        let end = loop {
            match outcome {
                Ok(Flow::Wait) => return Ok(()),
                Ok(Flow::Next) => outcome = Box::pin(st.start_step(&myself)).await,
                Ok(Flow::End(end)) => break end,
                Err(e) => break RunEnd::Failed(e),
            }
        };
        let answer = st.finish(end).await;
        let pool = st.args.pool.clone();
        // The run's thread guard, saver and writer go before the answer does.
        cs.run = None;
        if let Some(Answer { done, end }) = answer {
            let _ = done.send(end);
        }
        pool.release_coordinator(myself);
        Ok(())
    }
}

impl<S: State> RunState<S> {
    fn begin(gen: u64, mut args: RunArgs<S>, myself: &ActorRef<CoordMsg<S>>) -> Self {
        let done = args.done_take();
        let collected = std::mem::take(&mut args.merged);
        let pass_static_before = args.resuming
            || args
                .pending
                .iter()
                .any(|w| matches!(w.kind, PendingKind::StaticInterrupt));
        if let Some(t) = args.config.timeout {
            let me = myself.clone();
            tokio::spawn(async move {
                tokio::time::sleep(t).await;
                let _ = me.cast(CoordMsg::RunTimeout { gen });
            });
        }
        if let Some(c) = args.config.cancel.clone() {
            let me = myself.clone();
            tokio::spawn(async move {
                c.cancelled().await;
                let _ = me.cast(CoordMsg::RunCancelled { gen });
            });
        }
        let span = tracing::info_span!(
            target: "ferrograph::trace",
            parent: &args.parent_span,
            "ferrograph.run",
            graph = %args.graph.name(),
            thread_id = args.thread_id.as_deref().unwrap_or(""),
            namespace = %args.namespace,
            checkpoint_id = %args.frame.checkpoint_id,
        );
        RunState {
            gen,
            args,
            done: Some(done),
            slots: Vec::new(),
            outstanding: 0,
            steps_run: 0,
            pass_static_before,
            collected,
            started: Instant::now(),
            step_span: tracing::Span::none(),
            span,
        }
    }
}

impl<S: State> RunArgs<S> {
    fn done_take(&mut self) -> oneshot::Sender<RunEnd<S>> {
        let (placeholder, _) = oneshot::channel();
        std::mem::replace(&mut self.done, placeholder)
    }
}

/// What the coordinator does after handling a message.
pub(crate) enum Flow<S: State> {
    /// Wait for more messages (tasks are running).
    Wait,
    /// Start the next superstep now.
    Next,
    /// The run is over.
    End(RunEnd<S>),
}

type StepOutcome<S> = Result<Flow<S>, RunError>;

impl<S: State> RunState<S> {
    async fn emit(&self, mode: StreamMode, make: impl FnOnce() -> StreamEvent<S>) {
        if let Some(ev) = &self.args.events {
            if ev.wants(mode) {
                ev.send(make()).await;
            }
        }
    }

    /// A run opens with the state it starts from (its input, or the checkpoint it resumes),
    /// as LangGraph's *values* stream does.
    async fn emit_start_values(&self) {
        let ns = self.args.namespace.clone();
        let (step, state) = (self.args.frame.step, self.args.frame.state.clone());
        self.emit(StreamMode::Values, || StreamEvent::Values {
            namespace: ns,
            step,
            state,
        })
        .await;
    }

    /// One *updates* event per task, in plan order: the task's writes folded into one update
    /// where the fields' rules allow it (a subgraph node's writes are its child's), an empty
    /// update for a task that wrote nothing.
    async fn emit_task_updates(&self, step: u64, tasks: Vec<(String, Vec<S::Update>)>) {
        let Some(ev) = &self.args.events else {
            return;
        };
        for (node, updates) in tasks {
            let mut folded: Vec<S::Update> = Vec::with_capacity(1);
            for u in updates {
                match folded.last_mut() {
                    Some(last) => {
                        if let Err(u) = last.merge(u) {
                            folded.push(u);
                        }
                    }
                    None => folded.push(u),
                }
            }
            if folded.is_empty() {
                folded.push(S::Update::default());
            }
            let node: Arc<str> = node.as_str().into();
            for update in folded {
                ev.send(StreamEvent::Updates {
                    namespace: self.args.namespace.clone(),
                    step,
                    node: node.clone(),
                    update,
                })
                .await;
            }
        }
    }

    fn wants(&self, mode: StreamMode) -> bool {
        self.args.events.as_ref().is_some_and(|ev| ev.wants(mode))
    }

    fn thread_str(&self) -> String {
        self.args
            .thread_id
            .as_deref()
            .map(str::to_string)
            .unwrap_or_default()
    }

    async fn record_pending(&mut self, write: PendingWrite) -> Result<(), RunError> {
        if self.args.writer.is_on() {
            let thread = self.thread_str();
            let cp = self.args.frame.checkpoint_id.clone();
            self.args
                .writer
                .put_writes(&thread, &cp, vec![write.clone()])
                .await?;
        }
        self.args.pending.push(write);
        Ok(())
    }

    async fn start_step(&mut self, myself: &ActorRef<CoordMsg<S>>) -> StepOutcome<S> {
        if self.args.frame.next.is_empty() {
            return Ok(Flow::End(RunEnd::Done {
                frame: self.args.frame.clone(),
                writes: std::mem::take(&mut self.collected),
            }));
        }
        if self.steps_run > 0 && self.args.runtime.is_draining() {
            return Ok(Flow::End(RunEnd::Drained {
                frame: self.args.frame.clone(),
            }));
        }
        if self.steps_run >= self.args.config.max_steps {
            return Err(RunError::StepLimit {
                limit: self.args.config.max_steps,
            });
        }
        if let Some((limit, at)) = self.run_deadline() {
            // Steps that run inline do not pass through the mailbox, where the run's timer
            // would otherwise be seen.
            if tokio::time::Instant::now() >= at {
                return Err(RunError::Timeout(limit));
            }
        }
        if self
            .args
            .config
            .cancel
            .as_ref()
            .is_some_and(|c| c.is_cancelled())
        {
            return Err(RunError::Cancelled);
        }
        let spec = self.args.graph.spec();
        let before: Vec<&PlannedTask<S>> = self
            .args
            .graph
            .runnable(&self.args.frame.next)
            .filter(|t| {
                self.args
                    .graph
                    .node_index(&t.node)
                    .is_some_and(|i| spec.interrupt_before.contains(&i))
            })
            .collect();
        if !before.is_empty() && !self.pass_static_before {
            let interrupts = before
                .iter()
                .map(|t| static_interrupt(&self.args.frame.checkpoint_id, &t.node, "before", &t.id))
                .collect::<Vec<_>>();
            self.record_pending(PendingWrite {
                task_id: String::new(),
                node: String::new(),
                kind: PendingKind::StaticInterrupt,
            })
            .await?;
            return self.stop_at_static(interrupts).await;
        }
        self.pass_static_before = false;
        self.step_span = tracing::info_span!(
            target: "ferrograph::trace",
            parent: &self.span,
            "ferrograph.superstep",
            step = self.args.frame.step + 1,
            tasks = self.args.frame.next.len(),
        );

        // Build the slots, reusing what earlier attempts of this step recorded.
        let mut slots = Vec::with_capacity(self.args.frame.next.len());
        for task in self.args.graph.runnable(&self.args.frame.next) {
            let node = self.args.graph.node_index(&task.node).ok_or_else(|| {
                RunError::Internal(format!("planned unknown node `{}`", task.node))
            })?;
            slots.push(Slot {
                task: task.clone(),
                node,
                attempt: 1,
                resume: Vec::new(),
                child: None,
                state: SlotState::Waiting,
                agent: None,
                started: Instant::now(),
                recorded: false,
                cache_key: None,
            });
        }
        for w in &self.args.pending {
            let Some(slot) = slots.iter_mut().find(|s| s.task.id == w.task_id) else {
                continue;
            };
            match &w.kind {
                PendingKind::Output(bytes) => {
                    let out = decode_output::<S>(bytes).map_err(|source| {
                        ferrograph_core::CheckpointError::Corrupt {
                            thread: self.thread_str(),
                            checkpoint: self.args.frame.checkpoint_id.clone(),
                            source,
                        }
                    })?;
                    slot.state = SlotState::Done(out);
                    slot.recorded = true;
                }
                PendingKind::Resume(values) => slot.resume.extend(values.iter().cloned()),
                PendingKind::Subgraph(bytes) => slot.child = Some(bytes.clone()),
                _ => {}
            }
        }
        for slot in &mut slots {
            let policy = self.args.graph.node(slot.node).options.cache.as_ref();
            let (Some(policy), SlotState::Waiting) = (policy, &slot.state) else {
                continue;
            };
            if !slot.resume.is_empty() || slot.child.is_some() {
                continue; // answering an interrupt: never from the cache
            }
            let input = slot.task.input.as_ref().unwrap_or(&*self.args.frame.state);
            let Some(key) = crate::node_cache::NodeCache::key(&slot.task.node, input) else {
                continue;
            };
            match self.args.pool.node_cache.get(&key, policy) {
                Some(out) => slot.state = SlotState::Done(out),
                None => slot.cache_key = Some(key),
            }
        }
        self.slots = slots;
        self.outstanding = 0;
        let step = self.args.frame.step + 1;
        for i in 0..self.slots.len() {
            if matches!(self.slots[i].state, SlotState::Done(_)) {
                let (node, task_id) = (
                    self.slots[i].task.node.clone(),
                    self.slots[i].task.id.clone(),
                );
                let ns = self.args.namespace.clone();
                self.emit(StreamMode::Tasks, || StreamEvent::TaskEnd {
                    namespace: ns,
                    step,
                    node: node.into(),
                    task_id: task_id.into(),
                    attempt: 0,
                    duration: Duration::ZERO,
                    outcome: TaskOutcome::Cached,
                })
                .await;
            } else {
                self.outstanding += 1;
            }
        }
        if self.outstanding == 0 {
            return self.barrier(myself).await;
        }
        if self.outstanding == 1 {
            if let Some(i) = self
                .slots
                .iter()
                .position(|s| matches!(s.state, SlotState::Waiting))
            {
                return self.run_task(myself, i).await;
            }
        }
        for i in 0..self.slots.len() {
            if matches!(self.slots[i].state, SlotState::Waiting) {
                self.dispatch(myself, i).await?;
            }
        }
        Ok(Flow::Wait)
    }

    /// Marks slot `i` running and builds what its task starts with: the input and the node's
    /// context (without the event sink, which the runner of the task attaches).
    /// The span of slot `i`'s task: under the superstep's, named by its node.
    fn task_span(&self, i: usize) -> tracing::Span {
        let slot = &self.slots[i];
        let spec = self.args.graph.node(slot.node);
        tracing::info_span!(
            target: "ferrograph::trace",
            parent: &self.step_span,
            "ferrograph.node",
            node = %spec.name,
            task_id = %slot.task.id,
            attempt = slot.attempt,
            step = self.args.frame.step + 1,
        )
    }

    fn begin_task(&mut self, i: usize) -> (Arc<S>, NodeContextParts) {
        let step = self.args.frame.step + 1;
        let slot = &mut self.slots[i];
        let spec = self.args.graph.node(slot.node);
        slot.state = SlotState::Running;
        slot.started = Instant::now();
        let input = match &slot.task.input {
            Some(s) => Arc::new(s.clone()),
            None => self.args.frame.state.clone(),
        };
        let resume = if slot.resume.is_empty() {
            Vec::new()
        } else {
            ordered_resume(&self.args.namespace, &slot.task.id, &slot.resume)
        };
        let ctx = NodeContextParts {
            node: spec.name.clone(),
            task_id: slot.task.id.as_str().into(),
            namespace: self.args.namespace.clone(),
            step,
            attempt: slot.attempt,
            thread_id: self.args.thread_id.clone(),
            resume,
            sink: None,
            remaining_steps: Some(self.args.config.max_steps.saturating_sub(self.steps_run)),
            store: self.args.store.clone(),
        };
        (input, ctx)
    }

    /// The run's timeout and the moment it runs out, if it has one.
    fn run_deadline(&self) -> Option<(Duration, tokio::time::Instant)> {
        let limit = self.args.config.timeout?;
        Some((limit, tokio::time::Instant::from_std(self.started) + limit))
    }

    /// Sends the task-start event of slot `i`.
    async fn emit_task_start(&self, i: usize) {
        let slot = &self.slots[i];
        self.emit(StreamMode::Tasks, || StreamEvent::TaskStart {
            namespace: self.args.namespace.clone(),
            step: self.args.frame.step + 1,
            node: self.args.graph.node(slot.node).name.clone(),
            task_id: slot.task.id.as_str().into(),
            attempt: slot.attempt,
        })
        .await;
    }

    /// Whether slot `i` runs on this coordinator instead of an agent: the only task still to
    /// run in its step (nothing to run in parallel with, so an agent would only add two
    /// mailbox hops and a cross-thread wake-up), and a plain function node (a subgraph runs
    /// its own coordinator and keeps its agent).
    fn runs_inline(&self, i: usize) -> bool {
        self.outstanding == 1
            && matches!(
                self.args.graph.node(self.slots[i].node).kind,
                NodeKind::Func(_)
            )
    }

    /// Runs slot `i`: on this coordinator when it is the step's only task left, otherwise on
    /// an agent (the answer comes back as a message).
    async fn run_task(&mut self, myself: &ActorRef<CoordMsg<S>>, i: usize) -> StepOutcome<S> {
        if self.runs_inline(i) {
            self.run_inline(myself, i).await
        } else {
            self.dispatch(myself, i).await.map(|()| Flow::Wait)
        }
    }

    /// Runs slot `i`'s node on this coordinator's own task, under the same guards an agent
    /// gives it: a panic is caught, reported as the task's failure and counted against the
    /// node's restart intensity; the node's timeout and the run's timeout both apply.
    async fn run_inline(&mut self, myself: &ActorRef<CoordMsg<S>>, i: usize) -> StepOutcome<S> {
        let node = self.slots[i].node;
        self.args.pool.check_escalated(node)?;
        // A chain of nodes that never wait would otherwise keep this worker thread forever.
        tokio::task::consume_budget().await;
        let (input, ctx) = self.begin_task(i);
        self.emit_task_start(i).await;
        let (attempt, started) = (self.slots[i].attempt, self.slots[i].started);
        let spec = self.args.graph.node(node);
        let NodeKind::Func(f) = &spec.kind else {
            return Err(RunError::Internal("only function nodes run inline".into()));
        };
        let events = self.args.events.clone();
        let span = self.task_span(i);
        let remote = self
            .args
            .pool
            .runtime
            .upgrade()
            .and_then(|rt| rt.remote_for(&self.args.graph, node));
        let work = AssertUnwindSafe(
            run_func_task(remote, f.as_ref(), input, ctx, events).instrument(span),
        )
        .catch_unwind();
        // One timer for whichever comes first, the node's timeout or the run's deadline.
        let node_deadline = spec
            .options
            .timeout
            .map(|l| (l, tokio::time::Instant::now() + l));
        let run_deadline = self.run_deadline();
        let first = match (node_deadline, run_deadline) {
            (Some(n), Some(r)) => Some(if r.1 < n.1 { (r, true) } else { (n, false) }),
            (Some(n), None) => Some((n, false)),
            (None, Some(r)) => Some((r, true)),
            (None, None) => None,
        };
        let timed = async move {
            match first {
                None => Ok(Some(work.await)),
                Some(((limit, at), is_run)) => match tokio::time::timeout_at(at, work).await {
                    Ok(a) => Ok(Some(a)),
                    Err(_) if is_run => Err(RunError::Timeout(limit)),
                    Err(_) => Ok(None),
                },
            }
        };
        // A cancel drops the task where it awaits, like the run's deadline does.
        let answer = match self.args.config.cancel.clone() {
            None => timed.await?,
            Some(c) => tokio::select! {
                a = timed => a?,
                () = c.cancelled() => return Err(RunError::Cancelled),
            },
        };
        let result = match answer {
            None => TaskResult::Failed(NodeError::Timeout(
                node_deadline.map(|(l, _)| l).unwrap_or_default(),
            )),
            Some(Ok(result)) => result,
            Some(Err(payload)) => {
                let message = panic_message(payload.as_ref());
                self.args.pool.node_panicked(node, &message);
                TaskResult::Failed(NodeError::Panicked(message))
            }
        };
        self.task_done(myself, i, attempt, result, started.elapsed())
            .await
    }

    async fn dispatch(&mut self, myself: &ActorRef<CoordMsg<S>>, i: usize) -> Result<(), RunError> {
        let node = self.slots[i].node;
        let agent = self.args.pool.acquire(node).await?;
        let (input, ctx) = self.begin_task(i);
        let span = self.task_span(i);
        let slot = &mut self.slots[i];
        slot.agent = Some(agent.clone());
        let attempt = slot.attempt;
        let req = TaskRequest {
            span,
            node,
            input,
            ctx,
            resume: slot.resume.clone(),
            child: slot.child.clone(),
            max_steps: self.args.config.max_steps,
            events: self.args.events.clone(),
            reply: ReplyGuard {
                coord: myself.clone(),
                gen: self.gen,
                slot: i,
                attempt,
                started: slot.started,
                sent: false,
            },
        };
        if let Some(limit) = self.args.graph.node(node).options.timeout {
            let (me, gen) = (myself.clone(), self.gen);
            tokio::spawn(async move {
                tokio::time::sleep(limit).await;
                let _ = me.cast(CoordMsg::TaskTimeout {
                    gen,
                    slot: i,
                    attempt,
                });
            });
        }
        self.emit_task_start(i).await;
        if agent.cast(AgentMsg::Execute(Box::new(req))).is_err() {
            // The agent died between acquire and send; the dropped request's guard reports it.
        }
        Ok(())
    }

    async fn task_done(
        &mut self,
        myself: &ActorRef<CoordMsg<S>>,
        i: usize,
        attempt: u32,
        result: TaskResult<S>,
        duration: Duration,
    ) -> StepOutcome<S> {
        let Some(slot) = self.slots.get(i) else {
            return Ok(Flow::Wait);
        };
        if slot.attempt != attempt || !matches!(slot.state, SlotState::Running) {
            return Ok(Flow::Wait); // A stale answer (timed out or superseded).
        }
        let step = self.args.frame.step + 1;
        let node_idx = slot.node;
        let spec = self.args.graph.node(node_idx);
        let name = spec.name.clone();
        let outcome;
        let mut retry_wait = None;
        let mut new_state = match result {
            TaskResult::Output(out) => {
                outcome = TaskOutcome::Ok;
                if let (Some(key), Some(policy)) = (&slot.cache_key, &spec.options.cache) {
                    self.args
                        .pool
                        .node_cache
                        .put(key.clone(), out.clone(), policy);
                }
                SlotState::Done(out)
            }
            TaskResult::Interrupted {
                mut interrupts,
                child,
            } => {
                outcome = TaskOutcome::Interrupted;
                if child.is_some() {
                    for it in &mut interrupts {
                        it.node = format!("{}/{}", name, it.node);
                    }
                }
                self.slots[i].child = child;
                SlotState::Interrupted(interrupts)
            }
            TaskResult::Failed(err) => {
                retry_wait = spec
                    .options
                    .retry
                    .as_ref()
                    .and_then(|p| p.delay_after(attempt, &err));
                let handled = if retry_wait.is_none() {
                    self.handle_error(i, &err)
                } else {
                    None
                };
                match handled {
                    Some(Ok(out)) => {
                        tracing::debug!(node = %name, error = %err, "error handled");
                        outcome = TaskOutcome::Handled {
                            error: err.to_string(),
                        };
                        SlotState::Done(out)
                    }
                    Some(Err(panic)) => {
                        outcome = TaskOutcome::Error {
                            error: panic.to_string(),
                            will_retry: false,
                        };
                        SlotState::Failed(panic)
                    }
                    None => {
                        outcome = TaskOutcome::Error {
                            error: err.to_string(),
                            will_retry: retry_wait.is_some(),
                        };
                        SlotState::Failed(err)
                    }
                }
            }
        };
        self.emit(StreamMode::Tasks, || StreamEvent::TaskEnd {
            namespace: self.args.namespace.clone(),
            step,
            node: name.clone(),
            task_id: self.slots[i].task.id.as_str().into(),
            attempt,
            duration,
            outcome,
        })
        .await;
        self.slots[i].agent = None;
        if let Some(wait) = retry_wait {
            tracing::debug!(node = %name, attempt, ?wait, "retrying task");
            self.slots[i].attempt += 1;
            self.slots[i].state = SlotState::Waiting;
            let (me, gen) = (myself.clone(), self.gen);
            tokio::spawn(async move {
                tokio::time::sleep(wait).await;
                let _ = me.cast(CoordMsg::Retry { gen, slot: i });
            });
            return Ok(Flow::Wait);
        }
        // Record the output at once while siblings still run, so that a crash or a sibling's
        // failure does not run it again. The last task of a step needs no record when the step
        // commits right after it; if the step stops instead, the barrier records it.
        if matches!(new_state, SlotState::Done(_)) && self.outstanding > 1 {
            self.record_output(i, &new_state).await?;
        }
        std::mem::swap(&mut self.slots[i].state, &mut new_state);
        self.outstanding -= 1;
        if self.outstanding == 0 {
            return self.barrier(myself).await;
        }
        Ok(Flow::Wait)
    }

    /// The node's error handler's output for `err` (its last attempt's failure), if the node
    /// has a handler and the error is the node's own: a wrong resume value stays the caller's
    /// error (the interrupt stays open), and a cancelled run is not the node's failure. A
    /// panicking handler is the task's failure.
    fn handle_error(&self, i: usize, err: &NodeError) -> Option<Result<NodeOutput<S>, NodeError>> {
        let slot = &self.slots[i];
        let spec = self.args.graph.node(slot.node);
        let handler = spec.on_error.as_ref()?;
        if matches!(
            err,
            NodeError::Interrupted(_) | NodeError::BadResume { .. } | NodeError::Cancelled
        ) {
            return None;
        }
        let input = slot.task.input.as_ref().unwrap_or(&*self.args.frame.state);
        Some(
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler(err, input))).map_err(
                |p| {
                    NodeError::Panicked(format!(
                        "the error handler of `{}` panicked: {}",
                        spec.name,
                        ferrograph_core::engine::panic_message(p.as_ref())
                    ))
                },
            ),
        )
    }

    async fn record_output(&mut self, i: usize, state: &SlotState<S>) -> Result<(), RunError> {
        let SlotState::Done(out) = state else {
            return Ok(());
        };
        if self.slots[i].recorded || !(self.args.writer.is_on() || self.args.is_subgraph) {
            return Ok(());
        }
        let bytes =
            encode_output(out).map_err(|source| ferrograph_core::CheckpointError::Corrupt {
                thread: self.thread_str(),
                checkpoint: self.args.frame.checkpoint_id.clone(),
                source,
            })?;
        let (task_id, node) = (
            self.slots[i].task.id.clone(),
            self.slots[i].task.node.clone(),
        );
        self.record_pending(PendingWrite {
            task_id,
            node,
            kind: PendingKind::Output(bytes),
        })
        .await?;
        self.slots[i].recorded = true;
        Ok(())
    }

    /// Records the outputs not yet recorded (the step stops without committing).
    async fn record_unrecorded_outputs(&mut self) -> Result<(), RunError> {
        for i in 0..self.slots.len() {
            let state = std::mem::replace(&mut self.slots[i].state, SlotState::Waiting);
            let result = self.record_output(i, &state).await;
            self.slots[i].state = state;
            result?;
        }
        Ok(())
    }

    async fn task_timeout(
        &mut self,
        myself: &ActorRef<CoordMsg<S>>,
        i: usize,
        attempt: u32,
    ) -> StepOutcome<S> {
        let Some(slot) = self.slots.get_mut(i) else {
            return Ok(Flow::Wait);
        };
        if slot.attempt != attempt || !matches!(slot.state, SlotState::Running) {
            return Ok(Flow::Wait);
        }
        if let Some(agent) = slot.agent.take() {
            agent.kill();
        }
        let limit = self
            .args
            .graph
            .node(slot.node)
            .options
            .timeout
            .unwrap_or_default();
        let elapsed = slot.started.elapsed();
        self.task_done(
            myself,
            i,
            attempt,
            TaskResult::Failed(NodeError::Timeout(limit)),
            elapsed,
        )
        .await
    }

    fn kill_running(&mut self) {
        for slot in &mut self.slots {
            if let Some(agent) = slot.agent.take() {
                agent.kill();
            }
        }
    }

    /// Stops the run at static interrupts, recording them so that they are listed and resumable.
    async fn stop_at_static(&mut self, interrupts: Vec<Interrupt>) -> StepOutcome<S> {
        self.record_pending(PendingWrite {
            task_id: String::new(),
            node: String::new(),
            kind: PendingKind::Interrupts(interrupts.clone()),
        })
        .await?;
        self.emit_interrupt(&interrupts).await;
        let view = self.args.frame.state.clone();
        Ok(Flow::End(self.interrupted(interrupts, view)))
    }

    /// The frame's state with the outputs of the step's finished tasks applied in plan order
    /// (merges, then overwrites), as the caller sees a step that stopped part-way.
    fn step_view(&self) -> Arc<S> {
        let outputs: Vec<_> = self
            .slots
            .iter()
            .filter_map(|s| match &s.state {
                SlotState::Done(out) if out.target == CommandTarget::Current => Some((
                    s.task.node.clone(),
                    out.updates.clone(),
                    out.overwrites.clone(),
                )),
                _ => None,
            })
            .collect();
        let mut view = self.args.frame.state.clone();
        if outputs.is_empty() {
            return view;
        }
        match ferrograph_core::engine::merge_outputs(Arc::make_mut(&mut view), outputs) {
            Ok(_) => view,
            // The step will fail the same way when it commits; until then, the checkpoint.
            Err(_) => self.args.frame.state.clone(),
        }
    }

    /// The interrupt event: sent whenever the run streams, whatever the modes.
    async fn emit_interrupt(&self, interrupts: &[Interrupt]) {
        if let Some(ev) = &self.args.events {
            ev.send(StreamEvent::Interrupt {
                namespace: self.args.namespace.clone(),
                interrupts: interrupts.to_vec(),
            })
            .await;
        }
    }

    fn interrupted(&self, interrupts: Vec<Interrupt>, view: Arc<S>) -> RunEnd<S> {
        RunEnd::Interrupted {
            frame: self.args.frame.clone(),
            view,
            interrupts,
            pending: self.args.pending.clone(),
            merged: self.collected.clone(),
        }
    }

    async fn barrier(&mut self, myself: &ActorRef<CoordMsg<S>>) -> StepOutcome<S> {
        // A failure anywhere: nothing of the step is applied.
        let failed = self
            .slots
            .iter()
            .position(|s| matches!(s.state, SlotState::Failed(_)));
        let stops = failed.is_some()
            || self
                .slots
                .iter()
                .any(|s| matches!(s.state, SlotState::Interrupted(_)));
        if stops {
            self.record_unrecorded_outputs().await?;
        }
        if let Some(i) = failed {
            let slot = &mut self.slots[i];
            let SlotState::Failed(err) = std::mem::replace(&mut slot.state, SlotState::Waiting)
            else {
                return Err(RunError::Internal("failed slot without error".into()));
            };
            let (node, task_id, attempts) =
                (slot.task.node.clone(), slot.task.id.clone(), slot.attempt);
            self.record_pending(PendingWrite {
                task_id: task_id.clone(),
                node: node.clone(),
                kind: PendingKind::Error(err.to_string()),
            })
            .await?;
            return Err(RunError::Node {
                node,
                task_id,
                attempts,
                source: err,
            });
        }
        let mut interrupts = Vec::new();
        let mut records = Vec::new();
        for slot in &self.slots {
            if let SlotState::Interrupted(list) = &slot.state {
                interrupts.extend(list.iter().cloned());
                records.push(PendingWrite {
                    task_id: slot.task.id.clone(),
                    node: slot.task.node.clone(),
                    kind: PendingKind::Interrupts(list.clone()),
                });
                if let Some(child) = &slot.child {
                    records.push(PendingWrite {
                        task_id: slot.task.id.clone(),
                        node: slot.task.node.clone(),
                        kind: PendingKind::Subgraph(child.clone()),
                    });
                }
            }
        }
        if !interrupts.is_empty() {
            for r in records {
                self.record_pending(r).await?;
            }
            if self.wants(StreamMode::Updates) {
                // The tasks that finished before the step stopped are reported now; their
                // outputs are applied when the step completes after the resume.
                let done: Vec<(String, Vec<S::Update>)> = self
                    .slots
                    .iter()
                    .filter_map(|s| match &s.state {
                        SlotState::Done(out) if out.target == CommandTarget::Current => {
                            let mut all = out.updates.clone();
                            all.extend(out.overwrites.iter().cloned());
                            Some((s.task.node.clone(), all))
                        }
                        _ => None,
                    })
                    .collect();
                self.emit_task_updates(self.args.frame.step + 1, done).await;
            }
            // The caller sees what get_state shows: the finished tasks' outputs applied.
            let view = self.step_view();
            if !Arc::ptr_eq(&view, &self.args.frame.state) {
                let (ns, step, state) = (
                    self.args.namespace.clone(),
                    self.args.frame.step + 1,
                    view.clone(),
                );
                self.emit(StreamMode::Values, || StreamEvent::Values {
                    namespace: ns,
                    step,
                    state,
                })
                .await;
            }
            self.emit_interrupt(&interrupts).await;
            return Ok(Flow::End(self.interrupted(interrupts, view)));
        }

        // Everything finished: merge in plan order.
        let mut finished = Vec::with_capacity(self.slots.len());
        let mut parent: Option<NodeOutput<S>> = None;
        let mut ran: Vec<usize> = Vec::with_capacity(self.slots.len());
        for slot in std::mem::take(&mut self.slots) {
            ran.push(slot.node);
            let SlotState::Done(output) = slot.state else {
                return Err(RunError::Internal("unsettled slot at the barrier".into()));
            };
            if output.target == CommandTarget::Parent && self.args.is_subgraph {
                let p = parent.get_or_insert_with(NodeOutput::empty);
                p.updates.extend(output.updates);
                p.goto.extend(output.goto);
                p.overwrites.extend(output.overwrites);
                continue;
            }
            finished.push(FinishedTask {
                task: slot.task,
                output,
            });
        }
        let task_updates: Vec<(String, Vec<S::Update>)> = if self.wants(StreamMode::Updates) {
            finished
                .iter()
                .map(|f| {
                    let mut all = f.output.updates.clone();
                    all.extend(f.output.overwrites.iter().cloned());
                    (f.task.node.clone(), all)
                })
                .collect()
        } else {
            Vec::new()
        };
        let commit = self.args.graph.commit_step(&self.args.frame, finished)?;
        let thread = self.thread_str();
        if self.args.writer.is_on() {
            let record = encode_checkpoint(
                &thread,
                &commit.frame,
                &commit.writes,
                CheckpointSource::Loop,
                &mut self.args.stats,
            )
            .map_err(|source| ferrograph_core::CheckpointError::Corrupt {
                thread: thread.clone(),
                checkpoint: commit.frame.checkpoint_id.clone(),
                source,
            })?;
            if commit.frame.next.is_empty() {
                // The run ends now; its end flushes this checkpoint.
                self.args.writer.put_before_flush(record).await?;
            } else {
                self.args.writer.put(record).await?;
            }
        }
        let step = commit.frame.step;
        if !task_updates.is_empty() {
            self.emit_task_updates(step, task_updates).await;
        }
        if let Some(ev) = &self.args.events {
            let ns = self.args.namespace.clone();
            if ev.wants(StreamMode::Values) {
                ev.send(StreamEvent::Values {
                    namespace: ns.clone(),
                    step,
                    state: commit.frame.state.clone(),
                })
                .await;
            }
            if ev.wants(StreamMode::Debug) {
                ev.send(StreamEvent::Checkpoint {
                    namespace: ns,
                    step,
                    checkpoint_id: commit.frame.checkpoint_id.clone(),
                    next: commit.frame.next_nodes(),
                })
                .await;
            }
        }
        if self.args.is_subgraph {
            self.collected
                .extend(commit.writes.iter().map(|(_, u)| u.clone()));
        }
        self.args.frame = commit.frame;
        self.args.pending.clear();
        self.steps_run += 1;
        if let Some(mut p) = parent {
            // Only the command reaches the parent (as in LangGraph): what the subgraph merged
            // in its own earlier steps stays in the subgraph.
            self.collected.clear();
            p.target = CommandTarget::Current;
            return Ok(Flow::End(RunEnd::Parent { output: p }));
        }
        let spec = self.args.graph.spec();
        let after: Vec<usize> = ran
            .into_iter()
            .filter(|i| spec.interrupt_after.contains(i))
            .collect();
        if !after.is_empty() {
            let cp = self.args.frame.checkpoint_id.clone();
            let interrupts: Vec<Interrupt> = after
                .iter()
                .map(|&i| {
                    let node = spec.nodes[i].name.to_string();
                    static_interrupt(&cp, &node, "after", &cp)
                })
                .collect();
            return self.stop_at_static(interrupts).await;
        }
        let _ = myself;
        Ok(Flow::Next)
    }

    /// The thread record as it should read after `end`.
    fn thread_record(&self, end: &RunEnd<S>) -> Option<ThreadInfo> {
        let mut info = self.args.thread_info.clone()?;
        let (status, error, interrupts, frame_id) = match end {
            RunEnd::Done { frame, .. } => (
                ThreadStatus::Done,
                None,
                Vec::new(),
                Some(frame.checkpoint_id.clone()),
            ),
            RunEnd::Interrupted {
                frame, interrupts, ..
            } => (
                ThreadStatus::Interrupted,
                None,
                interrupts.clone(),
                Some(frame.checkpoint_id.clone()),
            ),
            RunEnd::Drained { frame } => (
                ThreadStatus::Interrupted,
                Some("drained at shutdown; continue the thread to finish".to_string()),
                Vec::new(),
                Some(frame.checkpoint_id.clone()),
            ),
            RunEnd::Parent { .. } => (ThreadStatus::Done, None, Vec::new(), None),
            RunEnd::Failed(e) => {
                // A failure that leaves interrupts open (for example a resume value of the wrong
                // type) keeps the thread waiting for an answer.
                let open: Vec<_> = ferrograph_core::checkpoint::open_interrupts(&self.args.pending)
                    .into_iter()
                    .map(|(i, _, _)| i)
                    .collect();
                let status = if open.is_empty() {
                    ThreadStatus::Failed
                } else {
                    ThreadStatus::Interrupted
                };
                (status, Some(e.to_string()), open, None)
            }
        };
        info.status = status;
        info.error = error;
        info.interrupts = interrupts;
        info.updated_at_ms = ferrograph_core::id::now_millis();
        info.last_checkpoint_id = frame_id.or(Some(self.args.frame.checkpoint_id.clone()));
        Some(info)
    }

    /// Makes the run's checkpoints durable and records the thread's status. In sync mode the
    /// status and the last checkpoint share one flush; otherwise the status is written only
    /// after every checkpoint is durable, so it never claims more than the disk holds.
    ///
    /// Returns the answer for the caller without sending it: the handler drops the run (its
    /// thread guard, saver and writer) first, so that whoever gets the answer finds the thread
    /// free and no handle of the run left behind.
    async fn finish(&mut self, mut end: RunEnd<S>) -> Option<Answer<S>> {
        let saver = self.args.saver.clone();
        let sync = self.args.writer.is_sync();
        if let (true, Some(saver), Some(info)) = (sync, saver.as_ref(), self.thread_record(&end)) {
            if let Err(e) = saver.put_thread(info).await {
                tracing::error!(error = %e, "could not record the thread status");
            }
            self.args.writer.mark_dirty();
        }
        if let Err(e) = self.args.writer.finish().await {
            end = RunEnd::Failed(RunError::Checkpoint(e));
            if let (true, Some(saver), Some(info)) =
                (sync, saver.as_ref(), self.thread_record(&end))
            {
                let _ = saver.put_thread(info).await;
                let _ = saver.flush().await;
            }
        }
        if !sync {
            if let (Some(saver), Some(info)) = (saver.as_ref(), self.thread_record(&end)) {
                let result = match saver.put_thread(info).await {
                    Ok(()) => saver.flush().await,
                    Err(e) => Err(e),
                };
                if let Err(e) = result {
                    tracing::error!(error = %e, "could not record the thread status");
                }
            }
        }
        if let (Some(cache), Some(thread)) = (&self.args.cache, &self.args.thread_id) {
            match &end {
                RunEnd::Done { frame, .. }
                | RunEnd::Interrupted { frame, .. }
                | RunEnd::Drained { frame } => cache.put(thread, frame.clone(), self.args.stats),
                _ => cache.forget(thread),
            }
        }
        tracing::debug!(
            graph = self.args.graph.name(),
            steps = self.steps_run,
            elapsed = ?self.started.elapsed(),
            "run finished"
        );
        self.done.take().map(|done| Answer { done, end })
    }
}

/// Resume values for a task's interrupts in the order the node will ask for them: the `k`-th
/// interrupt of the task has a known id, and gets the value addressed to that id.
pub(crate) fn ordered_resume(
    namespace: &str,
    task_id: &str,
    values: &[(String, Json)],
) -> Vec<Json> {
    let mut out = Vec::new();
    loop {
        let id = interrupt_id(namespace, task_id, out.len());
        match values.iter().rev().find(|(k, _)| *k == id) {
            Some((_, v)) => out.push(v.clone()),
            None => return out,
        }
    }
}

fn static_interrupt(checkpoint: &str, node: &str, when: &str, task_id: &str) -> Interrupt {
    Interrupt {
        id: stable_hash(&[checkpoint.as_bytes(), node.as_bytes(), when.as_bytes()]),
        node: node.to_string(),
        task_id: task_id.to_string(),
        value: Json(serde_json::json!({ "static": when, "node": node })),
        static_: true,
    }
}
