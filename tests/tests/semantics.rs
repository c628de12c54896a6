//! The semantics suite: every rule of state, graphs, supersteps, interrupts, limits,
//! subgraphs, streaming, checkpoints and the actor runtime, tested through the public API.

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use ferrograph::core::graph::GraphProblem;
use ferrograph::core::state::StateUpdate;
use ferrograph::prelude::*;
use ferrograph::{CancelHandle, CheckpointSaver, RunStatus, StreamEvent, ThreadStatus};
use ferrograph_tests::{log, Doc, DocUpdate};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

type Ctx = NodeContext;

fn logger(
    name: &'static str,
) -> impl Fn(Arc<Doc>, Ctx) -> futures_ready::Ready<DocUpdate> + Send + Sync + 'static {
    move |_s, _c| futures_ready::ready(log(name))
}

mod futures_ready {
    use ferrograph::NodeError;
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// A future that is immediately ready with `Ok(value)`.
    pub struct Ready<T>(Option<T>);

    pub fn ready<T>(v: T) -> Ready<T> {
        Ready(Some(v))
    }

    impl<T: Unpin> Future for Ready<T> {
        type Output = Result<T, NodeError>;
        fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Self::Output> {
            Poll::Ready(
                self.0
                    .take()
                    .ok_or_else(|| NodeError::fatal("polled twice")),
            )
        }
    }
}

async fn runtime() -> Runtime {
    Runtime::new().await.expect("runtime")
}

fn input(u: DocUpdate) -> RunInput<Doc> {
    RunInput::Update(u)
}

// ---------------------------------------------------------------- state and merge rules

#[test]
fn derive_generates_update_with_every_rule() {
    let mut d = Doc::default();
    let m = Message::human("hi");
    d.apply(
        DocUpdate::new()
            .messages(m.clone())
            .log(vec!["a".into()])
            .count(2)
            .max(5)
            .status("x".to_string()),
    )
    .unwrap();
    d.apply(DocUpdate::new().log(vec!["b".into()]).count(3).max(1))
        .unwrap();
    assert_eq!(d.log, vec!["a", "b"]);
    assert_eq!(d.count, 5);
    assert_eq!(d.max, 5);
    assert_eq!(d.status, "x");
    assert_eq!(d.messages, vec![m.clone()]);
    // messages: replace by id, remove by id, unknown id is an error naming the field
    let edited = Message::ai("edited").with_id(m.id.clone());
    d.apply(DocUpdate::new().messages(edited.clone())).unwrap();
    assert_eq!(d.messages, vec![edited]);
    d.apply(DocUpdate::new().messages(MessageOp::remove(m.id.clone())))
        .unwrap();
    assert!(d.messages.is_empty());
    let err = d
        .apply(DocUpdate::new().messages(MessageOp::remove("ghost")))
        .unwrap_err();
    assert!(err.to_string().contains("messages"), "{err}");
    assert!(err.to_string().contains("ghost"), "{err}");
    // the update knows which fields it sets
    let u = DocUpdate::new().count(1).status("s".to_string());
    assert_eq!(u.fields_set(), vec!["count", "status"]);
    assert!(!u.is_empty());
    assert!(DocUpdate::new().is_empty());
    let mut over = Vec::new();
    Doc::overwritten_fields(&u, &mut |f| over.push(f));
    assert_eq!(over, vec!["status"]);
    assert_eq!(Doc::SCHEMA_VERSION, 1);
}

#[tokio::test]
async fn two_writers_of_an_overwrite_field_is_an_error_naming_both() {
    let g = StateGraph::<Doc>::new("conflict")
        .add_node("a", |_s, _c| async {
            Ok(DocUpdate::new().status("a".to_string()))
        })
        .add_node("b", |_s, _c| async {
            Ok(DocUpdate::new().status("b".to_string()))
        })
        .add_edge(START, "a")
        .add_edge(START, "b")
        .add_edge("a", END)
        .add_edge("b", END)
        .compile()
        .unwrap();
    let rt = runtime().await;
    let err = rt
        .load(g)
        .await
        .unwrap()
        .invoke(input(DocUpdate::new()), RunConfig::default())
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("status") && text.contains("`a`") && text.contains("`b`"),
        "{text}"
    );
}

#[tokio::test]
async fn parallel_writers_with_merge_rules_do_not_conflict() {
    let g = StateGraph::<Doc>::new("merge")
        .add_node("a", |_s, _c| async {
            Ok(DocUpdate::new().count(1).log(vec!["a".into()]))
        })
        .add_node("b", |_s, _c| async {
            Ok(DocUpdate::new().count(10).log(vec!["b".into()]))
        })
        .add_edge(START, "a")
        .add_edge(START, "b")
        .add_edge("a", END)
        .add_edge("b", END)
        .compile()
        .unwrap();
    let out = runtime()
        .await
        .load(g)
        .await
        .unwrap()
        .invoke(input(DocUpdate::new()), RunConfig::default())
        .await
        .unwrap();
    assert_eq!(out.state.count, 11);
    assert_eq!(
        out.state.log,
        vec!["a", "b"],
        "plan order, not finishing order"
    );
}

// ---------------------------------------------------------------- graph builder

#[test]
fn compile_reports_every_problem_at_once() {
    let err = StateGraph::<Doc>::new("bad")
        .add_node("a", logger("a"))
        .add_node("a", logger("a2"))
        .add_node("orphan", logger("orphan"))
        .add_node("stuck", logger("stuck"))
        .add_edge(START, "a")
        .add_edge("a", "stuck")
        .add_edge("a", "nowhere")
        .add_edge("orphan", END)
        .compile()
        .unwrap_err();
    let p = &err.problems;
    assert!(
        p.contains(&GraphProblem::DuplicateNode("a".into())),
        "{p:?}"
    );
    assert!(p.contains(&GraphProblem::UnknownTarget {
        from: "a".into(),
        target: "nowhere".into()
    }));
    assert!(p.contains(&GraphProblem::Unreachable("orphan".into())));
    assert!(p.contains(&GraphProblem::NoWayOut("stuck".into())));
    assert!(p.len() >= 4);
    let none = StateGraph::<Doc>::new("empty")
        .add_node("x", logger("x"))
        .add_edge("x", END)
        .compile()
        .unwrap_err();
    assert!(none.problems.contains(&GraphProblem::NoEntryPoint));
    assert!(none
        .problems
        .contains(&GraphProblem::Unreachable("x".into())));
    let reserved = StateGraph::<Doc>::new("r")
        .add_node("a:b", logger("x"))
        .add_edge(START, "a:b")
        .add_edge("a:b", END)
        .compile()
        .unwrap_err();
    assert!(reserved
        .problems
        .contains(&GraphProblem::InvalidName("a:b".into())));
}

