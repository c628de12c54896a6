//! LangGraph's own behavioural tests, ported to ferrograph's public API.
//!
//! Each test names the LangGraph test it comes from (`libs/langgraph/tests/test_pregel.py` and
//! `test_pregel_async.py`, including the tests later moved out of them) and states what LangGraph
//! expects. The graphs are rebuilt with our types: LangGraph's string and list channels become
//! fields of [`Doc`] (an `append` log, an `add` counter, overwrite fields) or of small states
//! defined here. Where we do not (yet) do what LangGraph does, the test keeps LangGraph's
//! expectation and is ignored with the reason; the README's "Where we differ from LangGraph"
//! lists the deliberate differences.

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use ferrograph::core::checkpoint::{CheckpointRecord, PendingWrite};
use ferrograph::core::Goto;
use ferrograph::prelude::*;
use ferrograph::{CheckpointError, CheckpointSaver, RunStream, ThreadInfo, ThreadStatus};
use ferrograph_tests::{log, Doc, DocUpdate};
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

type Ctx = NodeContext;

async fn runner<S: State>(g: CompiledGraph<S>) -> GraphRunner<S> {
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

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn counter() -> Arc<AtomicU32> {
    Arc::new(AtomicU32::new(0))
}

async fn collect<S: State>(mut stream: RunStream<S>) -> (Vec<StreamEvent<S>>, RunOutcome<S>) {
    let mut events = Vec::new();
    while let Some(e) = stream.next_event().await {
        events.push(e);
    }
    (events, stream.outcome().await.unwrap())
}

async fn stream_run<S: State>(
    r: &GraphRunner<S>,
    input: RunInput<S>,
    config: RunConfig,
) -> (Vec<StreamEvent<S>>, RunOutcome<S>) {
    collect(r.stream(input, config).await.unwrap()).await
}

/// The root graph's *updates* chunks, as `(node, update)`.
fn root_updates<S: State>(events: &[StreamEvent<S>]) -> Vec<(String, S::Update)> {
    events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::Updates {
                namespace,
                node,
                update,
                ..
            } if namespace.is_empty() => Some((node.to_string(), update.clone())),
            _ => None,
        })
        .collect()
}

/// The root graph's *values* chunks.
fn root_values<S: State>(events: &[StreamEvent<S>]) -> Vec<S> {
    events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::Values {
                namespace, state, ..
            } if namespace.is_empty() => Some((**state).clone()),
            _ => None,
        })
        .collect()
}

/// The values of the interrupts the root graph's stream reported (LangGraph's `__interrupt__`
/// chunks when not streaming subgraphs).
fn interrupt_values<S: State>(events: &[StreamEvent<S>]) -> Vec<serde_json::Value> {
    events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::Interrupt {
                namespace,
                interrupts,
            } if namespace.is_empty() => Some(interrupts),
            _ => None,
        })
        .flatten()
        .map(|i| i.value.0.clone())
        .collect()
}

fn logs(states: &[Doc]) -> Vec<Vec<String>> {
    states.iter().map(|s| s.log.clone()).collect()
}

fn statuses(states: &[Doc]) -> Vec<String> {
    states.iter().map(|s| s.status.clone()).collect()
}

fn doc_with(item: i64, status: &str) -> Doc {
    Doc {
        item,
        status: status.to_string(),
        ..Doc::default()
    }
}

// ================================================================ pending writes and recovery

// LangGraph `test_pending_writes_resume`: nodes `one` (adds 2) and `two` (fails; retry policy
// of two attempts) run in parallel on `value = 1`. The run raises; `one` ran once and `two` twice.
// `get_state` shows `value == 3` (one's pending write applied), `next == ("two",)`, and the
// tasks with one's result and two's error; the checkpoint asked for by id shows `value == 1`
// and `next == ("one", "two")`. `invoke(None)` fails again without re-running `one` (two has
// now run 4 times) and saves no new checkpoint. Once `two` succeeds (adds 3), `invoke(None)`
// returns `value == 6`.
#[tokio::test]
async fn pending_writes_resume() {
    let one_calls = counter();
    let two_calls = counter();
    let two_fails = Arc::new(AtomicBool::new(true));
    let (oc, tc, tf) = (one_calls.clone(), two_calls.clone(), two_fails.clone());
    let g = StateGraph::<Doc>::new("pending")
        .add_node("one", move |_s, _c| {
            oc.fetch_add(1, Ordering::SeqCst);
            async { Ok(DocUpdate::new().count(2)) }
        })
        .add_node_with(
            "two",
            move |_s, _c| {
                tc.fetch_add(1, Ordering::SeqCst);
                let fail = tf.load(Ordering::SeqCst);
                async move {
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    if fail {
                        Err(NodeError::failed("I'm not good"))
                    } else {
                        Ok(DocUpdate::new().count(3))
                    }
                }
            },
            NodeOptions::new()
                .retry(RetryPolicy::attempts(2).with_backoff(Duration::from_millis(1))),
        )
        .add_edge(START, "one")
        .add_edge(START, "two")
        .add_edge("one", END)
        .add_edge("two", END)
        .compile()
        .unwrap();
    let r = runner(g).await;
    let cfg = || RunConfig::thread("1");
    let err = r
        .invoke(input(DocUpdate::new().count(1)), cfg())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("I'm not good"), "{err}");
    assert_eq!(one_calls.load(Ordering::SeqCst), 1);
    assert_eq!(two_calls.load(Ordering::SeqCst), 2, "two attempts");

    let state = r.get_state("1", None).await.unwrap();
    assert_eq!(state.values.count, 3);
    assert_eq!(state.next, vec!["two"]);
    let nodes: Vec<&str> = state.tasks.iter().map(|t| t.node.as_str()).collect();
    assert_eq!(nodes, vec!["one", "two"]);
    assert!(state.tasks[0].finished && state.tasks[0].error.is_none());
    assert!(state.tasks[1]
        .error
        .as_deref()
        .is_some_and(|e| e.contains("I'm not good")));
    let bare = r.get_state("1", Some(&state.checkpoint_id)).await.unwrap();
    assert_eq!(bare.values.count, 1);
    assert_eq!(bare.next, vec!["one", "two"]);

    let err = r.invoke(RunInput::Continue, cfg()).await.unwrap_err();
    assert!(err.to_string().contains("I'm not good"), "{err}");
    assert_eq!(one_calls.load(Ordering::SeqCst), 1, "`one` ran again");
    assert_eq!(two_calls.load(Ordering::SeqCst), 4);
    let again = r.get_state("1", None).await.unwrap();
    assert_eq!(again.checkpoint_id, state.checkpoint_id, "a new checkpoint");
    assert_eq!(again.step, state.step);

    two_fails.store(false, Ordering::SeqCst);
    let out = r.invoke(RunInput::Continue, cfg()).await.unwrap();
    assert_eq!(out.status, RunStatus::Done);
    assert_eq!(out.state.count, 6, "1 + 2 (pending) + 3");
    assert_eq!(one_calls.load(Ordering::SeqCst), 1);
}

// LangGraph `test_checkpoint_recovery`: `node1` fails while `attempt == 1`. After the failure
// `get_state` shows the input (`steps == ["start"]`, `attempt == 1`), `next == ("node1",)`
// and the error on `tasks[0]`. A new input `{"steps": [], "attempt": 2}` then runs to
// `{"steps": ["start", "node1", "node2"], "attempt": 2}`.
#[tokio::test]
async fn checkpoint_recovery() {
    let g = StateGraph::<Doc>::new("recovery")
        .add_node("node1", |s: Arc<Doc>, _c| async move {
            if s.item == 1 {
                return Err(NodeError::fatal("Simulated failure"));
            }
            Ok(log("node1"))
        })
        .add_node("node2", |_s, _c| async { Ok(log("node2")) })
        .add_edge(START, "node1")
        .add_edge("node1", "node2")
        .add_edge("node2", END)
        .compile()
        .unwrap();
    let r = runner(g).await;
    let cfg = || RunConfig::thread("1");
    let err = r
        .invoke(input(log("start").item(1)), cfg())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("Simulated failure"), "{err}");
    let state = r.get_state("1", None).await.unwrap();
    assert_eq!(state.values.log, vec!["start"]);
    assert_eq!(state.values.item, 1);
    assert_eq!(state.next, vec!["node1"]);
    assert!(state.tasks[0]
        .error
        .as_deref()
        .is_some_and(|e| e.contains("Simulated failure")));

    let out = r
        .invoke(input(DocUpdate::new().log(vec![]).item(2)), cfg())
        .await
        .unwrap();
    assert_eq!(out.status, RunStatus::Done);
    assert_eq!(out.state.log, vec!["start", "node1", "node2"]);
    assert_eq!(out.state.item, 2);
    // The failed checkpoint keeps its error in the history.
    let history = r.get_state_history("1").await.unwrap();
    assert!(history.iter().any(|s| s.tasks.iter().any(|t| t
        .error
        .as_deref()
        .is_some_and(|e| e.contains("Simulated failure")))));
}

