//! Behaviour that LangGraph users rely on, checked against LangGraph's own expectations.
//!
//! Each test is written against our public API; the comment above it states what LangGraph
//! does in the same situation (from its Pregel test suite or its documented behaviour). Where
//! we deliberately differ, the README's "Where we differ from LangGraph" says so and why.

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use ferrograph::prelude::*;
use ferrograph::{RunStatus, RunStream, StreamEvent};
use ferrograph_tests::{log, Doc, DocUpdate};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

type Ctx = NodeContext;

async fn runner(g: CompiledGraph<Doc>) -> GraphRunner<Doc> {
    Runtime::new()
        .await
        .unwrap()
        .load(g)
        .await
        .unwrap()
        .with_checkpointer(Arc::new(MemorySaver::new()))
}

fn input(u: DocUpdate) -> RunInput<Doc> {
    RunInput::Update(u)
}

/// `draft -> review (asks a person) -> publish`.
fn approval_graph() -> CompiledGraph<Doc> {
    StateGraph::<Doc>::new("approval")
        .add_node("draft", |_s, _c| async { Ok(log("draft")) })
        .add_node("review", |s: Arc<Doc>, ctx: Ctx| async move {
            let answer: String = ctx.interrupt(serde_json::json!({ "status": s.status }))?;
            Ok(DocUpdate::new()
                .answers(vec![format!("{answer} (status {})", s.status)])
                .log(vec!["review".into()]))
        })
        .add_node("publish", |_s, _c| async { Ok(log("publish")) })
        .add_edge(START, "draft")
        .add_edge("draft", "review")
        .add_edge("review", "publish")
        .add_edge("publish", END)
        .compile()
        .unwrap()
}

/// `node1 -> node2`, each appending its name (LangGraph's `test_command_goto_with_static_breakpoints`
/// graph), with a breakpoint before the nodes given.
fn two_nodes(before: &[&str]) -> CompiledGraph<Doc> {
    StateGraph::<Doc>::new("two")
        .add_node("node1", |_s, _c| async { Ok(log("node-1")) })
        .add_node("node2", |_s, _c| async { Ok(log("node-2")) })
        .add_edge(START, "node1")
        .add_edge("node1", "node2")
        .add_edge("node2", END)
        .interrupt_before(before.iter().copied())
        .compile()
        .unwrap()
}

// ---------------------------------------------------------------- commands to the parent

// LangGraph: a node inside a subgraph that returns `Command(graph=Command.PARENT, goto=...,
// update=...)` ends the subgraph; the parent applies the command's update and goes to its
// target. What the subgraph wrote in its own earlier steps stays in the subgraph.
#[tokio::test]
async fn a_parent_command_carries_only_its_own_update() {
    let child = StateGraph::<Doc>::new("child")
        .add_node("work", |_s, _c| async { Ok(log("child-work").count(5)) })
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
        .add_edge(START, "work")
        .add_edge("work", "decide")
        .compile()
        .unwrap();
    let g = StateGraph::<Doc>::new("parent")
        .add_subgraph_with("team", child, NodeOptions::new().destinations(["manager"]))
        .add_node("manager", |_s, _c| async { Ok(log("manager")) })
        .add_edge(START, "team")
        .add_edge("manager", END)
        .compile()
        .unwrap();
    let out = runner(g)
        .await
        .invoke(input(DocUpdate::new()), RunConfig::thread("p"))
        .await
        .unwrap();
    assert_eq!(out.state.status, "escalated");
    assert_eq!(
        out.state.log,
        vec!["manager"],
        "the child's own writes leaked"
    );
    assert_eq!(out.state.count, 0);
}

// ---------------------------------------------------------------- pause, edit, continue

// LangGraph: with `interrupt_before=["node2"]`, `update_state(config, values)` and then
// `invoke(None, config)` runs node2 with the edited state (it does not stop before it again).
#[tokio::test]
async fn an_edit_at_a_breakpoint_then_continue_runs_the_node() {
    let r = runner(two_nodes(&["node2"])).await;
    let cfg = || RunConfig::thread("bp");
    let out = r.invoke(input(DocUpdate::new()), cfg()).await.unwrap();
    assert_eq!(out.status, RunStatus::Interrupted);
    assert_eq!(out.next, vec!["node2"]);
    r.update_state("bp", DocUpdate::new().status("edited".to_string()), None)
        .await
        .unwrap();
    let snap = r.get_state("bp", None).await.unwrap();
    assert_eq!(snap.next, vec!["node2"]);
    assert_eq!(snap.values.status, "edited");
    let out = r.invoke(RunInput::Continue, cfg()).await.unwrap();
    assert_eq!(out.status, RunStatus::Done, "stopped again: {:?}", out.next);
    assert_eq!(out.state.log, vec!["node-1", "node-2"]);
    assert_eq!(out.state.status, "edited");
}

