//! Running a subgraph as one node of its parent.
//!
//! The subgraph runs under its own coordinator, with the parent's snapshot as its input, and
//! its agents in its own pool. Its merged updates become the node's update in the parent (a
//! command addressed to the parent replaces them: only its own update and goto go up). If
//! it interrupts, its frame and pending writes are stored in the parent's pending writes, and
//! a resume continues it where it stopped, with resume values routed to its tasks by id.

use crate::config::RunConfig;
use crate::coordinator::{RunArgs, RunEnd, TaskResult};
use crate::events::EventTx;
use crate::runtime::RuntimeInner;
use crate::writer::Writer;
use ferrograph_core::checkpoint::{
    decode_subgraph, encode_subgraph, ChainStats, PendingKind, PendingWrite,
};
use ferrograph_core::engine::Frame;
use ferrograph_core::json::Json;
use ferrograph_core::node::{NodeContextParts, NodeError, NodeOutput};
use ferrograph_core::{CompiledGraph, Interrupt, State};
use std::sync::Arc;
use tokio::sync::oneshot;

/// How a child graph's run ended.
pub(crate) enum ChildRun<S: State> {
    /// It reached its end: its final state and the updates it merged.
    Done {
        state: Arc<S>,
        writes: Vec<S::Update>,
    },
    /// A node of it addressed the parent: the command (its own update and goto).
    Parent(NodeOutput<S>),
    /// It interrupted; the bytes resume it.
    Interrupted {
        interrupts: Vec<Interrupt>,
        saved: Vec<u8>,
    },
    /// It failed.
    Failed(NodeError),
}

/// Runs a same-state subgraph as one task of its parent.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run_subgraph<S: State>(
    runtime: &Arc<RuntimeInner>,
    graph: CompiledGraph<S>,
    input: Arc<S>,
    ctx: &NodeContextParts,
    child: Option<Vec<u8>>,
    resume: Vec<(String, Json)>,
    max_steps: u64,
    events: Option<EventTx<S>>,
) -> TaskResult<S> {
    match run_child(runtime, graph, input, ctx, child, resume, max_steps, events).await {
        ChildRun::Done { writes, .. } => TaskResult::Output(NodeOutput {
            updates: writes,
            ..NodeOutput::empty()
        }),
        ChildRun::Parent(output) => TaskResult::Output(NodeOutput {
            updates: output.updates,
            goto: output.goto,
            overwrites: output.overwrites,
            ..NodeOutput::empty()
        }),
        ChildRun::Interrupted { interrupts, saved } => TaskResult::Interrupted {
            interrupts,
            child: Some(saved),
        },
        ChildRun::Failed(e) => TaskResult::Failed(e),
    }
}

/// Runs (or resumes) a child graph under its own coordinator.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run_child<S: State>(
    runtime: &Arc<RuntimeInner>,
    graph: CompiledGraph<S>,
    input: Arc<S>,
    ctx: &NodeContextParts,
    child: Option<Vec<u8>>,
    resume: Vec<(String, Json)>,
    max_steps: u64,
    events: Option<EventTx<S>>,
) -> ChildRun<S> {
    let pool = match runtime.pool_for(&graph).await {
        Ok(p) => p,
        Err(e) => return ChildRun::Failed(NodeError::fatal(e.to_string())),
    };
    let namespace: Arc<str> = if ctx.namespace.is_empty() {
        format!("{}:{}", ctx.node, ctx.task_id).into()
    } else {
        format!("{}|{}:{}", ctx.namespace, ctx.node, ctx.task_id).into()
    };
    let (frame, mut pending, merged) = match child {
        Some(bytes) => match decode_subgraph::<S>(&bytes) {
            Ok(v) => (v.frame, v.pending, v.merged),
            Err(e) => {
                return ChildRun::Failed(NodeError::fatal(format!(
                    "the saved state of subgraph `{}` is corrupt: {e}",
                    ctx.node
                )))
            }
        },
        None => {
            let mut base = Frame::empty(&graph);
            base.state = input;
            match graph.plan_input(&base, None) {
                Ok(c) => (c.frame, Vec::new(), Vec::new()),
                Err(e) => return ChildRun::Failed(NodeError::fatal(e.to_string())),
            }
        }
    };
    // Route resume values to the child tasks whose interrupts they answer.
    let mut routed: Vec<PendingWrite> = Vec::new();
    for (id, value) in resume {
        let owner = pending.iter().find_map(|w| match &w.kind {
            PendingKind::Interrupts(list) if list.iter().any(|i| i.id == id) => {
                Some((w.task_id.clone(), w.node.clone()))
            }
            _ => None,
        });
        if let Some((task_id, node)) = owner {
            routed.push(PendingWrite {
                task_id,
                node,
                kind: PendingKind::Resume(vec![(id, value)]),
            });
        }
    }
    pending.extend(routed);
    let (done, rx) = oneshot::channel();
    let args = RunArgs {
        parent_span: tracing::Span::current(),
        graph,
        pool,
        runtime: runtime.clone(),
        writer: Writer::Off,
        thread_id: ctx.thread_id.clone(),
        namespace,
        frame,
        stats: ChainStats::default(),
        pending,
        config: RunConfig {
            max_steps,
            ..RunConfig::default()
        },
        events,
        done,
        is_subgraph: true,
        _guard: None,
        saver: None,
        thread_info: None,
        merged,
        cache: None,
        resuming: false,
        store: ctx.store.clone(),
    };
    let pool_for_run = args.pool.clone();
    if let Err(e) = pool_for_run.start_run(args).await {
        return ChildRun::Failed(NodeError::fatal(format!(
            "could not start the subgraph coordinator: {e}"
        )));
    }
    match rx.await {
        Ok(RunEnd::Done { frame, writes }) => ChildRun::Done {
            state: frame.state,
            writes,
        },
        Ok(RunEnd::Parent { output }) => ChildRun::Parent(output),
        Ok(RunEnd::Interrupted {
            frame,
            interrupts,
            pending,
            merged,
            ..
        }) => match encode_subgraph(&frame, &pending, &merged) {
            Ok(saved) => ChildRun::Interrupted { interrupts, saved },
            Err(e) => ChildRun::Failed(NodeError::fatal(format!(
                "could not save the interrupted subgraph: {e}"
            ))),
        },
        Ok(RunEnd::Drained { .. }) => ChildRun::Failed(NodeError::Cancelled),
        Ok(RunEnd::Failed(e)) => ChildRun::Failed(NodeError::Failed {
            message: format!("subgraph failed: {e}"),
            retryable: false,
            source: Some(Box::new(e)),
        }),
        Err(_) => ChildRun::Failed(NodeError::AgentLost(
            "the subgraph coordinator stopped without answering".into(),
        )),
    }
}