// LangGraph `test_checkpoint_recovery` and `test_pending_writes_resume`, the history's shape:
// an input is saved as two checkpoints (`source: "input"` at step -1, holding the raw input,
// then the `__start__` task's `source: "loop"` checkpoint at step 0), so the recovery thread
// above has 6 checkpoints (input, loop, input, loop, loop, loop), and a run of the
// pending-writes graph 3 (input with no values yet, loop 0, loop 1).
#[tokio::test]
#[ignore = "differs: an input is one checkpoint here (the input merged, next planned), not an input checkpoint plus a __start__ step"]
async fn checkpoint_history_has_an_input_and_a_start_checkpoint() {
    let g = StateGraph::<Doc>::new("recovery")
        .add_node("node1", |s: Arc<Doc>, _c| async move {
            if s.item == 1 {
                return Err(NodeError::fatal("Simulated failure"));
            }
            Ok(log("node1"))
        })
        .add_node("node2", |_s, _c| async { Ok(log("node2")) })
        .add_edge(START, "node1")
        .add_edge("node1", "node2")
        .add_edge("node2", END)
        .compile()
        .unwrap();
    let r = runner(g).await;
    r.invoke(input(log("start").item(1)), RunConfig::thread("1"))
        .await
        .unwrap_err();
    r.invoke(input(DocUpdate::new().item(2)), RunConfig::thread("1"))
        .await
        .unwrap();
    assert_eq!(r.get_state_history("1").await.unwrap().len(), 6);

    let g = StateGraph::<Doc>::new("pending")
        .add_node("one", |_s, _c| async { Ok(DocUpdate::new().count(2)) })
        .add_node("two", |_s, _c| async { Ok(DocUpdate::new().count(3)) })
        .add_edge(START, "one")
        .add_edge(START, "two")
        .add_edge("one", END)
        .add_edge("two", END)
        .compile()
        .unwrap();
    let r = runner(g).await;
    r.invoke(input(DocUpdate::new().count(1)), RunConfig::thread("2"))
        .await
        .unwrap();
    let history = r.get_state_history("2").await.unwrap();
    assert_eq!(history.len(), 3);
    // The oldest checkpoint holds no values yet: the input is still on its way in.
    assert_eq!(history[2].values.count, 0);
}

// ================================================================ time travel

#[derive(State, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct MyState {
    #[reducer(add)]
    myval: i64,
    otherval: bool,
}

// LangGraph `test_run_from_checkpoint_id_retains_previous_writes`: one callable, which flips a
// switch on every call, serves as `node_one` and `node_two`; each routes to END once
// `myval > 3`, to the other node when `otherval`, else to itself. `invoke({"myval": 1})` ends
// with `myval == 4, otherval == False`. Running `invoke(None)` from the checkpoint before
// `node_two` (the one with `myval == 3`) returns `{"myval": 5, "otherval": True}`; the history
// gains exactly one checkpoint and the older ones keep their values, next and step.
// (LangGraph also asserts the first run's history has 4 checkpoints, the oldest an input
// checkpoint holding `{"myval": 0}`; ours has 3, the oldest holding the merged input: that
// difference is `checkpoint_history_has_an_input_and_a_start_checkpoint`.)
#[tokio::test]
async fn run_from_checkpoint_id_retains_previous_writes() {
    let switch = Arc::new(AtomicBool::new(false));
    let node = move |_s: Arc<MyState>, _c: Ctx| {
        let on = !switch.fetch_xor(true, Ordering::SeqCst);
        async move {
            Ok(MyStateUpdate::new()
                .myval(if on { 2 } else { 1 })
                .otherval(on))
        }
    };
    let edge = |own: &'static str, other: &'static str| {
        move |s: &MyState| {
            if s.myval > 3 {
                END
            } else if s.otherval {
                other
            } else {
                own
            }
        }
    };
    let g = StateGraph::<MyState>::new("switch")
        .add_node("node_one", node.clone())
        .add_node("node_two", node)
        .add_edge(START, "node_one")
        .add_conditional_edges(
            "node_one",
            edge("node_one", "node_two"),
            ["node_one", "node_two", END],
        )
        .add_conditional_edges(
            "node_two",
            edge("node_two", "node_one"),
            ["node_one", "node_two", END],
        )
        .compile()
        .unwrap();
    let r = runner(g).await;
    let out = r
        .invoke(
            RunInput::Update(MyStateUpdate::new().myval(1)),
            RunConfig::thread("t"),
        )
        .await
        .unwrap();
    assert_eq!(out.state.myval, 4);
    let history = r.get_state_history("t").await.unwrap();
    assert_eq!(
        *history[0].values,
        MyState {
            myval: 4,
            otherval: false
        }
    );
    let before_two = history
        .iter()
        .find(|s| s.next == vec!["node_two"])
        .unwrap()
        .clone();
    assert_eq!(before_two.values.myval, 3);

    let out = r
        .invoke(
            RunInput::Continue,
            RunConfig::thread("t").at_checkpoint(before_two.checkpoint_id.clone()),
        )
        .await
        .unwrap();
    assert_eq!(
        *out.state,
        MyState {
            myval: 5,
            otherval: true
        }
    );
    let new_history = r.get_state_history("t").await.unwrap();
    assert_eq!(new_history.len(), history.len() + 1);
    for (original, new) in history.iter().zip(&new_history[1..]) {
        assert_eq!(original.values, new.values);
        assert_eq!(original.next, new.next);
        assert_eq!(original.step, new.step);
    }
}

// ================================================================ Send fan-out

/// A node that appends its name, or `name|item` when it runs on a `Send`'s input.
fn named(
    name: &'static str,
) -> impl Fn(Arc<Doc>, Ctx) -> std::future::Ready<Result<DocUpdate, NodeError>> + Send + Sync {
    move |s, _c| {
        let entry = if s.status == "sent" {
            format!("{name}|{}", s.item)
        } else {
            name.to_string()
        };
        std::future::ready(Ok(log(&entry)))
    }
}

// LangGraph `test_cond_edge_after_send`: `1` sends its state to `2` twice; `2` routes to `3`.
// `invoke(["0"]) == ["0", "1", "2", "2", "3"]`: both sends run, and `3` runs once.
#[tokio::test]
async fn cond_edge_after_send() {
    let g = StateGraph::<Doc>::new("sends")
        .add_node("1", named("1"))
        .add_node("2", named("2"))
        .add_node("3", named("3"))
        .add_edge(START, "1")
        .add_conditional_edges(
            "1",
            |s: &Doc| vec![SendTo::new("2", s.clone()), SendTo::new("2", s.clone())],
            ["2"],
        )
        .add_conditional_edges("2", |_s: &Doc| "3", ["3"])
        .add_edge("3", END)
        .compile()
        .unwrap();
    let out = runner(g)
        .await
        .invoke(input(log("0")), RunConfig::thread("t"))
        .await
        .unwrap();
    assert_eq!(out.state.log, vec!["0", "1", "2", "2", "3"]);
}

fn send(node: &str, item: i64) -> Goto<Doc> {
    Goto::Send(SendTo::new(node, doc_with(item, "sent")))
}

// LangGraph `test_concurrent_emit_sends`: `1` and `1.1` run in parallel; `1` sends 1 and 2 to
// `2` and also goes to `3.1`; `1.1` sends 3 and 4 to `2`; `2` routes to `3`. The result is
// `["0", "1", "1.1", "3.1", "2|1", "2|2", "2|3", "2|4", "3"]`: in a step, the nodes reached by
// edges come before the sends, and the sends keep the order they were made in.
#[tokio::test]
async fn concurrent_emit_sends() {
    let g = StateGraph::<Doc>::new("emit")
        .add_node("1", named("1"))
        .add_node("1.1", named("1.1"))
        .add_node("2", named("2"))
        .add_node("3", named("3"))
        .add_node("3.1", named("3.1"))
        .add_edge(START, "1")
        .add_edge(START, "1.1")
        .add_conditional_edges(
            "1",
            |_s: &Doc| vec![send("2", 1), send("2", 2), Goto::Node("3.1".into())],
            ["2", "3.1"],
        )
        .add_conditional_edges("1.1", |_s: &Doc| vec![send("2", 3), send("2", 4)], ["2"])
        .add_conditional_edges("2", |_s: &Doc| "3", ["3"])
        .add_edge("3", END)
        .add_edge("3.1", END)
        .compile()
        .unwrap();
    let out = runner(g)
        .await
        .invoke(input(log("0")), RunConfig::thread("t"))
        .await
        .unwrap();
    assert_eq!(
        out.state.log,
        vec!["0", "1", "1.1", "3.1", "2|1", "2|2", "2|3", "2|4", "3"]
    );
}

