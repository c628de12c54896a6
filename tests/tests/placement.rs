//! Placement semantics with an in-process task placer: nodes pinned to a label run their
//! tasks through the runtime's placer (input and output as JSON, events forwarded), the
//! result equals a local run, and a lost worker is a retryable failure that the node's retry
//! policy decides about. The network itself is tested in `crates/ferrograph-cli/tests/cluster_cli.rs`.

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use async_trait::async_trait;
use ferrograph::prelude::*;
use ferrograph::runtime::placement::{RemoteEvent, RemoteOutcome, RemoteTask, TaskPlacer};
use ferrograph::runtime::Workflow;
use ferrograph::{RunError, StreamEvent};
use ferrograph_tests::{log, Doc, DocUpdate};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;

/// Runs tasks on a second runtime's copy of the graph ("the worker"); the first `lose`
/// tasks are lost, as if their worker was killed.
struct LoopbackPlacer {
    worker: Arc<dyn Workflow>,
    lose: AtomicU32,
    seen: Mutex<Vec<(String, String)>>,
}

#[async_trait]
impl TaskPlacer for LoopbackPlacer {
    async fn run(
        &self,
        task: RemoteTask,
        events: mpsc::Sender<RemoteEvent>,
    ) -> Result<RemoteOutcome, NodeError> {
        self.seen
            .lock()
            .push((task.node.clone(), task.label.clone()));
        if self
            .lose
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(NodeError::NodeLost {
                node: "w1".into(),
                message: "its session ended before it answered".into(),
            });
        }
        // Through JSON, as over the network.
        let task: RemoteTask =
            serde_json::from_str(&serde_json::to_string(&task).unwrap()).unwrap();
        let out = self.worker.run_task(task, events).await;
        Ok(serde_json::from_str(&serde_json::to_string(&out).unwrap()).unwrap())
    }
}

fn fanout(n: i64, on: Option<&str>, retry: Option<RetryPolicy>) -> CompiledGraph<Doc> {
    let mut opts = NodeOptions::new();
    if let Some(l) = on {
        opts = opts.on(l);
    }
    if let Some(r) = retry {
        opts = opts.retry(r);
    }
    StateGraph::<Doc>::new("placed")
        .add_node("dispatch", |_s, _c: NodeContext| async move {
            Ok(log("dispatch"))
        })
        .add_node_with(
            "worker",
            |s: Arc<Doc>, ctx: NodeContext| async move {
                ctx.emit_custom(&serde_json::json!({ "item": s.item }))
                    .await?;
                Ok(DocUpdate::new()
                    .log(vec![format!("w{}", s.item)])
                    .count(s.item)
                    .max(s.item))
            },
            opts,
        )
        .add_node("join", |_s, _c: NodeContext| async move { Ok(log("join")) })
        .add_edge(START, "dispatch")
        .add_conditional_edges(
            "dispatch",
            move |s: &Doc| {
                (0..n)
                    .map(|i| {
                        SendTo::new(
                            "worker",
                            Doc {
                                item: i,
                                ..s.clone()
                            },
                        )
                    })
                    .collect::<Vec<_>>()
            },
            ["worker"],
        )
        .add_edge("worker", "join")
        .add_edge("join", END)
        .compile()
        .unwrap()
}

