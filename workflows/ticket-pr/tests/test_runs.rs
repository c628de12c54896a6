//! The proposed tests run in the sandbox before the gate, on a real Python package in a real
//! git repository: a wrong first fix fails its test, the output goes back to the (scripted)
//! model, its correction passes, and the gate shows the run. A test that passes without the
//! change is sent back too; the corrections stop at two.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ferrograph::core::message::Message;
use ferrograph::prelude::*;
use ferrograph::runtime::JsonInput;
use ferrograph::Registry;
use ferrograph_chat::testing::ScriptedModel;
use ferrograph_chat::ChatModel;
use ferrograph_ticket_pr::testing::{hash_embedder, settings};
use ferrograph_ticket_pr::{register_with, NAME};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;

const LATE: &str = "\"\"\"Which tasks are late.\"\"\"\n\n\ndef is_late(due, today):\n    \"\"\"Whether a task due on `due` is late on `today`.\"\"\"\n    return due < today\n\n\ndef late_tasks(tasks, today):\n    return [t for t in tasks if is_late(t.get(\"due\"), today)]\n";

const WRONG_FIX: &str = "    return due <= today";
const RIGHT_FIX: &str = "    return due is not None and due < today";

const TEST: &str = "from tasks.late import late_tasks\n\n\ndef test_a_task_without_a_due_date_is_not_late():\n    assert late_tasks([{\"due\": None}, {\"due\": 1}], 3) == [{\"due\": 1}]\n\n\ndef test_a_task_due_today_is_not_late():\n    assert late_tasks([{\"due\": 3}], 3) == []\n";

const WEAK_TEST: &str = "from tasks.late import late_tasks\n\n\ndef test_past_is_late():\n    assert late_tasks([{\"due\": 1}], 3) == [{\"due\": 1}]\n";

/// How the scripted engineer answers the test runs.
#[derive(Clone, Copy, PartialEq)]
enum Script {
    /// A wrong fix first (`<=`, and None still crashes); corrected from the test output.
    CorrectsItsFix,
    /// A right fix with a test that passes without it; corrected to a real test.
    CorrectsItsTest,
    /// Always the wrong fix: two corrections, then the gate.
    NeverLearns,
}

fn repo(dir: &Path) -> std::path::PathBuf {
    let root = dir.join("late-tasks");
    for (p, t) in [
        ("pyproject.toml", "[project]\nname = \"tasks\"\n"),
        ("src/tasks/__init__.py", ""),
        ("src/tasks/late.py", LATE),
        ("tests/__init__.py", ""),
        (
            "tests/test_basics.py",
            "import unittest\n\nfrom tasks.late import is_late\n\n\nclass T(unittest.TestCase):\n    def test_past(self):\n        self.assertTrue(is_late(1, 2))\n",
        ),
    ] {
        let f = root.join(p);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, t).unwrap();
    }
    let mut opts = git2::RepositoryInitOptions::new();
    opts.initial_head("main");
    let repo = git2::Repository::init_opts(&root, &opts).unwrap();
    let mut index = repo.index().unwrap();
    index
        .add_all(["*"], git2::IndexAddOption::DEFAULT, None)
        .unwrap();
    index.write().unwrap();
    let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
    let sig = git2::Signature::now("dev", "dev@example.invalid").unwrap();
    repo.commit(Some("HEAD"), &sig, &sig, "1.0", &tree, &[])
        .unwrap();
    root
}

fn tickets(dir: &Path) -> std::path::PathBuf {
    let t = dir.join("tickets");
    std::fs::create_dir_all(&t).unwrap();
    std::fs::write(
        t.join("LATE-7.json"),
        json!({
            "key": "LATE-7",
            "summary": "late_tasks crashes on a task without a due date",
            "description": "`late_tasks(tasks, today)` raises TypeError: '<' not supported between instances of 'NoneType' and 'int' when a task has no due date. A task without a due date is never late.",
            "type": "Bug",
        })
        .to_string(),
    )
    .unwrap();
    t
}