/// The `send_for_fun` graph of LangGraph's `test_send_sequences`: `1` sends two "commands" to
/// `2` and goes to `3.1`; `2`, given a command (status `cmd`), appends `2|cmd->{target}{item}`
/// and sends `item` on to `target` from inside its `Command`; `2` routes to `3`. `flaky` (used
/// by `test_send_dedupe_on_resume`) interrupts on its first call only.
fn send_sequences_graph(
    second_target: &'static str,
    two_calls: Arc<AtomicU32>,
    flaky_calls: Arc<AtomicU32>,
) -> CompiledGraph<Doc> {
    let target = |item: i64| doc_with(item, "cmd");
    StateGraph::<Doc>::new("sequences")
        .add_node("1", named("1"))
        .add_node_with(
            "2",
            move |s: Arc<Doc>, _c| {
                two_calls.fetch_add(1, Ordering::SeqCst);
                async move {
                    if s.status == "cmd" {
                        let to = if s.item == 3 { "2" } else { second_target };
                        let shown = if to == "2" {
                            String::new()
                        } else {
                            to.to_string()
                        };
                        Ok(Command::new()
                            .update(log(&format!("2|cmd->{shown}{}", s.item)))
                            .goto(SendTo::new(to, doc_with(s.item, "sent"))))
                    } else {
                        Ok(Command::new().update(log(&format!("2|{}", s.item))))
                    }
                }
            },
            NodeOptions::new().destinations(["2", "flaky"]),
        )
        .add_node("3", named("3"))
        .add_node("3.1", named("3.1"))
        .add_node("flaky", move |s: Arc<Doc>, ctx: Ctx| {
            let first = flaky_calls.fetch_add(1, Ordering::SeqCst) == 0;
            async move {
                if first {
                    let _: serde_json::Value = ctx.interrupt("Bahh")?;
                }
                Ok(log(&format!("flaky|{}", s.item)))
            }
        })
        .add_edge(START, "1")
        .add_conditional_edges(
            "1",
            move |_s: &Doc| {
                vec![
                    Goto::Send(SendTo::new("2", target(3))),
                    Goto::Send(SendTo::new("2", target(4))),
                    Goto::Node("3.1".into()),
                ]
            },
            ["2", "3.1"],
        )
        .add_conditional_edges("2", |_s: &Doc| "3", ["3"])
        .add_edge("3", END)
        .add_edge("3.1", END)
        .add_edge("flaky", END)
        .compile()
        .unwrap()
}

// LangGraph `test_send_sequences`: a task started by a `Send` can itself return a `Command`
// whose goto is another `Send`. The result is `["0", "1", "3.1", "2|Command(goto=Send(2, 3))",
// "2|Command(goto=Send(2, 4))", "3", "2|3", "2|4", "3"]`: the second-generation sends run in
// the step after the first ones, after `3` (reached by the edge), and `3` runs again after them.
#[tokio::test]
async fn send_sequences() {
    let g = send_sequences_graph("2", counter(), counter());
    let out = runner(g)
        .await
        .invoke(input(log("0")), RunConfig::thread("t"))
        .await
        .unwrap();
    assert_eq!(
        out.state.log,
        vec!["0", "1", "3.1", "2|cmd->3", "2|cmd->4", "3", "2|3", "2|4", "3"]
    );
}

// LangGraph `test_send_dedupe_on_resume`: as `test_send_sequences`, but the second command
// sends 4 to `flaky`, which interrupts on its first call. The first run stops at the interrupt
// ("Bahh") after `2` ran 3 times and `flaky` once. `invoke(None)` finishes with `["0", "1",
// "3.1", "2|...3", "2|...flaky 4", "3", "2|3", "flaky|4", "3"]`; `2` is not called again (its
// write in the interrupted step was saved) and `flaky` is called a second time. The history
// keeps the interrupted step's checkpoint with next `2`, `flaky` and `3` and its interrupt.
// (The order of that `next` and the rest of LangGraph's history expectations are in
// `send_dedupe_on_resume_history`; here `next` is compared as a set.)
#[tokio::test]
async fn send_dedupe_on_resume() {
    let (two_calls, flaky_calls) = (counter(), counter());
    let g = send_sequences_graph("flaky", two_calls.clone(), flaky_calls.clone());
    let r = runner(g).await;
    let cfg = || RunConfig::thread("1");
    let out = r.invoke(input(log("0")), cfg()).await.unwrap();
    assert_eq!(out.status, RunStatus::Interrupted);
    assert_eq!(out.interrupts.len(), 1);
    assert_eq!(out.interrupts[0].value.0, "Bahh");
    assert_eq!(two_calls.load(Ordering::SeqCst), 3);
    assert_eq!(flaky_calls.load(Ordering::SeqCst), 1);

    let out = r.invoke(RunInput::Continue, cfg()).await.unwrap();
    assert_eq!(out.status, RunStatus::Done);
    assert_eq!(
        out.state.log,
        vec![
            "0",
            "1",
            "3.1",
            "2|cmd->3",
            "2|cmd->flaky4",
            "3",
            "2|3",
            "flaky|4",
            "3"
        ]
    );
    assert_eq!(two_calls.load(Ordering::SeqCst), 3, "`2` ran again");
    assert_eq!(flaky_calls.load(Ordering::SeqCst), 2);

    let history = r.get_state_history("1").await.unwrap();
    let interrupted = history
        .iter()
        .find(|s| s.values.log.last().map(String::as_str) == Some("2|cmd->flaky4"))
        .unwrap();
    let mut next = interrupted.next.clone();
    next.sort();
    assert_eq!(next, vec!["2", "3", "flaky"]);
    assert_eq!(interrupted.interrupts.len(), 1);
    assert_eq!(interrupted.interrupts[0].value.0, "Bahh");
}

// LangGraph `test_send_dedupe_on_resume`, the history: 6 checkpoints, newest first with next
// `()`, `("3",)`, `("2", "flaky", "3")`, `("2", "2", "3.1")`, `("1",)`, `("__start__",)`: a
// step's tasks are listed with the `Send` tasks first. In the interrupted step's checkpoint
// every task shows its result, `flaky` included (`["flaky|4"]`, written by the run that resumed).
#[tokio::test]
#[ignore = "differs: next lists edge tasks before Send tasks; the task that completed a step on resume is not shown finished in that step's checkpoint; no separate __start__ checkpoint"]
async fn send_dedupe_on_resume_history() {
    let g = send_sequences_graph("flaky", counter(), counter());
    let r = runner(g).await;
    r.invoke(input(log("0")), RunConfig::thread("1"))
        .await
        .unwrap();
    r.invoke(RunInput::Continue, RunConfig::thread("1"))
        .await
        .unwrap();
    let history = r.get_state_history("1").await.unwrap();
    let interrupted = history
        .iter()
        .find(|s| s.values.log.last().map(String::as_str) == Some("2|cmd->flaky4"))
        .unwrap();
    assert_eq!(interrupted.next, vec!["2", "flaky", "3"]);
    assert!(
        interrupted.tasks.iter().all(|t| t.finished),
        "{:?}",
        interrupted.tasks
    );
    let step_1 = history
        .iter()
        .find(|s| s.values.log.last().map(String::as_str) == Some("1"))
        .unwrap();
    assert_eq!(step_1.next, vec!["2", "2", "3.1"]);
    assert_eq!(history.len(), 6);
}

// ================================================================ interrupts

// LangGraph `test_interrupt_multiple`: a node calls `interrupt({"value": 1})` and then
// `interrupt({"value": 2})`. Streaming (updates) the input yields only the first interrupt;
// `Command(resume="answer 1", update={"my_key": "foofoo"})` yields only the second;
// `Command(resume="answer 2")` yields `{"node": {"my_key": "answer 1 answer 2"}}`.
#[tokio::test]
async fn interrupt_multiple() {
    let g = StateGraph::<Doc>::new("multiple")
        .add_node("node", |_s, ctx: Ctx| async move {
            let a: String = ctx.interrupt(serde_json::json!({"value": 1}))?;
            let b: String = ctx.interrupt(serde_json::json!({"value": 2}))?;
            Ok(DocUpdate::new().answers(vec![format!("{a} {b}")]))
        })
        .add_edge(START, "node")
        .add_edge("node", END)
        .compile()
        .unwrap();
    let r = runner(g).await;
    let cfg = || RunConfig::thread("1").stream(StreamMode::Updates);
    let (events, _) =
        stream_run(&r, input(DocUpdate::new().answers(strings(&["DE"]))), cfg()).await;
    assert!(root_updates(&events).is_empty(), "{events:?}");
    assert_eq!(
        interrupt_values(&events),
        vec![serde_json::json!({"value": 1})]
    );

    let (events, _) = stream_run(
        &r,
        RunInput::Command(
            Command::resume(Resume::value(serde_json::json!("answer 1")))
                .update(DocUpdate::new().answers(strings(&["foofoo"]))),
        ),
        cfg(),
    )
    .await;
    assert!(root_updates(&events).is_empty(), "{events:?}");
    assert_eq!(
        interrupt_values(&events),
        vec![serde_json::json!({"value": 2})]
    );

    let (events, out) = stream_run(&r, RunInput::resume("answer 2".into()), cfg()).await;
    let updates = root_updates(&events);
    assert_eq!(updates.len(), 1, "{updates:?}");
    assert_eq!(updates[0].0, "node");
    assert_eq!(updates[0].1.answers, Some(strings(&["answer 1 answer 2"])));
    assert!(interrupt_values(&events).is_empty());
    assert_eq!(out.state.answers, vec!["DE", "foofoo", "answer 1 answer 2"]);
}