#[tokio::test]
async fn chain_and_conditional_edges() {
    let g = StateGraph::<Doc>::new("cond")
        .add_node("start", |_s, _c| async {
            Ok(DocUpdate::new().count(1).log(vec!["start".into()]))
        })
        .add_node("loop", |_s, _c| async {
            Ok(DocUpdate::new().count(1).log(vec!["loop".into()]))
        })
        .add_node("done", logger("done"))
        .add_edge(START, "start")
        .add_edge("start", "loop")
        .add_conditional_edges_map(
            "loop",
            |s: &Doc| if s.count < 4 { "again" } else { "finish" },
            [("again", "loop"), ("finish", "done")],
        )
        .add_edge("done", END)
        .compile()
        .unwrap();
    assert!(g.to_mermaid().contains("loop -. again .-> loop"));
    let out = runtime()
        .await
        .load(g)
        .await
        .unwrap()
        .invoke(input(DocUpdate::new()), RunConfig::default())
        .await
        .unwrap();
    assert_eq!(out.state.log, vec!["start", "loop", "loop", "loop", "done"]);
    assert_eq!(out.status, RunStatus::Done);
}

#[tokio::test]
async fn router_returning_an_undeclared_target_is_a_typed_error() {
    let g = StateGraph::<Doc>::new("badroute")
        .add_node("a", logger("a"))
        .add_node("b", logger("b"))
        .add_edge(START, "a")
        .add_conditional_edges("a", |_s: &Doc| "c", ["b", END])
        .add_edge("b", END)
        .compile()
        .unwrap();
    let err = runtime()
        .await
        .load(g)
        .await
        .unwrap()
        .invoke(input(DocUpdate::new()), RunConfig::default())
        .await
        .unwrap_err();
    assert!(matches!(err, RunError::Step(_)), "{err}");
    assert!(err.to_string().contains("`c`"));
}

#[tokio::test]
async fn join_waits_for_every_source_across_steps() {
    let g = StateGraph::<Doc>::new("join")
        .add_node("fast", logger("fast"))
        .add_node("slow1", logger("slow1"))
        .add_node("slow2", logger("slow2"))
        .add_node("join", logger("join"))
        .add_edge(START, "fast")
        .add_edge(START, "slow1")
        .add_edge("slow1", "slow2")
        .add_join(["fast", "slow2"], "join")
        .add_edge("join", END)
        .compile()
        .unwrap();
    let out = runtime()
        .await
        .load(g)
        .await
        .unwrap()
        .invoke(input(DocUpdate::new()), RunConfig::default())
        .await
        .unwrap();
    assert_eq!(out.state.log, vec!["fast", "slow1", "slow2", "join"]);
    assert_eq!(out.state.log.iter().filter(|l| *l == "join").count(), 1);
}

fn fanout_graph(n: i64, delays: Arc<Vec<u64>>) -> CompiledGraph<Doc> {
    StateGraph::<Doc>::new("fanout")
        .add_node("dispatch", logger("dispatch"))
        .add_node("worker", move |s: Arc<Doc>, _c| {
            let delays = delays.clone();
            async move {
                let d = delays.get(s.item as usize).copied().unwrap_or(0);
                if d > 0 {
                    tokio::time::sleep(Duration::from_micros(d)).await;
                }
                Ok(DocUpdate::new()
                    .log(vec![format!("w{}", s.item)])
                    .count(s.item)
                    .max(s.item))
            }
        })
        .add_node("join", logger("join"))
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

#[tokio::test]
async fn send_fan_out_runs_one_task_per_send_and_joins_once() {
    let g = fanout_graph(100, Arc::new(Vec::new()));
    let out = runtime()
        .await
        .load(g)
        .await
        .unwrap()
        .invoke(input(DocUpdate::new()), RunConfig::default())
        .await
        .unwrap();
    let expected: Vec<String> = std::iter::once("dispatch".to_string())
        .chain((0..100).map(|i| format!("w{i}")))
        .chain(std::iter::once("join".to_string()))
        .collect();
    assert_eq!(out.state.log, expected);
    assert_eq!(out.state.count, (0..100).sum::<i64>());
    assert_eq!(out.state.max, 99);
}

mod merge_order {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]
        /// Whatever order the parallel tasks finish in, the merged state is the same.
        #[test]
        fn parallel_merge_does_not_depend_on_scheduling(delays in proptest::collection::vec(0u64..1500, 12)) {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
            let (a, b) = rt.block_on(async {
                let runtime = Runtime::new().await.unwrap();
                let run = |d: Arc<Vec<u64>>| {
                    let runtime = runtime.clone();
                    async move {
                        runtime.load(fanout_graph(12, d)).await.unwrap()
                            .invoke(RunInput::Update(DocUpdate::new()), RunConfig::default()).await.unwrap()
                    }
                };
                let mut reversed = delays.clone();
                reversed.reverse();
                (run(Arc::new(delays.clone())).await, run(Arc::new(reversed)).await)
            });
            prop_assert_eq!(&a.state.log, &b.state.log);
            prop_assert_eq!(a.state.count, b.state.count);
            let expected: Vec<String> = std::iter::once("dispatch".to_string())
                .chain((0..12).map(|i| format!("w{i}")))
                .chain(std::iter::once("join".to_string()))
                .collect();
            prop_assert_eq!(&a.state.log, &expected);
        }
    }
}

// ---------------------------------------------------------------- commands

#[tokio::test]
async fn command_goto_and_update() {
    let g = StateGraph::<Doc>::new("cmd")
        .add_node_with(
            "router",
            |_s, _c| async {
                Ok(Command::new()
                    .update(DocUpdate::new().status("routed".to_string()))
                    .goto("target"))
            },
            NodeOptions::new().destinations(["target", "other"]),
        )
        .add_node("target", logger("target"))
        .add_node("other", logger("other"))
        .add_edge(START, "router")
        .add_edge("target", END)
        .add_edge("other", END)
        .compile()
        .unwrap();
    let out = runtime()
        .await
        .load(g)
        .await
        .unwrap()
        .invoke(input(DocUpdate::new()), RunConfig::default())
        .await
        .unwrap();
    assert_eq!(out.state.status, "routed");
    assert_eq!(out.state.log, vec!["target"]);
}

// ---------------------------------------------------------------- failures and pending writes

