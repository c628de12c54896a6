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
use ferrograph_core::{CompiledGraph, State};
use std::sync::Arc;
use tokio::sync::oneshot;

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
    let pool = match runtime.pool_for(&graph).await {
        Ok(p) => p,
        Err(e) => return TaskResult::Failed(NodeError::fatal(e.to_string())),
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
                return TaskResult::Failed(NodeError::fatal(format!(
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
                Err(e) => return TaskResult::Failed(NodeError::fatal(e.to_string())),
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
        guard: None,
        saver: None,
        thread_info: None,
        merged,
        cache: None,
        resuming: false,
        store: ctx.store.clone(),
    };
    let pool_for_run = args.pool.clone();
    if let Err(e) = pool_for_run.start_run(args).await {
        return TaskResult::Failed(NodeError::fatal(format!(
            "could not start the subgraph coordinator: {e}"
        )));
    }
    match rx.await {
        Ok(RunEnd::Done { writes, .. }) => TaskResult::Output(NodeOutput {
            updates: writes,
            ..NodeOutput::empty()
        }),
        Ok(RunEnd::Parent { output }) => TaskResult::Output(NodeOutput {
            updates: output.updates,
            goto: output.goto,
            ..NodeOutput::empty()
        }),
        Ok(RunEnd::Interrupted {
            frame,
            interrupts,
            pending,
            merged,
        }) => match encode_subgraph(&frame, &pending, &merged) {
            Ok(bytes) => TaskResult::Interrupted {
                interrupts,
                child: Some(bytes),
            },
            Err(e) => TaskResult::Failed(NodeError::fatal(format!(
                "could not save the interrupted subgraph: {e}"
            ))),
        },
        Ok(RunEnd::Drained { .. }) => TaskResult::Failed(NodeError::Cancelled),
        Ok(RunEnd::Failed(e)) => TaskResult::Failed(NodeError::Failed {
            message: format!("subgraph failed: {e}"),
            retryable: false,
            source: Some(Box::new(e)),
        }),
        Err(_) => TaskResult::Failed(NodeError::AgentLost(
            "the subgraph coordinator stopped without answering".into(),
        )),
    }
}
