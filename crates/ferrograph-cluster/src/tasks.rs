//! Graph tasks across nodes: a task host on worker nodes, and [`ClusterTaskPlacer`], the
//! runtime's [`TaskPlacer`] on the cluster.
//!
//! A worker node runs a task host (a host, see [`crate::jobs`], in the process group
//! [`TASKS_GROUP`]) for the graphs it has loaded: the same workflows as the coordinator's,
//! compiled from the same code. A task is a job: its request is the [`RemoteTask`] (the
//! node's input as JSON and its context), its pieces are the node's events (tokens, custom
//! data) and its result is the node's [`RemoteOutcome`]. The coordinator keeps everything
//! else: planning, merging and checkpoints.
//!
//! A worker lost mid-task makes the task fail with [`NodeError::NodeLost`] naming it. That
//! error is retryable, so the graph node's retry policy decides: with one, the task runs
//! again on another worker with the label (the lost worker has left the process group by
//! then, or does not answer the placer's question and is passed over); without one, the run
//! fails with that error. Tasks of the same step that finished stay finished: the
//! coordinator holds their outputs and commits the step once.

use crate::error::ClusterError;
use crate::jobs::{run_job, Host, HostArgs, JobError, Picker, Pieces, Service};
use crate::node::{ClusterNode, NodeShared};
use crate::wire::RemoteFailure;
use async_trait::async_trait;
use ferrograph_core::node::NodeError;
use ferrograph_runtime::placement::{RemoteEvent, RemoteOutcome, RemoteTask, TaskPlacer};
use ferrograph_runtime::Workflow;
use ractor::Actor;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// The process group of every task host.
pub const TASKS_GROUP: &str = "ferrograph.tasks";

/// Runs the tasks of some graphs for other nodes.
struct TaskService {
    graphs: BTreeMap<String, Arc<dyn Workflow>>,
}

fn host_failure(message: String) -> RemoteFailure {
    RemoteFailure {
        kind: "fatal".into(),
        message,
        output: None,
    }
}

#[async_trait]
impl Service for TaskService {
    fn kind(&self) -> &'static str {
        "tasks"
    }

    fn name(&self) -> String {
        "tasks".into()
    }

    fn graphs(&self) -> Vec<String> {
        self.graphs.keys().cloned().collect()
    }

    async fn run(&self, request: String, pieces: Pieces) -> Result<String, RemoteFailure> {
        let task: RemoteTask = serde_json::from_str(&request)
            .map_err(|e| host_failure(format!("the task is not valid: {e}")))?;
        let workflow = self
            .graphs
            .get(&task.graph)
            .ok_or_else(|| host_failure(format!("this node has no graph {}", task.graph)))?
            .clone();
        let (tx, mut rx) = mpsc::channel::<RemoteEvent>(256);
        let forward = async {
            while let Some(ev) = rx.recv().await {
                if let Ok(json) = serde_json::to_string(&ev) {
                    pieces.push(json);
                }
            }
        };
        let (outcome, ()) = tokio::join!(workflow.run_task(task, tx), forward);
        serde_json::to_string(&outcome)
            .map_err(|e| host_failure(format!("encoding the task's outcome: {e}")))
    }
}

impl ClusterNode {
    /// Runs tasks of `workflows` for other nodes' coordinators: starts a task host on this
    /// node. Each workflow is found by its graph's name.
    pub async fn host_tasks(
        &self,
        workflows: impl IntoIterator<Item = Arc<dyn Workflow>>,
    ) -> Result<Vec<String>, ClusterError> {
        let graphs: BTreeMap<String, Arc<dyn Workflow>> =
            workflows.into_iter().map(|w| (w.info().name, w)).collect();
        let names: Vec<String> = graphs.keys().cloned().collect();
        Actor::spawn(
            None,
            Host,
            HostArgs {
                shared: self.shared.clone(),
                group: TASKS_GROUP,
                service: Arc::new(TaskService { graphs }),
            },
        )
        .await
        .map_err(|e| ClusterError::Actor(e.to_string()))?;
        Ok(names)
    }

    /// The runtime's task placer on this cluster (install it with
    /// `Runtime::set_placer`).
    pub fn task_placer(&self) -> ClusterTaskPlacer {
        ClusterTaskPlacer {
            shared: self.shared.clone(),
            poll_wait: Duration::from_millis(1_000),
            picker: Picker::default(),
            lost: Arc::default(),
        }
    }
}

/// Places graph tasks on the cluster's task hosts (see the module documentation).
#[derive(Clone)]
pub struct ClusterTaskPlacer {
    shared: Arc<NodeShared>,
    poll_wait: Duration,
    picker: Picker,
    /// Workers lost while running tasks (named when no worker is left).
    lost: Arc<parking_lot::Mutex<Vec<String>>>,
}

impl std::fmt::Debug for ClusterTaskPlacer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterTaskPlacer")
            .field("node", &self.shared.name)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl TaskPlacer for ClusterTaskPlacer {
    async fn run(
        &self,
        task: RemoteTask,
        events: mpsc::Sender<RemoteEvent>,
    ) -> Result<RemoteOutcome, NodeError> {
        let (label, graph, node_name) = (task.label.clone(), task.graph.clone(), task.node.clone());
        let fits =
            |h: &crate::wire::HostInfo| h.labels.contains(&label) && h.graphs.contains(&graph);
        let Some((cell, info, _inflight)) =
            self.picker.pick(&self.shared, TASKS_GROUP, fits, &[]).await
        else {
            let lost = self.lost.lock().clone();
            return Err(NodeError::NodeLost {
                node: lost.last().cloned().unwrap_or_else(|| "none".into()),
                message: format!(
                    "no node of the cluster labelled {} runs graph {}{}",
                    label,
                    graph,
                    if lost.is_empty() {
                        String::new()
                    } else {
                        format!(" (lost: {})", lost.join(", "))
                    }
                ),
            });
        };
        let request = serde_json::to_string(&task)
            .map_err(|e| NodeError::fatal(format!("the task cannot be encoded: {e}")))?;
        let (tx, mut rx) = mpsc::channel::<String>(256);
        let forward = async {
            while let Some(piece) = rx.recv().await {
                match serde_json::from_str::<RemoteEvent>(&piece) {
                    Ok(ev) => {
                        let _ = events.send(ev).await;
                    }
                    Err(e) => tracing::warn!("an event from node {}: {e}", info.node),
                }
            }
        };
        let job = async {
            let tx = tx;
            run_job(
                &self.shared,
                &cell,
                &info.node,
                request,
                self.poll_wait,
                &tx,
            )
            .await
        };
        let (result, ()) = tokio::join!(job, forward);
        match result {
            Ok(json) => serde_json::from_str::<RemoteOutcome>(&json).map_err(|e| {
                NodeError::fatal(format!(
                    "the outcome from node {} cannot be read: {e}",
                    info.node
                ))
            }),
            Err(JobError::Lost { node, message }) => {
                tracing::warn!(%node, "a worker was lost while running a task of {node_name}: {message}");
                let mut lost = self.lost.lock();
                if !lost.contains(&node) {
                    lost.push(node.clone());
                }
                Err(NodeError::NodeLost { node, message })
            }
            Err(JobError::Failed(f)) => Err(NodeError::fatal(format!(
                "on node {}: {}",
                info.node, f.message
            ))),
            Err(JobError::Broken(e)) => Err(NodeError::fatal(e.to_string())),
        }
    }
}