// LangGraph `test_interrupt_loop`: a node asks "How old are you?" and, while the answer is not
// a number of at least 18, asks again with "invalid response" (interrupts in a loop). Resuming
// with "13" and "15" each yields one "invalid response" interrupt; "19" yields
// `{"node": {"age": 19}}`.
#[tokio::test]
async fn interrupt_loop() {
    let g = StateGraph::<Doc>::new("loop")
        .add_node("node", |_s, ctx: Ctx| async move {
            let mut question = "How old are you?";
            let mut age = None;
            for _ in 0..10 {
                let value: String = ctx.interrupt(question)?;
                match value.parse::<i64>() {
                    Ok(n) if n >= 18 => {
                        age = Some(n);
                        break;
                    }
                    _ => question = "invalid response",
                }
            }
            Ok(DocUpdate::new().item(age.unwrap_or(-1)))
        })
        .add_edge(START, "node")
        .add_edge("node", END)
        .compile()
        .unwrap();
    let r = runner(g).await;
    let cfg = || RunConfig::thread("1").stream(StreamMode::Updates);
    let (events, _) = stream_run(&r, input(DocUpdate::new()), cfg()).await;
    assert_eq!(interrupt_values(&events), vec!["How old are you?"]);
    for answer in ["13", "15"] {
        let (events, _) = stream_run(&r, RunInput::resume(answer.into()), cfg()).await;
        assert!(root_updates(&events).is_empty());
        assert_eq!(interrupt_values(&events), vec!["invalid response"]);
    }
    let (events, out) = stream_run(&r, RunInput::resume("19".into()), cfg()).await;
    assert!(interrupt_values(&events).is_empty());
    let updates = root_updates(&events);
    assert_eq!(updates.len(), 1);
    assert_eq!(updates[0].0, "node");
    assert_eq!(updates[0].1.item, Some(19));
    assert_eq!(out.state.item, 19);
}

// LangGraph `test_multiple_interrupt_state_persistence`: a node interrupts twice and then
// returns both answers. Between the interrupts `get_state` shows the state unchanged
// (`steps == []`: the node has not returned); after the second resume `steps == ["step1",
// "step2"]`, in the result and in `get_state`.
#[tokio::test]
async fn multiple_interrupt_state_persistence() {
    let g = StateGraph::<Doc>::new("persist")
        .add_node("node", |_s, ctx: Ctx| async move {
            let first: String = ctx.interrupt("First interrupt")?;
            let second: String = ctx.interrupt("Second interrupt")?;
            Ok(DocUpdate::new().answers(vec![first, second]))
        })
        .add_edge(START, "node")
        .add_edge("node", END)
        .compile()
        .unwrap();
    let r = runner(g).await;
    let cfg = || RunConfig::thread("1");
    r.invoke(input(DocUpdate::new().answers(vec![])), cfg())
        .await
        .unwrap();
    assert!(r
        .get_state("1", None)
        .await
        .unwrap()
        .values
        .answers
        .is_empty());
    let out = r
        .invoke(RunInput::resume("step1".into()), cfg())
        .await
        .unwrap();
    assert_eq!(out.interrupts[0].value.0, "Second interrupt");
    assert!(r
        .get_state("1", None)
        .await
        .unwrap()
        .values
        .answers
        .is_empty());
    let out = r
        .invoke(RunInput::resume("step2".into()), cfg())
        .await
        .unwrap();
    assert_eq!(out.state.answers, vec!["step1", "step2"]);
    assert_eq!(
        r.get_state("1", None).await.unwrap().values.answers,
        vec!["step1", "step2"]
    );
}

// LangGraph `test_command_with_static_breakpoints`: stopped by `interrupt_before=["node1"]`,
// the input `Command(resume="node1")` passes the breakpoint and runs to the end:
// `{"foo": "abc|node-1|node-2"}`.
#[tokio::test]
async fn command_resume_passes_a_static_breakpoint() {
    let g = StateGraph::<Doc>::new("static")
        .add_node("node1", |s: Arc<Doc>, _c| async move {
            Ok(DocUpdate::new().status(format!("{}|node-1", s.status)))
        })
        .add_node("node2", |s: Arc<Doc>, _c| async move {
            Ok(DocUpdate::new().status(format!("{}|node-2", s.status)))
        })
        .add_edge(START, "node1")
        .add_edge("node1", "node2")
        .add_edge("node2", END)
        .interrupt_before(["node1"])
        .compile()
        .unwrap();
    let r = runner(g).await;
    let cfg = || RunConfig::thread("1");
    let out = r
        .invoke(input(DocUpdate::new().status("abc".to_string())), cfg())
        .await
        .unwrap();
    assert_eq!(out.status, RunStatus::Interrupted);
    let out = r
        .invoke(
            RunInput::Command(Command::resume(Resume::value(serde_json::json!("node1")))),
            cfg(),
        )
        .await
        .unwrap();
    assert_eq!(out.status, RunStatus::Done);
    assert_eq!(out.state.status, "abc|node-1|node-2");
}

// ================================================================ interrupts in subgraphs

/// `node_1` and `node_2` each set `status` to the answer of an interrupt.
fn double_interrupt_graph() -> CompiledGraph<Doc> {
    StateGraph::<Doc>::new("agent")
        .add_node("node_1", |_s, ctx: Ctx| async move {
            let v: String = ctx.interrupt("interrupt node 1")?;
            Ok(DocUpdate::new().status(v))
        })
        .add_node("node_2", |_s, ctx: Ctx| async move {
            let v: String = ctx.interrupt("interrupt node 2")?;
            Ok(DocUpdate::new().status(v))
        })
        .add_edge(START, "node_1")
        .add_edge("node_1", "node_2")
        .add_edge("node_2", END)
        .compile()
        .unwrap()
}

// LangGraph `test_double_interrupt_subgraph`: a graph whose two nodes each interrupt streams
// (updates) `[interrupt 1]`, then on resume `[{"node_1": {"input": "123"}}, interrupt 2]`,
// then `[{"node_2": {"input": "123"}}]`. Called from the parent's node `invoke_sub_agent`
// (LangGraph invokes it from a node function; here it is a subgraph node), the parent streams
// `[interrupt 1]`, `[interrupt 2]` (its root stream shows nothing of the subgraph's inner nodes)
// and finally `[{"invoke_sub_agent": {"input": True}}]`.
#[tokio::test]
async fn double_interrupt_subgraph() {
    let r = runner(double_interrupt_graph()).await;
    let cfg = || RunConfig::thread("sub").stream(StreamMode::Updates);
    let (events, _) = stream_run(
        &r,
        input(DocUpdate::new().status("test".to_string())),
        cfg(),
    )
    .await;
    assert!(root_updates(&events).is_empty());
    assert_eq!(interrupt_values(&events), vec!["interrupt node 1"]);
    let (events, _) = stream_run(&r, RunInput::resume("123".into()), cfg()).await;
    let updates = root_updates(&events);
    assert_eq!(updates.len(), 1);
    assert_eq!(updates[0].0, "node_1");
    assert_eq!(updates[0].1.status.as_deref(), Some("123"));
    assert_eq!(interrupt_values(&events), vec!["interrupt node 2"]);
    assert_eq!(events.last().map(StreamEvent::kind), Some("interrupt"));
    let (events, _) = stream_run(&r, RunInput::resume("123".into()), cfg()).await;
    let updates = root_updates(&events);
    assert_eq!(updates.len(), 1);
    assert_eq!(updates[0].0, "node_2");
    assert!(interrupt_values(&events).is_empty());

    let parent = StateGraph::<Doc>::new("parent")
        .add_subgraph("invoke_sub_agent", double_interrupt_graph())
        .add_edge(START, "invoke_sub_agent")
        .add_edge("invoke_sub_agent", END)
        .compile()
        .unwrap();
    let r = runner(parent).await;
    let cfg = || RunConfig::thread("parent").stream(StreamMode::Updates);
    let (events, out) = stream_run(
        &r,
        input(DocUpdate::new().status("test".to_string())),
        cfg(),
    )
    .await;
    assert!(root_updates(&events).is_empty());
    assert_eq!(interrupt_values(&events), vec!["interrupt node 1"]);
    assert_eq!(out.interrupts[0].node, "invoke_sub_agent/node_1");
    let (events, out) = stream_run(&r, RunInput::resume("true".into()), cfg()).await;
    assert!(root_updates(&events).is_empty(), "{events:?}");
    assert_eq!(interrupt_values(&events), vec!["interrupt node 2"]);
    assert_eq!(out.interrupts[0].node, "invoke_sub_agent/node_2");
    let (events, out) = stream_run(&r, RunInput::resume("true".into()), cfg()).await;
    let updates = root_updates(&events);
    assert_eq!(updates.len(), 1, "{updates:?}");
    assert_eq!(updates[0].0, "invoke_sub_agent");
    assert_eq!(updates[0].1.status.as_deref(), Some("true"));
    assert_eq!(out.state.status, "true");
}

