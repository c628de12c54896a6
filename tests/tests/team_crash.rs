//! Exactly-once event delivery across SIGKILL: the team run is killed at points around the
//! outbox dispatch (before it, between two events, after it but before the step's
//! checkpoint), after the engineer's commit and after the release tag, then continued in a
//! new process, to the end. Every time: each event of the run is in the log once, with the
//! same id the state recorded; each subscriber's inbox holds it once; the workspace has one
//! commit per step (code, then CI) and one tag; and where the kill came after a dispatch,
//! the log shows the second delivery attempt that deduplication absorbed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

/// (point, the gate the run is at when the kill happens: 0 before stories, 1 before deploy,
/// 2 after deploy approval)
const POINTS: [(&str, u8); 7] = [
    ("after_dispatch:ba_agent", 0),
    ("mid_dispatch:ta_agent", 1),
    ("after_dispatch:qc_agent", 1),
    ("before_dispatch:devops_agent", 1),
    ("after_commit:sse_agent", 1),
    ("after_dispatch:deploy", 2),
    ("after_tag:deploy", 2),
];

fn worker(dir: &Path, cmd: &str, crash_at: Option<&str>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_team_worker"));
    c.args([cmd, &dir.display().to_string()]);
    match crash_at {
        Some(p) => c.env("FERROGRAPH_TEAM_CRASH_AT", p),
        None => c.env_remove("FERROGRAPH_TEAM_CRASH_AT"),
    };
    c.output().expect("run team_worker")
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

fn killed(o: &Output, point: &str) {
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&o.status),
        Some(9),
        "{point}: the worker was not killed: {:?}\n{}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn sigkill_around_dispatch_commit_and_tag_then_continue_delivers_each_event_once() {
    for (point, stage) in POINTS {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        assert!(worker(dir, "setup", None).status.success());
        // Run to the gate before the kill point, kill there, continue.
        let mut last = match stage {
            0 => {
                killed(&worker(dir, "start", Some(point)), point);
                json_of(&worker(dir, "continue", None))
            }
            _ => json_of(&worker(dir, "start", None)),
        };
        assert_eq!(last["gate"], "stories_approval", "{point}: {last}");
        if stage == 1 {
            killed(&worker(dir, "approve", Some(point)), point);
            last = json_of(&worker(dir, "continue", None));
        } else {
            last = json_of(&worker(dir, "approve", None));
        }
        assert_eq!(last["gate"], "deployment_approval", "{point}: {last}");
        if stage == 2 {
            killed(&worker(dir, "approve", Some(point)), point);
            last = json_of(&worker(dir, "continue", None));
        } else {
            last = json_of(&worker(dir, "approve", None));
        }
        assert_eq!(last["run_status"], "deployed", "{point}: {last}");

        let seen = json_of(&worker(dir, "inspect", None));
        let events = seen["events"].as_array().unwrap();
        let ids: Vec<&str> = events.iter().map(|e| e["id"].as_str().unwrap()).collect();
        let delivered: Vec<&str> = last["delivered"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let mut sorted_ids = ids.clone();
        sorted_ids.sort();
        let mut sorted_delivered = delivered.clone();
        sorted_delivered.sort();
        assert_eq!(sorted_ids, sorted_delivered, "{point}: the log holds exactly the events the state dispatched (a replayed step made no new ids)");
        let mut dedup = sorted_ids.clone();
        dedup.dedup();
        assert_eq!(dedup.len(), ids.len(), "{point}: an id twice in the log");
        for name in [
            "RequirementsClarified",
            "UserStoriesCreated",
            "StoriesApproved",
            "DesignApproved",
            "CodeArtifactReady",
            "QualityGatePassed",
            "DeploymentPrepared",
        ] {
            assert_eq!(
                events.iter().filter(|e| e["name"] == name).count(),
                1,
                "{point}: {name} in {events:?}"
            );
        }
        for e in events {
            for r in e["recipients"].as_array().unwrap() {
                let inbox = seen["inboxes"][r.as_str().unwrap()].as_array().unwrap();
                assert_eq!(
                    inbox.iter().filter(|i| *i == &e["id"]).count(),
                    1,
                    "{point}: {} to {r}",
                    e["name"]
                );
            }
        }
        assert!(seen["inboxes"]["po_agent"].as_array().unwrap().is_empty());
        if point.starts_with("after_dispatch") || point.starts_with("mid_dispatch") {
            assert!(
                events.iter().any(|e| e["attempts"].as_u64().unwrap() >= 2),
                "{point}: no redelivery was needed? {events:?}"
            );
        }
        assert_eq!(
            seen["commits"].as_array().unwrap().len(),
            3,
            "{point}: start, code, CI: {seen}"
        );
        assert_eq!(seen["tags"], serde_json::json!(["release-1"]), "{point}");
    }
}