async fn placer_for(graph: CompiledGraph<Doc>, lose: u32) -> Arc<LoopbackPlacer> {
    let worker_rt = Runtime::new().await.unwrap();
    let worker = worker_rt.load(graph).await.unwrap();
    Arc::new(LoopbackPlacer {
        worker: Arc::new(worker),
        lose: AtomicU32::new(lose),
        seen: Mutex::new(Vec::new()),
    })
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

#[tokio::test]
async fn placed_tasks_run_through_the_placer_with_the_local_result_and_their_events() {
    let local = Runtime::new()
        .await
        .unwrap()
        .load(fanout(20, None, None))
        .await
        .unwrap()
        .invoke(RunInput::Update(DocUpdate::new()), RunConfig::default())
        .await
        .unwrap();

    let rt = Runtime::new().await.unwrap();
    let placer = placer_for(fanout(20, Some("gpu"), None), 0).await;
    rt.set_placer(placer.clone());
    let runner = rt.load(fanout(20, Some("gpu"), None)).await.unwrap();
    let mut stream = runner
        .stream(
            RunInput::Update(DocUpdate::new()),
            RunConfig::default().stream(StreamModes::NONE.with(StreamMode::Custom)),
        )
        .await
        .unwrap();
    let mut items = Vec::new();
    while let Some(ev) = stream.next_event().await {
        if let StreamEvent::Custom { payload, .. } = &ev {
            items.push(payload.0["item"].as_i64().unwrap());
        }
    }
    let placed = stream.outcome().await.unwrap();
    assert_eq!(
        sorted(placed.state.log.clone()),
        sorted(local.state.log.clone())
    );
    assert_eq!(placed.state.count, local.state.count);
    assert_eq!(placed.state.max, local.state.max);
    // Only the pinned node went through the placer, once per task, with its label.
    let seen = placer.seen.lock().clone();
    assert_eq!(seen.len(), 20);
    assert!(seen.iter().all(|(n, l)| n == "worker" && l == "gpu"));
    items.sort_unstable();
    assert_eq!(items, (0..20).collect::<Vec<i64>>());
}

#[tokio::test]
async fn a_lost_task_runs_again_under_the_retry_policy_and_fails_naming_the_node_without_one() {
    // Two lost tasks, three attempts each: the run completes, each task counted once.
    let rt = Runtime::new().await.unwrap();
    let placer = placer_for(fanout(5, Some("w"), None), 2).await;
    rt.set_placer(placer.clone());
    let out = rt
        .load(fanout(5, Some("w"), Some(RetryPolicy::attempts(3))))
        .await
        .unwrap()
        .invoke(RunInput::Update(DocUpdate::new()), RunConfig::default())
        .await
        .unwrap();
    assert_eq!(out.state.count, 10);
    assert_eq!(out.state.log.len(), 7);
    assert_eq!(placer.seen.lock().len(), 7);

    // Without a retry policy, the run fails with the lost node's name.
    let rt = Runtime::new().await.unwrap();
    rt.set_placer(placer_for(fanout(5, Some("w"), None), 1).await);
    let err = rt
        .load(fanout(5, Some("w"), None))
        .await
        .unwrap()
        .invoke(RunInput::Update(DocUpdate::new()), RunConfig::default())
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("cluster node w1 was lost"), "{text}");
    assert!(
        matches!(&err, RunError::Node { source: NodeError::NodeLost { node, .. }, .. } if node == "w1"),
        "{err:?}"
    );
}

#[tokio::test]
async fn place_pins_a_node_from_outside_and_without_a_placer_labels_are_ignored() {
    let rt = Runtime::new().await.unwrap();
    let placer = placer_for(fanout(3, None, None), 0).await;
    rt.set_placer(placer.clone());
    rt.place("placed", "worker", "cpu-box");
    let out = rt
        .load(fanout(3, None, None))
        .await
        .unwrap()
        .invoke(RunInput::Update(DocUpdate::new()), RunConfig::default())
        .await
        .unwrap();
    assert_eq!(out.state.count, 3);
    let seen = placer.seen.lock().clone();
    assert_eq!(seen.len(), 3);
    assert!(seen.iter().all(|(_, l)| l == "cpu-box"));

    // No placer: `.on` changes nothing.
    let out = Runtime::new()
        .await
        .unwrap()
        .load(fanout(3, Some("gpu"), None))
        .await
        .unwrap()
        .invoke(RunInput::Update(DocUpdate::new()), RunConfig::default())
        .await
        .unwrap();
    assert_eq!(out.state.count, 3);
}