// LangGraph: at a dynamic `interrupt()`, `update_state(config, values)` keeps the interrupt
// open (the snapshot still lists it) and `Command(resume=...)` then answers it; the node runs
// again from its start and sees the edited state.
#[tokio::test]
async fn an_edit_at_a_dynamic_interrupt_keeps_it_open() {
    let r = runner(approval_graph()).await;
    let cfg = || RunConfig::thread("dyn");
    let out = r.invoke(input(DocUpdate::new()), cfg()).await.unwrap();
    assert_eq!(out.status, RunStatus::Interrupted);
    let asked = out.interrupts[0].id.clone();
    r.update_state("dyn", DocUpdate::new().status("edited".to_string()), None)
        .await
        .unwrap();
    let snap = r.get_state("dyn", None).await.unwrap();
    assert_eq!(snap.interrupts.len(), 1, "the open interrupt was dropped");
    assert_eq!(snap.interrupts[0].id, asked);
    assert_eq!(snap.next, vec!["review"]);
    let out = r
        .invoke(RunInput::resume(serde_json::json!("yes")), cfg())
        .await
        .unwrap();
    assert_eq!(out.status, RunStatus::Done);
    assert_eq!(out.state.answers, vec!["yes (status edited)"]);
    assert_eq!(out.state.log, vec!["draft", "review", "publish"]);
}

// LangGraph: `update_state(config, values, as_node="review")` at the interrupt acts as if the
// node had run: the interrupt is gone and the next node is the one after it.
#[tokio::test]
async fn an_edit_as_the_interrupted_node_replaces_it() {
    let r = runner(approval_graph()).await;
    let cfg = || RunConfig::thread("as-node");
    r.invoke(input(DocUpdate::new()), cfg()).await.unwrap();
    r.update_state(
        "as-node",
        DocUpdate::new().answers(vec!["by hand".into()]),
        Some("review"),
    )
    .await
    .unwrap();
    let snap = r.get_state("as-node", None).await.unwrap();
    assert!(snap.interrupts.is_empty());
    assert_eq!(snap.next, vec!["publish"]);
    let out = r.invoke(RunInput::Continue, cfg()).await.unwrap();
    assert_eq!(out.state.answers, vec!["by hand"]);
    assert_eq!(out.state.log, vec!["draft", "publish"]);
}

// ---------------------------------------------------------------- the state after a failure

// LangGraph (`test_checkpoint_recovery` and pending writes): when one task of a step fails,
// `get_state` shows the finished siblings' writes applied to the values, lists only the failed
// task as next, and carries the error on that task; continuing runs only the failed task.
#[tokio::test]
async fn get_state_after_a_failed_step_shows_the_finished_siblings() {
    let fail = Arc::new(AtomicBool::new(true));
    let f = fail.clone();
    let g = StateGraph::<Doc>::new("fails")
        .add_node("fine", |_s, _c| async { Ok(log("fine")) })
        .add_node("flaky", move |_s, _c| {
            let f = f.clone();
            async move {
                if f.swap(false, Ordering::SeqCst) {
                    return Err(NodeError::fatal("simulated failure"));
                }
                Ok(log("flaky"))
            }
        })
        .add_edge(START, "fine")
        .add_edge(START, "flaky")
        .add_edge("fine", END)
        .add_edge("flaky", END)
        .compile()
        .unwrap();
    let r = runner(g).await;
    let cfg = || RunConfig::thread("f");
    let err = r
        .invoke(input(DocUpdate::new().status("in".to_string())), cfg())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("simulated failure"), "{err}");
    let snap = r.get_state("f", None).await.unwrap();
    assert_eq!(snap.values.log, vec!["fine"]);
    assert_eq!(snap.next, vec!["flaky"]);
    let flaky = snap.tasks.iter().find(|t| t.node == "flaky").unwrap();
    assert!(flaky
        .error
        .as_deref()
        .is_some_and(|e| e.contains("simulated failure")));
    assert!(snap.tasks.iter().any(|t| t.node == "fine" && t.finished));
    // The checkpoint itself, asked for by id, is the bare one (as in LangGraph).
    let bare = r.get_state("f", Some(&snap.checkpoint_id)).await.unwrap();
    assert!(bare.values.log.is_empty());
    assert_eq!(bare.next.len(), 2);
    let out = r.invoke(RunInput::Continue, cfg()).await.unwrap();
    assert_eq!(out.state.log, vec!["fine", "flaky"], "`fine` ran twice");
}

// ---------------------------------------------------------------- commands as run input

// LangGraph: `Command(resume=..., update=...)` applies the update and answers the interrupt in
// one input; the re-run node sees the update.
#[tokio::test]
async fn a_command_resumes_and_updates_at_once() {
    let r = runner(approval_graph()).await;
    let cfg = || RunConfig::thread("cmd");
    r.invoke(input(DocUpdate::new()), cfg()).await.unwrap();
    let out = r
        .invoke(
            RunInput::Command(
                Command::resume(Resume::value(serde_json::json!("ok")))
                    .update(DocUpdate::new().status("checked".to_string())),
            ),
            cfg(),
        )
        .await
        .unwrap();
    assert_eq!(out.status, RunStatus::Done);
    assert_eq!(out.state.answers, vec!["ok (status checked)"]);
    assert_eq!(out.state.log, vec!["draft", "review", "publish"]);
}