/// LangGraph's `test_nested_graph_interrupts_parallel` graph: `inner` (a subgraph stopping
/// before `inner_2`) and `outer_1` run in parallel from START; `outer_2` waits for both.
fn nested_parallel_graph(
    before: &[&str],
    after: &[&str],
    outer_1_runs: Arc<AtomicU32>,
) -> CompiledGraph<Doc> {
    let inner = StateGraph::<Doc>::new("inner")
        .add_node("inner_1", |_s, _c| async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok(log("got here"))
        })
        .add_node("inner_2", |_s, _c| async { Ok(log("and there")) })
        .add_edge(START, "inner_1")
        .add_edge("inner_1", "inner_2")
        .add_edge("inner_2", END)
        .interrupt_before(["inner_2"])
        .compile()
        .unwrap();
    StateGraph::<Doc>::new("outer")
        .add_subgraph("inner", inner)
        .add_node("outer_1", move |_s, _c| {
            outer_1_runs.fetch_add(1, Ordering::SeqCst);
            async { Ok(log("and parallel")) }
        })
        .add_node("outer_2", |_s, _c| async { Ok(log("and back again")) })
        .add_edge(START, "inner")
        .add_edge(START, "outer_1")
        .add_join(["inner", "outer_1"], "outer_2")
        .add_edge("outer_2", END)
        .interrupt_before(before.iter().copied())
        .interrupt_after(after.iter().copied())
        .compile()
        .unwrap()
}

const ALL_FOUR: [&str; 4] = ["got here", "and there", "and parallel", "and back again"];

// LangGraph `test_nested_graph_interrupts_parallel`, what a run resumed past the inner
// breakpoint shows: `invoke(None)` returns `"got here and there and parallel and back again"`
// (`outer_1` is not run again: its write was saved). In *values* mode a resumed run streams
// the state it resumes from and then one state per step: `["", "got here and there and
// parallel", "... and back again"]`; with `interrupt_before=["outer_1"]` the first run streams
// `[""]` and the last `["", "got here ... parallel", "... back again"]`; with
// `interrupt_after=["outer_1"]` the second run streams `["", "got here ... parallel"]` and
// the third `["got here ... parallel", "... back again"]`. (What the runs that stop in the
// middle of the parallel step show is in `interrupted_parallel_step_shows_finished_writes`.)
#[tokio::test]
async fn nested_graph_interrupts_parallel() {
    let outer_1_runs = counter();
    let r = runner(nested_parallel_graph(&[], &[], outer_1_runs.clone())).await;
    let cfg = || RunConfig::thread("1");
    let out = r.invoke(input(DocUpdate::new()), cfg()).await.unwrap();
    assert_eq!(out.status, RunStatus::Interrupted);
    let out = r.invoke(RunInput::Continue, cfg()).await.unwrap();
    assert_eq!(out.status, RunStatus::Done);
    assert_eq!(out.state.log, ALL_FOUR);
    assert_eq!(outer_1_runs.load(Ordering::SeqCst), 1);

    let values = || RunConfig::thread("3").stream(StreamMode::Values);
    stream_run(&r, input(DocUpdate::new()), values()).await;
    let (events, _) = stream_run(&r, RunInput::Continue, values()).await;
    assert_eq!(
        logs(&root_values(&events)),
        vec![vec![], ALL_FOUR[..3].to_vec(), ALL_FOUR.to_vec()]
    );

    let r = runner(nested_parallel_graph(&["outer_1"], &[], counter())).await;
    let values = || RunConfig::thread("4").stream(StreamMode::Values);
    let (events, _) = stream_run(&r, input(DocUpdate::new()), values()).await;
    assert_eq!(logs(&root_values(&events)), vec![Vec::<String>::new()]);
    let (_, out) = stream_run(&r, RunInput::Continue, values()).await;
    assert_eq!(out.status, RunStatus::Interrupted);
    let (events, out) = stream_run(&r, RunInput::Continue, values()).await;
    assert_eq!(
        logs(&root_values(&events)),
        vec![vec![], ALL_FOUR[..3].to_vec(), ALL_FOUR.to_vec()]
    );
    assert_eq!(out.status, RunStatus::Done);

    let r = runner(nested_parallel_graph(&[], &["outer_1"], counter())).await;
    let values = || RunConfig::thread("5").stream(StreamMode::Values);
    let (_, out) = stream_run(&r, input(DocUpdate::new()), values()).await;
    assert_eq!(out.status, RunStatus::Interrupted);
    let (events, out) = stream_run(&r, RunInput::Continue, values()).await;
    assert_eq!(
        logs(&root_values(&events)),
        vec![vec![], ALL_FOUR[..3].to_vec()]
    );
    assert_eq!(out.status, RunStatus::Interrupted, "no stop after outer_1");
    let (events, out) = stream_run(&r, RunInput::Continue, values()).await;
    assert_eq!(
        logs(&root_values(&events)),
        vec![ALL_FOUR[..3].to_vec(), ALL_FOUR.to_vec()]
    );
    assert_eq!(out.status, RunStatus::Done);
}

// LangGraph `test_nested_graph_interrupts_parallel`, the runs that stop in the middle of the
// parallel step (`outer_1` finished, `inner` stopped at its breakpoint): `invoke` returns
// `{"my_key": " and parallel"}`, the finished sibling's write applied, and in *values* mode the
// run streams that state after the state it started from: `["", " and parallel"]` (with no
// breakpoint in the parent, with `interrupt_after=["outer_1"]` on the first run, and with
// `interrupt_before=["outer_1"]` on the second).
#[tokio::test]
async fn interrupted_parallel_step_shows_finished_writes() {
    let r = runner(nested_parallel_graph(&[], &[], counter())).await;
    let out = r
        .invoke(input(DocUpdate::new()), RunConfig::thread("1"))
        .await
        .unwrap();
    assert_eq!(out.state.log, vec!["and parallel"]);
    // What get_state shows here already.
    assert_eq!(
        r.get_state("1", None).await.unwrap().values.log,
        vec!["and parallel"]
    );
    let parallel = vec![vec![], strings(&["and parallel"])];

    let values = || RunConfig::thread("3").stream(StreamMode::Values);
    let (events, _) = stream_run(&r, input(DocUpdate::new()), values()).await;
    assert_eq!(logs(&root_values(&events)), parallel);

    let r = runner(nested_parallel_graph(&[], &["outer_1"], counter())).await;
    let values = || RunConfig::thread("5").stream(StreamMode::Values);
    let (events, _) = stream_run(&r, input(DocUpdate::new()), values()).await;
    assert_eq!(logs(&root_values(&events)), parallel);

    let r = runner(nested_parallel_graph(&["outer_1"], &[], counter())).await;
    let values = || RunConfig::thread("4").stream(StreamMode::Values);
    stream_run(&r, input(DocUpdate::new()), values()).await;
    let (events, _) = stream_run(&r, RunInput::Continue, values()).await;
    assert_eq!(logs(&root_values(&events)), parallel);
}

/// `(namespace's first segment, node, log entries)` of every *updates* chunk.
fn updates_by_namespace(events: &[StreamEvent<Doc>]) -> Vec<(String, String, Vec<String>)> {
    events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::Updates {
                namespace,
                node,
                update,
                ..
            } => Some((
                namespace.split(':').next().unwrap_or("").to_string(),
                node.to_string(),
                update.log.clone().unwrap_or_default(),
            )),
            _ => None,
        })
        .collect()
}

// LangGraph `test_nested_graph_interrupts_parallel`, the updates stream (`subgraphs=True`),
// content: the first run streams `outer_1`'s update in the root namespace, `inner_1`'s in the
// `inner:` namespace, and ends with the interrupt; the resumed run streams, in the root
// namespace, `outer_1`'s update again (marked cached: its write was saved and the node is not
// run again), `inner`'s (`"got here and there"`, one chunk for the subgraph) and `outer_2`'s.
// The order of these chunks is in `nested_graph_interrupts_parallel_updates_order`.
#[tokio::test]
async fn nested_graph_interrupts_parallel_updates_stream() {
    let outer_1_runs = counter();
    let r = runner(nested_parallel_graph(&[], &[], outer_1_runs.clone())).await;
    let cfg = || RunConfig::thread("2").stream(StreamMode::Updates);
    let (events, _) = stream_run(&r, input(DocUpdate::new()), cfg()).await;
    let mut updates = updates_by_namespace(&events);
    updates.sort();
    assert_eq!(
        updates,
        vec![
            (String::new(), "outer_1".into(), strings(&["and parallel"])),
            ("inner".into(), "inner_1".into(), strings(&["got here"])),
        ]
    );
    assert_eq!(events.last().map(StreamEvent::kind), Some("interrupt"));

    let (events, _) = stream_run(&r, RunInput::Continue, cfg()).await;
    let mut root: Vec<(String, Vec<String>)> = root_updates(&events)
        .into_iter()
        .map(|(n, u)| (n, u.log.unwrap_or_default()))
        .collect();
    root.sort();
    assert_eq!(
        root,
        vec![
            ("inner".into(), strings(&["got here", "and there"])),
            ("outer_1".into(), strings(&["and parallel"])),
            ("outer_2".into(), strings(&["and back again"])),
        ]
    );
    assert_eq!(outer_1_runs.load(Ordering::SeqCst), 1);
}

