//! Running a loaded graph: invoke, stream, resume, and reading or editing a thread's state.

use crate::config::RunConfig;
use crate::coordinator::{RunArgs, RunEnd};
use crate::error::RunError;
use crate::events::EventTx;
use crate::pool::AgentPool;
use crate::runtime::Runtime;
use crate::writer::Writer;
use ferrograph_core::checkpoint::{
    carry_pending, decode_output, encode_checkpoint, load_checkpoint, load_from_record,
    load_history, ChainStats, CheckpointSaver, CheckpointSource, PendingKind, PendingWrite,
    ThreadInfo,
};
use ferrograph_core::engine::{merge_outputs, Frame};
use ferrograph_core::json::Json;
use ferrograph_core::node::{Command, CommandTarget};
use ferrograph_core::{CompiledGraph, Interrupt, Resume, State, Store, StreamEvent};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// What a run starts with.
#[derive(Clone, Debug)]
pub enum RunInput<S: State> {
    /// Merge this update into the thread's state and run from START.
    Update(S::Update),
    /// Continue the thread from its newest (or the configured) checkpoint: after a failure, a
    /// drain or a static interrupt, or to replay from an older checkpoint.
    Continue,
    /// Answer pending interrupts and continue.
    Resume(Resume),
    /// LangGraph's `Command` as input: merge `update` into the thread's state, add tasks for
    /// `goto` to the ones already planned, answer interrupts with `resume` (any of the three),
    /// and continue. On a thread that already ran, the first step passes static breakpoints,
    /// as a continue does. On a new thread it needs `goto`: that is where the run starts.
    Command(Command<S>),
}

impl<S: State> RunInput<S> {
    /// Input from an update.
    pub fn update(u: S::Update) -> Self {
        RunInput::Update(u)
    }

    /// A single resume value.
    pub fn resume(value: serde_json::Value) -> Self {
        RunInput::Resume(Resume::value(value))
    }
}

/// One edit of a thread's state: an update, written as if by `as_node` (or as input).
#[derive(Clone, Debug)]
pub struct StateEdit<S: State> {
    /// The update.
    pub update: S::Update,
    /// The node it is written as, if any.
    pub as_node: Option<String>,
}

impl<S: State> StateEdit<S> {
    /// An edit.
    pub fn new(update: S::Update, as_node: Option<&str>) -> Self {
        StateEdit {
            update,
            as_node: as_node.map(str::to_string),
        }
    }
}

/// How a run that did not fail ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunStatus {
    /// Reached END.
    Done,
    /// Stopped on interrupts; resume to go on.
    Interrupted,
    /// Stopped at a superstep boundary because the runtime is shutting down.
    Drained,
}

/// The result of a run.
#[derive(Clone, Debug)]
pub struct RunOutcome<S: State> {
    /// How it ended.
    pub status: RunStatus,
    /// The state at the end.
    pub state: Arc<S>,
    /// Pending interrupts (when interrupted).
    pub interrupts: Vec<Interrupt>,
    /// The newest checkpoint.
    pub checkpoint_id: String,
    /// Nodes that would run next.
    pub next: Vec<String>,
    /// The thread.
    pub thread_id: Option<String>,
}

impl<S: State> RunOutcome<S> {
    /// Whether the run reached END.
    pub fn is_done(&self) -> bool {
        self.status == RunStatus::Done
    }
}

/// A thread's state at one checkpoint.
#[derive(Clone, Debug)]
pub struct StateSnapshot<S: State> {
    /// The state.
    pub values: Arc<S>,
    /// Nodes planned next.
    pub next: Vec<String>,
    /// Checkpoint id.
    pub checkpoint_id: String,
    /// Parent checkpoint.
    pub parent_id: Option<String>,
    /// Supersteps executed up to it.
    pub step: u64,
    /// Why it was written.
    pub source: CheckpointSource,
    /// Nodes whose updates produced it.
    pub writers: Vec<String>,
    /// When, ms since the epoch.
    pub created_at_ms: u64,
    /// Interrupts pending at it.
    pub interrupts: Vec<Interrupt>,
    /// The tasks planned at it, with what became of them so far.
    pub tasks: Vec<SnapshotTask>,
}

/// A task planned at a checkpoint, as a [`StateSnapshot`] shows it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SnapshotTask {
    /// Task id.
    pub id: String,
    /// Node.
    pub node: String,
    /// Whether it finished (its output waits for its siblings).
    pub finished: bool,
    /// Why it failed, if its last attempt failed.
    pub error: Option<String>,
}