#[tokio::test]
async fn a_failed_step_applies_nothing_and_finished_siblings_do_not_rerun() {
    let ok_runs = Arc::new(AtomicU32::new(0));
    let fail = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let (ok_c, fail_c) = (ok_runs.clone(), fail.clone());
    let g = StateGraph::<Doc>::new("fail")
        .add_node("ok", move |_s, _c| {
            let ok_c = ok_c.clone();
            async move {
                ok_c.fetch_add(1, Ordering::SeqCst);
                Ok(DocUpdate::new().log(vec!["ok".into()]).count(1))
            }
        })
        .add_node("flaky", move |_s, _c| {
            let fail_c = fail_c.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(5)).await;
                if fail_c.load(Ordering::SeqCst) {
                    Err(NodeError::fatal("boom"))
                } else {
                    Ok(DocUpdate::new().log(vec!["flaky".into()]))
                }
            }
        })
        .add_edge(START, "ok")
        .add_edge(START, "flaky")
        .add_edge("ok", END)
        .add_edge("flaky", END)
        .compile()
        .unwrap();
    let saver = Arc::new(MemorySaver::new());
    let runner = runtime()
        .await
        .load(g)
        .await
        .unwrap()
        .with_checkpointer(saver.clone());
    let err = runner
        .invoke(input(log("input")), RunConfig::thread("t1"))
        .await
        .unwrap_err();
    match &err {
        RunError::Node { node, source, .. } => {
            assert_eq!(node, "flaky");
            assert!(source.to_string().contains("boom"));
        }
        other => panic!("unexpected {other}"),
    }
    // Nothing of the failed step is in the checkpoint; the thread's current view (as in
    // LangGraph) shows the finished sibling's pending write applied and only the failed task
    // as next.
    let snap = runner.get_state("t1", None).await.unwrap();
    assert_eq!(snap.values.log, vec!["input", "ok"]);
    assert_eq!(snap.next, vec!["flaky"]);
    let bare = runner
        .get_state("t1", Some(&snap.checkpoint_id))
        .await
        .unwrap();
    assert_eq!(bare.values.log, vec!["input"]);
    assert_eq!(bare.values.count, 0);
    assert_eq!(
        saver.get_thread("t1").await.unwrap().unwrap().status,
        ThreadStatus::Failed
    );
    assert_eq!(ok_runs.load(Ordering::SeqCst), 1);
    // Continue: only the failed task runs again; "ok" is reused from its pending write.
    fail.store(false, Ordering::SeqCst);
    let out = runner
        .invoke(RunInput::Continue, RunConfig::thread("t1"))
        .await
        .unwrap();
    assert_eq!(
        ok_runs.load(Ordering::SeqCst),
        1,
        "finished sibling ran again"
    );
    assert_eq!(out.state.log, vec!["input", "ok", "flaky"]);
    assert_eq!(out.state.count, 1);
}

#[tokio::test]
async fn retry_policy_retries_only_matching_errors_with_backoff() {
    let attempts = Arc::new(AtomicU32::new(0));
    let a = attempts.clone();
    let policy = RetryPolicy::attempts(4)
        .with_backoff(Duration::from_millis(2))
        .retry_on(|e| e.to_string().contains("transient"));
    let g = StateGraph::<Doc>::new("retry")
        .add_node_with(
            "n",
            move |_s, ctx: Ctx| {
                let a = a.clone();
                async move {
                    let k = a.fetch_add(1, Ordering::SeqCst) + 1;
                    assert_eq!(ctx.attempt(), k);
                    if k < 3 {
                        Err(NodeError::failed("transient glitch"))
                    } else {
                        Ok(log("n"))
                    }
                }
            },
            NodeOptions::new().retry(policy.clone()),
        )
        .add_node_with(
            "fatal",
            |_s, _c| async { Err::<DocUpdate, _>(NodeError::failed("permanent")) },
            NodeOptions::new().retry(policy),
        )
        .add_edge(START, "n")
        .add_conditional_edges(
            "n",
            |s: &Doc| if s.status == "go" { "fatal" } else { END },
            ["fatal", END],
        )
        .add_edge("fatal", END)
        .compile()
        .unwrap();
    let runner = runtime().await.load(g).await.unwrap();
    let out = runner
        .invoke(input(DocUpdate::new()), RunConfig::default())
        .await
        .unwrap();
    assert_eq!(attempts.load(Ordering::SeqCst), 3);
    assert_eq!(out.state.log, vec!["n"]);
    attempts.store(0, Ordering::SeqCst);
    let err = runner
        .invoke(
            input(DocUpdate::new().status("go".to_string())),
            RunConfig::default(),
        )
        .await
        .unwrap_err();
    match err {
        RunError::Node { node, attempts, .. } => {
            assert_eq!(node, "fatal");
            assert_eq!(attempts, 1, "a non-matching error is not retried");
        }
        other => panic!("{other}"),
    }
}

#[tokio::test]
async fn step_limit_is_a_typed_error() {
    let g = StateGraph::<Doc>::new("forever")
        .add_node("spin", logger("spin"))
        .add_edge(START, "spin")
        .add_edge("spin", "spin")
        .compile()
        .unwrap();
    let err = runtime()
        .await
        .load(g)
        .await
        .unwrap()
        .invoke(input(DocUpdate::new()), RunConfig::default().max_steps(7))
        .await
        .unwrap_err();
    assert!(matches!(err, RunError::StepLimit { limit: 7 }), "{err}");
}

#[tokio::test]
async fn node_timeout_kills_the_agent_and_the_run_timeout_stops_the_run() {
    let g = StateGraph::<Doc>::new("slow")
        .add_node_with(
            "slow",
            |_s, _c| async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                Ok(log("slow"))
            },
            NodeOptions::new().timeout(Duration::from_millis(50)),
        )
        .add_edge(START, "slow")
        .add_edge("slow", END)
        .compile()
        .unwrap();
    let rt = runtime().await;
    let started = std::time::Instant::now();
    let err = rt
        .load(g)
        .await
        .unwrap()
        .invoke(input(DocUpdate::new()), RunConfig::default())
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5));
    match err {
        RunError::Node { source, .. } => assert!(matches!(source, NodeError::Timeout(_))),
        other => panic!("{other}"),
    }

    let g = StateGraph::<Doc>::new("loopy")
        .add_node("tick", |_s, _c| async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok(DocUpdate::new().count(1))
        })
        .add_edge(START, "tick")
        .add_edge("tick", "tick")
        .compile()
        .unwrap();
    let saver = Arc::new(MemorySaver::new());
    let runner = rt.load(g).await.unwrap().with_checkpointer(saver);
    let err = runner
        .invoke(
            input(DocUpdate::new()),
            RunConfig::thread("slowrun")
                .max_steps(10_000)
                .timeout(Duration::from_millis(150)),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, RunError::Timeout(_)), "{err}");
    // The last superstep boundary was saved.
    let snap = runner.get_state("slowrun", None).await.unwrap();
    assert!(snap.values.count >= 2, "{}", snap.values.count);
}

