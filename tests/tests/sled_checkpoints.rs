//! The sled saver on a real database on disk: everything the semantics suite does with the
//! in-memory saver (interrupts, resume, failures with pending writes, history, `update_state`,
//! replay, fork, prune) across a close and reopen of the database in a new runtime; the raw
//! saver contract; corruption as a typed error; hundreds of concurrent runs; and flat bytes
//! per step for a long chat.

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use ferrograph::checkpoint_savers::{SledSaver, CHECKPOINTS_TREE, THREADS_TREE, THREAD_RECORD};
use ferrograph::core::checkpoint::{
    CheckpointRecord, CheckpointSource, CodecError, PendingKind, PendingWrite,
};
use ferrograph::prelude::*;
use ferrograph::{CheckpointError, CheckpointSaver, RunStatus, ThreadInfo, ThreadStatus};
use ferrograph_tests::{log, Doc, DocUpdate};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn input(u: DocUpdate) -> RunInput<Doc> {
    RunInput::Update(u)
}

async fn runner_on(
    graph: CompiledGraph<Doc>,
    saver: Arc<SledSaver>,
) -> (Runtime, GraphRunner<Doc>) {
    let rt = Runtime::new().await.unwrap();
    let runner = rt.load(graph).await.unwrap().with_checkpointer(saver);
    (rt, runner)
}