// LangGraph `test_nested_graph_interrupts_parallel`, the updates stream's order: chunks come as
// tasks finish, so the first run streams `outer_1` (which finishes first: `inner_1` sleeps)
// before the subgraph's `inner_1`; the resumed run streams the saved `outer_1` update first,
// then `inner`, then `outer_2`.
#[tokio::test]
#[ignore = "differs (documented): updates events come at the step's barrier in plan order, so a subgraph's inner steps come before a sibling's update and a saved update is replayed in plan order"]
async fn nested_graph_interrupts_parallel_updates_order() {
    let r = runner(nested_parallel_graph(&[], &[], counter())).await;
    let cfg = || RunConfig::thread("2").stream(StreamMode::Updates);
    let (events, _) = stream_run(&r, input(DocUpdate::new()), cfg()).await;
    assert_eq!(
        updates_by_namespace(&events),
        vec![
            (String::new(), "outer_1".into(), strings(&["and parallel"])),
            ("inner".into(), "inner_1".into(), strings(&["got here"])),
        ]
    );
    let (events, _) = stream_run(&r, RunInput::Continue, cfg()).await;
    let root: Vec<String> = root_updates(&events).into_iter().map(|(n, _)| n).collect();
    assert_eq!(root, vec!["outer_1", "inner", "outer_2"]);
}

/// LangGraph's `test_doubly_nested_graph_interrupts` graph: `parent_1 -> child -> parent_2`,
/// where `child` is a graph whose one node `child_1` is a grandchild graph that stops before
/// `grandchild_2`.
fn doubly_nested_graph() -> CompiledGraph<Doc> {
    let grandchild = StateGraph::<Doc>::new("grandchild")
        .add_node("grandchild_1", |s: Arc<Doc>, _c| async move {
            Ok(DocUpdate::new().status(format!("{} here", s.status)))
        })
        .add_node("grandchild_2", |s: Arc<Doc>, _c| async move {
            Ok(DocUpdate::new().status(format!("{} and there", s.status)))
        })
        .add_edge(START, "grandchild_1")
        .add_edge("grandchild_1", "grandchild_2")
        .add_edge("grandchild_2", END)
        .interrupt_before(["grandchild_2"])
        .compile()
        .unwrap();
    let child = StateGraph::<Doc>::new("child")
        .add_subgraph("child_1", grandchild)
        .add_edge(START, "child_1")
        .add_edge("child_1", END)
        .compile()
        .unwrap();
    StateGraph::<Doc>::new("parent")
        .add_node("parent_1", |s: Arc<Doc>, _c| async move {
            Ok(DocUpdate::new().status(format!("hi {}", s.status)))
        })
        .add_subgraph("child", child)
        .add_node("parent_2", |s: Arc<Doc>, _c| async move {
            Ok(DocUpdate::new().status(format!("{} and back again", s.status)))
        })
        .add_edge(START, "parent_1")
        .add_edge("parent_1", "child")
        .add_edge("child", "parent_2")
        .add_edge("parent_2", END)
        .compile()
        .unwrap()
}

// LangGraph `test_doubly_nested_graph_interrupts`: a breakpoint two subgraphs down stops the
// whole run. `invoke({"my_key": "my value"})` returns `"hi my value"`; `invoke(None)` returns
// `"hi my value here and there and back again"`. In *updates* mode the runs stream
// `[{"parent_1": "hi my value"}, interrupt]` and `[{"child": "hi my value here and there"},
// {"parent_2": "... and back again"}]`; in *values* mode `["my value", "hi my value"]` and
// `["hi my value", "hi my value here and there", "... and back again"]`.
#[tokio::test]
async fn doubly_nested_graph_interrupts() {
    let r = runner(doubly_nested_graph()).await;
    let start = || input(DocUpdate::new().status("my value".to_string()));
    let out = r.invoke(start(), RunConfig::thread("1")).await.unwrap();
    assert_eq!(out.status, RunStatus::Interrupted);
    assert_eq!(out.state.status, "hi my value");
    let out = r
        .invoke(RunInput::Continue, RunConfig::thread("1"))
        .await
        .unwrap();
    assert_eq!(
        out.state.status,
        "hi my value here and there and back again"
    );

    let cfg = || RunConfig::thread("2").stream(StreamMode::Updates);
    let (events, _) = stream_run(&r, start(), cfg()).await;
    let updates: Vec<(String, String)> = root_updates(&events)
        .into_iter()
        .map(|(n, u)| (n, u.status.unwrap_or_default()))
        .collect();
    assert_eq!(updates, vec![("parent_1".into(), "hi my value".into())]);
    assert_eq!(events.last().map(StreamEvent::kind), Some("interrupt"));
    let (events, _) = stream_run(&r, RunInput::Continue, cfg()).await;
    let updates: Vec<(String, String)> = root_updates(&events)
        .into_iter()
        .map(|(n, u)| (n, u.status.unwrap_or_default()))
        .collect();
    assert_eq!(
        updates,
        vec![
            ("child".into(), "hi my value here and there".into()),
            (
                "parent_2".into(),
                "hi my value here and there and back again".into()
            ),
        ]
    );

    let cfg = || RunConfig::thread("3").stream(StreamMode::Values);
    let (events, _) = stream_run(&r, start(), cfg()).await;
    assert_eq!(
        statuses(&root_values(&events)),
        vec!["my value", "hi my value"]
    );
    let (events, _) = stream_run(&r, RunInput::Continue, cfg()).await;
    assert_eq!(
        statuses(&root_values(&events)),
        vec![
            "hi my value",
            "hi my value here and there",
            "hi my value here and there and back again"
        ]
    );
}

/// LangGraph's `test_parallel_interrupts` graph: START sends each prompt to `child_graph`, a
/// subgraph whose one node interrupts with the prompt and appends the answer; `cleanup` runs
/// after the children.
fn parallel_interrupts_graph() -> CompiledGraph<Doc> {
    let child = StateGraph::<Doc>::new("child")
        .add_node("get_human_input", |s: Arc<Doc>, ctx: Ctx| async move {
            let answer: String = ctx.interrupt(s.status.clone())?;
            Ok(DocUpdate::new().answers(vec![answer]))
        })
        .add_edge(START, "get_human_input")
        .add_edge("get_human_input", END)
        .compile()
        .unwrap();
    StateGraph::<Doc>::new("parent")
        .add_subgraph("child_graph", child)
        .add_node("cleanup", |s: Arc<Doc>, _c| async move {
            assert_eq!(s.answers.len(), 2, "cleanup before both children answered");
            Ok(())
        })
        .add_conditional_edges(
            START,
            |_s: &Doc| {
                ["a", "b"]
                    .iter()
                    .map(|p| SendTo::new("child_graph", doc_with(0, p)))
                    .collect::<Vec<_>>()
            },
            ["child_graph"],
        )
        .add_edge("child_graph", "cleanup")
        .add_edge("cleanup", END)
        .compile()
        .unwrap()
}

fn interrupt_id(out: &RunOutcome<Doc>, value: &str) -> String {
    out.interrupts
        .iter()
        .find(|i| i.value.0 == value)
        .unwrap()
        .id
        .clone()
}

// LangGraph `test_parallel_interrupts`: two sends to a subgraph that interrupts. The first run
// streams two interrupts ("a" and "b"). Answering one (current LangGraph needs the interrupt's
// id when several are pending) streams that child's update (`{"child_graph": {"human_inputs":
// ["Resume #1"]}}`) and the other child's interrupt again; answering the other completes the
// run (`cleanup` asserts it sees both answers) and streams three chunks: the first child's
// update again (marked `cached`: its write was saved in the run before), the second child's
// and `{"cleanup": None}`.
#[tokio::test]
async fn parallel_interrupts() {
    let r = runner(parallel_interrupts_graph()).await;
    let cfg = || RunConfig::thread("1").stream(StreamMode::Updates);
    let (events, out) = stream_run(&r, input(DocUpdate::new()), cfg()).await;
    let mut asked = interrupt_values(&events);
    asked.sort_by_key(|v| v.to_string());
    assert_eq!(asked, vec!["a", "b"]);
    assert!(root_updates(&events).is_empty());
    let a = interrupt_id(&out, "a");

    let (events, out) = stream_run(
        &r,
        RunInput::Resume(Resume::by_id([(a, serde_json::json!("Resume #1"))])),
        cfg(),
    )
    .await;
    let updates = root_updates(&events);
    assert_eq!(updates.len(), 1, "{updates:?}");
    assert_eq!(updates[0].0, "child_graph");
    assert_eq!(updates[0].1.answers, Some(strings(&["Resume #1"])));
    assert_eq!(interrupt_values(&events), vec!["b"]);
    let b = interrupt_id(&out, "b");

    let (events, out) = stream_run(
        &r,
        RunInput::Resume(Resume::by_id([(b, serde_json::json!("Resume #2"))])),
        cfg(),
    )
    .await;
    assert_eq!(out.status, RunStatus::Done);
    assert_eq!(out.state.answers, vec!["Resume #1", "Resume #2"]);
    let updates: Vec<(String, Vec<String>)> = root_updates(&events)
        .into_iter()
        .map(|(n, u)| (n, u.answers.unwrap_or_default()))
        .collect();
    assert_eq!(
        updates,
        vec![
            ("child_graph".into(), strings(&["Resume #1"])),
            ("child_graph".into(), strings(&["Resume #2"])),
            ("cleanup".into(), vec![]),
        ]
    );
}