/// A run in progress whose events are being streamed.
pub struct RunStream<S: State> {
    events: mpsc::Receiver<StreamEvent<S>>,
    outcome: Outcome<S>,
}

impl<S: State> RunStream<S> {
    /// The next event, or `None` when the run has ended and every event was read.
    pub async fn next_event(&mut self) -> Option<StreamEvent<S>> {
        self.events.recv().await
    }

    /// Waits for the end of the run (events not yet read are dropped).
    pub async fn outcome(self) -> Result<RunOutcome<S>, RunError> {
        drop(self.events);
        self.outcome.wait().await
    }
}

struct Outcome<S: State> {
    rx: oneshot::Receiver<RunEnd<S>>,
    thread_id: Option<String>,
}

impl<S: State> Outcome<S> {
    async fn wait(self) -> Result<RunOutcome<S>, RunError> {
        let end = self
            .rx
            .await
            .map_err(|_| RunError::Internal("the coordinator stopped without answering".into()))?;
        let make = |status, frame: Frame<S>, interrupts| RunOutcome {
            status,
            next: frame.next_nodes(),
            state: frame.state,
            interrupts,
            checkpoint_id: frame.checkpoint_id,
            thread_id: self.thread_id.clone(),
        };
        match end {
            RunEnd::Done { frame, .. } => Ok(make(RunStatus::Done, frame, Vec::new())),
            RunEnd::Interrupted {
                frame,
                view,
                interrupts,
                pending,
                ..
            } => {
                // As get_state shows it: tasks that finished in the stopped step are not next.
                let finished = |id: &str| {
                    pending
                        .iter()
                        .any(|w| w.task_id == id && matches!(w.kind, PendingKind::Output(_)))
                };
                let next = frame
                    .next
                    .iter()
                    .filter(|t| !finished(&t.id))
                    .map(|t| t.node.clone())
                    .collect();
                let mut outcome = make(RunStatus::Interrupted, frame, interrupts);
                outcome.state = view;
                outcome.next = next;
                Ok(outcome)
            }
            RunEnd::Drained { frame } => Ok(make(RunStatus::Drained, frame, Vec::new())),
            RunEnd::Parent { .. } => Err(RunError::Internal(
                "a root graph ended with a parent command".into(),
            )),
            RunEnd::Failed(e) => Err(e),
        }
    }
}

/// The newest frame of recently run threads, so that the next run of a thread does not replay
/// its deltas from storage. An entry is used only while it is still the thread's newest
/// checkpoint in the saver (checked by id on every run), so edits from elsewhere (another
/// process, `update_state`, `fork`, `prune`) are never masked.
pub(crate) struct FrameCache<S: State> {
    frames: parking_lot::Mutex<std::collections::HashMap<String, (Frame<S>, ChainStats)>>,
}

const FRAME_CACHE_CAPACITY: usize = 4096;

impl<S: State> FrameCache<S> {
    fn new() -> Self {
        FrameCache {
            frames: parking_lot::Mutex::new(std::collections::HashMap::new()),
        }
    }

    pub(crate) fn put(&self, thread: &str, frame: Frame<S>, stats: ChainStats) {
        let mut frames = self.frames.lock();
        if frames.len() >= FRAME_CACHE_CAPACITY && !frames.contains_key(thread) {
            frames.clear();
        }
        frames.insert(thread.to_string(), (frame, stats));
    }

    pub(crate) fn forget(&self, thread: &str) {
        self.frames.lock().remove(thread);
    }

    fn get_if_newest(&self, thread: &str, newest: &str) -> Option<(Frame<S>, ChainStats)> {
        let frames = self.frames.lock();
        let (frame, stats) = frames.get(thread)?;
        (frame.checkpoint_id == newest).then(|| (frame.clone(), *stats))
    }
}

/// A compiled graph loaded into a [`Runtime`], optionally with a checkpointer.
pub struct GraphRunner<S: State> {
    runtime: Runtime,
    graph: CompiledGraph<S>,
    pool: Arc<AgentPool<S>>,
    saver: Option<Arc<dyn CheckpointSaver>>,
    cache: Arc<FrameCache<S>>,
    store: Option<Arc<dyn Store>>,
}