// LangGraph `test_command_goto_with_static_breakpoints`: stopped before node1, the input
// `Command(goto=["node2"])` runs node1 (the breakpoint is passed) and node2 in one step, then
// node2 again after node1: "abc|node-1|node-2|node-2".
#[tokio::test]
async fn a_command_goto_with_static_breakpoints() {
    let r = runner(two_nodes(&["node1"])).await;
    let cfg = || RunConfig::thread("goto");
    let out = r
        .invoke(input(DocUpdate::new().log(vec!["abc".into()])), cfg())
        .await
        .unwrap();
    assert_eq!(out.next, vec!["node1"]);
    let out = r
        .invoke(RunInput::Command(Command::new().goto("node2")), cfg())
        .await
        .unwrap();
    assert_eq!(out.status, RunStatus::Done);
    assert_eq!(out.state.log, vec!["abc", "node-1", "node-2", "node-2"]);
}

// LangGraph: `Command(goto=...)` as the first input of a thread starts it at that node; a
// breakpoint before that node still stops it (a new thread is not resuming).
#[tokio::test]
async fn a_command_goto_starts_a_new_thread_at_a_node() {
    let r = runner(two_nodes(&[])).await;
    let out = r
        .invoke(
            RunInput::Command(
                Command::new()
                    .goto("node2")
                    .update(DocUpdate::new().status("direct".to_string())),
            ),
            RunConfig::thread("new"),
        )
        .await
        .unwrap();
    assert_eq!(out.state.log, vec!["node-2"]);
    assert_eq!(out.state.status, "direct");

    let r = runner(two_nodes(&["node2"])).await;
    let out = r
        .invoke(
            RunInput::Command(Command::new().goto("node2")),
            RunConfig::thread("new-bp"),
        )
        .await
        .unwrap();
    assert_eq!(out.status, RunStatus::Interrupted);
    assert_eq!(out.next, vec!["node2"]);
    let out = r
        .invoke(RunInput::Continue, RunConfig::thread("new-bp"))
        .await
        .unwrap();
    assert_eq!(out.state.log, vec!["node-2"]);

    // Bad commands are typed errors and change nothing.
    let err = r
        .invoke(RunInput::Command(Command::new()), RunConfig::thread("x"))
        .await
        .unwrap_err();
    assert!(matches!(err, RunError::InvalidInput(_)), "{err}");
    let err = r
        .invoke(
            RunInput::Command(Command::new().goto("nowhere")),
            RunConfig::thread("x"),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("nowhere"), "{err}");
    assert!(r.get_state("x", None).await.is_err());
}

// ---------------------------------------------------------------- streaming

async fn collect(mut stream: RunStream<Doc>) -> (Vec<StreamEvent<Doc>>, RunOutcome<Doc>) {
    let mut events = Vec::new();
    while let Some(e) = stream.next_event().await {
        events.push(e);
    }
    (events, stream.outcome().await.unwrap())
}

// LangGraph: a static breakpoint ends the stream with an `__interrupt__` chunk, as a dynamic
// interrupt does.
#[tokio::test]
async fn a_static_breakpoint_sends_an_interrupt_event() {
    let r = runner(two_nodes(&["node2"])).await;
    let stream = r
        .stream(
            input(DocUpdate::new()),
            RunConfig::thread("s").stream(StreamMode::Values),
        )
        .await
        .unwrap();
    let (events, out) = collect(stream).await;
    assert_eq!(out.status, RunStatus::Interrupted);
    let last = events.last().unwrap();
    let StreamEvent::Interrupt { interrupts, .. } = last else {
        panic!(
            "no interrupt event: {:?}",
            events.iter().map(|e| e.kind()).collect::<Vec<_>>()
        );
    };
    assert!(interrupts[0].static_);
    assert_eq!(interrupts[0].node, "node2");
}