// ================================================================ waiting edges

#[derive(State, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct Query {
    query: String,
    answer: String,
    #[reducer(with = sorted_add)]
    docs: Vec<String>,
}

fn sorted_add(current: &mut Vec<String>, update: Vec<String>) {
    current.extend(update);
    current.sort();
}

fn fan_out_graph(before: &[&str], after: &[&str]) -> CompiledGraph<Query> {
    StateGraph::<Query>::new("fan-out")
        .add_node("rewrite_query", |s: Arc<Query>, _c| async move {
            Ok(QueryUpdate::new().query(format!("query: {}", s.query)))
        })
        .add_node("analyzer_one", |s: Arc<Query>, _c| async move {
            Ok(QueryUpdate::new().query(format!("analyzed: {}", s.query)))
        })
        .add_node("retriever_one", |_s, _c| async {
            Ok(QueryUpdate::new().docs(strings(&["doc1", "doc2"])))
        })
        .add_node("retriever_two", |_s, _c| async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok(QueryUpdate::new().docs(strings(&["doc3", "doc4"])))
        })
        .add_node("qa", |s: Arc<Query>, _c| async move {
            Ok(QueryUpdate::new().answer(s.docs.join(",")))
        })
        .add_edge(START, "rewrite_query")
        .add_edge("rewrite_query", "analyzer_one")
        .add_edge("analyzer_one", "retriever_one")
        .add_edge("rewrite_query", "retriever_two")
        .add_join(["retriever_one", "retriever_two"], "qa")
        .add_edge("qa", END)
        .interrupt_before(before.iter().copied())
        .interrupt_after(after.iter().copied())
        .compile()
        .unwrap()
}

fn query_updates(events: &[StreamEvent<Query>]) -> Vec<(String, QueryUpdate)> {
    root_updates(events)
}

fn weather() -> RunInput<Query> {
    RunInput::Update(QueryUpdate::new().query("what is weather in sf".to_string()))
}

fn expected_fan_out_updates() -> Vec<(String, QueryUpdate)> {
    vec![
        (
            "rewrite_query".into(),
            QueryUpdate::new().query("query: what is weather in sf".to_string()),
        ),
        (
            "analyzer_one".into(),
            QueryUpdate::new().query("analyzed: query: what is weather in sf".to_string()),
        ),
        (
            "retriever_two".into(),
            QueryUpdate::new().docs(strings(&["doc3", "doc4"])),
        ),
        (
            "retriever_one".into(),
            QueryUpdate::new().docs(strings(&["doc1", "doc2"])),
        ),
    ]
}

fn same_updates(actual: &[(String, QueryUpdate)], expected: &[(String, QueryUpdate)]) {
    let show = |v: &[(String, QueryUpdate)]| {
        v.iter()
            .map(|(n, u)| format!("{n}: {}", serde_json::to_string(u).unwrap()))
            .collect::<Vec<_>>()
    };
    assert_eq!(show(actual), show(expected));
}

// LangGraph `test_in_one_fan_out_state_graph_waiting_edge`: `rewrite_query` fans out to
// `analyzer_one -> retriever_one` and to `retriever_two`; `qa` waits for both retrievers.
// The result is `docs == [doc1..doc4]`, `answer == "doc1,doc2,doc3,doc4"`, and the updates
// stream is rewrite_query, analyzer_one, retriever_two, retriever_one, qa. With
// `interrupt_after=["retriever_one"]` the stream stops after retriever_one and `stream(None)`
// yields only qa. With `interrupt_before=["qa"]`, `update_state(config, {"docs": ["doc5"]})`
// keeps `next == ("qa",)` and adds doc5, and `stream(None)` yields qa with
// `"doc1,doc2,doc3,doc4,doc5"`.
#[tokio::test]
async fn in_one_fan_out_state_graph_waiting_edge() {
    let r = runner(fan_out_graph(&[], &[])).await;
    let out = r.invoke(weather(), RunConfig::thread("0")).await.unwrap();
    assert_eq!(out.state.query, "analyzed: query: what is weather in sf");
    assert_eq!(out.state.docs, strings(&["doc1", "doc2", "doc3", "doc4"]));
    assert_eq!(out.state.answer, "doc1,doc2,doc3,doc4");
    let (events, _) = stream_run(
        &r,
        weather(),
        RunConfig::thread("s").stream(StreamMode::Updates),
    )
    .await;
    let mut expected = expected_fan_out_updates();
    expected.push((
        "qa".into(),
        QueryUpdate::new().answer("doc1,doc2,doc3,doc4".to_string()),
    ));
    same_updates(&query_updates(&events), &expected);

    let r = runner(fan_out_graph(&[], &["retriever_one"])).await;
    let cfg = || RunConfig::thread("1").stream(StreamMode::Updates);
    let (events, out) = stream_run(&r, weather(), cfg()).await;
    same_updates(&query_updates(&events), &expected_fan_out_updates());
    assert_eq!(events.last().map(StreamEvent::kind), Some("interrupt"));
    assert_eq!(out.status, RunStatus::Interrupted);
    let (events, _) = stream_run(&r, RunInput::Continue, cfg()).await;
    same_updates(
        &query_updates(&events),
        &[(
            "qa".into(),
            QueryUpdate::new().answer("doc1,doc2,doc3,doc4".to_string()),
        )],
    );

    let r = runner(fan_out_graph(&["qa"], &[])).await;
    let cfg = || RunConfig::thread("2").stream(StreamMode::Updates);
    let (events, _) = stream_run(&r, weather(), cfg()).await;
    same_updates(&query_updates(&events), &expected_fan_out_updates());
    assert_eq!(events.last().map(StreamEvent::kind), Some("interrupt"));
    r.update_state("2", QueryUpdate::new().docs(strings(&["doc5"])), None)
        .await
        .unwrap();
    let state = r.get_state("2", None).await.unwrap();
    assert_eq!(state.values.query, "analyzed: query: what is weather in sf");
    assert_eq!(
        state.values.docs,
        strings(&["doc1", "doc2", "doc3", "doc4", "doc5"])
    );
    assert_eq!(state.next, vec!["qa"]);
    let (events, _) = stream_run(&r, RunInput::Continue, cfg()).await;
    same_updates(
        &query_updates(&events),
        &[(
            "qa".into(),
            QueryUpdate::new().answer("doc1,doc2,doc3,doc4,doc5".to_string()),
        )],
    );
}

// ================================================================ commands

#[derive(State, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct PlanState {
    plan: Option<Vec<Vec<String>>>,
    #[reducer(append)]
    messages: Vec<String>,
}

// LangGraph `test_multistep_plan`: `planner` makes the plan `["step1", ["step2", "step3"],
// "step4"]` and, each time it runs, returns `Command(goto=<next entry>, update={"plan": rest})`
// (a list entry is a goto list: both steps run in one step); each step appends its name and
// goes back to `planner`, which runs once after the parallel pair. The result is `messages ==
// ["start", "step1", "step2", "step3", "step4"]`, `plan == []`.
#[tokio::test]
async fn multistep_plan() {
    let steps = ["step1", "step2", "step3", "step4"];
    let mut g = StateGraph::<PlanState>::new("plan")
        .add_node_with(
            "planner",
            |s: Arc<PlanState>, _c| async move {
                let plan = s.plan.clone().unwrap_or_else(|| {
                    vec![
                        strings(&["step1"]),
                        strings(&["step2", "step3"]),
                        strings(&["step4"]),
                    ]
                });
                let Some((next, rest)) = plan.split_first() else {
                    return Ok(Command::new());
                };
                let mut command =
                    Command::new().update(PlanStateUpdate::new().plan(Some(rest.to_vec())));
                for step in next {
                    command = command.goto(step.clone());
                }
                Ok(command)
            },
            NodeOptions::new().destinations(steps.iter().copied().chain([END])),
        )
        .add_edge(START, "planner");
    for step in steps {
        g = g.add_node_with(
            step,
            move |_s, _c| async move {
                Ok(Command::new()
                    .update(PlanStateUpdate::new().messages(strings(&[step])))
                    .goto("planner"))
            },
            NodeOptions::new().destinations(["planner"]),
        );
    }
    let out = runner(g.compile().unwrap())
        .await
        .invoke(
            RunInput::Update(PlanStateUpdate::new().messages(strings(&["start"]))),
            RunConfig::thread("1"),
        )
        .await
        .unwrap();
    assert_eq!(out.status, RunStatus::Done);
    assert_eq!(
        out.state.messages,
        vec!["start", "step1", "step2", "step3", "step4"]
    );
    assert_eq!(out.state.plan, Some(vec![]));
}

