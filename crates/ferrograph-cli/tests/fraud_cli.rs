//! `ferrograph run fraud` end to end in real processes: an investigation killed with SIGKILL
//! between tools resumes from its checkpoint in a new process and completes without running
//! the finished tools again; the audit trail is queryable.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};

fn cmd(data: &std::path::Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferrograph"));
    c.env("FERROGRAPH_DATA_DIR", data)
        .env_remove("FERROGRAPH_CONFIG")
        .env_remove("FERROGRAPH_MAX_STEPS")
        .env_remove("FERROGRAPH_MAX_RUNTIME_SECONDS")
        // No model: the planner and the reasoning tool take their deterministic paths.
        .env("FERROGRAPH_MODEL", "none");
    c
}

fn run(data: &std::path::Path, args: &[&str]) -> Output {
    cmd(data).args(args).output().expect("run ferrograph")
}

fn text(o: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn sigkill_mid_investigation_then_resume_completes_without_rerunning_tools() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(dir.path(), &["fraud", "gen-data"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = run(dir.path(), &["fraud", "cases"]);
    let cases = text(&out);
    let tx = cases
        .lines()
        .find(|l| l.contains("card_testing"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .to_string();

    // Start, slowed down between tools, and kill it once the step that ran similarity_tool
    // is committed: the next tool step has started (and waits on the delay). A tool whose
    // step was not committed yet is run again on resume, by design.
    let killed = kill_after_tools(dir.path(), "inv-kill", &tx, 3, 700);
    assert!(!killed.status.success(), "the run was killed");
    assert_eq!(
        killed.tool_ends.len(),
        3,
        "context, pattern, similarity finished: {:?}",
        killed.tool_ends
    );

    let out = run(dir.path(), &["threads", "show", "inv-kill"]);
    let v: serde_json::Value = serde_json::from_str(&String::from_utf8_lossy(&out.stdout))
        .unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    let before: Vec<String> =
        serde_json::from_value(v["state"]["values"]["completed_steps"].clone()).unwrap();
    assert!(before.len() >= 3 && before.len() <= 4, "{before:?}");
    let first_exec = v["state"]["values"]["tool_executions"][0].clone();
    // Its process is gone: shown as orphaned, with the command that continues it, not as
    // running forever.
    assert_eq!(v["thread"]["status"], "running");
    assert_eq!(v["orphaned"], true, "{v}");
    assert_eq!(v["owner"]["liveness"], "gone", "{v}");
    assert!(v["hint"]
        .as_str()
        .unwrap()
        .contains("ferrograph resume inv-kill"));
    let out = run(dir.path(), &["threads", "list", "--status", "orphaned"]);
    let listed = text(&out);
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with("inv-kill") && l.contains("orphaned")),
        "{listed}"
    );

    // Resume in a new process: it completes, and the finished tools did not run again.
    let out = run(dir.path(), &["resume", "inv-kill"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = run(dir.path(), &["threads", "show", "inv-kill"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let st = &v["state"]["values"];
    assert_eq!(st["status"], "COMPLETED");
    let ex = st["tool_executions"].as_array().unwrap();
    let names: Vec<&str> = ex
        .iter()
        .map(|e| e["tool_name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "context_tool",
            "pattern_tool",
            "similarity_tool",
            "reasoning_tool",
            "recommendation_tool",
            "rule_draft_tool"
        ]
    );
    assert_eq!(
        ex[0], first_exec,
        "the first tool's record is the one from before the kill"
    );

    // The audit trail and the stored investigation are queryable.
    let out = run(dir.path(), &["fraud", "audit", "inv-kill"]);
    let audit = text(&out);
    assert!(audit.contains("investigation_completed"), "{audit}");
    let out = run(dir.path(), &["fraud", "show", "inv-kill"]);
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["tool_log"].as_array().unwrap().len(), 6);
    let out = run(dir.path(), &["fraud", "list"]);
    assert!(text(&out).contains("inv-kill"));
    let out = run(dir.path(), &["threads", "list", "--status", "orphaned"]);
    assert!(!text(&out).contains("inv-kill"), "{}", text(&out));
}

#[test]
fn fraud_arguments_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(dir.path(), &["run", "fraud", "--bogus"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains("unknown argument `--bogus`"),
        "{}",
        text(&out)
    );
    let out = run(dir.path(), &["run", "demo", "--transaction", "x"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("takes no arguments"), "{}", text(&out));

    // A transaction the dataset does not hold fails the run, names the id, and leaves no
    // stored investigation or audit entry behind.
    let out = run(
        dir.path(),
        &[
            "run",
            "fraud",
            "--thread",
            "inv-nope",
            "--transaction",
            "TX-NOPE",
        ],
    );
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("unknown transaction `TX-NOPE`"),
        "{}",
        text(&out)
    );
    let out = run(dir.path(), &["fraud", "list"]);
    assert!(!text(&out).contains("inv-nope"), "{}", text(&out));

    // A named data folder that does not exist is an error, and is not created.
    let missing = dir.path().join("no-such-data");
    let out = run(
        dir.path(),
        &[
            "run",
            "fraud",
            "--transaction",
            "TX-000001",
            "--data",
            missing.to_str().unwrap(),
        ],
    );
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("no-such-data"), "{}", text(&out));
    assert!(!missing.exists());
}

#[test]
fn a_configured_model_that_cannot_be_used_fails_the_command_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-model.gguf");
    let not_gguf = dir.path().join("notes.gguf");
    std::fs::write(&not_gguf, "this is not a model").unwrap();
    for (model, says) in [
        (missing.display().to_string(), "no-such-model.gguf"),
        (not_gguf.display().to_string(), "not a GGUF"),
    ] {
        let out = cmd(dir.path())
            .env("FERROGRAPH_MODEL", &model)
            .args(["run", "fraud", "--transaction", "TX-1"])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{model}: {}", text(&out));
        assert!(text(&out).contains(says), "{model}: {}", text(&out));
    }
}

/// What [`kill_after_tools`] saw.
struct Killed {
    /// Whether the kill point was reached (and the process killed there).
    at_point: bool,
    /// The `tool_end` events printed before the kill.
    tool_ends: Vec<String>,
    /// The process's exit status.
    status: std::process::ExitStatus,
}

/// Runs an investigation slowed down by `delay_ms` between tools and kills it with SIGKILL
/// (no chance to clean up) once `after` tools have finished and the next tool step has started:
/// that step's predecessor is committed, and a tool whose step was not committed yet is run
/// again on resume, by design.
fn kill_after_tools(
    dir: &std::path::Path,
    thread: &str,
    tx: &str,
    after: usize,
    delay_ms: u64,
) -> Killed {
    let mut child = cmd(dir)
        .args([
            "run",
            "fraud",
            "--thread",
            thread,
            "--stream",
            "--transaction",
            tx,
        ])
        .env("FERROGRAPH_FRAUD_TOOL_DELAY_MS", delay_ms.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut tool_ends = Vec::new();
    let mut at_point = false;
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        if line.contains("\"tool_end\"") {
            tool_ends.push(line);
        } else if tool_ends.len() == after && line.contains("▶ tool_executor") {
            child.kill().unwrap();
            at_point = true;
            break;
        }
    }
    let status = child.wait().unwrap();
    Killed {
        at_point,
        tool_ends,
        status,
    }
}

#[test]
fn killed_after_each_of_five_tools_every_investigation_resumes_to_the_same_end() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(dir.path(), &["fraud", "gen-data"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = run(dir.path(), &["fraud", "cases"]);
    let tx = text(&out)
        .lines()
        .find(|l| l.contains("card_testing"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .to_string();
    let all = [
        "context_tool",
        "pattern_tool",
        "similarity_tool",
        "reasoning_tool",
        "recommendation_tool",
        "rule_draft_tool",
    ];
    // scripts/crash-long.sh repeats the five kill points (FERROGRAPH_KILL_ROUNDS rounds).
    let rounds = std::env::var("FERROGRAPH_KILL_ROUNDS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(1);
    let mut threads = Vec::new();
    for (round, after) in (0..rounds).flat_map(|r| (1..=5).map(move |a| (r, a))) {
        let thread = format!("inv-r{round}-k{after}");
        threads.push(thread.clone());
        assert!(
            kill_after_tools(dir.path(), &thread, &tx, after, 400).at_point,
            "kill point {after} was never reached"
        );
        let out = run(dir.path(), &["threads", "show", &thread]);
        let v: serde_json::Value =
            serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
        assert_eq!(v["orphaned"], true, "kill point {after}: {v}");
        let before = v["state"]["values"]["tool_executions"].clone();

        let out = run(dir.path(), &["resume", &thread]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "kill point {after}: {}",
            text(&out)
        );
        let out = run(dir.path(), &["threads", "show", &thread]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let st = &v["state"]["values"];
        assert_eq!(st["status"], "COMPLETED", "kill point {after}");
        let ex = st["tool_executions"].as_array().unwrap();
        let names: Vec<&str> = ex
            .iter()
            .map(|e| e["tool_name"].as_str().unwrap())
            .collect();
        assert_eq!(names, all, "kill point {after}: each tool exactly once");
        // The tools committed before the kill are the same records, not re-run.
        for (i, rec) in before.as_array().unwrap().iter().enumerate() {
            assert_eq!(&ex[i], rec, "kill point {after}: record {i} changed");
        }
        assert_eq!(v["orphaned"], false);
    }
    // One audit entry per investigation, however often it was killed.
    let out = run(dir.path(), &["fraud", "audit"]);
    let audit = text(&out);
    for thread in &threads {
        let completed = audit
            .lines()
            .filter(|l| l.contains(thread.as_str()) && l.contains("investigation_completed"))
            .count();
        assert_eq!(completed, 1, "{thread}: {audit}");
    }
}