// LangGraph: in *updates* mode every task that finished is reported, also in a step that then
// stops at an interrupt, and a node that returns nothing is reported with an empty update
// (`{"quiet": None}`).
#[tokio::test]
async fn updates_stream_every_finished_task_of_an_interrupted_step() {
    let g = StateGraph::<Doc>::new("mixed")
        .add_node("quiet", |_s, _c| async { Ok(()) })
        .add_node("talk", |_s, _c| async { Ok(log("talk")) })
        .add_node("ask", |_s, ctx: Ctx| async move {
            let a: String = ctx.interrupt("?")?;
            Ok(DocUpdate::new().answers(vec![a]))
        })
        .add_edge(START, "quiet")
        .add_edge(START, "talk")
        .add_edge(START, "ask")
        .add_edge("quiet", END)
        .add_edge("talk", END)
        .add_edge("ask", END)
        .compile()
        .unwrap();
    let r = runner(g).await;
    let stream = r
        .stream(
            input(DocUpdate::new()),
            RunConfig::thread("u").stream(StreamMode::Updates),
        )
        .await
        .unwrap();
    let (events, out) = collect(stream).await;
    assert_eq!(out.status, RunStatus::Interrupted);
    let updates: Vec<(String, DocUpdate)> = events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::Updates { node, update, .. } => Some((node.to_string(), update.clone())),
            _ => None,
        })
        .collect();
    let nodes: Vec<&str> = updates.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(nodes, vec!["quiet", "talk"]);
    assert!(updates[0].1.is_empty());
    assert_eq!(updates[1].1.log, Some(vec!["talk".to_string()]));
    assert_eq!(events.last().map(StreamEvent::kind), Some("interrupt"));
}

// LangGraph: a resumed run's *values* stream opens with the state it resumes from.
#[tokio::test]
async fn a_resumed_run_opens_with_the_state_it_resumes_from() {
    let r = runner(approval_graph()).await;
    let cfg = || RunConfig::thread("v");
    let first = r.invoke(input(DocUpdate::new()), cfg()).await.unwrap();
    let stream = r
        .stream(
            RunInput::resume(serde_json::json!("yes")),
            cfg().stream(StreamMode::Values),
        )
        .await
        .unwrap();
    let (events, out) = collect(stream).await;
    let StreamEvent::Values { state, .. } = &events[0] else {
        panic!("the stream opened with {}", events[0].kind());
    };
    assert_eq!(**state, *first.state);
    let StreamEvent::Values { state, .. } = events.last().unwrap() else {
        panic!("the stream did not end with values");
    };
    assert_eq!(**state, *out.state);
    // A new run's stream opens with its input, too.
    let stream = r
        .stream(
            input(DocUpdate::new().status("fresh".to_string())),
            RunConfig::thread("v2").stream(StreamMode::Values),
        )
        .await
        .unwrap();
    let (events, _) = collect(stream).await;
    let StreamEvent::Values { state, .. } = &events[0] else {
        panic!("the stream opened with {}", events[0].kind());
    };
    assert_eq!(state.status, "fresh");
    assert!(state.log.is_empty());
}

// LangGraph: a subgraph node's update reaches the parent's *updates* stream as one chunk for
// the node, not one per write inside the subgraph.
#[tokio::test]
async fn a_subgraph_node_is_one_update_event() {
    let inner = StateGraph::<Doc>::new("inner")
        .add_node("x", |_s, _c| async { Ok(log("x").count(1)) })
        .add_node("y", |_s, _c| async { Ok(log("y").count(2)) })
        .add_edge(START, "x")
        .add_edge("x", "y")
        .add_edge("y", END)
        .compile()
        .unwrap();
    let g = StateGraph::<Doc>::new("outer")
        .add_subgraph("inner", inner)
        .add_edge(START, "inner")
        .add_edge("inner", END)
        .compile()
        .unwrap();
    let r = runner(g).await;
    let stream = r
        .stream(
            input(DocUpdate::new()),
            RunConfig::thread("sg").stream(StreamMode::Updates),
        )
        .await
        .unwrap();
    let (events, out) = collect(stream).await;
    let root: Vec<&StreamEvent<Doc>> = events
        .iter()
        .filter(|e| e.kind() == "updates" && e.namespace().is_empty())
        .collect();
    assert_eq!(root.len(), 1, "{root:?}");
    let StreamEvent::Updates { node, update, .. } = root[0] else {
        unreachable!()
    };
    assert_eq!(&**node, "inner");
    assert_eq!(update.log, Some(vec!["x".to_string(), "y".to_string()]));
    assert_eq!(update.count, Some(3));
    assert_eq!(out.state.log, vec!["x", "y"]);
    assert_eq!(out.state.count, 3);
}

// ---------------------------------------------------------------- error handlers