/// LangGraph's `test_parent_command_goto_deeply_nested` graph: `child_1 -> child_2`, where
/// `child_2` is `sub_child_1 -> sub_child_2`, and `sub_child_2` is a graph whose one node
/// sends `Command(graph=PARENT, goto="sub_child_3")`.
fn deeply_nested_graph() -> CompiledGraph<Doc> {
    let sub_sub = StateGraph::<Doc>::new("sub_sub_graph")
        .add_node_with(
            "sub_sub_child",
            |_s, _c| async {
                Ok(Command::new()
                    .update(log("sub_sub_child"))
                    .goto("sub_child_3")
                    .to_parent())
            },
            NodeOptions::new().destinations([END]),
        )
        .add_edge(START, "sub_sub_child")
        .compile()
        .unwrap();
    let sub = StateGraph::<Doc>::new("sub_graph")
        .add_node("sub_child_1", |_s, _c| async { Ok(log("sub_child_1")) })
        .add_subgraph_with(
            "sub_child_2",
            sub_sub,
            NodeOptions::new().destinations(["sub_child_3"]),
        )
        .add_node("sub_child_3", |_s, _c| async { Ok(log("sub_child_3")) })
        .add_edge(START, "sub_child_1")
        .add_edge("sub_child_1", "sub_child_2")
        .add_edge("sub_child_3", END)
        .compile()
        .unwrap();
    StateGraph::<Doc>::new("main_graph")
        .add_node("child_1", |_s, _c| async { Ok(log("child_1")) })
        .add_subgraph("child_2", sub)
        .add_edge(START, "child_1")
        .add_edge("child_1", "child_2")
        .add_edge("child_2", END)
        .compile()
        .unwrap()
}

// LangGraph `test_parent_command_goto_deeply_nested`: `Command.PARENT` three levels down goes
// to the *immediate* parent (`sub_graph`), where `sub_child_3` runs after the update. The parts
// of LangGraph's result that do not depend on how a subgraph's output is merged: it starts
// with `["init", "child_1"]` and ends with `["sub_child_1", "sub_sub_child", "sub_child_3"]`.
#[tokio::test]
async fn parent_command_goto_reaches_the_immediate_parent() {
    let out = runner(deeply_nested_graph())
        .await
        .invoke(input(log("init")), RunConfig::thread("1"))
        .await
        .unwrap();
    assert_eq!(out.status, RunStatus::Done);
    assert!(out.state.log.starts_with(&strings(&["init", "child_1"])));
    assert!(
        out.state
            .log
            .ends_with(&strings(&["sub_child_1", "sub_sub_child", "sub_child_3"])),
        "{:?}",
        out.state.log
    );
}

// LangGraph `test_parent_command_goto_deeply_nested`, the whole result: `["init", "child_1",
// "init", "child_1", "sub_child_1", "sub_sub_child", "sub_child_3"]`. The input and child_1
// appear twice because a subgraph returns its final state, which the parent merges again with
// its `operator.add` reducer.
#[tokio::test]
#[ignore = "differs (documented): a subgraph's output is the writes its nodes made, not its final state"]
async fn parent_command_goto_deeply_nested() {
    let out = runner(deeply_nested_graph())
        .await
        .invoke(input(log("init")), RunConfig::thread("1"))
        .await
        .unwrap();
    assert_eq!(
        out.state.log,
        vec![
            "init",
            "child_1",
            "init",
            "child_1",
            "sub_child_1",
            "sub_sub_child",
            "sub_child_3"
        ]
    );
}

// ================================================================ checkpointer errors

#[derive(Clone, Copy, PartialEq)]
enum Fault {
    Get,
    Put,
    PutWrites,
}

/// A `MemorySaver` whose `get`, `put` or `put_writes` fails (LangGraph's
/// `FaultyGetCheckpointer`, `FaultyPutCheckpointer` and `FaultyPutWritesCheckpointer`).
struct FaultySaver {
    inner: MemorySaver,
    fault: Fault,
}

type BoxFut<'a, T> = Pin<Box<dyn Future<Output = Result<T, CheckpointError>> + Send + 'a>>;

impl FaultySaver {
    fn fail<'a, T: 'a>(&self, fault: Fault, what: &str) -> Option<BoxFut<'a, T>> {
        (self.fault == fault).then(|| {
            let message = format!("Faulty {what}");
            Box::pin(async move {
                Err(CheckpointError::Backend {
                    message,
                    source: None,
                })
            }) as BoxFut<'a, T>
        })
    }
}

impl CheckpointSaver for FaultySaver {
    fn put<'l0, 'at>(&'l0 self, record: CheckpointRecord) -> BoxFut<'at, ()>
    where
        'l0: 'at,
        Self: 'at,
    {
        self.fail(Fault::Put, "put")
            .unwrap_or_else(|| self.inner.put(record))
    }

    fn put_writes<'l0, 'l1, 'l2, 'at>(
        &'l0 self,
        thread_id: &'l1 str,
        checkpoint_id: &'l2 str,
        writes: Vec<PendingWrite>,
    ) -> BoxFut<'at, ()>
    where
        'l0: 'at,
        'l1: 'at,
        'l2: 'at,
        Self: 'at,
    {
        self.fail(Fault::PutWrites, "put_writes")
            .unwrap_or_else(|| self.inner.put_writes(thread_id, checkpoint_id, writes))
    }

    fn get<'l0, 'l1, 'l2, 'at>(
        &'l0 self,
        thread_id: &'l1 str,
        checkpoint_id: Option<&'l2 str>,
    ) -> BoxFut<'at, Option<CheckpointRecord>>
    where
        'l0: 'at,
        'l1: 'at,
        'l2: 'at,
        Self: 'at,
    {
        self.fail(Fault::Get, "get_tuple")
            .unwrap_or_else(|| self.inner.get(thread_id, checkpoint_id))
    }

    fn get_writes<'l0, 'l1, 'l2, 'at>(
        &'l0 self,
        thread_id: &'l1 str,
        checkpoint_id: &'l2 str,
    ) -> BoxFut<'at, Vec<PendingWrite>>
    where
        'l0: 'at,
        'l1: 'at,
        'l2: 'at,
        Self: 'at,
    {
        self.inner.get_writes(thread_id, checkpoint_id)
    }

    fn list<'l0, 'l1, 'l2, 'at>(
        &'l0 self,
        thread_id: &'l1 str,
        before: Option<&'l2 str>,
        limit: Option<usize>,
    ) -> BoxFut<'at, Vec<CheckpointRecord>>
    where
        'l0: 'at,
        'l1: 'at,
        'l2: 'at,
        Self: 'at,
    {
        self.inner.list(thread_id, before, limit)
    }

    fn put_thread<'l0, 'at>(&'l0 self, info: ThreadInfo) -> BoxFut<'at, ()>
    where
        'l0: 'at,
        Self: 'at,
    {
        self.inner.put_thread(info)
    }

    fn get_thread<'l0, 'l1, 'at>(&'l0 self, thread_id: &'l1 str) -> BoxFut<'at, Option<ThreadInfo>>
    where
        'l0: 'at,
        'l1: 'at,
        Self: 'at,
    {
        self.inner.get_thread(thread_id)
    }

    fn list_threads<'l0, 'at>(
        &'l0 self,
        status: Option<ThreadStatus>,
    ) -> BoxFut<'at, Vec<ThreadInfo>>
    where
        'l0: 'at,
        Self: 'at,
    {
        self.inner.list_threads(status)
    }

    fn delete_thread<'l0, 'l1, 'at>(&'l0 self, thread_id: &'l1 str) -> BoxFut<'at, bool>
    where
        'l0: 'at,
        'l1: 'at,
        Self: 'at,
    {
        self.inner.delete_thread(thread_id)
    }

    fn delete_before<'l0, 'l1, 'l2, 'at>(
        &'l0 self,
        thread_id: &'l1 str,
        checkpoint_id: &'l2 str,
    ) -> BoxFut<'at, usize>
    where
        'l0: 'at,
        'l1: 'at,
        'l2: 'at,
        Self: 'at,
    {
        self.inner.delete_before(thread_id, checkpoint_id)
    }
}

// LangGraph `test_checkpoint_errors`: a checkpointer whose `get_tuple`, `put` or (with a
// parallel node, so that a task's writes are saved before the step ends) `put_writes` raises
// makes `invoke` raise that error ("Faulty get_tuple", "Faulty put", "Faulty put_writes").
#[tokio::test]
async fn checkpoint_errors() {
    let build = |parallel: bool| {
        let mut g = StateGraph::<Doc>::new("faulty")
            .add_node("agent", |_s, _c| async { Ok(log("agent")) })
            .add_edge(START, "agent")
            .add_edge("agent", END);
        if parallel {
            g = g
                .add_node("parallel", |_s, _c| async { Ok(log("parallel")) })
                .add_edge(START, "parallel")
                .add_edge("parallel", END);
        }
        g.compile().unwrap()
    };
    for (fault, parallel, message) in [
        (Fault::Get, false, "Faulty get_tuple"),
        (Fault::Put, false, "Faulty put"),
        (Fault::PutWrites, true, "Faulty put_writes"),
    ] {
        let r = Runtime::new()
            .await
            .unwrap()
            .load(build(parallel))
            .await
            .unwrap()
            .with_checkpointer(Arc::new(FaultySaver {
                inner: MemorySaver::new(),
                fault,
            }));
        let err = r
            .invoke(input(DocUpdate::new()), RunConfig::thread("thread-1"))
            .await
            .unwrap_err();
        assert!(err.to_string().contains(message), "{message}: {err}");
    }
}