#[tokio::test]
async fn a_cancel_handle_stops_the_run_and_keeps_the_last_boundary() {
    let rt = Runtime::new().await.unwrap();
    // A loop whose steps wait (inline: one task per step), and a step of two tasks that never
    // finish (on agents).
    for parallel in [false, true] {
        let mut g = StateGraph::<Doc>::new("cancellable")
            .add_node("tick", |s: Arc<Doc>, _c| async move {
                if s.count >= 3 {
                    std::future::pending::<()>().await;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                Ok(DocUpdate::new().count(1))
            })
            .add_edge(START, "tick");
        if parallel {
            g = g
                .add_node("stuck", |_s, _c| async {
                    std::future::pending::<()>().await;
                    Ok(DocUpdate::new())
                })
                .add_edge(START, "stuck")
                .add_edge("tick", END)
                .add_edge("stuck", END);
        } else {
            g = g.add_edge("tick", "tick");
        }
        let runner = rt
            .load(g.compile().unwrap())
            .await
            .unwrap()
            .with_checkpointer(Arc::new(MemorySaver::new()));
        let cancel = CancelHandle::new();
        let c = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            c.cancel();
        });
        let thread = format!("cancel-{parallel}");
        let started = std::time::Instant::now();
        let err = runner
            .invoke(
                input(DocUpdate::new()),
                RunConfig::thread(&thread)
                    .max_steps(1000)
                    .cancel(cancel.clone()),
            )
            .await
            .unwrap_err();
        assert!(matches!(err, RunError::Cancelled), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
        let snap = runner.get_state(&thread, None).await.unwrap();
        if parallel {
            // The step did not finish (the finished sibling's write shows as pending).
            assert!(snap.values.count <= 1, "{}", snap.values.count);
            assert!(snap.next.contains(&"stuck".to_string()), "{:?}", snap.next);
        } else {
            assert_eq!(
                snap.values.count, 3,
                "the boundary before the stuck step is kept"
            );
        }
        // A cancelled handle stops a later run before its first step.
        let err = runner
            .invoke(
                input(DocUpdate::new()),
                RunConfig::thread("again").cancel(cancel),
            )
            .await
            .unwrap_err();
        assert!(matches!(err, RunError::Cancelled), "{err}");
    }
}

#[tokio::test]
async fn a_panicking_agent_is_restarted_and_the_run_goes_on() {
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let g = StateGraph::<Doc>::new("panicky")
        .add_node_with(
            "p",
            move |_s, _c| {
                let c = c.clone();
                async move {
                    if c.fetch_add(1, Ordering::SeqCst) == 0 {
                        panic!("injected panic");
                    }
                    Ok(log("recovered"))
                }
            },
            NodeOptions::new()
                .retry(RetryPolicy::attempts(2).with_backoff(Duration::from_millis(1))),
        )
        // A sibling, so that `p` runs on an agent (a step's only task runs on its coordinator).
        .add_node("q", logger("q"))
        .add_edge(START, "p")
        .add_edge(START, "q")
        .add_edge("p", END)
        .add_edge("q", END)
        .compile()
        .unwrap();
    let runner = runtime().await.load(g).await.unwrap();
    let out = runner
        .invoke(input(DocUpdate::new()), RunConfig::default())
        .await
        .unwrap();
    let mut log = out.state.log.clone();
    log.sort();
    assert_eq!(log, vec!["q", "recovered"]);
    // The supervisor restarted the failed agent.
    for _ in 0..100 {
        if runner.agent_restarts() >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(runner.agent_restarts(), 1);
}

#[tokio::test]
async fn a_step_with_one_task_runs_it_on_the_coordinator() {
    // A chain never needs an agent: each step's only task runs on the run's coordinator.
    let g = StateGraph::<Doc>::new("chain3")
        .add_node("a", logger("a"))
        .add_node("b", logger("b"))
        .add_node("c", logger("c"))
        .add_edge(START, "a")
        .add_edge("a", "b")
        .add_edge("b", "c")
        .add_edge("c", END)
        .compile()
        .unwrap();
    let runner = runtime().await.load(g).await.unwrap();
    let out = runner
        .invoke(input(DocUpdate::new()), RunConfig::default())
        .await
        .unwrap();
    assert_eq!(out.state.log, vec!["a", "b", "c"]);
    assert_eq!(runner.agent_count(), 0);

    // Two tasks in one step go to agents, so that they run in parallel.
    let g = StateGraph::<Doc>::new("pair")
        .add_node("a", logger("a"))
        .add_node("b", logger("b"))
        .add_edge(START, "a")
        .add_edge(START, "b")
        .add_edge("a", END)
        .add_edge("b", END)
        .compile()
        .unwrap();
    let runner = runtime().await.load(g).await.unwrap();
    runner
        .invoke(input(DocUpdate::new()), RunConfig::default())
        .await
        .unwrap();
    assert_eq!(runner.agent_count(), 2);
}

#[tokio::test]
async fn a_panic_on_the_coordinator_is_caught_and_retried() {
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let g = StateGraph::<Doc>::new("panicky-inline")
        .add_node_with(
            "p",
            move |_s, _c| {
                // Panics before it returns its future, on the first attempt.
                if c.fetch_add(1, Ordering::SeqCst) == 0 {
                    panic!("injected panic");
                }
                futures_ready::ready(log("recovered"))
            },
            NodeOptions::new()
                .retry(RetryPolicy::attempts(2).with_backoff(Duration::from_millis(1))),
        )
        .add_edge(START, "p")
        .add_edge("p", END)
        .compile()
        .unwrap();
    let runner = runtime().await.load(g).await.unwrap();
    let out = runner
        .invoke(input(DocUpdate::new()), RunConfig::default())
        .await
        .unwrap();
    assert_eq!(out.state.log, vec!["recovered"]);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    // No agent was involved, so none was restarted.
    assert_eq!(runner.agent_restarts(), 0);
}

#[tokio::test]
async fn a_loop_of_nodes_that_never_wait_stops_at_the_run_timeout() {
    // Every step runs on the coordinator and no node ever waits: the run's timer message is
    // never read from the mailbox, so the step boundary must check the deadline itself.
    let g = StateGraph::<Doc>::new("spin")
        .add_node("tick", |_s, _c| {
            futures_ready::ready(DocUpdate::new().count(1))
        })
        .add_edge(START, "tick")
        .add_edge("tick", "tick")
        .compile()
        .unwrap();
    let runner = runtime().await.load(g).await.unwrap();
    // Meanwhile other tasks on the runtime (this test's runtime has one thread) still get to
    // run: the ticker counts while the loop spins.
    let ticks = Arc::new(AtomicU32::new(0));
    let t = ticks.clone();
    let ticker = tokio::spawn(async move {
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_millis(5)).await;
            t.fetch_add(1, Ordering::SeqCst);
        }
    });
    let started = std::time::Instant::now();
    let err = runner
        .invoke(
            input(DocUpdate::new()),
            RunConfig::default()
                .max_steps(u64::MAX)
                .timeout(Duration::from_millis(200)),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, RunError::Timeout(_)), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // 200 ms of spinning leave room for all 10 ticks; a loop that never yielded would leave 0.
    let during = ticks.load(Ordering::SeqCst);
    assert!(
        during >= 3,
        "the ticker ran {during} times while the loop spun"
    );
    ticker.await.unwrap();
}