/// Maps the parent's state to a child's input.
type InputMap<P, C> = Arc<dyn Fn(&P) -> C + Send + Sync>;
/// Maps a child's final state (and the parent's state it started from) to the parent's update.
type OutputMap<P, C> = Arc<dyn Fn(&C, &P) -> <P as State>::Update + Send + Sync>;

/// A subgraph over its own state type `C`, run as one node of a graph over `P` (LangGraph's
/// subgraph with a different schema): `input` builds the child's input from the parent's
/// state; when the child ends, `output` turns its final state into the parent's update, so a
/// child can keep keys of its own and the parent sees only what `output` passes up. The
/// child's interrupts surface to the caller (node `name/child_node`) and resume inside it, and
/// a resumed child continues from its saved state, not from a new input.
///
/// Its nodes' *values* and *updates* are over `C` and are not streamed to the parent's stream;
/// a command addressed to the parent from inside it is refused (its update would be over `C`).
pub struct MappedSubgraph<P: State, C: State> {
    graph: CompiledGraph<C>,
    input: InputMap<P, C>,
    output: OutputMap<P, C>,
}

impl<P: State, C: State> MappedSubgraph<P, C> {
    /// A child `graph` with its input and output maps.
    pub fn new<I, O>(graph: CompiledGraph<C>, input: I, output: O) -> Self
    where
        I: Fn(&P) -> C + Send + Sync + 'static,
        O: Fn(&C, &P) -> P::Update + Send + Sync + 'static,
    {
        MappedSubgraph {
            graph,
            input: Arc::new(input),
            output: Arc::new(output),
        }
    }
}

impl<P: State, C: State> ferrograph_core::subgraph::ForeignGraph<P> for MappedSubgraph<P, C> {
    fn graph_name(&self) -> &str {
        self.graph.name()
    }

    fn run(
        &self,
        host: Arc<dyn std::any::Any + Send + Sync>,
        input: Arc<P>,
        call: ferrograph_core::subgraph::ChildCall,
    ) -> futures::future::BoxFuture<'static, ferrograph_core::subgraph::ChildOutcome<P>> {
        use ferrograph_core::subgraph::ChildOutcome;
        let graph = self.graph.clone();
        let (input_map, output_map) = (self.input.clone(), self.output.clone());
        Box::pin(async move {
            let Ok(runtime) = host.downcast::<RuntimeInner>() else {
                return ChildOutcome::Failed(NodeError::fatal(
                    "a mapped subgraph was run by something other than the ferrograph runtime",
                ));
            };
            let child_input = match &call.saved {
                // A resumed child continues from its own saved state.
                Some(_) => Arc::new(C::default()),
                None => match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    input_map(&input)
                })) {
                    Ok(c) => Arc::new(c),
                    Err(p) => {
                        return ChildOutcome::Failed(NodeError::Panicked(format!(
                            "the input map of subgraph `{}` panicked: {}",
                            graph.name(),
                            ferrograph_core::engine::panic_message(p.as_ref())
                        )))
                    }
                },
            };
            let name = graph.name().to_string();
            let run = run_child(
                &runtime,
                graph,
                child_input,
                &call.ctx,
                call.saved,
                call.resume,
                call.max_steps,
                None,
            )
            .await;
            match run {
                ChildRun::Done { state, .. } => {
                    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        output_map(&state, &input)
                    })) {
                        Ok(update) => ChildOutcome::Output(NodeOutput::update(update)),
                        Err(p) => ChildOutcome::Failed(NodeError::Panicked(format!(
                            "the output map of subgraph `{name}` panicked: {}",
                            ferrograph_core::engine::panic_message(p.as_ref())
                        ))),
                    }
                }
                ChildRun::Parent(_) => ChildOutcome::Failed(NodeError::fatal(format!(
                    "a node of subgraph `{name}` addressed the parent graph, which has another state type; return the result through the subgraph's output map instead"
                ))),
                ChildRun::Interrupted { interrupts, saved } => {
                    ChildOutcome::Interrupted { interrupts, saved }
                }
                ChildRun::Failed(e) => ChildOutcome::Failed(e),
            }
        })
    }
}