/// Drops the runtime and runner (and with them every handle on the saver), shuts the runtime
/// down, and checks that the database was really closed: reopening gives a fresh instance.
async fn close(rt: Runtime, runner: GraphRunner<Doc>, saver: Arc<SledSaver>) {
    assert!(rt.shutdown(Duration::from_secs(5)).await);
    drop(runner);
    drop(rt);
    let weak = Arc::downgrade(&saver);
    drop(saver);
    for _ in 0..100 {
        if weak.strong_count() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(weak.strong_count(), 0, "something still holds the saver");
}

fn approval_graph() -> CompiledGraph<Doc> {
    StateGraph::<Doc>::new("approval")
        .add_node("draft", |_s, _c| async { Ok(log("draft")) })
        .add_node("review", |s: Arc<Doc>, ctx: NodeContext| async move {
            let answer: String =
                ctx.interrupt(serde_json::json!({ "question": "ok?", "draft": s.log }))?;
            Ok(DocUpdate::new()
                .answers(vec![answer])
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

#[tokio::test]
async fn opening_a_path_twice_shares_one_instance() {
    let dir = tempfile::tempdir().unwrap();
    let a = SledSaver::open(dir.path()).unwrap();
    let b = SledSaver::open(dir.path().join(".")).unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    let other = tempfile::tempdir().unwrap();
    let c = SledSaver::open(other.path()).unwrap();
    assert!(!Arc::ptr_eq(&a, &c));
    // Closed when the last handle goes; the next open is a new instance on the same data.
    a.put_thread(ThreadInfo::new("kept", "g")).await.unwrap();
    a.flush().await.unwrap();
    let weak = Arc::downgrade(&a);
    drop((a, b));
    assert_eq!(weak.strong_count(), 0);
    let d = SledSaver::open(dir.path()).unwrap();
    assert_eq!(
        d.get_thread("kept").await.unwrap().unwrap().graph,
        "g",
        "data survives a close"
    );
}

#[tokio::test]
async fn interrupt_then_resume_in_a_new_runtime_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let saver = SledSaver::open(dir.path()).unwrap();
    let (rt, runner) = runner_on(approval_graph(), saver.clone()).await;
    let out = runner
        .invoke(input(DocUpdate::new()), RunConfig::thread("h1"))
        .await
        .unwrap();
    assert_eq!(out.status, RunStatus::Interrupted);
    assert_eq!(out.interrupts.len(), 1);
    let interrupt_id = out.interrupts[0].id.clone();
    close(rt, runner, saver).await;

    // A new process, in effect: new saver instance, new runtime.
    let saver = SledSaver::open(dir.path()).unwrap();
    let info = saver.get_thread("h1").await.unwrap().unwrap();
    assert_eq!(info.status, ThreadStatus::Interrupted);
    assert_eq!(info.interrupts.len(), 1);
    assert_eq!(info.interrupts[0].value.0["question"], "ok?");
    let interrupted = saver
        .list_threads(Some(ThreadStatus::Interrupted))
        .await
        .unwrap();
    assert_eq!(interrupted.len(), 1);
    let (rt, runner) = runner_on(approval_graph(), saver.clone()).await;
    let snap = runner.get_state("h1", None).await.unwrap();
    assert_eq!(snap.interrupts.len(), 1);
    assert_eq!(snap.interrupts[0].id, interrupt_id);
    assert_eq!(snap.next, vec!["review"]);
    // A wrongly typed value is a typed error and loses nothing, across the reopen too.
    let bad = runner
        .invoke(
            RunInput::resume(serde_json::json!({"no": 1})),
            RunConfig::thread("h1"),
        )
        .await
        .unwrap_err();
    assert!(matches!(bad, RunError::Node { .. }), "{bad}");
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
    close(rt, runner, saver).await;

    let saver = SledSaver::open(dir.path()).unwrap();
    let (_rt, runner) = runner_on(approval_graph(), saver.clone()).await;
    let history = runner.get_state_history("h1").await.unwrap();
    assert_eq!(history.len(), 4, "input, draft, review, publish");
    assert_eq!(history[0].values.log, vec!["draft", "review", "publish"]);
    let err = runner
        .invoke(
            RunInput::resume(serde_json::json!("again")),
            RunConfig::thread("h1"),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, RunError::NoPendingInterrupt(_)), "{err}");
}

#[tokio::test]
async fn a_failed_step_keeps_finished_siblings_across_reopen() {
    let ok_runs = Arc::new(AtomicU32::new(0));
    let fail = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let graph = {
        let (ok_c, fail_c) = (ok_runs.clone(), fail.clone());
        move || {
            let (ok_c, fail_c) = (ok_c.clone(), fail_c.clone());
            StateGraph::<Doc>::new("fail")
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
                .unwrap()
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let saver = SledSaver::open(dir.path()).unwrap();
    let (rt, runner) = runner_on(graph(), saver.clone()).await;
    let err = runner
        .invoke(input(log("input")), RunConfig::thread("t1"))
        .await
        .unwrap_err();
    assert!(matches!(err, RunError::Node { .. }), "{err}");
    assert_eq!(ok_runs.load(Ordering::SeqCst), 1);
    close(rt, runner, saver).await;

    let saver = SledSaver::open(dir.path()).unwrap();
    let info = saver.get_thread("t1").await.unwrap().unwrap();
    assert_eq!(info.status, ThreadStatus::Failed);
    assert!(info.error.unwrap_or_default().contains("boom"));
    let head = saver.get("t1", None).await.unwrap().unwrap();
    let writes = saver.get_writes("t1", &head.checkpoint_id).await.unwrap();
    assert_eq!(writes.len(), 2, "{writes:?}");
    assert!(matches!(writes[0].kind, PendingKind::Output(_)));
    assert_eq!(writes[0].node, "ok");
    assert!(matches!(writes[1].kind, PendingKind::Error(_)));
    let (_rt, runner) = runner_on(graph(), saver.clone()).await;
    // After the reopen the thread's view shows the finished sibling's pending write applied
    // and only the failed task as next; the checkpoint itself is the bare one.
    let snap = runner.get_state("t1", None).await.unwrap();
    assert_eq!(snap.values.log, vec!["input", "ok"]);
    assert_eq!(snap.next, vec!["flaky"]);
    let bare = runner
        .get_state("t1", Some(&head.checkpoint_id))
        .await
        .unwrap();
    assert_eq!(bare.values.log, vec!["input"]);
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

fn tt_graph() -> CompiledGraph<Doc> {
    StateGraph::<Doc>::new("tt")
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
        .unwrap()
}

#[tokio::test]
async fn history_update_state_replay_fork_and_prune_across_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let saver = SledSaver::open(dir.path()).unwrap();
    let (rt, runner) = runner_on(tt_graph(), saver.clone()).await;
    let out = runner
        .invoke(input(log("in")), RunConfig::thread("tt"))
        .await
        .unwrap();
    assert_eq!(out.state.count, 11);
    close(rt, runner, saver).await;

    let saver = SledSaver::open(dir.path()).unwrap();
    let (rt, runner) = runner_on(tt_graph(), saver.clone()).await;
    let history = runner.get_state_history("tt").await.unwrap();
    assert_eq!(history.len(), 3, "input, a, b");
    assert_eq!(history[0].values.count, 11);
    assert_eq!(history[1].values.count, 1);
    assert_eq!(history[1].next, vec!["b"]);
    assert_eq!(history[1].writers, vec!["a"]);
    assert_eq!(history[2].values.log, vec!["in"]);
    assert_eq!(history[2].source, CheckpointSource::Input);
    assert_eq!(
        history[1].parent_id.as_deref(),
        Some(history[2].checkpoint_id.as_str())
    );
    // Replay from after `a`.
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
    // Edit as if `a` wrote it.
    let cp = runner
        .update_state("tt", DocUpdate::new().count(100), Some("a"))
        .await
        .unwrap();
    close(rt, runner, saver).await;

    let saver = SledSaver::open(dir.path()).unwrap();
    let (rt, runner) = runner_on(tt_graph(), saver.clone()).await;
    let snap = runner.get_state("tt", None).await.unwrap();
    assert_eq!(snap.checkpoint_id, cp);
    assert_eq!(snap.values.count, 111);
    assert_eq!(snap.next, vec!["b"]);
    assert_eq!(snap.source, CheckpointSource::Update);
    let out = runner
        .invoke(RunInput::Continue, RunConfig::thread("tt"))
        .await
        .unwrap();
    assert_eq!(out.state.count, 121);
    // Fork at `after_a`.
    runner.fork("tt", &after_a, "tt-fork").await.unwrap();
    close(rt, runner, saver).await;

    let saver = SledSaver::open(dir.path()).unwrap();
    let (rt, runner) = runner_on(tt_graph(), saver.clone()).await;
    let forked_info = saver.get_thread("tt-fork").await.unwrap().unwrap();
    assert_eq!(
        forked_info.metadata.get("forked_from").map(String::as_str),
        Some(format!("tt@{after_a}").as_str())
    );
    let forked = runner.get_state("tt-fork", None).await.unwrap();
    assert_eq!(forked.values.count, 1);
    assert_eq!(forked.source, CheckpointSource::Fork);
    let out = runner
        .invoke(RunInput::Continue, RunConfig::thread("tt-fork"))
        .await
        .unwrap();
    assert_eq!(out.state.count, 11);
    assert!(matches!(
        runner.get_state("nobody", None).await.unwrap_err(),
        RunError::ThreadNotFound(_)
    ));
    // Prune to the newest two checkpoints.
    let before = runner.get_state("tt", None).await.unwrap();
    let total = saver.list("tt", None, None).await.unwrap().len();
    let removed = runner.prune("tt", 2).await.unwrap();
    assert_eq!(removed, total - 2);
    close(rt, runner, saver).await;

    let saver = SledSaver::open(dir.path()).unwrap();
    let (_rt, runner) = runner_on(tt_graph(), saver.clone()).await;
    let history = runner.get_state_history("tt").await.unwrap();
    assert_eq!(history.len(), 2);
    assert_eq!(history[0].values.count, before.values.count);
    assert_eq!(history[0].values.log, before.values.log);
    assert_eq!(runner.prune("tt", 2).await.unwrap(), 0);
    // The fork is untouched by the prune of its origin.
    assert_eq!(
        runner
            .get_state("tt-fork", None)
            .await
            .unwrap()
            .values
            .count,
        11
    );
}

fn record(thread: &str, id: &str, parent: Option<&str>, step: u64) -> CheckpointRecord {
    CheckpointRecord {
        thread_id: thread.into(),
        checkpoint_id: id.into(),
        parent_id: parent.map(str::to_string),
        step,
        source: CheckpointSource::Loop,
        created_at_ms: 1,
        writers: vec!["w".into()],
        next: vec![],
        full: true,
        payload: vec![step as u8; 10],
    }
}

#[tokio::test]
async fn the_raw_saver_contract_matches_memory_saver() {
    let dir = tempfile::tempdir().unwrap();
    let sled = SledSaver::open(dir.path()).unwrap();
    let mem = MemorySaver::new();
    let savers: [&dyn CheckpointSaver; 2] = [sled.as_ref(), &mem];
    for s in savers {
        // Thread "a" and a thread whose id extends it ("a2"), and "a\x01" sorting right after.
        for t in ["a", "a2", "a\u{1}", "b"] {
            for i in 0..5u64 {
                let id = format!("{:024x}", 100 + i);
                let parent = (i > 0).then(|| format!("{:024x}", 99 + i));
                s.put(record(t, &id, parent.as_deref(), i)).await.unwrap();
                for k in 0..3 {
                    s.put_writes(
                        t,
                        &id,
                        vec![PendingWrite {
                            task_id: format!("task{k}"),
                            node: format!("{t}-{i}-{k}"),
                            kind: PendingKind::Error(format!("e{k}")),
                        }],
                    )
                    .await
                    .unwrap();
                }
            }
            let mut info = ThreadInfo::new(t, "g");
            info.status = if t == "b" {
                ThreadStatus::Done
            } else {
                ThreadStatus::Interrupted
            };
            s.put_thread(info).await.unwrap();
        }
        s.flush().await.unwrap();
        let newest = s.get("a", None).await.unwrap().unwrap();
        assert_eq!(newest.checkpoint_id, format!("{:024x}", 104));
        assert_eq!(newest.payload, vec![4u8; 10]);
        let all = s.list("a", None, None).await.unwrap();
        let ids: Vec<u64> = all.iter().map(|r| r.step).collect();
        assert_eq!(ids, vec![4, 3, 2, 1, 0], "newest first, only thread `a`");
        let before = s
            .list("a", Some(&format!("{:024x}", 103)), Some(2))
            .await
            .unwrap();
        assert_eq!(
            before.iter().map(|r| r.step).collect::<Vec<_>>(),
            vec![2, 1]
        );
        assert!(s.list("a", Some(""), None).await.unwrap().is_empty());
        let writes = s.get_writes("a", &format!("{:024x}", 102)).await.unwrap();
        let nodes: Vec<&str> = writes.iter().map(|w| w.node.as_str()).collect();
        assert_eq!(nodes, vec!["a-2-0", "a-2-1", "a-2-2"], "in write order");
        assert!(s.get("nobody", None).await.unwrap().is_none());
        assert!(s.get("a", Some("nope")).await.unwrap().is_none());
        let done = s.list_threads(Some(ThreadStatus::Done)).await.unwrap();
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].thread_id, "b");
        let names: Vec<String> = s
            .list_threads(None)
            .await
            .unwrap()
            .into_iter()
            .map(|i| i.thread_id)
            .collect();
        assert_eq!(names, vec!["a", "a\u{1}", "a2", "b"]);
        // delete_before: checkpoints and their writes go; the rest of the thread stays.
        let removed = s
            .delete_before("a", &format!("{:024x}", 103))
            .await
            .unwrap();
        assert_eq!(removed, 3);
        assert_eq!(s.list("a", None, None).await.unwrap().len(), 2);
        assert!(s
            .get_writes("a", &format!("{:024x}", 102))
            .await
            .unwrap()
            .is_empty());
        assert_eq!(
            s.get_writes("a", &format!("{:024x}", 103))
                .await
                .unwrap()
                .len(),
            3
        );
        assert_eq!(s.list("a2", None, None).await.unwrap().len(), 5);
        // delete_thread: everything of the thread, nothing of its neighbours.
        assert!(s.delete_thread("a").await.unwrap());
        assert!(!s.delete_thread("a").await.unwrap());
        assert!(s.get("a", None).await.unwrap().is_none());
        assert!(s.get_thread("a").await.unwrap().is_none());
        assert!(s
            .get_writes("a", &format!("{:024x}", 104))
            .await
            .unwrap()
            .is_empty());
        assert_eq!(s.list("a2", None, None).await.unwrap().len(), 5);
        assert_eq!(s.list("a\u{1}", None, None).await.unwrap().len(), 5);
        assert_eq!(s.list_threads(None).await.unwrap().len(), 3);
    }
    // NUL bytes are the key separator: writing one is a typed error, reading finds nothing.
    let err = sled
        .put(record("bad\0thread", "x", None, 0))
        .await
        .unwrap_err();
    assert!(matches!(err, CheckpointError::Backend { .. }), "{err}");
    assert!(sled.get("a2\0", None).await.unwrap().is_none());
    // Raw delete leaves no trace in any tree.
    sled.delete_thread("a2").await.unwrap();
    let raw = sled.db().open_tree(CHECKPOINTS_TREE).unwrap();
    assert!(raw.scan_prefix(b"a2\0").next().is_none());
}

/// Replaces the raw sled value under `key` in `tree` by `f(value)`.
fn damage(saver: &SledSaver, tree: &str, key: &[u8], f: impl Fn(&mut Vec<u8>)) {
    let tree = saver.db().open_tree(tree).unwrap();
    let mut value = tree.get(key).unwrap().expect("value to damage").to_vec();
    f(&mut value);
    tree.insert(key, value).unwrap();
    tree.flush().unwrap();
}

#[tokio::test]
async fn corruption_is_a_typed_error_naming_thread_and_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let saver = SledSaver::open(dir.path()).unwrap();
    let (rt, runner) = runner_on(tt_graph(), saver.clone()).await;
    runner
        .invoke(input(log("in")), RunConfig::thread("c"))
        .await
        .unwrap();
    runner
        .invoke(input(log("ok")), RunConfig::thread("healthy"))
        .await
        .unwrap();
    let history = saver.list("c", None, None).await.unwrap();
    assert_eq!(history.len(), 3);
    let middle = history[1].checkpoint_id.clone();
    close(rt, runner, saver).await;

    // Flip one byte in the middle of the stored value of the middle checkpoint.
    let saver = SledSaver::open(dir.path()).unwrap();
    let key = ferrograph::checkpoint_savers::checkpoint_key("c", &middle);
    damage(&saver, CHECKPOINTS_TREE, &key, |v| {
        let i = v.len() / 2;
        v[i] ^= 0x40;
    });
    close_saver(saver).await;

    let saver = SledSaver::open(dir.path()).unwrap();
    let (_rt, runner) = runner_on(tt_graph(), saver.clone()).await;
    let expect_corrupt = |err: RunError| match err {
        RunError::Checkpoint(CheckpointError::Corrupt {
            thread,
            checkpoint,
            source,
        }) => {
            assert_eq!(thread, "c");
            assert_eq!(checkpoint, middle);
            assert!(matches!(source, CodecError::Checksum { .. }), "{source}");
        }
        other => panic!("expected a corrupt-checkpoint error, got {other:?}"),
    };
    expect_corrupt(runner.get_state_history("c").await.unwrap_err());
    expect_corrupt(runner.get_state("c", Some(&middle)).await.unwrap_err());
    let text = saver.list("c", None, None).await.unwrap_err().to_string();
    assert!(text.contains(&middle) && text.contains("`c`"), "{text}");
    // The thread is not reset: a new run on it fails rather than starting from nothing, and
    // its record and its other checkpoints are still there.
    let err = runner
        .invoke(input(log("again")), RunConfig::thread("c"))
        .await
        .unwrap_err();
    expect_corrupt(err);
    let info = saver.get_thread("c").await.unwrap().unwrap();
    assert_eq!(info.thread_id, "c");
    assert!(saver
        .get("c", Some(&history[2].checkpoint_id))
        .await
        .unwrap()
        .is_some());
    // Other threads are unaffected.
    assert_eq!(
        runner
            .get_state("healthy", None)
            .await
            .unwrap()
            .values
            .count,
        11
    );

    // A truncated value, a damaged pending write and a damaged thread record are typed too.
    let newest = saver.get("healthy", None).await.unwrap().unwrap();
    let hkey = ferrograph::checkpoint_savers::checkpoint_key("healthy", &newest.checkpoint_id);
    damage(&saver, CHECKPOINTS_TREE, &hkey, |v| v.truncate(v.len() - 3));
    match saver.get("healthy", None).await.unwrap_err() {
        CheckpointError::Corrupt {
            thread,
            checkpoint,
            source,
        } => {
            assert_eq!(thread, "healthy");
            assert_eq!(checkpoint, newest.checkpoint_id);
            assert!(matches!(source, CodecError::Truncated { .. }), "{source}");
        }
        other => panic!("{other}"),
    }
    damage(&saver, THREADS_TREE, b"healthy", |v| v[0] = b'X');
    match saver.get_thread("healthy").await.unwrap_err() {
        CheckpointError::Corrupt {
            thread,
            checkpoint,
            source,
        } => {
            assert_eq!(thread, "healthy");
            assert_eq!(checkpoint, THREAD_RECORD);
            assert_eq!(source, CodecError::BadMagic);
        }
        other => panic!("{other}"),
    }
    assert!(saver.list_threads(None).await.is_err());
    saver
        .put_writes(
            "w",
            "cp1",
            vec![PendingWrite {
                task_id: "t".into(),
                node: "n".into(),
                kind: PendingKind::StaticInterrupt,
            }],
        )
        .await
        .unwrap();
    let wtree = saver
        .db()
        .open_tree(ferrograph::checkpoint_savers::WRITES_TREE)
        .unwrap();
    let (wkey, _) = wtree.scan_prefix(b"w\0cp1\0").next().unwrap().unwrap();
    damage(
        &saver,
        ferrograph::checkpoint_savers::WRITES_TREE,
        &wkey,
        |v| {
            let last = v.len() - 1;
            v[last] ^= 1;
        },
    );
    match saver.get_writes("w", "cp1").await.unwrap_err() {
        CheckpointError::Corrupt {
            thread, checkpoint, ..
        } => assert_eq!((thread.as_str(), checkpoint.as_str()), ("w", "cp1")),
        other => panic!("{other}"),
    }
}

async fn close_saver(saver: Arc<SledSaver>) {
    let weak = Arc::downgrade(&saver);
    drop(saver);
    assert_eq!(weak.strong_count(), 0);
}

fn chain(n: usize) -> CompiledGraph<Doc> {
    let mut g = StateGraph::<Doc>::new("chain");
    for i in 0..n {
        let name = format!("s{i}");
        let entry = name.clone();
        g = g.add_node(name, move |_s: Arc<Doc>, _c: NodeContext| {
            let entry = entry.clone();
            async move {
                tokio::task::yield_now().await;
                Ok::<_, NodeError>(DocUpdate::new().count(1).log(vec![entry]))
            }
        });
    }
    g = g.add_edge(START, "s0");
    for i in 1..n {
        g = g.add_edge(format!("s{}", i - 1), format!("s{i}"));
    }
    g.add_edge(format!("s{}", n - 1), END).compile().unwrap()
}

#[test]
fn hundreds_of_concurrent_runs_write_complete_histories() {
    const THREADS: usize = 300;
    const STEPS: usize = 5;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    rt.block_on(async {
        let saver = SledSaver::open(dir.path()).unwrap();
        let runtime = Runtime::new().await.unwrap();
        let runner = runtime
            .load(chain(STEPS))
            .await
            .unwrap()
            .with_checkpointer(saver.clone());
        let started = Instant::now();
        let mut tasks = Vec::new();
        for t in 0..THREADS {
            let runner = runner.clone();
            tasks.push(tokio::spawn(async move {
                runner
                    .invoke(
                        RunInput::Update(DocUpdate::new().item(t as i64)),
                        RunConfig::thread(format!("conc-{t:03}")),
                    )
                    .await
            }));
        }
        for t in tasks {
            let out = t.await.unwrap().unwrap();
            assert!(out.is_done());
            assert_eq!(out.state.count, STEPS as i64);
        }
        let elapsed = started.elapsed();
        let stats = saver.stats();
        eprintln!(
            "{THREADS} concurrent runs x {STEPS} steps in {elapsed:?}: {} checkpoints, {} disk \
             flushes ({} grouped, {} empty), {:.2} ms per disk flush",
            stats.checkpoints,
            stats.disk_flushes,
            stats.grouped_flushes,
            stats.empty_flushes,
            stats.flush_nanos as f64 / 1e6 / stats.disk_flushes.max(1) as f64
        );
        assert_eq!(stats.checkpoints, (THREADS * (STEPS + 1)) as u64);
        assert!(
            stats.disk_flushes < stats.checkpoints,
            "group commit should share flushes between runs"
        );
        drop(runner);
        assert!(runtime.shutdown(Duration::from_secs(5)).await);
        drop(runtime);
        close_saver(saver).await;

        // Reopen and check every thread's history: complete, linked, decodable.
        let saver = SledSaver::open(dir.path()).unwrap();
        let runtime = Runtime::new().await.unwrap();
        let runner = runtime
            .load(chain(STEPS))
            .await
            .unwrap()
            .with_checkpointer(saver.clone());
        let threads = saver.list_threads(Some(ThreadStatus::Done)).await.unwrap();
        assert_eq!(threads.len(), THREADS);
        for t in 0..THREADS {
            let thread = format!("conc-{t:03}");
            let history = runner.get_state_history(&thread).await.unwrap();
            assert_eq!(history.len(), STEPS + 1, "{thread}");
            for (i, snap) in history.iter().enumerate() {
                assert_eq!(snap.step as usize, STEPS - i);
                assert_eq!(snap.values.count as usize, STEPS - i);
                assert_eq!(snap.values.item, t as i64);
                let parent = history.get(i + 1).map(|p| p.checkpoint_id.as_str());
                assert_eq!(snap.parent_id.as_deref(), parent);
            }
        }
    });
}

/// State of the chat growth test.
#[derive(State, Clone, Debug, Default, Serialize, Deserialize)]
struct Chat {
    #[reducer(messages)]
    messages: Vec<Message>,
    turns: i64,
}

fn chat_graph() -> CompiledGraph<Chat> {
    StateGraph::<Chat>::new("chat")
        .add_node("ai", |s: Arc<Chat>, _c: NodeContext| async move {
            let last = s
                .messages
                .last()
                .map(|m| m.content.clone())
                .unwrap_or_default();
            Ok::<_, NodeError>(
                ChatUpdate::new()
                    .messages(Message::ai(format!("You said: {last}. Here is my answer.")))
                    .turns(s.turns + 1),
            )
        })
        .add_edge(START, "ai")
        .add_edge("ai", END)
        .compile()
        .unwrap()
}

#[tokio::test]
async fn a_500_turn_chat_writes_flat_bytes_per_step() {
    const TURNS: usize = 500;
    let dir = tempfile::tempdir().unwrap();
    let saver = SledSaver::open(dir.path()).unwrap();
    let rt = Runtime::new().await.unwrap();
    let runner = rt
        .load(chat_graph())
        .await
        .unwrap()
        .with_checkpointer(saver.clone());
    let mut per_turn: Vec<(u64, u64, u64)> = Vec::with_capacity(TURNS); // (all bytes, payload, checkpoints)
    for turn in 0..TURNS {
        let before = saver.stats();
        let out = runner
            .invoke(
                RunInput::Update(
                    ChatUpdate::new().messages(Message::human(format!("question number {turn}"))),
                ),
                RunConfig::thread("chat"),
            )
            .await
            .unwrap();
        assert_eq!(out.state.messages.len(), 2 * (turn + 1));
        let after = saver.stats();
        per_turn.push((
            after.bytes_written - before.bytes_written,
            after.payload_bytes - before.payload_bytes,
            after.checkpoints - before.checkpoints,
        ));
    }
    let state = runner.get_state("chat", None).await.unwrap();
    assert_eq!(state.values.messages.len(), 2 * TURNS);
    let full_state = ferrograph::core::checkpoint::encode(1, &*state.values)
        .unwrap()
        .len() as f64;
    let mean = |range: std::ops::Range<usize>| {
        let rows = &per_turn[range];
        let steps: u64 = rows.iter().map(|r| r.2).sum();
        let all: u64 = rows.iter().map(|r| r.0).sum();
        let payload: u64 = rows.iter().map(|r| r.1).sum();
        (all as f64 / steps as f64, payload as f64 / steps as f64)
    };
    let (early, early_payload) = mean(0..100);
    let (late, late_payload) = mean(400..500);
    let fulls = saver
        .list("chat", None, None)
        .await
        .unwrap()
        .iter()
        .filter(|r| r.full)
        .count();
    eprintln!(
        "chat growth: bytes per checkpointed step (records, keys, payloads, thread records) \
         turns 1-100 {early:.0} (payload {early_payload:.0}), turns 401-500 {late:.0} \
         (payload {late_payload:.0}); full state at turn 500 {full_state:.0} bytes; \
         {fulls} full snapshots in {} checkpoints; {} bytes on disk",
        TURNS * 2,
        saver.size_on_disk().unwrap()
    );
    assert!(
        late <= 3.0 * early,
        "bytes per step grew: {early:.0} -> {late:.0}"
    );
    assert!(
        late < full_state / 20.0,
        "bytes per step {late:.0} not far below the full state {full_state:.0}"
    );
    // The whole history still loads after a reopen.
    drop(runner);
    assert!(rt.shutdown(Duration::from_secs(5)).await);
    drop(rt);
    close_saver(saver).await;
    let saver = SledSaver::open(dir.path()).unwrap();
    let rt = Runtime::new().await.unwrap();
    let runner = rt
        .load(chat_graph())
        .await
        .unwrap()
        .with_checkpointer(saver.clone());
    let history = runner.get_state_history("chat").await.unwrap();
    assert_eq!(history.len(), 2 * TURNS);
    assert_eq!(history[0].values.turns, TURNS as i64);
    assert_eq!(history[0].values.messages.len(), 2 * TURNS);
}