#[tokio::test]
async fn panics_beyond_the_restart_limit_escalate() {
    let g = StateGraph::<Doc>::new("doomed")
        .add_node("p", |_s, _c| async {
            if true {
                panic!("always");
            }
            Ok(log("never"))
        })
        .add_edge(START, "p")
        .add_edge("p", END)
        .compile()
        .unwrap();
    let rt = Runtime::with_config(RuntimeConfig {
        restart_intensity: ferrograph::runtime::RestartIntensity {
            max_restarts: 2,
            within: Duration::from_secs(60),
        },
        ..RuntimeConfig::default()
    })
    .await
    .unwrap();
    let runner = rt.load(g).await.unwrap();
    let mut escalated = false;
    for _ in 0..10 {
        match runner
            .invoke(input(DocUpdate::new()), RunConfig::default())
            .await
        {
            Err(RunError::Escalated { node, .. }) => {
                assert_eq!(node, "p");
                escalated = true;
                break;
            }
            Err(RunError::Node { source, .. }) => {
                assert!(matches!(source, NodeError::Panicked(_)), "{source}");
            }
            other => panic!("unexpected {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(escalated, "the supervisor never escalated");
}

// ---------------------------------------------------------------- interrupts

fn approval_graph() -> CompiledGraph<Doc> {
    StateGraph::<Doc>::new("approval")
        .add_node("draft", logger("draft"))
        .add_node("review", |s: Arc<Doc>, ctx: Ctx| async move {
            let answer: String =
                ctx.interrupt(serde_json::json!({ "question": "ok?", "draft": s.log }))?;
            Ok(DocUpdate::new()
                .answers(vec![answer])
                .log(vec!["review".into()]))
        })
        .add_node("publish", logger("publish"))
        .add_edge(START, "draft")
        .add_edge("draft", "review")
        .add_edge("review", "publish")
        .add_edge("publish", END)
        .compile()
        .unwrap()
}

#[tokio::test]
async fn interrupt_stops_and_resume_reenters_the_node_with_the_value() {
    let saver = Arc::new(MemorySaver::new());
    let runner = runtime()
        .await
        .load(approval_graph())
        .await
        .unwrap()
        .with_checkpointer(saver.clone());
    let out = runner
        .invoke(input(DocUpdate::new()), RunConfig::thread("h1"))
        .await
        .unwrap();
    assert_eq!(out.status, RunStatus::Interrupted);
    assert_eq!(out.interrupts.len(), 1);
    assert_eq!(out.interrupts[0].value.0["question"], "ok?");
    assert_eq!(out.next, vec!["review"]);
    let info = saver.get_thread("h1").await.unwrap().unwrap();
    assert_eq!(info.status, ThreadStatus::Interrupted);
    assert_eq!(info.interrupts.len(), 1);
    let snap = runner.get_state("h1", None).await.unwrap();
    assert_eq!(snap.interrupts.len(), 1);

    // A wrongly typed resume value is a typed error, and nothing is lost.
    let bad = runner
        .invoke(
            RunInput::resume(serde_json::json!({"no": 1})),
            RunConfig::thread("h1"),
        )
        .await
        .unwrap_err();
    match bad {
        RunError::Node { source, .. } => assert!(matches!(source, NodeError::BadResume { .. })),
        other => panic!("{other}"),
    }
    // The thread still waits for an answer, with its interrupt listed.
    let info = saver.get_thread("h1").await.unwrap().unwrap();
    assert_eq!(info.status, ThreadStatus::Interrupted);
    assert_eq!(info.interrupts.len(), 1);
    assert!(info.error.unwrap().contains("resume value"));
    let out = runner
        .invoke(
            RunInput::resume(serde_json::json!("approved")),
            RunConfig::thread("h1"),
        )
        .await
        .unwrap();
    assert_eq!(out.status, RunStatus::Done);
    assert_eq!(out.state.answers, vec!["approved"]);
    assert_eq!(out.state.log, vec!["draft", "review", "publish"]);
    assert_eq!(
        saver.get_thread("h1").await.unwrap().unwrap().status,
        ThreadStatus::Done
    );
    // Nothing left to resume.
    let err = runner
        .invoke(
            RunInput::resume(serde_json::json!("again")),
            RunConfig::thread("h1"),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, RunError::NoPendingInterrupt(_)), "{err}");
    // A refused resume does not touch the thread's record.
    assert_eq!(
        saver.get_thread("h1").await.unwrap().unwrap().status,
        ThreadStatus::Done
    );
}

#[tokio::test]
async fn parallel_interrupts_are_resumed_by_id() {
    let g = StateGraph::<Doc>::new("two")
        .add_node("left", |_s, ctx: Ctx| async move {
            let v: String = ctx.interrupt("left?")?;
            Ok(DocUpdate::new().answers(vec![format!("L:{v}")]))
        })
        .add_node("right", |_s, ctx: Ctx| async move {
            let v: String = ctx.interrupt("right?")?;
            Ok(DocUpdate::new().answers(vec![format!("R:{v}")]))
        })
        .add_edge(START, "left")
        .add_edge(START, "right")
        .add_edge("left", END)
        .add_edge("right", END)
        .compile()
        .unwrap();
    let runner = runtime()
        .await
        .load(g)
        .await
        .unwrap()
        .with_checkpointer(Arc::new(MemorySaver::new()));
    let out = runner
        .invoke(input(DocUpdate::new()), RunConfig::thread("p"))
        .await
        .unwrap();
    assert_eq!(out.interrupts.len(), 2);
    let left = out
        .interrupts
        .iter()
        .find(|i| i.node == "left")
        .unwrap()
        .id
        .clone();
    let right = out
        .interrupts
        .iter()
        .find(|i| i.node == "right")
        .unwrap()
        .id
        .clone();
    let err = runner
        .invoke(
            RunInput::resume(serde_json::json!("x")),
            RunConfig::thread("p"),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, RunError::AmbiguousResume { .. }), "{err}");
    let err = runner
        .invoke(
            RunInput::Resume(Resume::by_id([("nope", serde_json::json!(1))])),
            RunConfig::thread("p"),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, RunError::UnknownInterrupt { .. }), "{err}");
    // Answer only the left one: the right one interrupts again.
    let out = runner
        .invoke(
            RunInput::Resume(Resume::by_id([(left.clone(), serde_json::json!("a"))])),
            RunConfig::thread("p"),
        )
        .await
        .unwrap();
    assert_eq!(out.status, RunStatus::Interrupted);
    assert_eq!(out.interrupts.len(), 1);
    assert_eq!(out.interrupts[0].id, right);
    let out = runner
        .invoke(
            RunInput::Resume(Resume::by_id([(right, serde_json::json!("b"))])),
            RunConfig::thread("p"),
        )
        .await
        .unwrap();
    assert_eq!(out.status, RunStatus::Done);
    assert_eq!(out.state.answers, vec!["L:a", "R:b"]);
}