impl<S: State> Clone for GraphRunner<S> {
    fn clone(&self) -> Self {
        GraphRunner {
            runtime: self.runtime.clone(),
            graph: self.graph.clone(),
            pool: self.pool.clone(),
            saver: self.saver.clone(),
            cache: self.cache.clone(),
            store: self.store.clone(),
        }
    }
}

fn pending_interrupts(pending: &[PendingWrite]) -> Vec<(Interrupt, String, String)> {
    ferrograph_core::checkpoint::open_interrupts(pending)
}

impl<S: State> GraphRunner<S> {
    pub(crate) fn new(runtime: Runtime, graph: CompiledGraph<S>, pool: Arc<AgentPool<S>>) -> Self {
        GraphRunner {
            runtime,
            graph,
            pool,
            saver: None,
            cache: Arc::new(FrameCache::new()),
            store: None,
        }
    }

    /// Gives the graph's nodes (and the tools they run) a long-term store shared across
    /// threads: `ctx.store()`.
    #[must_use]
    pub fn with_store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = Some(store);
        self
    }

    /// The long-term store, if any.
    pub fn store(&self) -> Option<&Arc<dyn Store>> {
        self.store.as_ref()
    }

    /// Uses `saver` for checkpoints, threads, interrupts and resume.
    #[must_use]
    pub fn with_checkpointer(mut self, saver: Arc<dyn CheckpointSaver>) -> Self {
        self.saver = Some(saver);
        self.cache = Arc::new(FrameCache::new());
        self
    }

    /// The graph.
    pub fn graph(&self) -> &CompiledGraph<S> {
        &self.graph
    }

    /// The checkpointer, if any.
    pub fn checkpointer(&self) -> Option<&Arc<dyn CheckpointSaver>> {
        self.saver.as_ref()
    }

    /// Agents restarted by the supervisor after failures, since the graph was loaded.
    pub fn agent_restarts(&self) -> u64 {
        self.pool
            .restarts
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Agents alive now.
    pub fn agent_count(&self) -> usize {
        self.pool.agent_count()
    }

    /// Runs to the end (or to an interrupt) and returns the outcome.
    pub async fn invoke(
        &self,
        input: RunInput<S>,
        config: RunConfig,
    ) -> Result<RunOutcome<S>, RunError> {
        self.start(input, config, None).await?.wait().await
    }

    /// Starts a run and streams its events in the modes of `config.stream`.
    pub async fn stream(
        &self,
        input: RunInput<S>,
        config: RunConfig,
    ) -> Result<RunStream<S>, RunError> {
        let (tx, rx) = mpsc::channel(self.runtime.inner.config.event_buffer.max(1));
        let events = EventTx {
            tx,
            modes: config.stream,
        };
        let outcome = self.start(input, config, Some(events)).await?;
        Ok(RunStream {
            events: rx,
            outcome,
        })
    }

    async fn start(
        &self,
        input: RunInput<S>,
        config: RunConfig,
        events: Option<EventTx<S>>,
    ) -> Result<Outcome<S>, RunError> {
        let rt = &self.runtime.inner;
        let thread = config.thread_id.clone();
        if let Some(t) = &thread {
            ferrograph_core::id::check_thread_id(t)?;
        }
        let guard = rt.begin_run(thread.as_deref()).await?;
        let saver = match (&self.saver, &thread) {
            (Some(s), Some(_)) => Some(s.clone()),
            _ => None,
        };
        let mut stats = ChainStats::default();
        let mut pending = Vec::new();
        let mut base: Option<Frame<S>> = None;
        let mut thread_info = None;
        if let (Some(s), Some(t)) = (&saver, &thread) {
            // One read of the newest record serves the cache check, the load and the
            // question whether the requested checkpoint is the newest.
            let newest = s.get(t, None).await?;
            let head = match (&config.checkpoint_id, &newest) {
                (None, _) => newest.clone(),
                (Some(c), Some(n)) if &n.checkpoint_id == c => newest.clone(),
                (Some(c), _) => Some(s.get(t, Some(c)).await?.ok_or_else(|| {
                    ferrograph_core::CheckpointError::NotFound {
                        thread: t.clone(),
                        checkpoint: c.clone(),
                    }
                })?),
            };
            if let Some(head) = head {
                let is_latest = newest
                    .as_ref()
                    .is_some_and(|n| n.checkpoint_id == head.checkpoint_id);
                let cached = if is_latest {
                    self.cache.get_if_newest(t, &head.checkpoint_id)
                } else {
                    None
                };
                let (frame, chain_stats) = match cached {
                    Some(hit) => hit,
                    None => {
                        let loaded = load_from_record::<S>(s.as_ref(), t, head).await?;
                        (loaded.frame, loaded.stats)
                    }
                };
                if is_latest {
                    pending = s.get_writes(t, &frame.checkpoint_id).await?;
                }
                stats = chain_stats;
                base = Some(frame);
            }
            thread_info = Some(
                s.get_thread(t)
                    .await?
                    .unwrap_or_else(|| ThreadInfo::new(t.as_str(), self.graph.name())),
            );
        }
        let mut writer = Writer::new(saver.clone(), config.durability, rt.config.async_lag);
        let thread_name = thread.clone().unwrap_or_default();
        let mut resuming = false;
        let frame = match input {
            RunInput::Update(update) => {
                let had_base = base.is_some();
                let base = base.unwrap_or_else(|| Frame::empty(&self.graph));
                let mut commit = self.graph.plan_input(&base, Some(update))?;
                if !had_base {
                    commit.frame.parent_id = None;
                }
                pending.clear();
                if writer.is_on() {
                    let record = encode_record(
                        &thread_name,
                        &commit.frame,
                        &commit.writes,
                        CheckpointSource::Input,
                        &mut stats,
                    )?;
                    // Flushed before any task runs: tasks are planned (and their ids, which nodes may use
                    // as idempotency keys, derived) from this checkpoint.
                    writer.put(record).await?;
                }
                commit.frame
            }
            RunInput::Continue => match base {
                Some(b) => b,
                None if saver.is_none() => return Err(RunError::NoCheckpointer),
                None => return Err(RunError::NothingToContinue(thread_name)),
            },
            RunInput::Command(command) => {
                let Command {
                    update,
                    goto,
                    resume,
                    target,
                    overwrite,
                } = command;
                if target != CommandTarget::Current {
                    return Err(RunError::InvalidInput(
                        "a command given as a run's input cannot address a parent graph".into(),
                    ));
                }
                if update.is_none() && overwrite.is_none() && goto.is_empty() && resume.is_none() {
                    return Err(RunError::InvalidInput(
                        "an empty command: give it an update, a goto or a resume value".into(),
                    ));
                }
                let fresh = base.is_none();
                if fresh && goto.is_empty() {
                    return Err(if resume.is_some() && saver.is_none() {
                        RunError::NoCheckpointer
                    } else if resume.is_some() {
                        RunError::NoPendingInterrupt(thread_name)
                    } else {
                        RunError::InvalidInput(
                            "a command on a new thread needs a goto (or give the update as input)"
                                .into(),
                        )
                    });
                }
                let mut frame = base.unwrap_or_else(|| Frame::empty(&self.graph));
                if update.is_some() || overwrite.is_some() || !goto.is_empty() {
                    let mut commit = self.graph.commit_command(&frame, update, overwrite, goto)?;
                    if fresh {
                        commit.frame.parent_id = None;
                    }
                    let carried = carry_pending(&pending, &commit.frame.next);
                    if writer.is_on() {
                        if !carried.is_empty() {
                            writer
                                .put_writes(
                                    &thread_name,
                                    &commit.frame.checkpoint_id,
                                    carried.clone(),
                                )
                                .await?;
                        }
                        let record = encode_record(
                            &thread_name,
                            &commit.frame,
                            &commit.writes,
                            CheckpointSource::Input,
                            &mut stats,
                        )?;
                        writer.put(record).await?;
                    }
                    pending = carried;
                    frame = commit.frame;
                }
                if let Some(resume) = resume {
                    let writes = self.resume_writes(&thread_name, &pending, resume)?;
                    record_answers(
                        &mut writer,
                        thread_info.as_mut(),
                        &thread_name,
                        &frame.checkpoint_id,
                        writes.clone(),
                    )
                    .await?;
                    pending.extend(writes);
                }
                resuming = !fresh;
                frame
            }
            RunInput::Resume(resume) => {
                let Some(b) = base else {
                    return Err(if saver.is_none() {
                        RunError::NoCheckpointer
                    } else {
                        RunError::NoPendingInterrupt(thread_name)
                    });
                };
                let writes = self.resume_writes(&thread_name, &pending, resume)?;
                record_answers(
                    &mut writer,
                    thread_info.as_mut(),
                    &thread_name,
                    &b.checkpoint_id,
                    writes.clone(),
                )
                .await?;
                pending.extend(writes);
                b
            }
        };
        // The input is valid: only now is the thread marked as running (a resume did so with
        // its answers).
        if let (Some(s), Some(info)) = (&saver, thread_info.as_mut()) {
            let owned_here = crate::owner::RunOwner::of(info).as_ref()
                == Some(crate::owner::RunOwner::this_process());
            if info.status != ferrograph_core::ThreadStatus::Running || !owned_here {
                mark_running(info);
                s.put_thread(info.clone()).await?;
            }
        }
        let (done, rx) = oneshot::channel();
        let args = RunArgs {
            parent_span: tracing::Span::current(),
            graph: self.graph.clone(),
            pool: self.pool.clone(),
            runtime: rt.clone(),
            writer,
            thread_id: thread.as_deref().map(Arc::from),
            namespace: Arc::from(""),
            frame,
            stats,
            pending,
            config,
            events,
            done,
            is_subgraph: false,
            _guard: Some(guard),
            saver,
            thread_info,
            merged: Vec::new(),
            cache: Some(self.cache.clone()),
            resuming,
            store: self.store.clone(),
        };
        self.pool.start_run(args).await?;
        Ok(Outcome {
            rx,
            thread_id: thread,
        })
    }

    /// Turns resume values into pending writes for the tasks whose interrupts they answer.
    fn resume_writes(
        &self,
        thread: &str,
        pending: &[PendingWrite],
        resume: Resume,
    ) -> Result<Vec<PendingWrite>, RunError> {
        let open = pending_interrupts(pending);
        let ids: Vec<String> = open.iter().map(|(i, _, _)| i.id.clone()).collect();
        let answers: Vec<(String, Json)> = match resume {
            Resume::Value(v) => {
                let dynamic: Vec<&(Interrupt, String, String)> =
                    open.iter().filter(|(i, _, _)| !i.static_).collect();
                match dynamic.len() {
                    1 => vec![(dynamic[0].0.id.clone(), v)],
                    0 if !open.is_empty() => Vec::new(), // static interrupts: just continue
                    0 => return Err(RunError::NoPendingInterrupt(thread.to_string())),
                    _ => return Err(RunError::AmbiguousResume { pending: ids }),
                }
            }
            Resume::ById(map) => {
                if open.is_empty() {
                    return Err(RunError::NoPendingInterrupt(thread.to_string()));
                }
                for id in map.keys() {
                    if !ids.contains(id) {
                        return Err(RunError::UnknownInterrupt {
                            id: id.clone(),
                            pending: ids,
                        });
                    }
                }
                map.into_iter().collect()
            }
        };
        let mut by_task: BTreeMap<(String, String), Vec<(String, Json)>> = BTreeMap::new();
        for (id, value) in answers {
            if let Some((_, task, node)) = open.iter().find(|(i, _, _)| i.id == id) {
                if task.is_empty() {
                    continue; // a static interrupt needs no value
                }
                by_task
                    .entry((task.clone(), node.clone()))
                    .or_default()
                    .push((id, value));
            }
        }
        Ok(by_task
            .into_iter()
            .map(|((task_id, node), values)| PendingWrite {
                task_id,
                node,
                kind: PendingKind::Resume(values),
            })
            .collect())
    }

    fn saver(&self) -> Result<&Arc<dyn CheckpointSaver>, RunError> {
        self.saver.as_ref().ok_or(RunError::NoCheckpointer)
    }

    /// The snapshot of one checkpoint. With `apply_pending` (the newest state of a thread
    /// whose step stopped part-way, as LangGraph shows it), the outputs of the tasks that
    /// finished in that step are applied to the values in plan order, and only the tasks that
    /// did not finish are listed as next.
    async fn snapshot(
        &self,
        saver: &dyn CheckpointSaver,
        thread: &str,
        loaded: ferrograph_core::checkpoint::LoadedCheckpoint<S>,
        apply_pending: bool,
    ) -> Result<StateSnapshot<S>, RunError> {
        let pending = saver
            .get_writes(thread, &loaded.frame.checkpoint_id)
            .await?;
        let interrupts = pending_interrupts(&pending)
            .into_iter()
            .map(|(i, _, _)| i)
            .collect();
        let mut next = Vec::with_capacity(loaded.frame.next.len());
        let mut tasks = Vec::with_capacity(loaded.frame.next.len());
        let mut outputs = Vec::new();
        for task in &loaded.frame.next {
            let mut finished = false;
            let mut error = None;
            for w in pending.iter().filter(|w| w.task_id == task.id) {
                match &w.kind {
                    PendingKind::Output(bytes) => {
                        finished = true;
                        if apply_pending {
                            let output = decode_output::<S>(bytes).map_err(|source| {
                                ferrograph_core::CheckpointError::Corrupt {
                                    thread: thread.to_string(),
                                    checkpoint: loaded.frame.checkpoint_id.clone(),
                                    source,
                                }
                            })?;
                            outputs.push((task.node.clone(), output.updates, output.overwrites));
                        }
                    }
                    PendingKind::Error(e) => error = Some(e.clone()),
                    _ => {}
                }
            }
            if !(apply_pending && finished) {
                next.push(task.node.clone());
            }
            tasks.push(SnapshotTask {
                id: task.id.clone(),
                node: task.node.clone(),
                finished,
                error,
            });
        }
        // Merged as the barrier will merge them.
        let mut values = loaded.frame.state.clone();
        if !outputs.is_empty() {
            merge_outputs(Arc::make_mut(&mut values), outputs)?;
        }
        Ok(StateSnapshot {
            next,
            tasks,
            values,
            checkpoint_id: loaded.frame.checkpoint_id,
            parent_id: loaded.frame.parent_id,
            step: loaded.frame.step,
            source: loaded.record.source,
            writers: loaded.record.writers,
            created_at_ms: loaded.record.created_at_ms,
            interrupts,
        })
    }

    /// The thread's state at its newest checkpoint (or at `checkpoint_id`).
    pub async fn get_state(
        &self,
        thread: &str,
        checkpoint_id: Option<&str>,
    ) -> Result<StateSnapshot<S>, RunError> {
        let saver = self.saver()?;
        let loaded = load_checkpoint::<S>(saver.as_ref(), thread, checkpoint_id)
            .await?
            .ok_or_else(|| RunError::ThreadNotFound(thread.to_string()))?;
        self.snapshot(saver.as_ref(), thread, loaded, checkpoint_id.is_none())
            .await
    }

    /// Every checkpoint of the thread, newest first.
    pub async fn get_state_history(&self, thread: &str) -> Result<Vec<StateSnapshot<S>>, RunError> {
        let saver = self.saver()?;
        let history = load_history::<S>(saver.as_ref(), thread).await?;
        if history.is_empty() {
            return Err(RunError::ThreadNotFound(thread.to_string()));
        }
        let mut out = Vec::with_capacity(history.len());
        for loaded in history.into_iter().rev() {
            out.push(self.snapshot(saver.as_ref(), thread, loaded, false).await?);
        }
        Ok(out)
    }

    /// Edits the thread's state as if `as_node` had written `update` (or as new input when
    /// `None`), writing a new checkpoint. The next run continues from it. Returns its id.
    ///
    /// On a paused thread (an interrupt, a breakpoint, a failed step) what is still pending
    /// carries over: open interrupts stay open (a resume answers them), finished tasks' outputs
    /// are kept, and a breakpoint that was stopped at is passed when the thread continues.
    pub async fn update_state(
        &self,
        thread: &str,
        update: S::Update,
        as_node: Option<&str>,
    ) -> Result<String, RunError> {
        self.bulk_update_state_at(thread, None, vec![vec![StateEdit::new(update, as_node)]])
            .await
    }

    /// [`GraphRunner::update_state`] on an older checkpoint of the thread: the new checkpoint
    /// follows `checkpoint_id` (a branch within the same thread, as LangGraph's `update_state`
    /// with a checkpoint id) and becomes the thread's newest, so the next run continues from it.
    pub async fn update_state_at(
        &self,
        thread: &str,
        checkpoint_id: &str,
        update: S::Update,
        as_node: Option<&str>,
    ) -> Result<String, RunError> {
        self.bulk_update_state_at(
            thread,
            Some(checkpoint_id),
            vec![vec![StateEdit::new(update, as_node)]],
        )
        .await
    }

    /// Several supersteps of edits at once (LangGraph's `bulk_update_state`): each inner list
    /// is one superstep, merged like a step's outputs (two edits of one overwrite field in a
    /// step conflict). A step of several edits names a node for each. Every checkpoint is
    /// written, flushed once at the end; returns the last one's id.
    pub async fn bulk_update_state(
        &self,
        thread: &str,
        steps: Vec<Vec<StateEdit<S>>>,
    ) -> Result<String, RunError> {
        self.bulk_update_state_at(thread, None, steps).await
    }

    async fn bulk_update_state_at(
        &self,
        thread: &str,
        at: Option<&str>,
        steps: Vec<Vec<StateEdit<S>>>,
    ) -> Result<String, RunError> {
        ferrograph_core::id::check_thread_id(thread)?;
        if steps.is_empty() || steps.iter().any(Vec::is_empty) {
            return Err(RunError::InvalidInput(
                "an edit needs at least one update in every step".into(),
            ));
        }
        let saver = self.saver()?;
        let guard = self.runtime.inner.begin_run(Some(thread)).await?;
        let loaded = load_checkpoint::<S>(saver.as_ref(), thread, at)
            .await?
            .ok_or_else(|| match at {
                Some(c) => RunError::Checkpoint(ferrograph_core::CheckpointError::NotFound {
                    thread: thread.to_string(),
                    checkpoint: c.to_string(),
                }),
                None => RunError::ThreadNotFound(thread.to_string()),
            })?;
        let at_newest = match at {
            None => true,
            Some(_) => saver
                .get(thread, None)
                .await?
                .is_some_and(|n| n.checkpoint_id == loaded.frame.checkpoint_id),
        };
        // A branch from an older checkpoint starts with a full snapshot.
        let mut stats = if at_newest {
            loaded.stats
        } else {
            ChainStats::default()
        };
        // On the newest checkpoint, what is pending carries over (open interrupts stay open,
        // finished tasks' outputs are kept). A branch from an older checkpoint starts clean,
        // as a fork does: the run that went on from there already consumed that checkpoint's
        // writes (its answers, its tasks' outputs), and replaying them would answer the
        // branch's interrupts with the old answers; its planned tasks run again instead.
        let mut carried = if at_newest {
            saver
                .get_writes(thread, &loaded.frame.checkpoint_id)
                .await?
        } else {
            Vec::new()
        };
        let mut frame = loaded.frame;
        let mut records = Vec::with_capacity(steps.len());
        for edits in steps {
            let edits = edits.into_iter().map(|e| (e.as_node, e.update)).collect();
            let commit = self.graph.commit_edits(&frame, edits)?;
            carried = carry_pending(&carried, &commit.frame.next);
            let record = encode_record(
                thread,
                &commit.frame,
                &commit.writes,
                CheckpointSource::Update,
                &mut stats,
            )?;
            records.push((record, carried.clone()));
            frame = commit.frame;
        }
        for (record, carried) in records {
            // The carried writes go first: a crash between the two leaves writes under a
            // checkpoint that does not exist (ignored), never a checkpoint without its
            // interrupts.
            if !carried.is_empty() {
                saver
                    .put_writes(thread, &record.checkpoint_id, carried)
                    .await?;
            }
            saver.put(record).await?;
        }
        if let Some(mut info) = saver.get_thread(thread).await? {
            info.last_checkpoint_id = Some(frame.checkpoint_id.clone());
            info.updated_at_ms = ferrograph_core::id::now_millis();
            let open: Vec<Interrupt> = pending_interrupts(&carried)
                .into_iter()
                .map(|(i, _, _)| i)
                .collect();
            if info.status == ferrograph_core::ThreadStatus::Interrupted || !frame.next.is_empty() {
                // Something is planned: the thread waits to be continued (or answered).
                info.status = ferrograph_core::ThreadStatus::Interrupted;
                info.error = None;
                info.interrupts = open;
            }
            saver.put_thread(info).await?;
        }
        saver.flush().await?;
        self.cache.forget(thread);
        drop(guard);
        Ok(frame.checkpoint_id)
    }

    /// Keeps only the newest `keep` checkpoints of the thread (at least one). The oldest kept
    /// checkpoint is rewritten as a full snapshot first, so history stays loadable. Returns how
    /// many checkpoints were removed.
    pub async fn prune(&self, thread: &str, keep: usize) -> Result<usize, RunError> {
        let saver = self.saver()?;
        let _guard = self.runtime.inner.begin_run(Some(thread)).await?;
        let keep = keep.max(1);
        let newest = saver.list(thread, None, Some(keep)).await?;
        if newest.is_empty() {
            return Err(RunError::ThreadNotFound(thread.to_string()));
        }
        let Some(oldest_kept) = newest.last() else {
            return Ok(0);
        };
        if saver
            .list(thread, Some(&oldest_kept.checkpoint_id), Some(1))
            .await?
            .is_empty()
        {
            return Ok(0);
        }
        if !oldest_kept.full {
            let loaded =
                load_checkpoint::<S>(saver.as_ref(), thread, Some(&oldest_kept.checkpoint_id))
                    .await?
                    .ok_or_else(|| RunError::ThreadNotFound(thread.to_string()))?;
            let record =
                ferrograph_core::checkpoint::encode_full(thread, &loaded).map_err(|source| {
                    ferrograph_core::CheckpointError::Corrupt {
                        thread: thread.to_string(),
                        checkpoint: oldest_kept.checkpoint_id.clone(),
                        source,
                    }
                })?;
            saver.put(record).await?;
            saver.flush().await?;
        }
        let removed = saver
            .delete_before(thread, &oldest_kept.checkpoint_id)
            .await?;
        saver.flush().await?;
        Ok(removed)
    }

    /// Copies the thread's state at `checkpoint_id` into a new thread `new_thread`, whose
    /// history starts there. Returns the new checkpoint id.
    pub async fn fork(
        &self,
        thread: &str,
        checkpoint_id: &str,
        new_thread: &str,
    ) -> Result<String, RunError> {
        ferrograph_core::id::check_thread_id(new_thread)?;
        let saver = self.saver()?;
        if saver.get(new_thread, None).await?.is_some() {
            return Err(RunError::ThreadBusy(new_thread.to_string()));
        }
        let loaded = load_checkpoint::<S>(saver.as_ref(), thread, Some(checkpoint_id))
            .await?
            .ok_or_else(|| RunError::ThreadNotFound(thread.to_string()))?;
        let mut frame = loaded.frame;
        frame.parent_id = None;
        frame.checkpoint_id = ferrograph_core::id::ordered_id();
        let mut stats = ChainStats::default();
        let record = encode_record(new_thread, &frame, &[], CheckpointSource::Fork, &mut stats)?;
        saver.put(record).await?;
        let mut info = ThreadInfo::new(new_thread, self.graph.name());
        info.status = ferrograph_core::ThreadStatus::Interrupted;
        info.last_checkpoint_id = Some(frame.checkpoint_id.clone());
        info.metadata
            .insert("forked_from".into(), format!("{thread}@{checkpoint_id}"));
        saver.put_thread(info).await?;
        saver.flush().await?;
        Ok(frame.checkpoint_id)
    }
}