fn block(path: &str, search: &str, replace: &str) -> String {
    format!("{path}\n<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n")
}

fn model(script: Script) -> ScriptedModel {
    ScriptedModel::new("scripted-engineer", move |call| {
        let (title, schema) = call.json_schema();
        let prompt = call.last_prompt();
        let v = match title {
            "Classification" => json!({
                "confirmed_type": "Bug",
                "technical_summary": "is_late compares None with an int",
                "affected_components": ["late_tasks"],
                "complexity": "low",
            }),
            "ModuleChoice" => {
                let names = schema
                    .pointer("/properties/affected_modules/items/enum")
                    .cloned()
                    .unwrap_or(json!([]));
                assert!(names.as_array().unwrap().contains(&json!("src")), "{names}");
                json!({"affected_modules": ["src"], "reasoning": "the code", "files_likely_to_change": []})
            }
            "" if prompt.starts_with("Your change and its tests were run") => {
                let text =
                    match script {
                        Script::CorrectsItsFix => format!(
                            "The change is wrong: None still reaches the comparison.\n\n{}",
                            block("src/tasks/late.py", WRONG_FIX, RIGHT_FIX)
                        ),
                        Script::CorrectsItsTest => {
                            format!(
                        "The test is wrong: it does not use a task without a due date.\n\n{}",
                        block("tests/test_basics.py", WEAK_TEST.trim_end(), TEST.trim_end())
                    )
                        }
                        Script::NeverLearns => {
                            let (from, to) = if prompt.contains("# still") {
                                (
                                    "    return due <= today  # still",
                                    "    return due <= today  # again",
                                )
                            } else {
                                (WRONG_FIX, "    return due <= today  # still")
                            };
                            format!(
                                "The change is right.\n\n{}",
                                block("src/tasks/late.py", from, to)
                            )
                        }
                    };
                return Ok(Message::ai(text));
            }
            "" if prompt.starts_with("Write a test") => {
                // The existing test file is runnable (unittest): the test is added there,
                // or, as here, written to the new path the prompt names.
                let test = if script == Script::CorrectsItsTest {
                    WEAK_TEST
                } else {
                    TEST
                };
                // The test file the prompt names: the existing one (appended at its end)
                // or a new one.
                let path = ["existing test file ", "new test file "]
                    .iter()
                    .find_map(|m| prompt.split(m).nth(1))
                    .and_then(|r| r.split([',', ' ', '\n', ':']).next())
                    .unwrap()
                    .to_string();
                let text = format!("{path}\n<<<<<<< SEARCH\n=======\n{test}>>>>>>> REPLACE\n");
                return Ok(Message::ai(text));
            }
            "" => {
                let fix = if script == Script::CorrectsItsTest {
                    RIGHT_FIX
                } else {
                    WRONG_FIX
                };
                return Ok(Message::ai(format!(
                    "The root cause: `is_late` compares a missing due date.\n\n{}",
                    block("src/tasks/late.py", "    return due < today", fix)
                )));
            }
            other => panic!("no answer for {other}"),
        };
        Ok(Message::ai(v.to_string()))
    })
}