#[tokio::test]
async fn several_interrupts_in_one_node_are_answered_in_order() {
    let g = StateGraph::<Doc>::new("quiz")
        .add_node("quiz", |_s, ctx: Ctx| async move {
            let a: String = ctx.interrupt("q1")?;
            let b: String = ctx.interrupt("q2")?;
            Ok(DocUpdate::new().answers(vec![a, b]))
        })
        .add_edge(START, "quiz")
        .add_edge("quiz", END)
        .compile()
        .unwrap();
    let runner = runtime()
        .await
        .load(g)
        .await
        .unwrap()
        .with_checkpointer(Arc::new(MemorySaver::new()));
    let cfg = || RunConfig::thread("q");
    let out = runner.invoke(input(DocUpdate::new()), cfg()).await.unwrap();
    assert_eq!(out.interrupts[0].value.0, "q1");
    let out = runner
        .invoke(RunInput::resume("one".into()), cfg())
        .await
        .unwrap();
    assert_eq!(out.interrupts[0].value.0, "q2");
    let out = runner
        .invoke(RunInput::resume("two".into()), cfg())
        .await
        .unwrap();
    assert_eq!(out.state.answers, vec!["one", "two"]);
}

#[tokio::test]
async fn static_interrupts_before_and_after() {
    let g = StateGraph::<Doc>::new("static")
        .add_node("a", logger("a"))
        .add_node("b", logger("b"))
        .add_node("c", logger("c"))
        .add_edge(START, "a")
        .add_edge("a", "b")
        .add_edge("b", "c")
        .add_edge("c", END)
        .interrupt_before(["b"])
        .interrupt_after(["c"])
        .compile()
        .unwrap();
    let runner = runtime()
        .await
        .load(g)
        .await
        .unwrap()
        .with_checkpointer(Arc::new(MemorySaver::new()));
    let out = runner
        .invoke(input(DocUpdate::new()), RunConfig::thread("s"))
        .await
        .unwrap();
    assert_eq!(out.status, RunStatus::Interrupted);
    assert_eq!(out.state.log, vec!["a"]);
    assert!(out.interrupts[0].static_);
    assert_eq!(out.next, vec!["b"]);
    let out = runner
        .invoke(RunInput::Continue, RunConfig::thread("s"))
        .await
        .unwrap();
    assert_eq!(out.status, RunStatus::Interrupted);
    assert_eq!(out.state.log, vec!["a", "b", "c"]);
    assert_eq!(out.interrupts[0].node, "c");
    let out = runner
        .invoke(
            RunInput::resume(serde_json::Value::Null),
            RunConfig::thread("s"),
        )
        .await
        .unwrap();
    assert_eq!(out.status, RunStatus::Done);
    assert_eq!(out.state.log, vec!["a", "b", "c"]);
}

// ---------------------------------------------------------------- subgraphs

fn child_graph() -> CompiledGraph<Doc> {
    StateGraph::<Doc>::new("child")
        .add_node("c1", |s: Arc<Doc>, _c| async move {
            Ok(DocUpdate::new()
                .log(vec![format!("c1:{}", s.item)])
                .count(1))
        })
        .add_node("ask", |s: Arc<Doc>, ctx: Ctx| async move {
            let v: String = ctx.interrupt(format!("question {}", s.item))?;
            Ok(DocUpdate::new().answers(vec![format!("{}={v}", s.item)]))
        })
        .add_edge(START, "c1")
        .add_edge("c1", "ask")
        .add_edge("ask", END)
        .compile()
        .unwrap()
}

#[tokio::test]
async fn subgraph_shares_keys_and_its_interrupt_resumes_inside_it() {
    let g = StateGraph::<Doc>::new("parent")
        .add_node("before", logger("before"))
        .add_subgraph("sub", child_graph())
        .add_node("after", logger("after"))
        .add_edge(START, "before")
        .add_edge("before", "sub")
        .add_edge("sub", "after")
        .add_edge("after", END)
        .compile()
        .unwrap();
    let runner = runtime()
        .await
        .load(g)
        .await
        .unwrap()
        .with_checkpointer(Arc::new(MemorySaver::new()));
    let out = runner
        .invoke(input(DocUpdate::new().item(7)), RunConfig::thread("sg"))
        .await
        .unwrap();
    assert_eq!(out.status, RunStatus::Interrupted);
    assert_eq!(out.interrupts.len(), 1);
    assert_eq!(out.interrupts[0].node, "sub/ask");
    assert_eq!(out.interrupts[0].value.0, "question 7");
    // The subgraph's first node's write is not in the parent yet (the node has not finished).
    assert_eq!(out.state.log, vec!["before"]);
    let out = runner
        .invoke(RunInput::resume("yes".into()), RunConfig::thread("sg"))
        .await
        .unwrap();
    assert_eq!(out.status, RunStatus::Done);
    assert_eq!(
        out.state.log,
        vec!["before", "c1:7", "after"],
        "c1 must not run twice"
    );
    assert_eq!(out.state.count, 1);
    assert_eq!(out.state.answers, vec!["7=yes"]);
}

#[tokio::test]
async fn fanned_out_subgraphs_interrupt_and_resume_independently() {
    let g = StateGraph::<Doc>::new("fan-sub")
        .add_node("dispatch", logger("dispatch"))
        .add_subgraph("sub", child_graph())
        .add_node("join", logger("join"))
        .add_edge(START, "dispatch")
        .add_conditional_edges(
            "dispatch",
            |s: &Doc| {
                (1..=3)
                    .map(|i| {
                        SendTo::new(
                            "sub",
                            Doc {
                                item: i,
                                ..s.clone()
                            },
                        )
                    })
                    .collect::<Vec<_>>()
            },
            ["sub"],
        )
        .add_edge("sub", "join")
        .add_edge("join", END)
        .compile()
        .unwrap();
    let runner = runtime()
        .await
        .load(g)
        .await
        .unwrap()
        .with_checkpointer(Arc::new(MemorySaver::new()));
    let out = runner
        .invoke(input(DocUpdate::new()), RunConfig::thread("fs"))
        .await
        .unwrap();
    assert_eq!(out.interrupts.len(), 3);
    let answers: BTreeMap<String, serde_json::Value> = out
        .interrupts
        .iter()
        .map(|i| {
            (
                i.id.clone(),
                serde_json::json!(format!("a{}", &i.value.0.as_str().unwrap()[9..])),
            )
        })
        .collect();
    let out = runner
        .invoke(
            RunInput::Resume(Resume::by_id(answers)),
            RunConfig::thread("fs"),
        )
        .await
        .unwrap();
    assert_eq!(out.status, RunStatus::Done, "{:?}", out.interrupts);
    assert_eq!(out.state.answers, vec!["1=a1", "2=a2", "3=a3"]);
    assert_eq!(out.state.count, 3);
    assert_eq!(out.state.log.last().map(String::as_str), Some("join"));
}