// LangGraph (node error handlers): when a node fails after its retries, its handler turns the
// error into a `Command`; the step commits with it, and the node's siblings in that step are
// neither cancelled nor run again.
#[tokio::test]
async fn an_error_handler_turns_a_failure_into_a_command() {
    let attempts = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let side_runs = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let (a, sr) = (attempts.clone(), side_runs.clone());
    let g = StateGraph::<Doc>::new("handled")
        .add_node_with(
            "fetch",
            move |_s, _c| {
                a.fetch_add(1, Ordering::SeqCst);
                async { Err::<DocUpdate, _>(NodeError::failed("upstream is down")) }
            },
            NodeOptions::new()
                .retry(RetryPolicy::attempts(3).with_backoff(std::time::Duration::from_millis(1)))
                .destinations(["recover"]),
        )
        .add_node("side", move |_s, _c| {
            sr.fetch_add(1, Ordering::SeqCst);
            async { Ok(log("side")) }
        })
        .add_node("recover", |s: Arc<Doc>, _c| async move {
            Ok(log(&format!("recover after: {}", s.status)))
        })
        .add_node("after_fetch", |_s, _c| async { Ok(log("after_fetch")) })
        .add_edge(START, "fetch")
        .add_edge(START, "side")
        .add_edge("fetch", "after_fetch")
        .add_edge("side", END)
        .add_edge("recover", END)
        .add_edge("after_fetch", END)
        .on_error("fetch", |e: &NodeError, _s: &Doc| {
            Command::new()
                .update(DocUpdate::new().status(format!("fallback ({e})")))
                .goto("recover")
        })
        .compile()
        .unwrap();
    let r = runner(g).await;
    let out = r
        .invoke(input(DocUpdate::new()), RunConfig::thread("h"))
        .await
        .unwrap();
    assert_eq!(out.status, RunStatus::Done);
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        3,
        "the handler ran before the retries"
    );
    assert_eq!(side_runs.load(Ordering::SeqCst), 1);
    assert_eq!(out.state.status, "fallback (upstream is down)");
    // The handled node's edges are followed as well as the handler's goto.
    assert_eq!(
        out.state.log,
        vec![
            "side",
            "recover after: fallback (upstream is down)",
            "after_fetch"
        ]
    );
    // Unknown nodes are compile errors.
    let err = StateGraph::<Doc>::new("bad")
        .add_node("a", |_s, _c| async { Ok(()) })
        .add_edge(START, "a")
        .add_edge("a", END)
        .on_error("nope", |_e: &NodeError, _s: &Doc| ())
        .compile()
        .unwrap_err();
    assert!(err.to_string().contains("nope"), "{err}");
}

// ---------------------------------------------------------------- deferred nodes

// LangGraph `defer=True`: with branches of different lengths feeding one node, the deferred
// node runs once, after every branch has finished.
#[tokio::test]
async fn a_deferred_node_runs_once_when_nothing_else_is_pending() {
    let build = |defer: bool| {
        let options = if defer {
            NodeOptions::new().defer()
        } else {
            NodeOptions::new()
        };
        StateGraph::<Doc>::new("defer")
            .add_node("a", |_s, _c| async { Ok(log("a")) })
            .add_node("b", |_s, _c| async { Ok(log("b")) })
            .add_node("c", |_s, _c| async { Ok(log("c")) })
            .add_node("c2", |_s, _c| async { Ok(log("c2")) })
            .add_node_with(
                "gather",
                |s: Arc<Doc>, _c| async move { Ok(log(&format!("gather {}", s.log.len()))) },
                options,
            )
            .add_edge(START, "a")
            .add_edge("a", "b")
            .add_edge("a", "c")
            .add_edge("b", "gather")
            .add_edge("c", "c2")
            .add_edge("c2", "gather")
            .add_edge("gather", END)
            .compile()
            .unwrap()
    };
    let out = runner(build(true))
        .await
        .invoke(input(DocUpdate::new()), RunConfig::thread("d"))
        .await
        .unwrap();
    assert_eq!(out.state.log, vec!["a", "b", "c", "c2", "gather 4"]);
    // Without deferral it runs twice, once per branch (the behaviour deferral exists to fix).
    let out = runner(build(false))
        .await
        .invoke(input(DocUpdate::new()), RunConfig::thread("d"))
        .await
        .unwrap();
    assert_eq!(
        out.state.log,
        vec!["a", "b", "c", "c2", "gather 3", "gather 5"]
    );
}

// ---------------------------------------------------------------- remaining steps

// LangGraph `RemainingSteps`: a node can read how many steps the limit still allows and wrap up
// instead of failing with the step limit.
#[tokio::test]
async fn a_node_reads_the_remaining_steps_and_wraps_up() {
    let g = StateGraph::<Doc>::new("loop")
        .add_node("work", |_s, ctx: Ctx| async move {
            let left = ctx.remaining_steps();
            let status = if left <= 2 { "wrapped up" } else { "working" };
            Ok(log(&format!("left {left}")).status(status.to_string()))
        })
        .add_edge(START, "work")
        .add_conditional_edges(
            "work",
            |s: &Doc| {
                if s.status == "wrapped up" {
                    END
                } else {
                    "work"
                }
            },
            ["work", END],
        )
        .compile()
        .unwrap();
    let out = runner(g)
        .await
        .invoke(
            input(DocUpdate::new()),
            RunConfig::thread("rs").max_steps(5),
        )
        .await
        .unwrap();
    assert_eq!(out.status, RunStatus::Done);
    assert_eq!(out.state.log, vec!["left 5", "left 4", "left 3", "left 2"]);
    assert_eq!(NodeContext::detached("x").remaining_steps(), u64::MAX);
}

// ---------------------------------------------------------------- node caching