async fn to_gate(script: Script) -> (tempfile::TempDir, Value, Value) {
    let dir = tempfile::tempdir().unwrap();
    let repo = repo(dir.path());
    let tickets = tickets(dir.path());
    let data = dir.path().join("data");
    let rt = Runtime::new().await.unwrap();
    let mut registry = Registry::new();
    let m: Arc<dyn ChatModel> = Arc::new(model(script));
    let mut s = settings(&data, m);
    s.make_embedder = hash_embedder();
    register_with(&mut registry, &rt, Arc::new(MemorySaver::new()), s)
        .await
        .unwrap();
    let out = registry
        .get(NAME)
        .unwrap()
        .workflow
        .invoke(
            JsonInput::Update(json!({
                "ticket_key": "LATE-7",
                "tickets": tickets.display().to_string(),
                "repo": repo.display().to_string(),
            })),
            RunConfig::thread("t"),
        )
        .await
        .unwrap();
    assert_eq!(out.status, "interrupted", "{:#}", out.state);
    let gate = out.interrupts[0].value.0.clone();
    // Nothing of the sandbox's staged trees is left in the data folder.
    let sandbox = data.join(NAME).join("sandbox");
    assert!(
        !sandbox.exists() || std::fs::read_dir(&sandbox).unwrap().next().is_none(),
        "staged trees left behind"
    );
    (dir, out.state, gate)
}

fn runs(state: &Value) -> &Vec<Value> {
    state["test_runs"].as_array().unwrap()
}

fn failing(run: &Value, side: &str) -> usize {
    run[side]["tests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["outcome"] != "passed")
        .count()
}

#[tokio::test]
async fn a_failing_test_run_goes_back_to_the_model_and_its_correction_passes() {
    if ferrograph_sandbox::python().is_err() {
        eprintln!("skipped: no python3");
        return;
    }
    let (_dir, state, gate) = to_gate(Script::CorrectsItsFix).await;
    let runs = runs(&state);
    assert_eq!(runs.len(), 2, "{:#}", state["messages"]);
    // The wrong fix: both tests fail with it (None still crashes, `<=` marks today late).
    assert_eq!(failing(&runs[0], "after"), 2, "{:#}", runs[0]);
    assert_eq!(runs[1]["correction"], 1);
    assert_eq!(failing(&runs[1], "after"), 0, "{:#}", runs[1]);
    assert!(failing(&runs[1], "before") > 0, "{:#}", runs[1]);
    let summary = gate["summary"].as_str().unwrap();
    assert!(summary.contains("### Tests run"), "{summary}");
    assert!(
        summary.contains("the tests fail without the change and pass with it"),
        "{summary}"
    );
    assert!(summary.contains("after 1 correction(s)"), "{summary}");
    let diff = gate["diff"].as_str().unwrap();
    assert!(diff.contains(&format!("+{RIGHT_FIX}")), "{diff}");
    assert!(!diff.contains("due <= today"), "{diff}");
    let messages = state["messages"].to_string();
    assert!(
        messages.contains("Correction 1 from the tests"),
        "{messages}"
    );
}

#[tokio::test]
async fn a_test_that_passes_without_the_change_is_sent_back() {
    if ferrograph_sandbox::python().is_err() {
        return;
    }
    let (_dir, state, gate) = to_gate(Script::CorrectsItsTest).await;
    let runs = runs(&state);
    assert_eq!(runs.len(), 2, "{:#}", state["messages"]);
    assert_eq!(
        failing(&runs[0], "before"),
        0,
        "the weak test passes before"
    );
    assert!(failing(&runs[1], "before") > 0, "{:#}", runs[1]);
    assert_eq!(failing(&runs[1], "after"), 0, "{:#}", runs[1]);
    assert!(gate["warnings"].as_array().unwrap().is_empty(), "{gate:#}");
}

#[tokio::test]
async fn corrections_stop_at_two_and_the_gate_warns() {
    if ferrograph_sandbox::python().is_err() {
        return;
    }
    let (_dir, state, gate) = to_gate(Script::NeverLearns).await;
    let runs = runs(&state);
    assert_eq!(runs.len(), 3, "{:#}", state["messages"]);
    assert_eq!(state["test_corrections"], 2);
    assert!(runs.iter().all(|r| failing(r, "after") > 0));
    let warnings = gate["warnings"].to_string();
    assert!(warnings.contains("do not show the fix"), "{warnings}");
    let summary = gate["summary"].as_str().unwrap();
    assert!(summary.contains("TypeError"), "{summary}");
}