#[tokio::test]
async fn a_subgraph_node_can_command_its_parent() {
    let child = StateGraph::<Doc>::new("escalating-child")
        .add_node_with(
            "decide",
            |_s, _c| async {
                Ok(Command::new()
                    .update(DocUpdate::new().status("escalated".to_string()))
                    .goto("manager")
                    .to_parent())
            },
            NodeOptions::new().destinations([END]),
        )
        .add_edge(START, "decide")
        .compile()
        .unwrap();
    let g = StateGraph::<Doc>::new("parent-cmd")
        .add_subgraph_with("team", child, NodeOptions::new().destinations(["manager"]))
        .add_node("manager", logger("manager"))
        .add_edge(START, "team")
        .add_edge("manager", END)
        .compile()
        .unwrap();
    let out = runtime()
        .await
        .load(g)
        .await
        .unwrap()
        .invoke(input(DocUpdate::new()), RunConfig::default())
        .await
        .unwrap();
    assert_eq!(out.state.status, "escalated");
    assert_eq!(out.state.log, vec!["manager"]);
}

// ---------------------------------------------------------------- streaming

#[tokio::test]
async fn streams_values_updates_custom_tasks_and_tokens_with_namespaces() {
    let inner = StateGraph::<Doc>::new("inner")
        .add_node("speak", |_s, ctx: Ctx| async move {
            ctx.emit(ferrograph::core::stream::NodeEventKind::Token {
                model: "scripted".into(),
                text: "hel".into(),
            })
            .await;
            ctx.emit_custom(&serde_json::json!({"progress": 50}))
                .await?;
            Ok(log("speak"))
        })
        .add_edge(START, "speak")
        .add_edge("speak", END)
        .compile()
        .unwrap();
    let g = StateGraph::<Doc>::new("outer")
        .add_node("first", logger("first"))
        .add_subgraph("inner", inner)
        .add_edge(START, "first")
        .add_edge("first", "inner")
        .add_edge("inner", END)
        .compile()
        .unwrap();
    let runner = runtime().await.load(g).await.unwrap();
    let modes = StreamModes::NONE
        .with(StreamMode::Values)
        .with(StreamMode::Updates)
        .with(StreamMode::Custom)
        .with(StreamMode::Tasks)
        .with(StreamMode::Tokens);
    let mut stream = runner
        .stream(input(DocUpdate::new()), RunConfig::default().stream(modes))
        .await
        .unwrap();
    let mut kinds = Vec::new();
    let mut namespaces = Vec::new();
    let mut values = 0;
    while let Some(ev) = stream.next_event().await {
        kinds.push(ev.kind());
        namespaces.push(ev.namespace().to_string());
        match &ev {
            StreamEvent::Custom { payload, .. } => assert_eq!(payload.0["progress"], 50),
            StreamEvent::Token { text, .. } => assert_eq!(text, "hel"),
            StreamEvent::Values { .. } => values += 1,
            _ => {}
        }
    }
    let out = stream.outcome().await.unwrap();
    assert_eq!(out.state.log, vec!["first", "speak"]);
    for k in [
        "values",
        "updates",
        "custom",
        "token",
        "task_start",
        "task_end",
    ] {
        assert!(kinds.contains(&k), "missing {k} in {kinds:?}");
    }
    assert!(
        namespaces.iter().any(|n| n.starts_with("inner:")),
        "{namespaces:?}"
    );
    assert!(namespaces.iter().any(|n| n.is_empty()));
    assert!(values >= 2);
    // Only requested modes are produced.
    let mut stream = runner
        .stream(
            input(DocUpdate::new()),
            RunConfig::default().stream(StreamMode::Values),
        )
        .await
        .unwrap();
    while let Some(ev) = stream.next_event().await {
        assert_eq!(ev.kind(), "values");
    }
}

// ---------------------------------------------------------------- checkpoints and time travel