// LangGraph `CachePolicy`: a task whose node and input match an earlier one reuses its output
// (across threads) until the entry's time to live has passed; other inputs run.
#[tokio::test]
async fn a_cached_node_runs_once_per_input_until_its_ttl() {
    let runs = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counter = runs.clone();
    let g = StateGraph::<Doc>::new("cached")
        .add_node_with(
            "expensive",
            move |s: Arc<Doc>, _c| {
                counter.fetch_add(1, Ordering::SeqCst);
                async move { Ok(log(&format!("computed {}", s.item))) }
            },
            NodeOptions::new().cache(CachePolicy::new().ttl(std::time::Duration::from_millis(300))),
        )
        .add_edge(START, "expensive")
        .add_edge("expensive", END)
        .compile()
        .unwrap();
    let r = runner(g).await;
    let run = |thread: &'static str, item: i64| {
        let r = r.clone();
        async move {
            r.invoke(
                input(DocUpdate::new().item(item)),
                RunConfig::thread(thread),
            )
            .await
            .unwrap()
        }
    };
    let first = run("t1", 1).await;
    let second = run("t2", 1).await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the second task was not served from the cache"
    );
    assert_eq!(second.state.log, first.state.log);
    run("t3", 2).await;
    assert_eq!(runs.load(Ordering::SeqCst), 2, "another input must run");
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    run("t4", 1).await;
    assert_eq!(runs.load(Ordering::SeqCst), 3, "an expired entry was used");
}

// ---------------------------------------------------------------- editing history

fn chain_abc() -> CompiledGraph<Doc> {
    StateGraph::<Doc>::new("abc")
        .add_node("a", |_s, _c| async { Ok(log("a")) })
        .add_node("b", |s: Arc<Doc>, _c| async move {
            Ok(log(&format!("b saw status '{}'", s.status)))
        })
        .add_node("c", |_s, _c| async { Ok(log("c")) })
        .add_edge(START, "a")
        .add_edge("a", "b")
        .add_edge("b", "c")
        .add_edge("c", END)
        .compile()
        .unwrap()
}

// LangGraph: `update_state` with a `checkpoint_id` in the config writes a new checkpoint whose
// parent is that (older) checkpoint; it becomes the thread's newest, and `invoke(None)` runs
// on from it. The old branch stays in the history.
#[tokio::test]
async fn update_state_on_an_older_checkpoint_branches_the_thread() {
    let r = runner(chain_abc()).await;
    let out = r
        .invoke(input(DocUpdate::new()), RunConfig::thread("br"))
        .await
        .unwrap();
    assert_eq!(out.state.log, vec!["a", "b saw status ''", "c"]);
    let history = r.get_state_history("br").await.unwrap();
    let after_a = history
        .iter()
        .find(|s| s.next == vec!["b"])
        .unwrap()
        .clone();
    let new_id = r
        .update_state_at(
            "br",
            &after_a.checkpoint_id,
            DocUpdate::new().status("edited".to_string()),
            None,
        )
        .await
        .unwrap();
    let snap = r.get_state("br", None).await.unwrap();
    assert_eq!(snap.checkpoint_id, new_id);
    assert_eq!(
        snap.parent_id.as_deref(),
        Some(after_a.checkpoint_id.as_str())
    );
    assert_eq!(snap.values.log, vec!["a"]);
    assert_eq!(snap.next, vec!["b"]);
    let out = r
        .invoke(RunInput::Continue, RunConfig::thread("br"))
        .await
        .unwrap();
    assert_eq!(out.state.log, vec!["a", "b saw status 'edited'", "c"]);
    let longer = r.get_state_history("br").await.unwrap();
    assert_eq!(longer.len(), history.len() + 3, "the old branch must stay");
    // An unknown checkpoint is a typed error.
    let err = r
        .update_state_at("br", "nope", DocUpdate::new(), None)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("nope"), "{err}");
}

// LangGraph `bulk_update_state`: several supersteps of updates in one call, each superstep
// merged like a step's writes (conflicts included); each superstep is a checkpoint.
#[tokio::test]
async fn bulk_update_state_writes_several_supersteps() {
    use ferrograph::StateEdit;
    let r = runner(chain_abc()).await;
    r.invoke(input(DocUpdate::new()), RunConfig::thread("bulk"))
        .await
        .unwrap();
    let before = r.get_state_history("bulk").await.unwrap().len();
    let last = r
        .bulk_update_state(
            "bulk",
            vec![
                vec![StateEdit::new(log("x1"), Some("a"))],
                vec![
                    StateEdit::new(log("y1").count(1), Some("b")),
                    StateEdit::new(DocUpdate::new().count(2).status("s".to_string()), Some("c")),
                ],
            ],
        )
        .await
        .unwrap();
    let snap = r.get_state("bulk", None).await.unwrap();
    assert_eq!(snap.checkpoint_id, last);
    assert_eq!(
        snap.values.log,
        vec!["a", "b saw status ''", "c", "x1", "y1"]
    );
    assert_eq!(snap.values.count, 3);
    assert_eq!(snap.writers, vec!["b", "c"]);
    assert_eq!(r.get_state_history("bulk").await.unwrap().len(), before + 2);
    // Two edits of one overwrite field in a step conflict, and nothing is written.
    let err = r
        .bulk_update_state(
            "bulk",
            vec![vec![
                StateEdit::new(DocUpdate::new().status("1".to_string()), Some("a")),
                StateEdit::new(DocUpdate::new().status("2".to_string()), Some("b")),
            ]],
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("status"), "{err}");
    let err = r
        .bulk_update_state(
            "bulk",
            vec![vec![
                StateEdit::new(log("p"), None),
                StateEdit::new(log("q"), Some("b")),
            ]],
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("name the node"), "{err}");
    assert_eq!(r.get_state_history("bulk").await.unwrap().len(), before + 2);
}