/// A checkpoint record for `frame`; an encoding failure names the thread and checkpoint.
fn encode_record<S: State>(
    thread: &str,
    frame: &Frame<S>,
    writes: &[(String, S::Update)],
    source: CheckpointSource,
    stats: &mut ChainStats,
) -> Result<ferrograph_core::checkpoint::CheckpointRecord, RunError> {
    encode_checkpoint(thread, frame, writes, source, stats).map_err(|source| {
        ferrograph_core::CheckpointError::Corrupt {
            thread: thread.to_string(),
            checkpoint: frame.checkpoint_id.clone(),
            source,
        }
        .into()
    })
}

/// Records resume answers. With a thread record, the answers and the record that stops
/// showing the interrupt as waiting are written together: a crash between them used to leave a
/// thread whose record asked for an answer that its checkpoint already held.
async fn record_answers(
    writer: &mut Writer,
    info: Option<&mut ThreadInfo>,
    thread: &str,
    checkpoint: &str,
    answers: Vec<PendingWrite>,
) -> Result<(), RunError> {
    if !writer.is_on() {
        return Ok(());
    }
    match info {
        Some(info) => {
            mark_running(info);
            writer
                .put_writes_and_thread(thread, checkpoint, answers, info.clone())
                .await?;
        }
        None => writer.put_writes(thread, checkpoint, answers).await?,
    }
    Ok(())
}

/// Marks a thread record as running (its input or answers were accepted).
fn mark_running(info: &mut ThreadInfo) {
    info.status = ferrograph_core::ThreadStatus::Running;
    crate::owner::claim(info);
    info.error = None;
    info.interrupts.clear();
    info.updated_at_ms = ferrograph_core::id::now_millis();
}
