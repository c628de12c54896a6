//! Exactly once across SIGKILL: the ticket-to-pr run is approved and killed at each point
//! inside apply / pull request / comment (after the first commit, after the second, after
//! the branch is complete, after the patch is written, after the pull request is recorded,
//! after the comment is added), then continued in a new process. Every time the end state is
//! one branch with one commit per file (the commits made before the kill kept, not made
//! again), one pull request, one comment, and the user's checkout untouched.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

const POINTS: [&str; 6] = [
    "commit-1",
    "commit-2",
    "applied",
    "patch-written",
    "pr-recorded",
    "commented",
];

fn worker(dir: &Path, cmd: &str, crash_at: Option<&str>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ticket_worker"));
    c.args([cmd, &dir.display().to_string()]);
    match crash_at {
        Some(p) => c.env("FERROGRAPH_TICKET_PR_CRASH_AT", p),
        None => c.env_remove("FERROGRAPH_TICKET_PR_CRASH_AT"),
    };
    c.output().expect("run ticket_worker")
}

fn json_of(o: &Output) -> Value {
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn sigkill_at_every_point_of_apply_pr_and_comment_then_continue_does_each_once() {
    for point in POINTS {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        assert!(worker(dir, "setup", None).status.success());
        let gate = json_of(&worker(dir, "start", None));
        assert_eq!(gate["status"], "interrupted", "{gate}");

        let killed = worker(dir, "approve", Some(point));
        assert!(
            std::os::unix::process::ExitStatusExt::signal(&killed.status) == Some(9),
            "{point}: the worker was not killed: {:?}\n{}",
            killed.status,
            String::from_utf8_lossy(&killed.stderr)
        );
        let before = json_of(&worker(dir, "inspect", None));

        let done = json_of(&worker(dir, "continue", None));
        assert_eq!(done["run_status"], "pr opened", "{point}: {done}");
        let after = json_of(&worker(dir, "inspect", None));
        let branches = after["branches"].as_object().unwrap();
        assert_eq!(branches.len(), 1, "{point}: {after}");
        let commits = branches.values().next().unwrap().as_array().unwrap();
        assert_eq!(commits.len(), 2, "{point}: one commit per file: {after}");
        // Commits made before the kill are kept, not made again.
        if let Some(old) = before["branches"].as_object().unwrap().values().next() {
            for (i, c) in old.as_array().unwrap().iter().enumerate() {
                assert_eq!(&commits[i], c, "{point}: commit {} was remade", i + 1);
            }
        }
        assert_eq!(
            after["prs"].as_array().unwrap().len(),
            1,
            "{point}: {after}"
        );
        assert_eq!(after["prs"][0]["commits"], Value::Array(commits.clone()));
        assert_eq!(
            after["comments"],
            serde_json::json!(["pr-1"]),
            "{point}: {after}"
        );
        assert_eq!(after["head"], "main");
        assert_eq!(after["clean"], true);

        // Continuing a finished run changes nothing.
        let _ = worker(dir, "continue", None);
        assert_eq!(json_of(&worker(dir, "inspect", None)), after, "{point}");
    }
}