// ---------------------------------------------------------------- subgraphs with their own state

/// A quiz's own state: keys the parent does not have.
#[derive(State, Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
struct Quiz {
    topic: String,
    #[reducer(append)]
    questions: Vec<String>,
    #[reducer(append)]
    answers: Vec<String>,
    #[reducer(add)]
    correct: i64,
}

// LangGraph (subgraphs with different state schemas, called from a node or added with input
// and output schemas): the child sees only what the parent passes in, keeps keys of its own,
// and the parent gets only what comes back; the child's interrupts surface and resume inside
// it, each resume continuing from the child's saved state.
#[tokio::test]
async fn a_subgraph_with_its_own_state_maps_input_and_output_and_resumes_inside() {
    let generated = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let g2 = generated.clone();
    let quiz = StateGraph::<Quiz>::new("quiz")
        .add_node("generate", move |s: Arc<Quiz>, _c| {
            g2.fetch_add(1, Ordering::SeqCst);
            async move {
                Ok(QuizUpdate::new().questions(vec![
                    format!("{} q1 (A/B)", s.topic),
                    format!("{} q2 (A/B)", s.topic),
                ]))
            }
        })
        .add_node("ask", |s: Arc<Quiz>, ctx: Ctx| async move {
            let n = s.answers.len();
            let answer: String = ctx.interrupt(serde_json::json!({
                "question": n + 1, "of": s.questions.len(), "text": s.questions[n],
            }))?;
            let correct = i64::from(answer == "A");
            Ok(QuizUpdate::new().answers(vec![answer]).correct(correct))
        })
        .add_edge(START, "generate")
        .add_edge("generate", "ask")
        .add_conditional_edges(
            "ask",
            |s: &Quiz| {
                if s.answers.len() < s.questions.len() {
                    "ask"
                } else {
                    END
                }
            },
            ["ask", END],
        )
        .compile()
        .unwrap();
    let mapped = ferrograph::MappedSubgraph::new(
        quiz,
        |p: &Doc| Quiz {
            topic: p.status.clone(),
            ..Quiz::default()
        },
        |c: &Quiz, _p: &Doc| {
            DocUpdate::new()
                .answers(c.answers.clone())
                .count(c.correct)
                .log(vec![format!(
                    "quiz on {}: {}/{}",
                    c.topic,
                    c.correct,
                    c.questions.len()
                )])
        },
    );
    let g = StateGraph::<Doc>::new("tutor")
        .add_node("before", |_s, _c| async { Ok(log("before")) })
        .add_foreign_subgraph("quiz", mapped, NodeOptions::new())
        .add_node("after", |_s, _c| async { Ok(log("after")) })
        .add_edge(START, "before")
        .add_edge("before", "quiz")
        .add_edge("quiz", "after")
        .add_edge("after", END)
        .compile()
        .unwrap();
    let r = runner(g).await;
    let cfg = || RunConfig::thread("quiz");
    let out = r
        .invoke(
            input(DocUpdate::new().status("fractions".to_string())),
            cfg(),
        )
        .await
        .unwrap();
    assert_eq!(out.status, RunStatus::Interrupted);
    assert_eq!(out.interrupts[0].node, "quiz/ask");
    assert_eq!(out.interrupts[0].value.0["text"], "fractions q1 (A/B)");
    assert_eq!(out.state.log, vec!["before"]);
    let out = r
        .invoke(RunInput::resume(serde_json::json!("A")), cfg())
        .await
        .unwrap();
    assert_eq!(out.status, RunStatus::Interrupted);
    assert_eq!(out.interrupts[0].value.0["question"], 2);
    assert_eq!(out.interrupts[0].value.0["text"], "fractions q2 (A/B)");
    let out = r
        .invoke(RunInput::resume(serde_json::json!("B")), cfg())
        .await
        .unwrap();
    assert_eq!(out.status, RunStatus::Done);
    assert_eq!(
        generated.load(Ordering::SeqCst),
        1,
        "the child restarted instead of resuming"
    );
    assert_eq!(out.state.answers, vec!["A", "B"]);
    assert_eq!(out.state.count, 1);
    assert_eq!(
        out.state.log,
        vec!["before", "quiz on fractions: 1/2", "after"]
    );
}

