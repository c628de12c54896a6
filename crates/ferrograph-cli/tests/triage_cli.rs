//! `ferrograph run triage` in real processes on the real local models: killed with SIGKILL
//! after the investigator's step is committed, resumed in a new process, it completes
//! without running the investigator again and writes its report and trace.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn fixture(rel: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/triage")
        .join(rel)
        .display()
        .to_string()
}

fn cmd(data: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferrograph"));
    c.env("FERROGRAPH_DATA_DIR", data)
        .env_remove("FERROGRAPH_CONFIG")
        .env_remove("FERROGRAPH_MAX_STEPS")
        .env_remove("FERROGRAPH_REMOTE_BASE_URL")
        .env_remove("FERROGRAPH_DEFAULT_MODEL");
    c
}

/// [`cmd`] on the fast tier: the model the triage's evaluation chose is for users, not CI.
fn cmd_smollm2(data: &Path) -> Command {
    let mut c = cmd(data);
    c.env("FERROGRAPH_TRIAGE_MODEL", "smollm2-135m-instruct-q4_1");
    c
}

fn text(o: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn sigkill_after_the_investigator_then_resume_completes_the_triage() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir: PathBuf = dir.path().join("report");
    let out_arg = out_dir.display().to_string();
    let mut child = cmd_smollm2(dir.path())
        .args(["run", "triage", "--thread", "tri-kill", "--stream"])
        .args(["--issue", &fixture("issue.md"), "--repo", &fixture("repo")])
        .args(["--docs", &fixture("docs"), "--out", &out_arg])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut killed = false;
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        // The web search has started: the investigator's step is committed.
        if line.contains("▶ web_search") {
            child.kill().unwrap();
            killed = true;
            break;
        }
    }
    let status = child.wait().unwrap();
    assert!(killed && !status.success(), "the run was killed mid-way");

    let out = cmd_smollm2(dir.path())
        .args(["resume", "tri-kill"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let printed = text(&out);
    assert!(printed.contains("report (Markdown):"), "{printed}");

    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("triage-report.json")).unwrap())
            .unwrap();
    assert_eq!(report["status"], "COMPLETED");
    let runs = report["agent_runs"].as_array().unwrap();
    let investigator_round_1 = runs
        .iter()
        .filter(|r| r["agent"] == "investigator" && r["round"] == 1)
        .count();
    assert_eq!(
        investigator_round_1, 1,
        "the committed step did not run again"
    );
    assert!(runs
        .iter()
        .any(|r| r["agent"] == "writer" && r["ok"] == true));
    // The trace holds both processes' events (appended on resume).
    let trace = std::fs::read_to_string(out_dir.join("events.jsonl")).unwrap();
    let starts = trace
        .lines()
        .filter(|l| l.contains("task_start") && l.contains("\"web_search\""))
        .count();
    assert_eq!(
        starts, 2,
        "web_search started before the kill and again after"
    );
    assert!(out_dir.join("triage-report.md").exists());
}

/// The fields of a report that must not depend on where a run was killed.
fn outcome(out_dir: &Path) -> serde_json::Value {
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("triage-report.json")).unwrap())
            .unwrap();
    let runs: Vec<(String, u64)> = r["agent_runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["agent"].as_str().unwrap().to_string(),
                a["round"].as_u64().unwrap(),
            )
        })
        .collect();
    serde_json::json!({
        "status": r["status"],
        "report": r["writer"]["report"],
        "files": r["codebase_search"]["relevant_files"],
        "location": r["codebase_search"]["root_cause_location"],
        "agent_runs": runs,
    })
}

#[test]
fn killed_at_five_points_without_a_model_every_triage_resumes_to_the_uninterrupted_report() {
    let dir = tempfile::tempdir().unwrap();
    let triage = |thread: &str, out: &Path| {
        let mut c = cmd(dir.path());
        c.env("FERROGRAPH_MODEL", "none")
            .args(["run", "triage", "--thread", thread, "--stream"])
            .args(["--issue", &fixture("issue.md"), "--repo", &fixture("repo")])
            .args([
                "--docs",
                &fixture("docs"),
                "--out",
                &out.display().to_string(),
            ]);
        c
    };
    let base_dir = dir.path().join("base");
    let out = triage("tri-base", &base_dir).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let expected = outcome(&base_dir);
    assert_eq!(expected["status"], "COMPLETED");

    // (node, occurrence): the run is killed as that task starts, with every earlier step
    // committed; the last one kills it while the report is being published.
    let points = [
        ("web_search", 1),
        ("critic", 1),
        ("codebase_search", 2),
        ("writer", 1),
        ("publish", 1),
    ];
    // scripts/crash-long.sh repeats them (FERROGRAPH_KILL_ROUNDS rounds).
    let rounds = std::env::var("FERROGRAPH_KILL_ROUNDS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(1);
    for (round, (node, nth)) in (0..rounds).flat_map(|r| points.iter().map(move |p| (r, *p))) {
        let thread = format!("tri-r{round}-{node}-{nth}");
        let out_dir = dir.path().join(&thread);
        let mut child = triage(&thread, &out_dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let marker = format!("▶ {node}");
        let mut seen = 0;
        let mut killed = false;
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            if line.contains(&marker) {
                seen += 1;
                if seen == nth {
                    child.kill().unwrap();
                    killed = true;
                    break;
                }
            }
        }
        let _ = child.wait();
        assert!(killed, "kill point {node} #{nth} was never reached");

        let out = cmd(dir.path())
            .env("FERROGRAPH_MODEL", "none")
            .args(["resume", &thread])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{node} #{nth}: {}", text(&out));
        assert_eq!(
            outcome(&out_dir),
            expected,
            "killed at {node} #{nth}, the resumed run differs from the uninterrupted one"
        );
    }
}
