//! The tutor in real processes on the real local models: a quiz started by `ferrograph run
//! tutor`, its first answer given by `ferrograph resume --value`, the process SIGKILLed while
//! it grades that answer (the answer recorded, the step not committed), and a new process that
//! continues: the same question's feedback, the second question, one quiz record with two
//! answers at the end.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};
use std::time::Duration;

fn cmd(data: &std::path::Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferrograph"));
    c.env("FERROGRAPH_DATA_DIR", data)
        .env_remove("FERROGRAPH_CONFIG")
        .env_remove("FERROGRAPH_MODEL")
        .env_remove("FERROGRAPH_MAX_STEPS")
        .env_remove("FERROGRAPH_MAX_RUNTIME_SECONDS");
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

fn state(dir: &std::path::Path, thread: &str) -> serde_json::Value {
    let out = run(dir, &["threads", "show", thread]);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["state"]["values"].clone()
}

#[test]
fn a_quiz_killed_while_grading_continues_at_the_same_answer_in_a_new_process() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        dir.path(),
        &[
            "run",
            "tutor",
            "--quiet",
            "--thread",
            "quiz",
            "--subject",
            "networks",
            "--message",
            "Quiz me on TCP with 2 questions",
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("\"question_num\": 1"), "{}", text(&out));

    // The first answer, killed while it is graded.
    let mut child = cmd(dir.path())
        .args(["resume", "quiz", "--quiet", "--value", "\"A\""])
        .env("FERROGRAPH_TUTOR_GRADE_DELAY_MS", "6000")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the resume ended before the kill"
    );
    child.kill().unwrap();
    child.wait().unwrap();

    // A new process continues: the recorded answer is graded, the second question asked.
    let out = run(dir.path(), &["resume", "quiz", "--quiet"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let t = text(&out);
    assert!(t.contains("\"question_num\": 2"), "{t}");
    assert!(
        t.contains("Correct: A)") || t.contains("you chose A)"),
        "the first answer's feedback: {t}"
    );

    let out = run(
        dir.path(),
        &["resume", "quiz", "--quiet", "--value", "\"B\""],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let s = state(dir.path(), "quiz");
    let quizzes = s["quizzes"].as_array().unwrap();
    assert_eq!(quizzes.len(), 1, "{s}");
    assert_eq!(quizzes[0]["total"], 2);
    let summary = s["messages"].as_array().unwrap().last().unwrap()["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(summary.starts_with("Quiz on TCP: "), "{summary}");
    assert_eq!(
        summary.matches('✓').count() + summary.matches('✗').count(),
        2,
        "{summary}"
    );
    let first = summary
        .lines()
        .find(|l| l.trim_start().starts_with("Correct") || l.trim_start().starts_with("Not quite"))
        .unwrap();
    assert!(first.contains("A)"), "{first}");
}

#[test]
fn a_workflow_gets_its_own_model_from_the_configuration() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("ferrograph.toml"),
        "[workflows.tutor]\nmodel = \"/nope/tutor.gguf\"\n",
    )
    .unwrap();
    // A model that cannot be used is a clear error naming the workflow, before anything runs.
    let out = run(
        dir.path(),
        &[
            "run",
            "tutor",
            "--subject",
            "networks",
            "--message",
            "What is a subnet?",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains(
            "the model configured for workflow `tutor` (/nope/tutor.gguf) cannot be used"
        ),
        "{}",
        text(&out)
    );
    // The variable overrides the file; `none` takes the tutor's model away, and the tutor
    // says it needs one. The other workflows keep the shared model.
    let out = cmd(dir.path())
        .env("FERROGRAPH_TUTOR_MODEL", "none")
        .args(["config"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("\"tutor\": \"none\""), "{}", text(&out));
    let out = cmd(dir.path())
        .env("FERROGRAPH_TUTOR_MODEL", "none")
        .args([
            "run",
            "tutor",
            "--quiet",
            "--subject",
            "networks",
            "--message",
            "What is a subnet?",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out).contains("the tutor needs a chat model"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_chat_on_a_subject_the_course_does_not_have_exits_non_zero_naming_the_subjects() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = cmd(dir.path())
        .args(["chat", "tutor", "--subject", "chemistry"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"What is TCP?\nWhat is UDP?\n").unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let log = text(&out);
    assert!(!out.status.success(), "{log}");
    assert!(log.contains("unknown subject `chemistry`"), "{log}");
    assert!(log.contains("databases, networks"), "{log}");
}