// ---------------------------------------------------------------- overwrite

// LangGraph `Overwrite`: a write that replaces a channel's value, bypassing its reducer; it wins
// over the step's other writes to that channel, and two overwrites of one channel in a step are
// an error. Here: the recorded checkpoints replay it as an overwrite (get_state and history
// read it back from the saver), and an overwrite recorded as a pending write survives an
// interrupt in its step.
#[tokio::test]
async fn an_overwrite_bypasses_the_merge_rule() {
    let g = StateGraph::<Doc>::new("over")
        .add_node("fill", |_s, _c| async {
            Ok(DocUpdate::new().log(vec!["a".into(), "b".into()]).count(3))
        })
        .add_node("reset", |_s, _c| async {
            Ok(Command::new().overwrite(DocUpdate::new().log(vec!["reset".into()]).count(10)))
        })
        .add_node("append", |_s, _c| async { Ok(log("same-step append")) })
        .add_node("ask", |_s, ctx: Ctx| async move {
            let a: String = ctx.interrupt("go on?")?;
            Ok(DocUpdate::new().answers(vec![a]))
        })
        .add_node("after", |_s, _c| async { Ok(log("after").count(1)) })
        .add_edge(START, "fill")
        .add_edge("fill", "reset")
        .add_edge("fill", "append")
        .add_edge("fill", "ask")
        .add_join(["reset", "append", "ask"], "after")
        .add_edge("after", END)
        .compile()
        .unwrap();
    let r = runner(g).await;
    let cfg = || RunConfig::thread("ow");
    let out = r.invoke(input(DocUpdate::new()), cfg()).await.unwrap();
    assert_eq!(out.status, RunStatus::Interrupted);
    // `reset` finished before the step stopped: its overwrite waits as a pending write.
    let snap = r.get_state("ow", None).await.unwrap();
    assert_eq!(
        snap.values.log,
        vec!["reset"],
        "the pending overwrite, applied to the view"
    );
    let out = r
        .invoke(RunInput::resume(serde_json::json!("yes")), cfg())
        .await
        .unwrap();
    assert_eq!(out.status, RunStatus::Done);
    assert_eq!(
        out.state.log,
        vec!["reset", "after"],
        "the overwrite wins over the append"
    );
    assert_eq!(out.state.count, 11);
    // Read back from the saver (deltas replayed), not from memory.
    let loaded = r.get_state("ow", None).await.unwrap();
    assert_eq!(loaded.values.log, vec!["reset", "after"]);
    assert_eq!(loaded.values.count, 11);
    let history = r.get_state_history("ow").await.unwrap();
    assert_eq!(history[0].values.log, vec!["reset", "after"]);
    assert!(history[1].writers.contains(&"reset".to_string()));

    // As a run's input, with a goto.
    let out = r
        .invoke(
            RunInput::Command(
                Command::new()
                    .overwrite(DocUpdate::new().log(vec!["fresh".into()]))
                    .goto("after"),
            ),
            cfg(),
        )
        .await
        .unwrap();
    assert_eq!(out.state.log, vec!["fresh", "after"]);

    // Two overwrites of one field in a step conflict, naming both nodes.
    let g = StateGraph::<Doc>::new("two")
        .add_node("x", |_s, _c| async { Ok(NodeOutput::overwrite(log("x"))) })
        .add_node("y", |_s, _c| async { Ok(NodeOutput::overwrite(log("y"))) })
        .add_edge(START, "x")
        .add_edge(START, "y")
        .add_edge("x", END)
        .add_edge("y", END)
        .compile()
        .unwrap();
    let err = runner(g)
        .await
        .invoke(input(DocUpdate::new()), RunConfig::thread("c"))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("`log`") && text.contains("`x`") && text.contains("`y`"),
        "{text}"
    );
}

// LangGraph: after a run stops part-way through a step, what comes next is the unfinished
// tasks only; the run's own answer and `get_state` agree.
#[tokio::test]
async fn an_interrupted_run_and_get_state_agree_on_next() {
    let g = StateGraph::<Doc>::new("agree")
        .add_node("done_first", |_s, _c| async { Ok(log("done")) })
        .add_node("ask", |_s, ctx: Ctx| async move {
            let a: String = ctx.interrupt("?")?;
            Ok(DocUpdate::new().answers(vec![a]))
        })
        .add_edge(START, "done_first")
        .add_edge(START, "ask")
        .add_edge("done_first", END)
        .add_edge("ask", END)
        .compile()
        .unwrap();
    let r = runner(g).await;
    let out = r
        .invoke(input(DocUpdate::new()), RunConfig::thread("n"))
        .await
        .unwrap();
    let snap = r.get_state("n", None).await.unwrap();
    assert_eq!(out.next, vec!["ask"]);
    assert_eq!(out.next, snap.next);
    assert_eq!(*out.state, *snap.values);
}
