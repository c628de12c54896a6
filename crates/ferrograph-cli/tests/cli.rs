//! The `ferrograph` binary end to end: a run that interrupts, resumes from a new process,
//! thread commands, exit codes and configuration errors.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

fn ferrograph(data: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferrograph"))
        .args(args)
        .env("FERROGRAPH_DATA_DIR", data)
        .env_remove("FERROGRAPH_CONFIG")
        .env_remove("FERROGRAPH_MAX_STEPS")
        .output()
        .expect("run ferrograph")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn review_interrupts_resumes_in_new_processes_and_lists_threads() {
    let dir = tempfile::tempdir().unwrap();
    let out = ferrograph(dir.path(), &["run", "review", "--thread", "t1", "--stream"]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    let text = stdout(&out);
    assert!(text.contains("ferrograph resume t1 --approve"), "{text}");
    assert!(text.contains("▶ human_review"), "{text}");

    let out = ferrograph(dir.path(), &["threads", "list", "--status", "interrupted"]);
    assert!(stdout(&out).contains("t1"), "{}", stdout(&out));

    let out = ferrograph(dir.path(), &["resume", "t1", "--feedback", "more tests"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stdout(&out).contains("Revision 2"));

    let out = ferrograph(dir.path(), &["resume", "t1", "--approve"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(stdout(&out).contains("\"published\": true"));

    let out = ferrograph(dir.path(), &["threads", "show", "t1"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["thread"]["status"], "done");
    assert_eq!(v["state"]["values"]["decision"], "approved");

    let out = ferrograph(dir.path(), &["threads", "history", "t1"]);
    let history = stdout(&out);
    assert_eq!(history.lines().count(), 1 + 6, "{history}");
    let first = history
        .lines()
        .last()
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();

    let out = ferrograph(
        dir.path(),
        &[
            "threads",
            "fork",
            "t1",
            "--checkpoint",
            &first,
            "--into",
            "t2",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = ferrograph(dir.path(), &["resume", "t2"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "the fork starts before the review"
    );

    let out = ferrograph(dir.path(), &["threads", "rm", "t1"]);
    assert_eq!(out.status.code(), Some(0));
    let out = ferrograph(dir.path(), &["threads", "show", "t1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"));
}

#[test]
fn demo_finishes_and_bad_input_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("commits.txt");
    std::fs::write(&input, "feat: one\nfix: two\n").unwrap();
    let out = ferrograph(
        dir.path(),
        &["run", "demo", "--input", input.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).contains("\"classified\": 2"));

    let out = ferrograph(dir.path(), &["run", "nope"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown workflow"));

    let out = ferrograph(dir.path(), &["resume", "missing", "--approve"]);
    assert_eq!(out.status.code(), Some(1));

    let out = Command::new(env!("CARGO_BIN_EXE_ferrograph"))
        .args(["config"])
        .env("FERROGRAPH_DATA_DIR", dir.path())
        .env("FERROGRAPH_MAX_STEPS", "many")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("FERROGRAPH_MAX_STEPS"));

    let cfg = dir.path().join("ferrograph.toml");
    std::fs::write(&cfg, "max_steps = 7\nmax_runtime_seconds = 12.5\n").unwrap();
    let out = ferrograph(dir.path(), &["config"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["max_steps"], 7);
    assert_eq!(v["max_runtime_seconds"], 12.5);
}