#[tokio::test]
async fn state_history_update_state_replay_and_fork() {
    let g = StateGraph::<Doc>::new("tt")
        .add_node("a", |_s, _c| async {
            Ok(DocUpdate::new().count(1).log(vec!["a".into()]))
        })
        .add_node("b", |_s, _c| async {
            Ok(DocUpdate::new().count(10).log(vec!["b".into()]))
        })
        .add_edge(START, "a")
        .add_edge("a", "b")
        .add_edge("b", END)
        .compile()
        .unwrap();
    let saver = Arc::new(MemorySaver::new());
    let runner = runtime()
        .await
        .load(g)
        .await
        .unwrap()
        .with_checkpointer(saver.clone());
    let out = runner
        .invoke(input(log("in")), RunConfig::thread("tt"))
        .await
        .unwrap();
    assert_eq!(out.state.count, 11);
    let history = runner.get_state_history("tt").await.unwrap();
    assert_eq!(history.len(), 3, "input, a, b");
    assert_eq!(history[0].values.count, 11);
    assert_eq!(history[1].values.count, 1);
    assert_eq!(history[1].next, vec!["b"]);
    assert_eq!(history[1].writers, vec!["a"]);
    assert_eq!(history[2].values.log, vec!["in"]);
    assert_eq!(
        history[1].parent_id.as_deref(),
        Some(history[2].checkpoint_id.as_str())
    );

    // Replay from after `a`: b runs again on a new branch.
    let after_a = history[1].checkpoint_id.clone();
    let out = runner
        .invoke(
            RunInput::Continue,
            RunConfig::thread("tt").at_checkpoint(after_a.clone()),
        )
        .await
        .unwrap();
    assert_eq!(out.state.count, 11);
    let newest = runner.get_state("tt", None).await.unwrap();
    assert_eq!(newest.parent_id.as_deref(), Some(after_a.as_str()));

    // Edit the state as if `a` wrote it: `b` is planned next.
    let cp = runner
        .update_state("tt", DocUpdate::new().count(100), Some("a"))
        .await
        .unwrap();
    let snap = runner.get_state("tt", None).await.unwrap();
    assert_eq!(snap.checkpoint_id, cp);
    assert_eq!(snap.values.count, 111);
    assert_eq!(snap.next, vec!["b"]);
    let out = runner
        .invoke(RunInput::Continue, RunConfig::thread("tt"))
        .await
        .unwrap();
    assert_eq!(out.state.count, 121);
    let err = runner
        .update_state("tt", DocUpdate::new(), Some("ghost"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("ghost"));

    // Fork the thread at `after_a` into a new one.
    runner.fork("tt", &after_a, "tt-fork").await.unwrap();
    let forked = runner.get_state("tt-fork", None).await.unwrap();
    assert_eq!(forked.values.count, 1);
    let out = runner
        .invoke(RunInput::Continue, RunConfig::thread("tt-fork"))
        .await
        .unwrap();
    assert_eq!(out.state.count, 11);
    assert!(matches!(
        runner.get_state("nobody", None).await.unwrap_err(),
        RunError::ThreadNotFound(_)
    ));

    // Prune to the newest two checkpoints: the state is intact and loadable.
    let before = runner.get_state("tt", None).await.unwrap();
    let removed = runner.prune("tt", 2).await.unwrap();
    assert!(removed >= 3, "{removed}");
    let history = runner.get_state_history("tt").await.unwrap();
    assert_eq!(history.len(), 2);
    assert_eq!(history[0].values.count, before.values.count);
    assert_eq!(
        runner.get_state("tt", None).await.unwrap().values.log,
        before.values.log
    );
}

#[tokio::test]
async fn a_second_run_on_a_busy_thread_is_rejected() {
    let g = StateGraph::<Doc>::new("busy")
        .add_node("wait", |_s, _c| async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok(log("wait"))
        })
        .add_edge(START, "wait")
        .add_edge("wait", END)
        .compile()
        .unwrap();
    let runner = runtime()
        .await
        .load(g)
        .await
        .unwrap()
        .with_checkpointer(Arc::new(MemorySaver::new()));
    let r2 = runner.clone();
    let first = tokio::spawn(async move {
        r2.invoke(RunInput::Update(DocUpdate::new()), RunConfig::thread("b"))
            .await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let err = runner
        .invoke(input(DocUpdate::new()), RunConfig::thread("b"))
        .await
        .unwrap_err();
    assert!(matches!(err, RunError::ThreadBusy(_)), "{err}");
    assert!(first.await.unwrap().is_ok());
}

#[tokio::test]
async fn messages_rule_through_a_chat_loop() {
    let g = StateGraph::<Doc>::new("chat")
        .add_node("bot", |s: Arc<Doc>, _c| async move {
            let last = s
                .messages
                .last()
                .map(|m| m.content.clone())
                .unwrap_or_default();
            Ok(DocUpdate::new().messages(Message::ai(format!("echo {last}"))))
        })
        .add_edge(START, "bot")
        .add_edge("bot", END)
        .compile()
        .unwrap();
    let saver = Arc::new(MemorySaver::new());
    let runner = runtime()
        .await
        .load(g)
        .await
        .unwrap()
        .with_checkpointer(saver);
    for i in 0..5 {
        runner
            .invoke(
                input(DocUpdate::new().messages(Message::human(format!("m{i}")))),
                RunConfig::thread("chat"),
            )
            .await
            .unwrap();
    }
    let s = runner.get_state("chat", None).await.unwrap();
    assert_eq!(s.values.messages.len(), 10);
    assert_eq!(s.values.messages[9].content, "echo m4");
}

// ---------------------------------------------------------------- load and shutdown

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_concurrent_threads() {
    let g = StateGraph::<Doc>::new("many")
        .add_node("a", |_s, _c| async {
            tokio::task::yield_now().await;
            Ok(DocUpdate::new().count(1))
        })
        .add_node("b", |_s, _c| async { Ok(DocUpdate::new().count(1)) })
        .add_edge(START, "a")
        .add_edge("a", "b")
        .add_edge("b", END)
        .compile()
        .unwrap();
    let rt = Runtime::with_config(RuntimeConfig {
        max_concurrent_runs: 512,
        ..RuntimeConfig::default()
    })
    .await
    .unwrap();
    let saver = Arc::new(MemorySaver::new());
    let runner = rt.load(g).await.unwrap().with_checkpointer(saver.clone());
    let mut handles = Vec::new();
    for i in 0..3000 {
        let r = runner.clone();
        handles.push(tokio::spawn(async move {
            r.invoke(
                RunInput::Update(DocUpdate::new().count(i)),
                RunConfig::thread(format!("t{i}")),
            )
            .await
        }));
    }
    for (i, h) in handles.into_iter().enumerate() {
        let out = h.await.unwrap().unwrap();
        assert_eq!(out.state.count, i as i64 + 2);
    }
    let done = saver.list_threads(Some(ThreadStatus::Done)).await.unwrap();
    assert_eq!(done.len(), 3000);
    assert_eq!(rt.active_runs(), 0);
    // Agents are pooled, not one per run.
    assert!(runner.agent_count() <= 2 * 256, "{}", runner.agent_count());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_drain_stops_at_a_superstep_boundary_with_the_checkpoint_saved() {
    let steps = Arc::new(AtomicUsize::new(0));
    let s2 = steps.clone();
    let g = StateGraph::<Doc>::new("drain")
        .add_node("tick", move |_s, _c| {
            let s2 = s2.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(30)).await;
                s2.fetch_add(1, Ordering::SeqCst);
                Ok(DocUpdate::new().count(1))
            }
        })
        .add_edge(START, "tick")
        .add_conditional_edges(
            "tick",
            |s: &Doc| if s.count < 1000 { "tick" } else { END },
            ["tick", END],
        )
        .compile()
        .unwrap();
    let rt = runtime().await;
    let saver = Arc::new(MemorySaver::new());
    let runner = rt.load(g).await.unwrap().with_checkpointer(saver.clone());
    let r2 = runner.clone();
    let run = tokio::spawn(async move {
        r2.invoke(
            RunInput::Update(DocUpdate::new()),
            RunConfig::thread("d").max_steps(100_000),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(rt.shutdown(Duration::from_secs(5)).await, "drain timed out");
    let out = run.await.unwrap().unwrap();
    assert_eq!(out.status, RunStatus::Drained);
    let saved = runner.get_state("d", None).await.unwrap();
    assert_eq!(saved.values.count as usize, steps.load(Ordering::SeqCst));
    assert_eq!(saved.values.count, out.state.count);
    let err = runner
        .invoke(input(DocUpdate::new()), RunConfig::thread("other"))
        .await
        .unwrap_err();
    assert!(matches!(err, RunError::ShuttingDown));
}

// ---------------------------------------------------------------- the JSON surface

#[tokio::test]
async fn json_workflow_runs_streams_resumes_and_rejects_bad_input() {
    use ferrograph::runtime::{JsonInput, Workflow};
    let runner = runtime()
        .await
        .load(approval_graph())
        .await
        .unwrap()
        .with_checkpointer(Arc::new(MemorySaver::new()));
    let wf: Arc<dyn Workflow> = Arc::new(runner);
    assert_eq!(wf.info().nodes, vec!["draft", "review", "publish"]);
    let err = wf
        .invoke(
            JsonInput::Update(serde_json::json!({"count": "not a number"})),
            RunConfig::thread("j"),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, RunError::InvalidInput(_)), "{err}");
    let mut run = wf
        .start(
            JsonInput::Update(serde_json::json!({"count": 5})),
            RunConfig::thread("j").stream(StreamModes::all()),
        )
        .await
        .unwrap();
    let mut kinds = Vec::new();
    while let Some(ev) = run.next_event().await {
        kinds.push(ev.kind);
    }
    let out = run.outcome().await.unwrap();
    assert_eq!(out.status, "interrupted");
    assert_eq!(out.state["count"], 5);
    assert!(
        kinds.contains(&"interrupt") && kinds.contains(&"values"),
        "{kinds:?}"
    );
    let out = wf
        .invoke(
            JsonInput::Resume(Resume::value(serde_json::json!("ship it"))),
            RunConfig::thread("j"),
        )
        .await
        .unwrap();
    assert_eq!(out.status, "done");
    assert_eq!(out.state["answers"][0], "ship it");
    let history = wf.history("j").await.unwrap();
    assert!(history.len() >= 4);
    assert_eq!(history[0].values["log"][2], "publish");
}
